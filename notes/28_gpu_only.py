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
# # 28 只在 GPU 上跑的：通信重叠、FP8、CUDA graph，以及任务卡住时
#
# 前面的笔记把 TP、PP、DP、EP 的每一次通信都在 CPU 上跑了出来。面试官接下来会问：真机上 Megatron 靠什么变快？TP 的通信藏在哪个
# GEMM 后面，FP8 的 scale 从哪来、amax 在哪个群上归约，MoE 的 all-to-all 怎样和另一个 micro-batch 的计算叠在一起，CUDA graph
# 捕获了什么、又禁止了什么？还有每个工程师都会遇到的：任务卡住不动了，怎样找到是哪个 rank、哪个 collective？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出 `tp_comm_overlap` 在一层里把哪次 all-gather / reduce-scatter 和哪个 GEMM 叠在一起，TE 默认用哪种方法。
# 2. 说出 FP8 的 delayed 与 current scaling 怎样算 scale，amax 在哪个群上归约，梯度用什么精度归约。
# 3. 说出 `combined_1f1b` 每一步发出的节点顺序，它要求哪些开关；CUDA graph 捕获什么、和哪些开关冲突；0.19.0 有没有 zero-bubble。
# 4. 任务卡住或 loss 变 NaN 时，用哪些开关和工具找到出事的 rank 和 collective。
#
# **结论**
#
# - TP=2 + SP 时一层的 forward + backward 有 10 次 collective，每次都有一个 GEMM 可藏：TE 默认 4 次 ring_exchange、2 次 pipeline、4 次 bulk。
# - delayed scaling 用上一步的 amax：第 3 步激活放大 8 倍时 4096 个值里 2655 个被截到 448；current scaling 一个也不截。
# - amax 在 TP×DP×CP 群上归约：4 个 rank、TP=2 时是 [0, 1, 2, 3]，`tp_only_amax_red` 时 [0, 1]；梯度照旧以 bf16/fp32 归约。
# - `combined_1f1b` 换上假 stream 后在 CPU 上真跑：稳态一次调用 21 个节点、12 次 all-to-all，梯度与普通 1F1B 差 0。
# - CUDA graph 的 5 组配置里 `TransformerConfig` 拒绝 4 组；0.19.0 的 schedule 只有 3 个，没有 zero-bubble / DualPipe。
# - rank 1 漏发一次 `all_reduce`：rank 0 拿到错的 31 且不报错，第 3 次才在 2 s 上限超时；loss 出 NaN 时全部 rank 重跑该步，以 exit code 16 退出。
#
# 先读：[笔记 11](../11_transformer_layer/)（SP 的 all-gather / reduce-scatter）、[笔记 13](../13_pipeline_schedules/)（1F1B）、[笔记 17](../17_moe_expert_parallel/)（all-to-all）；数字见[笔记 26](../26_cost/)；约 20 分钟。

# %% tags=["hide-input"]
import pathlib

import torch
from IPython.display import display

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments import n28_gpu_only as gpu
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table

import megatron.core
from megatron.core.enums import Fp8Recipe
from megatron.core.fp4_utils import get_fp4_context, get_fp4_recipe
from megatron.core.fp8_utils import get_fp8_context, get_fp8_recipe
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer import TransformerConfig

TINY, PAR = EXPERIMENTS["gpu-only"].tiny, Parallel(world=4, tp=2)
results = run_ranks(gpu.run, 4, TINY, PAR)  # TP=2 × DP=2 一层；然后 EP=2 的 MoE 模型
(tp_line, overlap, amax, error_line, ran_line, order, same_line) = gpu.tables(results, TINY, PAR)
ops = results[0]["combined"]["ops"]
gpu.draw_combined(ops, title="EP 重叠：combined_1f1b 把 micro-batch 1 的 forward 和 0 的 backward 逐层交错，"
                             "all-to-all 走通信流")

# %% [markdown]
# 一个 2 层、每层 4 个专家的 MoE 模型，EP=2，3 个 micro-batch。这是第二次调用（稳态）在 CPU 上记录的执行顺序：每个浅色带是一次逐层调度，
# 把 micro-batch 1 的某一层 forward 和 micro-batch 0 的另一层 backward 配成一对；上一行的 dispatch / combine 在 GPU 上走单独的通信流，
# 正好落在下一行另一个 micro-batch 的 attention 或专家计算旁边。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 主实验是 `snippets/experiments/n28_gpu_only.py` 的 `run`，一次启动 4 个 gloo rank：先以 TP=2 建笔记 11 的那一层（local spec，开 SP），
#   记录 forward + backward 的每次 collective 和发出它的子模块，再按 TE 的 userbuffer 名字配对；读出 FP8 的 amax 归约群；
#   然后重新初始化成 EP=2，建 bf16 的 MoE `GPTModel`（RoPE、4 个专家、top-2、alltoall），走 `get_forward_backward_func()`。
# - `combined_1f1b` 第一行就建 CUDA stream。`gpu.cpu_streams()` 只在它运行时把 schedule 的 4 个模块里的 `torch.cuda.Stream` /
#   `current_stream` / `Event` / `stream()` 换成只带名字的替身、让 `Tensor.record_stream` 什么都不做；`gpu.record_nodes()`
#   包住 `ScheduleNode.forward/backward`、`TransformerLayerSchedulePlan.run` 和 `combined_forward_backward_step`，记下节点顺序。
#   模型、all-to-all、autograd 都是真的。
# - FP8 的算术（`gpu.delayed_scaling`、`gpu.current_scaling`、`gpu.block_quantize`）在笔记进程里用 torch 的 float8 dtype 跑，
#   TE 的 cast 会饱和到格式最大值，所以先 clamp 再转。`tests/experiments/test_n28_gpu_only.py` 把 TE 自己的
#   `_default_get_amax_and_update_history` 和 `_default_sf_compute`（提交 `d0067d0` 的源码，在 CPU 上用 torch 执行）逐步对照，scale 相同。
# - 卡住和 NaN 的例子在 `snippets/experiments/n28_hang.py`：两个 gloo rank，每个例子一个 timeout 2 秒的新群，那次启动的上限 12 秒；
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL` 在 rank 里设好再调 `dist.set_debug_level_from_env()`；flight recorder 由私有的
#   `torch._C._distributed_c10d._dump_fr_trace()` 取出；`n28_hang.normalize` 把地址、端口、PID、路径、测得的时长换成占位符，本页设的上限保留。
#   `RerunStateMachine` 只把 `_reduce_any` 里 `device='cuda'` 的那个张量换到 CPU（`n28_hang.allow_reduce_on_cpu`），尖峰例子用 5 个样本定最大值（Megatron 默认 100）。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 gpu-only --dims tiny --tp 2` 打印本页前半的表，`... -m snippets.run --nproc-per-node 2 hang` 打印卡住和 NaN 的表；
#   `scripts/execute_notes.sh notes/28_gpu_only.py` 重新执行整页。CPU 上的通用改动见 [CPU 补丁一览](../../cpu/)。
#
# </details>

