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
# # 10 ColumnParallelLinear 与 RowParallelLinear：权重怎么切，f 和 g 放在哪
#
# 张量并行把一个 `nn.Linear` 拆到几个 rank 上：权重沿哪一维切，每个 rank 拿到完整权重的哪一块？Megatron-LM 论文里的
# f 和 g 两次通信，落在这两个层的哪一步——为什么在 profiler 里找不到 `ColumnParallelLinear` 调用 f？开了 sequence
# parallel 又多出哪些通信？本篇在 2 个和 4 个 rank 上构造**真实的** `ColumnParallelLinear` / `RowParallelLinear`，
# 录下正反向的每个 collective，再把输出和全部梯度与一个普通的 `nn.Linear` 对比。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出两种层在每个 rank 上的权重与 bias 的 shape，以及它们是完整权重的哪一块。
# 2. 说清 f 在哪里：为什么 TP>1 时 `ColumnParallelLinear` 根本不调用 f，输入梯度的 all-reduce 由谁发出。
# 3. 说清 `gather_output`、`input_is_parallel` 各多出什么通信，一个 column → row 对一共通信几次。
# 4. 说出开 sequence parallel 后通信换成了什么、为什么反向多一次 all-gather、row 层的 bias 梯度为什么是部分和。
#
# **结论**
#
# - 两种层都存 `[out, in]`：`ColumnParallelLinear(8, 16)` 切输出维，rank 1 拿 `[16, 8]` 的第 8–15 行；`RowParallelLinear(16, 8)` 切输入维，bias 不切。
# - **f 被融合进了反向**：TP=2 时 f 被调用 0 次，输入梯度的 all-reduce（`[4, 2, 8]`）由矩阵乘的 autograd Function 在 backward 里发出（[layers.py:639](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L639)）。
# - row 层正向一次 all-reduce（g），反向不通信；MLP 的 column → row 对在 TP=2 上正向、反向各 1 次 all-reduce。
# - 开 SP 后没有 all-reduce：MLP 正向 AG RS、反向 AG AG RS，多出的 AG 为算权重梯度收齐输入，换来 `(tp-1)/tp` 的激活内存。
# - TP=2、4 的六种配置，输出和三种梯度都等于一个 `nn.Linear`；只有 SP 下 row 层的 bias 梯度要 `finalize_model_grads` 相加。
# - 切几份看 TP 群的大小，不看 config：config 写 TP=1、群里 2 个 rank，权重照样是 `[8, 8]`。
#
# 先读：[笔记 09](../09_tp_mappings/)（f、g 与 SP 那一对通信）；约 18 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import os

os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # Megatron 推荐的设置；不设它，每个 rank 的 linear 函数会警告一次

import torch
from IPython.display import Markdown

from snippets.record import recorder
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n10_linear import (CASES, build, comm_table, inputs, kinds, kinds_table,
                                             layout_table, part, run_cases, weight_layout)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp import pictures

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import _allreduce_non_tensor_model_parallel_grads
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import TransformerConfig
from megatron.core.utils import init_method_normal

TINY = EXPERIMENTS["linear"].tiny
HIDDEN, FFN, S, B = TINY.hidden, TINY.ffn, TINY.seq, TINY.micro_batch_size
X, G, BIAS = inputs(TINY)  # 完整输入、上游梯度和 bias，每个 rank 上和这里都是同一份


def folded(summary, table):
    """A table that only proves the page right: closed, one click away."""
    return Markdown(f"<details><summary>{summary}</summary>\n\n{table.markdown()}\n\n</details>")


layouts = {tp: run_ranks(weight_layout, tp, TINY, tp) for tp in (2, 4)}
results = {tp: run_ranks(run_cases, tp, TINY, tp) for tp in (2, 4)}
pictures.draw_linear_summary(comm_table(results[2]).rows,
                             title="f 融合进 column 层的反向：输入梯度的 all-reduce 由 layers.py 的 backward 发出；开 SP 后没有 all-reduce（TP=2）")

