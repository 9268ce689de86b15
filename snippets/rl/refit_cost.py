"""How much a refit moves, and how long the wire needs for it (a lower bound).

After every policy update the rollout engine needs the new weights. This module counts the
bytes and divides by a link bandwidth:

* :func:`model_bytes` -- parameters x bytes per parameter (bf16 = 2);
* three ways a GPU can end up with its rollout weights, per GPU:

  - ``slice``     -- it receives only its own rollout shard, ``model / rollout GPUs``
    (what Megatron's resharding planner sends; seed 000's "2 GB per GPU on 8 GPUs");
  - ``gather``    -- it first gathers every full tensor from the ``shards`` training ranks that
    hold pieces of it, receiving ``model x (1 - 1/shards)``, and the engine keeps its slice
    (verl's colocated path: FSDP ``full_tensor()`` or Megatron TP all-gather + PP broadcast);
  - ``broadcast`` -- the whole model is broadcast to it from the trainer (verl's separate,
    fully-async path; NeMo RL non-colocated vLLM).

* :func:`seconds` -- bytes / bandwidth of :data:`LINKS`. Only the wire: no latency, no
  protocol overhead, no overlap, no kernel time, so real refits take longer.

:func:`cached_plan` finds the plan a refit built and cached on this rank, :func:`plan_ops` turns
one rank's real :class:`megatron.core.resharding.ReshardPlan` into plain records and
:func:`plan_traffic` sums every rank's records into bytes per (sender, receiver), so the note can
compare the planner's traffic with the formula.

Units are decimal: 1 GB = 1e9 bytes, as in seed 000 ("8B bf16 = 16 GB").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # one direction, per GPU
    basis: str  # where the number comes from


LINKS = {
    # Seed 000's "2 GB: NVLink ~4.4 ms, IB ~40 ms" is 2 GB at these two per-GPU bandwidths.
    "nvlink": Link("NVLink", 450e9, "H100 NVLink 4: 900 GB/s per GPU in both directions, 450 GB/s each way"),
    "ib": Link("InfiniBand", 50e9, "NDR 400 Gb/s, one NIC per GPU: 400 / 8 = 50 GB/s each way"),
}

STRATEGIES = ("slice", "gather", "broadcast")


def model_bytes(params: float, dtype: str = "bf16") -> float:
    """Bytes of one full copy of the weights."""
    return params * DTYPE_BYTES[dtype]


def bytes_per_gpu(
    params: float, strategy: str = "slice", *, gpus: int = 8, shards: int = 1, dtype: str = "bf16"
) -> float:
    """Bytes one GPU receives in one refit under ``strategy`` (see the module docstring).

    ``gpus`` is the number of GPUs one rollout copy of the model is sliced over (``slice``);
    ``shards`` the number of training ranks each tensor is split across (``gather``).
    """
    total = model_bytes(params, dtype)
    if strategy == "slice":
        return total / gpus
    if strategy == "gather":
        return total * (1 - 1 / shards)
    if strategy == "broadcast":
        return total
    raise ValueError(f"unknown strategy {strategy!r}; one of {STRATEGIES}")


def seconds(nbytes: float, link: str) -> float:
    """Time on the wire for ``nbytes`` over one GPU's link (a lower bound)."""
    return nbytes / LINKS[link].bytes_per_s


def refit_rows(params: float, gpus: int = 8, dtype: str = "bf16") -> list[list]:
    """Seed 000's numbers for any model: total, per GPU (slice), NVLink and IB milliseconds."""
    per_gpu = bytes_per_gpu(params, "slice", gpus=gpus, dtype=dtype)
    return [
        [
            f"{params / 1e9:g}B",
            dtype,
            round(model_bytes(params, dtype) / GB, 2),
            gpus,
            round(per_gpu / GB, 3),
            round(seconds(per_gpu, "nvlink") * 1e3, 2),
            round(seconds(per_gpu, "ib") * 1e3, 1),
        ]
    ]


