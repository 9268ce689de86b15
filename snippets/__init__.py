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
# torch work, and forking a rank from it is safe: :mod:`snippets.launch` forks ranks straight from
# the kernel, which has already paid for importing torch and megatron, instead of starting a
# fork server that imports them again (~4 s per notebook). Anywhere else it keeps the fork server.
import sys as _sys

KERNEL_FORKS_RANKS = "ipykernel" in _sys.modules and "torch" not in _sys.modules
if KERNEL_FORKS_RANKS:
    import torch as _torch

    _torch.set_num_threads(1)
