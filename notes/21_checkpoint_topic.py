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
# 续训用的 checkpoint 里到底有什么：是每个 rank 的分片训练状态，还是只有权重？一片权重怎样和 TP / PP / DP / CP
# 坐标对上、由哪个 rank 写进文件？优化器、学习率调度、RNG、数据进度存不存，换了 TP 或 DP 之后哪些还能接上？
# 本篇在 CPU 上用 Megatron Core 0.19.0 和正式入口自己的 `generate_state_dict` 存一个完整的训练 checkpoint，打开它逐项看，
# 再换 DP、换 TP 加载，逐元素比较 Adam 的状态。保存、加载的流程见[笔记 07](../07_checkpointing/)，这里不重复。

# %% [markdown]
# ## 阅读目标
#
# 1. **sharded 还是 model-only**：缺省存的是什么，"只有权重"怎么来；模型与优化器各占多少字节。
# 2. **坐标**：一片的全局 key、`global_offset`、`replica_id` 怎样由 (TP, PP, DP, CP) 算出，谁真正写它。
# 3. **存了什么**：optimizer、scheduler、RNG、数据进度各在哪里，加载时在什么条件下恢复。
# 4. **改并行度**：权重为什么总能换切法；优化器状态哪种能换 DP、哪种能换 TP，缺省的怎样才能换 TP。
#
# **结论**
#
# - 缺省存的是分片的训练状态：TP2·DP2 小 GPT 的优化器 79,872 字节、模型只有 10,816；model-only 只是同一次保存少存几项。
# - 一片 = 全局 key + `global_offset`（TP、PP 坐标）+ `replica_id`（PP, TP, DP·CP）：`linear_qkv.weight` 全局 (2, 48, 16)，只有 rank 0、1、4、5 写。
# - 优化器按桶存（每个 TP rank 3 个 fp32 [3328]）；scheduler 的 10 个键（2 个是字符串）在 `common_state`；RNG 每个 (PP, TP) 一片。
# - 数据进度只是 args 里的 `consumed_train_samples`（这里 8）：内置 loader 没有状态要存，`maybe_save_dataloader_state` 没拿到路径就返回。
# - `--no-load-optim` 和 `--finetune` 都不读 scheduler：学习率从 0.01 回到 warm-up 起点 0.0，`--no-load-optim` 的 iteration 却接着走。
# - 缺省 `dp_reshardable` 只能换 DP（换 TP 时桶长 3328 ≠ 5888）；要换 TP / PP，保存时用 `fully_reshardable`，或在原并行度下转存一次。
#
# 先读：[笔记 07](../07_checkpointing/)（存、读一遍的流程）、[笔记 15](../15_distributed_optimizer/)（分布式优化器的桶）；约 25 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.ckpt import optim_reshard, training_state
from snippets.ckpt.checkpoint_view import metadata_json
from snippets.ckpt.pictures import draw_replica_grid
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n21_ckpt_topic import (QKV, convert_then_reshard, entry, folded, qkv_table, replica_table,
                                             run, sharded_entries, special_keys, written_table)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

import logging
import os
import random
import tempfile

import numpy as np
import torch
from IPython.display import display
from torch.distributed.checkpoint import FileSystemReader

from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
from megatron.core.dist_checkpointing.serialization import load_sharded_metadata
from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.rerun_state_machine import RerunDataIterator
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.training.checkpointing import (_build_sharded_state_dict_metadata, generate_state_dict,
                                             maybe_save_dataloader_state)

logging.getLogger().setLevel(logging.WARNING)  # megatron/training/training.py 在 import 时把根 logger 设成 INFO
workdir = tempfile.TemporaryDirectory(prefix="ckpt21-")  # 本篇写的 checkpoint 都在这里，最后一格删掉
TINY = EXPERIMENTS["ckpt-topic"].tiny
entries = run_ranks(run, 8, TINY, Parallel(world=8, tp=2, pp=2), grid=dict(tp=2, pp=2))
draw_replica_grid(qkv_table(entries).rows,
                  title="TP2·PP2·DP2：只有 replica_id 全 0 的 rank 写，TP=1 加载时每层读两块")

