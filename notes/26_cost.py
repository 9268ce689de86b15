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
# # 26 成本：显存、通信、FLOPs 与怎么选并行配置
#
# 给定一个模型和一批 GPU：每张卡要多少显存，每步每个并行群发多少字节、走 NVLink 还是 InfiniBand，一步算多少 FLOPs，
# TP / PP / DP / EP 该怎么选？Megatron 自带的公式能回答，可它们和真实对象对得上吗？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出每个参数占几字节：18、6 + 12/DP、ZeRO 的 16 各对应哪组开关，实测是多少。
# 2. 说出一层激活占多少字节：论文 Table 2 的哪一行、Megatron 的哪个函数覆盖哪种设置，实测多出来的是什么。
# 3. 按群算出每步发出的字节数，用带宽说明 TP 为什么留在节点内；说出 FLOPs 和 MFU 怎么算。
# 4. 给一个模型和卡数，排除放不下的配置、比较名义步长，选出配置；流水线首尾 stage 怎样少放层。
#
# **结论**
#
# - 每参数字节实测：fp32 梯度 18.0，bf16 梯度 16.0（ZeRO 的 16）；分布式优化器 DP=2 时 12.14，公式 6 + 12/DP = 12。
# - 一层激活（TP=2，SP + 选择性重算）实测 18.5 sbh，论文 34/t = 17：论文计的张量都在，多的是 CPU 上 2 字节的 dropout mask 等。
# - TP 每层每 micro-batch 的实测字节与公式逐字节相等；Qwen3-8B TP=8 一层发 280.0 MiB，IB 上是计算时间的 9.01 倍。
# - FlopCounterMode 比 `num_floating_point_operations` 多 196608 FLOPs，正是因果 mask 省下的那一半注意力。
# - 上限 72 GiB（80 GiB 留 10%）、比名义步长：Qwen3-8B 8 卡选 TP1 PP2 DP4，70B 64 卡选 TP4 PP4 DP4；Qwen3-30B-A3B 没有激活公式，不选。
#
# 先读：[笔记 15](../15_distributed_optimizer/)（每参数字节）、[笔记 11](../11_transformer_layer/)（TP 通信）、[笔记 13](../13_pipeline_schedules/)（气泡）；约 20 分钟。

# %% tags=["hide-input"]
import dataclasses

from snippets.cost import formulas, measure
from snippets.cost.formulas import MODELS, Config, megatron_args
from snippets.cost.pictures import draw_choice
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments import n26_cost as cost
from snippets.models.presets import Dims
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table

import torch
from IPython.display import display
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from megatron.training.theoretical_memory_usage import (compute_activation_memory,
                                                        compute_activation_memory_without_sp,
                                                        compute_weight_and_optimizer_memory)
from megatron.training.training import num_floating_point_operations

import logging
root_after_import = logging.getLevelName(logging.getLogger().level), type(logging.getLogger().handlers[0]).__name__
logging.getLogger().setLevel(logging.WARNING)  # importing megatron.training set the root logger to INFO (see 遗留问题)

TINY, PAR = EXPERIMENTS["cost"].tiny, Parallel(world=4, tp=2)
PIPE = Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=64, vocab=640, layers=8, seq=8,
            micro_batch_size=2, microbatches=8)
results = run_ranks(cost.run, 4, TINY, PAR)                        # 4 个 rank：TP=2 × DP=2
counted = run_ranks(measure.flops, 1, TINY)[0]                      # 1 个 rank：FlopCounterMode
stages = run_ranks(measure.pipeline_split, 4, PIPE, 4)             # 4 个 rank：PP=4
CHOSEN = {name: cost.pick(cost.choices(name)) for name in cost.CHOICES}

qwen = cost.choices("qwen3-8b")
draw_choice(qwen, CHOSEN["qwen3-8b"], cost.GPU_MEMORY,
            title=f"Qwen3-8B，8 张 80 GiB 的卡（上限 {cost.GPU_MEMORY / 2**30:.0f} GiB）：{cost.label(CHOSEN['qwen3-8b'])} "
                  f"放得下且名义步长最短（{CHOSEN['qwen3-8b']['step']:.2f} 秒）")

