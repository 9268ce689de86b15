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
# # 04 模型构造：从模型配置到每个 rank 上切好的 `GPTModel`
#
# 第一轮第 4 篇。`setup_model_and_optimizer` 的第一件事是造模型。本篇沿正式入口走三步：命令行参数怎样变成
# `TransformerConfig`（再装进 `GPTModelConfig`）；`GPTModelBuilder` 怎样选 layer spec（local 还是 Transformer Engine）；`GPTModel(config, spec)`
# 在 TP=2 的两个 rank 上各造出了什么——每个参数的全局 shape、本地 shape、沿哪一维切，全部由运行打印，
# 并把每个 rank 的分片与 TP=1 的同一个模型逐元素比较。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出正式入口里谁造模型：`gpt_config_from_args` 给出 `GPTModelConfig`，`setup_model_and_optimizer` 交给它的
#    `GPTModelBuilder`：`build_distributed_models` → `build_model` → `GPTModel`，每层各管什么；旧路
#    `get_model` → `model_provider` → `gpt_builder` 还剩谁在用。
# 2. 说清一个命令行参数（如 `--hidden-size`）怎样进入 `TransformerConfig`：哪些 flag 是由 dataclass 字段**自动生成**的，
#    `core_transformer_config_from_args` 又手工改写了哪些字段。
# 3. 对比 local spec 与 Transformer Engine spec：每个槽位放什么类，为什么 TE spec 里 `input_layernorm`、`pre_mlp_layernorm`
#    是 `IdentityOp`。
# 4. 对一个 TP=2 的真实 `GPTModel`，说出每个参数是切是复制、沿哪一维切、每个 rank 有多少参数。

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 造模型、优化器、学习率调度器；`cfg_container.model` 有值时交给它的 builder（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)），否则走 `get_model`（[training.py:2061](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2061)） |
# | [`argument_utils.py::gpt_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L433) | `args` → `GPTModelConfig`：`TransformerConfig` 加上词表、最长序列、位置编码、是否共享词嵌入 |
# | [`gpt.py::GPTModelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L135) | GPT 模型的纯配置；类属性 `builder` 指向 `GPTModelBuilder` |
# | [`gpt.py::GPTModelBuilder.build_distributed_models`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L331) | 每个（虚拟）stage 建一次模型，再交给 `dist_utils` 补属性、包 wrapper 与 DDP |
# | [`dist_utils.py::prepare_existing_model_chunks_for_distributed_training`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/dist_utils.py#L120) | 补默认 TP 属性、打印参数数、搬 GPU、包 `Float16Module`、包 DDP |
# | [`gpt.py::GPTModelBuilder.build_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L255) | 一个 stage：选 spec、补齐词表、`GPTModel(...)` |
# | [`gpt.py::default_layer_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L50) | 按配置选 spec；普通 dense 模型落到 `_te_or_local_layer_spec`：`transformer_impl` 选 TE / local spec |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 旧路（RL 另建推理模型时，[training.py:1323](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1323)；ModelOpt 工具直接调用）：按 PP / VPP 决定 `pre_process` / `post_process`，调 provider；补默认 TP 属性、搬 GPU、包 DDP |
# | [`model_provider.py::model_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/model_provider.py#L20) | 旧路：薄包装，取 `args`，调 builder |
# | [`gpt_builders.py::gpt_builder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L25) | 旧路：config + spec → `GPTModel(...)` |
# | [`gpt_builders.py::_get_transformer_layer_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L108) | 旧路：`--transformer-impl` 选 TE / local spec |
# | [`arguments.py::_add_network_size_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2195) | 由 `TransformerConfig` 的字段生成命令行参数（带排除表） |
# | [`argument_utils.py::ArgumentGroupFactory`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L45) | 字段 → `--flag` 的命名规则 |
# | [`argument_utils.py::core_transformer_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L277) | `args` → `TransformerConfig`：同名拷贝 + 手工覆盖 |
# | [`transformer_config.py::TransformerConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L54) | 模型结构的全部超参数 |
# | [`model_parallel_config.py::ModelParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L46) | 它的父类：并行、精度、通信重叠 |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 只用 Megatron Core 自己的模块 |
# | [`gpt_layer_specs.py::get_gpt_layer_with_transformer_engine_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L351) | 用 TE 模块（正式入口的缺省） |
# | [`gpt_layer_specs.py::get_mlp_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L521) | backend 能融合 norm 时 `linear_fc1` 用带 LayerNorm 的列并行 linear |
# | [`transformer_engine_spec_provider.py::TESpecProvider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine_spec_provider.py#L36) | TE backend：每个槽位给哪个 TE 类 |
# | [`spec_utils.py::ModuleSpec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L13) | "哪个类、什么参数、哪些子模块"的数据 |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 按 spec 实例化 |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层的槽位；没给的槽位缺省 `IdentityOp` |
# | [`gpt_model.py::GPTModel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L94) | embedding、decoder、output layer |
# | [`layers.py::VocabParallelEmbedding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L230) | 词嵌入按词表切 |
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | CPU 初始化：造整块权重再按 `partition_dim`、`stride` 切 |
# | [`layers.py::set_tensor_model_parallel_attributes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L136) | 在参数上记下 `tensor_model_parallel`、`partition_dim`、`partition_stride` |
# | [`layers.py::set_defaults_if_not_set_tensor_model_parallel_attributes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L147) | `prepare_existing_model_chunks_for_distributed_training`（旧路 `get_model`）给其余参数补上"不切"的属性 |
# | [`run_simple_mcore_train_loop.py::model_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/examples/run_simple_mcore_train_loop.py#L57) | simple loop：手写 config + local spec |

