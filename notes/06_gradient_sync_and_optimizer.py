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
# backward 结束时，每个 DP rank 只有自己那几个 micro-batch 的梯度。Megatron 把这些梯度放在哪里，在哪一步、哪个进程群里
# 把它们平均，优化器又怎样算范数、裁剪、更新参数，为什么 DP=2 的一步等于一个进程吃下整个 batch 的一步？
# 本篇在 1、2 个进程上跑一个 4 层 `GPTModel` 的完整训练步，把 `main_grad`、grad buffer、`finalize_model_grads` 和
# `optimizer.step()` 逐个讲清；bucket 与通信重叠的细节在[笔记 14](../14_data_parallel_ddp/)，分布式优化器的分片在[笔记 15](../15_distributed_optimizer/)。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清包上 `DistributedDataParallel` 之后梯度住在哪里：`main_grad` 是 grad buffer 的视图，backward 之后 `.grad` 为什么是 `None`。
# 2. 说清 `finalize_model_grads` 在哪个群里做什么归约，为什么 DP 的"求和"就是平均。
# 3. 说清 `get_megatron_optimizer` 返回什么，`optimizer.step()` 的步骤和三个返回值，梯度范数在哪个群里归约、裁剪怎样生效。
# 4. 用运行确认：DP=2 各跑一半 micro-batch 的一步，与一个进程跑全部 micro-batch 的一步相同。
#
# **结论**
#
# - DDP 把全部梯度放进一块连续的 grad buffer（这里 `[9632]` 个 fp32，1 个 bucket），每个参数的 `main_grad` 是它的一段视图。
# - backward 的 hook 把 `.grad` 加进 `main_grad` 再置为 `None`；m 个 micro-batch 的梯度就累加在 buffer 里。
# - `finalize_model_grads` 先把 buffer 乘 1/(DP×CP)，再在 dp-cp 群 all-reduce 一次：和就是平均，也是一步里唯一的跨 rank 通信。
# - `optimizer.step()` 让 `.grad` 指向 `main_grad`，在模型并行群里求范数（1.6628，两个 rank 与单进程相同），再裁剪、走 Adam。
# - DP=2 的一步与单进程相差 < 1e-6；Adam 第一步每个元素约移动 lr，最大 0.0101。
#
# 先读：[笔记 05](../05_forward_loss_backward/)（loss 怎样缩放、backward 怎样跑）；基础概念见文末「与基础知识的连接」；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
from IPython.display import display

from snippets.experiments import EXPERIMENTS
from snippets.experiments.n06_train_step import (MEANINGS, per_token_flag_with_two_values, this_rank_microbatches,
                                                 train_step)
from snippets.experiments.n14_ddp import build_model
from snippets.models.tiny_gpt import forward_step, max_abs_diff
from snippets.ranks.launch import run_ranks
from snippets.record import recorder
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.train import pictures

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

TINY = EXPERIMENTS["train-step"].tiny
dp2 = run_ranks(train_step, 2, TINY, clip_grad=0.0)
one = run_ranks(train_step, 1, TINY, clip_grad=0.0)[0]
pictures.draw_grad_path(dp2[0])

