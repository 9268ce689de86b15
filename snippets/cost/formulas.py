"""The cost of one training step, from Megatron's own formulas and a few small ones of ours.

Note 26 and the calculator page (``docs/explorers/calculator.md``, whose ``calculator.js`` is a port
of this module, proved equal by ``tests/site/test_calculator.py``) both stand on this file.

**Megatron's formulas, called, not re-implemented** (megatron-core 0.19.0's wheel):

* ``megatron/training/theoretical_memory_usage.py`` -- ``compute_weight_and_optimizer_memory``
  (bytes of weights, gradients and Adam state on the most loaded GPU: 18 bytes per parameter, or
  ``6 + 12/DP`` with the distributed optimizer), ``compute_activation_memory`` (Korthikanti et al.
  2022, arXiv 2205.05198, Table 2: ``34 s b h / t`` per layer with SP + selective recomputation, here
  written ``s b h (18 + 4 ffn/h) / t``) and ``compute_activation_memory_without_sp``
  (``s b h (10 + 24/t)`` per layer, Table 2's "TP + selective recomputation" row);
  ``report_theoretical_memory`` picks the first only under SP *and* selective recomputation;
* ``megatron/training/training.py`` -- ``num_floating_point_operations(args, batch_size)``: the
  model FLOPs of one global batch (3 GEMMs per weight -- forward, dgrad, wgrad -- times 2 per
  multiply-add, plus causal attention).

:func:`megatron_args` builds the ``argparse.Namespace`` with exactly the fields they read. Where an
input leaves what a formula covers, the function here returns a :class:`Figure` whose ``value`` is
``None`` and whose ``why`` says why -- never a number the formula does not stand behind.

**Ours** (documented below, each naming the note whose recorded run it stands on): the pipeline
bubble, the bytes each parallel group moves per step, and whether a group stays inside one node;
and the memory budget a configuration is judged against (:data:`MEMORY_BUDGET`, in GiB: 80 GiB
less 10 %), where a configuration with no memory number is "unknown" (:func:`memory_fits`).

Hardware constants (:data:`HARDWARE`) name their source documents.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from snippets.ranks.parallel_dims import ParallelDims

# ---------------------------------------------------------------------------------------- hardware

HARDWARE = {
    "peak_bf16_flops": 989e12,
    "nvlink_bytes_per_s": 450e9,
    "ib_bytes_per_s": 50e9,
    "hbm_bytes": 80 * 2**30,
}
"""Nominal figures for an H100 / H200 SXM node.

* ``peak_bf16_flops`` -- 989 TFLOPS dense BF16 Tensor Core (the "1,979 TFLOPS" on the data sheet is
  with 2:4 sparsity): NVIDIA H100 Tensor Core GPU data sheet, and the H200 data sheet (same figure).
* ``nvlink_bytes_per_s`` -- NVLink 4 gives each H100/H200 SXM GPU 900 GB/s *total* (both directions,
  18 links x 50 GB/s), so 450 GB/s each way: NVIDIA H100 data sheet / NVLink page.
* ``ib_bytes_per_s`` -- one InfiniBand NDR port is 400 Gb/s = 50 GB/s each way; a DGX H100 has one
  ConnectX-7 port per GPU for the compute fabric (NVIDIA DGX H100 user guide).

* ``hbm_bytes`` -- the "80 GB" of an H100 SXM (and of an 80 GB H200 / H100 card) is HBM counted in
  binary units: 80 GiB = 85.9e9 bytes (``nvidia-smi`` reports ``memory.total`` 81,559 MiB on an
  H100 80GB HBM3, the rest held by the driver). Every memory figure of note 26 and the calculator
  is in GiB (2**30 bytes), against :data:`MEMORY_BUDGET`.

