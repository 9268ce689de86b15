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
# # 23 一个 tensor 的旅程
#
# 第二轮的收尾篇。roadmap 说第二轮"重点不是背 API，而是追踪 tensor layout"：
# replicated tensor → tensor-parallel shard → sequence/context shard → pipeline stage local activation →
# data-parallel gradient sync → optimizer state shard。前面的笔记各讲一段，本篇把它们串起来：在 8 个 gloo rank 上
# （TP=2 · PP=2 · DP=2，开 sequence parallel 和分布式优化器）跑**一次**真实的训练步，盯住**一个** weight——
# 第 2 层的 `mlp.linear_fc1.weight`——以及流过它的激活和它的梯度。每到一站都从运行里打印：哪些 rank 持有哪一片
# （稠密张量里的全局下标范围）、本地 shape、是哪个通信把它变成这样的。最后数一数这一步每个 rank 占了多少内存，
# 与公式对账。同一个函数在 1 个 rank 上跑就是"不切分"的参照，全程逐项比对。

# %% [markdown]
# ## 阅读目标
#
# 1. 对一个列并行 weight，说出 8 个 rank 里谁持有它、各持有稠密矩阵的哪几行，以及这一片是怎么来的（不通信）。
# 2. 开 SP 时，流进这一层的激活在每个 TP rank 上是序列的哪一段；哪次 all-gather 把它拼成整段、哪次 reduce-scatter 又把它切回去。
# 3. PP 的 stage 之间传的是什么 shape、为什么开 SP 后只有 `s/TP` 那么长。
# 4. 梯度在 DDP buffer 里的位置；reduce-scatter 之后每个 DP rank 手里哪一段是"真的"平均梯度。
# 5. 分布式优化器里谁拥有这个 weight 的哪几行的 Adam 状态；更新后的 weight 怎么回到每个 rank。
# 6. 这一步每个 rank 的内存：weight、梯度、优化器状态、激活各多少字节，公式怎么写，和实测是否一致。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 哪一站 · 在本篇里的角色 |
# |---|---|
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | ① 每个 TP rank 造完整的 master weight，留下自己那一片 |
# | [`layers.py::ColumnParallelLinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L869) | ① `linear_fc1`：weight 按输出维（行）切 |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | ② SP 时输入是序列分片 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L530) | ② 只存分片，all-gather 成整段再乘 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | ② backward 再 all-gather 一次输入，输入梯度 reduce-scatter |
# | [`layers.py::RowParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1430) | ② `linear_fc2`：部分和 reduce-scatter 回序列分片 |
# | [`mappings.py::reduce_scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L536) | ② SP 的 g |
# | [`schedules.py::forward_backward_pipelining_without_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2120) | ③ 1F1B |
# | [`schedules.py::get_tensor_shapes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2088) | ③ p2p 的 shape：`s` 先除以 CP，SP 时再除以 TP |
# | [`p2p_communication.py::P2PCommunicator.recv_forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L424) | ③ stage 1 收激活 |
# | [`p2p_communication.py::P2PCommunicator.send_backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L507) | ③ stage 1 把输入梯度发回 |
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | ④ 连续的梯度 buffer，`main_grad` 是它的视图 |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | ④ DP 同步 + SP norm 梯度的 TP all-reduce |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | ④ 分布式优化器时 reduce-scatter |
# | [`distrib_optimizer.py::DistributedOptimizer._build_model_gbuf_range`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L200) | ⑤ bucket 均分成 DP 段 |
# | [`distrib_optimizer.py::DistributedOptimizer._get_model_param_range_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L786) | ⑤ 一个参数被本 rank 拥有的那段 |
# | [`distrib_optimizer.py::DistributedOptimizer._get_main_param_and_optimizer_states`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1090) | ⑤ 那段的主参数和 `exp_avg` / `exp_avg_sq` |
# | [`distrib_optimizer.py::DistributedOptimizer.get_grad_stats_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L796) | ⑤ 梯度范数在哪个群里求和 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_param_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L377) | ⑤ 更新后的参数 all-gather |
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | CP：按 batch 里有没有 `cu_seqlens`、是否 hybrid CP 分派切法（遗留问题 1） |
# | [`utils.py::_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456) | CP：没有 `cu_seqlens` 时走这里，在给定的 CP 群里把序列切成 2·CP 块 |
# | [`dot_product_attention.py::DotProductAttention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L26) | CP：local spec 的 attention 拒绝 CP；GQA 时拷贝 K、V（遗留问题 2） |

