"""The optimizer wrappers: one-element tensors made with ``device='cuda'``, and the ``param.type()``
checks that accept only CUDA type names (the non-distributed optimizer and gradient clipping)."""

from __future__ import annotations

import torch

from snippets.cpu.base import (
    Patch,
    Site,
    cpu_factory,
    replace_once,
    scope_torch,
    tensor_attr_while,
    type_with_cuda_names,
)


def _patch_optimizer_device():
    # The optimizer wrappers keep one-element tensors (no-overflow flag, unit loss scale) made with
    # a literal device='cuda' in their __init__; has_grad_norm_group (0.19.0, first clipped step)
    # makes its all-reduced flag the same way.
    scope_torch("megatron.core.optimizer.optimizer", tensor=cpu_factory(torch.tensor))


def _patch_grad_norm_device():
    # ChainedOptimizer.step computes the grad norm on every step, even with clip_grad=0. Without
    # Apex/TE the norm goes through Megatron's own l2-norm fallback in utils.py; both files make
    # their scratch and result tensors with device='cuda'.
    scope_torch(
        "megatron.core.optimizer.clip_grads", zeros=cpu_factory(torch.zeros), tensor=cpu_factory(torch.tensor)
    )
    scope_torch("megatron.core.utils", tensor=cpu_factory(torch.tensor))


def _patch_clip_grads_type_check():
    # clip_grad_by_total_norm_fp32 asserts every grad is a 'torch.cuda.FloatTensor' before it
    # scales them. optimizer.py imported the function by name, so both bindings are replaced.
    from megatron.core.optimizer import clip_grads, optimizer

    clip = replace_once(
        clip_grads, "clip_grad_by_total_norm_fp32", tensor_attr_while("type", type_with_cuda_names)
    )
    optimizer.clip_grad_by_total_norm_fp32 = clip


def _patch_grad_scaler_device():
    # Both grad scalers keep the loss scale (and the dynamic one its min scale, growth and backoff
    # factors) in one-element tensors made with a literal device='cuda'.
    scope_torch("megatron.core.optimizer.grad_scaler", tensor=cpu_factory(torch.tensor))


def _patch_float16_optimizer_type_check():
    # Float16OptimizerWithFloat16Params sorts parameters by `param.type()` names
    # ('torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor', 'torch.cuda.FloatTensor') and raises
    # on anything else; the same time-scoped Tensor.type() as for the distributed optimizer.
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    replace_once(
        Float16OptimizerWithFloat16Params, "__init__", tensor_attr_while("type", type_with_cuda_names)
    )


