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
# 第二轮第 9 篇。TP 切的是权重，DP 切的是样本；context parallel（CP）切的是**一条样本的序列维**。
# 本篇在 gloo rank 上调用真实的 `get_batch_on_this_cp_rank` 看它怎么切、为什么切成 2·CP 块；
# attention 那一半 Megatron 交给 Transformer Engine（只能在 GPU 上跑），所以我们用
# `snippets/cp/ring_attention.py` 写了一个几十行的 ring attention，证明它与整条序列上的 causal attention
# 在输出和梯度上都相等，并记录它发出的每一次 send / recv；最后在真实的 `initialize_model_parallel`
# 网格里看梯度为什么在 DP×CP 群里归约。

# %% [markdown]
# ## 阅读目标
#
# 1. CP 切什么、不切什么：每个 CP rank 拿到 `s / CP` 个 token 的全部字段，权重一点不切。
# 2. `get_batch_on_this_cp_rank` 为什么把序列切成 `2·CP` 块、每个 rank 拿"一头一尾"两块：causal mask 下每个 rank 的 attention 工作量。
# 3. 每个 rank 只有自己那部分 token 的 Q、K、V，attention 怎样仍然对整条序列做 softmax：K/V 绕 CP 环传递，前向 CP−1 跳、反向 CP 跳。
# 4. CP 在 rank 网格的哪一维（缺省 order `tp-cp-ep-dp-pp`），梯度为什么在 `get_data_parallel_group(with_context_parallel=True)` 里归约。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2612) | 本篇主角：看 batch 有没有 `cu_seqlens`，把它交给下面两种切法之一；`is_hybrid_cp` 必填，`cp_group` 不给时用整个 world（[`utils.py:2483`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2483)） |
# | [`utils.py::_get_batch_on_this_cp_rank_per_sequence_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2456) | 普通序列的切法：按 2·CP 块切 batch 的每个字段（本篇跑到的就是它） |
# | [`pretrain_gpt.py::get_batch`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L97) | 正式入口：先 TP 广播，再调第一行（[`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)） |
# | [`utils.py::_get_batch_on_this_cp_rank_per_document_balancing`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2406) | packed（THD）序列的切法，索引由 TE 算（第一行遇到 `cu_seqlens` 时转给它） |
# | [`parallel_state.py::get_context_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1828) | CP 群：K/V 在其中传递 |
# | [`parallel_state.py::get_data_parallel_group`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/parallel_state.py#L1758) | `with_context_parallel=True` 时是 DP×CP 群：梯度在其中归约 |
# | [`transformer_engine.py::TEDotProductAttention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1770) | 把 `cp_group`、`cp_global_ranks`、`cp_stream`、`cp_comm_type` 交给 TE |
# | [`transformer_config.py:987`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L987) | `cp_comm_type`：`p2p`（环）、`all_gather`、`a2a`、`a2a+p2p` |
# | [`dot_product_attention.py:57`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57) | 本地实现的 attention 断言 CP = 1 |
# | [`rope_utils.py::get_pos_emb_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L48) | RoPE 表按同样的两块切 |
# | [`rotary_pos_embedding.py:261`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L261) | RoPE 表的长度乘回 CP（本地只有 s/CP 个 token） |
# | [`finalize_model_grads.py:689`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L689) | token 数在 DP×CP 群里求和 |
# | [`distributed_data_parallel.py:228`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L228) | DDP 的梯度缩放是 1 / (DP×CP 群大小) |