# %% [markdown]
# ## 调用链
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
# get_megatron_optimizer(...) → DistributedOptimizer
# └─ _build_model_gbuf_range                                # bucket 按 DP 均分，本 rank 拥有其中一段
#
# 一步
# ├─ schedules.py::forward_backward_pipelining_without_interleaving          # 1F1B，m=2
# │  ├─ P2PCommunicator.recv_forward                        # stage 1 ← stage 0：batch_isend_irecv，pp，[4, 2, 16]
# │  ├─ TransformerLayer.forward（第 2 层，输入是序列分片 [s/TP, b, h]）
# │  │  ├─ linear_fc1 = ColumnParallelLinear.forward
# │  │  │  └─ LinearWithGradAccumulationAndAsyncCommunication.forward         # all_gather tp：[4,2,16] → [8,2,16]
# │  │  └─ linear_fc2 = RowParallelLinear.forward
# │  │     └─ reduce_scatter_to_sequence_parallel_region                      # reduce_scatter tp：[8,2,16] → [4,2,16]
# │  ├─ backward_step
# │  │  └─ LinearWithGradAccumulationAndAsyncCommunication.backward           # all_gather tp（再拼一次输入）、reduce_scatter tp（输入梯度）
# │  │     → weight.grad → DDP 的 hook 累加进 main_grad                        # 本地，不通信
# │  └─ P2PCommunicator.send_backward / send_backward_recv_forward          # stage 1 → stage 0：输入梯度 [4, 2, 16]
# ├─ finalize_model_grads([ddp])
# │  ├─ start_grad_sync → reduce_scatter_tensor              # dp：整个 bucket [1664] → 本 rank 一段 [832]
# │  └─ _allreduce_non_tensor_model_parallel_grads           # tp：SP 下 norm 的部分梯度求和 [96]
# └─ optimizer.step()
#    ├─ get_grad_norm_fp32 → all_reduce                      # 全部 8 个 rank：[1]
#    ├─ Adam.step（只更新本 rank 拥有的那段：exp_avg [192] 或 [64]）
#    └─ start_param_sync → all_gather_into_tensor            # dp：[832] → [1664]，weight 回到完整的 16 行
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `_initialize_affine_weight_cpu` | 本地 weight、全局 `output_size` / `input_size`、`partition_dim`、`init_method` | 无（原地写入；可返回 master weight） | `get_tensor_model_parallel_rank` / `_world_size` | 只读 TP 序号 | **是**：master weight 沿 `partition_dim` 切，取第 rank 块 | 是：初始化 weight | `model_provider` 建模型时 |
# | `LinearWithGradAccumulationAndAsyncCommunication.forward` | 输入（SP 时是序列分片）、本地 weight | `[s, b, out/TP]` | `get_global_memory_buffer`、`dist_all_gather_func` | **是**：TP（SP 时） | **是**：序列分片 → 整段 | 否（只存分片供 backward） | `forward_step` |
# | `LinearWithGradAccumulationAndAsyncCommunication.backward` | 输出梯度 | 输入梯度（SP 时是序列分片）、weight 梯度 | 同上 + `reduce_scatter_tensor` | **是**：TP | **是**：整段梯度 → 分片 | 是：weight 梯度 | `loss.backward()` |
# | `RowParallelLinear.forward` | `[s, b, in/TP]` | SP 时 `[s/TP, b, out]` | `reduce_scatter_to_sequence_parallel_region` | **是**：TP | **是**：部分和 → 序列分片 | 否 | `forward_step` |
# | `get_tensor_shapes` | `seq_length`、`micro_batch_size`、config、TP / CP 群 | p2p 的 shape 列表 | 无 | 只读群大小 | **是**：算出被 CP、SP 切过的长度 | 否 | schedule 内 |
# | `P2PCommunicator.recv_forward` / `send_backward` | shape / 要发的梯度 | 收到的激活 / 无 | `_communicate` | **是**：PP | 否（原样搬运） | 否 | schedule 内 |
# | `finalize_model_grads` | model chunks | 无 | `finish_grad_sync`、`_allreduce_non_tensor_model_parallel_grads`、embedding 归约 | **是**：DP、TP、embedding 群 | **是**：梯度按 DP 分段归约 | 是：`main_grad` | `finalize_model_grads(...)` |
# | `DistributedOptimizer._get_model_param_range_map` | 一个模型参数 | 它在 buffer / 本段 / 参数自身里的三种区间 | `gbuf_ranges` | 否 | 否（只读分片表） | 否 | 无 |
# | `DistributedOptimizer._get_main_param_and_optimizer_states` | 一个模型参数 | `{"param", "exp_avg", "exp_avg_sq", …}`，都是本 rank 那段 | torch 优化器的 `state` | 否 | 否 | 否 | 无 |
# | `ChainedOptimizer.step` → `step_with_ready_grads` | 无 | 成功与否、梯度范数 | Adam、`start_param_sync` | **是**：范数 all-reduce（全 world）、参数 all-gather（DP） | **是**：分段 → 完整 | 是：weight、Adam 状态 | `optim.step()` |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch

