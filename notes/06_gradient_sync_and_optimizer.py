# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 梯度同步与优化器：从 main_grad 到一次 Adam 更新
#
# 第一轮第 5 篇。[笔记 05](../05_forward_loss_backward/) 在 backward 结束时留下了每个 rank 各自的梯度；本篇讲它们怎样变成
# 一次参数更新：Megatron 的 `DistributedDataParallel` 把梯度累加进连续的 buffer（`main_grad`），`finalize_model_grads`
# 在 DP 群里求平均，`get_megatron_optimizer` 建的优化器算梯度范数、裁剪、走一步 Adam。本篇是总览，
# buffer / bucket / overlap 的细节在笔记 14，分布式优化器的分片在笔记 15。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清 DDP 之后梯度住在哪里（`param.main_grad` 是 grad buffer 的视图），backward 之后 `param.grad` 为什么是 `None`、step 时又指向哪里。
# 2. 说清 `finalize_model_grads` 做了哪些归约，各在哪个群里，为什么 DP 的"求和"其实是平均。
# 3. 说清 `get_megatron_optimizer` 返回什么，`optimizer.step()` 的三个返回值，梯度范数在哪个群里归约、裁剪怎样生效（及它在 CPU 上为何跑不了）。
# 4. 用运行确认：DP=2 各跑一半 micro-batch 的一步，与一个进程跑全部 micro-batch 的一步，参数差在 1e-6 以内。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | 建 grad buffer，给每个参数挂 `main_grad` 和累加 hook |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | DP 归约 + 共享 embedding / 序列并行的 TP 归约 |
# | [`optimizer/__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 分参数组，建 torch Adam 并包装，返回 `ChainedOptimizer` |
# | [`optimizer.py::ChainedOptimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1855) | 全部子优化器一起算范数、裁剪、更新 |
# | [`optimizer.py::FP32Optimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1303) | fp32 参数：`main_grad` → `.grad`，范数，裁剪，`Adam.step` |
# | [`clip_grads.py::get_grad_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L55) | 本地平方和，在模型并行群里 all-reduce |
# | [`optimizer.py::MegatronOptimizer.has_grad_norm_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L294) | `clip_grad > 0` 时问"有没有参数属于单独算范数的组（MTP）"：第一次在梯度统计群里 all-reduce 一个标志，之后读缓存 |
# | [`clip_grads.py::clip_grad_by_total_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L143) | 范数超过 `clip_grad` 时整体缩放 |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 正式入口：清零 buffer → schedule → `optimizer.step()` |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/training.py::train_step
# ├─ model_chunk.zero_grad_buffer(); optimizer.zero_grad()
# ├─ forward_backward_func(...)                                    # 笔记 05；backward 的 hook 把 grad 加进 main_grad
# │  └─ (最后一个 micro-batch 之后) config.finalize_model_grads_func
# │     └─ finalize_model_grads(model)
# │        ├─ model_chunk.finish_grad_sync() → start_grad_sync()   # buffer *= 1/DP，再 all-reduce      dp-cp 群
# │        ├─ _allreduce_non_tensor_model_parallel_grads            # 序列并行的 norm 等              tp 群
# │        └─ _allreduce_embedding_grads                            # PP 首尾共享词嵌入               embedding 群
# └─ optimizer.step()  = ChainedOptimizer.step
#    ├─ get_grad_norm → get_grad_norm_fp32                         # 平方和 all-reduce（不含 MTP 参数）  tp-pp 群
#    ├─ clip_grad > 0 时：_compute_grad_norms_by_group
#    │  └─ has_grad_norm_group("mtp")                              # 只在第一步：标志 all-reduce（MAX）  tp-pp 群
#    ├─ clip_grad_by_total_norm_fp32(max_norm=clip_grad)           # 本地缩放，不通信（MTP 参数按自己的范数另裁）
#    └─ FP32Optimizer.step_with_ready_grads → torch Adam.step      # 更新参数
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `DistributedDataParallel(...)` | config、ddp_config、module | 包装后的 module | grad buffer、bucket group | dp-cp 群（记下，不通信） | 否（不用分布式优化器时不切） | 是：建 buffer、挂 hook | 包装 `gpt_model` 那一步 |
# | `finalize_model_grads` | model chunk 列表 | 无；`main_grad` 被原地归约 | `finish_grad_sync`、embedding / TP 归约 | dp-cp、tp、embedding | 否 | 是：梯度变成 DP 平均 | `finalize_model_grads([gpt_model])` |
# | `get_megatron_optimizer` | `OptimizerConfig`、model chunk 列表 | `ChainedOptimizer` | 参数分组、`FP32Optimizer` 或分布式优化器 | 取 dp-cp、tp-pp 群 | 分布式优化器时切状态 | 是：建优化器状态 | simple loop 没有调用它：它用 `torch.optim.Adam` |
# | `ChainedOptimizer.step` | 无（读 `main_grad`） | `(update_successful, grad_norm, num_zeros)` | 范数、裁剪、Adam | tp-pp（范数；`clip_grad > 0` 时第一步另有一次 MTP 标志的 all-reduce） | 否 | 是：参数与 Adam 状态 | `optim.step()` |
# | `get_grad_norm_fp32` | 梯度列表、范数类型、群 | 总范数（float） | multi-tensor L2 | tp-pp | 每个 rank 只算自己的切片 | 否 | — |
# | `training.py::train_step` | `forward_step`、`data_iterator`、model 块列表、optimizer、`opt_param_scheduler`、config、`forward_backward_func` | 元组 `(loss_reduced, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, …)` | 每块 `zero_grad_buffer`（[training.py:2361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)）、schedule 的 `forward_backward_func`（[training.py:2407](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2407)，末尾经 `config.finalize_model_grads_func` 做梯度归约）、`MegatronOptimizer.step`（[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)） | 是：dp-cp（梯度归约；日志用的 loss 在 dp-cp 群 all-reduce，[training.py:2547](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2547)）、tp-pp（梯度范数） | batch 已按 DP 切、再按 micro-batch 切；参数按 TP / PP 切 | 是：参数、优化器状态、学习率（`opt_param_scheduler.step`，[training.py:2528](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2528)）、iterator 前进 | 循环体：`optim.zero_grad()` → `forward_backward_func(...)` → `finalize_model_grads([gpt_model])` → `optim.step()` |

