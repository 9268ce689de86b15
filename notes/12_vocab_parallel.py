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
# # 12 词表并行：VocabParallelEmbedding 与 vocab_parallel_cross_entropy
#
# 模型两头都有词表：开头的 embedding 是 `[V, h]` 的表，结尾的 output layer 产生 `[s, b, V]` 的 logits。Qwen3 的 V 约 15 万，
# 一张表就有 6 亿参数。开 TP 时，Megatron 怎么把词表切给各卡？两头各要几次通信？为什么完整的 `[s, b, V]` 从不出现在
# 一张卡上？开 label smoothing、或关掉 `parallel_output` 时又会算错什么？

# %% [markdown]
# ## 阅读目标
#
# 1. 每个 TP rank 管哪一段词表，为什么要把词表 pad 到 `128·TP` 的倍数。
# 2. `VocabParallelEmbedding`：越界 token 怎么处理，为什么一次 all-reduce 就得到完整的 embedding，backward 为什么不通信。
# 3. `vocab_parallel_cross_entropy`：3 次 `[s, b]` 的 all-reduce 怎样拼出完整词表上的交叉熵，backward 为什么不通信。
# 4. label smoothing 在 TP>1 时算的是什么；`GPTModel` 的 `parallel_output` 为什么必须为真才能算 loss。
#
# **结论**
#
# - **词表按 TP 连续切段**，正式入口把 V pad 到 `128·TP` 的倍数：Qwen3 的 151,936 在 TP=2 时成 152,064（每卡 76,032 行）。
# - **embedding**：token 只在一张卡上查得到，其余卡给 0，forward 一次 all-reduce `[2, 4, 6]`；SP 时换成 reduce-scatter。
# - **交叉熵**：forward 3 次 all-reduce（MAX、SUM、SUM），每次 `[s, b]` = `[4, 2]`，与 V 无关；backward 不通信。
# - **融合版**只发 2 次 all-reduce，梯度却写死成 bf16：fp32 下与稠密梯度差 0.0017。
# - **坑**：label smoothing 在 TP=2 时只对本卡的词表段平均，loss 成了 4.6366 / 4.601（应为 4.6214）；`parallel_output=False` 多出 `log TP` = 0.6931。
#
# 先读：[笔记 10](../10_column_row_parallel_linear/)（`ColumnParallelLinear`）、[笔记 05](../05_forward_loss_backward/)（loss 在 step 里的位置）；约 18 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n12_vocab import (ALPHA, ce_comm_table, ce_inputs, cross_entropy_run, embedding_comm_table,
                                        embedding_run)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.site.sources import installed_root
from snippets.record.tables import Table
from snippets.tp import pictures
from snippets.tp.vocab_parallel import smoothed_loss, smoothed_loss_on_rank

import math
import re
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy
from megatron.core.tensor_parallel.utils import VocabUtility
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

TINY = EXPERIMENTS["vocab"].tiny
V, H, S, B = TINY.vocab, TINY.hidden, TINY.seq, TINY.micro_batch_size
emb = {tp: run_ranks(embedding_run, tp, TINY, tp, grid=dict(tp=tp)) for tp in (2, 4)}
logits, target, weight = ce_inputs(TINY)
ce = {tp: run_ranks(cross_entropy_run, tp, TINY, tp, grid=dict(tp=tp)) for tp in (1, 2, 4)}
pictures.draw_vocab(V, {tp: [r[False]["range"] for r in ranks] for tp, ranks in emb.items()},
                    ce_comm_table(ce[2][0][0.0]["calls"]).rows, ce[2][0][0.0]["local_shape"])

