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
# DDP 之后，每个数据并行 rank 都存着一整份 Adam 动量和 fp32 主权重。打开 `use_distributed_optimizer` 之后，
# 每个 rank 少存多少字节、一步多了哪些通信、结果还和不分片时一样吗？什么时候又该换成连权重也切开的 FSDP？
# 本篇在 2 个进程上用真实的 `DistributedDataParallel` 和 `get_megatron_optimizer` 训练两步，再把同一个模型交给 Megatron 包装的 FSDP2。

# %% [markdown]
# ## 阅读目标
#
# 1. `use_distributed_optimizer=True` 时 DDP 和 `get_megatron_optimizer` 各改变了什么，分片在哪个群里。
# 2. 每个 rank 拥有 buffer 的哪一段；一个参数被切到两个 rank 时，`gbuf_world` / `gbuf_local` / `param` 三种区间。
# 3. 一步里的通信：reduce-scatter 梯度、all-reduce 梯度范数、all-gather 权重，各在哪个阶段、什么形状。
# 4. 每个参数每个 rank 占几个字节，每一项是什么；为什么分片之后的 Adam 与不分片逐位相同。
# 5. 什么时候用 FSDP（连 bf16 权重也切开）而不是分布式优化器 + TP。
#
# **结论**
#
# - 按 buffer 的 dp-cp 群分片（专家参数用专家 DP 群）：DP=2 时 9056 个参数补齐成 9728，每个 rank 拥有 4864。
# - 一步：grad sync 里 reduce-scatter `[9728]→[4864]`，step 里范数 all-reduce `[1]`、all-gather `[4864]→[9728]`。
# - 字节/参数 = 权重 + 梯度（整份）+ 主权重 + Adam（÷d）：bf16 是 18 → 6 + 12/d，8B、DP=8 每卡 147.4 → 61.4 GB。
# - 两步 Adam 之后与不分片的 DP=2 逐位相同（max \|Δ\| 0.0），梯度范数都是 1.5157。
# - FSDP 连权重和梯度也切：每卡 20.7 GB，但激活不切（33.2 GB），每个 micro-batch 要发 57 GB。
#
# 先读：[笔记 14](../14_data_parallel_ddp/)（DDP 的 grad buffer 和 `main_grad`）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
from IPython.display import display

from snippets.dp.fsdp2 import memory_table, model_state_table, step_bytes, tiny_gpt
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n13_pipeline import microbatches
from snippets.experiments.n14_ddp import build_model
from snippets.experiments.n15_dist_optimizer import MEANINGS, folded, memory_rows, train_two_steps
from snippets.models.presets import PRESETS
from snippets.models.tiny_gpt import max_abs_diff
from snippets.optim import optimizer_memory, pictures
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

from megatron.core import parallel_state
from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                       TorchFullyShardedDataParallel)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

TINY = EXPERIMENTS["dist-optimizer"].tiny
one = run_ranks(train_two_steps, 1, TINY, use_distributed_optimizer=False)[0]
plain = run_ranks(train_two_steps, 2, TINY, use_distributed_optimizer=False)
zero1 = run_ranks(train_two_steps, 2, TINY, use_distributed_optimizer=True)
buffer_size = zero1[0]["buckets"][0][3]
pictures.draw_shard_map([r["shards"] for r in zero1], buffer_size,
                        title="分布式优化器（DP=2）：权重和梯度 buffer 每个 rank 整份，Adam 状态每个 rank 只存自己那一段")

