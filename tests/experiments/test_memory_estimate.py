"""snippets.models.memory_estimate against references: layer weights against snippets.tp.layer_walk's
formulas (themselves checked against real layers), activations against the tensors autograd really
saves in a real TransformerLayer, in-flight micro-batches against Megatron's own warm-up count, and
the runner's verdict on this machine's memory."""

import pytest
import torch

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.models import memory_estimate as mem
from snippets.models import presets
from snippets.models.presets import Dims
from snippets.ranks.launch import run_ranks, warm_up

QWEN3_LIKE = Dims(
    "a",
    hidden=64,
    heads=8,
    query_groups=4,
    kv_channels=16,
    ffn=192,
    vocab=1,
    layers=1,
    seq=64,
    micro_batch_size=2,
    microbatches=1,
    swiglu=True,
    rmsnorm=True,
    qk_norm=True,
    bias=False,
)
GPT_LIKE = Dims(
    "b",
    hidden=64,
    heads=4,
    query_groups=4,
    kv_channels=16,
    ffn=128,
    vocab=1,
    layers=1,
    seq=32,
    micro_batch_size=1,
    microbatches=1,
)


@pytest.fixture(scope="module")
def server():
    warm_up()


@pytest.mark.parametrize("dims", [QWEN3_LIKE, GPT_LIKE, *presets.PRESETS.values()])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layer_weights_equal_layer_walk_formulas(dims, tp):
    from megatron.core.transformer import TransformerConfig

    from snippets.tp.layer_walk import param_counts

    kwargs = dims.transformer_config_kwargs()
    config = TransformerConfig(**{**kwargs, "num_layers": 1})
    assert mem.layer_weight_elements(dims, tp) == sum(param_counts(config, tp).values())


def test_whole_model_on_one_stage_is_the_parameter_count():
    for dims in [*presets.PRESETS.values(), EXPERIMENTS["refit"].tiny, EXPERIMENTS["pipeline"].tiny]:
        assert mem.stage_weight_elements(dims, tp=1, pp=1) == presets.parameter_count(dims)


def _saved_bytes(dims, tp, sp):
    """Bytes of the tensors autograd saves in one real layer's forward (parameters excluded)."""
    from megatron.core import parallel_state

    from snippets.experiments.n11_tp_layer import build_layer

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, _ = build_layer(dims, tp, sp)
    s, b = dims.seq, dims.micro_batch_size
    x = torch.randn(s // (tp if sp else 1), b, dims.hidden, requires_grad=True)
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=causal)
    return sum(seen.values())


@pytest.mark.parametrize("dims", [QWEN3_LIKE, GPT_LIKE], ids=["qwen3-like", "gpt-like"])
@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_layer_activations_are_close_to_what_autograd_saves(server, dims, tp, sp):
    saved = run_ranks(_saved_bytes, tp, dims, tp, sp)[0]
    estimate = mem.layer_activation_elements(dims, tp, sp) * mem.FP32
    assert 0.9 * saved <= estimate <= 1.4 * saved, (saved, estimate)


class _FakeP2P:
    """Just what ``get_pp_rank_microbatches`` reads from a ``P2PCommunicator``."""

    def __init__(self, pp, vp):
        self.virtual_pipeline_model_parallel_size = vp
        self.pp_group = type("G", (), {"size": lambda _: pp, "rank": lambda _: 0})()


@pytest.mark.parametrize(
    "pp, vp, m", [(2, None, 4), (4, None, 2), (4, None, 8), (2, 2, 4), (4, 2, 4), (4, 2, 8), (8, 3, 16)]
)
def test_in_flight_microbatches_follow_megatrons_warmup(pp, vp, m):
    """Stage 0 holds its warm-up forwards plus the first steady one (all of them if m is small)."""
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    total, _, warmup, remaining = get_pp_rank_microbatches(m, vp or 1, pp, p2p_communicator=_FakeP2P(pp, vp))
    assert mem.in_flight_microbatches(m, pp, vp) == (warmup + 1 if remaining else warmup)


def test_runner_verdict_against_this_machine(monkeypatch):
    from snippets.ranks import runner as run

    pipeline = EXPERIMENTS["pipeline"]
    par = Parallel(world=2, pp=2)
    fits, line = run.memory_verdict(pipeline, pipeline.tiny, par, 0, 2)
    assert fits and line.startswith("memory per rank: needs ~0.50 GiB")
    monkeypatch.setattr(mem, "available_bytes", lambda cuda, rank, world: (8 * mem.GiB, "test"))
    fits, line = run.memory_verdict(pipeline, presets.PRESETS["qwen3-8b"], par, 0, 2)
    assert not fits
    assert "refusing pipeline --dims qwen3-8b" in line and "this rank has 8.00 GiB (test)" in line


def test_available_bytes_on_cpu_is_a_share_of_host_ram():
    import psutil

    one, text = mem.available_bytes(False, 0, 1)
    four, _ = mem.available_bytes(False, 0, 4)
    assert abs(four * 4 - one) < 0.1 * one <= psutil.virtual_memory().total
    assert "available host RAM / 1 rank(s)" in text
