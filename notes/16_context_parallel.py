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
# # 16 Context parallel：把一条序列切给几张卡，attention 仍看见整条序列
#
# 序列长到一张卡放不下它的激活时，context parallel（CP）把**一条样本的序列**切给 CP 张卡，权重一点不切。
# 每个 CP rank 拿到哪些 token、为什么不是连续的一段？attention 要看整条序列，只有本地 token 的 rank 怎么算？
# 梯度又在哪个群里加起来？本篇在 2、4 个进程上调用真实的 `get_batch_on_this_cp_rank` 和 `initialize_model_parallel`，
# 用一个几十行的 ring attention 代替只能在 GPU 上跑的 Transformer Engine，并对照 TE 的源码。

# %% [markdown]
# ## 阅读目标
#
# 1. `get_batch_on_this_cp_rank` 怎么切：`2·CP` 块、每个 rank 一头一尾，为什么这样在 causal mask 下工作量相同。
# 2. 只有 `s/CP` 个 token 的 rank 怎样对整条序列做 softmax：K/V 绕 CP 环，前向、反向各几跳，每跳发什么。
# 3. 梯度为什么在 `dp-cp` 群里归约，数据又为什么按不含 CP 的 dp 坐标采样。
# 4. 两种 `loss_func` 契约在 CP 下给出的梯度是否相同。
#
# **结论**
#
# - CP=4、s=16 切成 8 块，rank r 拿第 r 与第 7−r 块（rank 0 的位置 `0, 1, 14, 15`），每个 rank 34 对 (q, k)；切分不通信。
# - 连续切时最慢 / 最快 = (m(2·CP−1)+1)/(m+1)，m = s/CP：CP=2、s=16 是 2.7778，只在长序列时趋于 3。
# - 环：前向 CP−1 = 3 跳、反向 4 跳；每跳我们的环反向发 128、128、128、64 个数，TE 发 64、128、128、64。
# - CP 群内两份梯度相加才是一条样本的梯度；DDP 在 `dp-cp` 群 `[0, 1, 2, 3]` 里归约，按 1/4 缩放。
# - loss token 在 CP 分片间不均时，只有 `calculate_per_token_loss` 等于全体 token 平均；三项契约的范数比 0.8671。
#
# 先读：[笔记 08](../08_parallel_state_and_rank_generator/)（rank 网格里的 CP 维）、[笔记 05](../05_forward_loss_backward/)（`loss_func` 的两种契约）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import torch
import torch.distributed as dist

from snippets.cp import pictures
from snippets.cp.ring_attention import causal_attention, causal_pairs, chunk_positions, ring_attention
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n16_cp import (batch_on_cp_rank, folded, hop_payloads, imbalance_rows, make_batch,
                                         ring_table, ring_vs_full, shapes, split_table, te_backward_payloads,
                                         work_table)
from snippets.ranks.groups import describe_rank, rank_table
from snippets.ranks.launch import RankError, run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import record
from snippets.record.tables import Table

from megatron.core import parallel_state
from megatron.core.utils import get_batch_on_this_cp_rank

TINY = EXPERIMENTS["cp"].tiny
cp4_table = split_table(run_ranks(batch_on_cp_rank, 4, TINY, 4, grid=dict(cp=4)), 4, TINY.seq)
pictures.draw_cp_split(cp4_table.rows, work_table(4, 16), m_cell=8)

