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
# # 23 一个 tensor 的旅程：从复制到优化器分片
#
# TP=2 · PP=2 · DP=2、开 sequence parallel 和分布式优化器的一步训练里，第 2 层的 `linear_fc1.weight`、流过它的激活和它的梯度，
# 依次在哪些 rank 上、是稠密张量的哪一片、由哪次通信变成这样？这一步每个 rank 又占多少字节？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出一个列并行 weight 在 8 个 rank 里谁持有、各是稠密矩阵的哪几行，以及这一片为什么不靠通信得来。
# 2. 说出 SP 下这一层的激活在每个 TP rank 上是哪段序列、stage 之间传多大的张量、CP 会在哪里再切一次。
# 3. 说出 DP 梯度同步后每个 rank 手里哪段梯度是真的、谁为哪几行存 Adam 状态、更新后的 weight 怎样回到每个 rank。
# 4. 按 weight、梯度、Adam 状态、激活写出每个 rank 的字节，说明为什么第一个 stage 的激活最多。
#
# **结论**
#
# - ① `[32, 16]` 的 weight 只在 stage 1（rank 4–7）：每个 TP rank 造整块、留自己的 16 行，不通信。
# - ② 开 SP，层的输入是 `[4, 2, 16]`（半段序列）：fc1 前 all-gather 成 `[8, 2, 16]`，fc2 后 reduce-scatter 回。
# - ③ stage 0 → 1 的 p2p 只传 `[4, 2, 16]` = `[s/TP, b, h]`；CP=2 时 `get_tensor_shapes` 再减半成 `(2, 2, 16)`。
# - ④ grad sync 把 bucket `[1664]` reduce-scatter 成 `[832]`，分界切过 weight：rank 4 管行 [0, 12)，rank 6 管 [12, 16)。
# - ⑤ Adam 状态只有 `[192]` / `[64]`；step 里 all-gather `[832] → [1664]` 拼回 weight，范数跨全部 8 个 rank 求和。
# - 字节：stage 0 的 rank 是 weight 6656 + 梯度 6656 + Adam 5888 + 激活 13856（同时存 2 份）= 33056，与公式逐格相等。
#
# 先读：[笔记 10](../10_column_row_parallel_linear/)、[11](../11_transformer_layer/)、[13](../13_pipeline_schedules/)、[14](../14_data_parallel_ddp/)、[15](../15_distributed_optimizer/)（每一站的细节）；约 25 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
from IPython.display import display

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n23_journey import (activation_table, compare, final_lines, followed_weight, grad_calls_table,
                                              grad_table, holders, journey_table, loss_lines, memory_table, one_step,
                                              opt_calls_table, p2p_table, rank_table, shard_table, slice_table,
                                              sp_calls_table, stage_table)
from snippets.experiments.n23_journey import run as journey_run
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, microbatches, tiny_config
from snippets.moe.tables import Folded
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.train import journey, journey_memory, pictures

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

TINY = EXPERIMENTS["journey"].tiny
PAR = Parallel(world=8, tp=2, pp=2, sp=True)
WEIGHT = followed_weight(TINY, PAR.pp)  # "decoder.layers.1.mlp.linear_fc1.weight"：第 2 层的 fc1
ref = run_ranks(one_step, 1, TINY, weight_name=WEIGHT)[0]  # 参照：1 个进程，不切分，4 个 micro-batch
ranks = run_ranks(one_step, 8, TINY, PAR.tp, PAR.pp, PAR.sp, WEIGHT, grid=dict(tp=2, pp=2))
summaries = [compare(r, ref) for r in ranks]
pictures.draw_journey_summary(journey_table(summaries).rows,
                              memory_table(summaries, reference=(ref["memory"], ref["formula"])).rows,
                              rank=holders(summaries)[0])

