"""snippets.cost.formulas: Megatron's formulas are really called, the published counterparts hold
where they should, and the refusals are one sentence each."""

from __future__ import annotations

import dataclasses

import pytest

from snippets.cost import formulas as F
from snippets.ranks.parallel_dims import ParallelDims

DENSE = ("qwen3-8b", "dense-8b", "dense-70b")


def _megatron():
    from megatron.training import theoretical_memory_usage as tmu
    from megatron.training.training import num_floating_point_operations

    return tmu, num_floating_point_operations


@pytest.mark.parametrize("name", DENSE)
def test_the_figures_are_megatrons_own(name):
    """Each figure equals calling Megatron's function on megatron_args directly (no monkeypatch)."""
    tmu, nfo = _megatron()
    m = F.MODELS[name]
    sp = F.Config(nodes=2, tp=4, pp=2, sp=True, recompute="selective", distributed_optimizer=True)
    no_sp = F.Config(nodes=1, tp=2, pp=2, vp=2, recompute="none")
    for c in (sp, no_sp):
        args = F.megatron_args(m, c)
        assert F.weight_and_optimizer_bytes(m, c).value == tmu.compute_weight_and_optimizer_memory(args)
        assert F.flops_per_step(m, c).value == nfo(F.megatron_args(m, c), c.global_batch)
    assert F.activation_bytes(m, sp).value == tmu.compute_activation_memory(
        F.megatron_args(m, sp), num_microbatches=sp.num_microbatches
    )
    assert F.activation_bytes(m, no_sp).value == tmu.compute_activation_memory_without_sp(
        F.megatron_args(m, no_sp), num_microbatches=no_sp.num_microbatches
    )


DENSE_8B_LAYER = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
"""dense-8b's TP-sharded parameters per layer, by hand: QKV (32 heads + 2 x 8 groups of 128), the
output projection, SwiGLU's fc1 (2 x 14336) and fc2."""
DENSE_8B_EMBEDDING = 128256 * 4096  # the vocabulary is already a multiple of 128 x 2
DENSE_8B_NORMS = 32 * 2 * 4096 + 4096  # two RMSNorms per layer and the final one


def test_hand_counted_dense_8b_is_the_presets_count():
    """The hand counts above add up to presets.parameter_count (untied: embedding twice)."""
    from snippets.models.presets import PRESETS, parameter_count

    total = 32 * DENSE_8B_LAYER + 2 * DENSE_8B_EMBEDDING + DENSE_8B_NORMS
    assert total == parameter_count(PRESETS["dense-8b"]) == 8_030_261_248


def test_bytes_per_parameter_18_and_6_plus_12_over_dp():
    """Megatron's count on the first stage of dense-8b at TP=2, PP=2, DP=8, by hand: half the layers
    and the embedding split over TP, the norms over PP -- 18 bytes each, or 6 + 12/8 with the
    distributed optimizer."""
    m = F.MODELS["dense-8b"]
    c = F.Config(nodes=4, tp=2, pp=2)  # DP 8
    params = (16 * DENSE_8B_LAYER + DENSE_8B_EMBEDDING) / 2 + DENSE_8B_NORMS / 2
    assert params == 2_007_631_872
    assert F.weight_and_optimizer_bytes(m, c).value == 18 * params == 36_137_373_696
    dist = c.replace(distributed_optimizer=True)
    assert F.weight_and_optimizer_bytes(m, dist).value == (6 + 12 / 8) * params
    assert sum(F.params_per_gpu(m, c).values()) == params
    # ZeRO's 16 (2 + 2 + 12) is the bf16-gradient count: refused, not shown as 18.
    bf16 = F.weight_and_optimizer_bytes(m, c.replace(grad_reduce_in_fp32=False))
    assert bf16.value is None and "grad_reduce_in_fp32" in bf16.why


def test_activation_by_hand_on_dense_8b():
    """The first stage's activations, by hand from Table 2's terms: SP + selective at TP=4, PP=2
    (per layer s b h (18 + 4 ffn/h), all 32 layers, embedding input 8 s b p and its dropout s b h p,
    over t); no SP at TP=2, PP=2, VP=2 (s b h (10 + 24/t) per layer, the same embedding terms,
    interleaving's 1 + (p-1)/(p v), then 1.05)."""
    m = F.MODELS["dense-8b"]
    sbh = 2048 * 1 * 4096
    sp = F.Config(tp=4, pp=2, sp=True, recompute="selective", seq=2048)
    assert F.activation_bytes(m, sp).value == (sbh * 32 * 32 + 8 * 2048 * 2 + sbh * 2) / 4 == 2_151_686_144
    no_sp = F.Config(tp=2, pp=2, vp=2, seq=2048)
    expected = (sbh * 22 * 32 + 8 * 2048 * 2 + sbh * 2) * 1.25 * 1.05
    assert F.activation_bytes(m, no_sp).value == pytest.approx(expected, rel=1e-15)


