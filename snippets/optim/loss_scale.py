"""Dynamic loss scaling as Megatron's ``DynamicGradScaler`` does it, in a few readable lines
(note 20).

fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. So the loss is multiplied by a
large *scale* S before backward (``config.grad_scale_func``), every gradient comes out S times
larger, and the optimizer divides by S again before the update. If S was too large, some
gradient overflowed to inf/nan: the optimizer skips that step (no update) and S shrinks.
If S has been safe for a while, S grows, to keep small gradients representable.

Megatron's policy (``megatron/core/optimizer/grad_scaler.py``) has two counters:

* ``growth_tracker`` counts clean steps since the last overflow (or growth); at
  ``growth_interval`` the scale is multiplied by ``growth_factor`` and both counters reset;
* ``hysteresis_tracker`` starts at ``hysteresis`` and loses one per overflow; the scale is
  multiplied by ``backoff_factor`` (never below ``min_scale``) once it reaches zero. Only a
  *growth* refills it -- a clean step does not (the note shows what that means).

:func:`update` is that policy on plain Python numbers; :func:`trace` runs it over a sequence of
"found inf" flags. ``tests/ranks/test_loss_scale.py`` drives the real ``DynamicGradScaler`` with the
same sequences and requires the same scale, step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ScalerState:
    scale: float  # the loss scale S
    growth_tracker: int  # clean steps since the last overflow or growth
    hysteresis_tracker: int  # overflows still tolerated before backing off


def start(initial_scale: float, hysteresis: int) -> ScalerState:
    return ScalerState(scale=initial_scale, growth_tracker=0, hysteresis_tracker=hysteresis)


def update(
    state: ScalerState,
    found_inf: bool,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 1000,
    hysteresis: int = 2,
    min_scale: float = 1.0,
) -> ScalerState:
    """The state after one optimizer step that did (``found_inf``) or did not overflow."""
    if found_inf:
        state = replace(state, growth_tracker=0, hysteresis_tracker=state.hysteresis_tracker - 1)
        if state.hysteresis_tracker <= 0:  # stays <= 0: every later overflow backs off again
            state = replace(state, scale=max(state.scale * backoff_factor, min_scale))
        return state
    state = replace(state, growth_tracker=state.growth_tracker + 1)
    if state.growth_tracker == growth_interval:
        state = ScalerState(
            scale=state.scale * growth_factor, growth_tracker=0, hysteresis_tracker=hysteresis
        )
    return state


def trace(found_infs, initial_scale: float, **policy) -> list[list]:
    """One row per step: ``[step, found_inf, scale before, scale after, growth, hysteresis]``."""
    state = start(initial_scale, policy.get("hysteresis", 2))
    rows = []
    for step, found_inf in enumerate(found_infs):
        after = update(state, found_inf, **policy)
        rows.append(
            [step, found_inf, state.scale, after.scale, after.growth_tracker, after.hysteresis_tracker]
        )
        state = after
    return rows


def megatron_trace(
    found_infs,
    initial_scale: float,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 1000,
    hysteresis: int = 2,
    min_scale: float = 1.0,
) -> list[list]:
    """The same rows from the real ``DynamicGradScaler`` (on CPU it needs the
    ``grad_scaler_device`` patch of :mod:`snippets.cpu.optimizer`)."""
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    scaler = DynamicGradScaler(
        initial_scale=initial_scale,
        min_scale=min_scale,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        hysteresis=hysteresis,
    )
    rows = []
    for step, found_inf in enumerate(found_infs):
        before = scaler.scale.item()
        scaler.update(found_inf)
        rows.append(
            [step, found_inf, before, scaler.scale.item(), scaler._growth_tracker, scaler._hysteresis_tracker]
        )
    return rows