# %% jupyter={"source_hidden": true} tags=["hide-input"]
from snippets.record import recorder
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n06_train_step import MEANINGS, train_step
from snippets.record.listing import listing
from snippets.train import pictures
from snippets.ranks.launch import run_ranks
from snippets.record.tables import Table
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, by_global_name, forward_step, init_by_global_name, max_abs_diff, microbatches, tiny_config

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

# %% [markdown]
# ## 关键对象
#
# 一次完整的训练步。模型是 4 层、hidden 16 的真实 `GPTModel`，权重按参数名生成（与 rank 无关，见 `snippets/models/tiny_gpt.py`）。
# global batch = 4 个 micro-batch × 2 条序列：DP=2 时 DP rank r 拿第 2r、2r+1 个；DP=1 时一个进程拿全部 4 个。
# 优化器 `OptimizerConfig(optimizer="adam", lr=0.01, clip_grad=...)`，不用分布式优化器。
#
# 这个 rank 函数在 `snippets/experiments/n06_train_step.py` 里，模型尺寸和 micro-batch 数是参数 `dims`（本篇用它的
# `tiny`），模型由笔记 14 的同一个 `build_model` 建。

# %% jupyter={"source_hidden": true} tags=["hide-input"]
listing(train_step)

# %%
TINY = EXPERIMENTS["train-step"].tiny
dp2 = run_ranks(train_step, 2, TINY, clip_grad=0.0)
one = run_ranks(train_step, 1, TINY, clip_grad=0.0)[0]
print("optimizer:", dp2[0]["optimizer"], dp2[0]["inner"], " update_successful:", dp2[0]["update_successful"])
print("backward 之后 param.grad is None:", dp2[0]["grad_none_before_step"],
      " main_grad 在 DDP 的 grad buffer 里:", dp2[0]["main_grad_in_buffer"],
      " step 之后 param.grad 与 main_grad 同一块内存:", dp2[0]["grad_is_main_grad_after_step"])

# %% [markdown]
# ### DP=2 一步 = 单进程一步
#
# 两个 DP rank 的 micro-batch 不同，所以 finalize 前各自的 `main_grad` 不同；finalize 之后相同，并等于单进程的梯度；
# Adam 一步之后的参数与单进程相差不到 1e-6：

