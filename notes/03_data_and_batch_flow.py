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
# # 03 数据与 batch 流：从 `.bin/.idx` 到每个 rank 手里的五个张量
#
# 一次训练 step 的第一件事是取一个 micro-batch。`.bin/.idx` 里的 token 怎样变成 `tokens`、`labels`、`loss_mask`、
# `attention_mask`、`position_ids` 这五个张量？开了 TP、PP、CP 以后，谁建数据集、谁读、谁收广播，每个 rank 最后手里是什么？
# 本篇用 Megatron 的数据集类造一个三篇文档的小语料，再在 4 个和 6 个进程上真的跑 `get_batch`。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出正式入口怎样从 `args` 造出 `GPTDatasetConfig` 和 train / valid / test，`MockGPTDataset` 何时登场。
# 2. 对一个 `GPTDataset` 样本说出五个字段的 shape、dtype 与含义，`labels` 为什么是 `tokens` 错一位。
# 3. 说清 `get_batch` 里谁读数据、谁收广播、每个 pipeline stage 广播哪些字段。
# 4. 说清 CP=2 时每个 rank 留哪两块、为什么；packed 数据的 `cu_seqlens` 替代了什么。
#
# **结论**
#
# - 样本是 `s+1` 个 token 的窗口，`tokens` 取前 `s` 个、`labels` 取后 `s` 个：micro-batch 2、seq 8 时字段是 `[2, 8]`，mask 是 `[2, 1, 8, 8]`。
# - 只有首、尾 stage 的 TP rank 0 建数据集、读数据：TP=2、PP=3 的 6 个 rank 里只有 rank 0 和 4，其余只陪 builder 的 barrier。
# - 数据在 TP 群里逐字段 broadcast：PP=1 发 5 次；首 stage 发 `tokens`、`position_ids`、mask，尾 stage 发 `labels`、`loss_mask`、mask，中间不发。
# - CP=2 把序列切成 4 块，rank r 留第 r 和第 3−r 块：位置 [0, 1, 6, 7] 与 [2, 3, 4, 5]，causal attention 的工作量两边相等。
# - packed 数据不带 mask，带文档边界 `cu_seqlens`：样本 `[5, 31, 6, 7, 8, 31, 6, 7]` 是 [0, 2, 6, 8]；micro-batch 2 展平成一条 `[1, 16]`。
#
# 先读：[笔记 01](../01_training_run_overview/)（训练主链路）、[笔记 02](../02_distributed_initialization/)（TP / PP / CP 群）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import dataclasses
import tempfile

import torch

from snippets.data.batch_flow import (FIELDS, BatchArgs, BroadcastMismatch, describe,
                                      get_batch_on_this_tp_rank, paired_views)
from snippets.data.pictures import draw_batch_flow
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n03_batch_flow import (chunk_table, data_flow, receiver_table, role_table, run,
                                                 sender_table, summary_table, write_corpus)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.tokenizers import MegatronTokenizer


class Folded:
    """Reference tables: shown closed, one click away."""

    def __init__(self, summary, *tables):
        self.summary, self.tables = summary, tables

    def _repr_markdown_(self):
        body = "\n\n".join(t.markdown() for t in self.tables)
        return f"<details><summary>{self.summary}</summary>\n\n{body}\n\n</details>"

    def __repr__(self):
        return "\n\n".join(t.markdown() for t in self.tables)


TINY = EXPERIMENTS["batch-flow"].tiny
TP_CP = Parallel(world=4, tp=2, cp=2)
tp_cp = run_ranks(run, 4, TINY, TP_CP, grid=dict(tp=2, cp=2))
draw_batch_flow(tp_cp, TINY.seq, TP_CP.tp, TP_CP.cp,
                title="get_batch：TP rank 0 读数据、在 TP 群里广播；CP rank r 留第 r 和第 3−r 块")

