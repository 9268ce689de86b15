"""A tiny real ``GPTModel`` (local spec) whose weights do not depend on how it is split.

Notes 13-15 compare a pipelined or data-parallel run of Megatron with one process running the
whole model on the whole batch. Both sides must start from the same weights, and a seed is not
enough: a pipeline stage builds only its own layers, so it draws a different part of the random
stream than the unsplit model does. :func:`init_by_global_name` therefore sets every parameter
from a generator seeded by the parameter's *global* name -- the name it has in the unsplit model,
``decoder.layers.<global index>...`` -- so stage 1's first layer gets exactly the weights that
layer 2 of the whole model gets.

Everything else here follows Megatron's own contracts: :func:`forward_step` is a
``forward_step_func`` as the schedules call it (``(data_iterator, model) -> (output, loss_func)``),
:func:`loss_func` returns ``(loss, {"lm loss": ...})`` like ``pretrain_gpt.py`` does.
"""

from __future__ import annotations

import zlib
from functools import partial

import torch

VOCAB = 32  # vocabulary size
SEQ = 8  # sequence length
MBS = 2  # micro-batch size (sequences per micro-batch)


def tiny_config(**overrides):
    """A ``TransformerConfig`` small enough for CPU ranks; ``overrides`` set parallel sizes etc.

    No linear biases: the key projection's bias has an exactly zero gradient (softmax ignores a
    shift shared by all keys), so its float gradient is pure rounding noise, and Adam turns noise
    into full-size steps; with biases, two correct runs differ after one Adam step.
    """
    from megatron.core.transformer import TransformerConfig

    kwargs = dict(
        num_layers=4,
        hidden_size=16,
        ffn_hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=False,
        pipeline_dtype=torch.float32,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def global_name(model, name: str) -> str:
    """The name parameter ``name`` of ``model`` (one pipeline stage) has in the unsplit model."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        owner = model
        for part in parts[: i + 1]:
            owner = getattr(owner, part)
        # layer_number is 1-based and global: offset of this stage + local index + 1.
        parts[i + 1] = str(owner[int(parts[i + 1])].layer_number - 1)
    return ".".join(p for p in parts if p != "module")  # a DDP wrapper adds "module."


def init_by_global_name(model, std: float = 0.2) -> None:
    """Overwrite every parameter with values drawn from a generator seeded by its global name."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = global_name(model, name)
            gen = torch.Generator().manual_seed(zlib.crc32(full.encode()))
            values = torch.randn(param.shape, generator=gen) * std
            if full.endswith("layernorm.weight"):
                values += 1.0  # norms start near identity, as in any real init
            param.copy_(values)


def microbatches(num: int, micro_batch_size: int = MBS, seed: int = 0) -> list[dict]:
    """``num`` micro-batches of random tokens, with the fields ``GPTModel.forward`` takes."""
    gen = torch.Generator().manual_seed(seed)
    causal = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]  # True = masked
    return [
        dict(
            tokens=torch.randint(0, VOCAB, (micro_batch_size, SEQ), generator=gen),
            labels=torch.randint(0, VOCAB, (micro_batch_size, SEQ), generator=gen),
            position_ids=torch.arange(SEQ).repeat(micro_batch_size, 1),
            attention_mask=causal,
        )
        for _ in range(num)
    ]


def concat(batches: list[dict]) -> dict:
    """One batch holding all sequences of ``batches`` (the single-process reference)."""
    return {
        k: (batches[0][k] if k == "attention_mask" else torch.cat([b[k] for b in batches]))
        for k in batches[0]
    }


def loss_func(output_tensor):
    """Mean per-token loss of one micro-batch, and a copy for logging.

    The copy matters: the schedules divide the returned loss in place by the number of
    micro-batches, and a bare ``detach()`` shares its storage.
    """
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach().clone()}


def forward_step(data_iterator, model):
    """A ``forward_step_func`` for Megatron's schedules: next micro-batch through ``model``.

    Every stage draws the next micro-batch so all data iterators advance together; a stage with
    ``pre_process=False`` ignores the tokens (its input comes from the previous stage).
    """
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func)


def by_global_name(models, what: str = "grad") -> dict:
    """``{global name: tensor}`` over model chunks; ``what`` is ``"grad"``, ``"main_grad"`` or
    ``"param"``."""
    out = {}
    for model in models:
        for name, param in model.named_parameters():
            value = param if what == "param" else getattr(param, what, None)
            if value is not None:
                out[global_name(model, name)] = value.detach().clone()
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest elementwise difference between two ``{name: tensor}`` dicts with the same keys."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k] - b[k]).abs().max().item() for k in a)
