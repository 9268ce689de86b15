"""What changed at ``core_v0.19.0`` for each note's citations: the data behind every note's
"到 core_v0.19.0 变了什么" section and the pitfall page's 0.19 column.

The notes run ``megatron-core==0.16.1`` (the last release that installs on Python 3.11; 0.17.0
and later need Python >= 3.12). This module compares every citation a note makes with a checkout
of the newer tag through :mod:`snippets.site.drift` and keeps, per citation, only what a page
needs: the status (``unchanged`` / ``moved`` / ``changed`` / ``vanished``), the line at both tags
and, for a function or a class whose signature changed, which parameters were added, removed or
got another default (names and short default values, never Megatron's code).

Two data files sit next to this module:

- ``changes_v019.json`` is generated, never edited by hand::

      python -m snippets.site.changes --megatron-src /tmp/mlm-0.19 --old-src /tmp/mlm-0.16.1

  (``--old-src``, a checkout of ``core_v0.16.1``, is needed for the files outside the pip
  package: ``megatron/training``, ``examples``, ``pretrain_gpt.py``.)
- ``changes_v019_facts.json`` is written by hand: ``facts`` says in our own words, per symbol
  (``path::symbol``, or ``path:line`` for a statement), what would break or mean something
  else for a reader of the note; ``pitfalls`` holds the pitfall records (see
  :mod:`snippets.site.pitfalls`). The generator reads it to follow each pitfall's anchor line.

A statement citation (``path.py:LINE``) is followed inside the function that encloses it at
0.16.1: it is ``unchanged`` / ``moved`` while its text is still in that function, ``changed``
when the text is gone from it, ``vanished`` with the function.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import textwrap
from pathlib import Path

from snippets.site import drift, sources

NEW_TAG = "core_v0.19.0"
NEW_BLOB = f"{sources.REPO_URL}/blob/{NEW_TAG}/"
HERE = Path(__file__).resolve().parent
DATA_FILE = HERE / "changes_v019.json"
FACTS_FILE = HERE / "changes_v019_facts.json"
NOTE_FILE = re.compile(r"notes/(\d\d)_[A-Za-z0-9_]+\.py$")
STATUSES = ("unchanged", "moved", "changed", "vanished")


def new_url(path: str, line: int | None = None) -> str:
    return NEW_BLOB + path + (f"#L{line}" if line else "")


def key(path: str, symbol: str | None, line: int) -> str:
    """How data and facts name a citation: ``path::symbol``, or ``path:line`` for a statement."""
    return f"{path}::{symbol}" if symbol else f"{path}:{line}"


def citation_key(text: str, path: str, line: int) -> str:
    """The key of one link: a symbol when the text names one that the line defines (checked in
    the installed package, or in ``pinned_lines.json`` outside it), else the statement line."""
    statement = getattr(sources, "STATEMENT_RE", drift.STATEMENT)
    symbol = None if statement.fullmatch(text.strip()) else sources.symbol_of(text)
    if symbol:
        if path.startswith("megatron/core/"):
            lines = sources.file_lines(path)
            ok = line <= len(lines) and sources.defines(lines[line - 1], symbol.split(".")[-1])
        else:
            ok = sources.pinned_lines().get((path, symbol)) == line
        if not ok:
            symbol = None
    return key(path, symbol, line)


def note_citations(root: Path = drift.ROOT) -> dict[str, dict]:
    """Every citation a note makes, by key: its line at the tag and the notes (``NN``) that make
    it. Parsed from the notes' text the way :mod:`snippets.site.sources` does; pure Python."""
    found: dict[str, dict] = {}
    for where, text, path, line in sources.cited_links(root):
        m = NOTE_FILE.fullmatch(where)
        if m is None or line is None:
            continue
        entry = found.setdefault(citation_key(text, path, line), {"line": line, "notes": set()})
        entry["notes"].add(m.group(1))
    return {k: {"line": v["line"], "notes": sorted(v["notes"])} for k, v in found.items()}


# ------------------------------------------------------------------------------ comparing


def _enclosing(lines: list[str], line: int) -> int | None:
    """1-based line of the def / class that encloses statement ``line`` (None at module level)."""
    text = lines[line - 1]
    indent = len(text) - len(text.lstrip())
    for i in range(line - 2, -1, -1):
        row = lines[i]
        if row.strip() and len(row) - len(row.lstrip()) < indent:
            if re.match(r"\s*(async\s+)?(def|class)\s", row):
                return i + 1
            indent = len(row) - len(row.lstrip())
            if indent == 0:
                return None
    return None


