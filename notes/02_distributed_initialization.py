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
# # 02 分布式初始化：从 `init_process_group` 到几十个 process group
#
# `torchrun` 起了 N 个进程之后，Megatron 在哪一步、用什么 backend 把它们连起来，又怎样从一个 world 群切出 TP、PP、DP
# 等几十个群？建这些群要不要通信？NCCL 之外，为什么还要再建一套 gloo 群？

# %% [markdown]
# ## 阅读目标
#
# 1. 从 `pretrain_gpt.py` 启动到第一个 process group 建好，经过哪几个函数、各管什么；哪一步才真的"通信"。
# 2. `initialize_model_parallel` 按什么顺序建了哪些群、存进哪些全局变量；为什么每个 rank 都要建每个群。
# 3. Megatron 为什么在 NCCL 群之外再建 gloo 群，谁在用它们，关掉会怎样。
# 4. 之后的代码怎样拿群；`get_data_parallel_group()` 加不加 `with_context_parallel=True` 有什么区别。
#
# **结论**
#
# - `init_process_group`（缺省 nccl、10 分钟）只建 world 群；其余子群都由 `initialize_model_parallel` 一个函数建。
# - 4 rank、TP=2、PP=2：每个 rank 按同一顺序调 62 次 `create_group`（rank 3 也建 `[0, 1]`），设 44 个全局变量，0 次 collective。
# - 其中 12 次建 gloo 群（dp、dp-cp、expert dp 各一套）；`--disable-gloo-process-groups` 关掉后只剩 50 次。
# - gloo 群只给分布式优化器用：存 torch 格式 checkpoint 时 DP rank 0 在 CPU 上 gather 3 份状态，读回时 scatter。
# - 8 卡 TP=2、CP=2：rank 2 的 `dp` 群是 [2, 6]，DDP 归约梯度用的 `dp-cp` 群是 [0, 2, 4, 6]。
# - 坑：destroy 之后 `is_rank_in_embedding_group()` 仍为 True；fp32 参数时 `load_parameter_state` 直接报错。
#
# 先读：[笔记 01](../01_training_run_overview/)（初始化在训练主链路的哪一格）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import os
import shutil
import tempfile

import torch
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.models.presets import PRESETS, parameter_count
from snippets.experiments.n02_groups import (
    GLOO_MODEL, folded, gpt_with_distributed_optimizer, kinds_for, run, train_one_step,
)
from snippets.ranks.group_creation import creation_order, draw_group_creation, watch_init
from snippets.ranks.groups import group_summary, rank_table, unique_groups
from snippets.ranks.launch import Grid, RankError, run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table

from megatron.core import parallel_state

watched = run_ranks(watch_init, 4, 2, 2)
without_gloo = run_ranks(watch_init, 4, 2, 2, gloo=False)
created, collectives, changed = (watched[0][k] for k in ("created", "collectives", "changed"))
order = creation_order(created)
draw_group_creation(order.rows, len(collectives), setting="4 rank、TP=2、PP=2")

