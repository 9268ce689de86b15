"""Mixture of experts without Transformer Engine: the all-to-all dispatcher's device-to-host side
stream and host split sizes. (0.16.1 also needed ``moe_utils.te_general_gemm = None``; at 0.19.0
``moe_utils`` sets it itself when Transformer Engine is missing, moe_utils.py:41-53.)"""

from __future__ import annotations

import torch

from snippets.cpu.base import (
    NoStream,
    Patch,
    Site,
    cuda_view,
    no_current_stream,
    no_stream_context,
    replace_once,
    scope_torch,
)


class _NoDtoHStream(NoStream):
    """The all-to-all dispatcher's device-to-host stream: its "event" is itself, already done."""

    def record_event(self, event=None):
        return self


def _patch_moe_dispatcher_streams():
    # MoEAlltoAllTokenDispatcher copies its split sizes to the host on a side stream: it makes the
    # stream in __init__, then switches to it, records an event and waits on that event. On a CPU
    # there is no device-to-host copy to overlap; the work runs in order anyway.
    view = cuda_view(Stream=_NoDtoHStream, current_stream=no_current_stream, stream=no_stream_context)
    scope_torch("megatron.core.transformer.moe.token_dispatcher", cuda=view)


def _host_numpy(original):
    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    return maybe_move_tensor_to_cpu


def _patch_moe_host_split_sizes():
    # On a GPU the dispatcher's all-to-all split sizes leave maybe_move_tensor_to_cpu as host numpy
    # arrays; that helper converts only CUDA tensors, so on a CPU they stayed torch tensors, which
    # all_to_all_single rejects. Give token_dispatcher (its only caller) the GPU result.
    from megatron.core.transformer.moe import token_dispatcher

    replace_once(token_dispatcher, "maybe_move_tensor_to_cpu", _host_numpy)


PATCHES = (
    Patch(
        name="moe_dispatcher_streams",
        scope="megatron.core.transformer.moe.token_dispatcher",
        what="`torch.cuda.Stream()`、`current_stream()`、`stream(...)` 换成什么都不用等的替身，"
        "`record_event()` 返回一个已完成的事件",
        why="`MoEAlltoAllTokenDispatcher` 在构造时建一条类级的 device-to-host stream，"
        "每次 dispatch 都切到它上面把 split sizes 拷回主机、记一个事件再等它；CPU 版 torch 建 stream 直接报错。",
        sites=(
            Site("megatron/core/transformer/moe/token_dispatcher.py", 469, "torch.cuda.Stream()"),
            Site("megatron/core/transformer/moe/token_dispatcher.py", 922, "torch.cuda.current_stream()"),
            Site(
                "megatron/core/transformer/moe/token_dispatcher.py",
                925,
                "torch.cuda.stream(self.cuda_dtoh_stream)",
            ),
        ),
        apply=_patch_moe_dispatcher_streams,
        proof="一个 rank、EP=1："
        "local spec 的 `MoELayer`（`MoEAlltoAllToke"
        "nDispatcher` + `SequentialMLP`）"
        "的输出和输入梯度等于手算的稠密 MoE（router logits 取 top-"
        "2、对这 2 个 softmax、"
        "加权求和各 expert 的 `fc2(gelu(fc1 x))`）",
    ),
    Patch(
        name="moe_host_split_sizes",
        scope="megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu",
        what="`as_numpy=True` 时把 CPU 张量也转成 numpy（GPU 上本来就得到 numpy）",
        why="all-to-all 的 `input_splits` / `output_splits` 要以主机上的整数列表交给 "
        "`all_to_all_single`；`maybe_move_tensor_to_cpu` 只转换 CUDA 张量，CPU 上它们仍是 torch 张量，"
        "`all_to_all_single` 拒收（`TypeError`）。",
        sites=(
            Site("megatron/core/transformer/moe/moe_utils.py", 1184, "tensor.is_cuda"),
            Site("megatron/core/transformer/moe/token_dispatcher.py", 931, "as_numpy=True"),
            Site("megatron/core/tensor_parallel/mappings.py", 460, "torch.distributed.all_to_all_single("),
        ),
        apply=_patch_moe_host_split_sizes,
        proof="2 个 rank、EP=2："
        "同一个 `MoELayer` 的输出和输入梯度等于用 all-gather 来的"
        "全部 expert 手算的稠密 MoE；"
        "`input_splits` 是 numpy 数组，"
        "记录到的 6 次 `all_to_all_single` 搬的行数都等于各自的 "
        "split sizes 之和",
    ),
)