# %% [markdown]
# 左边是 8 个 rank 各持有的片和 `replica_id`，实心的是真正写进文件的那份；右边是全局 tensor 的 4 块（层 × 行）由谁写，
# 以及一个 TP=1（PP 不变）的加载方每个 rank 从哪几块读。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 所有 rank 都是本机的 gloo 进程，由 `snippets.ranks.launch.run_ranks` 从 notebook 进程 fork 出来，结果交回 notebook 打印。
# - 坐标（图和关注 2 的表）：实验 `ckpt-topic`，`snippets/experiments/n21_ckpt_topic.py` 的 `sharded_entries` 在每个 rank 上
#   只建自己那个 stage 的 `GPTModel`（local spec，词嵌入与输出层共享），尺寸是登记项的 `tiny`（2 层、hidden 16、4 个头、
#   vocab 32、序列 8），不初始化权重（坐标与值无关），然后调 `model.sharded_state_dict()`，把每个条目变成一行。
# - 完整的训练 checkpoint（关注 1、3）：`snippets.ckpt.optim_reshard.build` 像正式入口一样包装一个 bf16 小 GPT
#   （`Float16Module` → DDP → `DistributedOptimizer`），用真实的 schedule 训练一步；`args` 只放 `load_checkpoint` 读回的字段
#   （`training_state.training_args`）。外层 dict 由正式入口的 `generate_state_dict` 拼，metadata 由
#   `_build_sharded_state_dict_metadata` 给。RNG 的字典由 `training_state.rng_state` 取（`get_rng_state` 读全局 args 和
#   `torch.cuda` 的生成器），再包成与 `get_rng_state` 相同的 `ShardedObject`。
# - 换并行度（关注 4）：`optim_reshard.reshard_optimizer_state(save_grid, load_grid, types)` 起两批 rank：保存方训练两步、
#   每种 sharding type 各存一次；加载方新建模型和优化器，每个状态槽先填哨兵值 −7，再 `dist_checkpointing.load` +
#   `load_state_dict`，两边各交回自己持有的片，在 notebook 里按全局坐标拼成整块逐元素比较。
#   `n21_ckpt_topic.convert_then_reshard` 在中间多一批 rank：按原并行度读 `dp_reshardable`、另存为 `fully_reshardable`。
# - 通信表由 `snippets.record.recorder` 记录（保存 / 加载期间每个 collective 和发出它的 Megatron 函数）；torch DCP 交换的是
#   pickle 后的字节，长度每次不同，表里写作 n（`optim_reshard.payload_as_n`）。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 8 ckpt-topic --tp 2 --pp 2` 打印关注 2 的三张表；
#   `scripts/execute_notes.sh notes/21_checkpoint_topic.py` 重新执行整页。CPU 上要的改动见文末「在 CPU 上怎么跑的」。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(sharded_entries, run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`checkpointing.py::generate_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1296) | 外层 dict：args、iteration、model、optimizer、scheduler、rng |
# | [`checkpointing.py::_build_sharded_state_dict_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L468) | 选优化器的 sharding type（缺省 `dp_reshardable`） |
# | [`checkpointing.py::get_rng_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L398) | 五种 RNG 状态，包成坐标为 (PP, TP) 的 `ShardedObject` |
# | [`checkpointing.py::load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066) | 按开关和并行度决定恢复哪几项 |
# | [`mapping.py::ShardedTensor.from_rank_offsets`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L190) | "第 i 块，共 n 块" → `global_offset`、`axis_fragmentations` |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1460) | 优化器状态的几种存法 |
#
# <details><summary>其余 30 行</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`optimizer_param_scheduler.py::OptimizerParamScheduler.load_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer_param_scheduler.py#L341) | 续训时取回 `num_steps`，核对或覆盖超参 |
# | [`checkpointing.py::maybe_save_dataloader_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1218) | 给了 `--dataloader-save` 才另存 loader 的状态 |
# | [`checkpointing.py::save_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L552) | 正式入口的保存：拼状态、选格式（流程见笔记 07） |
# | [`checkpointing.py:499`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L499) | 只有 `--dist-ckpt-optim-fully-reshardable` 才选 `fully_reshardable` |
# | [`checkpointing.py:744`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L744) | 保存时的 sharding type 取自**当前**命令行 |
# | [`checkpointing.py:948`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L948) | 老的 `torch` 格式：每个 (TP, PP) rank 一个 `torch.save` 文件 |
# | [`checkpointing.py:1338`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1338)、[`checkpointing.py:1374`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1374) | `--no-save-optim` 同时去掉 optimizer 和 scheduler；`--no-save-rng` 去掉 RNG |
# | [`checkpointing.py:2172`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2172) | RNG 只在 (TP, PP) 与 checkpoint 相同时加载 |
# | [`checkpointing.py:2198`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2198) | 加载时的 sharding type 取自 checkpoint 的 content metadata |
# | [`checkpointing.py:2251`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251) | (TP, PP) 变了而 sharding type 不是完全可重切的：直接报错 |
# | [`checkpointing.py:2286`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2286) | rerun 状态只在 world、TP、PP、DP 全部相同时加载 |
# | [`checkpointing.py:2473`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2473) | `--finetune` 或 release：iteration 置 0 |
# | [`checkpointing.py:2499`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499) | 从 checkpoint 的 args 取回 `consumed_train_samples`（`--finetune` 时不取） |
# | [`checkpointing.py:2555`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2555)、[`checkpointing.py:2598`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2598) | optimizer 分支要求不是 `--no-load-optim`；scheduler 在分支里面，另要求不是 `--finetune` |
# | [`training.py:2267`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2267) | `--ckpt-convert-format`：加载后立刻按当前命令行 `save_checkpoint` 再退出 |
# | [`training.py:2522`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2522) | scheduler 每步加 global batch 的样本数 |
# | [`training.py::get_optimizer_param_scheduler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1906) | 按命令行新建 scheduler（`num_steps` = 0） |
# | [`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513) | 用 `consumed_train_samples` 建 sampler |
# | [`data_samplers.py::MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115) | 从第 `consumed_samples` 个样本接着切 |
# | [`serialization.py::load_common_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L206)、[`serialization.py::load_tensors_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L240)、[`serialization.py::load_sharded_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L271)、[`serialization.py::load_plain_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L305) | 不建模型就能读 checkpoint 的四个入口 |
# | [`utils.py::make_sharded_tensor_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1094) | 不按 TP 切的参数：`replica_id = (0, tp_rank, dp_cp_rank)` |
# | [`transformer_block.py::TransformerBlock.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L711) | 层号变成最前面一维的偏移（PP 的坐标） |
# | [`language_module.py::LanguageModule.tie_embeddings_and_output_weights_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L464) | 最后一个 stage 的输出层 = 第一个 stage 词嵌入的副本 |
# | [`optimizer.py::ChainedOptimizer.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1541) | 只有一个内层优化器时原样转交 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_dp_reshardable`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1828) | 按桶存：key 带 `dp_group_idx`，DP rank 各写一段 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_fully_reshardable`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1690) | 先在 DP 群里收齐，再按模型参数的坐标存 |
# | [`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1657)、[`distrib_optimizer.py::DistributedOptimizer.sharded_param_state_fs_model_space`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1978) | 两种已弃用的存法 |
# | [`distrib_optimizer.py::DistributedOptimizer.get_parameter_state_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1262) | 把各 DP rank 的分片收集成完整的桶 |
# | [`distrib_optimizer.py::DistributedOptimizer.load_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L887) | 按 `param_state_sharding_type` 选加载函数 |
# | [`optimizer_param_scheduler.py::OptimizerParamScheduler.state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer_param_scheduler.py#L302)、[`optimizer_param_scheduler.py::OptimizerParamScheduler.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer_param_scheduler.py#L284) | 10 个键；`num_steps` 按样本数累加 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 保存：`generate_state_dict` 把模型、优化器的 `sharded_state_dict` 和 scheduler、RNG、args 放进一个 dict，
# `dist_checkpointing.save` 让每个 rank 只写 `replica_id` 全 0 的片。加载：`load_checkpoint` 先读 common 部分，
# 按开关和 (TP, PP) 是否变了决定要哪几项，再用**当前**的模型和优化器描述"我要哪些片"。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/checkpointing.py::save_checkpoint
# ├─ get_rng_state(ckpt_format, tp_group, pp_group)            # [all_gather_object over DP 只在 --data-parallel-random-init 时]
# │  └─ ShardedObject("rng_state", [state], (PP, TP), (pp_rank, tp_rank), replica_id=dp_cp_rank)
# ├─ maybe_save_dataloader_state(..., args.dataloader_save)     # GPT 入口没有这个参数：None，直接返回
# ├─ _build_sharded_state_dict_metadata(args)                   # 按当前命令行：dp_reshardable（缺省）或 fully_reshardable
# ├─ generate_state_dict(args, model, optimizer, scheduler, rng)
# │  ├─ model[i].sharded_state_dict(metadata)                   # 每个参数 → ShardedTensor(key, offset, replica_id)
# │  ├─ optimizer.sharded_state_dict(state_dict, metadata)      # ChainedOptimizer → DistributedOptimizer
# │  │  └─ sharded_param_state_dp_reshardable                   # 每个 DP rank 的一段桶 → ShardedTensor；不通信
# │  │     （fully_reshardable：get_parameter_state_dp_zero    # all_gather over dp-cp：[S/d] → d × [S/d]）
# │  └─ opt_param_scheduler.state_dict()                        # 10 个键的普通 dict → common_state（--no-save-optim 时不存）
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
# ├─ generate_state_dict(..., is_loading=True)                 # 用**当前**模型和优化器描述"我要哪些片"；sharding type 取自 checkpoint
# ├─ dist_checkpointing.load(sharded_state_dict, dir)          # 按当前坐标读区间；形状不符在这里报错
# ├─ iteration ← checkpoint（--finetune / release：0）；consumed_train_samples ← checkpoint 的 args（--finetune：不取）
# ├─ model.load_state_dict
# ├─ 若非 --no-load-optim 且非 --finetune：optimizer.load_state_dict   # load_parameter_state_from_<type>
# │  │                                                         # [dp_zero_gather_scatter：scatter over dp]
# │  └─ 若非 --finetune：opt_param_scheduler.load_state_dict    # 否则 scheduler 保持新建时的 num_steps = 0
# └─ random / numpy / torch / cuda / tracker 的 set_state         # 仅当 RNG 被加载
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `save_checkpoint`、`load_checkpoint`、`dist_checkpointing.save` / `load` 的记录在[笔记 07](../07_checkpointing/)。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `generate_state_dict` | args、model、optimizer、scheduler、rng、两组 metadata | 嵌套 dict（ShardedTensor / ShardedObject / 普通值） | 模型和优化器的 `sharded_state_dict` | 经由它们 | 描述切分，不搬数据 | 否 | `save_distributed_checkpoint` 里的 `sharded_state_dict()` |
# | `_build_sharded_state_dict_metadata` | args、dp-cp 群 | `{distrib_optim_sharding_type, singleton_local_shards, chained_optim_avoid_prefix, dp_cp_group}` | 无 | 只放进 dp-cp 群 | 否 | 否 | 无 |
# | `get_rng_state` | ckpt_format、tp、pp、dp-cp 群 | `ShardedObject`（或 list） | `get_cuda_rng_tracker` | 读 PP、TP、dp-cp 序号 | 按 (PP, TP) 分片 | 否 | 无（simple loop 不存 RNG） |
# | `maybe_save_dataloader_state` | 训练 iterator、iteration、保存路径 | 每个 DP rank 一个 `train_dataloader_dprank<NNN>.pt`（或什么都不做） | 无 | DP 群 barrier | 按 DP rank | 否 | 无 |
# | `DistributedOptimizer.sharded_state_dict` | 模型的 sharded state dict、`is_loading`、metadata | `{optimizer: ShardedObject, param_state: ..., param_state_sharding_type}` | `sharded_param_state_<type>` | `fully_reshardable` / `dp_zero`：all-gather / gather over dp | 是：按 DP 段或按参数坐标 | 加载时分配空状态 | 无（simple loop 不存优化器） |
# | `OptimizerParamScheduler.state_dict` | 无 | 10 个键：8 个数（含 `num_steps`）和 2 个字符串（`lr_decay_style`、`wd_incr_style`） | 无 | 否 | 否 | 否 | 无 |
# | `OptimizerParamScheduler.load_state_dict` | 上面的 dict | 无（就地设 `num_steps`、学习率） | 无 | 否 | 否 | 是：学习率曲线的位置 | 无 |
# | `load_common_state_dict` / `load_tensors_metadata` / `load_plain_tensors` | 目录 | common dict / 全局 key 与形状 / 整块 tensor | 加载 strategy | 前两个否；`load_plain_tensors` 要默认群 | 否（读整块） | 否 | 无 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 关注 2：一片的坐标（TP2·PP2·DP2，8 个 rank）
#
# 先看坐标，后面三条都建立在它上面。2 层的小 `GPTModel`（词嵌入与输出层共享），每个 rank 只建自己的 stage，调
# `model.sharded_state_dict()`——正式入口存模型时调的就是它。一个条目是一个 `ShardedTensor`：本地的片，加上它在**全局**
# tensor 里的位置，由 `from_rank_offsets` 从"这一维切成 n 块，我是第 i 块"算出。rank 5（tp=1、pp=1、dp=0）的
# `linear_qkv.weight`：本地 [24, 16]，第 1 层（共 2 层）的第 1 个 TP 半块：

