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
# # 22 Refit 与 resharding：一份 weight，两种切法
#
# RL 每轮先让推理引擎按当前 policy 生成回答，再用训练框架更新一次参数。两边对同一份 weight 的切法不同（训练 TP4×PP2，
# vLLM TP8），存法也不同（Megatron 把 Q、K、V 交错存在一个矩阵里）。那么每更新一次，weight 怎样按新切法重切、送到推理端，
# 每张卡收多少字节、至少多久？Megatron Core 的 `swap_model_weights` 怎么做，verl 和 NeMo RL 又怎么做？

# %% [markdown]
# ## 阅读目标
#
# 1. 说清为什么**每一轮**都要同步 weight，以及为什么这不是一次 copy。
# 2. 读懂 `swap_model_weights`：planner 怎样让每个 rank 各自算出同一份计划，copy service 怎样执行。
# 3. 说清 `linear_qkv` 为什么按 query group 交错存，转成 Hugging Face / vLLM 的 `q_proj`、`k_proj`、`v_proj` 要做什么。
# 4. 会估算一次 refit 每卡收多少、多久，说得出 verl、NeMo RL 每轮实际怎么送。
#
# **结论**
#
# - 每轮必须同步：训练一步后 policy 的 logits 最多变 0.6925，不同步的 rollout 算出的仍是旧 policy。
# - `swap_model_weights` 第一次同步 6 个 collective（两次 `all_gather_object` 各 2 个 + 收发 + barrier），之后每轮 2 个。
# - plan 只送目标那片：TP2·PP2 → TP4，每个 rank 收 53248 字节，正是它的 rollout 参数；r0 有 26496 字节不出进程。
# - 收发怎样对上：本地拷贝按 `task_id` 配对，远端片靠两边按同一顺序提交（r0 → r1 的 13 片逐个对上）。
# - 8B bf16、8 卡：只送切片每卡 2 GB（NVLink ≥ 4.44 ms）；verl colocated 的 Megatron 路径先聚齐整张量，每卡 14 GB。
#
# 先读：[笔记 08](../08_parallel_state_and_rank_generator/)（群）、[笔记 13](../13_pipeline_schedules/)（pipeline schedule）；约 30 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n22_refit import (MEANINGS, check_table, compact, gpt, gpt_config, one_rl_round,
                                            param_bytes, planner_roster, rank_row, rollout_groups, where)
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.rl import pictures, qkv_layout, refit_cost

import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from IPython.display import display
from megatron.core import parallel_state

TINY = EXPERIMENTS["refit"].tiny
SEQ, VOCAB, BATCH = TINY.seq, TINY.vocab, TINY.micro_batch_size
POS = torch.arange(SEQ).expand(BATCH, SEQ)
MASK = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).view(1, 1, SEQ, SEQ)  # True = 看不见

# every rank: build both models, swap_model_weights, train one step, swap again
ranks = run_ranks(one_rl_round, 4, TINY, tp=2, pp=2, grid=dict(tp=2, pp=2))
r0 = ranks[0]
plans = [r["plan"] for r in ranks]
matrix = refit_cost.plan_traffic(plans)
received = sorted({sum(matrix[s][d] for s in range(4)) for d in range(4)})
pictures.draw_traffic_matrix(
    matrix, [f"r{s}（训练 tp{s % 2}·pp{s // 2}）" for s in range(4)], [f"r{d}（tp{d}）" for d in range(4)],
    title=f"plan 只送目标那片：每个 rollout rank 收 {'、'.join(map(str, received))} 字节，对角线不出进程",
    desc="行是发送的训练 rank（TP、PP 坐标），列是接收的 rollout rank，格子是 plan 让它搬的字节；对角线是本地拷贝。")

# %% [markdown]
# 4 个 rank 上，训练模型按 TP2·PP2 切，rollout 模型按 TP4 切，两者都在每个 rank 上。`swap_model_weights` 的 plan 让每个
# rollout rank 收的字节正好等于它在 TP4 下持有的参数，不多送；颜色越深字节越多，对角线（红框）是不经过通信的本地拷贝。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 所有 rank 都是本机的 gloo 进程，由 `snippets.ranks.launch.run_ranks` 从 notebook 进程 fork 出来，结果交回 notebook 打印。
# - 实验 `refit`（`snippets/experiments/n22_refit.py`）：`one_rl_round` 在每个 rank 上建训练模型（`parallel_state` 的全局群，
#   每个 PP stage 只建自己的层）和 rollout 模型（`HyperCommGrid` 另建的 TP=4 群），调 `swap_model_weights(policy, rollout, "gloo")`，
#   用真实的 pipeline schedule 训练一步（再对本 rank 的参数做一次 `torch.optim.SGD`），比较 logits，再同步一次。尺寸是登记项的
#   `tiny`：4 层、hidden 32、8 个 head、4 个 query group、vocab 64、序列长 8，fp32，输入输出 embedding 不共享。
# - 两次同步的 collective 由 `snippets.record.recorder` 记录；plan 从 `refit.py` 的模块级缓存里取（`refit_cost.cached_plan`），
#   拆成记录（`refit_cost.plan_ops`）带回，字节矩阵由 `refit_cost.plan_traffic` 汇总，图由 `snippets.rl.pictures` 画。
#   `planner_roster` 在每个 rank 上按 `build_local_reshard_plan` 的做法取出它交给 `all_gather_object` 的（源, 目标）元数据。
# - 搬运量与时间：`snippets/rl/refit_cost.py`（NVLink 每卡 450 GB/s，InfiniBand 每卡 50 GB/s，GB 按 1e9 字节）。
# - `linear_qkv` 的重排：`snippets/rl/qkv_layout.py`（Megatron ↔ HF 的名字和行序，和一个照 HF Llama 写的 attention）。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 refit --tp 2 --pp 2` 打印本页实验的表；
#   `scripts/execute_notes.sh notes/22_refit_and_resharding.py` 重新执行整页。在 GPU 上同一个实验改用 `"nccl"`，例如
#   `python -m snippets.run --nproc-per-node 8 refit --dims dense-8b --tp 2 --pp 4`（仓库 README 的 “Running at real scale”）。
# - 读配置的 `weight-sync` 命令（`snippets/rl/weight_sync/`）的用法——选项、退出状态、怎样像 bash 那样展开启动脚本、旧名
#   `snippets.rl.verl_sync`——写在仓库 README 的 “RL: how a verl or NeMo RL run syncs its weights” 一节和 `weight-sync --help` 里。
# - CPU 上要的改动见文末「在 CPU 上怎么跑的」。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(one_rl_round, planner_roster)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`refit.py::swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L339) | 公开入口：按名字取 copy service，取（第一次就建）plan，执行 |
# | [`planner.py::build_local_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L454) | 一次 `all_gather_object` 收齐全部元数据，本 rank 算出自己的 plan |
# | [`planner.py::_iter_global_transfer_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L305) | 按固定顺序列出全局的每一次传输、编 `task_id` |
# | [`planner.py::_plan_tp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L194) | TP 参数：按两边份数的最小公倍数切成小片，逐片找源 |
# | [`execution.py::execute_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L58) | 按 plan 提交每一片，执行，barrier，写回暂存的切片 |
# | [`gloo_copy_service.py::GlooCopyService.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L52) | 本地片直接 `copy_`，远端片一次 `batch_isend_irecv` |
#
# <details><summary>其余 16 行</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`refit.py::get_or_create_service`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L117) | `"gloo"` / `"nccl"` / `"nvshmem"` / `"nixl"` → 进程内缓存的 `CopyService` |
# | [`refit.py::reshard_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L461) | 经 `_build_or_get_plan` 取 plan，对齐 buffer 的 dtype，再执行 |
# | [`refit.py::_build_or_get_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L208) | 按本 rank 号和两个模型的并行大小查模块级 `_plan_cache`，没有才建 |
# | [`refit.py::_build_plan_cache_key`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L86) | 缓存的键：rank、两边的 TP / PP / EP / DP 大小等，不是模型对象 |
# | [`refit.py::_harmonize_buffer_dtypes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L411) | 第一次同步时收齐源模型 persistent buffer 的 dtype，目标端不一致就改 |
# | [`planner.py::index_metadata_rosters`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L388)、[`planner.py::build_plan_from_rosters`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L403) | 收齐的元数据 → 两张名册；重放全局顺序、只留本 rank 的收发（纯函数，不通信） |
# | [`planner.py::build_centralized_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L503) | 旧名字，只发弃用警告再转给 `build_local_reshard_plan` |
# | [`planner.py::_emit_lcm_block_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L77)、[`planner.py::_finalize_dp_transfers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L247) | LCM 小片；不按 TP 切的参数整块来自一份副本 |
# | [`utils.py::extract_param_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L310) | 一个参数的 shape、TP 维、stride、所在的 TP / DP / PP 群 |
# | [`utils.py::_build_layer_module_prefix_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L259) | stage 内的 `layers.0` → 全局层号；两种切法靠它配对同一个参数 |
# | [`utils.py::select_src_metadata_balanced`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L532) | 源有多份副本时：目标 rank 自己有就用自己的，否则按目标 rank 轮流挑 |
# | [`utils.py::TransferOp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L20)、[`utils.py::ReshardPlan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L101) | 一片的收或发；一个 rank 的全部 send / recv |
# | [`base.py::match_local_ops_by_task_id`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/base.py#L71) | 同一 rank 上的收发按 `task_id` 配对，对不上就报错 |
# | [`nccl_copy_service.py::NCCLCopyService.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/nccl_copy_service.py#L37) | NCCL 版的 `run`：本地片在专用 stream 上拷，远端片一批 P2P 并等完 |
# | [`hyper_comm_grid.py::HyperCommGrid`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/hyper_comm_grid.py#L46) | 给 rollout 模型另建一套群，不碰 `parallel_state` 的全局群 |
# | [`attention.py::SelfAttention.get_query_key_value_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1812) | 按 query group 把 `linear_qkv` 的输出拆成 Q、K、V |
#
# Megatron 自己的单元测试 [`test_model_swap.py::test_swap_gpt_parametrized`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L297)
# 也是在同一批 rank 上各建源模型和目标模型（群由 [`test_model_swap.py::_build_pg_collection`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L48)
# 用 `HyperCommGrid` 建），换完 weight 比较输出；本篇照这个思路写实验。
#
# </details>

