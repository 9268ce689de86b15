"""Megatron's fused ``linear_qkv`` versus separate Q, K, V (as Hugging Face and vLLM store them).

Megatron keeps one weight for the three projections of an attention layer and orders its rows
**by query group**: with ``num_heads`` query heads sharing ``num_query_groups`` key/value heads,
each group holds its ``num_heads / num_query_groups`` query heads, then its one key head, then its
one value head::

    group 0: q0 q1 k0 v0 | group 1: q2 q3 k1 v1 | ...        (each entry = head_dim rows)

Hugging Face (``q_proj`` / ``k_proj`` / ``v_proj``) and vLLM keep three tensors, each in plain head
order. Going from one to the other is a reorder of rows plus a rename; no value changes, so the
round trip is exact. The same holds for the bias (a 1-D tensor with the same row order).

Why Megatron interleaves: tensor parallelism cuts ``linear_qkv`` into contiguous row blocks, and
with the rows grouped this way each TP rank's block is a set of whole query groups -- exactly the
Q, K and V heads that rank's attention needs, with no extra communication.

Used by note 22; tested in ``tests/ranks/test_qkv_layout.py`` against a real Megatron ``SelfAttention``.
"""

from __future__ import annotations

import re

import torch


def heads_per_group(num_heads: int, num_query_groups: int) -> int:
    if num_heads % num_query_groups:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_query_groups {num_query_groups}")
    return num_heads // num_query_groups


def fused_row_labels(num_heads: int, num_query_groups: int) -> list[str]:
    """The head stored in each ``head_dim``-row block of ``linear_qkv``, in Megatron's order."""
    per_group = heads_per_group(num_heads, num_query_groups)
    labels = []
    for g in range(num_query_groups):
        labels += [f"q{g * per_group + i}" for i in range(per_group)] + [f"k{g}", f"v{g}"]
    return labels


