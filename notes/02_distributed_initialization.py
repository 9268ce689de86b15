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
# 第一轮第 2 篇。固定版本：Megatron-LM tag `core_v0.19.0`（= `pip install megatron-core==0.19.0`）。
# 本页的每张群表、每个计数都来自下面单元格里**真实的** `parallel_state.initialize_model_parallel`，
# 跑在本机 4 个（或 8 个）gloo 进程上；在 8 卡 GPU 节点上用 NCCL 跑是同一段代码。

# %% [markdown]
# ## 阅读目标
#
# 读完这一篇，应该能回答：
#
# 1. 从 `pretrain_gpt.py` 启动到第一个 process group 建好，经过哪几个函数，各自负责什么；哪一步才真的"通信"。
# 2. `_initialize_distributed` 从 `args` 里拿了什么：设哪块 GPU、`init_process_group` 用什么 backend 和 timeout、
#    又把哪些参数转交给 `initialize_model_parallel`。
# 3. `initialize_model_parallel` 按什么顺序建了哪些群，存进了哪些模块级全局变量，哪些尺寸会让它直接报错。
# 4. 之后的代码通过哪些 getter 拿群；`get_data_parallel_group()` 加不加 `with_context_parallel=True` 有什么区别。
#
# 每个群**里面有谁**是怎么算出来的（`RankGenerator` 的掩码算法）留给
# [笔记 08](../08_parallel_state_and_rank_generator/)；这里把它当成"给出 rank 列表"的黑盒，用运行结果核对。
#
# 换别的 TP / PP / CP / EP 和 `order`，在[并行布局浏览器](../../explorers/layouts/)里看 `initialize_model_parallel` 建出的每个群。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`arguments.py::parse_and_validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L87) | `pretrain_gpt.py` 的 `__main__` 在调 `pretrain` **之前**先调它：解析参数、`validate_args`、设全局变量 |
# | [`training.py::pretrain`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1014) | 正式入口，第一件大事就是 `initialize_megatron` |
# | [`initialize.py::initialize_megatron`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L42) | 从 `get_args()` 取已解析好的参数，再调内部的 `finish_mpu_init` |
# | [`arguments.py::validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L388) | 在任何群存在之前先算一次 `data_parallel_size` |
# | [`initialize.py::_initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L265) | 设 GPU、`init_process_group`、调 `initialize_model_parallel` |
# | [`initialize.py::_set_random_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L418) | 按 PP / DP 坐标偏移种子（要先有群才能读坐标） |
# | [`run_simple_mcore_train_loop.py::initialize_distributed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L29) | simple loop 的初始化（`__main__` 里第一步） |
# | [`parallel_state.py::initialize_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L601) | 本篇主角：建全部群 |
# | [`parallel_state.py::create_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L232) | 对 `torch.distributed.new_group` 的薄包装 |
# | [`parallel_state.py::RankGenerator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L465) | 给出每类群的 rank 列表（笔记 08） |
# | [`parallel_state.py::default_embedding_ranks`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L560) | 默认 embedding 群：每个 PP 群的首、尾 rank |
# | [`parallel_state.py::destroy_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2506) | 把全局变量置回 `None`（并不全部，见遗留问题） |
# | [`random.py::model_parallel_cuda_manual_seed`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/random.py#L446) | 按 TP / EP 坐标建 RNG 流 |
# | [`process_groups_config.py::ProcessGroupCollection.use_mpu_process_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/process_groups_config.py#L205) | 把全局群打包成一个对象交给模型和 DDP |

# %% [markdown]
# ## 调用链
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
# 在本页，`init_process_group` 那一步由 `snippets.ranks.launch.run_ranks` 替我们做（gloo + 文件 store，
# 见[在 CPU 上运行](../../cpu/)）；每个 rank 的函数里只剩 Megatron 自己的那一行。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n02_groups import ORDERS, kinds_for, order_panels, run, run_orders
from snippets.ranks.groups import group_summary, rank_table, unique_groups
from snippets.ranks.launch import Grid, RankError, run_ranks
from snippets.ranks.pictures import draw_rank_grid, panel_table
from snippets.record.listing import listing
from snippets.record.tables import Table