# %% tags=["hide-input"]
listing(gpu.run, gpu.combined_run, gpu.cpu_streams)

# %% [markdown]
# ## 源码位置
#
# | 开关或符号（固定到 tag 的行） | 机制 | 本页 |
# |---|---|---|
# | [`model_parallel_config.py:265`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L265) | `tp_comm_overlap`：TP 通信与 GEMM 重叠 | 跑：一层要配对的 10 次通信；TE 内部读代码 |
# | [`initialize.py::_initialize_tp_communicators`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L187) | 建 TE 的 userbuffer | 读代码，未在 CPU 上运行 |
# | [`fp8_utils.py::get_fp8_context`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp8_utils.py#L774) | 选 recipe、取 amax 归约群 | 跑：无 TE 时给空 context；群在 rank 上读出 |
# | [`parallel_state.py::get_amax_reduction_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1877) | amax 归约群 | 跑 |
# | [`combined_1f1b.py::combined_1f1b_schedule_for_no_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/combined_1f1b.py#L35) | `overlap_moe_expert_parallel_comm` 的调度 | 跑（替身 stream） |
# | [`model_chunk_schedule_plan.py::TransformerLayerSchedulePlan.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/model_chunk_schedule_plan.py#L236) | 一层 forward 配一层 backward | 跑 |
# | [`cuda_graphs.py::CudaGraphManager`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/cuda_graphs.py#L1763) | `cuda_graph_impl="local"` 的逐层捕获 | 跑：配置检查；捕获读代码 |
# | [`schedules.py::get_forward_backward_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L48) | 三个 schedule，没有 zero-bubble | 跑 |
# | [`initialize.py:340`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L340) | `--distributed-timeout-minutes` → 进程群的 `timeout` | 跑：torch 群的 timeout（2 秒）；Megatron 这一行读代码 |
# | [`rerun_state_machine.py::RerunStateMachine.validate_result`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L464) | loss 的 NaN / Inf / 尖峰检查 | 跑：注入 NaN |
# | [`utils.py::StragglerDetector`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1445) | 找慢的 rank | 读代码，未在 CPU 上运行 |
#
# <details><summary>其余符号</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`transformer_engine.py::TELinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L855) | 把 `tp_comm_overlap_ag/rs` 译成 TE 的 `ub_overlap_ag/rs`（:923 起），专家层关掉 |
# | [`transformer_engine.py::TELayerNormColumnParallelLinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1122) | 再加 `ub_bulk_dgrad/wgrad`、`ub_overlap_rs_dgrad`（:1198 起） |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L525) | local 层自己的重叠：backward 的 all-gather / reduce-scatter 用 `async_op=True` |
# | [`fp8_utils.py::get_fp8_recipe`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp8_utils.py#L714) | `fp8_recipe` → TE 的四种内置 recipe（另有 `custom`） |
# | [`transformer_engine.py::TEDelayedScaling`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L3220) | 把 `fp8_margin`、`fp8_amax_history_len`、`fp8_amax_compute_algo` 交给 TE |
# | [`param_and_grad_buffer.py::group_params_for_buffers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L882) | 梯度缓冲区 dtype：fp32 或参数的高精度 dtype，FP8 参数按 uint8 存 |
# | [`fp4_utils.py::get_fp4_context`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp4_utils.py#L247) | NVFP4，同一个 amax 群 |
# | [`combined_1f1b.py::combined_forward_backward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/combined_1f1b.py#L281) | 合并一个 forward 和一个 backward |
# | [`model_chunk_schedule_plan.py::TransformerModelChunkSchedulePlan.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/model_chunk_schedule_plan.py#L500) | 整个 model chunk 的逐层配对 |
# | [`utils.py::set_streams`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/utils.py#L381) | 建通信流（CPU 上在这里停下） |
# | [`gpt_model.py::GPTModel.build_schedule_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L798) | 把模型拆成节点 |
# | [`utils.py::TransformerLayerNode.backward_dw`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/utils.py#L323) | `delay_wgrad_compute` 推迟的 wgrad |
# | [`cuda_graphs.py::TECudaGraphHelper`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/cuda_graphs.py#L2086) | `cuda_graph_impl="transformer_engine"`：TE 的 `make_graphed_callables` |
# | [`full_cuda_graph.py::FullCudaGraphWrapper`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/full_cuda_graph.py#L138) | `cuda_graph_impl="full_iteration"`：整个 forward-backward |
# | [`enums.py::CudaGraphModule`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/enums.py#L61) | 可捕获的区域：attn、mlp、moe、moe_router、moe_preprocess、mamba |
# | [`initialize.py:298`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L298) | `--flight-recorder-dump-path`：建群前设好 flight recorder 的环境变量 |
# | [`training.py:2358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2358) | `train_step` 里 `should_run_forward_backward` 的循环（:2458 问要不要存档退出） |
# | [`rerun_state_machine.py::RerunErrorInjector`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L1267) | `--error-injection-rate` / `--error-injection-type` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 四个机制都挂在你已经认识的路径上：TP 重叠换掉笔记 10 的线性层实现，FP8 包住每层的 forward，EP 重叠换掉笔记 13 的
# `forward_backward_no_pipelining` 里面的循环，CUDA graph 包住一层或整个 step。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/initialize.py::initialize_megatron
# └─ tp_comm_overlap ? _initialize_tp_communicators()            # TE initialize_ub：每个 GEMM 名字一块 userbuffer
# megatron/core/pipeline_parallel/schedules.py::get_forward_backward_func     # 只有三个 schedule
# └─ forward_backward_no_pipelining
#    └─ overlap_moe_expert_parallel_comm ? combined_1f1b_schedule_for_no_pipelining
#       ├─ set_streams()                                        # 新建通信流（CPU 上到此为止）
#       └─ combined_forward_backward_step(f_model, b_model)     # 第 1 次只有 F，最后一次只有 B
#          ├─ forward_step_func(..., return_schedule_plan=True) → GPTModel.build_schedule_plan
#          └─ TransformerModelChunkSchedulePlan.run(f_plan, b_plan)
#             └─ 每层 TransformerLayerSchedulePlan.run(f_layer, b_layer)
#                ├─ B combine（通信流, all-to-all）→ F attn+路由（计算流）
#                ├─ B 专家 → F dispatch（通信流, all-to-all）→ B dispatch（通信流）
#                └─ F 专家 → F combine（通信流）→ B attn+路由 → B wgrad（delay_wgrad_compute 时）
# TransformerLayer.forward → 每个线性层
# ├─ fp8 ? get_fp8_context(config, layer_no) → te.fp8_autocast(recipe, fp8_group=get_amax_reduction_group(...))
# └─ TE 线性层 (ub_overlap_ag / ub_overlap_rs / ub_bulk_*)        # tp_comm_overlap 时
# TransformerLayer.__call__
# └─ cuda_graph_impl == "local" ? CudaGraphManager                 # 逐层捕获；"transformer_engine" 由 TECudaGraphHelper 统一捕获
# megatron/training/initialize.py::_initialize_distributed
# └─ init_process_group(timeout=distributed_timeout_minutes)       # 之前按 --flight-recorder-dump-path 设好环境变量
# megatron/training/training.py::train_step
# ├─ while rerun_state_machine.should_run_forward_backward(...)     # 要重跑时同一步再来一次（所有 rank）
# │  └─ forward_backward_func → pretrain_gpt.py::loss_func
# │     └─ validate_result(loss, isnan / isinf / is_unexpectedly_large)
# └─ should_checkpoint_and_exit() → 存档，sys.exit(16 或 17)
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# TP 线性层的记录在[笔记 10](../10_column_row_parallel_linear/)，1F1B 的在[笔记 13](../13_pipeline_schedules/)，all-to-all 的在[笔记 17](../17_moe_expert_parallel/)。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | 切分? | 改训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `_initialize_tp_communicators` | args（seq、mbs、cp、hidden、TP、fp8） | 无（TE 全局 userbuffer） | TE `initialize_ub` | TP 群 | 无 | 分配通信缓冲区 | 无；正式入口初始化时 |
# | `get_fp8_context` | config、全局层号 | `fp8_autocast` 或空 context | `get_fp8_recipe`、`get_amax_reduction_group` | TP×DP×CP 或 TP×CP | 否 | TE 的 amax 历史与 scale | 每层 forward |
# | `combined_1f1b_schedule_for_no_pipelining` | forward_step_func、数据、模型、m | loss 列表、token 数 | `combined_forward_backward_step` | EP 群（all-to-all） | 按 micro-batch | 累加梯度 | `get_forward_backward_func()(...)` |
# | `TransformerLayerSchedulePlan.run` | F 层、B 层、输入、梯度 | 下一层的输入和梯度 | 5 个节点的 forward / backward | EP 群 | 否 | 累加梯度 | 同上 |
# | `CudaGraphManager.__call__` | 一层的输入 | 同一层的输出 | `_CudaGraphRunner` | 否 | 否 | 捕获后的静态缓冲区 | 每层 forward |
# | `get_forward_backward_func` | PP、VP 大小 | schedule 函数 | 无 | 否 | 否 | 否 | 训练步开头 |
# | `RerunStateMachine.validate_result` | 本 rank 的 loss、检查函数、fatal | 无（记下要不要重跑） | `_reduce_any` | 全部 rank 的 all-reduce | 否 | 状态机的状态 | `loss_func` 里 |
# | `RerunStateMachine.should_checkpoint_and_exit` | 无 | (存档?, 退出?, exit code) | `_reduce_any` | 同上 | 否 | 决定存档 / 退出 | 每步之后 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### TP 通信重叠：一层里要配对的 10 次通信
#
# `tp_comm_overlap` 是一个 config 开关；all-gather 和 reduce-scatter 重叠的几个子开关默认就是 True，只在 `tp_comm_overlap=True` 时起作用：

