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
# # 18 数据专题：从 args 到 batch
#
# 第三轮第 1 篇。[笔记 03](../03_data_and_batch_flow/) 已经把数据链路走通了一遍（`.bin/.idx` → `GPTDataset` →
# `get_batch` 的 TP 广播与 CP 切分），这里不再重复，而是逐条回答路线图"数据专题"的关注点，外加续训时数据怎么接上：
# 每一条都用一次运行回答——真实的 `megatron.core`、本机 CPU 上的 gloo rank、极小的 shape；只有读代码才能回答的，
# 给出 tag 上的确切行。语料用 Megatron 自己的 `IndexedDatasetBuilder` 写在临时目录里（页面不打印任何路径）。

# %% [markdown]
# ## 阅读目标
#
# 1. **args → `GPTDatasetConfig`**：一条命令行经过哪三个函数变成配置和三个 split 的样本数；`--data-path` 的权重怎么解析。
# 2. **builder 怎么造 train / valid / test**：`--split` 怎样切文档；每个 split 的 document / sample / shuffle 三张索引表长什么样；
#    epoch 数怎么定、"最后一个 epoch 单独打乱"是什么；为什么续训时改 `--train-iters` 会换掉数据顺序。
# 3. **blend**：两个语料按 0.7 / 0.3 混合时各 split 有多少样本，实测每个前缀里来自各语料的比例与权重差多少。
# 4. **五个字段怎样进 forward**：`tokens`、`labels`、`loss_mask`、`attention_mask`、`position_ids` 各被 `GPTModel` 的哪个模块读到，
#    哪个字段模型根本不读。
# 5. **TP / CP / PP 下的分发**：TP 广播与 CP 切分见笔记 03、[笔记 16](../16_context_parallel/)；本篇用运行回答每个 pipeline stage 真正需要哪些字段。
# 6. **packed sequence**：`cu_seqlens`、`max_seqlen` 从 `PackedSeqParams` 一路到 RoPE 和 core attention 的路径，CPU 上卡在哪一行，它们对结果有什么影响。
# 7. **续训跳过已消费的样本**：`consumed_train_samples` 怎么记、怎么存、怎么让 sampler 从断点接着读；换 DP 大小续训会怎样。

# %% [markdown]
# ## 源码位置
#
# **核心文件**（路线图"数据专题"下留空的那一栏）：
#
# - [`indexed_dataset.py::IndexedDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L923)、[`indexed_dataset.py::IndexedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L597)：`.bin/.idx` 的写与读
# - [`gpt_dataset.py::GPTDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L106)：三张索引表、样本、五个字段
# - [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L29)：split、blend、谁先建
# - [`blended_dataset.py::BlendedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_dataset.py#L25)：按权重交错
# - [`blended_megatron_dataset_config.py::BlendedMegatronDatasetConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L16)：`split` → `split_matrix`、`mock`
# - [`helpers.py::build_sample_idx`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.py#L12) 与 [`megatron/core/datasets/helpers.cpp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.cpp)：C++ 写的 sample index 与 blend index（pip 包里是编译好的 `helpers_cpp`，CPU 上直接可用）
# - [`pretrain_gpt.py::core_gpt_dataset_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L377)、[`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97)、[`pretrain_gpt.py::loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L209)
# - [`utils.py::get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2119)、[`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612)、[`utils.py::_get_batch_on_this_cp_rank_per_document_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2406)（都在 `megatron/core/utils.py`）
# - [`packed_seq_params.py::PackedSeqParams`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/packed_seq_params.py#L10)
# - [`data_samplers.py::MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115)、[`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513)
#
# **本篇逐条读到的符号：**
#
# - [`common_utils.py::get_blend_and_blend_per_split`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/utils/common_utils.py#L507)：`--data-path` / `--*-data-path` → `blend` / `blend_per_split`
# - [`utils.py::get_blend_from_list`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/utils.py#L49)：`["0.7", "a", "0.3", "b"]` → `(["a", "b"], [0.7, 0.3])`
# - [`training.py::get_train_valid_test_num_samples`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4464)：三个 split 各要多少样本
# - [`blended_megatron_dataset_config.py::convert_split_vector_to_split_matrix`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L175)：`"6,2,2"` → 三段区间
# - [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder._build_blended_dataset_splits`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L136)：单语料 / blend / 按 split 的 blend 三条路
# - [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder._build_megatron_dataset_splits`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L416)：按 `split_matrix` 切出文档区间
# - [`blended_megatron_dataset_builder.py::_get_size_per_split_per_dataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L553)：blend 里每个语料要多少样本（含 surplus）
# - [`gpt_dataset.py::GPTDataset._build_document_sample_shuffle_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L440)：三张索引表
# - [`gpt_dataset.py::GPTDataset._get_num_epochs`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L676)：要几个 epoch 才够 `num_samples`
# - [`gpt_dataset.py::_build_document_index`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L699)、[`gpt_dataset.py::_build_shuffle_index`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L733)：文档打乱、样本打乱（最后一个 epoch 可单独打乱）
# - [`gpt_dataset.py::GPTDataset._query_document_sample_shuffle_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L353)：下标 → 三张表 → token 窗口
# - [`blended_dataset.py::BlendedDataset._build_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_dataset.py#L111)：`dataset_index`、`dataset_sample_index`（C++ `build_blending_indices`）
# - [`gpt_model.py::GPTModel.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L519)：五个字段（和 `packed_seq_params`）的入口
# - [`language_model_embedding.py::LanguageModelEmbedding.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L99)：读 `input_ids`；只有 learned_absolute 才读 `position_ids`
# - [`rotary_pos_embedding.py::RotaryEmbedding.get_rotary_seq_len`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L212)：RoPE 表的长度：packed 时就是 `max_seqlen`
# - [`rope_utils.py::_apply_rotary_pos_emb_thd`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L189)：packed 时按 `cu_seqlens` 每段从位置 0 起
# - [`attention.py::Attention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1278)：THD 时去掉 batch 维、挑 `cu_seqlens`、调 core attention
# - [`dot_product_attention.py::DotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L142)：本地 attention：断言没有 packed 参数
# - [`transformer_engine.py::TEDotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1972)：TE attention：把 `PackedSeqParams` 的字段原样交给 TE
# - [`data_samplers.py::build_pretraining_data_loader`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L19)：`DataLoader(batch_sampler=MegatronPretrainingSampler(consumed_samples=...))`
# - [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342)：每步 `consumed_train_samples += dp × mbs × m`（[`training.py:3942`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3942)）
# - [`checkpointing.py::load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066)：从 checkpoint 里的 `args` 取回 `consumed_train_samples`（[`checkpointing.py:2499`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499)）