from snippets.train import journey, pictures
from snippets.record.listing import listing
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n23_journey import (activation_table, compare, final_lines, followed_weight, grad_calls_table,
                                          grad_table, holders, journey_table, loss_lines, memory_table, one_step,
                                          opt_calls_table, p2p_table, rank_table, shard_table, slice_table,
                                          sp_calls_table, stage_table)
from snippets.experiments.n23_journey import run as journey_run
from snippets.ranks.launch import run_ranks
from snippets.record.tables import Table
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, microbatches, tiny_config

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

# %% [markdown]
# ## 关键对象
#
# ### 一次真实的训练步
#
# 模型是 2 层、hidden 16、FFN 32、2 个 head、vocab 32、序列长 8 的真实 `GPTModel`（local spec）。PP=2 时每个 stage
# 正好一层：stage 0 有 embedding 和第 1 层，stage 1 有第 2 层、final norm、输出层和 loss。一个 global batch 是
# 4 个 micro-batch（每个 2 条序列），DP rank 各拿 2 个。`init_full_then_shard` 让每个参数等于"不切分的模型"里的
# 同名参数：每个 rank 按参数的**全局**名字造出完整张量，再交给 Megatron 的 `_initialize_affine_weight_cpu` 切出本 TP
# rank 那一片。（建模型时 Megatron 已经用自己的 `init_method` 这样做过一次；按全局名字重来，是因为一个 PP stage 只建
# 自己的层，从随机数流里取到的与不切分的模型不同，见 `snippets/models/tiny_gpt.py`。）
#
# 每个 rank 上跑的函数就是一个训练步，外面套着几个"观察者"：`recorder.record()` 记下每个 collective，
# `record_schedule()` 记下 schedule 的每次 forward / backward / p2p，`Taps` 留下跟踪的那一层的输入和 `linear_fc1` /
# `linear_fc2` 的输入输出，`SavedActivations` 数 autograd 为 backward 存下的张量，`collectives_by_submodule` 把通信归到发出它的子模块。
# 它们都只看不改。
#
# 这个函数在 `snippets/experiments/n23_journey.py` 里，模型尺寸和 micro-batch 数是参数 `dims`（本篇用它的 `tiny`），跟踪的是最后一个 stage 第一层的
# `linear_fc1.weight`（`followed_weight`；这里就是第 2 层）。同一个函数在 1 个 rank、TP = PP = 1 上跑就是参照。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(followed_weight, one_step)

# %%
TINY = EXPERIMENTS["journey"].tiny
PAR = Parallel(world=8, tp=2, pp=2, sp=True)
WEIGHT = followed_weight(TINY, PAR.pp)   # "decoder.layers.1.mlp.linear_fc1.weight"：第 2 层（layer_number 2）的 fc1
ref = run_ranks(one_step, 1, TINY, weight_name=WEIGHT)[0]     # 参照：1 个进程，不切分，4 个 micro-batch
ranks = run_ranks(one_step, 8, TINY, PAR.tp, PAR.pp, PAR.sp, WEIGHT, grid=dict(tp=2, pp=2))
summaries = [compare(r, ref) for r in ranks]

# %% [markdown]
# `compare` 把一个 rank 的结果与参照逐项比对，只留下表格要的东西（全局下标范围、shape、布尔值、通信记录、内存）；
# 下面每张表都由 `snippets/experiments/n23_journey.py` 里的函数从 `summaries` 打印。命令行的 `run` 在同一个作业里先跑参照：
# TP = PP = 1 时每个 rank 都是整个模型的一个 DP 副本、各自吃下整个 global batch，于是每个 rank 在 DP 归约之前的梯度、
# 激活和 loss 就是单进程的；然后跑 `par` 指定的切法，在各 rank 上调同一个 `compare`。比对是这样做的：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(compare)

# %% [markdown]
# 命令行的入口：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(journey_run)

# %% [markdown]
# 8 个 rank 各是谁（坐标按 `(tp, dp, pp)`；缺省 order `tp-cp-ep-dp-pp`，rank = tp + 2·dp + 4·pp，见
# [笔记 08](../08_parallel_state_and_rank_generator/)）：

# %%
rank_table(summaries)

# %% [markdown]
# "层"是本 stage 建的层的全局层号（`layer_number`）；stage 0 还有 embedding（`pre_process`），stage 1 还有输出层和 loss（`post_process`）。
# 第 2 层只在 PP stage 1（rank 4–7）上。在那里它的本地名字是 `decoder.layers.0.mlp.linear_fc1.weight`——
# 本地下标从 0 数起，`layer_number` 才是全局的（`snippets.models.tiny_gpt.global_name` 据此换算）。rank 0–3 从头到尾不会碰到
# 这个 weight；它们只在 ③ 里作为激活的来源和梯度的去处出场。
#
# 先确认整步是对的：最后一个 stage 报出的 4 个 micro-batch 的 loss 与参照一致。