# %% [markdown]
# TP=2、CP=2：rank 0、2 各是 TP 群的 rank 0，读同一条样本、广播给 rank 1、3；之后每个 rank 按 CP 坐标留两块（深色归 CP rank 0）。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 语料：`write_corpus` 用 Megatron 的 `IndexedDatasetBuilder` 把三篇文档写成 `.bin/.idx`，放在临时目录（路径不打印）；
#   tokenizer 是 `NullTokenizer`（词表 32，EOD 是 31）。尺寸是实验 `batch-flow` 的 `tiny`：seq 8、micro-batch 2、vocab 32。
# - 多 rank 的部分是 `snippets/experiments/n03_batch_flow.py` 的 `run`：global rank 0 写语料，路径用 `broadcast_object_list`
#   发给各 rank；每个 rank `initialize_model_parallel`，按 `is_dataset_built_on_rank` 的规则（首或尾 stage 且 TP rank 0）调
#   `BlendedMegatronDatasetBuilder`，建了数据集的 rank 建 `DataLoader`，然后调一次 `get_batch`。
# - `pretrain_gpt.get_batch` 只在 git tag 里，不在 pip 包里；`snippets.data.batch_flow` 按 tag 重写了它和 TP 广播，为的是给每次广播记下
#   字段名（"发送方依次发出"那些列）。`tests/ranks/test_batch_flow.py` 核对重写版与已安装的 `get_batch_on_this_tp_rank` 发出同样的广播；
#   展平与 CP 切分调的是真实的 `flatten_batch_for_packed_sequences`、`get_batch_on_this_cp_rank`。「谁建、谁读、谁收」一节的
#   显示单元格直接调 Megatron 的这三个函数，结果与重写版逐 rank 相同。
# - 每个 collective 由 `snippets.record.recorder` 记下；`get_batch` 在 `forward_step` 里，所以 phase 是 forward。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 batch-flow --tp 2 --cp 2`（本页 TP=2、CP=2 的表），
#   `--nproc-per-node 6 batch-flow --tp 2 --pp 3`（每个 stage 的表）；整页：`scripts/execute_notes.sh notes/03_data_and_batch_flow.py`。
# - 在 CPU 上要的改动见文末「在 CPU 上怎么跑的」。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(write_corpus, data_flow, run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`pretrain_gpt.py::train_valid_test_datasets_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L444) | 选类（`GPTDataset` / `MockGPTDataset` / SFT），调 builder |
# | [`pretrain_gpt.py::is_dataset_built_on_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L361) | 哪些 rank 建数据集 |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L29) | 造 train / valid / test |
# | [`gpt_dataset.py::GPTDataset.__getitem__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L230) | 一个样本的五个字段（或 `cu_seqlens`） |
# | [`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97) | 每个 micro-batch：TP 广播、展平 packed 样本、CP 切分 |
# | [`utils.py::get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2119) | TP 群里按 stage 逐字段 broadcast |
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | CP：按有没有 `cu_seqlens` 选切法 |
# | [`utils.py::_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456) | 整条序列的"一头一尾"切分 |
#
# <details><summary>其余 15 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`pretrain_gpt.py::core_gpt_dataset_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L377) | `args` → `GPTDatasetConfig` |
# | [`common_utils.py::get_blend_and_blend_per_split`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/utils/common_utils.py#L507) | `--data-path` 等 → `blend` / `blend_per_split` |
# | [`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513) | 调 provider、建 DataLoader |
# | [`data_samplers.py::MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115) | 按 DP rank 取 micro-batch 的下标 |
# | [`gpt_dataset.py::GPTDatasetConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L26) | GPT 数据的全部配置 |
# | [`blended_megatron_dataset_config.py::BlendedMegatronDatasetConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L99) | 没有 blend 时置 `mock = True`、`split = "1,1,1"` |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder.build_generic_dataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L491) | rank 0 先建（写索引缓存）→ barrier → 其余 rank 再建 |
# | [`indexed_dataset.py::IndexedDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L923) | 写 `.bin`（token）和 `.idx`（dtype、长度、文档边界） |
# | [`indexed_dataset.py::IndexedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L597) | 读它们（mmap） |
# | [`gpt_dataset.py::GPTDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L106) | 把文档拼接、切成定长样本 |
# | [`gpt_dataset.py::_get_ltor_masks_and_position_ids`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L765) | causal mask、loss mask、position ids（可按 EOD 重置） |
# | [`gpt_dataset.py::MockGPTDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L898) | 不读文件的合成数据（simple loop 用它） |
# | [`utils.py::flatten_batch_for_packed_sequences`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2565) | packed：各样本的 `cu_seqlens` 合成一条，`[b, s]` 摊平成 `[1, b·s]` |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | packed：由 `cu_seqlens` 造 `PackedSeqParams`（[`pretrain_gpt.py:323`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L323)） |
# | [`run_simple_mcore_train_loop.py::get_train_data_iterator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L82) | simple loop 的数据：mock + 普通 `DataLoader` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 数据集在 `pretrain` 里建一次（provider → builder → `GPTDataset`），每个 micro-batch 在 `forward_step` 开头经 `get_batch` 取一次：
# TP 广播 → 展平 packed 样本 → CP 切分。
#
# <details><summary>完整调用链</summary>
#
# ```text
# pretrain_gpt.py  (__main__ 把 train_valid_test_datasets_provider.is_distributed 设为 True)
# └─ megatron/training/training.py::pretrain
#    └─ build_train_valid_test_data_iterators
#       └─ build_train_valid_test_data_loaders                  # is_distributed ⇒ 每个 rank 都进来
#          ├─ pretrain_gpt.py::train_valid_test_datasets_provider
#          │  ├─ core_gpt_dataset_config_from_args(args)          # args → GPTDatasetConfig，纯配置
#          │  └─ BlendedMegatronDatasetBuilder(cls, sizes, is_dataset_built_on_rank, config).build()
#          │     ├─ 不建的 rank：每个非空 split 一次 barrier                          # world 群 barrier
#          │     ├─ cls.build_low_level_dataset → IndexedDataset(.bin/.idx)     # mmap，无通信
#          │     ├─ build_generic_dataset：rank 0 先建 GPTDataset（写索引缓存）     # world 群 barrier
#          │     │                          其余要建的 rank 之后读缓存
#          │     └─ BlendedDataset(...)                                          # blend 里多于一个数据集时
#          └─ build_pretraining_data_loader → MegatronPretrainingSampler        # 按 DP rank 取下标
#
# train_step → forward_backward_func → pretrain_gpt.py::forward_step
# ├─ pretrain_gpt.py::get_batch
# │  ├─ 中间 stage 且不 packing：直接返回 10 个 None（BATCH_KEYS）              # 输入来自上一 stage
# │  ├─ TP rank 0：next(data_iterator)
# │  ├─ megatron/core/utils.py::get_batch_on_this_tp_rank                  # TP 群 broadcast：TP rank 0 → 其余
# │  ├─ megatron/core/utils.py::flatten_batch_for_packed_sequences         # 有 cu_seqlens 时合并，否则原样
# │  └─ megatron/core/utils.py::get_batch_on_this_cp_rank(batch, is_hybrid_cp, cp_group=...)
# │     ├─ 没有 cu_seqlens 或 inter-document masking：_get_batch_on_this_cp_rank_per_sequence_balancing
# │     │                                                                   # 本地切片 [b, s] → [b, s/CP]
# │     ├─ SFT 的 packed 数据：_get_batch_on_this_cp_rank_per_document_balancing   # 每篇文档各自切（要 TE）
# │     └─ hybrid CP：按 local_cp_size 取一个临时 CP 群再切
# └─ 有 cu_seqlens 时：PackedSeqParams(qkv_format="thd", ...)                 # 交给 attention
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `core_gpt_dataset_config_from_args` | `args` | `GPTDatasetConfig` | tokenizer 构造、`GPTDatasetConfig` | 否 | 否 | 否 | `get_train_data_iterator` 里手写的 `GPTDatasetConfig(...)` |
# | `train_valid_test_datasets_provider` | 三个 split 的样本数、`vp_stage` | `(train, valid, test)` 数据集（不建的 rank 为 None） | `BlendedMegatronDatasetBuilder`、`GPTDataset` / `MockGPTDataset` | 间接：builder 里的 barrier | 否 | 否 | `BlendedMegatronDatasetBuilder(MockGPTDataset, ...).build()` |
# | `BlendedMegatronDatasetBuilder.build` | （构造时）类、sizes、`is_built_on_rank`、config | 三个数据集或 None | `IndexedDataset`、`GPTDataset`、`BlendedDataset` | world 群 barrier | 按 `split` 切文档区间 | 否（写索引缓存文件） | 同上 |
# | `GPTDataset.__getitem__` | 样本下标 | 五个字段的 dict（无 batch 维） | `_get_ltor_masks_and_position_ids` | 否 | 否 | 否 | `DataLoader` 取样本 |
# | `get_batch`（pretrain_gpt） | data iterator、`vp_stage` | `BATCH_KEYS` 顺序的 10 个值（五个字段 + packed 元数据） | 下面三个 | 经下面几个 | 是：CP 切序列 | 推进 iterator | `forward_step_func` 开头的 `next(data_iterator)` |
# | `get_batch_on_this_tp_rank` | batch dict（只有 TP rank 0 的有内容）、`has_cu_seqlens` 等开关、TP 群与 src rank、stage 位置 | batch dict（10 个键） | 无（群由调用方传入） | **是**：TP 群 broadcast | 否（整条序列广播） | 否 | 无（simple loop 每个 rank 自己读） |
# | `get_batch_on_this_cp_rank` | batch dict、`is_hybrid_cp`、`cp_group` | 同一个 dict，序列维变 `s/CP` | CP 群的大小与本 rank 序号 | 只读群信息，无通信 | **是**：取第 `r` 与 `2·CP−1−r` 块 | 否 | 无（simple loop 没有 CP） |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `args` → `GPTDatasetConfig`
#
# `core_gpt_dataset_config_from_args` 是一个显式的字典，每个字段写明取哪个 `args`（[pretrain_gpt.py 第 391–418 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L391-L418)，下面折叠的表）。
# `reset_*`、`eod_mask_loss` 缺省是 `None`，`__post_init__` 断言它们被显式给出。`mock` 不能传：`blend`、`blend_per_split` 都为 None 时
# `__post_init__` 置 `mock = True`、`split = "1,1,1"`；`--mock-data` 只让 provider 选 `MockGPTDataset` 这个**类**。更细的在[笔记 18](../18_data_topic/)。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
FROM_ARGS = {
    "random_seed": "args.seed",
    "sequence_length": "args.seq_length",
    "blend": "get_blend_and_blend_per_split(args)：--data-path",
    "blend_per_split": "同上：--train-data-path / --valid-data-path / --test-data-path",
    "split": "args.split（如 969,30,1）",
    "tokenizer": "build_tokenizer(args)",
    "path_to_cache": "args.data_cache_path",
    "reset_position_ids": "args.reset_position_ids",
    "reset_attention_mask": "args.reset_attention_mask",
    "eod_mask_loss": "args.eod_mask_loss",
    "create_attention_mask": "args.create_attention_mask_in_dataloader",
    "context_parallel_size": "args.context_parallel_size",
    "data_parallel_size": "args.data_parallel_size",
    "sequence_parallel_size": "args.tensor_model_parallel_size * args.sequence_parallel",
    "inter_document_masking": "args.dataloader_inter_document_masking",
    "mock": "不来自 args：__post_init__ 在 blend、blend_per_split 都为 None 时置 True",
}
config_fields = {f.name: f for f in dataclasses.fields(GPTDatasetConfig)}


