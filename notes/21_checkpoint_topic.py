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
# # 21 checkpoint 专题：分片状态、坐标与改并行度
#
# 第三轮 checkpoint 专题。[笔记 07](../07_checkpointing/) 走过一遍流程：TP=2 存一个只有模型的 checkpoint，
# 装进 TP=1、TP=4 的模型，logits 相同。本篇不重复那条流程，而是逐条回答 seed 004 第三轮「Checkpoint 专题」的四个「关注」：
#
# 1. 保存的是 sharded training state 还是 model-only weights；
# 2. state dict 如何与 TP / PP / DP / CP 坐标关联；
# 3. optimizer state、scheduler、random state、dataloader progress 是否保存；
# 4. world size 或并行策略变化时如何转换。
#
# 每一条都有 CPU gloo rank 上的真实运行：8 个 rank（TP2·PP2·DP2）读出每个条目的坐标；4 个 rank 按正式入口的
# `generate_state_dict` 拼出完整的训练状态并保存，然后**打开**它；最后用分布式优化器训练两步、保存，再换 DP、
# 换 TP 加载，逐元素比较 Adam 的状态。`megatron/training/` 不在 pip 包里，凡是来自它的结构都按 tag 上的行重建，并给出行号。

# %% [markdown]
# ## 阅读目标
#
# 1. **sharded 还是 model-only**：说清 `save_checkpoint` 在缺省 `--ckpt-format torch_dist` 下存的是每个 rank 的分片训练状态；
#    "只有模型"是同一个函数关掉几项（`--no-save-optim`、`--no-save-rng`）或加载时跳过几项（`--finetune`）的结果，
#    `--ckpt-convert-format` 只换格式。能从一个真实的 checkpoint 算出模型与优化器各占多少字节。
# 2. **坐标**：给定一个条目和一个 rank 的 (TP, PP, DP, CP) 坐标，说出它的全局 key、`global_offset`、
#    `axis_fragmentations` 和 `replica_id` 三个位置各自的含义，以及哪个 rank 真正把它写进文件。
# 3. **存了什么**：打开一个 checkpoint 目录，认出 `metadata.json`、`.metadata`、`__R_T.distcp` 和藏在 rank 0 文件里的 `common_state`，
#    说清 optimizer、scheduler、RNG、数据进度各在哪里、加载时在什么条件下被恢复。
# 4. **改并行度**：说清权重为什么总能换切法，而分布式优化器的状态取决于 sharding type：
#    哪几种存在、哪种能换 DP、哪种能换 TP，失败时报什么错。