# %% [markdown]
# ## 调用链
#
# `swap_model_weights` 取 copy service → 取 plan（只在第一次建：一次元数据 `all_gather_object`，本 rank 重放全局顺序）→
# 第一次对齐 buffer dtype → `execute_reshard_plan`：逐片提交、`run()`、barrier、写回。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/core/resharding/refit.py::swap_model_weights(src, dst, "gloo")
# ├─ refit.py::get_or_create_service("gloo") → GlooCopyService()     # new_group(backend="gloo")，建一个 CUDA copy stream
# ├─ refit.py::_build_or_get_plan(src, dst)                          # 查 refit.py 的模块级 _plan_cache
# │  └─ 只在第一次：planner.py::build_local_reshard_plan(src, dst)  → 存进 _plan_cache
# │     ├─ planner.py::_extract_module_metadata(src)、(dst)          # 每个参数：名字（全局层号）、shape、TP 维、stride、群成员
# │     ├─ all_gather_object ×1                                        # world：所有 rank 的（源, 目标）元数据
# │     ├─ planner.py::index_metadata_rosters                          # 目标按 rank、源按参数名
# │     └─ planner.py::build_plan_from_rosters                         # 每个 rank 都重放同一份全局顺序
# │        └─ planner.py::_iter_global_transfer_ops  每个目标 rank 的每个参数，task_id 依次加 1
# │           ├─ utils.py::select_src_metadata_balanced                # 自己有副本就用自己的，否则轮流挑
# │           └─ planner.py::_determine_source_ranks_for_dst_param
# │              ├─ _build_descriptors_for_param → _plan_tp → _emit_lcm_block_ops   # TP 参数：LCM 小片
# │              └─ _finalize_dp_transfers                            # 复制的参数：整块
# │           （只留本 rank 是接收方或发送方的那些 → 本 rank 的 ReshardPlan）
# └─ refit.py::reshard_model_weights(src, dst, service)
#    ├─ refit.py::_build_or_get_plan(src, dst)                       # 命中缓存，不通信
#    ├─ refit.py::_harmonize_buffer_dtypes                           # 只在第一次：all_gather_object（world），dtype 表存在 plan 上
#    └─ execution.py::execute_reshard_plan(plan, src, dst, service)
#       ├─ service.submit_send / submit_recv(…, task_id=…)  按 plan 的顺序，每个 TransferOp 一片；连续的目标切片直接当接收张量
#       ├─ gloo_copy_service.py::GlooCopyService.run                   # 本地片按 task_id 配对 copy_；远端片 batch_isend_irecv（gloo 群），逐个 wait
#       ├─ torch.cuda.synchronize()；service.requires_process_group_barrier 时 dist.barrier()   # world
#       └─ 不连续的目标切片从暂存缓冲写回 dst 的参数                     # 目标模型的 weight 被覆盖
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# RL 不在 simple loop 里；refit 插在 `optimizer.step()` 之后、下一轮 rollout 之前。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `swap_model_weights` | 源模型、目标模型、后端名或 `CopyService` | 无 | `get_or_create_service`、`_build_or_get_plan`、`reshard_model_weights` | 第一次调用时建一个 gloo 群 | 交给下层 | 是：目标模型的参数 | `optimizer.step()` 之后 |
# | `build_local_reshard_plan` | 两个带 `pg_collection` 的模块 | 本 rank 的 `ReshardPlan` | `extract_param_metadata`、`index_metadata_rosters`、`build_plan_from_rosters` | 是：world 上 1 次 `all_gather_object` | 只算切片，不搬数据 | 否 | 同上，只在第一次 |
# | `build_plan_from_rosters` | 两张名册、本 rank 号 | 本 rank 的 `ReshardPlan` | `select_src_metadata_balanced`、两种规划 | 否（纯函数） | 只算切片 | 否 | 同上 |
# | `extract_param_metadata` | 一个参数、名字、rank、`pg_collection` | `ParameterMetadata` | 层号映射 | 只读群成员 | 读 `partition_dim` / `partition_stride` | 否 | 同上 |
# | `_plan_tp` | 源、目标元数据，TP 描述，目标 rank 号 | `(源 rank, 源切片, 目标切片)` 列表 | 无 | 否（纯算术） | 是：TP 维的切片 | 否 | 同上 |
# | `_finalize_dp_transfers` | 同上 | 一个整块来源 | 无 | 否 | 否（整块） | 否 | 同上 |
# | `_harmonize_buffer_dtypes` | plan、两个模块 | 无（dtype 表记在 plan 上） | 无 | 是：第一次时 world 上 1 次 `all_gather_object` | 否 | 可能：目标模型 buffer 的 dtype（本篇的小 GPT 没有 persistent buffer） | 同上，只在第一次通信 |
# | `execute_reshard_plan` | plan、两个模块、service | 无 | `CopyService` | 是：service 要求时 world 上一次 barrier | 按切片取、按切片写 | 是：写目标参数 | 每一轮 |
# | `GlooCopyService.run` | 已提交的 send / recv | 无 | `match_local_ops_by_task_id` | 是：gloo 群上的点对点 | 否 | 是：收到的片拷进接收张量（连续切片就是目标参数本身） | 每一轮 |
# | `HyperCommGrid.create_pg` | 维度名 | 本 rank 所在的那个群 | `new_subgroups_by_enumeration` | 是：建群（全员参与） | 否 | 进程状态 | 相当于另一套 `initialize_distributed` |
# | `SelfAttention.get_query_key_value_tensors` | hidden states `[s, b, h]` | Q、K、V | `linear_qkv` | TP 份数多于 group 数时才 all-gather | 按 group 排的行 | 否 | forward |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 两种切法，同一批 rank
#
# seed 000 的例子是 8 张卡：训练 TP4×PP2（每卡一半的层、每层 1/4 的矩阵），vLLM TP8（每卡全部的层、每层 1/8）。这里缩小一半：
# 4 个 rank，训练 TP2×PP2，rollout TP4×PP1（自测 4 用 8 个 rank 跑 seed 原样的布局）。
#
# - **训练模型（源，policy）** 用 `parallel_state.initialize_model_parallel` 建的全局群，经
#   `ProcessGroupCollection.use_mpu_process_groups()` 交给 `GPTModel`；每个 PP stage 只建自己的 2 层。
# - **rollout 模型（目标）** 不能再调一次 `initialize_model_parallel`（全局群只有一套），所以用 `HyperCommGrid` 按 TP=4
#   另建一套群，装进它自己的 `ProcessGroupCollection`。模型的每一层都从 `pg_collection` 取群，不看全局变量。
#
# 每个 rank 上，一轮是：建两个模型 → `swap_model_weights(policy, rollout, "gloo")`（rollout 从当前 policy 出发）→ 训练一步 →
# 看不同步的 rollout 用的是哪个 policy → 再 `swap_model_weights` 一次。结果：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
check_table(ranks, TINY.microbatches)

