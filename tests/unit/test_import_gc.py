"""snippets.import_gc: torch imports with the collector off, collected once at the end, and the
module keeps torch's own loader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
{setup}
seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
import torch
import torch.nn
print(json.dumps({{
    "collections": seen,
    "enabled": gc.isenabled(),
    "frozen": gc.get_freeze_count(),
    "loader": type(torch.__loader__).__name__,
    "spec_loader": type(torch.__spec__.loader).__name__,
    "finders": [type(f).__name__ for f in sys.meta_path].count("_Finder"),
}}))
"""


def probe(setup: str) -> dict:
    code = PROBE.format(setup=setup)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_torch_imports_with_one_collection_at_the_end():
    plain = probe("")
    quiet = probe("import snippets, snippets.import_gc as m; m.install()")  # a second install adds nothing
    assert len(plain["collections"]) > 10 and 2 in plain["collections"]  # what the finder avoids
    assert quiet["collections"] == [2]  # the one full collection after torch's import
    assert quiet["enabled"] and quiet["frozen"] > 100_000 and quiet["finders"] == 1
    assert quiet["loader"] == quiet["spec_loader"] == plain["loader"] == "SourceFileLoader"


def test_the_collector_stays_off_if_the_process_turned_it_off():
    off = probe("import snippets; gc.disable()")
    assert off["collections"] == [] and not off["enabled"] and off["frozen"] == 0
