"""Ring attention for context parallelism (CP), short enough to read in one sitting.

With ``context_parallel_size > 1`` Megatron gives each CP rank only a slice of the sequence
(``get_batch_on_this_cp_rank``: chunks ``cp_rank`` and ``2*cp_size-1-cp_rank`` of ``2*cp_size``),
yet every query must still attend to every earlier key of the *whole* sequence. Megatron does not
do this itself: ``TEDotProductAttention`` hands ``cp_group`` and ``cp_comm_type="p2p"`` to
Transformer Engine, whose kernel passes K/V blocks around the CP group in a ring. Transformer
Engine needs a GPU, so this module is a plain-torch version of the same idea, for CPU ranks:

* **forward** -- ``cp_size`` steps. At step ``i`` a rank holds the K/V of CP rank
  ``(cp_rank - i) % cp_size``, attends its local queries to it under the causal mask (by *global*
  position), and merges the partial result into its running output with the log-sum-exp trick
  (``softmax_lse``), so the result is exactly softmax over all keys. Meanwhile it sends the block
  it holds to ``cp_rank + 1`` and receives the next one from ``cp_rank - 1``.
* **backward** -- the same ring again. Each rank adds its queries' contribution to ``dK``/``dV``
  of the block it holds and passes block *and* gradient on; after ``cp_size`` hops the gradient
  has visited every rank and is back at the block's owner.

Layout follows Megatron's core attention: ``q, k, v`` are ``[s_local, b, np, hn]`` (sequence
first), holding the two chunks that ``get_batch_on_this_cp_rank`` gave this rank, in that order.
Communication is ``torch.distributed.batch_isend_irecv`` inside ``cp_group``, so
:mod:`snippets.record.recorder` records every hop (shapes, peers, forward or backward).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def chunk_positions(cp_rank: int, cp_size: int, seq_len: int) -> torch.Tensor:
    """Global positions of the tokens CP rank ``cp_rank`` holds after
    ``get_batch_on_this_cp_rank``: chunk ``cp_rank`` then chunk ``2*cp_size-1-cp_rank`` of
    ``2*cp_size`` equal chunks (tests check this against the real function)."""
    chunk = seq_len // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat(
        [torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)]
    )


def causal_pairs(q_positions: torch.Tensor, k_positions: torch.Tensor) -> int:
    """How many (query, key) pairs the causal mask keeps: the attention work of one block."""
    return int((q_positions[:, None] >= k_positions[None, :]).sum())


def causal_attention(q, k, v, softmax_scale=None):
    """Plain causal attention on the full sequence, ``[s, b, np, hn]``: the reference."""
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    positions = torch.arange(q.shape[0])
    scores = _scores(q, k, positions, positions, scale)
    return torch.einsum("bnqk,kbnd->qbnd", torch.softmax(scores, dim=-1), v)


def ring_attention(q, k, v, cp_group, softmax_scale=None):
    """Causal attention of this rank's queries over the whole sequence, K/V passed in a ring."""
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    return RingAttention.apply(q, k, v, cp_group, scale)


def _scores(q, k, q_positions, k_positions, scale):
    """Masked attention scores ``[b, np, sq, sk]``; a key later than the query gets -inf."""
    scores = torch.einsum("qbnd,kbnd->bnqk", q, k) * scale
    visible = q_positions[:, None] >= k_positions[None, :]
    return scores.masked_fill(~visible, float("-inf"))


def _ring_step(tensor, cp_group):
    """Send ``tensor`` to the next CP rank and receive the previous rank's; returns the requests
    and the receive buffer, so the caller can compute while the exchange is in flight."""
    cp_global_ranks = dist.get_process_group_ranks(cp_group)
    cp_rank, cp_size = cp_group.rank(), cp_group.size()
    send_dst = cp_global_ranks[(cp_rank + 1) % cp_size]
    recv_src = cp_global_ranks[(cp_rank - 1) % cp_size]
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor, send_dst, cp_group),
        dist.P2POp(dist.irecv, received, recv_src, cp_group),
    ]
    return dist.batch_isend_irecv(ops), received


