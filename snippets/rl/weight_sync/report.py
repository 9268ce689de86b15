"""What both frameworks' reports share: reading typed values that may be unknown, the bytes and
wire-time lines (from :mod:`snippets.rl.refit_cost`), and folding lines at 80 columns."""

from __future__ import annotations

import re
import textwrap

from snippets.rl import refit_cost
from snippets.rl.weight_sync.values import MANDATORY, MISSING, ConfigError, Unknown, get

UNSET = Unknown("?", "")  # a figure derived from an unknown value


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
        low, high = 0.01 * full, 0.03 * full
        lines.append(
            f"moves      per GPU per round: {words} = {low / refit_cost.GB:.3g}-{high / refit_cost.GB:.3g} GB "
            f"of {full / refit_cost.GB:.3g} GB over {wire} >= {_time(low, link)}-{_time(high, link)}"
        )
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
    value = refit_cost.params_from_name(text)
    if value:
        return value
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--params {text!r} is not a number like 7e9 or 7B") from None
    if value <= 0:
        raise ConfigError(f"--params {text!r} must be positive")
    return value
