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
# # 09 TP 的通信原语：mappings.py 里的 f、g 和它们的伙伴
#
# 把一个矩阵乘按列或按行切到几个 TP rank 上之后，激活和梯度在哪一步要合起来、用哪个 collective、在哪个群？
# Megatron 把这些通信写成 `megatron/core/tensor_parallel/mappings.py` 里一组**可求导的函数**：正向做一件事，
# 反向由 autograd 自动做它的转置。本篇在 2 个 rank 上把 12 个公开函数
# （外加一个参数变体，共 13 个调用）正向、反向各跑一次，看每次发出什么、shape 怎么变、为什么正反向必须成对。

# %% [markdown]
# ## 阅读目标
#
# 1. 对 `mappings.py` 的每个公开函数，说出它正向、反向各发哪个 collective（或不通信），在哪个群，shape 怎么变。
# 2. 说清 f（`copy_to_tensor_model_parallel_region`）和 g（`reduce_from_tensor_model_parallel_region`）为什么互为共轭，其余几对又是哪几对。
# 3. 说清"最后一维"的 gather / reduce-scatter 在通信层面其实沿**第一维**做，然后再重排。
# 4. 知道 g 会原地改写输入、f 的反向会原地改写上游梯度，以及非连续输入在旧版与 0.19.0 的区别。
#
# **结论**
#
# - **f 与 g 互为共轭**：f 正向不通信、反向 `all_reduce`，g 相反；f → 各 rank 不同的计算 → g，两个 rank 的 `y` 和 `x.grad` 都是 `3.0`。
# - **反向做正向的转置**：13 个调用每个 rank 共发 20 个 collective，从记录算出 7 对共轭（复制 ↔ 求和、切分 ↔ 拼接、all-gather ↔ reduce-scatter …）。
# - **"最后一维"的通信沿第一维做**：先 `all_gather_into_tensor` 成 `[8, 2, 6]`，再重排成 `[4, 2, 12]`。
# - **同一个正向，两种反向**：`tensor_parallel_output_grad=True` 把梯度相加（都得 `3.0`），`False` 只取自己那块（`1.0` / `2.0`）。
# - **g 原地改写连续的输入**；不连续时 0.19.0 返回副本的全和 `[[10.0, 14.0], [12.0, 16.0]]`。
# - **不等分 all-to-all 的反向对调两张 split 表**：rank 0 正向发 `[1, 3]`、收 `[1, 2]`，反向正好反过来。
#
# 先读：[笔记 08](../08_parallel_state_and_rank_generator/)（TP 群由哪几个 rank 组成）；约 18 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch

from snippets.record import recorder
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n09_mappings import (MAPPINGS, change, conjugate_pairs, issuer_table, mappings_by_name,
                                               phase_signature, record_rows, record_table, run_every_mapping,
                                               signatures)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp import pictures

from megatron.core import parallel_state
from megatron.core.tensor_parallel import mappings

TINY = EXPERIMENTS["mappings"].tiny
runs = run_ranks(run_every_mapping, 2, TINY, 2)  # 13 个调用，每个正向一次、反向一次，录下每个 collective
pictures.draw_mappings(record_rows(runs[0]), only=["copy_to_tensor_model_parallel_region (f)",
                                                  "reduce_from_tensor_model_parallel_region (g)"],
                       box_w=100, mid_w=170, title="f 与 g 互为共轭（TP=2）：f 正向不通信、反向 all_reduce；g 正好相反")

