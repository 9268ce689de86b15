"""Note 08's experiment: the real ``initialize_model_parallel`` with experts, against the arithmetic.

``initialize_model_parallel`` lays the same ranks out twice: a decoder grid ``tp x cp x dp x pp``
and an expert grid ``etp x ep x edp x pp``, each a ``RankGenerator``. :func:`run` builds both grids
for real on every rank (expert tensor parallel size :data:`ETP`, as note 08 chooses it) and reads
back, through Megatron's own getters, this rank's coordinates on both grids and the members of
every group (:func:`snippets.ranks.groups.describe_rank`, the same reading as the ``groups``
experiment). ``tables`` prints every rank's groups (note 02's per-rank table with the expert
columns), every rank's expert coordinates next to :func:`snippets.ranks.groups.coordinates`, and note
08's table: each kind of group as the getters report it against ``RankGenerator.get_ranks``.
The last two only confirm the run (every row ``True``): the note shows them behind :func:`folded`.
"""

from __future__ import annotations

from snippets.experiments.n02_groups import kinds_for
from snippets.ranks.groups import coordinates, describe_rank, rank_table, unique_groups
from snippets.record.tables import Table

ETP = 1
"""Expert tensor parallel size: 1, so that the expert data parallel size ``world / (ep * pp)``
exists for any ``ep`` the decoder grid allows (``initialize_model_parallel``'s default, ETP = TP,
would need ``world`` divisible by ``tp * ep * pp``)."""

ORDER = "tp-cp-ep-dp-pp"
"""``initialize_model_parallel``'s default order, the one both generators use here."""

EXPERT_KINDS = ("ep", "etp", "edp")


def init_with_experts(tp, pp, ep, etp, cp=1):
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )
    return describe_rank()


def run(dims, par) -> dict:
    from megatron.core import parallel_state as ps

    described = init_with_experts(par.tp, par.pp, par.ep, ETP, par.cp)
    described["expert_coords"] = {
        "etp": ps.get_expert_tensor_parallel_rank(),
        "ep": ps.get_expert_model_parallel_rank(),
        "edp": ps.get_expert_data_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
    }
    return described


def grid_sizes(par, etp: int = ETP) -> tuple[dict, dict]:
    """``(decoder, expert)``: the sizes of the two ``RankGenerator``s, keyed like ``order``."""
    decoder = dict(tp=par.tp, cp=par.cp, ep=1, dp=par.dp, pp=par.pp)
    expert = dict(tp=etp, cp=1, ep=par.ep, dp=par.world // (etp * par.ep * par.pp), pp=par.pp)
    return decoder, expert


def generators(par, etp: int = ETP):
    """The two real ``RankGenerator``s ``initialize_model_parallel`` makes for these sizes."""
    from megatron.core.parallel_state import RankGenerator

    return tuple(RankGenerator(**sizes, order=ORDER) for sizes in grid_sizes(par, etp))


def checked_kinds(par) -> list[tuple[str, int, str]]:
    """``(group kind, grid: 0 decoder / 1 expert, RankGenerator token)`` for note 08's table."""
    decoder = ["tp", "dp", "pp", "tp-pp"] + (["cp", "dp-cp"] if par.cp > 1 else [])
    return [(kind, 0, kind) for kind in decoder] + [("ep", 1, "ep"), ("etp", 1, "tp"), ("edp", 1, "dp")]


def comparison_table(real: list, par) -> Table:
    grids = generators(par)
    rows = []
    for kind, grid, token in checked_kinds(par):
        expected = sorted(grids[grid].get_ranks(token))
        rows.append([kind, unique_groups(real, kind), expected, unique_groups(real, kind) == expected])
    return Table(["kind", "getter 报出的群", "RankGenerator", "相同"], rows)


def expert_coordinate_table(real: list, par) -> Table:
    """Every rank's expert-grid coordinates from the getters; both grids' against the arithmetic."""
    decoder, expert = grid_sizes(par)
    rows = []
    for d in real:
        c, e = d["coords"], d["expert_coords"]
        on_decoder = coordinates(d["rank"], decoder, ORDER)
        on_expert = coordinates(d["rank"], expert, ORDER)
        same = {k: c[k] for k in ("tp", "cp", "dp", "pp")} == {
            k: on_decoder[k] for k in ("tp", "cp", "dp", "pp")
        } and e == {
            "etp": on_expert["tp"],
            "ep": on_expert["ep"],
            "edp": on_expert["dp"],
            "pp": on_expert["pp"],
        }
        rows.append([d["rank"], f"({e['etp']}, {e['ep']}, {e['edp']}, {e['pp']})", same])
    return Table(["rank", "expert 网格坐标 (etp, ep, edp, pp)", "两个网格的坐标 = coordinates()"], rows)


def tables(results: list, dims, par) -> list:
    kinds = tuple(dict.fromkeys(kinds_for(par) + EXPERT_KINDS))
    return [
        rank_table(results, kinds=kinds),
        expert_coordinate_table(results, par),
        comparison_table(results, par),
    ]


def folded(summary: str, *tables: Table):
    """``tables`` behind a closed ``<details>`` whose summary is ``summary``: checks whose every row
    is ``True`` are one sentence in the note, and their tables stay one click away."""
    from IPython.display import Markdown

    body = "\n\n".join(t.markdown() for t in tables)
    return Markdown(f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>")