# %% [markdown]
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n10_linear.py`：`build` 用 `ModelParallelConfig` + `init_method_normal(0.02)` 构造真实的层
#   （`use_cpu_initialization=True`，保留主权重），`weight_layout` 用两个探针 `init_method` 读出每个 rank 拿到主权重的哪些行、列，
#   `run_cases` 在 `CASES` 的六种配置上各做一次录下 collective 的正反向，并用同一份主权重构造
#   `snippets/tp/tp_linear.py` 里我们自己的等价实现（约 130 行）做同样的事。图由 `snippets/tp/pictures.py` 的 `draw_linear_summary`（开头）和 `draw_linear`（关键对象）画。
# - 尺寸是实验的 `tiny`：hidden 8、ffn 16、`[s, b] = [4, 2]`；rank 是本机的 gloo 进程（`run_ranks` 从 notebook 里起，
#   结果传回主进程打印）。通信表由 `snippets.record.recorder` 记录；含义列先查模块的 `IN_LAYER` 表，再退回记录器的 `MEANINGS`。
# - 重跑本页：`scripts/execute_notes.sh notes/10_column_row_parallel_linear.py`。只跑实验、打印同样的表：
#   `.venv/bin/python -m snippets.run --nproc-per-node 2 linear --tp 2`；换成真实一层的尺寸：
#   `.venv/bin/python -m snippets.run --nproc-per-node 8 linear --dims qwen3-8b --tp 8`。
# - 在 CPU 上跑 Megatron 用到的补丁见 [CPU 页](../../cpu/)；本篇的层主要用到其中的 `current_device`（层和通信函数在 `torch.cuda.current_device()` 上分配缓冲）。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build, weight_layout, part, run_cases)

# %% [markdown]
# ## 源码位置
#
#
# | 符号 | 角色 |
# |---|---|
# | [`layers.py::ColumnParallelLinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L869) | 按输出切：每个 rank `[out/tp, in]` |
# | [`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066) | `allreduce_dgrad = world_size > 1 and not sequence_parallel and not disable_grad_reduce` |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | 选择是否调用 f；矩阵乘；可选 gather |
# | [`layers.py:1139`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1139) | 四个条件任一成立就**跳过** f |
# | [`layers.py::RowParallelLinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1249) | 按输入切：每个 rank `[out, in/tp]`，bias 不切 |
# | [`layers.py::RowParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1430) | 可选 scatter；矩阵乘；g 或 reduce-scatter；最后加 bias |
# | [`layers.py::linear_with_grad_accumulation_and_async_allreduce`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L755) | 两种层共用的矩阵乘入口 |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | 输入梯度的 all-reduce（= f 的反向）或 SP 的 all-gather + reduce-scatter |
# | [`layers.py:639`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L639) | 异步 all-reduce 输入梯度，与权重梯度的矩阵乘重叠 |
#
# <details><summary>其余符号（初始化、row 层构造、autograd Function 本身、SP 参数的梯度求和）</summary>
#
# | 符号 | 角色 |
# |---|---|
# | [`layers.py::ColumnParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L918) | 分配、初始化权重；决定 `allreduce_dgrad` |
# | [`layers.py::RowParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1285) | SP 要求 `input_is_parallel`；bias 标上 `sequence_parallel` |
# | [`layers.py:1448`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1448) | row 层写死 `allreduce_dgrad = False` |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L525) | 自己写正反向的 autograd Function |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L530) | SP 时先 all-gather 输入；只存本 rank 的输入分片 |
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | 造完整主权重，按 `partition_dim`、`stride` 切出本 rank 的块 |
# | [`layers.py::_initialize_affine_weight_gpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L169) | 只在本 rank 的块上、用 TP 专用 RNG 流初始化 |
# | [`layers.py::set_tensor_model_parallel_attributes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L136) | 给参数挂上 `tensor_model_parallel`、`partition_dim`、`partition_stride` |
# | [`model_parallel_config.py::ModelParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L46) | `tensor_model_parallel_size`、`sequence_parallel`、`use_cpu_initialization` |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | SP 时把标了 `sequence_parallel` 的参数梯度在 TP 群里加起来 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 两种层的 forward 都走同一个矩阵乘入口 `linear_with_grad_accumulation_and_async_allreduce`，区别只在它前后：
# column 层（TP>1）跳过 f、把 `allreduce_dgrad=True` 交给入口，输入梯度的 all-reduce 由入口的 backward 发出；
# row 层传 `allreduce_dgrad=False`，矩阵乘之后调 g（或 SP 的 reduce-scatter），最后加 bias。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/core/tensor_parallel/layers.py
# ├─ ColumnParallelLinear.__init__(input_size, output_size, config, init_method, gather_output, ...)
# │  ├─ get_tensor_model_parallel_group_if_none → world_size, rank
# │  ├─ weight = Parameter([out/tp, in])
# │  │  └─ _initialize_affine_weight_cpu(partition_dim=0)   # 造 [out, in] 主权重，切第 0 维；或 _gpu：只初始化本块
# │  ├─ bias = Parameter([out/tp])，置零，也标为 TP 切分
# │  └─ allreduce_dgrad = world_size > 1 and not sequence_parallel and not disable_grad_reduce   # 第 1066 行
# ├─ ColumnParallelLinear.forward(x)
# │  ├─ allreduce_dgrad / sequence_parallel / … ? 直接用 x : copy_to_tensor_model_parallel_region(x)   # f，TP>1 时不走
# │  ├─ linear_with_grad_accumulation_and_async_allreduce → LinearWithGradAccumulationAndAsyncCommunication
# │  │  ├─ forward:  SP ? all_gather_into_tensor(x, dim 0) ;  x @ Wᵀ + b             # SP：收齐 sequence
# │  │  └─ backward: dX = dY @ W
# │  │               allreduce_dgrad ? all_reduce(dX)                                  # 这就是 f 的反向
# │  │               SP ? all_gather_into_tensor(x) 再一次 + reduce_scatter_tensor(dX)   # SP
# │  │               dW = dYᵀ @ X，db = Σ dY
# │  └─ gather_output ? gather_from_tensor_model_parallel_region(y)                    # all-gather 最后一维
# ├─ RowParallelLinear.__init__(input_size, output_size, config, init_method, input_is_parallel, ...)
# │  ├─ weight = Parameter([out, in/tp])
# │  │  └─ _initialize_affine_weight_cpu(partition_dim=1)
# │  └─ bias = Parameter([out])，不切；bias.sequence_parallel = config.sequence_parallel
# └─ RowParallelLinear.forward(x)
#    ├─ input_is_parallel ? x : scatter_to_tensor_model_parallel_region(x)              # 正向切分，反向 all-gather
#    ├─ linear_with_grad_accumulation_and_async_allreduce(bias=None, allreduce_dgrad=False, sequence_parallel=False)
#    ├─ SP ? reduce_scatter_to_sequence_parallel_region : reduce_from_tensor_model_parallel_region   # g
#    └─ + bias                                                                           # 求和之后只加一次
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `ColumnParallelLinear.__init__` | `input_size`、`output_size`、`config`、`init_method`、`gather_output` | 一个层（`weight [out/tp, in]`、`bias [out/tp]`） | `_initialize_affine_weight_cpu/_gpu`、`set_tensor_model_parallel_attributes`、TP 群 | 读 TP 群的大小和序号 | 是：权重按输出维切 | 是：新建参数 | `model_provider`（构造模型） |
# | `ColumnParallelLinear.forward` | `[s, b, in]`（SP 时 `[s/tp, b, in]`） | `([s, b, out/tp] 或 gather 后 [s, b, out], bias 或 None)` | `linear_with_grad_accumulation_and_async_allreduce`、f、gather | 是：TP 群 | 是：输出按最后一维切 | 否 | `forward_backward_func` 里的模型 forward |
# | `RowParallelLinear.__init__` | 同上，加 `input_is_parallel`、`skip_bias_add` | 一个层（`weight [out, in/tp]`、`bias [out]`） | 同上 | 读 TP 群 | 是：权重按输入维切 | 是：新建参数 | `model_provider` |
# | `RowParallelLinear.forward` | `[s, b, in/tp]`（或完整 `[s, b, in]`） | `([s, b, out]，SP 时 [s/tp, b, out], bias 或 None)` | 同一个 linear 函数、scatter、g 或 reduce-scatter | 是：TP 群 | 合并部分和；SP 时按 sequence 切 | 否 | 模型 forward |
# | `LinearWithGradAccumulationAndAsyncCommunication` | 输入、权重、bias、`allreduce_dgrad`、`sequence_parallel`、群 | `X Wᵀ + b`；反向给 dX、dW、db | `get_global_memory_buffer`（SP 的收齐缓冲） | 是：反向 all-reduce，或 SP 的 all-gather / reduce-scatter | SP 时 sequence 维 | 否（`gradient_accumulation_fusion` 时直接累加进 `main_grad`） | 模型 forward / backward |
# | `_initialize_affine_weight_cpu` | 空的本地权重、`output_size`、`input_size`、`partition_dim`、`stride`、`init_method` | 本地权重被填好（可选返回主权重） | `set_tensor_model_parallel_attributes` | 只读 TP 序号 | 是：从主权重切块 | 是：消耗 RNG | `model_provider` |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# 形状取一个缩小的 MLP：`hidden = 8`、`ffn = 16`，激活 `[s, b, h] = [4, 2, 8]`。column 层 `8 → 16`（像 `linear_fc1`），
# row 层 `16 → 8`（像 `linear_fc2`）。构造方式就是 Megatron 的：一个 `ModelParallelConfig`，一个 `init_method`。
# 在 2 个 rank 上各构造一对，把 column 的输出原样交给 row，看每个 rank 上的 shape：

