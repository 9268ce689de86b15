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
# `train_step` 把一个 global batch 的 m 个 micro-batch 交给 schedule，schedule 对每个 micro-batch 做一次 forward、
# 算 loss、做一次 backward。`loss_func` 交回的 loss 在反向之前被谁除以了什么，日志里的 `lm loss` 又是哪个数？
# TP=2 时每个 rank 只有半张词表的 logits，交叉熵怎样算出来，一个 micro-batch 前向、反向各通信几次？
# 本篇在 1、2 个进程上跑 Megatron 真实的 schedule 和一个 1 层的 `GPTModel`，逐项回答。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清 `forward_step_func` 与 `loss_func` 的契约：`loss_func` 返回 2 个值或 3 个值时，schedule 各做什么。
# 2. 说清 loss 被谁除以什么：token 数、micro-batch 数，打开 `calculate_per_token_loss` 时的 `finalize_model_grads`；日志记的是什么。
# 3. 说清输出层与 vocab 并行的交叉熵：TP=2 时 logits 的形状，交叉熵的 3 次 all-reduce。
# 4. 数出 TP=2 时一个 micro-batch 前向、反向的全部通信；说明 TP=2 的 loss、梯度与 TP=1 相同。
#
# **结论**
#
# - PP=1 时 `get_forward_backward_func()` 给 `forward_backward_no_pipelining`：每个 micro-batch 先 forward 再 backward。
# - `pretrain_gpt` 的 `loss_func` 返回（和、token 数、报告）：schedule 原地 ÷token 数、÷m，优化 micro-batch 平均的平均 3.4724。
# - 日志却按全局 token 平均记 3.4675（两个 micro-batch 16 和 6 个 token）；只有 `calculate_per_token_loss` 让两者一致。
# - 返回 2 个值时 schedule 原地 ×CP、÷m；报告若与 loss 共用存储（simple loop、`detach()`），日志被一起除成 1.7362。
# - TP=2 时每个 rank 的 logits 是 `[2, 8, 16]`，交叉熵只 all-reduce 3 个 `[8, 2]`；1 层模型一个 micro-batch 前向 6 次、反向 3 次。
#
# 先读：[笔记 04](../04_model_provider_and_gpt_model/)（`GPTModel` 与 TP 切分）、[笔记 03](../03_data_and_batch_flow/)（micro-batch 从哪来）；基础概念见文末「与基础知识的连接」；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from collections import Counter
from functools import partial

import torch

from snippets.config.param_table import gather
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n05_loss import batches, build_gpt, forward_step_with, one_step, tokens_kept, who_divides
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.train import pictures
from snippets.train.loss_flow import annotate, masked_mean, masked_token_sum

from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from megatron.core.transformer import TransformerConfig


class Folded:
    """A table that proves the page right: shown closed, one click away."""

    def __init__(self, summary, table):
        self.summary, self.table = summary, table

    def _repr_markdown_(self):
        return f"<details><summary>{self.summary}</summary>\n\n{self.table.markdown()}\n\n</details>"

    def __repr__(self):
        return self.table.markdown()


TINY = EXPERIMENTS["loss"].tiny
tp2 = run_ranks(one_step, 2, TINY, 2, grid=dict(tp=2))
tp1 = run_ranks(one_step, 1, TINY, 1)[0]
targets, outcomes = run_ranks(who_divides, 1, TINY)[0]
divides = [[label, round(report, 4), a, b] for label, report, a, b in outcomes]
pictures.draw_loss_division(divides, tokens=tokens_kept(TINY))

