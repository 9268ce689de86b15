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
# # 07 Checkpointing：TP=2 存的权重为什么能直接装进 TP=1、TP=4？
#
# 正式入口的 `save_checkpoint` 把训练状态交给 Megatron Core 的 `dist_checkpointing.save`。文件里记的是什么，才让 TP=2 存下的
# checkpoint 不用转换脚本就能装进 TP=1 或 TP=4 的模型？每个 rank 写哪几片，存和读时 rank 之间又交换了什么？
# 本篇是入门：在 CPU rank 上真存、真读一个小 `GPTModel`。格式选择、换 TP / PP 时优化器状态的报错、异步保存等细节在
# [笔记 21](../21_checkpoint_topic/)。

# %% [markdown]
# ## 阅读目标
#
# 1. 读懂 `sharded_state_dict` 的一项：全局 key、全局形状、本地片的偏移、`replica_id`，以及它们与 TP / PP / DP 坐标的对应。
# 2. 说清 `dist_checkpointing.save` 让谁写哪几片、目录里有哪些文件、存和读时 rank 之间交换什么。
# 3. 说清为什么换 TP 加载不需要转换：加载方按**自己的**切法要区间。
# 4. 知道正式入口在模型之外还存了什么，换并行度时哪些东西跟不过来。
#
# **结论**
#
# - 每个参数是一项 `ShardedTensor`：全局 key + 全局形状 + 本地片的偏移 + `replica_id`；TP=2 时 rank 1 的 qkv 是 (2, 48, 16) 里偏移 24 的 (24, 16)。
# - 各层同名参数合成一个全局 key、前面多一维层号：一个 rank 有 21 个 `ShardedTensor`，文件里只有 13 个全局 tensor。
# - 只写 `replica_id` 全为 0 的片：rank 0 写 21 个、rank 1 写 10 个，目录里只有 2 个 `.distcp` 加两个 metadata 文件。
# - 加载方用自己的 `sharded_state_dict` 要区间：TP=1 从两块拼出 48 行，TP=4 每个 rank 只读一块里的 12 行，logits 与保存时一致。
# - 存 11 次、读 2 次集合通信，都在默认群上交换 pickle 后的分片描述和写计划（phase 是 checkpoint），没有一个权重经过网络。
# - 分布式优化器 DP=2 存、DP=1 读：正式入口缺省的 `dp_reshardable` 张量全对，但 torch Adam 的 step 读回 1 而不是 2。
#
# 先读：[笔记 04](../04_model_provider_and_gpt_model/)（`GPTModel` 怎么建）、[笔记 10](../10_column_row_parallel_linear/)（Column / Row 沿哪一维切）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import importlib.metadata
import shutil
import tempfile

import torch
from IPython.display import Markdown

from snippets.ckpt import optim_reshard
from snippets.ckpt.pictures import chunk_writers, draw_reshard
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n07_checkpoint import (LOCAL_QKV, MEANINGS, QKV, build_gpt, chunks_table, entries_table,
                                             load_at, load_row, load_table, logits, run, save_at, stored_table,
                                             wants_rows, wants_table, written_table)
from snippets.ranks.launch import run_ranks
from snippets.record import recorder
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

from megatron.core import dist_checkpointing, parallel_state

TINY = EXPERIMENTS["checkpoint"].tiny
ckpt_dir = tempfile.mkdtemp(prefix="ckpt-tp2-")
results = run_ranks(run, 2, TINY, Parallel(world=2, tp=2), ckpt_dir=ckpt_dir, grid=dict(tp=2))  # TP=2 存，TP=1 读
tp4 = run_ranks(load_at, 4, TINY, 4, ckpt_dir, grid=dict(tp=4))  # 同一个目录，TP=4 读
shutil.rmtree(ckpt_dir)
saved = results[0]["saved"]
rank0, rank1 = ({row[0]: row for row in r["rows"]} for r in results)
wants = (wants_rows("TP=2 → TP=1", [r["loads"][0]["wants"] for r in results], saved)
         + wants_rows("TP=2 → TP=4", [out["wants"] for out in tp4], saved))
