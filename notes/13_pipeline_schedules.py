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
# 模型按层切给 p 个 rank、一个 batch 拆成 m 个 micro-batch 之后，每个 rank 按什么顺序做 forward 和
# backward？一开始先做几个 forward（warm-up），空等的"气泡"有多大，interleaved 怎样把它缩小？
# 本篇在 1、2、4 个进程上跑 Megatron 真实的 schedule 和一个 8 层的 `GPTModel`，记下每个 rank 的每一步，对照代码。

# %% [markdown]
# ## 阅读目标
#
# 1. `get_forward_backward_func` 怎样三选一；为什么切成流水线后 loss 和梯度与不切分逐位相同。
# 2. 每个 rank 的 warm-up / steady / cool-down 各几步：1F1B 和 interleaved 的公式，与运行记录对上。
# 3. 相邻 stage 之间每一步收发什么、形状多大、由 `P2PCommunicator` 的哪个方法发出。
# 4. 气泡从哪里来，为什么是 (p−1)/(m+p−1)；interleaved 为什么把它缩小到 (p−1)/(v·m+p−1)。
# 5. interleaved + PP=2 + `batch_p2p_comm=True` 为什么静默算错。
#
# **结论**
#
# - PP=1 用 `forward_backward_no_pipelining`，PP>1 用 1F1B，再设 VP 用 interleaved；五种切法 loss 都是 3.7556，梯度逐位相等。
# - 1F1B 的 rank r 先做 w = min(p−r−1, m) 个 forward：PP=4、m=8 时 rank 0–3 的 (warm-up, steady, cool-down) 是 (3, 5, 3)、(2, 6, 2)、(1, 7, 1)、(0, 8, 0)。
# - interleaved 按 chunk 计，warm-up = (p−r−1)·2 + (v−1)·g：PP=4、VP=2、m=8 时 rank 0 的 16 个 forward 里有 10 个。
# - 气泡 = (p−1)/(v·m+p−1)：8 层、PP=4、m=4 时 1F1B 0.4286（42 格），VP=2 降到 0.2727（33 格）。
# - stage 之间只在 PP 群点对点传 `[8, 2, 16]` 的激活和梯度；PP=2、m=4 时最后一个 stage 发起 5 次 `batch_isend_irecv`。
# - 坑：PP=2 时 interleaved 的批量收发把激活和梯度配反，rank 0 收到 201（应为 101），loss 变成 3.771，不报错。
#
# 先读：[笔记 04](../04_model_provider_and_gpt_model/)、[笔记 05](../05_forward_loss_backward/)（PP=1 的一步）、[笔记 08](../08_parallel_state_and_rank_generator/)（PP 群）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
from IPython.display import display

from snippets.pp import pictures, timeline
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n13_pipeline import (BUBBLE_HEADERS, bubble_row, mean_loss, microbatches, phase_rows,
                                               pipeline_config, pipeline_run, stage_chunks, stage_rows)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.models.tiny_gpt import forward_step, init_by_global_name, max_abs_diff, tiny_config

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed


class Folded:
    """A table that proves the page right: shown closed, one click away."""

    def __init__(self, summary, table):
        self.summary, self.table = summary, table

    def _repr_markdown_(self):
        return f"<details><summary>{self.summary}</summary>\n\n{self.table.markdown()}\n\n</details>"

    def __repr__(self):
        return self.table.markdown()


TINY = EXPERIMENTS["pipeline"].tiny
ref = run_ranks(pipeline_run, 1, TINY, pp=1)
pp2 = run_ranks(pipeline_run, 2, TINY, pp=2)
pp4 = run_ranks(pipeline_run, 4, TINY, pp=4, microbatch_counts=(1, 2, 4, 8))
vpp2 = run_ranks(pipeline_run, 2, TINY, pp=2, vp=2, batch_p2p_comm=False)
vpp4 = run_ranks(pipeline_run, 4, TINY, pp=4, vp=2, microbatch_counts=(4, 8))