def _wait(requests):
    for request in requests:
        request.wait()


class RingAttention(torch.autograd.Function):
    """Forward and backward rings; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, cp_group, scale):
        cp_rank, cp_size = cp_group.rank(), cp_group.size()
        seq_len = q.shape[0] * cp_size
        q_positions = chunk_positions(cp_rank, cp_size, seq_len)
        b, np_, sq = q.shape[1], q.shape[2], q.shape[0]
        out = torch.zeros_like(q)
        softmax_lse = torch.full((b, np_, sq), float("-inf"), dtype=q.dtype)
        kv = torch.stack([k, v])  # one message per hop: K and V travel together
        for step in range(cp_size):
            if step + 1 < cp_size:  # start passing the block on before computing with it
                requests, next_kv = _ring_step(kv, cp_group)
            owner = (cp_rank - step) % cp_size
            scores = _scores(q, kv[0], q_positions, chunk_positions(owner, cp_size, seq_len), scale)
            # Merge this block into the running softmax. Step 0 holds the diagonal, so every
            # query has a finite softmax_lse from then on and no row is ever all -inf.
            new_lse = torch.logaddexp(softmax_lse, torch.logsumexp(scores, dim=-1))
            rescale = torch.exp(softmax_lse - new_lse).permute(2, 0, 1).unsqueeze(-1)
            probs = torch.exp(scores - new_lse.unsqueeze(-1))
            out = out * rescale + torch.einsum("bnqk,kbnd->qbnd", probs, kv[1])
            softmax_lse = new_lse
            if step + 1 < cp_size:
                _wait(requests)
                kv = next_kv
        ctx.save_for_backward(q, k, v, out, softmax_lse)
        ctx.cp_group, ctx.scale = cp_group, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, softmax_lse = ctx.saved_tensors
        cp_group, scale = ctx.cp_group, ctx.scale
        cp_rank, cp_size = cp_group.rank(), cp_group.size()
        seq_len = q.shape[0] * cp_size
        q_positions = chunk_positions(cp_rank, cp_size, seq_len)
        # softmax backward needs, per query, sum_d dout * out (the "D" of flash attention)
        delta = (dout * out).sum(-1).permute(1, 2, 0)  # [b, np, sq]
        dq = torch.zeros_like(q)
        kv, dkv = torch.stack([k, v]), torch.zeros(2, *k.shape, dtype=k.dtype)
        for step in range(cp_size):
            owner = (cp_rank - step) % cp_size
            k_blk, v_blk = kv
            scores = _scores(q, k_blk, q_positions, chunk_positions(owner, cp_size, seq_len), scale)
            probs = torch.exp(scores - softmax_lse.unsqueeze(-1))  # the forward's softmax
            dprobs = torch.einsum("qbnd,kbnd->bnqk", dout, v_blk)
            dscores = probs * (dprobs - delta.unsqueeze(-1))
            dq += torch.einsum("bnqk,kbnd->qbnd", dscores, k_blk) * scale
            dkv[0] += torch.einsum("bnqk,qbnd->kbnd", dscores, q) * scale
            dkv[1] += torch.einsum("bnqk,qbnd->kbnd", probs, dout)
            if cp_size == 1:
                break
            # Pass the block on with the gradient gathered so far. The last hop carries only the
            # gradient: it brings dK/dV of block `cp_rank + 1` home, complete.
            last = step + 1 == cp_size
            requests, received = _ring_step(dkv if last else torch.cat([kv, dkv]), cp_group)
            _wait(requests)
            if last:
                dkv = received
            else:
                kv, dkv = received[:2], received[2:]
        return dq, dkv[0], dkv[1], None, None


__all__ = ["ring_attention", "causal_attention", "chunk_positions", "causal_pairs", "RingAttention"]