def default_of(field):
    return "必填" if field.default is dataclasses.MISSING else field.default


Folded("GPTDatasetConfig 的主要字段：来自哪个 args、能否传入、缺省值",
       Table(["GPTDatasetConfig 字段", "来自", "构造参数?", "缺省值"],
             [[name, source, config_fields[name].init, default_of(config_fields[name])]
              for name, source in FROM_ARGS.items()]))

# %% [markdown]
# ### tokenizer 与 `.bin` + `.idx`
#
# 数据集要 tokenizer 的 `eod` 和可选的 `pad`；`--tokenizer-type NullTokenizer --vocab-size 32` 时 `build_tokenizer` 做的就是第一行
# （[build_tokenizer.py:87](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L87)，EOD 算在词表内）。
# 预处理脚本最后一步用 `IndexedDatasetBuilder`：token 写进 `.bin`，dtype、每条序列的长度和文档边界写进 `.idx`。三篇文档，每篇末尾加 EOD：

# %%
tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)
print("vocab_size:", tokenizer.vocab_size, " eod:", tokenizer.eod)
workdir = tempfile.TemporaryDirectory()
corpus_a = write_corpus(workdir.name, "a", [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]], tokenizer.eod)
indexed = IndexedDataset(corpus_a)
print("序列数:", len(indexed), " sequence_lengths:", indexed.sequence_lengths.tolist(),
      " document_indices:", indexed.document_indices.tolist())
