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
# # 08 parallel_state 与 RankGenerator：每个 rank 的坐标从哪来
#
# 16 张卡、TP=2、PP=2 时，rank 5 和谁一起做 TP、和谁一起做 DP、把激活发给谁？为什么缺省布局让 TP 群落在同一台机器里、
# 让 PP 群跨机器？加上 EP（和 0.19.0 新增的 `gtp_remat` 维）以后这些群怎么变？答案全在 `parallel_state.py` 的
# `RankGenerator` 里：一段不需要通信的纯算术。本篇直接调用它算出答案，再让 8 个进程跑真实的
# `initialize_model_parallel`，核对建出的群与算术一致。

# %% [markdown]
# ## 阅读目标
#
# 1. 给定各维大小和 `order` 字符串，手算任意 rank 的坐标和它所在每种群的成员。
# 2. 说清 `get_mask` 产生的掩码如何驱动 `generate_masked_orthogonal_rank_groups`：哪些维"在群内变化"，哪些维"决定第几个群"。
# 3. 说清为什么 `initialize_model_parallel` 用**两个**生成器（decoder 网格、expert 网格），以及 0.19.0 的 `gtp_remat` 维插在哪里。
# 4. 复现 16 卡例子（TP=2、PP=2 ⇒ DP=4；rank 5、rank 13），说清换 `order` 改变什么、哪些 order 合法。
#
# **结论**
#
# - rank 是混合进制数，`order` 从左到右由快到慢：缺省 `tp-cp-ep-dp-pp`、16 卡 TP=2、PP=2 时 rank 5 = (tp 1, dp 2, pp 0)。
# - rank 5 在 TP 群 `[4, 5]`、DP 群 `[1, 3, 5, 7]`、PP 群 `[5, 13]`：一台机器 8 卡时只有 PP 群跨机器。
# - 每种群是一个掩码切片，`order` 决定谁相邻：`tp-pp` 是 4 群 × 4，第一个 `[0, 1, 8, 9]`；`dp-tp-pp` 下 rank 5 的 TP 群是 `[1, 5]`。
# - 两个生成器共用 PP 群，EP 折进 DP：8 卡 TP=ETP=2、EP=2 时 EP 群 `[0, 2]` 在 DP 群 `[0, 2, 4, 6]` 里；0.19.0 的 `gtp_remat` 维缺省 1，开启时紧跟 tp。
# - 坑：`order` 只做子串检查，`tp-tp-dp-pp` 在 8 卡上不报错，PP 群却成了 `[0, 8]` … `[3, 11]`。
#
# 先读：[笔记 02](../02_distributed_initialization/)（何时建群）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n08_rank_generator import (ETP, checked_kinds, comparison_table, folded, generators,
                                                     grid_sizes, init_with_experts, run, tables)
from snippets.ranks.groups import coordinates, describe_rank, group_summary, groups_along, rank_of
from snippets.ranks.launch import RankError, run_ranks
from snippets.ranks.pictures import draw_rank_grid, panel_from_generator
from snippets.record.listing import listing
from snippets.record.tables import Table

from megatron.core.parallel_state import RankGenerator

panels = [panel_from_generator(RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1, order=o), (5, 13), order=o)
          for o in ("tp-cp-ep-dp-pp", "dp-tp-pp")]
draw_rank_grid(panels, title="order 决定谁相邻：16 卡 TP=2、PP=2 下，缺省 tp-cp-ep-dp-pp 让 rank 5 与 13 只有 PP 群跨机器，"
                             "dp-tp-pp 把 TP 群拉开、把 DP 群挤成相邻")

