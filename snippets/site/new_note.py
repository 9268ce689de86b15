"""Scaffold a new note: ``python -m snippets.site.new_note NN slug "标题"``.

Writes ``notes/NN_slug.py`` (jupytext percent) with the roadmap template's headings in order,
each with a short prompt for what belongs there, a first code cell that imports ``snippets``
before Megatron, three 自测 questions with folded answers and a computing cell each, and the
30-second answer. The paired ``.ipynb`` is then made and executed by
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
    ("阅读目标", "读完能回答的 3–5 个问题，编号列出。"),
    (
        "源码位置",
        "表格：`path:line` 链接到 tag `core_v0.19.0` 的具体一行，链接文字写 `file.py::Symbol`，再说它做什么。",
    ),
    ("调用链", "缩进的 `path::function` 树，一行一个调用，通信或切分写在右边。"),
    (
        "关键对象",
        "读到的每个函数 / 类的七问记录（输入、输出、调用的 Core 组件、process group?、切分?、改训练状态?、"
        "simple loop 哪一步），以及建对象的单元格。",
    ),
    (
        "Tensor / Process Group 语义",
        "跑出来的表：群成员、每个 rank 的 shape、每次通信的 API / 群 / 前后 shape / 含义。",
    ),
    ("机制解释", "为什么这样写：用运行结果对照代码，必要时附一个可读的重写并证明与真实代码一致。"),
    ("与训练主链路的关系", "它在一次训练 step（simple loop 与正式入口）里的位置。"),
    ("与基础知识的连接", "对应的 PyTorch / 并行训练基础概念。"),
    ("遗留问题", "运行与阅读不一致的地方、CPU 上跑不了的地方，各带源码行。"),
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


def render(number: int, slug: str, title: str) -> str:
    """The text of a new note ``NN_slug.py``."""
    cells = [f"# %% [markdown]\n# # {number:02d} {title}\n#\n# TODO 一段导语：这篇回答什么问题、跑什么。"]
    cells.append(
        "# %%\n# snippets first: it applies the CPU patches and silences known warnings.\n"
        "from snippets.ranks.launch import run_ranks\nfrom snippets.record.tables import Table\n\n"
        "from megatron.core import parallel_state"
    )
    for heading, prompt in SECTIONS:
        if heading == "自测":
            break
        cells.append(f"# %% [markdown]\n# ## {heading}\n#\n# TODO {prompt}")
        if heading == "关键对象":
            cells.append(
                "# %%\ndef world_size_seen():\n    parallel_state.initialize_model_parallel()\n"
                "    return parallel_state.get_data_parallel_world_size()\n\n\n"
                'Table(["rank", "DP world size"], list(enumerate(run_ranks(world_size_seen, 2))))'
            )
    cells.append("# %% [markdown]\n# ## 自测\n#\n# TODO " + dict(SECTIONS)["自测"])
    for k in range(1, 4):
        cells.append(
            f"# %% [markdown]\n# **{k}. TODO 问题？**\n#\n# <details><summary>答案</summary>\n#\n"
            f"# TODO 答案（由下面的单元格算出）。\n#\n# </details>"
        )
        cells.append(f"# %%\nprint({k})  # TODO compute the answer")
    cells.append("# %% [markdown]\n# ## 30-second answer\n#\n# TODO " + dict(SECTIONS)["30-second answer"])
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
