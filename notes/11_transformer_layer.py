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
# # 11 一层 TransformerLayer 走一遍：Qwen3-8B 的维度，TP=2
#
# 面试里常有这样一问："Qwen3-8B 的一层切成 TP=2，每张卡存哪些 weight、一共多少参数？forward 和 backward 各通信几次、
# 是谁发出的？开了 sequence parallel 之后又变成什么？"本篇用 Megatron Core 0.19.0 真实的 `TransformerLayer` 回答：
# Qwen3-8B 尺寸的层只读 shape，结构相同的小层在 2 个进程上真的跑一遍，记下每次通信，再和 TP=1 逐个数值比较。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出一层每个子模块的类、TP=2 时每卡的 weight shape 和参数量。
# 2. 说清 forward、backward 各 2 次 all-reduce 从哪几行来；开 sequence parallel（SP）后换成什么，backward 为什么多 2 次 all-gather。
# 3. 读懂 `linear_qkv` 按 query group 交错存、`linear_fc1` 用 stride 2 的原因。
# 4. 说明 TP=2 与 TP=1 是同一个函数，以及哪些梯度要等 `finalize_model_grads` 之后才相等。
#
# **结论**
#
# - Qwen3-8B 一层 192,946,432 个参数：attention 41,943,296（含 QK norm 256）、MLP 150,994,944、两个 norm 8,192；TP=2 每卡 96,477,440。
# - 每卡 16 个 Q head、4 个 query group；4 个 linear 每卡的 weight shape 见下图。
# - 不开 SP：forward 2 次 all-reduce（`linear_proj`、`linear_fc2`），backward 2 次（`linear_qkv`、`linear_fc1`）；其余子模块不通信。
# - 开 SP：forward 2 次 all-gather + 2 次 reduce-scatter；backward 多出 2 次 all-gather，为算 weight 梯度拼回只存了 s/2 的输入。
# - QKV 按 query group 交错、`linear_fc1` 用 stride 2：每卡拿到整组 head 和成对的 gate/up，attention 与 SwiGLU 不用通信。
# - TP=2 的输出和梯度等于 TP=1；只有 QK norm（开 SP 时加上两个 norm）的梯度要等 `finalize_model_grads` all-reduce，开 SP 时 [72] 个元素。
#
# 先读：[笔记 09](../09_tp_mappings/)（f、g）、[笔记 10](../10_column_row_parallel_linear/)（列/行并行）；约 20 分钟。

# %% tags=["hide-input"]
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n11_tp_layer import (build_layer, forward_backward, layer_on_meta, run, submodule_table,
                                               weight_table)
from snippets.tp.layer_walk import (counts_by_submodule, layout, millions, owner_of, param_counts, qkv_rows, short,
                                    tp_shard)
from snippets.ranks.launch import run_ranks
from snippets.models.presets import PRESETS
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp import pictures

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

QWEN3_8B, TINY = PRESETS["qwen3-8b"], EXPERIMENTS["tp-layer"].tiny
meta = run_ranks(layer_on_meta, 2, QWEN3_8B, 2, grid=dict(tp=2))               # Qwen3-8B 的层，meta 设备
(one,) = (r[False] for r in run_ranks(run, 1, TINY, Parallel(world=1), keep_tensors=True))
tp2 = run_ranks(run, 2, TINY, Parallel(world=2, tp=2), keep_tensors=True, grid=dict(tp=2))
two, sp = [r[False] for r in tp2], [r[True] for r in tp2]
pictures.draw_layer_summary(weight_table(meta[0]).rows, submodule_table(tp2[0], tp=2).rows,
                            title="Qwen3-8B 的一层（TP=2）：不开 SP 前后向各 2 次 all-reduce；开 SP 后 backward 多 2 次 all-gather")

# %% [markdown]
# 每一列是一个**自己**发出 collective 的子模块（上面是 Qwen3-8B 每卡的 weight），每一行是一个阶段；整层按 forward 顺序的全图在「每个子模块发出的通信」。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n11_tp_layer.py`（实验名 `tp-layer`）。`build_layer` 用 `get_gpt_layer_local_spec`（只有
#   Megatron Core 自己的模块，不是缺省的 Transformer Engine spec）和 `build_module` 建真实的层，`use_cpu_initialization=True`：
#   Megatron 先按种子生成**完整的** weight 再切片，所以任何 TP 下种子相同、weight 就是同一份的切片，才能和 TP=1 逐元素比。
#   `layer_on_meta` 在 `torch.device("meta")` 下建 Qwen3-8B 尺寸的层（预设 `qwen3-8b`），只读 shape。
# - 图和通信表里的通信来自小层 `TINY`：与 Qwen3-8B 同样的开关（SwiGLU、RMSNorm、QK norm、无 bias），尺寸缩小为
#   hidden 32、8 个 Q head、4 个 query group、head_dim 4、ffn 48，输入 `[s, b, h] = [8, 2, 32]`（Q:KV 从 4:1 改成 2:1，
#   让 TP=2 时每卡有两个 group，交错看得清楚）。哪个子模块发哪种通信与尺寸无关，所以图把 Qwen3-8B 的 weight 和小层的通信画在一起。
# - `run` 在每个 rank 上先不开、再开 SP 各建一次层，包进 Megatron 的 `DistributedDataParallel`（DP=1）跑一次 forward + backward，
#   再调真实的 `finalize_model_grads`。记录器记下每个 collective，forward hook 和梯度 hook 把它归到发出它的子模块
#   （`self_attention` 也在追踪之列，用来抓它自己发出的通信）；通信表"含义"一列按（API, 发出它的函数）查 `MEANING` 表。
#   `keep_tensors=True` 把输出、梯度和记录带回笔记进程，好和 TP=1 比较。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 tp-layer --tp 2`（小层的表）；
#   `--nproc-per-node 2 tp-layer --dims qwen3-8b --seq 8 --micro-batch-size 2 --tp 2`（真尺寸的层在 CPU 上跑，激活是 `[8, 2, 4096]`）；
#   `--nproc-per-node 4 tp-layer --tp 4 --query-groups 2`（遗留问题 2）。整页：`scripts/execute_notes.sh notes/11_transformer_layer.py`。
# - 需要的 CPU 补丁见下面"遗留问题"的折叠部分和[在 CPU 上运行](../../cpu/)。
#
# </details>