# %% [markdown]
# 一个参数的梯度从左到右走过的地方（DP=2 的 rank 0）：autograd 算出 `.grad`，DDP 的 hook 把它搬进 `main_grad`，
# `finalize_model_grads` 对整块 buffer 做一次 all-reduce，`optimizer.step()` 把 `main_grad` 当作 `.grad` 交给 Adam。
# 黄框是每一站录到的通信。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 每次运行在本机用 gloo 起 1 或 2 个进程（`snippets.ranks.launch.run_ranks`）。模型是 `snippets/experiments/n14_ddp.py`
#   的 `build_model`：4 层、hidden 16、2 个 head、词表 32、无 bias 的 local spec `GPTModel`，权重按参数的全局名字生成
#   （`snippets/models/tiny_gpt.py` 的 `init_by_global_name`），所以每个 rank 和单进程的起点相同。
# - global batch 是 4 个 micro-batch、每个 2 条长 8 的序列；DP=2 时 DP rank r 拿第 2r、2r+1 个（`this_rank_microbatches`），
#   单进程拿全部 4 个。`loss_func` 是 `tiny_gpt.loss_func`（返回 2 个值，每个 token 都计入）。
# - `snippets/experiments/n06_train_step.py` 的 `train_step` 是下文那一步再加上记录：`snippets.record.recorder` 分别录下
#   `finalize_model_grads` 和 `optimizer.step()` 期间的 collective 及其阶段，并按全局名字取回梯度和参数。
#   `per_token_flag_with_two_values` 是「遗留问题」那次运行。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 train-step --dims tiny` 打印本页 DP=2 的通信表；
#   `scripts/execute_notes.sh notes/06_gradient_sync_and_optimizer.py` 重新执行整页。
# - CPU 上要的改动：文末「在 CPU 上怎么跑的」和 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(this_rank_microbatches, train_step, per_token_flag_with_two_values)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | 建 grad buffer，给每个参数挂 `main_grad` 和 backward hook |
# | [`distributed_data_parallel.py::DistributedDataParallel._make_backward_post_hook`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L468) | hook：`.grad` 加进 `main_grad`，再置 `None` |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | DP 归约，加上 SP / 共享词嵌入等的 TP、PP 归约 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | bucket 乘缩放因子，再 all-reduce（或分布式优化器的 reduce-scatter） |
# | [`optimizer/__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 分参数组，建 torch 的 Adam 并包装，返回 `ChainedOptimizer` |
# | [`optimizer.py::ChainedOptimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1855) | 准备梯度、求范数、裁剪、更新，返回三个值 |
# | [`optimizer.py::FP32Optimizer.prepare_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1264) | fp32 参数：让 `param.grad` 指向 `main_grad` |
# | [`clip_grads.py::get_grad_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L55) | 本地平方和，在梯度统计群里 all-reduce |
#
# <details><summary>其余符号（8 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel.zero_grad_buffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L603) | 每步开始把 buffer 清零 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.finish_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L781) | 不开 overlap 时在这里发起并完成同步 |
# | [`optimizer.py::FP32Optimizer.step_with_ready_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1285) | 调 torch 优化器的 `step()` |
# | [`optimizer.py::MegatronOptimizer.get_grad_stats_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L322) | 求范数、数零的群：缺省是模型并行群 |
# | [`optimizer.py::MegatronOptimizer.has_grad_norm_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L294) | `clip_grad > 0` 时问"有没有单独算范数的参数（MTP）"：第一次 all-reduce 一个标志，之后读缓存 |
# | [`clip_grads.py::clip_grad_by_total_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L143) | 范数超过 `clip_grad` 时整体缩放，不通信 |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 正式入口：清零 buffer → schedule（末尾 finalize）→ `optimizer.step()` |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342) | 把 `finalize_model_grads` 设进 `config.finalize_model_grads_func` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `train_step` → `zero_grad_buffer()` → schedule（backward 的 hook 累加 `main_grad`；末尾 `finalize_model_grads`：
# ×1/(DP×CP)、dp-cp 群 all-reduce）→ `optimizer.step()`（`.grad` ← `main_grad`、范数、裁剪、Adam）。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::train_step
# ├─ model_chunk.zero_grad_buffer(); optimizer.zero_grad()
# ├─ forward_backward_func(...)                                   # 笔记 05
# │  ├─ 每个参数的梯度累加器 hook：main_grad += grad；grad = None
# │  └─ （最后一个 micro-batch 之后）config.finalize_model_grads_func(model, num_tokens?)
# │     └─ finalize_model_grads
# │        ├─ model_chunk.finish_grad_sync() → bucket_group.start_grad_sync()
# │        │     grad_data *= 1/(DP×CP)；all_reduce(grad_data)                              dp-cp 群
# │        ├─ _allreduce_conditional_embedding_grads                 # DiT 等的条件嵌入      pp 群
# │        ├─ _allreduce_non_tensor_model_parallel_grads             # SP 的 norm、QK norm  tp 群
# │        ├─ _allreduce_word_embedding_grads / _allreduce_position_embedding_grads        embedding 群
# │        └─ num_tokens 不为 None 时：广播、all_reduce(num_tokens)、scale_gradients(1/num_tokens)
# └─ optimizer.step() = ChainedOptimizer.step
#    ├─ prepare_grads → FP32Optimizer.prepare_grads              # param.grad = param.main_grad
#    ├─ get_grad_norm → get_grad_norm_fp32                       # 平方和 all_reduce       梯度统计群（模型并行群）
#    ├─ clip_grad > 0：_compute_grad_norms_by_group
#    │  └─ has_grad_norm_group("mtp")                            # 第一次：标志 all_reduce(MAX)  同上
#    ├─ clip_grad_by_total_norm_fp32(max_norm=clip_grad)         # 本地缩放（MTP 参数按自己的范数另裁）
#    ├─ 范数 > grad_norm_skip_threshold 时跳过更新
#    └─ step_with_ready_grads → FP32Optimizer.step_with_ready_grads → torch Adam.step
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `train_step` 的记录在[笔记 05](../05_forward_loss_backward/)（「调用链」下的表）；这里是梯度同步与优化器自己的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `DistributedDataParallel(...)` | config、ddp_config、module | 包装后的 module | `_ParamAndGradBuffer`、bucket group | 记下 dp-cp 群，构造时不通信 | 否（不用分布式优化器时不切） | 是：建 buffer、挂 hook | 包装 `gpt_model` 那一步 |
# | backward hook | 一个参数刚算好的 `.grad` | 无 | 无 | 否（overlap 时由它触发 bucket 的通信） | 否 | 是：`main_grad` 累加，`.grad` 置 `None` | `loss.backward()` 内部 |
# | `finalize_model_grads` | model chunk 列表、全局 token 数（可选） | 无；`main_grad` 被原地归约 | `finish_grad_sync`、TP / embedding 归约 | dp-cp、tp、embedding、pp | 否 | 是：梯度变成 DP 平均 | `finalize_model_grads([gpt_model])` |
# | `get_megatron_optimizer` | `OptimizerConfig`、model chunk 列表 | `ChainedOptimizer` | 参数分组、`FP32Optimizer` / `Float16OptimizerWithFloat16Params` / `DistributedOptimizer` | 取模型并行群、dp-cp 群 | 分布式优化器时切状态 | 是：建优化器 | 没有：simple loop 用 `torch.optim.Adam` |
# | `ChainedOptimizer.step` | 无（读 `main_grad`） | `(update_successful, grad_norm, num_zeros_in_grad)` | `prepare_grads`、范数、裁剪、`step_with_ready_grads` | 梯度统计群（范数；`clip_grad > 0` 时第一步多一次标志的 all-reduce） | 否 | 是：参数与 Adam 状态 | `optim.step()` |
# | `get_grad_norm_fp32` | 梯度列表、范数类型、群 | 总范数（float） | multi-tensor L2 | 梯度统计群 | 每个 rank 只算自己的切片 | 否 | 无 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 一步里的 Megatron 调用
#
# 下面是一个训练步里与梯度有关的全部调用，顺序与正式入口 `train_step` 相同，只是 `finalize_model_grads` 像 simple loop
# 那样手动调（正式入口由 schedule 在最后一个 micro-batch 之后调）。两个进程就是 DP=2，每个 DP rank 跑自己的 2 个
# micro-batch；每一站记下一点看得见的东西：

