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
# # 25 Megatron ↔ Hugging Face：同一份 weight 换一套名字，logits 为证
#
# RL 每一轮都要把训练端的 weight 交给 rollout 引擎。vLLM、SGLang 读的是 Hugging Face 格式的名字和 weight，装进它们自己的
# 模型类；Megatron 的 QKV 融在一个矩阵里、gate 和 up 融在一起、词表补过 padding。一个 `GPTModel` 的参数要怎样改名、拆开、
# 去 padding，才变成 HF 的 state dict？又怎样证明转对了？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出把一个 Megatron `GPTModel`（local spec）交给 `transformers` 时，每个参数要做什么：改名、按 query group 拆 QKV、
#    把 SwiGLU 的 `linear_fc1` 拆成 gate 和 up、去掉 vocab padding、共享 embedding 时 `lm_head` 从哪来。
# 2. 说清 TP 分片聚齐时 `linear_fc1` 为什么不能首尾相接（`partition_stride=2`），`linear_qkv` 为什么可以。
# 3. 从代码说明 Megatron 的 RoPE（`rotary_interleaved=False`）和 HF 的 `rotate_half` 是同一种旋转，不需要置换。
# 4. 用 logits 证明一次转换是对的，并说出三种常见错误各自怎样暴露。
# 5. 对照 Megatron Bridge 的 Qwen3 映射，说出我们的表和它在哪里一致、哪里不同。
#
# **结论**
#
# - 先聚齐：`swap_model_weights` 把 TP2·PP2 的分片拼回完整张量，rank 0 的 `linear_qkv` `[48, 32]` → `[96, 32]`。
# - 改名之外只有三种变换：`linear_qkv` 按 query group 拆成 q/k/v，`linear_fc1` 对半拆成 gate/up，词表去掉 padding（64 → 60）。
# - `linear_fc1` 的分片不能首尾相接（`partition_stride=2`）：首尾相接 == 完整 fc1 是 False，每片对半分再拼是 True。
# - RoPE 不用置换：Megatron 非 interleaved 的 `_rotate_half` 与 HF 的 `rotate_half` 逐位相等（True）。
# - 证明靠 logits：两个方向 max |Δlogit| 都 < 1e-6；QKV 不按 group 拆照样能加载，logits 却差 0.8428。
# - QK norm 的梯度要在 TP 群里求和，否则两个 TP rank 的 weight 分叉（求和前两份梯度不同：True）。
#
# 先读：[笔记 22](../22_refit_and_resharding/)（refit 与 `swap_model_weights`）、[笔记 11](../11_transformer_layer/)（QKV 交错、fc1 stride 2）；约 18 分钟。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from snippets.experiments import EXPERIMENTS
from snippets.experiments import n25_hf
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing
from snippets.record.tables import Table
from snippets.rl import hf_convert, hf_mapping, hf_pictures

import torch
import megatron.core.models.gpt  # imported once here, so the forked ranks do not each import it
import megatron.core.resharding.refit
from types import SimpleNamespace
from transformers import LlamaForCausalLM, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

GQA = EXPERIMENTS["hf-convert"].tiny
ranks = run_ranks(n25_hf.convert_shapes, 4, [(GQA, False), (n25_hf.MHA, True)], grid=dict(tp=2, pp=2))
qwen, llama = ranks[0]
hf_pictures.draw_mapping(
    [row for row in n25_hf.mapping_rows(qwen) if row[3] != "copy"], left_w=390, gap=170, right_w=420,
    title="Megatron → HF：改名之外只有三种变换（按 group 拆 QKV、拆 gate/up、去 vocab padding）",
    desc="左边是聚齐后的 Megatron 张量，右边是 Qwen3ForCausalLM 的 state_dict 键；只画不止改名的几行，第 0 层代表每一层。")

