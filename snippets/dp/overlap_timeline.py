"""When DDP's bucket collectives fire relative to the compute around them (note 20).

:mod:`snippets.record.recorder` says *which* collectives a step issues and whether autograd was running
backward. With ``overlap_grad_reduce`` / ``overlap_param_gather`` the interesting part is
*between which computations* each one is issued. :func:`markers` puts that into the same record:
while it is active, every module that owns parameters appends a :class:`Marker` when its forward
starts, and every parameter appends one when autograd has computed its gradient. They land in
the recorder's list in the order things happened, so a reduce-scatter sits right after the
gradient that completed its bucket, and an all-gather right after the module whose forward
pre-hook needed it.

The hooks are registered *before* DDP's (``prepend=True``; a parameter's tensor hook runs before
its gradient is accumulated, and DDP's hook runs after accumulation), so a marker always precedes
the collective its module or parameter caused. :func:`timeline` folds each run of consecutive
markers into one row.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from snippets.models.tiny_gpt import global_name


@dataclass
class Marker:
    """One piece of compute: ``kind`` is "forward" (a module starts) or "grad" (a param's grad)."""

    kind: str
    name: str


@contextlib.contextmanager
def markers(ddp, calls: list):
    """Append a :class:`Marker` to ``calls`` for each module forward and parameter gradient."""
    handles = []
    module = ddp.module
    names = {id(p): global_name(module, n) for n, p in module.named_parameters()}
    for mod_name, mod in module.named_modules():
        if any(True for _ in mod.parameters(recurse=False)):
            label = global_name(module, mod_name + ".x")[:-2]
            handles.append(
                mod.register_forward_pre_hook(
                    lambda *_, label=label: calls.append(Marker("forward", label)), prepend=True
                )
            )
    for param in module.parameters():
        label = names[id(param)]
        handles.append(param.register_hook(lambda grad, label=label: calls.append(Marker("grad", label))))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _short(name: str) -> str:
    return name.replace("decoder.", "").replace("self_attention.", "attn.")


def timeline(events: list, bucket_of=None) -> list[list]:
    """Rows ``[#, where in the step, event, detail]``: folded marker runs and the collectives.

    A plain string in ``events`` names the part of the step that follows (e.g. "optimizer.step");
    ``bucket_of(collective)`` may name the bucket a collective moved."""
    rows, run, section = [], [], ""

    def flush():
        if run:
            forward = run[0].kind == "forward"
            what = f"forward 计算（{len(run)} 个模块）" if forward else f"backward 计算（{len(run)} 个梯度）"
            span = _short(run[0].name) if len(run) == 1 else f"{_short(run[0].name)} … {_short(run[-1].name)}"
            rows.append([len(rows) + 1, section, what, span])
            run.clear()

    for event in events:
        if isinstance(event, str):
            flush()
            section = event
        elif isinstance(event, Marker):
            if run and run[0].kind != event.kind:
                flush()
            run.append(event)
        elif len(event.ranks) > 1:  # a group of one rank (e.g. TP=1's loss all-reduce) moves nothing
            flush()
            name = bucket_of(event) if bucket_of else None
            bucket = f"bucket {name}: " if name is not None else ""
            rows.append(
                [
                    len(rows) + 1,
                    section,
                    f"**{event.api}**（{event.phase}）",
                    f"{bucket}{event.before} → {event.after}",
                ]
            )
    flush()
    return rows


def bucket_namer(bucket_sizes: list[int]):
    """``bucket_of`` for :func:`timeline`: a DDP bucket collective moves the whole bucket (all-gather
    output, reduce-scatter input), so its size names the bucket when the sizes differ; anything
    else (the grad norm's one-element all-reduce) gets None."""
    index = {f"[{n}]": i for i, n in enumerate(bucket_sizes)}
    assert len(index) == len(bucket_sizes), "bucket sizes must differ to name buckets by size"

    def bucket_of(collective):
        return index.get(collective.after if collective.api.startswith("all_gather") else collective.before)

    return bucket_of


def where_counts(events: list) -> dict:
    """``{(part of the step, phase): [api, ...]}`` of the multi-rank collectives in ``events``."""
    counts, section = {}, ""
    for event in events:
        if isinstance(event, str):
            section = event
        elif not isinstance(event, Marker) and len(event.ranks) > 1:
            counts.setdefault((section, event.phase), []).append(event.api)
    return counts
