"""snippets.train.journey and journey_memory against real runs: the TP-sliced init is the unsplit
model's init, the saved-tensor meter counts what autograd holds (once per storage, released after
backward), and the memory formula equals what real ranks hold -- weights, grads, Adam state and
peak activations -- across TP, SP, PP, DP and attention shapes. The two modules do not import each
other."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up
from snippets.train import journey, journey_memory


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


# ------------------------------------------------------------------ init


def _init(tp):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import SEQ, VOCAB, init_by_global_name, tiny_config

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        tiny_config(num_layers=2, tensor_model_parallel_size=tp),
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
    )
    if tp == 1:
        init_by_global_name(model)
        dense = {}
    else:
        dense = journey.init_full_then_shard(model, keep=("decoder.layers.1.mlp.linear_fc1.weight",))
    params = {
        name: (
            p.detach().clone(),
            getattr(p, "partition_dim", -1) if getattr(p, "tensor_model_parallel", False) else -1,
        )
        for name, p in journey.named_by_global_name(model)
    }
    return params, dense


def test_tp_slices_concatenate_to_the_unsplit_init():
    ((ref, _),) = run_ranks(_init, 1, 1)
    (a, dense), (b, _) = run_ranks(_init, 2, 2, grid=dict(tp=2))
    assert a.keys() == ref.keys()
    for name, (full, _) in ref.items():
        (pa, dim), (pb, _) = a[name], b[name]
        got = pa if dim < 0 else torch.cat([pa, pb], dim=dim)
        assert torch.equal(got, full), name
        if dim >= 0:
            assert not torch.equal(pa, pb), name  # two different slices, not a copy
    assert torch.equal(
        dense["decoder.layers.1.mlp.linear_fc1.weight"], ref["decoder.layers.1.mlp.linear_fc1.weight"][0]
    )


def test_dense_rows():
    assert journey.dense_rows((0, 192), (16, 16), 16) == (16, 28)
    assert journey.dense_rows((192, 256), (16, 16), 0) == (12, 16)
    with pytest.raises(ValueError):
        journey.dense_rows((0, 100), (16, 16), 0)


def test_dense_ranges_follow_the_stride_of_swiglu_fc1():
    """TP rank r of 2 holds gate rows and up rows of a stride-2 [2·ffn, h] weight: the chunks
    ``_initialize_affine_weight_cpu`` keeps (4 chunks of 6 rows, ranks take 0, 2 and 1, 3)."""
    param = torch.nn.Parameter(torch.zeros(12, 4))
    param.tensor_model_parallel, param.partition_dim, param.partition_stride = True, 0, 2
    assert journey.dense_ranges(param, 0, 2) == [(0, 6), (12, 18)]
    assert journey.dense_ranges(param, 1, 2) == [(6, 12), (18, 24)]
    dense = torch.arange(24 * 4).reshape(24, 4)
    assert torch.equal(
        journey.take(dense, journey.dense_ranges(param, 1, 2)), torch.cat([dense[6:12], dense[18:24]])
    )
    # an optimizer range over local rows 4-7 crosses from gate into up; one that cuts a row says so
    assert journey.dense_rows_of((16, 32), (12, 4), [(0, 6), (12, 18)]) == "行 [4, 6) + [12, 14)"
    assert journey.dense_rows_of((18, 32), (12, 4), [(0, 6), (12, 18)]).endswith("（首尾行只有一部分）")


# ------------------------------------------------------------------ the saved-tensor meter


def test_saved_activations_counts_each_storage_once_and_frees_after_backward():
    linear = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8)
    with journey_memory.SavedActivations(linear, exclude=[x]) as acts:
        h = linear(x)  # saves x (excluded: the batch) and the weight (a parameter)
        assert acts.now == 0
        y = h * h  # saves h twice: one storage
        assert acts.now == h.numel() * 4
        z = y.exp()  # saves its result
        assert acts.now == (h.numel() + z.numel()) * 4
        z.sum().backward()
        assert acts.now == 0  # autograd dropped what it saved
    assert acts.peak == (h.numel() + z.numel()) * 4
    assert acts.saved_by_label == {"other": acts.peak}


# ------------------------------------------------------------------ the memory formula


def _step(overrides, tp, pp, global_microbatches, mbs):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import SEQ, VOCAB, forward_step, microbatches, tiny_config

    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **overrides)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
    )
    journey.init_full_then_shard(model)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-2, clip_grad=0.0, use_distributed_optimizer=True), [ddp]
    )
    config.no_sync_func = ddp.no_sync
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    m = global_microbatches // dp
    data = microbatches(global_microbatches, micro_batch_size=mbs)[m * dp_rank : m * (dp_rank + 1)]
    with journey_memory.SavedActivations(ddp, exclude=[t for b in data for t in b.values()]) as acts:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(data),
            model=[ddp],
            num_microbatches=m,
            seq_length=SEQ,
            micro_batch_size=mbs,
        )
    finalize_model_grads([ddp])
    opt.step()
    pp_rank = ps.get_pipeline_model_parallel_rank()
    per_layer = sum(journey_memory.layer_activation_bytes(config, SEQ, mbs).values())
    return (
        journey_memory.measured_memory(ddp, opt, acts),
        journey_memory.memory_formula(config, VOCAB, SEQ, mbs, m, dp, pp_rank, dp_rank),
        acts.saved_by_label.get("layers", 0),
        per_layer * config.num_layers // pp * m,
    )


CASES = {
    # name: (world, tp, pp, overrides, global micro-batches, micro-batch size)
    "one rank": (1, 1, 1, dict(num_layers=2), 2, 2),
    "TP2 SP": (2, 2, 1, dict(num_layers=2, sequence_parallel=True), 2, 2),
    "TP2 no SP": (2, 2, 1, dict(num_layers=2), 2, 2),
    "TP2 SP, GQA, a*d != h, ffn 48, mbs 3": (
        2,
        2,
        1,
        dict(
            num_layers=1,
            sequence_parallel=True,
            num_attention_heads=4,
            num_query_groups=2,
            kv_channels=8,
            ffn_hidden_size=48,
        ),
        2,
        3,
    ),
    "PP2, m=3": (2, 1, 2, dict(num_layers=4), 3, 2),
    "TP2 DP2 SP": (4, 2, 1, dict(num_layers=2, sequence_parallel=True), 4, 2),
    "TP2 PP2 DP2 SP (note 23)": (8, 2, 2, dict(num_layers=2, sequence_parallel=True), 4, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_memory_formula_equals_what_real_ranks_hold(case):
    world, tp, pp, overrides, microbatches, mbs = CASES[case]
    results = run_ranks(_step, world, overrides, tp, pp, microbatches, mbs, grid=dict(tp=tp, pp=pp))
    for rank, (measured, formula, layer_bytes, layer_formula) in enumerate(results):
        assert measured == formula, (rank, measured, formula)
        # the per-layer part alone, summed over the step (every micro-batch saves it once)
        assert layer_bytes == layer_formula, rank
    if pp > 1:  # 1F1B: the first stage holds more micro-batches at once than the last
        assert results[0][0]["activations"] > results[-1][0]["activations"]


def test_journey_and_journey_memory_do_not_import_each_other():
    import ast
    import inspect

    def imported(module):
        tree = ast.parse(inspect.getsource(module))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        return names

    assert not {n for n in imported(journey) if "journey_memory" in n}
    assert not {n for n in imported(journey_memory) if n.endswith(".journey") or ".journey." in n}


def test_in_flight():
    assert [journey_memory.in_flight(4, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert [journey_memory.in_flight(4, r, 2) for r in range(4)] == [2, 2, 2, 1]


def test_formula_refuses_configs_it_was_not_derived_for():
    from snippets.models.tiny_gpt import tiny_config

    with pytest.raises(ValueError, match="gated_linear_unit"):
        journey_memory.layer_activation_bytes(tiny_config(gated_linear_unit=True), 8, 2)
    with pytest.raises(ValueError, match="hidden_dropout"):
        journey_memory.layer_activation_bytes(tiny_config(hidden_dropout=0.1), 8, 2)