PATCHES = (
    Patch(
        name="optimizer_device",
        scope="megatron.core.optimizer.optimizer",
        what="`torch.tensor(..., device='cuda')` 落在 CPU 上",
        why="`get_megatron_optimizer` 建出的 `FP32Optimizer` 和 `DistributedOptimizer`（经 "
        "`MixedPrecisionOptimizer`）在构造时用写死的 `device='cuda'` 建单元素张量（溢出标志、单位 loss scale）；"
        "0.19.0 起 `clip_grad > 0` 的第一步还用它建一个标志，在梯度统计群里 all-reduce，"
        "问有没有参数属于要单独算范数的组（MTP）。",
        sites=(
            Site("megatron/core/optimizer/optimizer.py", 315, "device='cuda'"),
            Site("megatron/core/optimizer/optimizer.py", 698, "device='cuda'"),
            Site("megatron/core/optimizer/optimizer.py", 702, "device='cuda'"),
            Site("megatron/core/optimizer/optimizer.py", 1249, "device='cuda'"),
        ),
        apply=_patch_optimizer_device,
        proof="一个 rank 上 `get_megatron_optimizer` 建出的 `"
        "FP32Optimizer` 走两步 Adam，"
        "参数等于 `torch.optim.AdamW` 走两步；`clip_grad > 0` 时 2 个 rank 的第一步"
        "把 MTP 组的标志 all-reduce 一次，第二步只读缓存",
    ),
    Patch(
        name="grad_norm_device",
        scope="megatron.core.optimizer.clip_grads, megatron.core.utils",
        what="梯度范数的临时张量和结果（`device='cuda'`）落在 CPU 上",
        why="`ChainedOptimizer.step` 每一步都算梯度范数（`clip_grad=0` 也算）；没有 Apex / TE 时走 "
        "Megatron 自己的 l2 范数实现，两处都用写死的 `device='cuda'` 建张量。",
        sites=(
            Site("megatron/core/optimizer/clip_grads.py", 108, "device='cuda'"),
            Site("megatron/core/optimizer/clip_grads.py", 112, "device='cuda'"),
            Site("megatron/core/utils.py", 1332, 'device="cuda"'),
        ),
        apply=_patch_grad_norm_device,
        proof="DP=2、分布式优化器：`step()` 返回的梯度范数（两个 rank 各持一"
        "半梯度，平方和跨 rank 相加）等于单进程全部梯度的范数",
    ),
    Patch(
        name="clip_grads_type_check",
        scope="megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32",
        what="只在这个函数运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名；"
        "`optimizer.py` 按名字导入的那份引用一起替换",
        why="`clip_grad > 0` 时优化器先算总范数再调它缩放梯度；它逐个断言 "
        "`param.grad.type() == 'torch.cuda.FloatTensor'`，CPU 上的 fp32 梯度答 `torch.FloatTensor`。"
        "缩放用的临时张量（`device='cuda'`）已由 `grad_norm_device` 的模块代理放到 CPU。",
        sites=(
            Site(
                "megatron/core/optimizer/clip_grads.py", 174, "param.grad.type() == 'torch.cuda.FloatTensor'"
            ),
            Site("megatron/core/optimizer/clip_grads.py", 180, "device='cuda'"),
        ),
        apply=_patch_clip_grads_type_check,
        proof="`clip_grad=0.05`（小于梯度范数）"
        "时 Megatron 的一步（单进程 `FP32Optimizer`、"
        "DP=2 分布式优化器）等于 `torch.nn.utils.clip_grad"
        "_norm_` 之后的 torch Adam；不裁剪时结果可分辨",
    ),
    Patch(
        name="grad_scaler_device",
        scope="megatron.core.optimizer.grad_scaler",
        what="`torch.tensor(..., device='cuda')` 落在 CPU 上",
        why="fp16 时 `get_megatron_optimizer` 建 `DynamicGradScaler`（给了 `loss_scale` 则建 "
        "`ConstantGradScaler`），loss scale 以及动态 scaler 的下限、增长和回退系数都是用写死的 "
        "`device='cuda'` 建的单元素张量。",
        sites=(
            Site("megatron/core/optimizer/grad_scaler.py", 20, "device='cuda'"),
            Site("megatron/core/optimizer/grad_scaler.py", 111, "device='cuda'"),
        ),
        apply=_patch_grad_scaler_device,
        proof="fp16 模型、注入一个 inf：这一步被跳过，权重逐位不变，"
        "scale 从 64 减半到 32；其余各步跟 torch AdamW 一致",
    ),
    Patch(
        name="float16_optimizer_type_check",
        scope="megatron.core.optimizer.optimizer.Float16OptimizerWithFloat16Params.__init__",
        what="只在这个构造函数运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名",
        why="bf16 / fp16（不用分布式优化器）时的优化器按 `param.type()` 的字符串区分 16 位参数"
        "（为它们建 fp32 主参数）和 fp32 参数，其余一律 `TypeError`；CPU 上的 bf16 参数答 "
        "`torch.BFloat16Tensor`。与 `distrib_optimizer_type_check` 同一种时间范围收窄的补丁。",
        sites=(
            Site(
                "megatron/core/optimizer/optimizer.py",
                1009,
                "param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']",
            ),
        ),
        apply=_patch_float16_optimizer_type_check,
        proof="bf16 模型的 fp32 main params 走 Adam 后与 torc"
        "h AdamW 相差 < 1e-6，"
        "权重等于 main params 转成 bf16",
    ),
)
