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
# 第一轮第 3 篇。一次训练 step 的第一件事是拿到一个 micro-batch。本篇沿正式入口的数据链路走一遍：
# `args` 怎么变成 `GPTDatasetConfig`，`BlendedMegatronDatasetBuilder` 怎么造出 train / valid / test，
# 一个样本里的 `tokens, labels, loss_mask, attention_mask, position_ids` 各是什么，以及 `get_batch`
# 怎样在 TP 群里广播、再按 CP 坐标切序列。数据集全部用 Megatron 自己的类在本机临时目录里
# 从几行 token 列表造出来（页面上不打印任何路径）；广播与切分跑在 gloo rank 上。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出 `core_gpt_dataset_config_from_args` 把哪些 `args` 填进 `GPTDatasetConfig` 的哪些字段，`mock` 从哪来。
# 2. 说清 `BlendedMegatronDatasetBuilder.build()` 返回什么；`GPTDataset` 的三张索引表（document / sample / shuffle）各管什么；
#    `MockGPTDataset` 和 `BlendedDataset` 与它有何不同。
# 3. 对一个真实样本说出五个字段的 shape、dtype 与含义（`labels` 为什么是 `tokens` 错一位，`attention_mask` 里 True 表示什么）。
# 4. 说清 `get_batch` 里谁读数据、谁收广播、每个 pipeline stage 广播哪些字段；CP=2 时每个 rank 留下哪两块、为什么。
# 5. 说清 packed sequence 的 `cu_seqlens`、`max_seqlen` 表达什么，它与"块对角 mask + 重置位置"有什么关系。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`pretrain_gpt.py::core_gpt_dataset_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L377) | `args` → `GPTDatasetConfig` |
# | [`pretrain_gpt.py::train_valid_test_datasets_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L444) | 选类（`GPTDataset` / `MockGPTDataset` / SFT），调 builder |
# | [`pretrain_gpt.py::is_dataset_built_on_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L361) | 只有首 / 尾 stage 的 TP rank 0 建数据集（SFT 时每个 stage 的 TP rank 0 都建） |
# | [`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97) | 每个 micro-batch：TP 广播，展平 packed 样本，再 CP 切分 |
# | [`utils.py::get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2119) | TP 群里的 broadcast（在 `megatron/core/utils.py`，随 pip 包安装；`snippets/data/batch_flow.py` 是本篇的重写） |
# | [`common_utils.py::get_blend_and_blend_per_split`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/utils/common_utils.py#L507) | `--data-path` 等 → `blend` / `blend_per_split` |
# | [`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513) | 调 provider、建 DataLoader |
# | [`data_samplers.py::MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115) | 按 DP rank 取 micro-batch 的下标 |
# | [`gpt_dataset.py::GPTDatasetConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L26) | GPT 数据的全部配置 |
# | [`blended_megatron_dataset_config.py::BlendedMegatronDatasetConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L99) | 没有 blend 时置 `mock = True`、`split = "1,1,1"` |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L29) | 造三个 split |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder.build_generic_dataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L491) | rank 0 先建（写缓存）→ barrier → 其余 rank 再建 |
# | [`indexed_dataset.py::IndexedDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L923) | 写 `.bin`（token）和 `.idx`（长度、文档边界） |
# | [`indexed_dataset.py::IndexedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L597) | 读它们（mmap） |
# | [`gpt_dataset.py::GPTDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L106) | 把文档拼接、切成定长样本 |
# | [`gpt_dataset.py::GPTDataset.__getitem__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L230) | 一个样本的五个字段（`inter_document_masking` 时改给 `cu_seqlens`、`max_seqlen`，不给 mask） |
# | [`gpt_dataset.py::_get_ltor_masks_and_position_ids`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L765) | causal mask、loss mask、position ids（可按 EOD 重置） |
# | [`gpt_dataset.py::MockGPTDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L898) | 不读文件的合成数据（simple loop 用它） |
# | [`blended_dataset.py::BlendedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_dataset.py#L25) | 按权重从几个数据集里取样本 |
# | [`utils.py::flatten_batch_for_packed_sequences`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2565) | packed：把 micro-batch 里各样本的 `cu_seqlens` 合成一条，`[b, s]` 摊平成 `[1, b·s]` |
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | CP：按有没有 `cu_seqlens` 分派；普通数据每个 rank 留 2·CP 块里的两块 |
# | [`utils.py::_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456) | 整条序列的"一头一尾"切分（上一行的缺省分支） |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | packed（THD）：由 `cu_seqlens` 造 `PackedSeqParams`（[`pretrain_gpt.py:323`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L323)） |
# | [`packed_seq_params.py::PackedSeqParams`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/packed_seq_params.py#L10) | `cu_seqlens_*`、`max_seqlen_*` 交给 attention |
# | [`run_simple_mcore_train_loop.py::get_train_data_iterator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L82) | simple loop 的数据：mock + 普通 `DataLoader` |

