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
# # 04 模型构造：从命令行到每个 rank 上切好的 `GPTModel`
#
# `setup_model_and_optimizer` 的第一件事是造模型。`--hidden-size 4096` 这样的参数怎样变成 `TransformerConfig`，谁选 layer spec、
# 谁调 `GPTModel(...)`？开了 TP=2 以后，每个 rank 上每个参数是切开还是复制、沿哪一维切、一共多少个？
# 本篇在 2 个进程上从命令行真的走一遍正式入口的构造，读出每个参数，再和 TP=1 的同一个模型逐元素比较。

# %% [markdown]
# ## 阅读目标
#
# 1. 说出 0.19.0 正式入口谁造模型：`gpt_config_from_args` → `GPTModelConfig` → `GPTModelBuilder.build_model` → `GPTModel`；旧路 `get_model` 还剩谁在用。
# 2. 说清一个命令行参数怎样进入 `TransformerConfig`：哪些 flag 由字段自动生成，哪些字段被手工覆盖。
# 3. 对比 local spec 与 Transformer Engine spec，说清 TE spec 的两个 norm 槽位为什么是 `IdentityOp`。
# 4. 对一个 TP=2 的 `GPTModel`，说出每个参数是切是复制、沿哪一维切、每个 rank 有多少参数。
#
# **结论**
#
# - 正式入口：`gpt_config_from_args` 把 `args` 变成 `GPTModelConfig`，交给 `GPTModelBuilder` 建模型；造模型 0 次通信。
# - `TransformerConfig` 的 306 个字段里 223 个自动生成同名 flag，83 个在排除表里，另有 21 个手工覆盖（如 `--swiglu`）。
# - TE spec 把 norm 融进 `linear_qkv`、`linear_fc1`（`TELayerNormColumnParallelLinear`），两个 norm 槽位成了 `IdentityOp`。
# - TP=2：列并行（词嵌入、`linear_qkv`、`linear_fc1`）切 dim 0，行并行（`linear_proj`、`linear_fc2`）切 dim 1，norm 等复制。
# - SwiGLU 的 `linear_fc1` 是 stride 2：每 rank 的 `[32, 16]` 一半 gate 一半 up，按 stride 拼回才等于 TP=1。
# - 每 rank 1848 个参数，不是 3440 的一半：切分的 3184 个各拿 1592，复制的 256 个每 rank 一份。
#
# 先读：[笔记 01](../01_training_run_overview/)（正式入口）、[笔记 02](../02_distributed_initialization/)（TP 群）；约 20 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
import dataclasses
import inspect
import sys

import torch

from snippets.config.model_args import EXCLUDED, OVERRIDES, cli_flags, transformer_config_fields, where_from
from snippets.config.model_specs import spec_table, transformer_engine_spec_without_te
from snippets.config.param_table import gather
from snippets.config.pictures import draw_param_shards
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments.n04_gpt_model import build_gpt, count, run, shard_of, tables
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table

from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,
                                                      get_gpt_layer_with_transformer_engine_spec)
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules
from megatron.training.argument_utils import gpt_config_from_args
from megatron.training.arguments import parse_args
from megatron.training.models.gpt import GPTModelBuilder


class Folded:
    """Reference tables: shown closed, one click away."""

    def __init__(self, summary, *tables):
        self.summary, self.tables = summary, tables

    def _repr_markdown_(self):
        body = "\n\n".join(t.markdown() for t in self.tables)
        return f"<details><summary>{self.summary}</summary>\n\n{body}\n\n</details>"

    def __repr__(self):
        return "\n\n".join(t.markdown() for t in self.tables)


TINY = EXPERIMENTS["gpt-model"].tiny
PAR = Parallel(world=2, tp=2)
tp2 = run_ranks(run, 2, TINY, PAR, grid=dict(tp=2), keep_values=True)
tp1 = dict(rows=tp2[0]["tp1_rows"], values=tp2[0]["tp1_values"])
built_line, classes_line, param_rows_table, shared_line, count_rows_table = tables(tp2, TINY, PAR)
draw_param_shards(param_rows_table.rows, PAR.tp, scale=2.5,
                  title="TP=2：列并行切 dim 0、行并行切 dim 1，linear_fc1 按 stride 2 交错；每 rank 1848 个参数")

