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
# # 14 数据并行 DDP：连续梯度 buffer、bucket 与 finalize_model_grads
#
# 第二轮第 7 篇。DP 的每个 rank 持有一份完整的（TP / PP 切过之后的）模型，各自吃不同的数据，
# backward 之后把梯度在 DP 群里求平均，于是每个 rank 做出同样的更新。Megatron 的
# `DistributedDataParallel` 不是 torch 的 DDP：它把所有梯度放进一块**连续的 buffer**，切成 bucket，
# 每个 bucket 一次 collective，并且可以在 backward 还没结束时就开始通信。本篇在 2 个 gloo rank 上包装真实的
# 小 `GPTModel`，从真实对象里读出 buffer 和 bucket，记录有无 overlap 时的全部通信，并验证 DP=2 的梯度等于
# 一个进程吃下整个 batch 的梯度。

# %% [markdown]
# ## 阅读目标
#
# 1. `DistributedDataParallel` 构造时建了什么：几块 buffer、每个参数在 buffer 的哪一段、bucket 怎么切，`main_grad` 是什么。
# 2. backward hook 做什么；多个 micro-batch 时 `no_sync` 怎样让前面的 micro-batch 不通信。
# 3. 梯度在哪里被除以 DP；`finalize_model_grads` 按顺序做哪几件事、各在哪个群。
# 4. `overlap_grad_reduce=False` 与 `True` 各发出哪些 collective、何时发出；为什么第一步的 overlap 不 overlap。
# 5. DP=2 的梯度与单进程整批梯度相同（到 float 舍入）。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`distributed_data_parallel.py::DistributedDataParallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L22) | 包装模型：建 buffer、注册 hook |
# | [`distributed_data_parallel.py::DistributedDataParallel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L44) | 决定 bucket 大小、按 dtype 分组、算缩放因子 |
# | [`distributed_data_parallel.py::DistributedDataParallel._make_backward_post_hook`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L468) | 每个参数的梯度算好后：累加进 `main_grad`，报告"就绪" |
# | [`distributed_data_parallel.py::DistributedDataParallel.no_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L504) | 非最后一个 micro-batch：只累加，不通信 |
# | [`distributed_data_parallel.py::DistributedDataParallel.zero_grad_buffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L603) | 每步开始清零 buffer、复位 bucket group |
# | [`distributed_data_parallel_config.py::DistributedDataParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel_config.py#L12) | `overlap_grad_reduce`、`bucket_size`、`use_distributed_optimizer` 等 |
# | [`param_and_grad_buffer.py::_compute_default_per_buffer_param_layout`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L947) | 不用分布式优化器时的布局：参数倒序排放、在参数边界切 bucket、不补齐 |
# | [`param_and_grad_buffer.py::_ParamAndGradBuffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L998) | 一块连续 buffer：照布局分配、建 bucket、`main_grad` 视图 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucket`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L92) | buffer 的一段 + 其中的参数 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L179) | 一起通信的 bucket；记账"哪些参数的梯度齐了" |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.start_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L594) | 乘缩放因子，发 all-reduce（或 reduce-scatter，笔记 15） |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.finish_grad_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L781) | 不 overlap：现在发；overlap：等它完成 |
# | [`param_and_grad_buffer.py::_ParamAndGradBucketGroup.register_grad_ready`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L857) | overlap：bucket 里所有参数就绪时立刻发通信 |
# | [`param_and_grad_buffer.py::partition_buckets`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L1652) | 把 bucket 编成 bucket group（没有 fp8 时一组一个） |
# | [`finalize_model_grads.py::finalize_model_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L563) | schedule 结束后：完成 DP 归约，再做 TP / PP 上的特殊归约 |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | SP 下 norm 等非 TP 参数的梯度在 TP 群求和 |
# | [`finalize_model_grads.py::_allreduce_word_embedding_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L164) | PP>1 共享词嵌入时首尾 stage 的梯度求和 |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 正式入口：建模型后用 DDP 包装 |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342) | 正式入口：把 `no_sync`、`finalize_model_grads` 挂到 config 上 |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/training.py::get_model → wrap_model_chunks_with_ddp → DistributedDataParallel(config, ddp_config, module)
# ├─ bucket_size: 缺省 max(4e7, 1e6·DP) 个元素；overlap_grad_reduce=False 时改成 None（整块一个 bucket）
# ├─ 缩放因子 = 1/DP（average_in_collective=False 时；求和之前乘）
# ├─ group_params_for_buffers: 按 (param dtype, grad dtype, 是否专家参数) 分组
# ├─ _ParamAndGradBuffer(..., param_layout)  每组一块                     # 纯本地：分配 + 视图
# │  ├─ 没有传入布局时 _compute_default_per_buffer_param_layout:
# │  │     参数倒序排放；累计 ≥ bucket_size 就封一个 bucket                 # 分布式优化器的布局带补齐，笔记 15
# │  └─ param.main_grad = grad_data[start:end].view(shape)
# ├─ partition_buckets → _ParamAndGradBucketGroup                          # 一个 bucket 一组
# └─ 每个参数的 grad accumulator 上 register_hook(_make_backward_post_hook)
#
# 每一步（megatron/training/training.py::train_step）
# ├─ ddp.zero_grad_buffer()                                  # grad_data 清零
# ├─ forward_backward_func(...)                              # 笔记 13
# │  ├─ with config.no_sync_func():  前 m−1 个 micro-batch    # hook 只累加
# │  └─ 最后一个 micro-batch 的 backward
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
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `DistributedDataParallel.__init__` | config、`DistributedDataParallelConfig`、module（分布式优化器时还有事先算好的 `full_param_layout`，笔记 15） | 包装后的模型 | `_ParamAndGradBuffer`、`partition_buckets`、`ProcessGroupCollection` | 取 `dp-cp` 等群，不通信 | 否（梯度按 bucket 分段，不切分） | 是：分配 grad buffer，给每个参数加 `main_grad` 和 hook | `DistributedDataParallel(config=..., ddp_config=..., module=gpt_model)` |
# | `_compute_default_per_buffer_param_layout` | 一组参数、`bucket_size` | 每个参数的 (start, end, bucket)、每个 bucket 的区间 | 无 | 否 | 否（只算下标） | 否 | 同上 |
# | `_ParamAndGradBuffer.__init__` | 参数列表、dtype、`bucket_size`、DP 群、布局（可选） | buffer + buckets | `_compute_default_per_buffer_param_layout`、`_ParamAndGradBucket` | 只记下 DP 群 | 否 | 是：`param.main_grad`（分布式优化器时还有 `param.data`）改指向 buffer | 同上 |
# | backward hook | 参数的 `.grad` | 无 | `register_grad_ready` | overlap 时**是**：all-reduce | 否 | 是：`main_grad += grad`，`grad = None` | `loss.backward()` 之内 |
# | `no_sync` | 无 | 上下文 | bucket group 的 `is_last_microbatch` | 否 | 否 | 暂时关闭"就绪"记账 | 由 schedule 调用 |
# | `start_grad_sync` | 本 group 的 bucket | 无（或异步句柄） | `torch.cuda.current_stream`（先等 CUDA graph 留下的梯度事件）、`torch.distributed.all_reduce` | **是**：`dp-cp` | 否（整段求和） | 是：buffer 里的梯度变成 DP 平均 | `finalize_model_grads` 之内 |
# | `finish_grad_sync` | 无 | 无 | `start_grad_sync` 或句柄 `wait` | **是** | 否 | 同上 | 同上 |
# | `finalize_model_grads` | 模型 chunk 的 list、`num_tokens` | 无 | `finish_grad_sync`、几个 `_allreduce_*` | **是**：dp-cp、tp、embd、pp | 否 | 是：梯度最终值 | `finalize_model_grads([gpt_model])` |
# | `zero_grad_buffer` | 无 | 无 | buffer / bucket group 的 `reset` | 否 | 否 | 是：梯度清零 | simple loop **没有**调用（遗留问题 2） |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch

from snippets.dp import grad_buffers, overlap_timeline, pictures
from snippets.record import recorder
from snippets.record.listing import listing
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n14_ddp import build_model, ddp_run, one_process_full_batch
from snippets.ranks.launch import run_ranks
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

# %% [markdown]
# ## 关键对象
#
# ### 一次 DDP 的训练步
#
# 模型是 4 层、hidden 16 的真实 `GPTModel`，权重按名字生成（与 rank 无关）。一个 global batch 有 4 个
# micro-batch、每个 2 条序列；DP=2 时 DP rank r 拿第 2r、2r+1 个 micro-batch（切数据是 data loader 的事，[笔记 03](../03_data_and_batch_flow/)）。
# 每个 rank 跑一次 schedule（2 个 micro-batch，`no_sync` 挂在 config 上，和正式入口 `train` 一样），
# 然后像 simple loop 那样显式调用 `finalize_model_grads`；两段分别录下通信。
#
# 这两个函数在 `snippets/experiments/n14_ddp.py` 里，模型尺寸和 micro-batch 数是参数 `dims`（本篇用它的 `tiny`：
# 4 层、hidden 16、vocab 32、sequence 8、micro-batch 2、一个 global batch 4 个 micro-batch），模型由同一模块的 `build_model`
# 建（local spec 的 `GPTModel`，权重按全局名字生成）。schedule 期间还用 `overlap_timeline.markers` 记下每个模块开始
# forward、每个参数的梯度算好的时刻，和通信排在同一张记录里（下面的时间线图用它）。

