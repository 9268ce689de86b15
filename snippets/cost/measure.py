"""Note 26's measurements: what a real Megatron model costs on CPU ranks, set beside the formulas.

Each function runs on every rank of a :func:`snippets.ranks.launch.run_ranks` launch (after
``torch.distributed`` is up) and returns a small picklable summary:

* :func:`state_bytes`: a bf16 ``GPTModel`` (``Float16Module``) in Megatron's DDP with or without
  ``grad_reduce_in_fp32``, ``get_megatron_optimizer`` with or without the distributed optimizer, one
  recorded training step; the bytes the real objects hold per parameter
  (:func:`snippets.optim.optimizer_memory.measured_bytes`) and every collective of the step;
* :func:`layer_activations`: one bf16 ``TransformerBlock`` of one layer (local spec, dropout on, the
  activation-recomputation paper's shapes) forward under TP, with or without sequence parallel and
  with no / selective / full recomputation: the bytes autograd keeps for backward
  (:class:`snippets.tp.rng.SavedTensors`: distinct storages, parameters left out);
* :func:`flops`: one forward + backward of a real ``GPTModel`` under
  ``torch.utils.flop_counter.FlopCounterMode``;
* :func:`pipeline_split`: a ``GPTModel`` stage per PP rank under each way Megatron offers to split
  the layers (even, ``num_layers_in_first/last_pipeline_stage``, the embedding/loss accounting,
  ``pipeline_model_parallel_layout``): the layers it holds, its parameters, what one micro-batch's
  forward keeps, and how many micro-batches 1F1B keeps in flight on it.

:func:`volume` turns recorded collectives into the elements each rank sends (ring algorithm), the
quantity the communication formulas give.
"""

from __future__ import annotations

import re
import warnings

import torch

DROPOUT = 0.1
"""The activation paper counts dropout masks; the block runs with dropout on."""

RECOMPUTE = {"none": {}, "selective": dict(recompute_granularity="selective")}
RECOMPUTE["full"] = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
"""TransformerConfig fields of each recomputation setting (selective = Megatron's default
``recompute_modules=["core_attn"]``)."""


def _tiny_config(dims, **fields):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(**dims.transformer_config_kwargs(), use_cpu_initialization=True, **fields)


def state_bytes(dims, distributed: bool, fp32_grads: bool, tp: int = 1, sp: bool = False) -> dict:
    """One bf16 training step on this rank; bytes per parameter the real objects hold and the calls."""
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
    from megatron.core.transformer.module import Float16Module

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.models.tiny_gpt import forward_step
    from snippets.optim import optimizer_memory
    from snippets.record import recorder

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(0)
    config = _tiny_config(
        dims,
        bf16=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
    )
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
        share_embeddings_and_output_weights=False,
    )
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(use_distributed_optimizer=distributed, grad_reduce_in_fp32=fp32_grads),
        Float16Module(config, model),
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(lr=0.01, bf16=True, use_distributed_optimizer=distributed), [ddp]
    )
    dp, r = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    assert dims.microbatches % dp == 0, (
        f"{dims.microbatches} micro-batches do not split evenly over DP {dp}: some would be dropped"
    )
    n = dims.microbatches // dp
    mine = microbatches(dims, dims.microbatches)[n * r : n * (r + 1)]
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    with recorder.record() as calls:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(mine),
            model=[ddp],
            num_microbatches=n,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
        finalize_model_grads([ddp])
        optimizer.step()
    memory = optimizer_memory.measured_bytes(ddp, optimizer)
    numel = sum(p.numel() for p in ddp.parameters())
    named = dict(model.named_parameters())
    # what Megatron's weight formula leaves out: the linears' biases and a learned position table
    biases = sum(p.numel() for n, p in named.items() if n.endswith(".bias") and "norm" not in n)
    position = sum(p.numel() for n, p in named.items() if "position_embeddings" in n)
    return dict(
        biases=biases,
        position=position,
        memory=memory,
        numel=numel,
        tensors=sum(1 for _ in ddp.parameters()),
        per_param=memory["total"] / numel,
        calls=calls,
        dp=dp,
        microbatches=n,
    )


