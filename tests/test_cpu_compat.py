"""Each CPU patch: the Megatron line it is for is really there, and the patched path runs and
computes the right numbers on CPU ranks."""

import pytest
import torch

from snippets import cpu_compat
from snippets.launch import run_ranks, warm_up
from snippets.sources import file_lines


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.mark.parametrize(
    "site", [s for p in cpu_compat.PATCHES for s in p.sites], ids=lambda s: f"{s.path}:{s.line}"
)
def test_each_cited_line_needs_its_patch(site):
    assert site.text in file_lines(site.path)[site.line - 1]


def test_apply_is_idempotent_and_names_every_patch():
    first = cpu_compat.apply()
    proxy = __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch
    assert cpu_compat.apply() == first == sorted(p.name for p in cpu_compat.PATCHES)
    assert __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch is proxy
    assert torch.cuda.current_device() == "cpu"


def test_scoped_patches_leave_torch_alone():
    cpu_compat.apply()
    assert not isinstance(torch, cpu_compat.ModuleProxy)
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")  # only schedules.py sees the CPU-mapped zeros


def _column_parallel_equals_dense():
    # current_device: ColumnParallelLinear allocates its gather buffer on current_device().
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    config = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True)
    torch.manual_seed(0)
    layer = ColumnParallelLinear(6, 8, config=config, init_method=torch.nn.init.normal_,
                                 bias=False, gather_output=True)
    x = torch.randn(3, 2, 6)
    y, _ = layer(x)
    shards = [torch.empty_like(layer.weight) for _ in range(2)]
    dist.all_gather(shards, layer.weight.detach())
    dense = x @ torch.cat(shards, dim=0).T
    return tuple(layer.weight.shape), tuple(y.shape), torch.allclose(y, dense, atol=1e-6)


def test_current_device_column_parallel_linear_equals_dense():
    for weight, out, equal in run_ranks(_column_parallel_equals_dense, 2):
        assert (weight, out, equal) == ((4, 6), (3, 2, 8), True)


def _rng_streams():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        model_parallel_cuda_manual_seed,
    )

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(123)
    before = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        tp_region = torch.rand(4)
    after_fork = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        tp_region_next = torch.rand(4)
    default = torch.rand(4)
    torch.manual_seed(123)
    return dict(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_region=tp_region,
        stream_advances=not torch.equal(tp_region, tp_region_next),
        default_restored=torch.equal(before, after_fork),
        default=default,
        default_expected=torch.rand(4),
    )


def test_rng_tracker_keeps_a_model_parallel_stream_per_tp_rank():
    r = run_ranks(_rng_streams, 4)  # tp=2, dp=2: ranks 0,2 are tp rank 0; ranks 1,3 tp rank 1
    assert [x["tp_rank"] for x in r] == [0, 1, 0, 1]
    assert torch.equal(r[0]["tp_region"], r[2]["tp_region"])      # same tp rank: same stream
    assert not torch.equal(r[0]["tp_region"], r[1]["tp_region"])  # other tp rank: other stream
    for x in r:
        assert x["stream_advances"] and x["default_restored"]
        assert torch.equal(x["default"], x["default_expected"])  # default stream = the seed


def _no_pipelining_loss():
    from functools import partial

    from megatron.core import parallel_state as ps
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model.config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1,
                                     pipeline_dtype=torch.float32)
    model.model_type = ModelType.encoder_or_decoder
    model.set_input_tensor = lambda tensor: None  # only pipeline stages > 0 receive one
    batches = [torch.randn(3, 4) for _ in range(2)]

    def loss_func(output):
        loss = output.pow(2).mean()
        # clone: the schedule divides `loss` in place by num_microbatches (schedules.py:269),
        # and a bare detach() shares its storage, so the logged value would change with it.
        return loss, {"loss": loss.detach().clone()}

    def forward_step(data_iterator, model):
        return model(next(data_iterator)), loss_func

    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
        num_microbatches=2, seq_length=3, micro_batch_size=1, forward_only=False,
    )
    expected = sum(model(b).pow(2).mean() for b in batches) / 2
    grad = model.weight.grad.clone()
    model.zero_grad()
    expected.backward()
    got = sum(o["loss"] for o in out) / 2
    return torch.allclose(got, expected.detach()), torch.allclose(grad, model.weight.grad)


def test_schedules_device_no_pipelining_matches_autograd():
    assert run_ranks(_no_pipelining_loss, 1) == [(True, True)]


def _checkpoint_round_trip(tmp):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing import ShardedTensor

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    local = torch.arange(6.0).view(2, 3) + 10 * rank
    sharded = {"w": ShardedTensor.from_rank_offsets("w", local, (0, rank, 2), replica_id=0)}
    dist_checkpointing.save(sharded, tmp)
    target = {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(2, 3), (0, rank, 2),
                                                   replica_id=0)}
    loaded = dist_checkpointing.load(target, tmp)
    return torch.equal(loaded["w"], local)


def test_synchronize_checkpoint_save_and_load(tmp_path):
    # The torch_dist writer calls torch.cuda.synchronize() while staging tensors.
    assert run_ranks(_checkpoint_round_trip, 2, str(tmp_path)) == [True, True]


def test_the_site_page_shows_the_current_patch_table():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "cpu.md").read_text()
    shown = page.split("<!-- patches:start -->\n", 1)[1].split("<!-- patches:end -->", 1)[0]
    assert shown.strip() == cpu_compat.render_table().strip()
