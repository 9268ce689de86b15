"""Pages generated from the notes at build time (part of hooks/notes_site.py).

A Markdown page holds a marker comment; ``GENERATED`` maps each marker to what replaces it: the home
page's map of notes, the self-test bank, the 30-second answers and the note template's table.
They are read from the notebooks, so they cannot drift from the notes.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

from site_nav import NOTES_DIR, PLAN, ROUNDS, _note_title, _notes_by_round, _notes_present

log = logging.getLogger("mkdocs.hooks.notes_site")  # one logger: mkdocs --strict counts its warnings

NOTE_MAP_MARK = "<!-- note-map -->"


# ---------------------------------------------------------------------------- reading time
# A note's minutes are measured, not typed: its visible prose (markdown outside <details>, link
# targets, URLs and tags stripped, whitespace dropped; as ../shared/tools/note_shape.py measures
# it) read at CHARS_PER_MINUTE, plus MINUTES_PER_CELL for each code cell whose code is shown (not
# tagged hide-input or answer): reading it and its output. Rounded up, at least 1.
CHARS_PER_MINUTE = 500
MINUTES_PER_CELL = 0.5
FOLDED = re.compile(r"<details.*?</details>", re.S)


def visible_prose(markdown: str) -> str:
    """What a reader sees of a markdown cell without opening a fold: no <details>, no link targets."""
    markdown = FOLDED.sub("", markdown)
    markdown = re.sub(r"\]\([^)]*\)", "]", markdown)
    markdown = re.sub(r"https?://\S+", "", markdown)
    return re.sub(r"<[^>]+>", "", markdown)


def reading_minutes_of(cells: list[dict]) -> int:
    chars = cells_shown = 0
    for cell in cells:
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            chars += len(re.sub(r"\s+", "", visible_prose(text)))
        elif cell.get("cell_type") == "code" and text.strip():
            tags = cell.get("metadata", {}).get("tags", [])
            cells_shown += not ({"hide-input", "answer"} & set(tags))
    return max(1, math.ceil(chars / CHARS_PER_MINUTE + MINUTES_PER_CELL * cells_shown))


def reading_minutes(nb_path: Path) -> int:
    """Minutes a reader needs for a note's visible path (the rule above)."""
    return reading_minutes_of(_cells(nb_path))


def page_minutes(md_path: Path) -> int:
    """The same rule for a Markdown page of the site (the code map): its prose, no code cells."""
    return reading_minutes_of([{"cell_type": "markdown", "source": md_path.read_text(encoding="utf-8")}])


