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
# 第二轮第 2 篇。[笔记 08](../08_parallel_state_and_rank_generator/) 决定了 TP 群里是哪几个 rank；本篇看
# tensor parallel 在这个群里**怎么通信**。`megatron/core/tensor_parallel/mappings.py` 的 12 个公开函数里，10 个
# 各包一个 autograd Function（正向做一件事，反向做另一件事），`all_to_all_sp2hp` / `all_to_all_hp2sp` 是在
# `all_to_all` 外面加 reshape。下面在 2 个 gloo rank 上把
# 每个函数正向、反向各跑一次，记录发出的每个 collective，再在主进程里用普通 torch 运算独立算一遍，核对数值。
# 哪两个函数互为"共轭"（一个的正向就是另一个的反向），也从记录表里算出来，不靠手写。

# %% [markdown]
# ## 阅读目标
#
# 1. 对 `mappings.py` 的每个公开函数，说出它正向、反向各发哪个 collective（或不通信），在哪个群，shape 怎么变。
# 2. 说清 f（`copy_to_tensor_model_parallel_region`）和 g（`reduce_from_tensor_model_parallel_region`）为什么互为共轭，
#    以及 scatter/gather、sequence parallel 的 all-gather/reduce-scatter、sp2hp/hp2sp 这几对。
# 3. 说清"最后一维"的 gather / reduce-scatter 在通信层面其实沿**第一维**做，然后再重排。
# 4. 知道这些函数的几个副作用：g 会原地改写（连续的）输入，f 的反向会原地改写上游梯度；以及旧版里非连续输入会让 g 悄悄不求和、0.19.0 怎样修好了它。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`mappings.py::copy_to_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L492) | f：正向恒等，反向 all-reduce |
# | [`mappings.py::reduce_from_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L498) | g：正向 all-reduce，反向恒等 |
# | [`mappings.py::scatter_to_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L504) | 最后一维：正向切分，反向 all-gather |
# | [`mappings.py::gather_from_tensor_model_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L510) | 最后一维：正向 all-gather，反向切分 |
# | [`mappings.py::scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L516) | 第一维：正向切分，反向 all-gather |
# | [`mappings.py::gather_from_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L522) | 第一维：正向 all-gather，反向 reduce-scatter（或切分） |
# | [`mappings.py::reduce_scatter_to_sequence_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L536) | 第一维：正向 reduce-scatter，反向 all-gather |
# | [`mappings.py::all_gather_last_dim_from_tensor_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L546) | 最后一维：正向 all-gather，反向 reduce-scatter |
# | [`mappings.py::reduce_scatter_last_dim_to_tensor_parallel_region`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L552) | 最后一维：正向 reduce-scatter，反向 all-gather |
# | [`mappings.py::all_to_all`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L558) | 第一维 all-to-all（可不等分），反向交换两张 split 表 |
# | [`mappings.py::all_to_all_sp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L566) | `[tokens/TP, H]` → `[tokens, H/TP]` |
# | [`mappings.py::all_to_all_hp2sp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L595) | `[tokens, H/TP]` → `[tokens/TP, H]` |
# | [`mappings.py::_CopyToModelParallelRegion`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L201) | f 背后的 autograd Function（其余 9 个同构，见调用链） |
# | [`mappings.py::_GatherFromSequenceParallelRegion.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L332) | 按 `tensor_parallel_output_grad` 选 reduce-scatter 还是切分 |
# | [`mappings.py::_AllToAll.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L470) | 反向再做一次 all-to-all，输入输出 split 对调 |
# | [`mappings.py::_reduce`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L22) | all-reduce 并返回结果：输入连续时就是原地（f 的反向、g 的正向） |
# | [`mappings.py::_gather_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L84) | 沿第一维 all-gather，再切块、沿最后一维拼 |
# | [`mappings.py::_reduce_scatter_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L103) | 先把最后一维的块竖着摞起来，再沿第一维 reduce-scatter |
# | [`mappings.py::_gather_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L118) | `all_gather_into_tensor`；给了 split 时用 `all_gather` |
# | [`mappings.py::_reduce_scatter_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L159) | `reduce_scatter_tensor`；给了 split 时用 `reduce_scatter` |
# | [`mappings.py::_split_along_last_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L40) / [`_split_along_first_dim`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L60) | 本地切片，不通信 |
# | [`utils.py::get_tensor_model_parallel_group_if_none`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L573) | 没传 `group` 时取全局 TP 群（并警告将来必须传） |

