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
# # 01 训练全景：simple loop 与正式入口的一一对应
#
# Megatron 的一个训练步由哪几个调用组成，谁负责让它们配合？官方给新手的 `examples/run_simple_mcore_train_loop.py`
# 只用 Megatron Core 把这些调用手工接在一起；照原样在两个 rank（TP=2）上跑 5 步，loss 不降，权重一步也不动。
# 它缺了什么，正式入口 `pretrain_gpt.py` → `megatron/training/training.py` 又是在哪里补上的？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出一个正确的 Megatron 训练步要哪几个调用、按什么顺序，正式入口的 `train_step` 在哪几行做它们。
# 2. 用运行说明 simple loop 原样跑时权重为什么不动、`main_grad` 为什么越来越大，改哪两处就对了。
# 3. 给 simple loop 的每一步找到正式入口里对应的函数。
# 4. 指出原脚本另外两处接线问题：CPU 生成器没有种子；`finalize_model_grads` 在 TP 群里并不做注释说的事。
#
# **结论**
#
# - 原样跑 5 步（TP=2）：权重最大变化 0.0，loss 只在 4.6 附近晃（4.6061 → 4.6045），优化器一次也没更新。
# - 原因：DDP 把梯度放进 `main_grad` 并把 `param.grad` 置空，`torch.optim.Adam` 跳过每个参数；`main_grad` 从不清零，范数 0.52 → 2.46。
# - 只改两处（`get_megatron_optimizer`、每步 `zero_grad_buffer()`）：loss 4.6061 → 4.5466，权重每步移动 0.001（= lr）。
# - 正式入口的 `train_step` 就按这个顺序：`zero_grad_buffer` 2361 行 → `forward_backward_func` 2407 → `optimizer.step()` 2474。
# - 原脚本不给 CPU 生成器种子：两个 TP rank 读到不同的 batch，连 position embedding 的初值也不同。
# - 注释说 `finalize_model_grads` 在 TP 间同步 LayerNorm 梯度；原脚本不开序列并行，它在 TP 群一次也不通信。
#
# 先读：无，这是第一篇（会写 PyTorch 的训练循环即可，见[与基础知识的连接](#与基础知识的连接)）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import inspect
import logging

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n01_overview import (
    checkpoint_line, first_batches, layernorm_sync, layernorm_table, log_table, mock_train_dataset, note_runs,
    reads_table, run, simple_loop, wiring,
)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.train import pictures

logging.getLogger("megatron.core").setLevel(logging.ERROR)  # mock 数据集建索引时的提示
TINY = EXPERIMENTS["overview"].tiny
runs = run_ranks(note_runs, 2, TINY, Parallel(world=2, tp=2), grid=dict(tp=2))
as_published, fixed = [r[0][0] for r in runs], [r[0][1] for r in runs]
wired = [r[1] for r in runs]

from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tokenizers import MegatronTokenizer
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.training.training import train_step

pictures.draw_loop_runs(log_table(as_published).rows, log_table(fixed).rows)

