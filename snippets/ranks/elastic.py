"""Start N ranks of ``python -m <module>`` on this host with torch's elastic launcher, in-process.

This is what ``torchrun --standalone --nproc-per-node N -m <module>`` does -- an elastic agent, a
c10d rendezvous on a free local port, one process per rank with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` ... set -- called as a function
(``torch.distributed.launcher.api.elastic_launch``), so ``python -m snippets.run --nproc-per-node N``
needs no torchrun and reports a failed rank in one line instead of torchrun's traceback.

Given ``entry`` (the module's own ``main``), the ranks are forked from this process rather than
started as fresh interpreters, when that is safe: this process pinned torch to one thread before
importing it (``snippets.fork_ranks_from_this_process``) and imported what the ranks need
(``snippets.ranks.launch._PRELOAD``), so each rank starts in ~0.1 s instead of paying ~4-5 s of
imports. It is the agent's ``start_method="fork"`` for a function entrypoint: the same agent,
rendezvous and per-rank environment as the spawned ``python -m`` ranks.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import traceback
import uuid


def launch(nproc: int, module: str, args: list[str], refused: int = 2, entry=None, preload=()) -> int:
    """Run ``python -m module *args`` as ``nproc`` ranks and wait for them; 0 when all succeed.

    ``entry(args) -> status`` is the module's main: when given, and forking is safe here, the
    ranks are forked and call it (``preload``: more modules to import once, before the fork).

    The ranks' output goes to this process's stdout and stderr. When every rank exits with status
    ``refused`` (each refused the job and one of them said why), so does this; when a rank fails
    otherwise, its error is already on stderr and this adds one line naming it, and returns 1.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_agent_logs()
    _name_rendezvous_methods_cheaply()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets: the ranks share the cores
    logs = tempfile.mkdtemp(prefix=f"{module}-")  # the agent's per-rank directories (error files)
    fork = entry is not None and _may_fork(preload)
    config = LaunchConfig(
        start_method="fork" if fork else "spawn",
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        logs_specs=DefaultLogsSpecs(log_dir=logs),
    )
    try:
        if fork:
            sys.stdout.flush()  # nothing buffered here may be written again by every rank
            sys.stderr.flush()
            elastic_launch(config, entrypoint=_forked_rank)(entry, list(args))
        else:
            elastic_launch(config, entrypoint=sys.executable)("-m", module, *args)
    except ChildFailedError as exc:
        if {failure.exitcode for failure in exc.failures.values()} == {refused}:
            return refused
        rank, failure = exc.get_first_failure()
        why = (
            f"killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exit status {failure.exitcode}"
        )
        print(
            f"{module}: rank {rank} of {nproc} failed ({why}); its error is above",
            file=sys.stderr,
            flush=True,
        )
        return 1
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return 0


def _may_fork(preload) -> bool:
    """Whether ranks may be forked from this process: see the module docstring."""
    import snippets
    from snippets.ranks import launch as ranks_launch

    if not (snippets.FORKS_RANKS and ranks_launch._torch_single_threaded()):
        return False
    ranks_launch.prepare_to_fork(preload)
    return True


def _forked_rank(entry, args: list[str]) -> None:
    """One forked rank: the module's main on ``args``; its status becomes the rank's exit status
    (``SystemExit`` passes the agent's wrapper, and the forked process exits without tearing the
    interpreter down). An exception is printed here, as a spawned interpreter would print it:
    torch's process wrapper would only keep it in an error file."""
    try:
        status = entry(args)
    except Exception:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if status:
        raise SystemExit(status)


def _quiet_agent_logs() -> None:
    """The agent logs every rank it stops and every failure (WARNING / ERROR, with PIDs and temp
    paths), and torch's process wrapper each rank it terminates after one failed; :func:`launch`
    says what failed in one line instead."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(
            ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
        ):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.CRITICAL)  # may not exist yet


def _name_rendezvous_methods_cheaply() -> None:
    """torch's c10d rendezvous names the method of each event it records with ``inspect.stack()``,
    which reads the source file of every frame on the stack: ~0.7 s of CPU per launch in a process
    that imported Megatron. The same name, read from the frame itself (only the event's label)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # a stack shallower than depth, as upstream answers it
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name
