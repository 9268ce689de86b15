"""Follow one weight, its activation and its gradient through one training step (note 23).

Note 23 runs one real step of a tiny ``GPTModel`` on 8 ranks (TP=2, PP=2, DP=2, sequence parallel,
distributed optimizer) and asks, at every stage of the roadmap's list -- replicated tensor, TP
shard, sequence shard, pipeline-stage activation, DP gradient sync, optimizer-state shard --
*which rank holds which slice of the dense tensor*. This module holds the pieces that answer it
without hiding Megatron's calls:

* :func:`init_full_then_shard` gives every parameter the same values as the unsplit model: each
  rank draws the **whole** tensor from a generator seeded by the parameter's global name, then
  Megatron's own ``_initialize_affine_weight_cpu`` keeps this TP rank's slice (that is how
  ``use_cpu_initialization=True`` builds TP weights too: full tensor on every rank, then slice);
* :func:`slice_along`, :func:`dense_rows`, :func:`dense_ranges`, :func:`dense_rows_of` translate
  "this rank's piece" into global index ranges of the dense tensor (the last two also for
  SwiGLU's stride-2 ``linear_fc1`` and for optimizer ranges that cut rows);
* :class:`Taps` keeps copies of a few modules' inputs and outputs, one per micro-batch.

What the step costs in bytes -- measured and predicted -- is :mod:`snippets.train.journey_memory`.
The two modules do not import each other: this one says *where* a tensor is, that one *how many
bytes* a rank holds.
"""

from __future__ import annotations

import zlib

import torch

from snippets.models.tiny_gpt import global_name

# ------------------------------------------------------------------ weights: dense, then a TP slice


def full_shape(param, tp: int) -> list[int]:
    """The shape ``param`` has in the unsplit model: its ``partition_dim`` times ``tp``."""
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp
    return shape


