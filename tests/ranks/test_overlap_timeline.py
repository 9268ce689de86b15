"""snippets/dp/overlap_timeline.py: markers interleave with the recorded collectives in the order
things happened -- checked against DDP's own bucket bookkeeping: with overlap_grad_reduce each
bucket's reduce-scatter is issued right after the last gradient of that bucket is computed."""

import pytest

from snippets.dp.overlap_timeline import Marker, timeline
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_timeline_folds_runs_of_markers_and_keeps_sections():
    class C:  # a stand-in for a recorded collective
        api, phase, before, after, ranks = "all_gather_into_tensor", "forward", "[4]", "[8]", (0, 1)

    events = [
        "schedule",
        Marker("forward", "decoder.layers.0.mlp"),
        Marker("forward", "output_layer"),
        C(),
        Marker("grad", "output_layer.weight"),
        "optimizer.step",
        C(),
    ]
    assert timeline(events) == [
        [1, "schedule", "forward 计算（2 个模块）", "layers.0.mlp … output_layer"],
        [2, "schedule", "**all_gather_into_tensor**（forward）", "[4] → [8]"],
        [3, "schedule", "backward 计算（1 个梯度）", "output_layer.weight"],
        [4, "optimizer.step", "**all_gather_into_tensor**（forward）", "[4] → [8]"],
    ]


def _overlapped_steps():
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

    from snippets.dp import overlap_timeline
    from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, forward_step, global_name, microbatches, tiny_config
    from snippets.record import recorder

    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(num_layers=2)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            use_distributed_optimizer=True,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
            bucket_size=2000,
        ),
        model,
    )
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.01, use_distributed_optimizer=True), [ddp])
    config.no_sync_func = ddp.no_sync
    steps = []
    for _ in range(2):
        with recorder.record() as calls, overlap_timeline.markers(ddp, calls):
            ddp.zero_grad_buffer()
            opt.zero_grad()
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(microbatches(2)),
                model=[ddp],
                num_microbatches=2,
                seq_length=SEQ,
                micro_batch_size=MBS,
            )
            calls.append("finalize")
            finalize_model_grads([ddp])
            opt.step()
        steps.append(
            [
                e if isinstance(e, (str, overlap_timeline.Marker)) else (e.api, e.before, len(e.ranks))
                for e in calls
            ]
        )
    names = {id(p): global_name(model, n) for n, p in model.named_parameters()}
    buckets = [(f"[{b.grad_data.numel()}]", {names[id(p)] for p in b.params}) for b in ddp.buffers[0].buckets]
    return steps, buckets


def test_each_reduce_scatter_follows_the_last_gradient_of_its_bucket():
    steps, buckets = run_ranks(_overlapped_steps, 2)[0]
    assert len(buckets) >= 3 and len({size for size, _ in buckets}) == len(buckets)
    second = steps[1]
    grads_so_far, seen = set(), []
    for i, event in enumerate(second):
        if isinstance(event, str):
            assert event == "finalize" and len(seen) == len(buckets)  # all issued during backward
            break
        if event.__class__.__name__ == "Marker":
            if event.kind == "grad":
                grads_so_far.add(event.name)
            continue
        api, before, _ = event
        if api == "reduce_scatter_tensor":
            params = next(p for size, p in buckets if size == before)
            assert params <= grads_so_far  # every grad of the bucket is ready
            assert second[i - 1].name in params  # and the last one just arrived
            assert not params <= (grads_so_far - {second[i - 1].name})
            seen.append(before)
    # the first step cannot overlap: DDP learns how often each grad is ready, then issues in finalize
    first = steps[0]
    cut = first.index("finalize")
    assert not any(isinstance(e, tuple) and e[0] == "reduce_scatter_tensor" for e in first[:cut])
