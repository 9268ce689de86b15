"""The runner's experiments of notes 04, 08 and 19 (``gpt-model``, ``rank-generator``,
``model-topic``): the notes list the code their cells run, and the runner's path -- the same
``run`` and ``tables``, in-process through ``run_ranks`` -- prints the notes' stored tables.
"""

from __future__ import annotations

import functools

import pytest
from run_support import assert_in_note, rows_of, runner_tables

from snippets.experiments import EXPERIMENTS, Parallel, problems


@functools.lru_cache(maxsize=None)
def printed(name: str, world: int, **parallel) -> list[str]:
    """The runner's tables of ``name``, computed once per session (each call launches ranks)."""
    return runner_tables(name, world, **parallel)


def test_gpt_model_runner_path_prints_note_04_tables():
    params, counts = printed("gpt-model", 2, tp=2)
    for table in (params, counts):
        assert_in_note(table, "04_model_provider_and_gpt_model")
    assert all(row.endswith("| True |") for row in rows_of(params)[1])


def test_gpt_model_per_rank_count_is_the_memory_estimates():
    """The per-rank element count equals the formula the estimate uses (shared output weight)."""
    from snippets.models import memory_estimate as mem

    exp = EXPERIMENTS["gpt-model"]
    _, counts = printed("gpt-model", 2, tp=2)
    d = exp.tiny
    rank0 = int(rows_of(counts)[1][0].split("|")[3])
    assert rank0 == mem.stage_weight_elements(d, 2) - d.vocab * d.hidden // 2


def test_rank_generator_runner_path_prints_note_08_tables():
    per_rank, coords, compared = runner_tables("rank-generator", 8, tp=2, pp=2, ep=2)
    for table in (per_rank, coords, compared):
        assert_in_note(table, "08_parallel_state_and_rank_generator")
    assert all(row.endswith("| True |") for row in rows_of(compared)[1] + rows_of(coords)[1])


def test_model_topic_runner_path_prints_note_19_tables():
    for table in runner_tables("model-topic", 2, tp=2):
        assert_in_note(table, "19_model_topic")


@pytest.mark.parametrize(
    "name, dims, par, says",
    [
        (
            "gpt-model",
            {"heads": 6, "query_groups": 6},
            dict(world=4, tp=4),
            "heads 6 is not divisible by tp 4",
        ),
        ("gpt-model", {"vocab": 33}, dict(world=2, tp=2), "vocab 33 is not divisible by tp 2"),
        ("rank-generator", {}, dict(world=8, tp=2, pp=2, ep=3), "ep 3 does not divide the 4 ranks left"),
        ("model-topic", {"bias": True}, dict(world=2, tp=2), "the MoE variant with linear bias needs tp 1"),
    ],
)
def test_impossible_sizes_are_named(name, dims, par, says):
    import dataclasses

    exp = EXPERIMENTS[name]
    found = problems(exp, dataclasses.replace(exp.tiny, **dims), Parallel(**par))
    assert any(says in sentence for sentence in found), found


def test_checks_constants_are_the_experiments():
    """The torch-free checks repeat two constants of the experiment modules; they must agree."""
    from snippets.experiments import checks
    from snippets.experiments import n08_rank_generator as rank_generator
    from snippets.experiments import n19_model_topic as model_topic

    assert (checks.ETP, checks.EXPERTS) == (rank_generator.ETP, model_topic.EXPERTS)
