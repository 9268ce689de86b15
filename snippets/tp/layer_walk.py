"""Walk one Megatron ``TransformerLayer``: what each submodule holds on a TP rank, how many
parameters that is, which collective each submodule issues, and how ``linear_qkv`` packs Q, K, V.

Note 11 builds the real layer (``get_gpt_layer_local_spec``) and reads it with these helpers:

* :func:`weight_rows` lists every parameter of a layer on this rank with its split, read from the
  attributes Megatron itself sets (``tensor_model_parallel``, ``partition_dim``,
  ``partition_stride``), so it works on a layer built on the ``meta`` device (no memory);
* :func:`param_counts` is the same count written as formulas of a ``TransformerConfig``
  (``tests/ranks/test_layer_walk.py`` checks it against real layers);
* :func:`collectives_by_submodule` attributes the collectives that :mod:`snippets.record.recorder`
  records to the submodule that issued them, forward *and* backward;
* :func:`qkv_rows` is a readable version of how ``SelfAttention.get_query_key_value_tensors``
  splits the fused ``linear_qkv`` output per query group (``q q k v | q q k v | ...``);
* :func:`tp_shard` cuts a TP=1 tensor into one rank's shard the way
  ``_initialize_affine_weight_cpu`` does, to compare a TP=2 layer with a TP=1 layer.
"""

from __future__ import annotations

import contextlib

import torch

WALK = (
    # (submodule path,               what it is in the layer)
    ("input_layernorm", "归一化，attention 之前"),
    ("self_attention.linear_qkv", "Q、K、V 三个投影合成一个列并行 linear"),
    ("self_attention.q_layernorm", "每个 Q head 上的 RMSNorm（Qwen3 的 QK norm）"),
    ("self_attention.k_layernorm", "每个 K head 上的 RMSNorm"),
    ("self_attention.core_attention", "softmax(QKᵀ/√d)·V，只算本卡的 head"),
    ("self_attention.linear_proj", "attention 输出投影，行并行"),
    ("self_attn_bda", "bias + dropout + residual"),
    ("pre_mlp_layernorm", "归一化，MLP 之前"),
    ("mlp.linear_fc1", "gate 和 up 合成一个列并行 linear"),
    ("mlp.activation_func", "SwiGLU：silu(gate) * up"),
    ("mlp.linear_fc2", "down 投影，行并行"),
    ("mlp_bda", "bias + dropout + residual"),
)
"""The submodules of one layer in forward order, as ``TransformerLayer.forward`` calls them."""


# ------------------------------------------------------------------ weights and counts


def split_of(param) -> str:
    """How a parameter is split over TP ranks, from the attributes Megatron sets on it."""
    if not getattr(param, "tensor_model_parallel", False):
        return "复制"
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    kind = "列并行" if dim == 0 else "行并行"  # dim 0 = output rows, dim 1 = input columns
    return f"{kind} dim {dim}" + (f" stride {stride}" if stride != 1 else "")


def weight_rows(layer) -> list[dict]:
    """One dict per parameter of ``layer`` on this rank: owner class, shape, split, count."""
    owners = {
        f"{name}.{p}" if name else p: type(mod).__name__
        for name, mod in layer.named_modules()
        for p, _ in mod.named_parameters(recurse=False)
    }
    rows = []
    for name, param in layer.named_parameters():
        rows.append(
            dict(
                name=name,
                owner=owners[name],
                shape=list(param.shape),
                split=split_of(param),
                numel=param.numel(),
                sharded=bool(getattr(param, "tensor_model_parallel", False)),
            )
        )
    return rows


def param_counts(config, tp: int = 1) -> dict[str, int]:
    """Parameters of one dense layer built from ``config``, per rank at TP=``tp``, by formula.

    ``tp=1`` gives the whole layer. Sharded weights (the four linears and the biases of the
    column-parallel ones) divide by ``tp``; norms and row-parallel biases are replicated.
    """
    h, d = config.hidden_size, config.kv_channels
    heads, groups = config.num_attention_heads, config.num_query_groups or config.num_attention_heads
    ffn = config.ffn_hidden_size
    fc1_out = ffn * (2 if config.gated_linear_unit else 1)
    qkv_out = (heads + 2 * groups) * d
    norm = h * (1 if config.normalization == "RMSNorm" else 2)  # LayerNorm has a bias too
    qk_norm = d * (1 if config.normalization == "RMSNorm" else 2) if config.qk_layernorm else 0
    bias = config.add_bias_linear
    qkv_bias = bias or config.add_qkv_bias
    return {
        "input_layernorm": norm,
        "self_attention.linear_qkv": (h * qkv_out + (qkv_out if qkv_bias else 0)) // tp,
        "self_attention.q_layernorm": qk_norm,
        "self_attention.k_layernorm": qk_norm,
        "self_attention.linear_proj": heads * d * h // tp + (h if bias else 0),
        "pre_mlp_layernorm": norm,
        "mlp.linear_fc1": (h * fc1_out + (fc1_out if bias else 0)) // tp,
        "mlp.linear_fc2": ffn * h // tp + (h if bias else 0),
    }