# %% [markdown]
# 每个被切分的权重按全局 `[out, in]` 画，颜色是持有那一块的 TP rank。模型：1 层、hidden 16、4 个 head、SwiGLU（ffn 32）、词表 32、最长 8，共享词嵌入。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 实验在 `snippets/experiments/n04_gpt_model.py`（实验名 `gpt-model`，尺寸是它的 `tiny`）。`build_gpt` 做的就是 `GPTModelBuilder.build_model`
#   那几步：local spec、`use_cpu_initialization=True`、共享词嵌入、`parallel_output=True`，再像 `prepare_existing_model_chunks_for_distributed_training`
#   那样给复制的参数补上缺省的 TP 属性；`tests/ranks/test_gpt_builder.py` 核对它与真实 builder 建出的参数逐元素相同，本页「从命令行到 `GPTModel`」
#   一节也直接调真实的 builder 核对了一次。
# - 参照：`run` 在同一进程里造完 TP=2 的模型、读完每个参数的 Megatron 属性后 `destroy_model_parallel`，用同一个种子再造 TP=1 的模型，
#   检查本 rank 的分片是否正是整块里属于它的那一片（`shard_of`：沿 `partition_dim` 切成 `TP · stride` 块，取第 `r, r+TP, …` 块）；
#   `keep_values=True` 把数值带回笔记进程，拼 `linear_fc1` 时用（`snippets.config.param_table.gather`）。
# - 命令行那张表：排除表与手工覆盖表在 `megatron/training` 里，`snippets/config/model_args.py` 把它们记成数据、把命名规则重写成几行，
#   `tests/unit/test_model_args.py` 拿它们与已安装的核对。
# - TE spec：本机没有 Transformer Engine，`snippets.config.model_specs.transformer_engine_spec_without_te` 在一个 `with` 块里把
#   `gpt_layer_specs` 的 `TESpecProvider` 绑回真实的类（并让 TE 版本检查回答"够新"），真实函数就能造出真实的 spec；TE 类本身是
#   `MagicMock` 替身，表里按它们在 `transformer_engine.py` 里的名字标出。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 gpt-model --tp 2`（参数表与参数数）；
#   整页：`scripts/execute_notes.sh notes/04_model_provider_and_gpt_model.py`。CPU 上要的改动见文末「在 CPU 上怎么跑的」。
#
# </details>

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(build_gpt, shard_of, run)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`training.py::setup_model_and_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2017) | 有 `cfg_container.model` 时交给它的 builder（[training.py:2050](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L2050)），否则 `get_model` |
# | [`argument_utils.py::gpt_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L433) | `args` → `GPTModelConfig` |
# | [`argument_utils.py::core_transformer_config_from_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L277) | `args` → `TransformerConfig`：同名拷贝 + 手工覆盖 |
# | [`gpt.py::GPTModelBuilder.build_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L255) | 一个 stage：选 spec、补齐词表、`GPTModel(...)` |
# | [`gpt.py::default_layer_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L50) | 按配置选 spec；dense 模型按 `transformer_impl` 选 TE / local |
# | [`gpt_layer_specs.py::get_gpt_layer_local_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L467) | 只用 Megatron Core 自己的模块 |
# | [`gpt_layer_specs.py::get_gpt_layer_with_transformer_engine_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L351) | 用 TE 模块（正式入口的缺省） |
# | [`gpt_model.py::GPTModel.__init__`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L94) | embedding、decoder、output layer |
# | [`layers.py::_initialize_affine_weight_cpu`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L184) | CPU 初始化：造整块权重再按 `partition_dim`、`stride` 切 |
#
# <details><summary>其余 17 个符号</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`gpt.py::GPTModelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L135) | GPT 模型的纯配置；类属性 `builder` 指向 `GPTModelBuilder` |
# | [`gpt.py::GPTModelBuilder.build_distributed_models`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L331) | 每个（虚拟）stage 建一次模型，再补属性、包 wrapper 与 DDP |
# | [`dist_utils.py::prepare_existing_model_chunks_for_distributed_training`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/dist_utils.py#L120) | 补默认 TP 属性、打印参数数、搬 GPU、包 `Float16Module`、包 DDP |
# | [`training.py::get_model`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1706) | 旧路（RL 另建推理模型时，[training.py:1323](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/training.py#L1323)；ModelOpt 工具直接调用）：按 PP / VPP 定 `pre_process` / `post_process`，调 provider，包 DDP |
# | [`model_provider.py::model_provider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/model_provider.py#L20) | 旧路：薄包装，取 `args`，调 builder |
# | [`gpt_builders.py::gpt_builder`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L25) | 旧路：config + spec → `GPTModel(...)` |
# | [`gpt_builders.py::_get_transformer_layer_spec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L108) | 旧路：`--transformer-impl` 选 TE / local spec |
# | [`arguments.py::_add_network_size_args`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/arguments.py#L2195) | 由 `TransformerConfig` 的字段生成命令行参数（带排除表） |
# | [`argument_utils.py::ArgumentGroupFactory`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L45) | 字段 → `--flag` 的命名规则 |
# | [`transformer_config.py::TransformerConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L54) | 模型结构的全部超参数 |
# | [`model_parallel_config.py::ModelParallelConfig`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/model_parallel_config.py#L46) | 它的父类：并行、精度、通信重叠 |
# | [`gpt_layer_specs.py::get_mlp_module_spec_for_backend`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L521) | backend 能融合 norm 时 `linear_fc1` 用带 norm 的列并行 linear |
# | [`transformer_engine_spec_provider.py::TESpecProvider`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/extensions/transformer_engine_spec_provider.py#L36) | TE backend：每个槽位给哪个 TE 类 |
# | [`spec_utils.py::ModuleSpec`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L13) | "哪个类、什么参数、哪些子模块"的数据 |
# | [`spec_utils.py::build_module`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/spec_utils.py#L74) | 按 spec 实例化 |
# | [`transformer_layer.py::TransformerLayerSubmodules`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L243) | 一层的槽位；没给的槽位缺省 `IdentityOp` |
# | [`layers.py::set_defaults_if_not_set_tensor_model_parallel_attributes`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/layers.py#L147) | 给复制的参数补上"不切"的属性（[`dist_utils.py:164`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/dist_utils.py#L164)） |
#
# </details>

