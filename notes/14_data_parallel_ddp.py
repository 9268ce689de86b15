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
# # 14 数据并行 DDP：bucket 的顺序、overlap 与流水线 stage
#
# Megatron 的 `DistributedDataParallel` 把梯度放进一块连续的 buffer、切成 bucket，每个 bucket 一次 all-reduce。
# bucket 按什么顺序排？backward 进行到哪一步才发通信，通信前乘的是 1/DP 还是别的数？加上流水线以后，
# 为什么只有第一个 stage 分 bucket，其余 stage 的 all-reduce 又落在哪里？`main_grad`、grad buffer 和
# `finalize_model_grads` 的基本用法在[笔记 06](../06_gradient_sync_and_optimizer/)，本篇只讲 bucket 和 overlap。

# %% [markdown]
# ## 阅读目标
#
# 1. buffer 怎样布局：参数倒序排放，在参数边界切 bucket，bucket 与 bucket group 怎样对应。
# 2. `overlap_grad_reduce` 时 hook 怎样在一个 bucket 的最后一个梯度到齐时发 all-reduce，`no_sync` 挡住哪些 micro-batch，第 1 步为什么不 overlap。
# 3. 通信前乘的缩放因子是多少，由哪个群的大小决定。
# 4. 与流水线的关系：为什么只有 pp_rank 0 分 bucket，其余 stage 的 all-reduce 为什么不占时间。
#
# **结论**
#
# - 参数倒序排进 9632 个元素的 buffer，`bucket_size=1000` 切出 9 个 bucket；bucket 0（输出层那端，1056 个）最先凑齐。
# - overlap：bucket 的最后一个梯度到齐就发异步 all-reduce，第 2 步 9 次全在 backward 里；第 1 步只数数，9 次都在 finalize。
# - 通信前乘 1/(dp-cp 群大小)，不是 1/DP：DP=2、CP=2 时因子是 0.25。
# - PP=2：只有 stage 0 分 bucket（5 个，在最后一个 backward 里陆续发）；stage 1 的 4768 个元素一个 bucket，发出后还空闲 4 格。
# - 共享词嵌入时，finalize 还在 embedding 群 [0, 2] 里把首尾两份 `[32, 16]` 的梯度相加。
#
# 先读：[笔记 06](../06_gradient_sync_and_optimizer/)（`main_grad`、`finalize_model_grads`）、[笔记 13](../13_pipeline_schedules/)（1F1B 的顺序与逻辑时钟）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
from IPython.display import Markdown, display

from snippets.dp import grad_buffers, pictures, pipeline_buckets
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n13_pipeline import pipeline_config
from snippets.experiments.n14_ddp import MEANINGS, build_model, ddp_run, pipeline_ddp_run, recorded_pipeline_step
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, by_global_name, concat, forward_step, init_by_global_name, \
    max_abs_diff, microbatches, tiny_config

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig

TINY = EXPERIMENTS["ddp"].tiny
pipelined = run_ranks(pipeline_ddp_run, 4, TINY, pp=2, bucket_size=1000)
ticks = pipeline_buckets.starts(pipelined, 1, TINY.layers)
step_end = max(end for row in pipeline_buckets.clock(pipelined, 1, TINY.layers) for _, _, end in row)
pipeline_buckets.draw(
    pipelined, 1, TINY.layers,
    title=f"PP=2×DP=2，第 2 步：stage 0 的 {len(ticks[0])} 个 bucket 在最后一个 backward 里陆续 all-reduce，"
          f"stage 1 只有 {len(ticks[1])} 个，发出后还有 {step_end - ticks[1][-1][0]:g} 格")