from megatron.core import parallel_state

# %% [markdown]
# 每个 rank 上要跑的函数：调真实的 `initialize_model_parallel`，再用 Megatron 自己的 getter
# 读出本 rank 的坐标和所属的每个群（`describe_rank`）。
#
# 它就是 `snippets/experiments/n02_groups.py` 里的 `run`。并行尺寸装在 `Parallel` 里（world size 和 tp、pp、cp、ep）；
# `dims` 是模型尺寸，建群用不到。`kinds_for` 决定表里列出哪些群：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(run, kinds_for)

# %%
TINY = EXPERIMENTS["groups"].tiny
PAR = Parallel(world=4, tp=2, pp=2)
ranks = run_ranks(run, 4, TINY, PAR, grid=dict(tp=2, pp=2))
rank_table(ranks, kinds=kinds_for(PAR))

# %% [markdown]
# 4 个 rank、TP=2、PP=2，所以 DP = 4 ÷ (2·2·1) = 1：每个 rank 的 DP 群只有它自己。坐标按
# `(tp, cp, dp, pp)` 排；默认 `order="tp-cp-ep-dp-pp"` 里 tp 变化最快，所以 TP 群是相邻 rank
# `[0, 1]`、`[2, 3]`，PP 群跨度最大 `[0, 2]`、`[1, 3]`。embedding 群取每个 PP 群的首尾（这里恰好就是 PP 群），
# position embedding 群只取首 rank，rank 2、3 不在任何 position embedding 群里（`-`）。
#
# 把所有 rank 看到的群合在一起，就是 seed 000 那种"群 | 个数 × 每群卡数 | 成员"表：

# %%
group_summary({kind: unique_groups(ranks, kind) for kind in ("tp", "pp", "dp", "cp", "tp-pp", "embd")})

# %% [markdown]
# ### seed 000 的 16 卡例子，真的跑一次
#
# 16 个 rank、TP=2、PP=2 ⇒ DP=4。`run_orders` 在每个 rank 上用两种 `order` 各调一次
# `initialize_model_parallel(..., order=order)`（中间 `destroy_model_parallel`），读回 rank 5 和 rank 13 的三个群：
# 缺省的 `tp-cp-ep-dp-pp`，和正式入口 `--use-tp-pp-dp-mapping` 换上的 `tp-cp-ep-pp-dp`。
# 这两个 rank 的坐标为什么是这样、换 order 为什么改变成员，[笔记 08](../08_parallel_state_and_rank_generator/) 用 `RankGenerator` 的算术逐步推出。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(run_orders)

# %%
SEED = Parallel(world=16, tp=2, pp=2)
by_order = run_ranks(run_orders, 16, TINY, SEED, ORDERS, grid=dict(tp=2, pp=2))
panels = order_panels(by_order, SEED)
panel_table(panels)

# %% [markdown]
# 把 16 个 rank 按 rank 号每行 8 个排开（一行看作一台 8 卡机器），红框是 rank 5 和 13，彩色线连起它们的群。
# 缺省 order 下 TP、DP 群都在机内，只有 PP 群 `[5, 13]` 跨机器（画在两行之间）；换成 `tp-cp-ep-pp-dp` 后
# PP 群 `[5, 7]` 进了机内，跨机器的变成 DP 群 `[1, 5, 9, 13]`，梯度归约走机间网络。

# %%
draw_rank_grid(panels, title="16 卡、TP=2、PP=2、DP=4：两种 order 下 rank 5 与 rank 13 的群（真实运行）")

# %% [markdown]
# ### `initialize_model_parallel` 里到底发生了什么
#
# 下面把 `parallel_state.create_group` 换成一个记录调用的"探针"，再调一次真实的初始化，
# 同时用 `snippets.record.recorder` 记录期间发出的每个 collective，并比较模块全局变量的前后变化。