print("第 1 条序列:", indexed[1].tolist())

# %% [markdown]
# `IndexedDataset[i]` 按长度的前缀和 mmap 出第 `i` 条序列。
#
# ### `GPTDataset`：把文档拼起来，切成定长样本
#
# 和正式入口一样经 `BlendedMegatronDatasetBuilder` 造：`split="100,0,0"` 全给 train，要 6 个样本；valid / test 的 split 为空，得 `None`：

# %%
config = GPTDatasetConfig(
    random_seed=1234, sequence_length=8, blend=([corpus_a], None), split="100,0,0",
    tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
train_ds, valid_ds, test_ds = BlendedMegatronDatasetBuilder(GPTDataset, [6, None, None], lambda: True, config).build()
print(type(train_ds).__name__, "样本数:", len(train_ds), " valid:", valid_ds, " test:", test_ds)
print("document_index:", train_ds.document_index.tolist())
print("sample_index  :", train_ds.sample_index.tolist())
print("shuffle_index :", train_ds.shuffle_index.tolist())
Table(["i", "shuffle_index[i]", "tokens", "labels"],
      [[i, int(train_ds.shuffle_index[i]), train_ds[i]["tokens"].tolist(), train_ds[i]["labels"].tolist()]
       for i in range(len(train_ds))])

# %% [markdown]
# 三张索引表：
#
# - `document_index`：文档下标重复若干个 epoch 并打乱。三篇文档连同 EOD 共 18 个 token，一个 epoch 只切得出 2 个长 8 的样本，
#   要 6 个就得 3 个 epoch。
# - `sample_index`：第 `j` 行是第 `j` 个样本的起点"(document_index 里的位置, 文档内偏移)"，相邻两行隔 `s` 个 token，
#   样本取到下一个起点为止（共 `s + 1` 个）。
# - `shuffle_index`：样本再打乱一次，`train_ds[i]` 是第 `shuffle_index[i]` 个样本。
#
# 样本跨越文档边界（31 是 EOD），也跨 epoch。
#
# ### 五个字段：shape、dtype、含义
#
# `DataLoader` 把样本叠成 micro-batch（这里 2，相当于 `--micro-batch-size 2`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
MEANING = {
    "tokens": "输入 token id，[b, s]",
    "labels": "目标 token id = 窗口右移一位，[b, s]",
    "loss_mask": "1 = 这个位置计入 loss（eod_mask_loss 时 EOD 为 0；pad 为 0）",
    "attention_mask": "True = 不许看（causal：上三角为 True），[b, 1, s, s]",
    "position_ids": "位置编号 0..s-1（reset_position_ids 时每个文档从 0 重来）",
}
batch0 = next(iter(torch.utils.data.DataLoader(train_ds, batch_size=2)))
Table(["字段", "shape dtype", "含义", "batch 第 0 行"],
      [[name, describe(batch0[name]), MEANING[name],
        batch0[name][0, 0, -1].tolist() if name == "attention_mask" else batch0[name][0].tolist()]
       for name in FIELDS])

# %% [markdown]
# `attention_mask` 一列是第 0 个样本 mask 的最后一行。约定要分清：数据集先造 `tril(ones)`（1 = 可见），再用 `< 0.5` 反过来，
# 交给模型的是"True = 屏蔽"。
#
# ### `MockGPTDataset`：simple loop 用的合成数据
#
# 不读文件：底层是 100000 篇长度随机（1–4095）的合成文档，token 从 1 数起、对词表取模，文末一个 EOD。取 simple loop 的 seq 64，只要 4 个样本：

# %%
mock_config = GPTDatasetConfig(random_seed=1234, sequence_length=64, tokenizer=tokenizer,
                               reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
print("mock:", mock_config.mock, " split:", mock_config.split)
mock_train, mock_valid, mock_test = BlendedMegatronDatasetBuilder(
    MockGPTDataset, [4, None, None], lambda: True, mock_config).build()
print("样本数 train / valid / test:", len(mock_train), len(mock_valid), len(mock_test))
print("train 分到的合成文档数:", len(mock_train.indices),
      " token 数:", int(mock_train.dataset.sequence_lengths[mock_train.indices].sum()))
print("mock_train[0] tokens 前 12 个:", mock_train[0]["tokens"][:12].tolist())

# %% [markdown]
# train 却有约一百万个样本：`num_samples` 只是下限，索引按整 epoch 建（三分之一的合成文档约 6.8 千万 token，除以 64）；
# sizes 为 `None` 的 valid / test 也各建一个整 epoch。按权重混合语料的 `BlendedDataset` 见笔记 18。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 谁建、谁读、谁收：TP=2、CP=2
#
# `get_batch` 每个 micro-batch 做三件事：TP rank 0 `next(data_iterator)`，`get_batch_on_this_tp_rank` 在 TP 群里广播，
# `get_batch_on_this_cp_rank` 按 CP 坐标切序列。下面在 4 个进程上直接调它们（PP=1），TP rank 0 拿上面的 micro-batch，其余拿空 dict：

# %%
from megatron.core import parallel_state
from megatron.core import utils as core_utils  # get_batch_on_this_tp_rank / _cp_rank 在 megatron/core/utils.py


def megatron_get_batch(sample, tp, cp, micro_batch_size, seq_length):
    from snippets.record import recorder
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    batch = dict(sample) if tp_rank == 0 else {}                         # 只有 TP rank 0 读数据
    with recorder.record() as calls:
        batch = core_utils.get_batch_on_this_tp_rank(
            batch, has_cu_seqlens=False, is_hybrid_cp=False, create_attention_mask_in_dataloader=True,
            broadcast_src_rank=parallel_state.get_tensor_model_parallel_src_rank(),
            broadcast_group=parallel_state.get_tensor_model_parallel_group(),
            cp_size=cp, tp_rank=tp_rank, micro_batch_size=micro_batch_size, seq_length=seq_length,
            mtp_on_this_rank=False)
    batch = core_utils.flatten_batch_for_packed_sequences(batch)         # 没有 cu_seqlens：原样返回
    batch = core_utils.get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                                 cp_group=parallel_state.get_context_parallel_group())
    return dict(calls=[(c.api, c.group, c.before, c.where) for c in calls],
                positions=batch["position_ids"][0].tolist(), tokens=batch["tokens"][0].tolist(),
                shapes={k: describe(batch[k]) for k in ("tokens", "attention_mask")})


real = run_ranks(megatron_get_batch, 4, batch0, 2, 2, 2, 8, grid=dict(tp=2, cp=2))
for rank, r in enumerate(real):
    (api, group, _, _), shapes = r["calls"][0], " ".join(c[2] for c in r["calls"])
    print(f"rank {rank}: {len(r['calls'])} 次 {api}（{group} 群）{shapes} | 留下位置 {r['positions']}",
          f"tokens {r['shapes']['tokens']}  mask {r['shapes']['attention_mask']}")
print("发出广播的函数:", sorted({c[3] for r in real for c in r["calls"]}))

# %% [markdown]
# 每个 rank 5 次 broadcast，全在 TP 群里：四个 `[b, s]` 字段依次发，`attention_mask` 最后
# （[utils.py:2214](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2214) 前后）；之后 `tokens` 只剩 `[2, 4]`，CP 切掉了一半序列。
# 接收方只能按 `args`（`micro_batch_size`、`seq_length`、是否造 mask、是否 packed）先分配空缓冲再收；没开 packing 的开关，`cu_seqlens` 就一次也不发。
#
# 谁建数据集、谁读，要连 builder 一起跑（每次广播也记下字段名）；留下的位置和 tokens 与上面逐 rank 相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("与直接调 Megatron 逐 rank 相同:",
      [(d["positions"], d["tokens"]) == (r["positions"], r["tokens"]) for d, r in zip(tp_cp, real)])
