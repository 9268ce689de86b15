"""Megatron's model-parallel RNG on a CPU, kept as it behaves on a GPU.

On a GPU two generators are in play: the CPU one (``torch.manual_seed``; it draws the weights built
with ``use_cpu_initialization=True``) and the CUDA one, into which ``CudaRNGStatesTracker.fork()``
swaps a named stream (``model-parallel-rng``: one per TP rank) for TP-region dropout and init.
``model_parallel_cuda_manual_seed`` seeds only CUDA generators, so the CPU generator is untouched.

On a CPU every draw comes from the process's default generator, so that generator plays the device
generator's part *inside* ``fork()``: the stream is lent to it and taken back on exit, where the
default generator resumes exactly where it was (Megatron's own save / restore, unchanged). Outside
``fork()`` the default generator stays the user's: the tracker creates its streams in a generator of
their own (:data:`STREAMS`), and ``model_parallel_cuda_manual_seed``'s reseed of the device generator
with ``seed`` (random.py:490) is left out, because on a CPU it would reseed the user's generator.
"""

from __future__ import annotations

import logging

import torch

from snippets.cpu.base import (
    ModuleProxy,
    Patch,
    Site,
    cuda_view,
    refuse,
    replace_once,
    scope_torch,
)

STREAMS = torch.Generator()
"""Where ``CudaRNGStatesTracker.add`` seeds and reads each new stream (never the default one)."""

_adding = 0  # > 0 while CudaRNGStatesTracker.add runs


def _device_get_rng_state(device="cuda"):
    return STREAMS.get_state() if _adding else torch.get_rng_state()


def _device_manual_seed(seed):
    # Inside add(): seed the streams' own generator. Outside (model_parallel_cuda_manual_seed's
    # default state): the device generator is the user's default generator; leave it alone.
    if _adding:
        STREAMS.manual_seed(seed)


_GRAPH_SAFE = "use_cudagraphable_rng (graph-safe CUDA RNG states)"
_refuse_graph_safe = refuse(_GRAPH_SAFE)


def _device_set_rng_state(new_state, device=-1, graph_safe=False):
    if graph_safe:
        _refuse_graph_safe()
    if _adding:
        STREAMS.set_state(new_state)
    else:
        torch.set_rng_state(new_state)


def _graph_safe_get_refused(get):
    def wrapper(device="cuda", clone=False, graph_safe=False):
        if graph_safe:
            _refuse_graph_safe()  # else torch.cuda._lazy_init: "Torch not compiled with CUDA enabled"
        return get(device, clone, graph_safe)

    return wrapper


def _cudagraphable_tracker_refused(init):
    def wrapper(self, use_cudagraphable_rng=False, *args, **kwargs):
        if use_cudagraphable_rng:
            _refuse_graph_safe()  # else Megatron's assert that torch lacks CUDA graph generators
        return init(self, use_cudagraphable_rng, *args, **kwargs)

    return wrapper


def _streams_in_their_own_generator(add):
    def wrapper(self, name, seed):
        global _adding
        _adding += 1
        try:
            return add(self, name, seed)
        finally:
            _adding -= 1

    return wrapper


class _SameGeneratorWarning(logging.Filter):
    """fork() warns when the CPU generator moved while the CUDA one was forked. On a CPU the two are
    one generator, so every draw inside fork() would trigger it; only that message is dropped."""

    def filter(self, record):
        return record.getMessage() != "CPU RNG state changed within GPU RNG context"


def _patch_rng_tracker():
    from megatron.core.tensor_parallel import random as mrandom

    view = cuda_view(
        get_rng_state=_device_get_rng_state,
        manual_seed=_device_manual_seed,
        random=ModuleProxy(torch.cuda.random, get_rng_state=_device_get_rng_state),
    )
    scope_torch("megatron.core.tensor_parallel.random", cuda=view)
    mrandom._set_cuda_rng_state = _device_set_rng_state
    replace_once(mrandom.CudaRNGStatesTracker, "add", _streams_in_their_own_generator)
    logger = logging.getLogger(mrandom.__name__)
    if not any(isinstance(f, _SameGeneratorWarning) for f in logger.filters):
        logger.addFilter(_SameGeneratorWarning())


def _patch_cudagraph_rng():
    from megatron.core.tensor_parallel import random as mrandom

    replace_once(mrandom, "_get_cuda_rng_state", _graph_safe_get_refused)
    replace_once(mrandom.CudaRNGStatesTracker, "__init__", _cudagraphable_tracker_refused)


def _patch_rerun_state_rng():
    # The rerun state machine saves and restores the CUDA generator next to the CPU one, to replay
    # a step; on a CPU the device generator is the default one, which it saves as well.
    view = cuda_view(
        get_rng_state=lambda device="cuda": torch.get_rng_state(),
        set_rng_state=lambda new_state, device="cuda": torch.set_rng_state(new_state),
    )
    scope_torch("megatron.core.rerun_state_machine", cuda=view)


def _share_storage_by_copy(dst, src):
    # What the compiled share_storage does at the StorageImpl level (every view of dst sees src's
    # data, no version-counter bump), done by filling dst's own storage: same values, same views.
    target, source = dst.untyped_storage(), src.untyped_storage()
    target.resize_(source.nbytes())
    target.copy_(source)


