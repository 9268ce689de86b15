"""What ``TransformerConfig.__post_init__`` fills in or rewrites after you construct it, and the
default that the command line computes *before* it (note 19).

A ``TransformerConfig`` is a dataclass, so the fields you pass are not always the fields you get:
``__post_init__`` (and ``ModelParallelConfig.__post_init__`` before it) derives the ones left at
``None`` -- ``ffn_hidden_size``, ``kv_channels``, ``num_query_groups``, the init methods,
``expert_tensor_parallel_size`` ... -- and checks combinations, raising ``ValueError``.
:func:`post_init_changes` finds every such field by constructing the real config and comparing
each field with what went in, so the list is computed, not remembered.

The training entry point fills ``ffn_hidden_size`` earlier, in ``validate_args``
(``megatron/training/arguments.py``), with a different rule under ``--swiglu``;
:func:`cli_default_ffn_hidden_size` restates that rule (``validate_args`` needs a whole command
line) and ``tests/unit/test_config_derived.py`` checks it against the expression in the installed
``megatron.training`` (in the pip package since core 0.19).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types

import torch


def _input_value(field: dataclasses.Field, kwargs: dict):
    if field.name in kwargs:
        return kwargs[field.name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # tensors, odd objects: only identity counts
        return False


def post_init_changes(config_cls, **kwargs) -> list[dict]:
    """Build ``config_cls(**kwargs)`` and return one dict per field whose final value differs
    from what went in (the keyword given, else the field's default), in field order:
    ``{"name", "given", "final"}``. Raises whatever ``__post_init__`` raises."""
    config = config_cls(**kwargs)
    changes = []
    for field in dataclasses.fields(config_cls):
        given = _input_value(field, kwargs)
        final = getattr(config, field.name)
        if not _same(given, final):
            changes.append(dict(name=field.name, given=given, final=final))
    return changes


def describe(value) -> str:
    """A short text for a config value that is the same on every run (no addresses):
    ``normal_(mean=0.0, std=0.02)`` for an init partial, ``silu`` for a function, ``torch.float32``
    for a dtype."""
    if isinstance(value, functools.partial):
        args = [repr(a) for a in value.args] + [f"{k}={v!r}" for k, v in value.keywords.items()]
        return f"{describe(value.func)}({', '.join(args)})"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return value.__name__
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, float):
        return repr(round(value, 6))
    return repr(value)


def cli_default_ffn_hidden_size(hidden_size: int, swiglu: bool) -> int:
    """``ffn_hidden_size`` when ``--ffn-hidden-size`` is not given, as ``validate_args`` sets it
    (``megatron/training/arguments.py``, lines 1280-1289 at ``core_v0.19.0``): with ``--swiglu``,
    two thirds of ``4·h`` rounded *down* to a multiple of 64 (so the gated MLP has about as many
    parameters as a plain ``4·h`` one), otherwise ``4·h``."""
    if swiglu:
        return int((4 * hidden_size * 2 / 3) / 64) * 64
    return 4 * hidden_size


__all__ = ["cli_default_ffn_hidden_size", "describe", "post_init_changes"]
