"""Notes 07 and 21's picture: one global tensor's rows as saved, and as each loading rank reads them.

:func:`chunk_writers` says, from every saving rank's ``sharded_state_dict`` rows, which rank wrote
each stored chunk of a tensor (the rank holding that offset with an all-zero ``replica_id``).
:func:`draw_reshard` draws the tensor's rows (layer 0, the axis TP cuts) top to bottom: on the left
the chunks as saved, each in the color of the rank that wrote it; then, for each load, one bar per
loading rank spanning the rows it asked for, cut where its request crosses a saved chunk and
colored by the writer of the chunk each piece is read from. The rows are those of the note's
"wants" table (:func:`snippets.experiments.n07_checkpoint.wants_rows`).
"""

from __future__ import annotations

from snippets.ckpt.checkpoint_view import is_main_replica
from snippets.record.draw import Figure, text_width

WRITER_KINDS = ("tp", "pp", "dp", "cp", "ep", "edp", "emb", "fwd2")


def chunk_writers(rows_per_rank: list, local_key: str, chunks: list) -> list[tuple]:
    """``(offset, size, writer rank)`` for each stored chunk of ``local_key``'s global tensor that
    some rank's main replica covers, in chunk order (the rows of note 07's chunk table)."""
    main = {}
    for rank, rows in enumerate(rows_per_rank):
        for row in rows:
            if row[0] == local_key and is_main_replica(row[6]):
                main[tuple(row[5])] = rank
    return [(tuple(off), tuple(size), main[tuple(off)]) for off, size in chunks if tuple(off) in main]


def pieces(offset: int, size: int, writers: list, axis: int) -> list[tuple[int, int, int]]:
    """``(start, end, writer)``: the parts of rows ``[offset, offset + size)`` each saved chunk holds."""
    out = []
    for off, sz, rank in writers:
        lo, hi = max(offset, off[axis]), min(offset + size, off[axis] + sz[axis])
        if lo < hi:
            out.append((lo, hi, rank))
    return sorted(out)