# %% [markdown]
# 一个 4 层的小 `GPTModel` 切成 2 个 stage、每个 stage 2 个 DP rank，每个 DP rank 4 个 micro-batch，包进 DDP、开 overlap，
# 画的是 DP rank 0 那条流水线第 2 步的 1F1B（一格 = 一层的 forward，backward 记两格）。黄线是一个 bucket 的 all-reduce 开始的时刻。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n14_ddp.py`（实验名 `ddp`）：`build_model` 建 local spec 的 `GPTModel`，权重按全局名字生成
#   （`snippets.models.tiny_gpt.init_by_global_name`），所以每个 rank 起点相同；`ddp_run` 在每个 rank 上包 DDP、把 `no_sync`
#   挂到 config 上、跑 schedule 再调 `finalize_model_grads`，两段都用 `snippets.record.recorder` 录下通信，
#   `snippets.dp.overlap_timeline.markers` 在同一张记录里记下模块 forward 和参数梯度的先后（三条时间线的图用它）。
# - 页首的图：`pipeline_ddp_run` 在 4 个 rank（PP=2×DP=2）上建每个 stage（共享词嵌入），用
#   `snippets.pp.timeline.record_schedule` 记下 schedule 的 forward / backward 顺序，并临时包住 bucket group 的
#   `start_grad_sync`，记下它在哪个 backward 里、那时这个 backward 已算出几个参数梯度。`snippets/dp/pipeline_buckets.py`
#   把顺序放到笔记 13 的逻辑时钟上（一层 forward 1 格、backward 2 格，通信不计时），黄线按已算出的梯度比例画在 backward 里。
# - 尺寸是实验的 `tiny`：4 层、hidden 16、vocab 32、sequence 8、micro-batch 2；DP=2 的运行一个 global batch 4 个 micro-batch，
#   每个 DP rank 2 个；PP 的运行每个 DP rank 4 个。模型不到 1 万个参数，缺省的 bucket（4000 万个元素起）只会有一个，
#   所以开 overlap 的运行都设 `bucket_size=1000`。
# - rank 是本机 gloo 进程（`snippets.ranks.launch.run_ranks` 从 notebook 里 fork）。复现：
#   `.venv/bin/python -m snippets.run --nproc-per-node 2 ddp --dims tiny` 打印本页 DP=2 的 bucket 表和三张通信表；
#   `scripts/execute_notes.sh notes/14_data_parallel_ddp.py` 重新执行整页。
# - CPU 上要的改动见文末「在 CPU 上怎么跑的」和 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(ddp_run, pipeline_ddp_run, recorded_pipeline_step)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L44) | 定 bucket 大小（pp_rank>0 不分）、算缩放因子、建 buffer 和 bucket group、挂 hook |
# | [`distributed_data_parallel.py::DistributedDataParallel._make_backward_post_hook`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L468) | 梯度加进 `main_grad`，报告"就绪" |
# | [`distributed_data_parallel.py::DistributedDataParallel.no_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L504) | 非最后一个 micro-batch：只累加，不记账 |
# | [`param_and_grad_buffer.py::_compute_default_per_buffer_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L947) | 参数倒序排放，在参数边界切 bucket |
# | [`param_and_grad_buffer.py::partition_buckets`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L1652) | bucket 编成 bucket group（没有 fp8 时一组一个） |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.register_grad_ready`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L857) | 计数与标准答案相同就发通信 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | 乘缩放因子，发 all-reduce（分布式优化器时 reduce-scatter，笔记 15） |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.finish_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L781) | 不 overlap 或第 1 步：现在发；否则等它完成 |
# | [`schedules.py::forward_backward_pipelining_without_interleaving`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2120) | 最后一个 micro-batch 的 backward 之前才退出 `no_sync` |
#
# <details><summary>其余符号（12 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | 包装模型 |
# | [`distributed_data_parallel.py::DistributedDataParallel.zero_grad_buffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L603) | 每步开始清零 buffer、复位 bucket group |
# | [`distributed_data_parallel_config.py::DistributedDataParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel_config.py#L12) | `overlap_grad_reduce`、`bucket_size`、`average_in_collective` 等 |
# | [`param_and_grad_buffer.py::_ParamAndGradBuffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L998) | 一块连续 buffer：照布局分配、建 bucket、`main_grad` 视图 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucket`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L92) | buffer 的一段 + 其中的参数 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L179) | 一起通信的 bucket；记账"哪些参数的梯度齐了" |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.reset`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L288) | 第 1 步结束时存下标准答案 |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | schedule 结束后：完成 DP 归约，再做 TP / PP 上的特殊归约（笔记 06） |
# | [`finalize_model_grads.py::_allreduce_word_embedding_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L164) | PP>1 共享词嵌入时首尾 stage 的梯度求和 |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | SP 下 norm 等非 TP 参数的梯度在 TP 群求和（笔记 10、11） |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 正式入口：建模型后用 DDP 包装，按 chunk 和 pp_rank 定 bucket 大小 |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342) | 正式入口：把 `no_sync`、`grad_sync_func`、`finalize_model_grads` 挂到 config 上 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 构造时：倒序布局 → 切 bucket → 一个 bucket 一个 group → 每个参数挂 hook。每步：`zero_grad_buffer` → schedule（前 m−1 个
# micro-batch 在 `no_sync` 里）→ 最后一个 micro-batch 的 backward 里 hook 凑齐一个 bucket 就发 all-reduce →
# `finalize_model_grads` 等它们完成。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::get_model → wrap_model_chunks_with_ddp → DistributedDataParallel(config, ddp_config, module)
# ├─ bucket_size: 缺省 max(4e7, 1e6·DP) 个元素；overlap_grad_reduce=False 时改成 None（整块一个 bucket）
# ├─ pp_rank > 0 或 disable_bucketing: bucket_size = None                 # 只有第一个 stage 分 bucket
# ├─ 缩放因子 = 1/|dp-cp 群|（average_in_collective=False 时；求和之前乘）
# ├─ group_params_for_buffers: 按 (param dtype, grad dtype, 是否专家参数) 分组
# ├─ _ParamAndGradBuffer(..., param_layout)  每组一块                     # 纯本地：分配 + 视图
# │  ├─ 没有传入布局时 _compute_default_per_buffer_param_layout:
# │  │     参数倒序排放；累计 ≥ bucket_size 就封一个 bucket                 # 分布式优化器的布局带补齐，笔记 15
# │  └─ param.main_grad = grad_data[start:end].view(shape)
# ├─ partition_buckets → _ParamAndGradBucketGroup                          # 一个 bucket 一组
# └─ 每个参数的 grad accumulator 上 register_hook(_make_backward_post_hook)
#
# 每一步（megatron/training/training.py::train_step）
# ├─ ddp.zero_grad_buffer()                                  # grad_data 清零；第 1 步之后存下标准答案
# ├─ forward_backward_func(...)                              # 笔记 13
# │  ├─ with config.no_sync_func():  前 m−1 个 micro-batch    # hook 只累加
# │  └─ 最后一个 micro-batch 的 backward（PP 时 align_grad_reduce 只对第一个 stage 这样做）
# │     └─ hook: main_grad += grad; grad = None
# │        └─ overlap 且非第一步: register_grad_ready → start_grad_sync   # all_reduce(dp-cp)，异步
# └─ config.finalize_model_grads_func = finalize_model_grads([ddp])
#    ├─ ddp.finish_grad_sync()
#    │  └─ 不 overlap（或第一步）: start_grad_sync → all_reduce(dp-cp)；overlap: wait
#    ├─ _allreduce_non_tensor_model_parallel_grads            # SP 时 all_reduce(tp)
#    ├─ _allreduce_word_embedding_grads                       # PP>1 且共享词嵌入时 all_reduce(embd)
#    └─ calculate_per_token_loss 时按 token 数缩放              # broadcast(pp) + all_reduce(dp-cp)
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `DistributedDataParallel(...)` 和 `finalize_model_grads` 的记录在[笔记 06](../06_gradient_sync_and_optimizer/)（「调用链」下的表）；这里是 bucket 和 overlap 自己的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `_compute_default_per_buffer_param_layout` | 一组参数、`bucket_size` | 每个参数的 (start, end, bucket)、每个 bucket 的区间 | 无 | 否 | 否（只算下标） | 否 | `DistributedDataParallel(...)` 之内 |
# | `_ParamAndGradBuffer.__init__` | 参数列表、dtype、`bucket_size`、DP 群、布局（可选） | buffer + buckets | `_compute_default_per_buffer_param_layout`、`_ParamAndGradBucket` | 只记下 DP 群 | 否 | 是：`param.main_grad`（分布式优化器时还有 `param.data`）改指向 buffer | 同上 |
# | `partition_buckets` | 各 buffer | bucket group 的 list | `_ParamAndGradBucketGroup` | 只记下群 | 否 | 否 | 同上 |
# | backward hook | 参数的 `.grad` | 无 | `register_grad_ready` | overlap 时**是**：all-reduce | 否 | 是：`main_grad += grad`，`grad = None` | `loss.backward()` 之内 |
# | `no_sync` | 无 | 上下文 | bucket group 的 `is_last_microbatch` | 否 | 否 | 暂时关闭"就绪"记账 | 由 schedule 调用 |
# | `register_grad_ready` | 参数 | 无 | `start_grad_sync` | 凑齐时**是** | 否 | 是：计数 | backward 之内 |
# | `start_grad_sync` | 本 group 的 bucket | 无（或异步句柄） | `torch.cuda.current_stream`（先等 CUDA graph 留下的梯度事件）、`torch.distributed.all_reduce` | **是**：`dp-cp` | 否（整段求和） | 是：buffer 里的梯度变成 DP 平均 | `finalize_model_grads` 之内 |
# | `finish_grad_sync` | 无 | 无 | `start_grad_sync` 或句柄 `wait` | **是** | 否 | 同上 | 同上 |
# | `zero_grad_buffer` | 无 | 无 | buffer / bucket group 的 `reset` | 否 | 否 | 是：梯度清零；第 1 步后存下标准答案 | simple loop **没有**调用（遗留问题 2） |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 包一层 DDP，得到一块 buffer 和一串 bucket
#
# 本篇读的 Megatron 调用是这一句：把 `GPTModel` 包进 `DistributedDataParallel`。在 2 个 rank（DP=2）上只包装、不训练，
# 开 overlap、`bucket_size=1000`：

