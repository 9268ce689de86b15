"""Record every collective a block of code issues: API, group, shapes, forward or backward.

This is the roadmap's communication record (API / group / shape before / shape after / meaning),
produced by running the code instead of reading it.

How it sees Megatron's calls: :func:`install` wraps the ``torch.distributed`` collectives, and
then also rebinds every module-level copy of them. Megatron copies some at import time
(``mappings.py`` and ``layers.py`` keep their own ``all_gather_into_tensor`` /
``reduce_scatter_tensor``), so wrapping ``torch.distributed`` alone would miss exactly the calls
tensor parallelism makes. Only the outermost call is recorded (``batch_isend_irecv`` calls
``isend`` inside; that is one record, not three).

The phase says what step of training issued the collective (:func:`phase_of`): "backward" while
autograd runs a backward node; otherwise the Megatron code on the stack decides: "grad sync"
(``finalize_model_grads`` after the backward), "optimizer step" (``megatron/core/optimizer``),
"refit" (``megatron/core/resharding``), "checkpoint" (``dist_checkpointing``, the training
checkpointing), "setup" (process groups being made, datasets being built); anything else is "forward".
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from snippets.ranks.groups import megatron_groups
from snippets.record.tables import Table

_APIS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "broadcast",
    "all_to_all_single",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "reduce",
    "gather",
    "scatter",
    "barrier",
)


@dataclass
class Collective:
    """One recorded call."""

    api: str
    group: str  # "tp", "dp", "pp", "cp", "ep", ... or "world" / "ranks [..]"
    ranks: tuple  # the group's global ranks
    before: str  # shape(s) going in
    after: str  # shape(s) coming out
    phase: str  # forward, backward, grad sync, optimizer step, refit, checkpoint, setup (phase_of)
    where: str  # the Megatron function that issued it, "file.py::func"
    extra: dict = field(default_factory=dict)  # peer rank, split sizes, reduce op, ...


_state = threading.local()
_originals: dict[str, object] = {}
_wrappers: dict[str, object] = {}
_active: list[list[Collective]] = []


def install() -> None:
    """Wrap the collectives once, and rebind copies already imported into Megatron modules."""
    if not _wrappers:
        for name in _APIS:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            _originals[name] = original
            _wrappers[name] = _wrap(name, original)
            setattr(c10d, name, _wrappers[name])
            if hasattr(dist, name):
                setattr(dist, name, _wrappers[name])
    _rebind_copies()


_rebound: dict[str, int] = {}
"""Megatron modules whose copies are already rebound: name -> ``id`` of the module object."""
_modules_seen = 0
"""``len(sys.modules)`` after the last full pass; 0 forces the next one.