# %% [markdown]
# 上面一条是 16 个位置切成的 8 块各归哪个 rank；下面是 causal mask 的下三角，query 行按持有者上色，左边按连续切、右边按 Megatron 的
# 2·CP 块切，各带每个 rank 保留的 (q, k) 对数。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n16_cp.py`（实验名 `cp`）：`make_batch` 造一个 GPT micro-batch 的五个字段（token 取
#   `100, 101, …`，好认出位置）；`batch_on_cp_rank` 在 `initialize_model_parallel(context_parallel_size=CP)` 的每个 rank 上调
#   真实的 `get_batch_on_this_cp_rank`；`ring_vs_full` 把同一组全序列 `q, k, v` 按真实切法取出本 rank 的位置，跑
#   `snippets/cp/ring_attention.py` 的 ring attention 前向、反向，与单进程整条序列的 causal attention 比较，并记下每一跳。
#   尺寸是 `dims` 的 `tiny`：s = 16、b = 1、2 个 head、head 维 4。
# - 为什么自己写 ring attention：Megatron 把 CP 的 attention 交给 Transformer Engine（`TEDotProductAttention`），TE 要 GPU，
#   本机装不上。我们的版本是一个自定义 `autograd.Function`（前向、反向各一个环，`batch_isend_irecv`），只复现数学和通信的形状，
#   不复现 TE 的优化（见"TE 替我们做了什么"）；它的反向每跳发什么与 TE 不同，文中两者都列。
# - 用 `snippets.ranks.launch.run_ranks` 在本机起 2 或 4 个 gloo 进程，Megatron 的 import 写在 rank 函数里。通信由
#   `snippets.record.recorder` 记录。"两种 loss 契约"的实验在 `snippets/experiments/n16_loss_contracts.py`。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 4 cp --cp 4`（切分、环与整序列的比较、rank 1 的每一跳）；
#   `--dims qwen3-8b --cp 8` 切 2048 个 token。整页：`scripts/execute_notes.sh notes/16_context_parallel.py`。
# - CPU 上的改动见文末"在 CPU 上怎么跑的"。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(make_batch, batch_on_cp_rank, ring_vs_full)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | 分派：普通序列按 2·CP 块切，packed 序列按文档切 |
# | [`utils.py::_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456) | 本篇跑到的切法 |
# | [`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97) | 正式入口：TP 广播后按 CP 切 |
# | [`parallel_state.py::get_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1758) | `with_context_parallel=True`：梯度归约的 dp-cp 群 |
# | [`transformer_engine.py::TEDotProductAttention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1770) | 把 CP 群和 `cp_comm_type` 交给 TE |
# | [TE `context_parallel.py::AttnFuncWithCPAndKVP2P`](https://github.com/NVIDIA/TransformerEngine/blob/4329ff84bfbdaa778a33cba02a15fb0807c64689/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py#L1407) | TE 的 p2p 环（Megatron 0.19.0 钉的 TE 提交） |
#
# <details><summary>其余 9 个位置</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`utils.py::_get_batch_on_this_cp_rank_per_document_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2406) | packed（THD）序列的切法，索引由 TE 算 |
# | [`parallel_state.py::get_context_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1828) | CP 群：K/V 在其中传递 |
# | [`transformer_config.py:987`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L987) | `cp_comm_type`：`p2p`（环）、`all_gather`、`a2a`、`a2a+p2p` |
# | [`transformer_engine.py:1870`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1870) | 没给 `cp_comm_type` 时用 `p2p` |
# | [`dot_product_attention.py:57`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57) | 本地实现的 attention 断言 CP = 1 |
# | [`rope_utils.py::get_pos_emb_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L48) | RoPE 表按同样的两块切 |
# | [`rotary_pos_embedding.py:261`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L261) | RoPE 表的长度乘回 CP |
# | [`finalize_model_grads.py:689`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L689) | token 数在 dp-cp 群里求和 |
# | [`distributed_data_parallel.py:228`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L228) | DDP 的梯度缩放是 1 / (dp-cp 群大小) |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 切分发生在 `get_batch` 里，纯本地；CP 的通信全在 attention 里（TE 的环），梯度和 token 数在 dp-cp 群归约。
#
# <details><summary>完整调用链</summary>
#
# ```text
# pretrain_gpt.py::forward_step
# └─ pretrain_gpt.py::get_batch
#    ├─ megatron/core/utils.py::get_batch_on_this_tp_rank             # TP 群内 broadcast 整条序列（笔记 03）
#    ├─ megatron/core/utils.py::flatten_batch_for_packed_sequences    # 只对带 cu_seqlens 的 packed batch 起作用
#    └─ megatron/core/utils.py::get_batch_on_this_cp_rank             # 分派：cp_group=get_context_parallel_group()
#       └─ _get_batch_on_this_cp_rank_per_sequence_balancing          # 本地切片：[b, s] → [b, s/CP]，无通信
# GPTModel.forward（本 rank 的 s/CP 个 token）
# ├─ LanguageModelEmbedding                                           # 逐 token，无通信
# ├─ RotaryEmbedding.forward
# │  └─ rope_utils.py::get_pos_emb_on_this_cp_rank                     # RoPE 表按同样两块切，无通信
# └─ TransformerLayer → SelfAttention
#    ├─ linear_qkv                                                     # 只为本地 token 算 Q、K、V
#    └─ core_attention = TEDotProductAttention(cp_group, cp_comm_type="p2p")
#       └─ TE AttnFuncWithCPAndKVP2P                                   # K/V 绕 CP 环：前向 CP−1 跳，反向 CP 跳
# pretrain_gpt.py::loss_func                                          # 只对本地 token 求 loss 和与 token 数
# finalize_model_grads / DDP                                          # 梯度、token 数在 dp-cp 群 all-reduce
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `get_batch` 取数据、TP 广播那一半的记录在[笔记 03](../03_data_and_batch_flow/)；这里只记 CP 的部分。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_batch_on_this_cp_rank` | batch dict、`is_hybrid_cp`（必填）、`cp_group`（缺省 `None` = 整个 world）、`hybrid_cp_group_func`、`use_per_sequence_balancing` | 同一个 dict（就地改写），每个序列字段的序列维变为 s/CP | `_get_batch_on_this_cp_rank_per_sequence_balancing` / `_per_document_balancing` | 用 `cp_group` 的大小与 rank，无通信 | **是**：每个字段取第 `cp_rank` 与 `2·CP−1−cp_rank` 块 | 否 | `forward_step_func` 里取数据 |
# | `TEDotProductAttention.__init__` | config、mask 类型、`cp_comm_type`、`pg_collection` | 模块 | `get_context_parallel_group` | 是：把 CP 群交给 TE | 否 | 建一条类级 `cp_stream` | 构造模型 |
# | `get_pos_emb_on_this_cp_rank` | RoPE 表、序列维、`cp_group` | 本 rank 两块位置的 RoPE | 无 | 只读 CP 坐标 | 是：与 batch 同样的切法 | 否 | forward |
# | TE `AttnFuncWithCPAndKVP2P` | 本地 `q, k, v`、`cp_group`、`cp_global_ranks`、`cp_stream` | 本地输出 | （TE） | **是**：CP 群内 p2p | 否（K/V 只是路过） | 否 | forward / backward |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 真实的 `get_batch_on_this_cp_rank`
#
# GPT 的 micro-batch 是一个 dict：`tokens`、`labels`、`loss_mask`、`position_ids` 形状 `[b, s]`，`attention_mask` 形状
# `[b, 1, s, s]`（`True` 表示**遮住**）。每个 rank 按正式入口的参数调用它（`is_hybrid_cp=False`、`cp_group=get_context_parallel_group()`，
# [`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)），CP = 2：