# %% [markdown]
# 这张表就是"为什么每轮都要同步"：训练一步之后 policy 的 logits 最多变了 0.6925，没有同步的 rollout 模型算出的仍是**旧**
# policy 的 logits——用它生成的回答属于上一个 policy，on-policy 算法的前提被打破。同步之后 TP=4 的 rollout 模型和 TP2·PP2 的
# policy 给出相同的 logits（差在 1e-6 以内：两边切法不同，浮点求和顺序不同）。
#
# ### 为什么不是一次 copy
#
# 同一个参数在两种切法下落在不同的 rank、形状也不同。名字按全局层号对齐（`_build_layer_module_prefix_map`：PP stage 1 上的
# `decoder.layers.0` 其实是全局第 2 层）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
names = ["embedding.word_embeddings.weight",
         "decoder.layers.0.self_attention.linear_qkv.weight",
         "decoder.layers.3.self_attention.linear_qkv.weight",
         "decoder.layers.3.self_attention.linear_proj.weight",
         "decoder.layers.3.mlp.linear_fc1.weight",
         "decoder.layers.3.input_layernorm.weight",
         "output_layer.weight"]
policy_shapes = [r["policy_shapes"] for r in ranks]
rollout_shapes = [r["rollout_shapes"] for r in ranks]
Table(["参数（全局名）", "训练 TP2·PP2：rank 与本地 shape", "rollout TP4：rank 与本地 shape"],
      [[n, where(policy_shapes, n), where(rollout_shapes, n)] for n in names])

# %% [markdown]
# 第 3 层的 `linear_qkv`（column-parallel，切第 0 维）在训练端只在 rank 2、3 上，各 `[32, 32]`；rollout 端四个 rank 各 `[16, 32]`，
# rank 0、1 原本根本没有这一层。`linear_proj`（row-parallel）切第 1 维：`[32, 16]` → `[32, 8]`。layernorm 不切，训练端两份、
# rollout 端四份，要**复制**到原本没有它的 rank。每个 rank 持有的参数个数和字节：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["rank", "训练：参数个数", "训练：字节", "rollout：参数个数", "rollout：字节"],
      [[r, len(p), param_bytes(p), len(q), param_bytes(q)]
       for r, (p, q) in enumerate(zip(policy_shapes, rollout_shapes))])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 两套群同时存在于每个 rank 上：训练模型用 `parallel_state` 的全局群，rollout 模型用 `HyperCommGrid` 建的群。rollout 端 TP=4
# 占满 4 个 rank，所以它的 DP 群只有自己。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["rank", *r0["groups"]], [[r, *x["groups"].values()] for r, x in enumerate(ranks)])

# %% [markdown]
# refit 本身不走这两套群中的任何一个：planner 和 dtype 对齐的对象 collective、barrier 走 world，数据走 `GlooCopyService`
# 自己建的 gloo 群（成员也是全体 rank）。**第一次同步**在 rank 0 上的每个 collective：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(compact(r0["first_sync"]), MEANINGS, ranks=False)

# %% [markdown]
# - 第 1–2 行是 planner 唯一的一次 `all_gather_object`（[planner.py:495](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L495)）：先交换 pickle 后的长度，
#   再交换补齐的字节（每个 rank 的（源, 目标）元数据，最长 12598 字节）。没有分发 plan 的 collective。
# - 第 3–4 行是 `_harmonize_buffer_dtypes` 的 `all_gather_object`（[refit.py:433](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L433)）：交换源模型 persistent buffer
#   的 dtype（MoE router 的 `expert_bias` 这类）；这里是空字典，5 字节。
# - 第 5 行是真正搬 weight 的一次 `batch_isend_irecv`：rank 0 发 25 片、收 27 片（另有 25 片本地拷贝，不经过通信）。
# - 第 6 行是 `execute_reshard_plan` 在 `run()` 之后的 world barrier（机制解释里说它在什么条件下发生）。
#
# **第二次同步**只剩后两行：plan 已在 `refit.py` 的模块级 `_plan_cache` 里（[refit.py:227](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L227) 先查缓存），
# dtype 表记在 plan 上（[refit.py:442](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L442)），都不再交换。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(compact(r0["second_sync"]), MEANINGS, ranks=False)

# %% [markdown]
# 缓存的键是本 rank 号和两个模型的 TP / PP / EP / DP 大小等（[`refit.py::_build_plan_cache_key`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L86)），
# 不是模型对象：同一进程里换一对并行大小相同的模型，会用上旧 plan（要先 `clear_plan_cache()`）。
#
# ## 机制解释
#
# ### planner：每个 rank 各自算出同一份计划
#
# 每个 rank 只知道自己的参数，而一片 weight 的源和目标往往不在同一个 rank。`build_local_reshard_plan` 先用那一次
# `all_gather_object` 让每个 rank 拿到全世界的（源, 目标）元数据（参数名已按全局层号改写，PP stage 不同也对得上），
# 再把它交给两个不通信的纯函数：`index_metadata_rosters` 整理成两张名册，`build_plan_from_rosters` 按确定的顺序
# （目标 rank 从小到大，参数按收齐的顺序，[`planner.py::_iter_global_transfer_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L305)）走一遍全局的每一次传输、
# 依次编 `task_id`，只留本 rank 收或发的（[planner.py:415–445](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L415-L445)）。
#
# 既然是纯函数，就可以在 notebook 进程里重放：拿 4 个 rank 交出的元数据，替每个 rank 算一遍 plan：

# %%
from megatron.core.resharding.planner import build_plan_from_rosters, index_metadata_rosters

gathered = [r["roster"] for r in ranks]  # 每个 rank 交给 all_gather_object 的（源, 目标）元数据
dst_by_rank, src_by_name = index_metadata_rosters(gathered)
replayed = [build_plan_from_rosters(dst_by_rank, src_by_name, my_global_rank=r) for r in range(4)]
[(len(p.send_ops), len(p.recv_ops)) for p in replayed]

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def op_rows(plan, kind):
    ops = plan.send_ops if kind == "send" else plan.recv_ops
    return [(kind, o.param_name, o.peer_rank, refit_cost._slices(o.my_slice), o.task_id) for o in ops]


same = [op_rows(p, "send") + op_rows(p, "recv") == [(o["kind"], o["param"], o["peer"], o["slice"], o["task"]) for o in r["plan"]]
        for p, r in zip(replayed, ranks)]
print("替 4 个 rank 重放出的 plan == 各 rank 上 swap_model_weights 缓存的 plan:", same)
sends = [o for o in replayed[0].send_ops if o.peer_rank == 1]  # r0 提交给 r1 的，按提交顺序
recvs = [o for o in replayed[1].recv_ops if o.peer_rank == 0]  # r1 从 r0 收的，按提交顺序
print(f"r0 → r1：{len(sends)} 片 send，{len(recvs)} 片 recv；按提交顺序逐个 task_id 相同:",
      [s.task_id for s in sends] == [v.task_id for v in recvs])
Table(["第几片", "r0 send：task_id、参数、切片", "r1 recv：task_id、参数、切片"],
      [[i, f"{s.task_id} {s.param_name} {refit_cost._slices(s.my_slice)}",
        f"{v.task_id} {v.param_name} {refit_cost._slices(v.my_slice)}"]
       for i, (s, v) in enumerate(zip(sends, recvs)) if i < 4])

