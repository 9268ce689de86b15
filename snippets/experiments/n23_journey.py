"""Note 23's experiment: one training step on TP x PP x DP ranks, following one weight, at any size.

:func:`one_step` builds this rank's pipeline stage of a real ``GPTModel`` (local spec; sequence
parallel as asked), gives every parameter its slice of the unsplit model's tensor
(:func:`snippets.train.journey.init_full_then_shard`), wraps it in DDP with the distributed optimizer and
runs one step -- ``get_forward_backward_func()``, ``finalize_model_grads``, ``optimizer.step()`` --
over this DP rank's micro-batches, while observers that change nothing record every collective,
every schedule step and p2p call, the followed layer's inputs and outputs and the tensors autograd
saves. The weight it follows is ``linear_fc1`` of the first layer of the last pipeline stage
(:func:`followed_weight`; note 23's layer 2 of 2 on PP=2). The same function with TP = PP = 1 is
the unsplit reference.

:func:`compare` reduces one rank's result to a small summary -- index ranges of the dense tensor,
shapes, the recorded collectives, memory -- with every comparison against the reference made on
the rank, and the table functions print note 23's tables from all ranks' summaries. :func:`run`
(the runner) runs the reference inside the job first: with TP = PP = 1 every rank is a DP replica
of the whole model, fed the whole global batch, so each one's gradient before the DP reduction,
its activations and losses are one process's. Memory is counted against
:func:`snippets.train.journey.memory_formula` where that formula applies (LayerNorm, GELU, no biases,
learned positions: the tiny GPT); at other sizes the table says ``-``.
"""

from __future__ import annotations

import torch

from snippets.experiments.n13_pipeline import microbatches, pipeline_config
from snippets.experiments.n20_optimizer_topic import digest
from snippets.record.tables import Table


def followed_weight(dims, pp: int) -> str:
    """The global name of the weight to follow: ``linear_fc1`` of the last stage's first layer."""
    return f"decoder.layers.{dims.layers - dims.layers // pp}.mlp.linear_fc1.weight"