# %%
print(loss_lines(summaries))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 下面五站，每站一张"谁持有哪一片"的表，外加产生它的通信记录（都从上面那一次运行里读出）。
# 持有者是 rank 4–7：rank 4 = (tp 0, dp 0)、5 = (tp 1, dp 0)、6 = (tp 0, dp 1)、7 = (tp 1, dp 1)。
#
# ### ① 复制的稠密 weight → TP 分片
#
# 深入：[笔记 10](../10_column_row_parallel_linear/)（列并行 / 行并行的 weight 布局）、[笔记 04](../04_model_provider_and_gpt_model/)（每个参数的切分维）。
#
# `linear_fc1` 是 `ColumnParallelLinear`：weight 是 `[out, in]` = `[ffn, h]` = `[32, 16]`，按输出维（`partition_dim` 0，行）切。
# `use_cpu_initialization=True` 时 `_initialize_affine_weight_cpu` 在**每个** TP rank 上造出完整的 master weight，
# 再沿 `partition_dim` 切成 TP 块、留下第 tp_rank 块——"复制"这一步是每个 rank 各自算一遍，不是谁发给谁：

# %%
slice_table(summaries)

# %% [markdown]
# - 4 个持有者造出的 master 与参照（1 个进程、不切分）的 weight 逐位相同；TP rank 0（rank 4、6）留行 `[0, 16)`，
#   TP rank 1（rank 5、7）留行 `[16, 32)`。
# - 同一 TP 坐标、不同 DP 坐标的 rank（4 和 6）持有**同一片**：这是 DP 的复制，后面 ④⑤ 靠它。
# - 产生这一片的通信：**无**。初始化不通信，代价是每个 rank 都要造一次完整的 weight（GPU 上用
#   `use_cpu_initialization=False` 时各 TP rank 直接在自己的设备上生成自己那片，靠 RNG tracker 保证各片不同）。
#
# ### ② 流进这一层的激活：序列分片（SP）
#
# 深入：[笔记 11](../11_transformer_layer/)（SP 下一层的全部通信）、[笔记 09](../09_tp_mappings/)（f / g 的各种变体）。
#
# 开 SP 后，TransformerLayer 的输入输出都是 `[s/TP, b, h]`：TP rank 0 拿 token `[0, 4)`，rank 1 拿 `[4, 8)`。
# `linear_fc1` 要看到整段序列，所以它先在 TP 群里 all-gather 成 `[s, b, h]`，再乘本地那 16 行 weight，
# 输出 `[s, b, ffn/TP]`——完整序列、一半的 FFN 列；`linear_fc2`（行并行）算出部分和，再 reduce-scatter 回序列分片。
# 下表对每个持有者的第一个 micro-batch，把本地张量和参照里同一个 micro-batch 的同一位置逐元素比较：

# %%
same_for_the_others, per_position = activation_table(summaries)
print(same_for_the_others)
per_position

# %% [markdown]
# rank 6、7 与 rank 4、5 一样，只是换成 micro-batch 2、3（它们是另一个 DP 副本）。`linear_fc1` 的输出不再按 token 分：
# 每个 TP rank 有全部 8 个 token、自己那 16 列 FFN。把这一层在 rank 4 上发出的通信按子模块列出来（最后一个 micro-batch，
# forward 和 backward）：

# %%
sp_calls_table(summaries)

# %% [markdown]
# - forward：`linear_fc1` 一次 all-gather `[4, 2, 16] → [8, 2, 16]`，`linear_fc2` 一次 reduce-scatter 回 `[4, 2, 16]`。
# - backward：`linear_fc2` 先把输出梯度 all-gather 成整段（g 的反向）；`linear_fc1` 再 all-gather 一次**输入**——
#   forward 只存了分片（`ctx.save_for_backward(input, weight)` 里的 `input` 是分片，
#   [`layers.py:548`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L548)），
#   算 weight 梯度时要整段，于是在 [`layers.py:617`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L617)
#   重新拼——多一次通信，省下这份输入的 `(TP−1)/TP`（后面的内存表里能看到）；输入梯度则 reduce-scatter 回序列分片。
# - 这些都在 `tp` 群里：SP 切的是 TP 群内部的序列维，不牵涉别的群。
#
# CP（context parallel）会在 SP 之前再把序列切一次（每个 CP rank 拿 2·CP 块里的两块），但本站的 CPU 栈上
# 带 CP 的模型建不起来——遗留问题 1 给出运行结果和行号；机制见 [笔记 16](../16_context_parallel/)。
#
# ### ③ pipeline stage 的本地激活
#
# 深入：[笔记 13](../13_pipeline_schedules/)（1F1B 的 warm-up / steady / cool-down 和 p2p）。
#
# 第 2 层的输入来自 stage 0：每个 stage-1 rank 从 PP 群里的另一个 rank 收。PP 群是 `[0, 4]`、`[1, 5]`、`[2, 6]`、`[3, 7]`，
# 所以 **TP 坐标相同的 rank 之间直接传各自的序列分片**：rank 0 的 token `[0, 4)` 给 rank 4，rank 1 的 `[4, 8)` 给 rank 5，
# 不需要先拼整段。PP 群 `[0, 4]` 两端在这一步里的全部 p2p：

