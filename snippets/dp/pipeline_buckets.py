"""Note 14's main picture: where each pipeline stage's DDP bucket all-reduces start in a 1F1B step.

:func:`snippets.experiments.n14_ddp.pipeline_ddp_run` records, on every rank of a PP x DP grid, the
schedule's order of forwards and backwards and each bucket group's ``start_grad_sync`` call: in
which backward it came and how many of that backward's gradients were done by then. Here that is
put on note 13's logical clock (:func:`snippets.pp.timeline.logical_schedule`: one unit per layer
forward, two per layer backward) for the pipeline of DP rank 0, and drawn: one lane per stage, one
box per forward / backward, and a yellow tick where a bucket's all-reduce starts -- placed inside
its backward at the share of that backward's gradients done when it fired.
"""

from __future__ import annotations

from snippets.pp import timeline as pt
from snippets.record.draw import Figure, text_width

LEFT, TOP, LANE, BOX, UNIT = 64, 40, 40, 26, 22


def pipeline_of_dp_rank0(results: list[dict]) -> list[dict]:
    """The ranks of DP rank 0's pipeline, stage 0 first."""
    return sorted((r for r in results if r["ranks"]["dp"] == 0), key=lambda r: r["ranks"]["pp"])


def clock(results: list[dict], step: int, layers: int):
    """The recorded orders of DP rank 0's pipeline at ``step`` on the logical clock."""
    lanes = pipeline_of_dp_rank0(results)
    per_stage = layers // len(lanes)
    return pt.logical_schedule(
        [r["steps"][step]["ops"] for r in lanes], forward=per_stage, backward=2 * per_stage
    )


def starts(results: list[dict], step: int, layers: int) -> list[list[tuple]]:
    """Per stage: ``(time, microbatch, elements)`` of each bucket all-reduce the schedule started,
    the time inside its backward in proportion to the gradients that backward had done."""
    out = []
    for lane, row in zip(pipeline_of_dp_rank0(results), clock(results, step, layers)):
        backward = {op.microbatch: (start, end) for op, start, end in row if op.kind == "B"}
        ticks = []
        for sync in lane["steps"][step]["syncs"]:
            start, end = backward[sync["microbatch"]]
            ticks.append(
                (start + (end - start) * sync["done"] / sync["total"], sync["microbatch"], sync["numel"])
            )
        out.append(ticks)
    return out


def draw(results: list[dict], step: int, layers: int, *, title: str) -> Figure:
    """One lane per stage of DP rank 0's pipeline, the bucket all-reduce starts as ticks."""
    timeline = clock(results, step, layers)
    ticks = starts(results, step, layers)
    end = pt.makespan(timeline)
    notes = [
        f"{len(t)} 个 bucket，{'在最后一个 backward 里陆续发出' if len(t) > 1 else '最后一个 backward 算完时发出'}"
        for t in ticks
    ]
    right = LEFT + end * UNIT
    width = max(right + 16 + max(text_width(n, 12) for n in notes) + 8, text_width(title, 13) + 12)
    axis_y = TOP + len(timeline) * LANE + 10
    legend_y = axis_y + 26
    fig = Figure(
        width,
        legend_y + 16,
        title=title,
        desc=f"{len(timeline)} 个 stage 的 1F1B 时间线（逻辑时钟，共 {end} 格）；"
        "黄色竖线是一个 bucket 的 all-reduce 开始的位置。",
    )
    fig.text(4, 16, title, size=13, bold=True)
    for t in range(0, end + 1, 2):
        fig.line(LEFT + t * UNIT, TOP - 4, LEFT + t * UNIT, TOP + len(timeline) * LANE - 4, "light")
        if t % 6 == 0:
            fig.text(LEFT + t * UNIT, axis_y, str(t), size=11, anchor="middle", kind="muted")
    fig.text(4, axis_y, "时间", size=11, kind="muted")
    for stage, (row, lane_ticks, note) in enumerate(zip(timeline, ticks, notes)):
        y = TOP + stage * LANE
        with fig.group(f"stage {stage}"):
            fig.text(4, y + BOX / 2, f"stage {stage}", size=12)
            for op, start, stop in sorted(row, key=lambda t: t[1]):
                x, w = LEFT + start * UNIT, (stop - start) * UNIT
                kind = "fwd" if op.kind == "F" else "bwd"
                fig.boxed(x + 1, y, w - 2, BOX, str(op.microbatch), kind, tip=f"stage {stage} {pt.label(op)}")
            for time, microbatch, numel in lane_ticks:
                x = LEFT + time * UNIT
                with fig.group(tip=f"stage {stage}：B{microbatch} 里开始 all-reduce [{numel}]"):
                    fig.line(x, y - 5, x, y + BOX + 5, "comm", width=3)
            last = max(time for time, _, _ in lane_ticks)
            if end - last >= 2:  # the stage is idle after its all-reduce started: how long
                gap = f"还有 {end - last:g} 格"
                fig.line(LEFT + last * UNIT + 3, y + BOX / 2, right - 2, y + BOX / 2, "muted", dashed=True)
                fig.text(
                    (LEFT + last * UNIT + right) / 2,
                    y + BOX / 2 - 9,
                    gap,
                    size=11,
                    anchor="middle",
                    kind="muted",
                )
            fig.text(right + 16, y + BOX / 2, note, size=12)
    x = fig.legend(LEFT, legend_y, [("fwd", "forward"), ("bwd", "backward（框里是 micro-batch）")])
    fig.line(x, legend_y - 7, x, legend_y + 7, "comm", width=3)
    fig.text(x + 8, legend_y, "一个 bucket 的 all-reduce 开始")
    fig.check()
    return fig
