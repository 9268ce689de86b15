"""Pinned source links: every citation points at tag ``core_v0.19.0`` and names a real line.

``megatron/core/...`` is what ``pip install megatron-core==0.19.0`` installs, so its lines are
looked up in the installed package. Everything else the notes cite (``megatron/training/``,
``pretrain_gpt.py``, ``examples/``) is not in the pip package: those symbols and lines live in
one data file, ``pinned_lines.json``, checked against a clone of the tag when one is given
(``pytest --megatron-src PATH``).

A citation in a note is a markdown link whose text ends with the symbol, for example
``[`parallel_state.py::initialize_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L548)``;
:func:`check_link` says whether that line really defines that symbol.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

TAG = "core_v0.19.0"
REPO_URL = "https://github.com/NVIDIA/Megatron-LM"
BLOB = f"{REPO_URL}/blob/{TAG}/"

PINNED_FILE = Path(__file__).with_name("pinned_lines.json")

LINK_RE = re.compile(
    r"\[(?P<text>[^\]]+)\]\(" + re.escape(BLOB) + r"(?P<path>[^)#\s]+)(?:#L(?P<line>\d+)(?:-L\d+)?)?\)"
)
"""A markdown link to the pinned tag, with an optional ``#L<line>`` or range ``#L<line>-L<end>``."""

STATEMENT_RE = re.compile(
    r"`?(?P<path>[\w/.]+\.(?:py|cpp|sh))`?(?::(?P<line>\d+)(?:[-–](?P<end>\d+))?"
    r"| 第 (?P<line_zh>\d+)(?:[-–](?P<end_zh>\d+))? 行)`?"
)
"""The text of a link to a statement: ``file.py:N``, ``file.py:N-M``, ``file.py 第 N 行``,
``file.py 第 N–M 行`` (also ``.cpp`` and ``.sh`` files)."""


def pinned_url(path: str, line: int | None = None) -> str:
    return BLOB + path + (f"#L{line}" if line else "")