# %% [markdown]
# 本篇读的 Megatron 调用是这一句：把 `GPTModel` 包进 `DistributedDataParallel`。先在 2 个 rank 上只包装、不训练，看它返回什么：
# 一个包着原模型的 DDP、一块连续的 grad buffer 和它切成的 bucket，每个参数多了一个指进这块 buffer 的 `main_grad`。

# %%
def wrap_in_ddp(dims):
    parallel_state.initialize_model_parallel()  # DP=2
    model, config = build_model(dims)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=1000), model)
    buffer = ddp.buffers[0]
    views = all(p.main_grad.untyped_storage().data_ptr() == buffer.grad_data.untyped_storage().data_ptr()
                for p in ddp.parameters())
    return type(ddp).__name__, type(ddp.module).__name__, list(buffer.grad_data.shape), len(buffer.buckets), views


TINY = EXPERIMENTS["ddp"].tiny
Table(["rank", "返回", "里面的 module", "grad buffer 形状", "bucket 数", "每个 main_grad 都在这块 buffer 里"],
      [[rank, *r] for rank, r in enumerate(run_ranks(wrap_in_ddp, 2, TINY))])

# %% [markdown]
# 下面两个函数把这一句放进完整的训练步（overlap 与 bucket 大小作参数），再录下通信：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(ddp_run, one_process_full_batch)

# %%
full = run_ranks(one_process_full_batch, 1, TINY)[0]
plain = run_ranks(ddp_run, 2, TINY, overlap_grad_reduce=False)
overlapped = run_ranks(ddp_run, 2, TINY, overlap_grad_reduce=True, bucket_size=1000, iterations=2)

# %% [markdown]
# ### buffer 与 bucket
#
# `overlap_grad_reduce=False` 时 DDP 把 `bucket_size` 设成 `None`（[distributed_data_parallel.py 第 72 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L72)），
# 整块 buffer 是一个 bucket。开 overlap 时缺省 bucket 是 max(4000 万, 100 万 × DP) 个元素——我们的模型一共
# 不到 1 万个参数，所以这里人为设 `bucket_size=1000` 才切得出多个 bucket。从 rank 0 的真实对象读出：

# %%
print("overlap=False: bucket_size =", plain[0]["bucket_size"], "→", len(plain[0]["buckets"]), "个 bucket，",
      plain[0]["buckets"][0][2], "个元素")
print("overlap=True, bucket_size=1000: buffer 的 (param / grad) dtype:", overlapped[0]["dtypes"])
Table(["bucket", "offset", "元素", "补齐后", "参数（buffer 顺序，省略开头的 decoder.）"], overlapped[0]["buckets"])

# %% [markdown]
# - **倒序**：buffer 从 `output_layer.weight` 开始、以 `embedding.word_embeddings.weight` 结束，正好与
#   `named_parameters()` 的注册顺序相反（布局由 `_compute_default_per_buffer_param_layout` 算，[param_and_grad_buffer.py 第 973 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L973)；
#   buffer 本身只照着布局分配和切视图）。backward 大体按这个顺序产出梯度，
#   所以 bucket 0 最先凑齐。
# - **bucket 在参数边界封口**：累计元素数一到 `bucket_size` 就在当前参数之后封口，所以 bucket 大小不一（1056、1312……），
#   最后一个是剩下的 672 个。一个参数从不跨两个 bucket。
# - **不补齐**：不用分布式优化器时"补齐后"等于元素数；补齐是[笔记 15](../15_distributed_optimizer/)的事。
#
# 每个参数在 buffer 里的区间（前 6 个和最后 2 个），以及 `snippets.dp.grad_buffers.layout` 这个十几行的重写
# 只凭参数大小算出的布局是否与 Megatron 建出的完全一样：

