"""snippets/optim/grad_norm.py: the weights of a split model equal the unsplit one's, and the norm of
the gradients Megatron counts equals the one-process norm -- while counting every duplicate does
not."""

import pytest
import torch

from snippets.config.param_table import gather
from snippets.optim import grad_norm
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.mark.parametrize("size, stride", [(2, 1), (2, 2), (4, 1)])
def test_shard_is_the_inverse_of_gather(size, stride):
    full = torch.arange(48.0).view(8, 6)
    for dim in (0, 1):
        if full.shape[dim] % (size * stride):
            continue
        shards = [grad_norm.shard(full, dim, stride, r, size) for r in range(size)]
        assert torch.equal(gather(shards, dim, stride), full)


def _step(tp, pp):
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

    from snippets.models.tiny_gpt import (
        MBS,
        SEQ,
        VOCAB,
        by_global_name,
        forward_step,
        global_name,
        microbatches,
        tiny_config,
    )

    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    config = tiny_config(num_layers=2, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=True,
    )
    grad_norm.init_full_by_global_name(model, ps.get_tensor_model_parallel_rank(), tp)
    start = by_global_name([model], "param")
    split = {
        global_name(model, n): p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
        for n, p in model.named_parameters()
    }
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.01, clip_grad=0.0), [ddp])
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(microbatches(2)),
        model=[ddp],
        num_microbatches=2,
        seq_length=SEQ,
        micro_batch_size=MBS,
    )
    finalize_model_grads([ddp])
    rows = grad_norm.norm_rows(ddp)
    grads = by_global_name([ddp], "main_grad")
    _, norm, _ = opt.step()
    return dict(rows=rows, norm=norm, weights=start, split=split, grads=grads)


def test_split_models_start_from_the_one_process_weights_and_count_every_grad_once():
    (one,) = run_ranks(_step, 1, 1, 1)
    reference = grad_norm.one_process_norm(one["grads"])
    assert abs(one["norm"] - reference) < 1e-6 * reference
    for tp, pp in ((2, 1), (1, 2)):
        ranks = run_ranks(_step, tp * pp, tp, pp)
        rows = [r["rows"] for r in ranks]
        for r in ranks:
            assert abs(r["norm"] - reference) < 1e-5 * reference  # Megatron's own result
        assert abs(grad_norm.total_norm(rows) - reference) < 1e-5 * reference  # our sum of squares
        assert grad_norm.naive_norm(rows) > reference * 1.01  # duplicates counted twice
        if tp == 2:  # TP shards put back together are the one-process weights
            for name, weight in one["weights"].items():
                dim = ranks[0]["split"][name]
                full = (
                    gather([r["weights"][name] for r in ranks], dim)
                    if dim is not None
                    else ranks[1]["weights"][name]
                )
                assert torch.equal(full, weight), name
        else:  # each stage holds its layers with the one-process weights; the tied copy is excluded
            for r in ranks:
                for name, weight in r["weights"].items():
                    expected = (
                        one["weights"]["embedding.word_embeddings.weight"]
                        if name == "output_layer.weight"
                        else one["weights"][name]
                    )
                    assert torch.equal(weight, expected), name
            assert [x["name"] for x in rows[1] if not x["counted"]] == ["output_layer.weight"]
