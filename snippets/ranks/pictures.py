"""Notes 02 and 08's picture: the rank grid laid out by the ``order`` string, with a few ranks' groups.

A :class:`Panel` is what one run (or one ``RankGenerator``) says about a few highlighted ranks under
one ``order``: each rank's coordinates and the members of its tp / dp / pp groups. The same panels
give the note's table (:func:`panel_rows`) and the picture (:func:`draw_rank_grid`), so the picture
shows exactly the groups the table prints.

The picture puts the ranks in reading order, ``per_row`` to a row (8 = one machine of 8 GPUs), and
draws each highlighted group as a bus in its kind's color: a line with a tick down (or up) to every
member. A group inside one machine runs above (first row) or below (last row) the boxes; a group
that crosses machines runs in the gap between the rows, so which traffic leaves a machine under an
``order`` is what one sees first.
"""

from __future__ import annotations

from dataclasses import dataclass

from snippets.ranks.groups import coordinates
from snippets.record.draw import Figure, text_width
from snippets.record.tables import Table

KINDS = ("tp", "dp", "pp")
"""The group kinds a panel draws, nearest the boxes first."""

BW, BH, GAP = 48, 40, 6  # rank box width, height, gap between boxes
LEVEL = 8  # vertical distance between the buses of two kinds
BAND = LEVEL * len(KINDS) + 8  # height of a bus band (above, between, below the rows)
PANEL_GAP = 36


@dataclass(frozen=True)
class Panel:
    """A few ranks' groups under one ``order``: ``groups[rank][kind]`` lists the members."""

    order: str
    sizes: dict
    groups: dict

    @property
    def world(self) -> int:
        n = 1
        for v in self.sizes.values():
            n *= v
        return n

    def coords(self, rank: int) -> dict:
        """``{tp, dp, pp}`` of ``rank`` (the mixed-radix digits along ``order``)."""
        order = "-".join(dict.fromkeys(self.order.split("-") + list(self.sizes)))
        c = coordinates(rank, self.sizes, order)
        return {k: c[k] for k in KINDS}


def panel_from_generator(gen, ranks=(5, 13), order: str | None = None) -> Panel:
    """A panel from a real ``RankGenerator``: each rank's group of each kind from ``get_ranks``."""
    sizes = {k: getattr(gen, k) for k in ("tp", "cp", "ep", "dp", "pp")}
    groups = {r: {k: next(g for g in gen.get_ranks(k) if r in g) for k in KINDS} for r in ranks}
    return Panel(order or gen.order, sizes, groups)


def panel_from_described(described: list[dict], order: str, sizes: dict, ranks=(5, 13)) -> Panel:
    """A panel from a run: ``described`` is every rank's ``describe_rank()`` under ``order``."""
    by_rank = {d["rank"]: d for d in described}
    return Panel(order, dict(sizes), {r: {k: list(by_rank[r]["groups"][k]) for k in KINDS} for r in ranks})


def coord_text(c: dict) -> str:
    return " ".join(f"{k[0]}{c[k]}" for k in KINDS)


def panel_rows(panels: list[Panel]) -> list[list]:
    """The table the picture illustrates: order, rank, (tp dp pp) coordinates, its three groups."""
    return [
        [p.order, r, coord_text(p.coords(r)), *(p.groups[r][k] for k in KINDS)]
        for p in panels
        for r in p.groups
    ]


def panel_table(panels: list[Panel]) -> Table:
    return Table(["order", "rank", "坐标", "tp 群", "dp 群", "pp 群"], panel_rows(panels))


def _bus_y(rows_of_members: set, kind: int, top: float, rows: int) -> tuple[float, str]:
    """Where a group's bus runs and which way its ticks go: ``up`` = ticks rise from the bus."""
    lo, hi = min(rows_of_members), max(rows_of_members)
    row_y = lambda r: top + BAND + r * (BH + BAND)  # noqa: E731
    if lo != hi:  # crosses machines: in the band below row lo
        return row_y(lo) + BH + BAND / 2 + (kind - 1) * LEVEL, "both"
    if lo == rows - 1 and rows > 1:  # last row: below it
        return row_y(lo) + BH + 6 + kind * LEVEL, "up"
    return row_y(lo) - 6 - kind * LEVEL, "down"  # first (or only) row: above it


