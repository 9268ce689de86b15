"""Note 25's picture: the Megatron -> Hugging Face mapping as a flow, drawn from the table's rows.

:func:`draw_mapping` takes the rows :func:`snippets.experiments.n25_hf.mapping_rows` returns (the
same rows the note's conversion table prints): each Megatron tensor on the left (gathered, full
shape), the Hugging Face tensor(s) it becomes on the right, and an arrow per target labelled with
the transform, colored by kind (rename only, drop vocabulary padding, split by query group, split
gate / up).
"""

from __future__ import annotations

from snippets.record.draw import Figure

KINDS = {"copy": "muted", "unpad_vocab": "emb", "split_qkv": "tp", "split_gate_up": "pp"}
SHORT = {
    "copy": "改名",
    "unpad_vocab": "去 padding 行",
    "split_qkv": "按 group 拆 Q/K/V",
    "split_gate_up": "对半拆 gate/up",
}
LEGEND = [
    ("muted", "只改名"),
    ("emb", "去掉 vocab padding"),
    ("tp", "按 query group 拆"),
    ("pp", "拆 gate / up"),
]


def draw_mapping(
    rows: list[list], *, title: str, desc: str, left_w: float = 420, gap: float = 210, right_w: float = 450
) -> Figure:
    """``rows``: ``[feature, megatron "name [shape]", [hf "name [shape]", ...], transform key]``.
    ``left_w``, ``gap`` and ``right_w`` size the two columns and the arrows' room between them
    (note 25's first picture, the rows that are more than a rename, is drawn narrower)."""
    left_x = 10
    right_x = left_x + left_w + gap
    row_h, top = 26, 60
    legend = [item for item in LEGEND if any(KINDS[r[3]] == item[0] for r in rows)]
    height = top + sum(row_h * len(r[2]) + 8 for r in rows) + 20
    fig = Figure(right_x + right_w + 10, height, title=title, desc=desc)
    fig.text(left_x, 16, "Megatron（聚齐后的全局名与 shape）", bold=True)
    fig.text(right_x, 16, "Hugging Face transformers（state_dict 的键）", bold=True)
    fig.legend(left_x, 40, legend)
    y = top
    for feature, megatron, hf_names, transform in rows:
        kind = KINDS[transform]
        band = row_h * len(hf_names)
        mid = y + band / 2
        with fig.group(megatron.split(" ")[0], tip=f"{feature}：{SHORT[transform]}"):
            fig.boxed(left_x, mid - 11, left_w, 22, megatron, kind, size=11, faint=True)
            for j, name in enumerate(hf_names):
                ty = y + row_h * j + row_h / 2
                fig.boxed(right_x, ty - 11, right_w, 22, name, kind, size=11, faint=True)
                fig.line(left_x + left_w, mid, right_x - 2, ty, kind, arrow=True)
            if len(hf_names) == 1:
                fig.text(
                    (left_x + left_w + right_x) / 2,
                    mid - 9,
                    SHORT[transform],
                    size=11,
                    anchor="middle",
                    kind=kind,
                )
            else:  # a fan: above its top arrow, near where the arrows start
                top_arrow = (mid + y + row_h / 2) / 2
                fig.text(left_x + left_w + 6, top_arrow - 12, SHORT[transform], size=11, kind=kind)
        y += band + 8
    fig.check()
    return fig
