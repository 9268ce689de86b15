"""MkDocs hook: 关系图谱 and 反向链接 on every page, and one page with the graph of the whole site.

Seed 004 ends each page with 关系图谱 (how this page connects) and 反向链接 (which pages link
here). This hook builds both at build time from the pages as they were rendered, so it sees the
links in notebook pages (mkdocs-jupyter renders those from the .ipynb with nbconvert; a plugin
that reads or edits ``page.markdown`` never sees them) exactly as it sees Markdown pages.
Everything is static HTML and inline SVG: no script, nothing loaded from elsewhere.

How (mkdocs runs every page's ``on_page_content`` before any page's ``on_page_context``):

1. ``on_page_content`` (after hooks/notes_site.py's): every ``<a href>`` of the page's rendered
   content is resolved against the page's URL; the ones that land on another page of the site
   are that page's out-links. The graph page itself takes no part (its links are the graph).
2. ``on_env``: all pages are rendered, so the graph is complete. Notes are grouped in columns
   by round, using ``ROUNDS`` from hooks/site_nav.py; other pages form a column of their own.
3. ``on_page_context``, after the search plugin's (so that what is generated here, which only
   repeats page titles, stays out of search results): the graph page (``docs/graph.md``) gets
   the SVG and the table in place of two marker comments; every other page gets a 关系图谱
   section (a small SVG: pages linking here, this page, pages it links to) and a 反向链接
   section, appended to its content and its TOC. Their ids are the headings' own text, the
   site's scheme for Chinese headings, kept unique.
4. The few CSS rules live in one generated stylesheet (``assets/stylesheets/link-graph.css``).
"""

from __future__ import annotations

import html
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import site_nav  # hooks/site_nav.py: ROUNDS and is_note are defined there only
from markdown.extensions.toc import slugify_unicode
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import AnchorLink
from mkdocs.utils import get_relative_url

from snippets.record.draw import Figure
from snippets.record.draw import text_width as _draw_width

log = logging.getLogger("mkdocs.hooks.backlinks")

GRAPH_PAGE = "graph.md"  # src_uri of the page that shows the whole graph
SVG_MARK = "<!-- link-graph:svg -->"
TABLE_MARK = "<!-- link-graph:table -->"
CSS_PATH = "assets/stylesheets/link-graph.css"
SITE_GROUP = "站点页面"  # the column of pages that are not notes
OTHER_GROUP = "其他笔记"  # a note whose number no round claims (notes_site warns about it)

# ---------------------------------------------------------------------------- links

