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

This file holds the events, the two sections and the CSS; the graph itself is built in
hooks/link_graph.py and drawn (SVG and lists) in hooks/link_graph_svg.py, sibling modules mkdocs finds
beside this hook.
"""

from __future__ import annotations

import html
import logging
from collections import Counter

import site_nav
from link_graph import ANY_ID, OTHER_GROUP, SITE_GROUP, LinkGraph, build_graph, out_links, resolve
from link_graph_svg import (
    edge_table,
    fit,
    full_graph_svg,
    neighbourhood_list,
    neighbourhood_svg,
    neighbours,
    page_href,
    summary,
    text_width,
)
from markdown.extensions.toc import slugify_unicode
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import AnchorLink

# what tests read from this hook (tests/site/test_backlinks.py)
__all__ = [
    "OTHER_GROUP",
    "SITE_GROUP",
    "Counter",
    "build_graph",
    "fit",
    "full_graph_svg",
    "neighbours",
    "neighbourhood_svg",
    "out_links",
    "resolve",
    "site_nav",
    "text_width",
]

log = logging.getLogger("mkdocs.hooks.backlinks")

GRAPH_PAGE = "graph.md"  # src_uri of the page that shows the whole graph
SVG_MARK = "<!-- link-graph:svg -->"
TABLE_MARK = "<!-- link-graph:table -->"
CSS_PATH = "assets/stylesheets/link-graph.css"

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
