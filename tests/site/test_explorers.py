"""The two explorers in a real browser, against Megatron's own output.

Each page is opened once per width and driven by its URL hash (the selection a reader shares).

* 并行布局浏览器: 22 layouts -- seed 000's 16-GPU TP=2 PP=2 DP=4 with ranks 5 and 13, CP with EP,
  non-default orders and expert-TP, two refusals -- each group list the page shows against
  ``RankGenerator.get_ranks`` (and Megatron's embedding rules) computed here, each refusal against
  the message of a real ``initialize_model_parallel`` call.
* 流水线调度浏览器: 7 schedules -- the order of the boxes each lane draws against the stored
  recording, the bubble beside its formula, a refusal, and note 13's PP=2 batched finding. That the
  recording is what a fresh real run records is tests/ranks/test_explorer_schedules.py.
* At 390 px both pages open from disk (``file://``: no server) and fit the screen.
Screenshots go to /tmp/shots-explorers/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import PHONE

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "explorers" / "data"
SHOTS = Path("/tmp/shots-explorers")

LAYOUTS = [
    # (world, tp, pp, cp, ep, etp, order, rank)
    (16, 2, 2, 1, 1, "tp", "tp-cp-ep-dp-pp", 5),  # seed 000's example
    (16, 2, 2, 1, 1, "tp", "tp-cp-ep-dp-pp", 13),
    (16, 2, 2, 1, 1, "tp", "tp-cp-ep-pp-dp", 5),
    (16, 2, 2, 1, 1, "tp", "pp-dp-tp-cp-ep", 13),
    (8, 2, 1, 2, 2, "1", "tp-cp-ep-dp-pp", 3),  # CP and EP
    (16, 2, 2, 2, 2, "1", "tp-cp-ep-dp-pp", 11),
    (32, 2, 2, 2, 4, "1", "tp-cp-ep-dp-pp", 21),
    (64, 4, 2, 2, 8, "1", "tp-cp-ep-dp-pp", 63),
    (64, 8, 4, 1, 2, "tp", "tp-cp-ep-dp-pp", 40),
    (64, 2, 8, 1, 4, "tp", "tp-cp-ep-pp-dp", 17),
    (48, 4, 3, 1, 2, "tp", "tp-cp-ep-dp-pp", 30),
    (48, 2, 2, 3, 1, "tp", "cp-tp-dp-pp-ep", 7),
    (24, 3, 2, 2, 2, "1", "tp-cp-ep-dp-pp", 9),
    (24, 2, 3, 1, 4, "tp", "dp-tp-cp-ep-pp", 23),
    (12, 3, 4, 1, 1, "tp", "tp-cp-ep-dp-pp", 6),
    (12, 2, 3, 1, 2, "1", "tp-pp-cp-ep-dp", 1),
    (6, 3, 2, 1, 1, "tp", "tp-cp-ep-dp-pp", 4),
    (4, 2, 2, 1, 1, "tp", "pp-tp-cp-ep-dp", 2),
    (2, 1, 2, 1, 1, "tp", "tp-cp-ep-dp-pp", 1),
    (1, 1, 1, 1, 1, "tp", "tp-cp-ep-dp-pp", 0),
    (16, 4, 4, 2, 1, "tp", "tp-cp-ep-dp-pp", 0),  # refused: 32 does not divide 16
    (16, 2, 2, 1, 2, "tp", "tp-cp-ep-pp-dp", 0),  # refused: expert DP 2 != DP 4 with pp not last
]

SCHEDULES = [
    # (pp, vp, m, g); g = 0: 1F1B
    (4, 1, 8, 0),
    (2, 1, 4, 0),
    (3, 1, 5, 0),
    (4, 2, 8, 4),
    (3, 2, 6, 3),
    (2, 2, 4, 2),  # note 13's batched finding
    (4, 2, 7, 7),
]
REFUSED_SCHEDULE = (4, 2, 8, 2)  # group size 2 < PP = 4

READ_LAYOUT = """() => {
  const root = document.querySelector('#ms-layout');
  const rows = sel => Array.from(root.querySelectorAll(sel + ' tbody tr')).map(tr =>
      [tr.dataset.kind, Array.from(tr.cells).map(td => td.textContent)]);
  return {state: root.dataset.state, error: root.querySelector('.ms-error').textContent,
          all: rows('.ms-all'), mine: rows('.ms-mine'),
          title: root.querySelector('.ms-rank-title').textContent,
          solid: Array.from(root.querySelectorAll('.ms-grid rect')).filter(r => !r.classList.contains('faint')
              && !r.classList.contains('f-light')).map(r => Number(r.dataset.rank))};
}"""

READ_SCHEDULE = """() => {
  const root = document.querySelector('#ms-schedule');
  const lanes = Array.from(root.querySelectorAll('.ms-timeline g[data-name^="rank "]')).map(g =>
      Array.from(g.querySelectorAll('rect'))
        .map(r => [Number(r.getAttribute('x')), r.querySelector('title').textContent])
        .sort((a, b) => a[0] - b[0]).map(t => t[1].split(' ')[2]));
  return {state: root.dataset.state, error: root.querySelector('.ms-error').textContent, lanes,
          bubble: root.querySelector('.ms-bubble').textContent,
          finding: root.querySelector('.ms-finding').hidden ? '' : root.querySelector('.ms-finding').textContent,
          phases: root.querySelectorAll('.ms-timeline g[data-name^="phases "] rect').length};
}"""


def stored(name: str) -> dict:
    text = (DATA / name).read_text(encoding="utf-8")
    return json.loads(text[text.index("{") : text.rindex(")")])


def layout_hash(world, tp, pp, cp, ep, etp, order, rank, kind="tp") -> str:
    return f"#w={world}&tp={tp}&pp={pp}&cp={cp}&ep={ep}&etp={etp}&order={order}&rank={rank}&kind={kind}"


SHOW = """async ([sel, h]) => {
  // select by the URL hash, as a shared link does, and wait until the explorer has drawn it
  location.hash = h;
  const start = performance.now();
  while (document.querySelector(sel).dataset.shown !== h) {
    if (performance.now() - start > 10000) throw new Error(sel + ' did not show ' + h);
    await new Promise(requestAnimationFrame);
  }
}"""


def show(page, root: str, hash_: str, read: str | None = None):
    """Show ``hash_``; with ``read`` (a READ_* script), what the page then shows, in the same
    round trip to the browser."""
    if read is None:
        return page.evaluate(SHOW, [root, hash_])
    return page.evaluate(f"async arg => {{ await ({SHOW})(arg); return ({read})(); }}", [root, hash_])


def groups_of(text: str) -> list[list[int]]:
    return [[int(x) for x in g.split(",")] for g in re.findall(r"\[([\d, ]+)\]", text)]


def expected_layout(world, tp, pp, cp, ep, etp, order):
    """What Megatron says, computed here: its two RankGenerators and embedding rules, or, for
    sizes it refuses, its message from a real call."""
    from megatron.core.parallel_state import (
        RankGenerator,
        default_embedding_ranks,
        default_position_embedding_ranks,
    )

    from snippets.site.layout_data import megatron_layout

    etp = tp if etp == "tp" else int(etp)
    real = megatron_layout(world, tp, pp, cp, ep, etp, order)
    if isinstance(real, str):
        return real
    decoder = RankGenerator(tp=tp, ep=1, dp=world // (tp * pp * cp), pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    out = {kind: decoder.get_ranks(kind) for kind in ("tp", "cp", "dp", "dp-cp", "pp")}
    out.update(ep=expert.get_ranks("ep"), etp=expert.get_ranks("tp"), edp=expert.get_ranks("dp"))
    out["emb"] = [default_embedding_ranks(g) for g in out["pp"]]
    out["pos-emb"] = [default_position_embedding_ranks(g) for g in out["pp"]]
    return out


def test_layout_explorer_shows_megatrons_groups(tab, site_url):
    first = LAYOUTS[0]
    tab.goto(f"{site_url}explorers/layouts/{layout_hash(*first)}")
    page = tab.page
    compared = 0
    for layout in LAYOUTS:
        shown = show(page, "#ms-layout", layout_hash(*layout), READ_LAYOUT)
        expected = expected_layout(*layout[:-1])
        if isinstance(expected, str):
            assert shown["state"] == "error" and expected in shown["error"], (layout, shown["error"])
            compared += 1
            continue
        assert shown["state"] == "ok", (layout, shown["error"])
        all_groups = {kind: groups_of(cells[2]) for kind, cells in shown["all"]}
        assert all_groups == expected, layout
        rank = layout[-1]
        assert shown["title"] == f"rank {rank} 所在的群"
        mine = {kind: groups_of(cells[1]) for kind, cells in shown["mine"]}
        for kind, groups in expected.items():
            member = [g for g in groups if rank in g]
            assert mine[kind] == member, (layout, kind)  # none for ranks outside pos-emb
        tp_group = next(g for g in expected["tp"] if rank in g)
        assert sorted(shown["solid"]) == sorted(tp_group), layout  # the picture fills rank's tp group
        compared += 1
    assert compared == len(LAYOUTS) >= 20
    # seed 000: rank 5 and 13 of TP=2 PP=2 DP=4 on 16 GPUs
    mine = {
        kind: cells[1]
        for kind, cells in show(page, "#ms-layout", layout_hash(*LAYOUTS[0]), READ_LAYOUT)["mine"]
    }
    assert (mine["tp"], mine["dp"], mine["pp"]) == ("[4, 5]", "[1, 3, 5, 7]", "[5, 13]")
    # tapping a rank selects it and puts it in the URL; a kind button recolors the grid
    page.click('#ms-layout .ms-grid g[data-name="rank 13"] rect')
    page.wait_for_function("() => location.hash.includes('rank=13')")
    page.click('#ms-layout button[data-kind="pp"]')
    page.wait_for_function(
        "() => location.hash.includes('kind=pp')"
        " && document.querySelector('#ms-layout').dataset.shown === location.hash"
    )
    assert sorted(page.evaluate(READ_LAYOUT)["solid"]) == [5, 13]
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "layouts-1400.png"))
    tab.assert_clean()


def test_schedule_explorer_draws_the_recording(tab, site_url):
    data = stored("schedules.js")["cases"]
    tab.goto(f"{site_url}explorers/schedules/#pp=4&vp=1&m=8")
    page = tab.page
    for pp, vp, m, g in SCHEDULES:
        shown = show(
            page, "#ms-schedule", f"#pp={pp}&vp={vp}&m={m}" + (f"&g={g}" if g else ""), READ_SCHEDULE
        )
        entry = data[f"{pp}.{vp}.{m}.{g}"]
        assert shown["state"] == "ok", shown["error"]
        assert shown["lanes"] == [r["ops"].split(" ") for r in entry["ranks"]], (pp, vp, m, g)
        assert (
            f"量出的气泡 {entry['bubble']}" in shown["bubble"] and f"= {entry['formula']}" in shown["bubble"]
        )
        assert shown["phases"] >= pp  # every lane has its warm-up / steady / cool-down strip
        if (pp, vp) == (2, 2):
            finding = entry["batched"]
            assert finding["batched"] != finding["separate"] == finding["pp1"]
            assert f"loss = {finding['batched']}" in shown["finding"]
        else:
            assert not shown["finding"]
    pp, vp, m, g = REFUSED_SCHEDULE
    shown = show(page, "#ms-schedule", f"#pp={pp}&vp={vp}&m={m}&g={g}", READ_SCHEDULE)
    assert shown["state"] == "error" and data[f"{pp}.{vp}.{m}.{g}"]["error"] in shown["error"]
    assert "should range in [PP=4 , M=8]" in shown["error"]
    show(page, "#ms-schedule", "#pp=4&vp=2&m=8&g=4")
    page.screenshot(path=str(SHOTS / "schedules-1400.png"))
    tab.assert_clean()


@pytest.mark.parametrize(
    "path, root",
    [
        (
            "explorers/layouts/index.html" + layout_hash(16, 2, 2, 1, 1, "tp", "tp-cp-ep-dp-pp", 5, "dp"),
            "#ms-layout",
        ),
        ("explorers/schedules/index.html#pp=4&vp=2&m=8&g=4", "#ms-schedule"),
    ],
)
def test_explorers_work_from_disk_at_390px(phone, site, path, root):
    phone.goto(f"file://{site.dir}/{path}")
    page = phone.page
    page.wait_for_function("sel => document.querySelector(sel).dataset.state === 'ok'", arg=root)
    overflow = page.evaluate("() => document.documentElement.scrollWidth")
    assert overflow <= PHONE["width"], f"the page scrolls sideways at 390 px ({overflow} px)"
    boxes = page.evaluate(f"() => document.querySelectorAll('{root} svg.ms-figure rect').length")
    assert boxes >= 16
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{root[4:]}-390.png"))
    # from disk, material's search worker cannot read its index (not this page's doing)
    phone.errors = [e for e in phone.errors if "search_index" not in e and "ERR_FILE_NOT_FOUND" not in e]
    phone.assert_clean()
