"""Tables that render as real tables on the site and stay checkable by nbval.

A :class:`Table` shown in a notebook produces two outputs: ``text/markdown`` (which the site
renders as an HTML table) and ``text/plain`` (the same markdown text). nbval compares both, so a
changed cell of any table fails the notebook check.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def _cell(value: Any) -> str:
    if isinstance(value, float):
        value = round(value, 4)
    text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


class Table:
    """A markdown table with ``headers`` and ``rows`` (any values; floats rounded to 4 places)."""

    def __init__(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str = ""):
        self.headers = list(headers)
        self.rows = [list(r) for r in rows]
        self.title = title
        for row in self.rows:
            if len(row) != len(self.headers):
                raise ValueError(f"row {row} has {len(row)} cells, headers have {len(self.headers)}")

    def markdown(self) -> str:
        lines = []
        if self.title:
            lines += [f"**{self.title}**", ""]
        lines.append("| " + " | ".join(_cell(h) for h in self.headers) + " |")
        lines.append("|" + "---|" * len(self.headers))
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.markdown()

    def column(self, header: str) -> list:
        i = self.headers.index(header)
        return [row[i] for row in self.rows]