# %% [markdown]
# ## 源码位置
#
# **核心文件**（seed 004「Checkpoint 专题」留空的那一栏）：
#
# - `megatron/training/checkpointing.py`：[`save_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L552)、[`load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066)——正式入口：拼状态、选格式、决定加载哪些部分
# - `megatron/core/dist_checkpointing/serialization.py`：[`save`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L349)、[`load`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L69)——`torch_dist` 格式的读写
# - `megatron/core/dist_checkpointing/mapping.py`：[`ShardedTensor`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L52)、[`ShardedObject`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L360)——一个本地值在全局里的坐标
# - `megatron/core/utils.py`：[`make_tp_sharded_tensor_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L973)——坐标从 TP / DP 群里算出来
# - `megatron/core/optimizer/distrib_optimizer.py`：[`DistributedOptimizer.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1460)——优化器状态的几种存法
# - `megatron/core/optimizer_param_scheduler.py`：[`OptimizerParamScheduler.state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer_param_scheduler.py#L302)——学习率调度的状态
# - `megatron/training/datasets/data_samplers.py`：[`MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115)——数据进度只靠 `consumed_samples` 恢复
#
# 逐行：
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`checkpointing.py::generate_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1296) | 外层 dict：args、iteration、model、optimizer、scheduler、rerun、rng |
# | [`checkpointing.py::get_rng_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L398) | 五种 RNG 状态，`torch_dist` 下包成坐标为 (PP, TP) 的 `ShardedObject` |
# | [`checkpointing.py::_build_sharded_state_dict_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L468) | 决定优化器的 sharding type（缺省 `dp_reshardable`） |
# | [`checkpointing.py:499`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L499) | 只有 `--dist-ckpt-optim-fully-reshardable` 才选 `fully_reshardable` |
# | [`checkpointing.py:827`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L827) | `torch_dist`：调 `dist_checkpointing.save`，`content_metadata` 记下 sharding type |
# | [`checkpointing.py:948`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L948) | 老的 `torch` 格式：每个 (TP, PP) rank 一个 `torch.save` 文件 |
# | [`checkpointing.py:1338`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1338)、[`checkpointing.py:1374`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1374) | `--no-save-optim` 同时去掉 optimizer 和 scheduler；`--no-save-rng` 去掉 RNG |
# | [`checkpointing.py::maybe_save_dataloader_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1218) | 只有带 `save_state` 的 loader（Energon）才另存数据状态 |
# | [`checkpointing.py:2172`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2172) | RNG 只在 (TP, PP) 与 checkpoint 相同时加载 |
# | [`checkpointing.py:2251`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251) | (TP, PP) 变了而 sharding type 不是完全可重切的：直接报错 |
# | [`checkpointing.py:2286`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2286) | rerun 状态只在 world、TP、PP、DP 全部相同时加载 |
# | [`checkpointing.py:2499`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499) | 从 checkpoint 的 args 取回 `consumed_train_samples` |
# | [`training.py:2267`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2267) | `--ckpt-convert-format`：加载后立刻按另一种格式 `save_checkpoint` 再退出 |
# | [`training.py:2522`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2522) | scheduler 每步加 global batch 的样本数 |
# | [`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513) | 用 `consumed_train_samples` 建 sampler |
# | [`serialization.py::load_common_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L206)、[`serialization.py::load_tensors_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L240)、[`serialization.py::load_sharded_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L271)、[`serialization.py::load_plain_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L305) | 不建模型就能读 checkpoint 的四个入口 |
# | [`mapping.py::ShardedTensor.from_rank_offsets`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L190) | "第 i 块，共 n 块" → `global_offset`、`axis_fragmentations` |
# | [`utils.py::make_sharded_tensor_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1094) | 不按 TP 切的参数：`replica_id = (0, tp_rank, dp_cp_rank)` |
# | [`transformer_block.py::TransformerBlock.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L711) | 层号变成最前面一维的偏移（PP 的坐标） |
# | [`language_module.py::LanguageModule.tie_embeddings_and_output_weights_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L464) | 最后一个 stage 的输出层 = 第一个 stage 词嵌入的副本，`replica_id` 首位为 1 |
# | [`optimizer.py::ChainedOptimizer.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1541) | 只有一个内层优化器时原样转交 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_dp_reshardable`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1828) | 按桶存：key 带 `dp_group_idx`，DP rank 各写一段 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_fully_reshardable`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1690) | 先在 DP 群里收齐，再按模型参数的坐标存 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1657)、[`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_fs_model_space`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1978) | 两种已弃用的存法 |
# | [`distrib_optimizer.py::DistributedOptimizer.get_parameter_state_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1262) | 把各 DP rank 的分片收集成完整的桶 |
# | [`distrib_optimizer.py::DistributedOptimizer.load_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L887) | 按 `param_state_sharding_type` 选加载函数 |
# | [`optimizer_param_scheduler.py::OptimizerParamScheduler.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer_param_scheduler.py#L284) | `num_steps` 按样本数累加 |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/checkpointing.py::save_checkpoint
# ├─ get_rng_state(ckpt_format, tp_group, pp_group)            # [all_gather_object over DP 只在 --data-parallel-random-init 时]
# │  └─ ShardedObject("rng_state", [state], (PP, TP), (pp_rank, tp_rank), replica_id=dp_cp_rank)
# ├─ maybe_save_dataloader_state                                # 没给 --dataloader-save：直接返回
# ├─ _build_sharded_state_dict_metadata(args)                   # distrib_optim_sharding_type = dp_reshardable（缺省）
# ├─ generate_state_dict(args, model, optimizer, scheduler, rng)
# │  ├─ model[i].sharded_state_dict(metadata)                   # 每个参数 → ShardedTensor(key, offset, replica_id)
# │  ├─ optimizer.sharded_state_dict(state_dict, metadata)      # ChainedOptimizer → DistributedOptimizer
# │  │  └─ sharded_param_state_dp_reshardable                   # 每个 DP rank 的一段桶 → ShardedTensor；不通信
# │  │     （fully_reshardable：get_parameter_state_dp_zero    # all_gather over dp-cp：[S/d] → d × [S/d]）
# │  └─ opt_param_scheduler.state_dict()                        # 普通 dict → common_state
# └─ dist_checkpointing.save(state_dict, iter_XXXXXXX/, content_metadata=...)
#    ├─ determine_global_metadata                               # all_gather_object over world：各 rank 的分片清单
#    ├─ _validate_common_state_dict                             # broadcast_object_list from rank 0：common 部分须一致
#    ├─ 非分片部分 → ShardedObject("common_state", replica_id=rank)   # 只有 rank 0 那份写盘
#    ├─ DCP 写计划 → 各 rank 写 __<rank>_0.distcp                 # gather / barrier over world；只写 replica_id 全 0 的片
#    └─ rank 0 写 .metadata、metadata.json                       # gather + broadcast + barrier over world
#
# megatron/training/checkpointing.py::load_checkpoint
# ├─ _load_base_checkpoint → load_common_state_dict            # 每个 rank 单独读 common_state：args、iteration、content_metadata
# ├─ 比较 (TP, PP)：不同 → 不要 RNG；sharding type 不可重切 → RuntimeError
# ├─ generate_state_dict(..., is_loading=True)                 # 用**当前**模型和优化器描述"我要哪些片"
# ├─ dist_checkpointing.load(sharded_state_dict, dir)          # 按当前坐标读区间；形状不符在这里报错
# ├─ model.load_state_dict / optimizer.load_state_dict         # load_parameter_state_from_<type>
# │                                                            # [dp_zero_gather_scatter：scatter over dp]
# ├─ opt_param_scheduler.load_state_dict
# ├─ args.consumed_train_samples ← checkpoint 的 args           # 之后 build_pretraining_data_loader 从这里续
# └─ random / numpy / torch / cuda / tracker 的 set_state         # 仅当 RNG 被加载
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `save_checkpoint` | iteration、model、optimizer、scheduler、flops 计数 | 磁盘上的 `iter_XXXXXXX/` 和 tracker 文件 | `sharded_state_dict`、`dist_checkpointing.save` | 是：tp、pp、dp-cp 群算坐标，world 上协调 | 按 ShardedTensor 分片写 | 否（只读） | `save_distributed_checkpoint`（只存模型） |
# | `generate_state_dict` | args、model、optimizer、scheduler、rng | 嵌套 dict（ShardedTensor / ShardedObject / 普通值） | 模型和优化器的 `sharded_state_dict` | 经由它们 | 描述切分，不搬数据 | 否 | 同上 |
# | `get_rng_state` | ckpt_format、tp、pp 群 | `ShardedObject`（或 list） | `get_cuda_rng_tracker` | 读 PP、TP、DP 序号 | 按 (PP, TP) 分片 | 否 | 无（simple loop 不存 RNG） |
# | `DistributedOptimizer.sharded_state_dict` | 模型的 sharded state dict、`is_loading`、metadata | `{optimizer: ShardedObject, param_state: ..., param_state_sharding_type}` | `sharded_param_state_<type>` | `fully_reshardable` / `dp_zero`：all-gather / gather over dp | 是：按 DP 段或按参数坐标 | 加载时分配空状态 | 无（simple loop 不存优化器） |
# | `OptimizerParamScheduler.state_dict` | 无 | 10 个数的 dict | 无 | 否 | 否 | 否 | 无 |
# | `dist_checkpointing.save` | sharded state dict、目录、`content_metadata` | 目录里的文件 | 保存 strategy、torch DCP | 是：world | 每片只写一次 | 否 | `save_distributed_checkpoint` |
# | `dist_checkpointing.load` | **当前**布局的 sharded state dict、目录 | 填好本地 tensor 的普通 dict | 加载 strategy、torch DCP | 是：world | 按当前偏移取区间 | 否（只返回） | `load_distributed_checkpoint` |
# | `load_common_state_dict` / `load_tensors_metadata` / `load_plain_tensors` | 目录 | common dict / 全局 key 与形状 / 整块 tensor | 加载 strategy | 前两个否；`load_plain_tensors` 要默认群 | 否（读整块） | 否 | 无 |
# | `load_checkpoint` | 建好的 model、optimizer、scheduler | iteration、flops 计数；对象被原地填好 | 以上全部 | 是 | 按当前并行度读 | **是**：权重、Adam 状态、lr、RNG、已消费样本数 | `load_distributed_checkpoint` |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import os
import random
import tempfile

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader

from snippets.ckpt import optim_reshard, training_state
from snippets.ckpt.checkpoint_view import metadata_json
from snippets.ckpt.pictures import draw_replica_grid
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n21_ckpt_topic import (QKV, entries_line, entry, qkv_table, replica_table, run,
                                             sharded_entries, special_keys, written_table)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import load_sharded_metadata
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel import ColumnParallelLinear

workdir = tempfile.TemporaryDirectory(prefix="ckpt21-")  # 本篇写的 checkpoint 都在这里，最后一格删掉

