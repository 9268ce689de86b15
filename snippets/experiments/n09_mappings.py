"""Note 09's experiment: every function of ``tensor_parallel/mappings.py``, forward and backward, at any size.

``run_every_mapping`` calls each of the 13 (:func:`mappings_by_name`) on this rank's ``[s, b, h]`` input in
the TP group, backward with an upstream gradient, and records every collective it issues. The
tables read only what was recorded: per function and direction the collective, its group and buffer
shapes, the function-level shapes (:func:`record_table`), which private helper issued it
(:func:`issuer_table`), and the "signature" from which the conjugate pairs (f and g, gather and
reduce-scatter, ...) are computed (:func:`signatures`, :func:`conjugate_pairs`). Note 09 runs it at
TP=2 on ``[4, 2, 6]`` and checks every value against a single-process reference; ``python -m
snippets.run mappings --dims qwen3-8b --tp 8`` shows the same calls on real activations.
"""

from __future__ import annotations

from fractions import Fraction
from math import prod

import torch

from snippets.record import recorder
from snippets.record.tables import Table


def mappings_by_name(m) -> dict:
    """How each function is called: ``m`` is ``megatron.core.tensor_parallel.mappings``, ``x`` this
    rank's input, ``tp`` the TP group. The gather along the sequence has a second variant whose
    backward only slices."""
    return {
        "copy_to_tensor_model_parallel_region (f)": lambda x, tp: m.copy_to_tensor_model_parallel_region(
            x, group=tp
        ),
        "reduce_from_tensor_model_parallel_region (g)": lambda x, tp: (
            m.reduce_from_tensor_model_parallel_region(x, group=tp)
        ),
        "scatter_to_tensor_model_parallel_region": lambda x, tp: m.scatter_to_tensor_model_parallel_region(
            x, group=tp
        ),
        "gather_from_tensor_model_parallel_region": lambda x, tp: m.gather_from_tensor_model_parallel_region(
            x, group=tp
        ),
        "scatter_to_sequence_parallel_region": lambda x, tp: m.scatter_to_sequence_parallel_region(
            x, group=tp
        ),
        "gather_from_sequence_parallel_region": lambda x, tp: m.gather_from_sequence_parallel_region(
            x, group=tp
        ),
        "gather_from_sequence_parallel_region [output_grad=False]": lambda x, tp: (
            m.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False, group=tp)
        ),
        "reduce_scatter_to_sequence_parallel_region": lambda x, tp: (
            m.reduce_scatter_to_sequence_parallel_region(x, group=tp)
        ),
        "all_gather_last_dim_from_tensor_parallel_region": lambda x, tp: (
            m.all_gather_last_dim_from_tensor_parallel_region(x, group=tp)
        ),
        "reduce_scatter_last_dim_to_tensor_parallel_region": lambda x, tp: (
            m.reduce_scatter_last_dim_to_tensor_parallel_region(x, group=tp)
        ),
        "all_to_all": lambda x, tp: m.all_to_all(tp, x),
        "all_to_all_sp2hp": lambda x, tp: m.all_to_all_sp2hp(x, group=tp),
        "all_to_all_hp2sp": lambda x, tp: m.all_to_all_hp2sp(x, group=tp),
    }


MAPPINGS = tuple(mappings_by_name(None))
"""The 13 calls by name, in the order they run (the lambdas only touch ``m`` when called)."""


def run_every_mapping(dims, tp_size, device="cpu", keep_tensors=True):
    """On every rank: each of :data:`MAPPINGS` once forward and once backward, recorded.

    ``x`` is ``[seq, micro_batch_size, hidden]`` holding ``0, 1, 2, ...`` plus ``100 * rank`` (the
    hundreds name the rank it came from); the upstream gradient differs by rank too. Returns per
    function the calls, the four function-level shapes, whether ``x`` or ``dy`` were overwritten,
    and with ``keep_tensors`` the tensors themselves (note 09 checks them against a reference).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import mappings

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    tp = parallel_state.get_tensor_model_parallel_group()
    rank = parallel_state.get_tensor_model_parallel_rank()
    s, b, h = dims.seq, dims.micro_batch_size, dims.hidden
    runs = {}
    for name, call in mappings_by_name(mappings).items():
        x = (torch.arange(float(s * b * h), device=device).reshape(s, b, h) + 100 * rank).requires_grad_()
        x_in = x.detach().clone()
        with recorder.record() as calls:
            y = call(x, tp)
            dy = torch.arange(float(y.numel()), device=device).reshape(y.shape) * (rank + 1)
            dy_in = dy.clone()
            y.backward(dy)
        runs[name] = dict(
            calls=calls,
            shapes=dict(x=list(x.shape), y=list(y.shape), dy=list(dy.shape), dx=list(x.grad.shape)),
            x_overwritten=not torch.equal(x.detach(), x_in),
            dy_overwritten=not torch.equal(dy, dy_in),
        )
        if keep_tensors:
            runs[name].update(x=x_in, y=y.detach().clone(), dy=dy_in, dx=x.grad.clone())
    return runs


def run(dims, par) -> dict:
    """On every rank (the runner): every mapping at ``dims`` in a TP group of ``par.tp``."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    return run_every_mapping(dims, par.tp, par.device, keep_tensors=False)