def installed_root() -> Path:
    """The directory that holds the installed ``megatron/`` package."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.core")
    return Path(spec.origin).parents[2]


@lru_cache(maxsize=None)
def _lines(root: str, path: str) -> tuple[str, ...]:
    return tuple((Path(root) / path).read_text().splitlines())


def file_lines(path: str, src: Path | None = None) -> tuple[str, ...]:
    """Lines of ``path`` at the tag: from ``src`` (a checkout) or the installed package."""
    root = src if src is not None else installed_root()
    if src is None and not path.startswith("megatron/core/"):
        raise FileNotFoundError(f"{path} is not in the pip package; pass a checkout of {TAG}")
    return _lines(str(root), path)


def defines(line: str, symbol: str) -> bool:
    """Does this source line define ``symbol`` (def, class, or a module-level assignment)?"""
    name = re.escape(symbol)
    return bool(
        re.match(rf"\s*(async\s+)?(def|class)\s+{name}\b", line) or re.match(rf"{name}\s*(:[^=]+)?=", line)
    )


def find_line(path: str, symbol: str, src: Path | None = None) -> int:
    """The 1-based line defining ``symbol`` in ``path``; ``Class.method`` picks the method."""
    lines = file_lines(path, src)
    start = 0
    *outer, name = symbol.split(".")
    for part in outer:  # walk into classes first, so method names are found in the right class
        start = next(i for i in range(start, len(lines)) if defines(lines[i], part))
    for i in range(start, len(lines)):
        if defines(lines[i], name):
            return i + 1
    raise LookupError(f"{symbol} is not defined in {path} at {TAG}")


def link(path: str, symbol: str, text: str | None = None) -> str:
    """A markdown link to ``symbol`` in ``path`` at its pinned line (megatron/core or data file)."""
    if path.startswith("megatron/core/"):
        line = find_line(path, symbol)
    else:
        line = pinned_lines()[(path, symbol)]
    label = text or f"{Path(path).name}::{symbol}"
    return f"[`{label}`]({pinned_url(path, line)})"


@lru_cache(maxsize=None)
def pinned_lines() -> dict[tuple[str, str], int]:
    """The checked data file for citations outside the pip package: (path, symbol) -> line."""
    entries = json.loads(PINNED_FILE.read_text())
    return {(e["path"], e["symbol"]): e["line"] for e in entries}


def symbol_of(text: str) -> str | None:
    """The symbol a link's text names: what follows the last ``::``, or the whole text when it
    is a bare (dotted) identifier; backticks and a trailing ``()`` are ignored.

    ``parallel_state.py::RankGenerator.get_ranks`` -> ``RankGenerator.get_ranks``;
    ``get_tensor_model_parallel_group`` -> itself; ``parallel_state.py`` -> None (a file).
    """
    text = text.strip().strip("`").removesuffix("()")
    if "::" in text:
        return text.rsplit("::", 1)[1].strip("`() ")
    if re.fullmatch(r"[A-Za-z_][\w.]*", text) and not text.endswith(".py"):
        return text
    return None


def check_link(text: str, path: str, line: int | None, src: Path | None = None) -> str | None:
    """None if the link is right, else what is wrong with it.

    A link to a statement rather than a definition is written ``path.py:LINE`` (or ``path.py 第 N 行``,
    either with a range end) and must name the line it links (what that line must contain is checked
    where it is used: the CPU patches, and by hand for prose).
    """
    cited = STATEMENT_RE.fullmatch(text.strip())
    if cited:
        first = int(cited["line"] or cited["line_zh"])
        last = int(cited["end"] or cited["end_zh"] or first)
        if not path.endswith(cited["path"]) or first != line or last < first:
            return f"{text!r} does not match the link {path}#L{line}"
        if path.startswith("megatron/core/") or src is not None:
            if last > len(file_lines(path, src)):
                return f"{path} has fewer than {last} lines"
        return None
    symbol = symbol_of(text)
    in_package = path.startswith("megatron/core/")
    if line is None:
        if symbol:
            return f"{text!r} names {symbol} but the link has no #L line"
        return None
    if not symbol:
        return f"{text!r} links line {line} of {path} but names no symbol (use file.py::symbol)"
    if not in_package:
        recorded = pinned_lines().get((path, symbol))
        if recorded is None:
            return f"{path}::{symbol} is not in {PINNED_FILE.name}"
        if recorded != line:
            return f"{path}::{symbol} is at line {recorded} in {PINNED_FILE.name}, link says {line}"
        if src is None:
            return None
    lines = file_lines(path, src)
    if line > len(lines):
        return f"{path} has {len(lines)} lines, link says {line}"
    name = symbol.split(".")[-1]
    if not defines(lines[line - 1], name):
        try:
            actual = find_line(path, symbol, src)
        except LookupError:
            actual = None
        return f"{path}:{line} does not define {symbol} (found at line {actual})"
    return None


def citing_files(root: Path) -> list[Path]:
    """The files whose links the site shows: notes' text, the Markdown pages, the README."""
    files = [*root.glob("notes/*.py"), *root.glob("docs/**/*.md"), root / "README.md"]
    return sorted(f for f in files if f.exists() and not f.is_symlink())


def cited_links(root: Path) -> list[tuple[str, str, str, int | None]]:
    """Every pinned link under ``root``: (citing file, link text, Megatron path, line or None)."""
    found = []
    for file in citing_files(root):
        for m in LINK_RE.finditer(file.read_text(encoding="utf-8")):
            found.append(
                (
                    file.relative_to(root).as_posix(),
                    m["text"],
                    m["path"],
                    int(m["line"]) if m["line"] else None,
                )
            )
    return found


def _pin_command(argv: list[str] | None = None) -> int:
    """``python -m snippets.site.sources --megatron-src PATH FILE...``: record in the data file every
    citation outside the pip package that the given files make, after checking each line
    against the checkout. Prints what it added and refuses links whose line is wrong."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m snippets.site.sources", description=_pin_command.__doc__)
    parser.add_argument("--megatron-src", required=True, type=Path)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    entries = json.loads(PINNED_FILE.read_text())
    known = {(e["path"], e["symbol"]) for e in entries}
    bad = 0
    for file in args.files:
        for m in LINK_RE.finditer(file.read_text()):
            path, symbol = m["path"], symbol_of(m["text"])
            if path.startswith("megatron/core/") or not m["line"] or not symbol:
                continue
            line = int(m["line"])
            text = file_lines(path, args.megatron_src)[line - 1]
            if not defines(text, symbol.split(".")[-1]):
                print(f"WRONG {file}: {path}:{line} does not define {symbol}")
                bad += 1
            elif (path, symbol) not in known:
                entries.append({"path": path, "symbol": symbol, "line": line})
                known.add((path, symbol))
                print(f"added {path}:{line} {symbol}")
    entries.sort(key=lambda e: (e["path"], e["line"]))
    lines = ",\n".join(" " + json.dumps(e, ensure_ascii=False) for e in entries)
    PINNED_FILE.write_text("[\n" + lines + "\n]\n")
    pinned_lines.cache_clear()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(_pin_command())
