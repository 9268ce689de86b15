"""Pages generated from the notes at build time (part of hooks/notes_site.py).

A Markdown page holds a marker comment; ``GENERATED`` maps each marker to what replaces it: the home
page's map of notes, the self-test bank, the 30-second answers and the note template's table.
They are read from the notebooks, so they cannot drift from the notes.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from site_nav import NOTES_DIR, PLAN, ROUNDS, _note_title, _notes_by_round, _notes_present

log = logging.getLogger("mkdocs.hooks.notes_site")  # one logger: mkdocs --strict counts its warnings

NOTE_MAP_MARK = "<!-- note-map -->"


RUN_RANKS = re.compile(r"run_ranks\(\s*[A-Za-z_][A-Za-z0-9_.]*\s*,\s*(\d+)")
MEGATRON_IMPORT = re.compile(r"^[ \t]*from\s+megatron\.core[\w.]*\s+import\s+(\([^)]*\)|[^\n]+)", re.M)


def what_it_runs(nb_path: Path, limit: int = 5) -> str:
    """From a note's code cells: the world sizes it launches and the Megatron names it imports."""
    sizes, names = set(), []
    for cell in json.loads(nb_path.read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        sizes.update(int(n) for n in RUN_RANKS.findall(src))
        for group in MEGATRON_IMPORT.findall(src):
            for item in re.sub(r"#[^\n]*|[()]", "", group).split(","):
                name = item.split()[0] if item.split() else ""  # "a as b" -> a
                if name and name not in names:
                    names.append(name)
    ranks = "、".join(str(n) for n in sorted(sizes))
    shown = ", ".join(f"`{n}`" for n in names[:limit]) + (" …" if len(names) > limit else "")
    return " · ".join(x for x in (f"{ranks} 个 rank" if ranks else "", shown) if x)


def note_map(docs_dir: Path) -> str:
    """The home page's map of notes: every planned note by round, with its status; a note that
    exists shows its own title and what its cells run (world sizes, Megatron imports)."""
    present = _notes_present(docs_dir)
    lines = []
    for round_title, numbers in ROUNDS:
        lines += [f"**{round_title}**", "", "| # | 笔记 | 跑了什么 | 状态 |", "|---|---|---|---|"]
        for n in numbers:
            if n in present:
                title = re.sub(r"^\d\d\s+", "", _note_title(present[n]))
                lines.append(
                    f"| {n:02d} | [{title}]({NOTES_DIR}/{present[n].name}) "
                    f"| {what_it_runs(present[n])} | 可运行 |"
                )
            else:
                lines.append(f"| {n:02d} | {PLAN.get(n, '')} | | 计划中 |")
        lines.append("")
    return "\n".join(lines)


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
    ("16 卡，TP = 2、PP = 2、DP = 4，rank 13 在哪几个群？", 2, "rank13 = by_order[13][0]"),
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
    SELF_TEST_MARK: self_test_bank,
    ANSWERS_MARK: answers_page,
    NOTE_TEMPLATE_MARK: note_template,
}
