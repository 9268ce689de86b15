"""Note 28's hang and NaN experiments: what CPU gloo ranks do when collectives do not line up, and
what Megatron's rerun state machine decides when a loss turns NaN or spikes.

Everything here ends by itself within a bound set below, never a measured time:

* :func:`hang_scenarios` (every rank of a 2-rank launch) runs four cases, each on a fresh gloo group
  whose collective timeout is :data:`COLLECTIVE_TIMEOUT_S`: rank 1 skips one ``all_reduce`` of
  three; the two ranks issue ``all_reduce`` and ``broadcast`` in opposite orders; then both again
  with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch wraps each new group in its ``ProcessGroupWrapper``,
  which compares the collectives of all ranks before running one). After the skip case each rank
  dumps torch's flight recorder (``torch._C._distributed_c10d._dump_fr_trace``), which gloo fills too.
* :func:`launcher_report` launches :func:`stuck` with a launch bound (:data:`STUCK_LAUNCH_S`) shorter
  than its group's timeout, so the launcher, not gloo, ends it and reports where each rank stood.
* :func:`nan_cases` (every rank) drives the real ``RerunStateMachine`` through a few tiny steps,
  calling its ``validate_result`` on each step's loss as ``pretrain_gpt.py``'s ``loss_func`` does,
  with a NaN put into one rank's input at one step; and an ``is_unexpectedly_large`` spike case.

:func:`normalize` takes addresses, ports, PIDs, thread ids, host names, paths and measured durations
out of the messages, so a note's stored outputs repeat.
"""

from __future__ import annotations

import logging
import os
import re
import time
from datetime import timedelta

from snippets.record.tables import Table

COLLECTIVE_TIMEOUT_S = 2.0
"""The timeout of every gloo group the hang cases make: a collective that has no partner raises
after this long."""

HANG_LAUNCH_S = 12.0
"""Bound of the launch that runs :func:`hang_scenarios` (its four cases wait at most
``3 * COLLECTIVE_TIMEOUT_S`` in all, plus the start of the ranks)."""

STUCK_GROUP_TIMEOUT_S = 60.0
"""The group timeout in :func:`stuck`: longer than the launch bound, so the launcher ends it."""

STUCK_LAUNCH_S = 2.0
"""Bound of the launch of :func:`stuck`: the launcher dumps each unfinished rank's stack then kills it."""

BOUNDS_S = (COLLECTIVE_TIMEOUT_S, STUCK_LAUNCH_S)
"""Durations the notes set, kept by :func:`normalize` (every other duration is measured)."""

SKIP_RANK, SKIP_STEP, STEPS = 1, 1, 3
"""In the skip case, rank ``SKIP_RANK`` leaves out the ``all_reduce`` of step ``SKIP_STEP`` of ``STEPS``."""


# ---- normalizing messages ------------------------------------------------------------------------

_ADDRESS = re.compile(r"\[?(?:\d{1,3}\.){3}\d{1,3}\]?(?::\d+)?|\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d+)?")
_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")
_PID = re.compile(r"\b(pid|PID|process|Process)([ =:]+)\d+")
_QUOTED_PATH = re.compile(r'"[^"\n]*/([^"/\n]+)"')  # a traceback's File "...": the path may hold spaces
_PATH = re.compile(r"(?:[\w.\-~]*/)+([\w.\-]+\.(?:py|cc|cpp|h|hpp|txt|pkl))")
_DIR = re.compile(r"(?<![\w.])/(?:[\w.\-]+/)*[\w.\-]+/?")
_DURATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(ms|s|sec|seconds)\b")
_OUR_FRAME = re.compile(r'(File "(?:n28_hang|launch|rank_env)\.py"), line \d+')
_GLOG = re.compile(r"(?:\[rank\d+\]:)?\[([EWIF])\d{4} \d\d:\d\d:\d\d\.\d+ ([\w.]+):\d+\] ?")


def normalize(text: str, bounds_s=BOUNDS_S, host: str | None = None) -> str:
    """``text`` with what changes from run to run replaced by a placeholder: IP addresses and
    ports (``<addr>``), hex addresses and thread ids (``<hex>``), PIDs (``<pid>``), the host name
    (``<host>``), directories (a path keeps only its file name), durations other than the
    ``bounds_s`` the notes set (``<T>``), and the line numbers of this module's and the launcher's
    own frames (they move when those files are edited)."""
    host = os.uname()[1] if host is None else host
    if host:
        text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
    text = _ADDRESS.sub("<addr>", text)
    text = _HEX.sub("<hex>", text)
    text = _PID.sub(lambda m: f"{m.group(1)}{m.group(2)}<pid>", text)
    text = _QUOTED_PATH.sub(r'"\1"', text)
    text = _PATH.sub(lambda m: m.group(1), text)
    text = _DIR.sub("<dir>", text)

    def duration(m):
        value, unit = float(m.group(1)), m.group(2)
        seconds = value / 1000 if unit == "ms" else value
        return m.group(0) if any(abs(seconds - b) < 1e-9 for b in bounds_s) else "<T>"

    text = _DURATION.sub(duration, text)
    text = _GLOG.sub(lambda m: f"[{m.group(1)} {m.group(2)}] ", text)
    return _OUR_FRAME.sub(r"\1", text)


