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
# TP 把一层切给几张卡之后，dropout 的硬币从哪个生成器来：哪些卡上的 mask 必须相同，哪些必须不同？
# activation 重算时，backward 里重跑的 forward 怎样抛出**同样**的硬币，换成 PyTorch 的 `torch.utils.checkpoint` 会怎样？
# 重算一层省下多少内存，`recompute_method` 的 `uniform` 和 `block` 又各把哪几层包起来？本篇在 4 个进程（TP=2、EP=2）上读出
# Megatron Core 0.19.0 每条 RNG 流的种子、比较每对 rank 的 dropout mask，再把真实的 `TransformerLayer` / `TransformerBlock`
# 按几种方式重算，逐位比较输出和梯度，量出 autograd 为 backward 存了多少字节。

# %% [markdown]
# ## 阅读目标
#
# 1. `CudaRNGStatesTracker` 存什么、`fork()` 做什么；`model_parallel_cuda_manual_seed` 给每个 rank 建哪三条流、种子怎么算。
# 2. 为什么 TP 区域里的 dropout 各 TP rank 不同、区域外处处相同；DP 副本拿到什么种子、为什么。
# 3. `checkpoint`（`CheckpointFunction`）存什么、重算前恢复哪些 RNG 状态；full 重算的 `uniform` / `block` 各包哪几层。
# 4. `CheckpointWithoutOutput` 怎样连输出也不留；`self.fp8 = fp8 is not None` 意味着什么。
#
# **结论**
#
# - `model_parallel_cuda_manual_seed(1234)` 建三条流：`data-parallel-rng` 1234、TP 流 1234+2718+tp_rank（3952/3953）、expert 流 2258–2359。
# - TP=2 的 4 个 rank：`fork()` 外的 mask 6 对全相同；`fork()` 里只有同一 TP rank 的 0–2、1–3 相同。
# - Megatron 的 `checkpoint` 重算后输出和梯度逐位相同；`torch.utils.checkpoint` 不恢复 TP 流，梯度最大差 1.118，不报错。
# - 重算一层，forward 后只留输入 1024 字节（不重算 13632）；`distribute_saved_activations` 再切成每 rank 512。
# - full 重算 4 层：`uniform` N=2 把 2 层包成一段（backward 重跑 3、4、1、2），`block` N=2 只包前 2 层（重跑 2、1）。
# - `CheckpointWithoutOutput` 把 norm 输出（1024 字节）也释放，但 `fp8=False` 也得 True，没有 TE 时 `NameError`。
#
# 先读：[笔记 10](../10_column_row_parallel_linear/)（TP 区域里外）、[笔记 11](../11_transformer_layer/)（一层里的两个 dropout）；约 24 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
# snippets first: it applies the CPU patches and silences known warnings.
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n24_rng import (MODE_NAMES, MODES, SEED, build_layer, checkpoint_comm_table, pairs_table,
                                          recompute_run, recompute_table, reseed, seeds_and_masks, seeds_table,
                                          sharing_table, without_output_run, without_output_table)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp.rng import SavedTensors, dropout_masks, formula_seeds, stream_seeds
from snippets.tp.rng_pictures import draw_dropout_masks, draw_saved_bytes

import torch
import torch.distributed as dist
from IPython.display import display
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import CheckpointWithoutOutput
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_block import TransformerBlock

TINY = EXPERIMENTS["rng"].tiny


def on_each_rank():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, expert_model_parallel_size=2)
    return dict(streams=seeds_and_masks(), recompute=recompute_run(TINY, 2), without_output=without_output_run(TINY, 2))


results = run_ranks(on_each_rank, 4, grid=dict(tp=2))
streams = [r["streams"] for r in results]
draw_dropout_masks(streams, title="TP=2、EP=2 的 4 个 rank：fork() 外的 dropout mask 处处相同，"
                                  "fork() 里只在同一 TP rank 上相同")