# %% [markdown]
# ## 调用链
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
#       └─ Transformer Engine 的 CP attention                          # K/V 绕 CP 环 send / recv
#                                                                     #   （本篇：snippets/cp/ring_attention.py）
# pretrain_gpt.py::loss_func                                          # 只对本地 token 求 loss 和与 token 数
# finalize_model_grads / DDP                                          # 梯度、token 数在 dp-cp 群 all-reduce
# ```
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_batch` | data iterator、`vp_stage` | 按 `BATCH_KEYS` 字母序的 10 个字段（`attention_mask, cu_seqlens, …, tokens`）；`PackedSeqParams` 由 `forward_step` 用其中的 `cu_seqlens` 等拼出 | `get_batch_on_this_tp_rank`、`flatten_batch_for_packed_sequences`、`get_batch_on_this_cp_rank` | TP 广播；CP 只读坐标 | 是：按 CP 切序列 | 否（TP rank 0 推进 iterator） | `forward_step_func` 里取数据 |
# | `get_batch_on_this_cp_rank` | batch dict、`is_hybrid_cp`（必填）、`cp_group`（缺省 `None` = 整个 world）、`hybrid_cp_group_func`、`use_per_sequence_balancing` | 同一个 dict，每个序列字段的序列维变为 s/CP | `_get_batch_on_this_cp_rank_per_sequence_balancing` / `_per_document_balancing` | 用 `cp_group` 的大小与 rank，无通信 | **是**：每个字段取第 `cp_rank` 与 `2·CP−1−cp_rank` 块 | 否 | 同上 |
# | `TEDotProductAttention.__init__` | config、mask 类型、`cp_comm_type`、`pg_collection` | 模块 | `get_context_parallel_group` | 是：把 CP 群交给 TE | 否 | 建一条类级 `cp_stream` | 构造模型 |
# | `get_pos_emb_on_this_cp_rank` | RoPE 表、序列维、`cp_group` | 本 rank 两块位置的 RoPE | 无 | 只读 CP 坐标 | 是：与 batch 同样的切法 | 否 | forward |
# | `ring_attention`（本站） | 本地 `q, k, v` `[s/CP, b, np, hn]`、`cp_group` | 本地输出 | 无（torch.distributed） | **是**：CP 群内 p2p | 否（K/V 只是路过） | 否 | forward / backward |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n16_cp import (batch_on_cp_rank, make_batch, ring_table, ring_vs_full, shapes,
                                         split_table, work_table)
from snippets.ranks.groups import describe_rank, rank_table
from snippets.ranks.launch import RankError, run_ranks
from snippets.record.recorder import record
from snippets.cp.ring_attention import causal_attention, causal_pairs, chunk_positions, ring_attention
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.cp import pictures

import torch
import torch.distributed as dist

# %% [markdown]
# ## 关键对象
#
# ### 一个 batch 的五个字段
#
# GPT 的 micro-batch 是一个 dict（来历见笔记 03）：`tokens`、`labels`、`loss_mask`、`position_ids` 形状
# `[b, s]`，`attention_mask` 形状 `[b, 1, s, s]`（Megatron 的约定：`True` 表示**遮住**）。
# 下面造一个 `s = 16` 的 batch，token 取 `100, 101, …`，方便认出每个 rank 拿到了哪些位置。
#
# 本篇在 rank 上跑的函数和 `make_batch` 都在 `snippets/experiments/n16_cp.py` 里，
# 序列长度、micro-batch、head 数和 head 维是参数 `dims`，本篇用它的 `tiny`（s = 16、b = 1、2 个 head、head 维 4）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(make_batch)

# %%
TINY = EXPERIMENTS["cp"].tiny
print({k: list(v.shape) for k, v in make_batch(TINY.seq).items()})

# %% [markdown]
# ### 真实的 `get_batch_on_this_cp_rank`，CP = 2 与 CP = 4
#
# 每个 rank 调 `initialize_model_parallel(context_parallel_size=CP)`，再把同一个 batch 交给真实函数，
# 参数和正式入口一样：`is_hybrid_cp=False`、`cp_group=get_context_parallel_group()`（[`pretrain_gpt.py:167`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)）。
# （Megatron 的 import 写在 rank 函数里：rank 进程从已经导入过 Megatron 的内核 fork 出来，不再花时间；
# notebook 进程自己只做表格和算术，用不着它。）

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(batch_on_cp_rank)

# %%
split_table(run_ranks(batch_on_cp_rank, 2, TINY, 2, grid=dict(cp=2)), 2, TINY.seq)

# %%
cp4_table = split_table(run_ranks(batch_on_cp_rank, 4, TINY, 4, grid=dict(cp=4)), 4, TINY.seq)
cp4_table

# %% [markdown]
# 读出来的规则：序列切成 `2·CP` 块，CP rank `r` 拿第 `r` 块和第 `2·CP−1−r` 块，**按这个顺序拼在一起**
# （rank 0 的 `position_ids` 是 `0…3, 12…15`，不是连续的）。每个字段都在序列维切：`[b, s]` 的第 1 维，
# `attention_mask` 的第 2 维（query 维）——它的最后一维（key 维）仍是完整的 16：每个本地 query 仍要面对整条序列的 key。
# 这一步**没有任何通信**：每个 rank 本来就拿到了整条序列（TP 广播之后），只是各自留下自己的两块。
# 还要注意标题里的 `True`：函数**就地改写**传入的 dict 再把它返回，调用之后原来那份整条序列就不在了
# （下面的 DP×CP 实验因此先复制一份再切）。
# `snippets.cp.ring_attention.chunk_positions(cp_rank, cp_size, seq_len)` 是同一规则的算术版，逐 rank 和真实函数的结果相同：

# %%
print(all(chunk_positions(r, 4, 16).tolist() == row[2] for r, row in enumerate(cp4_table.rows)))

# %% [markdown]
# ### 为什么是 2·CP 块：causal mask 下的工作量
#
# causal attention 里位置 `p` 的 query 看 `p + 1` 个 key，越靠后的 token 越"贵"。把每个 rank 的 query 位置代进去，
# 数 causal mask 保留的 (query, key) 对数，就是这个 rank 的 attention 计算量。朴素切法把序列连续切成 CP 段；
# Megatron 的切法取一头一尾：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(work_table)

# %%
rows = work_table(2, 16) + work_table(4, 16) + work_table(4, 4096)
Table(["CP", "s", "cp_rank", "连续切：(q, k) 对数", "2·CP 块切：(q, k) 对数"], rows)

# %% [markdown]
# 连续切时最后一个 rank 的工作量是第一个的 3 倍（CP=2）到 7 倍（CP=4）；每一步 attention 都要等最慢的 rank，
# 整体就按最慢的算。一头一尾的两块正好互补（第 `r` 块轻、第 `2·CP−1−r` 块重），每个 rank 分到的对数完全相同。
# 把 CP=4 的切法（上面 `cp4_table` 的 `position_ids`）和这张表的 CP=4、s=16 几行画在一起：上面一条是 8 块各归哪个 rank，
# 下面是 causal mask 的下三角，query 行按持有者上色，右边是每个 rank 保留的 (q, k) 对数。

# %%
pictures.draw_cp_split(cp4_table.rows, work_table(4, 16))

# %% [markdown]
# 最慢 rank 与平均值之比：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def imbalance(cp, seq_len):
    rows = work_table(cp, seq_len)
    mean = sum(r[3] for r in rows) / cp
    return round(max(r[3] for r in rows) / mean, 4), round(max(r[4] for r in rows) / mean, 4)


Table(["CP", "s", "连续切 max/mean", "2·CP 块切 max/mean"],
      [[cp, s, *imbalance(cp, s)] for cp, s in ((2, 16), (4, 16), (4, 4096), (8, 4096))])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### attention 怎样看见整条序列：K/V 绕环
#
# 每个 rank 只为自己的 `s/CP` 个 token 算出 Q、K、V。要得到整条序列上的 softmax，Megatron 把 attention 交给
# Transformer Engine：`TEDotProductAttention` 在 CP > 1 时把 `cp_group`、`cp_global_ranks`、一条 `cp_stream`
# 和 `cp_comm_type`（缺省 `"p2p"`）传给 TE 的 attention。`p2p` 就是 ring attention：
#
# - 第 `i` 步，CP rank `r` 手里是 CP rank `(r − i) mod CP` 的 K/V 块；用本地 query 对它算一块 attention（mask 按**全局位置**），
#   用 log-sum-exp 把这一块并进累计的输出；同时把手里的块发给 `r + 1`、从 `r − 1` 收下一块。
# - 反向再绕一圈：每个 rank 把自己的 query 对这块 K/V 的梯度加进 `dK`、`dV`，连同块一起往下传；
#   第 CP 跳时梯度回到块的主人手里，已经包含所有 rank 的贡献。
#
# TE 在本机装不上（它需要 GPU），`snippets/cp/ring_attention.py` 用几十行 torch 写了同一件事（自定义 `autograd.Function`，
# 前向、反向各一个环），通信用 `torch.distributed.batch_isend_irecv`。下面在 CP=2 与 CP=4 上验证：每个 rank
# 的 `q, k, v` 取自真实 `get_batch_on_this_cp_rank` 给出的 `position_ids`，与单进程整条序列上的 causal attention
# 比较输出和三个梯度：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(ring_vs_full)

# %%
ring2 = run_ranks(ring_vs_full, 2, TINY, 2, grid=dict(cp=2))
ring4 = run_ranks(ring_vs_full, 4, TINY, 4, grid=dict(cp=4))
Table(["CP", "rank", "输出相等", "dQ 相等", "dK 相等", "dV 相等"],
      [[cp, rank, *same] for cp, result in ((2, ring2), (4, ring4))
       for rank, (same, _) in enumerate(result)])

# %% [markdown]
# 每个 rank 记录到的通信（CP=4、rank 1 的完整记录；每一行是一次 `batch_isend_irecv`，含一个 isend 和一个 irecv）：

# %%
ring_table(ring4[1][1])

# %% [markdown]
# 形状 `[2, 4, 1, 2, 4]` 是 K、V 叠在一起：`[2, s/CP, b, np, hn]`。前向 CP−1 = 3 跳（最后一块不必再传），
# 反向 CP = 4 跳：前 3 跳带着 K/V 和它们的梯度 `[4, …]`，最后一跳只送梯度回家。环上每个 rank 只和两个邻居说话：
# rank 1 发给 2、从 0 收。
#
# ### 每一步的工作量：一头一尾让每一步都均衡
#
# 环的每一步都是"本地 query × 一块 K/V"。用 `chunk_positions` 数每一步 causal mask 保留的对数（CP=4、s=16）：

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
# 第 0 步是对角块（自己的 K/V），之后每一步每个 rank 都恰好做**半块**（16 对中的 8 对）：
# K/V 来自编号更小的 rank 时，本地两块 query 只看得见它的第一块；来自编号更大的 rank 时，只有本地第二块 query 看得见它的两块。
# TE 正是利用这一点每步只算一半；`snippets/cp/ring_attention.py` 为了好读，算整块再用 mask 清零，结果相同。
#
# ### CP 在 rank 网格里的位置，梯度在哪个群归约
#
# 缺省 `order="tp-cp-ep-dp-pp"`，CP 紧挨在 TP 右边（[笔记 08](../08_parallel_state_and_rank_generator/)）：
# TP=1、CP=2、DP=2 的 4 个 rank 上 rank = cp + 2·dp。下面在真实的 `initialize_model_parallel` 网格里跑一个小的
# "embedding → `linear_qkv` → ring attention → loss" 的前向和反向：两个 DP 副本各读一条样本，每条样本被 CP 切成两半。
# 所有 rank 的权重相同（同一个种子）；`linear_qkv.weight` 的梯度先看本地值，再分别在 CP 群、DP×CP 群里求和，
# 与单进程在整条序列上算出的梯度比较：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def cp_dp_step(seq_len=16, hidden=8, heads=2):
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    torch.manual_seed(0)  # the same weights on every rank: CP and DP ranks are replicas
    embedding = torch.nn.Embedding(200, hidden)
    linear_qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)

    def loss_of(tokens, attention):  # q, k, v laid out [s, b, np, hn] as in Megatron's attention
        x = embedding(tokens).transpose(0, 1)
        q, k, v = linear_qkv(x).view(*x.shape[:2], heads, -1).chunk(3, dim=-1)
        return attention(q, k, v).square().sum()

    samples = [make_batch(seq_len, first_token=100 + 50 * d) for d in range(2)]
    # a copy: get_batch_on_this_cp_rank rewrites the dict it is given; the reference needs it whole
    cp_group = parallel_state.get_context_parallel_group()
    local = get_batch_on_this_cp_rank(dict(samples[parallel_state.get_data_parallel_rank()]),
                                      is_hybrid_cp=False, cp_group=cp_group)
    with record() as calls:
        loss_of(local["tokens"], lambda q, k, v: ring_attention(q, k, v, cp_group)).backward()
        grad = linear_qkv.weight.grad
        over_cp = grad.clone()
        dist.all_reduce(over_cp, group=cp_group)  # only to explain; DDP does the next one
        over_dp_cp = grad.clone()
        dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        dist.all_reduce(over_dp_cp, group=dp_cp_group)

    full = []  # reference: each sample on one process, whole sequence, no CP
    for sample in samples:
        linear_qkv.weight.grad = None
        loss_of(sample["tokens"], causal_attention).backward()
        full.append(linear_qkv.weight.grad.clone())
    mine = full[parallel_state.get_data_parallel_rank()]
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    return dict(rank=describe_rank(), calls=calls, local=close(grad, mine), cp=close(over_cp, mine),
                dp_cp=close(over_dp_cp, full[0] + full[1]))


step = run_ranks(cp_dp_step, 4, grid=dict(cp=2))
rank_table([s["rank"] for s in step], kinds=("cp", "dp", "dp-cp"))

# %%
Table(["rank", "本地梯度 = 本样本整序列的", "CP 群求和后 = 本样本整序列的",
       "DP×CP 群求和后 = 两条样本之和"],
      [[i, s["local"], s["cp"], s["dp_cp"]] for i, s in enumerate(step)])

# %% [markdown]
# 同一次运行里 rank 2 的全部通信（`issued by` 为 `_ring_step` 的是环上的 p2p，后两行是我们发出的 all-reduce）：

# %%
Table(["#", "phase", "API", "group", "shape before → after", "issued by"],
      [[i, c.phase, c.api, f"{c.group} {list(c.ranks)}", shapes(c), c.where]
       for i, c in enumerate(step[2]["calls"], 1)])

# %% [markdown]
# 三件事：
#
# - **本地梯度不完整。** 一个 CP rank 的 loss 只含自己那一半 token，但权重同时作用于整条序列，
#   所以本地梯度只是一部分——哪怕环的反向已经把别的 rank 的 query 对本地 K、V 的梯度送了回来。
# - **CP 群内求和就够还原一条样本。** 两个 CP rank 的梯度相加，恰好等于单进程整条序列的梯度。
# - **DDP 用 DP×CP 群。** 再把不同样本相加，就是 DP 的那一份工作；两件事都是"对持有同一份权重的 rank 求和"，
#   所以 Megatron 把它们合成一个群 `dp-cp`（这里 `[0, 1, 2, 3]`），DDP 按 `1 / 群大小` 缩放
#   （[distributed_data_parallel.py 第 228 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L228)），`finalize_model_grads` 也在这个群里把 token 数加起来（[finalize_model_grads.py 第 689 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L689)）。
#   数据采样却用**不含** CP 的 DP 坐标：rank 0 和 1 的 `dp` 坐标都是 0，读同一条样本，才能各切一半。

# %% [markdown]
# ## 机制解释
#
# **切分只是索引。** `get_batch_on_this_cp_rank` 自己只做分派（[`utils.py:2652`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2652)）：
# batch 里没有 `cu_seqlens`（本篇、普通预训练）或打开了 `use_per_sequence_balancing` 时，交给
# `_get_batch_on_this_cp_rank_per_sequence_balancing`；它跳过 `cu_seqlens`、`max_seqlen` 这类元数据键，
# 把其余每个字段在序列维 `view` 成 `[…, 2·CP, s/(2·CP), …]`，用 `index_select` 取两块再压平
# （[`utils.py:2510`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2510)）。packed 序列（有 `cu_seqlens`）交给
# `_get_batch_on_this_cp_rank_per_document_balancing`，在每篇文档内部各自一头一尾。两者都不检查 `s` 能否被 `2·CP` 整除
# （不能时 `view` 直接报错，见自测 2），也不做任何通信：CP 的通信全在 attention 里。
#
# **`cp_group` 要自己传。** CP 的大小和坐标取自 `torch.distributed.get_world_size(cp_group)` 与 `get_rank(cp_group)`
# （[`utils.py:2483`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2483)）；`cp_group=None` 时这就是整个 world。在上面 CP=2、DP=2 的 4 个 rank 上
# 不传它，序列会被切成 8 块、按全局 rank 各取 4 个 token（rank 0 拿到 `0, 1, 14, 15`），不报错，只是错。
# 正式入口总是传 `get_context_parallel_group()`；`is_hybrid_cp` 没有缺省值，不传直接 `TypeError`。
#
# > **旧版（core_v0.18.0）：** 签名同样要求 `is_hybrid_cp`、`cp_group=None` 同样退到整个 world，但没有 `use_per_sequence_balancing`，
# > 两种切法叫 `get_pretrain_batch_on_this_cp_rank` 与 `get_sft_batch_on_this_cp_rank`（[`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/utils.py#L2369)）。
# > core_v0.16.1 的签名只有 `(batch, cp_group=None)`，不传 `cp_group` 时读 `parallel_state` 的 CP 坐标，所以 `get_batch_on_this_cp_rank(batch)` 就是对的（[`utils.py::get_batch_on_this_cp_rank`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.16.1/megatron/core/utils.py#L1994)）。
#
# **为什么 attention 之外不需要通信。** 除 attention 外，Transformer 的每一步（embedding、layernorm、MLP、
# `linear_qkv`、`linear_proj`、loss）都是逐 token 的，只要权重完整、token 齐全就能各算各的。
# 只有 attention 让一个 token 看到别的 token，所以 CP 只在这里交换数据；交换的是 K/V（每层 `2·(s/CP)·b·ng·hn` 个数一跳），
# 不是激活或权重。
#
# **合并 softmax 的公式。** 设某个 query 在第 `j` 块 K/V 上的 logsumexp 为 `L_j`、该块的归一化输出为 `O_j`，
# 则整条序列上的输出是 `Σ_j exp(L_j − L) · O_j`，其中 `L = logsumexp_j L_j`。所以每个 rank 只需保留一个累计的
# `(O, L)`，来一块并一块，和块到达的顺序无关；反向时用前向存下的 `L` 直接重算每块的概率，不必保存整个 `s×s` 矩阵。
#
# **为什么前向 CP−1 跳、反向 CP 跳。** 前向的 K/V 只需让每个 rank 都见过每一块，第 CP 块到手后就不必再传；
# 反向的 `dK`、`dV` 要从最后一个经过的 rank 送回主人，多一跳。
#
# **其他 `cp_comm_type`。** `all_gather`：先把整条 K/V 收齐再算，简单但不能与计算重叠；`a2a`：按 head 重新分
# （DeepSpeed Ulysses 的做法），每个 rank 对整条序列算一部分 head；`a2a+p2p`：机内 a2a、机间环。
# 它们都由 TE 实现，Megatron 只负责传参和建群（`get_hierarchical_context_parallel_groups`）。

