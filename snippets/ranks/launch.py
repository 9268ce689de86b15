"""Run one function on N local `torch.distributed` (gloo) ranks and bring every result back.

A note's cell calls :func:`run_ranks`; each rank is a fresh process, so Megatron's module-level
state (``parallel_state`` groups, RNG trackers) starts clean every time, and gloo groups never
leak from one experiment into the next.

How the ranks start, and why:

* **fork, from a clean process.** Importing torch + megatron.core costs ~4-5 s per process, so
  spawning every rank is slow; forking is fast but hangs once the forking process has run
  multi-threaded torch work. In a notebook kernel that imported ``snippets`` before torch, torch
  is pinned to one thread (``snippets/__init__.py``), so ranks are forked from the kernel itself;
  so do the test processes (``snippets.fork_ranks_from_this_process`` in ``tests/conftest.py``).
  Everywhere else (scripts, or once torch was allowed more threads) we use Python's
  ``forkserver``: one small server process is
  started on the first launch, imports torch, megatron.core and ``snippets`` once, never runs
  torch compute, and forks every rank from there. Later launches cost a fork, not an import.
* **functions travel by value.** A function defined in a notebook cell cannot be pickled by
  reference, so it is sent with ``cloudpickle`` (by value); functions from importable modules
  still go by reference.
* **no ports to collide.** Ranks meet through a ``FileStore`` in a fresh temporary directory, so
  notebooks running side by side never fight over a fixed port.
* **failure is loud and bounded.** A rank that raises makes :func:`run_ranks` raise
  :class:`RankError` with that rank's number and traceback. A rank that has not finished when the
  deadline passes gets its Python stack dumped (``faulthandler``) and is killed; the error names
  it and shows where it was stuck. Sizes that cannot form a grid are refused before any launch.

The same rank functions run under ``torchrun`` with NCCL on real GPUs: they only use
``torch.distributed`` and ``parallel_state``; this module is just the CPU-local launcher.
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import cloudpickle

from snippets.ranks.parallel_dims import ParallelDims

DEFAULT_TIMEOUT_S = 60.0
"""Upper bound for one launch, from fork to the last result."""

_PRELOAD = [
    "snippets",
    # before megatron.core: its import asks torch.cuda.is_available(), which on torch's CUDA build
    # makes every process forked from this one refuse CUDA ("Cannot re-initialize CUDA in forked
    # subprocess"); this module makes the question harmless where there is no CUDA driver
    "snippets.ranks.fork_safe",
    "torch",
    "megatron.core",
    "snippets.ranks.rank_env",
    # what ``rank_env.init_rank`` imports: the modules cpu_compat's patches edit, and the
    # checkpoint writer's queue (tests/ranks/test_cpu_compat.py checks this list against them)
    "megatron.core.tensor_parallel.random",
    "megatron.core.rerun_state_machine",
    "megatron.core.tensor_parallel",
    "megatron.core.tensor_parallel.data",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.torch_fully_sharded_data_parallel",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.resharding.copy_services.gloo_copy_service",
    "megatron.core.transformer.torch_norm",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.utils",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.models.common.language_module.language_module",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    # what most ranks import on their own: the GPT model and its layer specs (~0.4 s of CPU per
    # rank), and the text tokenizers behind ``MegatronTokenizer.from_pretrained``, which bring
    # transformers and huggingface_hub (~1 s per rank: every rank of notes 01, 03, 18 and 23
    # builds a null tokenizer)
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.tokenizers.text",
]
"""Modules the process that forks the ranks (the fork server, or a kernel or test process that
forks its own) imports once, so ranks start with them already loaded instead of each importing
them again (``snippets`` first: it installs the warning filters before Megatron warns). The
second half costs ~0.03 s of CPU per rank when left to the ranks; a test run starts ~850."""


class RankError(RuntimeError):
    """A rank raised, died, or did not finish in time.

    ``rank`` is the rank that caused it (the first to fail, or the first stuck one) and
    ``summary`` that rank's error in one line, e.g. ``"RuntimeError: world_size (4) is not
    divisible by 3"`` -- the same on every run, so a cell can print it.
    """

    def __init__(self, message: str, rank: int, summary: str):
        super().__init__(message)
        self.rank = rank
        self.summary = summary


class Grid(ParallelDims):
    """The sizes a launch is checked against before any process starts: a
    :class:`~snippets.ranks.parallel_dims.ParallelDims` that refuses, with :class:`ValueError`, sizes
    that do not fit together (``tp * pp * cp`` must divide ``world_size``, the rest being data
    parallel as in ``parallel_state.initialize_model_parallel``; ``ep`` must divide the ranks left
    for experts, ``world_size / (etp * pp)``).
    """

    WORLD = "world_size"

    def __post_init__(self):
        super().__post_init__()
        self.check()

    @property
    def world_size(self) -> int:
        return self.world


def _context() -> mp.context.BaseContext:
    import snippets

    if snippets.FORKS_RANKS and _torch_single_threaded():
        # a notebook kernel (or a test process) whose torch never ran multi-threaded
        # (snippets/__init__.py)
        prepare_to_fork()
        return mp.get_context("fork")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def prepare_to_fork(extra: Sequence[str] = ()) -> None:
    """In a process that forks ranks itself: import what the fork server would preload
    (:data:`_PRELOAD`, then ``extra``) once here instead of in every rank, and install the
    collective recorder here, so that each rank inherits the wrapped collectives and finds its
    own ``recorder.install()`` done (a pass over every Megatron module per rank otherwise)."""
    for module in [*_PRELOAD, *extra]:
        importlib.import_module(module)
    from snippets.record import recorder

    recorder.install()


_MULTI_THREADED_SEEN = False


def _torch_single_threaded() -> bool:
    """False from the first launch that finds torch allowed more than one thread: the process
    may have run multi-threaded work since, so it no longer forks ranks itself."""
    global _MULTI_THREADED_SEEN
    import torch

    _MULTI_THREADED_SEEN = _MULTI_THREADED_SEEN or torch.get_num_threads() != 1
    return not _MULTI_THREADED_SEEN


def _repoint_log_handlers(kernel_streams: dict[int, str]) -> None:
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            name = kernel_streams.get(id(getattr(handler, "stream", None)))
            if name is not None:
                handler.stream = getattr(sys, name)


def _rank_main(rank, world_size, store_dir, payload, args, kwargs, conn, stack_file, timeout_s):
    """Body of one rank process: join the gloo world, run the function, send back the result."""
    if type(sys.stdout).__module__.startswith("ipykernel"):
        # Forked from a notebook kernel: its sys.stdout/stderr are ipykernel streams that flush
        # through kernel threads this process does not have. Plain file descriptors instead.
        kernel_streams = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        # A logging handler made before the fork kept the kernel's stream: importing
        # megatron.training (training.py:36 at core_v0.19.0) adds one on stdout at INFO. Whether
        # its lines reached the cell depended on when the kernel's threads ran; send them where
        # print goes.
        _repoint_log_handlers(kernel_streams)
    # SIGUSR1 dumps this rank's Python stack, so a hang can be reported with its location.
    stack = open(stack_file, "w")
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=False)
    try:
        from snippets.ranks import rank_env

        fn = cloudpickle.loads(payload)
        rank_env.init_rank(rank, world_size, os.path.join(store_dir, "store"), timeout_s)
        result = fn(*args, **kwargs)
        # No rank may leave while a peer still talks to it (gloo connects each new group's
        # mesh eagerly; a peer that exits early breaks a slower rank's connect).
        rank_env.finish_rank()
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        text = "".join(traceback.format_exception(exc))
        try:
            conn.send_bytes(pickle.dumps(("error", text)))
        except Exception:  # the parent may already be gone
            pass
    finally:
        conn.close()
        # Skip atexit/finalizers: gloo teardown can block when a peer has already died.
        os._exit(0)


_STARTING = threading.Lock()
"""One rank starts at a time in this process, even when several threads launch: filelock (which
the tokenizers' transformers / huggingface_hub bring in, see :data:`_PRELOAD`) refuses an
``os.fork`` while another thread of the process is in the middle of one (a ``RuntimeError``)."""


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    grid: Grid | dict | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` gloo ranks; return the results by rank.

    ``grid`` (a :class:`Grid` or a dict of its sizes) is validated first, so impossible sizes
    fail at once instead of inside Megatron on every rank. ``timeout`` bounds the whole launch.
    """
    if grid is not None:
        if isinstance(grid, dict):
            grid = Grid(world_size, **grid)
        if grid.world_size != world_size:
            raise ValueError(f"grid.world_size {grid.world_size} != world_size {world_size}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")

    ctx = _context()
    payload = cloudpickle.dumps(fn)
    store_dir = tempfile.mkdtemp(prefix="ranks-")
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=False)
            stack_file = os.path.join(store_dir, f"stack{rank}.txt")
            proc = ctx.Process(
                target=_rank_main,
                name=f"rank{rank}",
                args=(rank, world_size, store_dir, payload, args, kwargs, child_end, stack_file, timeout),
                # Not daemonic: dist_checkpointing's writers start processes of their own.
                # The finally below kills every rank that is still alive.
                daemon=False,
            )
            with _STARTING:
                proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        return _collect(procs, conns, store_dir, timeout)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        for conn in conns:
            conn.close()
        shutil.rmtree(store_dir, ignore_errors=True)