# %% [markdown]
# 图中每行 8 个 rank 是一台机器，红框是 rank 5 和 13，彩线连起它们的 tp、dp、pp 群，跨机器的画在两行之间。
# 左：缺省 order 只有 PP 群 `[5, 13]` 跨机器；右：`dp-tp-pp` 的 TP 群 `[1, 5]` 隔了 3 个 rank。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - `RankGenerator` 是纯算术：关键对象一节的单元格直接在 notebook 进程里调用它，不起进程、不建群。
# - "真实的 `initialize_model_parallel`"那一段起 8 个本地 gloo 进程（`snippets.ranks.launch.run_ranks`），每个进程调
#   `initialize_model_parallel(tp=2, pp=2, ep=2, etp=1)`，再用 Megatron 的 getter 读回自己的坐标和群
#   （`snippets.ranks.groups.describe_rank`，与笔记 02 的 `groups` 实验读法相同），结果回到 notebook 进程打印。
#   实验代码在 `snippets/experiments/n08_rank_generator.py`（`run`、`tables`、`comparison_table`）；
#   ETP 取 1，这样 order 以 pp 结尾时 EDP = world ÷ (EP·PP) 对任何合法的 EP 都存在。
# - 不建模型、不搬运 tensor，所以实验的 `tiny` 尺寸全是 1，只用到并行大小。
# - 命令行复现同一张逐 rank 表和比较表：
#
#   ```bash
#   .venv/bin/python -m snippets.run --nproc-per-node 8 rank-generator --tp 2 --pp 2 --ep 2
#   ```
#
# - 重新执行整页（输出存进 `.ipynb`，CI 用 nbval 逐格比对）：`scripts/execute_notes.sh notes/08_parallel_state_and_rank_generator.py`。
# - 在 CPU 上建群需要的兼容处理（gloo 代替 NCCL 等）见 [CPU 说明](../../cpu/)；本篇没有额外的补丁。
#
# </details>

# %% [markdown]
# ## 源码位置
#
# | 符号 | 角色 |
# |---|---|
# | [`parallel_state.py::RankGenerator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L465) | 一个带顺序的六维网格（0.19.0 在 tp、ep、dp、pp、cp 之外加了 `gtp_remat`） |
# | [`parallel_state.py::RankGenerator.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L468) | 校验 order、补齐大小为 1 的维、得到 `ordered_size` |
# | [`parallel_state.py::RankGenerator.get_mask`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L519) | token → 布尔掩码 |
# | [`parallel_state.py::RankGenerator.get_ranks`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L534) | token → 这一类的全部群 |
# | [`parallel_state.py::generate_masked_orthogonal_rank_groups`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L269) | 混合进制分解，核心算术 |
# | [`parallel_state.py::initialize_model_parallel`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L601) | 造两个生成器，按 token 建群 |
# | [`parallel_state.py::_inject_gtp_remat_axis`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L582) | 0.19.0 新增：把 `gtp_remat` 插进 order（decoder 插在 tp 后，expert 插在 ep 后） |
#
# <details><summary>另外 3 个符号</summary>
#
# | 符号 | 角色 |
# |---|---|
# | [`parallel_state.py::RankGenerator.get_gtp_ranks`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L552) | 0.19.0 新增：`get_ranks("gtp_remat")`，先核对大小 |
# | [`parallel_state.py::default_embedding_ranks`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L560) | 从每个 PP 群挑 embedding 群 |
# | [`hyper_comm_grid.py::HyperCommGrid`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/hyper_comm_grid.py#L46) | 另一套 n 维网格建群的实现（遗留问题） |
#
# </details>

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/core/parallel_state.py::initialize_model_parallel
# ├─ _inject_gtp_remat_axis(order, after="tp")                  # decoder：gtp_remat 插在 tp 后
# ├─ RankGenerator(tp=TP, cp=CP, ep=1, dp=DP, pp=PP, gtp_remat=GTP)       # decoder 网格
# ├─ _inject_gtp_remat_axis(order, after="ep")                  # expert：插在 ep 后
# ├─ RankGenerator(tp=ETP, cp=1, ep=EP, dp=EDP, pp=PP, gtp_remat=EGTP)    # expert 网格
# ├─ 两个网格的 get_ranks("pp") 必须相同
# └─ 对每个 token（顺序见笔记 02）
#    ├─ RankGenerator.get_ranks(token)
#    │  ├─ RankGenerator.get_mask(order, token)                 # token → 掩码
#    │  └─ generate_masked_orthogonal_rank_groups(...)          # 掩码 → rank 列表
#    └─ create_group(ranks)                                     # torch.distributed.new_group
# ```
#
# 建群的顺序与开销见[笔记 02](../02_distributed_initialization/)；这里只看成员怎么算。
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `RankGenerator.__init__` | `tp, ep, dp, pp, cp`、`order`、`gtp_remat`（缺省 1） | 补齐后的 `order`、`ordered_size`、`world_size`（六个大小之积，不问 torch） | 无 | 否 | 否 | 否 | `initialize_distributed` 内 |
# | `RankGenerator.get_mask` | `order`、token | 与 order 等长的布尔列表 | 无 | 否 | 否 | 否 | 同上 |
# | `RankGenerator.get_ranks` | token | 该类全部群（list of list，各自升序） | `get_mask`、`generate_masked_orthogonal_rank_groups` | 否（只算成员） | 否 | 否 | 同上 |
# | `generate_masked_orthogonal_rank_groups` | world、按 order 排的大小、掩码 | list of list | 无 | 否 | 否 | 否 | 同上 |
#
# `initialize_model_parallel` 的记录（输入各维大小与 `order`，写模块全局变量，建群本身）在[笔记 02](../02_distributed_initialization/)，这里不重抄。
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 16 卡、TP=2、PP=2 的三类群
#
# 16 张卡（2 台 × 8），TP=2、PP=2，DP = 16 ÷ (2·2) = 4。调用真实的 `RankGenerator`，取三类群：
#
# <details><summary>seed 000 给出的原表（省略号已展开），与下面的输出逐格相同</summary>
#
# <!-- same-as-next-output -->
# | group | count × size | members |
# |---|---|---|
# | tp | 8 × 2 | [0, 1] [2, 3] [4, 5] [6, 7] [8, 9] [10, 11] [12, 13] [14, 15] |
# | dp | 4 × 4 | [0, 2, 4, 6] [1, 3, 5, 7] [8, 10, 12, 14] [9, 11, 13, 15] |
# | pp | 8 × 2 | [0, 8] [1, 9] [2, 10] [3, 11] [4, 12] [5, 13] [6, 14] [7, 15] |
#
# </details>