# %% [markdown]
# 每行是一个 rank 抽的 16 个元素的 keep-mask（p=0.25）。左：默认生成器，4 个 rank 一个图样；右：tracker 的
# `model-parallel-rng`，两种蓝色是两个 TP rank 的流。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n24_rng.py`（实验名 `rng`，源码在下面的折叠代码里）。一次启动 4 个本地 gloo 进程
#   （`snippets.ranks.launch.run_ranks`），在 `initialize_model_parallel(tensor_model_parallel_size=2, expert_model_parallel_size=2)`
#   之后做三件事：`seeds_and_masks` 用 `reseed`（`torch.manual_seed` 加 `model_parallel_cuda_manual_seed`，与正式入口一样）
#   设种子，读出本 rank 的三条流，再在 `fork()` 外、里各抽一个 16 元素的 dropout mask；`recompute_run` 把一层
#   `TransformerLayer` 分四种方式跑；`without_output_run` 试 `CheckpointWithoutOutput`。结果回到 notebook 进程打印。
# - `snippets.tp.rng.stream_seeds` 不重复 Megatron 的公式：它拿 tracker 的 `seeds_` 里的每个种子新建一个生成器，看哪个的状态
#   与流里存的逐字节相同；`formula_seeds` 是公式本身，只用来对照。
# - 保存的字节由 `snippets.tp.rng.SavedTensors` 量：`torch.autograd.graph.saved_tensors_hooks` 记下 autograd 为 backward
#   存的每个张量（弱引用），数还活着的不同存储，参数不计（matmul 存的权重不是激活）。`distribute_saved_activations` 那一行不挂
#   这个 hook（原因见遗留问题），报的是存下的输入自己的存储大小，重算时的那一格不量。
# - 尺寸是实验登记的 `tiny`：hidden 16、4 个头、ffn 32、`[s, b] = [8, 2]`，attention / hidden dropout 都是 0.25，种子 1234。
# - 命令行复现这些表：`.venv/bin/python -m snippets.run --nproc-per-node 4 rng --tp 2 --ep 2`；整页：
#   `scripts/execute_notes.sh notes/24_rng_and_recomputation.py`。CPU 上 RNG 怎样安排见文末"在 CPU 上怎么跑的"。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(seeds_and_masks, recompute_run, without_output_run)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(stream_seeds, dropout_masks, SavedTensors)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`random.py::CudaRNGStatesTracker.fork`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L311) | 把一条流换进设备生成器，退出时写回、换回 |
# | [`random.py::model_parallel_cuda_manual_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L446) | 三条流的种子（[`random.py:480-496`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L480-L496)） |
# | [`dot_product_attention.py:217`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L217) | attention dropout 在 `fork()` 里抽（不开 SP 时） |
# | [`random.py::CheckpointFunction.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L625) | 拨回 forward 时的全部 RNG 状态，带 grad 重跑 |
# | [`recompute.py::checkpointed_forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L21) | full 重算：`uniform` / `block` 决定包哪几层 |
# | [`random.py::CheckpointWithoutOutput`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L725) | 连输出也释放，由后一个算子的梯度 hook 触发重算 |
# | [`random.py:740`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L740) | `self.fp8 = fp8 is not None` |
# | [`initialize.py::_set_random_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L418) | 正式入口：`seed + 100·pp_rank`（可选 `+ 10·dp_rank`） |
#
# <details><summary>其余 19 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`random.py::CudaRNGStatesTracker`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L229) | 名字 → 生成器状态的字典，外加用过的种子集合 |
# | [`random.py::CudaRNGStatesTracker.add`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L285) | 用种子造一条新流：临时 `manual_seed`、读出状态、再把设备生成器还原 |
# | [`random.py::get_cuda_rng_tracker`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L414) | 全进程唯一的 tracker（第一次调用时建） |
# | [`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490) | 把设备默认生成器设成 `seed` |
# | [`random.py:504`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L504) | 打开 GTP weight remat 时再加两条流（本篇不开） |
# | [`random.py::_get_all_rng_states`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L525) | CPU 生成器、设备生成器、tracker 的全部流，一次取出 |
# | [`random.py::_fork_rng`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L545) | 重算外面包的一层：结束后把三者放回 backward 当时的状态 |
# | [`random.py::CheckpointFunction.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L591) | 记下全部 RNG 状态，`no_grad` 跑一遍，只 `save_for_backward` 输入 |
# | [`random.py::checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L663) | 入口：`checkpoint(function, distribute_saved_activations, *args)` |
# | [`random.py:693`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L693) | `self.fp8` 为真时问 TE 的 `FP8GlobalStateManager` |
# | [`random.py::CheckpointWithoutOutput._recompute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L768) | hook 里：拨回 RNG、重跑，让原输出的存储指向重算结果（[`random.py:821`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L821)） |
# | [`random.py::_get_share_storage`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L69) | 上一行用的 C++ 小扩展，第一次调用时 `load_inline` 现场编译（[`random.py:73`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L73)） |
# | [`random.py::CheckpointWithoutOutput.discard_output_and_register_recompute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L830) | `resize_(0)` 释放输出，在 `hook_tensor` 上注册 `_recompute` |
# | [`transformer_block.py:596`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L596) | 开 SP 时整个 block 的 forward 都在 `fork()` 里 |
# | [`transformer_block.py:624`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L624) | `recompute_granularity='full'` 且在训练时改走 `checkpointed_forward` |
# | [`transformer_layer.py:619`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L619) | selective `layernorm` 重算：`CheckpointWithoutOutput()` 包住 `input_layernorm` |
# | [`transformer_layer.py:670`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L670) | attention 之后丢掉 norm 的输出，hook 挂在 attention 输出上 |
# | [`layers.py::_initialize_affine_weight_gpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L169) | GPU 上初始化本 rank 的权重块：在 `fork()` 里（expert 权重用 `expert-parallel-rng`） |
# | [`training.py:1899`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1899) | `--data-parallel-random-init` 时包好 DDP 后广播参数 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 初始化时 `_set_random_seed` → `model_parallel_cuda_manual_seed` 建流；每层 forward 里 attention dropout 在 `fork()` 里、
# hidden dropout 在外面；重算（full 走 `checkpointed_forward` → `tensor_parallel.checkpoint`，selective 的 norm 走
# `CheckpointWithoutOutput`）在 backward 里拨回全部 RNG 状态再重跑。RNG 本身不通信。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/initialize.py::_set_random_seed                     # seed += 100·pp_rank（可选 += 10·dp_rank）
# ├─ torch.manual_seed(seed)                                           # CPU 生成器（use_cpu_initialization 的权重）
# └─ tensor_parallel/random.py::model_parallel_cuda_manual_seed(seed)  # 只在有 GPU 时调用
#    ├─ initialize_rng_tracker → CudaRNGStatesTracker()                # 全局单例
#    ├─ torch.cuda.manual_seed(seed)                                   # 设备默认生成器（TP 区域外的 dropout）
#    ├─ tracker.add("data-parallel-rng",   seed)
#    ├─ tracker.add("model-parallel-rng",  seed + 2718 + tp_rank)      # 每个 TP rank 一条
#    └─ tracker.add("expert-parallel-rng", seed + 1024 + 100·ep_rank + etp_rank)
#
# transformer/transformer_block.py::TransformerBlock.forward
# ├─ SP 时：with tracker.fork()                                        # 整个 block 用 TP 流
# └─ recompute_granularity='full' → megatron/core/recompute.py::checkpointed_forward
#    ├─ uniform：每 recompute_num_layers 层一段，每段一次 checkpoint
#    ├─ block：前 recompute_num_layers 层各自一次 checkpoint，其余不重算
#    └─ tensor_parallel/random.py::checkpoint → CheckpointFunction.apply（fp8 / fp4 时改用 TE 的 te_checkpoint）
#       ├─ forward:  _get_all_rng_states(); no_grad 跑这一段; save_for_backward(输入)
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
# 唯一的通信在 `distribute_saved_activations=True` 时：`CheckpointFunction` 把存下的输入按 TP 群切成 1-D 的块，
# backward 前 all-gather 回来。
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `model_parallel_cuda_manual_seed` | `seed`（可给定 tp / ep / etp rank） | 无；tracker 里三条流 | `initialize_rng_tracker`、`CudaRNGStatesTracker.add`、`parallel_state` 的 rank 查询 | 只读 TP / EP / ETP 序号 | 否 | 是：重设 tracker 与设备生成器 | 初始化（`initialize_megatron`） |
# | `get_cuda_rng_tracker` | 可选的 TE / inference / cudagraph 开关 | 全局 tracker | `initialize_rng_tracker` | 否 | 否 | 第一次调用时建 tracker | 任何 `fork()` 之前 |
# | `CudaRNGStatesTracker.fork` | 流的名字（缺省 `model-parallel-rng`） | 上下文管理器 | `_get_cuda_rng_state` / `_set_cuda_rng_state` | 否（流已按 rank 区分） | 否 | 是：流前进，退出时写回 | `forward_step` 里的 dropout、GPU 上的权重初始化 |
# | `checkpoint` / `CheckpointFunction` | 函数、`distribute_saved_activations`、输入张量 | 函数的输出（forward 时不带图） | `_get_all_rng_states`、`_fork_rng`、`_set_all_rng_states`；可选 `split_tensor_into_1d_equal_chunks` / `gather_split_1d_tensor` | 仅 `distribute_saved_activations` 时用 TP 群 | 可选：存下的输入按 TP 切 | 否（backward 后 RNG 状态照旧） | `forward_step` 与 `backward` |
# | `checkpointed_forward` | block、hidden、mask 等 | 最后一层的输出 | `tensor_parallel.checkpoint`（fp8 / fp4：`te_checkpoint`） | 同上 | 同上 | 否 | `forward_step` 与 `backward` |
# | `CheckpointWithoutOutput` | 函数、输入；之后的 `hook_tensor` | 函数的输出（存储稍后释放） | `CheckpointWithoutOutputFunction`、`_get_all_rng_states`、`_get_share_storage`（C++ 扩展）；`self.fp8` 为真时 TE 的 `activation_recompute_forward` | 否 | 否 | 否 | `forward_step` 与 `backward` |
# | `_set_random_seed`（`megatron/training`） | `seed`、`data_parallel_random_init` | 无 | `model_parallel_cuda_manual_seed` | 读 PP（与 DP）序号 | 否 | 是：全部生成器 | 初始化 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### tracker 与它的三条流
#
# tracker 是一个普通对象：`states_` 把名字映射到生成器状态（一个 ByteTensor），`seeds_` 记下用过的种子（同一个种子不许用两次）。
# `fork(name)` 进入时把这条流的状态换进设备生成器，退出时把走过的状态写回流、换回原来的：`fork()` 里抽的随机数来自这条流，
# 外面照常用默认生成器。`model_parallel_cuda_manual_seed` 接受显式的 `tp_rank` / `ep_rank` / `etp_rank`，所以不建群也能看
# 它给某个 rank 建了什么。按 TP=2、EP=2 中 rank 1 的坐标（tp 1、ep 0、etp 1）调用一次，再从流的状态反查种子：