# %% [markdown]
# ## 关键对象
#
# ### 关注 2：一个条目的坐标（TP2·PP2·DP2，8 个 rank）
#
# 先看坐标，因为后面三条都建立在它上面。一个 2 层、hidden 16、4 个头、vocab 32 的 `GPTModel`（local spec），
# 词嵌入与输出层共享（`share_embeddings_and_output_weights=True`，PP=2 时它们在不同 stage 上）。每个 rank 只建自己那个 stage，
# 然后调 `model.sharded_state_dict()`——正式入口 `generate_state_dict` 存模型时调的就是它。
#
# 这个函数在 `snippets/experiments/n21_ckpt_topic.py` 里。模型尺寸是参数 `dims`，本篇用它的 `tiny`
# （2 层、hidden 16、4 个头、vocab 32、序列 8）；坐标与权重的值无关，所以不初始化权重（`perform_initialization=False`），
# 真实尺寸下也只是分配一个 stage 的内存：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(sharded_entries, run)

# %%
TINY = EXPERIMENTS["ckpt-topic"].tiny
entries = run_ranks(run, 8, TINY, Parallel(world=8, tp=2, pp=2), grid=dict(tp=2, pp=2))
print(entries_line(entries))

# %% [markdown]
# 同一个参数——每个 stage 上本地名为 `decoder.layers.0.self_attention.linear_qkv.weight` 的那个——在 8 个 rank 上的坐标
# （`qkv_table`，同一模块；`entry(rows, local_key)` 取一个 rank 的某个条目）：

# %%
qkv_table(entries)

# %% [markdown]
# 同一张表画成图：左边是 TP × PP × DP 的 8 个 rank，实心的是 `replica_id` 全 0、真正写进文件的那份；右边是全局 tensor
# 的 4 块（层 × 行）由谁写，以及一个 TP=1（PP 不变）的加载方每个 rank 读哪几块——每个 stage 的 rank 要整层 48 行，
# 从保存时两个 TP rank 写的两块里各读一块：

# %%
draw_replica_grid(qkv_table(entries).rows, title="TP2·PP2·DP2：linear_qkv.weight 的每一片由谁写，TP=1 加载时读哪几块")

# %% [markdown]
# 逐列读：
#
# - **全局 key 去掉了层号**，全局形状多了最前面的"层"维 `2`（`prepend_axis_num=1`）。PP 的坐标就落在这一维：
#   stage 0 的本地 `layers.0` 是全局第 0 层，stage 1 的本地 `layers.0` 是全局第 1 层，`global_offset[0]` 分别是 0 和 1
#   （`TransformerBlock.sharded_state_dict` 用 `layer_number - 1` 作偏移）。
# - **TP 的坐标是第 1 维的偏移**：`linear_qkv` 是 column-parallel，48 行切成两半，tp=1 的偏移 24。
# - **`axis_fragmentations = (2, 2, 1)`**：层维切成 2 块、行切成 2 块、列不切。层维的 2 来自 `num_layers`，与 PP 无关——
#   PP=1 时它也是 2，所以换 PP 只是换"哪个 rank 拿哪几块"。`from_rank_offsets` 由"第 i 块，共 n 块"算出这两列。
# - **DP 不改变偏移，只改变 `replica_id` 的第三位**：dp=1 的四个 rank 与 dp=0 的四个持有完全相同的片，编号 `(0, 0, 1)`。
#
# `replica_id` 是一个三元组，三个位置分别对应 PP、TP、DP（`sharded_param_state_fs_model_space` 的断言把它写作
# `(PP, TP, DP)`）。**全为 0 的那份才写进文件**，其余是副本。TP 切开的参数，TP 那一位总是 0（各 TP rank 拿的是不同的片）；
# 不按 TP 切的参数，TP 那一位等于 tp_rank。PP 那一位只有共享权重才非 0。下面把四个"特殊"的条目在 8 个 rank 上并排：

# %%
print("全局 key:", special_keys(entries))
replica_table(entries)

# %% [markdown]
# 表里是各条目的 `replica_id`（`-`：这个 stage 上没有它）。
#
# - **PP 位 = 1：共享词嵌入的副本。** 最后一个 stage 的 `output_layer.weight` 被改名成 `embedding.word_embeddings.weight`，
#   编号 `(1, 0, dp)`：它是第一个 stage 词嵌入的一份拷贝（建模型时由 embedding 群的 all-reduce 同步，训练中梯度也在该群里相加），
#   只由第一个 stage 写（`tie_embeddings_and_output_weights_state_dict`，[language_module.py 第 503 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L503)）。
# - **TP 位 = tp_rank：TP 里的副本。** position embedding 和 final norm 不按 TP 切，两个 TP rank 各有完整一份，tp=1 的那份不写。
# - **DP 位 = dp_rank。** 每个条目在 dp=1 上都是副本。
#
# 合起来，每个全局 tensor 的每个元素恰好被写一次。从 8 个 rank 的全部条目核对（`ckpt_coords.written_pieces`：
# 每个 `replica_id` 全 0 的片是全局 tensor 里的一个长方块，它们都在界内、两两不相交、元素数加起来等于全局 tensor 的，
# 就是恰好覆盖一次）：

# %%
written_table(entries)

# %% [markdown]
# **CP 坐标去哪了？** 参数在 CP 各 rank 上是相同的（CP 切的是序列），所以 CP 和 DP 一样只进 `replica_id` 的第三位：
# 那一位是 `get_data_parallel_rank(with_context_parallel=True)`，即 dp-cp 群里的序号 `cp + CP·dp`
# （[笔记 08](../08_parallel_state_and_rank_generator/)）。local spec 的注意力在没有 Transformer Engine 时不支持 CP，
# 这里用一个 `ColumnParallelLinear` 在 CP=2·DP=2 的 4 个 rank 上看：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def cp_replica_ids():
    from megatron.core.model_parallel_config import ModelParallelConfig

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    config = ModelParallelConfig(context_parallel_size=2, use_cpu_initialization=True)
    layer = ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.zeros_, bias=False)
    # 同 generate_state_dict 的缺省 metadata（checkpointing.py:1327）：坐标里的 DP 用 dp-cp 群
    metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    return (parallel_state.get_context_parallel_rank(), parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_rank(with_context_parallel=True),
            layer.sharded_state_dict(metadata=metadata)["weight"].replica_id)


Table(["rank", "cp", "dp", "dp-cp 序号", "weight 的 replica_id"],
      [[r, *row] for r, row in enumerate(run_ranks(cp_replica_ids, 4, grid=dict(cp=2)))])

