"""关系图谱 and 反向链接 (hooks/backlinks.py).

- the hook's own functions on hand-made HTML (link resolution, the graph, the sections);
- a real ``mkdocs build`` of a two-note site: a link added from one note to the other appears
  in the target's 反向链接 and in the graph; removed, it is gone from both;
- the real site (built once per session, tests/conftest.py): every page has the sections, the
  graph has one node per page, and its edges, its table and every page's 反向链接 equal the
  links found by parsing the built HTML independently of the hook;
- the graph page and a note's sections in headless Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from test_site import load_hook

from conftest import DESKTOP, PHONE, TWO_FRAMES  # browser fixtures: tests/site/conftest.py
from conftest import shot as _shot

ROOT = Path(__file__).resolve().parents[2]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


hook = load_hook("backlinks.py", "backlinks_under_test")


# ---------------------------------------------------------------------------- built HTML


class BuiltPage(HTMLParser):
    """What a built page shows: its own links, and what the hook added to it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.content_links: list[str] = []  # <a href> in <article>, outside the hook's output
        self.backlinks: list[str] = []  # <a href> in section.backlinks
        self.sections: list[str] = []  # classes of section.lg-section, in order
        self.svgs: dict[str, dict] = {}  # svg id -> {"nodes": [...], "edges": [...]}
        self.table: dict[str, list[str]] = {}  # graph table: source page -> target pages
        self.headings: list[tuple[str, str | None]] = []  # (text, id) of h2 in lg-sections
        self._stack: list[tuple[str, dict]] = []
        self._svg: dict | None = None
        self._row: str | None = None
        self._h2: list | None = None

    def _in(self, tag, cls=None):
        return any(
            t == tag and (cls is None or cls in (a.get("class") or "").split()) for t, a in self._stack
        )

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "section" and "lg-section" in classes:
            self.sections.append(" ".join(classes))
        if tag == "svg" and "lg-svg" in classes:
            self._svg = self.svgs.setdefault(a.get("id"), {"nodes": [], "edges": []})
        if self._svg is not None and tag == "a" and "lg-node" in classes:
            self._svg["nodes"].append(
                {"page": a.get("data-page"), "href": a.get("href"), "note": "lg-note" in classes}
            )
        if self._svg is not None and "lg-edge" in classes and "data-source" in a:
            self._svg["edges"].append((a["data-source"], a["data-target"]))
        if tag == "dt" and a.get("data-source") is not None:
            self._row = a["data-source"]
            self.table[self._row] = []
        if tag == "a" and self._row is not None and self._in("span", "lg-targets"):
            self.table[self._row].append(a["data-page"])
        if tag == "h2" and self._in("section", "lg-section"):
            self._h2 = [a.get("id"), []]
        if tag == "a" and a.get("href") is not None and self._in("article"):
            if self._in("section", "backlinks"):
                if not a["href"].startswith("#"):  # not the heading's permalink
                    self.backlinks.append(a["href"])
            elif not self._in("section", "lg-section") and self._svg is None and self._row is None:
                self.content_links.append(a["href"])
        if tag not in VOID:
            self._stack.append((tag, a))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self._stack and self._stack[-1][0] == tag:
            self._stack.pop()

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None
        if tag == "dd":
            self._row = None
        if tag == "h2" and self._h2 is not None:
            self.headings.append(("".join(self._h2[1]).strip(), self._h2[0]))
            self._h2 = None
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data):
        if self._h2 is not None:
            self._h2[1].append(data)