# %%
def one_training_step(dims):
    parallel_state.initialize_model_parallel()  # 2 个进程，TP=PP=1：DP=2
    model, config = build_model(dims)  # 4 层 GPTModel，权重与 rank 无关
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01), [ddp])
    buffer, param = ddp.buffers[0], ddp.module.decoder.final_layernorm.weight
    seen = {"grad buffer": (list(buffer.grad_data.shape), str(buffer.grad_dtype), len(buffer.buckets))}

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    mine = this_rank_microbatches(dims)
    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(mine), model=[ddp],
                                num_microbatches=len(mine), seq_length=dims.seq, micro_batch_size=dims.micro_batch_size)
    in_buffer = param.main_grad.untyped_storage().data_ptr() == buffer.grad_data.untyped_storage().data_ptr()
    seen["backward 之后 (.grad is None, main_grad 在 buffer 里)"] = (param.grad is None, in_buffer)

    finalize_model_grads([ddp])
    seen["optimizer"] = (type(optimizer).__name__, [type(o).__name__ for o in optimizer.chained_optimizers])
    seen["梯度统计群"] = torch.distributed.get_process_group_ranks(optimizer.get_grad_stats_parallel_group())
    update_successful, grad_norm, num_zeros = optimizer.step()
    seen["step() 返回"] = (update_successful, round(grad_norm, 4), num_zeros)
    seen["step 之后 .grad 与 main_grad 同一块内存"] = param.grad.data_ptr() == param.main_grad.data_ptr()
    return seen


