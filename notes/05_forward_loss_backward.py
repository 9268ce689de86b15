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
# # 05 Forward、loss、backward：一个 micro-batch 怎样变成梯度
#
# 第一轮第 5 篇。`train_step` 把一个 global batch 交给 `get_forward_backward_func()` 返回的 schedule；schedule 对每个
# micro-batch 调 `forward_step`，拿到输出和 `loss_func`，算 loss、缩放、反向。本篇在 TP=2 的两个 gloo rank 上跑一次
# **真实的** schedule（不切 pipeline），记录前向和反向发出的每一个 collective，并与 TP=1 比较 loss 和梯度；
# 再用几次运行把"loss 被谁除以什么"一项项钉死——其中有一处会悄悄改掉你日志里的 loss。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清 `forward_step` 与 `loss_func` 的契约：前者返回什么，后者返回 2 个还是 3 个值，schedule 分别怎么处理。
# 2. 说清 loss 被谁除以什么：token 数（`loss_func` 还是 schedule）、micro-batch 数（schedule）、DP 大小（DDP），
#    日志里的 `lm loss` 又是怎么算出来的。
# 3. 说清输出层：`ColumnParallelLinear`、`parallel_output=True` 时每个 rank 只有 `V/TP` 列 logits，
#    `vocab_parallel_cross_entropy` 用 3 次 all-reduce 算出与整表相同的交叉熵。
# 4. 数出一次 TP=2 前向 + 反向的全部 collective，说出每一次的 shape 与含义；TP=2 的 loss、梯度与 TP=1 相同。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 调 schedule；之后把各 micro-batch 的报告归约成日志里的 loss |
# | [`training.py:2548`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2548) | 报告为 `[sum, count]` 时：DP 上求和后 sum / count |
# | [`training.py:2551`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2551) | 报告为单个数时：对 micro-batch 取平均 |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | 取 batch、跑模型、返回 `(output, partial(loss_func, loss_mask, model=model))` |
# | [`pretrain_gpt.py::loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L209) | 返回 `(sum, num_tokens, {'lm loss': [sum, num_tokens]})` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | simple loop：`loss_func` 返回 `(mean, {'lm loss': 同一个张量})` |
# | [`schedules.py::get_forward_backward_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L48) | 按 PP / VPP 选 schedule；PP=1 是 `forward_backward_no_pipelining` |
# | [`schedules.py::forward_backward_no_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L696) | 逐个 micro-batch：forward、backward；最后 `finalize_model_grads_func` |
# | [`schedules.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L397) | 调用户的 `forward_step_func`，再调下一行 |
# | [`schedules.py::forward_step_calc_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L290) | 调 `loss_func`，按返回值个数**原地**缩放 loss |
# | [`schedules.py:334`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L334) | 3 个值：`/= num_tokens`、`/= num_microbatches`（除非 `calculate_per_token_loss`） |
# | [`schedules.py:340`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340) | 2 个值：`*= cp_size`、`/= num_microbatches` |
# | [`schedules.py::backward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L532) | 从缩放后的 loss 反向（`grad_scale_func` 乘 loss scale） |
# | [`gpt_model.py::GPTModel.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L519) | embedding → decoder → `_postprocess` |
# | [`gpt_model.py::GPTModel._postprocess`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L620) | 输出层；有 labels 时返回逐 token loss `[b, s]` |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | 输出层：`gather_output=False` 时每个 rank 留 `V/TP` 列 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | 列并行层的输入梯度 all-reduce（与权重梯度计算重叠） |
# | [`language_module.py::LanguageModule.compute_language_model_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L155) | `[b, s]` ↔ `[s, b]`，调 vocab-parallel 交叉熵 |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L121) | 3 次 all-reduce：max、目标 logit、Σexp |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L186) | softmax − one-hot，本地计算，不通信 |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | DP 梯度归约；`calculate_per_token_loss` 时再除以全局 token 数（[finalize_model_grads.py 第 680–696 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L680-L696)） |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/training.py::train_step
# ├─ forward_backward_func = get_forward_backward_func()           # PP=1 → forward_backward_no_pipelining
# ├─ losses_reduced = forward_backward_func(forward_step_func=pretrain_gpt.forward_step, data_iterator, model,
# │                                         num_microbatches, seq_length, micro_batch_size, forward_only=False)
# │  └─ 每个 micro-batch（前 M−1 个在 no_sync 里：DDP 不急着归约）
# │     ├─ schedules.py::forward_step
# │     │  ├─ pretrain_gpt.py::forward_step(data_iterator, model)
# │     │  │  ├─ get_batch                                          # 笔记 03：TP broadcast、CP 切分
# │     │  │  └─ GPTModel.forward(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
# │     │  │     ├─ embedding：VocabParallelEmbedding               # all-reduce [b, s, h]（TP）
# │     │  │     ├─ decoder：每层 linear_proj、linear_fc2           # all-reduce [s, b, h] ×2（TP）
# │     │  │     └─ _postprocess
# │     │  │        ├─ output_layer：ColumnParallelLinear          # 前向不通信，logits [s, b, V/TP]
# │     │  │        └─ compute_language_model_loss → vocab_parallel_cross_entropy   # all-reduce [s, b] ×3（TP）
# │     │  │     → 返回逐 token loss [b, s]，和 partial(loss_func, loss_mask, model=model)
# │     │  └─ forward_step_calc_loss：loss_func(output) → (sum, num_tokens, report)
# │     │        sum /= num_tokens；sum /= num_microbatches                            # 原地
# │     └─ schedules.py::backward_step → torch.autograd.backward(loss)
# │        ├─ output_layer 的输入梯度                              # all-reduce [s, b, h]（TP）
# │        └─ 每层 linear_fc1、linear_qkv 的输入梯度               # all-reduce [s, b, h] ×2（TP）
# │  └─ finalize_model_grads_func([model], num_tokens?)            # DDP：DP 梯度归约（笔记 06）
# └─ 尾 stage：报告 [sum, count] 按 micro-batch 求和、DP all-reduce，sum / count → 日志里的 lm loss
# ```
#
# **每个函数的阅读记录**（roadmap 第一轮的七问）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::train_step` | `forward_step`、`data_iterator`、model 块列表、optimizer、`opt_param_scheduler`、config、`forward_backward_func` | 元组 `(loss_reduced, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, …)` | 每块 `zero_grad_buffer`（[training.py:2361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)）、schedule 的 `forward_backward_func`（[training.py:2407](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2407)，末尾经 `config.finalize_model_grads_func` 做梯度归约）、`MegatronOptimizer.step`（[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)） | 是：dp-cp（梯度归约；日志用的 loss 在 dp-cp 群 all-reduce，[training.py:2547](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2547)）、tp-pp（梯度范数） | batch 已按 DP 切、再按 micro-batch 切；参数按 TP / PP 切 | 是：参数、优化器状态、学习率（`opt_param_scheduler.step`，[training.py:2528](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2528)）、iterator 前进 | 循环体：`optim.zero_grad()` → `forward_backward_func(...)` → `finalize_model_grads([gpt_model])` → `optim.step()` |
# | `get_forward_backward_func` | （读 PP / VPP 大小） | 一个 schedule 函数 | `parallel_state` | 只读大小 | 否 | 否 | `get_forward_backward_func()` |
# | `forward_backward_no_pipelining` | forward_step_func、iterator、model、micro-batch 数… | 每个 micro-batch 的报告 list | `forward_step`、`backward_step`、`finalize_model_grads_func` | 经模型（TP）、经 finalize（DP） | 否 | 是：累加 `.grad` / `main_grad` | `forward_backward_func(...)` |
# | `pretrain_gpt.forward_step` | iterator、model | `(逐 token loss [b, s], partial(loss_func, loss_mask, model=model))` | `get_batch`、`GPTModel` | 经 `get_batch` 与模型 | 经 `get_batch`（CP） | 推进 iterator | `forward_step_func` |
# | `pretrain_gpt.loss_func` | `loss_mask`、逐 token loss | `(sum, num_tokens, report)` | rerun state machine（NaN / 尖峰检查） | 否 | 否 | 否 | 内嵌的 `loss_func`（返回 2 个值） |
# | `forward_step_calc_loss` | 输出、`loss_func`、config、micro-batch 数 | 缩放后的 loss、token 数 | 无 | 否 | 否 | 原地改 loss | schedule 内部 |
# | `backward_step` | 输入张量、输出（loss）、输出梯度 | 输入张量的梯度（PP 用） | `grad_scale_func` | 经模型的 TP 反向 | 否 | 是：累加梯度 | schedule 内部 |
# | `vocab_parallel_cross_entropy` | logits 分片 `[s, b, V/TP]`、target `[s, b]` | 逐 token loss `[s, b]` | 参数 `tp_group`：`GPTModel` 的 loss 传它自己的 TP 群（[language_module.py:194](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194)），不传时退回全局 TP 群 | **是**：3 次 all-reduce | 输入按词表切 | 否 | `GPTModel` 内部 |