# %% [markdown]
# ## 调用链
#
# ```text
# pretrain_gpt.py  (__main__)
# └─ megatron/training/training.py::pretrain
#    ├─ initialize_megatron → parse_args / validate_args            # args.data_parallel_size = world // (tp·pp·cp)
#    ├─ setup_model_and_optimizer → load_checkpoint                 # args.consumed_train_samples ← checkpoint 里的 args
#    └─ build_train_valid_test_data_iterators
#       └─ build_train_valid_test_data_loaders                      # consumed_train_samples 在这里被读一次
#          ├─ get_train_valid_test_num_samples()                    # [train_iters·gbs, (train_iters//eval_interval+1)·eval_iters·gbs, eval_iters·gbs]
#          ├─ pretrain_gpt.py::train_valid_test_datasets_provider
#          │  ├─ core_gpt_dataset_config_from_args(args)
#          │  │  └─ megatron/training/utils.py::get_blend_and_blend_per_split
#          │  │     └─ megatron/core/datasets/utils.py::get_blend_from_list   # 奇数个 → 无权重；偶数个 → (权重, 前缀) 成对
#          │  └─ BlendedMegatronDatasetBuilder(cls, sizes, is_built_on_rank, config).build()
#          │     └─ _build_blended_dataset_splits
#          │        ├─ 每个前缀：_build_megatron_dataset_splits                  # 按 split_matrix 切文档区间
#          │        │  └─ GPTDataset(...)._build_document_sample_shuffle_indices # rank 0 先建并写 .npy，world barrier
#          │        │     ├─ _build_document_index                           # numpy RandomState(seed) 打乱文档
#          │        │     ├─ helpers.build_sample_idx (C++)                  # 每个样本的起点
#          │        │     └─ _build_shuffle_index                            # 打乱样本
#          │        └─ 多于一个前缀：BlendedDataset(datasets, weights, size)
#          │           └─ helpers.build_blending_indices (C++)             # 贪心交错，不随机
#          └─ megatron/training/datasets/data_samplers.py::build_pretraining_data_loader(ds, consumed_train_samples)
#             └─ MegatronPretrainingSampler                              # 从 consumed 起，每块 mbs·dp 个下标，DP rank r 取第 r 份
#
# train → train_step → forward_backward_func → pretrain_gpt.py::forward_step
# ├─ get_batch                                                     # TP 群 broadcast，CP 切分（笔记 03）；中间 stage 全是 None（packed 时只拿 cu_seqlens、max_seqlen）
# ├─ GPTModel.forward(tokens, position_ids, attention_mask, labels=, loss_mask=, packed_seq_params=)
# │  ├─ embedding.word_embeddings(tokens)                           # 首 stage
# │  ├─ embedding.position_embeddings(position_ids)                 # 只有 learned_absolute
# │  ├─ rotary_pos_emb(rotary_seq_len)                              # RoPE：只要长度；packed 时 = max_seqlen
# │  ├─ 每层 Attention.forward
# │  │  ├─ apply_rotary_pos_emb(..., cu_seqlens)                    # packed：每段从位置 0 起
# │  │  └─ core_attention(q, k, v, attention_mask, packed_seq_params)  # local：断言不能 packed；TE：交给 kernel
# │  └─ compute_language_model_loss(labels, logits)                 # 尾 stage，每个 token 一个 loss
# ├─ loss_func(loss_mask, output)                                   # sum(losses·loss_mask)、num_tokens
# └─ train 里：args.consumed_train_samples += dp·mbs·num_microbatches
# ```
#
# **每个函数的阅读记录**（roadmap 第一轮的七问；笔记 03 已记过的不再重复）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_blend_and_blend_per_split` | `args` | `(blend, blend_per_split)` | `get_blend_from_list` | 否 | 否 | 否 | 无（simple loop 用 mock，无 blend） |
# | `get_train_valid_test_num_samples` | `args` | 三个 split 的样本数（下限） | 无 | 否 | 否 | 否 | `BlendedMegatronDatasetBuilder(..., [1000, None, None], ...)` 里手写的 sizes |
# | `_build_blended_dataset_splits` | config、sizes | 三个顶层数据集 | `GPTDataset`、`BlendedDataset`、`_get_size_per_split_per_dataset` | world barrier（经 `build_generic_dataset`） | 按 `split_matrix` 切文档 | 否（写索引缓存） | `.build()` |
# | `GPTDataset._build_document_sample_shuffle_indices` | 文档区间、`num_samples`、seed | 三张索引表 | `helpers.build_sample_idx` | 只问 rank | 否 | 否（写 `.npy`） | 同上 |
# | `BlendedDataset._build_indices` | 权重、size | `dataset_index`、`dataset_sample_index` | `helpers.build_blending_indices` | 只问 rank | 否 | 否 | 无 |
# | `MegatronPretrainingSampler.__iter__` | `consumed_samples`、mbs、DP rank / size | 每个 micro-batch 的下标 | 无 | 否（DP 坐标由调用方给） | **是**：按 DP rank 分样本 | 否（只读 consumed） | `DataLoader(shuffle=True)` |
# | `GPTModel.forward` | 五个字段 + `packed_seq_params` | 每 token 的 loss `[b, s]`（或 logits） | embedding、RoPE、`TransformerBlock`、输出层 | TP / CP 群（层内） | 否 | 否（只建图） | `model(tokens, position_ids, attention_mask, labels=labels)` |
# | `RotaryEmbedding.get_rotary_seq_len` | 输入、config、`packed_seq_params` | 一个整数 | 无 | 否 | 否 | 否 | 同上（内部） |
# | `_apply_rotary_pos_emb_thd` | `[t, h, d]`、`cu_seqlens`、RoPE 表 | 同 shape | `_apply_rotary_pos_emb_bshd` | 读 CP 群大小 | 按段取 RoPE 行 | 否 | 无（simple loop 不 packing） |
# | `DotProductAttention.forward` | q、k、v、mask、`packed_seq_params` | `[s, b, h]` | `FusedScaleMaskSoftmax` | 否 | 否 | 否 | 同上（内部） |
# | `loss_func`（pretrain_gpt） | `loss_mask`、每 token loss | `(loss 之和, token 数, 报告)` | 无 | 否 | 否 | 否 | simple loop 的 `loss_func` |
# | `train`（只看数据这一面） | data iterator | 无 | 无 | 否 | 否 | **是**：`consumed_train_samples` | 训练循环本身 |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import math
import re
import tempfile
from collections import Counter

import numpy
import torch

from snippets.data.batch_flow import FIELDS, STAGE_FIELDS
from snippets.data.pictures import draw_blend
from snippets.data.dataset_args import (CONFIG_FROM_ARGS, core_gpt_dataset_config_from_args,
                                   get_train_valid_test_num_samples, parse_args)
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n03_batch_flow import write_corpus
from snippets.experiments.n18_data_topic import (build_table, checks, consumed_line, read_iterations, reading_ranks,
                                             resume_table, run)
from snippets.ranks.launch import RankError, run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import get_blend_from_list
from megatron.core.tokenizers import MegatronTokenizer

# %% [markdown]
# ## 关键对象
#
# ### 两个小语料
#
# 语料 a：10 篇文档，长 2–5 个 token（加 EOD 后 3–6），token 依次递增，便于认出来自哪里；语料 b：8 篇，token 是 20–24 的重复。
# 每篇文末加 EOD，和 `tools/preprocess_data.py` 最后一步一样用 `IndexedDatasetBuilder` 写
# （笔记 03 实验模块里的 `write_corpus`）。tokenizer 就是 `--tokenizer-type NullTokenizer --vocab-size 32` 建出的那个：
# core 的 `null-text` 库（[`build_tokenizer.py:88`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L88)），`--vocab-size` 把 EOD 也算在内，
# EOD 取最后一个 id，32 − 1 = 31（[`null_tokenizer.py:19`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/text/libraries/null_tokenizer.py#L19)）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)
workdir = tempfile.TemporaryDirectory()
lengths = [2 + i % 4 for i in range(10)]
starts = numpy.cumsum([0] + lengths[:-1])
corpus_a = write_corpus(workdir.name, "a", [[int(s + j) % 30 for j in range(n)] for s, n in zip(starts, lengths)],
                        tokenizer.eod)
corpus_b = write_corpus(workdir.name, "b", [[20 + i % 5] * (3 + i % 3) for i in range(8)], tokenizer.eod)
NAMES = {corpus_a: "a", corpus_b: "b"}  # print names, never temporary paths
indexed_a, indexed_b = IndexedDataset(corpus_a), IndexedDataset(corpus_b)  # keep them: see 遗留问题 7
print("a 的文档长度（含 EOD）:", indexed_a.sequence_lengths.tolist())
print("b 的文档长度（含 EOD）:", indexed_b.sequence_lengths.tolist())

# %% [markdown]
# ### 1. 从命令行到 `GPTDatasetConfig`
#
# 正式入口里这一步分三处（都不在 pip 包里，`snippets/data/dataset_args.py` 用 Megatron 的名字重写了它们）：
#
# 1. [`common_utils.py::get_blend_and_blend_per_split`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/utils/common_utils.py#L507)：
#    `--data-path`（或 `--train/valid/test-data-path`，或写在文件里的同样内容）交给 core 的 `get_blend_from_list`；
# 2. [`pretrain_gpt.py::core_gpt_dataset_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L377)：
#    一个 `字段: args.x` 的字典字面量，原样传给 `GPTDatasetConfig`；
# 3. [`training.py::get_train_valid_test_num_samples`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4464)：
#    三个 split 各要多少样本。
#
# 下面这条命令行就是本篇的训练配置：DP=2、micro-batch 1、global batch 4（所以每步 2 个 micro-batch）、训练 4 步、每 2 步验证 1 步：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
COMMAND = (f"--data-path {corpus_a} --split 6,2,2 --seq-length 4 --micro-batch-size 1 --global-batch-size 4 "
           "--train-iters 4 --eval-interval 2 --eval-iters 1 --tokenizer-type NullTokenizer --vocab-size 32")
args = parse_args(COMMAND, world_size=2)
config = core_gpt_dataset_config_from_args(args, tokenizer)
sizes = get_train_valid_test_num_samples(args)


def shown(value):
    if isinstance(value, tuple) and value and isinstance(value[0], list):  # a blend
        return ([NAMES.get(p, p) for p in value[0]], value[1])
    return "NullTokenizer" if value is tokenizer else value


Table(["GPTDatasetConfig 字段", "取自", "值"],
      [[field, f"args.{attr}" if attr else "（计算得出）", shown(getattr(config, field))]
       for field, attr in CONFIG_FROM_ARGS.items()
       if field in ("random_seed", "sequence_length", "blend", "split", "path_to_cache", "tokenizer",
                    "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "create_attention_mask",
                    "mid_level_dataset_surplus", "data_parallel_size")])

# %% [markdown]
# `__post_init__` 接着把 `split` 变成区间，并据 blend 是否为空决定 `mock`；三个 split 的样本数来自第 3 个函数：

