"""Note 06's experiment: one whole training step -- schedule, ``finalize_model_grads``,
``optimizer.step()`` -- of a real ``GPTModel`` in DDP with Megatron's Adam, at any size.

``train_step`` builds the model (:func:`snippets.experiments.n14_ddp.build_model`: every rank and one
process start from the same weights), wraps it in ``DistributedDataParallel`` and
``get_megatron_optimizer``, runs this DP rank's share of the global batch's micro-batches, then
records ``finalize_model_grads`` (the DP all-reduce) and ``optimizer.step()`` (the gradient norm,
clipping with ``clip_grad``, Adam) separately. Note 06 compares DP=2 with one process, with and
without clipping; ``python -m snippets.run train-step --dims qwen3-8b --layers 2`` on 8 ranks shows
the same step's communication at a real model's sizes. :func:`per_token_flag_with_two_values` runs
the schedule with a two-value ``loss_func`` once without and once with ``calculate_per_token_loss``
(note 06's pitfall: the flag turns the DP mean into a sum).
"""

from __future__ import annotations

from snippets.experiments.n13_pipeline import microbatches
from snippets.experiments.n14_ddp import build_model


def this_rank_microbatches(dims, device="cpu") -> list[dict]:
    """This DP rank's share of the global batch: ``dims.microbatches`` micro-batches, split evenly
    across the DP ranks in order (DP rank r of 2 takes 2r and 2r + 1 of 4)."""
    from megatron.core import parallel_state

    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    n = dims.microbatches // dp
    return microbatches(dims, dims.microbatches, device)[n * dp_rank : n * (dp_rank + 1)]


def train_step(dims, clip_grad, device="cpu", keep_tensors=True):
    """On every rank: one training step; what the optimizer is, where the gradients live, the
    recorded communication and -- with ``keep_tensors`` -- the gradients and weights before and
    after (by global name, comparable across any DP size)."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.models.tiny_gpt import by_global_name, forward_step
    from snippets.record import recorder

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model, config = build_model(dims, device)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, clip_grad=clip_grad), [ddp])
    mine = this_rank_microbatches(dims, device)
    n = len(mine)
    before = by_global_name([ddp], "param") if keep_tensors else None

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(mine),
        model=[ddp],
        num_microbatches=n,
        seq_length=dims.seq,
        micro_batch_size=dims.micro_batch_size,
    )
    local = by_global_name([ddp], "main_grad") if keep_tensors else None
    param = next(iter(ddp.parameters()))
    grad_none_before_step = param.grad is None
    with recorder.record() as in_finalize:
        finalize_model_grads([ddp])
    with recorder.record() as in_step:
        update_successful, grad_norm, num_zeros = optimizer.step()
    out = dict(
        loss=sum(report["lm loss"].item() for report in losses) / n,
        grad_norm=grad_norm,
        update_successful=update_successful,
        finalize=in_finalize,
        step=in_step,
        optimizer=type(optimizer).__name__,
        inner=[type(o).__name__ for o in optimizer.chained_optimizers],
        grad_none_before_step=grad_none_before_step,
        grad_is_main_grad_after_step=param.grad.data_ptr() == param.main_grad.data_ptr(),
        main_grad_in_buffer=param.main_grad.data_ptr() >= ddp.buffers[0].grad_data.data_ptr(),
    )
    if keep_tensors:
        out.update(
            clipped=by_global_name([ddp], "main_grad"),
            local=local,
            before=before,
            params=by_global_name([ddp], "param"),
        )
    return out


def per_token_flag_with_two_values(dims, device="cpu") -> dict:
    """On every rank: this DP rank's micro-batches through the schedule with the two-value
    ``loss_func`` of :mod:`snippets.models.tiny_gpt`, ``finalize_model_grads`` called by the schedule
    (as the training entry wires it), once with ``calculate_per_token_loss`` off and once on; the
    ``main_grad`` after each, by global name."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.models.tiny_gpt import by_global_name, forward_step

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    out = {}
    for per_token in (False, True):
        model, config = build_model(dims, device)
        config.calculate_per_token_loss = per_token  # read by DDP's constructor: 1/DP or 1
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
        config.finalize_model_grads_func = finalize_model_grads
        ddp.zero_grad_buffer()
        mine = this_rank_microbatches(dims, device)
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mine),
            model=[ddp],
            num_microbatches=len(mine),
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
        out[per_token] = by_global_name([ddp], "main_grad")
    return out


def run(dims, par) -> dict:
    """On every rank (the runner): one step without clipping, no tensors kept."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    return train_step(dims, clip_grad=0.0, device=par.device, keep_tensors=False)


MEANINGS = {"distributed/param_and_grad_buffer.py::start_grad_sync": "DP 梯度求和（先乘了 1/DP，和即平均）"}


def tables(results: list, dims, par) -> list:
    from snippets.record.recorder import communication_table

    r0 = results[0]
    return [
        f"optimizer: {r0['optimizer']} {r0['inner']}  update_successful: {r0['update_successful']}",
        f"backward 之后 param.grad is None: {r0['grad_none_before_step']}  main_grad 在 DDP 的 grad buffer 里: "
        f"{r0['main_grad_in_buffer']}  step 之后 param.grad 与 main_grad 同一块内存: "
        f"{r0['grad_is_main_grad_after_step']}",
        f"grad norm（每个 rank）: {[round(r['grad_norm'], 4) for r in results]}  "
        f"loss 平均: {round(sum(r['loss'] for r in results) / len(results), 4)}",
        "finalize_model_grads:",
        communication_table(r0["finalize"], MEANINGS),
        f"optimizer.step(): {len([c for c in r0['step'] if len(c.ranks) > 1])} 条跨 rank 的集合通信；全部记录：",
        communication_table(r0["step"]),
    ]
