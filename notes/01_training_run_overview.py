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
# 第一轮第 1 篇。Megatron 有两条训练入口：教学用的 `examples/run_simple_mcore_train_loop.py`（约 270 行，只用 Megatron Core），
# 和正式的 `pretrain_gpt.py` → `megatron/training/training.py`。本篇先把两者逐步对齐，再在 2 个 CPU gloo rank（TP=2）上
# 原样跑一遍 simple loop 的接线，最后跑一版"改对了"的同结构循环，比较 loss 和权重。每一步的细节在后面的笔记：
# 初始化见[笔记 02](../02_distributed_initialization/)，数据见[笔记 03](../03_data_and_batch_flow/)，模型见[笔记 04](../04_model_provider_and_gpt_model/)，
# forward / backward 见[笔记 05](../05_forward_loss_backward/)，梯度同步与优化器见[笔记 06](../06_gradient_sync_and_optimizer/)，checkpoint 见[笔记 07](../07_checkpointing/)。

# %% [markdown]
# ## 阅读目标
#
# 1. 给 simple loop 的每一步找到正式入口里对应的函数。
# 2. 用运行说明 simple loop 原样跑时 loss 和权重怎样变化，并从代码解释原因。
# 3. 说清一个"正确"的 Megatron 训练步最少需要哪几个调用、顺序为何如此。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`run_simple_mcore_train_loop.py::initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L29) | `init_process_group` + `initialize_model_parallel` |
# | [`run_simple_mcore_train_loop.py::model_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L57) | 2 层、hidden 12、vocab 100 的 `GPTModel` |
# | [`run_simple_mcore_train_loop.py::get_train_data_iterator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L82) | `MockGPTDataset` + torch `DataLoader` |
# | [`run_simple_mcore_train_loop.py::forward_step_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L124) | 取 batch、forward、返回带 loss mask 的 `loss_func` |
# | [`run_simple_mcore_train_loop.py::save_distributed_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L169) | `sharded_state_dict` + `dist_checkpointing.save` |
# | [`run_simple_mcore_train_loop.py::load_distributed_checkpoint`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L193) | `dist_checkpointing.load` + `load_state_dict` |
# | [`run_simple_mcore_train_loop.py:243`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L243) | 优化器：`torch.optim.Adam(gpt_model.parameters())` |
# | [`run_simple_mcore_train_loop.py:267`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L267) | `finalize_model_grads([gpt_model])` |
# | [`run_simple_mcore_train_loop.py:269`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L269) | `optim.step()` |
# | [`pretrain_gpt.py::forward_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L282) | 正式入口的 forward_step |
# | [`arguments.py::parse_and_validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L87) | 在 `pretrain_gpt.py` 的 `__main__` 里解析、校验命令行，存成全局 `args` |
# | [`argument_utils.py::gpt_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L433) | `args` → `GPTModelConfig`（内含 `TransformerConfig`，笔记 04） |
# | [`argument_utils.py::pretrain_cfg_container_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L534) | `args` + 模型配置 → `PretrainConfigContainer`（训练、优化器、DDP、checkpoint… 各一份配置） |
# | [`training.py::pretrain`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1014) | 正式入口总控 |
# | [`initialize.py::initialize_megatron`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L42) | 读已解析的 `args`、建群、设种子 |
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 按 `cfg_container.model` 建模型（含 DDP）+ `get_megatron_optimizer` + `load_checkpoint` |
# | [`training.py::train`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L3342) | 训练循环：每步 `train_step`，按间隔 `save_checkpoint` |
# | [`training.py::train_step`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2336) | 清零 buffer → schedule → `optimizer.step()` |

