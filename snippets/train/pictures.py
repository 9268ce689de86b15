"""Pictures of one training step, drawn from what a run recorded (notes 01, 05, 06, 23).

* :func:`draw_journey_strip` (note 23): one weight's journey as one strip, a column per station
  of the journey table -- the full extent (the weight's rows, or the sequence's tokens) as a tall
  box, the part the rank holds filled, its local shape under it, and the collective that produced
  it with its recorded phase. Built from the rows :func:`snippets.train.journey_tables.journey_table`
  prints.
* :func:`draw_journey_summary` (note 23's main picture): the roadmap's six forms (replicated, TP
  shard, sequence shard, stage activation, DP gradient sync, optimizer shard, and the weight
  gathered back) picked from the same rows, then each rank's bytes from the memory table.
* :func:`draw_loss_division` (note 05): who divides the loss, and by what, from the note's table of
  recorded scalings.
* :func:`draw_grad_path` (note 06): a gradient's path, ``.grad`` → ``main_grad`` → bucket →
  optimizer, with the recorded sizes and collectives.
* :func:`draw_loop` (note 01): the training loop's steps in order, with what each one moves.
"""

from __future__ import annotations

import re

from snippets.record.draw import Figure

_RANGE = re.compile(r"(行|token|列) \[(\d+), (\d+)\)")
_SHORT_FORMS = [
    ("收到的 stage 激活", "收到的激活"),
    ("fc1 的输入拼成整段", "fc1 输入（整段）"),
    ("fc1 的输出", "fc1 输出"),
    ("fc2 输出切回序列分片", "fc2 输出（切回）"),
    ("fc2 输出", "fc2 输出"),
    ("main_grad", "main_grad"),
    ("Adam 状态分片", "Adam 状态"),
    ("更新后的 weight", "更新后 weight"),
    ("稠密 weight", "稠密 weight"),
    ("TP 分片", "TP 分片"),
]
_API = {
    "batch_isend_irecv": "p2p",
    "all_gather_into_tensor": "AG",
    "reduce_scatter_tensor": "RS",
    "all_reduce": "AR",
    "all_gather": "AG",
    "reduce_scatter": "RS",
}


def journey_stations(rows: list[list]) -> list[dict]:
    """The journey table's rows ``[station, form, range, local shape, comm, phase]`` as drawable
    stations: ``axis`` (行 = the weight's rows, token = the sequence), the held ``start``/``end`` on
    it, the ``cols`` when the form is tokens × columns, the producing collective in short
    (``AG · tp``) and the ``phase`` the recorder gave it (``None`` when no collective produced it)."""
    out = []
    for row in rows:
        station, form, where, shape, comm = row[:5]
        phase = row[5] if len(row) > 5 and row[5] != "-" else None
        ranges = _RANGE.findall(where)
        if not ranges:
            raise ValueError(f"station {station}: no range in {where!r}")
        axis, start, end = ranges[0][0], int(ranges[0][1]), int(ranges[0][2])
        cols = [(int(a), int(b)) for kind, a, b in ranges[1:] if kind == "列"]
        said = None
        if " · " in comm:
            api, group = comm.split(" · ")[:2]
            said = f"{_API.get(api, api)} · {group.split(' ')[0]}"
        short = next((s for prefix, s in _SHORT_FORMS if form.startswith(prefix)), form.split("（")[0])
        out.append(
            dict(
                station=station,
                form=form,
                short=short,
                axis=axis,
                start=start,
                end=end,
                cols=cols[0] if cols else None,
                shape=str(shape),
                comm=said,
                comm_text=comm,
                phase=phase if said else None,
            )
        )
    return out


