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


def folded(summary: str, table: Table):
    """``table`` behind a closed ``<details>``: a check whose every row is ``True`` is one sentence in
    the note, its table one click away (the table's lines still start with ``|``)."""
    from IPython.display import Markdown

    return Markdown(f"<details><summary>{summary}</summary>\n\n{table.markdown()}\n\n</details>")


# ----------------------------------------------------------------------------- a dp_reshardable checkpoint at a new TP


def resave_rank(ckpt_root: str, tp: int, saved_as: str, resave_as: str) -> int:
    """Rank body: load the ``saved_as`` checkpoint at the layout it was saved at, save it as ``resave_as``.

    What one run at the old TP / PP with ``--dist-ckpt-optim-fully-reshardable`` does: ``load_checkpoint``
    takes the sharding type from the checkpoint's content metadata, the next ``save_checkpoint`` takes
    it from the flag (``_build_sharded_state_dict_metadata``). Returns Adam's step count after the load.
    """
    import os

    from megatron.core import dist_checkpointing

    from snippets.ckpt.optim_reshard_rank import adam_step, build, checkpoint_state_dict

    model, _, optimizer = build(tp, init=False)
    optimizer.chained_optimizers[0]._init_optimizer_states_with_dummy_values()  # torch Adam: see note 21
    wanted = checkpoint_state_dict(model, optimizer, saved_as, is_loading=True)
    loaded = dist_checkpointing.load(wanted, os.path.join(ckpt_root, saved_as))
    with torch.no_grad():
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
    target = os.path.join(ckpt_root, resave_as)
    os.makedirs(target, exist_ok=True)
    dist_checkpointing.save(checkpoint_state_dict(model, optimizer, resave_as), target)
    return adam_step(optimizer)


def convert_then_reshard(
    save_grid: dict, load_grid: dict, saved_as="dp_reshardable", resave_as="fully_reshardable"
) -> dict:
    """Train and save ``saved_as`` at ``save_grid``, re-save it as ``resave_as`` at the same grid, load that
    at ``load_grid``; one result with the keys of ``optim_reshard.COLUMNS`` (calls left empty)."""
    import tempfile

    from snippets.ckpt import optim_reshard
    from snippets.ckpt.optim_reshard_rank import load_rank, save_rank
    from snippets.ranks.launch import run_ranks

    def world(grid):
        return grid.get("tp", 1) * grid.get("dp", 1)

    save_tp, load_tp = save_grid.get("tp", 1), load_grid.get("tp", 1)
    with tempfile.TemporaryDirectory(prefix="ckpt21-convert-") as root:
        saved = run_ranks(save_rank, world(save_grid), root, save_tp, (saved_as,), grid=dict(tp=save_tp))
        run_ranks(resave_rank, world(save_grid), root, save_tp, saved_as, resave_as, grid=dict(tp=save_tp))
        loaded = run_ranks(load_rank, world(load_grid), root, load_tp, (resave_as,), grid=dict(tp=load_tp))
    per_rank = [r[resave_as] for r in loaded]
    errors = [r["error"] for r in per_rank if "error" in r]
    row = dict(
        sharding_type=f"{saved_as} → {resave_as}",
        save=optim_reshard.grid_name(save_grid),
        load=optim_reshard.grid_name(load_grid),
        loaded=not errors,
        **{s: None for s in optim_reshard.STATES},
        adam_step=None,
        error=errors[0] if errors else None,
        save_calls=[],
        load_calls=[],
    )
    if not errors:
        reference = optim_reshard.assemble([r["pieces"] for r in saved])
        row.update(optim_reshard.compare(reference, optim_reshard.assemble([r["pieces"] for r in per_rank])))
        steps = {r["adam_step"] for r in per_rank}
        row["adam_step"] = steps.pop() if len(steps) == 1 else -1
    return row