# %% [markdown]
# 左：每步 backward 之后 rank 0 的 `main_grad` 范数；右：权重相对初值的最大变化。红是原样（`torch.optim.Adam`），
# 绿是只改两处的同一个循环；两次运行的初值、数据顺序都相同。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 一次启动：本机用 gloo 起 2 个进程（TP=2，`snippets.ranks.launch.run_ranks`），每个进程跑
#   `snippets/experiments/n01_overview.py` 的 `note_runs`：先 `run`（原样、改后各跑一遍 `simple_loop`），再 `wiring`
#   （种子一节的 `first_batches`，finalize 一节的 `layernorm_sync`）。结果回到 notebook 进程打印、作图。
# - `simple_loop` 逐行复现原脚本的 `__main__`，每行右边的注释是原脚本的行号。参数 `megatron_optimizer=True` 时只换两处：
#   `get_megatron_optimizer` 代替 `torch.optim.Adam`，每步先 `zero_grad_buffer()`。checkpoint 目录由 rank 0 在临时目录里建好、
#   把路径广播给其他 rank，跑完删掉。
# - 尺寸 `dims` 取实验的 `tiny`，正是原脚本的尺寸：2 层、hidden 12、4 个头、vocab 100、序列 64、micro-batch 8、每步 1 个 micro-batch。
# - 为 CPU 改的地方见文末「在 CPU 上怎么跑的」。
# - 命令行复现两张 loss 表：`.venv/bin/python -m snippets.run --nproc-per-node 2 overview --tp 2`；
#   重新执行整页：`scripts/execute_notes.sh notes/01_training_run_overview.py`。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(simple_loop, run)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`run_simple_mcore_train_loop.py:243`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L243) | simple loop 的优化器：`torch.optim.Adam(gpt_model.parameters())` |
# | [`run_simple_mcore_train_loop.py:251`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L251) | 每步开头的 `optim.zero_grad()` |
# | [`run_simple_mcore_train_loop.py:267`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L267) | 显式调用 `finalize_model_grads([gpt_model])` |
# | [`run_simple_mcore_train_loop.py:269`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L269) | `optim.step()` |
# | [`distributed_data_parallel.py:494`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L494) | DDP 的 backward hook 把 `param.grad` 置为 `None` |
# | [`training.py::pretrain`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1014) | 正式入口总控 |
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 建模型（含 DDP）+ `get_megatron_optimizer` + 续训时 `load_checkpoint` |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 清零 buffer → schedule → `optimizer.step()` |
#
# <details><summary>另外 12 个符号</summary>
#
# | 符号 | 角色 |
# |---|---|
# | [`run_simple_mcore_train_loop.py::initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L29) | `init_process_group` + `initialize_model_parallel` |
# | [`run_simple_mcore_train_loop.py::model_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L57) | 2 层、hidden 12、vocab 100 的 `GPTModel` |
# | [`run_simple_mcore_train_loop.py::get_train_data_iterator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L82) | `MockGPTDataset` + torch `DataLoader` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | 取 batch、forward、返回带 loss mask 的 `loss_func` |
# | [`run_simple_mcore_train_loop.py::save_distributed_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L169) | `sharded_state_dict` + `dist_checkpointing.save` |
# | [`run_simple_mcore_train_loop.py::load_distributed_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L193) | `dist_checkpointing.load` + `load_state_dict` |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | 正式入口的 forward_step |
# | [`arguments.py::parse_and_validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L87) | 在 `pretrain_gpt.py` 的 `__main__` 里解析、校验命令行，存成全局 `args` |
# | [`argument_utils.py::gpt_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L433) | `args` → `GPTModelConfig`（内含 `TransformerConfig`，笔记 04） |
# | [`argument_utils.py::pretrain_cfg_container_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L534) | `args` + 模型配置 → `PretrainConfigContainer`（训练、优化器、DDP、checkpoint… 各一份配置） |
# | [`initialize.py::initialize_megatron`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L42) | 读已解析的 `args`、建群、设种子 |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342) | 训练循环：每步 `train_step`，按间隔 `save_checkpoint` |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 正式入口的调用树，右边 `←` 是 simple loop 里做同一件事的那一行：
#
# ```text
# pretrain_gpt.py  (__main__)
# ├─ arguments.py::parse_and_validate_args                 # 解析命令行，存成全局 args
# ├─ argument_utils.py::gpt_config_from_args              # args → GPTModelConfig         ← model_provider 里手写的 TransformerConfig(...)
# ├─ argument_utils.py::pretrain_cfg_container_from_args  # → PretrainConfigContainer
# └─ megatron/training/training.py::pretrain(full_config, ...)
#    ├─ initialize.py::initialize_megatron                  # 建群、种子                    ← initialize_distributed + model_parallel_cuda_manual_seed
#    ├─ setup_model_and_optimizer(model_type, ..., cfg_container=...)
#    │  ├─ GPTModelBuilder.build_distributed_models → DDP  # 建模型、grad buffer          ← model_provider + DistributedDataParallel(...)
#    │  ├─ get_megatron_optimizer(...)                      #                             ← torch.optim.Adam（问题所在）
#    │  └─ checkpointing.py::load_checkpoint                # 续训时加载                    ← load_distributed_checkpoint（放在最后演示）
#    ├─ build_train_valid_test_data_iterators               # MockGPTDataset / GPTDataset  ← get_train_data_iterator
#    └─ train
#       ├─ train_step
#       │  ├─ zero_grad_buffer(); optimizer.zero_grad()     #                             ← 只有 optim.zero_grad()
#       │  ├─ forward_backward_func(forward_step, ...)      # TP 通信在层里                 ← forward_backward_func(forward_step_func, ...)
#       │  │  └─ finalize_model_grads                       # 梯度归约（grad sync）         ← finalize_model_grads([gpt_model])（显式调用）
#       │  └─ optimizer.step()                              # 范数、裁剪、Adam               ← optim.step()
#       └─ checkpointing.py::save_checkpoint                # 每 --save-interval 步         ← save_distributed_checkpoint
# ```
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# simple loop 的函数（最后一列是正式入口里做同一件事的函数）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | 对应正式入口 |
# |---|---|---|---|---|---|---|---|
# | `initialize_distributed` | TP、PP 大小 | 无（建好全局群） | `parallel_state.initialize_model_parallel` | 是：建全部群 | 否 | 否 | `initialize_megatron` |
# | `model_provider` | 无 | `GPTModel` | `TransformerConfig`、`GPTModel`、local spec | 读 TP 群决定切片 | 权重按 TP 切 | 是：建参数 | `setup_model_and_optimizer` 里的 `GPTModelBuilder.build_distributed_models`（不给配置时退回 `get_model(model_provider_func)`） |
# | `get_train_data_iterator` | 无 | batch 迭代器（每个 TP rank 各自一份） | `BlendedMegatronDatasetBuilder`、`MockGPTDataset` | 否 | 否：不看 TP 群；每个 rank 的 `DataLoader(shuffle=True)` 用本进程的 CPU 默认生成器打乱，原脚本没有给它种子，所以各 TP rank 读的样本不同（下文运行） | 否 | `build_train_valid_test_data_iterators` |
# | `forward_step_func` | 迭代器、model | `(output, loss_func)` | `GPTModel.forward` | 间接：TP 层与 vocab 并行 CE | TP | 否 | `pretrain_gpt.py::forward_step` |
# | `save_distributed_checkpoint` | 路径、model | 磁盘文件 | `sharded_state_dict`、`dist_checkpointing.save` | 是 | 按 ShardedTensor 写 | 否 | `save_checkpoint` |
# | `load_distributed_checkpoint` | 路径、model | 填好权重的 model | `dist_checkpointing.load` | 是 | 按当前切法读 | 是 | `load_checkpoint` |
#
# 正式入口的三个函数（行号是 `training.py` 里的调用处；`setup_model_and_optimizer` 这一行笔记 04、15 链接到这里）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::pretrain` | 配置容器 `cfg_container`、数据集 provider、`model_type`、`forward_step`（`model_provider` 退为可缺省的关键字参数，`pretrain_gpt.py` 不再传它；`args` 已在 `__main__` 解析好） | 无（返回 `None`；训练结果在 checkpoint 里） | 经 `initialize_megatron`（[training.py:1091](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1091)）调 `parallel_state.initialize_model_parallel` 与 `model_parallel_cuda_manual_seed`；`setup_model_and_optimizer`（[training.py:1228](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1228)）；`build_train_valid_test_data_iterators`（[training.py:1362](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1362)）里的 `BlendedMegatronDatasetBuilder`；`train`（[training.py:1423](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1423)） | 是：`initialize_megatron` 建全部群 | 不直接切：交给下面两个函数与数据迭代器 | 是：从头到尾 | 整个 `__main__` |
# | `training.py::setup_model_and_optimizer` | `model_type`、`model_provider_func`（可缺省）、`checkpointing_context`，以及只能按关键字传的 `cfg_container`、`pg_collection` | `(model, optimizer, opt_param_scheduler)`，`model` 是每个 virtual stage 一个 DDP 包装的列表（[training.py:2286](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2286)） | `cfg_container.model` 有值时（`pretrain_gpt.py` 总是给）由它的 builder 建模型并包 `DistributedDataParallel`（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)，[`gpt.py::GPTModelBuilder.build_distributed_models`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L331)），否则退回 `get_model(model_provider_func, ...)`（[training.py:2061](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2061)）；`get_megatron_optimizer`（[training.py:2132](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2132)）、续训时 `load_checkpoint` 里的 `dist_checkpointing`（[training.py:2199](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)） | 是：模型按 TP / PP 群建，DDP 记下 dp-cp 群，分布式优化器在 buffer 的 dp-cp 群（专家参数在 expert-DP 群）上分片（[笔记 15](../15_distributed_optimizer/)） | 权重按 TP / PP 切；`--use-distributed-optimizer` 时优化器状态按 DP×CP 切 | 是：建参数、grad buffer、优化器状态；续训时从 checkpoint 读回参数与 `args.iteration` | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` + `Adam(...)`（+ `load_distributed_checkpoint`） |
# | `training.py::train_step` | `forward_step`、`data_iterator`、model 块列表、optimizer、`opt_param_scheduler`、config、`forward_backward_func` | 元组 `(loss_reduced, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, …)` | 每块 `zero_grad_buffer`（[training.py:2361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)）、schedule 的 `forward_backward_func`（[training.py:2407](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2407)，末尾经 `config.finalize_model_grads_func` 做梯度归约）、`MegatronOptimizer.step`（[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)） | 是：dp-cp（梯度归约；日志用的 loss 在 dp-cp 群 all-reduce，[training.py:2547](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2547)）、tp-pp（梯度范数） | batch 已按 DP 切、再按 micro-batch 切；参数按 TP / PP 切 | 是：参数、优化器状态、学习率（`opt_param_scheduler.step`，[training.py:2528](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2528)）、iterator 前进 | 循环体：`optim.zero_grad()` → `forward_backward_func(...)` → `finalize_model_grads([gpt_model])` → `optim.step()` |
#
# > **旧版（core_v0.18.0）：** `pretrain_gpt.py` 还把 `partial(model_provider, gpt_builder)` 作为第三个位置参数传给 `pretrain`（[pretrain_gpt.py:400](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/pretrain_gpt.py#L400)），`pretrain_cfg_container_from_args(args)` 不带模型配置；`setup_model_and_optimizer(model_provider_func, model_type, checkpointing_context)` 的前两个参数与 0.19.0 相反、没有 `cfg_container`，总是经 `get_model` 建模型（[training.py:1954](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/training/training.py#L1954)）。
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 原样的 simple loop：loss 和权重
#
# 原脚本的 `__main__`（[run_simple_mcore_train_loop.py:221](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L221)）依次：
# 建群（TP=2）→ `model_parallel_cuda_manual_seed(123)` → 2 层的 `GPTModel` → 套一层 Megatron 的 `DistributedDataParallel`
# → `torch.optim.Adam` → mock 数据的 `DataLoader` → 5 次 {`optim.zero_grad()`、`forward_backward_func`、`finalize_model_grads`、
# `optim.step()`} → 存、读 checkpoint。原样跑 5 步，每步 rank 0 的 loss、权重相对初值的最大变化、`main_grad` 的范数、
# `param.grad` 是否全是 `None`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
log_table(as_published)