def draw_journey_strip(rows: list[list], *, rank: int, title: str | None = None) -> Figure:
    """Note 23: the journey table (of rank ``rank``) as one strip, station by station."""
    stations = journey_stations(rows)
    extent = {
        "行": max(s["end"] for s in stations if s["axis"] == "行"),
        "token": max(s["end"] for s in stations if s["axis"] == "token"),
    }
    col_w, gap, left = 110, 8, 10
    box_top, box_h = 62, 120
    width = left + len(stations) * (col_w + gap) - gap + 10
    height = box_top + box_h + 88
    fig = Figure(
        width,
        height,
        title=title or f"一个 weight 的旅程，rank {rank} 在每一站持有什么",
        desc="从左到右是数据真实经过的顺序：高的方框是全长（weight 的行，或序列的 token），"
        "填色是本 rank 持有的那段，下面是本地 shape、产生这一形态的那次通信和记录到的阶段。",
    )
    fig.legend(left, 12, [("tp", "weight 的行"), ("fwd2", "激活的 token"), ("comm", "产生它的通信")], size=11)
    for i, s in enumerate(stations):
        x = left + i * (col_w + gap)
        n = extent[s["axis"]]
        kind = "tp" if s["axis"] == "行" else "fwd2"
        with fig.group(f"{s['station']} {s['short']}", tip=f"{s['station']} {s['form']}"):
            fig.text(x + col_w / 2, 34, f"{s['station']} {s['short']}", size=11, anchor="middle", bold=True)
            fig.text(x + col_w / 2, 50, f"{s['axis']} 0–{n}", size=11, anchor="middle", kind="muted")
            fig.rect(x + 20, box_top, col_w - 40, box_h, "grid", faint=True, outline="grid")
            y0 = box_top + box_h * s["start"] / n
            y1 = box_top + box_h * s["end"] / n
            fig.rect(
                x + 20, y0, col_w - 40, y1 - y0, kind, rx=0, tip=f"{s['axis']} [{s['start']}, {s['end']})"
            )
            label = f"[{s['start']}, {s['end']})"
            ink = "on" if kind == "tp" else "ink"
            fig.text(x + col_w / 2, (y0 + y1) / 2, label, size=11, anchor="middle", kind=ink)
            if s["cols"]:
                fig.text(
                    x + col_w / 2,
                    (y0 + y1) / 2 + 16,
                    f"列 [{s['cols'][0]}, {s['cols'][1]})",
                    size=11,
                    anchor="middle",
                    kind=ink,
                )
            fig.text(x + col_w / 2, box_top + box_h + 14, s["shape"], size=11, anchor="middle", mono=True)
            if s["comm"]:
                fig.boxed(
                    x + 8,
                    box_top + box_h + 30,
                    col_w - 16,
                    22,
                    s["comm"],
                    "comm",
                    size=11,
                    tip=f"{s['comm_text']}（{s['phase']}）" if s["phase"] else s["comm_text"],
                )
                if s["phase"]:
                    fig.text(
                        x + col_w / 2,
                        box_top + box_h + 66,
                        s["phase"],
                        size=11,
                        anchor="middle",
                        kind="muted",
                    )
            else:
                fig.text(x + col_w / 2, box_top + box_h + 41, "本地", size=11, anchor="middle", kind="muted")
        if i:
            fig.line(x - gap - 18, box_top + box_h / 2, x + 18, box_top + box_h / 2, "muted", arrow=True)
    fig.check()
    return fig


# The roadmap's chain of forms, each picked from the journey table by the start of its form:
# (prefix of the table's form, the form's name in the summary).
SUMMARY_FORMS = [
    ("稠密 weight", "复制"),
    ("TP 分片", "TP 分片"),
    ("fc2 输出", "序列分片"),
    ("收到的 stage 激活", "stage 激活"),
    ("main_grad", "DP 梯度同步"),
    ("Adam 状态分片", "优化器分片"),
    ("更新后的 weight", "拼回 weight"),
]
MEMORY_PARTS = [
    ("weights", "weight", "tp"),
    ("grads", "梯度", "dp"),
    ("adam_state", "Adam", "emb"),
    ("activations", "激活", "fwd2"),
]


def summary_stations(rows: list[list]) -> list[dict]:
    """The journey table's stations the summary draws, in the roadmap's order (a form missing from
    the table raises)."""
    stations = journey_stations(rows)
    out = []
    for prefix, name in SUMMARY_FORMS:
        found = [s for s in stations if s["form"].startswith(prefix)]
        if len(found) != 1:
            raise ValueError(f"the journey table has {len(found)} rows for {prefix!r}")
        out.append({**found[0], "short": name})
    return out


