"""The note scaffold: a new note has the template, executes, and passes the checks every note must."""

from __future__ import annotations

import ast
import contextlib
import io
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
    assert (
        "| 0 | 2 |" in executed.cells[[c.cell_type for c in executed.cells].index("code", 2)].outputs[0].text
    )


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
