"""The built site in a real browser: Playwright driving Debian's /usr/bin/chromium.

No `playwright install` (it downloads a browser; this machine cannot). Without
/usr/bin/chromium the tests skip with how to enable them, except under CI=true, where a
missing browser is a failure. The site is built and served once per session (conftest.py).
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
CJK_WORD = re.compile(r"[\u4e00-\u9fff]{2,6}")


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        msg = (f"{CHROMIUM} not found: install Debian's browser with "
               "`apt-get install -y chromium fonts-noto-cjk` (never `playwright install`)")
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Visit:
    """A browser tab that records console errors, page errors, failed and external requests."""

    def __init__(self, browser, site_url):
        self.origin = urlsplit(site_url).netloc
        self.context = browser.new_context(viewport={"width": 1400, "height": 900},
                                           locale="zh-CN")
        self.errors: list[str] = []
        self.external: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(10_000)
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(
            f"console: {m.text} @ {m.location.get('url')}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(
            f"request failed: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(
            f"HTTP {r.status}: {r.url}"))

    def _route(self, route):
        url = route.request.url
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != self.origin:
            self.external.append(url)
            route.abort()
        else:
            route.continue_()

    def goto(self, url):
        self.page.goto(url, wait_until="load")
        self.page.wait_for_load_state("networkidle")

    def assert_clean(self):
        assert not self.external, f"requests left the machine: {self.external}"
        assert not self.errors, "\n".join(self.errors)

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, site_url):
    v = Visit(browser, site_url)
    try:
        yield v
    finally:
        v.close()


def _note_params():
    names = expected_note_names()
    # No notes must fail, not pass vacuously: the note_names fixture fails on an empty site.
    return names or ["<no notes>"]


def test_home_page_loads_clean(visit, site_url):
    visit.goto(site_url)
    assert "Megatron Core" in visit.page.title()
    SHOTS.mkdir(parents=True, exist_ok=True)
    visit.page.screenshot(path=str(SHOTS / "home.png"))
    visit.assert_clean()


@pytest.mark.parametrize("name", _note_params())
def test_note_page_renders(visit, site_url, site, note_names, name):
    """Loads clean, shows a table, the download button, and every TOC link lands."""
    assert name in note_names, f"{name} was not built"
    stem = Path(name).stem
    visit.goto(f"{site_url}notes/{stem}/")
    page = visit.page

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"note-{stem}.png"))

    assert page.locator("article table").count() >= 1, "no <table> rendered"
    download = page.locator("article a.nb-download")
    assert download.count() == 1, "no .ipynb download button"
    status = download.evaluate("a => fetch(a.href).then(r => r.ok ? r.json() : r.status)")
    assert isinstance(status, dict) and status.get("nbformat") == 4, \
        f"download {download.get_attribute('href')} -> {status}"

    # each TOC link names an element that exists (hash decoded: ids keep CJK characters)
    toc = page.locator(".md-sidebar--secondary nav.md-nav--secondary a.md-nav__link")
    hrefs = toc.evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert hrefs, "empty TOC"
    missing = page.evaluate(
        """hrefs => hrefs.filter(h => !document.getElementById(
               decodeURIComponent(h.slice(1))))""", hrefs)
    assert not missing, f"TOC links to missing elements: {missing}"

    # and following each one lands on it (the browser's :target is that element); in-page
    # clicks first (fast), then one real mouse click on a Chinese entry
    landed = toc.evaluate_all(
        """as => as.map(a => { a.click();
               return [a.getAttribute('href'), document.querySelector(':target')?.id ?? null]; })""")
    wrong = [(h, t) for h, t in landed if t != unquote(h[1:])]
    assert not wrong, f"TOC link -> :target mismatches: {wrong}"
    chinese = [i for i, h in enumerate(hrefs) if CJK_WORD.search(unquote(h))]
    assert chinese, "no Chinese heading in the TOC"
    page.evaluate("window.scrollTo(0, 0)")
    toc.nth(chinese[0]).click()
    target = page.evaluate("() => document.querySelector(':target')?.id ?? null")
    assert target == unquote(hrefs[chinese[0]][1:]), f"clicked {hrefs[chinese[0]]} -> {target}"
    top = page.evaluate(f"() => document.getElementById({json.dumps(target)})"
                        ".getBoundingClientRect().top")
    assert 0 <= top < 200, f"{target} not scrolled to the top of the viewport (top={top})"

    visit.assert_clean()


def _rare_chinese_word(site, stem: str) -> str:
    """A jieba word from this note that the fewest other search-index entries contain."""
    index = json.loads((site.dir / "search" / "search_index.json").read_text(encoding="utf-8"))
    df: Counter[str] = Counter()
    mine: list[str] = []
    for doc in index["docs"]:
        text = re.sub(r"<[^>]+>", " ", doc["title"] + "\u200b" + doc["text"])
        words = {w for w in re.split(r"[\u200b\s]+", text) if CJK_WORD.fullmatch(w)}
        df.update(words)
        if doc["location"].startswith(f"notes/{stem}/"):
            mine.extend(w for w in words if w not in mine)
    assert mine, f"no segmented Chinese words for notes/{stem} in the search index"
    return min(mine, key=lambda w: (df[w], -len(w)))


@pytest.mark.parametrize("name", _note_params())
def test_search_finds_chinese_word(visit, site_url, site, note_names, name):
    assert name in note_names, f"{name} was not built"
    stem = Path(name).stem
    word = _rare_chinese_word(site, stem)
    visit.goto(site_url)
    page = visit.page
    box = page.locator("input.md-search__input")
    box.click()
    box.type(word)
    box.press("End")  # typed CJK fires no keyup; material searches on a key press (seen)
    results = page.locator(".md-search-result__item a")
    results.first.wait_for(timeout=10_000)
    hrefs = results.evaluate_all("as => as.map(a => a.href)")
    assert any(f"/notes/{stem}/" in h for h in hrefs), f"search {word!r}: {hrefs}"
    if name == note_names[0]:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "search.png"))
    visit.assert_clean()
