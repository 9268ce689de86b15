"""Pictures of the distributed optimizer, drawn from what a run recorded (notes 15, 20).

The ZeRO-1 shard map lays DDP's (padded) buffer out left to right, one block of rows per DP rank:
the weights and the gradient buffer span the whole buffer on every rank (forward and backward need
all of it), but only the rank's own segment of the gradients is reduced, and the optimizer's state
(Adam's moments, and fp32 main weights when the model is 16-bit) exists only for the parameter
ranges inside that segment -- the gaps between them are padding. A second panel stacks the bytes
each rank holds, per parameter, from the note's memory table.

The boxes come from the rows the notes print: the shard table's ``gbuf_world`` ranges
(:func:`snippets.dp.grad_buffers.shard_rows`) and the memory table's byte counts.
"""

from __future__ import annotations

import re

from snippets.record.draw import Figure, text_width

_RANGE = re.compile(r"^\[(\d+), (\d+)\)$")


def owned_ranges(shard_rows: list[list]) -> list[tuple[str, int, int]]:
    """``(parameter, start, end)`` in the whole buffer for one rank's shard table rows
    (``[bucket, name, elements, gbuf_world, gbuf_local, param]``)."""
    out = []
    for row in shard_rows:
        start, end = map(int, _RANGE.match(row[3]).groups())
        out.append((row[1], start, end))
    return out


def draw_shard_map(
    shards_by_rank: list[list[list]],
    buffer_size: int,
    *,
    state_label: str = "Adam exp_avg / exp_avg_sq",
    width: float = 1060,
    title: str | None = None,
) -> Figure:
    """Note 15's ZeRO-1 map: which slice of weights, gradients and optimizer state each DP rank
    holds (``shards_by_rank``: each rank's shard table rows); ``title`` replaces the default one."""
    dp = len(shards_by_rank)
    segment = buffer_size // dp
    left, right = 200, width - 20
    scale = (right - left) / buffer_size
    x = lambda i: left + i * scale  # noqa: E731 - buffer index -> px
    row_h, gap, block = 22, 6, 3 * 22 + 2 * 6 + 30
    top = 58
    height = top + dp * block
    fig = Figure(
        width,
        height,
        title=title or f"ZeRO-1：DP={dp} 时每个 rank 持有什么",
        desc=f"buffer 共 {buffer_size} 个位置，rank r 拥有第 r 段（每段 {segment}）：权重与梯度 buffer "
        "每个 rank 都是整块，但只有本段的梯度被归约；优化器状态只为本段里的参数存在。",
    )
    fig.legend(
        10, 14, [("mem", "每个 rank 都存"), ("dp", "本 rank 独有的一段"), ("accent", "跨过分界线的参数")]
    )
    # the buffer's axis and the segment boundaries
    fig.text(left, 38, "0", size=11, kind="muted")
    fig.text(right, 38, str(buffer_size), size=11, kind="muted", anchor="end")
    for r in range(1, dp):
        fig.line(x(r * segment), top - 10, x(r * segment), top + dp * block - 24, "ink", dashed=True)
        fig.text(x(r * segment), 38, str(r * segment), size=11, anchor="middle")
    owned = [owned_ranges(rows) for rows in shards_by_rank]
    split = {
        name
        for ranges in owned
        for name in [n for n, *_ in ranges]
        if sum(n == name for rs in owned for n, *_ in rs) > 1
    }
    for r, ranges in enumerate(owned):
        y = top + r * block
        lo, hi = r * segment, (r + 1) * segment
        with fig.group(f"rank {r}"):
            fig.text(10, y + row_h / 2, f"rank {r}", bold=True)
            fig.text(70, y + row_h / 2, "权重", size=11)
            fig.boxed(
                x(0),
                y,
                x(buffer_size) - x(0),
                row_h,
                f"完整 {buffer_size}（all-gather 拼回）",
                "mem",
                size=11,
            )
            y2 = y + row_h + gap
            fig.text(70, y2 + row_h / 2, "梯度 buffer", size=11)
            fig.rect(x(0), y2, x(buffer_size) - x(0), row_h, "mem", faint=True)
            fig.boxed(
                x(lo),
                y2,
                x(hi) - x(lo),
                row_h,
                f"本段 [{lo}, {hi})：reduce-scatter 后是平均梯度",
                "dp",
                size=11,
            )
            y3 = y2 + row_h + gap
            fig.text(
                70,
                y3 + row_h / 2,
                state_label if text_width(state_label, 11) < 125 else "优化器状态",
                size=11,
            )
            for name, start, end in ranges:
                kind = "accent" if name in split else "dp"
                fig.rect(
                    x(start), y3, max(x(end) - x(start), 1), row_h, kind, rx=0, tip=f"{name} [{start}, {end})"
                )
            n = sum(end - start for _, start, end in ranges)
            fig.text(
                x(lo) + 4,
                y3 + row_h + 11,
                f"{len(ranges)} 个参数（的一段），{n} 个元素；空隙是补齐",
                size=11,
                kind="muted",
            )
    fig.check()
    return fig


def draw_bytes_per_parameter(memory_rows: list[list], *, width: float = 1060) -> Figure:
    """The memory table (``[run, rank, weights B, grads B, main weights B, optimizer state B,
    total B, bytes / param]``) as stacked bars: what each rank stores, and per parameter."""
    left, right = 200, width - 20
    bytes_top = 4
    height = 40 + 30 * len(memory_rows) + 4
    fig = Figure(
        width,
        height,
        title="每个 rank 存的字节：不分片 vs 分布式优化器",
        desc="权重与梯度 buffer 每个 rank 一整份；分布式优化器只把优化器状态（和 16 位模型的主权重）切成 DP 份。",
    )
    fig.text(10, bytes_top + 10, "每个 rank 存的字节（实测）", bold=True)
    biggest = max(row[6] for row in memory_rows)
    bscale = (right - 100 - left) / biggest
    parts = [(2, "权重", "mem"), (3, "梯度", "edp"), (4, "主权重", "fwd2"), (5, "Adam", "dp")]
    fig.legend(left, bytes_top + 10, [(k, n) for _, n, k in parts], size=11)
    for i, row in enumerate(memory_rows):
        y = bytes_top + 30 + 30 * i
        fig.text(10, y + 11, f"{row[0]}，rank {row[1]}", size=11)
        bx = left
        with fig.group(f"{row[0]} rank {row[1]}"):
            for col, name, kind in parts:
                w = row[col] * bscale
                if w > 0:
                    fig.rect(bx, y, w, 22, kind, rx=0, outline="grid", tip=f"{name} {row[col]} B")
                    if text_width(str(row[col]), 11) + 6 < w:
                        fig.text(bx + w / 2, y + 11, str(row[col]), size=11, anchor="middle")
                    bx += w
            fig.text(bx + 6, y + 11, f"{row[7]} B/参数", size=11, bold=True)
    fig.check()
    return fig
