"""Note 17's picture: every alltoall arrow is one entry of the run's input_splits, every expert box
the tokens its experts received, the allgather box the recorded all-gather; byte-stable, legible."""

import html
import re

import pytest

from snippets.experiments import EXPERIMENTS
from snippets.experiments.n17_moe import (
    allgather_meaning,
    expert_parallel_step,
    flow_table,
    reference,
    tokens_table,
)
from snippets.moe import pictures
from snippets.moe.tables import dispatch_table
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module")
def ep_run():
    warm_up()
    tiny = EXPERIMENTS["moe"].tiny
    ref = run_ranks(reference, 1, tiny)[0]
    return run_ranks(expert_parallel_step, 4, tiny, ref["state"], grid=dict(ep=2))


def test_dispatch_picture_is_the_flow_and_tokens_tables(ep_run):
    flow, tokens = flow_table(ep_run).rows[:2], tokens_table(ep_run).rows[:2]
    gathered = dispatch_table(ep_run[0]["allgather"]["calls"], allgather_meaning).rows
    fig = pictures.draw_dispatch(flow, tokens, gathered)
    svg = fig.svg()
    tips = [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", svg)[1:]]
    assert tips == pictures.dispatch_tips(flow, tokens, gathered)
    # what the arrows into EP rank j carry adds up to what rank j's experts received
    sent = {}
    for tip in tips:
        if "→ EP rank" in tip:
            j = int(tip.split("→ EP rank ")[1].split(" |")[0])
            sent[j] = sent.get(j, 0) + int(tip.rsplit("| ", 1)[1])
    assert sent == {j: sum(row[2]) for j, row in enumerate(tokens)}
    assert sent == {j: sum(row[4]) for j, row in enumerate(flow)}  # = sum(output_splits)
    assert "allgather | all_gather_into_tensor | [6, 8] → [12, 8]" in tips
    # the labels a reader sees: each rank routes its own micro-batch's tokens (seq · b of them,
    # top-2 each), and each expert box adds up what it received
    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", svg)]
    tiny = EXPERIMENTS["moe"].tiny
    for row in flow:
        assert f"rank {row[0]} · {tiny.seq * tiny.micro_batch_size} token × top-2" in texts, texts
    for row in tokens:
        assert f"各 expert 收到 {row[2]}，共 {sum(row[2])} 行" in texts, texts
    assert svg == pictures.draw_dispatch(flow, tokens, gathered).svg()
    assert fig.width <= 1100
    fig.check()