# %% [markdown]
# 每一行是 `loss_func` 的一种写法，从左往右是 loss 经过的除法，最后两格是梯度真正优化的目标（橙 = micro-batch
# 平均的平均，绿 = 全局 token 平均）和 `train_step` 记下的值（红 = 被 schedule 的原地除法一起改掉了）。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 每次运行在本机用 gloo 起 1 或 2 个进程（`snippets.ranks.launch.run_ranks`）。`snippets/experiments/n05_loss.py`
#   的 `build_gpt` 建 1 层 `GPTModel`（hidden 16、4 个 head、词表 32；local spec，共享词嵌入，`parallel_output=True`，
#   CPU 初始化，去掉 dropout 以便逐元素比较）；`batches` 给 2 个 micro-batch，各 2 条长 8 的序列，`loss_mask`
#   分别保留 16 和 6 个 token（`tokens_kept`）。
# - `one_step` 把 `forward_step_with(masked_token_sum)` 交给真实的 schedule，`snippets.record.recorder` 记下每个
#   collective 和它所在的阶段（forward / backward）；TP=1 与 TP=2 各跑一次。
# - `who_divides` 在 1 个进程上对四种 `loss_func` 写法各跑一次 schedule，再包一层 DDP、打开
#   `calculate_per_token_loss` 跑一次；两个参照目标用普通 autograd 算（`snippets/train/loss_flow.py` 的
#   `objective_gradients`）。`masked_token_sum`、`masked_mean` 是 `pretrain_gpt.py` 与 simple loop 的 `loss_func`
#   用我们自己的话重写的版本，源码折叠在「关键对象」里。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 loss --dims tiny --tp 2` 打印本页 TP=2 的通信表；
#   `scripts/execute_notes.sh notes/05_forward_loss_backward.py` 重新执行整页。
# - CPU 上要的改动：[CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(tokens_kept, build_gpt, batches, forward_step_with, one_step, who_divides)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`schedules.py::get_forward_backward_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L48) | 按 PP / VP 选 schedule；PP=1 是 `forward_backward_no_pipelining` |
# | [`schedules.py::forward_backward_no_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L696) | 逐个 micro-batch：forward、backward；最后调 `finalize_model_grads_func` |
# | [`schedules.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L397) | 调用户的 `forward_step_func`，再交给下一行 |
# | [`schedules.py::forward_step_calc_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L290) | 调 `loss_func`，按返回值个数**原地**缩放 loss |
# | [`schedules.py::backward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L532) | 从缩放后的 loss 反向（有 `grad_scale_func` 时先乘 loss scale） |
# | [`pretrain_gpt.py::loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L209) | 正式入口：返回 `(和, token 数, {'lm loss': [和, token 数]})` |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L121) | 3 次 all-reduce：max、目标 logit、Σexp |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | 打开 `calculate_per_token_loss` 时把梯度除以全局 token 数 |
#
# <details><summary>其余符号（11 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 调 schedule；之后把各 micro-batch 的报告归约成日志里的 loss |
# | [`training.py:2548`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2548) | 报告为 `[和, 个数]` 时：DP 上求和后相除 |
# | [`training.py:2551`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2551) | 报告为单个数时：对 micro-batch 取平均 |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | 取 batch、跑模型、返回 `(output, partial(loss_func, loss_mask, model=model))` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | simple loop：`loss_func` 返回 `(平均, {'lm loss': 同一个张量})` |
# | [`gpt_model.py::GPTModel.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L519) | embedding → decoder → `_postprocess` |
# | [`gpt_model.py::GPTModel._postprocess`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L620) | 输出层；有 labels 时返回逐 token loss `[b, s]` |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | 输出层：`gather_output=False` 时每个 rank 留 `V/TP` 列 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | 列并行层的输入梯度 all-reduce（与权重梯度计算重叠） |
# | [`language_module.py::LanguageModule.compute_language_model_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L155) | `[b, s]` ↔ `[s, b]`，调 vocab 并行交叉熵 |
# | [`cross_entropy.py::_VocabParallelCrossEntropy.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L186) | softmax − one-hot，本地计算，不通信 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `train_step` → `get_forward_backward_func()`（PP=1 时 `forward_backward_no_pipelining`）→ 每个 micro-batch
# `forward_step`（用户的 `forward_step_func` 跑 `GPTModel`，`forward_step_calc_loss` 调 `loss_func` 并原地缩放）→
# `backward_step` → 最后 `finalize_model_grads_func`（DP 归约，[笔记 06](../06_gradient_sync_and_optimizer/)）。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::train_step
# ├─ forward_backward_func = get_forward_backward_func()           # PP=1 → forward_backward_no_pipelining
# ├─ losses_reduced = forward_backward_func(forward_step_func=pretrain_gpt.forward_step, data_iterator, model,
# │                                         num_microbatches, seq_length, micro_batch_size, forward_only=False)
# │  ├─ 每个 micro-batch（前 m−1 个在 no_sync_func 里：DDP 不急着归约）
# │  │  ├─ schedules.py::forward_step
# │  │  │  ├─ pretrain_gpt.py::forward_step(data_iterator, model)
# │  │  │  │  ├─ get_batch                                          # 笔记 03：TP broadcast、CP 切分
# │  │  │  │  └─ GPTModel.forward(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
# │  │  │  │     ├─ embedding：VocabParallelEmbedding               # all-reduce [b, s, h]（TP）
# │  │  │  │     ├─ decoder：每层 linear_proj、linear_fc2           # all-reduce [s, b, h] ×2（TP）
# │  │  │  │     └─ _postprocess
# │  │  │  │        ├─ output_layer：ColumnParallelLinear          # 前向不通信，logits [s, b, V/TP]
# │  │  │  │        └─ compute_language_model_loss → vocab_parallel_cross_entropy   # all-reduce [s, b] ×3（TP）
# │  │  │  │     → 返回逐 token loss [b, s]，和 partial(loss_func, loss_mask, model=model)
# │  │  │  └─ forward_step_calc_loss：loss_func(output) → (和, token 数, 报告)
# │  │  │        和 /= token 数；和 /= m                                  # 原地；calculate_per_token_loss 时都不做
# │  │  └─ schedules.py::backward_step → torch.autograd.backward(loss)
# │  │     ├─ output_layer 的输入梯度                              # all-reduce [s, b, h]（TP）
# │  │     └─ 每层 linear_fc1、linear_qkv 的输入梯度               # all-reduce [s, b, h] ×2（TP）
# │  └─ config.finalize_model_grads_func([model], 全局 token 数 或 None)   # DP 归约（笔记 06）
# └─ 最后一个 stage：报告 [和, 个数] 按 micro-batch 相加、在 dp-cp 群 all-reduce，相除 → 日志里的 lm loss
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::train_step` | `forward_step`、`data_iterator`、model 块列表、optimizer、`opt_param_scheduler`、config、`forward_backward_func` | 元组 `(loss_reduced, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, …)` | 每块 `zero_grad_buffer`（[training.py:2361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)）、schedule 的 `forward_backward_func`（[training.py:2407](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2407)，末尾经 `config.finalize_model_grads_func` 做梯度归约）、`MegatronOptimizer.step`（[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)） | 是：dp-cp（梯度归约；日志用的 loss 在 dp-cp 群 all-reduce，[training.py:2547](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2547)）、模型并行群（梯度范数） | batch 已按 DP 切、再按 micro-batch 切；参数按 TP / PP 切 | 是：参数、优化器状态、学习率（`opt_param_scheduler.step`，[training.py:2528](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2528)）、iterator 前进 | 循环体：`optim.zero_grad()` → `forward_backward_func(...)` → `finalize_model_grads([gpt_model])` → `optim.step()` |
# | `get_forward_backward_func` | （读 PP / VP 大小） | 一个 schedule 函数 | `parallel_state` | 只读大小 | 否 | 否 | `get_forward_backward_func()` |
# | `forward_backward_no_pipelining` | forward_step_func、iterator、model、micro-batch 数… | 每个 micro-batch 的报告 list | `forward_step`、`backward_step`、`finalize_model_grads_func` | 经模型（TP）、经 finalize（DP） | 否 | 是：累加 `.grad` / `main_grad` | `forward_backward_func(...)` |
# | `pretrain_gpt.forward_step` | iterator、model | `(逐 token loss [b, s], partial(loss_func, loss_mask, model=model))` | `get_batch`、`GPTModel` | 经 `get_batch` 与模型 | 经 `get_batch`（CP） | 推进 iterator | `forward_step_func` |
# | `pretrain_gpt.loss_func` | `loss_mask`、逐 token loss | `(和, token 数, 报告)` | rerun state machine（NaN / 尖峰检查） | 否 | 否 | 否 | 内嵌的 `loss_func`（返回 2 个值） |
# | `forward_step_calc_loss` | 输出、`loss_func`、config、micro-batch 数、CP 大小 | 缩放后的 loss、token 数（2 个值时为 0） | 无 | 否 | 否 | 原地改 loss | schedule 内部 |
# | `backward_step` | 输入张量、输出（loss）、输出梯度 | 输入张量的梯度（PP 用） | `grad_scale_func` | 经模型的 TP 反向 | 否 | 是：累加梯度 | schedule 内部 |
# | `vocab_parallel_cross_entropy` | logits 分片 `[s, b, V/TP]`、target `[s, b]` | 逐 token loss `[s, b]` | 参数 `tp_group`：`GPTModel` 的 loss 传它自己的 TP 群（[language_module.py:194](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194)），不传时退回全局 TP 群 | **是**：3 次 all-reduce | 输入按词表切 | 否 | `GPTModel` 内部 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `forward_step_func` 与 `loss_func` 的契约
#
# schedule 对用户代码只有一个要求：`forward_step_func(data_iterator, model)` 返回 `(output_tensor, loss_func)`。
# 正式入口 `pretrain_gpt.py::forward_step` 让 `GPTModel` 带着 labels 前向，直接得到逐 token 的 loss `[b, s]`，
# 再交回 `partial(loss_func, loss_mask, model=model)`
# （[`pretrain_gpt.py:358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L358)）：
# `loss_mask` 已经绑好，schedule 只需再传 `output_tensor`；`model` 只在蒸馏时有用。下面在 TP=2 的两个进程上
# 用同样的写法调一次真实的 schedule，两个 micro-batch，`loss_mask` 分别保留 16 和 6 个 token：

