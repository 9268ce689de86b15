"""How much memory one rank of an experiment needs, and whether this machine has it.

``python -m snippets.run`` calls this in every rank *before* ``init_process_group``: every rank
computes the same estimate from the same sizes, so either all of them start or all of them refuse
(exit status 2, one line), and no job is left half started.

The estimate counts what the experiments keep at their peak, in fp32 (the experiments build
Megatron's default ``params_dtype``), as formulas of the sizes:

* **weights** -- one rank's share of the parameters: TP-split matrices divided by ``tp``, norms
  (and row-parallel biases) whole, pipeline stages holding ``layers / pp`` layers and, on the first
  and last stage, the embedding and the output layer (vocab split by ``tp``);
* **gradients** -- ``.grad`` of every weight, plus DDP's ``main_grad`` buffer where the experiment
  wraps the model in ``DistributedDataParallel``;
* **activations** -- what autograd saves for backward in one layer for one micro-batch (the
  tensors of :func:`layer_activation_elements`, with the local spec's unfused attention, whose
  ``[b, heads/tp, s, s]`` probabilities dominate at long sequences), times the layers and
  micro-batches a rank holds at once, plus the two score tensors the running layer adds;
* **logits** -- ``[s, b, vocab/tp]`` on the last stage, three copies (logits, the softmax inside
  ``vocab_parallel_cross_entropy``, their gradient);
* **runtime** -- the process itself: torch and megatron.core on a CPU rank (350-510 MiB measured,
  ``CPU_FACTS.md``), the CUDA context and NCCL buffers on a GPU.

It is an estimate, not a measurement: allocator caching and short-lived temporaries come on top,
so a job that fits only just may still run out. It exists to refuse the hopeless cases at once --
Qwen3-8B in fp32 on a laptop -- instead of after minutes of initialization.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from snippets.models.presets import Dims

GiB = 1024**3
FP32 = 4

RUNTIME_BYTES = {"cpu": int(0.5 * GiB), "cuda": int(1.5 * GiB)}
"""Memory a rank uses before it holds any tensor of the experiment (see the module docstring)."""


@dataclass(frozen=True)
class Estimate:
    """Bytes one rank needs, by part (``{"weights": ..., "activations": ...}``)."""

    parts: dict

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def describe(self) -> str:
        """``~1.23 GiB (weights 0.39 + gradients 0.78 + ...)`` for the runner's one-line report."""
        detail = " + ".join(f"{name} {gib(n)}" for name, n in self.parts.items() if n)
        return f"~{gib(self.total)} GiB ({detail})"


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


# ----------------------------------------------------------------------------- what a rank holds


def layer_weight_elements(d: Dims, tp: int = 1) -> int:
    """Parameters of one layer on one TP rank (``snippets.tp.layer_walk.param_counts`` summed)."""
    h, kv, norm = d.hidden, d.kv_channels, (1 if d.rmsnorm else 2)
    qkv_out, fc1_out = (d.heads + 2 * d.query_groups) * kv, d.ffn * (2 if d.swiglu else 1)
    split = h * qkv_out + d.heads * kv * h + h * fc1_out + d.ffn * h
    split += (qkv_out + fc1_out) if d.bias else 0  # column-parallel biases are split
    whole = 2 * norm * h + (2 * norm * kv if d.qk_norm else 0) + (2 * h if d.bias else 0)
    return split // tp + whole


def largest_weight_elements(d: Dims, embedding: bool = True) -> int:
    """The biggest single full (TP=1) matrix: CPU initialization builds it whole on every rank
    before slicing (``_initialize_affine_weight_cpu``); with ``embedding``, the vocabulary's too."""
    fc1_out = d.ffn * (2 if d.swiglu else 1)
    return max(
        d.hidden * fc1_out,
        d.hidden * (d.heads + 2 * d.query_groups) * d.kv_channels,
        d.vocab * d.hidden if embedding else 0,
    )