def timeline_of(results, m, v):
    """The recorded orders on the logical clock, one unit = the forward of one layer."""
    per_chunk = TINY.layers // (len(results) * v)
    return timeline.logical_schedule([r["runs"][m]["ops"] for r in results], chunks=v,
                                     forward=per_chunk, backward=2 * per_chunk)


def warmups(results, m):
    return "、".join(str(timeline.phases(r["runs"][m]["ops"])[0]) for r in results)


one_f_one_b, interleaved = timeline_of(pp4, 4, 1), timeline_of(vpp4, 4, 2)
display(pictures.draw_timeline(
    one_f_one_b, unit=20, title=f"1F1B，PP=4，m=4：rank 0–3 先做 {warmups(pp4, 4)} 个 forward（p−r−1），"
                       f"共 {timeline.makespan(one_f_one_b)} 格，气泡 {timeline.bubble_fraction(one_f_one_b):.2f}"))
pictures.draw_timeline(
    interleaved, chunks=2, unit=20,
    title=f"interleaved，PP=4，VP=2，m=4：warm-up {warmups(vpp4, 4)} 个 chunk forward，"
          f"共 {timeline.makespan(interleaved)} 格，气泡 {timeline.bubble_fraction(interleaved):.2f}")

# %% [markdown]
# 两张图同一个时间刻度：一格是一层的 forward，backward 记两格，通信不计时间。1F1B 每个 stage 有 2 层，
# interleaved 每个 chunk 只有 1 层；左上和右下的空白就是气泡。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 每个配置在本机用 gloo 起 1、2 或 4 个进程（`snippets.ranks.launch.run_ranks`）。每个进程跑
#   `snippets/experiments/n13_pipeline.py` 的 `pipeline_run`：`stage_chunks` 像正式入口的 `get_model` 一样为每个
#   vp_stage 建一个 `GPTModel` chunk（local spec），`init_by_global_name` 按层的**全局**名字生成权重，所以不管怎么切，
#   第 k 层的权重都相同，结果能和 PP=1 逐元素比较；然后对每个 m 调一次 `get_forward_backward_func()` 返回的 schedule，
#   再问 `get_pp_rank_microbatches` 这个 rank 的 warm-up 有几步。
# - 记录：`snippets/pp/timeline.py` 的 `record_schedule` 在运行期间包住 `schedules.forward_step`、
#   `schedules.backward_step` 和 `P2PCommunicator` 的每个收发方法，按执行顺序记下每一步和其中发出的 collective。
# - 尺寸（`dims` 的 `tiny`）：8 层、hidden 16、2 个 head、vocab 32、sequence 8、micro-batch 2；m 取 1、2、4、8。
# - 时间线是逻辑时钟（`timeline.logical_schedule`）：重放记录到的真实顺序，一层的 forward 记 1 格、backward 2 格，
#   通信不花时间；一个操作在本 rank 空闲**且**输入已到时开始（forward 等上一 stage 同一 micro-batch 的 forward，
#   backward 等下一 stage 同一 micro-batch 的 backward）。不用墙钟：2 个 CPU 核上 4 个进程的耗时既不代表 GPU，
#   也每次不同。真实 GPU 上 p2p 的延迟、最后一个 stage 额外的输出层和 loss 都会让气泡比公式大。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 pipeline --dims tiny --pp 4` 打印本页 PP=4 的同一批表
#   （`--nproc-per-node 2 pipeline --pp 2` 是 PP=2，加 `--vp 2` 是 interleaved）；
#   `scripts/execute_notes.sh notes/13_pipeline_schedules.py` 重新执行整页。
# - PP 2–4、VP 1–2、m 4–8 每个组合的记录，在[流水线调度浏览器](../../explorers/schedules/)里逐个看。
# - CPU 上要的改动：文末「在 CPU 上怎么跑的」和 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(stage_chunks, pipeline_run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`schedules.py::get_forward_backward_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L48) | 按 PP、VP 大小三选一 |
# | [`schedules.py::forward_backward_pipelining_without_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2120) | 1F1B：warm-up、steady、cool-down 三个循环 |
# | [`schedules.py::forward_backward_pipelining_with_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L992) | interleaved 1F1B：每个 rank 有 v 个 model chunk |
# | [`schedules.py::get_pp_rank_microbatches`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L902) | 每个 rank 的 warm-up 步数公式 |
# | [`schedules.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L397) | 一次 forward（最后一个 stage 顺带算 loss） |
# | [`p2p_communication.py::P2PCommunicator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L140) | 相邻 stage 的收发 |
# | [`p2p_communication.py::P2PCommunicator._communicate`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L275) | 建接收缓冲，选批量或逐个发送 |
# | [`p2p_communication.py::_batched_p2p_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L17) | `batch_p2p_comm=True`：一次 `batch_isend_irecv` |
#
# <details><summary>其余符号（10 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`schedules.py::forward_backward_no_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L696) | PP=1：逐个 micro-batch 做 forward 再 backward |
# | [`schedules.py::backward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L532) | 一次 backward，返回对本 stage 输入的梯度 |
# | [`schedules.py::get_schedule_table`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L962) | interleaved：第 k 个 forward 是哪个 micro-batch、哪个 chunk |
# | [`schedules.py::forward_step_calc_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L290) | 最后一个 stage 调 `loss_func`，按它返回几个值缩放 loss |
# | [`p2p_communication.py::_p2p_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L55) | `batch_p2p_comm=False`：逐个 `isend` / `irecv` |
# | [`transformer_layer.py::get_transformer_layer_offset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L57) | 本 stage（本 chunk）的第一层是全局第几层 |
# | [`gpt_model.py::GPTModel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L51) | `pre_process` / `post_process` 决定本段有没有 embedding、输出层 |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 正式入口：每个 vp_stage 建一个 model chunk |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 正式入口：每步调一次 `forward_backward_func` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | simple loop 交给 schedule 的 `forward_step_func` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `train_step` → `get_forward_backward_func()` 三选一 → schedule 的 warm-up / steady / cool-down 三个循环，
# 每步一次 `forward_step` 或 `backward_step`，之间的收发都经 `P2PCommunicator._communicate`。
#
# <details><summary>完整调用链</summary>
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
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `get_forward_backward_func`、`forward_backward_no_pipelining`、`forward_step_calc_loss`、`backward_step` 的记录在
# [笔记 05](../05_forward_loss_backward/)（「调用链」下的表）；这里是流水线自己的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `forward_backward_pipelining_without_interleaving` | `forward_step_func`、data iterator、只有一个 chunk 的 model、m | 只有最后一个 stage 返回每个 micro-batch 的 loss 字典，其余返回 `[]` | `P2PCommunicator`、`forward_step`、`backward_step` | **是**：PP 群的 p2p | 模型按层切；batch 按 micro-batch 流过 | 是：累积本 stage 的梯度 | `forward_backward_func(...)` |
# | `forward_backward_pipelining_with_interleaving` | 同上，model 和 data iterator 都是 v 个的 list | 同上 | 同上 + `get_schedule_table` | **是**：PP 群的 p2p（两个方向同时） | 模型切成 p·v 段，每个 rank 持 v 段 | 同上 | 同上 |
# | `get_pp_rank_microbatches` | m、chunk 数、`microbatch_group_size_per_vp_stage` | (总 forward 数, 是否全在 warm-up, warm-up 数, 剩余数) | `parallel_state` | 只读 PP rank | 否 | 否 | schedule 内 |
# | `forward_step`（schedules.py） | `forward_step_func`、iterator、model、输入激活 | 输出激活；最后一个 stage 是经 `forward_step_calc_loss` 缩放后的 loss | `set_input_tensor`、`forward_step_calc_loss` | 否 | 否 | 否（只建 autograd 图） | `forward_step_func` 被它调用 |
# | `P2PCommunicator._communicate` | 要发的张量（前 / 后）、要不要收（前 / 后）、形状 | 收到的张量 | `_batched_p2p_ops` 或 `_p2p_ops` | **是**：PP 群 | 否 | 否 | 无（PP=1 时不用） |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 每个 stage 的 model chunk
#
# PP>1 时每个 rank 只建自己那段 `GPTModel`：`pre_process` 为真的段有词嵌入，`post_process` 为真的段有 final norm、
# 输出层和 loss。下面是一次完整的调用（PP=2、m=4）：两个 rank 各建一段，`get_forward_backward_func()` 给出 schedule，
# schedule 逐个 micro-batch 调 `forward_step`、在两段之间收发激活和梯度，只在最后一个 stage 返回每个 micro-batch 的 loss。

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

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["配置", "rank", "chunk", "pre_process", "post_process", "全局层号"],
      stage_rows("PP=1", ref) + stage_rows("PP=2", pp2) + stage_rows("PP=4", pp4)
      + stage_rows("PP=2, VP=2", vpp2) + stage_rows("PP=4, VP=2", vpp4))