# %% [markdown]
# ## 调用链
#
# ```text
# pretrain_gpt.py (__main__)
# ├─ megatron/training/argument_utils.py::gpt_config_from_args(args)        # 纯配置
# │  ├─ core_transformer_config_from_args(args)                              # → TransformerConfig
# │  └─ GPTModelConfig(transformer=..., vocab_size=args.padded_vocab_size,
# │                    share_embeddings_and_output_weights=not untie, ...)   # parallel_output 缺省 True
# ├─ pretrain_cfg_container_from_args(args, model_cfg)                        # 配置容器，model=上面的 GPTModelConfig
# └─ megatron/training/training.py::pretrain(full_config, ..., ModelType.encoder_or_decoder, forward_step, ...)
#    └─ setup_model_and_optimizer(model_type, model_provider_func=None, ..., cfg_container=...)
#       └─ megatron/training/models/gpt.py::GPTModelBuilder(cfg.model).build_distributed_models(pg_collection, ddp_config, ...)
#          └─ dist_utils.py::unimodal_build_distributed_models
#             ├─ build_virtual_pipeline_stages：每个（虚拟）stage 一次，pre_process = 首 stage？post_process = 尾 stage？
#             │  └─ GPTModelBuilder.build_model(pg_collection, pre_process, post_process, vp_stage)
#             │     ├─ default_layer_spec → _te_or_local_layer_spec(config)              # ModuleSpec，纯数据
#             │     └─ GPTModel(config.transformer, transformer_layer_spec, vocab_size, parallel_output, ...)
#             │        ├─ LanguageModelEmbedding → VocabParallelEmbedding     # 词表按 TP 切（dim 0）
#             │        ├─ TransformerBlock → build_module(layer spec) × num_layers
#             │        │  └─ ColumnParallelLinear / RowParallelLinear         # 权重按 TP 切（dim 0 / dim 1）
#             │        └─ ColumnParallelLinear（output_layer；共享词嵌入时不建 weight）
#             └─ prepare_existing_model_chunks_for_distributed_training
#                ├─ set_defaults_if_not_set_tensor_model_parallel_attributes(param)  # 复制的参数标"不切"
#                ├─ model.cuda()；--bf16 / --fp16 时包一层 Float16Module
#                └─ _ddp_wrap → DDP(config, ddp_config, module)                       # 笔记 06
#
# 旧路（cfg_container.model 为 None 时；RL 另建推理模型时；ModelOpt 工具直接调用）：
# get_model(model_provider_func, model_type) → model_provider(builder, pre_process, post_process, vp_stage)
# └─ gpt_builders.py::gpt_builder(args, ...)：core_transformer_config_from_args + _get_transformer_layer_spec + 同样的 GPTModel(...)
#
# examples/run_simple_mcore_train_loop.py (__main__)
# └─ model_provider()：TransformerConfig(num_layers=2, hidden_size=12, num_attention_heads=4, ...)
#    └─ GPTModel(config, get_gpt_layer_local_spec(), vocab_size=100, max_sequence_length=64)
# ```
#
# 造模型本身**不通信**：每个 rank 只造自己的分片（下面实测 0 条 collective）。
#
# **每个函数的阅读记录**（roadmap 第一轮的七问）：
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `training.py::setup_model_and_optimizer` | `model_type`、`model_provider_func`（可缺省）、`checkpointing_context`，以及只能按关键字传的 `cfg_container`、`pg_collection` | `(model, optimizer, opt_param_scheduler)`，`model` 是每个 virtual stage 一个 DDP 包装的列表（[training.py:2286](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2286)） | `cfg_container.model` 有值时由它的 builder 建模型并包 `DistributedDataParallel`（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)），否则 `get_model`（[training.py:2061](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2061)）；`get_megatron_optimizer`（[training.py:2132](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2132)）、续训时 `load_checkpoint` 里的 `dist_checkpointing`（[training.py:2199](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2199)） | 是：模型按 TP / PP 群建，DDP 记下 dp-cp 群，分布式优化器按 dp 群分片 | 权重按 TP / PP 切；`--use-distributed-optimizer` 时优化器状态按 DP 切 | 是：建参数、grad buffer、优化器状态；续训时从 checkpoint 读回参数与 `args.iteration` | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` + `Adam(...)`（+ `load_distributed_checkpoint`） |
# | `gpt_config_from_args` | `args` | `GPTModelConfig`（`transformer` 字段是 `TransformerConfig`） | `TransformerConfig` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` 与 `GPTModel(...)` 的关键字参数 |
# | `core_transformer_config_from_args` | `args` | `TransformerConfig` | `TransformerConfig` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` |
# | `GPTModelBuilder.build_distributed_models` | `pg_collection`、`ddp_config`、是否包 DDP… | 模型 chunk 的 list（已包 DDP） | `build_model`、`set_defaults_if_not_set_...`、`Float16Module`、DDP | 读 PP / VPP 坐标；DDP 用 dp-cp 群 | 间接（`build_model`） | 是：建参数 | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` |
# | `GPTModelBuilder.build_model` | `pg_collection`、`pre_process`、`post_process`、`vp_stage` | `GPTModel` | layer spec、`GPTModel` | 否（把 `pg_collection` 交给 `GPTModel`） | 间接 | 是：建参数 | `model_provider()` 的函数体 |
# | `get_model`（旧路） | provider、model type | 模型 chunk 的 list（已包 DDP） | provider、`set_defaults_if_not_set_...`、`Float16Module`、DDP | 读 PP / VPP 坐标；DDP 用 DP 群 | 间接（provider） | 是：建参数 | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` |
# | `model_provider` → `gpt_builder`（旧路） | builder、`pre_process`、`post_process`、`vp_stage` | `GPTModel` | `TransformerConfig`、layer spec、`GPTModel` | 否 | 间接 | 是：建参数 | `model_provider()` |
# | `get_gpt_layer_local_spec` 等 | 是否 MoE、qk norm、normalization… | `ModuleSpec` | spec provider | 否 | 否 | 否 | `get_gpt_layer_local_spec()` |
# | `GPTModel.__init__` | config、spec、vocab、最大长度、`parallel_output`… | 模块 | embedding、`TransformerBlock`、TP 层 | 读 TP 群大小与坐标（`pg_collection`） | **是**：每个 TP 层只建本 rank 的分片 | 是：参数 | `GPTModel(...)` |
# | `_initialize_affine_weight_cpu` | 分片参数、完整 shape、`partition_dim`、`stride` | 分片被填好 | `set_tensor_model_parallel_attributes` | 读 TP 坐标 | **是**：整块 → 第 `r, r+TP, …` 块 | 是 | `use_cpu_initialization=True` 时 |
#
# > **旧版（core_v0.18.0）：** `pretrain_gpt.py` 把 `partial(model_provider, gpt_builder)` 传给 `pretrain`，`setup_model_and_optimizer(model_provider_func, model_type, checkpointing_context)` 总是经 `get_model` → `model_provider` → `gpt_builder` 造模型（[training.py:1954](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/training/training.py#L1954)）；没有 `GPTModelConfig` / `GPTModelBuilder`，`core_transformer_config_from_args` 由 `gpt_builder` 调用。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import dataclasses
import inspect

