"""The built site in a real browser: Playwright driving Debian's /usr/bin/chromium.

No `playwright install` (it downloads a browser; this machine cannot). Without
/usr/bin/chromium the tests skip with how to enable them, except under CI=true, where a
missing browser is a failure. The site is built and served once per session (conftest.py);
one browser, one context and one tab serve the whole module.
Screenshots go to /tmp/shots/.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from conftest import expected_note_names

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = Path("/tmp/shots")
CJK_WORD = re.compile(r"[\u4e00-\u9fff]{2,8}")
TOC_LINKS = ".md-sidebar--secondary nav.md-nav--secondary a.md-nav__link"


@pytest.fixture(scope="module")
def browser_context():
    if not Path(CHROMIUM).exists():
        msg = (f"{CHROMIUM} not found: install Debian's browser with "
               "`apt-get install -y chromium fonts-noto-cjk` (never `playwright install`)")
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900},
                                      locale="zh-CN")
        context.set_default_timeout(10_000)
        try:
            yield context
        finally:
            context.close()
            browser.close()


class Tab:
    """One tab reused by all tests (a new tab costs a renderer start). Each page load starts a
    fresh record of console errors, page errors, failed requests and off-machine requests."""

    def __init__(self, context, site_url):
        self.origin = urlsplit(site_url).netloc
        self.errors: list[str] = []
        self.external: list[str] = []
        self.page = page = context.new_page()
        page.on("request", self._request)
        page.on("console", lambda m: m.type == "error" and self.errors.append(
            f"console: {m.text} @ {m.location.get('url')}"))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", self._failed)
        page.on("response", lambda r: r.status >= 400 and self.errors.append(
            f"HTTP {r.status}: {r.url}"))

    def _request(self, request):
        parts = urlsplit(request.url)
        # no interception (page.route doubles load time); off-machine requests would fail
        # on an offline machine anyway, so recording them is enough
        if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != self.origin:
            self.external.append(request.url)

    def _failed(self, request):
        # ERR_ABORTED is the browser cancelling a fetch (leaving the page mid-load, e.g. the
        # favicon); a broken site shows up as an HTTP error status or a connection error.
        if request.failure != "net::ERR_ABORTED":
            self.errors.append(f"request failed: {request.url} ({request.failure})")

    def goto(self, url, idle=False):
        """Open ``url``, unless the tab already shows it (a fragment aside): then the page and its
        record since it loaded are kept, and the load is not paid again (~1.5 s of CPU each)."""
        if self.page.url.split("#")[0] != url:
            self.errors, self.external = [], []
            self.page.goto(url, wait_until="load")
        if idle:  # wait for the search worker's fetches too (costs ~0.5 s)
            self.page.wait_for_load_state("networkidle")

    def assert_clean(self):
        assert not self.external, f"requests left the machine: {self.external}"
        assert not self.errors, "\n".join(self.errors)


@pytest.fixture(scope="module")
def tab(browser_context, site_url):
    t = Tab(browser_context, site_url)
    try:
        yield t
    finally:
        t.page.close()


def _note_params():
    # No notes must fail, not pass vacuously: the note_names fixture fails on an empty site.
    return expected_note_names() or ["<no notes>"]


def _shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name))


def _doc_pages():
    """The Markdown pages of the site, as URLs relative to its root ('' is the home page, last:
    the home and search tests that follow use the page as it is)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    return sorted(("" if p.stem == "index" else f"{p.stem}/" for p in docs.glob("*.md")),
                  key=lambda url: (url == "", url))


RENDER_CHECKS = """() => {
    const broken = Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)
        .map(i => i.src);
    const flat = Array.from(document.querySelectorAll('article table'))
        .filter(t => t.getBoundingClientRect().height < 10).length;
    const svgs = Array.from(document.querySelectorAll('article svg'))
        .filter(s => s.getBoundingClientRect().width > 100).length;
    return {broken, flat, tables: document.querySelectorAll('article table').length, svgs};
}"""


def _toc_lands(page) -> list[str]:
    """TOC hrefs whose target heading does not exist on the page."""
    hrefs = page.locator(TOC_LINKS).evaluate_all("as => as.map(a => a.getAttribute('href'))")
    return page.evaluate(
        """hrefs => hrefs.filter(h => !/^H[1-6]$/.test(
               document.getElementById(decodeURIComponent(h.slice(1)))?.tagName))""", hrefs)


@pytest.mark.parametrize("path", _doc_pages())
def test_every_markdown_page_renders_clean(tab, site_url, path):
    """Loads with no console error or failed request; images load, tables have height,
    every TOC entry lands on a heading."""
    tab.goto(f"{site_url}{path}")
    page = tab.page
    got = page.evaluate(RENDER_CHECKS)
    assert not got["broken"], f"images that did not load: {got['broken']}"
    assert not got["flat"], f"{got['flat']} tables rendered without height"
    assert not _toc_lands(page), f"TOC links to missing headings: {_toc_lands(page)}"
    _shot(page, f"page-{path.strip('/') or 'home'}.png")
    tab.assert_clean()


def test_home_page_loads_clean(tab, site_url):
    tab.goto(site_url, idle=True)
    assert "Megatron Core" in tab.page.title()
    _shot(tab.page, "home.png")
    tab.assert_clean()


