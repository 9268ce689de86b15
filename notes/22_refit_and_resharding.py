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
# RL 部分。在 GRPO 或 PPO 里，一次迭代分成两段：先让模型按现有参数给一批 prompt 写出回答（几乎全是逐 token 的
# decode，吃的是显存带宽），再给这些回答打分、算 advantage，据此把参数更新一次。前一段需要推理引擎的本事（KV cache、
# 连续批处理），后一段需要训练框架的并行和优化器，所以实际系统把两段交给两套代码：训练交给 Megatron 或 FSDP，
# 生成交给 vLLM、SGLang 或 Megatron 自带的推理。两套代码对同一份 weight 的切法不一样，于是每更新一次参数，都要把它
# 从训练的切法**重切**成生成的切法再交过去。NeMo RL 管这一步叫 refit，Megatron Core 为它写了 `resharding/`。
#
# 本篇在 4 个 CPU rank 上跑真实的 `megatron.core`：一个小 GPT 以 TP=2·PP=2 训练一步（真实的 pipeline schedule），
# 真实的 `swap_model_weights(src, dst, "gloo")` 把 weight 搬进同一批 rank 上 TP=4·PP=1 的 rollout 模型，两边
# logits 相等；再打印 planner 算出的每一片谁发给谁、多少字节。然后看 `linear_qkv` 的存法，算搬运量，
# 最后读 verl 和 NeMo RL 的配置，用一个小命令解释一份 verl 配置每轮怎么同步 weight。

# %% [markdown]
# ## 阅读目标
#
# 1. 说清为什么**每一轮**都要同步 weight（rollout 必须用 trainer 刚更新的 policy），以及为什么这不是一次 copy：
#    训练 TP4×PP2 与 rollout TP8 切法不同，每个 parameter 都要按新切法重新分片。
# 2. 读懂 `swap_model_weights` 的三段：planner（交换一次元数据后，每个 rank 各自算出同一份全局计划、只留自己的收发）、执行（按计划逐片收发）、
#    copy service（gloo / NCCL 传输）；能从真实的 plan 读出每个 rank 发给谁、收了多少字节。
# 3. 说清 Megatron 的 `linear_qkv` 为什么按 query group 交错存（q1 q2 k1 v1 | q3 q4 k2 v2 | …），以及换成
#    Hugging Face / vLLM 的 `q_proj`、`k_proj`、`v_proj` 要做的重排和改名。
# 4. 会估算一次 refit 搬多少、要多久（8B bf16 = 16 GB，8 卡每卡 2 GB，NVLink ≈ 4.4 ms，IB ≈ 40 ms；70B = 140 GB），
#    并说得出这些数字背后的带宽假设。
# 5. 分清 colocated 与 separate 两种摆法；读一份 verl 配置（`actor.strategy`、`rollout.name`、rollout 的
#    `tensor_model_parallel_size`、`hybrid_engine`）或 NeMo RL 配置（`colocated.enabled`）就能说出 weight 每轮怎么走。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`refit.py::swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L339) | 公开入口：按名字取 copy service，先取一次 plan（第一次调用就在这里建），交给下一行 |
# | [`refit.py::get_or_create_service`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L117) | `"gloo"` / `"nccl"` / `"nvshmem"` / `"nixl"` → 进程内缓存的 `CopyService` |
# | [`refit.py::reshard_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L461) | 经 `_build_or_get_plan` 取 plan（模块级缓存里没有才建），对齐 buffer 的 dtype，再执行 |
# | [`refit.py::_build_or_get_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L208) | 按本 rank 号和两个模型的并行大小查模块级 `_plan_cache`，没有才调下一行建 |
# | [`planner.py::build_local_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L454) | 一次 `all_gather_object` 收齐全部元数据，本 rank 算出自己的 plan（[`planner.py::build_centralized_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L503) 只是它的弃用别名） |
# | [`planner.py::build_plan_from_rosters`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L403)、[`planner.py::_iter_global_transfer_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L305) | 按固定顺序重放全局的每一次传输、编 `task_id`，只留本 rank 收或发的 |
# | [`utils.py::extract_param_metadata`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L310) | 一个参数的 shape、TP 维、stride、所在的 TP / DP / PP 群 |
# | [`utils.py::_build_layer_module_prefix_map`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L259) | stage 内的 `layers.0` → 全局层号；两种切法靠它配对同一个参数 |
# | [`utils.py::select_src_metadata_balanced`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L532) | 源有多份副本时：目标 rank 自己有一份就用它，否则按目标 rank 轮流挑 |
# | [`planner.py::_build_descriptors_for_param`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L31) | 判断参数是否按 TP 切、切在哪一维，并核对两边总长相等 |
# | [`planner.py::_plan_tp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L194) | TP 参数：按两边份数的最小公倍数切成小片（[`planner.py::_emit_lcm_block_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L77)），逐片找源 |
# | [`planner.py::_finalize_dp_transfers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L247) | 不按 TP 切的参数：整块来自挑中的那份副本（同一 rank 就是本地拷贝） |
# | [`utils.py::TransferOp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L20)、[`utils.py::ReshardPlan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L101) | 一片的收或发；一个 rank 的全部 send / recv（外加第一次同步时记下的 buffer dtype 表） |
# | [`refit.py::_harmonize_buffer_dtypes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L411) | 第一次同步时收齐源模型 persistent buffer 的 dtype，目标端不一致就改过来 |
# | [`execution.py::execute_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L58) | 按 plan 提交每一片（连续的目标切片直接收进参数），执行，barrier，写回不连续的切片 |
# | [`gloo_copy_service.py::GlooCopyService.run`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L52) | 本地片直接 `copy_`，远端片一次 `batch_isend_irecv` |
# | [`hyper_comm_grid.py::HyperCommGrid`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/hyper_comm_grid.py#L46) | 给 rollout 模型另建一套群，不碰 `parallel_state` 的全局群 |
# | [`attention.py::SelfAttention.get_query_key_value_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1812) | 按 query group 把 `linear_qkv` 的输出拆成 Q、K、V |
#
# Megatron 自己的单元测试 [`test_model_swap.py::test_swap_gpt_parametrized`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L297)
# 在同一批 rank 上各建一个源模型和一个目标模型（各自的 `pg_collection` 由
# [`test_model_swap.py::_build_pg_collection`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L48)
# 用 `HyperCommGrid` 建），换完 weight 比较输出。本篇照这个思路写自己的实验；遗留问题 2 说它的 PP 用例其实没切层。

