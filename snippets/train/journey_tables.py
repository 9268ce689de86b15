"""Note 23's tables, printed from every rank's summary (:func:`snippets.experiments.n23_journey.compare`).

Each function takes the list of all ranks' summaries and returns one :class:`~snippets.record.tables.Table`
(or a few lines): which rank holds the followed weight's rows, the slice each TP rank keeps, the
activations and their SP collectives, the p2p hand-offs, the gradient before and after the DP
reduce-scatter, the optimizer shard, the journey as one table, and the memory per rank.
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table


def coords(s) -> str:
    c = s["who"]["coords"]
    return f"({c['tp']}, {c['dp']}, {c['pp']})"


def holders(summaries) -> list[int]:
    return [i for i, s in enumerate(summaries) if s["holds"]]


def rank_table(summaries) -> Table:
    return Table(
        ["rank", "(tp, dp, pp)", "tp 群", "dp 群", "pp 群", "层", "持有 WEIGHT"],
        [
            [
                i,
                coords(s),
                s["who"]["groups"]["tp"],
                s["who"]["groups"]["dp"],
                s["who"]["groups"]["pp"],
                s["layers"],
                s["holds"],
            ]
            for i, s in enumerate(summaries)
        ],
    )


def loss_lines(summaries) -> str:
    """The reference's losses and the last stage's (TP rank 0, every DP rank, in order)."""
    last = [s for s in summaries if s["holds"] and s["who"]["coords"]["tp"] == 0]
    mine = [x for s in sorted(last, key=lambda s: s["who"]["coords"]["dp"]) for x in s["losses"]]
    ref = summaries[0]["ref_losses"]
    same = torch.allclose(torch.tensor(mine), torch.tensor(ref), atol=1e-5)
    return (
        f"loss 参照: {[round(x, 4) for x in ref]}\n"
        f"loss {len(summaries)} rank: {[round(x, 4) for x in mine]}  allclose: {same}"
    )


def slice_table(summaries) -> Table:
    rows = []
    for i, s in enumerate(summaries):
        if not s["holds"]:
            rows.append([i, coords(s), "-", "-", "-", "-", "不在本 stage"])
            continue
        rows.append(
            [
                i,
                coords(s),
                s["dense_shape"],
                s["dense_equal"],
                s["local_shape"],
                f"dim {s['dim']}: 行 {s['cols']}",
                s["local_is_slice"],
            ]
        )
    return Table(
        [
            "rank",
            "(tp, dp, pp)",
            "本 rank 造的 master",
            "= 参照的 weight",
            "本地 shape",
            "全局范围",
            "本地 = master[范围]",
        ],
        rows,
    )


def activation_table(summaries) -> list:
    """The DP-rank-0 holders' first micro-batch, place by place; the other DP ranks' in one line."""
    first = [i for i in holders(summaries) if summaries[i]["who"]["coords"]["dp"] == 0]
    others = [i for i in holders(summaries) if i not in first]
    out = []
    if others:
        batches = "、".join(str(g) for g in dict.fromkeys(summaries[i]["first_microbatch"] for i in others))
        same = all(row[-1] for i in others for row in summaries[i]["activations"])
        out.append(f"rank {'、'.join(map(str, others))}（micro-batch {batches}）也全部相等: {same}")
    out.append(
        Table(
            ["rank", "位置", "本地 shape", "全局范围（[s, b, ·] 里）", "= 参照的那一段"],
            [[i, *row] for i in first for row in summaries[i]["activations"]],
        )
    )
    return out


SP_MEANING = {
    (
        "all_gather_into_tensor",
        "tensor_parallel/layers.py::forward",
    ): "SP：把序列分片拼回整段，再乘本地 weight",
    (
        "reduce_scatter_tensor",
        "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim",
    ): "SP 的 g：部分和相加，按序列切回各 TP rank",
    (
        "all_gather_into_tensor",
        "tensor_parallel/layers.py::backward",
    ): "backward 再拼一次输入，用来算 weight 梯度",
    ("reduce_scatter_tensor", "tensor_parallel/layers.py::backward"): "输入梯度：部分和相加，按序列切回",
    (
        "all_gather_into_tensor",
        "tensor_parallel/mappings.py::_gather_along_first_dim",
    ): "g 的反向：输出梯度的序列分片拼回整段",
}


def sp_calls_table(summaries) -> Table:
    """The followed layer's MLP collectives on the first holder (its last micro-batch)."""
    from snippets.tp import layer_walk

    by_module = summaries[holders(summaries)[0]]["by_module"]
    calls = [
        c
        for name in ("mlp.linear_fc1", "mlp.linear_fc2")
        for phase in ("forward", "backward")
        for c in by_module[name][phase]
    ]
    return layer_walk.record_table(calls, SP_MEANING, layer_walk.owner_of(by_module))


