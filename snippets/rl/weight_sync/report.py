"""What both frameworks' reports share: reading typed values that may be unknown, the bytes and
wire-time lines (from :mod:`snippets.rl.refit_cost`), and folding lines at 80 columns."""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass

from snippets.rl import refit_cost
from snippets.rl.weight_sync.values import MANDATORY, MISSING, ConfigError, Unknown, get

UNSET = Unknown("?", "")  # a figure derived from an unknown value


@dataclass(frozen=True)
class Sparse:
    """What a delta sync sends per changed element besides its value, read at the pinned commit.

    The changed share (1-3 % of the elements per step) is verl's measured figure; the wire also
    carries each changed element's position, so its bytes are that share times
    (value bytes + ``position_bytes``) per element, not the value bytes alone."""

    position_bytes: int
    positions: str  # how positions are encoded, e.g. "int32 positions"
    source: str  # file:line of the code that packs them
    first: str  # what the first sync sends


DELTA_SHARE = (0.01, 0.03)  # changed elements per step: verl's docs/advance/delta_weight_sync.md:17


def fmt(value) -> str:
    return "?" if isinstance(value, Unknown) else str(value)


def number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def mul(*values):
    out = 1
    for v in values:
        if not number(v):
            return UNSET
        out *= v
    return out


class Reader:
    """Typed values from a config tree. A value the input cannot give (an Unknown, or ``???``)
    is noted once, in the line :meth:`lines` prints, and returned as an Unknown; a value that is
    wrong (a string for a size, an engine the framework lacks) raises ConfigError."""

    def __init__(self, tree: dict, framework: str, mandatory_hint: str = "set on the command line"):
        self.tree, self.framework, self.hint = tree, framework, mandatory_hint
        self.notes: dict[str, str] = {}

    def value(self, key: str, default=MISSING, choices: tuple = ()):
        got = get(self.tree, key, default)
        if got == MANDATORY:
            one_of = f"; one of {', '.join(choices)}" if choices else ""
            got = Unknown(MANDATORY, f"{self.hint} ({self.framework} requires a value here{one_of})")
        if isinstance(got, Unknown):
            self.notes.setdefault(key, f"{key} = {got.text}: {got.why}")
        return got

    def int(self, key: str, default=MISSING):
        got = self.value(key, default)
        if not isinstance(got, Unknown) and not number(got):
            raise ConfigError(f"{key} is {got!r}; expected an integer")
        return got

    def size(self, key: str, default=MISSING, also: tuple = ()):
        """A count of GPUs, nodes or ranks: a positive int (or one of ``also``, e.g. -1 for
        "all"), checked before any figure is derived from it."""
        got = self.int(key, default)
        if number(got) and got < 1 and got not in also:
            extra = f" (or {' / '.join(map(str, also))})" if also else ""
            raise ConfigError(f"{key} must be a positive int{extra}, got {got}")
        return got

    def choice(self, key: str, choices: tuple, default=MISSING):
        got = self.value(key, default, choices)
        if not isinstance(got, Unknown) and got not in choices:
            raise ConfigError(f"{key} is {got!r}; {self.framework} knows {', '.join(choices)}")
        return got

    def bool(self, key: str, default=MISSING):
        got = self.value(key, default)
        if not isinstance(got, (Unknown, bool)):
            raise ConfigError(f"{key} is {got!r}; expected true or false")
        return got

    def lines(self) -> list[str]:
        return [f"unknown    {note}" for note in self.notes.values()]