# %%
def split_on_cp_rank(dims, cp):
    parallel_state.initialize_model_parallel(context_parallel_size=cp)
    batch = make_batch(dims.seq)  # s = 16, token 100 + 位置
    local = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=parallel_state.get_context_parallel_group())
    return local["position_ids"][0].tolist(), {k: list(v.shape) for k, v in local.items()}, local is batch


for rank, (positions, field_shapes, same) in enumerate(run_ranks(split_on_cp_rank, 2, TINY, 2, grid=dict(cp=2))):
    print(f"CP rank {rank}: position_ids {positions}\n  {field_shapes}  返回的就是传入的 dict: {same}")

# %% [markdown]
# 规则：序列切成 `2·CP` 块，CP rank `r` 拿第 `r` 块和第 `2·CP−1−r` 块，**按这个顺序拼在一起**（rank 0 是 `0…3, 12…15`）。
# 每个字段都在序列维切：`[b, s]` 的第 1 维，`attention_mask` 的第 2 维（query 维）；它的最后一维（key 维）仍是完整的 16——
# 每个本地 query 仍要面对整条序列的 key。这一步**没有通信**：每个 rank 本来就有整条序列（TP 广播之后），只是各自留下两块。
# 函数**就地改写**传入的 dict 再返回它，调用之后整条序列就不在了。CP = 4 时每个 rank 4 个 token（rank 1 是 `2, 3, 12, 13`）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
cp4_table

# %% [markdown]
# ### 为什么是 2·CP 块：causal mask 下的工作量
#
# 位置 `p` 的 query 看 `p + 1` 个 key，越靠后的 token 越"贵"。数每个 rank 的 query 在 causal mask 下保留的 (q, k) 对数，
# 就是它的 attention 计算量。朴素切法把序列连续切成 CP 段，Megatron 取一头一尾：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["CP", "s", "cp_rank", "连续切：(q, k) 对数", "2·CP 块切：(q, k) 对数"],
      work_table(2, 16) + work_table(4, 16) + work_table(4, 4096))

