"""``tensor_parallel``'s data helpers: ``broadcast_data`` (the batch TP rank 0 sends to its TP group
is moved to CUDA first, the sizes with ``device='cuda'``, the values with ``.cuda()``), and
``gather_split_1d_tensor`` (an all-gather into a flat buffer, which NCCL checks by element count
only and gloo by shape)."""

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


def _all_gather_by_element_count(all_gather):
    # NCCL's all_gather_into_tensor checks only that the output holds world_size times the input's
    # elements; gloo also wants the output shaped as the inputs concatenated along dim 0. For a flat
    # output that is the flat input: the same bytes, gathered in the same order. The collective is
    # looked up by name at call time, so whatever wraps torch.distributed's (the recorder) sees it.
    name = all_gather.__name__

    def all_gather_into_tensor(output, input, group=None, async_op=False):
        if output.dim() == 1 and input.dim() != 1 and torch.distributed.get_backend(group) != "nccl":
            input = input.reshape(-1)
        return getattr(torch.distributed, name)(output, input, group=group, async_op=async_op)

    return all_gather_into_tensor


def _patch_gather_split_1d_all_gather():
    # gather_split_1d_tensor gathers each TP rank's piece, whatever its shape, into a 1-D buffer of
    # numel x TP elements. Its one caller in Megatron (CheckpointFunction with
    # distribute_saved_activations) passes a flat view; the function itself promises any shape.
    from megatron.core.tensor_parallel import utils

    replace_once(utils, "dist_all_gather_func", _all_gather_by_element_count)


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
    Patch(
        name="gather_split_1d_all_gather",
        scope="megatron.core.tensor_parallel.utils",
        what="这个模块的 `all_gather_into_tensor` 在输出是一维、输入不是时把输入摊平（gloo 上）",
        why="`gather_split_1d_tensor` 把每个 TP rank 的一段（任意形状）收进一个 `numel × TP` 的一维缓冲。"
        "NCCL 只核对元素个数，gloo 还要求输出的形状是各输入沿第 0 维拼起来，于是对一个 `(2, 4)` 的输入报 "
        "`invalid tensor size`。摊平后是同样的字节、同样的顺序。",
        sites=(
            Site(
                "megatron/core/tensor_parallel/utils.py",
                89,
                "numel_gathered = torch.numel(tensor) * tp_group.size()",
            ),
            Site(
                "megatron/core/tensor_parallel/utils.py",
                93,
                "dist_all_gather_func(gathered, tensor, group=tp_group)",
            ),
        ),
        apply=_patch_gather_split_1d_all_gather,
        proof="TP=2：每个 rank 交出一个 `(2, 4)` 的张量，"
        "`gather_split_1d_tensor` 返回两段按 TP rank 顺序摊平拼接的 16 个元素，与 NCCL 上相同",
    ),
)