# %% [markdown]
# 没有哪个 rank 替别人算，也没有把 plan 发出去的一步；代价是每个 rank 都走一遍全局计划，所以 plan 被缓存。旧名字
# `build_centralized_reshard_plan` 只发弃用警告再转过来
# （[planner.py:517](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L517)）。
#
# **`task_id` 只在本地配对。** 同一 rank 上的收发由 `match_local_ops_by_task_id` 按 `task_id` 配对，对不上就报错
# （[base.py:71](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/base.py#L71)）。远端的片进了 `batch_isend_irecv` 就不带 `task_id` 了（接口的说明也写着，
# 远端传输用不上它，[base.py:33](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/base.py#L33)）：点对点按"同一对 rank 之间第几次"配对。能配对，是因为
# `execute_reshard_plan` 按 plan 里的顺序提交（[execution.py:119](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L119)、[execution.py:145](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L145)），而两边的
# plan 来自同一个全局顺序——上表 r0 发给 r1 的第 i 片，就是 r1 从 r0 收的第 i 片。
#
# > **旧版（core_v0.18.0）：** 真有一个"中心"：`build_centralized_reshard_plan` 用 `gather_object` 把元数据只收到 rank 0
# > （[planner.py:369](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/resharding/planner.py#L369)），rank 0 排好所有 rank 的 plan，再用 `scatter_object_list` 分发
# > （[planner.py:450](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/resharding/planner.py#L450)），第一次同步多一步分发 plan 的对象 collective。
#
# ### 真实的 plan：谁发给谁、多少字节
#
# 把 4 个 rank 的接收记录汇成矩阵（行 = 发送方，列 = 接收方，对角线 = 本地拷贝；就是开头那张图），再逐 rank 看：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(Table(["发送 ＼ 接收", *[f"r{d}" for d in range(4)], "发出合计"],
              [[f"r{s}", *matrix[s], sum(matrix[s])] for s in range(4)]))
Table(["rank", "recv 片数", "来自", "远端收到（字节）", "本地拷贝（字节）",
       "send 片数", "发往", "rollout 参数字节"],
      [rank_row(r, ops, rollout_shapes[r]) for r, ops in enumerate(plans)])

# %% [markdown]
# - 每个 rank 收到的字节（远端 + 本地）正好等于它在 rollout 切法下的参数字节 53248：plan 只送**目标需要的那一片**。
# - 本地拷贝不只发生在 layernorm 上：rank 0 在 rollout 端要第 0、1 层 `linear_qkv` 的第 0–15 行，训练端的 rank 0 恰好持有
#   这两层的第 0–31 行，于是 26496 字节根本不出进程。rank 1 要的第 16–31 行也在 rank 0 上，只能远端收。
# - 复制的参数（layernorm、row-parallel 的 bias）由 `select_src_metadata_balanced` 挑源：目标 rank 自己持有一份就用自己的
#   （[utils.py:551](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L551)，r1→r1、r2→r2 两格），否则按目标 rank 在副本之间轮流挑
#   （[`utils.py::_round_robin_dp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L498)，r0→r2、r3→r1 两格）。
#
# 同一个参数的每一片从哪来。全局第 2 层在训练端是 PP stage 1 的本地第 0 层，按 TP=2 切成两份 `[32, 32]`；rollout 的 4 个 rank
# 各要 16 行，每个源 rank 的一份被切成两片。它的 layernorm 在训练端只有 rank 2、3 有，rollout 的 4 个 rank 轮流从这两份里取整块：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def transfers_of(dst_name):
    sends = {o["task"]: (r, o) for r, ops in enumerate(plans) for o in ops if o["kind"] == "send"}
    rows = []
    for r, ops in enumerate(plans):
        for o in ops:
            if o["kind"] == "recv" and o["param"] == dst_name:
                src_rank, s = sends[o["task"]]
                rows.append([f"r{src_rank} {s['param']} {s['slice']}", f"r{r} {o['slice']}",
                             list(o["shape"]), o["bytes"]])
    return Table(["源：rank、本地名、切片", "目标：rank、切片", "shape", "字节"], rows)


display(transfers_of("decoder.layers.2.self_attention.linear_qkv.weight"))
transfers_of("decoder.layers.2.input_layernorm.weight")