# %% [markdown]
# 横轴是补齐后的整块 buffer（9728 个位置），每个 rank 三行：权重、梯度 buffer、优化器状态；绿色是本 rank 独有的一段，
# 红色是被分界线切开的那个参数（鼠标停在小块上看参数名）。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n15_dist_optimizer.py`（实验名 `dist-optimizer`）。`train_two_steps` 用笔记 14 的
#   `build_model` 建一个真实的 `GPTModel`（local spec，3 层、hidden 16、FFN 48、vocab 32、sequence 8，`dims` 的 `tiny`；
#   这个大小让 DP=2 的分界线正好切过一个参数），包进 `DistributedDataParallel` 和 `get_megatron_optimizer`
#   （开关作参数），一个 global batch 4 个 micro-batch、DP rank 各拿一半，每步：清梯度、schedule、像 simple loop 那样显式调
#   `finalize_model_grads`、`optimizer.step()`。`clip_grad=0`：裁剪只是本地乘一个系数，留给笔记 20。
#   同一个函数在 1 个进程上跑就是"单进程、整批、不分片"的参照。
# - 用 `snippets.ranks.launch.run_ranks` 在本机起 1 或 2 个 gloo 进程；`keep_tensors=True` 把权重和归约前后的 buffer
#   带回笔记进程比较。通信由 `snippets.record.recorder` 记录（第 2 步从 `finalize_model_grads` 到 `optimizer.step()` 结束），
#   phase 一列由发出它的 Megatron 文件决定；"meaning"一列按（API, 发出它的函数）查 `MEANINGS`。只有 1 个成员的群不算通信，不列。
# - 字节数由 `snippets.optim.optimizer_memory.measured_bytes` 从真实对象里数：DDP 的参数 / 梯度 buffer、torch Adam 的状态张量、
#   是拷贝而非视图的主权重；公式是同一模块的 `bytes_per_parameter`。
# - FSDP 那一节：`snippets.dp.fsdp2` 的 `tiny_gpt`（同尺寸的 local-spec `GPTModel`）、`step_bytes`（一步之后本 rank 的参数、
#   梯度字节，和 `saved_tensors_hooks` 数出的、为 backward 保存的激活字节）；8B 的表由 `model_state_table` 按文中公式计算，
#   激活用 `snippets.models.memory_estimate` 的逐层公式（local spec 每个 token 保存的张量，减去 flash attention 不保存的
#   `s×s` 概率），是估计。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 dist-optimizer`（两种运行的表）；整页：
#   `scripts/execute_notes.sh notes/15_distributed_optimizer.py`。CPU 上的改动见文末"在 CPU 上怎么跑的"。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(train_two_steps)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`optimizer/__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 入口：分参数组、取 DDP 的 buffer，返回 `ChainedOptimizer` |
# | [`distrib_optimizer.py::DistributedOptimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L113) | ZeRO-1 的实现 |
# | [`distrib_optimizer.py::DistributedOptimizer.compute_full_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L591) | 建 DDP 之前算好补齐的布局 |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_range`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L200) | 按 buffer 的群均分 bucket |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | reduce-scatter 梯度 |
# | [`distrib_optimizer.py::DistributedOptimizer.step_with_ready_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L3158) | Adam 之后发起参数 all-gather |
# | [`torch_fully_sharded_data_parallel.py::TorchFullyShardedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/torch_fully_sharded_data_parallel.py#L28) | Megatron 包装的 torch FSDP2 |
#
# <details><summary>其余 12 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`mcore_fsdp_adapter.py::FullyShardedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/fsdp/mcore_fsdp_adapter.py#L63) | Megatron-FSDP（`use_megatron_fsdp`） |
# | [`optimizer/__init__.py::_get_megatron_optimizer_based_on_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L450) | 建 torch 的 Adam，再按配置包成 `DistributedOptimizer` / `FP32Optimizer` / … |
# | [`optimizer_config.py::OptimizerConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer_config.py#L139) | `use_distributed_optimizer`、`lr`、`clip_grad`… |
# | [`distrib_optimizer.py::DistributedOptimizer._compute_per_buffer_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L506) | 一块 buffer 的布局：倒序排放，参数起点补齐到 64，bucket 末尾补齐到 lcm(DP, 128) |
# | [`distrib_optimizer.py::DistributedOptimizer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L633) | 算分片、建 shard、把 Adam 的参数组换成 shard |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_param_range_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L134) | 本段与每个参数求交：三种区间 |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_and_main_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L347) | shard = 参数展平后的一段（fp32 是视图，16 位时另建 fp32 拷贝） |
# | [`distrib_optimizer.py::DistributedOptimizer._copy_model_grads_to_main_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2746) | 把 buffer 里已归约的那段交给 shard 的 `.grad` |
# | [`distrib_optimizer.py::DistributedOptimizer._copy_main_params_to_model_params`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2792) | 把更新后的 shard 写回参数 buffer |
# | [`optimizer.py::ChainedOptimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1855) | 每一步：准备梯度、算范数、（裁剪）、更新 |
# | [`clip_grads.py::get_grad_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L55) | 各 rank 的平方和跨 rank 相加 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_param_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L377) | 参数 all-gather |
#
# Megatron 自己的说明页：[docs/user-guide/features/dist_optimizer.md](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/docs/user-guide/features/dist_optimizer.md)、[docs/user-guide/features/megatron_fsdp.md](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/docs/user-guide/features/megatron_fsdp.md)。
#
# </details>

