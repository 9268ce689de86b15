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
# 第二轮第 10 篇。MoE 层把一层 MLP 换成若干个 expert 和一个 router：每个 token 只走 top-k 个 expert。
# expert parallel（EP）再把 expert 分到不同的 rank 上，token 要被送到它选中的 expert 所在的 rank，算完再送回来。
# 本篇在 gloo rank 上跑**真实的** `MoELayer`（local spec 的 `TopKRouter` + `MoEAlltoAllTokenDispatcher` +
# `SequentialMLP`）：先在一个进程里以 EP=1 跑出参考答案，再在 4 个 rank 上以 EP=2 跑同一组 expert，
# 逐项比较输出、aux loss 和梯度，并记录每一次 all-to-all 及其 split sizes；最后换成 allgather dispatcher 对照。

# %% [markdown]
# ## 阅读目标
#
# 1. `MoELayer.forward` 的四步：route → dispatch → experts → combine，每一步的 tensor 形状。
# 2. `TopKRouter`：logits 怎么变成 `probs` 和 `routing_map`，aux loss 怎么算、怎么"挂"到梯度上。
# 3. `MoEAlltoAllTokenDispatcher`：permute → all-to-all → 按本地 expert 排序 → experts → 逆序还原；split sizes 从哪来。
# 4. EP 群从 rank 网格哪里来（expert 网格，EP 折叠进 DP），router 与 expert 的梯度各在哪个群里归约。
# 5. allgather dispatcher 换掉了哪些通信；在 CPU 上跑 MoE 缺了 Transformer Engine 的什么。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`moe_layer.py::MoELayer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L213) | 组装 router、dispatcher、experts |
# | [`moe_layer.py::BaseMoELayer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L160) | 按 EP 坐标算 `local_expert_indices` |
# | [`moe_layer.py::MoELayer.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L607) | route → dispatch → experts → combine |
# | [`router.py::TopKRouter`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L141) | 路由；`routing` 在 [`TopKRouter.routing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L741) |
# | [`router.py::TopKRouter._apply_aux_loss`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L407) | load balancing loss，在 `tp_cp` 群里数 token |
# | [`moe_utils.py::topk_routing_with_score_function`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L710) | top-k 与 score function |
# | [`moe_utils.py::switch_load_balancing_loss_func`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L56) | Switch Transformer 的 aux loss |
# | [`moe_utils.py::MoEAuxLossAutoScaler`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L284) | 前向原样返回，反向给 aux loss 一个梯度 |
# | [`moe_utils.py::permute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L337) / [`moe_utils.py::unpermute`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L470) | 按 expert 排好 / 加回原位置 |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L372) | all-to-all dispatcher |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher.preprocess`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L495) | 算 `input_splits`、`output_splits` |
# | [`token_dispatcher.py::MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L913) | 把 split sizes 拷回主机 |
# | [`token_dispatcher.py::MoEAllGatherTokenDispatcher`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L230) | allgather dispatcher |
# | [`mappings.py::all_to_all`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/mappings.py#L558) | 带反向的 `all_to_all_single`（反向交换两组 split sizes） |
# | [`experts.py::SequentialMLP`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/experts.py#L1260) | 每个本地 expert 一个 `MLP`，逐个算 |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | `num_experts` 不为空时 MLP 槽位是 MoE 的构造器 |
# | [`moe_module_specs.py:87`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/moe_module_specs.py#L87) | 这个构造器：`partial(MoELayer, submodules=MoESubmodules(...))` |
# | [`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431) | `TransformerLayer` 用 config 调用 MLP 槽位的构造器，建出 `MoELayer` |
# | [`parallel_state.py::get_expert_model_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2237) | EP 群 |
# | [`parallel_state.py::get_expert_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L2382) | 持有同一组 expert 的 rank |
# | [`distributed_data_parallel.py:213`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L213) | expert 梯度的缩放：缺省分支是 1/(DP×CP)；`average_in_collective` 时见 [`distributed_data_parallel.py:208`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L208) |
# | [`schedules.py:361`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L361) | 给 aux loss 的反向设缩放 |

