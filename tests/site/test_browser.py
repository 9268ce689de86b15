"""The built site in a real browser: Playwright driving Debian's /usr/bin/chromium.

Fixtures (the browser, a 1400 px ``tab`` and a 390 px ``phone``) are in tests/site/conftest.py.
Each note page is loaded once per width, and every check for that width runs on that one load;
the figures that are summed over notes (wide tables, code share) are printed and asserted by the
summary tests at the end of the module. Screenshots go to /tmp/shots/.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_site import load_hook

from conftest import DESKTOP, PHONE, expected_note_names
from conftest import shot as _shot

CJK_WORD = re.compile(r"[\u4e00-\u9fff]{2,8}")
TOC_LINKS = "nav.md-nav--secondary a.md-nav__link"  # the page TOC (integrated in the left sidebar)


def _note_params():
    # No notes must fail, not pass vacuously: the note_names fixture fails on an empty site.
    return expected_note_names() or ["<no notes>"]


def _doc_pages():
    """The Markdown pages of the site, as URLs relative to its root ('' is the home page, last:
    the home and search tests that follow use the page as it is)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    return sorted(
        ("" if p.stem == "index" else f"{p.stem}/" for p in docs.glob("*.md")),
        key=lambda url: (url == "", url),
    )


RENDER_CHECKS = r"""() => {
    const broken = Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)
        .map(i => i.src);
    const flat = Array.from(document.querySelectorAll('article table'))
        .filter(t => t.getBoundingClientRect().height < 10)
        .map(t => (t.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60));
    const svgs = Array.from(document.querySelectorAll('article svg'))
        .filter(s => s.getBoundingClientRect().width > 100).length;
    return {broken, flat, tables: document.querySelectorAll('article table').length, svgs};
}"""