# %%
layer = dict(num_layers=1, hidden_size=16, num_attention_heads=4, tensor_model_parallel_size=2)
overlap_cfg = TransformerConfig(**layer, sequence_parallel=True, tp_comm_overlap=True)
print({k: getattr(overlap_cfg, k) for k in ("tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad",
                                            "tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad")})
no_sp = TransformerConfig(**layer, sequence_parallel=False, tp_comm_overlap=True)  # 见遗留问题
print("不开 SP 也被接受：tp_comm_overlap =", no_sp.tp_comm_overlap)

# %% [markdown]
# 真正做重叠的是 Transformer Engine 的线性层：[`TELinear`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L855)
# 把这几个开关译成 `ub_overlap_ag` / `ub_overlap_rs`，每个线性层带一个名字（`qkv`、`proj`、`fc1`、`fc2`；专家层一律不重叠）。别的名字（如 MLA 的 `q_down_proj`）让 `TELinear` 把**共用的** config 的 `tp_comm_overlap` 改成 False，警告说只关这一层，实际之后建的层都不重叠了（见遗留问题）。
# TE spec 里 QKV 和 fc1 是 `TELayerNormColumnParallelLinear`（LayerNorm 融进 GEMM，all-gather 接在 LayerNorm 之后），proj 和 fc2 是 `TERowParallelLinear`。
# 训练入口在初始化时调 [`_initialize_tp_communicators`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L187)，
# 让 TE 按 (seq × micro-batch / CP, hidden) 为每个 GEMM 建一块 userbuffer。TE 不在这台机器上，但它要重叠的通信，local 层一次不少地发出来了。
# 下面是笔记 11 那一层（TP=2、SP）记录的全部通信，右边三列按 TE [`initialize_ub`](https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/pytorch/module/base.py#L350)
# 的默认表配上它会藏到哪个 GEMM 后面：

# %% tags=["hide-input"]
print(tp_line)
overlap

# %% [markdown]
# 读这张表要看三件事。
#
# **每次通信都有一个 GEMM 可以藏。** forward 里 QKV 和 fc1 之前的 all-gather 喂给紧随其后的 GEMM：TE 用 **ring_exchange**，
# 把 all-gather 拆成 TP 步点对点传递，每到一块就先算这一块的 GEMM，算完时最后一块也到了。proj 和 fc2 之后的 reduce-scatter 用
# **pipeline**：GEMM 按行切成几段（默认 4 段），算完一段就把这段的部分和送出去。
#
# **backward 多出来的通信，local 层自己就叠着。** 列并行层的 backward 要再 all-gather 一次输入（算 weight 梯度用），还要把输入梯度
# reduce-scatter 回 s/t。[`LinearWithGradAccumulationAndAsyncCommunication`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L525)
# 在 [`layers.py:617`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L617) 以 `async_op=True`
# 发出 all-gather，接着算 dgrad GEMM，在 [`layers.py:650`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L650)
# 异步发出 reduce-scatter，再算 wgrad GEMM。这就是 TE 叫 **bulk** 的那四行：整块通信放在一个互不依赖的 GEMM 旁边。local 层靠
# `CUDA_DEVICE_MAX_CONNECTIONS=1` 保证通信先于 GEMM 发出；TE 则在自己的 userbuffer 上用拷贝引擎或几个专用 SM、在另一条 stream 上通信。
#
# **前提是 SP。** 不开 SP 时 TP 的通信是 all-reduce，没有“先收齐一半再算”的结构可拆；训练入口在
# [`arguments.py:1401`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1401) 断言
# `tp_comm_overlap` 必须配 SP。但 core 的 `TransformerConfig` 不查这一点（见遗留问题）。
#
# ### FP8：scale 从哪来
#
# FP8 也是 config 开关。`fp8` 选格式（`e4m3` 或 `hybrid`：forward 用 E4M3、最大 448，backward 的梯度用 E5M2、最大 57344），
# `fp8_recipe` 选缩放方式。没有 TE 时 Megatron 的两个入口什么也不做：

