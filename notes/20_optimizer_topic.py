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
# # 20 优化器专题：混合精度、loss scale、分片与裁剪
#
# `get_megatron_optimizer` 交回来的是什么对象？bf16 / fp16 训练时一个参数有几份、各是什么 dtype，fp16 的 loss scale
# 怎样跳过一步、减半、再长回来？分布式优化器每个 rank 省下了什么，梯度范数和裁剪怎样跨 TP / PP / DP 算得和单进程一样，
# overlap 打开后 bucket 的通信挪到了 step 的哪里？本篇用 Megatron Core 0.19.0 的真实优化器逐条运行回答。
# 一步优化的主流程见[笔记 06](../06_gradient_sync_and_optimizer/)，分布式优化器的分片见[笔记 15](../15_distributed_optimizer/)，这里不重复。

# %% [markdown]
# ## 阅读目标
#
# 1. **optimizer 如何创建**：按哪几个开关选类、建几个内层优化器、选哪个 grad scaler。
# 2. **混合精度与 grad scaler**：16 位权重、`main_grad`、fp32 主参数各是什么；溢出时怎样跳过和调整 scale。
# 3. **分布式优化器的切分**：bf16 时每个 rank 持有哪些 buffer、多大。
# 4. **梯度范数与裁剪跨 rank**：哪些梯度被跳过，为什么任何切法的范数都等于单进程。
# 5. **overlap grad reduce / param gather**：通信挪到 step 的哪里，结果变不变。
#
# **结论**
#
# - 总是 `ChainedOptimizer`，内层 1–3 个：稠密参数 1 个，`overlap_param_gather_with_optimizer_step` 时 2 个，expert 参数再加 1 个。
# - 16 位权重算前后向，Adam 更新独立的 fp32 主参数：lr 1e-4 走 3 步后 5378 / 9632 个 bf16 权重一位没变，主参数全变了。
# - fp16 溢出时 `step()` 返回 False、参数不动；第二次溢出才减半（1024 → 512），干净 3 步后翻倍；缺省初值 2³² 白跳 16 步。
# - 分布式优化器只切 fp32 主参数和 Adam 状态（两个 rank 4768 + 4864 = 9632），bf16 权重和 fp32 梯度 buffer 仍完整：约 12.5 对 18 字节 / 参数。
# - 范数里 TP 复制的参数只算 TP rank 0、PP 共享的词嵌入只算一份：单进程、TP=2、PP=2、TP2·DP2 都是 1.7747（不过滤时 1.8879、1.9439）。
# - overlap 只改发出时刻：AG 移进下一次 forward，RS 从第 2 步起移进 backward，权重逐位相同；但 step 刚结束时参数差 0.0101。
#
# 先读：[笔记 06](../06_gradient_sync_and_optimizer/)（一步优化）、[笔记 14](../14_data_parallel_ddp/)（DDP 的 bucket）、[笔记 15](../15_distributed_optimizer/)（分布式优化器）；约 25 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.optim import grad_norm, loss_scale, mixed_precision, optimizer_memory
from snippets.dp import overlap_timeline, pictures as dp_pictures
from snippets.record.listing import listing
from snippets.record import recorder
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n20_optimizer_topic import bf16_buffers, overlap_run, run, tables
from snippets.experiments.n20_overlap import run as run_overlap, tables as overlap_tables
from snippets.ranks.launch import run_ranks
from snippets.config.param_table import gather
from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, by_global_name, forward_step, global_name, max_abs_diff, microbatches, \
    tiny_config

import torch
from IPython.display import Markdown, display

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.grad_scaler import DynamicGradScaler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.module import Float16Module

PAR = Parallel(world=2)
section8 = run_ranks(run_overlap, 2, EXPERIMENTS["overlap"].tiny, PAR)   # 每个 rank：先不 overlap，再 overlap
dp_pictures.draw_overlap_timeline(
    section8[0], title="开 overlap：AG 移进下一次 forward，RS 从第 2 步起移进 backward，权重逐位相同（rank 0）")

# %% [markdown]
# DP=2、分布式优化器、3 个 bucket，rank 0 上的一步：蓝 = 一串模块的 forward，红 = 一串参数的梯度，黄 = 一次 collective
# （`AG b2` 是 bucket 2 的 all-gather，`RS` 是 reduce-scatter）。第 5 节逐条读它。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 所有 rank 都是本机的 gloo 进程，由 `snippets.ranks.launch.run_ranks` 从 notebook 进程 fork 出来，结果交回 notebook 打印。
# - 模型是 `snippets.models.tiny_gpt.tiny_config` 的小 `GPTModel`（local spec）：4 层、hidden 16、2 个头、vocab 32、序列 8、
#   micro-batch 2，共 9632 个参数；第 1 节用 1 层。下面折叠的 `build` 与正式入口 `get_model` 顺序相同：建模型，16 位时包
#   `Float16Module`，再包 DDP。权重按参数的**全局**名字生成、TP 时取自己那片（`grad_norm.init_full_by_global_name`），
#   所以不管怎么切，拼起来都是同一个单进程模型。`train_step` 是一步里优化器之前的部分（schedule + `finalize_model_grads`）。
# - 第 3 节（bf16 下分布式优化器的 buffer）是实验 `optimizer-topic`（`snippets/experiments/n20_optimizer_topic.py` 的
#   `bf16_buffers`、`run`，尺寸取登记项的 `tiny`，即上面的 4 层模型），比较两次运行的权重时只传回字节的 SHA-256。
# - 第 5 节（overlap）是实验 `overlap`：`n20_optimizer_topic.overlap_run` 用笔记 14 的 `build_model` 建同样的模型、
#   `bucket_size=3000` 切出 3 个 bucket、每步 2 个 micro-batch、跑 2 步；`n20_overlap.run` 在每个 rank 上先不 overlap、
#   再 overlap 各跑一次，当场比较权重。`overlap_timeline.markers` 在记录里插入"某个模块开始 forward""某个参数的梯度算好了"，
#   所以每次通信夹在哪些计算之间看得出来。
# - 通信表由 `snippets.record.recorder` 记录：每个 collective、发出它的 Megatron 函数和它所属的阶段（optimizer step、grad sync…）。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 optimizer-topic`（第 3 节的表）、
#   `.venv/bin/python -m snippets.run --nproc-per-node 2 overlap`（第 5 节的表）；`scripts/execute_notes.sh notes/20_optimizer_topic.py` 重新执行整页。
# - CPU 上要的改动见文末「在 CPU 上怎么跑的」。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def build(config, ddp_config, share_embeddings=False):
    model = GPTModel(config, get_gpt_layer_local_spec(num_experts=config.num_moe_experts), vocab_size=VOCAB,
                     max_sequence_length=SEQ, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=share_embeddings)
    grad_norm.init_full_by_global_name(model, parallel_state.get_tensor_model_parallel_rank(),
                                       config.tensor_model_parallel_size)
    if config.fp16 or config.bf16:
        model = Float16Module(config, model)
    return DistributedDataParallel(config, ddp_config, model)


def train_step(ddp, optimizer, batches):
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(batches), model=[ddp],
                                         num_microbatches=len(batches), seq_length=SEQ, micro_batch_size=MBS)
    finalize_model_grads([ddp])
    return sum(loss["lm loss"].item() for loss in losses) / len(batches)