def _plain(markdown: str) -> str:
    """One line of Markdown as table-safe text: links keep their words, no pipes, no line breaks."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"\*\*|<[^>]+>", "", text)
    return " ".join(text.replace("|", "/").split())


def note_question(nb_path: Path) -> str:
    """The question a note answers: the first sentence of its opening paragraph that is a question
    (notes open with the question they answer), else its title."""
    cells = _cells(nb_path)
    first = next((_source(c) for c in cells if c.get("cell_type") == "markdown"), "")
    body = re.sub(r"^#\s[^\n]*\n", "", first.lstrip(), count=1)
    paragraph = next(
        (p for p in re.split(r"\n\s*\n", body) if p.strip() and not p.lstrip().startswith("#")), ""
    )
    for sentence in re.findall(r"[^。！？!?]*[？?]", _plain(paragraph)):
        sentence = re.sub(r"^第.轮第\s*\d+\s*篇[。，]?\s*", "", sentence.strip())
        for opening, closing in (('"', '"'), ("“", "”"), ("「", "」")):
            opened = sentence.count(opening) + (sentence.count(closing) if closing != opening else 0)
            if opened % 2:  # a quote the sentence split left open
                sentence = sentence.replace(opening, "").replace(closing, "")
        if len(sentence) >= 6:
            return sentence
    short, _, rest = short_title(nb_path, split=True)
    return rest or short


def short_title(nb_path: Path, split: bool = False):
    """A note's title without its number; with ``split``, (name, "：", the rest) at the first "："
    (titles read "name：what it shows")."""
    title = re.sub(r"^\d\d\s+", "", _note_title(nb_path))
    name, colon, rest = title.partition("：")
    return (name.strip(), colon, rest.strip()) if split else title


PREREQ = re.compile(r"^\s*(?:[-*]\s*)?\**先读\**[：:]\s*(.+)$", re.M)


def note_prerequisites(nb_path: Path) -> list[int] | str | None:
    """What a note says to read first: its "先读：" line (in the cells before 源码位置), as note
    numbers, or its words when it names no note; None when the note has no such line."""
    for cell in _cells(nb_path):
        text = _source(cell)
        if cell.get("cell_type") == "markdown" and re.search(r"^##\s+源码位置", text, re.M):
            break
        m = PREREQ.search(FOLDED.sub("", text)) if cell.get("cell_type") == "markdown" else None
        if m:
            line = re.split(r"[；;]\s*约|约\s*\d+\s*分钟", m.group(1))[0]
            # notes by link (../09_x/), by "笔记 09、10", or a line that is just numbers ("09、10");
            # other numbers on the line ("16 卡") are not notes
            words = re.sub(r"\]\([^)]*\)", "]", line)
            numbers = [int(n) for n in re.findall(r"\]\(\.\./(\d\d)_", line)]
            for m in re.finditer(r"笔记\s*(\d\d(?:\s*[、,，/和]\s*\d\d)*)(?!\d)", words):
                numbers += [int(n) for n in re.findall(r"\d\d", m.group(1))]
            bare = re.match(r"\s*(\d\d(?:\s*[、,，/和]\s*\d\d)*)(?![\d.])", words)
            numbers += [int(n) for n in re.findall(r"\d\d", bare.group(1))] if bare else []
            return list(dict.fromkeys(numbers)) or _plain(line).strip("。；; ")
    return None


# The reading paths of the home page (ROADMAP.md "Reading paths"). A note not written yet is named
# as coming, never linked.
CODE_MAP = "code_map.md"
CORE_PATH = (8, 9, 10, 11, 13, 14, 15, 23)
CORE_COMING = (26, 28)
RL_PATH = (6, 22, 25, 27)
RL_COMING = ()
PATHS_MARK = "<!-- reading-paths -->"


def _path_before(number: int) -> int | None:
    for path in (CORE_PATH, RL_PATH):
        if number in path[1:]:
            return path[path.index(number) - 1]
    return None


def read_first(number: int, present: dict[int, Path]) -> str:
    """The note map's 先读 cell: the note's own "先读：" line, else the note before it on a reading
    path, else the note before it in the roadmap's order (ROUNDS)."""
    said = note_prerequisites(present[number])
    if isinstance(said, str):
        return said.replace("代码地图", f"[代码地图]({CODE_MAP})", 1)
    numbers = said or []
    if not numbers:
        before = _path_before(number)
        order = [n for _, ns in ROUNDS for n in ns]
        if before is None and number in order and order.index(number) > 0:
            before = order[order.index(number) - 1]
        numbers = [before] if before else []
    if not numbers:
        return f"[代码地图]({CODE_MAP})"
    return "、".join(
        f"[{n:02d}]({NOTES_DIR}/{present[n].name})" if n in present else f"{n:02d}" for n in numbers
    )


def note_map(docs_dir: Path) -> str:
    """The home page's map of notes: every planned note by round; a note that exists shows its
    title, the question it answers, its minutes (measured) and what to read first."""
    present = _notes_present(docs_dir)
    # the map repeats each note's title and question: kept out of the search index (the notes and
    # the reading paths above it are found); no <div> inside, as material's search parser wants
    lines = ['<div class="ms-note-map" markdown="1" data-search-exclude>', ""]
    for round_title, numbers in ROUNDS:
        lines += [
            f"**{round_title}**",
            "",
            "| # | 笔记 | 回答的问题 | 分钟 | 先读 |",
            "|---|---|---|---|---|",
        ]
        for n in numbers:
            if n in present:
                title = short_title(present[n], split=True)[0]
                lines.append(
                    f"| {n:02d} | [{title}]({NOTES_DIR}/{present[n].name}) | {note_question(present[n])} "
                    f"| {reading_minutes(present[n])} | {read_first(n, present)} |"
                )
            else:
                lines.append(f"| {n:02d} | {PLAN.get(n, '')} | 计划中 | | |")
        lines.append("")
    return "\n".join([*lines, "</div>"])


def _path_lines(numbers, coming, present: dict[int, Path]) -> tuple[list[str], int]:
    lines, total = [], 0
    for n in numbers:
        if n not in present:
            log.warning("reading path: note %02d is not in notes/", n)
    for n in [n for n in (*numbers, *coming) if n in present]:
        minutes = reading_minutes(present[n])
        total += minutes
        name, question = short_title(present[n], split=True)[0], note_question(present[n])
        asks = f"：{question}" if question != name else ""  # a bare title is not said twice
        lines.append(f"1. **{n:02d}** [{name}]({NOTES_DIR}/{present[n].name}) · 约 {minutes} 分钟{asks}")
    later = [f"{n:02d}（{PLAN.get(n, '')}）" for n in coming if n not in present]
    if later:
        lines.append(f"\n之后接上：{'、'.join(later)}——正在写，写成后自动加进这条路线。")
    return lines, total