# %% jupyter={"source_hidden": true} tags=["hide-input"]
from functools import partial

import torch

from snippets.experiments import EXPERIMENTS
from snippets.experiments.n05_loss import one_step, tokens_kept
from snippets.record.listing import listing
from snippets.train import pictures
from snippets.ranks.launch import run_ranks
from snippets.train.loss_flow import annotate, masked_mean, masked_token_sum, microbatches, train_step_report
from snippets.config.param_table import gather
from snippets.record.tables import Table

# %% [markdown]
# ## 关键对象
#
# ### `forward_step` 与 `loss_func` 的契约
#
# 正式入口的 `pretrain_gpt.py::forward_step` 返回的是 `(output_tensor, partial(loss_func, loss_mask, model=model))`
# （[`pretrain_gpt.py:358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L358)）：`loss_mask` 和 `model` 先绑好，
# schedule 只需再传 `output_tensor`；`model` 只在蒸馏时被 `loss_func` 用到：读缓存 teacher logits 的离线蒸馏（`--logits-load-dir`，[`pretrain_gpt.py:237`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L237)）或 ModelOpt 蒸馏（[`pretrain_gpt.py:239`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L239)），
# 平常是个空着的关键字参数。
#
# schedule 对用户代码只有一个要求：`forward_step_func(data_iterator, model)` 返回 `(output_tensor, loss_func)`，
# 且在尾 stage 上 `loss_func(output_tensor)` 返回
#
# - **3 个值** `(loss, num_tokens, report)`——`pretrain_gpt.py::loss_func` 的写法：`loss` 是被 `loss_mask` 选中的
#   逐 token loss 之**和**，`num_tokens` 是选中的个数，`report` 是 `[和, 个数]`（一份拷贝）。
# - **2 个值** `(loss, report)`——simple loop 的写法：`loss` 已经是平均值，`report` 就是同一个张量。
#
# `snippets/train/loss_flow.py` 用自己的话写了这两种契约（`masked_token_sum`、`masked_mean`），下面的 rank 函数把它们交给
# Megatron 的 schedule。模型与[笔记 04](../04_model_provider_and_gpt_model/) 相同（1 层、hidden 16、词表 32，CPU 初始化，去掉 dropout 以便比较），
# 2 个 micro-batch，各 2 条长 8 的序列，`loss_mask` 分别保留 16 个和 6 个 token。
#
# 这个 rank 函数在 `snippets/experiments/n05_loss.py` 里，模型尺寸、sequence、micro-batch 大小和个数是参数 `dims`
# （本篇用它的 `tiny`；`tokens_kept` 按它算出 16 和 6）。