# %% [markdown]
# ## 调用链
#
# ```text
# pretrain_gpt.py  (__main__ 把 train_valid_test_datasets_provider.is_distributed 设为 True)
# └─ megatron/training/training.py::pretrain
#    └─ build_train_valid_test_data_iterators
#       └─ build_train_valid_test_data_loaders                  # is_distributed ⇒ 每个 rank 都进来
#          ├─ pretrain_gpt.py::train_valid_test_datasets_provider
#          │  ├─ core_gpt_dataset_config_from_args(args)          # args → GPTDatasetConfig，纯配置
#          │  └─ BlendedMegatronDatasetBuilder(cls, sizes, is_dataset_built_on_rank, config).build()
#          │     ├─ 不建的 rank：每个 split 一次 barrier                              # world 群 barrier
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
# **每个函数的阅读记录**（roadmap 第一轮的七问）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `core_gpt_dataset_config_from_args` | `args` | `GPTDatasetConfig` | tokenizer 构造、`GPTDatasetConfig` | 否 | 否 | 否 | `get_train_data_iterator` 里手写的 `GPTDatasetConfig(...)` |
# | `train_valid_test_datasets_provider` | 三个 split 的样本数、`vp_stage` | `(train, valid, test)` 数据集（不建的 rank 为 None） | `BlendedMegatronDatasetBuilder`、`GPTDataset` / `MockGPTDataset` | 间接：builder 里的 barrier | 否 | 否 | `BlendedMegatronDatasetBuilder(MockGPTDataset, ...).build()` |
# | `BlendedMegatronDatasetBuilder.build` | （构造时）类、sizes、`is_built_on_rank`、config | 三个数据集或 None | `IndexedDataset`、`GPTDataset`、`BlendedDataset` | world 群 barrier（下面实测） | 按 `split` 切文档区间 | 否（写索引缓存文件） | 同上 |
# | `GPTDataset.__getitem__` | 样本下标 | 五个字段的 dict（无 batch 维） | `_get_ltor_masks_and_position_ids` | 否 | 否 | 否 | `DataLoader` 取样本 |
# | `get_batch`（pretrain_gpt） | data iterator、`vp_stage` | `BATCH_KEYS` 顺序的 10 个值（五个字段 + packed 元数据） | 下面三个 | 经下面几个 | 是：CP 切序列 | 推进 iterator | `forward_step_func` 开头的 `next(data_iterator)` |
# | `get_batch_on_this_tp_rank` | batch dict（只有 TP rank 0 的有内容）、`has_cu_seqlens` 等开关、TP 群与 src rank、stage 位置 | batch dict（10 个键） | 无（群由调用方传入） | **是**：TP 群 broadcast | 否（整条序列广播） | 否 | 无（simple loop 每个 rank 自己读） |
# | `get_batch_on_this_cp_rank` | batch dict、`is_hybrid_cp`、`cp_group` | 同一个 dict，序列维变 `s/CP` | CP 群的大小与本 rank 序号 | 只读群信息，无通信 | **是**：取第 `r` 与 `2·CP−1−r` 块 | 否 | 无（simple loop 没有 CP） |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import dataclasses
import tempfile

import numpy
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

# %% [markdown]
# ## 关键对象
#
# ### `args` → `GPTDatasetConfig`
#
# `core_gpt_dataset_config_from_args` 是一个显式的字典：每个字段写明取哪个 `args`（[pretrain_gpt.py 第 391–418 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L391-L418)）。
# 下表是其中主要的几项（"来自"一列是读代码的记录）；后两列由运行算出：这个名字确实是 `GPTDatasetConfig` 的构造参数，
# 以及不传时的缺省值。

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


Table(["GPTDatasetConfig 字段", "来自", "构造参数?", "缺省值"],
      [[name, source, config_fields[name].init, default_of(config_fields[name])]
       for name, source in FROM_ARGS.items()])

# %% [markdown]
# 要点：`random_seed`、`sequence_length` 必填；`reset_*`、`eod_mask_loss` 缺省是 `None`，`__post_init__` 会断言它们被显式给出；
# `mock` 不能传，它是 `init=False` 的派生字段——`--mock-data` 只决定 provider 用哪个**类**（`MockGPTDataset`），
# 是否 mock 则由"有没有 blend"决定。
#
# ### tokenizer
#
# 数据集只向 tokenizer 要三样东西：`eod`（文档结束符）、`vocab_size`（决定 `.bin` 里 token 的 dtype）、`pad`（可选）。
# `--tokenizer-type NullTokenizer --vocab-size 32` 时 `build_tokenizer` 做的就是下面这一行（[build_tokenizer.py:87](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L87)）：