def one_step(dims, tp=1, pp=1, sequence_parallel=False, weight_name=None, device="cpu", whole_batch=False):
    """On every rank: one watched training step of this rank's stage; where ``weight_name`` (a
    global name) and its activations and gradient are. ``whole_batch``: every DP rank takes all
    ``dims.microbatches`` micro-batches instead of its share (the runner's in-job reference)."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import forward_step
    from snippets.pp.timeline import record_schedule
    from snippets.ranks.groups import describe_rank
    from snippets.record import recorder
    from snippets.tp import layer_walk
    from snippets.train import journey

    weight_name = weight_name or followed_weight(dims, pp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp, tp=tp, sequence_parallel=sequence_parallel, device=device)
    with torch.device(device):
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization),
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope" if dims.rope else "learned_absolute",
        )
    dense = journey.init_full_then_shard(model, keep=(weight_name,))
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=0.0, use_distributed_optimizer=True), [ddp]
    )
    config.no_sync_func = ddp.no_sync

    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    m = dims.microbatches if whole_batch else dims.microbatches // dp
    first = 0 if whole_batch else m * dp_rank
    data = microbatches(dims, dims.microbatches, device)[first : first + m]
    weight = dict(journey.named_by_global_name(model)).get(weight_name)  # None on ranks without it
    layer = model.decoder.layers[0]  # on the last stage: the followed weight's layer
    number = int(weight_name.split(".")[2]) + 1  # its global layer_number
    initial = weight.detach().clone() if weight is not None else None

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    batch_tensors = [t for batch in data for t in batch.values()]
    with (
        recorder.record() as step_calls,
        record_schedule() as ops,
        journey.Taps(model, layer_numbers=(number,)) as taps,
        journey.SavedActivations(model, exclude=batch_tensors) as acts,
        layer_walk.collectives_by_submodule(
            layer, step_calls, ["mlp.linear_fc1", "mlp.linear_fc2"]
        ) as by_module,
    ):
        losses = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(data),
            model=[ddp],
            num_microbatches=m,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
    local_grad = weight.main_grad.clone() if weight is not None else None
    with recorder.record() as grad_calls:
        finalize_model_grads([ddp])
    reduced_grad = weight.main_grad.clone() if weight is not None else None
    with recorder.record() as opt_calls:
        optimizer.step()

    dp_mean_grad = None
    if weight is not None:  # outside the step, for the check: the DP ranks' local gradients averaged
        dp_mean_grad = local_grad.clone()
        torch.distributed.all_reduce(dp_mean_grad, group=parallel_state.get_data_parallel_group())
        dp_mean_grad /= dp
    inner = optimizer.chained_optimizers[0]  # the DistributedOptimizer
    shard = None
    if weight is not None and weight in inner.model_param_gbuf_map:  # this DP rank owns a piece of it
        ranges = inner._get_model_param_range_map(weight)
        states = inner._get_main_param_and_optimizer_states(weight)
        shard = dict(
            param=(ranges["param"].start, ranges["param"].end),
            gbuf_world=(ranges["gbuf_world"].start, ranges["gbuf_world"].end),
            shapes={k: list(v.shape) for k, v in states.items() if v.dim() > 0},
            main_is_view=states["param"].untyped_storage().data_ptr() == weight.untyped_storage().data_ptr(),
        )
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    return dict(
        who=describe_rank(),
        layers=[layer.layer_number for layer in model.decoder.layers],
        weight_name=weight_name,
        number=number,
        sequence_parallel=sequence_parallel,
        dense=dense,
        initial=initial,
        weight=weight.detach().clone() if weight is not None else None,
        rows=journey.dense_ranges(weight, tp_rank, tp) if weight is not None else None,
        buffer_range=ddp.buffers[0].param_index_map[weight][:2] if weight is not None else None,
        buffer_numel=ddp.buffers[0].grad_data.numel(),
        local_grad=local_grad,
        reduced_grad=reduced_grad,
        dp_mean_grad=dp_mean_grad,
        shard=shard,
        taps=taps,
        ops=ops,
        by_module=by_module,
        step_calls=step_calls,
        grad_calls=grad_calls,
        opt_calls=opt_calls,
        losses=[x["lm loss"] for x in losses],
        grad_stats_group=torch.distributed.get_process_group_ranks(inner.get_grad_stats_parallel_group()),
        memory=journey.measured_memory(ddp, optimizer, acts),
        saved_by_label=acts.saved_by_label,
        formula=journey.memory_formula(
            config,
            dims.vocab,
            dims.seq,
            dims.micro_batch_size,
            m,
            dp,
            parallel_state.get_pipeline_model_parallel_rank(),
            dp_rank,
        )
        if formula_applies(dims)
        else None,
    )


def formula_applies(dims) -> bool:
    """:func:`snippets.train.journey.memory_formula` counts the tiny GPT's tensors: LayerNorm, GELU, no
    biases, no QK norm, a learned position table."""
    return not (dims.swiglu or dims.rmsnorm or dims.qk_norm or dims.bias or dims.rope)


def run(dims, par) -> dict:
    """On every rank (the runner): the reference step in the job, then the step at ``par``."""
    import gc

    from megatron.core import parallel_state

    weight = followed_weight(dims, par.pp)
    # TP = PP = 1: every rank holds the whole model and takes the whole batch -- one process's step
    ref = one_step(dims, weight_name=weight, device=par.device, whole_batch=True)
    parallel_state.destroy_model_parallel()
    gc.collect()  # the reference's model and optimizer go; its copies stay
    return compare(one_step(dims, par.tp, par.pp, par.sp, weight, par.device), ref)


# ----------------------------------------------------------------------------- one rank's summary


def _first(calls, api, where=""):
    return next((c for c in calls if c.api == api and where in c.where), None)


def compare(r: dict, ref: dict) -> dict:
    """What the tables print about one rank, every comparison with the reference ``ref`` (the
    TP = PP = 1 step: one process, or the runner's in-job replica) made here; no tensors."""
    from snippets.train import journey

    out = dict(
        who=r["who"],
        layers=r["layers"],
        holds=r["weight"] is not None,
        ops=r["ops"],
        losses=[x.item() for x in r["losses"]],
        ref_losses=[x.item() for x in ref["losses"]],
        grad_stats_group=r["grad_stats_group"],
        memory=r["memory"],
        formula=r["formula"],
    )
    if r["weight"] is None:
        return out
    name, n, rows = r["weight_name"], r["number"], r["rows"]
    tp_rank, dp_rank = r["who"]["coords"]["tp"], r["who"]["coords"]["dp"]
    dense, weight = r["dense"][name], r["weight"]
    # the reference's gradient: one process's finalize changes nothing (DP = 1), and each in-job
    # replica's gradient before the DP reduction is already the whole batch's
    ref_grad = journey.take(ref["local_grad"], rows)

    m = len(r["taps"][(n, "")])
    g = dp_rank * m  # this rank's first micro-batch, globally
    layer_in, _ = r["taps"][(n, "")][0]
    fc1_in, fc1_out = r["taps"][(n, "mlp.linear_fc1")][0]
    _, fc2_out = r["taps"][(n, "mlp.linear_fc2")][0]
    ref_in, _ = ref["taps"][(n, "")][g]
    ref_fc1_in, ref_fc1_out = ref["taps"][(n, "mlp.linear_fc1")][g]
    _, ref_fc2_out = ref["taps"][(n, "mlp.linear_fc2")][g]
    s, local_s = ref_in.shape[0], layer_in.shape[0]  # a sequence shard under SP, else all of it
    a, b = (tp_rank * local_s, (tp_rank + 1) * local_s) if local_s < s else (0, s)
    # fp32 sums in another order (split matmuls, reductions): relative differences grow with the sizes
    near = lambda x, y, atol=1e-5: torch.allclose(x, y, rtol=1e-4, atol=atol)  # noqa: E731
    tokens, cols = f"token [{a}, {b})", journey.ranges_text(rows)
    out["activations"] = [
        [f"第 {n} 层的输入", list(layer_in.shape), tokens, near(layer_in, ref_in[a:b])],
        ["linear_fc1 的输入", list(fc1_in.shape), tokens, near(fc1_in, ref_fc1_in[a:b])],
        [
            "linear_fc1 的输出",
            list(fc1_out.shape),
            f"token [0, {s}) × 列 {cols}",
            near(fc1_out, journey.take(ref_fc1_out, rows, dim=2)),
        ],
        ["linear_fc2 的输出", list(fc2_out.shape), tokens, near(fc2_out, ref_fc2_out[a:b])],
    ]
    shard = r["shard"]
    owned = journey.dense_rows_of(shard["param"], list(weight.shape), rows) if shard else "-"
    flat = slice(*shard["param"]) if shard else slice(0, 0)
    out.update(
        weight_name=name,
        number=n,
        first_microbatch=g,
        tokens=tokens,
        seq=s,
        cols=cols,
        dim=0,
        rows=rows,
        dense_shape=list(dense.shape),
        dense_equal=torch.equal(dense, ref["dense"][name]),
        local_shape=list(r["initial"].shape),
        local_is_slice=torch.equal(r["initial"], journey.take(dense, rows)),
        buffer_range=tuple(r["buffer_range"]),
        buffer_numel=r["buffer_numel"],
        mean_equal=near(r["dp_mean_grad"], ref_grad, atol=1e-7),
        owned_equal=near(r["reduced_grad"].reshape(-1)[flat], ref_grad.reshape(-1)[flat], atol=1e-7),
        shard=shard,
        owned=owned,
        updated_close=torch.allclose(weight, journey.take(ref["weight"], rows), atol=1e-6),
        updated_diff_small=(weight - journey.take(ref["weight"], rows)).abs().max().item() < 1e-6,
        digest=digest([(name, weight)]),
        changed=not torch.equal(weight, r["initial"]),
        by_module=r["by_module"],
        grad_calls=r["grad_calls"],
        opt_calls=r["opt_calls"],
        recv=_first(r["step_calls"], "batch_isend_irecv"),
        gather=_first(r["by_module"]["mlp.linear_fc1"]["forward"], "all_gather_into_tensor"),
        fc2_call=next(iter(r["by_module"]["mlp.linear_fc2"]["forward"]), None),
        sync=_first(r["grad_calls"], "reduce_scatter_tensor"),
        regather=_first(r["opt_calls"], "all_gather_into_tensor"),
        fc1_in_shape=list(fc1_in.shape),
        fc1_out_shape=list(fc1_out.shape),
        fc2_out_shape=list(fc2_out.shape),
        layer_in_shape=list(layer_in.shape),
        sequence_parallel=r["sequence_parallel"],
    )
    return out


# ----------------------------------------------------------------------------- note 23's tables


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
    "reduce_scatter_tensor": "梯度：整个 bucket 在 DP 群求和（先乘 1/DP），每个 rank 只留自己那段",
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


def journey_table(summaries) -> Table:
    """The five stations in one table, on the first holder."""
    i = holders(summaries)[0]
    s = summaries[i]
    sh = s["shard"]
    return Table(
        ["站", "形态", f"rank {i} 持有的全局范围", "本地 shape", f"产生它的通信（rank {i}）"],
        [
            [
                "①",
                "稠密 weight（每个持有者各造一份）",
                f"行 [0, {s['dense_shape'][0]})",
                s["dense_shape"],
                "无",
            ],
            ["①", "TP 分片", f"行 {s['cols']}", s["local_shape"], "无（本地切）"],
            [
                "③",
                f"收到的 stage 激活 = 第 {s['number']} 层输入",
                s["tokens"],
                s["layer_in_shape"],
                _said(s["recv"], "无（PP=1：同一个 stage）"),
            ],
            [
                "②",
                "fc1 的输入拼成整段",
                f"token [0, {s['seq']})",
                s["gather"].after if s["gather"] else s["fc1_in_shape"],
                _said(s["gather"], "无（没有 SP）"),
            ],
            [
                "②",
                "fc1 的输出",
                f"token [0, {s['seq']}) × 列 {s['cols']}",
                s["fc1_out_shape"],
                "无（本地矩阵乘）",
            ],
            [
                "②",
                "fc2 输出切回序列分片" if s["sequence_parallel"] else "fc2 输出（部分和相加）",
                s["tokens"],
                s["fc2_out_shape"],
                _said(s["fc2_call"], "无（TP=1）"),
            ],
            [
                "④",
                "main_grad（同步后只有拥有的那段有效）",
                s["owned"],
                s["local_shape"],
                _said(s["sync"], "无"),
            ],
            ["⑤", "Adam 状态分片", s["owned"], sh["shapes"]["exp_avg"] if sh else "-", "无"],
            ["⑤", "更新后的 weight", f"行 {s['cols']}", s["local_shape"], _said(s["regather"], "无")],
        ],
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


def stage_table(summaries, dims, par) -> Table | None:
    """Per stage: what one micro-batch saves by the formula, times the micro-batches in flight,
    against the peak measured on the stage's first rank (``None`` where the formula does not apply)."""
    from snippets.train import journey

    if not formula_applies(dims):
        return None
    config = pipeline_config(dims, par.pp, tp=par.tp, sequence_parallel=par.sp)
    firsts = [
        min(i for i, s in enumerate(summaries) if s["who"]["coords"]["pp"] == stage)
        for stage in range(par.pp)
    ]

    def row(stage):
        parts = journey.stage_activation_bytes(
            config, dims.seq, dims.micro_batch_size, dims.vocab, stage == 0, stage == par.pp - 1
        )
        copies = journey.in_flight(par.pp, stage, dims.microbatches // par.dp)
        return [
            stage,
            " + ".join(f"{k} {v}" for k, v in parts.items()),
            copies,
            copies * sum(parts.values()),
            summaries[firsts[stage]]["memory"]["activations"],
        ]

    return Table(
        [
            "stage",
            "每个 micro-batch 存下的（B）",
            "在途份数",
            "峰值 B（公式）",
            f"实测峰值 B（rank {' / '.join(map(str, firsts))}）",
        ],
        [row(stage) for stage in range(par.pp)],
    )


def tables(results: list, dims, par) -> list:
    out = [
        f"跟踪的 weight: {results[holders(results)[0]]['weight_name']}",
        rank_table(results),
        loss_lines(results),
        slice_table(results),
        *activation_table(results),
        sp_calls_table(results),
        p2p_table(results),
        grad_table(results),
        grad_calls_table(results),
        shard_table(results),
        *opt_calls_table(results),
        final_lines(results),
        journey_table(results),
        memory_table(results),
        stage_table(results, dims, par),
    ]
    return [t for t in out if t is not None]
