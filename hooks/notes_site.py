"""MkDocs hook for the megatron-study site: everything the notebooks need beyond the plugins.

1. Navigation. The round sections of the nav are built from the notebooks actually present in
   ``docs/notes`` (a symlink to ``notes/``), so ``mkdocs build --strict`` is clean whether or not
   a given note has been written yet. A note ``NN_slug.ipynb`` goes to the round ``ROUNDS`` gives
   for ``NN``; its nav title is the notebook's first H1.

2. Heading ids. mkdocs-jupyter 0.26.3 slugs headings with an ASCII-only slugify, so a heading
   that is only Chinese gets ``id=""`` and its TOC entry points at a generated ``#_3`` that does
   not exist; its TOC also comes from a second, markdown-only conversion in which inline code is
   deleted. Here every h1-h6 of a notebook page gets a unique, readable id from the same
   ``slugify_unicode`` the Markdown pages use (CJK characters kept), its permalink is pointed at
   that id, and ``page.toc`` is rebuilt from the headings that were actually rendered, so the
   sidebar and the page cannot disagree.

3. Offline. nbconvert's template emits a MathJax ``<script src="">`` (empty URL with
   ``custom_mathjax_url`` unset) plus its config, and a module script that imports mermaid from
   cdnjs. The notes use neither, and the site must load nothing external, so both are removed.

4. Download. Each note page gets a button linking to its ``.ipynb``, which mkdocs-jupyter's
   ``include_source`` copies next to the page.

5. Page weight. nbconvert inlines ~600 KB of identical JupyterLab CSS into every note page.
   It is moved into one shared stylesheet per distinct CSS text (``assets/stylesheets/
   jupyter-<hash>.css``), linked from the same place in the page, so the cascade is unchanged
   and browsers cache it once for all notes.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import re
from pathlib import Path

from markdown.extensions.toc import nest_toc_tokens, slugify_unicode
from mkdocs.structure.toc import get_toc
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.notes_site")

NOTES_DIR = "notes"  # inside docs_dir
NOTE_NAME = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")

# Round titles in nav order, and the note numbers each one holds (ROADMAP.md).
ROUNDS: list[tuple[str, set[int]]] = [
    ("第一轮：训练主链路", set(range(1, 8))),
    ("第二轮：并行机制", set(range(8, 18)) | {23}),
    ("第三轮：训练系统专题", set(range(18, 22))),
    ("RL：训推权重同步", {22}),
]

# Every note the roadmap plans (../shared/ROADMAP.md), for the home page's map. A note that
# exists in notes/ shows its own H1 title and a link; the others show the plan and 计划中.
PLAN: dict[int, str] = {
    1: "训练全流程总览", 2: "分布式初始化", 3: "数据与 batch 流", 4: "model provider 与 GPTModel",
    5: "forward、loss、backward", 6: "梯度同步与优化器", 7: "checkpoint",
    8: "parallel_state 与 RankGenerator", 9: "TP mappings：f 与 g",
    10: "ColumnParallelLinear 与 RowParallelLinear", 11: "走读一层 TransformerLayer",
    12: "vocab-parallel embedding 与 cross entropy", 13: "pipeline schedules",
    14: "数据并行 DDP", 15: "分布式优化器（ZeRO-1）", 16: "context parallel",
    17: "MoE 与 expert parallel", 18: "数据专题", 19: "模型专题", 20: "优化器专题",
    21: "checkpoint 专题", 22: "refit 与 resharding", 23: "一个 tensor 的旅程",
}
NOTE_MAP_MARK = "<!-- note-map -->"

# ---------------------------------------------------------------------------- nav


def _first_h1(nb_path: Path) -> str | None:
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for line in src.splitlines():
            m = re.match(r"^#\s+(.+?)\s*#*\s*$", line)
            if m:
                return m.group(1).replace("`", "")
    return None


def note_sections(docs_dir: Path) -> list[dict]:
    """Nav sections for the notebooks present in ``docs_dir/notes``, in ROUNDS order."""
    notes_dir = docs_dir / NOTES_DIR
    found: dict[str, list[dict]] = {title: [] for title, _ in ROUNDS}
    for nb in sorted(notes_dir.glob("*.ipynb")) if notes_dir.is_dir() else []:
        m = NOTE_NAME.match(nb.name)
        if not m:
            log.warning("notes/%s: not named NN_slug.ipynb, left out of the nav", nb.name)
            continue
        number = int(m.group(1))
        round_title = next((t for t, numbers in ROUNDS if number in numbers), None)
        if round_title is None:
            log.warning("notes/%s: note %02d has no round in hooks/notes_site.py ROUNDS",
                        nb.name, number)
            continue
        title = _first_h1(nb) or nb.stem
        found[round_title].append({title: f"{NOTES_DIR}/{nb.name}"})
    return [{title: pages} for title, pages in found.items() if pages]


def note_map(docs_dir: Path) -> str:
    """The home page's map of notes: every planned note by round, with its status."""
    present = {}
    notes_dir = docs_dir / NOTES_DIR
    for nb in sorted(notes_dir.glob("*.ipynb")) if notes_dir.is_dir() else []:
        m = NOTE_NAME.match(nb.name)
        if m:
            present[int(m.group(1))] = nb
    lines = []
    for round_title, numbers in ROUNDS:
        lines += [f"**{round_title}**", "", "| # | 笔记 | 状态 |", "|---|---|---|"]
        for n in sorted(numbers | {k for k in present if k in numbers}):
            if n in present:
                title = re.sub(r"^\d\d\s+", "", _first_h1(present[n]) or present[n].stem)
                lines.append(f"| {n:02d} | [{title}]({NOTES_DIR}/{present[n].name}) | 可运行 |")
            else:
                lines.append(f"| {n:02d} | {PLAN.get(n, '')} | 计划中 |")
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if NOTE_MAP_MARK in markdown:
        markdown = markdown.replace(NOTE_MAP_MARK, note_map(Path(config.docs_dir)))
    return markdown