# %% [markdown]
# <details><summary>本页怎么跑出来的</summary>
#
# - 每个 rank 是本机上的一个进程，走 gloo。`snippets.ranks.launch.run_ranks(fn, 2, ...)` fork 出 2 个 rank 执行 `fn`，
#   把返回值送回 notebook 打印；下面每个单元格都是一个直接调 `mappings` 的小 rank 函数加一行 `run_ranks`。
# - 上面那张图来自主实验 `snippets/experiments/n09_mappings.py`：`run_every_mapping` 在 TP=2 的群里对 13 个调用
#   （`mappings_by_name`；`gather_from_sequence_parallel_region` 多一个 `tensor_parallel_output_grad=False` 的变体）各做一次
#   正向、一次反向。输入 `x` 是 `[s, b, h] = [4, 2, 6]`（实验的 `tiny` 尺寸），数值是 `0…47` 加 `100 × rank`（百位就是来源 rank），
#   上游梯度 `dy` 也按 rank 不同；同时记下调用之后 `x`、`dy` 有没有被改写。值都是小整数，求和是精确的。
# - `snippets.record.recorder.record()` 录下代码块里的每个 collective：API、群、collective 自己的缓冲区 shape（通信前 / 通信后）、
#   phase（autograd 执行反向时发出的记 `backward`；本页其余的都在模型正向里，记 `forward`）、发出它的最内层 Megatron 函数。
#   "含义"一栏按这个函数查 `recorder.MEANINGS`；同一个 helper 在不同公开函数里含义不同时，用模块里的 `IN_CONTEXT` 覆盖。
# - 复现主实验的表（记录表、发出者表、签名表、共轭对表）：
#   `.venv/bin/python -m snippets.run --nproc-per-node 2 mappings --tp 2`；真实激活大小下的同一批调用：
#   `.venv/bin/python -m snippets.run --nproc-per-node 8 mappings --dims qwen3-8b --tp 8`。重跑整页：
#   `scripts/execute_notes.sh notes/09_tp_mappings.py`。
# - CPU 上需要的补丁只有 `current_device`（mappings 用 `torch.cuda.current_device()` 分配输出缓冲），见 [CPU 页](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(mappings_by_name, run_every_mapping)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`mappings.py::copy_to_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L492) | f：正向恒等，反向 all-reduce |
# | [`mappings.py::reduce_from_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L498) | g：正向 all-reduce，反向恒等 |
# | [`scatter_to_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L504) / [`gather_from_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L510) | 最后一维：切分 ↔ all-gather |
# | [`scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L516) / [`gather_from_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L522) | 第一维：切分 ↔ all-gather；后者反向 reduce-scatter（或切分） |
# | [`reduce_scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L536) | 第一维：正向 reduce-scatter，反向 all-gather |
# | [`all_gather_last_dim_from_tensor_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L546) / [`reduce_scatter_last_dim_to_tensor_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L552) | 最后一维：all-gather ↔ reduce-scatter |
# | [`all_to_all`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L558) / [`all_to_all_sp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L566) / [`all_to_all_hp2sp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L595) | 第一维 all-to-all（可不等分）；`[tokens/TP, H]` ↔ `[tokens, H/TP]` |
#
# <details><summary>私有 helper 与取群函数（10 行）</summary>
#
# | 符号 | 角色 |
# |---|---|
# | [`mappings.py::_reduce`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L22) | all-reduce 并返回结果：输入连续时就是原地（f 的反向、g 的正向） |
# | [`mappings.py::_GatherFromSequenceParallelRegion.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L332) | 按 `tensor_parallel_output_grad` 选 reduce-scatter 还是切分 |
# | [`mappings.py::_CopyToModelParallelRegion`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L201) | f 背后的 autograd Function（其余 9 个同构，见调用链） |
# | [`mappings.py::_AllToAll.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L470) | 反向再做一次 all-to-all，输入输出 split 对调 |
# | [`mappings.py::_gather_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L84) | 沿第一维 all-gather，再切块、沿最后一维拼 |
# | [`mappings.py::_reduce_scatter_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L103) | 先把最后一维的块竖着摞起来，再沿第一维 reduce-scatter |
# | [`mappings.py::_gather_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L118) | `all_gather_into_tensor`；给了 split 时用 `all_gather` |
# | [`mappings.py::_reduce_scatter_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L159) | `reduce_scatter_tensor`；给了 split 时用 `reduce_scatter` |
# | [`mappings.py::_split_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L40) / [`_split_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L60) | 本地切片，不通信 |
# | [`utils.py::get_tensor_model_parallel_group_if_none`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L573) | 没传 `group` 时取全局 TP 群（并警告将来必须传） |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 每个公开函数都是两行：取群，`apply` 一个 autograd Function；它的 `forward`、`backward` 各调一个私有 helper，
# collective 在 helper 里。`group` 缺省时（`all_to_all` 除外，它必须给群）经 `get_tensor_model_parallel_group_if_none`
# 取全局 TP 群；本篇都显式传 `group=tp`。
#
# <details><summary>完整调用链</summary>
#
# 右边是 TP=2 时的通信：
#
# ```text
# megatron/core/tensor_parallel/mappings.py
# ├─ copy_to_tensor_model_parallel_region              (f)
# │  └─ _CopyToModelParallelRegion                 fwd: 恒等                        bwd: _reduce → all_reduce
# ├─ reduce_from_tensor_model_parallel_region          (g)
# │  └─ _ReduceFromModelParallelRegion             fwd: _reduce → all_reduce        bwd: 恒等
# ├─ scatter_to_tensor_model_parallel_region
# │  └─ _ScatterToModelParallelRegion              fwd: _split_along_last_dim       bwd: _gather_along_last_dim → all_gather_into_tensor
# ├─ gather_from_tensor_model_parallel_region
# │  └─ _GatherFromModelParallelRegion             fwd: _gather_along_last_dim      bwd: _split_along_last_dim
# ├─ scatter_to_sequence_parallel_region
# │  └─ _ScatterToSequenceParallelRegion           fwd: _split_along_first_dim      bwd: _gather_along_first_dim → all_gather_into_tensor
# ├─ gather_from_sequence_parallel_region
# │  └─ _GatherFromSequenceParallelRegion          fwd: _gather_along_first_dim     bwd: _reduce_scatter_along_first_dim → reduce_scatter_tensor
# │                                                                                （tensor_parallel_output_grad=False 时: _split_along_first_dim）
# ├─ reduce_scatter_to_sequence_parallel_region
# │  └─ _ReduceScatterToSequenceParallelRegion     fwd: _reduce_scatter_along_first_dim   bwd: _gather_along_first_dim
# ├─ all_gather_last_dim_from_tensor_parallel_region
# │  └─ _AllGatherFromTensorParallelRegion         fwd: _gather_along_last_dim      bwd: _reduce_scatter_along_last_dim
# │                                                                                     └─ _reduce_scatter_along_first_dim
# ├─ reduce_scatter_last_dim_to_tensor_parallel_region
# │  └─ _ReduceScatterToTensorParallelRegion       fwd: _reduce_scatter_along_last_dim   bwd: _gather_along_last_dim
# ├─ all_to_all(group, x, output_split_sizes_, input_split_sizes, use_nccl_stream=False)
# │  └─ _AllToAll                                  fwd: all_to_all_single           bwd: _AllToAll.apply（split 对调）
# │                                                （use_nccl_stream=True 时改成 async_op=True 再立即 wait）
# ├─ all_to_all_sp2hp     reshape → 沿 hidden 切块、沿 token 摞 → all_to_all
# └─ all_to_all_hp2sp     reshape → all_to_all → 沿 token 切块、沿 hidden 拼
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# 12 个公开函数的答案只在"怎么切、怎么通信"上不同，那部分见下面的记录表。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `copy_to_tensor_model_parallel_region`（f） | 激活 `x`、群 | 同一个 `x` | `_CopyToModelParallelRegion`、`_reduce` | TP 群（反向） | 否 | 否；反向原地改写上游梯度 | `forward_backward_func` 里模型的 forward / backward |
# | `reduce_from_tensor_model_parallel_region`（g） | 部分和 | 全和 | `_ReduceFromModelParallelRegion`、`_reduce` | TP 群（正向） | 否（合并部分和） | 否；正向原地改写输入 | 同上 |
# | `scatter_to_tensor_model_parallel_region` | 完整 `[.., h]` | `[.., h/tp]` | `_split_along_last_dim`、`_gather_along_last_dim` | TP 群（反向） | 是，最后一维 | 否 | 同上 |
# | `gather_from_tensor_model_parallel_region` | `[.., h/tp]` | `[.., h]` | `_gather_along_last_dim`、`_split_along_last_dim` | TP 群（正向） | 是，最后一维 | 否 | 同上 |
# | `scatter_to_sequence_parallel_region` | `[s, ..]` | `[s/tp, ..]` | `_split_along_first_dim`、`_gather_along_first_dim` | TP 群（反向） | 是，sequence 维 | 否 | 同上 |
# | `gather_from_sequence_parallel_region` | `[s/tp, ..]` | `[s, ..]` | `_gather_along_first_dim`、`_reduce_scatter_along_first_dim` | TP 群（两个方向） | 是，sequence 维 | 否 | 同上 |
# | `reduce_scatter_to_sequence_parallel_region` | 部分和 `[s, ..]` | `[s/tp, ..]` | `_reduce_scatter_along_first_dim`、`_gather_along_first_dim` | TP 群（两个方向） | 是，sequence 维 | 否 | 同上 |
# | `all_gather_last_dim_from_tensor_parallel_region` | `[.., h/tp]` | `[.., h]` | `_gather_along_last_dim`、`_reduce_scatter_along_last_dim` | TP 群（两个方向） | 是，最后一维 | 否 | 同上 |
# | `reduce_scatter_last_dim_to_tensor_parallel_region` | 部分和 `[.., h]` | `[.., h/tp]` | 同上，方向相反 | TP 群（两个方向） | 是，最后一维 | 否 | 同上 |
# | `all_to_all` | `[n, ..]`、两张 split 表 | `[sum(out_splits), ..]` | `_AllToAll` | 调用方给的群（MoE 里是 EP 群） | 是，第一维重新分配 | 否 | 同上 |
# | `all_to_all_sp2hp` | `[tokens/tp, h]` | `[tokens, h/tp]` | `all_to_all` | TP 群（两个方向） | 是，token 维 ↔ hidden 维 | 否 | 同上 |
# | `all_to_all_hp2sp` | `[tokens, h/tp]` | `[tokens/tp, h]` | `all_to_all` | TP 群（两个方向） | 是，hidden 维 ↔ token 维 | 否 | 同上 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# 关键对象就是这些函数本身，以及每个 rank 手里张量的三种"分布"：每个 rank 一份相同的（replicated）、按某一维切开的
# （sharded）、各持一个加数的（partial）。每个映射把一种分布变成另一种，反向再变回来。
#
# 最重要的一对是 f 和 g：TP 的 MLP 里，列并行层的入口放 f（同一份激活交给各 rank），行并行层的出口放 g（把部分和加起来）。
# 下面不借任何层，把 f 和 g 夹在一段"每个 rank 算不同东西"的计算两边：rank `r` 把输入乘以 `r + 1`，相当于它那一半权重的贡献。