# %% [markdown]
# ## 与训练主链路的关系
#
# CP 发生在 `forward_step` 的第一行 `get_batch` 里：TP 广播之后立刻按 CP 切（正式入口 [pretrain_gpt.py 第 167 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/pretrain_gpt.py#L167)；
# packed 序列由它转给 `_get_batch_on_this_cp_rank_per_document_balancing`）。之后整个模型只处理 `s/CP` 个 token，激活显存按 CP 缩小——
# 这是长序列训练要 CP 的原因。attention 里每层前向、反向各绕一圈环；`loss_func` 只对本地 token 求和并返回本地 token 数：
# 按 token 归一（`calculate_per_token_loss`）时 token 数在 DP×CP 群里相加，否则 schedule 先除以本地 token 数；
# 只返回两项的旧式 `loss_func` 则由 schedule 把 loss 乘以 CP 大小（[`schedules.py:340`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/pipeline_parallel/schedules.py#L340)）。
# DDP 在同一个群里归约梯度（[笔记 02](../02_distributed_initialization/) 展示了 `dp` 与 `dp-cp` 群的区别）。
# 优化器与 checkpoint 不知道 CP 的存在：CP 各 rank 的权重和优化器状态本来就是副本（分布式优化器按 `dp-cp` 切分状态，笔记 15）。
#
# ### 两种 loss 契约在 CP 下给出什么梯度
#
# [笔记 05](../05_forward_loss_backward/) 留下一个问题：`loss_func` 返回两项时 schedule 把 loss 乘以 CP 大小，返回三项时不乘，
# 两条路在 CP>1 时梯度是否一样？下面在 CP=2、DP=2 的 4 个 rank 上各走一遍真实的训练接线：一个小的
# "embedding → `linear_qkv` → ring attention → 输出层 → 逐 token 交叉熵" 模型，包进 Megatron 的 `DistributedDataParallel`，
# 由 `get_forward_backward_func()` 驱动，`config.finalize_model_grads_func = finalize_model_grads`（正式入口就是这样接的）。
# 每个 DP rank 读一条 8 个 token 的样本，`get_batch_on_this_cp_rank` 把它切给两个 CP rank。`loss_func` 有四种写法：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments.n16_loss_contracts import MASKS, VARIANTS, TinyAttentionLM, contracts_step