# %%
fp8_cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, fp8="hybrid", fp8_recipe="delayed")
fp4_cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, fp4="e2m1")
print("amax 历史长度", fp8_cfg.fp8_amax_history_len, "| 取法", fp8_cfg.fp8_amax_compute_algo, "| margin", fp8_cfg.fp8_margin,
      "| fp4_recipe", fp4_cfg.fp4_recipe)
print("无 TE：get_fp8_recipe →", get_fp8_recipe(fp8_cfg), "| get_fp8_context →", type(get_fp8_context(fp8_cfg)).__name__,
      "| get_fp4_recipe →", get_fp4_recipe(fp4_cfg), "| get_fp4_context →", type(get_fp4_context(fp4_cfg)).__name__)
print("fp8_recipe 可选：", [r.value for r in Fp8Recipe])
print("torch 的 float8：E4M3 最大", torch.finfo(torch.float8_e4m3fn).max, "| E5M2 最大", torch.finfo(torch.float8_e5m2).max)

# %% [markdown]
# 有 TE 时 [`get_fp8_recipe`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp8_utils.py#L714) 把前四个名字映射到 TE 的内置 recipe（`custom` 载入 `fp8_quantizer_factory` 给的 recipe）：
# `delayed` → `DelayedScaling`（Megatron 的 [`TEDelayedScaling`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L3220)
# 把上面三个数交给它）、`tensorwise` → `Float8CurrentScaling`、`blockwise` → `Float8BlockScaling`、`mxfp8` → `MXFP8BlockScaling`。
# scale 的公式在 TE 的 [`_default_sf_compute`](https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/pytorch/quantization.py#L1092)：
# scale = fp8_max / amax / 2^margin，amax 为 0 或非有限时沿用旧 scale。区别只在 amax 是谁的：
#
# - **delayed**：用历史窗口里的 amax（`most_recent` 取上一步，`max` 取窗口最大值），本步的 amax 算完才进历史；省掉一次“先扫一遍求 amax”的同步。
# - **tensorwise（current）**：先求本 tensor 的 amax 再 cast，多一次归约，但不会被突变打穿。
# - **blockwise / MXFP8**：每 128 个（blockwise，权重是 128×128）或每 32 个（MXFP8，scale 是 E8M0）值一个 scale，都取 2 的幂。
#
# 被量化的只是线性层 GEMM 的两个输入：forward 的激活和权重，backward 的梯度。LayerNorm、softmax、残差和 loss 都留在 bf16/fp32；
# `fp8_wgrad=False` 让 wgrad GEMM 也留在高精度，注意力要另开 `fp8_dot_product_attention`。
#
# 用 torch 的 float8 dtype 把这几条公式跑一遍（4096 个 N(0,1) 的 bf16 激活，第 3 步整体放大 8 倍）：

# %% tags=["hide-input"]
steps = [gpu.activations(s) * (8.0 if s == 3 else 1.0) for s in range(6)]
runs = {"delayed（Megatron 默认：历史 1、most_recent）": gpu.delayed_scaling(steps, 1, "most_recent"),
        "delayed（历史 16、max）": gpu.delayed_scaling(steps, 16, "max"),
        "tensorwise（current）": gpu.current_scaling(steps)}
Table(["recipe", "步", "scale", "被截到 ±448 的值", "相对误差"],
      [[name, i, round(r["scale"], 2), r["clipped"], round(r["error"], 4)]
       for name, rs in runs.items() for i, r in enumerate(rs) if i >= 2])

# %% [markdown]
# delayed scaling 在第 3 步用的是第 2 步的 scale（约 121），放大 8 倍的值乘上它远超 448，2655 个被截断，误差从 0.027 跳到 0.67；
# 下一步 scale 才追上。`max` 窗口（长 16）让 scale 在突变后一直保持小值（表里第 4、5 步仍是 14.57），对突变更稳，代价是之后的小值用不满 FP8 的范围。
# current scaling 每步现算，永远不截。FP8 的相对误差约 2.7%（E4M3 只有 3 位尾数）与 scale 无关，只有截断和下溢才让它变坏。
# 一个离群值就会造成下溢：

# %% tags=["hide-input"]
outlier = gpu.outlier_errors(gpu.activations(0, outlier=1e5))
outlier_scale = gpu.outlier_scales(gpu.activations(0, outlier=1e5))
Table(["scale 的粒度（一个值是其余的约 10⁵ 倍）", "离群值那一份的 scale", "其余 4095 个值的相对误差"],
      [[k, round(outlier_scale[k], 4), round(v, 4)] for k, v in outlier.items()])

# %% [markdown]
# 整个 tensor 共用一个 scale 时，离群值把 scale 压到 0.0045，其余的值落进 E4M3 的次正规数区，误差 0.1255；每 32 个值一个 scale
# 时只有离群值所在的那一块受累。这就是 MXFP8 和 blockwise 存在的理由，也是 Blackwell 上 MXFP8 由硬件支持的原因。
#
# ## Tensor / Process Group 语义
#
# ### amax 在哪个群上归约
#
# 同一个权重在 TP 的各个 rank 上是不同的切片，在 DP 的各个 rank 上是同一份；为了让所有副本用同一个 scale，
# [`get_fp8_context`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp8_utils.py#L774) 把
# [`get_amax_reduction_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1877)
# 作为 `fp8_group` 交给 TE 的 `fp8_autocast`，它总是带上 CP。4 个 rank、TP=2、DP=2 时在 rank 0 上读出：

# %% tags=["hide-input"]
amax

# %% [markdown]
# 默认是 TP×DP×CP 的全部 4 个 rank；`tp_only_amax_red` 把它缩到 TP（×CP）群：还是一次归约，只是群小了（通常在节点内），代价是各 DP 副本的 scale 可能不同。
# FP4 走同一条路（[`get_fp4_context`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp4_utils.py#L247)）。
#
# **梯度不以 FP8 归约。** FP8 只用在 GEMM 的输入上；DDP 的梯度缓冲区按
# [`param_and_grad_buffer.py:917`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L917)
# 取 fp32（`grad_reduce_in_fp32`）或参数的高精度 dtype（bf16），FP8 参数在那里以 uint8 存储，但梯度照旧是 bf16/fp32。
# 但 FP8 字节会走网络：开 SP 时 TE 在 TP 的 all-gather 之前先量化（[`layernorm_linear.py:309`](https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/pytorch/module/layernorm_linear.py#L309)，backward 里行并行层 all-gather 输出梯度也一样，[`base.py:1746`](https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/pytorch/module/base.py#L1746)），
# 所以 TP 的 all-gather 传的是 FP8 的激活和梯度（`hybrid` 下分别是 E4M3 和 E5M2）；DP 上还有 `--fp8-param-gather`，分布式优化器 all-gather 的是 FP8 权重。
#
# ### EP 重叠里的 stream 和群
#
# 主图里每个节点在 GPU 上有自己的 stream：attention、路由和专家在计算流，dispatch / combine 的 all-to-all 在
# [`set_streams`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/utils.py#L381) 新建的通信流，
# 两流之间靠 CUDA event 排先后。all-to-all 都在 EP 群上，和笔记 17 相同；每次调用记下的节点与通信：

