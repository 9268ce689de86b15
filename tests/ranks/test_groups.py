"""The rank-grid arithmetic agrees with Megatron's RankGenerator and with a real
initialize_model_parallel run."""

import itertools

import pytest
from megatron.core.parallel_state import RankGenerator

from snippets.ranks.groups import coordinates, describe_rank, groups_along, rank_of, unique_groups
from snippets.ranks.launch import run_ranks, warm_up

ORDERS = ["tp-cp-ep-dp-pp", "tp-dp-pp", "tp-pp-dp", "tp-cp-dp-pp", "dp-tp-pp"]
SIZES = [
    dict(tp=2, cp=1, ep=1, dp=4, pp=2),
    dict(tp=2, cp=2, ep=1, dp=2, pp=2),
    dict(tp=4, cp=1, ep=1, dp=1, pp=2),
    dict(tp=1, cp=1, ep=1, dp=8, pp=1),
]
TOKENS = ["tp", "dp", "pp", "cp", "tp-pp", "dp-cp", "tp-dp-cp", "tp-cp"]


@pytest.mark.parametrize("order, sizes", list(itertools.product(ORDERS, SIZES)))
def test_readable_groups_equal_rank_generator(order, sizes):
    if "cp" not in order and sizes["cp"] > 1:
        pytest.skip("RankGenerator refuses a size > 1 missing from the order")
    gen = RankGenerator(order=order, **sizes)
    full = gen.order  # RankGenerator appends missing dimensions of size 1 (0.19.0: also gtp_remat)
    for token in TOKENS:
        ours = groups_along(token, {"gtp_remat": 1, **sizes}, full)
        assert sorted(map(sorted, gen.get_ranks(token))) == ours, token


def test_coordinates_round_trip_and_seed_000_examples():
    sizes, order = dict(tp=2, cp=1, ep=1, dp=4, pp=2), "tp-cp-ep-dp-pp"
    for rank in range(16):
        assert rank_of(coordinates(rank, sizes, order), sizes, order) == rank
    assert coordinates(5, sizes, order) == dict(tp=1, cp=0, ep=0, dp=2, pp=0)
    assert coordinates(13, sizes, order) == dict(tp=1, cp=0, ep=0, dp=2, pp=1)


def _init_and_describe(tp, pp, cp):
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp
    )
    return describe_rank()


@pytest.mark.parametrize("world, tp, pp, cp", [(8, 2, 2, 1), (8, 2, 1, 2)])
def test_real_initialize_model_parallel_matches_rank_generator(world, tp, pp, cp):
    warm_up()
    described = run_ranks(_init_and_describe, world, tp, pp, cp, grid=dict(tp=tp, pp=pp, cp=cp))
    sizes = dict(tp=tp, cp=cp, ep=1, dp=world // (tp * pp * cp), pp=pp)
    for kind, token in [
        ("tp", "tp"),
        ("pp", "pp"),
        ("dp", "dp"),
        ("cp", "cp"),
        ("dp-cp", "dp-cp"),
        ("tp-pp", "tp-pp"),
    ]:
        assert unique_groups(described, kind) == groups_along(token, sizes, "tp-cp-ep-dp-pp"), kind
    for d in described:
        c = coordinates(d["rank"], sizes, "tp-cp-ep-dp-pp")
        assert d["coords"] == dict(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=c["pp"], ep=0)
