"""A note page's rendered cells (part of hooks/notes_site.py): offline, folded, light, one download.

Offline: nbconvert's template emits a MathJax ``<script src="">`` (empty URL with
``custom_mathjax_url`` unset) plus its config, and a module script that imports mermaid from cdnjs.
The notes use neither, and the site must load nothing external, so both are removed. Download: each
note page gets a button linking to its ``.ipynb``, which mkdocs-jupyter's ``include_source`` copies
next to the page. Cells: tagged cells fold (issue 20), code stays out of the search index, SVG
outputs are inlined, the copy icon is drawn once, and whitespace is squeezed.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from site_headings import TAG

# Script blocks nbconvert's lab template adds that would load code from a CDN.
CDN_SCRIPTS = [
    # MathJax loader (src is the CDN, or "" when mkdocs-jupyter's custom_mathjax_url is unset)
    re.compile(r"<!-- Load mathjax -->\s*<script\s+src=\"[^\"]*\">\s*</script>", re.S),
    re.compile(
        r"<!-- MathJax configuration -->\s*<script type=\"text/x-mathjax-config\">"
        r".*?</script>\s*<!-- End of mathjax configuration -->",
        re.S,
    ),
    # mkdocs-jupyter 0.27's own MathJax loader: on every note page it fetches MathJax from jsdelivr
    # (the notes have no math)
    re.compile(r"<script data-mkdocs-jupyter-mathjax=\"[^\"]*\">.*?</script>", re.S),
    # mermaid: imported from cdnjs when a .jp-Mermaid block is on the page
    re.compile(r"<script type=\"module\">(?:(?!</script>).)*?jp-Mermaid.*?</script>", re.S),
]


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
    return (
        f'<a href="{nb_name}" download class="md-content__button md-button nb-download" '
        f"data-search-exclude "
        f'title="下载 Notebook（{nb_name}），放进 notes/ 就能在 Jupyter 里重跑">'
        f'<span class="nb-download__icon" aria-hidden="true">{_DOWNLOAD_ICON}</span>'
        f"下载 .ipynb</a>"
    )


# ---------------------------------------------------------------------------- cells
# Conventions of issue 20 (brief): a code cell tagged ``hide-input`` shows its output and keeps
# its input behind a closed "显示代码"; a cell tagged ``answer`` computes a 自测 answer, so all of
# it (input and output) stays closed until asked for. nbconvert writes a cell's tags as
# ``celltag_<tag>`` classes on the cell's <div>; the folds are made on the rendered HTML.

DIV_TAG = re.compile(r"<(/?)div\b[^>]*>", re.I)
CODE_CELL = re.compile(r'<div id="cell-id=[^"]*" class="jp-Cell jp-CodeCell[^"]*">')
INPUT_WRAPPER = '<div class="jp-Cell-inputWrapper"'
TOOLBAR = '<div class="celltoolbar">'
TD_CODE = re.compile(r"(<td>(?:(?!</td>).)*?<code>)([^<]{16,})(</code>)", re.S)
BREAK_AFTER = re.compile(r"(::|[_./](?=[A-Za-z0-9]))")
SHAPE_CELL = re.compile(r"<td>((?:<code>)?[\[(][\d, ]{0,40}[\])](?:</code>)?)</td>")
# the copy button's icon, ~800 bytes in every code cell: drawn once per page, used by reference
COPY_ICON = re.compile(
    r'<svg (?:data-search-exclude )?aria-hidden="true" width="20" height="20" viewBox="0 0 16 16" '
    r'version="1\.1"\s+data-view-component="true" class="clipboard-copy-icon">(.*?)</svg>',
    re.S,
)
SVG_IMG = re.compile(r'<img\s+src="data:image/svg\+xml;base64,([A-Za-z0-9+/=\s]+)"[^>]*>')
CHECKED_LINE = (
    '<p class="ms-checked" data-search-exclude>'
    "这一页怎样检查：CI 用 nbval 重新执行整本 notebook，逐个单元格比对"
    "存下的输出；页面上的表格和图都是这次运行打印、画出来的，不是手写的。</p>"
)


def _div_end(content: str, start: int) -> int:
    """Index just past the ``</div>`` that closes the ``<div`` opening at ``start``."""
    depth = 0
    for m in DIV_TAG.finditer(content, start):
        depth += -1 if m.group(1) else 1
        if depth == 0:
            return m.end()
    raise ValueError(f"unbalanced <div> at {start}")


def _code_lines(input_html: str) -> int:
    pre = re.search(r"<pre>(.*?)</pre>", input_html, re.S)
    return html.unescape(TAG.sub("", pre.group(1))).rstrip("\n").count("\n") + 1 if pre else 0


def fold_cells(content: str) -> str:
    """Fold tagged cells (see above), keep every code input out of the search index (previews
    show prose, and the index stays small: the code is one click away on the page), and mark
    listing() outputs the same way."""
    out, pos = [], 0
    for m in CODE_CELL.finditer(content):
        if m.start() < pos:
            continue
        end = _div_end(content, m.start())
        cell = content[m.start() : end]
        head, inner = cell[: m.end() - m.start()], cell[m.end() - m.start() : -len("</div>")]
        classes = m.group(0)
        # mkdocs-jupyter prints a cell's tags above its code ("hide-input"): machinery, not text
        t = inner.find(TOOLBAR)
        if t >= 0:
            inner = inner[:t] + inner[_div_end(inner, t) :]
        i = inner.find(INPUT_WRAPPER)
        if i >= 0:
            j = i + (_div_end(inner, i) - i)
            # material's search parser matches a closing tag to the excluded element by tag name
            # only, so the mark goes on elements with no same-tag child: the <pre> and the
            # copy button's plain-text copy
            n = _code_lines(inner[i:j])
            wrapper = re.sub(r"<pre>", "<pre data-search-exclude>", inner[i:j])
            wrapper = wrapper.replace(
                'class="clipboard-copy-txt"', 'class="clipboard-copy-txt" data-search-exclude'
            )
            if "celltag_hide-input" in classes and "celltag_answer" not in classes:
                wrapper = (
                    f'<details class="ms-fold ms-fold-input"><summary data-search-exclude>显示代码'
                    f'<span class="ms-fold__n">（{n} 行）</span></summary>{wrapper}</details>'
                )
            inner = inner[:i] + wrapper + _unsearched(inner[j:])
        if "celltag_answer" in classes:
            inner = (
                '<details class="ms-fold ms-fold-answer"><summary data-search-exclude>答案的运行结果'
                '<span class="ms-fold__n">（计算它的代码和输出）</span></summary>'
                f"{inner}</details>"
            )
        out += [content[pos : m.start()], head, inner, "</div>"]
        pos = end
    out.append(content[pos:])
    content = "".join(out)
    # a long identifier in a table cell may break after _ . / :: rather than anywhere
    content = TD_CODE.sub(
        lambda m: m.group(1) + BREAK_AFTER.sub(r"\1<wbr>", m.group(2)) + m.group(3), content
    )
    # a cell that holds only a shape or a short list of numbers stays on one line
    content = SHAPE_CELL.sub(r'<td class="ms-nowrap">\1</td>', content)
    # prompts (In [3]: / Out[3]:), 调用链 trees and other <pre> in prose, pictures: not words
    content = re.sub(
        r'<div class="(jp-(?:In|Out)putPrompt [^"]*)">', r'<div class="\1" data-search-exclude>', content
    )
    content = content.replace(
        '<span class="notice" hidden>', '<span class="notice" hidden data-search-exclude>'
    )
    content = re.sub(r"<(pre|svg)\b(?![^>]*data-search-exclude)", r"<\1 data-search-exclude", content)
    # a 自测 answer stays folded in search too: a result preview would give it away
    content = re.sub(r"<details>(\s*<summary>答案)", r"<details data-search-exclude>\1", content)
    return content.replace('<details class="ms-listing">', '<details class="ms-listing" data-search-exclude>')


# ---------------------------------------------------------------------------- the note's shape
# ../shared/NOTE_SHAPE.md: a note answers first. Under 阅读目标 a paragraph "**结论**" and the list
# after it (with the "先读：…；约 N 分钟。" line that follows) become one card, the first thing a
# reader's eye lands on. The folded "本页怎么跑出来的" box (how the page is produced) and "在 CPU 上怎么
# 跑的" (the CPU part of 遗留问题) get a quiet style, and stay out of the search index as the 自测
# answers do: a search is for the lesson, not for our harness. The other folds (完整调用链, 每个函数的
# 记录) keep the default style; the call tree is a <pre> (never indexed), the record table below.
CONCLUSION = re.compile(
    r"<p>\s*<strong>结论</strong>[^<]*</p>\s*<(ul|ol)>.*?</\1>"
    r"(?:\s*<p>\s*(?:<strong>)?先读[：:].*?</p>)?",
    re.S,
)
QUIET_FOLDS = ("本页怎么跑出来的", "在 CPU 上怎么跑的")
# the roadmap's per-function record (函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | ...): reference,
# folded in the note shape, and ~50 KB of the search index when indexed; its functions stay
# findable through the 源码位置 tables and the prose
RECORD_TABLE = re.compile(r"<table>(\s*<thead>\s*<tr>\s*<th[^>]*>\s*函数\s*</th>\s*<th[^>]*>\s*输入)")
QUIET_DETAILS = re.compile(r"<details>(\s*<summary>\s*(?:%s))" % "|".join(QUIET_FOLDS))


def mark_note_shape(content: str) -> str:
    """The 结论 card and the quiet, unsearched folds of the note shape (see above)."""

    def card(m: re.Match) -> str:
        block = re.sub(r"<p>(\s*(?:<strong>)?先读[：:])", r'<p class="ms-prereq">\1', m.group(0), count=1)
        return f'<div class="ms-conclusion">{block}</div>'

    content = CONCLUSION.sub(card, content, count=1)
    content = _goals_after_picture(content)
    content = RECORD_TABLE.sub(r"<table data-search-exclude>\1", content)
    return QUIET_DETAILS.sub(r'<details class="ms-howto" data-search-exclude>\1', content)


GOALS_LABEL = '<p class="ms-goals-label"><strong>读完本篇能做到</strong></p>'


def _goals_after_picture(content: str) -> str:
    """The first screen holds the answer: the 结论 card, then the note's main picture (the first
    drawn figure after the card, before the next section), then the goals list that the card
    answers. In the note the goals come first (the roadmap's template); on the page they move below
    the picture's cell, with a label. Without a picture before the next section the list stays and
    is marked .ms-goals (a phone shows the card first, extra.css); with no goals list right before
    the card the page is left as it is."""
    at = content.find('<div class="ms-conclusion">')
    goals = content.rfind("<ol>", 0, at)
    if at < 0 or goals < 0:
        return content
    goals_end = content.find("</ol>", goals) + len("</ol>")
    if not re.fullmatch(r"\s*", content[goals_end:at]):
        return content
    card_end = content.find("</div>", at) + len("</div>")
    section_end = content.find("<h2", card_end)
    figure = content.find('class="ms-figure', card_end)
    if figure < 0 or 0 <= section_end < figure:
        # no picture to show first: the list stays, marked, and a phone shows the card before it
        return content[:goals] + '<ol class="ms-goals">' + content[goals + 4 :]
    # the cell that holds the figure: the first cell after the card's whose end lies past it
    cell = content.find('class="jp-Cell ', card_end)
    while cell >= 0:
        start = content.rfind("<div", 0, cell)
        try:
            end = _div_end(content, start)
        except ValueError:  # markup that does not close: leave the page as it is
            return content
        if start > figure:
            return content
        if end > figure:
            break
        cell = content.find('class="jp-Cell ', end)
    else:
        return content
    # the picture's folded code goes below the picture: the fold's summary line would sit between
    # the card and the picture
    cell_html = content[start:end]
    fold = re.search(r'<details class="ms-fold ms-fold-input">.*?</details>', cell_html, re.S)
    if fold:
        inner_end = cell_html.rfind("</div>", 0, cell_html.rfind("</div>"))  # inside the cell's own div
        closing = cell_html[inner_end:]
        body = cell_html[: fold.start()] + cell_html[fold.end() : inner_end]
        cell_html = body + fold.group(0) + closing
    moved = (
        '<div class="jp-Cell jp-MarkdownCell ms-goals-cell"><div class="jp-RenderedHTMLCommon '
        f'jp-RenderedMarkdown jp-MarkdownOutput">{GOALS_LABEL}<ol class="ms-goals">'
        f"{content[goals + 4 : goals_end]}</div></div>"
    )
    # the picture's cell is the note's hero: no "Out[1]:" prompt column beside it (extra.css)
    cell_html = cell_html.replace('class="jp-Cell ', 'class="ms-hero jp-Cell ', 1)
    return content[:goals] + content[goals_end:start] + cell_html + moved + content[end:]


PREREQ_LINE = re.compile(r'(<p class="ms-prereq">)(.*?)(</p>)', re.S)
MINUTES = re.compile(r"约\s*(?:\d+|N)\s*分钟")  # N: the scaffold's placeholder


def show_measured_minutes(content: str, minutes: int) -> str:
    """The card's 先读 line gives the minutes the site measures (hooks/site_generated.py
    reading_minutes, as the home page does), not a number typed by hand."""

    def fix(m: re.Match) -> str:
        said = m.group(2)
        said = (
            MINUTES.sub(f"约 {minutes} 分钟", said, count=1)
            if MINUTES.search(said)
            else f"{said}（约 {minutes} 分钟）"
        )
        return m.group(1) + said + m.group(3)

    return PREREQ_LINE.sub(fix, content, count=1)


def _unsearched(outputs: str) -> str:
    """A cell's printed tables and text, kept out of the search index: the index is for the
    prose (what a result preview shows), and every reader's browser loads it on every page."""
    return re.sub(r"<(table|pre)>", r"<\1 data-search-exclude>", outputs)


