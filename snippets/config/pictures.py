"""Notes 04 and 19's pictures: each weight's TP shards, and where three specs' module trees differ.

:func:`draw_param_shards` takes the rows of note 04's parameter table (name, global shape, each
rank's local shape, ``partition_dim``, ``stride``) and draws every split 2-D weight at its global
``[out, in]`` shape, cut into the ``tp * stride`` chunks ``_initialize_affine_weight_cpu`` makes
along ``partition_dim``, each chunk in the color of the TP rank that holds it; the replicated
parameters are listed below. :func:`shard_spans` is the cut, as data.

:func:`draw_spec_trees` takes the ``{spec: {path: class}}`` trees note 19's ranks built and draws one
row per module of the transformer layer (plus the final norm), one column per spec; the rows whose
class differs between the specs -- exactly :func:`snippets.config.spec_diff.diff_trees`' rows -- are
highlighted.
"""

from __future__ import annotations

from snippets.config.spec_diff import MISSING, diff_trees, merged_order
from snippets.record.draw import Figure, text_width

RANK_KINDS = ("tp", "pp", "dp", "cp", "ep", "edp", "emb", "fwd2")
"""Fill of TP rank r's chunks (enough for TP up to 8)."""

# ----------------------------------------------------------------------------- note 04: TP shards


def shard_spans(global_shape, tp: int, dim: int, stride: int = 1) -> list[tuple[int, int, int]]:
    """``(rank, start, end)`` along ``dim`` for each of the ``tp * stride`` chunks, in order: chunk
    ``k`` belongs to rank ``k % tp`` (the cut of ``_initialize_affine_weight_cpu``)."""
    n = global_shape[dim]
    size = n // (tp * stride)
    return [(k % tp, k * size, (k + 1) * size) for k in range(tp * stride)]


def split_weights(rows) -> list[list]:
    """The rows of note 04's table the picture draws: split parameters with a 2-D global shape."""
    return [r for r in rows if r[-3] != "复制" and len(r[1]) == 2]


def _short(name: str) -> str:
    """``decoder.layers.0.mlp.linear_fc1.weight`` -> ``linear_fc1`` (``.bias`` kept)."""
    parts = name.split(".")
    return parts[-2] if parts[-1] == "weight" else ".".join(parts[-2:])


