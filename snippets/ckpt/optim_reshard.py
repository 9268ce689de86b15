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

What each rank runs is in :mod:`snippets.ckpt.optim_reshard_rank`; this module is the parent
side: the two launches, assembling, comparing, the rows of the tables.
"""

from __future__ import annotations

import math
import tempfile

import torch

from snippets.ckpt.optim_reshard_rank import (
    MICROBATCHES,
    SAVED_STEPS,
    build,
    error_line,
    load_rank,
    save_rank,
    train_step,
    use_local_writer_queue,
)
from snippets.ranks.launch import DEFAULT_TIMEOUT_S, run_ranks

# this module's names, and the rank side's that notes 07 and 21 call through it
__all__ = [
    "COLUMNS",
    "COMPARED",
    "SAVED_STEPS",
    "SHARDING_TYPES",
    "STATES",
    "assemble",
    "build",
    "compare",
    "error_line",
    "error_rows",
    "grid_name",
    "payload_as_n",
    "reshard_optimizer_state",
    "rows",
    "train_step",
    "use_local_writer_queue",
]

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
