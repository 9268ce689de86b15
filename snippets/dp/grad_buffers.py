"""DDP's contiguous gradient buffer, its buckets, and the distributed optimizer's shards -- read
from the real objects, plus a short re-implementation of the layout to check them against.

``DistributedDataParallel`` (``distributed/param_and_grad_buffer.py``) lays every parameter of one
(param dtype, grad dtype) pair into one flat buffer, **last parameter first** (roughly the order
backward produces gradients), and cuts it into buckets: a bucket closes once it holds at least
``bucket_size`` elements. Each parameter's ``main_grad`` is a view into that buffer. With the
distributed optimizer two paddings are added -- each parameter starts at a multiple of 64
elements, each bucket ends at a multiple of lcm(DP, 128) -- so every bucket splits into DP equal
shards; DP rank r owns shard r of every bucket (``DistributedOptimizer._build_model_gbuf_range``).

:func:`layout` recomputes all of that from parameter sizes alone; a test compares it with what
Megatron built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _names(ddp) -> dict:
    # Tables on the site are narrow: drop the "decoder." every transformer parameter starts with.
    return {param: name.removeprefix("decoder.") for name, param in ddp.module.named_parameters()}


def buffer_dtypes(ddp) -> list[str]:
    """``param dtype / grad dtype`` of each buffer (one buffer per pair)."""
    return [
        f"{str(b.param_dtype).removeprefix('torch.')} / {str(b.grad_dtype).removeprefix('torch.')}"
        for b in ddp.buffers
    ]


def bucket_rows(ddp) -> list[list]:
    """One row per bucket: bucket id, offset in its buffer, elements (real, padded), and the
    parameters in it in buffer order (names without the leading ``decoder.``)."""
    names = _names(ddp)
    rows = []
    for buffer in ddp.buffers:
        for bucket in buffer.buckets:
            params = sorted(bucket.params_list, key=lambda p: buffer.param_index_map[p][0])
            rows.append(
                [
                    bucket.bucket_id,
                    bucket.offset,
                    bucket.numel_unpadded,
                    bucket.grad_data.numel(),
                    ", ".join(names[p] for p in params),
                ]
            )
    return rows


def param_rows(ddp) -> list[list]:
    """One row per parameter: its [start, end) in the buffer and its bucket, in buffer order."""
    names = _names(ddp)
    rows = []
    for buffer in ddp.buffers:
        for param, (start, end, bucket) in sorted(buffer.param_index_map.items(), key=lambda kv: kv[1][0]):
            rows.append([names[param], tuple(param.shape), start, end, bucket])
    return rows


def main_grads_are_views(ddp) -> bool:
    """Is every parameter's ``main_grad`` a slice of its buffer's single ``grad_data`` storage?"""
    for buffer in ddp.buffers:
        base = buffer.grad_data.untyped_storage().data_ptr()
        for param in buffer.params:
            if param.main_grad.untyped_storage().data_ptr() != base:
                return False
    return True


def shard_rows(optimizer, ddp) -> list[list]:
    """The distributed optimizer's view on this rank: for each parameter it owns (a piece of), its
    bucket, name, size, and the piece's range in the whole buffer (``gbuf_world``), in this rank's
    shard (``gbuf_local``) and inside the parameter itself (``param``)."""
    names = _names(ddp)
    rows = []
    for gbuf_range in optimizer.gbuf_ranges:
        for buckets in gbuf_range.values():
            for bucket_id, bucket_range in enumerate(buckets):
                for param, ranges in bucket_range["param_map"].items():
                    rows.append(
                        (
                            ranges["gbuf_world"].start,
                            [
                                bucket_id,
                                names[param],
                                param.numel(),
                                _span(ranges["gbuf_world"]),
                                _span(ranges["gbuf_local"]),
                                _span(ranges["param"]),
                            ],
                        )
                    )
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _span(r) -> str:
    return f"[{r.start}, {r.end})"


# ------------------------------------------------------------------ the layout, re-implemented


@dataclass
class Layout:
    param_ranges: list[tuple[int, int, int]]  # per parameter in model order: (start, end, bucket)
    buckets: list[tuple[int, int]]  # per bucket: (start, end) in the buffer, padded
    numel: int  # buffer size, padded

    def shards(self, dp: int) -> list[list[tuple[int, int]]]:
        """Per bucket, each DP rank's [start, end) of it (the distributed optimizer's split)."""
        return [
            [(s + r * (e - s) // dp, s + (r + 1) * (e - s) // dp) for r in range(dp)] for s, e in self.buckets
        ]


def layout(
    sizes: list[int], bucket_size: int | None, dp: int = 1, distributed_optimizer: bool = False
) -> Layout:
    """Where each parameter (``sizes`` in model order) lands in DDP's buffer, and the buckets.

    Parameters go in reverse order. A bucket closes when it holds ``bucket_size`` elements or more
    (``None``: one bucket). With the distributed optimizer, parameter starts are padded to 64 and
    bucket ends to lcm(dp, 128), so each bucket divides into dp equal shards.
    """
    pad = lambda n, k: -(-n // k) * k  # noqa: E731 - round n up to a multiple of k
    bucket_end = (lambda n: pad(n, math.lcm(dp, 128))) if distributed_optimizer else (lambda n: n)
    param_start = (lambda n: pad(n, 64)) if distributed_optimizer else (lambda n: n)

    ranges: dict[int, tuple[int, int, int]] = {}
    buckets: list[tuple[int, int]] = []
    bucket_start, cursor, open_bucket = 0, 0, False
    for i in reversed(range(len(sizes))):
        start = param_start(cursor)
        end = start + sizes[i]
        ranges[i] = (start, end, len(buckets))
        open_bucket = True
        if bucket_size is not None and end - bucket_start >= bucket_size:
            cursor = bucket_end(end)
            buckets.append((bucket_start, cursor))
            bucket_start, open_bucket = cursor, False
        else:
            cursor = end
    if open_bucket:
        buckets.append((bucket_start, bucket_end(cursor)))
    return Layout([ranges[i] for i in range(len(sizes))], buckets, buckets[-1][1])
