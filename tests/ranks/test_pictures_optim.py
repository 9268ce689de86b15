"""snippets/optim/pictures.py: note 15's ZeRO-1 shard map and bytes-per-parameter bars are drawn
from the same run as its tables -- each optimizer-state box is one row of the shard table, inside
its rank's segment, and each bar is one row of the memory table -- two renders are the same bytes,
and the legibility check passes."""

import re

import pytest

from snippets.experiments import EXPERIMENTS
from snippets.optim import pictures
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.fixture(scope="module")
def runs():
    from snippets.experiments.n15_dist_optimizer import train_two_steps

    tiny = EXPERIMENTS["dist-optimizer"].tiny
    plain = run_ranks(train_two_steps, 2, tiny, use_distributed_optimizer=False, keep_tensors=False)
    zero1 = run_ranks(train_two_steps, 2, tiny, use_distributed_optimizer=True, keep_tensors=False)
    return plain, zero1


def _tips(svg: str, group: str) -> list[str]:
    block = svg.split(f'data-name="{group}"')[1].split("</g>")[0]
    return re.findall(r"<title>([^<]*)</title>", block)


def test_shard_map_is_the_shard_table(runs):
    _, zero1 = runs
    shards = [r["shards"] for r in zero1]
    size = zero1[0]["buckets"][0][3]
    fig = pictures.draw_shard_map(shards, size)
    fig.check()
    svg = fig.svg()
    assert svg == pictures.draw_shard_map(shards, size).svg()
    for rank, rows in enumerate(shards):
        # one state box per table row, with the table's gbuf_world range, inside the rank's segment
        assert _tips(svg, f"rank {rank}") == [f"{row[1]} {row[3]}" for row in rows]
        for _, start, end in pictures.owned_ranges(rows):
            assert rank * size // 2 <= start < end <= (rank + 1) * size // 2
    # the parameter cut by the boundary is drawn on both ranks, in the accent color
    assert svg.count('class="f-accent"><title>layers.1.mlp.linear_fc1.weight') == 2


def test_bytes_bars_are_the_memory_table(runs):
    from snippets.experiments.n15_dist_optimizer import memory_rows

    plain, zero1 = runs
    rows = memory_rows("不分片", plain) + memory_rows("分布式优化器", zero1)
    fig = pictures.draw_bytes_per_parameter(rows)
    fig.check()
    svg = fig.svg()
    assert svg == pictures.draw_bytes_per_parameter(rows).svg()
    for row in rows:
        tips = _tips(svg, f"{row[0]} rank {row[1]}")
        names = ["权重", "梯度", "主权重", "Adam"]
        assert tips == [f"{n} {row[c]} B" for n, c in zip(names, range(2, 6)) if row[c] > 0]
        assert f"{row[7]} B/参数" in [label.text for label in fig.labels()]
