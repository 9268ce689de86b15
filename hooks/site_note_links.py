"""Plain note numbers on docs pages become links to the notes (part of hooks/notes_site.py)."""

from __future__ import annotations

import re
from pathlib import Path

from site_nav import NOTES_DIR

# Docs pages (code map, CPU page) name notes by number in plain text ("笔记 21", "note 13",
# "笔记 02/08", a "对应笔记" column of "06、14"). At build time each number becomes a link to its
# note, so these pages link where they point (and show up in the graph). Code, existing links
# and headings are left alone.

NOTE_REF = re.compile(
    r"(?<![A-Za-z0-9_/#.])(笔记|[Nn]otes?)(\s?)(\d\d(?:\s?[/、,，–-]\s?\d\d)*)(?![0-9A-Za-z_%])"
)
TWO_DIGITS = re.compile(r"(?<!\d)\d\d(?!\d)")
PROTECTED = re.compile(r"```.*?```|`[^`\n]*`|\[[^\]\n]*\]\([^)\n]*\)|<[^>\n]+>|^#[^\n]*$", re.S | re.M)


def _link_numbers(text: str, present: dict[int, Path], prefix: str) -> str:
    return TWO_DIGITS.sub(
        lambda d: (
            f"[{d.group(0)}]({prefix}{NOTES_DIR}/{present[int(d.group(0))].name})"
            if int(d.group(0)) in present
            else d.group(0)
        ),
        text,
    )


def link_note_numbers(markdown: str, present: dict[int, Path], prefix: str = "") -> str:
    """``markdown`` with plain note numbers turned into links to the notes in ``present``."""
    out, pos = [], 0

    def plain(text: str) -> str:
        return NOTE_REF.sub(
            lambda m: m.group(1) + m.group(2) + _link_numbers(m.group(3), present, prefix), text
        )

    for m in PROTECTED.finditer(markdown):
        out += [plain(markdown[pos : m.start()]), m.group(0)]
        pos = m.end()
    out.append(plain(markdown[pos:]))
    return _link_note_columns("".join(out), present, prefix)


def _link_note_columns(markdown: str, present: dict[int, Path], prefix: str) -> str:
    """In a Markdown table with a column headed "对应笔记" / "笔记", link the numbers of that column."""
    lines = markdown.split("\n")
    column = None
    for k, line in enumerate(lines):
        if not line.startswith("|"):
            column = None
            continue
        cells = line.split("|")
        if column is None:
            names = [c.strip() for c in cells]
            column = next((i for i, c in enumerate(names) if c in ("对应笔记", "笔记")), -1)
            continue
        if column > 0 and column < len(cells) and not set(cells[column].strip()) <= set("-: "):
            if "](" not in cells[column]:
                cells[column] = _link_numbers(cells[column], present, prefix)
                lines[k] = "|".join(cells)
    return "\n".join(lines)