# %% [markdown]
# ## 调用链
#
# 建的时候：先按分布式优化器的规则算好补齐的布局，DDP 照着它建 grad buffer 和 param buffer，`get_megatron_optimizer`
# 再让 Adam 只管本 rank 的那段。每一步：`finalize_model_grads` 里 reduce-scatter，`optimizer.step()` 里范数 all-reduce、
# Adam、all-gather。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::setup_model_and_optimizer(model_type, model_provider_func, ...)
# ├─ GPTModelBuilder.build_distributed_models（无模型 config 时退回 get_model）→ 包 DDP  # 每个 model chunk 一次
# │  ├─ DistributedOptimizer.compute_full_param_layout(params, bucket_size, DP, ddp_config)
# │  │  └─ _compute_per_buffer_param_layout: 倒序排放；参数起点补齐到 64、
# │  │                                       bucket 末尾补齐到 lcm(DP, 128)  # 纯本地，只算下标
# │  └─ DistributedDataParallel(..., full_param_layout=layout)
# │     └─ _ParamAndGradBuffer(data_parallel_group=intra_dp_cp_group)  # 专家参数：intra_expt_dp_group
# │                             grad buffer + param buffer，param.data 改指向它  # 纯本地
# └─ optimizer/__init__.py::get_megatron_optimizer(OptimizerConfig(use_distributed_optimizer=True), model)
#    ├─ _get_param_groups_and_buffers                       # weight decay 分组 + 各 chunk 的 DDP buffer
#    └─ _get_megatron_optimizer_based_on_param_groups
#       ├─ torch.optim.AdamW(param_groups)                  # 没有 TE / Apex 时
#       └─ DistributedOptimizer(adam, config, ..., per_model_buffers)
#          ├─ _build_gbuf_range_map → _build_model_gbuf_range          # buffer 的群：本 rank 的 [r·S/d, (r+1)·S/d)
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
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `training.py::setup_model_and_optimizer` 的记录在[笔记 01](../01_training_run_overview/)（"每个函数的阅读记录"那张表）；
# 这里只补一句：打开 `--use-distributed-optimizer` 时，它建的 DDP 和优化器都按 buffer 的 dp-cp 群（`intra_dp_cp_group`）分片。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `DistributedOptimizer.compute_full_param_layout` | 全部可训练参数、`bucket_size`、DP 大小、`DistributedDataParallelConfig` | 每块 buffer 一份 `PerBufferParamLayout`（参数区间、bucket 区间、分片数） | `group_params_for_buffers`、`_compute_per_buffer_param_layout` | 只用 DP 的**大小**，不通信 | 否（只算下标） | 否：DDP 拿它建 buffer | simple loop 不用分布式优化器 |
# | `get_megatron_optimizer` | `OptimizerConfig`、DDP 包装后的 model chunk | `ChainedOptimizer` | `_get_param_groups_and_buffers`、`DistributedOptimizer` / `FP32Optimizer` | 取 dp-cp、专家 DP、模型并行等群，不通信 | 否 | 是：建优化器 | simple loop 用 torch 的 `Adam`，没有调用它（笔记 14 遗留问题 2） |
# | `DistributedOptimizer.__init__` | torch Adam、config、各 chunk 的 buffers、DP 群 | 优化器 | `_build_*` 几个 classmethod | 分片用每块 buffer 自己的群（dp-cp，专家参数是专家 DP 群）的大小和序号 | **是**：按序号切 buffer | 是：Adam 的参数组换成 shard | 同上 |
# | `_build_model_gbuf_range` | buffer、bucket 序号 | 本 rank 的参数区间表 | `_build_model_gbuf_param_range_map` | 只读 buffer 群的大小 / 序号 | **是**：均分 bucket | 否 | 同上 |
# | `start_grad_sync`（分布式优化器） | bucket group | 无 | `reduce_scatter_tensor` | **是**：buffer 的群（dp-cp） | **是**：梯度按 rank 分段归约 | 是：本段梯度 = DP 平均 | `finalize_model_grads` |
# | `ChainedOptimizer.step` | 无 | (成功, 梯度范数, 零的个数) | `prepare_grads`、`get_grad_norm`、`step_with_ready_grads` | **是**：范数 all-reduce | 否 | 是：shard 更新、Adam 状态 | `optim.step()` |
# | `step_with_ready_grads` | 无 | 成功与否 | AdamW、`_copy_main_params_to_model_params`、`start_param_sync` | **是**：all-gather | **是**：拼回完整参数 | 是：模型权重 | 同上 |
# | `TorchFullyShardedDataParallel.__init__` | config、DDP config、模型 | 包好的模型 | torch 的 `fully_shard`（embedding、每个 `TransformerLayer`、根模块） | 在 dp-cp 群上建 `DeviceMesh` | **是**：每个参数按 DP 切成一份份 | 是：参数换成 DTensor 分片 | `DistributedDataParallel(...)` 那一步 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 同一个开关，两处用
#
# 分布式优化器不是只换一个优化器：DDP 用 `use_distributed_optimizer=True` 建 buffer（补齐、另建参数 buffer、梯度归约从
# all-reduce 换成 reduce-scatter），`get_megatron_optimizer` 用同一个开关建优化器。只建不训练，看它们在 2 个 rank 上返回什么：

# %%
def build_zero1(dims):
    parallel_state.initialize_model_parallel()  # DP=2
    model, config = build_model(dims)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True), [ddp])
    inner = optimizer.chained_optimizers[0]
    adam_elements = sum(p.numel() for group in inner.optimizer.param_groups for p in group["params"])
    buffer = ddp.buffers[0]
    return (type(optimizer).__name__, type(inner).__name__, buffer.grad_data.numel(),
            torch.distributed.get_process_group_ranks(buffer.data_parallel_group), adam_elements)


