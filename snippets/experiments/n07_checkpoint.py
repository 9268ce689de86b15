"""Note 07's experiment: save a real ``GPTModel`` at one TP size, load it at others, at any size.

:func:`save_at` builds the model at TP = ``tp`` (:func:`build_gpt`, seed 1), describes it with
``model.sharded_state_dict()`` and writes it with ``dist_checkpointing.save``; :func:`load_at`
builds the same model at another TP with another seed (so its logits differ), reads the checkpoint
with ``dist_checkpointing.load`` through *its own* sharded state dict and ``load_state_dict``.
Both return the whole-vocabulary logits of one micro-batch (each rank's ``1/TP`` columns,
all-gathered over the TP group), so before and after can be compared with the saved model's.

:func:`run` does both in one job of ``par.world`` ranks: save at TP = ``par.tp``, then load at
TP = 1 and at TP = ``par.world`` (each that differs from ``par.tp``; a world of one reloads at
TP = 1: :func:`snippets.experiments.checks.load_tps`), every time with all the job's
ranks, the rest data parallel. The checkpoint directory is made by rank 0 (:func:`checkpoint_dir`)
and removed at the end; nothing printed contains its path. Note 07 gives ``run`` a directory of its
own instead (kept, and rank 0 then also returns the saved model's logits): it saves at TP=2 on 2
ranks (and so loads at TP=1 in the same job), then loads the same directory at TP=4 on 4 ranks with
:func:`load_at`.

``tables`` prints note 07's tables: each ``sharded_state_dict`` entry of rank 0 and rank 1, what
each rank writes, the files, the global tensors and chunks in ``.metadata``, the load checks, and
which saved chunks each loading rank reads its ``linear_qkv`` weight from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from snippets.ckpt import checkpoint_view as cv
from snippets.experiments.checks import load_tps
from snippets.experiments.n13_pipeline import microbatches, pipeline_config
from snippets.record.tables import Table

CKPT_ROOT_ENV = "SNIPPETS_CKPT_ROOT"
"""Where :func:`checkpoint_dir` makes its directory; unset = the system's temporary directory. A job
on several hosts needs a directory every host sees (a shared filesystem)."""


@contextlib.contextmanager
def checkpoint_dir(prefix: str, path: str | None = None):
    """A fresh directory for one job's checkpoints, the same path on every rank.

    Rank 0 makes it (under ``$SNIPPETS_CKPT_ROOT`` when set) and broadcasts the path; when every
    rank is done, rank 0 removes it. A ``path`` given by the caller is used as is and kept.
    """
    if path is not None:
        yield path
        return
    made = [
        tempfile.mkdtemp(prefix=prefix, dir=os.environ.get(CKPT_ROOT_ENV)) if dist.get_rank() == 0 else None
    ]
    dist.broadcast_object_list(made, src=0)
    try:
        yield made[0]
        dist.barrier()  # no rank still reads it
    finally:
        if dist.get_rank() == 0:
            shutil.rmtree(made[0], ignore_errors=True)


def build_gpt(dims, tp, seed, device="cpu"):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    config = pipeline_config(dims, pp=1, tp=tp, device=device)
    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
    with torch.device(device):
        return GPTModel(
            config,
            spec,
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )


def logits(model, dims, device="cpu"):
    batch = microbatches(dims, 1, device)[0]
    with torch.no_grad():  # 每个 rank 算出自己那 1/TP 的 vocab 列，再在 TP 群里拼回完整 vocab
        mine = model(batch["tokens"], batch["position_ids"], batch["attention_mask"])
        return gather_from_tensor_model_parallel_region(mine)


def save_at(dims, tp, ckpt_dir, device="cpu"):
    model = build_gpt(dims, tp, seed=1, device=device)
    sharded_sd = model.sharded_state_dict()
    dist_checkpointing.save(sharded_sd, ckpt_dir)
    return cv.sharded_rows(sharded_sd), logits(model, dims, device)


def load_at(dims, tp, ckpt_dir, device="cpu"):
    model = build_gpt(dims, tp, seed=2, device=device)
    before = logits(model, dims, device)
    sharded_sd = model.sharded_state_dict()  # 这个 rank 要全局 tensor 的哪一块
    wants = [row for row in cv.sharded_rows(sharded_sd) if row[0] == LOCAL_QKV]
    state_dict = dist_checkpointing.load(sharded_sd, ckpt_dir)
    result = model.load_state_dict(state_dict)
    return dict(
        before=before, after=logits(model, dims, device), wants=wants, mismatches=cv.key_mismatches(result)
    )


def load_row(save_tp, tp, reference, loaded):
    before, after = loaded["before"], loaded["after"]
    return [
        f"TP={save_tp} → TP={tp}",
        torch.allclose(before, reference),
        torch.allclose(after, reference, atol=1e-6),
        round((after - reference).abs().max().item(), 4),
        *loaded["mismatches"],
    ]


def run(dims, par, ckpt_dir=None) -> dict:
    with checkpoint_dir(f"ckpt-tp{par.tp}-", ckpt_dir) as path:
        rows, reference = save_at(dims, par.tp, path, par.device)
        saved = inspect_checkpoint(path) if dist.get_rank() == 0 else None
        loads = []
        for tp in load_tps(par):
            parallel_state.destroy_model_parallel()
            loaded = load_at(dims, tp, path, par.device)
            loads.append(dict(tp=tp, row=load_row(par.tp, tp, reference, loaded), wants=loaded["wants"]))
    kept = ckpt_dir is not None and dist.get_rank() == 0  # 调用方还要再读这个目录：带回对照用的 logits
    return dict(
        rows=rows,
        logits_shape=tuple(reference.shape),
        saved=saved,
        loads=loads,
        reference=reference.cpu() if kept else None,
    )


def inspect_checkpoint(ckpt_dir) -> dict:
    """What the directory holds, paths relative to it: files, ``metadata.json``, the global tensors
    of ``.metadata`` and the chunks each is stored in."""
    tensors = cv.stored_tensors(ckpt_dir)
    return dict(
        files=cv.saved_files(ckpt_dir),
        metadata=cv.metadata_json(ckpt_dir),
        tensors=tensors,
        chunks={key: cv.stored_chunks(ckpt_dir, key) for key in tensors},
    )


# ----------------------------------------------------------------------------- note 07's tables

LOCAL_QKV = "decoder.layers.0.self_attention.linear_qkv.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
SHOWN = (
    "embedding",
    "decoder.layers.0",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.final_layernorm.weight",
    "output_layer",
)
"""The entries note 07 lists: the embeddings, all of layer 0, layer 1's QKV, the final norm, the output."""


