"""The pitfall lab: upstream surprises the notes reproduce, gathered from what the notes declare.

A pitfall is declared in one of two places, both read here:

- in a note, on the cell that shows it: the jupytext header
  ``# %% tags=["pitfall"] pitfall={"id": "...", "title": "...", "expected": "...", "observed": "...",
  "anchor": "megatron/core/PATH.py:LINE"}`` puts the record in the cell's metadata;
- in ``changes_v019_facts.json`` under ``pitfalls``, keyed by id, with ``cells``: a list of
  ``[note number, cell id]`` (used for notes that were being edited by others when the page was
  built; the record is the same).

``anchor`` is the ``core_v0.16.1`` line that makes the surprise. ``python -m snippets.site.changes``
follows it to ``core_v0.19.0`` (still there, moved, changed, gone); a record may add a checked
``verdict`` (``still`` / ``fixed``) with ``line_019`` and ``note_019`` when the line alone does not
tell, and ``issues``: upstream NVIDIA/Megatron-LM issue or PR numbers.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

FIELDS = ("title", "expected", "observed", "anchor")


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
            pid = record["id"]
            entry = found.setdefault(pid, {**record, "cells": []})
            entry["cells"].append([number, cell["id"]])
    return found


def records(notes_dir: Path, facts: dict) -> dict[str, dict]:
    """Every pitfall by id: the notes' own declarations first, then the data file's."""
    out = {pid: dict(rec) for pid, rec in facts.get("pitfalls", {}).items()}
    for pid, rec in declared_in_notes(notes_dir).items():
        merged = {**out.get(pid, {}), **rec}
        merged["cells"] = sorted({tuple(c) for c in out.get(pid, {}).get("cells", []) + rec["cells"]})
        out[pid] = merged
    for pid, rec in out.items():
        missing = [f for f in FIELDS if not rec.get(f)]
        if missing or not rec.get("cells"):
            raise ValueError(f"pitfall {pid}: missing {missing or ['cells']}")
    return out


def status_019(record: dict, generated: dict | None) -> tuple[str, str, int | None]:
    """(kind, path at 0.19.0, line at 0.19.0); kind is ``still``, ``fixed``, ``changed``
    (the anchor line changed: read it again) or ``unknown`` (not regenerated yet)."""
    path = record["anchor"].rsplit(":", 1)[0]
    gen = generated or {}
    path = record.get("path_019") or gen.get("new_path") or path
    if record.get("verdict"):
        return record["verdict"], path, record.get("line_019") or gen.get("new_line")
    status = gen.get("status")
    if status in ("unchanged", "moved"):
        return "still", path, gen.get("new_line")
    if status in ("changed", "vanished"):
        return "changed", path, record.get("line_019")
    return "unknown", path, None