# %%
p2p_table(summaries)

# %% [markdown]
# - 传的 shape 是 `[4, 2, 16]` = `[s/TP, b, h]`，不是 `[8, 2, 16]`：`get_tensor_shapes` 先把 `s` 除以 CP 大小，
#   开 SP 时再除以 TP 大小（[`schedules.py:2113`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2113)），
#   接收方按这个 shape 预先建好缓冲。SP 因此把 PP 的通信量也除以了 TP。
# - 激活向前走（stage 0 → 1，`isend→4` / `irecv←0`），它的梯度原路返回（stage 1 → 0）。1F1B 下 rank 4 的
#   `send_backward_recv_forward` 一次调用里同时发回 micro-batch 0 的梯度、收下 micro-batch 1 的激活。
# - 收到的激活**就是**第 2 层的输入：② 表里"第 2 层的输入"那行（token `[0, 4)`，等于参照）就是这里收到的张量。
#
# ### ④ DP 梯度同步
#
# 深入：[笔记 14](../14_data_parallel_ddp/)（buffer、bucket、`finalize_model_grads`）、[笔记 06](../06_gradient_sync_and_optimizer/)。
#
# backward 算出的 weight 梯度被 DDP 的 hook 累加进 `main_grad`，它是 stage 1 的连续梯度 buffer 的一个视图。
# 开分布式优化器时 `finalize_model_grads` 用 reduce-scatter 代替 all-reduce：整个 bucket 在 DP 群（`[4, 6]` 或 `[5, 7]`）里求和，
# 每个 DP rank 只收下自己那一半。这个 weight 在 buffer 里的位置、同步前后各 rank 的 `main_grad`：

# %%
grad_table(summaries)

# %% [markdown]
# 这一站的通信（rank 4，`finalize_model_grads` 里）：

# %%
grad_calls_table(summaries)

# %% [markdown]
# - 同步前，rank 4 和 rank 6 的 `main_grad` 各自只含本 DP rank 的 2 个 micro-batch；两者平均才是参照的梯度。
# - reduce-scatter `[1664] → [832]`：这个 weight 占 buffer 的 `[640, 896)`，DP 的分界 832 正好**切过**它，
#   所以它的前 192 个元素（展平后）归 DP rank 0，后 64 个归 DP rank 1。每个 rank 手里只有自己那段是平均梯度
#   （另一段是没与对方相加的本地梯度乘 1/DP，没人再读，见[笔记 15](../15_distributed_optimizer/)）。
# - 第二个通信 `[96]` 与这个 weight 无关，是 SP 的代价：norm 的梯度是"本 rank 那半序列"的部分和，
#   要在 TP 群里加起来（`[96]` = 3 个 LayerNorm × (weight 16 + bias 16)）。
#
# ### ⑤ 优化器状态分片，然后 all-gather 回来
#
# 深入：[笔记 15](../15_distributed_optimizer/)（分片区间、每参数字节数）。
#
# Adam 只为本 rank 拥有的那段建 `exp_avg` / `exp_avg_sq`。用 Megatron 自己的 `_get_model_param_range_map` 和
# `_get_main_param_and_optimizer_states` 读出每个持有者拥有这个 weight 的哪一段，换算成稠密 `[32, 16]` 里的行：

# %%
shard_table(summaries)

# %% [markdown]
# - 稠密 `[32, 16]` 的 32 行被 4 个 rank **不重叠地**分完：`[0, 12)` rank 4、`[12, 16)` rank 6、`[16, 28)` rank 5、`[28, 32)` rank 7。
#   TP 先按行对半切，DP 再在每一半里按 buffer 位置切——DP 的切法不看行，这里恰好落在行边界上（192 = 12 × 16）。
# - Adam 状态是一维的 `[192]` 或 `[64]`：分片是"展平后的一段"，不保留矩阵形状。fp32 模型的主参数就是 weight 那一段的视图，
#   不另占内存（16 位模型才会另建 fp32 拷贝）。
#
# `optimizer.step()` 里的通信（rank 4）：