# %%
rows = overlapped[0]["params"]
print(Table(["参数", "shape", "start", "end", "bucket"], rows[:6] + rows[-2:]))
sizes = [end - start for _, _, start, end, _ in reversed(rows)]  # model order
mine = grad_buffers.layout(sizes, bucket_size=1000)
print("layout() 与真实 buffer 相同:",
      [r[2:] for r in reversed(rows)] == [list(r) for r in mine.param_ranges],
      " bucket 边界:", [b for b in mine.buckets] == [(r[1], r[1] + r[3]) for r in overlapped[0]["buckets"]])

# %% [markdown]
# ### `main_grad`
#
# 每个参数多了一个 `main_grad` 属性，它是 buffer 的一段视图；backward hook 把 autograd 算出的 `.grad` 加进去后把
# `.grad` 置为 `None`（[distributed_data_parallel.py 第 493–494 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L493-L494)）。所以 DDP 之后梯度只在 `main_grad` 里。
# 名字里的 "param and grad" 指它也能把**参数**搬进一块连续 buffer（`param.data` 改指向它）——但只在分布式优化器下这样做，
# 为的是参数的 all-gather（笔记 15）；这里 `param_data` 是 `None`，参数还在各自原来的存储里：

# %%
print("所有 main_grad 都是同一块 buffer 的视图:", plain[0]["views"])
print("backward 之后所有参数的 .grad 都是 None:", plain[0]["grad_is_none"])
print("buffer 里有参数 buffer（param_data）:", plain[0]["param_buffer"])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 不 overlap：一次 all-reduce，在 `finalize_model_grads` 里
#
# 整块 buffer 一个 bucket：schedule 期间没有任何 DP 通信，`finalize_model_grads` → `finish_grad_sync` →
# `start_grad_sync` 先把 buffer 乘以 1/DP，再在 `dp-cp` 群里 all-reduce 求和——和就是平均。

# %%
meanings = {"distributed/param_and_grad_buffer.py::start_grad_sync": "DP 梯度求和（先乘了 1/DP，和即平均）"}
print("schedule 期间:", len(plain[0]["steps"][0]["schedule"]), "条;  finalize_model_grads 期间:")
communication_table(plain[0]["steps"][0]["finalize"], meanings)

# %% [markdown]
# ### overlap：每个 bucket 一次 all-reduce——第二步起在 backward 里
#
# 同样 2 步，`overlap_grad_reduce=True`、9 个 bucket。第 1 步：

# %%
print("schedule 期间:", len(overlapped[0]["steps"][0]["schedule"]), "条;  finalize_model_grads 期间:")
communication_table(overlapped[0]["steps"][0]["finalize"], meanings)

# %% [markdown]
# 第 2 步：

# %%
print("finalize_model_grads 期间:", len(overlapped[0]["steps"][1]["finalize"]), "条;  schedule 期间:")
communication_table(overlapped[0]["steps"][1]["schedule"], meanings)

# %% [markdown]
# 把三次运行排成时间线（rank 0；蓝 = 一串模块的 forward，红 = 一串参数的梯度，黄 = 一个 bucket 的 all-reduce，
# 鼠标停在方块上看细节）：

# %%
pictures.draw_ddp_timeline(plain[0], overlapped[0])

# %% [markdown]
# 读这三张表和这张图：
#
# - **通信前后 shape 相同**：all-reduce 原地求和，`[9632]` 还是 `[9632]`；overlap 时每次是一个 bucket 的那一段。
# - **第 2 步的 phase 是 backward**：all-reduce 是在 autograd 执行 backward 的过程中、由参数的 hook 发出的——
#   bucket 0（输出层那端）最先凑齐，最先发，后面的层还在算梯度。这就是 overlap：通信藏在计算后面。
# - **第 1 步却全在 finalize 里**：见"机制解释"。
# - **两个 micro-batch 只通信一次**：第一个 micro-batch 在 `no_sync` 里，hook 只累加。
#
# ### 结果：与单进程整批相同
#
# `finalize_model_grads` 之前，每个 rank 的 `main_grad` 只是自己那 4 条序列的梯度；之后两个 rank 都等于一个进程
# 吃下全部 8 条序列时的梯度（差在 float 舍入量级）：