# %% [markdown]
# ## 调用链
#
# ```text
# pretrain_gpt.py  (__main__)
# ├─ arguments.py::parse_and_validate_args                 # 解析命令行，存成全局 args
# ├─ argument_utils.py::gpt_config_from_args              # args → GPTModelConfig            ← model_provider 里手写的 TransformerConfig(...)
# ├─ argument_utils.py::pretrain_cfg_container_from_args  # → PretrainConfigContainer
# └─ megatron/training/training.py::pretrain(full_config, ...)
#    ├─ initialize.py::initialize_megatron                  # 建群、种子                       ← simple loop: initialize_distributed + model_parallel_cuda_manual_seed
#    ├─ setup_model_and_optimizer(model_type, ..., cfg_container=...)
#    │  ├─ GPTModelBuilder.build_distributed_models → DDP  # 建模型、grad buffer             ← model_provider + DistributedDataParallel(...)
#    │  ├─ get_megatron_optimizer(...)                      #                                ← torch.optim.Adam（见下文的问题）
#    │  └─ checkpointing.py::load_checkpoint                # 续训时加载                       ← load_distributed_checkpoint（放在最后演示）
#    ├─ build_train_valid_test_data_iterators               # MockGPTDataset / GPTDataset     ← get_train_data_iterator
#    └─ train
#       ├─ train_step
#       │  ├─ zero_grad_buffer(); optimizer.zero_grad()     #                                ← optim.zero_grad()
#       │  ├─ forward_backward_func(forward_step, ...)      # TP 通信在层里                    ← forward_backward_func(forward_step_func, ...)
#       │  │  └─ finalize_model_grads                       # DP 归约；TP 只归约 SP 标记的参数   ← finalize_model_grads([gpt_model])（显式调用）
#       │  └─ optimizer.step()                              # 范数、裁剪、Adam                  ← optim.step()
#       └─ checkpointing.py::save_checkpoint                # 每 --save-interval 步            ← save_distributed_checkpoint
# ```
#
# **每个函数的阅读记录（simple loop 的函数；正式入口的对应函数见各篇）：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | 对应正式入口 |
# |---|---|---|---|---|---|---|---|
# | `initialize_distributed` | TP、PP 大小 | 无（建好全局群） | `parallel_state.initialize_model_parallel` | 是：建全部群 | 否 | 否 | `initialize_megatron` |
# | `model_provider` | 无 | `GPTModel` | `TransformerConfig`、`GPTModel`、local spec | 读 TP 群决定切片 | 权重按 TP 切 | 是：建参数 | `model_provider` → `get_model` |
# | `get_train_data_iterator` | 无 | batch 迭代器（每个 TP rank 各自一份） | `BlendedMegatronDatasetBuilder`、`MockGPTDataset` | 否 | 否：不看 TP 群；每个 rank 的 `DataLoader(shuffle=True)` 用本进程的 CPU 默认生成器打乱，原脚本没有给它种子，所以各 TP rank 读的样本不同（下文运行） | 否 | `build_train_valid_test_data_iterators` |
# | `forward_step_func` | 迭代器、model | `(output, loss_func)` | `GPTModel.forward` | 间接：TP 层与 vocab 并行 CE | TP | 否 | `pretrain_gpt.py::forward_step` |
# | `save_distributed_checkpoint` | 路径、model | 磁盘文件 | `sharded_state_dict`、`dist_checkpointing.save` | 是 | 按 ShardedTensor 写 | 否 | `save_checkpoint` |
# | `load_distributed_checkpoint` | 路径、model | 填好权重的 model | `dist_checkpointing.load` | 是 | 按当前切法读 | 是 | `load_checkpoint` |
#
# **正式入口的三个函数的阅读记录**（行号是 `training.py` 里的调用处）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::pretrain` | 配置容器 `cfg_container`、数据集 provider、`model_type`、`forward_step`（`model_provider` 退为可缺省的关键字参数，`pretrain_gpt.py` 不再传它；`args` 已在 `__main__` 解析好） | 无（返回 `None`；训练结果在 checkpoint 里） | 经 `initialize_megatron`（[training.py:1091](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1091)）调 `parallel_state.initialize_model_parallel` 与 `model_parallel_cuda_manual_seed`；`setup_model_and_optimizer`（[training.py:1228](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1228)）；`build_train_valid_test_data_iterators`（[training.py:1362](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1362)）里的 `BlendedMegatronDatasetBuilder`；`train`（[training.py:1423](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1423)） | 是：`initialize_megatron` 建全部群 | 不直接切：交给下面两个函数与数据迭代器 | 是：从头到尾 | 整个 `__main__` |
# | `training.py::setup_model_and_optimizer` | `model_type`、`model_provider_func`（可缺省）、`checkpointing_context`，以及只能按关键字传的 `cfg_container`、`pg_collection` | `(model, optimizer, opt_param_scheduler)`，`model` 是每个 virtual stage 一个 DDP 包装的列表（[training.py:2286](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2286)） | `cfg_container.model` 有值时（`pretrain_gpt.py` 总是给）由它的 builder 建模型并包 `DistributedDataParallel`（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)，[`gpt.py::GPTModelBuilder.build_distributed_models`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L331)），否则退回 `get_model(model_provider_func, ...)`（[training.py:2061](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2061)）；`get_megatron_optimizer`（[training.py:2132](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2132)）、续训时 `load_checkpoint` 里的 `dist_checkpointing`（[training.py:2199](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)） | 是：模型按 TP / PP 群建，DDP 记下 dp-cp 群，分布式优化器按 dp 群分片 | 权重按 TP / PP 切；`--use-distributed-optimizer` 时优化器状态按 DP 切 | 是：建参数、grad buffer、优化器状态；续训时从 checkpoint 读回参数与 `args.iteration` | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` + `Adam(...)`（+ `load_distributed_checkpoint`） |
# | `training.py::train_step` | `forward_step`、`data_iterator`、model 块列表、optimizer、`opt_param_scheduler`、config、`forward_backward_func` | 元组 `(loss_reduced, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm, num_zeros_in_grad, …)` | 每块 `zero_grad_buffer`（[training.py:2361](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)）、schedule 的 `forward_backward_func`（[training.py:2407](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2407)，末尾经 `config.finalize_model_grads_func` 做梯度归约）、`MegatronOptimizer.step`（[training.py:2474](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)） | 是：dp-cp（梯度归约；日志用的 loss 在 dp-cp 群 all-reduce，[training.py:2547](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2547)）、tp-pp（梯度范数） | batch 已按 DP 切、再按 micro-batch 切；参数按 TP / PP 切 | 是：参数、优化器状态、学习率（`opt_param_scheduler.step`，[training.py:2528](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2528)）、iterator 前进 | 循环体：`optim.zero_grad()` → `forward_backward_func(...)` → `finalize_model_grads([gpt_model])` → `optim.step()` |
#
# > **旧版（core_v0.18.0）：** `pretrain_gpt.py` 还把 `partial(model_provider, gpt_builder)` 作为第三个位置参数传给 `pretrain`（[pretrain_gpt.py:400](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/pretrain_gpt.py#L400)），`pretrain_cfg_container_from_args(args)` 不带模型配置；`setup_model_and_optimizer(model_provider_func, model_type, checkpointing_context)` 的前两个参数与 0.19.0 相反、没有 `cfg_container`，总是经 `get_model` 建模型（[training.py:1954](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/training/training.py#L1954)）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n01_overview import (
    checkpoint_line, first_batches, layernorm_sync, layernorm_table, log_table, note_runs, reads_table, run, simple_loop,
    wiring,
)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.train import pictures

