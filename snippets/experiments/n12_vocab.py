"""Note 12's experiment: the vocabulary split over TP -- ``VocabParallelEmbedding`` and the
vocab-parallel cross entropy -- at any vocabulary, hidden and sequence size.

``embedding_run`` builds the real ``VocabParallelEmbedding(vocab, hidden)`` twice (all-reduce, and
``reduce_scatter_embeddings=True`` as under sequence parallel), looks up ``[b, s]`` tokens and
backpropagates, recording the collectives; ``cross_entropy_run`` feeds this rank's slice of one
``[s, b, vocab]`` logits tensor (:func:`ce_inputs`, the same on every rank) to
``vocab_parallel_cross_entropy`` without and with label smoothing, and to the fused version. Note 12
compares everything with dense ``F.embedding`` / ``F.cross_entropy`` at vocab 16; ``python -m
snippets.run vocab --dims qwen3-8b --tp 8`` shows the same calls at Qwen3's 151,936 tokens (a
multiple of 8, so no padding is needed there; note 12 pads with Megatron's own
``vocab_size_with_padding``).
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table

ALPHA = 0.1
"""The label smoothing note 12 runs (besides none)."""


def _model_parallel(tp):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)


def embedding_run(dims, tp, device="cpu", keep_tensors=True):
    """On every rank: the real embedding without and with ``reduce_scatter_embeddings``, one
    recorded lookup + backward each; with ``keep_tensors`` also the output, the weight gradient,
    the tokens and the whole table gathered from every rank (note 12's dense reference)."""
    import torch.distributed as dist
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import VocabParallelEmbedding

    from snippets.record import recorder

    _model_parallel(tp)
    V, H = dims.vocab, dims.hidden
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
    tokens = torch.randint(
        0, V, (dims.micro_batch_size, dims.seq), generator=torch.Generator().manual_seed(1)
    ).to(device)  # [b, s]
    out = {}
    for sp in (False, True):
        torch.manual_seed(0)
        emb = VocabParallelEmbedding(
            V, H, init_method=torch.nn.init.normal_, config=config, reduce_scatter_embeddings=sp
        ).to(device)
        with recorder.record() as calls:
            y = emb(tokens)
            y.pow(2).sum().backward()
        out[sp] = dict(
            calls=calls,
            shape=list(emb.weight.shape),
            out_shape=list(y.shape),
            range=(emb.vocab_start_index, emb.vocab_end_index),
        )
        if keep_tensors:
            out[sp].update(y=y.detach(), grad=emb.weight.grad)
    if not keep_tensors:
        return out
    shards = [torch.empty(V // tp, H, device=device) for _ in range(tp)]
    dist.all_gather(shards, emb.weight.detach())  # the whole table, for the reference (not recorded)
    return {"tokens": tokens, "full": torch.cat(shards), **out}


def ce_inputs(dims, device="cpu"):
    """``[s, b, vocab]`` logits, ``[s, b]`` targets and a per-token weight, the same everywhere."""
    s, b, V = dims.seq, dims.micro_batch_size, dims.vocab
    logits = torch.randn(s, b, V, generator=torch.Generator().manual_seed(3)) * 2
    target = torch.randint(0, V, (s, b), generator=torch.Generator().manual_seed(4))
    weight = torch.rand(s, b, generator=torch.Generator().manual_seed(5))
    return logits.to(device), target.to(device), weight.to(device)


def cross_entropy_run(dims, tp, device="cpu", keep_tensors=True):
    """On every rank: this rank's slice of the logits through ``vocab_parallel_cross_entropy``
    (label smoothing 0 and :data:`ALPHA`) and the fused version, backward with a weighted loss,
    recorded; with ``keep_tensors`` also the losses, the gradients and the input after forward and
    after backward (the function overwrites it: note 12's open question 5)."""
    from megatron.core import parallel_state
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from snippets.record import recorder

    _model_parallel(tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    logits, target, weight = ce_inputs(dims, device)
    out = {}
    for alpha in (0.0, ALPHA):
        local = logits.chunk(tp, dim=-1)[rank].clone().requires_grad_()
        with recorder.record() as calls:
            loss = vocab_parallel_cross_entropy(
                local,
                target,
                label_smoothing=alpha,
                tp_group=parallel_state.get_tensor_model_parallel_group(),
            )  # the TP group passed in, as GPTModel's loss does at 0.19.0 (language_module.py:194)
            after_forward = local.detach().clone() if keep_tensors else None
            (loss * weight).sum().backward()
        out[alpha] = dict(calls=calls, local_shape=list(local.shape))
        if keep_tensors:
            out[alpha].update(
                loss=loss.detach(),
                grad=local.grad,
                after_forward=after_forward,
                after_backward=local.detach().clone(),
            )
    if device == "cpu":
        from torch._dynamo import config as dynamo

        dynamo.disable = True  # the fused version is torch.compile'd: on CPU run it eagerly, same math
    local = logits.chunk(tp, dim=-1)[rank].clone().requires_grad_()
    with recorder.record() as calls:
        loss = fused_vocab_parallel_cross_entropy(
            local, target, parallel_state.get_tensor_model_parallel_group()
        )
        (loss * weight).sum().backward()
    out["fused"] = dict(calls=calls)
    if keep_tensors:
        out["fused"].update(loss=loss.detach(), grad=local.grad)
    return out


def run(dims, par) -> dict:
    """On every rank (the runner): both experiments at ``dims``, without tensors."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    return dict(
        embedding=embedding_run(dims, par.tp, par.device, keep_tensors=False),
        ce=cross_entropy_run(dims, par.tp, par.device, keep_tensors=False),
    )


# ----------------------------------------------------------------------------- note 12's tables

EMBEDDING_MEANINGS = {
    ("all_reduce", "tensor_parallel/mappings.py::_reduce"): "各卡的查表结果（不归本卡的 token 是 0）相加",
    (
        "reduce_scatter_tensor",
        "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim",
    ): "相加，并按 s 切给各卡（SP）",
    (
        "all_gather_into_tensor",
        "tensor_parallel/mappings.py::_gather_along_first_dim",
    ): "reduce-scatter 的 backward：输出梯度拼回完整 s",
}

CE_MEANINGS = [
    "MAX：每个 token 的 logit 最大值（数值稳定）",
    "SUM：target 的 logit（只有拥有它的卡非 0）",
    "SUM：Σ exp(logit − max)，完整词表上的归一化",
]
"""The three all-reduces of ``vocab_parallel_cross_entropy``, in the order they are issued."""


def embedding_comm_table(rank_result):
    from snippets.tp.layer_walk import record_table

    return record_table(rank_result[False]["calls"] + rank_result[True]["calls"], EMBEDDING_MEANINGS)


def ce_comm_table(calls):
    from snippets.tp.layer_walk import record_table

    what = dict(zip(map(id, calls), CE_MEANINGS))
    return record_table(calls, lambda c: what[id(c)])


def tables(results: list, dims, par) -> list:
    emb, ce = results[0]["embedding"], results[0]["ce"]
    ranges = [r["embedding"][False]["range"] for r in results]
    return [
        Table(
            ["V", "TP", "每卡 weight", "各卡词表段", "输出（不开 / 开 reduce-scatter）"],
            [
                [
                    dims.vocab,
                    par.tp,
                    emb[False]["shape"],
                    ranges if par.tp <= 2 else ranges[:2] + ["…"],
                    f"{emb[False]['out_shape']} / {emb[True]['out_shape']}",
                ]
            ],
        ),
        f"embedding 的通信（TP={par.tp}，rank 0）:",
        embedding_comm_table(emb),
        f"交叉熵的通信（每卡 logits {ce[0.0]['local_shape']}，rank 0）:",
        ce_comm_table(ce[0.0]["calls"]),
        f"融合版的通信: {[(c.api, c.before) for c in ce['fused']['calls']]}",
    ]
