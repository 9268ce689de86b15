"""Pictures of data parallelism, drawn from what a run recorded (notes 06, 14, 20).

The bucket timeline is the picture of DDP's overlap: one lane per recorded step, the events of the
step left to right in the order they happened. Compute runs (module forwards, parameter gradients,
folded by :func:`snippets.dp.overlap_timeline.timeline`) are blue / red boxes whose width grows with
how many modules or gradients they hold; each bucket collective is a yellow box named by its API and
bucket (``RS b0``: the reduce-scatter of bucket 0). A band under each lane says which part of the
step the events fall in (the schedule, ``finalize_model_grads``, ``optimizer.step``). Without
overlap the collectives sit after the compute; with it they move into the backward and the next
forward.

A lane is built from the same rows the note's timeline table prints (``[#, where, event, detail]``),
so the picture and the table cannot disagree: :func:`lane_events` parses those rows back, and the
tests compare it with the table.
"""

from __future__ import annotations

import re

from snippets.record.draw import Figure, text_width

SHORT = {
    "all_gather_into_tensor": "AG",
    "reduce_scatter_tensor": "RS",
    "all_reduce": "AR",
    "all_gather": "AG",
    "reduce_scatter": "RS",
}
SECTION_NAMES = {
    "schedule": "schedule（forward + backward）",
    "finalize_model_grads": "finalize_model_grads",
    "optimizer.step": "optimizer.step",
}
_COMPUTE = re.compile(r"^(forward|backward) 计算（(\d+) 个")
_COMM = re.compile(r"^\*\*(\w+)\*\*（([\w ]+)）$")
_BUCKET = re.compile(r"^bucket (\d+): ")


def lane_events(rows: list[list]) -> list[dict]:
    """The timeline rows ``[#, where, event, detail]`` as drawable events: ``kind`` (fwd / bwd /
    comm), ``section``, ``label`` (``F×9``, ``RS b0``), ``count`` (modules or gradients; 0 for a
    collective) and the row's ``detail`` (the hover text)."""
    events = []
    for _, section, event, detail in rows:
        compute = _COMPUTE.match(event)
        if compute:
            kind = "fwd" if compute.group(1) == "forward" else "bwd"
            count = int(compute.group(2))
            events.append(
                dict(
                    kind=kind,
                    section=section,
                    count=count,
                    label=f"{'F' if kind == 'fwd' else 'B'}×{count}",
                    detail=detail,
                )
            )
            continue
        comm = _COMM.match(event)
        if not comm:
            raise ValueError(f"not a timeline event: {event!r}")
        bucket = _BUCKET.match(detail)
        name = SHORT.get(comm.group(1), comm.group(1))
        events.append(
            dict(
                kind="comm",
                section=section,
                count=0,
                api=comm.group(1),
                phase=comm.group(2),
                label=f"{name} b{bucket.group(1)}" if bucket else name,
                detail=detail,
            )
        )
    return events


def order_namer(bucket_sizes: list[int]):
    """``bucket_of`` for :func:`snippets.dp.overlap_timeline.timeline` when bucket sizes repeat
    (note 14's nine buckets): a collective is named by the first bucket of its size not yet named,
    in buffer order -- DDP's buckets fire in that order, and a bucket collective moves the whole
    bucket. Anything of another size (a gradient norm's ``[1]``) gets None. One namer per step."""
    taken: set[int] = set()

    def bucket_of(collective):
        size = collective.after if collective.api.startswith("all_gather") else collective.before
        for i, n in enumerate(bucket_sizes):
            if i not in taken and f"[{n}]" == size:
                taken.add(i)
                return i
        return None

    return bucket_of


def _width(event: dict, per_unit: float, pad: float) -> float:
    label = text_width(event["label"], 12) + pad
    if event["kind"] == "comm":
        return max(40.0, label)
    return max(28.0, label, 14 + per_unit * event["count"])


# From roomy to tight: (px per module / gradient, padding around a label, gap between boxes).
_SPACINGS = [(2.5, 14, 4), (1.5, 8, 3), (1.0, 6, 2), (0.5, 4, 2)]