def first_line(text: str, limit: int = 160) -> str:
    """The first line of a message, normalized and cut to ``limit`` characters, for a table cell:
    the placeholders' angle brackets become ‹ › (a rendered markdown table reads ``<host>`` as an
    HTML tag and drops it)."""
    line = normalize(str(text)).strip().splitlines()[0] if str(text).strip() else ""
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return line.replace("<", "‹").replace(">", "›")


# ---- the hang cases (run on every rank of a 2-rank launch) ---------------------------------------


_GROUPS_MADE = [0]


def _group(timeout_s: float):
    """A fresh 2-rank gloo group with ``timeout_s``, made once both ranks are here.

    After the skip case rank 1 is done while rank 0 still waits out its timeout; making a group
    then waits on the store only for the new group's timeout (it fails under torchrun). So the
    ranks first meet on the default store (its own, long timeout) -- not with a collective, which
    would land in the flight recorder the note reads."""
    import torch.distributed as dist

    _GROUPS_MADE[0] += 1
    store, key = dist.distributed_c10d._get_default_store(), f"n28_hang/group{_GROUPS_MADE[0]}"
    if store.add(key, 1) == dist.get_world_size():
        store.set(f"{key}/go", "1")
    store.wait([f"{key}/go"])
    return dist.new_group(ranks=[0, 1], timeout=timedelta(seconds=timeout_s), backend="gloo")


def skip_one(group) -> list[tuple]:
    """Three steps of ``all_reduce`` of ``10 * step + rank``; rank ``SKIP_RANK`` skips step
    ``SKIP_STEP``'s. Returns, per step, ``(step, "sum", value)``, ``(step, "skipped")`` or
    ``(step, "raised", message)`` (a rank stops at its first error)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = []
    for step in range(STEPS):
        x = torch.tensor([10.0 * step + rank])
        if rank == SKIP_RANK and step == SKIP_STEP:
            out.append((step, "skipped"))
            continue
        try:
            dist.all_reduce(x, group=group)
        except RuntimeError as exc:
            out.append((step, "raised", str(exc)))
            break
        out.append((step, "sum", x.item()))
    return out


def swap_order(group) -> list[tuple]:
    """Rank 0 issues ``all_reduce`` then ``broadcast(src=0)``; rank 1 the reverse (after 0.3 s, so
    that rank 0's timer is the first to fire and the run tells the same story every time).
    Returns ``(op, "ok", values)`` or ``(op, "raised", message)`` per collective tried."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    ops = ["all_reduce", "broadcast"] if rank == 0 else ["broadcast", "all_reduce"]
    if rank == 1:
        time.sleep(0.3)
    out = []
    for op in ops:
        x = torch.full((4,), float(rank + 1))
        try:
            if op == "all_reduce":
                dist.all_reduce(x, group=group)
            else:
                dist.broadcast(x, src=0, group=group)
        except RuntimeError as exc:
            out.append((op, "raised", str(exc)))
            break
        out.append((op, "ok", x.tolist()))
    return out


def flight_record(group) -> dict:
    """This rank's flight recorder entries for ``group``, and the group's last enqueued sequence
    number (``torch._C._distributed_c10d._dump_fr_trace``; gloo records as NCCL does)."""
    import pickle

    import torch._C._distributed_c10d as c10d

    dump = pickle.loads(
        c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    )
    name = group.group_name
    entries = [
        (
            e["collective_seq_id"],
            e["profiling_name"],
            tuple(tuple(s) for s in e["input_sizes"]),
            e["timeout_ms"],
        )
        for e in dump["entries"]
        if e["process_group"][0] == name
    ]
    status = next((s for pg, s in dump["pg_status"].items() if str(pg) == str(_pg_id(dump, name))), {})
    return dict(
        group=name,
        entries=entries,
        last_enqueued=status.get("last_enqueued_collective"),
        version=dump["version"],
        pg_config=sorted(dump["pg_config"]),
    )


def _pg_id(dump: dict, name: str):
    for e in dump["entries"]:
        if e["process_group"][0] == name:
            return e["pg_id"]
    return None


class CaptureStderr:
    """Route this process's file descriptor 2 into a temporary file while the block runs, and keep
    what was written (``.text``): the C++ side of torch and gloo logs there, with timestamps, and a
    rank forked from a notebook kernel shares the kernel's descriptor 2."""

    def __enter__(self):
        import sys
        import tempfile

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        import sys

        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()


def _timed(fn, *args):
    start = time.monotonic()
    out = fn(*args)
    return dict(out=out, elapsed=time.monotonic() - start)


def hang_scenarios(timeout_s: float = COLLECTIVE_TIMEOUT_S, skip=None, swap=None) -> dict:
    """On every rank of 2: the skip case, its flight record and the swap case on plain gloo groups,
    then the swap and skip cases again on groups made under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
    Each case's result carries its elapsed time (for the tests' bounds, never printed) and what
    torch's C++ side logged meanwhile (``stderr``, normalized). ``skip`` and ``swap`` replace
    :func:`skip_one` and :func:`swap_order` (a note passes the copies its reader sees)."""
    skip, swap = skip or skip_one, swap or swap_order
    import torch
    import torch.distributed as dist

    out = {}

    def case(name, fn, group):
        with CaptureStderr() as err:
            out[name] = _timed(fn, group)
        out[name]["stderr"] = [normalize(line) for line in err.text.splitlines() if line.strip()]

    group = _group(timeout_s)
    case("skip", skip, group)
    out["flight_record"] = flight_record(group)
    out["flight_dump"] = _fr_dump()
    case("swap", swap, _group(timeout_s))
    # DETAIL from here on: torch reads the level when it makes a group, and then wraps the group
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()
    group = _group(timeout_s)
    out["wrapper"] = type(group._get_backend(torch.device("cpu"))).__name__
    case("swap_detail", swap, group)
    case("skip_detail", skip, _group(timeout_s))
    return out


def _fr_dump() -> bytes:
    import torch._C._distributed_c10d as c10d

    return c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)


