"""The link graph of the site (part of hooks/backlinks.py): which page links to which.

Every ``<a href>`` of a page's rendered content is resolved against the page's URL; the ones that
land on another page of the site are that page's out-links. Notes are grouped in columns by round
(``ROUNDS`` of hooks/site_nav.py); other pages form a column of their own.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import site_nav  # hooks/site_nav.py: ROUNDS and is_note are defined there only

SITE_GROUP = "站点页面"  # the column of pages that are not notes
OTHER_GROUP = "其他笔记"  # a note whose number no round claims (notes_site warns about it)
NODE_H, ROW, HEAD, PAD = 24, 30, 26, 8
# Pages that link to every note by construction (home, 自测题库, 30 秒英文回答): in a graph they
# only add a fan of edges to everything, so the graphs leave them out (the lists keep them).
HUB_SOURCES = {"index.md", "self_test.md", "answers.md"}

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