draw_reshard(chunk_writers([r["rows"] for r in results], LOCAL_QKV, saved["chunks"][QKV]), wants,
             title="TP=2 存，TP=1 / TP=4 读：第 0 层 linear_qkv.weight 的每一行读自哪一块", scale=3)

# %% [markdown]
# 第 0 层 `linear_qkv.weight` 的 48 行从上到下：左边是 TP=2 保存时的两块（颜色 = 写它的 rank），右边每根竖条是一个加载 rank
# 要的行，按它读自哪一块上色。文件一个字节也没改，换的只是"谁要哪一段"。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n07_checkpoint.py`（实验名 `checkpoint`）：`build_gpt` 按给定 TP 建 local spec 的 `GPTModel`，
#   `save_at` 用 `model.sharded_state_dict()` + `dist_checkpointing.save` 存，`load_at` 用另一个 seed 建模型（加载前 logits 不同），
#   再 `dist_checkpointing.load` + `load_state_dict`。`logits` 让每个 rank 算自己那 1/TP 的 vocab 列，再在 TP 群里拼回完整 vocab，
#   所以不同 TP 的结果能直接比较。`run` 在 2 个 rank 上 TP=2 存、TP=1 读（两个 TP=1 rank 互为 DP 副本）；同一个目录再在 4 个 rank 上
#   用 `load_at` 按 TP=4 读，读完删掉。目录由 `tempfile` 建，打印的东西里不含路径。
# - 存完 rank 0 用 `snippets.ckpt.checkpoint_view` 读目录：文件名、`metadata.json`、`.metadata` 里的全局 tensor 和块。
#   图由 `snippets/ckpt/pictures.py::draw_reshard` 从"每个加载 rank 要哪一块"那张表画出。
# - 通信表由 `snippets.record.recorder` 录下，phase 按发出它的 Megatron 代码归类（`dist_checkpointing` 里的是 checkpoint）。
# - 优化器的那次运行在 `snippets/ckpt/optim_reshard.py`：DP=2 用分布式优化器训两步、按两种格式各存一份，DP=1 读回逐位比较。
# - 尺寸是实验的 `tiny`：2 层、hidden 16、4 个 head、vocab 32、sequence 8、micro-batch 2。rank 是本机 gloo 进程
#   （`snippets.ranks.launch.run_ranks`）。复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 checkpoint --dims tiny --tp 2`
#   打印本页 TP=2 存、TP=1 读的表；`scripts/execute_notes.sh notes/07_checkpointing.py` 重新执行整页。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_gpt, logits, save_at, load_at, run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`checkpointing.py::save_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L552) | 正式入口的保存：拼 state dict，选格式，写 tracker 文件 |
# | [`checkpointing.py::load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066) | 正式入口的加载：读 tracker，用当前模型生成 sharded state dict，读回后 `load_state_dict` |
# | [`serialization.py::save`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L349) | Core 的保存入口 |
# | [`serialization.py::load`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L69) | Core 的加载入口 |
# | [`mapping.py::ShardedTensor`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L52) | 本地 tensor + 它在全局 tensor 里的位置 |
# | [`gpt_model.py::GPTModel.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L873) | 模型级入口 |
# | [`transformer_block.py::TransformerBlock.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L711) | 去掉层号，加一个"层"维偏移 |
# | [`utils.py::make_tp_sharded_tensor_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L973) | TP 切开的参数：TP 维偏移，`replica_id = (0, 0, dp_cp_rank)` |
# | [`utils.py::make_sharded_tensor_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1094) | 每个 TP rank 一份完整的参数：`replica_id = (0, tp_rank, dp_cp_rank)` |
#
# <details><summary>其余符号（11 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`checkpointing.py::generate_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1296) | 把 args、iteration、model、optimizer、scheduler、rng 放进一个 dict |
# | [`checkpointing.py:827`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L827) | `torch_dist` 格式时调用 `dist_checkpointing.save` |
# | [`checkpointing.py:1601`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1601) | 调用 `dist_checkpointing.load` |
# | [`checkpointing.py::get_checkpoint_name`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L195) | `iter_0000100` 这样的子目录名 |
# | [`checkpointing.py::get_checkpoint_tracker_filename`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L340) | `latest_checkpointed_iteration.txt` |
# | [`checkpointing.py::_build_sharded_state_dict_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L468) | 选优化器的 sharding type（缺省 `dp_reshardable`） |
# | [`mapping.py::ShardedObject`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/mapping.py#L360) | 不是 tensor 的状态（`_extra_state`、RNG、`common_state`） |
# | [`layers.py::ColumnParallelLinear.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1217) | 权重沿第 0 维按 TP 切 |
# | [`layers.py::RowParallelLinear.sharded_state_dict`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1496) | 权重沿第 1 维按 TP 切 |
# | [`utils.py::make_sharded_tensors_for_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L95) | 一个模块的 state dict → `ShardedTensor` / `ShardedObject` |
# | [`torch.py::TorchDistLoadShardedStrategy.load`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/torch.py#L943) | 翻译成 torch DCP 的请求后 `no_dist=True` 地读 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 保存：`save_checkpoint` → `generate_state_dict`（模型部分是 `model.sharded_state_dict()`）→ `dist_checkpointing.save`；
# 加载：`load_checkpoint` → 用**当前**模型的 `sharded_state_dict()` 说明要什么 → `dist_checkpointing.load` → `load_state_dict`。
#
# <details><summary>完整调用链</summary>
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
# │  └─ optimizer.sharded_state_dict(model_sd)                    # 优化器状态跟着参数的 ShardedTensor 走（笔记 15、21）
# ├─ dist_checkpointing.save(state_dict, iter_XXXXXXX/)            # 每个 rank 只写 replica_id 全为 0 的片
# │  ├─ determine_global_metadata / _validate_common_state_dict    # all_gather 分片描述、broadcast 非分片部分
# │  ├─ 非 tensor 部分包成 ShardedObject "common_state"            # replica_id = 全局 rank，只有 rank 0 的那份写盘
# │  ├─ torch.distributed.checkpoint 写 __<rank>_0.distcp + .metadata   # gather 写计划和写出结果到 rank 0
# │  └─ metadata.json                                              # rank 0 最后写格式说明
# └─ 写 latest_checkpointed_iteration.txt                          # rank 0
#
# megatron/training/checkpointing.py::load_checkpoint
# ├─ 读 tracker → iteration → iter_XXXXXXX/
# ├─ generate_state_dict(...)  用**当前**模型的 sharded_state_dict 作为"要什么"
# ├─ dist_checkpointing.load(sharded_state_dict, dir)
# │  ├─ load_common_state_dict                                   # 每个 rank 自己从 .distcp 读出 "common_state"
# │  ├─ determine_global_metadata                                # all_gather 分片描述，核对
# │  └─ TorchDistLoadShardedStrategy.load → checkpoint.load(no_dist=True)   # 按本地偏移读区间，不通信
# └─ model.load_state_dict(state_dict['model'])、optimizer.load_state_dict(...)
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `save_checkpoint` | iteration、model、optimizer、scheduler | 磁盘上的 `iter_XXXXXXX/` 与 tracker 文件 | `sharded_state_dict`、`dist_checkpointing.save` | 是（tp、pp、dp-cp 群算 replica_id；保存时在默认群上协调） | 按 ShardedTensor 写片 | 否（只读状态） | `save_distributed_checkpoint` |
# | `load_checkpoint` | 空的或随机的 model、optimizer | iteration；模型 / 优化器被原地填好 | `sharded_state_dict`、`dist_checkpointing.load` | 是 | 按当前并行度读片 | 是（覆盖权重与优化器状态） | `load_distributed_checkpoint` |
# | `GPTModel.sharded_state_dict` | prefix、metadata | `{本地 key: ShardedTensor / ShardedObject}` | 各层的 `sharded_state_dict` | 读 tp、dp-cp rank 作编号 | 描述切分，不搬数据 | 否 | 两个 checkpoint 函数里 |
# | `dist_checkpointing.save` | sharded state dict、目录 | 目录里的文件 | torch DCP、保存 strategy | 是（默认群：all_gather、gather、broadcast、barrier） | 每片写一次 | 否 | 同上 |
# | `dist_checkpointing.load` | 当前模型的 sharded state dict、目录 | 普通 state dict（本地 tensor 已填好） | 同上 | 是（默认群：核对时的 all_gather） | 按本地偏移取区间 | 否（只返回 dict） | 同上 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `sharded_state_dict`：每个参数一项 `ShardedTensor`
#
# 2 层、hidden 16、4 个 head、vocab 32 的 `GPTModel`（local spec），TP=2。在两个 rank 上各问一次 `sharded_state_dict()`，
# 看几项的字段：