# %%
def wrap_in_ddp(dims):
    parallel_state.initialize_model_parallel()  # DP=2
    model, config = build_model(dims)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=1000), model)
    buffer = ddp.buffers[0]
    return (type(ddp.module).__name__, list(buffer.grad_data.shape), len(buffer.buckets), len(ddp.bucket_groups),
            grad_buffers.bucket_rows(ddp))


wrapped = run_ranks(wrap_in_ddp, 2, TINY)
Table(["rank", "里面的 module", "grad buffer 形状", "bucket 数", "bucket group 数"], [[r, *w[:4]] for r, w in enumerate(wrapped)])

# %% [markdown]
# 每个 bucket 是 buffer 的哪一段、装了哪些参数（rank 0，buffer 顺序，省略开头的 `decoder.`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["bucket", "offset", "元素", "补齐后", "参数（buffer 顺序，省略开头的 decoder.）"], wrapped[0][4])

# %% [markdown]
# - **倒序**：buffer 从 `output_layer.weight` 开始、以 `embedding.word_embeddings.weight` 结束，与 `named_parameters()` 的注册顺序相反
#   （[param_and_grad_buffer.py 第 973 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L973)）。
#   backward 大体按这个顺序产出梯度，所以 bucket 0 最先凑齐。
# - **在参数边界封口**：累计元素数一到 `bucket_size` 就在当前参数之后封口（[param_and_grad_buffer.py 第 979 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L979)），
#   所以 bucket 大小不一（1056、1312……），一个参数从不跨两个 bucket。不用分布式优化器时不补齐（补齐是[笔记 15](../15_distributed_optimizer/)的事）。
# - **一个 bucket 一个 group**：没有 fp8 参数时 `partition_buckets` 给每个 bucket 建一个 `_ParamAndGradBucketGroup`
#   （[param_and_grad_buffer.py 第 1723–1737 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L1723-L1737)），通信和"齐没齐"的记账都按 group 做，所以 9 个 bucket 就是 9 次 all-reduce。
#
# 一个只凭参数大小重算布局的十几行函数给出的区间和 bucket 边界与 Megatron 建出的完全相同（表在折叠里）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
plain = run_ranks(ddp_run, 2, TINY, overlap_grad_reduce=False)
overlapped = run_ranks(ddp_run, 2, TINY, overlap_grad_reduce=True, bucket_size=1000, iterations=2)
rows = overlapped[0]["params"]
mine = grad_buffers.layout([end - start for _, _, start, end, _ in reversed(rows)], bucket_size=1000)
same = ([r[2:] for r in reversed(rows)] == [list(r) for r in mine.param_ranges],
        mine.buckets == [(r[1], r[1] + r[3]) for r in overlapped[0]["buckets"]])