import torch

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.config.pictures import draw_param_shards
from snippets.experiments.n04_gpt_model import build_gpt, count, run, shard_of, tables
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.config.model_args import EXCLUDED, OVERRIDES, cli_flags, transformer_config_fields, where_from
from snippets.config.model_specs import spec_table, transformer_engine_spec_without_te
from snippets.config.param_table import gather
from snippets.record.tables import Table

from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,
                                                      get_gpt_layer_with_transformer_engine_spec)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

# %% [markdown]
# ## 关键对象
#
# ### 命令行 → `TransformerConfig`
#
# tag 上模型结构的命令行参数大多不是手写的：`_add_network_size_args` 用 `ArgumentGroupFactory` 遍历
# `TransformerConfig` 的每个字段，生成一个同名的 flag（`hidden_size` → `--hidden-size`，`dest="hidden_size"`）；
# 缺省为 True 的布尔字段只能关掉，生成 `--no-x` / `--disable-x`；字段的 `argparse_meta` 元数据可以改名；
# 一张排除表（八十多个字段）不生成 flag。之后 `core_transformer_config_from_args` 对 `TransformerConfig` 的每个字段
# 检查 `args` 有没有同名属性，有就拷贝，最后手工覆盖二十来个字段；`gpt_config_from_args` 再把这份 `TransformerConfig`
# 连同词表、最长序列、位置编码、是否共享词嵌入装进 `GPTModelConfig`。
#
# 排除表与覆盖表在 `megatron/training` 里；`snippets/config/model_args.py` 把它们记成数据、把命名规则重写成
# 几行（0.19.0 的 pip 包也带着 `megatron/training`，测试拿它们与已安装的核对）。字段本身和 `argparse_meta` 就在已安装的 `TransformerConfig` 里，下表由它们算出：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
fields = transformer_config_fields()
main_fields = ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
               "kv_channels", "normalization", "add_bias_linear", "gated_linear_unit", "activation_func",
               "hidden_dropout", "init_method_std", "tensor_model_parallel_size", "sequence_parallel",
               "num_moe_experts", "bf16", "pipeline_dtype", "batch_p2p_comm", "use_cpu_initialization"]