# %% [markdown]
# ## 调用链
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
# │        └─ MoEAuxLossAutoScaler.apply(probs, aux_loss)             # aux loss 挂到 probs 的反向上
# ├─ preprocess → MoEAlltoAllTokenDispatcher.dispatch_preprocess
# │  ├─ MoEAlltoAllTokenDispatcher.preprocess                         # all-gather 每 expert 的 token 数（tp_ep 群）
# │  ├─ _maybe_dtoh_and_synchronize                                   # split sizes → 主机
# │  └─ moe_utils.py::permute                                          # [T, H] → [T·k, H]，按 expert 排好
# ├─ dispatch → token_dispatch                                         # all-to-all ×2（token、probs），ep 群
# ├─ routed_experts_compute
# │  ├─ dispatch_postprocess → sort_chunks_by_idxs                     # 按本地 expert 重排
# │  ├─ experts.py::SequentialMLP.forward                              # 本地 expert 逐个算，probs 乘在 fc2 之前
# │  └─ combine_preprocess → sort_chunks_by_idxs                       # 排回"来源 rank"顺序
# ├─ combine → token_combine                                           # all-to-all，ep 群（dispatch 的逆）
# └─ postprocess → combine_postprocess → moe_utils.py::unpermute        # [T·k, H] → [T, H]，k 份结果相加
# ```
#
# **每个函数的阅读记录：**
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

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n17_moe import (allgather_meaning, alltoall_meaning, build_moe_layer, expert_parallel_step,
                                      flow_table, micro_batch, reference, tokens_table)
from snippets.moe.tables import dispatch_table, local_expert_state, pop_aux_loss, watch
from snippets.ranks.groups import describe_rank, rank_table
from snippets.ranks.launch import run_ranks
from snippets.record.recorder import record
from snippets.moe import pictures
from snippets.record.listing import listing
from snippets.record.tables import Table

import torch
import torch.distributed as dist

# %% [markdown]
# ## 关键对象
#
# ### 一个真实的 `MoELayer`
#
# 4 个 expert、top-2、hidden 8、expert 的 FFN 宽 16。层按 local spec 搭：`get_gpt_layer_local_spec(num_experts=4,
# moe_grouped_gemm=False)` 的 MLP 槽位不是 `ModuleSpec`，而是一个构造器
# `partial(MoELayer, submodules=MoESubmodules(experts=…, shared_experts=…))`（[`moe_module_specs.py:87`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/moe_module_specs.py#L87)）：
# experts 是 `partial(SequentialMLP, …)`（每个 expert 是一个普通的 `MLP`），router 用 `MoESubmodules` 的缺省值 `TopKRouter`。
# `TransformerLayer` 直接拿 config 调用它（[`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431)），
# `build_moe_layer` 照做，只是不建外面那层 `TransformerLayer`。`micro_batch(i)` 给出第 `i` 个数据并行 rank 进入 MoE 层的激活 `[S=6, B=1, H=8]`
# 和反向传回的梯度。Megatron 的 import 写在 rank 函数里（rank 从已经导入过 Megatron 的内核 fork 出来）；
# `snippets.moe.tables` 只挂 hook、读日志、拷权重，不实现 MoE 的任何一步。
#
# 本篇在 rank 上跑的函数都在 `snippets/experiments/n17_moe.py` 里：
# hidden、expert 的 FFN 宽、token 数（`[S, B]`）和数据并行的 micro-batch 个数是参数 `dims`，expert 个数和 top-k 是另两个参数；
# 本篇用 `dims` 的 `tiny`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_moe_layer, micro_batch)

# %%
TINY = EXPERIMENTS["moe"].tiny

# %% [markdown]
# **参考答案：EP=1。** 一个进程持有全部 4 个 expert，依次处理 4 个数据并行 rank 的 micro-batch，梯度累加：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(reference)

# %%
ref = run_ranks(reference, 1, TINY)[0]
print(ref["modules"])
Table(["parameter", "shape"], ref["params"])