Markdown(f"<details><summary>重算的布局与真实 buffer 相同：区间 {same[0]}，bucket 边界 {same[1]}</summary>\n\n"
         + Table(["参数", "shape", "start", "end", "bucket"], rows[:6] + rows[-2:]).markdown() + "\n\n</details>")

# %% [markdown]
# ### 缩放因子：1/(dp-cp 群大小)
#
# 通信前每个 bucket 乘的因子存在 bucket 上。在 4 个 rank 上分别按 CP=1（DP=4）和 CP=2（DP=2）包一个最小的模块，
# 再看 `average_in_collective=True` 时：

# %%
def scaling_factors():
    rows = []
    for cp, average in [(1, False), (2, False), (2, True)]:
        parallel_state.initialize_model_parallel(context_parallel_size=cp)
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, context_parallel_size=cp)
        ddp_config = DistributedDataParallelConfig(average_in_collective=average)
        ddp = DistributedDataParallel(config, ddp_config, torch.nn.Linear(16, 16))
        rows.append([cp, average, ddp.dp_group.size(), ddp.dp_cp_group.size(),
                     ddp.buffers[0].buckets[0].gradient_scaling_factor])
        parallel_state.destroy_model_parallel()
    return rows


Table(["CP", "average_in_collective", "DP 群大小", "dp-cp 群大小", "通信前乘的因子"], run_ranks(scaling_factors, 4)[0])

# %% [markdown]
# DP=2、CP=2 时因子是 0.25 而不是 0.5：分母是 dp-cp 群的大小（[distributed_data_parallel.py 第 210–212 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L210-L212)），
# all-reduce 也在这个群里做。CP 的 rank 各算同一批序列的一段 token，参数梯度只是部分，要和别的 DP rank 的一起求和
# （[笔记 16](../16_context_parallel/)）。`average_in_collective=True` 时不预乘，改用 AVG 归约
# （[param_and_grad_buffer.py 第 665–666 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L665-L666)），结果一样是平均。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 三种走法：不 overlap、overlap 第 1 步、overlap 第 2 步
#
# 同一个 DP=2 的训练步（每个 rank 2 个 micro-batch，`no_sync` 挂在 config 上，和正式入口一样），分别不开 overlap，
# 和开 overlap、`bucket_size=1000` 连跑 2 步，录下 schedule 和 `finalize_model_grads` 期间的全部通信（rank 0；
# 蓝 = 一串模块的 forward，红 = 一串参数的梯度，黄 = 一个 bucket 的 all-reduce）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pictures.draw_ddp_timeline(plain[0], overlapped[0])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
runs = [("不 overlap", plain[0]["steps"][0]), ("overlap，第 1 步", overlapped[0]["steps"][0]),
        ("overlap，第 2 步", overlapped[0]["steps"][1])]