# %% [markdown]
# ## 调用链
#
# `gpt_config_from_args` 造配置，`setup_model_and_optimizer` → `GPTModelBuilder.build_distributed_models` 为每个（虚拟）stage 调一次
# `build_model` → `GPTModel(...)`，再补属性、包 DDP；旧路 `get_model` → `model_provider` → `gpt_builder` 造的是同一个 `GPTModel`。
#
# <details><summary>完整调用链</summary>
#
# ```text
# pretrain_gpt.py (__main__)
# ├─ megatron/training/arguments.py::parse_and_validate_args               # argparse → validate_args → build_tokenizer（补齐词表）
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
#                ├─ model.cuda()（use_cpu_initialization 时不搬，旧路 get_model 会搬）；--bf16 / --fp16 时包 Float16Module
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
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `training.py::setup_model_and_optimizer` 的记录在[笔记 01](../01_training_run_overview/)。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `gpt_config_from_args` | `args` | `GPTModelConfig`（`transformer` 字段是 `TransformerConfig`） | `TransformerConfig` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` 与 `GPTModel(...)` 的关键字参数 |
# | `core_transformer_config_from_args` | `args` | `TransformerConfig` | `TransformerConfig` | 否 | 否 | 否 | 手写的 `TransformerConfig(...)` |
# | `GPTModelBuilder.build_distributed_models` | `pg_collection`、`ddp_config`、是否包 DDP… | 模型 chunk 的 list（已包 DDP） | `build_model`、`set_defaults_if_not_set_...`、`Float16Module`、DDP | 读 PP / VPP 坐标；DDP 用 dp-cp 群 | 间接（`build_model`） | 是：建参数 | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` |
# | `GPTModelBuilder.build_model` | `pg_collection`、`pre_process`、`post_process`、`vp_stage` | `GPTModel` | layer spec、`GPTModel` | 否（把 `pg_collection` 交给 `GPTModel`） | 间接 | 是：建参数 | `model_provider()` 的函数体 |
# | `get_model`（旧路） | provider、model type | 模型 chunk 的 list（已包 DDP） | provider、`set_defaults_if_not_set_...`、`Float16Module`、DDP | 读 PP / VPP 坐标；DDP 用 dp-cp 群 | 间接（provider） | 是：建参数 | `model_provider()` + `gpt_model.to(device)` + `DistributedDataParallel(...)` |
# | `model_provider` → `gpt_builder`（旧路） | builder、`pre_process`、`post_process`、`vp_stage` | `GPTModel` | `TransformerConfig`、layer spec、`GPTModel` | 否 | 间接 | 是：建参数 | `model_provider()` |
# | `get_gpt_layer_local_spec` 等 | 是否 MoE、qk norm、normalization… | `ModuleSpec` | spec provider | 否 | 否 | 否 | `get_gpt_layer_local_spec()` |
# | `GPTModel.__init__` | config、spec、vocab、最大长度、`parallel_output`… | 模块 | embedding、`TransformerBlock`、TP 层 | 读 TP 群大小与坐标（`pg_collection`） | **是**：每个 TP 层只建本 rank 的分片 | 是：参数 | `GPTModel(...)` |
# | `_initialize_affine_weight_cpu` | 分片参数、完整 shape、`partition_dim`、`stride` | 分片被填好 | `set_tensor_model_parallel_attributes` | 读 TP 坐标 | **是**：整块 → 第 `r, r+TP, …` 块 | 是 | `use_cpu_initialization=True` 时 |
#
# </details>
#
# > **旧版（core_v0.18.0）：** `pretrain_gpt.py` 把 `partial(model_provider, gpt_builder)` 传给 `pretrain`，`setup_model_and_optimizer` 总是经
# > `get_model` → `model_provider` → `gpt_builder` 造模型（[training.py:1954](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/training/training.py#L1954)）；没有 `GPTModelConfig` / `GPTModelBuilder`。

