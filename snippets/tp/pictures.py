"""Pictures of tensor parallelism (notes 09-12), each drawn from the rows its note's table prints.

* :func:`draw_mappings` (note 09): every ``mappings.py`` function, forward and backward, as the
  ranks' tensors going in, the collective they meet (or none), and the tensors coming out.
* :func:`draw_linear` (note 10): where each rank's slice sits in the full ``[out, in]`` weight of a
  column and a row parallel layer, and the f / g collective each layer's forward and backward meets.
* :func:`draw_layer` (note 11): one transformer layer as a vertical flow of submodules, per-rank
  weight shapes, and a marker where a collective runs, without and with sequence parallel.
* :func:`draw_vocab` (note 12): the vocabulary split across ranks and the three all-reduces of
  vocab-parallel cross entropy.

Every box that stands for recorded data carries a hover title (``<title>``) naming that data; the
tests read those titles back and compare them with the note's table rows. The shared pieces (one
fill per rank, the in -> collective -> out cell) are in :mod:`snippets.tp.picture_parts`.
"""

from __future__ import annotations

from snippets.record.draw import Figure, text_width
from snippets.tp.picture_parts import flow_cell, rank_kind  # rng_pictures imports rank_kind from here

# ------------------------------------------------------------------ note 09


def _merge(rows: list[list]) -> list[tuple]:
    """(function, phase, api, buffer shapes, tensor shapes) per function and phase, from the
    record table's rows (several collectives in one phase are joined with " + ")."""
    out: dict[tuple, list] = {}
    for name, phase, api, _, before, after, tensor, _ in rows:
        key = (name, phase)
        if key not in out:
            out[key] = [name, phase, [], [], tensor]
        if api != "—":
            out[key][2].append(api)
            out[key][3].append(f"{before} → {after}")
    return [(n, p, " + ".join(a) or None, "; ".join(b), t) for n, p, a, b, t in out.values()]


def _tensor_sides(tensor: str) -> tuple[str, str]:
    a, b = tensor.split(" → ")
    return a, b


def draw_mappings(
    rows: list[list],
    tp: int = 2,
    *,
    only: list[str] | None = None,
    title: str | None = None,
    box_w: float = 130,
    mid_w: float = 176,
) -> Figure:
    """Note 09: one row per function of the record table (``record_rows``), forward left and
    backward right; each rank's tensor goes through the collective the run recorded. ``only``
    keeps the named functions (in the table's order; note 09's first picture is f and g), with
    narrower boxes (``box_w``, ``mid_w``) when it has to fit beside less."""
    cells = _merge(rows)
    names = list(dict.fromkeys(c[0] for c in cells))
    if only is not None:
        missing = [n for n in only if n not in names]
        if missing:
            raise ValueError(f"not in the record table: {missing}")
        names = [n for n in names if n in only]
    pitch = 22 + tp * 20 + (tp - 1) * 10 + 14
    top = 48
    cell_w = 2 * box_w + mid_w + 44
    width = 12 + cell_w + 36 + cell_w + 12
    height = top + len(names) * pitch + 4
    fig = Figure(
        width,
        height,
        title=title or f"mappings.py 的 {len(names)} 个调用：反向做的是正向的转置（TP={tp}）",
        desc="每行一个函数；左半是正向（x → y），右半是反向（dy → dx）；黄框是本方向发出的 collective，"
        "虚线表示不通信。方框里是每个 rank 的张量形状。",
    )
    fig.text(12, 14, "正向：每个 rank 的 x → y", bold=True)
    fig.text(12 + cell_w + 36, 14, "反向：每个 rank 的 dy → dx", bold=True)
    fig.legend(
        12,
        34,
        [(rank_kind(r), f"rank {r}") for r in range(tp)] + [("comm", "collective（通信前 → 通信后）")],
        size=11,
    )
    by = {(c[0], c[1]): c for c in cells}
    for i, name in enumerate(names):
        y = top + i * pitch
        with fig.group(name):
            fig.text(12, y + 8, name, mono=True, bold=True)
            for j, phase in enumerate(("forward", "backward")):
                _, _, api, shapes, tensor = by[(name, phase)]
                a, b = _tensor_sides(tensor)
                x = 12 + j * (cell_w + 36)
                label = f"{api} {shapes}" if api else None
                if label and text_width(label, 12) > mid_w - 6:
                    label = api
                flow_cell(
                    fig,
                    x,
                    y + 20,
                    left=[a] * tp,
                    right=[b] * tp,
                    api=label,
                    tip=f"{name} | {phase} | {api or '—'} | {shapes or '—'} | {tensor}",
                    box_w=box_w,
                    mid_w=mid_w,
                )
    fig.check()
    return fig


