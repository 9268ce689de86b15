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
# # 13 Pipeline schedule：1F1B、interleaved 与气泡
#
# 第二轮第 6 篇。PP 把模型按层切成几段（stage），每个 rank 只存自己那段；一个 batch 被拆成 m 个
# micro-batch，像流水线一样依次流过各 stage。`get_forward_backward_func` 决定用哪种流水线顺序，
# `P2PCommunicator` 在相邻 stage 之间收发激活和梯度。本篇在 1、2、4 个 gloo rank 上跑**真实的** schedule
# 和**真实的**小 `GPTModel`，把每个 rank 的每次 forward / backward / send / recv 都记下来，画成时间线，
# 再用它量出流水线气泡。

# %% [markdown]
# ## 阅读目标
#
# 1. `get_forward_backward_func` 按什么选出三种 schedule 之一；三种 schedule 的 loss 和梯度为什么与不切分完全相同。
# 2. 每个 rank 的 warm-up / steady（1F1B）/ cool-down 各有几步：从代码的公式算出来，再和运行记录对上。
# 3. 相邻 stage 之间每一步发什么、收什么、形状多大、由 `P2PCommunicator` 的哪个方法发出。
# 4. 气泡从哪里来，为什么是 (p−1)/(m+p−1)；interleaved 为什么把它缩小到 (p−1)/(v·m+p−1)。
# 5. interleaved + PP=2 + `batch_p2p_comm=True` 在 gloo 上算错：是谁的错（遗留问题）。
#
# PP 2–4、virtual stage 1–2、m 4–8 的每个组合的记录，在[流水线调度浏览器](../../explorers/schedules/)里逐个看。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`schedules.py::get_forward_backward_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L48) | 按 PP 和 VP 大小三选一 |
# | [`schedules.py::forward_backward_no_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L696) | PP=1：逐个 micro-batch 做 forward 再 backward |
# | [`schedules.py::forward_backward_pipelining_without_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2120) | 1F1B：warm-up、steady、cool-down 三个循环 |
# | [`schedules.py::forward_backward_pipelining_with_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L992) | interleaved 1F1B：每个 rank 有 v 个 model chunk |
# | [`schedules.py::get_pp_rank_microbatches`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L902) | 每个 rank 的 warm-up 步数公式 |
# | [`schedules.py::get_schedule_table`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L962) | interleaved：第 k 个 forward 是哪个 micro-batch、哪个 chunk |
# | [`schedules.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L397) | 一次 forward（最后一个 stage 顺带算 loss） |
# | [`schedules.py::backward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L532) | 一次 backward，返回对本 stage 输入的梯度 |
# | [`p2p_communication.py::P2PCommunicator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L140) | 相邻 stage 的收发，前后邻居按 PP 群取模 |
# | [`p2p_communication.py::P2PCommunicator._communicate`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L275) | 所有收发方法的公共实现：建接收缓冲、选批量或逐个发送 |
# | [`p2p_communication.py::_batched_p2p_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L17) | `batch_p2p_comm=True`：一次 `batch_isend_irecv` |
# | [`p2p_communication.py::_p2p_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L55) | `batch_p2p_comm=False`：逐个 `isend` / `irecv` |
# | [`transformer_layer.py::get_transformer_layer_offset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L57) | 本 stage（本 chunk）的第一层是全局第几层 |
# | [`gpt_model.py::GPTModel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L51) | `pre_process` / `post_process` 决定本段有没有 embedding、输出层 |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 正式入口：每个 vp_stage 建一个 model chunk |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 正式入口：每步调一次 `forward_backward_func` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | simple loop 交给 schedule 的 `forward_step_func` |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/training.py::train_step            (simple loop: __main__ 里直接调)
# └─ forward_backward_func = schedules.py::get_forward_backward_func()
#    ├─ PP=1            → forward_backward_no_pipelining
#    │  └─ m × (forward_step → backward_step)                        # 无通信
#    ├─ PP>1, VP=None   → forward_backward_pipelining_without_interleaving
#    │  ├─ warm-up  × (p−r−1):  recv_forward → forward_step → send_forward            # pp 群 p2p
#    │  ├─ steady   × (m−w):    forward_step → send_forward_recv_backward
#    │  │                         → backward_step → send_backward_recv_forward        # pp 群 p2p
#    │  ├─ cool-down × w:       recv_backward → backward_step → send_backward         # pp 群 p2p
#    │  └─ config.finalize_model_grads_func(...)                                       # DP / embedding 归约（笔记 14）
#    └─ PP>1, VP=v      → forward_backward_pipelining_with_interleaving
#       ├─ get_pp_rank_microbatches / get_schedule_table           # 纯算术
#       ├─ warm-up:  forward_step_helper → send_forward_recv_forward                      # pp 群 p2p
#       ├─ steady:   forward_step_helper + backward_step_helper
#       │              → send_forward_backward_recv_forward_backward                      # pp 群，两个方向
#       └─ cool-down: backward_step_helper → send_backward_recv_backward                  # pp 群 p2p
#
# 每个 P2PCommunicator.xxx → _communicate
#    ├─ batch_p2p_comm=True  → _batched_p2p_ops → torch.distributed.batch_isend_irecv     # 一批
#    └─ batch_p2p_comm=False → _p2p_ops → isend / irecv（PP=2 时一个方向改走 WORLD 群）
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_forward_backward_func` | 可选的 `pp_size`、`vp_size`、`schedule_pg_collection`；缺省读 `parallel_state` 的 PP、VP 大小 | 三个 schedule 函数之一 | `parallel_state` | 只读大小 | 否 | 否 | `forward_backward_func = get_forward_backward_func()` |
# | `forward_backward_no_pipelining` | `forward_step_func`、data iterator、model、m | 每个 micro-batch 的 loss 字典（list） | `forward_step`、`backward_step`、`no_sync_func`、`finalize_model_grads_func` | 否（除非 finalize 里的 DP 归约） | batch 已由调用方切成 m 份 | 是：累积梯度 | `forward_backward_func(...)` |
# | `forward_backward_pipelining_without_interleaving` | 同上，model 只有一个 chunk | 只有最后一个 stage 返回 loss 字典，其余返回 `[]` | `P2PCommunicator`、`forward_step`、`backward_step` | **是**：PP 群的 p2p | 模型按层切；batch 按 micro-batch 流过 | 是：累积本 stage 的梯度 | 同上 |
# | `forward_backward_pipelining_with_interleaving` | 同上，model 和 data iterator 都是 v 个的 list | 同上 | 同上 + `get_schedule_table` | **是**：PP 群的 p2p（两个方向同时） | 模型切成 p·v 段，每个 rank 持 v 段 | 同上 | 同上 |
# | `get_pp_rank_microbatches` | m、chunk 数、`microbatch_group_size_per_vp_stage` | (总 forward 数, 是否全在 warm-up, warm-up 数, 剩余数) | `parallel_state` | 只读 PP rank | 否 | 否 | schedule 内 |
# | `forward_step` | `forward_step_func`、iterator、model、输入激活 | 输出激活（最后一个 stage：除以 m 之后的 loss） | `set_input_tensor`、`forward_step_calc_loss` | 否 | 否 | 否（只建 autograd 图） | `forward_step_func` 被它调用 |
# | `backward_step` | 输入激活、输出、输出梯度 | 对输入激活的梯度 | `torch.autograd.backward` | 否 | 否 | 是：参数 `.grad` 累加 | `loss.backward()` 的分段版 |
# | `P2PCommunicator._communicate` | 要发的张量（前 / 后）、要不要收（前 / 后）、形状 | 收到的张量 | `_batched_p2p_ops` 或 `_p2p_ops` | **是**：PP 群 | 否 | 否 | 无（PP=1 时不用） |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch

from snippets.pp import pictures, timeline
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n13_pipeline import (bubble_row, mean_loss, microbatches, phase_rows, pipeline_config,
                                               pipeline_run, stage_chunks, stage_rows)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.models.tiny_gpt import forward_step, init_by_global_name, max_abs_diff, tiny_config

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

# %% [markdown]
# ## 关键对象
#
# ### 每个 stage 的 model chunk
#
# 每个 rank 上要跑的函数。模型是 8 层、hidden 16 的真实 `GPTModel`（local spec）。PP>1 时，每个 rank
# 只建自己那段：`pre_process` 为真的段有 embedding，`post_process` 为真的段有 final norm、输出层和 loss；
# 有 VP 时每个 rank 建 v 个 chunk，和正式入口 `get_model` 的写法一样。权重按层的**全局**名字生成
# （`init_by_global_name`），所以不管怎么切，第 k 层的权重都相同，结果可以和 PP=1 逐元素比较。
#
# 函数在每个 `m`（micro-batch 个数）下调用一次 `get_forward_backward_func()` 返回的 schedule，
# 用 `record_schedule()` 记下本 rank 依次做的每个 forward、backward 和 p2p 调用（以及 p2p 里的 collective），
# 再问代码本身的公式 `get_pp_rank_microbatches` 这个 rank 应该有几步 warm-up。
#
# 这个函数就是 `snippets/experiments/n13_pipeline.py` 里的 `pipeline_run`；模型尺寸（层数、hidden、head、vocab、
# sequence、micro-batch）都是参数 `dims`，本篇用它的 `tiny`：8 层、hidden 16、vocab 32、sequence 8、micro-batch 2。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(stage_chunks, pipeline_run)

# %%
TINY = EXPERIMENTS["pipeline"].tiny
ref = run_ranks(pipeline_run, 1, TINY, pp=1)
pp2 = run_ranks(pipeline_run, 2, TINY, pp=2)
pp4 = run_ranks(pipeline_run, 4, TINY, pp=4, microbatch_counts=(1, 2, 4, 8))
vpp2 = run_ranks(pipeline_run, 2, TINY, pp=2, vp=2, batch_p2p_comm=False)
vpp4 = run_ranks(pipeline_run, 4, TINY, pp=4, vp=2, microbatch_counts=(4, 8))

# %% [markdown]
# 每次运行的核心是下面这一次调用（PP=2、m=4）：两个 rank 各建自己那一段 `GPTModel`，
# `get_forward_backward_func()` 给出 schedule，schedule 逐个 micro-batch 调 `forward_step`、在两段之间收发
# activation 和梯度，只在最后一个 stage 返回每个 micro-batch 的 loss。

# %%
def one_schedule_call(dims, m=4):
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    stage = GPTModel(pipeline_config(dims, pp=2), get_gpt_layer_local_spec(), vocab_size=dims.vocab,
                     max_sequence_length=dims.seq, share_embeddings_and_output_weights=False,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    init_by_global_name(stage)
    forward_backward_func = get_forward_backward_func()
    losses = forward_backward_func(forward_step_func=forward_step, data_iterator=iter(microbatches(dims, m)),
                                   model=[stage], num_microbatches=m,
                                   seq_length=dims.seq, micro_batch_size=dims.micro_batch_size)
    return forward_backward_func.__name__, [round(x["lm loss"].item(), 4) for x in losses]


calls = run_ranks(one_schedule_call, 2, TINY)
Table(["rank", "forward_backward_func", "返回的 loss（只在最后一个 stage）", "与 pipeline_run 的 PP=2 相同"],
      [[r, name, losses, losses == [round(x.item(), 4) for x in pp2[r]["runs"][4]["losses"]]]
       for r, (name, losses) in enumerate(calls)])

# %% [markdown]
# 谁拿到哪几层（`layer_number` 是全局的、从 1 数起）：

# %%
Table(["配置", "rank", "chunk", "pre_process", "post_process", "全局层号"],
      stage_rows("PP=1", ref) + stage_rows("PP=2", pp2) + stage_rows("PP=4", pp4)
      + stage_rows("PP=2, VP=2", vpp2) + stage_rows("PP=4, VP=2", vpp4))

# %% [markdown]
# 有 VP 时层是**轮流**分的：PP=2、VP=2 下 rank 0 拿第 1–2 层和第 5–6 层，rank 1 拿 3–4 和 7–8。
# 一个 micro-batch 的 forward 因此要在两个 rank 之间来回走两趟（0→1→0→1）。
#
# ### 三选一
#
# `get_forward_backward_func` 只看两个数（[schedules.py 第 156–162 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L156-L162)）：PP 大小 > 1 吗？VP 大小是 `None` 吗？
# 唯一的例外是 0.19.0 新加的参数 `schedule_pg_collection`：传入多模块（几个子模型各自一套并行网格）的群集合时，
# 它直接返回 1F1B（[`schedules.py:149`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L149)）。本篇不传，走上面的两个数。
#
# > **旧版（core_v0.18.0）：** `get_forward_backward_func(pp_size=None, vp_size=None)` 没有 `schedule_pg_collection` 参数，
# > 只按这两个数三选一。

# %%
Table(["配置", "get_forward_backward_func() 返回"],
      [[name, r[0]["func"]] for name, r in
       [("PP=1", ref), ("PP=2", pp2), ("PP=4", pp4), ("PP=2, VP=2", vpp2), ("PP=4, VP=2", vpp4)]])

# %% [markdown]
# ### 与不切分相同
#
# 同一份权重、同样 4 个 micro-batch：各配置最后一个 stage 报出的 loss 和各 rank 合起来的全部梯度，
# 与 PP=1 的逐元素比较。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def all_grads(results, m=4):
    grads = {}
    for r in results:
        grads.update(r["runs"][m]["grads"])
    return grads


reference_grads = all_grads(ref)

# %%
Table(["配置", "mean loss", "loss 相同", "梯度个数", "梯度逐元素相等"],
      [[name, round(mean_loss(r, 4), 4), mean_loss(r, 4) == mean_loss(ref, 4), len(all_grads(r)),
        all(torch.equal(g, reference_grads[k]) for k, g in all_grads(r).items())]
       for name, r in [("PP=1", ref), ("PP=2", pp2), ("PP=4", pp4), ("PP=2, VP=2", vpp2),
                       ("PP=4, VP=2", vpp4)]])

# %% [markdown]
# 逐位相同：流水线只改变**什么时候**算哪一段，不改变**算什么**。每个 micro-batch 的
# loss 在 `forward_step` 里被除以 m（[schedules.py 第 341 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L341)），所以 m 个 micro-batch 的梯度累加起来正好是
# 整个 batch 平均 loss 的梯度。
#
# ### warm-up、steady、cool-down
#
# 非 interleaved：rank r 先做 `p−r−1` 个只有 forward 的 warm-up（[schedules.py 第 2243–2244 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2243-L2244)，
# 不超过 m；0.19.0 的写法是"通信器的总 stage 数 − 当前 stage − 1"，普通的 `P2PCommunicator` 里这两个属性就是 PP 群的大小和本 rank 的序号，
# [`p2p_communication.py::P2PCommunicator.total_stages`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L177)、
# [`p2p_communication.py::P2PCommunicator.current_stage`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L182)），然后 `m − warm-up` 个"一个 forward 接一个 backward"的 steady 步，最后补做 warm-up 那么多个
# backward（cool-down）。interleaved 的 warm-up 是 `(p−r−1)·2 + (v−1)·g`（g = `microbatch_group_size_per_vp_stage`，
# 缺省等于 p；[schedules.py 第 937–938 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L937-L938)），总数变成 v·m。下表左边是代码的公式（在每个 rank 上调用
# `get_pp_rank_microbatches`），右边是从运行记录里数出来的：一个 forward 之后紧接着做 backward、中间只隔着
# `send_forward_recv_backward`（interleaved 时什么也不隔），算一个 steady 步——这正是 steady 循环的写法。

# %%
Table(["配置", "m", "rank", "代码 (warm-up, steady, cool-down)", "记录", "相同"],
      phase_rows("PP=4", pp4, 4) + phase_rows("PP=4", pp4, 8) + phase_rows("PP=4", pp4, 2)
      + phase_rows("PP=2, VP=2", vpp2, 4) + phase_rows("PP=4, VP=2", vpp4, 4))

# %% [markdown]
# m=2、PP=4 时 rank 0、1 的 warm-up 公式给出 3、2，但 m 只有 2：被截到 m，全部 micro-batch 都在 warm-up
# 里做完，没有 steady 步。PP=4、VP=2、m=4 时 rank 0、1 也是这样（`get_pp_rank_microbatches` 返回的第二项为真）。
#
# 每个 rank 依次做了什么（PP=4、m=4；`F2` = micro-batch 2 的 forward，只列计算）：

# %%
Table(["rank", "记录到的顺序"],
      [[rank, " ".join(timeline.label(op) for op in timeline.compute_ops(r["runs"][4]["ops"]))]
       for rank, r in enumerate(pp4)])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# PP 在相邻 stage 之间传的是**激活**（forward）和**对激活的梯度**（backward），形状都是
# `[seq, micro_batch, hidden]` = `[8, 2, 16]`（有 SP 时 seq 再除以 TP，有 CP 时除以 CP）。权重从不跨 stage 移动。
# PP=2、m=4 下两个 rank 发出的全部 p2p（`batch_p2p_comm=True`，缺省）：每个 `P2PCommunicator` 方法最多发一次
# `batch_isend_irecv`，里面是一个或两个 `isend` / `irecv`；第一个 stage 的 `recv_forward`、最后一个 stage 的
# `send_forward` 是空操作，没有记录。

# %%
p2p = timeline.p2p_rows(pp2[0]["runs"][4]["ops"], 0) + timeline.p2p_rows(pp2[1]["runs"][4]["ops"], 1)
print("API:", sorted({row[3] for row in p2p}), " group:", sorted({row[4] for row in p2p}))
Table(["rank", "在这步之后", "P2PCommunicator 方法", "ops（→发给、←收自）", "shape 前 = 后"],
      [[rank, after, method, ops, shapes] for rank, after, method, _, _, ops, shapes, _ in p2p])

# %% [markdown]
# 各方法的语义（"在这步之后"一列说明它在哪次计算之后被调用）：

# %%
Table(["P2PCommunicator 方法", "语义"],
      [[method, timeline.P2P_MEANINGS[method]] for method in dict.fromkeys(row[2] for row in p2p)])

# %% [markdown]
# 同一次运行画成时间线（逻辑时钟见下文「机制解释」），每条黄色箭头是上表里配成一对的一个 `isend` 和一个 `irecv`：
# 向下的是 forward 的激活，向上的是 backward 的梯度。

# %%
pictures.draw_timeline(timeline.logical_schedule([r["runs"][4]["ops"] for r in pp2], forward=1, backward=2),
                       title="1F1B，PP=2，m=4：stage 之间的 p2p", unit=40)

# %% [markdown]
# 读这张表：
#
# - **通信前后 shape 相同**：p2p 只是把一个 `[8, 2, 16]` 从一个 rank 搬到另一个 rank，不拼接不求和。
#   接收方按 `tensor_shape` 和 `config.pipeline_dtype` 预先建好空缓冲（`_communicate` 里），所以 PP 必须
#   知道激活的形状和 dtype——这就是 `pipeline_dtype` 必填、变长序列要开 `variable_seq_lengths` 先传形状的原因。
# - **成对出现**：rank 0 的每个 `isend→1` 都对应 rank 1 的一个 `irecv←0`，顺序一致。
# - **steady 一步两次通信**：`send_forward_recv_backward`（发出 forward 的结果、等回它对应的梯度）和
#   `send_backward_recv_forward`（发回梯度、收下一个 micro-batch 的激活）。

# %% [markdown]
# ## 机制解释
#
# ### 时间线
#
# 上面的记录只有**顺序**。为了看出流水线，把每个 rank 的顺序放到一个逻辑时钟上重放
# （`timeline.logical_schedule`）：一层的 forward 记 1 个时间单位、backward 记 2 个；一个操作在本 rank
# 空闲**且**输入已经存在时立即开始——forward 要等上一（虚拟）stage 同一 micro-batch 的 forward，
# backward 要等下一（虚拟）stage 同一 micro-batch 的 backward。不用墙钟：2 个 CPU 核上 4 个进程的耗时
# 既不代表 GPU，也每次不同。
#
# 下面两张图都是 8 层模型、4 个 rank、m=4，同一个时间刻度。1F1B 的每个 stage 有 2 层（forward 2 格、backward 4 格），
# interleaved（VP=2）的每个 chunk 有 1 层（1 格、2 格）：

# %%
one_f_one_b = timeline.logical_schedule([r["runs"][4]["ops"] for r in pp4], forward=2, backward=4)
pictures.draw_timeline(one_f_one_b, title="1F1B，PP=4，m=4（记录到的顺序，逻辑时间）")

# %%
interleaved = timeline.logical_schedule([r["runs"][4]["ops"] for r in vpp4], chunks=2, forward=1, backward=2)
pictures.draw_timeline(interleaved, chunks=2, title="interleaved 1F1B，PP=4，VP=2，m=4")

# %% [markdown]
# 看图：
#
# - 左上和右下的空白三角就是**气泡**：rank 3 要等 3 个 stage 的 forward 走完才能开始，rank 0 做完自己的
#   forward 后要等 backward 从 rank 3 一路传回来。
# - 1F1B 的 steady 段里每个 rank 交替做一个 forward、一个 backward，所以同时"在途"的 micro-batch 最多 p−r 个，
#   激活内存与 m 无关——这是它相对 GPipe（先做完全部 forward）的好处，气泡大小相同。
# - interleaved 把每个 stage 再切成 v 段，流水线"填满"所需的时间按一段算，短了 v 倍：同样 4 个 micro-batch，
#   总长从 42 格缩到 33 格。代价是 p2p 次数变成 v 倍。
#
# ### 气泡：量出来 vs 公式
#
# 气泡比例 = 所有 rank 的空闲时间 ÷ (rank 数 × 总时长)。非 interleaved 时，每个 rank 忙 m·(f+b)，总时长
# (m+p−1)·(f+b)，所以比例是 (p−1)/(m+p−1)，与 f、b 的比例无关；interleaved 的每段只有 1/v 的层，
# 比例变成 (p−1)/(v·m+p−1)。下面是从记录里量出来的：

# %%
Table(["schedule", "p", "v", "m", "总时长（格）", "量出的气泡", "(p−1)/(v·m+p−1)", "相等"],
      [bubble_row("1F1B", pp2, 4, 2, 1)]
      + [bubble_row("1F1B", pp4, m, 4, 1) for m in (1, 2, 4, 8)]
      + [bubble_row("interleaved", vpp2, 4, 2, 2)]
      + [bubble_row("interleaved", vpp4, m, 4, 2) for m in (4, 8)])

# %% [markdown]
# 每一行都与公式相等：Megatron 的 schedule 在依赖允许的范围内没有多余的等待。要把气泡压低，要么加大 m
# （batch 更大，或 micro-batch 更小），要么用 interleaved（代价是 v 倍的 p2p 次数和更大的 warm-up 激活）。
#
# ### 为什么结果与 PP=1 相同
#
# - 每个 stage 的 `backward_step` 用收到的输出梯度调 `torch.autograd.backward(output, grad)`，这正是把
#   整个网络的 backward 在 stage 边界处切开：链式法则在边界上传的就是这个梯度。
# - 每个 micro-batch 的 loss 先除以 m 再 backward，梯度在参数的 `.grad` 上累加 m 次，等于整个 batch 平均 loss 的梯度。
# - 权重在各 stage 之间不共享：`GPTModel` 的 `share_embeddings_and_output_weights` 缺省为 False，本篇也显式写了 False。
#   正式入口缺省**共享**（`gpt_builders.py` 传 `not args.untie_embeddings_and_output_weights`）：那时最后一个 stage
#   有一份词嵌入的副本，构造时从第一个 stage 复制过来，梯度在 `finalize_model_grads` 里经 embedding 群求和（[笔记 14](../14_data_parallel_ddp/)）。
#   在 CPU 上走这条路径要一个补丁（遗留问题 4）。

# %% [markdown]
# ## 与训练主链路的关系
#
# `train_step` 每一步调一次 `forward_backward_func`，把一个 global batch 里本 DP rank 的那份拆成 m 个
# micro-batch 交给它（m = global batch ÷ (micro batch × DP)）。schedule 返回时：各 stage 的梯度已累加好；
# 若 config 里设了 `finalize_model_grads_func`，DP 归约、SP 的 norm 梯度归约、首尾 stage 的 embedding 梯度
# 归约也已做完；之后才是优化器的 `step`（[笔记 15](../15_distributed_optimizer/)）。loss 只在最后一个 stage 上返回，正式入口只在那里打印。
# DDP 的 `no_sync`（`config.no_sync_func`）在 schedule 里用来让前 m−1 个 micro-batch 不触发梯度归约（笔记 14）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **链式法则的切分**：一个 stage 的 backward 只需要"对本 stage 输出的梯度"和本 stage 保存的激活，
#   这让每段网络可以放在不同的卡上。
# - **流水线气泡**：和 CPU 指令流水线一样，填满和排空需要 p−1 个时间步；任务（micro-batch）越多，
#   固定的填充开销占比越小。
# - **1F1B vs GPipe**：两者气泡相同；1F1B 让每个 rank 尽早做 backward、释放激活，峰值激活内存从 m 个
#   micro-batch 降到最多 p 个。
# - **点对点通信**：`isend` / `irecv` 要配对；同一对 rank 之间的多条消息按发出顺序配对（下一节的遗留问题就出在这里）。

# %% [markdown]
# ## 遗留问题
#
# **1. interleaved + PP=2 + `batch_p2p_comm=True` 算错了——是 Megatron 的问题，不是 gloo 的。**
#
# 先看现象：同一配置只把 `batch_p2p_comm` 从 False 换回缺省的 True：

# %%
vpp2_batched = run_ranks(pipeline_run, 2, TINY, pp=2, vp=2, batch_p2p_comm=True)
print("loss:", round(mean_loss(vpp2_batched, 4), 3), "vs PP=1", round(mean_loss(ref, 4), 3))
print("梯度与 PP=1 最大差超过 1:", max_abs_diff(all_grads(vpp2_batched), reference_grads) > 1)

# %% [markdown]
# 原因在三处代码的组合：
#
# - PP=2 时前后邻居是同一个 rank：`P2PCommunicator.__init__` 按 PP 群取模算邻居
#   （[`p2p_communication.py:155`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L155)、
#   [`p2p_communication.py:156`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L156)），
#   rank 0 的 prev 和 next 都是 rank 1。
# - interleaved 的 steady 步用 `send_forward_backward_recv_forward_backward`
#   （[`schedules.py:1908`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L1908)），
#   一次同时"向后发梯度、从前收激活、向前发激活、从后收梯度"。非 interleaved 的 1F1B 从不在一次调用里两个方向都发，所以不受影响。
# - `_batched_p2p_ops` 把这四个操作按 send_prev、recv_prev、send_next、recv_next 的顺序放进一批
#   （[`p2p_communication.py:32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L32)、
#   [`p2p_communication.py:37`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L37)、
#   [`p2p_communication.py:42`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L42)、
#   [`p2p_communication.py:47`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L47)）。
#   两条发往同一个 rank 的消息按发出顺序与对方的接收配对：rank 0 先发的是**梯度**（send_prev），
#   rank 1 先收的却是**激活**（recv_prev）。两个方向的张量互换了，形状又一样，所以不报错，只是算错。
#
# 直接调用真实的 `P2PCommunicator.send_forward_backward_recv_forward_backward` 验证：每个 rank 发出值为
# `100 + rank` 的"激活"和 `200 + rank` 的"梯度"，看收到了什么：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def p2p_swap():
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from snippets.record import recorder

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    rank = torch.distributed.get_rank()
    rows = []
    for batched in (True, False):
        comm = P2PCommunicator(parallel_state.get_pipeline_model_parallel_group(),
                               tiny_config(pipeline_model_parallel_size=2, batch_p2p_comm=batched))
        with recorder.record() as calls:
            activation, grad = comm.send_forward_backward_recv_forward_backward(
                torch.full((8, 2, 16), 100.0 + rank), torch.full((8, 2, 16), 200.0 + rank),
                recv_prev=True, recv_next=True, tensor_shape=(8, 2, 16))
        rows.append([rank, batched, (comm.prev_rank, comm.next_rank), activation[0, 0, 0].item(),
                     grad[0, 0, 0].item(), [(c.api, c.group, c.extra.get("ops") or c.extra.get("peer"))
                                            for c in calls]])
    return rows