listing(bf16_buffers, run, overlap_run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`optimizer/__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 分参数组（稠密 / expert），每组建一个优化器，包成 `ChainedOptimizer` |
# | [`optimizer/__init__.py::_get_megatron_optimizer_based_on_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L450) | 建 torch 的 AdamW，选 grad scaler，选外层的类 |
# | [`optimizer/optimizer.py::MixedPrecisionOptimizer.prepare_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L741) | 拷梯度 → unscale 并查 inf → `grad_scaler.update` |
# | [`optimizer/grad_scaler.py::DynamicGradScaler.update`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/grad_scaler.py#L131) | 动态 loss scale 的策略 |
# | [`optimizer/optimizer.py::ChainedOptimizer.step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1855) | 每一步：prepare → 溢出则返回 → 范数 → 裁剪 → 更新 |
# | [`optimizer/optimizer.py::MegatronOptimizer._filter_grads_for_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L231) | 范数只算不共享、不是 TP 复制的梯度 |
# | [`optimizer/clip_grads.py::get_grad_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L55) | 本地平方和，在 grad-stats 群里求和 |
# | [`distributed/param_and_grad_buffer.py::_ParamAndGradBucketGroup.finish_param_sync`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L532) | forward pre-hook 里：没发就发、等完成、预取下一个 bucket |
#
# <details><summary>其余 21 个符号</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`optimizer/optimizer_config.py::OptimizerConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer_config.py#L139) | `fp16`、`bf16`、`loss_scale`、`initial_loss_scale`、`hysteresis`、`clip_grad`… |
# | [`optimizer/optimizer.py::MegatronOptimizer.get_grads_for_grad_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L280) | 主范数用的梯度：除去单独成组（MTP）的参数，再过滤 |
# | [`optimizer/optimizer.py::MegatronOptimizer.has_grad_norm_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L294) | `clip_grad > 0` 时：有没有哪个 rank 持有 MTP 参数，问一次（MAX）、缓存 |
# | [`optimizer/optimizer.py::MixedPrecisionOptimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L654) | 16 位与分布式优化器的共同父类 |
# | [`optimizer/optimizer.py::MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L713) | 乘 1/scale，发现 inf 则置标志，标志在 grad-stats 群里取 MAX |
# | [`optimizer/optimizer.py::Float16OptimizerWithFloat16Params.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L978) | 为每个 16 位参数建 fp32 主参数，换进 AdamW 的参数组 |
# | [`optimizer/optimizer.py::Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1092) | `main_param.grad = main_grad.float()` |
# | [`optimizer/optimizer.py::ChainedOptimizer.get_grad_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1760) | 各内层优化器各自求范数，再平方相加 |
# | [`optimizer/grad_scaler.py::ConstantGradScaler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/grad_scaler.py#L43) | 给了 `loss_scale` 时的固定 scale |
# | [`optimizer/clip_grads.py::clip_grad_by_total_norm_fp32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/clip_grads.py#L143) | 范数超过 `clip_grad` 时就地缩放 |
# | [`tensor_parallel/layers.py::param_is_not_tensor_parallel_duplicate`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L95) | TP 切过的参数，或 TP rank 0（expert 参数看 expert TP 群） |
# | [`transformer/module.py::param_is_not_shared`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/module.py#L25) | 没有 `shared=True` |
# | [`transformer/module.py::Float16Module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/module.py#L436) | 把模型转成 bf16 / fp16，输入转 16 位、输出转回 fp32 |
# | [`language_module.py::LanguageModule.setup_embeddings_and_output_layer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L202) | PP>1 共享词嵌入：最后一个 stage 的副本标 `shared=True` |
# | [`optimizer/distrib_optimizer.py::DistributedOptimizer._build_model_and_main_param_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L347) | 16 位参数：只为本 rank 那段建 fp32 主参数 |
# | [`optimizer/distrib_optimizer.py::DistributedOptimizer.step_with_ready_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L3158) | 不 overlap 时在这里 all-gather 参数 |
# | [`distributed/distributed_data_parallel_config.py::DistributedDataParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel_config.py#L12) | `overlap_grad_reduce`、`overlap_param_gather`、`grad_reduce_in_fp32` |
# | [`distributed/distributed_data_parallel.py::DistributedDataParallel._make_forward_pre_hook`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L432) | 模块 forward 前：等本模块参数所在 bucket 的 all-gather |
# | [`distributed/param_and_grad_buffer.py::_ParamAndGradBucketGroup.register_grad_ready`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L857) | backward 里 bucket 的梯度齐了就发 reduce-scatter |
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 正式入口：`get_model`（含 `Float16Module`、DDP）后调 `get_megatron_optimizer` |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 正式入口的一步：`update_successful` 为假时不推进学习率 |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 建：`get_megatron_optimizer` 把参数分成稠密、expert 两类，每类（和每组 model chunk）建一个内层优化器，包成 `ChainedOptimizer`。
# 每步：schedule 在 backward 前把 loss 乘 scale，`ChainedOptimizer.step` 依次 unscale 并查 inf、求范数、裁剪、更新、写回 16 位权重。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/training/training.py::setup_model_and_optimizer
# ├─ get_model: Float16Module(config, model)  (--bf16 / --fp16 时)           # 权重转 16 位
# │             DistributedDataParallel(config, ddp_config, module)         # grad buffer；bf16 时缺省 fp32 梯度
# └─ megatron/core/optimizer/__init__.py::get_megatron_optimizer
#    ├─ 稠密 model chunk 分组：[全部]；overlap_param_gather_with_optimizer_step 时 [第 1 个]、[其余]
#    ├─ 每组：_get_param_groups_and_buffers(filter: 非 expert)
#    │  └─ _get_megatron_optimizer_based_on_param_groups
#    │     ├─ torch.optim.AdamW(param_groups)                               # 没有 TE / Apex
#    │     ├─ grad_scaler: loss_scale → ConstantGradScaler；fp16 → DynamicGradScaler；否则 None
#    │     └─ 分布式优化器 → DistributedOptimizer      grad-stats 群 = intra_dist_opt（tp·pp·dp 全体）
#    │        否则 fp16 / bf16 → Float16OptimizerWithFloat16Params   grad-stats 群 = tp-pp
#    │        都不是 → FP32Optimizer                    grad-stats 群 = tp-pp
#    ├─ 有 expert 参数：_get_param_groups_and_buffers(filter: expert)      # 所有 chunk 的 expert 参数一组
#    │  └─ _get_megatron_optimizer_based_on_param_groups(..., model_parallel_group=expt_tp_pp)
#    └─ ChainedOptimizer([...])
#
# megatron/training/training.py::train_step（每一步）
# ├─ forward_backward_func(...)
# │  ├─ forward：DDP forward pre-hook → finish_param_sync                    # overlap_param_gather：all_gather(dp-cp)
# │  ├─ backward_step: output_tensor = grad_scale_func(loss)               # loss × scale
# │  └─ backward：DDP hook → register_grad_ready                            # overlap_grad_reduce：reduce_scatter / all_reduce(dp-cp)
# ├─ finalize_model_grads → finish_grad_sync                               # 不 overlap：在这里发；overlap：等
# └─ optimizer.step() = ChainedOptimizer.step
#    ├─ prepare_grads → MixedPrecisionOptimizer.prepare_grads
#    │  ├─ _copy_model_grads_to_main_grads                                 # main_param.grad = main_grad.float()
#    │  ├─ _unscale_main_grads_and_check_for_nan                           # × 1/scale；all_reduce(MAX, grad-stats 群)
#    │  └─ grad_scaler.update(found_inf)                                   # 减半 / 不变 / 翻倍
#    ├─ found_inf → return (False, None, None)                             # 跳过：参数不动
#    ├─ get_grad_norm → get_grads_for_grad_norm → _filter_grads_for_norm
#    │  └─ get_grad_norm_fp32                                              # all_reduce(SUM, grad-stats 群)
#    ├─ clip_grad > 0：_compute_grad_norms_by_group → has_grad_norm_group("mtp")
#    │                                                                     # 第一步 all_reduce(MAX, grad-stats 群)，之后读缓存
#    ├─ clip_grad_by_total_norm_fp32                                       # 本地 × clip/(norm+1e-6)
#    └─ step_with_ready_grads
#       ├─ AdamW.step()                                                    # 更新 fp32 主参数（或其分片）
#       ├─ _copy_main_params_to_model_params                               # 主参数 → 16 位权重
#       └─ DistributedOptimizer：不 overlap 时 start_param_sync             # all_gather(dp-cp)
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `get_megatron_optimizer`、`ChainedOptimizer.step`、`get_grad_norm_fp32` 的记录在[笔记 06](../06_gradient_sync_and_optimizer/)，
# `register_grad_ready` 在[笔记 14](../14_data_parallel_ddp/)，`DistributedOptimizer` 的在[笔记 15](../15_distributed_optimizer/)。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `_get_megatron_optimizer_based_on_param_groups` | config、参数组、buffers、各群 | 一个 `MegatronOptimizer` | AdamW、grad scaler、三种外层类 | 记下 grad-stats 群 | 分布式优化器时切状态 | 是 | simple loop 不调用（用 torch 的 Adam） |
# | `Float16OptimizerWithFloat16Params.__init__` | AdamW、config、scaler | 优化器 | `copy_tensor_model_parallel_attributes` | 否 | 否 | 是：每个 16 位参数多一份 fp32 `main_param` | 同上 |
# | `MixedPrecisionOptimizer.prepare_grads` | 无（读 `main_grad`） | 是否发现 inf | `_copy_model_grads_to_main_grads`、`_unscale_main_grads_and_check_for_nan`、`grad_scaler.update` | **是**：found_inf 的 all-reduce(MAX) | 否 | 是：主梯度、loss scale | `optim.step()` 之内 |
# | `DynamicGradScaler.update` | `found_inf` | 无 | 无 | 否 | 否 | 是：scale 与两个计数器 | 同上 |
# | `_filter_grads_for_norm`（经 `get_grads_for_grad_norm`） | 本优化器的参数、可选的 `param_filter` | 要计入范数的梯度 | `param_is_not_shared`、`param_is_not_tensor_parallel_duplicate`、`param_is_not_gtp_duplicate` | 只读 TP（和 GTP）rank | 否 | 否 | 同上 |
# | `has_grad_norm_group` | 组名（只有 `"mtp"`） | 是否有 rank 持有这组参数（缓存） | `get_grad_stats_parallel_group` | **是**：第一次问时 all-reduce(MAX) | 否 | 否（只写缓存） | 同上 |
# | `clip_grad_by_total_norm_fp32` | 参数、`clip_grad`、总范数 | 无 | `multi_tensor_scale` | 否 | 否 | 是：梯度就地缩放 | 同上 |
# | `DDP._make_forward_pre_hook` 的 hook | 模块 | 无 | `finish_param_sync` | **是**：all-gather(dp-cp) | 是：拼回参数分片 | 是：权重变成最新 | forward 之内 |
#
# > **旧版（core_v0.18.0）：** 过滤范数梯度的是 [`optimizer.py::MegatronOptimizer.get_main_grads_for_grad_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/optimizer/optimizer.py#L140)（没有 `param_filter`），只用共享、TP 复制两个谓词；还没有单独成组的 MTP 范数，所以 `clip_grad > 0` 的第一步也没有那次 MAX all-reduce。
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 1. optimizer 如何创建：配置决定类和个数
#
# 2 个 rank（DP=2；MoE 的几行 EP=2），同一个 1 层模型、十种配置，各调一次真实的 `get_megatron_optimizer`，读出它返回的对象。
# 最后两行像 interleaved PP 那样给两个 model chunk，并打开 `overlap_param_gather_with_optimizer_step`：