# %% [markdown]
# 有 VP 时层是**轮流**分的：PP=2、VP=2 下 rank 0 拿第 1–2、5–6 层，rank 1 拿 3–4、7–8，
# 一个 micro-batch 的 forward 要在两个 rank 之间来回两趟（0→1→0→1）。
#
# ### 三选一
#
# `get_forward_backward_func` 只看两个数（[schedules.py 第 156–162 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L156-L162)）：PP 大小 > 1 吗？VP 大小是 `None` 吗？
# 两个数可以直接传入，不必先建并行状态。例外是 0.19.0 新加的 `schedule_pg_collection`：传入多模块
# （几个子模型各自一套并行网格）的群集合时直接返回 1F1B（[`schedules.py:149`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L149)）。
#
# > **旧版（core_v0.18.0）：** `get_forward_backward_func(pp_size=None, vp_size=None)` 没有 `schedule_pg_collection` 参数，
# > 只按这两个数三选一。

# %%
CONFIGS = [("PP=1", 1, None, ref), ("PP=2", 2, None, pp2), ("PP=4", 4, None, pp4),
           ("PP=2, VP=2", 2, 2, vpp2), ("PP=4, VP=2", 4, 2, vpp4)]
chosen = [[name, get_forward_backward_func(pp_size=pp, vp_size=vp).__name__] for name, pp, vp, _ in CONFIGS]
assert [func for _, func in chosen] == [r[0]["func"] for *_, r in CONFIGS]  # 各 rank 运行时拿到的也是它
Table(["配置", "get_forward_backward_func() 返回"], chosen)