# %% [markdown]
# ### `TopKRouter`：从 logits 到 `probs` 与 `routing_map`
#
# router 只有一个权重 `[E, H] = [4, 8]`。缺省配置（`score_function="softmax"`、不 pre-softmax）下它做三件事：
# logits = `x Wᵀ`；每个 token 取 logits 最大的 k 个 expert；只对这 k 个 logits 做 softmax 得到权重。
# 结果摊成 `[T, E]`：`probs` 在未选中的位置为 0，`routing_map` 是同形状的布尔掩码。
# 用 router 的权重在 notebook 里手算第 0 个 micro-batch，与 hook 截下的 Megatron 输出比较：

# %%
router_weight = ref["state"]["router.weight"]
x0 = micro_batch(TINY, 0)[0].detach().view(-1, 8)
logits = x0 @ router_weight.T
top_logits, top_experts = logits.topk(2, dim=-1)
by_hand = torch.zeros_like(logits).scatter(1, top_experts, torch.softmax(top_logits, dim=-1))
megatron = ref["seen"][0]
print("probs 相同:", torch.allclose(by_hand, megatron["probs"], atol=1e-6),
      " routing_map 相同:", torch.equal(by_hand > 0, megatron["routing_map"]))
Table(["token", "logits", "top-2 expert", "probs（Megatron）"],
      [[t, [round(v, 4) for v in logits[t].tolist()], top_experts[t].tolist(),
        [round(v, 4) for v in megatron["probs"][t].tolist()]] for t in range(6)])

# %% [markdown]
# **aux loss。** 训练时 router 还算 Switch Transformer 的 load balancing loss：
# `aux = coeff · E / (k·T²) · Σ_i (Σ_t s_{t,i}) · c_i`，其中 `s` 是对**全部** E 个 logits 的 softmax，`c_i` 是
# 选中 expert `i` 的 token 数。各 expert 分到的 token 越均匀、概率越分散，它越小（完全均匀时除以 coeff 后等于 1）。
# 它不加进 loss，而是由 `MoEAuxLossAutoScaler` 挂在 `probs` 上：前向原样返回 `probs`，反向时顺手给 aux loss 一个梯度。
# Megatron 把 `aux / coeff` 记进 MoE 指标 tracker（`moe_logging.get_moe_metrics_tracker()`），`pop_aux_loss()` 读回来；手算：

# %%
scores = torch.softmax(logits, dim=-1)
counts = megatron["routing_map"].sum(dim=0)
E, k, T = 4, 2, 6
aux_by_hand = E / (k * T * T) * (scores.sum(dim=0) * counts).sum()
print("每个 expert 选中的 token 数:", counts.tolist())
print("手算 aux / coeff:", round(aux_by_hand.item(), 4),
      " Megatron 记下的:", round(ref["aux"][0], 4))

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### EP=2：4 个 rank，同一组 expert
#
# 4 个 rank、`expert_model_parallel_size=2`。每个 rank 建同样配置的层（EP=2 时只有 2 个本地 expert），
# 再从 EP=1 的参考 `state_dict` 拷入**自己那两个** expert（`local_expert_state`）；每个 rank 处理自己那个
# 数据并行 rank 的 micro-batch。两种 dispatcher 在同一次运行里各跑一遍，通信各自记录：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(expert_parallel_step)

# %%
ep_run = run_ranks(expert_parallel_step, 4, TINY, ref["state"], grid=dict(ep=2))
rank_table([r["rank"] for r in ep_run], kinds=("dp", "ep", "edp", "etp-ep"))

# %% [markdown]
# EP 不占额外的卡：decoder 网格里 4 个 rank 都是 DP（`dp` 群 `[0, 1, 2, 3]`）；expert 网格把同一批 rank 重新看成
# `ETP(1) × EP(2) × EDP(2)`（[笔记 08](../08_parallel_state_and_rank_generator/) 的第二个 `RankGenerator`）。
# 缺省 order 下 EP 是相邻的 rank：`ep` 群 `[0, 1]`、`[2, 3]`，token 只在群内交换；`edp` 群 `[0, 2]`、`[1, 3]`
# 是持有**同一组** expert 的 rank。`etp-ep` 群（`tp_ep`）在 ETP=1 时与 `ep` 群成员相同，dispatcher 用它交换 token 计数。
#
# ### 每个 rank 的 token 流向
#
# `routing_map.sum(0)` 是本 rank 的 token 选中每个 expert 的次数。按 expert 所在的 EP rank 加起来就是
# `input_splits`（发往每个 EP rank 的行数）；交换计数后得到 `output_splits`（从每个 EP rank 收到的行数）：