# %% tags=["hide-input"]
listing(build_layer, layer_on_meta, forward_backward, run)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 只用 Megatron Core 自己模块的一层 spec |
# | [`transformer_layer.py::TransformerLayer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L309) | 按槽位逐个建子模块 |
# | [`transformer_layer.py::TransformerLayer.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L733) | `_forward_attention` 再 `_forward_mlp` |
# | [`attention.py::SelfAttention.get_query_key_value_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1812) | 按 query group 把融合的输出切成 Q、K、V |
# | [`mlp.py::MLP.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L172) | GLU 时 `linear_fc1` 宽度翻倍、stride 2 |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | `linear_qkv`、`linear_fc1` |
# | [`layers.py::RowParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1430) | `linear_proj`、`linear_fc2`，末尾 all-reduce 或 reduce-scatter |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | 列并行的 backward：输入梯度 all-reduce；SP 时再 all-gather 输入、reduce-scatter 梯度 |
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | 先建完整 weight，再按 `partition_dim`、`stride` 切 |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | 在 TP 群里对 norm 的梯度求和 |
#
# <details><summary>其余 14 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`gpt_layer_specs.py::get_gpt_layer_local_submodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L359) | 逐个槽位填零件；`mlp` 槽位是 `partial(MLP.as_mlp_submodule, submodules=…)` |
# | [`backends.py::LocalSpecProvider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L99) | local spec 的零件：列/行并行 linear、`DotProductAttention`、norm |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 按 spec 实例化模块（函数原样返回） |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层有哪些槽位 |
# | [`transformer_layer.py::TransformerLayer._forward_attention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L569) | norm → attention → bias-dropout-add |
# | [`transformer_layer.py::TransformerLayer._forward_mlp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L802) | norm → MLP → bias-dropout-add |
# | [`attention.py::SelfAttention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1651) | `linear_qkv` 的输出宽度 = Q + 2·KV |
# | [`attention.py::Attention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L296) | 每卡几个 head、几个 query group |
# | [`attention.py::Attention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1278) | 切 QKV → RoPE → core attention → `linear_proj` |
# | [`dot_product_attention.py::DotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L142) | 本卡的 head 上算 softmax(QKᵀ)V |
# | [`mlp.py::MLP.as_mlp_submodule`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L389) | 层调用的 `mlp` builder：从 `pg_collection` 取 TP 群，再构造 `MLP` |
# | [`mlp.py::MLP.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L258) | fc1 → 激活（`glu`）→ fc2 |
# | [`fused_bias_dropout.py::get_bias_dropout_add`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fusions/fused_bias_dropout.py#L83) | `self_attn_bda`、`mlp_bda` |
# | [`torch_norm.py::WrappedTorchNorm.__new__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L33) | 没有 Apex / TE 时的 norm（拒绝 SP，见遗留问题） |
#
# </details>

