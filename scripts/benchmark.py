"""Benchmark (a script, not a test): rank launch overhead, seconds per notebook under nbval,
`mkdocs build --strict` time, and each note page's load-event time in headless Chromium. Prints
markdown tables to paste into the README.

    .venv/bin/python scripts/benchmark.py            # everything
    .venv/bin/python scripts/benchmark.py --launch   # only the launcher
    .venv/bin/python scripts/benchmark.py --pages    # only the build and the page loads

Page load: the built site is served from 127.0.0.1; each note page is opened 3 times in a fresh
browser context (an empty cache: every byte is fetched, the search index included) at 1400 px,
and the median time to the load event is reported with the bytes the page transferred. A fourth,
traced load gives the CPU time of the page's main thread up to its load event: on a shared machine
the wall time grows with everyone else's load, that figure much less. The load average is printed
before and after (a figure measured at a load average above the core count is not comparable).

Launch overhead is the wall time of ``run_ranks`` on a function that returns at once: spawn of
the fork server (first launch in a fresh process, which pays the torch + megatron.core import
once), then forks, the gloo rendezvous, the closing barrier and the result pipes (later launches).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _noop():
    return None


def launch_overhead(worlds=(2, 4, 8), repeats=5) -> list[list]:
    """One fresh process per world size, so 'first' includes the fork server's imports."""
    code = (
        "import sys, time, json\n"
        "sys.path.insert(0, %r)\n"
        "from snippets.ranks.launch import run_ranks\n"
        "from benchmark import _noop\n"
        "n, k = int(sys.argv[1]), int(sys.argv[2])\n"
        "t = time.perf_counter(); run_ranks(_noop, n); first = time.perf_counter() - t\n"
        "later = []\n"
        "for _ in range(k):\n"
        "    t = time.perf_counter(); run_ranks(_noop, n); later.append(time.perf_counter() - t)\n"
        "print(json.dumps([first, later]))\n"
    ) % str(ROOT / "scripts")
    rows = []
    for n in worlds:
        out = (
            subprocess.run(
                [PY, "-c", code, str(n), str(repeats)], capture_output=True, text=True, check=True, cwd=ROOT
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        import json

        first, later = json.loads(out)
        rows.append([n, f"{first:.2f}", f"{statistics.median(later):.3f}", f"{max(later):.3f}"])
    return rows


def notebook_seconds() -> list[list]:
    rows = []
    for nb in sorted((ROOT / "notes").glob("[0-9][0-9]_*.ipynb")):
        start = time.perf_counter()
        subprocess.run(
            [PY, "-m", "pytest", "--nbval", "-q", "-p", "no:cacheprovider", str(nb)],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        rows.append([nb.name, f"{time.perf_counter() - start:.1f}"])
    return rows


def mkdocs_seconds_and_pages() -> tuple[float, list[list]]:
    """Build time, and the weight of each note page (its HTML; the shared CSS/JS assets that every
    page loads once from the browser cache are not counted)."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [str(Path(PY).with_name("mkdocs")), "build", "--strict", "-q", "-d", out],
            check=True,
            cwd=ROOT,
            capture_output=True,
            env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        seconds = time.perf_counter() - start
        pages = sorted((p.stat().st_size, p.parent.name) for p in Path(out).glob("notes/*/index.html"))
    return seconds, [[name, f"{size / 1024:.0f}"] for size, name in pages]


def page_loads(repeats: int = 3) -> tuple[float, list[list]]:
    """Build the site, then load each note page ``repeats`` times in headless Chromium: median
    load-event time (ms) and the bytes it transferred (the page, its CSS/JS, the search index)."""
    import functools
    import http.server
    import tempfile
    import threading

    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            # a context closed at its load event drops the fetches still under way (the search
            # index): not an error of the site
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [str(Path(PY).with_name("mkdocs")), "build", "--strict", "-q", "-d", out],
            check=True,
            cwd=ROOT,
            capture_output=True,
            env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        build = time.perf_counter() - start
        server = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=out))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        rows = []
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            for page_dir in sorted(Path(out).glob("notes/*/index.html")):
                url = f"{base}notes/{page_dir.parent.name}/"
                times, readies, sizes = [], [], []
                for _ in range(repeats):
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    page = context.new_page()
                    page.add_init_script(READY_AT)
                    got = []
                    page.on("requestfinished", lambda r, got=got: got.append(r))
                    page.goto(url, wait_until="load")
                    times.append(
                        page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventStart")
                    )
                    page.wait_for_function("() => window.msReadyAt !== undefined", timeout=30_000)
                    readies.append(page.evaluate("() => window.msReadyAt"))
                    page.wait_for_load_state("networkidle")  # the search worker's index fetch
                    sizes.append(sum(r.sizes()["responseBodySize"] for r in got))
                    context.close()
                rows.append(
                    [
                        page_dir.parent.name,
                        f"{statistics.median(times):.0f}",
                        f"{min(times):.0f}–{max(times):.0f}",
                        f"{statistics.median(readies):.0f}",
                        f"{main_thread_cpu_before_load(browser, url):.0f}",
                        f"{max(sizes) / 1024:.0f}",
                    ]
                )
            browser.close()
        server.shutdown()
    return build, rows


READY_AT = """(() => { let ready; Object.defineProperty(window, 'msMaterialReady', {configurable: true,
  get() { return ready; }, set(value) { ready = value; window.msReadyAt = performance.now(); } }); })();"""
"""Records when material's bundle has mounted (hooks/site_load.py sets ``msMaterialReady`` then): the
page is interactive -- TOC, search, table wrappers -- from that moment, in ms since navigation."""


def main_thread_cpu_before_load(browser, url: str) -> float:
    """CPU time (ms) of the page's renderer main thread from navigation start to the load event,
    from a Chromium trace of one more load in a fresh context."""
    import json

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    browser.start_tracing(
        page=page, categories=["toplevel", "devtools.timeline", "blink.user_timing", "loading"]
    )
    page.goto(url, wait_until="load")
    load = page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventStart")
    events = json.loads(browser.stop_tracing())["traceEvents"]
    context.close()
    threads = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"]["name"] == "CrRendererMain"
    }
    start = next(
        e["ts"]
        for e in events
        if e.get("name") == "navigationStart"
        and e.get("args", {}).get("data", {}).get("documentLoaderURL", "") == url
    )
    return (
        sum(
            e.get("tdur", 0)
            for e in events
            if e.get("name") == "ThreadControllerImpl::RunTask"
            and (e["pid"], e["tid"]) in threads
            and start <= e["ts"] < start + load * 1000
        )
        / 1000
    )


def load_average() -> str:
    import os

    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def suite_seconds() -> float:
    """The whole test command, exactly as the README gives it (its install step is a no-op when
    nothing changed)."""
    start = time.perf_counter()
    subprocess.run(["bash", "scripts/test.sh", "-q"], check=True, cwd=ROOT, capture_output=True)
    return time.perf_counter() - start


def table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", action="store_true", help="only the launcher")
    parser.add_argument("--suite", action="store_true", help="also time the whole test command")
    parser.add_argument("--pages", action="store_true", help="only the build and the page loads")
    args = parser.parse_args()
    if args.pages:
        before = load_average()
        build, rows = page_loads()
        print(f"{before} before, {load_average()} after")
        print(f"mkdocs build --strict: {build:.1f} s\n")
        headers = [
            "note page",
            "load event, median of 3 (ms)",
            "range (ms)",
            "material ready, median (ms)",
            "main-thread CPU to load (ms)",
        ]
        print(table(headers + ["transferred (KB)"], rows))
        return
    print(
        table(
            ["ranks", "first launch (s)", "later launches, median (s)", "later, max (s)"], launch_overhead()
        )
    )
    if args.launch:
        return
    print()
    print(table(["notebook", "nbval (s, incl. kernel start)"], notebook_seconds()))
    build, pages = mkdocs_seconds_and_pages()
    print()
    print(f"mkdocs build --strict: {build:.1f} s")
    print(f"largest note page: {pages[-1][0]} {pages[-1][1]} KB (smallest {pages[0][0]} {pages[0][1]} KB)")
    if args.suite:
        print(f"whole test command (nbval + tests/, -n 2): {suite_seconds():.0f} s")


if __name__ == "__main__":
    main()