# %% tags=["hide-input"]
print(error_line)
print(ran_line)
order

# %% [markdown]
# 第 0 次只有 micro-batch 0 的 forward，最后一次只有 micro-batch 2 的 backward，中间每次一个 F 配一个 B：m 个 micro-batch 调 m+1 次。
# 每层 forward 发 3 次 all-to-all（dispatch 2 次：token 和路由概率，combine 1 次），backward 同样 3 次，所以稳态一次 12 次。
# 顺序换了，算的东西没换：

# %% tags=["hide-input"]
print(same_line)

# %% [markdown]
# ## 机制解释
#
# ### combined_1f1b：一层 forward 配一层 backward
#
# [`TransformerLayerSchedulePlan.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/model_chunk_schedule_plan.py#L236)
# 把一层拆成 5 个节点（attention+路由、dispatch、专家、combine、MTP 后处理），每次拿 micro-batch i 的第 k 层 forward 和 micro-batch i−1 的
# 倒数第 k 层 backward，按固定顺序发出：B combine → F attn → B 专家 → F dispatch → B dispatch → F 专家 → F combine → B attn。
# 这个顺序让每次 all-to-all 都紧挨着另一个 micro-batch 的一段计算，主图的浅色带里正是这样。它要求的条件在
# [`transformer_config.py:2669`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2669) 起：

# %%
moe = dict(num_layers=1, hidden_size=16, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2, bf16=True,
           expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall")
for change in [dict(expert_model_parallel_size=1), dict(moe_token_dispatcher_type="allgather"), dict(bf16=False),
               dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1), {}]:
    try:
        TransformerConfig(**{**moe, **change}, overlap_moe_expert_parallel_comm=True)
        print(change, "→ 接受")
    except AssertionError as e:
        print(change, "→", e)

# %% [markdown]
# 还要 torch ≥ 2.6、PP>1 时必须设 VP（interleaved 的 steady 阶段调
# [`combined_1f1b_schedule_for_interleaved_pipelining`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/combined_1f1b.py#L138)），
# 不能和 `moe_shared_expert_overlap` 同开，`forward_step_func` 要接受 `return_schedule_plan`，返回 `GPTModel.build_schedule_plan(...)`。
#
# ### delay_wgrad_compute 与 FP4（读代码，未在 CPU 上运行）
#
# `delay_wgrad_compute` 只能和 EP 重叠一起开（[`transformer_config.py:2749`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2749)）。
# 它把 TE 线性层的 backward 拆成 dgrad 和 wgrad 两半（TE ≥ 2.3 的 `delay_wgrad_compute` 参数），dgrad 先算、先往下传；wgrad 由
# [`TransformerLayerNode.backward_dw`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/utils.py#L323)
# 补算：专家的 wgrad 紧跟在 F dispatch 之后，和那次 all-to-all 重叠；backward 走到的最后一层（模型的第一层）的 attention wgrad
# 留到 p2p 通信旁边。这正是 zero-bubble 把 B 拆成 B 和 W 的思路，只是用来藏通信。
# local 层没有 wgrad 的拆分，所以本页不开它。
#
# FP4 是另一组开关：`fp4="e2m1"`、`fp4_recipe="nvfp4"`（默认），[`get_fp4_recipe`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fp4_utils.py#L219)
# 交给 TE 的 [`NVFP4BlockScaling`](https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/common/recipe/__init__.py#L489)：
# 每 16 个值一个 E4M3 的 scale，外加一个 fp32 的全 tensor scale；权重用 16×16 的块，梯度随机舍入；wgrad GEMM 用到的（列方向的）输入和梯度先做 16×16 的 Hadamard 变换压离群值。
#
# ### CUDA graph：捕获了什么，禁止了什么
#
# CUDA graph 把一段 kernel 序列录一次、以后整段重放，省掉每个 kernel 的 CPU 启动开销。`cuda_graph_impl` 有三种实现：`local` 由
# [`CudaGraphManager`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/cuda_graphs.py#L1763) 逐层捕获；
# `transformer_engine` 由 [`TECudaGraphHelper`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/cuda_graphs.py#L2086)
# 调 TE 的 `make_graphed_callables` 一次捕获所有层；`full_iteration` 由
# [`FullCudaGraphWrapper`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/full_cuda_graph.py#L138) 捕获整个 forward-backward。
# `cuda_graph_modules` 选一层里的哪一块（attn、mlp、moe、moe_router…，空表示整层）。捕获要求形状固定、没有 CPU 同步、
# 随机数状态可重放，所以这些组合在建 config 时就被拒绝：

# %%
base = dict(num_layers=2, hidden_size=16, num_attention_heads=4)
for label, change in gpu.CUDA_GRAPH_CASES:
    try:
        TransformerConfig(**base, **change)
        print(f"{label} → 接受")
    except (AssertionError, ValueError) as e:
        print(f"{label} → {type(e).__name__}: {e}")

# %% [markdown]
# 全重算在反向时重新执行 forward，逐层图放不下它；CPU offloading 在图外搬数据；dropless MoE 每步每个专家的 token 数不同，
# 形状不固定，只有 drop-and-pad 的 MoE 才能捕获整个 MoE 层。`full_iteration` 还要求关掉 loss 的 NaN 检查
# （[`arguments.py:1195`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1195)），因为检查要在图的中途把结果读回 CPU。
# 捕获本身需要 GPU：读代码，未在 CPU 上运行。
#
# ### 没有 zero-bubble，也没有 DualPipe

# %%
{(pp, vp): get_forward_backward_func(pp, vp).__name__ for pp, vp in [(1, None), (4, None), (4, 2)]}

# %% tags=["hide-input"]
package = pathlib.Path(megatron.core.__file__).parent
words = ("zero bubble", "zero_bubble", "zerobubble", "dualpipe", "zb-v", "zbv")
hits = [p.relative_to(package).as_posix() for p in package.rglob("*.py")
        if any(w in p.read_text(errors="ignore").lower() for w in words)]
print(f"已安装的 megatron/core 里 {len(list(package.rglob('*.py')))} 个 .py 文件，提到 {', '.join(words)} 的：{len(hits)} 个")

# %% [markdown]
# 0.19.0 的 `get_forward_backward_func` 只会返回这三个 schedule，整个 `megatron/core` 没有一处提到 zero-bubble 或 DualPipe。
# 它有的是别的办法：interleaved 1F1B 把气泡缩到 (p−1)/(v·m+p−1)（笔记 13）；`combined_1f1b` 在 interleaved 的 steady 阶段同样合并
# F 和 B，藏 EP 的 all-to-all（DualPipe 在 DeepSeek-V3 里要解决的正是这件事）；`delay_wgrad_compute` 把 wgrad 挪到通信旁边。