def fr_analyzer(results, add_members: bool = False) -> list[str]:
    """Run torch's flight recorder analyzer (the ``torchfrtrace`` command:
    ``torch.distributed.flight_recorder.fr_trace.main``) on the ranks' dumps of the skip case, one
    file per rank as a job writes them. Returns what it prints (normalized), or the error that
    stops it. The gloo dump's ``pg_config`` (each group's member list) has only the default
    group; ``add_members`` adds the skip case's group ``{0, 1}`` to it first."""
    import contextlib
    import io
    import pickle
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="fr-")
    try:
        for rank, res in enumerate(results):
            dump = pickle.loads(res["flight_dump"])
            if add_members:
                name = res["flight_record"]["group"]
                ranks = str(list(range(len(results))))
                dump["pg_config"][name] = {"name": name, "desc": "undefined", "ranks": ranks}
            with open(os.path.join(folder, f"rank_{rank}"), "wb") as f:
                pickle.dump(dump, f)
        buf = io.StringIO()
        mine = logging.StreamHandler(buf)
        fr_log = logging.getLogger("Flight Recorder")  # the analyzer reports through this logger
        saved = fr_log.handlers[:], fr_log.propagate
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()), CaptureStderr():
            from torch.distributed.flight_recorder import fr_trace

            fr_log.handlers[:] = [mine]
            fr_log.propagate = False
            try:
                fr_trace.main([folder, "-p", "rank_"])
            except Exception as exc:  # noqa: BLE001 - the note shows it
                return [f"{type(exc).__name__}: {exc}"]
            finally:
                fr_log.handlers[:], fr_log.propagate = saved
        lines = [normalize(line.rstrip()) for line in buf.getvalue().splitlines()]
        lines = [line for line in lines if line.strip() and "tabulate" not in line]
        return lines or ["(no output)"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stuck(group_timeout_s: float = STUCK_GROUP_TIMEOUT_S) -> str:
    """Rank 1 skips the ``all_reduce`` and returns; rank 0 waits in it (its group's timeout is
    longer than the launch bound), until the launcher stops it."""
    import torch
    import torch.distributed as dist

    group = _group(group_timeout_s)
    if dist.get_rank() == SKIP_RANK:
        return "skipped the all_reduce"
    dist.all_reduce(torch.ones(1), group=group)
    return "all_reduce done"


def launcher_report(bound_s: float = STUCK_LAUNCH_S) -> dict:
    """Launch :func:`stuck` on 2 ranks with a launch bound of ``bound_s``; return the launcher's
    report (normalized; each stack cut below :func:`stuck`, whose callers are the process that
    forked the ranks, and without the collective recorder's wrapper frame), the rank it blames,
    and how long the launch took (for the tests)."""
    from snippets.ranks.launch import RankError, run_ranks

    start = time.monotonic()
    try:
        run_ranks(stuck, 2, timeout=bound_s)
    except RankError as exc:
        return dict(report=trim_report(normalize(str(exc))), rank=exc.rank, elapsed=time.monotonic() - start)
    raise AssertionError("the stuck launch finished")


def trim_report(report: str, fn: str = "stuck") -> str:
    """Drop, from each stack of a launcher report, the frames below ``fn`` and the recorder's."""
    out, skipping = [], False
    for line in report.splitlines():
        if line.startswith("---") or not line.startswith("  "):
            skipping = False
        if skipping or "recorder.py" in line:
            continue
        out.append(line)
        if line.strip().startswith("File") and line.rstrip().endswith(f" in {fn}"):
            skipping = True
    return "\n".join(out)


# ---- tables --------------------------------------------------------------------------------------


def skip_table(results) -> Table:
    """Per step, what each rank's ``all_reduce`` returned, and what it should have been."""
    rows = []
    for step in range(STEPS):
        expected = sum(10.0 * step + r for r in range(len(results)))
        cells = []
        for res in results:
            hit = next((o for o in res["skip"]["out"] if o[0] == step), None)
            if hit is None:
                cells.append("（已停）")
            elif hit[1] == "sum":
                cells.append(f"{hit[2]:g}" + ("" if hit[2] == expected else " ✗"))
            elif hit[1] == "skipped":
                cells.append("跳过")
            else:
                cells.append("超时：" + first_line(hit[2], 90))
        rows.append([step, f"{expected:g}", *cells])
    return Table(["step", "应得", *[f"rank {r}" for r in range(len(results))]], rows)


def case_rows(results, case: str) -> list[list]:
    """One row per rank: what each collective of ``case`` did."""
    rows = []
    for rank, res in enumerate(results):
        for item in res[case]["out"]:
            if item[1] == "raised":
                rows.append([rank, item[0], "raised", first_line(item[2])])
            elif item[1] == "skipped":
                rows.append([rank, f"step {item[0]}", "skipped", ""])
            elif case.startswith("skip"):
                rows.append([rank, f"step {item[0]} all_reduce", "ok", f"{item[2]:g}"])
            else:
                rows.append([rank, item[0], "ok", str(item[2])])
    return rows


def case_table(results, case: str) -> Table:
    return Table(["rank", "collective", "结果", "消息（已清洗）"], case_rows(results, case))


def mismatch_summary(results) -> list[str]:
    """The DETAIL wrapper's mismatch message on each rank, reduced to the two fingerprints it names
    (rank, sequence number, op type, shape) and the aspect it says differs."""
    out = []
    for rank, res in enumerate(results):
        text = next(i for i in res["swap_detail"]["out"] if i[1] == "raised")[2]
        prints = re.findall(
            r"Rank (\d+) is running collective: CollectiveFingerPrint\("
            r"SequenceNumber=(\d+), OpType=(\w+), TensorShape=(\[[^\]]*\])",
            text,
        )
        verdict = re.search(r"Collectives differ in the following aspects:\s*(.*)$", text, re.S)
        seen = "; ".join(f"rank {r} 在 {op}（seq {s}，shape {shape}）" for r, s, op, shape in prints)
        differ = " ".join(verdict.group(1).split()) if verdict else "?"
        out.append(f"rank {rank} 抛出 RuntimeError：{text.split('.')[0]}：{seen}；不同之处：{differ}")
    return out


def flight_table(results) -> Table:
    """Each rank's flight record of the skip case's group: entries and the last sequence number."""
    rows = []
    for rank, res in enumerate(results):
        fr = res["flight_record"]
        ops = ", ".join(
            f"#{seq} {name}{list(sizes[0]) if sizes else ''}" for seq, name, sizes, _ in fr["entries"]
        )
        rows.append([rank, len(fr["entries"]), fr["last_enqueued"], ops])
    return Table(["rank", "记录条数", "last_enqueued_collective", "条目（序号 名字[形状]）"], rows)


# ---- the rerun state machine on a NaN and a spike --------------------------------------------------

NAN_ITERATION = 2
"""The (1-based) iteration whose input gets a NaN on :data:`NAN_RANK`."""

NAN_RANK = 1

NAN_ITERATIONS = 4

SPIKE_SAMPLES, SPIKE_FACTOR = 5, 10
"""``is_unexpectedly_large`` learns the max of the first ``SPIKE_SAMPLES`` losses, then flags a loss
``SPIKE_FACTOR`` times that (pretrain_gpt.py uses 100 samples by default and a factor of 10)."""


def tiny_loss(iteration: int, rank: int, nan: bool = False, scale: float = 1.0):
    """A step's loss: a fixed 4x4 linear map of a fixed input, squared and averaged; ``nan`` puts a
    NaN into one input element (a bad sample), ``scale`` multiplies the input (a spike)."""
    import torch

    g = torch.Generator().manual_seed(100 * iteration + rank)
    x = torch.randn(2, 4, generator=g) * scale
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(7))
    if nan:
        x[0, 0] = float("nan")
    return ((x @ w) ** 2).mean()


