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
# # 24 随机数与 activation 重算：tensor_parallel/random.py
#
# 第二轮补上的一篇。TP 把一层的激活切给几张卡，dropout 却是"每个元素独立抛硬币"：硬币从哪个生成器来，决定了几张卡上的
# mask 是相同还是不同，而这两种情况各有必须的场合。activation 重算又要求 backward 里重跑的 forward 抛出**同样**的硬币。
# `tensor_parallel/random.py` 同时管这两件事：一个按名字保存多条 RNG 流的 tracker，以及在重算前把所有生成器拨回原位的
# `checkpoint`。本篇在 4 个 CPU rank（TP=2、EP=2）上读出每条流的种子、比较每对 rank 的 dropout mask，
# 再把一个真实的 `TransformerLayer` 分三种方式跑（不重算、Megatron 的 `checkpoint`、PyTorch 的 `checkpoint`），
# 逐位比较输出和梯度，并量出 autograd 为 backward 存了多少字节。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
# snippets first: it applies the CPU patches and silences known warnings.
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n24_rng import (DROPOUT, MODE_NAMES, MODES, SEED, checkpoint_comm_table, pairs_table, recompute_run,
                                          recompute_table, seeds_and_masks, seeds_table, sharing_table,
                                          without_output_run, without_output_table)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp.rng import SavedTensors, dropout_masks, formula_seeds, stream_seeds
from snippets.tp.rng_pictures import draw_dropout_masks, draw_saved_bytes

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import CheckpointWithoutOutput
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed


# %% [markdown]
# ## 阅读目标
#
# 1. `CudaRNGStatesTracker` 存的是什么，`fork()` 进出时对设备生成器做了什么；`get_cuda_rng_tracker` 为什么是全局单例。
# 2. `model_parallel_cuda_manual_seed(seed)` 给每个 rank 建哪三条流，种子怎么随 TP / EP 序号变化，哪些 rank 拿到同一个种子。
# 3. 为什么 TP 区域里的 dropout 必须各 rank 不同，TP 区域外的必须各 rank 相同；Megatron 在哪些行 `fork()`。
# 4. `checkpoint`（`CheckpointFunction`）和 `CheckpointWithoutOutput` 各存什么、何时重算、重算前恢复了哪些 RNG 状态；
#    不恢复 tracker 的流会怎样。
# 5. `CheckpointWithoutOutput.__init__` 里 `self.fp8 = fp8 is not None` 这一行意味着什么。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`random.py::CudaRNGStatesTracker`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L229) | 名字 → 生成器状态的字典，外加用过的种子集合 |
# | [`random.py::CudaRNGStatesTracker.add`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L285) | 用种子造一条新流：临时 `manual_seed`、读出状态、再把设备生成器还原 |
# | [`random.py::CudaRNGStatesTracker.fork`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L311) | 把一条流换进设备生成器，退出时把走过的状态写回流、换回原来的 |
# | [`random.py::get_cuda_rng_tracker`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L414) | 全进程唯一的 tracker（第一次调用时建） |
# | [`random.py::model_parallel_cuda_manual_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L446) | 三条流的种子；[`random.py:480`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L480) 起算 `seed + 2718 + tp_rank` 等（打开 GTP weight remat 时再加两条，[`random.py:503`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L503)；本篇不开） |
# | [`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490) | 把设备默认生成器设成 `seed`（CPU 层不做这一步，见"机制解释"） |
# | [`random.py::_get_all_rng_states`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L525) | CPU 生成器、设备生成器、tracker 的全部流，一次取出 |
# | [`random.py::_fork_rng`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L545) | 重算外面包的一层：重算结束后把三者都放回 backward 当时的状态 |
# | [`random.py::CheckpointFunction.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L591) | 记下全部 RNG 状态，`no_grad` 跑一遍，只 `save_for_backward` 输入 |
# | [`random.py::CheckpointFunction.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L625) | 拨回 forward 时的 RNG 状态，带 grad 重跑，再对重跑的图 backward |
# | [`random.py::checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L663) | 入口：`checkpoint(function, distribute_saved_activations, *args)` |
# | [`random.py::CheckpointWithoutOutput`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L725) | 连输出也不留：输出的存储释放为 0 字节，由后一个算子的梯度 hook 触发重算 |
# | [`random.py:740`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L740) | `self.fp8 = fp8 is not None`：缺省的 `fp8=False` 也得到 True |
# | [`random.py::CheckpointWithoutOutput._recompute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L768) | hook 里：拨回 RNG、重跑，再让原输出的存储直接指向重算结果的数据（零拷贝，[`random.py:821`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L821)） |
# | [`random.py::_get_share_storage`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L69) | 上一行用的 C++ 小扩展：第一次调用时用 `torch.utils.cpp_extension.load_inline` 现场编译（[`random.py:73`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L73)） |
# | [`random.py::CheckpointWithoutOutput.discard_output_and_register_recompute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L830) | `resize_(0)` 释放输出，在 `hook_tensor` 上注册 `_recompute` |
# | [`dot_product_attention.py:217`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L217) | attention dropout 在 `fork()` 里抽（不开 SP 时） |
# | [`transformer_block.py:596`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L596) | 开 SP 时整个 block 的 forward 都在 `fork()` 里 |
# | [`recompute.py::checkpointed_forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L21) | `recompute_granularity='full'`：按层调用 `tensor_parallel.checkpoint`（[`recompute.py:142`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L142)；较早的版本里它是 `TransformerBlock._checkpointed_forward` 方法） |
# | [`transformer_layer.py:619`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L619) | selective `layernorm` 重算：`CheckpointWithoutOutput()` 包住 `input_layernorm` |
# | [`transformer_layer.py:670`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L670) | attention 之后丢掉 norm 的输出，hook 挂在 attention 输出上 |
# | [`layers.py::_initialize_affine_weight_gpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L169) | GPU 上初始化本 rank 的权重块：在 `fork()` 里（expert 权重用 `expert-parallel-rng`） |
# | [`initialize.py::_set_random_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L418) | 正式入口：`seed + 100·pp_rank`（可选 `+ 10·dp_rank`），CPU 生成器和 tracker 用同一个种子 |

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/training/initialize.py::_set_random_seed                     # seed += 100·pp_rank
# ├─ torch.manual_seed(seed)                                           # CPU 生成器（use_cpu_initialization 的权重）
# └─ tensor_parallel/random.py::model_parallel_cuda_manual_seed(seed)
#    ├─ initialize_rng_tracker → CudaRNGStatesTracker()                # 全局单例
#    ├─ torch.cuda.manual_seed(seed)                                   # 设备默认生成器（TP 区域外的 dropout）
#    ├─ tracker.add("data-parallel-rng",   seed)
#    ├─ tracker.add("model-parallel-rng",  seed + 2718 + tp_rank)      # 每个 TP rank 一条
#    └─ tracker.add("expert-parallel-rng", seed + 1024 + 100·ep_rank + etp_rank)
#
# transformer/transformer_block.py::TransformerBlock.forward
# ├─ SP 时：with tracker.fork()                                        # 整个 block 用 TP 流
# └─ recompute_granularity='full' → megatron/core/recompute.py::checkpointed_forward
#    └─ tensor_parallel/random.py::checkpoint → CheckpointFunction.apply
#       ├─ forward:  _get_all_rng_states(); no_grad 跑层; save_for_backward(输入)
#       └─ backward: _fork_rng(); _set_all_rng_states(forward 时的); enable_grad 重跑; autograd.backward
#          └─ transformer_layer.py::TransformerLayer.forward（第二遍）
#             ├─ dot_product_attention.py::DotProductAttention.forward
#             │  └─ with tracker.fork(): attention_dropout              # TP 区域：各 TP rank 不同
#             └─ bias_dropout_add(hidden_dropout)                       # TP 区域外：各 TP rank 相同
#
# transformer/transformer_layer.py::TransformerLayer._forward_attention   # selective 'layernorm'
# ├─ CheckpointWithoutOutput().checkpoint(input_layernorm, x)            # no_grad，只存 x
# ├─ self_attention(norm 输出)                                          # 它自己存下 norm 输出（引用）
# └─ discard_output_and_register_recompute(attention 输出)               # norm 输出 resize_(0)；hook → _recompute
# ```
#
# RNG 本身不发任何通信：每个 rank 各自按公式算种子。唯一的通信在 `distribute_saved_activations=True` 时：
# `CheckpointFunction` 把存下的输入按 TP 群切成 1-D 的块，backward 前 all-gather 回来。
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `model_parallel_cuda_manual_seed` | `seed`（可给定 tp / ep / etp rank） | 无；tracker 里三条流 | `initialize_rng_tracker`、`CudaRNGStatesTracker.add`、`parallel_state` 的 rank 查询 | 只读 TP / EP / ETP 序号 | 否 | 是：重设 tracker 与设备生成器 | 初始化（`initialize_megatron`） |
# | `get_cuda_rng_tracker` | 可选的 TE / inference / cudagraph 开关 | 全局 tracker | `initialize_rng_tracker` | 否 | 否 | 第一次调用时建 tracker | 任何 `fork()` 之前 |
# | `CudaRNGStatesTracker.fork` | 流的名字（缺省 `model-parallel-rng`） | 上下文管理器 | `_get_cuda_rng_state` / `_set_cuda_rng_state` | 否（流已按 rank 区分） | 否 | 是：流前进，退出时写回 | `forward_step` 里的 dropout、GPU 上的权重初始化 |
# | `checkpoint` / `CheckpointFunction` | 函数、`distribute_saved_activations`、输入张量 | 函数的输出（forward 时不带图） | `_get_all_rng_states`、`_fork_rng`、`_set_all_rng_states`；可选 `split_tensor_into_1d_equal_chunks` / `gather_split_1d_tensor` | 仅 `distribute_saved_activations` 时用 TP 群 | 可选：存下的输入按 TP 切 | 否（backward 后 RNG 状态照旧） | `forward_step` 与 `backward` |
# | `CheckpointWithoutOutput` | 函数、输入；之后的 `hook_tensor` | 函数的输出（存储稍后释放） | `CheckpointWithoutOutputFunction`、`_get_all_rng_states`、`_get_share_storage`（C++ 扩展）；`self.fp8` 为真时 TE 的 `activation_recompute_forward` | 否 | 否 | 否 | `forward_step` 与 `backward` |
# | `_set_random_seed`（`megatron/training`） | `seed`、`data_parallel_random_init` | 无 | `model_parallel_cuda_manual_seed` | 读 PP（与 DP）序号 | 否 | 是：全部生成器 | 初始化 |