LAYOUT_JS = r"""window.__msLayout = (() => {
  // The site skips drawing cells far from the viewport until a reader scrolls to them
  // (content-visibility in extra.css); these checks are about the page as drawn, so every cell is
  // drawn for them, as it is once scrolled into view.
  const drawAll = document.createElement('style');
  drawAll.textContent = '.jupyter-wrapper .jp-Cell { content-visibility: visible !important; }';
  document.head.append(drawAll);
  const art = () => document.querySelector('article');
  // TOC hrefs whose target heading does not exist on the page (ids keep CJK: percent-decoded)
  const tocMissing = hrefs => hrefs.filter(h => !/^H[1-6]$/.test(
      document.getElementById(decodeURIComponent(h.slice(1)))?.tagName));
  const shown = el => el.checkVisibility ? el.checkVisibility() : !!el.offsetParent;
  const scrollsX = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const clipsX = el => getComputedStyle(el).overflowX !== 'visible';
  const label = el => {
    const cls = typeof el.className === 'string' && el.className ? '.' + el.className.trim().split(/\s+/)[0] : '';
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 50);
    return el.tagName.toLowerCase() + cls + ' "' + text + '"';
  };
  // nearest ancestor inside the article that clips or scrolls horizontally
  const boxOf = el => {
    for (let e = el.parentElement; e && e !== art(); e = e.parentElement) if (clipsX(e)) return e;
    return null;
  };
  function blocks() {
    // tables and code blocks: if wider than their box, they must scroll (not be cut or stick out)
    const a = art().getBoundingClientRect();
    const clipped = [], wide = [], comm = [];
    for (const el of art().querySelectorAll('table, pre')) {
      if (!shown(el)) continue;
      // material's script wraps each table in a scrolling .md-typeset__scrollwrap: that box is
      // what overflows when the table is too wide
      const wrap = el.tagName === 'TABLE' ? el.closest('.md-typeset__scrollwrap') : null;
      const over = el.scrollWidth > el.clientWidth + 1 || (wrap && wrap.scrollWidth > wrap.clientWidth + 1);
      const r = el.getBoundingClientRect();
      const box = boxOf(el);
      if (over && !scrollsX(wrap || el)) clipped.push(label(el));
      else if (r.right > a.right + 1 && !(box && scrollsX(box))) clipped.push(label(el));
      if (el.tagName === 'TABLE') {
        if (over) wide.push(label(el));
        const heads = [...el.querySelectorAll('thead th')].map(t => t.textContent.trim());
        if (heads.includes('API') && over) comm.push(label(el));
      }
    }
    return {clipped, wide, comm};
  }
  function codeShare() {
    // code-cell inputs still open on the page, as a share of the article's height
    let code = 0;
    for (const el of art().querySelectorAll('.jp-CodeCell .jp-Cell-inputWrapper'))
      if (shown(el)) code += el.getBoundingClientRect().height;
    return code / art().getBoundingClientRect().height;
  }
  function spoilers() {
    // in the 自测 section: every answer is closed, and no code cell shows its input or output
    const h = document.getElementById('自测');
    if (!h) return {found: false, visible: []};
    const visible = [];
    const cells = [...art().querySelectorAll('.jp-Cell')];
    const start = cells.findIndex(c => c.contains(h));
    for (const c of cells.slice(start)) {
      const h2 = c.querySelector('h2');
      if (h2 && !c.contains(h)) break;
      if (c.querySelector('.jp-Cell')) continue;  // the outer wrapper of a cell
      for (const d of c.querySelectorAll('details')) if (d.open) visible.push('open: ' + label(d));
      if (c.classList.contains('jp-CodeCell')) {
        for (const part of c.querySelectorAll('.jp-Cell-inputWrapper, .jp-OutputArea-output'))
          if (shown(part) && part.getBoundingClientRect().height > 0) visible.push(label(part));
      }
    }
    return {found: true, visible};
  }
  function svgs() {
    // every picture and graph: drawn, each text label inside the picture, no two labels overlapping
    const problems = [];
    let count = 0;
    const pictures = [...art().querySelectorAll('svg')].filter(s =>
      s.classList.contains('ms-figure') || s.classList.contains('lg-svg') || s.closest('.jp-RenderedSVG'));
    for (const svg of pictures) {
      if (!shown(svg)) continue;  // inside a closed fold
      count++;
      const name = svg.getAttribute('aria-label') || svg.id || 'svg';
      const sr = svg.getBoundingClientRect();
      if (sr.width < 20 || sr.height < 10) { problems.push(name + ': not rendered'); continue; }
      const vb = svg.viewBox.baseVal;
      const W = vb && vb.width ? vb.width : sr.width, H = vb && vb.height ? vb.height : sr.height;
      const X = vb && vb.width ? vb.x : 0, Y = vb && vb.width ? vb.y : 0;
      const inv = svg.getScreenCTM().inverse();
      const boxes = [];
      for (const t of svg.querySelectorAll('text')) {
        if (!t.textContent.trim() || !shown(t)) continue;
        const b = t.getBBox();
        if (!b.width) continue;
        const m = inv.multiply(t.getScreenCTM());
        const pts = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]]
          .map(([x, y]) => { const p = new DOMPoint(x, y).matrixTransform(m); return [p.x, p.y]; });
        const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
        let [x1, x2, y1, y2] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
        // a glyph box is the font's full ascent + descent (~1.45 em for Noto CJK): labels set one
        // line apart touch there without their ink meeting, so compare the middle 70 %
        const pad = (y2 - y1) * 0.15; y1 += pad; y2 -= pad;
        const text = t.textContent.trim().slice(0, 30);
        if (x1 < X - 1 || y1 < Y - 1 || x2 > X + W + 1 || y2 > Y + H + 1)
          problems.push(`${name}: "${text}" leaves the picture`);
        boxes.push({x1, x2, y1, y2, text});
      }
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (Math.min(a.x2, b.x2) - Math.max(a.x1, b.x1) > 1 && Math.min(a.y2, b.y2) - Math.max(a.y1, b.y1) > 1)
          problems.push(`${name}: "${a.text}" overlaps "${b.text}"`);
      }
    }
    return {count, problems};
  }
  function phone() {
    const vw = document.documentElement.clientWidth;
    const loose = [];
    for (const el of art().querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (!r.width || (r.right <= vw + 1 && r.left >= -1)) continue;
      if (!boxOf(el) && !(scrollsX(el) && el.getBoundingClientRect().right <= vw + 1)) loose.push(label(el));
      if (loose.length > 8) break;
    }
    const gutter = [...art().querySelectorAll('.jp-InputPrompt, .jp-OutputPrompt')]
      .filter(e => e.getBoundingClientRect().width > 0).length;
    const still = [...art().querySelectorAll('table')].filter(t => {
      const wrap = t.closest('.md-typeset__scrollwrap') || t;
      return shown(t) && !(scrollsX(wrap) && wrap.getBoundingClientRect().right <= vw + 1);
    }).map(label);
    const unpinned = [...art().querySelectorAll('table')].filter(t => {
      const c = t.querySelector('tr > :first-child'); return shown(t) && c && getComputedStyle(c).position !== 'sticky';
    }).map(label);
    return {pageWidth: document.documentElement.scrollWidth, vw, loose, gutter, still, unpinned};
  }
  const column = () => art().getBoundingClientRect().width;
  function desktop() {
    // everything the 1400 px checks of a note page read, in one call
    const toc = [...document.querySelectorAll('TOC_LINKS')].map(a => a.getAttribute('href'));
    const download = [...art().querySelectorAll('a.nb-download')]
      .map(a => ({href: a.getAttribute('href'), text: a.innerText}));
    return {blocks: blocks(), code: codeShare(), spoilers: spoilers(), svgs: svgs(), column: column(),
            render: (RENDER_CHECKS)(), toc, tocMissing: tocMissing(toc), download,
            tables: art().querySelectorAll('table').length,
            material: document.documentElement.classList.contains('js'),
            // material's bundle is fetched once the load event has started (hooks/site_load.py)
            bundleAfterLoad: performance.getEntriesByType('resource')
              .filter(e => /assets\/javascripts\/bundle\.[0-9a-f]+\.min\.js$/.test(e.name))
              .map(e => e.startTime >= performance.getEntriesByType('navigation')[0].loadEventStart)};
  }
  // the page as the site draws it again (far-off cells skipped); the next check adds the script anew
  const undraw = () => { drawAll.remove(); delete window.__msLayout; };
  return {blocks, codeShare, spoilers, svgs, phone, column, desktop, undraw,
          narrow: () => ({phone: phone(), svgs: svgs()}),
          height: () => art().getBoundingClientRect().height};
})();
"""


