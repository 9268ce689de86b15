"""The runner's experiments for notes 20 and 23 print the notes' own tables, and refuse bad sizes.

``optimizer-topic`` (note 20, section 4: a bf16 model with and without the distributed optimizer),
``overlap`` (note 20, section 8: DDP's bucket collectives with and without overlap) and
``journey`` (note 23: one step on TP2 · PP2 · DP2 with sequence parallel, following one
``linear_fc1`` weight) run in-process through the runner's path (:func:`run_support.runner_tables`,
no ``torchrun``); every table they print must be one the note stores. ``journey`` runs its
TP = PP = 1 reference inside the job (every rank a DP replica fed the whole batch) where the note
runs it as a separate one-process launch: the comparisons must come out the same.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_support import ROOT, assert_in_note, rows_of, runner_tables

from snippets.experiments import EXPERIMENTS, Parallel, problems

NOTE_20, NOTE_23 = "20_optimizer_topic", "23_tensor_journey"


def test_optimizer_topic_runner_path_prints_note_20_tables():
    buffers, per_parameter = runner_tables("optimizer-topic", 2)
    for table in (buffers, per_parameter):
        assert_in_note(table, NOTE_20)


def test_overlap_runner_path_prints_note_20_tables():
    """Both runs in one job on each rank (the note's cell makes the same call): where the bucket
    collectives fall, rank 0's overlapped timeline, and the weight comparison made on the rank."""
    where, timeline, same = runner_tables("overlap", 2)
    for table in (where, timeline, same):
        assert_in_note(table, NOTE_20)


def test_journey_runner_path_prints_note_23_tables():
    """Every table of the 8-rank step; the memory table without the note's one-process row."""
    *stations, memory, stages = runner_tables("journey", 8, tp=2, pp=2, sp=True)
    assert len(stations) == 10
    for table in stations + [stages]:
        assert_in_note(table, NOTE_23)
    assert_in_note(memory, NOTE_23, whole=False)
    assert len(rows_of(memory)[1]) == 8


@pytest.mark.parametrize(
    "name, dims, par, says",
    [
        (
            "journey",
            {"layers": 3},
            Parallel(world=8, tp=2, pp=2, sp=True),
            "layers 3 is not divisible by pp 2",
        ),
        ("journey", {}, Parallel(world=2, pp=2, sp=True), "--sequence-parallel needs --tp 2 or more"),
        (
            "journey",
            {"microbatches": 3},
            Parallel(world=8, tp=2, pp=2),
            "micro-batches 3 is not divisible by dp 2",
        ),
        ("optimizer-topic", {}, Parallel(world=8), "micro-batches 4 is not divisible by dp (= world size) 8"),
        ("optimizer-topic", {}, Parallel(world=2, tp=2), "optimizer-topic does not use --tp"),
        (
            "overlap",
            {"microbatches": 3},
            Parallel(world=2),
            "micro-batches 3 is not divisible by dp (= world size) 2",
        ),
    ],
)
def test_impossible_sizes_are_refused(name, dims, par, says):
    exp = EXPERIMENTS[name]
    assert says in "; ".join(problems(exp, exp.tiny.replace(**dims), par))


def test_registry_is_torch_free_and_estimates_real_sizes():
    code = (
        "import sys; from snippets.models import presets; from snippets.experiments import Parallel; "
        "from snippets.experiments.registry import EXPERIMENTS as e; "
        "d = presets.PRESETS['qwen3-8b'].replace(layers=2); "
        "print(e['journey'].estimate(d, Parallel(world=8, tp=2, pp=2, sp=True, device='cuda')).total > 0, "
        "e['optimizer-topic'].estimate(d, Parallel(world=8, device='cuda')).total > 0, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"]
