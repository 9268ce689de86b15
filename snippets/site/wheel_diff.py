"""Do the site's cited lines differ between two megatron-core wheels (e.g. 0.19.0, the pin, and 0.19.2)?

``python -m snippets.site.wheel_diff A.whl B.whl`` reads the ``megatron/`` tree of both wheels and
compares, for every line the site cites (every pinned link of the notes, the pages and the README,
each line of a range), that line's text in ``A`` and in ``B``. It prints the lines that differ,
the counts, and one Chinese sentence with the date, to paste into the home page (``docs/index.md``,
section 版本): the site itself never reads the wheels. Lines outside the wheels (``pretrain_gpt.py``,
``examples/``) are counted apart.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from snippets.site import repin, sources

ROOT = Path(__file__).resolve().parents[2]
SENTENCE_RE = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d) 比较了 megatron-core (?P<a>[\w.]+) 与 (?P<b>[\w.]+) 的 wheel："
    r"本站引用的 (?P<lines>\d+) 行源码（(?P<files>\d+) 个文件）"
    r"(?:在两个版本里逐字相同、行号不变|中有 (?P<moved>\d+) 行文字没变、只挪了行号[^，]*，(?P<changed>\d+) 行文字变了)"
)
"""The sentence :func:`sentence` writes (the home page test looks for it)."""


@dataclass
class Result:
    versions: tuple[str, str]
    cited: dict[str, set[int]]  # path in the wheels -> cited lines
    outside: int  # cited lines in files the wheels do not hold
    differ: list[tuple[str, int, str | None, str | None, int | None]]
    """(path, line, its text in A, the text of that line number in B, where A's line is in B or None)"""
    files_changed: int  # cited files whose text differs anywhere between the wheels
    all_changed: int  # .py files of megatron/ that differ anywhere between the wheels

    @property
    def lines(self) -> int:
        return sum(len(v) for v in self.cited.values())

    @property
    def moved(self) -> list[tuple[str, int, str | None, str | None, int | None]]:
        return [d for d in self.differ if d[4] is not None]


def _tree(wheel: Path) -> tuple[str, dict[str, str]]:
    """(version, {path under megatron/: text}) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (\S+)$", z.read(meta).decode(), re.M).group(1)
        files = {
            n: z.read(n).decode("utf-8", errors="replace")
            for n in z.namelist()
            if n.startswith("megatron/") and n.endswith(".py")
        }
    return version, files


def cited_lines(root: Path = ROOT) -> dict[str, set[int]]:
    """Every line the site cites, by path (a range link: each of its lines)."""
    found: dict[str, set[int]] = {}
    for file in sources.citing_files(root):
        for group in repin.link_cites(file.read_text(encoding="utf-8"), sources.TAG):
            first, last = group[0].line, group[-1].line
            found.setdefault(group[0].path, set()).update(range(first, max(first, last) + 1))
    return found


def _line(text: str | None, n: int) -> str | None:
    if text is None:
        return None
    rows = text.splitlines()
    return rows[n - 1] if n <= len(rows) else None


def compare(a: Path, b: Path, cited: dict[str, set[int]]) -> Result:
    (va, ta), (vb, tb) = _tree(a), _tree(b)
    inside = {p: lines for p, lines in cited.items() if p in ta or p in tb}
    outside = sum(len(lines) for p, lines in cited.items() if p not in inside)
    differ = []
    for path in sorted(inside):
        for n in sorted(inside[path]):
            x, y = _line(ta.get(path), n), _line(tb.get(path), n)
            if x != y:
                # the same text still inside the function that held it (repin's rule)?
                old, new = (ta.get(path) or "").splitlines(), (tb.get(path) or "").splitlines()
                at = repin.follow_statement(old, new, n) if x is not None and new else None
                differ.append((path, n, x, y, at))
    files_changed = sum(ta.get(p) != tb.get(p) for p in inside)
    all_changed = sum(ta.get(p) != tb.get(p) for p in set(ta) | set(tb))
    return Result((va, vb), inside, outside, differ, files_changed, all_changed)


def sentence(r: Result, day: datetime.date) -> str:
    a, b = r.versions
    if not r.differ:
        verdict = f"在两个版本里逐字相同、行号不变（两版之间改过 {r.all_changed} 个 `.py` 文件"
        verdict += (
            f"，其中 {r.files_changed} 个是本站引用的，改动不在引用的行上）"
            if r.files_changed
            else "，都不是本站引用的）"
        )
    else:
        files = sorted({Path(d[0]).name for d in r.moved})
        where = f"（都在 {'、'.join(files)}）" if files else ""
        verdict = (
            f"中有 {len(r.moved)} 行文字没变、只挪了行号{where}，{len(r.differ) - len(r.moved)} 行文字变了"
        )
    return (
        f"{day.isoformat()} 比较了 megatron-core {a} 与 {b} 的 wheel：本站引用的 {r.lines} 行源码"
        f"（{len(r.cited)} 个文件）{verdict}。"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.wheel_diff", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("a", type=Path, help="the pinned wheel, e.g. megatron_core-0.19.0-...whl")
    parser.add_argument("b", type=Path, help="the other wheel, e.g. megatron_core-0.19.2-...whl")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for w in (args.a, args.b):
        if not zipfile.is_zipfile(w):
            print(f"wheel_diff: {w} is not a wheel", file=sys.stderr)
            return 2
    r = compare(args.a, args.b, cited_lines(args.root))
    for path, n, x, y, at in r.differ:
        print(f"{path}:{n} " + (f"-> line {at} in {r.versions[1]} (same text)" if at else "changed"))
        print(f"  - {x}\n  + {y}")
    print(
        f"{r.lines} cited lines in {len(r.cited)} files of the wheels ({r.outside} more outside them): "
        f"{len(r.differ)} differ; {r.files_changed} cited files and {r.all_changed} .py files differ anywhere"
    )
    print(sentence(r, datetime.date.today()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
