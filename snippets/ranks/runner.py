"""Run a note's experiment as a ``torchrun`` job: the same function the note's cell runs, any size.

    torchrun --standalone --nproc-per-node 8 -m snippets.run tp-layer --dims qwen3-8b --tp 8
    torchrun --standalone --nproc-per-node 4 -m snippets.run pipeline --dims tiny --pp 4
    torchrun --standalone --nproc-per-node 2 -m snippets.run tp-layer --tp 2 + pipeline --pp 2
    python -m snippets.run --list
    python -m snippets.run pipeline --dims qwen3-8b --pp 4 --tp 2 --world-size 8 --estimate

``torch.distributed`` is the distributed engine and ``torchrun`` its launcher; this module is only
the entry point each rank runs. In every rank it:

1. resolves the sizes (``--dims`` preset, then single-size overrides such as ``--seq 512``) and the
   parallel sizes (``--tp/--pp/--vp/--cp/--ep/--dp``, world size from ``torchrun``'s
   ``WORLD_SIZE``) and refuses impossible combinations;
2. estimates the memory one rank needs (:mod:`snippets.models.memory_estimate`) and refuses -- exit status
   2, one line -- when this rank's GPU (free memory) or its share of the host RAM cannot hold it.
   All of this happens before ``init_process_group``: every rank reaches the same verdict from the
   same numbers, so a refused job never half starts;
3. joins the job: NCCL on the GPU ``LOCAL_RANK`` when CUDA is available, else gloo on the CPU with
   :mod:`snippets.cpu` applied (only then); installs the collective recorder;
4. runs the experiment's ``run`` on every rank, gathers the per-rank summaries on rank 0, and rank 0
   prints the experiment's tables -- at a note's sizes, the tables the note shows.

Several experiments separated by ``+`` run one after the other in the same job (each is checked
before any starts; Megatron's model-parallel state is torn down between them).

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) it runs as a single rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback

from snippets.models import memory_estimate as mem
from snippets.models import presets
from snippets.experiments import EXPERIMENTS, Parallel, problems

REFUSED = 2
"""Exit status of a job refused before it started (bad arguments, sizes, or not enough memory)."""


class Refused(Exception):
    """The job cannot run as asked; the message says why in one line."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m snippets.run",
        description="Run a note's experiment on every rank of a torchrun job; rank 0 prints its tables.",
        epilog="experiments: " + "; ".join(f"{e.name} (note {e.note[:2]})" for e in EXPERIMENTS.values())
        + f". Several in one job: EXPERIMENT [options] {SEPARATOR} EXPERIMENT [options] ...")
    p.add_argument("experiment", nargs="?", help="which experiment (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the experiments and presets, then exit")
    p.add_argument("--dims", default="tiny", choices=presets.NAMES,
                   help="model sizes: tiny = the note's own, or a real model's (default tiny)")
    sizes = p.add_argument_group("size overrides (applied on top of --dims)")
    for name in presets.OVERRIDES:
        sizes.add_argument("--" + name.replace("_", "-"), type=int, dest=name, metavar="N")
    par = p.add_argument_group("parallel sizes (world size comes from torchrun)")
    for name in ("tp", "pp", "cp", "ep"):
        par.add_argument("--" + name, type=int, default=1, metavar="N")
    par.add_argument("--vp", type=int, default=None, metavar="N",
                     help="virtual pipeline size (interleaved 1F1B)")
    par.add_argument("--dp", type=int, default=None, metavar="N",
                     help="data parallel size; checked, since it follows from the others")
    par.add_argument("--sequence-parallel", action="store_true", dest="sp")
    p.add_argument("--estimate", action="store_true",
                   help="print the memory estimate and the verdict, start nothing")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="with --estimate outside torchrun: the world size to estimate for")
    return p


def listing() -> str:
    lines = ["experiments:"]
    width = max(len(name) for name in EXPERIMENTS)
    for e in EXPERIMENTS.values():
        lines.append(f"  {e.name:<{width}} note {e.note}: {e.what}")
        reads = ", ".join(e.uses) or "none (every rank is data parallel)"
        lines.append(f"  {'':<{width}} parallel sizes it reads: {reads}; "
                     f"e.g. {f'{e.name} --dims tiny {e.example}'.rstrip()}")
    lines.append("presets (--dims):")
    lines.append("  tiny      the note's own sizes (per experiment)")
    for name, d in presets.PRESETS.items():
        lines.append(f"  {name:<9} {presets.parameter_count(d) / 1e9:.2f}B parameters: {d.describe()}")
    return "\n".join(lines)