Table(["rank", "get_megatron_optimizer 返回", "里面", "grad buffer 元素（补齐后）", "buffer 的群（分片的群）",
       "本 rank 的 Adam 管的元素"], [[rank, *r] for rank, r in enumerate(run_ranks(build_zero1, 2, TINY))])

# %% [markdown]
# 外层总是 `ChainedOptimizer`，里面是 `DistributedOptimizer`（不开开关时是 `FP32Optimizer`）。两个 rank 的 Adam 合计管 9056 个元素：每个参数恰好一次。
#
# **分片的群是 buffer 自己的群，不是 dp 群。** `_build_model_gbuf_range` 取的是 `param_and_grad_buffer.data_parallel_group` 的
# 大小和序号（[`distrib_optimizer.py:211`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L211)）；
# DDP 给普通参数的 buffer 的是 `intra_dp_cp_group`，给专家参数的是 `intra_expt_dp_group`
# （[`distributed_data_parallel.py:221`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L221)）。
# 前者是 DP×CP（只有一个优化器实例时就是整个 dp-cp 群）：CP 的各 rank 持有同一份权重（[笔记 16](../16_context_parallel/)），
# 所以也一起分优化器状态。这里没有 CP，群就是 `[0, 1]`。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
folded("三种运行建出来的对象", Table(["运行", "返回", "里面", "最里层"],
       [["1 个进程，不分片", *one["types"]], ["DP=2，不分片", *plain[0]["types"]],
        ["DP=2，use_distributed_optimizer", *zero1[0]["types"]]]))

# %% [markdown]
# ### 补齐的布局属于优化器
#
# 每个参数的起点补齐到 64 的倍数，bucket 的末尾补齐到 lcm(DP, 128) 的倍数
# （[`param_layout.py:26`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/param_layout.py#L26)、[`param_layout.py:33`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/param_layout.py#L33)），
# bucket 才能被 DP 整除、每段起点对齐。这份布局只凭参数大小和 DP 大小就能算，不用通信；正式入口在建 DDP **之前**调它，
# 以 `full_param_layout=` 传进去。直接调这个 staticmethod，看 DP=2 和 DP=3 各补到多长：