# %% [markdown]
# 左边七列是 rank 4（tp 0、dp 0、stage 1）在每一站持有的那段，按 roadmap 的顺序；灰字是记录到的阶段。右边是 8 个 rank
# 这一步各占的字节。CP 那一站没有画：CPU 上建不起带 CP 的模型（遗留问题 1）。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 8 个本机 gloo 进程（`snippets.ranks.launch.run_ranks`，网格 TP=2、PP=2、DP=2，缺省 order），每个跑
#   `snippets/experiments/n23_journey.py` 的 `one_step`：建本 stage 的 `GPTModel`（local spec，SP），包进
#   `DistributedDataParallel(use_distributed_optimizer=True)` 和 `get_megatron_optimizer`，然后
#   `get_forward_backward_func()(...)`、`finalize_model_grads([ddp])`、`optimizer.step()` 各一次。正式入口把
#   `finalize_model_grads` 交给 schedule 在最后一个 backward 之后调；这里在 schedule 之后手动调，好把 ④ 的通信单独录下。
# - 初值：`snippets.train.journey.init_full_then_shard` 按参数的**全局**名字造整块张量，再交给 Megatron 的
#   `_initialize_affine_weight_cpu` 切出本 TP rank 那一片。一个 PP stage 只建自己的层，从随机数流里取到的与不切分的模型不同，
#   所以按名字重来，每个参数才等于不切分模型里的同名参数。
# - 只看不改的观察者：记录器（`snippets.record.recorder`）记下每个 collective，阶段由 `recorder.phase_of()` 按发出它的
#   Megatron 代码判定；`record_schedule` 记 schedule 的每一步和 p2p；`Taps` 留下第 2 层及其 `linear_fc1` / `linear_fc2` 的输入输出；
#   `journey_memory.SavedActivations` 数 autograd 为 backward 存下的张量；`collectives_by_submodule` 把通信归到发出它的子模块。
# - 参照：同一个 `one_step` 在 1 个进程、TP = PP = 1 上跑，吃下全部 4 个 micro-batch。`compare` 把每个 rank 的结果与它逐项比较，
#   只留下全局下标范围、shape、布尔值、通信记录和字节；表由 `snippets/train/journey_tables.py` 打印，内存公式在
#   `snippets/train/journey_memory.py`，两张图在 `snippets/train/pictures.py`（`draw_journey_summary`、`draw_journey_strip`）。
# - 尺寸（登记项 `journey` 的 `tiny`）：2 层、hidden 16、FFN 32、2 个 head、vocab 32、序列 8、micro-batch 2、每步 4 个 micro-batch。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 8 journey --tp 2 --pp 2 --sequence-parallel` 打印本页同一批表
#   （同一个作业里先跑参照：TP = PP = 1 时每个 rank 都是整个模型的一个 DP 副本、吃下整个 global batch）；
#   整页：`scripts/execute_notes.sh notes/23_tensor_journey.py`。
# - CPU 上的改动：文末「在 CPU 上怎么跑的」和 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(followed_weight, one_step, compare, journey_run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 哪一站 · 在本篇里的角色 |
# |---|---|
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | ① 每个 TP rank 造整块 master，按 `partition_dim` 留自己那块 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L530) | ② SP：只存分片，all-gather 成整段再乘 |
# | [`mappings.py::reduce_scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L536) | ② `linear_fc2` 的部分和 reduce-scatter 回序列分片 |
# | [`schedules.py::get_tensor_shapes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2088) | ③ p2p 的 shape：`s` 先除以 CP，开 SP 再除以 TP |
# | [`param_and_grad_buffer.py::shard_buffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L69) | ④⑤ 把 bucket 均分成 DP 段 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | ④ 先乘 1 / dp-cp 群大小，分布式优化器时 reduce-scatter |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_param_range_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L134) | ⑤ 一个参数落在本 DP 段里的那一截 |
# | [`distrib_optimizer.py::DistributedOptimizer.get_grad_stats_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L796) | ⑤ 梯度范数在哪个群里求和 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_param_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L377) | ⑤ 更新后的参数 all-gather 回完整 buffer |
#
# <details><summary>其余 15 个符号</summary>
#
# | 符号（固定到 tag 的行） | 哪一站 · 在本篇里的角色 |
# |---|---|
# | [`parallel_state.py::RankGenerator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L465) | 8 个 rank 的 tp / dp / pp 群 |
# | [`layers.py::ColumnParallelLinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L869) | ① `linear_fc1`：weight 按输出维（行）切 |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | ② SP 时输入是序列分片 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | ② backward 再 all-gather 一次输入，输入梯度 reduce-scatter |
# | [`layers.py::RowParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1430) | ② `linear_fc2`：SP 时调上面的 reduce-scatter |
# | [`schedules.py::forward_backward_pipelining_without_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2120) | ③ 1F1B |
# | [`p2p_communication.py::P2PCommunicator.recv_forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L424) | ③ stage 1 收激活 |
# | [`p2p_communication.py::P2PCommunicator.send_backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L507) | ③ stage 1 把输入梯度发回 |
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | ④ 连续的梯度 buffer，`main_grad` 是它的视图 |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | ④ DP 同步，再在 TP 群里加 SP 下 norm 的梯度 |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_range`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L200) | ⑤ 每个 bucket 的 DP 段，再调 `_build_model_gbuf_param_range_map` |
# | [`distrib_optimizer.py::DistributedOptimizer._get_model_param_range_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L786) | ⑤ 运行时查一个参数被本 rank 拥有的那截 |
# | [`distrib_optimizer.py::DistributedOptimizer._get_main_param_and_optimizer_states`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1090) | ⑤ 那截的主参数和 `exp_avg` / `exp_avg_sq` |
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | CP：按 `cu_seqlens`、`use_per_sequence_balancing`、hybrid CP 分派切法（遗留问题 1） |
# | [`dot_product_attention.py::DotProductAttention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L26) | local spec 的 attention：拒绝 CP；GQA 时拷贝 K、V（遗留问题） |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 建模型时 ① 发生一次；每一步是 schedule（②③ 每个 micro-batch 一次）→ `finalize_model_grads`（④）→ `optimizer.step()`（⑤）。
#
# <details><summary>完整调用链</summary>
#
# 只画与 `decoder.layers.1.mlp.linear_fc1.weight`（第 2 层，在 stage 1 上）有关的路径；右边是通信或切分。
#
# ```text
# 建模型（每个 rank）
# └─ GPTModel(config, get_gpt_layer_local_spec(), pre_process, post_process)      # stage 1 只建第 2 层
#    └─ ColumnParallelLinear(linear_fc1)  use_cpu_initialization
#       └─ layers.py::_initialize_affine_weight_cpu        # 造完整 [32, 16]，留本 TP rank 的 16 行；不通信
# DistributedDataParallel(...)                              # 没传布局时自己调 DistributedOptimizer.compute_full_param_layout（补齐）
# └─ _ParamAndGradBuffer                                    # weight 搬进 param buffer，main_grad = grad buffer 的视图
# get_megatron_optimizer(...) → ChainedOptimizer[DistributedOptimizer]
# └─ _build_model_gbuf_range → _build_model_gbuf_param_range_map   # bucket 按 DP 均分，本 rank 拥有其中一段
#
# 一步
# ├─ schedules.py::forward_backward_pipelining_without_interleaving          # 1F1B，每个 DP rank m=2
# │  ├─ P2PCommunicator.recv_forward                        # stage 1 ← stage 0：batch_isend_irecv，pp，[4, 2, 16]
# │  ├─ TransformerLayer.forward（第 2 层，输入是序列分片 [s/TP, b, h]）
# │  │  ├─ linear_fc1 = ColumnParallelLinear.forward
# │  │  │  └─ LinearWithGradAccumulationAndAsyncCommunication.forward         # all_gather tp：[4,2,16] → [8,2,16]
# │  │  └─ linear_fc2 = RowParallelLinear.forward
# │  │     └─ reduce_scatter_to_sequence_parallel_region                      # reduce_scatter tp：[8,2,16] → [4,2,16]
# │  ├─ backward_step
# │  │  └─ LinearWithGradAccumulationAndAsyncCommunication.backward           # all_gather tp（再拼一次输入）、reduce_scatter tp（输入梯度）
# │  │     → weight.grad → DDP 的 hook 累加进 main_grad                        # 本地，不通信
# │  ├─ P2PCommunicator.send_backward_recv_forward / send_backward           # stage 1 → stage 0：输入梯度 [4, 2, 16]
# │  └─ config.finalize_model_grads_func（正式入口设的，见下一行；本篇在 schedule 之后手动调）
# ├─ finalize_model_grads([ddp])
# │  ├─ finish_grad_sync → start_grad_sync                  # 乘 1/|dp-cp|；reduce_scatter_tensor dp-cp：[1664] → [832]
# │  └─ _allreduce_non_tensor_model_parallel_grads           # all_reduce tp：SP 下 norm 的部分梯度求和 [96]
# └─ optimizer.step()  (ChainedOptimizer.step)
#    ├─ get_grad_norm → get_grad_norm_fp32 → all_reduce      # grad_stats_parallel_group = 全部 8 个 rank：[1]
#    └─ step_with_ready_grads
#       ├─ Adam.step（只更新本 rank 拥有的那截：exp_avg [192] 或 [64]）
#       └─ start_param_sync → all_gather_into_tensor        # dp-cp：[832] → [1664]，weight 回到完整的 16 行
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# 已有记录的函数只链接：`_initialize_affine_weight_cpu`、`ColumnParallelLinear.forward`、
# `LinearWithGradAccumulationAndAsyncCommunication`、`RowParallelLinear.forward` 见[笔记 10](../10_column_row_parallel_linear/)；
# `P2PCommunicator._communicate` 和 1F1B 见[笔记 13](../13_pipeline_schedules/)；`finalize_model_grads` 见
# [笔记 06](../06_gradient_sync_and_optimizer/)；`_build_model_gbuf_range`、`ChainedOptimizer.step` 见
# [笔记 15](../15_distributed_optimizer/)；`RankGenerator` 见[笔记 08](../08_parallel_state_and_rank_generator/)。这里是本篇自己的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_tensor_shapes` | `seq_length`、`micro_batch_size`、config、TP / CP 群 | p2p 的 shape 列表 | 无 | 只读群大小 | **是**：算出被 CP、SP 切过的长度 | 否 | schedule 内 |
# | `shard_buffer` | 一个 bucket 的 buffer、DP 大小 | DP 个等长视图 | 无 | 否 | **是**：按展平位置均分 | 否 | `finalize_model_grads` / `step` 内 |
# | `DistributedOptimizer._build_model_gbuf_param_range_map` | 参数在 buffer 里的区间、本 rank 的 DP 段、bucket 起点 | 每个落进这段的参数的四种区间 | `Range` | 否 | **是**：参数被 DP 段切开 | 否 | 建优化器时 |
# | `DistributedOptimizer._get_model_param_range_map` | 一个模型参数 | 它在 buffer / 本段 / 参数自身里的区间 | `gbuf_ranges` | 否 | 否（只读分片表） | 否 | 无 |
# | `DistributedOptimizer._get_main_param_and_optimizer_states` | 一个模型参数 | `{"param", "exp_avg", "exp_avg_sq", …}`，都是本 rank 那截 | torch 优化器的 `state` | 否 | 否 | 否 | 无 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 8 个 rank、一个 weight
#
# 模型是 2 层的真实 `GPTModel`（local spec）。PP=2 时 stage 0 有 embedding 和第 1 层，stage 1 有第 2 层、final norm、输出层和 loss。
# 跟踪的是第 2 层的 `mlp.linear_fc1.weight`：一个 `ColumnParallelLinear`，稠密形状 `[ffn, h]` = `[32, 16]`。在 stage 1 上它的本地名字是
# `decoder.layers.0.mlp.linear_fc1.weight`——本地下标从 0 数，`layer_number` 才是全局的。每步 4 个 micro-batch（每个 2 条序列），
# 两个 DP rank 各拿 2 个。谁和谁在一个群里，由 Megatron 的 `RankGenerator` 按缺省 order `tp-cp-ep-dp-pp` 排出来
# （rank = tp + 2·dp + 4·pp，[笔记 08](../08_parallel_state_and_rank_generator/)）：