# %%
def f_then_g():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = parallel_state.get_tensor_model_parallel_group()
    r = parallel_state.get_tensor_model_parallel_rank()
    x = torch.ones(2, 3, requires_grad=True)  # 两个 rank 上相同的激活（replicated）
    with recorder.record() as calls:
        h = mappings.copy_to_tensor_model_parallel_region(x, group=tp)  # f
        part = h * (r + 1)  # 各 rank 算自己的一份（partial）
        y = mappings.reduce_from_tensor_model_parallel_region(part, group=tp)  # g
        y.backward(torch.ones_like(y))
    return y[0, 0].item(), x.grad[0, 0].item(), [(c.phase, c.api, c.where.split("::")[-1]) for c in calls]


for r, (y, grad, calls) in enumerate(run_ranks(f_then_g, 2)):
    print(f"rank {r}: y = {y}  x.grad = {grad}  通信: {calls}")

# %% [markdown]
# 两个 rank 的 `y` 都是 `3.0 = 1 + 2`：g 在正向把部分和加起来。反向时，autograd 交给每个 rank 的只是"它那一份"对 `x`
# 的梯度（rank 0 是 1，rank 1 是 2），而两个 rank 上的 `x` 是**同一份**激活的副本，真正的梯度是两份之和——f 的反向正是这次
# all-reduce，于是两边的 `x.grad` 都是 `3.0`。两次 `all_reduce` 一次在 forward（g），一次在 backward（f），发出者都是
# `_reduce`。少了 f，各 rank 的 `x.grad` 停在 1 和 2，更上游的参数在两个 rank 上各自走偏。
#
# 这就是整个文件的写法：[`_CopyToModelParallelRegion`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L201)
# 的 `forward` 原样返回、`backward` 调 `_reduce`；g 背后的 Function 反过来。模型代码只写正向，反向的 collective 由 autograd
# 按逆序自动发出。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 13 个调用的通信记录
#
# 13 个调用各跑一次正向、一次反向，每个 rank 的张量经过哪个 collective（开头那张图是其中的 f 和 g）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pictures.draw_mappings(record_rows(runs[0]))