# %%
def init_and_watch(tp, pp):
    from snippets.record import recorder

    created, real_create_group = [], parallel_state.create_group

    def probe(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None):
        created.append((group_desc, backend or "默认", list(ranks)))
        return real_create_group(ranks, timeout, backend, pg_options,
                                 use_local_synchronization, group_desc)

    parallel_state.create_group = probe
    before = dict(vars(parallel_state))
    with recorder.record() as collectives:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    changed = sorted(k for k, v in vars(parallel_state).items()
                     if k.startswith("_") and k[1:2].isupper() and before.get(k) is not v)
    return created, collectives, changed


watched = run_ranks(init_and_watch, 4, 2, 2)
created, collectives, changed = watched[0]
print("每个 rank 调用 create_group 的次数:", [len(w[0]) for w in watched])
print("4 个 rank 的调用序列（描述 + 成员）完全相同:", all(w[0] == created for w in watched))
print("初始化期间记录到的 collective 条数:", [len(w[1]) for w in watched])
print("被设置的模块全局变量个数:", len(changed))

# %% [markdown]
# 按建群顺序合并同类项（`backend` 为"默认"表示沿用 world 的 backend：GPU 上是 NCCL，这里是 gloo）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def creation_order(created):
    rows, index = [], {}
    for desc, backend, members in created:
        if (desc, backend) not in index:
            index[(desc, backend)] = len(rows)
            rows.append([len(rows) + 1, desc, backend, 0, []])
        row = rows[index[(desc, backend)]]
        row[3] += 1
        row[4].append(members)
    return Table(["#", "group_desc", "backend", "建了几个", "成员"],
                 [r[:4] + [" ".join(map(str, r[4]))] for r in rows])


creation_order(created)

# %% [markdown]
# 三件事从运行里读出来：
#
# - **每个 rank 都建每个群。** rank 3 不在 `[0, 1]` 里，却也调用了 `create_group([0, 1])`：
#   `torch.distributed.new_group` 缺省要求全体 rank 以相同顺序调用（`create_group` 没开
#   `use_local_synchronization`）。所以代码的写法总是"遍历所有群 → 全部创建 → 只把含自己的那个存进全局变量"。
# - **建群不是 collective。** 期间记录到 0 条 collective：`new_group` 的协调走的是 store（这里是文件，
#   GPU 集群上是 `MASTER_ADDR` 上的 TCPStore）。通信发生在以后用这些群的时候。
# - **打头的是 GTP 群，然后才是 `dp-cp`。** 0.19.0 新增了"带权重重物化的广义张量并行"（`gtp_remat`，把权重再按
#   输出维切给几个 rank，每次前向、反向前 all-gather 回来）。不开它时大小为 1，[parallel_state.py:939](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L939)
#   照样为每个 rank 建一个单人群 `GTP_WEIGHT_REMAT_GROUP`，expert 一侧也一样（`EXPERT_GTP_WEIGHT_REMAT_GROUP`）；
#   再加上一个按 `tp-ep-gtp_remat-pp` 切的 expert 群，4 rank 时比不开 GTP 的旧版多出 9 次 `create_group`。
#   紧接着才是 `dp-cp`：源码注释说 IB SHARP 只能用在第一个以 `NCCL_COLLNET_ENABLE=1` 创建的
#   communicator 上，而 DP×CP 群是最可能要它的那个（[parallel_state.py 第 958–962 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L958-L962)），
#   可这段注释要求的"最先建"在 0.19.0 已被 GTP 那段循环抢先（见遗留问题 5）。
#
# > **旧版（core_v0.18.0）：** 没有 `gtp_remat` 这一维：同样 4 rank、TP=2、PP=2，每个 rank 调 53 次 `create_group`、
# > 设置 34 个全局变量，`DATA_PARALLEL_GROUP_WITH_CP` 是第一个建的群（[core_v0.18.0 的 parallel_state.py 第 845 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/parallel_state.py#L845)）。
#
# 被改动的全局变量（训练状态之外的"进程状态"）：

# %%
print(", ".join(changed))

