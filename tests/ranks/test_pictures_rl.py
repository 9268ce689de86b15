"""snippets/rl/pictures.py: note 22's refit bytes matrix is drawn from the same plan as the note's
table (each cell's hover text and number is that table's cell), and the QKV picture from the row
labels its table prints; two renders are the same bytes, and the legibility check passes."""

import re

import pytest

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.ranks.launch import run_ranks, warm_up
from snippets.rl import pictures, qkv_layout, refit_cost


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.fixture(scope="module")
def ranks():
    from snippets.experiments.n22_refit import one_rl_round

    return run_ranks(one_rl_round, 4, EXPERIMENTS["refit"].tiny, tp=2, pp=2, grid=dict(tp=2, pp=2))


def _draw(matrix):
    return pictures.draw_traffic_matrix(
        matrix,
        [f"r{s}（训练 tp{s % 2}·pp{s // 2}）" for s in range(4)],
        [f"r{d}（tp{d}）" for d in range(4)],
        title="t",
        desc="d",
    )


def test_traffic_matrix_is_the_plan_table(ranks):
    from snippets.experiments.n22_refit import tables

    tiny = EXPERIMENTS["refit"].tiny
    table = tables(ranks, tiny, Parallel(world=4, tp=2, pp=2))[3]  # the note's "发送 ＼ 接收" table
    matrix = refit_cost.plan_traffic([r["plan"] for r in ranks])
    assert [row[1:-1] for row in table.rows] == matrix
    fig = _draw(matrix)
    fig.check()
    svg = fig.svg()
    assert svg == _draw(matrix).svg()
    drawn = [
        [int(b) for b in re.findall(r"：(\d+) 字节", svg.split(f'data-name="r{s}（')[1].split("</g>")[0])]
        for s in range(4)
    ]
    assert drawn == matrix
    labels = [label.text for label in fig.labels()]
    for s, row in enumerate(table.rows):
        assert str(row[-1]) in labels  # the row sums the table prints
    # every rank receives exactly its rollout parameters' bytes (the column sums)
    assert all(str(sum(matrix[s][d] for s in range(4))) in labels for d in range(4))


def test_qkv_picture_is_the_group_table():
    labels = qkv_layout.fused_row_labels(num_heads=8, num_query_groups=4)
    fig = pictures.draw_qkv_layout(labels, num_query_groups=4, tp_sizes=(2, 4))
    fig.check()
    svg = fig.svg()
    assert svg == pictures.draw_qkv_layout(labels, num_query_groups=4, tp_sizes=(2, 4)).svg()
    megatron = re.findall(r">([qkv]\d)</text>", svg.split('data-name="megatron"')[1].split("</g>")[0])
    hf = re.findall(r">([qkv]\d)</text>", svg.split('data-name="hf"')[1].split("</g>")[0])
    assert megatron == labels
    assert hf == sorted(labels, key=lambda s: ("qkv".index(s[0]), int(s[1:])))
    # TP4 keeps whole query groups: rank r's four blocks are group r's
    assert len(re.findall(r">rank \d</text>", svg)) == 2 + 4