# %% [markdown]
# ## 调用链
#
# 每个公开函数都是两行：取群，`apply` 一个 autograd Function。Function 的 `forward` 和 `backward`
# 各调一个私有 helper，collective 就在 helper 里（右边是 TP=2 时的通信）：
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
# 除 `all_to_all` 必须显式给群以外，其余函数的 `group` 缺省时经
# `get_tensor_model_parallel_group_if_none` 取全局 TP 群。下面的单元格都显式传 `group=tp`。
#
# **每个函数的阅读记录**（roadmap 第一轮的七问；12 个公开函数的答案只在"怎么切、怎么通信"上不同，那部分见下面的运行表）：
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

# %% [markdown]
# ## 关键对象
#
# 每个函数怎么调，写成一张表（`x` 是本 rank 的输入，`tp` 是 TP 群）。
# `gather_from_sequence_parallel_region` 多跑一个 `tensor_parallel_output_grad=False` 的变体，它的反向不同。
#
# 这张表和下面在 rank 上跑的函数都在 `snippets/experiments/n09_mappings.py` 里（`m` 就是 `megatron.core.tensor_parallel.mappings`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(mappings_by_name)

# %% [markdown]
# 每个 rank 上：TP=2 初始化，然后对每个函数做一次正向、一次反向，全程录下 collective。输入 `x` 是
# `[s, b, h] = [4, 2, 6]`（本篇的 `dims`），数值是 `0…47` 加上 `100 × rank`（百位就是来源 rank）；上游梯度 `dy` 也按 rank 不同。
# 同时记下：调用之后 `x`、`dy` 自己有没有被改写：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(run_every_mapping)

# %%
TINY = EXPERIMENTS["mappings"].tiny
runs = run_ranks(run_every_mapping, 2, TINY, 2)
print("每个 rank 跑了", len(runs[0]), "个调用；记录到的 collective 条数（rank 0, rank 1）:",
      [sum(len(r["calls"]) for r in rank_runs.values()) for rank_runs in runs])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 记录表
#
# roadmap 的通信记录：每个函数、每个方向一行（不通信的方向也列出，API 记作 `—`）。"通信前 / 通信后"是
# collective 自己的缓冲区 shape；"张量"是函数层面的 shape（正向是 `x → y`，反向是 `dy → dx`）。
# 含义按发出 collective 的 Megatron 函数查 `snippets.record.recorder.MEANINGS`；同一个 helper 在不同上下文含义不同的，
# 用模块里的 `IN_CONTEXT` 覆盖。

# %%
record_table(runs[0])

# %% [markdown]
# 同一张表画成图：每行一个函数，左边正向、右边反向；每个 rank 的张量经过黄框里的 collective（或不通信）变成右边的形状。

# %%
pictures.draw_mappings(record_rows(runs[0]))

# %% [markdown]
# 发出 collective 的是哪个私有 helper（recorder 记下的最内层 Megatron 函数；all-to-all 一栏的 `forward` 是
# `_AllToAll.forward`，它的反向也是再调一次它）：

# %%
issuer_table(runs[0])

# %% [markdown]
# rank 1 的记录和 rank 0 一样（同样的 API、群、shape、顺序）：

# %%
print(record_rows(runs[0]) == record_rows(runs[1]))