def parse(path: Path) -> BuiltPage:
    """The page's parse, once per version of the file (several tests read every built page; the
    tiny build rewrites its pages in place, which changes their modification time)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _parse(path: Path, mtime_ns: int, size: int) -> BuiltPage:
    p = BuiltPage()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


def page_url(site_dir: Path, html_file: Path) -> str:
    """The page.url of a built page: "" for the home page, "notes/01_x/" for a note."""
    rel = html_file.relative_to(site_dir).as_posix()
    return rel[: -len("index.html")] if rel.endswith("index.html") else rel


def site_pages(site_dir: Path) -> dict[str, Path]:
    """Every built page except 404.html, by page url."""
    return {page_url(site_dir, f): f for f in sorted(site_dir.rglob("index.html"))}


def target_of(site_dir: Path, from_url: str, href: str, pages: dict[str, Path]) -> str | None:
    """The page a link leads to, resolved the way a browser does (not with the hook's code)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    path = unquote(urljoin("/" + from_url, parts.path)).lstrip("/")
    if path.endswith("index.html"):
        path = path[: -len("index.html")]
    for candidate in (path, path + "/"):
        if candidate in pages:
            return candidate
    return None


def links_in_html(site_dir: Path, graph_url: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Pages (without the graph page) and the page-to-page links of their own content."""
    pages = {u: f for u, f in site_pages(site_dir).items() if u != graph_url}
    edges = set()
    for url, f in pages.items():
        for href in parse(f).content_links:
            target = target_of(site_dir, url, href, pages)
            if target is not None and target != url:
                edges.add((url, target))
    return set(pages), edges


# ---------------------------------------------------------------------------- unit


def test_resolve_relative_links_to_pages():
    known = {"", "cpu/", "code_map/", "notes/01_a/", "notes/09_b/"}
    cases = {
        ("../09_b/", "notes/01_a/"): "notes/09_b/",
        ("../09_b/#阅读目标", "notes/01_a/"): "notes/09_b/",
        ("../09_b", "notes/01_a/"): "notes/09_b/",
        ("../09_b/index.html", "notes/01_a/"): "notes/09_b/",
        ("../../cpu/", "notes/01_a/"): "cpu/",
        ("../../", "notes/01_a/"): "",
        ("notes/01_a/", ""): "notes/01_a/",
        ("../%E4%B8%AD/", "notes/01_a/"): None,  # no such page
        ("01_a.ipynb", "notes/01_a/"): None,  # the download, not a page
        ("#阅读目标", "notes/01_a/"): None,
        ("https://github.com/NVIDIA/Megatron-LM", ""): None,
        ("//example.org/cpu/", ""): None,
        ("mailto:x@y", ""): None,
    }
    for (href, base), want in cases.items():
        assert hook.resolve(href, base, known) == want, (href, base)


def test_out_links_counts_other_pages_only():
    known = {"", "cpu/", "notes/01_a/", "notes/09_b/"}
    content = (
        '<a class="headerlink" href="#x">¶</a><p><a href="../09_b/">b</a> '
        "<a href='../09_b/#y'>b again</a> <a href=../../cpu/>cpu</a> "
        '<a href="../01_a/">self</a> <a href="01_a.ipynb" download>nb</a> '
        '<a href="https://example.org/">out</a> <a name="anchor">no href</a></p>'
    )
    assert hook.out_links(content, "notes/01_a/", known) == {"notes/09_b/": 2, "cpu/": 1}


def fake_page(url, src_uri, title):
    return SimpleNamespace(url=url, title=title, file=SimpleNamespace(src_uri=src_uri))


def fake_graph(with_link: bool):
    pages = [
        fake_page("notes/09_b/", "notes/09_b.ipynb", "09 B 主题：副标题"),
        fake_page("", "index.md", "首页"),
        fake_page("notes/01_a/", "notes/01_a.ipynb", "01 A 主题：副标题"),
    ]
    links = {
        "": {"notes/01_a/": 1},
        "notes/01_a/": {"notes/09_b/": 1} if with_link else {},
        "notes/09_b/": {},
    }
    return hook.build_graph(pages, {k: hook.Counter(v) for k, v in links.items()})


def test_graph_columns_follow_the_rounds_of_notes_site():
    graph = fake_graph(with_link=True)
    site_nav = hook.site_nav
    assert list(graph.nodes) == ["", "notes/01_a/", "notes/09_b/"]
    assert graph.nodes["notes/01_a/"].group == site_nav.ROUNDS[0][0]
    assert graph.nodes["notes/09_b/"].group == site_nav.ROUNDS[1][0]
    assert graph.nodes[""].group == hook.SITE_GROUP
    assert graph.groups == [hook.SITE_GROUP, site_nav.ROUNDS[0][0], site_nav.ROUNDS[1][0]]
    assert graph.nodes["notes/09_b/"].label == "09 B 主题"


def test_added_link_shows_in_backlinks_and_graph_then_goes():
    for with_link in (True, False):
        graph = fake_graph(with_link)
        edges = {(s, t) for s, t, _ in graph.edges()}
        assert (("notes/01_a/", "notes/09_b/") in edges) is with_link
        assert ("notes/01_a/" in graph.backlinks("notes/09_b/")) is with_link
        html, toc = hook.sections(graph, "notes/09_b/", "graph/", taken=set())
        page = BuiltPage()
        page.feed(f"<article>{html}</article>")
        assert [unquote(h) for h in page.backlinks] == (["../01_a/"] if with_link else [])
        assert set(page.svgs["lg-local"]["edges"]) == (
            {("notes/01_a/", "notes/09_b/")} if with_link else set()
        )
        assert [(t.title, t.id) for t in toc] == [("关系图谱", "关系图谱"), ("反向链接", "反向链接")]
        site_svg = BuiltPage()
        site_svg.feed(hook.full_graph_svg(graph, "graph/"))
        # the home page links every note by construction: a hub, left out of both graphs
        assert set(site_svg.svgs["lg-site"]["edges"]) == {(s, t) for s, t in edges if "" not in (s, t)}
        assert "" not in {n["page"] for n in site_svg.svgs["lg-site"]["nodes"]}


def test_section_ids_stay_unique():
    graph = fake_graph(with_link=True)
    _, toc = hook.sections(graph, "notes/09_b/", None, taken={"关系图谱", "反向链接"})
    assert [t.id for t in toc] == ["关系图谱_1", "反向链接_1"]


def test_labels_are_cut_to_fit_their_box():
    long = "10 ColumnParallelLinear 与 RowParallelLinear"
    cut = hook.fit(long, 180)
    assert cut.endswith("…") and long.startswith(cut[:-1].rstrip())
    assert hook.text_width(cut) <= 180
    assert hook.fit("01 训练全景", 180) == "01 训练全景"


# ---------------------------------------------------------------------------- a tiny site


def _notebook(*markdown_cells: str) -> str:
    cells = [
        {"cell_type": "markdown", "id": f"c{i}", "metadata": {}, "source": src}
        for i, src in enumerate(markdown_cells)
    ]
    return json.dumps(
        {
            "cells": cells,
            "metadata": {"language_info": {"name": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


TINY_CONFIG = """site_name: tiny
docs_dir: docs
theme:
  name: material
  language: zh
  font: false
hooks:
  - hooks/notes_site.py
  - hooks/backlinks.py
nav:
  - 首页: index.md
  - 关系图谱: graph.md
markdown_extensions:
  - toc:
      permalink: true
      slugify: !!python/name:markdown.extensions.toc.slugify_unicode
plugins:
  - mkdocs-jupyter:
      include: ["notes/*.ipynb"]
      execute: false
      include_source: true
      include_requirejs: false
"""


def _build_tiny(project: Path) -> Path:
    """Three notes: 01 links to 09, 05 names 09 only in plain text, 09 links nowhere."""
    notes = project / "docs" / "notes"
    (notes / "01_alpha.ipynb").write_text(
        _notebook("# 01 Alpha：第一轮的笔记", "## 阅读目标\n\n先读 [笔记 09](../09_beta/)。"),
        encoding="utf-8",
    )
    (notes / "05_gamma.ipynb").write_text(
        _notebook("# 05 Gamma：第一轮的另一篇", "## 阅读目标\n\n先读笔记 09。"), encoding="utf-8"
    )
    (notes / "09_beta.ipynb").write_text(
        _notebook("# 09 Beta：第二轮的笔记", "## 阅读目标\n\n没有链接。"), encoding="utf-8"
    )
    out = project / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-d", str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_link_between_two_notes_in_a_real_build(tmp_path):
    """mkdocs build of index + graph page + three notes: the link from 01 to 09 is a backlink and an
    edge; 05's plain-text mention of 09 is neither."""
    project = tmp_path / "project"
    (project / "hooks").mkdir(parents=True)
    for path in [*(ROOT / "hooks").glob("*.py"), ROOT / "hooks" / "jieba_userdict.txt"]:
        (project / "hooks" / path.name).write_bytes(path.read_bytes())
    (project / "docs" / "notes").mkdir(parents=True)
    (project / "docs" / "index.md").write_text(
        "# 首页\n\n从[笔记 01](notes/01_alpha.ipynb)开始。\n", encoding="utf-8"
    )
    (project / "docs" / "graph.md").write_bytes((ROOT / "docs" / "graph.md").read_bytes())
    (project / "mkdocs.yml").write_text(TINY_CONFIG, encoding="utf-8")

    site = _build_tiny(project)
    beta = parse(site / "notes" / "09_beta" / "index.html")
    alpha = parse(site / "notes" / "01_alpha" / "index.html")
    gamma = parse(site / "notes" / "05_gamma" / "index.html")
    graph = parse(site / "graph" / "index.html")
    edges = set(graph.svgs["lg-site"]["edges"])

    assert [unquote(h) for h in beta.backlinks] == ["../01_alpha/"]  # 01's link; not 05's mention
    assert ("notes/01_alpha/", "notes/09_beta/") in edges
    assert ("notes/05_gamma/", "notes/09_beta/") not in edges
    assert "notes/09_beta/" in graph.table["notes/01_alpha/"]
    assert "notes/09_beta/" not in graph.table.get("notes/05_gamma/", ())
    # the Markdown page's link is found as well; nobody links 05
    assert [unquote(h) for h in alpha.backlinks] == ["../../"]
    assert gamma.backlinks == []
    assert ("", "notes/01_alpha/") not in edges  # the home page is a hub: listed, not drawn
    assert {n["page"] for n in graph.svgs["lg-site"]["nodes"]} == {
        "notes/01_alpha/",
        "notes/05_gamma/",
        "notes/09_beta/",
    }
    # the hook's edges are the links the built pages show
    pages, truth = links_in_html(site, "graph/")
    assert pages == {"", "notes/01_alpha/", "notes/05_gamma/", "notes/09_beta/"}
    assert {(s, t) for s, t in truth if "" not in (s, t)} == edges


# ---------------------------------------------------------------------------- the real site


@pytest.fixture(scope="module")
def built(site):
    pages = site_pages(site.dir)
    assert "graph/" in pages, "no graph page (docs/graph.md) in the site"
    return SimpleNamespace(
        dir=site.dir, pages=pages, graph=parse(pages["graph/"]), truth=links_in_html(site.dir, "graph/")
    )


def test_every_page_ends_with_the_two_sections(built):
    for url, f in built.pages.items():
        if url == "graph/":
            continue
        page = parse(f)
        assert page.sections == ["lg-section link-graph", "lg-section backlinks"], url
        texts = [t.rstrip("¶") for t, _ in page.headings]
        assert texts == ["关系图谱", "反向链接"], (url, page.headings)
        assert all(i and i.split("_")[0] == t for t, (_, i) in zip(texts, page.headings)), url


def test_every_note_has_backlinks_section(built, note_names):
    for name in note_names:
        url = f"notes/{Path(name).stem}/"
        assert url in built.pages, f"{name} not built"
        assert "lg-section backlinks" in parse(built.pages[url]).sections, name


HUBS = {"", "self_test/", "answers/"}  # link every note by construction: not drawn


def test_graph_has_one_node_per_page(built, note_names):
    nodes = built.graph.svgs["lg-site"]["nodes"]
    pages, _ = built.truth
    assert sorted(n["page"] for n in nodes) == sorted(pages - HUBS)
    notes = sorted(n["page"] for n in nodes if n["note"])
    assert notes == sorted(f"notes/{Path(n).stem}/" for n in note_names)
    for n in nodes:  # each node opens its page
        assert target_of(built.dir, "graph/", n["href"], built.pages) == n["page"], n


def test_graph_edges_equal_the_links_in_the_built_html(built):
    _, edges = built.truth
    assert edges, "no page links to another page: nothing was checked"
    drawn = built.graph.svgs["lg-site"]["edges"]
    assert set(drawn) == {(s, t) for s, t in edges if not {s, t} & HUBS}
    assert len(drawn) == len(set(drawn))
    listed = {(s, t) for s, ts in built.graph.table.items() for t in ts}
    assert listed == {(s, t) for s, t in edges if s not in HUBS}
    assert set(built.graph.table) == built.truth[0]  # every page has its line in the list


def test_backlinks_and_local_graph_equal_the_links_in_the_built_html(built):
    pages, edges = built.truth
    for url in pages:
        page = parse(built.pages[url])
        got = [target_of(built.dir, url, h, built.pages) for h in page.backlinks]
        assert sorted(got) == sorted(s for s, t in edges if t == url), url
        local = set(page.svgs["lg-local"]["edges"])
        assert local == {(s, t) for s, t in edges if url in (s, t) and not ({s, t} - {url}) & HUBS}, url


def test_local_graph_sorts_linked_pages_into_before_and_after():
    pages = [
        SimpleNamespace(url=u, title=t, file=SimpleNamespace(src_uri=f))
        for u, t, f in [
            ("", "首页", "index.md"),
            ("notes/01_a/", "01 A：x", "notes/01_a.ipynb"),
            ("notes/02_b/", "02 B：x", "notes/02_b.ipynb"),
            ("notes/03_c/", "03 C：x", "notes/03_c.ipynb"),
            ("notes/04_d/", "04 D：x", "notes/04_d.ipynb"),
        ]
    ]
    links = {
        "": hook.Counter({"notes/02_b/": 1}),
        "notes/02_b/": hook.Counter({"notes/03_c/": 1}),
        "notes/01_a/": hook.Counter({"notes/02_b/": 1}),
    }
    graph = hook.build_graph(pages, links)
    before, after, same = hook.neighbours(graph, "notes/02_b/")
    assert (before, after, same) == (["notes/01_a/"], ["notes/03_c/"], ["notes/04_d/"])
    svg = hook.neighbourhood_svg(graph, "notes/02_b/")
    assert svg == hook.neighbourhood_svg(graph, "notes/02_b/")  # byte-stable
    assert 'data-page=""' not in svg  # the home page (a hub) is not drawn


# ---------------------------------------------------------------------------- browser


def test_graph_page_in_browser(tab, site_url, built, note_names):  # noqa: F811
    nodes = built.graph.svgs["lg-site"]["nodes"]
    tab.goto(f"{site_url}graph/")
    page = tab.page
    svg = page.locator("svg#lg-site")
    assert svg.count() == 1
    links = svg.locator("a.lg-node")
    assert links.count() == len(nodes)
    assert svg.locator("a.lg-node.lg-note").count() == len(note_names)
    sizes = links.evaluate_all(
        "as => as.map(a => { const r = a.getBoundingClientRect(); return [r.width, r.height]; })"
    )
    assert all(w > 40 and h > 10 for w, h in sizes), sizes
    # drawn at a readable scale: the SVG is not squeezed far below its own size
    scale = svg.evaluate("s => s.getBoundingClientRect().width / s.viewBox.baseVal.width")
    assert scale > 0.6, f"graph drawn at {scale:.2f} of its size"
    # hovering a note lights up its edges (CSS only)
    note = svg.locator("a.lg-note").first
    cls = [c for c in note.get_attribute("class").split() if c[1:].isdigit()][0]
    edge = svg.locator(f"g.lg-edge.s{cls[1:]} path, g.lg-edge.t{cls[1:]} path").first
    before = float(edge.evaluate("e => getComputedStyle(e).opacity"))
    note.hover()
    after = float(edge.evaluate("e => getComputedStyle(e).opacity"))
    assert after == 1.0 and before < 1.0, (before, after)
    # two frames for material's header to swap its title in on scroll (the screenshot ends the fade)
    page.evaluate(f"() => {{ document.getElementById('全图').scrollIntoView(); return {TWO_FRAMES}; }}")
    _shot(page, "graph.png")
    # on a phone the picture gives way to the list, which names every page
    page.set_viewport_size(PHONE)
    try:
        assert not svg.is_visible()
        assert page.locator("dl.lg-site-list dt").count() == len(nodes) + 3  # + the three hubs
        wide = page.evaluate("() => document.documentElement.scrollWidth")
        assert wide <= PHONE["width"], f"the graph page scrolls sideways on a phone: {wide} px"
    finally:
        page.set_viewport_size(DESKTOP)
    tab.assert_clean()


def test_note_sections_in_browser(tab, site_url, note_names):  # noqa: F811
    stem = Path(note_names[0]).stem
    tab.goto(f"{site_url}notes/{stem}/")
    page = tab.page
    section = page.locator("article section.backlinks")
    assert section.count() == 1 and section.is_visible()
    assert page.locator("article section.link-graph svg.lg-svg").is_visible()
    # the TOC reaches the two sections
    toc = page.locator("nav.md-nav--secondary a.md-nav__link")
    hrefs = [unquote(h) for h in toc.evaluate_all("as => as.map(a => a.getAttribute('href'))")]
    assert hrefs[-2:] == ["#关系图谱", "#反向链接"], hrefs
    page.evaluate(
        f"() => {{ document.querySelector('section.link-graph').scrollIntoView(); return {TWO_FRAMES}; }}"
    )
    _shot(page, f"note-{stem}-bottom.png")
    tab.assert_clean()