Table(["写法", "返回几项", "loss 怎么算", "calculate_per_token_loss"],
      [[name, values, how, per_token] for name, (values, how, per_token) in VARIANTS.items()])

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(TinyAttentionLM, contracts_step)

# %% [markdown]
# 两组 loss mask：`even` 两条样本都算满 8 个 token；`uneven` 第二条只算前 3 个，切开后它的 CP rank 0 有 2 个、CP rank 1 有 1 个。
# DDP 归约、`finalize_model_grads` 之后，把 `linear_qkv` 的 `main_grad` 与单进程在整条序列上算的两种平均比较：
# "各样本 token 平均的平均"（每条样本等权）和"全体 token 平均"（每个 token 等权）。最后一列是梯度范数与前者之比。

# %%
contracts = run_ranks(contracts_step, 4, grid=dict(cp=2))
same_on_all = all({k: v for k, v in c.items() if k[1] != "local_tokens"} ==
                  {k: v for k, v in contracts[0].items() if k[1] != "local_tokens"} for c in contracts)
print("各 rank 的 loss token 数:", {mask: [c[mask, "local_tokens"] for c in contracts] for mask in MASKS},
      " 四个 rank 的结论相同:", same_on_all)
Table(["mask", "写法", "= 各样本 token 平均的平均", "= 全体 token 平均", "梯度范数比"],
      [[mask, name, *contracts[0][mask, name].values()] for mask in MASKS for name in VARIANTS])