def draw_bucket_timeline(
    lanes: list[tuple[str, list[list]]], *, title: str, desc: str, max_width: float = 1100
) -> Figure:
    """One lane per ``(name, timeline rows)``; events left to right in the order they happened."""
    parsed = [(name, lane_events(rows)) for name, rows in lanes]
    left, lane_h, box_h = max(text_width(n, 12) for n, _ in parsed) + 20, 74, 30
    for per_unit, pad, gap in _SPACINGS:  # the roomiest spacing that fits, never a smaller font
        widest = max(sum(_width(e, per_unit, pad) + gap for e in ev) for _, ev in parsed)
        if left + widest + 10 <= max_width:
            break
    width = left + widest + 40  # room for the last part's name
    height = 40 + lane_h * len(parsed)
    fig = Figure(width, height, title=title, desc=desc)
    fig.legend(
        10, 14, [("fwd", "forward 计算"), ("bwd", "backward 计算"), ("comm", "collective（b0 = bucket 0）")]
    )
    for i, (name, events) in enumerate(parsed):
        y = 34 + lane_h * i
        fig.text(10, y + box_h / 2, name, bold=True)
        x = left
        spans: list[list] = []  # [section, x0, x1]
        with fig.group(name):
            for e in events:
                w = _width(e, per_unit, pad)
                fig.boxed(x, y, w, box_h, e["label"], e["kind"], tip=e["detail"])
                if spans and spans[-1][0] == e["section"]:
                    spans[-1][2] = x + w
                else:
                    spans.append([e["section"], x, x + w])
                x += w + gap
        placed_right = 0.0  # a part's name is centered under it, pushed right past its neighbour's
        for section, x0, x1 in spans:
            fig.line(x0, y + box_h + 6, x1, y + box_h + 6, "muted", width=2)
            full, short = SECTION_NAMES.get(section, section), section.split(".")[-1][:8]
            name_ = full if text_width(full, 11) <= x1 - x0 else short
            w = text_width(name_, 11)
            start = max((x0 + x1 - w) / 2, placed_right + 8)
            if start + w <= width - 4:
                fig.text(start, y + box_h + 18, name_, size=11, kind="muted")
                placed_right = start + w
    fig.check()
    return fig


def ddp_lanes(plain: dict, overlapped: dict) -> list[tuple[str, list[list]]]:
    """Note 14's lanes from rank 0's ``ddp_run`` results: the step without overlap, then both
    overlapped steps (buckets named in buffer order, :func:`order_namer`)."""
    from snippets.dp.overlap_timeline import timeline

    def rows(result, step):
        sizes = [bucket[3] for bucket in result["buckets"]]
        return timeline(result["steps"][step]["events"], order_namer(sizes))

    return [
        ("不 overlap", rows(plain, 0)),
        *[(f"overlap，第 {i + 1} 步", rows(overlapped, i)) for i in range(len(overlapped["steps"]))],
    ]


def draw_ddp_timeline(plain: dict, overlapped: dict) -> Figure:
    """Note 14: where each bucket's all-reduce fires, without overlap and in both overlapped steps."""
    lanes = ddp_lanes(plain, overlapped)
    n = len(overlapped["buckets"])
    return draw_bucket_timeline(
        lanes,
        title="DDP 的 bucket 何时 all-reduce（rank 0，DP=2）",
        desc=f"不 overlap 时整块 buffer 在 finalize_model_grads 里一次 all-reduce；overlap 时 {n} 个 bucket 各一次，"
        "第 1 步仍在 finalize 里，第 2 步起在 backward 中每凑齐一个 bucket 就发出。",
    )


def draw_overlap_timeline(
    result: dict,
    title: str = "overlap_grad_reduce / overlap_param_gather：bucket 的 RS、AG 何时发出（rank 0）",
) -> Figure:
    """Note 20: rank 0's last step without overlap and both overlapped steps (distributed optimizer:
    reduce-scatter and all-gather per bucket)."""
    from snippets.dp.overlap_timeline import bucket_namer, timeline

    sizes = result["buckets"]
    namer = (lambda: bucket_namer(sizes)) if len(set(sizes)) == len(sizes) else (lambda: order_namer(sizes))
    lanes = [
        (f"不 overlap，第 {len(result['plain'])} 步", timeline(result["plain"][-1], namer())),
        *[
            (f"overlap，第 {i + 1} 步", timeline(events, namer()))
            for i, events in enumerate(result["overlapped"])
        ],
    ]
    return draw_bucket_timeline(
        lanes,
        title=title,
        desc="不 overlap 时整块 reduce-scatter 在 finalize_model_grads、all-gather 在 optimizer.step 末尾；"
        "overlap 时每个 bucket 的 all-gather 移进下一次 forward，第 2 步起 reduce-scatter 移进 backward。",
    )
