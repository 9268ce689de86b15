"""The two global patches: ``torch.cuda`` functions that Megatron calls from so many files that only
replacing them for the whole process works (device placement and stream synchronization)."""

from __future__ import annotations

import torch

from snippets.cpu.base import Patch, Site


def _cpu_current_device():
    return "cpu"


def _no_synchronize(device=None):
    return None


def _patch_current_device():
    torch.cuda.current_device = _cpu_current_device


def _patch_synchronize():
    torch.cuda.synchronize = _no_synchronize


PATCHES = (
    Patch(
        name="current_device",
        scope="global",
        what='`torch.cuda.current_device()` 返回 `"cpu"`',
        why="TP 的通信函数和各种层用 `device=torch.cuda.current_device()` 分配输出缓冲，"
        "散落在许多文件的几十处，只能全局替换。",
        sites=(
            Site("megatron/core/tensor_parallel/mappings.py", 95, "device=torch.cuda.current_device()"),
            Site("megatron/core/tensor_parallel/layers.py", 305, "device=torch.cuda.current_device()"),
            Site(
                "megatron/core/models/common/embeddings/rotary_pos_embedding.py",
                162,
                "torch.cuda.current_device()",
            ),
            Site(
                "megatron/core/pipeline_parallel/p2p_communication.py",
                334,
                "device=torch.cuda.current_device()",
            ),
        ),
        apply=_patch_current_device,
        proof="`ColumnParallelLinear(gather_output=True)` 在 2 个 rank 上的输出等于用完整权重算的稠密矩阵乘",
    ),
    Patch(
        name="synchronize",
        scope="global",
        what="`torch.cuda.synchronize()` 什么也不做",
        why="CPU 上没有 CUDA stream 可等；pipeline 的 p2p 和 checkpoint 的写盘线程无条件调用它。",
        sites=(
            Site("megatron/core/pipeline_parallel/p2p_communication.py", 419, "torch.cuda.synchronize()"),
            Site(
                "megatron/core/dist_checkpointing/strategies/filesystem_async.py",
                248,
                "torch.cuda.synchronize()",
            ),
        ),
        apply=_patch_synchronize,
        proof="`dist_checkpointing.save` 再 `load` 一个按 TP 切分的张量，读回的值与写入的相同",
    ),
)