steps = run_ranks(one_training_step, 2, TINY)
Table(["看的东西", "rank 0", "rank 1"], [[what, steps[0][what], steps[1][what]] for what in steps[0]])

# %% [markdown]
# 逐站读：
#
# - **`DistributedDataParallel(config, ddp_config, module)`** 按（参数 dtype, 梯度 dtype）把参数分组，每组建一块连续的
#   grad buffer。梯度 dtype 缺省就是参数的 dtype，只有 `grad_reduce_in_fp32=True` 才用 fp32
#   （[param_and_grad_buffer.py:917](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L917)）；
#   这里模型是 fp32，于是一块 9632 个元素的 fp32 buffer。不开 `overlap_grad_reduce`（缺省）时 `bucket_size` 被设成
#   `None`（[distributed_data_parallel.py:72](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L72)），
#   整块只有 1 个 bucket。每个参数多了一个 `main_grad` 属性，是这块 buffer 的一段视图
#   （[param_and_grad_buffer.py:1360](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L1360)）。
# - **backward**：DDP 在每个参数的梯度累加器上挂了 hook。autograd 算出 `.grad` 后，hook 把它加进 `main_grad`，再把
#   `.grad` 置为 `None`（[distributed_data_parallel.py 第 493–494 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L493-L494)）。
#   所以 schedule 返回时 `.grad` 是 `None`，2 个 micro-batch 的梯度已经加在 buffer 里。GPU 上开
#   `gradient_accumulation_fusion` 时，线性层的权重梯度 kernel 直接写进 `main_grad` 并做标记
#   （[layers.py:721](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L721)），hook 就只清 `.grad`。
#   buffer 由每步开头的 `zero_grad_buffer()` 清零。
# - **`finalize_model_grads([ddp])`**：这里只做一件事，把 buffer 乘 1/(DP×CP) 后在 dp-cp 群里 all-reduce（下一节的表）。
#   之后两个 rank 的 `main_grad` 相同，都等于全部 4 个 micro-batch 的平均梯度。
# - **`get_megatron_optimizer`** 把参数分组（weight decay、学习率倍率等），建 torch 的 Adam，fp32 参数包成
#   `FP32Optimizer`（bf16 / fp16 是 `Float16OptimizerWithFloat16Params`，开分布式优化器是 `DistributedOptimizer`），
#   外面再套一层 `ChainedOptimizer`（[`optimizer/__init__.py:1224`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1224)），
#   它的梯度统计群缺省是模型并行群（TP×PP），这里只有本 rank 自己。
# - **`optimizer.step()`** 返回 `(update_successful, grad_norm, num_zeros_in_grad)`；不开 `log_num_zeros_in_grad` 时第三个是
#   `None`。它先让 `param.grad` 指向 `main_grad`（[optimizer.py 第 1277–1278 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1277-L1278)），
#   所以 step 之后两者是同一块内存：torch 的 Adam 只认 `.grad`。
#
# ### DP=2 一步 = 单进程一步
#
# 同一步再跑两遍并录下通信：DP=2，和一个进程吃下全部 4 个 micro-batch。两个 DP rank 的数据不同，finalize 前各自的
# `main_grad` 不同；finalize 之后相同，并等于单进程的梯度，Adam 一步之后的参数与单进程相差不到 1e-6：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["检查", "结果"], [
    ["finalize 前两个 rank 的 main_grad 相同", max_abs_diff(dp2[0]["local"], dp2[1]["local"]) < 1e-6],
    ["两个 rank 的 loss 平均 = 单进程 loss", round((dp2[0]["loss"] + dp2[1]["loss"]) / 2, 4) == round(one["loss"], 4)],
    ["grad norm: DP=2 rank 0 / rank 1 / 单进程", [round(r["grad_norm"], 4) for r in (*dp2, one)]],
    ["与上面那一步的 grad norm 相同", [round(r["grad_norm"], 4) for r in dp2] == [s["step() 返回"][1] for s in steps]],
    ["step 后两个 DP rank 参数相同", max_abs_diff(dp2[0]["params"], dp2[1]["params"]) == 0.0],
    ["step 后参数与单进程相差 < 1e-6", max_abs_diff(dp2[0]["params"], one["params"]) < 1e-6],
    ["参数的最大变化（与 step 前）", round(max_abs_diff(dp2[0]["params"], dp2[0]["before"]), 4)],
])