# %%
piece = ShardedTensor.from_rank_offsets(
    "decoder.layers.self_attention.linear_qkv.weight", torch.empty(24, 16),
    (0, 1, 2),            # 最前面加的"层"维：第 1 层，共 2 层（PP 坐标落在这里）
    (1, 1, 2),            # 行（column-parallel 切的维）：第 1 块，共 2 块（TP 坐标）
    replica_id=(0, 0, 0), prepend_axis_num=1)
print(piece.global_shape, piece.global_offset, piece.axis_fragmentations)

# %% [markdown]
# 8 个 rank 上同一个参数（每个 stage 本地名为 `decoder.layers.0.self_attention.linear_qkv.weight`）的真实条目，rank 5 那一行与上面相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
qkv_table(entries)

# %% [markdown]
# - **全局 key 去掉了层号**，全局形状多了最前面的"层"维 2。PP 的坐标落在这一维：stage 0、1 的本地 `layers.0` 分别是全局
#   第 0、1 层（`TransformerBlock.sharded_state_dict` 用层号作偏移）。层维的 2 来自 `num_layers`，与 PP 无关，所以换 PP 只是换"谁拿哪几块"。
# - **TP 的坐标是行的偏移**：48 行切成两半，tp=1 的偏移 24。
# - **DP 不改变偏移，只改变 `replica_id` 的第三位**：dp=1 的四个 rank 持有与 dp=0 完全相同的片，编号 `(0, 0, 1)`。
#
# `replica_id` 的三位依次是 PP、TP、DP，**全为 0 的那份才写进文件**。
# 四个有"额外副本"的条目在 8 个 rank 上（`-`：这个 stage 上没有它）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("全局 key:", special_keys(entries))
replica_table(entries)

