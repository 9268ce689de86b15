"""Note 18's experiment: resuming the data where a checkpoint left it, at any DP size.

The only data state Megatron keeps across a restart is one integer, ``args.consumed_train_samples``:
the dataset's index tables follow from seed, corpus and sizes, and ``MegatronPretrainingSampler``
(:mod:`snippets.data.pretraining_sampler`) starts cutting its blocks there. :func:`run` checks that on
real ranks. Global rank 0 writes note 18's corpus "a" (ten documents, their lengths scaled to
``dims.seq``) with Megatron's ``IndexedDatasetBuilder`` (:func:`snippets.experiments.n03_batch_flow.shared_corpus`:
one file system, as under ``torchrun --standalone``); every rank then does what the formal entry
does (:func:`read_iterations`) -- the builder from a command line (:mod:`snippets.data.dataset_args`),
the sampler at ``consumed_train_samples``, ``num_microbatches`` micro-batches per iteration -- for
four iterations at ``par``'s layout (DP = world / tp). Then, as a restart would, it drops the
model-parallel state, the dataset and the sampler, keeps only the count saved after iteration 2,
and reads iterations 3 and 4 again at every DP size the same ranks can form (TP takes the rest;
:func:`snippets.experiments.checks.resume_dp_sizes`). The global batch
(``micro_batch_size * microbatches * dp``) stays fixed, as ``--global-batch-size`` does.
``tables`` prints note 18's table of the micro-batch indices each DP rank read, the checks that a
resumed run reads the same global batches, and the builder's barriers.
"""

from __future__ import annotations

import numpy
import torch

from snippets.data.dataset_args import (
    core_gpt_dataset_config_from_args,
    get_train_valid_test_num_samples,
    parse_args,
)
from snippets.data.pretraining_sampler import build_pretraining_data_loader, samples_per_iteration
from snippets.experiments.checks import RESUME_ITERATIONS, resume_dp_sizes
from snippets.experiments.n03_batch_flow import null_tokenizer, shared_corpus
from snippets.record.recorder import communication_table
from snippets.record.tables import Table

INTERRUPTED_AFTER = RESUME_ITERATIONS // 2
"""The iteration after which the checkpoint is saved (and the run resumed)."""