# %% [markdown]
# ### 关注 3：打开一个完整的训练 checkpoint（TP=2·DP=2，4 个 rank）
#
# 笔记 07 只存了模型。这里按 `generate_state_dict`（[checkpointing.py 第 1296–1377 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1296-L1377)）和 `save_checkpoint`（[checkpointing.py 第 764 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L764)、[checkpointing.py 第 827 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L827)）
# 拼出正式入口存的整个 dict，用同样的 `metadata`（`_build_sharded_state_dict_metadata` 的缺省：`dp_reshardable`），
# 交给 `dist_checkpointing.save`。模型是 bf16 的小 GPT，包装同正式入口（`Float16Module` → DDP → `DistributedOptimizer`，
# `optim_reshard.build`），先用真实的 schedule 训练一步。RNG 用 `get_rng_state` 的五个键（`training_state.rng_state`），
# 种子像 `_set_random_seed` 那样先设好；`args` 只放 `load_checkpoint` 会读回的字段（`training_state.training_args`）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def save_training_state(ckpt_dir):
    optim_reshard.use_local_writer_queue()  # 同步保存不需要 spawn 一个 Manager：见遗留问题 7
    model, ddp, optimizer = optim_reshard.build(tp=2, init=True)
    random.seed(1234)                      # initialize.py 的 _set_random_seed：seed + 100·pp_rank
    np.random.seed(1234)
    metadata = {"distrib_optim_sharding_type": "dp_reshardable",
                "singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    try:                                   # 恢复训练时 load_checkpoint 先要的东西：一个新优化器的 sharded state dict
        optimizer.sharded_state_dict({"model": model.sharded_state_dict()}, is_loading=True,
                                     metadata=dict(metadata))
        fresh = "ok"
    except AssertionError as exc:
        fresh = optim_reshard.error_line(exc)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=1e-2, min_lr=1e-3, lr_warmup_steps=8, lr_decay_steps=80,
        lr_decay_style="cosine", start_wd=0.01, end_wd=0.01, wd_incr_steps=80, wd_incr_style="constant")
    optim_reshard.train_step(ddp, optimizer)
    scheduler.step(increment=8)            # training.py:2522：micro-batch 数 × MBS × DP（× GTP 重算组 1）= 8 个样本
    pp = parallel_state.get_pipeline_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_rank()
    state_dict = {"args": training_state.training_args(tp=2, pp=1, dp=2, consumed_train_samples=8),
                  "checkpoint_version": 3.0, "iteration": 1,
                  "model": model.sharded_state_dict(metadata=dict(metadata))}
    state_dict["optimizer"] = optimizer.sharded_state_dict(state_dict, metadata=dict(metadata))
    state_dict["opt_param_scheduler"] = scheduler.state_dict()
    state_dict["rng_state"] = ShardedObject(
        "rng_state", [training_state.rng_state()], (1, 2), (pp, tp),
        replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))
    state_dict["num_floating_point_operations_so_far"] = 1.5e6   # 训练循环累加的 FLOPs 计数（这里放一个示意值）
    dist_checkpointing.save(state_dict, ckpt_dir, content_metadata=metadata)
    return fresh


ckpt = os.path.join(workdir.name, "iter_0000001")
os.makedirs(ckpt)
fresh = run_ranks(save_training_state, 4, ckpt, grid=dict(tp=2))
Table(["文件", "字节"], training_state.file_rows(ckpt))

# %% [markdown]
# - `__<rank>_<i>.distcp`：torch DCP 的数据文件，保存 strategy 缺省一个写线程，每个 rank 一个文件。rank 2、3（dp=1）的文件更小：
#   模型权重和 RNG 在它们那里都是副本，它们只写自己那一段优化器状态（见下面的 key）。rank 0 的最大，因为非分片部分也在里面（见下）。
# - `.metadata`：DCP 的索引，每个全局 tensor / object 由哪些块组成、在哪个文件的哪一段。它还记下了保存时的**绝对路径**
#   和一个随机的 `save_id`，所以大小随目录而变（加载时不用它们，checkpoint 可以整体搬走）。
# - `metadata.json`：格式与版本。非分片部分（args、iteration、scheduler……）没有单独的文件：`dist_checkpointing.save` 把它包成
#   key 为 `common_state` 的 `ShardedObject`，`replica_id` 取全局 rank（[`serialization.py:439`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L439)），
#   所以只有 rank 0 写它；`load_common_state_dict` 不建进程群就能把它读出来（[`serialization.py:229`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L229)）。
#
# > **旧版（core_v0.18.0）：** 非分片部分由 rank 0 另存为 `common.pt`（[`serialization.py:399`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/dist_checkpointing/serialization.py#L399)），
# > `metadata.json` 里还多 `common_backend` 两项，下面的 `ShardedObject` 清单里也没有 `common_state`；core_v0.16.1 每个 rank 两个写进程、两个 `.distcp`。

# %%
print("metadata.json:", metadata_json(ckpt))
storage_meta = FileSystemReader(ckpt).read_metadata().storage_meta
print(".metadata 记下的 checkpoint_id 就是保存目录:", storage_meta.checkpoint_id == ckpt)
common = dist_checkpointing.load_common_state_dict(ckpt)
Table(["common_state 里的 key", "类型", "值"], training_state.common_rows(common))

# %% [markdown]
# `optimizer` 在 common 里只剩 `param_state_sharding_type`——Adam 的 param_groups（lr、betas、step）因为依赖 DP 分组，
# 被包成 `ShardedObject` 放进了 `.distcp`。全部 `ShardedTensor`（`load_tensors_metadata`，全局 key 与全局形状，与并行度无关的描述）：

# %%
tensors = dist_checkpointing.load_tensors_metadata(ckpt)
Table(["全局 key", "global shape", "dtype"],
      [[k.replace("gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.", "…"), s, d]
       for k, s, d in training_state.tensor_rows(tensors)])

# %% [markdown]
# 模型的 13 个 key 与笔记 07 一样（bf16）。优化器多出 6 个 fp32 的 key：`dp_reshardable` 按**桶**存，key 里带着
# `dp_group_idx_<i>`——i 是这个 rank 在 model-parallel（tp-pp）群里的序号（[optimizer/__init__.py 第 1111 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1111)），
# 所以 TP=2 有两组；每组三种状态（主权重 `param`、`exp_avg`、`exp_avg_sq`），全局长度 3328 是一个 TP rank 的桶去掉末尾补齐后的长度，
# 两个 DP rank 各写其中连续的一段。`ShardedObject`（`load_sharded_metadata`，不含模型层的 `_extra_state`）——第一行就是上面的
# `common_state`，`load` 自己读它时会把它从清单里剔掉（[`serialization.py:165`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L165)）：

# %%
objects = training_state.object_rows(load_sharded_metadata(ckpt))
print("模型层的 _extra_state 对象:", sum("_extra_state" in k for k, _ in objects))
Table(["ShardedObject key / 片", "global shape"],
      [row for row in objects if "_extra_state" not in row[0]])

