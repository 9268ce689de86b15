"""MkDocs hook for the megatron-study site: everything the notebooks need beyond the plugins.

mkdocs loads this file by path (mkdocs.yml ``hooks:``) with its folder first on ``sys.path``, so the
parts below are plain sibling modules, found from a clone at any path. This file holds the mkdocs
events only; each part says in its docstring what it does and why:

- ``site_nav``: the nav's round sections (``ROUNDS``, ``PLAN``), from the notebooks present.
- ``site_generated``: pages generated from the notes (note map, reading paths with measured
  minutes, self-test bank, 30-second answers, note template), put in place of marker comments.
- ``site_note_links``: plain note numbers on docs pages ("笔记 21") become links.
- ``site_render``: build time (nbconvert converts each notebook once, shares compiled templates, and
  skips a BeautifulSoup round trip).
- ``site_headings``: a unique, readable id for every heading of a note page; the TOC rebuilt from them.
- ``site_cells``: offline (no CDN scripts), the download button, folded cells, inline SVGs, the
  note shape's 结论 card and quiet "本页怎么跑出来的" box.
- ``site_css``: page weight (one shared, purged copy of nbconvert's stylesheet).
- ``site_search``: Chinese search words, the query segmenter, a smaller search index.
- ``site_load``: load time (material's script starts after a note page's load event).
"""

from __future__ import annotations

import html
from pathlib import Path

import site_css
from markdown.extensions.toc import nest_toc_tokens
from mkdocs.plugins import CombinedEvent, event_priority
from mkdocs.structure.toc import get_toc
from site_cells import (
    CHECKED_LINE,
    add_checked_line,
    download_button,
    fold_cells,
    inline_svgs,
    mark_note_shape,
    share_copy_icon,
    show_measured_minutes,
    squeeze_whitespace,
    strip_cdn_scripts,
)
from site_generated import (
    CHARS_PER_MINUTE,
    CORE_COMING,
    CORE_PATH,
    GENERATED,
    MINUTES_PER_CELL,
    RL_COMING,
    RL_PATH,
    SEED_QUESTIONS,
    answers_page,
    find_cell,
    note_prerequisites,
    note_question,
    page_minutes,
    reading_minutes,
    reading_minutes_of,
    reading_paths,
    self_test,
    self_test_bank,
    thirty_second_answer,
)
from site_headings import ANY_ID, fix_headings
from site_load import run_material_after_load
from site_nav import NOTE_NAME, NOTES_DIR, PLAN, ROUNDS, _first_h1, _notes_present, is_note, note_sections
from site_note_links import link_note_numbers
from site_render import FocusableMarkup, speed_up_notebook_rendering
from site_search import (
    SEARCH_ATTRIBUTES,
    SEGMENT_FIX,
    WIRE_MARK,
    WORKER_SETUP,
    compact_search_index,
    compact_word_marks,
    decode_word_marks_in_worker,
    drop_plain_copies,
    fix_query_segmenter,
    load_search_words,
    read_search_index,
    without_div_wrappers,
    word_mark_pattern,
)

# what tests and hooks/backlinks.py read from this hook (tests/site/test_site.py load_hook)
__all__ = [
    "CHARS_PER_MINUTE",
    "CHECKED_LINE",
    "CORE_COMING",
    "CORE_PATH",
    "MINUTES_PER_CELL",
    "RL_COMING",
    "RL_PATH",
    "page_minutes",
    "FocusableMarkup",
    "NOTES_DIR",
    "NOTE_NAME",
    "PLAN",
    "ROUNDS",
    "SEED_QUESTIONS",
    "SEGMENT_FIX",
    "WIRE_MARK",
    "WORKER_SETUP",
    "_first_h1",
    "answers_page",
    "compact_word_marks",
    "drop_plain_copies",
    "read_search_index",
    "find_cell",
    "fold_cells",
    "inline_svgs",
    "is_note",
    "link_note_numbers",
    "self_test",
    "self_test_bank",
    "thirty_second_answer",
    "note_prerequisites",
    "note_question",
    "reading_minutes",
    "reading_minutes_of",
    "reading_paths",
    "mark_note_shape",
    "show_measured_minutes",
    "word_mark_pattern",
]


def on_config(config):
    speed_up_notebook_rendering()
    load_search_words()
    nav = list(config.nav or [])
    nav.extend(note_sections(Path(config.docs_dir)))
    config.nav = nav
    return config


def on_pre_build(config):
    site_css.reset()


def on_page_markdown(markdown, page, config, files):
    for mark, render in GENERATED.items():
        if mark in markdown:
            markdown = markdown.replace(mark, render(Path(config.docs_dir)))
    if not is_note(page):
        depth = page.file.src_uri.count("/")
        markdown = link_note_numbers(markdown, _notes_present(Path(config.docs_dir)), "../" * depth)
    return markdown


def on_page_content(content, page, config, files):
    if not is_note(page):
        return content
    content = strip_cdn_scripts(content)
    content = inline_svgs(content)
    content = mark_note_shape(fold_cells(content))
    content = show_measured_minutes(content, reading_minutes(Path(page.file.abs_src_path)))
    content = squeeze_whitespace(share_copy_icon(content))
    content = site_css.share_styles(content, page)
    content, tokens = fix_headings(content)
    page.toc = get_toc(nest_toc_tokens(list(tokens)))  # nest_toc_tokens empties its argument
    # lets mkdocs' own anchor validation check Markdown links like notes/02_x.ipynb#阅读目标
    page.present_anchor_ids = {i for i in ANY_ID.findall(content) if i}
    h1 = next((t for t in tokens if t["level"] == 1), None)
    if h1 is not None:
        page.title = html.unescape(h1["name"])
    content = add_checked_line(content)
    site_css.note_uses(content)
    # include_source copies the .ipynb into the page's own directory
    return download_button(Path(page.file.abs_src_path).name) + content


@event_priority(100)  # before material's search plugin indexes the page
def _index_by_sections(context, page, config, nav):
    if is_note(page):
        page.ms_reader_content = page.content
        page.content = without_div_wrappers(page.content)
    return context


@event_priority(-10)  # after it, before hooks/backlinks.py (-50) reads the finished page
def _give_back_the_page(context, page, config, nav):
    reader = getattr(page, "ms_reader_content", None)
    if reader is not None:
        page.content = SEARCH_ATTRIBUTES.sub("", reader)
        del page.ms_reader_content
    return context


# site_search.without_div_wrappers says why the search parser reads another copy of a note page
on_page_context = CombinedEvent(_index_by_sections, _give_back_the_page)


def on_post_page(output, page, config):
    # mkdocs-jupyter 0.27 adds its MathJax loader to every finished page, not to the content
    output = strip_cdn_scripts(output)
    return run_material_after_load(output) if is_note(page) else output


def on_post_build(config):
    site_dir = Path(config.site_dir)
    fix_query_segmenter(site_dir)
    site_css.write_shared_css(site_dir)
    compact_search_index(site_dir, wire_marks=decode_word_marks_in_worker(site_dir))
