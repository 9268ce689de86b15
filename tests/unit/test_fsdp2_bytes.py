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


def test_model_state_rows_follow_the_bytes_per_parameter_formulas():
    # note 15's computed table: DDP keeps 18 bytes a parameter, the distributed optimizer 2 + 4 + 12/dp
    # (of its TP shard), FSDP 18/dp; sequence parallel splits the activations by TP, FSDP does not
    from snippets.dp.fsdp2 import model_state_rows
    from snippets.models.memory_estimate import stage_weight_elements
    from snippets.models.presets import PRESETS
    from snippets.optim.optimizer_memory import bytes_per_parameter

    d = PRESETS["qwen3-8b"].replace(seq=4096)
    rows = {r[0]: r for r in model_state_rows(d, gpus=8)}
    assert rows["DDP"][3] == bytes_per_parameter("bf16", "fp32", 8, False) == 18
    assert rows["分布式优化器，DP=8"][3] == bytes_per_parameter("bf16", "fp32", 8, True) == 7.5
    assert rows["分布式优化器，DP=8"][4] == round(7.5 * stage_weight_elements(d) / 1e9, 1)
    assert rows["FSDP（optim_grads_params），DP=8"][3] == 18 / 8
    tp8 = rows["分布式优化器 + TP=8、SP，DP=1"]
    assert tp8[3] == round(18 * stage_weight_elements(d, 8) / stage_weight_elements(d), 2)
    assert rows["FSDP（optim_grads_params），DP=8"][5] == rows["DDP"][5] > 7 * tp8[5]