A rank's bytes sent divided by these gives a lower bound on the time a collective takes: real NCCL
bandwidth is lower (protocol overhead, topology), which is why the page calls it "at nominal".
"""

BYTES_BF16 = 2
BYTES_FP32 = 4
GIB = 2**30

MEMORY_HEADROOM = 0.10
"""The share of :data:`HARDWARE` ``hbm_bytes`` the formulas' count must leave free: Megatron's
counts leave out the CUDA context, NCCL's buffers, the allocator's fragmentation and every
temporary that is not kept for backward. Our choice, stated once (the calculator uses the same)."""

MEMORY_BUDGET = HARDWARE["hbm_bytes"] * (1 - MEMORY_HEADROOM)
"""Bytes a configuration may use on one GPU: 80 GiB less 10 % = 72 GiB (77.3e9 bytes)."""

MAX_SIZE = 2**31
"""The largest size any field may take (sizes, parallel degrees, batch, world): larger ones are
refused in one line, so no formula is asked about an absurd model (and no page hangs on one)."""

MAX_LAYERS = 2**20
"""The largest ``layers``: Megatron's weight and FLOPs functions build a list of ``num_layers``
entries (``theoretical_memory_usage.py`` lines 31-32 and 46, ``training.py`` line 566)."""

# ------------------------------------------------------------------------------------------ models


@dataclass(frozen=True)
class Model:
    """The sizes Megatron's formulas read (names follow :class:`snippets.models.presets.Dims`).

    ``untied``: the output layer has its own weight (``untie_embeddings_and_output_weights``).
    MoE: ``num_experts`` routed experts of width ``moe_ffn`` in every ``moe_layer_freq``-th layer,
    ``topk`` per token, plus a shared expert of width ``shared_expert_ffn`` (0 = none).
    """

    name: str
    hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    ffn: int
    vocab: int
    layers: int
    swiglu: bool = False
    rmsnorm: bool = False
    qk_norm: bool = False
    bias: bool = True
    untied: bool = True
    num_experts: int | None = None
    moe_ffn: int | None = None
    topk: int | None = None
    shared_expert_ffn: int = 0
    moe_layer_freq: int = 1

    @property
    def moe(self) -> bool:
        return self.num_experts is not None

    @property
    def moe_layers(self) -> int:
        """Layers with experts: Megatron's ``moe_layer_freq`` pattern ``i % freq == 0`` over
        ``range(layers)``, counted in closed form (``ceil(layers / freq)``); 0 for a dense model."""
        return -(-self.layers // self.moe_layer_freq) if self.moe else 0

    @classmethod
    def from_dims(cls, dims, untied: bool = True, **moe) -> Model:
        """A :class:`Model` from a :class:`snippets.models.presets.Dims` (an experiment's sizes)."""
        return cls(
            name=dims.name,
            hidden=dims.hidden,
            heads=dims.heads,
            query_groups=dims.query_groups,
            kv_channels=dims.kv_channels,
            ffn=dims.ffn,
            vocab=dims.vocab,
            layers=dims.layers,
            swiglu=dims.swiglu,
            rmsnorm=dims.rmsnorm,
            qk_norm=dims.qk_norm,
            bias=dims.bias,
            untied=untied,
            **moe,
        )

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _models() -> dict[str, Model]:
    from snippets.models.presets import PRESETS, Dims

    # The tiny GPT of notes 06, 13-15 (snippets.models.tiny_gpt / the "train-step" experiment):
    # hidden 16, 2 heads of 8, ffn 32, vocab 32, 4 layers, LayerNorm, GELU, no biases.
    tiny = Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32, layers=4,
                seq=8, micro_batch_size=2, microbatches=4, bias=False)  # fmt: skip
    out = {"tiny": Model.from_dims(tiny)}
    for name, dims in PRESETS.items():
        out[name] = Model.from_dims(dims)
    # Qwen3-30B-A3B as its Hugging Face config.json states it
    # (https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json): hidden_size 2048,
    # num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_hidden_layers 48,
    # num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768, vocab_size 151936,
    # decoder_sparse_step 1 (every layer MoE), tie_word_embeddings false, RMSNorm, QK norm, no bias.
    # intermediate_size 6144 is the dense MLP width no layer uses.
    out["qwen3-30b-a3b"] = Model(
        "qwen3-30b-a3b",
        hidden=2048,
        heads=32,
        query_groups=4,
        kv_channels=128,
        ffn=6144,
        vocab=151936,
        layers=48,
        swiglu=True,
        rmsnorm=True,
        qk_norm=True,
        bias=False,
        num_experts=128,
        moe_ffn=768,
        topk=8,
    )
    return out


MODELS: dict[str, Model] = _models()
"""``tiny`` (the notes' tiny GPT), ``qwen3-8b``, ``dense-8b``, ``dense-70b`` (from
:data:`snippets.models.presets.PRESETS`) and ``qwen3-30b-a3b`` (MoE)."""

# ---------------------------------------------------------------------------------------- configs

RECOMPUTE = ("none", "selective", "full")
MODEL_SIZES = ("hidden", "heads", "query_groups", "kv_channels", "ffn", "vocab", "layers")