# %%
def one_entry_per_param(dims):
    model = build_gpt(dims, tp=2, seed=1)
    sharded_sd = model.sharded_state_dict()
    rows = []
    for key in ("decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.1.self_attention.linear_qkv.weight",
                "decoder.layers.0.self_attention.linear_proj.weight", "embedding.position_embeddings.weight"):
        entry = sharded_sd[key]
        rows.append([parallel_state.get_tensor_model_parallel_rank(), key.removeprefix("decoder."), type(entry).__name__,
                     entry.key, entry.global_shape, entry.local_shape, entry.global_offset, entry.replica_id])
    return rows


Table(["TP rank", "本地 key", "类型", "全局 key", "global shape", "local shape", "global offset", "replica_id"],
      [row for rows in run_ranks(one_entry_per_param, 2, TINY, grid=dict(tp=2)) for row in rows])

# %% [markdown]
# - **TP 切分 = 偏移**。`linear_qkv.weight`（Column）本地 `(24, 16)`，rank 1 的偏移落在去掉层维后的第 0 维：24；
#   `linear_proj.weight`（Row）在最后一维偏移 8。全局形状与并行度无关。
# - **层维**。两层的 qkv 共用一个全局 key `decoder.layers.self_attention.linear_qkv.weight`，全局形状多了最前面的一维 `2`
#   （层数），层号成了这一维上的偏移：第 1 层的偏移以 1 开头。PP 换切法时，"哪几层在我这里"只是换一段偏移。
# - **`replica_id`**。TP 切开的参数在两个 rank 上都是 `(0, 0, 0)`：各自是自己那一片的主副本
#   （[utils.py 第 1075–1076 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1075-L1076)）；
#   position embedding 不切，两个 rank 各有完整一份，rank 1 的编号是 `(0, 1, 0)`，中间一位就是 TP rank
#   （[utils.py 第 1149–1150 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1149-L1150)）。
#   最后一位是 dp-cp 群里的序号，所以 DP 副本也不会重复写。
# - **norm 改了名**。local spec 的 `input_layernorm.weight` 存成 `self_attention.linear_qkv.layer_norm_weight`：这是 Transformer
#   Engine spec 里 norm 融进 QKV 线性层后的名字（[gpt_layer_specs.py 第 459 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L459)
#   的 `sharded_state_dict_keys_map`），两种 spec 因此能互相加载。
#
# 一个 rank 的全部 29 项（21 个 `ShardedTensor`，其余是 `_extra_state` 的 `ShardedObject`）在折叠的表里。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Markdown("<details><summary>rank 0 / rank 1 的 sharded_state_dict（本页列出的几层）</summary>\n\n"
         + entries_table(results).markdown() + "\n\n</details>")

