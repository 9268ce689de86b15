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
# [笔记 03](../03_data_and_batch_flow/) 已经把数据链路走通：`.bin/.idx` → `GPTDataset` → `get_batch` 的 TP 广播与 CP 切分。
# 这一篇逐条回答路线图"数据专题"的五个关注点：`--data-path 0.7 a 0.3 b --split 6,2,2` 这样一条命令行怎样变成
# `GPTDatasetConfig` 和三个 split，样本的顺序由什么决定、改了训练步数续训会怎样，五个字段各被模型的哪一处读到、
# 每个 pipeline stage 真正需要哪些，packed 时 `cu_seqlens` 和 `max_seqlen` 又怎样一路走到 attention？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出 args 经过哪三个函数变成 `GPTDatasetConfig` 和三个 split 的样本数，`--data-path` 的权重怎么解析。
# 2. 说清 `BlendedMegatronDatasetBuilder` 怎样切 split、建三张索引表、按权重交错多个语料，以及为什么改 `--train-iters` 会换掉样本顺序。
# 3. 说出 `tokens`、`labels`、`loss_mask`、`attention_mask`、`position_ids` 各被 `GPTModel` 的哪个模块读到。
# 4. 说出 TP / CP / PP 下每个 rank 拿到哪些字段；packed 时 `cu_seqlens`、`max_seqlen` 决定什么。
# 5. 说清续训怎样跳过已消费的样本，换 DP 大小行不行。
#
# **结论**
#
# - args 几乎原样抄进 `GPTDatasetConfig`；三个 split 要 [16, 12, 4] 个样本，由步数、评估节奏和 global batch 推出。
# - `--split 6,2,2` 按文档切，索引按整 epoch 建（要 16 个建出 18 个）；顺序只由 seed 和 sizes 定，`--train-iters` 4 → 5 时前 16 个只剩 2 个相同。
# - blend 是贪心交错（0.7 / 0.3：12 + 5 = 17 个）：两个语料每个前缀偏差 < 1，三个语料时大语料落后到 1.188。
# - `tokens` 只进词嵌入、`labels` 只进 loss；`loss_mask` 模型不读（只进 `loss_func`），RoPE 下 `position_ids` 也没人读。
# - TP rank 0 读数据再在 TP 群广播，CP 每 rank 留 2 块（笔记 03）；PP 中间 stage 拿到 0 个字段，尾 stage 没有 tokens 也算出同一个 loss 42.7244。
# - packed 时 `cu_seqlens` [0, 3, 6, 8] 让 RoPE 每段从 0 起，结果与逐文档单跑相同；`max_seqlen` 只定 RoPE 表长 3。
#
# 先读：[笔记 03](../03_data_and_batch_flow/)（数据链路、TP 广播与 CP 切分）、[笔记 05](../05_forward_loss_backward/)（loss 的归约）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import math
import tempfile

import numpy
import torch

from snippets.data.batch_flow import FIELDS
from snippets.data.dataset_args import (CONFIG_FROM_ARGS, core_gpt_dataset_config_from_args,
                                        get_train_valid_test_num_samples, parse_args)
from snippets.data.field_runs import (CHANGES, effect, field_runs, packed_runs, pipeline_fields, readers_cell,
                                     where)
from snippets.data.pictures import draw_blend, draw_fields
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n03_batch_flow import write_corpus
from snippets.experiments.n18_data_topic import (build_table, checks, consumed_line, read_iterations, reading_ranks,
                                                 resume_table, run)
from snippets.ranks.launch import RankError, run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import get_blend_from_list, normalize
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tokenizers import MegatronTokenizer

# two corpora: a counts up (ten documents of 2-5 tokens), b repeats 20-24 (eight documents); EOD = 31
tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)
workdir = tempfile.TemporaryDirectory()
lengths = [2 + i % 4 for i in range(10)]
starts = numpy.cumsum([0] + lengths[:-1])
corpus_a = write_corpus(workdir.name, "a", [[int(s + j) % 30 for j in range(n)] for s, n in zip(starts, lengths)],
                        tokenizer.eod)
corpus_b = write_corpus(workdir.name, "b", [[20 + i % 5] * (3 + i % 3) for i in range(8)], tokenizer.eod)
NAMES = {corpus_a: "a", corpus_b: "b"}  # print names, never temporary paths
indexed_a, indexed_b = IndexedDataset(corpus_a), IndexedDataset(corpus_b)  # keep them: see 坑 7

COMMAND = (f"--data-path {corpus_a} --split 6,2,2 --seq-length 4 --micro-batch-size 1 --global-batch-size 4 "
           "--train-iters 4 --eval-interval 2 --eval-iters 1 --tokenizer-type NullTokenizer --vocab-size 32")


def from_command(command, world_size=2):
    """What the formal entry makes of a command line: its args and its GPTDatasetConfig."""
    a = parse_args(command, world_size=world_size)
    return a, core_gpt_dataset_config_from_args(a, tokenizer)


def with_data_path(data_path, command=COMMAND):
    """COMMAND with another --data-path, written with the corpus names a and b."""
    prefixes = " ".join({"a": corpus_a, "b": corpus_b}.get(word, word) for word in data_path.split())
    return command.replace(f"--data-path {corpus_a}", f"--data-path {prefixes}")


# one micro-batch of 2 samples, seq 8, --eod-mask-loss: what forward_step hands the model
_, model_config = from_command(COMMAND.replace("--seq-length 4", "--seq-length 8") + " --eod-mask-loss", world_size=1)
model_data = BlendedMegatronDatasetBuilder(GPTDataset, [8, None, None], lambda: True, model_config).build()[0]
batch = next(iter(torch.utils.data.DataLoader(model_data, batch_size=2)))
runs = run_ranks(field_runs, 1, batch)[0]               # one rank: who reads each field, what a change does
pp = run_ranks(pipeline_fields, 3, batch, grid=dict(pp=3))  # PP=3: each stage given only get_batch's fields
draw_fields(pp, runs["rope"]["readers"],
            title="五个字段各有读者：首 stage 读 tokens、尾 stage 读 labels；loss_mask 只进 loss_func，RoPE 下 position_ids 无人读")