# %% [markdown]
# ### 任务卡住时：少发一次集合通信
#
# 集合通信是一次“约会”：群里每个 rank 都要按同样的顺序发出同样的操作。torch 默认不检查这一点，先到的 rank 只会等，等到群的超时为止。
# Megatron 把这个上限交给 `--distributed-timeout-minutes`（默认 10，[common_config.py:77](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/config/common_config.py#L77)），
# 原样放进 `init_process_group` 的 `timeout`（[initialize.py:340](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L340)）；
# 第一步之后还可以用 `--distributed-timeout-seconds-after-init` 把所有群的超时改短
# （[training.py:3751](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3751)，读代码，未在 CPU 上运行）。
# 下面两个函数在两个 gloo rank 上各用一个 timeout 2 秒的新群：

# %% tags=["hide-input"]
import time
from functools import partial

import torch.distributed as dist

from snippets.experiments import n28_hang
from snippets.experiments.n28_hang import COLLECTIVE_TIMEOUT_S, HANG_LAUNCH_S


# %%
def skip_one(group):  # 三步，每步 all_reduce 一个数；rank 1 漏掉第 1 步的那次
    rank, out = dist.get_rank(), []
    for step in range(3):
        x = torch.tensor([10.0 * step + rank])
        if rank == 1 and step == 1:
            out.append((step, "skipped"))
            continue
        try:
            dist.all_reduce(x, group=group)
        except RuntimeError as exc:  # 群的 timeout 到了
            out.append((step, "raised", str(exc)))
            break
        out.append((step, "sum", x.item()))
    return out


def swap_order(group):  # rank 0 先 all_reduce 后 broadcast，rank 1 反过来
    rank, out = dist.get_rank(), []
    ops = ["all_reduce", "broadcast"] if rank == 0 else ["broadcast", "all_reduce"]
    if rank == 1:
        time.sleep(0.3)  # 让 rank 0 的计时先到，每次讲同一个故事
    for op in ops:
        x = torch.full((4,), float(rank + 1))
        try:
            if op == "all_reduce":
                dist.all_reduce(x, group=group)
            else:
                dist.broadcast(x, src=0, group=group)
        except RuntimeError as exc:
            out.append((op, "raised", str(exc)))
            break
        out.append((op, "ok", x.tolist()))
    return out


# %% tags=["hide-input"]
hang = run_ranks(partial(n28_hang.hang_scenarios, COLLECTIVE_TIMEOUT_S, skip_one, swap_order), 2, timeout=HANG_LAUNCH_S)
print(f"每个群的 timeout = {COLLECTIVE_TIMEOUT_S:g} s；这次启动的上限 = {HANG_LAUNCH_S:g} s")
n28_hang.skip_table(hang)

# %% [markdown]
# 结果不是“卡在第 1 步”：rank 0 第 1 步的 `all_reduce` 和 rank 1 第 2 步的那次配成了一对，两边都拿到 31（应得 21 和 41），没有任何报错；
# 直到 rank 0 发出第 3 次、再也等不到对手，它才在 2 秒上限处超时。报错的是**没有漏发**的 rank，报错的位置也不是出错的位置，中间的结果已经悄悄错了。
#
# 要找出是谁少发了，最直接的证据是每个 rank 在这个群上发过几次集合通信。torch 给每个进程留一个环形缓冲（“飞行记录”，默认 2000 条），
# 记下最近的集合通信，gloo 群也记：

# %% tags=["hide-input"]
display(n28_hang.flight_table(hang))
print("torchfrtrace，dump 原样：", *n28_hang.fr_analyzer(hang))
print("torchfrtrace，补上群成员 {0, 1}：")
print(*n28_hang.fr_analyzer(hang, add_members=True)[:5], sep="\n")

# %% [markdown]
# rank 0 记到序号 3，rank 1 只到 2，序号小的那个就是漏发的。torch 自带的分析器 `torchfrtrace` 把各 rank 的 dump 合起来比对，
# 但它要从 dump 里的 `pg_config` 得知每个群的成员，而这次 gloo 群没有被记进去，分析器停在 `KeyError`；补上成员表后它报出缺席的 rank 1。
# 真实任务里用 Megatron 的 `--flight-recorder-dump-path`：它在建进程群之前设好 `TORCH_FR_DUMP_TEMP_FILE`、`TORCH_NCCL_TRACE_BUFFER_SIZE`、
# `TORCH_NCCL_DUMP_ON_TIMEOUT` 等变量，已设的环境变量优先（[initialize.py:298](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L298)）。
# 超时自动落盘是 NCCL 后端的功能，读代码，未在 CPU 上运行。
#
# ### 顺序不一致，以及 `TORCH_DISTRIBUTED_DEBUG=DETAIL`
#
# rank 0 先 `all_reduce` 后 `broadcast`、rank 1 反过来时，gloo 没有给出悄悄错掉的结果：rank 0 在 2 秒处超时，rank 1 随后看到
# `Connection closed by peer`，后者只是前者的后果：

# %% tags=["hide-input"]
n28_hang.case_table(hang, "swap")

# %% [markdown]
# 先设 `TORCH_DISTRIBUTED_DEBUG=DETAIL` 再建群，torch 会把每个新群包进 `ProcessGroupWrapper`（`torch.distributed.distributed_c10d`
# 建群时包装）：每次集合通信之前，各 rank 先经一个额外的 gloo 群交换“指纹”（序号、操作类型、形状），不一致就在两个 rank 上同时报错，不必等超时：

# %% tags=["hide-input"]
print("DETAIL 下每个新群的后端:", hang[0]["wrapper"])
print(*n28_hang.mismatch_summary(hang), sep="\n")
n28_hang.case_table(hang, "skip_detail")

# %% [markdown]
# 它查不出漏发：漏发的例子里两边的指纹都是同形状的 `all_reduce`，31 照样出现；只在最后一次，它的 monitored barrier 到 2 秒时报出
# `Ranks 1 failed to pass monitoredBarrier`，直接点了漏发者的名。torch 在 import 时读这个变量，所以要在启动进程时放进环境；
# 它给每次集合通信多加一轮通信，只用来排查。
#
# 等待没有上限（或上限很长）时，要看每个进程此刻的 Python 栈。下面这次启动让群的 timeout 比启动的上限长，到时由 faulthandler 取栈：

# %% tags=["hide-input"]
out = n28_hang.launcher_report()
print(f"群的 timeout = {n28_hang.STUCK_GROUP_TIMEOUT_S:g} s，启动上限 = {n28_hang.STUCK_LAUNCH_S:g} s：")
print(out["report"])