# %% [markdown]
# ### 谁写哪几片，目录里有什么
#
# `dist_checkpointing.save` 只写 `replica_id` 全为 0 的片。两个 rank 各写多少：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
written_table(results)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("目录里的文件:", saved["files"])
print("metadata.json:", saved["metadata"])

# %% [markdown]
# rank 1 的 11 个副本（position embedding、各个 norm）不写。`__<rank>_<i>.distcp` 是 `torch.distributed.checkpoint`（DCP）的数据文件：
# 保存 strategy 缺省每个 rank 一个写线程（[torch.py 第 673 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/torch.py#L673)
# 的 `thread_count=1`），所以每个 rank 一个文件。`.metadata` 记每个全局 tensor 由哪些块组成，`metadata.json` 说明格式。
# state dict 里不是 `ShardedTensor` / `ShardedObject` 的部分没有单独的文件：`save` 把它包成 key 为 `common_state` 的
# `ShardedObject`，`replica_id` 取全局 rank（[serialization.py 第 439 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L439)），
# 于是只有 rank 0 那份写进它的 `.distcp`；加载时每个 rank 单独读它（[serialization.py 第 151 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L151)）。
#
# > **旧版（core_v0.18.0）：** 非分片部分由 rank 0 另存为 `common.pt`（[serialization.py 第 399 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/dist_checkpointing/serialization.py#L399) 的 `save_common`），目录里多这一个文件；
# > core_v0.16.1 的 `thread_count` 缺省是 2，每个 rank 写两个 `.distcp`。
#
# `.metadata` 里登记的全局 tensor，名字和形状都与并行度无关（2 层 × 8 个同名参数合成 8 个带层维的 key）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
stored_table(saved)