# %%
tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)
print("vocab_size:", tokenizer.vocab_size, " eod:", tokenizer.eod)

# %% [markdown]
# `--vocab-size` 已把 EOD 算在内：`NullTokenizer` 缺省把 EOD 放在词表最后一个 id（31），词表大小就是 32。
#
# ### 一个真实的 indexed dataset：`.bin` + `.idx`
#
# 预处理脚本（`tools/preprocess_data.py`）最后一步用的就是 `IndexedDatasetBuilder`：token 依次写进 `.bin`，
# 每条序列的长度和文档边界写进 `.idx`。实验模块的 `write_corpus` 就是这几行（每篇文档末尾加 EOD）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(write_corpus)

# %% [markdown]
# 用它写两个小语料，写在一个临时目录里：

# %%
workdir = tempfile.TemporaryDirectory()
corpus_a = write_corpus(workdir.name, "a", [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]], tokenizer.eod)
corpus_b = write_corpus(workdir.name, "b", [[20, 21], [22, 23, 24, 25]], tokenizer.eod)

indexed = IndexedDataset(corpus_a)
print("序列数:", len(indexed), " sequence_lengths:", indexed.sequence_lengths.tolist(),
      " document_indices:", indexed.document_indices.tolist())
print("第 1 条序列:", indexed[1].tolist())

# %% [markdown]
# `.idx` 只记长度与文档边界；`IndexedDataset[i]` 按长度的前缀和在 `.bin` 里 mmap 出第 `i` 条序列。
#
# ### `GPTDataset`：把文档拼起来，切成定长样本
#
# 和正式入口一样，经 `BlendedMegatronDatasetBuilder` 造：`split="100,0,0"` 把全部文档分给 train，
# sizes 里 train 要 6 个样本，valid / test 为 `None`（它们的 split 为空，builder 返回 `None`）。

