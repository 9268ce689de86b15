"""Note 14's PP x DP run and its picture (snippets/dp/pipeline_buckets.py): only pipeline stage 0 is
bucketed; with overlap, step 1 starts no bucket all-reduce inside the schedule, step 2 starts every one
inside the stage's last backward -- stage 0's spread over it, stage 1's single bucket when its last
gradient is done, one stage-backward before the step ends; the picture has one tick per start and is
byte-stable."""

import re

import pytest

from snippets.dp import pipeline_buckets
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n14_ddp import pipeline_ddp_run
from snippets.ranks.launch import run_ranks, warm_up

TINY = EXPERIMENTS["ddp"].tiny


@pytest.fixture(scope="module")
def results():
    warm_up()
    return run_ranks(pipeline_ddp_run, 4, TINY, pp=2, bucket_size=1000)


def test_only_the_first_stage_is_bucketed(results):
    by_stage = {r["ranks"]["pp"]: r for r in results}
    assert by_stage[0]["bucket_size"] == 1000 and len(by_stage[0]["buckets"]) > 1
    assert by_stage[1]["bucket_size"] is None and len(by_stage[1]["buckets"]) == 1


def test_step_one_reduces_in_finalize_step_two_in_the_last_backward(results):
    for r in results:
        first, second = r["steps"]
        assert first["syncs"] == []  # first batch: the hooks only count
        dp = [c for c in first["finalize"] if c.group == "dp-cp"]
        assert len(dp) == len(r["buckets"])
        assert [c.group for c in second["finalize"]] == ["embd"]  # the shared embedding's all-reduce
        assert len(second["syncs"]) == len(r["buckets"])
        assert {s["microbatch"] for s in second["syncs"]} == {3}  # m = 4: the last micro-batch
        assert second["syncs"][-1]["done"] == second["syncs"][-1]["total"]


def test_a_later_stage_starts_its_reduce_one_stage_backward_before_the_end(results):
    ticks = pipeline_buckets.starts(results, 1, TINY.layers)
    clock = pipeline_buckets.clock(results, 1, TINY.layers)
    end = max(stop for row in clock for _, _, stop in row)
    backward = 2 * TINY.layers // 2  # two units per layer, two layers per stage
    assert ticks[0][-1][0] == end  # stage 0's last bucket closes the step
    assert [t for t, _, _ in ticks[1]] == [end - backward]
    assert all(a < b for a, b in zip([t for t, _, _ in ticks[0]], [t for t, _, _ in ticks[0]][1:]))


def test_picture_has_one_tick_per_start_and_is_stable(results):
    fig = pipeline_buckets.draw(results, 1, TINY.layers, title="t")
    svg = fig.svg()
    assert svg == pipeline_buckets.draw(results, 1, TINY.layers, title="t").svg()
    ticks = re.findall(r"<title>stage (\d)：B3 里开始 all-reduce \[(\d+)\]</title>", svg)
    expected = [
        (str(stage), str(numel))
        for stage, t in enumerate(pipeline_buckets.starts(results, 1, TINY.layers))
        for _, _, numel in t
    ]
    assert ticks == expected