# %% [markdown]
# 集群上同样的事用 `py-spy dump --pid <PID>` 对每个进程做（本机没装，未运行）。Megatron 的
# [`StragglerDetector`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1445)（`--log-straggler`）
# 管的是“慢而不卡”：用 CUDA event 给每个 rank 计时，每个日志间隔把各 rank 的数收到 rank 0，报出最慢和最快的 rank。收集本身就是集合通信
# （[utils.py:1933](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L1933) 的 `gather_object`），真卡住时它也一起等。读代码，未在 CPU 上运行。
#
# ### loss 变成 NaN 或突然变大
#
# `pretrain_gpt.py` 的 `loss_func` 在 DP 归约之前对本 rank 的 loss 调两次 `validate_result`
# （[pretrain_gpt.py:250](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L250)）；`--check-for-spiky-loss` 再加一次
# `is_unexpectedly_large`，阈值是见过的最大值的 10 倍，`fatal=False`（[pretrain_gpt.py:266](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L266)）：

# %%
def nan_check(rsm, loss):  # pretrain_gpt.py 的 loss_func 里的两次检查，参数照抄
    rsm.validate_result(result=loss, rejection_func=torch.isnan,
                        message="found NaN in local forward loss calculation", tolerance=0.0, fatal=True)
    rsm.validate_result(result=loss, rejection_func=torch.isinf,
                        message="found Inf in local forward loss calculation", tolerance=0.0, fatal=True)


# %% tags=["hide-input"]
nan = run_ranks(partial(n28_hang.nan_cases, nan_check), 2, timeout=30)
n28_hang.nan_table(nan)

# %% [markdown]
# `train_step` 把前向反向包在 `while rerun_state_machine.should_run_forward_backward(...)` 里
# （[training.py:2358](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2358)），之后问
# `should_checkpoint_and_exit()`（[training.py:2458](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2458)）。
# 上表用真的 `RerunStateMachine` 跑了几步，rank 1 的输入在第 2 步放进一个 NaN。默认的 `validate_results` 模式下，各 rank 把“要重跑”的标志做一次
# all-reduce（[`_reduce_any`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L254)），于是**所有 rank**
# 恢复 RNG 状态、把这一步原地再跑一次；重跑仍是 NaN，而比较把 NaN 与 NaN 算作相同，判定“可复现”，决定存 checkpoint 并以 exit code 16 退出
# （[rerun_state_machine.py:37](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L37)）：
# 换一块 GPU 从这个 checkpoint 重跑这一步，才能分清是数据的问题还是这块 GPU 的问题。重跑结果不同算瞬时错误，以 17 退出；
# `--error-injection-rate 1` 配 `transient_error` / `persistent_error` 正好演练这两条路。第一行是状态机照原样在 CPU 上跑：它的标志张量建在 `device='cuda'` 上。
# `--check-for-spiky-loss` 的 `fatal=False` 只改结局：尖峰那步照样被抓到、原地重跑（表中最后一行第 7 步跑了 2 次），但不论能否复现都只记警告、接着训练，不存 checkpoint 也不退出。
#
# 真实集群上的步骤，每个开关的默认值取自 Megatron 自己的参数解析器，出处是 0.19.0 和 torch 2.13 的行：

# %% tags=["hide-input"]
n28_hang.procedure_table()

# %% [markdown]
# ## 与训练主链路的关系
#
# 这些开关都不改模型算什么，只改什么时候算、用什么精度算：EP 重叠本页测得差 0；TP 重叠在数学上相同，是否逐位相同本页没有验证（userbuffer 的 reduce-scatter 有自己的求和顺序），
# CUDA graph 重放的是同一串 kernel；FP8 改变数值，但只在 GEMM 的输入上，主权重、优化器状态、梯度归约仍是 fp32/bf16。
# 一次训练 step 的骨架（笔记 05、06、13）不变。真机上它们值多少，按[笔记 26](../26_cost/) 的通信量和带宽估：TP 的通信占一层时间越大，重叠越值钱。
#
# ## 与基础知识的连接
#
# - 计算和通信重叠的前提是两者互不依赖，并能在不同的硬件单元上同时跑：GEMM 用 Tensor Core，NCCL 的集合通信是占少量 SM 的 kernel；TE 的 userbuffer 还可以改用拷贝引擎（`use_ce`）。
# - FP8 是浮点数的位数分配：E4M3 多一位尾数、范围小，给激活和权重；E5M2 范围大，给梯度。scale 把数据搬进可表示的范围。
# - CUDA graph 针对的是 CPU 发 kernel 的开销：小 batch、小模型时 GPU 在等 CPU，graph 把几千次启动变成一次。
# - 集合通信在一个群里按发出的先后配对，不看变量名和第几步：少发一次，后面的每一次都错位一格，直到最后一次没人接。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# - `tp_comm_overlap=True` 而不开 SP，`TransformerConfig` 照收（关键对象的第一个单元格），只有训练入口
#   [`arguments.py:1401`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1401) 拒绝；直接用 core 的框架要自己查。
# - `combined_1f1b` 第一行就建 CUDA stream（[`utils.py:392`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/utils.py#L392)），
#   CPU 上报 `RuntimeError: invalid argument to exchangeDevice`，看不出是缺 GPU（“EP 重叠里的 stream 和群”一节打印了它）。
# - Megatron 的 FP8 默认 `fp8_amax_history_len=1`、`most_recent`，TE 自己的 `DelayedScaling` 默认 1024、`max`：同叫 delayed，对突变的反应不同。
# - 第 1 步的 NaN 不检查：`validate_results` 模式下 `first_iteration_complete` 为 False 时直接返回
#   （[rerun_state_machine.py:594](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L594)），NaN 表里“第 1 步 NaN”一行训练照常继续。
# - `disabled` 模式只在出 NaN 的 rank 上抛错（[rerun_state_machine.py:519](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L519)），
#   别的 rank 不知道。本页的循环没有别的集合通信，NaN 表里 rank 0 跑完了 4 步；真实训练里它会卡在同一步的梯度 all-reduce 上，直到群超时。
# - `TELinear` 遇到不认识的 userbuffer 名字时改的是共用 config 的 `tp_comm_overlap`（[transformer_engine.py:927](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L927)），
#   警告写“for this layer”，其后建的所有层都不再重叠；MLA 的 `q_down_proj`（[multi_latent_attention.py:545](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/multi_latent_attention.py#L545)）就是这样的名字。读代码，未在 CPU 上运行。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - `combined_1f1b`：只在调用期间把 schedule 的 4 个模块（`pipeline_parallel/utils.py`、`model_chunk_schedule_plan.py`、
#   `models/common/utils.py`、`fine_grained_callables.py`）看到的 CUDA stream / event 换成只带名字的替身，`Tensor.record_stream` 换成空操作；
#   CPU 上只有一个线程，节点本来就按发出的顺序执行，所以记下的是 GPU 上两条流各自的发出顺序，不是真实的时间重叠。
# - MoE 模型用 RoPE：不经 `Float16Module` 包装时，learned 位置嵌入的输出是 fp32、词嵌入是 bf16，相加后变成 fp32，CPU 上的矩阵乘拒绝混合 dtype。
# - TP 重叠那一层用 local spec（没有 TE），TE 的 userbuffer 名字和方法读自 TE 的源码（提交 `d0067d0`）。
# - 卡住的例子：每个例子一个 timeout 2 秒的新群，一个群超时坏掉不影响下一个；默认群的超时比启动上限长，由启动器兜底。
#   torch C++ 侧写到 fd 2 的日志在 rank 里截住，不进单元格输出；启动器的栈报告剪掉了 fork 时内核自己的调用帧。
# - `RerunStateMachine` 照原样跑时停在 `_reduce_any` 的 `device='cuda'`（[rerun_state_machine.py:268](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/rerun_state_machine.py#L268)，
#   NaN 表第一行）；之后只把这个模块里那一处换到 CPU，保存 / 恢复 CUDA RNG 用本仓库已有的补丁。
#
# </details>

