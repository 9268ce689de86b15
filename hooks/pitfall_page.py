"""mkdocs hook: the pitfall page's table and self-test question, built from the pitfall records.

``pitfalls.md`` holds two markers, replaced by the table and the question built from
``snippets/site/pitfalls.json`` and the notes' own declarations (:mod:`snippets.site.pitfalls`):
a new record shows up without editing the page.
"""

from __future__ import annotations

from pathlib import Path

from snippets.site import pitfalls

PITFALL_PAGE = "pitfalls.md"
TABLE_MARK = "<!-- pitfall-table -->"
QUIZ_MARK = "<!-- pitfall-self-test -->"
MAIN_MARK = "<!-- pitfall-main -->"


def on_page_markdown(markdown_text, page, config, files):
    if page.file.src_uri != PITFALL_PAGE:
        return markdown_text
    notes_dir = Path(config.docs_dir) / "notes"
    data = pitfalls.load()
    return (
        markdown_text.replace(TABLE_MARK, pitfalls.table(notes_dir, data))
        .replace(QUIZ_MARK, pitfalls.self_test(notes_dir, data))
        .replace(MAIN_MARK, pitfalls.main_label(data))
    )