# %%
from megatron.core.parallel_state import RankGenerator

grid = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp")
groups = {name: grid.get_ranks(name) for name in ("tp", "dp", "pp")}
for name, members in groups.items():
    print(f"{name} 群: {members}")
print("与 8 个 rank 运行时所在的群相同:", all(s["who"]["groups"][name] in groups[name] for s in summaries for name in groups))

# %% [markdown]
# 第 2 层只在 PP stage 1，也就是 rank 4–7：rank 4 = (tp 0, dp 0)、5 = (tp 1, dp 0)、6 = (tp 0, dp 1)、7 = (tp 1, dp 1)。
# rank 0–3 从头到尾不碰这个 weight，只在 ③ 作为激活的来源和梯度的去处出场。整步与不切分的单进程一致：最后一个 stage 报出的
# 4 个 loss 与参照相同，更新后的四片 weight 拼起来与参照走一步 Adam 的结果相差不到 1e-6，两个 DP 副本逐位相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(loss_lines(summaries))
print(final_lines(summaries))
Folded("8 个 rank 的坐标、群和各自建的层（运行里读出）", rank_table(summaries))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 下面一站一节，顺序同页首的图：用 Megatron 自己的函数看它怎么切，再看运行里 rank 4–7 持有什么、是哪次通信造成的。
# 各站的完整机制在链接的笔记里，这里只看这一个 weight 走过它们时的样子。
#
# ### ① 复制 → TP 分片
#
# 深入：[笔记 10](../10_column_row_parallel_linear/)（列并行 / 行并行的 weight 布局）、[笔记 04](../04_model_provider_and_gpt_model/)（每个参数的切分维）。
#
# `linear_fc1` 按输出维（`partition_dim` 0，行）切。`use_cpu_initialization=True` 时，`_initialize_affine_weight_cpu` 在**每个** TP rank
# 上都造出完整的 master，按 `partition_dim` 切成块，留下第 tp_rank 块
# （[`layers.py:215-219`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L215-L219)）。
# 直接调用它，把 master 设成运行里 rank 4 造出的那块：

