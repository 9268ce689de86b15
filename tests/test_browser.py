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
    """One tab reused by all tests (a new tab costs a renderer start). Each goto() starts a
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


def test_home_page_loads_clean(tab, site_url):
    tab.goto(site_url, idle=True)
    assert "Megatron Core" in tab.page.title()
    _shot(tab.page, "home.png")
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

    # every TOC link names a heading that exists (ids keep CJK: hrefs are percent-decoded)
    hrefs = page.locator(TOC_LINKS).evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert hrefs, "empty TOC"
    missing = page.evaluate(
        """hrefs => hrefs.filter(h => !/^H[1-6]$/.test(
               document.getElementById(decodeURIComponent(h.slice(1)))?.tagName))""", hrefs)
    assert not missing, f"TOC links to missing headings: {missing}"
    # and the browser's own fragment resolution agrees: following a Chinese entry makes that
    # heading the :target (a real mouse click is tested once, below)
    chinese = [h for h in hrefs if CJK_WORD.search(unquote(h))]
    assert chinese, "no Chinese heading in the TOC"
    target = page.locator(f'{TOC_LINKS}[href="{chinese[0]}"]').first.evaluate(
        "a => { a.click(); return document.querySelector(':target')?.id ?? null; }")
    assert target == unquote(chinese[0][1:]), f"followed {chinese[0]} -> :target {target}"
    tab.assert_clean()


def test_toc_mouse_click_scrolls_to_chinese_heading(tab, site_url, note_names):
    """A real click on a Chinese TOC entry scrolls its heading to the top of the viewport."""
    stem = Path(note_names[0]).stem
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


def _rare_chinese_word(site, stem: str) -> tuple[str, int]:
    """A jieba word from this note, and in how many pages it occurs (fewest wins)."""
    index = json.loads((site.dir / "search" / "search_index.json").read_text(encoding="utf-8"))
    pages: dict[str, set[str]] = {}
    mine: list[str] = []
    for doc in index["docs"]:
        text = re.sub(r"<[^>]+>", " ", doc["title"] + "\u200b" + doc["text"])
        words = {w for w in re.split(r"[\u200b\s]+", text) if CJK_WORD.fullmatch(w)}
        location = doc["location"].split("#")[0]
        for w in words:
            pages.setdefault(w, set()).add(location)
        if location == f"notes/{stem}/":
            mine.extend(w for w in sorted(words) if w not in mine)
    assert mine, f"no segmented Chinese words for notes/{stem} in the search index"
    # Two-character words first: the browser segments the typed query itself (not with jieba),
    # and longer words can come out split differently from the index, diluting the ranking.
    word = min(mine, key=lambda w: (len(pages[w]), len(w) != 2, -len(w)))
    return word, len(pages[word])


def test_search_finds_chinese_word(tab, site_url, site, note_names):
    stem = Path(note_names[0]).stem
    word, n_pages = _rare_chinese_word(site, stem)
    tab.goto(site_url, idle=True)
    page = tab.page
    box = page.locator("input.md-search__input")
    box.click()
    box.type(word)
    box.press("End")  # typed CJK fires no keyup; material searches on a key press (seen)
    results = page.locator(".md-search-result__item a")
    results.first.wait_for()
    hrefs = results.evaluate_all("as => as.map(a => a.href)")
    if n_pages <= 5:  # few enough that every page shows in the first batch of results
        assert any(f"/notes/{stem}/" in h for h in hrefs), f"search {word!r}: {hrefs}"
    else:
        assert any("/notes/" in h for h in hrefs), f"search {word!r}: {hrefs}"
    assert word in page.locator(".md-search-result").inner_text()
    _shot(page, "search.png")
    tab.assert_clean()
