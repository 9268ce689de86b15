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
# # 19 模型专题：config、layer spec 与 GPTModel
#
# 第三轮·模型专题。[笔记 04](../04_model_provider_and_gpt_model/) 走过"谁造模型"（0.19.0 的正式入口是 `GPTModelConfig` →
# `GPTModelBuilder` → `GPTModel`，旧的 `get_model` → `model_provider` → `gpt_builder` 是退路），列出了 TP=2 时每个参数的切法；[笔记 11](../11_transformer_layer/) 把一层拆开走了 forward。
# 本篇不重复它们，而是逐条回答 roadmap 模型专题的四个"关注"问题，每条都用真实的 `megatron.core` 在 CPU rank 上跑出来：
# `TransformerConfig` 在构造之后自己改了哪些字段、拒绝哪些组合；layer spec 里的哪些选择真的由 spec 决定、哪些其实由
# config 决定（把模型建出来逐模块比较）；以及 TP=2 的 GPT 里每个并行层带着什么标志、这些标志换来哪些通信。

# %% [markdown]
# ## 阅读目标
#
# 1. **GPTModel 如何由 config 和 layer spec 构造**：从 `GPTModel.__init__` 到每个 `ColumnParallelLinear`，每一跳在哪一行；
#    `ModuleSpec` 里的类在哪一步、以什么参数变成模块。
# 2. **TransformerConfig 如何承接 CLI args**：同名拷贝之外（笔记 04），`__post_init__` 推导出哪些字段、会因哪些组合报错；
#    命令行入口在 config 之前已经替它算好了哪些缺省值，算法是否一样。
# 3. **layer spec 如何决定 attention / MLP / normalization / MoE**：对同一份 config 换三种 spec 建模型并逐模块 diff；
#    spec 与 config 说法不一致时，谁说了算。
# 4. **tensor parallel layer 如何嵌入模型结构**：TP=2 的 tiny GPT 里每个并行层的作用、切分维度、`gather_output` /
#    `input_is_parallel` / `sequence_parallel` / `skip_bias_add`，以及它们在 forward / backward 里换来的通信。

# %% [markdown]
# ## 源码位置
#
# roadmap 模型专题的"核心文件"一栏是空的，下表就是本篇给它填的清单（每个链接固定到 tag 的那一行）：
#
# | 核心文件 · 先看的符号 | 回答哪个关注点 |
# |---|---|
# | [`gpt_model.py::GPTModel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L94) | 构造链的起点：embedding（[`gpt_model.py:168`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L168)）、decoder（[`gpt_model.py:227`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L227)）、output layer（[`gpt_model.py:269`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L269)） |
# | [`language_model_embedding.py::LanguageModelEmbedding.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L29) | 词嵌入（TP 切）+ 位置嵌入（复制）；SP 时是否 reduce-scatter |
# | [`language_module.py::LanguageModule.setup_embeddings_and_output_layer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L202) | 共享词嵌入与输出层权重 |
# | [`transformer_block.py::TransformerBlock.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L264) | 拿到 spec，建本 stage 的层 |
# | [`transformer_block.py::_get_block_submodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L220) | 一个层 spec → `[spec] × 层数`；block spec 原样用 |
# | [`transformer_block.py::TransformerBlockSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L201) | 每层一个 spec + final norm 的类 |
# | [`transformer_block.py::TransformerBlock._build_layers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L324) | 对每个层 spec 调 `build_module` |
# | [`spec_utils.py::ModuleSpec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L13) | spec 是数据：`module`、`params`、`submodules` |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 函数原样返回；类则带上 `submodules` 和 `params` 实例化；出错时在消息后追加类名（[`spec_utils.py:127`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L127)） |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层的槽位；没给的槽位是 `IdentityOp` / `IdentityFuncOp` |
# | [`transformer_layer.py::TransformerLayer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L309) | 逐槽位建模块：attention、bda 经 `build_module`，norm 槽位与 `mlp` 的构造器直接调用（[`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431)），`mlp` 拿整个 `pg_collection` |
# | [`attention.py::Attention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L296) | 先建 `core_attention`、`linear_proj`（[`attention.py:413`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L413)） |
# | [`attention.py::SelfAttention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1651) | 后建 `linear_qkv`（[`attention.py:1681`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1681)）和 QK norm：`config.qk_layernorm` 开关，开时用 spec 槽位的类（[`attention.py:1697`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1697)），关时为 `None`、spec 却给了 norm 就报错（[`attention.py:1710`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1710)） |
# | [`mlp.py::MLP.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L172) | `linear_fc1`（列并行）、`linear_fc2`（行并行） |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 用 Megatron Core 自己的模块拼一层：attention、MLP / MoE、norm |
# | [`gpt_layer_specs.py::get_mlp_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L521) | 返回 `mlp` 槽位的构造器：`num_experts` 是 None 时 `partial(MLP.as_mlp_submodule, …)`，否则 MoE 的 |
# | [`moe_module_specs.py::get_moe_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/moe_module_specs.py#L65) | `partial(MoELayer, submodules=MoESubmodules(...))`：experts 构造器（本机 `SequentialMLP`），router 取缺省 `TopKRouter` |
# | [`gpt_layer_specs.py::get_gpt_decoder_block_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L676) | 按 `moe_layer_freq` 给每层挑 dense 或 MoE spec（正式入口 `--num-experts` 时走这里） |
# | [`backends.py::LocalSpecProvider.layer_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L118) | local backend 的 norm 类（会改模块全局变量，见遗留问题） |
# | [`torch_norm.py::WrappedTorchNorm.__new__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L33) | 实例化时按 `config.normalization` 选 `LayerNorm` / `RMSNorm` |
# | [`transformer_config.py::TransformerConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1294) | 推导缺省字段、拒绝不合法的组合 |
# | [`model_parallel_config.py::ModelParallelConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L497) | 先于上一行执行：SP 需要 TP、ETP 跟随 TP |
# | [`layers.py::VocabParallelEmbedding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L230) | 按词表切的 embedding |
# | [`layers.py::ColumnParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L918) | `gather_output`、`allreduce_dgrad`（[`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)）、`explicit_expert_comm`（[`layers.py:960`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L960)） |
# | [`layers.py::RowParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1285) | `input_is_parallel`、`skip_bias_add` |
# | [`argument_utils.py::core_transformer_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L277) | args → config（笔记 04 的表） |
# | [`arguments.py::validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L388) | 在 config 之前先填 `ffn_hidden_size`（[`arguments.py:1287`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1287)）、`kv_channels`（[`arguments.py:1292`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1292)） |
# | [`gpt_builders.py::gpt_builder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L25) | 用 `args.num_experts` 选 block spec（[`gpt_builders.py:41`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L41)） |