LAYOUT_JS = LAYOUT_JS.replace("TOC_LINKS", TOC_LINKS).replace("(RENDER_CHECKS)", f"({RENDER_CHECKS})")


def layout(page, check: str):
    """Run one of LAYOUT_JS's checks on the page the tab shows (the script is added once per load)."""
    return page.evaluate(
        f"() => {{ {LAYOUT_JS} ; return window.__msLayout.{check}(); }}"
        if page.evaluate("() => !window.__msLayout")
        else f"() => window.__msLayout.{check}()"
    )


MIN_COLUMN = 1000  # px: the content column of a note page at 1400 px
MAX_WIDE_TABLES = 10  # tables (all notes together) that still need to scroll at 1400 px
MAX_CODE_SHARE = 0.15  # of a note page's height, with every fold closed
STATS: dict[str, dict] = {}  # note stem -> figures measured by the note tests, for the summaries


# TOC hrefs whose target heading does not exist on the page (ids keep CJK: hrefs are percent-decoded)
TOC_MISSING = f"""() => [...document.querySelectorAll('{TOC_LINKS}')].map(a => a.getAttribute('href'))
    .filter(h => !/^H[1-6]$/.test(document.getElementById(decodeURIComponent(h.slice(1)))?.tagName))"""


@pytest.mark.parametrize("path", _doc_pages())
def test_every_markdown_page_renders_clean(tab, site_url, path):
    """Loads with no console error or failed request; images load, tables have height,
    every TOC entry lands on a heading."""
    tab.goto(f"{site_url}{path}")
    page = tab.page
    got, missing = page.evaluate(f"() => [({RENDER_CHECKS})(), ({TOC_MISSING})()]")
    assert not got["broken"], f"images that did not load: {got['broken']}"
    assert not got["flat"], f"tables rendered without height: {got['flat']}"
    assert not missing, f"TOC links to missing headings: {missing}"
    _shot(page, f"page-{path.strip('/') or 'home'}.png")
    # on a phone the page may not scroll sideways (a wide table scrolls inside its own box)
    page.set_viewport_size(PHONE)
    try:
        width, screen = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    finally:
        page.set_viewport_size(DESKTOP)
    assert width <= screen, f"[390 px] the page scrolls sideways: {width} > {screen} px"
    tab.assert_clean()