# %%
print("split_matrix:", config.split_matrix, " mock:", config.mock)
print("sizes [train, valid, test]:", list(sizes))
print("  train = train_iters·gbs =", args.train_iters * args.global_batch_size,
      "; valid = (train_iters // eval_interval + 1)·eval_iters·gbs =",
      (args.train_iters // args.eval_interval + 1) * args.eval_iters * args.global_batch_size,
      "; test = eval_iters·gbs =", args.eval_iters * args.global_batch_size)

# %% [markdown]
# `--data-path` 的写法由 `get_blend_from_list` 认：个数为奇数 ⇒ 全是前缀、没有权重；偶数 ⇒ 试着按 (权重, 前缀) 成对读，
# 有一个权重读不成数就整体当作前缀。权重不必归一化（builder 里再 `normalize`）。真实函数对几种写法的结果：

# %%
written = [["a"], ["a", "b"], ["0.7", "a", "0.3", "b"], ["30", "a", "70", "b"], ["a", "b", "c"],
           ["0.5", "a", "b", "c"]]
Table(["--data-path", "blend = (前缀, 权重)"], [[" ".join(w), get_blend_from_list(w)] for w in written])

# %% [markdown]
# 最后一行是一个漏写了权重的命令行：`0.5 a b c` 没有报错，`"0.5"` 被当成了第一个语料的路径，到建数据集时才会因找不到文件失败。
# 代码本意是"要么全有权重、要么全没有"，但那个检查从不触发（遗留问题 1）。
#
# ### 2. builder 怎么造 train / valid / test
#
# 单语料时 `_build_blended_dataset_splits` 直接走 `_build_megatron_dataset_splits`：按 `split_matrix` 把**文档**切成三段
# （`round(比例 × 文档数)`），每段各建一个 `GPTDataset`，`num_samples` 就是上面的 sizes：

# %%
train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def epochs(ds):
    return ds._get_num_epochs(ds._get_num_tokens_per_epoch())


Table(["split", "文档（indexed_indices）", "num_samples（要的）", "len（建出的）", "每 epoch token 数", "epoch 数"],
      [[ds.index_split.name, ds.indices.tolist(), ds.num_samples, len(ds), ds._get_num_tokens_per_epoch(), epochs(ds)]
       for ds in (train, valid, test)])

# %% [markdown]
# `num_samples` 只是下限：一个样本要 `seq_length + 1 = 5` 个 token（多的 1 个给 `labels`），train 要 16 个样本即
# 16·4 + 1 = 65 个 token，而 train 的 6 篇文档一个 epoch 只有 25 个 token，所以要 3 个 epoch；索引总是按整 epoch 建，
# 3 个 epoch 的 75 个 token 切得出 (75 − 1) // 4 = 18 个样本。三张索引表（train 与 test）：

# %%
Table(["split", "表", "shape", "内容"],
      [[ds.index_split.name, name, list(getattr(ds, name).shape), getattr(ds, name).tolist()]
       for ds in (train, test) for name in ("document_index", "sample_index", "shuffle_index")])

# %% [markdown]
# - `document_index`：每个 epoch 把本 split 的文档下标排一遍，几个 epoch 接起来整体打乱（`numpy.random.RandomState(seed)`）。
#   train 里 0–5 各出现 3 次。
# - `sample_index`：C++ 的 `build_sample_idx` 沿 `document_index` 走，每走 `seq_length` 个 token 记一个起点
#   "(document_index 里的位置, 文档内偏移)"，共 `len + 1` 行；第 `j` 个样本从第 `j` 行走到第 `j+1` 行再多取 1 个 token。
# - `shuffle_index`：样本层面再打乱一次；`ds[i]` 取的是第 `shuffle_index[i]` 个样本。
#
# 顺着三张表手工取 `train[0]` 的 token，应与 `GPTDataset.__getitem__` 给的一致：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def window(ds, i):
    """Follow shuffle -> sample -> document index to the seq_length + 1 tokens of sample i."""
    j = int(ds.shuffle_index[i])
    (pos, offset), (end_pos, end_offset) = ds.sample_index[j], ds.sample_index[j + 1]
    tokens = []
    for p in range(pos, end_pos + 1):
        doc = ds.dataset[int(ds.document_index[p])].tolist()
        tokens += doc[offset if p == pos else 0: end_offset + 1 if p == end_pos else None]
    return j, tokens


j, tokens = window(train, 0)
print("shuffle_index[0] =", j, " sample_index 第", j, "、", j + 1, "行:", train.sample_index[j].tolist(),
      train.sample_index[j + 1].tolist())
print("手工取的 5 个 token:", tokens, " __getitem__:", train[0]["tokens"].tolist(), "+", train[0]["labels"][-1:].tolist())
print("全部 18 个样本都一致:", all(window(train, i)[1] == train[i]["tokens"].tolist() + train[i]["labels"][-1:].tolist()
                          for i in range(len(train))))

# %% [markdown]
# **最后一个 epoch 单独打乱。** 若最后一个 epoch 只用到不足 80% 的样本，`_build_document_sample_shuffle_indices` 把它单独处理
# （[gpt_dataset.py 第 536–537 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L536-L537) 定阈值，[gpt_dataset.py 第 594–600 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L594-L600) 分两段打乱）：前面完整的 epoch 混在一起打乱，最后一个 epoch 自己打乱、
# 排在 `shuffle_index` 末尾。这样训练读到的前若干样本只来自完整的 epoch，不会偏向最后那个 epoch 里碰巧被选中的文档。
# 换几个 `--train-iters`，用真实的 `shuffle_index` 检查它是否分成了两段：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def train_split(command):
    a = parse_args(command, world_size=2)
    return BlendedMegatronDatasetBuilder(GPTDataset, get_train_valid_test_num_samples(a), lambda: True,
                                         core_gpt_dataset_config_from_args(a, tokenizer)).build()[0]


def shuffle_parts(ds):
    per_epoch = (ds._get_num_tokens_per_epoch() - 1) // 4
    sans_final = ((epochs(ds) - 1) * ds._get_num_tokens_per_epoch() - 1) // 4
    head = ds.shuffle_index[:sans_final]
    return per_epoch, sans_final, bool(head.max() < sans_final and ds.shuffle_index[sans_final:].min() >= sans_final)


rows = []
for iters in (3, 4, 5):
    ds = train_split(COMMAND.replace("--train-iters 4", f"--train-iters {iters}"))
    per_epoch, sans_final, split_in_two = shuffle_parts(ds)
    rows.append([iters, ds.num_samples, epochs(ds), sans_final, ds.num_samples - sans_final, per_epoch, split_in_two,
                 ds.shuffle_index.tolist()])
Table(["train_iters", "num_samples", "epoch 数", "前面完整 epoch 的样本", "取自最后 epoch", "每 epoch 样本",
       "shuffle_index 分成两段", "shuffle_index"], rows)

# %% [markdown]
# train_iters=5 时要 20 个样本、4 个 epoch，最后一个 epoch 只取 2 个（< 0.8 × 6）：`shuffle_index` 的前 18 项恰是 0–17 的排列，
# 后 6 项是 18–23 的排列。train_iters=3 与 4 都不满足阈值，整体打乱。
#
# **续训时改 `--train-iters` 会换掉数据顺序。** 三张表由 `num_samples`（决定 epoch 数和是否单独打乱）与 seed 决定。
# 同一份语料，只把 `--train-iters` 从 4 改成别的值，`train[i]` 还是同一个样本吗？

# %% tags=["hide-input"] jupyter={"source_hidden": true}
base = [train[i]["tokens"].tolist() for i in range(16)]
rows = []
for iters in (3, 4, 5, 6, 8):
    ds = train_split(COMMAND.replace("--train-iters 4", f"--train-iters {iters}"))
    same = sum(ds[i]["tokens"].tolist() == base[i] for i in range(min(len(ds), 16)))
    rows.append([iters, ds.num_samples, epochs(ds), f"{same} / {min(len(ds), 16)}"])
Table(["train_iters", "num_samples", "epoch 数", "前 16 个样本与 train_iters=4 时相同"], rows)

# %% [markdown]
# 只要 epoch 数（或"是否单独打乱"）变了，`document_index` 就是另一个排列，整条样本序列随之改变。续训时 `consumed_train_samples` 说
# "前 8 个已经训过"，可新序列的前 8 个已不是训过的那 8 个：有的样本会第二次出现，有的永远轮不到（遗留问题 5）。
# 真实预训练语料远大于训练所需（epoch 数恒为 1），不受影响；小语料、多 epoch 的 mid-training / SFT 数据才会碰到。
#
# ### 3. blend：0.7 / 0.3
#
# `--data-path 0.7 a 0.3 b`：builder 先给每个语料按权重要样本（`ceil(ceil(size·w)·(1 + surplus))`，surplus 缺省 0.005），
# 每个语料按同一个 `split` 切出自己的三段；再用 `BlendedDataset` 按权重交错。顶层的 size 是 `Σ ceil(size·w)`，不是 size 本身：

# %%
blend_args = parse_args(COMMAND.replace(f"--data-path {corpus_a}", f"--data-path 0.7 {corpus_a} 0.3 {corpus_b}"),
                        world_size=2)
blend_config = core_gpt_dataset_config_from_args(blend_args, tokenizer)
blended = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, blend_config).build()
Table(["split", "size（要的）", "BlendedDataset 长度", "a: num_samples / len", "b: num_samples / len", "dataset_index"],
      [[ds.split.name, size, len(ds), *[f"{d.num_samples} / {len(d)}" for d in ds.datasets],
        "".join(map(str, ds.dataset_index.tolist()))] for ds, size in zip(blended, sizes)])