# %% [markdown]
# ## 调用链
#
# ```text
# megatron/core/resharding/refit.py::swap_model_weights(src, dst, "gloo")
# ├─ refit.py::get_or_create_service("gloo") → GlooCopyService()     # new_group(backend="gloo")，建一个 CUDA copy stream
# ├─ refit.py::_build_or_get_plan(src, dst)                          # 查 refit.py 的模块级 _plan_cache
# │  └─ 只在第一次：planner.py::build_local_reshard_plan(src, dst)  → 存进 _plan_cache
# │     ├─ utils.py::_build_layer_module_prefix_map(src)、(dst)        # 本 stage 的 layers.i → 全局层号
# │     ├─ utils.py::extract_param_metadata  两个模型的每个参数         # 名字、shape、TP 维、stride、群成员
# │     ├─ all_gather_object ×1                                        # world：所有 rank 的（源, 目标）元数据
# │     └─ planner.py::build_plan_from_rosters                         # 每个 rank 都重放同一份全局顺序
# │        └─ planner.py::_iter_global_transfer_ops  每个目标 rank 的每个参数
# │           ├─ utils.py::select_src_metadata_balanced                # 自己有副本就用自己的，否则轮流挑
# │           └─ planner.py::_determine_source_ranks_for_dst_param
# │              ├─ _build_descriptors_for_param → _plan_tp → _emit_lcm_block_ops   # TP 参数：LCM 小片
# │              └─ _finalize_dp_transfers                            # 复制的参数：整块
# │           （只留本 rank 是接收方或发送方的那些 → 本 rank 的 ReshardPlan）
# └─ refit.py::reshard_model_weights(src, dst, service)
#    ├─ refit.py::_build_or_get_plan(src, dst)                       # 命中缓存，不通信
#    ├─ refit.py::_harmonize_buffer_dtypes                           # 只在第一次：all_gather_object（world），dtype 表存在 plan 上
#    └─ execution.py::execute_reshard_plan(plan, src, dst, service)
#       ├─ service.submit_send / submit_recv(…, task_id=…)  每个 TransferOp 一片；连续的目标切片直接当接收张量
#       ├─ gloo_copy_service.py::GlooCopyService.run                   # 本地片 copy_；远端片 batch_isend_irecv（gloo 群）
#       ├─ dist.barrier()                                              # world
#       └─ 不连续的目标切片从暂存缓冲写回 dst 的参数                     # 目标模型的 weight 被覆盖
# ```
#
# **每个函数的阅读记录**（RL 不在 simple loop 里；refit 插在 `optimizer.step()` 之后、下一轮 rollout 之前）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `swap_model_weights` | 源模型、目标模型、后端名或 `CopyService` | 无 | `get_or_create_service`、`_build_or_get_plan`、`reshard_model_weights` | 第一次调用时建一个 gloo 群 | 交给下层 | 是：目标模型的参数 | `optimizer.step()` 之后 |
# | `build_local_reshard_plan` | 两个带 `pg_collection` 的模块 | 本 rank 的 `ReshardPlan` | `extract_param_metadata`、`select_src_metadata_balanced`、两种规划 | 是：world 上 1 次 `all_gather_object` | 只算切片，不搬数据 | 否 | 同上，只在第一次 |
# | `extract_param_metadata` | 一个参数、名字、rank、`pg_collection` | `ParameterMetadata` | 层号映射 | 只读群成员 | 读 `partition_dim` / `partition_stride` | 否 | 同上 |
# | `_plan_tp` | 源、目标元数据，TP 描述，目标 rank 号 | `(源 rank, 源切片, 目标切片)` 列表 | 无 | 否（纯算术） | 是：TP 维的切片 | 否 | 同上 |
# | `_finalize_dp_transfers` | 同上 | 一个整块来源 | 无 | 否 | 否（整块） | 否 | 同上 |
# | `_harmonize_buffer_dtypes` | plan、两个模块 | 无（dtype 表记在 plan 上） | 无 | 是：第一次时 world 上 1 次 `all_gather_object` | 否 | 可能：目标模型 buffer 的 dtype（本篇的小 GPT 没有 persistent buffer） | 同上，只在第一次通信 |
# | `execute_reshard_plan` | plan、两个模块、service | 无 | `CopyService` | 是：world 上的 barrier | 按切片取、按切片写 | 是：写目标参数 | 每一轮 |
# | `GlooCopyService.run` | 已提交的 send / recv | 无 | 无 | 是：gloo 群上的点对点 | 否 | 是：收到的片拷进接收张量（连续切片就是目标参数本身） | 每一轮 |
# | `HyperCommGrid.create_pg` | 维度名 | 本 rank 所在的那个群 | `new_subgroups_by_enumeration` | 是：建群（全员参与） | 否 | 进程状态 | 相当于另一套 `initialize_distributed` |
# | `SelfAttention.get_query_key_value_tensors` | hidden states `[s, b, h]` | Q、K、V | `linear_qkv` | TP 份数多于 group 数时才 all-gather | 按 group 排的行 | 否 | forward |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.rl import pictures, qkv_layout, refit_cost
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

# %% [markdown]
# ## 关键对象
#
# ### 两种切法，同一批 rank
#
# seed 000 的例子是 8 张卡：训练 TP4×PP2（每卡一半的层、每层 1/4 的矩阵），vLLM TP8（每卡全部的层、每层 1/8）。
# 这里缩小一半：4 个 rank，训练 TP2×PP2，rollout TP4×PP1（自测 4 用 8 个 rank 跑 seed 原样的布局）。
# 小 GPT：4 层、hidden 32、8 个 head、4 个 query group、vocab 64、序列长 8，fp32，不共享输入输出 embedding。
#
# - **训练模型（源，policy）** 用 `parallel_state.initialize_model_parallel` 建的全局群，经
#   `ProcessGroupCollection.use_mpu_process_groups()` 交给 `GPTModel`；每个 PP stage 只建自己的 2 层。
# - **rollout 模型（目标）** 不能再调一次 `initialize_model_parallel`（全局群只有一套），所以用 `HyperCommGrid`
#   按 TP=4 另建一套群，装进它自己的 `ProcessGroupCollection`。模型的层从 `pg_collection` 取群，不看全局变量。
#
# 这些构造函数和下面的 `one_rl_round` 都在 `snippets/experiments/n22_refit.py`，模型尺寸是参数 `dims`，本篇用它的
# `tiny`（上面那个小 GPT）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n22_refit import (MEANINGS, Inputs, check_table, compact, forward_backward, gpt, gpt_config,
                                            one_rl_round,
                                            param_bytes, pipeline_logits, rank_row, rollout_groups, rollout_logits,
                                            train_one_step, where)

TINY = EXPERIMENTS["refit"].tiny
SEQ, VOCAB, BATCH = TINY.seq, TINY.vocab, TINY.micro_batch_size
POS = torch.arange(SEQ).expand(BATCH, SEQ)
MASK = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).view(1, 1, SEQ, SEQ)  # True = 看不见

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(gpt_config, gpt, rollout_groups)

# %% [markdown]
# 训练一步走真实的 pipeline schedule（PP=2 时 `get_forward_backward_func()` 给出 1F1B），再对本 rank 的参数做一次
# 普通的 `torch.optim.SGD`。比较 logits 时训练模型也要走 pipeline（forward only）：最后一个 stage 拿到完整 vocab 的
# logits（`runtime_gather_output=True`），再在 PP 群里广播给前面的 stage。rollout 模型 PP=1，直接调用。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(Inputs, forward_backward, train_one_step, pipeline_logits, rollout_logits)