# %% [markdown]
# 读表：
#
# - **f / g**：f 正向不通信，反向 `all_reduce`；g 正好相反。
# - **"最后一维"的 gather 和 reduce-scatter 在通信层面都沿第一维。** `gather_from_tensor_model_parallel_region`
#   的 `all_gather_into_tensor` 是 `[4, 2, 6] → [8, 2, 6]`，之后才切块、沿最后一维拼成 `[4, 2, 12]`；
#   `reduce_scatter_last_dim_to_tensor_parallel_region` 先把 `[8, 6]`（token × hidden）沿 hidden 切成两块竖着摞成
#   `[16, 3]`，再 `reduce_scatter_tensor` 成 `[8, 3]`。所以发出者表里是 `_reduce_scatter_along_first_dim`。
#   原因是 `all_gather_into_tensor` / `reduce_scatter_tensor` 把张量当作一段连续内存，按第一维拼接和切分；
#   沿最后一维的块在内存里不连续，只能先重排。
# - **`scatter_to_tensor_model_parallel_region` 正向不通信**（本地切片），反向才 all-gather。
# - **all-to-all 三兄弟**：sp2hp、hp2sp 都先 reshape 成二维 `[tokens, h]`，`[4, 2, 6]` 的输出不再有 batch 维。

# %% [markdown]
# ### 数值：和单进程参考逐个比
#
# 在主进程里，用两个 rank 的 `x` 和 `dy`、只用 `cat` / `chunk` / 加法，写出每个函数"应该"给 rank `r` 的
# 正向输出和输入梯度。这张参考表就是每个函数的定义：

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

# %% [markdown]
# 逐个比较两个 rank 的结果（值都是小整数，求和是精确的），再看调用之后输入、上游梯度有没有被改写：

# %%
def matches(name, which, key):
    ref = REFERENCE[name][which]
    inputs = [runs[r][name]["x" if which == 0 else "dy"] for r in range(2)]
    return all(torch.equal(runs[r][name][key], ref(inputs, r)) for r in range(2))


Table(["函数", "正向 = 参考", "反向 = 参考", "x 被原地改写", "dy 被原地改写"],
      [[name, matches(name, 0, "y"), matches(name, 1, "dx"),
        any(runs[r][name]["x_overwritten"] for r in range(2)),
        any(runs[r][name]["dy_overwritten"] for r in range(2))] for name in MAPPINGS])

# %% [markdown]
# 13 行全对。最后两列是两个副作用，都来自 [`mappings.py::_reduce`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L22)：
# 它先取输入的连续版本（输入本就连续时就是它自己），对它 all-reduce 再返回——所以连续的输入被**原地**改写。g 的正向因此把调用方的输入 `x` 改成了全和；f 的反向把
# autograd 递来的上游梯度 `dy` 改成了全和。在 `RowParallelLinear` 里，g 的输入是矩阵乘的临时结果，没有别人再用，
# 所以无害；自己调用 g 时要记得输入会被覆盖。

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
# 反向是同一个 `_AllToAll` 再做一次，两张 split 表对调：梯度沿原路返回。数值上，rank `r` 收到的是每个 rank
# 发给它的那几行，按来源 rank 依次排列。反向时每个 rank 给自己收到的行的上游梯度是 `rank + 1`，于是 rank 1 的
# `x` 里，发去 rank 0 的前两行梯度是 1，留在本地的后两行梯度是 2：

# %%
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
# 把每个函数每个方向概括成一个"签名"：发了哪些 collective（或不通信）+ 张量 shape 怎么变（按 `[token, hidden]`
# 看：前几维之积是 token 数，最后一维是 hidden）。A 的正向签名等于 B 的反向签名、且 A 的反向签名等于 B 的正向签名，
# A、B 就是一对共轭。签名只用上面录到的数据：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(change, phase_signature, conjugate_pairs)

# %%
sig = signatures(runs[0])
Table(["函数", "正向签名", "反向签名"], [[name, f, b] for name, (f, b) in sig.items()])

# %%
pairs = conjugate_pairs(sig)
Table(["A", "B（A 的共轭）"], pairs)

