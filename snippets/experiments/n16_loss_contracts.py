"""Note 16's second experiment: the two ``loss_func`` contracts under context parallelism.

Megatron's schedule treats what ``loss_func`` returns in two ways (``schedules.py::forward_step``):
two values ``(loss, report)`` are multiplied by the CP size; three values ``(loss, num_tokens,
report)`` are divided by ``num_tokens`` -- unless ``calculate_per_token_loss`` is set, when the
division waits for ``finalize_model_grads`` and uses the token count summed over the DP x CP group.
:func:`contracts_step` runs one real step of each variant on a CP = 2 x DP = 2 grid: a small
attention model (embedding -> ``linear_qkv`` -> ring attention over the CP group -> output ->
per-token cross entropy), wrapped in Megatron's ``DistributedDataParallel``, driven by
``get_forward_backward_func()`` with ``config.finalize_model_grads_func = finalize_model_grads``,
exactly as the training entry wires them. Each rank then compares the reduced gradient with the
two averages one process computes over whole sequences: the mean over samples of each sample's
token mean, and the mean over all tokens.
"""

from __future__ import annotations

import torch

VARIANTS = {
    # name: (values returned, how the loss is divided, calculate_per_token_loss)
    "two_local_mean": (2, "本地和 ÷ 本地 token 数（simple loop 的写法）", False),
    "two_cp_mean": (2, "本地和 ÷ CP 群合计的 token 数（旧版 pretrain_gpt 的写法）", False),
    "three": (3, "本地和、本地 token 数（pretrain_gpt.py）", False),
    "three_per_token": (3, "同上，打开 calculate_per_token_loss", True),
}

MASKS = {"even": (8, 8), "uneven": (8, 3)}
"""Loss-mask tokens kept by sample 0 and sample 1 (of 8): ``uneven`` leaves CP rank 0 of sample 1
with 2 loss tokens and CP rank 1 with 1."""


class TinyAttentionLM(torch.nn.Module):
    """Embedding -> ``linear_qkv`` -> causal attention -> output layer -> per-token loss ``[b, s]``."""

    def __init__(self, config, vocab, attention):
        from megatron.core.enums import ModelType

        super().__init__()
        self.config = config  # Megatron's DDP and schedule read the model's config ...
        self.model_type = ModelType.encoder_or_decoder  # ... and its model type
        self.embedding = torch.nn.Embedding(vocab, config.hidden_size)
        self.linear_qkv = torch.nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.output_layer = torch.nn.Linear(config.hidden_size, vocab, bias=False)
        self.attention, self.heads = attention, config.num_attention_heads

    def set_input_tensor(self, tensor):  # the schedule calls it; one stage, so there is none
        pass

    def forward(self, tokens, labels):
        x = self.embedding(tokens).transpose(0, 1)  # [s, b, h], sequence first as in Megatron
        q, k, v = self.linear_qkv(x).view(*x.shape[:2], self.heads, -1).chunk(3, dim=-1)
        logits = self.output_layer(self.attention(q, k, v).flatten(2))
        return torch.nn.functional.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")  # [b, s]


def samples(seq_len, vocab, mask):
    """One ``[1, s]`` sample per DP rank, the same on every rank; ``mask`` picks the loss masks."""
    batches = []
    for d, kept in enumerate(MASKS[mask]):
        gen = torch.Generator().manual_seed(d)
        tokens = torch.randint(0, vocab, (1, seq_len), generator=gen)
        loss_mask = torch.zeros(1, seq_len)
        loss_mask[0, :kept] = 1.0
        batches.append(dict(tokens=tokens, labels=tokens.roll(-1, dims=1), loss_mask=loss_mask))
    return batches


def contracts_step(seq_len=8, hidden=8, heads=2, vocab=32):
    """On every rank of a CP = 2, DP = 2 grid: one step per (mask, variant); the reduced gradient of
    ``linear_qkv`` against the whole-sequence references, and the token counts each rank saw."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig
    from megatron.core.utils import get_batch_on_this_cp_rank

    from snippets.cp.ring_attention import causal_attention, ring_attention

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    cp_group = parallel_state.get_context_parallel_group()
    dp_rank = parallel_state.get_data_parallel_rank()
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-6)  # noqa: E731

    def build(per_token, attention):
        config = TransformerConfig(
            num_layers=1,
            hidden_size=hidden,
            num_attention_heads=heads,
            context_parallel_size=2,
            calculate_per_token_loss=per_token,
        )
        torch.manual_seed(0)  # the same weights on every rank: CP and DP ranks hold replicas
        return TinyAttentionLM(config, vocab, attention)

    results = {}
    for mask in MASKS:
        whole = samples(seq_len, vocab, mask)
        reference = build(False, causal_attention)  # one process, whole sequences, no CP
        sums = [(reference(s["tokens"], s["labels"]) * s["loss_mask"]).sum() for s in whole]
        counts = [s["loss_mask"].sum() for s in whole]
        per_sample_mean = sum(S / n for S, n in zip(sums, counts)) / len(whole)
        token_mean = sum(sums) / sum(counts)
        refs = {}
        for name, loss in (("sample_mean", per_sample_mean), ("token_mean", token_mean)):
            reference.zero_grad()
            loss.backward(retain_graph=True)
            refs[name] = reference.linear_qkv.weight.grad.clone()
        # this rank's two chunks
        local = get_batch_on_this_cp_rank(dict(whole[dp_rank]), is_hybrid_cp=False, cp_group=cp_group)

        for name, (_, _, per_token) in VARIANTS.items():
            model = build(per_token, lambda q, k, v: ring_attention(q, k, v, cp_group))
            ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
            model.config.no_sync_func = ddp.no_sync
            model.config.finalize_model_grads_func = finalize_model_grads

            def loss_func(loss_mask, output_tensor, name=name):
                mask_ = loss_mask.reshape(-1).float()
                total = (output_tensor.reshape(-1) * mask_).sum()
                count = mask_.sum()
                if name == "two_local_mean":
                    return total / count, {"lm loss": total.detach() / count}
                if name == "two_cp_mean":
                    cp_count = count.clone()
                    torch.distributed.all_reduce(cp_count, group=cp_group)
                    return total / cp_count, {"lm loss": total.detach() / cp_count}
                return total, count.to(torch.int), {"lm loss": torch.stack([total.detach(), count])}

            def forward_step(data_iterator, model):
                batch = next(data_iterator)
                output = model(batch["tokens"], batch["labels"])
                return output, lambda out, mask_=batch["loss_mask"]: loss_func(mask_, out)

            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter([local]),
                model=[ddp],
                num_microbatches=1,
                seq_length=seq_len // 2,
                micro_batch_size=1,
            )
            grad = model.linear_qkv.weight.main_grad
            results[mask, name] = dict(
                sample_mean=close(grad, refs["sample_mean"]),
                token_mean=close(grad, refs["token_mean"]),
                ratio=round(float(grad.norm() / refs["sample_mean"].norm()), 4),
            )
        results[mask, "local_tokens"] = int(local["loss_mask"].sum())
        results[mask, "refs_equal"] = close(refs["sample_mean"], refs["token_mean"])
    return results