def test_home_page_loads_clean(tab, site_url):
    tab.goto(site_url, idle=True)
    assert "Megatron Core" in tab.page.title()
    _shot(tab.page, "home.png")
    tab.assert_clean()


@functools.cache
def _index_words(site_dir: Path) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """The built search index, read once: the pages each word is on (lower case), and each
    page's words in index order (jieba's Chinese words and plain English words)."""
    index = load_hook().read_search_index(site_dir)
    pages: dict[str, set[str]] = {}
    words_of: dict[str, dict[str, None]] = {}  # an ordered set per page
    for doc in index["docs"]:
        text = re.sub(r"<[^>]+>", " ", doc["title"] + "\u200b" + doc["text"])
        words = {w for w in re.split(r"[\u200b\s]+", text) if CJK_WORD.fullmatch(w)}
        words |= set(re.findall(r"(?<![\w])[A-Za-z]{6,}(?![\w])", text))
        location = doc["location"].split("#")[0]
        for w in words:
            pages.setdefault(w.lower(), set()).add(location)
        words_of.setdefault(location, {}).update(dict.fromkeys(sorted(words)))
    return pages, {location: list(words) for location, words in words_of.items()}


def _rare_terms(site, stem: str, limit: int = 6) -> list[str]:
    """Words of this note's search-index text that the fewest other pages share: jieba's
    Chinese words and plain English words, rarest (then two-character Chinese) first."""
    pages, words_of = _index_words(site.dir)
    mine = words_of.get(f"notes/{stem}/", [])
    assert mine, f"no words for notes/{stem} in the search index"
    return sorted(mine, key=lambda w: (len(pages[w.lower()]), len(w) != 2, -len(w)))[:limit]


RESULT_META = ".md-search-result__meta"
PENDING = "searching…"
QUERY_JS = """async ([query, meta, pending]) => {
  // Mark the result count, type the query, and wait until material has rewritten the count: then
  // the list is this query's answer, hit or miss (a miss costs no timeout). One round trip.
  const box = document.querySelector('input.md-search__input');
  const count = document.querySelector(meta);
  count.textContent = pending;
  box.value = query;
  // material searches on a key press (seen): its query component listens for keyup
  box.dispatchEvent(new KeyboardEvent('keyup', {key: 'End', bubbles: true}));
  const start = performance.now();
  while (count.textContent === pending) {
    if (performance.now() - start > 5000) throw new Error('no search answer for ' + query);
    await new Promise(requestAnimationFrame);
  }
  const links = sel => [...document.querySelectorAll(sel)].map(a => new URL(a.href).pathname);
  return {top: links('.md-search-result__item > a'), all: links('.md-search-result__item a')};
}"""


def _query(page, query: str) -> dict[str, list[str]]:
    """Search for ``query`` in the open search box: the result links' paths, the top-level ones
    (one per result, best first) and all (their section links too)."""
    return page.evaluate(QUERY_JS, [query, RESULT_META, PENDING])