# %% [markdown]
# ### 尺寸不对时
#
# `initialize_model_parallel` 在 [parallel_state.py 第 822 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L822) 检查 world size 能否被 `tp·pp·cp·gtp_remat` 整除（`gtp_remat` 缺省为 1），不能就抛
# `RuntimeError`。我们的启动器在**起进程之前**做同样的检查（`Grid`），错误信息直接说出三个数：

# %%
try:
    run_ranks(run, 4, TINY, Parallel(world=4, tp=3), grid=dict(tp=3))
except ValueError as err:
    print("启动前拒绝:", err)

try:
    run_ranks(run, 4, TINY, Parallel(world=4, tp=3))  # 不做检查，让 Megatron 自己报
except RankError as err:
    print("Megatron 在每个 rank 上报:", err.summary)

# %% [markdown]
# ## 关键对象
#
# **`args` 里与本篇有关的字段**（`megatron/training/arguments.py`；0.19.0 里这几项的缺省值写在
# `megatron/training/config/common_config.py` 的 `DistributedInitConfig` 里，命令行选项由它生成）：
#
# | 字段 | 来源 | 去向 |
# |---|---|---|
# | `rank`、`world_size` | 环境变量 `RANK`、`WORLD_SIZE`（torchrun 设置） | `init_process_group(rank=, world_size=)` |
# | `local_rank` | `--local-rank`，缺省读 `LOCAL_RANK` | `torch.cuda.set_device(local_rank)` |
# | `distributed_backend` | `--distributed-backend`，缺省 `nccl`（可选 `gloo`） | `init_process_group(backend=)` |
# | `distributed_timeout_minutes` | 缺省 10 | world 群和每个子群的 timeout |
# | `tensor_model_parallel_size` 等 | `--tensor-model-parallel-size`、`--pipeline-model-parallel-size`、`--context-parallel-size`、`--expert-model-parallel-size` | 原样交给 `initialize_model_parallel` |
# | `data_parallel_size` | `validate_args` 里算出：`world // (tp·pp·cp)` | microbatch 计算器；`initialize_model_parallel` 不读它，自己再算一遍 |
# | `use_tp_pp_dp_mapping` | `--use-tp-pp-dp-mapping` | 把 `order` 从 `tp-cp-ep-dp-pp` 换成 `tp-cp-ep-pp-dp` |
#
# **两个网格。** `initialize_model_parallel` 造两个 `RankGenerator`：decoder 网格 `(tp, cp, dp, pp)`
# 给 attention 和稠密层；expert 网格 `(etp, ep, edp, pp)` 给 MoE 的 expert（`etp` 缺省等于 `tp`，
# CP 被并进 expert 的 DP 维）。两个网格必须切出同样的 PP 群，因为一个 stage 里既有 attention 也有 expert。
# 0.19.0 在两个网格的 order 里各插入一维 `gtp_remat`（decoder 插在 tp 后、expert 插在 ep 后，
# [parallel_state.py:857](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L857)）；
# 它缺省为 1，不改变任何群的成员，掩码算法见[笔记 08](../08_parallel_state_and_rank_generator/)。
#
# **模块全局变量。** 结果全部存在 `parallel_state` 的模块全局变量里（上面列出的 44 个，其中 10 个属于 GTP：
# 不开 GTP 时，`..._WITH_GTP_REMAT` 这几个只是指向原有 DP 群的别名）。
# 0.19.0 里越来越多的模块接受显式的 `pg_collection`；
# [`ProcessGroupCollection.use_mpu_process_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/process_groups_config.py#L205)
# 就是把这些全局群打包成一个对象。
#
# **每个函数的阅读记录**（roadmap 第一轮的七问）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `parse_and_validate_args` | `extra_args_provider`、`args_defaults` | `args` | 无 | 否 | 否 | 是：全局 args、tokenizer、timers | 无（simple loop 不解析命令行） |
# | `initialize_megatron` | embedding 规则函数、`store`、`skip_model_parallel_init` 等开关（参数本身从 `get_args()` 取） | 通常 `None`（lazy 模式返回 `finish_mpu_init`） | `parallel_state`、RNG tracker | 是（经下一行） | 否 | 是：RNG、rerun 状态机 | `initialize_distributed` + `model_parallel_cuda_manual_seed` |
# | `_initialize_distributed` | embedding 规则函数、`store`、`skip_model_parallel_init`；其余读 `get_args()` | 无 | `initialize_model_parallel` | **是**：world 群 + 全部子群 | 否 | 是：当前 GPU、默认群、全局群 | `initialize_distributed` |
# | `initialize_model_parallel` | tp、pp、vpp、cp、ep、etp、`gtp_remat_size`、`order`、timeout、embedding 规则 | 无（写全局变量） | `RankGenerator`、`create_group`、`GlobalMemoryBuffer` | **是**：建群本身 | 否（只定坐标） | 是：44 个全局变量（上面实测） | `initialize_distributed` 内 |
# | `RankGenerator.get_ranks` | token，如 `"tp"`、`"dp-cp"` | 该类全部群的 rank 列表 | `generate_masked_orthogonal_rank_groups` | 否（纯算术） | 否 | 否 | 同上 |
# | `create_group` | ranks、timeout、backend、`group_desc` | 一个 `ProcessGroup` | 无 | **是**：`new_group` | 否 | 记入 `_global_process_group_list` | 同上 |
# | `_set_random_seed` | seed | 无 | `model_parallel_cuda_manual_seed` | 只读坐标 | 否 | 是：Python / NumPy / torch RNG | `model_parallel_cuda_manual_seed(123)` |
# | `destroy_model_parallel` | 无 | 无 | 无 | 只销毁 gloo 的 DP 群，其余只丢引用 | 否 | 是：清空大部分全局变量 | `initialize_distributed` 的第一行 |

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 本篇不搬运任何 tensor（上面实测 0 条 collective），所以没有"通信前后 shape"。它决定的是
# **以后每次通信在哪个群里发生**。之后的代码通过这些 getter 拿群：
#
# | getter | 成员 = 哪个网格的哪个 token | 谁用它 |
# |---|---|---|
# | [`get_tensor_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1704) | decoder `tp` | TP 层里的 f / g（笔记 09、10） |
# | [`get_pipeline_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1749) | decoder `pp` | pipeline 的 send / recv（笔记 13） |
# | [`get_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1758) | `dp`；加 `with_context_parallel=True` 为 `dp-cp`（0.19.0 另有 `with_gtp_remat`，缺省 True，多跨 GTP 维；GTP 为 1 时是同一个群） | DDP 用 `dp-cp` 归约梯度（笔记 14；`pg_collection` 取它时传 `with_gtp_remat=False`） |
# | [`get_context_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1828) | decoder `cp` | attention 里交换 K/V（笔记 16） |
# | [`get_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1697) | decoder `tp-pp`（不含 CP） | 梯度范数等跨模型并行的归约 |
# | [`get_embedding_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1863) | 每个 PP 群的首尾 rank | 首尾 stage 同步共享词嵌入的梯度 |
# | [`get_expert_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2237) | expert `ep` | MoE 的 token all-to-all（笔记 17） |
#
# `dp` 与 `dp-cp` 的差别要在 CP > 1 时才看得出来。8 个 rank、TP=2、CP=2：

