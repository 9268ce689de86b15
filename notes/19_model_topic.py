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
# [笔记 04](../04_model_provider_and_gpt_model/) 已经走过"谁造模型"（0.19.0 的正式入口是 `GPTModelConfig` → `GPTModelBuilder` →
# `GPTModel`）和 TP=2 时每个参数的切法，[笔记 11](../11_transformer_layer/) 把一层拆开走了 forward。这一篇逐条回答路线图模型专题的
# 四个关注点：`TransformerConfig` 在构造时自己改了哪些字段、拒绝哪些组合，layer spec 与 config 各决定什么、说法不一时谁说了算，
# TP 层带着什么标志嵌进模型、换来哪些通信——以及建模型这一步本身会不会通信？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出 `GPTModel` 怎样由 config 和 layer spec 建出来：每个槽位在哪一步、以什么参数变成模块；建模型时有没有通信。
# 2. 说出 `TransformerConfig` 怎样承接命令行：`__post_init__` 推导哪些字段、拒绝哪些组合，命令行入口先替它算了什么。
# 3. 说清 layer spec 怎样决定 attention / MLP / normalization / MoE，spec 与 config 不一致时谁说了算。
# 4. 说出 TP=2 的 GPT 里每个并行层的切法、`gather_output` / `input_is_parallel` / `sequence_parallel` 等标志和它们换来的通信。
#
# **结论**
#
# - config 给数字、spec 给类：同一份 config 换 spec，local 建 24 个模块，MoE 只换 `mlp` 槽位（31 个），RMSNorm + QK norm 26 个。
# - 建模型只在 PP > 1 且共享词嵌入（或有 MTP）时通信：首尾 stage 在 embedding 群 all-reduce 一次 `[32, 16]`。
# - `__post_init__` 补缺省：ffn 一律 `4h`，命令行 `--swiglu` 却给 `8h/3` 取整（hidden 4096：16384 对 10880）。
# - `output_layer_init_method`（8 层时 std 0.005）给的是 `linear_proj`、`linear_fc2`，输出层用 `init_method`（0.02）。
# - spec 与 config 可以不一致：dense spec 配 2 个 expert 静默建出 `MLP`，正式入口给了 `--spec` 就不看 `--num-experts`。
# - TP=2 两对"列并行 → 行并行"：forward 的 3 次 all-reduce 在词嵌入、`linear_proj`、`linear_fc2`，backward 的在三个列并行层。
#
# 先读：[笔记 04](../04_model_provider_and_gpt_model/)（谁造模型）、[笔记 10](../10_column_row_parallel_linear/)（列/行并行）、[笔记 11](../11_transformer_layer/)（一层）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import importlib.util

import torch

from snippets.config.config_derived import cli_default_ffn_hidden_size, describe, post_init_changes
from snippets.config.model_args import OVERRIDES, cli_flags, transformer_config_fields
from snippets.config.model_runs import (BASE, CONFLICTS, TP_VARIANTS, block_spec_layers, build_conflicts,
                                        build_with_te_spec, init_stds, tp_layers)
from snippets.config.pictures import draw_spec_trees, draw_tp_model
from snippets.config.spec_diff import flag_cells
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n19_model_topic import base_config, build_variants, run, short_path, tables, variants
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.tp.layer_walk import apis, only_in, owner_of

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel, gpt_layer_specs
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

tp = run_ranks(tp_layers, 2, TP_VARIANTS, grid=dict(tp=2))  # TP=2, +SP, +SP+RoPE: layers, flags, collectives
ORDER = ("word_embeddings", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "output_layer")
layer_of = {short_path(r["path"]): r for r in tp[0]["TP=2"]["layers"]}


def comm_cells(variant, phase):
    """The collectives each TP layer (in forward order), then the code outside every layer, issued."""
    by, other = tp[0][variant]["by_layer"], tp[0][variant]["other"]
    return ([apis(only_in(by, layer_of[name]["path"], phase)) for name in ORDER]
            + [apis([c for c in other if c.phase == phase])])


draw_tp_model([[name, layer_of[name]["cls"], layer_of[name]["partition_dim"], layer_of[name]["local_shape"]]
               for name in ORDER] + [["cross entropy", None, None, None]],
              [(f"{v} {phase}", comm_cells(v, phase)) for v in ("TP=2", "+SP") for phase in ("forward", "backward")],
              title="TP=2 的 GPT：两对列并行 → 行并行；forward 在词嵌入、linear_proj、linear_fc2 all-reduce，backward 在三个列并行层")

