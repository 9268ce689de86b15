"""Browser fixtures for the site tests: Playwright driving Debian's /usr/bin/chromium.

No `playwright install` (it downloads a browser; this machine cannot). Without /usr/bin/chromium
the browser tests skip with how to enable them, except under CI=true, where a missing browser is
a failure. One browser per test module; one tab at 1400 px (``tab``) and one at 390 px
(``phone``), each reused by every test of the module (a new tab costs a renderer start, a page
load ~1.5 s of CPU). The site itself is built and served by tests/conftest.py.

Test modules here still write ``from conftest import expected_note_names``: whichever conftest
Python finds under that name, these helpers of the root conftest are re-exported below.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path("/tmp/shots")
# a note page starts material's script after its load event (hooks/site_load.py): ready when it ran
MATERIAL_READY = (
    "() => !document.querySelector('script[type=\"text/x-ms-after-load\"]') || !!window.msMaterialReady"
)
DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}


def _root_conftest():
    """tests/conftest.py as pytest loaded it (found by file), else a private copy of it."""
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    name = "_site_tests_root_conftest"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


_root = _root_conftest()
expected_note_names = _root.expected_note_names
fixture_mode = _root.fixture_mode


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        msg = (
            f"{CHROMIUM} not found: install Debian's browser with "
            "`apt-get install -y chromium fonts-noto-cjk` (never `playwright install`)"
        )
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


def _context(browser, viewport):
    context = browser.new_context(viewport=viewport, locale="zh-CN")
    context.set_default_timeout(10_000)
    return context


@pytest.fixture(scope="module")
def browser_context(browser):
    context = _context(browser, DESKTOP)
    try:
        yield context
    finally:
        context.close()


# Material's search worker fetches the search index and builds the same lunr index on every page
# load (~0.3-0.4 s of CPU, more than the page's own main thread). A test that searches, and the
# first page a tab opens at each depth of the site (where the worker's relative URLs would break),
# get the real worker; elsewhere this stand-in takes its messages and answers none (the search box
# then stays "initializing"; nothing else on a page waits for it).
STUB_WORKER_COOKIE = "ms-search-worker"
STUB_WORKER = f"""if (document.cookie.includes('{STUB_WORKER_COOKIE}=stub'))
  window.Worker = class extends EventTarget {{ postMessage() {{}} terminate() {{}} }};"""


class Tab:
    """One tab reused by all tests of a module. Each page load starts a fresh record of console
    errors, page errors, failed requests and off-machine requests."""

    def __init__(self, context, site_url):
        self.site_url = site_url
        self.origin = urlsplit(site_url).netloc
        self.errors: list[str] = []
        self.external: list[str] = []
        self.depths: set[int] = set()  # site depths opened with the real search worker
        self.stubbed = False  # the page shown has the stand-in worker
        self.page = page = context.new_page()
        page.add_init_script(STUB_WORKER)
        page.on("request", self._request)
        page.on(
            "console",
            lambda m: (
                m.type == "error" and self.errors.append(f"console: {m.text} @ {m.location.get('url')}")
            ),
        )
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", self._failed)
        page.on("response", lambda r: r.status >= 400 and self.errors.append(f"HTTP {r.status}: {r.url}"))

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
        record since it loaded are kept, and the load is not paid again. ``idle``: the test
        searches, so the page runs the real search worker and its fetches are waited for."""
        if self.page.url.split("#")[0] != url or (idle and self.stubbed):
            self.errors, self.external = [], []
            page = url.split("#")[0]
            depth = page[len(self.site_url) :].count("/") if page.startswith(self.site_url) else None
            self.stubbed = not idle and depth is not None and depth in self.depths
            if depth is not None:
                self.depths.add(depth)
                self.page.context.add_cookies(
                    [
                        {
                            "name": STUB_WORKER_COOKIE,
                            "value": "stub" if self.stubbed else "real",
                            "url": self.site_url,
                        }
                    ]
                )
            self.page.goto(url, wait_until="load")
            self.page.wait_for_function(MATERIAL_READY)
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


@pytest.fixture(scope="module")
def phone(browser, site_url):
    """A tab at 390 px (a phone), in its own context."""
    context = _context(browser, PHONE)
    t = Tab(context, site_url)
    try:
        yield t
    finally:
        t.page.close()
        context.close()


# a promise that resolves after two frames (what a scroll or a class change needs to be drawn)
TWO_FRAMES = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def shot(page, name):
    """A screenshot for a reader of the test run (not a check); CSS transitions shown finished."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), animations="disabled")


_shot = shot  # the name test modules used before