@dataclass(frozen=True)
class Config:
    """A cluster and a parallel configuration; ``dp`` is what is left: ``world / (tp*pp*cp)``.

    ``vocab_multiple``: Megatron pads the vocabulary to a multiple of
    ``make_vocab_size_divisible_by (128) * tp``; ``1`` keeps it as it is (the tiny runs build
    ``GPTModel`` directly, unpadded). ``vp=1`` becomes ``None``, as Megatron-LM makes it.
    ``overlap_p2p_comm``: Megatron-LM's default is on (``--no-overlap-p2p-communication`` turns
    it off); without it the interleaved schedule needs ``pp > 2``.
    """

    gpus_per_node: int = 8
    nodes: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vp: int | None = None
    micro_batch_size: int = 1
    num_microbatches: int = 8
    seq: int = 2048
    sp: bool = False
    recompute: str = "none"
    distributed_optimizer: bool = False
    grad_reduce_in_fp32: bool = True
    vocab_multiple: int = 128
    overlap_p2p_comm: bool = True

    def __post_init__(self):
        # Megatron-LM turns a virtual pipeline size of 1 into None (no interleaving):
        # megatron/training/arguments.py validate_args, lines 917-918 and 944-945.
        if self.vp == 1 and not isinstance(self.vp, bool):
            object.__setattr__(self, "vp", None)

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def edp(self) -> int:
        """Expert data parallel size: ``world / (etp * ep * pp)`` with ``etp = tp``."""
        return self.world // (self.tp * self.ep * self.pp)

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.num_microbatches * self.dp

    def replace(self, **changes) -> Config:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _size_problem(name: str, value) -> str | None:
    """A size that is not a positive int, or is over :data:`MAX_SIZE` (:data:`MAX_LAYERS`)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"{name} must be a positive int, got {value!r}"
    limit = MAX_LAYERS if name == "layers" else MAX_SIZE
    if value > limit:
        return f"{name} must be at most {limit}, got {value}"
    return None


def problems(model: Model, config: Config) -> list[str]:
    """Every reason ``config`` cannot run ``model``, one sentence each (empty = it can).

    The parallel-size rules are :class:`snippets.ranks.parallel_dims.ParallelDims`' own (called:
    same rules, same words); then the ones a model's sizes add, and three Megatron raises on:
    MoE with TP but no SP, interleaving at ``pp == 2`` without ``overlap_p2p_comm``, interleaving
    with fewer micro-batches than pipeline stages. Sizes above :data:`MAX_SIZE` are refused.
    """
    c, m = config, model
    out = []
    for name in MODEL_SIZES + (("num_experts", "moe_ffn", "topk") if m.moe else ()):
        found = _size_problem(name, getattr(m, name))
        if found:
            out.append(found)
    if out:
        return out
    if m.heads % m.query_groups:
        out.append(f"heads {m.heads} is not divisible by query_groups {m.query_groups}")
    if m.moe and m.topk > m.num_experts:
        out.append(f"topk {m.topk} is more than num_experts {m.num_experts}")
    if out:
        return out
    for name in ("gpus_per_node", "nodes", "micro_batch_size", "num_microbatches", "seq", "vocab_multiple"):
        found = _size_problem(name, getattr(c, name))
        if found:
            out.append(found)
    if out:
        return out
    if c.recompute not in RECOMPUTE:
        out.append(f"recompute must be one of {', '.join(RECOMPUTE)}, got {c.recompute!r}")
    for name in ("tp", "pp", "cp", "ep", "vp"):  # ParallelDims refuses what is not a positive int
        value = getattr(c, name)
        if isinstance(value, int) and value > MAX_SIZE:
            return out + [f"{name} must be at most {MAX_SIZE}, got {value}"]
    if c.world > MAX_SIZE:
        return out + [f"world size gpus_per_node*nodes must be at most {MAX_SIZE}, got {c.world}"]
    try:
        dims = ParallelDims(world=c.world, tp=c.tp, pp=c.pp, vp=c.vp, cp=c.cp, ep=c.ep, sp=c.sp)
    except ValueError as e:
        return out + [str(e)]
    out += dims.problems()
    chunks = c.pp * (c.vp or 1)
    if m.layers % chunks:
        label = f"pp*vp = {c.pp}*{c.vp}" if c.vp else "pp"
        out.append(f"layers {m.layers} is not divisible by {label} = {chunks}")
    if m.heads % c.tp:
        out.append(f"heads {m.heads} is not divisible by tp {c.tp}")
    if m.query_groups % c.tp:
        out.append(f"query_groups {m.query_groups} is not divisible by tp {c.tp}")
    if c.ep > 1 and not m.moe:
        out.append(f"ep {c.ep} needs a model with experts; {m.name} has none")
    if m.moe and m.num_experts % c.ep:
        out.append(f"num_experts {m.num_experts} is not divisible by ep {c.ep}")
    if m.moe and c.tp > 1 and not c.sp:
        out.append(
            f"MoE with tp {c.tp} needs sequence parallel: Megatron's MoE layer raises in training "
            "without it (moe_layer.py:629)"
        )
    if c.vp and c.pp == 2 and not c.overlap_p2p_comm:
        out.append(
            f"interleaving (vp {c.vp}) at pp 2 needs overlap_p2p_comm: Megatron-LM asserts pp > 2 "
            "without it (arguments.py:971)"
        )
    if c.vp and c.pp >= 2 and c.num_microbatches < c.pp:
        out.append(
            f"interleaving (vp {c.vp}) needs num_microbatches >= pp: {c.num_microbatches} < {c.pp} "
            "makes the interleaved schedule raise ValueError (schedules.py:1133)"
        )
    if c.cp > 1 and c.seq % (2 * c.cp):
        out.append(f"seq {c.seq} is not divisible by 2*cp = {2 * c.cp} (the load-balanced CP split)")
    if c.sp and (c.seq // c.cp) % c.tp:
        out.append(f"seq/cp = {c.seq // c.cp} is not divisible by tp {c.tp} (sequence parallel)")
    return out


# ------------------------------------------------------------------------------- Megatron's inputs


def padded_vocab(model: Model, config: Config) -> int:
    """Megatron's padded vocabulary: ``vocab_size_with_padding`` (called)."""
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    args = argparse.Namespace(
        make_vocab_size_divisible_by=config.vocab_multiple,
        tensor_model_parallel_size=config.tp,
        rank=1,  # anything but 0: no log line
    )
    return vocab_size_with_padding(model.vocab, args, logging_enabled=False)


