"""Model sizes an experiment can run at: the notes' own tiny sizes, or a real model's.

An experiment (see :mod:`snippets.experiments`) takes its sizes as a :class:`Dims`, so the same
function runs in a note's cell at the note's tiny sizes and under ``torchrun`` at a real model's.
Presets:

* ``tiny`` -- exactly the sizes the note uses. Notes differ (note 11's layer has hidden 32, note
  13's pipeline GPT hidden 16), so ``tiny`` is not one entry here: each experiment declares its own
  and :func:`resolve` picks it;
* ``qwen3-8b`` -- Qwen3-8B as its Hugging Face ``config.json`` states it (hidden 4096, 32 heads in
  8 query groups of head dim 128, SwiGLU ffn 12288, vocab 151936, 36 layers, RMSNorm with QK norm,
  RoPE, no biases, untied output layer); seed 000 walks one of its layers at TP=2;
* ``dense-8b`` / ``dense-70b`` -- a generic dense 8B and 70B with Llama-3's published sizes
  (hidden 4096 / 8192, 32 / 64 heads, 8 query groups, ffn 14336 / 28672, vocab 128256, 32 / 80
  layers): the two models behind seed 000's RL transfer figures ("8B bf16 = 16 GB", "70B = 140 GB",
  :mod:`snippets.rl.refit_cost`).

The real presets run at ``seq 2048``, ``micro-batch 1``, ``8`` micro-batches: chosen here, not
taken from the models' cards. The experiments use Megatron's local spec, whose unfused attention
keeps a ``[b, heads, s, s]`` tensor per layer, so at 4096 tokens Qwen3-8B's pipeline stages no
longer fit an 80 GB GPU in fp32 (:mod:`snippets.models.memory_estimate` says so before starting). Every
size can be overridden on the command line (``--seq 4096`` ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Dims:
    """A model's sizes and the few architecture switches that change tensor shapes.

    Names follow Megatron's ``TransformerConfig`` where one exists: ``heads`` =
    ``num_attention_heads``, ``query_groups`` = ``num_query_groups`` (= key/value heads),
    ``kv_channels`` = head dim, ``ffn`` = ``ffn_hidden_size`` (before SwiGLU doubles ``linear_fc1``).
    """

    name: str
    hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    ffn: int
    vocab: int
    layers: int
    seq: int
    micro_batch_size: int
    microbatches: int
    swiglu: bool = False  # gated_linear_unit=True with silu: linear_fc1 is 2 x ffn wide
    rmsnorm: bool = False  # normalization="RMSNorm" (one weight) instead of LayerNorm (two)
    qk_norm: bool = False  # qk_layernorm=True: a norm on every query and key head
    bias: bool = True  # add_bias_linear
    rope: bool = False  # position_embedding_type="rope" (else a learned position table)

    def __post_init__(self):
        for field in (
            "hidden",
            "heads",
            "query_groups",
            "kv_channels",
            "ffn",
            "vocab",
            "layers",
            "seq",
            "micro_batch_size",
            "microbatches",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if self.heads % self.query_groups:
            raise ValueError(f"heads {self.heads} is not a multiple of query_groups {self.query_groups}")

    def replace(self, **changes) -> "Dims":
        """A copy with some sizes changed (the name says it was changed: ``tiny+seq``)."""
        changes = {k: v for k, v in changes.items() if v is not None and getattr(self, k) != v}
        if not changes:
            return self
        return dataclasses.replace(self, name=self.name + "+" + "+".join(changes), **changes)

    def describe(self, unused: tuple[str, ...] = ()) -> str:
        """One line with the sizes (but the ``unused`` fields), for the runner's header and errors."""
        arch = ", ".join(
            flag
            for flag, on in (
                ("SwiGLU", self.swiglu),
                ("RMSNorm", self.rmsnorm),
                ("QK norm", self.qk_norm),
                ("bias", self.bias),
                ("RoPE", self.rope),
            )
            if on
        )
        parts = [
            (("hidden",), f"hidden {self.hidden}"),
            (
                ("heads", "query_groups", "kv_channels"),
                f"heads {self.heads} in {self.query_groups} query groups x {self.kv_channels}",
            ),
            (("ffn",), f"ffn {self.ffn}"),
            (("vocab",), f"vocab {self.vocab}"),
            (("layers",), f"layers {self.layers}"),
            (("seq",), f"seq {self.seq}"),
            (("micro_batch_size",), f"micro-batch {self.micro_batch_size}"),
            (("microbatches",), f"{self.microbatches} micro-batches"),
        ]
        text = ", ".join(t for fields, t in parts if not set(fields) <= set(unused))
        return (text or "no model") + (f"; {arch}" if arch and text else "")

    def transformer_config_kwargs(self) -> dict:
        """The ``TransformerConfig`` arguments these sizes fix (no parallel sizes, no dtype)."""
        kwargs = dict(
            num_layers=self.layers,
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            num_query_groups=self.query_groups,
            kv_channels=self.kv_channels,
            ffn_hidden_size=self.ffn,
            add_bias_linear=self.bias,
            gated_linear_unit=self.swiglu,
            qk_layernorm=self.qk_norm,
            normalization="RMSNorm" if self.rmsnorm else "LayerNorm",
        )
        if self.swiglu:
            import torch.nn.functional as F

            kwargs["activation_func"] = F.silu
        return kwargs


