"""Heading ids (part of hooks/notes_site.py): every heading of a note page gets a readable id.

mkdocs-jupyter 0.26.3 slugs headings with an ASCII-only slugify, so a heading that is only Chinese
gets ``id=""`` and its TOC entry points at a generated ``#_3`` that does not exist; its TOC also
comes from a second, markdown-only conversion in which inline code is deleted. Here every h1-h6 of
a notebook page gets a unique, readable id from the same ``slugify_unicode`` the Markdown pages use
(CJK characters kept), its permalink is pointed at that id, and the hook rebuilds ``page.toc`` from
the headings that were actually rendered, so the sidebar and the page cannot disagree.
"""

from __future__ import annotations

import html
import re

from markdown.extensions.toc import slugify_unicode

HEADING = re.compile(r"<h([1-6])(\s[^>]*)?>(.*?)</h\1\s*>", re.S | re.I)
ID_ATTR = re.compile(r"""\sid\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", re.I)
ANY_ID = re.compile(r"""\sid\s*=\s*["']([^"']*)["']""", re.I)
# nbconvert's permalink inside a heading: <a class="anchor-link" href="#...">¶</a>
ANCHOR_LINK = re.compile(r"""<a\s+class="anchor-link"\s+href="[^"]*"\s*>(.*?)</a>""", re.S)
TAG = re.compile(r"<[^>]+>")


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
            lambda a: f'<a class="headerlink" href="#{ident}" title="Permanent link">{a.group(1)}</a>', inner
        )
        tokens.append({"level": level, "id": ident, "name": html.escape(text, quote=False)})
        return f'<h{level} id="{ident}"{attrs}>{inner}</h{level}>'

    return HEADING.sub(repl, content), tokens
