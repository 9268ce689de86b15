"""Which samples a data-parallel rank reads, and how a resumed run skips the consumed ones (note 18).

``megatron/training/datasets/data_samplers.py`` is not in the pip package. With the default
``--dataloader-type single`` the formal entry wraps every dataset in a ``DataLoader`` whose
``batch_sampler`` is a ``MegatronPretrainingSampler``: it walks the sample indices in order from
``consumed_samples``, cuts them into blocks of ``micro_batch_size * data_parallel_size`` and
hands DP rank ``r`` the ``r``-th micro-batch of each block. Resuming is nothing more than that
starting point: ``train`` adds ``dp * micro_batch_size * num_microbatches`` to
``args.consumed_train_samples`` after every iteration, the checkpoint stores ``args``, and
``load_checkpoint`` copies the number back before the data loaders are built.

This module restates the sampler, the ``single`` branch of ``build_pretraining_data_loader`` and
that per-iteration count with Megatron's names. ``tests/unit/test_pretraining_sampler.py`` compares
the sampler index by index with the class taken from a checkout of the tag (``--megatron-src``),
and without one checks what it must do: DP ranks partition each block, and a sampler started
at ``consumed_samples`` continues exactly where an uninterrupted one is.
"""

from __future__ import annotations

import torch


class MegatronPretrainingSampler:
    """Yields this DP rank's micro-batch (a list of sample indices) of each global block."""

    def __init__(
        self,
        total_samples,
        consumed_samples,
        micro_batch_size,
        data_parallel_rank,
        data_parallel_size,
        drop_last=True,
    ):
        assert total_samples > 0, f"no sample to consume: {total_samples}"
        assert consumed_samples < total_samples, (
            f"no samples left to consume: {consumed_samples}, {total_samples}"
        )
        assert micro_batch_size > 0 and data_parallel_size > 0
        assert data_parallel_rank < data_parallel_size
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples  # only read: the training loop counts, not us
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self):
        return self.total_samples  # samples, not batches (as at the tag)

    def get_start_end_idx(self):
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def __iter__(self):
        block = []
        for idx in range(self.consumed_samples, self.total_samples):
            block.append(idx)
            if len(block) == self.micro_batch_times_data_parallel_size:
                start, end = self.get_start_end_idx()
                yield block[start:end]
                block = []
        if block and not self.drop_last:  # a last, partial block
            start, end = self.get_start_end_idx()
            yield block[start:end]


def build_pretraining_data_loader(
    dataset, consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size
):
    """The ``--dataloader-type single`` loader (``num_workers=0``: notes run in-process)."""
    if dataset is None:
        return None
    sampler = MegatronPretrainingSampler(
        len(dataset), consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size
    )
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=0)


def samples_per_iteration(data_parallel_size, micro_batch_size, num_microbatches) -> int:
    """What ``train`` adds to ``args.consumed_train_samples`` after each iteration."""
    return data_parallel_size * micro_batch_size * num_microbatches