class _Log:
    """Collects what ``megatron.core.rerun_state_machine`` logs in this rank."""

    def __init__(self):
        import logging

        self.lines: list[str] = []
        self.handler = logging.Handler(level=logging.DEBUG)
        self.handler.emit = lambda record: self.lines.append(f"{record.levelname}: {record.getMessage()}")
        self.logger = logging.getLogger("megatron.core.rerun_state_machine")

    def __enter__(self):
        self.logger.addHandler(self.handler)
        self._saved = (self.logger.level, self.logger.propagate)
        self.logger.setLevel("DEBUG")
        self.logger.propagate = False
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self._saved[0])
        self.logger.propagate = self._saved[1]


def train_loop(mode: str, iterations: int, loss_of, checks, injector=None) -> dict:
    """Drive the real rerun state machine the way ``train_step`` does (training.py): for each
    iteration, ``while should_run_forward_backward(None)`` run the step and its ``validate_result``
    calls (``checks(rsm, loss)``), then ``should_checkpoint_and_exit()``. Stops at the first exit
    or error. Returns per iteration: runs of the step, the state after it, the decision, and the log."""
    import torch.distributed as dist
    from megatron.core import rerun_state_machine as rsm_mod

    rank = dist.get_rank()
    rsm_mod.destroy_rerun_state_machine()
    kwargs = dict(mode=rsm_mod.RerunMode(mode))
    if injector is not None:
        kwargs["error_injector"] = rsm_mod.RerunErrorInjector(*injector)
    rows = []
    with _Log() as log:
        rsm_mod.initialize_rerun_state_machine(**kwargs)
        rsm = rsm_mod.get_rerun_state_machine()
        for it in range(1, iterations + 1):
            runs, error = 0, None
            try:
                while rsm.should_run_forward_backward(None):
                    runs += 1
                    checks(rsm, loss_of(it, rank))
                decision = rsm.should_checkpoint_and_exit()
            except Exception as exc:  # noqa: BLE001 - shown in the note
                decision, error = None, f"{type(exc).__name__}: {exc}"
            rows.append(dict(iteration=it, runs=runs, state=rsm.state.name, decision=decision, error=error))
            if error or (decision and decision[1]):
                break
    rsm_mod.destroy_rerun_state_machine()
    return dict(rows=rows, log=[normalize(line) for line in log.lines])