# %% [markdown]
# <details><summary>本页怎么跑出来的</summary>
#
# - 4 个 CPU rank（gloo、fp32）上跑真实的 `megatron.core` 和 `transformers` 5.23.0。实验在
#   `snippets/experiments/n25_hf.py`（实验名 `hf-convert`）：`convert_shapes` 在每个 rank 上建 TP2·PP2 的 policy、训练一步（SGD）、
#   `swap_model_weights` 聚齐成 TP1·PP1、按映射表转换、`strict=True` 装进只从 config 建出来的 HF 模型（不下载、不连 hub）、
#   比 logits、试三种错误映射、再反方向装回 Megatron TP2。
# - 两个模型：`tiny`（8 head、2 个 query group、head_dim 8、QK norm、不共享 embedding → `Qwen3ForCausalLM`）和 `MHA`
#   （无 QK norm、共享 embedding、fc2 方阵 → `LlamaForCausalLM`）；词表都是 60，Megatron 补到 64。
# - 映射表在 `snippets/rl/hf_mapping.py`（`ROWS`、`CONFIG_ROWS`），转换在 `snippets/rl/hf_convert.py`（`to_hf`、`to_megatron`），
#   图由 `snippets/rl/hf_pictures.py::draw_mapping` 从同一批行画出。模型尺寸超出表的范围（MoE、bias、GeLU）时
#   `snippets/checks.py` 一行拒绝。
# - 重跑本页：`scripts/execute_notes.sh notes/25_megatron_hf_conversion.py`；测试在 `tests/ranks/test_hf_convert.py`。
#
# </details>

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`refit.py::swap_model_weights`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L339) | 聚齐：把 TP2·PP2 的 policy 重切成每个 rank 一份 TP1·PP1 的完整模型；反方向把 TP1 重切成 TP2 |
# | [`attention.py::SelfAttention.get_query_key_value_tensors`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1812) | 按 query group 拆 `linear_qkv` 的输出；随后对每个 head 做 QK layernorm（[attention.py:1921](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/attention.py#L1921)） |
# | [`mlp.py::MLP`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L155) | SwiGLU 时 `linear_fc1` 输出 `[gate; up]`，按 `partition_stride=2` 切给 TP（[mlp.py:210](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L210)） |
# | [`rope_utils.py::_rotate_half`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rope_utils.py#L73) | 非 interleaved：前一半、后一半配对，和 HF 的 `rotate_half` 同一写法 |
# | [`build_tokenizer.py::vocab_size_with_padding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L124) | 词表向上取整到 `make_vocab_size_divisible_by · TP` 的倍数 |
#
# <details><summary>其余 7 个符号与 Hugging Face 一侧</summary>
#
# | 符号 | 在本篇里的角色 |
# |---|---|
# | [`refit.py::_build_or_get_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L208) | 重切计划缓存在 refit.py 的模块级字典里，键是两边的并行大小（[`refit.py::_build_plan_cache_key`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L86)），不是模型本身 |
# | [`planner.py::build_local_reshard_plan`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/planner.py#L454) | 一次 `all_gather_object` 交换各 rank 的参数元数据，每个 rank 自己算出与它有关的收发 |
# | [`torch_norm.py::WrappedTorchNorm`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/torch_norm.py#L27) | local spec 的 RMSNorm 就是 `torch.nn.RMSNorm`，eps 取 `layernorm_epsilon` |
# | [`rotary_pos_embedding.py::RotaryEmbedding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L36) | `inv_freq = 1 / base^(2i/d)`（[rotary_pos_embedding.py 第 79 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L79)），频率表 `cat(freqs, freqs)`（[rotary_pos_embedding.py 第 168 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/embeddings/rotary_pos_embedding.py#L168)） |
# | [`finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L416) | QK layernorm 的 weight 在 TP 上复制，梯度要在 TP 群里求和（[finalize_model_grads.py 第 452 行](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L452)） |
# | [`finalize_model_grads.py::_allreduce_word_embedding_grads`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L164) | 共享 embedding 时，第一个和最后一个 stage 上的两份梯度求和 |
# | [`language_module.py::LanguageModule.shared_embedding_or_output_weight`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L339) | 第一个 stage 返回 embedding，最后一个 stage 返回它的副本 `output_layer.weight` |
#
# Hugging Face 一侧（[transformers v5.23.0](https://github.com/huggingface/transformers/tree/v5.23.0)）：
# [`modeling_llama.py::rotate_half`](https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L119)、
# [`apply_rotary_pos_emb`](https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L127)、
# 默认 RoPE 的 `inv_freq`（[第 105 行](https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L105)）；
# Qwen3 先对每个 head 做 `q_norm` 再转置（[modeling_qwen3.py 第 244 行](https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/qwen3/modeling_qwen3.py#L244)）。
#
# </details>

