"""Read what ``megatron.core.dist_checkpointing`` sees and writes, as plain rows (note 07).

A ``sharded_state_dict`` maps each local state-dict key to a ``ShardedTensor`` (or a
``ShardedObject`` for non-tensor extra state). A ``ShardedTensor`` says where the local tensor sits
inside one *global* tensor: ``key`` (the global name), ``global_shape``, ``local_shape``,
``global_offset`` and ``replica_id``. :func:`sharded_rows` flattens those fields so a note can
print them per rank; :func:`saved_files` and :func:`stored_tensors` list what a ``torch_dist``
checkpoint directory holds, with paths relative to it (no temporary paths reach a notebook).
"""

from __future__ import annotations

import json
import os


def is_main_replica(replica_id) -> bool:
    """Whether this copy is the one that gets written: every replica index is 0."""
    ids = replica_id if isinstance(replica_id, tuple) else (replica_id,)
    return all(i == 0 for i in ids)


def sharded_rows(sharded_state_dict: dict) -> list[list]:
    """One row per entry: local key, global key, type, global / local shape, offset, replica_id."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    rows = []
    for local_key, sh in sharded_state_dict.items():
        if isinstance(sh, ShardedTensor):
            rows.append(
                [
                    local_key,
                    sh.key,
                    "ShardedTensor",
                    tuple(sh.global_shape),
                    tuple(sh.local_shape),
                    tuple(sh.global_offset),
                    sh.replica_id,
                ]
            )
        elif isinstance(sh, ShardedObject):
            rows.append(
                [
                    local_key,
                    sh.key,
                    "ShardedObject",
                    tuple(sh.global_shape),
                    "-",
                    tuple(sh.global_offset),
                    sh.replica_id,
                ]
            )
        else:
            rows.append([local_key, "-", type(sh).__name__, "-", "-", "-", "-"])
    return rows


def saved_files(ckpt_dir: str) -> list[str]:
    """Every file under ``ckpt_dir``, relative to it, sorted."""
    out = []
    for root, _, files in os.walk(ckpt_dir):
        for name in files:
            out.append(os.path.relpath(os.path.join(root, name), ckpt_dir))
    return sorted(out)


def metadata_json(ckpt_dir: str) -> dict:
    """The small JSON file that names the checkpoint's format (``sharded_backend`` etc.)."""
    with open(os.path.join(ckpt_dir, "metadata.json")) as f:
        return json.load(f)


def stored_tensors(ckpt_dir: str) -> dict[str, tuple]:
    """``{global key: global shape}`` of every tensor in the ``.metadata`` of a torch_dist save."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(ckpt_dir).read_metadata()
    return {
        k: tuple(v.size)
        for k, v in sorted(meta.state_dict_metadata.items())
        if isinstance(v, TensorStorageMetadata)
    }


def stored_chunks(ckpt_dir: str, key: str) -> list[tuple]:
    """The ``(offsets, sizes)`` of each chunk written for global tensor ``key``."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(ckpt_dir).read_metadata().state_dict_metadata[key]
    return sorted((tuple(c.offsets), tuple(c.sizes)) for c in meta.chunks)


def key_mismatches(load_result) -> tuple[int, int]:
    """``(missing, unexpected)`` key counts of a ``Module.load_state_dict`` result."""
    return len(load_result.missing_keys), len(load_result.unexpected_keys)
