"""What a packed (THD) batch asks of core attention, computed on CPU (note 18).

With ``PackedSeqParams(qkv_format="thd", cu_seqlens_q=..., max_seqlen_q=...)`` Megatron's
``Attention.forward`` squeezes the batch dimension away (query ``[t, heads, head_dim]``, ``t`` =
all tokens of the pack), applies RoPE segment by segment, and hands the packed params to the
core attention. Only Transformer Engine's ``TEDotProductAttention`` accepts them; the local
``DotProductAttention`` asserts ``packed_seq_params is None``. What the TE kernel computes is
causal attention *inside* each segment ``[cu_seqlens[i], cu_seqlens[i+1])`` and nothing across
segments. :func:`varlen_causal_attention` is that, in plain torch, and :class:`ThdCoreAttention`
puts it where the core attention sits, so a real ``GPTModel`` can run a packed batch on CPU.

``tests/ranks/test_thd_attention.py`` checks it against Megatron's own ``DotProductAttention`` given a
block-diagonal causal mask, and against torch's attention on each segment alone.
"""

from __future__ import annotations

import torch


def varlen_causal_attention(query, key, value, cu_seqlens, max_seqlen, softmax_scale):
    """Causal attention within each segment of a packed sequence.

    ``query``/``key``/``value``: ``[t, heads, head_dim]`` (key/value may have fewer heads: GQA);
    ``cu_seqlens``: 1-D, ``[0, ..., t]``; ``max_seqlen``: the longest segment, which the fused
    kernels trust for their tiling -- checked here. Returns ``[t, heads * head_dim]``.
    """
    bounds = cu_seqlens.tolist()
    assert cu_seqlens.dim() == 1 and bounds[0] == 0 and bounds[-1] == query.size(0), bounds
    repeat = query.size(1) // key.size(1)
    key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        n = end - start
        assert n <= max_seqlen, f"segment of {n} tokens > max_seqlen {max_seqlen}"
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # [heads, n, d]
        scores = (q @ k.transpose(1, 2)) * softmax_scale
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = may not attend
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        out.append((probs @ v).transpose(0, 1).reshape(n, -1))
    return torch.cat(out)


class ThdCoreAttention(torch.nn.Module):
    """Takes the place of a layer's ``core_attention`` and runs packed batches on CPU.

    Same call as ``DotProductAttention.forward``; records what it was handed in ``self.seen``.
    """

    def __init__(self, softmax_scale: float):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.seen = []

    @classmethod
    def replacing(cls, core_attention) -> "ThdCoreAttention":
        assert not core_attention.config.apply_query_key_layer_scaling
        return cls(core_attention.softmax_scale)

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        assert packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        self.seen.append(
            dict(
                query=tuple(query.shape),
                attention_mask=attention_mask,
                attn_mask_type=getattr(attn_mask_type, "name", attn_mask_type),
                cu_seqlens_q=packed_seq_params.cu_seqlens_q.tolist(),
                max_seqlen_q=packed_seq_params.max_seqlen_q,
            )
        )
        return varlen_causal_attention(
            query,
            key,
            value,
            packed_seq_params.cu_seqlens_q,
            packed_seq_params.max_seqlen_q,
            self.softmax_scale,
        )
