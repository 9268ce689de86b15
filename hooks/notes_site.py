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

6. Build time. mkdocs-jupyter converts every notebook twice: to HTML for the page, and to
   Markdown only to read its headings for the TOC, which (2.) rebuilds from the rendered HTML
   anyway, so the second conversion is skipped. nbconvert also makes a fresh Jinja environment
   per notebook and recompiles the same templates each time; one in-memory bytecode cache is
   shared by all of them. Last, nbconvert's ``HTMLExporter`` re-parses each finished page with
   BeautifulSoup's pure-Python ``html.parser`` only to add three attributes (``tabindex="0"`` on
   cell inputs and outputs, an ``alt`` on images without one) and serializes the whole tree again:
   about a third of the build. :class:`FocusableMarkup` makes the same three edits on the text
   (tests/site/test_site.py checks that both give the same document tree).
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import re
from pathlib import Path

import jinja2
from markdown.extensions.toc import nest_toc_tokens, slugify_unicode
from mkdocs.structure.toc import get_toc
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.notes_site")

NOTES_DIR = "notes"  # inside docs_dir
NOTE_NAME = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")

# Round titles in nav order, and the note numbers each one holds, in the order the nav lists them
# (ROADMAP.md). Note 23 closes round 2 (it follows one tensor through every mechanism of 08-17) but
# its number comes after round 3's; it gets its own last section so the nav reads in number order.
# Notes added after the first 23 go where the roadmap places them: 24 (RNG and recomputation)
# right after 12, because 13-17 build on its streams; 25 (HF conversion) after 22, in the RL part.
ROUNDS: list[tuple[str, tuple[int, ...]]] = [
    ("第一轮：训练主链路", tuple(range(1, 8))),
    ("第二轮：并行机制", (8, 9, 10, 11, 12, 24, 13, 14, 15, 16, 17)),
    ("第三轮：训练系统专题", tuple(range(18, 22))),
    ("RL：训推权重同步", (22, 25)),
    ("串起来：一个 tensor 走过所有并行", (23,)),
]

# Every note the roadmap plans (../shared/ROADMAP.md), for the home page's map. A note that
# exists in notes/ shows its own H1 title and a link; the others show the plan and 计划中.
PLAN: dict[int, str] = {
    1: "训练全流程总览",
    2: "分布式初始化",
    3: "数据与 batch 流",
    4: "model provider 与 GPTModel",
    5: "forward、loss、backward",
    6: "梯度同步与优化器",
    7: "checkpoint",
    8: "parallel_state 与 RankGenerator",
    9: "TP mappings：f 与 g",
    10: "ColumnParallelLinear 与 RowParallelLinear",
    11: "走读一层 TransformerLayer",
    12: "vocab-parallel embedding 与 cross entropy",
    13: "pipeline schedules",
    14: "数据并行 DDP",
    15: "分布式优化器（ZeRO-1）",
    16: "context parallel",
    17: "MoE 与 expert parallel",
    18: "数据专题",
    19: "模型专题",
    20: "优化器专题",
    21: "checkpoint 专题",
    22: "refit 与 resharding",
    23: "一个 tensor 的旅程",
    24: "随机数与 activation 重算",
    25: "Megatron 与 Hugging Face 的权重互转",
}
NOTE_MAP_MARK = "<!-- note-map -->"

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
            log.warning("notes/%s: note %02d has no round in hooks/notes_site.py ROUNDS", nb.name, number)
            continue
        title = _first_h1(nb) or nb.stem
        found[round_title].append((number, {title: f"{NOTES_DIR}/{nb.name}"}))
    order = {n: i for _, numbers in ROUNDS for i, n in enumerate(numbers)}
    return [
        {title: [page for _, page in sorted(pages, key=lambda p: order[p[0]])]}
        for title, pages in found.items()
        if pages
    ]


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
    ("parallel_state.py 做什么？", 2, "rank_table(ranks, kinds="),
    ("16 卡，TP = 2、PP = 2、DP = 4，rank 13 在哪几个群？", 8, "for r in (5, 13)"),
    ("ColumnParallelLinear 在哪个文件？一层里哪些 linear 用它？", 11, "weight_table(meta[0])"),
    ("RL 为什么要 reshard weight？", 22, 'Table(["参数（全局名）"'),
    ("Megatron Core 给了什么，是只用 PyTorch FSDP 得不到的？", 23, "journey_table(summaries)"),
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


def _notes_present(docs_dir: Path) -> dict[int, Path]:
    notes_dir = docs_dir / NOTES_DIR
    present = {}
    for nb in sorted(notes_dir.glob("*.ipynb")) if notes_dir.is_dir() else []:
        m = NOTE_NAME.match(nb.name)
        if m:
            present[int(m.group(1))] = nb
    return present