# %% [markdown]
# 每行一个候选配置（序列 4096、全局 batch 128 条、SP 与选择性重算、分布式优化器）。条形是 Megatron 公式给出的每卡显存，
# 右边是每步的通信时间（按名义带宽）、气泡和名义步长。TP1 DP8 最快，但 78.6 GiB 超过 72 GiB 的上限。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实测部分在本机用 gloo 起进程（`snippets.ranks.launch.run_ranks`）：`snippets/experiments/n26_cost.py` 的 `run` 在
#   TP=2 × DP=2 的 4 个 rank 上跑四次 bf16 训练步（分布式优化器 × `grad_reduce_in_fp32`）和五次单层前向（SP × 重算），
#   测量函数在 `snippets/cost/measure.py`：每参数字节读真实对象（`snippets.optim.optimizer_memory.measured_bytes`），
#   激活字节用 `saved_tensors_hooks` 数 autograd 留下的存储（`snippets.tp.rng.SavedTensors`，参数不算），
#   通信字节来自记录器（`snippets.record.recorder`）记下的每次 collective 的整块张量乘环形算法的份额。
# - 尺寸（`dims` 的 `tiny`）：hidden 32、4 个 head、ffn 128（= 4h，论文的假设）、vocab 64、2 层、序列 16、micro-batch 2、
#   4 个 micro-batch；GELU、LayerNorm、带 bias、dropout 0.1。流水线那一节用 hidden 16、vocab 640（嵌入约等于三层）、8 层。
# - 真实尺寸的数都来自 `snippets/cost/formulas.py`：它调用 Megatron 的三个公式函数，自己只写气泡和各群通信量的小公式；
#   硬件数（989 TFLOPS、NVLink 每方向 450 GB/s、IB NDR 50 GB/s、显存 80 GiB）及出处在它的 `HARDWARE` 说明里，
#   上限 72 GiB 是它的 `MEMORY_BUDGET`（计算器页面用同一个数）。
#   “名义步长”= 峰值算力下的计算时间 ÷ (1 − 气泡) + 关键路径上的 TP / CP / EP / PP 通信时间（DP 的与反向重叠，不计）。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 cost --dims tiny --tp 2` 打印本页前半的表；
#   `scripts/execute_notes.sh notes/26_cost.py` 重新执行整页。[成本计算器](../../explorers/calculator/) 用同一份公式。
# - CPU 上要的改动：文末「在 CPU 上怎么跑的」和 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"]
display(listing(cost.run))
listing(measure.state_bytes, measure.layer_activations)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`theoretical_memory_usage.py::compute_weight_and_optimizer_memory`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/theoretical_memory_usage.py#L12) | 最重的一张卡上的参数数 × 18 或 6 + 12/DP |
# | [`theoretical_memory_usage.py::compute_activation_memory`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/theoretical_memory_usage.py#L308) | SP + 选择性重算：每层 sbh(18 + 4·ffn/h)/t |
# | [`theoretical_memory_usage.py::compute_activation_memory_without_sp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/theoretical_memory_usage.py#L382) | 不开 SP：每层 sbh(10 + 24/t) |
# | [`training.py::num_floating_point_operations`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L390) | 一个全局 batch 的模型 FLOPs |
# | [`training.py:2827`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2827) | 日志里的 TFLOP/s/GPU = FLOPs ÷ (步长 × 10¹² × GPU 数) |
# | [`transformer_config.py:96`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L96) | `num_layers_in_first_pipeline_stage`（下一行是 last） |
# | [`transformer_config.py:130`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L130) | `account_for_embedding_in_pipeline_split`（:134 是 loss） |
# | [`transformer_config.py:104`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L104) | `pipeline_model_parallel_layout` |
#
# <details><summary>其余符号（3 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`transformer_block.py::get_num_layers_to_build`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L70) | 本 stage 建几层 |
# | [`transformer_layer.py::get_transformer_layer_offset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L57) | 本 stage 的第一层是全局第几层 |
# | [`pipeline_parallel_layer_layout.py::PipelineParallelLayerLayout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/pipeline_parallel_layer_layout.py#L15) | 解析 `"Et\|ttt\|ttt\|tL"` 这样的 layout |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 这些公式不在训练的调用链上：`pretrain` 在第一步之后调 `report_theoretical_memory` 打印一次估计，`training_log`
# 每隔 `log_interval` 步用 `num_floating_point_operations` 算吞吐；流水线的切法在建模型时由 `TransformerBlock` 读。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::pretrain
# ├─ training.py::train → train_step ...                                    # 笔记 05、06
# │  └─ training.py::training_log
# │     ├─ theoretical_memory_usage.py::report_theoretical_memory            # 只在第一次日志
# │     │  ├─ compute_weight_and_optimizer_memory(args)                      # 18 或 6 + 12/DP
# │     │  └─ SP 且选择性重算 ? compute_activation_memory : compute_activation_memory_without_sp
# │     └─ num_floating_point_operations(args, batch_size) / (步长 × 1e12 × world_size)   # TFLOP/s/GPU
# └─ get_model → GPTModel → TransformerBlock
#    ├─ get_num_layers_to_build(config, vp_stage, pp_rank)                   # 均分 / 首尾 / layout
#    └─ get_transformer_layer_offset(config, vp_stage, pp_rank)              # 全局层号
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `get_transformer_layer_offset` 的记录在[笔记 13](../13_pipeline_schedules/)；下面是本篇的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | 切分? | 改训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `compute_weight_and_optimizer_memory` | `args`（尺寸、TP/PP/EP、DP、分布式优化器） | 字节数 | 无 | 否 | 只做算术 | 否（会改 `args.num_query_groups`） | 无；正式入口第一次日志 |
# | `compute_activation_memory` / `_without_sp` | `args`、micro-batch 数 | 第一个 stage 的激活字节 | 无 | 否 | 否 | 否 | 无；同上 |
# | `num_floating_point_operations` | `args`、全局 batch（条） | 一步的 FLOPs | 无 | 否 | 否 | 否 | 无；`training_log` |
# | `get_num_layers_to_build` | config、vp_stage、pp_rank | 本 stage 层数 | `PipelineParallelLayerLayout` | 读 PP rank | 按层切 | 否 | `GPTModel(...)` 建模型时 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### Megatron 的三个公式，在三个模型上
#
# 三个函数只读一个 `args`：尺寸、并行度、开关。下面直接调用它们（TP=8、SP、选择性重算、DP=8 的分布式优化器，
# 一条 4096 token 的 micro-batch），再把每 token 的 FLOPs 和 6N 放在一起：

