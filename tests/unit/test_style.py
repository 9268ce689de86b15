"""The habits the tree keeps: ruff's lint and format are clean, and tests are marked by their folder.

ruff is configured in ``pyproject.toml`` (``[tool.ruff]``; ``notes/`` is excluded, its ``.py`` files
are jupytext twins of stored notebooks). The pinned ruff of the ``[test]`` extra is the one run here:
another version may format differently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if not RUFF.exists():
        pytest.fail(f"{RUFF} not found: install the test extra (bash scripts/setup.sh)", pytrace=False)
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean():
    run = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert run.returncode == 0, f"ruff check found problems:\n{run.stdout}{run.stderr}"


def test_ruff_format_is_clean():
    run = _ruff("format", "--no-cache", "--check", ".")
    assert run.returncode == 0, f"ruff format would change files:\n{run.stdout}{run.stderr}"


def test_ruff_sees_the_code_but_not_the_notes():
    """Guards the configuration itself: a wrong exclude would make the two tests above vacuous."""
    run = _ruff("check", "--no-cache", "--show-files", ".")
    files = {Path(line).resolve() for line in run.stdout.splitlines() if line.strip()}
    assert ROOT / "snippets" / "__init__.py" in files
    assert ROOT / "tests" / "conftest.py" in files
    assert not [f for f in files if (ROOT / "notes") in f.parents]


def test_this_test_is_marked_unit(request):
    """tests/conftest.py marks each test with its folder: ``pytest -m unit`` keeps this one."""
    kinds = [
        kind for kind in ("unit", "ranks", "experiments", "site") if request.node.get_closest_marker(kind)
    ]
    assert kinds == ["unit"]


def test_the_marker_is_the_folder(request):
    """The hook itself, on items from every folder and from outside tests/ (a notebook)."""
    conftest = next(
        plugin
        for plugin in request.config.pluginmanager.get_plugins()
        if Path(getattr(plugin, "__file__", "") or "/").resolve() == ROOT / "tests" / "conftest.py"
    )

    class Item:
        def __init__(self, path):
            self.path, self.markers = path, []

        def add_marker(self, name):
            self.markers.append(name)

    items = [Item(ROOT / "tests" / kind / "test_x.py") for kind in conftest.KINDS]
    items += [Item(ROOT / "notes" / "01_training_run_overview.ipynb"), Item(ROOT / "tests" / "test_x.py")]
    conftest.pytest_collection_modifyitems(request.config, items)
    assert [item.markers for item in items] == [[kind] for kind in conftest.KINDS] + [[], []]
    assert set(conftest.KINDS) <= {line.split(":")[0] for line in request.config.getini("markers")}