def test_search_finds_a_word_from_every_note(tab, site_url, site, note_names):
    """For each note, one of its rarest words typed into the site search lists that note.

    Not every rare word works: material segments a typed Chinese query differently from the
    jieba-segmented index, and some long code-only words are not matched; so up to six of the
    note's rarest words are tried, and the test fails if none finds the note."""
    tab.goto(site_url, idle=True)
    page = tab.page
    page.locator("input.md-search__input").click()
    misses = []
    for name in note_names:
        stem = Path(name).stem
        tried = []
        for word in _rare_terms(site, stem):
            if any(f"/notes/{stem}/" in h for h in _query(page, word)["all"]):
                break
            tried.append(word)
        else:
            misses.append((stem, tried))
        if name == note_names[0]:
            _shot(page, "search.png")
    assert not misses, f"no rare word of these notes finds them: {misses}"
    tab.assert_clean()


def _search(page, query: str) -> list[str]:
    """Type ``query`` into material's search; the pages of the results, best first."""
    page.locator("input.md-search__input").click()
    pages = []
    for h in _query(page, query)["top"]:
        if h not in pages:
            pages.append(h)
    return pages


# query -> (note, the best place it must reach): issue 20's search checks
RANKED_QUERIES = [("流水线并行", "13_", 1), ("RowParallelLinear", "10_", 1), ("重切", "22_", 3)]


def test_search_ranks_the_note_about_a_term_first(tab, site_url, note_names):
    tab.goto(site_url, idle=True)
    page = tab.page
    misses = []
    for query, note, best in RANKED_QUERIES:
        if not any(n.startswith(note) for n in note_names):
            continue
        pages = _search(page, query)
        at = next((i for i, u in enumerate(pages, 1) if f"/notes/{note}" in u), None)
        if at is None or at > best:
            misses.append(f"{query!r}: note {note[:2]} at {at} (want <= {best}); results {pages[:5]}")
    _shot(page, "search-ranked.png")
    assert not misses, "\n".join(misses)
    tab.assert_clean()


