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
# 第二轮第 4 篇。seed 000 的"带读：一层 TransformerLayer 的 forward"用 Qwen3-8B 的维度、TP=2 把一层从头走到尾。
# 这里把那段带读里的每个数都交给代码：Qwen3-8B 维度的**真实** `TransformerLayer` 建在 `meta` 设备上（只有 shape，
# 不占内存），读出每卡的 weight 和参数量；同一结构的小层在 2 个 gloo rank 上真的 forward + backward，记录每次通信、
# 把它归到发出它的子模块；再和同一随机种子的 TP=1 层逐个数值比较。用的是 `get_gpt_layer_local_spec`（只有 Megatron Core
# 自己的模块），不是缺省的 Transformer Engine spec。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出一层里每个子模块的类、TP=2 时每卡的 weight shape、forward 和 backward 各发什么通信。
# 2. 从 config 算出 Qwen3-8B 一层的参数量：attention ≈42M、MLP ≈151M、每层 ≈193M、TP=2 每卡 ≈96M。
# 3. 说清"forward 2 次 all-reduce、backward 2 次"从哪几行来；开 sequence parallel（SP）后换成了什么，backward 为什么多出 2 次 all-gather。
# 4. 读懂 `linear_qkv` 的 weight 按 query group 交错存（`q q k v | q q k v | …`），SwiGLU 的 `linear_fc1` 为什么用 stride 2。
# 5. 用运行说明 TP=2 的层和 TP=1 的层是同一个函数：输出和梯度都相等——包括哪些梯度要等 `finalize_model_grads` 之后才相等。

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 用 Megatron Core 自己的模块拼出一层的 spec：把下一行的结果包成 `ModuleSpec(TransformerLayer, …)` |
# | [`gpt_layer_specs.py::get_gpt_layer_local_submodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L359) | 逐个槽位填零件；`mlp` 槽位是 `partial(MLP.as_mlp_submodule, submodules=…)` |
# | [`backends.py::LocalSpecProvider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L99) | local spec 的零件：列/行并行 linear、`DotProductAttention`、norm |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 按 spec 实例化模块（函数原样返回） |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层有哪些槽位 |
# | [`transformer_layer.py::TransformerLayer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L309) | 按槽位逐个建：attention、bda 经 `build_module`；norm 和 `mlp` 的槽位本身就是 builder，直接调用 |
# | [`transformer_layer.py::TransformerLayer.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L733) | `_forward_attention` 再 `_forward_mlp` |
# | [`transformer_layer.py::TransformerLayer._forward_attention`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L569) | norm → attention → bias-dropout-add |
# | [`transformer_layer.py::TransformerLayer._forward_mlp`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L802) | norm → MLP → bias-dropout-add |
# | [`attention.py::SelfAttention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1651) | `linear_qkv` 的输出宽度 = Q + 2·KV |
# | [`attention.py::Attention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L296) | 每卡几个 head、几个 query group |
# | [`attention.py::Attention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1278) | 切 QKV → RoPE → core attention → `linear_proj` |
# | [`attention.py::SelfAttention.get_query_key_value_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1812) | 按 query group 把融合的输出切成 Q、K、V |
# | [`dot_product_attention.py::DotProductAttention.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/dot_product_attention.py#L142) | 本卡的 head 上算 softmax(QKᵀ)V |
# | [`mlp.py::MLP.as_mlp_submodule`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L389) | 层调用的 `mlp` builder：从 `pg_collection` 取 TP 群，再构造 `MLP` |
# | [`mlp.py::MLP.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L172) | GLU 时 `linear_fc1` 宽度翻倍、stride 2 |
# | [`mlp.py::MLP.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L258) | fc1 → 激活（`glu`）→ fc2 |
# | [`layers.py::ColumnParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1100) | `linear_qkv`、`linear_fc1` |
# | [`layers.py::RowParallelLinear.forward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1430) | `linear_proj`、`linear_fc2`，末尾 all-reduce 或 reduce-scatter |
# | [`layers.py::LinearWithGradAccumulationAndAsyncCommunication.backward`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L583) | 列并行 linear 的 backward：输入梯度 all-reduce（或 SP 的 reduce-scatter） |
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | CPU 初始化：先建完整 weight，再按 `partition_dim`、`stride` 切 |
# | [`fused_bias_dropout.py::get_bias_dropout_add`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/fusions/fused_bias_dropout.py#L83) | `self_attn_bda`、`mlp_bda` |
# | [`torch_norm.py::WrappedTorchNorm.__new__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L33) | 没有 Apex / TE 时的 norm（拒绝 SP，见遗留问题） |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | 在 TP 群里对 norm 的梯度求和 |