# %% [markdown]
# ### 与不切分相同
#
# 同一份权重、同样 4 个 micro-batch：五种切法最后一个 stage 报出的 mean loss 都是 3.7556，各 rank 合起来的
# 69 个梯度与 PP=1 逐元素相等（下表，折叠）。每个 micro-batch 的 loss 在 backward 之前被
# [`forward_step_calc_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L290) 原地缩放，缩放方式看 `loss_func` 返回几个值：
# 本篇的 `loss_func` 返回 2 个值（平均 loss、日志），走旧的分支：先乘 CP 大小、再除以 m
# （[schedules.py 第 340–341 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340-L341)）；返回 3 个值（loss 之和、token 数、日志）时先除以 token 数、
# 再除以 m（[schedules.py 第 334–335 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L334-L335)）；开了 `calculate_per_token_loss` 则两步都不做
# （[schedules.py:331](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L331)），改由 `finalize_model_grads` 按全部 token 数归一。
# 前两种情况下，m 个 micro-batch 的梯度累加起来正好是整个 batch 平均 loss 的梯度。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def all_grads(results, m=4):
    grads = {}
    for r in results:
        grads.update(r["runs"][m]["grads"])
    return grads


reference_grads = all_grads(ref)
Folded("五种切法的 loss 和梯度与 PP=1 的比较（全部相等）",
       Table(["配置", "mean loss", "loss 相同", "梯度个数", "梯度逐元素相等"],
             [[name, round(mean_loss(r, 4), 4), mean_loss(r, 4) == mean_loss(ref, 4), len(all_grads(r)),
               all(torch.equal(g, reference_grads[k]) for k, g in all_grads(r).items())]
              for name, *_, r in CONFIGS]))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# PP 在相邻 stage 之间传的是**激活**（forward）和**对激活的梯度**（backward），形状都是
