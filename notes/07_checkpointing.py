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
# # 07 Checkpointing：sharded_state_dict 与按并行度重切的保存 / 加载
#
# 第一轮第 6 篇。正式入口用 `megatron/training/checkpointing.py` 的 `save_checkpoint` / `load_checkpoint`
# 存取训练状态；它们把真正的活交给 Megatron Core 的 `dist_checkpointing.save` / `load`。本篇在 CPU gloo rank 上
# 跑真实的 `dist_checkpointing`：在 TP=2 存一个很小的 `GPTModel`，打开保存的目录看里面有什么，再分别装进 TP=1 和 TP=4
# 的模型，比较 logits。模型怎么建见[笔记 04](../04_model_provider_and_gpt_model/)，forward 见[笔记 05](../05_forward_loss_backward/)。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清 `save_checkpoint` 存了哪些东西、以什么格式（`torch_dist`）、目录长什么样。
# 2. 读懂 `sharded_state_dict` 的每一项：全局 key、全局形状、本地形状、全局偏移、`replica_id`，以及它们和 TP / PP / DP 坐标的对应。
# 3. 说清为什么 TP=2 存的 checkpoint 能直接装进 TP=1 或 TP=4 的模型，而不需要转换脚本。
# 4. 知道换并行度加载时哪些东西会变（模型权重的切片、优化器状态、RNG 状态）。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`checkpointing.py::save_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L552) | 正式入口的保存：拼 state dict，选格式，写 tracker 文件 |
# | [`checkpointing.py::generate_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1296) | 把 args、iteration、model、optimizer、scheduler、rng 放进一个 dict |
# | [`checkpointing.py:827`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L827) | `torch_dist` 格式时调用 `dist_checkpointing.save` |
# | [`checkpointing.py::get_checkpoint_name`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L195) | `iter_0000100` 这样的子目录名 |
# | [`checkpointing.py::get_checkpoint_tracker_filename`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L340) | `latest_checkpointed_iteration.txt` |
# | [`checkpointing.py::load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066) | 正式入口的加载：读 tracker，按当前模型生成 sharded state dict，加载后 `load_state_dict` |
# | [`checkpointing.py:1601`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1601) | 调用 `dist_checkpointing.load` |
# | [`serialization.py::save`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L349) | Core 的保存入口 |
# | [`serialization.py::load`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L69) | Core 的加载入口 |
# | [`mapping.py::ShardedTensor`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L52) | 本地 tensor + 它在全局 tensor 里的位置 |
# | [`mapping.py::ShardedObject`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L360) | 不是 tensor 的状态（`_extra_state`） |
# | [`gpt_model.py::GPTModel.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L873) | 模型级入口 |
# | [`transformer_block.py::TransformerBlock.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L711) | 把每层的 key 去掉层号，加一个"层"维偏移 |
# | [`layers.py::ColumnParallelLinear.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1217) | 权重沿第 0 维按 TP 切 |
# | [`layers.py::RowParallelLinear.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1496) | 权重沿第 1 维按 TP 切 |
# | [`utils.py::make_sharded_tensors_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L95) | 给出 `replica_id = (0, tp_rank, dp_cp_rank)` 这类编号 |
# | [`gpt_layer_specs.py:459`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L459) | local spec 的 `sharded_state_dict_keys_map`：norm 存成 TE 的名字 |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/checkpointing.py::save_checkpoint
# ├─ get_rng_state                                                 # 每个 rank 的 RNG 状态，存成 ShardedObject
# ├─ generate_state_dict(args, model, optimizer, scheduler, rng)
# │  ├─ model[i].sharded_state_dict()                              # 本篇运行的部分
# │  │  └─ GPTModel.sharded_state_dict
# │  │     ├─ VocabParallelEmbedding / ColumnParallelLinear.sharded_state_dict   # 沿第 0 维按 TP 切
# │  │     ├─ RowParallelLinear.sharded_state_dict                                # 沿第 1 维按 TP 切
# │  │     └─ TransformerBlock.sharded_state_dict                  # 前面加"层"维：(layer, ...)，为 PP 换切法
# │  └─ optimizer.sharded_state_dict(model_sd)                    # 优化器状态跟着参数的 ShardedTensor 走（笔记 15）
# ├─ dist_checkpointing.save(state_dict, iter_XXXXXXX/)            # 每个 rank 只写 replica_id 全为 0 的片
# │  ├─ 非 tensor 部分包成 ShardedObject "common_state"            # replica_id = 全局 rank，只有 rank 0 的那份写盘
# │  ├─ torch.distributed.checkpoint 写 __<rank>_0.distcp + .metadata   # 收集各 rank 的写计划（gloo 上的集合通信）
# │  └─ metadata.json                                              # rank 0 最后写格式说明
# └─ 写 latest_checkpointed_iteration.txt                          # rank 0
#
# megatron/training/checkpointing.py::load_checkpoint
# ├─ 读 tracker → iteration → iter_XXXXXXX/
# ├─ generate_state_dict(...)  用**当前**模型的 sharded_state_dict 作为"要什么"
# ├─ dist_checkpointing.load(sharded_state_dict, dir)
# │  ├─ load_common_state_dict                                   # 每个 rank 自己从 .distcp 读出 "common_state"
# │  └─ 按本地 ShardedTensor 的偏移读出对应区间
# └─ model.load_state_dict(state_dict['model'])、optimizer.load_state_dict(...)
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `save_checkpoint` | iteration、model、optimizer、scheduler | 磁盘上的 `iter_XXXXXXX/` 与 tracker 文件 | `sharded_state_dict`、`dist_checkpointing.save` | 是（tp、pp、dp-cp 群算 replica_id；保存时全体协调） | 按 ShardedTensor 写片 | 否（只读状态） | `save_distributed_checkpoint` |
# | `load_checkpoint` | 空的或随机的 model、optimizer | iteration；模型 / 优化器被原地填好 | `sharded_state_dict`、`dist_checkpointing.load` | 是 | 按当前并行度读片 | 是（覆盖权重与优化器状态） | `load_distributed_checkpoint` |
# | `GPTModel.sharded_state_dict` | prefix、metadata | `{本地 key: ShardedTensor / ShardedObject}` | 各层的 `sharded_state_dict` | 读 tp、dp-cp rank 作编号 | 描述切分，不搬数据 | 否 | 两个 checkpoint 函数里 |
# | `dist_checkpointing.save` | sharded state dict、目录 | 目录里的文件 | torch DCP、保存 strategy | 是（默认群） | 每片写一次 | 否 | 同上 |
# | `dist_checkpointing.load` | 当前模型的 sharded state dict、目录 | 普通 state dict（本地 tensor 已填好） | 同上 | 是 | 按本地偏移取区间 | 否（只返回 dict） | 同上 |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import shutil
import tempfile