# %%
gen = RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1, order="tp-cp-ep-dp-pp")
group_summary({token: gen.get_ranks(token) for token in ("tp", "dp", "pp")})

# %% [markdown]
# ### 掩码与混合进制
#
# `RankGenerator` 把 order 从左到右读成变化从快到慢的维，rank 是一个混合进制数，每一位是一个坐标：
#
# rank = tp + 2·cp + 2·ep + 2·dp + 8·pp（步长 = 左边各维大小之积；cp、ep 大小为 1 不占位）。
#
# 0.19.0 的 `RankGenerator` 多认一维 `gtp_remat`（缺省 1）；order 里没写就补在最后，所以下面的 order
# 以 `-gtp_remat` 结尾，`ordered_size` 和掩码都是 6 项；大小为 1，rank 的算法不变。
#
# 一个 token（如 `"dp"`、`"tp-pp"`）变成一个掩码：被选中的维**在群内变化**，没被选中的维**固定**，
# 它们的取值决定"这是第几个群"。所以群大小 = 被选中各维大小之积，群数 = world ÷ 群大小。

# %%
print("order:", gen.order, " ordered_size:", gen.ordered_size)
Table(["token", "mask", "群数 × 群大小", "第 0 个群"],
      [[t, gen.get_mask(gen.order, t), f"{len(gen.get_ranks(t))} × {len(gen.get_ranks(t)[0])}",
        gen.get_ranks(t)[0]] for t in ("tp", "dp", "pp", "tp-pp", "dp-cp", "tp-dp")])

# %% [markdown]
# 以 `tp-pp` 为例：选中 tp（步长 1）和 pp（步长 8），群大小 2·2 = 4；第 0 个群的群内序号 0–3 拆成
# (tp, pp) = (0,0) (1,0) (0,1) (1,1)，乘上步长就是 `[0, 1, 8, 9]`。
# 按"其余坐标都相同的 rank 归成一组"自己重写十几行，8 种 token 都与 `get_ranks` 相同（折叠单元格）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
sizes = dict(tp=2, cp=1, ep=1, dp=4, pp=2, gtp_remat=1)
tokens = ("tp", "dp", "pp", "cp", "tp-pp", "dp-cp", "tp-dp", "tp-dp-cp")
print(all(sorted(gen.get_ranks(t)) == groups_along(t, sizes, gen.order) for t in tokens))

# %% [markdown]
# ### rank 5 与 rank 13
#
# rank 5 = 1 + 2·2 + 8·0，rank 13 = 1 + 2·2 + 8·1。它们各在哪些群里：