# %% jupyter={"source_hidden": true} tags=["hide-input"]
listing(tokens_kept, one_step)

# %%
TINY = EXPERIMENTS["loss"].tiny
tp2 = run_ranks(one_step, 2, TINY, 2, grid=dict(tp=2))
tp1 = run_ranks(one_step, 1, TINY, 1)[0]
print("schedule:", tp2[0]["schedule"])
print("每个 micro-batch 的报告（rank 0）:", [[round(x, 4) for x in r["lm loss"].tolist()] for r in tp2[0]["reports"]])
print("train_step 会记下的 lm loss:", round(train_step_report(tp2[0]["reports"]), 4))

# %% [markdown]
# PP=1 时 `get_forward_backward_func()` 给的是 `forward_backward_no_pipelining`。每个 micro-batch 的报告是
# `[loss 之和, token 数]`：第 1 个 16 个 token、第 2 个 6 个。`train_step` 把它们按元素相加（并在 DP 群里 all-reduce），
# 再相除：日志里的 `lm loss` 是**整个 global batch 的 token 平均**。
#
# ### 输出层与 vocab-parallel 交叉熵
#
# `GPTModel` 的输出层是 `ColumnParallelLinear(hidden, vocab, gather_output=not parallel_output)`；正式入口的
# `GPTModelConfig.parallel_output` 缺省为 True，`gpt_config_from_args` 不改它（旧路的 `gpt_builder` 也总是传 True），于是每个 rank 的 logits 只有自己那 `V/TP = 16` 列，**不**拼成整表。
# 这里和正式入口的缺省一样共享词嵌入：输出层用的是按词表切好的 `word_embeddings.weight`（[笔记 04](../04_model_provider_and_gpt_model/)）。

