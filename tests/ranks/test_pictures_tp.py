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
    # note 09's first picture: f and g only, same cells, narrower boxes
    pair = ["copy_to_tensor_model_parallel_region (f)", "reduce_from_tensor_model_parallel_region (g)"]
    small = pictures.draw_mappings(rows, only=pair, box_w=100, mid_w=170)
    assert tips(small.svg()) == [t for t in tips(fig.svg()) if t.split(" | ")[0] in pair]
    assert len(tips(small.svg())) == 4 and small.width < fig.width
    with pytest.raises(ValueError, match="not in the record table"):
        pictures.draw_mappings(rows, only=["nope"])


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
    # note 10's first picture: one cell per (configuration, phase) that communicated, each
    # naming the table's collectives and the code that issued them
    summary = pictures.draw_linear_summary(comm)
    cells = tips(summary.svg())
    expected = {}
    for config, phase, api, _g, before, after, issuer, _m in comm:
        if config in pictures.LINEAR_SUMMARY_CONFIGS:
            expected.setdefault((config, phase), []).append(f"{api} {before} → {after} @ {issuer}")
    assert cells == [" | ".join([c, p] + calls) for (c, p), calls in expected.items()]
    assert (
        "Column, gather_output=False | backward | all_reduce [4, 2, 8] → [4, 2, 8] @ layers.py::backward"
        in cells
    )
    summary.check()


def test_layer_picture_is_the_weight_and_submodule_tables():
    from snippets.experiments import Parallel
    from snippets.experiments.n11_tp_layer import run, submodule_table, weight_table

    tp2 = run_ranks(run, 2, EXPERIMENTS["tp-layer"].tiny, Parallel(world=2, tp=2), grid=dict(tp=2))
    weights, subs = weight_table(tp2[0]["weights"]).rows, submodule_table(tp2[0], 2).rows
    fig = pictures.draw_layer(weights, subs)
    got = tips(fig.svg())
    assert got == pictures.layer_tips(weights, subs)
    # one box per submodule in each panel, one marker per collective kind the table lists
    markers = [t for t in got if t.split(" | ")[2] in ("forward", "backward")]
    expected = sum(cell != "—" for row in subs for cell in row[1:])
    assert len(markers) == expected == 12
    assert "TP=2，开 sequence parallel | linear_qkv | backward | all-gather, reduce-scatter" in got
    assert fig.svg() == pictures.draw_layer(weights, subs).svg()
    fig.check()
    # note 11's first picture: the same markers, one column per submodule that issued any
    summary = pictures.draw_layer_summary(weights, subs)
    summary_tips = tips(summary.svg())
    assert sorted(t for t in summary_tips if t in markers) == sorted(markers)
    columns = [t.split(" | ")[0] for t in summary_tips if t not in markers]
    assert columns == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    assert summary.svg() == pictures.draw_layer_summary(weights, subs).svg()
    summary.check()


def test_vocab_picture_is_the_ranges_and_the_cross_entropy_table():
    from snippets.experiments.n12_vocab import ce_comm_table, cross_entropy_run, embedding_run

    tiny = EXPERIMENTS["vocab"].tiny
    ranges = {
        tp: [r[False]["range"] for r in run_ranks(embedding_run, tp, tiny, tp, keep_tensors=False)]
        for tp in (2, 4)
    }
    ce = run_ranks(cross_entropy_run, 2, tiny, 2, keep_tensors=False)
    rows = ce_comm_table(ce[0][0.0]["calls"]).rows
    fig = pictures.draw_vocab(tiny.vocab, ranges, rows, ce[0][0.0]["local_shape"])
    got = tips(fig.svg())
    assert got == pictures.vocab_tips(ranges, rows)
    assert got[:2] == ["TP=2 | rank 0 | range(0, 8)", "TP=2 | rank 1 | range(8, 16)"]
    assert [t.split(" | ")[1] for t in got[-3:]] == ["all_reduce"] * 3
    assert fig.svg() == pictures.draw_vocab(tiny.vocab, ranges, rows, ce[0][0.0]["local_shape"]).svg()
    fig.check()