# %% [markdown]
# ## 关键对象
#
# ### tracker 与它的三条流
#
# tracker 是一个普通对象：`states_` 把名字映射到生成器状态，`seeds_` 记下用过的种子（同一个种子不许用两次）。
# `model_parallel_cuda_manual_seed` 接受显式的 `tp_rank` / `ep_rank` / `etp_rank`，所以不起进程也能看它给某个 rank 建了什么。
# 这里在一个 rank 上，按 TP=2、EP=2 中 rank 1 的坐标（tp 1、ep 0、etp 1）调用一次：

# %%
def streams_of(seed, tp_rank, ep_rank, etp_rank):
    model_parallel_cuda_manual_seed(seed, tp_rank=tp_rank, ep_rank=ep_rank, etp_rank=etp_rank)
    tracker = get_cuda_rng_tracker()
    return type(tracker).__name__, sorted(tracker.get_states()), sorted(tracker.seeds_), stream_seeds(tracker)


[(kind, names, used, by_stream)] = run_ranks(streams_of, 1, SEED, 1, 0, 1)
print(kind, "| 流:", names, "| seeds_:", used)
print("每条流的种子（从流的状态反查）:", by_stream)

# %% [markdown]
# `stream_seeds` 不重复 Megatron 的公式：它拿 `seeds_` 里的每个种子新建一个生成器，看哪个的状态与流里存的状态逐字节相同。
# 每个 rank 的实验函数都在 `snippets/experiments/n24_rng.py` 里：`seeds_and_masks` 读出本 rank 的三条流并抽两个 dropout mask，
# `recompute_run` 把一层分三种方式跑，`without_output_run` 试 `CheckpointWithoutOutput`。尺寸用注册表里的 `tiny`
# （hidden 16、4 个头、ffn 32、`[s, b] = [8, 2]`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(seeds_and_masks)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(stream_seeds, dropout_masks)

# %% [markdown]
# 一次启动 4 个 rank，在真实的 `initialize_model_parallel(tensor_model_parallel_size=2, expert_model_parallel_size=2)` 之后
# 把三件事都做完：

# %%
TINY = EXPERIMENTS["rng"].tiny


def on_each_rank():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, expert_model_parallel_size=2)
    return dict(streams=seeds_and_masks(), recompute=recompute_run(TINY, 2), without_output=without_output_run(TINY, 2))


results = run_ranks(on_each_rank, 4, grid=dict(tp=2))
streams = [r["streams"] for r in results]
seeds_table(streams)

# %% [markdown]
# 最后一列把反查到的种子与 `formula_seeds`（[`random.py:480-496`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L480-L496) 的三行公式）比较。TP=2、EP=2 放在 4 个 rank 上：
# rank 0、2 是 TP rank 0，rank 1、3 是 TP rank 1；expert 一侧 ETP 缺省等于 TP，所以 etp 序号与 tp 序号相同，EP 把 rank 0、1 和 2、3 分开。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# RNG 没有通信，但每条流"在哪些 rank 上相同"正对应一种群。把种子相同的 rank 归在一起，与 DP 群对照：

# %%
sharing_table(streams)