# %% [markdown]
# train 要 16 个，blend 却有 17 个：ceil(16·0.7) + ceil(16·0.3) = 12 + 5。`dataset_index` 是 C++ `build_blending_indices`
# （[helpers.cpp 第 77 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.cpp#L77)）的**贪心**结果：每一步选"目标数 − 已取数"最大的那个语料。它不依赖 seed；
# 随机性只在每个语料自己的 `shuffle_index` 里。`dataset_sample_index` 则在每个语料里依次数 0, 1, 2, …
#
# 把 train 的 17 个样本画成一条：颜色是 `dataset_index`（来自哪个语料），格里是 `dataset_sample_index`（该语料的第几个样本）；
# 下面的折线是"前 n 个样本里来自 a 的个数 − 0.7·n"：

# %%
train_blend = blended[0]
draw_blend(train_blend.dataset_index, train_blend.dataset_sample_index,
           [round(float(w), 4) for w in train_blend.weights], title="--data-path 0.7 a 0.3 b：train 的每个样本来自哪个语料")

# %% [markdown]
# 每 10 个样本里 a 取 7 个、b 取 3 个，b 的样本均匀地插在中间；折线始终在 ±1 之内。
#
# 实测比例：把训练拉长到 250 步（train 要 1000 个样本），用真实的 `BlendedDataset.__getitem__` 逐个取样本，数 `dataset_id`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
BLEND_COMMAND = COMMAND.replace(f"--data-path {corpus_a}", f"--data-path 0.7 {corpus_a} 0.3 {corpus_b}")
long_args = parse_args(BLEND_COMMAND.replace("--train-iters 4", "--train-iters 250"), world_size=2)
long_blend = BlendedMegatronDatasetBuilder(GPTDataset, get_train_valid_test_num_samples(long_args), lambda: True,
                                           core_gpt_dataset_config_from_args(long_args, tokenizer)).build()[0]
drawn = numpy.array([int(long_blend[i]["dataset_id"]) for i in range(len(long_blend))])
from_a = numpy.cumsum(drawn == 0)
n = numpy.arange(1, len(drawn) + 1)
Table(["前 n 个样本", "来自 a 的比例", "来自 b 的比例", "与 0.7 之差"],
      [[k, round(from_a[k - 1] / k, 4), round(1 - from_a[k - 1] / k, 4), round(from_a[k - 1] / k - 0.7, 4)]
       for k in (10, 17, 100, len(drawn))])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("样本总数:", len(drawn), " 每个前缀里来自 a 的个数与 0.7·n 之差，最大:", round(float(abs(from_a - 0.7 * n).max()), 4))
other_seed = parse_args(BLEND_COMMAND.replace("--train-iters 4", "--train-iters 250 --seed 7"), world_size=2)
reseeded = BlendedMegatronDatasetBuilder(GPTDataset, get_train_valid_test_num_samples(other_seed), lambda: True,
                                         core_gpt_dataset_config_from_args(other_seed, tokenizer)).build()[0]
print("换 seed 后 dataset_index 相同:", numpy.array_equal(reseeded.dataset_index, long_blend.dataset_index),
      " 但 a 的第 0 个样本变了:", reseeded.datasets[0][0]["tokens"].tolist() != long_blend.datasets[0][0]["tokens"].tolist())

# %% [markdown]
# 每个前缀里来自 a 的样本数与 0.7·n 的差都小于 1 个样本：比例不是"期望上"等于权重，而是逐前缀地贴着权重走。
# 所以 blend 不会在小窗口里偏向某个语料，哪怕一个 global batch 只有几个样本。
#
# **"差不到 1 个样本"只对两个语料成立。** 贪心只在一个语料落后得最多时才选它（[helpers.cpp 第 116 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.cpp#L116)），
# 而各语料"已取数 − n·权重"之和恒为 0，所以被选中的那个此前不领先：任何语料都**领先**不到 1 个样本（至多 1 − w）。
# 两个语料时一个领先多少、另一个就落后多少，于是两边都在 1 以内。三个以上语料时，几个小语料可能接连被选，大语料就会
# **落后**超过 1 个样本；能保证的只有"落后的不超过其余语料领先之和"，即小于 K − 2 + w 个（K 是语料数）。
# 第三个小语料 c（8 篇文档，token 25–28），权重 0.8554 / 0.0746 / 0.07，同样训练 250 步，逐语料看每个前缀的偏差：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
corpus_c = write_corpus(workdir.name, "c", [[25 + i % 4] * (3 + i % 2) for i in range(8)], tokenizer.eod)
indexed_c = IndexedDataset(corpus_c)  # kept, like a and b (遗留问题 7)
WEIGHTS3 = (0.8554, 0.0746, 0.07)
three_args = parse_args(COMMAND.replace(f"--data-path {corpus_a}", "--data-path " + " ".join(
    f"{w} {c}" for w, c in zip(WEIGHTS3, (corpus_a, corpus_b, corpus_c)))).replace("--train-iters 4", "--train-iters 250"),
                        world_size=2)
three = BlendedMegatronDatasetBuilder(GPTDataset, get_train_valid_test_num_samples(three_args), lambda: True,
                                      core_gpt_dataset_config_from_args(three_args, tokenizer)).build()[0]
counts3 = numpy.stack([numpy.cumsum(three.dataset_index == d) for d in range(3)], axis=1)
dev3 = counts3 - numpy.asarray(three.weights)[None] * numpy.arange(1, len(three) + 1)[:, None]
Table(["语料", "权重", "最多领先（样本）", "上界 1 − w", "最多落后（样本）", "落后的上界 K − 2 + w", "最多落后时的 n"],
      [[name, round(float(w), 4), round(float(dev3[:, d].max()), 4), round(1 - float(w), 4),
        round(float(-dev3[:, d].min()), 4), round(1 + float(w), 4), int(dev3[:, d].argmin()) + 1]
       for d, (name, w) in enumerate(zip("abc", three.weights))])

# %% [markdown]
# 大语料 a 在第 220 个样本处落后了 1.188 个样本（c、b 在相隔几步之内先后被选，a 还没补回来），超过 1，但仍在 K − 2 + w 之内；
# 没有哪个语料领先到 1 个样本。
# 所以多语料时的准确说法是：每个语料"不会超前 1 个样本，落后不超过 K − 1 个"，比例仍然逐前缀贴着权重，只是贴得没有两个语料时那么紧。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 4. 五个字段怎样进 `forward`
#
# `pretrain_gpt.py::forward_step` 的调用是 `model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask,
# packed_seq_params=...)`（[`pretrain_gpt.py:348`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L348)）。
# 在 `GPTModel` 里给每个可能的"读者"挂一个探针（`snippets/data/forward_fields.py`：forward pre-hook 与包一层的 loss 方法），
# 看每个字段被谁读到。batch 来自真实的 `GPTDataset`（序列长 8、`--eod-mask-loss`，micro-batch 2），
# 模型是 2 层的真实 `GPTModel`（local spec），分别用两种位置编码（另建一个 3 层的 RoPE 模型，留给第 5 节的 pipeline 对照）：

# %%
model_config = core_gpt_dataset_config_from_args(parse_args(
    COMMAND.replace("--seq-length 4", "--seq-length 8") + " --eod-mask-loss", world_size=1), tokenizer)
model_data = BlendedMegatronDatasetBuilder(GPTDataset, [8, None, None], lambda: True, model_config).build()[0]
batch = next(iter(torch.utils.data.DataLoader(model_data, batch_size=2)))
print({k: f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in batch.items()})
print("loss_mask 第 0 行:", batch["loss_mask"][0].tolist(), " tokens 第 0 行:", batch["tokens"][0].tolist())