# %%
def streams_of(seed, tp_rank, ep_rank, etp_rank):
    model_parallel_cuda_manual_seed(seed, tp_rank=tp_rank, ep_rank=ep_rank, etp_rank=etp_rank)
    tracker = get_cuda_rng_tracker()
    return type(tracker).__name__, sorted(tracker.get_states()), sorted(tracker.seeds_), stream_seeds(tracker)


[(kind, names, used, by_stream)] = run_ranks(streams_of, 1, SEED, 1, 0, 1)
print(kind, "| 流:", names, "| seeds_:", used)
print("每条流的种子（从流的状态反查）:", by_stream)

# %% [markdown]
# 三行公式（[`random.py:480-496`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L480-L496)）：
# `data-parallel-rng` 就是 `seed`；`model-parallel-rng` 是 `seed + 2718 + tp_rank`；`expert-parallel-rng` 是
# `seed + 1024 + 100·ep_rank + etp_rank`。同时把设备默认生成器设成 `seed`
# （[`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)）。
# 4 个 rank 在真实的 `initialize_model_parallel` 之后各自读出的种子，最后一列与公式对照：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
seeds_table(streams)

# %% [markdown]
# rank 0、2 是 TP rank 0，rank 1、3 是 TP rank 1；expert 一侧 ETP 缺省等于 TP，所以 etp 序号与 tp 序号相同，EP 把 rank 0、1 和 2、3 分开。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# RNG 不发通信，但每条流"在哪些 rank 上相同"正对应一种群。把种子相同的 rank 归在一起，与 DP 群对照：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
sharing_table(streams)