# %% [markdown]
# ### TP 参数：LCM 小片
#
# 源按 TP 切成 `Ns` 份、目标切成 `Nd` 份（带 stride 时再乘 stride），`_plan_tp`（经 `_emit_lcm_block_ops`）把切分维切成
# `lcm(Ns, Nd)` 个等长小片：每个小片完整地属于一个源分片、也完整地属于一个目标分片，逐片写一条 send / recv 即可。TP 2 → 4：
# `lcm = 4`，每个源分片贡献 2 片、每个目标分片收 1 片；反过来 4 → 2 时每个目标分片从两个源各收 1 片。stride 用于一个 rank 的分片
# 本身由几段拼成的参数：SwiGLU 的 `linear_fc1` 每个 rank 存 `[gate 的一段; up 的一段]`，`partition_stride=2`
# （[mlp.py 第 210 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L210)）。本篇的小 GPT 用 GeLU，stride 都是 1。
#
# ### 执行：本地拷贝、一批点对点、barrier
#
# `execute_reshard_plan` 提交每个 recv 时，目标切片若是连续内存，就直接拿参数的这片视图当接收张量
# （[execution.py:172](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L172)）；不连续的才另开暂存缓冲（[execution.py:187](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L187)），等收完再写回
# （[execution.py:224](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L224)）。本篇 TP 2 → 4 的目标切片要么切第 0 维、要么取满整个本地张量，全是连续的，
# 所以 weight 在 `run()` 里就直接写进了 rollout 模型。
#
# `GlooCopyService.run` 先 `copy_` 本地片，再把远端片经锁页的 CPU 缓冲组成一次 `batch_isend_irecv`，**逐个 `wait()` 到全部完成**（[gloo_copy_service.py:113](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L113)），最后把收到的 CPU 缓冲拷回
# 接收张量。换成 `"nccl"` 是同一份 plan、同样的结构：`NCCLCopyService` 的专用 CUDA stream 只用于同一 rank 上的本地拷贝
# （[nccl_copy_service.py:56](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/nccl_copy_service.py#L56)），远端片一批 P2P 之后同样逐个等完
# （[nccl_copy_service.py:67](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/nccl_copy_service.py#L67)），`run()` 返回前让当前 stream 等 copy stream。
# 之后 `execute_reshard_plan` 还要 `torch.cuda.synchronize()`（[execution.py:197](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L197)）。所以一次 refit 是
# 同步的一步：它和训练、推理的计算没有重叠。
#
# barrier 是有条件的：`run()` 之后，copy service 的 `requires_process_group_barrier` 为真才在 group 上 `dist.barrier()`
# （[execution.py:198](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L198)）。基类缺省为真（[base.py:43](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/base.py#L43)），gloo、NCCL 都沿用，
# 只有 NIXL 的 service 设成假（[nixl_copy_service.py:61](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/nixl_copy_service.py#L61)）。barrier 之后才写回暂存缓冲。
#
# ### `linear_qkv`：按 query group 交错
#
# Megatron 把 Q、K、V 三个投影存成一个矩阵，行按 query group 排：8 个 query head、4 个 query group 时，每个 group 是
# "它的 2 个 query head、1 个 key head、1 个 value head"，每项 `head_dim` 行。TP 按行把矩阵切成连续的几段，每段恰好是
# **整数个 query group**：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
labels = qkv_layout.fused_row_labels(num_heads=8, num_query_groups=4)
blocks = [labels[i:i + 4] for i in range(0, len(labels), 4)]  # 2 q + k + v per group
display(Table(["query group", "linear_qkv 里的行块（每块 head_dim 行）", "训练 TP2 的 rank", "rollout TP4 的 rank"],
              [[g, " ".join(b), g * 2 // len(blocks), g * 4 // len(blocks)] for g, b in enumerate(blocks)]))
pictures.draw_qkv_layout(labels, num_query_groups=4, tp_sizes=(2, 4))

# %% [markdown]
# 上图上半是 Megatron 的存法和每种 TP 下各 rank 拿走的行，下半是 Hugging Face 分开存的 `q_proj`、`k_proj`、`v_proj`，箭头是
# 转换时每个行块去哪。这样排，本 rank 的 attention 需要的 Q、K、V 全在本地（`get_query_key_value_tensors` 只在 TP 份数多于
# group 数时才 all-gather，[attention.py 第 1839 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1839)）；也因此 TP 2 → 4 的 refit
# 对 `linear_qkv` 只是连续切片，不用重排。
#
# 送给 Hugging Face 式的加载器（vLLM 的权重加载器也按"全部 Q、全部 K、全部 V"）就要按 group 拆开、重排、改名。检验：在 1 个
# rank 上建一个真实的 `SelfAttention`（local spec，8 head、4 group，带 bias），把权重转成 HF 的样子，用一个照 HF Llama 写的
# attention（`repeat_kv` 式的分组）计算，输出必须一致：

# %%
def attention_check():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.enums import AttnMaskType

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    spec = get_gpt_layer_local_spec().submodules.self_attention
    attn = SelfAttention(gpt_config(TINY, tp=1, pp=1), spec.submodules, layer_number=1,
                         attn_mask_type=AttnMaskType.causal)
    with torch.no_grad():
        attn.linear_qkv.bias.normal_()  # a non-zero bias, so its reorder is checked too
        x = torch.randn(SEQ, BATCH, 32)
        out, bias = attn(x, MASK)
    state = {f"decoder.layers.0.self_attention.{k}": v
             for k, v in attn.state_dict().items() if "extra_state" not in k}
    return (out + bias).transpose(0, 1), x.transpose(0, 1), state


megatron_out, x, megatron_state = run_ranks(attention_check, 1)[0]
hf = qkv_layout.megatron_to_hf(megatron_state, num_heads=8, num_query_groups=4)
{k: list(v.shape) for k, v in hf.items()}

# %% tags=["hide-input"] jupyter={"source_hidden": true}
h = {k.split("self_attn.")[1]: v for k, v in hf.items()}  # "q_proj.weight" -> tensor
hf_out = qkv_layout.hf_attention(x, h["q_proj.weight"], h["k_proj.weight"], h["v_proj.weight"],
                                 h["o_proj.weight"], num_heads=8, num_kv_heads=4,
                                 q_bias=h["q_proj.bias"], k_bias=h["k_proj.bias"],
                                 v_bias=h["v_proj.bias"], o_bias=h["o_proj.bias"])
w = megatron_state["decoder.layers.0.self_attention.linear_qkv.weight"]
b = megatron_state["decoder.layers.0.self_attention.linear_qkv.bias"]
naive = qkv_layout.hf_attention(x, w[:32], w[32:48], w[48:64], h["o_proj.weight"], 8, 4,
                                q_bias=b[:32], k_bias=b[32:48], v_bias=b[48:64],
                                o_bias=h["o_proj.bias"])
back = qkv_layout.hf_to_megatron(hf, num_query_groups=4)
print("HF 式 attention（转换后的权重）== Megatron SelfAttention:",
      torch.allclose(hf_out, megatron_out, atol=1e-6))
print("不重排、直接按行切成 q | k | v:", torch.allclose(naive, megatron_out, atol=1e-6))
print("转回 Megatron 的名字和行序，逐位相等:",
      all(torch.equal(back[k], v) for k, v in megatron_state.items()))

# %% [markdown]
# 只改名不重排（前 32 行当 Q、接着 16 行当 K……）算出的是另一个模型。`linear_proj` 不用重排：attention 输出按 head 顺序排，
# 和 HF 的 `o_proj` 一致。Transformer Engine spec 把 layernorm 融进了 `linear_qkv`（`linear_qkv.layer_norm_weight`），名字表要跟着换。
# verl、NeMo RL 的 Megatron 路径都经 Megatron-Bridge 导出 HF 名字的完整张量，这一步在导出里做（笔记 25 专讲这张名字表）。

# %% [markdown]
# ### 要搬多少、多久
#
# seed 000 的数字：8B 的 bf16 weight 16 GB，8 张卡每卡 2 GB，NVLink 约 4.4 ms，IB 约 40 ms；70B 是 140 GB。反推带宽：
# 2 GB ÷ 4.4 ms ≈ 450 GB/s，正是 H100 NVLink 4 每卡单向带宽（双向 900 GB/s 的一半）；2 GB ÷ 40 ms = 50 GB/s，正是每卡一块
# 400 Gb/s NDR InfiniBand 网卡。所以这组数字假设每张卡只收自己那 1/8、8 张卡各走各的链路同时收、没有延迟和协议开销——是下限：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(refit_cost.REFIT_HEADERS, refit_cost.refit_rows(8e9) + refit_cost.refit_rows(70e9))

# %% [markdown]
# "每卡只收自己那片"是 Megatron planner 的做法。实际系统常常更费：verl colocated 的 Megatron 路径让每张卡先把每个参数
# **完整地**聚齐（TP all-gather + PP broadcast），再交给同卡的推理引擎挑自己那片；separate 摆法下生成卡收的是整个模型。
# 同样 8 卡、TP4×PP2 → TP8，三种做法每卡收到的字节和时间下限：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def strategy_rows(params):
    rows = []
    for strategy, kw, what in [("slice", dict(gpus=8), "只收自己的 1/8（planner）"),
                               ("gather", dict(shards=8), "先聚齐整个参数（verl colocated）"),
                               ("broadcast", {}, "整模型广播（separate）")]:
        nbytes = refit_cost.bytes_per_gpu(params, strategy, **kw)
        rows.append([f"{params / 1e9:g}B", what, round(nbytes / refit_cost.GB, 2),
                     round(refit_cost.seconds(nbytes, "nvlink") * 1e3, 2),
                     round(refit_cost.seconds(nbytes, "ib") * 1e3, 1)])
    return rows


Table(["model", "每卡怎么拿到 weight", "每卡收（GB）", "NVLink（ms）", "IB（ms）"],
      strategy_rows(8e9) + strategy_rows(70e9))

# %% [markdown]
# 本篇的小模型也可以对账：rollout 端每个 rank 收到的字节 = TP 切分参数的 1/4 + 全部复制参数。公式里的 "model / GPUs"
# 只算了前一项，复制参数（layernorm、bias）在大模型里占比极小：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
sharded, replicated = r0["sharded_params"], r0["replicated_params"]
model_params = 4 * sharded + replicated
print("整个模型参数:", model_params, " fp32 字节:", refit_cost.model_bytes(model_params, "fp32"))
print("公式 model / 4:", refit_cost.bytes_per_gpu(model_params, "slice", gpus=4, dtype="fp32"),
      " plan 里每个 rank 实收:", [sum(matrix[s][d] for s in range(4)) for d in range(4)],
      " 差 = 复制参数 × 3/4 × 4 字节:", 3 * replicated)

# %% [markdown]
# ### colocated 还是 separate
#
# | | colocated：训练和生成共用一批卡 | separate：训练卡和生成卡分开 |
# |---|---|---|
# | 时间上 | 两个阶段轮流占卡：生成时训练端的参数、优化器状态可以挪走，训练时推理端释放 KV cache | 两边各跑各的，可以同时进行 |
# | weight 怎么到推理端 | 常见做法先在训练群里把每个参数聚成完整张量（跨卡，每卡收 (1 − 1/N) 个模型），再经 CUDA IPC 交给同卡的推理进程：只有这最后一步不出卡 | 走网络：训练端经 NCCL 之类的集合通信（或 Megatron 的 copy service）发给另一批卡 |
# | 代价 | 同一时刻只有一边在算，显存要轮流装下两边 | 每轮等 weight 过网络；两边都不闲就得用落后一两步的 policy |
#
# 本篇 CPU 上的实验属于 colocated：源和目标模型在同一批 rank 上、同一个 world，而且按 planner 只送切片，不先聚齐。
#
# ### verl 和 NeMo RL 每轮怎么送
#
# 读的是 verl [`1dda039`](https://github.com/verl-project/verl/tree/1dda039b9c6311889a9c9a26040677e1254814f9)（2026-08-22）
# 和 NeMo RL [`7ea279a`](https://github.com/NVIDIA-NeMo/RL/tree/7ea279abfbeb698b092856d0dab61e7cf39bc909)（2026-08-22），能读到的最新提交。
#
# **verl.** 训练引擎由 `model_engine` 选（缺省 `dp`，[ppo_trainer.yaml:10](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/ppo_trainer.yaml#L10)；
# `ppo_megatron_trainer.yaml` 换成 `megatron`），标准 trainer 不论哪种引擎都用同一个 `ActorRolloutRefWorker`
# （[trainer_base.py:749](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/v1/trainer_base.py#L749)）；早先按 `actor.strategy` 选 `fsdp_workers` / `megatron_workers`
# 的分支已经不在了。weight 一律经 `CheckpointEngineManager.update_weights`（[base.py:506](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/base.py#L506)）：
#
# - 缺省的 v1 trainer（`trainer.use_v1: true`，`trainer_mode: sync`，[ppo_trainer.yaml:222](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/ppo_trainer.yaml#L222)）
#   把 checkpoint engine 定为 `naive`（[trainer_base.py:357](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/v1/trainer_base.py#L357)）：colocated，每个训练 worker
#   在自己的卡上把导出的张量交给推理引擎（vLLM 经 CUDA IPC，[vllm_rollout.py:209](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/rollout/vllm_rollout/vllm_rollout.py#L209)）。
#   Megatron 引擎的导出是 Megatron-Bridge 的 `export_hf_weights`（[transformer_impl.py:1025](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/engine/megatron/transformer_impl.py#L1025)），
#   每个参数在每个 rank 上聚成完整的 HF 张量：上表 8B、8 卡每卡收 14 GB 的那一行。
# - `hybrid_engine`（缺省 `true`，[ppo_trainer.yaml:56](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/ppo_trainer.yaml#L56)）v1 trainer 不读；旧的 `RayPPOTrainer` 断言它为真（[ray_trainer.py:334](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/ray_trainer.py#L334)）。两个 off-policy trainer 反过来断言它为假：
#   `fully_async_policy`（[fully_async_trainer.py:76](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/fully_async_policy/fully_async_trainer.py#L76)）和
#   `one_step_off_policy`（[ray_trainer.py:88](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/one_step_off_policy/ray_trainer.py#L88)）。v1 的 `separate_async`
#   不看它，只要求 checkpoint engine 不是 `naive`（[trainer_separate_async.py:63](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/v1/trainer_separate_async.py#L63)）。
# - 两个 off-policy 配置把后端写成 `nccl`（[fully_async_ppo_trainer.yaml:83](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml#L83)、
#   [one_step_off_ppo_trainer.yaml:25](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml#L25)）。NCCL checkpoint engine
#   上线的数据只来自训练 rank 0：它把导出的张量装进桶（`update_weights_bucket_megabytes`，缺省 2048，[rollout.py:135](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/config/rollout.py#L135)），
#   一桶一桶 broadcast 给所有 rollout worker（[nccl_checkpoint_engine.py:315](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/nccl_checkpoint_engine.py#L315)）。其余训练 rank
#   照样走一遍导出（导出本身是训练群上的 collective），和 rank 0 同节点的还加入 broadcast 当 NVLink 中继
#   （[nccl_checkpoint_engine.py:201](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/nccl_checkpoint_engine.py#L201)）。`kimi_ckpt_engine` 则让训练 rank 按张量序号
#   轮流分担（[kimi_checkpoint_engine.py:51](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/kimi_checkpoint_engine.py#L51)），各自的桶从自己这里 broadcast
#   （[kimi_checkpoint_engine.py:210](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/kimi_checkpoint_engine.py#L210)）。
#
# **NeMo RL.** `policy.generation.colocated.enabled` 缺省为真（[grpo_math_1B.yaml:439](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L439)）。
# 训练一步后置 `POLICY_GENERATION_STALE`（[grpo.py:3329](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L3329)），下次生成前才调
# `refit_policy_generation`（[grpo.py:2316](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2316)），它按这个顺序分支：
#
# - 生成端挂了 `weight_synchronizer`，就全交给它（[grpo.py:2337](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2337)）。`generation.backend: megatron`
#   总是这样（[grpo.py:1535](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1535)），`refit_transport` 选了 `nccl_reshard`、稀疏传输或 checkpoint engine 时也是。
#   Megatron 后端的同步就是 `swap_model_weights`：colocated 在同一批卡上重切（[megatron_worker.py:917](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/megatron/megatron_worker.py#L917)），
#   non-colocated 用 `group` 和 rank 偏移跨两个 world（[megatron_worker.py:876](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/megatron/megatron_worker.py#L876)），
#   copy service 由 `mcore_generation_config.refit_backend` 定（[grpo_math_1B.yaml:408](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L408)）。
# - 否则 colocated：SGLang 经 HTTP 传 CUDA IPC 句柄（[grpo.py:2366](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2366)），vLLM、TRT-LLM 经 ZMQ
#   （`stream_weights_via_ipc_zmq`，[grpo.py:2380](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2380)）；分桶的大小缺省取空闲显存的 30%。
# - 否则 non-colocated：SGLang 直接报 `NotImplementedError`（[grpo.py:2393](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2393)），其余
#   `broadcast_weights_for_collective`，经 NCCL 把完整张量广播给每张生成卡（[grpo.py:2396](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2396)）。
#
# <details><summary>两端各有哪些引擎可选（NeMo RL 7ea279a）</summary>
#
# | 框架 | 训练端 | 生成端 |
# |---|---|---|
# | NeMo RL | `policy.dtensor_cfg.enabled` 或 `policy.megatron_cfg.enabled`，二选一（[lm_policy.py 第 118 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L118)）。前者是 PyTorch 原生的 DTensor 路径：`_v2: true`（[grpo_math_1B.yaml 第 142 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L142)）选 `DTensorPolicyWorkerV2`（[lm_policy.py 第 166 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L166)），模型由 NeMo Automodel 建，按 `FSDP2Config` 做 FSDP2（[setup.py 第 481 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/automodel/setup.py#L481)），再叠 TP。后者是 `MegatronPolicyWorker`（[lm_policy.py 第 140 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L140)），经 Megatron Bridge 建 Megatron Core 模型（[megatron_policy_worker.py 第 29 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/workers/megatron_policy_worker.py#L29)） | `policy.generation.backend`，示例配置缺省 `vllm`（[grpo_math_1B.yaml 第 369 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L369)）；`setup` 里分 `megatron`（[grpo.py 第 1275 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1275)）、`vllm`（[第 1297 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1297)）、`sglang`（[第 1428 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1428)）几支，另有 `trtllm`、`dynamo`；`refit_transport` 缺省 `null`（[grpo_math_1B.yaml 第 382 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L382)），非缺省值只配 vLLM（[grpo.py 第 1524 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1524)） |
#
# </details>
#
# Megatron-LM 自己的 RL 入口也调 `swap_model_weights`，缺省就是本篇跑的 gloo 后端：
#
# <details><summary>Megatron-LM 的 <code>train_rl.py</code> 在哪里同步</summary>
#
# 同一个 tag 的 `train_rl.py` 调的就是 `pretrain`，命令行带上 `--perform-rl-step`。再给
# `--rl-inference-tensor-model-parallel-size` 等任何一个推理端并行度（或者训练用了 CP>1：推理端不支持 CP，
# [training.py:1250](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1250)），`pretrain` 就在同一个 world 里按这套并行度另建一个推理模型
# （[training.py 第 1245–1323 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1245-L1323)，群来自
# [`shards.py::build_inference_pg_collection`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/inference/shards.py#L18)）——和本篇的做法一样，两个模型在同一批 rank 上。
# 之后在每次收集 rollout 之前（[`rl_utils.py::get_environment_rollouts`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/rl/rl_utils.py#L598) 里，
# [rl_utils.py 第 634 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/rl/rl_utils.py#L634)）、每次 RL 评估之前
# （[training.py 第 4028 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4028)）和训练结束后的验证之前
# （[training.py 第 1471 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1471)）调 `swap_model_weights`；
# 没有单独的推理模型时三处都跳过。`--refit-method` 缺省 `gloo`（[arguments.py 第 2698 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2698)，
# 另有 `nccl`、`nvshmem`）：缺省走的正是本篇跑的 `GlooCopyService`。
#
# </details>
#
# ### 读一份配置
#
# `weight-sync` 命令读一份 verl 或 NeMo RL 的启动脚本、配置，说出每轮 weight 怎么走、每卡搬多少（用法见仓库 README 的
# “RL: how a verl or NeMo RL run syncs its weights” 一节）。seed 的布局（Megatron TP4×PP2，SGLang TP8，colocated），
# 和一份 separate 的 NeMo RL 配置（Megatron TP2×PP2 训练，vLLM TP2 在另一个节点生成）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ROOT = Path(refit_cost.__file__).resolve().parents[2]


def weight_sync(*args):
    run = subprocess.run([sys.executable, "-m", "snippets.rl.weight_sync", *args], cwd=ROOT,
                         capture_output=True, text=True)
    print(run.stdout + run.stderr + f"(exit status {run.returncode})")


weight_sync("tests/fixtures/verl/megatron_sglang_colocated.yaml")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
weight_sync("tests/fixtures/nemo_rl/recipes/grpo_llama8b_megatron_separate.yaml")

# %% [markdown]
# ## 与训练主链路的关系
#
# RL 的一轮 = rollout + 一次（或几次）训练 step（`forward_backward_func`、`finalize_model_grads`、`optimizer.step()`）。refit 紧跟在
# `optimizer.step()` 之后，读**更新后的参数**（开了 overlap param gather 时参数要先聚齐，NeMo RL 重切前专门处理了这一点），
# 不动梯度、优化器状态和学习率。它和 checkpoint 换并行度加载（笔记 07、21）是同一个问题——同一份参数换一种切法——但每轮都做、
# 不落盘，所以只搬目标需要的切片。

# %% [markdown]
# ## 与基础知识的连接
#
# - **on-policy**：PPO / GRPO 按"生成这批数据的 policy"做重要性采样；rollout 用旧 weight 就是 off-policy 数据。separate 摆法
#   有意接受一两步的滞后，再在目标函数里修正。
# - **切分 = 区间划分**：一个维度切成 `Ns` 段和 `Nd` 段，两种划分的公共细分就是 `lcm(Ns, Nd)` 段——planner 的 LCM 小片。
# - **带宽估算**：时间 ≈ 字节 ÷ 带宽，是下限；NVLink（机内）比 InfiniBand（机间）快一个数量级。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **rollout 模型自己算 loss：0.19.0 用模型自己的 TP 群（已修复，运行确认）。**
#    [`language_module.py::LanguageModule.compute_language_model_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L155)
#    调 [`cross_entropy.py::vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L213)
#    时传入模型的 TP 群（[language_module.py 第 194–196 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194-L196)），
#    没给群才退回全局群（[cross_entropy.py 第 124–125 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L124-L125)）。
#    全局群 TP=2、rollout 的 logits 按 TP=4 切时，下表的 loss 等于用完整 logits 算的交叉熵。
#
# > **旧版（core_v0.18.0）：** 非融合路径调用 `vocab_parallel_cross_entropy` 时不传群
# > （[language_module.py:183](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/models/common/language_module/language_module.py#L183)），
# > 它就用全局 TP 群 `[0, 1]` / `[2, 3]` 去归约按 TP=4 切的 logits，loss 与交叉熵对不上（core_v0.16.1 这张表的 rank 0 是 3.3379 对
# > 4.1089）。在这些版本上让 rollout 模型只出 logits、在外面算 loss。

# %%
def surprises():
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(123)
    torch.manual_seed(0)  # the weights must not depend on the random state this rank was forked with
    # 1. the rollout model asked for a loss, against cross entropy of its own full logits
    rollout = gpt(TINY, gpt_config(TINY, tp=4, pp=1), rollout_groups(tp=4))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    labels = tokens.roll(-1, dims=1)
    with torch.no_grad():
        loss = rollout(tokens, POS, MASK, labels=labels)
        logits = rollout(tokens, POS, MASK, runtime_gather_output=True)
    reference = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
    # 2. like the old unit test: PP groups in pg_collection, but the config does not say PP=2
    unit_test_like = gpt(TINY, gpt_config(TINY, tp=2, pp=1), ProcessGroupCollection.use_mpu_process_groups())
    real_pp = gpt(TINY, gpt_config(TINY, tp=2, pp=2), ProcessGroupCollection.use_mpu_process_groups(),
                  parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage())
    layer_numbers = lambda model: [layer.layer_number for layer in model.decoder.layers]
    # 3. HyperCommGrid vs RankGenerator on tp=1, dp=2, pp=2
    gen = RankGenerator(tp=1, ep=1, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp")
    same_order = HyperCommGrid([1, 1, 1, 2, 2], ["tp", "cp", "ep", "dp", "pp"])
    test_order = HyperCommGrid([1, 1, 1, 2, 2], ["tp", "cp", "ep", "pp", "dp"])
    return dict(
        loss=round(float(loss.mean()), 4), reference=round(float(reference), 4),
        loss_group=dist.get_process_group_ranks(parallel_state.get_tensor_model_parallel_group()),
        model_group=dist.get_process_group_ranks(rollout.pg_collection.tp),
        unit_test_like=layer_numbers(unit_test_like), real_pp=layer_numbers(real_pp),
        grids={d: (gen.get_ranks(d), same_order.get_rank_enum(d), test_order.get_rank_enum(d))
               for d in ("dp", "pp")},
    )


odd = run_ranks(surprises, 4, grid=dict(tp=2, pp=2))
Table(["rank", "rollout 模型带 labels 算的 loss", "用它完整 logits 算的交叉熵",
       "全局 TP 群（旧版的 loss 用它）", "模型的 TP 群（loss 用它）"],
      [[r, x["loss"], x["reference"], x["loss_group"], x["model_group"]] for r, x in enumerate(odd)])

# %% [markdown]
# 2. **PP 群放进 `pg_collection` 不等于切层（运行确认）。** 每个 stage 建几层由
#    [`transformer_block.py::get_num_layers_to_build`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L70)
#    按 **config** 的 PP 大小算：config 没写 PP 时每个 rank 都建全部 4 层。Megatron 早先（core_v0.16.1）的 refit 单元测试就这样，
#    "PP2 → PP1"其实是"两份完整副本 → 一份"；现在的测试把 PP 大小写进了 config
#    （[test_model_swap.py 第 346–347 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L346-L347)）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["rank", "单元测试的建法（config 没写 PP）：层号", "config 写了 PP=2：层号"],
      [[r, x["unit_test_like"], x["real_pp"]] for r, x in enumerate(odd)])

# %% [markdown]
# 3. **`HyperCommGrid` 与 `RankGenerator`：同序同群；单元测试用的是另一个序。**（回答笔记 08 遗留问题 3。）`HyperCommGrid` 的
#    维度名列表从左到右就是 `order` 从快到慢；按 `parallel_state` 的缺省序 `tp-cp-ep-dp-pp` 排，两者给出相同的 rank 列表。单元测试
#    写的是 `["tp", "cp", "ep", "pp", "dp"]`，相当于 `tp-cp-ep-pp-dp`：DP 和 PP 都大于 1 时，它的 DP 群和 PP 群与同一进程里
#    `initialize_model_parallel` 建的全局群互换。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["群", "RankGenerator（tp-cp-ep-dp-pp）", "HyperCommGrid 同序",
       "HyperCommGrid 单元测试的序（…pp, dp）"],
      [[d, *odd[0]["grids"][d]] for d in ("dp", "pp")])

# %% [markdown]
# 4. **gloo 后端也要 CUDA。** `GlooCopyService.__init__` 建 `torch.cuda.Stream()`（[gloo_copy_service.py 第 34 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L34)），
#    本地拷贝和收完后的写回都在这个 stream 上做，`run()` 结尾让当前 stream 等它（[gloo_copy_service.py 第 128 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L128)）；
#    收发都先经过 `pin_memory=True` 的 CPU 缓冲（[gloo_copy_service.py 第 45 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L45)）。传输本身全是 CPU 张量上的
#    gloo，但没有 CUDA 驱动的机器连这个 service 都建不起来。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 上面第 4 条的两处（CUDA stream、锁页内存），我们用两个只作用于 `gloo_copy_service` 模块的补丁换掉：`refit_streams`
#   （stream 成为空操作）和 `refit_pinned_buffers`（普通内存），见 [在 CPU 上运行](../../cpu/)。`execute_reshard_plan` 里的
#   `torch.cuda.synchronize()` 由全局的 CPU 层变成空操作。
# - 尺寸为笔记本电脑选：4 层、hidden 32、fp32；seed 原样的 8 rank 布局（自测 4）只建模型、算 plan，不训练。
# - 本篇只跑了 `swap_model_weights(src, dst, method)` 最简单的用法：两个模型都在每个 rank 上、共用一个 world。它的签名还有
#   `group`、`src_rank_offset`、`dst_rank_offset`，源或目标模型可以是 `None`（只发、只收或只陪着做 collective 的 rank，见
#   [`refit.py::reshard_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L461)），另有只建 plan 不搬数据的
#   [`refit.py::prepare_swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L292)：训练和推理可以在两个 world、一个自建的 refit 群里（NeMo RL 的
#   non-colocated Megatron 推理就这样用）。这种摆法、NVSHMEM copy service（GPU 内核直接搬）、EP 参数的重切（`resolved_name`
#   把本地 expert 编号改成全局编号）都没有实验；NCCL 后端在 GPU 上跑同一个实验就会走到。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. Qwen3-8B 实际有约 8.19e9 个参数。bf16、rollout TP8 时每卡收多少 GB？走 NVLink 和 IB 各至少多久？**
#
# <details><summary>答案</summary>
#
# 8.19e9 × 2 = 16.38 GB，每卡 1/8 ≈ 2.05 GB；÷ 450 GB/s ≈ 4.55 ms，÷ 50 GB/s ≈ 41 ms。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
Table(refit_cost.REFIT_HEADERS, refit_cost.refit_rows(8.19e9))

# %% [markdown]
# **2. 8 个 query head、4 个 query group：`linear_qkv` 第 6 个行块（从 0 数）是哪个 head？rollout TP4 的 rank 2
# 拿到哪几个行块？转成 HF 后它们分别进了 `q_proj`、`k_proj`、`v_proj` 的第几个 head？**
#
# <details><summary>答案</summary>
#
# 顺序是 q0 q1 k0 v0 | q2 q3 k1 v1 | q4 q5 k2 v2 | q6 q7 k3 v3，第 6 块是 k1。TP4 每个 rank 4 块：rank 2 拿到
# q4 q5 k2 v2，也就是 `q_proj` 的第 4、5 个 head，`k_proj`、`v_proj` 的第 2 个 head——整整一个 query group。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
labels = qkv_layout.fused_row_labels(8, 4)
print(labels[6], labels[2 * 4:3 * 4])

# %% [markdown]
# **3. 第二次 `swap_model_weights` 在 rank 0 上发出几次 collective？比第一次少了哪些，为什么？**
#
# <details><summary>答案</summary>
#
# 2 次：一次 `batch_isend_irecv`（搬 weight）和一次 barrier。第一次是 6 次，少了的 4 次 all-gather 是两个
# `all_gather_object`（各先交换长度、再交换内容）：planner 交换（源, 目标）元数据的那一个，和 `_harmonize_buffer_dtypes`
# 交换 buffer dtype 的那一个。plan 第一次算完就存进 `refit.py` 的模块级 `_plan_cache`，dtype 表记在 plan 上，
# 所以第二次两样都不再交换。没有"分发 plan"的 collective：每个 rank 自己算自己的 plan。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(len(r0["first_sync"]), "→", len(r0["second_sync"]), [c.api for c in r0["second_sync"]])

# %% [markdown]
# **4. seed 000 原样的布局：8 个 rank，训练 TP4×PP2、rollout TP8。真实的 planner 让每个 rank 收多少字节？占整个
# 模型的几分之一？有多少是本地拷贝？**（8 个 rank 上只建模型、算 plan，不训练；TP8 要求 query group 数是 8 的倍数，这里用 8。）
#
# <details><summary>答案</summary>
#
# 每个 rank 收 30400 字节，整个模型 219904 字节，约 0.138：TP 切分参数的 1/8（0.125）加上全部复制参数
# （layernorm、row-parallel 的 bias，每个 rank 都要一整份）。大块的本地拷贝只在 rank 0 和 rank 7：rollout 的
# 第 r 片（共 8 片）只有落在训练 rank r 所持的那 1/4 里才在本地，即 r // 2 == r % 4，只有 r = 0、7 满足——
# 第一个 stage 的第一片和最后一个 stage 的最后一片，而且只对本 stage 的层成立，所以约占它们所收的一半。
# 其余 rank 的本地拷贝只是复制参数。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
def seed_layout_plan():
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding import build_local_reshard_plan
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=4, pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(123)
    eight_groups = TINY.replace(query_groups=8)
    policy = gpt(eight_groups, gpt_config(eight_groups, tp=4, pp=2), ProcessGroupCollection.use_mpu_process_groups(),
                 parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage())
    rollout = gpt(eight_groups, gpt_config(eight_groups, tp=8, pp=1), rollout_groups(tp=8))
    plan = build_local_reshard_plan(policy, rollout)
    count = lambda split: sum(p.numel() for p in rollout.parameters()
                              if getattr(p, "tensor_model_parallel", False) == split)
    model_bytes = 4 * (8 * count(True) + count(False))  # fp32; TP-split tensors hold 1/8 here
    return refit_cost.plan_ops(plan, policy, rollout), model_bytes


seed_plans, model_bytes = zip(*run_ranks(seed_layout_plan, 8, grid=dict(tp=4, pp=2)))
seed_matrix = refit_cost.plan_traffic(list(seed_plans))
seed_received = [sum(seed_matrix[s][d] for s in range(8)) for d in range(8)]
print("整个模型字节:", model_bytes[0])
Table(["rank", "收到（字节）", "占整个模型", "其中本地拷贝"],
      [[d, seed_received[d], round(seed_received[d] / model_bytes[0], 4), seed_matrix[d][d]]
       for d in range(8)])

# %% [markdown]
# **5. 一份 verl 配置：Megatron TP4×PP2 训练，SGLang TP8 生成，colocated（缺省的 v1 sync trainer），模型 Llama-3.1-8B。
# verl 每轮让每张卡收多少？如果只送每卡自己那片呢？**
#
# <details><summary>答案</summary>
#
# colocated 时 verl 的 Megatron 引擎经 Megatron-Bridge 导出，每张卡把每个参数聚成完整张量（PP broadcast + TP all-gather）：
# 每卡收 16 GB × (1 − 1/8) = 14 GB，NVLink 上至少 31.11 ms；之后交给同卡的 SGLang 是 CUDA IPC，不走链路。只送切片是
# 16 GB ÷ 8 = 2 GB，至少 4.44 ms。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
gathered_bytes = refit_cost.bytes_per_gpu(8e9, "gather", shards=8)
sliced_bytes = refit_cost.bytes_per_gpu(8e9, "slice", gpus=8)
print("聚齐:", gathered_bytes / refit_cost.GB, "GB,", round(refit_cost.seconds(gathered_bytes, "nvlink") * 1e3, 2), "ms")
print("只送切片:", sliced_bytes / refit_cost.GB, "GB,", round(refit_cost.seconds(sliced_bytes, "nvlink") * 1e3, 2), "ms")

# %% [markdown]
# **6. RL 为什么每轮都要重切 weight，而不是把训练端的 tensor 原样拷给推理引擎？用本篇前面几次运行的结果作答。**
#
# <details><summary>答案</summary>
#
# 两个原因叠在一起。其一，参数一更新，推理端那份就过期了：不同步的 rollout 模型算出的仍是旧 policy 的 logits，
# 生成的数据不再是 on-policy 的，所以每轮都要送。其二，送不能是原样拷贝：两端切法不同（本篇训练 TP2·PP2 时第 3 层的
# `linear_qkv` 只在 rank 2、3 上、各 `[32, 32]`，rollout TP4 时四个 rank 各 `[16, 32]`；seed 的例子是 TP4×PP2 对 TP8），
# 存法也不同（Megatron 按 query group 交错存 Q、K、V，HF / vLLM 分开存，不重排就是另一个模型）。所以要先按目标切法
# 重切、重排、改名，再送过去。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
qkv3 = "decoder.layers.3.self_attention.linear_qkv.weight"
print("不同步的 rollout 给出旧 policy 的 logits:", all(r["stale_is_old"] for r in ranks))
print("同步后 rollout 与新 policy 一致:", all(r["fresh_is_new"] for r in ranks))
print("训练端:", where(policy_shapes, qkv3), " rollout 端:", where(rollout_shapes, qkv3))
print("Q、K、V 不重排就当作 HF 的 q | k | v，输出还一样吗:", torch.allclose(naive, megatron_out, atol=1e-6))

# %% [markdown]
# ## 30-second answer
#
# After every policy update the inference engine still holds the old weights, so each RL round pushes the new
# ones to it. It is not a copy: the trainer may run TP4 × PP2 while vLLM runs TP8, and Megatron fuses Q, K, V per
# query group where Hugging Face keeps them apart, so tensors are resliced, reordered and renamed. Megatron Core's
# `swap_model_weights` plans once (one metadata all-gather, then each rank replays the same global order and keeps
# its own sends and receives), then sends each GPU only its share: 8B in bf16 is 16 GB, 2 GB per GPU on 8 GPUs,
# about 4.4 ms over NVLink. Frameworks often move more: verl's colocated Megatron path first gathers every full
# tensor on every GPU, about 14 GB per GPU, before a same-GPU CUDA IPC hand-off.