summary_table(tp_cp, TP_CP)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Folded("rank 0 依次发出的字段，rank 1 记下的同一串 collective", sender_table(tp_cp[0]), receiver_table(tp_cp[1]))

# %% [markdown]
# 只有 TP rank 0（rank 0、2）建数据集、有 data iterator，rank 1、3 只陪一次 world barrier；rank 0、2 的 DP 坐标相同，读到同一条样本。
#
# ### 每个 pipeline stage 广播什么：TP=2、PP=3

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TP_PP = Parallel(world=6, tp=2, pp=3)
tp_pp = run_ranks(run, 6, TINY, TP_PP, grid=dict(tp=2, pp=3))
role_table(tp_pp, TP_PP)

# %% [markdown]
# - **首 stage**（rank 0、1）只广播 `tokens`、`position_ids`，最后 mask。
# - **尾 stage**（rank 4、5）只广播 `labels`、`loss_mask`，最后 mask；发送方读到全部字段，也把用不到的置成 None
#   （[utils.py:2239](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2239)），rank 4 和 5 手里一样。
# - **中间 stage**（rank 2、3）不 packing 时根本不进 `get_batch_on_this_tp_rank`，也不建数据集；packed 时只收 `cu_seqlens` 与 `max_seqlen`
#   （[utils.py:2252](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2252)）。
#
# ### CP 切分：每个 rank 留哪两块
#
# 没有 `cu_seqlens` 时，`get_batch_on_this_cp_rank` 交给
# [`_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456)：序列维 `view` 成
# `2·CP = 4` 块，CP rank `r` 留第 `r` 块和第 `2·CP−1−r` 块：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
chunk_table(tp_cp, TINY, TP_CP)