def mapping_cells(rows: list[list]) -> list[str]:
    """The hover titles :func:`draw_mappings` gives its cells, rebuilt from the table's rows."""
    return [f"{n} | {p} | {a or '—'} | {s or '—'} | {t}" for n, p, a, s, t in _merge(rows)]


# ------------------------------------------------------------------ note 10


def _spans(text: str) -> tuple[int, int]:
    """``"0–7"`` -> (0, 7)."""
    a, b = str(text).split("–")
    return int(a), int(b)


_SHORT_API = {
    "all_reduce": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
}
LINEAR_SUMMARY_CONFIGS = (
    "Column, gather_output=False",
    "Row, input_is_parallel=True",
    "Column, SP",
    "Row, SP",
)


def draw_linear_summary(comm_rows: list[list], tp: int = 2, *, title: str | None = None) -> Figure:
    """Note 10's first picture: the collectives each layer's default configuration recorded (from
    ``comm_table``'s rows), without and with sequence parallel, forward and backward, each with
    the code that issued it: the column layer's backward all-reduce comes from ``layers.py``
    (f fused into the matmul's autograd Function), the row layer's from ``mappings.py`` (g)."""
    by: dict[tuple[str, str], list[list]] = {}
    for config, phase, api, _group, before, after, issuer, _meaning in comm_rows:
        by.setdefault((config, phase), []).append([api, before, after, issuer])
    configs = [c for c in LINEAR_SUMMARY_CONFIGS if any(k[0] == c for k in by)]
    if not configs:
        raise ValueError("none of the summary's configurations is in the table")
    label_w, col_w, gap, row_h, pitch, top = 222, 330, 10, 24, 32, 56
    width = 12 + label_w + 2 * (col_w + gap) - gap + 12
    height = top + len(configs) * pitch + 8
    fig = Figure(
        width,
        height,
        title=title or f"column / row 层各自发出的 collective 与发出它的代码（TP={tp}）",
        desc="每行一种配置；左列是正向、右列是反向，格子里是这一方向发出的 collective 和发出它的函数，"
        "空格表示不通信。",
    )
    fig.legend(12, 12, [("comm", "collective（@ 发出它的代码）")], size=11)
    for j, head in enumerate(("forward ↓", "backward ↑")):
        fig.text(12 + label_w + j * (col_w + gap), 40, head, kind="muted", size=11)
    for i, config in enumerate(configs):
        y = top + i * pitch
        fig.text(12, y + row_h / 2, config, mono=True, size=11)
        for j, phase in enumerate(("forward", "backward")):
            calls = by.get((config, phase), [])
            x = 12 + label_w + j * (col_w + gap)
            if not calls:
                fig.text(x + 8, y + row_h / 2, "不通信", kind="muted", size=11)
                continue
            apis = " + ".join(_SHORT_API.get(c[0], c[0]) for c in calls)
            # layers.py::forward / ::backward say where in the layer; a mappings.py helper is g's family
            issuers = "、".join(
                dict.fromkeys(c[3].split("::")[0] if c[3].startswith("mappings") else c[3] for c in calls)
            )
            fig.boxed(
                x,
                y,
                col_w,
                row_h,
                f"{apis} @ {issuers}",
                "comm",
                size=11,
                tip=" | ".join([config, phase] + [f"{c[0]} {c[1]} → {c[2]} @ {c[3]}" for c in calls]),
            )
    fig.check()
    return fig