# %% [markdown]
# ## 关键对象
#
# ### 从命令行到 `GPTModel`
#
# 下面两个进程各自解析一条正式入口的命令行，经 `gpt_config_from_args` 得到 `GPTModelConfig`，再用它的 builder 造本 rank 的模型
# （本机没有 TE，所以加 `--transformer-impl local`，关掉三个要 TE 或 APEX 的融合）：

# %%
FLAGS = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "4", "--ffn-hidden-size", "32",
         "--swiglu", "--vocab-size", "32", "--make-vocab-size-divisible-by", "16", "--seq-length", "8",
         "--max-position-embeddings", "8", "--micro-batch-size", "1", "--tensor-model-parallel-size", "2",
         "--use-cpu-initialization", "--transformer-impl", "local",
         "--no-rope-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion"]


def formal_entry(flags):
    sys.argv = ["pretrain_gpt.py", *flags]
    args = parse_args()
    # 正式入口里这两项由 validate_args（按 --bf16 / --fp16）和 build_tokenizer（补齐词表）写进 args
    args.params_dtype = torch.float32
    args.padded_vocab_size = vocab_size_with_padding(args.vocab_size, args, logging_enabled=False)
    model_config = gpt_config_from_args(args)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size)
    torch.manual_seed(args.seed)  # initialize_megatron 的 _set_random_seed
    model_parallel_cuda_manual_seed(args.seed)
    model = GPTModelBuilder(model_config).build_model(ProcessGroupCollection.use_mpu_process_groups())
    t = model_config.transformer
    summary = {"config": f"{type(model_config).__name__}(transformer={type(t).__name__})",
               "builder": model_config.builder, "hidden_size": t.hidden_size,
               "gated_linear_unit": t.gated_linear_unit, "activation_func": t.activation_func.__name__,
               "num_query_groups": t.num_query_groups, "vocab_size": model_config.vocab_size,
               "share_embeddings_and_output_weights": model_config.share_embeddings_and_output_weights}
    return summary, {name: p.detach().clone() for name, p in model.named_parameters()}