def layer_activations(dims, tp: int, sp: bool, recompute: str) -> dict:
    """Bytes one layer keeps for backward after its forward, on this TP rank (bf16, dropout on), and
    the elements its TP collectives move in that forward + backward (:func:`volume`)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_block import TransformerBlock

    from snippets.record import recorder
    from snippets.tp.rng import SavedTensors

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(0)
    kwargs = dims.transformer_config_kwargs()
    kwargs.update(num_layers=1)
    from megatron.core.transformer import TransformerConfig

    with warnings.catch_warnings():  # selective recompute's note about TE's fused attention (local spec here)
        warnings.filterwarnings("ignore", message=".*core_attn recompute is really needed")
        config = _layer_config(TransformerConfig, kwargs, tp, sp, recompute)
    block = TransformerBlock(config, get_gpt_layer_local_spec(), post_layer_norm=False)
    s, b, h = dims.seq, dims.micro_batch_size, dims.hidden
    rows = s // tp if sp else s
    x = (
        torch.randn(rows, b, h, generator=torch.Generator().manual_seed(1))
        .to(torch.bfloat16)
        .requires_grad_()
    )
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    listing: list[tuple] = []

    class Listed(SavedTensors):
        def _pack(self, t):
            listing.append(
                (
                    t.untyped_storage().data_ptr(),
                    tuple(t.shape),
                    str(t.dtype).replace("torch.", ""),
                    t.untyped_storage().nbytes(),
                )
            )
            return super()._pack(t)

    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    with recorder.record() as calls:
        with Listed(block.parameters()) as saved:
            y = block(x, attention_mask=causal)
            kept = saved.nbytes()
            alive = {ptr for _, ref, ptr, _ in saved._saved if ref() is not None}
        tensors, seen = [], set()
        for ptr, shape, dtype, size in listing:  # each storage once, in the order forward saved it
            if ptr in alive and ptr not in params and ptr not in seen and size:
                seen.add(ptr)
                tensors.append((shape, dtype, size))
        y.float().pow(2).sum().backward()
    return dict(bytes=kept, sbh=s * b * h, comm=volume(calls), tensors=tensors)


def _layer_config(TransformerConfig, kwargs, tp, sp, recompute):
    return TransformerConfig(
        **kwargs,
        bf16=True,
        params_dtype=torch.bfloat16,
        hidden_dropout=DROPOUT,
        attention_dropout=DROPOUT,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        use_cpu_initialization=True,
        **RECOMPUTE[recompute],
    )


def flops(dims) -> dict:
    """FLOPs torch counts in one forward + backward of a real GPTModel (one rank, fp32)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from torch.utils.flop_counter import FlopCounterMode

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.models.tiny_gpt import forward_step

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = _tiny_config(dims, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
        share_embeddings_and_output_weights=False,
    )
    [batch] = microbatches(dims, 1)
    counter = FlopCounterMode(display=False)
    with counter:
        output, loss_func = forward_step(iter([batch]), model)
        loss = loss_func(output)[0]
        loss.backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    params = sum(p.numel() for p in model.parameters())
    embedding = (
        model.embedding.word_embeddings.weight.numel() + model.embedding.position_embeddings.weight.numel()
    )
    return dict(total=counter.get_total_flops(), by_op=by_op, params=params, non_embedding=params - embedding)


SPLITS = {
    "均分": {},
    "首尾各少": dict(num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1),
    "layout": dict(pipeline_model_parallel_layout="Et|ttt|ttt|tL"),
    "embedding/loss 算一层": dict(
        account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True
    ),
}
"""The ways Megatron 0.19.0 splits layers over pipeline stages (TransformerConfig fields)."""


