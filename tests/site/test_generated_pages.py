"""Pages the hook generates from the notes: the self-test bank, the 30-second answers, the note map.

They are read from the notebooks at build time; these tests check that every question, answer and
cell link arrives on the built pages, and (on a throw-away notebook) that editing a note changes
the generated page, so the pages cannot drift from the notes.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pytest
from test_site import load_hook, parse, resolve

from conftest import fixture_mode

# The real notes' questions, answers and seed cells; the fixture note (MEGATRON_SITE_FIXTURE=1)
# is a bare sample that has none of them.
real_notes = pytest.mark.skipif(fixture_mode(), reason="checks the real notes, not the fixture")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hook():
    return load_hook()


def _page(site, name: str) -> str:
    return (site.dir / name / "index.html").read_text(encoding="utf-8")


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


@real_notes
def test_bank_has_every_question_of_every_note_with_a_landing_cell_link(site, note_names, hook):
    page = site.dir / "self_test" / "index.html"
    text = _page(site, "self_test")
    links = [url for tag, url in parse(page).links if tag == "a" and "#cell-id=" in url]
    for name in note_names:
        questions = hook.self_test(site.notes_dir / name)
        assert len(questions) >= 3, name
        for q in questions:
            assert q["cell_id"] and q["answer"], (name, q["number"])
            url = f"../notes/{Path(name).stem}/#cell-id={q['cell_id']}"
            assert url in links, (name, q["number"])
            target, fragment = resolve(site.dir, page, url)
            assert fragment in parse(target).ids, (name, q["number"])
            # the question's words reach the page (markup aside)
            words = _text(q["question"].replace("`", ""))[:12]
            assert words in _text(text), (name, words)


@real_notes
def test_seed_questions_each_resolve_to_a_cell_and_show_its_output(site, hook):
    text = _page(site, "self_test")
    notes = {int(p.name[:2]): p for p in site.notes_dir.glob("[0-9][0-9]_*.ipynb")}
    assert len(hook.SEED_QUESTIONS) == 5
    for question, number, needle in hook.SEED_QUESTIONS:
        cell = hook.find_cell(notes[number], needle)
        assert cell is not None, (number, needle)
        assert f"#cell-id={cell['id']}" in text
        assert cell.get("outputs"), (number, needle)
    assert text.count("<summary>运行结果</summary>") == 5


@real_notes
def test_answers_page_has_every_note_s_english_answer(site, note_names, hook):
    text = _text(_page(site, "answers"))
    for name in note_names:
        answer = hook.thirty_second_answer(site.notes_dir / name)
        assert len(answer.split()) >= 40, name  # an answer, not a heading
        plain = _text(re.sub(r"`", "", answer))
        assert plain[:60] in text, name


def _notebook(path: Path, answer: str) -> None:
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(6 * 7)")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 01 试验笔记"),
        nbformat.v4.new_markdown_cell(
            "## 自测\n\n**1. 6 乘 7 是多少？**\n\n<details><summary>答案</summary>\n\n"
            f"{answer}（见[笔记 02](../02_other/)）\n\n</details>"
        ),
        code,
        nbformat.v4.new_markdown_cell("## 30-second answer\n\nSix times seven is forty-two."),
    ]
    path.write_text(nbformat.writes(nb), encoding="utf-8")


def test_editing_a_note_changes_the_bank(tmp_path, hook):
    notes = tmp_path / "notes"
    notes.mkdir()
    nb = notes / "01_trial.ipynb"
    _notebook(nb, "是 42")
    bank = hook.self_test_bank(tmp_path)
    cell_id = json.loads(nb.read_text())["cells"][2]["id"]
    assert "**1. 6 乘 7 是多少？**" in bank and "是 42" in bank and "```text\n42\n```" in bank
    assert f"notes/01_trial.ipynb#cell-id={cell_id}" in bank
    assert "](notes/02_other.ipynb)" in bank  # a note-relative link, rewritten for the root page
    assert "Six times seven is forty-two." in hook.answers_page(tmp_path)
    _notebook(nb, "是四十二")
    changed = hook.self_test_bank(tmp_path)
    assert "是四十二" in changed and "是 42" not in changed


def _made_up(path: Path, cells: list) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    path.write_text(nbformat.writes(nb), encoding="utf-8")
    return path


def test_reading_minutes_follow_the_rule(tmp_path, hook):
    """Visible prose at 500 characters a minute plus half a minute per shown code cell, rounded
    up: what is folded, a link's target and whitespace are not read; folded code is not either."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    prose = "# 99 试验\n\n" + "汉字" * 700 + "\n\n[链接](https://example.com/" + "x" * 3000 + ")"
    folded = "<details><summary>本页怎么跑出来的</summary>\n\n" + "折叠" * 5000 + "\n\n</details>"
    cells = [
        md(prose),  # "#99试验" 5 + 1400 + "[链接]" 4 = 1409 characters
        md(folded),
        code("x = 1\nx"),
        code("y = 2\ny"),
        code("z = 3", metadata={"tags": ["hide-input"]}),
        code("print(42)", metadata={"tags": ["answer"]}),
        code("   "),
    ]
    nb = _made_up(tmp_path / "99_trial.ipynb", cells)
    assert (hook.CHARS_PER_MINUTE, hook.MINUTES_PER_CELL) == (500, 0.5)
    assert hook.reading_minutes(nb) == 4  # ceil(1409 / 500 + 2 * 0.5) = ceil(3.818)
    cells[2].metadata["tags"] = ["hide-input"]  # one shown cell fewer: 3.318 -> still 4
    assert hook.reading_minutes(_made_up(nb, cells)) == 4
    cells[0].source = "汉字" * 1000  # 2000 characters, one shown cell: 4.5 -> 5
    assert hook.reading_minutes(_made_up(nb, cells)) == 5
    assert hook.reading_minutes(_made_up(nb, [md("短")])) == 1


