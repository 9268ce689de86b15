"""How much memory one rank of each experiment needs, one function per registry entry.

``needs.<entry>(dims, par)`` returns a :class:`snippets.models.memory_estimate.Estimate` -- bytes
by part (weights, gradients, activations, ...) -- built from that module's formulas and what the
experiment keeps alive at its peak. The runner compares it with this rank's memory before it
starts anything (:func:`snippets.ranks.runner.memory_verdict`).

Torch-free, like the whole registry (:mod:`snippets.experiments.registry`).
"""

from __future__ import annotations

import dataclasses

from snippets.experiments.checks import EXPERTS, RESUME_ITERATIONS, load_tps, resume_dp_sizes
from snippets.models import memory_estimate as mem
from snippets.models.memory_estimate import cpu_init, runtime, whole_model_step
from snippets.models.presets import Dims
from snippets.ranks.parallel_dims import ParallelDims

BF16, INT64 = 2, 8


def groups_only(d: Dims, par: ParallelDims) -> mem.Estimate:
    """``groups``, ``rank-generator``: no tensors, only process groups."""
    return mem.Estimate(runtime(par))


def overview(d: Dims, par: ParallelDims) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate(
        {
            # the model, its copy at the start (how far it moved) and the trained copy checked after reload
            "weights": 3 * weights,
            "gradients": weights,  # DDP's main_grad buffer (param.grad is None, or aliases it)
            "optimizer": 2 * weights,  # the fixed run's Adam moments (the published Adam makes none)
            "checkpoint": 0 if par.cuda else weights,  # writers' / readers' buffers (host memory on a GPU)
            "cpu init": cpu_init(d, par),
            # one micro-batch in flight (no pipeline); dropout 0.1 keeps a byte mask per element
            "activations": whole_model_step(d, par.tp)["activations"]
            + d.layers
            * (mem.attention_scores_elements(d, par.tp) + 2 * d.seq * d.micro_batch_size * d.hidden),
            "logits": mem.logits_elements(d, par.tp) * mem.FP32,
            **runtime(par),
        }
    )


def batch_flow(d: Dims, par: ParallelDims) -> mem.Estimate:
    return mem.Estimate(
        {
            # note 03's corpus (15/8 seq tokens, int32) and the index tables of a few samples
            "dataset": 2 * d.seq * 4 + 8 * (d.micro_batch_size * d.microbatches + 1) * INT64,
            # the samples DataLoader collates, the micro-batch, the receivers' buffers, the CP slices
            "batch": 4 * mem.micro_batch_bytes(d),
            **runtime(par),
        }
    )


def gpt_model(d: Dims, par: ParallelDims) -> mem.Estimate:
    shared = d.vocab * d.hidden  # share_embeddings_and_output_weights: no output layer weight
    return mem.Estimate(
        {
            # this rank's shards, then the whole TP=1 model built next to them for the comparison
            "weights": (
                mem.stage_weight_elements(d, par.tp)
                - shared // par.tp
                + mem.stage_weight_elements(d)
                - shared
            )
            * mem.FP32,
            # use_cpu_initialization builds every master weight whole before cutting this rank's piece
            "cpu init": mem.largest_weight_elements(d) * mem.FP32,
            **runtime(par),
        }
    )


def loss(d: Dims, par: ParallelDims) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate(
        {
            "weights": weights,
            "gradients": weights,
            "cpu init": cpu_init(d, par),
            **whole_model_step(d, par.tp),
            **runtime(par),
        }
    )


def dist_optimizer(d: Dims, par: ParallelDims) -> mem.Estimate:
    """``train-step`` and ``dist-optimizer``: fp32 Adam's two moments, unsharded (the first run)
    -- the sharded run needs less."""
    n = mem.stage_weight_elements(d)
    return mem.Estimate(
        {
            "weights": n * mem.FP32,
            "gradients": 2 * n * mem.FP32,  # .grad while it is added into the grad buffer
            "optimizer": 2 * n * mem.FP32,
            "cpu init": cpu_init(d, par),
            **whole_model_step(d),
            **runtime(par),
        }
    )


def checkpoint(d: Dims, par: ParallelDims) -> mem.Estimate:
    tp = min([par.tp, *load_tps(par)])  # the phase with the biggest model share
    weights = mem.stage_weight_elements(d, tp) * mem.FP32
    return mem.Estimate(
        {
            "weights": weights,
            "checkpoint": 0 if par.cuda else weights,  # up to one copy while writing / reading chunks
            "cpu init": cpu_init(d, par),
            # no_grad forwards: one layer's tensors at a time
            "activations": (mem.layer_activation_elements(d, tp) + 2 * mem.attention_scores_elements(d, tp))
            * mem.FP32,
            # whole-vocabulary logits: the saved model's, before and after the load, and one gathering
            "logits": mem.logits_elements(d, 1, copies=4) * mem.FP32,
            **runtime(par),
        }
    )


