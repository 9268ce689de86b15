"""Megatron ``GPTModel`` full tensors <-> a Hugging Face ``transformers`` causal LM (note 25).

A refit to an inference engine ends here: the engine loads a Hugging Face-style state dict
(``model.layers.3.self_attn.q_proj.weight`` ...), while Megatron holds ``linear_qkv`` interleaved
by query group, a fused ``[gate; up]`` ``linear_fc1`` and a vocabulary padded to a multiple of
``make_vocab_size_divisible_by * TP``. :func:`to_hf` applies the rows of
:mod:`snippets.rl.hf_mapping` (rename, split, drop padding) to *full* (already gathered) Megatron
tensors; :func:`to_megatron` is its inverse. Both refuse a key no row covers, so a weight that the
other side would never receive cannot slip through.

:func:`hf_config` builds the matching ``Qwen3Config`` (QK norm) or ``LlamaConfig`` from our
:class:`snippets.models.presets.Dims` -- from a config only, no download.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snippets.rl import qkv_layout
from snippets.rl.hf_mapping import WRONG, expand, rows_for

RMS_EPS = 1e-6  # Hugging Face's default rms_norm_eps; Megatron's layernorm_epsilon is set to it
ROPE_THETA = 10000.0  # GPTModel's rotary_base default, given to HF as rope_theta


def padded_vocab(vocab: int, tp: int, divisible_by: int) -> int:
    """The vocabulary Megatron builds: ``vocab`` rounded up to a multiple of ``divisible_by * tp``
    (what ``megatron/training``'s ``_vocab_size_with_padding`` does)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def merge_strided(shards: list, stride: int) -> torch.Tensor:
    """The full tensor from TP shards of a parameter with ``partition_stride``: each shard holds
    ``stride`` pieces (SwiGLU's ``[gate_r; up_r]``), so the whole is every shard's first piece, then
    every shard's second piece -- not the shards end to end."""
    pieces = [torch.chunk(shard, stride) for shard in shards]
    return torch.cat([p[j] for j in range(stride) for p in pieces])


@dataclass(frozen=True)
class Shape:
    """What the transforms need to know about one model."""

    heads: int
    groups: int
    vocab: int  # Hugging Face's (the tokenizer's)
    padded: int  # Megatron's
    layers: int
    qk_norm: bool
    tied: bool

    @classmethod
    def of(cls, dims, padded: int, tied: bool) -> "Shape":
        return cls(dims.heads, dims.query_groups, dims.vocab, padded, dims.layers, dims.qk_norm, tied)


# ----------------------------------------------------------------------------- transforms
# each: forward(tensor, shape) -> tuple of HF tensors; inverse(tuple, shape) -> Megatron tensor


def _unpad(t, s):
    return (t[: s.vocab],)


def _pad(parts, s):
    (t,) = parts
    return torch.cat([t, t.new_zeros(s.padded - s.vocab, *t.shape[1:])])


def _contiguous_qkv(t, s):  # wrong: treats the rows as [all Q; all K; all V]
    head_dim = t.shape[0] // (s.heads + 2 * s.groups)
    return tuple(torch.split(t, [s.heads * head_dim, s.groups * head_dim, s.groups * head_dim]))


def _qk_swapped(t, s):  # wrong: Q rows go to k_proj and K rows to q_proj
    q, k, v = qkv_layout.split_qkv(t, s.heads, s.groups)
    return k, q, v


TRANSFORMS = {
    "copy": (lambda t, s: (t,), lambda parts, s: parts[0]),
    "unpad_vocab": (_unpad, _pad),
    "split_qkv": (
        lambda t, s: qkv_layout.split_qkv(t, s.heads, s.groups),
        lambda parts, s: qkv_layout.fuse_qkv(*parts, s.groups),
    ),
    "split_gate_up": (lambda t, s: tuple(torch.chunk(t, 2)), lambda parts, s: torch.cat(parts)),
    # the wrong ones (forward only)
    "split_qkv_contiguous": (_contiguous_qkv, None),
    "split_qkv_qk_swapped": (_qk_swapped, None),
    "transpose": (lambda t, s: (t.t().contiguous(),), None),
}


def to_hf(state: dict, shape: Shape, wrong: str | None = None) -> dict:
    """Full Megatron tensors (global layer numbers) -> a Hugging Face state dict.

    ``wrong`` names an entry of :data:`snippets.rl.hf_mapping.WRONG`: that row uses the wrong
    transform instead (the note's counter-examples).
    """
    broken_row, broken_transform = WRONG[wrong] if wrong else (None, None)
    out, used = {}, set()
    for row in rows_for(shape.qk_norm, shape.tied):
        forward, _ = TRANSFORMS[broken_transform if row.megatron == broken_row else row.transform]
        for i, name in enumerate(expand(row.megatron, shape.layers)):
            parts = forward(state[name], shape)
            for hf_name, part in zip(row.hf, parts, strict=True):
                out[hf_name.format(i=i)] = part
            used.add(name)
    left = sorted(set(state) - used)
    if left:
        raise KeyError(f"no Hugging Face name for {left}")
    return out


def to_megatron(state: dict, shape: Shape) -> dict:
    """The inverse of :func:`to_hf`: a Hugging Face state dict -> full Megatron tensors.

    With tied embeddings two rows lead to ``embedding.word_embeddings.weight``; they must agree.
    """
    out, used = {}, set()
    for row in rows_for(shape.qk_norm, shape.tied):
        _, inverse = TRANSFORMS[row.transform]
        for i, name in enumerate(expand(row.megatron, shape.layers)):
            keys = [hf_name.format(i=i) for hf_name in row.hf]
            tensor = inverse(tuple(state[k] for k in keys), shape)
            if name in out and not torch.equal(out[name], tensor):
                raise ValueError(f"{keys} and the other source of {name} differ (tied weights that are not)")
            out[name] = tensor
            used.update(keys)
    left = sorted(set(state) - used)
    if left:
        raise KeyError(f"no Megatron name for {left}")
    return out


# ----------------------------------------------------------------------------- the HF model


def hf_config(dims, tied: bool):
    """``Qwen3Config`` for a model with QK norm, else ``LlamaConfig``; the same sizes as ``dims``."""
    from transformers import LlamaConfig, Qwen3Config

    cls = Qwen3Config if dims.qk_norm else LlamaConfig
    return cls(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        intermediate_size=dims.ffn,
        num_hidden_layers=dims.layers,
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.query_groups,
        head_dim=dims.kv_channels,
        max_position_embeddings=dims.seq,
        rms_norm_eps=RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=tied,
        attention_bias=False,
        hidden_act="silu",
        attn_implementation="eager",
    )


def hf_model(dims, tied: bool):
    """The ``transformers`` causal LM for ``dims`` (``Qwen3ForCausalLM`` or ``LlamaForCausalLM``),
    randomly initialized: its weights are about to be overwritten."""
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    cls = Qwen3ForCausalLM if dims.qk_norm else LlamaForCausalLM
    return cls(hf_config(dims, tied)).eval()


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


def load_hf(model, state: dict) -> str:
    """``load_state_dict(strict=True)``; returns ``"ok"`` or the first line of the error (a shape
    mismatch is how a wrong mapping of non-square tensors shows itself)."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if "size mismatch" in line]
        return lines[0].split(": copying")[0] if lines else str(error).splitlines()[0]
    return "ok"