# %% tags=["hide-input"] jupyter={"source_hidden": true}
def field_runs(batch):
    from snippets.data.forward_fields import readers_of, record_forward_inputs
    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)

    def forward(model, b, **change):
        b = {**b, **change}
        try:
            with torch.no_grad():
                return model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"],
                             loss_mask=b["loss_mask"])
        except Exception as err:
            return f"{type(err).__name__}: {err}"

    out = {}
    for kind in ("learned_absolute", "rope", "rope, 3 layers"):
        model = GPTModel(tiny_config(num_layers=3 if "3" in kind else 2), get_gpt_layer_local_spec(), vocab_size=32,
                         max_sequence_length=8, position_embedding_type=kind.split(",")[0])
        init_by_global_name(model)  # weights by global name: the pipeline run below gets the same ones
        model.eval()
        with torch.no_grad(), record_forward_inputs(model) as seen:
            base = forward(model, batch)
        out[kind] = dict(readers={k: readers_of(v, seen) for k, v in batch.items()}, base=base, changed={
            "tokens 右移一位": forward(model, batch, tokens=batch["tokens"].roll(1, dims=1)),
            "position_ids 倒序": forward(model, batch, position_ids=batch["position_ids"].flip(1)),
            "attention_mask 全 False（不屏蔽）": forward(model, batch,
                                                  attention_mask=torch.zeros_like(batch["attention_mask"])),
            "attention_mask = None": forward(model, batch, attention_mask=None),
            "loss_mask 全 0": forward(model, batch, loss_mask=torch.zeros_like(batch["loss_mask"])),
        })
    return out


runs = run_ranks(field_runs, 1, batch)[0]


def readers_cell(names):
    """'decoder.layers.0.x(a)', 'decoder.layers.1.x(a)' -> 'decoder.layers.*.x(a) ×2'."""
    counts = Counter(re.sub(r"layers\.\d+", "layers.*", name) for name in names)
    return "，".join(f"{name} ×{n}" if n > 1 else name for name, n in counts.items()) or "无"


FORWARD_ARG = dict(tokens="input_ids（第 1 个位置参数）", position_ids="position_ids", attention_mask="attention_mask",
                   labels="labels=", loss_mask="loss_mask=")
Table(["batch 字段", "GPTModel.forward 参数", "被谁读到（learned_absolute）", "被谁读到（rope）"],
      [[k, FORWARD_ARG[k], readers_cell(runs["learned_absolute"]["readers"][k]), readers_cell(runs["rope"]["readers"][k])]
       for k in FIELDS])

# %% [markdown]
# 然后逐个改动一个字段，看每 token 的 loss 变不变（`torch.allclose`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def effect(result, base):
    return result if isinstance(result, str) else ("变了" if not torch.allclose(result, base) else "不变")


Table(["改动", "learned_absolute", "rope"],
      [[change, effect(runs["learned_absolute"]["changed"][change], runs["learned_absolute"]["base"]),
        effect(runs["rope"]["changed"][change], runs["rope"]["base"])] for change in runs["rope"]["changed"]])

# %% [markdown]
# 逐行读这张表：
#
# - `tokens` 只进词嵌入（首 stage）；`labels` 只进 `compute_language_model_loss`（尾 stage），它把 logits 换成每 token 的 loss `[b, s]`。
# - `attention_mask` 进每一层的 core attention；local spec 在 softmax 前按它屏蔽。传 `None` 时 local attention 会自己造一个
#   因果 mask——但那一行（[`utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39)）
#   写死了 `device="cuda"`，所以在 CPU 上失败；GPU 上它与数据集给的因果 mask 相同。
# - **`position_ids` 在 RoPE 下没有任何模块读。** 只有 learned_absolute 的位置嵌入读它
#   （[`language_model_embedding.py:44`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L44)
#   只在这种类型下建 `position_embeddings`）；RoPE 只向 `rotary_pos_emb` 要一个长度，位置永远是 0…s−1。
#   所以 `--reset-position-ids` 在 RoPE 模型上不起作用（遗留问题 2）。
# - **`loss_mask` 模型也不读**（不开 MTP 时）：全 0 和全 1 的输出一模一样。它在 `forward_step` 绑进 `loss_func`：
#   [`pretrain_gpt.py::loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L209) 返回
#   `sum(losses · loss_mask)` 和 `num_tokens = loss_mask.sum()`，除法留给 schedule 与 DP 归约（[笔记 05](../05_forward_loss_backward/)）。
#   本 batch 开了 `--eod-mask-loss`，EOD 位置的 loss 不计：

# %%
losses = runs["rope"]["base"]
print("每 token loss 之和:", round(float(losses.sum()), 4), " 乘 loss_mask 后:",
      round(float((losses * batch["loss_mask"]).sum()), 4), " num_tokens:", int(batch["loss_mask"].sum()),
      "/", batch["loss_mask"].numel())

# %% [markdown]
# ### 5. TP / CP / PP：每个 rank 拿到什么、真正用什么
#
# TP：只有 TP rank 0 读数据，在 TP 群里 broadcast 给其余 rank（笔记 03 逐条记录了 9 次 broadcast）；CP：`get_batch_on_this_cp_rank`
# 把序列切成 2·CP 块、每个 rank 留一头一尾两块，纯索引、不通信（笔记 03 的运行、[笔记 16](../16_context_parallel/) 的 attention）。
#
# **PP 是这一节的新事实。** `get_batch` 按 stage 只留一部分字段（`snippets.data.batch_flow.STAGE_FIELDS`）：
# 首 stage `tokens, attention_mask, position_ids`，尾 stage `labels, loss_mask, attention_mask`，中间 stage 什么都没有。
# 这够不够？在 3 个 rank（PP=3、每 stage 1 层、RoPE）上用真实的 `get_forward_backward_func()` 跑一个 micro-batch，
# 每个 stage 的 data iterator 只给它 `get_batch` 会留下的字段，其余为 `None`；权重按全局层名生成（`init_by_global_name`），
# 可与第 4 节那次运行里单 rank 的完整 3 层模型（`field_runs` 的 "rope, 3 layers"）逐元素比较。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def pipeline_fields(batch):
    import traceback
    from functools import partial

    from snippets.record import recorder
    from snippets.data.forward_fields import readers_of, record_forward_inputs
    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=3)
    model_parallel_cuda_manual_seed(0)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    model = GPTModel(tiny_config(num_layers=3, pipeline_model_parallel_size=3), get_gpt_layer_local_spec(),
                     vocab_size=32, max_sequence_length=8, pre_process=first, post_process=last,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope")
    init_by_global_name(model)
    stage = "first" if first else "last" if last else "middle"
    given = {k: batch[k] if k in STAGE_FIELDS[stage] else None for k in FIELDS}  # what get_batch leaves

    mask_none = None
    if stage == "middle":  # exactly what get_batch gives a middle stage: attention_mask=None
        model.set_input_tensor(torch.zeros(8, 2, 16))
        try:
            model(None, None, None)
        except Exception as err:
            frame = traceback.extract_tb(err.__traceback__)[-2]
            mask_none = f"{type(err).__name__} @ {frame.filename.split('megatron/core/')[-1]}:{frame.lineno}"

    def loss_func(loss_mask, output_tensor):  # pretrain_gpt.py::loss_func without the NaN checks
        loss = torch.sum(output_tensor.view(-1).float() * loss_mask.view(-1).float())
        num_tokens = loss_mask.sum().to(torch.int)
        return loss, num_tokens, {"lm loss": torch.cat([loss.detach().view(1), num_tokens.view(1)])}

    def forward_step(data_iterator, model):
        b = next(data_iterator)
        # CPU only: a None mask makes the local attention build its causal mask with device="cuda"
        mask = b["attention_mask"] if b["attention_mask"] is not None else torch.ones(1, 1, 8, 8).tril() < 0.5
        output = model(b["tokens"], b["position_ids"], mask, labels=b["labels"], loss_mask=b["loss_mask"])
        return output, partial(loss_func, b["loss_mask"])

    with recorder.record() as calls, record_forward_inputs(model) as seen:
        reports = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([given]),
                                              model=[model], num_microbatches=1, seq_length=8, micro_batch_size=2,
                                              forward_only=True)
    return dict(stage=stage, given=[k for k in FIELDS if given[k] is not None],
                read=[k for k in FIELDS if readers_of(batch[k], seen)], mask_none=mask_none,
                report=[r["lm loss"] for r in reports], calls=calls)


pp = run_ranks(pipeline_fields, 3, batch, grid=dict(pp=3))
whole = runs["rope, 3 layers"]["base"]
print("单 rank 3 层模型: loss·mask 之和", round(float((whole * batch["loss_mask"]).sum()), 4),
      " num_tokens", int(batch["loss_mask"].sum()))
Table(["rank", "stage", "get_batch 留下的字段", "模型里真被读到的", "attention_mask=None 时", "lm loss 报告 [和, token 数]"],
      [[r, d["stage"], ", ".join(d["given"]) or "无", ", ".join(d["read"]) or "无", d["mask_none"] or "-", [round(float(x), 4) for x in d["report"][0]]
        if d["report"] else "-"] for r, d in enumerate(pp)])

