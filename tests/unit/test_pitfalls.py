"""The pitfall records: each is anchored at a real line of the pinned tag (and of main, given an
export), has a status at both, points at cells that exist; and the page's table and question are
built from them, a record declared on a note's cell included."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from snippets.site import pitfalls, sources

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data():
    return pitfalls.load()


def test_the_records_are_anchored_at_the_pin_and_read_as_recorded(data):
    assert data["tag"] == sources.TAG
    assert len(data["pitfalls"]) >= 30
    assert pitfalls.problems(data) == []


def test_each_pitfall_points_at_real_cells(data):
    recs = pitfalls.records(ROOT / "notes", data)
    ids = {}
    for path in (ROOT / "notes").glob("[0-9][0-9]_*.ipynb"):
        ids[path.name[:2]] = {c["id"] for c in json.loads(path.read_text(encoding="utf-8"))["cells"]}
    for pid, rec in recs.items():
        for number, cell in rec["cells"]:
            assert cell in ids.get(number, ()), f"pitfall {pid}: note {number} has no cell {cell}"


@pytest.mark.skipif(not os.environ.get("MEGATRON_SRC"), reason="set MEGATRON_SRC to an export of the tag")
def test_anchors_outside_the_package_against_an_export_of_the_tag(data):
    assert pitfalls.problems(data, src=Path(os.environ["MEGATRON_SRC"])) == []


@pytest.mark.skipif(
    not os.environ.get("MEGATRON_MAIN_SRC"), reason="set MEGATRON_MAIN_SRC to an export of the main commit"
)
def test_main_lines_against_an_export_of_the_main_commit(data):
    assert pitfalls.problems(data, main_src=Path(os.environ["MEGATRON_MAIN_SRC"])) == []


def _one(data, pid="blend-check-map"):
    return {**data, "pitfalls": {pid: copy.deepcopy(data["pitfalls"][pid])}}


def test_a_wrong_anchor_a_blank_line_or_a_missing_status_is_named(data):
    small = _one(data)
    assert pitfalls.problems(small) == []
    rec = small["pitfalls"]["blend-check-map"]
    path, line = rec["anchor"].rsplit(":", 1)
    rec["anchor"] = f"{path}:{int(line) + 1}"  # the next line: another statement
    assert "reads" in pitfalls.problems(small)[0]
    lines = sources.file_lines(path)
    blank = next(i + 1 for i, row in enumerate(lines) if not row.strip())
    rec["anchor"] = f"{path}:{blank}"
    assert "is blank" in pitfalls.problems(small)[0]
    rec["anchor"] = f"{path}:{line}"
    rec["status"] = "changed"
    assert "status must be" in pitfalls.problems(small)[0]
    assert "re-anchor" in pitfalls.problems({**small, "tag": "core_v0.16.1"})[0]


def _made_up_note(tmp_path: Path) -> Path:
    record = dict(id="made-up", title="一个新坑", expected="甲", observed="乙", anchor="megatron/core/x.py:3")
    cell = dict(id="c0ffee", cell_type="code", source="", outputs=[], execution_count=None)
    cell["metadata"] = {"tags": ["pitfall"], "pitfall": record}
    nb = dict(cells=[cell], metadata={}, nbformat=4, nbformat_minor=5)
    (tmp_path / "99_made_up.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    return tmp_path


def test_a_pitfall_declared_on_a_cell_appears_on_the_page(tmp_path):
    notes = _made_up_note(tmp_path)
    data = {"tag": sources.TAG, "main": {"commit": "f" * 40, "date": "2026-01-01"}, "pitfalls": {}}
    table = pitfalls.table(notes, data)
    assert "一个新坑" in table and "notes/99_made_up.ipynb#cell-id=c0ffee" in table
    assert sources.pinned_url("megatron/core/x.py", 3) in table and "**未核对**" in table
    # the data file completes it: its status at the tag and at main
    data["pitfalls"]["made-up"] = {
        "status": "fixed",
        "note": "修好了",
        "main": {"line": 5, "status": "fixed"},
    }
    table = pitfalls.table(notes, data)
    assert "**已修** [x.py:3]" in table and "修好了" in table
    assert pitfalls.main_url("f" * 40, "megatron/core/x.py", 5) in table
    quiz = pitfalls.self_test(notes, data)
    assert f"**{sources.TAG} 已修（1 个）**" in quiz and "第 1 行：一个新坑" in quiz
    assert "上与 " + sources.TAG + " 不同的（0 个）" in quiz


def test_the_real_table_has_one_row_per_record_in_note_order(data):
    table = pitfalls.table(ROOT / "notes", data)
    body = table.splitlines()[2:]
    assert len(body) == len(data["pitfalls"])
    firsts = [min(c[0] for c in r["cells"]) for r in pitfalls.rows(ROOT / "notes", data)]
    assert firsts == sorted(firsts)
    assert data["main"]["commit"][:10] in table.splitlines()[0]
