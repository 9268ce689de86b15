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


# ----------------------------------------------------------------------------- note 21


@pytest.fixture(scope="module")
def qkv_rows():
    from snippets.experiments.n21_ckpt_topic import qkv_table, run

    tiny = EXPERIMENTS["ckpt-topic"].tiny
    return qkv_table(run_ranks(run, 8, tiny, Parallel(world=8, tp=2, pp=2), grid=dict(tp=2, pp=2))).rows


def test_replica_grid_fills_exactly_the_writers(qkv_rows):
    from snippets.ckpt.pictures import draw_replica_grid, written_blocks

    svg = draw_replica_grid(qkv_rows, title="t").svg()
    filled = {int(r) for r in re.findall(r'<g data-name="rank (\d+) 写">', svg)}
    replicas = {int(r) for r in re.findall(r'<g data-name="rank (\d+) 副本">', svg)}
    # the table's replica_id column: all-zero = writes
    assert filled == {row[0] for row in qkv_rows if tuple(row[7]) == (0, 0, 0)} == {0, 1, 4, 5}
    assert replicas == {row[0] for row in qkv_rows if tuple(row[7]) != (0, 0, 0)}
    assert [b[0] for b in written_blocks(qkv_rows)] == sorted(filled)


def test_tp1_loader_reads_the_two_tp_blocks_of_its_layer(qkv_rows):
    from snippets.ckpt.pictures import draw_replica_grid

    svg = draw_replica_grid(qkv_rows, title="t").svg()
    reads = re.findall(
        r"<title>TP=1 pp (\d) 的 rank 读 层 (\d) 行 \[(\d+), (\d+)\) 自 rank (\d+)</title>", svg
    )
    assert [tuple(map(int, r)) for r in reads] == [
        (0, 0, 0, 24, 0),
        (0, 0, 24, 48, 1),
        (1, 1, 0, 24, 4),
        (1, 1, 24, 48, 5),
    ]
    a, b = draw_replica_grid(qkv_rows, title="t"), draw_replica_grid(qkv_rows, title="t")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
