"""The notes' main experiments as functions of their sizes, so a cell and ``torchrun`` run the same code.

Each experiment is a module here with two functions:

* ``run(dims, par)`` -- runs on **every rank**, after ``torch.distributed`` is up (by
  :func:`snippets.ranks.launch.run_ranks` in a note, by ``torchrun`` + :mod:`snippets.run` on a node).
  It builds the real Megatron objects at ``dims`` (a :class:`snippets.models.presets.Dims`) and parallel
  sizes ``par`` (a :class:`Parallel`) and returns a small, picklable summary of this rank;
* ``tables(results, dims, par)`` -- turns the list of every rank's summary into what the note
  prints: strings and :class:`snippets.record.tables.Table` objects.

``run`` is a thin wrapper over the function the note's cell launches with
:func:`snippets.ranks.launch.run_ranks` (``pipeline_run``, ``one_rl_round``: the same code, the note's
sizes as ``dims``); the runner gathers every rank's summary to rank 0 and prints the note's tables
from it. :data:`EXPERIMENTS`
lists them with the note each comes from, the note's own sizes (``tiny``), the parallel sizes each
one reads, and how much memory a rank needs -- all without importing torch or Megatron, so the
runner can refuse a job before it starts anything.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from snippets.models import memory_estimate as mem
from snippets.models import presets
from snippets.models.presets import Dims

PARALLEL_FLAGS = ("tp", "pp", "vp", "cp", "ep", "sp")


@dataclass(frozen=True)
class Parallel:
    """The parallel sizes of one run: ``world`` ranks, ``tp * pp * cp`` per model replica, the rest
    data parallel (``dp``), as ``parallel_state.initialize_model_parallel`` lays them out.

    ``vp`` is the virtual pipeline size (model chunks per pipeline rank, ``None`` = not
    interleaved), ``sp`` sequence parallel. ``device`` is ``"cuda"`` under ``torchrun`` on GPUs and
    ``"cpu"`` otherwise; ``backend`` is the matching ``torch.distributed`` backend.
    """

    world: int
    tp: int = 1
    pp: int = 1
    vp: int | None = None
    cp: int = 1
    ep: int = 1
    sp: bool = False
    device: str = "cpu"

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def describe(self) -> str:
        sizes = f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp}"
        extra = "".join([f", vp {self.vp}" if self.vp else "", f", ep {self.ep}" if self.ep > 1
                         else "", ", sequence parallel" if self.sp else ""])
        return f"{self.world} ranks = {sizes}{extra}"


@dataclass(frozen=True)
class Experiment:
    """One registered experiment: where it comes from and what it needs (torch-free)."""

    name: str
    note: str                                   # the note whose tables it prints, "NN_slug"
    what: str                                   # one line for ``--list``
    module: str                                 # holds run() and tables()
    tiny: Dims                                  # the sizes the note uses
    uses: tuple[str, ...]                       # which of PARALLEL_FLAGS it reads
    estimate: Callable[[Dims, Parallel], mem.Estimate]
    checks: Callable[[Dims, Parallel], list[str]] = field(default=lambda d, p: [])
    example: str = ""                           # extra arguments of a typical command
    unused: tuple[str, ...] = ()                # Dims fields it does not read (left out of headers)

    def functions(self):
        """``(run, tables)``, importing the module (and with it torch and Megatron) only now."""
        module = importlib.import_module(self.module)
        return module.run, module.tables


def problems(exp: Experiment, dims: Dims, par: Parallel) -> list[str]:
    """Everything wrong with running ``exp`` at these sizes, as sentences (empty = fine)."""
    out = []
    model = par.tp * par.pp * par.cp
    if par.world % model:
        out.append(f"world size {par.world} is not divisible by tp*pp*cp = "
                   f"{par.tp}*{par.pp}*{par.cp} = {model}")
    for flag in PARALLEL_FLAGS:
        value = getattr(par, flag)
        if flag not in exp.uses and value not in (None, 1, False):
            out.append(f"{exp.name} does not use --{'sequence-parallel' if flag == 'sp' else flag}"
                       f" (it reads: {', '.join(exp.uses) or 'no parallel sizes'})")
    if not out:
        out += exp.checks(dims, par)
    return out


def _divides(out: list, what: str, n: int, by: str, k: int) -> None:
    if n % k:
        out.append(f"{what} {n} is not divisible by {by} {k}")


# ----------------------------------------------------------------------------- the experiments

_QWEN3_STYLE = dict(swiglu=True, rmsnorm=True, qk_norm=True, bias=False, rope=False)


def _tp_layer_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    weights = mem.layer_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate({
        "weights": weights,
        "gradients": 2 * weights,        # .grad and DDP's main_grad buffer
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d, embedding=False) * mem.FP32,
        "activations": (max(mem.layer_activation_elements(d, par.tp, sp) for sp in (False, True))
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _tp_layer_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "heads", d.heads, "tp", par.tp)
    _divides(out, "ffn", d.ffn, "tp", par.tp)
    if d.query_groups % par.tp and par.tp % d.query_groups:
        out.append(f"query groups {d.query_groups} and tp {par.tp}: one must divide the other")
    if par.tp > 1:
        _divides(out, "seq", d.seq, "tp (sequence parallel run)", par.tp)
    return out


def _pipeline_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32
    chunk_layers = d.layers // (par.pp * (par.vp or 1))
    in_flight = mem.in_flight_microbatches(d.microbatches, par.pp, par.vp)
    return mem.Estimate({
        "weights": weights,
        "gradients": weights,
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (in_flight * chunk_layers * mem.layer_activation_elements(d, par.tp, par.sp)
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32,
        "logits": mem.logits_elements(d, par.tp) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _pipeline_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "layers", d.layers, "pp * vp", par.pp * (par.vp or 1))
    _divides(out, "heads", d.heads, "tp", par.tp)
    _divides(out, "vocab", d.vocab, "tp", par.tp)
    if par.vp and par.pp < 2:
        out.append("--vp (interleaved 1F1B) needs --pp 2 or more")
    if par.sp:
        _divides(out, "seq", d.seq, "tp (sequence parallel)", par.tp)
    return out


def _refit_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    policy = mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32
    rollout = mem.stage_weight_elements(d, par.world, 1) * mem.FP32
    in_flight = mem.in_flight_microbatches(d.microbatches, par.pp)
    return mem.Estimate({
        "weights": policy + rollout,
        "gradients": policy,
        "transfer": rollout,             # receive buffers of swap_model_weights
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (in_flight * -(-d.layers // par.pp) * mem.layer_activation_elements(d, par.tp)
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32,
        # full-vocab logits of the prompts: before, after, stale, fresh, and the one in flight
        "logits": mem.logits_elements(d, 1, copies=5) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _refit_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "layers", d.layers, "pp", par.pp)
    for name, tp in (("tp", par.tp), ("rollout tp (= world size)", par.world)):
        _divides(out, "heads", d.heads, name, tp)
        _divides(out, "query groups", d.query_groups, name, tp)
        _divides(out, "vocab", d.vocab, name, tp)
        _divides(out, "ffn", d.ffn, name, tp)
    return out


def _groups_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    return mem.Estimate({"runtime": mem.RUNTIME_BYTES[par.device]})  # no tensors, only groups


def _groups_checks(d: Dims, par: Parallel) -> list[str]:
    expert_ranks = par.world // (par.tp * par.pp)
    if expert_ranks % par.ep:
        return [f"ep {par.ep} does not divide the {expert_ranks} ranks left for experts "
                f"(world size {par.world} / (tp {par.tp} * pp {par.pp}))"]
    return []


def _linear_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    hf = d.hidden * d.ffn
    acts = d.seq * d.micro_batch_size * (d.hidden + d.ffn)
    return mem.Estimate({
        # the kept master weight (also our layer's), this rank's shard and its gradient, two layers
        # alive at a time (the real one and ours)
        "weights": 2 * (hf + hf // par.tp) * mem.FP32,
        "gradients": 2 * (hf // par.tp) * mem.FP32,
        "cpu init": 0 if par.cuda else hf * mem.FP32,
        # the full X, G and, per configuration and layer, input, output and their gradients
        "activations": 8 * acts * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _linear_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "ffn", d.ffn, "tp", par.tp)
    _divides(out, "seq", d.seq, "tp (sequence parallel cases)", par.tp)
    return out


def _mappings_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    act = d.seq * d.micro_batch_size * d.hidden
    # x, its copy, y (up to tp times x after a gather), dy and its copy, dx; one call at a time
    return mem.Estimate({"activations": (4 + 3 * par.tp) * act * mem.FP32,
                         "runtime": mem.RUNTIME_BYTES[par.device]})


def _mappings_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "seq", d.seq, "tp", par.tp)
    _divides(out, "hidden", d.hidden, "tp", par.tp)
    return out


def _vocab_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    table = d.vocab * d.hidden // par.tp
    tokens = d.seq * d.micro_batch_size
    return mem.Estimate({
        "weights": table * mem.FP32,
        "gradients": table * mem.FP32,
        "cpu init": 0 if par.cuda else d.vocab * d.hidden * mem.FP32,
        # the whole [s, b, V] logits on every rank (each slices its part), the slice, its gradient
        # and the cross entropy's softmax copies; the embedding's [b, s, h] output is small
        "logits": (d.vocab + 4 * d.vocab // par.tp) * tokens * mem.FP32,
        "activations": 4 * tokens * d.hidden * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _vocab_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "vocab", d.vocab, "tp", par.tp)
    _divides(out, "seq", d.seq, "tp (reduce-scattered embedding)", par.tp)
    return out


def _ddp_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    weights = mem.stage_weight_elements(d) * mem.FP32
    return mem.Estimate({
        "weights": weights,
        "gradients": 2 * weights,        # .grad while it is added into DDP's main_grad buffer
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (d.layers * mem.layer_activation_elements(d)
                        + 2 * mem.attention_scores_elements(d)) * mem.FP32,
        "logits": mem.logits_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _ddp_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "micro-batches", d.microbatches, "dp (= world size)", par.dp)
    return out


def _dist_optimizer_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    n = mem.stage_weight_elements(d)
    return mem.Estimate({
        "weights": n * mem.FP32,
        "gradients": 2 * n * mem.FP32,   # .grad while it is added into the grad buffer
        # fp32 Adam: two moments, unsharded (the first run) -- the sharded run needs less
        "optimizer": 2 * n * mem.FP32,
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (d.layers * mem.layer_activation_elements(d)
                        + 2 * mem.attention_scores_elements(d)) * mem.FP32,
        "logits": mem.logits_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _cp_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    qkv = d.seq * d.micro_batch_size * d.heads * d.kv_channels
    scores = d.micro_batch_size * d.heads * d.seq * d.seq
    return mem.Estimate({
        # q, k, v, dout and their full-sequence copies with gradients, the local pieces, the ring's
        # K/V(+dK/dV) buffers; the reference's [b, heads, s, s] scores, probabilities and gradients
        "activations": (16 * qkv + 4 * scores) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _cp_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "seq", d.seq, "2 * cp", 2 * par.cp)
    return out


def _moe_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    experts = 2 * par.ep                                  # snippets.experiments.n17_moe.EXPERTS_PER_EP_RANK
    expert = 2 * d.hidden * d.ffn
    tokens = d.seq * d.micro_batch_size
    return mem.Estimate({
        # the EP=1 reference layer (every expert) and its state_dict, then two EP layers in turn
        "weights": (2 * experts + 2 * 2) * expert * mem.FP32,
        "gradients": 2 * expert * mem.FP32,
        # each token goes to top-2 experts: the dispatched rows, expert activations and gradients;
        # allgather moves every EP rank's tokens
        "activations": (8 * par.ep * tokens * d.hidden + 8 * tokens * d.ffn) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _loss_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate({
        "weights": weights,
        "gradients": weights,
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (d.layers * mem.layer_activation_elements(d, par.tp)
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32,
        "logits": mem.logits_elements(d, par.tp) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _loss_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "heads", d.heads, "tp", par.tp)
    _divides(out, "vocab", d.vocab, "tp", par.tp)
    _divides(out, "ffn", d.ffn, "tp", par.tp)
    return out


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in sorted([
    Experiment(
        name="loss", note="05_forward_loss_backward",
        what="one forward+backward of a real GPTModel through get_forward_backward_func with "
             "pretrain_gpt's three-value loss_func: the reports, the logged lm loss, every TP collective",
        module="snippets.experiments.n05_loss",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32,
                  layers=1, seq=8, micro_batch_size=2, microbatches=2),
        uses=("tp",), estimate=_loss_estimate, checks=_loss_checks, example="--tp 2"),
    Experiment(
        name="train-step", note="06_gradient_sync_and_optimizer",
        what="one whole training step of a real GPTModel in DDP with Megatron's Adam: schedule, "
             "finalize_model_grads (the DP all-reduce), optimizer.step() (norm, Adam), recorded",
        module="snippets.experiments.n06_train_step",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=_dist_optimizer_estimate, checks=_ddp_checks),
    Experiment(
        name="groups", note="02_distributed_initialization",
        what="the real initialize_model_parallel: every rank's coordinates and the members of its "
             "TP / PP / DP / CP / EP groups (note 02's table, seed 000's summary)",
        module="snippets.experiments.n02_groups",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1, layers=1,
                  seq=1, micro_batch_size=1, microbatches=1),
        uses=("tp", "pp", "cp", "ep"), estimate=_groups_estimate, checks=_groups_checks,
        example="--tp 2 --pp 2", unused=presets.OVERRIDES),
    Experiment(
        name="mappings", note="09_tp_mappings",
        what="every function of tensor_parallel/mappings.py (f, g, scatter/gather, SP, all-to-all) "
             "forward and backward: the collective, its group and shapes, who issued it, and the "
             "conjugate pairs computed from the records",
        module="snippets.experiments.n09_mappings",
        tiny=Dims("tiny", hidden=6, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=_mappings_estimate, checks=_mappings_checks, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "ffn", "vocab", "layers", "microbatches")),
    Experiment(
        name="linear", note="10_column_row_parallel_linear",
        what="ColumnParallelLinear(hidden, ffn) and RowParallelLinear(ffn, hidden) in six "
             "configurations (gather_output, input_is_parallel, SP): which rows/columns each rank "
             "holds, every collective, and our snippets.tp.tp_linear on the same weights",
        module="snippets.experiments.n10_linear",
        tiny=Dims("tiny", hidden=8, heads=1, query_groups=1, kv_channels=1, ffn=16, vocab=1,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=_linear_estimate, checks=_linear_checks, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "vocab", "layers", "microbatches")),
    Experiment(
        name="vocab", note="12_vocab_parallel",
        what="VocabParallelEmbedding (all-reduce and reduce-scatter) and vocab_parallel_cross_entropy "
             "(plain, label smoothing, fused) on this rank's vocab slice: shapes and every collective",
        module="snippets.experiments.n12_vocab",
        tiny=Dims("tiny", hidden=6, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=16,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=_vocab_estimate, checks=_vocab_checks, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "ffn", "layers", "microbatches")),
    Experiment(
        name="tp-layer", note="11_transformer_layer",
        what="one TransformerLayer (local spec) forward+backward under TP, without and with "
             "sequence parallel: weights per rank, every collective and the submodule that issued it",
        module="snippets.experiments.n11_tp_layer",
        tiny=Dims("tiny", hidden=32, heads=8, query_groups=4, kv_channels=4, ffn=48, vocab=1,
                  layers=1, seq=8, micro_batch_size=2, microbatches=1, **_QWEN3_STYLE),
        uses=("tp",), estimate=_tp_layer_estimate, checks=_tp_layer_checks, example="--tp 2",
        unused=("vocab", "layers", "microbatches")),
    Experiment(
        name="pipeline", note="13_pipeline_schedules",
        what="a real GPTModel through Megatron's pipeline schedule (1F1B, or interleaved with --vp): "
             "stages, recorded order, warm-up/steady/cool-down, p2p calls, the bubble",
        module="snippets.experiments.n13_pipeline",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=8, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=("tp", "pp", "vp", "sp"), estimate=_pipeline_estimate, checks=_pipeline_checks,
        example="--pp 4"),
    Experiment(
        name="ddp", note="14_data_parallel_ddp",
        what="a real GPTModel in Megatron's DistributedDataParallel, every rank data parallel: the grad "
             "buffer's buckets, and the all-reduces without overlap, and with overlap (step 1 in "
             "finalize, step 2 inside backward)",
        module="snippets.experiments.n14_ddp",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=_ddp_estimate, checks=_ddp_checks),
    Experiment(
        name="cp", note="16_context_parallel",
        what="the real get_batch_on_this_cp_rank (2*CP chunks, head and tail per rank) and ring "
             "attention over the CP group against one process's full causal attention: positions, "
             "equal outputs and gradients, every p2p step of the ring",
        module="snippets.experiments.n16_cp",
        tiny=Dims("tiny", hidden=8, heads=2, query_groups=2, kv_channels=4, ffn=1, vocab=1,
                  layers=1, seq=16, micro_batch_size=1, microbatches=1),
        uses=("cp",), estimate=_cp_estimate, checks=_cp_checks, example="--cp 2",
        unused=("hidden", "ffn", "vocab", "layers", "microbatches")),
    Experiment(
        name="dist-optimizer", note="15_distributed_optimizer",
        what="two Adam steps of a real GPTModel with get_megatron_optimizer, without and with "
             "use_distributed_optimizer: padded buffer, each rank's shard, reduce-scatter / all-gather "
             "against one all-reduce, bytes per parameter",
        module="snippets.experiments.n15_dist_optimizer",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=48, vocab=32,
                  layers=3, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=_dist_optimizer_estimate, checks=_ddp_checks),
    Experiment(
        name="moe", note="17_moe_expert_parallel",
        what="a real MoELayer (TopKRouter, SequentialMLP, top-2, 2 experts per EP rank) under expert "
             "parallelism with the alltoall and allgather dispatchers: the expert groups, where each "
             "rank's tokens go, every collective with its split sizes, output equal to EP=1",
        module="snippets.experiments.n17_moe",
        tiny=Dims("tiny", hidden=8, heads=2, query_groups=2, kv_channels=4, ffn=16, vocab=1,
                  layers=1, seq=6, micro_batch_size=1, microbatches=4, bias=False),
        uses=("ep",), estimate=_moe_estimate, checks=_groups_checks, example="--ep 2",
        unused=("query_groups", "kv_channels", "vocab", "layers", "microbatches")),
    Experiment(
        name="refit", note="22_refit_and_resharding",
        what="one RL round: train a TPxPP policy one step, swap_model_weights into a rollout model "
             "with TP = world size, check stale vs fresh logits, and what the plan moved",
        module="snippets.experiments.n22_refit",
        tiny=Dims("tiny", hidden=32, heads=8, query_groups=4, kv_channels=4, ffn=128, vocab=64,
                  layers=4, seq=8, micro_batch_size=2, microbatches=2, rope=True),
        uses=("tp", "pp"), estimate=_refit_estimate, checks=_refit_checks,
        example="--tp 2 --pp 2"),
], key=lambda e: e.note)}
"""Registered experiments by name (the runner's first argument), in the order of their notes."""

CATALOGS = ("snippets.experiments.catalog_checkpoint", "snippets.experiments.catalog_data",
            "snippets.experiments.catalog_model", "snippets.experiments.catalog_training")
"""Torch-free modules that register more experiments (``ENTRIES``, a list of :class:`Experiment`),
grouped by topic: the notes of rounds 1 and 3 and note 23."""


def _add_catalogs() -> None:
    for name in CATALOGS:
        for exp in importlib.import_module(name).ENTRIES:
            if exp.name in EXPERIMENTS:
                raise ValueError(f"{name} registers {exp.name!r} twice")
            EXPERIMENTS[exp.name] = exp
    ordered = sorted(EXPERIMENTS.values(), key=lambda e: e.note)
    EXPERIMENTS.clear()
    EXPERIMENTS.update((e.name, e) for e in ordered)


_add_catalogs()


__all__ = ["EXPERIMENTS", "Experiment", "PARALLEL_FLAGS", "Parallel", "problems"]
