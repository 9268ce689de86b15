"""snippets.config.model_specs builds the real Transformer Engine layer spec without TE, only inside its
``with`` block, and names what each slot holds."""

import pytest

from snippets.config.model_specs import spec_table, transformer_engine_spec_without_te


def test_te_spec_slots_and_the_name_is_restored():
    from megatron.core.models.gpt import gpt_layer_specs

    with pytest.raises(TypeError):  # TESpecProvider is None without TE (gpt_layer_specs.py:54)
        gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    with transformer_engine_spec_without_te():
        te = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    assert gpt_layer_specs.TESpecProvider is None
    rows = {
        row[0]: row[1:] for row in spec_table({"local": gpt_layer_specs.get_gpt_layer_local_spec(), "te": te})
    }
    assert rows["input_layernorm"] == ["WrappedTorchNorm", "IdentityOp"]
    assert rows["pre_mlp_layernorm"] == ["WrappedTorchNorm", "IdentityOp"]
    assert rows["self_attention.linear_qkv"] == [
        "ColumnParallelLinear",
        "TELayerNormColumnParallelLinear (TE)",
    ]
    assert rows["mlp.linear_fc1"] == ["ColumnParallelLinear", "TELayerNormColumnParallelLinear (TE)"]
    assert rows["self_attention.core_attention"] == ["DotProductAttention", "TEDotProductAttention (TE)"]
    assert rows["mlp.linear_fc2"] == ["RowParallelLinear", "TERowParallelLinear (TE)"]
