"""The note scaffold: a new note has the template, executes, and passes the checks every note must."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import subprocess
import sys

import jupytext
import nbformat
import pytest
import test_notes

from snippets.site.new_note import HEADINGS, SECTIONS, scaffold


def test_a_scaffolded_note_runs_and_passes_every_note_check(tmp_path):
    # The cells run here, in this process (torch and megatron are already imported, so no kernel
    # start and no import), and their printed output is stored the way an executed notebook
    # stores it; then the note goes through the same checks every note does.
    py = scaffold(24, "trial_note", "试验笔记", tmp_path)
    assert py.name == "24_trial_note.py"
    text = jupytext.read(py)
    executed = nbformat.from_dict(jupytext.read(py))
    namespace: dict = {}
    for count, cell in enumerate((c for c in executed.cells if c.cell_type == "code"), 1):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            *body, last = ast.parse(cell.source).body
            exec(compile(ast.Module(body, []), "<cell>", "exec"), namespace)
            if isinstance(last, ast.Expr):
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
                if value is not None:
                    print(getattr(value, "_repr_markdown_", lambda: repr(value))())
            else:
                exec(compile(ast.Module([last], []), "<cell>", "exec"), namespace)
        cell.execution_count = count
        cell.outputs = (
            [nbformat.v4.new_output("stream", name="stdout", text=out.getvalue())] if out.getvalue() else []
        )
    pair = (text, executed)
    for check in (
        test_notes.test_py_and_ipynb_have_the_same_cells,
        test_notes.test_every_code_cell_ran_in_order_and_kept_its_output,
        test_notes.test_template_headings_in_order,
        test_notes.test_title_is_one_h1,
        test_notes.test_self_test_answers_are_folded_and_computed,
        test_notes.test_no_volatile_output,
    ):
        check(pair)
    first_code = next(c for c in text.cells if c.cell_type == "code").source
    assert first_code.index("snippets") < first_code.index("megatron")
    table = next(c for c in executed.cells if c.cell_type == "code" and c.source.startswith('Table(["rank"'))
    assert "| 0 | 2 |" in table.outputs[0].text and "| 1 | 2 |" in table.outputs[0].text


def test_a_scaffolded_note_has_the_shape(tmp_path):
    """../shared/NOTE_SHAPE.md: the answer first, the machinery folded; the site's reading time
    and question come out of the scaffold as they will from the finished note."""
    py = scaffold(24, "trial_note", "试验笔记：一个副标题", tmp_path)
    cells = jupytext.read(py).cells
    for heading in HEADINGS:  # each of the template's headings once
        said = [
            c for c in cells if c.cell_type == "markdown" and re.search(rf"^## {heading}\s*$", c.source, re.M)
        ]
        assert len(said) == 1, (heading, len(said))
    goals = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## 阅读目标" in c.source)
    card = cells[goals].source
    # the 结论 block, visible (outside <details>), after the goals, with 4-6 facts, then the 先读 line
    assert "<details" not in card and card.index("1. ") < card.index("**结论**")
    facts = re.findall(r"^- ", card.split("**结论**", 1)[1], re.M)
    assert 4 <= len(facts) <= 6
    assert re.search(r"^先读：.*约 N 分钟。$", card, re.M)
    # right after it: the picture cell (code folded, output visible), then the folded howto box
    picture, howto = cells[goals + 1], cells[goals + 2]
    assert picture.cell_type == "code" and picture.metadata.get("tags") == ["hide-input"]
    assert "Figure(" in picture.source
    assert howto.cell_type == "markdown" and howto.source.startswith(
        "<details><summary>本页怎么跑出来的</summary>"
    )
    assert "scripts/execute_notes.sh notes/24_trial_note.py" in howto.source
    # 调用链: the long tree and the per-function records folded
    chain = next(c.source for c in cells if c.cell_type == "markdown" and "## 调用链" in c.source)
    assert (
        "<summary>完整调用链</summary>" in chain
        and "<summary>每个函数的记录（roadmap 七问）</summary>" in chain
    )
    assert "| 函数 | 输入 | 输出 |" in chain
    # 遗留问题 in two labelled parts, the CPU part folded
    rest = next(c.source for c in cells if c.cell_type == "markdown" and "## 遗留问题" in c.source)
    assert rest.index("**Megatron 的坑**") < rest.index("<details><summary>在 CPU 上怎么跑的</summary>")
    # the 自测 cells compute folded answers; a visible cell names Megatron's own class
    assert sum("answer" in c.metadata.get("tags", []) for c in cells) == 3
    shown = [c.source for c in cells if c.cell_type == "code" and not c.metadata.get("tags")]
    assert any("RankGenerator(" in src for src in shown)
    # the site reads the question and 先读 line the scaffold leaves
    hook = _hook()
    nb = tmp_path / "24_trial_note.ipynb"
    nbformat.write(nbformat.from_dict(jupytext.read(py)), nb)
    assert hook.note_question(nb).endswith("？") and "TODO" in hook.note_question(nb)
    assert hook.note_prerequisites(nb) == "代码地图"
    assert hook.reading_minutes(nb) >= 1


def _hook():
    from test_site import load_hook

    return load_hook()


def test_template_is_the_one_the_checks_use():
    assert test_notes.HEADINGS is HEADINGS and [h for h, _ in SECTIONS] == HEADINGS


@pytest.mark.parametrize(
    "number, slug, title, error",
    [
        (0, "x", "t", "1..99"),
        (24, "Bad-Slug", "t", "lower_snake_case"),
        (24, "ok", " ", "empty"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, number, slug, title, error):
    with pytest.raises(ValueError, match=error):
        scaffold(number, slug, title, tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_existing_number_is_refused_by_the_command(tmp_path):
    (tmp_path / "08_taken.py").write_text("", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "snippets.site.new_note", "8", "other", "标题", "--notes-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "note 08 already exists: 08_taken.py" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["08_taken.py"]
