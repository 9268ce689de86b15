"""Search (part of hooks/notes_site.py): Chinese words, the query segmenter, a smaller index.

jieba learns the site's own terms (hooks/jieba_userdict.txt); material's search worker is fixed so a
query's last word is tried whole; and the built ``search/search_index.json`` loses what every reader
downloads for nothing (the second copy of each code cell, inline ``<code>`` marks, zero-width spaces
that separate nothing), while each note's title gains the Chinese names of its topic.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from pathlib import Path

from site_nav import NOTES_DIR

log = logging.getLogger("mkdocs.hooks.notes_site")  # one logger: mkdocs --strict counts its warnings

# The Chinese names of what a note is about, for search: many notes are titled with Megatron's
# English names (Pipeline schedule, DDP), and a reader types 流水线并行. Added to the note's title
# in the search index only (each stays one word: hooks/jieba_userdict.txt lists them too).
SEARCH_TERMS: dict[int, str] = {
    5: "梯度累积",
    6: "梯度同步",
    8: "进程组",
    9: "张量并行",
    10: "张量并行",
    11: "张量并行 序列并行",
    12: "词表并行",
    13: "流水线并行 气泡",
    14: "数据并行 梯度同步",
    15: "分布式优化器",
    16: "上下文并行",
    17: "专家并行",
    20: "分布式优化器 混合精度",
    22: "重切 权重同步",
}


USER_DICT = Path(__file__).with_name("jieba_userdict.txt")
_user_dict_loaded = False


def load_search_words() -> None:
    """Teach jieba (material's Chinese segmenter for the search index) the site's own terms, so
    流水线并行 or 重切 stay one word instead of being cut into single characters. Material's
    ``jieba_dict_user`` option takes a path relative to the working directory; this one is found
    next to the hook wherever mkdocs runs."""
    global _user_dict_loaded
    if _user_dict_loaded:
        return
    try:
        import jieba
    except ImportError:  # material indexes without segmenting; nothing to teach
        return
    jieba.setLogLevel(logging.WARNING)
    jieba.load_userdict(str(USER_DICT))
    _user_dict_loaded = True


# Material's search worker splits a typed Chinese query greedily into words the index knows, but
# its loop stops one character short: the query's last word is never tried whole, so 流水线 is
# searched as 流 and 流水线并行 as 流水线 + 并 (seen; material 9.x, segment() in the worker).
# The two comparisons are corrected in the built copy of the worker; if material's code changes
# and they are not found, the build warns and the worker is left as it is.
SEGMENT_FIX = [
    ("for(let o=s+1;o<t.length;o++)t.slice(s,o)in e", "for(let o=s+1;o<=t.length;o++)t.slice(s,o)in e"),
    ("n[a]&&a<t.length-1&&(i[s++]=a)", "n[a]&&a<t.length&&(i[s++]=a)"),
]


def fix_query_segmenter(site_dir: Path) -> bool:
    workers = sorted((site_dir / "assets" / "javascripts" / "workers").glob("search.*.min.js"))
    for worker in workers:
        code = worker.read_text(encoding="utf-8")
        if all(old in code for old, _ in SEGMENT_FIX):
            for old, new in SEGMENT_FIX:
                code = code.replace(old, new, 1)
            worker.write_text(code, encoding="utf-8")
            return True
    log.warning(
        "search worker: material's query segmenter was not found; Chinese queries keep "
        "losing their last word (hooks/site_search.py SEGMENT_FIX)"
    )
    return False


# Material's search marks every word boundary jieba finds in Chinese text with U+200B (3 bytes in
# UTF-8), ~40,000 of them once the notes are long: a ninth of the index every page loads. On the
# wire each is sent as U+007F (1 byte; never in the site's text, and JSON keeps it unescaped), and
# the worker puts U+200B back first thing, before it builds the index from the documents: what it
# indexes, shows and highlights is unchanged. If material's worker changes and the place is not
# found, the build warns and the index keeps U+200B.
WORD_MARK, WIRE_MARK = "\u200b", "\x7f"
WORKER_SETUP = re.compile(r"constructor\(\{config:(\w+),docs:(\w+),options:(\w+)\}\)\{")


def decode_word_marks_in_worker(site_dir: Path) -> bool:
    """Make the built search worker turn :data:`WIRE_MARK` back into :data:`WORD_MARK` in every
    document's title and text as it receives the index; True when it does."""
    for worker in sorted((site_dir / "assets" / "javascripts" / "workers").glob("search.*.min.js")):
        code = worker.read_text(encoding="utf-8")
        m = WORKER_SETUP.search(code)
        if m and code.count(m.group(0)) == 1:
            docs = m.group(2)
            decode = (
                f"for(const d of {docs}){{d.title=d.title.replaceAll('\\x7f','\\u200b');"
                f"d.text=d.text.replaceAll('\\x7f','\\u200b')}}"
            )
            worker.write_text(code.replace(m.group(0), m.group(0) + decode, 1), encoding="utf-8")
            return True
    log.warning(
        "search worker: material's index setup was not found; the search index keeps its 3-byte "
        "word marks (hooks/site_search.py WORKER_SETUP)"
    )
    return False


def read_search_index(site_dir: Path) -> dict:
    """The built search index as the worker sees it (word marks decoded): for tests and tools."""
    text = (site_dir / "search" / "search_index.json").read_text(encoding="utf-8")
    return json.loads(text.replace(WIRE_MARK, WORD_MARK))


def compact_search_index(site_dir: Path, wire_marks: bool = False) -> None:
    """Rewrite the search index material's search plugin wrote (in its own on_post_build, before
    ours): see the functions below; with ``wire_marks`` (the worker decodes them), every word
    mark is written as :data:`WIRE_MARK`."""
    index = site_dir / "search" / "search_index.json"
    if not index.exists():
        return
    data = json.loads(index.read_text(encoding="utf-8"))
    marks = word_mark_pattern(data["config"]["separator"])
    for doc in data["docs"]:
        # inline <code> marks cost 13 bytes a pair, ~6,000 pairs: the words stay, the style goes
        text = CODE_TAGS.sub("", drop_plain_copies(doc["text"]))
        # paragraph and list marks (~3,900 of them): a preview reads as one paragraph, words stay
        text = BLOCK_TAGS.sub(" ", text).strip()
        doc["text"] = compact_word_marks(text, marks)
        doc["title"] = compact_word_marks(doc["title"], marks)
        m = re.fullmatch(rf"{NOTES_DIR}/(\d\d)_[A-Za-z0-9_]+/", doc["location"])
        if m and int(m.group(1)) in SEARCH_TERMS:
            doc["title"] += " · " + SEARCH_TERMS[int(m.group(1))]
    out = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    if wire_marks:
        assert WIRE_MARK not in out, "the site's text holds U+007F: it cannot mark words on the wire"
        out = out.replace(WORD_MARK, WIRE_MARK)
    index.write_text(out, encoding="utf-8")


def word_mark_pattern(separator: str) -> re.Pattern:
    """The zero-width spaces of search text that separate nothing (see compact_word_marks), for
    material's ``separator`` (a character class with ``+``, e.g. ``[\\s\\u200b、。，]+``)."""
    cls = separator.rstrip("+")
    if not (cls.startswith("[") and cls.endswith("]")):
        return re.compile(r"(?!)")  # an unexpected separator: leave the text alone
    cls = cls[1:-1].replace("\\u200b", "")
    return re.compile(rf"(?<=[{cls}<>])\u200b+|\u200b+(?=[{cls}<>])|^\u200b+|\u200b+$|(?<=\u200b)\u200b+")


def compact_word_marks(text: str, marks: re.Pattern) -> str:
    """``text`` without the zero-width spaces that separate nothing.

    Material's search puts U+200B around every word jieba cuts from Chinese text, so the browser
    can split it again; next to whitespace, a separator punctuation mark (，、。), a tag or another
    U+200B the mark splits nothing, but costs 3 bytes in the index every page loads (about a
    fifth of it). The browser finds the same words with or without them."""
    return marks.sub("", text)


PRE_BLOCK = re.compile(r"<pre>(.*?)</pre>", re.S)
CODE_TAGS = re.compile(r"</?code>")
BLOCK_TAGS = re.compile(r"\s*</?(?:p|ul|ol|li)>\s*")
_IGNORED = frozenset(" \t\r\n\u200b")


def _end_of_copy(text: str, start: int, code: str) -> int:
    """Where a plain-text copy of ``code`` starting at ``text[start]`` ends (whitespace and the
    search plugin's word separators ignored), or ``start`` when there is none."""
    want = [c for c in code if c not in _IGNORED]
    i = start
    for c in want:
        while i < len(text) and text[i] in _IGNORED:
            i += 1
        if i == len(text) or text[i] != c:
            return start
        i += 1
    return i


def drop_plain_copies(text: str) -> str:
    """The search text of a page without the second copy of each code cell.

    A notebook's code cell reaches material's search index twice: as the highlighted ``<pre>``
    (which search results show) and right after it as plain text (from the cell's copy-button
    source). Every page load builds the search index in the browser from this file, so the copies
    cost each reader time (they were ~a third of the index); words in code stay searchable in the
    ``<pre>``."""
    out, pos = [], 0
    for m in PRE_BLOCK.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.end()])
        pos = _end_of_copy(text, m.end(), m.group(1))
    out.append(text[pos:])
    return PROMPT.sub("", "".join(out))