# %%
def column_then_row(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
    fc1 = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init_method_normal(0.02),
                               bias=True, gather_output=False)
    fc2 = RowParallelLinear(FFN, HIDDEN, config=config, init_method=init_method_normal(0.02),
                            bias=True, input_is_parallel=True, skip_bias_add=False)
    x = torch.randn(S, B, HIDDEN)
    h, _ = fc1(x)  # 本 rank 的那几列输出，不通信
    y, _ = fc2(h)  # 部分和在 TP 群里 all-reduce（g）
    return {"fc1.weight": list(fc1.weight.shape), "h": list(h.shape),
            "fc2.weight": list(fc2.weight.shape), "y": list(y.shape)}


Table(["rank", "fc1.weight", "h", "fc2.weight", "y"],
      [[r, *d.values()] for r, d in enumerate(run_ranks(column_then_row, 2, 2))])

# %% [markdown]
# 两个权重碰巧都是 `[8, 8]`，来历却不同：column 的是 `[16/2, 8]`（切输出维），row 的是 `[8, 16/2]`（切输入维）。
# `h` 的最后一维 8 = 16/2，正是 row 层要的那一段输入，所以中间不用通信；`y` 已经是完整的 `[4, 2, 8]`。
#
# ### 每个 rank 拿到完整权重的哪一块
#
# 用两个特殊的 `init_method` 当探针：先把完整权重（主权重）的第 `i` 行第 `j` 列填成 `i`、再建一次填成 `j`，
# 每个 rank 的分片就自己说出了它是主权重的哪些行、哪些列（TP=2 和 TP=4）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
layout_table(layouts)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pictures.draw_linear(layout_table(layouts).rows, comm_table(results[2]).rows)