# %% [markdown]
# ## 关键对象
#
# 下面的 `simple_loop` 逐行复现 simple loop 的 `__main__`（行号见注释），只有三处为 CPU 改动：gloo 代替 NCCL、不调用
# `torch.cuda.set_device`（`.to(device)` 在 CPU 上什么也不做）、加一行 `torch.manual_seed(123)`（`use_cpu_initialization=True` 从 CPU 默认生成器取初值，
# `DataLoader` 也从它取打乱的种子；原脚本没有设它，下文单独跑一遍看后果）；数据 helper 已预编译，不调用 `compile_helpers`。tokenizer 与原脚本相同，是 Core 的 null tokenizer
# （`MegatronTokenizer.from_pretrained`，library `"null-text"`，[run_simple_mcore_train_loop.py:106](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L106)；词表照原脚本取序列长度，只是不超过模型的 vocab）。参数 `megatron_optimizer=True` 时换成正式入口的做法：
# `get_megatron_optimizer` + 每步 `zero_grad_buffer()`。
#
# 模型和数据的尺寸是参数 `dims`：本篇用它的 `tiny`，正是原脚本的尺寸（2 层、hidden 12、4 个头、vocab 100、序列 64、
# micro-batch 8、每步 1 个 micro-batch）；TP 是参数 `tp`。`run` 在每个 rank 上先原样跑一遍、再换优化器跑一遍，
# checkpoint 目录由 rank 0 在临时目录里建好、把路径广播给其他 rank，跑完删掉。它们在 `snippets/experiments/n01_overview.py` 里，
# `simple_loop` 每一行右边的注释是原脚本的行号：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(simple_loop, run)