# %% [markdown]
# 每一列是一个 TP 层（按 forward 顺序）和层外的 cross entropy；方块是切法和 rank 0 的 weight，下面四行是只开 TP、再开 SP 时这一列发出的通信。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 模型都在本机 gloo rank 上用真实的 `megatron.core` 建：`TransformerConfig` + `get_gpt_layer_local_spec()`（只用 Megatron Core
#   自己的模块，本机没有 Transformer Engine）+ `GPTModel`，`use_cpu_initialization=True`。
# - 主图和 TP 标志、通信表：`snippets/config/model_runs.py` 的 `tp_layers` 在 2 个 rank（TP=2）上建三个 1 层 GPT（只开 TP、加 SP、
#   SP 加 RoPE；hidden 16、ffn 32、4 个 head、词表 32、带 bias、共享词嵌入），各做一次带 labels 的 forward + backward；
#   记录器记下每个 collective，`snippets/tp/layer_walk.py` 的 `collectives_by_submodule`（笔记 11 的工具）用 forward hook 和梯度 hook
#   把它归到发出它的 TP 层，`snippets/config/spec_diff.py` 的 `parallel_layers` 读每个 TP 层的标志。
# - 三种 spec 的模块树：实验 `model-topic`（`snippets/experiments/n19_model_topic.py`）在 2 个 rank 上建三个模型，`module_tree` 记每个模块的类；
#   尺寸是它的 `tiny`（1 层、hidden 16、4 个 head、无 bias）。spec 与 config 的冲突、block spec、初始化标准差、TE spec 在 1 个 rank 上跑。
# - `TransformerConfig` 的表直接在笔记进程里构造 config（不需要进程群）；命令行入口的缺省值由 `snippets/config/config_derived.py` 照 tag 重写
#   `validate_args` 的那几行，flag 名由 `snippets/config/model_args.py` 按笔记 04 的规则算出。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 model-topic --tp 2`（三种 spec 的表）；整页：`scripts/execute_notes.sh notes/19_model_topic.py`。
# - CPU 上的改动见文末"在 CPU 上怎么跑的"。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(tp_layers, build_conflicts)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(base_config, variants, build_variants, run)