display(Table(["运行", "schedule 期间（backward 里）", "finalize_model_grads 期间", "每次的 shape"],
              [[name, len(step["schedule"]), len(step["finalize"]),
                " ".join(c.before for c in step["schedule"] + step["finalize"])] for name, step in runs]))
Markdown("\n\n".join(f"<details><summary>{name}：通信表</summary>\n\n"
                     f"{communication_table(step['schedule'] + step['finalize'], MEANINGS).markdown()}\n\n</details>"
                     for name, step in runs))

# %% [markdown]
# - **shape 不变**：all-reduce 原地求和，`[9632]` 还是 `[9632]`；overlap 时每次是一个 bucket 的那一段。
# - **不 overlap**：整块一个 bucket，schedule 期间没有 DP 通信，`finalize_model_grads` → `finish_grad_sync` → `start_grad_sync`
#   先乘因子再在 `dp-cp` 群 all-reduce，通信表的 phase 是 grad sync。
# - **overlap 第 2 步**：9 次 all-reduce 都由参数的 hook 在 autograd 执行 backward 的过程中发出（phase 是 backward），
#   bucket 0（输出层那端）最先凑齐、最先发，后面的层还在算梯度。这就是 overlap：通信藏在计算后面。
# - **overlap 第 1 步却全在 finalize 里**；两个 micro-batch 也只通信一次：第一个 micro-batch 在 `no_sync` 里，hook 只累加。原因见机制解释。
#
# 归约之后两个 rank 的 `main_grad` 都等于一个进程吃下全部 8 条序列的梯度，这是[笔记 06](../06_gradient_sync_and_optimizer/)已确认的事，这里不再重复。
#
# ### 流水线：每个 stage 各有一个 DDP
#
# PP>1 时每个 rank 只包自己那个 stage（共享词嵌入，正式入口的缺省）。4 个 rank、PP=2×DP=2，同样 `bucket_size=1000`：

# %%
def buckets_of_each_stage(dims):
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp=2)
    stage = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=dims.vocab, max_sequence_length=dims.seq,
                     share_embeddings_and_output_weights=True, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=1000), stage)
    return (parallel_state.get_pipeline_model_parallel_rank(), torch.distributed.get_process_group_ranks(ddp.dp_cp_group),
            ddp.bucket_size, [bucket.grad_data.numel() for group in ddp.bucket_groups for bucket in group.buckets])


Table(["rank", "pp_rank", "dp-cp 群", "DDP 用的 bucket_size", "各 bucket 的元素数"],
      [[r, *s] for r, s in enumerate(run_ranks(buckets_of_each_stage, 4, TINY))])

# %% [markdown]
# stage 1（rank 2、3）的 `bucket_size` 是 `None`：传进去的 1000 被 DDP 丢掉了，整个 stage 一个 bucket。DP 群是 [0, 1] 和 [2, 3]，
# 同一条流水线是 [0, 2] 和 [1, 3]。页首那一步的 `finalize_model_grads` 里（DP 的 all-reduce 已在 backward 里发完），
# 只剩首尾 stage 之间的一次：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(pipelined[0]["steps"][1]["finalize"], MEANINGS)

# %% [markdown]
# 共享词嵌入时，stage 0 的词嵌入和 stage 1 的输出层是同一个矩阵的两份副本（[笔记 13](../13_pipeline_schedules/) 的遗留问题 3）。
# 两份各自收到一部分梯度，`_allreduce_word_embedding_grads` 在 embedding 群（每条流水线的首尾 stage）里把 `[32, 16]` 的两份梯度相加，
# 两份副本才会一起更新。它在 DP 归约之后做，加的已是 DP 平均过的梯度。

