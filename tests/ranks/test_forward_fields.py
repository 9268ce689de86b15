"""snippets.data.forward_fields puts probes on the readers of each batch field inside a real GPTModel.
On one CPU rank: each field must be seen by its reader, unchanged, and the probes must be gone
afterwards."""

from __future__ import annotations

import torch

from snippets.ranks.launch import run_ranks, warm_up


def setup_module():
    warm_up()


def _probe(position_embedding_type):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.data.forward_fields import readers_of, record_forward_inputs
    from snippets.models.tiny_gpt import tiny_config

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        tiny_config(num_layers=2),
        get_gpt_layer_local_spec(),
        vocab_size=32,
        max_sequence_length=8,
        position_embedding_type=position_embedding_type,
    )
    gen = torch.Generator().manual_seed(0)
    batch = dict(
        tokens=torch.randint(0, 32, (2, 8), generator=gen),
        labels=torch.randint(0, 32, (2, 8), generator=gen),
        position_ids=torch.arange(8).repeat(2, 1),
        attention_mask=torch.ones(1, 1, 8, 8).tril() < 0.5,
    )
    with torch.no_grad(), record_forward_inputs(model) as seen:
        probed = model(
            batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
        )
    with torch.no_grad():
        plain = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    hooks_left = sum(len(m._forward_pre_hooks) for m in model.modules())
    rotary = [v for r, a, v in seen if r == "rotary_pos_emb"]
    return (
        {k: readers_of(v, seen) for k, v in batch.items()},
        torch.equal(probed, plain),
        hooks_left,
        "compute_language_model_loss" in vars(model),
        rotary,
    )


def test_learned_absolute_positions_read_every_field():
    ((readers, same, hooks, wrapped, rotary),) = run_ranks(_probe, 1, "learned_absolute")
    assert readers["tokens"] == ["embedding.word_embeddings(input_ids)"]
    assert readers["position_ids"] == ["embedding.position_embeddings(position_ids)"]
    assert readers["labels"] == ["compute_language_model_loss(labels)"]
    assert readers["attention_mask"] == [
        f"decoder.layers.{i}.self_attention.core_attention(attention_mask)" for i in range(2)
    ]
    assert same and hooks == 0 and not wrapped and rotary == []


def test_rope_reads_a_length_not_the_position_ids():
    ((readers, same, hooks, wrapped, rotary),) = run_ranks(_probe, 1, "rope")
    assert readers["position_ids"] == [] and rotary == [8]
    assert same and hooks == 0 and not wrapped
