"""The data notes' experiments (``batch-flow`` for note 03, ``data-topic`` for note 18) through the
runner's path: the notes list the code their cells call, the runner prints the notes' stored tables
at ``tiny``, the corpora the experiments write are the notes' own, and impossible sizes are refused.

Runs are in-process (:func:`run_support.runner_tables`, forked gloo ranks), not ``torchrun``.
"""

from __future__ import annotations

import numpy
import pytest
from run_support import assert_in_note, runner_tables

from snippets.experiments import EXPERIMENTS, Parallel, problems
from snippets.experiments.checks import resume_dp_sizes

NOTE_03, NOTE_18 = "03_data_and_batch_flow", "18_data_topic"


def test_batch_flow_corpus_is_note_03_corpus_a():
    from snippets.experiments.n03_batch_flow import corpus_documents

    assert corpus_documents(EXPERIMENTS["batch-flow"].tiny) == [
        [1, 2, 3, 4, 5],
        [6, 7, 8],
        [9, 10, 11, 12, 13, 14, 15],
    ]


def test_data_topic_corpus_is_note_18_corpus_a():
    from snippets.experiments.n18_data_topic import corpus_documents

    lengths = [2 + i % 4 for i in range(10)]  # note 18's first cells, verbatim
    starts = numpy.cumsum([0] + lengths[:-1])
    note = [[int(s + j) % 30 for j in range(n)] for s, n in zip(starts, lengths)]
    assert corpus_documents(EXPERIMENTS["data-topic"].tiny) == note


def test_batch_flow_runner_path_prints_note_03_tables():
    summary, sender, receiver, chunks = runner_tables("batch-flow", 4, tp=2, cp=2)
    for table in (summary, sender, receiver, chunks):
        assert_in_note(table, NOTE_03)


def test_batch_flow_pipeline_runner_path_prints_note_03_table():
    (roles,) = runner_tables("batch-flow", 6, tp=2, pp=3)
    assert_in_note(roles, NOTE_03)


def test_data_topic_runner_path_prints_note_18_tables():
    resumed, barriers = runner_tables("data-topic", 4, tp=2)
    for table in (resumed, barriers):
        assert_in_note(table, NOTE_18)


def test_data_topic_resumes_at_every_dp_size_the_ranks_can_form():
    tiny = EXPERIMENTS["data-topic"].tiny
    assert resume_dp_sizes(tiny, Parallel(world=4, tp=2)) == [2, 4, 1]  # note 18's columns
    qwen = tiny.replace(seq=2048, micro_batch_size=1, microbatches=8)
    assert resume_dp_sizes(qwen, Parallel(world=8)) == [8, 4, 2, 1]
    # a global batch of 2 micro-batches cannot be spread over 4 DP ranks
    assert resume_dp_sizes(tiny.replace(microbatches=1), Parallel(world=4, tp=2)) == [2, 1]


@pytest.mark.parametrize(
    "name, dims, par, says",
    [
        (
            "batch-flow",
            dict(seq=6),
            Parallel(world=4, tp=2, cp=2),
            "seq 6 is not divisible by 2 * cp = 4 (get_batch_on_this_cp_rank cuts it into 2 * cp chunks)",
        ),
        (
            "data-topic",
            dict(vocab=2),
            Parallel(world=2),
            "vocab 2 leaves no token id below the EOD (vocab - 1): use 3 or more",
        ),
        ("data-topic", dict(), Parallel(world=4, pp=2), "data-topic does not use --pp"),
    ],
)
def test_impossible_sizes_are_refused(name, dims, par, says):
    exp = EXPERIMENTS[name]
    assert says in "; ".join(problems(exp, exp.tiny.replace(**dims), par))


def test_estimates_grow_with_the_sequence():
    for name, par in (("batch-flow", Parallel(world=8, tp=2, cp=2)), ("data-topic", Parallel(world=8))):
        exp = EXPERIMENTS[name]
        small, large = (exp.estimate(exp.tiny.replace(seq=s), par).total for s in (8, 4096))
        assert small < large