entry = run_ranks(formal_entry, 2, FLAGS, grid=dict(tp=2))
for key, value in entry[0][0].items():
    print(f"{key:36} {value}")

# %% [markdown]
# `--swiglu` 在 config 里成了 `gated_linear_unit=True` 加 `silu`；没给 `--group-query-attention`，`num_query_groups` 先被置 None、
# 再由 `TransformerConfig.__post_init__` 补成 head 数 4。这两个 rank 的 16 个参数张量与本页其余部分用的模型逐元素相同：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("与 build_gpt 造的模型逐元素相同:",
      [list(values) == list(r["values"]) and all(torch.equal(values[n], r["values"][n]) for n in r["values"])
       for (_, values), r in zip(entry, tp2)])
print(built_line)

# %% [markdown]
# simple loop 绕开命令行，直接写 `TransformerConfig(...)` 和 `GPTModel(config, get_gpt_layer_local_spec(), ...)`。
#
# ### 命令行 → `TransformerConfig`
#
# 模型结构的 flag 大多不是手写的：`_add_network_size_args` 用 `ArgumentGroupFactory` 遍历 `TransformerConfig` 的每个字段，生成同名 flag
# （`hidden_size` → `--hidden-size`）；缺省为 True 的布尔字段生成 `--no-x` / `--disable-x`；字段元数据 `argparse_meta` 可以改名；排除表里的字段不生成。
# 之后 `core_transformer_config_from_args` 把与字段同名的 `args` 全拷回来，再手工覆盖一批：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
fields = transformer_config_fields()
generated = [f for f in fields.values() if cli_flags(f)]
print("TransformerConfig 字段数:", len(fields), " 自动生成 flag 的:", len(generated),
      " 排除表里的:", len(EXCLUDED & set(fields)), " 手工覆盖的:", len(OVERRIDES))
print("改了名的 flag:", {f.name: cli_flags(f) for f in generated
                        if cli_flags(f)[0] != "--" + f.name.replace("_", "-")
                        and not cli_flags(f)[0].startswith(("--no-", "--disable-"))})
main_fields = ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
               "kv_channels", "normalization", "add_bias_linear", "gated_linear_unit", "activation_func",
               "hidden_dropout", "init_method_std", "tensor_model_parallel_size", "sequence_parallel",
               "num_moe_experts", "bf16", "pipeline_dtype", "batch_p2p_comm", "use_cpu_initialization"]


def default_of(field):
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return getattr(value, "__name__", value)


Folded("主要字段：哪个 flag 填它、dataclass 缺省值",
       Table(["TransformerConfig 字段", "命令行 → 字段", "dataclass 缺省值"],
             [[name, where_from(fields[name]), default_of(fields[name])] for name in main_fields]))

