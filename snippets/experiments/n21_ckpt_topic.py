"""Note 21's experiment: where every ``sharded_state_dict`` entry sits, on a TP x PP x DP grid.

:func:`sharded_entries` builds this rank's pipeline stage of a real ``GPTModel`` (local spec,
embedding and output layer tied, as the note's) at the sizes ``dims`` and TP = ``tp``, PP = ``pp``
(the rest of the world data parallel), and returns this rank's ``(tp, pp, dp)`` coordinates and
every entry of ``model.sharded_state_dict()`` -- what ``generate_state_dict`` saves for the model --
as plain rows (:func:`snippets.ckpt.coords.coordinate_rows`). Coordinates do not depend on the
weights' values, so the weights are left uninitialized (``perform_initialization=False``): a real
model's stage is allocated, not filled.

``tables`` prints note 21's tables: the coordinates of layer 0's ``linear_qkv`` weight on every
rank, the ``replica_id`` of the four entries with replicas (word embedding, tied output layer,
position embedding, final norm), and, from every rank's entries, that the pieces with an all-zero
``replica_id`` (the ones written) cover each global tensor exactly once. Nothing is saved.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig

from snippets.ckpt import coords as ckpt_coords
from snippets.record.tables import Table


def sharded_entries(dims, tp, pp, device="cpu"):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=device == "cpu",
        perform_initialization=False,
    )
    with torch.device(device):
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=True,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )
    coords = dict(
        tp=parallel_state.get_tensor_model_parallel_rank(),
        pp=parallel_state.get_pipeline_model_parallel_rank(),
        dp=parallel_state.get_data_parallel_rank(),
    )
    return coords, ckpt_coords.coordinate_rows(model.sharded_state_dict())


def run(dims, par):
    return sharded_entries(dims, par.tp, par.pp, par.device)


# ----------------------------------------------------------------------------- note 21's tables

QKV = "decoder.layers.0.self_attention.linear_qkv.weight"
"""Layer 0 of every stage: global layer ``pp_rank * layers / pp``."""

SPECIAL = {
    "word_embeddings": "embedding.word_embeddings.weight",
    "output_layer": "output_layer.weight",
    "position_embeddings": "embedding.position_embeddings.weight",
    "final_layernorm": "decoder.final_layernorm.weight",
}
"""The entries that have replicas besides DP's: the tied pair, and two that TP does not split."""


def entry(rows, local_key):
    return next((r for r in rows if r["local_key"] == local_key), None)


def entries_line(entries: list) -> str:
    return f"每个 rank 的条目数: {[len(rows) for _, rows in entries]}"


def qkv_table(entries: list) -> Table:
    return Table(
        [
            "rank",
            "(tp, pp, dp)",
            "全局 key",
            "global shape",
            "local shape",
            "global_offset",
            "axis_fragmentations",
            "replica_id",
        ],
        [
            [
                rank,
                (c["tp"], c["pp"], c["dp"]),
                e["key"],
                e["global_shape"],
                e["local_shape"],
                e["global_offset"],
                e["axis_fragmentations"],
                e["replica_id"],
            ]
            for rank, (c, rows) in enumerate(entries)
            for e in [entry(rows, QKV)]
        ],
    )


def special_keys(entries: list) -> dict:
    """The global key each special entry is saved under (``-``: no stage has it)."""
    return {
        name: next((e["key"] for _, rows in entries if (e := entry(rows, k))), "-")
        for name, k in SPECIAL.items()
    }


def replica_table(entries: list) -> Table:
    return Table(
        ["rank", "(tp, pp, dp)"] + list(SPECIAL),
        [
            [r, (c["tp"], c["pp"], c["dp"])]
            + [entry(rows, k)["replica_id"] if entry(rows, k) else "-" for k in SPECIAL.values()]
            for r, (c, rows) in enumerate(entries)
        ],
    )


def written_table(entries: list) -> Table:
    written = ckpt_coords.written_pieces([rows for _, rows in entries])
    return Table(["全局 key", "写入的片数", "恰好覆盖一次"], [[k, n, ok] for k, (n, ok) in written.items()])


def tables(results: list, dims, par) -> list:
    return [
        entries_line(results),
        qkv_table(results),
        f"全局 key: {special_keys(results)}",
        replica_table(results),
        written_table(results),
    ]