# %% [markdown]
# ## 机制解释
#
# **hook 何时发通信。** DDP 在每个参数的 grad accumulator 上挂 hook：梯度加进 `main_grad` 后，overlap 时调这个参数所在 bucket group
# 的 `register_grad_ready`（[distributed_data_parallel.py 第 496–499 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L496-L499)）。
# 它只在 `is_last_microbatch` 为真时记账：数这个参数报到了几次，整个 group 的计数与"标准答案"相同，就调 `start_grad_sync` 发出异步
# all-reduce（[param_and_grad_buffer.py 第 870–879 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L870-L879)）。
# 所以一个 bucket 的通信在它**最后一个**梯度到齐的那一刻开始，bucket 越靠输出端越早。`no_sync` 把所有 group 的 `is_last_microbatch`
# 置假（[distributed_data_parallel.py 第 504–514 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L504-L514)），
# 1F1B 在最后一个 micro-batch 的 backward 之前才退出它（[schedules.py 第 2398–2400 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2398-L2400)，
# 有 cool-down 时在[schedules.py 第 2425–2427 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2425-L2427)），
# 前面的 micro-batch 只累加。
#
# **第 1 步为什么不 overlap。** 标准答案 `golden_per_param_grad_ready_counts` 是第 1 步数出来的：一个参数在一次 backward 里可能报到不止一次
# （同一个参数被用了两次），只有数过才知道"齐了"是什么样子。第 1 步的 hook 只数不发；`finish_grad_sync` 看到 `is_first_batch` 就在那里补发
# （[param_and_grad_buffer.py 第 809–810 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L809-L810)）；
# 下一步开头的 `zero_grad_buffer` 调每个 group 的 `reset`，把数到的次数存成标准答案（[param_and_grad_buffer.py 第 288–298 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L288-L298)）。
# 在一个 rank 上直接看 bucket 0 的记账：

# %%
def first_step_bookkeeping(dims):
    parallel_state.initialize_model_parallel()
    model, config = build_model(dims)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=1000), model)
    batch = microbatches(1)[0]
    rows = []
    for step in (1, 2):
        ddp.zero_grad_buffer()  # 第 1 步之后：每个 group 的 reset() 存下标准答案
        group = ddp.bucket_groups[0]
        before = [group.is_first_batch, len(group.golden_per_param_grad_ready_counts)]
        ddp(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]).mean().backward()
        dispatched = sum(g.grad_reduce_handle is not None for g in ddp.bucket_groups)
        ddp.finish_grad_sync()
        rows.append([step, *before, f"{dispatched} / {len(ddp.bucket_groups)}"])
    return rows


Table(["步", "is_first_batch", "bucket 0 的标准答案记了几个参数", "backward 结束时已发出 all-reduce 的 bucket"],
      run_ranks(first_step_bookkeeping, 1, TINY)[0])

# %% [markdown]
# 第 1 步标准答案是空的，backward 里一个 all-reduce 也没发；第 2 步 bucket 0 的 4 个参数都有了答案，backward 结束时 9 个 bucket 全已发出。
# 只跑一两步的测量会低估 overlap 的收益。
#
# **为什么要连续 buffer 和倒序。** 一个大模型有几百个参数张量，逐个 all-reduce 是几百次小通信，延迟主导；一块连续 buffer 让一个
# bucket 只发一次 collective。倒序排放让 bucket 的顺序接近 backward 产出梯度的顺序，先凑齐的先发，通信和剩下的 backward 重叠。
# 代价是多一份梯度内存（`grad_reduce_in_fp32` 时是 fp32）。
#
# **流水线：为什么只有 stage 0 分 bucket。** DDP 构造时读自己在 PP 群里的序号，`pp_rank > 0` 就把 `bucket_size` 设成 `None`
# （[distributed_data_parallel.py 第 95–106 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L95-L106)），
# 代码注释给的理由是这些 stage 的 DP 通信不在关键路径上。页首的图说明为什么：1F1B 里后面的 stage **更早**开始 backward
# （stage 1 在第 4 格、stage 0 在第 8 格），也更早结束——最后一个 micro-batch 的 backward 从最后一个 stage 往前传，stage r 算完它时，
# 前面还有 r 个 stage 各要做一次 backward，而 stage 0 的最后一个 backward 是整步最后一段计算。下表从记录里量：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
lanes = pipeline_buckets.clock(pipelined, 1, TINY.layers)
Table(["stage", "bucket（元素数）", "all-reduce 开始（格）", "本 stage 第一个 / 最后一个 backward", "整步结束（格）"],
      [[stage, [numel for _, _, numel in t], [round(time, 1) for time, _, _ in t],
        f"第 {min(s for op, s, _ in row if op.kind == 'B')} 格开始 / 第 {max(e for _, _, e in row)} 格结束", step_end]
       for stage, (t, row) in enumerate(zip(ticks, lanes))])

# %% [markdown]
# stage 1 在第 26 格发出它唯一的 all-reduce，之后 4 格无事可做（流水线排空时它的气泡），这 4768 个元素的通信藏在 stage 0
# 还在算的 backward 后面，不拖长这一步。stage 0 没有这样的空闲，它的 all-reduce 只能和自己最后一个 backward 重叠，所以要切成
# bucket、倒序排，让输出端的 bucket 先凑齐先发，最后只剩一个小 bucket（672 个元素）露在外面。stage 1 分 bucket 也得不到什么：
# 它的通信本来就不在关键路径上，拆开反而多几次启动开销。
#
# 正式入口在同一处再做一次：`get_model` 给 pp_rank>0 的 stage、以及 interleaved 里第 2 个起的 model chunk 都传 `None`
# （[training.py 第 1860–1868 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1860-L1868)）。
# 缺省的 `align_grad_reduce=True`（[common_config.py 第 80 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/config/common_config.py#L80)）
# 还让 `train` 把 `start_grad_sync` 挂成 `grad_sync_func`（[training.py 第 3540–3543 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3540-L3543)）：
# 这时 schedule 只在第一个 stage 于最后一个 backward 之前退出 `no_sync`，其余 stage 做完 cool-down 再一次发出
# （[schedules.py 第 2443–2446 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L2443-L2446)），
# 同样落在气泡里。本页直接用 Megatron Core、没有设 `grad_sync_func`，stage 1 的 all-reduce 由 hook 在最后一个梯度到齐时发出，时刻相同。

