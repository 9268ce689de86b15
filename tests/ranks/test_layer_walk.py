"""snippets.tp.layer_walk against the real TransformerLayer: the parameter formulas equal the counts of
real layers, tp_shard reproduces Megatron's CPU initialization, qkv_rows is how
SelfAttention really splits linear_qkv, and collectives land on the submodule that issued them."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


CONFIGS = [
    # Qwen3-like: RMSNorm, SwiGLU, GQA, QK norm, no bias
    dict(
        normalization="RMSNorm",
        gated_linear_unit=True,
        qk_layernorm=True,
        add_bias_linear=False,
        num_query_groups=2,
    ),
    # GPT-2-like: LayerNorm (weight and bias), GELU, biases everywhere, MHA
    dict(
        normalization="LayerNorm",
        gated_linear_unit=False,
        qk_layernorm=False,
        add_bias_linear=True,
        num_query_groups=4,
    ),
]


def _config(tp, sp=False, **kw):
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    glu = kw.get("gated_linear_unit", True)
    base = dict(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        kv_channels=4,
        ffn_hidden_size=24,
        activation_func=F.silu if glu else F.gelu,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        use_cpu_initialization=True,
    )
    return TransformerConfig(**{**base, **kw})


def _layer(config):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    return build_module(spec, config=config, layer_number=1)


def _counts(tp, kw):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.tp.layer_walk import counts_by_submodule, param_counts, weight_rows

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1)
    config = _config(tp, **kw)
    return counts_by_submodule(weight_rows(_layer(config))), param_counts(config, tp)


@pytest.mark.parametrize("kw", CONFIGS, ids=["qwen3-like", "gpt2-like"])
@pytest.mark.parametrize("tp", [1, 2])
def test_param_counts_formula_equals_real_layer(tp, kw):
    for real, formula in run_ranks(_counts, tp, tp, kw):
        assert {k: v for k, v in formula.items() if v} == real


def _shards_and_qkv(tp):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.tp.layer_walk import tp_shard

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1)
    torch.manual_seed(0)
    layer = _layer(_config(tp, **CONFIGS[0]))
    weights = {n: p.detach().clone() for n, p in layer.named_parameters()}
    params = dict(layer.named_parameters())
    # Write each row's global index into column 0 and feed the unit vector e0: every entry of the
    # linear_qkv output is then the index of the weight row that produced it.
    attn = layer.self_attention
    rows = attn.linear_qkv.weight.shape[0]
    with torch.no_grad():
        attn.linear_qkv.weight.zero_()
        attn.linear_qkv.weight[:, 0] = torch.arange(rows) + ps.get_tensor_model_parallel_rank() * rows
    attn.q_layernorm = attn.k_layernorm = None  # keep the raw indices
    x = torch.zeros(1, 1, 16)
    x[..., 0] = 1
    q, k, v = attn.get_query_key_value_tensors(x)
    return weights, params, [t[0, 0, :, :].long().tolist() for t in (q, k, v)], tp_shard


def test_tp_shard_reproduces_cpu_initialization_and_qkv_rows_is_megatrons_split():
    from snippets.tp.layer_walk import qkv_rows, tp_shard

    (one,) = run_ranks(_shards_and_qkv, 1, 1)
    two = run_ranks(_shards_and_qkv, 2, 2)
    for rank, (weights, params, (q, k, v), _) in enumerate(two):
        for name, w in weights.items():
            assert torch.equal(w, tp_shard(one[0][name], params[name], rank, 2)), name
        expected = qkv_rows(num_heads=4, num_groups=2, head_dim=4, tp=2, rank=rank)
        assert (q, k, v) == (expected["q"], expected["k"], expected["v"])
    # one group = 2 q heads + k + v = 16 rows: rank 1 starts at row 16, the k heads sit at 8 and 24
    assert two[1][2][0][0][0] == 16
    assert qkv_rows(4, 2, 4, 1, 0)["k"] == [[8, 9, 10, 11], [24, 25, 26, 27]]


def _attributed(sp, tp=2):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.record import recorder
    from snippets.tp.layer_walk import apis, collectives_by_submodule, only_in, unattributed

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1)
    layer = _layer(_config(tp, sp=sp, **CONFIGS[0]))
    s = 3 if sp else 6
    x = torch.randn(s, 2, 16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, 6, 6, dtype=torch.bool), diagonal=1)
    names = [
        "input_layernorm",
        "self_attention",
        "self_attention.linear_qkv",
        "self_attention.core_attention",
        "self_attention.linear_proj",
        "pre_mlp_layernorm",
        "mlp.linear_fc1",
        "mlp.linear_fc2",
    ]
    with recorder.record() as calls, collectives_by_submodule(layer, calls, names) as spans:
        y, _ = layer(x, attention_mask=mask)
        y.sum().backward()
    table = {n: (apis(only_in(spans, n, "forward")), apis(only_in(spans, n, "backward"))) for n in names}
    return table, len(unattributed(calls, spans)), len(calls)


def test_collectives_land_on_the_linears_that_issue_them():
    table, missing, total = run_ranks(_attributed, 2, False)[0]
    assert (missing, total) == (0, 4)
    assert table["self_attention.linear_qkv"] == ("—", "all-reduce")
    assert table["self_attention.linear_proj"] == ("all-reduce", "—")
    assert table["mlp.linear_fc1"] == ("—", "all-reduce")
    assert table["mlp.linear_fc2"] == ("all-reduce", "—")
    assert table["input_layernorm"] == table["self_attention.core_attention"] == ("—", "—")
    assert table["self_attention"] == ("—", "—")  # its calls all belong to its linears
    table, missing, total = run_ranks(_attributed, 2, True)[0]
    assert (missing, total) == (0, 10)
    assert table["self_attention.linear_qkv"] == ("all-gather", "all-gather, reduce-scatter")
    assert table["self_attention.linear_proj"] == ("reduce-scatter", "all-gather")


def test_fewer_query_groups_than_tp_gathers_inside_self_attention_itself():
    # 2 query groups at TP=4: get_query_key_value_tensors all-gathers linear_qkv's output
    table, missing, total = run_ranks(_attributed, 4, False, 4)[0]
    assert (missing, total) == (0, 6)
    assert table["self_attention"] == ("all-gather", "reduce-scatter")
    assert table["self_attention.linear_qkv"] == ("—", "all-reduce")
