"""Save the distributed optimizer's state at one parallel layout, load it at another, compare.

Notes 07 and 21 ask one question of ``megatron.core``: when a run restarts with a different TP or DP
size, does the optimizer state (Adam's ``exp_avg``, ``exp_avg_sq`` and the fp32 main weights) come
back as it was saved? :func:`reshard_optimizer_state` answers it with the real code: two
launches of CPU ranks sharing one temporary directory.

1. **save** (``save_grid``): a tiny bf16 ``GPTModel`` wrapped like the training entry does
   (``Float16Module`` -> ``DistributedDataParallel(use_distributed_optimizer=True)``), two Adam
   steps through the real schedule with ``finalize_model_grads``, then for every sharding type a
   ``dist_checkpointing.save`` of ``{"model": model.sharded_state_dict(), "optimizer":
   optimizer.sharded_state_dict(...)}`` -- the two entries ``generate_state_dict`` puts there in
   ``megatron/training/checkpointing.py`` -- into its own sub-directory.
2. **load** (``load_grid``): a fresh model and optimizer (other weights, a sentinel in every
   optimizer slot), ``dist_checkpointing.load`` of the sharded state dict this layout asks for,
   ``model.load_state_dict`` and ``optimizer.load_state_dict``.

Each rank returns the pieces it holds -- its slice of every weight, and of every main weight /
``exp_avg`` / ``exp_avg_sq`` the distributed optimizer gave it -- placed by the model's own
``ShardedTensor`` coordinates (``global_offset`` of the local weight, then the flat range inside
it that this DP rank owns). The parent assembles both runs into whole tensors
(:func:`assemble`) and compares them element by element; an element no rank holds stays NaN, so
a load that leaves anything untouched cannot pass.

Sharding types (``DistributedOptimizer.sharded_state_dict``, ``metadata["distrib_optim_sharding_type"]``):
``dp_reshardable`` (what the training entry saves by default), ``fully_reshardable``
(``--dist-ckpt-optim-fully-reshardable``), the deprecated ``dp_zero_gather_scatter`` and
``fully_sharded_model_space`` (Core's default when no type is given). An error is caught per type
and reported as its first line, so one call shows which types survive the change. Caveat: an error
raised on some ranks only (``dp_zero_gather_scatter`` checks sizes on DP rank 0 alone) leaves the
other ranks inside a collective; the launch then fails with ``RankError`` after ``timeout``.

Two steps here are not in the training entry, both because CPU torch has no Transformer Engine /
Apex Adam (see note 21): the fresh optimizer runs ``_init_optimizer_states_with_dummy_values``
before its state dict is asked for, and loading runs under ``torch.no_grad``.
"""

from __future__ import annotations

import math
import os
import tempfile

import torch

from snippets.ranks import rank_env
from snippets.ranks.launch import DEFAULT_TIMEOUT_S, run_ranks

SHARDING_TYPES = (
    "dp_reshardable",
    "fully_reshardable",
    "dp_zero_gather_scatter",
    "fully_sharded_model_space",
)
"""The sharding types ``DistributedOptimizer.sharded_state_dict`` accepts without Megatron FSDP."""

STATES = ("weights", "fp32_param", "exp_avg", "exp_avg_sq")
"""What is compared: the bf16 model weights, then the optimizer's fp32 main weights and Adam moments."""

COLUMNS = (
    "sharding_type",
    "save",
    "load",
    "loaded",
    "weights",
    "fp32_param",
    "exp_avg",
    "exp_avg_sq",
    "adam_step",
    "error",
)
"""The keys of one result, in the order a table shows them."""

COMPARED = ("sharding_type", "weights", "fp32_param", "exp_avg", "exp_avg_sq", "adam_step")
"""A narrower table: what came back equal (the layouts go in the title, errors in their own table)."""

VOCAB, SEQ, MBS, MICROBATCHES = 32, 8, 2, 4
SAVED_STEPS = 2
"""Adam steps the save run takes before saving."""


def grid_name(grid: dict) -> str:
    """``{"tp": 2, "dp": 1}`` -> ``"TP=2·DP=1"``."""
    return f"TP={grid.get('tp', 1)}·DP={grid.get('dp', 1)}"


def _world(grid: dict) -> int:
    unknown = set(grid) - {"tp", "dp"}
    if unknown:
        raise ValueError(f"grid takes tp and dp only (PP stays 1 here), got {sorted(unknown)}")
    tp, dp = grid.get("tp", 1), grid.get("dp", 1)
    if MICROBATCHES % dp:
        raise ValueError(f"dp={dp} must divide the {MICROBATCHES} micro-batches of the step")
    return tp * dp


# ------------------------------------------------------------------ rank side


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
    (distrib_optimizer.py:2001) and the other ranks wait for rank 0 in a scatter; when rank 0
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
    # one step count (distrib_optimizer.py:642); Megatron's own zero-gradient step provides it.
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


# ------------------------------------------------------------------ parent side


