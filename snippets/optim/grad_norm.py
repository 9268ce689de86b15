"""Which gradients Megatron's grad norm counts on each rank, and the norm they add up to (note 20).

The norm is over the *model's* gradients, one value per parameter element. When the model is
split, every rank holds some of them, and some more than once:

* a parameter that tensor parallelism does not split (a LayerNorm weight, the position
  embedding) is a full copy on every TP rank, with the same gradient;
* with PP > 1 and tied embeddings, the last stage holds a second copy of the word embedding
  (``output_layer.weight``), whose gradient ``finalize_model_grads`` makes equal to the first
  stage's.

``MegatronOptimizer._filter_grads_for_norm`` (called by ``get_grads_for_grad_norm``; before 0.19.0
``get_main_grads_for_grad_norm``) keeps a gradient only if ``param_is_not_shared`` (no
``shared=True`` attribute) and ``param_is_not_tensor_parallel_duplicate`` (split by TP, or this is
TP rank 0) -- and ``param_is_not_gtp_duplicate``, always true without GTP weight remat; each rank then
sums the squares of what it kept and ``get_grad_norm_fp32`` all-reduces the sums.
:func:`norm_rows` asks Megatron's own two predicates about every parameter of a rank;
:func:`total_norm` adds the kept squares of all ranks the way ``get_grad_norm_fp32`` does, and
:func:`naive_norm` adds them all, duplicates included.

:func:`init_full_by_global_name` gives a TP / PP split model the weights of the unsplit one, so
the norms can be compared with a single process: like ``tiny_gpt.init_by_global_name`` it seeds
by the parameter's global name, but it draws the *full* tensor and keeps this TP rank's shard
(the same chunks ``use_cpu_initialization`` hands out), and a tied output layer gets the word
embedding's values.
"""

from __future__ import annotations

import math
import zlib

import torch

from snippets.models.tiny_gpt import global_name

TIED = "embedding.word_embeddings.weight"


def shard(full: torch.Tensor, dim: int, stride: int, rank: int, size: int) -> torch.Tensor:
    """TP rank ``rank``'s part of ``full``: chunks ``rank, rank + size, ...`` of ``size·stride``."""
    chunks = full.chunk(size * stride, dim=dim)
    return torch.cat([chunks[rank + k * size] for k in range(stride)], dim=dim)


def init_full_by_global_name(model, tp_rank: int, tp_size: int, std: float = 0.2) -> None:
    """Set every parameter to its shard of a full tensor drawn from a generator seeded by its
    global name (a tied ``output_layer.weight`` is drawn as the word embedding)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            full_name = global_name(model, name)
            if full_name.endswith("output_layer.weight") and getattr(param, "shared_embedding", False):
                full_name = TIED
            split = getattr(param, "tensor_model_parallel", False)
            shape = list(param.shape)
            if split:
                shape[param.partition_dim] *= tp_size
            gen = torch.Generator().manual_seed(zlib.crc32(full_name.encode()))
            values = torch.randn(shape, generator=gen) * std
            if full_name.endswith("layernorm.weight"):
                values += 1.0
            if split:
                values = shard(
                    values, param.partition_dim, getattr(param, "partition_stride", 1), tp_rank, tp_size
                )
            param.copy_(values)


def norm_rows(model, grad: str = "main_grad") -> list[dict]:
    """Per parameter of this rank: its TP / sharing attributes, Megatron's two predicates, and
    the sum of squares of its gradient (``param.main_grad`` after DDP, or ``param.grad``)."""
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    rows = []
    for name, param in model.named_parameters():
        not_duplicate = param_is_not_tensor_parallel_duplicate(param)
        not_shared = param_is_not_shared(param)
        g = getattr(param, grad)
        rows.append(
            dict(
                name=global_name(model, name),
                tensor_model_parallel=bool(getattr(param, "tensor_model_parallel", False)),
                shared=bool(getattr(param, "shared", False)),
                not_tp_duplicate=not_duplicate,
                not_shared=not_shared,
                counted=not_duplicate and not_shared,
                sumsq=g.double().pow(2).sum().item(),
            )
        )
    return rows


def total_norm(rows_per_rank: list[list[dict]]) -> float:
    """sqrt of the kept squares of every rank: what ``get_grad_norm_fp32`` all-reduces."""
    return math.sqrt(sum(r["sumsq"] for rows in rows_per_rank for r in rows if r["counted"]))


def naive_norm(rows_per_rank: list[list[dict]]) -> float:
    """The same sum without the filter: every duplicate counted again."""
    return math.sqrt(sum(r["sumsq"] for rows in rows_per_rank for r in rows))


def one_process_norm(grads: dict) -> float:
    """The grad norm of an unsplit model: ``{name: grad}`` of one process."""
    return math.sqrt(sum(g.double().pow(2).sum().item() for g in grads.values()))