# %% [markdown]
# 图把两张表画在一起（TP=2）：左边是每个 rank 的分片在完整权重里的位置，右边是默认配置正向、反向各发的 collective。
#
# - column 层的 rank `r` 拿第 `r` 段**行**（输出）、所有列：`[16/tp, 8]`，`partition_dim = 0`；bias 也按输出切（`[16/tp]`）。
# - row 层的 rank `r` 拿所有行、第 `r` 段**列**（输入）：`[8, 16/tp]`，`partition_dim = 1`；bias `[8]` 不切，每个 rank 一份完整的。
# - 最后一列是 `use_cpu_initialization=True` 的代价：每个 rank 都先造出完整的 `[out, in]` 主权重
#   （[`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184)），
#   再切出自己那块。好处是结果与 TP 大小无关：同一个种子下，TP=2、TP=4 的分片拼回去都等于单进程初始化的那个矩阵
#   （两种层、两种 TP 都相等，表折叠在下面）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def single_process_init(kind):
    torch.manual_seed(0)
    master = torch.empty(FFN, HIDDEN) if kind == "column" else torch.empty(HIDDEN, FFN)
    init_method_normal(0.02)(master)
    return master


folded("分片拼回 = 单进程初始化（column / row，TP=2、4）",
       Table(["层", "TP", "分片拼回 = 单进程初始化"],
             [[kind, tp, torch.equal(torch.cat([res[name, "real"]["w"] for res in results[tp]],
                                               0 if kind == "column" else 1), single_process_init(kind))]
              for kind, name in (("column", "Column, gather_output=False"), ("row", "Row, input_is_parallel=True"))
              for tp in (2, 4)]))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 每种配置的通信（TP=2）
#
# 六种配置：column 层的 `gather_output=False/True`，row 层的 `input_is_parallel=True/False`，以及两者开 SP。每种配置在每个
# rank 上喂完整输入 `X` 里本 rank 的那份，正向、反向各一次，录下 rank 0 的每个 collective（页首的图画的是前两种缺省配置）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
comm_table(results[2])

# %% [markdown]
# - **Column（`gather_output=False`）正向不通信，反向一次 all-reduce**，发出者是 `layers.py::backward`，
#   不是 `mappings.py::_reduce`——f 的反向被合并进了矩阵乘的 autograd Function（下一节）。
# - **`gather_output=True` 多一次正向 all-gather**（`[4, 2, 8] → [8, 2, 8]`，再重排成 `[4, 2, 16]`），反向只是切分。
# - **Row（`input_is_parallel=True`）正向一次 all-reduce（g），反向不通信**；`input_is_parallel=False` 时正向先本地切分
#   （不通信），反向多一次 all-gather 把输入梯度收齐。
# - **开 SP**：column 正向 all-gather 输入、反向 all-gather 输入 + reduce-scatter 输入梯度；row 正向 reduce-scatter、
#   反向 all-gather。all-reduce 全部消失。
#
# phase 列只有 forward 和 backward：这两个层的通信全在模型的正反向里；梯度同步和优化器步是笔记 14、15 的事。
#
# ### `allreduce_dgrad`：f 其实不在 `ColumnParallelLinear` 里
#
# [`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)
# 在构造时决定 `allreduce_dgrad = world_size > 1 and not sequence_parallel and not disable_grad_reduce`；
# [`layers.py:1139`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1139)
# 在 forward 里只要 `allreduce_dgrad`、`sequence_parallel`（或 expert、`disable_grad_reduce`）任一为真就跳过 f。
# 换句话说，只有 TP=1 时才调用 f，而那时 f 什么也不做。把 f 换成一个计数的探针，TP=1、TP=2、TP=2+SP 各跑一次：