def draw_linear(layout_rows: list[list], comm_rows: list[list], tp: int = 2) -> Figure:
    """Note 10: the master weight of ``ColumnParallelLinear`` and ``RowParallelLinear`` with each
    rank's slice (from ``layout_table``'s rows at this ``tp``), and beside each the collectives
    its default configuration recorded (from ``comm_table``'s rows)."""
    cell = 11
    panels = [
        (
            "column",
            "Column, gather_output=False",
            "ColumnParallelLinear：按输出维（行）切；正向不通信，f 融合在反向里（输入梯度 all-reduce）",
        ),
        ("row", "Row, input_is_parallel=True", "RowParallelLinear：按输入维（列）切，g 在矩阵乘之后"),
    ]
    width, pitch = 1060, 250
    fig = Figure(
        width,
        30 + pitch * 2,
        title=f"每个 rank 的权重在完整 [out, in] 里的位置；column 的 f 融合进反向，row 的 g 在正向（TP={tp}）",
        desc="上：ColumnParallelLinear，rank r 拿主权重的第 r 段行；"
        "下：RowParallelLinear，rank r 拿第 r 段列。右边是这层正向、反向各自经过的 collective。",
    )
    fig.legend(
        12, 14, [(rank_kind(r), f"rank {r} 的分片") for r in range(tp)] + [("comm", "collective")], size=11
    )
    for p, (kind, case, caption) in enumerate(panels):
        y0 = 36 + p * pitch
        mine = [row for row in layout_rows if row[0] == kind and row[1] == tp]
        master = mine[0][9]
        out, inn = master
        fig.text(12, y0 + 8, caption, bold=True)
        mx, my = 84, y0 + 44
        fig.text(mx, my - 12, f"in = {inn}", size=11, kind="muted")
        fig.text(mx - 6, my + out * cell / 2, f"out = {out}", size=11, kind="muted", anchor="end")
        with fig.group(f"{kind} weight"):
            for row in mine:
                r = row[2]
                r0, r1 = _spans(row[4])
                c0, c1 = _spans(row[5])
                x, y = mx + c0 * cell, my + r0 * cell
                w, h = (c1 - c0 + 1) * cell, (r1 - r0 + 1) * cell
                fig.rect(
                    x,
                    y,
                    w,
                    h,
                    rank_kind(r),
                    rx=0,
                    tip=f"{kind} | rank {r} | {row[3]} | rows {row[4]} | cols {row[5]}",
                )
                ink = "ink" if rank_kind(r) in ("fwd2", "edp", "mem") else "on"
                fig.text(x + w / 2, y + h / 2 - 8, f"rank {r}", anchor="middle", kind=ink, size=11)
                fig.text(x + w / 2, y + h / 2 + 8, str(row[3]), anchor="middle", kind=ink, size=11)
        calls = [row for row in comm_rows if row[0] == case]
        cx = mx + inn * cell + 60
        for j, phase in enumerate(("forward", "backward")):
            mine_calls = [c for c in calls if c[1] == phase]
            y = my + j * 80
            fig.text(cx, y + 2, "正向：X → Y" if phase == "forward" else "反向：dY → dX", bold=True)
            api = " + ".join(c[2] for c in mine_calls) or None
            shapes = "; ".join(f"{c[4]} → {c[5]}" for c in mine_calls)
            label = f"{api} {shapes}" if api else None
            tip = f"{case} | {phase} | {api or '—'} | {shapes or '—'}"
            flow_cell(
                fig,
                cx,
                y + 18,
                left=[f"rank {r}" for r in range(tp)],
                right=[f"rank {r}" for r in range(tp)],
                api=label,
                tip=tip,
                box_w=90,
                mid_w=330,
            )
            if mine_calls:
                fig.text(
                    cx + 90 + 22 + 330 + 22 + 90 + 10,
                    y + 18 + tp * 15 - 5,
                    mine_calls[0][6],
                    size=11,
                    kind="muted",
                )
    fig.check()
    return fig


def linear_tips(layout_rows: list[list], comm_rows: list[list], tp: int = 2) -> list[str]:
    """The hover titles :func:`draw_linear` gives its slices and collectives, from the tables' rows."""
    tips = []
    for kind, case in (("column", "Column, gather_output=False"), ("row", "Row, input_is_parallel=True")):
        tips += [
            f"{kind} | rank {row[2]} | {row[3]} | rows {row[4]} | cols {row[5]}"
            for row in layout_rows
            if row[0] == kind and row[1] == tp
        ]
        for phase in ("forward", "backward"):
            calls = [c for c in comm_rows if c[0] == case and c[1] == phase]
            api = " + ".join(c[2] for c in calls) or "—"
            shapes = "; ".join(f"{c[4]} → {c[5]}" for c in calls) or "—"
            tips.append(f"{case} | {phase} | {api} | {shapes}")
    return tips


# ------------------------------------------------------------------ note 11


def _apis(cell: str) -> list[str]:
    return [] if cell == "—" else [a.strip() for a in cell.split(",")]