# %%
Table(["检查", "结果"], [
    ["finalize 前两个 rank 的 main_grad 相同", max_abs_diff(dp2[0]["local"], dp2[1]["local"]) < 1e-6],
    ["两个 rank 的 loss 平均 = 单进程 loss", round((dp2[0]["loss"] + dp2[1]["loss"]) / 2, 4) == round(one["loss"], 4)],
    ["grad norm: DP=2 rank 0 / rank 1 / 单进程", [round(r["grad_norm"], 4) for r in (*dp2, one)]],
    ["step 后两个 DP rank 参数相同", max_abs_diff(dp2[0]["params"], dp2[1]["params"]) == 0.0],
    ["step 后参数与单进程相差 < 1e-6", max_abs_diff(dp2[0]["params"], one["params"]) < 1e-6],
    ["参数确实变了（与 step 前最大差）", round(max_abs_diff(dp2[0]["params"], dp2[0]["before"]), 4)],
])

# %% [markdown]
# 变化量 0.01 正是 `lr`：Adam 第一步的更新是 `lr · m̂ / (√v̂ + ε)`，而第一步 `m̂ = g`、`v̂ = g²`，每个元素都移动约 `lr`。
#
# ## Tensor / Process Group 语义
#
# DP=2 一步里 finalize 和 `optimizer.step()` 期间的全部通信（rank 0，录制所得）：

# %%
print("finalize_model_grads:")
display(recorder.communication_table(dp2[0]["finalize"], MEANINGS))
print("optimizer.step():", len([c for c in dp2[0]["step"] if len(c.ranks) > 1]), "条跨 rank 的集合通信；全部记录：")
recorder.communication_table(dp2[0]["step"])

# %% [markdown]
# 梯度在这一步里走过的地方，和每一站录到的通信（rank 0）：

# %%
pictures.draw_grad_path(dp2[0])

# %% [markdown]
# - **DP 归约只有一次**：整个 grad buffer（不到 1 万个元素，一个 bucket）在 `dp-cp` 群 `[0, 1]` 里 all-reduce（CP=1，就是 DP 群）。细节（bucket、overlap、
#   为什么先乘 1/DP）见笔记 14。0.19.0 的 `start_grad_sync` 在缩放之前先让当前 stream 等待 CUDA graph 回放写梯度的事件
#   （[param_and_grad_buffer.py:632](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L632)）；这是 GPU 上的流同步，不是通信，CPU 上由补丁 `grad_sync_current_stream` 换成不必等的替身。
# - **梯度范数不在 DP 群里归约**：DP 归约之后各 DP rank 的梯度已经相同，范数只需在"同一份模型的各切片"之间求和，
#   也就是 tp-pp 群；这里 TP=PP=1，群里只有自己。用分布式优化器时每个 rank 只有一部分梯度，范数就必须跨 DP 求和（笔记 15）。

# %% [markdown]
# ## 机制解释
#
# ### 梯度裁剪
#
# `clip_grad > 0` 时，`step()` 先算全部参数梯度的总 L2 范数 `‖g‖`，若 `‖g‖ > clip_grad` 就把所有梯度乘以
# `clip_grad / (‖g‖ + 1e-6)`（`clip_grad_by_total_norm_fp32`，就地缩放，不通信）。CPU 上它需要一个补丁
# `clip_grads_type_check`（见遗留问题 2 和 [CPU 页](../../cpu/)）。下面用 `clip_grad=1.0` 再跑一遍 DP=2 和单进程：
# 范数 1.66 > 1，裁剪真的发生；`FP32Optimizer` 的 `param.grad` 就是 `main_grad`，所以 step 之后的 `main_grad`
# 正是被缩放过的梯度。
#
# 0.19.0 的 `ChainedOptimizer.step` 把标了 MTP 范数组的参数（多 token 预测层）从主范数里拿出来，用它们自己的范数单独裁剪
# （[optimizer.py:1912](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1912)）。要不要算这个组，每个 rank 必须回答一致：
# 一个 rank 可能一个 MTP 参数也没有，而别的 rank 有。所以 `clip_grad > 0` 的第一步在梯度统计群里 all-reduce（MAX）一个
# `[1]` 的整数标志（[optimizer.py:315](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L315)），答案缓存下来，之后各步不再通信。
# 下表最后一行是这次 `clip_grad=1.0` 的 step 录到的全部通信：范数一次、标志一次，都在只有自己的 tp-pp 群里。
#
# > **旧版（core_v0.18.0）：** 没有单独算范数的参数组：`ChainedOptimizer.step` 用一个总范数裁剪全部参数（[optimizer.py:1451](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/optimizer/optimizer.py#L1451)），`clip_grad > 0` 的 step 里只有算范数那一次 all-reduce。

# %%
import torch

