"""The nav of the notes (part of hooks/notes_site.py): rounds, the roadmap's plan, which notes exist.

The round sections of the nav are built from the notebooks actually present in ``docs/notes`` (a
symlink to ``notes/``), so ``mkdocs build --strict`` is clean whether or not a given note has been
written yet. A note ``NN_slug.ipynb`` goes to the round ``ROUNDS`` gives for ``NN``; its nav title is
the notebook's first H1. hooks/backlinks.py groups its graph by the same ``ROUNDS``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.notes_site")  # one logger: mkdocs --strict counts its warnings

NOTES_DIR = "notes"  # inside docs_dir
NOTE_NAME = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")

# Round titles in nav order, and the note numbers each one holds, in the order the nav lists them
# (ROADMAP.md). Note 23 closes round 2 (it follows one tensor through every mechanism of 08-17) but
# its number comes after round 3's; it gets its own last section so the nav reads in number order.
# Notes added after the first 23 go where the roadmap places them: 24 (RNG and recomputation)
# right after 12, because 13-17 build on its streams; 25 (HF conversion) after 22, in the RL part;
# 26 (cost) and 28 (GPU-only, hangs) after 23, 27 (the trainer's side of RL) after 25 (ROADMAP.md).
ROUNDS: list[tuple[str, tuple[int, ...]]] = [
    ("第一轮：训练主链路", tuple(range(1, 8))),
    ("第二轮：并行机制", (8, 9, 10, 11, 12, 24, 13, 14, 15, 16, 17)),
    ("第三轮：训练系统专题", tuple(range(18, 22))),
    ("RL：训推权重同步", (22, 25, 27)),
    ("串起来：一个 tensor 走过所有并行", (23, 26, 28)),
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
    26: "成本：内存、通信、FLOPs 与怎样选并行配置",
    27: "RL 一轮里训练端做的事：log-prob 重算、参考模型与 KL",
    28: "只有 GPU 能跑的部分，以及作业卡住时怎么找",
}


def is_note(page) -> bool:
    src = page.file.src_uri
    return src.startswith(f"{NOTES_DIR}/") and src.endswith(".ipynb")


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
            log.warning("notes/%s: note %02d has no round in hooks/site_nav.py ROUNDS", nb.name, number)
            continue
        title = _first_h1(nb) or nb.stem
        found[round_title].append((number, {title: f"{NOTES_DIR}/{nb.name}"}))
    order = {n: i for _, numbers in ROUNDS for i, n in enumerate(numbers)}
    return [
        {title: [page for _, page in sorted(pages, key=lambda p: order[p[0]])]}
        for title, pages in found.items()
        if pages
    ]


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