Both are inherited by a forked rank. The process that forks ranks installs the recorder first
(:func:`snippets.ranks.launch.prepare_to_fork`), so a rank's own :func:`install` finds nothing new
and skips the pass. Even reading every module's namespace (``vars(module).items()`` takes a
reference to each value) writes to pages the rank shares with its parent; the kernel then copies
them, ~3,700 pages and ~13 ms per rank here, again at every :func:`record` block."""


def _rebind_copies() -> None:
    global _modules_seen
    if len(sys.modules) == _modules_seen:
        return  # nothing imported since the last pass (imports only add modules)
    by_id = {id(orig): _wrappers[name] for name, orig in _originals.items()}
    complete = True
    for mod_name, module in list(sys.modules.items()):
        if not mod_name.startswith("megatron") or module is None or _rebound.get(mod_name) == id(module):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in by_id and callable(value):
                setattr(module, attr, by_id[id(value)])
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            complete = False  # still being imported: more names may follow, look again next time
        else:
            _rebound[mod_name] = id(module)
    _modules_seen = len(sys.modules) if complete else 0


@contextlib.contextmanager
def record():
    """Collect every collective issued inside the block (on this rank) into a list."""
    install()
    calls: list[Collective] = []
    _active.append(calls)
    try:
        yield calls
    finally:
        _active.remove(calls)


def _wrap(name, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        depth = getattr(_state, "depth", 0)
        if depth or not _active:
            return original(*args, **kwargs)
        _state.depth = depth + 1
        try:
            before = _describe_inputs(name, args, kwargs)
            result = original(*args, **kwargs)
            call = _make_record(name, args, kwargs, before)
            for calls in _active:
                calls.append(call)
            return result
        finally:
            _state.depth = depth

    return wrapper


# ------------------------------------------------------------------ shapes


def _shape(t) -> str:
    if isinstance(t, torch.Tensor):
        return "[" + ", ".join(str(d) for d in t.shape) + "]"
    if isinstance(t, (list, tuple)):
        if t and all(isinstance(x, torch.Tensor) and x.shape == t[0].shape for x in t):
            return f"{len(t)} × {_shape(t[0])}"
        return "(" + ", ".join(_shape(x) for x in t) + ")"
    return "-"


def _arg(args, kwargs, index, *names):
    for key in names:
        if key in kwargs:
            return kwargs[key]
    return args[index] if len(args) > index else None


# For each API: (input argument, output argument) as (position, keyword names).
_IN_OUT = {
    "all_reduce": ((0, "tensor"), (0, "tensor")),
    "broadcast": ((0, "tensor"), (0, "tensor")),
    "reduce": ((0, "tensor"), (0, "tensor")),
    "send": ((0, "tensor"), (0, "tensor")),
    "isend": ((0, "tensor"), (0, "tensor")),
    "recv": ((0, "tensor"), (0, "tensor")),
    "irecv": ((0, "tensor"), (0, "tensor")),
    "all_gather": ((1, "tensor"), (0, "tensor_list")),
    "all_gather_into_tensor": ((1, "input_tensor"), (0, "output_tensor")),
    "_all_gather_base": ((1, "input_tensor"), (0, "output_tensor")),
    "all_gather_single": ((1, "input_tensor"), (0, "output_tensor")),
    "reduce_scatter": ((1, "input_list"), (0, "output")),
    "reduce_scatter_tensor": ((1, "input"), (0, "output")),
    "_reduce_scatter_base": ((1, "input"), (0, "output")),
    "reduce_scatter_single": ((1, "input"), (0, "output")),
    "all_to_all_single": ((1, "input"), (0, "output")),
    "all_to_all": ((1, "input_tensor_list"), (0, "output_tensor_list")),
    "gather": ((0, "tensor"), (1, "gather_list")),
    "scatter": ((1, "scatter_list"), (0, "tensor")),
}


def _describe_inputs(name, args, kwargs) -> str:
    if name == "batch_isend_irecv":
        ops = _arg(args, kwargs, 0, "p2p_op_list") or []
        return "; ".join(f"{op.op.__name__}{_shape(op.tensor)}" for op in ops)
    if name not in _IN_OUT:
        return "-"
    (i, key), _ = _IN_OUT[name]
    return _shape(_arg(args, kwargs, i, key))


def _make_record(name, args, kwargs, before) -> Collective:
    extra = {}
    if name == "batch_isend_irecv":
        ops = _arg(args, kwargs, 0, "p2p_op_list") or []
        group = ops[0].group if ops else None
        after = before
        extra["ops"] = [(op.op.__name__, op.peer) for op in ops]
    else:
        group = kwargs.get("group")
        if group is None:
            group = _positional_group(name, args)
        after = "-"
        if name in _IN_OUT:
            _, (o, key) = _IN_OUT[name]
            after = _shape(_arg(args, kwargs, o, key))
        for key, pos in (("dst", 1), ("src", 1)):
            if name in ("send", "isend", "recv", "irecv", "broadcast", "reduce"):
                peer = _arg(args, kwargs, pos, key)
                if peer is not None:
                    extra["peer"] = peer
                    break
        for key, pos in (("output_split_sizes", 2), ("input_split_sizes", 3)):
            if name == "all_to_all_single":
                sizes = _arg(args, kwargs, pos, key)
                if sizes is not None:
                    extra[key] = [int(s) for s in sizes]
    group_name, ranks = group_label(group)
    return Collective(
        api=name,
        group=group_name,
        ranks=ranks,
        before=before,
        after=after,
        phase=phase_of(),
        where=_megatron_caller(),
        extra=extra,
    )


_GROUP_POSITION = {
    "all_reduce": 2,
    "broadcast": 2,
    "reduce": 3,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "_all_gather_base": 2,
    "all_gather_single": 2,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "_reduce_scatter_base": 3,
    "reduce_scatter_single": 3,
    "all_to_all_single": 4,
    "all_to_all": 2,
    "send": 2,
    "recv": 2,
    "isend": 2,
    "irecv": 2,
    "barrier": 1,
    "gather": 3,
    "scatter": 3,
}


def _positional_group(name, args):
    pos = _GROUP_POSITION.get(name)
    return args[pos] if pos is not None and len(args) > pos else None


# ------------------------------------------------------------------ groups by name


def group_label(group) -> tuple[str, tuple]:
    """A readable name for a process group: Megatron's kind if it is one, else its ranks."""
    if group is None or group is dist.GroupMember.WORLD:
        return "world", tuple(range(dist.get_world_size()))
    ranks = tuple(dist.get_process_group_ranks(group))
    for name, candidate in megatron_groups():
        if candidate is group:
            return name, ranks
    return f"ranks {list(ranks)}", ranks