def draw_layer(
    weight_rows: list[list], submodule_rows: list[list], tp: int = 2, title: str | None = None
) -> Figure:
    """Note 11: one ``TransformerLayer`` top to bottom (``weight_table``'s rows: submodule, class,
    per-rank weight, split), and beside each submodule the collectives it issued itself
    (``submodule_table``'s rows), forward and backward: without sequence parallel, then with it,
    side by side (the weights are the same in both; only the collectives change). The weights
    may come from another run of the same layer than the collectives (note 11: Qwen3-8B's shapes
    from the meta-device layer, the collectives from the small layer that ran): which
    submodule issues which collective does not depend on the sizes. ``title`` replaces the
    default one."""
    comm = {row[0].replace(" 自身", ""): row[1:] for row in submodule_rows}
    own = comm.get("self_attention", ["—"] * 4)
    if any(c != "—" for c in own):
        raise ValueError("self_attention issued collectives of its own: the picture has no row for them")
    box_w, fwd_w, bwd_w, row_h, pitch, gap = 220, 100, 176, 26, 34, 8
    pair_w = fwd_w + gap + bwd_w
    pairs = [12 + box_w + 14, 12 + box_w + 14 + pair_w + 20]
    top = 92
    width = pairs[1] + pair_w + 12
    height = top + len(weight_rows) * pitch + 8
    fig = Figure(
        width,
        height,
        title=title
        or f"一层 TransformerLayer 的子模块、每卡 weight 与通信（TP={tp}，左：不开 SP，右：开 SP）",
        desc="从上到下是 forward 的顺序；每个方框是一个子模块和它每卡的 weight 形状（列并行、行并行、复制）；"
        "右侧黄色标记是这个子模块自己发出的 collective，先是不开 SP 的 forward、backward 两列，"
        "再是开 SP 的两列。",
    )
    fig.legend(
        12,
        14,
        [("tp", "列并行"), ("fwd2", "行并行"), ("light", "复制 / 无参数"), ("comm", "collective")],
        size=11,
        gap=10,
    )
    fig.text(12, 68, f"子模块与每卡 weight（TP={tp}）", bold=True)
    for x, label in zip(pairs, ("不开 sequence parallel", "开 sequence parallel")):
        fig.text(x, 46, label, bold=True)
        fig.text(x, 70, "forward ↓", kind="muted", size=11)
        fig.text(x + fwd_w + gap, 70, "backward ↑", kind="muted", size=11)
    kinds = {"列并行": "tp", "行并行": "fwd2"}
    for i, (name, cls, shape, split, _) in enumerate(weight_rows):
        y = top + i * pitch
        kind = next((k for word, k in kinds.items() if str(split).startswith(word)), "light")
        fig.rect(12, y, box_w, row_h, kind, tip=f"{name} | {cls} | {shape} | {split}")
        ink = "on" if kind == "tp" else "ink"
        fig.text(20, y + row_h / 2, name, kind=ink, mono=True)
        if shape != "—":
            fig.text(12 + box_w - 8, y + row_h / 2, str(shape), kind=ink, anchor="end", size=11)
        if i:
            fig.line(36, y - pitch + row_h, 36, y - 1, "muted", arrow=True)
        cells = comm.get(name)
        if not cells:
            continue
        for x, (label, offset) in zip(pairs, _SP_PANELS):
            for j, (w, cx) in enumerate(((fwd_w, x), (bwd_w, x + fwd_w + gap))):
                apis = _apis(cells[offset + j])
                if apis:
                    phase = "forward" if j == 0 else "backward"
                    fig.boxed(
                        cx,
                        y + 3,
                        w,
                        row_h - 6,
                        " + ".join(apis),
                        "comm",
                        size=11,
                        tip=f"{label.format(tp=tp)} | {name} | {phase} | {', '.join(apis)}",
                    )
    fig.check()
    return fig


