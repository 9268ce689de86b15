"""Prose never cites a source line in plain text: every ``file.py 第 N 行`` / ``file.py:N`` in a
note's markdown cells or a docs page is a link (to the pinned tag, so test_citations checks it)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LINE_REF = re.compile(r"[\w/.-]*\w\.py`?\s*(?:第\s*\d+|:\d+)")
"""``schedules.py 第 144–150 行``, ``layers.py:920``, ``optimizer/`__init__.py` 第 591 行``."""

LINK = re.compile(r"\[[^\]]*\]\([^)\s]*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)  # code blocks: a call chain's comments, not prose


def markdown_of_note(py: Path) -> str:
    """The markdown cells of a jupytext percent note, without their ``# `` prefix."""
    cells, current = [], None
    for line in py.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            current = [] if "[markdown]" in line else None
            if current is not None:
                cells.append(current)
        elif current is not None:
            current.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n\n".join("\n".join(c) for c in cells)


def unlinked(text: str) -> list[str]:
    """Plain-text line references left in ``text`` once links and fenced code are set aside."""
    prose = LINK.sub("", FENCE.sub("", text))
    return [m.group(0) for m in LINE_REF.finditer(prose)]


def prose_files() -> dict[str, str]:
    notes = sorted((ROOT / "notes").glob("[0-9][0-9]_*.py"))
    docs = sorted(
        p for p in (ROOT / "docs").rglob("*.md") if not any(q.is_symlink() for q in (p, *p.parents))
    )
    return {
        **{p.relative_to(ROOT).as_posix(): markdown_of_note(p) for p in notes},
        **{p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in docs},
    }


def test_the_finder_sees_what_it_must():
    assert unlinked(
        "（schedules.py 第 144–150 行）与 `gpt_layer_specs.py:417`、optimizer/`__init__.py` 第 591 行"
    ) == [
        "schedules.py 第 144",
        "gpt_layer_specs.py:417",
        "__init__.py` 第 591",
    ]
    url = (
        "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py"
    )
    assert unlinked(f"（[schedules.py 第 144–150 行]({url}#L144-L150)）") == []
    assert unlinked("```text\nforward_step  # schedules.py:269\n```") == []


def test_a_note_cell_is_read_as_prose(tmp_path):
    note = tmp_path / "99_x.py"
    note.write_text("# %% [markdown]\n# 见 layers.py 第 920 行\n\n# %%\nx = 1  # layers.py:920\n")
    assert unlinked(markdown_of_note(note)) == ["layers.py 第 920"]


def test_no_plain_text_line_reference_in_prose():
    found = {name: refs for name, text in prose_files().items() if (refs := unlinked(text))}
    assert not found, (
        f"make each a pinned link (https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/PATH#LN): {found}"
    )