# %% [markdown]
# 上：运行里 `VocabParallelEmbedding` 报出的各卡词表段；下：TP=2 时交叉熵 forward 的三次 all-reduce。
#
# <details><summary>本页怎么跑出来的</summary>
#
# 页面上的每个数都来自在本机 gloo rank（CPU 进程）上跑的真实 Megatron Core 0.19.0。实验在
# `snippets/experiments/n12_vocab.py`（源码在这个框下面的折叠块里）：`embedding_run` 在每个 rank 上建两个 `VocabParallelEmbedding`（直接 all-reduce，
# 和 `reduce_scatter_embeddings=True`），查表并 backward；`cross_entropy_run` 把同一份 `[s, b, V]` logits 的本卡一段交给
# `vocab_parallel_cross_entropy`（不开 / 开 label smoothing 0.1，传入 TP 群，和 `GPTModel` 的写法一样）和融合版。
# 通信由 `snippets.record` 的记录器在 `torch.distributed` 上截下，表里的 phase 和"issued by"就是它填的。
# 尺寸是实验的 `tiny`：V=16、h=6、s=4、b=2；稠密参照（`F.embedding`、`F.cross_entropy`）在 notebook 进程里算。
# label smoothing 的两个参照在 `snippets/tp/vocab_parallel.py`：`smoothed_loss`（源码注释写的目标分布）和
# `smoothed_loss_on_rank`（把本卡一段当整个词表的算法）。
#
# 自己重跑：
#
# ```bash
# .venv/bin/python -m snippets.run --nproc-per-node 2 vocab --tp 2           # 本页的两张通信表
# .venv/bin/python -m snippets.run --nproc-per-node 8 vocab --dims qwen3-8b --tp 8   # Qwen3 的 151,936 个 token（8 的倍数，不用 pad）
# scripts/execute_notes.sh notes/12_vocab_parallel.py                           # 重新执行整页
# ```
#
# CPU 上要做的事（融合版的 `torch.compile` 改成 eager，等等）见[在 CPU 上运行](../../cpu/)和"遗留问题"最后的折叠块。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(embedding_run, ce_inputs, cross_entropy_run)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`utils.py::VocabUtility.vocab_range_from_global_vocab_size`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/utils.py#L114) | 全局 V → 本卡 `range(start, end)`，要求 V 被 TP 整除 |
# | [`build_tokenizer.py::vocab_size_with_padding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L124) | 正式入口建 tokenizer 时调用：V 向上取整到 `make_vocab_size_divisible_by · TP` |
# | [`layers.py::VocabParallelEmbedding.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L245) | 本卡 weight `[V/TP, h]` |
# | [`layers.py::VocabParallelEmbedding.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L330) | mask → 查表 → 清零 → all-reduce / reduce-scatter |
# | [`cross_entropy.py::vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L213) | 入口：`[s, b, V/TP]` 的 logits、`[s, b]` 的 label、`tp_group` |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L121) | 3 次 all-reduce；label smoothing 分支 |
#
# <details><summary>其余符号（10 个）</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`utils.py::VocabUtility.vocab_range_from_per_partition_vocab_size`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/utils.py#L105) | 本卡宽度 → `range(rank·w, (rank+1)·w)`（交叉熵用它） |
# | [`mappings.py::reduce_from_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L498) | forward all-reduce，backward 原样 |
# | [`mappings.py::reduce_scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L536) | SP：forward reduce-scatter，backward all-gather |
# | [`language_model_embedding.py::LanguageModelEmbedding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L14) | GPT 的 embedding：决定要不要 `reduce_scatter_embeddings`，`[b, s, h] → [s, b, h]` |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L186) | softmax − one-hot，只在本卡 |
# | [`fused_cross_entropy.py::fused_vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fusions/fused_cross_entropy.py#L136) | `cross_entropy_loss_fusion` 时用的版本 |
# | [`cross_entropy.py::VocabParallelCrossEntropy.calculate_predicted_logits`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L32) | 本卡的 target logit（不归本卡的置 0）和 Σexp |
# | [`gpt_model.py::GPTModel._postprocess`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L620) | output layer → 有 label 就算 loss |
# | [`language_module.py::LanguageModule.compute_language_model_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L155) | GPT 的 loss：选融合或非融合版本 |
# | [`build_tokenizer.py:143`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L143) | 建 tokenizer 时把 pad 后的 V 写进 `args.padded_vocab_size` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# ```text
# models/gpt/gpt_model.py::GPTModel.forward
# ├─ language_model_embedding.py::LanguageModelEmbedding.forward                 # tokens [b, s]
# │  └─ layers.py::VocabParallelEmbedding.forward                               # 本卡 weight [V/TP, h]
# │     ├─ 越界 token → 下标 0，查表，再清零                                      # 本地
# │     ├─ mappings.py::reduce_from_tensor_model_parallel_region                 # fwd all-reduce [b, s, h]
# │     └─ 或（SP）mappings.py::reduce_scatter_to_sequence_parallel_region       # fwd reduce-scatter；bwd all-gather
# ├─ decoder（笔记 11）
# └─ _postprocess
#    ├─ output_layer  ColumnParallelLinear(h, V, gather_output=not parallel_output)   # logits [s, b, V/TP]
#    └─ language_module.py::LanguageModule.compute_language_model_loss
#       └─ cross_entropy.py::vocab_parallel_cross_entropy(..., tp_group=self.tp_group)
#          ├─ _VocabParallelCrossEntropy.forward
#          │  ├─ all_reduce(MAX)  logit 最大值                                       # [s, b]
#          │  ├─ all_reduce(SUM)  target 的 logit                                   # [s, b]
#          │  └─ all_reduce(SUM)  Σ exp(logit − max)                                 # [s, b]
#          └─ _VocabParallelCrossEntropy.backward                                   # 本地，不通信
# ```
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `VocabUtility.vocab_range_from_global_vocab_size` | V、rank、TP | `range(start, end)` | `divide` | 否（纯算术） | 决定词表怎么切 | 否 | 建模型 |
# | `VocabParallelEmbedding.__init__` | V、h、config | 本卡 weight `[V/TP, h]` | `VocabUtility`、`_initialize_affine_weight_cpu` | 读 TP 群的 rank/size | 是：按词表维切 weight | 建参数 | 建模型 |
# | `VocabParallelEmbedding.forward` | token id `[b, s]` | `[b, s, h]`（SP：`[s/TP, b, h]`） | `reduce_from_...` 或 `reduce_scatter_to_sequence_parallel_region` | TP 群 | weight 按词表切；SP 时输出按 s 切 | 否 | `forward_step` |
# | `vocab_parallel_cross_entropy` | 见[笔记 05 的记录](../05_forward_loss_backward/)；另有 `label_smoothing` | 每 token 的 loss `[s, b]`（各卡相同——不开 smoothing 时） | `VocabParallelCrossEntropy`、`VocabUtility` | 传入的 `tp_group`（缺省全局 TP 群）3 次 all-reduce | logits 按词表切 | 否 | `loss_func` 之前（`GPTModel` 内） |
# | `_VocabParallelCrossEntropy.backward` | `[s, b]` 的上游梯度 | 本卡 logits 的梯度 `[s, b, V/TP]` | 无 | 否 | 同上 | 否 | `backward` |
# | `LanguageModule.compute_language_model_loss` | label `[b, s]`、logits | loss `[b, s]` | 上面两种交叉熵之一 | 间接 | 否 | 否 | `forward_step` |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 每卡管哪一段词表
#
# `VocabUtility` 是纯算术：本卡宽度 `V/TP`，rank r 管 `range(r·V/TP, (r+1)·V/TP)`，连续的一段。V 必须能被 TP 整除，
# 所以正式入口先把 tokenizer 的词表向上取整到 `make_vocab_size_divisible_by · TP` 的倍数
# （[`arguments.py:2358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2358) 缺省 128）。
# 做这件事的 [`build_tokenizer.py::vocab_size_with_padding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L124) 在
# `megatron/core` 里，建 tokenizer 时由 [`build_tokenizer.py:143`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L143)
# 调用；它只读 `args` 的三项，下面直接调它。多出的"假 token"是永远不会出现的类别。

