"""What changed in the notes' stored outputs since a git revision: the summary a re-execution needs.

``python -m snippets.site.output_changes [--base REV]`` compares the outputs of every code cell of
each ``notes/*.ipynb`` in the working tree with those of the same cell (by cell id) at ``REV``
(default ``HEAD``) and prints, per note whose outputs changed, how many cells changed and, for each
of them, the first line that differs (``-`` at the revision, ``+`` now). Outputs are compared as
text: stream text, each rich output's MIME bundle in MIME order, an error's name and value;
execution counts and metadata are ignored. The order is the notes' and the cells' own, so two
runs print the same thing.

After a version bump and ``scripts/execute_notes.sh``, this is the list to read before committing:
every change should be one the bump explains.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 150  # a differing line is cut here when printed (an SVG line can be very long)


@dataclass(frozen=True)
class CellChange:
    cell_id: str
    index: int  # 0-based position among the notebook's cells (now; at the revision if removed)
    old: str | None  # first differing line at the revision (None: the cell has no more lines there)
    new: str | None  # first differing line now
    kind: str = "changed"  # "changed", "new" (no such cell at the revision), "removed"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def output_lines(cell: dict) -> list[str]:
    """A code cell's outputs as lines of text, in a stable order."""
    lines: list[str] = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            lines += [
                f"[{out.get('name', 'stdout')}] {row}" for row in _text(out.get("text", "")).splitlines()
            ]
        elif kind in ("execute_result", "display_data"):
            for mime in sorted(out.get("data", {})):
                lines += [f"[{mime}] {row}" for row in _text(out["data"][mime]).splitlines()]
        elif kind == "error":
            lines.append(f"[error] {out.get('ename')}: {out.get('evalue')}")
    return lines


def _first_difference(old: list[str], new: list[str]) -> tuple[str | None, str | None]:
    for a, b in zip(old, new):
        if a != b:
            return a, b
    n = min(len(old), len(new))
    return (old[n] if n < len(old) else None), (new[n] if n < len(new) else None)


def cell_changes(old_nb: dict | None, new_nb: dict) -> list[CellChange]:
    """The code cells of ``new_nb`` whose outputs differ from the same cell's in ``old_nb``."""
    old_cells = {c.get("id"): c for c in (old_nb or {}).get("cells", []) if c.get("cell_type") == "code"}
    new_ids = set()
    changes = []
    for index, cell in enumerate(new_nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        new_ids.add(cell.get("id"))
        now = output_lines(cell)
        before = old_cells.get(cell.get("id"))
        if before is None:
            if now:
                changes.append(CellChange(cell.get("id"), index, None, now[0], "new"))
            continue
        then = output_lines(before)
        if then != now:
            changes.append(CellChange(cell.get("id"), index, *_first_difference(then, now)))
    for index, cell in enumerate((old_nb or {}).get("cells", [])):
        if cell.get("cell_type") == "code" and cell.get("id") not in new_ids and output_lines(cell):
            changes.append(CellChange(cell.get("id"), index, output_lines(cell)[0], None, "removed"))
    return changes


def _git_show(root: Path, rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def compare(root: Path = ROOT, base: str = "HEAD") -> dict[str, list[CellChange]]:
    """Note file name -> its changed cells, for every notebook under ``root/notes`` now."""
    out = {}
    for path in sorted((root / "notes").glob("[0-9][0-9]_*.ipynb")):
        then = _git_show(root, base, f"notes/{path.name}")
        old_nb = json.loads(then) if then else None
        out[path.name] = cell_changes(old_nb, json.loads(path.read_text(encoding="utf-8")))
    return out


def _cut(line: str | None) -> str:
    if line is None:
        return "(nothing)"
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def render(changes: dict[str, list[CellChange]], base: str) -> str:
    rows = []
    changed = {name: cells for name, cells in changes.items() if cells}
    for name, cells in changed.items():
        rows.append(f"{name}: {len(cells)} cell(s) with changed outputs")
        for c in cells:
            what = {"changed": "", "new": " (new cell)", "removed": " (removed)"}[c.kind]
            rows.append(f"  cell {c.cell_id} (#{c.index}){what}")
            rows.append(f"    - {_cut(c.old)}")
            rows.append(f"    + {_cut(c.new)}")
    total = sum(len(c) for c in changed.values())
    rows.append(f"{len(changed)} of {len(changes)} notes have changed outputs ({total} cells) against {base}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.output_changes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (
        subprocess.run(
            ["git", "-C", str(args.root), "rev-parse", "--verify", "-q", args.base + "^{commit}"],
            capture_output=True,
            check=False,
        ).returncode
        != 0
    ):
        print(f"output_changes: {args.base!r} is not a revision of {args.root}", file=sys.stderr)
        return 2
    try:
        print(render(compare(args.root, args.base), args.base))
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
