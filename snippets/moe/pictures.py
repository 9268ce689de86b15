"""Note 17's picture: tokens -> experts -> EP ranks, for the alltoall and the allgather dispatcher.

:func:`draw_dispatch` takes, for one EP group, the rows of note 17's ``flow_table`` (what each
rank's router chose, and the ``input_splits`` the alltoall dispatcher sent to each EP rank), of
``tokens_table`` (what each local expert received, per dispatcher) and the allgather
dispatcher's record (``dispatch_table``). Left: every rank sends each EP rank exactly the rows
routed to that rank's experts. Right: every rank all-gathers all the group's tokens and keeps, per
local expert, the same rows. Hover titles name the data each arrow and box comes from.
"""

from __future__ import annotations

from snippets.record.draw import Figure

RANK_KINDS = ("tp", "fwd2", "edp", "mem")


def rank_kind(r: int) -> str:
    return RANK_KINDS[r % len(RANK_KINDS)]


def _box(fig, x, y, w, h, lines, kind, tip):
    fig.rect(x, y, w, h, kind, tip=tip)
    ink = "on" if kind == "tp" else "ink"
    for k, line in enumerate(lines):
        fig.text(x + 8, y + h / 2 + (k - (len(lines) - 1) / 2) * 16, line, kind=ink, size=11, bold=k == 0)


def draw_dispatch(
    flow_rows: list[list],
    token_rows: list[list],
    allgather_rows: list[list],
    topk: int = 2,
    title: str | None = None,
) -> Figure:
    """Note 17 (see the module docstring): ``flow_rows`` / ``token_rows`` of one EP group, in
    EP-rank order; ``allgather_rows`` the allgather dispatcher's record on the group's first rank;
    ``title`` what the note concludes from it (a plain description by default)."""
    ep = len(flow_rows)
    src_w, dst_w, gap, box_h, pitch = 190, 200, 120, 40, 96
    panel = src_w + gap + dst_w
    top = 58
    width = 12 + 2 * panel + 40 + 12
    height = top + (ep - 1) * pitch + box_h + 34
    fig = Figure(
        width,
        height,
        title=title or f"token → expert → EP rank：alltoall 与 allgather 两种 dispatcher（EP={ep}）",
        desc="左：alltoall 只把选中某个 EP rank 上 expert 的 (token, expert) 行发给它，箭头上是行数（input_splits）；"
        "右：allgather 让每个 rank 收下群里的全部 token，再由本地 expert 挑出自己的行。",
    )
    gathered = next(r for r in allgather_rows if r[1] == "forward" and "全部 token" in r[6])
    for p, name in enumerate(("alltoall", "allgather")):
        x0 = 12 + p * (panel + 40)
        fig.text(x0, 14, f"{name} dispatcher", bold=True)
        for i, row in enumerate(flow_rows):
            rank, chosen = row[0], row[2]
            y = top + i * pitch
            tokens = sum(chosen) // topk
            _box(
                fig,
                x0,
                y,
                src_w,
                box_h,
                [f"rank {rank} · {tokens} token × top-{topk}", f"选中 expert：{chosen}"],
                rank_kind(i),
                tip=f"{name} | rank {rank} | router | {chosen}",
            )
        for j, row in enumerate(token_rows):
            rank, local = row[0], row[1]
            got = row[2] if name == "alltoall" else row[3]
            y = top + j * pitch
            experts = ", ".join(str(e) for e in local)
            _box(
                fig,
                x0 + src_w + gap,
                y,
                dst_w,
                box_h,
                [f"rank {rank} · expert {experts}", f"各 expert 收到 {got}，共 {sum(got)} 行"],
                rank_kind(j),
                tip=f"{name} | rank {rank} | experts {local} | {got}",
            )
        if name == "alltoall":
            for i, row in enumerate(flow_rows):
                for j, n in enumerate(row[3]):
                    y1 = top + i * pitch + box_h / 2
                    y2 = top + j * pitch + box_h / 2 + (j - i) * -6
                    x1, x2 = x0 + src_w + 2, x0 + src_w + gap - 2
                    with fig.group(tip=f"alltoall | rank {row[0]} → EP rank {j} | {n}"):
                        fig.line(x1, y1, x2, y2, "comm", width=1.5, arrow=True)
                        if i == j:
                            lx, ly = x1 + 0.55 * (x2 - x1), y1 + 0.55 * (y2 - y1) - 9
                        else:
                            lx, ly = x1 + 0.2 * (x2 - x1) + 16, y1 + 0.2 * (y2 - y1) + (-4 if j > i else 4)
                        fig.text(lx, ly, f"{n} 行", size=11, anchor="middle")
        else:
            mx, mw = x0 + src_w + 16, gap - 32
            span = (ep - 1) * pitch + box_h
            fig.rect(mx, top, mw, span, "comm", tip=f"allgather | {gathered[2]} | {gathered[4]}")
            fig.text(mx + mw / 2, top + span / 2 - 9, "all-gather", anchor="middle", size=11)
            fig.text(mx + mw / 2, top + span / 2 + 9, gathered[4].split(" → ")[1], anchor="middle", size=11)
            for i in range(ep):
                y = top + i * pitch + box_h / 2
                fig.line(x0 + src_w + 2, y, mx - 1, y, "comm", width=1.5, arrow=True)
                fig.line(mx + mw, y, x0 + src_w + gap - 2, y, "comm", width=1.5, arrow=True)
    fig.text(
        12,
        height - 12,
        "反向沿原路返回：alltoall 再做一次 all-to-all（split 对调），allgather 变成 reduce-scatter。",
        size=11,
        kind="muted",
    )
    fig.check()
    return fig


def dispatch_tips(flow_rows: list[list], token_rows: list[list], allgather_rows: list[list]) -> list[str]:
    """The hover titles :func:`draw_dispatch` gives, rebuilt from the tables' rows."""
    gathered = next(r for r in allgather_rows if r[1] == "forward" and "全部 token" in r[6])
    tips = []
    for name in ("alltoall", "allgather"):
        tips += [f"{name} | rank {row[0]} | router | {row[2]}" for row in flow_rows]
        tips += [
            f"{name} | rank {row[0]} | experts {row[1]} | {row[2] if name == 'alltoall' else row[3]}"
            for row in token_rows
        ]
        if name == "alltoall":
            tips += [
                f"alltoall | rank {row[0]} → EP rank {j} | {n}"
                for row in flow_rows
                for j, n in enumerate(row[3])
            ]
        else:
            tips.append(f"allgather | {gathered[2]} | {gathered[4]}")
    return tips