# %%
members, opt_calls = opt_calls_table(summaries)
print(members)
opt_calls

# %% [markdown]
# - 梯度范数的 all-reduce 在**全部 8 个 rank** 上：分布式优化器下，每个 rank 的"那段"在 TP、PP、DP 三个方向上都不同，
#   所以平方和要在整个 world 里加（不分片的优化器只需在 `tp-pp` 群里加）。
# - all-gather `[832] → [1664]`：两个 DP rank 把各自更新过的那段拼回 param buffer，weight 又在 rank 4 和 6 上完整（16 行）了。
#
# 最后验证整条旅程是对的：每个持有者更新后的那 16 行与参照一步 Adam 之后的同样 16 行比较（TP rank 0、1 的两片拼起来就是整个
# `[32, 16]`）；DP 两个副本应当逐位相同（比的是 weight 字节的 SHA-256）。

# %%
print(final_lines(summaries))

# %% [markdown]
# ### 一张表看完整条旅程
#
# 把上面五站压成一行一站（全部从运行读出；"通信"一列是产生这一形态的那次 collective 在 rank 4 上的记录）：

# %%
journey_table(summaries)

# %% [markdown]
# 同一张表画成一条（高的方框是全长：weight 的 32 行，或序列的 8 个 token；填色是 rank 4 持有的那段）：

# %%
pictures.draw_journey_strip(journey_table(summaries).rows, rank=holders(summaries)[0])

# %% [markdown]
# 顺序是数据真实经过的顺序（③ 的接收发生在 ② 的 all-gather 之前）。roadmap 那条链上的六个形态都在：
# 复制（①的稠密）→ TP 分片 → 序列分片（③收到的就是）→ stage 本地激活 → DP 梯度同步 → 优化器状态分片。

# %% [markdown]
# ## 机制解释
#
# ### 这一步每个 rank 的内存
#
# 同一次运行里每个 rank 实测的字节数，分五类：weight（DDP 的 param buffer）、梯度（grad buffer）、fp32 主参数（拷贝才算）、
# Adam 的 `exp_avg` + `exp_avg_sq`、激活（这一步里 autograd 为 backward 存下的张量的**峰值**，同一存储只算一次，
# 不算参数和 batch 本身）。右边是 `journey.memory_formula` 只凭 config 算出的同五类：

# %%
memory_table(summaries, reference=(ref["memory"], ref["formula"]))

# %% [markdown]
# 每一格都与公式相等。公式的四部分：
#
# - **weight、梯度**：4 字节 × 补齐后的 buffer 长度。stage 0（词表 embedding 256 + 位置 embedding 128 + 一层）和 stage 1
#   （一层 + final norm + 输出层 256）补齐后碰巧都是 1664 个位置，所以两列在 8 个 rank 上一样。分布式优化器只分片优化器状态，
#   weight 和梯度 buffer 每个 rank 都是完整的（本 stage、本 TP 片）。
# - **fp32 主参数**：0。fp32 模型的分片是 weight 的视图（⑤ 表最后一列）。
# - **Adam 状态**：8 字节 × 本 DP rank 那段里真实参数的元素数（补齐的位置没有状态），所以 DP rank 0、1 不一样多。
# - **激活**：每个 micro-batch 存下的字节数 × 同时"在途"的 micro-batch 数。1F1B 下 stage r 先做 `PP−r−1` 个 warm-up
#   forward，再做一个 forward 才开始第一个 backward，所以最多同时存 `min(PP−r, m)` 份：stage 0 两份、stage 1 一份。
#
# 每层、每个 micro-batch 存下什么（`layer_activation_bytes`，按存它的模块分；括号里的形状以 `s=8, b=2, h=16, ffn=32, TP=2` 为例）：

# %%
config = tiny_config(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=True)
per_layer = journey.layer_activation_bytes(config, SEQ, MBS)
no_sp = journey.layer_activation_bytes(tiny_config(num_layers=2, tensor_model_parallel_size=2), SEQ, MBS)
Table(["谁存的", "SP（本篇）B", "不开 SP B"], [[k, v, no_sp[k]] for k, v in per_layer.items()]
      + [["一层合计", sum(per_layer.values()), sum(no_sp.values())]])