# %% [markdown]
# 每一行是一个 batch 字段：中间是单 rank 的 RoPE `GPTModel` 里读它的模块，右边是 PP=3 时 `get_batch` 给每个 stage 留下它没有、模型真读了没有。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 语料：a 有 10 篇文档（2–5 个 token，依次递增），b 有 8 篇（20–24 的重复），都用 Megatron 的 `IndexedDatasetBuilder` 写进临时目录，
#   每篇末尾加 EOD；tokenizer 是 `--tokenizer-type NullTokenizer --vocab-size 32` 建出的 core `null-text` 库
#   （[`build_tokenizer.py:88`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L88)），
#   `--vocab-size` 把 EOD 算在内，EOD = 31（[`null_tokenizer.py:19`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/text/libraries/null_tokenizer.py#L19)）。页面不打印任何路径。
# - 命令行：`--split 6,2,2 --seq-length 4 --micro-batch-size 1 --global-batch-size 4 --train-iters 4 --eval-interval 2 --eval-iters 1`，
#   按 DP=2 解析。`get_blend_and_blend_per_split`、`core_gpt_dataset_config_from_args`、`get_train_valid_test_num_samples`
#   读全局 `get_args()` 或在 `pretrain_gpt.py` 里，`snippets/data/dataset_args.py` 用 Megatron 的名字照 tag 重写成接收 `args`
#   （`tests/unit/test_dataset_args.py` 把它们和原函数逐字段比）；builder、`GPTDataset`、`BlendedDataset`、C++ helper 都是真的。
# - 模型：`snippets/data/field_runs.py`。`field_runs` 在 1 个 gloo rank 上建 2 层的真实 `GPTModel`（local spec，hidden 16，vocab 32，
#   seq 8，micro-batch 2），`snippets/data/forward_fields.py` 给每个可能的读者挂 forward pre-hook、包住 loss 方法，记下谁收到了哪个字段；
#   `pipeline_fields` 在 3 个 rank（PP=3，每 stage 1 层）上跑真实的 `get_forward_backward_func()`，每个 stage 只给 `get_batch` 会留下的字段；
#   权重按全局层名生成，所以能与单 rank 的 3 层模型逐元素比；`packed_runs` 跑 packed batch。
# - 续训：`snippets/experiments/n18_data_topic.py` 的 `run`（实验名 `data-topic`）在 4 个 rank 上建数据集和
#   `MegatronPretrainingSampler`（`megatron/training` 里的 sampler 由 `snippets/data/pretraining_sampler.py` 照 tag 重写）。
#   尺寸 `tiny`：seq 4、micro-batch 1、每步 2 个 micro-batch、vocab 32。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 data-topic --tp 2` 打印续训的两张表；
#   整页：`scripts/execute_notes.sh notes/18_data_topic.py`。CPU 上的改动见文末"在 CPU 上怎么跑的"。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(field_runs, pipeline_fields, packed_runs)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(read_iterations, run)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`pretrain_gpt.py::core_gpt_dataset_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L377) | 一个 `字段: args.x` 的字典，交给 `GPTDatasetConfig` |
# | [`utils.py::get_blend_from_list`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/utils.py#L49) | `--data-path` 的列表 → (前缀, 权重) |
# | [`training.py::get_train_valid_test_num_samples`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4464) | 三个 split 各要多少样本 |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder._build_blended_dataset_splits`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L136) | 单语料 / blend / 按 split 的 blend 三条路 |
# | [`gpt_dataset.py::GPTDataset._build_document_sample_shuffle_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L440) | document / sample / shuffle 三张索引表 |
# | [`blended_dataset.py::BlendedDataset._build_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_dataset.py#L111) | 调 C++ 的 `build_blending_indices`（[helpers.cpp 第 77 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.cpp#L77)） |
# | [`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97) | 按 stage 留字段，TP 广播，CP 切分 |
# | [`gpt_model.py::GPTModel.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L519) | 五个字段和 `packed_seq_params` 的入口 |
# | [`rotary_pos_embedding.py::RotaryEmbedding.get_rotary_seq_len`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L212) | RoPE 表长：packed 时是 `max_seqlen` |
# | [`data_samplers.py::MegatronPretrainingSampler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L115) | 从 `consumed_samples` 起按 DP rank 切块 |
#
# <details><summary>其余 18 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`indexed_dataset.py::IndexedDatasetBuilder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L923)、[`indexed_dataset.py::IndexedDataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L597) | `.bin/.idx` 的写与读 |
# | [`common_utils.py::get_blend_and_blend_per_split`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/utils/common_utils.py#L507) | `--data-path` / `--*-data-path` → `blend` / `blend_per_split` |
# | [`blended_megatron_dataset_config.py::BlendedMegatronDatasetConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L16) | `__post_init__` 派生 `split_matrix`、`mock` |
# | [`blended_megatron_dataset_config.py::convert_split_vector_to_split_matrix`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_config.py#L175) | `"6,2,2"` → 三段区间 |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder._build_megatron_dataset_splits`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L416) | 按 `split_matrix` 切文档区间，每段一个 `GPTDataset` |
# | [`blended_megatron_dataset_builder.py::BlendedMegatronDatasetBuilder.build_generic_dataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L491) | rank 0 先建、world barrier、其余 rank 读缓存 |
# | [`blended_megatron_dataset_builder.py::_get_size_per_split_per_dataset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L553) | blend 里每个语料要多少样本（含 surplus） |
# | [`gpt_dataset.py::GPTDataset._get_num_epochs`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L676) | 几个 epoch 才够 `num_samples` |
# | [`gpt_dataset.py::_build_document_index`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L699)、[`gpt_dataset.py::_build_shuffle_index`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L733) | 打乱文档、打乱样本 |
# | [`gpt_dataset.py::GPTDataset._query_document_sample_shuffle_indices`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L353) | 下标 → 三张表 → token 窗口 |
# | [`helpers.py::build_sample_idx`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.py#L12) | C++ 的 sample index（pip 包里是编译好的 `helpers_cpp`） |
# | [`utils.py::get_batch_on_this_tp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2119)、[`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | TP 群广播（按 stage 挑字段）、CP 切分 |
# | [`pretrain_gpt.py::loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L209) | `sum(losses · loss_mask)` 与 token 数 |
# | [`language_model_embedding.py::LanguageModelEmbedding.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L99) | 读 `input_ids`；只有 learned_absolute 读 `position_ids` |
# | [`rope_utils.py::_apply_rotary_pos_emb_thd`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L189) | packed 时按 `cu_seqlens` 逐段做 RoPE |
# | [`attention.py::Attention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1278)、[`dot_product_attention.py::DotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L142) | THD 时去掉 batch 维；local attention 拒绝 packed |
# | [`transformer_engine.py::TEDotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1972) | 把 `PackedSeqParams` 的字段交给 TE |
# | [`data_samplers.py::build_pretraining_data_loader`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/datasets/data_samplers.py#L19)、[`training.py::build_train_valid_test_data_loaders`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4513) | 用 `consumed_train_samples` 建 loader |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342)、[`checkpointing.py::load_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2066) | 每步累加、从 checkpoint 的 `args` 取回 `consumed_train_samples` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 数据在 `pretrain` 里建一次：`get_train_valid_test_num_samples` → `core_gpt_dataset_config_from_args` → builder 的
# `build()`（每个语料一个 `GPTDataset`，多个语料再包一层 `BlendedDataset`）→ 从 `consumed_train_samples` 起的 sampler；
# 之后每个 micro-batch 在 `forward_step` 里 `get_batch` 一次，交给 `GPTModel.forward` 和 `loss_func`。
#
# <details><summary>完整调用链</summary>
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
#          │  │  └─ megatron/training/utils/common_utils.py::get_blend_and_blend_per_split
#          │  │     └─ megatron/core/datasets/utils.py::get_blend_from_list   # 奇数个 → 无权重；偶数个 → (权重, 前缀) 成对
#          │  └─ BlendedMegatronDatasetBuilder(cls, sizes, is_built_on_rank, config).build()
#          │     └─ _build_blended_dataset_splits
#          │        ├─ 单个前缀且无权重：直接 _build_megatron_dataset_splits
#          │        ├─ 每个前缀：_build_megatron_dataset_splits                  # 按 split_matrix 切文档区间
#          │        │  └─ GPTDataset(...)._build_document_sample_shuffle_indices # rank 0 先建并写 .npy，world barrier
#          │        │     ├─ _build_document_index                           # numpy RandomState(seed) 打乱文档
#          │        │     ├─ helpers.build_sample_idx (C++)                  # 每个样本的起点
#          │        │     └─ _build_shuffle_index                            # 打乱样本
#          │        └─ 有权重或多于一个前缀：BlendedDataset(datasets, weights, size)
#          │           └─ helpers.build_blending_indices (C++)             # 贪心交错，不随机
#          └─ megatron/training/datasets/data_samplers.py::build_pretraining_data_loader(ds, consumed_train_samples)
#             └─ MegatronPretrainingSampler                              # 从 consumed 起，每块 mbs·dp 个下标，DP rank r 取第 r 份
#
# train → train_step → forward_backward_func → pretrain_gpt.py::forward_step
# ├─ get_batch                                                     # 中间 stage 全是 None（packed 时只拿 cu_seqlens、max_seqlen）
# │  ├─ get_batch_on_this_tp_rank                                  # TP 群 broadcast，按 stage 挑字段（笔记 03）
# │  └─ get_batch_on_this_cp_rank                                  # CP 切成 2·CP 块（笔记 03、16）
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
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `get_batch`、`get_batch_on_this_tp_rank`、`get_batch_on_this_cp_rank`、`BlendedMegatronDatasetBuilder.build` 的记录在[笔记 03](../03_data_and_batch_flow/)。
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
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `GPTDatasetConfig`：一张从 args 抄来的字典
#
# 正式入口里这一步分三处：`get_blend_and_blend_per_split` 把 `--data-path` 交给 core 的 `get_blend_from_list`；
# `core_gpt_dataset_config_from_args` 是一个 `字段: args.x` 的字典字面量，原样传给 `GPTDatasetConfig`；
# `get_train_valid_test_num_samples` 算三个 split 各要多少样本。本篇的命令行是 DP=2、micro-batch 1、global batch 4、
# 训练 4 步、每 2 步验证 1 步：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
args, config = from_command(COMMAND)
sizes = get_train_valid_test_num_samples(args)


