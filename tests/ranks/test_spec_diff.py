"""snippets.config.spec_diff on plain torch modules (trees and their diff by hand) and on real GPT models
built from Megatron's layer specs: the TP layers it finds, their split and flags, checked against
a TP=1 build of the same model and against the arguments Megatron passes each layer."""

from collections import OrderedDict

import pytest
import torch

from snippets.config.spec_diff import MISSING, diff_trees, flag_cells, module_tree, parallel_layers
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_module_tree_and_diff_by_hand():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    assert module_tree(model) == {"": "Sequential", "0": "Linear", "1": "Sequential", "1.0": "ReLU"}
    other = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.GELU(), torch.nn.ReLU()))
    assert diff_trees({"a": module_tree(model), "b": module_tree(other)}) == [
        ["1.0", "ReLU", "GELU"],
        ["1.1", MISSING, "ReLU"],
    ]
    assert diff_trees({"a": module_tree(model), "b": module_tree(model)}) == []
    # a path only the second tree has lands between its neighbours, not at the end
    assert diff_trees({"a": {"x": "A", "z": "C"}, "b": {"x": "A2", "y": "B", "z": "C2"}}) == [
        ["x", "A", "A2"],
        ["y", MISSING, "B"],
        ["z", "C", "C2"],
    ]
    nested = torch.nn.Sequential(OrderedDict(decoder=torch.nn.Sequential(torch.nn.ReLU())))
    assert module_tree(nested, strip="decoder.") == {"": "Sequential", "decoder": "Sequential", "0": "ReLU"}


def _build(tp, num_experts=None):
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.config import spec_diff  # noqa: F401 - quiets the known warnings

    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        ffn_hidden_size=32,
        num_moe_experts=num_experts,
        add_bias_linear=num_experts is None,
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=num_experts),
        vocab_size=32,
        max_sequence_length=8,
        share_embeddings_and_output_weights=True,
    )
    return module_tree(model), parallel_layers(model)


def test_parallel_layers_of_a_tp2_gpt_match_tp1_and_megatrons_arguments():
    (tree0, layers0), (tree1, layers1) = run_ranks(_build, 2, 2, grid=dict(tp=2))
    _, layers_tp1 = run_ranks(_build, 1, 1)[0]
    assert layers0 == layers1 and tree0 == tree1  # every rank builds the same structure
    by_name = {row["path"].rsplit(".", 1)[-1]: row for row in layers0}
    whole = {row["path"]: row for row in layers_tp1}
    assert list(by_name) == [
        "word_embeddings",
        "linear_proj",
        "linear_qkv",
        "linear_fc1",
        "linear_fc2",
        "output_layer",
    ]  # registration order: proj is built before qkv
    for row in layers0:
        assert row["tp"] == 2
        if row["local_shape"] != MISSING:  # local shape × TP along the split dim = TP=1
            full = list(row["local_shape"])
            full[row["partition_dim"]] *= 2
            assert full == whole[row["path"]]["local_shape"], row["path"]
    assert by_name["linear_qkv"]["partition_dim"] == 0 and by_name["linear_proj"]["partition_dim"] == 1
    names = ("gather_output", "input_is_parallel", "skip_bias_add", "allreduce_dgrad")
    assert flag_cells(by_name["linear_qkv"], names) == [False, MISSING, False, True]
    assert flag_cells(by_name["linear_proj"], names) == [MISSING, True, True, MISSING]
    assert flag_cells(by_name["linear_fc1"], names) == [False, MISSING, True, True]
    assert by_name["output_layer"]["local_shape"] == MISSING  # shares word_embeddings.weight
    tp1 = {row["path"].rsplit(".", 1)[-1]: row for row in layers_tp1}
    assert tp1["linear_qkv"]["flags"]["allreduce_dgrad"] is False  # nothing to reduce at TP=1


def test_diff_of_dense_and_moe_specs():
    dense, _ = run_ranks(_build, 1, 1)[0]
    moe, layers = run_ranks(_build, 1, 1, 2)[0]
    rows = {row[0]: row[1:] for row in diff_trees({"dense": dense, "moe": moe})}
    assert rows["decoder.layers.0.mlp"] == ["MLP", "MoELayer"]
    assert rows["decoder.layers.0.mlp.router"] == [MISSING, "TopKRouter"]
    assert rows["decoder.layers.0.mlp.experts.local_experts.1.linear_fc2"] == [MISSING, "RowParallelLinear"]
    assert "decoder.layers.0.self_attention.linear_qkv" not in rows
    paths = list(rows)
    assert paths.index("decoder.layers.0.mlp.router") == paths.index("decoder.layers.0.mlp") + 1
    experts = [row for row in layers if row["is_expert"]]
    assert len(experts) == 4 and all("explicit_expert_comm" in row["flags"] for row in experts)
