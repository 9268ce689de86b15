"""The pitfall page: upstream surprises the notes reproduce, with their status at the pin and at main.

A pitfall is declared in one of two places, both read here:

- in ``pitfalls.json`` (next to this module) under ``pitfalls``, keyed by id, with ``cells``: a list
  of ``[note number, cell id]`` that show it;
- in a note, on the cell that shows it: the jupytext header
  ``# %% tags=["pitfall"] pitfall={"id": "...", "title": "...", "expected": "...", "observed": "...",
  "anchor": "megatron/core/PATH.py:LINE"}`` puts the record in the cell's metadata (a record in the
  data file with the same id adds to it: its status, issues, main).

``anchor`` is the line at the pinned tag (:data:`sources.TAG`) that makes the surprise (or, once it
is fixed, the line that fixes it), ``text`` that line's stripped text, ``status`` what reading the
code at the tag says (``still`` / ``fixed``; ``note`` says in our words what changed), ``issues``
upstream NVIDIA/Megatron-LM issue or PR numbers. ``main`` is the same reading at the newest
Megatron-LM commit we have (the data file's ``main.commit``): ``line``, ``status``, ``note`` and, when
the line reads differently there, ``text``. A record without a status shows as 未核对.

``python -m snippets.site.pitfalls --src TAG_EXPORT [--main-src MAIN_EXPORT]`` checks every anchor
against an export of the tag (files outside the pip package) and of the main commit, and says where
:func:`snippets.site.repin.follow_statement` puts each anchor in the main export: the start of a
re-reading after the pin or the main commit moves (the tests check the same without the exports).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

from snippets.site import sources

DATA_FILE = Path(__file__).with_name("pitfalls.json")
FIELDS = ("title", "expected", "observed", "anchor")
KIND = {"still": "仍在", "fixed": "已修", "unknown": "未核对"}


def load() -> dict:
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=64)
def _cells(path: str, mtime_ns: int) -> tuple[dict, ...]:
    return tuple(json.loads(Path(path).read_text(encoding="utf-8"))["cells"])


def cells(path: Path) -> tuple[dict, ...]:
    """A notebook's cells, read once per version of the file (the page and the quiz share it)."""
    return _cells(str(path), path.stat().st_mtime_ns)


def _notebooks(notes_dir: Path) -> dict[str, Path]:
    return {p.name[:2]: p for p in sorted(Path(notes_dir).glob("[0-9][0-9]_*.ipynb"))}


def declared_in_notes(notes_dir: Path) -> dict[str, dict]:
    """Pitfall records from cell metadata (tag ``pitfall``), by id, with the cell they sit on."""
    found: dict[str, dict] = {}
    for number, path in _notebooks(notes_dir).items():
        for cell in cells(path):
            meta = cell.get("metadata", {})
            record = meta.get("pitfall")
            if record is None or "pitfall" not in meta.get("tags", []):
                continue
            entry = found.setdefault(record["id"], {**record, "cells": []})
            entry["cells"].append([number, cell["id"]])
    return found


def records(notes_dir: Path, data: dict | None = None) -> dict[str, dict]:
    """Every pitfall by id: the data file's records, completed by the notes' own declarations."""
    data = load() if data is None else data
    out = {pid: dict(rec) for pid, rec in data.get("pitfalls", {}).items()}
    for pid, rec in declared_in_notes(notes_dir).items():
        merged = {**out.get(pid, {}), **rec}
        merged["cells"] = sorted({tuple(c) for c in out.get(pid, {}).get("cells", []) + rec["cells"]})
        out[pid] = merged
    for pid, rec in out.items():
        missing = [f for f in FIELDS if not rec.get(f)]
        if missing or not rec.get("cells"):
            raise ValueError(f"pitfall {pid}: missing {missing or ['cells']}")
    return out


