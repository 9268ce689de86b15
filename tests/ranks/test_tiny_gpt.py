"""The tiny GPT's weights depend only on global layer names, so a pipelined model holds exactly
the unsplit model's weights, and its forward_step / loss_func follow the schedules' contract."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _weights(pp, vp=None):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from snippets.models.tiny_gpt import SEQ, VOCAB, by_global_name, init_by_global_name, tiny_config

    ps.initialize_model_parallel(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp)
    config = tiny_config(
        num_layers=4, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp
    )
    chunks = []
    for stage in range(vp) if vp else [None]:
        chunks.append(
            GPTModel(
                config,
                get_gpt_layer_local_spec(),
                vocab_size=VOCAB,
                max_sequence_length=SEQ,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
                share_embeddings_and_output_weights=False,
                vp_stage=stage,
            )
        )
        init_by_global_name(chunks[-1])
    return by_global_name(chunks, "param")


def test_pipeline_stages_hold_the_unsplit_models_weights():
    (whole,) = run_ranks(_weights, 1, 1)
    for pp, vp in ((2, None), (2, 2)):
        split = {}
        for part in run_ranks(_weights, pp, pp, vp):
            assert not split.keys() & part.keys(), "two stages claim the same parameter"
            split.update(part)
        assert split.keys() == whole.keys()
        assert all(torch.equal(split[k], whole[k]) for k in whole)
    # and the names really seed different values (layer 3 is not a copy of layer 1)
    a = whole["decoder.layers.0.mlp.linear_fc1.weight"]
    assert not torch.equal(a, whole["decoder.layers.2.mlp.linear_fc1.weight"])


def test_loss_func_logs_a_copy_that_survives_the_in_place_division():
    from snippets.models.tiny_gpt import loss_func

    loss, logged = loss_func(torch.tensor([[1.0, 3.0]]))
    loss /= 4  # what forward_step_calc_loss does with the loss it is given
    assert loss.item() == 0.5 and logged["lm loss"].item() == 2.0


def _forward_step_equals_model_call():
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import SEQ, VOCAB, concat, forward_step, microbatches, tiny_config

    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(tiny_config(), get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    batches = microbatches(2)
    output, loss_fn = forward_step(iter(batches), model)
    loss, _ = loss_fn(output)
    whole = concat(batches)
    per_token = model(whole["tokens"], whole["position_ids"], whole["attention_mask"], labels=whole["labels"])
    return tuple(output.shape), loss.item(), per_token[:2].mean().item(), tuple(per_token.shape)


def test_forward_step_runs_the_first_microbatch_through_the_model():
    ((shape, loss, expected, whole_shape),) = run_ranks(_forward_step_equals_model_call, 1)
    assert shape == (2, 8) and whole_shape == (4, 8)  # per-token loss [batch, seq]
    assert abs(loss - expected) < 1e-6