# %% [markdown]
# **权重一步也没动，`main_grad` 却越来越大。** 原因都在接线上：
#
# 1. Megatron 的 DDP 在 backward 里把每个参数的梯度累加进 `param.main_grad`，随即把 `param.grad` 置为 `None`
#    （[distributed_data_parallel.py:494](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L494)）。
#    为什么这样设计，见[笔记 06](../06_gradient_sync_and_optimizer/)（梯度同步）和[笔记 14](../14_data_parallel_ddp/)（DDP 的 grad buffer）。
#    `torch.optim.Adam` 只读 `param.grad`，是 `None` 就跳过，于是 :269 的 `optim.step()` 什么也不改。
# 2. :251 的 `optim.zero_grad()` 只清 `param.grad`；清 `main_grad` 的是 DDP 的 `zero_grad_buffer()`，循环里从没调用。
#    每步的梯度相近，范数近似线性增长：0.52、1.02、1.54、1.99、2.46。
# 3. loss 只随 batch 波动：vocab 100 上均匀猜测的交叉熵是 ln 100 ≈ 4.6052，模型一直停在初值。
#
# checkpoint 那部分是对的：存下再读回，两个 rank 都没有缺失或多余的键，权重逐位复原：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(checkpoint_line("原样：", as_published))

# %% [markdown]
# ### 只改两处：正式入口的做法
#
# 优化器换成 `get_megatron_optimizer`（它读 `main_grad`），每步开头先 `zero_grad_buffer()`；初值、数据顺序都不变：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
log_table(fixed)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(checkpoint_line("改后：", fixed))
print("第 0 步 loss 相同（还没有更新）:", as_published[0]["log"][0]["loss"] == fixed[0]["log"][0]["loss"])

