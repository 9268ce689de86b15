"""The built site: strict build, internal links, offline, heading ids and TOC, downloads.

The site is built once per session by the ``site`` fixture (tests/conftest.py). HTML is read
with the standard library's html.parser: no extra dependency.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)  # http://, https://, //host
NON_PAGE_SCHEMES = ("mailto:", "tel:", "data:", "javascript:", "blob:")
HEADINGS = {f"h{i}" for i in range(1, 7)}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class PageParser(HTMLParser):
    """Ids, links, external resources, headings and TOC links of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[tuple[str, str]] = []  # (tag, url) for href/src
        self.resources: list[tuple[str, str]] = []  # (what, url) loaded by the browser
        self.inline_css: list[str] = []
        self.inline_js: list[str] = []
        self.headings: list[dict] = []  # inside <article>
        self.toc_links: list[str] = []  # hrefs in .md-nav--secondary
        self.download_links: list[str] = []  # a.nb-download hrefs
        self.tables_in_article = 0
        self._stack: list[tuple[str, dict]] = []
        self._text_sink: list[str] | None = None
        self._heading: dict | None = None

    def _inside(self, tag: str, cls: str | None = None) -> bool:
        return any(
            t == tag and (cls is None or cls in (a.get("class") or "").split()) for t, a in self._stack
        )

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id") is not None:
            self.ids.append(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.append(a["name"])
        for attr in ("href", "src"):
            if a.get(attr) is not None:
                self.links.append((tag, a[attr]))
        rel = (a.get("rel") or "").lower().split()
        if tag == "script" and a.get("src") is not None:
            self.resources.append(("script", a["src"]))
        if tag == "link" and {"stylesheet", "preload", "modulepreload", "icon"} & set(rel):
            self.resources.append((f"link rel={' '.join(rel)}", a.get("href", "")))
        if tag in ("img", "iframe", "source", "video", "audio", "embed") and a.get("src"):
            self.resources.append((tag, a["src"]))
        if tag in ("img", "source") and a.get("srcset"):
            for part in a["srcset"].split(","):
                self.resources.append((f"{tag} srcset", part.strip().split(" ")[0]))
        if "style" in a:
            self.inline_css.append(a["style"])
        if tag in ("style", "script") and "src" not in a:
            self._text_sink = []
        if tag in HEADINGS and self._inside("article"):
            self._heading = {"tag": tag, "id": a.get("id"), "text": []}
            self.headings.append(self._heading)
        if tag == "a" and a.get("href") is not None:
            if self._inside("nav", "md-nav--secondary"):
                self.toc_links.append(a["href"])
            if "nb-download" in (a.get("class") or "").split():
                self.download_links.append(a["href"])
        if tag == "table" and self._inside("article"):
            self.tables_in_article += 1
        if tag not in VOID:
            self._stack.append((tag, a))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self._stack and self._stack[-1][0] == tag:
            self._stack.pop()

    def handle_endtag(self, tag):
        if tag in ("style", "script") and self._text_sink is not None:
            (self.inline_css if tag == "style" else self.inline_js).append("".join(self._text_sink))
            self._text_sink = None
        if tag in HEADINGS and self._heading is not None and self._heading["tag"] == tag:
            self._heading["text"] = " ".join("".join(self._heading["text"]).split())
            self._heading = None
        for i in range(len(self._stack) - 1, -1, -1):  # tolerate unclosed tags
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data):
        if self._text_sink is not None:
            self._text_sink.append(data)
        if self._heading is not None:
            self._heading["text"].append(data)


@lru_cache(maxsize=None)
def parse(path: Path) -> PageParser:
    p = PageParser()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


def html_pages(site_dir: Path) -> list[Path]:
    return sorted(site_dir.rglob("*.html"))


def resolve(site_dir: Path, page: Path, url: str) -> tuple[Path, str]:
    """File in the built site that a local url on ``page`` points to, and its #fragment."""
    page_url = "/" + page.relative_to(site_dir).as_posix()
    parts = urlsplit(urljoin(page_url, url))
    path = unquote(parts.path)
    target = site_dir / path.lstrip("/")
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def load_hook(file: str = "notes_site.py", name: str = "notes_site_under_test"):
    """A fresh copy of ``hooks/<file>``, loaded as mkdocs loads a hook: by path, under ``name`` in
    ``sys.modules``, with ``hooks/`` first on ``sys.path`` while it runs. The sibling modules it
    imports (hooks/site_*.py) are loaded afresh too, so no state is carried over from a build."""
    import importlib.util
    import sys

    hooks = Path(__file__).resolve().parents[2] / "hooks"
    for key, loaded in list(sys.modules.items()):
        where = getattr(loaded, "__file__", None)
        if where and Path(where).parent == hooks and Path(where).stem == key:
            del sys.modules[key]
    spec = importlib.util.spec_from_file_location(name, hooks / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(hooks))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(hooks))
    return module


def is_local(url: str) -> bool:
    return not (EXTERNAL.match(url) or url.lower().startswith(NON_PAGE_SCHEMES))


# ---------------------------------------------------------------------------- build