# %% [markdown]
# 一个全局 tensor 由哪些块组成：`linear_qkv.weight` 的（层, 行）各切两半，共 4 块：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
chunks_table(saved, "decoder.layers.self_attention.linear_qkv.weight")

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 全局 tensor 的形状只由模型结构决定，如 qkv 的 `(num_layers, 3·hidden, hidden)`；本地片是当前 rank 的参数本身，TP 坐标决定沿哪一维、
# 偏移多少，PP 坐标决定层维上的偏移；`replica_id` 由 tp 群、dp-cp 群里的序号组成，非零表示"这一片别人会写"。`.distcp` 文件里只有主副本的字节。
#
# 那 rank 之间交换什么？把一次存（TP=2）和一次读（TP=1）包在记录里：

# %%
def save_then_load(dims, ckpt_dir):
    model = build_gpt(dims, tp=2, seed=1)
    with recorder.record() as saving:
        dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
    parallel_state.destroy_model_parallel()
    model = build_gpt(dims, tp=1, seed=2)
    sharded_sd = model.sharded_state_dict()  # 这个 rank 要全局 tensor 的哪一块
    with recorder.record() as loading:
        state_dict = dist_checkpointing.load(sharded_sd, ckpt_dir)
    model.load_state_dict(state_dict)
    return saving, loading


recorded_dir = tempfile.mkdtemp(prefix="ckpt-rec-")
saving, loading = run_ranks(save_then_load, 2, TINY, recorded_dir, grid=dict(tp=2))[0]  # rank 0 的记录
shutil.rmtree(recorded_dir)
print(f"rank 0 存时 {len(saving)} 次、读时 {len(loading)} 次集合通信")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(saving + loading, MEANINGS)

# %% [markdown]
# - **全是协调**：保存时先核对分片（每个 rank 的分片描述 all_gather 到所有人，rank 0 广播非分片部分让别人比对），DCP 把各 rank 的
#   写计划 gather 到 rank 0，各自写完自己的文件后 barrier，再把写出结果 gather 到 rank 0 写 `.metadata`，最后 rank 0 写
#   `metadata.json` 再对齐。"shape" 是 pickle 后的字节数（几千字节的计划），没有一个权重经过网络：每个 rank 的片直接写进自己的文件。
# - **读时更少**：Megatron 的核对做两次 all_gather（[serialization.py 第 168–171 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/serialization.py#L168-L171)），
#   DCP 本身以 `no_dist=True` 读（[torch.py 第 989 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/torch.py#L989)）：
#   每个 rank 按自己的偏移直接读文件，rank 之间不交换任何数据。
# - **群**：全在默认（world）群上，所以存和读都要求所有 rank 一起调用。