# %%
args = megatron_args(MODELS["qwen3-8b"], Config(gpus_per_node=8, nodes=8, tp=8, sp=True, recompute="selective",
                                                seq=4096, micro_batch_size=1, num_microbatches=1,
                                                distributed_optimizer=True))
print("权重+优化器 GiB/GPU", round(compute_weight_and_optimizer_memory(args) / 2**30, 2),
      "| 激活 GiB/GPU", round(compute_activation_memory(args, num_microbatches=1) / 2**30, 3),
      "| 不开 SP 的函数", round(compute_activation_memory_without_sp(args, num_microbatches=1) / 2**30, 3),
      "| FLOPs/token", f"{num_floating_point_operations(args, 1) / 4096:.4g}")

# %% tags=["hide-input"]
cost.presets_rows()

# %% [markdown]
# 每 token 的 FLOPs 比 6N 多出的，是注意力的两次 s×s 矩阵乘：序列 4096 时它占 Qwen3-8B 的 7%。N 是矩阵乘用到的参数
# （含输出层，不含嵌入查表）。第二个激活函数给的数更大：它描述不开 SP 的情形，每层 10sbh 那部分每张卡各存一份，只有 24 那一项除以 t，
# 总数还乘了 1.05 的余量；两个函数本来就不是同一设置的公式。

# %% [markdown]
# ### 每参数字节：四组开关，实测与公式
#
# 同一个 bf16 `GPTModel`（`Float16Module` 包住），Megatron 的 DDP 和 `get_megatron_optimizer`，各跑一步，再读真实对象的字节：
# 权重、梯度缓冲区、fp32 主权重、Adam 的两个矩。TP=2、DP=2，rank 0：

# %% tags=["hide-input"]
state, params, acts, saved, comm = cost.tables(results, TINY, PAR)
state