# %% [markdown]
# 为什么是"一头一尾"：causal attention 里第 `i` 个 token 要和前 `i` 个 token 算，越靠后的块越贵。按 0,1 | 2,3 直接对半切，
# CP rank 1 的工作量约是 rank 0 的 3 倍；切成 4 块、各取一头一尾（0+3、1+2），两边相等。
# `attention_mask` 只切了**行**（query，第 2 维），成了 `[2, 1, 4, 8]`，列（key）仍是整条序列：本 rank 的 query
# 要看的 key 分散在别的 rank 上，靠 attention 里 K/V 在 CP 群传递补齐（[笔记 16](../16_context_parallel/)）。
# 同一 TP 群的两个 rank（0 与 1、2 与 3）留下的完全相同：TP 切的是权重，不是数据。
#
# ### packed sequence：`cu_seqlens` 与 `max_seqlen`
#
# 缺省 causal mask 让后一篇文档看得见前一篇。两种办法把文档隔开：
#
# 1. **稠密 mask**：`reset_attention_mask=True` 造块对角的 causal mask，`reset_position_ids=True` 让位置每篇从 0 重来；仍算满 `s × s`。
# 2. **packed / THD**：不造 mask，只给每篇的起止 `cu_seqlens`（`[0, 4, 8]` 是 `[0, 4)`、`[4, 8)` 两段）和最长一段 `max_seqlen`；
#    TE 的 attention 按段算，不算段与段之间。
#
# 取中间含 EOD 最多的样本，第 1 种办法：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
reset_config = dataclasses.replace(config, reset_position_ids=True, reset_attention_mask=True)
reset_ds, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [6, None, None], lambda: True, reset_config).build()
# the sample with the most document boundaries inside it
packed_index = max(range(len(reset_ds)), key=lambda i: int((reset_ds[i]["tokens"][:-1] == tokenizer.eod).sum()))
packed = reset_ds[packed_index]
print("tokens      :", packed["tokens"].tolist())
print("position_ids:", packed["position_ids"].tolist())
print("mask 的可见位置（1 = 可见）:")
print((~packed["attention_mask"][0]).int())

# %% [markdown]
# 第 2 种办法：`inter_document_masking=True`（`--dataloader-inter-document-masking`）时 `__getitem__` 不造 mask，改给 `cu_seqlens`、`max_seqlen`，
# 同样按文档重置 `position_ids`（[gpt_dataset.py:287](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L287)）。同一个样本：

# %%
doc_config = dataclasses.replace(config, inter_document_masking=True)
doc_ds, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [6, None, None], lambda: True, doc_config).build()
doc_sample = doc_ds[packed_index]
print("字段:", sorted(doc_sample))
print("tokens 相同:", torch.equal(doc_sample["tokens"], packed["tokens"]),
      " position_ids 相同:", torch.equal(doc_sample["position_ids"], packed["position_ids"]))
print("cu_seqlens:", doc_sample["cu_seqlens"].tolist(), " max_seqlen:", int(doc_sample["max_seqlen"]))

# %% [markdown]
# `cu_seqlens` 补到 `s + 1` 项（尾部填 `s`），`DataLoader` 才叠得起来。TP 广播之后 `flatten_batch_for_packed_sequences` 去掉补齐，
# 把几条样本首尾相接（第 `i` 条的边界加 `i·s`），`[b, s]` 摊平成 `[1, b·s]`；`forward_step` 再用它造 `PackedSeqParams`。micro-batch 2：

# %%
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.utils import flatten_batch_for_packed_sequences

two = next(iter(torch.utils.data.DataLoader(doc_ds, batch_size=2)))
print("DataLoader 叠出的 cu_seqlens:", describe(two["cu_seqlens"]), " tokens:", describe(two["tokens"]))
flat = flatten_batch_for_packed_sequences(dict(two))
print("展平后 cu_seqlens:", flat["cu_seqlens"].tolist(), " tokens:", describe(flat["tokens"]),
      " max_seqlen:", flat["max_seqlen"].tolist())
cu = flat["cu_seqlens"].squeeze(0)  # forward_step squeezes the batch dim
params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                         max_seqlen_q=int(flat["max_seqlen"].item()), max_seqlen_kv=int(flat["max_seqlen"].item()),
                         tokens_per_sample=8)
print("PackedSeqParams:", params.qkv_format, params.cu_seqlens_q.tolist(), params.max_seqlen_q)

# %% [markdown]
# 本地 attention（`DotProductAttention`）不收 `packed_seq_params`，THD 只在 TE 上跑。它怎样走到 RoPE 和 core attention、
# 与"各文档分开跑"逐 token 相同，见[笔记 18](../18_data_topic/) 第 6 节。
#
# > **旧版（core_v0.18.0）：** 只有 SFT 数据带 `cu_seqlens`，也没有展平：接收方按 `(1, n)` 分配，packed 时 micro-batch 只能是 1
# > （[`get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/utils.py#L1979)）。