# %% [markdown]
# ### 一轮 RL，在每个 rank 上
#
# 建两个模型 → 第一次同步（rollout 从当前 policy 出发）→ 训练一步 → 不同步时 rollout 用的是哪个 policy →
# 第二次同步。两次 `swap_model_weights` 各自用 `snippets.record.recorder` 记下全部 collective；最后从 `refit.py` 的
# 模块级 plan 缓存里取出本 rank 的 plan（`refit_cost.cached_plan`），拆成记录（`refit_cost.plan_ops`）带回 notebook。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(one_rl_round)

# %% [markdown]
# 两次同步都是同一个 Megatron 调用。它在每个 rank 上执行，参数是本 rank 上的两个模型对象：

# %%
from megatron.core.resharding.refit import swap_model_weights


def refit(policy, rollout, backend):
    swap_model_weights(policy, rollout, backend)  # 训练 TP2·PP2 → rollout TP4；CPU 上 backend 是 "gloo"


ranks = run_ranks(one_rl_round, 4, TINY, tp=2, pp=2, refit=refit, grid=dict(tp=2, pp=2))
r0 = ranks[0]
check_table(ranks, TINY.microbatches)

# %% [markdown]
# 这张表就是"为什么每轮都要同步"：训练一步之后 policy 的 logits 最多变了 0.69，而没有同步的 rollout 模型
# 算出的仍是**旧** policy 的 logits——用它生成的回答属于上一个 policy（on-policy 算法的前提被打破）。
# 同步之后，TP=4 的 rollout 模型和 TP=2·PP=2 的 policy 在每个 rank 上给出相同的 logits（差在 1e-6 以内：
# 两边按不同的切法做矩阵乘，浮点求和顺序不同）。
#
# ### 为什么不是一次 copy
#
# 同一个参数在两种切法下落在不同的 rank、形状也不同。名字按全局层号对齐（`_build_layer_module_prefix_map`：
# PP stage 1 上的 `decoder.layers.0` 其实是全局第 2 层）：

# %%
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
# - 第 3 层的 `linear_qkv`（column-parallel，按第 0 维切）在训练端只在 rank 2、3 上，各 `[32, 32]`；在 rollout 端
#   四个 rank 都有，各 `[16, 32]`。rank 0、1 原本根本没有这一层。
# - `linear_proj`（row-parallel）按第 1 维切：`[32, 16]` → `[32, 8]`。
# - layernorm 不切，训练端两份、rollout 端四份，要**复制**到原本没有它的 rank。
#
# 每个 rank 持有多少：

# %%
Table(["rank", "训练：参数个数", "训练：字节", "rollout：参数个数", "rollout：字节"],
      [[r, len(p), param_bytes(p), len(q), param_bytes(q)]
       for r, (p, q) in enumerate(zip(policy_shapes, rollout_shapes))])

# %% [markdown]
# ### 真实的 plan：谁发给谁、多少字节
#
# `swap_model_weights` 第一次调用时算出的 `ReshardPlan` 存进 `refit.py` 的模块级字典 `_plan_cache`
# （[refit.py:114](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L114)），键是本 rank 号、两个模型的 TP / PP / EP / DP 大小等
# （[`refit.py::_build_plan_cache_key`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L86)），而不是模型对象本身：同一进程里再换一对并行大小相同的模型，
# 会直接用上旧 plan，所以 `one_rl_round` 开头先调 `clear_plan_cache()`。
# 每个 rank 的 plan 是一串 `TransferOp`（参数名、对方 rank、本方切片、对方切片、`task_id`），收发两侧用同一个
# `task_id` 配对。把 4 个 rank 的接收记录汇成矩阵（行 = 发送方，列 = 接收方，对角线 = 本地拷贝，`refit_cost.plan_traffic`）：

# %%
plans = [r["plan"] for r in ranks]
matrix = refit_cost.plan_traffic(plans)
Table(["发送 ＼ 接收", *[f"r{d}" for d in range(4)], "发出合计"],
      [[f"r{s}", *matrix[s], sum(matrix[s])] for s in range(4)])

# %% [markdown]
# 同一个矩阵画出来，每个训练 rank 标上它的 TP、PP 坐标（颜色越深字节越多；鼠标停在格子上看数）：

# %%
pictures.draw_traffic_matrix(
    matrix, [f"r{s}（训练 tp{s % 2}·pp{s // 2}）" for s in range(4)], [f"r{d}（tp{d}）" for d in range(4)],
    title="refit 的字节矩阵：训练 TP2×PP2 → rollout TP4",
    desc="行是发送的训练 rank，列是接收的 rollout rank，格子里是 plan 让它搬的字节；对角线是不出进程的本地拷贝。")

# %%
Table(["rank", "recv 片数", "来自", "远端收到（字节）", "本地拷贝（字节）",
       "send 片数", "发往", "rollout 参数字节"],
      [rank_row(r, ops, rollout_shapes[r]) for r, ops in enumerate(plans)])

# %% [markdown]
# 读法：
#
# - 每个 rank 收到的字节（远端 + 本地）正好等于它在 rollout 切法下的参数字节 53248：plan 只送**目标需要的那一片**，
#   不多送。这和"先把整个参数拼起来再切"不同（verl 的路径就是先拼，见机制解释）。
# - 本地拷贝不只发生在 layernorm 上：rank 0 在 rollout 端要第 0、1 层 `linear_qkv` 的第 0–15 行，训练端的 rank 0
#   恰好持有这两层的第 0–31 行，于是 26496 字节根本不出进程。rank 1 要的第 16–31 行也在 rank 0 上，只能远端收。
# - 复制的参数（layernorm、row-parallel 的 bias）由 `select_src_metadata_balanced` 挑源：目标 rank 自己持有一份就用
#   自己的（[utils.py:551](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L551)），这是 r1→r1、r2→r2 两格；否则按目标 rank 轮流挑
#   （[`utils.py::_round_robin_dp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/utils.py#L498)），这是 r0→r2、r3→r1 两格。四格都是一两千字节。
#
# 同一个参数的每一片，按 `task_id` 把发送方和接收方配起来：

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


transfers_of("decoder.layers.2.self_attention.linear_qkv.weight")

# %% [markdown]
# 全局第 2 层在训练端是 PP stage 1 的本地第 0 层（`decoder.layers.0`），按 TP=2 切成两份 `[32, 32]`；rollout 的
# 4 个 rank 各要 16 行，每个源 rank 的一份被切成两片。row-parallel 的 `linear_proj` 切在第 1 维，片也切在第 1 维：

# %%
transfers_of("decoder.layers.2.self_attention.linear_proj.weight")

# %%
transfers_of("decoder.layers.2.input_layernorm.weight")

# %% [markdown]
# layernorm 在训练端只有 rank 2、3 有（第 2 层在 stage 1），rollout 的 4 个 rank 轮流从这两份里取整块。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 两套群同时存在于每个 rank 上：训练模型用 `parallel_state` 的全局群，rollout 模型用 `HyperCommGrid` 建的群。

