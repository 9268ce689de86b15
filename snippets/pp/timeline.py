"""What a pipeline schedule did on each rank: recorded from a real run, put on a logical clock, drawn.

Recording (inside a rank): :func:`record_schedule` wraps Megatron's ``schedules.forward_step`` and
``schedules.backward_step`` and every public ``P2PCommunicator`` method, and lists, in the order
the rank executed them, one :class:`Op` per call. A forward knows its micro-batch and model chunk
from the keyword arguments the schedule passes (``current_microbatch``, ``vp_stage``); a backward
does not get them, so it is matched to the forward whose output it back-propagates (the same
object is handed back). A p2p op carries the collectives ``snippets.record.recorder`` saw inside it.

Timing (in the notebook): wall-clock time on a shared 2-core CPU says nothing about a GPU pipeline
and changes from run to run, so :func:`logical_schedule` replays each rank's recorded order on a
logical clock instead: a forward takes ``forward`` units, a backward ``backward`` units, and an op
starts as soon as its rank is free *and* its input exists -- the forward of the same micro-batch
on the previous (virtual) stage, or the backward of it on the next one. The idle share of that
timeline is the pipeline bubble (:func:`bubble_fraction`). :mod:`snippets.pp.pictures` draws it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

P2P_METHODS = (
    "recv_forward",
    "recv_backward",
    "send_forward",
    "send_backward",
    "send_forward_recv_backward",
    "send_backward_recv_forward",
    "send_forward_recv_forward",
    "send_backward_recv_backward",
    "send_forward_backward_recv_forward_backward",
)


@dataclass
class Op:
    """One step a rank executed, in order."""

    kind: str  # "F", "B", or a P2PCommunicator method name
    microbatch: int | None = None  # F / B: which micro-batch
    chunk: int | None = None  # F / B: which model chunk on this rank (virtual stage)
    comms: list = field(default_factory=list)  # p2p: (api, group, shapes, [(op, peer)]) recorded

    @property
    def compute(self) -> bool:
        return self.kind in ("F", "B")


@contextlib.contextmanager
def record_schedule():
    """Record, on this rank, every forward, backward and p2p call the schedule makes."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    from snippets.record import recorder

    ops: list[Op] = []
    outputs: list = []  # (forward output object, Op): a backward is matched by identity
    real_forward, real_backward = schedules.forward_step, schedules.backward_step

    def forward_step(*args, **kwargs):
        op = Op("F", kwargs.get("current_microbatch"), kwargs.get("vp_stage") or 0)
        ops.append(op)
        result = real_forward(*args, **kwargs)
        outputs.append((result[0], op))
        return result

    def backward_step(input_tensor, output_tensor, *args, **kwargs):
        i = next(i for i, (out, _) in enumerate(outputs) if out is output_tensor)
        _, forward = outputs.pop(i)
        ops.append(Op("B", forward.microbatch, forward.chunk))
        return real_backward(input_tensor, output_tensor, *args, **kwargs)

    def p2p(name, method):
        def wrapper(self, *args, **kwargs):
            start = len(calls)
            result = method(self, *args, **kwargs)
            ops.append(
                Op(
                    name,
                    comms=[
                        (c.api, c.group, c.before, c.extra.get("ops") or [(c.api, c.extra.get("peer"))])
                        for c in calls[start:]
                    ],
                )
            )
            return result

        return wrapper

    originals = {name: P2PCommunicator.__dict__[name] for name in P2P_METHODS}
    with recorder.record() as calls:
        schedules.forward_step, schedules.backward_step = forward_step, backward_step
        for name, method in originals.items():
            setattr(P2PCommunicator, name, p2p(name, method))
        try:
            yield ops
        finally:
            schedules.forward_step, schedules.backward_step = real_forward, real_backward
            for name, method in originals.items():
                setattr(P2PCommunicator, name, method)


# ------------------------------------------------------------------ reading a recorded order


def compute_ops(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op.compute]


def label(op: Op, chunks: int = 1) -> str:
    """``F3`` / ``B3``; with model chunks ``F3.1`` = micro-batch 3 on chunk 1."""
    return f"{op.kind}{op.microbatch}" + (f".{op.chunk}" if chunks > 1 else "")


_STEADY_BETWEEN = {"send_forward_recv_backward"}
"""The only p2p call a steady iteration makes between its forward and its backward (1F1B); the
interleaved steady loop makes none there. A warm-up forward is followed by ``send_forward`` or
``send_forward_recv_forward`` instead, even when a cool-down backward comes next."""