def megatron_args(model: Model, config: Config) -> argparse.Namespace:
    """The ``args`` Megatron's formulas read, with these sizes: exactly the fields the three
    functions read (a test records them), plus ``sequence_parallel`` and ``recompute_granularity``,
    which ``report_theoretical_memory`` reads to pick the activation function."""
    m, c = model, config
    return argparse.Namespace(
        # model
        hidden_size=m.hidden,
        num_attention_heads=m.heads,
        group_query_attention=m.query_groups != m.heads,
        num_query_groups=m.query_groups,
        kv_channels=m.kv_channels,
        ffn_hidden_size=m.ffn,
        num_layers=m.layers,
        padded_vocab_size=padded_vocab(m, c),
        swiglu=m.swiglu,
        normalization="RMSNorm" if m.rmsnorm else "LayerNorm",
        add_bias_linear=m.bias,
        untie_embeddings_and_output_weights=m.untied,
        multi_latent_attention=False,
        attention_output_gate=False,
        experimental_attention_variant=None,
        hybrid_layer_pattern=None,
        mtp_num_layers=None,
        # MoE
        num_experts=m.num_experts,
        moe_ffn_hidden_size=m.moe_ffn,
        moe_router_topk=m.topk,
        moe_shared_expert_intermediate_size=m.shared_expert_ffn or None,
        moe_shared_expert_gate=False,
        moe_layer_freq=m.moe_layer_freq,
        moe_latent_size=None,
        # parallel sizes
        world_size=c.world,
        tensor_model_parallel_size=c.tp,
        pipeline_model_parallel_size=c.pp,
        virtual_pipeline_model_parallel_size=c.vp,
        expert_model_parallel_size=c.ep,
        expert_tensor_parallel_size=c.tp,
        data_parallel_size=c.dp,
        sequence_parallel=c.sp,
        recompute_granularity=None if c.recompute == "none" else c.recompute,
        use_distributed_optimizer=c.distributed_optimizer,
        # batch
        seq_length=c.seq,
        micro_batch_size=c.micro_batch_size,
    )


# ---------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Figure:
    """A number, or ``None`` with ``why`` (one sentence). ``note``: a caveat beside a number."""

    value: float | None
    why: str | None = None
    note: str | None = None

    def as_dict(self) -> dict:
        return {"value": self.value, "why": self.why, "note": self.note}


def _refused(model: Model, config: Config) -> Figure | None:
    found = problems(model, config)
    return Figure(None, found[0]) if found else None


# ---------------------------------------------------------------------------------------- memory