# %%
def forward_step(data_iterator, model):  # 交给 schedule 的 forward_step_func
    batch = next(data_iterator)
    per_token_loss = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return per_token_loss, partial(masked_token_sum, batch["loss_mask"])  # 与 pretrain_gpt 一样返回 3 个值


def schedule_on_tp2(dims):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model = build_gpt(dims, tp=2)  # 1 层 GPTModel，词嵌入与输出层共享
    forward_backward_func = get_forward_backward_func()
    reports = forward_backward_func(forward_step_func=forward_step, data_iterator=iter(batches(dims)), model=model,
                                    num_microbatches=dims.microbatches, seq_length=dims.seq,
                                    micro_batch_size=dims.micro_batch_size)
    return forward_backward_func.__name__, [[round(x, 4) for x in r["lm loss"].tolist()] for r in reports]


on_tp2 = run_ranks(schedule_on_tp2, 2, TINY)
Table(["rank", "forward_backward_func", "每个 micro-batch 的报告 [loss 之和, token 数]", "train_step 会记下的 lm loss"],
      [[rank, name, reports, round(sum(r[0] for r in reports) / sum(r[1] for r in reports), 4)]
       for rank, (name, reports) in enumerate(on_tp2)])

# %% [markdown]
# PP=1 时 schedule 是 `forward_backward_no_pipelining`。它把 `loss_func` 的第三个返回值（报告）原样收进列表交回
# `train_step`；`train_step` 把各 micro-batch 的 `[和, 个数]` 按元素相加、在 dp-cp 群里 all-reduce，再相除
# （[training.py 第 2546–2548 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2546-L2548)）：
# 日志里的 `lm loss` 是整个 global batch 的 **token 平均**，(55.3856 + 20.8995) / 22 = 3.4675。
#
# 第一个返回值才是要反向的 loss。`forward_step_calc_loss` 看 `loss_func` 返回几个值来处理它，这一步不需要
# 进程群，直接调：一个 micro-batch，每个 token 的 loss 都是 3.0，`loss_mask` 只留 6 个 token，m = 2。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(masked_token_sum, masked_mean)