# %% [markdown]
# 最大变化 0.0101 约等于 `lr`：Adam 第一步的更新是 `lr · m̂ / (√v̂ + ε)`，第一步 `m̂ = g`、`v̂ = g²`，每个元素都移动约 `lr`。
# 不是逐位相同，是因为两边求和的顺序不同（先各自累加再 all-reduce，还是一个进程里依次累加），差在浮点舍入量级。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# DP=2 一步里 `finalize_model_grads` 和 `optimizer.step()` 期间录到的全部通信（rank 0）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("finalize_model_grads:")
display(recorder.communication_table(dp2[0]["finalize"], MEANINGS))
print("optimizer.step():", len([c for c in dp2[0]["step"] if len(c.ranks) > 1]), "条跨 rank 的集合通信；全部记录：")
recorder.communication_table(dp2[0]["step"])

# %% [markdown]
# - **grad sync 只有一次**：整块 buffer `[9632]` 在 dp-cp 群 `[0, 1]`（CP=1，就是 DP 群）里 all-reduce，通信前后 shape 不变，
#   原地求和。它由 `start_grad_sync` 发出：不开 overlap 时 `finish_grad_sync` 在这里同步地发起并等它完成
#   （[param_and_grad_buffer.py 第 800–801 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L800-L801)）。
#   开 overlap 时它会提前到 backward 里、按 bucket 分批发出，见[笔记 14](../14_data_parallel_ddp/)。
# - **optimizer step 里的 all-reduce 只有自己**：`get_grad_norm_fp32` 把本地平方和在梯度统计群里求和，而群里只有 rank 0。
#   DP 归约之后各 DP rank 的梯度已经相同，范数只需要在"同一份模型的各切片"之间相加，也就是 TP×PP；所以两个 rank
#   和单进程报出同一个 1.6628。用分布式优化器时每个 rank 只持有一部分梯度，这个群就变成一个优化器实例的全部 rank，通常是整个 world（[笔记 15](../15_distributed_optimizer/)）。
# - **张量没有被切**：不用分布式优化器时每个 DP rank 持有完整的参数、完整的 `main_grad` 和完整的 Adam 状态；DP 只切数据。

