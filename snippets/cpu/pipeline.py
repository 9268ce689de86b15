"""The pipeline schedules: their token counter is made with a literal ``device="cuda"``."""

from __future__ import annotations

import torch

from snippets.cpu.base import Patch, Site, cpu_factory, scope_torch


def _patch_schedules_device():
    # The schedules count tokens in a 0-d tensor created with a literal device="cuda".
    scope_torch("megatron.core.pipeline_parallel.schedules", zeros=cpu_factory(torch.zeros))


PATCHES = (
    Patch(
        name="schedules_device",
        scope="megatron.core.pipeline_parallel.schedules",
        what='`torch.zeros(..., device="cuda")` 落在 CPU 上',
        why='每个 forward-backward schedule 都用写死的 `device="cuda"` 建 token 计数器。',
        sites=(
            Site("megatron/core/pipeline_parallel/schedules.py", 749, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 1121, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 2292, 'device="cuda"'),
        ),
        apply=_patch_schedules_device,
        proof="`forward_backward_no_pipelining` 的 loss 和梯度等于直接用 autograd 算的",
    ),
)