# `[seq, micro_batch, hidden]` = `[8, 2, 16]`（有 SP 时 seq 再除以 TP，有 CP 时除以 CP）。权重从不跨 stage 移动。
# 下表是 PP=2、m=4 下两个 rank 发出的全部 p2p（缺省 `batch_p2p_comm=True`）：每个 `P2PCommunicator` 方法最多发一次
# `batch_isend_irecv`，内含一两个 `isend` / `irecv`；第一个 stage 的 `recv_forward`、最后一个 stage 的
# `send_forward` 是空操作。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
p2p = timeline.p2p_rows(pp2[0]["runs"][4]["ops"], 0) + timeline.p2p_rows(pp2[1]["runs"][4]["ops"], 1)
print("API:", sorted({row[3] for row in p2p}), " group:", sorted({row[4] for row in p2p}))
Table(["rank", "在这步之后", "P2PCommunicator 方法", "ops（→发给、←收自）", "shape 前 = 后"],
      [[rank, after, method, ops, shapes] for rank, after, method, _, _, ops, shapes, _ in p2p])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["P2PCommunicator 方法", "语义"],
      [[method, timeline.P2P_MEANINGS[method]] for method in dict.fromkeys(row[2] for row in p2p)])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pictures.draw_timeline(timeline.logical_schedule([r["runs"][4]["ops"] for r in pp2], forward=1, backward=2),
                       title="1F1B，PP=2，m=4：每条箭头是上表里配成一对的 isend / irecv", unit=40)

# %% [markdown]
# 黄色箭头是配成一对的 `isend` / `irecv`：向下是激活，向上是梯度。
#
# - **通信前后 shape 相同**：p2p 只是把一个 `[8, 2, 16]` 搬到另一个 rank，不拼接不求和。接收方按 `tensor_shape`
#   和 `config.pipeline_dtype` 预先建好空缓冲（`_communicate` 里），所以 `pipeline_dtype` 必填，变长序列要开
#   `variable_seq_lengths` 先传形状。
# - **成对出现**：rank 0 的每个 `isend→1` 都对应 rank 1 的一个 `irecv←0`，顺序一致。
# - **steady 一步两次通信**：`send_forward_recv_backward`（发出 forward 的结果、等回它对应的梯度）和
#   `send_backward_recv_forward`（发回梯度、收下一个 micro-batch 的激活）。1F1B 的一次调用从不同时向两个方向发。

# %% [markdown]
# ## 机制解释
#
# ### warm-up、steady、cool-down
#
# 非 interleaved：rank r 先做 `p−r−1` 个只有 forward 的 warm-up（[schedules.py 第 2243–2244 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2243-L2244)，
# 不超过 m；0.19.0 写成通信器的 stage 总数 − 当前 stage − 1，即 PP 群大小与本 rank 序号，
# [`p2p_communication.py::P2PCommunicator.total_stages`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L177)、
# [`p2p_communication.py::P2PCommunicator.current_stage`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L182)），然后 `m − warm-up` 个"一个 forward 接一个 backward"的 steady 步，
# 最后补做 warm-up 那么多个 backward（cool-down）。为什么是 p−r−1：rank r 的第一个 backward 要等这个 micro-batch 走完后面
# p−r−1 个 stage 再传回来，这段时间里它能做的只有后面 micro-batch 的 forward。
#
# interleaved 以 chunk 的 forward 计，总数是 v·m，warm-up 是 `(p−r−1)·2 + (v−1)·g`（g = `microbatch_group_size_per_vp_stage`，
# 缺省等于 p；[schedules.py 第 937–938 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L937-L938)）：先让每个 rank 的前 v−1 个 chunk 各吃进 g 个 micro-batch，
# 再加上与 stage 位置有关的部分。下面在每个 rank 上直接问这个公式，再和运行记录里数出来的比：一个 forward 之后紧接着
# backward、中间只隔 `send_forward_recv_backward`（interleaved 时什么也不隔），算一个 steady 步，这正是 steady 循环的写法。