def test_flops_by_hand_on_dense_8b():
    """6 N per token (N: the layers' matmul weights and the output layer) plus causal attention
    6 L s (heads d) per token, times 64 sequences of 2048 (8 micro-batches on DP 8)."""
    m = F.MODELS["dense-8b"]
    c = F.Config(seq=2048)
    n = 32 * DENSE_8B_LAYER + DENSE_8B_EMBEDDING
    per_token = 6 * n + 6 * 32 * 2048 * 4096
    assert c.global_batch == 64
    assert F.flops_per_step(m, c).value == per_token * 64 * 2048 == 6_113_009_772_527_616


def test_mfu_with_an_independent_step_time():
    """Half the peak of 8 GPUs for 2 s does 8 x 989e12 FLOPs: MFU 0.5."""
    assert F.mfu(8 * 989e12, 2.0, 8) == pytest.approx(0.5)
    assert F.mfu(1e15, 1.0, 1, peak=2e15) == pytest.approx(0.5)


def test_params_match_the_presets_count():
    """Megatron's weight formula counts what presets.parameter_count counts, minus what it leaves
    out (QK norms, and the padding it adds to the vocabulary)."""
    from snippets.models.presets import PRESETS, parameter_count

    for name in DENSE:
        m, dims = F.MODELS[name], PRESETS[name]
        c = F.Config(gpus_per_node=1, vocab_multiple=1)
        qk = 2 * dims.kv_channels * dims.layers if dims.qk_norm else 0
        assert sum(F.params_per_gpu(m, c).values()) == parameter_count(dims) - qk


def test_activation_34_sbh_over_t_with_ffn_4h():
    """Table 2 of arXiv 2205.05198: 34 s b h / t per layer with TP + SP + selective recomputation
    when ffn = 4h; the no-SP variant is s b h (10 + 24/t), times the 1.05 "optimizer and
    miscellaneous temporaries" factor the no-SP function applies to its total."""
    m = F.Model("gpt", hidden=1024, heads=16, query_groups=16, kv_channels=64, ffn=4096, vocab=1024, layers=4)
    s, b, t = 2048, 2, 4
    base = F.Config(gpus_per_node=t, tp=t, pp=1, seq=s, micro_batch_size=b, vocab_multiple=1)
    sp = base.replace(sp=True, recompute="selective")
    more = m.__class__(**{**m.as_dict(), "layers": 8})
    per_layer = (F.activation_bytes(more, sp).value - F.activation_bytes(m, sp).value) / 4
    assert per_layer == pytest.approx(34 * s * b * m.hidden / t)
    per_layer_no_sp = (F.activation_bytes(more, base).value - F.activation_bytes(m, base).value) / 4
    assert per_layer_no_sp == pytest.approx(1.05 * s * b * m.hidden * (10 + 24 / t))


def test_flops_against_6n_plus_attention():
    """num_floating_point_operations equals 6N per token + causal attention 6*L*s*(heads*d) per
    token (to rounding), N = the matmul weights (active experts only, the output layer, no input
    embedding, no norms): Megatron's formula counts exactly these, for dense and MoE alike."""
    checked = dict.fromkeys(F.MODELS, 0)
    for name in F.MODELS:
        m = F.MODELS[name]
        configs = (
            F.Config(tp=2, pp=2, sp=True, recompute="selective", ep=2 if m.moe else 1),
            F.Config(seq=8, vocab_multiple=1, nodes=2),
        )
        for c in configs:
            if F.problems(m, c):
                continue
            assert F.flops_per_step(m, c).value == pytest.approx(F.six_n_flops(m, c)["total"], rel=1e-12)
            checked[name] += 1
    assert all(n >= 1 for n in checked.values()), checked


@pytest.mark.parametrize(
    "config, why",
    [
        (F.Config(recompute="full"), "no full-recomputation term"),
        (F.Config(tp=2, cp=2), "no context-parallel term"),
        (F.Config(tp=2, sp=True), "assumes selective recomputation"),
    ],
)
def test_activations_not_covered_show_no_number(config, why):
    fig = F.activation_bytes(F.MODELS["qwen3-8b"], config)
    assert fig.value is None and why in fig.why
    assert F.memory_bytes(F.MODELS["qwen3-8b"], config).value is None


def test_moe_activations_not_covered():
    fig = F.activation_bytes(F.MODELS["qwen3-30b-a3b"], F.Config(ep=8))
    assert fig.value is None and "MoE" in fig.why


def test_cp_with_distributed_optimizer_not_covered():
    fig = F.weight_and_optimizer_bytes(F.MODELS["qwen3-8b"], F.Config(cp=2, distributed_optimizer=True))
    assert fig.value is None and "DP x CP" in fig.why


