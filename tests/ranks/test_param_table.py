"""snippets.config.param_table reads Megatron's own split attributes and puts TP shards back together.
Reference: the same tiny GPTModel built at TP=1 (CPU initialisation makes the TP=2 shards slices
of exactly that model), and SwiGLU's linear_fc1, where ignoring the stride gives the wrong tensor."""

import pytest
import torch

from snippets.config.param_table import gather, global_shape, param_rows
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _build(tp):
    import torch.nn.functional as F
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.models import tiny_gpt  # noqa: F401 - silences the known import warnings

    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        ffn_hidden_size=32,
        gated_linear_unit=True,
        activation_func=F.silu,
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8
    )
    return param_rows(model), {n: p.detach().clone() for n, p in model.named_parameters()}


def test_tp2_shards_gather_to_the_tp1_model():
    (rows0, params0), (rows1, params1) = run_ranks(_build, 2, 2, grid=dict(tp=2))
    rows_tp1, params_tp1 = run_ranks(_build, 1, 1)[0]
    assert [r["name"] for r in rows0] == [r["name"] for r in rows1] == list(params_tp1)
    for row in rows0:
        name = row["name"]
        assert global_shape(row, 2) == tuple(params_tp1[name].shape), name
        if row["split"]:
            whole = gather([params0[name], params1[name]], row["partition_dim"], row["stride"])
        else:
            assert torch.equal(params0[name], params1[name]), name
            whole = params0[name]
        assert torch.equal(whole, params_tp1[name]), name
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    assert next(r for r in rows0 if r["name"] == fc1)["stride"] == 2
    naive = torch.cat([params0[fc1], params1[fc1]])
    assert not torch.equal(naive, params_tp1[fc1]), "stride 2 must matter for SwiGLU's fc1"


def test_gather_inverts_the_strided_split():
    full = torch.arange(24.0).view(12, 2)
    tp, stride = 3, 2
    chunks = full.chunk(tp * stride)
    shards = [torch.cat(chunks[r::tp]) for r in range(tp)]  # what rank r keeps
    assert torch.equal(gather(shards, 0, stride), full)