def main_url(commit: str, path: str, line: int | None = None) -> str:
    return f"{sources.REPO_URL}/blob/{commit}/{path}" + (f"#L{line}" if line else "")


# ------------------------------------------------------------------------------ the page


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cell_ids(notes_dir: Path) -> dict[str, tuple[str, set[str]]]:
    """Note number -> (notebook file name, its cell ids)."""
    return {n: (p.name, {c.get("id") for c in cells(p)}) for n, p in _notebooks(notes_dir).items()}


def _cell_links(cell_refs: list, notes: dict[str, tuple[str, set[str]]]) -> str:
    # a link only to a cell that exists (a build on other notes, e.g. the test fixture, gets text)
    out = []
    for number, cell_id in cell_refs:
        name, ids = notes.get(number, (None, set()))
        out.append(f"[笔记 {number}](notes/{name}#cell-id={cell_id})" if cell_id in ids else f"笔记 {number}")
    return "、".join(out)


def _issue_links(numbers: list[int]) -> str:
    if not numbers:
        return "未找到"
    return "、".join(f"[#{n}]({sources.REPO_URL}/issues/{n})" for n in numbers)


def rows(notes_dir: Path, data: dict | None = None) -> list[dict]:
    """The records in page order (by the first note that shows them), each with its status keys."""
    data = load() if data is None else data
    out = []
    for pid, rec in records(notes_dir, data).items():
        main = rec.get("main") or {}
        out.append(
            {
                "id": pid,
                **rec,
                "kind": rec.get("status") if rec.get("status") in KIND else "unknown",
                "main_kind": main.get("status") if main.get("status") in KIND else "unknown",
            }
        )
    return sorted(out, key=lambda r: (min(c[0] for c in r["cells"]), r["id"]))


def main_label(data: dict) -> str:
    """The main column's heading: the commit and its date."""
    main = data.get("main") or {}
    return f"main（{main.get('commit', '?')[:10]}，{main.get('date', '?')}）"