# %% [markdown]
# - `data-parallel-rng`：4 个 rank 相同。名字里的 "data parallel" 指它**不**随模型并行的序号变化。
# - `model-parallel-rng`：种子相同的 rank 恰好是 DP 群 `[0, 2]`、`[1, 3]`：TP 群内各不相同，同一个 TP 位置的 DP 副本相同。
# - `expert-parallel-rng`：每个 (ep, etp) 位置一个种子，这里 4 个 rank 全不同；它只在 expert 权重初始化这类 expert 专属的地方
#   `fork`（[`layers.py:180`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L180)），让不同 rank 上的不同 expert 拿到不同的初值。
#
# **DP 副本为什么拿到同一个种子。** 上面 4 个 rank 都从 `seed` 出发；正式入口 `_set_random_seed` 也只按 PP stage 区分，
# 缺省不看 DP 序号。在 PP=2、DP=2 的 4 个 rank 上调它，读回 `torch.manual_seed` 设下的种子：

# %%
def entry_seed(data_parallel_random_init):
    from megatron.training.initialize import _set_random_seed

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    _set_random_seed(SEED, data_parallel_random_init=data_parallel_random_init)
    return [data_parallel_random_init, dist.get_rank(), parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(), torch.initial_seed()]


Table(["data_parallel_random_init", "rank", "pp rank", "dp rank", "种子"],
      run_ranks(entry_seed, 4, False, grid=dict(pp=2)) + run_ranks(entry_seed, 4, True, grid=dict(pp=2)))

