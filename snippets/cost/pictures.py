"""Note 26's pictures, drawn from the rows its tables print (:mod:`snippets.experiments.n26_cost`)."""

from __future__ import annotations

from snippets.record.draw import Figure


def draw_choice(cands: list[dict], chosen: dict, budget: float, *, title: str, width: int = 1000) -> Figure:
    """One row per candidate config: memory per GPU as a bar (weights + optimizer, then activations;
    a dashed line at ``budget``), then NVLink / IB time, bubble and nominal step; the chosen row
    outlined. ``cands`` are :func:`snippets.experiments.n26_cost.candidate` results."""
    from snippets.experiments.n26_cost import label

    row, top, left, bar_w = 28, 44, 130, 340
    scale = max(max(c["memory"] for c in cands), budget) * 1.02
    height = top + row * len(cands) + 12
    fig = Figure(
        width,
        height,
        title=title,
        desc="每行一个候选配置：左边是每张 GPU 的显存（权重+优化器、激活），虚线是显存上限；"
        "右边是每步 NVLink / IB 通信时间、气泡和名义步长；框出的是选中的配置。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    x_end = fig.legend(left, 32, [("dp", "权重+优化器"), ("fwd", "激活")], size=11)
    fig.text(x_end + 4, 32, f"虚线 = {budget / 1e9:.0f} GB", size=11, kind="muted")
    info_x = left + bar_w + 76
    for i, c in enumerate(cands):
        picked = label(c) == label(chosen)
        y = top + row * i + 6
        if picked:
            fig.rect(4, y - 4, width - 8, row - 2, "accent", faint=True)
        fig.text(10, y + 9, label(c), size=12, bold=picked, mono=True)
        w = c["weights"].value or 0
        a = c["acts"].value or 0
        ww, aw = bar_w * w / scale, bar_w * a / scale
        fig.rect(left, y, ww, 18, "dp", rx=1, tip=f"权重+优化器 {w / 1e9:.1f} GB")
        if a:
            fig.rect(left + ww, y, aw, 18, "fwd", rx=1, tip=f"激活 {a / 1e9:.1f} GB")
        text = f"{(w + a) / 1e9:.1f} GB" + ("" if c["fits"] else " 超")
        fig.text(left + ww + aw + 4, y + 9, text, size=11, kind="accent" if not c["fits"] else "ink")
        fig.text(
            info_x + 8,
            y + 9,
            f"NVLink {c['link']['NVLink'] * 1e3:.0f} ms · IB {c['link']['IB'] * 1e3:.0f} ms · "
            f"气泡 {c['bubble']:.3f} · 名义步长 {c['step']:.2f} 秒" + ("  ← 选" if picked else ""),
            size=12,
            bold=picked,
        )
    bx = left + bar_w * budget / scale
    fig.line(bx, top - 4, bx, height - 8, "accent", dashed=True)
    fig.check()
    return fig