# %% [markdown]
# ## 调用链
#
# ```text
# gpt_model.py::GPTModel.__init__ (L94)            # config 给数字，spec 给类
# ├─ LanguageModule.__init__                       # pg_collection 缺省取全局群
# ├─ L168 LanguageModelEmbedding                   # pre_process 时
# │  ├─ VocabParallelEmbedding                     # 按词表切 dim 0
# │  └─ torch.nn.Embedding                         # learned_absolute 时；复制
# ├─ RotaryEmbedding                               # rope 时；无参数
# ├─ L227 TransformerBlock(config, spec)
# │  ├─ _get_block_submodules (L220)               # 层 spec → [spec] × 本 stage 层数
# │  └─ _build_layers (L324)
# │     ├─ build_module(layer_spec) × 层数 (L353)
# │     │  └─ TransformerLayer.__init__ (L309)
# │     │     ├─ input_layernorm (L352)            # 直接调用槽位；WrappedTorchNorm：看 config 选类
# │     │     ├─ self_attention (L373)             # build_module → SelfAttention.__init__ (L1651)
# │     │     │  ├─ Attention.__init__ (L296)
# │     │     │  │  ├─ core_attention (L382)
# │     │     │  │  └─ linear_proj (L413)          # RowParallelLinear
# │     │     │  ├─ linear_qkv (L1681)             # ColumnParallelLinear
# │     │     │  └─ q_layernorm / k_layernorm      # config 开关，spec 给类；关时是 None
# │     │     ├─ self_attn_bda                     # 函数，原样返回
# │     │     ├─ cross_attention, ...              # 三个槽位 spec 没给：IdentityOp
# │     │     ├─ pre_mlp_layernorm
# │     │     ├─ mlp (L431)                        # 调用构造器，传整个 pg_collection
# │     │     │  ├─ MLP.as_mlp_submodule → MLP.__init__ (L172)   # 取 tp 群；fc1 列并行、fc2 行并行
# │     │     │  └─ MoELayer                       # MoE spec 时：router + experts
# │     │     └─ mlp_bda
# │     └─ final_layernorm (L376)                  # 最后一个 stage
# ├─ L269 output_layer                             # ColumnParallelLinear，按词表切
# └─ setup_embeddings_and_output_layer             # PP>1 时首尾 stage 同步初值
# ```
#
# 构造本身**不通信**（笔记 04 实测 0 条 collective）：每个 rank 只按自己的 TP 坐标建自己那片权重。
#
# **每个函数的阅读记录：**
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `TransformerConfig.__post_init__` | 构造时给的字段 | 同一个对象，缺省字段被填好 | `ModelParallelConfig.__post_init__`、`init_method_normal` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` |
# | `validate_args`（ffn / kv 两段） | `args` | 改写后的 `args` | 无 | 否（只用大小做算术） | 否 | 否 | 无（simple loop 直接写 config） |
# | `core_transformer_config_from_args` | `args` | `TransformerConfig` | `TransformerConfig` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` |
# | `get_gpt_layer_local_spec` | `num_experts`、`qk_layernorm`、`normalization`… | `ModuleSpec`（纯数据；`mlp` 槽位是一个 `partial` 构造器） | `LocalSpecProvider`、`get_mlp_module_spec_for_backend` | 否 | 否 | 否（但会改 `backends.LNImpl`） | `get_gpt_layer_local_spec()` |
# | `get_gpt_decoder_block_spec` | config、backend | `TransformerBlockSubmodules`（每层一个 spec） | 上一行、`get_num_layers_to_build` | 读 PP 坐标 | 否 | 否 | 无 |
# | `build_module` | spec 或类、构造参数 | 模块（函数原样返回） | 无 | 否 | 否 | 建参数 | 隐含在 `GPTModel(...)` 里 |
# | `GPTModel.__init__` | config、spec、vocab、最大长度… | 模型 | `LanguageModelEmbedding`、`TransformerBlock`、`ColumnParallelLinear` | 读 `pg_collection`（TP、PP、CP） | **是**：每个 TP 层只建本 rank 的分片 | 是：参数 | `GPTModel(...)` |
# | `TransformerBlock.__init__` / `_build_layers` | config、spec | `layers`、`final_layernorm` | `build_module`、`TransformerLayer` | 读 PP 坐标（本 stage 几层、层号偏移） | 间接 | 是 | 同上 |
# | `TransformerLayer.__init__` | config、`TransformerLayerSubmodules`、层号 | 一层 | `build_module`、`SelfAttention`、`mlp` 构造器（`MLP` / `MoELayer`） | 把 `pg_collection` 交给 attention 与 `mlp` 构造器（`MLP` 只取其中的 `tp`） | 间接 | 是 | 同上 |
# | `ColumnParallelLinear.__init__` / `RowParallelLinear.__init__` | 全局 in/out、config、标志 | 本 rank 的权重分片 | `_initialize_affine_weight_cpu`、`set_tensor_model_parallel_attributes` | 读 TP 群大小与坐标 | **是**：dim 0 / dim 1 | 是 | 同上 |
# | `WrappedTorchNorm.__new__` | config、hidden | `torch.nn.LayerNorm` 或 `RMSNorm` | 无 | 否 | 否 | 是：参数 | 同上 |

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import importlib.util

import torch

from snippets.config import spec_diff
from snippets.config.config_derived import cli_default_ffn_hidden_size, describe, post_init_changes
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.config.pictures import draw_spec_trees
from snippets.experiments.n19_model_topic import base_config, build_variants, run, short_path, tables, variants
from snippets.ranks.launch import run_ranks
from snippets.tp.layer_walk import apis, only_in, owner_of
from snippets.config.model_args import OVERRIDES, cli_flags, transformer_config_fields
from snippets.config.model_specs import transformer_engine_spec_without_te
from snippets.config.spec_diff import flag_cells
from snippets.record.listing import listing
from snippets.record.tables import Table

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel, gpt_layer_specs
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

# %% [markdown]
# ## 关键对象
#
# ### `TransformerConfig`：传进去的不等于拿到的
#
# `TransformerConfig` 是 dataclass，构造时先跑 `ModelParallelConfig.__post_init__`，再跑自己的 `__post_init__`：留成
# `None` 的字段在这里被推导出来。`post_init_changes` 构造真实的 config，再把每个字段和"传进去的值（没传就是 dataclass
# 缺省值）"比较，列出所有被改过的字段——不用记，跑出来。只给四个数（2 层、hidden 64、8 个 head、TP=2）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
given = dict(num_layers=2, hidden_size=64, num_attention_heads=8, tensor_model_parallel_size=2)
fields = transformer_config_fields()


def flag_of(name):  # note 04's rules: the generated flag; set by hand in from_args?
    flags = " / ".join(cli_flags(fields[name])) or "无"
    return flags + ("；from_args 手工设" if name in OVERRIDES else "")


Table(["字段", "传入", "`__post_init__` 之后", "命令行 flag"],
      [[c["name"], describe(c["given"]), describe(c["final"]), flag_of(c["name"])]
       for c in post_init_changes(TransformerConfig, **given)])