# %% [markdown]
# 缺省每个 PP stage 一个种子 `seed + 100·pp_rank`
# （[`initialize.py:439`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L439)），
# 同一 stage 的 DP 副本种子相同。要的是**权重初值**相同：DP 副本持有同一块权重，各自按同一个种子初始化，不用广播就一致。
# dropout 流随之也相同，但这只是副作用，不是梯度平均的条件：各 DP rank 喂的数据本来就不同，梯度本来就各不相同，
# 平均只要求各副本的参数相同。开 `--data-parallel-random-init` 时种子再加 `10·dp_rank`
# （[`initialize.py:441-443`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L441-L443)），
# 各 DP rank 的初值不再相同，于是包好 DDP 之后从 DP 群的第一个 rank 广播参数
# （[`training.py:1899-1901`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1899-L1901)）；
# 之后各 DP rank 的 dropout 也各不相同。
#
# 唯一与群有关的通信来自 `checkpoint(..., distribute_saved_activations=True)`：forward 之后把存下的输入按 TP 群切成 1-D 的
# 等长块，各 rank 只留自己那块，backward 重算前在 TP 群里 all-gather 回来。rank 0 记录到的就这一次：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
checkpoint_comm_table(results[0]["recompute"])

# %% [markdown]
# `[8, 2, 16]` 的输入是 256 个元素，每个 rank 存 128 个：TP 群里几个 rank 存下的输入本来完全相同（TP 区域外的激活），
# 切开存、用时再拼，每个 rank 存的少到 1/TP。

# %% [markdown]
# ## 机制解释
#
# ### dropout：TP 区域里各不相同，区域外处处相同
#
# 页首的图就是每个 rank 在 `fork()` 外、里各抽一个 mask 的结果；逐对 rank 比较（表折叠在下面）：`fork()` 外 6 对全相同，
# `fork()` 里只有同一 TP rank 的 0–2、1–3 相同。两条规则：
#
# - **TP 区域外**（RowParallelLinear 的 all-reduce 之后、residual、`bias_dropout_add`；两种线性层见[笔记 10](../10_column_row_parallel_linear/)）
#   每个 TP rank 持有**同一份**完整激活的副本。mask 若不同，几份副本在 dropout 之后就不再相等，下一层 ColumnParallelLinear
#   拿到的输入各 rank 不一致，结果不等于任何一个单卡模型。所以这里用默认生成器。
# - **TP 区域里**（attention 的头、MLP 的 ffn 列）每个 TP rank 持有**不同的切片**。mask 若相同，头 0 和头 2（分在两张卡上）
#   就在同样的位置被丢弃，dropout 不再逐元素独立，与单卡模型的统计性质不同。所以
#   [`dot_product_attention.py:217`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L217)
#   在 `fork()` 里抽。
#
# 开 sequence parallel 时，TP 区域外的激活也按 s 切给了各 rank，"各 rank 持有同一份副本"不再成立：
# [`transformer_block.py:596`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L596)
# 把整个 block 放进 `fork()`，attention 那一处也就不再单独 `fork`。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
pairs_table(streams)

# %% [markdown]
# ### 重算：Megatron 的 `checkpoint` 与 PyTorch 的 `checkpoint`
#
# 真实的 local spec `TransformerLayer`（[笔记 11](../11_transformer_layer/) 逐个子模块走过它），attention dropout 和 hidden
# dropout 都是 0.25，TP=2。每种方式都从同一个 RNG 状态开始，forward、`sum(y²)` backward：不重算 `layer(x)`；
# `tensor_parallel.checkpoint(forward, False, x)`；同上但 `distribute_saved_activations=True`；
# `torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=True)`（PyTorch 的版本，保存、恢复 CPU 与 CUDA 的默认生成器）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
recompute = recompute_table(results[0]["recompute"])
recompute

# %% [markdown]
# 1. **Megatron 的重算逐位等于不重算**：输出、输入梯度、每个参数的梯度都 `torch.equal`。层在 backward 里多跑了一遍（"1 / 1"），
#    两遍抽出的 attention dropout 和 hidden dropout 完全一样，因为重跑前
#    [`CheckpointFunction.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L625)
#    把 CPU 生成器、设备生成器和 tracker 的**每一条流**都拨回了 forward 开始时的状态，重跑完再由 `_fork_rng` 放回 backward
#    开始时的状态，对后面的训练不留痕迹（折叠的表）。
# 2. **PyTorch 的重算输出相同、梯度不同**：它只恢复默认生成器，tracker 的 `model-parallel-rng` 在第一遍 forward 里已经前进过，
#    重算时 attention dropout 抽到另一个 mask，backward 用的是另一张图。输出没错（forward 只真跑了一次），错的是梯度，
#    而且不报错。这就是 Megatron 自己写一份 checkpoint 的原因之一（类的 docstring 列的两处改动之二）。
# 3. **省下的内存**：不重算要一直留着整层的激活；重算只留输入 `x`（`[8, 2, 16]` fp32 = 1024 字节），
#    `distribute_saved_activations` 再把它分给两个 TP rank。代价是 backward 里重算那一层时又临时存了同样多，算完即释放。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(draw_saved_bytes(recompute.rows, title="重算一层：forward 之后只留输入 1024 字节（不重算 13632），"
                                               "backward 里临时存回一层的量"))