# %% [markdown]
# 连续切时每个 rank 有 m = s/CP 个 token，rank r 保留 m²(r + 1/2) + m/2 对，所以最后一个与第一个之比是
# **(m(2·CP−1)+1)/(m+1)**：CP=2、s=16 时 (8·3+1)/9 = 2.78（上表 100 对 36），不是 3；CP=4、s=16 是 5.8。
# 只有序列很长（m → ∞）时才趋于 2·CP−1，即 3 倍（CP=2）、7 倍（CP=4）。每一步 attention 都要等最慢的 rank。
# 一头一尾的两块正好互补（第 `r` 块轻、第 `2·CP−1−r` 块重），每个 rank 分到的对数完全相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
imbalance_rows([(2, 16), (4, 16), (4, 4096), (8, 4096)])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### attention 怎样看见整条序列：K/V 绕环
#
# 每个 rank 只为自己的 `s/CP` 个 token 算出 Q、K、V。`TEDotProductAttention` 在 CP > 1 时把 `cp_group`、`cp_global_ranks`、
# 一条 `cp_stream` 和 `cp_comm_type`（缺省 `"p2p"`）交给 TE 的 attention。`p2p` 就是 ring attention：
#
# - 第 `i` 步，CP rank `r` 手里是 CP rank `(r − i) mod CP` 的 K/V 块；用本地 query 对它算一块 attention（mask 按**全局位置**），
#   用 log-sum-exp 把这一块并进累计的输出；同时把手里的块发给 `r + 1`、从 `r − 1` 收下一块。
# - 反向再绕一圈：每个 rank 把自己的 query 对这块 K/V 的梯度加进 `dK`、`dV`，随块往下传，最后一跳把完整的 `dK`、`dV` 送回主人。
#
# 我们的环（前向、反向各一个环的 `autograd.Function`）在 CP=2 与 CP=4 的每个 rank 上，输出和 dQ、dK、dV 都与单进程整条序列的
# causal attention 相等。CP=4 时 rank 1 的每一跳（每行一次 `batch_isend_irecv`：一个 isend、一个 irecv）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ring2 = run_ranks(ring_vs_full, 2, TINY, 2, grid=dict(cp=2))
ring4 = run_ranks(ring_vs_full, 4, TINY, 4, grid=dict(cp=4))
display(folded("环与整序列的比较：输出、dQ、dK、dV，每个 rank", Table(
    ["CP", "rank", "输出相等", "dQ 相等", "dK 相等", "dV 相等"],
    [[cp, rank, *same] for cp, result in ((2, ring2), (4, ring4)) for rank, (same, _) in enumerate(result)])))
ring_table(ring4[1][1])

# %% [markdown]
# 形状 `[2, 4, 1, 2, 4]` 是 K、V 叠在一起：`[2, s/CP, b, np, hn]`，64 个数。前向 CP−1 = 3 跳（最后一块不必再传）；
# 反向 CP = 4 跳，多的一跳把 `dK`、`dV` 送回主人。环上每个 rank 只和两个邻居说话：rank 1 发给 2、从 0 收。
#
# **反向每跳发什么，我们的环和 TE 不同。** 我们先算再发：第一跳就带着 K/V 和刚算出的 dK/dV（128 个数）。TE 的
# `AttnFuncWithCPAndKVP2P.backward` 先发再算，发送缓冲是 `[KV, dKV]`：第一跳还没有梯度，只发 KV
# （[TE `context_parallel.py:2537`](https://github.com/NVIDIA/TransformerEngine/blob/4329ff84bfbdaa778a33cba02a15fb0807c64689/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py#L2537)），
# 最后一跳块已没人需要，只发 dKV（[同一文件第 2540 行](https://github.com/NVIDIA/TransformerEngine/blob/4329ff84bfbdaa778a33cba02a15fb0807c64689/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py#L2540)，BF16/FP16 路径；
# FP8 时每跳只传 KV，dKV 最后用一次 all-to-all 送回）。同样的形状下每跳的数：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ours_bwd = hop_payloads(ring4[1][1], "backward")
Table(["反向", *[f"第 {i} 跳" for i in range(1, len(ours_bwd) + 1)], "合计"],
      [["我们的环（记录到的）", *ours_bwd, sum(ours_bwd)],
       ["TE 的规则（同样的 K+V 块）", *te_backward_payloads(4, hop_payloads(ring4[1][1], "forward")[0]),
        sum(te_backward_payloads(4, hop_payloads(ring4[1][1], "forward")[0]))]])

# %% [markdown]
# ### 每一步的工作量：一头一尾让每一步都均衡
#
# 环的每一步都是"本地 query × 一块 K/V"。CP=4、s=16 时每一步 causal mask 保留的对数：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def step_work(cp, seq_len):
    rows = []
    for step in range(cp):
        row = [step]
        for r in range(cp):
            owner = (r - step) % cp
            pairs = causal_pairs(chunk_positions(r, cp, seq_len), chunk_positions(owner, cp, seq_len))
            row.append(f"{owner}: {pairs}")
        rows.append(row)
    return Table(["step"] + [f"rank {r}（K/V 来自: 对数）" for r in range(cp)], rows)


