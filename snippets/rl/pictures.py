"""Pictures of a refit, drawn from what a run recorded (note 22).

* :func:`draw_traffic_matrix`: the resharding plan's bytes as a rank-pair matrix, rows = the
  trainer rank that sends (with its TP x PP coordinates), columns = the rollout rank that receives;
  a cell's shade grows with its bytes, the diagonal (a copy that never leaves the process) is
  outlined. Built from :func:`snippets.rl.refit_cost.plan_traffic`, the same matrix the note prints.
* :func:`draw_qkv_layout`: ``linear_qkv``'s rows as Megatron stores them, interleaved per query group
  (``q0 q1 k0 v0 | q2 q3 k1 v1 | ...``) with the rows each TP rank keeps, above Hugging Face's
  separate ``q_proj``, ``k_proj``, ``v_proj``, with a line from each block to where it goes.
  Built from :func:`snippets.rl.qkv_layout.fused_row_labels`, the labels the note's table prints.
"""

from __future__ import annotations

from snippets.record.draw import Figure, text_width


def _shade(value: int, biggest: int) -> str:
    """A light-to-dark step (5 steps) for a cell's bytes; 0 stays blank."""
    if value == 0:
        return ""
    return ["light", "fwd2", "tp", "tp", "tp"][min(4, int(4 * value / biggest))]


def draw_traffic_matrix(
    matrix: list[list[int]], senders: list[str], receivers: list[str], *, title: str, desc: str
) -> Figure:
    """``matrix[s][d]`` bytes from trainer rank ``s`` (named ``senders[s]``) to rollout rank ``d``."""
    n_src, n_dst = len(matrix), len(matrix[0])
    cell_w, cell_h = 92, 40
    left = max(text_width(s, 12) for s in senders) + 24
    top = 78
    width = left + cell_w * (n_dst + 1) + 20
    height = top + cell_h * (n_src + 1) + 44
    fig = Figure(width, height, title=title, desc=desc)
    fig.text(left + cell_w * n_dst / 2, 14, "接收：rollout rank", anchor="middle", bold=True)
    fig.text(10, top - 14, "发送：训练 rank", bold=True)
    biggest = max(max(row) for row in matrix)
    for d, name in enumerate(receivers):
        fig.text(left + cell_w * d + cell_w / 2, top - 30, name, anchor="middle")
    fig.text(left + cell_w * n_dst + cell_w / 2, top - 30, "发出合计", anchor="middle", kind="muted")
    for s, row in enumerate(matrix):
        y = top + cell_h * s
        fig.text(left - 10, y + cell_h / 2, senders[s], anchor="end")
        with fig.group(senders[s]):
            for d, value in enumerate(row):
                x = left + cell_w * d
                kind = _shade(value, biggest)
                tip = f"{senders[s]} → {receivers[d]}：{value} 字节" + ("（本地拷贝）" if s == d else "")
                if kind:
                    fig.rect(
                        x + 2,
                        y + 2,
                        cell_w - 4,
                        cell_h - 4,
                        kind,
                        rx=2,
                        outline="accent" if s == d else None,
                        tip=tip,
                    )
                else:
                    fig.rect(x + 2, y + 2, cell_w - 4, cell_h - 4, "grid", rx=2, faint=True, tip=tip)
                ink = "on" if kind == "tp" else "ink"
                fig.text(
                    x + cell_w / 2, y + cell_h / 2, str(value) if value else "·", anchor="middle", kind=ink
                )
        fig.text(
            left + cell_w * n_dst + cell_w / 2, y + cell_h / 2, str(sum(row)), anchor="middle", kind="muted"
        )
    y = top + cell_h * n_src
    fig.text(left - 10, y + cell_h / 2, "收到合计", anchor="end", kind="muted")
    for d in range(n_dst):
        fig.text(
            left + cell_w * d + cell_w / 2,
            y + cell_h / 2,
            str(sum(matrix[s][d] for s in range(n_src))),
            anchor="middle",
            kind="muted",
        )
    fig.rect(10, height - 26, 14, 14, "light", outline="accent", rx=2)
    fig.text(30, height - 19, "对角线（红框）= 不出进程的本地拷贝；颜色越深字节越多", size=11, kind="muted")
    fig.check()
    return fig