def mappings(d: Dims, par: ParallelDims) -> mem.Estimate:
    act = d.seq * d.micro_batch_size * d.hidden
    # x, its copy, y (up to tp times x after a gather), dy and its copy, dx; one call at a time
    return mem.Estimate({"activations": (4 + 3 * par.tp) * act * mem.FP32, **runtime(par)})


def linear(d: Dims, par: ParallelDims) -> mem.Estimate:
    hf = d.hidden * d.ffn
    acts = d.seq * d.micro_batch_size * (d.hidden + d.ffn)
    return mem.Estimate(
        {
            # the kept master weight (also our layer's), this rank's shard and its gradient, two layers
            # alive at a time (the real one and ours)
            "weights": 2 * (hf + hf // par.tp) * mem.FP32,
            "gradients": 2 * (hf // par.tp) * mem.FP32,
            "cpu init": 0 if par.cuda else hf * mem.FP32,
            # the full X, G and, per configuration and layer, input, output and their gradients
            "activations": 8 * acts * mem.FP32,
            **runtime(par),
        }
    )


def tp_layer(d: Dims, par: ParallelDims) -> mem.Estimate:
    weights = mem.layer_weight_elements(d, par.tp) * mem.FP32
    return mem.Estimate(
        {
            "weights": weights,
            "gradients": 2 * weights,  # .grad and DDP's main_grad buffer
            "cpu init": cpu_init(d, par, embedding=False),
            "activations": (
                max(mem.layer_activation_elements(d, par.tp, sp) for sp in (False, True))
                + 2 * mem.attention_scores_elements(d, par.tp)
            )
            * mem.FP32,
            **runtime(par),
        }
    )


def vocab(d: Dims, par: ParallelDims) -> mem.Estimate:
    table = d.vocab * d.hidden // par.tp
    tokens = d.seq * d.micro_batch_size
    return mem.Estimate(
        {
            "weights": table * mem.FP32,
            "gradients": table * mem.FP32,
            "cpu init": 0 if par.cuda else d.vocab * d.hidden * mem.FP32,
            # the whole [s, b, V] logits on every rank (each slices its part), the slice, its gradient
            # and the cross entropy's softmax copies; the embedding's [b, s, h] output is small
            "logits": (d.vocab + 4 * d.vocab // par.tp) * tokens * mem.FP32,
            "activations": 4 * tokens * d.hidden * mem.FP32,
            **runtime(par),
        }
    )


def pipeline(d: Dims, par: ParallelDims) -> mem.Estimate:
    weights = mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32
    chunk_layers = d.layers // (par.pp * (par.vp or 1))
    in_flight = mem.in_flight_microbatches(d.microbatches, par.pp, par.vp)
    return mem.Estimate(
        {
            "weights": weights,
            "gradients": weights,
            "cpu init": cpu_init(d, par),
            "activations": (
                in_flight * chunk_layers * mem.layer_activation_elements(d, par.tp, par.sp)
                + 2 * mem.attention_scores_elements(d, par.tp)
            )
            * mem.FP32,
            "logits": mem.logits_elements(d, par.tp) * mem.FP32,
            **runtime(par),
        }
    )


def ddp(d: Dims, par: ParallelDims) -> mem.Estimate:
    weights = mem.stage_weight_elements(d) * mem.FP32
    return mem.Estimate(
        {
            "weights": weights,
            "gradients": 2 * weights,  # .grad while it is added into DDP's main_grad buffer
            "cpu init": cpu_init(d, par),
            **whole_model_step(d),
            **runtime(par),
        }
    )


def cp(d: Dims, par: ParallelDims) -> mem.Estimate:
    qkv = d.seq * d.micro_batch_size * d.heads * d.kv_channels
    scores = d.micro_batch_size * d.heads * d.seq * d.seq
    return mem.Estimate(
        {
            # q, k, v, dout and their full-sequence copies with gradients, the local pieces, the ring's
            # K/V(+dK/dV) buffers; the reference's [b, heads, s, s] scores, probabilities and gradients
            "activations": (16 * qkv + 4 * scores) * mem.FP32,
            **runtime(par),
        }
    )


def moe(d: Dims, par: ParallelDims) -> mem.Estimate:
    experts = 2 * par.ep  # snippets.experiments.n17_moe.EXPERTS_PER_EP_RANK
    expert = 2 * d.hidden * d.ffn
    tokens = d.seq * d.micro_batch_size
    return mem.Estimate(
        {
            # the EP=1 reference layer (every expert) and its state_dict, then two EP layers in turn
            "weights": (2 * experts + 2 * 2) * expert * mem.FP32,
            "gradients": 2 * expert * mem.FP32,
            # each token goes to top-2 experts: the dispatched rows, expert activations and gradients;
            # allgather moves every EP rank's tokens
            "activations": (8 * par.ep * tokens * d.hidden + 8 * tokens * d.ffn) * mem.FP32,
            **runtime(par),
        }
    )


def data_topic(d: Dims, par: ParallelDims) -> mem.Estimate:
    global_batch = d.micro_batch_size * d.microbatches * par.dp
    samples = RESUME_ITERATIONS * global_batch * 3  # train, valid and test splits
    layouts = 1 + len(resume_dp_sizes(d, par))
    return mem.Estimate(
        {
            # note 18's corpus (10 documents of up to 1.5 seq tokens, int32) and the index tables
            "dataset": 15 * d.seq * 4 + 4 * samples * INT64,
            "batch": 2 * mem.micro_batch_bytes(d),
            # the tokens of every micro-batch this rank read, kept for the comparison (DP=1 reads them all)
            "kept tokens": layouts * RESUME_ITERATIONS * global_batch * d.seq * INT64,
            **runtime(par),
        }
    )


def model_topic(d: Dims, par: ParallelDims) -> mem.Estimate:
    qk = dataclasses.replace(d, rmsnorm=True, qk_norm=True)
    largest = max(
        mem.stage_weight_elements(d, par.tp) + d.layers * mem.moe_extra_elements(d, par.tp, EXPERTS),
        mem.stage_weight_elements(qk, par.tp),
    )
    return mem.Estimate(
        {
            "weights": largest * mem.FP32,  # one of the three models at a time (untied output layer)
            "cpu init": cpu_init(d, par),
            **runtime(par),
        }
    )


def optimizer_topic(d: Dims, par: ParallelDims) -> mem.Estimate:
    """The unsharded run is the larger of the two: bf16 weights, the fp32 grad buffer (plus bf16
    ``.grad`` while it is added in), a whole fp32 main copy and Adam's two fp32 moments. The model
    is built in fp32 before ``Float16Module`` casts it, but those 4 bytes per parameter (plus the
    largest matrix that CPU initialization draws whole) come and go before anything else exists."""
    n = mem.stage_weight_elements(d)
    return mem.Estimate(
        {
            "weights": n * BF16,
            "gradients": n * (mem.FP32 + BF16),
            "optimizer": 3 * n * mem.FP32,
            "activations": (
                d.layers * mem.layer_activation_elements(d) + 2 * mem.attention_scores_elements(d)
            )
            * BF16,
            "logits": mem.logits_elements(d) * mem.FP32,
            **runtime(par),
        }
    )


def overlap(d: Dims, par: ParallelDims) -> mem.Estimate:
    """fp32 weights and grad buffer, Adam sharded over DP; the weights right after the last step
    and after the forced all-gather are kept for the comparison, for both runs (four copies)."""
    n = mem.stage_weight_elements(d)
    return mem.Estimate(
        {
            "weights": n * mem.FP32,
            "gradients": 2 * n * mem.FP32,  # .grad while it is added into the grad buffer
            "optimizer": 2 * n // par.dp * mem.FP32,
            "kept copies": 4 * n * mem.FP32,
            "cpu init": cpu_init(d, par),
            **whole_model_step(d),
            **runtime(par),
        }
    )


def ckpt_topic(d: Dims, par: ParallelDims) -> mem.Estimate:
    # one stage, allocated but not initialized (no CPU master weights); the entries are views of it
    return mem.Estimate({"weights": mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32, **runtime(par)})


def refit(d: Dims, par: ParallelDims) -> mem.Estimate:
    policy = mem.stage_weight_elements(d, par.tp, par.pp) * mem.FP32
    rollout = mem.stage_weight_elements(d, par.world, 1) * mem.FP32
    in_flight = mem.in_flight_microbatches(d.microbatches, par.pp)
    return mem.Estimate(
        {
            "weights": policy + rollout,
            "gradients": policy,
            "transfer": rollout,  # receive buffers of swap_model_weights
            "cpu init": cpu_init(d, par),
            "activations": (
                in_flight * -(-d.layers // par.pp) * mem.layer_activation_elements(d, par.tp)
                + 2 * mem.attention_scores_elements(d, par.tp)
            )
            * mem.FP32,
            # full-vocab logits of the prompts: before, after, stale, fresh, and the one in flight
            "logits": mem.logits_elements(d, 1, copies=5) * mem.FP32,
            **runtime(par),
        }
    )


def hf_convert(d: Dims, par: ParallelDims) -> mem.Estimate:
    # weights: policy, gathered TP1 copy, TP2 reverse; rank 0 adds the HF model, a wrong-mapping
    # one, the converted dict and the broadcast checkpoint (4 whole copies)
    policy, whole = (mem.stage_weight_elements(d, *s) * mem.FP32 for s in ((par.tp, par.pp), (1, 1)))
    layers = mem.in_flight_microbatches(d.microbatches, par.pp) * -(-d.layers // par.pp)
    return mem.Estimate({"weights": policy + whole + mem.stage_weight_elements(d, 2, 1) * mem.FP32,
                         "gradients": policy, "conversion": 4 * whole, "cpu init": cpu_init(d, par),
                         "activations": layers * mem.layer_activation_elements(d, par.tp) * mem.FP32,
                         "logits": mem.logits_elements(d, 1, copies=4) * mem.FP32, **runtime(par)})  # fmt: skip


def journey(d: Dims, par: ParallelDims) -> mem.Estimate:
    """Two steps in turn: the in-job reference (TP = PP = 1, the whole model on every rank, the
    whole batch, one micro-batch's activations at a time, Adam sharded over all ranks), then the
    step at ``par``; what the reference keeps for the comparisons (the followed layer's inputs and
    outputs for every micro-batch, copies of the followed weight and its gradient) stays alive."""
    fc1 = d.ffn * (2 if d.swiglu else 1)
    tokens = d.seq * d.micro_batch_size
    tap = tokens * (4 * d.hidden + fc1 + d.ffn)  # layer in/out, fc1 in/out, fc2 in/out
    copies = 6 * fc1 * d.hidden  # dense, initial, updated, local, reduced, DP-mean grads

    whole = mem.stage_weight_elements(d)
    # weights, the grad buffer and .grad while it is added in, Adam sharded over all ranks
    reference = (3 * whole + 2 * whole // par.world) * mem.FP32 + sum(whole_model_step(d).values())
    kept = (d.microbatches * tap + copies) * mem.FP32

    n = mem.stage_weight_elements(d, par.tp, par.pp)
    m = d.microbatches // par.dp
    parts = {
        "weights": n * mem.FP32,
        "gradients": 2 * n * mem.FP32,  # the grad buffer, and .grad while it is added in
        "optimizer": 2 * n // par.dp * mem.FP32,
        "activations": (
            mem.in_flight_microbatches(m, par.pp)
            * (d.layers // par.pp)
            * mem.layer_activation_elements(d, par.tp, par.sp)
            + 2 * mem.attention_scores_elements(d, par.tp)
        )
        * mem.FP32,
        "logits": mem.logits_elements(d, par.tp) * mem.FP32,
        "taps and copies": (m * tap + copies // par.tp) * mem.FP32,
    }
    parts["reference step beyond that"] = max(0, reference - sum(parts.values()))
    parts["kept from the reference"] = kept
    # CPU init builds the largest matrix whole, and init_full_then_shard draws it whole again
    parts["cpu init"] = 0 if par.cuda else 2 * mem.largest_weight_elements(d) * mem.FP32
    parts["runtime"] = mem.RUNTIME_BYTES[par.device]
    return mem.Estimate(parts)


def rng(d: Dims, par: ParallelDims) -> mem.Estimate:  # tp_layer's layer, two .grad sets (this run, plain)
    kept = 4 * d.seq * d.micro_batch_size * d.hidden * mem.FP32  # y, x.grad: plain run's, this one's
    return mem.Estimate({**tp_layer(d, par).parts, "kept to compare": kept})


def gpu_only(d: Dims, par: ParallelDims) -> mem.Estimate:  # note 28: note 11's layer, then a bf16 MoE model
    moe = d.layers * (4 * d.hidden * d.heads * d.kv_channels + 4 * d.hidden * d.ffn) + 2 * d.vocab * d.hidden
    return mem.Estimate({**tp_layer(d, par).parts, "moe model": moe * (2 * BF16 + mem.FP32)})
