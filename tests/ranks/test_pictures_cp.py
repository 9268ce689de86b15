"""Note 16's picture: the chunk strip is the real get_batch_on_this_cp_rank split, the causal-mask
rows each rank owns add up to the work table's pair counts, and the SVG is byte-stable and legible."""

import html
import re

import pytest

from snippets.cp import pictures
from snippets.experiments import EXPERIMENTS
from snippets.experiments.n16_cp import batch_on_cp_rank, split_table, work_table
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module")
def split_rows():
    warm_up()
    tiny = EXPERIMENTS["cp"].tiny
    return split_table(run_ranks(batch_on_cp_rank, 4, tiny, 4, grid=dict(cp=4)), 4, tiny.seq).rows


def _mask_pairs(svg: str, group: str) -> int:
    """Kept (query, key) pairs drawn in one rank's group: the widths of its mask rows, in cells."""
    part = svg[svg.index(f'data-name="{group}"') :]
    part = part[: part.index("</g>")]
    return round(sum(float(w) for w in re.findall(r'width="([\d.]+)"', part)) / 14)


def test_cp_picture_is_the_split_and_the_work_table(split_rows):
    work = work_table(4, 16)
    fig = pictures.draw_cp_split(split_rows, work)
    svg = fig.svg()
    tips = [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", svg)[1:]]
    assert tips == pictures.cp_tips(split_rows, work)
    # the strip: chunk c belongs to the rank whose position_ids hold it (r and 2·CP-1-r)
    assert [t.split(" | ")[1] for t in tips[:8]] == [f"cp_rank {r}" for r in (0, 1, 2, 3, 3, 2, 1, 0)]
    for r, row in enumerate(work):
        assert _mask_pairs(svg, f"连续切 cp_rank {r}") == row[3]
        assert _mask_pairs(svg, f"2·CP 块切（Megatron） cp_rank {r}") == row[4]
    assert len({row[4] for row in work}) == 1 and len({row[3] for row in work}) == 4
    assert svg == pictures.draw_cp_split(split_rows, work_table(4, 16)).svg()
    fig.check()
