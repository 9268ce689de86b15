"""Watching a real Megatron ``MoELayer`` on CPU ranks (note 17): one set of expert weights copied
onto EP ranks, what the router chose and the dispatcher moved, and the tables that show it.

Nothing here re-implements MoE: the layer, router, dispatcher and aux loss are Megatron's. This
module only

* cuts an EP=1 layer's ``state_dict`` down to one EP rank (:func:`local_expert_state`), so an
  EP=2 run can use exactly the reference's experts;
* hangs forward hooks on the router and the experts (:func:`watch`) to keep, per forward, the
  ``routing_map`` / ``probs`` the ``TopKRouter`` returned and the ``tokens_per_expert`` the
  dispatcher handed to the local experts;
* reads the load-balancing loss back from Megatron's own logging tracker (:func:`pop_aux_loss`);
* renders the all-to-all record with its split sizes (:func:`dispatch_table`), and shows a table
  that only proves the page right closed, one click away (:class:`Folded`).
"""

from __future__ import annotations

import re

from snippets.record.tables import Table

_EXPERT_KEY = re.compile(r"^experts\.local_experts\.(\d+)\.(.+)$")


def local_expert_state(full_state: dict, local_expert_indices: list[int]) -> dict:
    """The EP=1 ``MoELayer.state_dict()`` as one EP rank holds it: the router unchanged, global
    experts ``local_expert_indices`` renamed ``local_experts.0, 1, ...`` and the others dropped."""
    local = {}
    for key, value in full_state.items():
        match = _EXPERT_KEY.match(key)
        if match is None:
            local[key] = value
        elif int(match[1]) in local_expert_indices:
            local[f"experts.local_experts.{local_expert_indices.index(int(match[1]))}.{match[2]}"] = value
    return local


def watch(layer) -> list[dict]:
    """Record, for every forward of ``layer`` (a ``MoELayer``), the router's outputs and what
    reached the local experts. Returns the list the hooks fill, one dict per forward."""
    seen: list[dict] = []

    def after_router(module, args, output):
        probs, routing_map = output
        seen.append({"probs": probs.detach().clone(), "routing_map": routing_map.clone()})

    def before_experts(module, args):
        hidden, tokens_per_expert = args[0], args[1]
        seen[-1]["expert_rows"] = int(hidden.shape[0])
        seen[-1]["tokens_per_expert"] = [int(n) for n in tokens_per_expert]

    def after_layer(module, args, output):
        dispatcher = module.token_dispatcher
        for name in ("input_splits", "output_splits"):
            value = getattr(dispatcher, name, None)
            seen[-1][name] = None if value is None else [int(n) for n in value]

    layer.router.register_forward_hook(after_router)
    layer.experts.register_forward_pre_hook(before_experts)
    layer.register_forward_hook(after_layer)
    return seen


def pop_aux_loss(name: str = "load_balancing_loss", layer_number: int = 1) -> float:
    """The aux loss (divided by its coefficient) Megatron logged for one layer since the last
    call, read from its MoE metrics tracker (``moe_logging.get_moe_metrics_tracker``; the
    ``moe_utils`` dict view of it is deprecated since core 0.16), which is then cleared."""
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    tracker = get_moe_metrics_tracker()
    value = float(tracker.metrics[name].values[layer_number - 1])
    tracker.clear()
    return value


def dispatch_table(calls, meaning) -> Table:
    """The roadmap's communication record plus the all-to-all split sizes the recorder kept;
    ``meaning(i, call)`` says what row ``i`` does."""
    rows = []
    for i, c in enumerate(calls, 1):
        splits = "-"
        if "input_split_sizes" in c.extra:
            splits = f"{c.extra['input_split_sizes']} → {c.extra['output_split_sizes']}"
        rows.append(
            [
                i,
                c.phase,
                c.api,
                f"{c.group} {list(c.ranks)}",
                f"{c.before} → {c.after}",
                splits,
                meaning(i, c),
            ]
        )
    # before/after and the two split lists share a column each: the table stays narrow enough
    # for the site's note column, and "→" reads as "going in → coming out"
    return Table(
        [
            "#",
            "phase",
            "API",
            "group",
            "shape before → after",
            "input_split_sizes → output_split_sizes",
            "meaning",
        ],
        rows,
    )


class Folded:
    """A table that proves the page right (EP=2 equals EP=1): shown closed under ``summary``; its
    markdown still holds the table, so the runner's tables can be found in the stored outputs."""

    def __init__(self, summary: str, table: Table):
        self.summary, self.table = summary, table

    def _repr_markdown_(self) -> str:
        return f"<details><summary>{self.summary}</summary>\n\n{self.table.markdown()}\n\n</details>"

    def __repr__(self) -> str:
        return self.table.markdown()


__all__ = ["local_expert_state", "watch", "pop_aux_loss", "dispatch_table", "Folded"]
