"""The pieces every tensor-parallel picture is made of (:mod:`snippets.tp.pictures`, ``rng_pictures``).

:func:`rank_kind` gives each TP rank's slice its fill (neighbours alternate dark / light), and
:func:`flow_cell` draws one "ranks' tensors -> collective (or none) -> ranks' results" cell, the
unit of note 09's and note 10's pictures.
"""

from __future__ import annotations

from snippets.record.draw import Figure

RANK_KINDS = ("tp", "fwd2", "edp", "mem")
"""Fill of rank 0, 1, 2, 3's slice (alternating dark / light so neighbours stay apart)."""


def rank_kind(r: int) -> str:
    return RANK_KINDS[r % len(RANK_KINDS)]


def flow_cell(
    fig: Figure,
    x,
    y,
    *,
    left: list[str],
    right: list[str],
    api: str | None,
    tip: str,
    box_w: float = 130,
    mid_w: float = 176,
    box_h: float = 20,
    gap: float = 10,
) -> float:
    """Ranks' tensors on the left, a collective (``api``) or nothing in the middle, the ranks'
    results on the right, with arrows. Returns the cell's width."""
    n = len(left)
    width = 2 * box_w + mid_w + 2 * 22
    rx = x + width - box_w
    mid_x = x + box_w + 22
    height = n * box_h + (n - 1) * gap
    for r in range(n):
        yy = y + r * (box_h + gap)
        fig.boxed(x, yy, box_w, box_h, left[r], rank_kind(r), size=12)
        fig.boxed(rx, yy, box_w, box_h, right[r], rank_kind(r), size=12)
    if api:
        fig.rect(mid_x, y, mid_w, height, "comm", tip=tip)
        fig.text(mid_x + mid_w / 2, y + height / 2, api, anchor="middle", mono=True)
        for r in range(n):
            yy = y + r * (box_h + gap) + box_h / 2
            fig.line(x + box_w, yy, mid_x - 1, yy, "comm", width=1.5, arrow=True)
            fig.line(mid_x + mid_w, yy, rx - 1, yy, "comm", width=1.5, arrow=True)
    else:
        with fig.group(tip=tip):
            for r in range(n):
                yy = y + r * (box_h + gap) + box_h / 2
                fig.line(x + box_w, yy, rx - 1, yy, "muted", arrow=True, dashed=True)
            fig.text(mid_x + mid_w / 2, y + height / 2, "不通信", anchor="middle", kind="muted", size=11)
    return width
