"""What each CPU rank runs for :mod:`snippets.ckpt.optim_reshard`: build, train, save, load.

A tiny bf16 ``GPTModel`` wrapped like the training entry does (``Float16Module`` ->
``DistributedDataParallel(use_distributed_optimizer=True)`` -> ``DistributedOptimizer``), Adam steps
through the real schedule, and the ``dist_checkpointing`` save and load of its sharded state dict
for each sharding type. Each rank returns the pieces it holds, placed by the model's own
``ShardedTensor`` coordinates; the parent (``optim_reshard``) assembles and compares them.
"""

from __future__ import annotations

import os

import torch

from snippets.ranks import rank_env

VOCAB, SEQ, MBS, MICROBATCHES = 32, 8, 2, 4
SAVED_STEPS = 2
"""Adam steps the save run takes before saving."""


def build(tp: int, init: bool):
    """A bf16 tiny GPT at TP=``tp`` (DP = the rest), wrapped and optimized as the training entry does.

    Returns ``(model, ddp, optimizer)``: the bare ``GPTModel`` (whose ``sharded_state_dict`` the
    checkpoint uses), the DDP wrapper, and the ``ChainedOptimizer`` around one ``DistributedOptimizer``.
    ``init=True`` sets weights from their global names (``tiny_gpt.init_by_global_name``), so the
    save run is reproducible; the load run keeps Megatron's random init, which differs.
    """
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1 if init else 2)
    config = tiny_config(
        tensor_model_parallel_size=tp,
        num_layers=2,
        num_attention_heads=4,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
    )
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    if init:
        init_by_global_name(model)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
        Float16Module(config, model),
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, clip_grad=0.0, use_distributed_optimizer=True),
        [ddp],
    )
    config.no_sync_func = ddp.no_sync
    return model, ddp, optimizer


def train_step(ddp, optimizer) -> bool:
    """One real step: this DP rank's micro-batches through the schedule, grad sync, Adam."""
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.models.tiny_gpt import forward_step, microbatches

    dp, rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    per_rank = MICROBATCHES // dp
    mine = microbatches(MICROBATCHES)[rank * per_rank : (rank + 1) * per_rank]
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(mine),
        model=[ddp],
        num_microbatches=per_rank,
        seq_length=SEQ,
        micro_batch_size=MBS,
    )
    finalize_model_grads([ddp])
    ok, _, _ = optimizer.step()
    return ok


def checkpoint_state_dict(model, optimizer, sharding_type: str, is_loading: bool = False) -> dict:
    """The ``model`` and ``optimizer`` entries of ``generate_state_dict`` for one sharding type."""
    state_dict = {"model": model.sharded_state_dict()}
    state_dict["optimizer"] = optimizer.sharded_state_dict(
        state_dict,
        is_loading=is_loading,
        metadata={"distrib_optim_sharding_type": sharding_type, "chained_optim_avoid_prefix": True},
    )
    return state_dict


