"""Note 03's get_batch picture: drawn from the same run as its chunk table, byte-stable, legible."""

from __future__ import annotations

import re

import pytest

from snippets.data.pictures import draw_batch_flow, full_sequences, kept_rows
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n03_batch_flow import chunk_table, run
from snippets.ranks.launch import run_ranks

TINY = EXPERIMENTS["batch-flow"].tiny
PAR = Parallel(world=4, tp=2, cp=2)


@pytest.fixture(scope="module")
def results():
    return run_ranks(run, 4, TINY, PAR, grid=dict(tp=2, cp=2))


def drawn_kept(svg: str) -> dict[int, list[tuple[int, int]]]:
    """(position, token) of every kept cell the SVG draws, by rank (read from the hover titles)."""
    out: dict[int, list] = {}
    for r, p, t in re.findall(r"<title>rank (\d+) 留下 位置 (\d+) token (\d+)</title>", svg):
        out.setdefault(int(r), []).append((int(p), int(t)))
    return out


def test_picture_rows_are_the_chunk_table(results):
    table = chunk_table(results, TINY, PAR)
    assert [row[:5] for row in table.rows] == kept_rows(results, TINY.seq, PAR.cp)


def test_picture_draws_what_each_rank_kept(results):
    svg = draw_batch_flow(results, TINY.seq, PAR.tp, PAR.cp, title="t").svg()
    kept = drawn_kept(svg)
    for r, _, _, positions, tokens in kept_rows(results, TINY.seq, PAR.cp):
        assert kept[r] == list(zip(positions, tokens))
    # the broadcast: one arrow per receiving rank (ranks 1 and 3), labelled with the sender's count
    assert svg.count(f"广播×{len(results[0]['log'])}") == 2


def test_whole_sequence_is_put_back_from_the_cp_chunks(results):
    full = full_sequences(results)
    assert full[0] == full[1] == full[2] == full[3]
    assert len(full[0]) == TINY.seq
    for _, _, _, positions, tokens in kept_rows(results, TINY.seq, PAR.cp):
        assert [full[0][p] for p in positions] == tokens


def test_disagreeing_ranks_are_refused(results):
    bad = [dict(d) for d in results]
    bad[2] = {**bad[2], "tokens": [t + 1 for t in bad[2]["tokens"]]}
    bad[0] = {**bad[0], "positions": bad[2]["positions"]}
    with pytest.raises(ValueError, match="disagree"):
        full_sequences(bad)


def test_two_renders_are_byte_identical(results):
    a = draw_batch_flow(results, TINY.seq, PAR.tp, PAR.cp, title="t")
    b = draw_batch_flow(results, TINY.seq, PAR.tp, PAR.cp, title="t")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
