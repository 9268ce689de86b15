"""What the tests of tests/experiments share: running ``python -m snippets.run`` (plain, with
``--nproc-per-node``, or under a raw ``torchrun``), reading the notes' stored tables, and the
runner's path computed in-process (:func:`runner_tables`).

Every path is derived from this file, so the tests pass from a clone anywhere (a long path with
spaces included: tests/experiments/test_clone_path.py).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from snippets.experiments import EXPERIMENTS, Parallel

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB_TIMEOUT_S = 300  # a hung job fails the test instead of the suite


@functools.lru_cache(maxsize=None)
def torchrun(nproc: int, *args: str):
    """Run a raw ``torchrun --standalone --nproc-per-node nproc -m snippets.run *args``, once per
    session."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:  # its log dirs go there, and go
        proc = subprocess.run(
            [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), "-m", "snippets.run", *args],
            env={**os.environ, "TMPDIR": tmp},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
    proc.seconds = time.monotonic() - start
    return proc


@functools.lru_cache(maxsize=None)
def one_command(nproc: int, *args: str):
    """Run ``python -m snippets.run --nproc-per-node nproc *args`` (the runner starts the ranks
    itself, through torch's elastic launcher), once per session."""
    with tempfile.TemporaryDirectory(prefix="snippets-run-") as tmp:
        proc = plain("--nproc-per-node", str(nproc), *args, env={"TMPDIR": tmp}, timeout=JOB_TIMEOUT_S)
        # what the job left in its temporary directory, but torch's own per-user compile cache
        # (importing megatron.core creates ``torchinductor_<user>`` there, as in any torch program)
        proc.leftovers = [name for name in os.listdir(tmp) if not name.startswith("torchinductor_")]
    return proc


def ok(nproc: int, *args: str, raw: bool = True) -> str:
    """Rank 0's stdout of a job that must succeed: under a raw ``torchrun`` or (``raw=False``)
    through ``--nproc-per-node``."""
    proc = torchrun(nproc, *args) if raw else one_command(nproc, *args)
    assert proc.returncode == 0, f"{nproc} ranks {args} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def tables(text: str) -> list[str]:
    """The markdown tables in ``text``: runs of lines that start with ``|``."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            out.append("\n".join(current))
            current = []
    return out


@functools.lru_cache(maxsize=None)
def note_tables(note: str) -> list[str]:
    """Every table the note's stored outputs hold (its ``text/markdown`` outputs)."""
    nb = json.loads((ROOT / "notes" / f"{note}.ipynb").read_text(encoding="utf-8"))
    found = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            markdown = output.get("data", {}).get("text/markdown")
            if markdown:
                found += tables("".join(markdown))
    assert found, f"{note}.ipynb has no stored tables"
    return found


def note_text(note: str) -> str:
    nb = json.loads((ROOT / "notes" / f"{note}.ipynb").read_text(encoding="utf-8"))
    return "\n".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


def rows_of(table: str) -> tuple[str, list[str]]:
    lines = table.splitlines()
    return lines[0], lines[2:]


def assert_in_note(table: str, note: str, whole: bool = True) -> None:
    """``table`` is one of the note's tables (``whole``), or a run of rows of one of them under the
    same header (the note's table has more configurations)."""
    stored = note_tables(note)
    if whole:
        assert table in stored, f"not in {note}'s stored tables:\n{table}"
        return
    header, rows = rows_of(table)
    for candidate in stored:
        head, stored_rows = rows_of(candidate)
        if head == header and any(stored_rows[i : i + len(rows)] == rows for i in range(len(stored_rows))):
            return
    raise AssertionError(f"rows not found under the same header in {note}:\n{table}")


def plain(*args: str, env: dict | None = None, timeout: float = 120):
    """``python -m snippets.run *args`` as a user types it."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "snippets.run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    proc.seconds = time.monotonic() - start
    return proc


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def refusals(stderr: str) -> list[str]:
    """The runner's own lines in a job's stderr (each starts with ``snippets.run: ``)."""
    return [line for line in stderr.splitlines() if line.startswith("snippets.run: ")]


AS_RANK_0_OF_2 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
"""What torchrun sets in rank 0 of a 2-rank job: the checks run before any rendezvous, so a plain
process with this environment takes the same path (and no peer is needed to refuse)."""


def _runner_items(name: str, world: int, **parallel) -> list:
    """The items (tables and lines) rank 0 of ``python -m snippets.run name --dims tiny`` renders,
    computed in-process with ``run_ranks`` (the same ``run`` and ``tables``; no job to start, so cheap)."""
    from snippets.ranks.launch import run_ranks

    exp = EXPERIMENTS[name]
    run, make_tables = exp.functions()
    par = Parallel(world=world, etp=exp.etp, **parallel)
    results = run_ranks(
        run, world, exp.tiny, par, grid={k: v for k, v in parallel.items() if k in ("tp", "pp", "cp")}
    )
    return make_tables(results, exp.tiny, par)


def runner_tables(name: str, world: int, **parallel) -> list[str]:
    """What ``python -m snippets.run name --dims tiny`` prints as tables (see :func:`_runner_items`)."""
    from snippets.record.tables import Table

    return [tables(t.markdown())[0] for t in _runner_items(name, world, **parallel) if isinstance(t, Table)]


def runner_output(name: str, world: int, **parallel) -> str:
    """What ``python -m snippets.run name --dims tiny`` prints after its header line, as the runner
    renders it (:func:`snippets.ranks.runner.render`), computed in-process."""
    from snippets.ranks.runner import render

    return render(_runner_items(name, world, **parallel))