PHASES = (
    # (a piece of a Megatron file's path or a function name on the stack, the phase); innermost wins
    ("distributed/finalize_model_grads.py", "grad sync"),
    ("megatron/core/optimizer/", "optimizer step"),
    ("megatron/core/resharding/", "refit"),
    ("megatron/core/dist_checkpointing/", "checkpoint"),
    ("megatron/training/checkpointing.py", "checkpoint"),
    ("megatron/core/parallel_state.py", "setup"),
    ("megatron/core/datasets/", "setup"),  # the builder's barriers while rank 0 writes the index caches
    ("setup_embeddings_and_output_layer", "setup"),  # a model under construction: tied embeddings, PP > 1
    # A pipeline schedule sends and receives outside autograd: the P2PCommunicator method says what
    # moves (pipeline_parallel/p2p_communication.py:424-645 at core_v0.19.0). Activations are the
    # forward's, gradients the backward's; 1F1B's steady state does one of each in one batch.
    ("p2p_communication.py::recv_forward", "forward"),
    ("p2p_communication.py::send_forward", "forward"),
    ("p2p_communication.py::send_forward_recv_forward", "forward"),
    ("p2p_communication.py::recv_backward", "backward"),
    ("p2p_communication.py::send_backward", "backward"),
    ("p2p_communication.py::send_backward_recv_backward", "backward"),
    ("p2p_communication.py::send_forward_recv_backward", "forward + backward"),
    ("p2p_communication.py::send_backward_recv_forward", "forward + backward"),
    ("p2p_communication.py::send_forward_backward_recv_forward_backward", "forward + backward"),
)
"""What step of training a collective belongs to, by the Megatron code that issued it. A piece
``file.py::function`` matches that function of that file only."""


def _matches(piece: str, path: str, name: str) -> bool:
    if "::" in piece:
        file, function = piece.split("::")
        return path.endswith("/" + file) and name == function
    return piece in path or piece == name


OPTIMIZER_CHECKPOINT_ENTRIES = (
    "sharded_state_dict",
    "load_state_dict",
    "save_parameter_state",
    "load_parameter_state",
)
"""The optimizer's own checkpoint entry points. What the optimizer's code issues under one of them
(``fully_reshardable``'s all-gathers while saving, ``dp_zero_gather_scatter``'s scatter while
loading, the legacy format's gloo gather and scatter of the distributed optimizer's state) is part
of a checkpoint, not of an optimizer step."""


def phase_of() -> str:
    """The phase of a collective being issued now: "backward" inside autograd's backward, else the
    innermost frame matching :data:`PHASES`, else "forward". An "optimizer step" becomes
    "checkpoint" when an enclosing optimizer frame is one of :data:`OPTIMIZER_CHECKPOINT_ENTRIES`."""
    if torch._C._current_autograd_node() is not None:
        return "backward"
    frame, found = sys._getframe(1), None
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if found is None:
            name = frame.f_code.co_name
            found = next((phase for piece, phase in PHASES if _matches(piece, path, name)), None)
            if found is not None and found != "optimizer step":
                return found
        if (
            found == "optimizer step"
            and "megatron/core/optimizer/" in path
            and frame.f_code.co_name in OPTIMIZER_CHECKPOINT_ENTRIES
        ):
            return "checkpoint"
        frame = frame.f_back
    return found or "forward"


def _megatron_caller() -> str:
    """``file.py::function`` of the innermost Megatron frame on the stack, else the caller."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}megatron{os.sep}" in path:
            rel = path.split(f"{os.sep}megatron{os.sep}core{os.sep}")[-1]
            return f"{rel}::{frame.f_code.co_name}"
        if fallback is None and "torch" not in path and __file__ != path:
            fallback = frame.f_code.co_name
        frame = frame.f_back
    return fallback or "?"


# ------------------------------------------------------------------ the table

MEANINGS = {
    "tensor_parallel/mappings.py::_reduce": "g：把各 TP rank 的部分和相加（all-reduce）",
    "tensor_parallel/mappings.py::_gather_along_last_dim": "沿最后一维拼回完整的输出",
    "tensor_parallel/mappings.py::_gather_along_first_dim": "沿第一维（sequence）拼回完整的激活",
    "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim": "部分和相加，并按 sequence 维切给各 TP rank",
    # _AllToAll.forward is the only `forward` in mappings.py that calls torch.distributed itself
    # (its backward calls _AllToAll.apply, so backward records land here too).
    "tensor_parallel/mappings.py::forward": (
        "all-to-all：第 j 块发给 rank j，收齐各 rank 发给自己的块（反向对调两张 split 表）"
    ),
}


def communication_table(calls, meanings: dict | None = None, ranks: bool = True) -> Table:
    """The roadmap's communication record as a table: one row per recorded collective."""
    lookup = {**MEANINGS, **(meanings or {})}
    headers = ["#", "phase", "API", "group", "shape before", "shape after", "issued by", "meaning"]
    rows = []
    for i, c in enumerate(calls, 1):
        group = f"{c.group} {list(c.ranks)}" if ranks else c.group
        meaning = lookup.get(c.where, lookup.get(c.api, ""))
        rows.append([i, c.phase, c.api, group, c.before, c.after, c.where, meaning])
    return Table(headers, rows)
