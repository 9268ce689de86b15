"""The rank layout explorer's data: every group ``initialize_model_parallel`` creates, for many sizes.

The page (``docs/explorers/layouts.md``) only looks lists up; every list comes from running the real
``parallel_state.initialize_model_parallel`` of megatron-core 0.19.0 in this process, under
:func:`fake_world`: ``torch.distributed`` reports a world of ``W`` ranks with this process as rank
0, and ``new_group`` records ``(group_desc, ranks)`` instead of making a group. Megatron builds every
group on every rank (each rank calls ``new_group`` for all of them, and keeps its own), so one call
lists all groups of the layout -- the embedding groups too, through Megatron's own
``default_embedding_ranks`` / ``default_position_embedding_ranks`` on each pipeline group. A size
combination Megatron refuses raises inside that call; its message is what the page shows.

Sharing runs between orders: a dimension of size 1 is a digit of radix 1 in ``RankGenerator``'s
mixed radix, so where it sits in ``order`` changes no group. Orders that agree on the order of the
dimensions larger than 1 (on the decoder grid and on the expert grid) and on ``order.endswith("pp")``
(the one test of the literal string) share one run; a test checks this against a run per order.
"""

from __future__ import annotations

import contextlib
import itertools

KINDS = (
    # kind     group_desc initialize_model_parallel gives it
    ("tp", "TENSOR_MODEL_PARALLEL_GROUP"),
    ("cp", "CONTEXT_PARALLEL_GROUP"),
    ("dp", "DATA_PARALLEL_GROUP"),
    ("dp-cp", "DATA_PARALLEL_GROUP_WITH_CP"),
    ("pp", "PIPELINE_MODEL_PARALLEL_GROUP"),
    ("ep", "EXPERT_MODEL_PARALLEL_GROUP"),
    ("etp", "EXPERT_TENSOR_PARALLEL_GROUP"),
    ("edp", "EXPERT_DATA_PARALLEL_GROUP"),
    ("emb", "EMBEDDING_GROUP"),
    ("pos-emb", "POSITION_EMBEDDING_GROUP"),
)
"""The group kinds the page lists, in its order."""

TOKENS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ORDERS = [DEFAULT_ORDER, "tp-cp-ep-pp-dp"] + sorted(
    o
    for o in ("-".join(p) for p in itertools.permutations(TOKENS))
    if o not in (DEFAULT_ORDER, "tp-cp-ep-pp-dp")
)
"""Every order of the five dimensions (``RankGenerator`` takes any); the default and
``--use-tp-pp-dp-mapping``'s first."""

WORLDS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_SIZE = 8
"""TP, PP, CP, EP each go up to 8 (one machine); DP is what is left (world / (TP·PP·CP))."""


@contextlib.contextmanager
def fake_world(world: int):
    """``torch.distributed`` as rank 0 of ``world`` ranks, with ``new_group`` recording its calls."""
    from unittest import mock

    import torch.distributed as dist

    calls: list[tuple[str, list[int]]] = []

    def new_group(ranks=None, backend=None, group_desc=None, **_):
        if backend is None:  # the gloo twins repeat the same ranks
            calls.append((group_desc, list(ranks)))
        return object()

    with contextlib.ExitStack() as stack:
        for name, value in (
            ("is_initialized", lambda: True),
            ("get_world_size", lambda group=None: world),
            ("get_rank", lambda group=None: 0),
            ("new_group", new_group),
        ):
            stack.enter_context(mock.patch.object(dist, name, value))
        yield calls


def megatron_layout(world: int, tp: int, pp: int, cp: int, ep: int, etp: int, order: str):
    """``{kind: [group, ...]}`` as ``initialize_model_parallel`` builds them, or Megatron's error
    as ``"ExceptionType: message"``."""
    from megatron.core import parallel_state as ps

    wanted = dict((desc, kind) for kind, desc in KINDS)
    with fake_world(world) as calls:
        try:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                context_parallel_size=cp,
                expert_model_parallel_size=ep,
                expert_tensor_parallel_size=None if etp == tp else etp,  # None: Megatron's default, = TP
                order=order,
            )
        except Exception as error:  # noqa: BLE001 - the message is the data
            return f"{type(error).__name__}: {error}"
        finally:
            ps.destroy_model_parallel()
    out: dict[str, list[list[int]]] = {kind: [] for kind, _ in KINDS}
    for desc, ranks in calls:
        if desc in wanted:
            out[wanted[desc]].append(ranks)
    return out