def shown(value):
    if isinstance(value, tuple) and value and isinstance(value[0], list):  # a blend
        return ([NAMES.get(p, p) for p in value[0]], value[1])
    return "NullTokenizer" if value is tokenizer else value


print("split_matrix:", config.split_matrix, " mock:", config.mock, " sizes [train, valid, test]:", list(sizes))
Table(["GPTDatasetConfig 字段", "取自", "值"],
      [[field, f"args.{attr}" if attr else "（计算得出）", shown(getattr(config, field))]
       for field, attr in CONFIG_FROM_ARGS.items()
       if field in ("random_seed", "sequence_length", "blend", "split", "reset_position_ids", "reset_attention_mask",
                    "eod_mask_loss", "create_attention_mask", "mid_level_dataset_surplus", "data_parallel_size")])

# %% [markdown]
# 真正"算"的只有 `blend`、tokenizer 和三个 sizes；`split_matrix`、`mock` 是 config 在 `__post_init__` 里派生的。sizes 只由训练节奏决定：
# train = `train_iters × gbs` = 16，valid = `(train_iters // eval_interval + 1) × eval_iters × gbs` = 12，test = `eval_iters × gbs` = 4。
#
# `--data-path` 的写法由 `get_blend_from_list` 认：个数为奇数 ⇒ 全是前缀；偶数 ⇒ 按 (权重, 前缀) 成对读，
# 有一个权重读不成数就整体当作无权重的前缀。权重不必归一化，builder 里再 `normalize`：