# %%
from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu

master = ranks[4]["dense"][WEIGHT]  # rank 4 造出的整块 [32, 16]
for tp_rank in (0, 1):
    mine = torch.empty(16, 16)
    _initialize_affine_weight_cpu(mine, 32, 16, 16, 0, lambda w: w.copy_(master), rank=tp_rank, world_size=2)
    first = 16 * tp_rank
    print(f"TP rank {tp_rank} 留下行 [{first}, {first + 16}):", torch.equal(mine, master[first:first + 16]),
          f"  = 运行里 rank {4 + tp_rank} 的初值:", torch.equal(mine, ranks[4 + tp_rank]["initial"]))

# %% [markdown]
# - "复制"是每个 rank 各算一遍，不是谁发给谁：这一站**没有通信**，代价是每个 TP rank 都造一次整块。GPU 上缺省
#   `use_cpu_initialization=False`，各 TP rank 只在自己的设备上生成自己那片，靠 RNG tracker 给每个 TP rank 的不同种子让各片不同
#   （[笔记 24](../24_rng_and_recomputation/)）。
# - TP 坐标相同、DP 坐标不同的 rank（4 和 6）持有**同一片**：这是 DP 的复制，④⑤ 靠它。四个持有者造出的 master 都与参照逐位相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Folded("每个 rank 造的 master、本地 shape 和全局范围（全部与参照一致）", slice_table(summaries))

# %% [markdown]
# ### ② 序列分片（SP）
#
# 深入：[笔记 11](../11_transformer_layer/)（SP 下一层的全部通信）、[笔记 09](../09_tp_mappings/)（f / g 的各种变体）。
#
# 开 SP 后层的输入输出都是 `[s/TP, b, h]`：TP rank 0 拿 token [0, 4)，rank 1 拿 [4, 8)。`linear_fc1` 先在 TP 群里 all-gather 成整段
# `[8, 2, 16]`，再乘本地那 16 行 weight，输出 `[s, b, ffn/TP]`——整段序列、一半的 FFN 列；`linear_fc2`（行并行）算出部分和，
# reduce-scatter 回序列分片。rank 4 上这两个子模块发出的通信（最后一个 micro-batch；phase 是记录到的阶段）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
sp_calls_table(summaries)

# %% [markdown]
# backward 比 forward 多一次 all-gather：forward 只存了输入的分片
# （[`layers.py:548`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L548)），
# 算 weight 梯度要整段，于是在 [`layers.py:617`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L617)
# 重新拼——多一次通信，省下这份输入的 (TP−1)/TP（机制解释的字节表里看得到）。四个持有者每个位置的激活都与参照同一个
# micro-batch 的同一段相等（折叠的表）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
same_for_the_others, per_position = activation_table(summaries)
Folded(f"每个位置的本地激活 = 参照的那一段（{same_for_the_others}）", per_position)

# %% [markdown]
# CP 会在 SP 之前再把序列切一次：每个 CP rank 拿 2·CP 块里的两块（[笔记 16](../16_context_parallel/)），层的输入变成
# `[s/(CP·TP), b, h]`。这一步没有跑 CP（遗留问题 1），下一站用 Megatron 自己的 shape 函数看它对 p2p 的影响。
#
# ### ③ stage 激活
#
# 深入：[笔记 13](../13_pipeline_schedules/)（1F1B 的 warm-up / steady / cool-down 和 p2p）。
#
# 第 2 层的输入来自 stage 0。PP 群是 [0, 4]、[1, 5]、[2, 6]、[3, 7]：**TP 坐标相同的 rank 之间直接传各自的序列分片**，
# 不先拼整段。接收方按 `get_tensor_shapes` 预先建好缓冲：`s` 先除以 CP，开 SP 再除以 TP
# （[`schedules.py:2111-2114`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2111-L2114)）。直接问它：

# %%
from megatron.core.pipeline_parallel.schedules import get_tensor_shapes


class Size:  # get_tensor_shapes 只问群的大小
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


for sp, cp in [(True, 1), (False, 1), (True, 2)]:
    cfg = tiny_config(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                      sequence_parallel=sp, context_parallel_size=cp)
    shapes = get_tensor_shapes(seq_length=SEQ, micro_batch_size=MBS, decoder_seq_length=None, config=cfg,
                               tp_group=Size(2), cp_group=Size(cp))
    print(f"TP=2, SP={sp}, CP={cp}: {shapes}")

# %% [markdown]
# PP 群 [0, 4] 两端这一步的全部 p2p（每个 DP rank 2 个 micro-batch，1F1B；"在这步之后"是 schedule 刚做完的 forward F / backward B）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
p2p_table(summaries)