def p2p_table(summaries) -> Table | None:
    """Every p2p call of the first holder's pipeline group, stage by stage (``None`` at PP = 1)."""
    from snippets.pp.timeline import p2p_rows

    group = summaries[holders(summaries)[0]]["who"]["groups"]["pp"]
    rows = [row for i in group for row in p2p_rows(summaries[i]["ops"], i)]
    return (
        Table(
            [
                "rank",
                "在这步之后",
                "P2PCommunicator 方法",
                "API",
                "group",
                "ops（→发给、←收自）",
                "shape 前 = 后",
                "语义",
            ],
            rows,
        )
        if rows
        else None
    )


def grad_table(summaries) -> Table:
    def row(i):
        s = summaries[i]
        owned = f"[{s['shard']['param'][0]}, {s['shard']['param'][1]})" if s["shard"] else "-"
        start, end = s["buffer_range"]
        return [
            i,
            s["who"]["groups"]["dp"],
            f"[{start}, {end}) / {s['buffer_numel']}",
            s["local_shape"],
            s["mean_equal"],
            owned,
            s["owned_equal"] if s["shard"] else "-",
        ]

    dp = len(summaries[holders(summaries)[0]]["who"]["groups"]["dp"])
    return Table(
        [
            "rank",
            "dp 群",
            "在 buffer 里 / buffer 长度",
            "main_grad shape",
            f"{'两个' if dp == 2 else f'{dp} 个'} DP rank 的本地梯度平均 = 参照",
            "本 rank 拥有（展平后）",
            "同步后拥有的那段 = 参照",
        ],
        [row(i) for i in holders(summaries)],
    )


GRAD_MEANING = {
    "reduce_scatter_tensor": "梯度：bucket 先乘 1/(dp-cp 群的大小)，在 dp-cp 群求和，每个 rank 只留自己那段",
    "distributed/finalize_model_grads.py::_allreduce_non_tensor_model_parallel_grads": (
        "SP：各 norm 的 weight / bias 梯度只含本 rank 那段序列的贡献，在 TP 群里相加"
    ),
}


def grad_calls_table(summaries) -> Table:
    from snippets.record.recorder import communication_table

    return communication_table(summaries[holders(summaries)[0]]["grad_calls"], GRAD_MEANING)


def shard_table(summaries) -> Table:
    def row(i):
        s = summaries[i]
        sh = s["shard"]
        return [
            i,
            coords(s),
            f"[{sh['param'][0]}, {sh['param'][1]})",
            f"[{sh['gbuf_world'][0]}, {sh['gbuf_world'][1]})",
            s["owned"],
            sh["shapes"]["param"],
            sh["shapes"]["exp_avg"],
            sh["shapes"]["exp_avg_sq"],
            sh["main_is_view"],
        ]

    return Table(
        [
            "rank",
            "(tp, dp, pp)",
            "param 区间（本地展平）",
            "gbuf_world",
            "稠密 weight 的",
            "主参数 shape",
            "exp_avg",
            "exp_avg_sq",
            "主参数是 weight 的视图",
        ],
        [row(i) for i in holders(summaries) if summaries[i]["shard"]],
    )


OPT_MEANING = {
    "optimizer/clip_grads.py::get_grad_norm_fp32": "梯度范数：每个 rank 只有自己那段的平方和，在全部 rank 上相加",
    "all_gather_into_tensor": "weight：各 DP rank 更新过的那段拼回完整 buffer",
}


def opt_calls_table(summaries) -> list:
    from snippets.record.recorder import communication_table

    s = summaries[holders(summaries)[0]]
    return [
        f"get_grad_stats_parallel_group() 的成员: {s['grad_stats_group']}  dp 群: {s['who']['groups']['dp']}",
        communication_table(s["opt_calls"], OPT_MEANING, ranks=False),
    ]


