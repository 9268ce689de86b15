"""Readable references for note 12: what vocab-parallel cross entropy with label smoothing
*should* compute, and what each tensor-parallel rank of Megatron 0.19.0 *does* compute.

``megatron.core.tensor_parallel.vocab_parallel_cross_entropy`` states its smoothed target in a
comment: probability ``1 - alpha`` on the label and ``alpha / (K - 1)`` on each of the other
``K - 1`` classes, ``K`` the vocabulary size. :func:`smoothed_loss` is that definition over the
whole vocabulary. At TP > 1 the function instead uses, on each rank, its own shard's width as
``K`` and the mean log-probability of its own shard only; :func:`smoothed_loss_on_rank`
reproduces that, term for term, so a note can show where the numbers come from.
(``tests/ranks/test_vocab_parallel.py`` checks both against the real function.)

Both take full logits ``[..., K]`` and labels ``[...]`` and are differentiable.
"""

from __future__ import annotations

import torch


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, alpha: float) -> torch.Tensor:
    """Cross entropy against the target ``(1 - alpha)`` on the label, ``alpha / (K - 1)`` elsewhere."""
    k = logits.shape[-1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    q = torch.full_like(log_p, alpha / (k - 1))
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - alpha)
    return -(q * log_p).sum(-1)


def smoothed_loss_on_rank(
    logits: torch.Tensor, target: torch.Tensor, alpha: float, tp: int, rank: int
) -> torch.Tensor:
    """The loss rank ``rank`` of ``tp`` returns: the smoothing weight and the mean log-probability
    are taken over this rank's contiguous vocabulary shard, as if the shard were the vocabulary."""
    log_p = torch.log_softmax(logits.float(), dim=-1)  # the softmax itself is global
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # so is the plain cross entropy
    shard = log_p.chunk(tp, dim=-1)[rank]
    k_local = shard.shape[-1]
    smoothing = alpha * k_local / (k_local - 1)
    return (1.0 - smoothing) * nll - smoothing * shard.mean(-1)


__all__ = ["smoothed_loss", "smoothed_loss_on_rank"]