# %%
CP_PAR = Parallel(world=8, tp=2, cp=2)
cp_ranks = run_ranks(run, 8, TINY, CP_PAR, grid=dict(tp=2, cp=2))
rank_table(cp_ranks, kinds=kinds_for(CP_PAR))

# %% [markdown]
# CP 的两个 rank 持有**同一份**权重、处理同一条序列的不同片段，所以对权重梯度来说它们和 DP 副本一样
# 需要求和：DDP 归约梯度用的是 `dp-cp` 群（这里 4 个 rank），不是 `dp` 群（2 个 rank）。

# %% [markdown]
# ## 机制解释
#
# **先 world，后子群。** `init_process_group` 只解决"大家互相找到、建一个全员默认群"。之后每个并行维度的群
# 都是用 `new_group` 从 world 里切出的子集。Megatron 把"怎么切"集中在 `initialize_model_parallel` 一个函数里，
# 模型代码只通过 getter（或 `pg_collection`）拿群，从不自己算成员。
#
# **DP 是推出来的。** 用户只给 TP、PP、CP（以及 EP），DP = world ÷ (TP·PP·CP·GTP)，GTP 缺省为 1。正式入口里这个除法做两次：
# `validate_args` 在没有任何群时先算（microbatch 计算器要用），`initialize_model_parallel` 再独立算一次
# （[parallel_state.py 第 825 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L825)）。simple loop 只有后一次。
#
# **embedding 群是 PP 群的子集。** 每建一个 PP 群，就顺手按规则从中挑 rank 建 embedding 群（默认首尾）和
# position embedding 群（默认首）。`pretrain_gpt.py` 传入自己的规则：只有输入 embedding 与输出层共享权重时
# 才放入尾 rank。这个群以后用来在首尾 stage 之间 all-reduce 共享词嵌入的梯度。
#
# **随机种子在群之后。** `_set_random_seed` 给种子加 `100 × PP rank`；`model_parallel_cuda_manual_seed`
# 再为 TP 分片的参数维护一条单独的 RNG 流（种子 + 2718 + TP rank）。它们都要读坐标，所以排在建群之后。
#
# **simple loop 与正式入口的差别。** simple loop 先 `destroy_model_parallel`，再以 `nccl` 调
# `init_process_group`（不给 timeout），最后只带 TP、PP 调 `initialize_model_parallel`：子群 timeout 用
# 函数缺省的 30 分钟，而正式入口传入 `--distributed-timeout-minutes`（缺省 10）。