# %%
def who_reduces_dgrad(tp, sequence_parallels):
    from megatron.core.tensor_parallel import layers

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    f_calls, real_f = [], layers.copy_to_tensor_model_parallel_region
    layers.copy_to_tensor_model_parallel_region = lambda x, group=None: f_calls.append(1) or real_f(x, group=group)
    rows = []
    for sp in sequence_parallels:
        f_calls.clear()
        config = ModelParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=sp, use_cpu_initialization=True)
        fc1 = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init_method_normal(0.02),
                                   bias=True, gather_output=False)
        x = torch.randn(S // tp if sp else S, B, HIDDEN, requires_grad=True)
        with recorder.record() as calls:
            y, _ = fc1(x)
            y.sum().backward()
        rows.append([tp, sp, fc1.allreduce_dgrad, len(f_calls),
                     ", ".join(f"{c.api} @ {c.where.split('/')[-1]}" for c in calls if c.phase == "backward") or "—"])
    return rows


Table(["TP", "sequence_parallel", "allreduce_dgrad", "f 被调用次数", "反向的 collective @ 发出者"],
      run_ranks(who_reduces_dgrad, 1, 1, [False])[0] + run_ranks(who_reduces_dgrad, 2, 2, [False, True])[0])

# %% [markdown]
# TP=2 时 f 一次也没被调用，输入梯度的 all-reduce 由
# [`layers.py:639`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L639)
# 在 `LinearWithGradAccumulationAndAsyncCommunication.backward` 里以 `async_op=True` 发出，随后才算权重梯度
# `dW = dYᵀ X`，最后才等它完成：通信和权重梯度的矩阵乘重叠。这要求 GPU 按发出顺序执行 kernel，所以 Megatron 建议
# `CUDA_DEVICE_MAX_CONNECTIONS=1`，否则在 [layers.py 第 856 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L856) 警告。
# 数学上它仍然是 f 的反向：各 rank 对同一份输入的梯度相加。把 f 做成一个单独的 autograd Function，all-reduce
# 只能在它自己的 backward 里同步地做完；融合进矩阵乘的 backward，才有机会和 `dW` 的计算同时进行。
#
# ### 数值：真实的层 = 一个普通的 `nn.Linear`
#
# 在主进程里用拼回的主权重和完整 bias 构造 `nn.Linear`，对完整的 `X`、`G` 做一次正反向，再把各 rank 的结果按它们的
# 分布拼回来比较。每个张量在各 rank 上怎么分布：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def layout(name):
    kind, kwargs, x_dim, y_dim = CASES[name]
    column = kind == "column"
    return {"y": y_dim, "dx": x_dim, "dw": 0 if column else 1,
            "db": 0 if column else ("sum" if kwargs.get("sequence_parallel") else None)}


def describe(dim):
    return {None: "完整（各 rank 相同）", "sum": "部分和（各 rank 相加才是完整的）"}.get(dim, f"按 dim {dim} 切")


Table(["配置", "输出 y", "输入梯度 dx", "权重梯度 dW", "bias 梯度 db"],
      [[name] + [describe(d) for d in layout(name).values()] for name in CASES])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def assemble(per_rank, dim):
    if dim is None:  # 完整：各 rank 必须一样
        assert all(torch.equal(t, per_rank[0]) for t in per_rank)
        return per_rank[0]
    return sum(per_rank) if dim == "sum" else torch.cat(per_rank, dim)


def dense_reference(kind, weight):
    linear = torch.nn.Linear(*weight.shape[::-1])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(BIAS[kind])
    x = X[kind].clone().requires_grad_()
    y = linear(x)
    y.backward(G[kind])
    return {"y": y.detach(), "dx": x.grad, "dw": linear.weight.grad, "db": linear.bias.grad}


def compare(tp, who, against="dense"):
    rows = []
    for name, (kind, *_) in CASES.items():
        ranks = [res[name, who] for res in results[tp]]
        weight = assemble([res[name, "real"]["w"] for res in results[tp]], layout(name)["dw"])
        ref = dense_reference(kind, weight)
        rows.append([tp, name] + [torch.allclose(assemble([r[key] for r in ranks], dim), ref[key], atol=1e-6)
                                  for key, dim in layout(name).items()])
    return rows


folded("拼回来 = nn.Linear（TP=2、4，六种配置，四种张量）",
       Table(["TP", "配置", "输出", "输入梯度", "权重梯度", "bias 梯度"], compare(2, "real") + compare(4, "real")))

# %% [markdown]
# 两种 TP、六种配置、四种张量全部等于 `nn.Linear`（表折叠在上面）。只有 "Row, SP" 的 bias 梯度要先把各 rank **相加**：
# 开 SP 后 row 层的输出按 sequence 切开，每个 rank 只拿到自己那几个位置的输出梯度，bias 梯度 `Σ dY` 也就只覆盖这些位置。
# Megatron 在构造时给这个 bias 标上 `sequence_parallel=True`，训练时由
# [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416)
# 在 TP 群里把标了它的参数梯度加起来（LayerNorm 的参数同理）。层本身给出的只是部分和。直接调一次这个函数：

# %%
def row_sp_bias_grad():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=2,
                               tensor_model_parallel_size=2, sequence_parallel=True, use_cpu_initialization=True)
    fc2 = RowParallelLinear(FFN, HIDDEN, config=config, init_method=init_method_normal(0.02),
                            bias=True, input_is_parallel=True, skip_bias_add=False)
    r = parallel_state.get_tensor_model_parallel_rank()
    y, _ = fc2(X["row"].chunk(2, -1)[r])  # 输出按 sequence 切
    y.backward(G["row"].chunk(2, 0)[r])
    before = fc2.bias.grad.clone()
    fc2.ddp_config = DistributedDataParallelConfig()  # finalize 从模型块上读它
    _allreduce_non_tensor_model_parallel_grads([fc2], config)
    return fc2.bias.sequence_parallel, list(y.shape), before, fc2.bias.grad


runs = run_ranks(row_sp_bias_grad, 2)
dense_db = G["row"].sum((0, 1))  # nn.Linear 的 bias 梯度
print("bias.sequence_parallel:", runs[0][0], "  每个 rank 的输出:", runs[0][1])
print("finalize 之前，各 rank 的 db 单独等于 dense:", [torch.allclose(r[2], dense_db, atol=1e-6) for r in runs])
print("finalize 之前，两个 rank 的 db 相加等于 dense:", torch.allclose(runs[0][2] + runs[1][2], dense_db, atol=1e-6))
print("finalize 之后，各 rank 的 db 等于 dense:", [torch.allclose(r[3], dense_db, atol=1e-6) for r in runs])

