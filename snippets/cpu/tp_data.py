"""``tensor_parallel.broadcast_data``: the batch TP rank 0 sends to its TP group is moved to CUDA
first (the sizes with ``device='cuda'``, the values with ``.cuda()``)."""

from __future__ import annotations

import torch

from snippets.cpu.base import (
    Patch,
    Site,
    cpu_factory,
    replace_once,
    same_tensor,
    scope_torch,
    tensor_attr_while,
)


def _patch_broadcast_data_cuda():
    # TP rank 0 packs the sizes in a device='cuda' tensor and the values with data[key].cuda(),
    # then broadcasts both over the TP group; on a CPU the broadcast is the same gloo collective.
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import data

    scope_torch("megatron.core.tensor_parallel.data", tensor=cpu_factory(torch.tensor))
    tensor_parallel.broadcast_data = replace_once(
        data, "broadcast_data", tensor_attr_while("cuda", same_tensor)
    )


PATCHES = (
    Patch(
        name="broadcast_data_cuda",
        scope="megatron.core.tensor_parallel.data",
        what="`device='cuda'` 的尺寸张量落在 CPU 上；只在 `broadcast_data` 运行期间，`Tensor.cuda()` 返回张量本身",
        why="`broadcast_data` 让 TP rank 0 把一个 batch 的尺寸和数值先搬到 GPU（`device='cuda'`、`.cuda()`），"
        "再在 TP 群里 broadcast 给其余 rank；CPU 版 torch 在这两处报错，broadcast 本身照常走 gloo。",
        sites=(
            Site("megatron/core/tensor_parallel/data.py", 37, "device='cuda'"),
            Site("megatron/core/tensor_parallel/data.py", 84, "data[key].cuda()"),
        ),
        apply=_patch_broadcast_data_cuda,
        proof="TP=2：只有 TP rank 0 持有的 `tokens` / `labels` 经 `broadcast_data` 到达 rank 1，"
        "形状、dtype、数值都与 rank 0 的相同",
    ),
)