# %% [markdown]
# - **norms**、**qkv、fc1 的输入**：两个 LayerNorm 各存输入和均值 / rstd；`linear_qkv`、`linear_fc1` 存 norm 的输出。
#   开 SP 后这四样都是 `[s/TP, b, ·]`，减半；这正是 ② 里"backward 再 all-gather 一次输入"换来的。
# - **q, k, v**：本篇是 MHA，q、k、v 是同一个 `linear_qkv` 输出的视图，autograd 存的是视图，占住的是整个 `[s, b, 3h/TP]` 存储。
#   GQA 时这一项并不变小（遗留问题 2）。
# - **softmax**：`[b, heads/TP, s, s]`，随 `s²` 增长；dropout 为 0 时只有这一份（有 dropout 还要存 mask 和 dropout 的输出）。
# - **proj input**、**fc1 output、gelu output**：在 TP 区域里，本来就按 head / FFN 列切，SP 不影响。
#
# stage 的首尾各有一点额外的（每个 micro-batch）：

# %%
stage_table(summaries, TINY, PAR)

# %% [markdown]
# - stage 0 的 embedding：TP>1 时 `VocabParallelEmbedding` 把不属于本 rank 词表分片的 token 屏蔽掉，存下平移后的 id（int64）和屏蔽 mask（bool）。
# - stage 1：final norm、输出层的输入（都是 SP 分片），以及 vocab-parallel cross entropy 的 softmax `[s, b, vocab/TP]`、
#   target mask、平移后的 target。
# - 尽管 stage 1 多了输出层和 loss，**stage 0 的激活更多**：它同时存 2 个 micro-batch。1F1B 的激活峰值落在第一个 stage，
#   真实训练里 PP=8 时第一个 stage 要存 8 份，这也是 interleaved schedule 要额外考虑的内存（笔记 13）。
#
# 实测是怎么数的：`SavedActivations` 在 `saved_tensors_hooks` 里把每个存下的张量包一层，按存储计数；autograd 在 backward 用完后
# 丢掉包装，计数就减下来。不是 `torch.cuda.max_memory_allocated` 那种分配器统计：临时张量（比如 SP 的 all-gather 缓冲，它来自
# Megatron 的全局 buffer，跨层复用）不算在内。

# %% [markdown]
# ## 与训练主链路的关系
#
# 一个 `train_step`（[笔记 01](../01_training_run_overview/)、[笔记 05](../05_forward_loss_backward/)）就是本篇走过的这一圈：
# `forward_backward_func` 里 ②③ 交替发生（每个 micro-batch 一次），schedule 结束时梯度已在 `main_grad` 里累加好；
# `finalize_model_grads` 是 ④；`optimizer.step()` 是 ⑤，之后 weight 回到 ① 之后的形态（每个 rank 一片完整的 TP 分片），
# 下一步从头再来。① 只在建模型时发生一次；checkpoint 存的正是 ① 的 TP 分片和 ⑤ 的优化器分片，换并行配置加载时要把它们
# 重新拼切（[笔记 07](../07_checkpointing/)，笔记 21）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **一个 weight 的三种"分"**：TP 按矩阵的一维切（行或列），切法由算子决定；DP 是整片复制；分布式优化器按 buffer 的
#   展平位置切，不看矩阵形状。所以同一个元素的"主人"要三步才能算出来：PP stage（哪一层）→ TP 坐标（哪几行）→ DP 坐标（buffer 的哪一段）。
# - **激活的两种"分"**：SP 按序列切（逐 token 的算子：norm、dropout、residual），TP 按 head / FFN 列切（矩阵乘）。
#   all-gather 与 reduce-scatter 在两者之间转换；一次 ring all-reduce 正好等于这两半，所以 SP 不增加通信量，
#   却把逐 token 部分的激活除以 TP。
# - **激活内存公式**：Korthikanti 等人的 `sbh(34 + 5as/h)/t`（16 位、有 dropout、FFN = 4h）与本篇的逐项公式是同一种数法；
#   本篇是 fp32、没有 dropout、FFN = 2h，所以系数不同。公式只有在对得上实测时才可信，这也是本篇把它与运行对账的原因。