def _qualname(lines: list[str], line: int) -> str:
    """``Class.method`` for the definition at ``line`` (its enclosing classes included)."""
    names, at = [], line
    while at is not None:
        names.append(re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", lines[at - 1]).group(1))
        at = _enclosing(lines, at)
    return ".".join(reversed(names))


_DEFS: dict[str, dict[str, list[tuple[str, int]]]] = {}


def relocated(new_src: Path, symbol: str, old_path: str) -> list[tuple[str, int]]:
    """Where else in the new checkout ``symbol`` is defined (another file: a move across files)."""
    root = str(new_src)
    if root not in _DEFS:
        index: dict[str, list[tuple[str, int]]] = {}
        for file in sorted(Path(new_src).rglob("*.py")):
            rel = file.relative_to(new_src).as_posix()
            for i, row in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines()):
                m = re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", row)
                if m:
                    index.setdefault(m.group(1), []).append((rel, i + 1))
        _DEFS[root] = index
    name = symbol.split(".")[-1]
    return [(p, n) for p, n in _DEFS[root].get(name, []) if p != old_path]


def _moved_file(old: list[str], line: int, symbol: str, path: str, new_src: Path):
    """(status, new path, new line) of a definition that left its file, or None."""
    body = drift.block(old, line)
    hits = []
    for rel, _ in relocated(new_src, symbol, path):
        lines = (Path(new_src) / rel).read_text(encoding="utf-8", errors="replace").splitlines()
        at = drift._find(lines, symbol, body, line)
        if at is not None:
            hits.append((drift.block(lines, at) == body, rel, at))
    if len(hits) != 1 and not any(same for same, _, _ in hits):
        return None
    same, rel, at = max(hits, key=lambda h: h[0])
    return ("moved" if same else "changed"), rel, at


def owner_line(old: list[str], new: list[str], line: int) -> int | None:
    """Line in ``new`` of the function that held statement ``line`` at the old tag (None at
    module level or when it is gone): where to re-read a statement that changed."""
    owner = _enclosing(old, line)
    if owner is None:
        return None
    return drift._find(new, _qualname(old, owner), drift.block(old, owner), owner)


def follow_statement(old: list[str], new: list[str], line: int, text: str) -> tuple[str, int | None]:
    owner = _enclosing(old, line)
    if owner is None:  # module level: the text's nearest occurrence
        hits = [i + 1 for i, row in enumerate(new) if text in row]
        if not hits:
            return "changed", None
        best = min(hits, key=lambda n: abs(n - line))
        return ("unchanged" if best == line else "moved"), best
    symbol = _qualname(old, owner)
    start = drift._find(new, symbol, drift.block(old, owner), owner)
    if start is None:
        return "vanished", None
    span = drift.block(new, start).count("\n") + 1
    hits = [start + i for i in range(span) if text in new[start - 1 + i]]
    if not hits:
        return "changed", None
    best = min(hits, key=lambda n: abs((n - start) - (line - owner)))
    return ("unchanged" if best == line else "moved"), best