# %% [markdown]
# 四行各对上一个公开的数。**ZeRO 的 16**（[arXiv 1910.02054](https://arxiv.org/abs/1910.02054) 第 3.1 节：2 + 2 + 12）
# 是 bf16 梯度、不分片；**Megatron 的 18** 把梯度换成 fp32 的 `main_grad`（`grad_reduce_in_fp32`，正式入口 `--bf16`
# 时的默认）：2 + 4 + 12；开分布式优化器后 fp32 主权重和两个矩（12 字节）按 DP 分片，得 **6 + 12/DP**，bf16 梯度时是
# ZeRO-1 的 4 + 12/DP。Megatron 的函数只覆盖 fp32 梯度两行，另两行它给不出正确的数，所以表里写“无”。
# 实测 12.14 而不是 12：分布式优化器把缓冲区补齐到能被 DP 整除的长度（笔记 15），补的那部分也占字节。
#
# 公式数出的参数比真实模型少：

# %% tags=["hide-input"]
params

# %% [markdown]
# 差正好是线性层的 bias 和学习式位置嵌入表，Megatron 的参数计数两样都不算（Qwen3 这类模型没有 bias、用 RoPE，所以不受影响）。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 一层留下多少激活
#
# 一个 `TransformerBlock`（1 层，local spec，bf16，dropout 0.1），TP=2，五种设置各跑一次前向，数 autograd 为反向留下的存储：

# %% tags=["hide-input"]
acts

# %% [markdown]
# [Korthikanti 等 2022（arXiv 2205.05198）](https://arxiv.org/abs/2205.05198) Table 2 按 2 字节激活、1 字节 mask 数每层字节：
# 不切时 sbh(34 + 5as/h)，其中 5as/h 是注意力的 QKᵀ、softmax 输出和它的 dropout mask，随序列长度平方增长。
# 选择性重算正是把这一项丢掉、反向时重算；SP 把剩下的 10sbh（LayerNorm 和 dropout 附近、原来在 TP 各卡重复存的部分）也除以 t。
# Megatron 的两个函数各对应一行：`compute_activation_memory` 是 SP + 选择性重算的 34/t（写成 18 + 4·ffn/h，让 MLP 宽度参与），
# `compute_activation_memory_without_sp` 是不开 SP 的 10 + 24/t（总数再乘 1.05），它不存 s×s 的分数，所以只在选择性重算（或融合注意力核）时成立。
# 表里 Megatron 一栏是把它们在 2 层和 1 层的模型上各调一次、相减得到的一层。
# 全重算和“只开 SP”两行，Megatron 没有公式。
#
# 实测都比论文大一点。看 SP + 选择性重算这一行到底留下了什么（每个存储一次，按前向保存的顺序）：

# %% tags=["hide-input"]
saved

# %% [markdown]
# 论文计的张量一个不少：两个 LayerNorm 的输入和输出、QKV（一块 3 个单位）、注意力输出、fc1 的输出和 GELU 的输出（各 4 个单位）。
# 多出来的是：dropout mask 在这里是 bf16（每个 1 个单位，论文按 1 字节算 0.5），CPU 上的 dropout 用与输入同 dtype 的噪声相乘；
# LayerNorm 的均值和 rstd（fp32，每 token 各一个）；以及因果 mask 本身。全重算只留层的输入（SP 时切成 s/t）加那个 mask。
#
# ### 每个群每步发多少字节
#
# 同一批运行里，记录器记下每次 collective，rank 0 发出的字节 = 整块张量 × 环形算法里它发的份额
# （all-reduce 2(n−1)/n，all-gather、reduce-scatter (n−1)/n）。公式一栏来自 `formulas.communication`：

# %% tags=["hide-input"]
comm

# %% [markdown]
# TP 三行逐字节相等，也等于直接按调用次数手算的数：不开 SP 是前向 2 次、反向 2 次 all-reduce；开 SP 是前向 2 次 all-gather + 2 次 reduce-scatter，
# 反向 4 次 all-gather + 2 次 reduce-scatter（多的 2 次 all-gather 为算权重梯度重新拼回输入，笔记 11）；全重算再把前向的 4 次做一遍。
# DP 两行的差正好是两块：Megatron 的参数数不含的 bias 和位置嵌入（上面那张参数表），以及分布式优化器把缓冲区补齐到
# 能按 DP 均分时多出的元素；不开分布式优化器时没有补齐，那一栏是 0。