def weight_and_optimizer_bytes(model: Model, config: Config) -> Figure:
    """Megatron's ``compute_weight_and_optimizer_memory`` (called): bytes on the most loaded GPU.

    It counts bf16 weights, fp32 gradients (``main_grad``), fp32 master weights and two fp32 Adam
    moments: 2+4+4+4+4 = 18 bytes per parameter, or ``6 + 12/DP`` when the distributed optimizer
    shards the last three over DP. Refused where that count is not the run's: gradients reduced in
    bf16 (no ``grad_reduce_in_fp32``: 16 / ``4 + 12/DP``; Megatron-LM turns it on for bf16 unless
    ``--grad-reduce-in-bf16``, ``megatron/training/arguments.py`` ``validate_args``), and CP > 1 with
    the distributed optimizer
    (Megatron shards over the DP x CP group, ``intra_dp_cp_group`` in
    ``megatron/core/optimizer/__init__.py``, the formula divides by DP only).
    """
    refused = _refused(model, config)
    if refused:
        return refused
    if not config.grad_reduce_in_fp32:
        return Figure(
            None,
            "Megatron's 18 (or 6 + 12/DP) bytes per parameter counts fp32 gradients; "
            "without grad_reduce_in_fp32 they are bf16",
        )
    if config.cp > 1 and config.distributed_optimizer:
        return Figure(
            None,
            "with CP > 1 the distributed optimizer shards over DP x CP ranks; "
            "Megatron's formula divides by DP only",
        )
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    return Figure(float(compute_weight_and_optimizer_memory(megatron_args(model, config))))


def activation_bytes(model: Model, config: Config) -> Figure:
    """Megatron's activation formula (called) for the first pipeline stage, or why none applies.

    * SP + selective recomputation: ``compute_activation_memory`` (Table 2's ``34 s b h / t`` row,
      ``18 + 4 ffn/h`` so the MLP's width counts);
    * no SP, no or selective recomputation: ``compute_activation_memory_without_sp``
      (``s b h (10 + 24/t)`` per layer: Table 2's "TP + selective recomputation" row). It keeps no
      ``s x s`` attention scores, which holds with selective recomputation or a fused (flash)
      attention kernel, and its 24 counts an MLP of width 4h -- said in ``note``; it also adds the
      output layer's logits and multiplies its total by 1.05 for temporaries, the SP one does not.

    No number for full recomputation, CP > 1, MoE layers or SP without selective recomputation:
    neither function has a term for them (the module's own comments and Table 2).
    """
    refused = _refused(model, config)
    if refused:
        return refused
    c, m = config, model
    if c.recompute == "full":
        return Figure(None, "Megatron's activation formula has no full-recomputation term")
    if c.cp > 1:
        return Figure(None, "Megatron's activation formula has no context-parallel term")
    if m.moe:
        return Figure(
            None, "Megatron's activation formula has no MoE term (expert activations follow routing)"
        )
    from megatron.training import theoretical_memory_usage as tmu

    args = megatron_args(m, c)
    if c.sp:
        if c.recompute != "selective":
            return Figure(
                None,
                "Megatron's SP formula (34 sbh/t per layer) assumes selective recomputation; "
                "it has no SP-only variant",
            )
        value = float(tmu.compute_activation_memory(args, num_microbatches=c.num_microbatches))
        return Figure(value, note=_kv_width_note(m))
    value = float(tmu.compute_activation_memory_without_sp(args, num_microbatches=c.num_microbatches))
    notes = ["no s x s attention scores kept (selective recomputation or a fused attention kernel)"]
    if m.ffn != 4 * m.hidden:
        notes.append(f"its 24/t per layer counts an MLP of 4h, this model's ffn is {m.ffn / m.hidden:g}h")
    notes.append(_kv_width_note(m))
    return Figure(value, note="; ".join(n for n in notes if n))


def _kv_width_note(m: Model) -> str | None:
    """Table 2 counts Q, K and V each ``h`` wide (multi-head attention, ``heads * d = h``); the
    module's own TODO says so for the query. With GQA or another head width they are not."""
    q, kv = m.heads * m.kv_channels, m.query_groups * m.kv_channels
    if q == m.hidden and kv == m.hidden:
        return None
    return f"Q, K, V counted h = {m.hidden} wide each; this model's are {q}, {kv}, {kv}"


def memory_bytes(model: Model, config: Config) -> Figure:
    """Weights + optimizer + activations, when both are covered."""
    w, a = weight_and_optimizer_bytes(model, config), activation_bytes(model, config)
    if w.value is None:
        return w
    if a.value is None:
        return Figure(None, a.why)
    return Figure(w.value + a.value, note=a.note)


def memory_fits(model: Model, config: Config) -> dict:
    """Whether :func:`memory_bytes` fits :data:`MEMORY_BUDGET`: ``fits`` is ``True`` / ``False``,
    or ``None`` ("unknown") with ``why`` when there is no memory number -- never a guess."""
    mem = memory_bytes(model, config)
    if mem.value is None:
        return {"fits": None, "why": mem.why, "budget": MEMORY_BUDGET}
    return {"fits": mem.value <= MEMORY_BUDGET, "why": None, "budget": MEMORY_BUDGET}