from snippets.ckpt.pictures import chunk_writers, draw_reshard
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n07_checkpoint import (LOCAL_QKV, QKV, build_gpt, chunks_table, entries_line,
                                             entries_table, load_at, load_row, load_table, logits, run,
                                             save_at, stored_table, wants_rows, wants_table, written_table)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table

# %% [markdown]
# ## 关键对象
#
# 一个 2 层、hidden 16、4 个头、vocab 32 的 `GPTModel`（local spec）。`build_gpt` 按给定的 TP 建模型；
# `seed` 不同，权重就不同——加载前后的 logits 因此能说明权重确实是从 checkpoint 来的。`logits` 让每个 rank 算出自己那
# 1/TP 的 vocab 列，再用 `gather_from_tensor_model_parallel_region`（[笔记 09](../09_tp_mappings/)）在 TP 群里拼回完整的 vocab，
# 所以不同 TP 的结果可以直接比较。`save_at` 在 TP=`tp` 建模型（seed 1）并保存。`run` 把存和读放进同一个 job：
# 在 TP=`par.tp` 存，再用同一批 rank 在 TP=1 和 TP=world size 各读一次（与存时相同的跳过；多出来的 rank 是 DP 副本）。
#
# 这些函数在 `snippets/experiments/n07_checkpoint.py` 里。模型尺寸是参数 `dims`，本篇用它的 `tiny`。
# 本篇自己给一个目录，`run` 不删它（后面还要在 4 个 rank 上读），并让 rank 0 带回保存时的 logits：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_gpt, logits, save_at, run)

# %% [markdown]
# 在 2 个 rank 上：TP=2 存，TP=1 读（两个 rank 都建完整的 TP=1 模型，互为 DP 副本）：

