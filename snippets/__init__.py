"""Machinery behind the notes: launching CPU ranks, the CPU compat layer, recording
collectives, rendering tables, pinned source links. Notes import from here; nothing here
imports a note.

Warnings are filtered here, and only here. Every process that runs our code imports ``snippets``
before torch and Megatron: a note's first cell, the kernel zygote, the test processes
(``tests/conftest.py``), ``python -m snippets.run`` and the fork server; ranks forked from any of them
inherit the filters. Each one below is known and harmless on CPU ranks, and would otherwise be stored
as stderr in a notebook (a rank's stderr reaches the cell).
"""

import logging as _logging
import sys as _sys
import warnings
from importlib import metadata as _metadata

from snippets import import_gc as _import_gc

_import_gc.install()  # torch and megatron.core import without the cyclic collector (~1.8 CPU s less)

_KNOWN_WARNINGS = (
    # megatron.core without Transformer Engine / Apex: "Falling back to Torch Norm" and the like.
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    # HyperCommGrid (note 22) without absl falls back to the logging module.
    r"absl\.logging is not installed",
    # torch 2.13 deprecates the collectives Megatron calls.
    r"all_gather_into_tensor` is deprecated",
    r"reduce_scatter_tensor` is deprecated",
    # Every TransformerConfig: its own default cuda_graph_modules="full" is deprecated (transformer_config.py:2415).
    r"full scope is deprecated",
    # A MoE config without moe_ffn_hidden_size falls back to ffn_hidden_size.
    r"moe_ffn_hidden_size is not set",
    # TP linears suggest CUDA_DEVICE_MAX_CONNECTIONS=1, a GPU kernel-ordering setting.
    r"CUDA_DEVICE_MAX_CONNECTIONS",
    # DistributedOptimizer.zero_grad reads `.grad` of its shard views, which are not leaves
    # (Megatron's own comment there says it warns).
    r"\.grad attribute of a Tensor that is not a leaf",
    # dist_checkpointing loads through torch.distributed.checkpoint's older entry points, which
    # announce their own deprecation on every load.
    r"`load_state_dict` is deprecated",
    r"Please use DTensor instead",
    # megatron.core.optimizer imports the experimental MIMO model's config (0.19.0), which warns.
    r"MimoModelConfig is experimental",
    # IndexedDataset asks which rank it is (_rank_utils.py:40); a process outside any process group
    # (a note's single-process cell) has none, and the warning prints the machine's path.
    r"Could not determine rank from torch\.distributed",
    # megatron.training's layer specs without Transformer Engine use the local expert linears.
    r"supports MoE experts",
    # dist_checkpointing.load reads the common state with torch's no_dist load
    # (serialization.py::load_common_state_dict) and calls torch's load with the older argument
    # order: torch warns about both on every load (0.19.0).
    r"torch\.distributed is disabled, unavailable or uninitialized",
    r"The argument order of load has been changed",
    # Core's null tokenizer imports transformers, whose tqdm.auto looks for ipywidgets in a kernel.
    r"IProgress not found",
)
for _message in _KNOWN_WARNINGS:
    warnings.filterwarnings("ignore", message=".*" + _message)

# torch's CUDA build (the one PyPI serves for Python 3.12) logs "No CUDA runtime is found, using
# CUDA_HOME=..." when megatron.core imports torch.utils.cpp_extension on a machine without a GPU.
_logging.getLogger("torch.utils.cpp_extension").setLevel(_logging.ERROR)

# megatron-core 0.19.0 logs two notices on every use that say nothing about the run:
_KNOWN_LOG_LINES = {
    # GPTModel.__init__ (models/gpt/gpt_model.py:118): GPTModel takes only critical fixes now and
    # HybridModel is the successor (notes 04 and 19 say so where they build one).
    "megatron.core.models.gpt.gpt_model": "GPTModel IS DEPRECATED",
    # DDP built directly with the distributed optimizer computes the buffer layout itself
    # (distributed/distributed_data_parallel.py:132); training.py passes a precomputed one.
    "megatron.core.distributed.distributed_data_parallel": "DistributedDataParallel: full_param_layout not provided",
    # A synchronous dist_checkpointing.save goes through async_save(async_strategy="mcore")
    # (strategies/torch.py), which logs once per process that MCore's own async saver is deprecated.
    "megatron.core.dist_checkpointing.strategies.torch": "MCore's async save is deprecated",
}


def _drop_known(prefix: str):
    return lambda record: not str(record.msg).startswith(prefix)


for _name, _prefix in _KNOWN_LOG_LINES.items():
    _logging.getLogger(_name).addFilter(_drop_known(_prefix))

MEGATRON_CORE_PIN = "0.19.0"
"""The megatron-core every note, citation (tag ``core_v0.19.0``) and stored output is made with."""


class PinMismatch(ImportError):
    """The installed megatron-core is not the pinned one: said in one line, in a notebook too."""

    def _render_traceback_(self):  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def check_pin(installed: str | None = None) -> None:
    """Refuse, in one line, an environment whose megatron-core is not :data:`MEGATRON_CORE_PIN`."""
    if installed is None:
        try:
            installed = _metadata.version("megatron-core")
        except _metadata.PackageNotFoundError:
            installed = "not installed"
    if installed == MEGATRON_CORE_PIN:
        return
    message = (
        f"megatron-core {installed} is installed, but these notes are pinned to megatron-core=="
        f"{MEGATRON_CORE_PIN} (tag core_v{MEGATRON_CORE_PIN}); run `bash scripts/setup.sh` and use its .venv"
    )
    ipython = _sys.modules.get("IPython")
    if ipython is not None and ipython.get_ipython() is not None:
        raise PinMismatch(message)  # a notebook cell: one line under the cell
    print(f"snippets: {message}", file=_sys.stderr)  # a command or a test process: one line, status 2
    raise SystemExit(2)


check_pin()

# In a Jupyter kernel that imports ``snippets`` before torch (every note's first cell does), torch
# is pinned to one intra-op thread from the start. The kernel then never runs multi-threaded
# torch work, and forking a rank from it is safe: :mod:`snippets.ranks.launch` forks ranks straight from
# the kernel, which has already paid for importing torch and megatron, instead of starting a
# fork server that imports them again (~4 s per notebook). Anywhere else it keeps the fork server.

FORKS_RANKS = False
"""Whether :mod:`snippets.ranks.launch` may fork ranks from this process (torch pinned to one thread
before it was imported): true in such a kernel, or after :func:`fork_ranks_from_this_process`."""


def fork_ranks_from_this_process() -> None:
    """Declare, before torch is imported, that this process forks its ranks itself, as a kernel
    does: torch is pinned to one intra-op thread now, so it never runs multi-threaded work. The
    test suite calls this in each pytest process (tests/conftest.py), which has imported torch and
    megatron.core anyway, so no fork server has to import them a second time. A later
    ``torch.set_num_threads(n > 1)`` makes :mod:`snippets.ranks.launch` fall back to the fork server."""
    global FORKS_RANKS
    if FORKS_RANKS:
        return
    if "torch" in _sys.modules:
        raise RuntimeError("fork_ranks_from_this_process() must run before torch is imported")
    import torch as _torch

    _torch.set_num_threads(1)
    FORKS_RANKS = True


KERNEL_FORKS_RANKS = "ipykernel" in _sys.modules and "torch" not in _sys.modules
if KERNEL_FORKS_RANKS:
    fork_ranks_from_this_process()