# %% [markdown]
# 读法（设每条样本 n 个 loss token，CP rank c 上有 n_c 个、loss 和为 S_c；DDP 缺省对 DP×CP 的 4 份梯度求和再除以 4）：
#
# - **两项、本地平均（`two_local_mean`）多了 CP 倍。** 每个 rank 交出 `S_c / n_c`，n_c = n/CP 时就是 `CP · S_c / n`，schedule 再乘 CP，
#   两个 CP rank 相加得 `CP² · S / n`；DDP 的 ÷(DP·CP) 只抵掉一个 CP。`even` 时正好是 2 倍。simple loop 的 `loss_func` 就是这样写的，
#   它不切 CP，所以看不出来；两项契约要求 `loss_func` 自己在 CP 群里合计 token 数。
# - **两项、CP 群合计（`two_cp_mean`）是"每条样本等权"。** 分母是整条样本的 n，乘 CP 正好抵掉 DDP 多除的 CP，两组 mask 下都等于
#   各样本 token 平均的平均。这就是 schedule 里"保持旧的平均方式"那一支服务的写法：tag `core_v0.5.0` 的 `pretrain_gpt.py`
#   在 CP 群里合计 loss 和与 token 数再相除，由它自己乘 CP；后来乘 CP 这一步挪进了 schedule。
# - **三项（`pretrain_gpt.py` 的缺省）是"每个 CP 分片等权"。** schedule 用本地 token 数去除，每个 CP rank 交出自己分片的平均，
#   DDP 再对 4 份取平均。分片 token 数相同（`even`）时与前者一致；不同（`uneven`：2 个对 1 个）时两种平均都不是。
# - **三项加 `calculate_per_token_loss` 是"每个 token 等权"。** 除法推迟到 `finalize_model_grads`：token 数在 DP×CP 群里
#   加起来，再用它缩放梯度，DDP 只求和不平均。结果总等于全体 token 平均，与怎么切无关。
#
# 所以两条路在 loss token 均匀分布时给出同样的梯度；一旦 loss mask 让 CP 分片的 token 数不同，只有打开
# `calculate_per_token_loss` 才与切法无关（笔记 05 的遗留问题 2 是同一件事在 micro-batch 方向上的样子）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **online softmax**：flash attention 在一块 SRAM 里分块算 softmax，用的就是上面的 `(O, L)` 合并；ring attention
#   把"块"从片上内存搬到了不同的 GPU，公式不变。
# - **causal mask 的三角形**：整条序列 `s(s+1)/2` 个 (q, k) 对，连续切会把三角形切成面积递增的梯形；
#   一头一尾两块拼成的面积处处相等。
# - **数据并行的推广**：对权重而言，CP 的各 rank 与 DP 副本没有区别（同一份权重、不同的 token），所以梯度一起求和。