# %% [markdown]
# ## 调用链
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
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `get_gpt_layer_local_spec` | `qk_layernorm`、`normalization` 等开关 | 一个 `ModuleSpec`（类 + 子模块槽位） | `get_gpt_layer_local_submodules`、`LocalSpecProvider` | 否 | 否 | 否 | `model_provider` 里选 spec |
# | `TransformerLayer.__init__` | config、spec 的 submodules、`pg_collection` | 建好的各子模块 | `build_module`（attention、bda）、norm 与 `mlp` 的 builder（`MLP.as_mlp_submodule`） | 读 TP 群（`pg_collection.tp`） | 是：各 linear 按 TP 切 weight | 建参数 | 建模型 |
# | `TransformerLayer.forward` | `[s, b, h]`、mask、RoPE | `[s, b, h]`、context | `_forward_attention`、`_forward_mlp` | 间接（通过 linear） | 激活按 head / ffn 维切（SP 时还按 s 切） | 否 | `forward_step` |
# | `SelfAttention.get_query_key_value_tensors` | 归一化后的 `[s, b, h]` | 本卡的 Q `[s, b, np/TP, hn]`、K、V `[s, b, ng/TP, hn]` | `linear_qkv`、QK norm | 只在 ng < TP 时（遗留问题 2） | 是：本卡拿整组的 head | 否 | `forward_step` |
# | `DotProductAttention.forward` | 本卡的 Q、K、V、mask | `[s, b, np/TP·hn]` | `FusedScaleMaskSoftmax`、dropout（RNG tracker） | 否 | 按 head | 否 | `forward_step` |
# | `ColumnParallelLinear.forward` | 完整输入（SP 时 s 分片） | 本卡的输出列 | `linear_with_grad_accumulation_and_async_allreduce` | TP：bwd all-reduce；SP：fwd all-gather、bwd all-gather + reduce-scatter | 是：weight 按输出维切 | 否 | `forward_step` / `backward` |
# | `RowParallelLinear.forward` | 本卡的输入列 | 完整输出（SP 时 s 分片） | `reduce_from_tensor_model_parallel_region` 或 `reduce_scatter_to_sequence_parallel_region` | TP：fwd all-reduce；SP：fwd reduce-scatter、bwd all-gather | 是：weight 按输入维切 | 否 | `forward_step` / `backward` |
# | `MLP.forward` | `[s, b, h]` | `[s, b, h]`、bias | `linear_fc1`、`glu`、`linear_fc2` | 间接 | 按 ffn 维 | 否 | `forward_step` |
# | `get_bias_dropout_add` | `training`、`fused` | 一个函数：x + bias → dropout → + residual | 无 | 否 | 否 | 否 | `forward_step` |
# | `_allreduce_non_tensor_model_parallel_grads` | 模型块、config | 无（就地改梯度） | 无 | TP 群 all-reduce | 否 | 是：改梯度 | `finalize_model_grads`（optimizer step 之前） |

# %% jupyter={"source_hidden": true} tags=["hide-input"]
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n11_tp_layer import build_layer, forward_backward, run, submodule_table, weight_table
from snippets.tp.layer_walk import (WALK, counts_by_submodule, kind_of, layout, millions, owner_of,
                                 param_counts, qkv_rows, short, tp_shard, weight_rows)
from snippets.ranks.launch import run_ranks
from snippets.models.presets import PRESETS
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.tp import pictures

import torch
from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig

# %% [markdown]
# ## 关键对象
#
# ### 一个函数建一层
#
# Qwen3-8B：hidden 4096、32 个 Q head、8 个 KV head（`num_query_groups`）、head_dim 128、ffn 12288、SwiGLU、
# RMSNorm、QK norm、linear 不带 bias。小层 `TINY` 用完全相同的开关，只把尺寸缩小（Q:KV 从 4:1 改成 2:1，
# 让 TP=2 时每卡有两个 query group，交错的样子看得清楚）。
# 每个 rank 上都调同一个函数 `build_layer`：设 RNG、用 `get_gpt_layer_local_spec` 和 `build_module` 建真实的层
# （TP 群由调用方先建好）。尺寸是参数 `dims`（`Dims`：hidden、head、query group、head_dim、ffn 和上面这些开关），
# `dims.transformer_config_kwargs()` 把它们换成 `TransformerConfig` 的参数名。
# `use_cpu_initialization=True` 时 Megatron 先按种子生成**完整的** weight 再切片，所以任何 TP 下种子相同、weight 就是同一份的切片。
#
# 这个函数和下面的 `forward_backward`、`run` 都在 `snippets/experiments/n11_tp_layer.py` 里；`QWEN3_8B` 是预设
# `qwen3-8b`，`TINY` 是同一组开关的小尺寸：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
listing(build_layer)

# %%
QWEN3_8B = PRESETS["qwen3-8b"]
TINY = EXPERIMENTS["tp-layer"].tiny


# %% [markdown]
# ### Qwen3-8B 的一层，建在 `meta` 设备上
#
# 在 `torch.device("meta")` 下建层：每个参数只有 shape 没有存储，193M 个参数不占内存，不到一秒就建完。
# Megatron 在切片时给参数挂上 `tensor_model_parallel`、`partition_dim`、`partition_stride`，`weight_rows` 直接读这些属性：