# %% [markdown]
# ## 源码位置
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`gpt_model.py::GPTModel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L94) | 建 embedding、decoder、输出层 |
# | [`transformer_block.py::TransformerBlock._build_layers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L324) | 对每个层 spec 调 `build_module` |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 函数原样返回；类带上 `submodules`、`params` 实例化 |
# | [`transformer_layer.py::TransformerLayer.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L309) | 逐槽位建模块；`mlp` 槽位是构造器 |
# | [`attention.py::SelfAttention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1651) | `linear_qkv` 与 QK norm（`config.qk_layernorm` 开关） |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 用 Megatron Core 自己的模块拼一层 |
# | [`torch_norm.py::WrappedTorchNorm.__new__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L33) | 实例化时按 `config.normalization` 选类；拒绝 SP |
# | [`transformer_config.py::TransformerConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1294) | 推导缺省字段、拒绝不合法的组合 |
# | [`language_module.py::LanguageModule.setup_embeddings_and_output_layer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L202) | PP > 1 且共享词嵌入时 all-reduce 词嵌入 |
# | [`layers.py::ColumnParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L918)、[`layers.py::RowParallelLinear.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1285) | `gather_output`、`allreduce_dgrad`；`input_is_parallel`、`skip_bias_add` |
# | [`argument_utils.py::gpt_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L433) | 正式入口：args → `GPTModelConfig`，`--spec` 直接当 layer spec |
#
# <details><summary>其余 17 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`language_model_embedding.py::LanguageModelEmbedding.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/language_model_embedding.py#L29) | 词嵌入（TP 切）+ 位置嵌入（复制）；SP 时是否 reduce-scatter |
# | [`transformer_block.py::TransformerBlock.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L264) | 拿到 spec，建本 stage 的层 |
# | [`transformer_block.py::_get_block_submodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L220) | 一个层 spec → `[spec] × 层数`；block spec 原样用 |
# | [`transformer_block.py::TransformerBlockSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_block.py#L201) | 每层一个 spec + final norm 的类 |
# | [`spec_utils.py::ModuleSpec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L13) | spec 是数据：`module`、`params`、`submodules` |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层的槽位；没给的槽位是 `IdentityOp` / `IdentityFuncOp` |
# | [`attention.py::Attention.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L296) | 先建 `core_attention`、`linear_proj` |
# | [`mlp.py::MLP.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L172) | `linear_fc1`（列并行）、`linear_fc2`（行并行） |
# | [`gpt_layer_specs.py::get_mlp_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L521) | `mlp` 槽位的构造器：dense 或 MoE |
# | [`moe_module_specs.py::get_moe_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/moe_module_specs.py#L65) | `partial(MoELayer, submodules=...)` |
# | [`gpt_layer_specs.py::get_gpt_decoder_block_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L676) | 按 `moe_layer_freq` 给每层挑 dense 或 MoE spec |
# | [`backends.py::LocalSpecProvider.layer_norm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L118) | local backend 的 norm 类（会改模块全局变量，见坑 5） |
# | [`model_parallel_config.py::ModelParallelConfig.__post_init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L497) | 先于 `TransformerConfig.__post_init__`：SP 需要 TP、ETP 跟随 TP |
# | [`layers.py::VocabParallelEmbedding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L230) | 按词表切的 embedding |
# | [`argument_utils.py::core_transformer_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L277) | args → `TransformerConfig`（笔记 04 的表） |
# | [`arguments.py::validate_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L388) | 在 config 之前先填 `ffn_hidden_size`、`kv_channels` |
# | [`gpt_builders.py::gpt_builder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L25) | 退路：`--spec`，否则按 `args.num_experts` 选 spec |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `GPTModel.__init__` 建 `LanguageModelEmbedding`、`TransformerBlock`（对每层的 spec 调 `build_module`）和输出层，最后
# `setup_embeddings_and_output_layer`；每个 TP 层只按本 rank 的 TP 坐标建自己那片权重。
#
# <details><summary>完整调用链</summary>
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
# └─ setup_embeddings_and_output_layer (L202)      # PP>1 且共享词嵌入：embedding 群 all-reduce（L308）
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `GPTModel.__init__`、`core_transformer_config_from_args` 在正式入口里的位置见[笔记 04](../04_model_provider_and_gpt_model/)；`ColumnParallelLinear` / `RowParallelLinear` 的 forward 见[笔记 10](../10_column_row_parallel_linear/)。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `TransformerConfig.__post_init__` | 构造时给的字段 | 同一个对象，缺省字段被填好 | `ModelParallelConfig.__post_init__`、`init_method_normal` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` |
# | `validate_args`（ffn / kv 两段） | `args` | 改写后的 `args` | 无 | 否（只用大小做算术） | 否 | 否 | 无（simple loop 直接写 config） |
# | `get_gpt_layer_local_spec` | `num_experts`、`qk_layernorm`、`normalization`… | `ModuleSpec`（纯数据；`mlp` 槽位是一个 `partial` 构造器） | `LocalSpecProvider`、`get_mlp_module_spec_for_backend` | 否 | 否 | 否（但会改 `backends.LNImpl`） | `get_gpt_layer_local_spec()` |
# | `get_gpt_decoder_block_spec` | config、backend | `TransformerBlockSubmodules`（每层一个 spec） | 上一行、`get_num_layers_to_build` | 读 PP 坐标 | 否 | 否 | 无 |
# | `build_module` | spec 或类、构造参数 | 模块（函数原样返回） | 无 | 否 | 否 | 建参数 | 隐含在 `GPTModel(...)` 里 |
# | `TransformerBlock.__init__` / `_build_layers` | config、spec | `layers`、`final_layernorm` | `build_module`、`TransformerLayer` | 读 PP 坐标（本 stage 几层、层号偏移） | 间接 | 是 | 同上 |
# | `TransformerLayer.__init__` | config、`TransformerLayerSubmodules`、层号 | 一层 | `build_module`、`SelfAttention`、`mlp` 构造器（`MLP` / `MoELayer`） | 把 `pg_collection` 交给 attention 与 `mlp` 构造器 | 间接 | 是 | 同上 |
# | `setup_embeddings_and_output_layer` | 本 stage 的词嵌入 / 输出层 | 无（改权重与属性） | 无 | PP > 1 且共享词嵌入时 embedding 群 all-reduce | 否 | 是：尾 stage 的副本 | 无（simple loop 是 PP=1） |
# | `ColumnParallelLinear.__init__` / `RowParallelLinear.__init__` | 全局 in/out、config、标志 | 本 rank 的权重分片 | `_initialize_affine_weight_cpu`、`set_tensor_model_parallel_attributes` | 读 TP 群大小与坐标 | **是**：dim 0 / dim 1 | 是 | 同上 |
# | `WrappedTorchNorm.__new__` | config、hidden | `torch.nn.LayerNorm` 或 `RMSNorm` | 无 | 否 | 否 | 是：参数 | 同上 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### `TransformerConfig`：传进去的不等于拿到的
#
# `TransformerConfig` 是 dataclass，构造时先跑 `ModelParallelConfig.__post_init__`，再跑自己的 `__post_init__`：留成 `None` 的字段在这里被推导出来。
# 只给四个数（2 层、hidden 64、8 个 head、TP=2），列出所有被改过的字段：

# %%
given = dict(num_layers=2, hidden_size=64, num_attention_heads=8, tensor_model_parallel_size=2)
changed = post_init_changes(TransformerConfig, **given)       # TransformerConfig(**given), field by field
fields = transformer_config_fields()
Table(["字段", "传入", "`__post_init__` 之后", "命令行 flag"],
      [[c["name"], describe(c["given"]), describe(c["final"]),
        (" / ".join(cli_flags(fields[c["name"]])) or "无") + ("；from_args 手工设" if c["name"] in OVERRIDES else "")]
       for c in changed])

# %% [markdown]
# - **形状**：`ffn_hidden_size = 4h`、`kv_channels = h // heads`、`num_query_groups = heads`（MHA）
#   （[`transformer_config.py:1329`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1329) 起）。
# - **初始化**：`init_method = N(0, 0.02)`；`output_layer_init_method` 的 std 再除以 `√(2·num_layers)`
#   （[`transformer_config.py:2263`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2263)），2 层时 0.01。
#   这三个 init 方法没有命令行参数，只能由 `--init-method-std` 间接决定。
# - **并行**：`expert_tensor_parallel_size` 跟随 TP（[`model_parallel_config.py:507`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L507)），
#   `autocast_dtype` 跟随 `params_dtype`；已废弃的 `cuda_graph_modules="full"` 被改成空列表（[`transformer_config.py:2440`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L2440)）。
#
# 走正式入口时，`validate_args` 在 config 之前就算好了 `ffn_hidden_size`、`kv_channels`，所以 `__post_init__` 的这两条只对
# simple loop 这类直接写 config 的用户生效。两处的算法并不一样：`--swiglu` 且不给 `--ffn-hidden-size` 时，`validate_args` 取 `4h` 的
# 三分之二、向下取到 64 的倍数（门控 MLP 有两个输入矩阵，这样参数量与 `4h` 的普通 MLP 相当，
# [`arguments.py:1287`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1287)）；`TransformerConfig` 不看 `gated_linear_unit`，一律 `4h`：