# %% [markdown]
# 算出的 7 对：f ↔ g；最后一维的 scatter ↔ gather；sequence 维的 scatter ↔ gather（`output_grad=False` 的变体）；
# sequence 维的 gather ↔ reduce-scatter；最后一维的 all-gather ↔ reduce-scatter；sp2hp ↔ hp2sp；等分 all-to-all 与自己。
#
# **为什么正反向必须成对。** 每个函数都是线性映射，反向算的是它的转置（伴随）。"复制一份给每个 rank"的转置是
# "把各 rank 的梯度加起来"，所以 f 的反向是 all-reduce；"把部分和加起来"的转置是"把梯度复制给每个部分"，所以 g 的反向
# 是恒等。切分的转置是拼接，拼接的转置是切分；all-gather 的转置是 reduce-scatter。
#
# **同一个正向，两种反向。** `gather_from_tensor_model_parallel_region` 和 `all_gather_last_dim_from_tensor_parallel_region`
# 正向完全一样，反向一个只切分、一个 reduce-scatter。区别在 gather 之后的计算：
#
# - 之后每个 rank 做**完全相同**的计算（例如 `gather_output=True` 的输出层后面接同一个 loss），各 rank 的 `dy` 相同，
#   都代表同一份梯度，只需取自己那块——切分；
# - 之后每个 rank 做**不同**的计算（例如 attention 把 QKV 收齐后只算自己的 head），各 rank 的 `dy` 是部分梯度，
#   要先相加——reduce-scatter。
#
# `gather_from_sequence_parallel_region` 用参数 `tensor_parallel_output_grad` 在这两种反向之间选，缺省是后者。
# 上面的参考表把两种情况写得很清楚：反向是 `half(dy[r], …)` 还是 `half(dy[0] + dy[1], …)`。
#
# **sequence parallel 为什么是"另一对 f / g"。** 不开 SP 时，TP 区域外的激活在每个 rank 上完整重复，进入区域用 f，
# 离开用 g（all-reduce）。开 SP 后，区域外的激活按 sequence 维切开：进入区域用 sequence 维的 all-gather，离开用
# reduce-scatter。all-reduce = reduce-scatter + all-gather，通信量不变，而 LayerNorm、dropout 的激活只存 1/TP。
# 这一对在 `ColumnParallelLinear` / `RowParallelLinear` 里的具体位置见
# [笔记 10](../10_column_row_parallel_linear/)。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这些函数出现在模型 forward 的各处，反向由 autograd 自动带出——simple loop 里它们都在 `forward_backward_func`
# 之内。谁在用哪个？在安装的 `megatron/core` 源码里搜每个函数的调用处（不含 mappings.py 自己）：

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
# - `tensor_parallel/layers.py`：`ColumnParallelLinear`、`RowParallelLinear`、`VocabParallelEmbedding` 用 f、g、
#   最后一维的 scatter/gather 和 sequence 维的 reduce-scatter（笔记 10、12）。
# - 开 SP 时，embedding 的出口用 sequence 维的 scatter 把激活切开（`language_model_embedding.py`）；
#   `gpt_model.py` 在推理只要最后一个 token 的 logits 时用 sequence 维的 gather 先把激活收齐。
# - MoE 的 token dispatcher 用不等分的 `all_to_all`，在 EP 群里（笔记 17）。
# - `all_to_all_sp2hp` / `all_to_all_hp2sp` 的调用者是 Mamba 的 context parallel：
#   [`mamba_context_parallel.py::_all_to_all_cp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/ssm/mamba_context_parallel.py#L305) 在 **CP 群**里调 sp2hp，
#   再把二维结果 reshape 回 `[s, b, h]`（`_all_to_all_hp2cp` 对应 hp2sp）。`reduce_scatter_last_dim_to_tensor_parallel_region`
#   在 0.19.0 的 `megatron/core` 里仍**没有调用者**。
#
# > **旧版（core_v0.18.0）：** Mamba 的 CP 在 `_all_to_all_cp2hp` 里自己 reshape、切块再直接调 `all_to_all`
# > （[core_v0.18.0 的 `_all_to_all_cp2hp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/ssm/mamba_context_parallel.py#L304)），所以 `all_to_all_sp2hp` / `all_to_all_hp2sp`
# > 在那一版没有调用者，上表里它们是 0、`all_to_all` 是 2。