# %% [markdown]
# ## 机制解释
#
# **三层数据集。** 底层 `IndexedDataset` 按下标取一条 token 序列；中层 `GPTDataset` 把文档按 `document_index` 首尾相接，
# 按 `sample_index` 切成 `s + 1` 的窗口，再用 `shuffle_index` 打乱；顶层 `BlendedDataset` 按权重交错取样本。
# 索引表在 global rank 0 上造好（`sample_index` 用 C++ helper）并存成 `.npy` 缓存，其余 rank 读缓存：这就是 builder 里
# "rank 0 先建、barrier、其余再建"的原因。
#
# **样本即窗口。** `labels[i] = tokens[i+1]`，一次 forward 同时训练 `s` 个"下一个 token"的预测；文档之间只隔一个 EOD，要靠块对角 mask 或 `cu_seqlens` 隔开。
#
# **只有一个 rank 读盘。** 同一 TP 群的 rank 合起来是一个模型副本，必须拿完全相同的 batch：TP rank 0 读、广播给其余，比各读一份
# 再指望顺序一致可靠。接收方只能按 `args` 预先分配缓冲，所以广播的顺序、shape、dtype 是收发两边的隐式协议，任何一处对不上就卡住或读错
# （遗留问题 1 的旧版）；0.19.0 让两边只看同一组开关。
#
# **只广播本 stage 用得到的。** 首 stage 做 embedding，尾 stage 算 loss，中间 stage 的输入是上一 stage 的激活
# （[笔记 13](../13_pipeline_schedules/)）；但文档边界每一层的 attention 都要，所以 packed 时中间 stage 也收 `cu_seqlens`。
#
# **CP 切分是纯索引。** 没有通信；每个字段按自己的序列维（`attention_mask` 是第 2 维）切。它发生在 TP 广播之后：
# 同一 DP 坐标的各 CP rank 读到同一条样本，各取自己那两块即可。

# %% [markdown]
# ## 与训练主链路的关系
#
# 数据在 `pretrain` 里建一次，每个 micro-batch 在 `forward_step` 开头取一次。simple loop 没有 TP 广播和 CP 切分：每个 rank 各建 mock 数据集和
# `shuffle=True` 的 `DataLoader`，同一 TP 群读到同一批只靠各进程的随机数状态恰好一致。五个张量进 `GPTModel.forward`，
# `loss_mask` 留给 `loss_func`（[笔记 05](../05_forward_loss_backward/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **teacher forcing**：`labels` 是 `tokens` 左移一位，causal mask 让位置 `i` 只看 `≤ i`。
# - **broadcast**：各 rank 必须以相同顺序、相同 shape 调用。
# - **负载均衡**：causal attention 的代价随位置线性增长，"一头一尾"是经典的 zig-zag 均衡。
# - **varlen attention**：`cu_seqlens` 就是 FlashAttention `flash_attn_varlen_func` 的表示。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **发不发 `cu_seqlens` 看开关，不看数据。** `get_batch_on_this_tp_rank` 只看 `get_batch` 按 `--sft` /
#    `--dataloader-inter-document-masking` 算出的 `has_cu_seqlens`（[pretrain_gpt.py:106](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L106)）：
#    为真时每个 stage 分支里先发长度、再发内容、接着 `max_seqlen`，最后才是 mask（[`utils.py:2214`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2214)）；
#    为假时一次也不发。下面第一格把 inter-document masking 的样本交给一对收发方：开关打开 7 次广播、两边对得上；
#    同一份数据开关关着，只发 4 个字段，接收方也不等 `cu_seqlens`。
#
# > **旧版（core_v0.16.1）：** 函数在 `megatron/training/utils.py`，两个错后来修了：PP=1 不 packing 时 9 次广播，4 次花在重发的空 `cu_seqlens` 上
# > （[第 604 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/training/utils.py#L604)）；接收方只在 hybrid CP 时为 `max_seqlen` 分配缓冲，
# > TP>1 的 packed 数据第 8 次接收错位（[第 671 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/training/utils.py#L671)，[issue #4092](https://github.com/NVIDIA/Megatron-LM/issues/4092)）。core_v0.18.0 起与 0.19.0 相同。
#
# 2. **`cu_seqlens_padded` 有通道，却没有数据集填它。** packed 且 CP>1 时它也先发长度（下面第二格：长度为 0），
#    但 `GPTDataset` 和 `SFTDataset` 只给 `cu_seqlens`，它总是 None。
# 3. **inter-document masking + PP≥3 的中间 stage 没有数据可读（读代码所见，本页没有运行）。** 只开
#    `--dataloader-inter-document-masking` 时 `has_cu_seqlens` 为真，中间 stage 不再提前返回，它的 TP rank 0 要 `next(data_iterator)`；
#    可 `is_dataset_built_on_rank` 只在 SFT 时让中间 stage 建数据集（[pretrain_gpt.py:361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L361)），那里的 iterator 是 None。
# 4. **simple loop 的 mock 数据比看上去贵。** sizes `[1000, None, None]` 仍为三个 split 各建一个整 epoch 的索引（seq 64 时每个约一百万样本）。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - `get_batch_on_this_tp_rank` 用 `torch.cuda.current_device()` 分配接收缓冲：CPU 补丁让它返回 `"cpu"`，广播走 gloo（见[在 CPU 上运行](../../cpu/)）。
# - 正式入口在 `get_batch` 里把每个字段 `.cuda()`；本页的重写版和上面的显示单元格都省掉这一步，数据留在 CPU。
# - THD 格式的 attention 要 Transformer Engine，本机没有，所以本页只造到 `PackedSeqParams`，不跑 THD 的 forward。
# - 数据集 builder 在 INFO / WARNING 级别打日志（如 mock 数据没有缓存目录），在 notebook 里会成为 stderr：`snippets.data.batch_flow`
#   把 `megatron.core.datasets` 的日志级别调到 ERROR。
# - 尺寸：seq 8、micro-batch 2、词表 32；mock 数据用 simple loop 的 seq 64。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
doc_batch = torch.utils.data.default_collate([doc_sample])  # a micro-batch of 1, as the DataLoader yields it
for flags in (BatchArgs(1, 8, create_attention_mask_in_dataloader=False, dataloader_inter_document_masking=True),
              BatchArgs(1, 8, create_attention_mask_in_dataloader=False)):
    sender, receiver, paired = paired_views("all")
    sent_log = []
    get_batch_on_this_tp_rank(iter([doc_batch]), flags, view=sender, log=sent_log)
    try:
        got = get_batch_on_this_tp_rank(None, flags, view=receiver)
        paired.finish()
        print(f"has_cu_seqlens={flags.has_cu_seqlens}: 对上了，接收方的 cu_seqlens =",
              None if got["cu_seqlens"] is None else got["cu_seqlens"].tolist(),
              " max_seqlen =", None if got["max_seqlen"] is None else got["max_seqlen"].tolist())
    except BroadcastMismatch as err:
        print("BroadcastMismatch:", err)
    print("  发送方依次发出:", [entry[0] for entry in sent_log])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
