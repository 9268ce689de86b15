"""Note 15's experiment: two Adam steps with and without Megatron's distributed optimizer, at any size.

``train_two_steps`` builds a real ``GPTModel`` on every rank (:func:`snippets.experiments.n14_ddp.build_model`),
wraps it in DDP and ``get_megatron_optimizer`` (``use_distributed_optimizer`` on or off), and trains
``steps`` steps over this DP rank's share of the global batch, recording everything from
``finalize_model_grads`` to the end of ``optimizer.step()`` in the last step. It returns the
optimizer's classes, the grad buffer's buckets, each rank's shard of them (the three ranges of
``_build_model_gbuf_param_range_map``), the collectives, the bytes the real objects hold
(:mod:`snippets.optim.optimizer_memory`) and, with ``keep_tensors``, the weights and the buffer before and
after the reduction (note 15 compares them with no sharding and with one process).

The note's FSDP comparison (Megatron's ``TorchFullyShardedDataParallel`` against TP / SP on the same
model) is a cell of the note itself; its helpers are in :mod:`snippets.dp.fsdp2`.
"""

from __future__ import annotations

from snippets.experiments.n13_pipeline import microbatches
from snippets.experiments.n14_ddp import build_model
from snippets.record.tables import Table


def train_two_steps(dims, use_distributed_optimizer, steps=2, device="cpu", keep_tensors=True):
    """On every rank: ``steps`` training steps, the last one's optimizer part recorded."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.dp import grad_buffers
    from snippets.models.tiny_gpt import by_global_name, forward_step
    from snippets.optim import optimizer_memory
    from snippets.record import recorder

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model, config = build_model(dims, device)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer), model
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-2, clip_grad=0.0, use_distributed_optimizer=use_distributed_optimizer
        ),
        [ddp],
    )
    config.no_sync_func = ddp.no_sync
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    per_rank = dims.microbatches // dp
    mine = microbatches(dims, dims.microbatches, device)[per_rank * dp_rank : per_rank * (dp_rank + 1)]
    for _ in range(steps):
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mine),
            model=[ddp],
            num_microbatches=len(mine),
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
        local = ddp.buffers[0].grad_data.clone() if keep_tensors else None
        with recorder.record() as calls:
            finalize_model_grads([ddp])
            reduced = ddp.buffers[0].grad_data.clone() if keep_tensors else None
            ok, grad_norm, _ = optimizer.step()
    inner = optimizer.chained_optimizers[0]
    return dict(
        types=(type(optimizer).__name__, type(inner).__name__, type(inner.optimizer).__name__),
        ok=ok,
        grad_norm=grad_norm,
        params=by_global_name([ddp], "param") if keep_tensors else None,
        calls=[c for c in calls if len(c.ranks) > 1],  # groups of one rank move nothing
        local=local,
        reduced=reduced,
        buckets=grad_buffers.bucket_rows(ddp),
        shards=grad_buffers.shard_rows(inner, ddp) if use_distributed_optimizer else [],
        memory=optimizer_memory.measured_bytes(ddp, optimizer),
        numel=sum(p.numel() for p in ddp.parameters()),
    )


def run(dims, par) -> dict:
    """On every rank (the runner): two steps without sharding, then two with, no tensors kept."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    return {
        sharded: train_two_steps(dims, sharded, device=par.device, keep_tensors=False)
        for sharded in (False, True)
    }


MEANINGS = {
    "reduce_scatter_tensor": "梯度：求和后每个 rank 只留自己那段（先乘了 1/DP，即平均）",
    "optimizer/clip_grads.py::get_grad_norm_fp32": "梯度范数：各 rank 本段的平方和相加",
    "all_gather_into_tensor": "权重：各 rank 更新过的那段拼回完整 buffer",
    "all_reduce": "梯度求和（先乘了 1/DP，即平均）",
}


def memory_rows(name, results):
    rows = []
    for rank, r in enumerate(results):
        m = r["memory"]
        rows.append(
            [
                name,
                rank,
                m["weights"],
                m["grads"],
                m["main_weights"],
                m["adam_state"],
                m["total"],
                round(m["total"] / r["numel"], 2),
            ]
        )
    return rows


def tables(results: list, dims, par) -> list:
    from snippets.record.recorder import communication_table

    plain, zero1 = [r[False] for r in results], [r[True] for r in results]
    dp = par.dp
    return [
        Table(
            ["运行", "返回", "里面", "最里层"],
            [
                [f"DP={dp}，不分片", *plain[0]["types"]],
                [f"DP={dp}，use_distributed_optimizer", *zero1[0]["types"]],
            ],
        ),
        Table(
            ["运行", "参数个数", "buffer 元素（补齐后）", "bucket 数", "每个 rank 一段"],
            [
                [
                    f"DP={dp}，不分片",
                    plain[0]["numel"],
                    plain[0]["buckets"][0][3],
                    len(plain[0]["buckets"]),
                    "-",
                ],
                [
                    f"DP={dp}，分布式优化器",
                    zero1[0]["numel"],
                    zero1[0]["buckets"][0][3],
                    len(zero1[0]["buckets"]),
                    zero1[0]["buckets"][0][3] // dp,
                ],
            ],
        ),
        Table(
            ["rank", "参数", "元素", "gbuf_world", "gbuf_local", "param"],
            [[rank] + row[1:] for rank, r in enumerate(zero1) for row in r["shards"]],
        ),
        "分布式优化器，最后一步 finalize_model_grads → optimizer.step()（rank 0）:",
        communication_table(zero1[0]["calls"], MEANINGS, ranks=False),
        "不分片，同一段（rank 0）:",
        communication_table(plain[0]["calls"], MEANINGS, ranks=False),
        Table(
            ["运行", "rank", "权重 B", "梯度 B", "fp32 主权重 B", "Adam 状态 B", "合计 B", "字节 / 参数"],
            memory_rows(f"DP={dp}，不分片", plain) + memory_rows(f"DP={dp}，分布式优化器", zero1),
        ),
    ]


def folded(summary: str, *tables: Table):
    """``tables`` behind a closed ``<details>``: a check the page only needs to state in one sentence."""
    from IPython.display import Markdown

    body = "\n\n".join(t.markdown() for t in tables)
    return Markdown(f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>")
