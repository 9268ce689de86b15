"""Notes 04 / 19's pictures: drawn from the same runs as their tables, byte-stable, legible."""

from __future__ import annotations

import re

import pytest

from snippets.config.pictures import (
    draw_param_shards,
    draw_spec_trees,
    layer_rows,
    shard_spans,
    split_weights,
)
from snippets.config.spec_diff import diff_trees
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.ranks.launch import run_ranks

PAR = Parallel(world=2, tp=2)


@pytest.fixture(scope="module")
def param_rows():
    from snippets.experiments.n04_gpt_model import run, tables

    tiny = EXPERIMENTS["gpt-model"].tiny
    return tables(run_ranks(run, 2, tiny, PAR, grid=dict(tp=2)), tiny, PAR)[2].rows


@pytest.fixture(scope="module")
def trees():
    from snippets.experiments.n19_model_topic import run

    built = run_ranks(run, 2, EXPERIMENTS["model-topic"].tiny, PAR, grid=dict(tp=2))
    return {label: b["tree"] for label, b in built[0].items()}


def drawn_chunks(svg: str) -> dict[str, dict[int, int]]:
    """Per weight, how many rows (dim 0) or columns (dim 1) each rank's chunks cover in the SVG."""
    out: dict[str, dict[int, int]] = {}
    for name, rank, _, start, end in re.findall(
        r"<title>(\S+) rank (\d+) dim (\d) \[(\d+), (\d+)\)</title>", svg
    ):
        out.setdefault(name, {}).setdefault(int(rank), 0)
        out[name][int(rank)] += int(end) - int(start)
    return out


def test_shards_drawn_are_the_table_local_shapes(param_rows):
    svg = draw_param_shards(param_rows, PAR.tp, title="t").svg()
    chunks = drawn_chunks(svg)
    weights = split_weights(param_rows)
    assert sorted(chunks) == sorted(r[0] for r in weights)
    for name, shape, local0, local1, dim, _stride, _ in weights:
        assert chunks[name] == {0: local0[dim], 1: local1[dim]}, name
        assert sum(chunks[name].values()) == shape[dim]


def test_stride_two_alternates_ranks():
    assert shard_spans([64, 16], 2, 0, 2) == [(0, 0, 16), (1, 16, 32), (0, 32, 48), (1, 48, 64)]
    assert shard_spans([16, 32], 2, 1) == [(0, 0, 16), (1, 16, 32)]


def test_spec_picture_highlights_exactly_the_diff_rows(trees):
    svg = draw_spec_trees(trees, title="t").svg()
    highlighted = re.findall(r'<g data-name="差异 ([^"]+)">', svg)
    assert highlighted == [row[0] for row in diff_trees(trees)]
    shown = re.findall(r'<g data-name="(?:差异|相同) ([^"]+)">', svg)
    assert shown == [row[0] for row in layer_rows(trees)]
    assert "self_attention.linear_qkv" in shown  # context rows are drawn too, not highlighted


def test_two_renders_are_byte_identical(param_rows, trees):
    for draw in (
        lambda: draw_param_shards(param_rows, PAR.tp, title="t"),
        lambda: draw_spec_trees(trees, title="t"),
    ):
        a, b = draw(), draw()
        assert a.svg() == b.svg()
        a.check()
        assert a.width <= 1100