# %%
print("logits（不给 labels 时 GPTModel 的输出）每个 rank:", [list(r["logits"].shape) for r in tp2], " TP=1:",
      list(tp1["logits"].shape))
full_logits = torch.cat([r["logits"] for r in tp2], dim=-1)
print("两个 rank 的 logits 沿词表拼起来 == TP=1 的 logits:", torch.allclose(full_logits, tp1["logits"], atol=1e-5))
dense = torch.nn.functional.cross_entropy(full_logits.flatten(0, 1), tp2[0]["labels"].flatten(), reduction="none")
print("vocab_parallel_cross_entropy（TP=2，逐 token）== 整表上的 torch 交叉熵:",
      torch.allclose(tp2[0]["token_loss"].flatten(), dense, atol=1e-5),
      " 两个 rank 的结果相同:", torch.equal(tp2[0]["token_loss"], tp2[1]["token_loss"]))

# %% [markdown]
# 交叉熵 `log Σ_v exp(z_v) − z_target` 需要整张词表，但每个 rank 只有 16 列。`_VocabParallelCrossEntropy.forward`
# 不去收集 logits（那是 `[s, b, V]`，真实词表下很大），只交换三个 `[s, b]` 的小张量：全表最大值（MAX）、目标词的 logit
# （只有持有它的 rank 非零，SUM）、`Σ exp(z − max)`（SUM）。三次 all-reduce 之后每个 rank 都有完整的逐 token loss。
# 反向时梯度 `softmax − one_hot` 只涉及本 rank 的列，用前向存下的 softmax 分片就能算，不通信。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 一次 forward + backward 的全部 collective（TP=2）
#
# 上面那次运行用 `snippets.record.recorder` 记下了两个 micro-batch 的全部 collective；每个 micro-batch 发出的序列相同：

# %%
calls = tp2[0]["calls"]
half = len(calls) // 2
same = [(c.phase, c.api, c.before, c.where) for c in calls[:half]] == \
       [(c.phase, c.api, c.before, c.where) for c in calls[half:]]
