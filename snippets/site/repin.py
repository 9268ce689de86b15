"""Re-pin every Megatron-LM citation to a newer tag, by symbol: the mechanical half of a version bump.

``python -m snippets.site.repin --old-src OLD --new-src NEW --new-tag core_vX.Y.Z [--decisions FILE] [--write]``

``OLD`` and ``NEW`` are exports (or checkouts) of the current tag (:data:`sources.TAG`) and the new
one. Every citation the site makes is followed from ``OLD`` to ``NEW``:

- a *definition* link (``file.py::Class.method``) goes to the line that defines that name at the new
  tag (the one whose body is unchanged when the name is defined twice, else the nearest);
- a *statement* link (``file.py:N``, ``file.py 第 N 行``, ranges too) goes to the line with the same
  text (stripped, compared whole, never as a substring) inside the function that held it at the
  old tag, found again by its qualified name; a statement at module level is followed in the module.

A citation that cannot be followed (its text changed, its function vanished, its file moved) is
listed with the old line's text and the closest lines of the new function, and nothing is written:
decide each one in a JSON file (``{"path:old_line": new_line_or_null}``; ``null`` means the citing
text must be rewritten by hand) and run again with ``--decisions FILE``. ``--write`` then rewrites
the links (URL tag, ``#L`` anchors and the ``file.py:N`` text) in the notes, the pages and the
README, the CPU layer's :class:`~snippets.cpu.base.Site` lines, and ``pinned_lines.json``.

What it does not do: re-read the prose. A statement that moved unchanged is still a statement in a
function that may have changed around it: the drift report (:mod:`snippets.site.drift`) lists them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from snippets.site import drift, sources

ROOT = drift.ROOT
CPU_DIR = ROOT / "snippets" / "cpu"
SITE_RE = re.compile(r'Site\(\s*"(?P<path>[^"]+)",\s*(?P<line>\d+),', re.S)


@dataclass(frozen=True)
class Cite:
    path: str
    line: int
    symbol: str | None  # None: a statement


def _lines(src: Path, path: str) -> list[str] | None:
    return drift._read(src, path)


def enclosing(lines: list[str], line: int) -> int | None:
    """1-based line of the def / class whose body holds ``line`` (None at module level)."""
    text = lines[line - 1]
    indent = len(text) - len(text.lstrip())
    for i in range(line - 2, -1, -1):
        row = lines[i]
        if row.strip() and len(row) - len(row.lstrip()) < indent:
            if re.match(r"\s*(async\s+)?(def|class)\s", row):
                return i + 1
            if row.lstrip().startswith((")", "]", "}")):
                continue  # the close of a multi-line signature or call: its opener is further up
            indent = len(row) - len(row.lstrip())
            if indent == 0:
                return None
    return None


def qualname(lines: list[str], line: int) -> str:
    names, at = [], line
    while at is not None:
        names.append(re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", lines[at - 1]).group(1))
        at = enclosing(lines, at)
    return ".".join(reversed(names))


def follow_definition(old: list[str], new: list[str], line: int, symbol: str) -> int | None:
    body = drift.block(old, line) if line <= len(old) else None
    return drift._find(new, symbol, body, line)


def owner_span(old: list[str], new: list[str], line: int) -> tuple[int, int] | None:
    """(first, last) 1-based lines at the new tag of the function that held ``line`` at the old
    tag; the whole module for a module-level statement; None when the function vanished."""
    owner = enclosing(old, line)
    if owner is None:
        return 1, len(new)
    start = drift._find(new, qualname(old, owner), drift.block(old, owner), owner)
    if start is None:
        return None
    return start, start + drift.block(new, start).count("\n")


def follow_statement(old: list[str], new: list[str], line: int) -> int | None:
    """The new line of statement ``line``: the same stripped text, inside the same function."""
    text = old[line - 1].strip()
    span = owner_span(old, new, line)
    if span is None or not text:
        return None
    first, last = span
    hits = [n for n in range(first, last + 1) if new[n - 1].strip() == text]
    if not hits:
        return None
    owner = enclosing(old, line) or 1
    # The same text can occur more than once in a function: prefer the hit whose neighbours are
    # the old line's neighbours, then the one at the same offset from the function's start.
    return min(hits, key=lambda n: (-_same_neighbours(old, line, new, n), abs((n - first) - (line - owner))))


def _same_neighbours(old: list[str], line: int, new: list[str], at: int, reach: int = 3) -> int:
    """How many of the ``reach`` non-blank lines before and after match, old around ``line`` and new
    around ``at``."""

    def around(lines: list[str], n: int, step: int) -> list[str]:
        out, i = [], n - 1 + step
        while 0 <= i < len(lines) and len(out) < reach:
            if lines[i].strip():
                out.append(lines[i].strip())
            i += step
        return out

    return sum(a == b for step in (-1, 1) for a, b in zip(around(old, line, step), around(new, at, step)))


def suggestions(old: list[str], new: list[str], line: int, k: int = 3) -> list[tuple[int, str]]:
    """The ``k`` lines of the new function most like the old statement (to decide by hand)."""
    span = owner_span(old, new, line) or (1, len(new))
    text = old[line - 1].strip()
    scored = [
        (difflib.SequenceMatcher(None, text, new[n - 1].strip()).ratio(), n)
        for n in range(span[0], span[1] + 1)
        if new[n - 1].strip()
    ]
    return [(n, new[n - 1].strip()) for _, n in sorted(scored, reverse=True)[:k]]


def follow(c: Cite, old_src: Path, new_src: Path) -> int | None:
    old, new = _lines(old_src, c.path), _lines(new_src, c.path)
    if old is None or new is None or c.line > len(old):
        return None
    if c.symbol:
        return follow_definition(old, new, c.line, c.symbol)
    return follow_statement(old, new, c.line)


# ------------------------------------------------------------------------ what the site cites

LINK_ANY = re.compile(
    r"\[(?P<text>[^\]]+)\]\(https://github\.com/NVIDIA/Megatron-LM/blob/(?P<tag>[\w.]+)/"
    r"(?P<path>[^)#\s]+)(?:#L(?P<line>\d+)(?:-L(?P<end>\d+))?)?\)"
)


def citing_files(root: Path) -> list[Path]:
    return sources.citing_files(root)


def link_cites(text: str, tag: str) -> list[tuple[Cite, ...]]:
    """The citations in one text: one tuple per link (two when the link is a range)."""
    out = []
    for m in LINK_ANY.finditer(text):
        if m["tag"] != tag or not m["line"]:
            continue
        statement = sources.STATEMENT_RE.fullmatch(m["text"].strip())
        symbol = None if statement else sources.symbol_of(m["text"])
        first = Cite(m["path"], int(m["line"]), symbol)
        if m["end"]:
            out.append((first, Cite(m["path"], int(m["end"]), None)))
        else:
            out.append((first,))
    return out


def site_cites(root: Path, tag: str) -> set[Cite]:
    found: set[Cite] = set()
    for f in citing_files(root):
        for group in link_cites(f.read_text(encoding="utf-8"), tag):
            found.update(group)
    for f in sorted(CPU_DIR.glob("*.py")):
        for m in SITE_RE.finditer(f.read_text(encoding="utf-8")):
            found.add(Cite(m["path"], int(m["line"]), None))
    for e in json.loads(sources.PINNED_FILE.read_text()):
        found.add(Cite(e["path"], e["line"], e["symbol"]))
    return found


# ------------------------------------------------------------------------ rewriting


def _rewrite_link(m: re.Match, tag: str, new_tag: str, moves: dict[tuple[str, int], int]) -> str:
    if m["tag"] != tag:
        return m.group(0)
    path, text = m["path"], m["text"]
    if not m["line"]:
        return m.group(0).replace(f"/blob/{tag}/", f"/blob/{new_tag}/")
    if (path, int(m["line"])) not in moves or (m["end"] and (path, int(m["end"])) not in moves):
        return m.group(0)  # left open (--partial): stays on the old tag
    first = moves[(path, int(m["line"]))]
    anchor = f"#L{first}"
    if m["end"]:
        last = moves[(path, int(m["end"]))]
        anchor += f"-L{last}"
    else:
        last = None
    statement = sources.STATEMENT_RE.fullmatch(text.strip())
    if statement:
        old_first = statement["line"] or statement["line_zh"]
        old_end = statement["end"] or statement["end_zh"]
        span = statement.span("line") if statement["line"] else statement.span("line_zh")
        lead = len(text) - len(text.lstrip())
        new_text = text[: lead + span[0]] + str(first) + text[lead + span[1] :]
        if old_end:
            end_span = statement.span("end") if statement["end"] else statement.span("end_zh")
            shift = len(str(first)) - len(old_first)
            a, b = lead + end_span[0] + shift, lead + end_span[1] + shift
            new_text = new_text[:a] + str(last if last is not None else first) + new_text[b:]
        text = new_text
    return f"[{text}](https://github.com/NVIDIA/Megatron-LM/blob/{new_tag}/{path}{anchor})"


def rewrite_text(text: str, tag: str, new_tag: str, moves: dict[tuple[str, int], int]) -> str:
    return LINK_ANY.sub(lambda m: _rewrite_link(m, tag, new_tag, moves), text)


def rewrite_sites(text: str, moves: dict[tuple[str, int], int]) -> str:
    def sub(m: re.Match) -> str:
        new = moves.get((m["path"], int(m["line"])))
        if new is None:
            return m.group(0)
        return m.group(0).replace(f"{m['line']},", f"{new},", 1)

    return SITE_RE.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.repin", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--old-src", required=True, type=Path, help=f"an export of {sources.TAG}")
    parser.add_argument("--new-src", required=True, type=Path, help="an export of the new tag")
    parser.add_argument("--new-tag", required=True, help="the new tag, e.g. core_v0.19.0")
    parser.add_argument("--decisions", type=Path, help='JSON {"path:old_line": new_line or null}')
    parser.add_argument("--write", action="store_true", help="rewrite the files (else only report)")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="with --write: rewrite what was followed and leave the open citations on the old tag",
    )
    args = parser.parse_args(argv)
    for name, src in (("--old-src", args.old_src), ("--new-src", args.new_src)):
        if not (src / "megatron" / "core").is_dir():
            print(f"repin: {name} {src} is not a Megatron-LM export (no megatron/core/)", file=sys.stderr)
            return 2
    if not re.fullmatch(r"core_v\d+\.\d+\.\d+", args.new_tag):
        print(f"repin: --new-tag {args.new_tag!r} is not a release tag like core_v0.19.0", file=sys.stderr)
        return 2
    decisions: dict[str, int | None] = {}
    if args.decisions:
        try:
            decisions = json.loads(args.decisions.read_text())
        except (OSError, ValueError) as e:
            print(f"repin: cannot read --decisions {args.decisions}: {e}", file=sys.stderr)
            return 2
    tag = sources.TAG
    moves: dict[tuple[str, int], int] = {}
    open_: list[str] = []
    counts = {"same line": 0, "moved": 0, "decided": 0, "open": 0}
    for c in sorted(site_cites(ROOT, tag), key=lambda c: (c.path, c.line, c.symbol or "")):
        key = f"{c.path}:{c.line}"
        if key in decisions:
            if decisions[key] is None:
                open_.append(f"{key}: decided null -- rewrite the citing text by hand")
                counts["open"] += 1
                continue
            moves[(c.path, c.line)] = int(decisions[key])
            counts["decided"] += 1
            continue
        new_line = follow(c, args.old_src, args.new_src)
        if new_line is None:
            old = _lines(args.old_src, c.path)
            new = _lines(args.new_src, c.path)
            what = c.symbol or (old[c.line - 1].strip() if old and c.line <= len(old) else "?")
            rows = [f"{key} [{what}]"]
            if old and new and c.line <= len(old):
                rows += [f"    candidate {n}: {t}" for n, t in suggestions(old, new, c.line)]
            elif new is None:
                rows.append("    file gone at the new tag")
            open_.append("\n".join(rows))
            counts["open"] += 1
            continue
        if (c.path, c.line) in moves and moves[(c.path, c.line)] != new_line:
            # the same line cited as a symbol and as a statement: the definition wins
            if c.symbol is None:
                continue
        moves[(c.path, c.line)] = new_line
        counts["same line" if new_line == c.line else "moved"] += 1
    print(", ".join(f"{n} {k}" for k, n in counts.items()))
    if open_:
        print("\n".join(open_))
        if not (args.write and args.partial):
            print(f"repin: {len(open_)} citation(s) to decide (--decisions FILE); nothing written")
            return 1
        print(f"repin: {len(open_)} citation(s) left on {tag}: fix each link by hand")
    if not args.write:
        return 0
    for f in citing_files(ROOT):
        text = f.read_text(encoding="utf-8")
        new = rewrite_text(text, tag, args.new_tag, moves)
        if new != text:
            f.write_text(new, encoding="utf-8")
    for f in sorted(CPU_DIR.glob("*.py")):
        text = f.read_text(encoding="utf-8")
        new = rewrite_sites(text, moves)
        if new != text:
            f.write_text(new, encoding="utf-8")
    entries = json.loads(sources.PINNED_FILE.read_text())
    for e in entries:
        e["line"] = moves.get((e["path"], e["line"]), e["line"])
    entries.sort(key=lambda e: (e["path"], e["line"]))
    sources.PINNED_FILE.write_text(
        "[\n" + ",\n".join(" " + json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n"
    )
    print(f"repin: rewritten to {args.new_tag}; now set sources.TAG and re-execute the notes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