# %% [markdown]
# 所以"哪个参数对应哪个字段"大多数时候就是"同名"。例外有三类：
#
# - **改名**：`add_bias_linear` 的开关叫 `--disable-bias-linear`；`num_moe_experts` 来自 `--num-experts`；`batch_p2p_comm` 是 `--overlap-p2p-communication` 取反。
# - **组合**：`--swiglu` 不是字段，它同时设 `activation_func=F.silu` 和 `gated_linear_unit=True`；`num_query_groups` 只在 `--group-query-attention` 时拷贝。
# - **推导**：`pipeline_dtype` 来自 `validate_args` 由 `--bf16` / `--fp16` 算出的 `params_dtype`。
#
# `TransformerConfig` 在构造之后自己又改了哪些字段、拒绝哪些组合，见[笔记 19](../19_model_topic/)。
#
# ### layer spec：local 与 Transformer Engine
#
# `ModuleSpec` 只是数据："这个槽位放哪个类、带什么参数、子模块是什么"，`TransformerLayer` 用 `build_module` 按它实例化。`mlp` 槽位放的是
# builder `functools.partial(MLP.as_mlp_submodule, submodules=…)`（[`gpt_layer_specs.py:541`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L541)），
# `TransformerLayer` 直接调用它（[`transformer_layer.py:431`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_layer.py#L431)）。
# 本机没有 TE，`get_gpt_layer_with_transformer_engine_spec()` 连调用都不行：

# %%
try:
    get_gpt_layer_with_transformer_engine_spec()
except TypeError as err:
    print("TypeError:", err)

# %% [markdown]
# `gpt_layer_specs.py` 只在 `transformer_engine` 能导入时才导入 `TESpecProvider`，否则把它设成 `None`（[gpt_layer_specs.py 第 46–54 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_layer_specs.py#L46-L54)），
# 函数里的 `TESpecProvider()` 就成了调用 `None`。spec 本身是纯数据，把这个名字临时绑回真实的类，真实函数就造得出真实的 spec：

# %%
with transformer_engine_spec_without_te():
    te_spec = get_gpt_layer_with_transformer_engine_spec()
local_spec = get_gpt_layer_local_spec()
Table(["槽位", "local spec", "TE spec"], spec_table({"local": local_spec, "te": te_spec}))

# %% [markdown]
# 差别集中在三处：
#
# - **norm 融进了下一个 linear。** TE 的 `linear_qkv`、`linear_fc1` 是 `TELayerNormColumnParallelLinear`：norm 和列并行 linear
#   是一个模块、一次 kernel，norm 的参数挂在 linear 上（`linear_qkv.layer_norm_weight`）。独立的 `input_layernorm`、`pre_mlp_layernorm`
#   没事可做，是 `TransformerLayerSubmodules` 的缺省 `IdentityOp`（TE spec 根本没写这两个槽位）。
# - **checkpoint 两边通用靠改名表。** local spec 带一张 `sharded_state_dict_keys_map`，存 checkpoint 时把 `input_layernorm.` 写成
#   TE 下的名字 `self_attention.linear_qkv.layer_norm_`，所以 local 与 TE 的 checkpoint 可以互相加载。
# - **attention 核心**换成 `TEDotProductAttention`（支持 packed 序列、CP，[笔记 03](../03_data_and_batch_flow/)、16）。
#
# 第一次读代码用 local spec 更清楚：每个数学步骤都是一个独立的模块。

# %%
print("TransformerLayerSubmodules 的缺省 input_layernorm:",
      next(f.default for f in dataclasses.fields(TransformerLayerSubmodules) if f.name == "input_layernorm").__name__)
print("local spec 的 sharded_state_dict_keys_map:", local_spec.submodules.sharded_state_dict_keys_map)

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### TP=2 上的每个参数
#
# 开头的图就是这张表：全局 shape 由本地 shape 与 `partition_dim` 算出；"拼回 = TP=1"是每个 rank 的分片都等于 TP=1 模型同名参数里
# 属于它的那一片（复制的参数则是整块相等）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
param_rows_table