print("collective 总数:", len(calls), " 两个 micro-batch 的序列相同:", same,
      " rank 1 与 rank 0 相同:", [(c.api, c.before) for c in calls] == [(c.api, c.before) for c in tp2[1]["calls"]])
annotate(calls[:half], num_layers=1)

# %% [markdown]
# 数一下（1 层、无 sequence parallel）：**前向 6 次、反向 3 次**，全是 TP 群里的 all-reduce。
#
# - 前向：词嵌入 1 次（形状 `[b, s, h]`：embedding 输出在转置成 `[s, b, h]` 之前归约）、每层 2 次（[笔记 11](../11_transformer_layer/) 的 "g"）、
#   交叉熵 3 次。输出层是列并行，前向不通信。
# - 反向：输出层 1 次、每层 2 次（`linear_fc1`、`linear_qkv` 的输入梯度，[笔记 11](../11_transformer_layer/) 的 "f" 的反向）。它们由
#   `LinearWithGradAccumulationAndAsyncCommunication.backward` 直接发出（`async_op=True`，与权重梯度的矩阵乘重叠），
#   不经过 `mappings.py`。交叉熵和行并行层的反向不通信。
# - 词嵌入的反向不通信：前向的 all-reduce 是 "g"，它的反向是恒等。
#
# 推广到 `L` 层：前向 `1 + 2L + 3`，反向 `1 + 2L`。没有 DDP 时 schedule 最后不调 `finalize_model_grads`，
# 所以这里没有 DP 通信（笔记 06）。
#
# ### TP=2 与 TP=1：loss 和梯度
#
# 把 TP=2 两个 rank 的梯度按各参数的 `partition_dim` / `partition_stride` 拼回（[笔记 04](../04_model_provider_and_gpt_model/) 的 `gather`），与 TP=1 比较：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
def full_grad(name, row):
    shards = [r["grads"][name] for r in tp2]
    return gather(shards, row["partition_dim"], row["stride"]) if row["split"] else shards[0]


grad_rows = []
for row in tp2[0]["rows"]:
    name = row["name"]
    diff = (full_grad(name, row) - tp1["grads"][name]).abs().max().item()
    replicas_equal = "-" if row["split"] else torch.allclose(tp2[0]["grads"][name], tp2[1]["grads"][name], atol=1e-7)
    grad_rows.append([name, row["partition_dim"] if row["split"] else "复制", replicas_equal, diff < 1e-6])
print("报告（loss 之和）TP=2 vs TP=1:", all(torch.allclose(a["lm loss"], b["lm loss"], atol=1e-5)
                                         for a, b in zip(tp2[0]["reports"], tp1["reports"])))
Table(["参数", "partition_dim", "两 rank 的复制梯度相同", "拼回后与 TP=1 的差 < 1e-6"], grad_rows)

# %% [markdown]
# 复制的参数（LayerNorm、位置嵌入、行并行层的 bias）在两个 rank 上得到**相同**的梯度：没有 sequence parallel 时，
# 进入它们的激活在每个 rank 上都是完整、相同的，所以不需要额外归约。切分的参数各自只有自己那片的梯度，拼回去就是 TP=1 的梯度。
#
# ### loss 被谁除以什么
#
# 同一个模型、同样两个 micro-batch（16 个和 6 个 token），换 `loss_func` 的写法各跑一次 schedule（TP=1 即可，除法与 TP 无关）。
# 两个参照目标用 autograd 直接算：
#
# - **micro-batch 平均的平均**：`(sum₁/16 + sum₂/6) / 2`
# - **全局 token 平均**：`(sum₁ + sum₂) / 22`
#
# 每次运行看两件事：梯度等于哪个目标的梯度；`train_step` 会记下什么。最后一种打开 `calculate_per_token_loss`，
# 这时 schedule 不除，由 `finalize_model_grads` 除以全局 token 数，它只对 DDP 包装的模型工作，所以这一次包了 DDP。