_REAL_SHAPE = dict(seq=2048, micro_batch_size=1, microbatches=8)
_LLAMA_STYLE = dict(swiglu=True, rmsnorm=True, qk_norm=False, bias=False, rope=True)

PRESETS: dict[str, Dims] = {
    "qwen3-8b": Dims(
        "qwen3-8b",
        hidden=4096,
        heads=32,
        query_groups=8,
        kv_channels=128,
        ffn=12288,
        vocab=151936,
        layers=36,
        **_REAL_SHAPE,
        **{**_LLAMA_STYLE, "qk_norm": True},
    ),
    "dense-8b": Dims(
        "dense-8b",
        hidden=4096,
        heads=32,
        query_groups=8,
        kv_channels=128,
        ffn=14336,
        vocab=128256,
        layers=32,
        **_REAL_SHAPE,
        **_LLAMA_STYLE,
    ),
    "dense-70b": Dims(
        "dense-70b",
        hidden=8192,
        heads=64,
        query_groups=8,
        kv_channels=128,
        ffn=28672,
        vocab=128256,
        layers=80,
        **_REAL_SHAPE,
        **_LLAMA_STYLE,
    ),
}
"""Real models. ``tiny`` is per experiment (:attr:`snippets.experiments.Experiment.tiny`)."""

NAMES = ("tiny", *PRESETS)

OVERRIDES = (
    "hidden",
    "heads",
    "query_groups",
    "kv_channels",
    "ffn",
    "vocab",
    "layers",
    "seq",
    "micro_batch_size",
    "microbatches",
)
"""The sizes the command line may override, by their :class:`Dims` field names."""


def resolve(name: str, tiny: Dims, **overrides) -> Dims:
    """The preset ``name`` (``tiny`` = the experiment's own ``tiny``), with ``overrides`` applied.

    Changing ``heads`` of a preset keeps its head dim; ``None`` overrides are ignored.
    """
    if name == "tiny":
        base = tiny
    elif name in PRESETS:
        base = PRESETS[name]
    else:
        raise ValueError(f"unknown dims preset {name!r}; known: {', '.join(NAMES)}")
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise ValueError(f"cannot override {sorted(unknown)}; sizes: {', '.join(OVERRIDES)}")
    return base.replace(**overrides)


def parameter_count(m: Dims) -> int:
    """Parameters of the whole GPT model (``GPTModel``, local spec, untied output layer).

    Per layer: the two norms, ``linear_qkv`` (``heads + 2 * query_groups`` heads of
    ``kv_channels``), ``linear_proj``, ``linear_fc1`` (doubled by SwiGLU), ``linear_fc2``, the QK
    norms, biases where ``bias``; then the word embedding, a learned position table unless RoPE,
    the final norm and the output layer. Qwen3-8B gives 8.19e9, the number Qwen publishes (8.2B).
    """
    final_norm, output_layer = _norm(m) * m.hidden, m.vocab * m.hidden
    return m.layers * layer_parameter_count(m) + embedding_parameter_count(m) + final_norm + output_layer


def layer_parameter_count(m: Dims) -> int:
    """Parameters of one transformer layer at TP=1 (the layer note 11 walks)."""
    h, d, norm = m.hidden, m.kv_channels, _norm(m)
    qkv_out = (m.heads + 2 * m.query_groups) * d
    fc1_out = m.ffn * (2 if m.swiglu else 1)
    return (
        2 * norm * h
        + h * qkv_out
        + m.heads * d * h
        + h * fc1_out
        + m.ffn * h
        + (2 * norm * d if m.qk_norm else 0)
        + ((qkv_out + h + fc1_out + h) if m.bias else 0)
    )


def embedding_parameter_count(m: Dims) -> int:
    """The word embedding, plus the learned position table when there is no RoPE."""
    return m.vocab * m.hidden + (0 if m.rope else m.seq * m.hidden)


def _norm(m: Dims) -> int:
    """Weights per normalized element: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return 1 if m.rmsnorm else 2


__all__ = [
    "Dims",
    "NAMES",
    "OVERRIDES",
    "PRESETS",
    "embedding_parameter_count",
    "layer_parameter_count",
    "parameter_count",
    "resolve",
]
