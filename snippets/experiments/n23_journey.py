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
:func:`snippets.train.journey_memory.memory_formula` where that formula applies (LayerNorm, GELU, no biases,
learned positions: the tiny GPT); at other sizes the table says ``-``.
"""

from __future__ import annotations

import torch

from snippets.experiments.n13_pipeline import microbatches, pipeline_config
from snippets.experiments.n20_optimizer_topic import digest
from snippets.record.tables import Table
from snippets.train.journey_tables import (  # noqa: F401 - the note imports its tables from here
    GRAD_MEANING,
    MEMORY_COLUMNS,
    OPT_MEANING,
    SP_MEANING,
    activation_table,
    coords,
    final_lines,
    grad_calls_table,
    grad_table,
    holders,
    journey_table,
    loss_lines,
    memory_table,
    opt_calls_table,
    p2p_table,
    rank_table,
    shard_table,
    slice_table,
    sp_calls_table,
)


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
    from snippets.train import journey, journey_memory

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
        journey_memory.SavedActivations(model, exclude=batch_tensors) as acts,
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
        memory=journey_memory.measured_memory(ddp, optimizer, acts),
        saved_by_label=acts.saved_by_label,
        formula=journey_memory.memory_formula(
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
    """:func:`snippets.train.journey_memory.memory_formula` counts the tiny GPT's tensors: LayerNorm, GELU, no
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


def stage_table(summaries, dims, par) -> Table | None:
    """Per stage: what one micro-batch saves by the formula, times the micro-batches in flight,
    against the peak measured on the stage's first rank (``None`` where the formula does not apply)."""
    from snippets.train import journey_memory

    if not formula_applies(dims):
        return None
    config = pipeline_config(dims, par.pp, tp=par.tp, sequence_parallel=par.sp)
    firsts = [
        min(i for i, s in enumerate(summaries) if s["who"]["coords"]["pp"] == stage)
        for stage in range(par.pp)
    ]

    def row(stage):
        parts = journey_memory.stage_activation_bytes(
            config, dims.seq, dims.micro_batch_size, dims.vocab, stage == 0, stage == par.pp - 1
        )
        copies = journey_memory.in_flight(par.pp, stage, dims.microbatches // par.dp)
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