# %%
def warmup_counts(pp, vp, ms):
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp)
    counts = {}
    for m in ms:
        total, all_in_warmup, warmup, remaining = get_pp_rank_microbatches(m, vp or 1, pp)
        counts[m] = (warmup, remaining, total - remaining)  # (warm-up, steady, cool-down)
    return counts


rows = []
for name, pp, vp, ms, run in [("PP=4", 4, None, (4, 8, 2), pp4), ("PP=2, VP=2", 2, 2, (4,), vpp2),
                              ("PP=4, VP=2", 4, 2, (4,), vpp4)]:
    code = run_ranks(warmup_counts, pp, pp, vp, ms)
    rows += [[name, m, rank, code[rank][m], timeline.phases(run[rank]["runs"][m]["ops"]),
              code[rank][m] == timeline.phases(run[rank]["runs"][m]["ops"])] for m in ms for rank in range(pp)]
Table(["配置", "m", "rank", "代码 (warm-up, steady, cool-down)", "记录", "相同"], rows)

# %% [markdown]
# 每一行公式与记录相同。两处截断要看清：PP=4、m=2 时，rank 0 的公式给出 3，被截到 m=2；rank 1 的公式给出 2，
# 本来就等于 m，不用截。两个 rank 都把全部 micro-batch 放在 warm-up 里做完，没有 steady 步。
# PP=4、VP=2、m=4 时总数 v·m=8，rank 0 的公式给出 3·2+4=10，被截到 8；rank 1 给出 2·2+4=8，正好等于总数
# （`get_pp_rank_microbatches` 返回的第二项为真）。
#
# 每个 rank 依次做了什么（PP=4、m=4；`F2` = micro-batch 2 的 forward，只列计算），就是页首第一张图从左往右读：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["rank", "记录到的顺序"],
      [[rank, " ".join(timeline.label(op) for op in timeline.compute_ops(r["runs"][4]["ops"]))]
       for rank, r in enumerate(pp4)])

# %% [markdown]
# ### 时间线与气泡
#
# 页首两张图把记录到的顺序放到逻辑时钟上重放：一个操作在本 rank 空闲、输入也已到时才开始。
#
# - 左上和右下的空白三角就是**气泡**：rank 3 要等 3 个 stage 的 forward 走完才能开始，rank 0 做完自己的
#   forward 后要等 backward 从 rank 3 一路传回来。
# - 1F1B 的 steady 段里每个 rank 交替做一个 forward、一个 backward，同时"在途"的 micro-batch 最多 p−r 个，
#   激活内存与 m 无关。
# - interleaved 把每个 stage 再切成 v 段，流水线"填满"所需的时间按一段算，短了 v 倍：同样 4 个 micro-batch，
#   总长从 42 格缩到 33 格。代价是 p2p 次数变成 v 倍，warm-up 要存的激活也更多。
#
# 气泡比例 = 所有 rank 的空闲时间 ÷ (rank 数 × 总时长)。非 interleaved 时，每个 rank 忙 m·(f+b)，总时长
# (m+p−1)·(f+b)，所以比例是 (p−1)/(m+p−1)，与 f、b 的比例无关；interleaved 的每段只有 1/v 的层，
# 比例变成 (p−1)/(v·m+p−1)。下表从记录里量，总时长与图用同一个单位：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(BUBBLE_HEADERS,
      [bubble_row("1F1B", pp2, 4, 2, 1, TINY.layers)]
      + [bubble_row("1F1B", pp4, m, 4, 1, TINY.layers) for m in (1, 2, 4, 8)]
      + [bubble_row("interleaved", vpp2, 4, 2, 2, TINY.layers)]
      + [bubble_row("interleaved", vpp4, m, 4, 2, TINY.layers) for m in (4, 8)])

