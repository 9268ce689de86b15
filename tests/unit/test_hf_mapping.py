"""snippets.rl.hf_convert / hf_mapping without ranks: the transforms are exact inverses, keys no
row covers are refused, the stride-2 merge is Megatron's layout, and the sizes are checked."""

import pytest
import torch

from snippets.experiments import EXPERIMENTS, Parallel, problems
from snippets.rl import hf_convert, hf_mapping

TINY = EXPERIMENTS["hf-convert"].tiny


def megatron_state(shape: hf_convert.Shape, hidden=32, ffn=64, head_dim=8) -> dict:
    g = torch.Generator().manual_seed(0)
    rows = (shape.heads + 2 * shape.groups) * head_dim
    full = {
        "embedding.word_embeddings.weight": (shape.padded, hidden),
        "decoder.final_layernorm.weight": (hidden,),
    }
    if not shape.tied:
        full["output_layer.weight"] = (shape.padded, hidden)
    for i in range(shape.layers):
        p = f"decoder.layers.{i}."
        full |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attention.linear_qkv.weight": (rows, hidden),
            p + "self_attention.linear_proj.weight": (hidden, shape.heads * head_dim),
            p + "pre_mlp_layernorm.weight": (hidden,),
            p + "mlp.linear_fc1.weight": (2 * ffn, hidden),
            p + "mlp.linear_fc2.weight": (hidden, ffn),
        }
        if shape.qk_norm:
            full |= {
                p + "self_attention.q_layernorm.weight": (head_dim,),
                p + "self_attention.k_layernorm.weight": (head_dim,),
            }
    state = {k: torch.randn(s, generator=g) for k, s in full.items()}
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if name in state:
            state[name][shape.vocab :] = 0  # what the reverse writes into the padding rows
    return state


SHAPES = [hf_convert.Shape(8, 2, 60, 64, 2, True, False), hf_convert.Shape(4, 4, 60, 64, 2, False, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=["gqa-qknorm-untied", "mha-tied"])
def test_round_trip_is_exact_and_covers_every_key(shape):
    state = megatron_state(shape)
    hf = hf_convert.to_hf(state, shape)
    megatron_names, hf_names = hf_mapping.covered_names(shape.qk_norm, shape.tied, shape.layers)
    assert set(state) == megatron_names and set(hf) == hf_names
    back = hf_convert.to_megatron(hf, shape)
    assert set(back) == set(state) and all(torch.equal(back[k], v) for k, v in state.items())
    assert hf["model.embed_tokens.weight"].shape[0] == 60


def test_unknown_keys_are_refused():
    shape = SHAPES[0]
    state = megatron_state(shape) | {"decoder.layers.0.mlp.router.weight": torch.zeros(1)}
    with pytest.raises(KeyError, match="router"):
        hf_convert.to_hf(state, shape)
    hf = hf_convert.to_hf(megatron_state(shape), shape) | {"model.layers.0.mlp.gate.weight": torch.zeros(1)}
    with pytest.raises(KeyError, match="mlp.gate.weight"):
        hf_convert.to_megatron(hf, shape)


def test_tied_weights_that_differ_are_refused():
    shape = SHAPES[1]
    hf = hf_convert.to_hf(megatron_state(shape), shape)
    hf["lm_head.weight"] = hf["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="tied"):
        hf_convert.to_megatron(hf, shape)


def test_wrong_transforms_change_the_tensors():
    shape = SHAPES[0]
    state = megatron_state(shape)
    right = hf_convert.to_hf(state, shape)
    for name in hf_mapping.WRONG:
        wrong = hf_convert.to_hf(state, shape, wrong=name)
        assert set(wrong) == set(right)
        assert any(wrong[k].shape != v.shape or not torch.equal(wrong[k], v) for k, v in right.items()), name


def test_merge_strided_is_megatrons_fc1_layout():
    gate, up = torch.arange(8.0).view(8, 1), 100 + torch.arange(8.0).view(8, 1)
    shards = [torch.cat([g, u]) for g, u in zip(gate.chunk(2), up.chunk(2))]  # rank r: [gate_r; up_r]
    assert torch.equal(hf_convert.merge_strided(shards, 2), torch.cat([gate, up]))
    assert not torch.equal(torch.cat(shards), torch.cat([gate, up]))


def test_padded_vocab():
    assert hf_convert.padded_vocab(60, tp=2, divisible_by=16) == 64
    assert hf_convert.padded_vocab(151936, tp=8, divisible_by=128) == 152576
    assert hf_convert.padded_vocab(64, tp=2, divisible_by=16) == 64


def test_sizes_it_cannot_map_are_named():
    par = Parallel(world=4, tp=2, pp=2)
    assert problems(EXPERIMENTS["hf-convert"], TINY, par) == []
    found = problems(EXPERIMENTS["hf-convert"], TINY.replace(swiglu=False, bias=True), par)
    assert any("Qwen3 / Llama-style" in s for s in found), found
    odd = problems(EXPERIMENTS["hf-convert"], TINY.replace(heads=3, query_groups=3), par)
    assert any("heads 3 is not divisible by tp 2" in s for s in odd), odd