def reading_paths(docs_dir: Path) -> str:
    """The home page's two reading paths, with each note's measured minutes and its question
    (their anchors, #面试核心路线 and #rl-路线, do not change with the minutes)."""
    present = _notes_present(docs_dir)
    map_minutes = page_minutes(docs_dir / CODE_MAP)
    core, core_total = _path_lines(CORE_PATH, CORE_COMING, present)
    rl, rl_total = _path_lines(RL_PATH, RL_COMING, present)
    return "\n".join(
        [
            f"### 面试核心路线（约 {map_minutes + core_total} 分钟） {{#面试核心路线}}",
            "",
            "从代码地图认路，然后沿一次训练 step 的并行机制一篇篇读下去：",
            "",
            f"1. [代码地图]({CODE_MAP}) · 约 {map_minutes} 分钟："
            "Megatron Core 的目录怎么分，一次训练 step 经过哪些文件？",
            *core,
            "",
            f"### RL 路线（约 {rl_total} 分钟） {{#rl-路线}}",
            "",
            "做 RL post-training（verl、NeMo RL）的读者：训练端的梯度与优化器，然后是训练与生成之间的权重同步。",
            "",
            *rl,
            "",
            f"分钟数是量出来的：每篇折叠块之外的文字（去掉链接地址）按每分钟 {CHARS_PER_MINUTE} 个字符，"
            f"再加每个显示代码的单元格 {MINUTES_PER_CELL} 分钟，向上取整。",
        ]
    )


# ---------------------------------------------------------------------------- generated pages
# ---------------------------------------------------------------------------- generated pages
# The self-test bank and the 30-second answers are read from the notebooks at build time, so
# they cannot drift from the notes. Links inside a note are relative to notes/NN_slug/; on a
# page at the docs root they are rewritten to the files they point at.

SELF_TEST_MARK = "<!-- self-test-bank -->"
ANSWERS_MARK = "<!-- thirty-second-answers -->"
SELF_TEST_HEADING = "## 自测"
ANSWER_HEADING = "## 30-second answer"
QUESTION = re.compile(r"^\*\*(\d+)\.\s*((?:(?!\*\*).)+?)\*\*[ \t]*$", re.M | re.S)  # may wrap lines
DETAILS = re.compile(r"<details>\s*<summary>[^<]*</summary>(.*?)</details>", re.S)
NOTE_LINK = re.compile(r"\]\(\.\./(\d\d_[A-Za-z0-9_]+)/(#[^)]*)?\)")
PAGE_LINK = re.compile(r"\]\(\.\./\.\./([A-Za-z0-9_]+)/(#[^)]*)?\)")

# Seed 000's five self-test questions, each answered by a cell of a note. The cell is found by a
# piece of its source, so a test can check that each one still resolves.
SEED_QUESTIONS: list[tuple[str, int, str]] = [
    ("parallel_state.py 做什么？", 8, "类群都等于 RankGenerator"),
    # rank 5 / 13 are derived once, in note 08 (note 02 links there)
    (
        "16 卡，TP = 2、PP = 2、DP = 4，rank 13 在哪几个群？",
        8,
        "*groups_of(r, gen).values()] for r in (5, 13)",
    ),
    (
        "ColumnParallelLinear 在哪个文件？一层里哪些 linear 用它？",
        10,
        "inspect.getsourcefile(ColumnParallelLinear)",
    ),
    ("RL 为什么要 reshard weight？", 22, 'qkv3 = "decoder.layers.3'),
    ("Megatron Core 给了什么，是只用 PyTorch FSDP 得不到的？", 15, "run_ranks(fsdp_vs_tp"),
]


def _source(cell) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(nb_path.read_text(encoding="utf-8")).get("cells", [])


def _output_markdown(cell) -> str:
    """A code cell's stored output as Markdown: tables as they are, text in a code block."""
    parts = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "text/markdown" in data:
            parts.append(_source({"source": data["text/markdown"]}))
        elif "text/plain" in data or "text" in out:
            text = _source({"source": out.get("text") or data["text/plain"]})
            parts.append("```text\n" + text.rstrip("\n") + "\n```")
    return "\n\n".join(parts)


def _root_links(markdown: str) -> str:
    markdown = NOTE_LINK.sub(lambda m: f"]({NOTES_DIR}/{m.group(1)}.ipynb{m.group(2) or ''})", markdown)
    return PAGE_LINK.sub(lambda m: f"]({m.group(1)}.md{m.group(2) or ''})", markdown)


def _section(cells: list[dict], heading: str) -> list[dict]:
    """The cells from the markdown cell holding ``heading`` up to the next ``## `` heading."""
    start = next(
        (
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "markdown" and re.search(rf"^{re.escape(heading)}\s*$", _source(c), re.M)
        ),
        None,
    )
    if start is None:
        return []
    section = [cells[start]]
    for cell in cells[start + 1 :]:
        if cell["cell_type"] == "markdown" and re.search(r"^## ", _source(cell), re.M):
            break
        section.append(cell)
    return section


