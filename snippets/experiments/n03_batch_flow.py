"""Note 03's experiment: who builds the dataset, who reads a micro-batch, and what each rank holds
after ``get_batch`` -- at any sequence length, micro-batch size and vocabulary.

:func:`run` writes a small corpus with Megatron's ``IndexedDatasetBuilder`` (note 03's three
documents, their lengths scaled to ``dims.seq``, tokens counting up below the EOD of a
``NullTokenizer`` of ``dims.vocab`` ids) into a temporary directory of global rank 0; the ranks that
build datasets read it there, so they must share that file system (one host, as ``torchrun
--standalone``; Megatron itself expects a shared data path). :func:`data_flow` then does on every
rank what the formal entry does: ``initialize_model_parallel``, the builder with
``is_dataset_built_on_rank`` (first or last stage, TP rank 0), a ``DataLoader`` where a dataset was
built, and one ``get_batch`` (:mod:`snippets.data.batch_flow`: the TP broadcast restated, the real CP
split), recording every collective. ``tables`` prints note 03's tables: without pipeline
parallelism who built and what ``tokens`` became, every broadcast of the sender and of a receiver,
and which CP chunks each rank kept; with it, what each stage broadcast and kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import numpy
import torch

from snippets.data.batch_flow import FIELDS, BatchArgs, describe, get_batch
from snippets.record.recorder import communication_table
from snippets.record.tables import Table


def corpus_documents(dims) -> list[list[int]]:
    """Note 03's corpus at ``dims``: three documents of 5/8, 3/8 and 7/8 of ``seq`` tokens (5, 3, 7 at
    ``seq`` 8), the tokens counting up from 1 through the ids below the EOD (``vocab - 1``)."""
    lengths = [max(1, dims.seq * k // 8) for k in (5, 3, 7)]
    starts = numpy.cumsum([0] + lengths[:-1]).tolist()
    return [[1 + (start + j) % (dims.vocab - 2) for j in range(n)] for start, n in zip(starts, lengths)]


def write_corpus(directory, name, documents, eod) -> str:
    """``documents`` (each closed by ``eod``) as ``name.bin`` / ``name.idx``, as the last step of
    ``tools/preprocess_data.py`` writes them; returns the path prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = os.path.join(directory, name)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    for doc in documents:
        builder.add_document(torch.tensor(doc + [eod]), [len(doc) + 1])
    builder.finalize(prefix + ".idx")
    return prefix


@contextlib.contextmanager
def shared_corpus(documents, eod):
    """Global rank 0 writes ``documents`` into a temporary directory; every rank gets the path prefix
    (the directory goes when every rank is done). Nothing derived from the path may be printed."""
    prefix = [None]
    if torch.distributed.get_rank() == 0:
        prefix = [write_corpus(tempfile.mkdtemp(prefix="corpus-"), "corpus", documents, eod)]
    torch.distributed.broadcast_object_list(prefix, src=0)
    try:
        yield prefix[0]
    finally:
        torch.distributed.barrier()
        if torch.distributed.get_rank() == 0:
            shutil.rmtree(os.path.dirname(prefix[0]), ignore_errors=True)


def null_tokenizer(vocab):
    """``--tokenizer-type NullTokenizer --vocab-size vocab``: ids ``0 .. vocab-2``, EOD ``vocab-1``.

    What ``build_tokenizer`` does for that flag (``megatron/core/tokenizers/utils/build_tokenizer.py``
    :87-100). Since core 0.19 ``--vocab-size`` counts the EOD (``NullTokenizer.__init__``: EOD
    ``vocab_size - 1``); before, the EOD came on top (``--vocab-size vocab-1``)."""
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=vocab)


def data_flow(prefix, tokenizer, dims, tp, pp, cp):
    from megatron.core import parallel_state as mpu
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from snippets.record import recorder

    mpu.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp
    )
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=dims.seq,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )

    def is_dataset_built_on_rank():  # pretrain_gpt.py, without MTP
        return (
            mpu.is_pipeline_first_stage() or mpu.is_pipeline_last_stage()
        ) and mpu.get_tensor_model_parallel_rank() == 0

    num_samples = dims.micro_batch_size * dims.microbatches
    with recorder.record() as build_calls:
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [num_samples, None, None], is_dataset_built_on_rank, config
        ).build()
    loader = (
        None if train is None else iter(torch.utils.data.DataLoader(train, batch_size=dims.micro_batch_size))
    )
    log = []
    with recorder.record() as batch_calls:
        batch = get_batch(
            loader,
            BatchArgs(
                micro_batch_size=dims.micro_batch_size,
                seq_length=dims.seq,
                pipeline_model_parallel_size=pp,
                context_parallel_size=cp,
            ),
            log=log,
        )

    def first_row(name):
        return None if batch[name] is None else batch[name][0].tolist()

    return dict(
        coords=(
            mpu.get_tensor_model_parallel_rank(),
            mpu.get_context_parallel_rank(),
            mpu.get_pipeline_model_parallel_rank(),
        ),
        built=train is not None,
        build_calls=build_calls,
        log=log,
        batch_calls=batch_calls,
        fields={name: describe(batch[name]) for name in FIELDS},
        kept=[name for name in FIELDS if batch[name] is not None],
        tokens=first_row("tokens"),
        positions=first_row("position_ids"),
    )