def counts_by_submodule(rows: list[dict]) -> dict[str, int]:
    """Sum :func:`weight_rows` per submodule (the parameter name without ``.weight``/``.bias``)."""
    out: dict[str, int] = {}
    for r in rows:
        owner = r["name"].rsplit(".", 1)[0]
        out[owner] = out.get(owner, 0) + r["numel"]
    return out


def millions(n: int) -> str:
    """Parameter counts the way seed 000 writes them: whole millions, ``42M``."""
    return f"{n / 1e6:.0f}M"


def kind_of(layer, path: str) -> str:
    """The class of a submodule, or the function's name where the layer holds a function
    (``self_attn_bda`` is the ``get_bias_dropout_add`` builder, ``mlp.activation_func`` is
    ``config.activation_func``)."""
    obj = layer
    for part in path.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    return getattr(obj, "__name__", type(obj).__name__)


# ------------------------------------------------------------------ who issues which collective


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


@contextlib.contextmanager
def collectives_by_submodule(layer, calls: list, names):
    """Attribute each collective appended to ``calls`` (a :func:`snippets.record.recorder.record` list)
    to the submodule of ``layer`` that issued it.

    Forward: the calls made between a submodule's forward pre-hook and its forward hook.
    Backward: the calls made after the gradient of the submodule's output arrived and before the
    gradient of its input left (tensor hooks on both), i.e. inside its backward. ``names`` may
    nest (``self_attention`` and ``self_attention.linear_qkv``): a call then belongs to both, and
    :func:`owner_of` / :func:`only_in` tell the innermost one.

    Yields a dict ``name -> {"forward": [...], "backward": [...]}`` filled when the block ends.
    """
    spans: dict[tuple[str, str], list[int]] = {}  # (name, phase) -> [start, end] in calls
    handles = []

    def mark(name, phase, which):
        spans.setdefault((name, phase), [None, None])[which] = len(calls)

    for name in names:
        module = layer.get_submodule(name)

        def pre_hook(mod, args, name=name):
            mark(name, "forward", 0)
            x = _first_tensor(args)
            if x is not None and x.requires_grad:
                x.register_hook(lambda grad, name=name: mark(name, "backward", 1))

        def post_hook(mod, args, out, name=name):
            mark(name, "forward", 1)
            y = _first_tensor(out)
            if y is not None and y.requires_grad:
                y.register_hook(lambda grad, name=name: mark(name, "backward", 0))

        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))
    result = {name: {"forward": [], "backward": []} for name in names}
    try:
        yield result
    finally:
        for h in handles:
            h.remove()
        for (name, phase), (start, end) in spans.items():
            if start is not None and end is not None:
                result[name][phase] = calls[start:end]


def owner_of(by_submodule: dict) -> dict[int, str]:
    """``id(call) -> submodule`` for every attributed call, the innermost traced submodule when
    traced names nest (to label a communication table)."""
    owner = {}
    for name in sorted(by_submodule, key=lambda n: n.count(".")):  # outer first, inner overrides
        for calls in by_submodule[name].values():
            owner.update({id(c): name for c in calls})
    return owner


def only_in(by_submodule: dict, name: str, phase: str) -> list:
    """The calls of ``name`` in ``phase`` that none of its traced submodules issued."""
    owner = owner_of(by_submodule)
    return [c for c in by_submodule[name][phase] if owner[id(c)] == name]


def unattributed(calls: list, by_submodule: dict) -> list:
    """The recorded calls that no traced submodule issued (empty when the trace is complete)."""
    seen = {id(c) for spans in by_submodule.values() for cs in spans.values() for c in cs}
    return [c for c in calls if id(c) not in seen]


SHORT_API = {
    "all_reduce": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
}
"""The collective's usual name, for narrow table cells (the full API name is in the records)."""


def apis(calls) -> str:
    """``all-reduce``, ``all-gather ×2``... for a table cell; ``—`` for none."""
    if not calls:
        return "—"
    names = [SHORT_API.get(c.api, c.api) for c in calls]
    return ", ".join(f"{a} ×{names.count(a)}" if names.count(a) > 1 else a for a in dict.fromkeys(names))


