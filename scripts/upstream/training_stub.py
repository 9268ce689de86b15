"""A stand-in for ``megatron.training`` in the upstream test run (test-side, like cpu_shims).

The tests' helpers import a few names from ``megatron.training``, which is not part of the
megatron-core package and, from the checkout, needs triton (a GPU compiler) to import. The areas we
run use only ``initialize._set_random_seed``, given here with the same effect (written for this
harness): one seed per pipeline stage (and per DP rank if asked) for Python, NumPy and torch, then
Megatron's model-parallel seed, as on a machine with GPUs. Every other name raises one clear line.
"""

from __future__ import annotations

import random
import sys
import types


class TrainingUnavailable(ImportError):
    pass


def _unavailable(name):
    def refused(*args, **kwargs):
        raise TrainingUnavailable(
            f"megatron.training.{name}: not available in the CPU upstream run (needs triton)"
        )

    return refused


def _set_random_seed(
    seed_,
    data_parallel_random_init=False,
    te_rng_tracker=False,
    inference_rng_tracker=False,
    use_cudagraphable_rng=False,
):
    import numpy as np
    import torch
    from megatron.core import parallel_state, tensor_parallel

    if seed_ is None or seed_ <= 0:
        raise ValueError(f"Seed ({seed_}) should be a positive integer.")
    seed = seed_ + 100 * parallel_state.get_pipeline_model_parallel_rank()
    if data_parallel_random_init:
        seed += 10 * parallel_state.get_data_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(
        seed, te_rng_tracker, inference_rng_tracker, use_cudagraphable_rng
    )


def install() -> None:
    package = types.ModuleType("megatron.training")
    package.__path__ = []
    names = {
        "arguments": ["parse_args", "core_transformer_config_from_args"],
        "training": ["get_model"],
        "utils": ["unwrap_model"],
        "initialize": [],
        "global_vars": ["get_args", "set_args"],
    }
    for sub, refused in names.items():
        module = types.ModuleType(f"megatron.training.{sub}")
        for name in refused:
            setattr(module, name, _unavailable(f"{sub}.{name}"))
        setattr(package, sub, module)
        sys.modules[module.__name__] = module
    package.initialize._set_random_seed = _set_random_seed
    sys.modules["megatron.training"] = package
    import megatron

    megatron.training = package