def draw_reshard(writers: list, wants: list, *, title: str, axis: int = 1, scale: float = 5) -> Figure:
    """``writers`` from :func:`chunk_writers` (layer 0's chunks); ``wants`` the rows
    ``[label, rank, local shape, global offset, source chunks]`` of the note's table."""
    layer0 = [w for w in writers if w[0][0] == 0]
    total = max(off[axis] + size[axis] for off, size, _ in layer0)
    labels = list(dict.fromkeys(row[0] for row in wants))
    bar, gap, left, top = 44, 10, 16, 70
    save_w = 110
    group_w = [
        max(len([r for r in wants if r[0] == lab]) * (bar + gap), text_width(lab, 12) + 12) for lab in labels
    ]
    writers_seen = sorted({rank for _, _, rank in layer0})
    legend = [(WRITER_KINDS[r], f"保存时 rank {r} 写的块") for r in writers_seen]
    legend_w = sum(12 + 5 + text_width(name, 12) + 16 for _, name in legend)
    width = max(left + 40 + save_w + 40 + sum(group_w) + 40 * len(labels) + 16, left + legend_w + 16)
    height = top + total * scale + 64
    desc = (
        "一个全局 tensor 第 0 层的行（TP 切的那一维）从上到下：左边是保存时的块，颜色是写它的 rank；"
        "右边每根竖条是一个加载 rank 要的行，按它读自哪个保存块切段、上色。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(left, 16, title, size=13, bold=True)
    x_axis = left + 32
    for r in range(0, total + 1, max(1, total // 4)):
        fig.text(x_axis - 6, top + r * scale, str(r), size=11, anchor="end", kind="muted")
        fig.line(x_axis - 2, top + r * scale, x_axis + 2, top + r * scale, "muted")
    x = x_axis + 8
    fig.text(x, 40, "保存", size=12, bold=True)
    for off, size, rank in layer0:
        y, h = top + off[axis] * scale, size[axis] * scale
        fig.rect(
            x,
            y,
            save_w,
            h,
            WRITER_KINDS[rank],
            rx=0,
            outline="paper",
            tip=f"保存 rank {rank} 写 [{off[axis]}, {off[axis] + size[axis]})",
        )
        fig.text(x + save_w / 2, y + h / 2, f"rank {rank} 写", size=11, anchor="middle", kind="on")
    x += save_w + 40
    for lab, gw in zip(labels, group_w):
        fig.text(x, 40, lab, size=12, bold=True)
        for i, (_, rank, local, offset, _) in enumerate(r for r in wants if r[0] == lab):
            bx = x + i * (bar + gap)
            fig.text(bx + bar / 2, top - 8, f"r{rank}", size=11, anchor="middle", kind="muted")
            size = local[axis - (len(offset) - len(local))]
            for lo, hi, writer in pieces(offset[axis], size, layer0, axis):
                fig.rect(
                    bx,
                    top + lo * scale,
                    bar,
                    (hi - lo) * scale,
                    WRITER_KINDS[writer],
                    rx=0,
                    outline="paper",
                    tip=f"{lab} rank {rank} 读 [{lo}, {hi}) 自 rank {writer}",
                )
        x += gw + 40
    fig.legend(left, height - 18, legend)
    fig.check()
    return fig


# ----------------------------------------------------------------------------- note 21: who writes what


def written_blocks(qkv_rows) -> list[tuple]:
    """``(rank, layer, row start, row end)`` of every piece with an all-zero ``replica_id`` in the
    rows of note 21's ``qkv_table`` (rank, coords, key, global shape, local shape, offset, frag, replica_id)."""
    return [
        (row[0], row[5][0], row[5][1], row[5][1] + row[4][0]) for row in qkv_rows if is_main_replica(row[7])
    ]


def tp1_requests(qkv_rows) -> list[tuple]:
    """What a TP=1 loader with the same PP asks for: each stage's rank wants whole layers of that stage."""
    layers = sorted({(row[1][1], row[5][0]) for row in qkv_rows})
    rows_total = qkv_rows[0][3][1]
    return [(f"pp {pp} 的 rank", layer, 0, rows_total) for pp, layer in layers]


def draw_replica_grid(qkv_rows, *, title: str, scale: float = 3) -> Figure:
    """Left: the TP × PP × DP grid, each rank's piece and ``replica_id``, writers filled. Right: the
    global tensor's blocks by writer, and the pieces a TP=1 loader (same PP) reads from them."""
    blocks = written_blocks(qkv_rows)
    writer_kind = {rank: WRITER_KINDS[i] for i, (rank, *_) in enumerate(blocks)}
    coords = {row[0]: row[1] for row in qkv_rows}  # (tp, pp, dp)
    tps = sorted({c[0] for c in coords.values()})
    pps = sorted({c[1] for c in coords.values()})
    dps = sorted({c[2] for c in coords.values()})
    cw, ch, left, top = 116, 56, 56, 60
    grid_w = len(dps) * len(tps) * (cw + 6)
    rows_total = qkv_rows[0][3][1]
    bar_h = rows_total * scale
    x_right = left + grid_w + 40
    requests = tp1_requests(qkv_rows)
    col = 64
    width = x_right + (len(pps) + len(requests)) * col + 40 + 16
    height = max(top + len(pps) * (ch + 8), top + bar_h + 20) + 56
    desc = (
        "左：TP×PP×DP 的每个 rank 持有的 linear_qkv.weight 片与 replica_id，实心 = 全 0、真正写进文件的那份；"
        "右：全局 tensor 按层、按行分成的块（颜色 = 写它的 rank），以及 TP=1 的加载方每个 rank 读哪几块。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(16, 16, title, size=13, bold=True)
    for j, (dp, tp) in enumerate((dp, tp) for dp in dps for tp in tps):
        fig.text(
            left + j * (cw + 6) + cw / 2,
            top - 12,
            f"dp {dp} · tp {tp}",
            size=11,
            anchor="middle",
            kind="muted",
        )
    for i, pp in enumerate(pps):
        fig.text(16, top + i * (ch + 8) + ch / 2, f"pp {pp}", size=12, bold=True)
    for row in qkv_rows:
        rank, (tp, pp, dp) = row[0], row[1]
        x = left + (dps.index(dp) * len(tps) + tps.index(tp)) * (cw + 6)
        y = top + pps.index(pp) * (ch + 8)
        main = is_main_replica(row[7])
        with fig.group(f"rank {rank} {'写' if main else '副本'}"):
            if main:
                fig.rect(x, y, cw, ch, writer_kind[rank], rx=3)
            else:
                fig.rect(x, y, cw, ch, "light", rx=3, outline="grid", dashed=True)
            ink = "on" if main else "ink"
            fig.text(x + 8, y + 13, f"rank {rank}", size=12, bold=True, kind=ink)
            fig.text(
                x + 8, y + 29, f"层 {row[5][0]} · 行 {row[5][1]}–{row[5][1] + row[4][0]}", size=11, kind=ink
            )
            fig.text(x + 8, y + 44, f"replica {tuple(row[7])}", size=11, kind=ink if main else "muted")
    # the global tensor, one column per layer, then the TP=1 loader's requests
    for k, pp in enumerate(pps):
        layer = next(row[5][0] for row in qkv_rows if row[1][1] == pp)
        x = x_right + k * col
        fig.text(x + 22, top - 12, f"层 {layer}", size=11, anchor="middle", kind="muted")
        for rank, lay, lo, hi in blocks:
            if lay == layer:
                fig.rect(
                    x,
                    top + lo * scale,
                    44,
                    (hi - lo) * scale,
                    writer_kind[rank],
                    rx=0,
                    outline="paper",
                    tip=f"层 {lay} 行 [{lo}, {hi}) 由 rank {rank} 写",
                )
                fig.text(x + 22, top + (lo + hi) / 2 * scale, f"r{rank}", size=11, anchor="middle", kind="on")
    fig.text(x_right, top - 34, "全局 [层, 行]", size=12, bold=True)
    x0 = x_right + len(pps) * col + 40
    fig.text(x0, top - 34, "TP=1 加载", size=12, bold=True)
    for k, (label, layer, lo, hi) in enumerate(requests):
        x = x0 + k * col
        fig.text(x + 22, top - 12, f"层 {layer}", size=11, anchor="middle", kind="muted")
        for rank, lay, b_lo, b_hi in blocks:
            a, b = max(lo, b_lo), min(hi, b_hi)
            if lay == layer and a < b:
                fig.rect(
                    x,
                    top + a * scale,
                    44,
                    (b - a) * scale,
                    writer_kind[rank],
                    rx=0,
                    outline="paper",
                    tip=f"TP=1 {label} 读 层 {layer} 行 [{a}, {b}) 自 rank {rank}",
                )
    y = height - 34
    fig.legend(16, y, [(writer_kind[r], f"rank {r} 写的块") for r, *_ in blocks])
    fig.rect(16, y + 14, 12, 12, "light", rx=2, outline="grid", dashed=True)
    fig.text(33, y + 20, "副本（replica_id 不全为 0，不写）", size=12)
    fig.check()
    return fig