def stage_weight_elements(d: Dims, tp: int = 1, pp: int = 1) -> int:
    """Parameters on the fullest pipeline stage: ``ceil(layers / pp)`` layers, plus the embedding
    (first stage) or the output layer and final norm (last stage); with ``pp == 1`` both."""
    layers = -(-d.layers // pp)
    embedding = d.vocab * d.hidden // tp + (0 if d.rope else d.seq * d.hidden)
    output = d.vocab * d.hidden // tp + d.hidden * (1 if d.rmsnorm else 2)
    ends = embedding + output if pp == 1 else max(embedding, output)
    return layers * layer_weight_elements(d, tp) + ends


def layer_activation_elements(d: Dims, tp: int = 1, sequence_parallel: bool = False) -> int:
    """Elements one layer keeps for backward for one micro-batch (local spec, unfused attention).

    Per token: seven hidden-sized tensors outside the TP region (layer input, norm inputs and
    outputs, residuals; split by ``tp`` under sequence parallel), and inside it this rank's share of
    the QKV output, the per-head Q/K/V copies the attention's batched matmuls keep (four of them
    with QK norm or grouped queries, else only the context), ``linear_fc1``'s output and the
    activation's inputs and output. Per sequence: the ``[heads/tp, s, s]`` attention probabilities.
    Counted from the tensors autograd saves in a real layer (``saved_tensors_hooks``): within
    -6 % / +35 % of them for the sizes ``tests/experiments/test_memory_estimate.py`` measures.
    """
    tokens = d.seq * d.micro_batch_size
    kv, heads = d.kv_channels, d.heads
    outside = 7 * d.hidden // (tp if sequence_parallel else 1)
    qkv = (heads + 2 * d.query_groups) * kv
    per_head = heads * kv * (4 if d.qk_norm or d.query_groups < heads else 1)
    mlp = d.ffn * (2 if d.swiglu else 1) + d.ffn * (3 if d.swiglu else 1)
    inside = (qkv + per_head + mlp) // tp
    return tokens * (outside + inside) + attention_scores_elements(d, tp)


def attention_scores_elements(d: Dims, tp: int = 1) -> int:
    """One ``[b, heads/tp, s, s]`` tensor: what unfused attention keeps per layer, and what each of
    its two short-lived companions (raw scores, masked scores) costs while a layer runs."""
    return d.micro_batch_size * max(d.heads // tp, 1) * d.seq * d.seq


def logits_elements(d: Dims, tp: int = 1, copies: int = 3) -> int:
    """``[s, b, vocab/tp]`` logits of one micro-batch, ``copies`` times."""
    return copies * d.seq * d.micro_batch_size * d.vocab // tp


def in_flight_microbatches(microbatches: int, pp: int, vp: int | None = None) -> int:
    """Micro-batches whose activations stage 0 holds at the peak of a 1F1B schedule: ``pp`` (warm-up
    plus the first steady forward), ``m`` if fewer; interleaved, counted in model chunks."""
    if not vp or vp == 1:
        return min(microbatches, pp)
    return min(microbatches * vp, (pp - 1) * 2 + (vp - 1) * pp + 1)


# ----------------------------------------------------------------------------- what this machine has


def available_bytes(cuda: bool, local_rank: int = 0, local_world_size: int = 1) -> tuple[int, str]:
    """Memory this rank may use, and how that was found.

    With CUDA: the free memory of this rank's GPU (``torch.cuda.mem_get_info``). Without: the host's
    available RAM (``psutil``) shared by the ranks on this host (``LOCAL_WORLD_SIZE``).
    """
    if cuda:
        import torch

        free, _ = torch.cuda.mem_get_info(local_rank)
        return free, f"free on cuda:{local_rank}"
    import psutil

    host = psutil.virtual_memory().available
    return host // local_world_size, (
        f"{gib(host)} GiB available host RAM / {local_world_size} rank(s) on this host"
    )


def local_world() -> tuple[int, int]:
    """``(LOCAL_RANK, LOCAL_WORLD_SIZE)`` as ``torchrun`` sets them; ``(0, 1)`` without it."""
    return int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


__all__ = [
    "Estimate",
    "GiB",
    "RUNTIME_BYTES",
    "attention_scores_elements",
    "available_bytes",
    "gib",
    "in_flight_microbatches",
    "largest_weight_elements",
    "layer_activation_elements",
    "layer_weight_elements",
    "local_world",
    "logits_elements",
    "stage_weight_elements",
    "cpu_init",
    "runtime",
    "whole_model_step",
]


# ----------------------------------------------------------------- shared by the experiments' estimates


def cpu_init(d: Dims, par, embedding: bool = True) -> int:
    """``use_cpu_initialization`` draws the largest master weight whole before cutting this rank's
    piece; on a GPU that happens on the device and is counted with the weights."""
    return 0 if par.cuda else largest_weight_elements(d, embedding) * FP32


def whole_model_step(d: Dims, tp: int = 1) -> dict:
    """One micro-batch through every layer of a model on one stage: activations and logits."""
    return {
        "activations": (d.layers * layer_activation_elements(d, tp) + 2 * attention_scores_elements(d, tp))
        * FP32,
        "logits": logits_elements(d, tp) * FP32,
    }


def runtime(par) -> dict:
    return {"runtime": RUNTIME_BYTES[par.device]}


def micro_batch_bytes(d: Dims) -> int:
    """One micro-batch as ``GPTDataset`` makes it: the ``[b, 1, s, s]`` bool mask and four ``[b, s]``
    fields (int64, the loss mask float32 counted as int64)."""
    return d.micro_batch_size * (d.seq * d.seq * 1 + 4 * d.seq * 8)  # bool 1 byte, int64 8


def moe_extra_elements(d: Dims, tp: int, experts: int) -> int:
    """What the MoE variant adds per layer: ``experts - 1`` more MLPs (split by ETP = TP) and the
    router's ``[experts, hidden]`` weight."""
    fc1_out = d.ffn * (2 if d.swiglu else 1)
    mlp = (d.hidden * fc1_out + d.ffn * d.hidden + (fc1_out if d.bias else 0)) // tp + (
        d.hidden if d.bias else 0
    )
    return (experts - 1) * mlp + experts * d.hidden
