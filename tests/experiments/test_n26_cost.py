"""Note 26's measurements against the formulas: what the note says matches, matches on the real objects."""

from __future__ import annotations

import pytest

from snippets.experiments import EXPERIMENTS, Parallel

TINY, PAR = EXPERIMENTS["cost"].tiny, Parallel(world=4, tp=2)


@pytest.fixture(scope="module")
def results():
    from snippets.experiments import n26_cost
    from snippets.ranks.launch import run_ranks

    return run_ranks(n26_cost.run, 4, TINY, PAR)


def test_bytes_per_parameter_are_the_published_counts(results):
    from snippets.experiments.n26_cost import published_bytes_per_param

    state = results[0]["state"]
    assert state[(False, True)]["per_param"] == 18.0  # Megatron's 18: fp32 main_grad
    assert state[(False, False)]["per_param"] == 16.0  # ZeRO's 2 + 2 + 12
    for fp32 in (True, False):  # sharded: the formula's, plus the padding to a multiple of DP
        r = state[(True, fp32)]
        _, value = published_bytes_per_param(True, fp32, r["dp"])
        assert value <= r["per_param"] < value * 1.02


def test_megatron_counts_the_parameters_without_biases_and_position_table(results):
    from snippets.experiments.n26_cost import params_table

    [[measured, counted, diff, biases, position]] = params_table(results, TINY, PAR).rows
    assert diff == measured - counted == biases + position > 0


def test_every_tp_and_dp_byte_the_formula_counts_was_sent(results):
    """TP: recorded == formula == a count by hand from the tiny sizes. DP: recorded - formula is
    exactly the parameters Megatron's count leaves out plus the distributed optimizer's padding,
    each taken from the model (not from the recorded buffer alone)."""
    from snippets.experiments.n26_cost import comm_table

    rows = comm_table(results, TINY, PAR).rows
    assert len(rows) == 5
    sbh2 = TINY.seq * TINY.micro_batch_size * TINY.hidden * 2  # one bf16 s*b*h tensor, in bytes
    t = PAR.tp
    by_hand = [4 * 2 * (t - 1) / t * sbh2, 10 * (t - 1) / t * sbh2, 14 * (t - 1) / t * sbh2]
    assert by_hand == [8192, 10240, 14336]  # tiny: s 16, b 2, h 32, t 2
    for row, hand in zip(rows[:3], by_hand, strict=True):
        assert row[2] == row[3] == row[4] == hand and row[5] == 0
    for row, distributed in zip(rows[3:], (False, True), strict=True):
        r = results[0]["state"][(distributed, True)]
        assert row[5] == pytest.approx(row[6] + row[7], abs=2)  # int() of each column
        assert row[6] > 0  # biases and the position table
        if distributed:  # param starts at multiples of 64, the bucket end at a multiple of DP
            pad = row[7] / ((4 + 2) * (r["dp"] - 1) / r["dp"])  # fp32 reduce-scatter + bf16 all-gather
            assert 0 < pad < 64 * r["tensors"] + r["dp"]
        else:
            assert row[7] == 0  # no padding without the distributed optimizer


def test_sp_selective_layer_keeps_the_papers_tensors_plus_cpu_masks(results):
    """Table 2's 34 s b h / t bytes, plus the two dropout masks stored in bf16 (2 bytes, the paper
    counts 1); the rest is fp32 LayerNorm statistics, the causal mask and one int."""
    r = results[0]["acts"][(True, "selective")]
    unit = r["sbh"] // PAR.tp
    bf16 = sum(size for _, dtype, size in r["tensors"] if dtype == "bfloat16")
    assert bf16 == 34 * unit + 2 * unit
    assert sum(size for *_, size in r["tensors"]) == r["bytes"]
    assert {dtype for _, dtype, _ in r["tensors"]} == {"bfloat16", "float32", "bool", "int32"}


def test_full_recompute_keeps_the_sharded_input_and_the_mask(results):
    r = results[0]["acts"][(True, "full")]
    assert r["bytes"] == 2 * r["sbh"] // PAR.tp + TINY.seq * TINY.seq  # bf16 input [s/t, b, h] + bool mask