# %% [markdown]
# 一次启动跑完本篇的全部运行：先是上面的 `run`，再是后面两小节要看的 `wiring`（`note_runs`，同一模块）。

# %%
TINY = EXPERIMENTS["overview"].tiny
runs = run_ranks(note_runs, 2, TINY, Parallel(world=2, tp=2), grid=dict(tp=2))
as_published, fixed = [r[0][0] for r in runs], [r[0][1] for r in runs]
wired = [r[1] for r in runs]

# %% [markdown]
# ### 原样的 simple loop：loss 和权重
#
# 每步 rank 0 的 loss、权重相对初值的最大变化、`main_grad` 的范数、`param.grad` 是否全为 `None`（`log_table`，同一模块）：

# %%
log_table(as_published)

# %% [markdown]
# **权重一步也没动。** 原因在代码里：
#
# 1. Megatron 的 DDP 在 backward 里把梯度累加进 `param.main_grad` 后把 `param.grad` 置为 `None`（笔记 06）。
#    `torch.optim.Adam` 只看 `param.grad`，遇到 `None` 就跳过这个参数——于是 [`run_simple_mcore_train_loop.py:269`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L269) 的 `optim.step()` 什么也不做。
# 2. 循环里从不调用 `zero_grad_buffer()`；[`run_simple_mcore_train_loop.py:251`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L251) 的 `optim.zero_grad()` 只清 `param.grad`，
#    所以 `main_grad` 一步步累加：范数 ≈ 0.52、1.02、1.54、1.99、2.46，近似线性增长。
# 3. loss 只在 4.60 附近随 batch 波动：权重不变，变的只是数据（vocab 100 的均匀分布交叉熵是 ln 100 ≈ 4.6052）。
#
# 另外，原脚本打印的 `losses_reduced` 是每个 micro-batch 一个 `{"lm loss": tensor}` 的列表，没有在 DP 上平均（这里 DP=1，
# 无影响）。checkpoint 部分本身是对的：

# %%
print(checkpoint_line("原样：", as_published))

# %% [markdown]
# ### 同样的结构，用正式入口的做法
#
# 只改两处：优化器用 `get_megatron_optimizer`（它读 `main_grad`），每步先 `zero_grad_buffer()`。同样的初值、同样的数据顺序：

# %%
log_table(fixed)

# %% [markdown]
# 两张表的后两列并排画出来（红 = 原样，绿 = 改后）：

# %%
pictures.draw_loop_runs(log_table(as_published).rows, log_table(fixed).rows)

# %%
print(checkpoint_line("改后：", fixed))
print("第 0 步 loss 相同（还没有更新）:", as_published[0]["log"][0]["loss"] == fixed[0]["log"][0]["loss"])