# %% [markdown]
# ## 调用链
#
# 一次转换：聚齐 → 改名拆分 → 装进 HF → 比 logits → 反方向。
#
# <details><summary>完整调用链</summary>
#
# ```text
# snippets/experiments/n25_hf.py::convert(dims, tied)                 # 每个 rank
# ├─ GPTModel(TP2·PP2)  → train_one_step                              # 1F1B；QK norm、共享 embedding 的梯度先求和
# ├─ refit.py::clear_plan_cache()                                     # 新的一对模型：旧计划按并行大小缓存，形状不同也会被命中
# ├─ refit.py::swap_model_weights(policy, full, "gloo")               # TP 分片 + PP stage → 每个 rank 一份完整模型
# │  ├─ _build_or_get_plan → planner.py::build_local_reshard_plan    # all_gather_object over world：参数元数据；各 rank 自算计划
# │  └─ reshard_model_weights → execute_reshard_plan                 # gloo 点对点，按 partition_dim / stride 拼
# ├─ hf_convert.py::to_hf(full tensors)                                # 按 hf_mapping.ROWS：改名、拆、去 padding
# ├─ 仅 rank 0：Qwen3ForCausalLM(config).load_state_dict(..., strict=True) → logits；三种错误映射
# ├─ broadcast_object_list(HF state dict)                              # world：每个 rank 拿到同一份 "HF checkpoint"
# ├─ hf_convert.py::to_megatron → full.load_state_dict(strict=True)
# └─ refit.py::swap_model_weights(full, back(TP2), "gloo") → logits    # 反方向
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | tensor / batch 切分? | 改变训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `swap_model_weights`（聚齐） | TP2·PP2 的 policy、TP1·PP1 的空模型 | 无（写目标模型） | planner（`build_local_reshard_plan`）、copy service | world 上一次 `all_gather_object`（第一次建计划时）+ gloo 点对点 | 按 `partition_dim` / `partition_stride` 拼 | 只写目标模型 | `optimizer.step()` 之后 |
# | `to_hf` | 完整张量（全局层号） | HF 的 state dict | 无（纯张量） | 否 | 行重排、切分、去 padding | 否 | 同上 |
# | `load_state_dict(strict=True)` | HF state dict | 无 | 无（`torch.nn.Module`） | 否 | 否 | 写 HF 模型 | 推理引擎加载 |
# | `to_megatron` | HF state dict | 完整张量 | 无 | 否 | 反向重排、补 padding 行 | 否 | 从 HF checkpoint 开训 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 映射表是数据
#
# 映射表一个参数一行：Megatron 名（`{i}` 是全局层号）、它变成的 HF 名、变换、对付的难点、只在哪种模型上出现。转换函数只按这张表走，
# 表外的键直接报错；表覆盖两边的每个参数（折叠的单元格核对：表展开的名字集合分别等于两边的参数名）。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["Megatron", "Hugging Face", "变换", "难点", "只在"],
      [[r.megatron, "<br>".join(r.hf), r.transform, r.feature, r.when or "-"] for r in hf_mapping.ROWS])