# ----------------------------------------------------------------------------- note 09's tables

IN_CONTEXT = {
    ("copy_to_tensor_model_parallel_region (f)", "backward"): "f 的反向：各 rank 对同一输入的梯度相加",
    ("all_gather_last_dim_from_tensor_parallel_region", "backward"): "梯度相加，按最后一维切给各 rank",
    ("reduce_scatter_last_dim_to_tensor_parallel_region", "forward"): "部分和相加，按最后一维切给各 rank",
}
"""Where a helper means something else in this function than ``recorder.MEANINGS`` says."""


def phases(run):
    """``(phase, function-level input shape, output shape, this direction's collectives)``."""
    sh = run["shapes"]
    return [
        ("forward", sh["x"], sh["y"], [c for c in run["calls"] if c.phase == "forward"]),
        ("backward", sh["dy"], sh["dx"], [c for c in run["calls"] if c.phase == "backward"]),
    ]


def record_rows(rank_runs):
    rows = []
    for name, run in rank_runs.items():
        for phase, a, b, calls in phases(run):
            tensor = f"{a} → {b}"
            if not calls:
                local = "原样传过" if a == b else "只留本 rank 的一块"
                rows.append([name, phase, "—", "—", "—", "—", tensor, f"不通信：{local}"])
            for c in calls:
                meaning = IN_CONTEXT.get((name, phase), recorder.MEANINGS.get(c.where, ""))
                rows.append(
                    [name, phase, c.api, f"{c.group} {list(c.ranks)}", c.before, c.after, tensor, meaning]
                )
    return rows


def record_table(rank_runs) -> Table:
    return Table(
        ["函数", "phase", "API", "group", "通信前", "通信后", "张量", "含义"], record_rows(rank_runs)
    )


def issuer(calls):
    return ", ".join(c.where.split("::")[-1] for c in calls) or "—"


def issuer_table(rank_runs) -> Table:
    return Table(
        ["函数", "正向", "反向"],
        [[name] + [issuer(calls) for *_, calls in phases(run)] for name, run in rank_runs.items()],
    )


def change(before, after):
    """How a shape changes, read as ``[token, hidden]`` (all leading dims are tokens)."""
    ratios = {
        "token": Fraction(prod(after[:-1]), prod(before[:-1])),
        "hidden": Fraction(after[-1], before[-1]),
    }
    parts = [f"{k} {'×' if v > 1 else '÷'}{max(v, 1 / v)}" for k, v in ratios.items() if v != 1]
    return "，".join(parts) or "形状不变"


def phase_signature(run, phase):
    ((_, a, b, calls),) = [p for p in phases(run) if p[0] == phase]
    apis = " + ".join(c.api for c in calls) or "不通信"
    return f"{apis}；{change(a, b)}"


def signatures(rank_runs) -> dict:
    return {
        name: (phase_signature(run, "forward"), phase_signature(run, "backward"))
        for name, run in rank_runs.items()
    }


def conjugate_pairs(sig) -> list:
    """A and B are conjugate when A's forward is B's backward and A's backward B's forward."""
    return [
        (a, b)
        for i, a in enumerate(sig)
        for b in list(sig)[i:]
        if sig[a][0] == sig[b][1] and sig[a][1] == sig[b][0]
    ]


def tables(results: list, dims, par) -> list:
    sig = signatures(results[0])
    return [
        f"每个 rank 跑了 {len(results[0])} 个调用；记录到的 collective 条数（每个 rank）: "
        f"{[sum(len(r['calls']) for r in rank_runs.values()) for rank_runs in results]}",
        record_table(results[0]),
        issuer_table(results[0]),
        f"每个 rank 的记录都和 rank 0 一样: {all(record_rows(r) == record_rows(results[0]) for r in results)}",
        Table(["函数", "正向签名", "反向签名"], [[name, f, b] for name, (f, b) in sig.items()]),
        Table(["A", "B（A 的共轭）"], conjugate_pairs(sig)),
    ]
