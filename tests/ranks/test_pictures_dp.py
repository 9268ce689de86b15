"""snippets/dp/pictures.py: the bucket timelines of notes 14 and 20 are drawn from the same recorded
runs as the notes' tables -- every collective box is one row of the communication table, in order,
in the same part of the step -- two renders are the same bytes, and the legibility check passes."""

import pytest

from snippets.dp import overlap_timeline, pictures
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.fixture(scope="module")
def ddp_results():
    from snippets.experiments.n14_ddp import ddp_run

    tiny = EXPERIMENTS["ddp"].tiny
    plain = run_ranks(ddp_run, 2, tiny, overlap_grad_reduce=False, keep_grads=False)[0]
    overlapped = run_ranks(
        ddp_run, 2, tiny, overlap_grad_reduce=True, bucket_size=1000, iterations=2, keep_grads=False
    )[0]
    return plain, overlapped


@pytest.fixture(scope="module")
def overlap_result():
    from snippets.experiments.n20_overlap import run

    return run_ranks(run, 2, EXPERIMENTS["overlap"].tiny, Parallel(world=2))[0]


def _comm(events):
    return [(e["section"], e["api"], e["phase"]) for e in events if e["kind"] == "comm"]


def test_note_14_picture_is_the_communication_tables(ddp_results):
    plain, overlapped = ddp_results
    lanes = pictures.ddp_lanes(plain, overlapped)
    # the note's three communication tables: (part of the step, API, phase) of each row, in order
    tables = [plain["steps"][0], overlapped["steps"][0], overlapped["steps"][1]]
    for (_, rows), step in zip(lanes, tables):
        expected = [("schedule", c.api, c.phase) for c in step["schedule"]] + [
            ("finalize_model_grads", c.api, c.phase) for c in step["finalize"]
        ]
        assert _comm(pictures.lane_events(rows)) == expected
    # overlap's step 2: bucket i's all-reduce comes right after gradients, in buffer order
    step2 = pictures.lane_events(lanes[2][1])
    assert [e["label"] for e in step2 if e["kind"] == "comm"] == [f"AR b{i}" for i in range(9)]
    assert step2[[e["kind"] for e in step2].index("comm") - 1]["kind"] == "bwd"
    fig = pictures.draw_ddp_timeline(plain, overlapped)
    fig.check()
    assert fig.svg() == pictures.draw_ddp_timeline(plain, overlapped).svg()
    shown = [label.text for label in fig.labels()]
    # one box per table row: bucket 0 is the whole buffer without overlap, then 9 buckets twice
    assert [shown.count(f"AR b{i}") for i in range(9)] == [3] + [2] * 8


def test_note_20_picture_is_the_timeline_table(overlap_result):
    from snippets.experiments.n20_overlap import timeline_table

    fig = pictures.draw_overlap_timeline(overlap_result)
    fig.check()
    assert fig.svg() == pictures.draw_overlap_timeline(overlap_result).svg()
    # the last lane is the note's timeline table, row for row
    table_rows = timeline_table([overlap_result]).rows
    namer = overlap_timeline.bucket_namer(overlap_result["buckets"])
    assert overlap_timeline.timeline(overlap_result["overlapped"][-1], namer) == table_rows
    drawn = [label.text for label in fig.labels()]
    last = pictures.lane_events(table_rows)
    assert all(e["label"] in drawn for e in last)
    # and each lane's collectives are the counts table's, part of the step by part of the step
    for events in [overlap_result["plain"][-1], *overlap_result["overlapped"]]:
        counted = overlap_timeline.where_counts(events)
        rows = overlap_timeline.timeline(events, namer)
        drawn_counts: dict = {}
        for e in pictures.lane_events(rows):
            if e["kind"] == "comm":
                drawn_counts.setdefault((e["section"], e["phase"]), []).append(e["api"])
        assert drawn_counts == counted


def test_lane_events_refuse_rows_they_cannot_draw():
    with pytest.raises(ValueError, match="not a timeline event"):
        pictures.lane_events([[1, "schedule", "something else", ""]])
    rows = [
        [1, "schedule", "forward 计算（3 个模块）", "a … b"],
        [2, "schedule", "**reduce_scatter_tensor**（backward）", "bucket 1: [8] → [4]"],
    ]
    assert [e["label"] for e in pictures.lane_events(rows)] == ["F×3", "RS b1"]