def nan_check(rsm, loss):
    """``loss_func``'s two checks (pretrain_gpt.py), with the same arguments."""
    import torch

    rsm.validate_result(
        result=loss,
        rejection_func=torch.isnan,
        message="found NaN in local forward loss calculation",
        tolerance=0.0,
        fatal=True,
    )
    rsm.validate_result(
        result=loss,
        rejection_func=torch.isinf,
        message="found Inf in local forward loss calculation",
        tolerance=0.0,
        fatal=True,
    )


def spike_check(rsm, loss, samples=SPIKE_SAMPLES, factor=SPIKE_FACTOR):
    """``loss_func``'s spiky-loss check (pretrain_gpt.py), with fewer samples to learn the max."""
    import functools

    rsm.validate_result(
        result=loss,
        rejection_func=functools.partial(
            rsm.is_unexpectedly_large, threshold=factor, context="loss", num_samples=samples
        ),
        message="Spiky loss",
        tolerance=0.0,
        fatal=False,
    )


def _nan_loss(it, rank):
    return tiny_loss(it, rank, nan=(it == NAN_ITERATION and rank == NAN_RANK))


def _nan_at_first(it, rank):
    return tiny_loss(it, rank, nan=(it == 1 and rank == NAN_RANK))


def _spiky_loss(it, rank):
    return tiny_loss(it, rank, scale=100.0 if it == SPIKE_SAMPLES + 2 else 1.0)


def _clean_loss(it, rank):
    return tiny_loss(it, rank)


def allow_reduce_on_cpu() -> None:
    """The only CPU stand-in the rerun cases need beyond the note's usual ones: the state machine
    makes its ``all_reduce`` flag on ``device='cuda'`` (``_reduce_any``); here that tensor is made
    on the CPU. Everything else it does is unchanged. With CUDA present nothing is changed."""
    import torch

    from snippets.cpu.base import cpu_factory, scope_torch

    if torch.cuda.is_available():
        return
    scope_torch("megatron.core.rerun_state_machine", tensor=cpu_factory(torch.tensor))


def nan_cases(check=None) -> dict:
    """On every rank: the NaN cases of the rerun state machine, first as published (where the CPU
    stops it), then with :func:`allow_reduce_on_cpu`. ``check`` replaces :func:`nan_check`."""
    from megatron.core.rerun_state_machine import RerunDiagnostic

    with CaptureStderr():
        return _nan_cases(RerunDiagnostic, check or nan_check)


def _nan_cases(RerunDiagnostic, nan_check) -> dict:
    out = {}
    out["as_published"] = train_loop("validate_results", NAN_ITERATIONS, _nan_loss, nan_check)
    out["disabled"] = train_loop("disabled", NAN_ITERATIONS, _nan_loss, nan_check)
    allow_reduce_on_cpu()
    out["validate_results"] = train_loop("validate_results", NAN_ITERATIONS, _nan_loss, nan_check)
    out["nan_at_iteration_1"] = train_loop("validate_results", 2, _nan_at_first, nan_check)
    out["inject_transient"] = train_loop(
        "validate_results", NAN_ITERATIONS, _clean_loss, nan_check, (1, RerunDiagnostic.TRANSIENT_ERROR)
    )
    out["inject_persistent"] = train_loop(
        "validate_results", NAN_ITERATIONS, _clean_loss, nan_check, (1, RerunDiagnostic.PERSISTENT_ERROR)
    )
    out["spike"] = train_loop("validate_results", SPIKE_SAMPLES + 3, _spiky_loss, spike_check)
    return out