def phases(ops: list[Op]) -> tuple[int, int, int]:
    """(warm-up, steady, cool-down) read from a recorded order, counted the way the schedules'
    three loops count them: a steady iteration is a forward, then (at most) the steady p2p call,
    then a backward. The other forwards are warm-up, the other backwards cool-down."""
    steady, forwards, backwards = 0, 0, 0
    for i, op in enumerate(ops):
        if not op.compute:
            continue
        forwards += op.kind == "F"
        backwards += op.kind == "B"
        if op.kind == "F":
            between = []
            for nxt in ops[i + 1 :]:
                if nxt.compute:
                    if nxt.kind == "B" and set(between) <= _STEADY_BETWEEN:
                        steady += 1
                    break
                between.append(nxt.kind)
    return forwards - steady, steady, backwards - steady


# ------------------------------------------------------------------ the logical clock


def logical_schedule(
    per_rank: list[list[Op]], chunks: int = 1, forward: int = 1, backward: int = 2
) -> list[list[tuple[Op, int, int]]]:
    """Replay each rank's recorded compute order on a logical clock: ``[(op, start, end), ...]``
    per rank. Raises if the recorded orders cannot all run (a rank waits for an op that, on its
    owner's rank, comes after something that waits for it)."""
    pp = len(per_rank)
    last = pp * chunks - 1
    orders = [compute_ops(ops) for ops in per_rank]
    done: dict[tuple[str, int, int], int] = {}  # (kind, microbatch, global stage) -> end time
    clock = [0] * pp
    pos = [0] * pp
    out: list[list[tuple[Op, int, int]]] = [[] for _ in range(pp)]
    while any(pos[r] < len(orders[r]) for r in range(pp)):
        progressed = False
        for rank in range(pp):
            while pos[rank] < len(orders[rank]):
                op = orders[rank][pos[rank]]
                stage = op.chunk * pp + rank  # the global (virtual) stage this op runs
                if op.kind == "F":
                    needs = ("F", op.microbatch, stage - 1) if stage > 0 else None
                else:
                    needs = ("B", op.microbatch, stage + 1) if stage < last else None
                if needs is not None and needs not in done:
                    break
                start = max(clock[rank], done.get(needs, 0) if needs else 0)
                end = start + (forward if op.kind == "F" else backward)
                done[(op.kind, op.microbatch, stage)] = end
                out[rank].append((op, start, end))
                clock[rank] = end
                pos[rank] += 1
                progressed = True
        if not progressed:
            stuck = {r: label(orders[r][pos[r]], chunks) for r in range(pp) if pos[r] < len(orders[r])}
            raise RuntimeError(f"recorded orders deadlock; next op per rank: {stuck}")
    return out


def makespan(timeline) -> int:
    return max(end for row in timeline for _, _, end in row)


def bubble_fraction(timeline) -> float:
    """Idle share of all ranks' time from 0 to the end of the last op."""
    total = makespan(timeline) * len(timeline)
    busy = sum(end - start for row in timeline for _, start, end in row)
    return 1 - busy / total


# ------------------------------------------------------------------ the p2p record

P2P_MEANINGS = {
    "send_forward": "把本 stage 的输出激活发给下一 stage",
    "recv_forward": "收上一 stage 的输出激活，作本 stage 的输入",
    "send_backward": "把对本 stage 输入的梯度发回上一 stage",
    "recv_backward": "收下一 stage 发回的、对本 stage 输出的梯度",
    "send_forward_recv_backward": "发出激活，同时收这个 stage 下一个要做 backward 的梯度",
    "send_backward_recv_forward": "发回梯度，同时收下一个 micro-batch 的激活",
    "send_forward_recv_forward": "interleaved：发出激活，同时收下一个 forward 的输入",
    "send_backward_recv_backward": "interleaved：发回梯度，同时收下一个 backward 的梯度",
    "send_forward_backward_recv_forward_backward": "interleaved 稳态：两个方向各发一个、各收一个",
}


def p2p_rows(ops: list[Op], rank: int, chunks: int = 1) -> list[list]:
    """One row per collective a p2p call issued: the roadmap's record (API, group, shape, peers),
    which ``P2PCommunicator`` method issued it and after which compute step. ``send_*`` on the
    last stage and ``recv_*`` on the first are no-ops and issue nothing, so they get no row."""
    rows, after = [], "-"
    for op in ops:
        if op.compute:
            after = label(op, chunks)
            continue
        for api, group, shapes, pairs in op.comms:
            peers = ", ".join(f"{name}{'→' if 'send' in name else '←'}{peer}" for name, peer in pairs)
            rows.append([rank, after, op.kind, api, group, peers, shapes, P2P_MEANINGS[op.kind]])
    return rows
