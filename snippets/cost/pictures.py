"""Note 26's pictures, drawn from the rows its tables print (:mod:`snippets.experiments.n26_cost`)."""

from __future__ import annotations

from snippets.record.draw import Figure


def draw_choice(
    cands: list[dict], chosen: dict | None, budget: float, *, title: str, width: int = 1000
) -> Figure:
    """One row per candidate config: memory per GPU as a bar in GiB (weights + optimizer, then
    activations; a dashed line at ``budget``), then NVLink / IB time, bubble and nominal step; the
    chosen row outlined. A row whose activations have no formula shows its weights and "激活未知"
    (unknown, never "fits"). ``cands`` are :func:`snippets.experiments.n26_cost.candidate` results."""
    from snippets.experiments.n26_cost import label, link_ms

    gib = 2**30
    row, top, left, bar_w = 28, 44, 130, 340
    scale = max(max((c["memory"] or c["weights"].value or 0) for c in cands), budget) * 1.02
    height = top + row * len(cands) + 12
    fig = Figure(
        width,
        height,
        title=title,
        desc="每行一个候选配置：左边是每张 GPU 的显存（权重+优化器、激活，GiB），虚线是显存上限；"
        "右边是每步 NVLink / IB 通信时间、气泡和名义步长；框出的是选中的配置。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    x_end = fig.legend(left, 32, [("dp", "权重+优化器"), ("fwd", "激活")], size=11)
    fig.text(x_end + 4, 32, f"虚线 = {budget / gib:.0f} GiB（80 GiB 留 10%）", size=11, kind="muted")
    info_x = left + bar_w + 76
    for i, c in enumerate(cands):
        picked = c is chosen
        y = top + row * i + 6
        if picked:
            fig.rect(4, y - 4, width - 8, row - 2, "accent", faint=True)
        fig.text(10, y + 9, label(c), size=12, bold=picked, mono=True)
        w = c["weights"].value or 0
        a = c["acts"].value
        ww = bar_w * w / scale
        aw = bar_w * a / scale if a else 0
        fig.rect(left, y, ww, 18, "dp", rx=1, tip=f"权重+优化器 {w / gib:.1f} GiB")
        if a:
            fig.rect(left + ww, y, aw, 18, "fwd", rx=1, tip=f"激活 {a / gib:.1f} GiB")
        if c["fits"] is None:
            unknown = "激活未知" if a is None else "权重未知"
            text, kind = f"{w / gib:.1f} GiB + {unknown}", "muted"
        else:
            text = f"{(w + a) / gib:.1f} GiB" + ("" if c["fits"] else " 超")
            kind = "ink" if c["fits"] else "accent"
        fig.text(left + ww + aw + 4, y + 9, text, size=11, kind=kind)
        step = f"{c['step']:.2f} 秒" if c["step"] is not None else "无数"
        fig.text(
            info_x + 8,
            y + 9,
            f"NVLink {link_ms(c, 'NVLink')} ms · IB {link_ms(c, 'IB')} ms · "
            f"气泡 {c['bubble']:.3f} · 名义步长 {step}" + ("  ← 选" if picked else ""),
            size=12,
            bold=picked,
        )
    bx = left + bar_w * budget / scale
    fig.line(bx, top - 4, bx, height - 8, "accent", dashed=True)
    fig.check()
    return fig