# %%
flow_table(ep_run)

# %% [markdown]
# 6 个 token × top-2 = 12 行离开每个 rank；rank 0 的 expert 0、1 收到自己的 6 行和 rank 1 的 7 行，共 13 行。
# 每个 rank 处理的行数取决于路由，不是常数——这正是 split sizes 必须在 all-to-all 之前算好、送到主机上的原因：
# 输出缓冲要先按 `sum(output_splits)` 分配。
#
# ### alltoall dispatcher 的全部通信（rank 0）

# %%
dispatch_table(ep_run[0]["alltoall"]["calls"], alltoall_meaning)

# %% [markdown]
# 前向 1 次 all-gather + 3 次 all-to-all，反向 3 次 all-to-all，全部在 2 个 rank 的群里。每次 all-to-all 都带着
# 两组 split sizes，反向把两组对调（`mappings.all_to_all` 的 backward）：dispatch 的 `[6, 6] → [6, 7]`
# 在反向里变成 `[6, 7] → [6, 6]`（第 6、7 行），combine 正好相反（第 4、5 行）。
#
# ### EP=2 等于 EP=1 吗
#
# 输出与 aux loss 逐 rank 对比参考答案里同一个 micro-batch 的结果：

# %%
Table(["dispatcher", "rank", "输出 = EP=1", "aux / coeff", "EP=1 的"],
      [[d, i, torch.allclose(r[d]["output"], ref["outputs"][i], atol=1e-6),
        round(r[d]["aux"], 4), round(ref["aux"][i], 4)]
       for d in ("alltoall", "allgather") for i, r in enumerate(ep_run)],
      title=" / ".join(ep_run[0][d]["dispatcher"] for d in ("alltoall", "allgather")))

# %% [markdown]
# 梯度要先按 DDP 的规矩求和才能比（下表列 rank 0、1；rank 2、3 与它们对称）：router 权重每个 rank 都有（`allreduce=True`，DDP 在 `dp-cp` 群里归约），
# 各 rank 只含自己 micro-batch 的贡献；expert 权重被标成 `allreduce=False`，DDP 在 `edp` 群里归约——
# 每个 expert 的本地梯度已经包含了 EP 群里所有 rank 送来的 token 的贡献（反向的 all-to-all 把它们送来了）：

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
Table(["rank", "本地参数（略去 .weight）", "EP=1 里的名字", "allreduce", "在这个群求和", "= EP=1 的梯度"],
      rows)

# %% [markdown]
# ### allgather dispatcher：换了什么
#
# `moe_token_dispatcher_type="allgather"`（这也是 `TransformerConfig` 的缺省值，
# [`transformer_config.py:862`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L862)）
# 时不交换计数、不做 all-to-all：把 `tp_ep` 群里**所有** token、
# 它们的 `routing_map` 和 `probs` 都 all-gather 到每个 rank，每个 rank 从中挑出选了本地 expert 的行，
# 算完后用 reduce-scatter 把结果加回并切回各自的 token。rank 0 的记录：

# %%
dispatch_table(ep_run[0]["allgather"]["calls"], allgather_meaning)

# %% [markdown]
# 每个本地 expert 收到的 token 与 alltoall 时相同（下表），上面的表已经显示两者输出都等于 EP=1。差别在搬运量：
# allgather 让每个 rank 收下 EP 群的全部 `T·EP` 个 token，不管它们有没有选中本地 expert；alltoall 只搬被选中的
# (token, expert) 对，平均每个 rank `T·k` 行（自测 4）。EP 大、k 小时 all-to-all 划算；EP 小时 all-gather 更简单，
# 也不需要事先交换计数。

# %%
tokens_table(ep_run)