# %% [markdown]
# ## 调用链
#
# 一层 = `_forward_attention`（norm → attention → bias-dropout-add）再 `_forward_mlp`（norm → MLP → bias-dropout-add）；
# 通信只在 4 个 linear 里，外加训练步末尾 `finalize_model_grads` 对 norm 梯度的一次 TP all-reduce。
#
# <details><summary>完整调用链</summary>
#
# ```text
# megatron/core/transformer/transformer_layer.py::TransformerLayer.forward         # 输入 [s, b, h]（SP 时 [s/TP, b, h]）
# ├─ _forward_attention
# │  ├─ input_layernorm                       (RMSNorm)                           # 本卡算完整的 [s, b, h]，不通信
# │  ├─ attention.py::Attention.forward
# │  │  ├─ SelfAttention.get_query_key_value_tensors
# │  │  │  ├─ linear_qkv  ColumnParallelLinear.forward                            # fwd: SP 时 all-gather 输入；bwd: 输入梯度 all-reduce（SP: reduce-scatter）
# │  │  │  │  └─ layers.py::linear_with_grad_accumulation_and_async_allreduce
# │  │  │  ├─ view → [s, b, ng/TP, (np/ng + 2)·hn] → split 成 Q、K、V                # 纯本地
# │  │  │  └─ q_layernorm、k_layernorm (RMSNorm，每个 head 上)                      # 纯本地
# │  │  ├─ (RoPE，本篇不传 rotary_pos_emb)                                           # 纯本地
# │  │  ├─ core_attention  dot_product_attention.py::DotProductAttention.forward    # 只算本卡的 head，不通信
# │  │  └─ linear_proj  RowParallelLinear.forward                                  # fwd: all-reduce（SP: reduce-scatter）
# │  │     └─ mappings.py::reduce_from_tensor_model_parallel_region               #   = g；SP 时 reduce_scatter_to_sequence_parallel_region
# │  └─ self_attn_bda  get_bias_dropout_add                                         # + residual，不通信
# └─ _forward_mlp
#    ├─ pre_mlp_layernorm                     (RMSNorm)                           # 不通信
#    ├─ mlp.py::MLP.forward
#    │  ├─ linear_fc1  ColumnParallelLinear.forward                                # 同 linear_qkv
#    │  ├─ glu: silu(gate) * up                                                    # 本卡的 [gate 片, up 片]，不通信
#    │  └─ linear_fc2  RowParallelLinear.forward                                   # 同 linear_proj
#    └─ _forward_post_mlp → mlp_bda                                               # + residual，不通信
# (训练步末尾) distributed/finalize_model_grads.py::finalize_model_grads
# └─ _allreduce_non_tensor_model_parallel_grads                                    # TP 群 all-reduce：QK norm（和 SP 时的两个 norm）的梯度
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `ColumnParallelLinear.forward`、`RowParallelLinear.forward` 的记录在[笔记 10](../10_column_row_parallel_linear/)（在一层里：列并行是 `linear_qkv`、`linear_fc1`，行并行是 `linear_proj`、`linear_fc2`）。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_gpt_layer_local_spec` | `qk_layernorm`、`normalization` 等开关 | 一个 `ModuleSpec`（类 + 子模块槽位） | `get_gpt_layer_local_submodules`、`LocalSpecProvider` | 否 | 否 | 否 | `model_provider` 里选 spec |
# | `TransformerLayer.__init__` | config、spec 的 submodules、`pg_collection` | 建好的各子模块 | `build_module`（attention、bda）、norm 与 `mlp` 的 builder（`MLP.as_mlp_submodule`） | 读 TP 群（`pg_collection.tp`） | 是：各 linear 按 TP 切 weight | 建参数 | 建模型 |
# | `TransformerLayer.forward` | `[s, b, h]`、mask、RoPE | `[s, b, h]`、context | `_forward_attention`、`_forward_mlp` | 间接（通过 linear） | 激活按 head / ffn 维切（SP 时还按 s 切） | 否 | `forward_step` |
# | `SelfAttention.get_query_key_value_tensors` | 归一化后的 `[s, b, h]` | 本卡的 Q `[s, b, np/TP, hn]`、K、V `[s, b, ng/TP, hn]` | `linear_qkv`、QK norm | 只在 ng < TP 时（遗留问题 2） | 是：本卡拿整组的 head | 否 | `forward_step` |
# | `DotProductAttention.forward` | 本卡的 Q、K、V、mask | `[s, b, np/TP·hn]` | `FusedScaleMaskSoftmax`、dropout（RNG tracker） | 否 | 按 head | 否 | `forward_step` |
# | `MLP.forward` | `[s, b, h]` | `[s, b, h]`、bias | `linear_fc1`、`glu`、`linear_fc2` | 间接 | 按 ffn 维 | 否 | `forward_step` |
# | `get_bias_dropout_add` | `training`、`fused` | 一个函数：x + bias → dropout → + residual | 无 | 否 | 否 | 否 | `forward_step` |
# | `_allreduce_non_tensor_model_parallel_grads` | 模型块、config | 无（就地改梯度） | 无 | TP 群 all-reduce | 否 | 是：改梯度 | `finalize_model_grads`（optimizer step 之前） |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 一个 spec、一个 config
#
# 层的结构来自 spec：`get_gpt_layer_local_spec` 给出每个槽位放哪个类，`TransformerConfig` 给尺寸和开关（Qwen3-8B：
# hidden 4096、32 个 Q head、8 个 query group、head_dim 128、ffn 12288、SwiGLU、QK norm），`build_module(spec, config=…)` 把两者合成一个层：

# %%
spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
config = TransformerConfig(**{**QWEN3_8B.transformer_config_kwargs(), "num_layers": 1})
slots, attn_slots = spec.submodules, spec.submodules.self_attention.submodules
print(spec.module.__name__, "| norm:", slots.input_layernorm.__name__, "| attention:", slots.self_attention.module.__name__,
      "| mlp:", slots.mlp.func.__qualname__)
print("attention 的槽位:", {k: v.__name__ for k, v in vars(attn_slots).items() if isinstance(v, type)})
print("mlp 的槽位:", {k: v.__name__ for k, v in vars(slots.mlp.keywords["submodules"]).items() if isinstance(v, type)})
print("config:", config.hidden_size, config.num_attention_heads, config.num_query_groups, config.kv_channels,
      config.ffn_hidden_size, config.gated_linear_unit, config.qk_layernorm)

# %% [markdown]
# `WrappedTorchNorm` 是没有 Apex / TE 时的 norm；`mlp` 槽位是 builder `MLP.as_mlp_submodule`，它从 `pg_collection`
# 取 TP 群再构造 `MLP`。建不建 QK norm 最终由 `config.qk_layernorm` 决定
# （[`attention.py:1700`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1700)）：
# 关掉时 `q_layernorm`、`k_layernorm` 是 `None`（[`attention.py:1722`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1722)），
# spec 里若填了真正的 norm 类会直接报错。
#
# ### Qwen3-8B 的一层，每卡的 weight
#
# 在 `torch.device("meta")` 下建出的层，每个参数只有 shape 没有存储，193M 个参数不到一秒建完。Megatron 切片时给参数挂上
# `tensor_model_parallel`、`partition_dim`、`partition_stride`，下表就是从这些属性读出的（rank 0；rank 1 相同）：

# %% tags=["hide-input"]
print("device:", meta[0]["device"], " 每卡 Q head:", meta[0]["heads"], " 每卡 query group（= KV head）:", meta[0]["groups"])
weight_table(meta[0])

# %% [markdown]
# - 4 个 linear 都被切了：`linear_qkv`、`linear_fc1` 是**列并行**（切输出维 dim 0），`linear_proj`、`linear_fc2` 是**行并行**（切输入维 dim 1）。
# - 两个 norm 和 QK norm（q、k 各一个）每卡一份完整的（复制）。`self_attn_bda`、`mlp_bda`、`core_attention` 和激活（`glu` 里的 `silu`）没有参数。
# - `linear_fc1` 的 stride 是 2：每卡拿的不是前一半行，而是 gate 的一片**加** up 的一片（见"机制解释"）。
#
# 参数量：把每卡的参数加起来（被切的乘 TP，复制的只算一次），再按 config 的公式算一遍。QK norm 算进 attention 一行，
# "两个 norm"只指 `input_layernorm` 和 `pre_mlp_layernorm`：

# %% tags=["hide-input"]
rank0 = {r["name"]: r for r in meta[0]["rows"]}
per_rank = counts_by_submodule(meta[0]["rows"])
whole = {name: n * (2 if rank0[name + ".weight"]["sharded"] else 1) for name, n in per_rank.items()}
ATTENTION = ("self_attention.linear_qkv", "self_attention.q_layernorm", "self_attention.k_layernorm",
             "self_attention.linear_proj")
MLP = ("mlp.linear_fc1", "mlp.linear_fc2")
NORMS = ("input_layernorm", "pre_mlp_layernorm")
Table(["", "整层（TP=1）", "TP=2 每卡", "公式整层", "公式每卡"],
      [[label, sum(whole[n] for n in names), sum(per_rank[n] for n in names),
        sum(param_counts(config, 1)[n] for n in names), sum(param_counts(config, 2)[n] for n in names)]
       for label, names in (("attention（含 QK norm）", ATTENTION), ("MLP", MLP), ("两个 norm", NORMS),
                            ("一层合计", tuple(whole)))])

# %% [markdown]
# 一层 192,946,432 个参数，几乎全在 4 个 linear 里：norm 类参数一共 8,448 个（两个 norm 8,192，QK norm 256）。
# TP=2 每卡 96,477,440 = 4 个 linear 的一半 96,468,992 + 每卡都有的 8,448，常说的"每卡 96M"就是它取整。
#
# <details><summary>seed 000 带读里的每个数，逐个对照</summary>
#
# seed 000 把 weight 写成数学上 `x·W` 的形状 `[in, out]`，即 Megatron `weight.shape` 的转置：
#
# <!-- same-as-next-output -->
# | seed 000 的说法 | 值 |
# |---|---|
# | linear_qkv 输出宽度 Q + K + V | 4096 + 1024 + 1024 = 6144 |
# | linear_qkv 每卡宽度 | 3072 |
# | 每卡 Q head / KV head | 16 / 4 |
# | linear_proj 每卡 weight [in, out] | [2048, 4096] |
# | linear_fc1 宽度 / 每卡 | 2 × 12288 = 24576 / 12288 |
# | linear_fc2 每卡 weight [in, out] | [6144, 4096] |
# | attention 参数 | 42M |
# | MLP 参数 | 151M |
# | 每层参数 | 193M |
# | TP=2 每卡参数 | 96M |
#
# 下面这格从 config 和 meta 层算出同一张表。
#
# </details>

# %% tags=["hide-input"]
h, d = config.hidden_size, config.kv_channels
q_width, kv_width = config.num_attention_heads * d, config.num_query_groups * d
qkv, proj = rank0["self_attention.linear_qkv.weight"], rank0["self_attention.linear_proj.weight"]
fc1, fc2 = rank0["mlp.linear_fc1.weight"], rank0["mlp.linear_fc2.weight"]
Table(["seed 000 的说法", "值"], [
    ["linear_qkv 输出宽度 Q + K + V", f"{q_width} + {kv_width} + {kv_width} = {q_width + 2 * kv_width}"],
    ["linear_qkv 每卡宽度", qkv["shape"][0]],
    ["每卡 Q head / KV head", f"{meta[0]['heads']} / {meta[0]['groups']}"],
    ["linear_proj 每卡 weight [in, out]", proj["shape"][::-1]],
    ["linear_fc1 宽度 / 每卡", f"2 × {config.ffn_hidden_size} = {2 * config.ffn_hidden_size} / {fc1['shape'][0]}"],
    ["linear_fc2 每卡 weight [in, out]", fc2["shape"][::-1]],
    ["attention 参数", millions(sum(whole[n] for n in ATTENTION))],
    ["MLP 参数", millions(sum(whole[n] for n in MLP))],
    ["每层参数", millions(sum(whole.values()))],
    ["TP=2 每卡参数", millions(sum(per_rank.values()))],
])

# %% [markdown]
# ### 每个子模块发出的通信
#
# 小层在 2 个 rank 上跑一次 forward + backward，每次通信归到发出它的子模块（rank 0；rank 1 相同）。左边不开 SP，右边开 SP：

# %% tags=["hide-input"]
print("TP=2:", two[0]["calls"], "次通信，未归属的:", two[0]["missing"],
      " | SP:", sp[0]["calls"], "次通信，未归属的:", sp[0]["missing"])
submodule_table(tp2[0], tp=2)

# %% tags=["hide-input"]
pictures.draw_layer(weight_table(meta[0]).rows, submodule_table(tp2[0], tp=2).rows,
                    title="整层按 forward 顺序：只有 4 个 linear 发 collective，其余子模块不通信")

# %% [markdown]
# 表和图是同一份记录：图从上到下是 forward 的顺序，左两列不开 SP，右两列开 SP。不开 SP 时 4 次通信全在 4 个 linear 里；norm、切 QKV、core attention、bda、激活都不通信
# （"未归属的"是 0：没有一次通信发生在这些子模块之外）。开 SP 后是 10 次（forward 4、backward 6），仍然全在 4 个 linear 里。
#
# ## Tensor / Process Group 语义
#
# 所有通信都在 **TP 群**里（这里是 `[0, 1]`）。Qwen3-8B、TP=2 时每卡的激活形状，从 meta 层的 weight 形状读出：

# %% tags=["hide-input"]
Table(["位置", "不开 SP", "开 SP"], [
    ["层输入 / input_layernorm", f"[s, b, {h}]", f"[s/2, b, {h}]"],
    ["linear_qkv 输入（SP：all-gather 之后）", f"[s, b, {qkv['shape'][1]}]", f"[s, b, {qkv['shape'][1]}]"],
    ["linear_qkv 输出", f"[s, b, {qkv['shape'][0]}]", f"[s, b, {qkv['shape'][0]}]"],
    ["Q / K / V", f"[s, b, {meta[0]['heads']}, {d}] / [s, b, {meta[0]['groups']}, {d}] ×2", "同左"],
    ["core_attention 输出 = linear_proj 输入", f"[s, b, {proj['shape'][1]}]", f"[s, b, {proj['shape'][1]}]"],
    ["linear_proj 部分和 → 通信之后", f"[s, b, {proj['shape'][0]}] → all-reduce → [s, b, {h}]",
     f"[s, b, {proj['shape'][0]}] → reduce-scatter → [s/2, b, {h}]"],
    ["linear_fc1 输出 [gate 片, up 片]", f"[s, b, {fc1['shape'][0]}]", f"[s, b, {fc1['shape'][0]}]"],
    ["glu 之后 = linear_fc2 输入", f"[s, b, {fc2['shape'][1]}]", f"[s, b, {fc2['shape'][1]}]"],
    ["linear_fc2 部分和 → 通信之后", f"[s, b, {fc2['shape'][0]}] → all-reduce → [s, b, {h}]",
     f"[s, b, {fc2['shape'][0]}] → reduce-scatter → [s/2, b, {h}]"],
])

# %% [markdown]
# 只有两处张量是"完整的 h 宽"：层的输入输出和 norm；中间的 QKV、attention 输出、fc1/fc2 的激活都只有本卡的一半列。
# 行并行 linear 的输出是部分和，通信之后才完整。开 SP 后，逐 token 的部分（norm、dropout、residual）只拿 `s/2` 个 token。
#
# 小层每次通信的记录（rank 0，`[s, b, h] = [8, 2, 32]`），"issued by"是发出它的函数。不开 SP：

# %% tags=["hide-input"]
two[0]["comm"]

# %% [markdown]
# 开 SP（层的输入、输出都是 `[s/2, b, h] = [4, 2, 32]`）：

# %% tags=["hide-input"]
sp[0]["comm"]

# %% [markdown]
# ## 机制解释
#
# ### 每个 block 只要一次 forward 通信
#
# attention 和 MLP 都是"列并行 linear → 本地计算 → 行并行 linear"。列并行的输出按输出维切开，正好是下一步需要的切法
# （attention 按 head、SwiGLU 按 ffn 维，都是逐列独立的），所以中间不用拼；行并行把各卡的部分和相加才是完整结果——
# 这就是 forward 里唯一的 all-reduce（g，[`layers.py:1480`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1480)）。
# backward 反过来：行并行的输入梯度天然是切好的；列并行的输入被每卡各用了一次，输入梯度要把各卡的部分和相加（f 的 backward）。
# 这个 f 不是 `copy_to_tensor_model_parallel_region`：不开 SP、TP>1 时 `allreduce_dgrad` 为真
# （[`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)），
# 输入原样进 `linear_with_grad_accumulation_and_async_allreduce`，all-reduce 在它的 backward 里发出，好和 weight 梯度的计算重叠
# ——所以通信表里它的 issued by 是 `layers.py::backward`，而 g 是 `mappings.py::_reduce`。
#
# ### 开 SP：forward 通信量不变，backward 多 2 次 all-gather
#
# 下面在 2 个 rank 上直接调 SP 版的 `TransformerLayer`：每个 rank 只喂自己那 `s/2` 个 token，记下 backward 里每种通信由哪个函数发出：