# %% [markdown]
# `rng_state` 两片，坐标 (pp 0 of 1, tp 0/1 of 2)：**每个 (PP, TP) 一份**，DP 副本（`replica_id` = dp-cp 序号）不写。
# 优化器的非张量部分按 `dp_group_idx` 各一份。最后用 `load_plain_tensors` 把所有 tensor 整块读出——它要默认进程群，
# 所以放在 1 个 rank 上跑；4 个 rank 写的 checkpoint 被 1 个 rank 完整读回，这本身就是"换 world size 读"：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def read_whole(ckpt_dir):
    plain = dist_checkpointing.load_plain_tensors(ckpt_dir)   # 每个 tensor 整块读出，不管谁写的
    return training_state.size_rows(plain)


Table(["部分", "元素", "字节"], run_ranks(read_whole, 1, ckpt)[0])

# %% [markdown]
# **关注 1 的答案，用字节说话。** 缺省的 `torch_dist` checkpoint 是**分片的训练状态**：上面每个 rank 只写自己持有的主副本，
# 加载时再按新的坐标取。其中模型权重只占一小部分——bf16 权重 2 字节 / 参数，fp32 主权重和 Adam 两个动量 12 字节 / 参数，
# 另加每个参数起点对齐到 64 元素的补齐（[笔记 15](../15_distributed_optimizer/)）。"model-only" 不是另一种格式：
#
# - 保存时 `--no-save-optim` 去掉 `optimizer` 和 `opt_param_scheduler`（[checkpointing.py 第 1338 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1338)），`--no-save-rng` 去掉 `rng_state`（[checkpointing.py 第 1374 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1374)），
#   剩下 args、iteration 和 model——仍是分片的 `torch_dist`。
# - 加载时 `--finetune`（或 release checkpoint）把 iteration 置 0，不读优化器和 RNG；`--no-load-optim`、`--no-load-rng` 各关一项。
# - `--ckpt-convert-format torch|torch_dist` 加 `--ckpt-convert-save`（[training.py 第 2267 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2267)）：照常加载，再按另一种格式
#   `save_checkpoint` 一次然后退出——换的是**格式**，内容还是完整的训练状态（除非同时给 `--no-save-optim`）。
#
# 数据进度在哪？common 里的 `args`：

# %%
args = common["args"]
print("iteration:", common["iteration"], " consumed_train_samples:", args.consumed_train_samples,
      " scheduler num_steps:", common["opt_param_scheduler"]["num_steps"])
print("保存时的并行度 (TP, PP, DP, world):", (args.tensor_model_parallel_size,
      args.pipeline_model_parallel_size, args.data_parallel_size, args.world_size))
print("新优化器的 sharded_state_dict(is_loading=True):", fresh[0])

# %% [markdown]
# 四项各自的去处和恢复条件：
#
# - **optimizer**：模型之外最大的一块，`.distcp` 里。加载条件：不是 `--finetune` / release，没有 `--no-load-optim`，
#   checkpoint 的 args 里也没有 `no_save_optim`；(TP, PP) 变了还要求 sharding type 完全可重切（下一节）。
# - **scheduler**：`OptimizerParamScheduler.state_dict()` 的 10 个数进 `common_state`。`num_steps` 数的是**样本**（每步加 global batch），
#   加载时总是取 checkpoint 的值，所以换 DP 后只要 global batch 不变，学习率曲线照常接上。其余超参（max_lr、warmup、decay 步数……）
#   在正式入口的缺省下要求命令行与 checkpoint 一致，否则断言失败；`--override-opt-param-scheduler` 改用命令行的值，
#   `--use-checkpoint-opt-param-scheduler` 直接用 checkpoint 的值（`OptimizerParamScheduler._check_and_set`）。
# - **RNG**：每个 (PP, TP) 一份。只在 (TP, PP) 与 checkpoint 相同、且没有 `--finetune` / `--no-load-rng` 时加载
#   （[checkpointing.py 第 2172 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2172)）；否则打印一行 "RNG state will be ignored"，继续训练。本篇 CPU 上 `cuda_rng_state` 存的是 CPU 生成器。
# - **dataloader progress**：内置的 GPT 数据管线不存任何 loader 状态。进度 = `args.consumed_train_samples`（[checkpointing.py 第 2499 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499) 读回），
#   `build_train_valid_test_data_loaders` 把它交给 `MegatronPretrainingSampler`，后者从第 `consumed_samples` 个样本接着切
#   `micro_batch_size × DP` 的块、每个 DP rank 取自己那段——DP 变了也从同一个全局样本接上。只有带 `save_state` 的外部 loader
#   （如多模态的 Energon）才由 `maybe_save_dataloader_state` 另存每个 DP rank 一个文件。
# - 另外还有 `rerun_state_machine`（本篇没放），只在 world、TP、PP、DP 全部不变时加载（[checkpointing.py 第 2286 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2286)）。

# %% [markdown]
# ### 关注 4：换并行度加载——权重与优化器状态
#
# 权重总能换切法：加载方用**自己的**模型生成 sharded state dict，`load` 按这些坐标读区间（笔记 07 的 TP2→TP1/TP4）。
# 优化器状态不一样。`DistributedOptimizer` 的 Adam 状态是按 DP 切开的**扁平桶**（笔记 15），怎么把它描述成 `ShardedTensor`，
# 由 `metadata["distrib_optim_sharding_type"]` 决定。这个 tag 上 `sharded_state_dict` 认得的类型：
#
# | 类型 | 谁选它 | 存成什么 |
# |---|---|---|
# | `dp_reshardable` | 正式入口的缺省 | 桶空间：key 带 `dp_group_idx`（TP×PP 坐标），每个 DP rank 写自己那段 |
# | `fully_reshardable` | `--dist-ckpt-optim-fully-reshardable` | 模型空间：先在 DP 群里收齐，再按模型参数的 key 和坐标存 |
# | `dp_zero_gather_scatter` | 已弃用；老 checkpoint 的兜底 | DP rank 0 收齐后存成一个 `ShardedObject` |
# | `fully_sharded_model_space` | 已弃用；Core 在没给 metadata 时的缺省 | 模型空间，每个 DP rank 存参数展平后的一段 |
# | `fsdp_dtensor` | Megatron FSDP 专用 | DTensor（本篇不涉及） |
#
# 更早的 `fully_sharded_bucket_space` 只剩一条弃用日志，随后落进 `Unknown sharding_type`（[distrib_optimizer.py 第 1523 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1523) 起）。
#
# `snippets.ckpt.optim_reshard.reshard_optimizer_state(save_grid, load_grid, sharding_types)` 把实验做成一次调用：
# 保存方（bf16 GPT + DDP + 分布式优化器）训练两步，每种类型各存一次；加载方新建模型和优化器、把每个状态槽先填成哨兵值，
# 然后 `dist_checkpointing.load` + `model.load_state_dict` + `optimizer.load_state_dict`。两边每个 rank 交回自己持有的片
# （按模型的 `ShardedTensor` 坐标和本 DP rank 拥有的展平区间放回全局），在 notebook 里拼成整块逐元素比较。
# 先换 DP：DP=2 存，DP=4 读（world 2 → 4）：

