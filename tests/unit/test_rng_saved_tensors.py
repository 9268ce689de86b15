"""snippets.tp.rng.SavedTensors measures what autograd keeps for backward: distinct live storages,
parameters left out, a dropped graph no longer counted, a released storage counted as 0 bytes."""

import torch

from snippets.tp.rng import SavedTensors


def test_saved_tensors_counts_live_activations_only():
    w = torch.nn.Parameter(torch.ones(4, 4))
    x = torch.ones(2, 4, requires_grad=True)
    with SavedTensors([w]) as saved:
        h = (x @ w).exp()  # matmul saves x and w (left out); exp saves its result
        dropped = (x * 3).sin()  # sin saves its input, a temporary
        assert saved.nbytes() == x.nbytes + h.nbytes + dropped.nbytes
        del dropped  # its graph goes, and with it the saved temporary
        assert saved.nbytes() == x.nbytes + h.nbytes
        h.untyped_storage().resize_(0)  # as CheckpointWithoutOutput releases an output
        assert saved.nbytes() == x.nbytes
        saved.mark()
        y = x.exp()
        assert saved.nbytes(phase=1) == y.nbytes