# %% [markdown]
# ## 遗留问题
#
# 1. **本地 attention 不支持 CP（运行确认）。** 本地 spec 的 `DotProductAttention` 在构造时断言
#    `context_parallel_size == 1`（[dot_product_attention.py 第 57 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L57)）：CP 只有 TE 这一条路，local spec 不能训练 CP。
# 2. **RoPE 的 CP 切分在 CPU 上跑不了（运行确认）。** `get_pos_emb_on_this_cp_rank` 用 `pin_memory=True` 建索引再 `.cuda()`
#    （[rope_utils.py 第 62–64 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L62-L64)），没有 GPU 时第一步就报错。本站的补丁都没有覆盖它（本篇的例子不用 RoPE）；
#    要在 CPU 上跑带 RoPE 的 CP 模型，需要再加一个只作用于 `rope_utils` 的补丁。
# 3. **TE 替我们做了什么。** 真实的 CP attention 在 TE 里：把每步的 send / recv 放在 `cp_stream` 上与计算重叠、
#    每步只算可见的半块、支持 GQA / packed THD（`_get_batch_on_this_cp_rank_per_document_balancing` 的索引由 TE 的
#    `thd_get_partitioned_indices` 计算，[utils.py 第 2441 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/utils.py#L2441)）、以及 `all_gather` / `a2a` 两种变体。
#    本站的 ring attention 只复现了数学和通信的形状，不复现这些优化。
# 4. **`TransformerConfig` 的缺省值触发它自己的弃用警告。** `cuda_graph_modules`（原来的 `cuda_graph_scope`）缺省是 `"full"`
#    （[transformer_config.py 第 1047 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)），`__post_init__` 见到 `"full"` 就警告它已弃用（[transformer_config.py 第 2415 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)），
#    所以每次构造 `TransformerConfig` 都会警告一次；下面的单元格把这条警告滤掉，免得它写进 stderr。

