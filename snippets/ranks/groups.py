"""Process groups as data: what ``parallel_state`` made on a rank, and the rank grid's arithmetic.

Two views of the same thing, so a note can show they agree:

* :func:`describe_rank` reads, on one rank after ``initialize_model_parallel``, that rank's
  coordinates and the members of every group Megatron created for it (through Megatron's own
  getters, nothing recomputed);
* :func:`coordinates` is the arithmetic behind ``RankGenerator``: with ``order`` listing the
  dimensions fastest-first, a rank is a mixed-radix number whose digits are its coordinates.
"""

from __future__ import annotations

from snippets.record.tables import Table

GROUP_KINDS = (
    # name   how parallel_state gets it                     what ranks in it share
    ("tp", "get_tensor_model_parallel_group", {}),
    ("pp", "get_pipeline_model_parallel_group", {}),
    ("dp", "get_data_parallel_group", {}),
    ("dp-cp", "get_data_parallel_group", {"with_context_parallel": True}),
    ("cp", "get_context_parallel_group", {}),
    ("tp-pp", "get_model_parallel_group", {}),
    ("tp-cp", "get_tensor_and_context_parallel_group", {}),
    ("tp-dp", "get_tensor_and_data_parallel_group", {}),
    ("tp-dp-cp", "get_tensor_and_data_parallel_group", {"with_context_parallel": True}),
    ("ep", "get_expert_model_parallel_group", {}),
    ("etp", "get_expert_tensor_parallel_group", {}),
    ("edp", "get_expert_data_parallel_group", {}),
    ("etp-ep", "get_expert_tensor_and_model_parallel_group", {}),
    ("embd", "get_embedding_group", {}),
    ("pos-embd", "get_position_embedding_group", {}),
    ("dp(gloo)", "get_data_parallel_group_gloo", {}),
    ("dp-cp(gloo)", "get_data_parallel_group_gloo", {"with_context_parallel": True}),
)
"""Every group kind a rank can belong to, with the ``parallel_state`` getter that returns it."""


def megatron_groups() -> list[tuple[str, object]]:
    """(kind, group) for every group ``parallel_state`` has made on this rank."""
    from megatron.core import parallel_state as ps

    found = []
    for name, getter, kwargs in GROUP_KINDS:
        get = getattr(ps, getter)
        try:
            group = get(check_initialized=False, **kwargs)
        except TypeError:  # a getter without check_initialized
            try:
                group = get(**kwargs)
            except Exception:
                continue
        except Exception:  # not created in this configuration
            continue
        if group is not None:
            found.append((name, group))
    return found


def describe_rank() -> dict:
    """This rank's coordinates and the global ranks of each of its groups (call on a rank)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    coords = {
        "tp": ps.get_tensor_model_parallel_rank(),
        "cp": ps.get_context_parallel_rank(),
        "dp": ps.get_data_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "ep": ps.get_expert_model_parallel_rank(),
    }
    groups = {name: list(dist.get_process_group_ranks(g)) for name, g in megatron_groups()}
    return {"rank": dist.get_rank(), "coords": coords, "groups": groups}


def rank_table(described: list[dict], kinds=("tp", "dp", "pp")) -> Table:
    """One row per rank: its coordinates and the members of its groups of ``kinds``."""
    headers = ["rank", "(tp, cp, dp, pp)"] + [f"{k} group" for k in kinds]
    rows = []
    for d in described:
        c = d["coords"]
        rows.append(
            [d["rank"], f"({c['tp']}, {c['cp']}, {c['dp']}, {c['pp']})"]
            + [d["groups"].get(k, "-") for k in kinds]
        )
    return Table(headers, rows)


def unique_groups(described: list[dict], kind: str) -> list[list[int]]:
    """All distinct groups of ``kind`` across ranks, in order of their first rank."""
    seen = {tuple(d["groups"][kind]) for d in described if kind in d["groups"]}
    return [list(g) for g in sorted(seen)]


def group_summary(groups_by_kind: dict[str, list[list[int]]]) -> Table:
    """Seed 000's table: kind, count × size, members."""
    rows = []
    for kind, groups in groups_by_kind.items():
        rows.append([kind, f"{len(groups)} × {len(groups[0])}", " ".join(str(g) for g in groups)])
    return Table(["group", "count × size", "members"], rows)


def coordinates(rank: int, sizes: dict[str, int], order: str) -> dict[str, int]:
    """A rank's coordinate along each dimension: the digits of ``rank`` in a mixed radix whose
    places are the dimensions of ``order``, fastest first (``"tp-cp-ep-dp-pp"``: tp varies
    fastest)."""
    coords = {}
    for name in order.split("-"):
        coords[name] = rank % sizes[name]
        rank //= sizes[name]
    return coords


def rank_of(coords: dict[str, int], sizes: dict[str, int], order: str) -> int:
    """The inverse of :func:`coordinates`: sum of coordinate × stride, fastest dimension first."""
    rank, stride = 0, 1
    for name in order.split("-"):
        rank += coords[name] * stride
        stride *= sizes[name]
    return rank


def groups_along(token: str, sizes: dict[str, int], order: str) -> list[list[int]]:
    """Readable version of a ``RankGenerator.get_ranks(token)``: ranks that agree on every
    coordinate outside ``token`` form one group (a test proves it equals Megatron's)."""
    world = 1
    for name in order.split("-"):
        world *= sizes[name]
    inside = set(token.split("-"))
    buckets: dict[tuple, list[int]] = {}
    for rank in range(world):
        c = coordinates(rank, sizes, order)
        key = tuple(v for k, v in c.items() if k not in inside)
        buckets.setdefault(key, []).append(rank)
    return sorted(buckets.values())
