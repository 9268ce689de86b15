"""Resharding (refit): the gloo copy service's CUDA copy stream."""

from __future__ import annotations

from snippets.cpu.base import NoStream, Patch, Site, cuda_view, no_current_stream, scope_torch


def _patch_refit_streams():
    # The gloo refit service makes a "copy stream" in __init__ and, after its p2p batch, makes the
    # current stream wait on it. The transfer itself is gloo over CPU tensors either way.
    view = cuda_view(Stream=NoStream, current_stream=no_current_stream)
    scope_torch("megatron.core.resharding.copy_services.gloo_copy_service", cuda=view)


PATCHES = (
    Patch(
        name="refit_streams",
        scope="megatron.core.resharding.copy_services.gloo_copy_service",
        what="`torch.cuda.Stream()` 和 `torch.cuda.current_stream()` 返回一个什么都不用等的替身",
        why='`swap_model_weights(..., "gloo")` 的 `GlooCopyService` 传输本身走 gloo 和 CPU 张量，'
        "却在构造时建一个 CUDA copy stream，传完后让当前 stream 等它；CPU 版 torch 建 stream 直接报错。",
        sites=(
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 34, "torch.cuda.Stream()"),
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
)