def short(name: str) -> str:
    """``self_attention.linear_qkv`` -> ``linear_qkv``; a parameter keeps its owner
    (``self_attention.linear_qkv.weight`` -> ``linear_qkv.weight``). Unique within one layer."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1] in ("weight", "bias") and len(parts) > 1 else parts[-1]


def record_table(calls, meaning=None, owner=None):
    """The roadmap's communication record, narrow enough for the site: phase, submodule (when
    ``owner`` maps ``id(call)`` to one), API, group, shape before → after, issuer, meaning
    (``meaning(call)`` or a dict keyed by ``(api, where)``)."""
    from snippets.record.tables import Table

    def what(c):
        if callable(meaning):
            return meaning(c)
        return (meaning or {}).get((c.api, c.where), "")

    headers = (
        ["phase"]
        + (["子模块"] if owner is not None else [])
        + ["API", "group", "shape before → after", "issued by", "meaning"]
    )
    rows = []
    for c in calls:
        row = [c.phase] + ([short(owner.get(id(c), "?"))] if owner is not None else [])
        row += [
            c.api,
            f"{c.group} {list(c.ranks)}",
            f"{c.before} → {c.after}",
            c.where.replace("tensor_parallel/", ""),
            what(c),
        ]
        rows.append(row)
    return Table(headers, rows)


# ------------------------------------------------------------------ fused QKV layout


def qkv_rows(num_heads: int, num_groups: int, head_dim: int, tp: int, rank: int, local: bool = False) -> dict:
    """Which rows of the *full* (TP=1) ``linear_qkv`` weight this rank's Q, K, V heads use.

    Megatron stores the rows group by group: for each query group, its ``num_heads/num_groups``
    query heads, then its key head, then its value head (``q0 q1 k0 v0 | q2 q3 k1 v1 | ...``).
    Column parallelism gives each rank ``num_groups/tp`` whole groups. Returns
    ``{"q": [rows of q head 0, ...], "k": [...], "v": [...]}``, head by head: global row indices,
    or with ``local=True`` indices into this rank's own shard of the weight.
    Assumes ``num_groups >= tp`` (otherwise Megatron all-gathers the output first; see note 11).
    """
    per_group = num_heads // num_groups
    groups_here = num_groups // tp
    block = (per_group + 2) * head_dim  # rows of one group
    first = 0 if local else rank * groups_here * block  # this rank's first row
    out = {"q": [], "k": [], "v": []}
    for g in range(groups_here):
        start = first + g * block
        for i in range(per_group):
            out["q"].append(list(range(start + i * head_dim, start + (i + 1) * head_dim)))
        k0 = start + per_group * head_dim
        out["k"].append(list(range(k0, k0 + head_dim)))
        out["v"].append(list(range(k0 + head_dim, k0 + 2 * head_dim)))
    return out


def layout(rows: dict, first_q: int = 0, first_kv: int = 0) -> str:
    """The order of heads along the weight's rows, e.g. ``q0 q1 k0 v0 | q2 q3 k1 v1``.

    ``rows`` is :func:`qkv_rows`' shape (or the same read back from Megatron's split): heads are
    sorted by their first row and numbered from ``first_q`` / ``first_kv`` (a rank's first global
    query / key-value head); a value head closes a query group.
    """
    start = {"q": first_q, "k": first_kv, "v": first_kv}
    heads = sorted((r[0], f"{kind}{start[kind] + i}") for kind in "qkv" for i, r in enumerate(rows[kind]))
    groups, current = [], []
    for _, label in heads:
        current.append(label)
        if label.startswith("v"):
            groups.append(" ".join(current))
            current = []
    return " | ".join(groups + ([" ".join(current)] if current else []))


# ------------------------------------------------------------------ comparing with TP=1


def tp_shard(full: torch.Tensor, param, rank: int, tp: int) -> torch.Tensor:
    """This rank's piece of a TP=1 tensor shaped like ``param``'s full tensor.

    The rule of ``_initialize_affine_weight_cpu``: cut ``partition_dim`` into ``tp * stride``
    equal chunks and keep chunks ``rank, rank + tp, ...`` (stride 2 for SwiGLU's fc1 keeps one
    chunk of gate and one of up). Replicated parameters come back whole.
    """
    if not getattr(param, "tensor_model_parallel", False):
        return full
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    chunks = torch.chunk(full, tp * stride, dim=dim)
    return torch.cat(chunks[rank::tp], dim=dim)


__all__ = [
    "WALK",
    "apis",
    "collectives_by_submodule",
    "counts_by_submodule",
    "kind_of",
    "layout",
    "millions",
    "only_in",
    "owner_of",
    "param_counts",
    "qkv_rows",
    "record_table",
    "short",
    "split_of",
    "tp_shard",
    "unattributed",
    "weight_rows",
]
