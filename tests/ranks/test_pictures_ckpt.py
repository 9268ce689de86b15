"""Notes 07 / 21's resharding picture: it draws the rows of the note's "wants" table, from one run."""

from __future__ import annotations

import re
import shutil
import tempfile

import pytest

from snippets.ckpt.pictures import chunk_writers, draw_reshard, pieces
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.ranks.launch import run_ranks

TINY = EXPERIMENTS["checkpoint"].tiny


@pytest.fixture(scope="module")
def saved_and_wants():
    from snippets.experiments.n07_checkpoint import LOCAL_QKV, QKV, run, wants_rows

    ckpt_dir = tempfile.mkdtemp(prefix="ckpt-test-")
    try:
        results = run_ranks(run, 2, TINY, Parallel(world=2, tp=2), ckpt_dir=ckpt_dir, grid=dict(tp=2))
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    saved = results[0]["saved"]
    wants = wants_rows("TP=2 → TP=1", [r["loads"][0]["wants"] for r in results], saved)
    writers = chunk_writers([r["rows"] for r in results], LOCAL_QKV, saved["chunks"][QKV])
    return writers, wants, saved["chunks"][QKV]


def drawn_reads(svg: str) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    pattern = r"<title>(.+?) rank (\d+) 读 \[(\d+), (\d+)\) 自 rank (\d+)</title>"
    for label, rank, lo, hi, writer in re.findall(pattern, svg):
        out.setdefault((label, int(rank)), []).append((int(lo), int(hi), int(writer)))
    return out


def test_each_saved_chunk_has_its_writer(saved_and_wants):
    writers, _, chunks = saved_and_wants
    # TP=2: rank 0 wrote rows [0, 24) of layer 0, rank 1 rows [24, 48) (layer 0's local key)
    assert [(off, w) for off, _, w in writers] == [((0, 0, 0), 0), ((0, 24, 0), 1)]
    assert [tuple(off) for off, _ in chunks if off[0] == 0] == [off for off, _, _ in writers]


def test_picture_reads_are_the_table_sources(saved_and_wants):
    writers, wants, _ = saved_and_wants
    svg = draw_reshard(writers, wants, title="t").svg()
    reads = drawn_reads(svg)
    by_offset = {off: w for off, _, w in writers}
    for label, rank, local, offset, sources in wants:
        got = reads[(label, rank)]
        # the pieces cover exactly the requested rows, and come from the chunks the table names
        assert got[0][0] == offset[1] and got[-1][1] == offset[1] + local[0]
        assert [w for _, _, w in got] == [by_offset[tuple(s)] for s in sources]


def test_a_partial_request_reads_only_its_chunk(saved_and_wants):
    writers, _, _ = saved_and_wants
    assert pieces(12, 12, [w for w in writers if w[0][0] == 0], 1) == [(12, 24, 0)]
    assert pieces(0, 48, [w for w in writers if w[0][0] == 0], 1) == [(0, 24, 0), (24, 48, 1)]


def test_two_renders_are_byte_identical(saved_and_wants):
    writers, wants, _ = saved_and_wants
    a, b = draw_reshard(writers, wants, title="t"), draw_reshard(writers, wants, title="t")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