# %% [markdown]
# ## 机制解释
#
# ### 两种切法为什么正好配成一对
#
# `Y = X Wᵀ + b`，`W` 是 `[out, in]`。
#
# - **按输出切（column）**：`W` 的第 `r` 段行只决定 `Y` 的第 `r` 段列，每个 rank 独立算出 `Y[..., r 段]`，正向不需要通信；
#   但每段都用到完整的 `X`，所以 `X` 的梯度是各 rank 贡献之和——反向 all-reduce（f）。
# - **按输入切（row）**：`W` 的第 `r` 段列只和 `X` 的第 `r` 段列相乘，得到 `Y` 的一个加数；把加数相加才是 `Y`——
#   正向 all-reduce（g）。`Y` 的梯度对每个加数都一样，所以反向不需要通信。bias 必须在求和之后加，只加一次。
# - **接起来**：column 的输出本来就按最后一维切好，正是 row 需要的输入（`input_is_parallel=True`），中间的逐元素激活
#   函数也可以各算各的。所以 MLP 和 attention 都是"column → 本地计算 → row"：整段只在入口（f 的反向）和出口（g 的正向）
#   各通信一次。`gather_output` 和 `input_is_parallel=False` 是单独使用某一种层时的出入口。
#
# ### sequence parallel 换了什么
#
# 不开 SP 时，TP 区域之外（LayerNorm、dropout、残差）的激活在每个 rank 上完整重复。开 SP 后它们按 sequence 维切开，
# 区域的入口从 f 换成 sequence 维的 all-gather，出口从 g 换成 reduce-scatter——[笔记 09](../09_tp_mappings/) 算出的那一对
# 共轭。Megatron 把入口的 all-gather 放进 linear 的 autograd Function 里，并且只保存本 rank 的输入分片，
# 反向需要完整输入算 `dW` 时**再 all-gather 一次**：多一次通信，省下 `(tp-1)/tp` 的激活内存。
# 把一个 MLP 对（column → gelu → row）在 TP=2 上录一遍，不开和开 SP：

# %%
def mlp_pair(sequence_parallels):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    recorded = {}
    for sp in sequence_parallels:
        config = ModelParallelConfig(tensor_model_parallel_size=2, sequence_parallel=sp, use_cpu_initialization=True)
        fc1 = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init_method_normal(0.02),
                                   bias=True, gather_output=False)
        fc2 = RowParallelLinear(FFN, HIDDEN, config=config, init_method=init_method_normal(0.02),
                                bias=True, input_is_parallel=True, skip_bias_add=False)
        x = torch.randn(S // 2 if sp else S, B, HIDDEN, requires_grad=True)  # SP：每个 rank 只有一半 sequence
        with recorder.record() as calls:
            h, _ = fc1(x)
            y, _ = fc2(torch.nn.functional.gelu(h))
            y.sum().backward()
        recorded[sp] = calls
    return recorded


mlp_calls = run_ranks(mlp_pair, 2, [False, True])[0]
Table(["MLP（TP=2）", "正向", "反向"],
      [[f"sequence_parallel={sp}", kinds(calls, "forward"), kinds(calls, "backward")]
       for sp, calls in mlp_calls.items()])

# %% [markdown]
# 不开 SP：正向只有 row 出口的 AR（g），反向只有 column 入口的 AR（f 的反向）。开 SP：正向 AG（column 收齐输入）+ RS
# （row 的出口），反向 AG（RS 的反向）+ AG（column 重新收齐输入）+ RS（column 的输入梯度）。按 ring 算法，一次 AR 的
# 通信量等于一次 RS 加一次 AG，所以 SP 并没有多花入口和出口的通信，只多了反向那次重新收齐的 AG。
#
# ### 一份可读的等价实现
#
# 本篇还带了一份约 130 行的等价实现：column 层 `f → F.linear → (gather)`，row 层 `(scatter) → F.linear → g → + bias`，
# f、g 和 SP 的那对通信各是一个以 Megatron 函数命名的 autograd Function。它在同一份主权重上和真实的层算出同样的数
# （TP=2、4，六种配置，表折叠在下面），通信却不完全一样（AR = all-reduce）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def ours_vs_real(tp):
    rows = []
    for name in CASES:
        per_rank = [(res[name, "ours"], res[name, "real"]) for res in results[tp]]
        rows.append([tp, name] + [all(torch.allclose(o[key], m[key], atol=1e-6) for o, m in per_rank)
                                  for key in ("y", "dx", "dw", "db")])
    return rows


display(folded("等价实现 = 真实的层（TP=2、4，六种配置，四种张量）",
               Table(["TP", "配置", "输出", "输入梯度", "权重梯度", "bias 梯度"], ours_vs_real(2) + ours_vs_real(4))))
kinds_table(results[2])

# %% [markdown]
# 唯一的差别在 "Column, SP" 的反向：等价实现让 autograd 保存收齐后的完整输入，所以反向只有一次 RS；Megatron
# 保存分片、反向再 AG 一次。这是内存换通信的取舍，不影响结果。

# %% [markdown]
# ## 与训练主链路的关系
#
# 模型构造（`model_provider` → `GPTModel`）时，每层的 `linear_qkv`、`linear_fc1` 是 `ColumnParallelLinear`
# （`gather_output=False`），`linear_proj`、`linear_fc2` 是 `RowParallelLinear`（`input_is_parallel=True`）；输出层也是
# `ColumnParallelLinear`（配合 vocab-parallel 的 cross entropy，不 gather）。它们的通信都在 `forward_backward_func` 的模型
# forward / backward 里（一整层的计数见[笔记 11](../11_transformer_layer/)）。之后 `finalize_model_grads` 加起标了
# `sequence_parallel` 的梯度；优化器按 `tensor_model_parallel` 属性区分切分与复制的参数，例如梯度范数里复制的参数只算一次
# （[`layers.py::param_is_not_tensor_parallel_duplicate`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L95)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **分块矩阵乘**：`X Wᵀ` 按 `W` 的行分块得到 `Y` 的列块（column），按 `W` 的列分块（同时切 `X` 的列）得到 `Y` 的加数（row）。
# - **`nn.Linear` 的存储**：`weight` 是 `[out_features, in_features]`，前向是 `x @ weight.T + bias`；Megatron 沿用这个约定，
#   所以 column 切的是 `weight` 的第 0 维，row 切第 1 维。
# - **线性层的三个梯度**：`dX = dY W`、`dW = dYᵀ X`、`db = Σ dY`。哪个需要通信，取决于它依赖的张量在各 rank 上是完整、
#   切开还是部分和——上面的分布表就是这件事。
# - **Megatron-LM 论文的 f / g**：f 在正向是恒等、反向 all-reduce；g 相反；一个 MLP 或 attention 块正反向各一次 all-reduce。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **常见的说法是"f 在 `linear_qkv` 内部"，运行显示它被融合掉了。** 只有 TP=1 时 `ColumnParallelLinear` 才调用 f
#    （此时不通信）；TP>1 时输入梯度的 all-reduce 由 linear 的 backward 直接发出（上面的探针表）。
#    读 profiler 时要在 `LinearWithGradAccumulationAndAsyncCommunication` 里找它，不是在 `_CopyToModelParallelRegion` 里。
# 2. **row 层忽略自己的 `tp_group` 去找全局群。** [`layers.py:1466`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1466)
#    给 linear 函数传 `tp_group=None`，后者再经 `get_tensor_model_parallel_group_if_none` 取全局 TP 群（并在 rank 0 发弃用警告）。
#    因为 row 层在 linear 函数里既不 all-reduce 也不开 SP，这个群不被使用，结果不受影响；但即使构造时给了显式的
#    `tp_group`，linear 函数内部仍会去查全局的 `parallel_state`。
# 3. **`ModelParallelConfig.tensor_model_parallel_size` 不决定切几份。** 切分大小来自 TP 群的大小
#    （[`layers.py:958`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L958)
#    的 `get_pg_size(self.tp_group)`）；config 里的数只在 `__post_init__` 里检查 SP、给 expert TP 和 0.19.0 新增的
#    `tensor_parallel_num_weight_shards` 定默认值，层里只有 expert 层拿它和 `expert_tensor_parallel_size` 比较
#    （[`layers.py:961`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L961)）。下面在 TP=2 的群里
#    用 `tensor_model_parallel_size=1` 的 config 构造 column 层：照样切成两半，不报错。

# %%
def config_says_tp1():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    config = ModelParallelConfig(tensor_model_parallel_size=1, use_cpu_initialization=True)
    layer = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init_method_normal(0.02),
                                 bias=True, gather_output=False)
    return list(layer.weight.shape)