def test_strict_build_succeeds(site):
    """mkdocs build --strict ran (the fixture fails with the log otherwise) and made pages."""
    assert (site.dir / "index.html").is_file()
    assert not re.search(r"^(WARNING|ERROR)\b", site.log, re.M), site.log
    for page in ("code_map", "cpu"):
        assert (site.dir / page / "index.html").is_file(), f"{page}.md missing from the site"


def test_notes_become_pages_and_py_twins_do_not(site, note_names):
    for name in note_names:
        assert site.note_page(name).is_file(), f"no page for notes/{name}"
    py_pages = [p for p in site.dir.joinpath("notes").rglob("*") if p.suffix == ".py"]
    assert not py_pages, f".py twins leaked into the site: {py_pages}"
    for py in site.notes_dir.glob("*.py"):
        page = site.dir / "notes" / py.stem / "index.html"
        if page.exists():  # the .ipynb owns this page; make sure it was not the .py rendering it
            assert "jupyter-wrapper" in page.read_text(encoding="utf-8")


def test_nav_lists_notes_in_their_rounds(site, note_names):
    """The hook files each note under its round, titled by the notebook's first H1."""
    notes_site = load_hook()

    home = (site.dir / "index.html").read_text(encoding="utf-8")
    for name in note_names:
        number = int(name[:2])
        round_title = next(t for t, numbers in notes_site.ROUNDS if number in numbers)
        assert round_title in home, f"section {round_title} missing from the nav"
        assert f'href="notes/{Path(name).stem}/"' in home, f"{name} missing from the nav"
        title = notes_site._first_h1(site.notes_dir / name)
        assert title and title in home, f"nav title {title!r} of {name} not on the home page"


# ---------------------------------------------------------------------------- links


def test_internal_links_resolve(site):
    """Every local href/src resolves to a file, and every #fragment to an id in that page."""
    broken = []
    for page in html_pages(site.dir):
        parser = parse(page)
        for tag, url in parser.links:
            if not url or not is_local(url):
                continue
            target, fragment = resolve(site.dir, page, url)
            where = f"{page.relative_to(site.dir)}: <{tag}> {url}"
            if not target.is_file():
                broken.append(f"{where} -> missing {target.relative_to(site.dir)}")
            elif fragment and target.suffix == ".html" and fragment not in parse(target).ids:
                broken.append(f"{where} -> no id {fragment!r} in {target.relative_to(site.dir)}")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_link_checker_catches_breakage(site, tmp_path):
    """The checker above is not vacuous: a bad file and a bad anchor are both reported."""
    page = site.dir / "index.html"
    assert resolve(site.dir, page, "nope/")[0].is_file() is False
    target, fragment = resolve(site.dir, page, "cpu/#no-such-id")
    assert target.is_file() and fragment not in parse(target).ids
    target, fragment = resolve(site.dir, page, "notes/../cpu/index.html#%E5%9C%A8")
    assert target == site.dir / "cpu" / "index.html" and fragment == "在"


# ---------------------------------------------------------------------------- offline


def _external_in_css(css: str) -> list[str]:
    found = re.findall(r"""url\(\s*['"]?((?:[a-z][a-z0-9+.-]*:)?//[^'")\s]+)""", css, re.I)
    found += re.findall(r"""@import\s+(?:url\()?\s*['"]?((?:[a-z][a-z0-9+.-]*:)?//[^'")\s;]+)""", css, re.I)
    return found


def test_site_loads_nothing_external(site):
    """No page or stylesheet pulls a script, stylesheet, font or image from the network."""
    bad = []
    for page in html_pages(site.dir):
        parser = parse(page)
        rel = page.relative_to(site.dir)
        bad += [f"{rel}: {what} {url}" for what, url in parser.resources if EXTERNAL.match(url)]
        for css in parser.inline_css:
            bad += [f"{rel}: inline CSS {u}" for u in _external_in_css(css)]
        for js in parser.inline_js:
            # dynamic import()/loader URLs in inline scripts (nbconvert's mermaid/mathjax)
            bad += [
                f"{rel}: inline script loads {u}"
                for u in re.findall(r"""(?:import\(|src\s*=\s*)\s*['"`]((?:https?:)?//[^'"`]+)""", js)
            ]
            if "cdnjs.cloudflare.com" in js or "cdn.jsdelivr.net" in js or "unpkg.com" in js:
                bad.append(f"{rel}: inline script mentions a CDN")
    for css_file in sorted(site.dir.rglob("*.css")):
        rel = css_file.relative_to(site.dir)
        bad += [f"{rel}: {u}" for u in _external_in_css(css_file.read_text(encoding="utf-8"))]
    assert not bad, "external resources:\n" + "\n".join(bad)


def test_offline_scan_is_not_vacuous():
    p = PageParser()
    p.feed(
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?x">'
        '<script src="//cdn.example/x.js"></script><img src="http://x/y.png">'
        '<style>@import url("https://x/y.css"); a{background:url(//x/z.png)}</style>'
        '<script>import("https://cdnjs.cloudflare.com/m.mjs")</script>'
    )
    assert [u for _, u in p.resources if EXTERNAL.match(u)] == [
        "https://fonts.googleapis.com/css?x",
        "//cdn.example/x.js",
        "http://x/y.png",
    ]
    assert set(_external_in_css(p.inline_css[0])) == {"//x/z.png", "https://x/y.css"}
    assert "cdnjs.cloudflare.com" in p.inline_js[0]


