"""Every note: .py and .ipynb hold the same cells, every code cell ran in order and kept its
output, the roadmap template's headings are all there in order, and 自测 answers are folded."""

import ast
import functools
import json
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from snippets.site.new_note import HEADINGS  # the roadmap template, one list for site and tests

ROOT = Path(__file__).resolve().parents[2]
NOTES = sorted((ROOT / "notes").glob("[0-9][0-9]_*.py"))


def test_there_are_notes():
    assert NOTES, "no notes/NN_slug.py found"


@functools.lru_cache(maxsize=None)
def _read_pair(py: Path):
    """Each note's text and stored notebook, read (and schema-validated) once for all tests here."""
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{py.name} has no paired {ipynb.name}"
    return jupytext.read(py), nbformat.read(ipynb, as_version=4)


@pytest.fixture(params=NOTES, ids=lambda p: p.stem)
def pair(request):
    return _read_pair(request.param)


def test_py_and_ipynb_have_the_same_cells(pair):
    text, executed = pair
    a = [(c.cell_type, c.source.strip()) for c in text.cells]
    b = [(c.cell_type, c.source.strip()) for c in executed.cells]
    assert a == b, "run: jupytext --sync notes/NN_slug.py, then re-execute the notebook"


def _only_definitions(source: str) -> bool:
    body = ast.parse(source).body
    return all(
        isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))
        for n in body
    )


def test_every_code_cell_ran_in_order_and_kept_its_output(pair):
    _, executed = pair
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        "execute the whole notebook top to bottom once (jupyter nbconvert --execute --inplace)"
    )
    for cell in code:
        if not _only_definitions(cell.source):
            assert cell.outputs, f"no stored output for cell:\n{cell.source[:200]}"
        for out in cell.outputs:
            assert out.output_type != "error", f"a stored error in cell:\n{cell.source[:200]}"
            if out.output_type == "stream":
                assert out.name == "stdout", f"stderr stored in cell:\n{cell.source[:200]}"


def test_template_headings_in_order(pair):
    text, _ = pair
    found = [
        m.group(2).strip()
        for c in text.cells
        if c.cell_type == "markdown"
        for m in re.finditer(r"^(##) (.+)$", c.source, re.M)
    ]
    positions = []
    for heading in HEADINGS:
        assert heading in found, f"missing heading: ## {heading}"
        positions.append(found.index(heading))
    assert positions == sorted(positions), f"headings out of order: {found}"


def test_title_is_one_h1(pair):
    text, _ = pair
    h1 = [m for c in text.cells if c.cell_type == "markdown" for m in re.findall(r"^# .+$", c.source, re.M)]
    assert len(h1) == 1


def test_self_test_answers_are_folded_and_computed(pair):
    text, _ = pair
    cells = text.cells
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## 自测" in c.source)
    end = next(i for i, c in enumerate(cells) if "## 30-second answer" in c.source)
    section = cells[start:end]
    folded = sum(c.source.count("<details>") for c in section if c.cell_type == "markdown")
    computing = [c for c in section if c.cell_type == "code"]
    assert folded >= 3, "自测 needs at least 3 questions with <details> answers"
    assert len(computing) >= folded, "each folded answer is backed by a cell that computes it"


def test_no_volatile_output(pair):
    # nbval compares stored outputs: nothing that changes from run to run may be printed.
    _, executed = pair
    volatile = re.compile(r"0x[0-9a-f]{6,}|/tmp/|pid[ =:]\d+|\d+\.\d+ ?s\b|port[ =:]\d{3,}", re.I)
    for cell in executed.cells:
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + list(out.get("data", {}).values())
            for t in texts:
                t = t if isinstance(t, str) else "".join(t) if isinstance(t, list) else ""
                assert not volatile.search(t), f"volatile output: {volatile.search(t)[0]!r}"


PROSE_MARK = "<!-- same-as-next-output -->"


def _table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_prose_tables_equal_the_recorded_ones(pair):
    """A markdown table marked <!-- same-as-next-output --> is a claim typed by hand (e.g. a
    seed's table): it must equal, cell by cell, the table the next code cell printed."""
    _, executed = pair
    cells = executed.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or PROSE_MARK not in cell.source:
            continue
        claimed = _table_rows(cell.source.split(PROSE_MARK, 1)[1].split("\n\n", 1)[0])
        following = next(c for c in cells[i + 1 :] if c.cell_type == "code")
        printed = "".join("".join(out.get("data", {}).get("text/markdown", "")) for out in following.outputs)
        assert claimed and claimed == _table_rows(printed)


def test_executing_an_unknown_note_fails_fast_and_says_so():
    import subprocess

    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "execute_notes.sh"), "notes/99_missing.py"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "unknown note 'notes/99_missing.py'" in result.stderr
    assert "notes/02_distributed_initialization.py" in result.stderr  # lists the real ones


def _stored_svgs(ipynb: Path) -> list[str]:
    nb = json.loads(ipynb.read_text(encoding="utf-8"))
    return [
        "".join(out["data"]["image/svg+xml"])
        for cell in nb["cells"]
        for out in cell.get("outputs", [])
        if "image/svg+xml" in out.get("data", {})
    ]


@pytest.mark.parametrize("py", NOTES, ids=lambda p: p.stem)
def test_every_note_shows_a_picture_drawn_by_the_drawing_layer(py):
    """Issue 19: each note stores at least one picture, drawn by snippets.record.draw (class
    ms-figure), with a text alternative and no text under the site's minimum size."""
    import re

    from snippets.record.draw import MIN_FONT

    svgs = _stored_svgs(py.with_suffix(".ipynb"))
    assert svgs, f"{py.stem} stores no picture"
    for svg in svgs:
        assert 'class="ms-figure"' in svg, f"{py.stem}: a picture not drawn by snippets.record.draw"
        assert re.search(r"<title>[^<]+</title>", svg) and 'aria-label="' in svg, (
            f"{py.stem}: no text alternative"
        )
        sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
        assert all(s >= MIN_FONT for s in sizes), f"{py.stem}: text under {MIN_FONT} px"