# %% [markdown]
# 图就是下面这张表：每个函数、每个方向一行，不通信的方向记作 `—`。"通信前 / 通信后"是 collective 的缓冲区 shape，
# "张量"是函数层面的（正向 `x → y`，反向 `dy → dx`）。通信都在 TP 群 `[0, 1]` 里；phase 是模型正向里的 forward 或 autograd 里的 backward。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("每个 rank 跑了", len(runs[0]), "个调用；记录到的 collective 条数（rank 0, rank 1）:",
      [sum(len(r["calls"]) for r in rank_runs.values()) for rank_runs in runs])
record_table(runs[0])

# %% [markdown]
# rank 1 的记录和 rank 0 完全一样（同样的 API、群、shape、顺序；折叠的单元格核对）。读表：
#
# - **`scatter_to_tensor_model_parallel_region` 正向不通信**（本地切片），反向才 all-gather。
# - **all-to-all 三兄弟**：sp2hp、hp2sp 都先 reshape 成二维 `[tokens, h]`，`[4, 2, 6]` 的输出不再有 batch 维。
# - **"最后一维"的 gather 和 reduce-scatter 在通信层面都沿第一维**，下面单独看。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(record_rows(runs[0]) == record_rows(runs[1]))

# %% [markdown]
# ### "最后一维"的通信沿第一维做
#
# 直接调两个沿最后一维的函数，看 collective 的缓冲区：

# %%
def last_dim_gather_and_reduce_scatter():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = parallel_state.get_tensor_model_parallel_group()
    x = torch.zeros(4, 2, 6)  # [s, b, h]
    with recorder.record() as calls:
        gathered = mappings.gather_from_tensor_model_parallel_region(x, group=tp)
        scattered = mappings.reduce_scatter_last_dim_to_tensor_parallel_region(x, group=tp)
    return calls, list(gathered.shape), list(scattered.shape)


calls, gathered, scattered = run_ranks(last_dim_gather_and_reduce_scatter, 2)[0]
for c in calls:
    print(f"{c.where.split('::')[-1]:32} {c.api:24} {c.before} → {c.after}")
print("函数输出:", gathered, scattered)

# %% [markdown]
# `gather_from_tensor_model_parallel_region` 的 `all_gather_into_tensor` 是 `[4, 2, 6] → [8, 2, 6]`，之后
# [`_gather_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L84)
# 才切块、沿最后一维拼成 `[4, 2, 12]`。`reduce_scatter_last_dim_to_tensor_parallel_region` 反过来：先把 `[8, 6]`（token × hidden）
# 沿 hidden 切成两块竖着摞成 `[16, 3]`，再 `reduce_scatter_tensor` 成 `[8, 3]`
# （[`_reduce_scatter_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L103)），
# 所以发出者是 `_reduce_scatter_along_first_dim`。原因：`all_gather_into_tensor` / `reduce_scatter_tensor` 把张量当作一段连续内存，
# 按第一维拼接和切分；沿最后一维的块在内存里不连续，只能先重排。读 profiler 时，最后一维的 gather 看起来就是第一维的。
#
# 下表是 13 个调用各由哪个私有 helper 发出；all-to-all 三行的 `forward` 指 `_AllToAll.forward`，反向也是再调一次它。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
issuer_table(runs[0])

# %% [markdown]
# ### 数值：和单进程参考逐个比
#
# 在主进程里只用 `cat` / `chunk` / 加法写出每个函数"应该"给 rank `r` 的正向输出和输入梯度（折叠的参考表就是每个函数的
# 定义），13 个调用的正向、反向都与它逐元素相等。同一张表的最后两列是两个**副作用**，都来自
# [`mappings.py::_reduce`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L22)：
# 它先取输入的连续版本（输入本就连续时就是它自己），对它 all-reduce 再返回，所以连续的输入被**原地**改写。g 的正向因此把
# 调用方的 `x` 改成了全和；f 的反向把 autograd 递来的上游梯度 `dy` 改成了全和。在 `RowParallelLinear` 里，g 的输入是矩阵乘的
# 临时结果，没有别人再用，所以无害；自己调用 g 时要记得输入会被覆盖（遗留问题 1 看不连续的情形）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def half(t, dim, r):
    return t.chunk(2, dim)[r]


