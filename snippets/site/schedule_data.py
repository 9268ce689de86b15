"""The pipeline schedule explorer's data: Megatron's real schedules, recorded on CPU ranks.

For each PP size the explorer offers, :func:`sweep` builds note 13's tiny ``GPTModel`` split into
``PP`` stages (or ``PP x 2`` virtual stages) once, on ``PP`` gloo ranks, and runs
``get_forward_backward_func()`` once per offered case -- every micro-batch count ``m`` and, for the
interleaved schedule, every ``microbatch_group_size_per_vp_stage`` from 1 to ``m`` -- while
:func:`snippets.pp.timeline.record_schedule` records each rank's forwards, backwards and p2p calls.
A case Megatron refuses raises before any p2p (the same check on every rank): its message is the
data. :func:`case_data` puts a recorded case on note 13's logical clock (forward 1, backward 2) and
adds the warm-up / steady / cool-down counts read from the recording next to the code's own
(``get_pp_rank_microbatches``), and the bubble next to ``(p-1)/(v*m+p-1)``.

PP=2 interleaved runs with ``batch_p2p_comm=False`` (note 13's finding: batched, the two
directions to the same neighbour swap tensors); :func:`batched_finding` reruns those cases batched
and keeps the losses, beside the unbatched ones and PP=1's.
"""

from __future__ import annotations

import dataclasses

PPS = (2, 3, 4)
MICROBATCHES = (4, 5, 6, 7, 8)
VP = 2


def dims_for(pp: int):
    """Note 13's tiny sizes with ``2 * pp`` layers: one per virtual stage at VP=2 (8 layers, note
    13's, do not split into 3 stages)."""
    from snippets.experiments.registry import EXPERIMENTS

    return dataclasses.replace(EXPERIMENTS["pipeline"].tiny, layers=2 * pp)


def cases_for(vp) -> list[tuple[int, int | None]]:
    """``(m, microbatch_group_size_per_vp_stage)`` for every offered case (``None``: 1F1B)."""
    if not vp:
        return [(m, None) for m in MICROBATCHES]
    return [(m, g) for m in MICROBATCHES for g in range(1, m + 1)]


def sweep(dims, pp: int, vp, cases, batch_p2p_comm: bool) -> dict:
    """On every rank: build this rank's stage(s) once, run the schedule once per case.
    Returns ``{(m, g): dict(ops, code_counts, losses) or "Type: message"}`` and the function name."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.experiments.n13_pipeline import microbatches, pipeline_config, stage_chunks
    from snippets.models.tiny_gpt import forward_step
    from snippets.pp import timeline

    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp
    )
    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp, vp, batch_p2p_comm=batch_p2p_comm)
    chunks = stage_chunks(dims, config, vp)
    func = get_forward_backward_func()
    out = {}
    for m, group in cases:
        if group is not None:
            config.microbatch_group_size_per_vp_stage = group  # the config every chunk holds
        for chunk in chunks:
            chunk.zero_grad()
        data = microbatches(dims, m)
        try:
            with timeline.record_schedule() as ops:
                losses = func(
                    forward_step_func=forward_step,
                    data_iterator=[iter(data) for _ in chunks] if vp else iter(data),
                    model=chunks,
                    num_microbatches=m,
                    seq_length=dims.seq,
                    micro_batch_size=dims.micro_batch_size,
                )
        except (ValueError, RuntimeError) as error:  # refused before any p2p, on every rank alike
            out[(m, group)] = f"{type(error).__name__}: {error}"
            continue
        out[(m, group)] = dict(
            ops=[dataclasses.replace(op, comms=[]) for op in ops],
            code_counts=schedules.get_pp_rank_microbatches(
                m, len(chunks), config.microbatch_group_size_per_vp_stage
            ),
            loss=round(torch.stack([x["lm loss"] for x in losses]).mean().item(), 4) if losses else None,
        )
    return dict(func=func.__name__, cases=out)


def case_data(per_rank: list, pp: int, vp, m: int) -> dict:
    """One recorded case as the page draws it (every rank's results for the case, in PP order)."""
    from snippets.pp import timeline

    if isinstance(per_rank[0], str):
        return dict(error=per_rank[0])
    v = vp or 1
    ops = [r["ops"] for r in per_rank]
    clock = timeline.logical_schedule(ops, chunks=v, forward=1, backward=2)
    ranks = []
    for r, row in zip(per_rank, clock):
        total, _, warmup, remaining = r["code_counts"]
        ranks.append(
            dict(
                ops=" ".join(timeline.label(op, v) for op, _, _ in row),
                start=[start for _, start, _ in row],
                phases=list(timeline.phases(r["ops"])),
                code=[warmup, remaining, total - remaining],
            )
        )
    return dict(
        ranks=ranks,
        makespan=timeline.makespan(clock),
        bubble=round(timeline.bubble_fraction(clock), 4),
        formula=round((pp - 1) / (v * m + pp - 1), 4),
        loss=per_rank[-1]["loss"],
    )


def record(pp: int, vp, batch_p2p_comm: bool | None = None, cases=None) -> dict:
    """``{(m, g): case_data}`` for one PP / VP from one launch of ``pp`` ranks."""
    from snippets.experiments.n13_pipeline import batch_p2p_comm_for
    from snippets.ranks.launch import run_ranks

    cases = cases or cases_for(vp)
    batched = batch_p2p_comm_for(pp, vp) if batch_p2p_comm is None else batch_p2p_comm
    results = run_ranks(sweep, pp, dims_for(pp), pp, vp, cases, batched)
    out = {}
    for m, g in cases:
        entry = case_data([r["cases"][(m, g)] for r in results], pp, vp, m)
        if "error" not in entry:
            entry["func"] = results[0]["func"]
        out[(m, g)] = entry
    return out


def batched_finding(recorded: dict) -> dict:
    """PP=2 interleaved, rerun with ``batch_p2p_comm=True``: its loss beside the recorded
    (unbatched) one and PP=1's, per accepted case."""
    from snippets.ranks.launch import run_ranks

    cases = [key for key, entry in recorded.items() if "error" not in entry]
    batched = record(2, VP, batch_p2p_comm=True, cases=cases)
    reference = run_ranks(sweep, 1, dims_for(2), 1, None, [(m, None) for m in MICROBATCHES], True)[0]
    return {
        key: dict(
            batched=batched[key]["loss"],
            separate=recorded[key]["loss"],
            pp1=reference["cases"][(key[0], None)]["loss"],
        )
        for key in cases
    }


def case_name(pp: int, vp, m: int, g) -> str:
    return f"{pp}.{vp or 1}.{m}.{g or 0}"


def all_data(pps=PPS) -> dict:
    """Every offered case, keyed ``"pp.vp.m.g"`` (``g`` = 0 for 1F1B)."""
    out = {}
    for pp in pps:
        for vp in (None, VP):
            recorded = record(pp, vp)
            finding = batched_finding(recorded) if (pp == 2 and vp) else {}
            for (m, g), entry in recorded.items():
                if (m, g) in finding:
                    entry["batched"] = finding[(m, g)]
                out[case_name(pp, vp, m, g)] = entry
    return dict(pps=list(pps), microbatches=list(MICROBATCHES), vp=VP, cases=out)