# %% [markdown]
# 按作用分三组：
#
# - **形状**：`ffn_hidden_size = 4·h`（[`transformer_config.py:1329`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1329)）、
#   `kv_channels = h // heads`（[`transformer_config.py:1332`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1332)）、
#   `num_query_groups = heads`（[`transformer_config.py:1335`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1335)，即 MHA）。
# - **初始化**：`init_method = N(0, init_method_std)`；`output_layer_init_method` 的 std 再除以 `√(2·num_layers)`
#   （[`transformer_config.py:2263`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2263)），2 层时是 0.01；
#   embedding 的 std 缺省跟随 `init_method_std`。三个 init 方法本身没有命令行参数，只能由 `--init-method-std`
#   （和 `--embedding-init-method-std`）间接决定。
# - **并行**：`expert_tensor_parallel_size` 跟随 TP（[`model_parallel_config.py:507`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L507)），
#   `autocast_dtype` 跟随 `params_dtype`；`cuda_graph_modules` 的缺省 `"full"` 已废弃，被改成空列表（[`transformer_config.py:2440`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2440)），
#   `inference_cuda_graph_scope` 从 `None` 规范成 `"none"`（[`transformer_config.py:2452`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2452)）。
#
# 右列按笔记 04 的规则算出：多数字段有同名 flag；"无"的几个只能由别的参数间接决定；`num_query_groups`、`init_method`
# 由 `core_transformer_config_from_args` 手工设置（笔记 04 的覆盖表）。走正式入口时，其中两项在 config 之前就被填了：`validate_args` 先算 `ffn_hidden_size`、`kv_channels`，
# 所以 `__post_init__` 的这两条只对 simple loop 这类直接写 config 的用户生效；`num_query_groups` 则相反——
# 没有 `--group-query-attention` 时 `core_transformer_config_from_args` 强制传 None，由 `__post_init__` 设成 head 数。
#
# ### 同一个缺省值，两套算法
#
# `--swiglu` 且不给 `--ffn-hidden-size` 时，`validate_args` 取 `4h` 的三分之二、向下取到 64 的倍数（门控 MLP 有两个
# 输入矩阵，这样参数量与 `4h` 的普通 MLP 相当，[`arguments.py:1287`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1287)）；
# `TransformerConfig` 不看 `gated_linear_unit`，一律 `4h`。`megatron/training` 不在 pip 包里，`cli_default_ffn_hidden_size`
# 把那一行重写成一个函数；右列是真实的 `TransformerConfig`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def core_default_ffn(hidden_size):
    return TransformerConfig(num_layers=1, hidden_size=hidden_size, num_attention_heads=4,
                             gated_linear_unit=True).ffn_hidden_size


def fc1_params(ffn, h):  # gate and up: a [2·ffn, h] weight
    return 2 * ffn * h


Table(["hidden", "命令行 --swiglu", "Core gated_linear_unit", "fc1 参数：命令行 / Core"],
      [[h, cli_default_ffn_hidden_size(h, swiglu=True), core_default_ffn(h),
        f"{fc1_params(cli_default_ffn_hidden_size(h, True), h)} / {fc1_params(core_default_ffn(h), h)}"]
       for h in (16, 64, 4096)])

# %% [markdown]
# 同一个"不给 ffn"的 SwiGLU 模型，走命令行和直接写 config 得到的 MLP 宽度不同（hidden 4096 时差约 1.5 倍）；
# hidden 小于 24 时命令行甚至给出 0，
# 而 `TransformerConfig(ffn_hidden_size=0)` 不会报错（遗留问题 3）。实践中总是显式给 `--ffn-hidden-size`。
#
# ### 会被拒绝的组合
#
# `__post_init__` 里有上百个检查，大多与 FP8、MoE 的可选功能有关。和模型结构、并行切分直接相关的几个，逐个触发，
# 打印异常的第一行：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
REJECTED = [  # (what is wrong, TransformerConfig arguments besides num_layers=1, hidden_size=16)
    ("6 个 head，TP=4", dict(num_attention_heads=6, tensor_model_parallel_size=4)),
    ("3 个 query group，TP=2", dict(num_attention_heads=8, num_query_groups=3,
                                   tensor_model_parallel_size=2)),
    ("sequence_parallel，TP=1", dict(num_attention_heads=4, sequence_parallel=True)),
    ("EP=2，没有 expert", dict(num_attention_heads=4, expert_model_parallel_size=2)),
    ("2 个 expert + linear bias，TP=2", dict(num_attention_heads=4, num_moe_experts=2,
                                            tensor_model_parallel_size=2)),
    ("hidden 10，4 个 head", dict(hidden_size=10, num_attention_heads=4)),
]


def first_line(kwargs):
    try:
        config = TransformerConfig(**{"num_layers": 1, "hidden_size": 16, **kwargs})
    except (ValueError, AssertionError) as err:
        return [type(err).__name__, str(err).splitlines()[0]]
    return ["不报错", f"kv_channels = {config.kv_channels}，heads × kv_channels = "
                     f"{config.num_attention_heads * config.kv_channels}"]


Table(["组合", "结果", "第一行"], [[what, *first_line(kwargs)] for what, kwargs in REJECTED])

# %% [markdown]
# - 前两条保证 TP 能整齐地切 attention：每个 rank 拿整数个 head，并且要么拿整数个 query group，要么几个 rank 共享一个
#   group（[`transformer_config.py:1323`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1323)、
#   [`transformer_config.py:1339`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1339)）。
# - 第三条来自父类（[`model_parallel_config.py:504`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L504)）：
#   SP 沿 sequence 切的是 TP 群里的激活，没有 TP 就无从切起。
# - 第五条不是 `ValueError` 而是 `AssertionError`（[`transformer_config.py:2279`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2279)）：
#   `add_bias_linear` 缺省为 True，ETP 又缺省跟随 TP，所以"TP=2 的 MoE"不关掉 bias 就建不了 config。本篇的 MoE 模型都传 `add_bias_linear=False`。
# - 最后一条**不报错**：Core 允许 `heads × kv_channels ≠ hidden`（有的模型确实这样设计），`kv_channels` 取整除。
#   命令行入口则在 `validate_args` 里断言 `hidden % heads == 0`（[`arguments.py:1292`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1292)），
#   除非显式给 `--kv-channels`。
#
# ### 初始化：`output_layer_init_method` 给了谁
#
# 名字像是"输出层的初始化"，但按调用处看，用它的是 `linear_proj`（[`attention.py:417`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L417)）
# 和 `linear_fc2`（[`mlp.py:248`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L248)）——每层里把结果加回 residual 的两个 linear；
# `output_layer` 用的是 `init_method`（开 μP 且不共享词嵌入时改用 `embedding_init_method`，[`gpt_model.py:273`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L273)）。
# 8 层、hidden 64、不共享词嵌入，建好后按参数名量每类权重的标准差：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def init_stds(num_layers):
    from megatron.core.models.gpt import GPTModel

    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=64,
                     max_sequence_length=8, share_embeddings_and_output_weights=False)
    weights = {}
    for name, param in model.named_parameters():
        if name.endswith(".weight") and param.dim() == 2:   # linears and embeddings, not norms
            weights.setdefault(name.split(".")[-2], []).append(param.detach().flatten())
    stds = {kind: round(torch.cat(ws).std().item(), 3) for kind, ws in weights.items()}
    return stds, describe(config.init_method), describe(config.output_layer_init_method)