def tokens(t):
    return t.reshape(-1, t.shape[-1])  # [s, b, h] -> [s·b, h]


REFERENCE = {  # name: (rank r 的正向输出, rank r 的输入梯度)，x、dy 是两个 rank 的列表
    "copy_to_tensor_model_parallel_region (f)":
        (lambda x, r: x[r], lambda dy, r: dy[0] + dy[1]),
    "reduce_from_tensor_model_parallel_region (g)":
        (lambda x, r: x[0] + x[1], lambda dy, r: dy[r]),
    "scatter_to_tensor_model_parallel_region":
        (lambda x, r: half(x[r], -1, r), lambda dy, r: torch.cat(dy, -1)),
    "gather_from_tensor_model_parallel_region":
        (lambda x, r: torch.cat(x, -1), lambda dy, r: half(dy[r], -1, r)),
    "scatter_to_sequence_parallel_region":
        (lambda x, r: half(x[r], 0, r), lambda dy, r: torch.cat(dy, 0)),
    "gather_from_sequence_parallel_region":
        (lambda x, r: torch.cat(x, 0), lambda dy, r: half(dy[0] + dy[1], 0, r)),
    "gather_from_sequence_parallel_region [output_grad=False]":
        (lambda x, r: torch.cat(x, 0), lambda dy, r: half(dy[r], 0, r)),
    "reduce_scatter_to_sequence_parallel_region":
        (lambda x, r: half(x[0] + x[1], 0, r), lambda dy, r: torch.cat(dy, 0)),
    "all_gather_last_dim_from_tensor_parallel_region":
        (lambda x, r: torch.cat(x, -1), lambda dy, r: half(dy[0] + dy[1], -1, r)),
    "reduce_scatter_last_dim_to_tensor_parallel_region":
        (lambda x, r: half(x[0] + x[1], -1, r), lambda dy, r: torch.cat(dy, -1)),
    "all_to_all":
        (lambda x, r: torch.cat([half(t, 0, r) for t in x]), lambda dy, r: torch.cat([half(t, 0, r) for t in dy])),
    "all_to_all_sp2hp":
        (lambda x, r: half(torch.cat([tokens(t) for t in x], 0), -1, r),
         lambda dy, r: half(torch.cat(dy, -1), 0, r).reshape(4, 2, 6)),
    "all_to_all_hp2sp":
        (lambda x, r: half(torch.cat([tokens(t) for t in x], -1), 0, r),
         lambda dy, r: half(torch.cat(dy, 0), -1, r).reshape(4, 2, 6)),
}


def matches(name, which, key):
    ref = REFERENCE[name][which]
    inputs = [runs[r][name]["x" if which == 0 else "dy"] for r in range(2)]
    return all(torch.equal(runs[r][name][key], ref(inputs, r)) for r in range(2))


Table(["函数", "正向 = 参考", "反向 = 参考", "x 被原地改写", "dy 被原地改写"],
      [[name, matches(name, 0, "y"), matches(name, 1, "dx"),
        any(runs[r][name]["x_overwritten"] for r in range(2)),
        any(runs[r][name]["dy_overwritten"] for r in range(2))] for name in MAPPINGS])

# %% [markdown]
# ### 不等分的 all-to-all（MoE 的用法）
#
# `all_to_all(group, x, output_split_sizes_, input_split_sizes)` 在 MoE 的 token dispatcher 里按专家把 token
# 发往各 EP rank，每个 rank 发多少行各不相同。`SEND[i][j]` 是 rank `i` 发给 rank `j` 的行数；rank `r` 的
# `input_split_sizes` 是第 `r` 行，`output_split_sizes` 是第 `r` 列：

# %%
SEND = [[1, 3],
        [2, 2]]


def run_all_to_all_v():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp, r = parallel_state.get_tensor_model_parallel_group(), parallel_state.get_tensor_model_parallel_rank()
    x = (torch.arange(48.0).reshape(4, 2, 6) + 100 * r).requires_grad_()
    with recorder.record() as calls:
        y = mappings.all_to_all(tp, x, [SEND[j][r] for j in range(2)], SEND[r])
        y.backward(torch.ones_like(y) * (r + 1))
    return calls, x.detach(), y.detach(), x.grad


v = run_ranks(run_all_to_all_v, 2)
Table(["rank", "phase", "API", "通信前", "通信后", "input_split_sizes", "output_split_sizes"],
      [[r, c.phase, c.api, c.before, c.after, c.extra["input_split_sizes"], c.extra["output_split_sizes"]]
       for r, (calls, *_) in enumerate(v) for c in calls])

# %% [markdown]
# 反向是同一个 `_AllToAll` 再做一次，两张 split 表对调
# （[`_AllToAll.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L470)）：
# 梯度沿原路返回。数值上，rank `r` 收到的是每个 rank 发给它的那几行，按来源 rank 依次排列（与参考逐元素相等）。反向时每个
# rank 给自己收到的行的上游梯度是 `rank + 1`，于是 rank 1 的 `x` 里，发去 rank 0 的前两行梯度是 1，留在本地的后两行是 2：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def a2a_v_reference(xs, r):
    return torch.cat([xs[j].split(SEND[j])[r] for j in range(2)])


xs = [v[r][1] for r in range(2)]
print("正向 = 参考:", all(torch.equal(v[r][2], a2a_v_reference(xs, r)) for r in range(2)))
print("rank 1 的 x 每行的梯度:", v[1][3][:, 0, 0].tolist())