def _patch_share_storage():
    # 0.19.0's CheckpointWithoutOutput compiles a C++ extension (load_inline) on first recompute to
    # point the freed output's storage at the recomputed data. On a CPU zero-copy buys nothing, and
    # the build needs a compiler and ninja, breaks when the venv's path has a space (torch passes
    # -L<torch/lib> unquoted: seen), and races when several forked ranks build it at once.
    from megatron.core.tensor_parallel import random as mrandom

    replace_once(mrandom, "_get_share_storage", lambda original: lambda: _share_storage_by_copy)


PATCHES = (
    Patch(
        name="rng_tracker",
        scope="megatron.core.tensor_parallel.random",
        what="`fork()` 里把 tracker 的流借给 CPU 默认生成器、退出时还原；流在自己的生成器里建，"
        "`model_parallel_cuda_manual_seed` 不再重设默认生成器",
        why="tracker 用 `torch.cuda.get_rng_state` / `manual_seed` 建流、在 CUDA 生成器里切换，需要 GPU。"
        "GPU 上 `model_parallel_cuda_manual_seed` 只动 CUDA 生成器，`use_cpu_initialization` 的权重只取决于 "
        "`torch.manual_seed`；CPU 上只有一个默认生成器，所以只在 `fork()` 里让它扮演 CUDA 生成器，"
        "其余时候它仍归 `torch.manual_seed` 管。",
        sites=(
            Site("megatron/core/tensor_parallel/random.py", 118, "torch.cuda.random.get_rng_state"),
            Site("megatron/core/tensor_parallel/random.py", 303, "torch.cuda.get_rng_state()"),
            Site("megatron/core/tensor_parallel/random.py", 305, "torch.cuda.manual_seed(seed)"),
            Site("megatron/core/tensor_parallel/random.py", 490, "torch.cuda.manual_seed"),
        ),
        apply=_patch_rng_tracker,
        proof="同一个 `torch.manual_seed`、不同的 Megatron 种子：`use_cpu_initialization` 的权重在 TP=1、2、4 "
        "下拼起来是同一个矩阵；`fork()` 里的流同一 TP rank 相同、不同 TP rank 不同，`fork()` 外的 dropout "
        "各 TP rank 相同，默认生成器不被 `model_parallel_cuda_manual_seed` 和 `fork()` 改变",
    ),
    Patch(
        name="cudagraph_rng_refused",
        scope="megatron.core.tensor_parallel.random",
        what="`use_cudagraphable_rng=True` 的 tracker 和 graph-safe 的读、设 RNG 状态报一行 `CpuUnsupported`",
        why="CUDA graph 用的生成器状态（`graphsafe_get_state`、`clone_state`、`CUDAGraph.register_generator_state`）"
        "只有 GPU 上有；CPU 版 torch 上建这种 tracker 是 Megatron 的断言，转换状态是 CUDA 初始化错误。"
        "笔记不用 CUDA graph，与其报这两种错，不如直接说清缺的是什么。",
        sites=(
            Site("megatron/core/tensor_parallel/random.py", 120, "_lazy_init()"),
            Site("megatron/core/tensor_parallel/random.py", 245, 'hasattr(torch.cuda.CUDAGraph, "register_'),
        ),
        apply=_patch_cudagraph_rng,
        proof="`CudaRNGStatesTracker(use_cudagraphable_rng=True)` 和 `convert_cuda_rng_state(..., to_graphable=True)` "
        "各抛出一行 `CpuUnsupported`，点名 `use_cudagraphable_rng`；不用 CUDA graph 的 tracker 照常工作",
    ),
    Patch(
        name="rerun_state_rng",
        scope="megatron.core.rerun_state_machine",
        what="`torch.cuda.get_rng_state()` / `set_rng_state()` 读、设 CPU 默认生成器",
        why="rerun 状态机为了重放一步，在 CPU 生成器旁边也保存、还原 CUDA 生成器；CPU 上扮演 "
        "CUDA 生成器的就是默认生成器。",
        sites=(
            Site("megatron/core/rerun_state_machine.py", 979, "torch.cuda.get_rng_state()"),
            Site("megatron/core/rerun_state_machine.py", 992, "torch.cuda.set_rng_state"),
        ),
        apply=_patch_rerun_state_rng,
        proof="`RerunStateMachine` 保存状态、抽几个随机数、还原之后，再抽的数与第一次相同",
    ),
    Patch(
        name="share_storage_by_copy",
        scope="megatron.core.tensor_parallel.random._get_share_storage",
        what="重算出的输出不再经编译出的 C++ 扩展共享 storage，而是把数据拷进原输出那块（已被释放的）storage",
        why="0.19.0 的 `CheckpointWithoutOutput` 第一次重算时用 `load_inline` 现场编译一个小扩展，让原输出的 "
        "StorageImpl 直接指向重算结果（零拷贝、所有 view 都看得到）。CPU 上零拷贝没有好处，编译却要 C++ 编译器和 "
        "ninja，venv 路径含空格时链接失败（torch 给的 `-L` 路径没加引号，亲见），"
        "几个 fork 出的 rank 同时编译还会互相踩。"
        "拷进同一块 storage 后，所有 view 看到的值相同，也不动 tensor 的版本计数。",
        sites=(
            Site("megatron/core/tensor_parallel/random.py", 69, "def _get_share_storage"),
            Site("megatron/core/tensor_parallel/random.py", 821, "share_storage = _get_share_storage()"),
        ),
        apply=_patch_share_storage,
        proof="`CheckpointWithoutOutput` 包住的一段在反向时重算：事先从输出取的 view 看到重算值，"
        "梯度与不重算时逐位相同，不经编译",
    ),
)
