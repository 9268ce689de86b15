"""Drift report: which of the site's citations moved, changed or vanished in a newer Megatron-LM.

``python -m snippets.site.drift --new-src PATH [--old-src PATH]`` reads every pinned link the site
shows (notes, pages, README; both ends of a range) and every Megatron line the CPU patches need,
finds each cited symbol or statement in the checkout at ``PATH`` (any newer tag or commit) and
prints one row per citation:

- ``unchanged``: the symbol sits at the same line and its body (the definition and its indented
  block) is the same text; a statement: the same stripped text at the same line;
- ``moved``: same body (same statement) at another line;
- ``changed``: the body differs (``changed, moved`` when the line moved too); a statement whose
  text is no longer in the function that held it;
- ``vanished``: the file, the symbol, or the function that held the statement is gone;
- ``blank``: the cited line is blank at the tag: a blank line is no statement, the citation is wrong;
- ``unchecked``: no text at the tag to compare with -- files outside the pip package
  (``pretrain_gpt.py``, ``examples/``, ``tests/``) need ``--old-src`` (a checkout of the tag).

A statement is followed the way :mod:`snippets.site.repin` re-pins it (its
:func:`~snippets.site.repin.follow_statement` and :func:`~snippets.site.repin.owner_span`): by its
whole stripped text, never as a substring (``gradient_scaling_factor = ...`` is not found inside
``expert_gradient_scaling_factor = ...``), and only inside the function that held it at the tag,
found again by its qualified name (a statement at module level: in the module).

The text at the tag (:data:`sources.TAG`) is read from the installed ``megatron-core`` (since 0.19 its
wheel holds ``megatron/training`` too), else from ``--old-src``. A reader on a newer release re-reads
the rows that are not ``unchanged``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from snippets.site import sources

ROOT = Path(__file__).resolve().parents[2]


def _repin():
    # repin builds on this module (block, _find, _read): imported where it is used, not at the top,
    # so that neither module imports the other while it is being imported
    from snippets.site import repin

    return repin


@dataclass(frozen=True)
class Citation:
    path: str  # Megatron path, e.g. megatron/core/parallel_state.py
    line: int  # line at the pinned tag (sources.TAG)
    symbol: str | None  # a definition (def / class / assignment), or None for a statement
    text: str | None = None  # a CPU patch site's fragment, shown in the report (the whole line is followed)


@dataclass
class Row:
    citation: Citation
    status: str
    new_line: int | None
    cited_by: list[str] = field(default_factory=list)


def site_citations(root: Path = ROOT) -> dict[Citation, list[str]]:
    """Every citation the site makes, with the files that make it (a range: both its ends)."""
    from snippets.cpu import PATCHES

    repin = _repin()
    found: dict[Citation, list[str]] = defaultdict(list)
    for file in sources.citing_files(root):
        where = file.relative_to(root).as_posix()
        for group in repin.link_cites(file.read_text(encoding="utf-8"), sources.TAG):
            for c in group:
                found[Citation(c.path, c.line, c.symbol)].append(where)
    for patch in PATCHES:
        for site in patch.sites:
            found[Citation(site.path, site.line, None, site.text)].append(f"cpu_compat:{patch.name}")
    return {c: sorted(set(w)) for c, w in found.items()}


def _read(root: Path | None, path: str) -> list[str] | None:
    if root is None or not (root / path).is_file():
        return None
    return (root / path).read_text(encoding="utf-8", errors="replace").splitlines()


def block(lines: list[str], start: int) -> str:
    """The definition at 1-based ``start`` and its indented body, trailing blanks dropped."""
    first = lines[start - 1]
    indent = len(first) - len(first.lstrip())
    end = start
    depth = sum(first.count(c) for c in "([{") - sum(first.count(c) for c in ")]}")
    for i in range(start, len(lines)):
        line = lines[i]
        stripped = line.strip()
        if (
            stripped
            and depth <= 0
            and len(line) - len(line.lstrip()) <= indent
            and not stripped.startswith((")", "]", "}"))
        ):
            break
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        end = i + 1
    body = [text.rstrip() for text in lines[start - 1 : end]]
    while body and not body[-1]:
        body.pop()
    return "\n".join(body)


def _candidates(lines: list[str], symbol: str) -> list[int]:
    """1-based lines that define ``symbol`` (``Class.method`` looks inside the class first)."""
    start = 0
    *outer, name = symbol.split(".")
    for part in outer:
        start = next((i for i in range(start, len(lines)) if sources.defines(lines[i], part)), None)
        if start is None:
            return []
    return [i + 1 for i in range(start, len(lines)) if sources.defines(lines[i], name)]


def _find(new: list[str], symbol: str, old_body: str | None, old_line: int) -> int | None:
    # A name can be defined more than once (an example in a docstring, an overload): prefer the
    # definition whose body is unchanged, else the one nearest the old line.
    lines = _candidates(new, symbol)
    if not lines:
        return None
    same = [n for n in lines if old_body is not None and block(new, n) == old_body]
    return min(same or lines, key=lambda n: abs(n - old_line))


def check(citation: Citation, old_src: Path | None, new_src: Path) -> tuple[str, int | None]:
    """(status, line in the new checkout) for one citation."""
    old = _read(sources.installed_root(), citation.path) or _read(old_src, citation.path)
    new = _read(new_src, citation.path)
    if citation.symbol is None:
        return _check_statement(citation.line, old, new)
    if new is None:
        return "vanished", None
    old_body = block(old, citation.line) if old else None
    line = _find(new, citation.symbol, old_body, citation.line)
    if line is None:
        return "vanished", None
    if old_body is None:
        return ("unchecked" if line == citation.line else "moved"), line
    same = old_body == block(new, line)
    if same:
        return ("unchanged" if line == citation.line else "moved"), line
    return ("changed" if line == citation.line else "changed, moved"), line


def _check_statement(line: int, old: list[str] | None, new: list[str] | None) -> tuple[str, int | None]:
    """A statement: its whole stripped text at the tag, looked for in the function that held it."""
    if old is not None and (line > len(old) or not old[line - 1].strip()):
        return "blank", None
    if new is None:
        return "vanished", None
    if old is None:
        return "unchecked", None
    repin = _repin()
    if repin.owner_span(old, new, line) is None:
        return "vanished", None
    new_line = repin.follow_statement(old, new, line)
    if new_line is None:
        return "changed", None
    return ("unchanged" if new_line == line else "moved"), new_line


def report(
    new_src: Path,
    old_src: Path | None = None,
    root: Path = ROOT,
    citations: dict[Citation, list[str]] | None = None,
) -> list[Row]:
    citations = site_citations(root) if citations is None else citations
    rows = []
    for citation, cited_by in sorted(citations.items(), key=lambda kv: (kv[0].path, kv[0].line)):
        status, line = check(citation, old_src, new_src)
        rows.append(Row(citation, status, line, cited_by))
    return rows


ORDER = ["blank", "vanished", "changed, moved", "changed", "moved", "unchecked", "unchanged"]


def render(rows: list[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in ORDER}
    out = [
        f"{len(rows)} citations: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        "",
        f"| status | path | symbol or statement | {sources.TAG} | new | cited by |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (ORDER.index(r.status), r.citation.path, r.citation.line)):
        c = r.citation
        what = c.symbol or (f"`{c.text}`" if c.text else "(statement)")
        out.append(
            f"| {r.status} | {c.path} | {what} | {c.line} | {r.new_line or '-'} | {', '.join(r.cited_by)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.drift",
        description=f"Which cited Megatron lines moved, changed or vanished since {sources.TAG}.",
    )
    parser.add_argument(
        "--new-src", required=True, type=Path, help="a Megatron-LM checkout at a newer tag or commit"
    )
    parser.add_argument(
        "--old-src", type=Path, help=f"a checkout of {sources.TAG}, to compare files outside megatron/core"
    )
    args = parser.parse_args(argv)
    for name, src in (("--new-src", args.new_src), ("--old-src", args.old_src)):
        if src is not None and not (src / "megatron" / "core").is_dir():
            print(f"error: {name} {src} is not a Megatron-LM checkout (no megatron/core/)", file=sys.stderr)
            return 2
    try:
        print(render(report(args.new_src, args.old_src)))
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
