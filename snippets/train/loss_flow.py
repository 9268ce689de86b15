"""What a GPT ``loss_func`` hands to Megatron's schedule, and who divides the loss by what (note 05).

``forward_step`` returns ``(output_tensor, loss_func)``; the schedule calls
``loss_func(output_tensor)`` on the last pipeline stage
(``schedules.py::forward_step_calc_loss``) and, depending on how many values come back, scales the
first one **in place** before ``backward``:

* **three values** ``(loss, num_tokens, report)`` -- ``pretrain_gpt.py::loss_func``'s contract,
  restated by :func:`masked_token_sum`: ``loss`` is the *sum* of the masked per-token losses.
  Unless ``config.calculate_per_token_loss``, the schedule divides it by ``num_tokens`` and by
  ``num_microbatches``. The report ``[sum, count]`` is left alone, and ``training.py::train_step``
  turns the reports of all micro-batches (and DP ranks) into one global token mean.
* **two values** ``(loss, report)`` -- the simple loop's contract, :func:`masked_mean`: ``loss`` is
  already a mean; the schedule multiplies it by the CP size and divides it by ``num_microbatches``.
  If ``report`` holds that same tensor, or a ``detach()`` of it (same storage), the logged value is
  divided too.

:func:`train_step_report` restates how ``train_step`` averages the reports.
``tests/ranks/test_loss_flow.py`` runs the real schedule and checks every statement above against autograd
and plain formulas.
"""

from __future__ import annotations

import torch