def memory_groups(memory_rows: list[list]) -> tuple[list[dict], dict | None]:
    """The memory table's rows (``[rank, stage, weights, grads, main_params, adam_state,
    activations, total, = 公式]``) as runs of ranks with the same bytes, plus the one-process
    reference row (``rank`` = 参照) if the table has it."""
    keys = ["weights", "grads", "main_params", "adam_state", "activations", "total"]
    groups, reference = [], None
    for row in memory_rows:
        entry = dict(zip(keys, (int(v) for v in row[2:8])), same=str(row[8]) == "True")
        if str(row[0]) == "参照":
            reference = entry
            continue
        rank, stage = int(row[0]), int(row[1])
        last = groups[-1] if groups else None
        if (
            last
            and last["stage"] == stage
            and all(last[k] == entry[k] for k in keys)
            and last["ranks"][-1] == rank - 1
        ):
            last["ranks"].append(rank)
        else:
            groups.append(dict(entry, ranks=[rank], stage=stage))
    return groups, reference


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2:
        return f"rank {ranks[0]}–{ranks[-1]}"
    return "rank " + ", ".join(map(str, ranks))


def draw_journey_summary(
    rows: list[list], memory_rows: list[list], *, rank: int, title: str | None = None
) -> Figure:
    """Note 23's main picture: the roadmap's forms of one weight (from the journey table of rank
    ``rank``), then the bytes every rank holds (from the memory table)."""
    stations = summary_stations(rows)
    groups, reference = memory_groups(memory_rows)
    extent = {axis: max(s["end"] for s in stations if s["axis"] == axis) for axis in ("行", "token")}
    held = {s["short"]: s["end"] - s["start"] for s in stations}
    totals = [g["total"] for g in groups]
    title = title or (
        f"rank {rank} 的一步：weight 留 {held['TP 分片']} 行，激活留 {held['序列分片']} 个 token，"
        f"梯度和 Adam 状态只剩 {held['优化器分片']} 行；每个 rank {min(totals)}–{max(totals)} B"
    )
    col_w, gap, left = 96, 8, 10
    box_top, box_h = 86, 96
    panel_x = left + len(stations) * (col_w + gap) - gap + 22
    panel_w = 296
    width = panel_x + panel_w + 10
    height = box_top + box_h + 74
    fig = Figure(
        width,
        height,
        title=title,
        desc="左边七列按 roadmap 的顺序画跟踪的 weight、它的激活和梯度在一个 rank 上的形态：高的方框是全长，"
        "填色是这个 rank 持有的那段，下面是本地 shape、产生它的通信和记录到的阶段；右边是每个 rank 这一步占的字节。",
    )
    fig.text(left, 14, title, size=13, bold=True)
    fig.legend(left, 38, [("tp", "weight 的行"), ("fwd2", "激活的 token"), ("comm", "产生它的通信")], size=11)
    for i, s in enumerate(stations):
        x = left + i * (col_w + gap)
        n = extent[s["axis"]]
        kind = "tp" if s["axis"] == "行" else "fwd2"
        with fig.group(f"{s['station']} {s['short']}", tip=f"{s['station']} {s['form']}"):
            fig.text(x + col_w / 2, 60, f"{s['station']} {s['short']}", size=11, anchor="middle", bold=True)
            fig.text(x + col_w / 2, 75, f"{s['axis']} 0–{n}", size=11, anchor="middle", kind="muted")
            fig.rect(x + 22, box_top, col_w - 44, box_h, "grid", faint=True, outline="grid")
            y0, y1 = box_top + box_h * s["start"] / n, box_top + box_h * s["end"] / n
            fig.rect(
                x + 22, y0, col_w - 44, y1 - y0, kind, rx=0, tip=f"{s['axis']} [{s['start']}, {s['end']})"
            )
            fig.text(
                x + col_w / 2,
                (y0 + y1) / 2,
                f"[{s['start']}, {s['end']})",
                size=11,
                anchor="middle",
                kind="on" if kind == "tp" else "ink",
            )
            fig.text(x + col_w / 2, box_top + box_h + 13, s["shape"], size=11, anchor="middle", mono=True)
            if s["comm"]:
                fig.boxed(
                    x + 6,
                    box_top + box_h + 26,
                    col_w - 12,
                    20,
                    s["comm"],
                    "comm",
                    size=11,
                    tip=s["comm_text"],
                )
                if s["phase"]:
                    fig.text(
                        x + col_w / 2,
                        box_top + box_h + 60,
                        s["phase"],
                        size=11,
                        anchor="middle",
                        kind="muted",
                    )
            else:
                fig.text(x + col_w / 2, box_top + box_h + 36, "本地", size=11, anchor="middle", kind="muted")
        if i:
            fig.line(x - gap - 2, box_top + box_h / 2, x + 20, box_top + box_h / 2, "muted", arrow=True)
    # the bytes, rank by rank
    all_same = all(g["same"] for g in groups) and (reference is None or reference["same"])
    fig.line(panel_x - 12, 52, panel_x - 12, height - 8, "grid")
    fig.text(
        panel_x, 60, "每个 rank 这一步的字节" + ("（实测 = 公式）" if all_same else ""), size=11, bold=True
    )
    fig.legend(panel_x, 80, [(kind, name) for _, name, kind in MEMORY_PARTS], size=11, gap=16)
    label_w, bar_w = 66, 168
    biggest = max(totals)
    for j, g in enumerate(groups):
        y = 104 + j * 30
        name = _ranks_text(g["ranks"])
        with fig.group(name, tip=f"{name}（stage {g['stage']}）：共 {g['total']} B"):
            fig.text(panel_x, y + 9, name, size=11)
            x = panel_x + label_w
            for key, part, kind in MEMORY_PARTS:
                w = bar_w * g[key] / biggest
                if w > 0:
                    fig.rect(x, y, w, 18, kind, rx=0, tip=f"{name} {part} {g[key]} B")
                x += w
            fig.text(x + 6, y + 9, f"{g['total']} B", size=11, mono=True)
    if reference is not None:
        y = 104 + len(groups) * 30 + 6
        fig.text(panel_x, y, f"不切分（1 个进程）：{reference['total']} B", size=11, kind="muted")
    fig.check()
    return fig


