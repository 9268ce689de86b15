"""Scaffold a new note: ``python -m snippets.site.new_note NN slug "标题"``.

Writes ``notes/NN_slug.py`` (jupytext percent) in the shape of ../shared/NOTE_SHAPE.md: the roadmap
template's headings in order, each with a short prompt for what belongs there; a folded first code
cell that imports ``snippets`` before Megatron; under 阅读目标 the **结论** card (placeholders) and
the 先读 line, then the main picture (a ``hide-input`` cell: its output stays visible) and the folded
"本页怎么跑出来的" box; the folded call tree and per-function records under 调用链; 遗留问题 in
two labelled parts (**Megatron 的坑**, folded "在 CPU 上怎么跑的"); three 自测 questions with folded
answers and a computing cell each (tagged ``answer``); and the 30-second answer. The paired
``.ipynb`` is then made and executed by
``scripts/execute_notes.sh notes/NN_slug.py``. ``SECTIONS`` is the single list of the template:
tests/site/test_notes.py checks every note against it and the "write a note" page prints it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# (heading, what belongs under it). The order is the order a note must keep.
SECTIONS: list[tuple[str, str]] = [
    (
        "阅读目标",
        "读完能回答的 3–5 个问题，编号列出；接着 **结论**：4–6 条面试会问的事实，"
        "各带运行打印出的数（页面上是一张卡片）；"
        "再一行“先读：笔记 NN；约 N 分钟。”。紧跟一个 `hide-input` 单元格画本篇的主图，然后折叠的“本页怎么跑出来的”。",
    ),
    (
        "源码位置",
        "表格：`path:line` 链接到 tag `core_v0.19.0` 的具体一行，链接文字写 `file.py::Symbol`，再说它做什么。",
    ),
    (
        "调用链",
        "缩进的 `path::function` 树，一行一个调用，通信或切分写在右边；超过一屏放进折叠的“完整调用链”。"
        "每个函数的七问记录（输入、输出、调用的 Core 组件、process group?、切分?、改训练状态?、simple loop 哪一步）"
        "放进折叠的“每个函数的记录（roadmap 七问）”，别的笔记已有的行只链接。",
    ),
    (
        "关键对象",
        "本篇读的对象：显示的单元格直接调用 Megatron 自己的类或函数（不超过一屏），后面是它的输出和解释。",
    ),
    (
        "Tensor / Process Group 语义",
        "跑出来的表：群成员、每个 rank 的 shape、每次通信的 API / 群 / 前后 shape / 含义。",
    ),
    ("机制解释", "为什么这样写：用运行结果对照代码，必要时附一个可读的重写并证明与真实代码一致。"),
    ("与训练主链路的关系", "它在一次训练 step（simple loop 与正式入口）里的位置。"),
    ("与基础知识的连接", "对应的 PyTorch / 并行训练基础概念。"),
    (
        "遗留问题",
        "两部分：**Megatron 的坑**（上游真实的行为，各带源码行和演示它的运行）；折叠的“在 CPU 上怎么跑的”"
        "（CPU 上的改动、静音的警告、为本机选的尺寸）。",
    ),
    ("自测", "至少 3 道题，答案折叠在 details 块里（标题“答案”），每道后面跟一个算出答案的单元格。"),
    ("30-second answer", "约 80 个英文词，面试里 30 秒说完的回答。"),
]
HEADINGS = [heading for heading, _ in SECTIONS]

NOTES = Path(__file__).resolve().parents[2] / "notes"
SLUG = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*$")

HEADER = """\
# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---
"""


RECORD_COLUMNS = " | ".join(
    [
        "函数",
        "输入",
        "输出",
        "调用的 Megatron Core 组件",
        "process group?",
        "切分?",
        "改训练状态?",
        "simple loop 哪一步",
    ]
)


def _md(text: str) -> str:
    """A markdown cell of jupytext percent format."""
    return "# %% [markdown]\n" + "\n".join(f"# {line}" if line else "#" for line in text.split("\n"))


def render(number: int, slug: str, title: str) -> str:
    """The text of a new note ``NN_slug.py``, in the shape of ../shared/NOTE_SHAPE.md: the answer
    first (阅读目标 with its **结论** card, then the main picture), the machinery folded."""
    cells = [
        _md(
            f"# {number:02d} {title}\n\n"
            "TODO 一段话：这篇回答的问题，用读者的话问出来（以问号结尾，首页和笔记地图取它作“回答的问题”）？"
        ),
        # plumbing: folded on the page (its input hidden; it prints nothing)
        '# %% tags=["hide-input"]\n'
        "# snippets first: it applies the CPU patches and silences known warnings.\n"
        "from snippets.ranks.launch import run_ranks\nfrom snippets.record.draw import Figure\n"
        "from snippets.record.tables import Table\n\n"
        "from megatron.core import parallel_state\n\n\n"
        "def world_size_seen():  # TODO the experiment: snippets/experiments/nNN_*.py run()\n"
        "    parallel_state.initialize_model_parallel()\n"
        "    return parallel_state.get_data_parallel_world_size()",
        _md(
            "## 阅读目标\n\n"
            "1. TODO 读完能回答的问题（3–5 个，编号列出）。\n"
            "2. TODO\n"
            "3. TODO\n\n"
            "**结论**\n\n"
            "- TODO 面试会问的事实 1，带运行打印出的数（比如 DP world size = 2）。\n"
            "- TODO 事实 2，带数。\n"
            "- TODO 事实 3，带数。\n"
            "- TODO 事实 4，带数（4–6 条；至少两个数要出现在本页存下的输出里）。\n\n"
            "先读：[代码地图](../../code_map/)；约 N 分钟。"
        ),
        # the main picture: the cell's code folds, its output (the picture) stays visible
        '# %% tags=["hide-input"]\n'
        "seen = run_ranks(world_size_seen, 2)\n"
        'picture = Figure(420, 90, title="TODO 标题说本篇的结论：2 个 rank 各自看到 DP = 2",\n'
        '                 desc="TODO 一两句话说图里是什么。")\n'
        "for rank, size in enumerate(seen):\n"
        '    picture.boxed(20 + 200 * rank, 25, 180, 40, f"rank {rank} · DP world size {size}", "dp")\n'
        "picture",
        _md(
            "<details><summary>本页怎么跑出来的</summary>\n\n"
            "TODO 读者重跑本页的命令，以及本页怎样在 CPU 上跑（这些只写在这里，正文不提）：\n\n"
            "```bash\n"
            f"scripts/execute_notes.sh notes/{number:02d}_{slug}.py   # 从头执行本页，存下输出\n"
            ".venv/bin/python -m snippets.run --nproc-per-node 2 EXPERIMENT   # TODO 本页的主实验\n"
            "```\n\n"
            "- 实验在 `snippets/experiments/nNN_*.py`；尺寸、并行度、用到的 CPU 改动见"
            "[在 CPU 上运行 Megatron Core](../../cpu/)。\n\n"
            "</details>"
        ),
    ]
    for heading, prompt in SECTIONS:
        if heading == "阅读目标":  # written above, with its card and the main picture
            continue
        if heading == "自测":
            break
        text = f"## {heading}\n\nTODO {prompt}"
        if heading == "调用链":
            text += (
                "\n\n<details><summary>完整调用链</summary>\n\n"
                "```text\nTODO path::function          # 超过一屏的树放在这里\n```\n\n</details>\n\n"
                "<details><summary>每个函数的记录（roadmap 七问）</summary>\n\n"
                f"| {RECORD_COLUMNS} |\n|{'---|' * 8}\n"
                "| TODO `file.py::function` | | | | | | | |\n\n"
                "别的笔记已有的行，链接过去，不要抄。\n\n</details>"
            )
        if heading == "遗留问题":
            text = (
                f"## {heading}\n\n**Megatron 的坑**\n\n"
                "TODO 上游真实的行为，各带源码行和演示它的单元格（面试里能讲的）。\n\n"
                "<details><summary>在 CPU 上怎么跑的</summary>\n\n"
                "TODO 本页用到的 CPU 改动、静音的警告、为笔记本电脑选的尺寸。\n\n</details>"
            )
        cells.append(_md(text))
        if heading == "关键对象":
            # a visible cell shows the Megatron call the prose is about
            cells.append(
                '# %%\ngenerator = parallel_state.RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order="tp-cp-ep-dp-pp")\n'
                'Table(["群", "成员"], [("TP", generator.get_ranks("tp")), ("DP", generator.get_ranks("dp"))])'
            )
        if heading == "Tensor / Process Group 语义":
            cells.append('# %%\nTable(["rank", "DP world size"], list(enumerate(seen)))')
    cells.append(_md("## 自测\n\nTODO " + dict(SECTIONS)["自测"]))
    for k in range(1, 4):
        cells.append(
            _md(
                f"**{k}. TODO 问题？**\n\n<details><summary>答案</summary>\n\n"
                "TODO 答案（由下面的单元格算出）。\n\n</details>"
            )
        )
        cells.append(f'# %% tags=["answer"]\nprint({k})  # TODO compute the answer')
    cells.append(_md("## 30-second answer\n\nTODO " + dict(SECTIONS)["30-second answer"]))
    return HEADER + "\n" + "\n\n".join(cells) + "\n"


def scaffold(number: int, slug: str, title: str, notes_dir: Path = NOTES) -> Path:
    """Write ``notes_dir/NN_slug.py``; refuse a bad number or slug, or a note that exists."""
    if not 1 <= number <= 99:
        raise ValueError(f"note number must be 1..99, got {number}")
    if not SLUG.match(slug):
        raise ValueError(f"slug must be lower_snake_case ASCII (e.g. tensor_journey), got {slug!r}")
    if not title.strip():
        raise ValueError("the title must not be empty")
    taken = sorted(p.name for p in notes_dir.glob(f"{number:02d}_*.py"))
    if taken:
        raise FileExistsError(f"note {number:02d} already exists: {', '.join(taken)}")
    path = notes_dir / f"{number:02d}_{slug}.py"
    path.write_text(render(number, slug, title.strip()), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snippets.site.new_note", description=__doc__.split("\n")[0]
    )
    parser.add_argument("number", type=int, help="note number NN (the roadmap's)")
    parser.add_argument("slug", help="lower_snake_case name, e.g. tensor_journey")
    parser.add_argument("title", help="the title after NN in the H1, e.g. '一个 tensor 的旅程'")
    parser.add_argument("--notes-dir", type=Path, default=NOTES)
    args = parser.parse_args(argv)
    try:
        path = scaffold(args.number, args.slug, args.title, args.notes_dir)
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    print(f"next: edit it, then `scripts/execute_notes.sh {path}` pairs and executes it;")
    print("      a note number the roadmap does not plan also needs its round in hooks/site_nav.py ROUNDS.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