print("config 说 TP=1，TP 群有 2 个 rank；每个 rank 的 weight:", run_ranks(config_says_tp1, 2))

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - rank 是本机的 gloo 进程，尺寸取最小的能看清切分的：hidden 8、ffn 16、`[s, b] = [4, 2]`，TP=2 和 4。层在 CPU 上构造，
#   靠 [CPU 页](../../cpu/)里的补丁让 `torch.cuda.current_device()` 返回 `"cpu"`，Megatron 的文件一行不改。
# - 页首的单元格设了 `CUDA_DEVICE_MAX_CONNECTIONS=1`：CPU 上没有 kernel 的执行顺序可言，设它只为了不让每个 rank 的 linear
#   函数在 [layers.py 第 856 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L856)
#   警告一次。
# - **GPU 初始化路径本篇没有跑。** `use_cpu_initialization=False` 时
#   [`_initialize_affine_weight_gpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L169)
#   在 TP 专用的 RNG 流（种子随 TP 序号变化，见笔记 02）下只初始化本 rank 的块，拼回去一般不等于 TP=1 的权重；它在 CPU 上需要
#   RNG tracker 的兼容补丁，[笔记 24](../24_rng_and_recomputation/) 专门讲这些 RNG 流。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. TP=4 时 `ColumnParallelLinear(8, 16)` 和 `RowParallelLinear(16, 8)` 每个 rank 的 weight、bias 是什么 shape？**
#
# <details><summary>答案</summary>
#
# column：weight `[4, 8]`，bias `[4]`；row：weight `[8, 4]`，bias `[8]`（不切）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({d["kind"]: (d["weight"], d["bias"]) for d in layouts[4][0]})

# %% [markdown]
# **2. TP=2、不开 SP 时，`ColumnParallelLinear` 的 `allreduce_dgrad` 是多少？它在哪一行决定？开 SP 后呢？**
#
# <details><summary>答案</summary>
#
# True，在 [layers.py 第 1066 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066) 由 `world_size > 1 and not sequence_parallel and not disable_grad_reduce` 决定；
# 开 SP 后是 False，输入梯度改由 reduce-scatter 处理。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(results[2][0]["Column, gather_output=False", "real"]["allreduce_dgrad"],
      results[2][0]["Column, SP", "real"]["allreduce_dgrad"])