def _share_key(world, tp, pp, cp, ep, etp, order):
    """What a run depends on (see the module docstring)."""
    dp = world // (tp * pp * cp)
    edp = world // (etp * ep * pp)
    decoder = dict(tp=tp, cp=cp, ep=1, dp=dp, pp=pp)
    expert = dict(tp=etp, cp=1, ep=ep, dp=edp, pp=pp)
    tokens = order.split("-")
    return (
        (tp, pp, cp, ep, etp),
        tuple(t for t in tokens if decoder[t] > 1),
        tuple(t for t in tokens if expert[t] > 1),
        order.endswith("pp"),
    )


def size_choices(world: int) -> list[int]:
    return [d for d in range(1, min(world, MAX_SIZE) + 1) if world % d == 0]


def combos(world: int):
    """Every (tp, pp, cp, ep, etp) the page offers at ``world``: etp is TP (the default) or 1."""
    sizes = size_choices(world)
    for tp, pp, cp, ep in itertools.product(sizes, repeat=4):
        for etp in sorted({tp, 1}):
            yield tp, pp, cp, ep, etp


B64 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"


def _width(count: int) -> int:
    """Base-64 digits needed to number ``count`` things."""
    width = 1
    while 64**width < count:
        width += 1
    return width


def _digits(i: int, width: int) -> str:
    return "".join(B64[i // 64**p % 64] for p in reversed(range(width)))


def world_data(world: int, share_runs: bool = True) -> dict:
    """The page's data for one world size (small: lists are stored once and referred to by number).

    ``groups``: each distinct group list, ``"0,1;2,3"``; ``results``: per layout, the index into
    ``groups`` of each kind of :data:`KINDS` (``group_width`` base-64 digits each), or ``"!"`` + an
    index into ``messages``; ``layouts``:
    per ``"tp.pp.cp.ep.etp"``, ``width`` characters per order of :data:`ORDERS` (base 64) naming
    its result, or ``"!n"`` when Megatron refuses the sizes before reading the order."""
    groups: dict[str, int] = {}
    results: dict = {}
    messages: dict[str, int] = {}
    cache: dict = {}
    layouts = {}

    def result_of(layout):
        if isinstance(layout, str):
            key = "!" + str(messages.setdefault(layout, len(messages)))
        else:
            key = tuple(
                groups.setdefault(";".join(",".join(map(str, g)) for g in layout[k]), len(groups))
                for k, _ in KINDS
            )
        return results.setdefault(key, len(results))

    for tp, pp, cp, ep, etp in combos(world):
        name = f"{tp}.{pp}.{cp}.{ep}.{etp}"
        if world % (tp * pp * cp) or world % (etp * ep * pp):
            # refused by a size check that comes before the order is read: one run says it
            message = megatron_layout(world, tp, pp, cp, ep, etp, DEFAULT_ORDER)
            assert isinstance(message, str), (world, name)
            layouts[name] = "!" + str(messages.setdefault(message, len(messages)))
            continue
        codes = []
        for order in ORDERS:
            key = _share_key(world, tp, pp, cp, ep, etp, order) if share_runs else (name, order)
            if key not in cache:
                cache[key] = result_of(megatron_layout(world, tp, pp, cp, ep, etp, order))
            codes.append(cache[key])
        layouts[name] = codes
    width, group_width = _width(len(results)), _width(len(groups))
    layouts = {
        k: v if isinstance(v, str) else "".join(_digits(i, width) for i in v) for k, v in layouts.items()
    }
    return dict(
        world=world,
        kinds=[k for k, _ in KINDS],
        sizes=size_choices(world),
        orders=ORDERS,
        width=width,
        groups=list(groups),
        group_width=group_width,
        results=[k if isinstance(k, str) else "".join(_digits(i, group_width) for i in k) for k in results],
        messages=list(messages),
        layouts=layouts,
    )


def lookup(data: dict, tp, pp, cp, ep, etp, order):
    """What the page shows for a selection: ``{kind: groups}`` or the message (the page's lookup, in
    Python, for tests)."""
    code = data["layouts"][f"{tp}.{pp}.{cp}.{ep}.{etp}"]
    if code.startswith("!"):
        return data["messages"][int(code[1:])]
    width = data["width"]
    result = data["results"][_number(code[width * ORDERS.index(order) :][:width])]
    if result.startswith("!"):
        return data["messages"][int(result[1:])]
    gw = data["group_width"]
    ids = [_number(result[gw * k : gw * (k + 1)]) for k in range(len(KINDS))]
    return {
        kind: [[int(r) for r in g.split(",")] for g in data["groups"][gid].split(";")]
        for (kind, _), gid in zip(KINDS, ids)
    }


def _number(digits: str) -> int:
    out = 0
    for ch in digits:
        out = out * 64 + B64.index(ch)
    return out
