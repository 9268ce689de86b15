"""The collective recorder sees Megatron's calls (including names copied at import time),
names their groups, and tells forward from backward."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up
from snippets.record.recorder import communication_table


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _f_and_g():
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import mappings

    from snippets.record import recorder

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    x = torch.randn(3, 4, requires_grad=True)
    with recorder.record() as calls:
        y = mappings.copy_to_tensor_model_parallel_region(x)  # f
        z = mappings.reduce_from_tensor_model_parallel_region(y * 2)  # g
        s = mappings.gather_from_sequence_parallel_region(z)  # all-gather, dim 0
        s.sum().backward()
    copied = mappings.dist_all_gather_func is recorder._wrappers["all_gather_into_tensor"]
    return calls, copied


def test_records_f_g_and_sequence_gather_with_phases_and_groups():
    results = run_ranks(_f_and_g, 4)  # tp=2, dp=2
    calls0, copied = results[0]
    assert copied, "mappings.py's import-time copy of all_gather_into_tensor was not rebound"
    rows = [(c.phase, c.api, c.group, c.before, c.after, c.where) for c in calls0]
    assert rows == [
        ("forward", "all_reduce", "tp", "[3, 4]", "[3, 4]", "tensor_parallel/mappings.py::_reduce"),
        (
            "forward",
            "all_gather_into_tensor",
            "tp",
            "[3, 4]",
            "[6, 4]",
            "tensor_parallel/mappings.py::_gather_along_first_dim",
        ),
        (
            "backward",
            "reduce_scatter_tensor",
            "tp",
            "[6, 4]",
            "[3, 4]",
            "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim",
        ),
        ("backward", "all_reduce", "tp", "[3, 4]", "[3, 4]", "tensor_parallel/mappings.py::_reduce"),
    ]
    assert [c.ranks for c in calls0] == [(0, 1)] * 4
    assert [c.ranks for c in results[3][0]] == [(2, 3)] * 4
    table = communication_table(calls0).markdown()
    assert table.count("\n") == 1 + 4 and "| backward | reduce_scatter_tensor | tp [0, 1] |" in table


def _nothing_outside_the_block():
    import torch.distributed as dist

    from snippets.record import recorder

    t = torch.ones(2)
    dist.all_reduce(t)
    with recorder.record() as calls:
        dist.broadcast(t, src=0)
    dist.all_reduce(t)
    return [(c.api, c.group, c.extra) for c in calls]


def test_records_only_inside_the_block_and_world_group():
    assert run_ranks(_nothing_outside_the_block, 2)[1] == [("broadcast", "world", {"peer": 0})]


def _p2p_batch():
    import torch.distributed as dist

    from snippets.record import recorder

    rank = dist.get_rank()
    send, recv = torch.full((2, 3), float(rank)), torch.empty(2, 3)
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    if rank == 1:
        ops.reverse()
    with recorder.record() as calls:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return [(c.api, c.before, c.extra["ops"]) for c in calls], recv[0, 0].item()


def test_batched_p2p_is_one_record_listing_each_op():
    (calls0, got0), (calls1, got1) = run_ranks(_p2p_batch, 2)
    assert calls0 == [("batch_isend_irecv", "isend[2, 3]; irecv[2, 3]", [("isend", 1), ("irecv", 1)])]
    assert (got0, got1) == (1.0, 0.0)