cp2 = BatchArgs(1, 8, create_attention_mask_in_dataloader=False, dataloader_inter_document_masking=True,
                context_parallel_size=2)
sender, receiver, paired = paired_views("all")
sent_log = []
get_batch_on_this_tp_rank(iter([doc_batch]), cp2, view=sender, log=sent_log)
got = get_batch_on_this_tp_rank(None, cp2, view=receiver)
paired.finish()
print("CP=2 时依次发出:", [entry[0] for entry in sent_log])
print("接收方返回的键:", sorted(got), " cu_seqlens_padded:", got["cu_seqlens_padded"])

# %% [markdown]
# ## 自测
#
# **1. PP=1、TP=2、数据不 packing 时，一次 `get_batch` 发出几次 broadcast？其中几次是为 `cu_seqlens`？**
#
# <details><summary>答案</summary>
#
# 5 次：五个字段各 1 次，mask 最后；`cu_seqlens` 0 次——没开 `--sft` / `--dataloader-inter-document-masking` 时根本不发它
# （0.16.1 是 9 次，其中 4 次花在发了两遍的空 `cu_seqlens` 上）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(tp_cp[0]["log"]), sum(entry[0].startswith("cu_seqlens") for entry in tp_cp[0]["log"]))

# %% [markdown]
# **2. 序列长 8、CP=2 时，CP rank 1 留下原序列的哪些位置？**
#
# <details><summary>答案</summary>
#
# 切成 4 块、每块 2 个位置，CP rank 1 留第 1 块和第 2 块：位置 2, 3, 4, 5。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(tp_cp[2]["positions"])

# %% [markdown]
# **3. TP=2、PP=3 的 6 个 rank 里，哪些 rank 建数据集？为什么中间 stage 不建？**
#
# <details><summary>答案</summary>
#
# rank 0 和 rank 4：首、尾 stage 的 TP rank 0。中间 stage 的输入是上一 stage 的激活，`get_batch` 直接返回 None，用不到数据。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([r for r, d in enumerate(tp_pp) if d["built"]])

# %% [markdown]
# **4. `GPTDataset` 的一个样本里，`labels` 和 `tokens` 是什么关系？**
#
# <details><summary>答案</summary>
#
# 同一个 `s + 1` 个 token 的窗口：`tokens` 是前 `s` 个，`labels` 是后 `s` 个，所以 `labels[:-1] == tokens[1:]`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(all(torch.equal(train_ds[i]["labels"][:-1], train_ds[i]["tokens"][1:]) for i in range(len(train_ds))))

# %% [markdown]
# **5. 不给 `blend` 的 `GPTDatasetConfig` 会怎样？用 `GPTDataset` 类而不是 `MockGPTDataset` 能建吗？**
#
# <details><summary>答案</summary>
#
# `__post_init__` 置 `mock = True`、`split = "1,1,1"`。但 `GPTDataset` 要一个 `.bin/.idx` 前缀，mock 时路径是 None，
# 建底层数据集时在 `None.startswith` 上失败，builder 把它包成"GPTDataset failed to build as a mock data generator"。
# 所以 provider 用 `--mock-data` 另选 `MockGPTDataset` 类。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
try:
    BlendedMegatronDatasetBuilder(GPTDataset, [4, None, None], lambda: True, mock_config).build()
except Exception as err:
    print(f"{type(err).__name__}: {err}  <- {type(err.__cause__).__name__}: {err.__cause__}")

# %% [markdown]
# ## 30-second answer
#
# `GPTDataset` concatenates the documents of a memory-mapped `.bin/.idx` and cuts windows of `s + 1` tokens, so
# `labels` are `tokens` shifted by one. Only TP rank 0 of the first and last pipeline stages builds and reads the data;
# per micro-batch `get_batch_on_this_tp_rank` broadcasts the fields its stage needs (5 at PP=1, the mask last), then
# `get_batch_on_this_cp_rank` keeps chunks `r` and `2·CP−1−r` for load balance. Packed data carries `cu_seqlens`, not a mask.