# %% [markdown]
# 先左后右、从上到下是建群的顺序，每个方块是建出的一个群（里面是成员）。这里 DP=1，DP 类的群和它们的 gloo 副本都只有一个 rank。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 每次运行在本机用 gloo 起 4 或 8 个进程（`snippets.ranks.launch.run_ranks`，文件 store 做 rendezvous），每个进程直接调
#   `parallel_state.initialize_model_parallel`，结果回到 notebook 进程打印。`init_process_group` 那一步由 `run_ranks` 做，
#   所以这里的"缺省 backend"也是 gloo；在 GPU 节点上它是 NCCL，其余代码相同。
# - 开头的图：`snippets/ranks/group_creation.py` 的 `watch_init` 把 `parallel_state.create_group` 换成记录调用的探针
#   （真正的建群照常做），用 `snippets.record.recorder` 记录期间的 collective，并比较模块全局变量的前后。
# - 逐 rank 的群表：`snippets/experiments/n02_groups.py` 的 `run`（实验名 `groups`），用 Megatron 自己的 getter 读回每个群；
#   `dims` 的 `tiny` 全是 1，因为建群用不到模型。gloo 一节的小 GPT（2 层、hidden 16）和一步训练也在这个模块里。
# - 命令行复现逐 rank 表：`.venv/bin/python -m snippets.run --nproc-per-node 4 groups --tp 2 --pp 2`；
#   重新执行整页：`scripts/execute_notes.sh notes/02_distributed_initialization.py`。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(watch_init)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(run, kinds_for, gpt_with_distributed_optimizer, train_one_step)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`initialize.py::_initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L265) | 设 GPU、`init_process_group`、调 `initialize_model_parallel` |
# | [`parallel_state.py::initialize_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L601) | 本篇主角：建全部群 |
# | [`parallel_state.py::create_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L232) | 对 `torch.distributed.new_group` 的薄包装 |
# | [`parallel_state.py::get_data_parallel_group_gloo`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1810) | 取 DP（或 DP×CP）的 gloo 群 |
# | [`distrib_optimizer.py::DistributedOptimizer.get_parameter_state_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1262) | 把各 DP rank 的优化器状态在 CPU 上收齐到 DP rank 0（缺省走 gloo） |
# | [`distrib_optimizer.py::DistributedOptimizer.load_parameter_state_from_dp_zero`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2254) | 反过来：DP rank 0 经 gloo 群把状态 scatter 回去 |
# | [`parallel_state.py::destroy_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2506) | 把全局变量置回 `None`（并不全部，见遗留问题） |
#
# <details><summary>另外 9 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`arguments.py::parse_and_validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L87) | `pretrain_gpt.py` 的 `__main__` 在调 `pretrain` **之前**先调它：解析参数、`validate_args`、设全局变量 |
# | [`arguments.py::validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L388) | 在任何群存在之前先算一次 `data_parallel_size` |
# | [`training.py::pretrain`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1014) | 正式入口，第一件大事就是 `initialize_megatron` |
# | [`initialize.py::initialize_megatron`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L42) | 从 `get_args()` 取已解析好的参数，再调内部的 `finish_mpu_init` |
# | [`initialize.py::_set_random_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L418) | 按 PP / DP 坐标偏移种子（要先有群才能读坐标） |
# | [`run_simple_mcore_train_loop.py::initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L29) | simple loop 的初始化（`__main__` 里第一步） |
# | [`parallel_state.py::RankGenerator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L465) | 给出每类群的 rank 列表（笔记 08） |
# | [`random.py::model_parallel_cuda_manual_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L446) | 按 TP / EP 坐标建 RNG 流 |
# | [`process_groups_config.py::ProcessGroupCollection.use_mpu_process_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/process_groups_config.py#L205) | 把全局群打包成一个对象交给模型和 DDP |
#
# </details>

