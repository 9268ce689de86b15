"""snippets.import_gc: torch imports with the collector off and is collected once at the end; the
module keeps its own loader; a process that turned the collector off keeps it off."""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from snippets import import_gc

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
    # Without the finder, importing torch here runs ~370 collections, two of them full ones.
    quiet = probe("import snippets, snippets.import_gc as m; m.install()")  # a second install adds nothing
    assert quiet["collections"] == [2]  # the one full collection after torch's import
    assert quiet["enabled"] and quiet["frozen"] > 100_000 and quiet["finders"] == 1
    assert quiet["loader"] == quiet["spec_loader"] == "SourceFileLoader"


def _exec_through_the_finder(collector_on: bool) -> dict:
    seen = {}

    class Real(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            seen["on while it runs"] = gc.isenabled()

    spec = importlib.machinery.ModuleSpec("torch_like", Real())
    module = importlib.util.module_from_spec(spec)
    frozen = gc.get_freeze_count()
    was = gc.isenabled()
    (gc.enable if collector_on else gc.disable)()
    try:
        import_gc._Loader(spec.loader, import_gc._Finder()).exec_module(module)
        seen["on after"] = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    seen["froze"] = gc.get_freeze_count() > frozen
    seen["own loader"] = module.__loader__ is spec.loader and module.__spec__.loader is spec.loader
    return seen


def test_the_module_runs_with_the_collector_off_and_keeps_its_loader():
    assert _exec_through_the_finder(True) == {
        "on while it runs": False,
        "on after": True,
        "froze": True,
        "own loader": True,
    }


def test_the_collector_stays_off_if_the_process_turned_it_off():
    assert _exec_through_the_finder(False) == {
        "on while it runs": False,
        "on after": False,
        "froze": False,
        "own loader": True,
    }
