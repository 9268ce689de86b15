"""CPU patches for resharding (refit): the real ``swap_model_weights(..., "gloo")`` runs on CPU
ranks through ``GlooCopyService`` (its CUDA streams and its pinned staging buffers) and moves the
right numbers."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _gloo_refit_tp2_to_replicas():
    # refit_streams: GlooCopyService makes a CUDA "copy stream" in __init__, copies on it and
    # waits on it in run(). refit_pinned_buffers: every remote piece is staged through a pinned
    # CPU buffer. With both patches the real swap_model_weights(..., "gloo") runs on CPU ranks.
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding.copy_services import gloo_copy_service
    from megatron.core.resharding.refit import swap_model_weights
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer import TransformerConfig

    from snippets.rl import refit_cost

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    config = TransformerConfig(
        num_layers=1, hidden_size=6, num_attention_heads=1, use_cpu_initialization=True
    )
    own, _ = dist.new_subgroups_by_enumeration([[0], [1]])  # TP=1: each rank its own group

    class Holder(torch.nn.Module):  # what swap_model_weights reads: .config and .pg_collection
        def __init__(self, tp_group, dp_group):
            super().__init__()
            self.config = config
            self.pg_collection = ProcessGroupCollection(tp=tp_group, dp=dp_group, pp=own)
            self.linear = ColumnParallelLinear(
                6,
                8,
                config=config,
                init_method=torch.nn.init.normal_,
                bias=False,
                gather_output=False,
                tp_group=tp_group,
            )

    torch.manual_seed(0)
    src = Holder(ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group())  # [4, 6] each
    dst = Holder(own, dist.group.WORLD)  # [8, 6] each
    shards = [torch.empty(4, 6) for _ in range(2)]
    dist.all_gather(shards, src.linear.weight.detach())
    staged = []  # the staging buffers the copy service made (pin_memory=True in its source)
    empty = gloo_copy_service.torch.empty

    def recording_empty(*args, **kwargs):
        staged.append(kwargs.get("pin_memory"))
        return empty(*args, **kwargs)

    gloo_copy_service.torch._overrides["empty"] = recording_empty
    try:
        swap_model_weights(src, dst, "gloo")
    finally:
        gloo_copy_service.torch._overrides["empty"] = empty
    plan = refit_cost.cached_plan(src, dst)
    return (
        tuple(dst.linear.weight.shape),
        torch.equal(dst.linear.weight, torch.cat(shards)),
        sorted(op.peer_rank for op in plan.recv_ops),
        staged,
    )


@pytest.fixture(scope="module")
def refit_results():
    return run_ranks(_gloo_refit_tp2_to_replicas, 2)


def test_refit_streams_gloo_swap_model_weights_regathers_a_tp_shard(refit_results):
    for shape, equal, peers, _ in refit_results:
        assert shape == (8, 6) and equal
        assert peers == [0, 1]  # half from itself (a local copy), half from the other rank


def test_refit_pinned_buffers_remote_half_arrives_through_the_staging_buffer(refit_results):
    for rank, (_, equal, peers, staged) in enumerate(refit_results):
        # submit_recv stages both received halves (the local one is then copied directly), run()
        # the half sent to the other rank: pinned memory asked for each time, the rows arrive.
        assert staged == [True, True, True] and equal
        assert peers.count(1 - rank) == 1