# %%
def megatron_padded(vocab, tp):  # 正式入口的 args 里它只读这三项
    args = SimpleNamespace(make_vocab_size_divisible_by=128, tensor_model_parallel_size=tp, rank=0)
    return vocab_size_with_padding(vocab, args, logging_enabled=False)


QWEN3_VOCAB = 151936   # Qwen3 tokenizer 的 vocab_size
rows = []
for name, vocab, tp in (("本页", 16, 2), ("本页", 16, 4), ("Qwen3-8B", megatron_padded(QWEN3_VOCAB, 2), 2),
                        ("Qwen3-8B", megatron_padded(QWEN3_VOCAB, 8), 8)):
    ranges = [VocabUtility.vocab_range_from_global_vocab_size(vocab, r, tp) for r in range(tp)]
    rows.append([name, vocab, tp, ranges[0][1] - ranges[0][0], ranges[:2] + (["…"] if tp > 2 else [])])
Table(["", "V（pad 之后）", "TP", "每卡宽度", "各卡 range(start, end)"], rows)

# %% [markdown]
# Qwen3 在 TP=2 时多 pad 128 个。hidden 4096 时每卡的 embedding 表是 76,032 × 4096 ≈ 311M 个参数——
# 比笔记 11 里一整层每卡的 96M 还大三倍，这就是为什么词表也要切。
#
# ### `VocabParallelEmbedding`：每卡一段表
#
# 在 2 张、4 张卡上各建一个真实的 `VocabParallelEmbedding(V=16, h=6)`，问每卡拿到了什么：