CASES = (
    ("as_published", "validate_results", f"rank {NAN_RANK} 第 {NAN_ITERATION} 步 NaN（未替 CUDA）"),
    ("disabled", "disabled", f"rank {NAN_RANK} 第 {NAN_ITERATION} 步 NaN"),
    ("validate_results", "validate_results", f"rank {NAN_RANK} 第 {NAN_ITERATION} 步 NaN"),
    ("nan_at_iteration_1", "validate_results", f"rank {NAN_RANK} 第 1 步 NaN"),
    ("inject_transient", "validate_results", "注入 transient_error（rate=1）"),
    ("inject_persistent", "validate_results", "注入 persistent_error（rate=1）"),
    ("spike", "validate_results", f"第 {SPIKE_SAMPLES + 2} 步输入 ×100（spiky loss，fatal=False）"),
)


def _shown_row(rows: list[dict]) -> dict:
    """The step a case is about: the first step that ran more than once (a rerun, even when training
    went on, e.g. a non-fatal spike), else the last step (where it stopped or finished)."""
    return next((r for r in rows if r["runs"] > 1), rows[-1])


def _decision(row: dict) -> str:
    if row["error"]:
        return "raised " + first_line(row["error"], 120)
    ck, ex, code = row["decision"]
    return f"checkpoint={ck}, exit={ex}, exit code {code}"


def nan_table(results) -> Table:
    """Per case: the rank(s) it concerns, the step it is about (:func:`_shown_row`: the rerun step,
    else where it stopped or finished), how often that step ran, the state, and
    ``should_checkpoint_and_exit()``'s decision. When the ranks agree the row says so ("全部");
    otherwise there is one row per rank."""
    rows = []
    for key, mode, what in CASES:
        shown = [_shown_row(res[key]["rows"]) for res in results]
        keys = [(r["iteration"], r["runs"], r["state"], r["decision"], bool(r["error"])) for r in shown]
        who = ["全部"] if len(set(keys)) == 1 else [f"rank {i}" for i in range(len(shown))]
        for i, label in enumerate(who):
            row = shown[i]
            rows.append([what, mode, label, row["iteration"], row["runs"], row["state"], _decision(row)])
    headers = [
        "情形",
        "rerun_mode",
        "rank",
        "第几步（重跑的，否则最后一步）",
        "该步跑了几次",
        "state",
        "should_checkpoint_and_exit()",
    ]
    return Table(headers, rows)


def run(dims=None, par=None) -> dict:
    """The runner's entry point (every rank of 2): the hang cases and the NaN cases."""
    return dict(hang=hang_scenarios(), nan=nan_cases())


def tables(results, dims=None, par=None) -> list:
    """What the note prints from :func:`run`'s results."""
    hang = [r["hang"] for r in results]
    nan = [r["nan"] for r in results]
    return [
        skip_table(hang),
        flight_table(hang),
        case_table(hang, "swap"),
        *mismatch_summary(hang),
        case_table(hang, "skip_detail"),
        nan_table(nan),
    ]


# ---- where each switch is read: checked against the installed sources ---------------------------

MLM_URL = "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"