_GRACE_S = 2.0
"""After one rank fails, how long the others get to report their own errors first."""


def _collect(procs, conns, store_dir, timeout):
    world_size = len(procs)
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    waiting = {conns[r]: r for r in range(world_size)}
    dead = {procs[r].sentinel: r for r in range(world_size)}
    first_error_at = None
    order: list[int] = []  # ranks in the order their errors arrived
    while waiting:
        now = time.monotonic()
        limit = deadline if first_error_at is None else min(deadline, first_error_at + _GRACE_S)
        if now >= limit:
            break
        ready = mp.connection.wait(list(waiting) + list(dead), timeout=limit - now)
        for obj in ready:
            if obj in waiting:
                rank = waiting.pop(obj)
                dead.pop(procs[rank].sentinel, None)
                try:
                    status, value = pickle.loads(obj.recv_bytes())
                except EOFError:
                    status, value = "error", _death(procs[rank])
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
                    order.append(rank)
            elif obj in dead:
                rank = dead.pop(obj)
                conn = conns[rank]
                if conn in waiting and not conn.poll():
                    waiting.pop(conn)
                    errors[rank] = _death(procs[rank])
                    order.append(rank)
            if errors and first_error_at is None:
                first_error_at = time.monotonic()

    if errors:
        report, first = _failure_report(errors, order, sorted(waiting.values()), sorted(results), world_size)
        raise RankError(report, first, _last_line(errors[first]))
    if waiting:
        unfinished = sorted(waiting.values())
        stacks = _dump_stacks(procs, unfinished, store_dir)
        done = [r for r in unfinished if "finish_rank" in stacks[r]]
        stuck = [r for r in unfinished if r not in done] or unfinished
        lines = [f"ranks {stuck} did not finish within {timeout:g} s (killed); where each was:"]
        lines += [f"--- rank {rank} ---\n{stacks[rank]}" for rank in stuck]
        if done and done != stuck:
            lines.append(f"(ranks {done} had finished and were waiting for them)")
        raise RankError("\n".join(lines), stuck[0], f"did not finish within {timeout:g} s")
    return [results[r] for r in range(world_size)]


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
"""What gloo says on a rank whose collective lost a peer: a consequence, not the cause."""