def self_test(nb_path: Path) -> list[dict]:
    """Each 自测 question of a note: number, question, answer (Markdown), the id of the code
    cell that computes it and that cell's stored output."""
    questions = []
    section = _section(_cells(nb_path), SELF_TEST_HEADING)
    for i, cell in enumerate(section):
        if cell["cell_type"] != "markdown":
            continue
        text = _source(cell)
        for q in QUESTION.finditer(text):
            rest = text[q.end() :]
            nxt = QUESTION.search(rest)
            answer = DETAILS.search(rest[: nxt.start()] if nxt else rest)
            code = next((c for c in section[i + 1 :] if c["cell_type"] == "code"), None)
            questions.append(
                dict(
                    number=int(q.group(1)),
                    question=" ".join(q.group(2).split()),
                    answer=answer.group(1).strip() if answer else "",
                    cell_id=code.get("id") if code else None,
                    output=_output_markdown(code) if code else "",
                )
            )
    return questions


def thirty_second_answer(nb_path: Path) -> str:
    section = _section(_cells(nb_path), ANSWER_HEADING)
    text = "\n\n".join(_source(c) for c in section if c["cell_type"] == "markdown")
    return text.split(ANSWER_HEADING, 1)[-1].strip()


def find_cell(nb_path: Path, needle: str) -> dict | None:
    return next((c for c in _cells(nb_path) if c["cell_type"] == "code" and needle in _source(c)), None)


def _details(summary: str, body: str) -> list[str]:
    return [f'<details markdown="1"><summary>{summary}</summary>', "", body, "", "</details>", ""]


def self_test_bank(docs_dir: Path) -> str:
    present = _notes_present(docs_dir)
    lines = [
        "## 种子里的五道题",
        "",
        "阅读路线的代码地图（seed 000）末尾有五道自测题；每道题链接到计算它答案的那个单元格，"
        "下面折叠的是该单元格存下的运行结果。",
        "",
    ]
    for k, (question, number, needle) in enumerate(SEED_QUESTIONS, 1):
        nb = present.get(number)
        cell = find_cell(nb, needle) if nb else None
        if cell is None:
            # a note that is not written yet is expected; a written note that lost the cell is not
            (log.warning if nb else log.info)(
                "self-test bank: seed question %d: no cell with %r in note %02d", k, needle, number
            )
            lines += [f"**{k}. {question}**（笔记 {number:02d} 还没有对应的单元格）", ""]
            continue
        link = f"{NOTES_DIR}/{nb.name}#cell-id={cell['id']}"
        lines += [f"**{k}. {question}** → [{_note_title(nb)} · 计算答案的单元格]({link})", ""]
        lines += _details("运行结果", _output_markdown(cell))
    for round_title, notes in _notes_by_round(present):
        lines += [f"## {round_title}", ""]
        for nb in notes:
            lines += [f"### [{_note_title(nb)}]({NOTES_DIR}/{nb.name}#自测)", ""]
            for q in self_test(nb):
                cell = (
                    f" · [计算答案的单元格]({NOTES_DIR}/{nb.name}#cell-id={q['cell_id']})"
                    if q["cell_id"]
                    else ""
                )
                lines += [f"**{q['number']}. {_root_links(q['question'])}**{cell}", ""]
                output = f"\n\n计算它的单元格存下的输出：\n\n{q['output']}" if q["output"] else ""
                lines += _details("答案", _root_links(q["answer"]) + output)
    return "\n".join(lines)


def answers_page(docs_dir: Path) -> str:
    present = _notes_present(docs_dir)
    lines = []
    for round_title, notes in _notes_by_round(present):
        lines += [f"## {round_title}", ""]
        for nb in notes:
            lines += [
                f"### [{_note_title(nb)}]({NOTES_DIR}/{nb.name}#30-second-answer)",
                "",
                _root_links(thirty_second_answer(nb)),
                "",
            ]
    return "\n".join(lines)


NOTE_TEMPLATE_MARK = "<!-- note-template -->"


def note_template(docs_dir: Path) -> str:
    from snippets.site.new_note import SECTIONS  # the list the scaffold and tests/site/test_notes.py use

    rows = ["| # | 标题 | 写什么 |", "|---|---|---|"]
    rows += [f"| {k} | `## {heading}` | {what} |" for k, (heading, what) in enumerate(SECTIONS, 1)]
    return "\n".join(rows)


GENERATED = {
    NOTE_MAP_MARK: lambda d: note_map(d),
    PATHS_MARK: reading_paths,
    SELF_TEST_MARK: self_test_bank,
    ANSWERS_MARK: answers_page,
    NOTE_TEMPLATE_MARK: note_template,
}