# %% [markdown]
# 两边的 config 也要对上。eps（Megatron 缺省 1e-5，HF 1e-6）和词表大小两边的缺省值不同，要显式设成一致；`rope_theta` 两边都取 10000：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["Megatron（TransformerConfig / GPTModel）", "transformers config", "说明"], list(hf_mapping.CONFIG_ROWS))

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(hf_convert.to_hf, hf_convert.to_megatron, hf_convert.hf_config)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
listing(n25_hf.train_one_step, n25_hf.convert)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
for r in ranks[0]:
    megatron, hf = hf_mapping.covered_names(r["qk_norm"], r["tied"], r["layers"])
    print(r["model"], "Megatron 全覆盖:", megatron == set(r["megatron_names"]), " HF 全覆盖:", hf == set(r["hf_names"]))

# %% [markdown]
# ### padding 的词表
#
# Megatron 的词表向上取整到 `make_vocab_size_divisible_by · TP` 的倍数（[`vocab_size_with_padding`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tokenizers/utils/build_tokenizer.py#L124)）。
# 本篇取 16 × 2 = 32，60 → 64；Qwen3 的 151,936 在 128 × 8 下是 152,576：

# %%
pad_args = SimpleNamespace(make_vocab_size_divisible_by=16, tensor_model_parallel_size=2, rank=0)
qwen3_args = SimpleNamespace(make_vocab_size_divisible_by=128, tensor_model_parallel_size=8, rank=0)
print(vocab_size_with_padding(60, pad_args, logging_enabled=False),
      vocab_size_with_padding(151936, qwen3_args, logging_enabled=False))

# %% [markdown]
# 多出来的 embedding 行永远不会被查到，`output_layer` 多出的 logits 列要丢掉；HF 的 `vocab_size` 是 tokenizer 的 60。导出时切 `[:60]`，
# 导入时补零行：补零使 padding 列的 logits 恒为 0（下面 rank 表的最后一列）。
#
# ### 一次运行，两个模型
#
# 每个 rank 上：建 TP2·PP2 的 policy、训练一步、聚齐、转换、strict 加载、比 logits、三种错误映射、反方向。第二个模型（MHA、无 QK norm、
# 共享 embedding、fc2 恰好是方阵）专门让错误映射的 shape 碰巧对得上：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
n25_hf.proof_table(ranks[0])

# %% [markdown]
# 读法：
#
# - 两个方向的 max |Δlogit| 都小于 1e-6（表里四舍五入成 0.0000）：Megatron 在 TP2·PP2 上算的 logits、`transformers` 算的、
#   再装回 Megatron TP2 算的，是同一个模型的输出。
# - **QKV 不按 group 拆**（把前 64 行当 Q、接着 16 行当 K……）shape 完全对得上，加载照单全收，只有 logits 露馅。
# - **Q、K 对调**和 **fc2 转置**在第一个模型上 shape 不合（GQA 下 Q 比 K 多、fc2 是 `[32, 64]`），被 `load_state_dict` 的
#   size 检查拒绝；这个检查不看 `strict`（`strict` 只管多出的键和缺少的键），`strict=False` 也一样报错。第二个模型上它们
#   shape 恰好相同，加载成功，只有 logits 偏离。
# - 真实的 run 也在这一步出错：gpt-oss 的 weight 曾按错误的布局导出，由 NeMo RL PR #2249 和 Megatron-Bridge PR #3271 一起修好。
#   加载不报错不等于转换对了，要比 logits。

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("两个方向都 < 1e-6（两个模型）:", [r["forward"] < 1e-6 and r["reverse"] < 1e-6 for r in ranks[0]])
print("HF logits 的 max |logit|（两个模型）:", [round(float(r["hf_out_max"]), 4) for r in ranks[0]])
try:  # the size check does not depend on strict
    torch.nn.Linear(4, 2).load_state_dict({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}, strict=False)