def loss_division_lanes(rows: list[list], tokens: list[int]) -> list[dict]:
    """Note 05's "who divides" table (``[loss_func, logged lm loss, grad = mean of means, grad =
    global token mean]``) as lanes: what ``loss_func`` returns, what the schedule divides it by,
    what ``finalize_model_grads`` divides by, which objective the gradient is, what gets logged."""
    n, total = len(tokens), sum(tokens)
    each = " / ".join(str(t) for t in tokens)
    lanes = []
    for label, report, mean_of_means, global_mean in rows:
        three = label.startswith("3 个值")
        per_token = "calculate_per_token_loss" in label
        returns = f"token loss 之和（{each} 个）" if three else "本 micro-batch 的平均"
        if per_token:
            schedule, finalize = "不除", f"梯度 ÷ 全局 token 数 {total}"
        elif three:
            schedule, finalize = f"÷ token 数（{each}），再 ÷ {n}", "不除"
        else:
            schedule, finalize = f"原地 ÷ {n}（micro-batch 数）", "不除"
        target = (
            "全局 token 平均"
            if global_mean and not mean_of_means
            else ("micro-batch 平均的平均" if mean_of_means and not global_mean else "两者相同")
        )
        shared = not three and ("clone" not in label)
        lanes.append(
            dict(
                label=label,
                returns=returns,
                schedule=schedule,
                finalize=finalize,
                target=target,
                report=report,
                report_divided=shared,
            )
        )
    return lanes


