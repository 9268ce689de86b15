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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
import traceback

from snippets.experiments import EXPERIMENTS, Parallel, problems
from snippets.models import memory_estimate as mem
from snippets.models import presets

REFUSED = 2
"""Exit status of a job refused before it started (bad arguments, sizes, or not enough memory)."""


class Refused(Exception):
    """The job cannot run as asked; the message says why in one line.

    ``everywhere``: every rank of the job reaches it from the same arguments, so rank 0 alone says
    it. Otherwise (memory, GPUs) it depends on the host: local rank 0 of each refusing host says it,
    and so does a rank that refuses while its local rank 0 would not (``alone``)."""

    def __init__(self, message: str, everywhere: bool = True, alone: bool = False):
        super().__init__(message)
        self.everywhere, self.alone = everywhere, alone


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is a :class:`Refused` (one line) instead of usage text + exit."""

    def error(self, message):
        raise Refused(f"{message} (python -m snippets.run --help lists the flags)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m snippets.run",
        description="Run a note's experiment on N ranks (--nproc-per-node N, or under torchrun); "
        "rank 0 prints its tables.",
        epilog="experiments: "
        + "; ".join(f"{e.name} (note {e.note[:2]})" for e in EXPERIMENTS.values())
        + f". Several in one job: EXPERIMENT [options] {SEPARATOR} EXPERIMENT [options] ...",
    )
    p.add_argument("experiment", nargs="?", help="which experiment (--list shows them)")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        dest="nproc",
        help="start N ranks on this host (torch's elastic launcher, as torchrun "
        "--standalone does); only before the first experiment",
    )
    p.add_argument("--list", action="store_true", help="list the experiments and presets, then exit")
    p.add_argument(
        "--dims",
        default="tiny",
        choices=presets.NAMES,
        help="model sizes: tiny = the note's own, or a real model's (default tiny)",
    )
    sizes = p.add_argument_group("size overrides (applied on top of --dims)")
    for name in presets.OVERRIDES:
        sizes.add_argument("--" + name.replace("_", "-"), type=int, dest=name, metavar="N")
    par = p.add_argument_group("parallel sizes (world size: --nproc-per-node, or torchrun's)")
    for name in ("tp", "pp", "cp", "ep"):
        par.add_argument("--" + name, type=int, default=1, metavar="N")
    par.add_argument(
        "--vp", type=int, default=None, metavar="N", help="virtual pipeline size (interleaved 1F1B)"
    )
    par.add_argument(
        "--dp",
        type=int,
        default=None,
        metavar="N",
        help="data parallel size; checked, since it follows from the others",
    )
    par.add_argument("--sequence-parallel", action="store_true", dest="sp")
    p.add_argument(
        "--estimate", action="store_true", help="print the memory estimate and the verdict, start nothing"
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="with --estimate: the world size to estimate for",
    )
    return p


def listing() -> str:
    lines = ["experiments:"]
    width = max(len(name) for name in EXPERIMENTS)
    for e in EXPERIMENTS.values():
        lines.append(f"  {e.name:<{width}} note {e.note}: {e.what}")
        reads = ", ".join(e.uses) or "none (every rank is data parallel)"
        lines.append(
            f"  {'':<{width}} parallel sizes it reads: {reads}; "
            f"e.g. {f'{e.name} --dims tiny {e.example}'.rstrip()}"
        )
    lines.append("presets (--dims):")
    lines.append("  tiny      the note's own sizes (per experiment)")
    for name, d in presets.PRESETS.items():
        lines.append(f"  {name:<9} {presets.parameter_count(d) / 1e9:.2f}B parameters: {d.describe()}")
    return "\n".join(lines)


def resolve(args, world: int):
    """``(experiment, dims, parallel)`` from the arguments, or :class:`Refused`."""
    if args.experiment not in EXPERIMENTS:
        what = "no experiment given" if args.experiment is None else f"unknown experiment {args.experiment!r}"
        raise Refused(
            f"{what}; known: " + ", ".join(f"{e.name} (note {e.note})" for e in EXPERIMENTS.values())
        )
    exp = EXPERIMENTS[args.experiment]
    try:
        dims = presets.resolve(args.dims, exp.tiny, **{k: getattr(args, k) for k in presets.OVERRIDES})
    except ValueError as exc:
        raise Refused(f"{exp.name} --dims {args.dims}: {exc}") from None
    if args.dp is not None and args.dp < 1:
        raise Refused(f"--dp must be a positive int, got {args.dp}")
    try:  # the world size was checked already: what ParallelDims refuses here is one of the flags
        par = Parallel(
            world=world, tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, ep=args.ep, etp=exp.etp, sp=args.sp
        )
    except ValueError as exc:
        raise Refused(f"--{exc}") from None
    found = problems(exp, dims, par)
    if args.dp is not None and not found and args.dp != par.dp:
        found.append(
            f"--dp {args.dp} does not match world size {world} / (tp*pp*cp = {par.model_ranks}) = {par.dp}"
        )
    if found and world == 1 and "WORLD_SIZE" not in os.environ:
        enough = ranks_needed(exp, dims, par)
        if enough:
            found.append(f"use --nproc-per-node {enough} to start {enough} ranks")
    if found:
        raise Refused(f"{exp.name} on {world} rank(s): " + "; ".join(found))
    return exp, dims, par


def ranks_needed(exp, dims, par, most: int = 64) -> int | None:
    """The smallest world size at which ``exp`` has no problem with these sizes, if any."""
    for world in range(2, most + 1):
        if not problems(exp, dims, dataclasses.replace(par, world=world)):
            return world
    return None


def memory_verdict(exp, dims, par, local_rank: int, local_world: int) -> tuple[bool, str]:
    """``(fits, one line)``: the estimate for one rank against what this rank may use."""
    need = exp.estimate(dims, par)
    have, source = mem.available_bytes(par.cuda, local_rank, local_world)
    line = f"memory per rank: needs {need.describe()}; has {mem.gib(have)} GiB ({source})"
    if need.total <= have:
        return True, line
    return False, (
        f"refusing {exp.name} --dims {dims.name} ({dims.describe(exp.unused)}) "
        f"on {par.describe()}: one rank needs {need.describe()}, "
        f"but this rank has {mem.gib(have)} GiB "
        f"({source}). Use more ranks (--tp/--pp), a shorter --seq, fewer --layers, "
        f"or --dims tiny. Nothing was started."
    )


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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        all_args = [parser().parse_args(segment) for segment in split(argv)]
        if any(args.list for args in all_args):
            print(listing())
            return 0
        nproc = _nproc(all_args)
        if nproc is not None and "torch" not in sys.modules:
            import snippets

            snippets.fork_ranks_from_this_process()  # before check() imports torch: ranks are forked
        jobs, headers = check(all_args, nproc)
    except Refused as exc:
        return _refuse(exc)
    if any(args.estimate for args in all_args):
        if mem.local_world()[0] == 0:
            print("\n\n".join(headers))
        return 0
    if nproc is not None:  # checked for a world of nproc: now start them (torch's elastic launcher)
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


def _nproc(all_args) -> int | None:
    nprocs = [args.nproc for args in all_args if args.nproc is not None]
    if not nprocs:
        return None
    if "WORLD_SIZE" in os.environ:
        raise Refused("--nproc-per-node is for starting the ranks here; under torchrun, give it to torchrun")
    if all_args[0].nproc is None or len(nprocs) > 1:
        raise Refused("--nproc-per-node goes once, before the first experiment")
    if nprocs[0] < 1:
        raise Refused(f"--nproc-per-node must be a positive int, got {nprocs[0]}")
    return nprocs[0]


def _without_nproc(segment: list[str]) -> list[str]:
    out, skip = [], False
    for arg in segment:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def check(all_args, nproc: int | None) -> tuple[list, list[str]]:
    """Every job ``(experiment, dims, parallel)`` and its header, or :class:`Refused`: the
    arguments, the sizes, the GPUs and the memory, for a world of ``nproc`` ranks on this host
    (``--nproc-per-node``), of torchrun's ``WORLD_SIZE``, or of one."""
    local_rank, local_world = mem.local_world()
    under_torchrun = "WORLD_SIZE" in os.environ
    asked = {args.world_size for args in all_args} - {None}
    if asked and (under_torchrun or nproc or not any(a.estimate for a in all_args) or len(asked) > 1):
        raise Refused(
            "--world-size is only for --estimate without a launcher (torchrun and "
            "--nproc-per-node set it), and one value for the whole command"
        )
    world = nproc or int(os.environ.get("WORLD_SIZE", asked.pop() if asked else 1))
    jobs = [resolve(args, world) for args in all_args]  # every experiment before any starts
    gpus = 0
    if nvidia_device_nodes():  # only then can CUDA be there: without, refusals skip torch (~2.5 s)
        import torch  # only now: a bad command line is refused without paying for torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = "cuda" if gpus else "cpu"
    if not under_torchrun:  # a world of `world` ranks on this host (or one per GPU)
        local_world = min(world, gpus or world)
    if device == "cuda" and (nproc or local_world) > gpus:
        raise Refused(
            f"{nproc or local_world} ranks on this host but {gpus} GPU(s): "
            f"use --nproc-per-node {gpus} or fewer",
            everywhere=False,
        )
    headers = []
    for i, (exp, dims, par) in enumerate(jobs):
        par = dataclasses.replace(par, device=device)
        jobs[i] = exp, dims, par
        fits, verdict = memory_verdict(exp, dims, par, local_rank, local_world)
        if not fits:
            alone = local_rank != 0 and memory_verdict(exp, dims, par, 0, local_world)[0]
            raise Refused(verdict, everywhere=False, alone=alone)
        headers.append(
            f"snippets.run {exp.name} (note {exp.note}) --dims {dims.name}: "
            f"{dims.describe(exp.unused)}\n"
            f"{par.describe()}; {par.backend} on {device}"
            + ("" if par.cuda else ", snippets.cpu applied")
            + f"\n{verdict}"
        )
    return jobs, headers


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