# %%
config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4)
per_token_loss = torch.full((2, 8), 3.0)
loss_mask = (torch.arange(16) < 6).float().view(2, 8)


def what_the_schedule_does(loss_func, per_token=False, cp_size=1):
    config.calculate_per_token_loss = per_token
    store = []  # forward_data_store：schedule 交回 train_step 的报告
    loss, num_tokens = forward_step_calc_loss(None, per_token_loss, partial(loss_func, loss_mask), config, None,
                                              False, 2, store, cp_group_size=cp_size, is_last_stage=True)
    return round(loss.item(), 4), int(num_tokens), store[0]["lm loss"].tolist()


Table(["loss_func", "calculate_per_token_loss", "CP", "交给 backward 的 loss", "num_tokens", "交回 train_step 的报告"], [
    ["3 个值（pretrain_gpt）", False, 1, *what_the_schedule_does(masked_token_sum)],
    ["3 个值（pretrain_gpt）", True, 1, *what_the_schedule_does(masked_token_sum, per_token=True)],
    ["2 个值，报告 = loss 本身（simple loop）", False, 1, *what_the_schedule_does(partial(masked_mean, report="same"))],
    ["2 个值，报告 = loss.detach().clone()", False, 1, *what_the_schedule_does(partial(masked_mean, report="clone"))],
    ["2 个值，报告 = loss.detach().clone()", True, 2,
     *what_the_schedule_does(partial(masked_mean, report="clone"), per_token=True, cp_size=2)],
])