def held_pieces(model, optimizer) -> list[tuple]:
    """Every value this rank holds, with where it sits in the global tensor.

    One tuple per (state, parameter): ``(state, global key, global shape, global slice, flat
    start, flat stop, values)``. For ``weights`` the flat range is the whole local weight; for the
    optimizer states it is the part of the flattened local weight this DP rank owns.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    inner = optimizer.chained_optimizers[0]
    pieces = []
    for sh in model.sharded_state_dict().values():
        if not isinstance(sh, ShardedTensor):
            continue  # _extra_state objects carry no numbers
        where = tuple((o, o + 1) for o in sh.global_offset[: sh.prepend_axis_num]) + tuple(
            (o, o + n) for o, n in zip(sh.global_offset[sh.prepend_axis_num :], sh.local_shape)
        )
        param = sh.data
        pieces.append(
            (
                "weights",
                sh.key,
                tuple(sh.global_shape),
                where,
                0,
                param.numel(),
                param.detach().float().reshape(-1).clone(),
            )
        )
        if param not in inner.model_param_group_index_map:
            continue
        owned = inner._get_model_param_range_map(param)["param"]
        states = inner._get_main_param_and_optimizer_states(param)
        for name, key in (("fp32_param", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            pieces.append(
                (
                    name,
                    sh.key,
                    tuple(sh.global_shape),
                    where,
                    owned.start,
                    owned.end,
                    states[key].detach().float().reshape(-1).clone(),
                )
            )
    return pieces


def adam_step(optimizer) -> int:
    """Adam's step counter as torch's Adam keeps it (one value for every parameter)."""
    inner = optimizer.chained_optimizers[0].optimizer
    steps = {int(s["step"].item()) for s in inner.state.values() if "step" in s}
    return steps.pop() if len(steps) == 1 else -1


def _fill_with_sentinel(model, optimizer) -> None:
    # Anything a load does not overwrite must show up: zeros in the weights, -7 in every optimizer slot.
    inner = optimizer.chained_optimizers[0]
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
            if param in inner.model_param_group_index_map:
                for value in inner._get_main_param_and_optimizer_states(param).values():
                    if value.dim() > 0:
                        value.fill_(-7.0)


def _dp_zero_sizes_agree(optimizer, loaded: dict) -> bool:
    """Whether a ``dp_zero_gather_scatter`` state fits this layout, decided on every rank.

    Megatron compares the checkpoint's buffer size with the current one on DP rank 0 only
    (distrib_optimizer.py:2290) and the other ranks wait for rank 0 in a scatter; when rank 0
    raises, they would wait forever. Rank 0 shares the saved sizes first. On a mismatch DP rank 0
    still calls ``load_state_dict`` (to raise Megatron's own error), the others stop here.
    """
    import torch.distributed as dist

    inner = optimizer.chained_optimizers[0]
    group = inner.data_parallel_group_gloo
    param_state = loaded["optimizer"]["param_state"]
    saved = (
        [
            param_state[i][dtype]["numel_unpadded"]
            for i, maps in enumerate(inner.gbuf_ranges)
            for dtype in maps
        ]
        if group.rank() == 0
        else None
    )
    box = [saved]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    if box[0] == [b.numel_unpadded for b in inner.buffers] or group.rank() == 0:
        return True
    raise RuntimeError(f"DP rank 0 rejected the saved buffer sizes {box[0]}")


def error_line(exc: BaseException) -> str:
    """``"Type: first line"`` of an error; for torch DCP's wrapper, of the rank error inside it."""
    failures = getattr(exc, "failures", None)  # torch.distributed.checkpoint.CheckpointException
    if failures:
        exc = next(iter(failures.values()))
        if isinstance(exc, tuple):  # (exception, its stack summary)
            exc = exc[0]
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def _reraise_interrupts(exc: BaseException) -> None:
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc


# Every CPU rank now gets the local queue in rank_env.init_rank; kept under this name for note 21.
use_local_writer_queue = rank_env.use_local_writer_queue


def _freeze_imported_objects() -> None:
    # DistributedOptimizer.sharded_state_dict runs gc.collect() after the fully_reshardable and
    # dp_zero_gather_scatter gathers. In a process that imported torch and megatron that full
    # collection walks every module object (~0.5 s each time here); frozen objects are skipped.
    import gc

    gc.freeze()


def save_rank(ckpt_root: str, tp: int, sharding_types: tuple) -> dict:
    """Rank body of the save run: train one step, save once per sharding type (collectives recorded)."""
    from megatron.core import dist_checkpointing

    from snippets.record import recorder

    use_local_writer_queue()
    _freeze_imported_objects()
    model, ddp, optimizer = build(tp, init=True)
    # Two steps: the saved step count (2) then differs from the 1 a fresh optimizer's dummy step leaves.
    ok = all([train_step(ddp, optimizer) for _ in range(SAVED_STEPS)])
    errors, calls = {}, {}
    for sharding_type in sharding_types:
        ckpt_dir = os.path.join(ckpt_root, sharding_type)
        os.makedirs(ckpt_dir, exist_ok=True)  # save() wants the directory to exist
        with recorder.record() as calls[sharding_type]:
            try:
                state_dict = checkpoint_state_dict(model, optimizer, sharding_type)
                dist_checkpointing.save(state_dict, ckpt_dir)
            except BaseException as exc:  # noqa: BLE001 - torch DCP's CheckpointException is a BaseException
                _reraise_interrupts(exc)
                errors[sharding_type] = error_line(exc)
    return dict(
        step_ok=ok,
        pieces=held_pieces(model, optimizer),
        errors=errors,
        calls=calls,
        adam_step=adam_step(optimizer),
    )


def load_rank(ckpt_root: str, tp: int, sharding_types: tuple) -> dict:
    """Rank body of the load run: for each sharding type, load into a wiped model and optimizer."""
    from megatron.core import dist_checkpointing

    from snippets.record import recorder

    _freeze_imported_objects()
    model, ddp, optimizer = build(tp, init=False)
    # torch's Adam has no state before its first step, and DistributedOptimizer.state_dict needs
    # one step count (distrib_optimizer.py:839); Megatron's own zero-gradient step provides it.
    optimizer.chained_optimizers[0]._init_optimizer_states_with_dummy_values()
    out = {}
    for sharding_type in sharding_types:
        _fill_with_sentinel(model, optimizer)
        with recorder.record() as calls:
            try:
                state_dict = checkpoint_state_dict(model, optimizer, sharding_type, is_loading=True)
                loaded = dist_checkpointing.load(state_dict, os.path.join(ckpt_root, sharding_type))
                with torch.no_grad():  # the dp_reshardable loader copies into views of leaves
                    model.load_state_dict(loaded["model"])
                    if sharding_type != "dp_zero_gather_scatter" or _dp_zero_sizes_agree(optimizer, loaded):
                        optimizer.load_state_dict(loaded["optimizer"])
                out[sharding_type] = dict(
                    pieces=held_pieces(model, optimizer), adam_step=adam_step(optimizer)
                )
            except BaseException as exc:  # noqa: BLE001 - torch DCP's CheckpointException is a BaseException
                _reraise_interrupts(exc)
                out[sharding_type] = dict(error=error_line(exc))
        out[sharding_type]["calls"] = calls
    return out