# %% [markdown]
# - `data-parallel-rng`：4 个 rank 相同。名字里的 "data parallel" 指它**不**随模型并行的序号变化；在正式入口里
#   它随 PP stage 变（`seed + 100·pp_rank`），开 `data_parallel_random_init` 时还随 DP 序号变。
# - `model-parallel-rng`：种子相同的 rank 恰好是 DP 群 `[0, 2]`、`[1, 3]`——同一个 TP 位置的副本抽同样的数，TP 群内各不相同。
#   DP 副本持有同一块权重切片，必须做同样的事（同样的初始化、同样的 dropout），梯度才能在 DP 群里平均。
# - `expert-parallel-rng`：每个 (ep, etp) 位置一个种子，这里 4 个 rank 全不同；它只在 expert 权重初始化
#   （[`layers.py:180`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L180)）
#   这类 expert 专属的地方 `fork`，让不同 rank 上的不同 expert 拿到不同的初值。
#
# 唯一与群有关的通信来自 `checkpoint(..., distribute_saved_activations=True)`（"机制解释"里一层的第三种跑法）：
# forward 之后把存下的输入按 TP 群切成 1-D 的等长块（`split_tensor_into_1d_equal_chunks`，各 rank 只留自己那块），
# backward 重算前在 TP 群里 all-gather 回来。rank 0 记录到的就这一次：

# %%
checkpoint_comm_table(results[0]["recompute"])

# %% [markdown]
# `[8, 2, 16]` 的输入是 256 个元素，每个 rank 存 128 个；TP 群里的几个 rank 存下的输入本来完全相同（TP 区域外的激活），
# 所以切开存、用时再拼，每个 rank 存下的输入少到 1/TP。

# %% [markdown]
# ## 机制解释
#
# ### dropout：TP 区域里各不相同，区域外处处相同
#
# 每个 rank 在 `fork()` 外和 `fork()` 里各抽一个 16 元素的 dropout mask（p=0.25），逐对 rank 比较：

# %%
pairs_table(streams)

# %% [markdown]
# 读法是两条规则：
#
# - **TP 区域外**（RowParallelLinear 的 all-reduce 之后、residual、`bias_dropout_add`；两种线性层见[笔记 10](../10_column_row_parallel_linear/)）每个 TP rank 持有**同一份**完整激活的副本。
#   mask 若不同，几份副本在 dropout 之后就不再相等，下一层的 ColumnParallelLinear 拿到的输入各 rank 不一致，结果不等于任何一个
#   单卡模型。所以这里用默认生成器，6 对 rank 全部 True。
# - **TP 区域里**（attention 的头、MLP 的 ffn 列）每个 TP rank 持有**不同的切片**。mask 若相同，头 0 和头 2（分在两张卡上）
#   就会在同样的位置被丢弃——dropout 不再是逐元素独立的，与单卡模型的统计性质不同。所以
#   [`dot_product_attention.py:217`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L217)
#   在 `fork()` 里抽：同一 TP rank（rank 0–2、1–3）相同，不同 TP rank 不同。
#
# 开 sequence parallel 时，TP 区域外的激活也按 s 切给了各 rank，于是"各 rank 持有同一份副本"不再成立：
# [`transformer_block.py:596`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L596)
# 把整个 block 放进 `fork()`，attention 那一处也就不再单独 `fork`。
#
# 下图是同样的 mask（绿色：默认生成器，4 个 rank 一个图样；蓝色两种：两条 TP 流）：

# %%
draw_dropout_masks(streams)

# %% [markdown]
# ### 重算：Megatron 的 `checkpoint` 与 PyTorch 的 `checkpoint`
#
# 真实的 local spec `TransformerLayer`（[笔记 11](../11_transformer_layer/) 逐个子模块走过它），attention dropout 和 hidden dropout 都是 0.25，TP=2。每种方式开始前都用同一个种子
# 重设全部生成器（`reseed`：`torch.manual_seed` 加 `model_parallel_cuda_manual_seed`，与正式入口一样），
# 然后 forward、`sum(y²)` backward：
#
# - 不重算：`layer(x)`；
# - `tensor_parallel.checkpoint(forward, False, x)`：`recompute_granularity='full'` 时 `TransformerBlock` 对每层做的就是这一步；
# - 同上但 `distribute_saved_activations=True`（`--distribute-saved-activations`）：存下的输入按 TP 群切开；
# - `torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=True)`：PyTorch 自己的版本，它会保存、恢复 CPU 与 CUDA 的默认生成器。
#
# 保存的字节由 `SavedTensors` 量：`torch.autograd.graph.saved_tensors_hooks` 记下 autograd 为 backward 存的每个张量（弱引用），
# 数还活着的不同存储，参数不计（matmul 存的权重不是激活）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(recompute_run)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(SavedTensors)