# %% [markdown]
# ## 机制解释
#
# ### 换并行度加载：TP=2 → TP=1、TP=4
#
# 加载方用**自己的**模型生成 sharded state dict，它说明"我这个 rank 需要全局 tensor 的哪一段"；`dist_checkpointing.load` 按这些
# 偏移从文件里读出对应区间，不管保存时是怎么切的，读回的是普通的本地 tensor，再交给 `load_state_dict`。加载方的模型用另一个
# seed 建，加载前 logits 不同；加载后与 TP=2 保存时一致（差在 1e-7 以内，来自不同切法下矩阵乘和 vocab 求和的顺序）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
load_table([results[0]["loads"][0]["row"], load_row(2, 4, results[0]["reference"], tp4[0])])

# %% [markdown]
# 每个加载 rank 向文件要哪一块、这一块落在保存时的哪几块里（页首的图画的就是这张表）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
wants_table(wants)

# %% [markdown]
# TP=1 的 rank 要完整的 48 行，从 TP=2 写的两块里各读一半拼起来；两个 TP=1 rank 是 DP 副本，要的是同一块。TP=4 的 rank r 要第
# 12r 到 12r+12 行，每一段都落在 TP=2 的某一块之内，只读那一块的一部分。这就是"不需要转换脚本"的全部原因：文件按全局坐标存，
# 切法只在读的时候出现。
#
# ### 正式入口多做了什么
#
# - **外层 dict。** `generate_state_dict` 在模型之外放进 `args`、`iteration`、`checkpoint_version`、`optimizer`、
#   `opt_param_scheduler`、`rng_state` 等；非 tensor 的部分进上面说的 `common_state`。
# - **目录与 tracker。** 写在 `<save>/iter_0000100/`，rank 0 再写 `latest_checkpointed_iteration.txt`；`load_checkpoint` 先读它决定加载哪一步。
# - **格式。** `--ckpt-format torch_dist` 走 `dist_checkpointing.save`（[checkpointing.py 第 765 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L765) 起的分支）；
#   老的 `torch` 格式是每个 (TP, PP) rank 一个 `mp_rank_XX/model_optim_rng.pt`，按保存时的切法存，换并行度要先转换。
# - **RNG 状态。** 每个 (PP, TP) rank 一份，存成 `ShardedObject`；并行度改变后无法一一对应，`load_checkpoint` 只在 checkpoint 的
#   (TP, PP) 与当前相同时才加载它，否则忽略（[checkpointing.py 第 2171–2177 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2171-L2177)；`--no-load-rng` 也可关掉）。
# - **优化器状态。** 分布式优化器的 Adam 状态按 DP 切成连续的扁平段（[笔记 15](../15_distributed_optimizer/)），
#   `optimizer.sharded_state_dict` 按所选格式描述它。正式入口缺省 `dp_reshardable`
#   （[checkpointing.py 第 498–505 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L498-L505)）：
#   按 DP 段存，只能换 DP；`--dist-ckpt-optim-fully-reshardable` 保存时把各段收回来、换成按参数的形状存，TP / PP 也能换。
#
# DP=2 用分布式优化器训两步 Adam，按两种格式各存一份，再在 DP=1 上新建模型和优化器读回，逐位比较：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
resharded = optim_reshard.reshard_optimizer_state(dict(dp=2), dict(dp=1), ("dp_reshardable", "fully_reshardable"))
Table(optim_reshard.COMPARED, optim_reshard.rows(resharded, optim_reshard.COMPARED),
      title="DP=2 存 → DP=1 读：加载后与保存时逐位相同？")

