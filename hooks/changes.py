"""mkdocs hook: "到 core_v0.19.0 变了什么" on every note page, and the pitfall lab page.

- On each note page the section is inserted before the 自测 heading's cell (and into the page's
  table of contents), built from ``snippets/site/changes_v019.json`` and the hand-written facts;
  the notes themselves carry nothing.
- ``pitfalls.md`` holds two markers, replaced by the table and the self-test question built from
  the pitfall records (:mod:`snippets.site.pitfalls`): a new record shows up without editing it.

Registered after the other hooks: it expects the note's headings to have their ids already.
"""

from __future__ import annotations

import re
from pathlib import Path

import markdown
from markdown.extensions.toc import slugify_unicode
from mkdocs.structure.toc import AnchorLink

from snippets.site import changes, changes_page

PITFALL_PAGE = "pitfalls.md"
TABLE_MARK = "<!-- pitfall-table -->"
QUIZ_MARK = "<!-- pitfall-self-test -->"
NOTE = re.compile(r"^notes/(\d\d)_[A-Za-z0-9_]+\.ipynb$")
SELF_TEST_ID = "自测"
SECTION_ID = slugify_unicode(changes_page.HEADING, "-")
CELL_START = re.compile(r'<div(?:\s+id="[^"]*")?\s+class="jp-Cell\b')

_data: dict | None = None
_facts: dict | None = None
_current: dict | None = None  # what the notes cite now: a citation newer than the data shows as 未核对


def on_pre_build(config):
    global _data, _facts, _current
    _data, _facts = changes.load(), changes.load_facts()
    _current = changes.note_citations()


def on_page_markdown(markdown_text, page, config, files):
    if page.file.src_uri != PITFALL_PAGE:
        return markdown_text
    notes_dir = Path(config.docs_dir) / "notes"
    return markdown_text.replace(TABLE_MARK, changes_page.pitfall_table(notes_dir, _data, _facts)).replace(
        QUIZ_MARK, changes_page.pitfall_self_test(notes_dir, _data, _facts)
    )


_md: markdown.Markdown | None = None


def _markdown() -> markdown.Markdown:
    global _md  # one converter for all pages: building one per page costs more than converting
    if _md is None:
        _md = markdown.Markdown(extensions=["tables", "md_in_html"])
    return _md


def section_html(number: str) -> str:
    body = changes_page.note_section(number, _data, (_facts or {}).get("facts", {}), _current)
    html = _markdown().reset().convert(body)
    html = html.replace(
        f"<h2>{changes_page.HEADING}</h2>",
        f'<h2 id="{SECTION_ID}">{changes_page.HEADING}'
        f'<a class="headerlink" href="#{SECTION_ID}" title="Permanent link">&para;</a></h2>',
    )
    return (
        # out of the search index: ~75 KB over all notes, and the index is over its budget already
        '<div class="jp-Cell jp-MarkdownCell jp-Notebook-cell ms-changes-cell" data-search-exclude>'
        '<div class="jp-RenderedHTMLCommon jp-RenderedMarkdown jp-MarkdownOutput">'
        f"{html}</div></div>\n"
    )


def insert_section(content: str, section: str) -> str | None:
    """``content`` with ``section`` just before the cell that holds the 自测 heading."""
    heading = re.search(rf'<h2 id="{re.escape(SELF_TEST_ID)}"', content)
    if heading is None:
        return None
    starts = [m.start() for m in CELL_START.finditer(content, 0, heading.start())]
    at = starts[-1] if starts else heading.start()
    return content[:at] + section + content[at:]


def _add_to_toc(page) -> None:
    items = page.toc.items
    siblings = items[0].children if items and items[0].level == 1 else items
    link = AnchorLink(changes_page.HEADING, SECTION_ID, 2)
    at = next((i for i, item in enumerate(siblings) if item.id == SELF_TEST_ID), len(siblings))
    siblings.insert(at, link)


def on_page_content(content, page, config, files):
    m = NOTE.match(page.file.src_uri)
    if m is None or _data is None:
        return content
    new = insert_section(content, section_html(m.group(1)))
    if new is None:
        return content
    _add_to_toc(page)
    if getattr(page, "present_anchor_ids", None) is not None:
        page.present_anchor_ids.add(SECTION_ID)
    return new