# ---------------------------------------------------------------------------- note pages


def test_note_headings_have_unique_ids_and_toc_lands(site, note_names):
    """Every h1-h6 of a note has a non-empty unique id; every TOC link lands on one; the TOC
    lists every heading below the title (it is built from the rendered headings)."""
    problems = []
    for name in note_names:
        parser = parse(site.note_page(name))
        heads = parser.headings
        assert heads, f"{name}: no headings rendered"
        empty = [h["text"] for h in heads if not h["id"]]
        if empty:
            problems.append(f"{name}: headings with empty id: {empty}")
        ids = [h["id"] for h in heads if h["id"]]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            problems.append(f"{name}: duplicate heading ids {dupes}")
        all_ids = set(parser.ids)
        toc = [unquote(urlsplit(h).fragment) for h in parser.toc_links if h.startswith("#")]
        if not toc:
            problems.append(f"{name}: empty page TOC")
        missing = [t for t in toc if t not in all_ids]
        if missing:
            problems.append(f"{name}: TOC links to missing ids {missing}")
        below_title = [h["id"] for h in heads if h["tag"] != "h1"]
        not_in_toc = [i for i in below_title if i not in toc]
        if not_in_toc:
            problems.append(f"{name}: headings missing from the TOC {not_in_toc}")
    assert not problems, "\n".join(problems)


def test_chinese_heading_ids_keep_the_chinese(site, note_names):
    """A Chinese-only heading gets a readable id made of its own characters."""
    checked = 0
    for name in note_names:
        for h in parse(site.note_page(name)).headings:
            if h["text"] and re.fullmatch(r"[\u4e00-\u9fff]+¶?", h["text"]):
                assert h["id"].split("_")[0] == h["text"].rstrip("¶"), h
                checked += 1
    assert checked, "no Chinese-only heading found in any note (the template has several)"


def test_note_pages_offer_their_notebook(site, note_names):
    for name in note_names:
        page = site.note_page(name)
        links = parse(page).download_links
        assert links, f"{name}: no download link"
        for href in links:
            target, _ = resolve(site.dir, page, href)
            assert target.name == name and target.is_file(), f"{name}: {href} -> {target}"
            assert target.read_bytes() == (site.notes_dir / name).read_bytes()
            assert json.loads(target.read_text(encoding="utf-8"))["nbformat"] == 4


def test_note_tables_render(site, note_names):
    """Markdown tables in notebook cells come out as HTML tables (源码位置 is one)."""
    for name in note_names:
        assert parse(site.note_page(name)).tables_in_article, f"{name}: no <table>"


def test_search_index_segments_chinese(site, note_names):
    """material's search ran jieba: Chinese text is split into words (\\u200b separators)."""
    index = load_hook().read_search_index(site.dir)
    assert "zh" in index["config"]["lang"]
    note_docs = [d for d in index["docs"] if d["location"].startswith("notes/")]
    assert note_docs, "no note sections in the search index"
    assert any("\u200b" in d["title"] + d["text"] for d in note_docs), (
        "Chinese not segmented: is jieba installed?"
    )
    # sections point at the heading ids, not at the page top
    anchors = {unquote(d["location"].split("#", 1)[1]) for d in note_docs if "#" in d["location"]}
    for name in note_names:
        ids = {h["id"] for h in parse(site.note_page(name)).headings}
        assert anchors & ids, f"{name}: no search section links to its headings"


SOUP_PASS_SAMPLE = """<html><head><style>div.x > img { border: 0 }</style>
<script>const s = '<div class="jp-Cell-inputWrapper">';</script></head><body>
<main class="jp-Notebook"><!-- <img src="c.png"> -->
<div class="jp-Cell-inputWrapper" data-x='a>b'><img src="a.png"><img alt="" src="b.png"/><IMG SRC=c.png ALT=c></div>
<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="text/plain"><pre>&lt;div class="jp-OutputArea-output"&gt;</pre></div>
<div class='jp-OutputArea-outputs'>not an output</div><div class=jp-OutputArea-output>bare</div>
</main></body></html>"""


def _export(nb, soup_class, monkeypatch, template_stage: str | None = None) -> str:
    """nbconvert's ``HTMLExporter.from_notebook_node`` on ``nb`` with ``soup_class`` standing in
    for BeautifulSoup (the real one, or the hook's stand-in); with ``template_stage``, the template
    stage returns that markup, so only nbconvert's post-pass runs on it."""
    import nbconvert.exporters.html as nbhtml
    from nbconvert.exporters.templateexporter import TemplateExporter

    with monkeypatch.context() as m:
        m.setattr(nbhtml, "BeautifulSoup", soup_class)
        if template_stage is not None:
            m.setattr(
                TemplateExporter,
                "from_notebook_node",
                lambda self, nb, resources=None, **kw: (template_stage, resources),
            )
        exporter = nbhtml.HTMLExporter(template_name="lab")
        m.setattr(exporter.log, "disabled", True)  # its "alt text is missing" warning
        return exporter.from_notebook_node(nb)[0]


