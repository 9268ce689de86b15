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
