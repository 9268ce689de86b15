"""The smallest set of patches that lets megatron-core 0.16.1 run on a CPU, and why each exists.

Megatron is written for CUDA: it allocates buffers on ``torch.cuda.current_device()``, keeps its
model-parallel RNG streams in CUDA generators and synchronizes CUDA streams. None of that changes
what the code *computes*; it only names the device. Each :class:`Patch` below replaces one such
device detail, as narrowly as possible:

* *global* patches change one ``torch.cuda`` function for every module (only where many Megatron
  files call it);
* *scoped* patches give one Megatron module its own view of ``torch`` (a proxy that differs in
  one or two names), so nothing else in the process sees a change.

We never edit Megatron's files. :func:`apply` is idempotent and does nothing when CUDA is
available, so the same experiment runs unpatched under ``torchrun`` on GPUs. The table on the
site page "在 CPU 上运行 Megatron Core" is rendered from :data:`PATCHES` (a test keeps them equal).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from snippets.sources import pinned_url


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
    scope: str  # "global" or the dotted Megatron module the patch is limited to
    what: str   # what the patch does, in one line
    why: str    # why Megatron needs it on a CPU
    sites: tuple[Site, ...]
    apply: Callable[[], None]


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


def _on_cpu(device):
    """Map a CUDA device spec to the CPU, leave any other device alone."""
    if device is None:
        return device
    if str(device).startswith("cuda"):
        return "cpu"
    return device


def _cpu_factory(factory):
    def wrapper(*args, device=None, **kwargs):
        return factory(*args, device=_on_cpu(device), **kwargs)

    wrapper.__name__ = factory.__name__
    return wrapper


def _scope_torch(module_name: str, **overrides) -> None:
    """Replace ``torch`` in one Megatron module's globals with a proxy (once)."""
    module = importlib.import_module(module_name)
    if not isinstance(module.__dict__.get("torch"), ModuleProxy):
        module.torch = ModuleProxy(torch, **overrides)


# ---------------------------------------------------------------- the patches


def _patch_current_device():
    torch.cuda.current_device = _cpu_current_device


def _cpu_current_device():
    return "cpu"


def _patch_synchronize():
    torch.cuda.synchronize = _no_synchronize


def _no_synchronize(device=None):
    return None


def _patch_rng_tracker():
    # Megatron's tracker keeps named RNG streams ("model-parallel-rng", ...) and swaps them into
    # the CUDA generator around TP-region dropout and init. On CPU the generator that dropout and
    # init actually draw from is the CPU default generator, so the tracker swaps that one.
    from megatron.core.tensor_parallel import random as mrandom

    cuda_view = ModuleProxy(
        torch.cuda,
        get_rng_state=_cpu_get_rng_state,
        manual_seed=torch.manual_seed,
        random=ModuleProxy(torch.cuda.random, get_rng_state=_cpu_get_rng_state),
    )
    _scope_torch("megatron.core.tensor_parallel.random", cuda=cuda_view)
    mrandom._set_cuda_rng_state = _cpu_set_rng_state


def _cpu_get_rng_state(device=None):
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def _patch_schedules_device():
    # The schedules count tokens in a 0-d tensor created with a literal device="cuda".
    _scope_torch("megatron.core.pipeline_parallel.schedules", zeros=_cpu_factory(torch.zeros))


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="current_device",
        scope="global",
        what='`torch.cuda.current_device()` 返回 `"cpu"`',
        why="TP 的通信函数和各种层用 `device=torch.cuda.current_device()` 分配输出缓冲，"
        "散落在许多文件的几十处，只能全局替换。",
        sites=(
            Site("megatron/core/tensor_parallel/mappings.py", 91, "device=torch.cuda.current_device()"),
            Site("megatron/core/tensor_parallel/layers.py", 261, "device=torch.cuda.current_device()"),
            Site("megatron/core/models/common/embeddings/rotary_pos_embedding.py", 162,
                 "torch.cuda.current_device()"),
            Site("megatron/core/pipeline_parallel/p2p_communication.py", 313,
                 "device=torch.cuda.current_device()"),
        ),
        apply=_patch_current_device,
    ),
    Patch(
        name="synchronize",
        scope="global",
        what="`torch.cuda.synchronize()` 什么也不做",
        why="CPU 上没有 CUDA stream 可等；pipeline 的 p2p 和 checkpoint 的写盘线程无条件调用它。",
        sites=(
            Site("megatron/core/pipeline_parallel/p2p_communication.py", 398, "torch.cuda.synchronize()"),
            Site("megatron/core/dist_checkpointing/strategies/filesystem_async.py", 230,
                 "torch.cuda.synchronize()"),
        ),
        apply=_patch_synchronize,
    ),
    Patch(
        name="rng_tracker",
        scope="megatron.core.tensor_parallel.random",
        what="RNG tracker 读、设、还原的是 CPU 默认生成器",
        why="`model_parallel_cuda_manual_seed` 和 `CudaRNGStatesTracker.add/fork` 调用 "
        "`torch.cuda.get_rng_state` / `manual_seed` 并设置 CUDA 生成器状态，需要 GPU；"
        "CPU 上 dropout 和初始化真正用的是 CPU 默认生成器，所以让 tracker 切换它。",
        sites=(
            Site("megatron/core/tensor_parallel/random.py", 55, "torch.cuda.random.get_rng_state"),
            Site("megatron/core/tensor_parallel/random.py", 235, "torch.cuda.get_rng_state()"),
            Site("megatron/core/tensor_parallel/random.py", 422, "torch.cuda.manual_seed"),
        ),
        apply=_patch_rng_tracker,
    ),
    Patch(
        name="schedules_device",
        scope="megatron.core.pipeline_parallel.schedules",
        what='`torch.zeros(..., device="cuda")` 落在 CPU 上',
        why='每个 forward-backward schedule 都用写死的 `device="cuda"` 建 token 计数器。',
        sites=(
            Site("megatron/core/pipeline_parallel/schedules.py", 596, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 983, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 2138, 'device="cuda"'),
        ),
        apply=_patch_schedules_device,
    ),
)

_applied: set[str] = set()


def apply(names: list[str] | None = None) -> list[str]:
    """Apply the patches (all, or those named) once; return the names applied so far.

    With CUDA available nothing is patched: the real code runs as published.
    """
    if torch.cuda.is_available():
        return []
    for patch in PATCHES:
        if (names is None or patch.name in names) and patch.name not in _applied:
            patch.apply()
            _applied.add(patch.name)
    return sorted(_applied)


def render_table() -> str:
    """The patch table shown on the site (markdown), one row per patched Megatron line."""
    rows = ["| 补丁 | 范围 | 做了什么 | 为什么 | 需要它的 Megatron 行 |", "|---|---|---|---|---|"]
    for patch in PATCHES:
        links = "<br>".join(f"[`{s.path}:{s.line}`]({s.url})" for s in patch.sites)
        rows.append(f"| `{patch.name}` | `{patch.scope}` | {patch.what} | {patch.why} | {links} |")
    return "\n".join(rows)