Table(["方式", "backward 前后默认生成器不变", "backward 前后 `model-parallel-rng` 不变"],
      [[MODE_NAMES[m], *results[0]["recompute"][m]["generators_kept"]] for m in MODES])

# %% [markdown]
# ### full 重算：`uniform` 与 `block` 各包哪几层
#
# `recompute_granularity='full'` 时 `TransformerBlock.forward` 改走
# [`recompute.py::checkpointed_forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L21)
# （[`transformer_block.py:624`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L624)），
# 它不一定"每层一次"：`recompute_method` 和 `recompute_num_layers`（N）决定一次 checkpoint 包几层、包哪些层。
# 4 层的 `TransformerBlock`，每层挂一个 forward 前的 hook，看 backward 里哪些层按什么顺序重跑：

# %%
def full_recompute(dims, method, n):
    parallel_state.initialize_model_parallel()
    kwargs = {**dims.transformer_config_kwargs(), "num_layers": 4}
    config = TransformerConfig(**kwargs, recompute_granularity="full", recompute_method=method,
                               recompute_num_layers=n, use_cpu_initialization=True)
    reseed()
    block = TransformerBlock(config, get_gpt_layer_local_spec(normalization=kwargs["normalization"]),
                             post_layer_norm=False)
    runs = []
    for layer in block.layers:
        layer.register_forward_pre_hook(lambda module, args: runs.append(module.layer_number))
    x = torch.randn(dims.seq, dims.micro_batch_size, dims.hidden, requires_grad=True)
    causal = torch.triu(torch.ones(1, 1, dims.seq, dims.seq, dtype=torch.bool), diagonal=1)
    block(x, attention_mask=causal).sum().backward()
    return [method, n, runs[:4], runs[4:]]


Table(["recompute_method", "recompute_num_layers", "forward 里跑的层", "backward 里重跑的层（按顺序）"],
      [run_ranks(full_recompute, 1, TINY, method, n)[0]
       for method, n in (("uniform", 1), ("uniform", 2), ("block", 1), ("block", 2))])

# %% [markdown]
# - **`uniform`**：从第一层起每 N 层一段，每段一次 `tensor_parallel.checkpoint`
#   （[`recompute.py:157-166`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L157-L166)），
#   只存每段的输入。N=2 时 backward 先把第 3、4 层作为一段按 forward 的顺序重跑，再重跑 1、2：段越长，存的输入越少，
#   backward 里临时存回的激活越多（一段 N 层）。
# - **`block`**：只有前 N 层各自一次 checkpoint，其余层照常存激活、不重算
#   （[`recompute.py:167-181`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L167-L181)）。
#   N 按显存余量定：只重算放不下的那几层，其余层不付重算的算力。
# - 开 fp8 / fp4 时每一段改用 TE 的 `te_checkpoint`
#   （[`recompute.py:133-140`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L133-L140)），
#   否则是 `tensor_parallel.checkpoint`（[`recompute.py:142`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/recompute.py#L142)）。
#
# ### `CheckpointWithoutOutput`：连输出也不留
#
# `checkpoint` 至少要留下输入，而它的**输出**往往还被后一个算子存着（norm 的输出被 attention 的 QKV 线性层存下）。
# selective `layernorm` 重算用 `CheckpointWithoutOutput`：norm 在 `no_grad` 里跑、只存输入；后一个算子照常存下 norm 输出的
# 引用；之后 `discard_output_and_register_recompute` 把 norm 输出的**存储** `resize_(0)`，形状等元数据还在；backward 走到
# 后一个算子的输出梯度时，hook 触发 `_recompute`：拨回 RNG、重跑 norm，让 norm 输出那个张量的存储直接指向重算结果的数据
# （[`random.py:821`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L821)）。
# 一个 LayerNorm 接一个矩阵乘，看 norm 输出的存储在三个时刻有多大：

# %%
def discard_and_recompute(recompute):
    torch.manual_seed(0)
    x, w, norm = torch.randn(8, 2, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True), torch.nn.LayerNorm(16)
    if recompute:
        ckpt = CheckpointWithoutOutput(fp8=None)
        h = ckpt.checkpoint(norm, x)                     # no_grad 里跑 norm，只存 x
    else:
        h = norm(x)
    y = h @ w                                            # 矩阵乘存下 h 的引用
    sizes = [h.untyped_storage().nbytes()]
    if recompute:
        ckpt.discard_output_and_register_recompute(y)    # h 的存储 resize_(0)，hook 挂在 y 上
    sizes.append(h.untyped_storage().nbytes())
    y.pow(2).sum().backward()                            # y 的梯度到了：先重算 norm，再算矩阵乘的 backward
    sizes.append(h.untyped_storage().nbytes())
    return sizes, [x.grad, w.grad, norm.weight.grad]