# %% [markdown]
# ## 与基础知识的连接
#
# - **autograd.Function**：`forward` 里的操作不进计算图，`backward` 必须自己给出输入的梯度。通信原语正是这样写成
#   "可求导的通信"：模型代码只写正向，反向的 collective 由 autograd 自动按逆序发出。
# - **转置 / 伴随**：线性映射 `M` 的反向是 `Mᵀ`。复制 ↔ 求和、切分 ↔ 拼接、all-gather ↔ reduce-scatter、
#   all-to-all ↔ 反向的 all-to-all，都是互为转置的对。
# - **collective 的关系**：all-reduce = reduce-scatter + all-gather（ring 实现下两步各传 `(p-1)/p` 份数据）。
#   sequence parallel 把一次 all-reduce 拆成这两半，分别放在 TP 区域的出口和入口。
# - **张量的三种分布**：每个 rank 一份相同的（replicated）、按某一维切开的（sharded）、各持一个加数的（partial）。
#   f 把 replicated 交给各 rank 独立使用（反向把 partial 梯度加起来），g 把 partial 变成 replicated，
#   reduce-scatter 把 partial 变成 sharded，all-gather 把 sharded 变成 replicated。

# %% [markdown]
# ## 遗留问题
#
# 1. **非连续输入时 g 不求和——0.19.0 已修好（运行确认）。** 0.19.0 的 `_reduce` 先把 `input_` 换成它的连续版本
#    （[`mappings.py:34`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L34)），对这一份做 all-reduce 并返回它
#    （[`mappings.py:37`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L37)）。下面的单元格把转置过（不连续）的张量交给 g：
#    两个 rank 都拿回了正确的全和，而各自的输入 `x` 保持原样——求和写进的是新建的连续副本，不再是原地。
#    所以调用方必须用 g 的**返回值**；输入连续时行为和以前一样，仍是原地改写。
#
# > **旧版（core_v0.18.0）：** `_reduce` 对 `input_.contiguous()` 做 all-reduce，却返回原来的 `input_`
# > （[core_v0.18.0 的 mappings.py 第 31 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/tensor_parallel/mappings.py#L31)，core_v0.16.1 相同）。输入不连续时求和写进了临时副本，
# > 每个 rank 拿回的仍是自己的部分和（同一单元格在旧版打印 `g 返回` 等于 `本 rank 的输入`）。Megatron 自己的调用处传的都是矩阵乘的连续输出，没有触发。
# 2. **docstring 与代码不一致（运行确认）。** `scatter_to_tensor_model_parallel_region` 的 docstring
#    （[`mappings.py:505`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L505)）
#    说正向是 RS（reduce-scatter），记录表里它的正向根本不通信，只是本地切片；`scatter_to_sequence_parallel_region`
#    的 docstring（[`mappings.py:517`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L517)）
#    说反向沿最后一维 all-gather，记录表里是沿第一维（token ×2）。
# 3. **`IN_CONTEXT` 说明了 recorder 的一个局限。** recorder 用"最内层的 Megatron 函数"给 collective 命名，
#    所以最后一维的 reduce-scatter 被记成 `_reduce_scatter_along_first_dim`，f 的反向和 g 的正向都记成 `_reduce`；
#    含义要结合调用它的公开函数才说得清。

# %%
def g_on_a_transposed_tensor():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    r = parallel_state.get_tensor_model_parallel_rank()
    x = (torch.arange(4.0).reshape(2, 2) + 10 * r).t()  # 非连续
    y = mappings.reduce_from_tensor_model_parallel_region(x, group=parallel_state.get_tensor_model_parallel_group())
    return x.is_contiguous(), y.tolist(), x.tolist()


for r, (contiguous, got, mine) in enumerate(run_ranks(g_on_a_transposed_tensor, 2)):
    print(f"rank {r}: 连续={contiguous}  g 返回 {got}  本 rank 的输入 {mine}")
print("应得的全和:", (torch.arange(4.0).reshape(2, 2).t() * 2 + 10).tolist())

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