# %%
def blend_of(data_path):
    try:
        return get_blend_from_list(data_path.split())
    except AssertionError:
        return "AssertionError"


written = ["a", "a b", "0.7 a 0.3 b", "30 a 70 b", "1.0 a", "0.5 a b c", "a 0.3 0.7 b"]
Table(["--data-path", "get_blend_from_list → (前缀, 权重)"], [[w, blend_of(w)] for w in written])

# %% [markdown]
# 最后两行都写错了，待遇却不同。代码想检查"要么全有权重、要么全没有"，可 `is_none` 是一次性的 `map` 迭代器
# （[`utils.py:84`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/utils.py#L84)）：
# `any(is_none)` 消费到第一个非数为止，`all(is_none)` 只看**它之后**的项。`a 0.3 0.7 b` 配成 (a, 0.3)、(0.7, b)，非数后面还有数，
# 断言触发；`0.5 a b c` 配成 (0.5, a)、(b, c)，非数在最后，`"0.5"` 被静默当成一个语料的路径，建数据集时才失败（坑 1）。
#
# ### builder：切 split、建三张索引表
#
# `_build_blended_dataset_splits` 只在"一个前缀且**没有权重**"时直接走 `_build_megatron_dataset_splits`
# （[`blended_megatron_dataset_builder.py:168`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/blended_megatron_dataset_builder.py#L168)）：
# 按 `split_matrix` 把**文档**切成三段（`round(比例 × 文档数)`），每段一个 `GPTDataset`。写了权重的 `1.0 a` 走 blend 那条路，
# 多包一层只有一个成员的 `BlendedDataset`：

# %%
train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
weighted = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True,
                                         from_command(with_data_path("1.0 a"))[1]).build()[0]
print("--data-path a    :", type(train).__name__, len(train))
print("--data-path 1.0 a:", type(weighted).__name__, len(weighted), "← 里面是", type(weighted.datasets[0]).__name__,
      len(weighted.datasets[0]))
Table(["split", "文档（indexed_indices）", "num_samples（要的）", "len（建出的）", "每 epoch token 数", "epoch 数"],
      [[ds.index_split.name, ds.indices.tolist(), ds.num_samples, len(ds), ds._get_num_tokens_per_epoch(),
        ds._get_num_epochs(ds._get_num_tokens_per_epoch())] for ds in (train, valid, test)])

# %% [markdown]
# `num_samples` 只是下限。一个样本要 `seq_length + 1 = 5` 个 token（多的 1 个给 `labels`），train 要 16 个样本即
# 16·4 + 1 = 65 个 token，而 train 的 6 篇文档一个 epoch 只有 25 个 token，所以要 3 个 epoch；索引总按整 epoch 建，
# 75 个 token 切得出 (75 − 1) // 4 = 18 个样本。三张索引表（train 与 test）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["split", "表", "shape", "内容"],
      [[ds.index_split.name, name, list(getattr(ds, name).shape), getattr(ds, name).tolist()]
       for ds in (train, test) for name in ("document_index", "sample_index", "shuffle_index")])

# %% [markdown]
# - `document_index`：每个 epoch 把本 split 的文档排一遍，几个 epoch 接起来整体打乱（`numpy.random.RandomState(seed)`）；train 里 0–5 各出现 3 次。
# - `sample_index`：C++ 的 `build_sample_idx` 沿 `document_index` 走，每 `seq_length` 个 token 记一个起点"(document_index 里的位置, 文档内偏移)"，共 `len + 1` 行。
# - `shuffle_index`：样本层面再打乱一次；`ds[i]` 取第 `shuffle_index[i]` 个样本，从它那一行走到下一行再多取 1 个 token。
#
# 顺着三张表手工取出 18 个样本的 token，与 `GPTDataset.__getitem__` 给的逐个相同：

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
print("train[0]: shuffle_index[0] =", j, "→ sample_index 第", j, "、", j + 1, "行", train.sample_index[j].tolist(),
      train.sample_index[j + 1].tolist(), "→", tokens)
print("全部 18 个样本都一致:", all(window(train, i)[1] == train[i]["tokens"].tolist() + train[i]["labels"][-1:].tolist()
                          for i in range(len(train))))

# %% [markdown]
# **最后一个 epoch 单独打乱。** 若最后一个 epoch 只用到不足 80% 的样本
# （[gpt_dataset.py 第 536–537 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L536-L537)），
# 前面完整的 epoch 混在一起打乱，最后一个自己打乱、排在末尾
# （[gpt_dataset.py 第 594–600 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L594-L600)），
# 这样先读到的样本不会偏向最后那个 epoch 里碰巧被选中的文档。这也意味着**顺序取决于 sizes**：同一份语料只改 `--train-iters`，
# `train[i]` 还是同一个样本吗？

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def train_split(iters):
    a, c = from_command(COMMAND.replace("--train-iters 4", f"--train-iters {iters}"))
    return BlendedMegatronDatasetBuilder(GPTDataset, get_train_valid_test_num_samples(a), lambda: True, c).build()[0]


def split_in_two(ds):
    tokens_per_epoch = ds._get_num_tokens_per_epoch()
    sans_final = ((ds._get_num_epochs(tokens_per_epoch) - 1) * tokens_per_epoch - 1) // 4
    head, tail = ds.shuffle_index[:sans_final], ds.shuffle_index[sans_final:]
    return bool(head.max() < sans_final and tail.min() >= sans_final), sans_final


base = [train[i]["tokens"].tolist() for i in range(16)]
rows = []
for iters in (3, 4, 5, 6, 8):
    ds = train_split(iters)
    two_parts, sans_final = split_in_two(ds)
    same = sum(ds[i]["tokens"].tolist() == base[i] for i in range(min(len(ds), 16)))
    rows.append([iters, ds.num_samples, ds._get_num_epochs(ds._get_num_tokens_per_epoch()),
                 f"前 {sans_final} 个 | 其余" if two_parts else "整体", f"{same} / {min(len(ds), 16)}"])
Table(["train_iters", "num_samples", "epoch 数", "shuffle_index 怎么打乱", "前 16 个样本与 train_iters=4 时相同"], rows)