def test_focusable_markup_makes_nbconverts_edits_without_reparsing(monkeypatch):
    """The hook's text edits give the same document tree as nbconvert's BeautifulSoup pass: on a
    page with tag-like text in scripts, styles, comments and code, odd quoting and an image
    without ``alt`` -- and on a real note's export."""
    import nbformat
    from bs4 import BeautifulSoup

    hook = load_hook()

    def same_tree(nb, template_stage=None):
        ours = _export(nb, hook.FocusableMarkup, monkeypatch, template_stage)
        theirs = _export(nb, BeautifulSoup, monkeypatch, template_stage)
        assert str(BeautifulSoup(ours, "html.parser")) == str(BeautifulSoup(theirs, "html.parser"))
        return ours

    ours = same_tree(nbformat.v4.new_notebook(), SOUP_PASS_SAMPLE)
    assert ours.count('tabindex="0"') == 3 and 'alt="No description' in ours  # it did edit
    with pytest.raises(NotImplementedError, match="only knows"):
        hook.FocusableMarkup("<p></p>").select("p.new")

    note = Path(__file__).resolve().parents[2] / "notes" / "09_tp_mappings.ipynb"
    assert same_tree(nbformat.read(note, as_version=4)).count('tabindex="0"') > 20


def test_drop_plain_copies_keeps_the_highlighted_code_once():
    hook = load_hook()
    text = (
        "说明\u200b文字 In\xa0[3]: Copied! <pre>x = f(a,\n      b)  # 注释</pre> x = f(a,       b)  # \u200b注释 "
        "<pre>y</pre> 别的 <pre>z = 1</pre> z = 2"
    )
    assert hook.drop_plain_copies(text) == (
        "说明\u200b文字 <pre>x = f(a,\n      b)  # 注释</pre> <pre>y</pre> 别的 <pre>z = 1</pre> z = 2"
    )


SEARCH_INDEX_BUDGET = 700_000  # bytes: every page's browser loads the index
PAGE_TRANSFER_BUDGET = 1_500_000  # bytes: a note page and all it loads, search index included


def _search_text(site) -> dict[str, str]:
    index = load_hook().read_search_index(site.dir)
    text: dict[str, str] = {}
    for doc in index["docs"]:
        page = doc["location"].split("#")[0]
        text[page] = text.get(page, "") + doc["title"] + " " + doc["text"]
    return text


def test_search_index_leaves_code_out(site, note_names):
    """Code-cell inputs are not in the search index (previews show prose; the code is on the
    page), nor a plain copy of them, nor the prompts; the prose around them is."""
    text = _search_text(site)
    hook = load_hook()
    for name in note_names:
        page_text = text[f"notes/{Path(name).stem}/"]
        assert hook.drop_plain_copies(page_text) == page_text, f"{name}: a plain copy is left"
        cells = json.loads((site.notes_dir / name).read_text(encoding="utf-8"))["cells"]
        lines = [
            line
            for c in cells
            if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines()
            if line.startswith(("from ", "import "))
        ]
        leaked = [line for line in lines if line in page_text]
        assert not leaked, f"{name}: code in the search index: {leaked[:3]}"
        assert not re.search(r"(?:In|Out)\xa0?\[\d*\]:|Copied!|显示代码", page_text), name
        assert re.search(r"[\u4e00-\u9fff]{2}", page_text), f"{name}: no prose indexed"


def test_a_notes_prose_is_indexed_under_its_own_section(site, note_names):
    """A search result opens the section that holds the words: on a note page every markdown
    cell is its own <div>, and material's parser used to give the prose of every cell after a
    heading's own cell to the page's first entry (hooks/site_search.py without_div_wrappers)."""
    index = load_hook().read_search_index(site.dir)
    marks = re.compile(r"[\u200b\x7f\s]")
    for name in note_names:
        stem = Path(name).stem
        docs = [d for d in index["docs"] if d["location"].split("#")[0] == f"notes/{stem}/"]
        top = next(d for d in docs if "#" not in d["location"])
        assert len(top["text"]) < 200, f"{stem}: {len(top['text'])} characters indexed at the page's top"
        # words of the lesson: the first run of 8 Chinese characters in a markdown cell after the
        # one that holds the 关键对象 heading
        cells = json.loads((site.notes_dir / name).read_text(encoding="utf-8"))["cells"]
        at = next(i for i, c in enumerate(cells) if "## 关键对象" in "".join(c["source"]))
        later = "".join("".join(c["source"]) for c in cells[at + 1 :] if c["cell_type"] == "markdown")
        words = re.search(r"[\u4e00-\u9fff]{8}", later.split("<details>")[0]).group(0)
        holders = [d["location"] for d in docs if words in marks.sub("", d["text"])]
        assert holders and all("#" in h for h in holders), (stem, words, holders)