step_work(4, 16)

# %% [markdown]
# 第 0 步是对角块，之后每一步每个 rank 都恰好做**半块**（16 对中的 8 对）：K/V 来自编号更小的 rank 时，本地两块 query
# 只看得见它的第一块；来自编号更大的 rank 时，只有本地第二块 query 看得见它的两块。TE 正是每步只算这一半
# （[TE `context_parallel.py:787`](https://github.com/NVIDIA/TransformerEngine/blob/4329ff84bfbdaa778a33cba02a15fb0807c64689/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py#L787) 的 `lower-triangle` 取 K/V 的前半，
# [第 824 行](https://github.com/NVIDIA/TransformerEngine/blob/4329ff84bfbdaa778a33cba02a15fb0807c64689/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py#L824) 的 `upper-triangle` 取 Q 的后半）；我们的环算整块再用 mask 清零，结果相同。
#
# ### 梯度在哪个群归约
#
# 缺省 `order="tp-cp-ep-dp-pp"`，CP 紧挨在 TP 右边：TP=1、CP=2、DP=2 的 4 个 rank 上 rank = cp + 2·dp。下面一个小的
# "embedding → `linear_qkv` → ring attention → loss"：两个 DP 副本各读一条样本，每条被 CP 切成两半；所有 rank 权重相同。
# `linear_qkv.weight` 的梯度先看本地值，再分别在 CP 群、dp-cp 群里求和，与单进程整条序列的梯度比较：

