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
# # 15 分布式优化器（ZeRO-1）：每个 DP rank 只更新自己那一片
#
# 第二轮第 8 篇。[笔记 14](../14_data_parallel_ddp/) 的 DDP 让每个 DP rank 得到同样的平均梯度，然后每个 rank
# 各自做同样的 Adam 更新——Adam 的两个动量（以及混合精度时 fp32 的主权重）在 DP 个 rank 上各存一份，完全重复。
# 分布式优化器把 DDP 的连续梯度 buffer 均分成 DP 段：rank r 只拿到第 r 段的平均梯度（reduce-scatter），
# 只为这一段存优化器状态、做更新，再把更新后的权重拼回来（all-gather）。本篇在 2 个 gloo rank 上用真实的
# `get_megatron_optimizer` 建分布式优化器，打印每个 rank 的分片，录下一步里的全部通信，数清每个参数占几个字节，
# 并验证两步 Adam 之后的权重与不分片的优化器逐位相同。

# %% [markdown]
# ## 阅读目标
#
# 1. `use_distributed_optimizer=True` 时 `get_megatron_optimizer` 建出什么，DDP 为它改变了什么（按分布式优化器算好的补齐布局排 buffer、参数 buffer、reduce-scatter）。
# 2. 每个 rank 拥有 buffer 的哪一段；一个参数被切到两个 rank 时，`gbuf_world` / `gbuf_local` / `param` 三种区间各是什么。
# 3. 一步里的通信：reduce-scatter 梯度、all-reduce 梯度范数、all-gather 权重——形状和群。
# 4. 每个参数每个 rank 占几个字节：有 / 无分布式优化器，8B 模型 DP=8 和本篇的小模型；公式与实测。
# 5. 为什么分片之后的 Adam 与不分片的逐位相同。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`optimizer/__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 入口：分参数组、取 DDP 的 buffer，返回 `ChainedOptimizer` |
# | [`optimizer/__init__.py::_get_megatron_optimizer_based_on_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L450) | 建 torch 的 Adam，再按配置包成 `DistributedOptimizer` / `FP32Optimizer` / … |
# | [`optimizer_config.py::OptimizerConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer_config.py#L139) | `use_distributed_optimizer`、`lr`、`clip_grad`… |
# | [`distrib_optimizer.py::DistributedOptimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L113) | ZeRO-1 的实现 |
# | [`distrib_optimizer.py::DistributedOptimizer.compute_full_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L591) | 建 DDP 之前：按 (param dtype, grad dtype, 是否专家参数) 分组，每组算一份布局交给 DDP |
# | [`distrib_optimizer.py::DistributedOptimizer._compute_per_buffer_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L506) | 一块 buffer 的布局：倒序排放，参数起点补齐到 64，bucket 末尾补齐到 lcm(DP, 128) |
# | [`distrib_optimizer.py::DistributedOptimizer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L633) | 算分片、建 shard、把 Adam 的参数组换成 shard |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_range`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L200) | 每个 bucket 均分成 DP 段，取本 rank 那段 |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_param_range_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L134) | 本段与每个参数求交：三种区间 |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_and_main_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L347) | shard = 参数展平后的一段（fp32 是视图，16 位时另建 fp32 拷贝） |
# | [`distrib_optimizer.py::DistributedOptimizer._copy_model_grads_to_main_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2746) | 把 buffer 里已归约的那段交给 shard 的 `.grad` |
# | [`distrib_optimizer.py::DistributedOptimizer._copy_main_params_to_model_params`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2792) | 把更新后的 shard 写回参数 buffer |
# | [`distrib_optimizer.py::DistributedOptimizer.step_with_ready_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L3158) | Adam 之后发起参数 all-gather |
# | [`optimizer.py::ChainedOptimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1855) | 每一步：准备梯度、算范数、（裁剪）、更新 |
# | [`clip_grads.py::get_grad_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L55) | 各 rank 的平方和跨 rank 相加 |
# | [`param_and_grad_buffer.py::shard_buffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L69) | 把一个 bucket 切成 DP 个等长视图 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | 分布式优化器时发 reduce-scatter |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_param_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L377) | 参数 all-gather |
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 正式入口：建模型、DDP、`get_megatron_optimizer` |
#
# Megatron 自己的说明页：[docs/user-guide/features/dist_optimizer.md](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/docs/user-guide/features/dist_optimizer.md)。

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/training.py::setup_model_and_optimizer(model_type, model_provider_func, ...)
# ├─ GPTModelBuilder.build_distributed_models（无模型 config 时退回 get_model）→ 包 DDP  # 每个 model chunk 一次
# │  ├─ DistributedOptimizer.compute_full_param_layout(params, bucket_size, DP, ddp_config)
# │  │  └─ _compute_per_buffer_param_layout: 倒序排放；参数起点补齐到 64、
# │  │                                       bucket 末尾补齐到 lcm(DP, 128)  # 纯本地，只算下标
# │  └─ DistributedDataParallel(..., full_param_layout=layout)
# │     └─ _ParamAndGradBuffer: 按这份布局建 grad buffer；
# │                             另建 param buffer，param.data 改指向它      # 纯本地
# └─ optimizer/__init__.py::get_megatron_optimizer(OptimizerConfig(use_distributed_optimizer=True), model)
#    ├─ _get_param_groups_and_buffers                       # weight decay 分组 + 各 chunk 的 DDP buffer
#    └─ _get_megatron_optimizer_based_on_param_groups
#       ├─ torch.optim.AdamW(param_groups)                  # 没有 TE / Apex 时
#       └─ DistributedOptimizer(adam, config, ..., per_model_buffers)
#          ├─ _build_gbuf_range_map → _build_model_gbuf_range          # 每个 bucket：本 rank 的 [r·S/d, (r+1)·S/d)
#          │  └─ _build_model_gbuf_param_range_map                     # 与每个参数求交
#          ├─ _build_model_and_main_param_groups                       # shard = param.view(-1)[a:b]
#          └─ adam.param_groups ← 只含本 rank 的 shard
#    → ChainedOptimizer([DistributedOptimizer])
#
# 每一步
# ├─ ddp.zero_grad_buffer(); optimizer.zero_grad()
# ├─ forward_backward_func(...)                                          # 笔记 13
# ├─ finalize_model_grads → finish_grad_sync → start_grad_sync
# │  └─ reduce_scatter_tensor(shard_r ← bucket)                          # dp-cp：[S] → [S/d]
# └─ optimizer.step()  = ChainedOptimizer.step
#    ├─ prepare_grads → _copy_model_grads_to_main_grads                  # shard.grad = main_grad 的那一段
#    ├─ get_grad_norm → get_grad_norm_fp32                               # all_reduce([1])：平方和跨 rank 相加
#    ├─ clip_grad > 0 时：_compute_grad_norms_by_group                    # 第一步 all_reduce(MAX, [1])：有没有 MTP 参数
#    │  └─ clip_grad_by_total_norm_fp32                                  # 本地缩放
#    └─ step_with_ready_grads
#       ├─ AdamW.step()                                                  # 只更新本 rank 的 shard
#       ├─ _copy_main_params_to_model_params                             # shard → param buffer 的那一段
#       └─ start_param_sync_for_bucket_group_subset
#          └─ bucket_group.start_param_sync → all_gather_into_tensor      # dp-cp：[S/d] → [S]
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::setup_model_and_optimizer` | `model_type`、`model_provider_func`、`checkpointing_context`（或只能按关键字给的 `cfg_container`、`pg_collection`） | `(model, optimizer, opt_param_scheduler)`，`model` 是每个 virtual stage 一个 DDP 包装的列表（[training.py:2286](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2286)） 模型 config 的 builder 建模型并包上 `DistributedDataParallel`（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)；没有模型 config 时退回 `get_model`，[training.py:2061](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2061)）、`get_megatron_optimizer`（[training.py:2132](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2132)）、续训时 `load_checkpoint` 里的 `dist_checkpointing`（[training.py:2199](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)） | 是：模型按 TP / PP 群建，DDP 记下 dp-cp 群，分布式优化器按 dp 群分片 | 权重按 TP / PP 切；`--use-distributed-optimizer` 时优化器状态按 DP 切 | 是：建参数、grad buffer、优化器状态；续训时从 checkpoint 读回参数与 `args.iteration` | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` + `Adam(...)`（+ `load_distributed_checkpoint`） |
# | `DistributedOptimizer.compute_full_param_layout` | 全部可训练参数、`bucket_size`、DP 大小、`DistributedDataParallelConfig` | 每块 buffer 一份 `PerBufferParamLayout`（参数区间、bucket 区间、分片数） | `group_params_for_buffers`、`_compute_per_buffer_param_layout` | 只用 DP 的**大小**，不通信 | 否（只算下标） | 否：DDP 拿它建 buffer | simple loop 不用分布式优化器 |
# | `get_megatron_optimizer` | `OptimizerConfig`、DDP 包装后的 model chunk | `ChainedOptimizer` | `_get_param_groups_and_buffers`、`DistributedOptimizer` / `FP32Optimizer` | 取 dp-cp、tp-pp 等群，不通信 | 否 | 是：建优化器 | simple loop 用 torch 的 `Adam`，没有调用它（笔记 14 遗留问题 2） |
# | `DistributedOptimizer.__init__` | torch Adam、config、各 chunk 的 buffers、DP 群 | 优化器 | `_build_*` 几个 classmethod | 只取 DP 群的大小和序号 | **是**：按 DP 序号切 buffer | 是：Adam 的参数组换成 shard | 同上 |
# | `_build_model_gbuf_range` | buffer、bucket 序号 | 本 rank 的参数区间表 | `_build_model_gbuf_param_range_map` | 只读 DP 大小 / 序号 | **是**：均分 bucket | 否 | 同上 |
# | `start_grad_sync`（分布式优化器） | bucket | 无 | `reduce_scatter_tensor` | **是**：dp-cp | **是**：梯度按 rank 分段归约 | 是：本段梯度 = DP 平均 | `finalize_model_grads` |
# | `ChainedOptimizer.step` | 无 | (成功, 梯度范数, 零的个数) | `prepare_grads`、`get_grad_norm`、`step_with_ready_grads` | **是**：范数 all-reduce | 否 | 是：shard 更新、Adam 状态 | `optim.step()` |
# | `step_with_ready_grads` | 无 | 成功与否 | AdamW、`_copy_main_params_to_model_params`、`start_param_sync` | **是**：all-gather | **是**：拼回完整参数 | 是：模型权重 | 同上 |
#
# > **旧版（core_v0.18.0）：** `setup_model_and_optimizer` 的前两个位置参数顺序相反：`(model_provider_func, model_type, checkpointing_context=None)`，也没有 `cfg_container`、`pg_collection`（[`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/training/training.py#L1938)）；按位置传参的调用换版本时要对调。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch

from snippets.dp import grad_buffers
from snippets.optim import optimizer_memory, pictures
from snippets.record.listing import listing
from snippets.record import recorder
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n14_ddp import build_model
from snippets.experiments.n15_dist_optimizer import MEANINGS, fsdp_vs_tp, memory_rows, train_two_steps
from snippets.dp.fsdp2 import memory_table
from snippets.ranks.launch import run_ranks
from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, by_global_name, concat, forward_step, init_by_global_name, \
    max_abs_diff, microbatches, tiny_config

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
# ### 两步训练
#
# 模型是 3 层、hidden 16、FFN 48 的真实 `GPTModel`（这个大小让 DP=2 的分界线正好切过一个参数，见下文）。
# 一个 global batch 4 个 micro-batch，DP rank 各拿一半；每步：清梯度、schedule、像 simple loop 那样显式
# `finalize_model_grads`、`optimizer.step()`。`clip_grad=0`：裁剪只是本地乘一个系数，留给笔记 20；在 CPU 上它还需要
# 一个额外的补丁（遗留问题 2）。同一个函数在 1 个 rank 上跑就是"单进程、整批、不分片"的参照。
#
# 这个函数在 `snippets/experiments/n15_dist_optimizer.py` 里，模型尺寸和 micro-batch 数是参数 `dims`（本篇用它的 `tiny`），
# 模型由笔记 14 的同一个 `build_model` 建。