# %%
config = GPTDatasetConfig(
    random_seed=1234, sequence_length=8, blend=([corpus_a], None), split="100,0,0",
    tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
train_ds, valid_ds, test_ds = BlendedMegatronDatasetBuilder(GPTDataset, [6, None, None], lambda: True, config).build()
print(type(train_ds).__name__, "样本数:", len(train_ds), " valid:", valid_ds, " test:", test_ds)
print("document_index:", train_ds.document_index.tolist())
print("sample_index  :", train_ds.sample_index.tolist())
print("shuffle_index :", train_ds.shuffle_index.tolist())

# %% [markdown]
# 三张索引表：
#
# - `document_index`：把文档下标重复若干个 epoch 并打乱。3 篇文档共 21 个 token，一个 epoch 只够 2 个长度 8 的样本，
#   要 6 个样本就得 3 个 epoch（每个文档下标出现 3 次）。
# - `sample_index`：第 `j` 行是第 `j` 个样本的起点"(document_index 里的位置, 文档内偏移)"，相邻两行之间恰好
#   `sequence_length + 1` 个 token（多取的 1 个给 `labels` 用）。
# - `shuffle_index`：样本层面再打乱一次，`train_ds[i]` 取的是第 `shuffle_index[i]` 个样本。
#
# 逐个样本看：

# %%
Table(["i", "shuffle_index[i]", "tokens", "labels"],
      [[i, int(train_ds.shuffle_index[i]), train_ds[i]["tokens"].tolist(), train_ds[i]["labels"].tolist()]
       for i in range(len(train_ds))])

# %% [markdown]
# 样本跨越文档边界（31 是 EOD），也会跨 epoch。`labels` 就是同一个 9-token 窗口右移一位：预测下一个 token。
#
# ### 五个字段：shape、dtype、含义
#
# `DataLoader` 把样本叠成 batch（这里 micro-batch 2，相当于 `--micro-batch-size 2`）：

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
# `attention_mask` 一列只印了第 0 个样本 mask 的最后一行（最后一个 token 能看全部 8 个位置，所以全为 False）。
# 注意两个方向的约定：数据集里先造 `tril(ones)`（1 = 可见），再用 `< 0.5` 反过来，交给模型的是"True = 屏蔽"。
#
# ### `MockGPTDataset`：simple loop 用的合成数据
#
# 不给 `blend` 时 `GPTDatasetConfig` 自动 `mock = True`、`split = "1,1,1"`；`MockGPTDataset` 的底层是 100000 篇
# 长度随机（1–4095）的合成文档，第 `k` 个 token 是 `k % vocab_size`，文末一个 EOD。序列长度用 simple loop 的 64：

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
# 只要 4 个样本，train 却有约一百万个：`num_samples` 只是下限，索引总是按整 epoch 建。`split="1,1,1"` 把 100000 篇
# 合成文档三等分，train 的三分之一约 6.8 千万 token，除以 64 就是这么多样本。sizes 为 `None` 的 valid / test 也各建了一个整 epoch。
#
# ### `BlendedDataset`：按权重混合
#
# `blend=([a, b], [0.75, 0.25])`：builder 先给每个数据集各造一个 `GPTDataset`（样本数按权重放大一点），再用
# `BlendedDataset` 按权重交错取样本。带权重时三个 split 都要给出 size（给 `None` 会断言失败），这里给 0：

# %%
blend_config = GPTDatasetConfig(
    random_seed=1234, sequence_length=8, blend=([corpus_a, corpus_b], [0.75, 0.25]), split="100,0,0",
    tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
blended, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [8, 0, 0], lambda: True, blend_config).build()
print(type(blended).__name__, "样本数:", len(blended), " 内部:", [type(d).__name__ for d in blended.datasets])
print("dataset_index:", blended.dataset_index.tolist(), " 各数据集被取次数:",
      numpy.bincount(blended.dataset_index).tolist())
Table(["i", "来自", "tokens"], [[i, "ab"[int(blended.dataset_index[i])], blended[i]["tokens"].tolist()]
                               for i in range(4)])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 谁建数据集、谁读、谁收：TP=2、CP=2
#
# 下面每个 rank 做正式入口会做的事：`initialize_model_parallel`；用 `is_dataset_built_on_rank` 的规则
# （首或尾 stage，且 TP rank 0）调 `BlendedMegatronDatasetBuilder`；建了数据集的 rank 建 `DataLoader`；然后 `get_batch`。
# `get_batch` 只在 git tag 的 `pretrain_gpt.py` 里；`get_batch_on_this_tp_rank` 随 pip 包安装，但它每次广播不留字段名，
# 所以 `snippets.data.batch_flow` 按 tag 上的逻辑重写了这两个函数（测试核对重写与真实函数发出同样的广播）；
# 展平和 CP 切分调用的是真实的 `megatron.core.utils.flatten_batch_for_packed_sequences`、`get_batch_on_this_cp_rank`。
# 每个 collective 都被 `snippets.record.recorder` 记下。
#
# 每个 rank 上跑的是 `snippets/experiments/n03_batch_flow.py` 里的 `run`。序列长度、micro-batch 和词表是参数 `dims`，
# 本篇用它的 `tiny`：seq 8、micro-batch 2、vocab 32（数据集要 micro-batch × `microbatches` = 4 个样本）。`run` 先让
# global rank 0 用 `write_corpus` 把上面语料 a 的三篇文档（长度按 seq 缩放：5/8、3/8、7/8）写进一个临时目录，
# 路径用 `broadcast_object_list` 发给各 rank（不在记录里，也不打印），再调 `data_flow`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(data_flow, run)

# %%
TINY = EXPERIMENTS["batch-flow"].tiny
TP_CP = Parallel(world=4, tp=2, cp=2)
tp_cp = run_ranks(run, 4, TINY, TP_CP, grid=dict(tp=2, cp=2))
summary_table(tp_cp, TP_CP)

# %% [markdown]
# - **建数据集**：TP rank 0 的两个 rank（0、2，两个 CP 坐标）建，另外两个只陪一次 world barrier。
#   `build_generic_dataset` 让 global rank 0 先建（写索引缓存），barrier 之后其余要建的 rank 再建（读缓存）。
# - **读数据**：只有 rank 0、2 有 data iterator；它们处在同一个 DP 坐标，读到的是同一条样本。
# - **广播**：每个 rank 发出 5 次 broadcast，全在 TP 群里；之后 `tokens` 只剩 `[2, 4]`——CP 切掉了一半序列。
#
# rank 0（发送方）记下的每一次广播，以及 rank 1（接收方）按路线图格式记下的同一串 collective：

# %%
sender_table(tp_cp[0])

# %%
receiver_table(tp_cp[1])

# %% [markdown]
# 5 次，每个字段一次：先是四个逐样本的 `[b, s]` 字段（`position_ids` 在 mask 之前），`attention_mask` 最后
# （[utils.py:2214](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2214) 前后）。这份数据没有 packing，`--sft` /
# `--dataloader-inter-document-masking` 都没开，`cu_seqlens`、`max_seqlen` 就一次也不发（见遗留问题 1）。
#
# > **旧版（core_v0.16.1）：** 9 次：`attention_mask` 排在 `position_ids` 之前，末尾还无条件把空的 `cu_seqlens`（长度 + 内容）
# > 重发一遍（遗留问题 1）。core_v0.18.0 已与 0.19.0 相同，只是决定发不发 `cu_seqlens` 的开关只有 `--sft`。
#
# ### CP 切分：每个 rank 留哪两块
#
# 这份数据没有 `cu_seqlens`，`get_batch_on_this_cp_rank` 就交给整条序列的切法
# [`_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456)：把序列维 `view` 成
# `2·CP = 4` 块（每块 2 个 token），CP rank `r` 留第 `r` 块和第 `2·CP−1−r` 块。`position_ids` 正好暴露了每个 rank 留下的是原序列的哪些位置：

# %%
chunk_table(tp_cp, TINY, TP_CP)

# %% [markdown]
# 为什么是"一头一尾"：causal attention 里第 `i` 个 token 要和前 `i` 个 token 算，越靠后的块越贵。按 0,1 | 2,3 直接对半切，
# CP rank 1 的工作量约是 rank 0 的 3 倍；切成 4 块、各取一头一尾（0+3、1+2），两边相等。
# `attention_mask` 只切了**行**（query，第 2 维）变成 `[2, 1, 4, 8]`，列（key）仍是整条序列——本 rank 的 query
# 要看的 key 分散在别的 rank 上，attention 里靠 K/V 在 CP 群里传递补齐（[笔记 16](../16_context_parallel/)）。
# 同一 TP 群的两个 rank（0 与 1、2 与 3）留下的完全相同：TP 切的是权重，不是数据。
#
# 把同一次运行画出来：每行一个 rank，左边是 TP 广播之后它手里的整条 `tokens[0]`（上方数字是位置），右边是 CP 切分后
# 留下的两块；深色块归 CP rank 0，浅色块归 CP rank 1。

# %%
draw_batch_flow(tp_cp, TINY.seq, TP_CP.tp, TP_CP.cp, title="一个 micro-batch 经过 get_batch：TP 群内广播，再按 CP 坐标切序列")
#
# ### 每个 pipeline stage 广播什么：TP=2、PP=3
#
# 同一个函数换成 6 个 rank、三个 stage：

# %%
TP_PP = Parallel(world=6, tp=2, pp=3)
tp_pp = run_ranks(run, 6, TINY, TP_PP, grid=dict(tp=2, pp=3))
role_table(tp_pp, TP_PP)

# %% [markdown]
# - **首 stage**（rank 0、1）只广播输入侧：`tokens`、`position_ids`，最后 `attention_mask`；`labels`、`loss_mask` 为 None。
# - **尾 stage**（rank 4、5）只广播目标侧：`labels`、`loss_mask`，最后 `attention_mask`；`tokens`、`position_ids` 为 None。
#   发送方读到的是全部字段，但它也把本 stage 用不到的置成 None（[utils.py:2225](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2225)），
#   所以 rank 4 和 rank 5 手里的一样。
# - **中间 stage**（rank 2、3）不 packing 时根本不进 `get_batch_on_this_tp_rank`：它的输入是上一个 stage 传来的 hidden states
#   （pipeline 见[笔记 13](../13_pipeline_schedules/)）。它也不建数据集，只陪 builder 的 barrier。packed 数据
#   （`--sft` 或 inter-document masking）例外：中间 stage 的 attention 也要知道文档边界，`get_batch` 不再提前返回，
#   它只收 `cu_seqlens` 与 `max_seqlen`（[utils.py:2252](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2252)）。
#
# ### packed sequence：`cu_seqlens` 与 `max_seqlen`
#
# 上面的样本跨文档拼接，缺省 mask 让后一篇文档的 token 也看得见前一篇。有两种办法把文档隔开：
#
# 1. **在数据集里**：`reset_attention_mask=True` 造块对角的 causal mask，`reset_position_ids=True` 让每篇文档的位置从 0 重来。
#    mask 是 `[s, s]` 的稠密张量，attention 仍然算满 `s × s`。
# 2. **packed / THD 格式**：不造 mask，只告诉 attention 每篇文档在拼接序列里的起止——`cu_seqlens`
#    （累积长度，`[0, 4, 8]` 表示两段 `[0, 4)`、`[4, 8)`）和 `max_seqlen`（最长一段，用来定 kernel 的分块）。
#    Transformer Engine 的 attention 按段计算，不算段与段之间。
#
# 取一个中间含 EOD 的样本，先看第 1 种办法造出的字段：

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
# 第 2 种办法的元数据也由 `GPTDataset` 自己给：`GPTDatasetConfig(inter_document_masking=True)`（正式入口的
# `--dataloader-inter-document-masking`）时，`__getitem__` 不造 mask，改为给出 `cu_seqlens` 和 `max_seqlen`，
# 并同样按文档重置 `position_ids`（[gpt_dataset.py:287](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L287)）。同一个样本：

# %%
doc_config = dataclasses.replace(config, inter_document_masking=True)
doc_ds, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [6, None, None], lambda: True, doc_config).build()
doc_sample = doc_ds[packed_index]
print("字段:", sorted(doc_sample))
print("tokens 相同:", torch.equal(doc_sample["tokens"], packed["tokens"]),
      " position_ids 相同:", torch.equal(doc_sample["position_ids"], packed["position_ids"]))