def _notes_by_round(present: dict[int, Path]):
    """(round title, its notebooks in order) for every round that has a note written."""
    for round_title, numbers in ROUNDS:
        notes = [present[n] for n in numbers if n in present]
        if notes:
            yield round_title, notes


def _note_title(nb: Path) -> str:
    return _first_h1(nb) or nb.stem


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


# ---------------------------------------------------------------------------- note numbers
# Docs pages (code map, CPU page) name notes by number in plain text ("笔记 21", "note 13",
# "笔记 02/08", a "对应笔记" column of "06、14"). At build time each number becomes a link to its
# note, so these pages link where they point (and show up in the graph). Code, existing links
# and headings are left alone.

NOTE_REF = re.compile(
    r"(?<![A-Za-z0-9_/#.])(笔记|[Nn]otes?)(\s?)(\d\d(?:\s?[/、,，–-]\s?\d\d)*)(?![0-9A-Za-z_%])"
)
TWO_DIGITS = re.compile(r"(?<!\d)\d\d(?!\d)")
PROTECTED = re.compile(r"```.*?```|`[^`\n]*`|\[[^\]\n]*\]\([^)\n]*\)|<[^>\n]+>|^#[^\n]*$", re.S | re.M)


def _link_numbers(text: str, present: dict[int, Path], prefix: str) -> str:
    return TWO_DIGITS.sub(
        lambda d: (
            f"[{d.group(0)}]({prefix}{NOTES_DIR}/{present[int(d.group(0))].name})"
            if int(d.group(0)) in present
            else d.group(0)
        ),
        text,
    )


def link_note_numbers(markdown: str, present: dict[int, Path], prefix: str = "") -> str:
    """``markdown`` with plain note numbers turned into links to the notes in ``present``."""
    out, pos = [], 0

    def plain(text: str) -> str:
        return NOTE_REF.sub(
            lambda m: m.group(1) + m.group(2) + _link_numbers(m.group(3), present, prefix), text
        )

    for m in PROTECTED.finditer(markdown):
        out += [plain(markdown[pos : m.start()]), m.group(0)]
        pos = m.end()
    out.append(plain(markdown[pos:]))
    return _link_note_columns("".join(out), present, prefix)


def _link_note_columns(markdown: str, present: dict[int, Path], prefix: str) -> str:
    """In a Markdown table with a column headed "对应笔记" / "笔记", link the numbers of that column."""
    lines = markdown.split("\n")
    column = None
    for k, line in enumerate(lines):
        if not line.startswith("|"):
            column = None
            continue
        cells = line.split("|")
        if column is None:
            names = [c.strip() for c in cells]
            column = next((i for i, c in enumerate(names) if c in ("对应笔记", "笔记")), -1)
            continue
        if column > 0 and column < len(cells) and not set(cells[column].strip()) <= set("-: "):
            if "](" not in cells[column]:
                cells[column] = _link_numbers(cells[column], present, prefix)
                lines[k] = "|".join(cells)
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    for mark, render in GENERATED.items():
        if mark in markdown:
            markdown = markdown.replace(mark, render(Path(config.docs_dir)))
    if not is_note(page):
        depth = page.file.src_uri.count("/")
        markdown = link_note_numbers(markdown, _notes_present(Path(config.docs_dir)), "../" * depth)
    return markdown


class _SharedBytecode(jinja2.BytecodeCache):
    """In-memory Jinja bytecode, shared by every nbconvert exporter of one build."""

    def __init__(self):
        self.store: dict[str, bytes] = {}

    def load_bytecode(self, bucket):
        if bucket.key in self.store:
            bucket.bytecode_from_string(self.store[bucket.key])

    def dump_bytecode(self, bucket):
        self.store[bucket.key] = bucket.bytecode_to_string()


_BYTECODE = _SharedBytecode()