# %% [markdown]
# ## 自测

# %% [markdown]
# **1. TP=2 开 SP 时，每个列并行层（QKV、fc1）的 backward 里哪两次通信在 local 层里就已经和 GEMM 重叠了，各藏在哪个 GEMM 后面？**
#
# <details><summary>答案</summary>
#
# 每个列并行层（QKV、fc1）的 backward 各有两次：再 all-gather 一次输入，和 dgrad GEMM 重叠；把输入梯度 reduce-scatter 回 s/t，
# 和 wgrad GEMM 重叠。TE 把它们叫 bulk（`qkv_dgrad`、`qkv_wgrad`、`fc1_dgrad`、`fc1_wgrad`）。下面的单元格从记录里数出来。
#
# </details>

# %% tags=["answer"]
print([row[:3] + row[5:7] for row in overlap.rows if row[7] == "bulk"])

# %% [markdown]
# **2. delayed scaling 的历史长度是 1、取 `most_recent` 时，一个激活在某一步突然整体放大 4 倍，这一步会有值被截断吗？放大 2 倍呢？**
#
# <details><summary>答案</summary>
#
# 这一步的 scale 来自上一步的 amax，放大 k 倍后最大值乘上 scale 约等于 448·k，超过 448 的值都被截断：4 倍时截掉一大片，
# 2 倍时也截掉一部分（大于原 amax 一半的那些值）。下面的单元格算出两种情况被截的个数。
#
# </details>

# %% tags=["answer"]
for k in (4.0, 2.0):
    r = gpu.delayed_scaling([gpu.activations(0), gpu.activations(1) * k], 1, "most_recent")[1]
    print(f"放大 {k:g} 倍：被截断 {r['clipped']} 个，相对误差 {r['error']:.4f}")

# %% [markdown]
# **3. 3 个 micro-batch、2 层的 MoE 模型开 `overlap_moe_expert_parallel_comm` 时，`combined_forward_backward_step` 被调用几次？
# 哪几次同时有 forward 和 backward？**
#
# <details><summary>答案</summary>
#
# 4 次：第 0 次只有 micro-batch 0 的 forward，第 1、2 次各是一个 forward 配上一个 micro-batch 的 backward，第 3 次只有最后一个 backward。
#
# </details>

# %% tags=["answer"]
print(order.column("micro-batch"))


# %% [markdown]
# **4. rank 1 漏掉第 1 步的 `all_reduce`（每步各 rank 贡献 10·step + rank）。rank 0 第 1 步拿到多少？为什么第 1 步没卡住？**
#
# <details><summary>答案</summary>
#
# 31。gloo 按群里的先后配对，不看“第几步”：rank 1 的下一次 `all_reduce`（第 2 步的 21）补上了这个位置，所以第 1 步照常完成、结果是错的
# （应得 10 + 11 = 21）；真正等不到对手的是 rank 0 的第 3 次。flight recorder 里两个 rank 的次数是 3 和 2。
#
# </details>

# %% tags=["answer"]
r0 = dict((o[0], o[1:]) for o in hang[0]["skip"]["out"])
print("rank 0 第 1 步拿到", r0[1][1], "；应得", (10 * 1 + 0) + (10 * 1 + 1),
      "；它其实是 rank 0 第 1 步 + rank 1 第 2 步 =", (10 * 1 + 0) + (10 * 2 + 1))
print("rank 0 / rank 1 在这个群上发出的集合通信次数：", [h["flight_record"]["last_enqueued"] for h in hang])

# %% [markdown]
# **5. `validate_results` 模式下 rank 1 的 loss 在第 2 步是 NaN、重跑还是 NaN。进程以什么 exit code 退出，为什么不直接判定失败？**
#
# <details><summary>答案</summary>
#
# 16（`EXIT_CODE_RESUME_TO_DISAMBIGUATE`），这一步在所有 rank 上跑了 2 次。同一块 GPU 上可复现，可能是数据本身算出 NaN，也可能是这块 GPU
# 一直算错；状态机存下 checkpoint 退出，让任务换一块 GPU 从这里重跑这一步再下结论。重跑结果不同才是 17（瞬时错误）。
#
# </details>

# %% tags=["answer"]
from megatron.core.rerun_state_machine import EXIT_CODE_FAILED_ON_RESULT_VALIDATION, EXIT_CODE_RESUME_TO_DISAMBIGUATE

row = nan[0]["validate_results"]["rows"][-1]
print("第 2 步：该步跑了", row["runs"], "次；决定 (checkpoint, exit, code) =", row["decision"],
      "；EXIT_CODE_RESUME_TO_DISAMBIGUATE =", EXIT_CODE_RESUME_TO_DISAMBIGUATE,
      "，EXIT_CODE_FAILED_ON_RESULT_VALIDATION =", EXIT_CODE_FAILED_ON_RESULT_VALIDATION)

# %% [markdown]
# ## 30-second answer
#
# On GPUs Megatron hides communication behind compute. With sequence parallel, each TP all-gather and reduce-scatter
# of a layer pairs with a GEMM in Transformer Engine's userbuffers: ring-exchange before QKV and fc1, pipelined
# reduce-scatter after proj and fc2, bulk overlap in backward. FP8 casts GEMM inputs with a scale of 448 over the
# amax, delayed from history or current; the amax is reduced over TP×DP×CP, gradients stay bf16 or fp32.
# combined_1f1b interleaves one micro-batch's forward with another's backward layer by layer, so MoE all-to-alls
# run beside compute. There is no zero-bubble or DualPipe schedule. A hang is a
# collective some rank never joined: bound the wait, dump each rank's flight recorder and find the lowest sequence
# number; TORCH_DISTRIBUTED_DEBUG=DETAIL names mismatched collectives at once. A NaN loss makes the rerun state
# machine replay the step on all ranks and exit with code 16, to retry on another GPU.
