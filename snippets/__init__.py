"""Machinery behind the notes: launching CPU ranks, the CPU compat layer, recording
collectives, rendering tables, pinned source links. Notes import from here; nothing here
imports a note.

Importing ``snippets`` first silences warnings that are known and harmless here (and would
otherwise be stored as stderr in every notebook): megatron-core saying Transformer Engine / Apex
are absent, torch 2.13 deprecating ``all_gather_into_tensor`` (which Megatron calls), and every
``TransformerConfig`` warning that its own default ``cuda_graph_scope`` is deprecated.
"""

import warnings

warnings.filterwarnings("ignore", message=r".*Transformer Engine and Apex are not installed.*")
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor` is deprecated.*")
warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor` is deprecated.*")
warnings.filterwarnings("ignore", message=r".*Apex is not installed.*")
warnings.filterwarnings("ignore", message=r".*full scope is deprecated.*")

# In a Jupyter kernel that imports ``snippets`` before torch (every note's first cell does), torch
# is pinned to one intra-op thread from the start. The kernel then never runs multi-threaded
# torch work, and forking a rank from it is safe: :mod:`snippets.ranks.launch` forks ranks straight from
# the kernel, which has already paid for importing torch and megatron, instead of starting a
# fork server that imports them again (~4 s per notebook). Anywhere else it keeps the fork server.
import sys as _sys

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