# %%
def groups_of(rank, gen, tokens=("tp", "dp", "pp", "tp-pp")):
    return {t: next(g for g in gen.get_ranks(t) if rank in g) for t in tokens}


Table(["rank", "坐标", "tp", "dp", "pp", "tp-pp"],
      [[r, {k: v for k, v in coordinates(r, sizes, gen.order).items() if sizes[k] > 1},
        *groups_of(r, gen).values()] for r in (5, 13)])

# %% [markdown]
# 两个 rank 只差 pp 坐标：TP、DP 群各在自己的机器上，共用的 PP 群 `[5, 13]` 跨机器；
# 模型并行群 `tp-pp` 是 `[4, 5, 12, 13]`，同一份模型的四个切片。
#
# ### 换一个 order
#
# order 决定谁相邻。同样 16 卡、TP=2、PP=2，rank 5 在三种 order 下的群（开头的图画的是第一、三行；
# 任意大小和 order，含 Megatron 拒绝的组合，见[并行布局浏览器](../../explorers/layouts/)）：

# %%
def order_row(order):
    g = RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1, order=order)
    return [order, g.order, *groups_of(5, g, ("tp", "dp", "pp")).values()]


Table(["order", "补齐后", "rank 5 的 tp", "dp", "pp"],
      [order_row(o) for o in ("tp-cp-ep-dp-pp", "tp-pp-dp", "dp-tp-pp")])

# %% [markdown]
# - 缺省 `tp-cp-ep-dp-pp`：TP 相邻、PP 跨度最大（跨机）。
# - `tp-pp-dp`（正式入口的 `--use-tp-pp-dp-mapping` 给的是等价的 `tp-cp-ep-pp-dp`）：PP 群 `[5, 7]` 进了机内，
#   DP 群 `[1, 5, 9, 13]` 跨机，梯度归约走机间网络。
# - `dp-tp-pp`：TP 群 `[1, 5]` 不再相邻，DP 群挤成相邻的 `[4, 5, 6, 7]`；机器再小一些，TP 的高频 all-reduce 就会离开 NVLink。
#
# 大小为 1 的维如果没写进 order，会被补到末尾（`tp-pp-dp` → `tp-pp-dp-ep-cp-gtp_remat`）；大小大于 1 的维没写就报错：

# %%
try:
    RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=2, order="tp-pp-dp")
except RuntimeError as err:
    print("RuntimeError:", err)

# %% [markdown]
# ### 两个生成器：decoder 网格与 expert 网格
#
# | | tp 维 | cp 维 | ep 维 | dp 维 | pp 维 |
# |---|---|---|---|---|---|
# | decoder 网格 | TP | CP | 1 | DP = world ÷ (TP·CP·PP·GTP) | PP |
# | expert 网格 | ETP（缺省 = TP） | 1 | EP | EDP = world ÷ (ETP·EP·PP·EGTP) | PP |
#
# （GTP、EGTP：0.19.0 的 `gtp_remat` 维在两个网格上的大小，缺省 1，见下文。）
#
# 固定 PP 坐标后，剩下的 rank 被切了两次：稠密层看成 `TP × CP × DP`，expert 看成 `ETP × EP × EDP`。
# EP 因此不需要额外的卡，它"折叠"进了稠密的 DP（和 CP）里。8 卡、TP=2、EP=2 的两个网格：

# %%
decoder = RankGenerator(tp=2, ep=1, dp=4, pp=1, cp=1, order="tp-cp-ep-dp-pp")
expert = RankGenerator(tp=2, ep=2, dp=2, pp=1, cp=1, order="tp-cp-ep-dp-pp")
group_summary({"tp": decoder.get_ranks("tp"), "dp": decoder.get_ranks("dp"),
               "etp (expert tp)": expert.get_ranks("tp"), "ep": expert.get_ranks("ep"),
               "edp (expert dp)": expert.get_ranks("dp")})

# %% [markdown]
# EP 群 `[0, 2]` 是稠密 DP 群 `[0, 2, 4, 6]` 的一部分：EP × EDP = DP。
#
# ### CP 网格
#
# 8 卡、TP=2、CP=2 ⇒ DP=2。CP 位于 tp 和 dp 之间，rank = tp + 2·cp + 4·dp：