# %%
def qwen3_on_meta(dims, tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, config = build_layer(dims, tp, device="meta")
    attn = layer.self_attention
    return dict(rows=weight_rows(layer), kinds={path: kind_of(layer, path) for path, _ in WALK},
                heads=attn.num_attention_heads_per_partition,
                groups=attn.num_query_groups_per_partition,
                device=str(attn.linear_qkv.weight.device))


meta = run_ranks(qwen3_on_meta, 2, QWEN3_8B, 2, grid=dict(tp=2))
rank0 = {r["name"]: r for r in meta[0]["rows"]}
print("device:", meta[0]["device"], " 每卡 Q head:", meta[0]["heads"], " 每卡 query group（= KV head）:", meta[0]["groups"])
weight_table(meta[0])  # 即 Table(["子模块", "类", "每卡 weight [out, in]", "切分", "每卡参数"], 每个子模块一行)

# %% [markdown]
# 读这张表：
#
# - 4 个 linear 都被切了：`linear_qkv`、`linear_fc1` 是**列并行**（切输出维 dim 0），`linear_proj`、`linear_fc2` 是**行并行**（切输入维 dim 1）。
#   Megatron 和 `torch.nn.Linear` 一样把 weight 存成 `[out, in]`。
# - 两个 norm 和 QK norm（q、k 各一个）每卡一份完整的（复制）。建不建 QK norm 由 `config.qk_layernorm` 决定
#   （[`attention.py:1700`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1700)），spec 只给类；关掉时 `q_layernorm`、`k_layernorm` 是 `None`
#   （[`attention.py:1722`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1722)），spec 里若填了真正的 norm 类会直接报错。`self_attn_bda`、`mlp_bda` 是 `get_bias_dropout_add` 返回的函数，
#   激活是 `config.activation_func`（`silu`）在 `MLP.forward` 的 `glu` 里用：都没有参数。`core_attention` 也没有参数。
# - `linear_fc1` 的 stride 是 2：每卡拿的不是前一半行，而是 gate 的一片**加** up 的一片（下面"机制解释"用运行说明）。
#
# ### 参数量，以及 seed 000 的每个数
#
# 参数量两种算法：一是把 meta 层每卡的参数加起来（被切的乘以 TP，复制的只算一次）；二是 `param_counts` 用 config 写的公式。

# %% jupyter={"source_hidden": true} tags=["hide-input"]
config = TransformerConfig(**dict(QWEN3_8B.transformer_config_kwargs(), num_layers=1))
per_rank = counts_by_submodule(meta[0]["rows"])
whole = {name: n * (2 if rank0[name + ".weight"]["sharded"] else 1) for name, n in per_rank.items()}
ATTENTION = ("self_attention.linear_qkv", "self_attention.q_layernorm", "self_attention.k_layernorm",
             "self_attention.linear_proj")
MLP = ("mlp.linear_fc1", "mlp.linear_fc2")
Table(["", "整层（TP=1）", "TP=2 每卡", "公式整层", "公式每卡"],
      [[label, sum(whole[n] for n in names), sum(per_rank[n] for n in names),
        sum(param_counts(config, 1)[n] for n in names), sum(param_counts(config, 2)[n] for n in names)]
       for label, names in (("attention", ATTENTION), ("MLP", MLP), ("两个 norm", ("input_layernorm", "pre_mlp_layernorm")),
                            ("一层合计", tuple(whole)))])

# %% [markdown]
# 一层 192,946,432 个参数，几乎全在 4 个 linear 里（norm 只有 8,448 个）。seed 000 的说法，写成一张表
# （seed 把 weight 写成数学上的 `x·W` 形状 `[in, out]`，即 Megatron `weight.shape` 的转置）：
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
# 下面这格从 config 和 meta 层算出同一张表：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
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
# 全部对上。两处要读仔细：seed 的 `[2048, 4096]`、`[6144, 4096]` 是 `[in, out]`，Megatron 存的是 `[4096, 2048]`、`[4096, 6144]`；
# "每卡 96M"是 96.48M 取整（4 个 linear 各一半 96,468,992，加上每卡都有的 8,448 个 norm 参数）。
#
# ### 小层的 forward + backward：TP=1 和 TP=2
#
# 同一个函数跑 TP=1（1 个 rank）和 TP=2（2 个 rank）。输入 `[s, b, h] = [8, 2, 32]` 在每个 rank 上相同（SP 时每个 rank 取自己那一段 s）。
# 层外面包一层 Megatron 的 `DistributedDataParallel`（这里 DP=1），这样 backward 之后可以调真实的 `finalize_model_grads`。
# forward + backward 期间 `recorder.record()` 记下每个 collective，`collectives_by_submodule` 用 forward hook 和张量梯度 hook
# 把每次通信归到发出它的子模块（`self_attention` 也在追踪之列，用来抓"不在它的三个子模块里、由它自己发出"的通信）。
#
# `run` 在每个 rank 上建 TP 群，先不开、再开 SP（TP>1 时）各建一次层、跑一次 `forward_backward`；
# 命令行只要表里用的字符串和形状，本篇加 `keep_tensors=True`，把输出、梯度和记录也带回来，好和 TP=1 逐元素比较。
# 2 个 rank 的一次启动就同时给出 TP=2 和 SP 两次运行：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
listing(forward_backward, run)

# %%
(one,) = (r[False] for r in run_ranks(run, 1, TINY, Parallel(world=1), keep_tensors=True))
tp2 = run_ranks(run, 2, TINY, Parallel(world=2, tp=2), keep_tensors=True, grid=dict(tp=2))
two, sp = [r[False] for r in tp2], [r[True] for r in tp2]
print("TP=2:", two[0]["calls"], "次通信，未归属的:", two[0]["missing"],
      " | SP:", sp[0]["calls"], "次通信，未归属的:", sp[0]["missing"])

# %% [markdown]
# 每个子模块在 rank 0 上发出的通信（rank 1 完全相同），左边不开 SP，右边开 SP：

# %%
submodule_table(tp2[0], tp=2)

# %% [markdown]
# 把这张表和小层每卡的 weight 形状（`weight_table(tp2[0]["weights"])`，与上面 Qwen3-8B 的表同一个函数）画成一层从上到下的流程：
# 深色是列并行、浅色是行并行；weight 不因 SP 改变，所以子模块只画一列，右边两组黄色标记是子模块自己发出的
# collective：先是不开 SP 的 forward / backward，再是开 SP 的。

# %%
pictures.draw_layer(weight_table(tp2[0]["weights"]).rows, submodule_table(tp2[0], tp=2).rows)

# %% [markdown]
# 和 seed 000 一致：不开 SP 时 forward 2 次 all-reduce（`linear_proj`、`linear_fc2` 的 g），backward 2 次
# （`linear_qkv`、`linear_fc1` 的输入梯度）；norm、切 QKV、core attention、bda、激活都不通信（"未归属的"是 0：
# 没有一次通信发生在追踪的子模块之外，bda 和激活在它们之外）。开 SP 后 forward 是 2 次 all-gather + 2 次 reduce-scatter，
# backward 是 4 次 all-gather + 2 次 reduce-scatter——多出来的两次 all-gather 见"机制解释"。
#
# ### 同一个函数：TP=2 等于 TP=1
#
# 输出、输入梯度、每个参数的梯度（被切的参数和 TP=1 梯度的对应切片比，切法由 `tp_shard` 按 `partition_dim`/`stride` 复现）。
# 梯度分两列：backward 刚结束时，和 `finalize_model_grads` 之后：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
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
# 4 个 linear 的梯度一 backward 完就等于 TP=1 的切片。有两类参数例外，而且都靠 `finalize_model_grads` 补上：
#
# - **QK norm**（不开 SP 也是）：`q_layernorm` 作用在每个 head 上，每卡只有自己那 16 个（小层 4 个）head，
#   所以每卡的梯度只是部分和。`_allreduce_non_tensor_model_parallel_grads` 按**参数名**里有没有 `q_layernorm`/`k_layernorm`
#   把它们挑出来在 TP 群求和（[`finalize_model_grads.py:452`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L452)）。
# - **开 SP 时的两个 norm**：每卡只看到一半 token，梯度也是部分和；靠参数上的 `sequence_parallel` 标记被挑出来。
#   local spec 的 torch norm 本来拒绝 SP，我们的 CPU 补丁 `torch_norm_sequence_parallel` 让它照常建、并打上这个标记
#   （见[在 CPU 上运行](../../cpu/)和遗留问题 3）。
#
# `finalize_model_grads` 这一步发出的通信（DP=1，所以 DDP 自己的那次 all-reduce 只有 1 个成员）：

# %%
Table(["API", "group", "shape", "issued by"], sp[0]["finalize"])

# %% [markdown]
# `[72]` = 两个 norm 各 32 + QK norm 各 4，拼成一个扁平张量一次 all-reduce（不开 SP 时只有 QK norm 的 8 个）。
#
# ### 融合的 QKV：按 query group 交错
#
# `linear_qkv` 的输出不是"先全部 Q，再全部 K，再全部 V"。`get_query_key_value_tensors` 把它 view 成
# `[s, b, 每卡 group 数, (每组 Q head 数 + 2) · head_dim]`，再在最后一维切成 Q、K、V：每个 query group 的行是
# "这一组的 Q head，然后它的 K head，然后 V head"。`qkv_rows` 是这条规则的可读版本。
# 下面在 TP=2 的小层上调 Megatron 自己的切法，与按 `qkv_rows` 手工切出的 weight 行算出的 Q、K、V 比较；
# 再把 weight 第 0 列写成"全局行号"、输入取单位向量 e0，让 Megatron 切出的每个数就是它来自的行号：

# %%
def qkv_split(dims, tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, config = build_layer(dims, tp)
    attn, rank = layer.self_attention, parallel_state.get_tensor_model_parallel_rank()
    heads, groups, d = dims.heads, dims.query_groups, dims.kv_channels
    x = torch.randn(8, 2, dims.hidden)
    q, k, v = attn.get_query_key_value_tensors(x)                       # Megatron 的切法
    W, rows = attn.linear_qkv.weight, qkv_rows(heads, groups, d, tp, rank, local=True)
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
per_rank_q, per_rank_kv = TINY.heads // 2, TINY.query_groups // 2
Table(["rank", "每卡 weight", "Q、K、V 与手工切相同", "Megatron 切出的顺序（全局 head 号）", "与 qkv_rows 相同"],
      [[rank, r["shape"], r["same"], layout(r["read_back"], rank * per_rank_q, rank * per_rank_kv),
        r["read_back"] == qkv_rows(8, 4, 4, 2, rank)] for rank, r in enumerate(split)])

# %% [markdown]
# 全局看就是 seed 000 写的 `q1 q2 k1 v1 | q3 q4 k2 v2 | …`（这里从 0 编号）。列并行把行连续地切成 TP 段，
# 因为每段恰好是整数个 group（4 个 group、TP=2），所以每卡拿到的是**完整的** query group：自己的 Q head 和它们共用的 K、V head 都在本卡，
# attention 不需要通信。Qwen3-8B 每卡 4 个 group、每组 4 个 Q head：

# %%
for rank in range(2):
    print(f"rank {rank}:", layout(qkv_rows(32, 8, 128, 2, rank), rank * 16, rank * 4))
print("每卡行数:", len(sum(sum(qkv_rows(32, 8, 128, 2, 0).values(), []), [])), "= weight 的 dim 0:", qkv["shape"][0])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 所有通信都在 **TP 群**里（这里是 `[0, 1]`）。每卡的激活形状（Qwen3-8B、TP=2，s、b 任意），从 meta 层的 weight 形状读出：

# %% jupyter={"source_hidden": true} tags=["hide-input"]
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
# 每次通信的记录（小层，rank 0；shape 是 `[s, b, h] = [8, 2, 32]`）。"含义"一列来自同一模块里按（API, 发出它的函数）查的 `MEANING` 表。不开 SP：

# %%
two[0]["comm"]

# %% [markdown]
# 开 SP（层的输入、输出都是 `[s/2, b, h] = [4, 2, 32]`）：

# %%
sp[0]["comm"]

# %% [markdown]
# ## 机制解释
#
# **为什么每个 block 只要一次 forward 通信。** attention 和 MLP 都是"列并行 linear → 本地计算 → 行并行 linear"。
# 列并行的输出按输出维切开，正好是下一步需要的切法（attention 按 head、SwiGLU 按 ffn 维都是逐列独立的），
# 所以中间不用拼；行并行把各卡的部分和相加，才是完整结果——这就是 forward 里唯一的 all-reduce（g，
# [`layers.py:1480`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1480)）。
# backward 反过来：行并行输入梯度天然是切好的，列并行的输入被每卡用了一次，输入梯度要把各卡的部分和相加（f 的 backward）。
# 注意这个 f 不是 `copy_to_tensor_model_parallel_region`：不开 SP、TP>1 时 `allreduce_dgrad` 为真
# （[`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)），
# 输入原样进 `linear_with_grad_accumulation_and_async_allreduce`，all-reduce 在它的 backward 里发出，好和 weight 梯度的计算重叠
# （记录表里 issued by 是 `layers.py::backward`）。
#
# **开 SP 换成了什么。** SP 让 norm、dropout、residual 这些"逐 token"的部分只算 `s/TP` 个 token：
# 列并行 linear 在 forward 里先 all-gather 输入（`[s/2] → [s]`），行并行 linear 把 all-reduce 换成 reduce-scatter（`[s] → [s/2]`）。
# 一次 all-reduce 的通信量 = 一次 reduce-scatter + 一次 all-gather，所以 forward 的通信量不变，激活内存却少了。
# backward 里：每次 reduce-scatter 的 backward 是 all-gather（2 次，`mappings.py::_gather_along_first_dim`）；
# 每次 all-gather 的 backward 是 reduce-scatter（2 次，`layers.py::backward`）；**多出来的 2 次 all-gather**
# 也在列并行 linear 的 backward 里：forward 只保存了本卡 `[s/2]` 的输入（`ctx.save_for_backward(input, weight)`），
# 算 weight 梯度 `grad_outputᵀ · total_input` 需要完整的 `[s]` 输入，于是再 all-gather 一次
# （[`layers.py:617`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L617)）。
# 这是用通信换内存：不存 all-gather 之后的大输入。
#
# **为什么 GQA 的 weight 按 query group 交错。** 一个 Q head 只和它所在 group 的 K、V head 做 attention。
# 把"一组的 Q、K、V"放在相邻的行，列并行按行连续切时，只要 `num_query_groups` 能被 TP 整除，每卡拿到的就是整组，
# attention 完全本地。若先放全部 Q 再放全部 K、V，连续切一刀就会把 K、V 分到错的卡上。
#
# **为什么 `linear_fc1` 的 stride 是 2。** SwiGLU 要 `silu(gate) * up`，gate 的第 i 列必须和 up 的第 i 列在同一卡。
# 完整 weight 是 `[gate; up]`（各 ffn 行）。stride 2 让 `_initialize_affine_weight_cpu` 把它切成 `2·TP` 块、每卡取第 `rank` 和第 `rank+TP` 块，
# 于是每卡的 fc1 输出是 `[本卡的 gate 片, 本卡的 up 片]`，`glu` 在本卡 `chunk(2)` 就对（自测 5 用行号算给你看）。

# %% [markdown]
# ## 与训练主链路的关系
#
# `GPTModel` 的 decoder 就是 N 个这样的层（笔记 04 建模型、笔记 05 跑 forward/backward）。一个训练 step 里，
# 每层每个 micro-batch 的 forward 付 2 次 TP all-reduce、backward 再付 2 次；TP 群在机内（笔记 08 的 order 规则），走 NVLink。
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
# 1. **seed 000 的 shape 是 `[in, out]`。** 它写 `linear_proj` 每卡 `[2048, 4096]`、`linear_fc2` 每卡 `[6144, 4096]`，是数学上 `x·W` 的写法；
#    Megatron 的 `weight.shape` 是 `[4096, 2048]`、`[4096, 6144]`（和 `nn.Linear` 一样 `[out, in]`）。做 checkpoint 转换时这个区别会咬人。
# 2. **TP 大于 KV head 数时多一次 all-gather（运行确认）。** `num_query_groups < TP` 时
#    `get_query_key_value_tensors` 先把 `linear_qkv` 的输出 all-gather 成完整宽度，再挑出本卡 group 的那一段
#    （[`attention.py:1852`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1852)）：
#    一个 group 被两张卡分着算、又各自拿回整组，K、V 在两卡上重复。Qwen3-8B 只有 8 个 KV head，TP=16 就会走这条路。
#    下面用 8 个 Q head、2 个 group、TP=4 跑一遍：forward 多一次 all-gather，backward 多一次 reduce-scatter，结果仍等于 TP=1。
# 3. **local spec 的 torch norm 不支持 SP。** [`torch_norm.py:50`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L50)
#    直接断言；Megatron 期望 SP 用 Apex 的 `FusedLayerNorm` 或 TE 的 norm，它们都把参数标成 `sequence_parallel`。
#    我们的补丁只在 SP 时绕过断言并补上同样的标记，上面"SP finalize 后"那一列全是 True 说明标记被 `finalize_model_grads` 用上了。
# 4. **不传 `attention_mask` 会在 CPU 上失败。** mask 为 `None` 时 softmax 用
#    [`utils.py:39`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/utils.py#L39) 现建一个
#    `device="cuda"` 的因果 mask。本篇显式传 causal mask（GPT 的数据管线本来就给）。
# 5. **每个 `TransformerConfig` 都会发一条弃用警告。** `cuda_graph_modules`（原来的 `cuda_graph_scope`）的缺省值就是 `"full"`
#    （[`transformer_config.py:1047`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1047)），
#    而 `__post_init__` 见到 `"full"` 就警告它已弃用（[`transformer_config.py:2415`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2415)）。
#    无害，`snippets/__init__.py` 的已知警告过滤把它静音了。
# 6. **QK norm 的梯度靠参数名找。** `finalize_model_grads` 用 `"q_layernorm" in name` 挑出要在 TP 群求和的参数；
#    换一个名字的自定义 QK norm 会被静默漏掉，TP 各卡的权重随之漂移。

# %%
GQA_TINY = TINY.replace(query_groups=2)
(gqa_one,) = (r[False] for r in run_ranks(run, 1, GQA_TINY, Parallel(world=1), keep_tensors=True))
gqa = [r[False] for r in run_ranks(run, 4, GQA_TINY, Parallel(world=4, tp=4), keep_tensors=True,
                                   grid=dict(tp=4))]
print("TP=4、2 个 group：输出等于 TP=1:", torch.allclose(gqa[0]["y"], gqa_one["y"], atol=1e-5),
      " linear_qkv 每卡 weight:", list(gqa[0]["params"]["self_attention.linear_qkv.weight"].shape))
gqa[0]["comm"]

# %% [markdown]
# `linear_qkv` 每卡 12 行 = 半个 group（一组是 4 个 Q + K + V = 6 个 head × 4 = 24 行）。多出的两次通信由
# `self_attention` 自己（`get_query_key_value_tensors`）发出。all-gather 的 shape 是 Megatron 的做法：
# 先沿第 0 维收齐 `[32, 2, 12]`，再在本地拼成最后一维 `[8, 2, 48]`；backward 的 reduce-scatter 同理先把梯度重排成 `[64, 12]`。

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
# 4 个 linear 的 192,937,984 个参数除以 TP，再加每卡都有的 8,448 个 norm 参数：TP=4 约 48.24M，TP=8 约 24.13M。
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
