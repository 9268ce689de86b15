"""Pictures of note 24 (model-parallel RNG and recompute), drawn from the rows its tables print.

* :func:`draw_dropout_masks`: each rank's dropout keep-mask drawn outside ``fork()`` (the default
  generator: one pattern on every rank) and inside it (the TP stream: one pattern per TP rank).
* :func:`draw_saved_bytes`: the activation bytes autograd holds after forward, and what a recompute
  saves again during backward, per way of running the layer.

Every strip or bar carries a hover title naming its data (a mask as ``1``/``0``, a byte count); the
tests read those titles back and compare them with the table rows.
"""

from __future__ import annotations

from snippets.record.draw import Figure
from snippets.tp.pictures import rank_kind


def mask_string(mask: list[bool]) -> str:
    """A keep-mask as the picture's title writes it: ``1`` kept, ``0`` dropped."""
    return "".join("1" if kept else "0" for kept in mask)


def draw_dropout_masks(rows: list[dict], title: str | None = None) -> Figure:
    """``rows`` per rank: ``rank``, ``tp_rank``, ``inside``, ``outside`` (keep-masks, as
    :func:`snippets.experiments.n24_rng.seeds_and_masks` returns them); ``title`` what the note
    concludes from them (a plain description by default)."""
    n = len(rows[0]["inside"])
    cell, gap, label_w, strip_gap = 16, 2, 150, 44
    strip_w = n * (cell + gap) - gap
    x_out = 20 + label_w
    x_in = x_out + strip_w + strip_gap
    top, row_h = 64, 30
    width = x_in + strip_w + 20
    height = top + len(rows) * row_h + 46
    fig = Figure(
        width,
        height,
        title=title or "每个 rank 的 dropout mask：fork() 外与 fork() 里",
        desc="fork() 外的 mask 在所有 rank 上是同一个图样；fork() 里的 mask 只在同一 TP rank 上相同，"
        "不同 TP rank 各不相同。",
    )
    fig.text(x_out + strip_w / 2, 22, "fork() 外（默认生成器）", anchor="middle", bold=True)
    fig.text(x_in + strip_w / 2, 22, "fork() 里（model-parallel-rng）", anchor="middle", bold=True)
    fig.text(x_out + strip_w / 2, 44, "TP 区域外：各 rank 持有同一份激活", anchor="middle", kind="muted")
    fig.text(x_in + strip_w / 2, 44, "TP 区域里：各 rank 持有不同的切片", anchor="middle", kind="muted")
    for i, r in enumerate(rows):
        y = top + i * row_h
        fig.text(20, y + cell / 2, f"rank {r['rank']}（TP rank {r['tp_rank']}）", size=12)
        for x0, where, kind in ((x_out, "outside", "dp"), (x_in, "inside", rank_kind(r["tp_rank"]))):
            mask = r[where]
            with fig.group(f"rank{r['rank']} {where}", tip=f"rank {r['rank']} {where}: {mask_string(mask)}"):
                for j, kept in enumerate(mask):
                    x = x0 + j * (cell + gap)
                    if kept:
                        fig.rect(x, y, cell, cell, kind, rx=2)
                    else:
                        fig.rect(x, y, cell, cell, "light", rx=2, outline="grid")
    y = height - 22
    x = fig.legend(20, y, [("dp", "保留（fork() 外）"), ("tp", "保留（TP rank 0 的流）")])
    x = fig.legend(x, y, [(rank_kind(1), "保留（TP rank 1 的流）")])
    fig.rect(x, y - 6, 12, 12, "light", rx=2, outline="grid")
    fig.text(x + 17, y, "丢弃")
    fig.check()
    return fig


def draw_saved_bytes(rows: list[list], title: str | None = None) -> Figure:
    """``rows`` as the recompute table prints them: ``[mode, bytes after forward, bytes the
    recompute saves in backward, ...]``; a byte count that is not a number (not measured) gets no bar.
    ``title``: what the note concludes (a plain description by default)."""
    bar_h, gap, label_w = 18, 8, 310
    scale_max = max(v for r in rows for v in r[1:3] if isinstance(v, int))
    plot_w = 520
    top = 40
    block_h = 2 * bar_h + gap + 14
    width = 20 + label_w + plot_w + 90
    height = top + len(rows) * block_h + 30
    fig = Figure(
        width,
        height,
        title=title or "一个 TransformerLayer 为 backward 保存的激活字节",
        desc="不重算时 forward 之后要一直留着整层的激活；重算时 forward 之后只留输入，"
        "backward 里重算再临时存一层的量。",
    )
    fig.text(20, 16, "保存的激活（字节，参数不计）", bold=True)
    for i, (mode, after_forward, recomputed, *_rest) in enumerate(rows):
        y = top + i * block_h
        fig.text(20, y + bar_h + gap / 2, mode.replace("`", ""), mono=mode.startswith("`"))
        x0 = 20 + label_w
        for j, (value, kind, what) in enumerate(
            ((after_forward, "mem", "forward 之后"), (recomputed, "bwd2", "backward 里重算"))
        ):
            yy = y + j * (bar_h + gap)
            if not isinstance(value, int):  # not measured (the table says why)
                fig.text(x0, yy + bar_h / 2, f"{value}（未量）", size=11, kind="muted")
                continue
            w = max(plot_w * value / scale_max, 1)
            fig.rect(x0, yy, w, bar_h, kind, tip=f"{mode.replace('`', '')} {what}: {value}")
            fig.text(x0 + w + 6, yy + bar_h / 2, str(value), size=11, kind="muted")
    fig.legend(
        20 + label_w, height - 14, [("mem", "forward 之后一直保存"), ("bwd2", "backward 里重算时临时保存")]
    )
    fig.check()
    return fig
