"""Note 05's experiment: one forward + backward of a real ``GPTModel`` through Megatron's schedule,
with the ``loss_func`` contract of ``pretrain_gpt.py`` (or simple loop's), at any size.

``one_step`` builds the model under TP (:func:`build_gpt`: local spec, shared word embedding and
output layer, ``parallel_output=True`` as ``gpt_builder`` passes it), hands
``get_forward_backward_func()`` a ``forward_step`` (:func:`forward_step_with`) whose ``loss_func`` is
:func:`snippets.train.loss_flow.masked_token_sum` (3 values) or
:func:`snippets.train.loss_flow.masked_mean` (2 values), and records every collective. Micro-batches
keep different numbers of tokens in their loss mask (:func:`tokens_kept`), so how the loss is divided
shows. :func:`who_divides` runs the schedule once per way of writing ``loss_func`` and once with
``calculate_per_token_loss`` on a DDP-wrapped model, and says which objective each gradient is.
Note 05 runs these at hidden 16, vocab 32 on TP=1 and TP=2 and compares every gradient;
``python -m snippets.run loss --dims qwen3-8b --layers 2 --tp 8`` prints the same collectives at a
real model's shapes.
"""

from __future__ import annotations

from functools import partial

import torch


def tokens_kept(dims) -> list[int]:
    """Tokens each micro-batch keeps in its loss mask: all of them, then 3/8 of them, alternating
    (note 05's 16 and 6 of 2 x 8)."""
    n = dims.micro_batch_size * dims.seq
    return [n if i % 2 == 0 else max(1, 3 * n // 8) for i in range(dims.microbatches)]


def build_gpt(dims, tp, device="cpu"):
    """The note's ``GPTModel`` on this rank: local spec, word embedding shared with the output layer,
    ``parallel_output=True``, no dropout (so runs compare exactly), seeded as every rank agrees."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        use_cpu_initialization=device == "cpu",
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    with torch.device(device):
        return GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            parallel_output=True,
            share_embeddings_and_output_weights=True,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )


def batches(dims, device="cpu") -> list[dict]:
    """The note's micro-batches (:func:`tokens_kept` tokens in each loss mask), on ``device``."""
    from snippets.train.loss_flow import microbatches

    made = microbatches(
        dims.microbatches,
        micro_batch_size=dims.micro_batch_size,
        seq_length=dims.seq,
        vocab_size=dims.vocab,
        tokens_kept=tokens_kept(dims),
    )
    return [{k: v.to(device) for k, v in b.items()} for b in made]


def forward_step_with(loss_func):
    """A ``forward_step_func`` as the schedule calls it: run the model with labels (per-token loss
    ``[b, s]``) and hand back ``loss_func`` with this micro-batch's ``loss_mask`` bound."""

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        output = model(
            batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
        )
        return output, partial(loss_func, batch["loss_mask"])

    return forward_step


def one_step(dims, tp, loss_contract="three", report="same", device="cpu", keep_tensors=True):
    """On every rank: the schedule over ``dims.microbatches`` micro-batches, recorded; the
    per-micro-batch reports, and with ``keep_tensors`` the gradients and micro-batch 0's logits."""
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.config import param_table
    from snippets.record import recorder
    from snippets.train.loss_flow import masked_mean, masked_token_sum

    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    model = build_gpt(dims, tp, device)
    loss_func = masked_token_sum if loss_contract == "three" else partial(masked_mean, report=report)
    data = batches(dims, device)
    forward_backward_func = get_forward_backward_func()
    with recorder.record() as calls:
        reports = forward_backward_func(
            forward_step_func=forward_step_with(loss_func),
            data_iterator=iter(data),
            model=model,
            num_microbatches=dims.microbatches,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
            forward_only=False,
        )
    out = dict(
        schedule=forward_backward_func.__name__,
        calls=calls,
        reports=[{k: v.detach().clone().cpu() for k, v in r.items()} for r in reports],
        rows=param_table.param_rows(model),
    )
    if keep_tensors:
        with torch.no_grad():  # after the step, outside the recording: this rank's logits and per-token loss
            b = data[0]
            logits = model(b["tokens"], b["position_ids"], b["attention_mask"])
            token_loss = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])
        out.update(
            grads={n: p.grad.clone() for n, p in model.named_parameters()},
            logits=logits,
            token_loss=token_loss,
            labels=b["labels"],
        )
    return out


