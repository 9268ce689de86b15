"""Note 20's experiment: what a bf16 model and Megatron's optimizer hold per rank, with and without
the distributed optimizer (ZeRO-1), at any size.

:func:`bf16_buffers` builds a real ``GPTModel`` on every rank (weights by global name, so every
rank starts from the same model), casts it to bf16 with ``Float16Module`` and wraps it in DDP
with an fp32 grad buffer (``grad_reduce_in_fp32=True``, the training entry's default for
``--bf16``), as ``get_model`` does; then ``get_megatron_optimizer`` with or without
``use_distributed_optimizer`` and ``steps`` training steps over this DP rank's share of the
global batch (Adam builds its moments in the first step). It returns the buffers the rank holds
(:func:`snippets.optim.mixed_precision.buffer_rows`), every parameter's dtypes and main-copy size
(:func:`snippets.optim.mixed_precision.param_rows`), the bytes the real objects hold
(:func:`snippets.optim.optimizer_memory.measured_bytes`) and a digest of the weights after the steps,
so two runs can be compared bit for bit without shipping the weights. :func:`run` does both runs
in one job; :func:`tables` prints note 20's section 4: the buffers, which parameters have an fp32
main shard, and bytes per parameter against the formula.

:func:`overlap_run` is section 8's run (overlap of the grad reduce-scatter and the param
all-gather with compute); its runner entry is :mod:`snippets.experiments.n20_overlap`.
"""

from __future__ import annotations

import hashlib

import torch

from snippets.experiments.n13_pipeline import microbatches
from snippets.experiments.n14_ddp import build_model
from snippets.record.tables import Table


def digest(named_tensors) -> str:
    """A SHA-256 of ``(name, tensor bytes)`` pairs: equal digests = bitwise equal tensors."""
    sha = hashlib.sha256()
    for name, t in named_tensors:
        sha.update(name.encode())
        sha.update(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return sha.hexdigest()


def bf16_buffers(dims, use_distributed_optimizer, steps=1, device="cpu"):
    """On every rank: a bf16 model, Megatron's optimizer, ``steps`` steps; what the rank holds."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    from snippets.models.tiny_gpt import forward_step, global_name
    from snippets.optim import grad_norm, mixed_precision, optimizer_memory

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        bf16=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=device == "cpu",
    )
    with torch.device(device):
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )
    grad_norm.init_full_by_global_name(model, tp_rank=0, tp_size=1)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            use_distributed_optimizer=use_distributed_optimizer, grad_reduce_in_fp32=True
        ),
        Float16Module(config, model),
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(lr=0.01, bf16=True, use_distributed_optimizer=use_distributed_optimizer), [ddp]
    )
    dp, r = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    n = dims.microbatches // dp
    mine = microbatches(dims, dims.microbatches, device)[n * r : n * (r + 1)]
    for _ in range(steps):
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mine),
            model=[ddp],
            num_microbatches=n,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
        finalize_model_grads([ddp])
        optimizer.step()
    return dict(
        buffers=mixed_precision.buffer_rows(ddp, optimizer),
        rows=mixed_precision.param_rows(ddp),
        memory=optimizer_memory.measured_bytes(ddp, optimizer),
        numel=sum(p.numel() for p in ddp.parameters()),
        weights=digest((global_name(ddp.module, k), p) for k, p in ddp.module.named_parameters()),
    )


def run(dims, par) -> dict:
    """On every rank (the runner): the distributed optimizer's run, then the unsharded one."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    return {sharded: bf16_buffers(dims, sharded, device=par.device) for sharded in (True, False)}


BUCKET_SIZE = {"tiny": 3000}
"""Note 20's 9,632-parameter model needs a small bucket to split into three; at real sizes
Megatron's default applies (``None``: max(40M, 1M x DP) elements)."""


def overlap_run(dims, overlap, iterations=2, bucket_size=None, device="cpu"):
    """On every rank: ``iterations`` recorded steps with both overlap switches ``overlap``."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.dp import overlap_timeline
    from snippets.models.tiny_gpt import by_global_name, forward_step
    from snippets.record import recorder

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model, config = build_model(dims, device)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            use_distributed_optimizer=True,
            overlap_grad_reduce=overlap,
            overlap_param_gather=overlap,
            bucket_size=bucket_size,
        ),
        model,
    )
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=0.01, use_distributed_optimizer=True), [ddp])
    config.no_sync_func = ddp.no_sync
    dp, r = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    n = dims.microbatches // dp
    mine = microbatches(dims, dims.microbatches, device)[n * r : n * (r + 1)]
    steps = []
    for _ in range(iterations):
        with recorder.record() as events, overlap_timeline.markers(ddp, events):
            events.append("schedule")
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(mine),
                model=[ddp],
                num_microbatches=n,
                seq_length=dims.seq,
                micro_batch_size=dims.micro_batch_size,
            )
            events.append("finalize_model_grads")
            finalize_model_grads([ddp])
            events.append("optimizer.step")
            optimizer.step()
        steps.append(events)
    after_step = by_global_name([ddp], "param")
    ddp.start_param_sync(force_sync=True)  # what the formal entry does before saving a checkpoint
    return dict(
        steps=steps,
        after_step=after_step,
        synced=by_global_name([ddp], "param"),
        buckets=[b.grad_data.numel() for b in ddp.buffers[0].buckets],
    )


# ----------------------------------------------------------------------------- note 20's tables


def buffer_table(zero1: list, plain: list) -> Table:
    """Every buffer of every rank with the distributed optimizer, and of rank 0 without."""
    return Table(
        ["运行", "rank", "buffer", "dtype", "元素"],
        [
            [name, rank, *row]
            for name, results in (("分布式优化器", zero1), ("不分片", plain[:1]))
            for rank, r in enumerate(results)
            for row in r["buffers"]
        ],
    )


def owned_lines(zero1: list) -> str:
    """Per rank: how many parameters have an fp32 main shard there, and which the shard boundary cuts."""
    lines = []
    for rank, r in enumerate(zero1):
        owned = [x for x in r["rows"] if x["main_numel"]]
        lines.append(
            f"rank {rank}: {len(owned)} / {len(r['rows'])} 个参数有 fp32 主参数分片，"
            f"共 {sum(x['main_numel'] for x in owned)} 个元素；被分界线切开的参数: "
            f"{[(x['name'], x['main_numel'], x['numel']) for x in owned if x['main_numel'] != x['numel']]}"
        )
    return "\n".join(lines)


def bytes_table(zero1: list, plain: list, dp: int) -> Table:
    """Measured bytes per parameter against ``optimizer_memory.bytes_per_parameter`` (bf16
    weights, fp32 grads), and whether the sharded run ends with the unsharded run's weights."""
    from snippets.optim.optimizer_memory import bytes_per_parameter

    return Table(
        ["运行", "rank", "实测 字节 / 参数", "公式", "一步后权重与不分片逐位相同"],
        [
            [
                "分布式优化器",
                rank,
                round(r["memory"]["total"] / r["numel"], 2),
                bytes_per_parameter("bf16", "fp32", dp, True),
                r["weights"] == plain[0]["weights"],
            ]
            for rank, r in enumerate(zero1)
        ]
        + [
            [
                "不分片",
                0,
                round(plain[0]["memory"]["total"] / plain[0]["numel"], 2),
                bytes_per_parameter("bf16", "fp32", dp, False),
                True,
            ]
        ],
    )


def tables(results: list, dims, par) -> list:
    zero1, plain = [r[True] for r in results], [r[False] for r in results]
    return [buffer_table(zero1, plain), owned_lines(zero1), bytes_table(zero1, plain, par.dp)]