PROMPT = re.compile(r"(?:In|Out)\xa0\[\d*\]: (?:Copied! )?")
"""nbconvert's cell prompts (``In [3]: Copied!``) as they reach the search text: not words."""


# ---------------------------------------------------------------------------- sections of a note
# Material's search parser ends a heading's section when the element that holds the heading closes
# (material/plugins/search/plugin.py, Parser.handle_endtag), and text after it goes back to the
# page's first entry. On a note page every markdown cell is its own <div>, so the prose of the cells
# after a heading's cell was indexed under the page's top, and a search result opened the page at
# its title instead of at the section. The parser is given a copy of the page without the <div>
# wrappers (a <div> that excludes itself from search is kept, with what it holds); the reader's page
# is not changed.

DIV_OPEN_OR_CLOSE = re.compile(r"<div\b[^>]*>|</div\s*>", re.I)
RAW_BLOCK = re.compile(r"<(script|style|pre|textarea)\b.*?</\1\s*>", re.S | re.I)


def without_div_wrappers(content: str) -> str:
    """``content`` with every ``<div>`` and its ``</div>`` removed, except divs that carry
    ``data-search-exclude`` (kept whole). ``<script>``, ``<style>``, ``<pre>`` and ``<textarea>``
    bodies are left as they are. Unbalanced markup is returned unchanged."""
    raw = [(m.start(), m.end()) for m in RAW_BLOCK.finditer(content)]
    starts = [a for a, _ in raw]

    def in_raw(pos: int) -> bool:
        i = bisect.bisect_right(starts, pos) - 1
        return i >= 0 and pos < raw[i][1]

    out, pos, stack = [], 0, []  # stack: True for a kept div
    for m in DIV_OPEN_OR_CLOSE.finditer(content):
        if in_raw(m.start()):
            continue
        tag = m.group(0)
        closing = tag.startswith("</")
        if closing:
            if not stack:
                return content
            keep = stack.pop()
        else:
            keep = (stack and stack[-1]) or "data-search-exclude" in tag
            stack.append(bool(keep))
        if not keep:
            out.append(content[pos : m.start()])
            pos = m.end()
    if stack:
        return content
    out.append(content[pos:])
    return "".join(out)


SEARCH_ATTRIBUTES = re.compile(r'\s?data-search-\w+="[^"]+"')
"""What material's search plugin removes from a page once it has indexed it (its on_page_context)."""