# %%
local = [r["local"] for r in plain]
comparisons = [
    ["rank 0 本地梯度 vs 整批", local[0]],
    ["(rank 0 本地 + rank 1 本地) / 2 vs 整批", {k: (local[0][k] + local[1][k]) / 2 for k in full}],
    ["rank 0 归约后 vs 整批（不 overlap）", plain[0]["reduced"]],
    ["rank 1 归约后 vs 整批（不 overlap）", plain[1]["reduced"]],
    ["rank 0 归约后 vs 整批（overlap，第 2 步）", overlapped[0]["reduced"]],
]
Table(["比较", "max |Δ|（4 位小数）", "allclose(atol=1e-6)"],
      [[what, max_abs_diff(grads, full), all(torch.allclose(grads[k], full[k], atol=1e-6) for k in full)]
       for what, grads in comparisons])

# %% [markdown]
# ## 机制解释
#
# **为什么要一块连续的 buffer。** 一个 7B 模型有几百个参数张量；逐个 all-reduce 就是几百次小通信，延迟主导。
# 连续 buffer 让一个 bucket 只发一次 collective，bucket 还可以在 backward 进行中就开始通信。代价是多占一份梯度内存
# （`main_grad`，bf16 训练时常常是 fp32 的，`grad_reduce_in_fp32`），autograd 算出的 `.grad` 用完即弃。
#
# **除以 DP 放在哪。** 每个 rank 的 loss 是自己数据上的平均，要得到全局平均就要对 DP 取平均。
# `average_in_collective=False`（缺省）时缩放因子是 1/DP（[distributed_data_parallel.py 第 212 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L212)），
# `start_grad_sync` 在通信前把 bucket 乘上它（[param_and_grad_buffer.py 第 661 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L661)），再做 SUM all-reduce；
# 设为 True 则改用 AVG 归约、不预乘。`calculate_per_token_loss` 时不除 DP，由 `finalize_model_grads` 最后按全局 token 数缩放。
# 乘缩放因子之前，`start_grad_sync` 先取当前 CUDA stream，让它等参数上挂着的 CUDA graph 梯度事件
# （[param_and_grad_buffer.py 第 632 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L632)）：梯度可能是 CUDA graph 重放时异步累加进来的，
# 读之前要等它写完。不用 CUDA graph 时没有事件；CPU 上这个 stream 由 CPU 层换成什么都不等的替身。
#
# **何时发通信。** 每个 bucket group 记账：最后一个 micro-batch 的 backward 里每个参数的 hook 报一次"就绪"，
# 当 group 里所有参数都报到（次数与"标准答案"相同）就发起异步 all-reduce（[param_and_grad_buffer.py 第 870–879 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L870-L879)）。标准答案
# `golden_per_param_grad_ready_counts` 是**第一步**数出来的，在第一步结束的 `reset` 里才存下（[param_and_grad_buffer.py 第 288–298 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L288-L298)）；
# 第一步的 hook 只数不发，`finish_grad_sync` 看到 `is_first_batch` 就在那里补发（[param_and_grad_buffer.py 第 809–810 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L809-L810)）。这就是上面第 1 步
# 全部在 finalize 里、第 2 步才进入 backward 的原因：记账要先知道"齐了"是什么样子（一个参数可能被用两次）。
#
# **PP 的其他 stage。** `pp_rank > 0` 时 DDP 不分 bucket（[distributed_data_parallel.py 第 105–106 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L105-L106)）：后面的 stage 晚开始 backward、早结束，
# DP 通信不在关键路径上，一个大 bucket 更省事。
#
# **`finalize_model_grads` 的其余几件事**（本篇的配置里都是空操作）：SP 时 norm 等未切分参数的梯度只是各 TP rank
# 的部分和，要在 TP 群求和（[笔记 11](../11_transformer_layer/)）；PP>1 且共享词嵌入时首尾两份词嵌入的梯度在 embedding 群求和；
# `calculate_per_token_loss` 时把最后一个 stage 的 token 数广播到 PP 群、在 DP 群求和，再用它缩放梯度。