# %%
def core_default_ffn(hidden_size):
    return TransformerConfig(num_layers=1, hidden_size=hidden_size, num_attention_heads=4,
                             gated_linear_unit=True).ffn_hidden_size


Table(["hidden", "命令行 --swiglu", "Core gated_linear_unit"],
      [[h, cli_default_ffn_hidden_size(h, swiglu=True), core_default_ffn(h)] for h in (16, 64, 4096)])

# %% [markdown]
# 同一个 SwiGLU 模型，走命令行和直接写 config 得到的 MLP 宽度差 1.5 倍；hidden 小于 24 时命令行甚至给出 0，而
# `TransformerConfig(ffn_hidden_size=0)` 不报错（坑 3）。实践中总是显式给 `--ffn-hidden-size`。
#
# `__post_init__` 里有上百个检查，大多与 FP8、MoE 的可选功能有关。和结构、并行切分直接相关的几个，逐个触发：

# %%
def first_line(kwargs):
    try:
        config = TransformerConfig(**{"num_layers": 1, "hidden_size": 16, **kwargs})
    except (ValueError, AssertionError) as err:
        return [type(err).__name__, str(err).splitlines()[0]]
    return ["不报错", f"kv_channels = {config.kv_channels}，heads × kv_channels = "
                     f"{config.num_attention_heads * config.kv_channels}"]


REJECTED = {
    "6 个 head，TP=4": dict(num_attention_heads=6, tensor_model_parallel_size=4),
    "3 个 query group，TP=2": dict(num_attention_heads=8, num_query_groups=3, tensor_model_parallel_size=2),
    "sequence_parallel，TP=1": dict(num_attention_heads=4, sequence_parallel=True),
    "2 个 expert + linear bias，TP=2": dict(num_attention_heads=4, num_moe_experts=2, tensor_model_parallel_size=2),
    "hidden 10，4 个 head": dict(hidden_size=10, num_attention_heads=4),
}
Table(["组合", "结果", "第一行"], [[what, *first_line(kwargs)] for what, kwargs in REJECTED.items()])

# %% [markdown]
# 前两条保证 TP 能整齐地切 attention：每个 rank 拿整数个 head，并且要么拿整数个 query group、要么几个 rank 共享一个；
# SP 沿 sequence 切的是 TP 群里的激活，没有 TP 就无从切起。第四条是 `AssertionError`：`add_bias_linear` 缺省为 True、ETP 又跟随 TP，
# 所以"TP=2 的 MoE"不关掉 bias 就建不了 config。最后一条**不报错**：Core 允许 `heads × kv_channels ≠ hidden`，命令行入口则在
# `validate_args` 里断言整除（[`arguments.py:1292`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L1292)）。
#
# **`output_layer_init_method` 给了谁。** 名字像"输出层的初始化"，用它的却是 `linear_proj`
# （[`attention.py:417`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L417)）和 `linear_fc2`
# （[`mlp.py:248`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L248)）——每层把结果加回 residual 的两个 linear；
# `output_layer` 用 `init_method`（[`gpt_model.py:273`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L273)）。
# 8 层、hidden 64、不共享词嵌入，建好后按参数名量每类权重的标准差：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
stds, init_method, output_layer_init_method = run_ranks(init_stds, 1, 8)[0]
print("init_method:", init_method, " output_layer_init_method:", output_layer_init_method)
Table(["权重", "实测 std"], sorted(stds.items(), key=lambda kv: kv[1]))

# %% [markdown]
# 0.02 / √16 = 0.005：缩小的是每层往 residual 上加的两个投影，层数越多 residual 的方差累加越多（GPT-2 的做法）；"output"指
# "写回 residual 的输出投影"，不是 logits 层。
#
# ### layer spec：槽位里放哪个类
#
# spec 是数据：`get_gpt_layer_local_spec` 返回一个 `ModuleSpec`，每个槽位写着类；`mlp` 槽位放的是一个构造器（`partial`），
# `num_experts` 决定它造 `MLP` 还是 `MoELayer`：

# %%
for kwargs in ({}, dict(num_experts=2), dict(qk_layernorm=True, normalization="RMSNorm")):
    slots = get_gpt_layer_local_spec(**kwargs).submodules
    attention = slots.self_attention.submodules
    print(f"{str(kwargs) or '缺省':48}", "mlp:", getattr(slots.mlp.func, "__qualname__", slots.mlp.func),
          "| norm:", slots.input_layernorm.__name__, "| q_layernorm:", getattr(attention.q_layernorm, "__name__", None))

# %% [markdown]
# 同一份 config（1 层、hidden 16、4 个 head、无 bias）配这三种 spec，在 TP=2 的 2 个 rank 上把模型建出来，逐模块比较：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
TINY = EXPERIMENTS["model-topic"].tiny
PAR = Parallel(world=2, tp=2)
built = run_ranks(run, 2, TINY, PAR, grid=dict(tp=2))
same_line, count_rows, diff_rows, expert_rows = tables(built, TINY, PAR)
print(same_line)
count_rows

# %% tags=["hide-input"] jupyter={"source_hidden": true}
draw_spec_trees({label: b["tree"] for label, b in built[0].items()},
                title="同一份 config、三种 spec：MoE 只换 mlp 槽位，RMSNorm + QK norm 换了 3 个 norm、多出 2 个")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
