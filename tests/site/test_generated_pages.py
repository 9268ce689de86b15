"""Pages the hook generates from the notes: the self-test bank, the 30-second answers, the note map.

They are read from the notebooks at build time; these tests check that every question, answer and
cell link arrives on the built pages, and (on a throw-away notebook) that editing a note changes
the generated page, so the pages cannot drift from the notes.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pytest
from test_site import load_hook, parse, resolve

from conftest import fixture_mode

# The real notes' questions, answers and seed cells; the fixture note (MEGATRON_SITE_FIXTURE=1)
# is a bare sample that has none of them.
real_notes = pytest.mark.skipif(fixture_mode(), reason="checks the real notes, not the fixture")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hook():
    return load_hook()


def _page(site, name: str) -> str:
    return (site.dir / name / "index.html").read_text(encoding="utf-8")


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


@real_notes
def test_bank_has_every_question_of_every_note_with_a_landing_cell_link(site, note_names, hook):
    page = site.dir / "self_test" / "index.html"
    text = _page(site, "self_test")
    links = [url for tag, url in parse(page).links if tag == "a" and "#cell-id=" in url]
    for name in note_names:
        questions = hook.self_test(site.notes_dir / name)
        assert len(questions) >= 3, name
        for q in questions:
            assert q["cell_id"] and q["answer"], (name, q["number"])
            url = f"../notes/{Path(name).stem}/#cell-id={q['cell_id']}"
            assert url in links, (name, q["number"])
            target, fragment = resolve(site.dir, page, url)
            assert fragment in parse(target).ids, (name, q["number"])
            # the question's words reach the page (markup aside)
            words = _text(q["question"].replace("`", ""))[:12]
            assert words in _text(text), (name, words)


@real_notes
def test_seed_questions_each_resolve_to_a_cell_and_show_its_output(site, hook):
    text = _page(site, "self_test")
    notes = {int(p.name[:2]): p for p in site.notes_dir.glob("[0-9][0-9]_*.ipynb")}
    assert len(hook.SEED_QUESTIONS) == 5
    for question, number, needle in hook.SEED_QUESTIONS:
        cell = hook.find_cell(notes[number], needle)
        assert cell is not None, (number, needle)
        assert f"#cell-id={cell['id']}" in text
        assert cell.get("outputs"), (number, needle)
    assert text.count("<summary>运行结果</summary>") == 5


@real_notes
def test_answers_page_has_every_note_s_english_answer(site, note_names, hook):
    text = _text(_page(site, "answers"))
    for name in note_names:
        answer = hook.thirty_second_answer(site.notes_dir / name)
        assert len(answer.split()) >= 40, name  # an answer, not a heading
        plain = _text(re.sub(r"`", "", answer))
        assert plain[:60] in text, name


def _notebook(path: Path, answer: str) -> None:
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(6 * 7)")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 01 试验笔记"),
        nbformat.v4.new_markdown_cell(
            "## 自测\n\n**1. 6 乘 7 是多少？**\n\n<details><summary>答案</summary>\n\n"
            f"{answer}（见[笔记 02](../02_other/)）\n\n</details>"
        ),
        code,
        nbformat.v4.new_markdown_cell("## 30-second answer\n\nSix times seven is forty-two."),
    ]
    path.write_text(nbformat.writes(nb), encoding="utf-8")


def test_editing_a_note_changes_the_bank(tmp_path, hook):
    notes = tmp_path / "notes"
    notes.mkdir()
    nb = notes / "01_trial.ipynb"
    _notebook(nb, "是 42")
    bank = hook.self_test_bank(tmp_path)
    cell_id = json.loads(nb.read_text())["cells"][2]["id"]
    assert "**1. 6 乘 7 是多少？**" in bank and "是 42" in bank and "```text\n42\n```" in bank
    assert f"notes/01_trial.ipynb#cell-id={cell_id}" in bank
    assert "](notes/02_other.ipynb)" in bank  # a note-relative link, rewritten for the root page
    assert "Six times seven is forty-two." in hook.answers_page(tmp_path)
    _notebook(nb, "是四十二")
    changed = hook.self_test_bank(tmp_path)
    assert "是四十二" in changed and "是 42" not in changed


@real_notes
def test_note_map_says_what_each_note_runs(site, note_names, hook):
    home = _page(site, "")
    for name in note_names:
        runs = hook.what_it_runs(site.notes_dir / name)
        assert runs, name
        first = re.search(r"`([^`]+)`", runs)
        if first:
            assert f"<code>{first.group(1)}</code>" in home, name


def test_what_it_runs_reads_launches_and_imports(tmp_path, hook):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from megatron.core import parallel_state as ps\n"
            "from megatron.core.tensor_parallel import (ColumnParallelLinear,  # f inside\n"
            "    RowParallelLinear)\n"
            "out = run_ranks(step, 4, grid=dict(tp=2))\nmore = run_ranks(step, 2)\n"
        )
    ]
    path = tmp_path / "01_x.ipynb"
    path.write_text(nbformat.writes(nb), encoding="utf-8")
    assert hook.what_it_runs(path) == (
        "2、4 个 rank · `parallel_state`, `ColumnParallelLinear`, `RowParallelLinear`"
    )


def test_write_a_note_page_prints_the_template_the_checks_use(site):
    from snippets.site.new_note import SECTIONS

    text = _page(site, "write_a_note")
    rows = re.findall(r"<tr>\s*<td>(\d+)</td>\s*<td><code>## ([^<]+)</code></td>", text)
    assert [html.unescape(h) for _, h in rows] == [h for h, _ in SECTIONS]
    assert "python -m snippets.site.new_note" in _text(text)