# %% [markdown]
# ## 调用链
#
# <details><summary>完整调用链</summary>
#
# ```text
# pretrain_gpt.py  (__main__)
# ├─ megatron/training/arguments.py::parse_and_validate_args     # 在 pretrain 之前，还没有任何群
# │  ├─ megatron/training/arguments.py::parse_args               # 读环境变量 RANK / WORLD_SIZE / LOCAL_RANK
# │  ├─ megatron/training/arguments.py::validate_args            # 纯算术：dp = world // (tp·pp·cp·gtp_remat)
# │  └─ megatron/training/global_vars.py::set_global_variables   # microbatch 计算器要知道 dp
# └─ megatron/training/training.py::pretrain(full_config, ..., get_embedding_ranks=GPT 自己的规则)
#    └─ megatron/training/initialize.py::initialize_megatron     # args = get_args()，不再解析
#       └─ finish_mpu_init（嵌套函数）
#          ├─ megatron/training/initialize.py::_initialize_distributed
#          │  ├─ torch.cuda.set_device(local_rank)                # 只在有 GPU 时
#          │  ├─ torch.distributed.init_process_group             # rendezvous，建 world 群（默认 nccl、10 分钟）
#          │  └─ megatron/core/parallel_state.py::initialize_model_parallel   # 只在 device_count() > 0 且没要求跳过时
#          │     ├─ RankGenerator(...) ×2                         # decoder 网格、expert 网格，纯算术
#          │     ├─ RankGenerator.get_ranks(token) ×N             # 纯算术
#          │     ├─ create_group(ranks) ×M                        # torch.distributed.new_group，全体 rank 都要调
#          │     ├─ create_group(ranks, backend="gloo")           # dp / dp-cp / expert dp 各一套（create_gloo_process_groups）
#          │     └─ _set_global_memory_buffer
#          └─ megatron/training/initialize.py::_set_random_seed   # 读 PP/DP 坐标
#             └─ megatron/core/tensor_parallel/random.py::model_parallel_cuda_manual_seed  # 读 TP/EP 坐标
#
# examples/run_simple_mcore_train_loop.py  (__main__ 第一步)
# └─ initialize_distributed
#    ├─ megatron/core/parallel_state.py::destroy_model_parallel
#    ├─ torch.distributed.init_process_group(backend="nccl")      # 没给 timeout
#    └─ megatron/core/parallel_state.py::initialize_model_parallel(tp, pp)   # 其余全用缺省值
# ```
#
# </details>
#
# 正式入口：解析参数（算出 DP）→ `initialize_megatron` → `_initialize_distributed` 建群；simple loop 在 `__main__` 第一步自己建。
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `parse_and_validate_args` | `extra_args_provider`、`args_defaults` | `args` | 无 | 否 | 否 | 是：全局 args、tokenizer、timers | 无（simple loop 不解析命令行） |
# | `initialize_megatron` | embedding 规则函数、`store`、`skip_model_parallel_init` 等开关（参数本身从 `get_args()` 取） | 通常 `None`（lazy 模式返回 `finish_mpu_init`） | `parallel_state`、RNG tracker | 是（经下一行） | 否 | 是：RNG、rerun 状态机 | `initialize_distributed` + `model_parallel_cuda_manual_seed` |
# | `_initialize_distributed` | embedding 规则函数、`store`、`skip_model_parallel_init`；其余读 `get_args()` | 无 | `initialize_model_parallel` | **是**：world 群 + 全部子群 | 否 | 是：当前 GPU、默认群、全局群 | `initialize_distributed` |
# | `initialize_model_parallel` | tp、pp、vpp、cp、ep、etp、`gtp_remat_size`、`order`、timeout、embedding 规则、`create_gloo_process_groups` | 无（写全局变量） | `RankGenerator`、`create_group`、`GlobalMemoryBuffer` | **是**：建群本身 | 否（只定坐标） | 是：44 个全局变量（上面实测） | `initialize_distributed` 内 |
# | `RankGenerator.get_ranks` | token，如 `"tp"`、`"dp-cp"` | 该类全部群的 rank 列表 | `generate_masked_orthogonal_rank_groups` | 否（纯算术） | 否 | 否 | 同上 |
# | `create_group` | ranks、timeout、backend、`group_desc` | 一个 `ProcessGroup` | 无 | **是**：`new_group` | 否 | 记入 `_global_process_group_list` | 同上 |
# | `_set_random_seed` | seed | 无 | `model_parallel_cuda_manual_seed` | 只读坐标 | 否 | 是：Python / NumPy / torch RNG | `model_parallel_cuda_manual_seed(123)` |
# | `destroy_model_parallel` | 无 | 无 | 无 | 只销毁 3 个 gloo 群，其余只丢引用 | 否 | 是：清空大部分全局变量 | `initialize_distributed` 的第一行 |
# | `get_parameter_state_dp_zero` | `use_gloo_comm`（缺省 True） | DP rank 0 上的完整状态（CPU 张量），其余 rank `None` | `torch.distributed.gather` | **是**：dp-cp 的 gloo 群 | 按 DP 切的状态收齐 | 否 | 无（simple loop 不存优化器） |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 正式入口交给 `init_process_group` 和 `initialize_model_parallel` 的参数
#
# 0.19.0 的命令行选项由配置类生成，与初始化有关的几项在 `DistributedInitConfig` 里；拿它的缺省值，和
# `initialize_model_parallel` 自己签名里的缺省值比一比：

# %%
import inspect

from megatron.training.config.common_config import DistributedInitConfig

fields = ("distributed_backend", "distributed_timeout_minutes", "use_gloo_process_groups", "use_tp_pp_dp_mapping")
print("DistributedInitConfig:", {name: getattr(DistributedInitConfig(), name) for name in fields})
signature = inspect.signature(parallel_state.initialize_model_parallel).parameters
print("initialize_model_parallel:", {name: signature[name].default
                                     for name in ("distributed_timeout_minutes", "create_gloo_process_groups", "order")})

# %% [markdown]
# - `rank`、`world_size`、`local_rank` 来自 `torchrun` 设的环境变量，后者决定 `torch.cuda.set_device`。
# - timeout：正式入口把 `--distributed-timeout-minutes`（缺省 10）同时交给 world 群和每个子群；simple loop 不传，子群用
#   `initialize_model_parallel` 自己的缺省 30 分钟。
# - TP、PP、CP、EP 原样转交；DP 不是参数，是推出来的：DP = world ÷ (TP·PP·CP·GTP)。正式入口里这个除法做两次，
#   `validate_args` 在没有任何群时先算（microbatch 计算器要用），`initialize_model_parallel` 再独立算一次
#   （[parallel_state.py 第 825 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L825)）。
# - `--use-tp-pp-dp-mapping` 把 `order` 从 `tp-cp-ep-dp-pp` 换成 `tp-cp-ep-pp-dp`；`--disable-gloo-process-groups`
#   变成 `create_gloo_process_groups=False`（[initialize.py:391](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L391)）。
#
# ### 建出的群：每个 rank 的坐标和成员
#
# 4 个 rank、TP=2、PP=2，所以 DP = 4 ÷ (2·2) = 1。每个 rank 调完 `initialize_model_parallel` 后，用 Megatron 自己的
# getter 读回坐标和所属的群：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TINY = EXPERIMENTS["groups"].tiny
PAR = Parallel(world=4, tp=2, pp=2)
ranks = run_ranks(run, 4, TINY, PAR, grid=dict(tp=2, pp=2))
rank_table(ranks, kinds=kinds_for(PAR))