# %% [markdown]
# 第 0 步 loss 两者相同；之后 loss 下降（4.6061 → 4.5466），权重每步移动约 `lr` = 0.001（Adam 的步长），`main_grad` 每步重新累积。
# %% [markdown]
# ### 没有 `torch.manual_seed` 时，每个 TP rank 读到什么
#
# 原脚本里唯一的种子是 `model_parallel_cuda_manual_seed(123)`。它给 CUDA 默认生成器设种子
# （[`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)），再在 tracker 里建 TP / EP 的 RNG 流；
# CPU 默认生成器它不碰。而 torch 在每个新进程里用操作系统的随机数给 CPU 默认生成器设种子，`torchrun` 起的每个 rank
# 都是新进程。于是两件事都取决于一个没人设过的种子：`use_cpu_initialization=True` 的初值，和
# `DataLoader(shuffle=True)`（[`run_simple_mcore_train_loop.py:117`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L117)）
# 每轮打乱用的种子——它在第一次取 batch 时从 CPU 默认生成器抽出来。
#
# `first_batches` 按原脚本的顺序走到前两个 batch，开头用 `torch.seed()` 让每个 rank 像新进程一样从不确定的种子开始；
# 再加上本篇副本的 `torch.manual_seed(123)` 跑一遍对照。数据集本身的顺序由 `random_seed=0`（numpy）定死，两次共用：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(first_batches, wiring)

# %%
reads_table(wired)

# %% [markdown]
# 原样运行时，TP rank 1 读的 batch 与 rank 0 不同，连每个 rank 都整份持有的 position embedding 初值也不同。
# TP 的两个 rank 本该是同一个模型在同一批数据上的两半：这里它们各算各的 token，层里的 all-reduce 照样把两半相加，
# 不报错，只是结果不再是任何一个 batch 上的那个模型。加上 `torch.manual_seed(123)` 后，两者逐位相同。
# 正式入口的做法是在数据侧只让 TP rank 0 读、再广播（笔记 03），初值由 `initialize_megatron` 里的种子设定。
#
# ### `finalize_model_grads` 在 TP 群里同步哪些梯度
#
# 原脚本在 `finalize_model_grads([gpt_model])` 上面的注释
# （[`run_simple_mcore_train_loop.py:264`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L264)）说它在 TP rank 间同步
# LayerNorm 这类不切分参数的梯度。代码里做这件事的是 `_allreduce_non_tensor_model_parallel_grads`
# （[`finalize_model_grads.py:416`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416)）：它只挑出标了
# `sequence_parallel` 的参数（开 SP 时的 norm 与 RowParallel 的 bias）、开 `qk_layernorm` 时 q / k 的 norm（这两类求和），以及标了 `average_gradients_across_tp_domain` 的参数（求平均）。
# 不开 SP 时，norm 的输入在每个 TP rank 上是同一份完整激活，反向传回的梯度也已在 ColumnParallel 的 backward 里
# all-reduce 过，所以各 rank 的 norm 梯度本来就相同，不需要再同步。`layernorm_sync` 在 TP=2 上各跑一次 forward / backward
# （先不开 SP，再开 SP），记下 `finalize_model_grads` 之前与之后每个不切分参数的 `main_grad`，以及它发出的通信：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(layernorm_sync)

# %%
layernorm_table(wired)

# %% [markdown]
# 不开 SP：15 个不切分参数的梯度在 backward 后就已相同，`finalize_model_grads` 在 TP 群里一次通信也不发（它只在只有
# 自己一个成员的 dp-cp 群里做 DDP 的那次 all-reduce）。开 SP：每个 rank 只见到一半序列，14 个标了 `sequence_parallel` 的
# 参数（norm 10 个、RowParallel 的 bias 4 个）梯度各不相同，`finalize_model_grads` 把它们拼成一个 `[168]` 的张量在 TP 群里
# all-reduce 一次，之后相同。所以那句注释只在 SP、QK layernorm 或显式标记的参数上成立；原脚本不开 SP，这一步在 TP 上什么也不做。
#
#
# ## Tensor / Process Group 语义
#
# 一个训练步里张量经过的群（TP=2、DP=1）：
#
# | 阶段 | 群 | 做什么 | 详见 |
# |---|---|---|---|
# | forward / backward | tp `[0, 1]` | ColumnParallel / RowParallel 的 all-reduce，vocab 并行 CE 的三次 all-reduce | 笔记 05、09、10、12 |
# | `finalize_model_grads` | dp-cp（这里只有自己）；tp（序列并行的 norm） | 梯度求平均 | 笔记 06、14 |
# | `optimizer.step()` | tp-pp `[0, 1]` | 梯度范数的平方和 | 笔记 06 |
# | save / load | 全体 | 协调写 / 读计划 | 笔记 07 |