# %% [markdown]
# - **3 个值** `(和, token 数, 报告)`：和是 18.0，schedule 先 ÷6 再 ÷2，交给 backward 的是 1.5
#   （[schedules.py 第 334–335 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L334-L335)）。
#   报告 `[18.0, 6.0]` 是另一个张量，不受影响。打开 `calculate_per_token_loss` 两次除法都跳过
#   （[schedules.py:331](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L331)），
#   loss 保持 18.0，token 数交给 schedule 累加。
# - **2 个值** `(平均, 报告)`：平均 3.0 被原地 ×CP、÷m
#   （[schedules.py 第 340–341 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340-L341)）。
#   simple loop 的报告就是这个张量，于是交回的报告也从 3.0 变成了 1.5；`detach().clone()` 有自己的存储，仍是 3.0。
#   这条路不看 `calculate_per_token_loss`，token 数恒为 0：这个开关只对 3 个值的写法有用。
#
# ### 输出层与 vocab 并行的交叉熵
#
# `GPTModel` 的输出层是 `ColumnParallelLinear(hidden, vocab, gather_output=not parallel_output)`，正式入口的
# `parallel_output` 缺省为 True，于是每个 rank 的 logits 只有自己那 `V/TP = 16` 列，不拼成整表；这里与正式入口一样共享
# 词嵌入，输出层用的就是按词表切好的 `word_embeddings.weight`（[笔记 04](../04_model_provider_and_gpt_model/)）。
# 交叉熵 `log Σ_v exp(z_v) − z_target` 需要整张词表，`vocab_parallel_cross_entropy` 却不收集 logits。把上面那次
# TP=2 运行里每个 rank 的 logits 分片直接交给它：

# %%
def cross_entropy_on_tp2(logits_by_rank, labels):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    shard = logits_by_rank[parallel_state.get_tensor_model_parallel_rank()]  # [b, s, V/TP]
    loss = vocab_parallel_cross_entropy(shard.transpose(0, 1).contiguous(), labels.t().contiguous())  # [s, b]
    return list(shard.shape), loss.transpose(0, 1)


ce = run_ranks(cross_entropy_on_tp2, 2, [r["logits"] for r in tp2], tp2[0]["labels"])
full_logits = torch.cat([r["logits"] for r in tp2], dim=-1)
dense = torch.nn.functional.cross_entropy(full_logits.flatten(0, 1), tp2[0]["labels"].flatten(), reduction="none")
print("每个 rank 的 logits:", [shape for shape, _ in ce], " TP=1 的 logits:", list(tp1["logits"].shape))
print("两片拼起来 == TP=1 的 logits:", torch.allclose(full_logits, tp1["logits"], atol=1e-5))
print("vocab_parallel_cross_entropy == 整表上的 torch 交叉熵:", all(torch.allclose(loss.flatten(), dense, atol=1e-5)
                                                                for _, loss in ce),
      " == GPTModel 给的逐 token loss:", torch.allclose(ce[0][1], tp2[0]["token_loss"], atol=1e-6))

