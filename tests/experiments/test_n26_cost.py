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
    from snippets.experiments.n26_cost import comm_table

    rows = comm_table(results, TINY, PAR).rows
    assert len(rows) == 5 and all(row[-1] is True for row in rows)
    assert [row[2] == row[3] for row in rows[:3]] == [True] * 3  # TP: exact, no scaling


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
    from snippets.cost.pictures import draw_choice
    from snippets.experiments import n26_cost

    picks = {name: n26_cost.label(n26_cost.pick(n26_cost.choices(name))) for name in n26_cost.CHOICES}
    assert picks == {
        "qwen3-8b": "TP1 PP2 DP4",
        "dense-70b": "TP4 PP4 DP4",
        "qwen3-30b-a3b": "TP1 PP1 EP8 DP16",
    }
    qwen = n26_cost.choices("qwen3-8b")
    assert not qwen[0]["fits"] and qwen[0]["step"] < n26_cost.pick(qwen)["step"]  # the fastest does not fit
    fig = draw_choice(qwen, n26_cost.pick(qwen), n26_cost.GPU_MEMORY, title="t")
    assert fig.width <= 1070 and fig.height <= 320