# %% [markdown]
# ## 与训练主链路的关系
#
# 这是 `pretrain` 的第一步，也是 simple loop `__main__` 的第一步。之后每一步都假设群已存在：
# 构造模型时 `ColumnParallelLinear` 按 TP 坐标切权重（笔记 04、10）；`get_batch` 在 TP 群里广播 batch、
# 按 CP 坐标切序列（笔记 03）；pipeline schedule 用 PP 群的前后邻居 send / recv（笔记 13）；DDP 在 `dp-cp`
# 群里归约梯度（笔记 14）；`finalize_model_grads` 用 embedding 群同步共享词嵌入的梯度（笔记 06）。
# 初始化**不**改变任何模型参数或优化器状态，它改变的是进程状态：当前设备、默认群、几十个子群、RNG。

# %% [markdown]
# ## 与基础知识的连接
#
# - **Process group 与 collective**：collective 只在一个群内发生，群里每个成员都必须调用同一个 collective。
#   Megatron 的全部并行最终都落实为"在某个群里做某种 collective"，所以"谁和谁一个群"就是并行策略本身。
# - **rendezvous**：`torchrun` 为每个进程设 `RANK`、`WORLD_SIZE`、`LOCAL_RANK`、`MASTER_ADDR`、`MASTER_PORT`；
#   `init_process_group` 缺省走 `env://`，用后两个找到彼此。本页用文件 store 代替，效果相同、不占端口。
# - **拓扑**：默认 order 里 TP 变化最快，TP 群是相邻 rank，只要 TP ≤ 单机 GPU 数就走机内 NVLink；
#   PP 变化最慢，PP 群通常跨机，而 PP 只有点对点的激活传输，对带宽最不敏感。