SOURCES = {
    # Megatron at core_v0.19.0 (megatron/ as installed; pretrain_gpt.py from the tag's tree)
    "timeout_default": (
        "megatron/training/config/common_config.py",
        77,
        "distributed_timeout_minutes: int = 10",
    ),
    "timeout_kwarg": (
        "megatron/training/initialize.py",
        340,
        "'timeout': timedelta(minutes=args.distributed_timeout_minutes)",
    ),
    "init_pg": (
        "megatron/training/initialize.py",
        352,
        "torch.distributed.init_process_group(**init_process_group_kwargs)",
    ),
    "timeout_after_init": (
        "megatron/training/training.py",
        3751,
        "update_pg_timeout(timedelta(seconds=args.distributed_timeout_seconds_after_init))",
    ),
    "fr_env": ("megatron/training/initialize.py", 298, "_fr_path = ("),
    "fr_dump_file": ("megatron/training/initialize.py", 313, "'TORCH_FR_DUMP_TEMP_FILE': _fr_dump_prefix,"),
    "fr_dump_on_timeout": ("megatron/training/initialize.py", 316, "'TORCH_NCCL_DUMP_ON_TIMEOUT'"),
    "fr_buffer_default": (
        "megatron/training/config/common_config.py",
        137,
        "flight_recorder_trace_buffer_size: int = 2000",
    ),
    "straggler_class": ("megatron/core/utils.py", 1445, "class StragglerDetector:"),
    "straggler_flag": ("megatron/training/config/resilience_config.py", 36, "log_straggler: bool = False"),
    "straggler_configure": ("megatron/training/training.py", 3601, "stimer.configure("),
    "straggler_report": ("megatron/training/training.py", 3172, "stimer.report("),
    "rerun_mode": (
        "megatron/training/config/resilience_config.py",
        21,
        'rerun_mode: Literal["disabled", "validate_results", "report_stats"] = "validate_results"',
    ),
    "injection_rate": ("megatron/training/config/resilience_config.py", 12, "error_injection_rate: int = 0"),
    "injection_type": ("megatron/training/config/resilience_config.py", 16, "error_injection_type: Literal"),
    "spiky_flag": ("megatron/training/config/resilience_config.py", 28, "check_for_spiky_loss: bool = False"),
    "rsm_init": ("megatron/training/initialize.py", 85, "initialize_rerun_state_machine("),
    "exit_16": ("megatron/core/rerun_state_machine.py", 37, "EXIT_CODE_RESUME_TO_DISAMBIGUATE: int = 16"),
    "exit_17": (
        "megatron/core/rerun_state_machine.py",
        40,
        "EXIT_CODE_FAILED_ON_RESULT_VALIDATION: int = 17",
    ),
    "reduce_any": ("megatron/core/rerun_state_machine.py", 254, "def _reduce_any("),
    "reduce_cuda": ("megatron/core/rerun_state_machine.py", 268, "device='cuda')"),
    "should_run": ("megatron/core/rerun_state_machine.py", 272, "def should_run_forward_backward("),
    "should_exit": ("megatron/core/rerun_state_machine.py", 400, "def should_checkpoint_and_exit("),
    "validate": ("megatron/core/rerun_state_machine.py", 464, "def validate_result("),
    "disabled_raises": ("megatron/core/rerun_state_machine.py", 519, "if self.mode == RerunMode.DISABLED:"),
    "first_iteration": ("megatron/core/rerun_state_machine.py", 594, "if not self.first_iteration_complete:"),
    "large": ("megatron/core/rerun_state_machine.py", 698, "def is_unexpectedly_large("),
    "injector": ("megatron/core/rerun_state_machine.py", 1267, "class RerunErrorInjector:"),
    "train_step_loop": (
        "megatron/training/training.py",
        2358,
        "while rerun_state_machine.should_run_forward_backward(data_iterator):",
    ),
    "train_step_exit": (
        "megatron/training/training.py",
        2458,
        "rerun_state_machine.should_checkpoint_and_exit()",
    ),
    "loop_checkpoint": ("megatron/training/training.py", 3871, "if should_checkpoint:"),
    "sys_exit": ("megatron/training/training.py", 4155, "sys.exit(exit_code)"),
    "loss_nan": ("pretrain_gpt.py", 250, "if args.check_for_nan_in_loss_and_grad:"),
    "loss_spiky": ("pretrain_gpt.py", 266, "if args.check_for_spiky_loss:"),
    "spiky_factor": ("pretrain_gpt.py", 185, "SPIKY_LOSS_FACTOR = 10"),
    # torch 2.13.0 as installed (paths inside the torch package)
    "t_detail": ("torch/distributed/distributed_c10d.py", 2289, "if get_debug_level() == DebugLevel.DETAIL:"),
    "t_debug_import": ("torch/distributed/__init__.py", 170, "set_debug_level_from_env()"),
    "t_fr_buffer": (
        "torch/include/torch/csrc/distributed/c10d/FlightRecorder.hpp",
        111,
        '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000);',
    ),
    "t_blocking": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        60,
        "TORCH_NCCL_BLOCKING_WAIT = {",
    ),
    "t_async_default": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        65,
        "the default value (3 - SkipCleanUp)",
    ),
    "t_async": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        67,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING = {",
    ),
    "t_dump": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        74,
        "TORCH_NCCL_DUMP_ON_TIMEOUT = {",
    ),
    "t_desync": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        83,
        "TORCH_NCCL_DESYNC_DEBUG = {",
    ),
    "t_trace": (
        "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
        115,
        "TORCH_NCCL_TRACE_BUFFER_SIZE = {",
    ),
    "t_analyzer": ("torch/distributed/flight_recorder/fr_trace.py", 43, "def main("),
}
"""Each switch the procedure names: (path, line, text that line holds)."""


def source_roots() -> dict[str, str]:
    """Where the sources are read: the installed megatron and torch packages, and Megatron's tag
    tree for the files outside the package (``pretrain_gpt.py``), if it is on this machine."""
    import megatron.core
    import torch

    return dict(
        megatron=os.path.dirname(os.path.dirname(os.path.dirname(megatron.core.__file__))),
        torch=os.path.dirname(os.path.dirname(torch.__file__)),
        tree=os.environ.get("MEGATRON_SRC", "/tmp/mlm-0.19.0"),
    )


def check_sources(roots: dict[str, str] | None = None) -> dict[str, bool | None]:
    """For each entry of :data:`SOURCES`: does that line hold that text? ``None`` when the file is
    not on this machine (``pretrain_gpt.py`` without the tag's tree)."""
    roots = roots or source_roots()
    out = {}
    for key, (path, line, text) in SOURCES.items():
        root = roots["torch"] if path.startswith("torch/") else roots["megatron"]
        full = os.path.join(root, path)
        if not os.path.exists(full):
            full = os.path.join(roots["tree"], path)
        if not os.path.exists(full):
            out[key] = None
            continue
        with open(full, encoding="utf-8") as f:
            lines = f.read().splitlines()
        out[key] = len(lines) >= line and text in lines[line - 1]
    return out


