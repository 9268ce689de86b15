"""Notes 02 / 08's rank-grid picture: it draws exactly the groups its table prints."""

from __future__ import annotations

import re

import pytest

from snippets.ranks.pictures import (
    Panel,
    draw_rank_grid,
    panel_from_described,
    panel_from_generator,
    panel_rows,
)

ORDERS = ("tp-cp-ep-dp-pp", "dp-tp-pp")


def seed_panels(orders=ORDERS):
    from megatron.core.parallel_state import RankGenerator

    return [
        panel_from_generator(RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1, order=o), (5, 13), order=o)
        for o in orders
    ]


def drawn(svg: str) -> tuple[set, set]:
    """What the SVG shows: the groups drawn as buses ``(kind, members)``, and the filled ranks."""
    buses = {
        (k, tuple(int(m) for m in members.split(", ")))
        for k, members in re.findall(r'data-name="(tp|dp|pp) \[([0-9, ]+)\]"', svg)
    }
    marked = set(
        int(r) for r in re.findall(r'<g data-name="rank (\d+)">\n\s*<rect [^>]*class="f-accent', svg)
    )
    return buses, marked


def test_seed_000_rows():
    """The table rows are seed 000's: rank 5 in [4, 5], [1, 3, 5, 7], [5, 13]."""
    rows = panel_rows(seed_panels())
    assert rows[0] == ["tp-cp-ep-dp-pp", 5, "t1 d2 p0", [4, 5], [1, 3, 5, 7], [5, 13]]
    assert rows[1] == ["tp-cp-ep-dp-pp", 13, "t1 d2 p1", [12, 13], [9, 11, 13, 15], [5, 13]]
    assert rows[2][3:] == [[1, 5], [4, 5, 6, 7], [5, 13]]


def test_picture_draws_the_table_groups():
    panels = seed_panels()
    rows = panel_rows(panels)
    fig = draw_rank_grid(panels, title="t")
    svg = fig.svg()
    # split the SVG by panel: each panel's heading starts its part
    parts = svg.split("order = ")[1:]
    assert len(parts) == len(panels)
    for part, panel in zip(parts, panels):
        buses, marked = drawn(part)
        expected = {
            (k, tuple(r[3 + i]))
            for r in rows
            if r[0] == panel.order
            for i, k in enumerate(("tp", "dp", "pp"))
        }
        assert buses == expected
        assert marked == {5, 13}


def test_two_renders_are_byte_identical_and_legible():
    a = draw_rank_grid(seed_panels(), title="t")
    b = draw_rank_grid(seed_panels(), title="t")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
    assert not re.search(r"0x[0-9a-fA-F]{6,}", repr(a))  # no memory address (nbval compares it)


def test_panel_from_a_run_equals_the_generator():
    """A run's ``describe_rank`` results give the same panel as ``RankGenerator`` (the groups a
    rank reports are read from the generator here, as parallel_state builds them)."""
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=2, ep=1, dp=4, pp=2, cp=1, order="tp-cp-ep-pp-dp")
    described = [
        {"rank": r, "groups": {k: next(g for g in gen.get_ranks(k) if r in g) for k in ("tp", "dp", "pp")}}
        for r in range(16)
    ]
    sizes = dict(tp=2, cp=1, ep=1, dp=4, pp=2)
    assert panel_from_described(described, gen.order, sizes) == panel_from_generator(gen)


def test_a_wrong_group_changes_the_drawing():
    """The check above can fail: a panel whose rank 5 claims another dp group draws another bus."""
    good = seed_panels()[0]
    bad = Panel(good.order, good.sizes, {**good.groups, 5: {**good.groups[5], "dp": [0, 2, 4, 6]}})
    buses, _ = drawn(draw_rank_grid([bad], title="t").svg())
    assert ("dp", (1, 3, 5, 7)) not in buses and ("dp", (0, 2, 4, 6)) in buses


def test_overlapping_labels_are_refused():
    with pytest.raises(ValueError):
        fig = draw_rank_grid(seed_panels(), title="t")
        fig.text(16, 20, "overlapping heading", size=13)
        fig.check()