# %%
def which_optimizer(cases):
    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    rows = []
    for label, precision, opt_kwargs, moe, chunks in cases:
        config = tiny_config(num_layers=1, **precision, **moe)
        ddp_config = DistributedDataParallelConfig(
            use_distributed_optimizer=opt_kwargs.get("use_distributed_optimizer", False),
            overlap_param_gather=opt_kwargs.get("overlap_param_gather", False))
        model_chunks = [build(config, ddp_config) for _ in range(chunks)]
        optimizer = get_megatron_optimizer(OptimizerConfig(lr=0.01, **precision, **opt_kwargs), model_chunks)
        parts = optimizer.chained_optimizers
        rows.append([label, type(optimizer).__name__, len(parts),
                     " + ".join(type(o).__name__ + (f"（{len(o.model_chunks)} chunk）" if chunks > 1 else "") for o in parts),
                     " + ".join(type(getattr(o, "grad_scaler", None)).__name__ for o in parts).replace("NoneType", "None"),
                     parts[0].get_loss_scale().item(),
                     " + ".join(str(torch.distributed.get_process_group_ranks(o.get_grad_stats_parallel_group()))
                                for o in parts)])
    return rows


moe = dict(num_moe_experts=2, moe_ffn_hidden_size=32, expert_model_parallel_size=2)
dist = dict(use_distributed_optimizer=True)
early_ag = dict(use_distributed_optimizer=True, overlap_param_gather=True, overlap_param_gather_with_optimizer_step=True)
cases = [("fp32", {}, {}, {}, 1),
         ("bf16", dict(bf16=True), {}, {}, 1),
         ("fp16", dict(fp16=True), {}, {}, 1),
         ("fp16, loss_scale=1024", dict(fp16=True), dict(loss_scale=1024.0), {}, 1),
         ("fp32, 分布式优化器", {}, dist, {}, 1),
         ("bf16, 分布式优化器", dict(bf16=True), dist, {}, 1),
         ("fp32, MoE（EP=2）", {}, {}, moe, 1),
         ("bf16, MoE（EP=2）, 分布式优化器", dict(bf16=True), dist, moe, 1),
         ("bf16, 分布式优化器, 2 chunk, overlap_..._with_optimizer_step", dict(bf16=True), early_ag, {}, 2),
         ("同上 + MoE（EP=2）", dict(bf16=True), early_ag, moe, 2)]
created = run_ranks(which_optimizer, 2, cases)[0]
Table(["配置", "返回", "内层个数", "内层优化器", "grad_scaler", "loss scale", "grad-stats 群"], created)

# %% [markdown]
# - **外面总是 `ChainedOptimizer`**（adam / sgd、不用 Megatron FSDP 时，[`__init__.py:1224`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1224)）。
#   稠密参数通常一个内层优化器；开 `overlap_param_gather_with_optimizer_step`（正式入口只许 interleaved PP 用）时第一个 model chunk
#   单独一个、其余 chunk 一个（[optimizer/__init__.py 第 1049–1054 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1049-L1054)），第一个 chunk 一更新完就先发它的参数 all-gather
#   （[optimizer.py 第 1640–1643 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1640-L1643)）；有 expert 参数时所有 chunk 的 expert 参数再合成一个
#   （[optimizer/__init__.py 第 1195 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L1195)）。所以是 1、2 或 3 个（Megatron FSDP 那一支只分 1 或 2 个，1 个时不包）。
# - **里面是哪个类**只看三个开关（[`__init__.py:638`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L638)）：
#   `use_distributed_optimizer` → `DistributedOptimizer`；否则 `fp16` 或 `bf16` → `Float16OptimizerWithFloat16Params`；都没有 → `FP32Optimizer`。
# - **grad scaler**：给了 `loss_scale` 就是固定的 `ConstantGradScaler`；否则只有 fp16 才建 `DynamicGradScaler`，初值 2³² = 4294967296；
#   bf16 没有 scaler，loss scale 恒为 1。
# - **grad-stats 群**（范数和 inf 标志在哪里求和）：不分片时是 `tp-pp` 群；分布式优化器时是整个分布式优化器实例（[0, 1]：梯度分散在
#   DP rank 上）；expert 优化器用 expert 的群。群不同时 `ChainedOptimizer.get_grad_norm` 各自求范数再平方相加。
#
# 三个外层类的继承关系：

