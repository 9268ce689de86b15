"""Note 16's experiment: context parallelism -- how the real ``get_batch_on_this_cp_rank`` splits a
sequence over CP ranks, and ring attention over those pieces -- at any sequence length and head size.

``batch_on_cp_rank`` gives the real function a ``[b, s]`` batch (:func:`make_batch`) on every rank of
a ``context_parallel_size`` grid and reads back which positions each rank kept; ``ring_vs_full``
takes each rank's positions of one full-sequence ``q, k, v`` (the same on every rank), runs
:func:`snippets.cp.ring_attention.ring_attention` (our torch version of Transformer Engine's p2p ring,
which does not install without a GPU) forward and backward over the CP group, recording every p2p
batch, and compares output and gradients with one process's causal attention over the whole
sequence. Note 16 runs both at ``s = 16``; ``python -m snippets.run cp --dims qwen3-8b --cp 8``
splits a 2,048-token sequence with Qwen3-8B's 32 heads of 128.
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table


def make_batch(seq_len, first_token=100, micro_batch=1):
    """A GPT micro-batch's five fields for ``[b, s]`` tokens ``first_token, first_token + 1, ...``."""
    tokens = torch.arange(first_token, first_token + seq_len).expand(micro_batch, seq_len).clone()
    causal = torch.ones(seq_len, seq_len).tril().bool()
    return dict(
        tokens=tokens,
        labels=tokens + 1,
        loss_mask=torch.ones(micro_batch, seq_len),
        attention_mask=(~causal).expand(micro_batch, 1, seq_len, seq_len).clone(),
        position_ids=torch.arange(seq_len).expand(micro_batch, seq_len).clone(),
    )


def _context_parallel(cp):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(context_parallel_size=cp)


def batch_on_cp_rank(dims, cp):
    """On every rank: the real ``get_batch_on_this_cp_rank`` on one batch of ``dims.seq`` tokens."""
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    _context_parallel(cp)
    full, batch = make_batch(dims.seq), make_batch(dims.seq)
    # As pretrain_gpt.get_batch calls it (pretrain_gpt.py:167-173): since core 0.19 the CP group must
    # be given (without it the split reads the world's size and rank, utils.py:2483-2484).
    local = get_batch_on_this_cp_rank(
        batch, is_hybrid_cp=False, cp_group=parallel_state.get_context_parallel_group()
    )
    positions = local["position_ids"][0]
    return dict(
        cp_rank=parallel_state.get_context_parallel_rank(),
        same_dict=local is batch,
        shapes={k: list(v.shape) for k, v in local.items()},
        positions=positions.tolist(),
        tokens=local["tokens"][0].tolist(),
        mask_rows_kept=torch.equal(local["attention_mask"], full["attention_mask"][:, :, positions]),
    )


def ring_vs_full(dims, cp, device="cpu"):
    """On every rank: ring attention on this rank's positions against one process's full causal
    attention (output, dQ, dK, dV), and the recorded p2p calls.

    ``q, k, v`` are ``[s, b, heads, kv_channels]``, laid out as in Megatron's attention.
    """
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    from snippets.cp.ring_attention import causal_attention, ring_attention
    from snippets.record.recorder import record

    _context_parallel(cp)
    cp_group = parallel_state.get_context_parallel_group()
    local_batch = get_batch_on_this_cp_rank(make_batch(dims.seq), is_hybrid_cp=False, cp_group=cp_group)
    positions = local_batch["position_ids"][0].to(device)
    torch.manual_seed(0)  # every rank draws the same full-sequence q, k, v and upstream gradient
    q, k, v, dout = (
        torch.randn(dims.seq, dims.micro_batch_size, dims.heads, dims.kv_channels).to(device)
        for _ in range(4)
    )
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    causal_attention(*full).backward(dout)  # reference: one process, whole sequence
    local = [t[positions].clone().requires_grad_() for t in (q, k, v)]
    with record() as calls:
        out = ring_attention(*local, parallel_state.get_context_parallel_group())
        out.backward(dout[positions])
    reference_out = causal_attention(q, k, v)[positions]
    same = [torch.allclose(out, reference_out, atol=1e-6)]
    same += [torch.allclose(mine.grad, f.grad[positions], atol=1e-6) for mine, f in zip(local, full)]
    return same, calls