# %% [markdown]
# - 传的是 `[4, 2, 16]` 而不是 `[8, 2, 16]`：SP 把 PP 的通信量也除以了 TP，CP 还会再除以 CP。
# - 激活向前（stage 0 → 1），它的梯度原路返回。rank 4 的 `send_backward_recv_forward` 一次调用里发回 micro-batch 0 的梯度、
#   收下 micro-batch 1 的激活。收到的张量就是第 2 层的输入（② 折叠表里"第 2 层的输入"一行，等于参照）。
#
# ### ④ DP 梯度同步
#
# 深入：[笔记 14](../14_data_parallel_ddp/)（buffer、bucket、`finalize_model_grads`）、[笔记 06](../06_gradient_sync_and_optimizer/)。
#
# backward 算出的 weight 梯度由 DDP 的 hook 加进 `main_grad`，它是 stage 1 连续梯度 buffer 的一个视图。开分布式优化器时，
# `start_grad_sync` 先把 bucket 乘 1 / dp-cp 群大小（系数由 DDP 定：
# [`distributed_data_parallel.py:210-212`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L210-L212)；
# 乘在 [`param_and_grad_buffer.py:661`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L661)），
# 然后不做 all-reduce，而是在 dp-cp 群里 reduce-scatter：每个 DP rank 只收下 `shard_buffer` 切给它的那一段
# （[`param_and_grad_buffer.py:706-712`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L706-L712)）。
# 用同一个函数切 stage 1 的 buffer，看这个 weight 落在哪：

# %%
from megatron.core.distributed.param_and_grad_buffer import shard_buffer

start, end = summaries[4]["buffer_range"]  # weight 在 stage 1 的 grad buffer 里的位置
positions = torch.arange(summaries[4]["buffer_numel"])  # 用下标代替梯度，看每段是哪些位置
for dp_rank, view in enumerate(shard_buffer(positions, 2)):
    a, b = view[0].item(), view[-1].item() + 1
    print(f"DP rank {dp_rank} 留下 buffer 的 [{a}, {b})，其中 weight [{start}, {end}) 的展平下标 "
          f"[{max(a, start) - start}, {min(b, end) - start})")

# %% [markdown]
# DP 的分界 832 正好**切过**这个 weight：展平后前 192 个元素归 DP rank 0，后 64 个归 DP rank 1。运行里同步前后的
# `main_grad`，和这一站在 rank 4 上的通信：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(grad_table(summaries))
grad_calls_table(summaries)

# %% [markdown]
# - 同步前 rank 4、6 的 `main_grad` 各只含本 DP rank 的 2 个 micro-batch，两者平均才是参照的梯度；同步后每个 rank 只有自己那段是
#   平均梯度，另一段是乘过 1/2、却没与对方相加的本地梯度，没人再读（自测 3）。
# - 第二次通信 `[96]` 在 TP 群，与这个 weight 无关：SP 下 norm 的梯度只含本 rank 那半序列的贡献，`finalize_model_grads`
#   把它们在 TP 群里加起来（stage 1 的 3 个 LayerNorm × (weight 16 + bias 16) = 96）。
#
# ### ⑤ 优化器分片，再拼回来
#
# 深入：[笔记 15](../15_distributed_optimizer/)（分片区间、每参数字节数）、[笔记 20](../20_optimizer_topic/)。
#
# 分布式优化器建表时按同样的 DP 段，把每个参数切出"本 rank 拥有的那一截"：`_build_model_gbuf_range` 算出每个 DP rank 的段，
# 再交给 `_build_model_gbuf_param_range_map`。把这个 weight 的 buffer 区间交给后者：

# %%
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

half = summaries[4]["buffer_numel"] // 2
for dp_rank in (0, 1):
    segment = Range(half * dp_rank, half * (dp_rank + 1))
    owned = DistributedOptimizer._build_model_gbuf_param_range_map({WEIGHT: (start, end, 0)}, segment, 0)[WEIGHT]
    print(f"DP rank {dp_rank}:", {k: (r.start, r.end) for k, r in owned.items()},
          f" param 区间 = 运行里 rank {4 + 2 * dp_rank} 的:",
          (owned["param"].start, owned["param"].end) == summaries[4 + 2 * dp_rank]["shard"]["param"])

# %% [markdown]
# 运行里每个持有者拥有的那截，换算成稠密 `[32, 16]` 的行，以及 Adam 状态的 shape（由 `_get_model_param_range_map` 和
# `_get_main_param_and_optimizer_states` 读出）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
shard_table(summaries)

# %% [markdown]
# - 稠密 `[32, 16]` 的 32 行被 4 个 rank **不重叠地**分完：[0, 12) rank 4、[12, 16) rank 6、[16, 28) rank 5、[28, 32) rank 7。
#   TP 先按行对半，DP 再在每一半里按 buffer 位置切——DP 的切法不看行，这里恰好落在行边界上（192 = 12 × 16）。
# - `exp_avg` / `exp_avg_sq` 只为那一截建，是一维的 `[192]` 或 `[64]`。fp32 模型的主参数就是 weight 那一截的视图，不另占内存；
#   bf16 模型才另建 fp32 拷贝。
#
# `optimizer.step()` 里的通信（rank 4）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
members, opt_calls = opt_calls_table(summaries)
print(members)
opt_calls

# %% [markdown]
# - 梯度范数的 all-reduce 在**全部 8 个 rank** 上：分布式优化器的 `grad_stats_parallel_group` 是整个优化器实例的群
#   （[`optimizer/__init__.py:678`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L678)），
#   因为每个 rank 只有"本 stage、本 TP 片、本 DP 段"的梯度；不分片的优化器只在模型并行群里加。
# - all-gather `[832] → [1664]` 把各 DP rank 更新过的那段拼回 param buffer，weight 在 rank 4 和 6 上又是完整的 16 行。
#
# ### 一张表看完整条旅程
#
# 每一站一行（rank 4；phase 是记录到的阶段）。页首的图按 roadmap 的顺序从中挑出七行；下面这条按数据真实经过的顺序画全部九行
# （③ 的接收发生在 ② 的 all-gather 之前）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
journey_table(summaries)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pictures.draw_journey_strip(journey_table(summaries).rows, rank=holders(summaries)[0])