def resolve(args, world: int):
    """``(experiment, dims, parallel)`` from the arguments, or :class:`Refused`."""
    if args.experiment not in EXPERIMENTS:
        what = "no experiment given" if args.experiment is None else \
            f"unknown experiment {args.experiment!r}"
        raise Refused(f"{what}; known: " + ", ".join(
            f"{e.name} (note {e.note})" for e in EXPERIMENTS.values()))
    exp = EXPERIMENTS[args.experiment]
    try:
        dims = presets.resolve(args.dims, exp.tiny,
                               **{k: getattr(args, k) for k in presets.OVERRIDES})
    except ValueError as exc:
        raise Refused(f"{exp.name} --dims {args.dims}: {exc}") from None
    for flag in ("tp", "pp", "cp", "ep", "vp", "dp"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise Refused(f"--{flag} must be a positive int, got {value}")
    par = Parallel(world=world, tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, ep=args.ep,
                   sp=args.sp)
    found = problems(exp, dims, par)
    if args.dp is not None and not found and args.dp != par.dp:
        found.append(f"--dp {args.dp} does not match world size {world} / (tp*pp*cp = "
                     f"{par.tp * par.pp * par.cp}) = {par.dp}")
    if found:
        raise Refused(f"{exp.name} on {world} rank(s): " + "; ".join(found))
    return exp, dims, par


def memory_verdict(exp, dims, par, local_rank: int, local_world: int) -> tuple[bool, str]:
    """``(fits, one line)``: the estimate for one rank against what this rank may use."""
    need = exp.estimate(dims, par)
    have, source = mem.available_bytes(par.cuda, local_rank, local_world)
    line = (f"memory per rank: needs {need.describe()}; has {mem.gib(have)} GiB ({source})")
    if need.total <= have:
        return True, line
    return False, (f"refusing {exp.name} --dims {dims.name} ({dims.describe(exp.unused)}) "
                   f"on {par.describe()}: one rank needs {need.describe()}, "
                   f"but this rank has {mem.gib(have)} GiB "
                   f"({source}). Use more ranks (--tp/--pp), a shorter --seq, fewer --layers, "
                   f"or --dims tiny. Nothing was started.")


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
        dist.init_process_group(backend=par.backend, init_method="env://", rank=rank,
                                world_size=world)
    else:  # plain `python -m snippets.run`: a world of one
        dist.init_process_group(backend=par.backend, store=dist.HashStore(), rank=0, world_size=1)


NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
"""Device files the NVIDIA driver creates (``/dev/dxg``: WSL 2). Without any of them
``torch.cuda.is_available()`` is false, so the verdict needs no torch."""


def nvidia_device_nodes() -> bool:
    return any(os.path.exists(path) for path in NVIDIA_DEVICE_NODES)


def render(items) -> str:
    from snippets.record.tables import Table

    return "\n\n".join(item.markdown() if isinstance(item, Table) else str(item) for item in items)


SEPARATOR = "+"
"""Between experiments on one command line: ``tp-layer --tp 2 + pipeline --pp 2`` runs both in one
job, so the ranks pay for starting (importing torch and Megatron, the rendezvous) once."""


def split(argv: list[str]) -> list[list[str]]:
    segments = [[]]
    for arg in argv:
        if arg == SEPARATOR:
            segments.append([])
        else:
            segments[-1].append(arg)
    return segments


def main(argv=None) -> int:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron's advice for TP overlap
    all_args = [parser().parse_args(segment) for segment in split(sys.argv[1:] if argv is None else argv)]
    if any(args.list for args in all_args):
        print(listing())
        return 0
    rank = int(os.environ.get("RANK", 0))
    local_rank, local_world = mem.local_world()
    under_torchrun = "WORLD_SIZE" in os.environ
    estimate = any(args.estimate for args in all_args)
    asked = {args.world_size for args in all_args} - {None}
    if asked and (under_torchrun or not estimate or len(asked) > 1):
        return _refuse("--world-size is only for --estimate outside torchrun (torchrun sets it), "
                       "and one value for the whole command", local_rank)
    world = int(os.environ.get("WORLD_SIZE", asked.pop() if asked else 1))
    jobs = []
    for args in all_args:  # every experiment is checked before any of them starts
        try:
            jobs.append(resolve(args, world))
        except Refused as exc:
            return _refuse(str(exc), local_rank)
    gpus = 0
    if nvidia_device_nodes():  # only then can CUDA be there: without, refusals skip torch (~2.5 s)
        import torch  # only now: a bad command line is refused without paying for torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = "cuda" if gpus else "cpu"
    if not under_torchrun:  # a world of `world` ranks on this host (or one per GPU)
        local_world = min(world, gpus or world)
    elif device == "cuda" and local_world > gpus:
        return _refuse(f"{local_world} ranks on this host but {gpus} GPU(s): "
                       f"use --nproc-per-node {gpus} or fewer", local_rank)
    headers = []
    for i, (exp, dims, par) in enumerate(jobs):
        par = dataclasses.replace(par, device=device)
        jobs[i] = exp, dims, par
        fits, verdict = memory_verdict(exp, dims, par, local_rank, local_world)
        if not fits:
            return _refuse(verdict, local_rank)
        headers.append(f"snippets.run {exp.name} (note {exp.note}) --dims {dims.name}: "
                       f"{dims.describe(exp.unused)}\n"
                       f"{par.describe()}; {par.backend} on {device}"
                       + ("" if par.cuda else ", snippets.cpu applied") + f"\n{verdict}")
    if estimate:
        if local_rank == 0:
            print("\n\n".join(headers))
        return 0

    import torch

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
            print(f"rank {rank} failed in {exp.name}:\n{traceback.format_exc()}", file=sys.stderr,
                  flush=True)
            return 1
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


REFUSE_DELAY_S = 5.0
"""How long ranks other than local rank 0 wait before refusing: every rank refuses for the same
reason, and torchrun stops the job at the first exit, so local rank 0 exits first and alone prints
the reason -- one line per host, not one per rank. A rank that refuses while local rank 0 does not
(free memory can differ between GPUs) still prints after the wait."""


def _refuse(message: str, local_rank: int) -> int:
    if local_rank != 0:
        time.sleep(REFUSE_DELAY_S)
    print(f"snippets.run: {message}", file=sys.stderr, flush=True)
    return REFUSED