except RuntimeError as e:
    print("strict=False 时 shape 不合:", type(e).__name__, "size mismatch" in str(e))

# %% [markdown]
# 每个 rank 看到的结果一致（每个 rank 都拿到同一份 HF state dict，反方向在每个 rank 上各算一次）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["rank", "TP 群", "反方向 max |Δ| < 1e-5（两个模型）", "padding 列的 logits（补零行）"],
      [[r, x[0]["tp_group"], [m["reverse"] < n25_hf.ATOL for m in x], [m["padding_logits"] for m in x]]
       for r, x in enumerate(ranks)])

# %% [markdown]
# ## Tensor / Process Group 语义
#
# 训练端的 TP 群是 [0, 1] 和 [2, 3]，PP 群是 [0, 2] 和 [1, 3]。聚齐之前，一个参数在 policy 里是本 rank 的一份（rank 0：stage 0、
# TP 第 0 份；column-parallel 的按行切，row-parallel 的 `linear_fc2` 按列切），聚齐之后是完整张量：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
Table(["参数（rank 0 本地）", "policy TP2·PP2 上的 shape", "聚齐后"],
      [[n, list(s), list(qwen["full_shapes"].get(n, ()))] for n, s in qwen["local_shapes"].items()
       if n.startswith(("embedding", "decoder.layers.0.self_attention.linear_qkv", "decoder.layers.0.mlp"))])

# %% [markdown]
# 完整张量再到 HF，Qwen3 这个模型的每一行（第 0 层代表每一层），表和图是同一批行：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
n25_hf.mapping_table(qwen)

# %% tags=["hide-input"] jupyter={"source_hidden": true}
hf_pictures.draw_mapping(
    n25_hf.mapping_rows(qwen), title="Megatron → Hugging Face：Qwen3 形状的全部映射（第 0 层代表每一层）",
    desc="左边是聚齐后的 Megatron 张量，右边是 Qwen3ForCausalLM 的 state_dict 键，箭头上写变换。")

# %% [markdown]
# ## 机制解释
#
# ### SwiGLU 的 `linear_fc1`：stride 2
#
# `linear_fc1` 的输出是 `[gate; up]`，SwiGLU 把它对半切，`silu(gate) * up`。TP 切的不是整块的前一半、后一半，而是 gate 和 up
# **各自**切成 TP 份，每个 rank 存 `[gate_r; up_r]`——Megatron 给这个参数 `partition_stride=2`（[mlp.py:210](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/mlp.py#L210)）。
# 所以把 TP 分片首尾相接得到的是 `[gate_0; up_0; gate_1; up_1]`，不是完整的 `[gate; up]`。`swap_model_weights` 的 planner 读 stride，
# 聚齐的结果是对的；自己 all-gather 时要先把每片再对半分：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("首尾相接 == 聚齐后的 fc1:", qwen["fc1_naive"], " 每片对半分再拼（stride 2）:", qwen["fc1_strided"])

# %% [markdown]
# `linear_qkv` 没有这个问题：它的行按 query group 排，TP 按整数个 group 切，首尾相接就是原来的顺序（[笔记 11](../11_transformer_layer/)）。
# 拆成 HF 的三块要在**聚齐之后**按 group 做，与 `get_query_key_value_tensors` 在 forward 里拆的方式相同。
#
# ### RoPE：不需要置换
#
# Megatron 缺省 `rotary_interleaved=False`：`_rotate_half` 把最后一维切成前一半 `x1`、后一半 `x2`，返回 `cat(-x2, x1)`；HF 的
# `rotate_half` 是同一句。频率也一样：`RotaryEmbedding` 的 `inv_freq = 1 / base^(2i/d)`，频率表是 `cat(freqs, freqs)`。所以同一个
# head 的 Q、K 行序在两边是同一个意思，不需要像一些 Llama 转换脚本那样对 Q、K 做 permute。只有 `rotary_interleaved=True`
# （相邻两维配对）时，才要把每个 head 的维度按"偶数位在前、奇数位在后"重排：

