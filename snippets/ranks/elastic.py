"""Start N ranks of ``python -m <module>`` on this host with torch's elastic launcher, in-process.

This is what ``torchrun --standalone --nproc-per-node N -m <module>`` does -- an elastic agent, a
c10d rendezvous on a free local port, one process per rank with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` ... set -- called as a function
(``torch.distributed.launcher.api.elastic_launch``), so ``python -m snippets.run --nproc-per-node N``
needs no torchrun and reports a failed rank in one line instead of torchrun's traceback.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid


def launch(nproc: int, module: str, args: list[str], refused: int = 2) -> int:
    """Run ``python -m module *args`` as ``nproc`` ranks and wait for them; 0 when all succeed.

    The ranks' output goes to this process's stdout and stderr. When every rank exits with status
    ``refused`` (each refused the job and one of them said why), so does this; when a rank fails
    otherwise, its error is already on stderr and this adds one line naming it, and returns 1.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_agent_logs()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets: the ranks share the cores
    logs = tempfile.mkdtemp(prefix=f"{module}-")  # the agent's per-rank directories (error files)
    config = LaunchConfig(
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


def _quiet_agent_logs() -> None:
    """The agent logs every rank it stops and every failure (WARNING / ERROR, with PIDs and temp
    paths); :func:`launch` says what failed in one line instead."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