def test_search_index_sends_word_marks_in_one_byte_and_the_worker_restores_them(site):
    """On the wire each word mark is U+007F (1 byte, not U+200B's 3); the built worker turns them
    back before it indexes anything, so what it searches is the index material wrote."""
    hook = load_hook()
    raw = (site.dir / "search" / "search_index.json").read_text(encoding="utf-8")
    assert "\u200b" not in raw and raw.count(hook.WIRE_MARK) > 10_000, raw.count(hook.WIRE_MARK)
    worker = next((site.dir / "assets" / "javascripts" / "workers").glob("search.*.min.js")).read_text()
    setup = hook.WORKER_SETUP.search(worker)
    assert setup, "material's index setup not found in the worker"
    decode = worker[setup.end() : setup.end() + 200]
    assert decode.startswith("for(const d of ") and "replaceAll('\\x7f','\\u200b')" in decode, decode


def test_no_self_test_answer_is_in_the_search_index(site, note_names):
    """A 自测 answer folded on the page is not shown by a search preview either: the text of every
    <details><summary>答案 ... of every note is absent from the index (its question stays)."""
    text = _search_text(site)
    for name in note_names:
        page_text = re.sub(r"[\u200b\s]+", "", text[f"notes/{Path(name).stem}/"])
        cells = json.loads((site.notes_dir / name).read_text(encoding="utf-8"))["cells"]
        markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        answers = re.findall(r"<summary>答案</summary>(.*?)</details>", markdown, re.S)
        assert answers, f"{name}: no folded answer"
        outputs = "\n".join(
            "".join(v) if isinstance(v, list) else str(v)
            for c in cells
            if c["cell_type"] == "code"
            for o in c.get("outputs", [])
            for v in [o.get("text", ""), *o.get("data", {}).values()]
        )
        rest = re.sub(r"<summary>答案</summary>.*?</details>", "", markdown, flags=re.S) + outputs
        elsewhere = re.sub(r"[\s*`]+", "", rest)  # the same words in prose or in a cell's output
        for answer in answers:
            # stretches of plain Chinese prose found only in the answer (markdown marks break them)
            runs = [r for r in re.findall(r"[\u4e00-\u9fff，、：]{8,}", answer) if r not in elsewhere]
            leaked = [r for r in runs if r in page_text]
            assert not leaked, f"{name}: answer text in the search index: {leaked[:2]}"


def test_howto_boxes_stay_out_of_the_search_index(site, note_names):
    """The folded "本页怎么跑出来的" / "在 CPU 上怎么跑的" boxes (how the page is produced) are not in
    the search index: a search finds the lesson."""
    text = _search_text(site)
    boxes = 0
    for name in note_names:
        page_text = re.sub(r"[\u200b\s]+", "", text[f"notes/{Path(name).stem}/"])
        cells = json.loads((site.notes_dir / name).read_text(encoding="utf-8"))["cells"]
        markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        folds = re.findall(
            r"<summary>(?:本页怎么跑出来的|在 CPU 上怎么跑的)</summary>(.*?)</details>", markdown, re.S
        )
        rest = re.sub(
            r"<summary>(?:本页怎么跑出来的|在 CPU 上怎么跑的)</summary>.*?</details>",
            "",
            markdown,
            flags=re.S,
        )
        elsewhere = re.sub(r"[\s*`]+", "", rest)
        for fold in folds:
            boxes += 1
            runs = [r for r in re.findall(r"[\u4e00-\u9fff，、：]{8,}", fold) if r not in elsewhere]
            leaked = [r for r in runs if r in page_text]
            assert not leaked, f"{name}: howto text in the search index: {leaked[:2]}"
    if not boxes:
        pytest.skip("no note has a 本页怎么跑出来的 box yet")


def test_search_index_fits_its_budget(site):
    size = (site.dir / "search" / "search_index.json").stat().st_size
    print(f"\nsearch index: {size:,} bytes (budget {SEARCH_INDEX_BUDGET:,})")
    assert size <= SEARCH_INDEX_BUDGET, f"search index {size:,} bytes > {SEARCH_INDEX_BUDGET:,}"


def _page_transfer(site, page: Path) -> dict[str, int]:
    """Bytes of every local file a page makes the browser fetch: the page, its stylesheets,
    scripts and images, and what material's search worker loads (worker, lunr, the index)."""
    parser = parse(page)
    files = {page}
    for tag, url in parser.links:
        if tag in ("link", "script", "img") and url and is_local(url):
            target, _ = resolve(site.dir, page, url)
            if target.is_file() and target.suffix != ".html":
                files.add(target)
    assets = site.dir / "assets" / "javascripts"
    files |= set((assets / "workers").glob("search.*.min.js"))
    config = load_hook().read_search_index(site.dir)["config"]
    lunr = assets / "lunr" / "min"
    files |= {lunr / "lunr.stemmer.support.min.js", lunr / "lunr.multi.min.js"}
    files |= {lunr / f"lunr.{lang}.min.js" for lang in config["lang"] if lang != "en"}
    files.add(site.dir / "search" / "search_index.json")
    return {str(f.relative_to(site.dir)): f.stat().st_size for f in files if f.is_file()}