PRE_OR_SCRIPT = re.compile(r"<(pre|script|style|textarea)\b.*?</\1>", re.S | re.I)
INDENT = re.compile(r"\n[ \t]*(?:\n[ \t]*)*")


def squeeze_whitespace(content: str) -> str:
    """nbconvert's template indents its markup and leaves blank lines (~30 KB on a long note).
    Outside <pre> (and script, style) a run of newlines and indentation renders as one space
    either way: it becomes one newline."""
    out, pos = [], 0
    for m in PRE_OR_SCRIPT.finditer(content):
        out += [INDENT.sub("\n", content[pos : m.start()]), m.group(0)]
        pos = m.end()
    out.append(INDENT.sub("\n", content[pos:]))
    return "".join(out)


def share_copy_icon(content: str) -> str:
    first = COPY_ICON.search(content)
    if first is None:
        return content
    symbol = (
        '<svg width="0" height="0" style="position:absolute" aria-hidden="true" data-search-exclude>'
        '<symbol id="ms-copy-icon" viewBox="0 0 16 16">'
        f"{first.group(1).strip()}</symbol></svg>"
    )
    use = (
        '<svg aria-hidden="true" width="20" height="20" viewBox="0 0 16 16" class="clipboard-copy-icon">'
        '<use href="#ms-copy-icon"/></svg>'
    )
    return symbol + COPY_ICON.sub(use, content)


def inline_svgs(content: str) -> str:
    """nbconvert shows an ``image/svg+xml`` output as ``<img src="data:...base64">``: inside an
    <img> the picture cannot see the page's CSS variables (light/dark palette) nor be read by
    search or screen readers as text. Put the SVG itself in the page."""
    import base64

    def repl(m: re.Match) -> str:
        svg = base64.b64decode(m.group(1)).decode("utf-8")
        svg = re.sub(r"^\s*<\?xml[^>]*\?>\s*", "", svg)
        return svg.strip()

    return SVG_IMG.sub(repl, content)


def add_checked_line(content: str) -> str:
    """One sentence on how the page is checked (said once, by the site): inside the note's folded
    "本页怎么跑出来的" box where it has one (how the page is produced stays out of the reader's
    path, NOTE_SHAPE.md), else under the note's H1."""
    box = re.search(r'<details class="ms-howto"[^>]*>\s*<summary>\s*本页怎么跑出来的\s*</summary>', content)
    m = box or re.search(r"</h1>", content)
    return content[: m.end()] + CHECKED_LINE + content[m.end() :] if m else CHECKED_LINE + content