# %% [markdown]
# 第 0 步 loss 两者相同（还没更新）；之后一路降到 4.5466，权重每步移动 0.001，正是 Adam 早期每步约 `lr` 的步长；
# `main_grad` 每步重新累积，范数停在 0.4–0.5。
#
# 正式入口不靠调用者记住这两处：`train_step` 每步自己按这个顺序调用。在 0.19.0 的源码里找这几个调用所在的行：

# %%
lines, first = inspect.getsourcelines(train_step)
calls = ("zero_grad_buffer()", "optimizer.zero_grad()", "forward_backward_func(", "optimizer.step()")
{call: first + next(i for i, line in enumerate(lines) if call in line) for call in calls}

# %% [markdown]
# 清零在前（先对每个模型块清 grad buffer，再清优化器那边），然后是 schedule，最后是 step。`finalize_model_grads` 不在这张单子上：
# 正式入口在 `train` 里把它挂到 `config.finalize_model_grads_func`（[training.py:3550](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3550)），
# schedule 在最后一个 micro-batch 的 backward 之后调用它（PP=1 的 schedule 在 [schedules.py:836](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L836)）。
# simple loop 的 `model_provider` 建的 config 没有挂，所以脚本在 schedule 返回后自己调：

# %%
config = TransformerConfig(num_layers=2, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True)
print("PP=1 的 schedule:", get_forward_backward_func(pp_size=1, vp_size=None).__name__,
      "| config.finalize_model_grads_func:", config.finalize_model_grads_func)