# %% [markdown]
# - **PP 位 = 1：共享词嵌入的副本。** 最后一个 stage 的 `output_layer.weight` 存成 `embedding.word_embeddings.weight`、编号 `(1, 0, dp)`：
#   它是第一个 stage 词嵌入的拷贝，只由第一个 stage 写
#   （[language_module.py 第 503 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L503)）。
# - **TP 位 = tp_rank：TP 里的副本。** position embedding 和 final norm 不按 TP 切，两个 TP rank 各有完整一份，tp=1 的那份不写。
# - **DP 位 = dp_rank**：每个条目在 dp=1 上都是副本。
#
# 合起来，每个全局 tensor 的每个元素恰好被写一次（`replica_id` 全 0 的片都在界内、两两不相交、元素数之和等于全局 tensor 的）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
folded("12 个全局 tensor 各被写入的片数，全部恰好覆盖一次", written_table(entries))

# %% [markdown]
# **CP 坐标去哪了？** 参数在 CP 各 rank 上相同（CP 切的是序列），所以 CP 和 DP 一样只进 `replica_id` 的第三位：
# 那一位是 dp-cp 群里的序号 `cp + CP·dp`（[笔记 08](../08_parallel_state_and_rank_generator/)）。local spec 的注意力在没有
# Transformer Engine 时不支持 CP，这里用一个 `ColumnParallelLinear` 在 CP=2·DP=2 的 4 个 rank 上看：

# %%
def cp_replica_ids():
    from megatron.core.model_parallel_config import ModelParallelConfig

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    config = ModelParallelConfig(context_parallel_size=2, use_cpu_initialization=True)
    layer = ColumnParallelLinear(16, 32, config=config, init_method=torch.nn.init.zeros_, bias=False)
    # 同 generate_state_dict 的缺省 metadata：坐标里的 DP 用 dp-cp 群
    metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    return (parallel_state.get_context_parallel_rank(), parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_rank(with_context_parallel=True),
            layer.sharded_state_dict(metadata=metadata)["weight"].replica_id)


Table(["rank", "cp", "dp", "dp-cp 序号", "weight 的 replica_id"],
      [[r, *row] for r, row in enumerate(run_ranks(cp_replica_ids, 4, grid=dict(cp=2)))])

# %% [markdown]
# ### 关注 3：打开一个完整的训练 checkpoint（TP=2·DP=2，4 个 rank）
#
# 笔记 07 只存了模型。这里让正式入口自己的函数拼出整个 dict：`_build_sharded_state_dict_metadata` 选 sharding type
# （缺省 `dp_reshardable`），`generate_state_dict` 放进 args、iteration、模型、优化器、scheduler 和 RNG，再像 `save_checkpoint`
# 那样交给 `dist_checkpointing.save`。bf16 的小 GPT 包装同正式入口，先训练一步，scheduler 按样本数走 8 步：

# %%
SCHEDULE = dict(init_lr=0.0, max_lr=1e-2, min_lr=1e-3, lr_warmup_steps=8, lr_decay_steps=80, lr_decay_style="cosine",
                start_wd=0.01, end_wd=0.01, wd_incr_steps=80, wd_incr_style="constant")


def save_training_state(ckpt_dir):
    model, ddp, optimizer = optim_reshard.build(tp=2, init=True)
    random.seed(1234)                      # initialize.py 的 _set_random_seed
    np.random.seed(1234)
    args = training_state.training_args(tp=2, pp=1, dp=2, consumed_train_samples=8,
                                        no_save_optim=False, no_save_rng=False)
    dp_cp = parallel_state.get_data_parallel_group(with_context_parallel=True)
    metadata = _build_sharded_state_dict_metadata(args, dp_cp_group=dp_cp)
    try:                                   # 续训时 load_checkpoint 先要的：新优化器的 sharded state dict
        optimizer.sharded_state_dict({"model": model.sharded_state_dict()}, is_loading=True, metadata=metadata)
        fresh = "ok"
    except AssertionError as exc:
        fresh = optim_reshard.error_line(exc)
    scheduler = OptimizerParamScheduler(optimizer, **SCHEDULE)
    optim_reshard.train_step(ddp, optimizer)
    scheduler.step(increment=8)            # training.py:2522：micro-batch 数 × MBS × DP = 8 个样本
    rng = ShardedObject("rng_state", [training_state.rng_state()], (1, 2),   # 同 get_rng_state：(PP, TP)
                        (0, parallel_state.get_tensor_model_parallel_rank()), replica_id=dp_cp.rank())
    state_dict = generate_state_dict(args, [model], optimizer, scheduler, rng, iteration=1,
                                     optim_sd_kwargs=dict(metadata=metadata), model_sd_kwargs=dict(metadata=metadata))
    state_dict["num_floating_point_operations_so_far"] = 1.5e6   # 训练循环累加的 FLOPs（示意值）
    dist_checkpointing.save(state_dict, ckpt_dir, content_metadata=_clean_metadata_for_serialization(metadata))
    return fresh


ckpt = os.path.join(workdir.name, "iter_0000001")
os.makedirs(ckpt)
fresh = run_ranks(save_training_state, 4, ckpt, grid=dict(tp=2))
Table(["文件", "字节"], training_state.file_rows(ckpt))

# %% [markdown]
# - `__<rank>_0.distcp`：torch DCP 的数据文件，每个 rank 一个。dp=1 的 rank 2、3 只写自己那段优化器状态（权重和 RNG 在它们那里是副本）；
#   rank 0 的最大，因为非分片部分也在里面。
# - `.metadata`：DCP 的索引（每个全局 tensor 由哪些块组成、在哪个文件的哪一段）；它记下了保存时的绝对路径，大小随目录而变。
# - `metadata.json`：格式与版本。非分片部分（args、iteration、scheduler……）被包成 key 为 `common_state` 的 `ShardedObject`，
#   `replica_id` 取全局 rank（[`serialization.py:439`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L439)），只有 rank 0 写它。
#
# > **旧版（core_v0.18.0）：** 非分片部分由 rank 0 另存为 `common.pt`（[`serialization.py:399`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/dist_checkpointing/serialization.py#L399)），
# > `metadata.json` 里还多 `common_backend` 两项；core_v0.16.1 每个 rank 两个写进程、两个 `.distcp`。
#
# 不建模型就能读 common 部分（`load_common_state_dict`，每个 rank 单独读）：