class FocusableMarkup:
    """Stands in for ``BeautifulSoup`` in ``nbconvert.exporters.html`` during a build.

    nbconvert 7's ``HTMLExporter.from_notebook_node`` parses the page, calls ``select`` with three
    selectors, sets one attribute on each element found, and returns ``str(soup)``. This class
    answers those three selectors from the text (opening tags outside ``<script>``, ``<style>`` and
    comments) and inserts the attributes in place; any other selector raises, so an nbconvert that
    asks for more fails the build instead of being half served.
    """

    OPENING = re.compile(
        r"""<(img|div)\b((?:\s+[^\s=/>]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'=<>`]+))?)*)"""
        r"""\s*/?>""",
        re.I,
    )
    OPAQUE = re.compile(r"<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->", re.S | re.I)
    CLASS = re.compile(r"""\sclass\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
    ALT = re.compile(r"\salt(?:\s*=|\s|$)", re.I)
    SELECTORS = {
        "img:not([alt])": ("img", None),
        ".jp-Notebook div.jp-Cell-inputWrapper": ("div", "jp-Cell-inputWrapper"),
        ".jp-Notebook div.jp-OutputArea-output": ("div", "jp-OutputArea-output"),
    }

    class Element:
        def __init__(self, end: int):
            self.end = end  # where the attributes of this opening tag end
            self.attrs: dict[str, str] = {}

    def __init__(self, markup: str, features: str | None = None):
        self.markup = markup
        self.found: list[FocusableMarkup.Element] = []
        opaque = [m.span() for m in self.OPAQUE.finditer(markup)]
        self.tags = [
            m for m in self.OPENING.finditer(markup) if not any(a <= m.start() < b for a, b in opaque)
        ]

    def select(self, selector: str) -> list[Element]:
        if selector not in self.SELECTORS:
            raise NotImplementedError(
                f"nbconvert asked for {selector!r}: hooks/notes_site.py "
                "FocusableMarkup only knows nbconvert 7's three selectors"
            )
        name, cls = self.SELECTORS[selector]
        hits = []
        for m in self.tags:
            if m.group(1).lower() != name:
                continue
            attrs = m.group(2)
            if cls is None:
                if self.ALT.search(attrs):
                    continue
            else:
                c = self.CLASS.search(attrs)
                if not c or cls not in next(g for g in c.groups() if g is not None).split():
                    continue
            hits.append(self.Element(m.start(2) + len(attrs)))
        self.found += hits
        return hits

    def __str__(self) -> str:
        out, at = [], 0
        for element in sorted(self.found, key=lambda e: e.end):
            out.append(self.markup[at : element.end])
            out += [f' {k}="{html.escape(v)}"' for k, v in element.attrs.items()]
            at = element.end
        out.append(self.markup[at:])
        return "".join(out)


def _speed_up_notebook_rendering():
    import mkdocs_jupyter.plugin
    import nbconvert.exporters.html
    from nbconvert.exporters.templateexporter import TemplateExporter

    nbconvert.exporters.html.BeautifulSoup = FocusableMarkup

    # the headings come from the rendered page (on_page_content), not from a Markdown export
    mkdocs_jupyter.plugin._get_nb_toc_tokens = lambda fpath, toc_depth: ([], None)
    create = TemplateExporter._create_environment
    if getattr(create, "_shared_bytecode", False):
        return

    def with_shared_bytecode(self):
        env = create(self)
        env.bytecode_cache = _BYTECODE
        return env

    with_shared_bytecode._shared_bytecode = True
    TemplateExporter._create_environment = with_shared_bytecode


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


def on_config(config):
    _speed_up_notebook_rendering()
    load_search_words()
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
    re.compile(
        r"<!-- MathJax configuration -->\s*<script type=\"text/x-mathjax-config\">"
        r".*?</script>\s*<!-- End of mathjax configuration -->",
        re.S,
    ),
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
            lambda a: f'<a class="headerlink" href="#{ident}" title="Permanent link">{a.group(1)}</a>', inner
        )
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
    return (
        f'<a href="{nb_name}" download class="md-content__button md-button nb-download" '
        f"data-search-exclude "
        f'title="下载 Notebook（{nb_name}），放进 notes/ 就能在 Jupyter 里重跑">'
        f'<span class="nb-download__icon" aria-hidden="true">{_DOWNLOAD_ICON}</span>'
        f"下载 .ipynb</a>"
    )


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
    _used_classes.clear()


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
        "losing their last word (hooks/notes_site.py SEGMENT_FIX)"
    )
    return False


# ---------------------------------------------------------------------------- CSS weight
# nbconvert's JupyterLab stylesheet is ~590 KB, most of it for JupyterLab's own UI (toolbars,
# dialogs, file browser, editors). The pages are static: a rule whose every selector names a
# class no built note page uses can never apply, and is dropped from the shared copy.

CSS_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")
HTML_CLASS = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""")


def _css_blocks(css: str):
    """Top-level (prelude, body) pairs of a stylesheet; body without its braces."""
    i, n = 0, len(css)
    while i < n:
        j = css.find("{", i)
        if j < 0:
            return
        prelude, depth, k = css[i:j], 1, j + 1
        while k < n and depth:
            c = css[k]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c in "\"'":
                k = css.find(c, k + 1)  # skip a string (content: "{")
                k = n if k < 0 else k
            k += 1
        yield prelude.strip(), css[j + 1 : k - 1]
        i = k


