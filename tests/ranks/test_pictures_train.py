"""snippets/train/pictures.py, note 06: the gradient-path picture is drawn from rank 0's recorded
step -- its collective boxes are the communication tables' rows (finalize, then step), its facts
the booleans the note prints -- two renders are the same bytes, and the legibility check passes."""

import re

import pytest

from snippets.experiments import EXPERIMENTS
from snippets.ranks.launch import run_ranks, warm_up
from snippets.train import pictures


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_grad_path_is_the_recorded_step():
    from snippets.experiments.n06_train_step import train_step

    r0 = run_ranks(train_step, 2, EXPERIMENTS["train-step"].tiny, clip_grad=0.0, keep_tensors=False)[0]
    fig = pictures.draw_grad_path(r0)
    fig.check()
    svg = fig.svg()
    assert svg == pictures.draw_grad_path(r0).svg()
    drawn = re.findall(r">((?:AR|AG|RS|p2p|\w+) · [^<]*)</text>", svg)
    assert drawn == [
        f"{pictures._API.get(c.api, c.api)} · {c.group} {list(c.ranks)} · {c.before}"
        for c in r0["finalize"] + r0["step"]
    ]
    assert drawn[0].startswith("AR · dp-cp [0, 1]")  # the DP all-reduce of the whole buffer
    labels = [label.text for label in fig.labels()]
    assert f"之后 param.grad is None: {r0['grad_none_before_step']}" in labels
    assert f"param.grad 即 main_grad: {r0['grad_is_main_grad_after_step']}" in labels
