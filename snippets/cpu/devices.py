"""The global patches: ``torch.cuda`` functions that Megatron calls from so many files that only
replacing them for the whole process works (device placement and stream synchronization), and the
CUDA availability check, which must not mark the process that forks the ranks as "CUDA initialized"."""

from __future__ import annotations

import ctypes
import functools

import torch

from snippets.cpu.base import Patch, Site, replace_once


def _cpu_current_device():
    return "cpu"


def _no_synchronize(device=None):
    return None


@functools.cache
def _cuda_driver_loads() -> bool:
    """Whether the CUDA driver library can be loaded. Without it ``cudaGetDeviceCount`` fails and
    ``torch.cuda.is_available()`` is False; loading a library initializes nothing."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _available_without_poisoning_fork(is_available):
    @functools.wraps(is_available)
    def wrapper():
        return _cuda_driver_loads() and is_available()

    return wrapper


def probe_cuda_without_poisoning_fork() -> None:
    """Make ``torch.cuda.is_available()`` answer False without asking the CUDA runtime when there
    is no CUDA driver. The answer is the same; what changes is that torch's CUDA build no longer
    records, on every call, that this process may have initialized CUDA, which makes every
    process forked from it refuse CUDA calls ("Cannot re-initialize CUDA in forked subprocess").
    Importing megatron.core calls it twice. Run it before that in every process that forks ranks
    (:mod:`snippets.ranks.fork_safe`); :func:`snippets.cpu.apply` runs it first too."""
    replace_once(torch.cuda, "is_available", _available_without_poisoning_fork)


def _patch_current_device():
    torch.cuda.current_device = _cpu_current_device


def _patch_synchronize():
    torch.cuda.synchronize = _no_synchronize


PATCHES = (
    Patch(
        name="cuda_probe_fork_safe",
        scope="global",
        what="没有 CUDA 驱动（`libcuda.so.1` 加载不了）时，`torch.cuda.is_available()` "
        "直接答 False，不去问 CUDA runtime",
        why="PyPI 上给 Python 3.12 的 torch 是 CUDA 版：它的 `is_available()` 每次都经 "
        "`cudaGetDeviceCount` 回答，同时把进程记成“可能初始化过 CUDA”，"
        "从它 fork 的进程一碰 CUDA 就报 `Cannot re-initialize CUDA in forked subprocess`。"
        "导入 megatron.core 就问了两次（一次经 torch 的 `cpp_extension`，机器上装了 CUDA 工具链时）。"
        "没有驱动时答案本来就是 False，只是不再记这一笔；"
        "fork rank 的进程在导入 Megatron 之前装上它（`snippets.ranks.fork_safe`）。",
        sites=(
            Site(
                "megatron/core/dist_checkpointing/strategies/torch.py",
                67,
                "if not torch.cuda.is_available():",
            ),
            Site("megatron/core/tensor_parallel/random.py", 17, "from torch.utils.cpp_extension import"),
        ),
        apply=probe_cuda_without_poisoning_fork,
        proof="新起的进程照 fork server 的顺序导入 torch、megatron.core 和 rank 要用的模块，"
        "再 fork：子进程里 `torch.cuda._is_in_bad_fork()` 为 False，`is_available()` 为 False",
    ),
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
