"""The smallest set of patches that lets megatron-core 0.19.0 run on a CPU, and why each exists.

Megatron is written for CUDA: it allocates buffers on ``torch.cuda.current_device()``, keeps its
model-parallel RNG streams in CUDA generators and synchronizes CUDA streams. None of that changes
what the code *computes*; it only names the device. Each :class:`Patch` replaces one such device
detail, as narrowly as possible (:mod:`snippets.cpu.base` has the means):

* *global* patches change one ``torch.cuda`` function for every module (only where many Megatron
  files call it): :mod:`~snippets.cpu.devices`, which also keeps ``torch.cuda.is_available()`` from
  marking the process that forks the ranks as one that may hold CUDA (torch's CUDA build does, and
  every rank forked from it then refuses CUDA; :mod:`snippets.ranks.fork_safe`);
* *scoped* patches give one Megatron module its own view of ``torch`` (a proxy that differs in one
  or two names), or change a ``torch.Tensor`` method only while one Megatron call runs.

One module per Megatron area: :mod:`~snippets.cpu.rng` (tensor_parallel.random, the rerun state
machine), :mod:`~snippets.cpu.tp_data` (tensor_parallel.data), :mod:`~snippets.cpu.pipeline`,
:mod:`~snippets.cpu.models`, :mod:`~snippets.cpu.moe`,
:mod:`~snippets.cpu.optimizer`, :mod:`~snippets.cpu.distributed` (distributed optimizer, DDP),
:mod:`~snippets.cpu.resharding`. We never edit Megatron's files. :func:`apply` is idempotent and does
nothing when CUDA is available, so the same experiment runs unpatched under ``torchrun`` on GPUs.
The table on the site page "在 CPU 上运行 Megatron Core" is rendered from :data:`PATCHES`.
"""

from __future__ import annotations

import torch

from snippets.cpu import devices, distributed, models, moe, optimizer, pipeline, resharding, rng, tp_data
from snippets.cpu.base import CpuUnsupported, ModuleProxy, Patch, Site

__all__ = ["PATCHES", "CpuUnsupported", "ModuleProxy", "Patch", "Site", "apply", "render_table"]

AREAS = (devices, rng, tp_data, pipeline, models, moe, optimizer, distributed, resharding)
"""The modules of the CPU layer, in the order their patches are applied and shown."""

PATCHES: tuple[Patch, ...] = tuple(patch for area in AREAS for patch in area.PATCHES)

_applied: set[str] = set()


def apply(names: list[str] | None = None) -> list[str]:
    """Apply the patches (all, or those named) once; return the names applied so far.

    With CUDA available nothing is patched: the real code runs as published. The availability
    check itself goes through :func:`~snippets.cpu.devices.probe_cuda_without_poisoning_fork`
    first, so asking does not make this rank's own children refuse CUDA.
    """
    devices.probe_cuda_without_poisoning_fork()
    if torch.cuda.is_available():
        return []
    for patch in PATCHES:
        if (names is None or patch.name in names) and patch.name not in _applied:
            patch.apply()
            _applied.add(patch.name)
    return sorted(_applied)


def render_table() -> str:
    """The patch table shown on the site (markdown), one row per patched Megatron line."""
    rows = [
        "| 补丁 | 范围 | 做了什么 | 为什么 | 需要它的 Megatron 行 | 证明它的测试 |",
        "|---|---|---|---|---|---|",
    ]
    for patch in PATCHES:
        links = "<br>".join(f"[`{s.path}:{s.line}`]({s.url})" for s in patch.sites)
        rows.append(
            f"| `{patch.name}` | `{patch.scope}` | {patch.what} | {patch.why} | {links} | {patch.proof} |"
        )
    return "\n".join(rows)