@pytest.mark.parametrize("name", _note_params())
def test_note_page_renders(tab, site_url, note_names, name):
    """One load, both widths (the viewport is resized, the page not loaded again).

    1400 px: clean, a table and the labeled download button, every TOC link lands; the column is
    wide enough, no table or code block is cut off without a scroll bar, communication tables show
    every column, every picture is drawn with its labels inside it and apart.
    390 px: nothing wider than the screen unless it sits in a scroll box, no In / Out gutter,
    every table scrolls with its first column pinned, pictures as above.
    Wide tables, code share and the 自测 folds are recorded for the summary tests below."""
    assert name in note_names, f"{name} was not built"
    stem = Path(name).stem
    tab.goto(f"{site_url}notes/{stem}/")
    page = tab.page
    if name == note_names[0]:
        _shot(page, f"note-{stem}.png")

    # every 1400 px figure in one call (each call is a round trip to the browser), and the
    # download fetched by the page
    got = page.evaluate(
        f"""async () => {{ {LAYOUT_JS};
            const d = window.__msLayout.desktop();
            const a = document.querySelector('article a.nb-download');
            d.fetched = a ? await fetch(a.href).then(async r => [r.status, (await r.text()).includes('nbformat')])
                          : null;
            return d; }}"""
    )
    blocks = got["blocks"]
    STATS[stem] = dict(wide=blocks["wide"], code=got["code"], spoilers=got["spoilers"])
    assert got["material"], "material's script did not run"
    assert got["bundleAfterLoad"] == [True], (
        f"material's bundle before the load event: {got['bundleAfterLoad']}"
    )
    assert got["tables"] >= 1, "no <table> rendered"
    assert len(got["download"]) == 1, "no .ipynb download button"
    assert "下载 .ipynb" in got["download"][0]["text"], "the download button has no label"
    assert got["fetched"] == [200, True], f"download {got['download'][0]['href']} -> {got['fetched']}"
    assert not got["render"]["broken"] and not got["render"]["flat"], got["render"]
    # every TOC link names a heading that exists (ids keep CJK: hrefs are percent-decoded)
    hrefs = got["toc"]
    assert hrefs, "empty TOC"
    assert not got["tocMissing"], f"TOC links to missing headings: {got['tocMissing']}"
    chinese = [h for h in hrefs if CJK_WORD.search(unquote(h))]
    assert chinese, "no Chinese heading in the TOC"

    problems = []
    if got["column"] < MIN_COLUMN:
        problems.append(f"content column {got['column']:.0f} px at 1400 px (want >= {MIN_COLUMN})")
    if blocks["clipped"]:
        problems.append(f"cut off without a scroll bar: {blocks['clipped']}")
    if blocks["comm"]:
        problems.append(f"communication tables that hide columns: {blocks['comm']}")
    if got["svgs"]["count"] < 1:
        problems.append("no picture drawn (the page's own 关系图谱 at least)")
    problems += got["svgs"]["problems"]

    page.set_viewport_size(PHONE)
    try:
        narrow = page.evaluate("() => window.__msLayout.narrow()")
        got = narrow["phone"]
        if got["pageWidth"] > got["vw"]:
            problems.append(f"[390 px] the page scrolls sideways: {got['pageWidth']} > {got['vw']} px")
        if got["loose"]:
            problems.append(f"[390 px] wider than the screen, outside any scroll box: {got['loose']}")
        if got["gutter"]:
            problems.append(f"[390 px] {got['gutter']} In/Out prompts still take width")
        if got["still"]:
            problems.append(f"[390 px] tables that do not scroll: {got['still'][:5]}")
        if got["unpinned"]:
            problems.append(f"[390 px] tables whose first column is not pinned: {got['unpinned'][:5]}")
        problems += ["[390 px] " + p for p in narrow["svgs"]["problems"]]
        if name == note_names[0]:
            _shot(page, f"phone-{stem}.png")
    finally:
        # back to skipping far-off cells first: the page is then laid out again at 1400 px for
        # the cells near the viewport only
        page.evaluate("() => window.__msLayout && window.__msLayout.undraw()")
        page.set_viewport_size(DESKTOP)
    assert not problems, "\n".join(problems)

    # the browser's own fragment resolution agrees with the TOC: following a Chinese entry makes
    # that heading the :target (a real mouse click is tested once, below)
    target = page.locator(f'{TOC_LINKS}[href="{chinese[0]}"]').first.evaluate(
        "a => { a.click(); return document.querySelector(':target')?.id ?? null; }"
    )
    assert target == unquote(chinese[0][1:]), f"followed {chinese[0]} -> :target {target}"
    tab.assert_clean()


def _stats(note_names) -> dict[str, dict]:
    missing = [n for n in note_names if Path(n).stem not in STATS]
    if missing:
        pytest.fail(f"test_note_page_renders did not measure {missing} (run with it)", pytrace=False)
    return {Path(n).stem: STATS[Path(n).stem] for n in note_names}


def test_few_tables_still_need_to_scroll_at_desktop_width(note_names):
    stats = _stats(note_names)
    wide = {stem: s["wide"] for stem, s in stats.items() if s["wide"]}
    total = sum(len(w) for w in wide.values())
    print(
        f"\ntables wider than the column at 1400 px: {total} "
        + ", ".join(f"{stem[:2]}: {len(w)}" for stem, w in wide.items())
    )
    assert total <= MAX_WIDE_TABLES, f"{total} tables need to scroll at 1400 px: {wide}"


