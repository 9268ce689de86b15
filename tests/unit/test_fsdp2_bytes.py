"""``snippets.dp.fsdp2.SavedBytes`` counts what autograd saves for backward, parameters left out
(note 15's self-test on FSDP compares these bytes across FSDP2 and Megatron TP / SP)."""

import torch

from snippets.dp.fsdp2 import SavedBytes


def test_saved_bytes_counts_activations_once_and_leaves_out_parameters_and_the_batch():
    linear = torch.nn.Linear(4, 3, bias=False)
    x = torch.randn(5, 4, requires_grad=True)
    batch = torch.randn(5, 3)
    with SavedBytes(exclude=[batch]) as saved:
        h = linear(x)  # saves x (5·4) and the weight (a parameter: not counted)
        y = (h * h).sum() + (batch * h).sum()  # h twice for h*h (one storage), batch and h for batch*h
    y.backward()
    assert saved.peak == x.numel() * 4 + h.numel() * 4


def test_saved_bytes_sees_a_parameter_saved_as_a_view():
    weight = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(5, 4, requires_grad=True)
    with SavedBytes() as saved:
        (x @ weight.t()).sum().backward()  # saves x and weight.t(), a view of the parameter
    assert saved.peak == x.numel() * 4
