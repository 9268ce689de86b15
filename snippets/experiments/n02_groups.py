"""Notes 02 and 08's experiment: which ranks ``initialize_model_parallel`` puts in each group.

On a real node this is the first thing to look at: with ``--tp 2 --pp 4`` on 8 GPUs, which GPUs
talk in a TP all-reduce, which pass activations between pipeline stages, which average gradients.
``run`` calls the real ``parallel_state.initialize_model_parallel`` with the parallel sizes and
reads every group back through Megatron's own getters (:func:`snippets.ranks.groups.describe_rank`);
``tables`` prints note 02's per-rank table and seed 000's group summary. :func:`run_orders` lays
the same ranks out once per ``order`` string, for the picture of seed 000's 16-GPU example.
"""

from __future__ import annotations

from snippets.ranks.groups import describe_rank, group_summary, rank_table, unique_groups
from snippets.ranks.pictures import panel_from_described

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
"""The default order and the one ``--use-tp-pp-dp-mapping`` selects."""


def run(dims, par) -> dict:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        expert_model_parallel_size=par.ep,
    )
    return describe_rank()


def run_orders(dims, par, orders=ORDERS) -> list[dict]:
    """``describe_rank()`` once per order: initialize, read the groups back, destroy, next order."""
    from megatron.core import parallel_state

    described = []
    for order in orders:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=par.tp,
            pipeline_model_parallel_size=par.pp,
            context_parallel_size=par.cp,
            expert_model_parallel_size=par.ep,
            order=order,
        )
        described.append(describe_rank())
        parallel_state.destroy_model_parallel()
    return described


def order_panels(results: list, par, orders=ORDERS, ranks=(5, 13)) -> list:
    """One picture panel per order from :func:`run_orders`' results (one list per rank)."""
    sizes = dict(tp=par.tp, cp=par.cp, ep=1, dp=par.dp, pp=par.pp)
    return [
        panel_from_described([r[i] for r in results], order, sizes, ranks) for i, order in enumerate(orders)
    ]


def kinds_for(par) -> tuple[str, ...]:
    """The group kinds worth a column: note 02's without context parallelism, its CP table's with."""
    kinds = ("tp", "cp", "dp", "dp-cp") if par.cp > 1 else ("tp", "pp", "dp", "tp-pp", "embd", "pos-embd")
    return kinds + (("ep", "etp", "edp") if par.ep > 1 else ())


def tables(results: list, dims, par) -> list:
    kinds = kinds_for(par)
    summary = [
        k
        for k in ("tp", "pp", "dp", "cp", "tp-pp", "embd", "dp-cp", "ep", "etp", "edp")
        if k in kinds or k in ("tp", "pp", "dp", "cp", "tp-pp", "embd")
    ]
    return [
        rank_table(results, kinds=kinds),
        group_summary({kind: unique_groups(results, kind) for kind in summary}),
    ]
