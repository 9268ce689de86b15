"""Note 19's experiment: one config, three layer specs, the models they build under TP.

:func:`variants` makes the three (layer spec, config) pairs of note 19 at any ``dims``: the
model's own local spec (its norm and QK norm as ``dims`` says), the same with ``num_experts=2``
(MoE), and with RMSNorm + QK norm switched on in both the spec and the config.
:func:`build_variants` builds a real ``GPTModel`` from each on this rank's TP group and keeps
what came out: every submodule's class (:func:`snippets.config.spec_diff.module_tree`) and every tensor
parallel layer with its flags (:func:`snippets.config.spec_diff.parallel_layers`). ``tables`` prints
whether every rank built the same trees, the module and TP-layer counts, the paths where the
three trees differ, and the expert linears of the MoE model.
"""

from __future__ import annotations

import torch

from snippets.config import spec_diff
from snippets.config.spec_diff import diff_trees, flag_cells
from snippets.record.tables import Table

EXPERTS = 2
"""Experts of the MoE variant (note 19)."""


def base_config(dims, device: str = "cpu") -> dict:
    """The ``TransformerConfig`` fields every variant shares: ``dims``, no dropout, fp32."""
    return dict(
        **dims.transformer_config_kwargs(),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=device != "cuda",
        pipeline_dtype=torch.float32,
    )


def variants(dims) -> dict:
    """label: (layer spec, TransformerConfig fields on top of :func:`base_config`)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    norm = "RMSNorm" if dims.rmsnorm else "LayerNorm"
    return {
        "local": (get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=norm), {}),
        "MoE": (
            get_gpt_layer_local_spec(num_experts=EXPERTS, qk_layernorm=dims.qk_norm, normalization=norm),
            dict(num_moe_experts=EXPERTS),
        ),
        "RMSNorm + QK norm": (
            get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"),
            dict(normalization="RMSNorm", qk_layernorm=True),
        ),
    }


def build_variants(dims, tp, device="cpu"):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(0)
    built = {}
    for label, (spec, overrides) in variants(dims).items():
        config = TransformerConfig(
            **{**base_config(dims, device), **overrides}, tensor_model_parallel_size=tp
        )
        with torch.device(device):
            model = GPTModel(
                config=config,
                transformer_layer_spec=spec,
                vocab_size=dims.vocab,
                max_sequence_length=dims.seq,
                position_embedding_type="rope" if dims.rope else "learned_absolute",
            )
        built[label] = dict(
            tree=spec_diff.module_tree(model, strip="decoder.layers.0."),
            layers=spec_diff.parallel_layers(model),
        )
        del model  # one model alive at a time
    return built


def run(dims, par) -> dict:
    return build_variants(dims, par.tp, par.device)


# ----------------------------------------------------------------------------- note 19's tables


def short_path(path):  # unique in a one-layer model: the layer's own name (and the expert's number)
    parts = path.split(".")
    return f"expert {parts[-2]} {parts[-1]}" if "local_experts" in parts else parts[-1]


def same_trees(results: list) -> bool:
    return all(r[label]["tree"] == results[0][label]["tree"] for r in results for label in results[0])


def count_table(built: dict) -> Table:
    return Table(
        ["spec", "模块数", "TP 层数", "其中 expert 的"],
        [
            [label, len(b["tree"]), len(b["layers"]), sum(row["is_expert"] for row in b["layers"])]
            for label, b in built.items()
        ],
    )


def diff_table(built: dict) -> Table:
    return Table(
        ["路径（省去 decoder.layers.0.）", *built],
        diff_trees({label: b["tree"] for label, b in built.items()}),
    )


def expert_table(built: dict) -> Table:
    """The first layer's expert linears in the MoE model (every layer has the same)."""
    return Table(
        ["层", "类", "群大小", "dim", "rank 0 weight", "explicit_expert_comm", "allreduce_dgrad"],
        [
            [
                short_path(r["path"]),
                r["cls"],
                r["tp"],
                r["partition_dim"],
                r["local_shape"],
                *flag_cells(r, ("explicit_expert_comm", "allreduce_dgrad")),
            ]
            for r in built["MoE"]["layers"]
            if r["is_expert"] and ".layers.0." in r["path"]
        ],
    )


def tables(results: list, dims, par) -> list:
    return [
        f"{len(results)} 个 rank 建出的模块树相同: {same_trees(results)}",
        count_table(results[0]),
        diff_table(results[0]),
        expert_table(results[0]),
    ]
