"""Hydra command-line overrides, applied to a config tree the way verl's ``main_ppo`` takes them.

``python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer key=value +key=value ...``:

* ``key=value`` sets a key the config has; ``+key=value`` adds one it lacks; ``++key=value``
  sets or adds; ``~key`` deletes (Hydra's override grammar). Here all four just set or delete:
  this reads the keys that decide the weight sync, it does not validate the config.
* A value is typed as Hydra types it: ``true`` / ``False``, ``null``, ints, floats (``1e-6``),
  lists and dicts (``['a.parquet', 'b.parquet']``, ``["console","wandb"]``), quoted strings, and
  otherwise a plain string. ``${...}`` stays an interpolation, resolved when a key is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from snippets.rl.weight_sync.values import Unknown, put, remove

_KEY = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?:@[\w.]+)?(=|$)")


@dataclass(frozen=True)
class Override:
    op: str  # "", "+", "++" or "~"
    key: str
    value: object  # typed value, or an Unknown


def parse(word: str, unknown: Unknown | None = None) -> Override | None:
    """One command-line word as an override, or None when it is not one (a flag, a stray word).

    ``unknown`` says the word's value came from something the shell alone knows."""
    match = _KEY.match(word)
    if not match:
        return None
    op, key, eq = match.group(1) or "", match.group(2), match.group(3)
    if op != "~" and eq != "=":
        return None
    text = word[match.end() :]
    if unknown is not None:
        return Override(op, key, Unknown(text, unknown.why))
    return Override(op, key, value(text) if eq == "=" else None)


def value(text: str):
    """A Hydra override value, typed."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        return stripped[1:-1]
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~") or stripped == "":
        return None if stripped else ""
    if re.fullmatch(r"[+-]?\d+", stripped):
        return int(stripped)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", stripped):
        return float(stripped)
    if stripped[:1] in "[{" and "${" not in stripped:
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError:
            return stripped
    return stripped


def apply(tree: dict, overrides: list[Override]) -> dict:
    """``tree`` with every override applied, in order (a later one wins, as in Hydra)."""
    for o in overrides:
        if o.op == "~":
            remove(tree, o.key)
        else:
            put(tree, o.key, o.value)
    return tree