def test_question_and_what_to_read_first_come_from_the_note(tmp_path, hook):
    md = nbformat.v4.new_markdown_cell
    asked = _made_up(
        tmp_path / "98_asked.ipynb",
        [
            md("# 98 名字：副标题\n\n第二轮第 3 篇。一段话。TP=2 时 [f](../09_x/) 放在哪里？再一句。"),
            md(
                "## 阅读目标\n\n1. 目标\n\n**结论**\n\n- 事实\n\n"
                "先读：[笔记 09](../09_x/)、[10](../10_y/)；约 15 分钟。"
            ),
            md("## 源码位置\n\n先读：11"),
        ],
    )
    assert hook.note_question(asked) == "TP=2 时 f 放在哪里？"
    assert hook.note_prerequisites(asked) == [9, 10]
    for line, want in [
        ("先读：笔记 08（16 卡的例子）、笔记 02；约 9 分钟。", [8, 2]),
        ("先读：09、10；约 9 分钟。", [9, 10]),
        ("先读：[代码地图](../../code_map/)；约 9 分钟。", "代码地图"),
    ]:
        other = _made_up(tmp_path / "95_p.ipynb", [md("# 95 x"), md(f"## 阅读目标\n\n{line}")])
        assert hook.note_prerequisites(other) == want, line
    plain = _made_up(tmp_path / "97_plain.ipynb", [md("# 97 名字：副标题\n\n没有问句的导语。")])
    assert hook.note_question(plain) == "副标题" and hook.note_prerequisites(plain) is None
    quoted = _made_up(tmp_path / "96_q.ipynb", [md('# 96 名字\n\n面试里常问："一层有多少参数？"')])
    assert hook.note_question(quoted) == "面试里常问：一层有多少参数？"