def on_config(config):
    nav = list(config.nav or [])
    nav.extend(note_sections(Path(config.docs_dir)))
    config.nav = nav
    return config


# ---------------------------------------------------------------------------- page content

HEADING = re.compile(r"<h([1-6])(\s[^>]*)?>(.*?)</h\1\s*>", re.S | re.I)
ID_ATTR = re.compile(r"""\sid\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", re.I)
ANY_ID = re.compile(r"""\sid\s*=\s*["']([^"']*)["']""", re.I)
# nbconvert's permalink inside a heading: <a class="anchor-link" href="#...">¶</a>
ANCHOR_LINK = re.compile(r"""<a\s+class="anchor-link"\s+href="[^"]*"\s*>(.*?)</a>""", re.S)
TAG = re.compile(r"<[^>]+>")

# Script blocks nbconvert's lab template adds that would load code from a CDN.
CDN_SCRIPTS = [
    # MathJax loader (src is the CDN, or "" when mkdocs-jupyter's custom_mathjax_url is unset)
    re.compile(r"<!-- Load mathjax -->\s*<script\s+src=\"[^\"]*\">\s*</script>", re.S),
    re.compile(r"<!-- MathJax configuration -->\s*<script type=\"text/x-mathjax-config\">"
               r".*?</script>\s*<!-- End of mathjax configuration -->", re.S),
    # mermaid: imported from cdnjs when a .jp-Mermaid block is on the page
    re.compile(r"<script type=\"module\">(?:(?!</script>).)*?jp-Mermaid.*?</script>", re.S),
]


def is_note(page) -> bool:
    src = page.file.src_uri
    return src.startswith(f"{NOTES_DIR}/") and src.endswith(".ipynb")


def heading_text(inner_html: str) -> str:
    """Visible text of a heading's inner HTML, without the permalink."""
    inner = ANCHOR_LINK.sub("", inner_html)
    inner = re.sub(r"""<a\s+class="headerlink"[^>]*>.*?</a>""", "", inner, flags=re.S)
    return " ".join(html.unescape(TAG.sub("", inner)).split())


