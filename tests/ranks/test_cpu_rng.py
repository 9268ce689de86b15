"""The CPU model-parallel RNG keeps GPU semantics: ``torch.manual_seed`` alone decides the weights
built with ``use_cpu_initialization``; the tracker's streams differ across TP ranks and repeat
across DP ranks; outside ``fork()`` the default generator is the user's, untouched."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _gather_tp(shard, dim):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, shard.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _cpu_init_full_matrices():
    # Megatron's test_initialization: the same torch.manual_seed, a different Megatron seed per TP
    # size; the TP shards of a use_cpu_initialization weight make up the TP=1 weight.
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    full = {}
    for tp in (1, 2, 4):
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=tp)
        config = TransformerConfig(
            num_layers=1, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True
        )
        torch.manual_seed(42)
        model_parallel_cuda_manual_seed(42 - tp)  # intentionally different for each TP size
        init = config.init_method
        emb = VocabParallelEmbedding(num_embeddings=16, embedding_dim=4, init_method=init, config=config)
        row = RowParallelLinear(
            16, 16, init_method=init, bias=True, input_is_parallel=False, config=config, skip_bias_add=False
        )
        col = ColumnParallelLinear(16, 16, init_method=init, bias=True, config=config, skip_bias_add=False)
        full[tp] = dict(
            emb=_gather_tp(emb.weight, 0), row=_gather_tp(row.weight, 1), col=_gather_tp(col.weight, 0)
        )
    return {tp: {k: torch.equal(v, full[1][k]) for k, v in full[tp].items()} for tp in (2, 4)}, full[1]


def test_rng_tracker_use_cpu_initialization_weights_are_one_matrix_at_tp_1_2_4():
    results = run_ranks(_cpu_init_full_matrices, 4)
    for equal, tp1 in results:
        assert equal == {tp: dict(emb=True, row=True, col=True) for tp in (2, 4)}
        assert torch.equal(tp1["emb"], results[0][1]["emb"])  # every rank drew the same matrix
        assert tp1["emb"].std() > 0


def _dropout_streams():
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(7)  # the same user seed on every rank
    untouched = torch.get_rng_state()
    model_parallel_cuda_manual_seed(123)
    seeding_left_default_alone = torch.equal(untouched, torch.get_rng_state())
    tracker = get_cuda_rng_tracker()
    stream = torch.Generator()
    stream.set_state(tracker.get_states()["model-parallel-rng"])
    ones = torch.ones(64)
    outside = F.dropout(ones, 0.5)
    before_fork = torch.get_rng_state()
    with tracker.fork():
        inside = F.dropout(ones, 0.5)
        with tracker.fork():  # nested, same stream: it continues, as in the CUDA generator
            nested = F.dropout(ones, 0.5)
        inside_after = F.dropout(ones, 0.5)
    fork_left_default_alone = torch.equal(before_fork, torch.get_rng_state())
    outside_next = F.dropout(ones, 0.5)
    # The stream replayed by hand: three draws in a row from the tracker's model-parallel state.
    replay = [torch.empty(64).bernoulli_(0.5, generator=stream) for _ in range(3)]
    torch.manual_seed(7)
    expected_outside = [F.dropout(ones, 0.5) for _ in range(2)]
    return dict(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        seeding_left_default_alone=seeding_left_default_alone,
        fork_left_default_alone=fork_left_default_alone,
        outside=outside,
        inside=inside,
        stream_continues=[
            torch.equal(m != 0, r != 0) for m, r in zip((inside, nested, inside_after), replay)
        ],
        outside_is_the_user_stream=torch.equal(outside, expected_outside[0])
        and torch.equal(outside_next, expected_outside[1]),
    )


def test_rng_tracker_dropout_streams_inside_and_outside_tp_regions():
    r = run_ranks(_dropout_streams, 4)  # tp=2, dp=2: ranks 0,2 are tp rank 0; ranks 1,3 tp rank 1
    assert [x["tp_rank"] for x in r] == [0, 1, 0, 1]
    assert torch.equal(r[0]["inside"], r[2]["inside"])  # same tp rank: same stream
    assert not torch.equal(r[0]["inside"], r[1]["inside"])  # other tp rank: other stream
    assert all(torch.equal(x["outside"], r[0]["outside"]) for x in r)  # outside TP regions: all equal
    for x in r:
        assert x["seeding_left_default_alone"] and x["fork_left_default_alone"]
        assert x["stream_continues"] == [True, True, True]
        assert x["outside_is_the_user_stream"]


def _checkpointed_dropout(recompute):
    # Activation recompute replays both kinds of draws: the TP-region stream and the default one.
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import (
        checkpoint,
        get_cuda_rng_tracker,
        model_parallel_cuda_manual_seed,
    )

    ps.initialize_model_parallel()
    torch.manual_seed(3)
    model_parallel_cuda_manual_seed(5)

    def block(x):
        with get_cuda_rng_tracker().fork():
            x = F.dropout(x, 0.5)
        return F.dropout(x, 0.5) * x

    x = torch.randn(32, requires_grad=True)
    y = checkpoint(block, False, x) if recompute else block(x)
    y.sum().backward()
    return y.detach(), x.grad


def test_rng_tracker_activation_recompute_replays_the_same_masks():
    ((y0, g0),) = run_ranks(_checkpointed_dropout, 1, False)
    ((y1, g1),) = run_ranks(_checkpointed_dropout, 1, True)
    assert torch.equal(y0, y1) and torch.equal(g0, g1)


def _rerun_replays():
    from megatron.core.rerun_state_machine import RerunStateMachine

    machine = RerunStateMachine()
    machine._save_state()
    first = torch.rand(5)
    machine._restore_state()
    return torch.equal(first, torch.rand(5))


def test_rerun_state_rng_restore_replays_the_same_draws():
    assert run_ranks(_rerun_replays, 1) == [True]