# %% [markdown]
# ## 与训练主链路的关系
#
# 正式入口的 `get_model` 建好模型后用 DDP 包装；`train` 把 `no_sync`（开 overlap 时）和 `finalize_model_grads`
# 挂到 config 上（[training.py 第 3537 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3537)、[training.py 第 3550 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3550)），schedule 在最后一个 micro-batch 前后用它们。`train_step` 每步开头
# `zero_grad_buffer`，schedule 结束时梯度已在 DP 群里平均好；优化器只读 `main_grad`（笔记 15）。simple loop 没有挂
# `no_sync`，而是在 `forward_backward_func` 之后自己调用 `finalize_model_grads([gpt_model])`——本篇的写法与它相同。

# %% [markdown]
# ## 与基础知识的连接
#
# - **数据并行 = 梯度求平均**：∇(1/N Σ loss_i) = 1/DP · Σ_r ∇(rank r 上的平均 loss)，前提是每个 rank 的样本数相同。
# - **all-reduce**：ring 算法里每个 rank 收发约 2·(DP−1)/DP 倍 buffer 大小的数据，与 DP 几乎无关；所以大 bucket
#   带宽效率高，小 bucket 能更早开始、更好地与计算重叠——`bucket_size` 就是在这两者之间取舍。
# - **梯度累加**：多个 micro-batch 的梯度在 `main_grad` 上累加，等价于一个大 batch；`no_sync` 让累加期间不通信。

# %% [markdown]
# ## 遗留问题
#
# **1. overlap 的第一步没有 overlap（运行确认）。** 见上面第 1 步的表和"机制解释"：第一步的 all-reduce 全部在
# `finish_grad_sync` 里同步发出。这是有意的（第一步才知道每个参数的梯度会报到几次），但只跑一两步的测量会低估 overlap 的收益。
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
# **3. 共享词嵌入的那次 all-reduce 没有在这里运行。** `_allreduce_word_embedding_grads` 只在 PP>1 且共享词嵌入时有事做，
# 而这种模型在 CPU 上构造不起来（最后一个 stage 的 `weight.data.cuda()`，见[笔记 13](../13_pipeline_schedules/)的遗留问题 4）。

# %% [markdown]
# ## 自测
#
# **1. 不开 overlap 时 DDP 有几个 bucket？一步里 DP 群有几次通信、多大？**
#
# <details><summary>答案</summary>
#
# 一个：`overlap_grad_reduce=False` 时 `bucket_size` 被设成 `None`，整块 buffer 一个 bucket。一步一次 all-reduce，
# 大小是全部参数个数 9632，在 `finalize_model_grads` 里发出。
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
# **3. DP=2 时，梯度在通信前被乘以多少？如果 `average_in_collective=True` 呢？**
#
# <details><summary>答案</summary>
#
# 0.5（1/DP），然后 SUM all-reduce；`average_in_collective=True` 时缩放因子是 1，用 AVG 归约。两种结果都是平均。
# 下面用 rank 0、rank 1 的本地梯度验证"乘 0.5 再求和 = 归约结果"。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
name = "decoder.layers.0.mlp.linear_fc1.weight"
print(torch.allclose(0.5 * local[0][name] + 0.5 * local[1][name], plain[0]["reduced"][name], atol=1e-7))

# %% [markdown]
# **4. overlap 时第 2 步的第一个 all-reduce 属于哪个 bucket、包含哪些参数？为什么是它？**
#
# <details><summary>答案</summary>
#
# bucket 0：`output_layer.weight`、final norm、第 4 层（下标 3）的 `linear_fc2`。它们在 forward 里最后被用到，
# backward 里最先得到梯度；buffer 倒序排放正是为了让这个 bucket 先凑齐。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
first = overlapped[0]["steps"][1]["schedule"][0]
print("第 2 步的第一个 collective:", first.api, first.phase, first.before,
      " bucket 0 的大小:", overlapped[0]["buckets"][0][3])
print("bucket 0:", overlapped[0]["buckets"][0][4])

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
# reverse order, and gives each parameter a `main_grad` view into it; a backward hook adds `.grad` into
# `main_grad` and drops `.grad`. The buffer is cut into buckets at parameter boundaries; each bucket is
# scaled by 1/DP and all-reduced once in the dp-cp group — inside `finalize_model_grads` without overlap,
# or from the hooks during backward with `overlap_grad_reduce` (from the second step on). Recorded on two
# CPU ranks, the DP=2 gradients equal one process on the full batch.