# %% [markdown]
# ## 机制解释
#
# ### 为什么先乘 1/(DP×CP) 再求和
#
# 每个 DP rank 的梯度是自己那份数据上平均 loss 的梯度（[笔记 05](../05_forward_loss_backward/)：schedule 已经把每个
# micro-batch 的 loss 除以 m）。要得到整个 global batch 的平均，还要在 DP 上再平均一次。DDP 构造时定下每个 bucket 的缩放因子：
# 缺省（`average_in_collective=False`）是 1/(DP×CP)，即 dp-cp 群大小的倒数（本篇 CP=1，就是 1/DP），`start_grad_sync` 在通信前把 bucket 乘上它，再做 SUM all-reduce
# （[distributed_data_parallel.py 第 210–212 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L210-L212)、
# [param_and_grad_buffer.py 第 658–661 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L658-L661)）；
# 设成 True 则不预乘、改用 AVG 归约。打开 `calculate_per_token_loss` 时缩放因子是 1
# （[distributed_data_parallel.py 第 179–184 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L179-L184)）：
# DP 上只求和，最后由 `finalize_model_grads` 用全局 token 数统一缩放。
#
# 为什么要一块连续的 buffer：一个 7B 模型有几百个参数张量，逐个 all-reduce 就是几百次小通信，延迟主导；连续的 buffer
# 让一个 bucket 只发一次 collective，bucket 还能在 backward 进行中就开始通信。代价是多占一份梯度内存，而 bf16 训练时
# `main_grad` 常用 fp32 累加，多个 micro-batch 相加也不丢精度。
#
# ### `finalize_model_grads` 还做什么
#
# 本篇的配置（TP=PP=1，不共享跨 stage 的词嵌入，不开 SP）下，除了 DP 归约都是空操作。在别的配置里它还会：
# 开 SP 或 QK norm 时，把 norm 这类不切分参数在 TP 群里求和（每个 TP rank 只见到一段序列或一部分 head，[笔记 11](../11_transformer_layer/)）；
# PP>1 且共享词嵌入时，把首尾两个 stage 的两份词嵌入梯度在 embedding 群里求和（[笔记 13](../13_pipeline_schedules/)）；
# 打开 `calculate_per_token_loss` 时，把 token 数从最后一个 stage 广播、在 dp-cp 群求和，再把梯度乘它的倒数。
#
# ### 优化器的一步
#
# `ChainedOptimizer.step` 依次：`prepare_grads`（fp32 时让 `.grad` 指向 `main_grad`；bf16 / fp16 时把 `main_grad` 转成 fp32
# 交给主参数的 `.grad`，有 loss scaler 时再除回 loss scale、检查 inf）；`get_grad_norm` 求全部梯度的 L2 范数；`clip_grad > 0` 时把范数超过 `clip_grad` 的梯度整体缩放；
# 范数超过 `grad_norm_skip_threshold` 时跳过这一步、返回 False
# （[optimizer.py:1936](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1936)）；
# 最后 `step_with_ready_grads` 调 torch 的 `Adam.step()`。
#
# 裁剪就是 `torch.nn.utils.clip_grad_norm_` 的数学：梯度乘 `clip_grad / (‖g‖ + 1e-6)`，就地缩放，不通信；跨进程的只有求范数
# 那一次。`clip_grad=1.0` 再跑一遍 DP=2 和单进程：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
dp2_clip = run_ranks(train_step, 2, TINY, clip_grad=1.0)
one_clip = run_ranks(train_step, 1, TINY, clip_grad=1.0)[0]
by_hand = torch.linalg.vector_norm(torch.cat([g.flatten() for g in one["local"].values()])).item()
coeff = 1.0 / (by_hand + 1e-6)
scaled_as_predicted = all(torch.allclose(one_clip["clipped"][k], coeff * one_clip["local"][k], atol=1e-7)
                          for k in one_clip["local"])