# %%
dp_change = optim_reshard.reshard_optimizer_state(dict(dp=2), dict(dp=4),
                                                  optim_reshard.SHARDING_TYPES)
display(Table(optim_reshard.COMPARED, optim_reshard.rows(dp_change, optim_reshard.COMPARED),
              title="TP=1·DP=2 存 → TP=1·DP=4 读：加载后与保存时逐位相同？"))
Table(["sharding_type", "报错（第一行）"], optim_reshard.error_rows(dp_change))

# %% [markdown]
# 再换 TP：TP=2 存，TP=1·DP=2 读（world 不变，布局变了）：

# %%
tp_change = optim_reshard.reshard_optimizer_state(dict(tp=2), dict(tp=1, dp=2),
                                                  optim_reshard.SHARDING_TYPES)
display(Table(optim_reshard.COMPARED, optim_reshard.rows(tp_change, optim_reshard.COMPARED),
              title="TP=2·DP=1 存 → TP=1·DP=2 读：加载后与保存时逐位相同？"))
Table(["sharding_type", "报错（第一行）"], optim_reshard.error_rows(tp_change))

# %% [markdown]
# 读这两张表：
#
# - **权重**（`weights` 列）在每个加载成功的类型里都逐位相同；**`dp_reshardable`**（缺省）能换 DP、不能换 TP。
#   换 TP 时报错的是 DCP 的形状检查：TP=1 的 rank 要的 `dp_group_idx_0` 桶长 5888，文件里的是 TP=2 的 3328。
#   正式入口更早一步拦下：`load_checkpoint` 发现 (TP, PP) 变了而类型不在 `checkpoint_fully_reshardable_formats` 里，
#   抛出 `RuntimeError`（[checkpointing.py 第 2251 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251)）。
# - **`fully_reshardable`** 两种改变都扛得住：存的是与模型参数同 key、同坐标的 tensor（`optimizer.state.exp_avg.<模型 key>`），
#   加载方按自己的模型坐标读一遍，再按自己的 DP 段展平、截取。
# - **`dp_zero_gather_scatter`** 能换 DP（DP rank 0 读完整桶再 scatter），换 TP 时在 DP rank 0 上断言桶长相等而失败。
# - **`fully_sharded_model_space`** 在这个 tag 上连保存都不行：它给每片设 `flattened_range`，而 `ShardedTensor` 已经一律拒绝
#   （[mapping.py 第 134 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L134)）。遗留问题 1。
# - **`adam_step` 不全是 2（运行确认）。** 保存时走过两步，加载方的优化器原本只有 1 步（遗留问题 2 的 dummy step）。
#   `fully_reshardable` 和 `dp_zero_gather_scatter` 读回 2；缺省的 `dp_reshardable` 张量全对，步数却还是加载方自己的 1。
#   遗留问题 8 解释原因：它只在没有 TE / Apex 的 torch Adam 上出现。
# - 一个细节：`dist_checkpointing.load` 是**原地**读的——`dp_reshardable` 的 `ShardedTensor` 直接指向优化器自己的状态张量，
#   读完时 Adam 状态就已经回来了，`optimizer.load_state_dict` 再把它们拷给自己一遍。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 保存时的通信（上面 DP=2 那次保存，rank 0 记录）。`dp_reshardable` 只有 DCP 自己的协调——交换分片清单、收集写计划、
# 写完后汇总存储信息，都是 pickle 后的字节，不搬运任何状态 tensor。每次 object 交换先用 `[1]` 交换长度，再交换 `[n]` 个字节；
# n 随运行变化（pickle 的内容不是每次都一样），所以表里写作 n（`optim_reshard.payload_as_n`）：

# %%
meanings = {
    "dist_checkpointing/validation.py::determine_global_metadata":
        "all_gather_object：各 rank 的分片清单（先交换长度，再交换 pickle 字节）",
    "dist_checkpointing/validation.py::_validate_common_state_dict":
        "broadcast_object_list：rank 0 的 common 部分，各 rank 核对一致",
    "dist_checkpointing/strategies/state_dict_saver.py::save_state_dict_async_plan":
        "DCP 写计划：各 rank 的本地计划收集到 rank 0",
    "dist_checkpointing/strategies/async_utils.py::execute_sync": "等每个 rank 写完自己的 .distcp",
    "dist_checkpointing/strategies/state_dict_saver.py::save_state_dict_async_finalize":
        "各 rank 写了哪些块收集到 rank 0，由它写 .metadata",
    "dist_checkpointing/serialization.py::metadata_finalize_fn": "rank 0 写完 metadata.json",
    "optimizer/distrib_optimizer.py::get_parameter_state_dp_zero":
        "各 DP rank 的一段（param / exp_avg / exp_avg_sq 各一次）拼成完整的桶",
    "dist_checkpointing/strategies/torch.py::load": "DCP 读计划：收集、校验、发回各 rank 要读的区间",
    "optimizer/distrib_optimizer.py::load_parameter_state_from_dp_zero": "DP rank 0 把完整的桶按 DP 段分给各 rank",
}
by_type = {r["sharding_type"]: r for r in dp_change}
communication_table(optim_reshard.payload_as_n(by_type["dp_reshardable"]["save_calls"]), meanings,
                    ranks=False)

# %% [markdown]
# `fully_reshardable` 多出开头三次 all-gather：保存前在 dp-cp 群里把三种状态各收齐一次，`[S/d] → d × [S/d]`
# （这里 S/d = 2944 是一个 DP rank 的段长，含补齐），之后每个 rank 都有完整的状态、按模型坐标只写主副本那份：

# %%
communication_table(optim_reshard.payload_as_n(by_type["fully_reshardable"]["save_calls"][:3]), meanings,
                    ranks=False)

# %% [markdown]
# 加载 `dp_zero_gather_scatter`（DP=4）时，DCP 只把完整的桶读到 DP rank 0，再由 Megatron 在 DP 群里 scatter（gloo 的 DP 群
# 在这里就是全部 4 个 rank，记录器把它记作 world）：

# %%
communication_table(optim_reshard.payload_as_n(by_type["dp_zero_gather_scatter"]["load_calls"][-3:]), meanings,
                    ranks=False)

# %% [markdown]
# | 对象 | 形状 / 内容 | 由谁决定 |
# |---|---|---|
# | 模型条目 | 全局 key + 全局形状（与并行度无关），本地片 + `global_offset` | TP 坐标（切分维的偏移）、PP 坐标（层维偏移） |
# | `replica_id` | `(PP 副本号, TP 副本号, dp-cp 序号)`，全 0 才写 | 共享权重、TP 副本、DP / CP 副本 |
# | `dp_reshardable` 的优化器条目 | key 带 `dp_group_idx`（tp-pp 序号），全局长 = 桶长（去掉末尾补齐） | TP×PP 坐标选 key，DP 坐标选偏移 |
# | `fully_reshardable` 的优化器条目 | 与模型条目同坐标，key 前缀 `optimizer.state.<state>.` | 模型坐标 |
# | `rng_state` | `ShardedObject`，形状 (PP, TP)，副本号 = dp-cp 序号 | PP、TP 坐标 |
# | `common_state` | args、iteration、scheduler、sharding type，一个 `ShardedObject` | rank 0 写，各 rank 单独读 |