# %%
def local_attention_and_rope():
    import warnings

    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rope_utils import get_pos_emb_on_this_cp_rank
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    warnings.filterwarnings("ignore", message="full scope is deprecated")  # 遗留问题 4
    parallel_state.initialize_model_parallel(context_parallel_size=2)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                               context_parallel_size=2)
    found = []
    cp_group = parallel_state.get_context_parallel_group()
    for attempt in (lambda: DotProductAttention(config, 1, AttnMaskType.causal, "self"),
                    lambda: get_pos_emb_on_this_cp_rank(torch.zeros(16, 1, 1, 4), 0, cp_group)):
        try:
            attempt()
            found.append("ok")
        except (AssertionError, RuntimeError) as err:
            found.append(f"{type(err).__name__}: {err}")
    return found


for line in run_ranks(local_attention_and_rope, 2, grid=dict(cp=2))[0]:
    print(line)

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
# **3. CP = 4 时，一层 attention 的前向和反向各有几次 p2p 交换？每次发出多少个数？**
#
# <details><summary>答案</summary>
#
# 前向 3 次，每次 K、V 各 `(s/CP)·b·np·hn` = 4·1·2·4 = 32 个数，合 64 个；反向 4 次，前 3 次带上 dK、dV 共 128 个数，最后一次 64 个。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
calls = ring4[1][1]
for phase in ("forward", "backward"):
    sizes = [c.before.split(";")[0].removeprefix("isend") for c in calls if c.phase == phase]
    print(phase, len(sizes), sizes)

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
# **5. s = 4096 时，CP 从 4 变到 8，连续切分的最慢 rank 比平均慢多少？2·CP 块切呢？**
#
# <details><summary>答案</summary>
#
# 连续切：最慢 rank 的工作量约是平均的 `(2·CP − 1)/CP` 倍，CP=4 约 1.75、CP=8 约 1.875，越切越不均。
# 2·CP 块切两种情况都是 1.0。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(imbalance(4, 4096), imbalance(8, 4096))

# %% [markdown]
# ## 30-second answer
#
# Context parallelism splits one sample's sequence across the CP group; weights stay whole.
# `get_batch_on_this_cp_rank` cuts the sequence into 2·CP chunks and gives rank r chunks r and
# 2·CP−1−r, so under the causal mask every rank does the same attention work. Only attention needs
# other tokens: Transformer Engine passes K/V blocks around the CP ring, merging partial softmaxes with
# log-sum-exp; backward sends dK/dV home. CP ranks hold replicas of the weights, so gradients are
# reduced over the combined data-and-context-parallel group.