# %% [markdown]
# 本篇读的是这两个调用：DDP 用 `use_distributed_optimizer=True` 建 buffer，`get_megatron_optimizer` 用同一个开关建优化器。
# 单独在 2 个 rank 上只建不训练，看它们返回什么（`build_model` 是笔记 14 的模型）：

# %%
def build_zero1(dims):
    parallel_state.initialize_model_parallel()  # DP=2
    model, config = build_model(dims)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True), [ddp])
    inner = optimizer.chained_optimizers[0]
    adam_elements = sum(p.numel() for group in inner.optimizer.param_groups for p in group["params"])
    return type(ddp).__name__, type(optimizer).__name__, type(inner).__name__, ddp.buffers[0].grad_data.numel(), adam_elements


TINY = EXPERIMENTS["dist-optimizer"].tiny
Table(["rank", "DDP", "get_megatron_optimizer 返回", "里面", "grad buffer 元素（补齐后）", "本 rank 的 Adam 管的元素"],
      [[rank, *r] for rank, r in enumerate(run_ranks(build_zero1, 2, TINY))])

# %% [markdown]
# 训练两步的函数把同样的两个调用放进一个完整的训练步（开关作参数），再录下通信和字节：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(train_two_steps)

# %%
one = run_ranks(train_two_steps, 1, TINY, use_distributed_optimizer=False)[0]
plain = run_ranks(train_two_steps, 2, TINY, use_distributed_optimizer=False)
zero1 = run_ranks(train_two_steps, 2, TINY, use_distributed_optimizer=True)

# %% [markdown]
# 建出来的对象（不用 Megatron FSDP 时 `get_megatron_optimizer` 总是返回 `ChainedOptimizer`，里面按配置是哪种优化器；
# 没有 Transformer Engine / Apex 时，最里层是 torch 的 `AdamW`）：