# %% [markdown]
# 缺省 order 里 tp 变化最快，所以 TP 群是相邻 rank `[0, 1]`、`[2, 3]`，PP 群跨度最大 `[0, 2]`、`[1, 3]`。embedding 群取每个
# PP 群的首尾（这里恰好就是 PP 群），position embedding 群只取首 rank，rank 2、3 不在任何 position embedding 群里（`-`）。
# 所有 rank 看到的群合在一起：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
group_summary({kind: unique_groups(ranks, kind) for kind in ("tp", "pp", "dp", "cp", "tp-pp", "embd")})

# %% [markdown]
# 成员是怎么算出来的（`RankGenerator` 把 rank 看成混合进制数），以及 16 卡、TP=2、PP=2 时 rank 5 和 13 各在哪些群、
# 换 `order` 会怎样，都在[笔记 08](../08_parallel_state_and_rank_generator/)；这里只看"谁建、何时建、建了什么"。
#
# ### `initialize_model_parallel` 里发生了什么
#
# 开头那张图来自同一次调用：把 `create_group` 换成记录调用的探针，再调一次真实的初始化。三件事从运行里读出来：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("每个 rank 调用 create_group 的次数:", [len(w["created"]) for w in watched])
print("4 个 rank 的调用序列（描述 + 成员）完全相同:", all(w["created"] == created for w in watched))
print("初始化期间记录到的 collective 条数:", [len(w["collectives"]) for w in watched])
print("被设置的模块全局变量个数:", len(changed))
folded("建群顺序表（开头的图画的就是它）与被设置的全局变量", order, ", ".join(changed))

# %% [markdown]
# - **每个 rank 都建每个群。** rank 3 不在 `[0, 1]` 里，却也调用了 `create_group([0, 1])`：`torch.distributed.new_group`
#   缺省要求全体 rank 以相同顺序调用（`create_group` 没开 `use_local_synchronization`）。所以代码总是"遍历所有群 →
#   全部创建 → 只把含自己的那个存进全局变量"。
# - **建群不是 collective。** 期间记录到 0 条 collective：`new_group` 的协调走 store（GPU 集群上是 `MASTER_ADDR` 上的
#   TCPStore）。通信发生在以后用这些群的时候。
# - **打头的是 GTP 群，然后才是 `dp-cp`。** 0.19.0 新增的 `gtp_remat` 维（把权重再按输出维切给几个 rank，用前 all-gather
#   回来）不开时大小为 1，[parallel_state.py:939](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L939)
#   照样为每个 rank 建一个单人群，expert 一侧也一样；再加一个按 `tp-ep-gtp_remat-pp` 切的 expert 群，4 rank 时比旧版多
#   9 次 `create_group`。紧接着才是 `dp-cp`：源码注释说 IB SHARP 只能用在第一个以 `NCCL_COLLNET_ENABLE=1` 创建的
#   communicator 上，而 DP×CP 群最可能要它（[parallel_state.py 第 958–962 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L958-L962)）；
#   这个"最先建"在 0.19.0 已被 GTP 那段循环抢先（遗留问题 4）。
#
# > **旧版（core_v0.18.0）：** 没有 `gtp_remat` 这一维：同样 4 rank、TP=2、PP=2，每个 rank 调 53 次 `create_group`、
# > 设置 34 个全局变量，`DATA_PARALLEL_GROUP_WITH_CP` 是第一个建的群（[core_v0.18.0 的 parallel_state.py 第 845 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/parallel_state.py#L845)）。
#
# ### 尺寸不对时
#
# `initialize_model_parallel` 在 [parallel_state.py 第 822 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L822)
# 检查 world size 能否被 `tp·pp·cp·gtp_remat` 整除，不能就在每个 rank 上抛 `RuntimeError`，一个群也不建：

# %%
def tp_of_three():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=3)