# %%
from megatron.core.optimizer import ChainedOptimizer, DistributedOptimizer, FP32Optimizer, Float16OptimizerWithFloat16Params

for cls in (FP32Optimizer, Float16OptimizerWithFloat16Params, DistributedOptimizer, ChainedOptimizer):
    print(" → ".join(c.__name__ for c in cls.__mro__[:cls.__mro__.index(object)] if c.__name__ != "ABC"))

# %% [markdown]
# 16 位优化器和分布式优化器共享 `MixedPrecisionOptimizer` 的拷梯度、unscale、查 inf、写回模型，区别只在主参数是整份还是一段。
#
# ### 2. 混合精度与 grad scaler
#
# **权重、梯度、主参数。** 1 个 rank，同一个 4 层模型分别用 bf16 和 fp16 训练 3 步。bf16 按正式入口的缺省在 fp32 里累加梯度
# （`grad_reduce_in_fp32=True`，[`arguments.py:1193`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1193)）；fp16 用 DDP 的缺省（梯度 buffer 也是 fp16）和固定的
# `loss_scale=1024`。学习率特意取得很小（1e-4），看 16 位权重能不能记住这么小的更新：

# %%
def main_params(lr, steps):
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    out = {}
    for name, precision, grad_reduce_in_fp32, loss_scale_value in (("bf16", dict(bf16=True), True, None),
                                                                    ("fp16", dict(fp16=True), False, 1024.0)):
        config = tiny_config(**precision)
        ddp = build(config, DistributedDataParallelConfig(grad_reduce_in_fp32=grad_reduce_in_fp32))
        optimizer = get_megatron_optimizer(
            OptimizerConfig(lr=lr, clip_grad=0.0, loss_scale=loss_scale_value, **precision), [ddp])
        config.grad_scale_func = optimizer.scale_loss  # as train() does: the schedule multiplies the loss
        start = {n: (p.detach().clone(), p.main_param.detach().clone()) for n, p in ddp.module.named_parameters()}
        for _ in range(steps):
            train_step(ddp, optimizer, microbatches(1))
            optimizer.step()
        adam_params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        out[name] = dict(
            rows=mixed_precision.param_rows(ddp), numel=sum(p.numel() for p in ddp.parameters()),
            adam_updates_main=all(id(p.main_param) in adam_params and id(p) not in adam_params for p in ddp.parameters()),
            grad_shares_main_grad=all(p.main_param.grad.data_ptr() == p.main_grad.data_ptr() for p in ddp.parameters()),
            cast_back=mixed_precision.main_matches_param(ddp),
            param_unchanged=sum((p == start[n][0]).sum().item() for n, p in ddp.module.named_parameters()),
            main_unchanged=sum((p.main_param == start[n][1]).sum().item() for n, p in ddp.module.named_parameters()))
    return out


mp = run_ranks(main_params, 1, lr=1e-4, steps=3)[0]

# %% tags=["hide-input"] jupyter={"source_hidden": true}
rows = []
for name, r in mp.items():
    kinds = {(x["param"], x["main_grad"], x["main_param"], x["main_is_copy"], x["main_grad_in_buffer"]) for x in r["rows"]}
    (param, grad, main, copy, in_buffer), = kinds  # every parameter alike
    rows.append([name, len(r["rows"]), param, f"{grad}（在 DDP buffer 里: {in_buffer}）", main, copy,
                 r["grad_shares_main_grad"], r["adam_updates_main"], r["cast_back"],
                 f"{r['param_unchanged']} / {r['numel']}", f"{r['main_unchanged']} / {r['numel']}"])
Table(["模型", "参数个数", "权重", "main_grad", "main_param", "主参数是独立拷贝", "main_param.grad 与 main_grad 同一块内存",
       "AdamW 更新的是主参数", "权重 == 主参数转回 16 位", "3 步后权重没变的元素", "3 步后主参数没变的元素"], rows)

# %% [markdown]
# - **三份数**：前后向用 16 位权重；梯度在 DDP 的 buffer 里（`main_grad`，bf16 时 fp32、fp16 时 fp16）；每个 16 位参数还有一份
#   独立的 fp32 `main_param`，AdamW 参数组里换成的是它。`main_param.grad = main_grad.float()`：bf16 配 fp32 buffer 时两者是同一块内存。
# - **为什么要 fp32 主参数**：bf16 只有 8 位有效数字，1 附近的间距是 2⁻⁷ ≈ 0.0078，1e-4 的更新写回 bf16 就被舍掉：
#   3 步之后一半以上的 bf16 权重一位都没变，fp32 主参数每个元素都变了。主参数把小更新攒起来，攒够了才在 bf16 里体现。
#
# **fp16 的动态 loss scale。** fp16 6e-8 以下直接成 0，小梯度会丢，于是先把 loss 乘 S 再 backward，更新前乘回 1/S；
# 溢出成 inf 时这一步作废、S 减小，一段时间没溢出再变大。三处分别是：正式入口把
# `config.grad_scale_func = optimizer.scale_loss`（[`training.py:3530`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3530)），schedule 在 backward 前用它乘 loss
# （[`schedules.py:562`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L562)）；`_unscale_main_grads_and_check_for_nan` 乘回 1/S 并查 inf；`DynamicGradScaler.update` 调整 S。
# 真实的 fp16 模型跑两组：缺省配置（初值 2³²）跑到第一次更新成功；初值 1024、`loss_scale_window=3`，第 1、2 步往一个梯度里**注入 inf**：

# %%
def fp16_steps(opt_kwargs, inject_at, steps, stop_at_first_update=False):
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(fp16=True)
    ddp = build(config, DistributedDataParallelConfig())
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=0.01, fp16=True, **opt_kwargs), [ddp])
    config.grad_scale_func = optimizer.scale_loss
    scaler = optimizer.chained_optimizers[0].grad_scaler
    rows = []
    for step in range(steps):
        loss = train_step(ddp, optimizer, microbatches(1, seed=step))
        if step in inject_at:
            next(ddp.parameters()).main_grad.view(-1)[0] = float("inf")
        scale = optimizer.get_loss_scale().item()
        scaled_norm = torch.cat([p.main_grad.float().flatten() for p in ddp.parameters()]).norm().item()
        before = by_global_name([ddp], "param")
        update_successful, norm, _ = optimizer.step()
        rows.append([step, scale, step in inject_at, update_successful, "-" if norm is None else round(norm, 2),
                     "-" if norm is None else round(scaled_norm / scale / norm, 3),
                     max_abs_diff(before, by_global_name([ddp], "param")) > 0,
                     optimizer.get_loss_scale().item(), scaler._growth_tracker, scaler._hysteresis_tracker, round(loss, 2)])
        if stop_at_first_update and update_successful:
            break
    return rows


default = run_ranks(fp16_steps, 1, {}, (), 40, stop_at_first_update=True)[0]
controlled = run_ranks(fp16_steps, 1, dict(initial_loss_scale=1024.0, loss_scale_window=3, hysteresis=2), (1, 2), 7)[0]

# %% tags=["hide-input"] jupyter={"source_hidden": true}
header = ["step", "S（前）", "注入 inf", "update_successful", "grad_norm", "‖main_grad‖ / (S·grad_norm)",
          "参数变了", "S（后）", "growth", "hysteresis", "loss"]
