"""Note 16's picture: which CP rank keeps which of the ``2·CP`` chunks, and why that balances the
causal mask.

:func:`draw_cp_split` takes the rows of note 16's ``split_table`` (each CP rank's ``position_ids``
after the real ``get_batch_on_this_cp_rank``) and of ``work_table`` (each rank's kept (query, key)
pairs). It draws the sequence as a strip of chunks colored by owner, then the ``s × s`` causal mask
twice -- query rows colored by the rank that owns them, cut contiguously and cut into 2·CP chunks --
with each rank's pair count as a bar: contiguous parts give the last rank the most work, the
head-and-tail chunks give every rank the same.
"""

from __future__ import annotations

from snippets.record.draw import Figure

RANK_KINDS = ("tp", "pp", "dp", "cp", "ep", "edp", "emb", "mem")


def rank_kind(r: int) -> str:
    return RANK_KINDS[r % len(RANK_KINDS)]


def _owners(split_rows: list[list], seq_len: int) -> list[int]:
    owner = [-1] * seq_len
    for r, row in enumerate(split_rows):
        for p in row[2]:
            owner[p] = r
    return owner


def draw_cp_split(split_rows: list[list], work_rows: list[list], *, m_cell: float = 14) -> Figure:
    """Note 16 (see the module docstring); ``work_rows`` at the same CP and sequence length.
    ``m_cell`` is one (q, k) cell of the mask in px (note 16's first picture uses 8, to share the
    first screen with the 结论 card)."""
    cp, seq_len = work_rows[0][0], work_rows[0][1]
    if len(split_rows) != cp:
        raise ValueError(f"split rows for {len(split_rows)} ranks, work rows for CP={cp}")
    chunk = seq_len // (2 * cp)
    zigzag = _owners(split_rows, seq_len)
    contiguous = [p // (seq_len // cp) for p in range(seq_len)]
    cell, strip = 44, 28
    mat = seq_len * m_cell
    panel = mat + 30 + 170
    width = max(24 + seq_len * cell + 8, 24 + 2 * panel + 40 + 8)
    height = 66 + strip + 58 + mat + 16
    fig = Figure(
        width,
        height,
        title=f"CP={cp}：序列切成 {2 * cp} 块，每个 CP rank 拿一头一尾两块，causal mask 下工作量相同",
        desc="上：s 个位置切成 2·CP 块，颜色是持有它的 CP rank（真实 get_batch_on_this_cp_rank 的结果）；"
        "下：causal mask（行是 query、列是 key），query 行按持有者上色，右边是每个 rank 保留的 (q, k) 对数。",
    )
    fig.text(12, 14, f"get_batch_on_this_cp_rank：s = {seq_len}，{2 * cp} 块，每块 {chunk} 个位置", bold=True)
    fig.legend(12, 34, [(rank_kind(r), f"cp_rank {r}") for r in range(cp)], size=11)
    y = 66
    for c in range(2 * cp):
        r = zigzag[c * chunk]
        x = 24 + c * chunk * cell
        fig.rect(
            x,
            y,
            chunk * cell,
            strip,
            rank_kind(r),
            rx=0,
            tip=f"chunk {c} | cp_rank {r} | positions {c * chunk}–{(c + 1) * chunk - 1}",
        )
        fig.text(x + chunk * cell / 2, y + strip / 2, f"rank {r}", anchor="middle", kind="on", size=11)
        fig.text(x + chunk * cell / 2, y - 8, f"块 {c}", anchor="middle", kind="muted", size=11)
        fig.line(x, y, x, y + strip, "paper", width=2)
        for p in range(c * chunk, (c + 1) * chunk):
            fig.text(24 + p * cell + cell / 2, y + strip + 10, str(p), anchor="middle", kind="muted", size=11)
    top = y + strip + 58
    for k, (mode, owner, col) in enumerate((("连续切", contiguous, 3), ("2·CP 块切（Megatron）", zigzag, 4))):
        x0 = 24 + k * (panel + 40)
        fig.text(x0, top - 22, mode, bold=True)
        fig.text(x0 + mat + 30, top - 22, "每个 rank 的 (q, k) 对数", size=11, kind="muted")
        fig.rect(x0, top, mat, mat, "light", rx=0, faint=True)
        for r in range(cp):
            with fig.group(f"{mode} cp_rank {r}"):
                for q in range(seq_len):
                    if owner[q] == r:
                        fig.rect(x0, top + q * m_cell, (q + 1) * m_cell, m_cell, rank_kind(r), rx=0)
        peak = max(row[col] for row in work_rows)
        for r, row in enumerate(work_rows):
            by = top + r * (mat / cp) + (mat / cp - 20) / 2
            w = 120 * row[col] / peak
            bx = x0 + mat + 30
            fig.rect(bx, by, w, 20, rank_kind(r), rx=2, tip=f"{mode} | cp_rank {r} | {row[col]}")
            fig.text(bx + w + 6, by + 10, str(row[col]), size=11)
    fig.check()
    return fig


def cp_tips(split_rows: list[list], work_rows: list[list]) -> list[str]:
    """The hover titles :func:`draw_cp_split` gives, rebuilt from the two tables' rows."""
    cp, seq_len = work_rows[0][0], work_rows[0][1]
    chunk = seq_len // (2 * cp)
    owner = _owners(split_rows, seq_len)
    tips = [
        f"chunk {c} | cp_rank {owner[c * chunk]} | positions {c * chunk}–{(c + 1) * chunk - 1}"
        for c in range(2 * cp)
    ]
    for mode, col in (("连续切", 3), ("2·CP 块切（Megatron）", 4)):
        tips += [f"{mode} | cp_rank {row[2]} | {row[col]}" for row in work_rows]
    return tips
