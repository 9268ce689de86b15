"""The pipeline timeline: the logical clock reproduces the textbook bubble for textbook orders,
refuses impossible orders, and a recorded real schedule has the phases its own formula gives and
p2p calls that pair up across ranks."""

import xml.etree.ElementTree as ET

import pytest

from snippets.pp import pictures
from snippets.pp import timeline as pt
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def one_f_one_b(p, m):
    """A from-the-paper 1F1B order per rank, written independently of Megatron's loops."""
    orders = []
    for r in range(p):
        w = min(p - r - 1, m)
        order = [pt.Op("F", i, 0) for i in range(w)]
        for i in range(m - w):
            order += [pt.Op("F", w + i, 0), pt.Op("send_forward_recv_backward"), pt.Op("B", i, 0)]
        order += [pt.Op("B", i, 0) for i in range(m - w, m)]
        orders.append(order)
    return orders


def gpipe(p, m):
    return [[pt.Op("F", i, 0) for i in range(m)] + [pt.Op("B", i, 0) for i in range(m)] for _ in range(p)]


@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16)])
@pytest.mark.parametrize("f, b", [(1, 1), (1, 2), (2, 3)])
def test_textbook_orders_give_the_textbook_bubble(p, m, f, b):
    expected = (p - 1) / (m + p - 1)
    for orders in (one_f_one_b(p, m), gpipe(p, m)):
        t = pt.logical_schedule(orders, forward=f, backward=b)
        assert pt.makespan(t) == (m + p - 1) * (f + b)
        assert abs(pt.bubble_fraction(t) - expected) < 1e-12


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_phases_of_a_textbook_order(p, m):
    for r, order in enumerate(one_f_one_b(p, m)):
        w = min(p - r - 1, m)
        assert pt.phases(order) == (w, m - w, w)


def test_an_order_that_cannot_run_is_refused():
    # rank 0 wants the backward of micro-batch 0 before it has run its forward
    orders = [[pt.Op("B", 0, 0), pt.Op("F", 0, 0)], [pt.Op("F", 0, 0), pt.Op("B", 0, 0)]]
    with pytest.raises(RuntimeError, match="deadlock"):
        pt.logical_schedule(orders)


def test_svg_is_well_formed_with_one_box_per_op():
    t = pt.logical_schedule(one_f_one_b(4, 4))
    svg = ET.fromstring(pictures.draw_timeline(t, title="x").svg())
    boxes = [
        r
        for r in svg.iter("{http://www.w3.org/2000/svg}rect")
        if r.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    assert len(boxes) == 4 * 8  # 8 ops on each of 4 ranks, each with its hover title


def _recorded_pp2(m):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, forward_step, microbatches, tiny_config

    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(pipeline_model_parallel_size=2)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
    )
    with pt.record_schedule() as ops:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches(m)),
            model=[model],
            num_microbatches=m,
            seq_length=SEQ,
            micro_batch_size=MBS,
        )
    return ops, schedules.get_pp_rank_microbatches(m, 1, config.microbatch_group_size_per_vp_stage)


def test_a_recorded_1f1b_run_matches_its_formula_and_its_p2p_pairs_up():
    m = 3
    (ops0, counts0), (ops1, counts1) = run_ranks(_recorded_pp2, 2, m)
    for ops, (total, _, warmup, remaining) in ((ops0, counts0), (ops1, counts1)):
        assert pt.phases(ops) == (warmup, remaining, total - remaining)
        assert sorted((op.microbatch, op.kind) for op in pt.compute_ops(ops)) == sorted(
            (i, k) for i in range(m) for k in "FB"
        )
    sent0 = [x for row in pt.p2p_rows(ops0, 0) for x in row[5].split(", ") if x.startswith("isend")]
    got1 = [x for row in pt.p2p_rows(ops1, 1) for x in row[5].split(", ") if x.startswith("irecv")]
    assert len(sent0) == len(got1) == m  # every activation rank 0 sends, rank 1 receives
    t = pt.logical_schedule([ops0, ops1])
    assert abs(pt.bubble_fraction(t) - 1 / (m + 1)) < 1e-12
