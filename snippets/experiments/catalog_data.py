"""Runner entries for notes 03 and 18: their experiments' sizes, checks and memory estimates.

Torch-free, like the rest of the registry (:mod:`snippets.experiments`): the runner imports it to
refuse a bad command before it starts anything.
"""

from __future__ import annotations

from snippets.models import memory_estimate as mem
from snippets.experiments import Experiment, Parallel
from snippets.models.presets import Dims

INT64, BOOL = 8, 1

RESUME_ITERATIONS = 4
"""Iterations of note 18's uninterrupted run (``--train-iters``); it is interrupted after half of them
(:mod:`snippets.experiments.n18_data_topic` holds the same numbers)."""


def _micro_batch_bytes(d: Dims) -> int:
    """One micro-batch as ``GPTDataset`` makes it: the ``[b, 1, s, s]`` bool mask and four ``[b, s]``
    fields (int64, the loss mask float32 counted as int64)."""
    return d.micro_batch_size * (d.seq * d.seq * BOOL + 4 * d.seq * INT64)


def _batch_flow_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    return mem.Estimate({
        # note 03's corpus (15/8 seq tokens, int32) and the index tables of a few samples
        "dataset": 2 * d.seq * 4 + 8 * (d.micro_batch_size * d.microbatches + 1) * INT64,
        # the samples DataLoader collates, the micro-batch, the receivers' buffers, the CP slices
        "batch": 4 * _micro_batch_bytes(d),
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _batch_flow_checks(d: Dims, par: Parallel) -> list[str]:
    out = []
    if d.vocab < 3:
        out.append(f"vocab {d.vocab} leaves no token id between 0 and the EOD (vocab - 1): use 3 or more")
    if d.seq % (2 * par.cp):
        out.append(f"seq {d.seq} is not divisible by 2 * cp = {2 * par.cp} (get_batch_on_this_cp_rank "
                   f"cuts it into 2 * cp chunks)")
    return out


def resume_dp_sizes(d: Dims, par: Parallel) -> list[int]:
    """The DP sizes note 18's run resumes at: its own first, then every other DP size the same ranks
    can form (``world / tp'``) whose micro-batches divide the global batch, largest first."""
    global_batch = d.micro_batch_size * d.microbatches * par.dp
    others = [dp for dp in range(par.world, 0, -1)
              if par.world % dp == 0 and dp != par.dp and global_batch % (d.micro_batch_size * dp) == 0]
    return [par.dp] + others


def _data_topic_estimate(d: Dims, par: Parallel) -> mem.Estimate:
    global_batch = d.micro_batch_size * d.microbatches * par.dp
    samples = RESUME_ITERATIONS * global_batch * 3                   # train, valid and test splits
    layouts = 1 + len(resume_dp_sizes(d, par))
    return mem.Estimate({
        # note 18's corpus (10 documents of up to 1.5 seq tokens, int32) and the index tables
        "dataset": 15 * d.seq * 4 + 4 * samples * INT64,
        "batch": 2 * _micro_batch_bytes(d),
        # the tokens of every micro-batch this rank read, kept for the comparison (DP=1 reads them all)
        "kept tokens": layouts * RESUME_ITERATIONS * global_batch * d.seq * INT64,
        "runtime": mem.RUNTIME_BYTES[par.device],
    })


def _data_topic_checks(d: Dims, par: Parallel) -> list[str]:
    out = []
    if d.vocab < 3:
        out.append(f"vocab {d.vocab} leaves no token id below the EOD (vocab - 1): use 3 or more")
    if d.seq < 2:
        out.append(f"seq {d.seq} is too short for note 18's corpus (documents of seq / 2 tokens and more)")
    return out


_NO_MODEL = ("hidden", "heads", "query_groups", "kv_channels", "ffn", "layers")

ENTRIES: list = [
    Experiment(
        name="batch-flow", note="03_data_and_batch_flow",
        what="a real GPTDataset from a .bin/.idx corpus through the builder and get_batch: which ranks "
             "build it, which read, every TP broadcast (per pipeline stage), the CP chunks each rank keeps",
        module="snippets.experiments.n03_batch_flow",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=32, layers=1,
                  seq=8, micro_batch_size=2, microbatches=2, bias=False),
        uses=("tp", "pp", "cp"), estimate=_batch_flow_estimate, checks=_batch_flow_checks,
        example="--tp 2 --cp 2", unused=_NO_MODEL),
    Experiment(
        name="data-topic", note="18_data_topic",
        what="resuming from consumed_train_samples: read 4 iterations, then rebuild dataset and sampler "
             "after 2 at every DP size the ranks can form (TP takes the rest): same global batches",
        module="snippets.experiments.n18_data_topic",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=32, layers=1,
                  seq=4, micro_batch_size=1, microbatches=2, bias=False),
        uses=("tp",), estimate=_data_topic_estimate, checks=_data_topic_checks,
        example="--tp 2", unused=_NO_MODEL),
]
