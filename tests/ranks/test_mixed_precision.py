"""snippets/optim/mixed_precision.py reads what a bf16 model and its optimizers hold; checked against
what the two optimizers must hold: a whole fp32 copy each, or fp32 slices that cover every weight
exactly once across DP ranks."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _bf16(use_distributed_optimizer):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    from snippets.optim import mixed_precision

    ps.initialize_model_parallel()
    torch.manual_seed(0)

    class Net(torch.nn.Module):  # param_rows reads ddp.module's named parameters
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64, bias=False)
            self.b = torch.nn.Linear(64, 32, bias=False)

        def forward(self, x):
            return self.b(self.a(x))

    module = Net().bfloat16()
    ddp = DistributedDataParallel(
        TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, bf16=True),
        DistributedDataParallelConfig(
            use_distributed_optimizer=use_distributed_optimizer, grad_reduce_in_fp32=True
        ),
        module,
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=0.1, bf16=True, use_distributed_optimizer=use_distributed_optimizer), [ddp]
    )
    ddp(torch.ones(2, 64, dtype=torch.bfloat16)).float().sum().backward()
    ddp.finish_grad_sync()
    opt.step()
    return (
        mixed_precision.param_rows(ddp),
        mixed_precision.buffer_rows(ddp, opt),
        mixed_precision.main_matches_param(ddp),
    )


def test_float16_optimizer_keeps_a_whole_fp32_copy_of_every_weight():
    ((rows, buffers, matches),) = run_ranks(_bf16, 1, False)
    assert [(r["param"], r["main_grad"], r["main_param"], r["main_is_copy"], r["sharded"]) for r in rows] == [
        ("bfloat16", "float32", "float32", True, False)
    ] * 2
    assert all(r["main_numel"] == r["numel"] and r["main_grad_in_buffer"] for r in rows)
    n = 64 * 64 + 32 * 64
    assert buffers == [
        ["DDP grad buffer（main_grad）", "float32", n],
        ["fp32 主参数（优化器自己的拷贝）", "float32", n],
        ["Adam 状态 exp_avg + exp_avg_sq", "float32", 2 * n],
    ]
    assert matches


def test_distributed_optimizer_fp32_slices_cover_each_weight_once():
    results = run_ranks(_bf16, 2, True)
    n = 64 * 64 + 32 * 64
    for rows, buffers, _ in results:
        assert all(r["sharded"] and r["main_param"] in ("float32", "-") for r in rows)
        assert buffers[0][:2] == ["DDP param buffer（模型权重）", "bfloat16"] and buffers[0][2] >= n
        assert buffers[1][:2] == ["DDP grad buffer（main_grad）", "float32"]
    for i in range(2):
        assert sum(rows[i]["main_numel"] for rows, _, _ in results) == rows[i]["numel"]
    copies = [dict((b[0], b[2]) for b in buffers) for _, buffers, _ in results]
    assert sum(c["fp32 主参数（优化器自己的拷贝）"] for c in copies) == n
    assert sum(c["Adam 状态 exp_avg + exp_avg_sq"] for c in copies) == 2 * n
