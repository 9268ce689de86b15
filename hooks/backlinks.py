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
   by round, using ``ROUNDS`` from hooks/notes_site.py; other pages form a column of their own.
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
import importlib.util
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from markdown.extensions.toc import slugify_unicode
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import AnchorLink
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.backlinks")

GRAPH_PAGE = "graph.md"  # src_uri of the page that shows the whole graph
SVG_MARK = "<!-- link-graph:svg -->"
TABLE_MARK = "<!-- link-graph:table -->"
CSS_PATH = "assets/stylesheets/link-graph.css"
SITE_GROUP = "站点页面"  # the column of pages that are not notes
OTHER_GROUP = "其他笔记"  # a note whose number no round claims (notes_site warns about it)


def _load_notes_site():
    """hooks/notes_site.py, for ROUNDS and is_note: the rounds are defined there only."""
    path = Path(__file__).resolve().with_name("notes_site.py")
    spec = importlib.util.spec_from_file_location("_notes_site_for_backlinks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


notes_site = _load_notes_site()

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
    url: str      # page.url
    title: str    # full title
    label: str    # short label for the SVG
    group: str    # column: a round title, or SITE_GROUP
    is_note: bool


@dataclass
class LinkGraph:
    nodes: dict[str, Node]                    # url -> node, in column order
    links: dict[str, Counter]                 # source url -> target url -> number of <a>
    groups: list[str] = field(default_factory=list)  # column titles, in order

    def edges(self) -> list[tuple[str, str, int]]:
        order = {u: i for i, u in enumerate(self.nodes)}
        return sorted(((s, t, n) for s, ts in self.links.items() for t, n in ts.items()
                       if s in order and t in order),
                      key=lambda e: (order[e[0]], order[e[1]]))

    def backlinks(self, url: str) -> list[str]:
        return [s for s, t, _ in self.edges() if t == url]

    def forward(self, url: str) -> list[str]:
        return [t for s, t, _ in self.edges() if s == url]


def note_group(src_uri: str) -> str:
    number = int(Path(src_uri).name[:2])
    return next((title for title, numbers in notes_site.ROUNDS if number in numbers), OTHER_GROUP)


def short_label(title: str, is_note: bool) -> str:
    # a note's H1 is "NN 主题：副标题"; the graph shows "NN 主题"
    return title.split("：", 1)[0].strip() if is_note else title


def build_graph(pages: list, links: dict[str, Counter]) -> LinkGraph:
    """Nodes in column order: site pages, then notes round by round; ``pages``' order inside."""
    groups = [SITE_GROUP] + [t for t, _ in notes_site.ROUNDS] + [OTHER_GROUP]
    nodes: list[Node] = []
    for page in pages:
        note = notes_site.is_note(page) and bool(notes_site.NOTE_NAME.match(
            Path(page.file.src_uri).name))
        title = str(page.title or page.url or "首页")
        nodes.append(Node(page.url, title, short_label(title, note),
                          note_group(page.file.src_uri) if note else SITE_GROUP, note))
    nodes.sort(key=lambda n: groups.index(n.group))  # stable: keeps nav order inside a column
    used = [g for g in groups if any(n.group == g for n in nodes)]
    return LinkGraph({n.url: n for n in nodes}, links, used)


# ---------------------------------------------------------------------------- SVG

FONT = 12.5
NODE_H, ROW, TOP, PAD = 28, 38, 30, 6


def text_width(s: str) -> float:
    # wide for CJK and full-width forms, a generous average for Latin in a sans-serif
    return sum(FONT * (1.0 if ord(ch) >= 0x2E80 else 0.6) for ch in s)


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
    href: str | None      # None: not a link (this page, in its own neighbourhood)
    kind: str             # css class: lg-note, lg-page (not a note), lg-self
    url: str = ""         # page.url, for data-page
    x: float = 0.0
    y: float = 0.0
    col: int = 0
    row: int = 0


def svg(columns: list[tuple[str, list[Box]]], edges: list[tuple[str, str, str]], *,
        uid: str, label: str, col_w: int, gap: int, center: bool = False,
        hover_rules: bool = False) -> str:
    """Columns of boxes, each box a link; edges as arrows between boxes (keys)."""
    COL_W, GAP = col_w, gap  # noqa: N806 - layout constants of this drawing
    tallest = max([len(boxes) for _, boxes in columns] + [1])
    width = 2 * PAD + len(columns) * COL_W + (len(columns) - 1) * GAP
    height = TOP + tallest * ROW + PAD
    boxes: dict[str, Box] = {}
    parts: list[str] = []
    for c, (title, column) in enumerate(columns):
        x = PAD + c * (COL_W + GAP)
        parts.append(f'<text class="lg-col" x="{x + 2}" y="{TOP - 12}">'
                     f"{html.escape(fit(title, COL_W))}</text>")
        offset = (tallest - len(column)) * ROW / 2 if center else 0
        if not column:
            parts.append(f'<text class="lg-none" x="{x + 8}" y="{TOP + offset + 18:.1f}">'
                         "（无）</text>")
        for r, box in enumerate(column):
            box.x, box.y, box.col, box.row = x, TOP + offset + r * ROW, c, r
            boxes[box.key] = box

    index = {key: i for i, key in enumerate(boxes)}
    edge_parts = []
    for a, b, tip in edges:
        s, t = boxes[a], boxes[b]
        sy, ty = s.y + NODE_H / 2, t.y + NODE_H / 2
        if s.col != t.col:
            right = s.col < t.col
            sx = s.x + COL_W if right else s.x
            tx = t.x if right else t.x + COL_W
            dx = (tx - sx) / 2
            d = (f"M{sx:.1f},{sy:.1f} C{sx + dx:.1f},{sy:.1f} {tx - dx:.1f},{ty:.1f} "
                 f"{tx:.1f},{ty:.1f}")
        else:  # same column: downward links bend out on the right, upward ones on the left
            down = s.row < t.row
            side = s.x + COL_W if down else s.x
            k = min(GAP - 14, 16 + abs(ty - sy) * 0.2) * (1 if down else -1)
            d = (f"M{side:.1f},{sy:.1f} C{side + k:.1f},{sy:.1f} {side + k:.1f},{ty:.1f} "
                 f"{side:.1f},{ty:.1f}")
        # links written on a page that is not a note (home, self-test bank) reach every note
        # by construction: drawn faint so the links between notes stand out
        faint = " lg-faint" if s.kind == "lg-page" and t.kind == "lg-note" else ""
        edge_parts.append(
            f'<path class="lg-edge{faint} s{index[a]} t{index[b]}" d="{d}" '
            f'data-source="{html.escape(s.url)}" data-target="{html.escape(t.url)}" '
            f'marker-end="url(#{uid}-arrow)"><title>{html.escape(tip)}</title></path>')

    node_parts = []
    for key, box in boxes.items():
        inner = (f'<title>{html.escape(box.title)}</title>'
                 f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{COL_W}" height="{NODE_H}" rx="5"/>'
                 f'<text x="{box.x + 9:.1f}" y="{box.y + NODE_H / 2 + FONT * 0.36:.1f}">'
                 f"{html.escape(fit(box.label, COL_W - 16))}</text>")
        cls = f"lg-node {box.kind} n{index[key]}"
        if box.href is None:
            node_parts.append(f'<g class="{cls}" data-page="{html.escape(box.url)}">{inner}</g>')
        else:
            node_parts.append(f'<a class="{cls}" href="{html.escape(box.href)}" '
                              f'data-page="{html.escape(box.url)}" '
                              f'aria-label="{html.escape(box.title)}">{inner}</a>')

    style = ""
    if hover_rules:  # hovering (or tabbing to) a page lights up its own links
        rules = []
        for i in range(len(boxes)):
            on = f"#{uid}:has(.n{i}:hover, .n{i}:focus-visible)"
            rules.append(f"{on} .s{i}, {on} .t{i}")
        style = ("<style>" + ",\n".join(rules) +
                 " { stroke: var(--md-accent-fg-color); opacity: 1; stroke-width: 2;"
                 " stroke-dasharray: none; }"
                 "</style>")
    return (f'<svg class="lg-svg" id="{uid}" role="group" aria-label="{html.escape(label)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'xmlns="http://www.w3.org/2000/svg">{style}'
            f'<defs><marker id="{uid}-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
            f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path class="lg-arrowhead" d="M0,0 L10,5 L0,10 z"/></marker></defs>'
            + "".join(parts) + "".join(edge_parts) + "".join(node_parts) + "</svg>")


def page_href(target_url: str, from_url: str) -> str:
    rel = get_relative_url(target_url, from_url)
    # get_relative_url drops the slash of a directory URL ("../.."), and "" means the home page
    if target_url == "" or target_url.endswith("/"):
        rel = rel.rstrip("/") + "/"
    return rel


def _box(graph: LinkGraph, url: str, from_url: str, key: str | None = None) -> Box:
    n = graph.nodes[url]
    return Box(key or url, n.label, n.title, page_href(url, from_url),
               "lg-note" if n.is_note else "lg-page", url)


def full_graph_svg(graph: LinkGraph, from_url: str) -> str:
    columns = [(g, [_box(graph, u, from_url) for u, n in graph.nodes.items() if n.group == g])
               for g in graph.groups]
    edges = [(s, t, f"{graph.nodes[s].title} → {graph.nodes[t].title}（{n} 处链接）")
             for s, t, n in graph.edges()]
    return svg(columns, edges, uid="lg-site", col_w=190, gap=72, hover_rules=True,
               label="全站关系图谱：页面按轮次分列，箭头从链接所在的页面指向被链接的页面")


def neighbourhood_svg(graph: LinkGraph, url: str) -> str:
    me = graph.nodes[url]
    incoming = [_box(graph, u, url, "in:" + u) for u in graph.backlinks(url)]
    outgoing = [_box(graph, u, url, "out:" + u) for u in graph.forward(url)]
    center = Box("self", me.label, me.title, None, "lg-self", url)
    edges = [(b.key, "self", f"{b.title} → 本页") for b in incoming]
    edges += [("self", b.key, f"本页 → {b.title}") for b in outgoing]
    return svg([("链接到本页", incoming), ("本页", [center]), ("本页链接到", outgoing)], edges,
               uid="lg-local", col_w=250, gap=64, center=True,
               label="本页的关系图谱：左列链接到本页，右列是本页链接到的页面")


def edge_table(graph: LinkGraph, from_url: str) -> str:
    """The same edges as a table: one row per page, the pages it links to in its last cell."""
    def link(u):
        return (f'<a href="{html.escape(page_href(u, from_url))}" data-page="{html.escape(u)}">'
                f"{html.escape(graph.nodes[u].title)}</a>")

    rows = []
    for url, node in graph.nodes.items():
        targets = graph.forward(url)
        rows.append(f'<tr data-source="{html.escape(url)}"><td>{link(url)}</td>'
                    f"<td>{html.escape(node.group)}</td><td>{len(targets)}</td>"
                    f'<td class="lg-targets">{"<br>".join(link(t) for t in targets) or "—"}</td>'
                    "</tr>")
    return ("<table><thead><tr><th>页面</th><th>分组</th><th>出链</th><th>链接到</th></tr>"
            "</thead><tbody>" + "".join(rows) + "</tbody></table>")


def summary(graph: LinkGraph) -> str:
    notes = sum(n.is_note for n in graph.nodes.values())
    return (f"<p>{len(graph.nodes)} 个页面（其中 {notes} 篇笔记），"
            f"{len(graph.edges())} 条链接（同一对页面之间的多处链接算一条）。</p>")


# ---------------------------------------------------------------------------- sections


def _heading(text: str, taken: set[str]) -> tuple[str, str]:
    base = slugify_unicode(text, "-")
    ident, n = base, 0
    while ident in taken:
        n += 1
        ident = f"{base}_{n}"
    taken.add(ident)
    return ident, (f'<h2 id="{ident}">{text}<a class="headerlink" href="#{ident}" '
                   f'title="Permanent link">¶</a></h2>')


def sections(graph: LinkGraph, url: str, graph_url: str | None, taken: set[str]
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
            for u in back)
        back_html = f"<p>{len(back)} 个页面链接到本页：</p><ul>{items}</ul>"
    else:
        back_html = "<p>还没有其他页面链接到本页。</p>"
    content = (
        f'<section class="lg-section link-graph">{graph_h}'
        f"<p>左列是链接到本页的页面，右列是本页链接到的页面。{see_all}</p>"
        f"{neighbourhood_svg(graph, url)}</section>"
        f'<section class="lg-section backlinks">{back_h}{back_html}</section>')
    return content, [AnchorLink("关系图谱", graph_id, 2), AnchorLink("反向链接", back_id, 2)]


# ---------------------------------------------------------------------------- CSS

CSS = """/* hooks/backlinks.py: 关系图谱 and 反向链接 (inline SVG, no script) */
.md-typeset .lg-section { margin-top: 2em; }
.md-typeset .lg-section.link-graph { border-top: 1px solid var(--md-default-fg-color--lightest);
  padding-top: 0.5em; }
.md-typeset .lg-group { color: var(--md-default-fg-color--light); font-size: 0.85em; }
.lg-svg { display: block; max-width: 100%; height: auto; margin: 0.6em 0 1em;
  font-size: 12.5px; }
.lg-svg .lg-col { font-weight: 700; fill: var(--md-default-fg-color--light); }
.lg-svg .lg-none { fill: var(--md-default-fg-color--lighter); }
.lg-svg rect { fill: var(--md-default-bg-color); stroke: var(--md-default-fg-color--lighter);
  stroke-width: 1; }
.lg-svg .lg-note rect { stroke: var(--md-primary-fg-color); }
.lg-svg .lg-page rect { stroke-dasharray: 4 3; }
.lg-svg text { fill: var(--md-default-fg-color); }
.lg-svg .lg-self rect { fill: var(--md-primary-fg-color); stroke: var(--md-primary-fg-color); }
.lg-svg .lg-self text { fill: var(--md-primary-bg-color); font-weight: 700; }
.lg-svg a.lg-node:hover rect, .lg-svg a.lg-node:focus-visible rect {
  stroke: var(--md-accent-fg-color); stroke-width: 2; }
.lg-svg a.lg-node:hover text, .lg-svg a.lg-node:focus-visible text {
  fill: var(--md-accent-fg-color); }
.lg-svg a.lg-node:focus-visible { outline: none; }
.lg-svg .lg-edge { fill: none; stroke: var(--md-default-fg-color--light); opacity: 0.55;
  stroke-width: 1.2; }
.lg-svg .lg-edge.lg-faint { opacity: 0.2; stroke-dasharray: 3 3; }
.lg-svg .lg-arrowhead { fill: var(--md-default-fg-color--light); }
.lg-svg:has(a.lg-node:hover, a.lg-node:focus-visible) .lg-edge { opacity: 0.1; }
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
    _known.update(f.page.url for f in files.documentation_pages()
                  if f.page is not None and f.page.url != _graph_url)
    _nav_order.clear()
    _nav_order.update((p.url, i) for i, p in enumerate(nav.pages))
    return nav


def on_page_content(content, page, config, files):
    if page.url in _known:
        _links[page.url] = out_links(content, page.url, _known)
    return content


def on_env(env, config, files):
    global _graph
    pages = [f.page for f in files.documentation_pages()
             if f.page is not None and f.page.url in _known]
    pages.sort(key=lambda p: _nav_order.get(p.url, len(_nav_order)))  # pages left out: last
    _graph = build_graph(pages, _links)
    return env


def fill_graph_page(page) -> None:
    content = page.content or ""
    for mark in (SVG_MARK, TABLE_MARK):
        if mark not in content:
            log.warning("%s: marker %s missing, the graph is not shown", GRAPH_PAGE, mark)
    page.content = content.replace(
        SVG_MARK, summary(_graph) + full_graph_svg(_graph, page.url)).replace(
        TABLE_MARK, edge_table(_graph, page.url))


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