def purge_css(css: str, used: set[str]) -> str:
    """``css`` without the rules that cannot match a page whose classes are ``used``."""
    out = []
    for prelude, body in _css_blocks(css):
        if prelude.startswith("@media") or prelude.startswith("@supports"):
            inner = purge_css(body, used)
            if inner.strip():
                out.append(f"{prelude}{{{inner}}}")
        elif prelude.startswith("@"):
            out.append(f"{prelude}{{{body}}}")  # @font-face, @keyframes, @page: kept as they are
        elif re.search(r"\([^)]*,", prelude):
            out.append(f"{prelude}{{{body}}}")  # :is(.a, .b) lists: not split, kept
        else:
            # classes under :not() need not be on the page for the rule to match; [attr] values
            # are not class names
            # ... and ".jupyter-wrapper :root" (mkdocs-jupyter's scoping of JupyterLab's :root
            # variables, ~80 KB of icons) can match nothing: :root has no ancestor
            keep = [
                sel
                for sel in prelude.split(",")
                if not re.search(r"\S\s*:root", sel)
                and all(c in used for c in CSS_CLASS.findall(re.sub(r":not\([^)]*\)|\[[^\]]*\]", "", sel)))
            ]
            if keep:
                out.append(f"{','.join(keep)}{{{body}}}")
    # a rule repeated word for word: only its last copy decides anything
    last = {rule: i for i, rule in enumerate(out)}
    return "".join(rule for i, rule in enumerate(out) if last[rule] == i)


# material's page frame around the content (the notebook CSS has a few rules under these)
FRAME_CLASSES = {
    "jupyter-wrapper",
    "md-typeset",
    "md-content",
    "md-content__inner",
    "md-main",
    "md-grid",
    "md-container",
}
_used_classes: set[str] = set()  # every class of every note page's content, filled on_page_content


def note_classes(content: str) -> set[str]:
    return {c for m in HTML_CLASS.finditer(content) for c in (m.group(1) or m.group(2) or "").split()}


def on_post_build(config):
    fix_query_segmenter(Path(config.site_dir))
    for path, css in _shared_css.items():
        css = purge_css(css, _used_classes | FRAME_CLASSES)
        target = Path(config.site_dir) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(css, encoding="utf-8")
    index = Path(config.site_dir) / "search" / "search_index.json"
    if index.exists():  # material's search plugin wrote it in its own on_post_build, before ours
        data = json.loads(index.read_text(encoding="utf-8"))
        marks = word_mark_pattern(data["config"]["separator"])
        for doc in data["docs"]:
            # inline <code> marks cost 13 bytes a pair, ~6,000 pairs: the words stay, the style goes
            text = CODE_TAGS.sub("", drop_plain_copies(doc["text"]))
            doc["text"] = compact_word_marks(text, marks)
            doc["title"] = compact_word_marks(doc["title"], marks)
            m = re.fullmatch(rf"{NOTES_DIR}/(\d\d)_[A-Za-z0-9_]+/", doc["location"])
            if m and int(m.group(1)) in SEARCH_TERMS:
                doc["title"] += " · " + SEARCH_TERMS[int(m.group(1))]
        index.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


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
    return content.replace('<details class="ms-listing">', '<details class="ms-listing" data-search-exclude>')


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
    """One sentence under the note's H1 on how the page is checked (said once, by the site)."""
    m = re.search(r"</h1>", content)
    return content[: m.end()] + CHECKED_LINE + content[m.end() :] if m else CHECKED_LINE + content


def on_page_content(content, page, config, files):
    if not is_note(page):
        return content
    content = strip_cdn_scripts(content)
    content = inline_svgs(content)
    content = fold_cells(content)
    content = squeeze_whitespace(share_copy_icon(content))
    content = share_styles(content, page)
    content, tokens = fix_headings(content)
    page.toc = get_toc(nest_toc_tokens(list(tokens)))  # nest_toc_tokens empties its argument
    # lets mkdocs' own anchor validation check Markdown links like notes/02_x.ipynb#阅读目标
    page.present_anchor_ids = {i for i in ANY_ID.findall(content) if i}
    h1 = next((t for t in tokens if t["level"] == 1), None)
    if h1 is not None:
        page.title = html.unescape(h1["name"])
    content = add_checked_line(content)
    _used_classes.update(note_classes(content))
    # include_source copies the .ipynb into the page's own directory
    return download_button(Path(page.file.abs_src_path).name) + content