def fix_headings(content: str) -> tuple[str, list[dict]]:
    """Give every h1-h6 a unique non-empty id; return new HTML and flat TOC tokens."""
    # ids that exist outside headings (e.g. nbconvert's "cell-3" copy targets) are taken
    taken = {i for i in ANY_ID.findall(HEADING.sub("", content)) if i}
    tokens: list[dict] = []

    def unique(base: str) -> str:
        candidate, n = base, 0
        while candidate in taken:
            n += 1
            candidate = f"{base}_{n}"
        taken.add(candidate)
        return candidate

    def repl(m: re.Match) -> str:
        level, attrs, inner = int(m.group(1)), m.group(2) or "", m.group(3)
        text = heading_text(inner)
        ident = unique(slugify_unicode(text, "-") or f"section-h{level}")
        attrs = ID_ATTR.sub("", attrs)
        # nbconvert's "¶" becomes a material permalink (styled, and skipped by search)
        inner = ANCHOR_LINK.sub(
            lambda a: f'<a class="headerlink" href="#{ident}" title="Permanent link">'
                      f"{a.group(1)}</a>", inner)
        tokens.append({"level": level, "id": ident, "name": html.escape(text, quote=False)})
        return f'<h{level} id="{ident}"{attrs}>{inner}</h{level}>'

    return HEADING.sub(repl, content), tokens


def strip_cdn_scripts(content: str) -> str:
    for pattern in CDN_SCRIPTS:
        content = pattern.sub("", content)
    return content


_DOWNLOAD_ICON = None


def download_button(nb_name: str) -> str:
    global _DOWNLOAD_ICON
    if _DOWNLOAD_ICON is None:
        import material

        icon = Path(material.__file__).parent / "templates/.icons/material/download.svg"
        _DOWNLOAD_ICON = icon.read_text(encoding="utf-8") if icon.exists() else "⤓"
    return (f'<a href="{nb_name}" download class="md-content__button md-icon nb-download" '
            f'title="下载 Notebook（{nb_name}）" aria-label="下载 Notebook">'
            f"{_DOWNLOAD_ICON}</a>")


STYLE = re.compile(r"<style[^>]*>.*?</style>", re.S | re.I)
CSS_DIR = "assets/stylesheets"
_shared_css: dict[str, str] = {}  # site path -> CSS text, written on_post_build


def share_styles(content: str, page) -> str:
    """Replace the template's inline <style> blocks by a link to one shared, cached file.

    Only the blocks before the notebook body (the template header) move; a <style> inside a
    cell or an output stays where it is.
    """
    body = content.find('<div class="jupyter-wrapper">')
    head = content[:body] if body >= 0 else ""
    blocks = STYLE.findall(head)
    if not blocks:
        return content
    css = "\n".join(re.sub(r"^<style[^>]*>|</style>$", "", b, flags=re.I) for b in blocks)
    digest = hashlib.sha256(css.encode("utf-8")).hexdigest()[:12]
    path = f"{CSS_DIR}/jupyter-{digest}.css"
    _shared_css[path] = css
    link = f'<link rel="stylesheet" href="{get_relative_url(path, page.url)}">'
    first = head.index(blocks[0])
    return content[:first] + link + STYLE.sub("", head[first:]) + content[body:]


def on_pre_build(config):
    _shared_css.clear()


def on_post_build(config):
    for path, css in _shared_css.items():
        target = Path(config.site_dir) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(css, encoding="utf-8")


def on_page_content(content, page, config, files):
    if not is_note(page):
        return content
    content = strip_cdn_scripts(content)
    content = share_styles(content, page)
    content, tokens = fix_headings(content)
    page.toc = get_toc(nest_toc_tokens(list(tokens)))  # nest_toc_tokens empties its argument
    # lets mkdocs' own anchor validation check Markdown links like notes/02_x.ipynb#阅读目标
    page.present_anchor_ids = {i for i in ANY_ID.findall(content) if i}
    h1 = next((t for t in tokens if t["level"] == 1), None)
    if h1 is not None:
        page.title = html.unescape(h1["name"])
    # include_source copies the .ipynb into the page's own directory
    return download_button(Path(page.file.abs_src_path).name) + content