def entries_line(results: list) -> str:
    return f"entries per rank: {[len(r['rows']) for r in results]}  logits: {results[0]['logits_shape']}"


def entries_table(results: list) -> Table:
    """Rank 0's and rank 1's entries side by side (``-`` for rank 1 in a world of one)."""
    rank0 = {row[0]: row for row in results[0]["rows"]}
    rank1 = {row[0]: row for row in results[1]["rows"]} if len(results) > 1 else {}
    shown = [k for k in rank0 if k.startswith(SHOWN)]
    return Table(
        [
            "本地 key",
            "全局 key",
            "类型",
            "global shape",
            "local shape",
            "offset r0",
            "offset r1",
            "replica_id r0",
            "replica_id r1",
        ],
        [
            [
                k,
                rank0[k][1],
                rank0[k][2],
                rank0[k][3],
                rank0[k][4],
                rank0[k][5],
                rank1[k][5] if k in rank1 else "-",
                rank0[k][6],
                rank1[k][6] if k in rank1 else "-",
            ]
            for k in shown
        ],
    )


def written_table(results: list) -> Table:
    def counts(rows):
        tensors = [row for row in rows if row[2] == "ShardedTensor"]
        main = sum(cv.is_main_replica(row[6]) for row in tensors)
        return [len(tensors), main, len(tensors) - main]

    return Table(
        ["rank", "ShardedTensor 数", "主副本（会写）", "副本（不写）"],
        [[r, *counts(res["rows"])] for r, res in enumerate(results)],
    )