# %%
def cp_dp_step(seq_len=16, hidden=8, heads=2):
    parallel_state.initialize_model_parallel(context_parallel_size=2)
    torch.manual_seed(0)  # the same weights on every rank: CP and DP ranks are replicas
    embedding, linear_qkv = torch.nn.Embedding(200, hidden), torch.nn.Linear(hidden, 3 * hidden, bias=False)

    def loss_of(tokens, attention):  # q, k, v laid out [s, b, np, hn] as in Megatron's attention
        x = embedding(tokens).transpose(0, 1)
        q, k, v = linear_qkv(x).view(*x.shape[:2], heads, -1).chunk(3, dim=-1)
        return attention(q, k, v).square().sum()

    samples = [make_batch(seq_len, first_token=100 + 50 * d) for d in range(2)]
    dp_rank, cp_group = parallel_state.get_data_parallel_rank(), parallel_state.get_context_parallel_group()
    local = get_batch_on_this_cp_rank(dict(samples[dp_rank]), is_hybrid_cp=False, cp_group=cp_group)  # a copy
    with record() as calls:
        loss_of(local["tokens"], lambda q, k, v: ring_attention(q, k, v, cp_group)).backward()
        grad = linear_qkv.weight.grad
        over_cp, over_dp_cp = grad.clone(), grad.clone()
        dist.all_reduce(over_cp, group=cp_group)  # only to explain: DDP does the next one
        dist.all_reduce(over_dp_cp, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    full = []  # reference: each sample on one process, whole sequence, no CP
    for sample in samples:
        linear_qkv.weight.grad = None
        loss_of(sample["tokens"], causal_attention).backward()
        full.append(linear_qkv.weight.grad.clone())
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    return dict(rank=describe_rank(), calls=calls, local=close(grad, full[dp_rank]),
                cp=close(over_cp, full[dp_rank]), dp_cp=close(over_dp_cp, full[0] + full[1]))


step = run_ranks(cp_dp_step, 4, grid=dict(cp=2))
Table(["rank", "本地梯度 = 本样本整序列的", "CP 群求和后 = 本样本整序列的", "dp-cp 群求和后 = 两条样本之和"],
      [[i, s["local"], s["cp"], s["dp_cp"]] for i, s in enumerate(step)])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
display(rank_table([s["rank"] for s in step], kinds=("cp", "dp", "dp-cp")))
ring_calls = [c for c in step[2]["calls"] if c.api == "batch_isend_irecv"]
sums = [c for c in step[2]["calls"] if c.api == "all_reduce"]
display(Table(["#", "phase", "API", "group", "shape before → after"],
              [[i, c.phase, c.api, f"{c.group} {list(c.ranks)}", shapes(c)] for i, c in enumerate(ring_calls, 1)]))
Table(["为了解释而发的求和（训练里由 DDP 在 grad sync 里做）", "group", "shape"],
      [[c.api, f"{c.group} {list(c.ranks)}", c.before] for c in sums])

# %% [markdown]
# - **本地梯度不完整。** 一个 CP rank 的 loss 只含自己那一半 token，而权重作用于整条序列，所以本地梯度只是一部分——
#   哪怕环的反向已经把别的 rank 的 query 对本地 K、V 的梯度送了回来。
# - **CP 群内求和就还原一条样本。** 两个 CP rank 的梯度相加，恰好等于单进程整条序列的梯度。
# - **DDP 用 dp-cp 群。** 再把不同样本相加就是 DP 的那份工作；两件事都是"对持有同一份权重的 rank 求和"，所以 Megatron 把它们
#   合成一个群 `dp-cp`（这里 `[0, 1, 2, 3]`），DDP 按 `1 / 群大小` 缩放（[`distributed_data_parallel.py:228`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L228)），
#   `finalize_model_grads` 也在这个群里把 token 数加起来（[`finalize_model_grads.py:689`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L689)），
#   分布式优化器也按这个群切状态（[笔记 15](../15_distributed_optimizer/)）。数据采样却用**不含** CP 的 dp 坐标：rank 0 和 1 的 dp 都是 0，读同一条样本，才能各切一半。

# %% [markdown]
# ## 机制解释
#
# **切分只是索引。** `get_batch_on_this_cp_rank` 自己只做分派（[`utils.py:2652`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2652)）：
# 没有 `cu_seqlens`（本篇、普通预训练）或打开 `use_per_sequence_balancing` 时交给按序列的切法，它跳过元数据键，把其余字段在序列维
# `view` 成 `[…, 2·CP, s/(2·CP), …]`，`index_select` 取两块再压平（[`utils.py:2510`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2510)）；
# packed 序列在每篇文档内部各自一头一尾。两者都不检查 `s` 能否被 `2·CP` 整除（自测 2），也不通信。
#
# **为什么 attention 之外不需要通信。** embedding、norm、MLP、`linear_qkv`、`linear_proj`、loss 都是逐 token 的，权重完整就能各算各的。
# 只有 attention 让一个 token 看到别的 token，所以 CP 只在这里交换 K/V（每层一跳 `2·(s/CP)·b·ng·hn` 个数），不交换激活或权重。
#
# **合并 softmax。** 设某个 query 在第 `j` 块 K/V 上的 logsumexp 为 `L_j`、归一化输出为 `O_j`，整条序列上的输出是
# `Σ_j exp(L_j − L) · O_j`，`L = logsumexp_j L_j`。每个 rank 只需保留累计的 `(O, L)`，来一块并一块，与顺序无关；
# 反向用前向存下的 `L` 直接重算每块的概率，不必保存 `s×s` 矩阵。
#
# **其他 `cp_comm_type`。** `all_gather`：先收齐整条 K/V 再算，简单但不能与计算重叠；`a2a`：按 head 重新分（DeepSpeed Ulysses），
# 每个 rank 对整条序列算一部分 head；`a2a+p2p`：机内 a2a、机间环。都由 TE 实现，Megatron 只传参和建群。
#
# ### 两种 loss 契约在 CP 下给出什么梯度
#
# `loss_func` 返回两项时 schedule 把 loss 乘以 CP 大小，返回三项时除以本地 token 数
# （[`schedules.py:340`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340)）。
# 在 CP=2、DP=2 上走一遍真实的训练接线（Megatron 的 `DistributedDataParallel`、`get_forward_backward_func()`、
# `finalize_model_grads`），每个 DP rank 一条 8 token 的样本；`even` 两条都算满 8 个 token，`uneven` 第二条只算前 3 个
# （它的两个 CP rank 各有 2 个、1 个）。四种写法的 `linear_qkv` 梯度与单进程的两种平均比较，末列是梯度范数与"每条样本等权"之比：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments.n16_loss_contracts import MASKS, VARIANTS, TinyAttentionLM, contracts_step

contracts = run_ranks(contracts_step, 4, grid=dict(cp=2))
same_on_all = all({k: v for k, v in c.items() if k[1] != "local_tokens"} ==
                  {k: v for k, v in contracts[0].items() if k[1] != "local_tokens"} for c in contracts)
print("各 rank 的 loss token 数:", {mask: [c[mask, "local_tokens"] for c in contracts] for mask in MASKS},
      " 四个 rank 的结论相同:", same_on_all)
display(folded("四种写法", Table(["写法", "返回几项", "loss 怎么算", "calculate_per_token_loss"],
                              [[name, *v] for name, v in VARIANTS.items()])))
Table(["mask", "写法", "= 各样本 token 平均的平均", "= 全体 token 平均", "梯度范数比"],
      [[mask, name, *contracts[0][mask, name].values()] for mask in MASKS for name in VARIANTS])

# %% [markdown]
# - **两项、本地平均**多了 CP 倍（`even` 时 2.0）：每个 rank 交出 `S_c / n_c`，schedule 再乘 CP，DDP 的 ÷(DP·CP) 只抵掉一个 CP。
#   两项契约要求 `loss_func` 自己在 CP 群里合计 token 数（`two_cp_mean`），那样就是"每条样本等权"。
# - **三项**（`pretrain_gpt.py` 的缺省）是"每个 CP 分片等权"：分片 token 数不同（`uneven`）时两种平均都不是（0.8671）。
# - **三项加 `calculate_per_token_loss`** 把除法推迟到 `finalize_model_grads`，用 dp-cp 群里相加的 token 数：总等于全体 token 平均，与切法无关。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(TinyAttentionLM, contracts_step)

# %% [markdown]
# ## 与训练主链路的关系
#
# CP 发生在 `forward_step` 的第一行 `get_batch` 里：TP 广播之后立刻按 CP 切（[`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)）。
# 之后整个模型只处理 `s/CP` 个 token，激活按 CP 缩小——这是长序列要 CP 的原因。attention 里每层前向、反向各绕一圈环；
# loss 与 token 数见上一节；DDP 和分布式优化器都用 dp-cp 群（[笔记 02](../02_distributed_initialization/) 展示了 `dp` 与 `dp-cp` 群的区别）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **online softmax**：flash attention 在片上内存里分块算 softmax 用的就是 `(O, L)` 合并；ring attention 把"块"搬到了不同的 GPU。
# - **causal mask 的三角形**：连续切会把三角形切成面积递增的梯形；一头一尾两块拼成的面积处处相等。
# - **数据并行的推广**：对权重而言，CP 的各 rank 与 DP 副本没有区别（同一份权重、不同的 token），所以梯度一起求和。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **local spec 不能训练 CP。** 本地实现的 `DotProductAttention` 在构造时断言 `context_parallel_size == 1`
#    （[`dot_product_attention.py:57`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57)）：CP 只有 TE 这一条路。
# 2. **不传 `cp_group` 不报错，只是切错。** CP 的大小和坐标取自 `get_world_size(cp_group)`、`get_rank(cp_group)`
#    （[`utils.py:2483`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2483)），`None` 就是整个 world。
#    CP=2、DP=2 的 4 个 rank 上不传它，序列被切成 8 块、按全局 rank 各取 4 个 token；`is_hybrid_cp` 没有缺省值，不传直接 `TypeError`。

# %%
def cp_pitfalls(dims):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    parallel_state.initialize_model_parallel(context_parallel_size=2)  # CP=2, DP=2
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, context_parallel_size=2)
    try:
        DotProductAttention(config, 1, AttnMaskType.causal, "self")
        attention = "ok"
    except AssertionError as err:
        attention = f"AssertionError: {err}"
    wrong = get_batch_on_this_cp_rank(make_batch(dims.seq), is_hybrid_cp=False)  # no cp_group
    right = get_batch_on_this_cp_rank(make_batch(dims.seq), is_hybrid_cp=False,
                                      cp_group=parallel_state.get_context_parallel_group())
    return attention, wrong["position_ids"][0].tolist(), right["position_ids"][0].tolist()