# %%
recompute = recompute_table(results[0]["recompute"])
recompute

# %% [markdown]
# 三件事：
#
# 1. **Megatron 的重算逐位等于不重算**：输出、输入梯度、每个参数的梯度都 `torch.equal`。层在 backward 里多跑了一遍 forward
#    （"1 / 1"），两遍抽出的 attention dropout 和 hidden dropout 完全一样，因为重跑前
#    [`CheckpointFunction.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L625)
#    把 CPU 生成器、设备生成器和 tracker 的**每一条流**都拨回了 forward 开始时的状态。
# 2. **PyTorch 的重算输出相同、梯度不同**：它只恢复默认生成器，tracker 的 `model-parallel-rng` 在第一遍 forward 里已经前进过，
#    重算时 attention dropout 抽到另一个 mask，backward 用的是另一张图。输出没错（forward 只跑了一次真的），错的是梯度——
#    而且不会报错。这就是 Megatron 自己写一份 checkpoint 的第二个理由（源码注释列的两处改动之一）。
# 3. **省下的内存**：forward 之后，不重算要一直留着整层的激活；重算只留输入 `x`（`[8, 2, 16]` fp32 = 1024 字节），
#    `distribute_saved_activations` 再把它分给两个 TP rank，每个只留 512 字节。
#    代价是 backward 里重算那一层时又临时存了同样多（不重算时 forward 存的那一份），算完这层就释放。
#    N 层都重算时，常驻的只有 N 份输入，临时的只有一层。
#
# `distribute_saved_activations` 那一行没有挂 `saved_tensors_hooks`：Megatron 在 backward 里直接替换存下的那个输入张量的
# `.data`（拼回完整形状），这要求 autograd 交回的就是原来那个张量对象；挂了 hook，交回的是另一个对象，原输入没被换回，
# backward 里形状对不上（试过：`RuntimeError`，128 对 16）。所以这一行的字节是存下的输入自己的存储大小，重算时的那一格不量。

# %%
draw_saved_bytes(recompute.rows)

# %% [markdown]
# "恢复了哪些 RNG 状态"也可以直接看：backward 之前和之后，默认生成器与 tracker 里 `model-parallel-rng` 的状态各比一次。
# Megatron 的重算在 `_fork_rng` 里先把一切拨回 forward 开始时、重跑，再原样放回 backward 开始时的状态，所以重算对后面的训练
# 不留痕迹；PyTorch 的重算里 `fork()` 照常把 TP 流往前推，没人把它推回去：

# %%
Table(["方式", "backward 前后默认生成器不变", "backward 前后 `model-parallel-rng` 不变"],
      [[MODE_NAMES[m], *results[0]["recompute"][m]["generators_kept"]] for m in MODES])

# %% [markdown]
# ### `CheckpointWithoutOutput`：连输出也不留
#
# `checkpoint` 至少要留下输入，而且它的**输出**往往还被后一个算子存着（比如 norm 的输出被 attention 的 QKV 线性层存下）。
# selective `layernorm` 重算用 `CheckpointWithoutOutput`：norm 在 `no_grad` 里跑、只存输入；attention 照常存下 norm 输出的引用；
# attention 算完后 `discard_output_and_register_recompute` 把 norm 输出的**存储** `resize_(0)`，张量的形状等元数据还在；
# backward 走到 attention 输出的梯度时，hook 触发 `_recompute`，拨回 RNG、重跑 norm，再让 norm 输出那个张量的存储直接指向
# 重算结果的数据（不拷贝字节，[`random.py:821`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L821)），attention 的 backward 读到的就是原值。这里照 [`transformer_layer.py:619`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L619)
# 到 [`transformer_layer.py:670`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L670) 的写法，对同一层的 `input_layernorm` → `self_attention` 跑一遍（用 `fp8=None`，原因见下一节）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(without_output_run)

# %%
without_output_table(results[0]["without_output"])