(plain, plain_grads), (ckpt, ckpt_grads) = [run_ranks(discard_and_recompute, 1, flag)[0] for flag in (False, True)]
print("h 的存储（字节）forward 后 / discard 后 / backward 后 —— 不重算:", plain, " CheckpointWithoutOutput:", ckpt)
print("梯度逐位相同:", all(torch.equal(a, b) for a, b in zip(plain_grads, ckpt_grads)))

# %% [markdown]
# 在真实层里照 [`transformer_layer.py:619`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L619)
# 到 [`transformer_layer.py:670`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L670)
# 的写法对 `input_layernorm` → `self_attention` 跑一遍（同样传 `fp8=None`，原因见下一节）：forward 之后保存的激活少了 1152 字节
# （norm 输出 1024，加上 norm 自己为 backward 存的统计量：它在 `no_grad` 里跑，什么也不存），输出与所有梯度逐位相同。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
without_output_table(results[0]["without_output"])

# %% [markdown]
# "让存储指向重算结果"不是 torch 的公开操作：`random.py` 带着一段十几行的 C++ 源码
# （[`random.py:41`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L41)），在存储这一层换掉数据指针，
# 共用这块存储的视图都看得到新数据，也不碰版本计数。它在第一次重算时才用 `load_inline` 编译
# （[`random.py:69-79`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L69-L79)；见遗留问题）。
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
# `self.fp8` 为真时，forward 问 TE 的 `FP8GlobalStateManager` FP8 是否打开
# （[`random.py:693`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L693)），
# 并进入 TE 的 `activation_recompute_forward` 上下文；重算时再进一次（`recompute_phase=True`）。`transformer_layer.py` 的两处
# （两个 norm）和 `moe/experts.py` 的一处（`TEGroupedMLP` 的 `moe_act`）都不带参数，所以装了 TE 的机器上它们**总是**走 TE 的
# 这条路，哪怕没开 FP8：TE 靠这个上下文区分"第一次 forward"和"重算"，FP8 下才不会把 amax 历史记两遍。没有 TE 时这些名字没有
# 定义，缺省构造的对象一 `checkpoint` 就是 `NameError`，真实的 `TransformerLayer` 开 selective `layernorm` 重算时也一样。
#
# 这不是笔误：core_v0.19.0 里这一行原样不动，之后主干在 `__init__` 的 docstring 里写明：缺省值就会得到 True，好几个 selective
# 重算模块的 FP8 amax 记账依赖它，不要改成 `bool(fp8)`（[PR #4531](https://github.com/NVIDIA/Megatron-LM/pull/4531)，
# 合入主干的提交 `7cdba422b8`；core_v0.19.0 还不含它）。

# %% [markdown]
# ## 与训练主链路的关系
#
# - **初始化**：`initialize_megatron` → `_set_random_seed`，每个 PP stage 一个种子。此后不再重设；存 checkpoint 时
#   [`checkpointing.py::get_rng_state`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L398)
#   把 CPU、CUDA 生成器和 tracker 的 `get_states()` 一起存下，恢复训练时放回（[笔记 07](../07_checkpointing/)）。
# - **每个 micro-batch 的 forward**：每层的 attention dropout 在 `fork()` 里，hidden dropout 在外面；SP 时整个 block 在 `fork()` 里。
# - **重算**：`--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N` 走上面的
#   `checkpointed_forward`；`selective` 加 `--recompute-modules`（缺省 `core_attn`，还有 `layernorm`、`mlp`、`moe_act` 等）只重算层里的
#   一部分：`core_attn`、`mlp` 走 `tensor_parallel.checkpoint`，`layernorm`、`moe_act` 走 `CheckpointWithoutOutput`。重算发生在
#   `backward_step` 里，1F1B（[笔记 13](../13_pipeline_schedules/)）决定每个 stage 同时留着几个 micro-batch 的输入。

