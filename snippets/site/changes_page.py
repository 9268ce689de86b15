"""Markdown for the site: each note's "到 core_v0.19.0 变了什么" section and the pitfall page.

Pure functions of the data files (:mod:`snippets.site.changes`) and the notebooks
(:mod:`snippets.site.pitfalls`); ``hooks/changes.py`` renders them into the pages.
"""

from __future__ import annotations

from pathlib import Path

from snippets.site import changes, pitfalls, sources

HEADING = "到 core_v0.19.0 变了什么"
LABEL = {
    "unchanged": "原样",
    "moved": "挪了行",
    "changed": "改了",
    "vanished": "已不在",
    "unchecked": "未核对",
}
NEW_TREE = f"{sources.REPO_URL}/tree/{changes.NEW_TAG}"
HOME_VERSION = "../../#版本"  # the home page's section on which release the notes run


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def label(key: str) -> str:
    path, symbol = changes._split(key)
    name = Path(path).name
    return f"{name}::{symbol}" if symbol else f"{name}:{key.rsplit(':', 1)[1]}"


def old_link(key: str, record: dict, code: bool = True) -> str:
    text = f"`{label(key)}`" if code else label(key).replace("_", "\\_")
    return f"[{text}]({sources.pinned_url(changes._split(key)[0], record['line'])})"


def new_link(key: str, record: dict) -> str:
    path = record.get("new_path") or changes._split(key)[0]
    if record.get("new_line") is None:
        at = record.get("owner_line")
        return f"[所在函数，0.19.0 第 {at} 行]({changes.new_url(path, at)})" if at else "—"
    where = (
        f"{Path(path).name} 第 {record['new_line']} 行"
        if record.get("new_path")
        else f"0.19.0 第 {record['new_line']} 行"
    )
    return f"[{where}]({changes.new_url(path, record['new_line'])})"


def _names(names: list[str], limit: int = 6) -> str:
    shown = "、".join(f"`{n}`" for n in names[:limit])
    return shown + (f" 等 {len(names)} 个" if len(names) > limit else "")


def signature_sentence(sig: dict) -> str:
    """The signature change in one sentence of our own."""
    parts = []
    if sig.get("added"):
        parts.append("新增 " + _names(sig["added"]))
    if sig.get("removed"):
        parts.append("删去 " + _names(sig["removed"]))
    for name, (before, after) in list(sig.get("defaults", {}).items())[:4]:
        parts.append(f"`{name}` 的缺省值 {before or '（无）'} → {after or '（无）'}")
    if sig.get("forwarded"):
        parts.append("改成 `*args, **kwargs` 转发给另一个函数")
    text = "；".join(parts)
    if sig.get("order"):
        text += "；旧的按位置传参会对不上"
    return text + "。" if text else ""


