"""Which samples a data-parallel rank reads, and how a resumed run skips the consumed ones (note 18).

With the default ``--dataloader-type single`` the formal entry wraps every dataset in a
``DataLoader`` whose ``batch_sampler`` is a ``MegatronPretrainingSampler``
(``megatron/training/datasets/data_samplers.py``:115): it walks the sample indices in order from
``consumed_samples``, cuts them into blocks of ``micro_batch_size * data_parallel_size`` and hands
DP rank ``r`` the ``r``-th micro-batch of each block. Resuming is nothing more than that starting
point: ``train`` adds ``dp * micro_batch_size * num_microbatches`` to
``args.consumed_train_samples`` after every iteration, the checkpoint stores ``args``, and
``load_checkpoint`` copies the number back before the data loaders are built.

Since core 0.19 ``megatron.training`` is in the pip package, so ``MegatronPretrainingSampler`` here
*is* Megatron's class (imported on first use: ``megatron.training`` costs ~0.3 s to import). This
module restates only the ``single`` branch of ``build_pretraining_data_loader`` (the real one reads
the global ``get_args()``) and that per-iteration count. ``tests/unit/test_pretraining_sampler.py``
checks what the sampler must do: DP ranks partition each block, and a sampler started at
``consumed_samples`` continues exactly where an uninterrupted one is.
"""

from __future__ import annotations

import torch


def __getattr__(name):
    if name == "MegatronPretrainingSampler":
        from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

        return MegatronPretrainingSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_pretraining_data_loader(
    dataset, consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size
):
    """The ``--dataloader-type single`` loader (``num_workers=0``: notes run in-process)."""
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

    if dataset is None:
        return None
    sampler = MegatronPretrainingSampler(
        len(dataset), consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size
    )
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=0)


def samples_per_iteration(data_parallel_size, micro_batch_size, num_microbatches) -> int:
    """What ``train`` adds to ``args.consumed_train_samples`` after each iteration."""
    return data_parallel_size * micro_batch_size * num_microbatches
