"""Bytes per parameter: the formula reproduces Megatron's documented table, and the measurement of
real optimizers finds exactly the state the formula predicts."""

import pytest

from snippets.optim.optimizer_memory import bytes_per_parameter
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_formula_is_megatrons_table(d):
    # docs/user-guide/features/dist_optimizer.md at core_v0.19.0
    table = {
        ("fp16", "fp16"): (20, 4 + 16 / d),
        ("bf16", "fp32"): (18, 6 + 12 / d),
        ("fp32", "fp32"): (16, 8 + 8 / d),
    }
    for (param, grad), (plain, distributed) in table.items():
        assert bytes_per_parameter(param, grad, d, distributed=False) == plain
        assert bytes_per_parameter(param, grad, d, distributed=True) == pytest.approx(distributed)


def _measure(distributed_optimizer):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    from snippets.optim.optimizer_memory import measured_bytes

    ps.initialize_model_parallel()
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64, bias=False))
    ddp = DistributedDataParallel(
        TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1),
        DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer),
        module,
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=0.1, clip_grad=0.0, use_distributed_optimizer=distributed_optimizer), [ddp]
    )
    ddp(torch.ones(2, 64)).sum().backward()
    ddp.finish_grad_sync()
    opt.step()  # Adam creates its moments on the first step
    return measured_bytes(ddp, opt), sum(p.numel() for p in module.parameters()), ddp.buffers[0].numel


def test_measured_state_matches_the_formula():
    ((plain, n, _),) = run_ranks(_measure, 1, False)
    assert plain == dict(weights=4 * n, grads=4 * n, main_weights=0, adam_state=8 * n, total=16 * n)
    results = run_ranks(_measure, 2, True)
    padded = results[0][2]
    for got, _, _ in results:
        # whole (padded) weight and grad buffers on every rank, no fp32 copies (weights are fp32)
        assert got["weights"] == got["grads"] == 4 * padded and got["main_weights"] == 0
    # the two ranks' moments together cover every real parameter element exactly once
    assert sum(got["adam_state"] for got, _, _ in results) == 8 * n