# %%
def build_embedding(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
    emb = VocabParallelEmbedding(V, H, init_method=torch.nn.init.normal_, config=config)
    return list(emb.weight.shape), (emb.vocab_start_index, emb.vocab_end_index)


Table(["TP", "rank", "本卡 weight", "本卡词表段"],
      [[tp, rank, *got] for tp in (2, 4) for rank, got in enumerate(run_ranks(build_embedding, tp, tp, grid=dict(tp=tp)))])

# %% [markdown]
# 每卡只存 `[V/TP, h]`，段和 `VocabUtility` 算的一样。运行里用同一个种子再建两次——一次直接 all-reduce，一次
# `reduce_scatter_embeddings=True`（SP 的走法，输出按 s 切）——查表 `[b, s] = [2, 4]` 的 token 并 backward，
# 输出和 weight 的梯度都等于把各卡的表拼起来后的稠密 `F.embedding`（TP=2、4 各两种走法，下一格只打一行）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def dense_embedding(tokens, full, sp):
    weight = full.clone().requires_grad_()
    y = F.embedding(tokens, weight)
    y = y.transpose(0, 1) if sp else y                     # SP 的输出是 [s, b, h]，再按 s 切
    y.pow(2).sum().backward()
    return y.detach(), weight.grad


same = []
for tp, ranks in emb.items():
    for sp in (False, True):
        y, grad = dense_embedding(ranks[0]["tokens"], ranks[0]["full"], sp)
        got = torch.cat([r[sp]["y"] for r in ranks]) if sp else ranks[0][sp]["y"]
        same.append(torch.allclose(got, y, atol=1e-6)
                    and torch.allclose(torch.cat([r[sp]["grad"] for r in ranks]), grad, atol=1e-5))
print(f"输出和梯度 = 稠密 F.embedding：{sum(same)} / {len(same)} 种配置（TP=2、4 × 不开 / 开 reduce-scatter）")

# %% [markdown]
# ### `vocab_parallel_cross_entropy`：每卡一段 logits
#
# logits `[s, b, V] = [4, 2, 16]` 在每卡上相同（固定种子），每卡取自己那一段 `[4, 2, V/TP]` 交给真实的
# `vocab_parallel_cross_entropy`，和 `GPTModel` 一样把 TP 群传进去：

# %%
def cross_entropy_on_rank(tp, label_smoothing=0.0):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    local = logits.chunk(tp, dim=-1)[rank].clone()                       # 本卡 [s, b, V/TP]
    return vocab_parallel_cross_entropy(local, target, label_smoothing,
                                        tp_group=parallel_state.get_tensor_model_parallel_group())


def torch_ce(x, smoothing=0.0):
    return F.cross_entropy(x.reshape(-1, V), target.reshape(-1), reduction="none",
                           label_smoothing=smoothing).view(S, B)


losses = run_ranks(cross_entropy_on_rank, 2, 2, grid=dict(tp=2))
print("每卡 loss 的 shape:", [list(l.shape) for l in losses],
      "| 两卡相同且 = F.cross_entropy:", all(torch.allclose(l, torch_ce(logits), atol=1e-5) for l in losses))

# %% [markdown]
# 每卡拿到的是**完整的**逐 token loss `[s, b]`，而且各卡一样。运行里还在 TP=1、2、4 上对 loss 乘一个随机权重再 backward：
# 各卡 loss 都等于 `F.cross_entropy`，各卡的梯度沿词表维拼起来等于稠密梯度，通信都是 forward 3 次、backward 0 次
# （TP=1 时 3 次 all-reduce 也照样发出，只是群里只有自己）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def dense_grad(loss_fn):
    x = logits.clone().requires_grad_()
    loss = loss_fn(x)
    (loss * weight).sum().backward()
    return loss.detach(), x.grad


ref_loss, ref_grad = dense_grad(torch_ce)
ok = {tp: all(torch.allclose(r[0.0]["loss"], ref_loss, atol=1e-5) for r in ranks)
      and torch.allclose(torch.cat([r[0.0]["grad"] for r in ranks], dim=-1), ref_grad, atol=1e-6) for tp, ranks in ce.items()}
counts = {tp: (sum(c.phase == "forward" for c in ranks[0][0.0]["calls"]),
               sum(c.phase == "backward" for c in ranks[0][0.0]["calls"])) for tp, ranks in ce.items()}
print("loss 与拼起来的梯度 = 稠密:", ok, "| 通信次数 (forward, backward):", counts)

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 全部通信都在 TP 群里。embedding（TP=2，rank 0）：不开 SP 时 forward 一次 all-reduce `[b, s, h]`，backward 不通信；
# `reduce_scatter_embeddings=True` 时 forward 是 reduce-scatter（顺带把 `[b, s, h]` 转成 `[s, b, h]` 再按 s 切），backward 是 all-gather，
# 由 `_gather_along_first_dim` 在 autograd 里发出：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
embedding_comm_table(emb[2][0])

# %% [markdown]
# 交叉熵（TP=2，rank 0）：forward 3 次 all-reduce，每次都是 `[s, b]`——和 V 无关；backward 没有通信。页首的图就是这三行。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ce_comm_table(ce[2][0][0.0]["calls"])

# %% [markdown]
# 两种做法的通信量（每个 token）：先拼出完整 logits 要 all-gather `V` 个数；vocab-parallel 交叉熵只 all-reduce 3 个数。
# Qwen3 的 V≈15 万，差 5 万倍，而且完整的 `[s, b, V]` 从未在一张卡上出现。
#
# **融合版**（`cross_entropy_loss_fusion=True` 时 `compute_language_model_loss` 用它）把 target logit 和 Σexp 拼成一个张量，
# 只发 2 次 all-reduce（第二次是 `[2s, b]`）；它不支持 label smoothing。同一组输入：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
fused = ce[2]
print("融合版每卡 loss = F.cross_entropy:", all(torch.allclose(r["fused"]["loss"], ref_loss, atol=1e-5) for r in fused))
print("通信:", [(c.phase, c.api, c.before) for c in fused[0]["fused"]["calls"]])
fused_grad = torch.cat([r["fused"]["grad"] for r in fused], dim=-1)
print("梯度 dtype:", fused_grad.dtype, " 与 fp32 稠密梯度的最大差:", round((fused_grad - ref_grad).abs().max().item(), 4),
      " = 稠密梯度舍入到 bf16:", torch.allclose(fused_grad, ref_grad.bfloat16().float(), atol=1e-6))

# %% [markdown]
# 融合版的梯度被**截到了 bf16**：`calculate_gradients` 最后无条件 `.to(torch.bfloat16)`
# （[`fused_cross_entropy.py:82`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fusions/fused_cross_entropy.py#L82)），
# autograd 再把它转回输入的 fp32。用 bf16 训练时无所谓；用 fp32 logits 时，这一步悄悄丢了精度（坑 3）。

# %% [markdown]
# ## 机制解释
#
# **embedding：每个 token 只有一张卡查得到。** 本卡先把不属于自己的 token 记成掩码，下标改成 0 去查表
# （[`layers.py:341`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L341)），
# 查完再把这些位置清零（[`layers.py:359`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L359)）。
# 于是对每个 token，恰好一张卡给出它的向量，其余给 0，all-reduce（求和）就是完整的 embedding。
# backward：`reduce_from_tensor_model_parallel_region` 的 backward 原样传梯度，每卡拿到完整的 `[b, s, h]` 梯度，
# 但 embedding 的 backward 只会往本卡的行里累加——被清零的位置梯度也是 0，所以不会错加到第 0 行。不需要通信。
#
# **交叉熵：把 log-sum-exp 拆成三个 `[s, b]` 的归约。** 对每个 token，`loss = log Σ_j exp(z_j) − z_target`。
# 先 all-reduce(MAX) 得到全局最大值 m，各卡算 `exp(z − m)` 的本地和，再 all-reduce(SUM) 得全局和；
# target 的 logit 只在拥有它的卡上非 0，all-reduce(SUM) 之后每卡都有。`_VocabParallelCrossEntropy.forward` 把每一步交给
# `VocabParallelCrossEntropy` 的静态方法，三次 all-reduce 夹在它们中间。下一格在一个进程里对两段 logits 依次调这些静态方法，
# 用 `max` / `sum` 代替 all-reduce，看清三个数各是什么：

# %%
shards = [z.clone() for z in logits.chunk(2, dim=-1)]                  # TP=2：rank 0、rank 1 的 [s, b, 8]
maxes = [VocabParallelCrossEntropy.calculate_logits_max(z)[1] for z in shards]
m = torch.stack(maxes).amax(0)                                          # ← all-reduce(MAX)
parts = [VocabParallelCrossEntropy.calculate_predicted_logits(
             z, target, m, *VocabUtility.vocab_range_from_per_partition_vocab_size(V // 2, rank, 2))
         for rank, z in enumerate(shards)]
predicted = sum(p[2] for p in parts)                                    # ← all-reduce(SUM)
sum_exp = sum(p[3] for p in parts)                                      # ← all-reduce(SUM)
softmax = [VocabParallelCrossEntropy.calculate_cross_entropy_loss(p[4], predicted, sum_exp)[0] for p in parts]
loss = torch.log(sum_exp) - predicted
print("三个归约的 shape:", list(m.shape), list(predicted.shape), list(sum_exp.shape))
print("各卡拥有 target 的 token 数:", [int((~p[0]).sum()) for p in parts], "（共 s·b =", S * B, "）")
print("loss = F.cross_entropy:", torch.allclose(loss, torch_ce(logits), atol=1e-5),
      "| 两段 softmax 拼起来 = 全局 softmax:", torch.allclose(torch.cat(softmax, -1), torch.softmax(logits, -1), atol=1e-6))

# %% [markdown]
# 每卡把 `exp(z − m)` 除以**全局**的和，得到的正是全局 softmax 的本卡一段。梯度 `softmax − one-hot` 逐元素、只看本卡的列，
# 所以 backward 没有通信：label 不在本卡的 token，one-hot 那一项本卡不减（`softmax_update` 为 0）。用同样的静态方法在每一段上
# 各算一遍梯度，拼起来就是稠密梯度：

# %%
grads = []
for (target_mask, masked_target_1d, *_), p in zip(parts, softmax):
    grad_2d, arange_1d, softmax_update, grad_input = \
        VocabParallelCrossEntropy.prepare_gradient_calculation_operands(p, target_mask)
    grads.append(VocabParallelCrossEntropy.calculate_gradients(
        grad_2d, arange_1d, masked_target_1d, softmax_update, grad_input, weight))
print("各段本地算的梯度拼起来 = 稠密梯度:", torch.allclose(torch.cat(grads, -1), ref_grad, atol=1e-6))

# %% [markdown]
# 三次 all-reduce 在哪个群里做，由 `vocab_parallel_cross_entropy` 的 `tp_group` 参数决定
# （[`cross_entropy.py::vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L213)；不传时退回全局 TP 群，
# [`cross_entropy.py:124`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L124)）。GPT 的 loss 把模型自己的 TP 群传进去
# （[`language_module.py:194`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194)），和 output layer 用的是同一个群。
# 本卡的词表段也按这个群的 rank 和大小算（`vocab_range_from_per_partition_vocab_size`）。
#
# > **旧版（core_v0.18.0）：** `vocab_parallel_cross_entropy(logits, target, label_smoothing)` 没有 `tp_group` 参数，三次 all-reduce
# > 总在 `parallel_state` 的全局 TP 群里做，GPT 的 loss 也只传 logits 和 label
# > （[`language_module.py:183`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/models/common/language_module/language_module.py#L183)）；按 0.19.0 的写法传 `tp_group=` 会报 `TypeError`。
#
# **为什么 embedding 和 output layer 的切法一致。** output layer 是 `ColumnParallelLinear(h, V)`，按输出维连续切，rank r 管第
# `r·V/TP` 到 `(r+1)·V/TP` 行——和 `VocabUtility` 给 embedding 的范围相同。所以共享 embedding 和 output weight 时，两者在每卡上是同一块
# `[V/TP, h]`，交叉熵要的 `[s, b, V/TP]` logits 也正好是本卡这一段词表。

# %% [markdown]
# ## 与训练主链路的关系
#
# 每个 step 的第一次和最后一次 TP 通信都在这里：embedding 一次 all-reduce（或 SP 的 reduce-scatter），loss 三次 `[s, b]` 的
# all-reduce（笔记 05 的 forward）。之后 `loss_func` 把逐 token 的 loss 乘 `loss_mask` 求和。共享 embedding 且 PP>1 时，
# 首尾两个 stage 各有一份 `[V/TP, h]`，梯度在 embedding 群里 all-reduce（笔记 08、`finalize_model_grads`）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **log-sum-exp 的数值稳定写法**：先减最大值。分布式版本只是把"最大值"和"求和"各换成一次 all-reduce。
# - **softmax 交叉熵对 logits 的梯度**是 `softmax − one-hot`：逐元素，能在任何切分下本地算——前提是 softmax 已全局归一化。
# - **label smoothing**：把 one-hot 目标换成"label 上大部分、其余均摊一点"。均摊给 K 个还是 K−1 个类是两种常见定义，差一个 `K/(K−1)` 的系数。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. label smoothing 在 TP>1 时是 bug，不是定义。** 同一个 `cross_entropy_on_rank` 开 `label_smoothing=0.1`，在 TP=1、2、4 上跑，
# 和 PyTorch 的 `label_smoothing=0.1`、以及源码注释写明的目标分布（label 上 `1−α`，其余 `K−1` 个类各 `α/(K−1)`，K 是词表大小）比：

# %%
smoothed = {tp: run_ranks(cross_entropy_on_rank, tp, tp, ALPHA, grid=dict(tp=tp)) for tp in (1, 2, 4)}
stated = smoothed_loss(logits, target, ALPHA)                   # 源码注释写的目标分布，在整个词表上
rows = [["PyTorch F.cross_entropy(label_smoothing=0.1)", "—", round(torch_ce(logits, ALPHA).mean().item(), 4), "—"],
        ["源码注释的目标分布（整个词表）", "—", round(stated.mean().item(), 4), "—"]]
for tp, losses in smoothed.items():
    for rank, loss in enumerate(losses):
        rows.append([f"Megatron TP={tp}", rank, round(loss.mean().item(), 4),
                     torch.allclose(loss, smoothed_loss_on_rank(logits, target, ALPHA, tp, rank), atol=1e-5)])
Table(["", "rank", "平均 loss", "= 把本卡一段当整个词表"], rows)

# %% [markdown]
# TP=1 时 Megatron 等于源码注释的定义；和 PyTorch 差 0.0023 只因 PyTorch 把 α 分给**全部** K 个类、Megatron 只分给
# 其余 K−1 个，Megatron 的 α 相当于 PyTorch 的 `α·K/(K−1)`（下一格验证）。TP>1 时各 rank 的 loss 互不相同，
# 逐 token 偏差到 0.1 量级，且都被"把本卡一段词表当成整个词表"一项不差地复现。两行：`vocab_size = exp_logits.size(-1)` 是本卡宽度
# （[`cross_entropy.py:158`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L158)，
# 进入 [`cross_entropy.py:170`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L170) 的系数），
# `log_probs.mean(dim=-1)` 只对本卡一段求平均、不再 all-reduce
# （[`cross_entropy.py:175`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L175)）；
# backward 用同一个本卡宽度（[`cross_entropy.py:200`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L200)）。
# 各卡梯度拼起来不是任何统一 loss 的梯度。上游报告：[NVIDIA/Megatron-LM#737](https://github.com/NVIDIA/Megatron-LM/issues/737)
# （2024 年提出，查阅时仍开放）。0.19.0 的 Megatron Core 里没有调用方传 `label_smoothing`（下一格搜过），融合版不支持它，
# 所以正式 GPT 训练碰不到，直接调这个函数的代码会碰到。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
rescaled = torch_ce(logits, ALPHA * V / (V - 1))
print("Megatron TP=1 = PyTorch(α·K/(K−1)):", torch.allclose(smoothed[1][0], rescaled, atol=1e-5),
      " | = 源码注释的定义:", torch.allclose(smoothed[1][0], stated, atol=1e-5))
print("TP=2 两个 rank 的 loss 相同:", torch.allclose(smoothed[2][0], smoothed[2][1]))
for tp in (2, 4):
    print(f"TP={tp} 各 rank 与源码注释的定义逐 token 的最大差:",
          [round((loss - stated).abs().max().item(), 4) for loss in smoothed[tp]])
root = installed_root()
callers = sorted(str(p.relative_to(root)) for p in (root / "megatron" / "core").rglob("*.py")
                 if "label_smoothing" in p.read_text())
print("megatron/core 里出现 label_smoothing 的文件:", callers)

# %% [markdown]
# **2. `parallel_output=False` 时带 label 算 loss，多出 `log(TP)`。** output layer 以 `gather_output=not parallel_output` 构造
# （[`gpt_model.py:280`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L280)），
# 每卡拿到**完整的** `[s, b, V]` logits，却照样交给 `vocab_parallel_cross_entropy`
# （[`gpt_model.py:794`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L794) →
# [`language_module.py:194`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194)）。
# Σexp 被 TP 张卡各加一遍，loss 多出 `log(TP)`；backward 的 softmax 也小了 TP 倍，梯度跟着错。真实的小 `GPTModel`（fp32）：

# %% tags=["hide-input"]
def gpt_loss(tp):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, use_cpu_initialization=True,
                               tensor_model_parallel_size=tp, attention_dropout=0.0, hidden_dropout=0.0)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    position_ids, causal = torch.arange(8).expand(2, 8), torch.triu(torch.ones(1, 1, 8, 8, dtype=torch.bool), 1)
    losses, grads = {}, {}
    for parallel_output in (True, False):
        torch.manual_seed(0)
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32,
                         max_sequence_length=8, parallel_output=parallel_output)
        loss = model(tokens, position_ids, causal, labels=labels).mean()
        losses[parallel_output] = loss.item()
        try:
            loss.backward()
            grads[parallel_output] = model.decoder.final_layernorm.weight.grad
        except RuntimeError as err:
            grads[parallel_output] = f"RuntimeError: {str(err)[:60]}…"
    return losses, grads


gpt = {tp: run_ranks(gpt_loss, tp, tp, grid=dict(tp=tp))[0] for tp in (1, 2)}

# %% tags=["hide-input"] jupyter={"source_hidden": true}
rows = []
for tp, (losses, grads) in gpt.items():
    backward = grads[False]
    if isinstance(backward, torch.Tensor):
        backward = "梯度相同" if torch.allclose(grads[True], backward) else "梯度不同"
    rows.append([f"TP={tp}", losses[True], losses[False], losses[False] - losses[True], math.log(tp), backward])
Table(["", "loss（parallel_output=True）", "loss（False）", "差", "log(TP)", "False 时的 backward"], rows)

# %% [markdown]
# TP=2 时 loss 正好多 `log 2`，backward 跑完但梯度不同。TP=1 时 loss 对，backward 却报错：TP=1 的 gather 原样返回输入，
# autograd 把它当 view，而交叉熵就地改写了它（坑 5）；bf16 训练时 `.float()` 先复制一份，就不会报错（按代码推断，没有跑 bf16）。
# `parallel_output=False` 是推理要完整 logits 时用的，训练别这样配。
#
# **3. 融合交叉熵的梯度总是 bf16。** 前面的运行：fp32 logits 的梯度与稠密结果差 0.0017，正是舍入到 bf16 的误差。
# bf16 训练无妨；用 fp32 做数值对比或调试时要知道它。
#
# **4. V 必须被 TP 整除。** 模型自己不 pad，只有正式入口建 tokenizer 时 pad；直接用 Megatron Core 搭模型要自己 pad（自测 4）。
#
# **5. fp32 logits 会被就地改写。** `calculate_logits_max` 里的 `.float()` 对 fp32 张量返回它自己
# （[`cross_entropy.py:25`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L25)），
# 之后减最大值、`exp(out=...)`、除以和都就地做，backward 又在同一块内存上就地算梯度：

# %%
x = logits.clone()
print("calculate_logits_max 返回的就是输入本身:", VocabParallelCrossEntropy.calculate_logits_max(x)[0] is x)
r = ce[2][0][0.0]          # 运行里 TP=2、rank 0 的 vocab_parallel_cross_entropy
print("forward 之后，输入 logits = 本卡的 softmax:",
      torch.allclose(r["after_forward"], torch.softmax(logits, -1).chunk(2, -1)[0], atol=1e-6))
print("backward 之后，输入 logits = 它自己的梯度:", torch.equal(r["after_backward"], r["grad"]))

# %% [markdown]
# GPT 训练不再读 logits，所以无害；自己调它、之后还要用 logits（算准确率、打日志）时，先 `clone()`。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 融合版 `fused_vocab_parallel_cross_entropy` 被 `torch.compile` 包着；在 CPU rank 上实验把 `torch._dynamo` 关掉，
#   让它 eager 执行，算的是同一套公式（通信次数和 bf16 梯度都不受影响）。
# - `VocabParallelEmbedding` 和坑 2 的小 `GPTModel` 用 `use_cpu_initialization=True`：先在 CPU 上建完整的表再切给各卡。
# - 尺寸是 V=16、h=6、s=4、b=2（坑 2 的模型 V=32、h=16、s=8），都选成笔记本电脑上几秒跑完、又能逐个数对照的大小；
#   坑 2 只跑 fp32，bf16 下 TP=1 不报错是按代码推断的。
# - gloo 上的 rank 由 `snippets.ranks.launch.run_ranks` 从 notebook 进程 fork 出来，其余 CPU 适配见[在 CPU 上运行](../../cpu/)。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. Qwen3 的词表 151,936，TP=4 时 pad 成多少？rank 3 管哪一段？**
#
# <details><summary>答案</summary>
#
# 128 × 4 = 512 的倍数向上取整：152,064（正好是 297 × 512），每卡 38,016，rank 3 管 `range(114048, 152064)`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
v4 = megatron_padded(QWEN3_VOCAB, 4)
print(v4, VocabUtility.vocab_range_from_global_vocab_size(v4, 3, 4))

# %% [markdown]
# **2. TP=2 时 embedding 的 backward 发几次通信？开 SP（`reduce_scatter_embeddings=True`）呢？**
#
# <details><summary>答案</summary>
#
# 不开 SP：0 次，all-reduce 的 backward 原样传梯度。开 SP：1 次 all-gather，把按 s 切的输出梯度拼回完整 s。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({sp: [c.api for c in emb[2][0][sp]["calls"] if c.phase == "backward"] for sp in (False, True)})

# %% [markdown]
# **3. 交叉熵 forward 的 3 次 all-reduce 各用什么归约？为什么第一次不能用 SUM？**
#
# <details><summary>答案</summary>
#
# MAX、SUM、SUM。第一次要的是全局最大 logit，用来在 exp 之前减掉、防止溢出；各卡必须减**同一个**数，
# 否则各卡的 `exp(z − m)` 不在同一尺度上，加起来就不是全局的 Σexp。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
source = (root / "megatron/core/tensor_parallel/cross_entropy.py").read_text()
forward_source = source.split("def forward", 1)[1].split("def backward", 1)[0]
print("记录到:", [c.api for c in ce[2][0][0.0]["calls"]], "| forward 里依次用的归约:",
      re.findall(r"ReduceOp\.(\w+)", forward_source))

# %% [markdown]
# **4. 直接用 Megatron Core、V=50257（GPT-2 词表）、TP=2 建 `VocabParallelEmbedding` 会怎样？**
#
# <details><summary>答案</summary>
#
# 50257 是奇数，`VocabUtility` 的 `divide` 断言失败。要先 pad：按正式入口的规则 pad 到 256（= 128·2）的倍数 50432，每卡 25216。
# （常见的 50304 是 TP=1 时 128 的倍数。）
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
try:
    VocabUtility.vocab_range_from_global_vocab_size(50257, 0, 2)
except AssertionError as err:
    print("AssertionError:", err)
print(megatron_padded(50257, 2), VocabUtility.vocab_range_from_global_vocab_size(megatron_padded(50257, 2), 1, 2))

# %% [markdown]
# **5. 开 label smoothing 0.1、TP=2 时，rank 1 用的"平滑系数"是多少？TP=1 时呢？**
#
# <details><summary>答案</summary>
#
# 代码的系数是 `α·K/(K−1)`，K 取本卡宽度。TP=2、V=16 时 K=8，系数 0.1·8/7 ≈ 0.1143；TP=1 时 K=16，0.1·16/15 ≈ 0.1067。
# TP=1 的那个才是源码注释想要的。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for tp in (1, 2):
    k = V // tp
    print(f"TP={tp}: K={k}, 系数 {ALPHA * k / (k - 1):.4f}")

# %% [markdown]
# ## 30-second answer
#
# Megatron splits the vocabulary contiguously across TP ranks, so V is padded to a multiple of 128·TP.
# VocabParallelEmbedding looks up only this rank's tokens, zeroes the rest, and one all-reduce (a
# reduce-scatter under sequence parallelism) completes it; backward needs no communication.
# vocab_parallel_cross_entropy all-reduces three [s, b] tensors (max, target logit, sum of exp); its
# backward is local. Both match the dense versions, but label smoothing at TP>1 averages over the local
# shard only: a known bug.