# %%
TINY = EXPERIMENTS["checkpoint"].tiny
ckpt_dir = tempfile.mkdtemp(prefix="ckpt-tp2-")
results = run_ranks(run, 2, TINY, Parallel(world=2, tp=2), ckpt_dir=ckpt_dir, grid=dict(tp=2))
print(entries_line(results))

# %% [markdown]
# ### `sharded_state_dict` 的每一项（TP=2，两个 rank 并排）
#
# 每一行：本地 key（`model.state_dict()` 里的名字）、全局 key（写进文件的名字）、全局形状、本地形状、
# 两个 rank 的全局偏移和 `replica_id`。`_extra_state` 是 `ShardedObject`，这里只列一层的。

# %%
rank0, rank1 = ({row[0]: row for row in r["rows"]} for r in results)
entries_table(results)

# %% [markdown]
# 读这张表：
#
# - **TP 切分 = 偏移**。`linear_qkv.weight`（Column）本地 `(24, 16)`，rank 1 的偏移在第 1 维（去掉层维后的第 0 维）为 24；
#   `linear_proj.weight`（Row）在最后一维偏移 8。词嵌入与 `output_layer` 按 vocab 切，rank 1 偏移 16。
# - **层维 = PP 的伏笔**。所有层的参数共用一个全局 key（`decoder.layers.self_attention.linear_qkv.weight`），全局形状多了
#   最前面的一维 `2`（num_layers），层号变成这一维上的偏移。PP 换切法时，"哪一层"只是换一段偏移。
# - **replica_id = (0, tp_rank, dp_cp_rank)**。TP 切开的 tensor 在两个 rank 上都是 `(0, 0, 0)`——各自是自己那片的主副本；
#   没被 TP 切的 tensor（position embedding、norm）两个 rank 各有一份完整副本，rank 1 的编号是 `(0, 1, 0)`。
# - **norm 改了名**。local spec 的 `input_layernorm.weight` 存成 `self_attention.linear_qkv.layer_norm_weight`：
#   这是 Transformer Engine spec 里 norm 融进 QKV 线性层后的名字，见 [`gpt_layer_specs.py:459`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L459)。两种 spec 因此能互相加载。
#
# 一个 rank 只写 `replica_id` 全为 0 的那些片。每个 rank 写多少个 tensor：

# %%
written_table(results)

# %% [markdown]
# ### 保存的目录里有什么
#
# rank 0 在 `run` 里存完就读了目录（`inspect_checkpoint`），路径都相对于 checkpoint 目录。`__<rank>_<i>.distcp` 是
# `torch.distributed.checkpoint` 的数据文件：保存 strategy 默认每个 rank 一个写线程（[`torch.py:673`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/torch.py#L673)
# 的 `thread_count=1`），所以每个 rank 一个文件。`.metadata` 记录每个全局 tensor 由哪些块组成，`metadata.json` 说明格式。
# 非分片部分（state dict 里不是 `ShardedTensor` / `ShardedObject` 的东西）没有单独的文件：`save` 把它包成一个 key 为
# `common_state` 的 `ShardedObject`，`replica_id` 取全局 rank（[`serialization.py:439`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L439)），
# 于是只有 rank 0 那份写进它的 `.distcp`；加载时每个 rank 用 `load_common_state_dict` 单独读它
# （[`serialization.py:151`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L151)）。
#
# > **旧版（core_v0.18.0）：** 非分片部分由 rank 0 另存为 `common.pt`（[`serialization.py:399`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/dist_checkpointing/serialization.py#L399) 的 `save_common`），目录里多这一个文件；
# > core_v0.16.1 的 `thread_count` 默认是 2，每个 rank 写两个 `.distcp`。

# %%
saved = results[0]["saved"]
print(saved["files"])
print(saved["metadata"])

# %% [markdown]
# `.metadata` 里登记的全局 tensor：与并行度无关的名字和形状。

# %%
stored_table(saved)

# %% [markdown]
# 一个全局 tensor 由哪些块组成——`linear_qkv.weight` 的 (层, 行) 各切两半，共 4 块：

# %%
chunks_table(saved, "decoder.layers.self_attention.linear_qkv.weight")

