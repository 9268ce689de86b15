"""snippets.models.presets: the real models' sizes, their parameter counts against real ``GPTModel``s (built
on the meta device, no memory), seed 000's figures, and a Qwen3-8B-sized layer running on 2 CPU
ranks under ``torchrun`` with note 11's weight table as the result."""

import pytest
from run_support import assert_in_note, ok, tables

from snippets.experiments import EXPERIMENTS
from snippets.models import presets
from snippets.ranks.launch import run_ranks, warm_up
from snippets.rl import refit_cost


@pytest.fixture(scope="module")
def server():
    warm_up()


def test_qwen3_8b_is_what_seed_000_walks_through():
    """Seed 000, one layer at TP=2: Q 4096 + K 1024 + V 1024 = 6144 wide, 3072 per GPU (16 Q
    heads, 4 KV heads), SwiGLU fc1 2 x 12288 = 24576 wide, fc2 [6144, 4096] per GPU."""
    q = presets.PRESETS["qwen3-8b"]
    d = q.kv_channels
    assert (q.heads * d, q.query_groups * d, q.query_groups * d) == (4096, 1024, 1024)
    assert (q.heads + 2 * q.query_groups) * d // 2 == 3072
    assert (q.heads // 2, q.query_groups // 2) == (16, 4)
    assert 2 * q.ffn == 24576 and [q.ffn // 2, q.hidden][::-1] == [4096, 6144]
    assert (q.hidden, q.vocab, q.layers, q.swiglu, q.rmsnorm, q.qk_norm, q.bias) == (
        4096,
        151936,
        36,
        True,
        True,
        True,
        False,
    )


def test_seed_000_rl_transfer_figures():
    """ "8B 的 bf16 weight 是 16 GB ... 70B 就是 140 GB": the dense presets in bf16."""
    gb = {
        name: refit_cost.model_bytes(presets.parameter_count(presets.PRESETS[name]), "bf16") / refit_cost.GB
        for name in ("dense-8b", "dense-70b")
    }
    assert round(gb["dense-8b"]) == 16
    assert abs(gb["dense-70b"] / 140 - 1) < 0.01
    assert round(presets.parameter_count(presets.PRESETS["qwen3-8b"]) / 1e9, 2) == 8.19  # note 22


def _meta_gpt_parameters(dims_list):
    """Build each model as a real GPTModel (local spec) on the meta device; count its parameters."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel()
    counts = []
    for dims in dims_list:
        config = TransformerConfig(**dims.transformer_config_kwargs(), use_cpu_initialization=True)
        spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
        with torch.device("meta"):
            model = GPTModel(
                config,
                spec,
                vocab_size=dims.vocab,
                max_sequence_length=dims.seq,
                share_embeddings_and_output_weights=False,
                position_embedding_type="rope" if dims.rope else "learned_absolute",
            )
        counts.append(sum(p.numel() for p in model.parameters()))
    return counts


def test_parameter_count_equals_real_models(server):
    models = [*presets.PRESETS.values()] + [EXPERIMENTS[n].tiny for n in ("pipeline", "refit")]
    real = run_ranks(_meta_gpt_parameters, 1, models, timeout=120)[0]
    assert real == [presets.parameter_count(d) for d in models]


def test_resolve_tiny_is_the_experiments_own_and_overrides_rename():
    tiny = EXPERIMENTS["pipeline"].tiny
    assert presets.resolve("tiny", tiny) is tiny
    longer = presets.resolve("qwen3-8b", tiny, seq=512, layers=None)
    assert (longer.seq, longer.layers, longer.name) == (512, 36, "qwen3-8b+seq")
    assert presets.resolve("qwen3-8b", tiny, seq=2048) is presets.PRESETS["qwen3-8b"]  # no change
    with pytest.raises(ValueError, match="unknown dims preset 'llama'"):
        presets.resolve("llama", tiny)
    with pytest.raises(ValueError, match="cannot override"):
        presets.resolve("tiny", tiny, dtype=2)
    with pytest.raises(ValueError, match="heads 8 is not a multiple of query_groups 3"):
        tiny.replace(heads=8, query_groups=3)


@pytest.mark.real_size
def test_a_qwen3_8b_sized_layer_runs_on_two_cpu_ranks():
    """The real layer at Qwen3-8B's sizes (8 tokens), TP=2, gloo: rank 0's weight table is note
    11's table -- which the note builds on the meta device -- and the wire carries hidden 4096."""
    out = ok(2, "tp-layer", "--dims", "qwen3-8b", "--seq", "8", "--micro-batch-size", "2", "--tp", "2")
    assert_in_note(tables(out)[0], "11_transformer_layer")
    assert "[8, 2, 4096] → [8, 2, 4096]" in out