@pytest.mark.parametrize(
    "config",
    [
        F.Config(gpus_per_node=8, tp=3),
        F.Config(vp=2),
        F.Config(sp=True),
        F.Config(pp=2, ep=16),
    ],
)
def test_parallel_dims_refusals_are_its_own_words(config):
    """The parallel-size rules and their wording are ParallelDims' (called, not copied)."""
    dims = ParallelDims(world=config.world, tp=config.tp, pp=config.pp, vp=config.vp, cp=config.cp,
                        ep=config.ep, sp=config.sp)  # fmt: skip
    expected = dims.problems()
    assert expected
    got = F.problems(F.MODELS["qwen3-30b-a3b"], config)
    assert got[: len(expected)] == expected


@pytest.mark.parametrize(
    "name, config, start",
    [
        ("qwen3-8b", F.Config(pp=5, gpus_per_node=5), "layers 36 is not divisible by pp"),
        ("qwen3-8b", F.Config(pp=4, vp=2, gpus_per_node=4), "layers 36 is not divisible by pp*vp"),
        ("qwen3-30b-a3b", F.Config(tp=8), "query_groups 4 is not divisible by tp 8"),
        ("qwen3-8b", F.Config(ep=2), "ep 2 needs a model with experts"),
        ("qwen3-30b-a3b", F.Config(gpus_per_node=6, ep=3), "num_experts 128 is not divisible by ep 3"),
        ("qwen3-8b", F.Config(cp=2, seq=2046), "seq 2046 is not divisible by 2*cp"),
        ("qwen3-8b", F.Config(recompute="some"), "recompute must be one of"),
        ("qwen3-8b", F.Config(nodes=0), "nodes must be a positive int"),
    ],
)
def test_model_refusals_one_line(name, config, start):
    found = F.problems(F.MODELS[name], config)
    assert any(p.startswith(start) for p in found), found
    assert all("\n" not in p for p in found)
    fig = F.weight_and_optimizer_bytes(F.MODELS[name], config)
    assert fig.value is None and fig.why == found[0]


def test_bubble():
    assert F.bubble_fraction(F.Config(pp=4, num_microbatches=8)) == pytest.approx(3 / 11)
    assert F.bubble_fraction(F.Config(pp=4, vp=2, num_microbatches=8)) == pytest.approx(3 / 19)
    assert F.bubble_fraction(F.Config(pp=1)) == 0


def test_intra_node_rule():
    """Default order tp-cp-ep-dp-pp: TP=4 stays inside a node; DP (stride 4 x size 4) crosses nodes."""
    c = F.Config(nodes=2, tp=4, pp=1)
    comm = F.communication(F.MODELS["qwen3-8b"], c)
    assert comm["tp"]["link"] == "NVLink"
    assert comm["dp"]["link"] == "IB"  # stride 4 x size 4 = 16 > 8
    assert comm["pp"]["link"] is None and comm["pp"]["bytes"] == 0
    assert not F.intra_node(3, 2, 8)  # span 6 does not tile an 8-GPU node


def test_tp_bytes_no_sp_and_sp():
    """No SP: 4 all-reduces of s b h per layer per micro-batch at 2(t-1)/t; SP: 10 AG/RS at (t-1)/t."""
    m = F.MODELS["dense-8b"]
    c = F.Config(tp=8, num_microbatches=1, micro_batch_size=1)
    a = c.seq * m.hidden * 2
    assert F.communication(m, c)["tp"]["bytes"] == pytest.approx(4 * 2 * 7 / 8 * a * m.layers)
    sp = c.replace(sp=True, recompute="selective")
    assert F.communication(m, sp)["tp"]["bytes"] == pytest.approx(10 * 7 / 8 * a * m.layers)


def test_summary_refused_has_only_problems():
    s = F.summary(F.MODELS["qwen3-8b"], F.Config(tp=3))
    assert s["problems"] and s["dp"] is None and "weights" not in s


def test_megatron_args_are_what_the_functions_read():
    """Every field megatron_args sets is read by Megatron's functions (report_theoretical_memory's
    two picks and the shared-expert gate aside), and they read nothing it does not set."""
    import argparse

    tmu, nfo = _megatron()
    read = set()

    class Recording(argparse.Namespace):
        def __getattribute__(self, name):
            if not name.startswith("_"):
                read.add(name)
            return super().__getattribute__(name)

    for m in F.MODELS.values():
        for c in (
            F.Config(tp=2, pp=2, vp=2, sp=True, recompute="selective", distributed_optimizer=True,
                     ep=2 if m.moe else 1, num_microbatches=4),
            F.Config(tp=1, pp=2, num_microbatches=1),
            F.Config(),
        ):  # fmt: skip
            args = Recording(**vars(F.megatron_args(m, c)))
            tmu.compute_weight_and_optimizer_memory(args)
            tmu.compute_activation_memory(args, num_microbatches=c.num_microbatches)
            tmu.compute_activation_memory_without_sp(args, num_microbatches=c.num_microbatches)
            nfo(args, c.global_batch)
    fields = set(vars(F.megatron_args(F.MODELS["tiny"], F.Config())))
    assert read <= fields
    assert fields - read == {"sequence_parallel", "recompute_granularity", "moe_shared_expert_gate"}