# %% [markdown]
# 两种格式都把权重、fp32 主权重和两个动量原样搬到了新的 DP 布局，但 `dp_reshardable` 读回的 Adam `step` 是 1 而不是 2：这个格式把
# step 当作不保存的本地对象（[distrib_optimizer.py 第 1953–1956 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1953-L1956)），
# 加载方留着自己新建优化器时的值，续训时 Adam 的偏差修正错位（本页用的是 torch 的 Adam；用 TE / Apex 的 Adam 时怎样、其余格式、
# 换 TP 时的报错，见[笔记 21](../21_checkpoint_topic/)）。`fully_reshardable` 的 step 随 `param_groups` 一起恢复。

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
# **Megatron 的坑**
#
# **1. local spec 存的是 TE 的名字。** 上面 `.metadata` 的全局 tensor 里没有 `input_layernorm`，只有
# `linear_qkv.layer_norm_weight`，来自 [`gpt_layer_specs.py:459`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L459) 的 `sharded_state_dict_keys_map`。
# 好处是 local 与 TE spec 互通；代价是直接读 `.metadata` 的外部工具看到的名字和 `model.state_dict()` 不同。
#
# **2. `dist_checkpointing.save` 需要 psutil，megatron-core 却不声明它。** 写线程开始写之前先用 psutil 量一次进程内存
# （[`filesystem_async.py:387`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L387)），
# 没有 psutil 就抛错（[`filesystem_async.py:665`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/dist_checkpointing/strategies/filesystem_async.py#L665)）；
# 而 `pip install megatron-core` 只装 torch、numpy、packaging。下面在一个 rank 上让模块以为没装 psutil，再存一次：

# %%
def save_without_psutil(dims, ckpt_dir):
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    model = build_gpt(dims, tp=1, seed=1)
    filesystem_async.HAVE_PSUTIL = False  # 和没装 psutil 的机器一样
    filesystem_async.logger.disabled = True  # 同一句报错它还会打一遍日志；这里只看抛出的异常
    try:
        dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
    except BaseException as error:  # torch DCP 的 CheckpointException 不是 Exception 的子类
        return type(error).__name__, [str(failure[0]) for failure in error.failures.values()]


psutil_dir = tempfile.mkdtemp(prefix="ckpt-psutil-")
print(run_ranks(save_without_psutil, 1, TINY, psutil_dir)[0])
shutil.rmtree(psutil_dir)
print("megatron-core 的必需依赖:", [r for r in importlib.metadata.requires("megatron-core") if "extra ==" not in r])

# %% [markdown]
# 报错是立刻的，不会卡住；在 GPU 机器上 psutil 往往已经被别的包带进来，所以这个坑常在精简的环境里才露出来。
#
# **3. `dp_reshardable` 换 DP 后 Adam 的 step 回到加载方的值。** 见上面优化器那张表：张量都对，step 不对；
# `fully_reshardable` 没有这个问题。更多格式和 TP 改变时的报错见笔记 21。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 所有 rank 是本机 gloo 进程，checkpoint 写在 `tempfile` 建的临时目录里，读完就删；保存 strategy、DCP 的文件格式与 GPU 上相同。
# - 本页的环境装了 psutil（坑 2 里是临时把 `HAVE_PSUTIL` 设成假来演示）。
# - 优化器那次运行用 bf16 模型和 torch 的 Adam（CPU 上没有 TE / Apex 的 fused Adam）：新建的优化器先用占位值初始化状态，
#   加载在 `torch.no_grad` 里做，细节在 `snippets/ckpt/optim_reshard.py` 的说明和笔记 21。
#
# </details>

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
# 2 个（2 个 rank × 缺省 1 个写线程）。加载只读，不改文件；TP=4 的 rank 从 TP=2 写的块里各读需要的区间。
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
# **6. DP=2 用分布式优化器存的 checkpoint，在 DP=1 上加载后 `exp_avg` 与保存时相同吗？Adam 的 step 呢？**
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
# dp_rank) for one every TP rank holds whole; only replica 0 is written, each rank into its own file, and the
# ranks exchange only plans. Layers share one key with a leading layer axis. Loading asks for the offsets the
# new model needs, so a TP=2 checkpoint loads into TP=1 or TP=4 with the same logits.