# %% [markdown]
# ## Tensor / Process Group 语义
#
# | 对象 | 形状 / 内容 | 由谁决定 |
# |---|---|---|
# | 全局 tensor | 与并行度无关，如 qkv `(num_layers, 3·hidden, hidden)` = `(2, 48, 16)` | 模型结构 |
# | 本地片 | 当前 rank 的参数本身，如 `(24, 16)` | TP 坐标（切 dim）、PP 坐标（层维偏移） |
# | `replica_id` | TP 切开的 tensor 是 `(0, 0, dp_cp_rank)`，TP 群里人人一份的是 `(0, tp_rank, dp_cp_rank)`：非零表示"别人会写这片" | tp 群、dp-cp 群里的序号 |
# | `.distcp` 文件 | 只含主副本的字节（rank 0 的文件里还有 `common_state`） | 保存时的 rank |
#
# 本篇只用 TP；DP 副本的 `replica_id` 最后一位非零，所以 DP=8 时同一片只写一次。保存和加载时 `torch.distributed.checkpoint`
# 在默认群上协调写 / 读计划（gather / broadcast 计划，以及结束时的 barrier），不搬模型 tensor。

# %% [markdown]
# ## 机制解释
#
# ### 换并行度加载：TP=2 → TP=1、TP=4
#
# 加载方用**自己的**模型生成 sharded state dict——它说明"我这个 rank 需要全局 tensor 的哪一段"；`dist_checkpointing.load`
# 按这些偏移从文件里读出对应区间，不管保存时是怎么切的。新模型用另一个 seed 建，加载前 logits 不同，加载后应与 TP=2 相同。
# `load_at` 还记下这个 rank 要的第 0 层 `linear_qkv.weight` 那一块；`load_row` 把一次加载和保存时的 logits 比一遍：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(load_at, load_row)

# %% [markdown]
# TP=1 那一行 `run` 已经算好；TP=4 要 4 个 rank，用同一个 `load_at` 读同一个目录，读完删掉目录：

# %%
tp4 = run_ranks(load_at, 4, TINY, 4, ckpt_dir, grid=dict(tp=4))
shutil.rmtree(ckpt_dir)
load_table([results[0]["loads"][0]["row"], load_row(2, 4, results[0]["reference"], tp4[0])])

# %% [markdown]
# 每个加载的 rank 向文件要哪一块、这一块落在保存时的哪几块里（`source_chunks`：逐维比较区间是否相交）：

# %%
wants = (wants_rows("TP=2 → TP=1", [r["loads"][0]["wants"] for r in results], saved)
         + wants_rows("TP=2 → TP=4", [out["wants"] for out in tp4], saved))
wants_table(wants)

# %% [markdown]
# 同一张表画成图：第 0 层 `linear_qkv.weight` 的 48 行从上到下，左边是保存时的两块（颜色 = 写它的 rank），右边每根竖条是一个
# 加载 rank 要的行，按它读自哪一块上色：

# %%
draw_reshard(chunk_writers([r["rows"] for r in results], LOCAL_QKV, saved["chunks"][QKV]), wants,
             title="TP=2 存，TP=1 / TP=4 读：第 0 层 linear_qkv.weight 的每一行读自哪一块")

