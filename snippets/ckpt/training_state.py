"""What the training entry puts into a checkpoint besides the model, and how to look inside one.

``megatron/training/checkpointing.py`` ships in the pip package since core 0.19, and note 21 calls
its ``_build_sharded_state_dict_metadata`` and ``generate_state_dict`` itself. Two inputs it cannot
take from the training entry:

* :func:`rng_state` -- the per-rank dict of ``get_rng_state``, which reads the global ``get_args()``
  and ``torch.cuda``'s generator (Python, NumPy, torch generators and Megatron's RNG tracker). The
  note wraps it in the same ``ShardedObject`` the training code builds.
* :func:`training_args` -- an ``args`` namespace with the fields those two functions read and the
  ones ``load_checkpoint`` reads back: the parallel sizes it compares, and
  ``consumed_train_samples``, the only record of how far the built-in data loader got.

The rest reads a saved ``torch_dist`` directory from the notebook process, with paths relative to
it (no temporary path reaches a page): :func:`file_rows`, :func:`describe`, :func:`common_rows`,
:func:`tensor_rows`, :func:`object_rows`, :func:`size_rows`.
"""

from __future__ import annotations

import os
import random
from argparse import Namespace

import numpy as np
import torch


def rng_state() -> dict:
    """This rank's RNG state, with the keys of ``get_rng_state`` (checkpointing.py:398).

    ``cuda_rng_state`` holds the CPU generator here: on a CPU it is the generator dropout and init
    draw from (the CPU patch points Megatron's tracker at it too).
    """
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.get_rng_state(),
        "rng_tracker_states": get_cuda_rng_tracker().get_states(),
    }


def training_args(tp: int, pp: int, dp: int, consumed_train_samples: int, **extra) -> Namespace:
    """An ``args`` namespace with the fields ``load_checkpoint`` reads from a checkpoint's ``args``."""
    return Namespace(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        data_parallel_size=dp,
        world_size=tp * pp * dp,
        ckpt_format="torch_dist",
        use_distributed_optimizer=True,
        dist_ckpt_optim_fully_reshardable=False,
        consumed_train_samples=consumed_train_samples,
        skipped_train_samples=0,
        consumed_valid_samples=0,
        **extra,
    )


PATH_DEPENDENT = (".metadata",)
"""Files whose size depends on where the checkpoint was saved: torch DCP's ``.metadata`` records
the absolute save directory (``storage_meta.checkpoint_id``) and a random ``save_id``."""


def file_rows(ckpt_dir: str) -> list[list]:
    """``[name, bytes]`` for every file in ``ckpt_dir`` (relative names, sorted).

    The size of a :data:`PATH_DEPENDENT` file is replaced by a word: it changes with the directory.
    """
    out = []
    for root, _, files in os.walk(ckpt_dir):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, ckpt_dir)
            out.append([rel, "随保存路径变化" if rel in PATH_DEPENDENT else os.path.getsize(path)])
    return sorted(out)


def describe(value) -> str:
    """A short, run-independent description of a checkpoint value."""
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, Namespace):
        return f"Namespace ({len(vars(value))} fields)"
    if isinstance(value, dict):
        return "dict: " + ", ".join(map(str, value)) if len(value) <= 12 else f"dict ({len(value)} keys)"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return repr(value)


def common_rows(common: dict) -> list[list]:
    """``[key, type, description]`` per top-level entry of ``load_common_state_dict``."""
    return [[key, type(value).__name__, describe(value)] for key, value in common.items()]


def tensor_rows(metadata: dict) -> list[list]:
    """``[global key, global shape, dtype]`` per ``ShardedTensor`` of ``load_tensors_metadata``."""
    return [
        [key, tuple(sh.global_shape), str(sh.dtype).removeprefix("torch.")]
        for key, sh in sorted(metadata.items())
    ]


def size_rows(plain: dict) -> list[list]:
    """``[part, elements, bytes]`` of the tensors ``load_plain_tensors`` returned, model vs optimizer."""
    parts: dict[str, list[int]] = {}
    for key, value in plain.items():
        if not isinstance(value, torch.Tensor):
            continue
        part = "optimizer" if key.startswith("optimizer.") else "model"
        total = parts.setdefault(part, [0, 0])
        total[0] += value.numel()
        total[1] += value.numel() * value.element_size()
    return [[part, n, b] for part, (n, b) in parts.items()]


def object_rows(metadata: dict) -> list[list]:
    """``[key, global shape]`` of the ``ShardedObject`` entries of ``load_sharded_metadata``."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return [
        [key, tuple(sh.global_shape)] for key, sh in sorted(metadata.items()) if isinstance(sh, ShardedObject)
    ]
