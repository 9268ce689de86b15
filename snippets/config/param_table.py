"""Every parameter of a tensor-parallel model: its shard on each rank, and the whole it came from
(note 04).

Megatron marks each parameter it splits with three attributes
(``tensor_parallel.layers.set_tensor_model_parallel_attributes``): ``tensor_model_parallel``
(split or replicated), ``partition_dim`` (which dimension) and ``partition_stride``.
:func:`param_rows` reads them on a rank, so a note can print what each rank holds without
assuming anything about the layer.

:func:`gather` goes the other way: from the shards of all ranks back to the full tensor. With
``use_cpu_initialization=True`` Megatron builds the full weight and hands rank ``r`` the chunks
``r, r + TP, r + 2·TP, ...`` of it, cut along ``partition_dim`` into ``TP · stride`` equal chunks
(stride 2 for SwiGLU's ``linear_fc1``, whose gate and up halves are split separately). ``gather``
puts those chunks back in order; ``tests/ranks/test_param_table.py`` checks it against a TP=1 model.
"""

from __future__ import annotations

import torch


def param_rows(model) -> list[dict]:
    """One dict per parameter of ``model`` on this rank, in ``named_parameters`` order."""
    rows = []
    for name, param in model.named_parameters():
        split = bool(getattr(param, "tensor_model_parallel", False))
        rows.append(
            dict(
                name=name,
                local_shape=tuple(param.shape),
                split=split,
                partition_dim=param.partition_dim if split else None,
                stride=getattr(param, "partition_stride", 1) if split else None,
                numel=param.numel(),
            )
        )
    return rows


def global_shape(row: dict, tp: int) -> tuple:
    """The shape of the whole parameter: the split dimension is ``tp`` times longer."""
    shape = list(row["local_shape"])
    if row["split"]:
        shape[row["partition_dim"]] *= tp
    return tuple(shape)


def gather(shards: list[torch.Tensor], dim: int, stride: int = 1) -> torch.Tensor:
    """The full tensor from the shards of TP ranks ``0..TP-1`` (inverse of the CPU-init split)."""
    tp = len(shards)
    pieces = [shard.chunk(stride, dim=dim) for shard in shards]  # pieces[rank][j] = chunk j*TP + rank
    return torch.cat([pieces[k % tp][k // tp] for k in range(tp * stride)], dim=dim)
