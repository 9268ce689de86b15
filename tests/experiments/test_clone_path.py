"""The tests pass from a clone anywhere: clone this repository to a path of 120+ characters with a
space in it and run a fast subset there -- the tests whose output once depended on where the clone
was (the verl command's line folding), the registry, and the runner's refusals.

The clone is of the committed tree (``git clone``), so in CI it is exactly what was pushed; its own
``snippets`` is imported first (``PYTHONPATH``), not the one this environment has installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from run_support import ROOT

SUBSET = [
    "tests/unit/test_verl_sync.py::test_the_command_runs_as_a_module_and_folds_long_lines",
    "tests/experiments/test_registry.py",
    "tests/experiments/test_run.py::test_world_of_one_says_how_to_start_more_ranks",
    "tests/experiments/test_run.py::test_one_command_refusal_is_one_line_and_status_2",
]


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a git checkout"
)
def test_a_fast_subset_passes_from_a_long_path_with_a_space(tmp_path):
    parent = tmp_path / "a clone whose path is long and has spaces"
    parent = parent / ("x" * max(1, 120 - len(str(parent)) - len("/megatron-study")))
    clone = parent / "megatron-study"
    assert len(str(clone)) >= 120 and " " in str(clone)
    subprocess.run(["git", "clone", "--quiet", "--local", str(ROOT), str(clone)], check=True, timeout=120)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    where = subprocess.run(
        [sys.executable, "-c", "import snippets; print(snippets.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(clone)), where.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *SUBSET],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