# %%
Table(["运行", "返回", "里面", "最里层"],
      [["1 个进程，不分片", *one["types"]], ["DP=2，不分片", *plain[0]["types"]],
       ["DP=2，use_distributed_optimizer", *zero1[0]["types"]]])

# %% [markdown]
# ### 补齐后的 buffer
#
# 同一个模型，DDP 的 buffer 在分布式优化器下变长了：每个参数的起点补齐到 64 的倍数，bucket 的末尾补齐到
# lcm(DP, 128) 的倍数（[param_layout.py 第 26 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/param_layout.py#L26)、[param_layout.py 第 33 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/param_layout.py#L33)），这样 bucket 能被 DP 整除、每段起点对齐。
# 补齐规则属于优化器，不属于 DDP：`DistributedOptimizer._compute_per_buffer_param_layout` 只凭参数大小和 DP 大小算出
# 每个参数和每个 bucket 的区间，DDP 的 `_ParamAndGradBuffer` 照着这份布局分配、切视图。正式入口在建 DDP **之前**就算好
# （builder 路径在 [dist_utils.py:337](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/dist_utils.py#L337)，退回的 `get_model` 路径在 `wrap_model_chunks_with_ddp`，[training.py:1880](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1880)），以 `full_param_layout=` 传进去；
# 本篇的单元格像多数直接用 Megatron Core 的代码一样不传，DDP 就记一条警告、自己调用同一个 classmethod
# （[distributed_data_parallel.py:143](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L143)），结果相同。
# 不用分布式优化器时走 DDP 自己那份不补齐的布局（[笔记 14](../14_data_parallel_ddp/)）。
# 整个模型只有一个 bucket（不开 overlap 时 `bucket_size=None`）：

