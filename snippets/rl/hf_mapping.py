"""The Megatron <-> Hugging Face ``transformers`` name mapping, as data (note 25).

One :class:`Row` per parameter of a Megatron ``GPTModel`` built with the local spec, RMSNorm,
SwiGLU, RoPE and no linear bias (a Qwen3- or Llama-style model): the Megatron name, the Hugging
Face name(s) it becomes and the transform that turns one into the other. ``{i}`` stands for the
global layer number. :data:`CONFIG_ROWS` does the same for the config fields that must agree, and
:data:`WRONG` lists the deliberately wrong mappings the note tries.

The transforms themselves are functions in :mod:`snippets.rl.hf_convert`; this module stays
importable without torch, so the table can be read (and tested for coverage) on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    megatron: str  # Megatron parameter name; {i} = global layer number
    hf: tuple[str, ...]  # the Hugging Face state-dict key(s) it becomes
    transform: str  # a key of hf_convert.TRANSFORMS
    feature: str  # which difficulty this line is about (the note's table shows it)
    when: str = ""  # "" always; "qk_norm", "untied" or "tied": only for such a model


L = "model.layers.{i}."
ROWS: tuple[Row, ...] = (
    Row("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "unpad_vocab", "padded vocab"),
    Row("decoder.layers.{i}.input_layernorm.weight", (L + "input_layernorm.weight",), "copy", "RMSNorm"),
    Row(
        "decoder.layers.{i}.self_attention.linear_qkv.weight",
        (L + "self_attn.q_proj.weight", L + "self_attn.k_proj.weight", L + "self_attn.v_proj.weight"),
        "split_qkv",
        "GQA",
    ),
    Row(
        "decoder.layers.{i}.self_attention.q_layernorm.weight",
        (L + "self_attn.q_norm.weight",),
        "copy",
        "QK layernorm",
        "qk_norm",
    ),
    Row(
        "decoder.layers.{i}.self_attention.k_layernorm.weight",
        (L + "self_attn.k_norm.weight",),
        "copy",
        "QK layernorm",
        "qk_norm",
    ),
    Row(
        "decoder.layers.{i}.self_attention.linear_proj.weight", (L + "self_attn.o_proj.weight",), "copy", "-"
    ),
    Row(
        "decoder.layers.{i}.pre_mlp_layernorm.weight",
        (L + "post_attention_layernorm.weight",),
        "copy",
        "RMSNorm",
    ),
    Row(
        "decoder.layers.{i}.mlp.linear_fc1.weight",
        (L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"),
        "split_gate_up",
        "SwiGLU",
    ),
    Row("decoder.layers.{i}.mlp.linear_fc2.weight", (L + "mlp.down_proj.weight",), "copy", "-"),
    Row("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", "RMSNorm"),
    Row("output_layer.weight", ("lm_head.weight",), "unpad_vocab", "untied output", "untied"),
    # tied: Megatron has no output_layer.weight at PP=1 (the last stage's copy at PP>1 is not exported)
    Row("embedding.word_embeddings.weight", ("lm_head.weight",), "unpad_vocab", "tied output", "tied"),
)

TRANSFORM_TEXT = {
    "copy": "原样",
    "unpad_vocab": "去掉 padding 行 [:vocab]（反向：补零行到 padded vocab）",
    "split_qkv": "按 query group 拆成 Q、K、V（反向：按 group 交错拼回）",
    "split_gate_up": "聚齐时按 stride 2 还原成 [gate; up]，再对半切（反向：拼回）",
}

CONFIG_ROWS: tuple[tuple[str, str, str], ...] = (
    ("num_attention_heads", "num_attention_heads", "相同"),
    ("num_query_groups", "num_key_value_heads", "GQA：小于 head 数"),
    ("kv_channels", "head_dim", "相同"),
    ("ffn_hidden_size", "intermediate_size", "相同（fc1 是它的两倍宽）"),
    ("layernorm_epsilon", "rms_norm_eps", "要设成同一个值（Megatron 缺省 1e-5，HF 1e-6）"),
    ("rotary_base（GPTModel 参数）", "rope_parameters['rope_theta']", "相同"),
    ("rotary_interleaved=False", "rotate_half", "同一种旋转：不需要置换"),
    ("vocab_size（已 padding）", "vocab_size（tokenizer 的）", "Megatron 的更大"),
    ("share_embeddings_and_output_weights", "tie_word_embeddings", "相同"),
)

WRONG: dict[str, tuple[str, str]] = {
    # name -> (the Megatron row it breaks, the wrong transform used instead)
    "Q、K 对调": ("decoder.layers.{i}.self_attention.linear_qkv.weight", "split_qkv_qk_swapped"),
    "QKV 不按 group 拆（直接按行切）": (
        "decoder.layers.{i}.self_attention.linear_qkv.weight",
        "split_qkv_contiguous",
    ),
    "fc2 转置": ("decoder.layers.{i}.mlp.linear_fc2.weight", "transpose"),
}


def applies(row: Row, qk_norm: bool, tied: bool) -> bool:
    return row.when == "" or (row.when == "qk_norm" and qk_norm) or row.when == ("tied" if tied else "untied")


def rows_for(qk_norm: bool, tied: bool) -> list[Row]:
    """The rows of one model."""
    return [r for r in ROWS if applies(r, qk_norm, tied)]


def expand(name: str, layers: int) -> list[str]:
    return [name.format(i=i) for i in range(layers)] if "{i}" in name else [name]


def covered_names(qk_norm: bool, tied: bool, layers: int) -> tuple[set[str], set[str]]:
    """Every Megatron and every Hugging Face name the rows of one model produce."""
    megatron, hf = set(), set()
    for row in rows_for(qk_norm, tied):
        megatron.update(expand(row.megatron, layers))
        for name in row.hf:
            hf.update(expand(name, layers))
    return megatron, hf