try:
    run_ranks(tp_of_three, 4)
except RankError as err:
    print("4 个 rank、TP=3:", err.summary)

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 建群本身不搬运任何 tensor，它决定的是**以后每次通信在哪个群里发生**。之后的代码通过这些 getter 拿群（或拿
# [`ProcessGroupCollection.use_mpu_process_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/process_groups_config.py#L205) 打包好的同一批群）：
#
# | getter | 成员 | 谁用它 |
# |---|---|---|
# | [`get_tensor_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1704) | decoder 网格的 `tp` | TP 层里的 f / g（笔记 09、10） |
# | [`get_pipeline_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1749) | `pp` | pipeline 的 send / recv（笔记 13） |
# | [`get_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1758) | `dp`；`with_context_parallel=True` 为 `dp-cp`（0.19.0 另有 `with_gtp_remat`，缺省 True；GTP 为 1 时是同一个群） | 数据采样用 `dp`，DDP 归约梯度用 `dp-cp`（笔记 14） |
# | [`get_data_parallel_group_gloo`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1810) | 与上一行成员相同，backend 是 gloo | 分布式优化器存、读完整状态（机制解释） |
# | [`get_context_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1828) | `cp` | attention 里交换 K/V（笔记 16） |
# | [`get_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1697) | `tp-pp`（不含 CP） | 梯度范数等跨模型并行的归约 |
# | [`get_embedding_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1863) | 每个 PP 群的首尾 rank | 首尾 stage 同步共享词嵌入的梯度 |
# | [`get_expert_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2237) | expert 网格的 `ep` | MoE 的 token all-to-all（笔记 17） |
#
# `dp` 与 `dp-cp` 的差别要在 CP > 1 时才看得出来。8 个 rank、TP=2、CP=2：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
CP_PAR = Parallel(world=8, tp=2, cp=2)
cp_ranks = run_ranks(run, 8, TINY, CP_PAR, grid=dict(tp=2, cp=2))
rank_table(cp_ranks, kinds=kinds_for(CP_PAR))

# %% [markdown]
# CP 的两个 rank 持有**同一份**权重、处理同一条序列的不同片段，所以对权重梯度来说它们和 DP 副本一样需要求和：DDP 归约梯度
# 用的是 `dp-cp` 群（这里 4 个 rank），数据采样用的是 `dp` 群（2 个 rank，同一条序列只读一次）。

# %% [markdown]
# ## 机制解释
#
# **先 world，后子群。** `init_process_group` 只解决"大家互相找到、建一个全员默认群"。之后每个并行维度的群都是用
# `new_group` 从 world 里切出的子集。Megatron 把"怎么切"集中在 `initialize_model_parallel` 一个函数里，模型代码只通过
# getter（或 `pg_collection`）拿群，从不自己算成员。
#
# ### 为什么 NCCL 之外还要 gloo 群
#
# `initialize_model_parallel` 的 `create_gloo_process_groups` 缺省为 True（[parallel_state.py:620](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L620)）。
# 打开时，它在建 `dp-cp`、`dp`、expert `dp` 群的同一个循环里，给每个群再以 `backend="gloo"` 建一个成员相同的副本
# （[parallel_state.py:970](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L970)、[parallel_state.py:1060](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1060)、[parallel_state.py:1464](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1464)）。
# 只有 DP 类的群有 gloo 副本，TP、PP、CP 都没有：它不是为训练中的通信准备的。
#
# 谁用它？`ProcessGroupCollection` 把 dp-cp 的 gloo 群交给分布式优化器（[process_groups_config.py:394](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/process_groups_config.py#L394)），
# 而优化器只在一处用它：`get_parameter_state_dp_zero` 把每个 DP rank 负责的那一段 fp32 权重和 Adam 的两个矩先拷进 CPU
# 张量，再在 gloo 群里 `gather` 到 DP rank 0，拼成完整状态（[distrib_optimizer.py:1362](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1362) 选 CPU，
# [distrib_optimizer.py:1380](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1380) gather）；读回时反过来在 gloo 群里 `scatter`
# （[distrib_optimizer.py:2338](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L2338)）。正式入口存、读 torch 格式的 checkpoint 时
# 就走这条路（[checkpointing.py:694](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L694)、[checkpointing.py:2592](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2592)）。
# 4 个 rank、TP=2（DP=2），训练一步后存一次、读一次，记下其间的通信：