# %%
x = torch.randn(2, 1, 3, 8)  # [s, b, heads, head_dim]
perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])  # even dims first, then odd
rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
print("inv_freq == 1 / 10000^(2i/8):", torch.allclose(rope.inv_freq, 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8)))
print("Megatron 非 interleaved == HF rotate_half:",
      torch.equal(rope_utils._rotate_half(x, False), modeling_llama.rotate_half(x)))
print("interleaved == HF rotate_half:", torch.equal(rope_utils._rotate_half(x, True), modeling_llama.rotate_half(x)))
print("interleaved 先按 perm 重排 == HF rotate_half（重排后）:",
      torch.equal(rope_utils._rotate_half(x, True)[..., perm], modeling_llama.rotate_half(x[..., perm])))

# %% [markdown]
# ### QK layernorm 在 TP 下：梯度要求和
#
# 每个 TP rank 只有一半的 head，却各有一份完整的 `q_layernorm.weight`。反传时每份只拿到本 rank 那些 head 的梯度，两份不同；
# 不在 TP 群里求和，优化器一步之后两个 rank 上的 weight 就分叉了，聚齐时只能取其中一份，导出的 logits 和训练端对不上。
# Megatron 在 `finalize_model_grads` 里按名字挑出 `q_layernorm` / `k_layernorm` 做这次求和
# （[finalize_model_grads.py:452](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L452)）；本篇没用 DDP 包装，
# 所以训练那一步照样做一遍（共享 embedding 的两份梯度同理）：

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print("求和前，两个 TP rank 上 QK norm 的梯度不同:", qwen["qk_grads_differ"], " 训练一步的 loss:",
      [x[0]["losses"] for x in ranks if x[0]["losses"]][0])

# %% [markdown]
# ### 共享的 embedding
#
# 共享 embedding（`tie_word_embeddings=True`）时，HF 的 state dict 里仍有 `lm_head.weight` 这个键（与 `embed_tokens` 是同一个张量），
# `strict=True` 要求它在场；Megatron 在 PP=1 时根本没有 `output_layer.weight`，PP>1 时最后一个 stage 上那份只是副本
# （[`shared_embedding_or_output_weight`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/models/common/language_module/language_module.py#L339)）。
# 映射表为共享的情形单列一行：`lm_head.weight` 来自 `embedding.word_embeddings.weight`；反方向两行都指向 embedding，`to_megatron` 要求两者相等。
#
# ### 对照 Megatron Bridge
#
# 名字一一对应的项、QKV 按 group 拆、gate/up 的布局、vocab padding 的去与补、共享 embedding 只取一份，都和 Megatron Bridge 的 Qwen3
# 映射一致；不同在于 Bridge 用 TE spec 的 layernorm 名字、每个映射自己做 TP gather，而且它选 `make_vocab_size_divisible_by`
# 时常常根本不补 padding（表折叠在下面）。
#
# <details><summary>逐项对照 Megatron Bridge</summary>
#
# 读的是 [NVIDIA-NeMo/Megatron-Bridge 提交 `067f987`](https://github.com/NVIDIA-NeMo/Megatron-Bridge/tree/067f987df03b8355b03192d88d70f1709fedf51a)
# 的 Qwen3 映射（[qwen3_bridge.py 第 70 行起](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/qwen/qwen3_bridge.py#L70)）：
#
# | 项 | Megatron Bridge | 本篇 |
# |---|---|---|
# | 名字一一对应的项（embedding、`o_proj`、`down_proj`、`q_norm` / `k_norm`、`model.norm`、`lm_head`） | 一个 `AutoMapping` 一项 | 一致 |
# | 两个 layernorm | TE spec 的名字：`linear_qkv.layer_norm_weight` → `input_layernorm`，`linear_fc1.layer_norm_weight` → `post_attention_layernorm` | local spec 的名字：`input_layernorm`、`pre_mlp_layernorm`（同一个 weight，模块不同） |
# | QKV | [`QKVMapping`](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/param_mapping.py#L1654)：按 `[q1..qn, k, v]` 每组交错，[`split_qkv_weights`](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/param_mapping.py#L3258) 按 group reshape 再切 | 一致（`qkv_layout.split_qkv`） |
# | gate / up | [`GatedMLPMapping`](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/param_mapping.py#L2591)：导入时 gate、up 各自切 TP 份，再拼 `[gate_r; up_r]` | 一致的布局；我们在完整张量上对半切，TP 的 stride 交给 `swap_model_weights` |
# | TP / PP 聚齐 | 每个映射自己做 TP gather，按 PP rank 广播 | 一次 `swap_model_weights` 到 TP1·PP1 的模型 |
# | vocab padding | 导出时去掉多余行（[model_bridge.py 第 1048 行 `_truncate_vocab_padding`](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/model_bridge.py#L1048)），导入时补零行（[param_mapping.py 第 1005 行](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/param_mapping.py#L1005)） | 一致 |
# | `make_vocab_size_divisible_by` | 取能整除 HF 词表的最大 2 的幂（≤ 128，[第 1716 行](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/model_bridge.py#L1716)），所以常常根本不补 | 我们固定 16，故意补出 4 行来检验 |
# | 共享 embedding | 共享时过滤掉 `output_layer`（[第 1913 行](https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/models/conversion/model_bridge.py#L1913)） | 一致：`lm_head.weight` 只来自 embedding |
# | MTP 层 | 有映射（`mtp.layers.0...`） | 没有（本篇的模型没有 MTP） |
#
# </details>

