"""CPU patch for DDP's gradient sync (``param_and_grad_buffer``): every bucket group's
``start_grad_sync`` takes the current CUDA stream; on CPU ranks the sync runs and averages the
gradients over DP, with and without ``overlap_grad_reduce``."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _dp2_main_grads(overlap: bool):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=overlap, bucket_size=20)
    ddp = DistributedDataParallel(config, ddp_config, module)
    buckets = sum(len(group.buckets) for group in ddp.bucket_groups)
    rank = dist.get_rank()
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(1))
    ddp.zero_grad_buffer()
    ddp(x[rank * 4 : (rank + 1) * 4]).pow(2).mean().backward()
    local = {name: p.main_grad.clone() for name, p in module.named_parameters()}
    finalize_model_grads([ddp])  # start_grad_sync (unless the hooks did) and wait, per bucket group
    synced = {name: p.main_grad.clone() for name, p in module.named_parameters()}
    reference(x).pow(2).mean().backward()  # the whole batch: the mean of the two halves' grads
    return buckets, local, synced, {name: p.grad for name, p in reference.named_parameters()}


@pytest.mark.parametrize("overlap", [False, True])
def test_grad_sync_current_stream_dp2_main_grads_are_the_dp_average(overlap):
    ranks = run_ranks(_dp2_main_grads, 2, overlap)
    for buckets, local, synced, whole in ranks:
        assert buckets == (2 if overlap else 1)  # ~20-element buckets only when overlapping
        for name in whole:
            assert torch.allclose(synced[name], whole[name], atol=1e-6), name
    if not overlap:  # each rank's own gradient was not the answer before the sync
        assert not torch.allclose(ranks[0][1]["0.weight"], ranks[0][3]["0.weight"], atol=1e-4)
