"""Note 20's second experiment: where DDP's bucket collectives fire with ``overlap_grad_reduce`` and
``overlap_param_gather``, at any size.

:func:`snippets.experiments.n20_optimizer_topic.overlap_run` (note 20's section 8, listed there)
builds the model on every rank (:func:`snippets.experiments.n14_ddp.build_model`, weights by global
name), wraps it in DDP with the distributed optimizer, both overlap switches on or off, and trains
``iterations`` steps over this DP rank's share of the global batch (``no_sync`` on the config, as
the training entry sets it). Every step -- schedule, ``finalize_model_grads``,
``optimizer.step()`` -- is recorded together with :func:`snippets.dp.overlap_timeline.markers`, so
each collective sits between the module forwards and parameter gradients around it. :func:`run`
does both runs on every rank and compares their weights there (right after the last step, and
after forcing the parameter all-gather); :func:`tables` prints note 20's section 8: where each
step's collectives fall, rank 0's timeline of the last overlapped step, and the comparison.
"""

from __future__ import annotations

from snippets.experiments.n20_optimizer_topic import BUCKET_SIZE, overlap_run
from snippets.record.tables import Table


def run(dims, par) -> dict:
    """On every rank (the runner): without overlap, then with; the weights compared here."""
    from megatron.core import parallel_state

    from snippets.models.tiny_gpt import max_abs_diff

    parallel_state.initialize_model_parallel()
    plain = overlap_run(dims, False, bucket_size=BUCKET_SIZE.get(dims.name), device=par.device)
    overlapped = overlap_run(dims, True, bucket_size=BUCKET_SIZE.get(dims.name), device=par.device)
    return dict(
        plain=plain["steps"],
        overlapped=overlapped["steps"],
        buckets=overlapped["buckets"],
        diffs=[
            ["overlap vs 不 overlap：强制同步参数之后", max_abs_diff(overlapped["synced"], plain["synced"])],
            [
                "overlap vs 不 overlap：刚做完 optimizer.step()",
                max_abs_diff(overlapped["after_step"], plain["after_step"]),
            ],
            [
                "overlap：step 之后 vs 强制同步之后",
                max_abs_diff(overlapped["after_step"], overlapped["synced"]),
            ],
        ],
    )


# ----------------------------------------------------------------------------- note 20's tables

SHORT = {"all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS", "all_reduce": "AR"}


def counts(events) -> list[str]:
    """The step's multi-rank collectives in the schedule's forward, its backward, in
    ``finalize_model_grads`` and in ``optimizer.step()``: ``AG×3 RS×1``... The schedule is split by
    the recorder's phase; the other two parts take every phase their collectives carry (grad sync,
    optimizer step)."""
    from snippets.dp import overlap_timeline

    found = overlap_timeline.where_counts(events)

    def part(section, phase=None):
        return [
            api
            for (where, p), apis in found.items()
            if where == section and phase in (None, p)
            for api in apis
        ]

    return [
        " ".join(f"{SHORT.get(api, api)}×{apis.count(api)}" for api in dict.fromkeys(apis))
        for apis in (
            part("schedule", "forward"),
            part("schedule", "backward"),
            part("finalize_model_grads"),
            part("optimizer.step"),
        )
    ]


def counts_table(results: list) -> Table:
    r0 = results[0]
    return Table(
        [
            "overlap",
            "第几步",
            "schedule：forward 中",
            "schedule：backward 中",
            "finalize_model_grads",
            "optimizer.step",
        ],
        [
            [name, i + 1, *counts(events)]
            for name, steps in (("否", r0["plain"]), ("是", r0["overlapped"]))
            for i, events in enumerate(steps)
        ],
    )


def timeline_table(results: list) -> Table:
    """Rank 0's last overlapped step, marker runs folded; buckets named by size when sizes differ."""
    from snippets.dp import overlap_timeline

    sizes = results[0]["buckets"]
    namer = overlap_timeline.bucket_namer(sizes) if len(set(sizes)) == len(sizes) else None
    return Table(
        ["#", "step 里的位置", "事件", "细节"], overlap_timeline.timeline(results[0]["overlapped"][-1], namer)
    )


def tables(results: list, dims, par) -> list:
    return [
        f"bucket 大小（buffer 顺序，bucket 0 在输出层那端）: {results[0]['buckets']}",
        counts_table(results),
        f"第 {len(results[0]['overlapped'])} 步（overlap）的完整时间线，rank 0：",
        timeline_table(results),
        Table(["比较（rank 0，2 步之后）", "max |Δ|"], results[0]["diffs"]),
    ]
