"""The readable re-implementation of DDP's buffer layout reproduces what Megatron builds, and the
distributed optimizer's shards tile every bucket exactly once across DP ranks."""

import pytest

from snippets.dp.grad_buffers import layout
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _built(bucket_size, distributed_optimizer):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from snippets.dp import grad_buffers
    from snippets.models.tiny_gpt import SEQ, VOCAB, tiny_config

    ps.initialize_model_parallel()
    config = tiny_config(num_layers=2)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            overlap_grad_reduce=bucket_size is not None,
            bucket_size=bucket_size,
            use_distributed_optimizer=distributed_optimizer,
        ),
        model,
    )
    buffer = ddp.buffers[0]
    out = dict(
        sizes=[p.numel() for p in buffer.params],
        ranges=[buffer.param_index_map[p] for p in buffer.params],
        buckets=[(b.offset, b.offset + b.grad_data.numel()) for b in buffer.buckets],
        numel=buffer.numel,
        rows=grad_buffers.bucket_rows(ddp),
        views=grad_buffers.main_grads_are_views(ddp),
    )
    if distributed_optimizer:
        opt = get_megatron_optimizer(OptimizerConfig(lr=0.1, use_distributed_optimizer=True), [ddp])
        out["shards"] = grad_buffers.shard_rows(opt.chained_optimizers[0], ddp)
    return out


@pytest.mark.parametrize(
    "bucket_size, distributed_optimizer, dp",
    [(None, False, 2), (700, False, 2), (700, True, 2), (None, True, 2)],
)
def test_layout_matches_megatrons_buffer(bucket_size, distributed_optimizer, dp):
    results = run_ranks(_built, dp, bucket_size, distributed_optimizer)
    built = results[0]
    mine = layout(built["sizes"], bucket_size, dp, distributed_optimizer)
    assert mine.param_ranges == [tuple(r) for r in built["ranges"]]
    assert mine.buckets == built["buckets"] and mine.numel == built["numel"]
    assert built["views"] and len(built["rows"]) == len(mine.buckets)
    if bucket_size is not None:
        assert len(mine.buckets) > 1
    if distributed_optimizer:
        # Rank r owns [r/dp, (r+1)/dp) of every bucket; those pieces, cut at parameter
        # boundaries, cover every parameter element exactly once across the ranks.
        covered = {}
        for rank, r in enumerate(results):
            for bucket, name, numel, world, local, inside in r["shards"]:
                start, end = (int(x) for x in world.strip("[)").split(", "))
                lo, hi = mine.shards(dp)[bucket][rank]
                assert lo <= start < end <= hi
                a, b = (int(x) for x in inside.strip("[)").split(", "))
                assert b - a == end - start
                covered.setdefault(name, []).append((a, b, numel))
        for name, pieces in covered.items():
            pieces.sort()
            assert pieces[0][0] == 0 and pieces[-1][1] == pieces[0][2]
            assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:])), name
