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
# # 17 MoE 与 expert parallel：router 选 expert，all-to-all 送 token
#
# MoE 层里一个 token 怎样选出 expert、被送到哪个 rank、算完怎样回来？expert parallel（EP）下一次 forward + backward
# 发几次 all-to-all、每次搬几行，router 和 expert 的梯度各在哪个群里归约？本篇在 4 个进程上跑 Megatron Core 0.19.0
# 真实的 `MoELayer`，把 EP=2 的每一步和 EP=1 的参考答案逐项对照，再换成 allgather dispatcher 比较。

# %% [markdown]
# ## 阅读目标
#
# 1. `MoELayer.forward` 的四步 route → dispatch → experts → combine，每一步之后 tensor 的形状。
# 2. `TopKRouter` 怎样从 logits 得到 `probs`、`routing_map` 和 aux loss，aux loss 怎样进入反向、比例由谁定。
# 3. alltoall dispatcher 的 split sizes 从哪来、为什么必须先到主机；每次 all-to-all 搬的是什么。
# 4. EP 群从哪来，router 与 expert 的梯度各在哪个群归约、DDP 怎样缩放。
# 5. allgather dispatcher 换掉了哪些通信，代价在哪里。
#
# **结论**
#
# - 四步：rank 0 的 6 个 token × top-2 = 12 行按 expert 排好，all-to-all 后收进 13 行，combine 后回到 `[6, 1, 8]`。
# - `TopKRouter` 取 logits 最大的 2 个、只在它们上做 softmax；Switch aux loss 手算 1.0058，与 Megatron 记下的相同。
# - EP=2 的 alltoall：forward 1 次 all-gather 计数 + 3 次 all-to-all，backward 3 次，split 对调：`[6, 6] → [6, 7]`。
# - split sizes 要先到主机：同步点取最早用到它的一处，EP=2 是 `before_ep_alltoall`，EP=1 是 `before_permutation_2`。
# - router 梯度在 DP 群 `[0, 1, 2, 3]` 归约，expert 在 edp 群 `[0, 2]`；DDP 缺省两组都乘 0.25（1/DP）。
# - aux loss 的反向比例：不开 per-token loss 时 loss_scale·CP/m（CP=2、m=4 得 0.5），开了是 loss_scale（1.0）。
#
# 先读：[笔记 08](../08_parallel_state_and_rank_generator/)（expert 网格）、[笔记 11](../11_transformer_layer/)（层里的 MLP 槽位）、[笔记 14](../14_data_parallel_ddp/)（DDP 的梯度 buffer）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n17_moe import (allgather_meaning, alltoall_meaning, build_moe_layer, expert_parallel_step,
                                          flow_table, micro_batch, reference, tokens_table)
from snippets.moe import pictures
from snippets.moe.tables import Folded, dispatch_table, local_expert_state
from snippets.ranks.groups import rank_table
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import record
from snippets.record.tables import Table

import torch
import torch.distributed as dist
from IPython.display import display
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.moe.moe_utils import (MoEAuxLossAutoScaler, compute_routing_scores_for_aux_loss,
                                                     router_gating_linear, switch_load_balancing_loss_func,
                                                     topk_routing_with_score_function)

TINY = EXPERIMENTS["moe"].tiny
ref = run_ranks(reference, 1, TINY)[0]                                             # EP=1：一个进程持有全部 expert
ep_run = run_ranks(expert_parallel_step, 4, TINY, ref["state"], grid=dict(ep=2))   # EP=2：4 个 rank
flow, tokens = flow_table(ep_run), tokens_table(ep_run)
gathered = dispatch_table(ep_run[0]["allgather"]["calls"], allgather_meaning)
pictures.draw_dispatch(flow.rows[:2], tokens.rows[:2], gathered.rows,
                       title="EP=2：alltoall 只送被选中的 (token, expert) 行；allgather 收下全部 token，"
                             "本地 expert 挑出的行相同")