def cite(key: str) -> str:
    """A markdown link to a Megatron entry (pinned to core_v0.19.0), or the torch file and line."""
    path, line, _ = SOURCES[key]
    if path.startswith("torch/"):
        return f"`{path.removeprefix('torch/')}:{line}`"
    return f"[{path.rsplit('/', 1)[-1]}:{line}]({MLM_URL}{path}#L{line})"


def megatron_defaults() -> dict:
    """The defaults Megatron's own argument parser gives the flags the procedure uses."""
    import argparse

    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args([])
    names = [
        "distributed_timeout_minutes", "distributed_timeout_seconds_after_init", "flight_recorder_dump_path",
        "flight_recorder_trace_buffer_size", "flight_recorder_dump_on_timeout", "log_straggler", "rerun_mode",
        "check_for_nan_in_loss_and_grad", "check_for_spiky_loss", "error_injection_rate", "error_injection_type",
    ]  # fmt: skip
    flags = {a.dest: a.option_strings for a in parser._actions}
    return {name: (getattr(args, name), flags.get(name, [])) for name in names}


PROCEDURE = (
    (
        "1 给等待定上限",
        "--distributed-timeout-minutes N",
        "distributed_timeout_minutes",
        ("timeout_kwarg", "init_pg"),
        "部分：torch 群的 timeout=2 s 跑了；Megatron 传 timeout 这一步读代码",
    ),
    (
        "1 给等待定上限",
        "--distributed-timeout-seconds-after-init S",
        "distributed_timeout_seconds_after_init",
        ("timeout_after_init",),
        "否（读代码）",
    ),
    (
        "2 超时要真的结束进程",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING（注释说默认 3）/ TORCH_NCCL_BLOCKING_WAIT=1",
        None,
        ("t_async", "t_async_default", "t_blocking"),
        "否：只有 NCCL",
    ),
    (
        "3 每个 rank 留下最近的集合通信",
        "--flight-recorder-dump-path DIR",
        "flight_recorder_dump_path",
        ("fr_env", "fr_dump_file"),
        "部分：gloo 也记录，_dump_fr_trace 取出",
    ),
    (
        "3 每个 rank 留下最近的集合通信",
        "TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_FR_BUFFER_SIZE",
        "flight_recorder_trace_buffer_size",
        ("t_fr_buffer", "t_trace"),
        "是：默认 2000 条，gloo 也记",
    ),
    (
        "3 每个 rank 留下最近的集合通信",
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
        "flight_recorder_dump_on_timeout",
        ("t_dump", "fr_dump_on_timeout"),
        "否：超时自动落盘只有 NCCL",
    ),
    (
        "4 合并各 rank 的记录找缺席者",
        "torchfrtrace DIR -p PREFIX",
        None,
        ("t_analyzer",),
        "是：补上组成员后点名缺席 rank",
    ),
    (
        "5 查各 rank 的顺序是否一致",
        "TORCH_DISTRIBUTED_DEBUG=DETAIL",
        None,
        ("t_detail", "t_debug_import"),
        "是",
    ),
    (
        "6 看每个进程停在哪行 Python",
        "py-spy dump --pid PID",
        None,
        (),
        "否：本机没装；同理的 faulthandler 栈已跑",
    ),
    (
        "6 看 NCCL 自己的日志",
        "NCCL_DEBUG=INFO, TORCH_NCCL_DESYNC_DEBUG=1",
        None,
        ("t_desync",),
        "否：只有 NCCL",
    ),
    (
        "7 慢而不卡：找掉队的 rank",
        "--log-straggler",
        "log_straggler",
        ("straggler_class", "straggler_configure"),
        "否：CUDA event",
    ),
    (
        "8 loss 出 NaN / 尖峰",
        "--rerun-mode validate_results, --check-for-spiky-loss",
        "rerun_mode",
        ("validate", "loss_nan"),
        "是",
    ),
    (
        "8 演练一次",
        "--error-injection-rate N --error-injection-type T",
        "error_injection_rate",
        ("injector", "injection_rate"),
        "是",
    ),
)
"""The procedure on a real cluster: (step, switch, Megatron argument it maps to, sources, run here?)."""


def procedure_table(defaults: dict | None = None, checked: dict | None = None) -> Table:
    """:data:`PROCEDURE` with each Megatron flag's default (from its own parser) and each source
    checked: a cited line that does not hold its text is marked （未核对）."""
    defaults = megatron_defaults() if defaults is None else defaults
    checked = check_sources() if checked is None else checked
    rows = []
    for step, switch, arg, keys, ran in PROCEDURE:
        default = "" if arg is None else repr(defaults[arg][0])
        # a file this machine lacks (pretrain_gpt.py without the tag's tree) is not marked, so the
        # note's stored table is the same on every machine; the test checks it where the tree is
        where = "，".join(cite(k) + ("（未核对）" if checked.get(k) is False else "") for k in keys) or "—"
        rows.append([step, f"`{switch}`", default, where, ran])
    return Table(
        ["步骤", "开关 / 命令", "Megatron 默认", "出处（0.19.0 / torch 2.13）", "本页在 gloo 上跑了吗"], rows
    )