# %% [markdown]
# TP=1 的 rank 要完整的 48 行，DCP 从 TP=2 写的两块里各读一半拼起来；两个 TP=1 rank 是 DP 副本，要的是同一块。
# TP=4 的 rank r 要第 12r 到 12r+12 行，每一块都落在 TP=2 的某一块之内，只读那一块的一部分。文件一个字节也没改。
#
# 三种切法下 logits 一致（差异在 1e-7 量级，来自不同的矩阵乘分块与 vocab 并行的求和顺序，不是 bitwise 相同）。
#
# ### 正式入口多做了什么
#
# - **外层 dict。** `generate_state_dict` 在模型之外放进 `args`、`iteration`、`checkpoint_version`、`optimizer`、
#   `opt_param_scheduler`、`rng_state` 等；非 tensor 的部分进上面说的 `common_state`。
# - **目录与 tracker。** 写在 `<save>/iter_0000100/`，rank 0 再写 `latest_checkpointed_iteration.txt`；`load_checkpoint` 先读它决定加载哪一步。
# - **格式。** `--ckpt-format torch_dist` 走 `dist_checkpointing.save`（[`checkpointing.py:765`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L765) 起的分支）；老的 `torch` 格式是每个 (TP, PP) rank 一个
#   `mp_rank_XX/model_optim_rng.pt`，不能换并行度加载。
# - **优化器状态。** 分布式优化器的 Adam 状态按 DP 切成连续的扁平区间（笔记 15）。`optimizer.sharded_state_dict(model_sd,
#   sharding_type=...)` 按所选格式描述它：`dp_reshardable` 按 DP 段存，`fully_reshardable` 先在 DP 群里 all-gather 再按参数存，
#   所以能否换并行度取决于格式（正式入口由 `--dist-ckpt-optim-fully-reshardable` 选）。下面真的跑一次。
# - **RNG 状态。** 每个 (TP, PP) rank 一份，存成 ShardedObject；并行度改变后无法一一对应：`load_checkpoint` 只在 checkpoint 的
#   (TP, PP) 与当前相同时才加载它，否则忽略（[`checkpointing.py:2172`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2172)；`--no-load-rng` 也可关掉）。

# %% [markdown]
# ### 换并行度加载优化器状态：DP=2 存 → DP=1 读
#
# `optim_reshard.reshard_optimizer_state` 在 DP=2 上用分布式优化器训练两步 Adam，按两种格式各存一份（模型 + 优化器），
# 再在 DP=1 上新建模型和优化器加载，逐位比较加载后的权重、fp32 main params、`exp_avg`、`exp_avg_sq` 与保存时
# （DP=2 各段拼起来）是否相同，并读出 Adam 的 `step`。细节与另外两种格式、TP 改变时的报错见笔记 21
# （[21 checkpoint 专题](../21_checkpoint_topic/)）。

# %%
from snippets.ckpt import optim_reshard

resharded = optim_reshard.reshard_optimizer_state(dict(dp=2), dict(dp=1), ("dp_reshardable", "fully_reshardable"))
Table(optim_reshard.COMPARED, optim_reshard.rows(resharded, optim_reshard.COMPARED),
      title="DP=2 存 → DP=1 读：加载后与保存时逐位相同？")

# %% [markdown]
# 两种格式都把张量原样搬到了新的 DP 布局，但 `dp_reshardable` 读回的 Adam `step` 是 1 而不是 2：这个格式不带回 step，
# 加载方保留的是自己新建优化器时的值，续训时 Adam 的偏差修正因此错位（笔记 21 遗留问题里有对应的行）。
# `fully_reshardable` 的 step 随 `param_groups` 一起恢复。

# %% [markdown]
# ## 与训练主链路的关系
#
# simple loop 最后两步 `save_distributed_checkpoint` / `load_distributed_checkpoint` 就是本篇的 `save_at` / `load_at`：
# `model.sharded_state_dict()` + `dist_checkpointing.save`；加载时先用当前模型生成 sharded state dict，再 `load` 和
# `load_state_dict`。正式入口每 `--save-interval` 步调一次 `save_checkpoint`，启动时调一次 `load_checkpoint`。

# %% [markdown]
# ## 与基础知识的连接
#
# - **`torch.distributed.checkpoint`（DCP）**：`torch_dist` 格式就是 DCP 的文件布局（`.metadata` + `.distcp`）。
#   Megatron 的贡献是 `ShardedTensor` 这层描述：它知道每个参数怎样按 TP / PP 切，所以能把本地参数翻译成 DCP 的"全局 tensor 的一块"。
# - **state_dict**：`load_state_dict` 收到的是普通的本地 tensor，与单卡 PyTorch 无异；全部"重切"都发生在 `load` 读区间的时候。

