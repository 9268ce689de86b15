"""The pictures and lists of the link graph (part of hooks/backlinks.py).

Both graphs are drawn with snippets.record.draw (the site's one drawing layer: palette as CSS
variables, byte-stable output, a legibility check). A page is a box that links to it; an edge is a
curve with an arrow from the page that holds the link to the page it points at. Boxes and edges are
drawn as named groups, then given their link and hover classes here. The same neighbours are also
given as lists, which a phone shows instead of the picture.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from link_graph import LinkGraph
from mkdocs.utils import get_relative_url

from snippets.record.draw import Figure
from snippets.record.draw import text_width as _draw_width

FONT = 12
NODE_H, ROW, HEAD, PAD = 24, 30, 26, 8


def text_width(s: str) -> float:
    return _draw_width(s, FONT)


def fit(s: str, width: float) -> str:
    if text_width(s) <= width:
        return s
    while s and text_width(s + "…") > width:
        s = s[:-1]
    return s.rstrip() + "…"


@dataclass
class Box:
    key: str
    label: str
    title: str
    href: str | None  # None: not a link (this page, in its own neighbourhood)
    kind: str  # css class: lg-note, lg-page (not a note), lg-self
    url: str = ""  # page.url, for data-page
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0


def _curve(s: Box, t: Box) -> str:
    """An edge from box s to box t: between columns a horizontal S-curve, inside one column an
    arc that bulges out on the right (downwards) or the left (upwards)."""
    sy, ty = s.y + NODE_H / 2, t.y + NODE_H / 2
    if abs(s.x - t.x) > 1:
        right = s.x < t.x
        sx, tx = (s.x + s.w, t.x) if right else (s.x, t.x + t.w)
        dx = (tx - sx) / 2
        return f"M{sx:.1f},{sy:.1f} C{sx + dx:.1f},{sy:.1f} {tx - dx:.1f},{ty:.1f} {tx:.1f},{ty:.1f}"
    down = s.y < t.y
    side = s.x + s.w if down else s.x
    k = min(40.0, 12 + abs(ty - sy) * 0.12) * (1 if down else -1)
    return f"M{side:.1f},{sy:.1f} C{side + k:.1f},{sy:.1f} {side + k:.1f},{ty:.1f} {side:.1f},{ty:.1f}"


def draw(
    columns: list[list[tuple[str, list[Box]]]],
    edges: list[tuple[str, str, str]],
    *,
    uid: str,
    title: str,
    desc: str,
    col_w: float,
    gap: float,
    hover: bool = False,
    extra_height: float = 0,
    after=None,
) -> str:
    """Columns of titled groups of boxes; edges (source key, target key, tooltip) between them.
    ``after(fig, y)`` may draw more below the columns (``extra_height`` px are reserved)."""
    heights = [sum(HEAD + len(boxes) * ROW for _, boxes in col) for col in columns]
    width = 2 * PAD + len(columns) * col_w + (len(columns) - 1) * gap
    height = PAD + max(heights + [ROW]) + extra_height + PAD
    fig = Figure(width, height, title=title, desc=desc)
    boxes: dict[str, Box] = {}
    for c, col in enumerate(columns):
        x, y = PAD + c * (col_w + gap), PAD
        for head, group in col:
            fig.text(x + 2, y + HEAD / 2 + 2, fit(head, col_w - 4), kind="muted", bold=True)
            y += HEAD
            if not group:
                fig.text(x + 10, y + NODE_H / 2, "（无）", kind="muted")
                y += ROW
            for box in group:
                box.x, box.y, box.w = x, y, col_w
                boxes[box.key] = box
                y += ROW
    index = {key: i for i, key in enumerate(boxes)}
    for a, b, tip in edges:
        with fig.group(f"edge:{index[a]}:{index[b]}", tip=tip):
            fig.path(_curve(boxes[a], boxes[b]), "muted", arrow=True)
    for key, box in boxes.items():
        fill = "tp" if box.kind == "lg-self" else "light"
        with fig.group(f"node:{index[key]}", tip=box.title):
            fig.rect(
                box.x,
                box.y,
                box.w,
                NODE_H,
                fill,
                outline=None if fill == "tp" else ("tp" if box.kind == "lg-note" else "grid"),
                rx=4,
                dashed=box.kind == "lg-page",
            )
            fig.text(
                box.x + 8,
                box.y + NODE_H / 2,
                fit(box.label, box.w - 14),
                kind="on" if fill == "tp" else "ink",
                bold=box.kind == "lg-self",
            )
    if after is not None:
        after(fig, PAD + max(heights + [ROW]))
    fig.check()
    out = fig.svg()
    out = out.replace('class="ms-figure"', f'class="ms-figure lg-svg" id="{uid}"', 1)
    keys = list(boxes)

    def node(m: re.Match) -> str:
        box = boxes[keys[int(m.group(1))]]
        cls = f"lg-node {box.kind} n{m.group(1)}"
        page = html.escape(box.url)
        if box.href is None:
            return f'<g class="{cls}" data-page="{page}">{m.group(2)}</g>'
        return (
            f'<a class="{cls}" href="{html.escape(box.href)}" data-page="{page}" '
            f'aria-label="{html.escape(box.title)}">{m.group(2)}</a>'
        )

    def edge(m: re.Match) -> str:
        s, t = boxes[keys[int(m.group(1))]], boxes[keys[int(m.group(2))]]
        return (
            f'<g class="lg-edge s{m.group(1)} t{m.group(2)}" data-source="{html.escape(s.url)}" '
            f'data-target="{html.escape(t.url)}">'
        )

    out = re.sub(r'<g data-name="node:(\d+)">(.*?)</g>', node, out, flags=re.S)
    out = re.sub(r'<g data-name="edge:(\d+):(\d+)">', edge, out)
    if hover:  # hovering (or tabbing to) a page lights up its own links
        rules = ",\n".join(
            f"#{uid}:has(.n{i}:hover, .n{i}:focus-visible) :is(.s{i}, .t{i}) path" for i in range(len(boxes))
        )
        out = out.replace(
            "</style>", rules + "{stroke:var(--md-accent-fg-color);opacity:1;stroke-width:2}</style>", 1
        )
    return out


def page_href(target_url: str, from_url: str) -> str:
    rel = get_relative_url(target_url, from_url)
    # get_relative_url drops the slash of a directory URL ("../.."), and "" means the home page
    if target_url == "" or target_url.endswith("/"):
        rel = rel.rstrip("/") + "/"
    return rel


def _box(graph: LinkGraph, url: str, from_url: str, key: str | None = None) -> Box:
    n = graph.nodes[url]
    return Box(
        key or url, n.label, n.title, page_href(url, from_url), "lg-note" if n.is_note else "lg-page", url
    )


def _packed(groups: list[tuple[str, list]]) -> list[list[tuple[str, list]]]:
    """Groups into columns, in order; small groups share a column (no column taller than the
    largest group plus a few rows), so the picture stays within ~1,000 px."""
    cap = max([len(g) for _, g in groups] + [1]) + 4
    columns: list[list[tuple[str, list]]] = []
    for title, group in groups:
        if columns and sum(len(g) + 1 for _, g in columns[-1]) + len(group) + 1 <= cap:
            columns[-1].append((title, group))
        else:
            columns.append([(title, group)])
    return columns


def drawn_pages(graph: LinkGraph) -> list[str]:
    return [u for u, n in graph.nodes.items() if not n.hub]


def full_graph_svg(graph: LinkGraph, from_url: str) -> str:
    shown = set(drawn_pages(graph))
    groups = [
        (g, [_box(graph, u, from_url) for u, n in graph.nodes.items() if n.group == g and u in shown])
        for g in graph.groups
    ]
    groups = [(g, b) for g, b in groups if b]
    edges = [
        (s, t, f"{graph.nodes[s].title} → {graph.nodes[t].title}（{n} 处链接）")
        for s, t, n in graph.edges()
        if s in shown and t in shown
    ]
    return draw(
        _packed(groups),
        edges,
        uid="lg-site",
        col_w=250,
        gap=100,
        hover=True,
        title="全站关系图谱",
        desc="页面按轮次分列，箭头从写下链接的页面指向被链接的页面；首页、自测题库和 30 秒英文回答"
        "链接每一篇笔记，不画在图里。",
    )


def neighbours(graph: LinkGraph, url: str) -> tuple[list[str], list[str], list[str]]:
    """前置 (linked pages that come before this one in the nav: what it builds on), 后续 (linked
    pages after it: what builds on it), 同主题 (the nearest unlinked notes of its round)."""
    order = {u: i for i, u in enumerate(graph.nodes)}
    me = graph.nodes[url]
    linked = {u for u in graph.backlinks(url) + graph.forward(url) if not graph.nodes[u].hub}
    before = sorted((u for u in linked if order[u] < order[url]), key=order.get)
    after = sorted((u for u in linked if order[u] > order[url]), key=order.get)
    same = []
    if me.is_note:
        peers = [
            u
            for u, n in graph.nodes.items()
            if n.is_note and n.group == me.group and u != url and u not in linked
        ]
        same = sorted(sorted(peers, key=lambda u: abs(order[u] - order[url]))[:4], key=order.get)
    return before, after, same


def neighbourhood_svg(graph: LinkGraph, url: str) -> str:
    me = graph.nodes[url]
    before, after, same = neighbours(graph, url)
    left = [_box(graph, u, url, "pre:" + u) for u in before]
    right = [_box(graph, u, url, "post:" + u) for u in after]
    center = Box("self", me.label, me.title, None, "lg-self", url)
    edges = []
    for box in left + right:
        if box.url in graph.links.get(url, {}):
            edges.append(("self", box.key, f"本页 → {box.title}"))
        if url in graph.links.get(box.url, {}):
            edges.append((box.key, "self", f"{box.title} → 本页"))
    peers = [_box(graph, u, url, "same:" + u) for u in same]
    col_w, gap = 230, 56
    per_row = 3
    rows = -(-len(peers) // per_row)

    def same_topic(fig, y):
        if not peers:
            return
        fig.text(PAD + 2, y + HEAD / 2 + 2, "同主题（同一轮，没有互相链接）", kind="muted", bold=True)
        for k, box in enumerate(peers):
            box.x = PAD + (k % per_row) * (col_w + gap)
            box.y = y + HEAD + (k // per_row) * ROW
            box.w = col_w
            with fig.group(f"peer:{k}", tip=box.title):
                fig.rect(box.x, box.y, col_w, NODE_H, "light", outline="grid", rx=4)
                fig.text(box.x + 8, box.y + NODE_H / 2, fit(box.label, col_w - 14))

    svg = draw(
        [[("前置：本页用到的", left)], [("本页", [center])], [("后续：用到本页的", right)]],
        edges,
        uid="lg-local",
        col_w=col_w,
        gap=gap,
        extra_height=(HEAD + rows * ROW) if peers else 0,
        after=same_topic,
        title=f"{me.label} 的关系图谱",
        desc="左列是本页之前、与本页有链接的页面，右列是本页之后、与本页有链接的页面，"
        "下面是同一轮里没有互相链接的笔记。",
    )

    def peer(m: re.Match) -> str:
        box = peers[int(m.group(1))]
        return (
            f'<a class="lg-node {box.kind} lg-peer" href="{html.escape(box.href)}" '
            f'data-page="{html.escape(box.url)}" aria-label="{html.escape(box.title)}">'
            f"{m.group(2)}</a>"
        )

    return re.sub(r'<g data-name="peer:(\d+)">(.*?)</g>', peer, svg, flags=re.S)


def _link_list(graph: LinkGraph, urls: list[str], from_url: str) -> str:
    return (
        "、".join(
            f'<a href="{html.escape(page_href(u, from_url))}" data-page="{html.escape(u)}">'
            f"{html.escape(graph.nodes[u].label)}</a>"
            for u in urls
        )
        or "—"
    )


def neighbourhood_list(graph: LinkGraph, url: str) -> str:
    """The same three lists in words: what a phone shows instead of the picture."""
    before, after, same = neighbours(graph, url)
    rows = [("前置", before), ("后续", after)] + ([("同主题", same)] if same else [])
    return (
        '<dl class="lg-list lg-local-list">'
        + "".join(f"<dt>{k}</dt><dd>{_link_list(graph, v, url)}</dd>" for k, v in rows)
        + "</dl>"
    )


def edge_table(graph: LinkGraph, from_url: str) -> str:
    """Every page and the pages it links to, as a list (readable on a phone, where the picture
    is replaced by it). Hubs are listed too, their many targets summed up in one line."""
    items = []
    for url, node in graph.nodes.items():
        targets = graph.forward(url)
        if node.hub:
            body = f"链接到 {len(targets)} 个页面（每一篇笔记）"
            body = f'<span class="lg-targets" data-hub="1">{body}</span>'
        else:
            body = f'<span class="lg-targets">{_link_list(graph, targets, from_url)}</span>'
        items.append(
            f'<dt data-source="{html.escape(url)}"><a href="{html.escape(page_href(url, from_url))}" '
            f'data-page="{html.escape(url)}">{html.escape(node.title)}</a> '
            f'<span class="lg-group">{html.escape(node.group)} · 出链 {len(targets)}</span></dt>'
            f"<dd>{body}</dd>"
        )
    return '<dl class="lg-list lg-site-list">' + "".join(items) + "</dl>"


def summary(graph: LinkGraph) -> str:
    notes = sum(n.is_note for n in graph.nodes.values())
    return (
        f"<p>{len(graph.nodes)} 个页面（其中 {notes} 篇笔记），"
        f"{len(graph.edges())} 条链接（同一对页面之间的多处链接算一条）。</p>"
    )