def draw_layer_summary(
    weight_rows: list[list], submodule_rows: list[list], tp: int = 2, title: str | None = None
) -> Figure:
    """Note 11's first picture, the answer at a glance: :func:`draw_layer` turned on its side and
    cut to the submodules that issue a collective. One column per such submodule (its per-rank
    weight on top, coloured by its split), one row per phase (forward, backward; without and with
    sequence parallel); the submodules that issue nothing are named in one line underneath. Same
    tables as :func:`draw_layer`, same markers (their tips say the same thing)."""
    comm = {row[0].replace(" 自身", ""): row[1:] for row in submodule_rows}
    if any(c != "—" for c in comm.get("self_attention", [])):
        raise ValueError("self_attention issued collectives of its own: the picture has no column for them")
    talkers = [r for r in weight_rows if any(c != "—" for c in comm.get(r[0], []))]
    quiet = [r[0] for r in weight_rows if r not in talkers]
    if not talkers:
        raise ValueError("no submodule issued a collective: nothing to draw")
    label_w, col_w, gap, head_h, row_h, pitch = 124, 178, 8, 40, 22, 28
    left = 12 + label_w
    width = left + len(talkers) * (col_w + gap) - gap + 12
    top = 34 + head_h + 10
    rows = [(label, offset, j) for label, offset in _SP_PANELS for j in (0, 1)]
    height = top + len(rows) * pitch + 40
    fig = Figure(
        width,
        height,
        title=title or f"一层 TransformerLayer 里发通信的子模块（TP={tp}）：不开 SP 与开 SP",
        desc="每一列是一个自己发出 collective 的子模块和它每卡的 weight 形状；每一行是一个阶段"
        "（不开 SP 的 forward、backward，开 SP 的 forward、backward）；格子里是它发出的 collective；"
        "下方一行列出不发通信的子模块。",
    )
    fig.legend(12, 12, [("tp", "列并行"), ("fwd2", "行并行"), ("comm", "collective")], size=11, gap=10)
    kinds = {"列并行": "tp", "行并行": "fwd2"}
    for i, (name, cls, shape, split, _) in enumerate(talkers):
        x = left + i * (col_w + gap)
        kind = next((k for word, k in kinds.items() if str(split).startswith(word)), "light")
        fig.rect(x, 34, col_w, head_h, kind, tip=f"{name} | {cls} | {shape} | {split}")
        ink = "on" if kind == "tp" else "ink"
        fig.text(x + col_w / 2, 34 + 12, name, kind=ink, mono=True, anchor="middle")
        fig.text(x + col_w / 2, 34 + 29, str(shape), kind=ink, size=11, anchor="middle")
    for k, (label, offset, j) in enumerate(rows):
        y = top + k * pitch + (6 if offset else 0)  # a little air between the two SP settings
        sp = "开 SP" if offset else "不开 SP"
        fig.text(12, y + row_h / 2, f"{sp} · {'forward ↓' if j == 0 else 'backward ↑'}", size=11)
        for i, (name, *_rest) in enumerate(talkers):
            apis = _apis(comm[name][offset + j])
            if apis:
                phase = "forward" if j == 0 else "backward"
                fig.boxed(
                    left + i * (col_w + gap),
                    y,
                    col_w,
                    row_h,
                    " + ".join(apis),
                    "comm",
                    size=11,
                    tip=f"{label.format(tp=tp)} | {name} | {phase} | {', '.join(apis)}",
                )
    norms = [n for n in quiet if n.endswith("layernorm")]
    named = ([f"{len(norms)} 个 norm"] if norms else []) + [n for n in quiet if n not in norms]
    fig.text(
        12,
        top + len(rows) * pitch + 20,
        f"其余 {len(quiet)} 个子模块不发 collective：" + "、".join(named),
        size=11,
        kind="muted",
    )
    fig.check()
    return fig


_SP_PANELS = (("TP={tp}，不开 sequence parallel", 0), ("TP={tp}，开 sequence parallel", 2))
"""The two halves of :func:`draw_layer`: a label, and where their columns start in a
``submodule_table`` row (forward, backward)."""


def layer_tips(weight_rows: list[list], submodule_rows: list[list], tp: int = 2) -> list[str]:
    """The hover titles :func:`draw_layer` gives, rebuilt from the two tables' rows."""
    comm = {row[0].replace(" 自身", ""): row[1:] for row in submodule_rows}
    tips = []
    for name, cls, shape, split, _ in weight_rows:
        tips.append(f"{name} | {cls} | {shape} | {split}")
        for label, offset in _SP_PANELS:
            for j, phase in enumerate(("forward", "backward")):
                apis = _apis(comm[name][offset + j]) if name in comm else []
                if apis:
                    tips.append(f"{label.format(tp=tp)} | {name} | {phase} | {', '.join(apis)}")
    return tips


# ------------------------------------------------------------------ note 12