def init_full_then_shard(model, std: float = 0.2, keep: tuple[str, ...] = ()) -> dict:
    """Set every parameter of ``model`` (one pipeline stage, one TP rank) to its slice of the
    dense tensor the unsplit model would get; return ``{global name: dense tensor}`` for the
    names in ``keep``.

    The dense values are those of :func:`snippets.models.tiny_gpt.init_by_global_name` (so TP=1 gives
    exactly that). Slicing is done by Megatron's ``_initialize_affine_weight_cpu``: it builds the
    master weight with ``init_method`` and copies this rank's chunk along ``partition_dim``.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu

    tp = parallel_state.get_tensor_model_parallel_world_size()
    dense = {}
    for name, param in model.named_parameters():
        gname = global_name(model, name)
        gen = torch.Generator().manual_seed(zlib.crc32(gname.encode()))
        full = torch.randn(full_shape(param, tp), generator=gen) * std
        if gname.endswith("layernorm.weight"):
            full += 1.0  # norms start near identity, as in tiny_gpt
        if getattr(param, "tensor_model_parallel", False):
            assert param.dim() == 2, gname
            # stride 2 (SwiGLU's linear_fc1): this rank keeps one chunk of gate and one of up
            _initialize_affine_weight_cpu(
                param,
                full.shape[0],
                full.shape[1],
                param.shape[param.partition_dim],
                param.partition_dim,
                lambda master, full=full: master.copy_(full),
                stride=getattr(param, "partition_stride", 1),
                return_master_weight=True,
                skip_set_tensor_parallel_attributes=True,
            )
        else:
            with torch.no_grad():
                param.copy_(full)
        if gname in keep:
            dense[gname] = full
    return dense


def named_by_global_name(model):
    """``(global name, parameter)`` for every parameter of ``model`` (one pipeline stage)."""
    for name, param in model.named_parameters():
        yield global_name(model, name), param


def slice_along(param, tp_rank: int) -> tuple[int, int, int]:
    """(partition_dim, start, end): the global index range this TP rank's ``param`` covers along
    its split dimension (``(-1, 0, 0)`` for a replicated parameter)."""
    if not getattr(param, "tensor_model_parallel", False):
        return -1, 0, 0
    dim = param.partition_dim
    size = param.shape[dim]
    return dim, tp_rank * size, (tp_rank + 1) * size


def dense_ranges(param, tp_rank: int, tp: int) -> list[tuple[int, int]]:
    """The ranges of the dense tensor along ``partition_dim`` that TP rank ``tp_rank`` of ``tp``
    holds of ``param``, in its local order: one range, or one per stride (SwiGLU's
    ``linear_fc1`` has stride 2: a chunk of gate rows, then one of up rows) -- the chunks
    ``_initialize_affine_weight_cpu`` keeps. A replicated parameter holds everything."""
    if not getattr(param, "tensor_model_parallel", False):
        return [(0, param.shape[0])]
    stride = getattr(param, "partition_stride", 1)
    chunk = param.shape[param.partition_dim] // stride
    return [((k * tp + tp_rank) * chunk, (k * tp + tp_rank + 1) * chunk) for k in range(stride)]


def take(dense, ranges: list[tuple[int, int]], dim: int = 0):
    """The pieces ``ranges`` of ``dense`` along ``dim``, concatenated (a TP rank's local layout)."""
    return torch.cat([dense.narrow(dim, a, b - a) for a, b in ranges], dim)


def ranges_text(ranges: list[tuple[int, int]]) -> str:
    """``[0, 16)``, or ``[0, 8) + [16, 24)`` for a piece in two chunks."""
    return " + ".join(f"[{a}, {b})" for a, b in ranges)


def dense_rows_of(flat: tuple[int, int], local_shape, ranges: list[tuple[int, int]]) -> str:
    """The dense rows a flat range ``[a, b)`` of a row-split local tensor covers (its rows are the
    dense ``ranges``, :func:`dense_ranges`), as text: ``行 [0, 12)``; when ``[a, b)`` starts or
    ends inside a row (the distributed optimizer's ranges may), those rows are partly covered."""
    a, b = flat
    cols = 1
    for n in local_shape[1:]:
        cols *= n
    first, end = a // cols, -(-b // cols)  # local rows touched
    pieces, offset = [], 0
    for lo, hi in ranges:
        start, stop = max(first, offset), min(end, offset + hi - lo)
        if start < stop:
            pieces.append((lo + start - offset, lo + stop - offset))
        offset += hi - lo
    text = "行 " + ranges_text(pieces)
    return text if a % cols == 0 and b % cols == 0 else text + "（首尾行只有一部分）"


def dense_rows(flat: tuple[int, int], local_shape, row_offset: int) -> tuple[int, int]:
    """Rows of the dense weight that the flat range ``[a, b)`` of a row-split shard
    (``partition_dim`` 0, first row ``row_offset``) covers, as ``[first, end)``; the range must
    start and end on row boundaries (the optimizer's ranges need not: then this raises)."""
    a, b = flat
    cols = 1
    for n in local_shape[1:]:
        cols *= n
    if a % cols or b % cols:
        raise ValueError(f"[{a}, {b}) does not start and end on rows of {cols} elements")
    return row_offset + a // cols, row_offset + b // cols


# ------------------------------------------------------------------ activations as seen by modules


class Taps:
    """Copies of what flows through every transformer layer of a model (one pipeline stage): for
    each layer and each of ``parts`` (``""`` = the layer itself), the first input and first output
    of every forward call, i.e. one ``(input, output)`` per micro-batch.

    ``with Taps(model) as taps:`` then ``taps[(layer_number, "mlp.linear_fc1")]`` is that list,
    keyed by the *global* layer number so that stages and the unsplit model can be compared.
    ``layer_numbers`` limits it to those layers (at real sizes, copies of every layer's
    activations for every micro-batch would outgrow the model).
    """

    def __init__(self, model, parts=("", "mlp.linear_fc1", "mlp.linear_fc2"), layer_numbers=None):
        self.targets = {
            (layer.layer_number, part): layer.get_submodule(part) if part else layer
            for layer in model.decoder.layers
            for part in parts
            if layer_numbers is None or layer.layer_number in layer_numbers
        }
        self.seen = {key: [] for key in self.targets}
        self.handles = []

    def __enter__(self):
        for key, module in self.targets.items():

            def hook(mod, args, kwargs, out, key=key):
                x = args[0] if args else kwargs["hidden_states"]  # a layer is called by keyword
                y = out[0] if isinstance(out, tuple) else out  # (output, bias) / (output, context)
                self.seen[key].append((x.detach().clone(), y.detach().clone()))

            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self.seen

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


__all__ = [
    "Taps",
    "dense_ranges",
    "dense_rows",
    "dense_rows_of",
    "full_shape",
    "init_full_then_shard",
    "named_by_global_name",
    "ranges_text",
    "slice_along",
    "take",
]