# %% [markdown]
# ### 没有 `torch.manual_seed` 时，每个 TP rank 读到什么
#
# 原脚本唯一的种子是 `model_parallel_cuda_manual_seed(123)`：它给 CUDA 默认生成器设种子
# （[random.py:490](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)），再建 TP / EP 的 RNG 流，
# CPU 默认生成器它不碰。torch 在每个新进程里用操作系统的随机数给 CPU 生成器设种子，`torchrun` 起的每个 rank 都是新进程。
# 于是 `use_cpu_initialization=True` 的初值和 `DataLoader(shuffle=True)`（[run_simple_mcore_train_loop.py:117](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L117)）
# 的打乱都取决于一个没人设过的种子。让每个 rank 从不确定的种子出发走到前两个 batch，再加 `torch.manual_seed(123)` 对照：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(first_batches, wiring)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
reads_table(wired)

# %% [markdown]
# 原样时，TP rank 1 的两个 batch 和 position embedding（每个 TP rank 都整份持有的参数）都与 rank 0 不同。
# TP 的两个 rank 本该是同一个模型在同一批数据上的两半；这里它们各算各的 token，层里的 all-reduce 照样把两半相加，
# 不报错，结果却不是任何一个 batch 上的那个模型。加上种子后逐位相同。正式入口两头都管：
# `initialize_megatron` 里的 `_set_random_seed` 调 `torch.manual_seed`（[initialize.py:446](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L446)），
# 数据只让 TP rank 0 读、再在 TP 群广播（[pretrain_gpt.py:124](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L124)，[笔记 03](../03_data_and_batch_flow/)）。
#
# ### `finalize_model_grads` 在 TP 群里做什么
#
# 原脚本在 `finalize_model_grads([gpt_model])` 上方的注释（[run_simple_mcore_train_loop.py:264](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L264)）
# 说它在 TP rank 之间同步 LayerNorm 这类不切分参数的梯度。在 TP=2 上做一次 forward / backward，看 `finalize_model_grads`
# 前后各 rank 的这些梯度、它在 TP 群发出的通信：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(layernorm_sync)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
layernorm_table(wired)