# %% [markdown]
# ## 机制解释
#
# 正式入口与 simple loop 做的是同一串 Core 调用，差别在"谁负责让它们配合"：`train_step` 每步先对每个模型块 `zero_grad_buffer()`
# （[`training.py:2361`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2361)），再 `optimizer.zero_grad()`；`finalize_model_grads` 由 schedule
# 在最后一个 micro-batch 之后经 `config.finalize_model_grads_func` 调用，而 simple loop 手动调用；
# `optimizer.step()`（[`training.py:2474`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2474)）返回 `(update_successful, grad_norm, num_zeros)`，
# 它来自 `get_megatron_optimizer`，认得 DDP 的 `main_grad`。

# %% [markdown]
# ## 与训练主链路的关系
#
# 本篇就是主链路的目录：初始化 → 建模型（DDP）→ 建优化器 → 数据迭代器 → 循环 {清零、forward/backward、梯度归约、step} → 保存 / 加载。
# 后续每一篇都对应其中一格。

# %% [markdown]
# ## 与基础知识的连接
#
# - **PyTorch 的训练循环**：`zero_grad` → `loss.backward()` → `step`。Megatron 把 backward 包进 schedule（为了 micro-batch 与流水线），
#   把 `.grad` 换成连续 buffer 里的 `main_grad`（为了通信与混合精度），所以优化器也必须换成认得 `main_grad` 的那个。

# %% [markdown]
# ## 遗留问题
#
# 1. **simple loop 的优化器不更新权重（运行确认）。** [`run_simple_mcore_train_loop.py:243`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L243) 的 `torch.optim.Adam`
#    与 DDP 的 `main_grad` 不配合，5 步后权重与初值完全相同；`main_grad` 因从不 `zero_grad_buffer()` 而一直累加。修法见上：换 `get_megatron_optimizer`
#    并每步清零 buffer（或在 `optim.step()` 前把 `main_grad` 赋给 `param.grad`）。
# 2. **CPU 生成器没有种子（运行确认）。** 原脚本只调用 `model_parallel_cuda_manual_seed(123)`，它只设 CUDA 与模型并行的 RNG
#    （[`random.py:490`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L490)）；`use_cpu_initialization=True` 的初值和 `DataLoader` 的打乱
#    都来自每个进程各不相同的 CPU 默认生成器，两个 TP rank 读不同的样本。本篇为可复现加了 `torch.manual_seed(123)`。
# 3. **tokenizer 的词表与模型不一致。** 数据集用 `vocab_size=_SEQUENCE_LENGTH`（64）的 null tokenizer，模型 vocab 是 100。
#    `"null-text"` 的 `vocab_size` 已含 EOD：EOD 是 63，mock 文档是 `(arange + 1) % 64` 再接一个 EOD
#    （[gpt_dataset.py:876](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/gpt_dataset.py#L876)），所以 token 只落在前 64 个 id、63 既是普通 token 又是 EOD。
#    不出错，但读代码时容易误会。

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
# ## 30-second answer
#
# The simple loop wires Megatron Core by hand: `initialize_model_parallel`, a local-spec `GPTModel`, a mock
# dataset, Megatron DDP, `get_forward_backward_func`, an explicit `finalize_model_grads` and
# `dist_checkpointing`; the formal entry turns the parsed args into a config container
# (`gpt_config_from_args`, `pretrain_cfg_container_from_args`) and does the same inside `pretrain` →
# `setup_model_and_optimizer` (which builds the model from that config) → `train` → `train_step`. Run as published at TP=2, its weights never change: DDP moves gradients into
# `main_grad` and clears `.grad`, so `torch.optim.Adam` skips every parameter, and `main_grad` keeps
# accumulating. With `get_megatron_optimizer` and `zero_grad_buffer()` the loss falls. Nothing seeds the CPU
# generator (`model_parallel_cuda_manual_seed` seeds CUDA only), so each TP rank shuffles its `DataLoader`
# differently; and without sequence parallelism `finalize_model_grads` sends nothing over TP.