# %%
print("metadata.json:", metadata_json(ckpt))
print(".metadata 记下的 checkpoint_id 就是保存目录:", FileSystemReader(ckpt).read_metadata().storage_meta.checkpoint_id == ckpt)
common = dist_checkpointing.load_common_state_dict(ckpt)
print("opt_param_scheduler:", common["opt_param_scheduler"])
Table(["common_state 里的 key", "类型", "值"], training_state.common_rows(common))

# %% [markdown]
# scheduler 的 10 个键里 8 个是数、`lr_decay_style`、`wd_incr_style` 是字符串；`optimizer` 在 common 里只剩
# `param_state_sharding_type`——Adam 的 param_groups 依赖 DP 分组，被包成 `ShardedObject` 放进了 `.distcp`。
# 全部 `ShardedTensor`（全局 key 与全局形状，与并行度无关）：

# %%
tensors = dist_checkpointing.load_tensors_metadata(ckpt)
Table(["全局 key", "global shape", "dtype"],
      [[k.replace("gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.", "…"), s, d]
       for k, s, d in training_state.tensor_rows(tensors)])

# %% [markdown]
# 模型的 13 个 key 与笔记 07 一样（bf16）。优化器多出 6 个 fp32 的 key：`dp_reshardable` 按**桶**存，key 里的
# `dp_group_idx_<i>` 是这个 rank 在 model-parallel（tp-pp）群里的序号（[optimizer/__init__.py 第 1173 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1173)），
# 所以 TP=2 有两组；每组三种状态（主权重 `param`、`exp_avg`、`exp_avg_sq`），全局长度 3328 是一个 TP rank 的桶去掉末尾补齐后的长度，
# 两个 DP rank 各写其中连续的一段。`ShardedObject` 的清单（不含模型层的 `_extra_state`），第一行就是 `common_state`：

# %%
objects = training_state.object_rows(load_sharded_metadata(ckpt))
print("模型层的 _extra_state 对象:", sum("_extra_state" in k for k, _ in objects))
Table(["ShardedObject key / 片", "global shape"], [row for row in objects if "_extra_state" not in row[0]])

# %% [markdown]
# `rng_state` 两片，坐标 (pp 0 of 1, tp 0/1 of 2)：**每个 (PP, TP) 一份**，DP 副本（`replica_id` = dp-cp 序号）不写；
# 与 EP 无关（[checkpointing.py 第 445–451 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L445-L451)）。
#
# > **旧版（core_v0.16.1）：** EP > 1 时 RNG 按 (PP, TP, DP) 存，每个 DP rank 一片、`replica_id` 为 0，只有 EP = 1 才是每个 (PP, TP) 一份
# > （[checkpointing.py 第 365–375 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/training/checkpointing.py#L365-L375)）。
#
# 最后把所有 tensor 整块读出（`load_plain_tensors` 要默认进程群，放在 1 个 rank 上）：4 个 rank 写的 checkpoint 被 1 个 rank 完整读回。

# %%
def read_whole(ckpt_dir):
    return training_state.size_rows(dist_checkpointing.load_plain_tensors(ckpt_dir))


Table(["部分", "元素", "字节"], run_ranks(read_whole, 1, ckpt)[0])

# %% [markdown]
# **关注 1 的答案，用字节说话。** 缺省的 `torch_dist` checkpoint 是**分片的训练状态**，模型权重只占一小部分：bf16 权重
# 2 字节 / 参数，fp32 主权重和 Adam 两个动量 12 字节 / 参数，再加每个参数对齐到 64 元素的补齐（[笔记 15](../15_distributed_optimizer/)）。
# "model-only" 不是另一种格式：保存时 `--no-save-optim` 去掉 optimizer **和** scheduler（[checkpointing.py 第 1338 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1338)），
# `--no-save-rng` 去掉 RNG（[checkpointing.py 第 1374 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1374)），剩下的仍是分片的 `torch_dist`；加载时 `--finetune`
# 把 iteration 置 0，不读优化器、scheduler、RNG 和 `consumed_train_samples`。`--ckpt-convert-format` 加 `--ckpt-convert-save`
# （[training.py 第 2267 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2267)）照常加载、按当前命令行再存一次就退出：换的是格式和 sharding type，内容不变。
#
# **scheduler 跟着 optimizer 走。** `load_checkpoint` 只在 optimizer 分支里恢复 scheduler：分支要求不是 `--no-load-optim`，
# scheduler 还要求不是 `--finetune`（[checkpointing.py 第 2555 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2555)、[checkpointing.py 第 2598 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2598)）。
# 否则 scheduler 就是按命令行新建的那个。同样的超参，一个读回 checkpoint 的状态，一个不读：

# %%
def new_scheduler():   # 正式入口由 get_optimizer_param_scheduler 按命令行建；优化器只用来放学习率
    return OptimizerParamScheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0), **SCHEDULE)


resumed, skipped = new_scheduler(), new_scheduler()
resumed.load_state_dict(common["opt_param_scheduler"])
print("iteration:", common["iteration"], " consumed_train_samples:", common["args"].consumed_train_samples)
for name, s in (("缺省续训", resumed), ("--no-load-optim / --finetune", skipped)):
    print(f"{name}: num_steps {s.num_steps}, lr {s.get_lr(s.optimizer.param_groups[0])}")

# %% [markdown]
# `--finetune` 本来就要从头开始（iteration、样本数、学习率一起归零）。`--no-load-optim` 不一样：iteration 和
# `consumed_train_samples` 照样接着走（[checkpointing.py 第 2473 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2473)、[checkpointing.py 第 2499 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499)），
# 学习率却从 warm-up 起点重来。`--override-opt-param-scheduler`、`--use-checkpoint-opt-param-scheduler` 救不了它：
# 两者只在 `OptimizerParamScheduler.load_state_dict` 里起作用，而它没被调用。
#
# 四项各自的去处和恢复条件：
#
# - **optimizer**：`.distcp` 里最大的一块。不是 `--finetune`、没有 `--no-load-optim` 才读；(TP, PP) 变了还要求 sharding type 完全可重切（关注 4）。
# - **scheduler**：10 个键在 `common_state`。`num_steps` 数的是**样本**，恢复时总是取 checkpoint 的值，所以换 DP 后只要 global batch
#   不变，学习率曲线照常接上；其余超参缺省要求命令行与 checkpoint 一致，上面两个开关改用命令行或 checkpoint 的值。
# - **RNG**：每个 (PP, TP) 一份。只在 (TP, PP) 与 checkpoint 相同、且没有 `--finetune` / `--no-load-rng` 时加载
#   （[checkpointing.py 第 2172 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2172)）；否则打印一行 "RNG state will be ignored"，继续训练。
# - **数据进度**：内置的 GPT 数据管线没有 loader 状态，进度就是 `args.consumed_train_samples`：`MegatronPretrainingSampler`
#   从第 `consumed_samples` 个全局样本接着切 `micro_batch_size × DP` 的块，DP 变了也接得上。`maybe_save_dataloader_state`
#   只在拿到保存路径时才存：GPT 的参数里没有 `--dataloader-save`（只有多模态示例加了它，[multimodal_args.py 第 20 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/multimodal/multimodal_args.py#L20)），
#   `save_checkpoint` 传进去的是 `None`，函数第一行就返回；给了路径而 loader 没有 `save_state`，它报错而不是跳过：