diff_rows  # the picture's highlighted rows: where the three trees differ

# %% [markdown]
# - **MoE 只换了 `mlp` 这一个槽位**：`MLP` 换成 `MoELayer`，下面挂 `router`（`TopKRouter`）和 `experts`（`SequentialMLP`，每个本地
#   expert 是一个普通 `MLP`）。attention、norm 一个不变。
# - **RMSNorm + QK norm 动了 5 个 norm**：三个 norm 从 `LayerNorm` 变 `RMSNorm`，`q_layernorm` / `k_layernorm` 从无到有。不开 QK norm 时
#   `SelfAttention` 把这两个属性设成 `None`（[`attention.py:1722`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1722)），
#   不在树里，所以 local 是 24 个模块、这里是 26 个。
# - `cross_attention` 一类槽位 GPT 的 spec 没写，取 `TransformerLayerSubmodules` 的缺省 `IdentityOp`；`self_attn_bda`、`mlp_bda`
#   是函数，`build_module` 原样返回，不是模块。
#
# ### spec 说了算，还是 config 说了算？
#
# spec 与 config 都能"说"用什么 norm、要不要 QK norm、是不是 MoE。故意让两者说法不一致，建模型看建出来的类：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
conflicts = run_ranks(build_conflicts, 1, CONFLICTS)[0]


def kw(arguments):
    return ", ".join(f"{k}={v}" for k, v in arguments.items()) or "缺省"


Table(["get_gpt_layer_local_spec(...)", "TransformerConfig 另设", "模块", "建出来的", "消息"],
      [[kw(spec_kwargs), kw(overrides), path, what, message]
       for (spec_kwargs, overrides, path), (what, message) in zip(CONFLICTS, conflicts)])

# %% [markdown]
# - **norm 的种类：config 说了算。** 没有 Apex 时 local backend 给的类总是 `WrappedTorchNorm`，它在**实例化时**读 `config.normalization`
#   决定返回 `LayerNorm` 还是 `RMSNorm`；spec 的 `normalization` 参数不起作用。
# - **QK norm：开关在 config，类在 spec。** `SelfAttention` 先看 `config.qk_layernorm`；关着时 spec 槽位里若放了真的 norm 就
#   `ValueError`（[`attention.py:1710`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1710)）。开着时用槽位里的类：缺省 spec 的槽位是 `IdentityOp`，
#   于是 `config.qk_layernorm=True` 配缺省 spec 建出一个什么也不做的 `IdentityOp`，**不报错**。
# - **MoE：spec 说了算，但两边都要有。** `num_moe_experts=2` 配 dense spec 建出普通 `MLP`，不报错、不警告；反过来 spec 要 MoE 而 config
#   没给 expert 数，`MoELayer` 拿 `None` 做取模（[`moe_layer.py:185`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/moe_layer.py#L185)），报 `TypeError`。
#
# **正式入口也挡不住这种不一致。** 0.19.0 的 `gpt_config_from_args` 只要给了 `--spec`，就把它指向的对象原样当 layer spec
# （[`argument_utils.py:456`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L456)）；
# 没给时 `default_layer_spec` 才按 `config.num_moe_experts` 选 MoE 的 block spec
# （[`gpt.py:81`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L81)）。退路 `gpt_builder` 同样先看 `--spec`
# （[`gpt_builders.py:32`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L32)），再看 `args.num_experts`。
# 所以 `--spec` 给一个 dense spec、再加 `--num-experts 8`，就是上表第五行：config 里有 8 个 expert，模型却是稠密的（坑 1）。
#
# 不给 `--spec` 时，MoE 走 `get_gpt_decoder_block_spec`：由 `moe_layer_freq` 给**每一层**挑 dense 或 MoE 的 spec，得到
# `TransformerBlockSubmodules`，而不是一个被复制 N 次的层 spec（`_get_block_submodules` 把同一个对象放进列表 N 次）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(run_ranks(block_spec_layers, 1)[0])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 建模型时的通信
#
# 每个 TP 层只按本 rank 的 TP 坐标建自己那片权重，不需要通信（笔记 04 在 TP=2 下实测 0 条）。例外在词嵌入：共享词嵌入与输出层（或开了 MTP）、
# 而 PP > 1 时，词嵌入在首 stage、输出层在尾 stage，尾 stage 的那份副本先被置零，再在 embedding 群里 all-reduce 一次，
# 两份才从同一个初值出发（[`language_module.py:308`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L308)）。
# 在 2 个 rank（PP=2）上各建一个不共享和共享词嵌入的 2 层 GPT，记下构造时的通信：

# %%
def build_and_record():
    from snippets.record import recorder
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    config = TransformerConfig(**{**BASE, "num_layers": 2}, pipeline_model_parallel_size=2)
    out = {}
    for tied in (False, True):
        with recorder.record() as calls:
            model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32,
                             max_sequence_length=8, pre_process=first, post_process=last,
                             share_embeddings_and_output_weights=tied)
        shared = model.shared_embedding_or_output_weight() if tied else None
        out[tied] = dict(calls=calls, stage="first" if first else "last",
                         weight_sum=None if shared is None else round(float(shared.detach().sum()), 4))
    return out


