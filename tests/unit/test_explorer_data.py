"""The explorers' stored data (docs/explorers/data/) against Megatron itself, and its regeneration.

* the layout data is what ``initialize_model_parallel`` builds, order by order (a fresh real run
  per order, so the runs the generator shares between orders are checked too), and what
  ``RankGenerator.get_ranks`` gives;
* the regeneration command writes the same bytes twice, and the committed files are its output;
* the in-browser drawing layer uses the Python drawing layer's colors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from snippets.record.draw import PALETTE
from snippets.site import explorers, layout_data

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "explorers" / "data"


def stored(name: str) -> dict:
    text = (DATA / name).read_text(encoding="utf-8")
    return json.loads(text[text.index("{") : text.rindex(")")])


@pytest.fixture(scope="module")
def layouts8():
    return stored("layouts-8.js")


def test_stored_layouts_equal_a_real_run_per_order(layouts8):
    """Every one of the 120 orders, one fresh ``initialize_model_parallel`` each (TP=1: a size-1
    dimension the generator's shared runs must not depend on; CP, EP, PP, DP = 2)."""
    sizes = (1, 2, 2, 2, 1)
    for order in layout_data.ORDERS:
        fresh = layout_data.megatron_layout(8, *sizes, order)
        assert layout_data.lookup(layouts8, *sizes, order) == fresh, order


def test_stored_layouts_equal_rank_generator(layouts8):
    from megatron.core.parallel_state import RankGenerator

    tp, pp, cp, ep, etp = 1, 2, 2, 2, 1
    for order in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "pp-dp-ep-cp-tp"):
        got = layout_data.lookup(layouts8, tp, pp, cp, ep, etp, order)
        decoder = RankGenerator(tp=tp, ep=1, dp=8 // (tp * pp * cp), pp=pp, cp=cp, order=order)
        expert = RankGenerator(tp=etp, ep=ep, dp=8 // (etp * ep * pp), pp=pp, cp=1, order=order)
        for kind in ("tp", "cp", "dp", "dp-cp", "pp"):
            assert got[kind] == decoder.get_ranks(kind), (order, kind)
        assert (got["ep"], got["etp"], got["edp"]) == tuple(expert.get_ranks(t) for t in ("ep", "tp", "dp"))
        assert got["emb"] == [[g[0], g[-1]] for g in decoder.get_ranks("pp")]


def test_refusals_are_megatron_messages(layouts8):
    refused = layout_data.lookup(layouts8, 4, 4, 1, 1, 4, "tp-cp-ep-dp-pp")
    assert refused == "RuntimeError: world_size (8) is not divisible by 16"
    # expert DP 2 != DP 4, and pp is not the last dimension
    refused = layout_data.lookup(layouts8, 1, 2, 1, 2, 1, "tp-cp-ep-pp-dp")
    assert refused.startswith("AssertionError: When not using pp-last rank ordering")


def test_regeneration_is_deterministic(tmp_path):
    """Two runs of the command, same bytes, and the same as the committed files (small worlds)."""
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        explorers.main(["layouts", "--worlds", "1,2", "--out", str(out)])
    for name in ("layouts-1.js", "layouts-2.js"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
        stale = f"{name} is stale: rerun python -m snippets.site.explorers"
        assert (first / name).read_bytes() == (DATA / name).read_bytes(), stale


def test_data_files_are_small():
    sizes = {p.name: p.stat().st_size for p in DATA.glob("*.js")}
    assert {f"layouts-{w}.js" for w in layout_data.WORLDS} | {"schedules.js"} <= set(sizes)
    assert max(sizes.values()) < 800_000, sizes  # a page loads one of them: page + data under 1 MB


def test_browser_palette_is_the_drawing_layers():
    js = (ROOT / "docs" / "explorers" / "ms-draw.js").read_text(encoding="utf-8")
    block = js[js.index("const PALETTE = {") : js.index("};", js.index("const PALETTE = {"))]
    colors = dict(re.findall(r'(\w+): "(#[0-9a-f]{6})"', block))
    assert colors == {kind: light for kind, (light, _) in PALETTE.items()}