def test_code_is_a_small_share_of_every_note_page(note_names):
    """With every fold closed, code-cell inputs take at most 15 % of a note page's height. The
    figure of every note is printed, not only the first that fails."""
    stats = _stats(note_names)
    print("\ncode share of each note page (folds closed):")
    for stem, s in stats.items():
        print(f"  {stem:40s} {s['code'] * 100:5.1f} %" + ("  > 15 %" if s["code"] > MAX_CODE_SHARE else ""))
    over = {stem: round(s["code"], 3) for stem, s in stats.items() if s["code"] > MAX_CODE_SHARE}
    assert not over, f"code over {MAX_CODE_SHARE:.0%} of the page: {over}"


def test_no_self_test_answer_shows_before_it_is_opened(note_names):
    stats = _stats(note_names)
    spoiled = {stem: s["spoilers"]["visible"][:3] for stem, s in stats.items() if s["spoilers"]["visible"]}
    absent = [stem for stem, s in stats.items() if not s["spoilers"]["found"]]
    assert not absent, f"no 自测 heading on: {absent}"
    assert not spoiled, f"answers visible before their fold is opened: {spoiled}"


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
        "id => Math.abs(document.getElementById(id).getBoundingClientRect().top) < 200", arg=want
    )
    assert page.evaluate("() => document.querySelector(':target')?.id") == want
    assert unquote(page.evaluate("() => location.hash"))[1:] == want
    tab.assert_clean()


SIDEBAR_OVERLAPS = """() => {
  const nav = document.querySelector('.md-sidebar--primary');
  const shown = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 && r; };
  const wrap = nav.querySelector('.md-sidebar__scrollwrap').getBoundingClientRect();
  const title = nav.querySelector('.md-nav--primary > .md-nav__title');
  const box = title && getComputedStyle(title).display !== 'none' && shown(title);
  // what is drawn of the title: its text may spill below its own box
  const drawn = box && [...title.querySelectorAll('*'), title].map(shown).filter(Boolean)
    .reduce((a, r) => ({top: Math.min(a.top, r.top), bottom: Math.max(a.bottom, r.bottom)}),
            {top: box.top, bottom: box.bottom});
  const links = [...nav.querySelectorAll('.md-nav__link')].map(a => [a.textContent.trim(), shown(a)])
    .filter(([, r]) => r && r.bottom > wrap.top && r.top < wrap.bottom);
  return {title: !!box, covered: drawn ? links.filter(([, r]) => r.top < drawn.bottom && r.bottom > drawn.top
                                                               && r.top >= drawn.top - 1).map(([t]) => t) : []};
}"""