def final_lines(summaries) -> str:
    """The updated slices against the reference's step, the DP replicas bit for bit."""
    held = [summaries[i] for i in holders(summaries)]
    replicas = {}
    for s in held:
        replicas.setdefault(s["who"]["coords"]["tp"], []).append(s["digest"])
    return (
        f"拼回的 {held[0]['dense_shape']} 与参照 allclose(atol=1e-6): {all(s['updated_close'] for s in held)}"
        f"  max|Δ| < 1e-6: {all(s['updated_diff_small'] for s in held)}\n"
        f"DP 副本逐位相同: {' '.join(str(len(set(d)) == 1) for _, d in sorted(replicas.items()))}\n"
        f"这一步改变了 weight: {any(s['changed'] for s in held)}"
    )


def _said(c, otherwise: str) -> str:
    return f"{c.api} · {c.group} {list(c.ranks)} · {c.before} → {c.after}" if c is not None else otherwise


def _phase(c) -> str:
    """The phase the recorder gave the collective (``recorder.phase_of`` when it was issued)."""
    return c.phase if c is not None else "-"


def journey_table(summaries) -> Table:
    """The five stations in one table, on the first holder; the last column is the phase the
    recorder gave the producing collective (``-`` where none produced it)."""
    i = holders(summaries)[0]
    s = summaries[i]
    sh = s["shard"]
    rows = [
        [
            "①",
            "稠密 weight（每个持有者各造一份）",
            f"行 [0, {s['dense_shape'][0]})",
            s["dense_shape"],
            "无",
            None,
        ],
        ["①", "TP 分片", f"行 {s['cols']}", s["local_shape"], "无（本地切）", None],
        [
            "③",
            f"收到的 stage 激活 = 第 {s['number']} 层输入",
            s["tokens"],
            s["layer_in_shape"],
            _said(s["recv"], "无（PP=1：同一个 stage）"),
            s["recv"],
        ],
        [
            "②",
            "fc1 的输入拼成整段",
            f"token [0, {s['seq']})",
            s["gather"].after if s["gather"] else s["fc1_in_shape"],
            _said(s["gather"], "无（没有 SP）"),
            s["gather"],
        ],
        [
            "②",
            "fc1 的输出",
            f"token [0, {s['seq']}) × 列 {s['cols']}",
            s["fc1_out_shape"],
            "无（本地矩阵乘）",
            None,
        ],
        [
            "②",
            "fc2 输出切回序列分片" if s["sequence_parallel"] else "fc2 输出（部分和相加）",
            s["tokens"],
            s["fc2_out_shape"],
            _said(s["fc2_call"], "无（TP=1）"),
            s["fc2_call"],
        ],
        [
            "④",
            "main_grad（同步后只有拥有的那段有效）",
            s["owned"],
            s["local_shape"],
            _said(s["sync"], "无"),
            s["sync"],
        ],
        ["⑤", "Adam 状态分片", s["owned"], sh["shapes"]["exp_avg"] if sh else "-", "无", None],
        [
            "⑤",
            "更新后的 weight",
            f"行 {s['cols']}",
            s["local_shape"],
            _said(s["regather"], "无"),
            s["regather"],
        ],
    ]
    return Table(
        ["站", "形态", f"rank {i} 持有的全局范围", "本地 shape", f"产生它的通信（rank {i}）", "phase"],
        [[*row[:5], _phase(row[5])] for row in rows],
    )


MEMORY_COLUMNS = ["weights", "grads", "main_params", "adam_state", "activations", "total"]


def memory_table(summaries, reference=None) -> Table:
    """Bytes per rank, measured, and whether they equal the formula (``-``: no formula at these
    sizes); ``reference``: a ``(memory, formula)`` row for the one-process run."""

    def same(memory, formula):
        return "-" if formula is None else memory == formula

    rows = [
        [
            i,
            s["who"]["coords"]["pp"],
            *[s["memory"][c] for c in MEMORY_COLUMNS],
            same(s["memory"], s["formula"]),
        ]
        for i, s in enumerate(summaries)
    ]
    if reference is not None:
        rows.append(["参照", "-", *[reference[0][c] for c in MEMORY_COLUMNS], same(*reference)])
    return Table(["rank", "stage", *[f"{c} B" for c in MEMORY_COLUMNS], "= 公式"], rows)