Table(["rank", "batch_p2p_comm", "(prev, next)", "收到的激活", "收到的梯度", "记录到的 collective"],
      [row for rows in run_ranks(p2p_swap, 2) for row in rows])

# %% [markdown]
# rank 0 应当从 rank 1 收到激活 101、梯度 201。批量时收反了；逐个发送时正确，因为
# [`_p2p_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L55)
# 在 PP 群只有 2 个 rank 时把一个方向改走 WORLD 群
# （[`p2p_communication.py:75`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L75)）：
# 表的最后一列里，rank 0 → rank 1 的消息都在 `pp` 群上，rank 1 → rank 0 的都在 `world` 群上；每个方向上
# 发送方和接收方又都按"先激活、后梯度"的同一顺序排队，所以配得上。
#
# **不是 gloo 的错**：NCCL 的文档同样规定，一组调用里发往同一个 peer 的点对点操作按顺序执行
# （[NCCL user guide: point-to-point communication](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/p2p.html)），
# 同一批在 GPU 上也会这样配对。Megatron 自己知道这个限制：正式入口在
# [`arguments.py:972`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L972)
# 断言"interleaved 且不开 p2p overlap 时 PP 必须大于 2，以免同一对 rank 在一批里有多个收发"；而正式入口默认开
# overlap，于是 `batch_p2p_comm = not overlap_p2p_comm` 为 False
# （[`argument_utils.py:307`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L307)），
# 走的是正确的逐个发送。但这个检查只在 `megatron/training` 里：直接用 Megatron Core 的人拿到的是
# `ModelParallelConfig.batch_p2p_comm=True` 的缺省值，`ModelParallelConfig` 和 schedule 都不检查，结果静默出错。
#
# **2. loss 被原地除以 m。** `forward_step_calc_loss` 对 `loss_func` 返回的 loss 做 `output_tensor /= num_microbatches`
# （[`schedules.py:341`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L341)）。
# 如果日志字典里放的是 `loss.detach()`（与 loss 共享存储），记下来的值也会被除以 m。`snippets/models/tiny_gpt.py`
# 的 `loss_func` 因此用 `detach().clone()`。
#
# **3. 时间线是逻辑时间。** 它重放的是记录到的真实顺序，但各操作时长取理想值（backward = 2 × forward、通信不花时间）。
# 真实 GPU 上 p2p 的延迟、最后一个 stage 额外的输出层和 loss 都会让气泡比公式更大。
#
# **4. 共享词嵌入 + PP>1 在 CPU 上要一个补丁。** 最后一个 stage 构造 `GPTModel` 时，`setup_embeddings_and_output_layer`
# 先把词嵌入副本清零，再执行 `weight.data = weight.data.cuda()`
# （[`language_module.py:307`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L307)），
# 之后才在 embedding 群里 all-reduce 出初值。CPU 版 torch 在 `.cuda()` 上报错，而这是 Tensor 方法，模块级代理管不到。
# CPU 层的补丁 `shared_embedding_cuda` 只在这个方法运行期间让 `.cuda()` 返回张量本身，all-reduce 照常在 gloo 上做：
# 两个 stage 的两份词嵌入开始时逐位相同，`finalize_model_grads` 之后两份的梯度都等于两个 stage 梯度之和（[CPU 补丁一览](../../cpu/)）。
# 本篇仍然不共享，好让每个 stage 的梯度直接和 PP=1 逐个比较。下面在 PP=2 上用 `share_embeddings_and_output_weights=True`
# 建两段：第一段的词嵌入和最后一段的输出层权重是两份张量，构造完就相同：