# %% [markdown]
# train_iters=5 时要 20 个样本、4 个 epoch，最后一个 epoch 只取 2 个（< 0.8 × 6），`shuffle_index` 分两段打乱。
# 只要 epoch 数或"是否单独打乱"变了，整条样本序列就换了（坑 5）。预训练语料远大于所需（1 个 epoch）不受影响；多 epoch 的小语料才会碰到。
#
# ### `BlendedDataset`：按权重的贪心交错
#
# `--data-path 0.7 a 0.3 b`：builder 先给每个语料按权重要样本（`ceil(ceil(size·w)·(1 + surplus))`，surplus 缺省 0.005），
# 每个语料按同一个 `split` 切出自己的三段；再用 `BlendedDataset` 交错。顶层 size 是 `Σ ceil(size·w)`，不是 size 本身：

# %%
blended = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True,
                                        from_command(with_data_path("0.7 a 0.3 b"))[1]).build()
Table(["split", "size（要的）", "BlendedDataset 长度", "a: num_samples / len", "b: num_samples / len", "dataset_index"],
      [[ds.split.name, size, len(ds), *[f"{d.num_samples} / {len(d)}" for d in ds.datasets],
        "".join(map(str, ds.dataset_index.tolist()))] for ds, size in zip(blended, sizes)])

# %% [markdown]
# train 要 16 个，blend 有 17 个：ceil(16·0.7) + ceil(16·0.3) = 12 + 5。`dataset_index` 是 C++ `build_blending_indices` 的结果：
# 每一步选"`n × 权重` − 已取数"最大的语料
# （[helpers.cpp 第 116 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/helpers.cpp#L116)）。
# 它的参数里没有 seed；随机性只在每个语料自己的 `shuffle_index` 里。下图的格子是 train 的 17 个样本（颜色 = 语料，
# 字 = 该语料的第几个样本），折线是"前 n 个样本里 a 的个数 − 0.7·n"：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
train_blend = blended[0]
draw_blend(train_blend.dataset_index, train_blend.dataset_sample_index,
           [round(float(w), 4) for w in train_blend.weights], title="--data-path 0.7 a 0.3 b：train 的每个样本来自哪个语料")

# %% [markdown]
# 两个语料时折线始终在 ±1 之内。这个界对更多语料**不**成立。直接调编译好的 `build_blending_indices`，
# 各排 1000 个样本，比较 0.7 / 0.3 与三个语料 0.8554 / 0.0746 / 0.07：

# %%
def blending_indices(weights, size=1000):
    weights = numpy.array(normalize(weights))
    dataset_index, dataset_sample_index = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
    helpers_cpp.build_blending_indices(dataset_index, dataset_sample_index, weights, len(weights), size, False)
    taken = numpy.stack([numpy.cumsum(dataset_index == d) for d in range(len(weights))], axis=1)
    return weights, taken - weights * numpy.arange(1, size + 1)[:, None]  # 前 n 个里的个数 − n·w


deviation = {blend: blending_indices(w) for blend, w in {"a/b": [0.7, 0.3], "a/b/c": [0.8554, 0.0746, 0.07]}.items()}

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["blend", "语料", "权重", "最多领先", "上界 1 − w", "最多落后", "上界 K − 2 + w", "最多落后时的 n"],
      [[blend, "abc"[d], round(float(w[d]), 4), round(float(dev[:, d].max()), 4), round(1 - float(w[d]), 4),
        round(float(-dev[:, d].min()), 4), round(len(w) - 2 + float(w[d]), 4), int(dev[:, d].argmin()) + 1]
       for blend, (w, dev) in deviation.items() for d in range(len(w))])

# %% [markdown]
# 大语料 a 在第 220 个样本处落后了 1.188 个：c、b 在相隔几步之内先后被选，a 还没补回来。能证明的界是这样：
# 被选中的语料此前不领先（各语料"已取数 − n·w"之和恒为 0，最大的那个落后量不小于 0），所以任何语料**领先**都不超过 `1 − w`；
# 一个语料落后多少，就等于其余语料领先之和，所以**落后**不超过 `K − 2 + w` 个（K 是语料数）。K = 2 时两者都小于 1，
# 这才是"逐前缀差不到 1 个样本"的来源；K = 3 时大语料可以落后超过 1 个，但比例仍然逐前缀贴着权重。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 五个字段各去哪里
#
# `forward_step` 的调用是 `model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask, packed_seq_params=...)`
# （[`pretrain_gpt.py:348`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L348)）。
# batch 来自真实的 `GPTDataset`（序列长 8、`--eod-mask-loss`、micro-batch 2），模型是 2 层的 `GPTModel`，两种位置编码各建一个。
# 给每个可能的读者挂探针，看每个字段被谁读到；再逐个改动一个字段，看每 token 的 loss 变不变：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print({k: f"{list(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in batch.items()})
FORWARD_ARG = dict(tokens="input_ids（第 1 个位置参数）", position_ids="position_ids", attention_mask="attention_mask",
                   labels="labels=", loss_mask="loss_mask=")
Table(["batch 字段", "GPTModel.forward 参数", "被谁读到（learned_absolute）", "被谁读到（rope）"],
      [[k, FORWARD_ARG[k], readers_cell(runs["learned_absolute"]["readers"][k]), readers_cell(runs["rope"]["readers"][k])]
       for k in FIELDS])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["改动", "learned_absolute", "rope"],
      [[change, effect(runs["learned_absolute"]["changed"][change], runs["learned_absolute"]["base"]),
        effect(runs["rope"]["changed"][change], runs["rope"]["base"])] for change in CHANGES])