pp_build = run_ranks(build_and_record, 2, grid=dict(pp=2))
for rank, r in enumerate(pp_build):
    print(f"rank {rank}（{r[True]['stage']} stage）: 不共享 {len(r[False]['calls'])} 次通信；"
          f"共享 {len(r[True]['calls'])} 次，之后词嵌入 / 输出层 weight 之和 {r[True]['weight_sum']}")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
communication_table(pp_build[1][True]["calls"], meanings={
    "all_reduce": "首 stage 的词嵌入 + 尾 stage 置零的副本 = 两份相同的初值"})

# %% [markdown]
# 两个 rank 的 weight 之和相同：尾 stage 的输出层从此与首 stage 的词嵌入一样。训练中两份各自得到梯度，`finalize_model_grads`
# 每步再在同一个群里把两份梯度相加（[笔记 14](../14_data_parallel_ddp/)），它们才一直相等。
#
# ### TP=2 的 GPT 里每个并行层
#
# 主图的模型：1 层、hidden 16、ffn 32、4 个 head、词表 32、带 bias、共享词嵌入、`parallel_output=True`（`gpt_builder` 的缺省）。
# 每个 TP 层构造时被设上的标志（`—` 表示这个类没有该标志）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
SHOWN = ("gather_output", "input_is_parallel", "sequence_parallel", "skip_bias_add", "allreduce_dgrad")
print("两个 rank 的并行层、形状、标志完全相同:", all(tp[0][v]["layers"] == tp[1][v]["layers"] for v in TP_VARIANTS),
      " 词表范围 [start, end):", {rank: tp[rank]["TP=2"]["vocab_range"] for rank in range(2)})
Table(["标志", *ORDER], [[flag, *(flag_cells(layer_of[name], (flag,))[0] for name in ORDER)] for flag in SHOWN])

# %% [markdown]
# - **两对"先列后行"**：`linear_qkv`（列，`gather_output=False`）→ 本卡的 head 上算 attention → `linear_proj`（行，`input_is_parallel=True`）；
#   `linear_fc1` → 本卡的激活 → `linear_fc2` 同理。中间的 tensor 一直是 TP 分片，不通信。这些标志不来自 config，而是 `SelfAttention` /
#   `MLP` 构造它们时写死的参数。
# - **输出层也是列并行**，`gather_output = not parallel_output = False`：logits 留在 `[s, b, V/TP]`，交给 vocab-parallel cross entropy
#   （[笔记 12](../12_vocab_parallel/)）；它没有自己的 weight，用共享的 `word_embeddings.weight`，词表切法正好相同。
# - **`skip_bias_add=True`**：bias 不在 linear 里加，交给下一步融合（`linear_fc1` 的 bias 与激活一起算，`linear_proj` / `linear_fc2`
#   的 bias 在 bias-dropout-add 里加）；`linear_qkv` 后面没有可融合的操作。
# - **`allreduce_dgrad`** 是推出来的：TP > 1 且不开 SP 时为 True（[`layers.py:1066`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1066)），
#   即列并行层 backward 时在 TP 群 all-reduce 输入梯度（[笔记 10](../10_column_row_parallel_linear/)）。
#
# 主图的通信：只开 TP 时，forward 的 all-reduce 正好在三个"部分和"的位置——词嵌入（每个 rank 只查到自己词表段里的词）、`linear_proj`、
# `linear_fc2`；backward 的在三个列并行层；层外是 cross entropy 的 3 次（max、目标 logit、exp 之和）。只开 TP 时 rank 0 的完整记录：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
MEANINGS = {  # issuing function -> what the collective is for
    "tensor_parallel/mappings.py::_reduce": "g：部分和相加",
    "tensor_parallel/cross_entropy.py::forward": "cross entropy：合并各段词表的 max / 目标 logit / exp 之和",
    "tensor_parallel/layers.py::backward": "输入梯度是部分和，求和（allreduce_dgrad）",
}
plain = tp[0]["TP=2"]
owner = {**{id(c): "（层外）" for c in plain["other"]}, **owner_of(plain["by_layer"])}
Table(["phase", "发出它的层", "API · group", "shape before → after", "meaning"],
      [[c.phase, short_path(owner[id(c)]), f"{c.api} · {c.group} {list(c.ranks)}", f"{c.before} → {c.after}",
        MEANINGS[c.where]] for c in plain["calls"]])

# %% [markdown]
# 第 1 行的 `[2, 8, 16]` 是 `[b, s, h]`：词嵌入在转置成 Megatron 的 `[s, b, h]` 之前就做了 all-reduce。
#
# ### 开 sequence parallel：哪些标志变了
#
# `sequence_parallel` 不是构造参数，每个 linear 从 `config.sequence_parallel` 读。local spec 的 torch norm 在 Megatron 里**拒绝** SP
# （[`torch_norm.py:50`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L50)）：真机上开 SP 要用 TE 或 Apex 的 norm，
# 下面 `+SP` 两列在 CPU 上怎样跑出来，见文末"在 CPU 上怎么跑的"。有变化的标志：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
def flag_changes(variants):
    rows = []
    for i, row in enumerate(tp[0][variants[0]]["layers"]):
        for flag in row["flags"]:
            values = [tp[0][v]["layers"][i]["flags"][flag] for v in variants]
            if len(set(values)) > 1:
                rows.append([short_path(row["path"]), flag, *values])
    return rows