def stored_table(saved: dict) -> Table:
    return Table(["全局 key", "global shape"], [[k, v] for k, v in saved["tensors"].items()])


def chunks_table(saved: dict, key: str = QKV) -> Table:
    return Table(["offsets", "sizes"], saved["chunks"][key])


def load_table(rows: list) -> Table:
    return Table(
        [
            "加载",
            "加载前 logits 相同",
            "加载后 logits 相同 (atol 1e-6)",
            "max |Δ|",
            "missing keys",
            "unexpected keys",
        ],
        rows,
    )


MEANINGS = {
    "dist_checkpointing/validation.py::determine_global_metadata": (
        "各 rank 交换自己的分片描述（pickle 后的字节），核对每一块都有人负责"
    ),
    "dist_checkpointing/validation.py::_validate_common_state_dict": (
        "rank 0 广播非分片部分，其他 rank 比对是否一致"
    ),
    "dist_checkpointing/strategies/state_dict_saver.py::save_state_dict_async_plan": (
        "各 rank 的写计划收集到 rank 0，rank 0 据此生成全局 metadata"
    ),
    "dist_checkpointing/strategies/async_utils.py::execute_sync": "各 rank 写完自己的 .distcp 后对齐",
    "dist_checkpointing/strategies/state_dict_saver.py::save_state_dict_async_finalize": (
        "写出结果收集到 rank 0，rank 0 写 .metadata，再广播有没有失败"
    ),
    "dist_checkpointing/serialization.py::metadata_finalize_fn": "rank 0 写完 metadata.json 后对齐",
}
"""What each collective ``dist_checkpointing.save`` / ``load`` issues is for (note 07's table)."""


def source_chunks(offset, local_shape, chunks) -> list:
    """Offsets of the saved chunks that overlap the piece at ``offset`` of ``local_shape`` (the
    leading axes a layer index occupies count as size 1)."""
    sizes = (1,) * (len(offset) - len(local_shape)) + tuple(local_shape)
    return [
        c_off
        for c_off, c_size in chunks
        if all(o < co + cs and co < o + s for o, s, co, cs in zip(offset, sizes, c_off, c_size))
    ]


def wants_rows(label: str, wants_per_rank: list, saved: dict) -> list:
    """Per loading rank: the piece of layer 0's ``linear_qkv`` weight it asks for, and the saved
    chunks it is read from."""
    return [
        [label, rank, row[4], row[5], source_chunks(row[5], row[4], saved["chunks"][row[1]])]
        for rank, wants in enumerate(wants_per_rank)
        for row in wants
    ]


def wants_table(rows: list) -> Table:
    return Table(
        ["加载", "rank", "local shape（第 0 层 linear_qkv）", "global_offset", "读自保存时的块（offsets）"],
        rows,
    )


def tables(results: list, dims, par) -> list:
    saved = results[0]["saved"]
    loads = [load["tp"] for load in results[0]["loads"]]
    return [
        entries_line(results),
        entries_table(results),
        written_table(results),
        f"files: {saved['files']}",
        f"metadata.json: {saved['metadata']}",
        stored_table(saved),
        chunks_table(saved),
        f"加载：TP = {loads}，每次都用全部 {par.world} 个 rank（其余为 DP）",
        load_table([load["row"] for load in results[0]["loads"]]),
        wants_table(
            [
                row
                for i, tp in enumerate(loads)
                for row in wants_rows(
                    f"TP={par.tp} → TP={tp}", [r["loads"][i]["wants"] for r in results], saved
                )
            ]
        ),
    ]
