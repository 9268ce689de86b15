"""Note 14's experiment: Megatron's ``DistributedDataParallel`` on a real ``GPTModel``, at any size.

``ddp_run`` builds the model on every rank (weights from their global names, so every rank starts
equal), wraps it in DDP with or without ``overlap_grad_reduce``, runs
the schedule over this DP rank's share of the global batch's micro-batches with ``no_sync`` on the
config (as the training entry does), then ``finalize_model_grads``; both parts are recorded. It
returns the grad buffer's buckets and every parameter's range in it (:mod:`snippets.dp.grad_buffers`)
and, with ``keep_grads``, the gradients before and after the reduction. ``python -m snippets.run ddp
--dims qwen3-8b --layers 2`` on 8 ranks shows the buckets and all-reduces of a real model's sizes.

``pipeline_ddp_run`` is the same with pipeline parallelism: every stage (the embedding shared with
the output layer) in its own DDP with overlap; it records the 1F1B order and where in it each bucket's
all-reduce starts (note 14's main picture, :mod:`snippets.dp.pipeline_buckets`).
"""

from __future__ import annotations

import torch

from snippets.experiments.n13_pipeline import microbatches, pipeline_config
from snippets.record.tables import Table

BUCKET_SIZE = {"tiny": 1000}
"""Note 14's 9,632-parameter model needs a tiny bucket to split into several (the overlapped run);
at real sizes Megatron's default applies (``None``: max(40M, 1M x DP) elements)."""


def build_model(dims, device="cpu"):
    """The whole ``GPTModel`` at ``dims`` on this rank (local spec), weights by global name."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import init_by_global_name

    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp=1, device=device)
    with torch.device(device):
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )
    init_by_global_name(model)
    return model, config


def ddp_run(dims, overlap_grad_reduce, bucket_size=None, iterations=1, device="cpu", keep_grads=True):
    """On every rank: ``iterations`` DDP steps (schedule, then ``finalize_model_grads``), recorded."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.dp import grad_buffers, overlap_timeline
    from snippets.models.tiny_gpt import by_global_name, forward_step
    from snippets.record import recorder

    def comm(calls):  # cross entropy all-reduces over TP, here a group of one: not communication
        return [c for c in calls if not isinstance(c, overlap_timeline.Marker) and len(c.ranks) > 1]

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model, config = build_model(dims, device)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(overlap_grad_reduce=overlap_grad_reduce, bucket_size=bucket_size),
        model,
    )
    config.no_sync_func = ddp.no_sync
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    per_rank = dims.microbatches // dp
    mine = microbatches(dims, dims.microbatches, device)[per_rank * dp_rank : per_rank * (dp_rank + 1)]
    steps = []
    for _ in range(iterations):
        ddp.zero_grad_buffer()
        with recorder.record() as in_schedule, overlap_timeline.markers(ddp, in_schedule):
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(mine),
                model=[ddp],
                num_microbatches=per_rank,
                seq_length=dims.seq,
                micro_batch_size=dims.micro_batch_size,
            )
        local = by_global_name([ddp], "main_grad") if keep_grads else None
        with recorder.record() as in_finalize:
            finalize_model_grads([ddp])
        steps.append(
            dict(
                schedule=comm(in_schedule),
                finalize=comm(in_finalize),  # the tables
                events=["schedule", *in_schedule, "finalize_model_grads", *in_finalize],
            )
        )
    return dict(
        steps=steps,
        local=local,
        reduced=by_global_name([ddp], "main_grad") if keep_grads else None,
        buckets=grad_buffers.bucket_rows(ddp),
        params=grad_buffers.param_rows(ddp),
        dtypes=grad_buffers.buffer_dtypes(ddp),
        param_buffer=ddp.buffers[0].param_data is not None,
        bucket_size=ddp.ddp_config.bucket_size,
        views=grad_buffers.main_grads_are_views(ddp),
        grad_is_none=all(p.grad is None for p in ddp.parameters()),
    )


def stage_in_ddp(dims, pp: int, bucket_size=None, device="cpu"):
    """This rank's pipeline stage of a ``GPTModel`` that shares its word embedding with the output
    layer (the training entry's default), in DDP with ``overlap_grad_reduce``. Weights by global
    name; the last stage's output layer then gets the first stage's word-embedding values, so the two
    copies start equal, as ``GPTModel``'s construction-time all-reduce leaves them."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import init_by_global_name

    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp, device=device)
    with torch.device(device):
        stage = GPTModel(
            config,
            get_gpt_layer_local_spec(),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=True,
        )
    init_by_global_name(stage)
    if stage.post_process and not stage.pre_process:
        with torch.no_grad():  # the tied copy: the same values as embedding.word_embeddings.weight
            stage.output_layer.weight.copy_(
                _by_name_values("embedding.word_embeddings.weight", stage.output_layer.weight)
            )
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=bucket_size)
    return DistributedDataParallel(config, ddp_config, stage), config


def _by_name_values(name: str, like: torch.Tensor) -> torch.Tensor:
    import zlib

    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(like.shape, generator=gen) * 0.2


def pipeline_ddp_run(
    dims, pp: int = 2, bucket_size=None, m: int = 4, iterations: int = 2, device="cpu"
) -> dict:
    """On every rank of a PP x DP grid: ``iterations`` training steps of this rank's stage in DDP
    (overlap on, ``no_sync`` on the config), each DP rank on its own ``m`` micro-batches.

    Per step it returns the schedule's recorded order (:func:`snippets.pp.timeline.record_schedule`)
    and every bucket group's ``start_grad_sync`` call the schedule made: during which backward it
    came, how many of that backward's gradients were done by then, and the elements it reduces;
    then the collectives of ``finalize_model_grads`` (recorded)."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=pp)
    ddp, config = stage_in_ddp(dims, pp, bucket_size, device)
    config.no_sync_func = ddp.no_sync
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    mine = microbatches(dims, dp * m, device)[m * dp_rank : m * (dp_rank + 1)]
    return dict(
        ranks=dict(
            world=torch.distributed.get_rank(),
            pp=parallel_state.get_pipeline_model_parallel_rank(),
            dp=dp_rank,
        ),
        bucket_size=ddp.bucket_size,
        buckets=[[b.grad_data.numel() for b in group.buckets] for group in ddp.bucket_groups],
        steps=[recorded_pipeline_step(ddp, mine, dims) for _ in range(iterations)],
    )