# %% [markdown]
# - **dim 0（列并行：切输出）**：`word_embeddings`（词表 32 → 每 rank 16 个词）、`linear_qkv`（3·16 = 48 行 → 24，每 rank 2 个 head
#   的 q、k、v）、`linear_fc1`（2·32 = 64 → 32）以及它们的 bias。
# - **dim 1（行并行：切输入）**：`linear_proj`、`linear_fc2`；它们的 bias 不切：部分和 all-reduce 之后才加一次 bias（[笔记 10](../10_column_row_parallel_linear/)）。
# - **复制**：`position_embeddings`、所有 LayerNorm。每个 rank 各有一份，梯度也要一致（开 sequence parallel 时要额外归约，[笔记 11](../11_transformer_layer/)）。
# - **stride 2**：SwiGLU 的 `linear_fc1` 把 gate 和 up 上下拼成一个矩阵。直接按行对半切，rank 0 拿到全部 gate、rank 1 拿到全部 up，
#   本地就算不了 `silu(gate) * up`；stride 2 先把两半各切成 TP 份，rank `r` 拿每一半的第 `r` 份。所以直接 `cat` 两个分片不等于 TP=1：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
naive = torch.cat([tp2[0]["values"][fc1], tp2[1]["values"][fc1]])
print("直接 cat == TP=1:", torch.equal(naive, tp1["values"][fc1]),
      "  按 stride 2 拼回 == TP=1:", torch.equal(gather([tp2[r]["values"][fc1] for r in range(2)], 0, 2),
                                               tp1["values"][fc1]))
print(shared_line)

# %% [markdown]
# **没有 `output_layer.weight`。** 共享词嵌入时输出层不建自己的权重（`skip_weight_param_allocation`），forward 时用 `word_embeddings.weight`：
# 它也按词表切成 `[V/TP, h]`，正好是列并行输出层要的分片。
#
# ### 每个 rank 多少参数

# %% tags=["hide-input"] jupyter={"source_hidden": true}
count_rows_table

# %% [markdown]
# 切分的部分两个 rank 各一半（1592 + 1592 = 3184），复制的 256 个每个 rank 都有：每 rank 1848，不是 3440 的一半。正式入口启动时打印的
# "number of parameters on (tensor, gtp_remat, pipeline) model parallel rank" 就是这一列。模型越大，复制部分（norm、位置嵌入、行并行的 bias）占比越小。

# %% [markdown]
# ## 机制解释
#
# **三层分工。** `gpt_config_from_args` 把命令行一次性变成 `GPTModelConfig`，决定"什么模型"；`build_distributed_models` 管"几个模型 chunk、
# 各是不是首尾 stage、包什么 wrapper"；`build_model` 为一个 stage 选 spec、调 `GPTModel`。换实现只换配置类：ModelOpt 的 `ModelOptModelConfig`
# 的 `builder` 指向它自己的 builder。`GPTModel` 不知道命令行的存在，只吃 `TransformerConfig` 和 `ModuleSpec`，所以 simple loop 可以绕开前两层。
# 0.19.0 的 `GPTModel.__init__` 每次构造都记一条警告：它只收关键修复，后继是 `HybridModel`（[`gpt_model.py:118`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/gpt/gpt_model.py#L118)）。
#
# **config 与 spec 分开。** `TransformerConfig` 给数字（多宽、多少层、并行度），spec 给类（用哪个 linear、哪个 attention、norm 放哪）。
# 同一份 config 配 local spec 或 TE spec 得到数学上相同的层；MoE、MLA、QK norm 也是换 spec。
#
# **切分写在参数上。** 每个 TP 层造参数时调 `set_tensor_model_parallel_attributes` 记下"切了、沿哪一维、stride"；
# `prepare_existing_model_chunks_for_distributed_training` 再给其余参数补"没切"。之后谁要知道一个参数是不是分片，梯度范数去重、
# checkpoint 的 `sharded_state_dict`、sequence parallel 的 norm 归约，都读这几个属性，而不去猜层的类型。
#
# **CPU 初始化 = 先整后切。** `use_cpu_initialization=True` 时每个 rank 用同一个种子造出**整块**权重，再取自己的那几块，所以 TP=2 的分片
# 拼回去与 TP=1 逐元素相同。GPU 初始化时每个 rank 只造自己那块，用按 TP 坐标偏移的 RNG 流（[笔记 02](../02_distributed_initialization/)），
# 结果不再等于 TP=1，但分布相同。