def default_of(field):
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return getattr(value, "__name__", value)


Table(["TransformerConfig 字段", "命令行 → 字段", "dataclass 缺省值"],
      [[name, where_from(fields[name]), default_of(fields[name])] for name in main_fields])

# %%
generated = [f for f in fields.values() if cli_flags(f)]
print("TransformerConfig 字段数:", len(fields), " 自动生成 flag 的:", len(generated),
      " 排除表里的:", len(EXCLUDED & set(fields)), " 手工覆盖的:", len(OVERRIDES))
print("改了名的 flag:", {f.name: cli_flags(f) for f in generated
                        if cli_flags(f)[0] != "--" + f.name.replace("_", "-")
                        and not cli_flags(f)[0].startswith(("--no-", "--disable-"))})

# %% [markdown]
# 所以"哪个参数对应哪个字段"的答案大多数时候就是"同名"；例外有三类：
#
# - **改名**：`add_bias_linear` 的开关叫 `--disable-bias-linear`；`num_moe_experts` 在排除表里，值来自 `--num-experts`；
#   `batch_p2p_comm` 来自 `--overlap-p2p-communication` 取反。
# - **组合**：`--swiglu` 不是字段，它同时设 `activation_func=F.silu` 和 `gated_linear_unit=True`；
#   `num_query_groups` 只有加了 `--group-query-attention` 才拷贝，否则强制 None（即 MHA）。
# - **推导**：`pipeline_dtype` 来自 `validate_args` 由 `--bf16` / `--fp16` 算出的 `params_dtype`。
#
# simple loop 没有这一层：它直接写 `TransformerConfig(num_layers=2, hidden_size=12, num_attention_heads=4,
# use_cpu_initialization=True, pipeline_dtype=torch.float32)`。
#
# ### layer spec：local 与 Transformer Engine
#
# `ModuleSpec` 只是数据："这个槽位放哪个类、带什么参数、子模块是什么"。`TransformerLayer` 用 `build_module`
# 按它实例化。只有 `mlp` 槽位不同：它放的是一个 builder，`functools.partial(MLP.as_mlp_submodule, submodules=...)`
# （[`gpt_layer_specs.py:541`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L541)），`TransformerLayer` 直接调用它
# （[`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431)），仍然只是"哪个类、哪些子模块"。
# 正式入口缺省 `--transformer-impl transformer_engine`，用 TE spec；simple loop 用 local spec。
#
# 本机没有 TE，`get_gpt_layer_with_transformer_engine_spec()` 连调用都不行（`TypeError`）：

# %%
try:
    get_gpt_layer_with_transformer_engine_spec()
except TypeError as err:
    print("TypeError:", err)

