"""Runner entries for notes 04, 08 and 19: their experiments' sizes, checks and memory estimates.

Torch-free, like the rest of the registry (:mod:`snippets.experiments`): the runner imports it to
refuse a bad command before it starts anything.
"""

from __future__ import annotations

import dataclasses

from snippets.models import memory_estimate as mem
from snippets.models import presets
from snippets.experiments import Experiment, _divides
from snippets.models.presets import Dims


def _tp_checks(d: Dims, tp: int) -> list[str]:
    """What ``TransformerConfig`` and the TP layers of a whole GPT model need from ``tp``."""
    out: list[str] = []
    _divides(out, "heads", d.heads, "tp", tp)
    if d.query_groups % tp and tp % d.query_groups:
        out.append(f"query groups {d.query_groups} and tp {tp}: one must divide the other")
    _divides(out, "ffn", d.ffn, "tp", tp)
    _divides(out, "vocab", d.vocab, "tp", tp)
    return out


# ----------------------------------------------------------------------------- note 04: gpt-model


def _gpt_model_estimate(d: Dims, par) -> mem.Estimate:
    shared = d.vocab * d.hidden   # share_embeddings_and_output_weights: no output layer weight
    return mem.Estimate({
        # this rank's shards, then the whole TP=1 model built next to them for the comparison
        "weights": (mem.stage_weight_elements(d, par.tp) - shared // par.tp
                    + mem.stage_weight_elements(d) - shared) * mem.FP32,
        # use_cpu_initialization builds every master weight whole before cutting this rank's piece
        "cpu init": mem.largest_weight_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _gpt_model_checks(d: Dims, par) -> list[str]:
    return _tp_checks(d, par.tp)


# ----------------------------------------------------------------------------- note 08: rank-generator

ETP = 1  # snippets.experiments.n08_rank_generator.ETP (that module imports torch's world: not here)


def _rank_generator_estimate(d: Dims, par) -> mem.Estimate:
    return mem.Estimate({"runtime": mem.RUNTIME_BYTES[par.device]})  # no tensors, only groups


def _rank_generator_checks(d: Dims, par) -> list[str]:
    expert_ranks = par.world // (ETP * par.pp)
    if expert_ranks % par.ep:
        return [f"ep {par.ep} does not divide the {expert_ranks} ranks left for experts "
                f"(world size {par.world} / (etp {ETP} * pp {par.pp}))"]
    return []


# ----------------------------------------------------------------------------- note 19: model-topic

EXPERTS = 2  # snippets.experiments.n19_model_topic.EXPERTS


def _moe_extra_elements(d: Dims, tp: int) -> int:
    """What the MoE variant adds per layer: ``EXPERTS - 1`` more MLPs (split by ETP = TP) and the
    router's ``[EXPERTS, hidden]`` weight."""
    fc1_out = d.ffn * (2 if d.swiglu else 1)
    mlp = (d.hidden * fc1_out + d.ffn * d.hidden + (fc1_out if d.bias else 0)) // tp + (d.hidden if d.bias else 0)
    return (EXPERTS - 1) * mlp + EXPERTS * d.hidden


def _model_topic_estimate(d: Dims, par) -> mem.Estimate:
    qk = dataclasses.replace(d, rmsnorm=True, qk_norm=True)
    largest = max(mem.stage_weight_elements(d, par.tp) + d.layers * _moe_extra_elements(d, par.tp),
                  mem.stage_weight_elements(qk, par.tp))
    return mem.Estimate({
        "weights": largest * mem.FP32,   # one of the three models at a time (untied output layer)
        "cpu init": 0 if par.cuda else mem.largest_weight_elements(d) * mem.FP32,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _model_topic_checks(d: Dims, par) -> list[str]:
    out = _tp_checks(d, par.tp)
    if d.bias and par.tp > 1:
        out.append(f"the MoE variant with linear bias needs tp 1 (TransformerConfig allows bias in "
                   f"MoE only at expert tp 1, and expert tp follows tp {par.tp}); use a preset "
                   f"without bias")
    return out


_NO_BATCH = ("micro_batch_size", "microbatches")

ENTRIES: list = [
    Experiment(
        name="gpt-model", note="04_model_provider_and_gpt_model",
        what="a real GPTModel as gpt_builder builds it (local spec, shared embeddings) under TP: every "
             "parameter's global and per-rank local shape, partition_dim / stride, equal to the TP=1 "
             "model's piece, parameters per rank",
        module="snippets.experiments.n04_gpt_model",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32, layers=1,
                  seq=8, micro_batch_size=1, microbatches=1, swiglu=True),
        uses=("tp",), estimate=_gpt_model_estimate, checks=_gpt_model_checks, example="--tp 2",
        unused=_NO_BATCH),
    Experiment(
        name="rank-generator", note="08_parallel_state_and_rank_generator",
        what="the real initialize_model_parallel with experts (expert tp 1): every rank's decoder and "
             "expert coordinates and groups, each kind of group against RankGenerator.get_ranks",
        module="snippets.experiments.n08_rank_generator",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1, layers=1,
                  seq=1, micro_batch_size=1, microbatches=1),
        uses=("tp", "pp", "cp", "ep"), estimate=_rank_generator_estimate, checks=_rank_generator_checks,
        example="--tp 2 --pp 2 --ep 2", unused=presets.OVERRIDES),
    Experiment(
        name="model-topic", note="19_model_topic",
        what="one config with three layer specs (local, MoE, RMSNorm + QK norm) built as GPTModels "
             "under TP: module counts, where the module trees differ, the expert linears' flags",
        module="snippets.experiments.n19_model_topic",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32, layers=1,
                  seq=8, micro_batch_size=1, microbatches=1, bias=False),
        uses=("tp",), estimate=_model_topic_estimate, checks=_model_topic_checks, example="--tp 2",
        unused=_NO_BATCH),
]
