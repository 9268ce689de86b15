"""What ``initialize_model_parallel`` does on one rank, as data, and note 02's picture of it.

:func:`watch_init` calls the real ``parallel_state.initialize_model_parallel`` with every
``create_group`` call (its ``group_desc``, backend and members) and every collective recorded, and
the module globals it set listed. :func:`creation_order` merges the calls by kind, in the order
they were made; :func:`draw_group_creation` draws that table: one row per kind, one box per group
made, the gloo ones and the groups of one rank told apart.
"""

from __future__ import annotations

import contextlib

from snippets.record.draw import Figure
from snippets.record.tables import Table

DEFAULT_BACKEND = "默认"
"""How a ``create_group`` call without ``backend=`` is listed: it takes the world's backend (NCCL on
GPUs; gloo on this site's CPU ranks)."""

SHORT = {
    "GTP_WEIGHT_REMAT_GROUP": "gtp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp-cp",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp-cp（gloo）",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp（gloo）",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "MODEL_PARALLEL_GROUP": "tp-pp",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "embd",
    "POSITION_EMBEDDING_GROUP": "pos-embd",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp-dp-cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp-dp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp-cp",
    "EXPERT_GTP_WEIGHT_REMAT_GROUP": "expert gtp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "etp-ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "etp-ep-pp",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": "etp-ep-egtp-pp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": "edp（gloo）",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "distopt 实例",
}
"""The picture's short name for each ``group_desc`` (the full name is the box's hover title)."""


@contextlib.contextmanager
def create_group_calls():
    """Every ``parallel_state.create_group`` call made inside the block, as
    ``(group_desc, backend, members)``, in order; the real function still makes each group."""
    from megatron.core import parallel_state

    created, real = [], parallel_state.create_group

    def probe(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None):  # fmt: skip
        created.append((group_desc, backend or DEFAULT_BACKEND, list(ranks)))
        return real(ranks, timeout, backend, pg_options, use_local_synchronization, group_desc)

    parallel_state.create_group = probe
    try:
        yield created
    finally:
        parallel_state.create_group = real


def watch_init(tp: int, pp: int, gloo: bool = True) -> dict:
    """On every rank: the real ``initialize_model_parallel`` (``create_gloo_process_groups=gloo``)
    with its ``create_group`` calls, its collectives and the module globals it set."""
    from megatron.core import parallel_state

    from snippets.record import recorder

    before = dict(vars(parallel_state))
    with create_group_calls() as created, recorder.record() as collectives:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, create_gloo_process_groups=gloo
        )
    changed = sorted(
        k
        for k, v in vars(parallel_state).items()
        if k.startswith("_") and k[1:2].isupper() and before.get(k) is not v
    )
    return dict(created=created, collectives=collectives, changed=changed)


def creation_order(created: list) -> Table:
    """The calls merged by ``(group_desc, backend)``, in the order each kind was first made."""
    rows, index = [], {}
    for desc, backend, members in created:
        if (desc, backend) not in index:
            index[(desc, backend)] = len(rows)
            rows.append([len(rows) + 1, desc, backend, 0, []])
        row = rows[index[(desc, backend)]]
        row[3] += 1
        row[4].append(members)
    return Table(
        ["#", "group_desc", "backend", "建了几个", "成员"],
        [r[:4] + [" ".join(map(str, r[4]))] for r in rows],
    )


def _members(text: str) -> list[list[int]]:
    """``"[0, 1] [2, 3]"`` -> ``[[0, 1], [2, 3]]`` (the table's last column)."""
    return [[int(x) for x in part.split(",") if x.strip()] for part in text.strip("[]").split("] [")]


def draw_group_creation(rows: list[list], collectives: int, *, setting: str, per_column: int = 12) -> Figure:
    """Note 02: :func:`creation_order`'s rows as a picture, in creation order top to bottom, then the
    second column. Each box is one group made (its members inside), blue on the world's backend,
    orange on gloo; a faint box is a group of one rank, which never moves data. ``setting`` names the
    run (world and parallel sizes); the title adds the counts the rows and ``collectives`` give."""
    columns = (len(rows) + per_column - 1) // per_column
    name_w, box_w, box_gap, row_h = 118, 58, 4, 20
    most = max(row[3] for row in rows)
    col_w = 28 + name_w + most * (box_w + box_gap) + 24
    top = 62
    width = 10 + columns * col_w
    height = top + per_column * row_h + 10
    calls = sum(row[3] for row in rows)
    gloo = sum(row[3] for row in rows if row[2] == "gloo")
    title = (
        f"{setting}：每个 rank 按同一顺序调 {calls} 次 create_group，其中 {gloo} 次建 gloo 群；"
        f"全程 {collectives} 次 collective"
    )
    fig = Figure(
        width,
        height,
        title=title,
        desc=f"initialize_model_parallel 在每个 rank 上按同一顺序调用 {calls} 次 create_group，"
        f"其中 {gloo} 次建 gloo 群；期间记录到 {collectives} 次 collective。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    fig.legend(
        10,
        38,
        [("tp", "缺省 backend（GPU 上是 NCCL）"), ("pp", "gloo"), ("light", "只有一个 rank 的群")],
        size=11,
    )
    for i, (number, desc, backend, _count, members) in enumerate(rows):
        col, line = divmod(i, per_column)
        x0, y = 10 + col * col_w, top + line * row_h
        with fig.group(desc):
            fig.text(x0 + 20, y + (row_h - 4) / 2, number, size=11, anchor="end", kind="muted")
            fig.text(
                x0 + 28, y + (row_h - 4) / 2, SHORT.get(desc, desc.lower()), size=11, bold=backend == "gloo"
            )
            for j, ranks in enumerate(_members(members)):
                kind = "light" if len(ranks) == 1 else ("pp" if backend == "gloo" else "tp")
                x = x0 + 28 + name_w + j * (box_w + box_gap)
                label = ",".join(map(str, ranks))
                tip = f"{desc}（{backend}）：{ranks}"
                if len(ranks) == 1:
                    fig.rect(x, y, box_w, row_h - 4, "pp" if backend == "gloo" else "tp", faint=True, tip=tip)
                    fig.text(x + box_w / 2, y + (row_h - 4) / 2, label, size=11, anchor="middle")
                else:
                    fig.boxed(x, y, box_w, row_h - 4, label, kind, size=11, tip=tip)
    fig.check()
    return fig