# %% [markdown]
# - 尾 stage 拿着 `tokens=None`、`position_ids=None` 算出的 loss 与单 rank 完整模型相同：它只需要 `labels`、`loss_mask`
#   和 `attention_mask`；`loss_mask` 模型不读，只进 `loss_func`。
# - 首 stage 收到三个字段，真正读的只有 `tokens` 和 `attention_mask`：RoPE 下 `position_ids` 白白广播了一次。
# - 中间 stage 的 `get_batch` 直接返回 10 个 `None`（数据不带 `cu_seqlens` 时，[`pretrain_gpt.py:121`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L121)），
#   它的 attention 收到 `attention_mask=None`，于是自己造一个普通的因果 mask（上表第 5 列：CPU 上在 [`transformer/utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39) 失败，
#   GPU 上静默成功）。数据集若用 `--reset-attention-mask` 造了块对角 mask，中间 stage 看不到它（遗留问题 3）。
#   为了让 schedule 在 CPU 上跑完，本格的 `forward_step` 在 mask 为 `None` 时补上同一个因果 mask。
#
# 这次运行里唯一的通信是 stage 之间的激活传递（schedule 与 p2p 见[笔记 13](../13_pipeline_schedules/)）；数据字段本身
# 在 PP 群里从不传递——每个 stage 各自从自己的 `get_batch` 拿。中间 stage（rank 1）记下的通信：

# %%
communication_table(pp[1]["calls"], meanings={
    "batch_isend_irecv": "stage 间的激活 [s, b, h]：irecv 收上一 stage 的输出，isend 把本 stage 的输出交给下一 stage"})

# %% [markdown]
# ### 6. packed sequence：`cu_seqlens`、`max_seqlen` 怎样到 attention
#
# 从第 4 节的数据集里挑文档最多的那条样本，当作一个 packed（THD）micro-batch：`tokens [1, 8]`，文档边界由 EOD 位置算出。
# 正式入口里（数据集给出 `cu_seqlens` 时：`--sft` 或 `--dataloader-inter-document-masking`），`get_batch` 先在 TP 群里广播，
# `flatten_batch_for_packed_sequences` 把各样本的 `cu_seqlens` 合成一条 `(1, N)`，再由 `get_batch_on_this_cp_rank` 按 CP 切
# （SFT 时按文档分块：[`utils.py::_get_batch_on_this_cp_rank_per_document_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2406)）；
# `forward_step` 把 `cu_seqlens` squeeze 成一维（[`pretrain_gpt.py:314`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L314)），
# 装进 `PackedSeqParams(qkv_format="thd")`（[`pretrain_gpt.py:323`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L323)）交给模型。下面直接造这个 `PackedSeqParams`。
#
# > **旧版（core_v0.18.0）：** 同样先广播再切 CP，但没有 `flatten_batch_for_packed_sequences`，是否带 `cu_seqlens` 只看 `--sft`；
# > `forward_step` 取 `cu_seqlens[0]` 变成一维（[`pretrain_gpt.py:216`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/pretrain_gpt.py#L216)）。core_v0.16.1 则走 `get_thd_batch_on_this_cp_rank`，交给模型的 `cu_seqlens` 仍是二维（遗留问题 4）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def packed_runs(packed):
    import traceback

    from snippets.data.forward_fields import record_forward_inputs
    from snippets.data.thd_attention import ThdCoreAttention
    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(tiny_config(num_layers=2), get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8,
                     position_embedding_type="rope")
    init_by_global_name(model)
    model.eval()
    tokens, labels, cu_seqlens = packed["tokens"], packed["labels"], packed["cu_seqlens"]
    longest = int(cu_seqlens.diff().max())

    def params(cu, max_seqlen):  # what forward_step builds (pretrain_gpt.py:323)
        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                               max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)

    def packed_forward(p):  # THD: no position_ids, no attention_mask
        try:
            with torch.no_grad():
                return model(tokens, None, None, labels=labels, packed_seq_params=p)
        except Exception as err:
            frames = [(f.filename.split("site-packages/")[-1], f.lineno, f.name)
                      for f in traceback.extract_tb(err.__traceback__) if "megatron/core" in f.filename]
            return f"{type(err).__name__}: {err}", frames

    out = dict(local_attention=packed_forward(params(cu_seqlens, longest)))
    local = [layer.self_attention.core_attention for layer in model.decoder.layers]
    for layer in model.decoder.layers:  # stand in for TE's THD kernel (CPU has no TE)
        layer.self_attention.core_attention = ThdCoreAttention.replacing(layer.self_attention.core_attention)
    with record_forward_inputs(model) as seen:
        out["packed"] = packed_forward(params(cu_seqlens, longest))
    out["rotary_length"] = next(v for r, a, v in seen if a == "max_seq_len")
    out["core_attention_got"] = model.decoder.layers[0].self_attention.core_attention.seen[0]
    out["max_seqlen 8"] = packed_forward(params(cu_seqlens, 8))
    out["max_seqlen too small"] = packed_forward(params(cu_seqlens, longest - 1))
    out["cu_seqlens [1, n]"] = packed_forward(params(cu_seqlens[None], longest))
    for layer, core in zip(model.decoder.layers, local):
        layer.self_attention.core_attention = core
    causal = lambda n: torch.ones(1, 1, n, n).tril() < 0.5  # noqa: E731
    with torch.no_grad():
        out["separate"] = torch.cat([model(tokens[:, s:e], None, causal(e - s), labels=labels[:, s:e])
                                     for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())], dim=1)
        out["one causal sequence"] = model(tokens, None, causal(8), labels=labels)
    return out


# the sample with the most documents in it, cut at its EODs: what a packed (THD) micro-batch holds
sample = max((model_data[i] for i in range(len(model_data))), key=lambda s: int((s["tokens"][:-1] == tokenizer.eod).sum()))
ends = ((sample["tokens"][:-1] == tokenizer.eod).nonzero().flatten() + 1).tolist()
packed = dict(tokens=sample["tokens"][None], labels=sample["labels"][None],
              cu_seqlens=torch.tensor([0, *ends, 8], dtype=torch.int32))
packed_out = run_ranks(packed_runs, 1, packed)[0]
print("tokens:", packed["tokens"][0].tolist(), " cu_seqlens:", packed["cu_seqlens"].tolist(),
      " max_seqlen:", int(packed["cu_seqlens"].diff().max()))
message, frames = packed_out["local_attention"]
print(message)
Table(["调用栈（megatron/core 内，由外到内）", "行", "函数"],
      [[path.removeprefix("megatron/core/"), line, name] for path, line, name in frames if name != "__call__"])

# %% [markdown]
# 本地 `DotProductAttention` 在 [dot_product_attention.py 第 153 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L153) 断言 `packed_seq_params is None`：在 CPU 上，packed batch 走到这里为止。
# 但在它之前，`packed_seq_params` 已经在两个地方起了作用，这两处都是纯 torch、在 CPU 上真实运行过了：
#
# 1. `GPTModel._preprocess` 问 `RotaryEmbedding.get_rotary_seq_len` 要 RoPE 表长，packed 时它直接返回
#    `max(max_seqlen_q, max_seqlen_kv)`（[`rotary_pos_embedding.py:241`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L241)）；
# 2. `Attention.forward` 去掉 batch 维（q、k、v 变成 `[t, heads, head_dim]`，[`attention.py:1468`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1468)），
#    取出 `cu_seqlens`（[attention.py 第 1483–1491 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1483-L1491)）交给 `apply_rotary_pos_emb`，后者走 `_apply_rotary_pos_emb_thd`：**每段都从 RoPE 表的第 0 行起**。
#
# 在 GPU 上，[dot_product_attention.py 第 153 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L153) 这一步换成 `TEDotProductAttention.forward`：它把 `PackedSeqParams` 的字段原样作为关键字参数交给 TE
# （[`transformer_engine.py:2012`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L2012)），
# THD 时把 `causal` 改成 `padding_causal`（[transformer_engine.py 第 2036–2041 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L2036-L2041)），TE 的 kernel 只在每段内部做因果 attention。
# 为了在 CPU 上看到完整的结果，`snippets/data/thd_attention.py` 的 `ThdCoreAttention` 坐到 core attention 的位置上，做同样的"段内因果"计算
# （与 Megatron 自己的 `DotProductAttention` 加块对角 mask 的结果相同）；模型的其余部分——embedding、
# RoPE 的 THD 路径、线性层、loss——都是真实的 Megatron：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
got = packed_out["core_attention_got"]
Table(["读者", "收到的"],
      [["rotary_pos_emb(max_seq_len)", packed_out["rotary_length"]],
       ["core_attention: query shape", got["query"]], ["core_attention: attention_mask", got["attention_mask"]],
       ["core_attention: attn_mask_type", got["attn_mask_type"]],
       ["core_attention: cu_seqlens_q / max_seqlen_q", f"{got['cu_seqlens_q']} / {got['max_seqlen_q']}"]])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def same(a, b):
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.allclose(a, b, atol=1e-6)