# %% [markdown]
# 每个 rank 只交换三个 `[s, b]` 的小张量：全表最大值（MAX，为了数值稳定）、目标词的 logit（只有持有该词的 rank
# 非零，SUM）、`Σ exp(z − max)`（SUM）（[cross_entropy.py 第 130–150 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L130-L150)）。
# 三次 all-reduce 之后每个 rank 都有完整的逐 token loss。反向的梯度 `softmax − one_hot` 只涉及本 rank 的列，
# 用前向存下的 softmax 分片就能算，不通信。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 一个 micro-batch 的全部通信（TP=2）
#
# `one_step` 在 TP=2 上录下了两个 micro-batch 的全部 collective，两个 micro-batch 的序列相同；下表是一个 micro-batch：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
calls = tp2[0]["calls"]
half = len(calls) // 2
same = [(c.phase, c.api, c.before, c.where) for c in calls[:half]] == \
       [(c.phase, c.api, c.before, c.where) for c in calls[half:]]
print("collective 总数:", len(calls), " 两个 micro-batch 的序列相同:", same,
      " rank 1 与 rank 0 相同:", [(c.api, c.before) for c in calls] == [(c.api, c.before) for c in tp2[1]["calls"]])
annotate(calls[:half], num_layers=1)

# %% [markdown]
# 1 层、不开 sequence parallel：**前向 6 次、反向 3 次**，全是 TP 群里的 all-reduce，推广到 L 层是前向 `1 + 2L + 3`、
# 反向 `1 + 2L`。
#
# - 前向：词嵌入 1 次（`[b, s, h]`：嵌入在转成 `[s, b, h]` 之前归约）、每层 2 次（行并行的 `linear_proj`、`linear_fc2`，
#   [笔记 11](../11_transformer_layer/) 的 g）、交叉熵 3 次。输出层是列并行，前向不通信。
# - 反向：输出层 1 次、每层 2 次（`linear_fc1`、`linear_qkv` 的输入梯度，f 的反向）。它们由
#   `LinearWithGradAccumulationAndAsyncCommunication.backward` 直接发出（`async_op=True`，与权重梯度的矩阵乘重叠），
#   不经过 `mappings.py`。词嵌入、行并行层和交叉熵的反向不通信。
# - 没有 DDP，schedule 最后不做 DP 归约；DP 的那一次 all-reduce 在[笔记 06](../06_gradient_sync_and_optimizer/)。
#
# TP=2 的 loss 与 TP=1 相同；两个 rank 的梯度按各参数的切分维拼回后，与 TP=1 的差都小于 1e-6，复制的参数（norm、
# 位置嵌入、行并行层的 bias）在两个 rank 上得到相同的梯度：不开 sequence parallel 时进入它们的激活在每个 rank 上都完整、
# 相同，不需要额外归约（逐个参数的表折叠在下面）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def full_grad(name, row):
    shards = [r["grads"][name] for r in tp2]
    return gather(shards, row["partition_dim"], row["stride"]) if row["split"] else shards[0]


grad_rows = []
for row in tp2[0]["rows"]:
    name = row["name"]
    diff = (full_grad(name, row) - tp1["grads"][name]).abs().max().item()
    replicas_equal = "-" if row["split"] else torch.allclose(tp2[0]["grads"][name], tp2[1]["grads"][name], atol=1e-7)
    grad_rows.append([name, row["partition_dim"] if row["split"] else "复制", replicas_equal, diff < 1e-6])
print("报告（loss 之和）TP=2 == TP=1:", all(torch.allclose(a["lm loss"], b["lm loss"], atol=1e-5)
                                        for a, b in zip(tp2[0]["reports"], tp1["reports"])))
Folded(f"TP=2 的 {len(grad_rows)} 个梯度与 TP=1 逐个比较（全部相同）",
       Table(["参数", "partition_dim", "两 rank 的复制梯度相同", "拼回后与 TP=1 的差 < 1e-6"], grad_rows))