# %%
loader = RerunDataIterator(iter(range(4)))       # 训练循环交给 save_checkpoint 的 iterator
print("没有保存路径:", maybe_save_dataloader_state(loader, 1, None))
try:
    maybe_save_dataloader_state(loader, 1, os.path.join(workdir.name, "dataloader"))
except RuntimeError as exc:
    print("给了路径:", optim_reshard.error_line(exc))

# %% [markdown]
# 另外还有 `rerun_state_machine`（本篇没放），只在 world、TP、PP、DP 全部不变时加载（[checkpointing.py 第 2286 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2286)）。

# %% [markdown]
# ### 关注 4：换并行度加载——权重与优化器状态
#
# 权重总能换切法：加载方用**自己的**模型生成 sharded state dict，`load` 按这些坐标读区间（笔记 07 的 TP2→TP1/TP4）。
# 优化器状态不一样。`DistributedOptimizer` 的 Adam 状态是按 DP 切开的**扁平桶**（笔记 15），怎么把它描述成 `ShardedTensor`，
# 由 `metadata["distrib_optim_sharding_type"]` 决定：缺省 `dp_reshardable` 按桶存，`fully_reshardable` 按模型参数的坐标存。
#
# <details><summary>这个 tag 认得的 5 种 sharding type</summary>
#
# - `dp_reshardable`（正式入口的缺省）：桶空间，key 带 `dp_group_idx`（TP×PP 坐标），每个 DP rank 写自己那段。
# - `fully_reshardable`（`--dist-ckpt-optim-fully-reshardable`）：模型空间，先在 DP 群里收齐，再按模型参数的 key 和坐标存。
# - `dp_zero_gather_scatter`（已弃用，老 checkpoint 的兜底）：DP rank 0 收齐后存成一个 `ShardedObject`。
# - `fully_sharded_model_space`（已弃用，Core 在没给 metadata 时的缺省）：模型空间，每个 DP rank 存参数展平后的一段。
# - `fsdp_dtensor`：Megatron FSDP 专用（本篇不涉及）。
#
# </details>
#
# 前四种各做一次：保存方训练两步 Adam 后保存，加载方新建模型和优化器、加载，再与保存时逐元素比较。先换 DP：DP=2 存，DP=4 读：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
dp_change = optim_reshard.reshard_optimizer_state(dict(dp=2), dict(dp=4),
                                                  optim_reshard.SHARDING_TYPES)
display(Table(optim_reshard.COMPARED, optim_reshard.rows(dp_change, optim_reshard.COMPARED),
              title="TP=1·DP=2 存 → TP=1·DP=4 读：加载后与保存时逐位相同？"))
Table(["sharding_type", "报错（第一行）"], optim_reshard.error_rows(dp_change))

# %% [markdown]
# 再换 TP：TP=2 存，TP=1·DP=2 读（world 不变，布局变了）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
tp_change = optim_reshard.reshard_optimizer_state(dict(tp=2), dict(tp=1, dp=2),
                                                  optim_reshard.SHARDING_TYPES)
display(Table(optim_reshard.COMPARED, optim_reshard.rows(tp_change, optim_reshard.COMPARED),
              title="TP=2·DP=1 存 → TP=1·DP=2 读：加载后与保存时逐位相同？"))
Table(["sharding_type", "报错（第一行）"], optim_reshard.error_rows(tp_change))

# %% [markdown]
# 读这两张表：
#
# - **权重**在每个加载成功的类型里都逐位相同。**`dp_reshardable`**（缺省）能换 DP、不能换 TP：TP=1 的 rank 要的
#   `dp_group_idx_0` 桶长 5888，文件里的是 TP=2 的 3328，DCP 的形状检查报错；正式入口更早一步就抛 `RuntimeError`
#   （[checkpointing.py 第 2251 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251)）。
# - **`fully_reshardable`** 两种改变都扛得住：存的是与模型参数同 key、同坐标的 tensor，加载方按自己的坐标读、再按自己的 DP 段截取。
# - **`dp_zero_gather_scatter`** 能换 DP，换 TP 时在 DP rank 0 上断言桶长相等而失败；**`fully_sharded_model_space`** 连保存都不行（坑 2）。
# - **`adam_step` 不全是 2**：`dp_reshardable` 张量全对，步数却是加载方自己的 1（坑 3，只在没有 TE / Apex 的 torch Adam 上）。
#
# **已经存成 `dp_reshardable` 的 checkpoint 怎么换 TP / PP？** 不能靠 `--no-load-optim`（它连 scheduler 一起丢掉）。
# 办法是先在**原来的**并行度下读一次、带上 `--dist-ckpt-optim-fully-reshardable` 再存一次：加载时的 sharding type 取自
# checkpoint（[checkpointing.py 第 2198 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2198)），保存时的取自当前命令行（[checkpointing.py 第 744 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L744)）；
# `--ckpt-convert-format torch_dist --ckpt-convert-save DIR` 正好是"读完就存、然后退出"。之后在新的 TP / PP 上读新目录，
# optimizer 和 scheduler 都回来。TP=2 存 `dp_reshardable` → TP=2 读、另存 `fully_reshardable` → TP=1·DP=2 读：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
converted = convert_then_reshard(dict(tp=2), dict(tp=1, dp=2))
Table(optim_reshard.COMPARED, optim_reshard.rows([converted], optim_reshard.COMPARED),
      title="TP=2 存 dp_reshardable → TP=2 转存 fully_reshardable → TP=1·DP=2 读")