# %%
def shared_copies():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(pipeline_config(TINY, 2), get_gpt_layer_local_spec(), vocab_size=TINY.vocab,
                     max_sequence_length=TINY.seq, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=True)
    weight = model.shared_embedding_or_output_weight()
    owner = "embedding.word_embeddings" if model.pre_process else "output_layer"
    return owner, list(weight.shape), weight.detach().clone()


copies = run_ranks(shared_copies, 2)
print([(owner, shape) for owner, shape, _ in copies], " 两份逐位相同:", torch.equal(copies[0][2], copies[1][2]))

# %% [markdown]
# ## 自测
#
# **1. PP=4、m=8 时 rank 1 的 warm-up、steady、cool-down 各几步？**
#
# <details><summary>答案</summary>
#
# warm-up = p − r − 1 = 2，steady = m − 2 = 6，cool-down = 2。运行记录一致。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("公式:", pp4[1]["runs"][8]["code_counts"], " 记录:", timeline.phases(pp4[1]["runs"][8]["ops"]))

# %% [markdown]
# **2. PP=4、VP=2、m=8 时 rank 0 的 warm-up 有几步（以 chunk 的 forward 计）？**
#
# <details><summary>答案</summary>
#
# (p − r − 1)·2 + (v − 1)·g = 3·2 + 1·4 = 10（g 缺省等于 p = 4），总数 v·m = 16，steady 6。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("公式 (总数, 全在 warm-up, warm-up, 剩余):", vpp4[0]["runs"][8]["code_counts"],
      " 记录:", timeline.phases(vpp4[0]["runs"][8]["ops"]))

