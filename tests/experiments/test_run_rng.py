"""The runner's experiment of note 24 (``rng``): the same ``run`` and ``tables``, in-process through
``run_ranks``, print the note's stored tables (seeds, shared seeds, mask pairs, recompute,
CheckpointWithoutOutput) at TP=2, EP=2 on 4 ranks."""

from __future__ import annotations

import dataclasses

from run_support import assert_in_note, rows_of, runner_tables

from snippets.experiments import EXPERIMENTS, Parallel, problems


def test_rng_runner_path_prints_note_24_tables():
    printed = runner_tables("rng", 4, tp=2, ep=2)
    assert len(printed) == 6
    for table in printed:
        assert_in_note(table, "24_rng_and_recomputation")
    seeds, _, _, recompute, _, _ = printed
    assert all(row.endswith("| True |") for row in rows_of(seeds)[1])
    assert rows_of(recompute)[1][1].endswith("| True | True | True |")  # tensor_parallel.checkpoint


def test_rng_impossible_sizes_are_named():
    exp = EXPERIMENTS["rng"]
    found = problems(exp, dataclasses.replace(exp.tiny, heads=6, query_groups=6), Parallel(world=4, tp=4))
    assert any("heads 6 is not divisible by tp 4" in sentence for sentence in found), found