Table(["量", "值"], [
    ["手算 ‖g‖（单进程全部 main_grad）", round(by_hand, 4)],
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
# 范数 1.6628 > 1，梯度被乘 0.6014；`FP32Optimizer` 的 `.grad` 就是 `main_grad`，所以 step 之后的 `main_grad` 正是被缩放过的梯度。
# 参数却只差 0.0005：Adam 第一步的 `m̂ / (√v̂ + ε)` 几乎与梯度的整体大小无关，裁剪影响的是之后各步 m、v 的积累。
#
# 最后一行多了一次 `has_grad_norm_group`：0.19.0 的 `ChainedOptimizer.step` 把标了 MTP 范数组的参数（多 token 预测层）
# 从主范数里拿出来，按它们自己的范数另行裁剪（[optimizer.py:1912](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1912)）。
# 要不要算这个组，每个 rank 必须回答一致（一个 rank 可能一个 MTP 参数都没有），所以 `clip_grad > 0` 时第一次 step
# 在梯度统计群里 all-reduce（MAX）一个 `[1]` 的标志（[optimizer.py:315](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L315)），
# 答案缓存下来，之后不再问。
#
# > **旧版（core_v0.18.0）：** 没有单独算范数的参数组：`ChainedOptimizer.step` 用一个总范数裁剪全部参数
# > （[optimizer.py:1451](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/optimizer/optimizer.py#L1451)），
# > `clip_grad > 0` 的 step 里只有求范数那一次 all-reduce。

# %% [markdown]
# ## 与训练主链路的关系
#
# 正式入口的 `train` 把 `finalize_model_grads` 设进 `config.finalize_model_grads_func`
# （[training.py:3550](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3550)），
# schedule 在最后一个 micro-batch 的 backward 之后调它；开 `overlap_grad_reduce` 时还把 `no_sync` 设进 config，让前 m−1 个
# micro-batch 只累加不通信（[笔记 14](../14_data_parallel_ddp/)）。`train_step` 随后调 `optimizer.step()`，
# `update_successful` 为真才推进学习率调度。simple loop 手动调 `finalize_model_grads`，优化器却是 `torch.optim.Adam`：
# 它读的 `.grad` 已被 hook 置为 `None`，权重一步不动（[笔记 01](../01_training_run_overview/) 跑过）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **数据并行 = 梯度平均**：每个 rank 的 loss 是自己样本的均值，DP 平均后的梯度等于全部样本均值 loss 的梯度，所以 DP=2 一步等于单进程一步。
# - **梯度累加**：m 个 micro-batch 的梯度在 `main_grad` 里相加，与一次吃下 m 倍大的 batch 相同（loss 已除以 m）。
# - **梯度裁剪**：与 `torch.nn.utils.clip_grad_norm_` 相同的数学；分布式时只是把平方和拆成各 rank 的部分和再 all-reduce。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. `loss_func` 返回 2 个值时打开 `calculate_per_token_loss`，DP 上的平均悄悄变成求和。** 开关让 DDP 的缩放因子变成 1，
# 本该由 `finalize_model_grads` 按全局 token 数补上的除法却没有发生：2 个值的分支不看这个开关，交给 finalize 的 token 数是 0，
# 被夹到 1（[schedules.py:338](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L338)、
# [finalize_model_grads.py:693](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L693)）。
# 同一份数据、schedule 按正式入口的接法自己调 finalize，开关关、开各跑一次：

# %% tags=["pitfall", "hide-input"] jupyter={"source_hidden": true}
flag = run_ranks(per_token_flag_with_two_values, 2, TINY)
flag_one = run_ranks(per_token_flag_with_two_values, 1, TINY)[0]


def norm(grads):
    return torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()])).item()


def times(on):  # DP=2 的 main_grad 是单进程的几倍，逐元素核对
    ratio = round(norm(flag[0][on]) / norm(flag_one[on]), 4)
    return ratio, all(torch.allclose(flag[0][on][k], ratio * flag_one[on][k], atol=1e-6) for k in flag_one[on])


Table(["calculate_per_token_loss", "DP=2 rank 0 的 ‖main_grad‖", "单进程的 ‖main_grad‖", "DP=2 ÷ 单进程", "逐元素都是这个倍数"],
      [[on, round(norm(flag[0][on]), 4), round(norm(flag_one[on]), 4), *times(on)] for on in (False, True)])

# %% [markdown]
# 关掉时 DP=2 与单进程相同（1.6628）；打开后单进程不变，DP=2 恰好翻倍，没有任何报错。正式入口的 `pretrain_gpt.py`
# 返回 3 个值，不受影响；直接用 Megatron Core、沿用 simple loop 那种 2 个值写法的人，打开这个开关就会训出 DP 倍大的梯度。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部 rank 是本机的 gloo 进程；模型在 CPU 上初始化。
# - `clip_grad > 0` 时 `clip_grad_by_total_norm_fp32` 逐个断言 `param.grad.type() == 'torch.cuda.FloatTensor'`
#   （[clip_grads.py:174](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L174)），
#   CPU 上的 fp32 梯度答 `torch.FloatTensor`。补丁 `clip_grads_type_check` 只在这个函数运行期间让无参数的
#   `Tensor.type()` 返回 CUDA 的类型名（并替换 `optimizer.py` 按名字导入的那份引用），它的测试对照 `torch.nn.utils.clip_grad_norm_`。
# - `get_megatron_optimizer`、`get_grad_norm_fp32`、`has_grad_norm_group` 里写死的 `device='cuda'` 由 `optimizer_device`、
#   `grad_norm_device` 两个补丁换成 CPU；`start_grad_sync` 开头等 CUDA graph 事件的那段用到的 `torch.cuda.current_stream()`
#   由 `grad_sync_current_stream` 换成什么都不等的替身。
# - 模型去掉了 linear 的 bias：key 投影的 bias 梯度精确为 0，浮点上只剩舍入噪声，Adam 会把噪声放大成整步的更新，
#   两次正确的运行在一步之后就对不上。
# - 全部补丁：[CPU 补丁一览](../../cpu/)。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 包上 DDP 之后，backward 结束时 `param.grad` 是什么？`optimizer.step()` 之后呢？**
#
# <details><summary>答案</summary>
#
# backward 时 hook 把梯度加进 `param.main_grad`（grad buffer 的视图）并把 `param.grad` 置为 `None`；
# `FP32Optimizer.prepare_grads` 为了交给 torch 的 Adam，让 `param.grad` 指向 `main_grad`，step 之后两者是同一块内存。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(dp2[0]["grad_none_before_step"], dp2[0]["grad_is_main_grad_after_step"])

