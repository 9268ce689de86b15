"""scripts/upstream/summary.py: the counts docs/cpu.md shows, from rank 0's results as they ended."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _summary():
    spec = importlib.util.spec_from_file_location("upstream_summary", ROOT / "scripts/upstream/summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_each_test_once_by_how_it_ended(tmp_path, capsys):
    f = "tests/unit_tests/test_parallel_state.py"
    rows = [
        {"id": f"{f}::flaky_one", "outcome": "deselected", "message": "marked flaky and flaky_in_dev"},
        *({"id": f"{f}::{name}", "outcome": "collected"} for name in ("a", "b", "c", "d", "e")),
        {"id": f"{f}::a", "outcome": "passed"},
        {"id": f"{f}::b", "outcome": "passed"},
        {"id": f"{f}::b", "outcome": "failed", "message": "RuntimeError: in teardown\nmore"},
        {"id": f"{f}::c", "outcome": "skipped", "message": "needs TE"},
        {"id": f"{f}::d", "outcome": "passed"},
        # e: still running when the area's time bound ended it
    ]
    (tmp_path / "parallel_state.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _summary().main(tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| file | passed | failed | skipped | deselected | not reached |"
    assert out[2] == "| `test_parallel_state.py` | 2 | 1 | 1 | 1 | 1 |"
    assert out[3] == "| **total** | 2 | 1 | 1 | 1 | 1 |"
    assert out[4:] == ["- `test_parallel_state.py::b`: RuntimeError: in teardown"]