print("initial_loss_scale=1024, loss_scale_window=3, hysteresis=2，第 1、2 步注入 inf：")
display(Table(header, controlled))
print(f"缺省配置：前 {len(default) - 1} 步全部溢出、被跳过；第一次成功更新时 scale = {default[-1][1]:.0f}（前 3 步与最后 3 步）")
Table(header, default[:3] + default[-3:])

# %% [markdown]
# - **step 1 注入 inf**：`update_successful=False`、参数一位未变：`ChainedOptimizer.step` 在 `prepare_grads` 报告 inf 后直接返回
#   （[`optimizer.py:1864`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1864)）。scale **没有减半**：`hysteresis=2` 允许一次，计数器从 2 减到 1。
# - **step 2 再注入**：计数器到 0，1024 → 512，同样跳过。**step 3–5 干净**：growth 计数到 `loss_scale_window=3` 时翻倍回 1024，计数器复位。
# - `‖main_grad‖ / (S·grad_norm)` 恒为 1：buffer 里是放大了 S 倍的梯度，返回的范数是 unscale 之后的。
# - 缺省初值 2³² 对这个模型大得离谱，十几步之后才第一次更新；正式入口对这些步不推进学习率，记为 skipped iteration。
#
# 直接驱动真实的 `DynamicGradScaler`，喂一串"是否溢出"：

# %%
def scaler_trace(found_infs, initial_scale, growth_interval, hysteresis):
    scaler = DynamicGradScaler(initial_scale=initial_scale, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                               growth_interval=growth_interval, hysteresis=hysteresis)
    rows = []
    for step, found_inf in enumerate(found_infs):
        before = scaler.scale.item()
        scaler.update(found_inf)
        rows.append([step, found_inf, before, scaler.scale.item(), scaler._growth_tracker, scaler._hysteresis_tracker])
    return rows


found_infs = [False, True, False, True, False, False, False, False, True]
policy = dict(initial_scale=1024.0, growth_interval=4, hysteresis=2)
real = run_ranks(scaler_trace, 1, found_infs, **policy)[0]
print("真实 DynamicGradScaler == snippets.optim.loss_scale.trace:", real == loss_scale.trace(found_infs, **policy))
Table(["step", "found_inf", "scale（前）", "scale（后）", "growth", "hysteresis"], real)

# %% [markdown]
# step 1 和 step 3 的两次溢出**不相邻**（中间 step 2 是干净的），scale 仍在 step 3 减半：hysteresis 计数器只在"增长"时复位，
# 干净的一步不把它加回去（坑 1）。
#
# ### 3. 分布式优化器的切分：bf16 时每个 rank 持有什么
#
# 笔记 15 用 fp32 模型看过分片：那时主参数就是权重的视图，不另占内存。bf16 才是真实训练的情形：2 个 rank、DP=2、
# `grad_reduce_in_fp32=True`，分别用分布式优化器和不分片的优化器各跑 1 步（Adam 的动量在第一步才建），从真实对象里读每个 rank 的 buffer：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TINY = EXPERIMENTS["optimizer-topic"].tiny
results = run_ranks(run, 2, TINY, PAR)            # 每个 rank：先用分布式优化器跑，再不分片跑
buffers, owned, per_parameter = tables(results, TINY, PAR)
display(buffers)
print(owned)

# %% [markdown]
# - **不变的部分**：每个 rank 都有完整的 bf16 权重（DDP 的 param buffer，补齐到 10496，all-gather 就拼进这里）和完整的 fp32 梯度 buffer。
# - **分片的部分**：fp32 主参数和 Adam 的两个动量：rank 0 有 4768 个元素、rank 1 有 4864 个，合起来正好 9632；不分片时各有一整份。
#   这一段是 `_build_model_and_main_param_groups` 里 `shard_model_param.clone().float()` 建的：bf16 时是拷贝，fp32 时只是视图。
#
# 每个参数几个字节，实测对照笔记 15 的公式（bf16 权重 + fp32 梯度：不分片 18，分片 6 + 12/d），以及走完这一步之后的权重：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
per_parameter

# %% [markdown]
# 实测比公式多出的 0.5 字节左右是补齐（10496 个位置放 9632 个参数，16 元素的 norm 参数各占 64 个位置）。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 4. 梯度范数与裁剪跨 rank：谁被算、谁被跳过
#
# 模型共享词嵌入（`gpt_builder` 的缺省），`clip_grad=1.0`。同一个函数跑四种切法：单进程、TP=2、PP=2、TP=2 × DP=2 + 分布式优化器；
# `step()` 之前问 Megatron 自己的谓词每个参数算不算，并录下 `step()` 里的通信：