# %%
def optimizer_state_over_gloo(dims, directory):
    from snippets.record import recorder

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)  # 4 个 rank ⇒ DP=2
    ddp, optimizer = gpt_with_distributed_optimizer(dims, tp=2)            # DDP + get_megatron_optimizer
    train_one_step(dims, ddp, optimizer)                                    # Adam 的两个矩有了值
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    path = os.path.join(directory, f"distrib_optim_tp{tp_rank}.pt")
    gloo = parallel_state.get_data_parallel_group_gloo(with_context_parallel=True)
    with recorder.record() as saved:
        optimizer.save_parameter_state(path)                  # DP rank 0 收齐、写盘
    with recorder.record() as loaded, torch.no_grad():        # no_grad：见遗留问题 2
        optimizer.load_parameter_state(path)                  # DP rank 0 读盘、散发
    return dict(backend=torch.distributed.get_backend(gloo), calls=saved + loaded,
                its_group=optimizer.chained_optimizers[0].data_parallel_group_gloo is gloo)


directory = tempfile.mkdtemp(prefix="gloo-")
try:
    over_gloo = run_ranks(optimizer_state_over_gloo, 4, GLOO_MODEL, directory)
finally:
    shutil.rmtree(directory)
gathers = sum(c.api == "gather" for c in over_gloo[0]["calls"])  # fp32 权重和 Adam 的两个矩，各 4 字节
print("优化器用的就是 get_data_parallel_group_gloo(with_context_parallel=True):", [r["its_group"] for r in over_gloo],
      "| backend:", over_gloo[0]["backend"])
print(f"每个参数 {gathers} × 4 = {gathers * 4} 字节；dense-8b 的完整状态:",
      f"{parameter_count(PRESETS['dense-8b']) * gathers * 4 / 1e9:.1f} GB")
communication_table(over_gloo[0]["calls"], {
    "optimizer/distrib_optimizer.py::get_parameter_state_dp_zero": "各 DP rank 的一段状态收到 DP rank 0 的 CPU 内存",
    "optimizer/distrib_optimizer.py::load_parameter_state_from_dp_zero": "DP rank 0 把完整状态按段分回各 rank"})

# %% [markdown]
# rank 0 是 DP 群 `[0, 2]` 的 DP rank 0。保存时 3 次 `gather`：fp32 权重、`exp_avg`、`exp_avg_sq` 各一次，每次把两个 rank
# 各 `[1920]` 的一段收成 2 段；读回时 3 次 `scatter` 把它们分回去。群是 dp-cp 的 gloo 副本，不是 world，也不是 NCCL 那个
# dp-cp 群。
#
# 为什么非 gloo 不可：NCCL 只搬 GPU 上的张量。完整的优化器状态每个参数 12 字节，8B 的模型就是 96 GB（上面打印的），
# 收到 DP rank 0 的一张卡上放不下；放进主机内存就可以，而能在 CPU 张量上做 gather / scatter 的是 gloo。也有走 NCCL 的分支
# （`use_gloo_comm=False`，先收到 GPU 再拷回 CPU），要 DP rank 0 的显存装得下全部。dist checkpoint 里，`dp_zero_gather_scatter`
# 格式读回时同样经 gloo scatter，`fully_reshardable` 格式开省显存选项时也走 gloo（[distrib_optimizer.py:1730](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1730)）。
#
# 关掉它们（`--disable-gloo-process-groups`，正式入口把它变成 `create_gloo_process_groups=False`）：

# %%
def ask_for_gloo():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
    try:
        parallel_state.get_data_parallel_group_gloo()
    except AssertionError as err:
        return f"AssertionError: {err}"


print("create_group 次数:", len(created), "→", len(without_gloo[0]["created"]),
      "| 全局变量:", len(changed), "→", len(without_gloo[0]["changed"]))
print("再要 gloo 群:", run_ranks(ask_for_gloo, 4)[0])

# %% [markdown]
# 少建 12 个群（每个 gloo 群在每个 rank 上都有自己的线程和连接）；代价是分布式优化器存不了 torch 格式的 checkpoint，
# `validate_args` 此时要求用分布式 checkpoint（[arguments.py:1690](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1690)）。
# 开了 GTP（`gtp_remat` > 1）时 Megatron 自己就不建 gloo 群（[parallel_state.py:951](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L951)）。
# `destroy_model_parallel` 唯一真正销毁的也是这 3 个 gloo 群（[parallel_state.py:2594](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2594) 起），其余群只丢掉引用。
#
# 最后，随机种子排在建群之后：`_set_random_seed`（加 `100 × PP rank`）和 `model_parallel_cuda_manual_seed`（TP 流加 TP rank）都要读坐标。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这是 `pretrain` 和 simple loop `__main__` 的第一步。之后每一步都假设群已存在：建模型按 TP 坐标切权重（笔记 04、10），
# `get_batch` 在 TP 群里广播 batch（笔记 03），schedule 用 PP 群 send / recv（笔记 13），DDP 在 `dp-cp` 群里归约梯度（笔记 14）。
# 初始化不改变模型参数或优化器状态，只改变进程状态：当前设备、默认群、几十个子群、RNG。