# %% [markdown]
# 三个张量逐位回来了。`adam_step` 是 1 而不是 2，原因同上：转存前那次 `dp_reshardable` 加载在 torch Adam 上丢了步数；
# 有 TE 的 FusedAdam 把步数放在 param_groups 里，不受影响。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 保存时的通信（上面 DP=2 的那次 `dp_reshardable` 保存，rank 0 上记下的）。只有 DCP 自己的协调：交换分片清单、收集写计划、
# 写完后汇总存储信息，都是 pickle 后的字节，不搬运任何状态 tensor。每次 object 交换先用 `[1]` 交换长度，再交换 `[n]` 个字节：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
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
# （S/d = 2944 是一个 DP rank 的段长，含补齐），之后每个 rank 都有完整的状态、按模型坐标只写主副本那份：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(optim_reshard.payload_as_n(by_type["fully_reshardable"]["save_calls"][:3]), meanings,
                    ranks=False)

# %% [markdown]
# 加载 `dp_zero_gather_scatter`（DP=4）时，DCP 只把完整的桶读到 DP rank 0，再由 Megatron 在 DP 的 gloo 群里 scatter：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(optim_reshard.payload_as_n(by_type["dp_zero_gather_scatter"]["load_calls"][-3:]), meanings,
                    ranks=False)

# %% [markdown]
# <details><summary>各类条目的坐标由谁决定（小结）</summary>
#
# - **模型条目**：全局 key + 全局形状（与并行度无关），本地片 + `global_offset`；TP 坐标给切分维的偏移，PP 坐标给层维的偏移。
# - **`replica_id`**：`(PP 副本号, TP 副本号, dp-cp 序号)`，全 0 才写；来自共享权重、TP 里的复制、DP / CP 副本。
# - **`dp_reshardable` 的优化器条目**：key 带 `dp_group_idx`（tp-pp 序号），全局长 = 桶长（去掉末尾补齐）；DP 坐标选偏移。
# - **`fully_reshardable` 的优化器条目**：与模型条目同坐标，key 前缀 `optimizer.state.<state>.`。
# - **`rng_state`**：`ShardedObject`，形状 (PP, TP)，副本号 = dp-cp 序号。**`common_state`**：rank 0 写，各 rank 单独读。
#
# </details>

# %% [markdown]
# ## 机制解释
#
# **为什么权重总能换切法。** 每个模型条目用"全局 tensor 的哪一块"描述自己，而全局 tensor 的 key 和形状与并行度无关
# （层号折进层维、TP 切分折进偏移、副本折进 `replica_id`）。保存方写出的是全局 tensor 的若干块；加载方提出的是另一组块，
# DCP 负责把两组块对上。
#
# **为什么 `dp_reshardable` 只能换 DP。** 它存的是分布式优化器内部的桶：一个 TP×PP 坐标一个桶（key 里的 `dp_group_idx`），
# 桶里参数的顺序和每个参数起点对齐到 64 的补齐都取决于这个 rank 持有的参数形状——TP 一变，桶的长度和布局全变
# （3328 对 5888）。DP 一变，桶本身不变，只是每个 DP rank 拥有的那一段（偏移 = dp_rank × 段长）换了位置，
# 而全局长度特意取"去掉末尾 DP 补齐"的长度。所以存、读都不需要通信。
#
# **`fully_reshardable` 的代价。** 保存时每个 DP rank 都收齐整个优化器状态（上面的三次 all-gather，内存随之放大；
# `--distrib-optim-fully-reshardable-mem-efficient` 改用 gloo 只收到 DP rank 0）；加载时每个 rank 读出自己模型参数的**整块**状态，
# 再展平、截取自己那段。换来的是与模型一样的坐标，TP、PP、DP 都能换。
#
# **sharding type 在哪一刻定下。** 保存时由**当时**的命令行定，并作为 `content_metadata` 写进 common state；加载时由
# checkpoint 里记下的那个定。所以将来可能换 TP / PP 的训练，应当从一开始就加 `--dist-ckpt-optim-fully-reshardable`；
# 已经存成 `dp_reshardable` 的，就在原来的 TP / PP 下带着这个开关转存一次。

# %% [markdown]
# ## 与训练主链路的关系
#
# `train` 循环每 `--save-interval` 步经 `save_checkpoint_and_time` 调一次 `save_checkpoint`；`setup_model_and_optimizer`
# 在建好模型、优化器、scheduler 之后调 `load_checkpoint`（[training.py 第 2199 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)），
# iteration、scheduler 的 `num_steps`、`consumed_train_samples` 分别决定循环、学习率、数据从哪里继续。simple loop（笔记 01）
# 只存、只读模型，对应"model-only"的那一种。

# %% [markdown]
# ## 与基础知识的连接
#
# - **Adam 的状态**：每个参数两个动量，加上混合精度的 fp32 主权重，所以 optimizer 比 model 大得多；续训要它们原样回来。
# - **ZeRO-1**：分布式优化器按 DP 切状态（笔记 15）；checkpoint 要么保留这种切法（`dp_reshardable`），要么先还原成"每个参数一份"（`fully_reshardable`）。
# - **torch.distributed.checkpoint（DCP）**：`.metadata` + `.distcp` 是 DCP 的布局；"全局 tensor 的一块"是 DCP 的语言，
#   Megatron 的 `ShardedTensor` 负责把 TP / PP / DP 坐标翻译成它。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **`--no-load-optim` 连 scheduler 一起不读（运行见关注 3）。** iteration 接着走，学习率却从 warm-up 起点重来（0.01 → 0.0）：
#    拿它绕过 `dp_reshardable` 不能换 TP / PP 的限制，等于悄悄重启了学习率曲线。
# 2. **`fully_sharded_model_space` 在这个 tag 上存不了（运行见关注 4 的报错表）。** 它是 `DistributedOptimizer.sharded_state_dict`
#    在 metadata 里没有类型时的缺省（[distrib_optimizer.py 第 1510 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1510)），但它给每片设 `flattened_range`（[distrib_optimizer.py 第 2037 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2037)），
#    而 `ShardedTensor` 的校验对任何 `flattened_range` 一律抛 `CheckpointingException`（[mapping.py 第 134 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L134)）。
#    直接调 Core 而不传 metadata 的人会撞上；`load_checkpoint` 也仍把某些老 checkpoint 当成这种类型（[checkpointing.py 第 2223 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2223)）。
# 3. **没有 Transformer Engine / Apex 时，`dp_reshardable` 不恢复 Adam 的步数（运行见关注 4 的 `adam_step` 列）。** torch Adam
#    把 `step` 存在每个参数的状态里。`load_state_dict` 先把它设成保存时的值（[distrib_optimizer.py 第 1032 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1032)），
#    随后 `load_parameter_state_from_dp_reshardable` 又逐键拷回一个 `step`，而它在保存格式里是 `LocalNonpersistentObject`
#    （[distrib_optimizer.py 第 1953–1956 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1953-L1956)），装的是**加载方**自己的旧值。步数进入 Adam 的偏差修正（1 − β^t），续训第一步因此算错。
# 4. **同样没有 TE / Apex 时，新建的分布式优化器拿不出加载用的 sharded state dict。** `state_dict()` 要从 torch Adam 的
#    每参数状态里取出唯一的 step（[distrib_optimizer.py 第 839 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L839)），新优化器还没有状态，断言失败；
#    `load_checkpoint` 续训时正是先要这个。关注 3 那次保存前，新优化器的 `sharded_state_dict(is_loading=True)`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("新优化器的 sharded_state_dict(is_loading=True):", fresh[0])