def _draw_panel(fig: Figure, p: Panel, x0: float, y0: float, per_row: int) -> None:
    rows = -(-p.world // per_row)
    fig.text(x0, y0, f"order = {p.order}", size=13, bold=True, mono=True)
    top = y0 + 12

    def centre(r):
        return (x0 + (r % per_row) * (BW + GAP) + BW / 2, top + BAND + (r // per_row) * (BH + BAND))

    marked = set(p.groups)
    for r in range(p.world):
        cx, y = centre(r)
        kind = "accent" if r in marked else "light"
        with fig.group(f"rank {r}"):
            fig.rect(
                cx - BW / 2,
                y,
                BW,
                BH,
                kind,
                outline=None if r in marked else "grid",
                tip=f"rank {r}: {coord_text(p.coords(r))}",
            )
            ink = "on" if r in marked else "ink"
            fig.text(cx, y + 13, str(r), size=13, anchor="middle", bold=True, kind=ink)
            fig.text(
                cx,
                y + 29,
                coord_text(p.coords(r)).replace(" ", ""),
                size=11,
                anchor="middle",
                kind=ink if r in marked else "muted",
            )
    seen = set()
    for groups in p.groups.values():
        for i, k in enumerate(KINDS):
            members = tuple(groups[k])
            if (k, members) in seen or len(members) < 2:
                continue
            seen.add((k, members))
            y, way = _bus_y({m // per_row for m in members}, i, top, rows)
            # each kind's ticks land at its own x inside a box, so a rank's three groups stay apart
            xs = [centre(m)[0] + (i - 1) * 12 for m in members]
            with fig.group(f"{k} {list(members)}"):
                fig.line(min(xs), y, max(xs), y, k, width=3)
                for m, x in zip(members, xs):
                    by = centre(m)[1]
                    end = by if by > y else by + BH
                    fig.line(x, y, x, end, k, width=2)


def draw_rank_grid(panels: list[Panel], *, title: str, per_row: int = 8) -> Figure:
    """The panels side by side; each highlighted rank filled, its tp / dp / pp groups as buses."""
    pw = per_row * (BW + GAP) - GAP
    rows = max(-(-p.world // per_row) for p in panels)
    grid_h = BAND + rows * (BH + BAND)
    n_lines = max(len(p.groups) for p in panels)
    width = 16 + len(panels) * pw + (len(panels) - 1) * PANEL_GAP + 16
    height = 20 + 12 + grid_h + 10 + 20 * n_lines + 34
    desc = (
        "每个方框是一个 rank，按 rank 号每行 " + str(per_row) + " 个（一行 = 一台机器）；"
        "红色方框是要看的 rank，彩色线把它的 tp、dp、pp 群连起来。跨机器的群画在两行之间。"
    )
    fig = Figure(width, height, title=title, desc=desc)
    for i, p in enumerate(panels):
        x0 = 16 + i * (pw + PANEL_GAP)
        _draw_panel(fig, p, x0, 20, per_row)
        y = 20 + 12 + grid_h + 12
        for r, groups in p.groups.items():
            x = x0
            fig.text(x, y, f"rank {r}", size=12, bold=True)
            x += text_width(f"rank {r}", 12) + 10
            for k in KINDS:
                s = f"{k} {groups[k]}"
                fig.text(x, y, s, size=12, kind=k, mono=True)
                x += text_width(s, 12) + 10
            y += 20
    fig.legend(16, height - 16, [(k, f"{k} 群") for k in KINDS] + [("accent", "要看的 rank")])
    fig.check()
    return fig