# %% [markdown]
# rank 0 所在的 EP 群。左：每个 rank 把选中对方 expert 的行发过去，箭头上是行数（`input_splits`）；
# 右：每个 rank 先收下群里全部 12 个 token，本地 expert 再挑出自己的行。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n17_moe.py`（实验名 `moe`，源码在下面的折叠代码里）。`build_moe_layer` 照
#   `TransformerLayer` 的做法调用 local spec 的 MLP 槽位：它是构造器 `partial(MoELayer, submodules=MoESubmodules(...))`
#   （[`moe_module_specs.py:87`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/moe_module_specs.py#L87)，
#   `TransformerLayer` 在 [`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431) 调用它），只是不建外面那层。
#   `micro_batch(dims, i)` 是第 `i` 个 DP rank 进入 MoE 层的激活 `[S, B, H] = [6, 1, 8]` 和反向传回的梯度。
# - `reference` 在 1 个进程里以 EP=1 持有全部 4 个 expert，依次跑 4 个 micro-batch（梯度累加），是参考答案；
#   `expert_parallel_step` 在 4 个本地 gloo 进程（`snippets.ranks.launch.run_ranks`，从已导入 Megatron 的内核 fork）上以
#   EP=2 建层，从参考的 `state_dict` 拷入本 rank 那两个 expert（`snippets.moe.tables.local_expert_state`），两种 dispatcher
#   各跑一次 forward + backward，记录器（`snippets.record.recorder.record`）记下每个 collective。
#   `snippets.moe.tables.watch` 只挂 hook 截下 router 的输出和 expert 收到的行数，`pop_aux_loss` 从 Megatron 的 MoE 指标
#   tracker 读回 aux loss；这些模块不实现 MoE 的任何一步。页首的图由 `snippets.moe.pictures.draw_dispatch` 从同一次运行的表画出。
# - 尺寸是实验登记的 `tiny`：4 个 expert、top-2、hidden 8、expert FFN 16、每个 rank 6 个 token；其余单元格在正文里直接调用
#   Megatron，在 notebook 进程里或在 `run_ranks` 起的 2 / 4 个进程里。
# - 命令行复现这些表：`.venv/bin/python -m snippets.run --nproc-per-node 4 moe --ep 2`；整页：
#   `scripts/execute_notes.sh notes/17_moe_expert_parallel.py`。
# - CPU 上用到的两处改动见文末"遗留问题"的折叠部分和[在 CPU 上运行](../../cpu/)。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_moe_layer, micro_batch, reference, expert_parallel_step)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`moe_layer.py::MoELayer.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L607) | route → dispatch → experts → combine |
# | [`router.py::TopKRouter.routing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L741) | top-k、aux loss 挂到 `probs` 上 |
# | [`moe_utils.py::MoEAuxLossAutoScaler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L284) | 前向原样返回，反向给 aux loss 一个梯度 |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher.preprocess`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L495) | 交换计数，算 `input_splits`、`output_splits` |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher._maybe_update_cuda_sync_point`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L902) | 留下最早需要主机值的同步点 |
# | [`distributed_data_parallel.py:208`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L208) | expert 梯度的缩放（`average_in_collective` 时 edp/DP） |
# | [`schedules.py:361`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L361) | aux loss 反向比例 loss_scale·CP/m |
#
# <details><summary>其余 18 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`mappings.py::all_to_all`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L558) | 带反向的 `all_to_all_single`（反向对调两组 split） |
# | [`experts.py::SequentialMLP`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/experts.py#L1260) | 每个本地 expert 一个 `MLP`，逐个算 |
# | [`moe_layer.py::MoELayer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L213) | 组装 router、dispatcher、experts |
# | [`moe_layer.py::BaseMoELayer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L160) | 按 EP 坐标算 `local_expert_indices` |
# | [`router.py::TopKRouter`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L141) | 路由器 |
# | [`router.py::TopKRouter._apply_aux_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L407) | load balancing loss，在 `tp_cp` 群里数 token |
# | [`router.py::TopKRouter.attach_and_log_load_balancing_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L550) | 记进指标 tracker，再用 `MoEAuxLossAutoScaler` 挂上 |
# | [`moe_utils.py::topk_routing_with_score_function`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L710) | top-k 与 score function |
# | [`moe_utils.py::switch_load_balancing_loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L56) | Switch Transformer 的 aux loss |
# | [`moe_utils.py::permute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L337) / [`moe_utils.py::unpermute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L470) | 按 expert 排好 / 加回原位置 |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L372) | all-to-all dispatcher |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L913) | 在旁路 stream 上把 split sizes 拷回主机、在同步点等它 |
# | [`token_dispatcher.py::MoEAllGatherTokenDispatcher`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L230) | allgather dispatcher |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | `num_experts` 不为空时 MLP 槽位是 MoE 的构造器 |
# | [`parallel_state.py::get_expert_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2237) | EP 群 |
# | [`parallel_state.py::get_expert_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2382) | 持有同一组 expert 的 rank |
# | [`distributed_data_parallel.py:212`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L212) | 缺省分支：两组 buffer 都乘 1/(DP·CP) |
# | [`schedules.py:358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L358) | 开 `calculate_per_token_loss` 时 aux loss 的比例就是 loss_scale |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `TransformerLayer` 的 MLP 槽位建出 `MoELayer`；它的 forward 依次调 router、dispatcher 的三段（preprocess / dispatch /
# postprocess）、experts，再把 dispatcher 的三段倒着走一遍。通信只在 dispatcher 里（EP 群），外加 router 在 `tp_cp` 群里数 token。
#
# <details><summary>完整调用链</summary>
#
# ```text
# TransformerLayer.__init__ → submodules.mlp(config=…)（local spec 在 num_experts 不为空时是 partial(MoELayer, …)）
# TransformerLayer.forward → self.mlp
# megatron/core/transformer/moe/moe_layer.py::MoELayer.forward
# ├─ route → router.py::TopKRouter.forward
# │  ├─ Router.gating → moe_utils.py::router_gating_linear           # logits [T, E]（无 TE：torch.mm）
# │  └─ TopKRouter.routing
# │     ├─ moe_utils.py::topk_routing_with_score_function            # probs [T, E]、routing_map [T, E] bool
# │     └─ TopKRouter._apply_aux_loss
# │        ├─ moe_utils.py::get_tokens_per_expert_and_token_count    # all-reduce 在 tp_cp 群（此处 1 个 rank，不发）
# │        ├─ moe_utils.py::switch_load_balancing_loss_func
# │        └─ attach_and_log_load_balancing_loss → MoEAuxLossAutoScaler.apply(probs, aux_loss)
# ├─ preprocess → MoEAlltoAllTokenDispatcher.dispatch_preprocess
# │  ├─ MoEAlltoAllTokenDispatcher.preprocess                         # all-gather 每 expert 的 token 数（tp_ep 群）
# │  ├─ _maybe_dtoh_and_synchronize("before_permutation_1")          # split sizes 开始拷回主机
# │  └─ moe_utils.py::permute                                          # [T, H] → [T·k, H]，按 expert 排好
# ├─ dispatch → token_dispatch                                         # 在同步点等拷贝完；all-to-all ×2（token、probs），ep 群
# ├─ routed_experts_compute
# │  ├─ dispatch_postprocess → sort_chunks_by_idxs                     # 按本地 expert 重排
# │  ├─ experts.py::SequentialMLP.forward                              # 本地 expert 逐个算，probs 乘在 fc2 之前
# │  └─ combine_preprocess → sort_chunks_by_idxs                       # 排回"来源 rank"顺序
# ├─ combine → token_combine                                           # all-to-all，ep 群（dispatch 的逆）
# └─ postprocess → combine_postprocess → moe_utils.py::unpermute        # [T·k, H] → [T, H]，k 份结果相加
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `MoELayer.__init__` | config、`MoESubmodules`（`experts`、`shared_experts`、`router` 三个构造器）、`pg_collection` | 模块 | `router`（缺省 `TopKRouter`）、dispatcher、`experts`（local spec：`SequentialMLP`） | 读 EP 坐标定本地 expert | 是：expert 按 EP 分 | 建参数 | 构造模型 |
# | `TopKRouter.forward` | hidden `[S, B, H]` | `probs`、`routing_map` `[S·B, E]` | `router_gating_linear`、`topk_routing_with_score_function`、aux loss 函数 | aux loss 在 `tp_cp` 群数 token | 否 | 否（aux loss 只进日志 tracker） | forward |
# | `dispatch_preprocess` | hidden、`routing_map`、`probs` | permute 后的 `[T·k, H]`、probs `[T·k]` | `preprocess`、`permute` | 是：all-gather token 计数（`tp_ep`） | 否 | 否 | forward |
# | `token_dispatch` | 上一行的输出 | 送到本 rank 的 token `[N, H]`、probs `[N]` | `all_to_all` | **是**：ep 群 all-to-all ×2 | 是：token 按 expert 分到 rank | 否 | forward |
# | `dispatch_postprocess` | 上一行的输出 | 按本地 expert 排好的 token、`tokens_per_expert` | `sort_chunks_by_idxs` | 否（ETP > 1 时 all-gather） | 否 | 否 | forward |
# | `SequentialMLP.forward` | token、`tokens_per_expert`、probs | 同形状输出 | 每个本地 expert 一个 `MLP` | 否 | 否 | 否 | forward |
# | `combine_preprocess` / `token_combine` / `combine_postprocess` | expert 输出 | `[S, B, H]` | `sort_chunks_by_idxs`、`all_to_all`、`unpermute` | **是**：ep 群 all-to-all | 是：token 送回来源 rank | 否 | forward |
# | `MoEAllGatherTokenDispatcher.token_dispatch` / `token_combine` | 同上 | 同上 | `gather_from_sequence_parallel_region`、`reduce_scatter_to_sequence_parallel_region` | **是**：`tp_ep` 群 all-gather / reduce-scatter | 是 | 否 | forward |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `MoELayer`：一步一步调
#
# local spec 的 MLP 槽位在 `num_experts` 不为空时建出 `MoELayer`：router 是 `TopKRouter`（权重 `[E, H] = [4, 8]`），
# dispatcher 由 `moe_token_dispatcher_type` 选，experts 是 `SequentialMLP`（每个本地 expert 一个普通的 `MLP`，
# fc1 `[16, 8]`、fc2 `[8, 16]`）。`MoELayer.forward`
# （[`moe_layer.py:607`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L607)）
# 只是依次调几个公开方法，所以可以一步一步调、看每步之后的形状。EP=2 的两个 rank 上，rank 0 持有 expert 0、1，
# rank 1 持有 expert 2、3，权重取自 EP=1 的参考层：