# ----------------------------------------------------------------------------------------- FLOPs


def flops_per_step(model: Model, config: Config) -> Figure:
    """Megatron's ``num_floating_point_operations(args, global_batch)`` (called): model FLOPs of one
    step over all GPUs. It counts no recomputation (with ``full`` the GPUs do about 4/3 of it)."""
    refused = _refused(model, config)
    if refused:
        return refused
    from megatron.training.training import num_floating_point_operations

    value = float(num_floating_point_operations(megatron_args(model, config), config.global_batch))
    note = None
    if config.recompute == "full":
        note = "model FLOPs: the recomputed forward (about 1/3 more) is not counted"
    return Figure(value, note=note)


def six_n_flops(model: Model, config: Config) -> dict:
    """The back-of-envelope ``6 N`` per token plus causal attention ``6 * L * s * (heads*d)`` per
    token (forward QK^T and AV, halved by the causal mask, times 3 for the backward), for a whole
    step; ``N`` counts the parameters the matmuls use (active experts only, the output layer; no
    embedding lookup, no norms). For these models it equals ``num_floating_point_operations``
    (``tests/unit/test_cost_formulas.py``): Megatron's formula is exactly 6N + attention."""
    m, c = model, config
    q = m.heads * m.kv_channels
    kv = m.query_groups * m.kv_channels
    attn = m.hidden * (q + 2 * kv) + q * m.hidden
    gated = 3 if m.swiglu else 2
    dense_mlp = gated * m.hidden * m.ffn
    if m.moe:
        moe_layers = m.moe_layers
        mlp = (m.layers - moe_layers) * dense_mlp + moe_layers * gated * m.hidden * (
            m.moe_ffn * m.topk + m.shared_expert_ffn
        )
    else:
        mlp = m.layers * dense_mlp
    n = m.layers * attn + mlp + m.hidden * padded_vocab(m, c)
    tokens = c.global_batch * c.seq
    return {
        "n": n,
        "six_n": 6 * n * tokens,
        "attention": 6 * m.layers * c.seq * q * tokens,
        "total": 6 * n * tokens + 6 * m.layers * c.seq * q * tokens,
    }


def mfu(flops: float, step_seconds: float, gpus: int, peak: float = HARDWARE["peak_bf16_flops"]) -> float:
    """Model FLOPs utilisation: ``flops / (step time * GPUs * peak)``."""
    return flops / (step_seconds * gpus * peak)


# ---------------------------------------------------------------------------------------- bubble


def bubble_fraction(config: Config) -> float:
    """The idle share of a 1F1B step: ``(p-1) / (v*m + p-1)`` (v = 1 without interleaving).

    Each of the ``p-1`` warm-up / cool-down slots idles a stage for one chunk's time; a stage works
    ``v*m`` chunks (Narayanan et al. 2021, arXiv 2104.04473, section 2.2; note 13 counts the slots)."""
    p, m, v = config.pp, config.num_microbatches, config.vp or 1
    return (p - 1) / (v * m + p - 1)


# --------------------------------------------------------------------------------- communication

ORDER = "tp-cp-ep-dp-pp"
"""Megatron's default rank order (``--order``): tp varies fastest, pp slowest (note 08)."""


def group_stride_size(config: Config) -> dict[str, tuple[int, int]]:
    """Each group's ``(stride, size)`` in the default order: consecutive members are ``stride``
    ranks apart. Dense layout tp-cp-dp-pp; the DP gradient group spans DP x CP (stride tp); the
    expert layout etp-ep-edp-pp with ``etp = tp`` (note 08's ``RankGenerator``)."""
    c = config
    return {
        "tp": (1, c.tp),
        "cp": (c.tp, c.cp),
        "dp": (c.tp, c.cp * c.dp),  # the gradient group: data_parallel_group(with_context_parallel=True)
        "pp": (c.tp * c.cp * c.dp, c.pp),
        "ep": (c.tp, c.ep),
        "edp": (c.tp * c.ep, c.edp),
    }


def intra_node(stride: int, size: int, gpus_per_node: int) -> bool:
    """A group whose ranks are ``stride`` apart, ``size`` of them, lies inside one node iff its span
    ``stride*size`` fits a node and tiles it (``gpus_per_node % (stride*size) == 0``)."""
    span = stride * size
    return span <= gpus_per_node and gpus_per_node % span == 0


