"""Runner entries for notes 01, 07 and 21: their experiments' sizes, checks and memory estimates.

Torch-free, like the rest of the registry (:mod:`snippets.experiments`): the runner imports it to
refuse a bad command before it starts anything.

* ``overview`` (note 01) -- Megatron's simple training loop as published and fixed, at TP = ``--tp``;
* ``checkpoint`` (note 07) -- save at TP = ``--tp``, load at TP = 1 and TP = world size
  (:func:`load_tps`), with all the job's ranks each time;
* ``ckpt-topic`` (note 21) -- every ``sharded_state_dict`` entry's coordinates at TP x PP x DP.
"""

from __future__ import annotations

from snippets.models import memory_estimate as mem
from snippets.experiments import Experiment, Parallel
from snippets.models.presets import Dims

SIMPLE_LOOP_STEPS = 5
"""Iterations of note 01's loop (``snippets.experiments.n01_overview.STEPS``; a test keeps them equal)."""

MOCK_SAMPLES = 1000
"""Samples of its mock dataset (``snippets.experiments.n01_overview.SAMPLES``)."""


def load_tps(par: Parallel) -> list[int]:
    """The TP sizes the ``checkpoint`` experiment loads at: 1 and the world size, those that differ
    from the saved TP (``par.tp``); a world of one reloads at TP = 1."""
    return [tp for tp in dict.fromkeys((1, par.world)) if tp != par.tp] or [par.tp]


def _divides(out: list, what: str, n: int, by: str, k: int) -> None:
    if n % k:
        out.append(f"{what} {n} is not divisible by {by} {k}")


def _tp_splits(out: list, d: Dims, tp: int, name: str = "tp") -> None:
    """What a TP-split ``GPTModel`` (local spec) divides by ``tp``: heads, query groups, the MLP,
    the vocabulary (Core does not pad it)."""
    for what, n in (("heads", d.heads), ("query groups", d.query_groups), ("ffn", d.ffn), ("vocab", d.vocab)):
        _divides(out, what, n, name, tp)


# ----------------------------------------------------------------------------- overview (note 01)


def _overview_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate({
        # the model, its copy at the start (how far it moved) and the trained copy checked after reload
        "weights": 3 * weights,
        "gradients": weights,            # DDP's main_grad buffer (param.grad is None, or aliases it)
        "optimizer": 2 * weights,        # the fixed run's Adam moments (the published Adam makes none)
        "checkpoint": 0 if par.cuda else weights,   # writers' / readers' buffers (host memory on a GPU)
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        # one micro-batch in flight (no pipeline); dropout 0.1 keeps a byte mask per element
        "activations": (d.layers * mem.layer_activation_elements(d, par.tp)
                        + 2 * mem.attention_scores_elements(d, par.tp)) * mem.FP32
                       + d.layers * (mem.attention_scores_elements(d, par.tp) + 2 * d.seq * d.micro_batch_size * d.hidden),
        "logits": mem.logits_elements(d, par.tp) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _overview_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _tp_splits(out, d, par.tp)
    needed = SIMPLE_LOOP_STEPS * d.microbatches * d.micro_batch_size
    if needed > MOCK_SAMPLES:
        out.append(f"{SIMPLE_LOOP_STEPS} steps x {d.microbatches} micro-batches x micro-batch "
                   f"{d.micro_batch_size} = {needed} samples, more than the mock dataset's {MOCK_SAMPLES}")
    return out


# ----------------------------------------------------------------------------- checkpoint (note 07)


def _checkpoint_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    tp = min([par.tp, *load_tps(par)])              # the phase with the biggest model share
    weights = mem.stage_weight_elements(d, tp) * mem.FP32
    return mem.Estimate({
        "weights": weights,
        "checkpoint": 0 if par.cuda else weights,   # up to one copy while writing / reading chunks
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        # no_grad forwards: one layer's tensors at a time
        "activations": (mem.layer_activation_elements(d, tp)
                        + 2 * mem.attention_scores_elements(d, tp)) * mem.FP32,
        # whole-vocabulary logits: the saved model's, before and after the load, and one gathering
        "logits": mem.logits_elements(d, 1, copies=4) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _checkpoint_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _tp_splits(out, d, par.tp, "tp (save)")
    for tp in load_tps(par):
        _tp_splits(out, d, tp, "tp (load)")
    return out


# ----------------------------------------------------------------------------- ckpt-topic (note 21)


def _ckpt_topic_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    # one stage, allocated but not initialized (no CPU master weights); the entries are views of it
    return mem.Estimate({"weights": mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32,
                         "runtime": mem.RUNTIME_BYTES[par.device]})


def _ckpt_topic_checks(d: Dims, par: Parallel) -> list[str]:
    out: list[str] = []
    _divides(out, "layers", d.layers, "pp", par.pp)
    _tp_splits(out, d, par.tp)
    return out


_NOTE_07_GPT = Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32,
                    layers=2, seq=8, micro_batch_size=2, microbatches=1, bias=False)
"""Notes 07 and 21's GPT: ``snippets.models.tiny_gpt.tiny_config`` with 2 layers and 4 heads."""

ENTRIES: list = [
    Experiment(
        name="overview", note="01_training_run_overview",
        what="Megatron's run_simple_mcore_train_loop.py line by line: 5 steps as published "
             "(torch Adam: the weights never move) and fixed (get_megatron_optimizer + "
             "zero_grad_buffer), each saving and reloading with dist_checkpointing",
        module="snippets.experiments.n01_overview",
        tiny=Dims("tiny", hidden=12, heads=4, query_groups=4, kv_channels=3, ffn=48, vocab=100,
                  layers=2, seq=64, micro_batch_size=8, microbatches=1),
        uses=("tp",), estimate=_overview_estimate, checks=_overview_checks, example="--tp 2"),
    Experiment(
        name="checkpoint", note="07_checkpointing",
        what="a real GPTModel saved with dist_checkpointing at TP=--tp and loaded at TP=1 and "
             "TP=world size: sharded_state_dict entries, files, chunks, logits before/after, "
             "which saved chunks each loading rank reads",
        module="snippets.experiments.n07_checkpoint",
        tiny=_NOTE_07_GPT, uses=("tp",), estimate=_checkpoint_estimate, checks=_checkpoint_checks,
        example="--tp 2", unused=("microbatches",)),
    Experiment(
        name="ckpt-topic", note="21_checkpoint_topic",
        what="every sharded_state_dict entry of a real GPTModel (tied embeddings) on a TP x PP x DP "
             "grid: global key, offset, axis_fragmentations, replica_id, and that the written "
             "pieces cover each global tensor exactly once",
        module="snippets.experiments.n21_ckpt_topic",
        tiny=_NOTE_07_GPT, uses=("tp", "pp"), estimate=_ckpt_topic_estimate, checks=_ckpt_topic_checks,
        example="--tp 2 --pp 2", unused=("micro_batch_size", "microbatches")),
]