# %% [markdown]
# ## 机制解释
#
# ### loss 被谁除以什么
#
# 同一个模型、同样两个 micro-batch（16 个和 6 个 token），换 `loss_func` 的写法各跑一次 schedule（TP=1，除法与 TP
# 无关），拿梯度和两个用普通 autograd 算出的目标比：**micro-batch 平均的平均** `(和₁/16 + 和₂/6) / 2`，和**全局
# token 平均** `(和₁ + 和₂) / 22`。最后一次打开 `calculate_per_token_loss`：这时除法交给 `finalize_model_grads`，
# 它调的 `scale_gradients` 是 DDP 的方法，所以这一次把模型包进了 DDP。页首的图画的就是这张表：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("两个目标的值:", {k: round(v, 4) for k, v in targets.items()}, " 全局 token 数:", sum(tokens_kept(TINY)))
Table(["loss_func 的写法", "train_step 记下的 lm loss", "梯度 = micro-batch 平均的平均", "梯度 = 全局 token 平均"], divides)

# %% [markdown]
# 1. **3 个值（正式入口缺省）**：每个 micro-batch 先除以自己的 token 数，所以 6 个 token 的 micro-batch 与 16 个的权重相同，
#    **优化的是 micro-batch 平均的平均**（3.4724），日志却记全局 token 平均（3.4675）。两者只在各 micro-batch 的 token 数
#    不同时才不一样，而 packing、`eod_mask_loss`、SFT 只算回答部分的 mask 都会让它们不同。
# 2. **2 个值，报告就是 loss 本身**（simple loop）：梯度没错，日志里的 loss 被原地除法减半（1.7362 = 3.4724 / 2）。
# 3. **`loss.detach()`**：与原张量共享存储，原地除法照样改到它，结果同第 2 行。
# 4. **`loss.detach().clone()`**：独立的存储，日志正确。
# 5. **`calculate_per_token_loss=True`**：schedule 不除，把每个 micro-batch 的 token 数累加后交给
#    `finalize_model_grads_func`（[schedules.py 第 839–841 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L839-L841)）；
#    `finalize_model_grads` 把它从最后一个 PP stage 广播、在 dp-cp 群求和，再把梯度乘 `1 / 全局 token 数`
#    （[finalize_model_grads.py 第 680–696 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L680-L696)）。
#    这时优化的才是全局 token 平均，与日志一致；DDP 在这个开关下也不再乘 1/DP（[笔记 06](../06_gradient_sync_and_optimizer/)）。
#
# **为什么 loss 交"和"给 schedule。** `loss_func` 只看见一个 micro-batch，不知道一共几个 micro-batch、几个 DP rank、
# 多少 token。返回 `(和, 个数)` 把"除以什么"留给知道的人：缺省由 schedule 按 micro-batch 归一，打开开关则由
# `finalize_model_grads` 按全局 token 数归一。报告也是 `(和, 个数)`，所以日志总能算出准确的全局 token 平均。
#
# **原地缩放。** `forward_step_calc_loss` 用 `/=` 改的是 `loss_func` 返回的那个张量，`backward_step` 随后从它开始反向。
# 原地操作省一次分配，也让"交回 schedule 的张量"和"被反向的张量"是同一个对象；代价是任何与它共享存储的张量都跟着变。
#
# **反向的通信是前向的镜像。** 前向做 all-reduce 的地方（g：行并行的输出、词嵌入）反向不通信；前向不通信的地方
# （f：列并行层的输入）反向做 all-reduce。交叉熵是例外：前向 3 次、反向 0 次，它的反向只用本地保存的 softmax 分片。
# 三次 `[s, b]` 的 all-reduce 代替了一次 `[s, b, V]` 的 all-gather，真实词表 V ≈ 15 万时差着数量级。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这是 `train_step` 的核心：`forward_backward_func(...)` 返回时每个参数的梯度已经累加好；有 DDP 时它在 `main_grad` 里，
# 并在 `finalize_model_grads` 里完成 DP 归约，之后 `optimizer.step()` 更新参数（都在[笔记 06](../06_gradient_sync_and_optimizer/)）。
# simple loop 用 `num_microbatches=1` 调同一个 schedule，没有把 `finalize_model_grads` 设进 `config.finalize_model_grads_func`，
# 所以之后手动调一次。PP>1 时同一套 `forward_step` / `loss_func` 交给 1F1B schedule，`loss_func` 只在最后一个 stage 上
# 调用（[笔记 13](../13_pipeline_schedules/)，那里也用到本篇的缩放规则）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **梯度累加**：m 个 micro-batch 的梯度相加；每个 loss 先除以 m，累加的结果就是"平均 loss"的梯度。问题只在"平均"
#   按什么加权：每个 micro-batch 等权，还是每个 token 等权。
# - **交叉熵与 log-sum-exp**：`CE = logsumexp(z) − z_y`，先减最大值保证数值稳定；梯度是 `softmax(z) − onehot(y)`。
# - **autograd 与原地操作**：`detach()` 返回共享存储、不带梯度的张量，`clone()` 才复制存储。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **simple loop 的日志 loss 被除以 micro-batch 数。** 它的 `loss_func` 把被反向的那个张量直接放进报告，
#    schedule 的原地 `/= num_microbatches` 也改了日志值（「机制解释」表的第 2 行）。simple loop 用 `num_microbatches=1`，
#    看不出来；改成 2 就减半。
# 2. **缺省设置下，日志与优化目标不是同一个数。** 正式入口优化"micro-batch 平均的平均"，日志记"全局 token 平均"
#    （第 1 行与第 5 行）；只有 `--calculate-per-token-loss` 让两者一致，hybrid CP 也要求打开它
#    （[arguments.py 第 1409 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1409)）。
# 3. **CP 在两种写法里的处理不同。** 2 个值时 schedule 乘 CP 大小，3 个值时不乘（上面直接调 `forward_step_calc_loss`
#    的表）。哪种 `loss_func` 配哪种处理才对，[笔记 16](../16_context_parallel/) 在 CP=2 上逐一跑过。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部 rank 是本机的 gloo 进程；模型在 CPU 上初始化（`use_cpu_initialization=True`），去掉 dropout，所以 TP=2 与 TP=1
#   可以逐元素比较。
# - `forward_step_calc_loss` 那张表直接在笔记进程里调，不起进程：给了 `cp_group_size` 和 `is_last_stage`，它就不查并行状态。
# - CPU 上要的其他改动（`.cuda()` 调用等）见 [CPU 补丁一览](../../cpu/)。
#
# </details>

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

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(Counter(c.phase for c in calls[:half]), {c.api for c in calls}, {c.group for c in calls})

