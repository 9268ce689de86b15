"""The readable loss-scale policy in snippets/optim/loss_scale.py against Megatron's DynamicGradScaler."""

import random

import pytest

from snippets.optim import loss_scale
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _both(sequences, policies):
    return [
        (loss_scale.megatron_trace(seq, **policy), loss_scale.trace(seq, **policy))
        for seq, policy in zip(sequences, policies)
    ]


def test_trace_equals_megatrons_dynamic_grad_scaler_step_by_step():
    rng = random.Random(0)
    sequences, policies = [], []
    for _ in range(40):
        sequences.append([rng.random() < 0.3 for _ in range(30)])
        policies.append(
            dict(
                initial_scale=2.0 ** rng.randint(3, 16),
                growth_interval=rng.randint(1, 5),
                hysteresis=rng.randint(1, 3),
                min_scale=2.0 ** rng.randint(0, 3),
            )
        )
    for real, ours in run_ranks(_both, 1, sequences, policies)[0]:
        assert real == ours


def test_hand_computed_cases():
    # hysteresis=1: every overflow halves; growth_interval=2: two clean steps double.
    rows = loss_scale.trace([True, False, False, True], initial_scale=8.0, growth_interval=2, hysteresis=1)
    assert [r[3] for r in rows] == [4.0, 4.0, 8.0, 4.0]
    # min_scale is a floor
    rows = loss_scale.trace([True] * 5, initial_scale=4.0, hysteresis=1, min_scale=1.0)
    assert [r[3] for r in rows] == [2.0, 1.0, 1.0, 1.0, 1.0]
    # hysteresis=2 is refilled only by a growth, not by a clean step: inf, clean, inf backs off
    rows = loss_scale.trace([True, False, True], initial_scale=8.0, growth_interval=1000, hysteresis=2)
    assert [r[3] for r in rows] == [8.0, 8.0, 4.0]