# %% [markdown]
# ## 与基础知识的连接
#
# - **PyTorch 的生成器**：一个 `torch.Generator` 的全部状态就是一个 ByteTensor，"保存 / 恢复一条流"只是拷一个张量；tracker 就是装这些张量的字典。
# - **activation checkpointing**（Chen et al. 2016）：用算力换内存，forward 只留段边界的张量，backward 时按段重算。
#   `torch.utils.checkpoint` 的 `preserve_rng_state=True` 只覆盖默认生成器，这正是上面梯度出错的原因。
# - **saved tensors hooks**：`torch.autograd.graph.saved_tensors_hooks(pack, unpack)` 在 autograd 存、取每个张量时回调，
#   是量"为 backward 存了多少"最直接的办法，也是 CPU offload 一类方法的基础。
# - **dropout 的独立性**：模型并行下"逐元素独立"要在全局张量上成立，而不是在每张卡的切片上各自成立。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **没有 TE 时 selective `layernorm` / `moe_act` 重算跑不起来。** 缺省的 `CheckpointWithoutOutput()` 的 `self.fp8` 为真，
#    直接用 TE 的名字，上面的运行是 `NameError`。这是有意保留的行为；没有 TE 只能像本篇这样自己传 `fp8=None`。
# 2. **第一次重算要编译 C++。** `CheckpointWithoutOutput` 第一次重算时现场编译 `share_storage_ext`：要有 C++ 编译器和 ninja，
#    本机第一次约 25–30 秒，结果缓存在 `~/.cache/torch_extensions/`。用它的训练（selective `layernorm` / `moe_act`）第一次
#    backward 会停顿半分钟左右；没有编译器时它在 backward 的 hook 里报错；venv 路径里有空格时链接失败（torch 传给链接器的
#    `-L` 路径没加引号）。这些是在本机编译时看到的，本页不再编译（见下面的折叠部分）。
# 3. **`distribute_saved_activations` 与 saved tensors hooks 不相容，且只在不开 SP 时可用。** 它在 backward 里直接替换存下的输入
#    张量的 `.data`，要求 autograd 交回原来那个对象；挂了 `saved_tensors_hooks`（CPU offload 一类工具）交回的是另一个对象，
#    backward 里形状对不上（试过：`RuntimeError`，128 对 16）。开 SP 时 `TransformerConfig` 直接拒绝它。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **CPU 生成器扮演 GPU 的两个生成器。** GPU 上有 CPU 生成器（`torch.manual_seed`；`use_cpu_initialization` 的权重从它抽）和
#   CUDA 生成器（dropout、GPU 上的初始化），tracker 的流全是 CUDA 状态。CPU 上只有一个默认生成器，`snippets/cpu/rng.py` 的
#   `rng_tracker` 补丁（[在 CPU 上运行](../../cpu/)）这样安排：`add` 在专用的 `torch.Generator`（`snippets.cpu.rng.STREAMS`）里
#   播种、读状态，不碰默认生成器；`fork()` 把流**借给**默认生成器，退出时由 Megatron 自己的保存 / 还原代码换回；
#   [`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)
#   那一步（把设备默认生成器设成 `seed`）不做，否则会重设用户的 `torch.manual_seed`，所以实验像正式入口一样两个都设（`reseed`）。
#   `_get_all_rng_states` 取到的"CPU 状态"和"CUDA 状态"是同一个生成器的两份拷贝，恢复时设了两遍，结果与 GPU 上一样；
#   `torch.utils.checkpoint` 的梯度错误在 GPU 上同样出现（它恢复的也只是两个默认生成器）。
# - **种子与"谁和谁相同"与 GPU 一致，抽出的具体 mask 不同**：流不是 CUDA 的 Philox 状态。`use_cudagraphable_rng=True`（graph-safe
#   的状态）CPU 层直接拒绝。
# - **正式入口在没有 GPU 时不调用 `model_parallel_cuda_manual_seed`**（`_set_random_seed` 里有 `torch.cuda.device_count() > 0`
#   的判断），所以上面 `_set_random_seed` 的那次运行只读 `torch.manual_seed` 设下的种子；本篇其余的实验直接调用
#   `model_parallel_cuda_manual_seed`，因为 CPU 层让它在 CPU 上也有意义。
# - **不编译 C++ 扩展**：CPU 层把 `_recompute` 里"让存储指向重算结果"换成把重算结果拷进原输出那块 storage（同一块
#   StorageImpl，视图看到的值相同，也不动版本计数），"逐位相同"的结论不变；GPU 上跑的是 Megatron 原样的零拷贝。
#
# </details>

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
# TP-split activations runs inside `tracker.fork()`, so each TP rank draws its own mask; dropout on replicated
# activations uses the default generator, identical on all TP ranks. DP replicas get the same seed by default (only
# the PP stage changes it), so their initial weights agree without a broadcast. Activation recompute (`checkpoint`,
# `CheckpointWithoutOutput`) keeps only inputs and restores every generator *and* the tracker's streams before
# re-running, so gradients are bit-identical; `torch.utils.checkpoint` misses the tracker and silently changes them.
# Full recompute checkpoints chunks of N layers (`uniform`) or only the first N layers (`block`).
