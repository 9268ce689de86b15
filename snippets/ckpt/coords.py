"""Where each entry of a ``sharded_state_dict`` sits in its global tensor, and who writes it (note 21).

A ``ShardedTensor`` names a piece of one global tensor: ``key`` (the global name),
``global_shape``, ``global_offset`` (per axis, in elements), ``axis_fragmentations`` (how many
pieces each axis is cut into) and ``replica_id`` -- Megatron's ``(PP, TP, DP)`` triple, where a
non-zero element means "another rank holds the same piece and writes it". Only pieces whose
replica_id is all zeros are written.

:func:`coordinate_rows` flattens those fields for printing; :func:`written_pieces` checks, from
every rank's rows, that the written pieces tile each global tensor exactly once -- no gap, no
element written twice.
"""

from __future__ import annotations

import math


def _main_replica(replica_id) -> bool:
    ids = replica_id if isinstance(replica_id, tuple) else (replica_id,)
    return all(i == 0 for i in ids)


def coordinate_rows(sharded_state_dict: dict) -> list[dict]:
    """One dict per ``ShardedTensor`` / ``ShardedObject``: its key and coordinates, as plain data."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    rows = []
    for local_key, sh in sharded_state_dict.items():
        if isinstance(sh, ShardedTensor):
            rows.append(
                dict(
                    local_key=local_key,
                    key=sh.key,
                    kind="ShardedTensor",
                    global_shape=tuple(sh.global_shape),
                    local_shape=tuple(sh.local_shape),
                    global_offset=tuple(sh.global_offset),
                    axis_fragmentations=tuple(sh.axis_fragmentations or ()),
                    prepend_axis_num=sh.prepend_axis_num,
                    replica_id=sh.replica_id,
                )
            )
        elif isinstance(sh, ShardedObject):
            rows.append(
                dict(
                    local_key=local_key,
                    key=sh.key,
                    kind="ShardedObject",
                    global_shape=tuple(sh.global_shape),
                    local_shape=(),
                    global_offset=tuple(sh.global_offset),
                    axis_fragmentations=(),
                    prepend_axis_num=0,
                    replica_id=sh.replica_id,
                )
            )
    return rows


def written_pieces(rows_per_rank: list[list[dict]]) -> dict[str, tuple[int, bool]]:
    """``{global key: (pieces written, written pieces cover the tensor exactly once)}`` for tensors.

    Each written piece is a box in its global tensor; the boxes cover it exactly once when they
    lie inside it, no two overlap, and their volumes add up to the tensor's. Counted without
    materializing the global tensor, so a real model's entries are checked as cheaply as a tiny one's.
    """
    shapes: dict[str, tuple] = {}
    boxes: dict[str, list] = {}
    for rows in rows_per_rank:
        for row in rows:
            if row["kind"] != "ShardedTensor":
                continue
            shapes.setdefault(row["key"], tuple(row["global_shape"]))
            boxes.setdefault(row["key"], [])
            if not _main_replica(row["replica_id"]):
                continue
            n = row["prepend_axis_num"]
            sizes = (1,) * n + tuple(row["local_shape"])
            boxes[row["key"]].append(tuple(zip(row["global_offset"], sizes)))
    return {key: (len(boxes[key]), _tile_once(boxes[key], shapes[key])) for key in sorted(shapes)}


def _tile_once(boxes: list, shape: tuple) -> bool:
    inside = all(0 <= o and o + s <= dim for box in boxes for (o, s), dim in zip(box, shape))
    disjoint = all(
        any(a_o + a_s <= b_o or b_o + b_s <= a_o for (a_o, a_s), (b_o, b_s) in zip(a, b))
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
    )
    return inside and disjoint and sum(math.prod(s for _, s in box) for box in boxes) == math.prod(shape)