# %%
def four_steps(dims, state):
    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    layer = build_moe_layer(dims, ep=2)                  # spec 的 MLP 槽位：MoELayer(config, submodules=…)
    layer.load_state_dict(local_expert_state(state, layer.local_expert_indices))
    x, _ = micro_batch(dims, dist.get_rank())            # [6, 1, 8]
    probs, routing_map = layer.route(x)                  # TopKRouter
    steps = [("route", probs.shape)]
    hidden, probs = layer.preprocess(x, probs, routing_map)  # 交换计数、permute
    steps.append(("preprocess", hidden.shape))
    hidden, probs = layer.dispatch(hidden, probs)        # all-to-all
    steps.append(("dispatch", hidden.shape))
    output, _ = layer.routed_experts_compute(hidden, probs)  # 重排、SequentialMLP、排回
    steps.append(("routed_experts_compute", output.shape))
    output = layer.combine(output)                       # all-to-all 回来源 rank
    steps.append(("combine", output.shape))
    y = layer.postprocess(output, None)                  # unpermute：k 份相加
    steps.append(("postprocess", y.shape))
    parts = [type(m).__name__ for m in (layer, layer.router, layer.token_dispatcher, layer.experts)]
    return parts, steps, torch.equal(y, layer(x)[0])


runs = run_ranks(four_steps, 2, TINY, ref["state"], grid=dict(ep=2))
print(" / ".join(runs[0][0]), "| 与 layer(x) 逐位相同:", [r[2] for r in runs])
Table(["MoELayer 的方法", "rank 0 之后", "rank 1 之后"],
      [[name, list(a), list(b)] for (name, a), (_, b) in zip(runs[0][1], runs[1][1])])