# %%
Table(["rank", *r0["groups"]], [[r, *x["groups"].values()] for r, x in enumerate(ranks)])

# %% [markdown]
# rollout 端 TP=4 占满 4 个 rank，所以它的 DP 群只有自己。refit 本身的通信不走这两套群中的任何一个：planner 和
# dtype 对齐的对象 collective、barrier 都走 world，数据走 `GlooCopyService` 自己建的 gloo 群（成员也是全体 rank）。
#
# **第一次同步**记录到的每个 collective（rank 0；API / 群 / 通信前后 shape / 语义）：

# %%
communication_table(compact(r0["first_sync"]), MEANINGS, ranks=False)

# %% [markdown]
# - 第 1–2 行是 planner 唯一的一次 `all_gather_object`（[planner.py:495](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L495)）：对象先被
#   pickle 成字节张量，第一次交换长度（`[1]`），第二次交换按最长者补齐的字节——每个 rank 把自己的（源元数据, 目标元数据）
#   打成一对，最长的一对 pickle 后 12598 字节。之后没有分发 plan 的 collective：每个 rank 用收齐的元数据自己算。
# - 第 3–4 行是 `_harmonize_buffer_dtypes` 的 `all_gather_object`（[refit.py:433](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L433)）：交换源模型
#   persistent buffer 的 dtype（MoE router 的 `expert_bias` 这类），目标端不一致就换掉。这个小 GPT 没有 persistent buffer，
#   交换的是空字典，pickle 后 5 字节。
# - 第 5 行是真正搬 weight 的一次 `batch_isend_irecv`：rank 0 要发 25 片、收 27 片到远端（它的 52 片里另有 25 片
#   是本地拷贝，不经过通信）。
#
# **第二次同步**只剩搬运：plan 已经缓存（[refit.py 第 227 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L227) 先查模块级的 `_plan_cache`），元数据交换不再发生；
# dtype 表记在 plan 上（[refit.py:442](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L442)），也不再交换。

# %%
communication_table(compact(r0["second_sync"]), MEANINGS, ranks=False)

# %% [markdown]
# ## 机制解释
#
# ### planner：每个 rank 各自算出同一份计划
#
# 每个 rank 只知道自己的参数，而一片 weight 的"源"和"目标"往往不在同一个 rank。于是先用一次 `all_gather_object`
# 让每个 rank 都拿到全世界的（源, 目标）元数据（[planner.py 第 495 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L495)；参数名按全局层号改写过，所以 PP stage 不同也能对上），
# 再由每个 rank 按同一个确定的顺序，对每个目标 rank 的每个参数决定从哪个源 rank 的哪个切片拿，只留下自己收或发的那些
# （[planner.py 第 415–445 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L415-L445)）。没有哪个 rank 替别人算，也没有把 plan 再发出去的一步：
# 收发双方重放同一个顺序（目标 rank 从小到大、参数按收齐的顺序，[`planner.py::_iter_global_transfer_ops`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L305)），
# 给同一次传输编出同一个 `task_id`，所以不会配错。代价是每个 rank 都把全局计划走一遍，而且第一次调用要在 world 上做
# 对象 collective，所以 plan 被缓存（[`refit.py::_build_or_get_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L208)），之后每一轮只剩传输。
# 旧名字 `build_centralized_reshard_plan` 还在，但只是发一个弃用警告再转给 `build_local_reshard_plan`
# （[planner.py:517](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L517)）。
#
# > **旧版（core_v0.18.0）：** 真有一个"中心"：`build_centralized_reshard_plan` 用 `gather_object` 把元数据只收到 rank 0
# > （[planner.py:369](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/resharding/planner.py#L369)），rank 0 为所有 rank 排好 plan，再用 `scatter_object_list` 给每个 rank 发它那份
# > （[planner.py:450](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/resharding/planner.py#L450)），所以第一次同步多一步分发 plan 的对象 collective。core_v0.16.1 更早：两次 `all_gather_object`
# > 之后 rank 0 排计划，再把全部 plan 广播给每个 rank。
#
# ### TP 参数：LCM 小片
#
# 源按 TP 切成 `Ns` 份、目标切成 `Nd` 份（带 stride 时再乘 stride），`_plan_tp`（经 `_emit_lcm_block_ops`）把切分维切成
# `lcm(Ns, Nd)` 个等长小片：每个小片完整地属于一个源分片、也完整地属于一个目标分片，于是逐片写一条 send / recv 即可。
# 上面 TP 2 → 4：`lcm = 4`，每个源分片贡献 2 片、每个目标分片收 1 片。反过来 4 → 2 时每个目标分片从两个源各收 1 片。
# stride 用于一个 rank 的分片本身由几段拼成的参数：SwiGLU 的 `linear_fc1` 每个 rank 存的是 `[gate 的一段; up 的一段]`，
# Megatron 给它 `partition_stride=2`（[mlp.py 第 210 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L210)），planner 才知道要分段对齐。本篇的小 GPT 用 GeLU，stride 都是 1。
#
# ### 复制的参数：整块、轮流挑源
#
# 没有 TP 属性的参数（layernorm、row-parallel 的 bias）在每个 TP rank 上都有一份。`_finalize_dp_transfers` 让目标
# 整块接收，来源就是 `select_src_metadata_balanced` 挑中的那份副本的持有者（[planner.py:279](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L279)）。
# 挑法分两步：目标 rank 自己就持有一份时直接用它（本地拷贝，不走网络）；否则按目标 rank 号在源的各个 DP 副本之间
# 轮流选，分摊发送压力。
#
# ### 执行：先本地、再点对点、最后 barrier
#
# `execute_reshard_plan` 提交每个 recv 时，目标切片若是连续的内存，就直接拿参数的这片视图当接收张量
# （[execution.py:172](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L172)）；不连续的（例如按第 1 维切、又没取满的片）才另开暂存缓冲
# （[execution.py:187](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L187)）。`GlooCopyService.run` 把 `task_id` 相同的本地收发直接 `copy_`，其余组成一次
# `batch_isend_irecv`，收完从 CPU 缓冲拷进接收张量；然后 world barrier（[execution.py:199](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L199)），
# 之后才把暂存缓冲写回参数（[execution.py:224](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/execution.py#L224)）。本篇 TP 2 → 4 的目标切片要么按第 0 维切、
# 要么取满整个本地张量，全是连续的，所以没有暂存缓冲，weight 在 `run()` 里就写进了 rollout 模型。
# 换成 `"nccl"` 是同一份 plan，只是传输走 NCCL、用 CUDA stream 与计算重叠。在 CPU 上，gloo 版本也要 CUDA：构造时建
# copy stream、拷贝在这个 stream 上做，暂存缓冲用锁页内存（`pin_memory=True`）；我们用两个作用域只限这个模块的补丁
# 让它们成为空操作或普通内存（[在 CPU 上运行](../../cpu/) 的 `refit_streams`、`refit_pinned_buffers`）。
#
# ### `linear_qkv`：按 query group 交错
#
# Megatron 把 Q、K、V 三个投影存成一个矩阵，而且行按 query group 排：8 个 query head、4 个 query group 时，
# 每个 group 是"它的 2 个 query head、1 个 key head、1 个 value head"，每项 `head_dim` 行：

