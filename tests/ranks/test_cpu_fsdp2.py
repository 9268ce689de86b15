"""CPU patch for Megatron's torch-FSDP2 wrapper (``torch_fully_sharded_data_parallel``): its mesh is
built on the CPU device type, and the wrapper really shards: each of two ranks keeps half of every
parameter, and the gradients it reduce-scatters are the DP average of the unsharded model's."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _fsdp2_dp2():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig, TorchFullyShardedDataParallel
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4, bias=False))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4, bias=False))
    reference.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, transformer_impl="local")
    fsdp = TorchFullyShardedDataParallel(config, DistributedDataParallelConfig(), module)
    local = {name: p.to_local().numel() for name, p in module.named_parameters()}
    rank = dist.get_rank()
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    fsdp(x[rank * 4 : (rank + 1) * 4]).pow(2).mean().backward()
    grads = {name: p.grad.full_tensor() for name, p in module.named_parameters()}
    reference(x).pow(2).mean().backward()  # the whole batch: the mean of the two halves' grads
    return local, grads, {name: p.grad for name, p in reference.named_parameters()}


def test_torch_fsdp2_device_mesh_shards_half_and_averages_grads_over_dp():
    for local, grads, whole in run_ranks(_fsdp2_dp2, 2):
        assert local == {"0.weight": 24, "0.bias": 4, "1.weight": 16}  # half of [8, 6], [8], [4, 8]
        for name in whole:
            assert torch.allclose(grads[name], whole[name], atol=1e-6), name