# %% [markdown]
# ## 与训练主链路的关系
#
# 正式入口的 `get_model` 建好模型后用 DDP 包装（按 chunk 和 pp_rank 定 bucket 大小）；`train` 把 `no_sync`（开 overlap 时）和
# `finalize_model_grads` 挂到 config 上（[training.py 第 3537 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3537)、[training.py 第 3550 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3550)），
# schedule 在最后一个 micro-batch 前后用它们。`train_step` 每步开头 `zero_grad_buffer`，schedule 结束时梯度已在 dp-cp 群里平均好，
# 优化器只读 `main_grad`（[笔记 15](../15_distributed_optimizer/) 把 all-reduce 换成 reduce-scatter + all-gather）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **ring all-reduce**：每个 rank 收发约 2·(N−1)/N 倍 buffer 大小的数据，与 N 几乎无关；大 bucket 带宽效率高，小 bucket 能更早开始、
#   更好地与计算重叠，`bucket_size` 在两者之间取舍。
# - **梯度累加**：多个 micro-batch 的梯度在 `main_grad` 上累加，等价于一个大 batch；`no_sync` 让累加期间不通信。
# - **流水线气泡**：1F1B 的 cool-down 让后面的 stage 先闲下来（[笔记 13](../13_pipeline_schedules/)），DDP 把它们的 DP 通信放进这段空闲。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. overlap 的第一步没有 overlap。** 见上面"第 1 步为什么不 overlap"的运行：第一步的 all-reduce 全部在 `finish_grad_sync` 里同步发出。
# 这是有意的，但只跑一两步的 benchmark 会低估 overlap 的收益，也会在 profiler 里看到第一步的通信全部露在外面。
#
# **2. simple loop 的优化器一步也没有更新权重。** `examples/run_simple_mcore_train_loop.py` 用 DDP 包装模型，
# 却把 `torch.optim.Adam(gpt_model.parameters())` 当优化器。DDP 的 hook 把每个 `.grad` 置为 `None`
# （[`distributed_data_parallel.py:494`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L494)），
# torch 的 Adam 跳过没有 `.grad` 的参数；它也从不调用 `zero_grad_buffer`，`optim.zero_grad()` 清的是 `.grad`，
# 所以 `main_grad` 一步步累加下去。按它的写法跑两步：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def simple_loop_wiring():
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config()
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    init_by_global_name(model)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    optim = torch.optim.Adam(ddp.parameters())  # as in the example
    before = by_global_name([ddp], "param")
    norms = []
    for _ in range(2):
        optim.zero_grad()
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(microbatches(1)),
                                    model=ddp, num_microbatches=1, seq_length=SEQ, micro_batch_size=MBS)
        finalize_model_grads([ddp])
        optim.step()
        norms.append(torch.cat([p.main_grad.flatten() for p in ddp.parameters()]).norm().item())
    return max_abs_diff(by_global_name([ddp], "param"), before), norms


changed, norms = run_ranks(simple_loop_wiring, 2)[0]
print("两步之后权重的最大变化:", changed)
print("main_grad 的范数，第 1、2 步:", [round(n, 4) for n in norms], " 比值:", round(norms[1] / norms[0], 4))

