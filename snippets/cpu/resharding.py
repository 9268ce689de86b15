"""Resharding (refit): the gloo copy service's CUDA copy stream and its pinned staging buffers."""

from __future__ import annotations

import torch

from snippets.cpu.base import (
    NoStream,
    Patch,
    Site,
    cuda_view,
    no_current_stream,
    no_stream_context,
    scope_torch,
    unpinned,
)


def _patch_refit_streams():
    # The gloo refit service makes a "copy stream" in __init__, runs its local copies and the
    # write-back of what it received on that stream, synchronizes the current stream after staging
    # its sends and makes the current stream wait on the copy stream at the end. The transfer
    # itself is gloo over CPU tensors either way.
    view = cuda_view(Stream=NoStream, current_stream=no_current_stream, stream=no_stream_context)
    scope_torch("megatron.core.resharding.copy_services.gloo_copy_service", cuda=view)


def _patch_refit_pinned_buffers():
    # Every send and receive is staged through a CPU buffer made with pin_memory=True, for faster
    # copies to and from the GPU tensors; torch needs the CUDA driver to page-lock memory.
    scope_torch("megatron.core.resharding.copy_services.gloo_copy_service", empty=unpinned(torch.empty))


PATCHES = (
    Patch(
        name="refit_streams",
        scope="megatron.core.resharding.copy_services.gloo_copy_service",
        what="`torch.cuda.Stream()`、`current_stream()` 返回一个什么都不用等的替身，"
        "`torch.cuda.stream(...)` 什么也不切换",
        why='`swap_model_weights(..., "gloo")` 的 `GlooCopyService` 传输本身走 gloo 和 CPU 张量，'
        "却在构造时建一个 CUDA copy stream，本地拷贝和收到数据后的写回都在它上面做，"
        "发送前同步当前 stream，传完后让当前 stream 等它；CPU 版 torch 建 stream 直接报错。",
        sites=(
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 34, "torch.cuda.Stream()"),
            Site(
                "megatron/core/resharding/copy_services/gloo_copy_service.py",
                73,
                "torch.cuda.stream(self._copy_stream)",
            ),
            Site(
                "megatron/core/resharding/copy_services/gloo_copy_service.py",
                96,
                "torch.cuda.current_stream().synchronize()",
            ),
            Site(
                "megatron/core/resharding/copy_services/gloo_copy_service.py",
                120,
                "torch.cuda.stream(self._copy_stream)",
            ),
            Site(
                "megatron/core/resharding/copy_services/gloo_copy_service.py",
                128,
                "torch.cuda.current_stream().wait_stream",
            ),
        ),
        apply=_patch_refit_streams,
        proof='2 个 rank 上真实的 `swap_model_weights(..., "'
        'gloo")` 把 TP=2 切开的 `ColumnParallelLinear'
        "` 权重搬进每个 rank 一份完整副本（TP=1）："
        "搬完的权重等于 all-gather 拼起来的原权重，"
        "一半来自本 rank（本地拷贝）、一半来自另一 rank",
    ),
    Patch(
        name="refit_pinned_buffers",
        scope="megatron.core.resharding.copy_services.gloo_copy_service",
        what="`torch.empty(..., pin_memory=True)` 建普通（不锁页）的 CPU 张量",
        why="0.19.0 的 `GlooCopyService` 每次收、发都先拷进一块 `pin_memory=True` 的 CPU 缓冲，"
        "好让它与 GPU 之间的拷贝更快；锁页内存要 CUDA 驱动才建得出来。"
        "CPU 上张量本来就在主机内存里，锁不锁页算的都一样。",
        sites=(
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 46, "pin_memory=True"),
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 90, "pin_memory=True"),
        ),
        apply=_patch_refit_pinned_buffers,
        proof='2 个 rank、TP=2 → TP=1 的 `swap_model_weights(..., "gloo")`：'
        "另一 rank 发来的那一半经过这块缓冲，搬完的权重等于 all-gather 拼起来的原权重",
    ),
)
