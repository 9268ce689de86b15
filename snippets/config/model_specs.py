"""Read a layer spec (``ModuleSpec``) as a table, including the Transformer Engine spec on a machine
without Transformer Engine (note 04).

A ``ModuleSpec`` is data: which class goes in which slot of a ``TransformerLayer``. Since core 0.19
the ``mlp`` slot holds a builder instead, ``functools.partial(MLP.as_mlp_submodule, submodules=...)``
(or ``partial(MoELayer, ...)``), which :func:`slot` and :func:`class_name` read the same way. Reading
a spec needs no GPU -- but ``get_gpt_layer_with_transformer_engine_spec()`` cannot even be *called*
without TE: ``gpt_layer_specs`` imports ``TESpecProvider`` only when ``HAVE_TE`` and binds it to
None otherwise (``gpt_layer_specs.py``:46-54), so the call raises ``TypeError`` (at 0.16 the name
was missing: ``NameError``). :func:`transformer_engine_spec_without_te` binds that name to the real
``TESpecProvider`` for the duration of a ``with`` block (and answers "yes" to its TE version
checks), so the real function can build the real spec. Without TE,
``megatron.core.extensions.transformer_engine`` defines its TE classes as ``MagicMock`` stand-ins;
:func:`class_name` names them by the name they are bound to. Nothing here builds a module from the
spec.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

SLOTS = (
    # slot in TransformerLayerSubmodules (dotted for nested specs), in forward order
    "input_layernorm",
    "self_attention",
    "self_attention.linear_qkv",
    "self_attention.q_layernorm",
    "self_attention.k_layernorm",
    "self_attention.core_attention",
    "self_attention.linear_proj",
    "self_attn_bda",
    "pre_mlp_layernorm",
    "mlp",
    "mlp.linear_fc1",
    "mlp.activation_func",
    "mlp.linear_fc2",
    "mlp_bda",
)


@contextlib.contextmanager
def transformer_engine_spec_without_te():
    """Let ``get_gpt_layer_with_transformer_engine_spec`` run without TE, inside this block only."""
    from megatron.core.extensions import transformer_engine_spec_provider as provider
    from megatron.core.models.gpt import gpt_layer_specs

    missing = object()
    saved_name = gpt_layer_specs.__dict__.get("TESpecProvider", missing)
    saved_check = provider.is_te_min_version
    gpt_layer_specs.TESpecProvider = provider.TESpecProvider
    provider.is_te_min_version = lambda *args, **kwargs: True  # as if a recent TE were installed
    try:
        yield
    finally:
        provider.is_te_min_version = saved_check
        if saved_name is missing:
            del gpt_layer_specs.TESpecProvider
        else:
            gpt_layer_specs.TESpecProvider = saved_name


def class_name(obj) -> str:
    """A readable name for what a spec slot holds: a class, a function, a nested spec, None."""
    from megatron.core.extensions import transformer_engine as te_module
    from megatron.core.transformer.spec_utils import ModuleSpec

    if obj is None:
        return "None"
    if isinstance(obj, ModuleSpec):
        return class_name(obj.module)
    if isinstance(obj, functools.partial):  # a builder: partial(cls, ...) or partial(cls.method, ...)
        return class_name(getattr(obj.func, "__self__", obj.func))
    for name, value in vars(te_module).items():  # a MagicMock stand-in for a TE class
        if value is obj and not name.startswith("_") and not isinstance(obj, type):
            return f"{name} (TE)"
    return getattr(obj, "__name__", type(obj).__name__)


def slot(spec, path: str):
    """The object in slot ``path`` ("mlp.linear_fc1") of a TransformerLayer spec."""
    node = spec
    for part in path.split("."):
        submodules = node.keywords["submodules"] if isinstance(node, functools.partial) else node.submodules
        node = getattr(submodules, part)
    return node


def spec_table(specs: dict) -> list[list[str]]:
    """Rows ``[slot, name under spec 1, name under spec 2, ...]`` for the slots in :data:`SLOTS`."""
    return [[path, *(class_name(slot(spec, path)) for spec in specs.values())] for path in SLOTS]


def default_of(dataclass_type, name: str):
    """The default a submodules dataclass gives a slot the spec leaves out."""
    return next(f.default for f in dataclasses.fields(dataclass_type) if f.name == name)