Table(["层", "标志", *TP_VARIANTS], flag_changes(list(TP_VARIANTS)))

# %% [markdown]
# 开 SP 后列并行层的 `allreduce_dgrad` 关掉，输入梯度改由 reduce-scatter 处理。主图下两行：行并行层 forward 的 all-reduce 变
# reduce-scatter（backward 是它的反向 all-gather）；列并行层 forward 先 all-gather 输入，backward 既 reduce-scatter 输入梯度、又再 all-gather
# 一次输入——forward 只存了 sequence 分片，算 weight 梯度要完整输入（笔记 11）。层外多的 backward all-gather 是位置嵌入相加后切 sequence
# 那一步的反向。词嵌入的 `reduce_scatter_embeddings` 只在 SP **且没有位置嵌入**（RoPE）时为 True：learned_absolute 时词嵌入要先与位置嵌入相加，
# 所以先 all-reduce、相加之后再切。三种配置每层的通信：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["层"] + [f"{v} {phase}" for v in TP_VARIANTS for phase in ("fwd", "bwd")],
      [[name] + [cell for v in TP_VARIANTS for phase in ("forward", "backward") for cell in [comm_cells(v, phase)[i]]]
       for i, name in enumerate(ORDER + ("其余（不在 TP 层里）",))])

# %% [markdown]
# ### MoE 里的 expert linear
#
# MoE 模型里每个 expert 的 `linear_fc1` / `linear_fc2` 也是列并行 / 行并行层，但带 `is_expert=True`：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
expert_rows

# %% [markdown]
# 它们切在 expert TP 群（ETP 缺省 = TP）上，`explicit_expert_comm=True`
# （[`layers.py:960`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L960)）：forward / backward 不再自己做 f / g，
# token 的收集与归约交给 token dispatcher（[笔记 17](../17_moe_expert_parallel/)）。`allreduce_dgrad` 虽是 True，forward 时被它覆盖（坑 4）。

# %% [markdown]
# ## 机制解释
#
# **config 给数字，spec 给类，但不是一刀切。** 构造链上每一层都同时收到 config 和自己那一段 spec：spec 决定"这个槽位放哪个类"
# （attention 的实现、MLP 还是 MoE、QK norm 的类、norm 与 linear 是否融合），config 决定"多大、切几份、什么精度"。例外出在"类本身也看
# config"的地方：`WrappedTorchNorm` 是工厂，实例化时才按 `config.normalization` 选类；QK norm 建不建由 `config.qk_layernorm` 决定。
# 想知道建出了什么，最可靠的办法是把模型建出来看。
#
# **`build_module` 只做三件事。** 给它函数就原样返回（bda）；给它类或 `ModuleSpec`，就把 `submodules` 作为关键字参数、`params` 与调用方的
# 参数合并后实例化；失败时把类名追加到异常消息。多数槽位已经不经过它：norm、`mlp` 构造器、`linear_qkv`、`linear_proj`、fc1 / fc2 都由
# 上一层直接调用；`ModuleSpec` 自己可调用（[`spec_utils.py:34`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L34)），
# 所以槽位放类、放 spec、放 `partial` 都行。
#
# **TP 标志由"谁调用"决定。** 同一个 `ColumnParallelLinear`，在 `SelfAttention` 里是 `gather_output=False`，在输出层是
# `gather_output=not parallel_output`，在 expert 里带 `is_expert=True`；而 `sequence_parallel`、`allreduce_dgrad` 这类全局开关由 config
# 统一推出。所以"一个 TP 层怎样嵌进模型"要看构造它的那一行。
#
# **构造只在一处通信。** 权重按 TP 坐标各建各的；只有 PP > 1 时分在首尾两个 stage 的共享词嵌入，要靠一次 all-reduce 对齐初值。
#
# **`__post_init__` 是第二道命令行解析。** 命令行入口先在 `validate_args` 里算一部分缺省值，再同名拷贝成 config，config 再推导剩下的并检查。
# 两处规则不同时（`ffn_hidden_size`），结果取决于走哪条路。

# %% [markdown]
# ## 与训练主链路的关系
#
# 本篇展开的是 `setup_model_and_optimizer` 建模型这一步（笔记 04）。同一个 config 之后还被 DDP、优化器、schedule 读取（`sequence_parallel`
# 决定 `finalize_model_grads` 要不要归约 norm 的梯度，笔记 11、14）；TP 标志决定 `forward_step` 里每一次 TP 通信（[笔记 05](../05_forward_loss_backward/)）；
# 参数上的切分属性被 DDP、分布式优化器、checkpoint 读取（笔记 06、15、07）。simple loop 里对应手写的 `TransformerConfig(...)` 加
# `GPTModel(config, get_gpt_layer_local_spec(), ...)`。

