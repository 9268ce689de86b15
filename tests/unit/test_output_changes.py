"""snippets.site.output_changes: which cells' stored outputs changed against a git revision, on
made-up notebooks and a throw-away git repository."""

from __future__ import annotations

import json
import subprocess
import sys

from snippets.site import output_changes as oc


def _cell(cid: str, *outputs, kind: str = "code") -> dict:
    cell = {"id": cid, "cell_type": kind, "metadata": {}, "source": ""}
    if kind == "code":
        cell.update(outputs=list(outputs), execution_count=1)
    return cell


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def _result(plain: str, count: int = 1) -> dict:
    return {
        "output_type": "execute_result",
        "data": {"text/plain": plain},
        "metadata": {},
        "execution_count": count,
    }


def _nb(*cells) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


OLD = _nb(
    _cell("m1", kind="markdown"),
    _cell("a", _stream("rank 0: [0, 1]\nrank 1: [2, 3]\n")),
    _cell("b", _result("'same'")),
    _cell("c", _stream("gone\n")),
)
NEW = _nb(
    _cell("m1", kind="markdown"),
    _cell("a", _stream("rank 0: [0, 1]\nrank 1: [2, 4]\n")),
    _cell("b", _result("'same'", count=7)),  # another execution count: not a change
    _cell("d", _stream("new\n")),
)


def test_changed_new_and_removed_cells_with_their_first_differing_line():
    changes = oc.cell_changes(OLD, NEW)
    assert changes == [
        oc.CellChange("a", 1, "[stdout] rank 1: [2, 3]", "[stdout] rank 1: [2, 4]"),
        oc.CellChange("d", 3, None, "[stdout] new", "new"),
        oc.CellChange("c", 3, "[stdout] gone", None, "removed"),
    ]
    assert oc.cell_changes(NEW, NEW) == []


def test_a_longer_output_differs_at_its_first_extra_line():
    short = _nb(_cell("a", _stream("x\n")))
    longer = _nb(_cell("a", _stream("x\ny\n")))
    assert oc.cell_changes(short, longer) == [oc.CellChange("a", 0, None, "[stdout] y")]


def test_rich_outputs_and_errors_are_compared_as_text():
    svg = {
        "output_type": "display_data",
        "data": {"image/svg+xml": "<svg>\n<rect/>\n</svg>", "text/plain": "F"},
    }
    error = {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["..."]}
    lines = oc.output_lines(_cell("a", svg, error))
    assert lines == [
        "[image/svg+xml] <svg>",
        "[image/svg+xml] <rect/>",
        "[image/svg+xml] </svg>",
        "[text/plain] F",
    ] + ["[error] ValueError: bad"]


def _git(root, *args):
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_the_command_against_a_revision(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "01_one.ipynb").write_text(json.dumps(OLD))
    (notes / "02_two.ipynb").write_text(json.dumps(OLD))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "stored outputs")
    (notes / "01_one.ipynb").write_text(json.dumps(NEW))
    found = oc.compare(tmp_path, "HEAD")
    assert [len(found["01_one.ipynb"]), len(found["02_two.ipynb"])] == [3, 0]
    run = [sys.executable, "-m", "snippets.site.output_changes", "--root", str(tmp_path)]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert out == subprocess.run(run, capture_output=True, text=True, check=True).stdout  # deterministic
    assert out.splitlines()[0] == "01_one.ipynb: 3 cell(s) with changed outputs"
    assert "    - [stdout] rank 1: [2, 3]\n    + [stdout] rank 1: [2, 4]" in out
    assert out.splitlines()[-1] == "1 of 2 notes have changed outputs (3 cells) against HEAD"
    bad = subprocess.run([*run, "--base", "no-such-rev"], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a revision" in bad.stderr