# %% [markdown]
# **3. PP=4 时要让气泡低于 10%，非 interleaved 至少要几个 micro-batch？VP=2 呢？**
#
# <details><summary>答案</summary>
#
# (p−1)/(m+p−1) < 0.1 ⇒ m > 27，至少 28 个；VP=2 时 (p−1)/(2m+p−1) < 0.1 ⇒ m > 13.5，至少 14 个。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(next(m for m in range(1, 100) if 3 / (m + 3) < 0.1), next(m for m in range(1, 100) if 3 / (2 * m + 3) < 0.1))

# %% [markdown]
# **4. PP=2、m=4 时，rank 1（最后一个 stage）一共发出几次 `batch_isend_irecv`？每次搬的张量多大？**
#
# <details><summary>答案</summary>
#
# 5 次：`recv_forward` 1 次（第一个 micro-batch 的激活），steady 里 `send_backward_recv_forward` 3 次（每次发回一个梯度、
# 收下一个激活），最后 `send_backward` 1 次。一共收 4 个激活、发 4 个梯度，张量都是 `[8, 2, 16]`。
# 它的 `send_forward_recv_backward` 也被调用了 4 次，但最后一个 stage 既不发激活也不收梯度，是空操作。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
rank1_ops = pp2[1]["runs"][4]["ops"]
rank1 = timeline.p2p_rows(rank1_ops, 1)
print("batch_isend_irecv 次数:", len(rank1), " 方法:", [row[2] for row in rank1])
print("收到的激活:", sum(row[5].count("irecv") for row in rank1), " 发出的梯度:", sum(row[5].count("isend") for row in rank1))
print("空操作的 send_forward_recv_backward:",
      sum(op.kind == "send_forward_recv_backward" and not op.comms for op in rank1_ops))