# %%
def norm_run(tp=1, pp=1, use_distributed_optimizer=False, clip_grad=1.0, steps=1):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    ddp = build(config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer),
                share_embeddings=True)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(lr=0.01, clip_grad=clip_grad, use_distributed_optimizer=use_distributed_optimizer), [ddp])
    dp, r = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    out = []
    for _ in range(steps):
        train_step(ddp, optimizer, microbatches(4)[4 // dp * r:4 // dp * (r + 1)])
        rows, unclipped = grad_norm.norm_rows(ddp), by_global_name([ddp], "main_grad")
        with recorder.record() as calls:
            update_successful, norm, _ = optimizer.step()
        out.append(dict(rows=rows, norm=norm, unclipped=unclipped, clipped=by_global_name([ddp], "main_grad"),
                        calls=[c for c in calls if len(c.ranks) > 1]))
    split = {global_name(ddp.module, n): (p.partition_dim, p.partition_stride)
             if getattr(p, "tensor_model_parallel", False) else None for n, p in ddp.module.named_parameters()}
    return dict(steps=out, params=by_global_name([ddp], "param"), split=split, tp_rank=parallel_state.get_tensor_model_parallel_rank(),
                dp_rank=r, group=torch.distributed.get_process_group_ranks(optimizer.get_grad_stats_parallel_group()))


one = run_ranks(norm_run, 1)[0]
tp2 = run_ranks(norm_run, 2, tp=2)
pp2 = run_ranks(norm_run, 2, pp=2)
tp2dp2 = run_ranks(norm_run, 4, tp=2, use_distributed_optimizer=True)

# %% [markdown]
# 每个参数在每个 rank 上算不算（✓ 计入；× 不计入，括号里是哪个谓词说不；空白：这个 rank 没有它），只列一层：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def mark(row):
    if row is None:
        return ""
    if row["counted"]:
        return "✓"
    return "× TP 复制" if not row["not_tp_duplicate"] else "× shared"


runs = [("TP=2 rank 0", tp2[0]), ("TP=2 rank 1", tp2[1]), ("PP=2 rank 0", pp2[0]), ("PP=2 rank 1", pp2[1])]
by_name = [{x["name"]: x for x in r["steps"][0]["rows"]} for _, r in runs]
names = list(dict.fromkeys(n for rows in by_name for n in rows))
shown = [n for n in names if ".layers." not in n or ".layers.2." in n]
Table(["参数", "TP 切分", *[label for label, _ in runs]],
      [[n.replace("decoder.", ""), next(rows[n]["tensor_model_parallel"] for rows in by_name if n in rows),
        *[mark(rows.get(n)) for rows in by_name]] for n in shown])

# %% [markdown]
# - **TP 复制**：LayerNorm、位置嵌入、final norm 不被 TP 切分，两个 TP rank 各有一份相同的梯度，`param_is_not_tensor_parallel_duplicate`
#   只让 TP rank 0 的那份计入；被切的参数每个 rank 只有自己那片，各自都算。
# - **PP 共享**：PP=2 时最后一个 stage 另存一份词嵌入作输出层，`setup_embeddings_and_output_layer` 给它标 `shared=True`
#   （[`language_module.py:283`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L283)），`param_is_not_shared` 只让第一份计入。
#
# 于是每个梯度元素恰好计入一次。每个 rank 计入的平方和加起来，对照 `step()` 真实返回的范数、单进程的，以及不过滤的"天真"范数：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
reference = one["steps"][0]["norm"]
table = []
for label, results in (("单进程", [one]), ("TP=2", tp2), ("PP=2", pp2), ("TP=2 × DP=2，分布式优化器", tp2dp2)):
    step = [r["steps"][0] for r in results]
    counted = grad_norm.total_norm([s["rows"] for s in step]) if label != "TP=2 × DP=2，分布式优化器" else "-"
    naive = grad_norm.naive_norm([s["rows"] for s in step]) if label != "TP=2 × DP=2，分布式优化器" else "-"
    table.append([label, results[0]["group"], sorted({round(s["norm"], 6) for s in step}), counted, naive,
                  all(abs(s["norm"] - reference) < 1e-6 for s in step)])
Table(["切法", "grad-stats 群", "step() 返回的范数（各 rank）", "计入的平方和开方", "不过滤", "= 单进程（差 < 1e-6）"], table)

# %% [markdown]
# 四种切法返回的都是 1.7747；不过滤的话 TP=2 多算了复制的 norm 参数，PP=2 多算了一整份词嵌入梯度。分布式优化器那一行里
# 每个 rank 只对自己那段 shard 求平方和（shard 带着 TP 属性和 `shared` 标记，同样过滤），四个 rank 的和才是全部。
# `step()` 里的跨 rank 通信（rank 0，第 1 步）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
meanings = {"optimizer/clip_grads.py::get_grad_norm_fp32": "范数：各 rank 计入的平方和相加（SUM）",
            "optimizer/optimizer.py::has_grad_norm_group": "clip_grad > 0：有没有 rank 持有 MTP 参数（MAX，只在第一步问）",
            "distributed/param_and_grad_buffer.py::start_param_sync": "分布式优化器：各 rank 更新过的那段权重拼回完整 buffer"}
for label, results in (("TP=2", tp2), ("PP=2", pp2)):
    print(label)
    display(communication_table(results[0]["steps"][0]["calls"], meanings))
print("TP=2 × DP=2，分布式优化器（第一个群是 intra_dist_opt_group，表里按成员列出）")
communication_table(tp2dp2[0]["steps"][0]["calls"], meanings, ranks=False)

# %% [markdown]
# - 不分片时范数在 `tp-pp` 群 [0, 1] 里求和；DP 不参与（`finalize_model_grads` 之后各 DP rank 的梯度相同，再加就重复）。
#   分布式优化器时群是 [0, 1, 2, 3]：梯度按 DP 分散了，必须连 DP 一起加；末尾的 all-gather 只在 `dp-cp` 群 [0, 2] 里拼 DP 方向的分片。
# - 范数之后那次 `[1]` 的 all-reduce 来自 `has_grad_norm_group`（[`optimizer.py:315`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L315)）：
#   第一步问一次有没有 rank 持有单独裁剪的 MTP 参数，取 MAX 后缓存。
#
# **裁剪。** 范数 1.7747 > `clip_grad=1.0`，每个梯度乘 `1 / (1.7747 + 1e-6)`。只要每个 rank 拿到同一个、正确的总范数，
# 各自就地乘同一个系数，结果就和单进程一样：TP=2 拼回的裁剪后梯度与单进程差 0.0，三种切法走完一步 Adam 后的参数都与单进程 allclose。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def full(results, what, step=None):
    """{global name: full tensor} from the TP shards of the ranks with DP rank 0."""
    ranks = sorted((r for r in results if r["dp_rank"] == 0), key=lambda r: r["tp_rank"])
    values = [r["steps"][step][what] if step is not None else r[what] for r in ranks]
    out = {}
    for name in one["params"]:
        holders = [(r, v[name]) for r, v in zip(ranks, values) if name in v]
        split = holders[0][0]["split"][name]
        out[name] = gather([v for _, v in holders], *split) if split else holders[0][1]
    return out


coeff = 1.0 / (reference + 1e-6)
rows = [["单进程：裁剪后 = 系数 × 裁剪前（逐元素）",
         all(torch.allclose(one["steps"][0]["clipped"][k], coeff * one["steps"][0]["unclipped"][k], atol=1e-7)
             for k in one["params"])]]
for label, results in (("TP=2", tp2), ("PP=2", pp2)):
    rows.append([f"{label}：裁剪后的梯度（拼回）vs 单进程，max |Δ|",
                 max_abs_diff(full(results, "clipped", 0), one["steps"][0]["clipped"])])
for label, results in (("TP=2", tp2), ("PP=2", pp2), ("TP=2 × DP=2，分布式优化器", tp2dp2)):
    rows.append([f"{label}：裁剪后一步 Adam 之后的参数 vs 单进程，allclose(atol=1e-6)",
                 all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full(results, "params").values(), one["params"].values()))])
rows.append(["对照：裁剪前与裁剪后的梯度 max |Δ|（裁剪确实改变了梯度）",
             max_abs_diff(one["steps"][0]["clipped"], one["steps"][0]["unclipped"])])
Markdown(f"<details><summary>裁剪的逐项核对</summary>\n\n{Table(['检查', '结果'], rows).markdown()}\n\n</details>")

# %% [markdown]
# **inf 标志也跨 rank。** 只要有一个 rank 溢出，所有 rank 都必须跳过这一步，否则 TP 的两片权重就不再属于同一个模型。
# TP=2、fp16，只在 TP rank 0 的梯度里注入 inf（代码折叠）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def fp16_tp2_overflow():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(fp16=True, tensor_model_parallel_size=2)
    ddp = build(config, DistributedDataParallelConfig())
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=0.01, fp16=True, initial_loss_scale=1024.0, hysteresis=1), [ddp])
    config.grad_scale_func = optimizer.scale_loss
    train_step(ddp, optimizer, microbatches(2))
    if parallel_state.get_tensor_model_parallel_rank() == 0:
        next(ddp.parameters()).main_grad.view(-1)[0] = float("inf")
    before = by_global_name([ddp], "param")
    with recorder.record() as calls:
        update_successful, _, _ = optimizer.step()
    return dict(injected=parallel_state.get_tensor_model_parallel_rank() == 0, update_successful=update_successful,
                unchanged=max_abs_diff(before, by_global_name([ddp], "param")) == 0,
                scale=optimizer.get_loss_scale().item(), calls=[c for c in calls if len(c.ranks) > 1])


overflow = run_ranks(fp16_tp2_overflow, 2)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(Table(["rank", "注入了 inf", "update_successful", "参数没变", "scale（后）"],
              [[rank, r["injected"], r["update_successful"], r["unchanged"], r["scale"]] for rank, r in enumerate(overflow)]))
communication_table(overflow[1]["calls"], {
    "optimizer/optimizer.py::_unscale_main_grads_and_check_for_nan": "inf 标志取 MAX：任何一个 rank 溢出，全体跳过"})

# %% [markdown]
# rank 1 自己的梯度干净，却也跳过了这一步、scale 也减半：`found_inf` 在 grad-stats 群里做了 MAX all-reduce
# （[`optimizer.py:729`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L729)）。溢出时 step 到此为止，所以只有这一次通信。