def _path_items(home_html: str) -> list[tuple[str, str]]:
    """(link, text) of each item of the reading-path lists on the built home page."""
    items = []
    for ol in re.findall(r'<h3 id="[^"]*路线[^"]*">.*?<ol>(.*?)</ol>', home_html, re.S):
        for li in re.findall(r"<li>(.*?)</li>", ol, re.S):
            href = re.search(r'<a href="([^"]+)"', li)
            items.append((href.group(1) if href else "", _text(li)))
    return items


@real_notes
def test_reading_paths_link_existing_notes_with_their_measured_minutes(site, hook):
    """The home page's two paths: the code map then the core notes, and the RL notes, in the
    roadmap's order, each link landing on a built page, each note with the minutes the rule gives
    and the question its opening asks; notes not written yet are named, never linked."""
    page = site.dir / "index.html"
    home = page.read_text(encoding="utf-8")
    items = _path_items(home)
    present = {int(p.name[:2]): p for p in site.notes_dir.glob("[0-9][0-9]_*.ipynb")}
    want = ["code_map/"] + [
        f"notes/{present[n].stem}/"
        for n in (*hook.CORE_PATH, *hook.CORE_COMING, *hook.RL_PATH, *hook.RL_COMING)
        if n in present
    ]
    assert [href for href, _ in items] == want
    for href, text in items:
        target, _ = resolve(site.dir, page, href)
        assert target.is_file(), href
        if href.startswith("notes/"):
            nb = site.notes_dir / (href.split("/")[1] + ".ipynb")
            assert f"约 {hook.reading_minutes(nb)} 分钟" in text, (href, text)
            assert _text(hook.note_question(nb).replace("`", ""))[:10] in text, (href, text)
    assert f"约 {hook.page_minutes(ROOT / 'docs' / 'code_map.md')} 分钟" in items[0][1]
    for n in (*hook.CORE_COMING, *hook.RL_COMING):
        if n not in present:
            assert f"{n:02d}（" in _text(home), n  # named as coming, with no link
    # the CPU page is for later: not on either path, and named after them
    assert "cpu/" not in [href for href, _ in items]
    assert home.index('href="cpu/"') > home.index('href="code_map/"')


@real_notes
def test_note_map_gives_each_note_its_question_minutes_and_what_to_read_first(site, note_names, hook):
    home = _page(site, "")
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", home, re.S):
        cells = re.findall(r"<td>(.*?)</td>", tr, re.S)
        if len(cells) == 5 and re.fullmatch(r"\d\d", cells[0]):
            rows[cells[0]] = cells
    for name in note_names:
        nb = site.notes_dir / name
        number, title, question, minutes, first = rows[name[:2]]
        assert f'href="notes/{Path(name).stem}/"' in title, name
        assert _text(minutes) == str(hook.reading_minutes(nb)), name
        assert _text(hook.note_question(nb).replace("`", ""))[:10] in _text(question), name
        said = hook.note_prerequisites(nb)
        if isinstance(said, list):
            for n in said:
                assert f"{n:02d}" in _text(first), (name, said, first)
        assert _text(first), name


@real_notes
def test_note_cards_show_the_measured_minutes(site, note_names, hook):
    """A 结论 card's 先读 line says the minutes the home page says (measured), whatever was typed."""
    for name in note_names:
        line = re.search(
            r'<p class="ms-prereq">(.*?)</p>', site.note_page(name).read_text(encoding="utf-8"), re.S
        )
        if line:
            assert f"约 {hook.reading_minutes(site.notes_dir / name)} 分钟" in _text(line.group(1)), name


def test_write_a_note_page_prints_the_template_the_checks_use(site):
    from snippets.site.new_note import SECTIONS

    text = _page(site, "write_a_note")
    rows = re.findall(r"<tr>\s*<td>(\d+)</td>\s*<td><code>## ([^<]+)</code></td>", text)
    assert [html.unescape(h) for _, h in rows] == [h for h, _ in SECTIONS]
    assert "python -m snippets.site.new_note" in _text(text)