def _signature(block_text: str) -> dict[str, str] | None:
    """Parameter name -> default (``""`` when none) of a def, of a class's ``__init__``, or the
    fields of a dataclass-like class; None when the block does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(block_text))
    except SyntaxError:
        return None
    node = tree.body[0] if tree.body else None
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
            found = {n.target.id: _short(n.value) for n in fields}
            return {**found, "@fields": ""} if found else None  # a dataclass: fields, not positions
        node = init
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = {a.arg: _short(d) for a, d in zip(positional, defaults)}
    out.update({a.arg: _short(d) for a, d in zip(args.kwonlyargs, args.kw_defaults)})
    if args.vararg or args.kwarg:  # parameters may be forwarded: none is known to be gone
        out["**"] = ""
    out.pop("self", None)
    return out


def _short(node) -> str:
    if node is None:
        return ""
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def signature_change(old_block: str, new_block: str) -> dict | None:
    """Added / removed parameters, changed defaults, and whether the old positional order
    still holds (a parameter inserted before an old one breaks positional calls)."""
    before, after = _signature(old_block), _signature(new_block)
    if before is None or after is None or before == after:
        return None
    change: dict = {}
    marks = ("**", "@fields")
    added = [n for n in after if n not in before and n not in marks]
    removed = [] if "**" in after else [n for n in before if n not in after and n not in marks]
    if "**" in after and "**" not in before:
        change["forwarded"] = True  # the new def takes *args / **kwargs and passes them on
    defaults = {n: [before[n], after[n]] for n in before if n in after and before[n] != after[n]}
    if added:
        change["added"] = added
    if removed:
        change["removed"] = removed
    if defaults:
        change["defaults"] = defaults
    if "**" in after or "@fields" in after:
        return change or None
    kept_old = [n for n in before if n in after]
    kept_new = [n for n in after if n in before]
    if kept_old != kept_new or list(after)[: len(kept_old)] != kept_old:
        change["order"] = True  # an old positional call would bind another parameter
    return change or None


def compare(key_: str, line: int, old_src: Path | None, new_src: Path) -> dict:
    """One citation's record: status, new line (and new path when the definition left its file),
    and its signature change when it has one."""
    path, symbol = _split(key_)
    in_package = path.startswith("megatron/core/")
    old = drift._read(sources.installed_root() if in_package else old_src, path)
    if old is None:
        raise FileNotFoundError(f"{path} at {sources.TAG}: pass --old-src (a checkout of the tag)")
    new = drift._read(new_src, path) or []
    if symbol is None:
        record = {}
        status, new_line = follow_statement(old, new, line, old[line - 1].strip())
        if status == "vanished" and (owner := _enclosing(old, line)) is not None:
            moved = _moved_file(old, owner, _qualname(old, owner), path, new_src)
            if moved is not None:
                record["new_path"] = moved[1]
                new = (Path(new_src) / moved[1]).read_text(encoding="utf-8", errors="replace").splitlines()
                status, new_line = follow_statement(old, new, line, old[line - 1].strip())
        record = {"status": status, "new_line": new_line, **record}
        if status == "changed" and (at := owner_line(old, new, line)) is not None:
            record["owner_line"] = at  # the statement is gone from it: re-read the function
        return record
    new_path = path
    if new:
        status, new_line = drift.check(drift.Citation(path, line, symbol), old_src, new_src)
        status = status.split(",")[0]
    else:
        status, new_line = "vanished", None
    if status == "vanished":
        moved = _moved_file(old, line, symbol, path, new_src)
        if moved is not None:
            status, new_path, new_line = moved
            new = (Path(new_src) / new_path).read_text(encoding="utf-8", errors="replace").splitlines()
    record: dict = {"status": status, "new_line": new_line}
    if new_path != path:
        record["new_path"] = new_path
    if new_line is not None and status == "changed":
        sig = signature_change(drift.block(old, line), drift.block(new, new_line))
        if sig:
            record["signature"] = sig
    return record


def _split(key_: str) -> tuple[str, str | None]:
    if "::" in key_:
        path, symbol = key_.split("::", 1)
        return path, symbol
    return key_.rsplit(":", 1)[0], None


# ------------------------------------------------------------------------------ the data


def load() -> dict:
    return json.loads(DATA_FILE.read_text(encoding="utf-8")) if DATA_FILE.exists() else {"citations": {}}


def load_facts() -> dict:
    return json.loads(FACTS_FILE.read_text(encoding="utf-8"))


def generate(new_src: Path, old_src: Path | None, root: Path = drift.ROOT) -> dict:
    cited = note_citations(root)
    citations = {}
    for k in sorted(cited):
        line = cited[k]["line"]
        citations[k] = {"line": line, **compare(k, line, old_src, new_src), "notes": cited[k]["notes"]}
    from snippets.site import pitfalls as pitfall_records

    pitfalls = {}
    for pid, pit in pitfall_records.records(root / "notes", load_facts()).items():
        path, line = pit["anchor"].rsplit(":", 1)  # the 0.16.1 line that makes the surprise
        pitfalls[pid] = compare(f"{path}:{line}", int(line), old_src, new_src)
    return {
        "tag": NEW_TAG,
        "old_tag": sources.TAG,
        "command": "python -m snippets.site.changes --megatron-src PATH_AT_0.19.0 --old-src PATH_AT_0.16.1",
        "citations": citations,
        "pitfalls": pitfalls,
    }


def counts(records) -> dict[str, int]:
    return {s: sum(r["status"] == s for r in records) for s in STATUSES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.changes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--megatron-src", required=True, type=Path, help=f"a checkout (or export) of {NEW_TAG}"
    )
    parser.add_argument(
        "--old-src", type=Path, help=f"a checkout of {sources.TAG}, for files outside megatron/core"
    )
    args = parser.parse_args(argv)
    for name, src in (("--megatron-src", args.megatron_src), ("--old-src", args.old_src)):
        if src is not None and not (src / "megatron" / "core").is_dir():
            print(f"error: {name} {src} is not a Megatron-LM checkout (no megatron/core/)", file=sys.stderr)
            return 2
    data = generate(args.megatron_src, args.old_src)
    DATA_FILE.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    total = counts(data["citations"].values())
    print(f"{len(data['citations'])} note citations: " + ", ".join(f"{n} {s}" for s, n in total.items()))
    print(
        f"{len(data['pitfalls'])} pitfall anchors: "
        + ", ".join(f"{n} {s}" for s, n in counts(data["pitfalls"].values()).items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