# %% [markdown]
# 每一行都与公式相等：schedule 在依赖允许的范围内没有多余的等待。要压低气泡，要么加大 m，要么用 interleaved。
#
# ### 为什么结果与 PP=1 相同
#
# - 每个 stage 的 `backward_step` 用收到的输出梯度调 `torch.autograd.backward(output, grad)`，这正是把
#   整个网络的 backward 在 stage 边界处切开：链式法则在边界上传的就是这个梯度。
# - loss 已按上文缩放，梯度在 `.grad` 上累加 m 次，等于整个 batch 平均 loss 的梯度。
# - 各 stage 之间不共享权重（本篇写明 `share_embeddings_and_output_weights=False`；正式入口缺省共享，见遗留问题 3）。

# %% [markdown]
# ## 与训练主链路的关系
#
# `train_step` 每步调一次 `forward_backward_func`，交给它本 DP rank 的 m 个 micro-batch
# （m = global batch ÷ (micro batch × DP)）。schedule 返回时各 stage 的梯度已累加好；设了 `finalize_model_grads_func`
# 时 DP、SP norm、首尾 embedding 的梯度归约也已做完，然后才是优化器的 `step`（[笔记 15](../15_distributed_optimizer/)）。
# DDP 的 `no_sync` 让前 m−1 个 micro-batch 不触发梯度归约（[笔记 14](../14_data_parallel_ddp/)）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **链式法则的切分**：一个 stage 的 backward 只需要"对本 stage 输出的梯度"和本 stage 保存的激活，
#   这让每段网络可以放在不同的卡上。
# - **流水线气泡**：和 CPU 指令流水线一样，填满和排空需要 p−1 个时间步；任务（micro-batch）越多，
#   固定的填充开销占比越小。
# - **1F1B vs GPipe**：两者气泡相同；1F1B 让每个 rank 尽早做 backward、释放激活，峰值激活内存从 m 个
#   micro-batch 降到最多 p 个。
# - **点对点通信**：同一对 rank 之间的多条 `isend` / `irecv` 按发出顺序配对（遗留问题 1 出在这里）。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. interleaved + PP=2 + `batch_p2p_comm=True` 算错了：是 Megatron 的问题，不是 gloo 的。**
# 同一配置只把 `batch_p2p_comm` 从 False 换回缺省的 True：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
vpp2_batched = run_ranks(pipeline_run, 2, TINY, pp=2, vp=2, batch_p2p_comm=True)
print("loss:", round(mean_loss(vpp2_batched, 4), 3), "vs PP=1", round(mean_loss(ref, 4), 3))
print("梯度与 PP=1 最大差超过 1:", max_abs_diff(all_grads(vpp2_batched), reference_grads) > 1)

# %% [markdown]
# 原因在三处代码的组合：
#
# - PP=2 时前后邻居是同一个 rank：`P2PCommunicator.__init__` 按 PP 群取模算邻居
#   （[p2p_communication.py 第 155–156 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L155-L156)），rank 0 的 prev 和 next 都是 rank 1。
# - interleaved 的 steady 步用 `send_forward_backward_recv_forward_backward`
#   （[`schedules.py:1908`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L1908)），
#   一次同时向两个方向各发一个、各收一个。1F1B 从不在一次调用里两个方向都发，不受影响。
# - `_batched_p2p_ops` 把这四个操作按 send_prev、recv_prev、send_next、recv_next 的顺序放进一批
#   （[p2p_communication.py 第 32–47 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/p2p_communication.py#L32-L47)）。
#   发往同一个 rank 的消息按顺序与对方的接收配对：rank 0 先发**梯度**（send_prev），rank 1 先收**激活**
#   （recv_prev）。两个方向的张量互换了，形状又一样，所以不报错，只是算错。
#
# 直接调真实的 `send_forward_backward_recv_forward_backward` 验证：每个 rank 发出 `100 + rank` 的"激活"和
# `200 + rank` 的"梯度"：