# %% [markdown]
# 权重纹丝不动，`main_grad` 第 2 步恰好是第 1 步的两倍（同一个 micro-batch 累加了两次）。Megatron 自己的优化器
# （`get_megatron_optimizer`，笔记 15）读的是 `main_grad`，正式入口也每步调用 `zero_grad_buffer`，所以不受影响。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部 rank 是本机 gloo 进程；all-reduce 的异步句柄在 gloo 上同样可用，`_coalescing_manager` 把一个 group 的 bucket 合成一次调用。
# - `start_grad_sync` 先取当前 CUDA stream、等参数上挂着的 CUDA graph 梯度事件；CPU 上这个 stream 由 CPU 层换成什么都不等的替身，
#   没有 CUDA graph 时也没有事件要等。
# - 共享词嵌入 + PP=2：最后一个 stage 构造时的 `weight.data.cuda()` 在 CPU 版 torch 上报错，CPU 补丁 `shared_embedding_cuda`
#   只在这个方法运行期间让 `.cuda()` 返回张量本身，构造时的 all-reduce 和 finalize 里的 all-reduce 照常在 gloo 上做（笔记 13 同样用它）。
# - 模型只有 9632 个参数，所以开 overlap 时设 `bucket_size=1000`；`simple_loop_wiring` 用 `snippets.models.tiny_gpt` 的固定尺寸
#   （与 `tiny` 相同）。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 不开 overlap 时 DDP 有几个 bucket？一步里 DP 群有几次通信、多大？**
#
# <details><summary>答案</summary>
#
# 一个：`overlap_grad_reduce=False` 时 `bucket_size` 被设成 `None`（[distributed_data_parallel.py 第 72 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L72)），
# 整块 buffer 一个 bucket。一步一次 all-reduce，大小是全部参数个数 9632，在 `finalize_model_grads` 里发出。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(plain[0]["bucket_size"], len(plain[0]["buckets"]),
      [(c.api, c.group, c.before) for c in plain[0]["steps"][0]["finalize"]])

# %% [markdown]
# **2. `bucket_size=1000` 时为什么 bucket 0 有 1056 个元素，而不是 1000？**
#
# <details><summary>答案</summary>
#
# bucket 只在参数边界封口：累计到 `linear_fc2.weight`（512 个）时是 544 + 512 = 1056 ≥ 1000，才封口。
# 不会把一个参数拆进两个 bucket。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(name, end - start) for name, _, start, end, bucket in overlapped[0]["params"] if bucket == 0])

# %% [markdown]
# **3. DP=2、CP=1 时，梯度在通信前被乘以多少？DP=2、CP=2 呢？`average_in_collective=True` 呢？**
#
# <details><summary>答案</summary>
#
# 0.5，然后 SUM all-reduce；CP=2 时是 1/(2×2) = 0.25，分母是 dp-cp 群的大小；`average_in_collective=True` 时因子是 1，用 AVG 归约。
# 三种结果都是 dp-cp 群上的平均。下面用 DP=2 两个 rank 的本地梯度验证"乘 0.5 再求和 = 归约结果"。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
local = [r["local"] for r in plain]
name = "decoder.layers.0.mlp.linear_fc1.weight"
print(torch.allclose(0.5 * local[0][name] + 0.5 * local[1][name], plain[0]["reduced"][name], atol=1e-7))

# %% [markdown]
# **4. PP=2 时，第二个 stage 为什么只有一个 bucket？它的 all-reduce 在什么时候发出，会拖长这一步吗？**
#
# <details><summary>答案</summary>
#
# DDP 看到 `pp_rank > 0` 就把 `bucket_size` 设成 `None`，整个 stage 一个 bucket。它在自己最后一个 backward 的最后一个梯度到齐时发出
# （本页第 26 格）；1F1B 里后面的 stage 先做完 backward，stage 0 还要再算 4 格，这次通信藏在这段空闲里，不拖长这一步。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("stage 1 的 bucket:", pipelined[2]["buckets"], " all-reduce 开始:", ticks[1], " 整步结束:", step_end)

# %% [markdown]
# **5. 如果每个 DP rank 的 micro-batch 数不同（比如一个 2 个、一个 3 个），DDP 的结果还是全局平均吗？**
#
# <details><summary>答案</summary>
#
# 不是。每个 rank 的 loss 已经按自己的 micro-batch 数平均过，DDP 再对 rank 等权平均，
# 结果是"平均的平均"，少样本的 rank 权重偏大。所以 Megatron 要求 global batch 能被 micro batch × DP 整除，
# 每个 DP rank 的 micro-batch 数相同。下面用本篇的单进程模型按 2 + 3 条序列算一遍验证。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def mean_of_means_vs_global():
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config()
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    init_by_global_name(model)
    b = concat(microbatches(5, micro_batch_size=1))
    per_token = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])
    return per_token.mean().item(), ((per_token[:2].mean() + per_token[2:].mean()) / 2).item()


global_mean, mean_of_means = run_ranks(mean_of_means_vs_global, 1)[0]
print("全局平均:", round(global_mean, 4), " 两个 rank 各自平均再平均:", round(mean_of_means, 4))

# %% [markdown]
# ## 30-second answer
#
# Megatron's `DistributedDataParallel` lays every gradient into one contiguous buffer, parameters in
# reverse order, cut into buckets at parameter boundaries, one bucket group each. Each bucket is scaled by
# 1/|dp-cp group| (1/(DP·CP)) and all-reduced once: inside `finalize_model_grads` without overlap, or with
# `overlap_grad_reduce` from the backward hook the moment the bucket's last gradient is ready, from the
# second step on. Only pipeline stage 0 is bucketed: a later stage finishes its backward earlier, so its one
# big all-reduce runs in its cool-down bubble, while stage 0's last backward is the step's critical path.