# %% [markdown]
# `gpt_layer_specs.py` 只在 `HAVE_TE` 为真（`transformer_engine` 能导入）时才导入 `TESpecProvider`，否则把它设成 `None`（[gpt_layer_specs.py 第 46–54 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L46-L54)），函数里的 `TESpecProvider()` 就成了调用 `None`。
# 但 spec 是纯数据，不实例化任何 TE 模块；`snippets.config.model_specs.transformer_engine_spec_without_te` 在一个
# `with` 块里把这个名字绑到真实的 `TESpecProvider`（并让它的 TE 版本检查回答"够新"），真实函数就能造出真实的 spec。
# 没有 TE 时 TE 类是 `MagicMock` 替身，表里按它们在 `transformer_engine.py` 里的名字标出：

# %%
with transformer_engine_spec_without_te():
    te_spec = get_gpt_layer_with_transformer_engine_spec()
local_spec = get_gpt_layer_local_spec()
Table(["槽位", "local spec", "TE spec"], spec_table({"local": local_spec, "te": te_spec}))

# %% [markdown]
# 差别集中在三处：
#
# - **LayerNorm 融进了下一个 linear。** TE 的 `linear_qkv`、`linear_fc1` 是 `TELayerNormColumnParallelLinear`：
#   norm 和列并行 linear 是一个模块、一次 kernel，norm 的参数挂在 linear 上（`linear_qkv.layer_norm_weight`）。
#   于是独立的 `input_layernorm`、`pre_mlp_layernorm` 没事可做，成了 `IdentityOp`。
# - **`input_layernorm` 根本没写进 TE spec。** 它是 `TransformerLayerSubmodules` 的缺省值：

# %%
print("TransformerLayerSubmodules 的缺省 input_layernorm:",
      next(f.default for f in dataclasses.fields(TransformerLayerSubmodules) if f.name == "input_layernorm").__name__)
print("local spec 的 sharded_state_dict_keys_map:", local_spec.submodules.sharded_state_dict_keys_map)

# %% [markdown]
# - **checkpoint 两边通用靠改名表。** local spec 自带一张 `sharded_state_dict_keys_map`：存 checkpoint 时把
#   `input_layernorm.` 写成 `self_attention.linear_qkv.layer_norm_`，`pre_mlp_layernorm.` 写成
#   `mlp.linear_fc1.layer_norm_`——也就是 TE spec 下这些参数的名字。local 与 TE 的 checkpoint 因此可以互相加载。
#
# attention 核心换成 `TEDotProductAttention`（支持 packed 序列、CP，[笔记 03](../03_data_and_batch_flow/)、16）；第一次读代码用 local spec 更清楚，
# 每个数学步骤都是一个独立的模块。

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### TP=2 上一个真实的 `GPTModel`：每个参数
#
# 和 simple loop 一样用 local spec、CPU 初始化，维度取小：1 层、hidden 16、4 个 head、SwiGLU（`--swiglu`，
# `linear_fc1` 宽 2×32）、词表 32、最长 8；`share_embeddings_and_output_weights=True` 与 `parallel_output=True`
# 是正式入口的缺省（前者是 `--untie-embeddings-and-output-weights` 取反，后者是 `GPTModelConfig` 的缺省）。每个 rank 造完模型后像
# `prepare_existing_model_chunks_for_distributed_training`（旧路的 `get_model` 同样）那样给复制的参数补上缺省属性，
# 再读回每个参数的 Megatron 属性。尺寸是参数 `dims`（`snippets.models.presets.Dims`）：`dims.transformer_config_kwargs()`
# 把 hidden、head、ffn 和 SwiGLU / RMSNorm / QK norm / bias 这些开关换成 `TransformerConfig` 的字段，spec 的
# `qk_layernorm`、`GPTModel` 的位置编码也由它决定（Qwen3 式的 RMSNorm、QK norm、无 bias、RoPE 都照此生效）。
# 本篇的 `TINY` 就是上面那组小尺寸。`build_gpt` 就是 `GPTModelBuilder.build_model` 的这几步：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_gpt)

# %% [markdown]
# 参照是 TP=1 的同一个模型：`run` 在同一个进程里造完 TP=2 的模型、读完它的参数后，`destroy_model_parallel`，
# 用同一个种子再造一个 TP=1 的模型，检查本 rank 的每个分片是否正是整块里属于它的那一片（`shard_of`：
# 按 `_initialize_affine_weight_cpu` 的切法，沿 `partition_dim` 切成 `TP · stride` 块，取第 `r, r+TP, …` 块）。
# 本篇多要一份数值（`keep_values=True`），下面拼 `linear_fc1` 时用。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(shard_of, run)