# %% [markdown]
# - **route**：`probs`、`routing_map` 都是 `[T, E] = [6, 4]`，每行 2 个非零（top-2）。
# - **preprocess**：`T·k = 12` 个 (token, expert) 对按 expert 编号排好；expert 按 EP rank 连续编号，所以也按目标 rank
#   排好了，all-to-all 要的正是"发往同一个 rank 的数据连续存放"。
# - **dispatch**：rank 0 收进 13 行、rank 1 收进 11 行，多少取决于路由，不是常数。
# - **routed_experts_compute**：收到的行按来源 rank 分段，先按本地 expert 重排（`sort_chunks_by_idxs`），`SequentialMLP`
#   逐个 expert 算完再排回。
# - **combine / postprocess**：dispatch 的逆，行回到来源 rank（12 行），`unpermute` 把同一个 token 的 2 份输出
#   （已乘过 `probs`）加回原位。六步串起来逐位等于 `layer(x)`。
#
# ### `TopKRouter`：logits → `probs`、`routing_map`
#
# 缺省配置（`score_function="softmax"`、不 pre-softmax）下 router 做三件事：logits = `x Wᵀ`；每个 token 取 logits
# 最大的 k 个 expert；**只对这 k 个** logits 做 softmax 得到权重。下面直接调 router 用的两个函数，与参考层里
# `TopKRouter` 真正返回的（hook 截下的）比较，再与手算比较：

# %%
x0 = micro_batch(TINY, 0)[0].detach().view(-1, 8)                 # 第 0 个 micro-batch 的 6 个 token
logits = router_gating_linear(x0, ref["state"]["router.weight"], None, torch.float32)   # [6, 4]
probs, routing_map = topk_routing_with_score_function(logits, topk=2, score_function="softmax")
seen = ref["seen"][0]                                             # 层里 TopKRouter 的输出
top_logits, top_experts = logits.topk(2, dim=-1)
by_hand = torch.zeros_like(logits).scatter(1, top_experts, torch.softmax(top_logits, dim=-1))
print("与层里的相同:", torch.allclose(probs, seen["probs"]), torch.equal(routing_map, seen["routing_map"]),
      " 与手算相同:", torch.allclose(probs, by_hand, atol=1e-6))
Table(["token", "logits", "top-2 expert", "probs"],
      [[t, [round(v, 4) for v in logits[t].tolist()], top_experts[t].tolist(), [round(v, 4) for v in probs[t].tolist()]]
       for t in range(6)])

# %% [markdown]
# **aux loss。** 训练时 router 还算 Switch Transformer 的 load balancing loss：
# `aux = coeff · E / (k·T²) · Σ_i (Σ_t s_{t,i}) · c_i`，`s` 是对**全部** E 个 logits 的 softmax，`c_i` 是选中 expert `i`
# 的 token 数。expert 分到的 token 越均匀、概率越分散，它越小（完全均匀时除以 coeff 等于 1）。它不加进 loss，而是由
# `MoEAuxLossAutoScaler` 挂在 `probs` 上：前向原样返回 `probs`，反向时顺手给 aux loss 一个梯度（比例见机制解释）。
# Megatron 把 `aux / coeff` 记进 MoE 指标 tracker，下面的"层里记下的"就是从那里读回的：

# %%
aux_map, scores = compute_routing_scores_for_aux_loss(logits, topk=2, score_function="softmax")
counts = aux_map.sum(dim=0)
aux = switch_load_balancing_loss_func(probs=scores, tokens_per_expert=counts, total_num_tokens=6, topk=2,
                                      num_experts=4, moe_aux_loss_coeff=1.0)
E, k, T = 4, 2, 6
print("每个 expert 选中的 token 数:", counts.tolist())
print("手算:", round((E / (k * T * T) * (scores.sum(dim=0) * counts).sum()).item(), 4),
      " switch_load_balancing_loss_func:", round(aux.item(), 4), " 层里记下的:", round(ref["aux"][0], 4))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### EP 群：同一批 rank 的第二种分法
#
# 4 个 rank、`expert_model_parallel_size=2`，每个 rank 处理自己那个 DP rank 的 micro-batch：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
rank_table([r["rank"] for r in ep_run], kinds=("dp", "ep", "edp", "etp-ep"))

# %% [markdown]
# EP 不占额外的卡：4 个 rank 都是 DP（`dp` 群 `[0, 1, 2, 3]`），expert 网格把它们重新看成 `ETP(1) × EP(2) × EDP(2)`
# （[笔记 08](../08_parallel_state_and_rank_generator/)）。`ep` 群 `[0, 1]`、`[2, 3]` 在群内交换 token；`edp` 群 `[0, 2]`、`[1, 3]`
# 持有**同一组** expert；`etp-ep` 群在 ETP=1 时与 `ep` 群相同，dispatcher 用它交换计数。
#
# ### 每个 rank 的 token 流向