# %%
cp_gen = RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=2, order="tp-cp-ep-dp-pp")
group_summary({t: cp_gen.get_ranks(t) for t in ("tp", "cp", "dp", "dp-cp", "tp-cp", "tp-pp")})

# %% [markdown]
# 注意 `tp-pp`（model parallel 群）**不含** CP，而 `dp-cp` 含：CP 各 rank 持有同一份权重，在梯度看来它们和 DP 副本一样。
#
# ### 0.19.0 的 `gtp_remat` 维
#
# 0.19.0 加了"带权重重物化的广义张量并行"：权重在 TP 之外再按输出维切给 GTP 个 rank，前向、反向前用 all-gather
# 临时拼回。这些 rank 处理**不同**的数据，所以 GTP 像 TP 一样占用自己的 rank（DP 变成 world ÷ (TP·CP·PP·GTP)），
# 而"全部拿不同数据的 rank"是 `gtp_remat-dp` 群。`initialize_model_parallel` 用 `_inject_gtp_remat_axis` 把这一维插在
# tp 后面（[parallel_state.py:857](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L857)），让 GTP 群也是相邻 rank。
# 16 卡、TP=2、GTP=2、PP=2 ⇒ DP=2 时 rank 5 的群（纯算术）：

# %%
from megatron.core.parallel_state import _inject_gtp_remat_axis

gtp_order = _inject_gtp_remat_axis("tp-cp-ep-dp-pp", after="tp")
gtp_gen = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order=gtp_order, gtp_remat=2)
print("order:", gtp_gen.order, " ordered_size:", gtp_gen.ordered_size)
Table(["token", "rank 5 所在的群"],
      [[t, next(g for g in gtp_gen.get_ranks(t) if 5 in g)]
       for t in ("tp", "gtp_remat", "dp", "gtp_remat-dp", "tp-gtp_remat-pp", "pp")])