def draw_param_shards(rows, tp: int, *, title: str, scale: float = 4) -> Figure:
    """Every split 2-D weight at its global shape, chunks colored by the rank holding them."""
    weights = split_weights(rows)
    replicated = [r[0] for r in rows if r[-3] == "复制"]
    col = max(150, max(r[1][1] for r in weights) * scale + 40)
    top = 40
    tallest = max(r[1][0] for r in weights) * scale
    width = 16 + len(weights) * col + 8
    labels_y = top + tallest + 18
    height = labels_y + 3 * 16 + 26 + 20 * 2 + 10
    desc = (
        f"TP={tp} 时每个被切分的二维权重按全局 [out, in] 形状画出，颜色表示持有那一块的 rank；"
        "partition_dim 0 横着切（输出维），1 竖着切（输入维），stride 2 时每个 rank 拿不相邻的两块。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(16, 16, title, size=13, bold=True)
    for i, (name, shape, *locals_, dim, stride, _) in enumerate(weights):
        x0 = 16 + i * col
        out, inn = shape
        with fig.group(name):
            for rank, start, end in shard_spans(shape, tp, dim, stride):
                if dim == 0:
                    x, y, w, h = x0, top + start * scale, inn * scale, (end - start) * scale
                else:
                    x, y, w, h = x0 + start * scale, top, (end - start) * scale, out * scale
                fig.rect(
                    x,
                    y,
                    w,
                    h,
                    RANK_KINDS[rank],
                    rx=0,
                    outline="paper",
                    tip=f"{name} rank {rank} dim {dim} [{start}, {end})",
                )
                if min(w, h) >= 14:
                    fig.text(x + w / 2, y + h / 2, f"r{rank}", size=11, anchor="middle", kind="on")
            if dim == 0 and stride == 2 and name.endswith("linear_fc1.weight"):  # SwiGLU: [gate; up]
                for g, half in enumerate(("gate", "up")):
                    fig.text(
                        x0 + inn * scale + 6, top + (g + 0.5) * out / 2 * scale, half, size=11, kind="muted"
                    )
            fig.text(x0, labels_y, _short(name), size=11, bold=True)
            fig.text(x0, labels_y + 16, f"全局 {list(shape)}", size=11, kind="muted")
            fig.text(x0, labels_y + 32, f"dim {dim} · stride {stride}", size=11, kind="muted")
            fig.text(x0, labels_y + 48, f"每 rank {list(locals_[0])}", size=11, kind="muted")
    y = labels_y + 48 + 26
    names = "、".join(sorted({_short(n) for n in replicated}))
    line = f"复制（每个 rank 一整份）：{names}"
    if text_width(line, 11) > width - 32:
        line = (
            f"复制（每个 rank 一整份）：{len(replicated)} 个参数"
            "（position_embeddings、所有 LayerNorm、行并行层的 bias）"
        )
    fig.text(16, y, line, size=11)
    fig.legend(16, y + 22, [(RANK_KINDS[r], f"TP rank {r} 的块") for r in range(tp)])
    fig.check()
    return fig


# ----------------------------------------------------------------------------- note 19: spec trees


def layer_rows(trees: dict) -> list[list]:
    """``[path, class per spec...]`` for the layer's modules the picture shows: every path two
    levels deep or less, every path where the specs differ, and the final norm; in model order."""
    differs = {row[0] for row in diff_trees(trees)}
    order = merged_order(trees)
    keep = [
        p
        for p in order
        if p in differs
        or p == "decoder.final_layernorm"
        or (p and not p.startswith(("embedding", "output_layer", "decoder", "rotary")) and p.count(".") <= 1)
    ]
    return [[p, *(t.get(p, MISSING) for t in trees.values())] for p in keep]


def draw_spec_trees(trees: dict, *, title: str) -> Figure:
    """One row per module of the layer, one column per spec; differing rows highlighted."""
    rows = layer_rows(trees)
    differs = {row[0] for row in diff_trees(trees)}
    specs = list(trees)
    path_w, col, rh = 250, 190, 20
    top = 56
    width = 16 + path_w + len(specs) * col + 8
    height = top + len(rows) * rh + 44
    desc = (
        "Transformer 层的每个模块一行、每种 spec 一列，格里是建出的类；三种 spec 建出的类不同的行高亮，"
        "“—” 表示这个模型没有该模块。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(16, 16, title, size=13, bold=True)
    fig.text(16, 40, "模块（decoder.layers.0. 之下）", size=11, kind="muted")
    for j, spec in enumerate(specs):
        fig.text(16 + path_w + j * col, 40, spec, size=12, bold=True)
    for i, (path, *classes) in enumerate(rows):
        y = top + i * rh
        depth = path.count(".") if path != "decoder.final_layernorm" else 0
        name = path if path == "decoder.final_layernorm" else path.split(".")[-1]
        diff = path in differs
        with fig.group(f"{'差异' if diff else '相同'} {path}"):
            if diff:
                fig.rect(10, y + 1, width - 18, rh - 2, "accent", rx=2, faint=True)
            fig.text(16 + 14 * depth, y + rh / 2, name, size=11, mono=True, bold=diff)
            for j, cls in enumerate(classes):
                fig.text(
                    16 + path_w + j * col,
                    y + rh / 2,
                    cls,
                    size=11,
                    kind="muted" if cls == MISSING or not diff else "ink",
                    mono=cls != MISSING,
                )
    fig.legend(16, height - 16, [("accent", "三种 spec 建出的类不同（= diff 表的行）")])
    fig.check()
    return fig


# ----------------------------------------------------------------------------- note 19: a TP=2 GPT's layers

SHORT_API = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS"}
KIND_OF = {  # class -> (fill, how it is split)
    "VocabParallelEmbedding": ("emb", "按词表切"),
    "ColumnParallelLinear": ("tp", "列并行"),
    "RowParallelLinear": ("edp", "行并行"),
}


def short_apis(cell: str) -> str:
    """'all-gather, reduce-scatter' -> 'AG + RS'; '—' stays."""
    for name, short in SHORT_API.items():
        cell = cell.replace(name, short)
    return cell.replace(", ", " + ")


def draw_tp_model(layers, comm, *, title: str) -> Figure:
    """One column per tensor-parallel layer of a GPT in forward order (plus the collectives issued
    outside every layer), then one row per (variant, phase) with the collectives each column issued.

    ``layers``: ``[name, class, partition dim, rank 0 weight shape]`` (the last column's class is
    None); ``comm``: ``[(row label, [cell per column])]`` with cells as :func:`snippets.tp.layer_walk.apis`
    writes them.
    """
    left, col, box_h, row_h = 16, 112, 44, 26
    x0 = left + 112
    legend = [("emb", "按词表切"), ("tp", "列并行"), ("edp", "行并行"), ("comm", "这一列发出的通信")]
    key = "AR = all-reduce，AG = all-gather，RS = reduce-scatter"
    legend_w = sum(12 + 5 + text_width(name, 12) + 16 for _, name in legend) + text_width(key, 11)
    width = max(x0 + len(layers) * col + 8, text_width(title, 13) + 2 * left, left + legend_w + 8)
    top = 40
    rows_y = top + 22 + box_h + 14
    height = rows_y + len(comm) * row_h + 40
    desc = (
        "每一列是一个 TP 层（按 forward 顺序）或层外的 cross entropy，方块是它的切法与 rank 0 的 weight；"
        "下面每一行是一种配置的 forward 或 backward，格里是这一列发出的 collective。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(left, 16, title, size=13, bold=True)
    for j, (name, cls, dim, shape) in enumerate(layers):
        x = x0 + j * col
        with fig.group(name):
            fig.text(x + (col - 8) / 2, top + 8, name, size=11, anchor="middle", mono=True, bold=True)
            if cls is None:
                fig.rect(x, top + 22, col - 8, box_h, "paper", outline="grid", dashed=True)
                fig.text(
                    x + (col - 8) / 2, top + 22 + box_h / 2, "层外", size=11, anchor="middle", kind="muted"
                )
                continue
            kind, how = KIND_OF[cls]
            fig.rect(x, top + 22, col - 8, box_h, kind, tip=f"{name}: {cls}, dim {dim}, rank 0 {shape}")
            split = (
                how if dim in (None, "—") else f"{how} dim {dim}"
            )  # the output layer: the embedding's weight
            fig.text(x + (col - 8) / 2, top + 22 + 13, split, size=11, anchor="middle", kind="on")
            weight = "共享词嵌入" if shape in (None, "—") else str(shape)
            fig.text(x + (col - 8) / 2, top + 22 + 31, weight, size=11, anchor="middle", kind="on")
    fig.text(left, top + 22 + box_h / 2, "rank 0 weight", size=11, kind="muted")
    for i, (label, cells) in enumerate(comm):
        y = rows_y + i * row_h
        fig.text(left, y + (row_h - 4) / 2, label, size=11, bold=True)
        for j, cell in enumerate(cells):
            x = x0 + j * col
            text = short_apis(cell)
            if text == "—":
                fig.text(x + (col - 8) / 2, y + (row_h - 4) / 2, "—", size=11, anchor="middle", kind="muted")
            else:
                fig.boxed(x, y, col - 8, row_h - 4, text, "comm", size=11, tip=f"{label}: {cell}")
    x = fig.legend(left, height - 16, legend)
    fig.text(x, height - 16, key, size=11, kind="muted")
    fig.check()
    return fig
