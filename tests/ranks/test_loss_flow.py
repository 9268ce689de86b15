"""snippets.train.loss_flow's statements about who divides the loss, checked on Megatron's real schedule
(forward_backward_no_pipelining, 1 rank, 2 micro-batches with 16 and 6 loss tokens) against
autograd references and plain formulas:

* three values: gradient = mean over micro-batches of per-micro-batch token means; report = global
  token mean; with calculate_per_token_loss + finalize_model_grads: gradient = global token mean;
* two values: a report that is the loss tensor or its detach() comes back divided by the number of
  micro-batches, a clone does not.
"""

from functools import partial

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _contracts():
    from megatron.core import parallel_state as mpu
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    from snippets.train import loss_flow  # noqa: F401 - param_table first: quiet imports

    mpu.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)  # attention forks the model-parallel RNG stream
    config = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8
    )
    batches = loss_flow.microbatches(2, 2, 8, 32, [16, 6])

    def flat(grads):
        return torch.cat([g.flatten() for g in grads])

    refs = {}
    for name in ("mean_of_means", "token_mean"):
        model.zero_grad()
        sums, counts = [], []
        for b in batches:
            out = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])
            sums.append((out * b["loss_mask"]).sum())
            counts.append(b["loss_mask"].sum())
        if name == "mean_of_means":
            objective = sum(s / n for s, n in zip(sums, counts)) / len(batches)
        else:
            objective = sum(sums) / sum(counts)
        objective.backward()
        refs[name] = (objective.item(), flat(p.grad for p in model.parameters()))

    ours = loss_flow.objective_gradients(model, batches)
    for name, key in (("mean_of_means", loss_flow.OBJECTIVES[0]), ("token_mean", loss_flow.OBJECTIVES[1])):
        assert abs(ours[key][0] - refs[name][0]) < 1e-6 and torch.allclose(ours[key][1], refs[name][1])

    def run(module, loss_fn):
        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            output = model(
                batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
            )
            return output, partial(loss_fn, batch["loss_mask"])

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=module,
            num_microbatches=2,
            seq_length=8,
            micro_batch_size=2,
        )

    out = {}
    for label, fn in [
        ("three", loss_flow.masked_token_sum),
        ("same", partial(loss_flow.masked_mean, report="same")),
        ("detach", partial(loss_flow.masked_mean, report="detach")),
        ("clone", partial(loss_flow.masked_mean, report="clone")),
    ]:
        model.zero_grad()
        reports = run(model, fn)
        out[label] = (loss_flow.train_step_report(reports), flat(p.grad for p in model.parameters()))
    model.zero_grad()
    config.calculate_per_token_loss = True
    config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=model)
    reports = run(ddp, loss_flow.masked_token_sum)
    out["per_token"] = (loss_flow.train_step_report(reports), flat(p.main_grad for p in model.parameters()))
    return refs, out


def test_who_divides_by_what():
    refs, out = run_ranks(_contracts, 1)[0]
    (mom_value, mom_grad), (tm_value, tm_grad) = refs["mean_of_means"], refs["token_mean"]
    assert abs(mom_value - tm_value) > 1e-3, "the two objectives must differ for this test to mean anything"
    close = partial(torch.allclose, atol=1e-6)
    assert close(out["three"][1], mom_grad) and not close(out["three"][1], tm_grad)
    assert out["three"][0] == pytest.approx(tm_value, abs=1e-5)
    assert close(out["per_token"][1], tm_grad) and out["per_token"][0] == pytest.approx(tm_value, abs=1e-5)
    for label in ("same", "detach", "clone"):
        assert close(out[label][1], mom_grad)
    assert out["same"][0] == pytest.approx(mom_value / 2, abs=1e-5)
    assert out["detach"][0] == pytest.approx(mom_value / 2, abs=1e-5)
    assert out["clone"][0] == pytest.approx(mom_value, abs=1e-5)


def test_train_step_report_formulas():
    from snippets.train.loss_flow import train_step_report

    pairs = [{"lm loss": torch.tensor([6.0, 3.0])}, {"lm loss": torch.tensor([2.0, 1.0])}]
    assert train_step_report(pairs) == pytest.approx(8 / 4)
    singles = [{"lm loss": torch.tensor(1.0)}, {"lm loss": torch.tensor(3.0)}]
    assert train_step_report(singles) == pytest.approx(2.0)


def _recorded_step(num_layers):
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    from snippets.record import recorder
    from snippets.train import loss_flow  # noqa: F401 - param_table first: quiet imports

    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=num_layers,
        hidden_size=16,
        num_attention_heads=4,
        tensor_model_parallel_size=2,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=32,
        max_sequence_length=8,
        share_embeddings_and_output_weights=True,
    )
    batches = loss_flow.microbatches(1, 2, 8, 32, [16])

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        output = model(
            batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
        )
        return output, partial(loss_flow.masked_token_sum, batch["loss_mask"])

    with recorder.record() as calls:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=model,
            num_microbatches=1,
            seq_length=8,
            micro_batch_size=2,
        )
    return calls


def test_gpt_tp_collectives_match_a_recorded_two_layer_step():
    from snippets.train.loss_flow import annotate, gpt_tp_collectives

    calls = run_ranks(_recorded_step, 2, 2, grid=dict(tp=2))[0]
    assert len(calls) == len(gpt_tp_collectives(2)) == (1 + 4 + 3) + (1 + 4)
    table = annotate(calls, num_layers=2)  # raises if the order differs
    assert all(row[-1] for row in table.rows)
    with pytest.raises(ValueError):
        annotate(calls, num_layers=1)
