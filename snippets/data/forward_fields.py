"""Which part of a ``GPTModel`` receives which batch field during one forward (note 18).

``pretrain_gpt.py::forward_step`` calls ``model(tokens, position_ids, attention_mask,
labels=labels, loss_mask=loss_mask, packed_seq_params=packed_seq_params)``. Inside, each field
has its own reader: the token ids go to the word embedding, the position ids to the learned
position embedding (if the model has one), the mask to every layer's core attention, the labels
to ``compute_language_model_loss``. :func:`record_forward_inputs` puts a probe on each of those
readers (forward pre-hooks; the loss method is wrapped) and records what it was handed, so a
note can print, from a run, where each field went -- and where one did not go at all.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def record_forward_inputs(model):
    """Yield a list that fills with ``(reader, argument, value)`` during forwards of ``model``.

    ``reader`` is the submodule's name in ``model`` (``embedding.word_embeddings``,
    ``decoder.layers.0.self_attention.core_attention``, ...) or ``compute_language_model_loss``.
    """
    seen, handles = [], []

    def probe(reader, pick):
        def hook(module, args, kwargs):
            for argument, value in pick(args, kwargs).items():
                seen.append((reader, argument, value))

        return hook

    modules = dict(model.named_modules())
    if "embedding" in modules:
        handles.append(
            modules["embedding.word_embeddings"].register_forward_pre_hook(
                probe("embedding.word_embeddings", lambda a, k: {"input_ids": a[0]}), with_kwargs=True
            )
        )
        if "embedding.position_embeddings" in modules:  # only for learned_absolute positions
            handles.append(
                modules["embedding.position_embeddings"].register_forward_pre_hook(
                    probe("embedding.position_embeddings", lambda a, k: {"position_ids": a[0]}),
                    with_kwargs=True,
                )
            )
    if "rotary_pos_emb" in modules:
        handles.append(
            modules["rotary_pos_emb"].register_forward_pre_hook(
                probe("rotary_pos_emb", lambda a, k: {"max_seq_len": a[0]}), with_kwargs=True
            )
        )
    for name, module in modules.items():
        if name.endswith("self_attention.core_attention"):
            handles.append(
                module.register_forward_pre_hook(
                    probe(
                        name,
                        lambda a, k: {
                            "attention_mask": a[3] if len(a) > 3 else k.get("attention_mask"),
                            "packed_seq_params": k.get("packed_seq_params"),
                        },
                    ),
                    with_kwargs=True,
                )
            )

    real_loss = getattr(model, "compute_language_model_loss", None)
    if real_loss is not None:

        def loss(labels, logits):
            seen.append(("compute_language_model_loss", "labels", labels))
            return real_loss(labels, logits)

        model.compute_language_model_loss = loss
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        if real_loss is not None:
            del model.compute_language_model_loss  # back to the class method


def readers_of(value, seen) -> list[str]:
    """The readers that were handed exactly ``value`` (same shape, same elements)."""
    import torch

    return [
        f"{reader}({argument})"
        for reader, argument, got in seen
        if torch.is_tensor(value)
        and torch.is_tensor(got)
        and got.shape == value.shape
        and torch.equal(got, value)
    ]
