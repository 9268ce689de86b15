"""Note 28's experiment against references computed another way: the FP8 arithmetic by hand, the
combined_1f1b order against the order TransformerLayerSchedulePlan.run is written to issue, the
gradients against the plain schedule, the TP-overlap pairs against TransformerEngine's table."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch

from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments import n28_gpu_only as gpu

TINY = EXPERIMENTS["gpu-only"].tiny
TE_MIRROR = Path("/work/.mirror/NVIDIA+TransformerEngine/repo")


@pytest.fixture(scope="module")
def results():
    from snippets.ranks.launch import run_ranks

    return run_ranks(gpu.run, 2, TINY, Parallel(world=2, tp=2))


# ----------------------------------------------------------------------------- FP8 arithmetic


def test_scale_is_fp8_max_over_amax_with_margin_and_keeps_the_old_one_on_bad_amax():
    assert gpu.scale_from_amax(2.0) == 224.0
    assert gpu.scale_from_amax(2.0, margin=1) == 112.0
    assert gpu.scale_from_amax(1.0, "e5m2") == 57344.0
    assert gpu.scale_from_amax(0.0, previous=3.0) == 3.0
    assert gpu.scale_from_amax(math.inf, previous=3.0) == 3.0


def test_cast_saturates_like_te_and_keeps_representable_values():
    x = torch.tensor([0.5, -2.0, 448.0, 1000.0, -1e6])
    q = gpu.quantize(x, 1.0, "e4m3")
    assert q.tolist() == [0.5, -2.0, 448.0, 448.0, -448.0]
    assert gpu.quantize(torch.tensor([1e6]), 1.0, "e5m2").item() == 57344.0  # torch alone gives inf
    assert gpu.saturated(x, 1.0) == 2


def test_delayed_scaling_uses_the_previous_steps_amax():
    steps = [torch.tensor([1.0, -2.0]), torch.tensor([4.0, 0.5]), torch.tensor([1.0, 8.0])]
    recent = gpu.delayed_scaling(steps, 1, "most_recent")
    assert [r["scale"] for r in recent] == [1.0, 448.0 / 2.0, 448.0 / 4.0]
    # step 2 scaled by 112: 8 * 112 = 896 > 448 is clipped, 1 * 112 is not
    assert [r["clipped"] for r in recent] == [0, 1, 1]
    assert [r["scale"] for r in gpu.delayed_scaling(steps, 2, "most_recent")] == [1.0, 224.0, 112.0]
    windowed = gpu.delayed_scaling(steps, 2, "max")
    assert [r["scale"] for r in windowed] == [1.0, 224.0, 112.0]
    fresh = gpu.current_scaling(steps)
    assert [r["scale"] for r in fresh] == [224.0, 112.0, 56.0] and all(r["clipped"] == 0 for r in fresh)


def test_block_scales_are_powers_of_two_per_block():
    x = torch.tensor([1.0, 3.0, 100.0, 0.01] * 8)
    q = gpu.block_quantize(x, 4)
    # each block's amax is 100: scale 2**floor(log2(4.48)) = 4, so 3.0 * 4 = 12 is exact in E4M3
    expected = torch.tensor([1.0, 3.0, 100.0, 0.01]) * 4
    expected = expected.to(torch.float8_e4m3fn).float() / 4
    assert torch.equal(q, expected.repeat(8))
    errors = gpu.outlier_errors(gpu.activations(0, outlier=1e5))
    whole, per128, per32 = errors.values()
    assert whole > 2 * per128 and per128 > per32
    scales = gpu.outlier_scales(gpu.activations(0, outlier=1e5))
    # the whole tensor's scale is fp8_max / outlier; a block's is the power of two below it
    assert scales["整个 tensor 一个 scale"] == pytest.approx(448 / 99840)
    assert list(scales.values())[1:] == [2.0**-8, 2.0**-8]


# ----------------------------------------------------------------------------- ranks


def test_tp_overlap_pairs_every_collective_with_a_te_buffer(results):
    rows = results[0]["tp_calls"]
    table = gpu.overlap_table(rows)
    assert len(rows) == 10 and "—" not in table.column("TE userbuffer")
    forward = [(r[1], r[2]) for r in rows if r[0] == "forward"]
    assert forward == [
        ("linear_qkv", "all_gather_into_tensor"),
        ("linear_proj", "reduce_scatter_tensor"),
        ("linear_fc1", "all_gather_into_tensor"),
        ("linear_fc2", "reduce_scatter_tensor"),
    ]
    methods = table.column("TE 默认方法")
    assert (methods.count("ring_exchange"), methods.count("pipeline"), methods.count("bulk")) == (4, 2, 4)


@pytest.mark.skipif(not TE_MIRROR.exists(), reason="no TransformerEngine mirror on this machine")
def test_the_method_table_is_te_s_own():
    text = subprocess.run(
        ["git", "-C", str(TE_MIRROR), "show", f"{gpu.TE_COMMIT}:transformer_engine/pytorch/module/base.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    block = text[text.index("methods = {") : text.index("}", text.index("methods = {"))]
    for name, method in gpu.UB_METHOD.items():
        section = block[block.index(f'"{method}"') :]
        section = section[: section.index("]")]
        assert f'"{name}"' in section, (name, method)


def test_amax_group_is_tp_dp_and_tp_only_is_tp(results):
    amax = results[0]["amax"]
    assert amax["默认（tp_only_amax_red=False）"] == [0, 1]  # world 2, TP=2: TP x DP x CP = TP
    assert amax["tp_only_amax_red=True"] == amax["TP 群"] == [0, 1]


def test_combined_1f1b_stops_on_cpu_then_runs_in_the_written_order(results):
    c = results[0]["combined"]
    assert c["error"].startswith("RuntimeError")
    m = TINY.microbatches
    steps = gpu.order_table(c["ops"]).column("micro-batch")
    assert steps == ["F0"] + [f"F{i} + B{i - 1}" for i in range(1, m)] + [f"B{m - 1}"]
    # TransformerLayerSchedulePlan.run, read from its code: this order for each (F layer, B layer)
    written = ["B comb", "F attn", "B 专家", "F disp", "B disp", "F 专家", "F comb", "B attn"]
    for run in {o["run"] for o in c["ops"] if o["step"] == 1 and o["run"] is not None}:
        mine = [o for o in c["ops"] if o["run"] == run and o["step"] == 1]
        assert [f"{o['kind']} {gpu.SHORT[o['node']]}" for o in mine] == written
    streams = {gpu.SHORT[o["node"]]: o["stream"] for o in c["ops"]}
    assert streams["disp"] == streams["comb"] == "通信流" and streams["专家"] == "计算流"


def test_overlap_changes_no_gradient(results):
    c = results[0]["combined"]
    assert c["grad_diff"] == 0.0 and c["same_loss"]


def test_cuda_graph_refusals():
    rows = gpu.cuda_graph_refusals(dict(num_layers=2, hidden_size=16, num_attention_heads=4))
    assert [r[1] for r in rows] == [
        "AssertionError",
        "ValueError",
        "AssertionError",
        "AssertionError",
        "接受",
    ]


def _te_function(name: str) -> str:
    """The source of one top-level function of TE's quantization.py at TE_COMMIT, decorators dropped."""
    text = subprocess.run(
        ["git", "-C", str(TE_MIRROR), "show", f"{gpu.TE_COMMIT}:transformer_engine/pytorch/quantization.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    start = text.index(f"\ndef {name}(") + 1
    end = text.index("\n\n\n", start)
    return text[start:end]


@pytest.mark.skipif(not TE_MIRROR.exists(), reason="no TransformerEngine mirror on this machine")
@pytest.mark.parametrize("history_len, algo", [(1, "most_recent"), (4, "max"), (3, "most_recent")])
def test_delayed_scaling_matches_te_s_own_update(history_len, algo):
    """TE's own amax-history and scale functions (read from its source, run with torch on CPU)
    give the scale our delayed_scaling uses at every step."""
    from typing import Tuple  # noqa: F401  (TE's annotations)

    scope = {"torch": torch, "Tuple": Tuple}
    for name in ("_update_amax_history", "_default_get_amax_and_update_history", "_default_sf_compute"):
        exec(_te_function(name), scope)
    steps = [gpu.activations(s) * (8.0 if s == 3 else 1.0) for s in range(6)]
    history = torch.zeros(history_len, 1)
    scale = torch.ones(1)
    ours = gpu.delayed_scaling(steps, history_len, algo)
    for x, r in zip(steps, ours):
        assert r["scale"] == pytest.approx(float(scale), rel=1e-6)
        history[0] = x.float().abs().max()  # TE writes this step's amax into slot 0 during the cast
        history, amax = scope["_default_get_amax_and_update_history"](history, algo)
        scale = scope["_default_sf_compute"](amax, scale, 448.0, 0)