# %% [markdown]
# ## 机制解释
#
# ### 这一步每个 rank 的字节
#
# 同一次运行里每个 rank 实测的字节，分五类：weight（DDP 的 param buffer）、梯度（grad buffer）、fp32 主参数（另建拷贝才算）、
# Adam 的 `exp_avg` + `exp_avg_sq`、激活（这一步里 autograd 为 backward 存下的张量的**峰值**，同一存储只算一次，不算参数和 batch）。
# 最后一列是与只凭 config 算出的公式比较：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
memory_table(summaries, reference=(ref["memory"], ref["formula"]))

# %% [markdown]
# - **weight、梯度**：4 字节 × 补齐后的 buffer 长度。stage 0（词表 embedding 256 + 位置 embedding 128 + 一层）和 stage 1
#   （一层 + final norm + 输出层 256）补齐后碰巧都是 1664 个位置。分布式优化器只分优化器状态，weight 和梯度 buffer 每个 rank 都是
#   完整的（本 stage、本 TP 片）。
# - **fp32 主参数**：0，是 ⑤ 的视图。bf16 训练时每段另有 fp32 主参数，梯度 buffer 缺省 fp32，合计每参数 6 + 12/DP 字节
#   （[笔记 15](../15_distributed_optimizer/)）。
# - **Adam**：8 字节 × 本 DP 段里真实参数的元素数（补齐的位置没有状态），所以 DP rank 0、1 不一样多（5888 与 5120）。
# - **激活**：每个 micro-batch 存下的字节 × 同时在途的份数。1F1B 下 stage r 先做 PP−r−1 个 warm-up forward，再做一个 forward
#   才开始第一个 backward，所以最多同时存 min(PP−r, m) 份：stage 0 两份，stage 1 一份。
#
# 每层、每个 micro-batch 存下什么（按存它的模块分；`s=8, b=2, h=16, ffn=32, TP=2`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
config = tiny_config(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=True)
per_layer = journey_memory.layer_activation_bytes(config, SEQ, MBS)
no_sp = journey_memory.layer_activation_bytes(tiny_config(num_layers=2, tensor_model_parallel_size=2), SEQ, MBS)
Table(["谁存的", "SP（本篇）B", "不开 SP B"], [[k, v, no_sp[k]] for k, v in per_layer.items()]
      + [["一层合计", sum(per_layer.values()), sum(no_sp.values())]])

# %% [markdown]
# - **norms**、**qkv、fc1 的输入**：两个 LayerNorm 各存输入和均值 / rstd，`linear_qkv`、`linear_fc1` 存 norm 的输出。开 SP 后这四样
#   都是 `[s/TP, b, ·]`，减半——这正是 ② 里 backward 再 all-gather 一次换来的。
# - **q, k, v**：MHA 时是同一个 `linear_qkv` 输出的视图，占住整个 `[s, b, 3h/TP]` 存储；GQA 时也不变小（遗留问题 2）。
# - **softmax**：`[b, heads/TP, s, s]`，随 s² 增长；dropout 为 0 时只有这一份。
# - **proj input**、**fc1 output、gelu output**：本来就按 head / FFN 列切，SP 不影响。
#
# stage 的首尾各多一点（每个 micro-batch），乘上在途份数就是实测的峰值：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
stage_table(summaries, TINY, PAR)

# %% [markdown]
# - stage 0 的 embedding：TP>1 时 `VocabParallelEmbedding` 屏蔽不属于本 rank 词表分片的 token，存下平移后的 id（int64）和 mask（bool）。
#   stage 1：final norm、输出层的输入（都是序列分片），以及 vocab-parallel cross entropy 的 softmax `[s, b, vocab/TP]`、target mask、
#   平移后的 target（[笔记 12](../12_vocab_parallel/)）。
# - 尽管 stage 1 多了输出层和 loss，**stage 0 的激活更多**：它同时存 2 份。1F1B 的激活峰值落在第一个 stage；PP=8 时第一个 stage 要存
#   8 份，interleaved schedule 还要更多（[笔记 13](../13_pipeline_schedules/)）。
# - Korthikanti 等人的 `sbh(34 + 5as/h)/t`（16 位、有 dropout、FFN = 4h、TP 加 SP）是同一种数法；本篇 fp32、没有 dropout、FFN = 2h，
#   所以系数不同。公式对得上实测，才说明"存了什么"数对了。