def test_flop_counter_counts_the_causal_half_megatron_leaves_out():
    from snippets.cost import measure
    from snippets.experiments.n26_cost import flops_rows
    from snippets.ranks.launch import run_ranks

    counted = run_ranks(measure.flops, 1, TINY)[0]
    (_, torch_total, torch_attn, _), (_, megatron, _, diff), (_, six, six_attn, _) = flops_rows(
        counted, TINY
    ).rows
    assert megatron == six
    assert torch_attn == 2 * six_attn
    assert -diff == torch_total - megatron == six_attn


def test_pipeline_splits_and_the_refusal():
    from snippets.cost import measure
    from snippets.models.presets import Dims
    from snippets.ranks.launch import run_ranks

    dims = Dims(
        "tiny",
        hidden=16,
        heads=2,
        query_groups=2,
        kv_channels=8,
        ffn=64,
        vocab=640,
        layers=8,
        seq=8,
        micro_batch_size=2,
        microbatches=8,
    )
    stages = run_ranks(measure.pipeline_split, 4, dims, 4)
    assert [s["均分"]["layers"] for s in stages] == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert [s["首尾各少"]["layers"] for s in stages] == [[1], [2, 3, 4], [5, 6, 7], [8]]
    assert [s["layout"] for s in stages] == [s["首尾各少"] for s in stages]
    assert "10 must be divisible" in stages[0]["embedding/loss 算一层"]["refused"]
    assert [s["均分"]["in_flight"] for s in stages] == [4, 3, 2, 1]
    # one recorded 1F1B step: a middle stage sends m activations and m gradients of s*b*h
    from snippets.cost import formulas

    sent = [sum(v[2] for (g, _), v in s["均分"]["p2p"].items() if g == "pp") for s in stages]
    whole = dims.microbatches * dims.seq * dims.micro_batch_size * dims.hidden
    assert sent == [whole, 2 * whole, 2 * whole, whole]
    config = formulas.Config(
        gpus_per_node=4,
        pp=4,
        seq=dims.seq,
        micro_batch_size=dims.micro_batch_size,
        num_microbatches=dims.microbatches,
        vocab_multiple=1,
    )
    assert formulas.communication(formulas.Model.from_dims(dims), config)["pp"]["bytes"] == 2 * 2 * whole


def test_worked_choices_and_the_picture():
    """The pick is the shortest step among rows whose memory and step are both numbers and fit;
    a row with no activation formula or no TP byte count is "unknown", never picked."""
    from snippets.cost import formulas
    from snippets.cost.pictures import draw_choice
    from snippets.experiments import n26_cost

    assert n26_cost.GPU_MEMORY == formulas.MEMORY_BUDGET == 0.9 * 80 * 2**30
    for name in n26_cost.CHOICES:
        cands = n26_cost.choices(name)
        chosen = n26_cost.pick(cands)
        known = [c for c in cands if c["fits"] is not None and c["step"] is not None]
        for c in cands:
            assert (c["fits"] is None) == (c["memory"] is None)
            if c["memory"] is not None:
                assert c["memory"] == c["weights"].value + c["acts"].value
                assert c["fits"] == (c["memory"] <= n26_cost.GPU_MEMORY)
        fitting = [c for c in known if c["fits"]]
        if fitting:
            assert chosen is min(fitting, key=lambda c: c["step"])
            assert all(c["step"] >= chosen["step"] for c in fitting)
        else:
            assert chosen is None
    # Qwen3-30B-A3B: Megatron has no MoE activation term, so no row is known to fit and none is picked
    moe = n26_cost.choices("qwen3-30b-a3b")
    assert all(c["fits"] is None and "no MoE term" in c["unknown"] for c in moe)
    no_tp = [c for c in moe if c["config"].tp > 1]
    assert no_tp and all(c["step"] is None and c["no_step"].startswith("TP") for c in no_tp)
    # Qwen3-8B: the fastest row (TP1 DP8, no TP traffic, no bubble) is known not to fit in 72 GiB
    qwen = n26_cost.choices("qwen3-8b")
    chosen = n26_cost.pick(qwen)
    fastest = min(qwen, key=lambda c: c["step"])
    assert fastest["fits"] is False and fastest["memory"] > n26_cost.GPU_MEMORY and fastest is not chosen
    fig = draw_choice(qwen, chosen, n26_cost.GPU_MEMORY, title="t")
    assert fig.width <= 1070 and fig.height <= 320
    draw_choice(moe, None, n26_cost.GPU_MEMORY, title="t")  # unknown rows draw