# %% [markdown]
# rank = tp + 2·gtp + 4·dp + 8·pp，rank 5 ⇒ (tp 1, gtp 0, dp 1, pp 0)。梯度只在持有同一块权重的副本间归约（`dp` 群 `[1, 5]`），
# 而数据切分、microbatch 计数要覆盖 `gtp_remat-dp` 群 `[1, 3, 5, 7]`；所以 0.19.0 的 `get_data_parallel_group()`
# 缺省（`with_gtp_remat=True`）返回后者，`ProcessGroupCollection` 给 DDP 的 `dp` / `dp_cp` 则显式传 `with_gtp_remat=False`。
# GTP 为 1 时两者是同一个群。
#
# > **旧版（core_v0.18.0）：** `RankGenerator` 只有五维，没有 `gtp_remat` 参数和 `get_gtp_ranks`
# > （[core_v0.18.0 的 `RankGenerator.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/parallel_state.py#L449)）：补齐后的缺省 order 仍是 `tp-cp-ep-dp-pp`，
# > `ordered_size` 与掩码都是 5 项，DP = world ÷ (TP·CP·PP)。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 本篇不搬运 tensor，它决定之后每次 collective 的参与者。全部群的种类：
#
# | token（网格） | getter | 成员含义 | 主要使用者 |
# |---|---|---|---|
# | `tp`（decoder） | `get_tensor_model_parallel_group` | 只有 TP 坐标不同 | TP 层的 f / g（笔记 09、10）、batch 广播 |
# | `cp`（decoder） | `get_context_parallel_group` | 只有 CP 坐标不同 | attention 交换 K/V（笔记 16） |
# | `dp`（decoder；缺省还跨 `gtp_remat`） | `get_data_parallel_group()` | 只有 DP（和 GTP）坐标不同 | 数据采样 |
# | `dp-cp`（decoder） | `get_data_parallel_group(with_context_parallel=True)` | DP、CP 坐标都可不同 | DDP 梯度归约、分布式优化器切分（笔记 14、15） |
# | `pp`（两网格相同） | `get_pipeline_model_parallel_group` | 只有 PP 坐标不同 | stage 间 send / recv（笔记 13） |
# | `tp-pp`（decoder；0.19.0 的 token 是 `tp-gtp_remat-pp`） | `get_model_parallel_group` | 同一份模型的全部切片（不含 CP） | 梯度范数、inf 检查 |
# | `tp-dp-cp` / `tp-dp`（0.19.0 也插了 `gtp_remat`） | `get_tensor_and_data_parallel_group` | 同一 PP stage 的全部 rank | FP8 amax 归约 |
# | embedding | `get_embedding_group` | 每个 PP 群的首尾 | 共享词嵌入的梯度 all-reduce |
# | `ep`（expert） | `get_expert_model_parallel_group` | 只有 EP 坐标不同 | token dispatcher 的 all-to-all（笔记 17） |
# | `tp`（expert） | `get_expert_tensor_parallel_group` | 只有 ETP 坐标不同 | expert 内部的 TP |
# | `gtp_remat`（两网格各一） | `get_gtp_weight_remat_group` / `get_expert_gtp_weight_remat_group` | 只有 GTP 坐标不同 | 0.19.0：权重重物化的 all-gather |
# | `dp`（expert） | `get_expert_data_parallel_group` | 持有同一份 expert 切片（含 CP） | expert 参数的梯度归约 |
#
# ### 真实的 `initialize_model_parallel` 与算术一致吗？
#
# 8 个进程（TP=2、PP=2、EP=2、ETP=1）各调真实的 `initialize_model_parallel`，再用 getter 读回坐标和群：
# 7 类群都与两个 `RankGenerator` 的 `get_ranks` 相同，坐标也都等于混合进制分解（核对表折叠在逐 rank 表下面）。
#
# 逐 rank 表里值得看的是 expert 三列：每个 stage 的 4 个 rank 被切了两次，稠密层看成 TP × DP = 2 × 2，
# expert 看成 ETP × EP × EDP = 1 × 2 × 2。ETP=1 时 expert 网格里变化最快的是 ep 维，所以 `ep` 群 `[0, 1]`
# 正好落在稠密 `tp` 群的位置上，`etp` 群只有自己，`edp` 群 `[0, 2]` 与稠密的 `dp` 群相同。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(init_with_experts, run, grid_sizes, generators, checked_kinds, comparison_table)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TINY = EXPERIMENTS["rank-generator"].tiny
PAR = Parallel(world=8, tp=2, pp=2, ep=2)
real = run_ranks(run, 8, TINY, PAR, grid=dict(tp=2, pp=2, ep=2, etp=ETP))
per_rank, expert_coords, compared = tables(real, TINY, PAR)
per_rank

# %% tags=["hide-input"] jupyter={"source_hidden": true}
folded("核对表：getter 报出的每类群 = RankGenerator.get_ranks；每个 rank 的 expert 坐标", compared, expert_coords)

# %% [markdown]
# ## 机制解释
#
# **一切群都是"掩码切片"。** rank 是多维数组的扁平下标，一种群是只让若干维变化的切片；给出掩码，同一个函数
# 就算出任何组合群（`tp-pp`、`tp-dp-cp`…），order 只在一处生效。
#
# **为什么 TP 在最左。** 最左的维步长为 1，TP 群由相邻 rank 组成。启动器通常把同一台机器的进程编成连续的 rank，
# 所以 TP ≤ 单机卡数时 TP 群在机内，走 NVLink。PP 在最右，PP 群跨度最大；PP 只传激活，对带宽最不敏感。
# 带宽需求 TP > CP > DP > PP，正是缺省 order 从左到右的顺序。
#
# **群内序号的意义。** 每个列表升序，所以 rank 在群里的序号 = 被选中各维坐标的混合进制值。
# `get_data_parallel_rank(with_context_parallel=True)` 因此是 `cp_rank + CP × dp_rank`，而不是"DP rank"：
# 分布式优化器用它决定本 rank 拥有哪一片状态，数据采样却用不含 CP 的 DP rank（自测 5 用运行验证）。
#
# **为什么需要 expert 网格。** expert 可以用比 attention 更小的 ETP 切，再用 EP 把不同 expert 放到不同 rank。
# 只用一个网格，总卡数就得是 `TP × CP × EP × DP × PP`；两个网格让 EP 折叠进 DP（和 CP），不需要额外的卡。
# 代价是两套切法在 PP 上必须一致，否则一个 rank 上的 attention 和 expert 会属于不同 stage。