# %% [markdown]
# norm 的输出 `[8, 2, 16]` 本来占 1024 字节，丢弃之后是 0；forward 之后保存的激活少了 1152 字节（norm 输出，加上 norm 自己为
# backward 存的统计量——它在 `no_grad` 里跑，什么也不存）。norm 在 backward 里重跑了一次，输出与所有梯度与不重算逐位相同。
#
# **第一次重算要编译 C++。** "让存储指向重算结果"不是 torch 的公开操作：`random.py` 里带着一段十几行的 C++ 源码
# （[`random.py:41`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L41)），在存储这一层（张量与 autograd 之下）换掉数据指针，所以共用这块存储的所有视图都看得到新数据，
# 也不会碰张量的版本计数。`_get_share_storage` 第一次被调用时用 `torch.utils.cpp_extension.load_inline` 把它编译成扩展
# `share_storage_ext`（[`random.py:69-79`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L69-L79)）：需要机器上有 C++ 编译器和 ninja，本机第一次约 25–30 秒，
# 结果缓存在 `~/.cache/torch_extensions/`，同一台机器之后直接加载。所以用 `CheckpointWithoutOutput` 的训练（selective
# `layernorm` / `moe_act` 重算）第一次 backward 会停顿半分钟左右；没有编译器的环境里它在 backward 的 hook 里报错。
# 还有一个 torch 自己的坑：venv 路径里有空格时链接失败，torch 传给链接器的 `-L` 路径没加引号（亲见）。
# 本页在 CPU 上不编译它：CPU 层把这一步换成把重算结果拷进原输出那块 storage（同一块 StorageImpl，视图看到的值相同，
# 也不动版本计数），上面"逐位相同"的结论因此不变；GPU 上跑的是 Megatron 原样的零拷贝。
#
# ### `self.fp8 = fp8 is not None`
#
# [`random.py:740`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L740)
# 把参数与 `None` 比较，而参数的缺省值是 `False`。于是只有显式传 `fp8=None` 时 `self.fp8` 才为假：

# %%
print({arg: CheckpointWithoutOutput(fp8=arg).fp8 for arg in (False, True, None)}, "| 缺省:", CheckpointWithoutOutput().fp8)
print("4 个 rank 上缺省构造再 checkpoint:", sorted({r["without_output"]["default_error"] for r in results}))
print("TransformerLayer(recompute_granularity='selective', recompute_modules=['layernorm']) 的 forward:",
      sorted({r["without_output"]["layer_error"] for r in results}))

# %% [markdown]
# `self.fp8` 为真时，forward 问 TE 的 `FP8GlobalStateManager` FP8 是否打开，并进入 TE 的 `activation_recompute_forward` 上下文；
# 重算时再进一次（`recompute_phase=True`）。`transformer_layer.py` 的两处（`layernorm` 的两个 norm）和 `moe/experts.py` 的两处（`moe_act`）都不带参数，所以在装了 TE 的机器上它们**总是**走
# TE 的这条路，哪怕没开 FP8——TE 靠这个上下文区分"第一次 forward"和"重算"，在 FP8 下才不会把 amax 历史记两遍。
# 这台机器没有 TE，模块顶部的 `import transformer_engine` 失败，这些名字没有定义，所以缺省构造的对象一 `checkpoint` 就是
# `NameError`，真实的 `TransformerLayer` 开 selective `layernorm` 重算时 forward 也一样（上面第三行）：
# 这两种 selective 重算在没有 TE 的环境里跑不起来。
#
# 这不是笔误：core_v0.19.0 里这一行原样不动
# （[`random.py:740`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L740)），
# 之后主干在这个 `__init__` 的 docstring 里明确写下：缺省值就是会得到 True，好几个 selective 重算模块的 FP8 amax 记账依赖它，
# 不要改成 `bool(fp8)`，要改须另开 PR 并附 FP8 功能测试
# （[PR #4531](https://github.com/NVIDIA/Megatron-LM/pull/4531) 合入主干的提交 `7cdba422b8`，改的正是
# `CheckpointWithoutOutput.__init__` 的 docstring；core_v0.19.0 还不含它）。读代码时把它当作"缺省走 TE 路径"的开关即可。
#
# ### CPU 层：CPU 生成器扮演 GPU 的两个生成器
#
# GPU 上有两个生成器：CPU 的（`torch.manual_seed`；`use_cpu_initialization` 的权重从它抽）和 CUDA 的（dropout、GPU 上的初始化）；
# tracker 的流全是 CUDA 状态。CPU 上只有一个默认生成器，`snippets/cpu/rng.py` 的 `rng_tracker` 补丁（[在 CPU 上运行](../../cpu/)一页列出它）这样安排：
#
# - `add` 在一个专用的 `torch.Generator`（`snippets.cpu.rng.STREAMS`）里播种、读状态，不碰默认生成器；
# - `fork()` 把流**借给**默认生成器，退出时由 Megatron 自己的保存 / 还原代码换回：默认生成器在 `fork()` 外扮演 CUDA 默认生成器，
#   在 `fork()` 里扮演换进来的流；
# - [`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)
#   那一步（把设备默认生成器设成 `seed`）不做：CPU 上它会重设用户的 `torch.manual_seed`。所以实验像正式入口一样两个都设（`reseed`）。
#
# 对本篇的含义：`_get_all_rng_states` 取到的"CPU 状态"和"CUDA 状态"在这里是同一个生成器的两份拷贝，恢复时设了两遍，
# 结果与 GPU 上一样；`fork()` 外的 mask 来自 `torch.manual_seed` 设的那个生成器（GPU 上来自被设成 `seed` 的 CUDA 生成器，
# 两者在各 rank 上都相同，结论不变）；上表 `torch.utils.checkpoint` 的梯度错误在 GPU 上同样出现——它恢复的也只是两个默认生成器。