print("cu_seqlens:", doc_sample["cu_seqlens"].tolist(), " max_seqlen:", int(doc_sample["max_seqlen"]))

# %% [markdown]
# `cu_seqlens` 被补到 `s + 1` 项、尾部用 `s` 填满：各样本的文档数不同，补成等长 `DataLoader` 才能把它们叠成一批。
# 补齐在 `get_batch` 里去掉：TP 广播之后，[`flatten_batch_for_packed_sequences`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2565)
# 把一个 micro-batch 的几条样本首尾相接（第 `i` 条的边界加 `i·s`），`[b, s]` 摊平成 `[1, b·s]`，`max_seqlen` 取最大；
# `forward_step` 再用它造 `PackedSeqParams`（[pretrain_gpt.py:323](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L323)）。micro-batch 2 时
# （第 0 条样本内没有文档边界，第 1 条在位置 2 断开）：

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
Table(["PackedSeqParams 字段", "值"],
      [[f.name, getattr(params, f.name).tolist() if torch.is_tensor(getattr(params, f.name)) else getattr(params, f.name)]
       for f in dataclasses.fields(params)])

# %% [markdown]
# > **旧版（core_v0.18.0）：** 只有 SFT 的 packed 数据带 `cu_seqlens`（`GPTDataset` 还没有 `inter_document_masking`），
# > 也没有 `flatten_batch_for_packed_sequences`：接收方按 `(1, n)` 分配 `cu_seqlens`，即 packed 时 micro-batch 只能是 1
# > （[core_v0.18.0 的 `get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/utils.py#L1979)）。

