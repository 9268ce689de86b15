"""Run the whole test command several times in a row and report every run (a script, not a test).

    .venv/bin/python scripts/reliability.py --runs 10              # parallel, as scripts/test.sh
    .venv/bin/python scripts/reliability.py --runs 10 --serial     # the same without xdist (-n 0)

Each run is ``bash scripts/test.sh -q`` (plus ``-n 0`` for ``--serial``). Every run is reported --
status, wall seconds, pytest's counts and the ids of anything that failed or errored -- and the
full log of a run that was not green is kept, so a flake can be traced to its cause instead of
being retried away. Prints a markdown table; exits non-zero if any run was not green.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([\d.]+)s", re.M)
BAD = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def one_run(serial: bool, log_dir: Path, index: int) -> list:
    command = ["bash", "scripts/test.sh", "-q", "-rfE"] + (["-n", "0"] if serial else [])
    start = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    found = SUMMARY.findall(out)
    counts = found[-1][0] if found else "no summary"
    bad = sorted(set(BAD.findall(out)))
    if proc.returncode != 0:
        log = log_dir / f"run-{index:02d}.log"
        log.write_text(out)
        bad.append(f"(log: {log})")
    return [index, proc.returncode, f"{wall:.0f}", counts, " ".join(bad) or "-"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--serial", action="store_true", help="without pytest-xdist (-n 0)")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/megatron-study-reliability"))
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print("| run | status | wall (s) | pytest | failed or errored |\n|---|---|---|---|---|", flush=True)
    rows = []
    for i in range(1, args.runs + 1):
        rows.append(one_run(args.serial, args.log_dir, i))
        print("| " + " | ".join(str(c) for c in rows[-1]) + " |", flush=True)
    walls = sorted(float(r[2]) for r in rows)
    green = sum(r[1] == 0 for r in rows)
    print(
        f"\n{green}/{len(rows)} green ({'serial' if args.serial else 'parallel, -n 2'}); wall min "
        f"{walls[0]:.0f} s, median {walls[len(walls) // 2]:.0f} s, max {walls[-1]:.0f} s",
        flush=True,
    )
    return 0 if green == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
