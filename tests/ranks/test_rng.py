"""Note 24's run and pictures: each stream's seed read back from the real tracker is the formula's,
the dropout masks follow the TP-region rule, Megatron's recompute is bit-identical where
``torch.utils.checkpoint`` is not, and both pictures draw exactly the rows the tables print (two
renders the same bytes, ``check()`` passing). One launch of 4 ranks (TP=2, EP=2) for the module."""

import html
import re

import pytest

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module")
def results():
    from snippets.experiments.n24_rng import run

    warm_up()
    return run_ranks(run, 4, EXPERIMENTS["rng"].tiny, Parallel(world=4, tp=2, ep=2), grid=dict(tp=2))


def tips(svg: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", svg)[1:]]


def test_stream_seeds_are_read_back_from_the_tracker(results):
    streams = [r["streams"] for r in results]
    assert [s["seeds"]["model-parallel-rng"] for s in streams] == [3952, 3953, 3952, 3953]
    assert [s["seeds"]["expert-parallel-rng"] for s in streams] == [2258, 2259, 2358, 2359]
    assert all(s["formula"] for s in streams)


def test_dropout_masks_picture_is_the_pairs_table(results):
    from snippets.experiments.n24_rng import pairs_table
    from snippets.tp.rng_pictures import draw_dropout_masks, mask_string

    streams = [r["streams"] for r in results]
    fig = draw_dropout_masks(streams)
    svg = fig.svg()
    drawn = {}
    for tip in tips(svg):
        who, mask = tip.split(": ")
        rank, where = who.removeprefix("rank ").split(" ")
        drawn.setdefault(int(rank), {})[where] = mask
        # the cells themselves: a light cell is a dropped element, any other fill a kept one
        body = re.search(rf'<g data-name="rank{rank} {where}">(.*?)</g>', svg, re.S)[1]
        cells = re.findall(r'<rect [^>]*class="f-(\w+)', body)
        assert "".join("0" if kind == "light" else "1" for kind in cells) == mask
    assert drawn == {s["rank"]: {w: mask_string(s[w]) for w in ("outside", "inside")} for s in streams}
    assert all(set(m) <= {"0", "1"} and len(m) == 16 for d in drawn.values() for m in d.values())
    assert mask_string([True, False]) == "10"
    # the table's verdicts, recomputed from the drawn masks
    rows = pairs_table(streams).rows
    for pair, _, inside, outside in rows:
        a, b = map(int, pair.split("–"))
        assert inside == (drawn[a]["inside"] == drawn[b]["inside"])
        assert outside == (drawn[a]["outside"] == drawn[b]["outside"])
    # the rule the note teaches: inside equal iff same TP rank, outside always equal
    assert [row[1:] for row in rows] == [[s, s, True] for s in (False, True, False, False, True, False)]
    assert fig.svg() == draw_dropout_masks(streams).svg()
    fig.check()


def test_saved_bytes_picture_is_the_recompute_table(results):
    from snippets.experiments.n24_rng import recompute_table
    from snippets.tp.rng_pictures import draw_saved_bytes

    rows = recompute_table(results[0]["recompute"]).rows
    fig = draw_saved_bytes(rows)
    expected = []
    for mode, after, recomputed, *_ in rows:
        for what, value in (("forward 之后", after), ("backward 里重算", recomputed)):
            if isinstance(value, int):  # "—": not measured, no bar
                expected.append(f"{mode.replace('`', '')} {what}: {value}")
    assert len(expected) == 7
    assert tips(fig.svg()) == expected
    assert fig.svg() == draw_saved_bytes(rows).svg()
    fig.check()


def test_megatron_recompute_is_bit_identical_and_torch_checkpoint_is_not(results):
    rec = results[0]["recompute"]
    assert all(rec["megatron"][k] for k in ("same_y", "same_dx", "same_grads"))
    assert rec["torch"]["same_y"] and not rec["torch"]["same_dx"] and not rec["torch"]["same_grads"]
    # forward keeps only the input; the recompute saves again what the plain forward kept
    assert rec["megatron"]["saved"] == rec["input_bytes"] < rec["plain"]["saved"]
    assert rec["megatron"]["recompute_saved"] == rec["plain"]["saved"]
    assert rec["megatron"]["forward_runs"] == ["no_grad"] and rec["megatron"]["backward_runs"] == ["grad"]
    # the recompute leaves every generator where backward found it; torch's leaves the TP stream moved
    kept = {mode: rec[mode]["generators_kept"] for mode in ("plain", "megatron", "distributed", "torch")}
    assert kept == {
        "plain": [True, True],
        "megatron": [True, True],
        "distributed": [True, True],
        "torch": [True, False],
    }
    # distribute_saved_activations: half the input kept per TP rank, gathered back in backward
    dist = rec["distributed"]
    assert (
        all(dist[k] for k in ("same_y", "same_dx", "same_grads")) and dist["saved"] == rec["input_bytes"] // 2
    )
    assert [(c.api, c.phase, c.before, c.after) for c in dist["calls"]] == [
        ("all_gather_into_tensor", "backward", "[128]", "[256]")
    ]


def test_checkpoint_without_output_releases_the_norm_output(results):
    w = results[0]["without_output"]
    assert w["without_output"]["normed_bytes"] == 0 < w["plain"]["normed_bytes"]
    assert w["without_output"]["saved"] < w["plain"]["saved"] and w["without_output"]["same"]
    assert w["without_output"]["norm_runs"] == [1, 1]
    assert w["fp8_flag"] == {"False": True, "True": True, "None": False} and w["default"] is True
    assert w["default_error"] == w["layer_error"] == "NameError: name 'FP8GlobalStateManager' is not defined"