def note_section(
    number: str, data: dict | None = None, facts: dict | None = None, current: dict | None = None
) -> str:
    """The section for note ``number``. ``current`` (from :func:`changes.note_citations`) is what
    the note cites now: a citation added since the data was generated is listed as 未核对."""
    data = changes.load() if data is None else data
    facts = changes.load_facts()["facts"] if facts is None else facts
    cited = {k: r for k, r in data["citations"].items() if number in r["notes"]}
    for k, entry in (current or {}).items():
        if number in entry["notes"] and k not in cited:
            cited[k] = {"line": entry["line"], "status": "unchecked", "new_line": None}
    lines = [f"## {HEADING}", ""]
    if not cited:
        return "\n".join(lines + ["本篇没有引用 Megatron 的源码行。", ""])
    n = changes.counts(cited.values())
    unchecked = sum(r["status"] == "unchecked" for r in cited.values())
    lines.append(
        f"本站运行的是 `core_v0.16.1`（[为什么](../../#版本)）。本篇引用的 {len(cited)} 处源码，到 "
        f"[`core_v0.19.0`]({NEW_TREE})：{n['unchanged']} 处原样，{n['moved']} 处只挪了行，"
        f"{n['changed']} 处内容变了，{n['vanished']} 处已不在。"
        + (f"另有 {unchecked} 处是数据生成之后新加的引用，还没有对照。" if unchecked else "")
    )
    order = {s: i for i, s in enumerate(("unchecked", "vanished", "changed", "moved", "unchanged"))}
    ranked = sorted(cited.items(), key=lambda kv: (order[kv[1]["status"]], kv[0]))
    notes = []
    for k, r in ranked:
        fact = facts.get(k) or (signature_sentence(r["signature"]) if r.get("signature") else "")
        if r.get("new_path") and not facts.get(k):
            fact = (fact + " " if fact else "") + f"搬到了 `{r['new_path']}`。"
        if fact:
            notes.append(f"- {old_link(k, r)} → {new_link(k, r)}（{LABEL[r['status']]}）：{fact}")
    if notes:
        lines += ["", "读本篇时要知道的变化：", "", *notes]
    else:
        lines += ["", "这些变化都不改变本篇的读法（签名与职责没变，只是行号或实现细节）。"]
    lines += [
        "",
        '<details class="ms-changes" data-search-exclude markdown="1">'
        f"<summary>逐条对照（{len(cited)} 处引用）</summary>",
        "",
        "| 引用（core_v0.16.1） | core_v0.19.0 | 状态 |",
        "|---|---|---|",
    ]
    for k, r in ranked:
        lines.append(f"| {old_link(k, r, code=False)} | {new_link(k, r)} | {LABEL[r['status']]} |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ pitfall page

KIND = {"still": "仍在", "fixed": "已修", "changed": "那一行改了，需重读", "unknown": "未核对"}


def _cell_ids(notes_dir: Path) -> dict[str, tuple[str, set[str]]]:
    """Note number -> (notebook file name, its cell ids)."""
    out = {}
    for path in sorted(Path(notes_dir).glob("[0-9][0-9]_*.ipynb")):
        out[path.name[:2]] = (path.name, {c.get("id") for c in pitfalls.cells(path)})
    return out


def _cell_links(cells: list, notes: dict[str, tuple[str, set[str]]]) -> str:
    # a link only to a cell that exists (a build on other notes, e.g. the test fixture, gets text)
    out = []
    for number, cell_id in cells:
        name, ids = notes.get(number, (None, set()))
        out.append(f"[笔记 {number}](notes/{name}#cell-id={cell_id})" if cell_id in ids else f"笔记 {number}")
    return "、".join(out)


def _issue_links(numbers: list[int]) -> str:
    if not numbers:
        return "未找到"
    return "、".join(f"[#{n}]({sources.REPO_URL}/issues/{n})" for n in numbers)


def pitfall_rows(notes_dir: Path, data: dict | None = None, facts: dict | None = None) -> list[dict]:
    data = changes.load() if data is None else data
    facts = changes.load_facts() if facts is None else facts
    rows = []
    for pid, rec in pitfalls.records(notes_dir, facts).items():
        kind, path, line = pitfalls.status_019(rec, data.get("pitfalls", {}).get(pid))
        rows.append({"id": pid, **rec, "kind": kind, "path_019": path, "line_019": line})
    return sorted(rows, key=lambda r: (min(c[0] for c in r["cells"]), r["id"]))


def pitfall_table(notes_dir: Path, data: dict | None = None, facts: dict | None = None) -> str:
    rows = pitfall_rows(notes_dir, data, facts)
    note_files = _cell_ids(notes_dir)
    out = [
        "| # | 坑（演示它的单元格） | 以为会 / 跑出来 | 源码：core_v0.16.1 → core_v0.19.0 | 上游讨论 |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        path, old_line = r["anchor"].rsplit(":", 1)
        where = f"[{Path(path).name}:{old_line}]({sources.pinned_url(path, int(old_line))})"
        now = f"**{KIND[r['kind']]}**"
        if r["line_019"]:
            now += f" [{Path(r['path_019']).name}:{r['line_019']}]({changes.new_url(r['path_019'], r['line_019'])})"
        if r.get("note_019"):
            now += "：" + r["note_019"]
        cells = [
            str(i),
            f"{r['title']}<br>见 {_cell_links(r['cells'], note_files)}",
            f"以为：{r['expected']}<br>实际：{r['observed']}",
            f"{where} → {now}",
            _issue_links(r.get("issues", [])),
        ]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out)


def pitfall_self_test(notes_dir: Path, data: dict | None = None, facts: dict | None = None) -> str:
    rows = pitfall_rows(notes_dir, data, facts)
    groups = {k: [r for r in rows if r["kind"] == k] for k in KIND}
    number = {r["id"]: i for i, r in enumerate(rows, 1)}
    answer = []
    for kind, members in groups.items():
        if members:
            answer.append(f"- **{KIND[kind]}（{len(members)} 个）**")
            answer += [f"    - 第 {number[r['id']]} 行：{r['title']}" for r in members]
    return "\n".join(
        [
            f"**1. 表里的 {len(rows)} 个坑，哪些到 core_v0.19.0 仍然存在？哪些已经修了？**",
            "",
            '<details markdown="1"><summary>答案</summary>',
            "",
            *answer,
            "",
            "（由表的 core_v0.19.0 一列算出：构建页面时按数据文件逐条归类。）",
            "",
            "</details>",
        ]
    )
