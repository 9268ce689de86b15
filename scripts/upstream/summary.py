"""Counts per test file from rank 0's results (``*.jsonl``, one line per test as it ends):
``python summary.py OUT_DIR`` prints a markdown table (passed / failed / skipped / not reached, when
an area hit its time bound, deselected as Megatron's CI deselects it) and, per failure, the first line
of its message."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def main(out: Path) -> None:
    counts: dict[str, Counter] = defaultdict(Counter)
    failures = []
    for results in sorted(out.glob("*.jsonl")):
        final: dict[str, dict] = {}
        for line in results.read_text().splitlines():
            row = json.loads(line)
            if row["outcome"] == "collected":
                final.setdefault(row["id"], row)
            elif final.get(row["id"], {}).get("outcome") in (None, "collected", "passed"):
                final[row["id"]] = row  # a failed teardown after a passed call counts as failed
        for test_id, row in final.items():
            path = test_id.split("::", 1)[0].split("unit_tests/", 1)[-1]
            kind = {"collected": "not reached"}.get(row["outcome"], row["outcome"])
            counts[path][kind] += 1
            if kind == "failed":
                first = (row.get("message") or "").strip().splitlines()
                failures.append(f"`{test_id.split('unit_tests/', 1)[-1]}`: {first[0][:160] if first else ''}")
    kinds = ("passed", "failed", "skipped", "deselected", "not reached")
    print("| file | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
    for path in sorted(counts):
        print(f"| `{path}` | " + " | ".join(str(counts[path][k]) for k in kinds) + " |")
    total = sum(counts.values(), Counter())
    print("| **total** | " + " | ".join(str(total[k]) for k in kinds) + " |")
    for line in failures:
        print(f"- {line}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