# %% [markdown]
# ## 遗留问题
#
# 1. **`destroy_model_parallel` 没清干净（运行确认）。** 它把大部分群变量置 `None`，但不重置
#    `_EMBEDDING_GLOBAL_RANKS`、`_PIPELINE_GLOBAL_RANKS` 等"成员列表"变量。下面的单元格在 destroy 之后查询：
#    `model_parallel_is_initialized()` 已是 False，`is_rank_in_embedding_group()` 却仍为 True。
#    它也只 `destroy_process_group` 了 gloo 的 DP 群，其余群只是丢掉引用——在 gloo 上反复建群会累积线程和
#    文件描述符，这是本站每个实验都用新进程的原因。
# 2. **不 destroy 就再初始化会断言失败（运行确认）**，报的是第一个被检查的群（DP 群）。
# 3. **CPU 上正式入口不建子群。** `_initialize_distributed` 只在 `torch.cuda.device_count() > 0` 时调用
#    `initialize_model_parallel`（[initialize.py 第 358 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/initialize.py#L358)，0.19.0 还多了 `skip_model_parallel_init` 让调用者自己建群）；所以本站像 simple loop 那样直接调它。
# 4. **docstring 与签名不一致。** `order` 的文档说缺省是 `tp-dp-pp`，签名里的缺省却是 `tp-cp-ep-dp-pp`
#    （[parallel_state.py 第 617 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L617)），代码实际接受任何包含全部非 1 维度的排列（笔记 08）。
# 5. **"dp-cp 最先建"的注释与代码不再一致。** SHARP 那段注释仍要求 `dp-cp` 是第一个建的群，但 0.19.0 在它前面先建了
#    GTP 的单人群（[parallel_state.py:939](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L939)，上面的建群顺序表第 1 行）。
#    NCCL 对单人群是否真的创建 communicator、会不会占掉 COLLNET 的名额，要在开 SHARP 的集群上才能确认，本站在 CPU 上无法验证。

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
# 62 次（含 gloo 的 DP 群，以及 0.19.0 为 GTP 维新增的 9 次），4 个 rank 的序列完全相同。`new_group` 要求全体 rank 以相同顺序调用，
# 所以每个 rank 都建每个群，只把含自己的那个存下来。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(created), ("DATA_PARALLEL_GROUP", "默认", [0]) in watched[3][0],
      ("TENSOR_MODEL_PARALLEL_GROUP", "默认", [0, 1]) in watched[3][0])

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
# **5. `initialize_model_parallel` 本身发出多少次 collective？**
#
# <details><summary>答案</summary>
#
# 0 次。建群靠 `new_group` 经 store 协调，不是 collective；通信发生在以后用这些群的时候。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(sum(len(w[1]) for w in watched))

# %% [markdown]
# **6. 回到 seed 000 的 16 卡例子（TP=2、PP=2、DP=4，缺省 order）：rank 13 的坐标是什么？它的 TP 群、DP 群、PP 群各由哪些 rank 组成？**
#
# <details><summary>答案</summary>
#
# 缺省 order 里 tp 变得最快、pp 最慢，所以 rank = tp + 2·dp + 8·pp：13 = 1 + 2·2 + 8·1，坐标是 tp 1、dp 2、pp 1。
# 同一 TP 群只差 tp 坐标：[12, 13]；同一 DP 群只差 dp 坐标、步长 2：[9, 11, 13, 15]；同一 PP 群只差 pp 坐标、
# 步长 8：[5, 13]。上面那次 16 rank 的真实运行读回的就是这三个列表。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
rank13 = by_order[13][0]  # the default order's run, as rank 13 saw it
print("坐标:", {k: rank13["coords"][k] for k in ("tp", "dp", "pp")})
print({kind: rank13["groups"][kind] for kind in ("tp", "dp", "pp")})

# %% [markdown]
# ## 30-second answer
#
# Megatron starts in two steps. `_initialize_distributed` picks the GPU from `LOCAL_RANK` and calls
# `init_process_group` (NCCL by default, 10-minute timeout), which only creates the world group.
# Then `initialize_model_parallel` derives DP = world / (TP·PP·CP·GTP), lays ranks on two grids — dense
# and expert — with `RankGenerator`, and every rank calls `new_group` for every group in the same order,
# keeping only its own in module globals: 62 calls for 4 ranks at TP2·PP2 (nine of them new at 0.19.0,
# for the GTP axis that defaults to size 1), and not a single collective.
# Later code just asks getters such as `get_tensor_model_parallel_group()`.