# %% [markdown]
# ## 机制解释
#
# ### 共轭对：从记录表算出来
#
# 把每个函数每个方向概括成一个"签名"：发了哪些 collective（或不通信），加上张量 shape 怎么变（按 `[token, hidden]` 看：
# 前几维之积是 token 数，最后一维是 hidden）。A 的正向签名等于 B 的反向签名、且 A 的反向签名等于 B 的正向签名，A、B
# 就是一对共轭。只用录到的数据（折叠的单元格）算出 7 对：f ↔ g；两种维度上的 scatter ↔ gather（sequence 维配
# `output_grad=False` 的变体）；sequence 维的 gather ↔ reduce-scatter；最后一维的 all-gather ↔ reduce-scatter；sp2hp ↔ hp2sp；等分 all-to-all 与自己。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(change, phase_signature, conjugate_pairs)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
sig = signatures(runs[0])
Table(["函数", "正向签名", "反向签名"], [[name, f, b] for name, (f, b) in sig.items()])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pairs = conjugate_pairs(sig)
Table(["A", "B（A 的共轭）"], pairs)

# %% [markdown]
# **为什么正反向必须成对。** 每个函数都是线性映射，反向算的是它的转置（伴随）。"复制一份给每个 rank"的转置是
# "把各 rank 的梯度加起来"，所以 f 的反向是 all-reduce；"把部分和加起来"的转置是"把梯度复制给每个部分"，所以 g 的反向
# 是恒等。切分的转置是拼接，拼接的转置是切分；all-gather 的转置是 reduce-scatter；按一张 split 表的 all-to-all，转置是
# 按对调后的表再做一次。
#
# ### 同一个正向，两种反向
#
# `gather_from_tensor_model_parallel_region` 和 `all_gather_last_dim_from_tensor_parallel_region` 正向完全一样，反向一个只切分、
# 一个 reduce-scatter。`gather_from_sequence_parallel_region` 把这两种反向做成一个参数 `tensor_parallel_output_grad`（缺省 `True`），
# 正好拿来对照。让 rank 0 的上游梯度全是 1、rank 1 全是 2：

# %%
def gather_then_two_backwards():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = parallel_state.get_tensor_model_parallel_group()
    r = parallel_state.get_tensor_model_parallel_rank()
    grads = {}
    for output_grad in (True, False):
        x = torch.zeros(2, 1, requires_grad=True)  # 本 rank 的 2 个 token
        y = mappings.gather_from_sequence_parallel_region(
            x, tensor_parallel_output_grad=output_grad, group=tp)  # [4, 1]：全部 4 个 token
        y.backward(torch.full_like(y, r + 1.0))
        grads[output_grad] = x.grad.flatten().tolist()
    return grads


for r, grads in enumerate(run_ranks(gather_then_two_backwards, 2)):
    print(f"rank {r}: output_grad=True → x.grad {grads[True]}   output_grad=False → x.grad {grads[False]}")

# %% [markdown]
# 区别在 gather 之后的计算
# （[`_GatherFromSequenceParallelRegion.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L332)）：
#
# - 之后每个 rank 做**不同**的计算（例如 attention 把 QKV 收齐后只算自己的 head，或 SP 里的列并行层），各 rank 的 `dy` 是
#   部分梯度，要先相加再切——reduce-scatter，两个 rank 都得 `3.0`；
# - 之后每个 rank 做**完全相同**的计算（例如收齐后接同一个 loss），各 rank 的 `dy` 本来就是同一份梯度，只需取自己那块——
#   切分，rank 0 得 `1.0`、rank 1 得 `2.0`。在这里用错参数，梯度会差 TP 倍或只剩一部分，而且不会报错。
#
# ### sequence parallel：把 g 的 all-reduce 拆成两半
#
# 不开 SP 时，TP 区域外的激活在每个 rank 上完整重复，进入区域用 f，离开用 g（all-reduce）。开 SP 后，区域外的激活按
# sequence 维切开：离开区域用 reduce-scatter，进入下一个区域用 all-gather。直接拿部分和走一遍这两步，和 g 比：

# %%
def all_reduce_in_two_halves():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = parallel_state.get_tensor_model_parallel_group()
    r = parallel_state.get_tensor_model_parallel_rank()
    partial = torch.arange(8.0).reshape(4, 2) * (r + 1)  # 各 rank 的部分和 [s, h]
    with recorder.record() as calls:
        shard = mappings.reduce_scatter_to_sequence_parallel_region(partial, group=tp)  # 离开 TP 区域
        full = mappings.gather_from_sequence_parallel_region(shard, group=tp)  # 进入下一个 TP 区域
    summed = mappings.reduce_from_tensor_model_parallel_region(partial.clone(), group=tp)  # 不开 SP：g
    return [(c.api, c.before, c.after) for c in calls], list(shard.shape), torch.equal(full, summed)


calls, shard, same = run_ranks(all_reduce_in_two_halves, 2)[0]
print("通信:", "；".join(f"{api} {before} → {after}" for api, before, after in calls))
print("两次通信之间每个 rank 只存", shard, "；收齐后与 g 的全和相同:", same)