# %% [markdown]
# 把 rank 0 所在的 EP 群（rank 0、1）画出来：左边 alltoall，箭头上是 `flow_table` 的 `input_splits`；右边 allgather，
# 每个 rank 收下群里全部 token（上面 allgather 记录的第 3 行），本地 expert 各收到的行数与 alltoall 相同（上表）。

# %%
pictures.draw_dispatch(flow_table(ep_run).rows[:2], tokens_table(ep_run).rows[:2],
                       dispatch_table(ep_run[0]["allgather"]["calls"], allgather_meaning).rows)

# %% [markdown]
# ## 机制解释
#
# **为什么要 permute 两次。** all-to-all 要求发往同一个 rank 的数据连续存放。第一次 permute（`moe_utils.permute`）
# 把 `T·k` 个 (token, expert) 对按 expert 编号排好——expert 按 EP rank 连续编号，所以同时也按目标 rank 排好了。
# 收到的数据按"来源 rank"分段，每段内再按本地 expert 分；`SequentialMLP` 要每个 expert 的 token 连续，
# 于是 `sort_chunks_by_idxs` 再按本地 expert 重排一次。combine 时两步倒着来，`unpermute` 把 k 份 expert 输出加回原 token 的位置。
#
# **probs 为什么也要 all-to-all。** `SequentialMLP` 把 probs 乘在激活函数之后、`linear_fc2` 之前
# （`MLP.forward` 的 `per_token_scale`），所以 probs 必须和 token 一起到 expert 那边；它的梯度也由反向的 all-to-all
# 送回来源 rank，流进 router——上面表格里 router 的梯度相等证明了这条路。
#
# **split sizes 为什么要在主机上。** `all_to_all_single` 的输出缓冲按 `sum(output_splits)` 分配，collective 也要知道
# 每段的长度，这些都是主机上的决定。GPU 上 Megatron 在一条旁路 stream 上把计数拷回主机（`cuda_dtoh_stream`），
# 并选择最晚的同步点，尽量不阻塞计算；这是 dispatcher 里 stream 代码的来历。
#
# **aux loss 是局部的。** `_apply_aux_loss` 在 `tp_cp` 群里数 token（[router.py 第 422 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router.py#L422)）：只有同一条序列被 TP / CP
# 切开的 rank 才合并计数，EP 和 DP 的 rank 各算各的。所以上表里 EP=2 每个 rank 的 aux loss 与 EP=1 处理同一个
# micro-batch 时完全相同；想在整个 global batch 上均衡要用 `global_aux_loss`（在 `tp_dp_cp` 群里累计）。
# 反向时 aux loss 的梯度比例由 schedule 设定（[schedules.py 第 361 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L361)：`loss_scale × CP / num_microbatches`），与主 loss 一致。
#
# **梯度归约的两套群。** 稠密参数（router、attention）在每个 rank 上都有副本，梯度在 `dp-cp` 群求和；expert 参数
# 只在 `edp` 群的 rank 上有副本。DDP 按参数的 `allreduce` 标记分两组 buffer，expert 那组的缩放因子是
# `edp 大小 / dp-cp 大小`（`average_in_collective` 时，[distributed_data_parallel.py 第 208 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L208)；缺省分支两组都是 1/(DP×CP)，[distributed_data_parallel.py 第 212–213 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L212-L213)）：
# 一个 expert 的梯度已经含有 EP 个 rank 的 token，求平均时分母仍要是全部 DP×CP 副本数。

# %% [markdown]
# ## 与训练主链路的关系
#
# MoE 只替换 `TransformerLayer` 里的 MLP 槽位（layer spec 决定，笔记 04 / 11），attention、loss、pipeline 都不变。
# forward 里多出 EP 群的 all-to-all；backward 多出它们的逆；aux loss 通过 `MoEAuxLossAutoScaler` 搭在主 loss 的反向上，
# 日志由训练循环在每步末尾从 tracker 里取（`get_moe_metrics_tracker().report(...)`，[training.py 第 2782 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2782)）。DDP 把 expert 参数单独放进 `edp` 群的 buffer（笔记 14）；
# 分布式优化器也按 `edp` 切 expert 的状态（笔记 15）；checkpoint 里本地 expert 被映射回全局编号
# （`SequentialMLP.sharded_state_dict`），所以换 EP 大小后仍能加载。