# %% [markdown]
# 第一行是原脚本的设定：15 个不切分参数的梯度在 backward 之后各 TP rank 本来就相同（norm 的输入在每个 TP rank 上是同一份
# 完整激活），`finalize_model_grads` 在 TP 群里一次通信也不发。它在 TP 群只归约两类参数
# （[finalize_model_grads.py:416](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416)）：
# 序列并行（SP，见[笔记 11](../11_transformer_layer/)）标记过的参数和 QK layernorm 的参数。第二行开了 SP 作对照，
# 这时才有一次 `[168]` 的 all-reduce。所以那句注释对原脚本不成立。
#
# 第二行用的 local spec 在上游开不了 SP：没有 Apex 时它的 norm 一见 SP 就断言失败（[torch_norm.py:50](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L50)），
# 这一行能跑，靠的是「在 CPU 上怎么跑的」里说的那处改动；GPU 上要开 SP，用 Transformer Engine 的 spec。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# TP=2、DP=1 时，一个训练步里的张量经过这些群（每一项在后面的笔记里细讲）：
#
# - **forward / backward**：tp 群 `[0, 1]`。ColumnParallel / RowParallel 层的 all-reduce，vocab 并行交叉熵的 all-reduce
#   （[笔记 09](../09_tp_mappings/)、[10](../10_column_row_parallel_linear/)、[12](../12_vocab_parallel/)）。
# - **grad sync**（`finalize_model_grads`）：dp-cp 群上的梯度平均，这里群里只有自己，什么也不交换（笔记 06、14）；
#   tp 群只在开 SP 或 QK layernorm 时用到（上一节）。
# - **optimizer step**：模型并行群（这里也是 `[0, 1]`）上求梯度范数（笔记 06）。
# - **checkpoint**：存、读时全体 rank 协调各自写、读哪一片（[笔记 07](../07_checkpointing/)）。
# - **batch**：原脚本每个 TP rank 各读各的；正式入口只让 TP rank 0 读，再在 tp 群广播（笔记 03）。

# %% [markdown]
# ## 机制解释
#
# 正式入口和 simple loop 做的是同一串 Core 调用，差别在"谁负责让它们配合"。
#
# **梯度住在哪里，决定用哪个优化器。** Megatron 的 DDP 不让梯度留在 `param.grad`：它把梯度累加进一块连续的 grad buffer，
# `main_grad` 是每个参数在这块 buffer 里的视图，DP 归约按 bucket 一次发一大块（笔记 14）。能读这块 buffer 的优化器来自
# `get_megatron_optimizer`：step 开头它把 `main_grad` 交给内部的 torch Adam（fp32 训练时直接让 `param.grad` 指向它，笔记 06 有运行）。
# 所以"Megatron DDP + 普通 torch 优化器"这个组合本身就是错的；它不报错，只因为 `param.grad is None` 在 torch 里是合法的
# "这个参数没有梯度"。
#
# **清零为什么要显式、而且在 step 开头。** 一个 step 有多个 micro-batch，buffer 要在它们之间累加，所以 backward 不能清它；
# 只有在下一步开始前清。`train_step` 先对每个模型块调 `zero_grad_buffer()`，再调 `optimizer.zero_grad()` 清优化器那边的梯度。
# simple loop 只做了后一半，于是 `main_grad` 把 5 步的梯度都加在一起。
#
# **为什么 `finalize_model_grads` 交给 schedule。** 只有 schedule 知道最后一个 micro-batch 的 backward 何时结束；流水线下
# 各 stage 结束得不一样，开了 overlap 时 DP 归约早已在 backward 里按 bucket 发出，finalize 只是等它们完成（笔记 14）。
# 挂在 config 上，由 schedule 在正确的时刻调用，调用者就不必记得。simple loop 手动调，效果相同，但多了一件要记住的事。
#
# **step 的返回值。** Megatron 优化器的 `step()` 返回 `(update_successful, grad_norm, num_zeros)`
# （[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)）：混合精度下发现 inf / nan 就跳过这一步并返回
# `False`，范数用于裁剪和日志。torch 的 `step()` 没有"跳过"的概念。