# %% [markdown]
# ## 机制解释
#
# ### TP 为什么留在节点内
#
# 每层每个 micro-batch，TP 的通信量是 s·b·h 的常数倍，与 t 几乎无关；计算却随 t 减少。Qwen3-8B、TP=8、序列 4096：

# %% tags=["hide-input"]
cost.tp_node_rows()

# %% [markdown]
# 同样 280 MiB，在节点内的 NVLink（每 GPU 每方向 450 GB/s）上与这一层在峰值下的计算一样长，可以与计算重叠；
# 跨节点的 InfiniBand NDR（每端口 50 GB/s）上要 9 倍长，而且 TP 的 collective 就在前向和反向的关键路径上，等不起。
# DP 不同：每步一次、可以和反向重叠；PP 只发 stage 边界的一个激活。所以默认顺序 tp-cp-ep-dp-pp 让 TP 的 rank 相邻、在一个节点内，
# PP 跨节点。两个带宽数：NVIDIA H100 数据手册的 NVLink 900 GB/s 是双向总和；NDR 是 400 Gb/s。
#
# ### FLOPs：公式、6N 与 torch 数出来的
#
# 同一个小 `GPTModel` 做一次前向 + 反向，`torch.utils.flop_counter.FlopCounterMode` 数每个矩阵乘；Megatron 的公式与
# 6N + 注意力放在旁边：

# %% tags=["hide-input"]
cost.flops_rows(counted, TINY)

# %% [markdown]
# 三者只差注意力：local spec 的注意力把 s×s 的分数整块算出来再加 mask，torch 数到的是全部；Megatron 的公式按因果 mask
# 只算一半（代码里那个 `/ 2`），6N + 注意力也一样。这也是“模型 FLOPs”与“硬件 FLOPs”的区别：MFU 用前者，重算的那次前向也不算。
#
# MFU = 每步模型 FLOPs ÷ (步长 × GPU 数 × 峰值)。`training_log` 打印的 TFLOP/s/GPU 就是分子分母去掉峰值的那部分。
# Megatron-LM 的 [README 首页](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/README.md)（第 95、122 行）报告 H100 上最高 47%，
# GPT-3 175B 从 96 卡扩到 4608 卡时从 47% 降到 42%；更早的 [Narayanan 等 2021（arXiv 2104.04473）](https://arxiv.org/abs/2104.04473)
# 在 3072 张 A100 上训练 1T 参数模型，每卡达到峰值的 52%。本页不测时间，下表反过来算：若下面选中的配置跑到 47%，一步要多久：

# %% tags=["hide-input"]
cost.mfu_rows(CHOSEN)

# %% [markdown]
# ### 怎么选：先排除，再比
#
# 选配置的步骤：(1) Megatron 的规则先排除不整除的组合（层数 % PP、头数 % TP、专家数 % EP），以及它运行时才报错的组合：
# MoE 开 TP 却不开 SP（[`moe_layer.py:629`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L629)），
# 交错调度的 micro-batch 数少于 PP（[`schedules.py:1133`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L1133)）；
# (2) 显存放不下的排除：一张“80 GB”的 H100 SXM 的 HBM 是 80 GiB（nvidia-smi 报 81559 MiB），本页只许用 90%，即 72 GiB，
# 剩下的留给公式不计的 CUDA 上下文、NCCL 缓冲和分配器碎片；公式给不出显存的行记“未知”，不算放得下，也不参选；
# (3) 剩下的比名义步长：计算在峰值下的时间被气泡拉长，再加关键路径上的 TP / CP / EP / PP 通信，其中一项没有数，整行就没有步长。
# DP 的梯度同步与反向重叠，不计入。这是一个下界模型：真实 NCCL 带宽低于名义值，计算也到不了峰值，但排序通常不变。主图的 Qwen3-8B 逐项是：

# %% tags=["hide-input"]
cost.choice_table(qwen)

# %% [markdown]
# TP1 DP8 没有 TP 通信、也没有气泡，却要 78.6 GiB，超过上限；在放得下的里面，PP2 只在 stage 边界发激活，比 TP2 每层前向、反向共 10 次集合通信（开 SP）便宜。
# 70B 在 64 卡上：

# %% tags=["hide-input"]
cost.choice_table(cost.choices("dense-70b"))

