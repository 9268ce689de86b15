"""Run a note's experiment as a job of N ranks: the same function the note's cell runs, any size.

    python -m snippets.run --nproc-per-node 8 tp-layer --dims qwen3-8b --tp 8
    python -m snippets.run --nproc-per-node 4 pipeline --dims tiny --pp 4
    python -m snippets.run --nproc-per-node 2 tp-layer --tp 2 + pipeline --pp 2
    python -m snippets.run --list
    python -m snippets.run pipeline --dims qwen3-8b --pp 4 --tp 2 --world-size 8 --estimate
    torchrun --nnodes 2 --nproc-per-node 8 ... -m snippets.run pipeline --dims qwen3-8b --pp 4  # multi-node

``torch.distributed`` is the distributed engine and torch's elastic launcher starts the ranks:
with ``--nproc-per-node N`` this process checks the whole command first (steps 1 and 2, for a
world of N), then starts N ranks through ``torch.distributed.launcher.elastic_launch`` -- what
``torchrun --standalone`` does, in-process -- each running this module. Under a ``torchrun`` the
user started (several hosts), each rank runs this module directly. In every rank it:

1. resolves the sizes (``--dims`` preset, then single-size overrides such as ``--seq 512``) and the
   parallel sizes (``--tp/--pp/--vp/--cp/--ep/--dp``, world size from ``WORLD_SIZE``), checked by
   :class:`snippets.ranks.parallel_dims.ParallelDims` and the registry
   (:func:`snippets.experiments.registry.problems`);
2. estimates the memory one rank needs (:mod:`snippets.experiments.needs`) and refuses when this
   rank's GPU (free memory) or its share of the host RAM cannot hold it. A refusal is one line on
   stderr and exit status 2, before ``init_process_group``: every rank reaches the same verdict
   from the same numbers, so a refused job never half starts (:func:`_refuse` says who prints);
3. joins the job: NCCL on the GPU ``LOCAL_RANK`` when CUDA is available, else gloo on the CPU with
   :mod:`snippets.cpu` applied (only then); installs the collective recorder;
4. runs the experiment's ``run`` on every rank, gathers the per-rank summaries on rank 0, and rank 0
   prints the experiment's tables -- at a note's sizes, the tables the note shows.

Several experiments separated by ``+`` run one after the other in the same job (each is checked
before any starts; Megatron's model-parallel state is torn down between them).

Without ``--nproc-per-node`` or ``torchrun`` it runs as a single rank.

The command line and its checks (steps 1 and 2) are :mod:`snippets.ranks.runner_checks`; this module
joins the job and runs it (steps 3 and 4).
"""

from __future__ import annotations

import os
import sys
import traceback

from snippets.experiments import Parallel
from snippets.models import memory_estimate as mem
from snippets.ranks.runner_checks import (
    REFUSED,
    SEPARATOR,
    Refused,
    _nproc,
    _refuse,
    _without_nproc,
    check,
    listing,
    memory_verdict,
    nvidia_device_nodes,
    parser,
    split,
)

# this module's names, and the checks' that tests and snippets/experiments/needs.py name as runner.*
__all__ = [
    "REFUSED",
    "Refused",
    "join",
    "main",
    "memory_verdict",
    "nvidia_device_nodes",
    "parser",
    "render",
    "run_jobs",
]


def join(par: Parallel, rank: int, world: int, local_rank: int, local_world: int) -> None:
    """Join the job the way ``snippets.ranks.rank_env.init_rank`` does for a note's CPU rank, but from
    ``torchrun``'s environment (``env://``); NCCL on this rank's GPU when there is one."""
    import torch
    import torch.distributed as dist

    from snippets import cpu as cpu_compat
    from snippets.ranks import rank_env
    from snippets.record import recorder

    torch.manual_seed(rank_env.SEED)
    if par.cuda:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(1)  # ranks share the host's cores; also keeps CPU floats reproducible
        if local_world == world:  # one host: gloo talks over loopback, as in the notes
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        cpu_compat.apply()
    recorder.install()
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=par.backend, init_method="env://", rank=rank, world_size=world)
    else:  # plain `python -m snippets.run`: a world of one
        dist.init_process_group(backend=par.backend, store=dist.HashStore(), rank=0, world_size=1)


def render(items) -> str:
    from snippets.record.tables import Table

    return "\n\n".join(item.markdown() if isinstance(item, Table) else str(item) for item in items)


def main(argv=None) -> int:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron's advice for TP overlap
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        all_args = [parser().parse_args(segment) for segment in split(argv)]
        if any(args.list for args in all_args):
            print(listing())
            return 0
        nproc = _nproc(all_args)
        jobs, headers = check(all_args, nproc)  # imports torch only on a host with NVIDIA devices
    except Refused as exc:
        return _refuse(exc)
    if any(args.estimate for args in all_args):
        if mem.local_world()[0] == 0:
            print("\n\n".join(headers))
        return 0
    if nproc is not None:  # checked for a world of nproc: now start them (torch's elastic launcher)
        if "torch" not in sys.modules:  # a CPU host: torch is pinned now, before its import, so the
            import snippets  # ranks can be forked from here (snippets/__init__.py)

            snippets.fork_ranks_from_this_process()
        from snippets.ranks.elastic import launch

        rest = [arg for segment in split(argv) for arg in [SEPARATOR, *_without_nproc(segment)]][1:]
        # CPU ranks are forked from here (imports paid once); with GPUs each rank is a fresh
        # interpreter, as under torchrun, since this process has already queried CUDA
        on_cpu = all(par.device == "cpu" for _, _, par in jobs)
        preload = sorted({exp.module for exp, _, _ in jobs})
        return launch(
            nproc, "snippets.run", rest, refused=REFUSED, entry=main if on_cpu else None, preload=preload
        )
    return run_jobs(jobs, headers)


def run_jobs(jobs, headers) -> int:
    """Steps 3 and 4 in this rank: join the job, run every experiment, rank 0 prints."""
    import torch

    rank, world = int(os.environ.get("RANK", 0)), jobs[0][2].world
    local_rank, local_world = mem.local_world()

    functions = [exp.functions() for exp, _, _ in jobs]
    join(jobs[0][2], rank, world, local_rank, local_world)
    import torch.distributed as dist
    from megatron.core import parallel_state

    from snippets.ranks import rank_env

    for (exp, dims, par), (run, tables), header in zip(jobs, functions, headers):
        try:
            torch.manual_seed(rank_env.SEED)  # each experiment starts like a fresh rank of a note
            result = run(dims, par)
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(result, gathered, dst=0)
            if rank == 0:
                print(header + "\n\n" + render(tables(gathered, dims, par)) + "\n", flush=True)
            dist.barrier()
        except Exception:  # noqa: BLE001 - say which rank failed; torchrun then stops the others
            print(f"rank {rank} failed in {exp.name}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            return 1
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0