# %% [markdown]
# <details><summary>另外三个坑：fp32 加载要 no_grad、过时的报错提示、dp_zero 换 TP 时挂住</summary>
#
# 5. **fp32 参数 + `dp_reshardable` 的加载要在 `torch.no_grad()` 下。** fp32 时主权重是模型参数的 view
#    （[distrib_optimizer.py 第 467 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L467)，没有 `detach`），`load_parameter_state_from_dp_reshardable`
#    （[distrib_optimizer.py 第 2061 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2061)）原地拷贝却没有 `@torch.no_grad()`，
#    而 `fully_reshardable` 和 `fs_model_space` 的加载函数有（[distrib_optimizer.py 第 2358 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2358)、[distrib_optimizer.py 第 2095 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2095)）。
#    对需要梯度的叶子参数的 view 做 in-place 操作，autograd 报错；bf16 / fp16 的主权重是独立的拷贝，不受影响。
# 6. **过时的提示。** (TP, PP) 变了时的 `RuntimeError`（[checkpointing.py 第 2251 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2251)）建议"保存时用 `--ckpt-fully-parallel-save`"，
#    但这个参数已经弃用、不起作用（[arguments.py 第 1712 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1712)）；真正决定可否重切的是
#    [`training_config.py:592`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/config/training_config.py#L592) 的
#    `dist_ckpt_optim_fully_reshardable`。[arguments.py 第 1720 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1720) 那条"非并行保存就不能换并行度"的警告也来自旧的实现。
# 7. **`dp_zero_gather_scatter` 换 TP 且 DP > 1 时会挂住。** 桶长的比较只在 DP rank 0 上做（[distrib_optimizer.py 第 2290 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2290)），
#    其余 rank 已经进了 scatter，rank 0 抛错后它们永远等下去。
#
# </details>
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 坑 3、4 在 GPU 上有 TE 的 FusedAdam 时不出现。本篇的加载方先调 Megatron 自己的 `_init_optimizer_states_with_dummy_values()`
#   （它在 `fsdp_dtensor` 路径里也这么做，[distrib_optimizer.py 第 1643 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1643)）让新优化器有一个 step，再按坑 5 在 `torch.no_grad()` 下加载。
# - torch Adam 的 `step` 还让 `fully_reshardable` 和 `dp_zero_gather_scatter` 的加载在 `step` 上 `KeyError`：
#   `_set_main_param_and_optimizer_states` 逐键拷贝（[distrib_optimizer.py 第 1218–1225 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1218-L1225)），
#   而这两种格式只带回 param / exp_avg / exp_avg_sq。CPU 补丁 `distrib_optimizer_torch_adam_step` 让缺失的 step 保持原值；
#   它们保存时的 `.cuda()` 由 `distrib_optimizer_gather_cuda` 处理（[CPU 补丁一览](../../cpu/)）。
# - 坑 7 的挂起：`optim_reshard` 先让 DP rank 0 把存下的桶长广播给同组的 rank，不符时一起停下，再把 rank 0 上 Megatron 的原话报出来。
# - `torch_dist` 的写入器第一次用时 spawn 一个 multiprocessing Manager 来建结果队列
#   （[filesystem_async.py 第 64–65 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L64-L65)），好让异步保存的别的进程也能写回结果，它一直活到进程结束。
#   同步保存时写入就在本进程里，每个 CPU rank 换成一个普通的线程队列（`rank_env.use_local_writer_queue`）：每次保存省下约 2 秒，
#   rank 以 `os._exit` 结束时也不会留下孤儿 Manager。
# - RNG 里的 `cuda_rng_state` 存的是 CPU 生成器（CPU 上 dropout 和初始化就从它取数）。
# - 尺寸为了笔记本电脑：2 层、hidden 16、4 个头、vocab 32、序列 8、每次 4 个 micro-batch，world 最多 8 个 rank。
#
# </details>

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
# `dp_reshardable` 的步数没回来（坑 3）；换 TP：只有 `fully_reshardable`，步数也对。
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

# %% [markdown]
# **6. 为了在新的 TP 上读一个 `dp_reshardable` 的 checkpoint，加了 `--no-load-optim`。续训的 iteration 从几开始、第一步的学习率是多少？**
#
# <details><summary>答案</summary>
#
# iteration 接着 checkpoint 的 1 走，但 scheduler 没被读：`num_steps` 为 0，学习率是 warm-up 起点 0.0（正常续训是 0.01）。
# Adam 的动量也从零开始。应当在原来的 TP 下带 `--dist-ckpt-optim-fully-reshardable` 转存一次再换 TP。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(common["iteration"], skipped.num_steps, skipped.get_lr(skipped.optimizer.param_groups[0]),
      resumed.get_lr(resumed.optimizer.param_groups[0]))
workdir.cleanup()

# %% [markdown]
# ## 30-second answer
#
# By default Megatron saves sharded training state: args, iteration, model, distributed-optimizer state, scheduler
# and one RNG state per (PP, TP), in `torch_dist`; model-only is the same save with `--no-save-optim --no-save-rng`.
# Every tensor is a `ShardedTensor`: a global key and shape, an offset from TP and PP, and a `replica_id` of
# (PP, TP, DP·CP); only all-zero replicas are written. Data progress is just `consumed_train_samples`. Weights
# reshard freely; `dp_reshardable` optimizer state (the default) survives a DP change only, `fully_reshardable`
# also TP/PP. `--no-load-optim` drops the LR schedule too, so re-save with `--dist-ckpt-optim-fully-reshardable`.