def _failure_report(
    errors: dict[int, str], order: list[int], still_waiting: list[int], finished: list[int], world_size: int
) -> tuple[str, int]:
    """Put the rank that caused the failure up front, in full; ranks that failed only because a
    peer went away (gloo's "connection closed/reset by peer") get one line each. Returns the
    report and the rank it blames."""
    causes = [r for r in order if not any(p in errors[r] for p in _PEER_GONE)]
    first = causes[0] if causes else order[0]
    order = [first] + [r for r in order if r != first]
    if causes:
        head = f"rank {first} of {world_size} failed first: {_last_line(errors[first])}"
    else:
        head = f"ranks {order} of {world_size} failed in a collective whose peer had left"
    lines = [head, f"--- rank {first} ---", errors[first].rstrip()]
    others = order[1:]
    if others:
        lines.append(
            f"--- then {len(others)} more rank(s) failed, most likely because rank {first} stopped ---"
        )
        lines += [f"rank {r}: {_last_line(errors[r])}" for r in others]
    if finished and not causes:
        lines.append(
            f"ranks {finished} had already returned, so a collective was left "
            f"without them: do all ranks issue the same collectives?"
        )
    if still_waiting:
        lines.append(f"ranks {still_waiting} were still running; killed")
    return "\n".join(lines), first


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _death(proc) -> str:
    proc.join(timeout=1)
    code = proc.exitcode
    if code is not None and code < 0:
        return f"process died from signal {signal.Signals(-code).name} before sending a result"
    return f"process exited with code {code} before sending a result"


def _dump_stacks(procs, ranks: Sequence[int], store_dir: str) -> dict[int, str]:
    for rank in ranks:
        if procs[rank].is_alive():
            os.kill(procs[rank].pid, signal.SIGUSR1)
    time.sleep(0.3)
    stacks = {}
    for rank in ranks:
        path = os.path.join(store_dir, f"stack{rank}.txt")
        with open(path) as f:
            text = f.read().strip()
        stacks[rank] = _trim_stack(text) or "(no Python stack: stuck outside the interpreter)"
    return stacks


def _trim_stack(text: str) -> str:
    """Keep the frames a reader can act on: drop the launcher's own frames."""
    keep = [
        line
        for line in text.splitlines()
        if "multiprocessing" not in line
        and "snippets/ranks/launch.py" not in line
        and 'File "<string>"' not in line
    ]
    return "\n".join(keep)


def warm_up() -> None:
    """Pay the one-time imports now, so later launches are fast: start the fork server, or, in a
    process that forks its ranks itself, import what they need (no rank is started then)."""
    ctx = _context()
    if ctx.get_start_method() != "fork":
        run_ranks(_noop, 1)


def _noop():
    return None


__all__ = ["Grid", "RankError", "run_ranks", "warm_up", "DEFAULT_TIMEOUT_S"]