REFIT_HEADERS = ["model", "dtype", "total (GB)", "GPUs", "per GPU (GB)", "NVLink (ms)", "IB (ms)"]


_SIZE = re.compile(r"(?<![0-9.xX])(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")


def params_from_name(name: str) -> float | None:
    """The nominal size a model path names, e.g. ``Qwen/Qwen2.5-7B-Instruct`` -> 7e9.

    Nominal: "7B" is what the name says (Qwen2.5-7B really has 7.6e9 parameters). Mixture-of-
    experts names like ``30B-A3B`` give the total (30e9), which is what a refit moves; names like
    ``8x7B`` do not state the total and give ``None``.
    """
    last = name.rstrip("/").split("/")[-1]
    found = _SIZE.findall(last)
    return float(found[0]) * 1e9 if found else None


# ----------------------------------------------------------------------------- real plans


def cached_plan(src_model, dst_model, group=None, src_rank_offset: int = 0, dst_rank_offset: int = 0):
    """The :class:`ReshardPlan` that ``swap_model_weights(src_model, dst_model, ...)`` built and
    cached on this rank (call after it, with the same arguments).

    0.19.0 caches plans in ``refit.py``'s module-level ``_plan_cache``, keyed by this rank, both
    models' parallel sizes, the offsets and the destination pool; ``_build_or_get_plan`` is the
    lookup ``swap_model_weights`` itself makes, so the second call only reads the cache (no
    collective). 0.16.1 kept the plan on the target model (``_cached_reshard_plan``)."""
    from megatron.core.resharding import refit

    src_core, dst_core, num_experts = refit._unwrap_model_cores(src_model, dst_model)
    key = refit._build_plan_cache_key(
        src_core, dst_core, num_experts, group, src_rank_offset, dst_rank_offset
    )
    if key not in refit._plan_cache:
        raise LookupError("no cached reshard plan for these models: run swap_model_weights first")
    return refit._build_or_get_plan(src_core, dst_core, num_experts, group, src_rank_offset, dst_rank_offset)


def plan_ops(plan, src_module, dst_module) -> list[dict]:
    """One rank's :class:`ReshardPlan` as plain records (call on the rank that owns the plan).

    Each record: ``kind`` (send/recv), ``param`` (this rank's name), ``peer``, ``slice`` and
    ``shape`` of the piece, its ``bytes``, and the ``task`` id the planner gave the matching
    send/recv pair (so a send on one rank can be paired with its recv on another). Names are
    those of the parameters and persistent buffers a refit moves (``named_refit_tensors``).
    """
    from megatron.core.resharding.utils import named_refit_tensors

    src = dict(named_refit_tensors(src_module))
    dst = dict(named_refit_tensors(dst_module))
    records = []
    for kind, ops, params in (("send", plan.send_ops, src), ("recv", plan.recv_ops, dst)):
        for op in ops:
            piece = params[op.param_name].data[op.my_slice]
            records.append(
                dict(
                    kind=kind,
                    param=op.param_name,
                    peer=op.peer_rank,
                    slice=_slices(op.my_slice),
                    shape=tuple(piece.shape),
                    bytes=piece.numel() * piece.element_size(),
                    task=op.task_id,
                )
            )
    return records


def _slices(slices) -> str:
    def one(s):
        if s.start is None and s.stop is None:
            return ":"
        return f"{s.start}:{s.stop}"

    return "[" + ", ".join(one(s) for s in slices) + "]"


def plan_traffic(ops_by_rank: list[list[dict]]) -> list[list[int]]:
    """Bytes matrix ``m[src][dst]`` from every rank's :func:`plan_ops` (diagonal = local copy).

    Built from the receive side, which names every byte that lands on a rank exactly once.
    """
    n = len(ops_by_rank)
    matrix = [[0] * n for _ in range(n)]
    for dst, ops in enumerate(ops_by_rank):
        for op in ops:
            if op["kind"] == "recv":
                matrix[op["peer"]][dst] += op["bytes"]
    return matrix