# %%
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
# 表的最后一列里，rank 0 → 1 的消息都在 `pp` 群上，1 → 0 的都在 `world` 群上，每个方向两端的顺序一致。
#
# **不是 gloo 的错**：NCCL 同样让一组调用里发往同一个 peer 的点对点操作按顺序配对
# （[NCCL user guide: point-to-point communication](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/p2p.html)）。
# Megatron 自己知道这个限制：正式入口在
# [`arguments.py:972`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L972)
# 断言"interleaved 且不开 p2p overlap 时 PP 必须大于 2"；而正式入口默认开 overlap，`batch_p2p_comm = not overlap_p2p_comm` 为 False
# （[`argument_utils.py:307`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L307)），
# 走逐个发送。但这个检查只在 `megatron/training` 里：直接用 Megatron Core 的人拿到 `batch_p2p_comm=True` 的缺省值，
# `ModelParallelConfig` 和 schedule 都不检查，结果静默出错。
#
# **2. loss 被原地缩放。** `forward_step_calc_loss` 对 `loss_func` 返回的 loss 原地做除法（两个分支都是：
# [`schedules.py:335`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L335)、
# [`schedules.py:341`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L341)）。
# 日志字典里若放 `loss.detach()`（共享存储），记下的值也跟着被缩放；本篇的 `loss_func` 因此用 `detach().clone()`。
#
# **3. 共享词嵌入 + PP>1：最后一个 stage 有一份词嵌入的副本。** 正式入口缺省共享：最后一个 stage 构造时
# `setup_embeddings_and_output_layer` 把输出层权重清零、搬到 GPU
# （[`language_module.py:307`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L307)），
# 再在 embedding 群（首尾 stage）里 all-reduce 出与第一个 stage 相同的初值；梯度在 `finalize_model_grads`
# 里经这个群求和（[笔记 14](../14_data_parallel_ddp/)）。PP=2、`share_embeddings_and_output_weights=True`：

# %%
def shared_copies():
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
# 两份张量，构造完就逐位相同。本篇其余部分不共享，好让每个 stage 的梯度直接和 PP=1 比较。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部 rank 都是本机 gloo 进程；p2p 在 gloo 上的配对规则与 NCCL 相同，所以遗留问题 1 在这里同样复现。
# - 主要的几次运行里，interleaved + PP=2 用 `batch_p2p_comm=False`（`snippets/experiments/n13_pipeline.py` 的
#   `batch_p2p_comm_for` 在命令行入口里也这样选），否则就撞上遗留问题 1；interleaved + PP=4 用缺省的批量收发。
# - 共享词嵌入：`setup_embeddings_and_output_layer` 里的 `weight.data = weight.data.cuda()` 在 CPU 版 torch 上报错，
#   而这是 Tensor 方法，模块级代理管不到。CPU 层的补丁 `shared_embedding_cuda` 只在这个方法运行期间让 `.cuda()`
#   返回张量本身，all-reduce 照常在 gloo 上做：两个 stage 的两份词嵌入开始时逐位相同，`finalize_model_grads` 之后
#   两份的梯度都等于两个 stage 梯度之和（[CPU 补丁一览](../../cpu/)）。
# - `loss_func`（`snippets/models/tiny_gpt.py`）返回 2 个值，所以本篇只走 `forward_step_calc_loss` 的旧分支。
#
# </details>

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