# %% jupyter={"source_hidden": true} tags=["hide-input"]
def who_divides():
    from snippets.train import loss_flow

    from megatron.core import parallel_state as mpu
    from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                           finalize_model_grads)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    mpu.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32,
                               hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32,
                     max_sequence_length=8, share_embeddings_and_output_weights=True)
    batches = microbatches(2, micro_batch_size=2, seq_length=8, vocab_size=32, tokens_kept=[16, 6])
    targets = loss_flow.objective_gradients(model, batches)  # plain autograd, the two references

    def run(module, loss_func):
        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
            return output, partial(loss_func, batch["loss_mask"])

        return get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(batches),
                                           model=module, num_microbatches=2, seq_length=8, micro_batch_size=2)

    rows = []
    for label, loss_func in [("3 个值（pretrain_gpt）", masked_token_sum),
                             ("2 个值，报告 = loss 本身（simple loop）", partial(masked_mean, report="same")),
                             ("2 个值，报告 = loss.detach()", partial(masked_mean, report="detach")),
                             ("2 个值，报告 = loss.detach().clone()", partial(masked_mean, report="clone"))]:
        model.zero_grad()
        reports = run(model, loss_func)
        rows.append((label, train_step_report(reports), loss_flow.flat_grad(model.parameters())))

    model.zero_grad()  # per-token loss: the schedule does not divide, finalize_model_grads does
    config.calculate_per_token_loss = True
    config.finalize_model_grads_func = finalize_model_grads
    ddp_model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=model)
    reports = run(ddp_model, masked_token_sum)
    rows.append(("3 个值 + calculate_per_token_loss（DDP）", train_step_report(reports),
                 loss_flow.flat_grad(model.parameters(), "main_grad")))
    return {k: v[0] for k, v in targets.items()}, [
        (label, report, *[torch.allclose(grad, target[1], atol=1e-6) for target in targets.values()])
        for label, report, grad in rows]


targets, outcomes = run_ranks(who_divides, 1)[0]
print("两个目标的值:", {k: round(v, 4) for k, v in targets.items()})
divides = [[label, round(report, 4), a, b] for label, report, a, b in outcomes]
Table(["loss_func 的写法", "train_step 记下的 lm loss", "梯度 = micro-batch 平均的平均", "梯度 = 全局 token 平均"], divides)

# %% [markdown]
# 画成一张图：每一行从左到右是 loss 经过的除法，最后两格是梯度真正优化的目标（橙 = micro-batch 平均的平均，
# 绿 = 全局 token 平均）和 `train_step` 记下的值（红 = 被 schedule 的原地除法一起改掉了）：

# %%
pictures.draw_loss_division(divides, tokens=[16, 6])

# %% [markdown]
# 逐行读：
#
# 1. **3 个值（正式入口缺省）**：schedule 把 `sum` 原地除以本 micro-batch 的 token 数、再除以 micro-batch 数
#    （[`schedules.py:334`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L334)），
#    所以**优化的是 micro-batch 平均的平均**（3.4724）；日志却记全局 token 平均（3.4675）。两者只在各 micro-batch
#    token 数不同时不一样——packing、`eod_mask_loss`、SFT 的 prompt mask 都会造成这种不同。报告是一份拷贝，不受原地除法影响。
# 2. **2 个值、报告就是 loss 本身**（simple loop 的写法）：schedule 原地 `*= cp_size`、`/= num_microbatches`
#    （[`schedules.py:340`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340)），
#    报告是同一个张量，也被除了：日志里的 loss 是真实值的一半（1.7362 = 3.4724 / 2）。梯度没错。
# 3. **`loss.detach()`**：detach 出来的张量与原张量共享存储，原地除法照样改到它——结果与第 2 行相同。
# 4. **`loss.detach().clone()`**：独立的存储，报告正确。`snippets/models/tiny_gpt.py` 的 `loss_func` 就是这么写的。
# 5. **`calculate_per_token_loss=True`**：schedule 不除；`finalize_model_grads` 把全局 token 数在 DP×CP 群里求和后，
#    用 `scale_gradients(1 / num_tokens)` 缩放梯度（[finalize_model_grads.py 第 680–696 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L680-L696)）。这时优化的才是全局 token 平均，
#    与日志一致。
#
# 还有一处除法不在这里：DDP 归约梯度时乘 `1 / (DP×CP 群大小)`（`calculate_per_token_loss` 时不乘），笔记 06 再看。