def bytes_lines(
    params: float | None, dtype: str, size_from: str, *, moved: tuple, kept: tuple, needs: str = ""
) -> list[str]:
    """The model / moves / keeps lines.

    ``moved`` is (words, strategy, shards or gpus, link): the traffic one GPU receives per round;
    ``kept`` is (rollout TP, link) or None. A figure that needs an unknown says what it needs."""
    words, strategy, count, link = moved
    lines = []
    if params is None:
        lines.append(
            "model      size unknown: the model path names no size; pass --params "
            "(e.g. --params 7e9) for bytes and times"
        )
        needs = "--params"
    else:
        total = refit_cost.model_bytes(params, dtype)
        lines.append(
            f"model      {params / 1e9:g}B parameters{size_from}, {dtype}: "
            f"{total / refit_cost.GB:.3g} GB per copy"
        )
    wire = refit_cost.LINKS[link].name if link else "?"
    if strategy == "none":
        lines.append(f"moves      per GPU per round: {words} = 0 GB")
        return lines
    if strategy == "delta" and params is not None:
        full = refit_cost.bytes_per_gpu(params, "broadcast", shards=1, gpus=1, dtype=dtype)
        value = refit_cost.DTYPE_BYTES[dtype]
        each = value + count.position_bytes
        low, high = (share * full * each / value for share in DELTA_SHARE)
        gb = refit_cost.GB
        lines += [
            f"moves      per GPU per round: {words} = {low / gb:.3g}-{high / gb:.3g} GB over {wire} "
            f">= {_time(low, link)}-{_time(high, link)}",
            f"wire       {each} B per changed {dtype} element: the {value} B value and "
            f"{count.positions} ({count.source}); {100 * low / full:.3g}-{100 * high / full:.3g} % "
            f"of the {full / gb:.3g} GB of weights; {count.first}",
        ]
        return lines
    strategy = "broadcast" if strategy == "delta" else strategy
    if params is None or (strategy == "gather" and not number(count)) or not link:
        lines.append(
            f"moves      per GPU per round: {words} = ? GB over {wire} "
            f"(needs {needs or 'the unknown values above'})"
        )
    else:
        nbytes = (
            0.0
            if strategy == "none"
            else refit_cost.bytes_per_gpu(
                params,
                strategy,
                shards=count if number(count) else 1,
                gpus=count if number(count) else 1,
                dtype=dtype,
            )
        )
        lines.append(
            f"moves      per GPU per round: {words} = {nbytes / refit_cost.GB:.3g} GB over "
            f"{wire} >= {_time(nbytes, link)}"
        )
    if kept is not None:
        tp, link = kept
        link = link or "nvlink"
        if params is None or not number(tp):
            lines.append(
                f"keeps      per GPU: its rollout slice, 1/{fmt(tp)} of the model = ? GB "
                f"(needs {needs or 'the unknown values above'})"
            )
        else:
            nbytes = refit_cost.bytes_per_gpu(params, "slice", gpus=tp, dtype=dtype)
            lines.append(
                f"keeps      per GPU: its rollout slice, 1/{tp} of the model = "
                f"{nbytes / refit_cost.GB:.3g} GB (sending only this, as Megatron's "
                f"resharding planner does: >= {_time(nbytes, link)})"
            )
    return lines


def _time(nbytes: float, link: str) -> str:
    ms = refit_cost.seconds(nbytes, link) * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"  # always ms: 2800 ms, 4.44 ms


def wrap(line: str, width: int = 80) -> str:
    """Fold a long line under its own text: column 11 (after the label) or after a step number."""
    step = re.match(r"\s*\d+\.\s", line)
    indent = " " * (len(step.group(0)) if step else 11)
    return textwrap.fill(
        line, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def params_from_flag(text: str) -> float:
    """``--params``: a count (7e9, 7000000000) or billions (7B, 0.5b), from 1 to MAX_PARAMS."""
    billions = re.fullmatch(r"\s*(\d+(?:\.\d+)?)[bB]\s*", text)
    try:
        value = float(billions.group(1)) * 1e9 if billions else float(text)
    except ValueError:
        raise ConfigError(f"--params {text!r} is not a number like 7e9 or 7B") from None
    if not math.isfinite(value) or not 1 <= value <= MAX_PARAMS:
        raise ConfigError(
            f"--params {text!r} must be a parameter count from 1 to {MAX_PARAMS:.0e} (e.g. 7e9 or 7B)"
        )
    return value


MAX_PARAMS = 1e15  # a thousand times the largest models: a bound, so every figure stays a plain number