def draw_vocab(
    vocab: int, ranges: dict[int, list], ce_rows: list[list], local_shape: list, tp: int = 2
) -> Figure:
    """Note 12: the vocabulary ``0 .. vocab-1`` cut into each rank's ``range(start, end)`` (for
    every TP size in ``ranges``, as ``VocabParallelEmbedding`` reported them), and the forward of
    ``vocab_parallel_cross_entropy`` at ``tp``: each rank's ``[s, b, V/TP]`` logits meet the
    three all-reduces ``ce_comm_table`` recorded (``ce_rows``) and leave as the full loss."""
    cell, left = 52, 96
    width = left + vocab * cell + 16
    strip_h, top, below = 26, 32, 26  # a strip, and the room under it for its range labels
    ce_top = top + len(ranges) * (strip_h + below) + 20
    lanes = tp * 26 + (tp - 1) * 10
    height = ce_top + 30 + lanes + 46
    fig = Figure(
        width,
        height,
        title=f"词表按 TP 切成连续的段（V={vocab}），以及 vocab-parallel 交叉熵的三次 all-reduce",
        desc="上：每个 TP 大小下各 rank 管的词表段 range(start, end)；"
        "下：TP=2 时每卡只有自己那段 logits，交叉熵正向只在 TP 群里 all-reduce 三个 [s, b] 张量。",
    )
    fig.text(
        12,
        14,
        f"每卡管哪一段词表（VocabParallelEmbedding 的 vocab_start_index / vocab_end_index，V={vocab}）",
        bold=True,
    )
    for i, (size, per_rank) in enumerate(ranges.items()):
        y = top + i * (strip_h + below)
        fig.text(12, y + strip_h / 2, f"TP={size}", bold=True)
        for r, (a, b) in enumerate(per_rank):
            x = left + a * cell
            kind = rank_kind(r)
            fig.rect(x, y, (b - a) * cell, strip_h, kind, rx=0, tip=f"TP={size} | rank {r} | range({a}, {b})")
            ink = "on" if kind == "tp" else "ink"
            for t in range(a, b):
                fig.text(
                    left + t * cell + cell / 2, y + strip_h / 2, str(t), anchor="middle", kind=ink, size=11
                )
                if t > a:
                    fig.line(left + t * cell, y, left + t * cell, y + strip_h, "paper")
            fig.text(x + 4, y + strip_h + 10, f"rank {r}：range({a}, {b})", size=11, kind="muted")
    fig.text(
        12,
        ce_top,
        f"vocab_parallel_cross_entropy 的 forward（TP={tp}）：每卡 logits {local_shape}，"
        "通信只有三次 [s, b] 的 all-reduce，backward 不通信",
        bold=True,
    )
    y0 = ce_top + 24
    box_w, gap = 150, 26
    x = 12
    for r in range(tp):
        fig.boxed(x, y0 + r * 36, box_w, 26, f"rank {r} logits {local_shape}", rank_kind(r), size=11)
    x += box_w + gap
    step_w = (width - 12 - x - (box_w + gap) - gap * (len(ce_rows) - 1)) / max(len(ce_rows), 1)
    for k, row in enumerate(ce_rows):
        phase, api, _, shapes, _, meaning = row
        op, _, rest = meaning.partition("：")
        for r in range(tp):
            yy = y0 + r * 36 + 13
            fig.line(x - gap + 2, yy, x - 1, yy, "comm", width=1.5, arrow=True)
        fig.rect(x, y0, step_w, lanes, "comm", tip=f"{phase} | {api} | {shapes} | {meaning}")
        fig.text(
            x + step_w / 2, y0 + lanes / 2 - 9, f"{k + 1}. {api} {op}", anchor="middle", mono=True, size=11
        )
        fig.text(x + step_w / 2, y0 + lanes / 2 + 9, shapes.split(" → ")[0], anchor="middle", size=11)
        fig.text(x + step_w / 2, y0 + lanes + 12, rest.split("（")[0], anchor="middle", size=11, kind="muted")
        x += step_w + gap
    for r in range(tp):
        yy = y0 + r * 36 + 13
        fig.line(x - gap + 2, yy, x - 1, yy, "comm", width=1.5, arrow=True)
        fig.boxed(x, y0 + r * 36, box_w, 26, f"rank {r} loss {shapes.split(' → ')[1]}", rank_kind(r), size=11)
    fig.check()
    return fig


def vocab_tips(ranges: dict[int, list], ce_rows: list[list]) -> list[str]:
    """The hover titles :func:`draw_vocab` gives, rebuilt from the run's ranges and the table's rows."""
    tips = [
        f"TP={size} | rank {r} | range({a}, {b})"
        for size, per_rank in ranges.items()
        for r, (a, b) in enumerate(per_rank)
    ]
    return tips + [f"{row[0]} | {row[1]} | {row[3]} | {row[5]}" for row in ce_rows]
