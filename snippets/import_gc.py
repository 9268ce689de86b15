"""Import torch, megatron.core and the other large packages without Python's cyclic collector.

Importing torch and megatron.core creates ~400k objects that live as long as the process (and
~240k that end in cycles). While they are being created, Python's collector walks every tracked
object again and again (six full collections for torch + megatron.core's GPT model here): ~2.3 of
the ~5 CPU seconds the imports take, in every process that imports them. A test run starts dozens
of such processes (pytest workers, kernel zygotes, ``python -m snippets.run`` jobs, torchrun ranks).

:func:`install` puts a finder first on ``sys.meta_path``. When one of :data:`LARGE` (or a
submodule) is imported and no such import is already under way, the collector is off while the
module runs; at the end, one collection frees what the import left in cycles and ``gc.freeze()``
moves what survives out of later collections' way. The module keeps its own loader: nothing of
this finder stays on it afterwards.
"""

from __future__ import annotations

import gc
import importlib.abc
import sys

LARGE = ("torch", "megatron", "transformers", "matplotlib", "numpy", "PIL")
"""Top-level packages whose imports create most of a process's long-lived objects."""


class _Loader(importlib.abc.Loader):
    def __init__(self, real, finder: _Finder) -> None:
        self._real, self._finder = real, finder

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        self._finder.depth += 1
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._real.exec_module(module)
        finally:
            module.__loader__ = self._real
            if module.__spec__ is not None:
                module.__spec__.loader = self._real
            self._finder.depth -= 1
            if enabled:
                gc.collect()
                gc.freeze()
                gc.enable()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.depth = 0  # > 0 while a large import runs: the modules it imports need no wrapping

    def find_spec(self, name, path=None, target=None):
        if self.depth or name.partition(".")[0] not in LARGE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find else None
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per process; forked children inherit it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