REFUSE_WAIT_S = 5.0
"""Longest a refusing rank waits for its host's local rank 0 to have refused (and said why)."""


def _refuse(exc: Refused) -> int:
    """Say why in one line, from the rank that should (:class:`Refused`), and exit 2.

    Under a launcher every rank refuses. Each one ignores the launcher's SIGTERM and leaves on its
    own with status 2, so the launcher's report lists every rank as exit code 2, not as stopped.
    Every rank writes the line to its torchelastic error file, so a raw ``torchrun``'s report names
    the reason on each; the others write theirs after local rank 0 (which has printed by then),
    and each leaves once all ranks of its host have written theirs."""
    line = f"snippets.run: {exc}"
    rank, (local_rank, local_world) = int(os.environ.get("RANK", 0)), mem.local_world()
    if (rank == 0) if exc.everywhere else (local_rank == 0 or exc.alone):
        print(line, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or "WORLD_SIZE" not in os.environ:
        return REFUSED
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopped by the agent = a second, wrong reason
    attempt = os.path.dirname(os.path.dirname(error_file))  # .../attempt_N/<local rank>/error.json
    first = os.path.join(attempt, "0", os.path.basename(error_file))
    deadline = time.monotonic() + REFUSE_WAIT_S
    while local_rank != 0 and not os.path.exists(first) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        with open(error_file, "w") as f:
            json.dump(
                {
                    "message": {
                        "message": line,
                        "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))},
                    }
                },
                f,
            )
    except OSError:
        pass
    # stay until every rank of this host has refused too: none is left for the agent to stop
    everyone = [os.path.join(attempt, str(r), os.path.basename(error_file)) for r in range(local_world)]
    while not all(map(os.path.exists, everyone)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return REFUSED