# %% [markdown]
# ## 机制解释
#
# **为什么权重总能换切法。** 每个模型条目用"全局 tensor 的哪一块"描述自己，而全局 tensor 的 key 和形状与并行度无关
# （层号折进层维、TP 切分折进偏移、副本折进 `replica_id`）。保存方写出的是全局 tensor 的若干块；加载方提出的是另一组块，
# DCP 负责把两组块对上。
#
# **为什么 `dp_reshardable` 只能换 DP。** 它存的是分布式优化器内部的桶：一个 TP×PP 坐标一个桶（key 里的 `dp_group_idx`），
# 桶里参数的顺序和每个参数起点对齐到 64 的补齐都取决于这个 rank 持有的参数形状——TP 一变，桶的长度和布局全变
# （上面 3328 对 5888）。DP 一变，桶本身不变，只是每个 DP rank 拥有的那一段（偏移 = dp_rank × 段长）换了位置，
# 而全局长度特意取"去掉末尾 DP 补齐"的长度（`sharded_param_state_dp_reshardable` 的 docstring 说明了这一点）。所以存、读都不需要通信。
#
# **`fully_reshardable` 的代价。** 保存时每个 DP rank 都收齐整个优化器状态（上面的三次 all-gather，显存 / 内存随之放大；
# `--distrib-optim-fully-reshardable-mem-efficient` 改用 gloo 只收到 DP rank 0）；加载时每个 rank 读出自己模型参数的**整块**状态，
# 再展平、截取自己那段。换来的是与模型一样的坐标，TP、PP、DP 都能换。
#
# **正式入口的选择。** `save_checkpoint` 用 `_build_sharded_state_dict_metadata` 选类型，并把它作为 `content_metadata` 写进 common state；
# `load_checkpoint` 用 `load_content_metadata` 读回，按**保存时**的类型生成加载请求。这意味着：要在将来换 TP / PP，必须在**保存时**
# 就加 `--dist-ckpt-optim-fully-reshardable`；已经存成 `dp_reshardable` 的，只能用原来的 TP / PP 加载（DP 可变），
# 或者加 `--no-load-optim` 放弃优化器状态。

# %% [markdown]
# ## 与训练主链路的关系
#
# `train` 循环每 `--save-interval` 步经 `save_checkpoint_and_time` 调一次 `save_checkpoint`；`setup_model_and_optimizer`
# 在建好模型、优化器、scheduler 之后调 `load_checkpoint`（[training.py 第 2199 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)），返回的 iteration 和 flops 计数决定循环从哪里继续，
# `consumed_train_samples` 决定数据从哪里继续。simple loop（笔记 01）只有 `save_distributed_checkpoint` / `load_distributed_checkpoint`
# 两步、只存模型：它对应的是本篇"model-only"的那一种。

# %% [markdown]
# ## 与基础知识的连接
#
# - **Adam 的状态**：每个参数两个动量，加上混合精度的 fp32 主权重，这就是 checkpoint 里 optimizer 比 model 大的原因（上面的字节表）。
#   断点续训要这些状态原样回来，否则第一步就等于换了一个刚初始化的优化器。
# - **ZeRO-1**：分布式优化器按 DP 切状态（笔记 15）；checkpoint 要么保留这种切法（`dp_reshardable`），要么先还原成"每个参数一份"（`fully_reshardable`）。
# - **torch.distributed.checkpoint（DCP）**：`.metadata` + `.distcp` 是 DCP 的布局；"全局 tensor 的一块"是 DCP 的语言，
#   Megatron 的 `ShardedTensor` 负责把 TP / PP / DP 坐标翻译成它。

# %% [markdown]
# ## 遗留问题
#
# 1. **`fully_sharded_model_space` 在这个 tag 上不能用（运行确认）。** 它是 `DistributedOptimizer.sharded_state_dict` 在 metadata
#    里没有类型时的缺省（[distrib_optimizer.py 第 1510 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1510)），但它给每片设 `flattened_range`（[distrib_optimizer.py 第 2037 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2037)），而 `ShardedTensor`
#    的校验对任何 `flattened_range` 一律抛 `CheckpointingException`（[mapping.py 第 134 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L134)）。`load_checkpoint` 仍会把没有
#    content metadata、存时开了 `ckpt_fully_parallel_save` 的老 checkpoint 当成这种类型（[checkpointing.py 第 2223 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2223)）。
#    直接调 Core 的人若不传 metadata，就会撞上。
# 2. **没有 Transformer Engine / Apex 时，新建的分布式优化器不能直接加载（运行确认）。** 上面 `fresh` 的那一行：
#    `state_dict()` 要从 torch Adam 的每参数状态里取出唯一的 step（[distrib_optimizer.py 第 839 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L839)），新优化器还没有状态，断言失败；
#    `load_checkpoint` 在恢复训练时正是先要这个 sharded state dict。本篇的加载方先调 Megatron 自己的
#    `_init_optimizer_states_with_dummy_values()`（它在 `fsdp_dtensor` 路径里也这么做，[distrib_optimizer.py 第 1643 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1643)）。GPU 上有 TE 的 FusedAdam 时
#    step 存在 param_groups 里，不走这个分支。
# 3. **同样因为 torch Adam 的 `step`，`fully_reshardable` 和 `dp_zero_gather_scatter` 加载时在 `step` 上 `KeyError`。**
#    `_set_main_param_and_optimizer_states` 逐键拷贝优化器状态（[distrib_optimizer.py 第 1218–1225 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1218-L1225)），而这两种格式只带回 param / exp_avg / exp_avg_sq。
#    CPU 补丁 `distrib_optimizer_torch_adam_step` 让缺失的 step 保持原值（[CPU 页](../../cpu/)）；它们保存时的 `.cuda()` 由
#    `distrib_optimizer_gather_cuda` 处理。
# 4. **fp32 参数 + `dp_reshardable` 的加载要在 `torch.no_grad()` 下（运行确认）。** fp32 时主权重是模型参数的 view
#    （[distrib_optimizer.py 第 467 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L467)，没有 `detach`），`load_parameter_state_from_dp_reshardable`（[distrib_optimizer.py 第 2061 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2061)）原地拷贝却没有 `@torch.no_grad()`，
#    而 `fully_reshardable` 和 `fs_model_space` 的加载函数有（[distrib_optimizer.py 第 2358 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2358)、[distrib_optimizer.py 第 2095 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2095)）。bf16 / fp16 训练的主权重是独立的拷贝，不受影响：
#    fp32 下不包 `no_grad` 地调用，这次原地拷贝就是对需要梯度的叶子参数的 view 做 in-place 操作，autograd 报错。
# 5. **过时的提示。** (TP, PP) 变了时的 `RuntimeError`（[checkpointing.py 第 2251 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251)）建议"保存时用 `--ckpt-fully-parallel-save`"，
#    但这个参数已经弃用、不起作用（[arguments.py 第 1712 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1712)）；真正决定可否重切的是
#    [`training_config.py:592`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/config/training_config.py#L592) 的
#    `dist_ckpt_optim_fully_reshardable`。[arguments.py 第 1720 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1720) 那条"非并行保存就不能换并行度"的警告也来自旧的实现。
# 6. **`dp_zero_gather_scatter` 换 TP 且 DP>1 时会挂住。** 桶长的比较只在 DP rank 0 上做（[distrib_optimizer.py 第 2290 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2290)），其余 rank 已经进了 scatter，
#    rank 0 抛错后它们永远等下去。`optim_reshard` 先让 rank 0 把存下的桶长广播给同组的 rank，不符时一起停下，再把 rank 0 上 Megatron 的原话报出来。
# 7. **每个保存过的进程多一个 Python 进程。** `torch_dist` 的写入器第一次用时 spawn 一个 multiprocessing Manager 来建结果队列
#    （[filesystem_async.py 第 64–65 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L64-L65)），为的是异步保存时别的进程也能写回结果；它一直活到进程结束。同步保存时写入就在本进程里，
#    一个普通的线程队列就够。本篇的 rank 在保存前调 `optim_reshard.use_local_writer_queue()` 放进这样一个队列：每次保存的 launch
#    省下约 2 秒（本机），rank 以 `os._exit` 结束时也不会留下孤儿 Manager。
#
# 8. **没有 TE / Apex 时，`dp_reshardable` 不恢复 Adam 的步数（运行确认）。** torch Adam 把 `step` 存在每个参数的状态里。
#    `load_state_dict` 先按 checkpoint 的 param_groups 把每个状态的 `step` 设成保存时的值（[distrib_optimizer.py 第 1032 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1032)）；
#    随后 `load_parameter_state_from_dp_reshardable` 把 `step` 也逐键拷回——而这个 `step` 是保存格式里的
#    `LocalNonpersistentObject`（[distrib_optimizer.py 第 1953–1956 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1953-L1956)），装的是**加载方**在生成请求时自己的旧张量，于是步数被改回旧值。
#    步数进入 Adam 的偏差修正（1 − β^t），续训的第一步因此算错。上面两张表的 `adam_step` 列就是它；TE 的 FusedAdam 把
#    step 放在 param_groups 里，不受影响。

