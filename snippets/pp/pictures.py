"""Note 13's pictures: a recorded pipeline schedule on its logical clock, with the p2p between stages.

:func:`draw_timeline` takes what :func:`snippets.pp.timeline.logical_schedule` made of the recorded
orders (one row per rank, ``(op, start, end)`` per forward / backward) and draws one lane per rank,
one box per op with its micro-batch number. Each box carries a hover title ``rank r F3`` (with
model chunks ``F3.1``): read left to right, a lane's titles are exactly the "recorded order" row of
the note's table, which is what the picture's test compares.

Between the lanes it draws the point-to-point messages the schedule's ``P2PCommunicator`` calls
carry: the activation a forward hands to the next (virtual) stage, and the gradient a backward
hands back to the previous one. An arrow goes from the end of the op that produced the tensor to
the start of the op that consumes it; with model chunks, the last rank's chunk 0 hands its
activation back to rank 0's chunk 1, so those arrows run up across the lanes.
"""

from __future__ import annotations

from snippets.pp import timeline as pt
from snippets.record.draw import Figure

LEFT, RIGHT, TOP, LANE, BOX = 64, 16, 40, 40, 26


def _kind(op, chunks: int) -> str:
    second = chunks > 1 and op.chunk >= 1
    return ("fwd2" if second else "fwd") if op.kind == "F" else ("bwd2" if second else "bwd")


def messages(timeline, chunks: int = 1) -> list[tuple]:
    """Every p2p message between (virtual) stages the timeline implies, as
    ``(kind, microbatch, from_rank, from_end, to_rank, to_start)``: ``F`` = an activation sent
    forward, ``B`` = a gradient sent back."""
    pp = len(timeline)
    last = pp * chunks - 1
    at = {}
    for rank, row in enumerate(timeline):
        for op, start, end in row:
            at[(op.kind, op.microbatch, op.chunk * pp + rank)] = (rank, start, end)
    out = []
    for (kind, mb, stage), (rank, _, end) in sorted(at.items(), key=lambda kv: (kv[1][2], kv[0])):
        nxt = stage + 1 if kind == "F" else stage - 1
        if 0 <= nxt <= last:
            to_rank, to_start, _ = at[(kind, mb, nxt)]
            out.append((kind, mb, rank, end, to_rank, to_start))
    return out


def lane_orders(timeline, chunks: int = 1) -> list[list]:
    """``[rank, "F0 F1 B0 ..."]`` per rank, the ops in the order the lane draws them."""
    return [
        [rank, " ".join(pt.label(op, chunks) for op, _, _ in sorted(row, key=lambda t: t[1]))]
        for rank, row in enumerate(timeline)
    ]


def draw_timeline(timeline, chunks: int = 1, *, title: str, unit: int = 22, p2p: bool = True) -> Figure:
    """One lane per rank on the logical clock, ``unit`` px per time unit; ``p2p`` adds the messages
    between stages as arrows (``comm``)."""
    end = pt.makespan(timeline)
    lanes = len(timeline)
    width = LEFT + end * unit + RIGHT
    axis_y = TOP + lanes * LANE + 10
    legend_y = axis_y + 28
    height = legend_y + (42 if p2p else 18)
    desc = (
        f"{lanes} 个 rank 的时间线（逻辑时钟，共 {end} 格）：每个方框是一次 forward 或 backward，"
        "框里是 micro-batch 编号；黄色箭头是相邻 stage 之间的 p2p 收发。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(4, 16, title, size=13, bold=True)
    step = 6 if end > 30 else 3
    for t in range(0, end + 1, 1):
        x = LEFT + t * unit
        fig.line(x, TOP - 4, x, TOP + lanes * LANE - 4, "grid" if t % step == 0 else "light")
        if t % step == 0:
            fig.text(x, axis_y, str(t), size=11, anchor="middle", kind="muted")
    fig.text(4, axis_y, "时间", size=11, kind="muted")
    for rank, row in enumerate(timeline):
        y = TOP + rank * LANE
        with fig.group(f"rank {rank}"):
            fig.text(4, y + BOX / 2, f"rank {rank}", size=12)
            for op, start, stop in sorted(row, key=lambda t: t[1]):
                x, w = LEFT + start * unit, (stop - start) * unit
                fig.boxed(
                    x + 1,
                    y,
                    w - 2,
                    BOX,
                    str(op.microbatch),
                    _kind(op, chunks),
                    tip=f"rank {rank} {pt.label(op, chunks)}",
                )
    if p2p:
        with fig.group("p2p"):
            for _, _, src, t_end, dst, t_start in messages(timeline, chunks):
                x1, x2 = LEFT + t_end * unit - 2, LEFT + t_start * unit + 3
                down = dst > src
                y1 = TOP + src * LANE + (BOX if down else 0)
                y2 = TOP + dst * LANE + (0 if down else BOX)
                fig.line(x1, y1, x2, y2, "comm", width=1.5, arrow=True)
    items = [("fwd", "forward"), ("bwd", "backward")]
    if chunks > 1:
        items = [
            ("fwd", "forward chunk 0"),
            ("fwd2", "forward chunk 1"),
            ("bwd", "backward chunk 0"),
            ("bwd2", "backward chunk 1"),
        ]
    fig.legend(LEFT, legend_y, items)
    if p2p:
        y = legend_y + 24
        fig.line(LEFT, y, LEFT + 22, y, "comm", width=1.5, arrow=True)
        fig.text(LEFT + 28, y, "p2p：forward 的激活发给下一 stage，backward 的梯度发回上一 stage")
    fig.check()
    return fig