# %% [markdown]
# **2. DP=2 一步里有几次跨 rank 的集合通信？在哪个群？**
#
# <details><summary>答案</summary>
#
# 一次：`finalize_model_grads` 对整块 grad buffer 在 dp-cp 群 `[0, 1]` 的 all-reduce；范数的 all-reduce 在只有自己的梯度统计群里。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(c.api, c.group, list(c.ranks)) for c in dp2[0]["finalize"] + dp2[0]["step"] if len(c.ranks) > 1])

# %% [markdown]
# **3. `optimizer.step()` 返回的 grad norm 在 DP=2 的两个 rank 上相同吗？为什么不用再跨 DP 求和？**
#
# <details><summary>答案</summary>
#
# 相同。范数在 `finalize_model_grads` 之后才算，那时两个 DP rank 的梯度已经是同一个平均值，各自算出的就是全局范数；
# 只有模型被 TP / PP 切开时才需要在模型并行群里把平方和加起来（分布式优化器时是一个优化器实例的全部 rank）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(dp2[0]["grad_norm"] == dp2[1]["grad_norm"], abs(dp2[0]["grad_norm"] - by_hand) < 1e-5)

# %% [markdown]
# **4. DDP 把梯度除以 DP 是在哪一步、怎么除的？打开 `calculate_per_token_loss` 后呢？**
#
# <details><summary>答案</summary>
#
# 在 `finalize_model_grads` → `start_grad_sync` 里：通信前把 bucket 乘 1/(DP×CP)，再 SUM all-reduce（`average_in_collective=True` 时
# 改用 AVG 归约）。打开 `calculate_per_token_loss` 后缩放因子是 1，DP 上只求和，由 `finalize_model_grads` 除以全局 token 数；
# 所以 `loss_func` 必须返回 3 个值，否则梯度是 DP 倍。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({on: times(on) for on in (False, True)})

# %% [markdown]
# **5. `clip_grad=1.0` 时，这一步的梯度被乘以多少？DP=2 时裁剪要跨 rank 通信吗？**
#
# <details><summary>答案</summary>
#
# 乘以 `1 / (‖g‖ + 1e-6)` ≈ 0.6014（‖g‖ ≈ 1.6628 > 1）。缩放本身不通信；通信只在求范数时（梯度统计群里求平方和），
# 而这一步 step 里没有任何跨 rank 的集合通信（第一次那个 MTP 标志的 all-reduce 也在只有自己的群里）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(round(coeff, 4), [(c.api, list(c.ranks)) for c in dp2_clip[0]["step"] if len(c.ranks) > 1])

# %% [markdown]
# ## 30-second answer
#
# Megatron's `DistributedDataParallel` lays every gradient into one contiguous buffer per dtype, fp32 only
# with `grad_reduce_in_fp32` and otherwise the parameter's own dtype: backward hooks add each `param.grad`
# into `param.main_grad`, a view of that buffer, and set `.grad` to None, so micro-batches accumulate there.
# `finalize_model_grads` scales the buffer by 1/(DP x CP) and all-reduces it over the data- and context-parallel group, so gradients
# become the batch mean (with `calculate_per_token_loss` it only sums and divides by the global token count).
# `optimizer.step()` from `get_megatron_optimizer` points `.grad` at `main_grad`, computes the global grad norm
# (reduced over tensor/pipeline ranks only), clips, and runs Adam. A DP=2 step matches a one-process step within 1e-6.