# %% [markdown]
# all-reduce = reduce-scatter + all-gather（ring 实现下两步各传 `(p-1)/p` 份数据），通信量不变，而夹在中间的 LayerNorm、dropout 只处理、
# 只存 `[2, 2]`，即 1/TP 的激活。所以 SP 的这一对就是"另一对 f / g"：`gather_from_sequence_parallel_region` 管进入，
# `reduce_scatter_to_sequence_parallel_region` 管离开，它们在 `ColumnParallelLinear` / `RowParallelLinear` 里的具体位置见
# [笔记 10](../10_column_row_parallel_linear/)，反向多出的那两次 all-gather 见[笔记 11](../11_transformer_layer/)。

# %% [markdown]
# ## 与训练主链路的关系
#
# 它们都在模型 forward 里，反向由 autograd 带出，所以在 simple loop 的 `forward_backward_func` 之内。
# 0.19.0 的 `megatron/core` 里各自的调用处（不含 mappings.py）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import pathlib
import re

core = pathlib.Path(mappings.__file__).parents[1]
sources = {p.relative_to(core).as_posix(): p.read_text() for p in core.rglob("*.py")
           if p.name != "mappings.py"}


def callers(name):
    call = re.compile(rf"(?:(?<![\w.])|tensor_parallel\.|mappings\.){name}\(")
    return sorted(path for path, text in sources.items() if f"{name}(" in text and call.search(text))


public = [n.split(" ")[0] for n in MAPPINGS if "[" not in n]
Table(["函数", "调用处个数", "文件"], [[n, len(callers(n)), ", ".join(callers(n)) or "—"] for n in public])

# %% [markdown]
# - 线性层和 embedding（`layers.py`）用 f、g、最后一维的 scatter/gather 和 sequence 维的 reduce-scatter（笔记 10、12）；
#   开 SP 时 embedding 的出口用 sequence 维的 scatter 切开激活，`gpt_model.py` 推理只取最后一个 token 前用 sequence 维的 gather 收齐。
# - MoE 的 token dispatcher 在 EP 群里用不等分的 `all_to_all`（笔记 17）。
# - sp2hp / hp2sp 的调用者是 Mamba 的 context parallel：
#   [`mamba_context_parallel.py::_all_to_all_cp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/ssm/mamba_context_parallel.py#L305) 在 **CP 群**里调 sp2hp
#   （`_all_to_all_hp2cp` 对应 hp2sp）。`reduce_scatter_last_dim_to_tensor_parallel_region` 在 0.19.0 仍**没有调用者**。
#
# > **旧版（core_v0.18.0）：** Mamba 的 CP 在 `_all_to_all_cp2hp` 里自己 reshape、切块再直接调 `all_to_all`
# > （[core_v0.18.0 的 `_all_to_all_cp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/ssm/mamba_context_parallel.py#L304)），所以 `all_to_all_sp2hp` / `all_to_all_hp2sp`
# > 在那一版没有调用者，上表里它们是 0、`all_to_all` 是 2。

# %% [markdown]
# ## 与基础知识的连接
#
# - **autograd.Function**：`backward` 自己给出输入的梯度，通信原语由此成为"可求导的通信"；线性映射 `M` 的反向是 `Mᵀ`。
# - **张量的三种分布**：f 把 replicated 交给各 rank 独立使用（反向把 partial 梯度加起来），g 把 partial 变成 replicated，
#   reduce-scatter 把 partial 变成 sharded，all-gather 把 sharded 变成 replicated。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **g 原地改写输入；非连续输入时旧版 g 不求和，0.19.0 已修好（运行确认）。** 0.19.0 的 `_reduce` 先把 `input_` 换成它的
#    连续版本（[`mappings.py:34`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L34)），
#    对这一份做 all-reduce 并返回它（[`mappings.py:37`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L37)）。
#    下面把一个连续张量和一个转置过（不连续）的张量各交给 g：连续的被原地改成全和；不连续的输入不变，全和在新建的
#    连续副本里，由 g 返回。所以调用方必须用 g 的**返回值**。

# %%
def g_contiguous_and_transposed():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = parallel_state.get_tensor_model_parallel_group()
    r = parallel_state.get_tensor_model_parallel_rank()
    seen = []
    for transpose in (False, True):
        x = torch.arange(4.0).reshape(2, 2) + 10 * r
        x = x.t() if transpose else x  # .t() 之后不连续
        y = mappings.reduce_from_tensor_model_parallel_region(x, group=tp)
        seen.append((x.is_contiguous(), y.tolist(), x.tolist()))
    return seen


for r, seen in enumerate(run_ranks(g_contiguous_and_transposed, 2)):
    for contiguous, got, mine in seen:
        print(f"rank {r}: 连续={contiguous}  g 返回 {got}  调用后本 rank 的输入 {mine}")
print("转置输入应得的全和:", (torch.arange(4.0).reshape(2, 2).t() * 2 + 10).tolist())