# %% [markdown]
# ## 遗留问题
#
# **1. CP 在这个栈上只能切 batch，模型建不起来（运行确认）。** 真实的 `get_batch_on_this_cp_rank` 在 CPU 上能跑。
# 它要求调用方说明是不是 hybrid CP（`is_hybrid_cp`，必填），并给出 CP 群——下面照 `pretrain_gpt.py` 的调法传
# `is_hybrid_cp=False` 和 `get_context_parallel_group()`（[`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)）；不给群时，切法读的是整个 world 的
# 大小和序号（[`utils.py:2483`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2483)），只在 world 恰好就是 CP 群时才对。batch 里没有 `cu_seqlens`，
# 于是走按序列的负载均衡：把序列切成 2·CP 块，CP rank 0 拿第 0、3 块，rank 1 拿第 1、2 块（[笔记 16](../16_context_parallel/)）。但 local spec 的
# `DotProductAttention` 在构造时断言 `context_parallel_size == 1`
# （[`dot_product_attention.py:57`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57)），
# CP 的 attention 只有 Transformer Engine 的 `TEDotProductAttention` 一条路，而 TE 需要 CUDA。所以本篇的旅程里没有 CP 那一站；
# 若有，它发生在 SP 之前：CP=2、TP=2 时每个 rank 的层输入是 `[s/(CP·TP), b, h]`，p2p 的 shape 也按 `get_tensor_shapes` 再除以 CP，
# DP 梯度同步换成 `dp-cp` 群（CP rank 持有相同的 weight，见[笔记 08](../08_parallel_state_and_rank_generator/)）。

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
        with journey.SavedActivations(model, exclude=list(batch.values())) as acts:
            model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
        rows.append([groups, acts.saved_by_label["layers"], sum(journey.layer_activation_bytes(config, SEQ, MBS).values()),
                     4 * SEQ * MBS * (4 + 2 * groups) * config.kv_channels])
    return rows


Table(["query groups", "一层存下的 B（实测）", "公式", "linear_qkv 输出 B"], run_ranks(layer_bytes, 1)[0])

# %% [markdown]
# GQA 省下的是 `linear_qkv` 的输出和 weight（还有推理时的 KV cache），不是这里的激活。TE 的 attention kernel 不做这种扩展，
# 本篇的结论只适用于 local spec。
#
# **3. `collectives_by_submodule` 只留最后一个 micro-batch 的区间。** ② 的通信表是 micro-batch 1 的；micro-batch 0 的一模一样
# （每个 micro-batch 在这一层发出同样的 2 + 4 次），但表里没有把两次都列出来。整步的全部记录在 `step_calls` 里：
# rank 4 上这一层之外还有输出层的 all-gather 和 cross entropy 的 3 次 all-reduce（每个 micro-batch）。
#
# **4. 激活峰值不是显存峰值。** 实测只数 autograd 存下的张量；GPU 上的峰值还包括临时张量、通信缓冲（p2p 的接收缓冲、
# SP 的全局 all-gather buffer）、allocator 的碎片，以及 backward 时梯度与激活同时在的那一刻。那需要 `torch.cuda.memory_stats`，
# CPU 上没有对应的东西。公式与实测一致，只说明"存了什么"数对了。
#
# **5. 主参数为 0 是 fp32 的特例。** 正式训练用 bf16 weight，分布式优化器会为每段另建 fp32 主参数（4 字节 / 元素，÷DP），
# 梯度 buffer 缺省 fp32（`--bf16` 时），每参数 6 + 12/DP 字节（笔记 15 的表）。`memory_formula` 只实现了本篇跑的 fp32 情形，
# 对别的 dtype 和 SwiGLU、RMSNorm、dropout 会直接拒绝（`_check_supported`），而不是给一个没对过账的数。

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
# **2. 关掉 SP（其余不变），stage 0 发给 stage 1 的每个激活是什么 shape？每层每个 micro-batch 的激活多存多少字节？**
#
# <details><summary>答案</summary>
#
# `[8, 2, 16]`：不开 SP 时 `get_tensor_shapes` 不除以 TP，每个 TP rank 都发整段（两个 TP rank 发的是同一份数据）。
# 一层的激活从 6784 B 增加到 8960 B：norm 的输入和统计量、qkv / fc1 的输入不再按 TP 切。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
from megatron.core.pipeline_parallel.schedules import get_tensor_shapes  # noqa: E402


class Group:  # get_tensor_shapes 只问群的大小
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


for sp in (True, False):
    cfg = tiny_config(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=sp)
    print("SP" if sp else "no SP", get_tensor_shapes(seq_length=SEQ, micro_batch_size=MBS, decoder_seq_length=None,
                                                      config=cfg, tp_group=Group(2), cp_group=Group(1)),
          sum(journey.layer_activation_bytes(cfg, SEQ, MBS).values()))

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
    per_stage = [journey.memory_formula(config, VOCAB, SEQ, MBS, m, 2, stage, 0) for stage in (0, 1)]
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
# Follow layer 2's `linear_fc1.weight` on 8 ranks (TP2·PP2·DP2, sequence parallel, distributed optimizer). Every TP rank builds the
# full weight and keeps its 16 rows; only the stage-1 ranks hold it. Its input arrives by p2p as a sequence shard `[s/TP, b, h]`,
# is all-gathered over TP for the matmul, and `linear_fc2` reduce-scatters back. Its gradient sits in DDP's buffer; a reduce-scatter
# over DP leaves each rank the averaged slice it owns, Adam updates only that slice, and an all-gather restores the weight. The
# result equals a one-process step, and measured memory per rank equals the formula.