# %% [markdown]
# ## 与训练主链路的关系
#
# 一个 `train_step`（[笔记 01](../01_training_run_overview/)、[笔记 05](../05_forward_loss_backward/)）就是这一圈：`forward_backward_func`
# 里 ②③ 每个 micro-batch 发生一次，梯度在 `main_grad` 里累加；正式入口把 `finalize_model_grads` 设成 `config.finalize_model_grads_func`
# （[`training.py:3549-3550`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3549-L3550)），
# 1F1B 在最后一个 backward 之后调它
# （[`schedules.py:2448`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2448)），这是 ④；
# `optimizer.step()` 是 ⑤，之后 weight 回到 ① 之后的形态，下一步从头再来。① 只在建模型时发生一次；checkpoint 存的是 ① 的 TP 分片和
# ⑤ 的优化器分片，换并行配置加载时要重新拼切（[笔记 07](../07_checkpointing/)、[笔记 21](../21_checkpoint_topic/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **一个 weight 的三种"分"**：TP 按矩阵的一维切，切法由算子决定；DP 是整片复制；分布式优化器按 buffer 的展平位置切，不看矩阵形状。
#   所以一个元素的"主人"要三步才算得出：PP stage（哪一层）→ TP 坐标（哪几行）→ DP 坐标（buffer 的哪一段）。
# - **激活的两种"分"**：SP 按序列切（逐 token 的算子：norm、dropout、residual），TP 按 head / FFN 列切（矩阵乘）；all-gather 与
#   reduce-scatter 在两者之间转换。forward 里一次 all-gather 加一次 reduce-scatter 的通信量等于原来的一次 all-reduce；backward 为了
#   weight 梯度多拼一次输入，换来逐 token 部分的激活除以 TP（[笔记 11](../11_transformer_layer/)）。
# - **激活内存公式**：按"谁为 backward 存了什么"逐项数，峰值再乘 1F1B 的在途份数。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. Megatron Core 自己的 attention 不接 CP：带 CP 的模型只能用 Transformer Engine 建（运行确认）。** 切 batch 的
# `get_batch_on_this_cp_rank` 在 CPU 上能跑：照 `pretrain_gpt.py` 的调法传 `is_hybrid_cp=False` 和 CP 群
# （[`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)）；batch 里没有 `cu_seqlens`，
# 走按序列的 zigzag：CP rank 0 拿第 0、3 块，rank 1 拿第 1、2 块（[笔记 16](../16_context_parallel/)）。不给群时，切法读的是整个 world 的
# 大小和序号（[`utils.py:2483`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2483)），只在 world 恰好就是
# CP 群时才对。但 local spec 的 `DotProductAttention` 在构造时断言 `context_parallel_size == 1`
# （[`dot_product_attention.py:57`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57)），
# CP 的 attention 只有 TE 的 `TEDotProductAttention`，而 TE 要 CUDA：

# %%
def context_parallel_attempt():
    from megatron.core.utils import get_batch_on_this_cp_rank

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    batch = get_batch_on_this_cp_rank(dict(microbatches(1)[0]), is_hybrid_cp=False,
                                      cp_group=parallel_state.get_context_parallel_group())
    try:
        GPTModel(tiny_config(num_layers=2, context_parallel_size=2), get_gpt_layer_local_spec(),
                 vocab_size=VOCAB, max_sequence_length=SEQ)
        built = "built"
    except AssertionError as err:
        built = f"AssertionError: {err}"
    return batch["position_ids"][0].tolist(), list(batch["tokens"].shape), built


for cp_rank, (positions, shape, built) in enumerate(run_ranks(context_parallel_attempt, 2, grid=dict(cp=2))):
    print(f"CP rank {cp_rank}: positions {positions}, tokens {shape}; GPTModel: {built}")

# %% [markdown]
# 所以页首的图里没有 CP 那一站。若有，它在 SP 之前：CP=2、TP=2 时层输入是 `[s/(CP·TP), b, h]`，p2p 的 shape 如 ③ 所示再减半，
# DP 梯度同步换成 dp-cp 群（同一 CP 组的 rank 持有相同的 weight，[笔记 08](../08_parallel_state_and_rank_generator/)）。
#
# **2. GQA 在 local spec 的 attention 里不省激活（运行确认）。** 直觉上 GQA 的 K、V 只有 g 个 head，存下的激活应当更少。
# 但 `DotProductAttention.forward` 在算 score 之前把 K、V 用 `repeat_interleave` 扩成 a 个 head
# （[`dot_product_attention.py:170`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L170)），
# 旁边的注释说这会得到一个"视图"（[`dot_product_attention.py:165`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L165)），
# 而 `repeat_interleave` 其实是拷贝；q 从交错排列的 qkv 输出里 reshape 成 `[s, b·np, hn]` 时也得拷贝一份。
# 于是 autograd 存下的是 q 的拷贝和扩到 a 个 head 的 K、V——与 MHA 时同样的 `3·s·b·a·d/TP`。同样 4 个 query head，
# 一层存下的字节数（实测 / 公式），以及 `linear_qkv` 的输出本来有多大：

# %%
def layer_bytes(groups_to_try=(4, 1)):
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    rows = []
    for groups in groups_to_try:
        config = tiny_config(num_layers=1, num_attention_heads=4, num_query_groups=groups)
        model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
        batch = microbatches(1)[0]
        with journey_memory.SavedActivations(model, exclude=list(batch.values())) as acts:
            model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
        rows.append([groups, acts.saved_by_label["layers"],
                     sum(journey_memory.layer_activation_bytes(config, SEQ, MBS).values()),
                     4 * SEQ * MBS * (4 + 2 * groups) * config.kv_channels])
    return rows


Table(["query groups", "一层存下的 B（实测）", "公式", "linear_qkv 输出 B"], run_ranks(layer_bytes, 1)[0])

