"""The runner's ``overview``, ``checkpoint`` and ``ckpt-topic`` are notes 01, 07 and 21's experiments.

Each note lists the experiment code its cells call (checked for every note in ``test_run.py``); the runner's
path -- the module's ``run`` on every rank, then its ``tables`` -- computed in-process with
``run_ranks`` (:func:`run_support.runner_tables`, no torchrun start) prints the note's stored tables;
and sizes that cannot work are refused with a sentence that says why.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_support import ROOT, assert_in_note, rows_of, runner_tables

from snippets.experiments import EXPERIMENTS, Parallel, problems


def test_overview_runner_path_prints_note_01_tables():
    published, fixed = runner_tables("overview", 2, tp=2)
    for table in (published, fixed):
        assert_in_note(table, "01_training_run_overview")
    assert all(row.split(" | ")[2] == "0.0" for row in rows_of(published)[1])  # as published: never moved


def test_checkpoint_runner_path_prints_note_07_tables():
    """Saved at TP=2 on 2 ranks, the only other TP the job can load at is 1: its row and its
    ranks' pieces are rows of the note's tables (which also load at TP=4 on 4 ranks)."""
    entries, written, stored, chunks, loads, wants = runner_tables("checkpoint", 2, tp=2)
    note = "07_checkpointing"
    for table in (entries, written, stored, chunks):
        assert_in_note(table, note)
    for table in (loads, wants):
        assert_in_note(table, note, whole=False)
    assert [row.split(" | ")[0] for row in rows_of(loads)[1]] == ["| TP=2 → TP=1"]


def test_ckpt_topic_runner_path_prints_note_21_tables():
    for table in runner_tables("ckpt-topic", 8, tp=2, pp=2):
        assert_in_note(table, "21_checkpoint_topic")


@pytest.mark.parametrize(
    "name, par, says",
    [
        # 8 ranks: checkpoint also loads at TP = world size = 8, and note 07's model has 4 heads
        ("checkpoint", Parallel(world=8, tp=2), "heads 4 is not divisible by tp (load) 8"),
        ("ckpt-topic", Parallel(world=8, tp=2, pp=4), "layers 2 is not divisible by pp 4"),
        ("overview", Parallel(world=8, tp=8), "heads 4 is not divisible by tp 8"),
        ("ckpt-topic", Parallel(world=4, cp=2), "ckpt-topic does not use --cp"),
    ],
)
def test_impossible_sizes_say_why(name, par, says):
    exp = EXPERIMENTS[name]
    assert any(says in sentence for sentence in problems(exp, exp.tiny, par)), problems(exp, exp.tiny, par)


def test_overview_too_many_samples_is_refused_and_its_constants_match_the_checks():
    from snippets.experiments import checks
    from snippets.experiments import n01_overview as overview

    assert (overview.STEPS, overview.SAMPLES) == (checks.SIMPLE_LOOP_STEPS, checks.MOCK_SAMPLES)
    exp = EXPERIMENTS["overview"]
    assert any(
        "more than the mock dataset's 1000" in p
        for p in problems(exp, exp.tiny.replace(microbatches=100), Parallel(world=2, tp=2))
    )


def test_load_tps_rule():
    from snippets.experiments.checks import load_tps

    assert load_tps(Parallel(world=2, tp=2)) == [1]
    assert load_tps(Parallel(world=8, tp=2)) == [1, 8]
    assert load_tps(Parallel(world=4, tp=1)) == [4]
    assert load_tps(Parallel(world=1)) == [1]


def test_registry_is_torch_free():
    code = (
        "import sys; import snippets.experiments.registry; "
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