# %% [markdown]
# ### 5. overlap grad reduce 与 overlap param gather
#
# 开头那张图的运行：DP=2、分布式优化器，`bucket_size=3000` 切出 3 个 bucket，每步 2 个 micro-batch，跑 2 步；一次两个 overlap
# 开关都关，一次都开。每一步从 schedule 到 `optimizer.step()` 的跨 rank collective 各落在哪里
# （AG = all-gather 参数，RS = reduce-scatter 梯度，AR = `optimizer.step()` 里的 all-reduce）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
bucket_sizes, where, _, timeline, same = overlap_tables(section8, EXPERIMENTS["overlap"].tiny, PAR)
print(bucket_sizes)
where

# %% [markdown]
# - **不 overlap**：每步一次整块的 RS 在 `finalize_model_grads` 里，一次整块的 AG 在 `optimizer.step()` 的末尾
#   （`DistributedOptimizer.step_with_ready_grads` 里 `should_sync_params` 为真的那一支，[`distrib_optimizer.py:3165`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L3165)）。
# - **overlap**：三个 bucket 各一次 RS、各一次 AG。AG 全部移进**下一次 forward**；RS 从第 2 步起移进 **backward**（第 1 步只数
#   每个参数的梯度会报到几次，见[笔记 14](../14_data_parallel_ddp/)）。第 1 步的 forward 里也有 3 次 AG：这时还没有任何 step（坑 2）。
# - **AG 按需发出、预取下一个**：`word_embeddings` 开始 forward 时，pre-hook 发出它的 bucket 2 的 AG 并等它
#   （[`param_and_grad_buffer.py:551`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L551)），随即异步发出 bucket 1 的（[param_and_grad_buffer.py 第 567 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L567)）；顺序与 forward 用参数的顺序一致。
# - **RS 紧跟在 bucket 凑齐之后**：从输出层往回算，bucket 0 的 12 个梯度一算完它的 hook 就发出 RS，后面 25 个梯度还在算。
#
# 图的最后一行就是第 2 步的逐事件记录；真正的"重叠"要 GPU 上独立的通信 stream，这里看到的是发出的时刻。结果是否相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(Markdown(f"<details><summary>第 2 步（overlap）的逐事件记录，rank 0</summary>\n\n{timeline.markdown()}\n\n</details>"))
same

# %% [markdown]
# 同步之后逐位相同（0.0）。但**刚做完 step 时**不同：overlap 时 step 只更新了本 rank 那段，另一段要等下一次 forward 的 AG，
# 这时读参数（存 checkpoint、做评估）读到的是另一半旧值（坑 3）。

# %% [markdown]
# ## 机制解释
#
# **loss scale 的数学。** backward 是线性的：loss 乘 S，每个梯度都乘 S。fp16 的相对精度与数值大小无关，所以放大 S 倍不损失精度，
# 只是把整个梯度分布往 fp16 能表示的区间里挪：太小的不再下溢，太大的溢出成 inf。溢出能检测（乘 1/S 的同时查 inf / nan），下溢不能，
# 所以策略是"尽量大、溢出就退"：每 `loss_scale_window` 步试着翻倍，溢出了减半并丢掉这一步，`hysteresis` 让偶发的一次溢出不立刻减半。
#
# **为什么 bf16 不要 scaler。** bf16 的指数位和 fp32 一样是 8 位，梯度不会下溢或溢出，于是 `grad_scaler` 为 `None`、loss scale 恒为 1，
# `prepare_grads` 连 inf 检查都跳过（坑 4）。它缺的是精度（7 位尾数），由 fp32 主参数和 fp32 梯度 buffer 补上。
#
# **过滤为什么是"按参数"的。** 范数是对每个梯度**元素**求平方和：TP 切过的参数各 rank 持有不同的元素，TP 复制的参数和 PP
# 共享的词嵌入几个 rank 持有相同的元素，所以后者各留一份，再在持有不同元素的 rank 之间求和。
#
# **overlap 为什么能正确。** 梯度归约只要等这个 bucket 的每个参数都报到，与其余 bucket 无关，所以能在 backward 中途发出；参数
# all-gather 只要在第一个用到这个 bucket 的模块 forward 之前完成，所以能推迟到下一次 forward，由 pre-hook 逐个等待、逐个预取。
# 两者改变的只是发出时刻，不改变参与求和的数和求和的群，所以结果逐位相同。

# %% [markdown]
# ## 与训练主链路的关系
#
# - **建**：`setup_model_and_optimizer` 先 `get_model`（包 `Float16Module`、DDP），再 `get_megatron_optimizer`；`--fp16` 且没给
#   `--loss-scale` 时关掉 DDP 的 NaN 检查（[`arguments.py:1177`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1177)）：inf 正是 scaler 要的信号。
# - **每步**：`train` 把 `optimizer.scale_loss` 挂到 `config.grad_scale_func`；`update_successful` 为假时不推进学习率。
# - **overlap**：`--overlap-param-gather` 时正式入口在训练开始时先关掉
#   forward pre-hook，第一次成功的 step 之后才打开（[`training.py:3698`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3698)、[`training.py:3897`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3897)）。
#   代码给的理由是：checkpoint 加载或随机初始化若在某个 rank 上出了错，第一次 all-gather 会把它扩散到所有 rank，而一切正常时
#   这次 all-gather 本来什么也不改。存 checkpoint 和评估前它还会强制同步参数（[`training.py:3045`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3045)）。
# - simple loop 用 torch 的 Adam、fp32，以上都不涉及。

# %% [markdown]
# ## 与基础知识的连接
#
# - **浮点格式**：fp16 = 1 符号 + 5 指数 + 10 尾数，bf16 = 1 + 8 + 7，fp32 = 1 + 8 + 23。fp16 缺范围，bf16 缺精度，混合精度各补其短。
# - **torch 的 AMP `GradScaler`**：同一种思路（增长间隔 2000、回退 0.5、增长 2），没有 hysteresis；Megatron 的 inf 标志还要跨 rank 取 MAX。
# - **`torch.nn.utils.clip_grad_norm_`**：同样的数学，分布式时只是把平方和拆到持有不同元素的 rank 上再 all-reduce。
# - **ZeRO-1**：分布式优化器分片的是主参数和动量，权重和梯度 buffer 仍是完整的（笔记 15）。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# **1. hysteresis 不是"连续"溢出（运行见第 2 节最后一张表）。** 说明写的是连续 `hysteresis` 次溢出才减小 scale，代码里计数器只在
# 增长时复位（[`grad_scaler.py::DynamicGradScaler.update`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/grad_scaler.py#L131)）。减半一次之后，直到下一次增长（缺省要 1000 步）**每一次**溢出都减半。
#
# **2. `overlap_param_gather` 在第一次 `step()` 之前就 all-gather（运行见第 5 节的表）。** bucket group 的 `param_gather_dispatched`
# 初值为假，第一个 pre-hook 就发出。各 rank 权重一致时它什么也不改，但会把某个 rank 加载或初始化出的错扩散开；正式入口因此先关掉
# pre-hook，直接用 Megatron Core 时没有这层保护。`step_with_ready_grads` 的注释说第一个 all-gather 在下一次 `zero_grad()` 里发出
# （[`distrib_optimizer.py:3179`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L3179)），但 [`distrib_optimizer.py::DistributedOptimizer.zero_grad`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2558) 只清梯度。
#
# **3. overlap 时 step 之后参数有一半是旧的（运行见第 5 节最后一张表）。** max |Δ| 0.0101（约一个 lr），直到下一次 forward；
# 在这之间读参数前要 `ddp.start_param_sync(force_sync=True)`。
#
# **4. bf16 时优化器不查 inf。** bf16 没有 grad scaler，`prepare_grads` 跳过 unscale 和 inf 检查
# （[`optimizer.py:741`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L741) 里 `if self.grad_scaler:` 那一支）。往 bf16 的一个梯度元素里注入 inf，连跑两步：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def bf16_inf():
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(bf16=True)
    ddp = build(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True))
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=0.01, bf16=True), [ddp])
    rows = []
    for step in range(2):
        loss = train_step(ddp, optimizer, microbatches(1))
        if step == 0:
            next(ddp.parameters()).main_grad.view(-1)[0] = float("inf")
        update_successful, norm, _ = optimizer.step()
        rows.append([step, step == 0, loss, update_successful, norm,
                     sum((p.main_grad == 0).sum().item() for p in ddp.parameters()),
                     sum(p.isnan().sum().item() for p in ddp.parameters())])
    return rows