# %%
TINY = EXPERIMENTS["gpt-model"].tiny
PAR = Parallel(world=2, tp=2)
tp2 = run_ranks(run, 2, TINY, PAR, grid=dict(tp=2), keep_values=True)
tp1 = dict(rows=tp2[0]["tp1_rows"], values=tp2[0]["tp1_values"])
built_line, classes_line, param_rows_table, shared_line, count_rows_table = tables(tp2, TINY, PAR)
print(built_line)
print(classes_line)

# %% [markdown]
# 每个参数一行：全局 shape 由本地 shape 与 `partition_dim` 算出；"拼回 = TP=1"是每个 rank 的分片都等于 TP=1 模型
# 同名参数里属于它的那一片（复制的参数则是整块相等）——等价于把两个 rank 的分片按 `partition_dim`、`partition_stride`
# 拼回（`snippets.config.param_table.gather`）后与 TP=1 的参数逐元素相等。

# %%
param_rows_table

# %% [markdown]
# 同一张表画成图：每个被切分的二维权重按全局 `[out, in]` 画，颜色是持有那一块的 TP rank（块的切法就是 `shard_of`）：

# %%
draw_param_shards(param_rows_table.rows, PAR.tp, title="TP=2：每个被切分的权重，哪一块在哪个 rank")

# %% [markdown]
# 读表：
#
# - **dim 0（列并行：切输出）**：`word_embeddings`（词表 32 → 每 rank 16 个词）、`linear_qkv`（3·16 = 48 行 → 24，
#   每个 rank 2 个 head 的 q、k、v）、`linear_fc1`（2·32 = 64 → 32）以及它们的 bias。
# - **dim 1（行并行：切输入）**：`linear_proj`（16 × 16 → 16 × 8）、`linear_fc2`（16 × 32 → 16 × 16）；它们的 bias 不切——
#   部分和 all-reduce 之后才加一次 bias（[笔记 10](../10_column_row_parallel_linear/)）。
# - **复制**：`position_embeddings`、所有 LayerNorm。每个 rank 各有一份，梯度也要一致（开 sequence parallel 时需要额外归约，[笔记 11](../11_transformer_layer/)）。
# - **stride 2**：SwiGLU 的 `linear_fc1` 把 gate 和 up 两半拼成一个矩阵。如果直接按行对半切，rank 0 拿到全部 gate、rank 1
#   拿到全部 up，本地就算不了 `silu(gate) * up`。stride 2 先把两半各自切成 TP 份，rank `r` 拿每一半的第 `r` 份。
#   不按 stride 拼回（直接 `cat`）就不等于 TP=1：

# %%
fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
naive = torch.cat([tp2[0]["values"][fc1], tp2[1]["values"][fc1]])
print("直接 cat == TP=1:", torch.equal(naive, tp1["values"][fc1]),
      "  按 stride 2 拼回 == TP=1:", torch.equal(gather([tp2[r]["values"][fc1] for r in range(2)], 0, 2),
                                               tp1["values"][fc1]))

# %% [markdown]
# **没有 `output_layer.weight`。** 共享词嵌入时输出层不建自己的权重（`skip_weight_param_allocation`），forward 时用
# `word_embeddings.weight`：它也是按词表切的 `[V/TP, h]`，正好就是列并行输出层要的分片。

# %%
print(shared_line)

# %% [markdown]
# ### 每个 rank 多少参数

# %%
count_rows_table

# %% [markdown]
# 切分的部分两个 rank 各一半（1592 + 1592 = 3184），复制的 256 个每个 rank 都有：每 rank 1848，不是 3440 的一半。
# 正式入口启动时打印的 "number of parameters on (tensor, gtp_remat, pipeline) model parallel rank" 就是这一列。模型越大，
# 复制部分（norm、位置嵌入、行并行层的 bias）占比越小。