# %% [markdown]
# - `tokens` 只进词嵌入；`labels` 只进 `compute_language_model_loss`（logits → 每 token 的 loss `[b, s]`）；`attention_mask` 进每层
#   core attention，传 `None` 时 local attention 自己造因果 mask（[`utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39)）。
# - **`position_ids` 在 RoPE 下没有模块读。** 只有 learned_absolute 建 `position_embeddings`
#   （[`language_model_embedding.py:44`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L44)）；
#   RoPE 只向 `rotary_pos_emb` 要一个长度，位置永远是 0…s−1，所以 `--reset-position-ids` 在 RoPE 模型上不起作用（坑 2）。
# - **`loss_mask` 模型也不读**（不开 MTP 时），全 0 和全 1 的输出一样。它在 `forward_step` 绑进 `loss_func`，
#   后者返回 `sum(losses · loss_mask)` 和 `num_tokens = loss_mask.sum()`，除法留给 schedule 与 DP 归约（笔记 05）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
losses = runs["rope"]["base"]
print("每 token loss 之和:", round(float(losses.sum()), 4), " 乘 loss_mask 后:",
      round(float((losses * batch["loss_mask"]).sum()), 4), " num_tokens:", int(batch["loss_mask"].sum()),
      "/", batch["loss_mask"].numel())

# %% [markdown]
# ### TP、CP、PP：每个 rank 拿到什么
#
# TP：只有 TP rank 0 读数据，`get_batch_on_this_tp_rank` 在 TP 群里逐个 broadcast；CP：`get_batch_on_this_cp_rank` 把序列切成
# 2·CP 块、每个 rank 留一头一尾两块，只做索引（两者的运行和通信记录都在笔记 03，attention 在[笔记 16](../16_context_parallel/)）。
#
# PP 是这一节的新事实：`get_batch` 给首 stage `tokens, position_ids, attention_mask`，尾 stage `labels, loss_mask, attention_mask`，
# 中间 stage 直接返回全 `None`（[`pretrain_gpt.py:121`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L121)）。
# 够不够？主图那次 PP=3 的运行里，每个 stage 只拿这些字段，用真实的 schedule 跑一个 micro-batch：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
whole = runs["rope, 3 layers"]["base"]
print("单 rank 3 层模型: loss·mask 之和", round(float((whole * batch["loss_mask"]).sum()), 4),
      " num_tokens", int(batch["loss_mask"].sum()))
Table(["rank", "stage", "get_batch 留下的字段", "模型里真被读到的", "attention_mask=None 时", "lm loss 报告 [和, token 数]"],
      [[r, d["stage"], ", ".join(d["given"]) or "无", ", ".join(d["read"]) or "无", d["mask_none"] or "-",
        [round(float(x), 4) for x in d["report"][0]] if d["report"] else "-"] for r, d in enumerate(pp)])

# %% [markdown]
# - 尾 stage 拿着 `tokens=None` 算出的 loss 与单 rank 完整模型相同（42.7244，12 个 token）：它只需要 `labels`、`loss_mask` 和 mask。
# - 首 stage 收到三个字段，读的只有 `tokens` 和 `attention_mask`：RoPE 下 `position_ids` 白白广播了一次。
# - 中间 stage 的 attention 收到 `attention_mask=None`，于是自己造普通的因果 mask：数据集若用 `--reset-attention-mask`
#   造了块对角 mask，中间 stage 看不到它（坑 3）。
#
# 数据字段在 PP 群里从不传递，每个 stage 各自从 `get_batch` 拿；这次运行里唯一的通信是 stage 之间的激活（[笔记 13](../13_pipeline_schedules/)），中间 stage 记下的：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(pp[1]["calls"], meanings={
    "batch_isend_irecv": "stage 间的激活 [s, b, h]：irecv 收上一 stage 的输出，isend 把本 stage 的输出交给下一 stage"})

# %% [markdown]
# ### packed sequence：`cu_seqlens`、`max_seqlen` 怎样到 attention
#
# 取上面数据集里文档最多的一条样本，按 EOD 切成一个 packed（THD）micro-batch。正式入口里（`--sft` 或
# `--dataloader-inter-document-masking`），`get_batch` 广播 `cu_seqlens`（中间 stage 也拿）、按 CP 切分，`forward_step` 把它
# squeeze 成一维（[`pretrain_gpt.py:314`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L314)），
# 装进 `PackedSeqParams(qkv_format="thd")`（[`pretrain_gpt.py:323`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L323)）：

# %%
sample = max((model_data[i] for i in range(len(model_data))), key=lambda s: int((s["tokens"][:-1] == tokenizer.eod).sum()))
ends = ((sample["tokens"][:-1] == tokenizer.eod).nonzero().flatten() + 1).tolist()
cu_seqlens = torch.tensor([0, *ends, 8], dtype=torch.int32)
max_seqlen = int(cu_seqlens.diff().max())
params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                         max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)
rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
print("tokens:", sample["tokens"].tolist(), " cu_seqlens:", cu_seqlens.tolist(), " max_seqlen:", max_seqlen)
print("RoPE 表长 get_rotary_seq_len:", rope.get_rotary_seq_len(None, None, None, None, packed_seq_params=params))

# %% tags=["hide-input"] jupyter={"source_hidden": true}
packed = dict(tokens=sample["tokens"][None], labels=sample["labels"][None], cu_seqlens=cu_seqlens)
packed_out = run_ranks(packed_runs, 1, packed)[0]
message, frames = packed_out["local_attention"]
print("local DotProductAttention:", message)
print("  @", " → ".join(f"{path.split('/')[-1]}:{line}" for path, line, name in frames if name != "__call__"))

# %% [markdown]
# 本地 `DotProductAttention` 断言 `packed_seq_params is None`
# （[dot_product_attention.py 第 153 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L153)）：THD 只能走 TE。
# 但在那之前，`packed_seq_params` 已经起了两次作用：`GPTModel` 问 `get_rotary_seq_len` 要 RoPE 表长，packed 时它直接返回
# `max(max_seqlen_q, max_seqlen_kv)`（[`rotary_pos_embedding.py:241`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L241)）；
# `Attention.forward` 去掉 batch 维（q、k、v 变成 `[t, heads, head_dim]`），把 `cu_seqlens` 交给 `apply_rotary_pos_emb`
# （[attention.py 第 1483–1491 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1483-L1491)），
# 后者走 `_apply_rotary_pos_emb_thd`：**每段都从 RoPE 表的第 0 行起**。
# GPU 上 core attention 是 `TEDotProductAttention`，它把 `PackedSeqParams` 的字段原样交给 TE
# （[`transformer_engine.py:2012`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L2012)），
# THD 时把 `causal` 换成 `padding_causal`（[transformer_engine.py 第 2036–2041 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L2036-L2041)），
# kernel 只在每段内部做因果 attention。把这一步换成同样的段内计算，模型的其余部分照旧：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def same(a, b):
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.allclose(a, b, atol=1e-6)


