"""Checkpoint helpers (notes 01, 07, 21): reading a saved directory, coordinates, optimizer resharding.

Importing the package silences three notices that megatron-core 0.19.0's ``dist_checkpointing``
prints on every save or load and that say nothing about the run (a rank prints them to its stderr,
which would land in a note's cell):

* a synchronous save goes through ``async_save(..., async_strategy="mcore")``
  (``dist_checkpointing/strategies/torch.py``, ``TorchDistSaveShardedStrategy.save``), which logs
  once per process that MCore's own async saver is deprecated;
* ``load`` first reads the common (non-tensor) state with ``torch.distributed.checkpoint.load(...,
  no_dist=True)`` (``serialization.py::load_common_state_dict``), for which torch warns that it
  assumes a single process, and both loads call torch's entry point with the older argument order,
  for which torch warns too.

The filters are installed in the process that imports this package; ranks forked from it inherit
them, and a rank started by the fork server imports this package when it unpickles its function.
"""

import logging as _logging
import warnings as _warnings

for _message in (
    r"torch\.distributed is disabled, unavailable or uninitialized",
    r"The argument order of load has been changed",
):
    _warnings.filterwarnings("ignore", message=".*" + _message)

_logging.getLogger("megatron.core.dist_checkpointing.strategies.torch").addFilter(
    lambda record: not str(record.msg).startswith("MCore's async save is deprecated")
)
