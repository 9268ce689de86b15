"""Notes 03 and 18's pictures: one micro-batch through ``get_batch``, and a blend sample by sample.

:func:`draw_batch_flow` takes what note 03's ranks returned after one ``get_batch`` (TP x CP, no
pipeline): per rank the ``position_ids`` and ``tokens`` of row 0 it kept, and the sender's broadcast
log. Each rank's row shows the whole sequence the TP broadcast left it (rebuilt from the chunks the
CP ranks of its data-parallel replica kept: they read the same sample), an arrow from each TP rank 0
to the ranks that receive its broadcast, and, on the right, the two chunks
``get_batch_on_this_cp_rank`` kept. :func:`kept_rows` is the data both the picture and note 03's
chunk table print.

:func:`draw_blend` takes a ``BlendedDataset``'s ``dataset_index`` / ``dataset_sample_index`` and
draws one cell per sample of the blend in the corpus' color, labelled by which sample of that
corpus it is; below, how far the count from the first corpus strays from ``weight * n``.
"""

from __future__ import annotations

from snippets.record.draw import Figure, text_width

CELL, ROW = 34, 40


# ----------------------------------------------------------------------------- note 03: get_batch


def kept_rows(results, seq: int, cp: int) -> list[list]:
    """``[rank, cp rank, chunks kept, position_ids[0], tokens[0]]`` for each rank holding positions
    (the first five columns of note 03's chunk table)."""
    chunk = seq // (2 * cp)
    return [
        [r, d["coords"][1], sorted({p // chunk for p in d["positions"]}), d["positions"], d["tokens"]]
        for r, d in enumerate(results)
        if d["positions"] is not None
    ]


def full_sequences(results) -> dict[int, list]:
    """Each rank's whole row 0 after the TP broadcast, position -> token, put back together from
    what the CP ranks kept. Ranks with the same tp coordinate and stage hold the same sample here
    (data parallel size 1); a token two ranks disagree on raises."""
    joined: dict[tuple, dict] = {}
    for d in results:
        if d["positions"] is None:
            continue
        tp, _, pp = d["coords"]
        seq = joined.setdefault((tp, pp), {})
        for p, t in zip(d["positions"], d["tokens"]):
            if seq.setdefault(p, t) != t:
                raise ValueError(f"position {p}: tokens {seq[p]} and {t} disagree")
    return {
        r: [
            joined[(d["coords"][0], d["coords"][2])][p]
            for p in sorted(joined[(d["coords"][0], d["coords"][2])])
        ]
        for r, d in enumerate(results)
        if d["positions"] is not None
    }


def _owner(position: int, seq: int, cp: int) -> int:
    """The CP rank that keeps ``position``: chunk ``k`` goes to ``min(k, 2·cp − 1 − k)``."""
    k = position // (seq // (2 * cp))
    return min(k, 2 * cp - 1 - k)


def _chunk_kind(owner: int) -> tuple[str, bool]:
    return ("cp", owner % 2 == 1)  # cp rank 0 solid, cp rank 1 faint, alternating


def draw_batch_flow(results, seq: int, tp: int, cp: int, *, title: str) -> Figure:
    """One row per rank: the broadcast sequence, then the chunks the CP split kept."""
    rows = kept_rows(results, seq, cp)
    full = full_sequences(results)
    log = results[0]["log"]
    left, lane = 150, 70
    x_full = left + lane
    x_arrow = x_full + seq * CELL + 16
    x_kept = x_arrow + 150
    kept_title = "get_batch_on_this_cp_rank 之后"
    width = x_kept + max(len(rows[0][3]) * CELL, text_width(kept_title, 12)) + 16
    top = 62
    height = top + len(rows) * (ROW + 14) + 70
    desc = (
        f"TP={tp}、CP={cp} 的 {len(rows)} 个 rank：每个 TP rank 0 读一条长 {seq} 的序列，"
        f"在 TP 群里广播给其余 rank（{len(log)} 次 broadcast），之后每个 rank 按 CP 坐标留下 2 块。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(16, 16, title, size=13, bold=True)
    fig.text(x_full, 34, "get_batch_on_this_tp_rank 之后：tokens[0]", size=12, kind="muted")
    fig.text(x_kept, 34, kept_title, size=12, kind="muted")
    y_of = {}
    for i, (r, cp_rank, chunks, positions, tokens) in enumerate(rows):
        y = top + i * (ROW + 14)
        y_of[r] = y
        d = results[r]
        sender = d["coords"][0] == 0
        with fig.group(f"rank {r}"):
            fig.text(16, y + 12, f"rank {r}", size=13, bold=True)
            fig.text(
                16,
                y + 30,
                f"tp {d['coords'][0]} · cp {cp_rank} · {'读数据' if sender else '收广播'}",
                size=11,
                kind="muted",
            )
            for p, t in enumerate(full[r]):
                kind, faint = _chunk_kind(_owner(p, seq, cp))
                fig.boxed(
                    x_full + p * CELL,
                    y,
                    CELL - 2,
                    ROW - 10,
                    str(t),
                    kind,
                    faint=faint,
                    tip=f"rank {r} 位置 {p}",
                )
            fig.line(x_arrow, y + 15, x_kept - 12, y + 15, "muted", width=1.5, arrow=True)
            fig.text(x_arrow + 4, y + 30, f"留第 {', '.join(map(str, chunks))} 块", size=11, kind="muted")
            for j, (p, t) in enumerate(zip(positions, tokens)):
                kind, faint = _chunk_kind(_owner(p, seq, cp))
                fig.boxed(
                    x_kept + j * CELL,
                    y,
                    CELL - 2,
                    ROW - 10,
                    str(t),
                    kind,
                    faint=faint,
                    tip=f"rank {r} 留下 位置 {p} token {t}",
                )
    for p in range(seq):
        fig.text(x_full + p * CELL + (CELL - 2) / 2, top - 10, str(p), size=11, anchor="middle", kind="muted")
    # the broadcast: from each TP rank 0 to the other ranks of its TP group (same cp, same stage)
    for r, y in y_of.items():
        d = results[r]
        if d["coords"][0] != 0:
            continue
        for q, yq in y_of.items():
            e = results[q]
            if q != r and e["coords"][1:] == d["coords"][1:]:
                x = x_full - 14
                fig.line(x, y + 10, x, yq + 10, "comm", width=2, arrow=True)
                fig.text(x - 6, (y + yq) / 2 + 8, f"广播×{len(log)}", size=11, anchor="end")
    y = height - 46
    parts, last = [], None
    for name, shape, _ in log[:5]:  # a shape is written where it changes
        parts.append(name if list(shape) == last else f"{name} {list(shape)}")
        last = list(shape)
    fig.text(16, y, f"TP rank 0 依次广播：{' · '.join(parts)} · cu_seqlens ×{len(log) - 5}", size=11)
    x = fig.legend(16, height - 18, [("cp", "CP rank 0 的块")])
    fig.rect(x, height - 24, 12, 12, "cp", rx=2, faint=True)
    fig.text(x + 17, height - 18, "CP rank 1 的块")
    x += 17 + text_width("CP rank 1 的块", 12) + 16
    fig.line(x, height - 18, x + 22, height - 18, "comm", width=2, arrow=True)
    fig.text(x + 28, height - 18, "TP 群内 broadcast")
    fig.check()
    return fig


# ----------------------------------------------------------------------------- note 18: blending


def blend_rows(dataset_index, dataset_sample_index, names="ab") -> list[list]:
    """``[i, corpus, sample of that corpus]`` for every sample of a ``BlendedDataset``."""
    return [[i, names[int(d)], int(s)] for i, (d, s) in enumerate(zip(dataset_index, dataset_sample_index))]


def draw_blend(
    dataset_index, dataset_sample_index, weights, *, title: str, names="ab", prefix: int | None = None
) -> Figure:
    """The blend as a strip of samples; below it the first corpus' count minus ``weight · n``."""
    rows = blend_rows(dataset_index, dataset_sample_index, names)
    kinds = ("tp", "pp", "dp", "cp")
    n = len(rows)
    cell = 30
    left = 16
    width = left + n * cell + 16
    strip_y = 40
    chart_y, chart_h = strip_y + 70, 80
    height = chart_y + chart_h + 56
    desc = (
        f"BlendedDataset 的 {n} 个样本依次来自哪个语料（颜色），格里是该语料的第几个样本；"
        f"下方是前 n 个样本里来自 {names[0]} 的个数与 {weights[0]}·n 之差，始终在 ±1 之内。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(left, 16, title, size=13, bold=True)
    for i, name, k in rows:
        x = left + i * cell
        fig.boxed(
            x,
            strip_y,
            cell - 2,
            28,
            f"{name}{k}",
            kinds[names.index(name)],
            size=11,
            tip=f"样本 {i}: {name} 的第 {k} 个",
        )
        if i % 5 == 0:
            fig.text(x + (cell - 2) / 2, strip_y + 40, str(i), size=11, anchor="middle", kind="muted")
    # the error of the greedy interleave: count(first corpus in the first m) - w·m, for m = 1..n
    mid = chart_y + chart_h / 2
    scale = chart_h / 2
    fig.line(left, mid, left + n * cell, mid, "grid")
    for v in (-1, 1):
        fig.line(left, mid - v * scale, left + n * cell, mid - v * scale, "grid", dashed=True)
        fig.text(left + n * cell + 4 - 4, mid - v * scale - 9, f"{v:+d}", size=11, anchor="end", kind="muted")
    count, pts = 0, []
    for i, name, _ in rows:
        count += name == names[0]
        err = count - weights[0] * (i + 1)
        pts.append((left + i * cell + (cell - 2) / 2, mid - err * scale))
    d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    fig.path(d, "accent", width=2)
    fig.text(left, chart_y - 8, f"前 n 个样本里 {names[0]} 的个数 − {weights[0]}·n", size=11, kind="muted")
    items = [(kinds[j], f"语料 {nm}（权重 {w}）") for j, (nm, w) in enumerate(zip(names, weights))]
    fig.legend(left, height - 18, items + [("accent", "偏差")])
    fig.check()
    return fig


# ----------------------------------------------------------------------------- note 18: who reads a field

STAGE_NAMES = {"first": "首 stage", "middle": "中间 stage", "last": "尾 stage"}


def field_rows(stages, readers) -> list[list]:
    """``[field, model readers, then per stage: 读 / 给了没读 / 不给]``, fields in the model's order.

    ``stages``: per pipeline rank ``{"stage", "given", "read"}`` (what ``get_batch`` left the stage
    and what its model read); ``readers``: field -> the modules of a single-rank model that read it
    (``decoder.layers.0.self_attention.core_attention(attention_mask)``, ...).
    """
    order = ("tokens", "position_ids", "attention_mask", "labels", "loss_mask")
    rows = []
    for field in order:
        names = [name.split("(")[0].split(".")[-1] for name in readers[field]]
        counted = {name: names.count(name) for name in names}
        who = "，".join(f"{n} ×{k}" if k > 1 else n for n, k in counted.items()) or "模型里无人读"
        cells = [
            "读" if field in s["read"] else "给了没读" if field in s["given"] else "不给" for s in stages
        ]
        rows.append([field, who, *cells])
    return rows


def draw_fields(stages, readers, *, title: str) -> Figure:
    """One row per batch field: which module of the model reads it, and what each PP stage gets."""
    rows = field_rows(stages, readers)
    left, name_w, who_w, cell_w, row_h = 16, 120, 230, 104, 30
    x_who, x_cells = left + name_w, left + name_w + who_w
    content = x_cells + len(stages) * cell_w + 16
    width = max(content, text_width(title, 13) + 2 * left)
    top = 64
    height = top + len(rows) * row_h + 44
    desc = (
        "每一行是一个 batch 字段：中间一列是单 rank 模型里读它的模块，右边三列是 PP=3 时 get_batch 给每个 stage "
        "留下它没有、模型真读了没有。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(left, 16, title, size=13, bold=True)
    fig.text(x_who, 44, "GPTModel 里读它的模块", size=12, kind="muted")
    for j, s in enumerate(stages):
        fig.text(
            x_cells + j * cell_w + (cell_w - 6) / 2,
            44,
            STAGE_NAMES[s["stage"]],
            size=12,
            anchor="middle",
            kind="muted",
        )
    kinds = {"读": "fwd", "给了没读": "light", "不给": "paper"}
    for i, (field, who, *cells) in enumerate(rows):
        y = top + i * row_h
        with fig.group(field):
            fig.text(left, y + (row_h - 6) / 2, field, size=12, bold=True, mono=True)
            fig.text(
                x_who,
                y + (row_h - 6) / 2,
                who,
                size=11,
                mono=who != "模型里无人读",
                kind="ink" if who != "模型里无人读" else "accent",
            )
            for j, cell in enumerate(cells):
                x = x_cells + j * cell_w
                if cell == "不给":
                    fig.rect(x, y, cell_w - 6, row_h - 6, "paper", outline="grid", dashed=True)
                    fig.text(
                        x + (cell_w - 6) / 2,
                        y + (row_h - 6) / 2,
                        cell,
                        size=11,
                        anchor="middle",
                        kind="muted",
                    )
                else:
                    fig.boxed(
                        x,
                        y,
                        cell_w - 6,
                        row_h - 6,
                        cell,
                        kinds[cell],
                        size=11,
                        tip=f"{STAGE_NAMES[stages[j]['stage']]}：{field} {cell}",
                    )
    x = fig.legend(left, height - 18, [("fwd", "stage 拿到且模型读了"), ("light", "拿到但模型没读")])
    fig.rect(x, height - 24, 12, 12, "paper", rx=2, outline="grid", dashed=True)
    fig.text(x + 17, height - 18, "get_batch 不给（None）")
    fig.check()
    return fig