# %% [markdown]
# ## 机制解释
#
# **三层分工。** `gpt_config_from_args` 把命令行一次性变成 `GPTModelConfig`，决定"什么模型"：config、vocab、是否共享词嵌入；
# `build_distributed_models` 关心"几个模型 chunk、各是不是首尾 stage、包什么 wrapper"；`build_model` 为一个 stage 选 spec、
# 调 `GPTModel`。挂钩在配置上：ModelOpt 换的是配置类（`ModelOptModelConfig`，它的 `builder` 指向自己的 builder）。
# `GPTModel` 本身不知道命令行的存在，它只吃 `TransformerConfig` 和 `ModuleSpec`——这正是 simple loop 可以绕开前两层、
# 直接构造它的原因。0.19.0 的 `GPTModel.__init__` 每次构造都记一条警告：`GPTModel` 只收关键修复，后继是 `HybridModel`
# （[`gpt_model.py:118`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L118)）。
#
# **config 与 spec 分开。** `TransformerConfig` 给数字（多宽、多少层、并行度），spec 给类（用哪个 linear、哪个
# attention、norm 放哪）。同一份 config 配 local spec 或 TE spec 得到数学上相同的层；MoE、MLA、qk-norm 也是换 spec。
#
# **切分写在参数上。** 每个 TP 层造参数时调用 `set_tensor_model_parallel_attributes` 记下"切了、沿哪一维、stride"；
# `prepare_existing_model_chunks_for_distributed_training` 再给其余参数补"没切"（[`dist_utils.py:164`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/dist_utils.py#L164)）。之后谁需要知道一个参数是不是分片——梯度范数去重、checkpoint 的
# `sharded_state_dict`、sequence parallel 的 norm 归约——都读这几个属性，而不去猜层的类型。
#
# **CPU 初始化 = 先整后切。** `use_cpu_initialization=True` 时每个 rank 用同一个随机种子造出**整块**权重，再取自己的那几块；
# 所以 TP=2 的分片拼回去与 TP=1 的模型逐元素相同（上表全 True）。GPU 初始化时每个 rank 只造自己那块，
# 用按 TP 坐标偏移的 RNG 流（[笔记 02](../02_distributed_initialization/) 的 `model_parallel_cuda_manual_seed`），结果不再等于 TP=1，但分布相同。

# %% [markdown]
# ## 与训练主链路的关系
#
# 造模型是 `setup_model_and_optimizer` 的第一步，之后同一个函数用这些参数建 DDP 的梯度 buffer 和优化器（笔记 06）。
# 参数上的 TP 属性贯穿整个训练：forward 里每个列并行 / 行并行层按自己的分片计算并在 TP 群通信（[笔记 05](../05_forward_loss_backward/)、10），
# 优化器算梯度范数时只数一次复制的参数，checkpoint 按 `partition_dim` 把分片映射到全局张量（笔记 07）。
# simple loop 的对应步骤是 `model_provider()` 加 `gpt_model.to(device)` 和 `DistributedDataParallel(...)`。

# %% [markdown]
# ## 与基础知识的连接
#
# - **Megatron 的 TP 切法**：`Y = XW` 中把 `W` 按列切（输出维）就得到各自独立的一部分输出，按行切（输入维）就得到部分和，
#   要 all-reduce。一个 MLP 先列后行，中间的激活不必通信；attention 按 head 切，本质也是先列（QKV）后行（proj）。
# - **权重布局**：PyTorch 的 `nn.Linear.weight` 是 `[out, in]`，所以"列并行"切的是 `weight` 的第 0 维，"行并行"切第 1 维。
# - **词表并行**：embedding 表 `[V, h]` 按词表（第 0 维）切，每个 rank 只查得到自己范围内的词，查不到的位置填 0，
#   之后 all-reduce 求和（[笔记 12](../12_vocab_parallel/)）。

# %% [markdown]
# ## 遗留问题
#
# 1. **`--init-method-xavier-uniform` 在 tag 上会失败。** `core_transformer_config_from_args` 在这个开关下设
#    `kw_args['scaled_init_method']`（[`argument_utils.py:329`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L329)），
#    而 `TransformerConfig` 已经没有这个字段（它叫 `output_layer_init_method`）：构造时 `TypeError`（下面第一格）。
# 2. **选 spec 时第 5 个位置参数对不上。** `_te_or_local_layer_spec` 把 `config.experimental_attention_variant` 按位置传进
#    `get_gpt_layer_with_transformer_engine_spec` / `get_gpt_layer_local_spec`，而这两个函数的第 5 个参数是已废弃的
#    `fp8`（[`gpt.py:109`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L109)；旧路的 `_get_transformer_layer_spec` 一样，[`gpt_builders.py:124`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L124)，下面第二格）。
#    从 `default_layer_spec` 走到这一支时 `experimental_attention_variant` 必为 None（前面的 `elif` 已经截走了非 None），所以目前无害。
# 3. **TE spec 的 norm 类型不看 `--normalization`。** `get_gpt_layer_with_transformer_engine_spec` 不接收 `normalization`；
#    `TELayerNormColumnParallelLinear` 在实例化时才按 `config.normalization` 选 LayerNorm / RMSNorm。没有 TE 时无法运行验证。