# %% [markdown]
# > **旧版（core_v0.18.0）：** `_reduce` 对 `input_.contiguous()` 做 all-reduce，却返回原来的 `input_`
# > （[core_v0.18.0 的 mappings.py 第 31 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/tensor_parallel/mappings.py#L31)，core_v0.16.1 相同）。输入不连续时求和写进了临时副本，
# > 每个 rank 拿回的仍是自己的部分和（同一单元格在旧版打印的 `g 返回` 等于调用前本 rank 的输入）。Megatron 自己的调用处传的都是矩阵乘的连续输出，没有触发。
#
# 2. **docstring 与代码不一致（运行确认）。** `scatter_to_tensor_model_parallel_region` 的 docstring
#    （[`mappings.py:505`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L505)）
#    说正向是 RS（reduce-scatter），记录表里它的正向根本不通信，只是本地切片；`scatter_to_sequence_parallel_region`
#    的 docstring（[`mappings.py:517`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L517)）
#    说反向沿最后一维 all-gather，记录表里是沿第一维（token ×2）。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 2 个 gloo rank 代替 2 张 GPU；mappings 用 `torch.cuda.current_device()` 分配 all-gather 的输出缓冲
#   （[`mappings.py:95`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L95)），
#   CPU 上由 `current_device` 补丁让它返回 `"cpu"`（[CPU 页](../../cpu/)）。其余调用不需要补丁。
# - 尺寸 `[4, 2, 6]`、TP=2 是为了让每张表一屏看完；输入取小整数，求和在浮点里是精确的，可以用 `torch.equal` 比较。
# - 通信记录用"最内层的 Megatron 函数"给 collective 命名，所以最后一维的 reduce-scatter 被记成 `_reduce_scatter_along_first_dim`，
#   f 的反向和 g 的正向都记成 `_reduce`；记录表的"含义"一栏因此要结合调用它的公开函数（`IN_CONTEXT`）才说得清。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. f 和 g 各在正向、反向发什么 collective？**
#
# <details><summary>答案</summary>
#
# f：正向不通信，反向 all-reduce（TP 群）。g：正向 all-reduce，反向不通信。两者互为共轭。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("f:", sig["copy_to_tensor_model_parallel_region (f)"])
print("g:", sig["reduce_from_tensor_model_parallel_region (g)"])

# %% [markdown]
# **2. TP=2、输入 `[4, 2, 6]` 时，`gather_from_tensor_model_parallel_region` 正向的 `all_gather_into_tensor`
# 输出缓冲区是什么 shape？函数最终输出呢？**
#
# <details><summary>答案</summary>
#
# 缓冲区 `[8, 2, 6]`（沿第一维收齐），函数输出 `[4, 2, 12]`（切成两块再沿最后一维拼）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
run = runs[0]["gather_from_tensor_model_parallel_region"]
print(run["calls"][0].after, run["shapes"]["y"])

# %% [markdown]
# **3. 哪两个公开函数的正向完全相同、反向不同？反向各是什么？**
#
# <details><summary>答案</summary>
#
# `gather_from_tensor_model_parallel_region` 与 `all_gather_last_dim_from_tensor_parallel_region`：正向都是沿最后一维
# all-gather；反向前者只切分（gather 之后各 rank 计算相同），后者 reduce-scatter（之后各 rank 计算不同）。
# sequence 维上 `gather_from_sequence_parallel_region` 用 `tensor_parallel_output_grad` 在两者之间选。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
same_forward = [(a, b) for i, a in enumerate(sig) for b in list(sig)[i + 1:]
                if sig[a][0] == sig[b][0] and sig[a][1] != sig[b][1]]
for a, b in same_forward:
    print(f"{a}: {sig[a][1]}\n{b}: {sig[b][1]}\n")

# %% [markdown]
# **4. 调用 `reduce_from_tensor_model_parallel_region(x)` 之后，`x` 还是原来的值吗？**
#
# <details><summary>答案</summary>
#
# 不是（输入连续时）：`_reduce` 原地 all-reduce，`x` 变成了所有 rank 的和，返回值和 `x` 共用存储。
# 输入不连续时 0.19.0 对一份连续副本求和并返回它，`x` 不变（遗留问题 1）。
# 反过来，f 的反向会原地改写上游梯度。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
g = runs[0]["reduce_from_tensor_model_parallel_region (g)"]
print("x 被改写:", g["x_overwritten"], " f 的 dy 被改写:", runs[0]["copy_to_tensor_model_parallel_region (f)"]["dy_overwritten"])

# %% [markdown]
# **5. 不等分 all-to-all 的反向里，rank 0 的 `input_split_sizes` 和 `output_split_sizes` 是什么？**
#
# <details><summary>答案</summary>
#
# 正向 rank 0 发 `[1, 3]`、收 `[1, 2]`；反向两张表对调：发 `[1, 2]`、收 `[1, 3]`，梯度沿原路回去。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
backward_call = [c for c in v[0][0] if c.phase == "backward"][0]
print(backward_call.extra["input_split_sizes"], backward_call.extra["output_split_sizes"])

# %% [markdown]
# ## 30-second answer
#
# `mappings.py` turns collectives into differentiable functions: each forward collective comes with its
# transpose in backward. f (`copy_to_tensor_model_parallel_region`) is identity forward and all-reduce
# backward; g (`reduce_from_tensor_model_parallel_region`) is the reverse. Split and gather pair up along the
# last dim; with sequence parallel, all-gather and reduce-scatter along the sequence dim replace f and g at the
# same traffic. "Last-dim" collectives actually run on dim 0 and are rearranged. Watch the side effects: g
# all-reduces a contiguous input in place; a non-contiguous one is reduced in a fresh copy that g returns
# (0.19.0 fixed older releases, which returned the unsummed input).