# %% [markdown]
# ## 与训练主链路的关系
#
# - **初始化**：`initialize_megatron` → `_set_random_seed`，每个 PP stage 一个种子，`torch.manual_seed` 与
#   `model_parallel_cuda_manual_seed` 同时设。此后整个训练不再重设；存 checkpoint 时
#   [`checkpointing.py::get_rng_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L398)
#   把 CPU、CUDA 生成器和 tracker 的 `get_states()` 一起存下，恢复训练时放回（[笔记 07](../07_checkpointing/)）。
# - **每个 micro-batch 的 forward**（`forward_step`）：每层的 attention dropout 在 `fork()` 里，hidden dropout 在外面；SP 时整个 block 在 `fork()` 里。
# - **重算**：`--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N` 让 `TransformerBlock`
#   对 N 层一组调用 `tensor_parallel.checkpoint`；`selective` 加 `--recompute-modules`（缺省 `core_attn`，还有 `layernorm`、`mlp`、
#   `moe_act` 等）只重算层里的一部分，其中 `core_attn` 也走 `tensor_parallel.checkpoint`，`layernorm` / `moe_act` 走 `CheckpointWithoutOutput`。
#   重算发生在 `backward_step` 里，流水线的 1F1B 调度（[笔记 13](../13_pipeline_schedules/)）决定了每个 stage 同时有几个 micro-batch 的输入被留着。

# %% [markdown]
# ## 与基础知识的连接
#
# - **PyTorch 的生成器**：`torch.get_rng_state()` / `set_rng_state()` 读写 CPU 生成器，`torch.cuda.get_rng_state()` 读写当前 GPU 的；
#   一个 `torch.Generator` 的全部状态就是一个 ByteTensor，所以"保存 / 恢复一条流"只是拷一个张量。tracker 就是一个装这些张量的字典。
# - **activation checkpointing**（Chen et al. 2016）：用算力换内存，forward 只留段边界的张量，backward 时按段重算。
#   `torch.utils.checkpoint` 是 PyTorch 的实现；`preserve_rng_state=True` 只覆盖默认生成器，这正是上面梯度出错的原因。
# - **saved tensors hooks**：`torch.autograd.graph.saved_tensors_hooks(pack, unpack)` 在 autograd 存、取每个张量时回调，
#   是量"为 backward 存了多少"最直接的办法（比看进程 RSS 确定得多）；它也是 CPU offload 类方法的基础。
# - **dropout 的独立性**：dropout 假设每个元素独立地以 p 被丢弃。模型并行下"独立"要在全局张量上成立，而不是在每张卡的切片上各自成立。

# %% [markdown]
# ## 遗留问题
#
# 1. **没有 TE 时 selective `layernorm` / `moe_act` 重算跑不起来。** 缺省的 `CheckpointWithoutOutput()`（`self.fp8` 为真）
#    直接用 TE 的名字（[`random.py:693`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L693)），
#    上面的运行是 `NameError`。这是有意保留的行为（见"机制解释"）；CPU 上只能像本篇这样自己传 `fp8=None`。
# 2. **`distribute_saved_activations` 只在不开 SP 时可用**（开 SP 时 `TransformerConfig` 拒绝它：SP 下输入本来就按 s 切了）；
#    它靠替换存下张量的 `.data` 工作，与 `saved_tensors_hooks`（CPU offload 一类工具的基础）不相容，见上面重算一节。
# 3. **CPU 上 tracker 的流不是 CUDA 的 Philox 状态。** 种子和"谁与谁相同"与 GPU 上一致，但抽出来的具体 mask 不同；
#    `use_cudagraphable_rng=True`（graph-safe 的状态）CPU 层直接拒绝。
# 4. **正式入口在没有 GPU 时不调用 `model_parallel_cuda_manual_seed`**
#    （[`initialize.py::_set_random_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L418) 里有
#    `torch.cuda.device_count() > 0` 的判断）。本篇的实验直接调用它，因为 CPU 层让它在 CPU 上也有意义。

