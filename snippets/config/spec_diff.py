"""What a layer spec turned into: the module tree of a built model, the difference between two
builds, and every tensor-parallel layer with the flags that decide its communication (note 19).

A ``ModuleSpec`` says which class goes in which slot; only building the model shows what really
came out -- some choices are made later, from the ``TransformerConfig`` (``WrappedTorchNorm``
picks ``LayerNorm`` or ``RMSNorm`` from ``config.normalization`` when it is instantiated).
So the note builds real models and compares *them*:

* :func:`module_tree` -- ``{path: class name}`` for every submodule, in registration order
  (the order ``__init__`` assigned them, which is also ``state_dict`` order);
* :func:`diff_trees` -- the rows where several such trees disagree;
* :func:`parallel_layers` -- each ``ColumnParallelLinear`` / ``RowParallelLinear`` /
  ``VocabParallelEmbedding`` of a model on this rank: split dimension, local weight shape, TP
  group size, and the flags Megatron set on it (read from the module, not assumed).

``tests/ranks/test_spec_diff.py`` checks these on plain torch modules and on real GPT models.
"""

from __future__ import annotations

import torch

MISSING = "—"
"""Table cell for a path one of the compared models does not have, or a flag a layer lacks."""

FLAGS = (
    "gather_output",
    "input_is_parallel",
    "sequence_parallel",
    "skip_bias_add",
    "allreduce_dgrad",
    "reduce_scatter_embeddings",
    "explicit_expert_comm",
)
"""Attributes the TP layers set in ``__init__`` that decide what they communicate."""

ROLES = {
    # last path component -> what the layer does in a GPT model
    "word_embeddings": "词嵌入：token id → h，按词表切",
    "linear_qkv": "Q、K、V 投影（列并行，按 head 切）",
    "linear_proj": "attention 输出投影（行并行，部分和）",
    "linear_fc1": "MLP 升维 h → ffn（列并行）",
    "linear_fc2": "MLP 降维 ffn → h（行并行，部分和）",
    "output_layer": "h → logits，按词表切",
}


def module_tree(model: torch.nn.Module, strip: str = "") -> dict[str, str]:
    """``{path: class name}`` for every submodule of ``model`` (the root is ``""``), with the
    prefix ``strip`` removed from each path (``"decoder."`` shortens a GPT's layer paths)."""
    return {
        (name[len(strip) :] if strip and name.startswith(strip) else name): type(mod).__name__
        for name, mod in model.named_modules()
    }


def merged_order(trees: dict[str, dict[str, str]]) -> list[str]:
    """Every path of every tree, in model order: a path only some trees have is placed right after
    the path that precedes it in its own tree."""
    order: list[str] = []
    for tree in trees.values():
        previous = None
        for path in tree:
            if path not in order:
                order.insert(order.index(previous) + 1 if previous is not None else 0, path)
            previous = path
    return order


def diff_trees(trees: dict[str, dict[str, str]]) -> list[list[str]]:
    """Rows ``[path, class in tree 1, class in tree 2, ...]`` for the paths whose class is not the
    same in every tree (:data:`MISSING` where a tree lacks the path). A path only some trees have
    is placed right after the path that precedes it in its own tree, so a MoE layer's router and
    experts sit under its ``mlp`` row, as they do in the model."""
    rows = []
    for path in merged_order(trees):
        classes = [tree.get(path, MISSING) for tree in trees.values()]
        if len(set(classes)) > 1:
            rows.append([path, *classes])
    return rows


def _flag(module, name):
    value = getattr(module, name, MISSING)
    return value if isinstance(value, bool) or value is MISSING else str(value)


def parallel_layers(model: torch.nn.Module) -> list[dict]:
    """Every TP layer of ``model`` on this rank, in registration order, as a dict.

    ``partition_dim`` and ``stride`` come from the attributes Megatron sets on the weight; a
    layer without its own weight (the output layer when it shares the word embeddings) reports
    :data:`MISSING`. ``tp`` is the size of the group the layer splits over (the expert TP group for
    expert linears). ``flags`` holds every name of :data:`FLAGS` the layer defines.
    """
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    kinds = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
    rows = []
    for path, module in model.named_modules():
        if not isinstance(module, kinds):
            continue
        weight = getattr(module, "weight", None)
        rows.append(
            dict(
                path=path,
                cls=type(module).__name__,
                role=ROLES.get(path.rsplit(".", 1)[-1], ""),
                partition_dim=weight.partition_dim if weight is not None else MISSING,
                stride=getattr(weight, "partition_stride", 1) if weight is not None else MISSING,
                local_shape=list(weight.shape) if weight is not None else MISSING,
                tp=module.tp_group.size(),
                is_expert=getattr(module, "is_expert", False),
                flags={name: _flag(module, name) for name in FLAGS if hasattr(module, name)},
            )
        )
    return rows


def flag_cells(row: dict, names=FLAGS) -> list:
    """The values of ``names`` for one :func:`parallel_layers` row, :data:`MISSING` where the
    layer does not have the flag (a table row)."""
    return [row["flags"].get(name, MISSING) for name in names]


__all__ = ["FLAGS", "MISSING", "ROLES", "diff_trees", "flag_cells", "module_tree", "parallel_layers"]
