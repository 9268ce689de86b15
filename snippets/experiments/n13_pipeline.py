"""Note 13's experiment: a real ``GPTModel`` through Megatron's pipeline schedules, at any size.

:func:`pipeline_run` builds this rank's pipeline stage (one model chunk, or ``vp`` chunks for the
interleaved schedule) with ``get_gpt_layer_local_spec``, sets every weight from its *global* name
(:func:`snippets.models.tiny_gpt.init_by_global_name`, so any split starts from the same model), and runs
``get_forward_backward_func()`` over ``m`` micro-batches while :mod:`snippets.pp.timeline`
records every forward, backward and p2p call. ``tables`` prints, for the pipeline group of rank 0:
which layers each stage holds, the schedule function, the recorded order, warm-up / steady /
cool-down against the code's own counts, every p2p call, and the bubble against ``(p-1)/(v*m+p-1)``.
"""

from __future__ import annotations

import torch

from snippets.pp import timeline
from snippets.record.tables import Table


def microbatches(dims, num: int, device: str = "cpu", seed: int = 0) -> list[dict]:
    """``num`` micro-batches of random tokens at ``dims`` (the draws of
    :func:`snippets.models.tiny_gpt.microbatches`, which fixes note 13's sizes), on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    s, b = dims.seq, dims.micro_batch_size
    causal = torch.triu(torch.ones(s, s), diagonal=1).bool()[None, None]  # True = masked
    out = []
    for _ in range(num):
        batch = dict(
            tokens=torch.randint(0, dims.vocab, (b, s), generator=gen),
            labels=torch.randint(0, dims.vocab, (b, s), generator=gen),
            position_ids=torch.arange(s).repeat(b, 1),
            attention_mask=causal,
        )
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


def pipeline_config(
    dims,
    pp: int,
    vp=None,
    tp: int = 1,
    sequence_parallel: bool = False,
    batch_p2p_comm: bool = True,
    device: str = "cpu",
):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        batch_p2p_comm=batch_p2p_comm,
        use_cpu_initialization=device == "cpu",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pipeline_dtype=torch.float32,
    )


def stage_chunks(dims, config, vp=None, device: str = "cpu") -> list:
    """This rank's model chunks (one, or ``vp`` of them): the real ``GPTModel`` (local spec) of each
    of its stages, ``pre_process`` / ``post_process`` where the stage holds the embedding / the
    output layer, as ``get_model`` builds them; weights drawn by global layer name, so every split
    holds the same layers as one process."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from snippets.models.tiny_gpt import init_by_global_name

    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
    chunks = []
    for vp_stage in range(vp) if vp else [None]:
        with torch.device(device):
            chunks.append(
                GPTModel(
                    config,
                    spec,
                    vocab_size=dims.vocab,
                    max_sequence_length=dims.seq,
                    pre_process=parallel_state.is_pipeline_first_stage(
                        ignore_virtual=False, vp_stage=vp_stage
                    ),
                    post_process=parallel_state.is_pipeline_last_stage(
                        ignore_virtual=False, vp_stage=vp_stage
                    ),
                    share_embeddings_and_output_weights=False,
                    vp_stage=vp_stage,
                    position_embedding_type="rope" if dims.rope else "learned_absolute",
                )
            )
        init_by_global_name(chunks[-1])
    return chunks


def pipeline_run(
    dims,
    pp: int,
    vp=None,
    microbatch_counts=(4,),
    batch_p2p_comm: bool = True,
    tp: int = 1,
    sequence_parallel: bool = False,
    device: str = "cpu",
    keep_grads: bool = True,
) -> dict:
    """On every rank: build this rank's stage(s), run the schedule once per micro-batch count.

    Returns the schedule function's name, each chunk's layers, and per ``m`` the recorded ops,
    the losses (last stage only), the code's own warm-up counts and -- with ``keep_grads`` -- every
    gradient by global name (note 13 compares them with one process; at real sizes leave it off).
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import by_global_name, forward_step

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
    )
    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp, vp, tp, sequence_parallel, batch_p2p_comm, device)
    chunks = stage_chunks(dims, config, vp, device)
    forward_backward_func = get_forward_backward_func()
    runs = {}
    for m in microbatch_counts:
        for chunk in chunks:
            chunk.zero_grad()
        data = microbatches(dims, m, device)
        with timeline.record_schedule() as ops:
            losses = forward_backward_func(
                forward_step_func=forward_step,
                data_iterator=[iter(data) for _ in chunks] if vp else iter(data),
                model=chunks,
                num_microbatches=m,
                seq_length=dims.seq,
                micro_batch_size=dims.micro_batch_size,
            )
        warmup = schedules.get_pp_rank_microbatches(m, len(chunks), config.microbatch_group_size_per_vp_stage)
        runs[m] = dict(
            ops=ops,
            losses=[x["lm loss"].cpu() for x in losses],
            grads=by_global_name(chunks) if keep_grads else None,
            code_counts=warmup,
        )
    stages = [
        dict(
            pre=c.pre_process, post=c.post_process, layers=[layer.layer_number for layer in c.decoder.layers]
        )
        for c in chunks
    ]
    return dict(
        func=forward_backward_func.__name__,
        stages=stages,
        runs=runs,
        ranks=dict(
            pp=parallel_state.get_pipeline_model_parallel_rank(),
            tp=parallel_state.get_tensor_model_parallel_rank(),
            dp=parallel_state.get_data_parallel_rank(),
            world=torch.distributed.get_rank(),
        ),
    )


def batch_p2p_comm_for(pp: int, vp) -> bool:
    """Note 13: interleaved with PP=2 and batched p2p is wrong on gloo (the previous and the next
    rank are the same rank), so that one case sends one by one."""
    return not (vp and pp == 2)


def run(dims, par) -> dict:
    return pipeline_run(
        dims,
        par.pp,
        par.vp,
        (dims.microbatches,),
        batch_p2p_comm_for(par.pp, par.vp),
        par.tp,
        par.sp,
        par.device,
        keep_grads=False,
    )


# ----------------------------------------------------------------------------- note 13's tables


def config_label(pp: int, vp=None, tp: int = 1) -> str:
    return f"PP={pp}" + (f", VP={vp}" if vp else "") + (f", TP={tp}" if tp > 1 else "")


def _rank(index: int, r: dict) -> int:
    """A rank's global number (results gathered by the runner), else its place in the list."""
    return r.get("ranks", {}).get("world", index)


