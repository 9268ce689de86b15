"""The "到 core_v0.19.0 变了什么" data and the pitfall page: coverage of every note's citations,
the comparison rules on small made-up sources, and the hook's placement of the section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from snippets.site import changes, changes_page, pitfalls

ROOT = Path(__file__).resolve().parents[2]
NEW_NOTES = {"24", "25"}  # being written while the data was generated: regenerate to cover them


@pytest.fixture(scope="module")
def data():
    return changes.load()


@pytest.fixture(scope="module")
def cited():
    return changes.note_citations(ROOT)


def test_every_citation_a_note_makes_is_in_the_data(data, cited):
    missing = {k: v["notes"] for k, v in cited.items() if k not in data["citations"]}
    stale = {
        k: sorted(set(v["notes"]) - set(data["citations"][k]["notes"]))
        for k, v in cited.items()
        if k in data["citations"] and not set(v["notes"]) <= set(data["citations"][k]["notes"])
    }
    notes = sorted({n for ns in [*missing.values(), *stale.values()] for n in ns})
    assert not missing and not stale, (
        f"notes {notes} cite Megatron lines that changes_v019.json does not cover "
        f"({'new notes ' + str(sorted(NEW_NOTES & set(notes))) + '; ' if NEW_NOTES & set(notes) else ''}"
        "regenerate: python -m snippets.site.changes --megatron-src PATH_AT_0.19.0 --old-src PATH_AT_0.16.1): "
        f"{dict(list(missing.items())[:5])} {dict(list(stale.items())[:5])}"
    )


def test_records_hold_only_statuses_lines_and_short_facts(data):
    allowed = {"line", "status", "new_line", "new_path", "owner_line", "signature", "notes"}
    for key, record in data["citations"].items():
        assert set(record) <= allowed and record["status"] in changes.STATUSES, key
        if record["status"] == "vanished" or "::" in key:  # a statement may have no single new line
            assert (record["new_line"] is None) == (record["status"] == "vanished"), key
    for key, text in changes.load_facts()["facts"].items():
        assert key in data["citations"], f"a fact for {key}, which no note cites"
        assert len(text) <= 400 and "\n" not in text, key


def test_each_pitfall_points_at_a_real_cell_and_has_a_019_status(data):
    recs = pitfalls.records(ROOT / "notes", changes.load_facts())
    assert len(recs) >= 20
    ids = {}
    for path in (ROOT / "notes").glob("[0-9][0-9]_*.ipynb"):
        ids[path.name[:2]] = {c["id"] for c in json.loads(path.read_text(encoding="utf-8"))["cells"]}
    for pid, rec in recs.items():
        for number, cell in rec["cells"]:
            assert cell in ids.get(number, ()), f"pitfall {pid}: note {number} has no cell {cell}"
        assert pid in data["pitfalls"], f"pitfall {pid} has no core_v0.19.0 status: regenerate"
        assert pitfalls.status_019(rec, data["pitfalls"][pid])[0] in changes_page.KIND


OLD = """\
def keep(a, b=1):
    x = a + b
    return x


def shifted(a, b):
    y = a * b
    return y


def drops(a):
    z = a - 1
    return z


def gone():
    return 0
"""

NEW = """\
def keep(a, b=1):
    x = a + b
    return x


def shifted(a, c, b):
    '''a new docstring line'''
    y = a * b
    return y


def drops(a):
    return a
"""


def test_statements_are_followed_inside_their_function():
    old, new = OLD.splitlines(), NEW.splitlines()
    assert changes.follow_statement(old, new, 2, "x = a + b") == ("unchanged", 2)
    assert changes.follow_statement(old, new, 7, "y = a * b") == ("moved", 8)
    assert changes.follow_statement(old, new, 12, "z = a - 1") == ("changed", None)
    assert changes.owner_line(old, new, 12) == 12  # where to re-read it
    assert changes.follow_statement(old, new, 17, "return 0") == ("vanished", None)


def test_signature_changes_name_what_a_caller_must_change():
    old, new = OLD.splitlines(), NEW.splitlines()
    import snippets.site.drift as drift

    inserted = changes.signature_change(drift.block(old, 6), drift.block(new, 6))
    assert inserted == {"added": ["c"], "order": True}
    assert "旧的按位置传参会对不上" in changes_page.signature_sentence(inserted)
    assert changes.signature_change(drift.block(old, 1), drift.block(new, 1)) is None
    forwarded = changes.signature_change("def f(a, b=2):\n    pass", "def f(*args, **kwargs):\n    pass")
    assert forwarded == {"forwarded": True}
    fields = changes.signature_change(
        "class C:\n    a: int = 1\n    b: int = 2", "class C:\n    n: int = 0\n    a: int = 1\n    b: int = 3"
    )
    assert fields == {"added": ["n"], "defaults": {"b": ["2", "3"]}}  # fields: no positional order


def _hook():
    spec = importlib.util.spec_from_file_location("changes_hook", ROOT / "hooks" / "changes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hook_puts_the_section_before_the_self_test_cell():
    hook = _hook()
    page = (
        '<div id="cell-id=a1" class="jp-Cell jp-MarkdownCell"><h2 id="遗留问题">遗留问题</h2></div>\n'
        '<div id="cell-id=b2" class="jp-Cell jp-MarkdownCell"><p>x</p><h2 id="自测">自测</h2></div>'
    )
    out = hook.insert_section(page, "<SECTION/>")
    assert out.index("遗留问题") < out.index("<SECTION/>") < out.index('id="cell-id=b2"')
    assert hook.insert_section("<p>no self-test</p>", "<SECTION/>") is None


def test_a_note_section_lists_every_citation_and_the_facts_that_matter(data):
    facts = changes.load_facts()["facts"]
    section = changes_page.note_section("02", data, facts)
    cited = [k for k, r in data["citations"].items() if "02" in r["notes"]]
    assert section.startswith(f"## {changes_page.HEADING}")
    assert f"逐条对照（{len(cited)} 处引用）" in section
    assert facts["megatron/core/parallel_state.py::initialize_model_parallel"] in section
    assert section.count("\n| [") == len(cited)


def test_a_pitfall_declared_on_a_cell_appears_on_the_page(tmp_path):
    record = dict(id="made-up", title="一个新坑", expected="甲", observed="乙", anchor="megatron/core/x.py:3")
    cell = dict(id="c0ffee", cell_type="code", source="", outputs=[], execution_count=None)
    cell["metadata"] = {"tags": ["pitfall"], "pitfall": record}
    nb = dict(cells=[cell], metadata={}, nbformat=4, nbformat_minor=5)
    (tmp_path / "99_made_up.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    data = {"citations": {}, "pitfalls": {"made-up": {"status": "moved", "new_line": 7}}}
    table = changes_page.pitfall_table(tmp_path, data, {"pitfalls": {}})
    assert "一个新坑" in table and "notes/99_made_up.ipynb#cell-id=c0ffee" in table and "x.py:7" in table
    quiz = changes_page.pitfall_self_test(tmp_path, data, {"pitfalls": {}})
    assert "**仍在（1 个）**" in quiz and "第 1 行：一个新坑" in quiz


def test_a_citation_newer_than_the_data_shows_as_unchecked(data):
    current = {"megatron/core/made_up.py::new_symbol": {"line": 7, "notes": ["02"]}}
    section = changes_page.note_section("02", data, {}, current)
    assert "另有 1 处是数据生成之后新加的引用，还没有对照。" in section
    assert "| [made\\_up.py::new\\_symbol]" in section and "| — | 未核对 |" in section
