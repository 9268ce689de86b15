"""From a command line to a ``GPTDatasetConfig`` and the three split sizes (note 18).

The formal entry turns flags into data in three functions:

* ``megatron/training/utils/common_utils.py::get_blend_and_blend_per_split`` (:507) --
  ``--data-path`` (or the three ``--*-data-path`` flags, or a file named by ``--data-args-path`` /
  ``--per-split-data-args-path``) becomes ``blend`` or ``blend_per_split``, through
  ``megatron.core.datasets.utils.get_blend_from_list``. Since core 0.19 ``megatron.training`` is in
  the pip package, so :func:`get_blend_and_blend_per_split` *calls* it;
* ``pretrain_gpt.py::core_gpt_dataset_config_from_args`` (:377) -- one dict literal,
  ``field: args.x``, passed to ``GPTDatasetConfig``. ``pretrain_gpt.py`` is not in the package:
  restated, with the tokenizer given rather than built;
* ``megatron/training/training.py::get_train_valid_test_num_samples`` (:4464) -- how many samples
  each split must hold, from ``--train-iters`` (or ``--train-samples``), ``--eval-interval``,
  ``--eval-iters``, ``--start-eval-at-iter`` and the (eval) global batch size. It reads the global
  ``get_args()``, so it is restated to take ``args``.

This module also lists the few ``argparse`` flags they read, with Megatron's defaults, so a note
can go from a command line to a real ``GPTDatasetConfig``. The FIM and object-storage branches are
left out. ``tests/unit/test_dataset_args.py`` holds all of it to the tag: the flag defaults to
Megatron's own parser (``megatron.training.arguments``), the field mapping to the dict literal in
``pretrain_gpt.py``, and the functions to the originals run on the same ``args``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex

# The dataset builders log every split they build at INFO/WARNING; in a notebook that is stderr.
logging.getLogger("megatron.core.datasets").setLevel(logging.ERROR)

FLAGS = [
    # (option strings, argparse keyword arguments) -- as megatron/training/arguments.py adds them
    (["--seed"], dict(type=int, default=1234)),
    (["--seq-length"], dict(type=int, default=None)),
    (["--data-path"], dict(nargs="*", default=None)),
    (["--split"], dict(type=str, default=None)),
    (["--train-data-path"], dict(nargs="*", default=None)),
    (["--valid-data-path"], dict(nargs="*", default=None)),
    (["--test-data-path"], dict(nargs="*", default=None)),
    (["--data-args-path"], dict(type=str, default=None)),
    (["--per-split-data-args-path"], dict(type=str, default=None)),
    (["--per-dataset-sequences-path"], dict(default=None)),
    (["--multiple-validation-sets"], dict(action="store_true")),
    (["--full-validation"], dict(action="store_true")),
    (["--num-dataset-builder-threads"], dict(type=int, default=1)),
    (["--data-cache-path"], dict(default=None)),
    (["--no-mmap-bin-files"], dict(action="store_false", dest="mmap_bin_files")),
    (["--reset-position-ids"], dict(action="store_true")),
    (["--reset-attention-mask"], dict(action="store_true")),
    (["--eod-mask-loss"], dict(action="store_true")),
    (
        ["--no-create-attention-mask-in-dataloader"],
        dict(action="store_false", dest="create_attention_mask_in_dataloader"),
    ),
    (["--object-storage-cache-path"], dict(type=str, default=None)),
    (["--mid-level-dataset-surplus"], dict(type=float, default=0.005)),
    (["--allow-ambiguous-pad-tokens"], dict(action="store_true")),
    (["--dataloader-fast-cache-load"], dict(action="store_true")),
    (["--dataloader-defer-npy-index-mmap"], dict(action="store_true")),
    (["--dataloader-inter-document-masking"], dict(action="store_true")),
    (["--context-parallel-size"], dict(type=int, default=1)),
    (["--tensor-model-parallel-size"], dict(type=int, default=1)),
    (["--sequence-parallel"], dict(action="store_true")),
    (["--hybrid-context-parallel"], dict(action="store_true")),
    (["--tokenizer-type"], dict(type=str, default=None)),
    (["--vocab-size"], dict(type=int, default=None)),
    (["--fim-data"], dict(action="store_true")),
    (["--mock-data"], dict(action="store_true")),
    (["--train-iters"], dict(type=int, default=None)),
    (["--train-samples"], dict(type=int, default=None)),
    (["--global-batch-size"], dict(type=int, default=None)),
    (["--micro-batch-size"], dict(type=int, default=None)),
    (["--eval-iters"], dict(type=int, default=100)),
    (["--eval-interval"], dict(type=int, default=None)),
    (["--start-eval-at-iter"], dict(type=int, default=None)),
    (["--eval-global-batch-size"], dict(type=int, default=None)),
    (["--skip-train"], dict(action="store_true")),
]
"""The flags the three functions read. ``--phase-transition-iterations`` is left at None."""

CONFIG_FROM_ARGS = {
    # GPTDatasetConfig field -> the args attribute core_gpt_dataset_config_from_args reads
    "random_seed": "seed",
    "sequence_length": "seq_length",
    "blend": None,  # get_blend_and_blend_per_split(args)[0]
    "blend_per_split": None,  # get_blend_and_blend_per_split(args)[1]
    "split": "split",
    "multiple_validation_sets": "multiple_validation_sets",
    "full_validation": "full_validation",
    "num_dataset_builder_threads": "num_dataset_builder_threads",
    "path_to_cache": "data_cache_path",
    "mmap_bin_files": "mmap_bin_files",
    "tokenizer": None,  # build_tokenizer(args), or the legacy global tokenizer
    "reset_position_ids": "reset_position_ids",
    "reset_attention_mask": "reset_attention_mask",
    "eod_mask_loss": "eod_mask_loss",
    "create_attention_mask": "create_attention_mask_in_dataloader",
    "object_storage_cache_path": "object_storage_cache_path",
    "mid_level_dataset_surplus": "mid_level_dataset_surplus",
    "allow_ambiguous_pad_tokens": "allow_ambiguous_pad_tokens",
    "fast_cache_load": "dataloader_fast_cache_load",
    "sequences_per_dataset": None,  # json.load of --per-dataset-sequences-path, if given
    "defer_npy_index_mmap": "dataloader_defer_npy_index_mmap",
    "context_parallel_size": "context_parallel_size",
    "data_parallel_size": "data_parallel_size",  # set by validate_args: world // (tp*pp*cp)
    "sequence_parallel_size": None,  # tensor_model_parallel_size * sequence_parallel
    "hybrid_context_parallel": "hybrid_context_parallel",
    "inter_document_masking": "dataloader_inter_document_masking",
}
"""The dict literal of ``core_gpt_dataset_config_from_args``, in its order (None: not a plain copy)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False)
    for names, kwargs in FLAGS:
        p.add_argument(*names, **kwargs)
    return p