def run(dims, par) -> dict:
    tokenizer = null_tokenizer(dims.vocab)
    with shared_corpus(corpus_documents(dims), tokenizer.eod) as prefix:
        return data_flow(prefix, tokenizer, dims, par.tp, par.pp, par.cp)


# ----------------------------------------------------------------------------- note 03's tables


def brief(values, limit=16):
    """A list as it is when short (note 03's sizes); at real sizes its ends and its length."""
    if values is None or len(values) <= limit:
        return values
    return f"{values[:4]} … {values[-4:]}（{len(values)} 个）"


def coords_label(par) -> str:
    """The coordinates worth a column: tp, then cp (or pp when pipelined; both when both are > 1)."""
    names = ["tp"] + (["cp"] if par.cp > 1 or par.pp == 1 else []) + (["pp"] if par.pp > 1 else [])
    return "(" + ", ".join(names) + ")"


def _coords(d, par) -> tuple:
    tp, cp, pp = d["coords"]
    return tuple(v for name, v in (("tp", tp), ("cp", cp), ("pp", pp)) if name in coords_label(par))


def summary_table(results, par) -> Table:
    return Table(
        [
            "rank",
            coords_label(par),
            "建了数据集",
            "建数据集时的 collective",
            "get_batch 的 broadcast 数",
            "tokens 之后",
        ],
        [
            [
                r,
                _coords(d, par),
                d["built"],
                [f"{c.api} {c.group}" for c in d["build_calls"]],
                len(d["batch_calls"]),
                d["fields"]["tokens"],
            ]
            for r, d in enumerate(results)
        ],
    )


def sender_table(result) -> Table:
    """Every broadcast a sending TP rank 0 issued: which field, its shape and dtype."""
    return Table(["#", "字段", "shape", "dtype"], [[i + 1, *entry] for i, entry in enumerate(result["log"])])


def receiver_table(result) -> Table:
    return communication_table(
        result["batch_calls"],
        meanings={
            "send": "TP rank 0 读到的字段原样送给同 TP 群的其余 rank（接收方事先按 args 分配好空缓冲）"
        },
    )


def kept_chunks(positions, seq_len, cp):
    return sorted({int(p) // (seq_len // (2 * cp)) for p in positions})


def chunk_table(results, dims, par) -> Table:
    """Which of the ``2 * cp`` chunks each rank kept (ranks that hold ``position_ids``)."""
    return Table(
        ["rank", "cp rank", "留下的块", "position_ids[0]", "tokens[0]", "attention_mask"],
        [
            [
                r,
                d["coords"][1],
                kept_chunks(d["positions"], dims.seq, par.cp),
                brief(d["positions"]),
                brief(d["tokens"]),
                d["fields"]["attention_mask"],
            ]
            for r, d in enumerate(results)
            if d["positions"] is not None
        ],
    )


def role(d) -> str:
    if not d["log"]:
        return "不参与（直接返回 None）"
    return "读数据并发送" if d["coords"][0] == 0 else "接收"


def role_table(results, par) -> Table:
    """With pipeline stages: what each rank broadcast, in order, and which fields it kept."""
    return Table(
        ["rank", coords_label(par), "建了数据集", "角色", "broadcast 的字段（依次）", "之后不为 None 的字段"],
        [
            [r, _coords(d, par), d["built"], role(d), [entry[0] for entry in d["log"]], d["kept"]]
            for r, d in enumerate(results)
        ],
    )


def tables(results: list, dims, par) -> list:
    if par.pp > 1:
        out = [role_table(results, par)]
    else:
        out = [summary_table(results, par), sender_table(results[0])]
        if par.tp > 1:
            out.append(receiver_table(results[1]))
    if par.cp > 1 or par.pp == 1:
        out.append(chunk_table(results, dims, par))
    return out