print("packed 每 token loss    :", [round(x, 4) for x in packed_out["packed"][0].tolist()])
print("各文档分开跑            :", [round(x, 4) for x in packed_out["separate"][0].tolist()])
print("当作一条因果序列跑      :", [round(x, 4) for x in packed_out["one causal sequence"][0].tolist()])
print("packed == 分开跑:", same(packed_out["packed"], packed_out["separate"]),
      " packed == 一条序列:", same(packed_out["packed"], packed_out["one causal sequence"]),
      " max_seqlen 放大到 8 仍相同:", same(packed_out["max_seqlen 8"], packed_out["packed"]))
def where(failure):
    message, frames = failure
    path, line, name = frames[-1]
    return f"{message}  @ {path.split('/')[-1]}:{line} {name}"


print("max_seqlen 比最长段小 1:", where(packed_out["max_seqlen too small"]))
print("cu_seqlens 形状 [1, n]:", where(packed_out["cu_seqlens [1, n]"]))

# %% [markdown]
# 所以 `cu_seqlens` 让 packed batch 与"每篇文档单独跑"逐 token 相同：RoPE 每段从位置 0 起（真实代码），attention 不跨段（TE 的工作）。
# 与笔记 03 的"块对角 mask + 重置位置"不同，它在 RoPE 模型上也对（那边的 `position_ids` 在 RoPE 下不起作用）。
# `max_seqlen` 不改变结果，只决定 RoPE 表的长度（以及 TE kernel 的分块）；它必须不小于最长的一段：否则
# `_apply_rotary_pos_emb_thd` 逐段做 RoPE 时给这一段切不满 RoPE 行（3 个 token 的段只拿到 2 行），在这一段的相乘处失败。
# （`max_seqlen` 恰好等于总 token 数 8 时，RoPE 表被当作整条 packed 序列的位置表，每段按自己在 `cu_seqlens` 里的起点取行，
# [`rope_utils.py:225`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L225)：位置不再从 0 起，但 RoPE 的注意力只看段内的相对位置，所以结果仍相同。）
# 最后一行是遗留问题 4：`cu_seqlens` 若是 `[1, n]`，按段切分时就失败。
#
# ### 7. 续训：跳过已消费的样本
#
# 状态只有一个整数：`train` 每步把 `dp × micro_batch_size × num_microbatches` 加到 `args.consumed_train_samples`
# （[`training.py:3942`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3942)）；
# `save_checkpoint` 把整个 `args` 存进 checkpoint（[`checkpointing.py:1311`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1311)）；
# `load_checkpoint` 取回它（[checkpointing.py 第 2499 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499)）；`build_train_valid_test_data_loaders` 把它交给
# `build_pretraining_data_loader`（[`training.py:4569`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4569)），
# `MegatronPretrainingSampler` 从这个下标接着切块。数据集本身不存状态：三张索引表由 seed 和 sizes 决定，重启后重建（或读缓存）出同样的表。
#
# sampler 在 `megatron/training` 里，不在 pip 包中：`snippets/data/pretraining_sampler.py` 按 tag 重写了它。
# 每个 rank 做正式入口做的事（`read_iterations`）：
# 用本篇的命令行建数据集（和 `pretrain_gpt.py` 一样只有 TP rank 0 建，其余 rank 只陪 builder 的 barrier），
# 按 `consumed_train_samples` 建 loader，然后跑若干步、每步取 `num_microbatches` 个 micro-batch。
#
# `run` 在同一组 4 个 rank 上做完整件事：先以 TP=2、DP=2 不中断地读 4 步；然后像重启那样丢掉模型并行状态、数据集和 sampler，
# 只留下第 2 步后存下的 `consumed_train_samples`，以 DP=2（TP=2）、DP=4（TP=1）、DP=1（TP=4）各重读一次第 3、4 步——
# rank 数不变，换 DP 大小靠换 TP。global batch 固定为 micro-batch × `microbatches` × DP = 1 × 2 × 2 = 4，
# 和 `--global-batch-size` 一样不随 DP 变。语料就是上面的语料 a：`run` 让 global rank 0 按 `dims` 把它重新写进一个临时目录
# （逐 token 相同；路径不打印）。这些函数在 `snippets/experiments/n18_data_topic.py` 里；
# 序列长度、micro-batch、`microbatches` 和词表是参数 `dims`，本篇用它的 `tiny`（seq 4、micro-batch 1、2 个 micro-batch、vocab 32）。
# 下表的 `rN` 是 DP rank：TP=2 时每个 DP rank 只有它的 TP rank 0 读数据。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(read_iterations, run)

# %%
TINY = EXPERIMENTS["data-topic"].tiny
PAR = Parallel(world=4, tp=2)
resume = run_ranks(run, 4, TINY, PAR, grid=dict(tp=2))
print(consumed_line(resume))
resume_table(resume)


# %%
for name, value in checks(resume).items():
    print(f"{name}:", value)

# %% [markdown]
# 重启之后，建数据集时的通信只有 builder 的 world barrier（每个 split 一次，4 个 rank 都参加）：global rank 0 先建索引并写
# `.npy` 缓存，其余要建的 rank 等 barrier 之后读缓存（`build_generic_dataset`）。恢复到 DP=2 时 rank 2（DP rank 1 的 TP rank 0，
# 读缓存的那个）记下的：

# %%
build_table(resume)

# %% [markdown]
# sampler 的下标是顺序的（第 `k` 步的 global batch 就是下标 `[4k, 4k+4)`），随机性全在数据集的 `shuffle_index` 里。因为
# `consumed_train_samples` 以**样本**计、与 DP 大小无关，换成 DP=4 或 DP=1 续训，每步的 global batch 仍是同一组样本，
# 只是分给 rank 的方式变了（DP=4：每 rank 1 个 micro-batch；DP=1：1 个 rank 取 4 个）。前提是 `--global-batch-size`、
# seed、语料和 sizes 都不变——sizes 一变，上面第 2 节已经看到，整条序列都会换。

# %% [markdown]
# ## 机制解释
#
# **配置是一张字典。** `core_gpt_dataset_config_from_args` 几乎只是把 `args` 的字段一一抄进 `GPTDatasetConfig`，
# 真正的"计算"只有三处：`--data-path` 解析成 blend、`sequence_parallel_size = TP × SP`、tokenizer 的构造。
# `split_matrix` 与 `mock` 是 config 自己在 `__post_init__` 里派生的；三个 split 的样本数则由训练的步数和评估节奏推出，
# 与数据无关——数据集只保证"至少这么多"，多出来的按整 epoch 补齐。
#
# **随机性只在一个地方。** `GPTDataset` 用 `numpy.random.RandomState(random_seed)` 依次打乱文档与样本，结果写成 `.npy` 缓存；
# blend 的交错、sampler 的切块、DP 的分配都是确定的顺序算术（缺省的 `--dataloader-type single`；`cyclic` 用另一个按 epoch 打乱的 sampler）。因此"同一个样本序列"只取决于 seed、语料、split 与 sizes，
# 与并行方式无关；续训只需记住"已经走到第几个样本"。代价是：sizes 是序列的一部分，改训练长度就是换序列。
#
# **blend 贴着权重走。** `build_blending_indices` 每一步选"目标数 − 已取数"最大的语料，这是一种确定性的误差扩散：
# 任何前缀里没有哪个语料比 `n × 权重` 多出 1 个样本；两个语料时两边都相差不到 1，K 个语料时一个语料最多落后 K − 1 个（第 3 节的三语料表）。
# 顶层 size 是各语料 `ceil(size × 权重)` 之和，所以比要求的略多。
#
# **字段各有读者。** 五个字段在模型里各去一处：`tokens` 去词嵌入、`position_ids` 去 learned 位置嵌入（RoPE 下无人读）、
# `attention_mask` 去每层 core attention、`labels` 去 loss；`loss_mask` 留在模型外的 `loss_func`。这正是 `get_batch`
# 按 stage 只广播一部分字段的依据——首 stage 有嵌入，尾 stage 有 loss，中间 stage 两者都没有。
#
# **packed 是另一种 attention 描述。** 稠密的 `[b, 1, s, s]` mask 被两个小张量代替：`cu_seqlens` 说段在哪，`max_seqlen`
# 说最长一段多长。RoPE 与 attention 都按段重新开始，所以一个 packed 样本与各文档单独跑完全相同；而 local attention 不支持它，
# THD 只能在 TE 上跑。

