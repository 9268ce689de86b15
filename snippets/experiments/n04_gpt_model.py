"""Note 04's experiment: a real ``GPTModel`` under tensor parallelism, every parameter on every rank.

:func:`build_gpt` builds this rank's model the way the formal entry does at core 0.19
(``GPTModelBuilder.build_model`` from the ``GPTModelConfig`` that ``gpt_config_from_args`` makes; the
older ``gpt_builder`` builds the same): local spec, CPU initialization, shared embedding and output
weights, ``parallel_output=True``, at any ``dims`` (``tests/ranks/test_gpt_builder.py`` checks it
against the real builder):
the Qwen3-style switches of :class:`snippets.models.presets.Dims` (SwiGLU, RMSNorm, QK norm, no bias,
RoPE) go into ``TransformerConfig``, the spec and ``GPTModel`` exactly where ``--swiglu``,
``--normalization``, ``--qk-layernorm``, ``--disable-bias-linear`` and
``--position-embedding-type`` would put them.

:func:`run` reads every parameter's Megatron attributes (:func:`snippets.config.param_table.param_rows`),
then -- after ``destroy_model_parallel`` -- builds the same model at TP=1 from the same seed in the
same process and checks that this rank's shard is that model's piece (:func:`shard_of`, the cut of
``_initialize_affine_weight_cpu``). ``tables`` prints note 04's tables for the TP group of rank 0:
global and per-rank local shapes, ``partition_dim`` / ``stride``, "equal to TP=1", and the
parameter counts per rank.
"""

from __future__ import annotations

import torch

from snippets.config.param_table import global_shape, param_rows
from snippets.record.tables import Table


def build_gpt(dims, tp: int, device: str = "cpu"):
    """``(model, collectives recorded while building it)`` on this rank's TP group of ``tp``."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    from snippets.record import recorder

    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    # use_cpu_initialization draws the full weight from the default generator (as on a GPU):
    # seed it, as megatron/training's _set_random_seed does, so every TP size builds the same model
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),  # --swiglu sets gated_linear_unit, silu
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
    with recorder.record() as calls, torch.device(device):
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            parallel_output=True,
            share_embeddings_and_output_weights=True,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )
    for param in model.parameters():  # as prepare_existing_model_chunks_for_distributed_training does
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    return model, calls


def shard_of(whole: torch.Tensor, rank: int, tp: int, dim: int, stride: int = 1) -> torch.Tensor:
    """TP rank ``rank``'s piece of ``whole``: chunks ``rank, rank + tp, ...`` of ``tp * stride``
    along ``dim`` (how ``_initialize_affine_weight_cpu`` cuts the master weight)."""
    return torch.cat(whole.chunk(tp * stride, dim=dim)[rank::tp], dim=dim)


def run(dims, par, keep_values: bool = False) -> dict:
    from megatron.core import parallel_state as mpu

    model, calls = build_gpt(dims, par.tp, par.device)
    layer = model.decoder.layers[0]
    built = {
        "embedding.word_embeddings": model.embedding.word_embeddings,
        "output_layer": model.output_layer,
        "linear_qkv": layer.self_attention.linear_qkv,
        "linear_proj": layer.self_attention.linear_proj,
        "linear_fc1": layer.mlp.linear_fc1,
        "linear_fc2": layer.mlp.linear_fc2,
        "input_layernorm": layer.input_layernorm,
    }
    out = dict(
        rank=torch.distributed.get_rank(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
        rows=param_rows(model),
        collectives=len(calls),
        built={k: type(v).__name__ for k, v in built.items()},
        output_weight_is_none=model.output_layer.weight is None,
        shared=model.shared_embedding_or_output_weight() is model.embedding.word_embeddings.weight,
    )
    shards = {name: p.detach() for name, p in model.named_parameters()}
    del model, layer, built
    mpu.destroy_model_parallel()
    reference, _ = build_gpt(dims, 1, par.device)  # the same seed, the whole model on this rank
    whole = {name: p.detach() for name, p in reference.named_parameters()}
    out["tp1_rows"] = param_rows(reference)
    out["equal_tp1"] = {
        row["name"]: torch.equal(
            shards[row["name"]],
            shard_of(whole[row["name"]], out["tp_rank"], par.tp, row["partition_dim"], row["stride"])
            if row["split"]
            else whole[row["name"]],
        )
        for row in out["rows"]
    }
    if keep_values:
        out["values"] = {name: t.cpu().clone() for name, t in shards.items()}
        out["tp1_values"] = {name: t.cpu().clone() for name, t in whole.items()}
    return out


# ----------------------------------------------------------------------------- note 04's tables


def tp_group_of_rank0(results: list) -> list:
    """The ranks of rank 0's TP group (data parallel rank 0), in TP order."""
    return sorted([r for r in results if r["dp_rank"] == 0], key=lambda r: r["tp_rank"])


def param_table(ranks: list, tp: int) -> Table:
    """One row per parameter: global shape, each rank's local shape, the split, equal to TP=1."""
    rows = []
    for i, row in enumerate(ranks[0]["rows"]):
        rows.append(
            [
                row["name"],
                list(global_shape(row, tp)),
                *(list(r["rows"][i]["local_shape"]) for r in ranks),
                row["partition_dim"] if row["split"] else "复制",
                row["stride"] if row["split"] else "-",
                all(r["equal_tp1"][row["name"]] for r in ranks),
            ]
        )
    return Table(
        [
            "参数",
            "全局 shape",
            *(f"rank {r['rank']} 本地" for r in ranks),
            "partition_dim",
            "stride",
            "拼回 = TP=1",
        ],
        rows,
    )


def count(rows: list, split: bool) -> int:
    return sum(row["numel"] for row in rows if row["split"] == split)


def count_table(ranks: list) -> Table:
    """Parameters per rank: tensors, elements, split and replicated; the TP=1 model last."""

    def cells(rows):
        return [len(rows), sum(row["numel"] for row in rows), count(rows, True), count(rows, False)]

    return Table(
        ["rank", "参数张量数", "元素数", "其中切分的", "其中复制的"],
        [[r["rank"], *cells(r["rows"])] for r in ranks] + [["TP=1", *cells(ranks[0]["tp1_rows"])]],
    )


def tables(results: list, dims, par) -> list:
    ranks = tp_group_of_rank0(results)
    return [
        f"造模型期间的 collective 条数（每个 rank）: {[r['collectives'] for r in results]}",
        f"实例化出的类: {ranks[0]['built']}",
        param_table(ranks, par.tp),
        f"output_layer.weight is None: {ranks[0]['output_weight_is_none']} "
        f" 输出层用的就是 word_embeddings.weight: {ranks[0]['shared']}",
        count_table(ranks),
    ]