def table(notes_dir: Path, data: dict | None = None) -> str:
    data = load() if data is None else data
    commit = (data.get("main") or {}).get("commit")
    note_files = _cell_ids(notes_dir)
    out = [
        f"| # | 坑（演示它的单元格） | 以为会 / 跑出来 | {sources.TAG} | {main_label(data)} | 上游讨论 |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows(notes_dir, data), 1):
        path, line = r["anchor"].rsplit(":", 1)
        pin = f"**{KIND[r['kind']]}** [{Path(path).name}:{line}]({sources.pinned_url(path, int(line))})"
        if r.get("note"):
            pin += "：" + r["note"]
        main = r.get("main") or {}
        now = f"**{KIND[r['main_kind']]}**"
        if commit and main.get("line"):
            now += f" [{Path(path).name}:{main['line']}]({main_url(commit, path, main['line'])})"
        if main.get("note"):
            now += "：" + main["note"]
        cols = [
            str(i),
            f"{r['title']}<br>见 {_cell_links(r['cells'], note_files)}",
            f"以为：{r['expected']}<br>实际：{r['observed']}",
            pin,
            now,
            _issue_links(r.get("issues", [])),
        ]
        out.append("| " + " | ".join(_cell(c) for c in cols) + " |")
    return "\n".join(out)


def self_test(notes_dir: Path, data: dict | None = None) -> str:
    data = load() if data is None else data
    all_rows = rows(notes_dir, data)
    number = {r["id"]: i for i, r in enumerate(all_rows, 1)}
    answer = []
    for kind, label in KIND.items():
        members = [r for r in all_rows if r["kind"] == kind]
        if members:
            answer.append(f"- **{sources.TAG} {label}（{len(members)} 个）**")
            answer += [f"    - 第 {number[r['id']]} 行：{r['title']}" for r in members]
    moved = [r for r in all_rows if r["main_kind"] != r["kind"]]
    answer.append(
        f"- **在 {main_label(data)}上与 {sources.TAG} 不同的（{len(moved)} 个）**"
        + ("" if moved else "：没有，每一条的状态都相同")
    )
    answer += [f"    - 第 {number[r['id']]} 行：{KIND[r['main_kind']]}" for r in moved]
    return "\n".join(
        [
            f"**1. 表里的 {len(all_rows)} 个坑，哪些在 {sources.TAG} 仍然存在？哪些已经修了？main 上又怎样？**",
            "",
            '<details markdown="1"><summary>答案</summary>',
            "",
            *answer,
            "",
            "（由表的两列算出：构建页面时按数据文件逐条归类。）",
            "",
            "</details>",
        ]
    )


# ------------------------------------------------------------------------------ checking the data


def _lines(src: Path | None, path: str) -> list[str] | None:
    if path.startswith("megatron/core/") and src is None:
        return list(sources.file_lines(path))
    if src is None or not (src / path).is_file():
        return None
    return (src / path).read_text(encoding="utf-8", errors="replace").splitlines()


def problems(data: dict, src: Path | None = None, main_src: Path | None = None) -> list[str]:
    """What is wrong with the data file: a record without a status, an anchor whose line at the
    tag (installed package, or ``src`` for other files) or at main (``main_src``) reads otherwise."""
    found = []
    if data.get("tag") != sources.TAG:
        found.append(
            f"pitfalls.json is anchored at {data.get('tag')}, the pin is {sources.TAG}: re-anchor it"
        )
    for pid, rec in data.get("pitfalls", {}).items():
        main = rec.get("main") or {}
        if rec.get("status") not in ("still", "fixed") or main.get("status") not in ("still", "fixed"):
            found.append(f"{pid}: status must be still / fixed, at the tag and at main")
        if "fixed" in (rec.get("status"), main.get("status")) and not (rec.get("note") or main.get("note")):
            found.append(f"{pid}: a fixed pitfall says what fixed it (note)")
        path, line = rec["anchor"].rsplit(":", 1)
        for where, root, at, text in (
            (sources.TAG, src, int(line), rec.get("text")),
            ("main", main_src, main.get("line"), main.get("text") or rec.get("text")),
        ):
            lines = _lines(root, path) if (root is not None or where == sources.TAG) else None
            if lines is None or at is None:
                continue
            got = lines[at - 1].strip() if at <= len(lines) else ""
            if not got:
                found.append(f"{pid}: {path}:{at} at {where} is blank (a blank line is no anchor)")
            elif got != text:
                found.append(f"{pid}: {path}:{at} at {where} reads {got!r}, the record says {text!r}")
    return found


def follow_to(data: dict, src: Path | None, newer: Path) -> list[tuple[str, str, int | None, int | None]]:
    """(id, anchor, recorded main line, where :func:`repin.follow_statement` puts it in ``newer``)."""
    from snippets.site import repin  # repin imports drift, which this module does not need

    out = []
    for pid, rec in data.get("pitfalls", {}).items():
        path, line = rec["anchor"].rsplit(":", 1)
        old, new = _lines(src, path), _lines(newer, path)
        followed = repin.follow_statement(old, new, int(line)) if old and new else None
        out.append((pid, rec["anchor"], (rec.get("main") or {}).get("line"), followed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.pitfalls", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--src", type=Path, help=f"an export of {sources.TAG}, for files outside megatron/core"
    )
    parser.add_argument("--main-src", type=Path, help="an export of the main commit in pitfalls.json")
    args = parser.parse_args(argv)
    data = load()
    found = problems(data, args.src, args.main_src)
    print("\n".join(found) if found else f"{len(data['pitfalls'])} pitfalls: every anchor reads as recorded")
    if args.main_src:
        for pid, anchor, recorded, followed in follow_to(data, args.src, args.main_src):
            if followed != recorded:
                print(f"{pid}: {anchor} -> main {followed} (recorded {recorded}): read it again")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