# %% [markdown]
# ## 机制解释
#
# **loss 为什么是"和"再交给 schedule。** `loss_func` 只看见一个 micro-batch，它不知道整个 global batch 有几个 micro-batch、
# 几个 DP rank、一共多少 token。返回 `(和, 个数)` 把"除以什么"留给知道这些的人：缺省由 schedule 按 micro-batch 归一，
# 打开 `calculate_per_token_loss` 则由 `finalize_model_grads` 按全局 token 数归一。报告也用 `(和, 个数)`，
# 所以日志总能算出准确的全局 token 平均。
#
# **原地缩放。** `forward_step_calc_loss` 用 `/=` 改的是 `loss_func` 返回的那个张量，然后 `backward_step` 从它开始反向。
# 原地操作省一次分配，也让"返回给 schedule 的张量"与"被反向的张量"是同一个对象；代价是任何与它共享存储的张量都会变。
#
# **vocab 并行的交叉熵。** 输出层是列并行，logits 天然按词表分在各 rank 上；交叉熵只需要每个 token 的三个标量统计量，
# 三次 `[s, b]` 的 all-reduce 代替了一次 `[s, b, V]` 的 all-gather。真实词表 V ≈ 150k 时，这个差别是数量级的。
#
# **反向的通信是前向的镜像。** 前向做 all-reduce 的地方（g：行并行输出、嵌入）反向不通信；前向不通信的地方
# （f：列并行层的输入）反向做 all-reduce。交叉熵是例外：前向 3 次、反向 0 次，因为它的反向只用本地保存的 softmax 分片。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这是 `train_step` 的核心：`forward_backward_func(...)` 返回时每个参数的梯度已经累加好（DDP 下在 `main_grad` 里，
# 并已在 DP 群归约，笔记 06）；之后 `optimizer.step()` 更新参数（笔记 06）。simple loop 里对应
# `forward_backward_func(forward_step_func=forward_step_func, ..., num_microbatches=1, ...)`，之后它**手动**调
# `finalize_model_grads([gpt_model])`——因为它没有把 `finalize_model_grads` 设进 `config.finalize_model_grads_func`。
# PP>1 时同一套 `forward_step` / `loss_func` 交给 1F1B schedule，`loss_func` 只在尾 stage 上被调用（[笔记 13](../13_pipeline_schedules/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **梯度累加**：M 个 micro-batch 的梯度相加；每个 loss 先除以 M，累加的结果就等于"平均 loss"的梯度。
#   这里的问题只是"平均"按什么权重：每个 micro-batch 等权，还是每个 token 等权。
# - **交叉熵与 log-sum-exp**：`CE = logsumexp(z) − z_y`，先减去最大值保证数值稳定；梯度是 `softmax(z) − onehot(y)`。
# - **autograd 与原地操作**：`detach()` 返回共享存储、不带梯度的视图，`clone()` 才复制存储。

# %% [markdown]
# ## 遗留问题
#
# 1. **simple loop 的日志 loss 被除以了 micro-batch 数（运行确认）。** 它的 `loss_func` 返回 `{"lm loss": loss}`
#    （与被反向的张量是同一个），schedule 的原地 `/= num_microbatches` 也改了日志值。simple loop 用 `num_microbatches=1`，
#    所以看不出来；把它改成 2 就会看到 loss 减半。
# 2. **缺省设置下，日志与优化目标不是同一个数（运行确认）。** 正式入口缺省优化"micro-batch 平均的平均"，日志记
#    "全局 token 平均"。只有 `--calculate-per-token-loss` 让两者一致（hybrid CP 要求打开它，[arguments.py 第 1409 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1409)）。
# 3. **CP 在两种契约里的处理不同。** 2 个值时 schedule 乘 `cp_size`；3 个值时不乘——因为 token 数已经是本 CP rank 的 token 数，
#    `sum / num_tokens` 本身就是局部平均，DDP 在 DP×CP 群里再平均。两条路径在 CP>1 时是否给出同样的梯度，留到[笔记 16](../16_context_parallel/) 用运行核对。