# %%
try:
    TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4,
                      scaled_init_method=torch.nn.init.xavier_uniform_)
except TypeError as err:
    print("TypeError:", err)

# %%
for fn in (get_gpt_layer_with_transformer_engine_spec, get_gpt_layer_local_spec):
    print(fn.__name__, "的前 5 个参数:", list(inspect.signature(fn).parameters)[:5])

# %% [markdown]
# ## 自测
#
# **1. `--hidden-size 4096` 经过哪几步变成 `config.hidden_size`？**
#
# <details><summary>答案</summary>
#
# `ArgumentGroupFactory` 由 `TransformerConfig.hidden_size` 字段生成 `--hidden-size`（`dest="hidden_size"`）；
# argparse 得到 `args.hidden_size`；`core_transformer_config_from_args` 按同名把它拷进 `TransformerConfig(...)`，
# `gpt_config_from_args` 再把这份 config 放进 `GPTModelConfig.transformer`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(cli_flags(fields["hidden_size"]), "→", where_from(fields["hidden_size"]))

# %% [markdown]
# **2. TE spec 里 `input_layernorm` 是什么？LayerNorm 去哪了？**
#
# <details><summary>答案</summary>
#
# `IdentityOp`（`TransformerLayerSubmodules` 的缺省值，TE spec 没写这个槽位）。LayerNorm 融进了
# `linear_qkv`（`TELayerNormColumnParallelLinear`），`pre_mlp_layernorm` 同理融进 `linear_fc1`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({row[0]: row[2] for row in spec_table({"local": local_spec, "te": te_spec})
       if row[0] in ("input_layernorm", "self_attention.linear_qkv", "pre_mlp_layernorm", "mlp.linear_fc1")})

# %% [markdown]
# **3. TP=2 时 `linear_proj.weight` 与 `linear_proj.bias` 各怎么放？**
#
# <details><summary>答案</summary>
#
# weight 是行并行，沿 dim 1（输入）切：全局 `[16, 16]`，每 rank `[16, 8]`。bias 不切、每个 rank 一份完整的 `[16]`：
# 两个部分和 all-reduce 之后才加 bias，切了反而会被加两次。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print({row["name"].split(".")[-1]: (row["local_shape"], row["partition_dim"] if row["split"] else "复制")
       for row in tp2[0]["rows"] if "linear_proj" in row["name"]})

# %% [markdown]
# **4. 这个模型在 TP=2 时每个 rank 有多少个参数？为什么不是 TP=1 的一半？**
#
# <details><summary>答案</summary>
#
# 1848 个，TP=1 是 3440。切分的 3184 个两 rank 各一半（1592），复制的 256 个（位置嵌入、LayerNorm、行并行层的 bias）
# 每个 rank 都有一份：1592 + 256 = 1848。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(sum(row["numel"] for row in tp2[0]["rows"]), sum(row["numel"] for row in tp1["rows"]),
      count(tp2[0]["rows"], True), count(tp2[0]["rows"], False))

# %% [markdown]
# **5. SwiGLU 的 `linear_fc1` 为什么 `partition_stride` 是 2？**
#
# <details><summary>答案</summary>
#
# 它的权重是 gate 与 up 上下拼成的 `[2·ffn, h]`。每个 rank 要能本地算 `silu(gate) * up`，就必须同时拿到 gate 和 up
# 对应的同一段列。stride 2 把两半各自切成 TP 份，rank `r` 拿每半的第 `r` 份；直接按行对半切会让 rank 0 全是 gate。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
print(next(row["stride"] for row in tp2[0]["rows"] if row["name"] == fc1),
      torch.equal(naive, tp1["values"][fc1]))

# %% [markdown]
# ## 30-second answer
#
# `gpt_config_from_args` turns args into a `GPTModelConfig` (a `TransformerConfig` plus vocab, length, embedding
# sharing); `setup_model_and_optimizer` hands it to `GPTModelBuilder`, whose `build_model` picks a layer spec and builds
# `GPTModel(config, spec, ...)` per stage and whose `build_distributed_models` wraps them in DDP (the older
# `get_model` → `model_provider` → `gpt_builder` route remains for other entry points). At this tag most model flags
# are generated from the config's own fields, and `core_transformer_config_from_args` copies args back by name,
# overriding about twenty. The TE spec fuses each LayerNorm
# into the next column-parallel linear, leaving `IdentityOp` in the norm slots. At TP=2, column-parallel weights split
# dim 0, row-parallel weights dim 1, norms and row biases are replicated: 1848 parameters per rank versus 3440.