def test_vp_1_is_no_interleaving():
    """Megatron-LM turns a virtual pipeline size of 1 into None (arguments.py:917-918, 944-945):
    the same figures as vp=None, not the interleaved penalty."""
    m = F.MODELS["dense-8b"]
    one, none = F.Config(pp=2, vp=1), F.Config(pp=2)
    assert one.vp is None and one == none
    assert F.activation_bytes(m, one).value == F.activation_bytes(m, none).value
    assert F.bubble_fraction(one) == F.bubble_fraction(none)


@pytest.mark.parametrize(
    "name, config, start",
    [
        ("qwen3-30b-a3b", F.Config(tp=2, ep=4), "MoE with tp 2 needs sequence parallel"),
        ("qwen3-8b", F.Config(pp=2, vp=2, overlap_p2p_comm=False), "interleaving (vp 2) at pp 2 needs"),
        ("qwen3-8b", F.Config(pp=4, vp=3, num_microbatches=2, gpus_per_node=4), "interleaving (vp 3) needs"),
        ("qwen3-8b", F.Config(nodes=2**32), "nodes must be at most 2147483648"),
        ("qwen3-8b", F.Config(gpus_per_node=2**16, nodes=2**16), "world size gpus_per_node*nodes must be at most"),
        ("qwen3-8b", F.Config(seq=1.5), "seq must be a positive int, got 1.5"),
        ("qwen3-8b", F.Config(tp=2**40), "tp must be at most 2147483648"),
        ("qwen3-8b", F.Config(micro_batch_size=float("inf")), "micro_batch_size must be a positive int, got inf"),
    ],
)  # fmt: skip
def test_megatron_raises_and_absurd_sizes_are_refused(name, config, start):
    found = F.problems(F.MODELS[name], config)
    assert any(p.startswith(start) for p in found), found
    assert F.summary(F.MODELS[name], config)["problems"] == found


def test_the_default_overlap_p2p_comm_allows_pp_2_interleaving():
    """Megatron-LM's --no-overlap-p2p-communication is store_false: overlap is on by default, and
    then interleaving needs only pp > 1 (arguments.py:967-969)."""
    assert F.problems(F.MODELS["qwen3-8b"], F.Config(pp=2, vp=2)) == []


def test_huge_layer_counts_are_refused_at_once():
    """A model of 10**12 layers is refused in one line (no list of its layers is ever built)."""
    m = F.Model("big", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32, layers=10**12,
                num_experts=4, moe_ffn=8, topk=2)  # fmt: skip
    assert F.problems(m, F.Config()) == [f"layers must be at most {F.MAX_LAYERS}, got {10**12}"]
    assert m.moe_layers == 10**12  # the closed form answers at once


@pytest.mark.parametrize("layers, freq", [(48, 1), (48, 2), (47, 2), (10, 3), (1, 4)])
def test_moe_layers_closed_form_is_megatrons_pattern(layers, freq):
    """``i % freq == 0`` over ``range(layers)``, the pattern Megatron's functions build."""
    m = dataclasses.replace(F.MODELS["qwen3-30b-a3b"], layers=layers, moe_layer_freq=freq)
    assert m.moe_layers == sum(1 for i in range(layers) if i % freq == 0)
    assert dataclasses.replace(F.MODELS["qwen3-8b"], layers=layers).moe_layers == 0


def test_memory_limit_is_80_gib_less_10_percent():
    assert F.HARDWARE["hbm_bytes"] == 80 * 1024**3 == 85_899_345_920
    assert F.MEMORY_BUDGET == pytest.approx(72 * 1024**3)
    fits = F.memory_fits(F.MODELS["qwen3-8b"], F.Config(tp=8, sp=True, recompute="selective"))
    assert fits["fits"] is True and fits["why"] is None
    moe = F.memory_fits(F.MODELS["qwen3-30b-a3b"], F.Config(ep=8))
    assert moe["fits"] is None and "no MoE term" in moe["why"]  # unknown, never "fits"


def test_measure_rings_are_the_formulas_table():
    from snippets.cost import measure

    for api, op in measure.OPS.items():
        assert measure.RING[api] is F.RING[op]
