"""snippets.rl.qkv_layout: Megatron's grouped linear_qkv <-> separate q/k/v, checked against a real
Megatron SelfAttention and by exact round trips."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up
from snippets.rl import qkv_layout


def test_row_labels_follow_query_groups():
    assert qkv_layout.fused_row_labels(8, 4) == [
        "q0",
        "q1",
        "k0",
        "v0",
        "q2",
        "q3",
        "k1",
        "v1",
        "q4",
        "q5",
        "k2",
        "v2",
        "q6",
        "q7",
        "k3",
        "v3",
    ]
    assert qkv_layout.fused_row_labels(2, 2) == ["q0", "k0", "v0", "q1", "k1", "v1"]  # MHA
    assert qkv_layout.fused_row_labels(3, 1) == ["q0", "q1", "q2", "k0", "v0"]  # MQA


@pytest.mark.parametrize("heads,groups", [(8, 4), (4, 4), (6, 1), (8, 2)])
def test_split_puts_every_head_where_the_labels_say(heads, groups):
    head_dim = 3
    labels = qkv_layout.fused_row_labels(heads, groups)
    code = {"q": 0, "k": 1000, "v": 2000}
    # every row of a head block carries that head's identity
    fused = torch.tensor(
        [code[l[0]] + int(l[1:]) for l in labels for _ in range(head_dim)], dtype=torch.float32
    )
    q, k, v = qkv_layout.split_qkv(fused, heads, groups)
    assert q.tolist() == [float(h) for h in range(heads) for _ in range(head_dim)]
    assert k.tolist() == [1000.0 + g for g in range(groups) for _ in range(head_dim)]
    assert v.tolist() == [2000.0 + g for g in range(groups) for _ in range(head_dim)]


@pytest.mark.parametrize("heads,groups", [(8, 4), (4, 4), (6, 1)])
def test_round_trip_is_exact_for_weight_and_bias(heads, groups):
    head_dim, hidden = 4, 16
    torch.manual_seed(0)
    w = torch.randn((heads + 2 * groups) * head_dim, hidden)
    b = torch.randn((heads + 2 * groups) * head_dim)
    for t in (w, b):
        q, k, v = qkv_layout.split_qkv(t, heads, groups)
        assert q.shape[0] == heads * head_dim and k.shape[0] == v.shape[0] == groups * head_dim
        assert torch.equal(qkv_layout.fuse_qkv(q, k, v, groups), t)


def test_a_tp_shard_is_whole_query_groups():
    # TP cuts linear_qkv into contiguous row blocks; thanks to the grouping each block splits
    # into exactly the q/k/v heads of its own groups.
    heads, groups, head_dim, hidden, tp = 8, 4, 2, 8, 2
    torch.manual_seed(1)
    full = torch.randn((heads + 2 * groups) * head_dim, hidden)
    q, k, v = qkv_layout.split_qkv(full, heads, groups)
    for rank, shard in enumerate(full.chunk(tp)):
        sq, sk, sv = qkv_layout.split_qkv(shard, heads // tp, groups // tp)
        assert torch.equal(sq, q.chunk(tp)[rank])
        assert torch.equal(sk, k.chunk(tp)[rank]) and torch.equal(sv, v.chunk(tp)[rank])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        qkv_layout.split_qkv(torch.zeros(10, 4), 8, 3)
    with pytest.raises(ValueError):
        qkv_layout.split_qkv(torch.zeros(10, 4), 8, 4)  # 4 groups of 4 heads need a multiple of 16
    with pytest.raises(ValueError):
        qkv_layout.fuse_qkv(torch.zeros(8, 4), torch.zeros(4, 4), torch.zeros(2, 4), 2)


def test_state_dict_names_round_trip_and_unknown_keys_fail():
    torch.manual_seed(2)
    state = {
        "decoder.layers.3.input_layernorm.weight": torch.randn(8),
        "decoder.layers.3.self_attention.linear_qkv.weight": torch.randn(16, 8),
        "decoder.layers.3.self_attention.linear_qkv.bias": torch.randn(16),
        "decoder.layers.3.self_attention.linear_proj.weight": torch.randn(8, 8),
        "decoder.layers.3.pre_mlp_layernorm.weight": torch.randn(8),
        "decoder.layers.3.mlp.linear_fc1.weight": torch.randn(32, 8),
        "decoder.layers.3.mlp.linear_fc2.weight": torch.randn(8, 16),
    }
    hf = qkv_layout.megatron_to_hf(state, num_heads=4, num_query_groups=2)
    assert sorted(hf) == sorted(
        [
            "model.layers.3.input_layernorm.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.3.self_attn.k_proj.weight",
            "model.layers.3.self_attn.v_proj.weight",
            "model.layers.3.self_attn.q_proj.bias",
            "model.layers.3.self_attn.k_proj.bias",
            "model.layers.3.self_attn.v_proj.bias",
            "model.layers.3.self_attn.o_proj.weight",
            "model.layers.3.post_attention_layernorm.weight",
            "model.layers.3.mlp.gate_proj.weight",
            "model.layers.3.mlp.up_proj.weight",
            "model.layers.3.mlp.down_proj.weight",
        ]
    )
    assert hf["model.layers.3.self_attn.q_proj.weight"].shape == (8, 8)
    assert torch.equal(
        hf["model.layers.3.mlp.gate_proj.weight"], state["decoder.layers.3.mlp.linear_fc1.weight"][:16]
    )
    back = qkv_layout.hf_to_megatron(hf, num_query_groups=2)
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    with pytest.raises(KeyError, match="embedding"):
        qkv_layout.megatron_to_hf({"embedding.word_embeddings.weight": torch.zeros(2)}, 4, 2)
    with pytest.raises(KeyError, match="rotary"):
        qkv_layout.hf_to_megatron({"model.layers.0.self_attn.rotary.weight": torch.zeros(2)}, 2)


def _megatron_attention_vs_hf():
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.enums import AttnMaskType

    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=8,
        num_query_groups=2,
        use_cpu_initialization=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    spec = get_gpt_layer_local_spec().submodules.self_attention
    attn = SelfAttention(config, spec.submodules, layer_number=1, attn_mask_type=AttnMaskType.causal)
    with torch.no_grad():  # non-zero biases, so the bias reorder is checked too
        attn.linear_qkv.bias.normal_()
        attn.linear_proj.bias.normal_()
    x = torch.randn(6, 3, 32)  # [seq, batch, hidden]
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1).view(1, 1, 6, 6)
    with torch.no_grad():
        out, bias = attn(x, mask)
        ref = out + bias
        state = {
            f"decoder.layers.0.self_attention.{k}": v
            for k, v in attn.state_dict().items()
            if not k.endswith("_extra_state")
        }
        hf = qkv_layout.megatron_to_hf(state, num_heads=8, num_query_groups=2)
        p = "model.layers.0.self_attn."
        got = qkv_layout.hf_attention(
            x.transpose(0, 1),
            hf[p + "q_proj.weight"],
            hf[p + "k_proj.weight"],
            hf[p + "v_proj.weight"],
            hf[p + "o_proj.weight"],
            num_heads=8,
            num_kv_heads=2,
            q_bias=hf[p + "q_proj.bias"],
            k_bias=hf[p + "k_proj.bias"],
            v_bias=hf[p + "v_proj.bias"],
            o_bias=hf[p + "o_proj.bias"],
        ).transpose(0, 1)
        # the same weights left in Megatron's order give a different answer: the reorder matters
        w = attn.linear_qkv.weight
        naive = qkv_layout.hf_attention(
            x.transpose(0, 1),
            w[:32],
            w[32:40],
            w[40:48],
            attn.linear_proj.weight,
            8,
            2,
            o_bias=attn.linear_proj.bias,
        ).transpose(0, 1)
    return (
        torch.allclose(got, ref, atol=1e-6),
        float((got - ref).abs().max()),
        torch.allclose(naive, ref, atol=1e-3),
    )


def test_megatron_self_attention_equals_hf_attention_with_converted_weights():
    warm_up()
    same, diff, naive_same = run_ranks(_megatron_attention_vs_hf, 1)[0]
    assert same, diff
    assert not naive_same