_KIND = {"q": "tp", "k": "pp", "v": "dp"}


def draw_qkv_layout(labels: list[str], num_query_groups: int, tp_sizes: tuple[int, ...] = (2, 4)) -> Figure:
    """``labels``: ``linear_qkv``'s row blocks in Megatron's order (``fused_row_labels``)."""
    n = len(labels)
    block_w, block_h = 46, 30
    left = 150
    width = left + block_w * n + 20
    rows_y = {"fused": 40, "tp0": 40 + block_h + 8}
    tp_y = [rows_y["tp0"] + i * 26 for i in range(len(tp_sizes))]
    hf_y = tp_y[-1] + 26 + 90
    height = hf_y + block_h + 50
    fig = Figure(
        width,
        height,
        title="linear_qkv 的行：按 query group 交错（Megatron） vs 分开的 Q、K、V（HF）",
        desc=f"{n} 个行块（每块 head_dim 行）、{num_query_groups} 个 query group：Megatron 每个 group "
        "连续存它的 q、k、v，TP 按行切正好切在 group 之间；HF 把全部 q、全部 k、全部 v 分开存，"
        "转换时要按 group 拆开重排。",
    )
    fig.legend(10, 14, [("tp", "query head"), ("pp", "key head"), ("dp", "value head")])
    per_group = n // num_query_groups
    # Megatron's fused rows
    fig.text(10, rows_y["fused"] + block_h / 2, "linear_qkv", bold=True, mono=True)
    with fig.group("megatron"):
        for i, label in enumerate(labels):
            fig.boxed(
                left + block_w * i,
                rows_y["fused"],
                block_w - 2,
                block_h,
                label,
                _KIND[label[0]],
                tip=f"第 {i} 个行块：{label}（query group {i // per_group}）",
            )
    for g in range(1, num_query_groups):
        x = left + block_w * g * per_group - 1
        fig.line(x, rows_y["fused"] - 4, x, rows_y["fused"] + block_h + 4, "ink", width=2)
    # which rows each TP rank keeps
    for tp, y in zip(tp_sizes, tp_y):
        fig.text(10, y + 9, f"TP{tp} 的 rank", size=11)
        per_rank = n // tp
        with fig.group(f"TP{tp}"):
            for r in range(tp):
                x0 = left + block_w * per_rank * r
                fig.boxed(x0 + 1, y, block_w * per_rank - 4, 18, f"rank {r}", "muted", size=11)
    # HF's separate q_proj, k_proj, v_proj
    q = [lab for lab in labels if lab[0] == "q"]
    k = [lab for lab in labels if lab[0] == "k"]
    v = [lab for lab in labels if lab[0] == "v"]
    hf_order = q + k + v
    fig.text(10, hf_y + block_h / 2, "HF q | k | v", bold=True, mono=True)
    pos = {}
    with fig.group("hf"):
        for i, label in enumerate(hf_order):
            x = left + block_w * i
            pos[label] = x
            fig.boxed(x, hf_y, block_w - 2, block_h, label, _KIND[label[0]], tip=f"{label} → 第 {i} 个行块")
    for name, members, x0 in (("q_proj", q, 0), ("k_proj", k, len(q)), ("v_proj", v, len(q) + len(k))):
        fig.text(
            left + block_w * (x0 + len(members) / 2) - 1,
            hf_y + block_h + 14,
            name,
            size=11,
            anchor="middle",
            mono=True,
        )
    # where each block goes
    for i, label in enumerate(labels):
        x1 = left + block_w * i + block_w / 2 - 1
        x2 = pos[label] + block_w / 2 - 1
        fig.line(x1, tp_y[-1] + 22, x2, hf_y - 4, _KIND[label[0]], arrow=True)
    fig.check()
    return fig