# %% [markdown]
# ## 与训练主链路的关系
#
# 造模型是 `setup_model_and_optimizer` 的第一步，之后同一个函数用这些参数建 DDP 的梯度 buffer 和优化器（笔记 06）。参数上的 TP 属性贯穿训练：
# forward 里每个并行层按自己的分片计算并在 TP 群通信（[笔记 05](../05_forward_loss_backward/)、10），优化器算梯度范数时复制的参数只数一次，
# checkpoint 按 `partition_dim` 把分片映射到全局张量（笔记 07）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **矩阵分块乘法**：`Y = XW` 把 `W` 按列切（输出维）得到各自独立的一段输出，按行切（输入维）得到部分和、要 all-reduce；MLP 先列后行，中间不通信。
# - **权重布局**：`nn.Linear.weight` 是 `[out, in]`，所以"列并行"切 `weight` 的第 0 维，"行并行"切第 1 维。
# - **词表并行**：embedding 表 `[V, h]` 按词表切，每个 rank 只查得到自己范围内的词，其余位置填 0 再 all-reduce（[笔记 12](../12_vocab_parallel/)）。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **`--init-method-xavier-uniform` 会失败。** `core_transformer_config_from_args` 在这个开关下设 `kw_args['scaled_init_method']`
#    （[`argument_utils.py:329`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/argument_utils.py#L329)），
#    而 `TransformerConfig` 已经没有这个字段（它叫 `output_layer_init_method`）：构造时 `TypeError`（下面第一格）。
# 2. **选 spec 时第 5 个位置参数对不上。** `_te_or_local_layer_spec` 把 `experimental_attention_variant` 按位置传给两个 spec 函数，而它们的第 5 个参数是已废弃的
#    `fp8`（[`gpt.py:109`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/training/models/gpt.py#L109)；旧路一样，[`gpt_builders.py:124`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/gpt_builders.py#L124)，下面第二格）。
#    走到这一支时它必为 None（前面的 `elif` 截走了非 None），所以目前无害。
# 3. **TE spec 的 norm 类型不看 `--normalization`（读代码所见）。** `get_gpt_layer_with_transformer_engine_spec` 不收 `normalization`；
#    `TELayerNormColumnParallelLinear` 在实例化时才按 `config.normalization` 选 LayerNorm / RMSNorm。本机没有 TE，无法运行验证。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 没有 Transformer Engine：正式入口缺省的 TE spec 造不出模块，本页用 local spec（`--transformer-impl local`）；TE spec 只读到 spec 这一层（见上）。
# - 命令行那一格关掉了三个要 CUDA 扩展的开关：`--no-rope-fusion`（否则 `TransformerConfig` 要求 TE）、`--no-persist-layer-norm`
#   （torch 的 LayerNorm 不支持）、`--no-gradient-accumulation-fusion`（要 APEX 的 `fused_weight_gradient_mlp_cuda`）；`params_dtype`
#   与补齐后的词表本来由 `validate_args` 和 `build_tokenizer` 写进 `args`，这里直接给出。
# - `use_cpu_initialization=True`：权重在 CPU 上先整后切，种子相同就与 TP=1 逐元素可比；`torch.cuda.current_device()` 等由 CPU 补丁换成 CPU（见[在 CPU 上运行](../../cpu/)）。
# - `GPTModel.__init__` 的弃用警告由已知警告过滤静音。
#
# </details>

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
print(cli_flags(fields["hidden_size"]), "→", where_from(fields["hidden_size"]), "| 上面的运行:", entry[0][0]["hidden_size"])

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
# sharing); `setup_model_and_optimizer` hands it to `GPTModelBuilder`, which picks a layer spec, builds `GPTModel` per
# stage and wraps it in DDP. Most model flags are generated from the config's fields. The TE spec fuses each norm into
# the next column-parallel linear. At TP=2, column-parallel weights split dim 0, row-parallel weights dim 1, norms and
# row biases are replicated: 1848 parameters per rank versus 3440.