stds, init_method, output_layer_init_method = run_ranks(init_stds, 1, 8)[0]
print("init_method:", init_method, " output_layer_init_method:", output_layer_init_method)
Table(["权重", "实测 std"], sorted(stds.items(), key=lambda kv: kv[1]))

# %% [markdown]
# 0.02 / √16 = 0.005：被缩小的正是 `linear_proj`、`linear_fc2`，而 `output_layer` 和 embedding 都是 0.02。缩小它们的理由
# 是每层往 residual 上加两次，层数越多，residual 的方差累加越多（GPT-2 的做法）；"output"指的是"写回 residual 的输出投影"，
# 不是最后的 logits 层。
#
# ### 从 spec 到模块：三种 spec，建出来逐模块比较
#
# 模型在 2 个 rank（TP=2）上按 spec 建出来。同一份 config（1 层、hidden 16、4 个 head、无 bias）配三种 spec：缺省 local spec；
# 加 `num_experts=2`（MoE）；加 `qk_layernorm=True`、`normalization="RMSNorm"`（config 里同样设 RMSNorm 和 QK norm）。
# 尺寸是参数 `dims`（本篇的 `TINY` 就是这组小尺寸）：`base_config` 把它换成 `TransformerConfig` 的字段，`variants` 造出
# 三个 (spec, config 另设字段) 对——spec 是纯数据，在哪个进程里造都一样；`build_variants` 在每个 rank 上逐个建模型，
# `module_tree` 记下每个模块的路径和类，`parallel_layers` 记下每个 TP 层和它的标志
# （这些函数在 `snippets/experiments/n19_model_topic.py` 里）。后面的冲突实验还要用同一组字段，记作 `BASE`。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(base_config, variants, build_variants, run)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
BASE = dict(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
            add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
            use_cpu_initialization=True, pipeline_dtype=torch.float32)
TINY = EXPERIMENTS["model-topic"].tiny
PAR = Parallel(world=2, tp=2)
built = run_ranks(run, 2, TINY, PAR, grid=dict(tp=2))
same_line, count_rows, diff_rows, expert_rows = tables(built, TINY, PAR)
print(same_line)
count_rows

# %% [markdown]
# 三棵树只在下面这些路径上不同（`diff_trees`；`—` 表示这个模型没有该路径；模型只有 1 层，层内路径省去前缀）：

# %%
diff_rows

# %% [markdown]
# 把三棵树并排画出来（层内每个模块一行，高亮的就是上表的行）：MoE 只在 `mlp` 之下长出一棵新子树，
# RMSNorm + QK norm 换了 3 个 norm 的类、多出 2 个 norm，其余模块三者一样。

# %%
draw_spec_trees({label: b["tree"] for label, b in built[0].items()},
                title="同一份 config、三种 spec：TransformerLayer 的模块树哪里不同")

# %% [markdown]
# 读 diff：
#
# - **MoE 只换了 `mlp` 这一个槽位**：`MLP` 换成 `MoELayer`，下面挂 `router`（`TopKRouter`）和 `experts`
#   （`SequentialMLP`，每个本地 expert 是一个普通 `MLP`，各有自己的 `linear_fc1` / `linear_fc2`）。attention、norm 一个不变。
# - **RMSNorm + QK norm 动了 5 个 norm**：三个层级的 norm（`input_layernorm`、`pre_mlp_layernorm`、`final_layernorm`）从
#   `LayerNorm` 变 `RMSNorm`；`q_layernorm` / `k_layernorm` 从无到有。不开 QK norm 时 `SelfAttention` 把这两个属性设成 `None`
#   （[`attention.py:1722`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1722)），不是模块，不在树里——所以 local 只有 24 个模块，
#   比 RMSNorm + QK norm 的 26 个少的正是这两个。
# - 不在 diff 里的同样值得看：`cross_attention`、`pre_cross_attn_layernorm` 在三棵树里都是 `IdentityOp`，`cross_attn_bda`
#   是 `IdentityFuncOp`——GPT 的 spec 根本没写这几个槽位，取的是 `TransformerLayerSubmodules` 的缺省值；
#   `self_attn_bda`、`mlp_bda` 是函数，`build_module` 原样返回，所以不是模块、不在树里。
#
# 完整的树里，attention 的子模块顺序是 `core_attention`、`linear_proj`、`linear_qkv`，和 forward 顺序不同：

# %%
print([path for path in built[0]["local"]["tree"] if path.startswith("self_attention.")])

# %% [markdown]
# 模块按注册顺序排，而注册顺序就是 `__init__` 里赋值的顺序：基类 `Attention.__init__` 先建 `core_attention` 和
# `linear_proj`，子类 `SelfAttention.__init__` 在 `super().__init__()` 之后才建 `linear_qkv`。`named_parameters()`、
# `state_dict()` 的顺序都随它（笔记 04 的参数表里 `linear_proj` 也排在 `linear_qkv` 前面）。
#
# ### spec 说了算，还是 config 说了算？
#
# spec 与 config 都能"说"用什么 norm、要不要 QK norm、是不是 MoE。故意让两者说法不一致，1 个 rank 上建模型，看建出来的类：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
CONFLICTS = [  # (get_gpt_layer_local_spec arguments, TransformerConfig fields on top of BASE, module)
    (dict(normalization="RMSNorm"), {}, "input_layernorm"),
    ({}, dict(normalization="RMSNorm"), "input_layernorm"),
    (dict(qk_layernorm=True), {}, "self_attention.q_layernorm"),
    ({}, dict(qk_layernorm=True), "self_attention.q_layernorm"),
    ({}, dict(num_moe_experts=2), "mlp"),
    (dict(num_experts=2), {}, "mlp"),
]


def build_conflicts(conflicts):
    parallel_state.initialize_model_parallel()
    built = []
    for spec_kwargs, overrides, path in conflicts:
        try:
            model = GPTModel(config=TransformerConfig(**BASE, **overrides), vocab_size=32,
                             max_sequence_length=8,
                             transformer_layer_spec=get_gpt_layer_local_spec(**spec_kwargs))
            built.append((spec_diff.module_tree(model, strip="decoder.layers.0.")[path], ""))
        except Exception as err:
            built.append((type(err).__name__, str(err).splitlines()[0]))
    return built


def kw(arguments):
    return ", ".join(f"{k}={v}" for k, v in arguments.items()) or "缺省"