# %% tags=["hide-input"] jupyter={"source_hidden": true}
flow

# %% [markdown]
# `routing_map.sum(0)` 是本 rank 的 token 选中每个 expert 的次数。按 expert 所在的 EP rank 两两相加就是 `input_splits`
# （发往每个 EP rank 的行数）；交换计数后得到 `output_splits`（从每个 EP rank 收到的行数）。rank 0 的 expert 0、1
# 收到自己的 6 行和 rank 1 的 7 行，共 13 行。
#
# ### alltoall dispatcher 的全部通信（rank 0）

# %% tags=["hide-input"] jupyter={"source_hidden": true}
dispatch_table(ep_run[0]["alltoall"]["calls"], alltoall_meaning)

# %% [markdown]
# 前向 1 次 all-gather + 3 次 all-to-all，反向 3 次 all-to-all，全在 2 个 rank 的群里。每次 all-to-all 都带着两组 split
# sizes，反向把两组对调（`mappings.all_to_all` 的 backward）：dispatch 的 `[6, 6] → [6, 7]` 在反向里变成
# `[6, 7] → [6, 6]`（第 6、7 行），combine 正好相反（第 4、5 行）。`probs` 也要 all-to-all：`SequentialMLP` 把它乘在
# 激活之后、`linear_fc2` 之前（`MLP.forward` 的 `per_token_scale`），所以它得和 token 一起到 expert 那边，
# 它的梯度再由第 6 行送回来源 rank、流进 router。
#
# ### EP=2 等于 EP=1
#
# 两种 dispatcher 下每个 rank 的输出都等于 EP=1 处理同一个 micro-batch 的输出，aux loss 也相同（rank 0–3 依次
# 1.0058、1.008、1.0038、1.0071）；梯度在各自的群里求和后也都等于 EP=1 的（表折叠在下面，群的道理见机制解释）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def summed_grad(run, rank, name, group):
    return sum(run[m]["alltoall"]["grads"][name] for m in group)


def global_name(name, local_experts):
    if not name.startswith("experts."):
        return name
    _, _, i, rest = name.split(".", 3)
    return f"experts.local_experts.{local_experts[int(i)]}.{rest}"


def short(name):  # experts.local_experts.0.linear_fc1.weight -> local_experts.0.linear_fc1
    return name.removeprefix("experts.").removesuffix(".weight")


rows = []
for rank in (0, 1):
    r = ep_run[rank]["alltoall"]
    for name in r["grads"]:
        group = ep_run[rank]["rank"]["groups"]["dp-cp" if r["allreduce"][name] else "edp"]
        reference_grad = ref["grads"][global_name(name, r["local_experts"])]
        rows.append([rank, short(name), short(global_name(name, r["local_experts"])),
                     r["allreduce"][name], group,
                     torch.allclose(summed_grad(ep_run, rank, name, group), reference_grad,
                                    atol=1e-6)])
display(Folded("输出与 aux loss：EP=2 的每个 rank 对 EP=1（两种 dispatcher）",
               Table(["dispatcher", "rank", "输出 = EP=1", "aux / coeff", "EP=1 的"],
                     [[d, i, torch.allclose(r[d]["output"], ref["outputs"][i], atol=1e-6),
                       round(r[d]["aux"], 4), round(ref["aux"][i], 4)]
                      for d in ("alltoall", "allgather") for i, r in enumerate(ep_run)],
                     title=" / ".join(ep_run[0][d]["dispatcher"] for d in ("alltoall", "allgather")))))
Folded("梯度：在各自的群里求和后等于 EP=1（rank 0、1；rank 2、3 与它们对称）",
       Table(["rank", "本地参数（略去 .weight）", "EP=1 里的名字", "allreduce", "在这个群求和", "= EP=1 的梯度"], rows))

# %% [markdown]
# ### allgather dispatcher：换了什么
#
# `moe_token_dispatcher_type="allgather"`（这也是 `TransformerConfig` 的缺省值，
# [`transformer_config.py:862`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L862)）
# 时不交换计数、不做 all-to-all：把 `tp_ep` 群里**所有** token、它们的 `routing_map` 和 `probs` 都 all-gather 到每个
# rank，每个 rank 挑出选了本地 expert 的行，算完用 reduce-scatter 把结果加回并切回各自的 token。rank 0 的记录：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
gathered

# %% [markdown]
# 每个本地 expert 收到的行与 alltoall 时相同（下表）。差别在搬运量：allgather 让每个 rank 收下 EP 群全部 `T·EP`
# 个 token，alltoall 只搬被选中的 (token, expert) 对，平均每个 rank `T·k` 行（自测 4）。EP 大、k 小时 all-to-all 划算；
# all-gather 胜在简单，不用交换计数、等主机。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
tokens

# %% [markdown]
# ## 机制解释
#
# ### split sizes 为什么要先到主机
#
# `all_to_all_single` 的输出缓冲按 `sum(output_splits)` 分配，collective 也要知道每段多长：这些是主机上的决定，
# 而计数是 GPU 上 `routing_map` 算出来的。dispatcher 在 `dispatch_preprocess` 里（`before_permutation_1`）就在一条旁路
# stream 上把计数异步拷回主机，主机只在**最早一处真正要用这些值**的地方等它：`preprocess` 每遇到一处需要主机值的
# 地方就调一次 `_maybe_update_cuda_sync_point`，它只在新的点比当前的点**更早**时才替换
# （[`token_dispatcher.py:907-911`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L907-L911)；
# 优先级表在 [`token_dispatcher.py:455`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L455)）。
# 直接调 dispatcher 的 `preprocess`：