# %% [markdown]
# ## 与基础知识的连接
#
# - **dataclass 的 `__post_init__`**：生成的 `__init__` 赋完值后调用它，适合做派生字段和校验；代价是"传入的"与"拿到的"可以不同。
# - **依赖注入 / 工厂**：spec 把"用哪个类"从模型代码里拿出来，换实现（local、TE、MoE）不用改 `GPTModel`。
# - **`nn.Module` 的注册顺序**：子模块按 `__init__` 里赋值的顺序登记，`Attention.__init__` 先建 `linear_proj`、子类才建 `linear_qkv`，所以
#   `state_dict()` 里 `linear_proj` 排在前面，不是 forward 顺序。
# - **TP 配对**：`Y = XW` 先按列切（输出不拼）再按行切（输入已切），一对只在末尾通信一次；embedding 和输出层按词表切。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **config 里的 `num_moe_experts`、`qk_layernorm` 可能被静默忽略。** dense spec 配 `num_moe_experts=2` 建出普通 `MLP`，`qk_layernorm=True`
#    配缺省 spec 建出 `IdentityOp`（冲突表）；正式入口给了 `--spec` 就不再看 `--num-experts`，自己写 spec 时要让两者一致。
# 2. **`output_layer_init_method` 不是输出层的初始化**（标准差表）。
# 3. **`ffn_hidden_size` 的两套缺省**：命令行 `--swiglu` 是 `⌊(8h/3)/64⌋·64`，Core 是 `4h`；hidden < 24 时命令行得 0，而 Core 接受 0：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
zero = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=0)
print("TransformerConfig(ffn_hidden_size=0) 构造成功，ffn_hidden_size =", zero.ffn_hidden_size)

# %% [markdown]
# 4. **`allreduce_dgrad` 对 expert linear 是 True，但不生效**：forward 时才被 `explicit_expert_comm` 覆盖
#    （[`layers.py:1157`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L1157)），读模块属性判断通信会被误导。
# 5. **spec 的 `normalization` 在有 Apex 时有副作用（只读代码）。** `LocalSpecProvider.layer_norm(rms_norm=True)` 把 `backends.py` 的模块全局变量
#    `LNImpl` 改成 `WrappedTorchNorm`（[`backends.py:126`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/backends.py#L126)）。
#    装了 Apex 时它原本是 `FusedLayerNorm`，同一进程里一旦造过 RMSNorm 的 local spec，之后所有 local spec 的 LayerNorm 都变成 torch 版。本机没有 Apex，未运行验证。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - **SP 下的 torch norm。** `WrappedTorchNorm` 断言不开 SP；`+SP`、`+SP+RoPE` 两个模型能建出来，是因为 CPU 补丁
#   `torch_norm_sequence_parallel` 只在 SP 时绕过这条断言，并像 Apex / TE 的 norm 那样给参数打上 `sequence_parallel` 标记
#   （见[在 CPU 上运行](../../cpu/)）。SP 的通信来自 linear 和 embedding，与 norm 的实现无关，所以这两列的通信就是真机上会发生的；
#   真机上要换成 TE spec（`TELayerNormColumnParallelLinear` 把 norm 融进 linear）或 Apex 的 `FusedLayerNorm`。
# - **没有 Transformer Engine。** 正式入口缺省 `--transformer-impl transformer_engine`；本机的 TE 类只是 `MagicMock` 替身
#   （[`transformer_engine.py:84`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine.py#L84)）。
#   真实的 TE spec 造得出来（笔记 04 列出了它的槽位），拿它建模型却失败：以 mock 为基类的 `TELayerNormColumnParallelLinear` 本身也是 mock，
#   `side_effect` 恰好是基类元组、只能调用一次，`linear_qkv` 用掉之后 `linear_fc1` 抛出空消息的 `StopIteration`（下一格）。所以本篇都用 local spec。
# - **PP=2 的构造**：词嵌入的那次 all-reduce 前有一句 `weight.data.cuda()`，CPU 补丁让 `.cuda()` 留在 CPU 上。
# - 每个 `TransformerConfig` 的 `cuda_graph_modules="full"` 弃用警告由 `snippets` 的已知警告过滤静音。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("transformer_engine 可导入:", importlib.util.find_spec("transformer_engine") is not None,
      " gpt_layer_specs.HAVE_TE:", gpt_layer_specs.HAVE_TE, " 用 TE spec 建模型:", run_ranks(build_with_te_spec, 1)[0])

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
# **4. PP=4、共享词嵌入时，建模型要几次通信？哪些 rank 参加？不共享呢？**
#
# <details><summary>答案</summary>
#
# 共享时一次 all-reduce，只有首尾两个 stage（embedding 群）参加，中间 stage 没有词嵌入、不参加；不共享时 0 次。
# PP=2 的运行里两个 rank 都在这个群里，各记下 1 次。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print([(r[True]["stage"], [(c.api, c.group, list(c.ranks)) for c in r[True]["calls"]], len(r[False]["calls"]))
       for r in pp_build])

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
# `GPTModel` takes a `TransformerConfig` for numbers and a layer spec for classes: an embedding, a `TransformerBlock` that builds
# each local layer from its spec, and a column-parallel output layer. `__post_init__` fills `ffn_hidden_size`, `kv_channels`, the
# init methods and rejects head or group counts TP cannot split. The spec picks MLP or MoE and the QK norm class, but the torch norm
# reads `config.normalization`, and a dense spec with experts in the config silently builds a dense MLP; `--spec` skips
# `--num-experts`. Building only communicates for tied embeddings with PP > 1: one all-reduce. At TP=2, `linear_qkv` and
# `linear_fc1` are column-parallel, `linear_proj` and `linear_fc2` row-parallel: three forward all-reduces, three backward.
