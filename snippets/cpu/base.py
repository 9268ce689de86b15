"""The pieces every CPU patch is made of: its record (:class:`Patch`, :class:`Site`), a module's own
view of ``torch`` (:class:`ModuleProxy`), and the two ways a patch reaches into Megatron code.

* :func:`scope_torch` swaps names in *one module's* ``torch`` (a proxy), so nothing else sees them.
* :func:`replace_once` wraps *one function or method* in place, once; with :func:`tensor_attr_while`
  the wrapper changes a ``torch.Tensor`` attribute only while that one Megatron call runs, and puts
  back exactly what was there before (torch's own, or somebody else's shadow).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from snippets.site.sources import pinned_url


@dataclass(frozen=True)
class Site:
    """One Megatron line that needs a patch: ``path:line`` must contain ``text`` (a test checks)."""

    path: str
    line: int
    text: str

    @property
    def url(self) -> str:
        return pinned_url(self.path, self.line)


@dataclass(frozen=True)
class Patch:
    name: str
    scope: str  # "global" or the dotted Megatron module / function the patch is limited to
    what: str  # what the patch does, in one line
    why: str  # why Megatron needs it on a CPU
    sites: tuple[Site, ...]
    apply: Callable[[], None]
    proof: str = ""  # what its test (tests/ranks/test_cpu_*.py::test_<name>_...) shows, for the site


class CpuUnsupported(NotImplementedError):
    """A Megatron path that needs a GPU and that the CPU layer does not cover (raised, one line)."""


def refuse(what: str) -> Callable[..., None]:
    """A stand-in that raises :class:`CpuUnsupported` naming ``what`` instead of a raw CUDA error."""

    def refused(*args, **kwargs):
        raise CpuUnsupported(f"{what}: not supported by the CPU layer (snippets.cpu); it needs a GPU")

    return refused


class ModuleProxy:
    """Looks like ``real`` except for the names in ``overrides``; used as a module's ``torch``."""

    def __init__(self, real, **overrides):
        self._real = real
        self._overrides = overrides

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._real, name)

    def __repr__(self):
        return f"<cpu_compat proxy of {self._real.__name__}: {sorted(self._overrides)}>"


def on_cpu(device):
    """Map a CUDA device spec to the CPU, leave any other device alone."""
    if device is not None and str(device).startswith("cuda"):
        return "cpu"
    return device


def cpu_factory(factory):
    """``factory`` (``torch.zeros``, ``torch.tensor``...) with ``device="cuda"`` read as the CPU."""

    def wrapper(*args, device=None, **kwargs):
        return factory(*args, device=on_cpu(device), **kwargs)

    wrapper.__name__ = factory.__name__
    return wrapper


def unpinned(factory):
    """``factory`` (``torch.empty``...) with ``pin_memory=True`` ignored: page-locked host memory
    only speeds up copies between the host and a GPU, and torch needs the CUDA driver to make it."""

    def wrapper(*args, pin_memory=False, **kwargs):
        return factory(*args, **kwargs)

    wrapper.__name__ = factory.__name__
    return wrapper


def scope_torch(module_name: str, **overrides) -> None:
    """Replace ``torch`` in one Megatron module's globals with a proxy (once)."""
    module = importlib.import_module(module_name)
    current = module.__dict__.get("torch")
    if isinstance(current, ModuleProxy):
        # Two patches may scope the same module: the second adds its names, never drops the first's.
        current._overrides.update(overrides)
    else:
        module.torch = ModuleProxy(torch, **overrides)


def cuda_view(**overrides) -> ModuleProxy:
    """``torch.cuda`` as one module sees it: the real one except for ``overrides``."""
    return ModuleProxy(torch.cuda, **overrides)


def replace_once(owner, name: str, make: Callable[[Callable], Callable]) -> Callable:
    """Set ``owner.name`` to ``make(original)``, unless a previous call already did.

    ``owner`` is a class or a module; a classmethod or staticmethod stays one. The wrapper is
    marked (``_cpu_compat``) and keeps the original as ``__wrapped__``.
    """
    raw = vars(owner)[name]
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    original = raw.__func__ if kind else raw
    if getattr(original, "_cpu_compat", False):
        return original
    wrapper = make(original)
    wrapper._cpu_compat = True
    wrapper.__wrapped__ = original
    setattr(owner, name, kind(wrapper) if kind else wrapper)
    return wrapper


_MISSING = object()


@contextlib.contextmanager
def tensor_attr(name: str, value):
    """``torch.Tensor.<name>`` is ``value`` inside the block; afterwards it is what it was before:
    torch's own (inherited from ``TensorBase``, so the shadow is removed) or a previous shadow."""
    before = vars(torch.Tensor).get(name, _MISSING)
    setattr(torch.Tensor, name, value)
    try:
        yield
    finally:
        if before is _MISSING:
            delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, before)


def tensor_attr_while(name: str, value) -> Callable[[Callable], Callable]:
    """A ``make`` for :func:`replace_once`: the function, with ``torch.Tensor.<name> = value`` while
    (only while) it runs. Used for the method calls a module proxy cannot reach."""

    def make(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with tensor_attr(name, value):
                return fn(*args, **kwargs)

        wrapper._cpu_compat_tensor_attr = name
        return wrapper

    return make


def type_with_cuda_names(self, dtype=None, non_blocking=False, **kwargs):
    """``Tensor.type`` that names a CPU tensor's type as CUDA would (``torch.cuda.FloatTensor``).

    Only the no-argument form (asking for a type *name*) changes; conversions are untouched."""
    if dtype is None and not kwargs and self.device.type == "cpu":
        return torch._C.TensorBase.type(self).replace("torch.", "torch.cuda.", 1)
    return torch._C.TensorBase.type(self, dtype, non_blocking, **kwargs)


def same_tensor(self, *args, **kwargs):
    """``Tensor.cuda`` on a CPU: the tensor itself (the CPU is the device)."""
    return self


class NoStream:
    """Stands in for a CUDA stream on a CPU: CPU work already runs in order, nothing to wait for."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def synchronize(self):
        return None


def no_current_stream(device=None):
    return NoStream()


def no_stream_context(stream=None):
    return contextlib.nullcontext()