# %%
def splits(dims, state, ep):
    parallel_state.initialize_model_parallel(expert_model_parallel_size=ep)
    layer = build_moe_layer(dims, ep=ep)
    layer.load_state_dict(local_expert_state(state, layer.local_expert_indices))
    probs, routing_map = layer.router(micro_batch(dims, dist.get_rank())[0])
    dispatcher = layer.token_dispatcher                  # MoEAlltoAllTokenDispatcher
    per_local_expert = dispatcher.preprocess(routing_map)
    def as_list(v):
        return None if v is None else [int(n) for n in v]

    return [ep, dist.get_rank(), as_list(dispatcher.input_splits), as_list(dispatcher.output_splits),
            per_local_expert.tolist(), dispatcher.cuda_dtoh_point, dispatcher.cuda_sync_point]


Table(["EP", "rank", "input_splits", "output_splits", "本地 expert 各收到", "开始拷回", "主机在这里等"],
      run_ranks(splits, 2, TINY, ref["state"], 2, grid=dict(ep=2)) + run_ranks(splits, 1, TINY, ref["state"], 1))

# %% [markdown]
# EP=2 时最早要用的是 all-to-all 的两组 split（[`token_dispatcher.py:590`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L590)，
# 优先级 1），之后第二次重排要的计数（优先级 2）不再改动它；EP=1 没有 all-to-all，最早的是第二次重排
# （[`token_dispatcher.py:610`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L610)）。
# 拷贝早早开始、主机等得越晚，越能和计算重叠，但不能晚于第一次用到。dropless 时 permute 的输出是定值 `T·k` 行，
# 不必等；开 capacity factor 才要在 `before_permutation_1` 就等。
#
# ### aux loss：局部计数，反向比例由 schedule 设
#
# `_apply_aux_loss` 只在 `tp_cp` 群里合并 token 计数（[router.py 第 422 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L422)）：
# 只有同一条序列被 TP / CP 切开的 rank 才合起来数，EP 和 DP 的 rank 各算各的，所以 EP=2 每个 rank 的 aux loss
# 与 EP=1 处理同一个 micro-batch 时相同。想在整个 global batch 上均衡用 `global_aux_loss`（在 `tp_dp_cp` 群里累计）。
#
# aux loss 搭在 `probs` 的反向上，不经过主 loss，所以 schedule 在每个 micro-batch 的 loss 算完后另外给
# `MoEAuxLossAutoScaler` 设一个比例，让它与主 loss 的缩放一致。直接调 `forward_step_calc_loss`（CP=2、m=4、loss_func
# 返回 loss 之和、token 数、日志三项），看它设了什么：

# %%
def aux_scale(per_token_loss):
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, num_moe_experts=4,
                               calculate_per_token_loss=per_token_loss)
    def loss_func(loss):  # 三项：loss 之和、token 数、日志
        return loss, torch.tensor(6), {"lm loss": loss.detach().clone()}

    loss, _ = forward_step_calc_loss(None, torch.tensor(12.0), loss_func, config, None, False,
                                     num_microbatches=4, forward_data_store=[], cp_group_size=2, is_last_stage=True)
    return round(loss.item(), 4), round(MoEAuxLossAutoScaler.main_loss_backward_scale.item(), 4)


Table(["calculate_per_token_loss", "返回的主 loss（6 个 token 的 loss 之和 12.0）", "aux loss 的反向比例"],
      [[flag, *aux_scale(flag)] for flag in (False, True)])

# %% [markdown]
# - **不开 per-token loss**：比例是 loss_scale·CP/m（[`schedules.py:361`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L361)），
#   loss_scale 在没有 `grad_scale_func`（混合精度的 loss scaler）时是 1，所以这里是 2/4 = 0.5；router 挂上的就是 aux 本身
#   （[`router.py:636`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L636)），DDP 再像主 loss 一样把梯度乘 1/(DP·CP)。
# - **开了**：主 loss 不再除以 token 数和 m，比例就是 loss_scale（[`schedules.py:358`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L358)）。
#   router 改挂 aux × 本 rank 的 token 数 × `tp_cp` 群大小（[`router.py:632-633`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L632-L633)），
#   `finalize_model_grads` 最后把所有梯度除以全局 token 数（[`finalize_model_grads.py:689-696`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L689-L696)），
#   两个因子相消，aux loss 的梯度净比例仍是 1/(m·DP)，与不开时一样。
#
# ### 梯度归约的两套群
#
# 稠密参数（router、attention）每个 rank 都有副本，梯度在 `dp-cp` 群求和；expert 参数只在 `edp` 群的 rank 上有副本，
# 而它的本地梯度已经含有 EP 群里所有 rank 送来的 token 的贡献（反向的 all-to-all 把它们送了回来）。DDP 按参数的
# `allreduce` 标记（expert 为 False）分两组 buffer，各自在自己的群里归约。把 EP=2 的层包进 `DistributedDataParallel`，读两组 buffer：