Table(["step", "注入 inf", "loss", "update_successful", "grad_norm", "step 后为 0 的梯度元素", "step 后是 NaN 的权重（共 9632）"],
      run_ranks(bf16_inf, 1)[0])

# %% [markdown]
# 第 0 步 `step()` 照样返回成功：范数 inf，裁剪系数 0 把其余 9631 个梯度乘成 0，inf 乘 0 成了 NaN 写进一个权重；第 1 步
# 大多数权重变成 NaN。新增的 `grad_norm_skip_threshold` 缺省不启用，设了也不拦 NaN 范数。正式入口靠 DDP 的 `check_for_nan_in_grad`
# 兜底（[`training.py:1989`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1989)）；只用 Megatron Core 时，一个坏 batch 会静默毁掉 bf16 的权重。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# 本篇用到的 CPU 补丁（[在 CPU 上运行](../../cpu/)）：
#
# - `grad_scaler_device`：两个 scaler 用写死的 `device='cuda'` 建 scale 张量（[`grad_scaler.py:20`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/grad_scaler.py#L20)）。
# - `float16_optimizer_type_check`：16 位优化器按 `param.type()` 的 CUDA 类型名分类，CPU 上 `TypeError`（[`optimizer.py:1009`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1009)）。
# - `distrib_optimizer_init_type_check`：分布式优化器给 16 位参数放 `main_param = None` 占位的那个判断在 CPU 上**静默**不成立
#   （[`distrib_optimizer.py:758`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L758)）：不拥有的参数就没有 `main_param` 属性，读它的代码（正式入口的参数范数）
#   会退回用完整权重、在每个 DP rank 上重复计数。
# - `shared_embedding_cuda`：PP>1 共享词嵌入时最后一个 stage 的 `weight.data.cuda()`（[`language_module.py:307`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L307)，笔记 13 也提到）。
# - `clip_grads_type_check`：`clip_grad_by_total_norm_fp32` 的类型检查（笔记 06）。
#
# fp16 的数值在 CPU 上与 GPU 不同（矩阵乘的累加方式不同），所以第 2 节"缺省配置跳过 16 步"只属于这台机器和这个小模型。
# 第 4 节 `tp2dp2` 的 `intra_dist_opt_group` 不是 `parallel_state` 有名字的群，通信表按成员列出。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. fp16、不给 `loss_scale` 时 `get_megatron_optimizer` 建出什么？loss scale 初值是多少？bf16 呢？**
#
# <details><summary>答案</summary>
#
# fp16：`ChainedOptimizer` 里一个 `Float16OptimizerWithFloat16Params`，带 `DynamicGradScaler`，初值 `initial_loss_scale` = 2³²。
# bf16：同一个类，但没有 scaler，loss scale 恒为 1。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([row for row in created if row[0] in ("fp16", "bf16")])

# %% [markdown]
# **2. `hysteresis=2`、`loss_scale_window=1000`、初值 1024，溢出序列是"溢出、干净、溢出"。第 3 步后 scale 是多少？**
#
# <details><summary>答案</summary>
#
# 512。第一次溢出把 hysteresis 计数从 2 减到 1；干净的一步只让 growth 计数加一，不把 hysteresis 加回去；第二次溢出计数到 0，减半。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(run_ranks(scaler_trace, 1, [True, False, True], initial_scale=1024.0, growth_interval=1000, hysteresis=2)[0][-1])

# %% [markdown]
# **3. bf16 权重 + fp32 梯度、分布式优化器、DP=4，每个参数每个 rank 几个字节？比不分片省多少？**
#
# <details><summary>答案</summary>
#
# 2（bf16 权重）+ 4（fp32 梯度）+ (4 主参数 + 8 动量) / 4 = 9 字节；不分片 18 字节，省一半。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(optimizer_memory.bytes_per_parameter("bf16", "fp32", 4, True), optimizer_memory.bytes_per_parameter("bf16", "fp32", 4, False))

# %% [markdown]
# **4. TP=2 时，不过滤的"天真"范数比真实范数多算了哪些梯度？多算的平方和是多少？**
#
# <details><summary>答案</summary>
#
# TP rank 1 上那些没被 TP 切分的参数（各层的 LayerNorm weight / bias、位置嵌入、final norm）：它们与 rank 0 的梯度相同。
# 天真范数² − 真实范数² 正好等于 rank 1 上这些参数的平方和。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
step0 = [r["steps"][0]["rows"] for r in tp2]
extra = sum(x["sumsq"] for rows in step0 for x in rows if not x["counted"])
print(sorted({x["name"].split(".")[-2] + "." + x["name"].split(".")[-1] for x in step0[1] if not x["counted"]}))
print(round(grad_norm.naive_norm(step0) ** 2 - grad_norm.total_norm(step0) ** 2, 6), round(extra, 6))

# %% [markdown]
# **5. overlap 时，第 2 步的第一次 reduce-scatter 在 backward 里算完了几个梯度之后发出？为什么是它？**
#
# <details><summary>答案</summary>
#
# 12 个：`output_layer.weight`、final norm 的两个、第 4 层（下标 3）的 8 个，再到第 3 层（下标 2）的 `linear_fc2`——它们是 bucket 0
# 的全部参数。buffer 倒序排放参数，bucket 0 正是 backward 最先算完的那些，所以它最先凑齐、最先发出。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
since_forward = []
for event in section8[0]["overlapped"][1]:
    if isinstance(event, overlap_timeline.Marker):
        since_forward = [] if event.kind == "forward" else since_forward + [event.name]
    elif not isinstance(event, str) and event.api == "reduce_scatter_tensor":
        break
print(len(since_forward), since_forward[0], "…", since_forward[-1])

# %% [markdown]
# **6. 两个 model chunk（interleaved PP）、分布式优化器、开 `overlap_param_gather_with_optimizer_step`，模型还有 MoE 层：`ChainedOptimizer` 里有几个内层优化器？各管什么？**
#
# <details><summary>答案</summary>
#
# 3 个：第一个 chunk 的稠密参数一个（它更新完就先发自己的参数 all-gather），其余 chunk 的稠密参数一个，所有 chunk 的 expert 参数一个。
# 不开这个开关时是 2 个，没有 MoE 时再少一个。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({row[0]: (row[2], row[3]) for row in created if "chunk" in row[0] or "同上" in row[0]})

# %% [markdown]
# ## 30-second answer
#
# `get_megatron_optimizer` returns a `ChainedOptimizer` of one to three inner optimizers: dense parameters (two when
# `overlap_param_gather_with_optimizer_step` splits off the first chunk), plus one for experts. Each is a `DistributedOptimizer`,
# else `Float16OptimizerWithFloat16Params` for fp16/bf16, else `FP32Optimizer`. Adam updates fp32 main copies of the 16-bit
# weights. fp16's dynamic loss scale skips a step with an inf on any rank and halves after `hysteresis` overflows. The grad
# norm counts TP-replicated and PP-shared parameters once, so every split gives the one-process norm. Overlap only moves
# when buckets communicate.