# %% [markdown]
# 本地 attention（`DotProductAttention`）断言 `packed_seq_params is None`，THD 只能在 TE 上跑。它和第 1 种办法算的是同一个数，
# 在 CPU 上可以用真实的 `GPTModel`（local spec）验证：同一个 packed 样本，用块对角 mask + 重置位置跑一次，
# 把各文档拆开各跑一次，逐 token 的 loss 应该相同；用缺省 mask 跑，后面文档的 loss 就变了。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def packed_vs_separate(sample, cu_seqlens):
    from snippets.models.tiny_gpt import tiny_config

    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    mpu.initialize_model_parallel()
    torch.manual_seed(0)  # the full weights come from the default generator (use_cpu_initialization)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(config=tiny_config(num_layers=2), transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=32, max_sequence_length=8)
    tokens, labels = sample["tokens"][None], sample["labels"][None]
    causal = torch.ones(1, 1, 8, 8).tril() < 0.5
    with torch.no_grad():
        block = model(tokens, sample["position_ids"][None], sample["attention_mask"][None], labels=labels)
        plain = model(tokens, torch.arange(8)[None], causal, labels=labels)
        pieces = []
        for start, end in zip(cu_seqlens[0][:-1].tolist(), cu_seqlens[0][1:].tolist()):
            n = end - start
            pieces.append(model(tokens[:, start:end], torch.arange(n)[None],
                                torch.ones(1, 1, n, n).tril() < 0.5, labels=labels[:, start:end]))
    return block[0], plain[0], torch.cat(pieces, dim=1)[0]


cu_seqlens = flatten_batch_for_packed_sequences({k: v[None] for k, v in doc_sample.items()})["cu_seqlens"]
block, plain, separate = run_ranks(packed_vs_separate, 1, packed, cu_seqlens)[0]
def rounded(t):
    return [round(x, 4) for x in t.tolist()]


print("块对角 mask + 重置位置:", rounded(block))
print("各文档分开跑        :", rounded(separate))
print("缺省 causal mask    :", rounded(plain))
print("块对角 == 分开跑:", torch.allclose(block, separate, atol=1e-6),
      " 缺省 == 分开跑:", torch.allclose(plain, separate, atol=1e-6))

# %% [markdown]
# 第一段的 token 三者相同（第一篇文档本来就只看得见自己）；之后的只有块对角 mask 与"分开跑"一致。
# `cu_seqlens` 表达的就是这个块结构，只是不用物化 `s × s` 的 mask，也不算块外的 `QKᵀ`。