# %%
def buffer_scales(average_in_collective):
    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    layer = build_moe_layer(TINY, ep=2)
    ddp = DistributedDataParallel(layer.config, DistributedDataParallelConfig(average_in_collective=average_in_collective),
                                  layer)
    return [[average_in_collective, kind, buffer.data_parallel_group.size(), buffer.gradient_scaling_factor]
            for kind, buffers in (("稠密", ddp.buffers), ("expert", ddp.expert_parallel_buffers)) for buffer in buffers]


Table(["average_in_collective", "buffer", "归约群大小", "gradient_scaling_factor"],
      run_ranks(buffer_scales, 4, False, grid=dict(ep=2))[0] + run_ranks(buffer_scales, 4, True, grid=dict(ep=2))[0])

# %% [markdown]
# 目标都是"除以 DP×CP 个副本"。缺省先把两组都乘 1/(DP·CP) = 0.25 再求和
# （[`distributed_data_parallel.py:212-213`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L212-L213)）；
# `average_in_collective` 时 collective 自己做平均，稠密组除以群大小 4 就对了，expert 组的群只有 edp = 2 个 rank，
# 于是先乘 edp/DP = 0.5（[`distributed_data_parallel.py:208`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L208)），
# 0.5 × 1/2 = 1/4。开 `calculate_per_token_loss` 时两组都是 1，由 `finalize_model_grads` 按 token 数归一。

# %% [markdown]
# ## 与训练主链路的关系
#
# MoE 只替换 `TransformerLayer` 的 MLP 槽位（[笔记 11](../11_transformer_layer/)），attention、loss、pipeline 不变；
# forward 多出 EP 群的 all-to-all，backward 多出它们的逆。aux loss 的日志由训练循环每步末尾从 tracker 取（[training.py 第 2782 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2782)）。
# DDP 把 expert 参数放进 `edp` 群的 buffer（[笔记 14](../14_data_parallel_ddp/)），分布式优化器也按 `edp` 切 expert 的状态
# （[笔记 15](../15_distributed_optimizer/)）；checkpoint 里本地 expert 映射回全局编号（`SequentialMLP.sharded_state_dict`），换 EP 大小后仍能加载。

# %% [markdown]
# ## 与基础知识的连接
#
# - **条件计算**：参数量随 expert 数增长，每个 token 的计算量只随 k 增长；代价是负载可能不均：aux loss 是软约束，
#   capacity factor（`moe_expert_capacity_factor`，丢弃超额 token）是硬约束，本篇是 dropless。
# - **all-to-all = 转置**：每个 rank"按目标分好段"的数据是 EP×EP 分块矩阵的一行，all-to-all 把它转置；段长不等时要 split sizes。
# - **EP 与 DP**：EP 折叠在 DP 里，等于"同一批 DP rank 分着存 expert"；EP 越大，每个 expert 的副本（`edp`）越少。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **`MoELayer(layer_number=1)` 不会告诉 router。** 构造函数只存在自己身上，router 的要等 `TransformerLayer` 调
#    `set_layer_number` 才设（[transformer_layer.py 第 438 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L438)）。
#    单独用 `MoELayer` 时 router 的 `layer_number` 是 `None`，aux loss 交给指标 tracker 时被直接丢掉
#    （[moe_logging.py 第 118 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_logging.py#L118)）：
#    照常进梯度，却不进日志（下面的运行：`logged` 为空）。
# 2. **反向的 all-to-all 次数取决于输入要不要梯度。** 真实模型里 MoE 的输入要梯度；若 `x` 不要，autograd 跳过 token
#    那次 all-to-all 的反向，只剩 2 次（下面的运行）。数通信次数要用真实的条件。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def quirks():
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    layer = build_moe_layer(TINY, ep=2, tell_router=False)  # MoELayer(..., layer_number=1) only
    x, upstream = micro_batch(TINY, dist.get_rank())
    with record() as calls:
        y, _ = layer(x.detach())  # an input that does not need a gradient
        (y * upstream).sum().backward()
    return dict(moe_layer_number=layer.layer_number, router_layer_number=layer.router.layer_number,
                logged=sorted(get_moe_metrics_tracker().metrics),
                backward_all_to_all=sum(c.phase == "backward" and c.api == "all_to_all_single"
                                        for c in calls))