# %%
def sp_backward(dims, tp):
    from collections import Counter
    from snippets.record import recorder
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, config = build_layer(dims, tp, sequence_parallel=True)        # TransformerLayer，config.sequence_parallel=True
    x = torch.randn(dims.seq // tp, dims.micro_batch_size, dims.hidden, requires_grad=True)
    causal = torch.triu(torch.ones(1, 1, dims.seq, dims.seq, dtype=torch.bool), diagonal=1)
    with recorder.record() as calls:
        y, _ = layer(x, attention_mask=causal)                          # TransformerLayer.forward
        y.pow(2).sum().backward()
    return sorted(Counter((c.phase, c.api, c.where) for c in calls).items())


for (phase, api, where), n in run_ranks(sp_backward, 2, TINY, 2, grid=dict(tp=2))[0]:
    print(f"{phase:8} {api:24} ×{n}  {where}")

# %% [markdown]
# SP 让 norm、dropout、residual 这些逐 token 的部分只算 `s/TP` 个 token：列并行 linear 在 forward 里先 all-gather 输入
# （`[s/2] → [s]`），行并行 linear 把 all-reduce 换成 reduce-scatter（`[s] → [s/2]`）。一次 all-reduce 的通信量 =
# 一次 reduce-scatter + 一次 all-gather，所以 forward 的通信量不变，激活内存却少了。backward 里：
#
# - 每次 reduce-scatter 的 backward 是 all-gather（2 次，`mappings.py::_gather_along_first_dim`）；
# - 每次 all-gather 的 backward 是 reduce-scatter（2 次，`layers.py::backward`）；
# - **多出来的 2 次 all-gather** 也在列并行 linear 的 backward 里（上面 `layers.py::backward` 的 all-gather）：forward 只保存了本卡
#   `[s/2]` 的输入，算 weight 梯度 `grad_outputᵀ · total_input` 却需要完整的 `[s]` 输入，于是再 all-gather 一次
#   （[`layers.py:617`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L617)）。
#
# 这是用通信换内存：不存 all-gather 之后的大输入。
#
# ### 融合的 QKV：按 query group 交错
#
# `linear_qkv` 的输出不是"先全部 Q，再全部 K，再全部 V"。`get_query_key_value_tensors` 把它 view 成
# `[s, b, 每卡 group 数, (每组 Q head 数 + 2) · head_dim]`，再在最后一维切成 Q、K、V：每个 query group 的行是
# "这一组的 Q head，然后它的 K head，然后 V head"。下面在 TP=2 的小层上调 Megatron 自己的切法，与按这条规则手工切出的
# weight 行算出的 Q、K、V 比较；再把 weight 第 0 列写成"全局行号"、输入取单位向量 e0，让 Megatron 切出的每个数就是它来自的行号：

# %%
def qkv_split(dims, tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, config = build_layer(dims, tp)
    attn, rank = layer.self_attention, parallel_state.get_tensor_model_parallel_rank()
    x = torch.randn(8, 2, dims.hidden)
    q, k, v = attn.get_query_key_value_tensors(x)                       # Megatron 的切法
    W, rows = attn.linear_qkv.weight, qkv_rows(dims.heads, dims.query_groups, dims.kv_channels, tp, rank, local=True)
    by_hand = {kind: torch.stack([x @ W[r].T for r in rows[kind]], dim=2) for kind in "qkv"}
    same = (torch.allclose(q, attn.q_layernorm(by_hand["q"]), atol=1e-6),
            torch.allclose(k, attn.k_layernorm(by_hand["k"]), atol=1e-6),
            torch.allclose(v, by_hand["v"], atol=1e-6))
    with torch.no_grad():                                                # 行号探针
        W.zero_()
        W[:, 0] = torch.arange(W.shape[0]) + rank * W.shape[0]
    attn.q_layernorm = attn.k_layernorm = None
    e0 = torch.zeros(1, 1, dims.hidden)
    e0[..., 0] = 1
    q, k, v = attn.get_query_key_value_tensors(e0)
    read_back = {kind: t[0, 0].long().tolist() for kind, t in zip("qkv", (q, k, v))}
    return dict(shape=list(W.shape), same=same, read_back=read_back)


split = run_ranks(qkv_split, 2, TINY, 2, grid=dict(tp=2))

# %% tags=["hide-input"]
per_rank_q, per_rank_kv = TINY.heads // 2, TINY.query_groups // 2
Table(["rank", "每卡 weight", "Q、K、V 与手工切相同", "Megatron 切出的顺序（全局 head 号）", "与 qkv_rows 相同"],
      [[rank, r["shape"], r["same"], layout(r["read_back"], rank * per_rank_q, rank * per_rank_kv),
        r["read_back"] == qkv_rows(8, 4, 4, 2, rank)] for rank, r in enumerate(split)])

# %% [markdown]
# 全局看就是 seed 000 写的 `q1 q2 k1 v1 | q3 q4 k2 v2 | …`（这里从 0 编号）。为什么这样存：一个 Q head 只和它所在 group 的 K、V head
# 做 attention。把"一组的 Q、K、V"放在相邻的行，列并行按行连续切成 TP 段时，只要 `num_query_groups` 能被 TP 整除，每段恰好是
# 整数个 group，每卡拿到的就是**完整的** query group，attention 完全本地；若先放全部 Q 再放全部 K、V，连续切一刀就会把 K、V
# 分到错的卡上。Qwen3-8B 每卡 4 个 group、每组 4 个 Q head：

# %% tags=["hide-input"]
for rank in range(2):
    print(f"rank {rank}:", layout(qkv_rows(32, 8, 128, 2, rank), rank * 16, rank * 4))
print("每卡行数:", len(sum(sum(qkv_rows(32, 8, 128, 2, 0).values(), []), [])), "= weight 的 dim 0:", qkv["shape"][0])

# %% [markdown]
# ### `linear_fc1` 的 stride 2
#
# SwiGLU 要 `silu(gate) * up`，gate 的第 i 列必须和 up 的第 i 列在同一卡。完整 weight 是 `[gate; up]`（各 ffn 行）。
# stride 2 让 [`_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184)
# 把它切成 `2·TP` 块、每卡取第 `rank` 和第 `rank+TP` 块，于是每卡的 fc1 输出是 `[本卡的 gate 片, 本卡的 up 片]`，
# `glu` 在本卡 `chunk(2)` 就配得上对（自测 5 用行号算给你看）。
#
# ### TP=2 等于 TP=1，但 norm 梯度要等 finalize
#
# 同一随机种子下，TP=2（和开 SP）的输出、输入梯度、每个参数的梯度与 TP=1 比较（被切的参数和 TP=1 梯度的对应切片比）。
# 梯度分两列：backward 刚结束时，和 `finalize_model_grads` 之后：

# %% tags=["hide-input"]
def compare(run, sequence_parallel):
    cat = (lambda key: torch.cat([r[key] for r in run])) if sequence_parallel else (lambda key: run[0][key])
    rows = [["输出 y", torch.allclose(cat("y"), one["y"], atol=1e-5), "—"],
            ["输入梯度 dx", torch.allclose(cat("dx"), one["dx"], atol=1e-5), "—"]]
    for name in one["grads"]:
        same = [all(torch.allclose(r[key][name], tp_shard(one["grads"][name], r["params"][name], rank, 2),
                                   atol=1e-5) for rank, r in enumerate(run)) for key in ("before", "grads")]
        rows.append([short(name), *same])
    return rows


Table(["", "TP=2 backward 后", "TP=2 finalize 后", "SP backward 后", "SP finalize 后"],
      [[a[0], a[1], a[2], b[1], b[2]] for a, b in zip(compare(two, False), compare(sp, True))])

# %% [markdown]
# 4 个 linear 的梯度一 backward 完就等于 TP=1 的切片。有两类参数例外（表里 backward 后的 `False`），都靠 `finalize_model_grads` 补上：
#
# - **QK norm**（不开 SP 也是）：`q_layernorm` 作用在每个 head 上，每卡只有自己那一半 head，每卡的梯度只是部分和。
#   `_allreduce_non_tensor_model_parallel_grads` 按**参数名**里有没有 `q_layernorm`/`k_layernorm` 把它们挑出来在 TP 群求和
#   （[`finalize_model_grads.py:452`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L452)）。
# - **开 SP 时的两个 norm**：每卡只看到一半 token，梯度也是部分和；靠参数上的 `sequence_parallel` 标记被挑出来。
#
# 这一步发出的通信（DP=1，所以 DDP 自己的那次 all-reduce 只有 1 个成员）：

# %% tags=["hide-input"]
Table(["API", "group", "shape", "issued by"], sp[0]["finalize"])

# %% [markdown]
# `[72]` = 两个 norm 各 32 + QK norm 各 4，拼成一个扁平张量一次 all-reduce（不开 SP 时只有 QK norm 的 8 个）。

# %% [markdown]
# ## 与训练主链路的关系
#
# `GPTModel` 的 decoder 就是 N 个这样的层（笔记 04、05）。每层每个 micro-batch 的 forward 付 2 次 TP all-reduce、
# backward 再付 2 次；TP 群在机内（笔记 08），走 NVLink。
# backward 结束后 `finalize_model_grads` 先做 DP 梯度同步（笔记 14），再在 TP 群里把 QK norm（和 SP 时的 norm）的梯度求和，
# 然后才轮到 optimizer step。漏掉后一步，TP 各卡的 norm 权重会在第一步之后就各走各的。

# %% [markdown]
# ## 与基础知识的连接
#
# - **矩阵分块乘法**：`Y = X·Wᵀ`。按输出维切 W（列并行）得到 Y 的列块；按输入维切 W（行并行）得到 Y 的部分和。
#   列并行接行并行，中间的列块正好是行并行要的输入块——这就是 Megatron-LM 论文里 MLP 和 attention 的切法（笔记 09、10 单独讲 f、g 和两种 linear）。
# - **GQA**：32 个 Q head 共享 8 组 K、V，KV cache 和 K/V 投影都缩小到 1/4；它给 TP 加了一个约束：`num_query_groups` 最好能被 TP 整除。
# - **通信量**：ring all-reduce 每卡发送约 `2·(TP−1)/TP·N`，reduce-scatter 和 all-gather 各一半，所以 SP 不增加通信量。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **weight 存成 `[out, in]`。** seed 000 按数学上 `x·W` 写 `linear_proj` 每卡 `[2048, 4096]`；Megatron 的 `weight.shape` 是
#    `[4096, 2048]`（和 `nn.Linear` 一样）。做 checkpoint 转换时这个区别会咬人。
# 2. **TP 大于 KV head 数时多一次 all-gather。** `num_query_groups < TP` 时
#    `get_query_key_value_tensors` 先把 `linear_qkv` 的输出 all-gather 成完整宽度，再挑出本卡 group 的那一段
#    （[`attention.py:1852`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1852)）：
#    K、V 在两卡上重复。Qwen3-8B 只有 8 个 KV head，TP=16 就会走这条路。下面 8 个 Q head、2 个 group、TP=4 的运行：
#    forward 多一次 all-gather，backward 多一次 reduce-scatter，结果仍等于 TP=1。
# 3. **QK norm 的梯度靠参数名找。** `finalize_model_grads` 用 `"q_layernorm" in name` 挑出要在 TP 群求和的参数；
#    换个名字的自定义 QK norm 会被静默漏掉，TP 各卡的权重随之漂移（上表 backward 后的 `False` 就是漏掉时的值）。
# 4. **local spec 的 torch norm 不支持 SP。** [`torch_norm.py:50`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L50)
#    直接断言；Megatron 期望 SP 用 Apex 的 `FusedLayerNorm` 或 TE 的 norm，它们都把参数标成 `sequence_parallel`。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **SP 下的 torch norm**（坑 4）：CPU 补丁 `torch_norm_sequence_parallel` 只在 SP 时绕过断言，并补上 Apex / TE 会打的
#   `sequence_parallel` 标记；"SP finalize 后"那一列全是 True 说明标记被 `finalize_model_grads` 用上了（见[在 CPU 上运行](../../cpu/)）。
# - **不传 `attention_mask` 会在 CPU 上失败。** mask 为 `None` 时 softmax 用
#   [`utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39) 现建一个
#   `device="cuda"` 的因果 mask。本篇显式传 causal mask（GPT 的数据管线本来就给）。
# - **每个 `TransformerConfig` 都会发一条弃用警告。** `cuda_graph_modules`（原来的 `cuda_graph_scope`）的缺省值就是 `"full"`
#   （[`transformer_config.py:1047`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)），
#   而 `__post_init__` 见到 `"full"` 就警告它已弃用（[`transformer_config.py:2415`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)）。
#   无害，`snippets/__init__.py` 的已知警告过滤把它静音了。
# - 尺寸：小层见上面"本页怎么跑出来的"；Qwen3-8B 的层只建在 `meta` 设备上，不占内存。坑 2 的运行是 4 个 rank。
#
# </details>

# %% tags=["hide-input"]
GQA_TINY = TINY.replace(query_groups=2)
(gqa_one,) = (r[False] for r in run_ranks(run, 1, GQA_TINY, Parallel(world=1), keep_tensors=True))
gqa = [r[False] for r in run_ranks(run, 4, GQA_TINY, Parallel(world=4, tp=4), keep_tensors=True,
                                   grid=dict(tp=4))]
print("TP=4、2 个 group：输出等于 TP=1:", torch.allclose(gqa[0]["y"], gqa_one["y"], atol=1e-5),
      " linear_qkv 每卡 weight:", list(gqa[0]["params"]["self_attention.linear_qkv.weight"].shape))
gqa[0]["comm"]

# %% [markdown]
# `linear_qkv` 每卡 12 行 = 半个 group（一组 4 个 Q + K + V = 6 个 head × 4 = 24 行）。多出的两次通信由
# `self_attention` 自己（`get_query_key_value_tensors`）发出。
#
# <details><summary>表里 shape 的读法</summary>
#
# all-gather 先沿第 0 维收齐 `[32, 2, 12]`，再在本地拼成最后一维 `[8, 2, 48]`；backward 的 reduce-scatter 同理先把梯度重排成 `[64, 12]`。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. Qwen3-8B、TP=2，每卡 `linear_qkv` 的 weight 有多少行？怎么算？**
#
# <details><summary>答案</summary>
#
# 每卡 8/2 = 4 个 query group，每组 32/8 = 4 个 Q head 加 1 个 K、1 个 V，共 4 × 6 = 24 个 head，× 128 = 3072 行；weight 是 `[3072, 4096]`。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
groups_per_rank = QWEN3_8B.query_groups // 2
heads_per_group = QWEN3_8B.heads // QWEN3_8B.query_groups
print(groups_per_rank * (heads_per_group + 2) * QWEN3_8B.kv_channels, qkv["shape"])

# %% [markdown]
# **2. 同一层在 TP=4、TP=8 时每卡多少参数？**
#
# <details><summary>答案</summary>
#
# 4 个 linear 的 192,937,984 个参数除以 TP，再加每卡都有的 8,448 个 norm 参数（两个 norm 8,192 + QK norm 256）：TP=4 约 48.24M，TP=8 约 24.13M。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
for tp in (2, 4, 8):
    print(f"TP={tp}:", sum(param_counts(config, tp).values()))

# %% [markdown]
# **3. 开 SP 后，backward 里哪两次 all-gather 是"不开 SP 时没有对应物"的？谁发出的？**
#
# <details><summary>答案</summary>
#
# 列并行 linear（`linear_qkv`、`linear_fc1`）在自己的 backward 里重新 all-gather 输入，用来算 weight 梯度；
# 另外两次 all-gather 是行并行 reduce-scatter 的 backward，对应不开 SP 时"g 的 backward 什么也不做"。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
owner = owner_of(sp[0]["by_module"])
print([(owner[id(c)], c.where) for c in sp[0]["recorded"]
       if c.phase == "backward" and c.api == "all_gather_into_tensor" and c.where.endswith("layers.py::backward")])

# %% [markdown]
# **4. 小层（8 个 Q head、4 个 group、head_dim 4）TP=2 时，rank 1 的第一个 K head 用的是完整 weight 的哪些行？**
#
# <details><summary>答案</summary>
#
# 一组 2 个 Q + K + V = 16 行，rank 1 从第 2 组开始（第 32 行）：q4 在 32–35、q5 在 36–39，k2 在 40–43。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
print(qkv_rows(8, 4, 4, 2, 1)["k"][0], split[1]["read_back"]["k"][0])

# %% [markdown]
# **5. 小层 TP=2 时，rank 0 的 `linear_fc1` weight（48 行）是完整 fc1 weight（96 行 = gate 48 + up 48）的哪些行？**
#
# <details><summary>答案</summary>
#
# stride 2：完整的 96 行切成 `2·TP = 4` 块、每块 24 行，rank 0 拿第 0 块（gate 的 0–23）和第 2 块（up 的 48–71），
# 正好是 gate 和 up 的同一段列，`glu` 的 `chunk(2)` 在本卡就配得上对。
#
# </details>

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
rows_of = tp_shard(torch.arange(96).unsqueeze(1), two[0]["params"]["mlp.linear_fc1.weight"], 0, 2)[:, 0]
print(list(two[0]["params"]["mlp.linear_fc1.weight"].shape), rows_of[:3].tolist(), "…", rows_of[-3:].tolist(),
      "| gate 行:", int((rows_of < 48).sum()), " up 行:", int((rows_of >= 48).sum()))

# %% [markdown]
# ## 30-second answer
#
# A Megatron TransformerLayer is norm, SelfAttention, bias-dropout-add, norm, MLP, bias-dropout-add. At Qwen3-8B
# sizes with TP=2, linear_qkv and linear_fc1 are column-parallel ([3072, 4096] and [12288, 4096] per rank),
# linear_proj and linear_fc2 row-parallel ([4096, 2048], [4096, 6144]): about 193M parameters per layer, 96M per
# rank. Forward does two all-reduces, backward two. Sequence parallel swaps them for all-gathers and
# reduce-scatters, plus two backward all-gathers to rebuild inputs for weight gradients. QKV rows are interleaved
# per query group.
