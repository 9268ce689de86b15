"""What every CPU rank does before it runs a note's function.

The process that forks the ranks imports this module once (it is in ``launch._PRELOAD``, after
torch and megatron.core); each rank then only joins the gloo world. Kept apart from
:mod:`snippets.ranks.launch` so that a ``torchrun`` entry point can reuse :func:`init_rank` without
the local launcher.
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from snippets import cpu as cpu_compat
from snippets.record import recorder

SEED = 1234


def init_rank(rank: int, world_size: int, store_path: str, timeout_s: float) -> None:
    """Join a gloo world of ``world_size`` ranks through a file store, ready for Megatron."""
    # Ranks share 2 cores: one intra-op thread each keeps them from oversubscribing the CPU,
    # and keeps float results independent of how many ranks run side by side.
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cpu_compat.apply()
    recorder.install()
    use_local_writer_queue()
    # A full gc.collect() (DistributedOptimizer runs one after gathering its state) walks every
    # object torch and megatron created at import (~0.5 s each here); frozen ones are skipped.
    gc.freeze()
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend="gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        # Longer than the launch bound: when a peer never arrives, the launcher's deadline fires
        # first and reports where every rank was, instead of a bare gloo timeout.
        timeout=timedelta(seconds=timeout_s + 30),
    )


def use_local_writer_queue() -> None:
    """Give ``dist_checkpointing.save`` a queue in this process instead of a spawned Manager.

    torch_dist's writer hands its results back through a module-level queue; on first use it
    makes one with a *spawned* multiprocessing Manager, so that an async save running in another
    process could use it too. The notes save synchronously, from the rank itself, where a plain
    queue does the same job. That spares a Python start-up per rank (~2 s per save launch here)
    and leaves no Manager process behind when a rank ends with ``os._exit`` (seen: orphaned
    Managers from earlier runs). Megatron's own code is unchanged; only the queue is provided.
    """
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


def finish_rank() -> None:
    """Wait until every rank is done with its function, then let this one go."""
    if dist.is_initialized():
        dist.barrier()