def test_sidebar_title_covers_no_nav_entry(tab, site_url, note_names):
    """At 1400 px the left sidebar scrolls to the open note, deep in the nav: nothing of the site's
    title lies over the entries scrolled beneath it (the header already names the site)."""
    stem = Path(note_names[len(note_names) // 2]).stem  # an entry well down the nav
    tab.goto(f"{site_url}notes/{stem}/")
    got = tab.page.evaluate(SIDEBAR_OVERLAPS)
    assert not got["covered"], f"the sidebar title lies over {got['covered']}"


SHAPE_JS = r"""() => {
  // NOTE_SHAPE.md on a phone: the 结论 card starts on the first screen; the picture after it (the
  // first drawn SVG before 源码位置) is shown, at least 200 px wide; the howto box is closed
  const card = document.querySelector('.ms-conclusion');
  if (!card) return null;
  const sources = [...document.querySelectorAll('article h2')].find(h => h.textContent.includes('源码位置'));
  const before = el => !sources || (el.compareDocumentPosition(sources) & Node.DOCUMENT_POSITION_FOLLOWING);
  const pic = [...document.querySelectorAll('article svg.ms-figure')].find(
    s => (card.compareDocumentPosition(s) & Node.DOCUMENT_POSITION_FOLLOWING) && before(s));
  const howto = [...document.querySelectorAll('article details.ms-howto')];
  const r = card.getBoundingClientRect();
  const p = pic && pic.getBoundingClientRect();
  const box = pic && pic.closest('.jp-OutputArea-output');
  const goals = document.querySelector('.ms-goals');
  return {cardTop: r.top + window.scrollY, cardHeight: r.height, vh: window.innerHeight,
          picBottom: p ? p.bottom + window.scrollY : null,
          picClipped: box ? box.scrollWidth > box.clientWidth + 1 : null,
          goalsAfterPicture: !!(pic && goals &&
                                (pic.compareDocumentPosition(goals) & Node.DOCUMENT_POSITION_FOLLOWING)),
          facts: card.querySelectorAll('li').length,
          picture: pic ? {width: pic.getBoundingClientRect().width, shown: !pic.closest('details:not([open])')} : null,
          howto: howto.map(d => ({open: d.open, summary: d.querySelector('summary').getBoundingClientRect().height})),
          pageWidth: document.documentElement.scrollWidth, vw: document.documentElement.clientWidth};
}"""


def test_conclusion_card_starts_on_a_phones_first_screen(phone, site_url, note_names):
    """Notes in the shape of ../shared/NOTE_SHAPE.md (a **结论** block under 阅读目标): at 390 px
    the card begins on the first screen, the main picture follows it, readable and not folded,
    and the "本页怎么跑出来的" box is there, closed. Screenshots: /tmp/shots/shape-NN.png."""
    shaped, problems = [], []
    for name in note_names:
        stem = Path(name).stem
        phone.goto(f"{site_url}notes/{stem}/")
        got = phone.page.evaluate(SHAPE_JS)
        if got is None:
            continue
        shaped.append(stem)
        _shot(phone.page, f"shape-{stem[:2]}.png")
        if got["cardTop"] + 40 > got["vh"]:
            problems.append(f"{stem}: the 结论 card starts at {got['cardTop']:.0f} px (screen {got['vh']})")
        if got["pageWidth"] > got["vw"]:  # opened at 390 px (a page resized to it can differ)
            problems.append(f"{stem}: the page scrolls sideways at 390 px: {got['pageWidth']} px")
        if got["facts"] < 3:
            problems.append(f"{stem}: the card holds {got['facts']} facts")
        pic = got["picture"]
        if not pic or not pic["shown"] or pic["width"] < 200:
            problems.append(f"{stem}: no readable picture after the card before 源码位置: {pic}")
        if not got["howto"] or any(h["open"] or h["summary"] < 10 for h in got["howto"]):
            problems.append(f"{stem}: the 本页怎么跑出来的 box is missing or open: {got['howto']}")
    if not shaped:
        pytest.skip("no note has the 结论 block yet")
    assert not problems, "\n".join(problems)
    phone.assert_clean()


def test_conclusion_card_and_its_picture_fill_a_desktops_first_screen(tab, site_url, note_names):
    """At 1400 x 900 a note in the shape shows the answer without a scroll: the whole 结论 card
    and the whole main picture, not cut at the right (hooks/site_cells.py moves the goals list
    below the picture and folds the picture's code under it). Screenshots: /tmp/shots/first-NN.png."""
    shaped, problems = [], []
    for name in note_names:
        stem = Path(name).stem
        tab.goto(f"{site_url}notes/{stem}/")
        got = tab.page.evaluate(SHAPE_JS)
        if got is None:
            continue
        shaped.append(stem)
        _shot(tab.page, f"first-{stem[:2]}.png")
        if got["cardTop"] + got["cardHeight"] > got["vh"]:
            problems.append(
                f"{stem}: the card ends at {got['cardTop'] + got['cardHeight']:.0f} px (screen {got['vh']})"
            )
        if got["picBottom"] is None or got["picBottom"] > got["vh"]:
            problems.append(f"{stem}: the picture ends at {got['picBottom']} px (screen {got['vh']})")
        if got["picClipped"]:
            problems.append(f"{stem}: the picture is wider than the column: it is cut at the right")
        if not got["goalsAfterPicture"]:
            problems.append(f"{stem}: the goals list is not below the picture")
    if not shaped:
        pytest.skip("no note has the 结论 block yet")
    assert not problems, "\n".join(problems)
    tab.assert_clean()