def stage_rows(name: str, results: list) -> list:
    return [
        [name, _rank(i, r), chunk, s["pre"], s["post"], s["layers"]]
        for i, r in enumerate(results)
        for chunk, s in enumerate(r["stages"])
    ]


def phase_rows(name: str, results: list, m: int) -> list:
    rows = []
    for i, r in enumerate(results):
        rank = _rank(i, r)
        total, _, warmup, remaining = r["runs"][m]["code_counts"]
        recorded = timeline.phases(r["runs"][m]["ops"])
        code = (warmup, remaining, total - remaining)
        rows.append([name, m, rank, code, recorded, code == recorded])
    return rows


BUBBLE_HEADERS = [
    "schedule",
    "p",
    "v",
    "m",
    "总时长（格，1 格 = 一层的 forward）",
    "量出的气泡",
    "(p−1)/(v·m+p−1)",
    "相等",
]
"""One unit for every row: a forward of one layer takes 1, its backward 2, so a stage of 2 layers
(1F1B, PP=4, 8 layers) takes 2 and an interleaved chunk of 1 layer takes 1: lengths compare."""


def bubble_row(name: str, results: list, m: int, p: int, v: int, layers: int) -> list:
    per_rank = [r["runs"][m]["ops"] for r in results]
    per_chunk = layers // (p * v)  # layers in one model chunk: a forward takes that many units
    t = timeline.logical_schedule(per_rank, chunks=v, forward=per_chunk, backward=2 * per_chunk)
    formula = (p - 1) / (v * m + p - 1)
    return [
        name,
        p,
        v,
        m,
        timeline.makespan(t),
        round(timeline.bubble_fraction(t), 4),
        round(formula, 4),
        abs(timeline.bubble_fraction(t) - formula) < 1e-9,
    ]


def mean_loss(results: list, m: int) -> float:
    return torch.stack(results[-1]["runs"][m]["losses"]).mean().item()  # only the last stage has them


def pipeline_of_rank0(results: list) -> list:
    """The ranks of rank 0's pipeline (TP rank 0, DP rank 0), in stage order."""
    mine = [r for r in results if r["ranks"]["tp"] == 0 and r["ranks"]["dp"] == 0]
    return sorted(mine, key=lambda r: r["ranks"]["pp"])


def tables(results: list, dims, par) -> list:
    ranks = pipeline_of_rank0(results)
    m, v = dims.microbatches, par.vp or 1
    name = config_label(par.pp, par.vp, par.tp)

    def ops(r):
        return r["runs"][m]["ops"]

    p2p = [row for i, r in enumerate(ranks) for row in timeline.p2p_rows(ops(r), _rank(i, r), v)]
    out = [
        f"rank 0 所在的 pipeline：rank {[_rank(i, r) for i, r in enumerate(ranks)]}（按 stage 排）:",
        Table(["配置", "rank", "chunk", "pre_process", "post_process", "全局层号"], stage_rows(name, ranks)),
        Table(["配置", "get_forward_backward_func() 返回"], [[name, ranks[0]["func"]]]),
        f"mean loss（最后一个 stage，{m} 个 micro-batch）: {round(mean_loss(ranks, m), 4)}",
        Table(
            ["配置", "m", "rank", "代码 (warm-up, steady, cool-down)", "记录", "相同"],
            phase_rows(name, ranks, m),
        ),
        Table(
            ["rank", "记录到的顺序"],
            [
                [_rank(i, r), " ".join(timeline.label(op, v) for op in timeline.compute_ops(ops(r)))]
                for i, r in enumerate(ranks)
            ],
        ),
    ]
    if p2p:
        out += [
            f"API: {sorted({row[3] for row in p2p})}  group: {sorted({row[4] for row in p2p})}",
            Table(
                ["rank", "在这步之后", "P2PCommunicator 方法", "ops（→发给、←收自）", "shape 前 = 后"],
                [[rank, after, method, peers, shapes] for rank, after, method, _, _, peers, shapes, _ in p2p],
            ),
            Table(
                ["P2PCommunicator 方法", "语义"],
                [[method, timeline.P2P_MEANINGS[method]] for method in dict.fromkeys(row[2] for row in p2p)],
            ),
        ]
    out.append(
        Table(
            BUBBLE_HEADERS,
            [bubble_row("interleaved" if par.vp else "1F1B", ranks, m, par.pp, v, dims.layers)],
        )
    )
    return out
