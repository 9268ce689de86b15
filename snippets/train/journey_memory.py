"""Memory of one rank in note 23's step: predicted from the config, and read from the real objects.

* :func:`memory_formula` predicts, per rank and from the config alone, the bytes of weights, grads,
  fp32 main params, Adam state and peak activations (:func:`layer_activation_bytes` per layer,
  :func:`stage_activation_bytes` per pipeline stage with :func:`in_flight` micro-batches held);
* :class:`SavedActivations` measures activation memory the way autograd holds it: every tensor
  saved for backward (``torch.autograd.graph.saved_tensors_hooks``), counted once per storage,
  excluding parameters and the batch itself, with the peak over the step;
* :func:`measured_memory` reads the formula's columns from the real objects (activations as
  :class:`SavedActivations` counts them); ``tests/ranks/test_journey.py`` holds the two equal.

Where a tensor is (which rank holds which slice) is :mod:`snippets.train.journey`; neither module
imports the other.
"""

from __future__ import annotations

import torch

from snippets.dp import grad_buffers


def _sizes(config):
    h, a = config.hidden_size, config.num_attention_heads
    g = config.num_query_groups or a
    d = config.kv_channels or h // a
    return h, a, g, d, config.ffn_hidden_size


def _check_supported(config):
    # The activation count below is for what this site's tiny GPT uses; other choices save other
    # tensors (SwiGLU keeps both halves, RMSNorm one statistic, dropout its masks, ...).
    bad = [
        name
        for name, wrong in (
            ("gated_linear_unit", config.gated_linear_unit),
            ("add_bias_linear", config.add_bias_linear),
            ("normalization != LayerNorm", config.normalization != "LayerNorm"),
            ("hidden_dropout > 0", config.hidden_dropout > 0),
            ("attention_dropout > 0", config.attention_dropout > 0),
            ("recompute", config.recompute_granularity is not None),
            ("params not fp32", config.params_dtype != torch.float32),
        )
        if wrong
    ]
    if bad:
        raise ValueError(f"activation formula not derived for: {', '.join(bad)}")