# %% [markdown]
# ## 与基础知识的连接
#
# - **Process group 与 collective**：collective 只在一个群内发生，每个成员都要调用它；"谁和谁一个群"就是并行策略。
# - **backend**：NCCL 在 GPU 之间搬 GPU 张量（NVLink / InfiniBand）；gloo 在 CPU 张量上工作，走 TCP。同一批进程可以同时有
#   两种 backend 的群。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **`destroy_model_parallel` 没清干净（下面的运行）。** 它把大部分群变量置 `None`，但不重置 `_EMBEDDING_GLOBAL_RANKS`、
#    `_PIPELINE_GLOBAL_RANKS` 等"成员列表"：destroy 之后 `model_parallel_is_initialized()` 已是 False，
#    `is_rank_in_embedding_group()` 却仍为 True。不 destroy 就再初始化会断言失败，报的是第一个被检查的群（DP 群）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def destroy_then_ask():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    parallel_state.destroy_model_parallel()
    after_destroy = dict(
        initialized=parallel_state.model_parallel_is_initialized(),
        in_embedding_group=parallel_state.is_rank_in_embedding_group(),
    )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
        again = "no error"
    except AssertionError as err:
        again = f"AssertionError: {err}"
    return after_destroy, again


after_destroy, again = run_ranks(destroy_then_ask, 4)[0]
print("destroy 之后:", after_destroy)
print("不 destroy 再初始化:", again)

# %% [markdown]
# 2. **fp32 参数时，分布式优化器读不回 torch 格式的状态（下面的运行）。** fp32 参数没有单独的主参数，优化器拿的是模型参数
#    自己的一段视图（[distrib_optimizer.py:467](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L467)）；
#    `load_parameter_state` 不在 `no_grad` 里，往这段视图 `copy_`（[distrib_optimizer.py:1225](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/distrib_optimizer.py#L1225)）
#    就被 autograd 拒绝。bf16 / fp16 训练的主参数是另拷的一份，不受影响；正式入口续训时直接调它（[checkpointing.py:2592](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/checkpointing.py#L2592)），
#    所以 fp32 + 分布式优化器 + `--ckpt-format torch` 续训会失败。上面那次运行因此把读回包在 `torch.no_grad()` 里。

# %%
def load_with_grad_mode(dims, directory):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    ddp, optimizer = gpt_with_distributed_optimizer(dims, tp=2)
    train_one_step(dims, ddp, optimizer)
    path = os.path.join(directory, f"distrib_optim_tp{parallel_state.get_tensor_model_parallel_rank()}.pt")
    optimizer.save_parameter_state(path)
    try:
        optimizer.load_parameter_state(path)  # 正式入口续训时的调用，grad 模式开着
        return "没有报错"
    except RuntimeError as err:
        return f"RuntimeError: {err}"


directory = tempfile.mkdtemp(prefix="gloo-")
try:
    print(run_ranks(load_with_grad_mode, 4, GLOO_MODEL, directory)[0])
finally:
    shutil.rmtree(directory)

# %% [markdown]
# 3. **CPU 上正式入口不建子群。** `_initialize_distributed` 只在 `torch.cuda.device_count() > 0` 时调用
#    `initialize_model_parallel`（[initialize.py 第 358 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L358)）。
# 4. **"dp-cp 最先建"的注释与代码不再一致。** SHARP 那段注释仍要求 `dp-cp` 是第一个建的群，但 0.19.0 在它前面先建了 GTP 的
#    单人群（开头的图第 1 行）；它会不会占掉 COLLNET 的名额，只有开 SHARP 的集群能回答。
# 5. **docstring 与签名不一致。** `order` 的文档说缺省是 `tp-dp-pp`，签名里却是 `tp-cp-ep-dp-pp`（上面打印的签名）。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 每次运行的 world 群由启动器用 gloo 建（文件 store，不占端口），所以缺省 backend 的群在这里也是 gloo；Megatron 显式指定
#   `backend="gloo"` 的那些群与 GPU 上完全相同。
# - 启动器在起进程之前先检查 world 能否被 TP·PP·CP 整除（`snippets.ranks.launch.Grid`），错误信息直接给出三个数；
#   "尺寸不对时"那一格故意不给网格，让 Megatron 自己在每个 rank 上报错。
# - gloo 一节的分布式优化器在 CPU 上需要几处兼容处理（`param.type()` 的 CUDA 名字、torch Adam 的 `step` 状态），见
#   [CPU 补丁一览](../../cpu/)；保存、读回的 gather / scatter 本来就走 gloo，不经任何改动。
# - 在 gloo 上反复建群会累积线程和文件描述符（destroy 并不销毁 NCCL 类的群），所以每个实验都用新进程。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 16 张卡、TP=2、PP=2、CP=1，DP 是多少？**
#
# <details><summary>答案</summary>
#
# DP = 16 ÷ (2 × 2 × 1) = 4。正式入口里这个除法做两次：`validate_args` 和 `initialize_model_parallel`（[parallel_state.py 第 825 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L825)）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("DP =", Grid(16, tp=2, pp=2).dp)