def run(dims, par) -> dict:
    """On every rank (the runner): the batch split, then ring attention against the full sequence."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(context_parallel_size=par.cp)
    return dict(split=batch_on_cp_rank(dims, par.cp), ring=ring_vs_full(dims, par.cp, par.device))


# ----------------------------------------------------------------------------- note 16's tables


def split_table(results, cp, seq_len):
    """Which chunks and positions each CP rank holds (``results``: every rank's ``batch_on_cp_rank``)."""
    chunk = seq_len // (2 * cp)
    rows = []
    for rank, r in enumerate(results):
        chunks = sorted({p // chunk for p in r["positions"]})
        rows.append(
            [
                f"{rank} / {r['cp_rank']}",
                chunks,
                r["positions"],
                r["shapes"]["tokens"],
                r["shapes"]["attention_mask"],
                r["mask_rows_kept"],
            ]
        )
    same_dict = all(r["same_dict"] for r in results)
    return Table(
        [
            "rank / cp_rank",
            "持有的块",
            "position_ids",
            "tokens 等",
            "attention_mask",
            "mask 行 = 全序列这些行",
        ],
        rows,
        title=f"CP={cp}（共 2·CP 块）；返回的是传入的同一个 dict：{same_dict}",
    )


def work_table(cp, seq_len):
    """Per CP rank, the (query, key) pairs the causal mask keeps on its queries -- its attention
    work -- when the sequence is cut into ``cp`` contiguous parts, and into Megatron's ``2·cp``
    chunks (``[cp, s, cp_rank, contiguous, 2·CP chunks]``)."""
    from snippets.cp.ring_attention import causal_pairs, chunk_positions

    keys = torch.arange(seq_len)
    part = seq_len // cp
    rows = []
    for r in range(cp):
        naive = causal_pairs(torch.arange(r * part, (r + 1) * part), keys)
        zigzag = causal_pairs(chunk_positions(r, cp, seq_len), keys)
        rows.append([cp, seq_len, r, naive, zigzag])
    return rows


def ring_meaning(call):
    if call.phase == "forward":
        return "把手里的 K/V 块交给下一个 CP rank，收上一个的"
    if call.before.startswith("isend[4"):
        return "K/V 块连同累计的 dK/dV 往下传"
    return "最后一跳：dK/dV 回到块的主人"


def shapes(call):  # what goes in → what comes out; for a p2p batch: what is sent → received
    if call.api == "batch_isend_irecv":
        sent, received = call.before.split("; ")
        return f"{sent.removeprefix('isend')} → {received.removeprefix('irecv')}"
    return f"{call.before} → {call.after}"


def ring_table(calls):
    rows = []
    for i, c in enumerate(calls, 1):
        peers = dict(c.extra["ops"])
        rows.append(
            [
                i,
                c.phase,
                c.api,
                f"{c.group} {list(c.ranks)}",
                shapes(c),
                f"→ {peers['isend']} / ← {peers['irecv']}",
                ring_meaning(c),
            ]
        )
    return Table(
        [
            "#",
            "phase",
            "API",
            "group",
            "shape before（发出）→ after（收到）",
            "send_dst / recv_src",
            "meaning",
        ],
        rows,
    )


def tables(results: list, dims, par) -> list:
    cp_group_of_rank0 = results[: par.cp]  # CP is the fastest-varying dimension after TP (here 1)
    return [
        split_table([r["split"] for r in cp_group_of_rank0], par.cp, dims.seq),
        Table(
            ["CP", "rank", "输出相等", "dQ 相等", "dK 相等", "dV 相等"],
            [[par.cp, rank, *r["ring"][0]] for rank, r in enumerate(results)],
        ),
        f"rank {min(1, par.cp - 1)} 的通信:",
        ring_table(results[min(1, par.cp - 1)]["ring"][1]),
    ]


def imbalance_rows(cases):
    """For each ``(cp, s)``: the contiguous split's slowest / fastest rank and slowest / mean rank,
    counted from :func:`work_table`, the formula for the first, its long-sequence limit, and the
    ``2·CP`` split's slowest / mean.

    With ``m = s / cp`` tokens a rank, contiguous rank ``r`` keeps ``m²(r + 1/2) + m/2`` pairs, so
    the last over the first is ``(m(2·cp − 1) + 1) / (m + 1)``: ``2·cp − 1`` only as ``s`` grows.
    """
    rows = []
    for cp, seq_len in cases:
        work = work_table(cp, seq_len)
        naive, zigzag = [r[3] for r in work], [r[4] for r in work]
        mean = sum(naive) / cp
        m = seq_len // cp
        rows.append(
            [
                cp,
                seq_len,
                round(max(naive) / min(naive), 4),
                round((m * (2 * cp - 1) + 1) / (m + 1), 4),
                2 * cp - 1,
                round(max(naive) / mean, 4),
                round(max(zigzag) / mean, 4),
            ]
        )
    return Table(
        [
            "CP",
            "s",
            "连续切 最慢 / 最快",
            "公式 (m(2·CP−1)+1)/(m+1)",
            "s → ∞ 的极限 2·CP−1",
            "连续切 最慢 / 平均",
            "2·CP 块切 最慢 / 平均",
        ],
        rows,
    )


def hop_payloads(calls, phase):
    """Numbers one rank sends in each recorded ring hop of ``phase`` (``calls``: :func:`ring_vs_full`'s)."""
    out = []
    for c in calls:
        if c.phase == phase:
            shape = c.before.split(";")[0].removeprefix("isend").strip("[] ")
            n = 1
            for size in shape.split(","):
                n *= int(size)
            out.append(n)
    return out


def te_backward_payloads(cp: int, kv_numel: int) -> list[int]:
    """What Transformer Engine's p2p ring (``AttnFuncWithCPAndKVP2P.backward``, BF16/FP16 path) sends
    in each of its ``cp`` backward hops, for a K+V block of ``kv_numel`` numbers: its buffer is
    ``[KV, dKV]``; the first hop sends ``KV`` only (no gradient exists yet), the last ``dKV`` only (no
    one needs the block any more), the ones between both."""
    if cp == 1:
        return []
    return [kv_numel] + [2 * kv_numel] * (cp - 2) + [kv_numel]


def folded(summary: str, *tables: Table):
    """``tables`` behind a closed ``<details>``: a check the page only needs to state in one sentence."""
    from IPython.display import Markdown

    body = "\n\n".join(t.markdown() for t in tables)
    return Markdown(f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>")