WAYS = [
    ("3 个值（pretrain_gpt）", "three", None),
    ("2 个值，报告 = loss 本身（simple loop）", "two", "same"),
    ("2 个值，报告 = loss.detach()", "two", "detach"),
    ("2 个值，报告 = loss.detach().clone()", "two", "clone"),
]
"""The ways of writing ``loss_func`` :func:`who_divides` runs: label, contract, what the report holds."""


def who_divides(dims):
    """On one rank (TP=1): the schedule once per way in :data:`WAYS`, then with
    ``calculate_per_token_loss`` on a DDP-wrapped model (there ``finalize_model_grads`` divides).
    Returns the two objectives' values (mean of micro-batch means, global token mean, by plain
    autograd) and per run ``(label, logged lm loss, grad == mean of means, grad == token mean)``."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.train import loss_flow

    parallel_state.initialize_model_parallel()
    model = build_gpt(dims, tp=1)
    data = batches(dims)
    targets = loss_flow.objective_gradients(model, data)  # plain autograd, the two references

    def schedule(module, loss_func):
        return get_forward_backward_func()(
            forward_step_func=forward_step_with(loss_func),
            data_iterator=iter(data),
            model=module,
            num_microbatches=dims.microbatches,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )

    rows = []
    for label, contract, report in WAYS:
        model.zero_grad()
        if contract == "three":
            loss_func = loss_flow.masked_token_sum
        else:
            loss_func = partial(loss_flow.masked_mean, report=report)
        reports = schedule(model, loss_func)
        rows.append((label, loss_flow.train_step_report(reports), loss_flow.flat_grad(model.parameters())))

    model.zero_grad()  # per-token loss: the schedule does not divide, finalize_model_grads does
    model.config.calculate_per_token_loss = True
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(
        config=model.config, ddp_config=DistributedDataParallelConfig(), module=model
    )
    reports = schedule(ddp, loss_flow.masked_token_sum)
    rows.append(
        (
            "3 个值 + calculate_per_token_loss（DDP）",
            loss_flow.train_step_report(reports),
            loss_flow.flat_grad(model.parameters(), "main_grad"),
        )
    )
    values = {k: v[0] for k, v in targets.items()}
    return values, [
        (label, report, *[torch.allclose(grad, target[1], atol=1e-6) for target in targets.values()])
        for label, report, grad in rows
    ]


def run(dims, par) -> dict:
    """On every rank (the runner): one step with ``pretrain_gpt.py``'s three-value contract."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    return one_step(dims, par.tp, device=par.device, keep_tensors=False)


def tables(results: list, dims, par) -> list:
    from snippets.train.loss_flow import annotate, train_step_report

    r0 = results[0]
    calls = r0["calls"]
    per_microbatch = len(calls) // dims.microbatches

    def sequence(start):
        return [(c.phase, c.api, c.before, c.where) for c in calls[start : start + per_microbatch]]

    same = all(sequence(i) == sequence(0) for i in range(0, len(calls), per_microbatch))
    return [
        f"schedule: {r0['schedule']}",
        f"每个 micro-batch 的报告（rank 0）: {[[round(x, 4) for x in r['lm loss'].tolist()] for r in r0['reports']]}",
        f"train_step 会记下的 lm loss: {round(train_step_report(r0['reports']), 4)}",
        f"collective 总数: {len(calls)}  每个 micro-batch 的序列相同: {same}",
        annotate(calls[:per_microbatch], num_layers=dims.layers),
    ]