conflicts = run_ranks(build_conflicts, 1, CONFLICTS)[0]
Table(["get_gpt_layer_local_spec(...)", "TransformerConfig 另设", "模块", "建出来的"],
      [[kw(spec_kwargs), kw(overrides), path, what]
       for (spec_kwargs, overrides, path), (what, _) in zip(CONFLICTS, conflicts)])

# %% [markdown]
# 两行报错的完整消息：

# %%
for (spec_kwargs, overrides, path), (what, message) in zip(CONFLICTS, conflicts):
    if message:
        print(f"spec {kw(spec_kwargs)} / config {kw(overrides)}: {what}: {message}")

# %% [markdown]
# 三件事三种答案：
#
# - **norm 的种类：config 说了算。** local backend 在没有 Apex 时给的类总是 `WrappedTorchNorm`，它在**实例化时**读
#   `config.normalization` 决定返回 `torch.nn.LayerNorm` 还是 `RMSNorm`；spec 的 `normalization` 参数在这里不起作用。
# - **QK norm：开关在 config，类在 spec。** `SelfAttention` 先看 `config.qk_layernorm`（[`attention.py:1697`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1697)）。
#   关着时不建 QK norm，spec 槽位里若放了真的 norm 类就直接 `ValueError`（[`attention.py:1710`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1710)）——
#   只在 spec 里打开是不行的。开着时用 spec 槽位里的类；缺省 local spec 的槽位是 `IdentityOp`，所以
#   `config.qk_layernorm=True` 配缺省 spec 建出一个什么也不做的 `IdentityOp`，**不报错**（槽位是 `None` 时才退到 TE 的 `TENorm`）。
#   两边都打开（上面的第三种 spec）才真有 QK norm。
# - **MoE：spec 说了算，但两边都要有。** `config.num_moe_experts=2` 配上 dense spec，建出来是普通 `MLP`——**不报错、不警告**，
#   模型悄悄地是稠密的。反过来 spec 要 MoE 而 config 没给 expert 数，`MoELayer` 在构造时拿 `None` 做取模
#   （[`moe_layer.py:185`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L185)），报 `TypeError`。
#
# 两条消息的尾巴不一样长：`build_module` 每包一层就在消息末尾加一句 "when instantiating …"，而 `mlp` 槽位的构造器是
# `TransformerLayer` 直接调用的（[`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431)），不经过 `build_module`，
# 所以 MoE 的错误只带外层的 `TransformerLayer`，QK norm 的错误则还带着经 `build_module` 建的 `SelfAttention`。
#
# 正式入口没有这种不一致：`gpt_builder` 用同一个 `args.num_experts` 既设 config 又选 spec；有 `--num-experts` 时它走
# `get_gpt_decoder_block_spec`，由 config 的 `moe_layer_freq` 给**每一层**挑 dense 或 MoE 的 spec，得到一个
# `TransformerBlockSubmodules`（每层一个 spec），而不是一个被复制 N 次的层 spec：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def block_spec_layers():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    parallel_state.initialize_model_parallel()
    three = {**BASE, "num_layers": 3}
    config = TransformerConfig(**three, num_moe_experts=2, moe_layer_freq=[1, 0, 1])
    block_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    moe_model = GPTModel(config=config, transformer_layer_spec=block_spec, vocab_size=32,
                         max_sequence_length=8)
    layer_spec = get_gpt_layer_local_spec()
    dense_model = GPTModel(config=TransformerConfig(**three), transformer_layer_spec=layer_spec,
                           vocab_size=32, max_sequence_length=8)
    dense_specs = dense_model.decoder.submodules.layer_specs
    return dict(block_spec=type(block_spec).__name__,
                moe_layers=[type(layer.mlp).__name__ for layer in moe_model.decoder.layers],
                dense_specs=len(dense_specs),
                dense_same_object=all(s is layer_spec for s in dense_specs))


print(run_ranks(block_spec_layers, 1)[0])

# %% [markdown]
# 传一个层 spec 时，`_get_block_submodules` 把**同一个**对象放进列表 3 次；传 block spec 时原样使用，每层可以不同。
#
# ### Transformer Engine spec 在这台机器上
#
# 正式入口缺省 `--transformer-impl transformer_engine`。本机没有 TE：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("transformer_engine 可导入:", importlib.util.find_spec("transformer_engine") is not None,
      " gpt_layer_specs.HAVE_TE:", gpt_layer_specs.HAVE_TE)


def build_with_te_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    parallel_state.initialize_model_parallel()
    with transformer_engine_spec_without_te():   # note 04: the real spec, TE classes as stand-ins
        spec = get_gpt_layer_with_transformer_engine_spec()
    try:
        GPTModel(config=TransformerConfig(**BASE), transformer_layer_spec=spec, vocab_size=32,
                 max_sequence_length=8)
    except Exception as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"


print(run_ranks(build_with_te_spec, 1)[0])

# %% [markdown]
# TE spec 本身可以造出来（笔记 04 用真实的 `TESpecProvider` 列出了每个槽位：`TELayerNormColumnParallelLinear` 把 norm 融进
# `linear_qkv` / `linear_fc1`，两个 norm 槽位是 `IdentityOp`），但没有 TE 时那些类只是 `MagicMock` 替身，拿它建模型必然失败。
# 失败的样子有点绕：没有 TE 时 `te` 本身是一个 `MagicMock`（[`transformer_engine.py:84`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L84)），
# `class TELayerNormColumnParallelLinear(te.pytorch.LayerNormLinear)`（[`transformer_engine.py:1122`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L1122)）
# 以一个 mock 为基类，得到的"类"其实也是一个 `MagicMock`，它的 `side_effect` 恰好是基类元组——只能调用一次。
# `SelfAttention` 的 `linear_qkv` 用掉了这一次，`MLP` 再调同一个类建 `linear_fc1` 时抛 `StopIteration`，消息是空的，
# 只剩 `build_module` 加上的 "when instantiating TransformerLayer"。所以本篇的模型都用 local spec；TE 模块的 TP 标志只能读代码，无法在这里运行验证。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### TP=2 的 GPT 里每个并行层
#
# 1 层、hidden 16、ffn 32、4 个 head、词表 32、带 bias（`add_bias_linear` 缺省 True），`share_embeddings_and_output_weights=True`
# 与 `parallel_output=True`（`gpt_builder` 的缺省）。同一个函数建三个模型：只开 TP；再开 sequence parallel；SP 加上 RoPE
# （没有位置嵌入）。每个模型都做一次 forward（带 labels，loss 在 vocab-parallel cross entropy 里算）+ backward，
# `recorder` 记下每个 collective，`collectives_by_submodule`（笔记 11 的工具）把它归到发出它的 TP 层：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TP_VARIANTS = {  # label: (TransformerConfig fields, GPTModel arguments)
    "TP=2": ({}, {}),
    "+SP": (dict(sequence_parallel=True), {}),
    "+SP+RoPE": (dict(sequence_parallel=True), dict(position_embedding_type="rope")),
}