# %%
Table(["运行", "参数个数", "buffer 元素（补齐后）", "bucket 数", "每个 rank 一段"],
      [["DP=2，不分片", plain[0]["numel"], plain[0]["buckets"][0][3], len(plain[0]["buckets"]), "-"],
       ["DP=2，分布式优化器", zero1[0]["numel"], zero1[0]["buckets"][0][3], len(zero1[0]["buckets"]),
        zero1[0]["buckets"][0][3] // 2]])

# %% [markdown]
# ### 每个 rank 的分片
#
# `DistributedOptimizer` 把每个 bucket 均分成 DP 段，rank r 拥有第 r 段；段的边界**不管**参数边界。
# 对每个与本段相交的参数，`_build_model_gbuf_param_range_map` 记三种区间：`gbuf_world`（在整块 buffer 里）、
# `gbuf_local`（在本 rank 这一段里）、`param`（在参数自身展平后的里面）。从两个 rank 的真实对象读出：

# %%
print("bucket 数:", len(zero1[0]["buckets"]), "（下表省略 bucket 列和参数名开头的 decoder.）")
Table(["rank", "参数", "元素", "gbuf_world", "gbuf_local", "param"],
      [[rank] + row[1:] for rank, r in enumerate(zero1) for row in r["shards"]])

# %% [markdown]
# - rank 0 拥有 `[0, 4864)`，rank 1 拥有 `[4864, 9728)`。
# - `decoder.layers.1.mlp.linear_fc1.weight`（表里是 `layers.1.mlp.linear_fc1.weight`）跨过了分界线：展平后的前 640 个元素 `param [0, 640)` 归 rank 0，
#   后 128 个 `param [640, 768)` 归 rank 1。两个 rank 的 Adam 各自只为自己那部分存动量、做更新。
# - `gbuf_local` 是 rank 1 这一段里的位置，从 0 数起；`gbuf_world` 减去段起点 4864 就是它。
# - 被补齐占掉的位置（比如 16 个元素的 norm 参数后面空出的 48 个）不属于任何参数，Adam 不为它们存状态。

# %%
split = [(rank, row[1], row[5]) for rank, r in enumerate(zero1) for row in r["shards"]
         if row[5] != f"[0, {row[2]})"]
print("被切开的参数:", split)

# %% [markdown]
# 画成一张图：横轴是补齐后的整块 buffer，每个 rank 三行——权重、梯度 buffer、优化器状态（鼠标停在小块上看参数名）：

# %%
pictures.draw_shard_map([r["shards"] for r in zero1], zero1[0]["buckets"][0][3])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 一步里的通信
#
# 第 2 步，从 `finalize_model_grads` 到 `optimizer.step()` 结束，rank 0 发出的全部 collective：

# %%
communication_table(zero1[0]["calls"], MEANINGS, ranks=False)

# %% [markdown]
# 对照：不分片的 DP=2 同一段只有一次 all-reduce（梯度范数那次 all-reduce 在 `tp-pp` 群里，这里只有 1 个 rank，不算通信）：

# %%
communication_table(plain[0]["calls"], MEANINGS, ranks=False)

# %% [markdown]
# - **reduce-scatter**：`[9728] → [4864]`，输入是整个 bucket，输出是本 rank 那段的视图（`shard_buffer` 切出来的，原地）。
# - **all-reduce `[1]`**：范数要对**全部**梯度算，而每个 rank 只有自己那段的平均梯度，所以各 rank 先算本段平方和，
#   在分布式优化器的群里相加。记录器不认识这个群的名字（它是 `intra_dist_opt_group`，这里成员就是 DP 群 [0, 1]）。
# - **all-gather**：`[4864] → [9728]`，在 `step_with_ready_grads` 里、Adam 之后；param buffer 就是模型参数的存储，
#   拼好之后下一次 forward 直接可用。
# - reduce-scatter + all-gather 的通信量与一次 all-reduce 相同（ring all-reduce 本来就是这两步），分布式优化器并没有多花带宽。
#
# ### reduce-scatter 之后 buffer 里是什么
#
# 每个 rank 的 buffer 里只有自己那段是平均梯度；另一段是被乘了 1/DP、却没有与对方相加的本地梯度。
# 用两个 rank 在 `finalize_model_grads` 之前保存的本地 buffer 验证：

# %%
half = zero1[0]["buckets"][0][3] // 2
average = (zero1[0]["local"] + zero1[1]["local"]) / 2
rows = []
for rank, r in enumerate(zero1):
    for owner, region in enumerate((slice(0, half), slice(half, 2 * half))):
        rows.append([rank, owner, torch.allclose(r["reduced"][region], average[region], atol=1e-7),
                     torch.allclose(r["reduced"][region], r["local"][region] / 2, atol=1e-7)])
Table(["rank", "第几段", "= 两个 rank 的平均", "= 本地梯度 / 2"], rows)

# %% [markdown]
# 另一段里的值没有人再用：`_copy_model_grads_to_main_grads` 只把本段交给 Adam，下一步开始时 `zero_grad_buffer` 清零。
#
# ### 结果：与不分片相同

# %%
Table(["比较（2 步 Adam 之后的全部权重）", "max |Δ|（4 位小数）", "逐位相同", "allclose(atol=1e-6)"], [
    ["分布式优化器 rank 0 vs rank 1", max_abs_diff(zero1[0]["params"], zero1[1]["params"]),
     all(torch.equal(zero1[0]["params"][k], zero1[1]["params"][k]) for k in one["params"]), True],
    ["分布式优化器 vs 不分片（都是 DP=2）", max_abs_diff(zero1[0]["params"], plain[0]["params"]),
     all(torch.equal(zero1[0]["params"][k], plain[0]["params"][k]) for k in one["params"]), True],
    ["分布式优化器 DP=2 vs 单进程整批", max_abs_diff(zero1[0]["params"], one["params"]),
     all(torch.equal(zero1[0]["params"][k], one["params"][k]) for k in one["params"]),
     all(torch.allclose(zero1[0]["params"][k], one["params"][k], atol=1e-6) for k in one["params"])],
])

# %% [markdown]
# 与不分片的 DP=2 **逐位**相同：两种情况下每个梯度元素都是同样两个数的和，Adam 是逐元素的，
# 在一段上做和在整块上做算的是同样的式子。与单进程整批差在 1e-7 量级：那是求平均的顺序不同（先各算一半再平均）。
# 梯度范数三者也相同：

# %%
print("梯度范数（第 2 步）:", round(one["grad_norm"], 4), round(plain[0]["grad_norm"], 4),
      round(zero1[0]["grad_norm"], 4), round(zero1[1]["grad_norm"], 4))

# %% [markdown]
# ## 机制解释
#
# ### 每个参数几个字节
#
# 对每个参数，混合精度 Adam 要存：模型权重和梯度 buffer（模型的 dtype）；fp32 主权重（权重不是 fp32 时）；
# fp32 主梯度（梯度 buffer 不是 fp32 时）；Adam 的两个 fp32 动量。不分片时这些在每个 DP rank 上都有一份；
# 分布式优化器保留完整的权重和梯度 buffer（forward、backward 要用），其余只存 1/DP。
# `snippets.optim.optimizer_memory.bytes_per_parameter` 按这个拆分计算，结果就是 Megatron 文档里的表（`d` = DP）：

# %%
Table(["参数 / 梯度 dtype", "不分片", "分布式优化器，d=2", "d=8", "d=64"],
      [[f"{p} / {g}", optimizer_memory.bytes_per_parameter(p, g, 1, False)]
       + [optimizer_memory.bytes_per_parameter(p, g, d, True) for d in (2, 8, 64)]
       for p, g in (("fp16", "fp16"), ("bf16", "fp32"), ("fp32", "fp32"))])

# %% [markdown]
# 一个 8B 参数的模型、bf16 权重 + fp32 梯度（正式入口开 `--bf16` 时梯度缺省就在 fp32 里累加和归约，
# [`arguments.py:1193`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1193)）、DP=8，每个 rank 上的模型 + 优化器状态
# （不含激活；TP / PP 还会再除）：

# %%
n = 8e9
Table(["", "字节 / 参数", "每个 rank（GB）"],
      [["不分片", optimizer_memory.bytes_per_parameter("bf16", "fp32", 8, False),
        round(n * optimizer_memory.bytes_per_parameter("bf16", "fp32", 8, False) / 1e9, 1)],
       ["分布式优化器", optimizer_memory.bytes_per_parameter("bf16", "fp32", 8, True),
        round(n * optimizer_memory.bytes_per_parameter("bf16", "fp32", 8, True) / 1e9, 1)]])

# %% [markdown]
# 144 GB 放不进一张 80 GB 的卡，60 GB 可以。本篇的小模型是 fp32 / fp32，公式给出 16 和 8 + 8/2 = 12 字节；
# 从两次运行的真实对象里数出来的（`optimizer_memory.measured_bytes`：DDP 的权重 / 梯度 buffer、Adam 的状态张量、
# 是拷贝而非视图的主权重）：

# %%
rows = memory_rows("DP=2，不分片", plain) + memory_rows("DP=2，分布式优化器", zero1)
display(Table(["运行", "rank", "权重 B", "梯度 B", "fp32 主权重 B", "Adam 状态 B", "合计 B", "字节 / 参数"], rows))
pictures.draw_bytes_per_parameter(rows)

# %% [markdown]
# - 不分片：正好 16 字节 / 参数。
# - 分布式优化器：Adam 状态减半；fp32 权重的 shard 是模型权重的**视图**，不另存主权重（主权重 0 字节）；
#   12.5 多一点而不是 12，多出来的是补齐——buffer 有 9728 个位置，参数只有 9056 个，小模型里 16 元素的 norm 参数
#   各占 64 个位置。真实模型的参数都很大，补齐可以忽略。
# - 两个 rank 的 Adam 状态不一样多：均分的是 buffer（含补齐），不是参数。

# %% [markdown]
# ## 与训练主链路的关系
#
# `setup_model_and_optimizer` 用同一个 `--use-distributed-optimizer` 同时设置 DDP 的和优化器的
# `use_distributed_optimizer`：DDP 据此补齐 buffer、建参数 buffer、把梯度归约从 all-reduce 换成 reduce-scatter；
# 优化器据此只管自己那段。`train_step` 里：schedule（`finalize_model_grads` 做 reduce-scatter）→ `optimizer.step()`
# （范数 all-reduce、Adam、all-gather）。开 `--overlap-param-gather` 时 all-gather 不在 step 里发，而是推迟到下一次
# forward，由 DDP 的 forward pre-hook 按 bucket 等待，和计算重叠（`distributed_data_parallel.py` 的 `_make_forward_pre_hook`）。
# checkpoint 时优化器状态也是分片的，要能换 DP 大小重新切（笔记 07、21）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **ZeRO**：stage 1 分片优化器状态（本篇）；stage 2 再分片梯度（Megatron 的梯度 buffer 仍是完整的，
#   reduce-scatter 之后别人那段只是没人用）；stage 3 再分片参数——那是 Megatron FSDP（`use_megatron_fsdp`）的事。
# - **reduce-scatter + all-gather = all-reduce**：ring all-reduce 本来就分这两半；分布式优化器把"算"插在两半之间，
#   每个 rank 只算 1/DP。
# - **逐元素的优化器可以任意切**：Adam / AdamW 对每个元素独立更新，所以按 buffer 位置切、切断参数都没关系；
#   需要整块参数的优化器（如 Muon、Shampoo）不能这样切。`DistributedOptimizer.__init__` 只接受 Adam 类，
#   或者带来了 `init_state_fn`（先把状态张量建好）的逐元素优化器，如 Lion（[distrib_optimizer.py:688](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L688)；
#   断言里给的理由是 checkpoint 格式要求状态张量事先存在）。
#
# > **旧版（core_v0.18.0）：** 这条断言只放行 Adam / AdamW / `HybridDeviceOptimizer`，带 `init_state_fn` 的 Lion 不能用分布式优化器（[distrib_optimizer.py:664](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/optimizer/distrib_optimizer.py#L664)）。

# %% [markdown]
# ## 遗留问题
#
# **1. 为什么小模型不带 bias：K 的 bias 梯度是纯噪声。** 本站的 `tiny_config` 关掉了线性层的 bias。原因是注意力里
# K 投影的 bias 对 loss 没有影响（每个 query 的所有 score 加上同一个数，softmax 不变），它的梯度在精确算术下为 0，
# float 里只剩舍入误差。Adam 的第一步把梯度除以它自己的幅度，噪声也会被放大成接近 lr 的一步，而且方向随求和顺序而变：
# 带 bias 时，"DP=2"与"单进程"这两种都正确的算法在一步之后就不再一致。用带 bias 的同一个模型量一下
# fused QKV 的 bias 梯度（local spec 里 QKV 按 query 组交错排列：每组 `[q(8), k(8), v(8)]`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def qkv_bias_grad():
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(num_layers=3, ffn_hidden_size=48, add_bias_linear=True)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    init_by_global_name(model)
    batch = concat(microbatches(4))
    model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]).mean().backward()
    grad = model.decoder.layers[0].self_attention.linear_qkv.bias.grad.view(2, 3, 8)  # [group, q/k/v, dim]
    return [grad[:, i].abs().max().item() for i in range(3)]


q, k, v = run_ranks(qkv_bias_grad, 1)[0]
print("max |grad|  q bias:", round(q, 4), " v bias:", round(v, 4), " k bias < 1e-6:", k < 1e-6)

# %% [markdown]
# Adam 第一步对每个元素的更新是 lr·g/(|g|+ε)（ε = 1e-8）：q、v 的 bias 走接近 lr 的一步；k 的 bias 梯度只有舍入误差那么大，
# 这一步的大小和方向都由舍入误差决定，换一种求和顺序就换一个结果。去掉 bias 之后，上面的 DP=2 与单进程只差 1e-7 量级。
#
# **2. CPU 上的四个补丁，和本篇没走到的那个。** 本篇依赖 CPU 层（`snippets/cpu/optimizer.py`、`snippets/cpu/distributed.py`）里的四个补丁
# （[在 CPU 上运行](../../cpu/) 有表和测试）：优化器构造时写死的 `device='cuda'`；每步算梯度范数时写死的
# `device='cuda'`（`ChainedOptimizer.step` 不管 `clip_grad` 是多少都算范数，`get_grad_norm_fp32` 先用它建一个零张量，
# [clip_grads.py:108](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L108)）；
# [`distrib_optimizer.py:466`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L466)
# 要求 `param.type()` 是 `'torch.cuda.FloatTensor'`——CPU 参数答 `'torch.FloatTensor'`，就抛 `TypeError`
# （Tensor 的方法，模块级代理管不到，补丁只在 `_build_model_and_main_param_groups` 运行期间改变无参数的 `Tensor.type()`）；
# 以及 `start_grad_sync` 开头取的 `torch.cuda.current_stream()`
# （[param_and_grad_buffer.py:632](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L632)，用来等 CUDA graph 重放留在参数上的事件，
# CPU 上换成一个什么都不等的替身，[笔记 14](../14_data_parallel_ddp/) 也经过它）。`clip_grad > 0` 还会走到
# [`clip_grads.py:174`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L174)
# 的同类检查和第一步那次"有没有 MTP 参数"的 all-reduce（[optimizer.py:315](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L315)）；
# 本篇用 `clip_grad=0` 没有走到，它们的补丁在[笔记 20](../20_optimizer_topic/)用到。
#
# **3. 一个 Megatron 自己知道的警告。** `DistributedOptimizer.zero_grad` 也清 shard 的 `.grad`，而 shard 是视图、不是叶子，
# torch 每次都警告（Megatron 在那一行的注释里写着会警告）。`snippets/dp/grad_buffers.py` 在 rank 进程里把它关掉了。

# %% [markdown]
# ## 自测
#
# **1. DP=2 时 rank 1 拥有 buffer 的哪一段？它在 Adam 里有几个元素的状态？**
#
# <details><summary>答案</summary>
#
# `[4864, 9728)`：补齐后的 bucket 9728 个元素均分成两段。Adam 只为其中真实参数的元素存状态，
# 元素数 = Adam 状态字节数 ÷ 8（两个 fp32 动量）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(zero1[1]["shards"][0][3], "…", zero1[1]["shards"][-1][3], " Adam 元素数:", zero1[1]["memory"]["adam_state"] // 8,
      " 两个 rank 合计:", sum(r["memory"]["adam_state"] // 8 for r in zero1), "= 参数个数", zero1[0]["numel"])

# %% [markdown]
# **2. 8B 模型、bf16 权重 + fp32 梯度，DP=64 时每个 rank 每个参数几个字节？比不分片省多少？**
#
# <details><summary>答案</summary>
#
# 6 + 12/64 = 6.1875 字节，不分片 18 字节：省 65.6%。DP 再大也省不过 6 字节——权重和梯度 buffer 没有分片。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
d64 = optimizer_memory.bytes_per_parameter("bf16", "fp32", 64, True)
print(d64, round(1 - d64 / optimizer_memory.bytes_per_parameter("bf16", "fp32", 64, False), 4))

# %% [markdown]
# **3. 分布式优化器一步的 DP 通信量（按元素计）比不分片多还是少？**
#
# <details><summary>答案</summary>
#
# 一样（忽略补齐和那个 1 元素的范数）：reduce-scatter 的 `[S] → [S/d]` 加 all-gather 的 `[S/d] → [S]`，
# 正是 ring all-reduce 的两半。本篇里 S 是补齐后的 9728，比不分片的 9056 多出补齐的部分。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(c.api, c.before, c.after) for c in zero1[0]["calls"]], [(c.api, c.before) for c in plain[0]["calls"]])

# %% [markdown]
# **4. reduce-scatter 之后、`optimizer.step()` 之前，rank 0 的 `main_grad` 对 rank 1 那段里的参数是什么？**
#
# <details><summary>答案</summary>
#
# rank 0 自己的本地梯度乘以 1/DP（`start_grad_sync` 通信前乘的），没有与 rank 1 相加——"垃圾"，没人会读。
# 上面的表里 rank 0、第 1 段："= 本地梯度 / 2" 为 True。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(torch.allclose(zero1[0]["reduced"][half:], zero1[0]["local"][half:] / 2),
      torch.allclose(zero1[0]["reduced"][half:], average[half:], atol=1e-7))

# %% [markdown]
# **5. fp32 模型用分布式优化器时，Adam 更新的是参数的拷贝还是参数本身？**
#
# <details><summary>答案</summary>
#
# 本身（的一段）：fp32 参数的 shard 是 `model_param.view(-1)[a:b]`，与参数共享存储；所以实测"fp32 主权重"是 0 字节。
# bf16 / fp16 参数时 shard 才是另建的 fp32 拷贝（`shard_model_param.clone().float()`），Adam 更新拷贝，再写回参数 buffer。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([r["memory"]["main_weights"] for r in zero1])

# %% [markdown]
# **6. Megatron Core 给了什么，是只用 PyTorch FSDP 得不到的？** 同一个小 `GPTModel` 放在 2 个 CPU rank 上：用 torch 自己的
# FSDP2（每个 `TransformerLayer` 和整个模型各 `fully_shard` 一次）时每个 rank 存多少参数、梯度、为 backward 保存的激活？
# 换成 Megatron 的 TP=2、TP=2 + SP 呢？FSDP 没有切的是什么？
#
# <details><summary>答案</summary>
#
# FSDP2 在这台机器的 gloo 上能跑。它把参数和梯度各切成一半（36224 → 18112 字节，Adam 状态跟着参数也只剩一半），
# 但每个 rank 算的是**自己那份 micro-batch 穿过整层**，所以为 backward 保存的激活与不切分时一模一样（51216 字节）；
# 它搬的是参数：forward 前逐层 all-gather 出整层权重，backward 再 all-gather 一次、把梯度 reduce-scatter 回各 rank。
# Megatron 的 TP=2 让两个 rank 算**同一个** micro-batch 的两半：参数和梯度也约减半（18816 字节，norm、position embedding
# 每个 rank 一整份），激活降到 33440 字节；加上 SP，norm 与残差那段也按序列切开，降到 25824 字节，约为不切分的一半。它搬的是激活。
#
# 所以 FSDP 不切的是：激活、一个样本内部的计算（一层的整份权重在用它的那一刻必须凑齐在每个 rank 上），以及 batch 的下限
# （DP=N 至少要 N 条序列）。Megatron Core 多给的正是切开一个样本的那几种并行——TP / SP、CP（切序列）、PP（切层）、EP（切 MoE 专家）——
# 以及能和它们组合的分片：本篇的分布式优化器，和它自己包装 FSDP2 的 `TorchFullyShardedDataParallel`
# （[`torch_fully_sharded_data_parallel.py:28`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/torch_fully_sharded_data_parallel.py#L28)）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
memory_table(run_ranks(fsdp_vs_tp, 2, TINY, Parallel(world=2, tp=2))[0])

# %% [markdown]
# ## 30-second answer
#
# With `use_distributed_optimizer=True`, the distributed optimizer computes a padded layout (params start
# at multiples of 64, buckets end at multiples of lcm(DP, 128)) that DDP's gradient buffer follows, so each
# bucket splits evenly across DP ranks; `get_megatron_optimizer` builds a `DistributedOptimizer` whose Adam
# holds only this rank's slice — slices ignore parameter boundaries. Each step reduce-scatters gradients, sums the squared norms
# across ranks, updates the local slice, and all-gathers the weights: same traffic as one all-reduce.
# Adam state drops from 16 to 8 + 8/d bytes per parameter (fp32), 18 to 6 + 12/d (bf16): 144 GB → 60 GB
# for 8B at DP=8. Two DP=2 steps are bit-identical to the non-distributed optimizer.
