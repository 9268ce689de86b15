"""Values read from a config, and the ones that cannot be known.

Both frameworks keep their settings as a tree of sections (verl's Hydra configs, NeMo RL's OmegaConf
YAML). This module holds that tree as nested dicts and answers "what is the value at
``a.b.c``?", following ``${...}`` interpolations the way OmegaConf does:

* ``${a.b}`` -- another key, from the root;
* ``${.x}`` / ``${..x}`` -- relative to the key's own section (one dot per level up);
* ``${add:a,b}``, ``${mul:a,b}``, ``${div:a,b}``, ``${max:a,b}`` -- NeMo RL's resolvers;
* ``${oc.select:key, default}`` -- verl's;
* a string with ``${...}`` inside it is formatted.

A value may be an :class:`Unknown`: a launch script fed it from something only the shell knows at
run time (``$1``, ``$(...)``, a variable the script never sets). ``???`` is OmegaConf's "mandatory,
no default": verl leaves ``actor_rollout_ref.rollout.name`` like that for the command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

MANDATORY = "???"


class ConfigError(Exception):
    """A problem with the input; the message is the one line the user sees (exit status 2)."""


@dataclass(frozen=True)
class Unknown:
    """A value the command cannot know: ``text`` as the source spells it, ``why`` in words."""

    text: str
    why: str

    def __str__(self) -> str:
        return self.text


MISSING = object()


def known(value) -> bool:
    return not isinstance(value, Unknown) and value != MANDATORY


# ----------------------------------------------------------------------------- the tree


def put(tree: dict, key: str, value) -> None:
    """Set dotted ``key`` (sections created on the way); a dict value merges into a section."""
    parts = key.split(".")
    for part in parts[:-1]:
        child = tree.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"key {key} is both a value and a section")
        tree = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(tree.get(last), dict):
        for k, v in value.items():
            put(tree[last], str(k), v)
    else:
        tree[last] = value


def remove(tree: dict, key: str) -> None:
    *sections, last = key.split(".")
    for part in sections:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return
    tree.pop(last, None)


def unflatten(data: dict) -> dict:
    """A mapping whose keys may be dotted (``a.b.c: 1``) as one nested tree."""
    tree: dict = {}
    for key, value in data.items():
        put(tree, str(key), unflatten(value) if isinstance(value, dict) else value)
    return tree


def has(tree: dict, key: str) -> bool:
    return raw(tree, key) is not MISSING


def raw(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


# ----------------------------------------------------------------------------- interpolation

_WHOLE = re.compile(r"^\$\{([^${}]+)\}$")
_INNER = re.compile(r"\$\{([^${}]+)\}")
_RESOLVERS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


def get(tree: dict, key: str, default=MISSING, _seen: tuple = ()):
    """The value at ``key`` with interpolations followed (``default`` when absent or null)."""
    value = raw(tree, key)
    if value is MISSING or value is None:
        if default is not MISSING:
            return default
        if value is None:
            return None
        raise ConfigError(f"missing key {key}")
    return _resolve(tree, key, value, _seen)


def _resolve(tree: dict, key: str, value, seen: tuple):
    # Innermost ``${...}`` first, so ``${mul:${a.b},2}`` becomes ``${mul:4,2}`` and then 8.
    while isinstance(value, str) and "${" in value:
        whole = _WHOLE.match(value.strip())
        if whole:
            return _expression(tree, key, whole.group(1).strip(), seen)
        inner = _INNER.search(value)
        if inner is None:
            return value
        got = _expression(tree, key, inner.group(1).strip(), seen)
        if isinstance(got, Unknown):
            return Unknown(value, got.why)
        value = value[: inner.start()] + str(got) + value[inner.end() :]
    return value


def _expression(tree: dict, key: str, expr: str, seen: tuple):
    name, colon, args = expr.partition(":")
    if colon and name in _RESOLVERS:
        values = [_argument(tree, key, a.strip(), seen) for a in args.split(",")]
        bad = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)]
        if bad:
            return bad[0] if isinstance(bad[0], Unknown) else Unknown(f"${{{expr}}}", "not a number")
        return _RESOLVERS[name](*values)
    if colon and name == "oc.select":
        target, _, fallback = args.partition(",")
        got = (
            get(tree, _absolute(key, target.strip()), MISSING, seen)
            if has(tree, _absolute(key, target.strip()))
            else MISSING
        )
        return got if got is not MISSING else _literal(fallback.strip())
    if colon:
        return Unknown(f"${{{expr}}}", f"the resolver {name} runs only inside the framework")
    target = _absolute(key, expr)
    if target in seen or target == key:
        raise ConfigError(f"{key} refers to itself through ${{{expr}}}")
    if not has(tree, target):
        raise ConfigError(f"{key} refers to ${{{expr}}}, which is not set")
    return get(tree, target, None, seen + (key,))


def _argument(tree, key, text, seen):
    literal = _literal(text)
    if isinstance(literal, str) and re.fullmatch(r"[A-Za-z_.][\w.]*", literal):
        return _expression(tree, key, literal, seen)
    return _resolve(tree, key, literal, seen)


def _literal(text: str):
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


def _absolute(key: str, ref: str) -> str:
    """``ref`` as a key from the root: ``.x`` is a sibling of ``key``, ``..x`` one level up."""
    if not ref.startswith("."):
        return ref
    dots = len(ref) - len(ref.lstrip("."))
    base = key.split(".")[:-dots]
    return ".".join(base + [ref[dots:]])


def read_yaml(path: str):
    """The parsed YAML of ``path`` (ConfigError for a missing file or bad YAML)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no such file: {path}")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML: {problem}{where}") from None