def tp_layers(variants):
    from snippets.record import recorder
    from snippets.tp.layer_walk import collectives_by_submodule, unattributed
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 32, (2, 2, 8), generator=gen)          # [b=2, s=8] each
    position_ids = torch.arange(8).repeat(2, 1)
    causal = torch.triu(torch.ones(1, 1, 8, 8, dtype=torch.bool), diagonal=1)
    out = {}
    for label, (overrides, gpt_kwargs) in variants.items():
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4,
                                   ffn_hidden_size=32, hidden_dropout=0.0, attention_dropout=0.0,
                                   tensor_model_parallel_size=2, use_cpu_initialization=True,
                                   pipeline_dtype=torch.float32, **overrides)
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                         vocab_size=32, max_sequence_length=8, parallel_output=True,
                         share_embeddings_and_output_weights=True, **gpt_kwargs)
        layers = spec_diff.parallel_layers(model)
        paths = [r["path"] for r in layers]
        with recorder.record() as calls, collectives_by_submodule(model, calls, paths) as by:
            model(tokens, position_ids, causal, labels=labels).sum().backward()
        emb = model.embedding.word_embeddings
        out[label] = dict(layers=layers, by_layer=by, calls=calls, other=unattributed(calls, by),
                          vocab_range=(emb.vocab_start_index, emb.vocab_end_index))
    return out


tp = run_ranks(tp_layers, 2, TP_VARIANTS, grid=dict(tp=2))


Table(["层", "类", "作用", "dim", "rank 0 weight"],
      [[short_path(r["path"]), r["cls"], r["role"], r["partition_dim"], r["local_shape"]]
       for r in tp[0]["TP=2"]["layers"]])

# %% [markdown]
# 同一批层构造时被设上的标志（每列一个层；`—` 表示这个类没有该标志）：

# %%
SHOWN = ("gather_output", "input_is_parallel", "sequence_parallel", "skip_bias_add", "allreduce_dgrad")
tp2 = tp[0]["TP=2"]["layers"]
Table(["标志", *(short_path(r["path"]) for r in tp2)],
      [[flag, *(flag_cells(r, (flag,))[0] for r in tp2)] for flag in SHOWN])

# %% [markdown]
# 每个 rank 上的层与标志都一样，只有词表范围不同（`VocabParallelEmbedding` 按 rank 号算出自己的那一段）：

# %%
same = all(tp[0][v]["layers"] == tp[1][v]["layers"] for v in TP_VARIANTS)
print("两个 rank 的并行层、形状、标志完全相同:", same)
print("词表范围 [start, end):", {rank: tp[rank]["TP=2"]["vocab_range"] for rank in range(2)})

# %% [markdown]
# 读这两张表（标志有两类：构造时由调用方写死的参数，和由 config 推出的属性）：
#
# - **两对"先列后行"**：`linear_qkv`（列，`gather_output=False`）→ 本卡的 head 上算 attention → `linear_proj`（行，
#   `input_is_parallel=True`）；`linear_fc1`（列）→ 本卡的激活 → `linear_fc2`（行）。列并行的输出不拼、行并行的输入不切，
#   两者之间的 tensor 一直是 TP 分片，中间不通信。这些标志不来自 config，而是 `SelfAttention` / `MLP` 构造它们时写死的参数。
# - **输出层也是列并行**，`gather_output = not parallel_output = False`：logits 留在 `[s, b, V/TP]`，交给 vocab-parallel cross entropy
#   （[笔记 12](../12_vocab_parallel/)）；它没有自己的 weight（`—`），用的是共享的 `word_embeddings.weight`，词表切法正好相同。
# - **`skip_bias_add=True`**（`linear_proj`、`linear_fc1`、`linear_fc2`）：bias 不在 linear 里加，而是交给下一步融合——
#   `linear_fc1` 的 bias 与激活函数一起算，`linear_proj` / `linear_fc2` 的 bias 在 bias-dropout-add 里与 residual 一起加。
#   `linear_qkv` 后面没有可融合的操作，`skip_bias_add=False`。
# - **`allreduce_dgrad`** 不是参数而是推出来的：TP > 1 且不开 SP 时为 True（[`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)），
#   即"列并行层 backward 时在 TP 群 all-reduce 输入梯度"（[笔记 10](../10_column_row_parallel_linear/)）。
#
# 开 SP（`+SP`）、再把位置编码换成 RoPE（`+SP+RoPE`），哪些标志变了（只列有变化的）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def flag_changes(variants):
    rows = []
    first = tp[0][variants[0]]["layers"]
    for i, row in enumerate(first):
        for flag in row["flags"]:
            values = [tp[0][v]["layers"][i]["flags"][flag] for v in variants]
            if len(set(values)) > 1:
                rows.append([short_path(row["path"]), flag, *values])
    return rows


Table(["层", "标志", *TP_VARIANTS], flag_changes(list(TP_VARIANTS)))

# %% [markdown]
# `sequence_parallel` 不是构造参数，每个 linear 从 `config.sequence_parallel` 读；开了它，列并行层的 `allreduce_dgrad` 就关掉
# （输入梯度改由 reduce-scatter 处理）。词嵌入的 `reduce_scatter_embeddings` 只有在 SP **且没有位置嵌入**时才为 True
# （`LanguageModelEmbedding.__init__`）：learned_absolute 时词嵌入要先与位置嵌入相加，所以先 all-reduce、相加之后再切 sequence。
#
# ### 标志换来的通信
#
# 每个 TP 层在 rank 0 上发出的 collective（rank 1 相同）。最后一行是不在任何 TP 层里发出的：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def layer_row(path, variants):
    cells = []
    for v in variants:
        by = tp[0][v]["by_layer"]
        cells += [apis(only_in(by, path, "forward")), apis(only_in(by, path, "backward"))]
    return [short_path(path), *cells]


def other_row(variants):
    cells = []
    for v in variants:
        other = tp[0][v]["other"]
        cells += [apis([c for c in other if c.phase == phase]) for phase in ("forward", "backward")]
    return ["其余（不在 TP 层里）", *cells]


headers = ["层"] + [f"{v} {phase}" for v in TP_VARIANTS for phase in ("fwd", "bwd")]  # 3 runs × 2
Table(headers, [layer_row(r["path"], TP_VARIANTS) for r in tp[0]["TP=2"]["layers"]]
      + [other_row(TP_VARIANTS)])