# %% [markdown]
# TP8 的每一列都在 NVLink 上，但 70B 的 TP 通信在这个步长模型里有 6.7 秒，比 TP4 多一倍；TP4 PP4 让 PP 和 DP 跨节点，
# 换来更少的 TP 通信，气泡只有 0.023（每个 DP 组 128 个 micro-batch）。MoE 的 Qwen3-30B-A3B 在 16 卡上：

# %% tags=["hide-input"]
cost.choice_table(cost.choices("qwen3-30b-a3b"))

# %% [markdown]
# Megatron 的激活公式没有 MoE 项（专家的激活随路由变），五行的“放得下”都只能写“未知”：权重和优化器已占 34-50 GiB，
# 激活还要多少，公式答不出，所以本页不替它选。TP2、TP4 两行连名义步长也没有：MoE 层的 TP 通信走 token dispatcher，
# 这里没有数（“+ ?”）。能比的只有通信：EP16 把 128 个专家摊到两台机器，每层四次 all-to-all 都要走 IB；
# EP8 的 all-to-all 留在节点内，跨节点的只有与反向重叠的梯度同步（DP 和专家 DP），名义步长差四倍。要选，得先实测一步的显存峰值。
#
# ### 流水线：首尾 stage 少放层
#
# 嵌入在第一个 stage、输出层和 loss 在最后一个 stage；均分层数时这两个 stage 更重。Megatron 0.19.0 有三种办法，下面直接问它
# 每个 stage 建几层、从第几层开始（8 层、PP=4）：

# %%
for name, fields in [("均分", {}),
                     ("首尾各 1 层", dict(num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1)),
                     ("embedding、loss 各算一层", dict(account_for_embedding_in_pipeline_split=True,
                                                    account_for_loss_in_pipeline_split=True))]:
    try:
        config = TransformerConfig(num_layers=8, hidden_size=16, num_attention_heads=2, pipeline_model_parallel_size=4,
                                   pipeline_dtype=torch.float32, **fields)
        print(name, [(get_transformer_layer_offset(config, pp_rank=r), get_num_layers_to_build(config, pp_rank=r))
                     for r in range(4)])
    except ValueError as e:
        print(name, "→", e)

# %% [markdown]
# 第三种要求 (层数 + 2) 能被 PP 整除，8 + 2 = 10 不行（它的报错说 “middle layers”，其实数的是全部）。`pipeline_model_parallel_layout`
# 用一个字符串写出每个 stage 放什么，`"Et|ttt|ttt|tL"` 与“首尾各 1 层”相同，它要 PP 群已建好才能解析，所以和前两种一起放进 4 个
# rank 的真实运行里：每个 stage 建一段 `GPTModel`，数参数，前向一个 micro-batch 数留下的字节，再乘 1F1B 里同时在飞的 micro-batch 数
# （`get_pp_rank_microbatches` 的 warm-up + 1，8 个 micro-batch）：

# %% tags=["hide-input"]
cost.pipeline_rows(stages)

# %% [markdown]
# 均分时 stage 0 和 3 的参数是中间的 2.6 倍（嵌入和输出层各约三层），stage 0 还要同时存 4 个 micro-batch 的激活，峰值最高。
# 首尾各少一层后参数差距缩到约 1.4 倍，stage 0 的激活峰值减半；但中间 stage 1 多了一层、又有 3 个在飞，成了新的峰值。
# 所以减层看的是两件事：最慢的 stage 决定步长（参数多、算得多），显存峰值在前面的 stage（在飞的多）。
# 最后一列是同一个 stage 跑一步真实 1F1B 时记录到的 p2p：中间 stage 发 8 个激活、收 8 个后回发 8 个梯度，
# 共 2·m·s·b·h = 4096 个元素，正是通信公式里 PP 那一项（首尾 stage 只朝一边发，一半）；切法不改变它。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这些公式不改变训练：正式入口在第一次打印日志时报告一次理论显存，每次日志用 FLOPs 公式算 TFLOP/s/GPU。
# 流水线的切法在 `get_model` 建每个 stage 的 `GPTModel` 时生效，之后 schedule（笔记 13）只看每个 stage 有几层。