def pipeline_split(dims, pp: int, splits: dict = SPLITS) -> dict:
    """On every PP rank: for each split, this stage's global layer numbers, its parameters, the bytes
    one micro-batch's forward keeps, and 1F1B's micro-batches in flight (warm-up + 1) -- or the
    sentence Megatron refuses the split with."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.tp.rng import SavedTensors

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(0)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    out = {}
    for name, fields in splits.items():
        try:
            config = _tiny_config(
                dims,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                pipeline_model_parallel_size=pp,
                pipeline_dtype=torch.float32,
                **fields,
            )
            stage = GPTModel(
                config,
                get_gpt_layer_local_spec(),
                vocab_size=dims.vocab,
                max_sequence_length=dims.seq,
                share_embeddings_and_output_weights=False,
                pre_process=first,
                post_process=last,
            )
        except (ValueError, AssertionError) as e:
            out[name] = dict(refused=" ".join(str(e).split())[:160])
            continue
        [batch] = microbatches(dims, 1)
        s, b, h = dims.seq, dims.micro_batch_size, dims.hidden
        if not first:
            stage.set_input_tensor(
                torch.randn(s, b, h, generator=torch.Generator().manual_seed(1)).requires_grad_()
            )
        with SavedTensors(stage.parameters()) as saved:
            y = stage(
                batch["tokens"],
                batch["position_ids"],
                batch["attention_mask"],
                labels=batch["labels"] if last else None,
            )
            kept = saved.nbytes()
        del y
        _, _, warmup, _ = get_pp_rank_microbatches(dims.microbatches, 1, 1)
        out[name] = dict(
            layers=[layer.layer_number for layer in stage.decoder.layers],
            params=sum(p.numel() for p in stage.parameters()),
            embedding=first and hasattr(stage, "embedding"),
            output=last and hasattr(stage, "output_layer"),
            activation=kept,
            in_flight=warmup + 1,
            p2p=_schedule_p2p(stage, config, dims),
        )
    return out


def _schedule_p2p(stage, config, dims) -> dict:
    """One step of Megatron's 1F1B schedule over ``dims.microbatches`` micro-batches on this stage,
    recorded: :func:`volume` of its p2p (what this stage sends to its neighbours)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.models.tiny_gpt import forward_step
    from snippets.record import recorder

    stage.set_input_tensor(None)
    with recorder.record() as calls:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches(dims, dims.microbatches)),
            model=[stage],
            num_microbatches=dims.microbatches,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )
    return volume(calls)


# ---- recorded collectives -> elements each rank sends -------------------------------------------

_SHAPE = re.compile(r"\[([0-9, ]*)\]")


def _elements(text: str) -> int:
    """Elements in a recorder shape string (``[8, 2, 16]``, ``2 × [4]``)."""
    total = 0
    times = re.match(r"\s*(\d+) × ", text)
    for dims in _SHAPE.findall(text):
        n = 1
        for d in dims.split(","):
            if d.strip():
                n *= int(d)
        total += n
    return total * (int(times.group(1)) if times else 1)


def full_elements(call) -> int:
    """The whole tensor a collective works on: all-reduce's tensor, all-gather's output,
    reduce-scatter's input, a p2p's sent tensors."""
    if call.api == "batch_isend_irecv":
        return sum(_elements(part) for part in call.before.split(";") if "isend" in part)
    if call.api in ("all_gather_into_tensor", "_all_gather_base", "all_gather"):
        return _elements(call.after)
    return _elements(call.before)


OPS = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
}
"""The recorder's API names of the ring collectives, mapped onto :data:`snippets.cost.formulas.RING`."""


def _ring_share():
    from snippets.cost.formulas import RING as SHARE

    return {api: SHARE[op] for api, op in OPS.items()}


RING = _ring_share()
"""Share of the whole tensor each rank sends in a ring collective of ``n`` ranks (p2p: all of it):
the formulas' own table (:data:`snippets.cost.formulas.RING`), keyed by the recorder's API names."""


def volume(calls) -> dict:
    """``{(group, phase): [calls, elements of the whole tensors, elements each rank sends]}``."""
    out: dict = {}
    for c in calls:
        n = len(c.ranks)
        if n < 2 and c.api != "batch_isend_irecv":
            continue
        whole = full_elements(c)
        sent = whole * RING[c.api](n) if c.api in RING else whole
        row = out.setdefault((c.group, c.phase), [0, 0, 0.0])
        row[0] += 1
        row[1] += whole
        row[2] += sent
    return out