def test_every_note_page_fits_its_transfer_budget(site, note_names):
    totals = {}
    for name in note_names:
        sizes = _page_transfer(site, site.note_page(name))
        assert any(k.endswith(".css") for k in sizes) and "search/search_index.json" in sizes
        totals[name] = sum(sizes.values())
    heavy = {name: total for name, total in totals.items() if total > PAGE_TRANSFER_BUDGET}
    worst = max((total, name) for name, total in totals.items())
    print(f"\nheaviest note page: {worst[1]} {worst[0]:,} bytes in all (budget {PAGE_TRANSFER_BUDGET:,})")
    assert not heavy, f"note pages over {PAGE_TRANSFER_BUDGET:,} bytes in all: {heavy}"


def test_search_knows_the_sites_words_and_whole_queries(site):
    """jieba learnt the user dictionary (流水线并行 stays one word in the index), the notes carry
    their Chinese search terms, and the built search worker tries a query's last word whole."""
    hook = load_hook()
    index = json.dumps(hook.read_search_index(site.dir), ensure_ascii=False)
    for term in ("流水线并行", "分布式优化器", "重切"):
        assert re.search(rf"(?<![\u4e00-\u9fff]){term}(?![\u4e00-\u9fff])", index), term
    worker = next((site.dir / "assets" / "javascripts" / "workers").glob("search.*.min.js")).read_text()
    for old, new in hook.SEGMENT_FIX:
        assert new in worker and old not in worker, old


def test_compact_word_marks_drops_only_marks_that_separate_nothing():
    hook = load_hook()
    marks = hook.word_mark_pattern("[\\s\\u200b\\u3000\\-、。，．？！；]+")
    text = (
        "\u200b语料\u200b a：10 \u200b篇\u200b文档\u200b，\u200b长\u200b <b>x</b>\u200b的\u200b\u200b行\u200b"
    )
    assert hook.compact_word_marks(text, marks) == "语料 a：10 篇\u200b文档，长 <b>x</b>的\u200b行"


def test_picture_palette_in_css_equals_the_drawing_layers():
    """docs/stylesheets/extra.css defines --ms-<kind> for every kind of snippets.record.draw's
    PALETTE, light under material's default scheme and dark under slate, plus --ms-on."""
    from snippets.record.draw import PALETTE

    css = (Path(__file__).resolve().parents[2] / "docs" / "stylesheets" / "extra.css").read_text()
    blocks = {}
    for m in re.finditer(r"([^{}]+)\{([^}]*)\}", css):
        selector = " ".join(re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S).split())
        blocks[selector] = dict(re.findall(r"--ms-([a-z0-9]+):\s*([^;]+);", m.group(2)))
    light = next(v for k, v in blocks.items() if '[data-md-color-scheme="default"]' in k)
    dark = next(v for k, v in blocks.items() if '[data-md-color-scheme="slate"]' in k)
    assert {k: light[k] for k in PALETTE if k in light} == {k: v[0] for k, v in PALETTE.items()}
    assert {k: dark[k] for k in PALETTE if k in dark} == {k: v[1] for k, v in PALETTE.items()}
    assert "on" in light and "on" in dark


# ---------------------------------------------------------------------------- cells

CELL = (
    '<div id="cell-id=abc" class="jp-Cell jp-CodeCell jp-Notebook-cell   {tags}">\n'
    '<div class="jp-Cell-inputWrapper" tabindex="0">\n<div class="jp-InputArea jp-Cell-inputArea">'
    '<div class="jp-InputPrompt jp-InputArea-prompt">In&nbsp;[1]:</div>'
    '<div class="jp-CodeMirrorEditor"><div class="celltoolbar"><div><span>hide-input</span></div></div>'
    '<div class="highlight-ipynb"><pre><span>import</span> x\nx.run()\n</pre></div>'
    '<div id="cell-1" class="clipboard-copy-txt">import x\nx.run()</div></div></div>\n</div>\n'
    '<div class="jp-Cell-outputWrapper"><div class="jp-OutputArea"><div class="jp-OutputArea-child">'
    '<div class="jp-OutputPrompt jp-OutputArea-prompt">Out[1]:</div>'
    '<div class="jp-RenderedHTMLCommon jp-OutputArea-output"><table><tr><td>42</td></tr></table></div>'
    "</div></div></div>\n</div>"
)


def _fold(tags: str) -> str:
    return load_hook().fold_cells("<p>前</p>" + CELL.format(tags=tags) + "<p>后</p>")


def test_hide_input_folds_the_code_and_keeps_the_output():
    out = _fold("celltag_hide-input")
    fold = re.search(r'<details class="ms-fold ms-fold-input"><summary[^>]*>显示代码.*?</details>', out, re.S)
    assert fold and "x.run()" in fold.group(0) and "（2 行）" in fold.group(0), out
    assert "<td>42</td>" not in fold.group(0) and "<td>42</td>" in out  # the output stays open
    assert "celltoolbar" not in out  # no printed tag names
    assert (
        out.startswith("<p>前</p>") and out.endswith("<p>后</p>") and out.count("<div") == out.count("</div>")
    )