# %% [markdown]
# ## 与基础知识的连接
#
# 显存 = 模型状态（每参数字节 × 参数数 ÷ 分片数）+ 激活（每层字节 × 本 stage 层数 × 在飞的 micro-batch 数）。
# 训练 FLOPs ≈ 6 × 参数 × token（前向 2、反向 4）加注意力。通信时间 ≈ 发出字节 ÷ 链路带宽，再看能否与计算重叠。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# - `compute_weight_and_optimizer_memory` 固定按 fp32 梯度算（[`theoretical_memory_usage.py:296`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/theoretical_memory_usage.py#L296)，不读 `grad_reduce_in_fp32`）：不开 `grad_reduce_in_fp32` 时实测是 16 / 4 + 12/DP，它仍给 18 / 6 + 12/DP；
#   它的参数数也不含 bias 和学习式位置嵌入（上面的表）。
# - `account_for_embedding_in_pipeline_split` 的报错说 “number of middle layers: 10”，10 是全部层数加 2，不是中间的层数（上面的单元格）。
# - 为了调 `num_floating_point_operations` 而导入 `megatron.training.training`，会顺手把根 logger 设成 INFO、输出到 stdout
#   （[`training.py:36`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L36) 的
#   `logging.basicConfig`）：此后 DDP、优化器的 INFO 日志全部打印出来。本页导入之后根 logger 的级别和 handler：

# %% tags=["hide-input"]
root_after_import

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 所有运行用 gloo；bf16 的模型在 CPU 上跑，dropout 因此保存 bf16 的噪声张量而不是 GPU 上 1 字节的 mask，这是激活表多出的主要部分。
# - 尺寸为本机选得很小：序列 16 时注意力项 5as/h 只有 10，真实序列下它远大于 34，这也是选择性重算的意义。
# - 流水线一节各 stage 单独前向一个 micro-batch（非首 stage 的输入是随机张量），只为数留下的字节；调度本身见笔记 13。
#
# </details>

# %% [markdown]
# ## 自测

# %% [markdown]
# **1. DP=8、开分布式优化器、`grad_reduce_in_fp32`，每个参数几字节？把梯度换成 bf16 呢？**
#
# <details><summary>答案</summary>
#
# 6 + 12/8 = 7.5；bf16 梯度时 4 + 12/8 = 5.5。Megatron 的公式只给前一个（下面的单元格用本页的公开数函数算）。
#
# </details>

# %% tags=["answer"]
[cost.published_bytes_per_param(True, fp32, 8) for fp32 in (True, False)]

# %% [markdown]
# **2. Qwen3-8B、序列 4096、TP=8 开 SP：一层一个 micro-batch，每个 rank 的 TP 通信在 IB 上要多少毫秒？**
#
# <details><summary>答案</summary>
#
# 约 5.9 ms，是 NVLink 上的 9 倍、这一层峰值计算时间的 9 倍（下面的单元格）。
#
# </details>

# %% tags=["answer"]
cost.tp_node_rows()

# %% [markdown]
# **3. 本页的小模型，FlopCounterMode 数出的注意力 FLOPs 是 Megatron 公式里注意力的几倍？为什么？**
#
# <details><summary>答案</summary>
#
# 2 倍：local spec 算整块 s×s 分数，Megatron 的公式按因果 mask 只算一半。
#
# </details>

# %% tags=["answer"]
six = formulas.six_n_flops(cost.model_of(TINY), Config(gpus_per_node=1, seq=TINY.seq, micro_batch_size=TINY.micro_batch_size,
                                                        num_microbatches=1, vocab_multiple=1))
sum(n for op, n in counted["by_op"].items() if op in ("aten.bmm", "aten.baddbmm")) / six["attention"]

# %% [markdown]
# ## 30-second answer
#
# Megatron's formulas say a bf16 model with fp32 gradients holds 18 bytes per parameter, 6 + 12/DP with the
# distributed optimizer; measured on real objects it is 18.0 and 12.14, and 16 (ZeRO's count) with bf16 gradients.
# Per layer, activations are 34sbh/t with sequence parallel and selective recompute. TP moves a constant multiple of
# s·b·h per layer, so it stays on NVLink; over InfiniBand it would take nine times the layer's compute. To choose:
# drop configs that do not divide or fit, then compare compute stretched by the bubble plus exposed communication.
