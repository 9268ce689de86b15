"""snippets.cp.ring_attention: on CP=2 and CP=4 gloo ranks the ring gives exactly full causal attention
(output and the gradients of q, k, v), its layout is the one get_batch_on_this_cp_rank makes, and
every hop is recorded with its peers."""

import pytest
import torch

from snippets.cp.ring_attention import causal_attention, causal_pairs, chunk_positions
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _ring_vs_full(cp, seq_len, micro_batch, heads, head_dim, dtype):
    from megatron.core import parallel_state as ps
    from megatron.core.utils import get_batch_on_this_cp_rank

    from snippets.cp.ring_attention import ring_attention
    from snippets.record import recorder

    ps.initialize_model_parallel(context_parallel_size=cp)
    batch = {"position_ids": torch.arange(seq_len).expand(micro_batch, seq_len).clone()}
    cp_group = ps.get_context_parallel_group()
    positions = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=cp_group)["position_ids"][0]
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(seq_len, micro_batch, heads, head_dim, dtype=dtype) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    causal_attention(*full).backward(dout)
    local = [t[positions].clone().requires_grad_() for t in (q, k, v)]
    with recorder.record() as calls:
        out = ring_attention(*local, ps.get_context_parallel_group())
        out.backward(dout[positions])
    return dict(
        positions=positions,
        out=(out.detach(), causal_attention(q, k, v)[positions]),
        grads=[(loc.grad, ref.grad[positions]) for loc, ref in zip(local, full)],
        calls=[(c.phase, c.api, c.group, c.ranks, c.extra["ops"]) for c in calls],
        cp_rank=ps.get_context_parallel_rank(),
    )


@pytest.mark.parametrize("world, cp", [(2, 2), (4, 4), (4, 2)])
def test_ring_equals_full_causal_attention_values_and_grads(world, cp):
    tol = dict(atol=1e-5, rtol=1e-5)
    for r in run_ranks(_ring_vs_full, world, cp, 16, 2, 3, 4, torch.float32):
        assert torch.allclose(*r["out"], **tol)
        for local_grad, reference in r["grads"]:
            assert torch.allclose(local_grad, reference, **tol)


def test_ring_in_float64_matches_to_rounding():
    for r in run_ranks(_ring_vs_full, 4, 4, 32, 1, 2, 8, torch.float64):
        assert (r["out"][0] - r["out"][1]).abs().max() < 1e-12
        assert all((a - b).abs().max() < 1e-12 for a, b in r["grads"])


def test_layout_is_the_one_get_batch_on_this_cp_rank_makes():
    for cp, seq_len in ((2, 16), (4, 16), (4, 24)):
        for r in run_ranks(_ring_vs_full, cp, cp, seq_len, 1, 1, 2, torch.float32):
            assert torch.equal(r["positions"], chunk_positions(r["cp_rank"], cp, seq_len))


def test_hops_are_recorded_in_the_cp_group_with_ring_neighbours():
    results = run_ranks(_ring_vs_full, 4, 2, 8, 1, 1, 2, torch.float32)  # cp=2, dp=2
    for rank, r in enumerate(results):
        phases = [c[0] for c in r["calls"]]
        assert phases == ["forward", "backward", "backward"]  # cp-1 hops forward, cp backward
        for phase, api, group, ranks, ops in r["calls"]:
            assert (api, group) == ("batch_isend_irecv", "cp")
            assert ranks == ((0, 1) if rank < 2 else (2, 3))
            neighbour = rank ^ 1  # the other CP rank of the same DP replica
            assert ops == [("isend", neighbour), ("irecv", neighbour)]
    ring4 = run_ranks(_ring_vs_full, 4, 4, 16, 1, 1, 2, torch.float32)
    assert [c[4] for c in ring4[1]["calls"]] == [[("isend", 2), ("irecv", 0)]] * 7


def test_a_wrong_mask_would_be_caught():
    # The equality above is not vacuous: attention without the causal mask differs.
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 1, 1, 4) for _ in range(3))
    unmasked = torch.einsum(
        "bnqk,kbnd->qbnd", torch.softmax(torch.einsum("qbnd,kbnd->bnqk", q, k) / 2, dim=-1), v
    )
    assert not torch.allclose(unmasked, causal_attention(q, k, v), atol=1e-3)


def test_causal_pairs_count_the_triangle():
    for cp, seq_len in ((2, 16), (4, 16), (8, 64)):
        keys = torch.arange(seq_len)
        per_rank = [causal_pairs(chunk_positions(r, cp, seq_len), keys) for r in range(cp)]
        assert sum(per_rank) == seq_len * (seq_len + 1) // 2
        assert len(set(per_rank)) == 1  # the 2*CP chunking balances the work exactly