# %% [markdown]
# ## 与训练主链路的关系
#
# 本篇就是主链路的目录：初始化 → 建模型（DDP）→ 建优化器 → 数据迭代器 → 循环 {清零、forward/backward、梯度归约、step}
# → 保存 / 加载。后面每一篇对应其中一格：初始化见[笔记 02](../02_distributed_initialization/)，数据见[笔记 03](../03_data_and_batch_flow/)，
# 模型见[笔记 04](../04_model_provider_and_gpt_model/)，forward / backward 见[笔记 05](../05_forward_loss_backward/)，
# 梯度同步与优化器见[笔记 06](../06_gradient_sync_and_optimizer/)，checkpoint 见[笔记 07](../07_checkpointing/)。

# %% [markdown]
# ## 与基础知识的连接
#
# - **PyTorch 的训练循环**：`zero_grad` → `loss.backward()` → `step`。Megatron 把 backward 包进 schedule（为了 micro-batch
#   与流水线），把 `.grad` 换成连续 buffer 里的 `main_grad`（为了通信与混合精度），所以清零和优化器也都换成认得
#   `main_grad` 的那一套。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **simple loop 的优化器不更新权重（第一张表）。** [`run_simple_mcore_train_loop.py:243`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L243)
#    的 `torch.optim.Adam` 读不到 `main_grad`。修法：换 `get_megatron_optimizer` 并每步清零 buffer
#    （或在 `optim.step()` 前把 `main_grad` 赋给 `param.grad`）。
# 2. **CPU 生成器没有种子（种子那张表）。** 两个 TP rank 的初值不同、读的样本也不同，不报错。
# 3. **`finalize_model_grads` 上方的注释与代码不符（finalize 那张表的第一行）。** 不开 SP 时它在 TP 群里什么也不做。
# 4. **tokenizer 的词表与模型不一致（下面的运行）。** 数据集用 `vocab_size=_SEQUENCE_LENGTH`（64）的 null tokenizer，
#    模型的 vocab 是 100。`"null-text"` 的 `vocab_size` 已含 EOD，EOD 是 63；mock 文档是 `(arange + 1) % 64` 再接一个 EOD
#    （[gpt_dataset.py:876](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L876)）。
#    于是 token 只落在 0–63，模型后 36 行词嵌入永远用不上；长文档里 63 又作为普通 token 出现，紧跟着 0。不出错，但读代码时容易误会。

# %%
tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=64)  # :106-109
tokens = mock_train_dataset(TINY)[0]["tokens"].tolist()
at = tokens.index(63)
print("vocab_size:", tokenizer.vocab_size, " eod:", tokenizer.eod, " 模型 vocab:", TINY.vocab)
print("第 0 个样本: 最大 id", max(tokens), "| 63 前后:", tokens[at - 2 : at + 3])

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 与原脚本相比只改了三处：gloo 代替 NCCL；不调用 `torch.cuda.set_device`（`.to(device)` 在 CPU 上什么也不做）；
#   加一行 `torch.manual_seed(123)`，因为 `use_cpu_initialization=True` 从 CPU 默认生成器取初值、`DataLoader` 也从它取打乱的种子，
#   原脚本没有设它（种子一节单独跑一遍看后果）。数据 helper 已预编译，不调用 `compile_helpers`；tokenizer 与原脚本相同
#   （`MegatronTokenizer.from_pretrained`，library `"null-text"`，[run_simple_mcore_train_loop.py:106](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L106)），
#   词表照原脚本取序列长度，只是不超过模型的 vocab。
# - finalize 一节开 SP 的那一行：这里没有 Apex 和 Transformer Engine，local spec 的 norm 是 `WrappedTorchNorm`，它在 SP 下断言失败
#   （[torch_norm.py:50](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L50)）。
#   补丁 `torch_norm_sequence_parallel` 只在 SP 时绕过这个断言，照常建 torch 的 norm，并像 Apex / TE 的 norm 一样把参数标成
#   `sequence_parallel`，`finalize_model_grads` 才会在 TP 群里归约它们（[CPU 补丁一览](../../cpu/)）。不开 SP 的第一行不经过补丁。
# - mock 数据集建索引时的 INFO / WARNING 日志调成了 ERROR。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 原样的 simple loop 跑 5 步，权重最大变化是多少？**
#
# <details><summary>答案</summary>
#
# 0：DDP 把 `param.grad` 置为 `None`，`torch.optim.Adam` 跳过所有参数。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(max(s["moved"] for s in as_published[0]["log"]), all(s["grad_is_none"] for s in as_published[0]["log"]))

