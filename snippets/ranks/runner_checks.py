"""The runner's command line and what it checks before anything starts (:mod:`snippets.ranks.runner`).

Steps 1 and 2 of ``python -m snippets.run``: parse the command (experiments separated by ``+``),
resolve the sizes and the parallel sizes, check them (:class:`snippets.ranks.parallel_dims.ParallelDims`
and :func:`snippets.experiments.registry.problems`), look for GPUs, and hold the memory estimate
against what this rank may use. Whatever cannot run is a :class:`Refused`: one line on stderr and
exit status :data:`REFUSED`, said by the rank that should (:func:`_refuse`), before any rendezvous
and, without NVIDIA device files, without importing torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time

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


NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
"""Device files the NVIDIA driver creates (``/dev/dxg``: WSL 2). Without any of them
``torch.cuda.is_available()`` is false, so the verdict needs no torch."""


def nvidia_device_nodes() -> bool:
    return any(os.path.exists(path) for path in NVIDIA_DEVICE_NODES)


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