# %% [markdown]
# ## 机制解释
#
# **三层数据集。** 底层 `IndexedDataset` 只会"按下标取一条 token 序列"（mmap `.bin`）；中层 `GPTDataset` 把文档
# 按 `document_index` 首尾相接，再按 `sample_index` 切成 `sequence_length + 1` 的窗口，`shuffle_index` 再打乱；
# 顶层 `BlendedDataset` 按权重在几个中层数据集之间交错取样本。三张索引表在 rank 0 上造好（`sample_index` 用 C++ helper）
# 并写成 `.npy` 缓存，其余 rank 读缓存——这就是 builder 里"rank 0 先建、barrier、其余再建"的原因。
#
# **样本即窗口。** 一个样本是连续 `s + 1` 个 token，`tokens` 取前 `s` 个，`labels` 取后 `s` 个。因此 `labels[i] = tokens[i+1]`，
# 训练目标是"下一个 token"。文档之间只隔一个 EOD，不加处理时 attention 会跨文档；`reset_attention_mask` /
# `reset_position_ids`（稠密 mask）或 packed 格式（`cu_seqlens`）把它们隔开。
#
# **只有一个 rank 读盘。** 同一 TP 群的 rank 需要完全相同的 batch（它们合起来是一个模型副本）。与其让每个 rank 各读一份、
# 祈祷顺序一致，不如让 TP rank 0 读、广播给其余。接收方不知道数据长什么样，只能按 `args`（`micro_batch_size`、
# `seq_length`、是否在 dataloader 里造 mask、是否 packed）预先分配缓冲——所以广播的顺序、shape、dtype 是发送方和接收方之间的隐式协议，
# 两边任何一处不一致都会错配（遗留问题 2 是 0.16.1 的一个实例）。0.19.0 让两边只看同一组开关，而不是发送方看数据、接收方看开关。
#
# **只广播本 stage 用得到的。** 首 stage 做 embedding，要 `tokens`、`position_ids`、`attention_mask`；尾 stage 算 loss，
# 要 `labels`、`loss_mask`（中间层的 attention 也要 mask）；中间 stage 的输入是上一 stage 的激活，不碰数据
# ——packed 数据除外，它的文档边界每一层的 attention 都要，所以中间 stage 也收 `cu_seqlens`。
#
# **CP 切分是纯索引。** 没有通信；每个字段按自己的序列维（`attention_mask` 是第 2 维）切。它发生在 TP 广播之后，
# 因为同一 CP 群的 rank 各自读了同一条样本（它们有相同的 DP 坐标），各取自己那两块即可。

# %% [markdown]
# ## 与训练主链路的关系
#
# 数据在 `pretrain` 里建一次（`build_train_valid_test_data_iterators`），每个 micro-batch 在 `forward_step` 开头取一次：
# `forward_backward_func` 每调用一次 `forward_step` 就推进一次 iterator，一个 global batch 推进 `num_microbatches` 次。
# simple loop 里这两步是 `get_train_data_iterator()` 和 `forward_step_func` 里的 `next(data_iterator)`：它没有 TP 广播，
# 每个 rank 各自建 mock 数据集和 `shuffle=True` 的 `DataLoader`——同一 TP 群的 rank 读到同一批，只能靠各进程的 CPU
# 随机数状态恰好一致（它没有显式设 CPU 种子）；也没有 CP 切分。取到的五个张量原样进 `GPTModel.forward(tokens, position_ids, attention_mask, labels=...)`，
# `loss_mask` 留给 `loss_func`（[笔记 05](../05_forward_loss_backward/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **语言模型的 teacher forcing**：一次前向同时训练 `s` 个"给定前缀预测下一个 token"的任务，`labels` 是 `tokens` 左移一位，
#   causal mask 保证位置 `i` 只看 `≤ i`。
# - **broadcast**：一个 rank 的张量复制到群里所有 rank，各 rank 必须以相同顺序、相同 shape 调用——这与 NCCL / gloo 的
#   collective 语义一致，也是 `get_batch_on_this_tp_rank` 的脆弱之处。
# - **负载均衡**：causal attention 的代价随位置线性增长，"一头一尾"的切法是经典的 zig-zag 均衡。
# - **varlen attention**：`cu_seqlens` 与 FlashAttention 的 `flash_attn_varlen_func` 用的是同一种表示。