RING = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
"""Bytes a rank sends, per byte of the full tensor, in a ring of ``n`` ranks: all-reduce
``2(n-1)/n``, all-gather / reduce-scatter ``(n-1)/n``. :data:`snippets.cost.measure.RING` maps the
recorder's API names onto this table."""


def _ring(op: str, n: int) -> float:
    """:data:`RING`'s share for ``op`` in a ring of ``n`` ranks."""
    return RING[op](n)


def params_per_gpu(model: Model, config: Config) -> dict:
    """Parameters on the most loaded GPU, split into the ones DP syncs (``dense``) and the routed
    experts expert-DP syncs (``expert``). Taken from Megatron's weight formula (called with 18
    bytes per parameter and divided back) minus the routed experts, which we count as it does:
    ``2 h moe_ffn E (3/2 if SwiGLU)`` per MoE layer over ``pp * etp * ep``."""
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    c, m = config, model
    args = megatron_args(m, c.replace(distributed_optimizer=False))
    total = compute_weight_and_optimizer_memory(args) / 18
    expert = 0.0
    if m.moe:
        per_layer = 2 * m.hidden * m.moe_ffn * m.num_experts * (1.5 if m.swiglu else 1)
        expert = per_layer * m.moe_layers / (c.pp * c.tp * c.ep)
    return {"dense": total - expert, "expert": expert}


GROUPS = ("tp", "cp", "pp", "dp", "ep", "edp")


def communication(model: Model, config: Config) -> dict[str, dict]:
    """Bytes one rank sends per step in each group, the link it crosses, and the time at nominal
    bandwidth. Per group: ``size``, ``stride``, ``link`` (``"NVLink"`` / ``"IB"`` / ``None`` for
    size 1), ``bytes`` (or ``None`` with ``why``), ``seconds``, ``basis`` (what it counts).

    Activations are bf16; ``s' = seq/cp`` tokens per rank, ``L/p`` layers per stage, ``m``
    micro-batches; full recomputation repeats the forward's collectives.

    * tp (note 11): per layer per micro-batch, on ``A = s' b h`` elements: without SP 2 all-reduces
      forward + 2 backward; with SP 2 all-gathers + 2 reduce-scatters forward, 4 all-gathers + 2
      reduce-scatters backward. Layers only: the embedding, output layer and loss add a few more.
      No number for MoE layers (their TP traffic goes through the token dispatcher).
    * cp (note 16): per layer per micro-batch a ring of ``cp-1`` hops, each sending this rank's K and
      V (``2 s' b g d / t``) forward and K, V and their gradients backward: ``3(cp-1)`` KV blocks.
    * pp (note 13): a middle stage sends each micro-batch's activation forward and its gradient
      backward, once per model chunk: ``2 v m`` tensors of ``s' b h`` (``/t`` with SP).
    * dp (notes 14, 15): the gradients of the GPU's non-expert parameters, over DP x CP: one
      all-reduce, or with the distributed optimizer a reduce-scatter of gradients plus an
      all-gather of bf16 parameters. Gradients are fp32 with ``grad_reduce_in_fp32``, else bf16.
    * ep (note 17): per MoE layer per micro-batch 4 all-to-alls (dispatch and combine, forward and
      backward) of ``tokens * topk * h``, ``(ep-1)/ep`` of it leaving the rank (even routing);
      tokens per rank ``s' b`` (``/t`` with SP).
    * edp: the routed experts' gradients over the expert-DP group, as dp.
    """
    c, m = config, model
    found = problems(m, c)
    out: dict[str, dict] = {}
    geometry = group_stride_size(c)
    for name in GROUPS:
        stride, size = geometry[name]
        row = {"size": size, "stride": stride, "link": None, "bytes": None, "seconds": None,
               "why": None, "basis": ""}  # fmt: skip
        if size > 1:
            row["link"] = "NVLink" if intra_node(stride, size, c.gpus_per_node) else "IB"
        out[name] = row
    if found:
        for row in out.values():
            row["why"] = found[0]
        return out

    s = c.seq // c.cp
    b, h, t = c.micro_batch_size, m.hidden, c.tp
    layers_per_stage = m.layers // c.pp
    fwd_passes = 2 if c.recompute == "full" else 1
    act = s * b * h * BYTES_BF16
    grad_bytes = BYTES_FP32 if c.grad_reduce_in_fp32 else BYTES_BF16
    moe_layers_per_stage = m.moe_layers // c.pp

    def put(name, value, basis, why=None):
        row = out[name]
        row["basis"] = basis
        if row["size"] == 1:
            row["bytes"], row["seconds"] = 0.0, 0.0
            return
        if value is None:
            row["why"] = why
            return
        row["bytes"] = float(value)
        bw = HARDWARE["nvlink_bytes_per_s"] if row["link"] == "NVLink" else HARDWARE["ib_bytes_per_s"]
        row["seconds"] = row["bytes"] / bw

    # tp
    if c.sp:
        per_layer = (fwd_passes * 4 + 6) * _ring("all_gather", t) * act
        basis = "per layer per micro-batch: 2 AG + 2 RS forward, 4 AG + 2 RS backward of s'bh (note 11)"
    else:
        per_layer = (fwd_passes * 2 + 2) * _ring("all_reduce", t) * act
        basis = "per layer per micro-batch: 2 all-reduces forward + 2 backward of s'bh (note 11)"
    if m.moe and t > 1:
        put("tp", None, basis, "MoE layers move their TP traffic through the token dispatcher; not counted")
    else:
        put("tp", per_layer * layers_per_stage * c.num_microbatches, basis)

    # cp
    kv = 2 * s * b * m.query_groups * m.kv_channels / t * BYTES_BF16
    put(
        "cp",
        (fwd_passes + 2) * (c.cp - 1) * kv * layers_per_stage * c.num_microbatches,
        "per layer per micro-batch: cp-1 ring hops of K,V forward, of K,V and dK,dV backward (note 16)",
    )

    # pp
    p2p = act / (t if c.sp else 1)
    put(
        "pp",
        2 * (c.vp or 1) * c.num_microbatches * p2p,
        "a middle stage: one activation forward and one gradient backward per micro-batch per chunk "
        "(note 13)",
    )

    # dp and edp
    params = params_per_gpu(m, c)

    def grad_sync(n, count):
        if c.distributed_optimizer:
            return (
                _ring("reduce_scatter", n) * count * grad_bytes + _ring("all_gather", n) * count * BYTES_BF16
            )
        return _ring("all_reduce", n) * count * grad_bytes

    how = (
        "reduce-scatter of gradients + all-gather of bf16 parameters (distributed optimizer, note 15)"
        if c.distributed_optimizer
        else "all-reduce of gradients (note 14)"
    )
    put("dp", grad_sync(out["dp"]["size"], params["dense"]), "once per step over DP x CP: " + how)
    no_experts = "this model has no routed experts"
    put(
        "edp",
        grad_sync(out["edp"]["size"], params["expert"]),
        "routed experts' gradients: " + how if m.moe else no_experts,
    )

    # ep
    tokens = s * b / (t if c.sp else 1)
    a2a = tokens * (m.topk or 0) * h * BYTES_BF16 * (c.ep - 1) / c.ep
    put(
        "ep",
        (2 * fwd_passes + 2) * a2a * moe_layers_per_stage * c.num_microbatches,
        "per MoE layer per micro-batch: dispatch + combine all-to-all, forward and backward (note 17)"
        if m.moe
        else no_experts,
    )
    return out