found = run_ranks(cp_pitfalls, 4, TINY, grid=dict(cp=2))
print("坑 1:", found[0][0])
for rank, (_, wrong, right) in enumerate(found):
    print(f"坑 2: rank {rank} 不传 cp_group {wrong}，传了 {right}")

# %% [markdown]
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **TE 替我们做了什么。** 真实的 CP attention 在 TE 里：每步的 send / recv 放在 `cp_stream` 上与计算重叠、每步只算可见的半块、
#   支持 GQA / packed THD（`_get_batch_on_this_cp_rank_per_document_balancing` 的索引由 TE 的 `thd_get_partitioned_indices` 计算，
#   [`utils.py:2441`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2441)），以及 `all_gather` / `a2a` 变体。
#   TE 要 GPU，本机装不上；`snippets/cp/ring_attention.py` 只复现数学和通信的形状，反向每跳的载荷与 TE 不同（见上文）。
# - **RoPE 的 CP 切分要 GPU。** `get_pos_emb_on_this_cp_rank` 用 `pin_memory=True` 建索引再 `.cuda()`
#   （[`rope_utils.py:62`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L62)），
#   没有 GPU 时第一步就报错；CPU 补丁没有覆盖它，本篇的例子不用 RoPE。
# - **`TransformerConfig` 的缺省值触发它自己的弃用警告**（`cuda_graph_modules` 缺省 `"full"`，
#   [`transformer_config.py:1047`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)、
#   [`transformer_config.py:2415`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)），
#   `snippets/__init__.py` 的已知警告过滤把它静音。
# - 尺寸：s = 16、b = 1、2 个 head、head 维 4；最多 4 个 rank。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. s = 4096、CP = 4 时，CP rank 1 持有哪些位置？**
#
# <details><summary>答案</summary>
#
# 切成 8 块、每块 512。rank 1 拿第 1 块和第 6 块：`[512, 1024)` 与 `[3072, 3584)`，共 1024 个 token。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
positions = chunk_positions(1, 4, 4096)
print(len(positions), [positions[i].item() for i in (0, 511, 512, 1023)])

