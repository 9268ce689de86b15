"""The schedule explorer's stored recording is what a fresh real run records (two cases).

One launch per case: PP=2 1F1B with m=4, and PP=4 interleaved (VP=2) with m=8 and
``microbatch_group_size_per_vp_stage=4``; every field the page draws (each rank's op order and
logical-clock start times, warm-up / steady / cool-down from the recording and from the code, the
bubble, the loss) must equal docs/explorers/data/schedules.js.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snippets.site import schedule_data

DATA = Path(__file__).resolve().parents[2] / "docs" / "explorers" / "data" / "schedules.js"


@pytest.fixture(scope="module")
def stored():
    text = DATA.read_text(encoding="utf-8")
    return json.loads(text[text.index("{") : text.rindex(")")])["cases"]


@pytest.mark.parametrize("pp, vp, m, g", [(2, None, 4, None), (4, 2, 8, 4)])
def test_recording_equals_a_fresh_real_run(stored, pp, vp, m, g):
    fresh = schedule_data.record(pp, vp, cases=[(m, g)])[(m, g)]
    assert "error" not in fresh
    assert fresh == {k: v for k, v in stored[schedule_data.case_name(pp, vp, m, g)].items() if k != "batched"}