def split_qkv(fused: torch.Tensor, num_heads: int, num_query_groups: int):
    """Megatron ``linear_qkv`` (weight ``[rows, hidden]`` or bias ``[rows]``) -> ``(q, k, v)``.

    ``q`` has ``num_heads * head_dim`` rows, ``k`` and ``v`` ``num_query_groups * head_dim`` each,
    all in plain head order (Hugging Face's ``q_proj``, ``k_proj``, ``v_proj``).
    """
    per_group = heads_per_group(num_heads, num_query_groups)
    blocks = per_group + 2  # q heads, one k, one v
    rows = fused.shape[0]
    if rows % (num_query_groups * blocks):
        raise ValueError(f"{rows} rows do not split into {num_query_groups} groups of {blocks} heads")
    head_dim = rows // (num_query_groups * blocks)
    # [groups, (q heads + k + v) * head_dim, ...]: one row of this view per query group.
    grouped = fused.reshape(num_query_groups, blocks * head_dim, *fused.shape[1:])
    q, k, v = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=1)
    flat = (-1, *fused.shape[1:])
    return q.reshape(flat), k.reshape(flat), v.reshape(flat)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_query_groups: int) -> torch.Tensor:
    """The inverse of :func:`split_qkv`: three head-ordered tensors -> Megatron's grouped rows."""
    if k.shape != v.shape or k.shape[0] % num_query_groups or q.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            f"do not fit {num_query_groups} query groups"
        )
    rest = q.shape[1:]
    parts = [t.reshape(num_query_groups, -1, *rest) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


# ----------------------------------------------------------------------------- names

# Megatron (local spec) name -> Hugging Face (Llama / Qwen2 style) name, inside one layer.
# A tuple means one Megatron tensor becomes several: linear_qkv is split by query group (and so
# reordered); a gated (SwiGLU) linear_fc1 holds [gate; up] and is cut in half. The rest is renamed.
# (With the Transformer Engine spec the norms live inside the linears, e.g.
# "self_attention.linear_qkv.layer_norm_weight"; this table is for the local spec.)
LAYER_NAMES = {
    "input_layernorm": "input_layernorm",
    "self_attention.linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.linear_proj": "self_attn.o_proj",
    "pre_mlp_layernorm": "post_attention_layernorm",
    "mlp.linear_fc1": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.linear_fc2": "mlp.down_proj",
}
_MEGATRON_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def megatron_to_hf(state: dict, num_heads: int, num_query_groups: int) -> dict:
    """Rename (and for ``linear_qkv`` split) the per-layer tensors of a Megatron state dict.

    Keys outside :data:`LAYER_NAMES` raise ``KeyError``: a silent pass-through would hide a
    weight the inference engine never receives.
    """
    out = {}
    for key, tensor in state.items():
        m = _MEGATRON_KEY.match(key)
        if not m or m.group(2) not in LAYER_NAMES:
            raise KeyError(f"no Hugging Face name for {key}")
        layer, module, kind = m.groups()
        target = LAYER_NAMES[module]
        if isinstance(target, tuple):
            parts = (
                split_qkv(tensor, num_heads, num_query_groups)
                if len(target) == 3
                else torch.chunk(tensor, 2, dim=0)
            )
            for name, part in zip(target, parts):
                out[f"model.layers.{layer}.{name}.{kind}"] = part
        else:
            out[f"model.layers.{layer}.{target}.{kind}"] = tensor
    return out


def hf_to_megatron(state: dict, num_query_groups: int) -> dict:
    """The inverse of :func:`megatron_to_hf`."""
    back = {v: k for k, v in LAYER_NAMES.items() if isinstance(v, str)}
    q_name, k_name, v_name = LAYER_NAMES["self_attention.linear_qkv"]
    gate_name, up_name = LAYER_NAMES["mlp.linear_fc1"]
    out = {}
    for key, tensor in state.items():
        m = _HF_KEY.match(key)
        if not m:
            raise KeyError(f"no Megatron name for {key}")
        layer, module, kind = m.groups()
        if module == q_name:
            k = state[f"model.layers.{layer}.{k_name}.{kind}"]
            v = state[f"model.layers.{layer}.{v_name}.{kind}"]
            out[f"decoder.layers.{layer}.self_attention.linear_qkv.{kind}"] = fuse_qkv(
                tensor, k, v, num_query_groups
            )
        elif module == gate_name:
            up = state[f"model.layers.{layer}.{up_name}.{kind}"]
            out[f"decoder.layers.{layer}.mlp.linear_fc1.{kind}"] = torch.cat([tensor, up])
        elif module in (k_name, v_name, up_name):
            continue  # consumed with q_proj / gate_proj
        elif module in back:
            out[f"decoder.layers.{layer}.{back[module]}.{kind}"] = tensor
        else:
            raise KeyError(f"no Megatron name for {key}")
    return out


# ----------------------------------------------------------------------------- attention


def hf_attention(
    x: torch.Tensor,
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    num_heads: int,
    num_kv_heads: int,
    q_bias=None,
    k_bias=None,
    v_bias=None,
    o_bias=None,
):
    """Causal grouped-query attention written the way Hugging Face's Llama computes it.

    ``x`` is ``[batch, seq, hidden]``; query head ``i`` reads key/value head
    ``i // (num_heads / num_kv_heads)`` (``repeat_kv``). No rotary embedding: Megatron and HF
    rotate Q and K the same way, and leaving it out keeps the comparison about the layout.
    """
    b, s, _ = x.shape
    q = torch.nn.functional.linear(x, q_proj, q_bias).view(b, s, num_heads, -1).transpose(1, 2)
    k = torch.nn.functional.linear(x, k_proj, k_bias).view(b, s, num_kv_heads, -1).transpose(1, 2)
    v = torch.nn.functional.linear(x, v_proj, v_bias).view(b, s, num_kv_heads, -1).transpose(1, 2)
    repeat = num_heads // num_kv_heads
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(b, s, -1)
    return torch.nn.functional.linear(out, o_proj, o_bias)