# %% [markdown]
# ## 自测
#
# **1. TP2·PP2·DP2 时，哪几个 rank 把 `linear_qkv.weight` 的片写进文件？各写哪一块？**
#
# <details><summary>答案</summary>
#
# `replica_id` 全 0 的那些：dp=0 的 rank 0、1、4、5（rank = tp + 2·dp + 4·pp）。rank 0、1（pp=0）写第 0 层的上下两半
# （偏移 (0, 0, 0)、(0, 24, 0)），rank 4、5（pp=1）写第 1 层的两半；dp=1 的 rank 2、3、6、7 是副本。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(rank, entry(rows, QKV)["global_offset"]) for rank, (_, rows) in enumerate(entries)
       if all(i == 0 for i in entry(rows, QKV)["replica_id"])])

# %% [markdown]
# **2. 最后一个 stage 的 `output_layer.weight` 在文件里叫什么？谁写它？**
#
# <details><summary>答案</summary>
#
# 叫 `embedding.word_embeddings.weight`（与第一个 stage 的词嵌入同一个全局 tensor），`replica_id` 是 `(1, 0, dp)`：
# PP 位为 1，永远是副本，由第一个 stage 的 dp=0 rank 写。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({r: (entry(rows, "output_layer.weight")["key"], entry(rows, "output_layer.weight")["replica_id"])
       for r, (c, rows) in enumerate(entries) if c["pp"] == 1})

# %% [markdown]
# **3. 为什么 TP=2·DP=2 的 checkpoint 里 `dp_reshardable` 的优化器 key 有两组（`dp_group_idx_0`、`_1`）而不是四组？**
#
# <details><summary>答案</summary>
#
# `dp_group_idx` 是 tp-pp 群里的序号，每个 TP×PP 坐标一组；同一组里的两个 DP rank 写同一个全局 tensor 的不同段，不另起 key。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(sorted({k.split(".")[2] for k in tensors if k.startswith("optimizer.")}))

# %% [markdown]
# **4. 哪几种 sharding type 在 DP 改变后能恢复 Adam 的三个张量（主权重、两个动量）？哪几种连步数也恢复？TP 改变后呢？**
#
# <details><summary>答案</summary>
#
# 换 DP：三个张量 `dp_reshardable`、`fully_reshardable`、`dp_zero_gather_scatter` 都恢复，但在 torch Adam 上
# `dp_reshardable` 的步数没回来（遗留问题 8）；换 TP：只有 `fully_reshardable`，步数也对。
# `fully_sharded_model_space` 两种都不行（这个 tag 上存不下来）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def survivors(results):
    tensors = [r["sharding_type"] for r in results
               if r["loaded"] and all(r[s] for s in optim_reshard.STATES)]
    with_step = [t for t in tensors
                 if next(r for r in results if r["sharding_type"] == t)["adam_step"] == optim_reshard.SAVED_STEPS]
    return tensors, with_step


print("换 DP（张量, 连步数）:", survivors(dp_change))
print("换 TP（张量, 连步数）:", survivors(tp_change))

# %% [markdown]
# **5. 从 DP=2 换到 DP=4 续训，数据从第几个样本接着读？学习率调度器认为走过了多少步？**
#
# <details><summary>答案</summary>
#
# 都是 8：`consumed_train_samples = 8`（1 步 × global batch 8），sampler 从第 8 个全局样本开始按新的 DP 切；
# scheduler 的 `num_steps` 也按样本计，为 8。两者都与 DP 无关。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(common["args"].consumed_train_samples, common["opt_param_scheduler"]["num_steps"])
workdir.cleanup()

# %% [markdown]
# ## 30-second answer
#
# By default Megatron saves sharded training state, not just weights: `save_checkpoint` stores args, iteration,
# model, distributed-optimizer state, scheduler and per-(PP,TP) RNG in `torch_dist` format; model-only is the
# same save with `--no-save-optim --no-save-rng`. Every tensor is a `ShardedTensor`: a global key and shape,
# an offset from TP and PP coordinates, and a `replica_id` of (PP, TP, DP·CP); only all-zero replicas are
# written. Weights reshard freely on load. Optimizer state saved as `dp_reshardable` (the default) survives
# a DP change only; `fully_reshardable` also survives TP/PP changes.