# %% [markdown]
# **2. TP=2 时输出层给每个 rank 的 logits 是什么 shape？交叉熵为什么不用先把它们拼起来？**
#
# <details><summary>答案</summary>
#
# `[b, s, V/TP] = [2, 8, 16]`（`parallel_output=True`）。交叉熵只需要每个 token 的最大 logit、目标 logit、Σexp 三个数，
# 三次 `[s, b]` 的 all-reduce 就够，不必交换 `[s, b, V]` 的 logits。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
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

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(what_the_schedule_does(masked_token_sum), what_the_schedule_does(masked_token_sum, per_token=True))
print([(label, a, b) for label, _, a, b in outcomes if label.startswith("3 个值")])

# %% [markdown]
# **4. 报告里放 `loss.detach()` 能避免日志被原地除法改掉吗？**
#
# <details><summary>答案</summary>
#
# 不能。`detach()` 与原张量共享存储，schedule 的 `/= num_microbatches` 同样改到它；要用 `loss.detach().clone()`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
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

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(name.split("decoder.")[-1], same) for name, dim, same, _ in grad_rows if "layernorm.weight" in name])

# %% [markdown]
# ## 30-second answer
#
# `forward_step` returns the per-token loss `[b, s]` and `partial(loss_func, loss_mask, model=model)`. `pretrain_gpt.loss_func` returns
# the masked sum, the token count and a `[sum, count]` report; the schedule divides the sum in place by the count and by
# the number of micro-batches, so by default Megatron optimizes the mean of micro-batch means while logging the global
# token mean; only `calculate_per_token_loss` (division by the global token count in `finalize_model_grads`) makes them
# the same. A two-value `loss_func` is multiplied by the CP size and divided by the micro-batch count in place, which also
# divides a report that shares its storage too. The output layer is column-parallel with `parallel_output=True`; vocab-parallel
# cross entropy needs three `[s, b]` all-reduces. At TP=2 one micro-batch of a one-layer model costs 6 forward and 3
# backward all-reduces.