# %% [markdown]
# GQA 省下的是 `linear_qkv` 的输出和 weight（还有推理时的 KV cache），不是这里的激活。TE 的 attention kernel 不做这种扩展，
# 这个结论只适用于 local spec。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部 rank 是本机 gloo 进程。CP 需要 TE 的 attention（遗留问题 1），所以这一步的旅程里没有 CP。
# - ② 的通信表只有最后一个 micro-batch：`collectives_by_submodule` 每个子模块只留最后一次调用的区间。micro-batch 0 在这两个子模块上
#   发出的完全一样（forward 2 次、backward 3 次）；整步的全部记录在 `step_calls` 里，rank 4 上还有输出层的 all-gather 和
#   vocab-parallel cross entropy 的 all-reduce。
# - p2p 表没有 phase 列：schedule 在 autograd 之外发出的 p2p（包括发回梯度的 `send_backward`）记录器一律判成 forward，
#   "在这步之后"一列才说清它属于哪一步。
# - 激活峰值不是显存峰值：实测只数 autograd 存下的张量；GPU 上的峰值还有临时张量、通信缓冲（p2p 的接收缓冲、SP 的全局 all-gather
#   buffer，它跨层复用）、allocator 的碎片，以及 backward 时梯度与激活同时在的那一刻——那要 `torch.cuda.memory_stats`。
# - 内存公式（`journey_memory.memory_formula`）只为本篇跑的情形推过：fp32、LayerNorm、GELU、无 bias、无 dropout、不重算；
#   对 SwiGLU、RMSNorm、dropout、别的 dtype 它直接拒绝（`_check_supported`），而不是给一个没对过账的数。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 稠密 `[32, 16]` 的第 30 行：哪些 rank 持有它的 weight？谁为它存 Adam 状态？**
#
# <details><summary>答案</summary>
#
# 第 2 层在 stage 1（rank 4–7）；第 30 行在 TP rank 1 的那半 `[16, 32)` 里，持有者是 rank 5、7（DP 两个副本）。
# 分布式优化器把这半的后 64 个元素（行 `[28, 32)`）分给 DP rank 1，所以只有 rank 7 存它的 Adam 状态。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def owners_of_row(row):
    holders = [i for i, r in enumerate(ranks) if r["rows"] and any(a <= row < b for a, b in r["rows"])]
    adam = []
    for i in holders:
        first, end = journey.dense_rows(ranks[i]["shard"]["param"], ranks[i]["weight"].shape, ranks[i]["rows"][0][0])
        if first <= row < end:
            adam.append(i)
    return holders, adam


print("持有 weight:", owners_of_row(30)[0], " 存 Adam 状态:", owners_of_row(30)[1])

# %% [markdown]
# **2. 关掉 SP（其余不变），一层每个 micro-batch 的激活多存多少字节？stage 0 的激活峰值变成多少？**
#
# <details><summary>答案</summary>
#
# 一层从 6784 B 变成 8960 B，多 2176 B：norm 的输入和统计量、qkv / fc1 的输入不再按 TP 切（序列不再分片）。
# stage 0 同时存 2 份，峰值从 13856 B 变成 18208 B。代价换过来：不开 SP 时没有 backward 里那次重新拼输入的 all-gather。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for sp in (True, False):
    cfg = tiny_config(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=sp)
    print("SP" if sp else "no SP", "一层:", sum(journey_memory.layer_activation_bytes(cfg, SEQ, MBS).values()),
          " stage 0 峰值:", journey_memory.memory_formula(cfg, VOCAB, SEQ, MBS, 2, 2, 0, 0)["activations"])

# %% [markdown]
# **3. `finalize_model_grads` 之后、`optimizer.step()` 之前，rank 4 的 `main_grad` 第 12–15 行（本地）是平均梯度吗？**
#
# <details><summary>答案</summary>
#
# 不是。这 64 个元素归 DP rank 1（rank 6）；rank 4 上它们只是自己的本地梯度乘 1/DP，没有与 rank 6 的相加。
# 平均梯度在 rank 6 的同一位置。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
truth = ref["reduced_grad"][12:16]
print("rank 4:", torch.allclose(ranks[4]["reduced_grad"][12:16], truth, atol=1e-7),
      " rank 4 = 本地 / 2:", torch.allclose(ranks[4]["reduced_grad"][12:16], ranks[4]["local_grad"][12:16] / 2),
      " rank 6:", torch.allclose(ranks[6]["reduced_grad"][12:16], truth, atol=1e-7))

# %% [markdown]
# **4. 全局 batch 改成 8 个 micro-batch（每个 DP rank 4 个），各 stage 的激活峰值怎么变？weight、梯度、Adam 状态呢？**
#
# <details><summary>答案</summary>
#
# 都不变。1F1B 下在途份数是 `min(PP − stage, m)`：stage 0 仍是 2 份、stage 1 仍是 1 份，与 m 无关——这正是 1F1B 比
# "先做完全部 forward"（GPipe）省内存的地方。weight、梯度、Adam 状态与 batch 无关。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for m in (2, 4):
    per_stage = [journey_memory.memory_formula(config, VOCAB, SEQ, MBS, m, 2, stage, 0) for stage in (0, 1)]
    print(f"m={m}: 激活", [f["activations"] for f in per_stage],
          " weight / 梯度 / Adam", [(f["weights"], f["grads"], f["adam_state"]) for f in per_stage])

# %% [markdown]
# **5. 为什么梯度范数的 all-reduce 要在全部 8 个 rank 上做，而 weight 的 all-gather 只在 2 个 rank 的 DP 群里？**
#
# <details><summary>答案</summary>
#
# 范数要对**整个模型**的全部梯度求平方和：分布式优化器下每个 rank 只有"本 stage、本 TP 片、本 DP 段"的平均梯度，
# 三个方向的段合起来才是全部，所以在全 world（分布式优化器实例的群）里加。weight 的 all-gather 只是把同一 TP 片、
# 同一 stage 的 DP 段拼回来，参与者就是 DP 群。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({c.api: list(c.ranks) for c in ranks[4]["opt_calls"]})

# %% [markdown]
# ## 30-second answer
#
# Follow layer 2's `linear_fc1.weight` through one step on 8 ranks (TP2·PP2·DP2, sequence parallel, distributed optimizer).
# Every TP rank builds the full weight and keeps its 16 rows, with no communication; only the four stage-1 ranks hold it.
# Its input is a sequence shard `[s/TP, b, h]` that arrived by p2p; fc1 all-gathers it over TP in forward (and again in
# backward for the weight gradient), fc2 reduce-scatters back. In grad sync the DDP bucket is reduce-scattered over DP, so
# each rank keeps only the averaged slice it owns (the boundary cuts this weight at row 12); Adam keeps state for that slice,
# and the optimizer step all-gathers the updated weight back. Everything matches a one-process step, and each rank's bytes
# (weights, grads, Adam, activations, with the first stage holding two micro-batches) equal the formula.