# %% [markdown]
# **2. s = 6、CP = 2 会怎样？**
#
# <details><summary>答案</summary>
#
# 6 不能被 2·CP = 4 整除。`get_batch_on_this_cp_rank` 不检查，`view` 成 `[1, 4, 1]` 时直接抛 `RuntimeError`。
# 正式入口在参数校验时断言 `seq_length % (2·CP) == 0`（[`arguments.py:1296`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1296)），自己调它时要自己保证。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
try:
    run_ranks(batch_on_cp_rank, 2, TINY.replace(seq=6), 2, grid=dict(cp=2))
except RankError as err:
    print(err.summary)

# %% [markdown]
# **3. CP = 4 时，一层 attention 的前向和反向各有几次 p2p 交换？每次发出多少个数？（分我们的环和 TE 说）**
#
# <details><summary>答案</summary>
#
# 前向 3 次，每次 K、V 各 `(s/CP)·b·np·hn` = 4·1·2·4 = 32 个数，合 64 个，两者相同。反向 4 次：我们的环先算再发，
# 前 3 次带上 dK、dV 共 128 个数、最后一次只送 dK、dV 64 个（合 448）；TE 先发再算，第一次只发 K/V 64 个、中间两次 128 个、
# 最后一次只发 dK/dV 64 个（合 384）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print("forward:", hop_payloads(ring4[1][1], "forward"), " backward（我们的环）:", hop_payloads(ring4[1][1], "backward"),
      " backward（TE 的规则）:", te_backward_payloads(4, hop_payloads(ring4[1][1], "forward")[0]))

# %% [markdown]
# **4. 上面 CP=2、DP=2 的运行里，rank 1 与哪些 rank 一起归约梯度？它和 rank 0 读的是同一条样本吗？**
#
# <details><summary>答案</summary>
#
# `dp-cp` 群 `[0, 1, 2, 3]`。是同一条样本：数据采样看不含 CP 的 `dp` 坐标，rank 0 和 1 都是 `dp = 0`，
# 它们各拿这条样本的一半（rank 0：块 0、3；rank 1：块 1、2）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
r1 = step[1]["rank"]
print(r1["groups"]["dp-cp"], "dp 坐标:", step[0]["rank"]["coords"]["dp"], r1["coords"]["dp"],
      " cp 坐标:", step[0]["rank"]["coords"]["cp"], r1["coords"]["cp"])

# %% [markdown]
# **5. s = 4096 时，CP 从 4 变到 8，连续切分的最慢 rank 比最快的慢多少倍？比平均呢？2·CP 块切呢？**
#
# <details><summary>答案</summary>
#
# 最慢 / 最快 = (m(2·CP−1)+1)/(m+1)：CP=4（m = 1024）约 6.99、CP=8（m = 512）约 14.97，接近极限 7 和 15；
# 最慢 / 平均约 1.75 和 1.87（极限 (2·CP−1)/CP）。2·CP 块切两种情况都是 1.0。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([row[2:] for row in imbalance_rows([(4, 4096), (8, 4096)]).rows])

# %% [markdown]
# ## 30-second answer
#
# Context parallelism splits one sample's sequence across the CP group; weights stay whole. `get_batch_on_this_cp_rank`
# cuts the sequence into 2·CP chunks and gives rank r chunks r and 2·CP−1−r, so under the causal mask every rank does
# the same attention work (a contiguous split makes the last rank (m(2·CP−1)+1)/(m+1) times the first: 2.78 at CP=2,
# s=16, tending to 3). Only attention needs other tokens: Transformer Engine passes K/V around the CP ring (CP−1 hops
# forward, CP backward, where the first hop carries K/V only and the last dK/dV only), merging partial softmaxes with
# log-sum-exp. CP ranks hold replicas of the weights, so gradients and token counts are reduced over the dp-cp group.