# %% [markdown]
# **2. 8 卡、TP=2、CP=2 时，rank 2 的 `dp` 群和 `dp-cp` 群分别是什么？DDP 用哪一个？**
#
# <details><summary>答案</summary>
#
# rank 2 的坐标是 (tp 0, cp 1, dp 0)。`dp` 群是 [2, 6]，`dp-cp` 群是 [0, 2, 4, 6]。DDP 用 `dp-cp`：
# CP 的各 rank 持有同一份权重，梯度也要一起求和。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("dp:", cp_ranks[2]["groups"]["dp"], " dp-cp:", cp_ranks[2]["groups"]["dp-cp"])

# %% [markdown]
# **3. 4 卡 TP=2、PP=2 时，每个 rank 调用多少次 `create_group`？为什么 rank 3 也要建 `[0, 1]`？**
#
# <details><summary>答案</summary>
#
# 62 次（含 12 次 gloo，以及 0.19.0 为 GTP 维新增的 9 次），4 个 rank 的序列完全相同。`new_group` 要求全体 rank 以相同顺序调用，
# 所以每个 rank 都建每个群，只把含自己的那个存下来。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(created), ("DATA_PARALLEL_GROUP", "默认", [0]) in watched[3]["created"],
      ("TENSOR_MODEL_PARALLEL_GROUP", "默认", [0, 1]) in watched[3]["created"])

# %% [markdown]
# **4. 同一配置下 embedding 群和 position embedding 群是什么？**
#
# <details><summary>答案</summary>
#
# embedding 群取每个 PP 群的首尾：[0, 2] 和 [1, 3]。position embedding 群只取首 rank：[0] 和 [1]；
# rank 2、3 不在任何 position embedding 群里。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("embd:", unique_groups(ranks, "embd"), " pos-embd:", unique_groups(ranks, "pos-embd"))

# %% [markdown]
# **5. Megatron 的 gloo 群给谁用？为什么不用 NCCL 的同一个群？**
#
# <details><summary>答案</summary>
#
# 给分布式优化器：存 torch 格式的 checkpoint 时，`get_parameter_state_dp_zero` 把各 DP rank 的 fp32 权重和 Adam 两个矩在 CPU 上
# gather 到 DP rank 0，读回时再 scatter。NCCL 只搬 GPU 张量，而完整状态每参数 12 字节，放不进一张卡；gloo 能直接在主机内存里收。
# 上面 DP=2 的运行里，rank 0 在 dp-cp 的 gloo 群上做了 3 次 gather、3 次 scatter。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(c.api, c.group, list(c.ranks)) for c in over_gloo[0]["calls"]])

# %% [markdown]
# **6. `initialize_model_parallel` 本身发出多少次 collective？**
#
# <details><summary>答案</summary>
#
# 0 次。建群靠 `new_group` 经 store 协调，不是 collective；通信发生在以后用这些群的时候。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(sum(len(w["collectives"]) for w in watched))

# %% [markdown]
# ## 30-second answer
#
# `_initialize_distributed` calls `init_process_group` (NCCL by default, 10 minutes), which only makes the world group. Then
# `initialize_model_parallel` derives DP = world / (TP·PP·CP·GTP), lays ranks on two grids with `RankGenerator`, and
# every rank calls `new_group` for every group in the same order, keeping only its own: 62 calls for 4 ranks at
# TP2·PP2, and not a single collective. Twelve are gloo copies of the data-parallel groups: the distributed optimizer
# gathers its full fp32 state into DP rank 0's CPU memory over them when it saves a torch-format checkpoint, and
# scatters it back on load, because NCCL only moves GPU tensors.