# %% [markdown]
# ## 自测

# %% [markdown]
# **1. TP=4、EP=2、ETP=1，`seed=42`。tp rank 3、ep rank 1、etp rank 0 的 rank，三条流的种子各是多少？**
#
# <details><summary>答案</summary>
#
# `data-parallel-rng` 42，`model-parallel-rng` 42 + 2718 + 3 = 2763，`expert-parallel-rng` 42 + 1024 + 100·1 + 0 = 1166
# （下面的单元格用真实函数算，再从流的状态反查）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
[(*_, by_stream)] = run_ranks(streams_of, 1, 42, 3, 1, 0)
print(by_stream, "| = 公式:", by_stream == formula_seeds(42, 3, 1, 0))

# %% [markdown]
# **2. 把 `model-parallel-rng` 换成默认生成器来抽 attention dropout（即去掉 `fork()`），TP=2 的两张卡上头 0 和头 2 的 mask 会怎样？为什么不行？**
#
# <details><summary>答案</summary>
#
# 两张卡的默认生成器状态相同，抽出同一个 mask：头 0（卡 0）和头 2（卡 1）在同样的位置被丢弃，全局张量上的 dropout 不再逐元素独立。
# 上面每一对不同 TP rank 的"fork() 外 mask 相同"都是 True，就是这个情形（下面的单元格从运行结果数出来）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
other_tp = [(a["rank"], b["rank"]) for a in streams for b in streams if a["rank"] < b["rank"] and a["tp_rank"] != b["tp_rank"]]
print("不同 TP rank 的对:", other_tp)
print("fork() 外相同:", [streams[a]["outside"] == streams[b]["outside"] for a, b in other_tp],
      "| fork() 里相同:", [streams[a]["inside"] == streams[b]["inside"] for a, b in other_tp])

# %% [markdown]
# **3. 用 `torch.utils.checkpoint` 代替 Megatron 的 `checkpoint`，输出对不对、梯度对不对？差在哪一个生成器？**
#
# <details><summary>答案</summary>
#
# 输出对（forward 只真正跑了一次），输入梯度和参数梯度都不对。PyTorch 恢复了 CPU 与 CUDA 默认生成器，hidden dropout 重算得一样；
# tracker 的 `model-parallel-rng` 没有恢复，重算时 attention dropout 换了 mask。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
torch_mode = results[0]["recompute"]["torch"]
print({k: torch_mode[k] for k in ("same_y", "same_dx", "same_grads")},
      "| 最大梯度差:", round(torch_mode["max_grad_diff"], 4))

# %% [markdown]
# **4. `tensor_parallel.checkpoint` 包住一层、输入 `[s, b, h] = [8, 2, 16]` fp32，forward 之后这一层为 backward 留下多少字节的激活？
# 重算那一刻呢？**
#
# <details><summary>答案</summary>
#
# forward 之后只有输入：8·2·16·4 = 1024 字节；backward 里重算时临时存下与不重算时一样多（本篇 13632 字节），这一层算完即释放。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
megatron_mode, plain_mode = results[0]["recompute"]["megatron"], results[0]["recompute"]["plain"]
print(megatron_mode["saved"], "=", TINY.seq * TINY.micro_batch_size * TINY.hidden * 4,
      "| 重算时:", megatron_mode["recompute_saved"], "| 不重算 forward 之后:", plain_mode["saved"])

# %% [markdown]
# **5. `CheckpointWithoutOutput(fp8=False).fp8` 是什么？在没有 TE 的机器上，`TransformerLayer` 的 selective `layernorm` 重算会怎样？**
#
# <details><summary>答案</summary>
#
# `True`（`False is not None`）。于是 forward 要用 TE 的 `FP8GlobalStateManager`，没有 TE 时是 `NameError`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(CheckpointWithoutOutput(fp8=False).fp8, "|", results[0]["without_output"]["default_error"])

# %% [markdown]
# ## 30-second answer
#
# Megatron keeps named RNG streams in a `CudaRNGStatesTracker`. `model_parallel_cuda_manual_seed(seed)` gives every rank
# a data-parallel stream (`seed`), a model-parallel stream (`seed+2718+tp_rank`) and an expert stream. Dropout on
# TP-split activations runs inside `tracker.fork()`, so each TP rank draws its own mask while DP replicas match;
# dropout on replicated activations uses the default generator, identical on all TP ranks. Activation recompute
# (`checkpoint`, `CheckpointWithoutOutput`) saves only inputs and restores every generator *and* the tracker's
# streams before re-running, so gradients are bit-identical — `torch.utils.checkpoint` misses the tracker and silently
# changes them.