# %% [markdown]
# **3. `RowParallelLinear` 的 bias 为什么不切？如果每个 rank 在求和之前各加一次 bias，TP=2 时输出差多少？**
#
# <details><summary>答案</summary>
#
# row 层每个 rank 算的是输出的一个加数，bias 只能在求和之后加一次。各 rank 先加再求和，输出会多出 `(tp-1)·b`，
# TP=2 时正好多一个 `b`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
w_row = [res["Row, input_is_parallel=True", "real"]["w"] for res in results[2]]
partials = [X["row"].chunk(2, -1)[r] @ w_row[r].T for r in range(2)]  # 每个 rank 的加数 [4, 2, 8]
y_row = results[2][0]["Row, input_is_parallel=True", "real"]["y"]
print("Σ 加数 + b == y:", torch.allclose(sum(partials) + BIAS["row"], y_row, atol=1e-6))
print("Σ (加数 + b) − y == b:", torch.allclose(sum(p + BIAS["row"] for p in partials) - y_row,
                                            BIAS["row"].expand_as(y_row), atol=1e-6))

# %% [markdown]
# **4. 一个 MLP 对（column → row）在 TP=2 上，不开 / 开 SP 时正反向各几次 collective？**
#
# <details><summary>答案</summary>
#
# 不开 SP：正向 1 次 AR（row 的 g），反向 1 次 AR（column 的输入梯度）。开 SP：正向 AG + RS，反向 AG（row 的输出梯度）
# + AG（column 重新收齐输入）+ RS（column 的输入梯度）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for sp, calls in mlp_calls.items():
    print(f"SP={sp}: 正向 {kinds(calls, 'forward')}；反向 {kinds(calls, 'backward')}")

# %% [markdown]
# **5. SwiGLU 的 `linear_fc1` 用 `stride=2`（[`mlp.py:210`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L210)）。
# TP=2、输出 16 行时，CPU 初始化给 rank 0 的是主权重的哪些行？**
#
# <details><summary>答案</summary>
#
# 主权重先按 `16 / 2 / 2 = 4` 行一块切成 4 块，rank `r` 拿第 `r, r+2` 块（`weight_list[rank::world_size]`）：
# rank 0 拿第 0–3 行和第 8–11 行，也就是 gate 的前半和 up 的前半。这样每个 rank 的 gate、up 成对，激活可以本地算。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def index_init(master):  # master[i, j] = 100·i + j
    with torch.no_grad():
        master.copy_(100 * torch.arange(master.shape[0]).unsqueeze(1) + torch.arange(master.shape[1]))


def strided_rows():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    config = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True)
    fc1 = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=index_init, bias=False,
                               gather_output=False, stride=2)
    return (fc1.weight[:, 0] // 100).int().tolist()


print(run_ranks(strided_rows, 2))

# %% [markdown]
# **6. `ColumnParallelLinear` 定义在哪个文件？GPT 的一层里哪几个 linear 是它、哪几个是 `RowParallelLinear`？f、g 在哪个文件？**
#
# <details><summary>答案</summary>
#
# `megatron/core/tensor_parallel/layers.py`，`RowParallelLinear` 也在那里。local spec 的一层里，`linear_qkv` 和
# `linear_fc1` 是 column-parallel，`linear_proj` 和 `linear_fc2` 是 row-parallel，正好两对 column → row。
# f（`copy_to_tensor_model_parallel_region`）和 g（`reduce_from_tensor_model_parallel_region`）在
# `tensor_parallel/mappings.py`。Transformer Engine spec 换成同样切法的 `TELayerNormColumnParallelLinear` 等。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
import inspect

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region

print("ColumnParallelLinear:", inspect.getsourcefile(ColumnParallelLinear).split("site-packages/")[1])
layer = get_gpt_layer_local_spec().submodules
mlp = layer.mlp.keywords["submodules"]  # 0.19.0：mlp 是 partial(MLP.as_mlp_submodule, submodules=...)
for name, spec in [("linear_qkv", layer.self_attention.submodules.linear_qkv),
                   ("linear_proj", layer.self_attention.submodules.linear_proj),
                   ("linear_fc1", mlp.linear_fc1), ("linear_fc2", mlp.linear_fc2)]:
    print(f"{name:12s}", spec.__name__)
print("f, g:", copy_to_tensor_model_parallel_region.__module__, reduce_from_tensor_model_parallel_region.__module__)

# %% [markdown]
# ## 30-second answer
#
# Both layers store the weight as `[out, in]`, like `nn.Linear`. `ColumnParallelLinear` splits dim 0: each rank
# owns `[out/tp, in]` and a slice of the bias, computes its slice of Y, and the input gradient is all-reduced in
# backward — fused into the linear's backward (`allreduce_dgrad`, decided at [layers.py:1066](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)), so f itself is
# never called at TP>1. `RowParallelLinear` splits dim 1, all-reduces partial outputs (g), then adds the unsplit
# bias once. With sequence parallel, all-gather and reduce-scatter along the sequence replace both all-reduces.
# At TP 2 and 4, outputs and every gradient equal one dense `nn.Linear`.
