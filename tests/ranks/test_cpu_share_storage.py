"""share_storage_by_copy: CheckpointWithoutOutput's recompute fills the freed output's storage
without compiling Megatron's C++ extension; views taken before see the values, grads are exact."""

import torch

from snippets.ranks.launch import run_ranks


def _recompute_without_output(patched):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput, model_parallel_cuda_manual_seed

    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    if not patched:  # the real function would compile; report whether the wrapper is in place
        return getattr(mrandom._get_share_storage, "_cpu_compat", False)
    torch.manual_seed(0)
    w = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(4, 6, requires_grad=True)

    def layer(t):
        return torch.nn.functional.gelu(t @ w)

    ref = (layer(x) @ w).sum()
    ref_grads = torch.autograd.grad(ref, (x, w))

    ckpt = CheckpointWithoutOutput(fp8=None)  # the default fp8=False reads as True (random.py:740)
    h = ckpt.checkpoint(layer, x)
    view = h.view(-1)[:5]  # a view taken before the storage is freed
    out = h @ w
    ckpt.discard_output_and_register_recompute(out)
    freed = h.untyped_storage().nbytes() == 0
    out.sum().backward()  # the recompute hook refuses autograd.grad (random.py:779)
    grads = (x.grad, w.grad)
    return (
        freed,
        torch.equal(view, layer(x).detach().view(-1)[:5]),
        all(torch.equal(a, b) for a, b in zip(grads, ref_grads)),
        mrandom._share_storage_ext is None,  # nothing was compiled
    )


def test_share_storage_by_copy_recompute_fills_the_output_storage_without_compiling():
    assert run_ranks(_recompute_without_output, 1, True) == [(True, True, True, True)]


def test_share_storage_by_copy_wraps_megatrons_function():
    assert run_ranks(_recompute_without_output, 1, False) == [True]