print(run_ranks(quirks, 2, grid=dict(ep=2))[0])

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **Transformer Engine 提供而这里缺的东西**：router 的 GEMM（`te_general_gemm`）、融合的 permute / unpermute
#   （`moe_permute_fusion`）、融合的 top-k 与 aux loss（`moe_router_fusion`）、grouped GEMM 的 `TEGroupedMLP`、
#   DeepEP / HybridEP 的 `MoEFlexTokenDispatcher`。本篇走的全是纯 torch 分支：`SequentialMLP` 逐个 expert 做矩阵乘。
# - **两个补丁**（[在 CPU 上运行](../../cpu/)，各有测试）：`moe_dispatcher_streams`——dispatcher 构造时建 CUDA stream
#   （[token_dispatcher.py 第 469 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L469)）；
#   `moe_host_split_sizes`——`maybe_move_tensor_to_cpu` 只转换 CUDA 张量（[moe_utils.py 第 1184 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L1184)），
#   CPU 上 split sizes 留成 torch 张量，`all_to_all_single` 拒收。两者都不改变计算：EP=2 与 EP=1 逐项相等就是证据；
#   上面"主机在这里等"一列是 dispatcher 自己在 `preprocess` 里选的，与设备无关。
# - core_v0.16.1 时还要第三个补丁 `moe_te_general_gemm`，0.19.0 用不着：router 的 gating GEMM 先判断
#   `te_general_gemm is not None`（[moe_utils.py 第 1326 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L1326)），
#   而 `moe_utils` 在没有 TE 的分支里把这个名字设成 `None`（[moe_utils.py 第 41 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L41)），直接走 `torch.mm`。
# - `TransformerConfig` 的缺省值 `cuda_graph_modules="full"`（[transformer_config.py 第 1047 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)）
#   触发它自己的弃用警告（[transformer_config.py 第 2415 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)），
#   每次构造打印一次；local spec 在没有 Apex 时也警告一次。两条都只是提示，导入 `snippets` 时统一滤掉。
# - `forward_step_calc_loss` 和 router 的两个函数在 notebook 进程里直接调用，不需要进程组；其余运行用 2 / 4 个 gloo 进程。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. 4 个 rank、4 个 expert、EP=2：rank 3 持有哪几个 expert？还有哪个 rank 持有同样的 expert？**
#
# <details><summary>答案</summary>
#
# EP 坐标 = 3 mod 2 = 1，本地 expert 是 `[2, 3]`。`edp` 群 `[1, 3]`：rank 1 持有同样的 expert，两者的 expert 梯度要在这个群里求和。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
r3, r1 = ep_run[3], ep_run[1]
print(r3["alltoall"]["local_experts"], r3["rank"]["groups"]["edp"], r1["alltoall"]["local_experts"])

# %% [markdown]
# **2. rank 1 的 `input_splits` 是怎么从 `routing_map` 得到的？**
#
# <details><summary>答案</summary>
#
# `routing_map.sum(0)` 是 rank 1 的 token 选中 expert 0–3 的次数 `[5, 2, 4, 1]`；expert 0、1 在 EP rank 0，
# expert 2、3 在 EP rank 1，按 EP rank 两两相加得 `[7, 5]`，合计 12 = 6 个 token × top-2。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
per_expert = ep_run[1]["alltoall"]["seen"]["routing_map"].sum(dim=0)
print(per_expert.tolist(), per_expert.view(2, 2).sum(dim=1).tolist(),
      ep_run[1]["alltoall"]["seen"]["input_splits"])

# %% [markdown]
# **3. rank 0 的 combine all-to-all 之后为什么又回到 12 行？12 行怎样变回 6 个 token？**
#
# <details><summary>答案</summary>
#
# combine 是 dispatch 的逆：两组 split sizes 对调，每个 (token, expert) 对的输出回到它的来源 rank，共 T·k = 12 行。
# `unpermute` 把属于同一个 token 的 k = 2 行（已乘过 probs）加到这个 token 的位置上，得到 `[6, 1, 8]`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
combine = [c for c in ep_run[0]["alltoall"]["calls"]
           if c.phase == "forward" and c.api == "all_to_all_single"][-1]
print(combine.before, "→", combine.after, combine.extra)
print("层输出:", list(ep_run[0]["alltoall"]["output"].shape))

# %% [markdown]
# **4. allgather dispatcher 下，rank 0 在 dispatch 之后手里有多少行 hidden？其中多少行真正进了本地 expert？alltoall 呢？**
#
# <details><summary>答案</summary>
#
# allgather：all-gather 之后是 EP 群的全部 12 个 token `[12, 8]`，本地两个 expert 从中挑出 13 个 (token, expert) 对（8 + 5）。
# alltoall：收到的正好是这 13 行 `[13, 8]`。一般地，allgather 让每个 rank 收 `T·EP` 行，alltoall 平均收 `T·k` 行，
# 比值 `EP / k`：这里 EP = k = 2，两者差不多；EP = 64、k = 8 时 allgather 多搬 8 倍。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for d, api in (("alltoall", "all_to_all_single"), ("allgather", "all_gather_into_tensor")):
    dispatched = next(c.after for c in ep_run[0][d]["calls"]
                      if c.phase == "forward" and c.api == api and c.after.endswith(", 8]"))
    print(d, "dispatch 之后:", dispatched,
          " 进入本地 expert 的行数:", ep_run[0][d]["seen"]["expert_rows"])

# %% [markdown]
# **5. EP 从 1 变成 2，每个 micro-batch 的 aux loss 会变吗？**
#
# <details><summary>答案</summary>
#
# 不变。aux loss 只在 `tp_cp` 群里合并 token 计数，EP 群不参与；EP=2 时每个 rank 的 aux loss 与 EP=1 处理同一个 micro-batch 时相同。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([round(r["alltoall"]["aux"], 4) for r in ep_run], [round(a, 4) for a in ref["aux"]])

# %% [markdown]
# ## 30-second answer
#
# An MoE layer replaces the MLP with E experts and a `TopKRouter`: logits pick each token's top-k
# experts, softmax over those k gives the weights, and a Switch-style aux loss rides on the router's
# backward. With expert parallelism the experts are split across the EP group, which folds into data
# parallelism. The all-to-all dispatcher permutes tokens by expert, exchanges counts, all-to-alls tokens
# and probs, runs local experts, and reverses it. Router gradients reduce over DP×CP, expert gradients
# over expert-DP.
