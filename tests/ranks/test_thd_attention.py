"""snippets.data.thd_attention computes what a packed (THD) batch asks of core attention. It must
equal Megatron's own local DotProductAttention given the block-diagonal causal mask (one CPU
rank), and torch's attention run on each segment alone."""

from __future__ import annotations

import math

import pytest
import torch

from snippets.data.thd_attention import ThdCoreAttention, varlen_causal_attention
from snippets.ranks.launch import run_ranks, warm_up

CU = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
T, HEADS, DIM = 9, 2, 4


def setup_module():
    warm_up()


def _qkv(kv_heads=HEADS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T, HEADS, DIM, generator=gen),
        torch.randn(T, kv_heads, DIM, generator=gen),
        torch.randn(T, kv_heads, DIM, generator=gen),
    )


@pytest.mark.parametrize("kv_heads", [HEADS, 1])
def test_equals_torch_attention_on_each_segment(kv_heads):
    q, k, v = _qkv(kv_heads)
    out = varlen_causal_attention(q, k, v, CU, 5, 1 / math.sqrt(DIM))
    assert out.shape == (T, HEADS * DIM)
    k, v = k.repeat_interleave(HEADS // kv_heads, 1), v.repeat_interleave(HEADS // kv_heads, 1)
    for start, end in zip(CU[:-1].tolist(), CU[1:].tolist()):
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x[start:end].transpose(0, 1) for x in (q, k, v)), is_causal=True
        )
        assert torch.allclose(out[start:end], ref.transpose(0, 1).reshape(end - start, -1), atol=1e-6)


def test_nothing_crosses_a_segment_boundary():
    q, k, v = _qkv()
    out = varlen_causal_attention(q, k, v, CU, 5, 0.5)
    k2, v2 = k.clone(), v.clone()
    k2[4:], v2[4:] = 0, 0  # change only the last segment
    out2 = varlen_causal_attention(q, k2, v2, CU, 5, 0.5)
    assert torch.equal(out[:4], out2[:4]) and not torch.allclose(out[4:], out2[4:])


def test_a_too_small_max_seqlen_is_refused():
    with pytest.raises(AssertionError, match="max_seqlen"):
        varlen_causal_attention(*_qkv(), CU, 4, 0.5)


def _megatron_block_diagonal(q, k, v, cu):
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)  # attention dropout forks the model-parallel RNG stream
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HEADS * DIM,
        num_attention_heads=HEADS,
        use_cpu_initialization=True,
        attention_dropout=0.0,
    )
    attention = DotProductAttention(
        config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
    )
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        allowed[start:end, start:end] = torch.ones(end - start, end - start).tril().bool()
    out = attention(q[:, None], k[:, None], v[:, None], ~allowed[None, None])  # [s, b=1, h]
    return out[:, 0], attention.softmax_scale, ThdCoreAttention.replacing(attention).softmax_scale


def test_equals_megatrons_dot_product_attention_with_a_block_diagonal_mask():
    q, k, v = _qkv()
    ((real, scale, copied),) = run_ranks(_megatron_block_diagonal, 1, q, k, v, CU)
    assert copied == scale
    assert torch.allclose(varlen_causal_attention(q, k, v, CU, 5, scale), real, atol=1e-6)