# %% [markdown]
# ## 遗留问题
#
# 1. **local spec 存的是 TE 的名字（运行确认）。** 上面的 `.metadata` 里没有 `input_layernorm`，只有
#    `linear_qkv.layer_norm_weight`——来自 [`gpt_layer_specs.py:459`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L459) 的 `sharded_state_dict_keys_map`。好处是 local 与 TE spec 互通；
#    代价是直接读 `.metadata` 的外部工具看到的名字和 `model.state_dict()` 不同。
# 2. **保存需要 psutil（CPU 上运行确认）。** 写线程开始写之前先用 psutil 量一次进程内存
#    （[`filesystem_async.py:387`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L387)），没有 psutil 时
#    [`filesystem_async.py:665`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L665) 抛 `RuntimeError`，每个 rank 的 `save()` 报
#    `Worker failure: ... psutil is not installed`——直接报错，不会卡住，见 [CPU 页](../../cpu/)。
# 3. **`dp_reshardable` 换 DP 后 Adam 的 step 回到加载方的值（运行确认，见上表）。** 张量都对，step 不对；
#    `fully_reshardable` 没有这个问题。更多格式和 TP 改变时的报错见笔记 21。

# %% [markdown]
# ## 自测
#
# **1. TP=2 时 rank 1 的 `output_layer.weight` 本地形状和全局偏移是多少？**
#
# <details><summary>答案</summary>
#
# vocab 32 按 TP 切两半：本地 `(16, 16)`，偏移 `(16, 0)`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(rank1["output_layer.weight"][4], rank1["output_layer.weight"][5])

# %% [markdown]
# **2. 为什么 rank 1 的 `embedding.position_embeddings.weight` 的 `replica_id` 是 `(0, 1, 0)`？**
#
# <details><summary>答案</summary>
#
# position embedding 不按 TP 切，两个 TP rank 各有完整一份；中间一位是 TP rank，非零表示"这是副本，由 TP rank 0 写"。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(rank0["embedding.position_embeddings.weight"][6], rank1["embedding.position_embeddings.weight"][6])

# %% [markdown]
# **3. 2 层模型里 `decoder.layers.1.self_attention.linear_qkv.weight` 在文件里的全局 key 和层维偏移是什么？**
#
# <details><summary>答案</summary>
#
# 全局 key 去掉了层号：`decoder.layers.self_attention.linear_qkv.weight`；层号 1 变成第 0 维的偏移 1。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
row = rank0["decoder.layers.1.self_attention.linear_qkv.weight"]
print(row[1], row[5][0])

# %% [markdown]
# **4. 目录里有几个 `.distcp` 文件？加载到 TP=4 时会改变它们吗？**
#
# <details><summary>答案</summary>
#
# 2 个（2 个 rank × 默认 1 个写线程）。加载只读，不改文件；TP=4 的 rank 从 TP=2 写的块里各读需要的区间。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(sum(name.endswith(".distcp") for name in saved["files"]))

# %% [markdown]
# **5. `.metadata` 里的全局 tensor 数和一个 rank 的 ShardedTensor 数为什么不同？**
#
# <details><summary>答案</summary>
#
# 每层的同名参数合成一个带层维的全局 tensor：一个 rank 的 21 个 = 2（embedding）+ 2 层 × 8 + 2（final norm）+ 1（output），
# 写进文件后 2 层 × 8 合成 8 个全局 key，共 13 个。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(saved["tensors"]), sum(r[2] == "ShardedTensor" for r in rank0.values()))

# %% [markdown]
# **5. DP=2 用分布式优化器存的 checkpoint，在 DP=1 上加载后 `exp_avg` 与保存时相同吗？Adam 的 step 呢？**
#
# <details><summary>答案</summary>
#
# 两种格式（`dp_reshardable`、`fully_reshardable`）下 `exp_avg`、`exp_avg_sq`、fp32 main params 和权重都逐位相同；
# step 只有 `fully_reshardable` 恢复成 2，`dp_reshardable` 是 1。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(r["sharding_type"], r["exp_avg"], r["adam_step"]) for r in resharded])

# %% [markdown]
# ## 30-second answer
#
# `save_checkpoint` builds a state dict (args, iteration, model, optimizer, scheduler, RNG) and, in the
# default `torch_dist` format, hands it to `dist_checkpointing.save`. Each parameter appears as a
# `ShardedTensor`: a global key, a global shape independent of parallelism, the local shard and its
# offset, and a `replica_id`: (0, 0, dp_rank) for a TP-split tensor (each TP rank owns its own piece), (0, tp_rank,
# dp_rank) for one every TP rank holds whole; only replica 0 is written. Layers share one key
# with a leading layer axis. Loading asks for the offsets the new model needs, so a TP=2 checkpoint
# loads into TP=1 or TP=4 with identical logits.