# %% [markdown]
# ## 与基础知识的连接
#
# - **条件计算**：参数量随 expert 数增长，每个 token 的计算量只随 k 增长；代价是负载可能不均——aux loss 是软约束，
#   capacity factor（`moe_expert_capacity_factor`，丢弃超额 token）是硬约束，本篇的配置是 dropless。
# - **all-to-all = 转置**：把每个 rank 上"按目标分好段"的数据看成矩阵的一行，all-to-all 就是把这个 EP×EP 的分块矩阵转置；
#   段长不等时就是 all-to-all-v，需要 split sizes。
# - **EP 与 DP 的关系**：EP 切的是 expert 参数，DP 切的是数据；EP 折叠在 DP 里，等于"同一批数据并行 rank 分着存 expert"，
#   所以 EP 越大，每个 expert 的副本（`edp`）越少。

# %% [markdown]
# ## 遗留问题
#
# 1. **Transformer Engine 提供而这里缺的东西。** router 的 GEMM（`te_general_gemm`）、融合的 permute / unpermute
#    （`moe_permute_fusion`）、融合的 top-k 与 aux loss（`moe_router_fusion`）、grouped GEMM 的 `TEGroupedMLP`、
#    DeepEP / HybridEP 的 `MoEFlexTokenDispatcher`。本篇走的全是纯 torch 分支：`SequentialMLP` 逐个 expert 做矩阵乘。
# 2. **在 CPU 上需要的两个补丁**（[在 CPU 上运行](../../cpu/)，每个都有测试）：
#    `moe_dispatcher_streams`——dispatcher 构造时建 CUDA stream（[token_dispatcher.py 第 469 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/token_dispatcher.py#L469)）；
#    `moe_host_split_sizes`——`maybe_move_tensor_to_cpu` 只转换 CUDA 张量（[moe_utils.py 第 1184 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L1184)），CPU 上 split sizes
#    留成 torch 张量，`all_to_all_single` 拒收。两者都不改变计算，上面 EP=2 = EP=1 的逐项相等就是证据。
#    core_v0.16.1 时还要第三个补丁 `moe_te_general_gemm`，0.19.0 用不着，已经删掉：router 的 gating GEMM 先判断
#    `te_general_gemm is not None`（[moe_utils.py 第 1326 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L1326)），
#    而 `moe_utils` 在没有 TE 的分支里已把这个名字设成 `None`（[moe_utils.py 第 41 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_utils.py#L41)），直接走 `torch.mm`；
#    只有 core_v0.16.1 那样只在导入 TE 成功时才绑定它的版本，缺 TE 才会 `NameError`。
# 3. **`MoELayer(layer_number=1)` 不会告诉 router（运行确认）。** 构造函数只把 `layer_number` 存在自己身上；
#    router 的 `layer_number` 要等 `TransformerLayer` 调 `set_layer_number` 才设（[transformer_layer.py 第 438 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L438)）。单独用 `MoELayer` 时 router 的
#    `layer_number` 是 `None`，aux loss 交给 MoE 指标 tracker 时被它直接丢掉（[moe_logging.py 第 118 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_logging.py#L118)），
#    aux loss 照常进梯度却不进日志（下面的单元格）。
# 4. **反向的 all-to-all 次数取决于输入要不要梯度（运行确认）。** 上面 `micro_batch` 的 `x` 要梯度（真实模型里它来自上一层）；
#    若 `x` 不要梯度，autograd 跳过 token 的 all-to-all 的反向，反向只剩 2 次（下面的单元格）。数通信次数时要用真实的条件。
# 5. **`TransformerConfig` 的缺省值触发它自己的弃用警告**（`cuda_graph_modules="full"`，[transformer_config.py 第 1047 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)、[transformer_config.py 第 2415 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)），
#    每个 rank 每次构造都打印一次；local spec 在没有 Apex 时也警告一次。两条都只是提示，本站在导入 `snippets` 时统一滤掉。

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
