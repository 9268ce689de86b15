"""Runner entries for notes 20 and 23: their experiments' sizes, checks and memory estimates.

Torch-free, like the rest of the registry (:mod:`snippets.experiments`): the runner imports it to
refuse a bad command before it starts anything.
"""

from __future__ import annotations

from snippets.models import memory_estimate as mem
from snippets.experiments import Experiment, Parallel
from snippets.models.presets import Dims

BF16 = 2


def _divides(out: list, what: str, n: int, by: str, k: int) -> None:
    if n % k:
        out.append(f"{what} {n} is not divisible by {by} {k}")


# ----------------------------------------------------------------------------- note 20: optimizer-topic


def _optimizer_topic_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    """The unsharded run is the larger of the two: bf16 weights, the fp32 grad buffer (plus bf16
    ``.grad`` while it is added in), a whole fp32 main copy and Adam's two fp32 moments. The model
    is built in fp32 before ``Float16Module`` casts it, but those 4 bytes per parameter (plus the
    largest matrix that CPU initialization draws whole) come and go before anything else exists."""
    n = mem.stage_weight_elements(d)
    return mem.Estimate({
        "weights": n * BF16,
        "gradients": n * (mem.FP32 + BF16),
        "optimizer": 3 * n * mem.FP32,
        "activations": (d.layers * mem.layer_activation_elements(d)
                        + 2 * mem.attention_scores_elements(d)) * BF16,
        "logits": mem.logits_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _optimizer_topic_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "micro-batches", d.microbatches, "dp (= world size)", par.dp)
    return out


def _overlap_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    """fp32 weights and grad buffer, Adam sharded over DP; the weights right after the last step
    and after the forced all-gather are kept for the comparison, for both runs (four copies)."""
    n = mem.stage_weight_elements(d)
    return mem.Estimate({
        "weights": n * mem.FP32,
        "gradients": 2 * n * mem.FP32,   # .grad while it is added into the grad buffer
        "optimizer": 2 * n // par.dp * mem.FP32,
        "kept copies": 4 * n * mem.FP32,
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "activations": (d.layers * mem.layer_activation_elements(d)
                        + 2 * mem.attention_scores_elements(d)) * mem.FP32,
        "logits": mem.logits_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


# ----------------------------------------------------------------------------- note 23: journey


def _journey_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    """Two steps in turn: the in-job reference (TP = PP = 1, the whole model on every rank, the
    whole batch, one micro-batch's activations at a time, Adam sharded over all ranks), then the
    step at ``par``; what the reference keeps for the comparisons (the followed layer's inputs and
    outputs for every micro-batch, copies of the followed weight and its gradient) stays alive."""
    fc1 = d.ffn * (2 if d.swiglu else 1)
    tokens = d.seq * d.micro_batch_size
    tap = tokens * (4 * d.hidden + fc1 + d.ffn)     # layer in/out, fc1 in/out, fc2 in/out
    copies = 6 * fc1 * d.hidden                     # dense, initial, updated, local, reduced, DP-mean grads

    whole = mem.stage_weight_elements(d)
    # weights, the grad buffer and .grad while it is added in, Adam sharded over all ranks
    reference = (3 * whole + 2 * whole // par.world) * mem.FP32 + (
        d.layers * mem.layer_activation_elements(d) + 2 * mem.attention_scores_elements(d)
        + mem.logits_elements(d)) * mem.FP32
    kept = (d.microbatches * tap + copies) * mem.FP32

    n = mem.stage_weight_elements(d, par.tp, par.pp)
    m = d.microbatches // par.dp
    parts = {
        "weights": n * mem.FP32,
        "gradients": 2 * n * mem.FP32,   # the grad buffer, and .grad while it is added in
        "optimizer": 2 * n // par.dp * mem.FP32,
        "activations": (mem.in_flight_microbatches(m, par.pp) * (d.layers // par.pp)
                        * mem.layer_activation_elements(d, par.tp, par.sp)
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32,
        "logits": mem.logits_elements(d, par.tp) * mem.FP32,
        "taps and copies": (m * tap + copies // par.tp) * mem.FP32,
    }
    parts["reference step beyond that"] = max(0, reference - sum(parts.values()))
    parts["kept from the reference"] = kept
    # CPU init builds the largest matrix whole, and init_full_then_shard draws it whole again
    parts["cpu init"] = 0 if par.cuda else 2 * mem.largest_weight_elements(d) * mem.FP32
    parts["runtime"] = mem.RUNTIME_BYTES[par.device]
    return mem.Estimate(parts)


def _journey_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "layers", d.layers, "pp", par.pp)
    _divides(out, "heads", d.heads, "tp", par.tp)
    if d.query_groups % par.tp and par.tp % d.query_groups:
        out.append(f"query groups {d.query_groups} and tp {par.tp}: one must divide the other")
    _divides(out, "ffn", d.ffn, "tp", par.tp)
    _divides(out, "vocab", d.vocab, "tp", par.tp)
    _divides(out, "micro-batches", d.microbatches, "dp", par.dp)
    if par.sp:
        if par.tp < 2:
            out.append("--sequence-parallel needs --tp 2 or more")
        _divides(out, "seq", d.seq, "tp (sequence parallel)", par.tp)
    return out


ENTRIES: list = [
    Experiment(
        name="optimizer-topic", note="20_optimizer_topic",
        what="a bf16 GPTModel (Float16Module, fp32 grad buffer) with get_megatron_optimizer, with and "
             "without use_distributed_optimizer, one step: every buffer a rank holds, which parameters "
             "have an fp32 main shard, bytes per parameter against the formula, equal weights",
        module="snippets.experiments.n20_optimizer_topic",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=_optimizer_topic_estimate, checks=_optimizer_topic_checks),
    Experiment(
        name="overlap", note="20_optimizer_topic",
        what="a real GPTModel in DDP with the distributed optimizer, two steps without and with "
             "overlap_grad_reduce / overlap_param_gather: where each bucket's reduce-scatter and "
             "all-gather fires among the forwards and gradients, and the weights stay the same",
        module="snippets.experiments.n20_overlap",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=_overlap_estimate, checks=_optimizer_topic_checks),
    Experiment(
        name="journey", note="23_tensor_journey",
        what="one training step of a real GPTModel (TP, PP, DP, sequence parallel, distributed "
             "optimizer) following one linear_fc1 weight: which rank holds which rows, the activation's "
             "sequence shard, the p2p, the DP reduce-scatter, the optimizer shard, every collective, "
             "memory per rank; compared with a TP=PP=1 reference run in the same job",
        module="snippets.experiments.n23_journey",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=2, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=("tp", "pp", "sp"), estimate=_journey_estimate, checks=_journey_checks,
        example="--tp 2 --pp 2 --sequence-parallel"),
]
