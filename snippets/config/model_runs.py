"""Note 19's runs of a real ``GPTModel``: its TP layers and their traffic, spec against config,
the block spec, the init stds, the TE spec without TE.

Each function runs on ranks started by :func:`snippets.ranks.launch.run_ranks` and returns plain
values (or recorded calls) to the notebook:

- :func:`tp_layers` (2 ranks, TP=2): one-layer GPTs at TP=2, then with sequence parallelism, then
  with sequence parallelism and RoPE; every tensor-parallel layer with its flags
  (:func:`snippets.config.spec_diff.parallel_layers`) and, for one forward (with labels) and
  backward, every collective by the TP layer that issued it
  (:func:`snippets.tp.layer_walk.collectives_by_submodule`);
- :func:`build_conflicts` (1 rank): a layer spec and a config that say different things, and the
  class that was built (or the error);
- :func:`block_spec_layers` (1 rank): ``get_gpt_decoder_block_spec`` with ``moe_layer_freq`` against
  one layer spec repeated;
- :func:`init_stds` (1 rank): the std of each kind of weight after construction;
- :func:`build_with_te_spec` (1 rank): the real Transformer Engine spec on a machine without TE.
"""

from __future__ import annotations

import torch

BASE = dict(
    num_layers=1,
    hidden_size=16,
    num_attention_heads=4,
    ffn_hidden_size=32,
    add_bias_linear=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    use_cpu_initialization=True,
    pipeline_dtype=torch.float32,
)
"""The ``TransformerConfig`` fields of note 19's one-layer models (the experiment's ``tiny``)."""

TP_VARIANTS = {  # label: (TransformerConfig fields, GPTModel arguments)
    "TP=2": ({}, {}),
    "+SP": (dict(sequence_parallel=True), {}),
    "+SP+RoPE": (dict(sequence_parallel=True), dict(position_embedding_type="rope")),
}
"""The three TP=2 models of note 19: plain, sequence parallel, sequence parallel with RoPE."""

CONFLICTS = [  # (get_gpt_layer_local_spec arguments, TransformerConfig fields on top of BASE, module)
    (dict(normalization="RMSNorm"), {}, "input_layernorm"),
    ({}, dict(normalization="RMSNorm"), "input_layernorm"),
    (dict(qk_layernorm=True), {}, "self_attention.q_layernorm"),
    ({}, dict(qk_layernorm=True), "self_attention.q_layernorm"),
    ({}, dict(num_moe_experts=2), "mlp"),
    (dict(num_experts=2), {}, "mlp"),
]
"""Spec and config saying different things about the norm, QK norm and MoE (note 19)."""


def tp_layers(variants=TP_VARIANTS) -> dict:
    """Per variant: the TP layers with their flags, and one forward + backward's collectives by layer."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    from snippets.config import spec_diff
    from snippets.record import recorder
    from snippets.tp.layer_walk import collectives_by_submodule, unattributed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 32, (2, 2, 8), generator=gen)  # [b=2, s=8] each
    position_ids = torch.arange(8).repeat(2, 1)
    causal = torch.triu(torch.ones(1, 1, 8, 8, dtype=torch.bool), diagonal=1)
    out = {}
    for label, (overrides, gpt_kwargs) in variants.items():
        config = TransformerConfig(
            num_layers=1,
            hidden_size=16,
            num_attention_heads=4,
            ffn_hidden_size=32,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            tensor_model_parallel_size=2,
            use_cpu_initialization=True,
            pipeline_dtype=torch.float32,
            **overrides,
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=32,
            max_sequence_length=8,
            parallel_output=True,
            share_embeddings_and_output_weights=True,
            **gpt_kwargs,
        )
        layers = spec_diff.parallel_layers(model)
        paths = [r["path"] for r in layers]
        with recorder.record() as calls, collectives_by_submodule(model, calls, paths) as by:
            model(tokens, position_ids, causal, labels=labels).sum().backward()
        emb = model.embedding.word_embeddings
        out[label] = dict(
            layers=layers,
            by_layer=by,
            calls=calls,
            other=unattributed(calls, by),
            vocab_range=(emb.vocab_start_index, emb.vocab_end_index),
        )
    return out


def build_conflicts(conflicts=CONFLICTS) -> list:
    """Per conflict: (the class built at the module's path, "") or (the error's type, its first line)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.config import spec_diff

    parallel_state.initialize_model_parallel()
    built = []
    for spec_kwargs, overrides, path in conflicts:
        try:
            model = GPTModel(
                config=TransformerConfig(**BASE, **overrides),
                vocab_size=32,
                max_sequence_length=8,
                transformer_layer_spec=get_gpt_layer_local_spec(**spec_kwargs),
            )
            built.append((spec_diff.module_tree(model, strip="decoder.layers.0.")[path], ""))
        except Exception as err:
            built.append((type(err).__name__, str(err).splitlines()[0]))
    return built


def block_spec_layers() -> dict:
    """A 3-layer MoE model from ``get_gpt_decoder_block_spec`` (moe_layer_freq [1, 0, 1]) beside a
    dense one from a single layer spec."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel()
    three = {**BASE, "num_layers": 3}
    config = TransformerConfig(**three, num_moe_experts=2, moe_layer_freq=[1, 0, 1])
    block_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    moe_model = GPTModel(
        config=config, transformer_layer_spec=block_spec, vocab_size=32, max_sequence_length=8
    )
    layer_spec = get_gpt_layer_local_spec()
    dense_model = GPTModel(
        config=TransformerConfig(**three),
        transformer_layer_spec=layer_spec,
        vocab_size=32,
        max_sequence_length=8,
    )
    dense_specs = dense_model.decoder.submodules.layer_specs
    return dict(
        block_spec=type(block_spec).__name__,
        moe_layers=[type(layer.mlp).__name__ for layer in moe_model.decoder.layers],
        dense_specs=len(dense_specs),
        dense_same_object=all(s is layer_spec for s in dense_specs),
    )


def init_stds(num_layers) -> tuple:
    """The std of each kind of 2-D weight of a fresh model (hidden 64, untied), and the two init methods."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.config.config_derived import describe

    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=num_layers,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=64,
        max_sequence_length=8,
        share_embeddings_and_output_weights=False,
    )
    weights = {}
    for name, param in model.named_parameters():
        if name.endswith(".weight") and param.dim() == 2:  # linears and embeddings, not norms
            weights.setdefault(name.split(".")[-2], []).append(param.detach().flatten())
    stds = {kind: round(torch.cat(ws).std().item(), 3) for kind, ws in weights.items()}
    return stds, describe(config.init_method), describe(config.output_layer_init_method)


def build_with_te_spec() -> str:
    """The real TE layer spec (its TE classes are stand-ins without TE) given to ``GPTModel``: the error."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.config.model_specs import transformer_engine_spec_without_te

    parallel_state.initialize_model_parallel()
    with transformer_engine_spec_without_te():  # note 04: the real spec, TE classes as stand-ins
        spec = get_gpt_layer_with_transformer_engine_spec()
    try:
        GPTModel(
            config=TransformerConfig(**BASE),
            transformer_layer_spec=spec,
            vocab_size=32,
            max_sequence_length=8,
        )
    except Exception as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return "built"
