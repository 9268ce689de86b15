"""Note 13's pictures: drawn from a recorded run, each lane shows the order the note's table prints,
each p2p arrow is one isend the run recorded, and the SVG is byte-stable and legible."""

import re
from collections import Counter

import pytest

from snippets.experiments import EXPERIMENTS
from snippets.experiments.n13_pipeline import pipeline_run
from snippets.pp import pictures
from snippets.pp import timeline as pt
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module")
def runs():
    warm_up()
    tiny = EXPERIMENTS["pipeline"].tiny
    return {
        (2, 1): run_ranks(pipeline_run, 2, tiny, pp=2, keep_grads=False),
        (4, 1): run_ranks(pipeline_run, 4, tiny, pp=4, keep_grads=False),
        (4, 2): run_ranks(pipeline_run, 4, tiny, pp=4, vp=2, keep_grads=False),
    }


def _lanes_in_svg(svg: str) -> list[list]:
    """[rank, "F0 F1 ..."] read back from the boxes' hover titles, in drawing order."""
    lanes: dict[int, list[str]] = {}
    for rank, op in re.findall(r"<title>rank (\d+) ([FB][0-9.]+)</title>", svg):
        lanes.setdefault(int(rank), []).append(op)
    return [[rank, " ".join(ops)] for rank, ops in sorted(lanes.items())]


def _arrows_in_svg(svg: str) -> Counter:
    """(from rank, to rank) of every p2p arrow, read back from its end points."""
    part = svg[svg.index('data-name="p2p"') :]
    part = part[: part.index("</g>")]

    def lane(y):
        return int((float(y) - pictures.TOP) // pictures.LANE)

    return Counter(
        (lane(y1), lane(y2))
        for y1, y2 in re.findall(
            r'<line x1="[\d.]+" y1="([\d.]+)" x2="[\d.]+" y2="([\d.]+)"[^>]*marker-end', part
        )
    )


@pytest.mark.parametrize("pp, v", [(2, 1), (4, 1), (4, 2)])
def test_timeline_picture_is_the_recorded_run(runs, pp, v):
    results = runs[(pp, v)]
    ops = [r["runs"][4]["ops"] for r in results]
    t = pt.logical_schedule(ops, chunks=v, forward=2, backward=4)
    svg = pictures.draw_timeline(t, chunks=v, title=f"pp{pp} v{v}").svg()
    # the note's "recorded order" table, row by row
    table = [[rank, " ".join(pt.label(op, v) for op in pt.compute_ops(o))] for rank, o in enumerate(ops)]
    assert _lanes_in_svg(svg) == table
    # one arrow per isend the p2p record holds, between the same two ranks
    sent = Counter()
    for rank, o in enumerate(ops):
        for row in pt.p2p_rows(o, rank, v):
            for x in row[5].split(", "):
                if x.startswith("isend"):
                    sent[(rank, int(x.split("→")[1]))] += 1
    assert _arrows_in_svg(svg) == sent
    assert sum(sent.values()) == 2 * 4 * (pp * v - 1)  # m=4 activations and gradients per boundary


def test_timeline_picture_is_byte_stable_and_legible(runs):
    ops = [r["runs"][4]["ops"] for r in runs[(4, 2)]]
    t = pt.logical_schedule(ops, chunks=2)
    a = pictures.draw_timeline(t, chunks=2, title="x")
    b = pictures.draw_timeline(pt.logical_schedule(ops, chunks=2), chunks=2, title="x")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