def _rare_terms(site, stem: str, limit: int = 6) -> list[str]:
    """Words of this note's search-index text that the fewest other pages share: jieba's
    Chinese words and plain English words, rarest (then two-character Chinese) first."""
    index = json.loads((site.dir / "search" / "search_index.json").read_text(encoding="utf-8"))
    pages: dict[str, set[str]] = {}
    mine: list[str] = []
    for doc in index["docs"]:
        text = re.sub(r"<[^>]+>", " ", doc["title"] + "\u200b" + doc["text"])
        words = {w for w in re.split(r"[\u200b\s]+", text) if CJK_WORD.fullmatch(w)}
        words |= set(re.findall(r"(?<![\w])[A-Za-z]{6,}(?![\w])", text))
        location = doc["location"].split("#")[0]
        for w in words:
            pages.setdefault(w.lower(), set()).add(location)
        if location == f"notes/{stem}/":
            mine.extend(w for w in sorted(words) if w not in mine)
    assert mine, f"no words for notes/{stem} in the search index"
    return sorted(mine, key=lambda w: (len(pages[w.lower()]), len(w) != 2, -len(w)))[:limit]


RESULT_META = ".md-search-result__meta"
PENDING = "searching…"


def test_search_finds_a_word_from_every_note(tab, site_url, site, note_names):
    """For each note, one of its rarest words typed into the site search lists that note.

    Not every rare word works: material segments a typed Chinese query differently from the
    jieba-segmented index, and some long code-only words are not matched; so up to six of the
    note's rarest words are tried, and the test fails if none finds the note."""
    tab.goto(site_url, idle=True)
    page = tab.page
    box = page.locator("input.md-search__input")
    box.click()
    misses = []
    for name in note_names:
        stem = Path(name).stem
        tried = []
        for word in _rare_terms(site, stem):
            # Mark the result count, search, and wait until material has rewritten it: then the
            # list is this query's answer, hit or miss (a miss no longer costs a timeout).
            page.evaluate(f"() => {{ document.querySelector('{RESULT_META}').textContent = '{PENDING}'; }}")
            box.fill(word)
            box.press("End")  # filled text fires no keyup; material searches on a key press (seen)
            page.wait_for_function(
                f"() => document.querySelector('{RESULT_META}').textContent !== '{PENDING}'", timeout=5000)
            if page.evaluate("""s => Array.from(document.querySelectorAll('.md-search-result__item a'))
                                    .some(a => a.href.includes('/notes/' + s + '/'))""", stem):
                break
            tried.append(word)
        else:
            misses.append((stem, tried))
        if name == note_names[0]:
            _shot(page, "search.png")
    assert not misses, f"no rare word of these notes finds them: {misses}"
    tab.assert_clean()


@pytest.mark.parametrize("name", _note_params())
def test_note_page_renders(tab, site_url, note_names, name):
    """Loads clean, shows a table and the download button, and every TOC link lands."""
    assert name in note_names, f"{name} was not built"
    stem = Path(name).stem
    tab.goto(f"{site_url}notes/{stem}/")
    page = tab.page
    if name == note_names[0]:
        _shot(page, f"note-{stem}.png")

    assert page.locator("article table").count() >= 1, "no <table> rendered"
    download = page.locator("article a.nb-download")
    assert download.count() == 1, "no .ipynb download button"
    got = download.evaluate(
        "a => fetch(a.href).then(async r => [r.status, (await r.text()).includes('nbformat')])")
    assert got == [200, True], f"download {download.get_attribute('href')} -> {got}"

    got = page.evaluate(RENDER_CHECKS)
    assert not got["broken"] and not got["flat"], got
    # every TOC link names a heading that exists (ids keep CJK: hrefs are percent-decoded)
    hrefs = page.locator(TOC_LINKS).evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert hrefs, "empty TOC"
    assert not _toc_lands(page), f"TOC links to missing headings: {_toc_lands(page)}"
    # and the browser's own fragment resolution agrees: following a Chinese entry makes that
    # heading the :target (a real mouse click is tested once, below)
    chinese = [h for h in hrefs if CJK_WORD.search(unquote(h))]
    assert chinese, "no Chinese heading in the TOC"
    target = page.locator(f'{TOC_LINKS}[href="{chinese[0]}"]').first.evaluate(
        "a => { a.click(); return document.querySelector(':target')?.id ?? null; }")
    assert target == unquote(chinese[0][1:]), f"followed {chinese[0]} -> :target {target}"
    tab.assert_clean()


def test_toc_mouse_click_scrolls_to_chinese_heading(tab, site_url, note_names):
    """A real click on a Chinese TOC entry scrolls its heading to the top of the viewport (on the
    last note: the tab still shows it)."""
    stem = Path(note_names[-1]).stem
    tab.goto(f"{site_url}notes/{stem}/")
    page = tab.page
    toc = page.locator(TOC_LINKS)
    hrefs = toc.evaluate_all("as => as.map(a => a.getAttribute('href'))")
    chinese = [i for i, h in enumerate(hrefs) if CJK_WORD.search(unquote(h))]
    assert chinese, "no Chinese heading in the TOC"
    i = chinese[len(chinese) // 2]
    toc.nth(i).click()
    want = unquote(hrefs[i][1:])
    page.wait_for_function(
        "id => Math.abs(document.getElementById(id).getBoundingClientRect().top) < 200", arg=want)
    assert page.evaluate("() => document.querySelector(':target')?.id") == want
    assert unquote(page.evaluate("() => location.hash"))[1:] == want
    tab.assert_clean()