A_HREF = re.compile(r"""<a\b[^>]*?\shref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.I)
ANY_ID = re.compile(r"""\sid\s*=\s*["']([^"']*)["']""", re.I)


def resolve(href: str, page_url: str, known: set[str]) -> str | None:
    """The URL (as ``page.url``) of the site page ``href`` on page ``page_url`` leads to, if any.

    External links, same-page anchors and files that are not pages (a notebook download, an
    image) give None.
    """
    href = html.unescape(href).strip()
    parts = urlsplit(href)
    if not href or parts.scheme or parts.netloc or not parts.path:
        return None
    path = unquote(urljoin("/" + page_url, parts.path))
    if path.endswith("/index.html"):
        path = path[: -len("index.html")]
    for candidate in (path, path + "/"):
        if candidate[1:] in known:
            return candidate[1:]
    return None


def out_links(content: str, page_url: str, known: set[str]) -> Counter:
    """Other site pages the rendered ``content`` of page ``page_url`` links to, with counts."""
    found: Counter = Counter()
    for m in A_HREF.finditer(content):
        target = resolve(next(g for g in m.groups() if g is not None), page_url, known)
        if target is not None and target != page_url:
            found[target] += 1
    return found


@dataclass
class Node:
    url: str  # page.url
    title: str  # full title
    label: str  # short label for the SVG
    group: str  # column: a round title, or SITE_GROUP
    is_note: bool
    hub: bool = False  # links to every note by construction (HUB_SOURCES): left out of the graphs


@dataclass
class LinkGraph:
    nodes: dict[str, Node]  # url -> node, in column order
    links: dict[str, Counter]  # source url -> target url -> number of <a>
    groups: list[str] = field(default_factory=list)  # column titles, in order

    def edges(self) -> list[tuple[str, str, int]]:
        order = {u: i for i, u in enumerate(self.nodes)}
        return sorted(
            ((s, t, n) for s, ts in self.links.items() for t, n in ts.items() if s in order and t in order),
            key=lambda e: (order[e[0]], order[e[1]]),
        )

    def backlinks(self, url: str) -> list[str]:
        return [s for s, t, _ in self.edges() if t == url]

    def forward(self, url: str) -> list[str]:
        return [t for s, t, _ in self.edges() if s == url]


def note_group(src_uri: str) -> str:
    number = int(Path(src_uri).name[:2])
    return next((title for title, numbers in site_nav.ROUNDS if number in numbers), OTHER_GROUP)


def short_label(title: str, is_note: bool) -> str:
    # a note's H1 is "NN 主题：副标题"; the graph shows "NN 主题"
    return title.split("：", 1)[0].strip() if is_note else title


def build_graph(pages: list, links: dict[str, Counter]) -> LinkGraph:
    """Nodes in column order: site pages, then notes round by round; ``pages``' order inside."""
    groups = [SITE_GROUP] + [t for t, _ in site_nav.ROUNDS] + [OTHER_GROUP]
    nodes: list[Node] = []
    for page in pages:
        note = site_nav.is_note(page) and bool(site_nav.NOTE_NAME.match(Path(page.file.src_uri).name))
        title = str(page.title or page.url or "首页")
        nodes.append(
            Node(
                page.url,
                title,
                short_label(title, note),
                note_group(page.file.src_uri) if note else SITE_GROUP,
                note,
                page.file.src_uri in HUB_SOURCES,
            )
        )
    nodes.sort(key=lambda n: groups.index(n.group))  # stable: keeps nav order inside a column
    used = [g for g in groups if any(n.group == g for n in nodes)]
    return LinkGraph({n.url: n for n in nodes}, links, used)


# ---------------------------------------------------------------------------- pictures
# Both graphs are drawn with snippets.record.draw (the site's one drawing layer: palette as CSS
# variables, byte-stable output, a legibility check). A page is a box that links to it; an edge
# is a curve with an arrow from the page that holds the link to the page it points at. Boxes and
# edges are drawn as named groups, then given their link and hover classes here.

FONT = 12
NODE_H, ROW, HEAD, PAD = 24, 30, 26, 8
# Pages that link to every note by construction (home, 自测题库, 30 秒英文回答): in a graph they
# only add a fan of edges to everything, so the graphs leave them out (the lists keep them).
HUB_SOURCES = {"index.md", "self_test.md", "answers.md"}


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


# ---------------------------------------------------------------------------- sections


def _heading(text: str, taken: set[str]) -> tuple[str, str]:
    base = slugify_unicode(text, "-")
    ident, n = base, 0
    while ident in taken:
        n += 1
        ident = f"{base}_{n}"
    taken.add(ident)
    return ident, (
        f'<h2 id="{ident}">{text}<a class="headerlink" href="#{ident}" title="Permanent link">¶</a></h2>'
    )


def sections(
    graph: LinkGraph, url: str, graph_url: str | None, taken: set[str]
) -> tuple[str, list[AnchorLink]]:
    """The 关系图谱 and 反向链接 sections of page ``url``, and their TOC entries."""
    graph_id, graph_h = _heading("关系图谱", taken)
    back_id, back_h = _heading("反向链接", taken)
    see_all = ""
    if graph_url is not None:
        see_all = f'全站的图见<a href="{html.escape(page_href(graph_url, url))}">关系图谱</a>页。'
    back = graph.backlinks(url)
    if back:
        items = "".join(
            f'<li><a href="{html.escape(page_href(u, url))}">{html.escape(graph.nodes[u].title)}'
            f'</a> <span class="lg-group">{html.escape(graph.nodes[u].group)}</span></li>'
            for u in back
        )
        back_html = f"<p>{len(back)} 个页面链接到本页：</p><ul>{items}</ul>"
    else:
        back_html = "<p>还没有其他页面链接到本页。</p>"
    content = (
        f'<section class="lg-section link-graph">{graph_h}'
        f"<p>读本页之前可以先读的（前置）、读完接着读的（后续），和同一轮的其他笔记（同主题）；"
        f"首页和题库这类链接每一篇笔记的页面不算在内。{see_all}</p>"
        f'<div class="lg-figure">{neighbourhood_svg(graph, url)}</div>'
        f"{neighbourhood_list(graph, url)}</section>"
        f'<section class="lg-section backlinks">{back_h}{back_html}</section>'
    )
    return content, [AnchorLink("关系图谱", graph_id, 2), AnchorLink("反向链接", back_id, 2)]


# ---------------------------------------------------------------------------- CSS

CSS = """/* hooks/backlinks.py: 关系图谱 and 反向链接 (inline SVG drawn by snippets.record.draw) */
.md-typeset .lg-section { margin-top: 2em; }
.md-typeset .lg-section.link-graph { border-top: 1px solid var(--md-default-fg-color--lightest);
  padding-top: 0.5em; }
.md-typeset .lg-group { color: var(--md-default-fg-color--light); font-size: 0.85em; }
.lg-figure { overflow-x: auto; max-width: 100%; margin: 0.6em 0 1em; }
.lg-svg { display: block; max-width: none; height: auto; }
.lg-svg a.lg-node { cursor: pointer; }
.lg-svg a.lg-node:hover rect, .lg-svg a.lg-node:focus-visible rect {
  stroke: var(--md-accent-fg-color); stroke-width: 2; }
.lg-svg a.lg-node:hover text, .lg-svg a.lg-node:focus-visible text { fill: var(--md-accent-fg-color); }
.lg-svg a.lg-node:focus-visible { outline: none; }
.lg-svg .lg-edge path { opacity: 0.5; stroke-width: 1.2; }
.lg-svg:has(a.lg-node:hover, a.lg-node:focus-visible) .lg-edge path { opacity: 0.08; }
.md-typeset dl.lg-list { margin: 0.6em 0; }
.md-typeset dl.lg-list dt { font-weight: 600; margin-top: 0.5em; }
.md-typeset dl.lg-list dd { margin: 0.1em 0 0.3em 1.2em; }
.md-typeset dl.lg-local-list { display: none; }
@media screen and (max-width: 30em) {
  .lg-figure { display: none; }                 /* a phone reads the lists instead */
  .md-typeset dl.lg-local-list { display: block; }
}
"""

# ---------------------------------------------------------------------------- events

_known: set[str] = set()
_nav_order: dict[str, int] = {}  # page.url -> position in the nav
_links: dict[str, Counter] = {}
_graph: LinkGraph | None = None
_graph_url: str | None = None


def on_config(config):
    if CSS_PATH not in config.extra_css:
        config.extra_css.append(CSS_PATH)
    return config


def on_files(files, config):
    files.append(File.generated(config, CSS_PATH, content=CSS))
    return files


def on_nav(nav, config, files):
    global _graph, _graph_url
    _links.clear()
    _graph = None
    graph_file = files.get_file_from_path(GRAPH_PAGE)
    _graph_url = graph_file.page.url if graph_file is not None and graph_file.page else None
    _known.clear()
    # page.url, not file.url: the home page's file.url is "./", its page.url ""
    _known.update(
        f.page.url for f in files.documentation_pages() if f.page is not None and f.page.url != _graph_url
    )
    _nav_order.clear()
    _nav_order.update((p.url, i) for i, p in enumerate(nav.pages))
    return nav


def on_page_content(content, page, config, files):
    if page.url in _known:
        _links[page.url] = out_links(content, page.url, _known)
    return content


def on_env(env, config, files):
    global _graph
    pages = [f.page for f in files.documentation_pages() if f.page is not None and f.page.url in _known]
    pages.sort(key=lambda p: _nav_order.get(p.url, len(_nav_order)))  # pages left out: last
    _graph = build_graph(pages, _links)
    return env


def fill_graph_page(page) -> None:
    content = page.content or ""
    for mark in (SVG_MARK, TABLE_MARK):
        if mark not in content:
            log.warning("%s: marker %s missing, the graph is not shown", GRAPH_PAGE, mark)
    page.content = content.replace(
        SVG_MARK, summary(_graph) + f'<div class="lg-figure">{full_graph_svg(_graph, page.url)}</div>'
    ).replace(TABLE_MARK, edge_table(_graph, page.url))


# After the search plugin's on_page_context: the generated sections, the graph and its table
# are not indexed (they only repeat page titles; searching a title should find the page).
@event_priority(-50)
def on_page_context(context, page, config, nav):
    if _graph is None:
        return context
    if page.url == _graph_url:
        fill_graph_page(page)
        return context
    if page.url not in _graph.nodes:
        return context
    taken = {i for i in ANY_ID.findall(page.content or "") if i}
    extra, toc_entries = sections(_graph, page.url, _graph_url, taken)
    page.content = (page.content or "") + extra
    items = page.toc.items
    if items and items[0].level == 1:  # material shows the H1's children as the page TOC
        items[0].children.extend(toc_entries)
    else:
        items.extend(toc_entries)
    return context