# %% [markdown]
# - **只开 TP**：forward 的 all-reduce 正好出在三个"行并行式"的位置——词嵌入（每个 rank 只查到自己词表段里的词，求和）、
#   `linear_proj`、`linear_fc2`；backward 的 all-reduce 出在三个列并行层（`allreduce_dgrad`），包括输出层。
#   "其余"是 cross entropy 的 3 次 all-reduce（max、目标 logit、exp 之和），不属于任何层。
# - **+SP**：行并行层 forward 的 all-reduce 变 reduce-scatter（backward 是它的反向 all-gather）；列并行层 forward 先
#   all-gather 输入，backward 既要 reduce-scatter 输入梯度，又要再 all-gather 一次输入——forward 只存了 sequence 分片，
#   算 weight 梯度需要完整输入（笔记 11 的"机制解释"）。"其余"多了一次 backward all-gather：位置嵌入相加后切 sequence
#   的那一步（`scatter_to_sequence_parallel_region`），它的反向要把梯度拼回来。
# - **+SP+RoPE**：词嵌入的 all-reduce 直接变成 reduce-scatter（`reduce_scatter_embeddings=True`），那次切分也就不需要了。
#   "其余"的 backward all-gather 这时是词嵌入 reduce-scatter 的反向：词嵌入的输入是 token id，不求梯度，
#   hook 量不出它的 backward 区间，所以记在层外。
#
# 只开 TP 时 rank 0 的完整通信记录（roadmap 第二轮的格式；发出者由上面的归属得到，meaning 按发出它的 Megatron 函数给）。第 1 行的 `[2, 8, 16]` 是 `[b, s, h]`：词嵌入在转置成
# Megatron 的 `[s, b, h]` 之前就做了 all-reduce，之后各层都是 `[s, b, h]`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
MEANINGS = {  # issuing function -> what the collective is for
    "tensor_parallel/mappings.py::_reduce": "g：部分和相加",
    "tensor_parallel/cross_entropy.py::forward": "cross entropy：合并各段词表的 max / 目标 logit / exp 之和",
    "tensor_parallel/layers.py::backward": "输入梯度是部分和，求和（allreduce_dgrad）",
}
run = tp[0]["TP=2"]
owner = {**{id(c): "（层外）" for c in run["other"]}, **owner_of(run["by_layer"])}
Table(["phase", "发出它的层", "API · group", "shape before → after", "meaning"],
      [[c.phase, short_path(owner[id(c)]), f"{c.api} · {c.group} {list(c.ranks)}",
        f"{c.before} → {c.after}", MEANINGS[c.where]] for c in run["calls"]])

# %% [markdown]
# ### MoE 模型里的 expert linear
#
# 前面 TP=2 建的 MoE 模型里，每个 expert 的 `linear_fc1` / `linear_fc2` 也是列并行 / 行并行层，但它们带 `is_expert=True`：

# %%
expert_rows

# %% [markdown]
# 它们切在 **expert TP 群**（ETP 缺省 = TP = 2）上，`explicit_expert_comm=True`（[`layers.py:960`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L960)）：
# forward / backward 里不再自己做 f / g（`allreduce_dgrad` 虽然是 True，forward 时被 `explicit_expert_comm` 覆盖成 False），
# token 的收集与归约交给 token dispatcher（[笔记 17](../17_moe_expert_parallel/)）。同一个类，放在 expert 里就换了一套通信责任。

# %% [markdown]
# ## 机制解释
#
# **config 给数字，spec 给类，但不是一刀切。** 构造链上每一层都同时收到 config 和自己那一段 spec：spec 决定"这个槽位放哪个类"
# （attention 的实现、MLP 还是 MoE、有没有 QK norm、norm 与 linear 是否融合），config 决定"多大、切几份、什么精度"。
# 例外出在"类本身也看 config"的地方：`WrappedTorchNorm` 是一个工厂，实例化时才按 `config.normalization` 选类；
# QK norm 建不建由 `config.qk_layernorm` 决定，spec 只给类。上面的冲突实验说明：想知道建出了什么，
# 最可靠的办法是把模型建出来看。
#
# **`build_module` 只做三件事。** 给它函数就原样返回（bda）；给它类或带类的 `ModuleSpec`，就把 spec 的 `submodules` 作为
# 关键字参数、`params` 与调用方的参数合并，然后实例化；失败时把类名追加到异常消息里。spec 嵌套（层 → attention → linear），
# 实例化也嵌套：每个模块的 `__init__` 拿着自己的 `submodules` 往下建。但多数槽位已经不经过 `build_module`，而是直接调用：
# `TransformerLayer` 的三个 norm 和 `mlp` 构造器、`Attention.__init__` 的 `core_attention` 与 `linear_proj`、`SelfAttention.__init__`
# 的 `linear_qkv` 与 QK norm、`MLP.__init__` 的 `linear_fc1` / `linear_fc2`。还走 `build_module` 的只剩 `TransformerBlock` 建每一层、
# `TransformerLayer` 建 attention 和 bda。`ModuleSpec` 自己可调用（`__call__` 转给 `build_module`，[`spec_utils.py:34`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L34)），
# 所以直接调用的槽位放类、放 spec、放 `partial` 都行。
#
# **TP 标志由"谁调用"决定。** 同一个 `ColumnParallelLinear` 类，在 `SelfAttention` 里是 `gather_output=False`，在输出层是
# `gather_output=not parallel_output`，在 expert 里带 `is_expert=True`。所以"一个 TP 层怎样嵌进模型"要看构造它的那一行，
# 而 `sequence_parallel`、`allreduce_dgrad` 这类全局开关则由 config 统一推出，整个模型一致。
#
# **`__post_init__` 是第二道命令行解析。** 命令行入口先在 `validate_args` 里算一部分缺省值，再同名拷贝成 config，config
# 再推导剩下的并做合法性检查。两处都有缺省规则，规则不同时（`ffn_hidden_size`），结果取决于走哪条路。

# %% [markdown]
# ## 与训练主链路的关系
#
# 本篇展开的是 `setup_model_and_optimizer` 建模型这一步（笔记 04：0.19.0 经 `GPTModelBuilder`，退路是 `get_model` →
# `model_provider` → `gpt_builder`）里的 `core_transformer_config_from_args` 和 `GPTModel(config, spec)`。同一个 config 之后还被 DDP、优化器、schedule 读取
# （`sequence_parallel` 决定 `finalize_model_grads` 要不要归约 norm 的梯度，笔记 11、14）；本篇表里的 TP 标志决定
# `forward_step` 里每一次 TP 通信（[笔记 05](../05_forward_loss_backward/)）；参数上的切分属性被 DDP、分布式优化器、checkpoint 读取
# （笔记 06、15、07）。simple loop 里对应的是手写的 `TransformerConfig(...)` 加 `GPTModel(config, get_gpt_layer_local_spec(), ...)`。