got = packed_out["core_attention_got"]
print("core attention 收到: query", got["query"], " attention_mask", got["attention_mask"], " attn_mask_type",
      got["attn_mask_type"], " cu_seqlens_q", got["cu_seqlens_q"], " max_seqlen_q", got["max_seqlen_q"])
print("packed 每 token loss    :", [round(x, 4) for x in packed_out["packed"][0].tolist()])
print("各文档分开跑            :", [round(x, 4) for x in packed_out["separate"][0].tolist()])
print("当作一条因果序列跑      :", [round(x, 4) for x in packed_out["one causal sequence"][0].tolist()])
print("packed == 分开跑:", same(packed_out["packed"], packed_out["separate"]),
      " packed == 一条序列:", same(packed_out["packed"], packed_out["one causal sequence"]),
      " max_seqlen 放大到 8 仍相同:", same(packed_out["max_seqlen 8"], packed_out["packed"]))
print("max_seqlen 比最长段小 1:", where(packed_out["max_seqlen too small"]))
print("cu_seqlens 形状 [1, n]:", where(packed_out["cu_seqlens [1, n]"]))

# %% [markdown]
# `cu_seqlens` 让 packed batch 与"每篇文档单独跑"逐 token 相同：RoPE 每段从 0 起（Megatron 做），attention 不跨段（TE 做）。
# "块对角 mask + 重置位置"在 RoPE 模型上做不到这一点，因为 `position_ids` 没人读。`max_seqlen` 不改变结果，只定 RoPE 表长
# （和 TE kernel 的分块），但不能小于最长的一段，否则这一段切不满表的行（3 个 token 只拿到 2 行）。放大到总长 8 时每段按自己的起点取行
# （[`rope_utils.py:225`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L225)），
# RoPE 只看相对位置，结果仍相同。最后一行是坑 4。
#
# ### 续训：跳过已消费的样本
#
# 数据进度只有一个整数：`train` 每步把 `dp × micro_batch_size × num_microbatches` 加到 `args.consumed_train_samples`
# （[`training.py:3942`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3942)）；
# `save_checkpoint` 把整个 `args` 存进 checkpoint（[`checkpointing.py:1311`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L1311)），
# `load_checkpoint` 取回它（[checkpointing.py 第 2499 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2499)），
# `MegatronPretrainingSampler` 从这个下标接着切块；索引表由 seed 和 sizes 重建。4 个 rank 先以 DP=2 读 4 步，再像重启那样只留
# 第 2 步后的 `consumed_train_samples`，以 DP=2、4、1 重读第 3、4 步，global batch 固定为 4（`rN` 是 DP rank）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TINY = EXPERIMENTS["data-topic"].tiny
PAR = Parallel(world=4, tp=2)
resume = run_ranks(run, 4, TINY, PAR, grid=dict(tp=2))
print(consumed_line(resume))
resume_table(resume)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
for name, value in checks(resume).items():
    print(f"{name}:", value)

# %% [markdown]
# sampler 的下标是顺序的（第 `k` 步就是 `[4k, 4k+4)`），随机性全在 `shuffle_index` 里。`consumed_train_samples` 以**样本**计、
# 与 DP 无关，换 DP 续训时每步的 global batch 仍是同一组样本，前提是 global batch、seed、语料和 sizes 不变。
# 重启后建数据集时唯一的通信是 builder 的 world barrier（rank 0 先建索引、写缓存，其余 rank 随后读缓存）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
build_table(resume)

# %% [markdown]
# > **0.19.0 新增：** 设了 `--phase-transition-iterations` 时，loader 从"本阶段已消费的样本"读起，而不是 `consumed_train_samples`
# > （[`training.py:4569`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4569)）。

# %% [markdown]
# ## 机制解释
#
# **随机性只在一个地方。** `GPTDataset` 用 `numpy.random.RandomState(seed)` 依次打乱文档与样本，写成 `.npy` 缓存；blend 的交错、
# sampler 的切块、DP 的分配都是确定的算术（缺省的 `--dataloader-type single`）。所以样本序列只取决于 seed、语料、split 与 sizes，
# 与并行方式无关，续训只需记住"走到第几个样本"。代价是 sizes 成了序列的一部分：改训练长度就是换序列。
#
# **blend 是误差扩散。** 每一步补给最落后的语料，比例逐前缀贴着权重走，而不是只在期望上等于权重，所以一个只有几个样本的
# global batch 也不会偏向某个语料。两个语料时偏差不到 1 个样本；K 个语料时没有语料领先满 1 个样本，但可以落后到 `K − 2 + w`。
#
# **字段各有读者，`get_batch` 照此分发。** `tokens` 去词嵌入（首 stage），`labels` 去 loss（尾 stage），`attention_mask` 去每层
# attention，`position_ids` 只给 learned 位置嵌入，`loss_mask` 留在模型外的 `loss_func`。首 stage 有嵌入、尾 stage 有 loss、
# 中间 stage 两者都没有，所以按 stage 只广播一部分字段。
#
# **packed 换了一种 attention 描述。** 稠密的 `[b, 1, s, s]` mask 被两个小张量代替：`cu_seqlens` 说段在哪，`max_seqlen` 说最长一段多长；
# RoPE 与 attention 都按段重新开始。