# %% [markdown]
# **5. 为什么 PP=2 的 interleaved 用 `batch_p2p_comm=False` 就对了？**
#
# <details><summary>答案</summary>
#
# `_p2p_ops` 在 PP 群大小为 2 时，让"偶数 rank 收、奇数 rank 发"的那个方向走 WORLD 群，两个方向的消息在
# 两个不同的通信器上，每个方向上收发两端的顺序也一致；批量版本把四个操作放进同一个群的一批里，
# 发端"先梯度后激活"、收端"先激活后梯度"，按顺序配对就配反了。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(max_abs_diff(all_grads(vpp2), reference_grads), max_abs_diff(all_grads(vpp2_batched), reference_grads) > 1e-3)

# %% [markdown]
# ## 30-second answer
#
# `get_forward_backward_func` picks no-pipelining for PP=1, 1F1B for PP>1, and interleaved 1F1B when a
# virtual pipeline size is set. 1F1B gives rank r `p−r−1` warm-up forwards, then alternates one forward
# and one backward, then drains the backwards; stages exchange `[seq, micro_batch, hidden]` activations and
# gradients point-to-point in the PP group. Recorded on a real tiny GPT, losses and gradients equal PP=1
# exactly, and the measured bubble equals (p−1)/(m+p−1), or (p−1)/(v·m+p−1) interleaved. At PP=2,
# interleaved with batched p2p silently swaps activations and gradients.