# ---------------------------------------------------------------------------------------- summary


def summary(model: Model, config: Config) -> dict:
    """Everything the calculator page shows, as plain data (the page's test compares to this)."""
    found = problems(model, config)
    out = {
        "problems": found,
        "world": config.world,
        "dp": config.dp if not found else None,
    }
    if found:
        return out
    out.update(
        weights=weight_and_optimizer_bytes(model, config).as_dict(),
        activations=activation_bytes(model, config).as_dict(),
        memory=memory_bytes(model, config).as_dict(),
        fits=memory_fits(model, config),
        flops=flops_per_step(model, config).as_dict(),
        flops_per_gpu=flops_per_step(model, config).value / config.world,
        bubble=bubble_fraction(config),
        padded_vocab=padded_vocab(model, config),
        communication=communication(model, config),
    )
    return out


__all__ = [
    "BYTES_BF16",
    "BYTES_FP32",
    "Config",
    "Figure",
    "GIB",
    "GROUPS",
    "HARDWARE",
    "MAX_LAYERS",
    "MAX_SIZE",
    "MEMORY_BUDGET",
    "MEMORY_HEADROOM",
    "MODELS",
    "MODEL_SIZES",
    "Model",
    "ORDER",
    "RECOMPUTE",
    "RING",
    "activation_bytes",
    "bubble_fraction",
    "communication",
    "flops_per_step",
    "group_stride_size",
    "intra_node",
    "megatron_args",
    "memory_bytes",
    "memory_fits",
    "mfu",
    "padded_vocab",
    "params_per_gpu",
    "problems",
    "six_n_flops",
    "summary",
    "weight_and_optimizer_bytes",
]