# %% [markdown]
# ## 与基础知识的连接
#
# - **dataclass 的 `__post_init__`**：生成的 `__init__` 赋完值后调用它，适合做派生字段和校验；代价是"传入的"与"拿到的"
#   可以不同，读 config 要看它的最终值（本篇第一张表）。
# - **依赖注入 / 工厂**：spec 把"用哪个类"从模型代码里拿出来，换实现（local、TE、MoE、推理优化版）不用改 `GPTModel`。
# - **`nn.Module` 的注册顺序**：子模块、参数按赋值顺序登记，`named_parameters()` 与 `state_dict()` 都按这个顺序，不一定是 forward 顺序。
# - **Megatron 的 TP 配对**：`Y = XW` 先按列切（输出不拼）再按行切（输入已切），一对只在末尾通信一次；embedding 和输出层按词表切。

# %% [markdown]
# ## 遗留问题
#
# 1. **spec 的 `normalization` 参数在没有 Apex / TE 时不起作用；有 Apex 时还有副作用（只读代码）。** 本机冲突实验表明 norm 的种类
#    只看 `config.normalization`。`LocalSpecProvider.layer_norm(rms_norm=True)` 会把 `backends.py` 的模块全局变量 `LNImpl`
#    改成 `WrappedTorchNorm`（[`backends.py:126`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L126)，代码旁的注释自己也在问为什么）。
#    装了 Apex 时 `LNImpl` 原本是 `FusedLayerNorm`，那么同一进程里一旦造过 RMSNorm 的 local spec，之后所有 local spec 的 LayerNorm
#    都会变成 torch 版。本机没有 Apex，无法运行验证。
# 2. **config 里的 `num_moe_experts`、`qk_layernorm` 可能被静默忽略（运行确认）。** dense spec 配 `num_moe_experts=2` 建出普通 `MLP`，
#    config `qk_layernorm=True` 配缺省 spec 建出什么也不做的 `IdentityOp`，都没有任何提示（反方向的 QK norm 会报错，见上文）。正式入口用同一个 `args.num_experts` 选 spec（[`gpt_builders.py:41`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L41)），
#    不会踩到；自己写 provider 时（simple loop 那样）要让两者一致。
# 3. **`ffn_hidden_size` 的两套缺省（运行 + 读代码）。** 命令行 `--swiglu` 时是 `⌊(8h/3)/64⌋·64`，Core 是 `4h`；
#    hidden < 24 时命令行得 0，`TransformerConfig` 接受 `ffn_hidden_size=0` 不报错（下面一格）。
# 4. **`output_layer_init_method` 不是输出层的初始化（运行确认）。** 见上文的标准差表。
# 5. **`allreduce_dgrad` 对 expert linear 是 True，但不生效。** 属性按 TP 大小推出，forward 时才被 `explicit_expert_comm`
#    覆盖（[`layers.py:1157`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1157)）；
#    读模块属性判断通信会被误导，本篇对 expert 的通信没有录制，留给笔记 17 的录制结果。

# %%
zero = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=0)
print("TransformerConfig(ffn_hidden_size=0) 构造成功，ffn_hidden_size =", zero.ffn_hidden_size)

# %% [markdown]
# ## 自测
#
# **1. `--hidden-size 4096 --num-attention-heads 32 --swiglu`，不给 `--ffn-hidden-size`：命令行入口得到多宽的 MLP？
# simple loop 式地直接写 `TransformerConfig(gated_linear_unit=True)` 又是多宽？**
#
# <details><summary>答案</summary>
#
# 命令行：`validate_args` 取 `⌊4·4096·2/3/64⌋·64 = 10880`。直接写 config：`__post_init__` 取 `4·4096 = 16384`，不看是否门控。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(cli_default_ffn_hidden_size(4096, swiglu=True), core_default_ffn(4096))

# %% [markdown]
# **2. `TransformerConfig(normalization="RMSNorm")` 配 `get_gpt_layer_local_spec()`（没传 `normalization`），建出的
# `input_layernorm` 是什么？反过来呢？**
#
# <details><summary>答案</summary>
#
# 都听 config：前者是 `RMSNorm`，spec 传 `normalization="RMSNorm"` 而 config 是缺省 LayerNorm 时是 `LayerNorm`。
# 没有 Apex 时 local spec 的 norm 类是 `WrappedTorchNorm`，实例化时才读 `config.normalization`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({f"spec {kw(s)} / config {kw(o)}": what
       for (s, o, path), (what, _) in zip(CONFLICTS, conflicts) if path == "input_layernorm"})

# %% [markdown]
# **3. 12 个 head、3 个 query group、TP=4：`TransformerConfig` 接受吗？TP=3 呢？**
#
# <details><summary>答案</summary>
#
# TP=4：head 数 12 是 4 的倍数，但 3 个 group 既不是 4 的倍数也不是 4 的约数，`ValueError`。TP=3：12 % 3 = 0，3 个 group 每 rank 一个，接受。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
for tp_size in (4, 3):
    print(f"TP={tp_size}:", first_line(dict(num_attention_heads=12, num_query_groups=3,
                                            tensor_model_parallel_size=tp_size))[0])

# %% [markdown]
# **4. TP=2 的 GPT 里哪些并行层 `input_is_parallel=True`？为什么 `linear_qkv` 不需要 `gather_output=True`？**
#
# <details><summary>答案</summary>
#
# `linear_proj` 和 `linear_fc2`（行并行层）。`linear_qkv` 输出的是本卡那几个 head 的 Q、K、V，本卡的 attention 只需要它们；
# 算完的 context 仍按 head 切，正好是 `linear_proj` 要的"已切好的输入"。拼起来反而要多一次 all-gather 再切掉。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
tp2_layers = {short_path(r["path"]): r for r in tp[0]["TP=2"]["layers"]}
print([name for name, r in tp2_layers.items() if r["flags"].get("input_is_parallel") is True],
      tp2_layers["linear_qkv"]["flags"]["gather_output"])

# %% [markdown]
# **5. 8 层模型（`init_method_std=0.02`）里，`linear_fc2` 和 `output_layer` 的初始化标准差各是多少？**
#
# <details><summary>答案</summary>
#
# `linear_fc2` 用 `output_layer_init_method`：0.02 / √(2·8) = 0.005。`output_layer` 用 `init_method`：0.02。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(stds["linear_fc2"], stds["output_layer"], round(0.02 / (2 * 8) ** 0.5, 4))

# %% [markdown]
# ## 30-second answer
#
# `GPTModel` takes two inputs: a `TransformerConfig` for numbers and a `ModuleSpec` for classes. It builds a
# `LanguageModelEmbedding`, a `TransformerBlock` that calls `build_module` on the layer spec once per local layer, and a
# column-parallel output layer. `__post_init__` fills `ffn_hidden_size`, `kv_channels`, `num_query_groups` and the init
# methods, and rejects head or group counts TP cannot split. The spec picks attention, MLP or MoE and the QK norm class,
# but the torch norm reads `config.normalization`, and QK norm exists only when `config.qk_layernorm` is on (a spec norm
# with it off raises). At TP=2, `linear_qkv` and `linear_fc1` are column-parallel without gathering;
# `linear_proj` and `linear_fc2` row-parallel with `input_is_parallel`.