# %% [markdown]
# ## 与训练主链路的关系
#
# "这个 rank 拿哪一份"都从这里的坐标出发：权重切片（TP / ETP，笔记 04、10）、样本（不含 CP 的 DP，笔记 03）、
# 序列切片（CP，笔记 16）、层（PP，笔记 13）、expert（EP，笔记 17）、优化器状态分片（dp-cp，笔记 15）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **行主序下标**：rank 是形状 `(pp, dp, ep, cp, tp)` 的数组的扁平下标（tp 变化最快），`get_ranks` 沿若干轴取切片。
# - **正交并行**：TP、CP、DP、PP 作用在不同对象上（权重的行列、序列、样本、层），可以独立组合；
#   两个掩码不相交时，一个 rank 的两种群只交于它自己。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **order 校验是子串匹配，重复的名字不会被拒绝（下面的运行）。** `__init__` 只检查每个名字是否出现在 order 里。
#    `order="tp-tp-dp-pp"` 在 8 卡网格上不报错，却算出含 rank 8–11 的 PP 群，而这个世界没有这些 rank。
#    正式入口只传两种合法 order；自己调 `initialize_model_parallel` 时要当心。
# 2. **docstring 与代码不一致。** `initialize_model_parallel` 的文档说 order 缺省 `tp-dp-pp`、只支持两种；
#    签名缺省是 `tp-cp-ep-dp-pp`，代码接受任何写全非 1 维的排列（PP 不在最后时要求 EDP = DP，见自测 4 的运行）。
# 3. **`HyperCommGrid` 与 `RankGenerator` 并存。** [`hyper_comm_grid.py::HyperCommGrid`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/hyper_comm_grid.py#L46) 是另一套 n 维网格建群的实现，
#    RL 的推理模型用它另建一套群：[`shards.py::build_inference_pg_collection`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/inference/shards.py#L18)
#    造两个 `HyperCommGrid`（decoder、expert），正式入口给推理模型另设并行尺寸时调用它；它不认 `gtp_remat` 维。
#    两者对同一组大小是否给出相同的 rank 列表，留到笔记 22 核对。

# %%
odd = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-tp-dp-pp")
print("world_size:", odd.world_size, " 补齐后:", odd.order)
print("pp 群:", odd.get_ranks("pp"))

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 关键对象一节和上面的坑只调用 `RankGenerator` 的算术，不需要进程，也不需要任何 CPU 补丁。
# - 核对 `initialize_model_parallel` 的那次运行（和自测 4、5）起 8 个本地进程，后端是 gloo；群的成员由同一段
#   `RankGenerator` 算术决定，与 NCCL 下相同。8 个进程只为凑够 TP × PP × EP = 8 的最小世界，没有模型和数据。
# - `gtp_remat` 只算了成员：本站在 CPU 上建群时不开 GTP，所以 GTP=2 的群只来自 `RankGenerator` 的算术。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 缺省 order、16 卡、TP=2、PP=2，rank 5 和 rank 13 的坐标是什么？**
#
# <details><summary>答案</summary>
#
# rank = tp + 2·dp + 8·pp。rank 5 ⇒ (tp 1, dp 2, pp 0)；rank 13 ⇒ (tp 1, dp 2, pp 1)。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(coordinates(5, sizes, "tp-cp-ep-dp-pp"), coordinates(13, sizes, "tp-cp-ep-dp-pp"))
print(rank_of(dict(tp=1, cp=0, ep=0, dp=2, pp=1), sizes, "tp-cp-ep-dp-pp"))

# %% [markdown]
# **2. `get_mask(order, "dp-cp")` 和 `get_mask(order, "cp-dp")` 一样吗？**
#
# <details><summary>答案</summary>
#
# 一样，都是 `[False, True, False, True, False, False]`（第 6 位是 0.19.0 补在末尾的 `gtp_remat`）：掩码只看哪些维被选中，与 token 的书写顺序无关。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(gen.get_mask(gen.order, "dp-cp"), gen.get_mask(gen.order, "dp-cp") == gen.get_mask(gen.order, "cp-dp"))