def test_answer_cells_fold_whole():
    out = _fold("celltag_answer")
    fold = re.search(r'<details class="ms-fold ms-fold-answer">.*</details>', out, re.S)
    assert fold and "x.run()" in fold.group(0) and "<td>42</td>" in fold.group(0), out
    assert "ms-fold-input" not in out and " open" not in fold.group(0)


def test_untagged_cells_stay_open_and_keep_code_out_of_search():
    out = _fold("")
    assert "<details" not in out
    assert "<pre data-search-exclude>" in out and 'clipboard-copy-txt" data-search-exclude' in out
    assert "<table data-search-exclude>" in out


def test_svg_outputs_are_inlined():
    import base64

    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" class="ms-figure" viewBox="0 0 10 10"><text>甲</text></svg>'
    )
    data = base64.b64encode(svg.encode()).decode()
    html = f'<div class="jp-RenderedSVG"><img src="data:image/svg+xml;base64,{data}" alt="x"></div>'
    assert load_hook().inline_svgs(html) == f'<div class="jp-RenderedSVG">{svg}</div>'


def test_built_svg_outputs_are_inline_not_images(site, note_names):
    for name in note_names:
        text = site.note_page(name).read_text(encoding="utf-8")
        assert "data:image/svg+xml" not in text, f"{name}: an SVG output is still an <img>"


def test_note_pages_say_once_how_they_are_checked(site, note_names):
    hook = load_hook()
    for name in note_names:
        assert site.note_page(name).read_text(encoding="utf-8").count(hook.CHECKED_LINE) == 1, name


def test_plain_note_numbers_become_links():
    hook = load_hook()
    present = {2: Path("02_a.ipynb"), 8: Path("08_b.ipynb"), 13: Path("13_c.ipynb"), 21: Path("21_d.ipynb")}
    md = (
        "见笔记 21）。note 13 and `笔记 13` [笔记 02](x) 笔记 02/08 笔记 99\n"
        "## 笔记 13\n\n| 主题 | 对应笔记 |\n|---|---|\n| a | 02、08 |\n"
    )
    out = hook.link_note_numbers(md, present)
    assert "见笔记 [21](notes/21_d.ipynb)）" in out and "note [13](notes/13_c.ipynb) and" in out
    assert "`笔记 13`" in out and "[笔记 02](x)" in out and "笔记 99" in out and "## 笔记 13\n" in out
    assert "笔记 [02](notes/02_a.ipynb)/[08](notes/08_b.ipynb)" in out
    assert "| a | [02](notes/02_a.ipynb)、[08](notes/08_b.ipynb) |" in out


def test_code_map_and_cpu_page_link_their_notes(site, note_names):
    for page in ("code_map", "cpu"):
        text = (site.dir / page / "index.html").read_text(encoding="utf-8")
        assert re.search(r'href="\.\./notes/\d\d_[A-Za-z0-9_]+/"', text), f"{page}: no link to a note"


def test_nav_reads_in_number_order(site, note_names):
    home = (site.dir / "index.html").read_text(encoding="utf-8")
    nav = home[home.index("md-nav--primary") : home.index('class="md-content"')]
    order = [int(m) for m in re.findall(r'href="notes/(\d\d)_', nav)]
    seen = list(dict.fromkeys(order))
    rounds = load_hook().ROUNDS
    # the roadmap's order: the first 23 notes by number, within their rounds; a note added later
    # where the roadmap places it (24 after 12: 13-17 build on its RNG streams)
    assert seen == [n for _, numbers in rounds for n in numbers if n in seen], f"notes in the nav: {seen}"
    first = [n for n in seen if n <= 23]
    assert first == sorted(first), f"notes in the nav: {seen}"
    assert "30 秒英文回答" in nav and "30-second answers</" not in nav


def test_home_page_maps_every_planned_note_with_its_status(site, note_names):
    hook = load_hook()
    home = (site.dir / "index.html").read_text(encoding="utf-8")
    for name in note_names:
        assert f'href="notes/{Path(name).stem}/"' in home, name
    planned = [n for n in hook.PLAN if not any(name.startswith(f"{n:02d}_") for name in note_names)]
    assert home.count("<td>计划中</td>") == len(planned)
    assert all(any(n in numbers for _, numbers in hook.ROUNDS) for n in hook.PLAN), (
        "a planned note has no round"
    )


SHAPED = """<h2 id="阅读目标">阅读目标</h2><ol>
<li>目标</li>
</ol>
<p><strong>结论</strong></p>
<ul>
<li>事实 <strong>16</strong></li>
</ul>
<p>先读：<a href="../09_x/">笔记 09</a>；约 15 分钟。</p>
<details><summary>本页怎么跑出来的</summary>
<p>命令 snippets.run</p>
</details>
<table>
<thead>
<tr>
<th>函数</th>
<th>输入</th>
</tr></thead></table>
<table><thead><tr><th>符号</th><th>角色</th></tr></thead></table>
<details><summary>在 CPU 上怎么跑的</summary><p>补丁</p></details>
<details><summary>答案</summary><p>42</p></details>"""