def parse_args(command_line: str, world_size: int = 1, pipeline_model_parallel_size: int = 1):
    """``args`` as the data code sees it: the flags above plus what ``validate_args`` derives."""
    args = parser().parse_args(shlex.split(command_line))
    model = args.tensor_model_parallel_size * pipeline_model_parallel_size * args.context_parallel_size
    args.data_parallel_size = world_size // model
    args.phase_transition_iterations = None
    args.dataloader_type = "single"  # validate_args: None -> 'single'
    if args.eval_global_batch_size is None:  # validate_args (arguments.py:690)
        args.eval_global_batch_size = args.global_batch_size
    return args


def get_blend_and_blend_per_split(args):
    """``--data-path`` (or the per-split flags / files) -> ``(blend, blend_per_split)``: Megatron's own."""
    from megatron.training.utils import get_blend_and_blend_per_split as real

    return real(args)


def core_gpt_dataset_config_from_args(args, tokenizer):
    """The real ``GPTDatasetConfig``, filled as ``pretrain_gpt.py`` fills it (tokenizer given)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    if args.fim_data:
        raise NotImplementedError("the FIM branch (GPTFIMDatasetConfig) is not restated here")
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    sequences_per_dataset = None
    if args.per_dataset_sequences_path is not None:
        with open(args.per_dataset_sequences_path) as f:
            sequences_per_dataset = json.load(f)
    computed = dict(
        blend=blend,
        blend_per_split=blend_per_split,
        tokenizer=tokenizer,
        sequences_per_dataset=sequences_per_dataset,
        sequence_parallel_size=args.tensor_model_parallel_size * args.sequence_parallel,
    )
    return GPTDatasetConfig(
        **{
            field: computed[field] if attr is None else getattr(args, attr)
            for field, attr in CONFIG_FROM_ARGS.items()
        }
    )


def get_train_valid_test_num_samples(args) -> tuple:
    """How many samples train / valid / test must hold (no phase transitions)."""
    train = args.train_samples if args.train_samples else args.train_iters * args.global_batch_size
    if args.full_validation:
        eval_samples = None
    else:
        if args.skip_train:
            eval_iters = args.eval_iters
        else:
            assert args.train_iters is not None  # validation is scheduled by iteration
            evaluations = args.train_iters // args.eval_interval + 1
            if args.start_eval_at_iter is not None:
                evaluations = max(0, evaluations - args.start_eval_at_iter // args.eval_interval)
            eval_iters = evaluations * args.eval_iters
        eval_samples = eval_iters * args.eval_global_batch_size
    return train, eval_samples, args.eval_iters * args.eval_global_batch_size