def draw_loss_division(rows: list[list], tokens: list[int]) -> Figure:
    """Note 05: who divides the loss, and by what, for each ``loss_func`` the note ran."""
    lanes = loss_division_lanes(rows, tokens)
    cols = [
        ("loss_func 返回", 210, "returns"),
        ("schedule（forward_step 之后）", 240, "schedule"),
        ("finalize_model_grads", 180, "finalize"),
        ("梯度优化的是", 170, "target"),
        ("日志 lm loss", 150, "report"),
    ]
    gap, lane_h, top = 22, 56, 66
    width = 10 + sum(w for _, w, _ in cols) + gap * (len(cols) - 1) + 10
    height = top + lane_h * len(lanes) + 6
    default = lanes[0]
    per_token = next((lane for lane in lanes if "calculate_per_token_loss" in lane["label"]), default)
    title = (
        f"缺省（{default['label'].split('（')[0]}）梯度优化{default['target']}、日志记全局 token 平均；"
        f"只有 calculate_per_token_loss 让梯度也是{per_token['target']}"
    )
    fig = Figure(
        width,
        height,
        title=title,
        desc=f"两个 micro-batch 各保留 {' 和 '.join(map(str, tokens))} 个 token；每一行从左到右是 loss 经过的除法，"
        "最后两格是梯度真正优化的目标和 train_step 记下的值。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    x = 10
    for name, w, _ in cols:
        fig.text(x + w / 2, 38, name, size=11, anchor="middle", bold=True)
        x += w + gap
    for i, lane in enumerate(lanes):
        y = top + lane_h * i
        fig.text(10, y, lane["label"], size=11, kind="muted")
        x = 10
        with fig.group(lane["label"]):
            for j, (_, w, key) in enumerate(cols):
                value = lane[key]
                if key == "report":
                    kind = "accent" if lane["report_divided"] else "mem"
                    text = f"{value:.4f}" + ("（也被除了）" if lane["report_divided"] else "")
                elif key == "target":
                    kind = "dp" if value == "全局 token 平均" else "pp"
                    text = value
                else:
                    kind = "light" if value == "不除" else "comm"
                    text = value
                fig.boxed(x, y + 12, w, 28, text, kind, size=11)
                if j:
                    fig.line(x - gap + 2, y + 26, x - 2, y + 26, "muted", arrow=True)
                x += w + gap
    fig.check()
    return fig


def grad_path_steps(result: dict) -> list[dict]:
    """Note 06's one step (rank 0's ``train_step`` result) as the stations a gradient passes:
    each with what the run checked there and the collectives recorded there."""

    def calls(records):
        return [f"{_API.get(c.api, c.api)} · {c.group} {list(c.ranks)} · {c.before}" for c in records]

    return [
        dict(name="autograd：param.grad", facts=["backward 算出每个参数的梯度"], calls=[]),
        dict(
            name="DDP hook → main_grad",
            facts=[
                "hook 把 grad 加进 main_grad",
                f"之后 param.grad is None: {result['grad_none_before_step']}",
            ],
            calls=[],
        ),
        dict(
            name="grad buffer（bucket）",
            facts=[f"main_grad 在 buffer 里: {result['main_grad_in_buffer']}", "finalize：×1/DP 再求和"],
            calls=calls(result["finalize"]),
        ),
        dict(
            name="optimizer.step()",
            facts=[
                f"param.grad 即 main_grad: {result['grad_is_main_grad_after_step']}",
                f"grad norm {round(result['grad_norm'], 4)}，Adam 更新",
            ],
            calls=calls(result["step"]),
        ),
    ]


def draw_grad_path(result: dict) -> Figure:
    """Note 06: grad → main_grad → bucket → optimizer, with what rank 0's run recorded at each."""
    steps = grad_path_steps(result)
    box_w, gap, top = 240, 32, 54
    width = 10 + len(steps) * (box_w + gap) - gap + 10
    most = max(len(s["facts"]) + len(s["calls"]) for s in steps)
    height = top + 36 + 10 + most * 26 + 10
    sync = result["finalize"][0] if result["finalize"] else None
    title = (
        "梯度住在 main_grad（grad buffer 的视图）："
        + (f"finalize 里 ×1/DP、{sync.group} 群 all-reduce 一次 {sync.before}，" if sync else "")
        + "step() 把它当 .grad 用"
    )
    fig = Figure(
        width,
        height,
        title=title,
        desc="autograd 的 .grad 被 DDP 的 hook 加进 main_grad（grad buffer 的一段视图），buffer 在 "
        "finalize_model_grads 里跨 DP 求和，optimizer.step() 把 main_grad 当作 .grad 来更新参数。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    fig.legend(10, 36, [("fwd2", "梯度所在的地方"), ("comm", "录到的 collective")], size=11)
    for i, step in enumerate(steps):
        x = 10 + i * (box_w + gap)
        with fig.group(step["name"]):
            fig.boxed(x, top, box_w, 36, step["name"], "fwd2", bold=True)
            y = top + 36 + 10
            for fact in step["facts"]:
                fig.text(x + 4, y + 9, fact, size=11)
                y += 26
            for call in step["calls"]:
                fig.boxed(x, y, box_w, 20, call, "comm", size=11)
                y += 26
        if i:
            fig.line(x - gap + 2, top + 18, x - 2, top + 18, "muted", arrow=True)
    fig.check()
    return fig


def draw_loop_runs(published: list[list], fixed: list[list]) -> Figure:
    """Note 01: the simple loop as published vs with Megatron's optimizer, step by step -- two
    panels of bars from the two ``log_table`` rows (``[iteration, lm loss, max weight change,
    ‖main_grad‖, grad all None]``): ``main_grad`` piles up and the weights never move in the first,
    both behave in the second."""
    panels = [("‖main_grad‖（每步开始前没清零就会越堆越大）", 3), ("权重相对初值的最大变化", 2)]
    runs = [
        ("原样（torch.optim.Adam）", published, "accent"),
        ("改后（get_megatron_optimizer）", fixed, "dp"),
    ]
    panel_w, gap, top, plot_h = 500, 40, 78, 150
    width = 10 + 2 * panel_w + gap + 10
    height = top + plot_h + 30
    title = (
        f"原样的 simple loop 跑 {len(published)} 步，权重一步不动、main_grad 越堆越大；"
        "换 get_megatron_optimizer 并每步 zero_grad_buffer() 后，权重每步移动约 lr"
    )
    fig = Figure(
        width,
        height,
        title=title,
        desc="原样运行时 main_grad 的范数每步线性增长、权重一步也没动；换成 get_megatron_optimizer 并每步 "
        "zero_grad_buffer 之后，范数每步重新累积、权重每步移动约 lr。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    fig.legend(10, 36, [(kind, name) for name, _, kind in runs], size=11)
    n = len(published)
    for p, (name, col) in enumerate(panels):
        x0 = 10 + p * (panel_w + gap)
        fig.text(x0, 58, name, size=11, bold=True)
        biggest = max(row[col] for rows in (published, fixed) for row in rows) or 1
        slot = (panel_w - 20) / n
        bar = (slot - 16) / 2
        base = top + plot_h
        fig.line(x0, base, x0 + panel_w, base, "grid")
        with fig.group(name):
            for i in range(n):
                for j, (run, rows, kind) in enumerate(runs):
                    value = rows[i][col]
                    h = max(plot_h * value / biggest, 1)
                    x = x0 + 10 + i * slot + 8 + j * bar
                    fig.rect(x, base - h, bar - 2, h, kind, rx=1, tip=f"{run} 第 {rows[i][0]} 步：{value}")
                    fig.text(
                        x + bar / 2 - 1,
                        base - h - 9 if h < plot_h - 12 else base - h + 9,
                        f"{value:.3g}",
                        size=11,
                        anchor="middle",
                        kind="ink" if h < plot_h - 12 else "on",
                    )
                fig.text(
                    x0 + 10 + i * slot + slot / 2,
                    base + 14,
                    f"第 {published[i][0]} 步",
                    size=11,
                    anchor="middle",
                    kind="muted",
                )
    fig.check()
    return fig
