"""Machinery behind the notes: launching CPU ranks, the CPU compat layer, recording
collectives, rendering tables, pinned source links. Notes import from here; nothing here
imports a note.

Warnings are filtered here, and only here. Every process that runs our code imports ``snippets``
before torch and Megatron: a note's first cell, the kernel zygote, the test processes
(``tests/conftest.py``), ``python -m snippets.run`` and the fork server; ranks forked from any of them
inherit the filters. Each one below is known and harmless on CPU ranks, and would otherwise be stored
as stderr in a notebook (a rank's stderr reaches the cell).
"""

import sys as _sys
import warnings

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
    # Every TransformerConfig: its own default cuda_graph_scope="full" is deprecated.
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
    # Core's null tokenizer imports transformers, whose tqdm.auto looks for ipywidgets in a kernel.
    r"IProgress not found",
)
for _message in _KNOWN_WARNINGS:
    warnings.filterwarnings("ignore", message=".*" + _message)

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