# %% [markdown]
# ## 与训练主链路的关系
#
# 转换不碰训练状态：它读的是 `optimizer.step()` 之后的参数（这里是 SGD 之后），写的是另一份模型。RL 每一轮都要做一次
# Megatron → HF（送进 rollout 引擎）；从一个 HF checkpoint 开始训练（SFT、RL 的起点）时做一次 HF → Megatron。
#
# 转换默认每个 rank 上复制的参数是同一份，这由训练那一步的梯度同步保证。本篇的设置（不开 SP、DP=1）里，要紧的只有
# `finalize_model_grads` 的两次求和：QK norm 在 TP 群里、共享 embedding 在首尾两个 stage 之间。一般情况下还有两种：DP 群的梯度
# 同步（[finalize_model_grads.py:626](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/finalize_model_grads.py#L626)，少了它各 DP 副本分叉），
# 以及开 SP 时所有标了 `sequence_parallel` 的复制参数（norm 等）在 TP 群的求和（同一个条件，第 452 行）。

# %% [markdown]
# ## 与基础知识的连接
#
# - **`state_dict` 与 `strict`**：`load_state_dict` 按键名匹配；`strict=True` 时多一个或少一个键都报错，shape 不合则不论 strict 都报错。
#   但 shape 相同的错位（行序错了、方阵转置了）它发现不了，只有数值检查能发现。
# - **行重排是置换矩阵**：按 group 拆 QKV 是对 `linear_qkv` 的行做一次置换，换回来是它的逆，数值逐位不变。
# - **RoPE 的两种配对**：把 `head_dim` 维分成 `d/2` 对做二维旋转；"前一半配后一半"和"相邻两位配对"只差一个固定的维度置换。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# 1. **重切计划按并行大小缓存。** `swap_model_weights` 的计划存在模块级字典里，键只有两边的并行大小
#    （[refit.py::_build_plan_cache_key](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/resharding/refit.py#L86)），不看参数形状。同一进程里换一对形状不同、
#    并行大小相同的模型，会拿到旧计划，在 gloo 的收发里对不上（实验里见到的是 `unmatched local ops`）；所以实验每换一对模型先调
#    `clear_plan_cache()`。
# 2. **复制参数的梯度不求和，导出的就不是训练的那个模型**：上面 QK norm 的运行。
# 3. **MTP 与共享 embedding。** 开了 MTP 的模型在 PP>1 时 embedding 同时出现在多个 stage 上（NeMo RL #2471 的 refit 失败）；
#    Megatron Bridge 的 `_should_skip_mtp_duplicate_embedding_export` 处理的正是这种重复。本篇的模型没有 MTP。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 这里只证明了 CPU 路径：fp32、gloo、local spec。GPU 上 Transformer Engine spec 的名字不同（layernorm 融进了 `linear_qkv` /
#   `linear_fc1`，见 Megatron Bridge 的表），bf16 下 logits 只能在更宽的容差内相等。
# - MoE、bias、GeLU 的模型不在映射表里，实验的尺寸检查一行拒绝。
#
# </details>