def recorded_pipeline_step(ddp, data: list, dims) -> dict:
    """One step of :func:`pipeline_ddp_run`: the schedule with its order and the bucket all-reduce
    starts recorded, then ``finalize_model_grads``."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.models.tiny_gpt import forward_step
    from snippets.pp import timeline
    from snippets.record import recorder

    real_start = _ParamAndGradBucketGroup.start_grad_sync
    done: dict = {}  # index of a backward in the recorded ops -> gradients it has produced
    syncs: list[dict] = []
    ops: list = []

    def last_backward():
        return next((i for i in range(len(ops) - 1, -1, -1) if ops[i].kind == "B"), None)

    def start_grad_sync(group, *args, **kwargs):
        b = last_backward()
        numel = sum(bucket.grad_data.numel() for bucket in group.buckets)
        syncs.append(dict(backward=b, done=done.get(b, 0), numel=numel))
        return real_start(group, *args, **kwargs)

    def count(_grad):
        b = last_backward()
        done[b] = done.get(b, 0) + 1

    ddp.zero_grad_buffer()
    handles = [p.register_hook(count) for p in ddp.parameters()]
    _ParamAndGradBucketGroup.start_grad_sync = start_grad_sync
    try:
        with timeline.record_schedule() as recorded:
            ops = recorded
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(data),
                model=[ddp],
                num_microbatches=len(data),
                seq_length=dims.seq,
                micro_batch_size=dims.micro_batch_size,
            )
    finally:
        _ParamAndGradBucketGroup.start_grad_sync = real_start
        for handle in handles:
            handle.remove()
    with recorder.record() as in_finalize:
        finalize_model_grads([ddp])
    for sync in syncs:  # where in its backward: the share of that backward's gradients done
        b = sync["backward"]
        sync["microbatch"] = None if b is None else ops[b].microbatch
        sync["total"] = done.get(b, 0)
    return dict(ops=ops, syncs=syncs, finalize=[c for c in in_finalize if len(c.ranks) > 1])


def run(dims, par) -> dict:
    """On every rank (the runner): one step without overlap, two with (note 14's runs), no grads."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    return dict(
        plain=ddp_run(dims, False, device=par.device, keep_grads=False),
        overlapped=ddp_run(
            dims, True, BUCKET_SIZE.get(dims.name), iterations=2, device=par.device, keep_grads=False
        ),
    )


MEANINGS = {
    "distributed/param_and_grad_buffer.py::start_grad_sync": "dp-cp 群内梯度求和（先乘了 1/群大小，和即平均）",
    "distributed/finalize_model_grads.py::_allreduce_embedding_grad": "首尾 stage 两份共享词嵌入的梯度相加",
}


def tables(results: list, dims, par) -> list:
    from snippets.record.recorder import communication_table

    plain, overlapped = results[0]["plain"], results[0]["overlapped"]
    return [
        f"overlap=False: bucket_size = {plain['bucket_size']} → {len(plain['buckets'])} 个 bucket，"
        f"{plain['buckets'][0][2]} 个元素",
        f"overlap=True, bucket_size={overlapped['bucket_size']}: buffer 的 (param / grad) dtype: "
        f"{overlapped['dtypes']}",
        Table(
            ["bucket", "offset", "元素", "补齐后", "参数（buffer 顺序，省略开头的 decoder.）"],
            overlapped["buckets"],
        ),
        f"不 overlap，schedule 期间: {len(plain['steps'][0]['schedule'])} 条;  finalize_model_grads 期间:",
        communication_table(plain["steps"][0]["finalize"], MEANINGS),
        f"overlap 第 1 步，schedule 期间: {len(overlapped['steps'][0]['schedule'])} 条;  finalize_model_grads 期间:",
        communication_table(overlapped["steps"][0]["finalize"], MEANINGS),
        f"overlap 第 2 步，finalize_model_grads 期间: {len(overlapped['steps'][1]['finalize'])} 条;  schedule 期间:",
        communication_table(overlapped["steps"][1]["schedule"], MEANINGS),
    ]