dp2_clip = run_ranks(train_step, 2, TINY, clip_grad=1.0)
one_clip = run_ranks(train_step, 1, TINY, clip_grad=1.0)[0]
by_hand = torch.linalg.vector_norm(torch.cat([g.flatten() for g in one["local"].values()])).item()
coeff = 1.0 / (by_hand + 1e-6)
scaled_as_predicted = all(torch.allclose(one_clip["clipped"][k], coeff * one_clip["local"][k], atol=1e-7)
                          for k in one_clip["local"])
Table(["量", "值"], [
    ["手算 ‖g‖（单进程全部 main_grad）", round(by_hand, 4)],
    ["step() 返回的范数：单进程 / DP=2 rank 0 / rank 1", [round(r["grad_norm"], 4) for r in (one, *dp2)]],
    ["clip_grad=1.0 的缩放系数 1 / (‖g‖ + 1e-6)", round(coeff, 4)],
    ["裁剪后 main_grad = 系数 × 裁剪前（单进程，逐元素）", scaled_as_predicted],
    ["裁剪后 DP=2 两个 rank 的 main_grad 与单进程相同", max_abs_diff(dp2_clip[0]["clipped"], one_clip["clipped"]) < 1e-7
     and max_abs_diff(dp2_clip[1]["clipped"], one_clip["clipped"]) < 1e-7],
    ["裁剪后 DP=2 一步的参数与单进程相差 < 1e-6", max_abs_diff(dp2_clip[0]["params"], one_clip["params"]) < 1e-6],
    ["裁剪与不裁剪的参数最大差（Adam 第一步）", round(max_abs_diff(one_clip["params"], one["params"]), 4)],
    ["clip_grad=1.0 时 step() 录到的通信（rank 0：函数、群、成员）",
     [(c.where.split("::")[-1], c.group, list(c.ranks)) for c in dp2_clip[0]["step"]]],
])

# %% [markdown]
# 最后一行很小（每个参数这一步移动约 `lr` = 0.01）：对 Adam 来说，第一步把梯度整体缩放几乎不改变更新（`m̂ / (√v̂ + ε)` 只在
# 梯度与 ε 同量级的元素上受缩放影响）；裁剪影响的是之后各步 m、v 的积累。
# 裁剪的结果要从梯度上看，上面逐元素核对了。跨进程的部分只有范数：每个 rank 先算本地平方和，再在
# `get_grad_stats_parallel_group()` 里求和（这里 TP=PP=1 且不用分布式优化器，群里只有自己），缩放本身各 rank 就地做。
#
# ### 为什么梯度住在 `main_grad`
#
# DDP 给每个参数注册一个累加 hook：autograd 算出 `param.grad` 后，hook 把它加进 `param.main_grad`（grad buffer 的一段视图），
# 再把 `param.grad` 置为 `None`。好处有二：多个 micro-batch 的梯度直接累加在 buffer 里（可以用 fp32 累加 bf16 模型的梯度）；
# 整块 buffer 连续，DP 归约按 bucket 一次发一大块。`FP32Optimizer.step` 开始时再让 `param.grad` 指向 `main_grad`（上面运行确认是同一块内存），交给 torch 的 Adam。

# %% [markdown]
# ## 与训练主链路的关系
#
# 正式入口 `train_step` 的后半段就是本篇：schedule 末尾由 `config.finalize_model_grads_func` 调用 `finalize_model_grads`，
# 然后 `optimizer.step()`，根据 `update_successful`（fp16 loss scaling 出现 inf 时为 False；范数超过 `grad_norm_skip_threshold`
# 时也跳过更新、返回 False，[optimizer.py:1936](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1936)）决定是否推进学习率调度。
# simple loop 显式调用 `finalize_model_grads`，但优化器用的是 `torch.optim.Adam`，不是 `get_megatron_optimizer`。

# %% [markdown]
# ## 与基础知识的连接
#
# - **数据并行 = 梯度平均**：每个 rank 的 loss 是自己样本的均值，DP 平均后的梯度等于全部样本均值 loss 的梯度，所以 DP=2 一步等于单进程一步。
# - **梯度裁剪**：与 `torch.nn.utils.clip_grad_norm_` 相同的数学；分布式时只是把"平方和"拆成各 rank 的部分和再 all-reduce。