# %% [markdown]
# ## 遗留问题
#
# 1. **`cu_seqlens` 只在开关说"packed"时才发，而且只发一次（已修，运行确认）。** 0.19.0 的
#    `get_batch_on_this_tp_rank` 不看数据里有没有 `cu_seqlens`，只看 `get_batch` 按 `--sft` /
#    `--dataloader-inter-document-masking` 算出的 `has_cu_seqlens`（[pretrain_gpt.py:106](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L106)）：
#    为真时每个 stage 分支里先发长度、再发内容，紧跟着 `max_seqlen`，最后才是 mask（[`utils.py:2214`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2214)）；
#    为假时一次也不发。下面第一格把 `inter_document_masking` 的样本交给一对收发方：开关打开时 7 次广播、两边对得上；
#    同一份数据、开关关着时只发 4 个字段，`cu_seqlens` 不发，接收方也不等它。
#
# > **旧版（core_v0.16.1）：** `get_batch_on_this_tp_rank` 还在 `megatron/training/utils.py`：按 stage 分支广播之后，
# > 收发两边又各调一次 `_broadcast_cu_seqlens` 再广播一次 `max_seqlen`，PP=1、不 packing 时 9 次广播里 4 次花在空的 `cu_seqlens` 上
# > （[core_v0.16.1 的 utils.py 第 604 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/training/utils.py#L604)）。core_v0.18.0 已与 0.19.0 相同（开关名叫 `is_sft`）。
#
# 2. **带 `max_seqlen` 的 packed 数据在 TP>1 时错位（已修）。** 0.19.0 的接收方在 `has_cu_seqlens` 或 hybrid CP 时为
#    `max_seqlen` 分配 `[micro_batch]` 的缓冲（[`utils.py:2285`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2285)），发送方在同一条件下发它，
#    所以下面第一格里 `max_seqlen` 两边对得上。
#
# > **旧版（core_v0.16.1）：** 接收方只在 hybrid CP 时分配 `max_seqlen` 的缓冲（后一次赋值覆盖了按 `args.sft` 分配的那一个），
# > 发送方却只要数据里有 `max_seqlen` 就发（[core_v0.16.1 的 utils.py 第 671 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/training/utils.py#L671)）：
# > 用 `PairedBroadcast` 对放时第 8 次接收错位，真实 gloo rank 上接收方把 `max_seqlen` 的字节读成长度而试图分配几十 TB。
# > 上游有 [issue #4092](https://github.com/NVIDIA/Megatron-LM/issues/4092) 与 [PR #4103](https://github.com/NVIDIA/Megatron-LM/pull/4103)；core_v0.18.0 已修。
#
# 3. **`cu_seqlens_padded` 有了通道，却没有数据集填它。** 0.19.0 的 `get_batch` 返回 `BATCH_KEYS` 里的全部 10 个键，
#    packed 且 CP>1 时 `cu_seqlens_padded` 也按"先长度、后内容"广播（下面第二格：长度为 0）。但 tag 里的 `GPTDataset`
#    和 `SFTDataset` 只给 `cu_seqlens`，所以它实际总是 None，`forward_step` 退回用 `cu_seqlens`。
#    （0.16.1 的接收方返回的 dict 里根本没有这个键。）
# 4. **simple loop 的 mock 数据比看上去贵。** sizes `[1000, None, None]` 仍会为 train / valid / test 各建一个整 epoch 的
#    索引（上面 seq 64 时每个约一百万样本）；把序列长度改小，样本数和建索引时间成比例变大（seq 8 时约 850 万个）。
# 5. **inter-document masking + PP≥3 的中间 stage 没有数据可读（读代码所见，未运行）。** 开了
#    `--dataloader-inter-document-masking`（不开 `--sft`）时 `has_cu_seqlens` 为真，中间 stage 不再提前返回，
#    它的 TP rank 0 要 `next(data_iterator)` 去取 `cu_seqlens`；可 `is_dataset_built_on_rank` 只在 SFT 时让中间 stage 建数据集
#    （[pretrain_gpt.py:361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L361)），那里的 data iterator 是 None。本站的 CPU 实验没有覆盖这条路径。

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
# Megatron builds GPT data in three layers: an `IndexedDataset` memory-maps `.bin` tokens with an `.idx` of lengths;
# `GPTDataset` concatenates documents and cuts windows of `s + 1` tokens, so `labels` are `tokens` shifted by one;
# `BlendedDataset` mixes datasets by weight. `core_gpt_dataset_config_from_args` fills `GPTDatasetConfig` from args.
# Per micro-batch, only TP rank 0 reads; `get_batch_on_this_tp_rank` broadcasts the fields its pipeline stage needs
# (5 broadcasts at PP=1, the mask last; `cu_seqlens` only when `--sft` or inter-document masking says the data is
# packed), then `get_batch_on_this_cp_rank` keeps chunks `r` and `2·CP−1−r` for load balance.
# Packed data replaces the mask by `cu_seqlens`, which `GPTDataset` itself can emit since 0.19.0.