# %% [markdown]
# ## 与训练主链路的关系
#
# 数据在 `pretrain` 里只建一次：`build_train_valid_test_data_iterators` 读 `consumed_train_samples`，建数据集与 loader；
# 此后每个 micro-batch 在 `forward_step` 里取一次（`get_batch`），每步结束 `train` 把 `consumed_train_samples` 加上一个 global batch。
# checkpoint 里关于数据进度的全部内容就是 `args` 里的这个数（与 `consumed_valid_samples`）；数据集的索引是缓存，不是状态
# （checkpoint 的其余内容是笔记 21 的主题）。simple loop 里对应的是 `get_train_data_iterator()` 与 `next(data_iterator)`，
# 它用普通的 `DataLoader(shuffle=True)`，没有 consumed 计数，续训回不到同一个数据位置（[笔记 01](../01_training_run_overview/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **有放回 vs 无放回、epoch**：`GPTDataset` 是"按 epoch 无放回"：每个 epoch 每篇文档恰好出现一次，样本再整体打乱；
#   要的样本超过一个 epoch 时重复整 epoch，而不是随机抽。
# - **误差扩散 / 最大余数法**：blend 的贪心交错与把比例分配成整数席位是同一类算法，保证任何前缀都贴着比例。
# - **可复现的数据顺序**：把"数据状态"压缩成一个偏移量，需要整条序列是 (seed, 配置) 的确定函数——这也是为什么配置一变偏移量就失去意义。
# - **varlen attention**：`cu_seqlens` 与 FlashAttention 的 `flash_attn_varlen_func` 是同一种表示；RoPE 的位置也要按段重置，
#   否则后面文档的 token 会带着"偏移了的位置"。

# %% [markdown]
# ## 遗留问题
#
# 1. **`get_blend_from_list` 的一致性检查从不生效（运行确认）。** 它把 `is_none` 建成一个 `map` 迭代器
#    （[`utils.py:84`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/utils.py#L84)），`any(is_none)`
#    消费到第一个 True 就停，接着的 `assert all(is_none)`（[utils.py 第 86 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/utils.py#L86)）只检查剩下的元素。`0.5 a b c` 这种"只写了一个权重"的写法
#    因此被静默当成 4 个无权重的前缀（第 1 节的表）。
# 2. **RoPE 忽略 `position_ids`（运行确认）。** 第 4 节：RoPE 模型里没有模块读 `position_ids`，倒序后输出不变；`--reset-position-ids`
#    只对 learned_absolute 有效。上游 [issue #453](https://github.com/NVIDIA/Megatron-LM/issues/453) 报告过同一件事（2024 年有人确认 MCore 的 `GPTModel` 仍如此）。
#    packed（THD）格式不受影响：它的位置按 `cu_seqlens` 重置（第 6 节）。
# 3. **中间 pipeline stage 收不到 `attention_mask`（运行确认）。** `get_batch` 对中间 stage 返回 None，它们的 local attention
#    改用 [`get_default_causal_mask`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L37)；
#    用 `--reset-attention-mask` 时，首尾 stage 按文档屏蔽而中间 stage 跨文档 attention。TE 的 attention 在 `causal` 类型下
#    本来就不看 mask 参数（TE 的约定，本机无 TE，未验证），那时 `--reset-attention-mask` 对哪个 stage 都不起作用——要隔开文档，用 packed 格式。
# 4. **`cu_seqlens` 必须是一维的（运行确认二维会失败）。** 正式入口的 batch 里 `cu_seqlens` 带着 batch 维：
#    `flatten_batch_for_packed_sequences` 把各样本的 `cu_seqlens` 合成 `(1, N)`（[`utils.py:2597`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2597)），
#    `forward_step` 造 `PackedSeqParams` 之前才 squeeze 成一维（[`pretrain_gpt.py:314`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L314)）。
#    自己写 `forward_step`、直接把 batch 里的 `cu_seqlens` 交给 `PackedSeqParams` 的代码若漏了这一步，
#    非融合的 RoPE THD 路径在按段切分处失败（第 6 节最后一行，[`rope_utils.py:223`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L223)）。
#
# > **旧版（core_v0.18.0）：** 正式入口同样先去掉 batch 维（[`pretrain_gpt.py:216`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/pretrain_gpt.py#L216) 取 `cu_seqlens[0]`）。
# > core_v0.16.1 没有这一步：`get_batch_on_this_tp_rank` 只断言 `cu_seqlens.shape[0] == 1`，二维张量原样进了 `PackedSeqParams`，非融合 RoPE 因此失败。
#
# 5. **续训改 `--train-iters` / `--train-samples` 会换数据顺序（运行确认）。** 第 2 节：epoch 数或"最后 epoch 单独打乱"一变，
#    `document_index` 与 `shuffle_index` 整个换掉，而 `consumed_train_samples` 仍按旧序列的偏移跳过。多 epoch 的小语料上，
#    延长训练再续训会重复一些样本、漏掉另一些。blend 里每个语料的 `num_samples` 随总 size 按权重变化，同样受影响。
# 6. **blend 的 top-level size 比要求多。** 每个语料向上取整后相加（第 3 节 16 → 17）；`build` 里的一致性检查
#    只要求 `size == len(dataset)`，不要求等于 sizes 里的数。训练只取前 `train_iters × gbs` 个，无害，但 `len()` 不是你要的数。
# 7. **`IndexedDataset` 的数组活不过它的对象（运行确认）。** `sequence_lengths`、`document_indices` 是 `.idx` 文件 mmap 上的
#    numpy 视图，而 `_IndexReader.__del__` 会主动关闭这个 mmap
#    （[`indexed_dataset.py:332`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L332)）。
#    `IndexedDataset(prefix).sequence_lengths.tolist()` 这样一行里，对象在 `.tolist()` 之前就被回收，读到的是已解除映射的内存：
#    进程被 SIGSEGV 杀死，没有 Python 异常（本篇初稿的 kernel 就是这样死的，所以第一格把两个对象留在变量里）。在一个 rank 里重现：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def dangling_view(prefix):
    kept = IndexedDataset(prefix)
    lengths = kept.sequence_lengths.tolist()  # fine: `kept` still holds the mmap
    return lengths, IndexedDataset(prefix).sequence_lengths.tolist()  # the object is gone before tolist()


try:
    run_ranks(dangling_view, 1, corpus_a)
except RankError as err:
    print("rank", err.rank, ":", err.summary)

# %% [markdown]
# ## 自测
#
# **1. `--data-path 0.7 a 0.3 b`、train 要 16 个样本时，train 的 `BlendedDataset` 有几个样本？两个语料各被要多少？**
#
# <details><summary>答案</summary>
#
# 17 个：ceil(16·0.7) + ceil(16·0.3) = 12 + 5。语料层还要乘 (1 + 0.005) 再取整：a 要 13 个、b 要 6 个（实际按整 epoch 建得更多）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(blended[0]), math.ceil(16 * 0.7) + math.ceil(16 * 0.3), [d.num_samples for d in blended[0].datasets])

# %% [markdown]
# **2. `--split 6,2,2`、语料 10 篇文档时，valid 用哪几篇？**
#
# <details><summary>答案</summary>
#
# `split_matrix` 是 [(0, 0.6), (0.6, 0.8), (0.8, 1.0)]，文档区间 `round(0.6·10)` 到 `round(0.8·10)`：第 6、7 篇。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(config.split_matrix[1], valid.indices.tolist())

# %% [markdown]
# **3. 从 `consumed_train_samples = 8` 恢复、DP=2、micro-batch 1 时，DP rank 1 第一个 micro-batch 取哪个下标？**
#
# <details><summary>答案</summary>
#
# 下标 9：sampler 从 8 起每 2 个一块，rank 0 取块里第 0 个、rank 1 取第 1 个。第二个 micro-batch 是 11。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([idx for idx, _ in reading_ranks(resume, dp=2)[1]["steps"][0]])

# %% [markdown]
# **4. 把 `position_ids` 倒序，RoPE 模型与 learned_absolute 模型的输出各变不变？**
#
# <details><summary>答案</summary>
#
# learned_absolute 变了（位置嵌入读 `position_ids`）；RoPE 不变（RoPE 只要一个长度，没有模块读 `position_ids`）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(effect(runs["learned_absolute"]["changed"]["position_ids 倒序"], runs["learned_absolute"]["base"]),
      effect(runs["rope"]["changed"]["position_ids 倒序"], runs["rope"]["base"]))

# %% [markdown]
# **5. packed batch 里，RoPE 表有多长？由什么决定？**
#
# <details><summary>答案</summary>
#
# `get_rotary_seq_len` 在有 `packed_seq_params` 时返回 `max(max_seqlen_q, max_seqlen_kv)`，即最长一段的长度，不是 8。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(packed_out["rotary_length"], int(packed["cu_seqlens"].diff().max()))

# %% [markdown]
# ## 30-second answer
#
# `core_gpt_dataset_config_from_args` copies args into `GPTDatasetConfig`; `--data-path` becomes a blend, and split sizes
# follow from train and eval iterations. The builder cuts documents by `--split`; each `GPTDataset` shuffles documents,
# then samples, with one seeded RNG over whole epochs, so changing the sizes changes the order. `BlendedDataset`
# interleaves greedily: no corpus ever runs a full sample ahead of its weight, so two corpora stay within one sample (with K
# corpora one can lag by up to K − 1). The model reads tokens, mask and labels; `loss_mask` only enters
# `loss_func`; RoPE ignores `position_ids`. Packed batches restart RoPE per segment and need TE attention. Resuming skips
# `consumed_train_samples`, at any DP size.