def assemble(per_rank_pieces: list[list[tuple]]) -> dict[str, dict[str, torch.Tensor]]:
    """``{state: {global key: whole tensor}}`` from every rank's pieces; unheld elements are NaN."""
    whole: dict[str, dict[str, torch.Tensor]] = {}
    for pieces in per_rank_pieces:
        for state, key, shape, where, start, stop, values in pieces:
            tensor = whole.setdefault(state, {}).setdefault(key, torch.full(shape, math.nan))
            block = tensor[tuple(slice(a, b) for a, b in where)]
            flat = block.reshape(-1).clone()
            flat[start:stop] = values
            block.copy_(flat.reshape(block.shape))
    return whole


def compare(saved: dict, loaded: dict) -> dict:
    """Per state: every element present in both and bitwise equal."""
    out = {}
    for state in STATES:
        a, b = saved.get(state, {}), loaded.get(state, {})
        out[state] = (
            a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)
        )  # NaN != NaN: gaps fail
    return out


def reshard_optimizer_state(
    save_grid: dict,
    load_grid: dict,
    sharding_types: tuple | list | str = ("dp_reshardable",),
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[dict]:
    """Train at ``save_grid``, save, load at ``load_grid``; one result per sharding type.

    ``save_grid`` / ``load_grid`` are dicts with ``tp`` and ``dp`` (default 1; world = tp·dp,
    PP = 1), e.g. ``dict(dp=2)`` -> ``dict(dp=1)``. ``sharding_types`` is one name or several
    of :data:`SHARDING_TYPES`. Each result is a flat dict with the keys of :data:`COLUMNS`:

    * ``sharding_type``, ``save``, ``load`` -- e.g. ``"dp_reshardable"``, ``"TP=1·DP=2"``, ``"TP=1·DP=1"``;
    * ``loaded`` -- the save and the load both ran without an error;
    * ``weights``, ``fp32_param``, ``exp_avg``, ``exp_avg_sq`` -- after the load, the whole
      tensor (gathered from all ranks) equals the saved one bitwise (``None`` if not loaded);
    * ``adam_step`` -- Adam's step counter after the load (:data:`SAVED_STEPS` if it came back),
      else ``None``;
    * ``error`` -- ``None``, or the first line of the save or load error;
    * ``save_calls``, ``load_calls`` -- the collectives rank 0 issued while saving / loading this
      type (``snippets.record.recorder`` records; ``recorder.communication_table`` prints them).

    The checkpoint directory is temporary and removed before returning.
    """
    if isinstance(sharding_types, str):
        sharding_types = (sharding_types,)
    sharding_types = tuple(sharding_types)
    save_world, load_world = _world(save_grid), _world(load_grid)
    with tempfile.TemporaryDirectory(prefix="optim-reshard-") as ckpt_root:
        saved = run_ranks(
            save_rank,
            save_world,
            ckpt_root,
            save_grid.get("tp", 1),
            sharding_types,
            grid=dict(tp=save_grid.get("tp", 1)),
            timeout=timeout,
        )
        save_errors = {t: e for r in saved for t, e in r["errors"].items()}
        to_load = tuple(t for t in sharding_types if t not in save_errors)
        loaded = (
            run_ranks(
                load_rank,
                load_world,
                ckpt_root,
                load_grid.get("tp", 1),
                to_load,
                grid=dict(tp=load_grid.get("tp", 1)),
                timeout=timeout,
            )
            if to_load
            else []
        )
    reference = assemble([r["pieces"] for r in saved])
    results = []
    for sharding_type in sharding_types:
        row = dict(
            sharding_type=sharding_type,
            save=grid_name(save_grid),
            load=grid_name(load_grid),
            loaded=False,
            **{s: None for s in STATES},
            adam_step=None,
            error=save_errors.get(sharding_type),
            save_calls=saved[0]["calls"][sharding_type],
            load_calls=loaded[0][sharding_type]["calls"] if sharding_type in to_load else [],
        )
        if row["error"] is None:
            per_rank = [r[sharding_type] for r in loaded]
            errors = [r["error"] for r in per_rank if "error" in r]
            if errors:
                row["error"] = errors[0]
            else:
                row.update(loaded=True, **compare(reference, assemble([r["pieces"] for r in per_rank])))
                steps = {r["adam_step"] for r in per_rank}
                row["adam_step"] = steps.pop() if len(steps) == 1 else -1
        results.append(row)
    return results


def payload_as_n(calls: list) -> list:
    """The recorded collectives with the lengths of pickled payloads written as ``n``.

    torch DCP coordinates a save or load by exchanging pickled Python objects (shard lists, write
    plans, write results) as byte tensors; their length changes from run to run (e.g. with the
    order in which writer processes finish), so a stored table must not show it. The one-element
    exchanges that announce those lengths, and every tensor outside ``dist_checkpointing``, keep
    their shapes.
    """
    import re
    from dataclasses import replace

    def hide(shape: str) -> str:
        return re.sub(r"\[(\d+)\]", lambda m: m[0] if m[1] == "1" else "[n]", shape)

    return [
        replace(c, before=hide(c.before), after=hide(c.after)) if "dist_checkpointing/" in c.where else c
        for c in calls
    ]


def rows(results: list[dict], columns=COLUMNS) -> list[list]:
    """The results as table rows, ``-`` for ``None``."""
    return [["-" if r[c] is None else r[c] for c in columns] for r in results]


def error_rows(results: list[dict]) -> list[list]:
    """``[sharding_type, error]`` for the results that failed."""
    return [[r["sharding_type"], r["error"]] for r in results if r["error"]]