# %%
def padded_layouts(dims):
    parallel_state.initialize_model_parallel()
    model, _ = build_model(dims)
    rows = []
    for dp in (2, 3):  # the layout needs only the parameters and the DP size: no group, no communication
        layout = DistributedOptimizer.compute_full_param_layout(
            list(model.parameters()), None, dp, DistributedDataParallelConfig(use_distributed_optimizer=True))
        (buffer,) = layout.layouts.values()  # one buffer: fp32 params, fp32 grads, no experts
        ((start, end),) = buffer.bucket_indices
        rows.append([dp, buffer.per_bucket_numel_unpadded[0], [start, end], buffer.num_optimizer_shards, end // dp])
    return rows


Table(["DP", "bucket 里参数占到的位置", "bucket 区间（补齐后）", "分几段", "每段"], run_ranks(padded_layouts, 1, TINY)[0])

# %% [markdown]
# 9056 个参数的起点各对齐到 64（16 元素的 norm 后面空出 48 个），排到第 9728 个位置，正好是 128 的倍数，DP=2 不用再补；
# DP=3 时末尾补到 lcm(3, 128) = 384 的倍数 9984。不用分布式优化器时 DDP 用自己那份不补齐的布局（9056，[笔记 14](../14_data_parallel_ddp/)）。
# 不传布局时 DDP 记一条警告、自己调用同一个方法（[`distributed_data_parallel.py:143`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L143)），结果相同。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
folded("两次训练里 DDP 真的建出的 grad buffer", Table(
    ["运行", "参数个数", "buffer 元素（补齐后）", "bucket 数", "每个 rank 一段"],
    [["DP=2，不分片", plain[0]["numel"], plain[0]["buckets"][0][3], len(plain[0]["buckets"]), "-"],
     ["DP=2，分布式优化器", zero1[0]["numel"], buffer_size, len(zero1[0]["buckets"]), buffer_size // 2]]))

# %% [markdown]
# ### 每个 rank 的分片
#
# 整个模型一个 bucket，均分成 DP 段，rank r 拥有第 r 段；段的边界**不管**参数边界。对每个与本段相交的参数，
# `_build_model_gbuf_param_range_map` 记三种区间：`gbuf_world`（在整块 buffer 里）、`gbuf_local`（在本段里，从 0 数）、
# `param`（在参数自身展平后的里面）。跨过分界线的那个参数：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
shard_table = Table(["rank", "参数", "元素", "gbuf_world", "gbuf_local", "param"],
                    [[rank] + row[1:] for rank, r in enumerate(zero1) for row in r["shards"]])
Table(shard_table.headers, [row for row in shard_table.rows if row[5] != f"[0, {row[2]})"])

# %% [markdown]
# - rank 0 拥有 `[0, 4864)`，rank 1 拥有 `[4864, 9728)`。`layers.1.mlp.linear_fc1.weight` 展平后的前 640 个元素归 rank 0，
#   后 128 个归 rank 1；两个 rank 的 Adam 各自只为自己那部分存动量、做更新。`gbuf_world` 减去段起点 4864 就是 `gbuf_local`。
# - 补齐占掉的位置不属于任何参数，Adam 不为它们存状态，所以两个 rank 的 Adam 管的元素不一样多（4576 与 4480）：均分的是 buffer，不是参数。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
folded(f"两个 rank 的完整分片表（bucket 数 {len(zero1[0]['buckets'])}，参数名省略开头的 decoder.）", shard_table)

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 一步里的通信
#
# 第 2 步，从 `finalize_model_grads` 到 `optimizer.step()` 结束，rank 0 发出的全部 collective；下面一张是不分片的 DP=2 同一段：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(communication_table(zero1[0]["calls"], MEANINGS, ranks=False))
communication_table(plain[0]["calls"], MEANINGS, ranks=False)

# %% [markdown]
# - **reduce-scatter**（grad sync）：`[9728] → [4864]`，输入是整个 bucket，输出是本 rank 那段的视图（`shard_buffer` 原地切出）。
# - **all-reduce `[1]`**（optimizer step）：范数要对**全部**梯度算，而每个 rank 只有自己那段的平均梯度，所以各 rank 先算本段
#   平方和再相加。它在 `intra_dist_opt_group` 里发（[`optimizer/__init__.py:678`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L678)），
#   那是一个优化器实例的全部 rank，通常就是整个 world（表里 `ranks [0, 1]`）；不分片时范数只在模型并行群里加（这里 1 个 rank，不算通信）。
# - **all-gather**（optimizer step）：`[4864] → [9728]`，在 `step_with_ready_grads` 里、Adam 之后；param buffer 就是模型参数的存储，
#   拼好之后下一次 forward 直接可用。开 `--overlap-param-gather` 时 step 里不发：第一个 bucket 在下一步的 `zero_grad` 里异步发，
#   其余由 DDP 的 forward pre-hook 逐个 bucket 发起、等待，与 forward 重叠。
# - reduce-scatter + all-gather 的通信量与一次 all-reduce 相同（ring all-reduce 本来就是这两半），分布式优化器并没有多花带宽。
#
# ### reduce-scatter 之后 buffer 里是什么
#
# 每个 rank 的 buffer 里只有自己那段是平均梯度；另一段是被乘了 1/DP、却没有与对方相加的本地梯度。用两个 rank 在
# `finalize_model_grads` 之前保存的本地 buffer 验证：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
half = buffer_size // 2
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
# ### 结果与不分片逐位相同
#
# 两步 Adam 之后，分布式优化器的全部权重与不分片的 DP=2 逐位相同（max |Δ| 0.0），与单进程整批只差 1e-7 量级
# （先各算一半再平均，求和顺序不同）；三者第 2 步的梯度范数都是 1.5157。原因是两种情况下每个梯度元素都是同样两个数的和，
# 而 Adam 逐元素更新，在一段上做和在整块上做算的是同样的式子。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("梯度范数（第 2 步，单进程 / 不分片 / 分片 rank 0、1）:", round(one["grad_norm"], 4), round(plain[0]["grad_norm"], 4),
      round(zero1[0]["grad_norm"], 4), round(zero1[1]["grad_norm"], 4))
folded("2 步 Adam 之后的全部权重：三种比较", Table(
    ["比较（2 步 Adam 之后的全部权重）", "max |Δ|（4 位小数）", "逐位相同", "allclose(atol=1e-6)"], [
        ["分布式优化器 rank 0 vs rank 1", max_abs_diff(zero1[0]["params"], zero1[1]["params"]),
         all(torch.equal(zero1[0]["params"][k], zero1[1]["params"][k]) for k in one["params"]), True],
        ["分布式优化器 vs 不分片（都是 DP=2）", max_abs_diff(zero1[0]["params"], plain[0]["params"]),
         all(torch.equal(zero1[0]["params"][k], plain[0]["params"][k]) for k in one["params"]), True],
        ["分布式优化器 DP=2 vs 单进程整批", max_abs_diff(zero1[0]["params"], one["params"]),
         all(torch.equal(zero1[0]["params"][k], one["params"][k]) for k in one["params"]),
         all(torch.allclose(zero1[0]["params"][k], one["params"][k], atol=1e-6) for k in one["params"])],
    ]))

# %% [markdown]
# ## 机制解释
#
# ### 每个参数几个字节
#
# 混合精度 Adam 为每个参数存五样东西：模型权重、梯度 buffer（模型的 dtype）；fp32 主权重（权重不是 fp32 时）；
# fp32 主梯度（梯度 buffer 不是 fp32 时）；Adam 的两个 fp32 动量（8 字节）。不分片时这些在每个 DP rank 上各一份；
# 分布式优化器保留完整的权重和梯度 buffer（forward、backward 要用），**其余**只存 1/d（d = 分片群的大小）。
# 所以 fp32 模型是 4 + 4 + 8/d（不分片 16），bf16 权重 + fp32 梯度是 2 + 4 + (4 + 8)/d（不分片 18），
# fp16 / fp16 是 2 + 2 + (4 + 4 + 8)/d（不分片 20）。正式入口开 `--bf16` 时梯度缺省就在 fp32 里累加和归约
# （[`arguments.py:1193`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1193)）。
# 按这个拆分算出的表，就是 Megatron 说明页里的那张：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["参数 / 梯度 dtype", "不分片", "分布式优化器，d=2", "d=8", "d=64"],
      [[f"{p} / {g}", optimizer_memory.bytes_per_parameter(p, g, 1, False)]
       + [optimizer_memory.bytes_per_parameter(p, g, d, True) for d in (2, 8, 64)]
       for p, g in (("fp16", "fp16"), ("bf16", "fp32"), ("fp32", "fp32"))])

# %% [markdown]
# 本篇的小模型是 fp32 / fp32：公式给出 16 和 4 + 4 + 8/2 = 12。从两次运行的真实对象里数出来的：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
rows = memory_rows("DP=2，不分片", plain) + memory_rows("DP=2，分布式优化器", zero1)
display(Table(["运行", "rank", "权重 B", "梯度 B", "fp32 主权重 B", "Adam 状态 B", "合计 B", "字节 / 参数"], rows))
pictures.draw_bytes_per_parameter(rows)

# %% [markdown]
# - 不分片：正好 16 字节 / 参数。分布式优化器：Adam 状态减半；fp32 权重的 shard 是模型权重的**视图**，不另存主权重。
# - 12.64 / 12.55 而不是 12：多出来的是补齐（buffer 9728 个位置，参数只有 9056 个）。真实模型的参数都很大，补齐可以忽略。
#
# ### 什么时候用 FSDP 而不是分布式优化器 + TP
#
# 两者切的东西不同。分布式优化器（ZeRO-1）切 fp32 主权重和 Adam 状态，梯度 reduce-scatter、权重每步 all-gather 一次，
# 但**每个 rank 仍存整份 bf16 权重和梯度 buffer**；再加 TP 才把权重、梯度和激活也切开，代价是每层的激活通信。
# FSDP（ZeRO-3）连 bf16 权重和梯度也按 DP 切：每个单元（一层）用之前 all-gather、用完就扔，backward 再收一次，梯度算完
# reduce-scatter。Megatron 两种都有：`use_torch_fsdp2` 走 `TorchFullyShardedDataParallel`（torch FSDP2，
# 不支持 PP、EP，[`arguments.py:997`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L997)），
# `use_megatron_fsdp` 走 Megatron-FSDP，`data_parallel_sharding_strategy` 从 `optim`（≈ZeRO-1）、`optim_grads` 到
# `optim_grads_params`（ZeRO-3，[`param_and_grad_buffer.py:2335`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py#L2335)），
# 而且总是配分布式优化器（[`arguments.py:1112`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1112)）。
#
# 同一个小模型在 2 个 rank 上：Megatron 的 FSDP2 包装（DP=2，每个 rank 自己的 micro-batch），对比 TP=2、TP=2 + SP
# （两个 rank 算同一个 micro-batch），一步之后每个 rank 存多少：

# %%
def fsdp_vs_tp(dims):
    parallel_state.initialize_model_parallel()                                       # DP=2
    rank = parallel_state.get_data_parallel_rank()
    model = tiny_gpt(dims)                                                           # GPTModel（local spec）
    rows = [("不切分", step_bytes(model, microbatches(dims, 2)[rank]))]
    fsdp = TorchFullyShardedDataParallel(model.config, DistributedDataParallelConfig(), model)
    rows.append(("TorchFullyShardedDataParallel，DP=2", step_bytes(fsdp, microbatches(dims, 2)[rank])))
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    for sp in (False, True):
        model = tiny_gpt(dims, tp=2, sequence_parallel=sp)
        rows.append((f"TP=2{'，SP' if sp else ''}", step_bytes(model, microbatches(dims, 1)[0])))
    return rows


memory_table(run_ranks(fsdp_vs_tp, 2, TINY)[0])

# %% [markdown]
# FSDP 把参数和梯度各切一半（36224 → 18112 字节，Adam 状态跟着参数也只剩一半），但每个 rank 算的是**自己那份 micro-batch
# 穿过整层**，为 backward 保存的激活与不切分时一模一样（51216 字节）；它搬的是权重（每个单元 forward、backward 各 all-gather 一次）。
# TP 让两个 rank 算同一个 micro-batch 的两半，激活降到 33440，加 SP 降到 25824（约一半）；它搬的是激活。
# 放大到 Qwen3-8B、8 张卡，按上面的字节拆分和各自的通信算：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
model_state_table(PRESETS["qwen3-8b"].replace(seq=4096), "Qwen3-8B")

# %% [markdown]
# 读法：FSDP（DP=8）和 TP=8 每卡的模型状态一样少（18/8 = 2.25 字节/参数，FSDP 另加正在算和预取的两层），差别在别处。
#
# - **选 FSDP**：模型状态是瓶颈、激活不是（序列不长，或开了重算）；global batch 够大，每卡能分到自己的序列；
#   DP 网络能在计算背后藏住每个 micro-batch 57 GB 的权重收发（可以跨机）；不想改模型代码——FSDP 包任何 `nn.Module`，TP 要并行层。
# - **选分布式优化器 + TP（+ SP、CP）**：激活大（长序列），只有 TP/SP/CP 能切一条样本；global batch 小于卡数；
#   一步有很多 micro-batch——分布式优化器每步只收发一次（43 GB），FSDP 每个 micro-batch 都要重来；TP 的激活通信留在机内 NVLink。
# - 两者也能叠：Megatron-FSDP 可以和 TP、CP、EP 一起用，torch FSDP2 这条路不能配 PP、EP。

# %% [markdown]
# ## 与训练主链路的关系
#
# `setup_model_and_optimizer` 用同一个 `--use-distributed-optimizer` 同时设置 DDP 和优化器（`--use-torch-fsdp2` /
# `--use-megatron-fsdp` 则在同一处把 DDP 换成对应的 FSDP 包装，[`training.py:1837`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1837)）。
# `train_step` 里：schedule（`finalize_model_grads` 做 reduce-scatter）→ `optimizer.step()`（范数 all-reduce、Adam、all-gather）。
# checkpoint 时优化器状态也是分片的，要能换 DP 大小重新切（笔记 07、21）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **ZeRO**：stage 1 分片优化器状态（本篇）；stage 2 再分片梯度（Megatron 的梯度 buffer 仍按整份分配，reduce-scatter 之后别人那段没人用）；
#   stage 3 再分片参数——FSDP。
# - **reduce-scatter + all-gather = all-reduce**：分布式优化器把"算"插在两半之间，每个 rank 只算 1/DP。
# - **逐元素的优化器可以任意切**：Adam 对每个元素独立更新，按 buffer 位置切、切断参数都没关系；需要整块参数的优化器
#   （Muon、Shampoo）不能这样切。`DistributedOptimizer.__init__` 只接受 Adam 类，或带 `init_state_fn` 的逐元素优化器如 Lion
#   （[`distrib_optimizer.py:688`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L688)；理由是 checkpoint 格式要求状态张量事先存在）。
#
# > **旧版（core_v0.18.0）：** 这条断言只放行 Adam / AdamW / `HybridDeviceOptimizer`，带 `init_state_fn` 的 Lion 不能用分布式优化器（[distrib_optimizer.py:664](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/optimizer/distrib_optimizer.py#L664)）。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **带 bias 时，K 的 bias 梯度是纯噪声，Adam 把它放大成一整步。** 注意力里 K 投影的 bias 对 loss 没有影响（每个 query 的所有
#    score 加上同一个数，softmax 不变），精确算术下梯度为 0，float 里只剩舍入误差。Adam 第一步对每个元素走 lr·g/(|g|+ε)：
#    k 的 bias 走的这一步大小和方向都由舍入误差决定，换一种求和顺序（DP=2 对单进程）就换一个结果，两种都正确的算法一步之后不再一致。
#    所以本篇的模型不带 bias。量一下同一模型带 bias 时 fused QKV 的 bias 梯度（local spec 里每组 `[q(8), k(8), v(8)]`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def qkv_bias_grad():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import SEQ, VOCAB, concat, init_by_global_name, microbatches, tiny_config

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
# 2. **`TorchFullyShardedDataParallel` 按 `config.transformer_impl` 决定切哪些模块，而不是看模型里有什么。** 它缺省把
#    `ColumnParallelLinear` 也当成一个 FSDP 单元，只在 `transformer_impl == "local"` 时去掉
#    （[`torch_fully_sharded_data_parallel.py:115`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/torch_fully_sharded_data_parallel.py#L115)）。
#    用 local spec 建模型却保留缺省的 `transformer_impl="transformer_engine"` 时，层里的 `linear_qkv`、`linear_fc1` 在
#    `TransformerLayer` 之后又被 `fully_shard` 一次，参数已是分片的 DTensor，torch 在构造时抛 `TypeError`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def fsdp2_with_te_impl_on_local_spec(dims):
    parallel_state.initialize_model_parallel()
    model = tiny_gpt(dims)
    model.config.transformer_impl = "transformer_engine"  # TransformerConfig's default
    try:
        TorchFullyShardedDataParallel(model.config, DistributedDataParallelConfig(), model)
        return "ok"
    except TypeError as err:
        return f"TypeError: {err}"


print(run_ranks(fsdp2_with_te_impl_on_local_spec, 2, TINY)[0])

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# 本篇用到 CPU 层（`snippets/cpu/optimizer.py`、`snippets/cpu/distributed.py`）的五个补丁（[在 CPU 上运行](../../cpu/) 有表和测试）：
#
# - 优化器构造时写死的 `device='cuda'`；每步算梯度范数时写死的 `device='cuda'`（`ChainedOptimizer.step` 不管 `clip_grad`
#   是多少都算范数，`get_grad_norm_fp32` 先用它建一个零张量，[`clip_grads.py:108`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L108)）。
# - [`distrib_optimizer.py:466`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L466)
#   要求 `param.type()` 是 `'torch.cuda.FloatTensor'`，CPU 参数答 `'torch.FloatTensor'` 就抛 `TypeError`；补丁只在
#   `_build_model_and_main_param_groups` 运行期间改变无参数的 `Tensor.type()`。
# - `start_grad_sync` 开头取的 `torch.cuda.current_stream()`（[`param_and_grad_buffer.py:632`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L632)，
#   用来等 CUDA graph 重放留在参数上的事件），CPU 上换成一个什么都不等的替身（[笔记 14](../14_data_parallel_ddp/) 也经过它）。
# - `TorchFullyShardedDataParallel` 建 `DeviceMesh` 时写死的设备类型 `"cuda"`
#   （[`torch_fully_sharded_data_parallel.py:81`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/torch_fully_sharded_data_parallel.py#L81)）换成 `"cpu"`；
#   分片和 all-gather / reduce-scatter 照常在 gloo 上发生。`snippets.dp.fsdp2.tiny_gpt` 的 config 写明 `transformer_impl="local"`（坑 2）。
# - `clip_grad > 0` 还会走到 [`clip_grads.py:174`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L174)
#   的同类检查和第一步那次"有没有 MTP 参数"的 all-reduce（[`optimizer.py:315`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L315)）；
#   本篇用 `clip_grad=0` 没有走到，它们的补丁在[笔记 20](../20_optimizer_topic/)用到。
# - 一个 Megatron 自己知道的警告：`DistributedOptimizer.zero_grad` 也清 shard 的 `.grad`，而 shard 是视图、不是叶子，
#   torch 每次都警告（Megatron 在那一行的注释里写着会警告）；`snippets/dp/grad_buffers.py` 在 rank 进程里把它关掉。
# - 尺寸见"本页怎么跑出来的"；2 个 rank 各约 0.5 GiB。
#
# </details>

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
# **2. bf16 权重 + fp32 梯度，DP=64 时每个 rank 每个参数几个字节？比不分片省多少？**
#
# <details><summary>答案</summary>
#
# 2 + 4 + 12/64 = 6.1875 字节，不分片 18 字节：省 65.6%。DP 再大也省不过 6 字节——bf16 权重和 fp32 梯度 buffer 没有分片。
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
# bf16 / fp16 参数时 shard 才是另建的 fp32 拷贝，Adam 更新拷贝，再写回参数 buffer。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([r["memory"]["main_weights"] for r in zero1])

# %% [markdown]
# **6. Qwen3-8B 放在 8 张卡上，FSDP（DP=8）和分布式优化器 + TP=8 每卡的模型状态一样多。各自每卡为 backward 保存多少激活？一步 8 个 micro-batch 时各发多少？**
#
# <details><summary>答案</summary>
#
# FSDP 不切激活：每卡 33.2 GB（一条 4096 token 的序列穿过整个模型），TP=8 + SP 每卡 4.2 GB。
# FSDP 每个 micro-batch 收发一遍权重、梯度，8 个 micro-batch 约 8 × 57 GB，走 DP 网络、可以和计算重叠；
# TP 每个 micro-batch 10.6 GB，8 个约 85 GB，但每一层都要等它，所以只放在机内。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
from snippets.dp.fsdp2 import model_state_rows

by_way = {r[0]: r for r in model_state_rows(PRESETS["qwen3-8b"].replace(seq=4096))}
for way in ("FSDP（optim_grads_params），DP=8", "分布式优化器 + TP=8、SP，DP=1"):
    print(way, "激活 GB:", by_way[way][5], "| 每卡发送:", by_way[way][6])

# %% [markdown]
# ## 30-second answer
#
# With `use_distributed_optimizer=True` the optimizer pads DDP's buffer (params start at multiples of 64, buckets end
# at multiples of lcm(DP, 128)) and each rank of the buffer's group (DP x CP; expert-DP for expert params) owns one
# slice, whatever the parameter boundaries. A step reduce-scatters gradients, all-reduces the squared norm, runs Adam
# on its slice and all-gathers the weights: one all-reduce's traffic, bit-identical results. Weights and grads stay
# whole; master weights and Adam's 8 bytes are sharded: fp32 goes from 16 to 4 + 4 + 8/d bytes per parameter, bf16
# weights with fp32 grads from 18 to 2 + 4 + 12/d (147 to 61 GB for 8B at DP=8). FSDP also shards the bf16 weights
# and grads, gathering each layer when used: choose it when model state, not activations, is the limit and the
# batch is large; choose TP (+SP, CP) for long sequences or small batches.