# %% [markdown]
# ## 自测
#
# **1. TP=2、1 层、不开 sequence parallel，一个 micro-batch 的前向和反向各有几次 collective？**
#
# <details><summary>答案</summary>
#
# 前向 6 次（嵌入 1、每层 2、交叉熵 3），反向 3 次（输出层 1、每层 2），全是 TP 群里的 all-reduce。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
from collections import Counter

print(Counter(c.phase for c in calls[:half]), {c.api for c in calls}, {c.group for c in calls})

# %% [markdown]
# **2. TP=2 时输出层给每个 rank 的 logits 是什么 shape？交叉熵为什么不用先把它们拼起来？**
#
# <details><summary>答案</summary>
#
# `[b, s, V/TP] = [2, 8, 16]`（`parallel_output=True`）。交叉熵只需要每个 token 的最大 logit、目标 logit、Σexp 三个标量，
# 三次 `[s, b]` 的 all-reduce 就够，不必交换 `[s, b, V]` 的 logits。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(list(tp2[0]["logits"].shape), [c.before for c in calls[:half] if "cross_entropy" in c.where])

# %% [markdown]
# **3. `pretrain_gpt.loss_func` 返回 3 个值。schedule 把第一个值除以了什么？**
#
# <details><summary>答案</summary>
#
# 除以本 micro-batch 的 token 数（至少为 1），再除以 micro-batch 数；两次都是原地 `/=`。
# 打开 `calculate_per_token_loss` 时两次都不做，改由 `finalize_model_grads` 用全局 token 数缩放梯度。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print([(label, a, b) for label, _, a, b in outcomes if label.startswith("3 个值")])

# %% [markdown]
# **4. 报告里放 `loss.detach()` 能避免日志被原地除法改掉吗？**
#
# <details><summary>答案</summary>
#
# 不能。`detach()` 与原张量共享存储，schedule 的 `/= num_microbatches` 同样改到它；要用 `loss.detach().clone()`。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print({label: round(report, 4) for label, report, _, _ in outcomes if "2 个值" in label})

# %% [markdown]
# **5. TP=2 时 LayerNorm 权重的梯度在两个 rank 上相同吗？需要 all-reduce 吗？**
#
# <details><summary>答案</summary>
#
# 相同，不需要：不开 sequence parallel 时每个 rank 的 LayerNorm 看到完整、相同的激活，算出同样的梯度。开了 sequence parallel
# 后每个 rank 只看到一段序列，梯度是部分和，`finalize_model_grads` 要在 TP 群里 all-reduce（[笔记 11](../11_transformer_layer/)）。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print([(name.split("decoder.")[-1], same) for name, dim, same, _ in grad_rows if "layernorm.weight" in name])

# %% [markdown]
# ## 30-second answer
#
# `forward_step` returns the per-token loss `[b, s]` and `partial(loss_func, loss_mask, model=model)`. `pretrain_gpt.loss_func` returns
# the masked sum, the token count and a `[sum, count]` report; the schedule divides the sum in place by the count and by
# the number of micro-batches, so by default Megatron optimizes the mean of micro-batch means while logging the global
# token mean. The output layer is column-parallel with `parallel_output=True`; vocab-parallel cross entropy needs three
# `[s, b]` all-reduces. At TP=2 one micro-batch costs 6 forward and 3 backward all-reduces.