def test_note_shape_marks_the_card_and_the_quiet_folds():
    out = load_hook().mark_note_shape(SHAPED)
    card = re.search(r'<div class="ms-conclusion">(.*?)</div>', out, re.S).group(1)
    assert card.startswith("<p><strong>结论</strong></p>") and "<li>事实 <strong>16</strong></li>" in card
    assert '<p class="ms-prereq">先读：' in card  # the 先读 line is the card's footer
    assert '<ol class="ms-goals">' in out  # the goals list before it (a phone shows the card first)
    assert out.count('<details class="ms-howto" data-search-exclude>') == 2
    assert "<table data-search-exclude>\n<thead>\n<tr>\n<th>函数</th>" in out  # the per-function record
    assert "<table><thead><tr><th>符号</th>" in out  # 源码位置 stays searchable
    assert "<details><summary>答案</summary>" in out  # other folds are left as they are
    assert (
        load_hook().mark_note_shape("<p><strong>结论</strong></p><p>no list</p>").count("ms-conclusion") == 0
    )
    # the card's minutes are the measured ones
    shown = load_hook().show_measured_minutes(out, 7)
    assert '<p class="ms-prereq">先读：<a href="../09_x/">笔记 09</a>；约 7 分钟。</p>' in shown
    bare = load_hook().show_measured_minutes('<p class="ms-prereq">先读：09</p>', 7)
    assert bare == '<p class="ms-prereq">先读：09（约 7 分钟）</p>'
    scaffold = load_hook().show_measured_minutes('<p class="ms-prereq">先读：09；约 N 分钟。</p>', 7)
    assert scaffold == '<p class="ms-prereq">先读：09；约 7 分钟。</p>'  # new_note's placeholder


PICTURED = (
    '<div class="jp-Cell jp-MarkdownCell"><div class="jp-RenderedMarkdown">'
    '<h2 id="阅读目标">阅读目标</h2><ol>\n<li>目标</li>\n</ol>\n'
    "<p><strong>结论</strong></p>\n<ul>\n<li>事实 16</li>\n</ul>\n<p>先读：09；约 15 分钟。</p>"
    "</div></div>\n"
    '<div class="jp-Cell jp-CodeCell celltag_hide-input">\n<div id="c1" class="jp-Cell jp-CodeCell">\n'
    '<details class="ms-fold ms-fold-input"><summary>显示代码</summary><div>draw()</div></details>\n'
    '<div class="jp-OutputArea"><div class="jp-OutputPrompt">Out[1]:</div>'
    '<div class="jp-RenderedSVG"><svg class="ms-figure"><title>图</title></svg></div></div>\n'
    "</div>\n</div>\n"
    '<div class="jp-Cell jp-MarkdownCell"><h2 id="源码位置">源码位置</h2></div>'
)


def test_the_goals_move_below_the_main_picture():
    """The first screen is the card and the picture: the goals list moves below the picture's
    cell (with a label), the picture's folded code goes under the picture, the cell is the hero."""
    out = load_hook().mark_note_shape(PICTURED)
    card, figure = out.index('class="ms-conclusion"'), out.index('class="ms-figure"')
    goals, label = out.index('<ol class="ms-goals">'), out.index("读完本篇能做到")
    fold, section = out.index('<details class="ms-fold ms-fold-input">'), out.index('id="源码位置"')
    assert card < figure < fold < label < goals < section
    assert out.count("<li>目标</li>") == 1 and out.count("ms-figure") == 1
    assert '<div class="ms-hero jp-Cell jp-CodeCell celltag_hide-input">' in out
    # every <div> still closes: the cell's markup stays whole
    assert out.count("<div") == out.count("</div>")
    # a picture after the next heading is not the main picture: nothing moves
    later = PICTURED.replace(
        '<div class="jp-Cell jp-CodeCell celltag_hide-input">',
        '<h2>x</h2><div class="jp-Cell jp-CodeCell celltag_hide-input">',
    )
    kept = load_hook().mark_note_shape(later)
    assert kept.index('<ol class="ms-goals">') < kept.index('class="ms-conclusion"') and "ms-hero" not in kept


def test_pages_workflow_builds_the_strict_site_from_main_and_uploads_it():
    import yaml

    root = Path(__file__).resolve().parents[2]
    flow = yaml.safe_load((root / ".github" / "workflows" / "pages.yml").read_text())
    assert flow[True]["push"]["branches"] == ["main"]  # YAML reads the key `on` as True
    steps = flow["jobs"]["build"]["steps"]
    build = next(s["run"] for s in steps if "mkdocs build" in s.get("run", ""))
    assert "--strict" in build.split()
    out = build.split("-d", 1)[1].split()[0]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == out
    assert any("pip install -e ." in s.get("run", "") for s in steps)
    assert flow["jobs"]["deploy"]["needs"] == "build"


def test_note_pages_stay_under_one_megabyte(site, note_names):
    # The budget (README): a note page's own HTML, without the shared CSS/JS every page caches.
    sizes = {name: site.note_page(name).stat().st_size for name in note_names}
    heavy = {name: size for name, size in sizes.items() if size > 1_000_000}
    assert not heavy, heavy