# %% [markdown]
# ## 遗留问题
#
# 1. **DP=2 与单进程不是 bitwise 相同。** 梯度差在 1e-8 量级（求和顺序不同），Adam 第一步把梯度归一化，参数差仍远小于 1e-6；
#    若梯度某元素恰好接近 0，Adam 会放大噪声（`snippets/models/tiny_gpt.py` 去掉 bias 就是为此）。
# 2. **CPU 上裁剪原本会断言失败（运行确认）。** `clip_grad > 0` 时 `ChainedOptimizer.step` 调用
#    `clip_grad_by_total_norm_fp32`，它逐个断言 `param.grad.type() == 'torch.cuda.FloatTensor'`
#    （[`clip_grads.py:174`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L174)），
#    CPU 上的 fp32 梯度答 `torch.FloatTensor`。本站的补丁 `clip_grads_type_check` 只在这个函数运行期间让无参数的
#    `Tensor.type()` 返回 CUDA 类型名，并替换 `optimizer.py` 按名字导入的那份引用；它的测试对照 `torch.nn.utils.clip_grad_norm_`。
#    `get_megatron_optimizer` 和 `get_grad_norm_fp32` 写死的 `device='cuda'` 由 `optimizer_device`、`grad_norm_device` 两个补丁处理，见 [CPU 页](../../cpu/)。

# %% [markdown]
# ## 自测
#
# **1. DDP 之后，backward 结束时 `param.grad` 是什么？`optimizer.step()` 之后呢？**
#
# <details><summary>答案</summary>
#
# backward 时 hook 把梯度累加进 `param.main_grad`（grad buffer 的视图）并把 `param.grad` 置为 `None`；
# `FP32Optimizer.step` 为了交给 torch 的 Adam，把 `param.grad` 指向 `main_grad`，step 之后两者是同一块内存（运行确认，不是 `None`）。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(dp2[0]["grad_none_before_step"], dp2[0]["grad_is_main_grad_after_step"])

# %% [markdown]
# **2. DP=2 一步里有几次跨 rank 的集合通信？在哪个群？**
#
# <details><summary>答案</summary>
#
# 一次：`finalize_model_grads` 对整个 grad buffer 在 dp-cp 群 `[0, 1]` 的 all-reduce；范数的 all-reduce 在大小为 1 的 tp-pp 群里。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print([(c.api, c.group, list(c.ranks)) for c in dp2[0]["finalize"] + dp2[0]["step"] if len(c.ranks) > 1])

# %% [markdown]
# **3. `optimizer.step()` 返回的 grad norm 在 DP=2 的两个 rank 上相同吗？为什么不用再跨 DP 求和？**
#
# <details><summary>答案</summary>
#
# 相同。范数在 `finalize_model_grads` 之后才算，那时两个 DP rank 的梯度已经是同一个平均值，各自算出的就是全局范数；
# 只有模型被 TP / PP 切开时才需要在 tp-pp 群里把平方和加起来。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(dp2[0]["grad_norm"] == dp2[1]["grad_norm"], abs(dp2[0]["grad_norm"] - by_hand) < 1e-5)

# %% [markdown]
# **4. Adam 第一步每个参数大约移动多少？**
#
# <details><summary>答案</summary>
#
# 约 `lr` = 0.01：第一步 `m̂ / √v̂ = g / |g| = ±1`。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(round(max_abs_diff(one["params"], one["before"]), 4))

# %% [markdown]
# **5. `clip_grad=1.0` 时，这一步的梯度被乘以多少？DP=2 时裁剪要跨 rank 通信吗？**
#
# <details><summary>答案</summary>
#
# 乘以 `1 / (‖g‖ + 1e-6)` ≈ 0.6014（‖g‖ ≈ 1.6628 > 1）。缩放本身不通信；通信只在算范数时（在 tp-pp 群里求平方和），
# 而这一步 step 里没有任何跨 rank 的集合通信（第一步那次 MTP 标志的 all-reduce 也在只有自己的 tp-pp 群里）。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(round(coeff, 4), [(c.api, list(c.ranks)) for c in dp2_clip[0]["step"] if len(c.ranks) > 1])

# %% [markdown]
# ## 30-second answer
#
# Megatron's `DistributedDataParallel` lays every gradient into one contiguous buffer per dtype, fp32 only
# with `grad_reduce_in_fp32` and otherwise the parameter's own dtype ([`param_and_grad_buffer.py:917`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L917)): backward
# hooks add each `param.grad` into `param.main_grad`, a view of that buffer, and clear `.grad`.
# `finalize_model_grads` scales the buffer by 1/DP and all-reduces it over the data-parallel group, so
# gradients become the batch mean. `optimizer.step()` from `get_megatron_optimizer` computes the global
# grad norm (reduced over tensor/pipeline ranks only), clips, and runs Adam. A DP=2 step matches a
# one-process step within 1e-6.