# %% [markdown]
# **2. 原样运行时 `main_grad` 的范数为什么逐步增大？**
#
# <details><summary>答案</summary>
#
# 循环里没有 `zero_grad_buffer()`，`main_grad` 把每步的梯度累加起来；每步梯度相近，范数近似线性增长。改后每步清零，范数不再增长。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([round(s["main_grad_norm"], 2) for s in as_published[0]["log"]], [round(s["main_grad_norm"], 2) for s in fixed[0]["log"]])

# %% [markdown]
# **3. 改后每步权重大约移动多少？为什么？**
#
# <details><summary>答案</summary>
#
# 约 0.001 × 步数：Adam 早期每步每个元素移动约 `lr`（`m̂ / √v̂ ≈ ±1`），`lr` = 1e-3。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([round(s["moved"], 4) for s in fixed[0]["log"]])

# %% [markdown]
# **4. 原样的脚本用 `torchrun` 起两个 TP rank，它们第一步读到的 batch 相同吗？不开 SP 时 `finalize_model_grads` 在 TP 群里发几次通信？**
#
# <details><summary>答案</summary>
#
# 不同：脚本只调用 `model_parallel_cuda_manual_seed`，它不碰 CPU 默认生成器，而每个新进程的 CPU 生成器种子都来自操作系统，
# `DataLoader(shuffle=True)` 就从它取打乱的种子。0 次：不开 SP 时 norm 的梯度在各 TP rank 上本来就相同，
# `_allreduce_non_tensor_model_parallel_grads` 找不到要归约的参数。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("TP rank 1 的 batch 0、1 与 rank 0 相同:", reads_table(wired).rows[1][2:4], "| 不开 SP 时 TP 群的通信:", layernorm_table(wired).rows[0][4])

# %% [markdown]
# **5. 正式入口里，谁调用 `finalize_model_grads`？simple loop 为什么要自己调？**
#
# <details><summary>答案</summary>
#
# schedule：`train` 把它挂到 `config.finalize_model_grads_func`，schedule 在最后一个 micro-batch 的 backward 之后调用。
# simple loop 的 `TransformerConfig` 没挂（是 `None`），schedule 就跳过这一步，脚本只好在 `forward_backward_func` 返回后手动调用。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
train_source = inspect.getsource(inspect.getmodule(train_step).train)
print("train 里挂上 finalize_model_grads:", "config.finalize_model_grads_func = finalize_model_grads" in train_source,
      "| simple loop 的 config:", config.finalize_model_grads_func)

# %% [markdown]
# ## 30-second answer
#
# Run as published, Megatron's `run_simple_mcore_train_loop.py` never moves its weights: Megatron's DDP
# accumulates gradients into `main_grad` and sets `param.grad` to None, so `torch.optim.Adam` skips every
# parameter, and with no `zero_grad_buffer()` the `main_grad` keeps piling up. A correct step is
# `zero_grad_buffer()` → `forward_backward_func` (ending in `finalize_model_grads`) → the optimizer from
# `get_megatron_optimizer`, which is what the formal entry's `train_step` does, after `pretrain` →
# `setup_model_and_optimizer`. The example also leaves the CPU generator unseeded, so TP ranks read different
# batches, and without sequence parallelism `finalize_model_grads` sends nothing over TP.
