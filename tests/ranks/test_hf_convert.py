"""Note 25: a TP2 x PP2 GPTModel trained one step, gathered, mapped into transformers and back.

One 4-rank launch computes both shapes (GQA + QK norm, untied -> Qwen3ForCausalLM; MHA without QK
norm, tied -> LlamaForCausalLM), both directions and every wrong mapping; the tests read it.
"""

import pytest

from snippets.experiments import EXPERIMENTS, n25_hf
from snippets.ranks.launch import run_ranks
from snippets.rl import hf_mapping, hf_pictures

ATOL = n25_hf.ATOL
SHAPES = {"gqa-qknorm-untied": (EXPERIMENTS["hf-convert"].tiny, False), "mha-tied": (n25_hf.MHA, True)}


@pytest.fixture(scope="module")
def ranks():
    import megatron.core.models.gpt  # noqa: F401  (once in this process, not in each forked rank)
    import transformers  # noqa: F401

    return run_ranks(n25_hf.convert_shapes, 4, list(SHAPES.values()), grid=dict(tp=2, pp=2))


@pytest.fixture(scope="module", params=range(len(SHAPES)), ids=list(SHAPES))
def model(request, ranks):
    return [rank[request.param] for rank in ranks]


def test_the_two_shapes_are_qwen3_and_llama(ranks):
    assert [r["model"] for r in ranks[0]] == ["Qwen3ForCausalLM", "LlamaForCausalLM"]
    assert [(r["qk_norm"], r["tied"]) for r in ranks[0]] == [(True, False), (False, True)]
    assert all(r["vocab"] == 60 and r["padded"] == 64 for r in ranks[0])


def test_megatron_to_hf_equal_logits(model):
    assert model[0]["loaded"] == "ok"
    assert all(r["forward"] < ATOL for r in model), [r["forward"] for r in model]


def test_hf_to_megatron_tp2_equal_logits(model):
    assert all(r["reverse"] < ATOL for r in model), [r["reverse"] for r in model]
    assert all(r["padding_logits"] == 0.0 for r in model)  # the padded rows came back as zeros


def test_every_wrong_mapping_fails(model):
    """Refused by the strict load (a shape mismatch) or off in the logits -- never passing."""
    wrong = model[0]["wrong"]
    assert set(wrong) == set(hf_mapping.WRONG)
    for name, (status, delta) in wrong.items():
        assert (status != "ok" and delta is None) or delta > 100 * ATOL, (name, status, delta)


def test_wrong_mappings_of_same_shape_fail_the_logits_check(ranks):
    """In the MHA model with a square fc2 every wrong mapping loads: only the logits catch it; in
    the GQA model the shapes differ for Q/K and fc2, and only the row order of QKV loads."""
    gqa, mha = ranks[0]
    assert all(status == "ok" and delta > 100 * ATOL for status, delta in mha["wrong"].values())
    assert {n for n, (status, _) in gqa["wrong"].items() if status == "ok"} == {
        "QKV 不按 group 拆（直接按行切）"
    }


def test_mapping_covers_every_parameter_on_both_sides(model):
    r = model[0]
    megatron, hf = hf_mapping.covered_names(r["qk_norm"], r["tied"], r["layers"])
    assert megatron == set(r["megatron_names"])
    assert hf == set(r["hf_names"])


def test_fc1_gathers_with_stride_2(ranks):
    stage0 = [r[0] for r in ranks[:2]]  # ranks 0, 1 hold layer 0
    assert [(r["fc1_naive"], r["fc1_strided"]) for r in stage0] == [(False, True)] * 2


def test_qk_norm_grads_differ_across_tp_before_the_sum(ranks):
    assert [r[0]["qk_grads_differ"] for r in ranks] == [True] * 4


def test_mapping_picture_is_the_table(ranks):
    r = ranks[0][0]
    rows = n25_hf.mapping_rows(r)
    table = n25_hf.mapping_table(r)
    assert [row[1] for row in rows] == [row[1] for row in table.rows]

    def draw():
        return hf_pictures.draw_mapping(rows, title="t", desc="d")

    svg = draw().svg()
    assert svg == draw().svg()
    for _, megatron, hf_names, _ in rows:
        assert megatron in svg and all(name in svg for name in hf_names)
