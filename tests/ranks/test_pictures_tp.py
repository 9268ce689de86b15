"""Notes 09-12's pictures: drawn from a recorded run, their boxes name exactly the rows the note's
tables print, two renders are the same bytes, and every label is legible (``check()``)."""

import html
import re

import pytest

from snippets.experiments import EXPERIMENTS
from snippets.ranks.launch import run_ranks, warm_up
from snippets.tp import pictures


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def tips(svg: str) -> list[str]:
    """Every hover title of the picture, in drawing order (the first <title> is the picture's)."""
    return [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", svg)[1:]]


def test_mappings_picture_is_the_record_table():
    from snippets.experiments.n09_mappings import record_rows, run_every_mapping

    runs = run_ranks(run_every_mapping, 2, EXPERIMENTS["mappings"].tiny, 2, keep_tensors=False)
    rows = record_rows(runs[0])
    fig = pictures.draw_mappings(rows)
    assert tips(fig.svg()) == pictures.mapping_cells(rows)
    # every (function, phase) of the table has its cell, and a cell shows a collective iff the table has one
    assert len(tips(fig.svg())) == 2 * len({row[0] for row in rows})
    for tip in tips(fig.svg()):
        name, phase, api = tip.split(" | ")[:3]
        assert api == (
            " + ".join(r[2] for r in rows if r[0] == name and r[1] == phase and r[2] != "—") or "—"
        )
    assert fig.svg() == pictures.draw_mappings(record_rows(runs[0])).svg()
    fig.check()


def test_linear_picture_is_the_layout_and_comm_tables():
    from snippets.experiments.n10_linear import comm_table, layout_table, run_cases, weight_layout

    tiny = EXPERIMENTS["linear"].tiny
    layout = layout_table({2: run_ranks(weight_layout, 2, tiny, 2)}).rows
    comm = comm_table(run_ranks(run_cases, 2, tiny, 2, keep_tensors=False)).rows
    fig = pictures.draw_linear(layout, comm)
    assert tips(fig.svg()) == pictures.linear_tips(layout, comm)
    # the column layer's slices are rows of the master, the row layer's are columns
    slices = [t.split(" | ") for t in tips(fig.svg()) if t.startswith(("column |", "row |"))]
    assert [s[3:] for s in slices] == [
        ["rows 0–7", "cols 0–7"],
        ["rows 8–15", "cols 0–7"],
        ["rows 0–7", "cols 0–7"],
        ["rows 0–7", "cols 8–15"],
    ]
    assert "Column, gather_output=False | backward | all_reduce | [4, 2, 8] → [4, 2, 8]" in tips(fig.svg())
    assert "Row, input_is_parallel=True | forward | all_reduce | [4, 2, 8] → [4, 2, 8]" in tips(fig.svg())
    assert fig.svg() == pictures.draw_linear(layout, comm).svg()
    fig.check()