def layer_activation_bytes(config, seq: int, mbs: int) -> dict[str, int]:
    """Bytes one ``TransformerLayer`` (local spec) saves for backward for one micro-batch, by the
    module that saves them; fp32 (4 bytes), LayerNorm, GELU, no bias, no dropout.

    ``t`` is the TP size; with sequence parallel the tensors outside the TP region (norm inputs
    and statistics, the inputs of ``linear_qkv`` / ``linear_fc1``, which keep only their shard and
    all-gather again in backward) are ``s/t`` long, without it ``s`` long.
    """
    _check_supported(config)
    h, a, g, d, f = _sizes(config)
    t = config.tensor_model_parallel_size
    tsp = t if config.sequence_parallel else 1
    s, b = seq, mbs
    return {
        # each LayerNorm: its input [s/tsp, b, h] and mean, rstd [s/tsp, b, 1]
        "norms": 4 * 2 * (s * b * h + 2 * s * b) // tsp,
        # linear_qkv and linear_fc1 keep their input (the norm's output) for the weight gradient
        "qkv, fc1 inputs": 4 * 2 * s * b * h // tsp,
        # core attention keeps q, k, v: with a == g they are views of the fused qkv output, whose
        # storage [s, b, 3·a·d/t] stays alive; with GQA (a > g) it keeps a copy of q and k, v
        # repeated to all a heads (repeat_interleave copies) -- the same 3·a·d/t either way
        "q, k, v": 4 * s * b * 3 * a * d // t,
        "softmax": 4 * b * (a // t) * s * s,
        # linear_proj keeps the attention context, GELU its input, linear_fc2 GELU's output
        "proj input": 4 * s * b * a * d // t,
        "fc1 output, gelu output": 4 * 2 * s * b * f // t,
    }


def stage_activation_bytes(
    config, seq: int, mbs: int, vocab: int, pre_process: bool, post_process: bool
) -> dict[str, int]:
    """Bytes one pipeline stage saves for one micro-batch: its layers, plus what the embedding
    (first stage) and the final norm, output layer and vocab-parallel cross entropy (last stage)
    keep."""
    t = config.tensor_model_parallel_size
    tsp = t if config.sequence_parallel else 1
    h = config.hidden_size
    s, b = seq, mbs
    layers = config.num_layers // config.pipeline_model_parallel_size
    out = {"layers": layers * sum(layer_activation_bytes(config, seq, mbs).values())}
    if pre_process:
        # with TP>1 the embedding masks token ids outside this rank's vocab shard: it keeps the
        # shifted ids (int64) and the mask (bool); with TP=1 it keeps the tokens (the batch itself)
        out["embedding"] = (8 + 1) * s * b if t > 1 else 0
    if post_process:
        out["final norm"] = 4 * (s * b * h + 2 * s * b) // tsp
        out["output layer input"] = 4 * s * b * h // tsp
        # cross entropy: softmax over this rank's vocab shard, the target mask (bool) and the
        # shifted targets (int64)
        out["cross entropy"] = 4 * s * b * vocab // t + (1 + 8) * s * b
    return out


def in_flight(pp: int, pp_rank: int, microbatches: int) -> int:
    """Micro-batches whose activations a 1F1B stage holds at once: its warm-up forwards plus the
    one of the first steady step, ``pp - pp_rank``, but never more than there are."""
    return min(pp - pp_rank, microbatches)


def stage_param_sizes(config, vocab: int, seq: int, pre_process: bool, post_process: bool) -> list[int]:
    """Elements of each parameter of one stage on one TP rank, in the model's order (the order
    DDP reverses into its buffer): embedding, then per layer input norm, ``linear_proj``,
    ``linear_qkv``, pre-MLP norm, ``linear_fc1``, ``linear_fc2``, then final norm, output layer."""
    _check_supported(config)
    h, a, g, d, f = _sizes(config)
    t = config.tensor_model_parallel_size
    sizes = []
    if pre_process:
        sizes += [vocab // t * h, seq * h]
    for _ in range(config.num_layers // config.pipeline_model_parallel_size):
        sizes += [h, h, h * a * d // t, (a + 2 * g) * d // t * h, h, h, f // t * h, h * f // t]
    if post_process:
        sizes += [h, h, vocab // t * h]
    return sizes


def memory_formula(
    config, vocab: int, seq: int, mbs: int, microbatches: int, dp: int, pp_rank: int, dp_rank: int
) -> dict[str, int]:
    """Bytes one rank holds in one step with DDP + the distributed optimizer (fp32, Adam):

    * weights, grads: DDP's param and grad buffers, padded as the distributed optimizer asks
      (:func:`snippets.dp.grad_buffers.layout`), 4 bytes each;
    * fp32 main params: 0 -- fp32 weights are sharded as views, not copied;
    * exp_avg + exp_avg_sq: 8 bytes for each real parameter element in this DP rank's shard;
    * activations: :func:`stage_activation_bytes` times :func:`in_flight`.
    """
    pp = config.pipeline_model_parallel_size
    pre, post = pp_rank == 0, pp_rank == pp - 1
    sizes = stage_param_sizes(config, vocab, seq, pre, post)
    lay = grad_buffers.layout(sizes, None, dp, distributed_optimizer=True)
    owned = 0
    for b0, b1 in (shards[dp_rank] for shards in lay.shards(dp)):
        owned += sum(max(0, min(end, b1) - max(start, b0)) for start, end, _ in lay.param_ranges)
    acts = sum(stage_activation_bytes(config, seq, mbs, vocab, pre, post).values())
    weights = 4 * lay.numel
    out = dict(
        weights=weights,
        grads=4 * lay.numel,
        main_params=0,
        adam_state=8 * owned,
        activations=in_flight(pp, pp_rank, microbatches) * acts,
    )
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------ activations as autograd holds them


class _Held:
    """What autograd keeps instead of a saved tensor while a :class:`SavedActivations` is active;
    when autograd drops it (after the backward that used it), the storage's count goes down."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor, meter, key):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self):
        self.meter._release(self.key)


class SavedActivations:
    """Bytes of the tensors autograd saves for backward, live and at their peak, on this rank.

    Counted once per storage (a view saved twice, or q and k cut from one fused qkv output, hold
    one storage). Not counted: parameters (their storage is DDP's buffer) and tensors whose
    storage is in ``exclude`` (the micro-batches: the data loader holds them anyway). Used as a
    context manager around the schedule call: ``with SavedActivations(model, batches) as acts:``,
    then ``acts.peak``, and ``acts.saved_by_label``: bytes first saved inside a
    ``TransformerLayer`` (``"layers"``) or elsewhere (``"other"``), summed over the step.
    """

    def __init__(self, model, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.exclude |= {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.layers = [m for m in model.modules() if type(m).__name__ == "TransformerLayer"]
        self.live: dict[int, list[int]] = {}  # storage ptr -> [handles alive, bytes]
        self.now = 0
        self.peak = 0
        self.saved_by_label: dict[str, int] = {}
        self._labels = ["other"]
        self._handles = []
        self._hooks = None

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude:
            return tensor
        entry = self.live.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
            label = self._labels[-1]
            self.saved_by_label[label] = self.saved_by_label.get(label, 0) + entry[1]
        entry[0] += 1
        return _Held(tensor, self, key)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]

    def __enter__(self):
        for layer in self.layers:
            self._handles.append(
                layer.register_forward_pre_hook(lambda mod, args: self._labels.append("layers"))
            )
            self._handles.append(
                layer.register_forward_hook(lambda mod, args, out: self._labels.pop() and None)
            )
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()


def measured_memory(ddp, optimizer, activations: SavedActivations) -> dict[str, int]:
    """The same five columns as :func:`memory_formula`, read from the real objects of one rank."""
    from snippets.optim.optimizer_memory import measured_bytes

    m = measured_bytes(ddp, optimizer)
    out = dict(
        weights=m["weights"],
        grads=m["grads"],
        main_params=m["main_weights"],
        adam_state=m["adam_state"],
        activations=activations.peak,
    )
    out["total"] = sum(out.values())
    return out