# %% [markdown]
# **3. 16 卡 TP=2、PP=2 时 `get_ranks("tp-pp")` 的第一个群是什么，怎么来的？**
#
# <details><summary>答案</summary>
#
# 被选中维 tp（大小 2，步长 1）和 pp（大小 2，步长 8）：群大小 4，群数 4。第 0 个群的未选中坐标全为 0，
# 群内序号 0–3 拆成 (tp, pp) = (0,0) (1,0) (0,1) (1,1)，乘步长得 `[0, 1, 8, 9]`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(gen.get_ranks("tp-pp")[0])

# %% [markdown]
# **4. 8 卡、TP=2、PP=2、EP=2、`order="tp-cp-ep-pp-dp"`（PP 不在最后）会怎样？**
#
# <details><summary>答案</summary>
#
# DP = 8 ÷ 4 = 2，而 EDP = 8 ÷ (ETP 2 · EP 2 · PP 2) = 1。PP 不在最后且 PP > 1 时代码要求 EDP = DP，断言失败。
# 把 ETP 设为 1 则 EDP = 2，可以通过。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def init_with_order(etp):
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2,
        expert_tensor_parallel_size=etp, order="tp-cp-ep-pp-dp")
    return describe_rank()["groups"]["pp"]


try:
    run_ranks(init_with_order, 8, etp=2)
except RankError as err:
    print("ETP=2:", err.summary)
print("ETP=1, rank 0 的 pp 群:", run_ranks(init_with_order, 8, etp=1)[0])

# %% [markdown]
# **5. 8 卡、TP=2、CP=2，rank 6 的 `get_data_parallel_rank()`、`get_data_parallel_rank(with_context_parallel=True)`、
# `get_expert_data_parallel_rank()` 各是多少？**
#
# <details><summary>答案</summary>
#
# rank 6 = 0 + 2·1 + 4·1 ⇒ (tp 0, cp 1, dp 1)。不含 CP 的 DP 群 `[2, 6]` 里序号 1；`dp-cp` 群 `[0, 2, 4, 6]`
# 里序号 3（= cp + 2·dp）；expert DP 群与 `dp-cp` 群相同，序号也是 3。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def dp_ranks():
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=2)
    return (ps.get_data_parallel_rank(), ps.get_data_parallel_rank(with_context_parallel=True),
            ps.get_expert_data_parallel_rank())


print(run_ranks(dp_ranks, 8, grid=dict(tp=2, cp=2))[6])

# %% [markdown]
# **6. 一句话：`parallel_state.py` 做什么？其他代码怎样用到它的结果？**
#
# <details><summary>答案</summary>
#
# 它只在启动时做一件事：拿到 TP、PP、CP、EP 的大小和 order，推出 DP，用 `RankGenerator` 把每个 rank 看成一个混合进制数，
# 给它一组坐标，并为每类群算出全部成员、全体 rank 一起建好，把含自己的那个存进模块的全局变量。之后模型、DDP、
# schedule 都不再算成员，只调 `get_tensor_model_parallel_group()` 这类 getter 取群、取序号，再在群上通信。
# 缺省 order 的 tp 变得最快，所以 TP 群是相邻 rank，一台机器之内。上面 8 个 rank 的真实运行就是证据：getter 读回的
# 每类群都等于 `RankGenerator` 的算术。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("rank 0 经 getter 读回的坐标:", real[0]["coords"])
print("rank 0 的群:", {kind: real[0]["groups"][kind] for kind in ("tp", "dp", "pp", "ep")})
print("getter 报出的", len(compared.rows), "类群都等于 RankGenerator:", all(row[-1] for row in compared.rows))

# %% [markdown]
# ## 30-second answer
#
# `RankGenerator` treats a rank as a mixed-radix number whose digits follow the order string, leftmost
# fastest, so the default `tp-cp-ep-dp-pp` puts TP on adjacent GPUs and PP farthest apart. A token such
# as `dp` or `tp-pp` becomes a mask: masked dimensions vary inside a group, the others pick which group.
# With 16 GPUs at TP2·PP2, rank 5 is (tp1, dp2, pp0), in groups [4,5], [1,3,5,7] and [5,13]. A second
# generator re-slices the same ranks into expert-TP × EP × expert-DP, with the same pipeline groups.
# Since 0.19.0 both grids carry a sixth axis, `gtp_remat` (weight-sharding generalized TP, size 1 unless
# enabled), placed right after tp on the dense grid and after ep on the expert grid.
