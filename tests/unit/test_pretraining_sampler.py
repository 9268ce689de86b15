"""snippets.data.pretraining_sampler hands out Megatron-LM's MegatronPretrainingSampler (in the pip
package since core 0.19) and restates the ``single`` loader around it; both are held to what a
pretraining sampler must do for data parallelism and for resuming."""

from __future__ import annotations

from itertools import product

import pytest

from snippets.data.pretraining_sampler import (
    MegatronPretrainingSampler,
    build_pretraining_data_loader,
    samples_per_iteration,
)

GRID = [
    dict(total=t, consumed=c, mbs=m, dp=d, drop_last=dl)
    for t, c, m, d, dl in product((16, 19), (0, 4, 7), (1, 2, 3), (1, 2, 4), (True, False))
]


def _batches(cls, total, consumed, mbs, dp, drop_last):
    return [list(cls(total, consumed, mbs, rank, dp, drop_last=drop_last)) for rank in range(dp)]


def test_dp_ranks_split_each_block_in_order():
    per_rank = _batches(MegatronPretrainingSampler, 16, 0, 2, 2, True)
    assert per_rank == [[[0, 1], [4, 5], [8, 9], [12, 13]], [[2, 3], [6, 7], [10, 11], [14, 15]]]
    for case in GRID:
        if case["drop_last"]:
            per_rank = _batches(MegatronPretrainingSampler, **case)
            flat = [i for step in zip(*per_rank) for batch in step for i in batch]
            block = case["mbs"] * case["dp"]
            full = (case["total"] - case["consumed"]) // block * block
            assert flat == list(range(case["consumed"], case["consumed"] + full)), case


def test_resuming_from_consumed_samples_continues_the_same_sequence():
    mbs, dp, microbatches = 1, 2, 2
    step = samples_per_iteration(dp, mbs, microbatches)
    whole = _batches(MegatronPretrainingSampler, 16, 0, mbs, dp, True)
    for k in range(1, 4):
        resumed = _batches(MegatronPretrainingSampler, 16, k * step, mbs, dp, True)
        assert [r[k * microbatches :] for r in whole] == resumed


def test_nothing_left_to_consume_is_an_error():
    with pytest.raises(AssertionError, match="no samples left"):
        MegatronPretrainingSampler(16, 16, 1, 0, 1)


def test_the_loader_yields_the_samplers_indices():
    import torch

    data = torch.arange(10)
    loader = build_pretraining_data_loader(data, 4, 2, 1, 2)
    assert [b.tolist() for b in loader] == [[6, 7]]


def test_the_sampler_is_megatrons():
    from megatron.training.datasets import data_samplers

    assert MegatronPretrainingSampler is data_samplers.MegatronPretrainingSampler