def masked_token_sum(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """``(sum of masked token losses, token count, report)``: the three-value contract."""
    mask = loss_mask.reshape(-1).float()
    total = (output_tensor.reshape(-1).float() * mask).sum()
    count = mask.sum().to(torch.int)
    # a new tensor: the schedule's in-place division of `total` must not reach the report
    return total, count, {"lm loss": torch.stack([total.detach(), count.float()])}


def masked_mean(loss_mask: torch.Tensor, output_tensor: torch.Tensor, report: str = "same"):
    """``(mean masked token loss, report)``: the two-value contract.

    ``report`` chooses what the report holds: ``"same"`` the loss tensor itself (as the simple loop
    does), ``"detach"`` ``loss.detach()``, ``"clone"`` ``loss.detach().clone()``.
    """
    mask = loss_mask.reshape(-1).float()
    loss = (output_tensor.reshape(-1).float() * mask).sum() / mask.sum()
    kept = {"same": loss, "detach": loss.detach(), "clone": loss.detach().clone()}[report]
    return loss, {"lm loss": kept}


def train_step_report(losses_reduced: list[dict], key: str = "lm loss") -> float:
    """One number from the per-micro-batch reports, as ``train_step`` computes it on one DP rank:
    ``[sum, count]`` pairs -> total sum / total count; single values -> their mean."""
    values = [report[key].detach().reshape(-1) for report in losses_reduced]
    if values[0].numel() == 2:
        total = torch.stack(values).sum(dim=0)
        return float(total[0] / total[1])
    return float(torch.cat(values).mean())


def microbatches(
    num: int, micro_batch_size: int, seq_length: int, vocab_size: int, tokens_kept: list[int], seed: int = 0
) -> list[dict]:
    """``num`` micro-batches with the five GPT fields; micro-batch ``i`` keeps ``tokens_kept[i]``
    positions in its loss mask (so micro-batches can count different numbers of tokens)."""
    gen = torch.Generator().manual_seed(seed)
    causal = torch.ones(seq_length, seq_length).tril() < 0.5  # True = masked
    batches = []
    for i in range(num):
        loss_mask = torch.zeros(micro_batch_size * seq_length)
        loss_mask[: tokens_kept[i]] = 1.0
        batches.append(
            dict(
                tokens=torch.randint(0, vocab_size, (micro_batch_size, seq_length), generator=gen),
                labels=torch.randint(0, vocab_size, (micro_batch_size, seq_length), generator=gen),
                loss_mask=loss_mask.view(micro_batch_size, seq_length),
                attention_mask=causal.expand(micro_batch_size, 1, seq_length, seq_length),
                position_ids=torch.arange(seq_length).repeat(micro_batch_size, 1),
            )
        )
    return batches


def gpt_tp_collectives(num_layers: int) -> list[tuple[str, str, str]]:
    """The TP collectives one micro-batch of a local-spec ``GPTModel`` issues without sequence
    parallel, in order, as ``(phase, issuing function, meaning)``. The order follows the model: the
    embedding, then per layer ``linear_proj`` and ``linear_fc2`` (row parallel: sum the partial
    outputs), the vocab-parallel cross entropy; backward runs from the output layer down through
    ``linear_fc1`` and ``linear_qkv`` (column parallel: sum the input gradients)."""
    reduce, ce, col_bwd = (
        "tensor_parallel/mappings.py::_reduce",
        "tensor_parallel/cross_entropy.py::forward",
        "tensor_parallel/layers.py::backward",
    )
    forward = [("forward", reduce, "词嵌入：各 rank 只查得到本段词表，查不到填 0，相加得完整嵌入")]
    for i in range(num_layers):
        forward += [
            ("forward", reduce, f"第 {i} 层 linear_proj（行并行）的部分和相加"),
            ("forward", reduce, f"第 {i} 层 linear_fc2（行并行）的部分和相加"),
        ]
    forward += [
        ("forward", ce, "交叉熵 MAX：每个 token 在全词表上的最大 logit（数值稳定）"),
        ("forward", ce, "交叉熵 SUM：目标词的 logit（只有持有该词的 rank 非零）"),
        ("forward", ce, "交叉熵 SUM：Σ exp(logit − max)，softmax 的分母"),
    ]
    backward = [("backward", col_bwd, "output_layer（列并行）输入梯度相加：f 的反向")]
    for i in reversed(range(num_layers)):
        backward += [
            ("backward", col_bwd, f"第 {i} 层 linear_fc1 输入梯度相加"),
            ("backward", col_bwd, f"第 {i} 层 linear_qkv 输入梯度相加"),
        ]
    return forward + backward


def annotate(calls, num_layers: int):
    """The roadmap table for recorded ``calls`` (whole micro-batches), each row given its meaning;
    raises if the recording does not follow :func:`gpt_tp_collectives`."""
    from snippets.record.recorder import communication_table

    expected = gpt_tp_collectives(num_layers)
    table = communication_table(calls)
    for i, (call, row) in enumerate(zip(calls, table.rows)):
        phase, where, meaning = expected[i % len(expected)]
        if (call.phase, call.where) != (phase, where):
            raise ValueError(f"collective #{i + 1} is {call.phase} {call.where}, expected {phase} {where}")
        row[-1] = meaning
    if len(calls) % len(expected):
        raise ValueError(f"{len(calls)} collectives is not a whole number of micro-batches")
    return table


OBJECTIVES = ("micro-batch 平均的平均", "全局 token 平均")
"""The two ways to average the loss of micro-batches whose loss masks keep different token counts."""


def flat_grad(params, attr: str = "grad") -> torch.Tensor:
    """All gradients (``.grad``, or DDP's ``.main_grad``) of ``params`` as one flat vector."""
    return torch.cat([getattr(p, attr).flatten() for p in params])


def objective_gradients(model, batches: list[dict]) -> dict[str, tuple[float, torch.Tensor]]:
    """``{objective: (value, flat gradient)}`` for :data:`OBJECTIVES`, by plain autograd on
    ``model`` (one fresh forward per objective: the vocab-parallel cross entropy's backward reuses
    its saved buffers, so one graph cannot be walked twice). Leaves ``model``'s grads dirty."""
    out = {}
    for kind in OBJECTIVES:
        model.zero_grad()
        sums, counts = [], []
        for b in batches:
            per_token = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])
            sums.append((per_token * b["loss_mask"]).sum())
            counts.append(b["loss_mask"].sum())
        if kind == OBJECTIVES[0]:
            value = sum(s / n for s, n in zip(sums, counts)) / len(batches)
        else:
            value = sum(sums) / sum(counts)
        value.backward()
        out[kind] = (value.item(), flat_grad(model.parameters()))
    return out