# %% [markdown]
# ## 自测
#
# **1. Qwen3-8B（32 个 query head、8 个 query group、head_dim 128、hidden 4096）：`linear_qkv.weight` 的完整 shape 是多少？拆成 HF
# 的三块各是多少？**
#
# <details><summary>答案</summary>
#
# `(32 + 2 × 8) × 128 = 6144` 行：`[6144, 4096]`。`q_proj` `[4096, 4096]`，`k_proj`、`v_proj` 各 `[1024, 4096]`。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
fused = torch.empty((32 + 2 * 8) * 128, 1)  # one column is enough for the row split
print([(32 + 2 * 8) * 128, 4096], [[t.shape[0], 4096] for t in hf_convert.qkv_layout.split_qkv(fused, 32, 8)])

# %% [markdown]
# **2. 词表 151936，`make_vocab_size_divisible_by=128`，TP=8：Megatron 的 padded vocab 是多少？导出时丢几行？**
#
# <details><summary>答案</summary>
#
# 倍数是 128 × 8 = 1024，151936 / 1024 = 148.375，向上取整 149 × 1024 = 152576，丢 640 行。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
padded = hf_convert.padded_vocab(151936, tp=8, divisible_by=128)
print(padded, padded - 151936)

# %% [markdown]
# **3. 本篇第一个模型（GQA、fc2 为 `[32, 64]`）上，三种错误映射各是怎样暴露的？换成 MHA、fc2 方阵呢？**
#
# <details><summary>答案</summary>
#
# GQA：Q、K 对调和 fc2 转置被 `load_state_dict` 的 size 检查拒绝（这一检查不看 `strict`）；QKV 不按 group 拆加载成功，logits 差 0.84。MHA、方阵：三种都加载成功，
# 只有 logits 能发现（差 0.0063、0.354、0.0216）。
#
# </details>

# %% tags=["answer"] jupyter={"source_hidden": true, "outputs_hidden": true}
Table(["模型", "错误映射", "加载", "max |Δlogit|"],
      [[r["model"], name, status, None if d is None else round(d, 4)]
       for r in ranks[0] for name, (status, d) in r["wrong"].items()])

# %% [markdown]
# ## 30-second answer
#
# A rollout engine loads Hugging Face names, so each refit also renames and reorders: Megatron's
# `linear_qkv` is split per query group into `q_proj`, `k_proj`, `v_proj`; the SwiGLU `linear_fc1`
# (stored `[gate_r; up_r]` per TP rank, stride 2) becomes `gate_proj` and `up_proj`; the padded
# vocabulary rows are dropped; norms are renamed; RoPE needs no permutation because Megatron's
# non-interleaved rotation is HF's `rotate_half`. Gathered from TP2·PP2 by `swap_model_weights` and
# strict-loaded into `Qwen3ForCausalLM`, the logits agree within 1e-6, and back again; a wrong
# mapping is refused by the shape check or moves the logits by 0.006 to 0.8.