# %% [markdown]
# ## 与训练主链路的关系
#
# 数据在 `pretrain` 里只建一次，此后每个 micro-batch 在 `forward_step` 里 `get_batch` 一次，每步结束 `consumed_train_samples`
# 加一个 global batch。checkpoint 里关于数据进度的全部内容就是 `args` 里的这个数（与 `consumed_valid_samples`）；索引是缓存，
# 不是状态（checkpoint 的其余内容见[笔记 21](../21_checkpoint_topic/)）。simple loop 用普通的 `DataLoader(shuffle=True)`，
# 没有 consumed 计数，续训回不到同一个数据位置（[笔记 01](../01_training_run_overview/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **按 epoch 无放回**：每个 epoch 每篇文档恰好出现一次，样本再整体打乱；要的样本超过一个 epoch 时重复整 epoch。
# - **误差扩散 / 最大余数法**：blend 的贪心交错与把比例分配成整数席位是同一类算法。
# - **可复现的数据顺序**：把数据状态压缩成一个偏移量，前提是整条序列是 (seed, 配置) 的确定函数。
# - **varlen attention**：`cu_seqlens` 与 FlashAttention 的 `flash_attn_varlen_func` 是同一种表示；RoPE 的位置也要按段重置。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **`get_blend_from_list` 的一致性检查只看一半**：`a 0.3 0.7 b` 被拒绝，`0.5 a b c` 却被静默当成 4 个无权重的前缀（`--data-path` 那张表）。
# 2. **RoPE 忽略 `position_ids`**：倒序后输出不变，`--reset-position-ids` 只对 learned_absolute 有效
#    （上游 [issue #453](https://github.com/NVIDIA/Megatron-LM/issues/453)）。packed 格式不受影响。
# 3. **中间 pipeline stage 收不到 `attention_mask`**：用 `--reset-attention-mask` 时中间 stage 跨文档 attention。
#    TE 的 attention 在 `causal` 类型下本来就不看 mask（TE 的约定，本机无 TE，未验证）；要隔开文档，用 packed 格式。
# 4. **`cu_seqlens` 必须是一维的。** batch 里的 `cu_seqlens` 是 `(1, N)`（[`utils.py:2597`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2597)），
#    `forward_step` 造 `PackedSeqParams` 之前才 squeeze；自己写 `forward_step` 漏了这一步，非融合的 RoPE THD 路径在按段切分处失败
#    （packed 一节最后一行，[`rope_utils.py:223`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L223)）。
#
# > **旧版（core_v0.18.0）：** 正式入口取 `cu_seqlens[0]`（[`pretrain_gpt.py:216`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/pretrain_gpt.py#L216)），
# > 同样是一维。core_v0.16.1 没有这一步，二维张量原样进了 `PackedSeqParams`，非融合 RoPE 因此失败。
#
# 5. **续训改 `--train-iters` / `--train-samples` 会换数据顺序**，`consumed_train_samples` 却仍按旧序列的偏移跳过：多 epoch 的小语料上
#    会重复一些样本、漏掉另一些（`--train-iters` 那张表）。
# 6. **blend 的顶层 size 比要求多**（16 → 17）：训练只取前 `train_iters × gbs` 个，无害，但 `len()` 不是你要的数。
# 7. **`IndexedDataset` 的数组活不过它的对象**：`sequence_lengths` 是 mmap 上的视图，`_IndexReader.__del__` 会关掉 mmap
#    （[`indexed_dataset.py:332`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py#L332)），
#    所以 `IndexedDataset(prefix).sequence_lengths.tolist()` 让进程被 SIGSEGV 杀死，没有 Python 异常：

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
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **`attention_mask=None` 在 CPU 上失败。** local attention 的缺省因果 mask 写死了 `device="cuda"`
#   （[`utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39)），所以"字段改动"表里那一行
#   是 CUDA 的报错，PP 表里中间 stage 也在这一行失败（GPU 上它静默成功）。为了让 schedule 跑完，PP 运行的 `forward_step` 在 mask 为
#   `None` 时补上同一个因果 mask。
# - **THD attention。** CPU 上没有 TE，`snippets/data/thd_attention.py` 的 `ThdCoreAttention` 坐到 core attention 的位置做"段内因果"计算
#   （`tests/ranks/test_thd_attention.py` 把它和 Megatron 自己的 `DotProductAttention` 加块对角 mask 的结果比过）；embedding、
#   RoPE 的 THD 路径、线性层、loss 都是真实的 Megatron。
# - **`RotaryEmbedding` 要 `use_cpu_initialization=True`**，否则构造时就问 CUDA 设备。
# - **`megatron/training` 的函数**（`get_train_valid_test_num_samples`、sampler）读全局 args，照 tag 重写成接收参数，见"本页怎么跑出来的"。
# - **`IndexedDataset` 的 "Could not determine rank" 警告**（没有 `torch.distributed` 时）被 `snippets` 的已知警告过滤静音。
# - 坑 7 的 SIGSEGV 是在一个单独的 rank 进程里重现的，笔记进程把两个 `IndexedDataset` 对象留在变量里。
#
# </details>

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
# **5. `--data-path a` 和 `--data-path 1.0 a` 建出的 train 一样吗？**
#
# <details><summary>答案</summary>
#
# 不一样。只有"一个前缀且没有权重"才直接得到 `GPTDataset`（18 个样本）；写了权重就走 blend 那条路，顶层是只有一个成员的
# `BlendedDataset`，长度是 ceil(16 × 1.0) = 16，里面的 `GPTDataset` 按 16 × 1.005 向上取整要样本，照样建满 3 个 epoch、18 个。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(type(train).__name__, len(train), "|", type(weighted).__name__, len(weighted), weighted.datasets[0].num_samples,
      len(weighted.datasets[0]))

# %% [markdown]
# ## 30-second answer
#
# Args are copied into `GPTDatasetConfig`; split sizes follow from train and eval iterations. The builder cuts documents by
# `--split`; each `GPTDataset` shuffles documents, then samples, over whole epochs with one seed, so changing the sizes changes
# the order. `BlendedDataset` interleaves greedily: two corpora stay within one sample of their weights, but with K corpora one
# can lag by up to K − 2 + w. The model reads tokens, mask and labels; `loss_mask` only enters `loss_func`, RoPE ignores
# `position_ids`, middle pipeline stages get no fields. Packed batches restart RoPE per segment and need TE attention.
# Resuming skips `consumed_train_samples`, at any DP size.