def corpus_documents(dims) -> list[list[int]]:
    """Note 18's corpus "a" at ``dims``: ten documents of ``seq/2 + (i * seq/4) % seq`` tokens (2-5 at
    ``seq`` 4), the tokens counting up, wrapped below the EOD."""
    lengths = [max(1, dims.seq // 2 + (i * dims.seq // 4) % dims.seq) for i in range(10)]
    starts = numpy.cumsum([0] + lengths[:-1]).tolist()
    return [[(start + j) % (dims.vocab - 2) for j in range(n)] for start, n in zip(starts, lengths)]


def command(prefix, dims, global_batch_size, tp) -> str:
    """Note 18's command line: split 6,2,2, four iterations, a validation every two."""
    return (
        f"--data-path {prefix} --split 6,2,2 --seq-length {dims.seq} --micro-batch-size "
        f"{dims.micro_batch_size} --global-batch-size {global_batch_size} --train-iters {RESUME_ITERATIONS} "
        f"--eval-interval 2 --eval-iters 1 --tokenizer-type NullTokenizer --vocab-size {dims.vocab} "
        f"--tensor-model-parallel-size {tp}"
    )


def read_iterations(command, tokenizer, consumed_train_samples, iterations):
    from megatron.core import parallel_state as mpu
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    from snippets.record import recorder

    args = parse_args(command, world_size=torch.distributed.get_world_size())

    def is_dataset_built_on_rank():  # pretrain_gpt.py, without MTP
        return (
            mpu.is_pipeline_first_stage() or mpu.is_pipeline_last_stage()
        ) and mpu.get_tensor_model_parallel_rank() == 0

    with recorder.record() as build_calls:  # every rank must enter build(): it holds world barriers
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset,
            get_train_valid_test_num_samples(args),
            is_dataset_built_on_rank,
            core_gpt_dataset_config_from_args(args, tokenizer),
        ).build()
    dp, dp_rank = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    num_microbatches = args.global_batch_size // (args.micro_batch_size * dp)
    loader = build_pretraining_data_loader(train, consumed_train_samples, args.micro_batch_size, dp_rank, dp)
    batches = None if loader is None else zip(loader.batch_sampler, loader)  # indices, and the batch
    steps, consumed = [], []
    for _ in range(iterations):
        if batches is not None:  # TP rank 0 reads (get_batch sends it on to the other TP ranks)
            steps.append([next(batches) for _ in range(num_microbatches)])
        consumed_train_samples += samples_per_iteration(dp, args.micro_batch_size, num_microbatches)
        consumed.append(consumed_train_samples)  # what train() keeps in args after each step
    return dict(
        dp=dp,
        dp_rank=dp_rank,
        consumed=consumed,
        build_calls=build_calls,
        steps=None if batches is None else [[(idx, b["tokens"]) for idx, b in step] for step in steps],
    )


def run(dims, par) -> dict:
    from megatron.core import parallel_state

    tokenizer = null_tokenizer(dims.vocab)
    global_batch_size = dims.micro_batch_size * dims.microbatches * par.dp
    with shared_corpus(corpus_documents(dims), tokenizer.eod) as prefix:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
        uninterrupted = read_iterations(
            command(prefix, dims, global_batch_size, par.tp), tokenizer, 0, RESUME_ITERATIONS
        )
        saved = uninterrupted["consumed"][INTERRUPTED_AFTER - 1]  # what a checkpoint then holds in args
        resumed = {}
        for dp in resume_dp_sizes(dims, par):  # a restart: new layout, dataset and sampler; only `saved` kept
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.world // dp)
            resumed[dp] = read_iterations(
                command(prefix, dims, global_batch_size, par.world // dp),
                tokenizer,
                saved,
                RESUME_ITERATIONS - INTERRUPTED_AFTER,
            )
    return dict(uninterrupted=uninterrupted, saved=saved, resumed=resumed)


# ----------------------------------------------------------------------------- note 18's tables


def reading_ranks(results, dp=None) -> list:
    """The ranks that read (TP rank 0) in the uninterrupted run, or in the run resumed at ``dp``, by
    DP rank."""
    runs = [r["uninterrupted"] if dp is None else r["resumed"][dp] for r in results]
    return sorted((x for x in runs if x["steps"] is not None), key=lambda x: x["dp_rank"])


def indices(per_rank, step):
    return [[idx for idx, _ in rank["steps"][step]] for rank in per_rank]


def shown_step(per_rank, step, limit=8):
    """``r0: [8] [10]；r1: [9] [11]``: each DP rank's micro-batches (more than ``limit``: ends and count)."""

    def shown(batches):
        if len(batches) <= limit:
            return " ".join(map(str, batches))
        return " ".join(map(str, batches[:3])) + f" … {batches[-1]}（{len(batches)} 个）"

    return "；".join(f"r{r}: " + shown(batches) for r, batches in enumerate(indices(per_rank, step)))


def consumed_line(results) -> str:
    return (
        f"每步之后的 consumed_train_samples: {results[0]['uninterrupted']['consumed']}  "
        f"在第 {INTERRUPTED_AFTER} 步后中断并保存: {results[0]['saved']}"
    )


def resume_table(results) -> Table:
    base, saved = reading_ranks(results), results[0]["saved"]
    same, *others = results[0]["resumed"]
    columns = [reading_ranks(results, dp) for dp in (same, *others)]
    return Table(
        [
            "步",
            f"不中断 DP={base[0]['dp']}（每个 rank 的 micro-batch 下标）",
            f"从 consumed={saved} 恢复，DP={same}",
            *[f"恢复到 DP={dp}" for dp in others],
        ],
        [
            [
                step + 1,
                shown_step(base, step),
                *[
                    shown_step(column, step - INTERRUPTED_AFTER) if step >= INTERRUPTED_AFTER else "-"
                    for column in columns
                ],
            ]
            for step in range(RESUME_ITERATIONS)
        ],
    )


def global_batch(per_rank, step):
    return sorted((idx[0], tokens[0].tolist()) for r in per_rank for idx, tokens in r["steps"][step])


def checks(results) -> dict:
    """The three facts the note reads off the run, as booleans."""
    base = reading_ranks(results)
    same, *others = results[0]["resumed"]
    resumed = reading_ranks(results, same)
    after = range(RESUME_ITERATIONS - INTERRUPTED_AFTER)
    return {
        f"恢复后的第 {INTERRUPTED_AFTER + 1}、{RESUME_ITERATIONS} 步与不中断时逐 rank 相同（下标与 token）": all(
            indices(resumed, s) == indices(base, s + INTERRUPTED_AFTER)
            and all(
                torch.equal(a[1], b[1])
                for r, u in zip(resumed, base)
                for a, b in zip(r["steps"][s], u["steps"][s + INTERRUPTED_AFTER])
            )
            for s in after
        ),
        "换 DP 大小恢复，每步的 global batch（样本集合与 token）不变": all(
            global_batch(reading_ranks(results, dp), s) == global_batch(base, s + INTERRUPTED_AFTER)
            for dp in others
            for s in after
        ),
        f"中断前 {INTERRUPTED_AFTER} 步与恢复后 {len(after)} 步的样本没有重叠": not (
            {i for s in range(INTERRUPTED_AFTER) for i, _ in global_batch(base, s)}
            & {i for s in after for i, _ in global_batch(resumed, s)}
        ),
    }


def build_rank(results) -> int:
    """A rank that read cached indices after the restart at the same DP size: the first reading rank
    after global rank 0 (rank 0 itself on one rank)."""
    same = next(iter(results[0]["resumed"]))
    return next((i for i, r in enumerate(results) if i and r["resumed"][same]["steps"] is not None), 0)


def build_table(results) -> Table:
    same = next(iter(results[0]["resumed"]))
    return communication_table(
        results[build_rank(results)]["resumed"][same]["build_calls"],
        meanings={"barrier": "等 global rank 0 把这个 split 的索引写成缓存，之后本 rank 读缓存而不重算"},
    )


def tables(results: list, dims, par) -> list:
    return [
        consumed_line(results),
        resume_table(results),
        "\n".join(f"{name}: {value}" for name, value in checks(results).items()),
        f"恢复到 DP={par.dp} 时 rank {build_rank(results)} 建数据集时的通信:",
        build_table(results),
    ]
