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
    group_w = [max(len([r for r in wants if r[0] == lab]) * (bar + gap), text_width(lab, 12) + 12) for lab in labels]
    writers_seen = sorted({rank for _, _, rank in layer0})
    legend = [(WRITER_KINDS[r], f"保存时 rank {r} 写的块") for r in writers_seen]
    legend_w = sum(12 + 5 + text_width(name, 12) + 16 for _, name in legend)
    width = max(left + 40 + save_w + 40 + sum(group_w) + 40 * len(labels) + 16, left + legend_w + 16)
    height = top + total * scale + 64
    desc = ("一个全局 tensor 第 0 层的行（TP 切的那一维）从上到下：左边是保存时的块，颜色是写它的 rank；"
            "右边每根竖条是一个加载 rank 要的行，按它读自哪个保存块切段、上色。")
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
        fig.rect(x, y, save_w, h, WRITER_KINDS[rank], rx=0, outline="paper",
                 tip=f"保存 rank {rank} 写 [{off[axis]}, {off[axis] + size[axis]})")
        fig.text(x + save_w / 2, y + h / 2, f"rank {rank} 写", size=11, anchor="middle", kind="on")
    x += save_w + 40
    for lab, gw in zip(labels, group_w):
        fig.text(x, 40, lab, size=12, bold=True)
        for i, (_, rank, local, offset, _) in enumerate(r for r in wants if r[0] == lab):
            bx = x + i * (bar + gap)
            fig.text(bx + bar / 2, top - 8, f"r{rank}", size=11, anchor="middle", kind="muted")
            size = local[axis - (len(offset) - len(local))]
            for lo, hi, writer in pieces(offset[axis], size, layer0, axis):
                fig.rect(bx, top + lo * scale, bar, (hi - lo) * scale, WRITER_KINDS[writer], rx=0,
                         outline="paper", tip=f"{lab} rank {rank} 读 [{lo}, {hi}) 自 rank {writer}")
        x += gw + 40
    fig.legend(left, height - 18, legend)
    fig.check()
    return fig