# %%
labels = qkv_layout.fused_row_labels(num_heads=8, num_query_groups=4)
blocks = [labels[i:i + 4] for i in range(0, len(labels), 4)]  # 2 q + k + v per group
Table(["query group", "linear_qkv 里的行块（每块 head_dim 行）", "训练 TP2 的 rank", "rollout TP4 的 rank"],
      [[g, " ".join(b), g * 2 // len(blocks), g * 4 // len(blocks)] for g, b in enumerate(blocks)])

# %% [markdown]
# 同一组行块，上面是 Megatron 的存法和每种 TP 下各 rank 拿走的行，下面是 Hugging Face 分开存的 `q_proj`、`k_proj`、
# `v_proj`，箭头是转换时每个行块去哪里：

# %%
pictures.draw_qkv_layout(labels, num_query_groups=4, tp_sizes=(2, 4))

# %% [markdown]
# 这样排的理由在后两列：TP 按行把 `linear_qkv` 切成连续的几段，每段恰好是**整数个 query group**——本 rank 的
# attention 需要的 Q、K、V 全在本地，不用通信（`get_query_key_value_tensors` 只在 TP 份数多于 group 数时才 all-gather，
# [attention.py 第 1839 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1839)）。也正因为如此，上面 TP 2 → 4 的 refit 对 `linear_qkv` 只是连续切片，不需要重排。
#
# Hugging Face（`q_proj`、`k_proj`、`v_proj`）和 vLLM 的权重加载器按"全部 Q、全部 K、全部 V"分开存。
# 从 Megatron 送过去，就要按 group 拆开、重排、改名；`snippets/rl/qkv_layout.py` 做这件事（和它的逆）。
# 检验：在 1 个 rank 上建一个真实的 `SelfAttention`（local spec，8 head、4 group，带 bias），把它的权重转换成 HF 的样子，
# 用一个照 HF Llama 写的 attention（`repeat_kv` 式的分组）计算，输出必须一致：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
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
Table(["名字", "shape"], [[k, list(v.shape)] for k, v in {**megatron_state, **hf}.items()])

# %%
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
# 只改名不重排（把前 32 行当 Q、接着 16 行当 K……）算出的是另一个模型。`linear_proj` 不用重排：attention 输出
# 按 head 顺序排，和 HF 的 `o_proj` 一致。local spec 的 layernorm 名字也只需改名；Transformer Engine spec 把
# layernorm 融进了 `linear_qkv`（`linear_qkv.layer_norm_weight`），名字表要跟着换。verl 做同一件事的代码是
# [`megatron_utils.py::default_tp_concat_fn`](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/utils/megatron_utils.py#L846)：
# 先 all-gather 各 TP 分片，再对每片按 group 拆出 q、k、v 并拼起来。
#
# ### 要搬多少、多久
#
# seed 000 的数字：8B 的 bf16 weight 16 GB，8 张卡每卡 2 GB，NVLink 约 4.4 ms，IB 约 40 ms；70B 是 140 GB。
# 反推带宽：2 GB ÷ 4.4 ms ≈ 450 GB/s，正是 H100 NVLink 4 每卡单向带宽（双向 900 GB/s 的一半）；2 GB ÷ 40 ms = 50 GB/s，
# 正是每卡一块 400 Gb/s NDR InfiniBand 网卡（400 ÷ 8）。GB 按十进制（1e9 字节）。所以这组数字假设的是：
# 每张卡只收自己那 1/8（目标切片），8 张卡同时收、各走各的链路，没有延迟和协议开销——是下限。
# `snippets/rl/refit_cost.py` 把它写成公式：
#
# <!-- same-as-next-output -->
# | model | dtype | total (GB) | GPUs | per GPU (GB) | NVLink (ms) | IB (ms) |
# |---|---|---|---|---|---|---|
# | 8B | bf16 | 16.0 | 8 | 2.0 | 4.44 | 40.0 |
# | 70B | bf16 | 140.0 | 8 | 17.5 | 38.89 | 350.0 |

# %%
Table(refit_cost.REFIT_HEADERS, refit_cost.refit_rows(8e9) + refit_cost.refit_rows(70e9))

# %% [markdown]
# "每卡只收自己那片"是 Megatron planner 的做法。实际系统常常更费：verl 的 colocated 路径让每张卡先把每个参数
# **完整地**聚齐（FSDP 的 `full_tensor()`，或 Megatron 的 TP all-gather + PP broadcast），再交给同卡上的推理引擎挑自己那片；
# separate 摆法下训练端把整个模型广播给每张生成卡。同样 8 卡、TP4×PP2 → TP8，三种做法每卡收到的字节和时间下限：

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
# 本篇的小模型也可以拿来对账：rollout 端每个 rank 收到的字节 = TP 切分参数的 1/4 + 全部复制参数。公式里的
# "model / GPUs" 只算了前一项，复制参数（layernorm、bias）在大模型里占比极小：

# %%
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
# | weight 怎么到推理端 | 不出这张卡：训练进程把张量的 CUDA IPC 句柄交给同卡的推理进程，推理进程直接读 | 走网络：训练端经 NCCL（或 Megatron 的 copy service）发给另一批卡 |
# | 代价 | 同一时刻只有一边在算；两边的显存要能轮流装下 | 每轮要等 weight 过网络；想让两边都不闲，生成就得用落后一两步的 policy（off-policy） |
# | 好处 | 没有闲卡，同步最快 | 两边各选最合适的并行配置和卡数，互不抢显存 |
# | 配置 | verl `actor_rollout_ref.hybrid_engine: true`（缺省）；NeMo RL `policy.generation.colocated.enabled: true`（缺省） | verl `hybrid_engine: false`（只在实验性的 fully_async_policy 里）；NeMo RL `colocated.enabled: false` |
#
# 本篇 CPU 上的实验属于 colocated：源和目标模型在同一批 rank 上、同一个 world。`swap_model_weights` 也支持分开的摆法
# （某个 rank 只有源或只有目标模型、自建的 refit 群、两边的 rank 偏移），本篇没有跑（遗留问题 4）。
#
# ### verl 和 NeMo RL 怎么配，对应哪条代码路径
#
# 读的是 verl 提交 [`b178a3c`](https://github.com/volcengine/verl/tree/b178a3cd56f58b2d502255daba591e92833930a7)
# 和 NeMo RL 提交 [`7ea279a`](https://github.com/NVIDIA-NeMo/RL/tree/7ea279abfbeb698b092856d0dab61e7cf39bc909)：
#
# | 配置项 | 取值 | 代码路径 |
# |---|---|---|
# | verl `actor_rollout_ref.actor.strategy` | `fsdp` / `fsdp2`（[dp_actor.yaml 第 26 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/config/actor/dp_actor.yaml#L26)）或 `megatron`（[megatron_actor.yaml 第 16 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/config/actor/megatron_actor.yaml#L16)） | [main_ppo.py 第 153–162 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/main_ppo.py#L153) 据此选 `fsdp_workers.py` 或 `megatron_workers.py` 的 `AsyncActorRolloutRefWorker` |
# | verl `actor_rollout_ref.rollout.name` | 必填（[rollout.yaml 第 5 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/config/rollout/rollout.yaml#L5) 写的是 `???`）；注册表里有 `vllm`、`sglang`、`trtllm`（[base.py 第 81 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/rollout/base.py#L81)） | 决定 `rollout.update_weights` 是谁：vLLM 经 CUDA IPC 分桶传（[vllm_rollout.py 第 146 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/rollout/vllm_rollout/vllm_rollout.py#L146)） |
# | verl rollout `tensor_model_parallel_size` | 缺省 2（[rollout.yaml 第 50 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/config/rollout/rollout.yaml#L50)） | 推理引擎的 TP；它的加载器从每个完整张量里挑本卡那 1/TP |
# | verl `actor_rollout_ref.hybrid_engine` | 缺省 `true`（[ppo_trainer.yaml 第 47 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/config/ppo_trainer.yaml#L47)） | 标准 PPO trainer 只接受 `true`（[ray_trainer.py 第 276 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/trainer/ppo/ray_trainer.py#L276)）。每轮 `rollout_mode()`：FSDP 逐参数 `full_tensor()`（[fsdp_workers.py 第 677 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/fsdp_workers.py#L677)）；Megatron 逐参数 PP broadcast + TP all-gather 再转 HF 名（[megatron_utils.py 第 928 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/utils/megatron_utils.py#L928)）或经 Megatron-Bridge 导出（[megatron_workers.py 第 676 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/megatron_workers.py#L676)） |
# | verl `hybrid_engine: false` | 只在 `verl/experimental/fully_async_policy`（[fully_async_trainer.py 第 72 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/experimental/fully_async_policy/fully_async_trainer.py#L72) 反过来断言它为 false） | 训练 rank 0 逐张量 `collective.broadcast` 给所有生成卡（[base_detach_sync.py 第 210 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/experimental/fully_async_policy/base_detach_sync.py#L210)） |
# | NeMo RL `policy.generation.colocated.enabled` | 缺省 `true`（[grpo_math_1B.yaml 第 439 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L439)） | [grpo.py 第 2316 行 `refit_policy_generation`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2316)：colocated 走 CUDA IPC（`stream_weights_via_ipc_zmq`，SGLang 走 HTTP），否则 `broadcast_weights_for_collective`（NCCL） |
# | NeMo RL `generation.backend: megatron` 的 `mcore_generation_config.refit_backend` | `"nccl"` 或 `"gloo"`（[第 408 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L408)） | Megatron 自带推理时用的正是 `swap_model_weights`：colocated 在同一批卡上重切（[megatron_worker.py 第 917 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/megatron/megatron_worker.py#L917)），non-colocated 跨两个 world（[第 876 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/megatron/megatron_worker.py#L876)） |
#
# ### 两端各有哪些引擎可选
#
# 上表只看了"weight 怎么走"。两个框架在训练端和生成端各自能接哪些代码（同样读自上面两个提交）：
#
# | 框架 | 训练端 | 生成端 |
# |---|---|---|
# | NeMo RL | `policy.dtensor_cfg.enabled` 或 `policy.megatron_cfg.enabled`，二选一（[lm_policy.py 第 118 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L118)）。前者是 PyTorch 原生的 DTensor 路径：`_v2: true`（[grpo_math_1B.yaml 第 142 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L142)）选 `DTensorPolicyWorkerV2`（[lm_policy.py 第 166 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L166)），模型由 NeMo Automodel 建（[dtensor_policy_worker_v2.py 第 23 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py#L23)），按 `FSDP2Config` 做 FSDP2（[setup.py 第 481 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/automodel/setup.py#L481)），再叠 `tensor_parallel_size` 的 TP。后者是 `MegatronPolicyWorker`（[lm_policy.py 第 140 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/lm_policy.py#L140)），经 Megatron Bridge 建 Megatron Core 模型（[megatron_policy_worker.py 第 29 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/workers/megatron_policy_worker.py#L29)） | `policy.generation.backend`，示例配置缺省 `vllm`（[grpo_math_1B.yaml 第 369 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B.yaml#L369)）；`setup` 里分 `megatron`（Megatron Core 自带推理，[grpo.py 第 1275 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1275)）、`vllm`（[第 1297 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1297)）、`sglang`（[第 1428 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L1428)）几支，这个提交里还有 `trtllm`、`dynamo` |
# | verl | `actor.strategy`：`fsdp` / `fsdp2` 或 `megatron`（上表） | `rollout.name` 注册表里的 `vllm`、`sglang`、`trtllm`（上表）。另有 `HFRollout`（[hf_rollout.py 第 39 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/rollout/hf_rollout.py#L39)）：直接拿训练端的 HF 模块调 `generate`，没有第二个引擎，也就不用重切；但这个提交的注册表已不含 `hf`，FSDP worker 里为 `name == "hf"` 留的分支（[fsdp_workers.py 第 636 行](https://github.com/volcengine/verl/blob/b178a3cd56f58b2d502255daba591e92833930a7/verl/workers/fsdp_workers.py#L636)）之后照样去查注册表，会在断言处停下 |
#
# **Megatron-LM 自己也做 refit。** 同一个 tag 的 `train_rl.py` 调的就是 `pretrain`，命令行带上 `--perform-rl-step`
# （`examples/rl/README.md` 的启动示例）。只要再给
# `--rl-inference-tensor-model-parallel-size` 等任何一个推理端并行度（或者训练用了 CP>1：推理端不支持 CP，
# [training.py:1250](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1250)），`pretrain` 就在同一个 world 里按这套并行度
# 另建一个推理模型（[training.py 第 1245–1323 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1245-L1323)，群来自
# [`shards.py::build_inference_pg_collection`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/inference/shards.py#L18)）——和本篇 CPU 上的做法一样，
# 两个模型在同一批 rank 上。之后有三处调用 `swap_model_weights(model, inference_model, args.refit_method)`：
#
# - 每次收集新 rollout 之前：`train` 调 [`rl_utils.py::get_grpo_data_iterator`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/rl/rl_utils.py#L1835)，
#   它调 [`rl_utils.py::get_environment_rollouts`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/rl/rl_utils.py#L598)，后者在生成之前先同步
#   （[rl_utils.py 第 634 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/rl/rl_utils.py#L634)）；
# - 训练循环里每次 RL 评估之前（[training.py 第 4028 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L4028)）；
# - 训练结束后的验证之前（[training.py 第 1471 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1471)）。
#
# 没有单独的推理模型时，三处都跳过同步，训练模型自己生成。`--refit-method` 的缺省是 `gloo`，另两个选项是 `nccl`、
# `nvshmem`（[arguments.py 第 2698 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2698)，在
# [`arguments.py::_add_rl_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2565) 里）：缺省走的正是本篇在 CPU 上跑的
# `GlooCopyService`。
#
# ### 一个命令：这份 verl 配置每轮怎么同步 weight
#
# `weight-sync CONFIG [--params 7e9]`（即 `python -m snippets.rl.weight_sync`；`snippets.rl.verl_sync` 是它的旧名）读 verl 配置（嵌套写法，或 verl 命令行覆盖那样的点号键），
# 回答 seed 000 的四个问题并给出每卡搬运量和时间下限（模型大小取 `--params`，或从 `model.path` 的名字里读）。
# `tests/fixtures/verl/` 下是几份最小的 verl 配置。seed 的布局（Megatron TP4×PP2，SGLang TP8，colocated）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ROOT = Path(refit_cost.__file__).resolve().parents[2]


def verl_sync(*args):
    run = subprocess.run([sys.executable, "-m", "snippets.rl.verl_sync", *args], cwd=ROOT,
                         capture_output=True, text=True)
    print(run.stdout + run.stderr + f"(exit status {run.returncode})")


verl_sync("tests/fixtures/verl/megatron_sglang_colocated.yaml")

# %% [markdown]
# separate 摆法（verl 的 fully_async_policy，70B，生成端 TP4）：整模型经网络广播，每卡 140 GB，比只送切片慢 4 倍：

# %%
verl_sync("tests/fixtures/verl/fsdp2_vllm_separate.yaml")

# %% [markdown]
# `rollout.name` 留成 `???`（verl 要求必填）时，命令照样按其余的键作答，但第一行先说缺了什么：

# %%
verl_sync("tests/fixtures/verl/rollout_name_unset.yaml")

# %% [markdown]
# 既不是 verl 也不是 NeMo RL 的配置，命令以状态 2 退出，只说一行：

# %%
verl_sync("tests/fixtures/verl/not_verl.yaml")

# %% [markdown]
# RL 用户手里更常见的是启动脚本：先几行 shell 变量，再一条 `python3 -m verl.trainer.main_ppo --config-name=… key=value …`。
# 同一个命令（安装后叫 `weight-sync`）照 bash 的规矩展开脚本里的变量（`NAME=value`、`${NAME:-default}`、`$((…))`、
# 带引号的列表），找到 trainer 那条命令，再把它的 Hydra 覆盖项逐条叠到 verl 这份配置的缺省值上。缺省值我们只记了命令要读的
# 那几个键，并注明读自 verl 提交 `b178a3c`。下面这份脚本只写了 Megatron 的 TP、PP 和 vLLM 的 TP，没写 `hybrid_engine`，
# 于是取 verl 的缺省 `true`：训练和生成轮流用同一批 16 张卡。脚本里要到运行时才知道的值（`$1`、`$(…)`、脚本没设的环境变量），
# 报告会单列一行 `unknown`，说明它喂给哪个键，其余部分照常回答。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def weight_sync(*args):
    run = subprocess.run([sys.executable, "-m", "snippets.rl.weight_sync", *args], cwd=ROOT,
                         capture_output=True, text=True)
    print(run.stdout + run.stderr + f"(exit status {run.returncode})")


# %%
weight_sync("tests/fixtures/verl/run_qwen2_7b_megatron_grpo.sh")

# %% [markdown]
# NeMo RL 的配置靠 `defaults:` 继承：子文件只写与父文件不同的键，父文件的路径相对子文件所在目录。命令按 NeMo RL 自己的规则
# （`load_config_with_inheritance`）从最上层的父文件一层层合并下来，再解开 `${…}` 引用。下面这份配置继承了两层：
# `recipes/grpo_llama8b_megatron_separate.yaml` → `grpo_llama8b_megatron.yaml` → `grpo_base.yaml`。Megatron 以 TP2×PP2
# 在第一个节点训练，vLLM 以 TP2 在第二个节点生成（`colocated.enabled: false`），所以每轮 `refit_policy_generation`
# 走 NCCL broadcast 那一支：每张生成卡都要收下整个模型，而不只是自己那一片。

# %%
weight_sync("tests/fixtures/nemo_rl/recipes/grpo_llama8b_megatron_separate.yaml")

# %% [markdown]
# ## 与训练主链路的关系
#
# RL 的一轮 = rollout + 一次（或几次）训练 step。训练 step 就是第一、二轮笔记读过的主链路：`forward_backward_func`
# （笔记 13 的 pipeline schedule）、`finalize_model_grads`、`optimizer.step()`。refit 紧跟在 `optimizer.step()` 之后、
# 下一次 rollout 之前，读的是**更新后的参数**（如果开了 distributed optimizer 的 overlap param gather，参数要先聚齐；
# NeMo RL 在重切前专门处理了这一点）。它不动训练端的任何状态：梯度、优化器状态、学习率都留在训练端，只有 weight
# 被复制、重切、写进推理端。和 checkpoint 换并行度加载（笔记 07、21 的 `dist_checkpointing`）解决的是同一个问题——
# 同一份参数换一种切法——但 refit 每轮都做、走内存和网络、不落盘，所以只搬目标需要的切片。

# %% [markdown]
# ## 与基础知识的连接
#
# - **on-policy**：PPO / GRPO 的目标函数按"生成这批数据的 policy"做重要性采样；rollout 用旧 weight，就等于在用
#   off-policy 数据训练。separate 摆法有意接受一两步的滞后，并在目标函数里修正（verl 的 `rollout_correction`）。
# - **切分 = 区间划分**：一个维度被切成 `Ns` 段和 `Nd` 段，两种划分的公共细分就是 `lcm(Ns, Nd)` 段——planner 的
#   LCM 小片就是这个公共细分，每片只属于一个源段和一个目标段。
# - **带宽估算**：时间 ≈ 字节 ÷ 带宽，是下限。NVLink（机内）比 InfiniBand（机间）快一个数量级，所以"在哪两张卡之间搬"
#   和"搬多少"同样重要：colocated 的 CUDA IPC 连 NVLink 都不走。

# %% [markdown]
# ## 遗留问题
#
# 1. **rollout 模型自己算 loss：现在用的是模型自己的 TP 群（已修复，运行确认）。** `GPTModel` 的每一层都从
#    `pg_collection` 取 TP 群；带 `labels` 时的 loss 也一样：
#    [`language_module.py::LanguageModule.compute_language_model_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L155)
#    在非融合路径上调用
#    [`cross_entropy.py::vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L213)
#    时传入模型自己的 TP 群（[language_module.py 第 194–196 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L194-L196)），
#    没给群时才退回 `parallel_state` 的全局 TP 群（[cross_entropy.py 第 124–125 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L124-L125)）。
#    同一进程里训练端是全局群（TP=2），rollout 模型的 logits 按 TP=4 切：下表里 rollout 模型带 labels 算的 loss
#    和用它自己完整 logits 算的交叉熵相等，4 个 rank 也一致。
#
# > **旧版（core_v0.18.0）：** 非融合路径调用 `vocab_parallel_cross_entropy` 时不传群
# > （[language_module.py:183](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/models/common/language_module/language_module.py#L183)），
# > 它就用全局 TP 群 `[0, 1]` / `[2, 3]` 去归约按 TP=4 切的 logits，loss 与交叉熵对不上、两组 rank 之间也不一致
# > （core_v0.16.1 同样如此，当时这张表的 rank 0 是 3.3379 对 4.1089）。在这些版本上让 rollout 模型只出 logits、在外面算 loss。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
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
    # 2. like the unit test: PP groups in pg_collection, but the config does not say PP=2
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
# 2. **Megatron 自己的 refit 单元测试，PP 用例现在真的切层了（已修复；旧建法运行确认）。** 早先（core_v0.16.1）的
#    `test_swap_gpt_parametrized` 把 PP 群放进 `pg_collection`，但 `TransformerConfig` 没写 `pipeline_model_parallel_size`，
#    每个 stage 又都是 `pre_process=True, post_process=True`。而每个 stage 建几层由
#    [`transformer_block.py::get_num_layers_to_build`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L70)
#    按 **config** 里的 PP 大小算（[transformer_block.py 第 153 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L153)）。照样子建一个：每个 rank 都建了全部 4 层——"PP2 → PP1"其实是
#    "两份完整副本 → 一份"，跨 stage 按全局层号配对（本篇训练端真的切了层）那条路径没被这个测试覆盖。
#    现在的测试已改（core_v0.18.0 里已是这样）：建好 config（[test_model_swap.py 第 327 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L327)）后把两边的 PP 大小写进去
#    （[test_model_swap.py 第 346–347 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L346-L347)），`pre_process` / `post_process` 按 PP rank 取（[test_model_swap.py 第 113 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/tests/unit_tests/resharding/test_model_swap.py#L113)）。

# %%
Table(["rank", "单元测试的建法（config 没写 PP）：层号", "config 写了 PP=2：层号"],
      [[r, x["unit_test_like"], x["real_pp"]] for r, x in enumerate(odd)])

# %% [markdown]
# 3. **`HyperCommGrid` 与 `RankGenerator`：同序同群；单元测试用的是另一个序。**（回答笔记 08 遗留问题 3。）
#    `HyperCommGrid` 的维度名列表从左到右就是 `order` 从快到慢；按 `parallel_state` 的缺省序
#    `tp-cp-ep-dp-pp` 排，两者给出相同的 rank 列表。单元测试写的是 `["tp", "cp", "ep", "pp", "dp"]`，相当于
#    `tp-cp-ep-pp-dp`：DP 和 PP 都大于 1 时，它的 DP 群和 PP 群与同一进程里 `initialize_model_parallel` 建的全局群互换。

# %%
Table(["群", "RankGenerator（tp-cp-ep-dp-pp）", "HyperCommGrid 同序",
       "HyperCommGrid 单元测试的序（…pp, dp）"],
      [[d, *odd[0]["grids"][d]] for d in ("dp", "pp")])

# %% [markdown]
# 4. **跨两个 world 的 refit 本篇没有跑。** 本篇只用了 `swap_model_weights(src, dst, method)` 最简单的用法：两个模型都在
#    每个 rank 上、共用一个 world。它的签名还有 `group`、`src_rank_offset`、`dst_rank_offset`
#    （[`refit.py::swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L339)），源或目标模型可以是 `None`（只发、只收或只陪着做
#    collective 的 rank，见 [`refit.py::reshard_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L461)），另有只建 plan 不搬数据的
#    [`refit.py::prepare_swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L292)：训练和推理可以在两个 world、一个自建的 refit 群里。
#    NeMo RL 的 non-colocated Megatron 推理用的就是这套参数（[megatron_worker.py 第 35 行](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/megatron/megatron_worker.py#L35)）。
#    本站还没有这种摆法的实验。
# 5. **gloo 后端在 CPU 上也要 CUDA。** `GlooCopyService.__init__` 建 `torch.cuda.Stream()`
#    （[gloo_copy_service.py 第 34 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L34)），本地拷贝和收完后的写回都在这个
#    stream 上做，`run()` 结尾让当前 stream 等它（[gloo_copy_service.py 第 128 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L128)）；
#    收发都先经过一块 `pin_memory=True` 的 CPU 缓冲（[gloo_copy_service.py 第 45 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/copy_services/gloo_copy_service.py#L45)）。
#    传输本身全是 CPU 张量上的 gloo。没有 CUDA 驱动时建 stream、锁页内存都会报错，所以需要 `refit_streams` 和
#    `refit_pinned_buffers` 两个补丁（只作用于这一个模块）。
# 6. **没读到的部分**：NVSHMEM copy service（`nvshmem_copy_service/`，GPU 内核直接搬）、EP 参数的重切
#    （`resolved_name` 把本地 expert 编号改成全局编号）、`NCCLCopyService` 怎么用 stream 与计算重叠——都要 GPU。
#    其中 NCCL 这一条，本篇的实验在 GPU 上就会走到：`one_rl_round` 在 `device="cuda"` 时把后端换成 `"nccl"`，
#    在真机上运行的命令写在仓库 README 的 “Running at real scale” 一节（例如
#    `python -m snippets.run --nproc-per-node 8 refit --dims dense-8b --tp 2 --pp 4`）；NVSHMEM 和 EP 重切本站没有实验。

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
received = [sum(seed_matrix[s][d] for s in range(8)) for d in range(8)]
print("整个模型字节:", model_bytes[0])
Table(["rank", "收到（字节）", "占整个模型", "其中本地拷贝"],
      [[d, received[d], round(received[d] / model_bytes[0], 4), seed_matrix[d][d]]
       for d in range(8)])

# %% [markdown]
# **5. 一份 verl 配置：Megatron TP4×PP2 训练，SGLang TP8 生成，`hybrid_engine: true`，模型 Llama-3.1-8B。
# verl 每轮让每张卡收多少？如果只送每卡自己那片呢？**
#
# <details><summary>答案</summary>
#
# colocated，verl 的 Megatron 路径让每张卡逐个参数聚齐完整张量（PP broadcast + TP all-gather）：每卡收
# 16 GB × (1 − 1/8) = 14 GB，NVLink 上至少 31.1 ms；之后交给同卡的 SGLang 是 CUDA IPC，不走链路。只送切片是
# 16 GB ÷ 8 = 2 GB，至少 4.44 ms。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
verl_sync("tests/fixtures/verl/megatron_sglang_colocated.yaml", "--params", "8e9")

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
# After every policy update the inference engine still holds the old weights, so each RL round pushes
# the new ones to it. It is not a copy: the trainer may run TP4 × PP2 while vLLM runs TP8, and Megatron
# fuses Q, K, V per query group where Hugging Face keeps them apart, so tensors are resliced, reordered
# and renamed. Megatron Core's `swap_model_weights` plans every slice once (one metadata all-gather, then
# each rank derives the same global plan and keeps its own sends and receives), then sends each GPU only its
# share: 8B in bf16 is 16 GB, 2 GB per GPU on 8 GPUs, about 4.4 ms over NVLink, 40 ms over InfiniBand.
