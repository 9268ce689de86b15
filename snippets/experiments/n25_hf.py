"""Note 25's experiment: a real ``GPTModel`` trained one step at TP x PP, converted into a Hugging
Face ``transformers`` causal LM and back, proven by equal logits.

On every rank (:func:`convert`):

1. build the policy (local spec, RMSNorm, SwiGLU, RoPE, QK norm if ``dims.qk_norm``, padded
   vocabulary, tied or untied output) in the training layout and train it one step;
2. **gather** as a refit does: ``swap_model_weights`` into a TP=1 · PP=1 model on every rank (note
   22's machinery), so each rank holds full tensors -- the SwiGLU ``linear_fc1`` comes back as
   ``[gate; up]`` because the planner honours its ``partition_stride=2``;
3. map the full tensors (:func:`snippets.rl.hf_convert.to_hf`), ``load_state_dict(strict=True)``
   into ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` built from a config, compare its logits with the
   policy's (through the pipeline);
4. reverse: the HF state dict -> Megatron names (:func:`to_megatron`), loaded strictly into the
   TP=1 model and resharded by ``swap_model_weights`` into a TP=2 model, whose logits must agree again;
5. each deliberately wrong mapping of :data:`snippets.rl.hf_mapping.WRONG`: the strict load refuses
   it (shape mismatch) or the logits move, by ``max |delta|``.

Only the CPU path (gloo, fp32) is proven here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from snippets.experiments.n22_refit import (
    Inputs,
    forward_backward,
    pipeline_logits,
    rollout_groups,
    rollout_logits,
)
from snippets.models.presets import Dims
from snippets.record.tables import Table
from snippets.rl import hf_convert, hf_mapping

ATOL = 1e-5
DIVISIBLE_BY = 16  # make_vocab_size_divisible_by at these sizes (Megatron's default is 128)
MHA = Dims("mha", hidden=32, heads=4, query_groups=4, kv_channels=8, ffn=32, vocab=60, layers=2, seq=8,
           micro_batch_size=2, microbatches=2, swiglu=True, rmsnorm=True, bias=False, rope=True)  # fmt: skip
"""The second shape: MHA without QK norm, tied embeddings (Llama-style); fc2 is square."""


def gpt_config(dims, tp: int, pp: int, device: str = "cpu"):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        **dims.transformer_config_kwargs(),
        layernorm_epsilon=hf_convert.RMS_EPS,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_cpu_initialization=device == "cpu",
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def gpt(dims, config, pg_collection, padded: int, tied: bool, first: bool = True, last: bool = True):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
    return GPTModel(
        config,
        spec,
        vocab_size=padded,  # Megatron's padded vocabulary; Hugging Face keeps dims.vocab
        max_sequence_length=dims.seq,
        pre_process=first,
        post_process=last,
        share_embeddings_and_output_weights=tied,
        position_embedding_type="rope",
        rotary_base=int(hf_convert.ROPE_THETA),
        pg_collection=pg_collection,
    )


def train_one_step(model, batches, inputs: Inputs, lr: float = 0.5) -> tuple[list[float], bool]:
    """One pipeline step and SGD. Before the step, as ``finalize_model_grads`` does: a tied
    embedding's two copies (first and last stage) get their summed gradient, and so do the TP copies
    of each QK layernorm weight. Returns the losses and whether those QK norm gradients differed
    across TP before the sum."""
    from megatron.core import parallel_state

    losses = forward_backward(model, batches, inputs)
    # the two sums finalize_model_grads does (without DDP it is ours to do):
    shared = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    if shared is not None and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(shared.grad, group=parallel_state.get_embedding_group())
    tp_group = parallel_state.get_tensor_model_parallel_group()
    qk_grads_differ = False  # a QK norm weight is replicated over TP, but each rank saw other heads
    for name, param in model.named_parameters():
        if "q_layernorm" in name or "k_layernorm" in name:
            others = tp_shards(param.grad, tp_group)
            qk_grads_differ |= not all(torch.equal(g, others[0]) for g in others)
            dist.all_reduce(param.grad, group=tp_group)
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return losses, qk_grads_differ


def full_state(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def load_megatron(model, state: dict) -> None:
    """``load_state_dict(strict=True)``; the ``_extra_state`` entries (None here) are the model's own."""
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    model.load_state_dict({**state, **extra}, strict=True)


def tp_shards(param, group) -> list[torch.Tensor]:
    shards = [torch.empty_like(param) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, param.detach().contiguous(), group=group)
    return shards


def convert(dims, tied: bool, groups: dict, tp: int = 2, pp: int = 2, device: str = "cpu") -> dict:
    """Steps 1-5 of the module docstring for one model. ``parallel_state`` is initialized (TP x PP)
    and ``groups`` holds the TP=1 and TP=2 layouts' own groups (``rollout_groups``)."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding.refit import clear_plan_cache, swap_model_weights

    # swap_model_weights caches each reshard plan in refit.py, keyed by the two layouts' parallel
    # sizes, not by the models: new models of another shape in the same layouts need new plans
    clear_plan_cache()
    padded = hf_convert.padded_vocab(dims.vocab, tp, DIVISIBLE_BY)
    shape = hf_convert.Shape.of(dims, padded, tied)
    backend = "nccl" if device == "cuda" else "gloo"
    inputs = Inputs(dims.replace(vocab=padded), device)
    rank0 = dist.get_rank() == 0
    torch.manual_seed(100 * parallel_state.get_pipeline_model_parallel_rank())  # each stage its own layers
    with torch.device(device):
        policy = gpt(
            dims,
            gpt_config(dims, tp, pp, device),
            ProcessGroupCollection.use_mpu_process_groups(),
            padded,
            tied,
            parallel_state.is_pipeline_first_stage(),
            parallel_state.is_pipeline_last_stage(),
        )
        full = gpt(dims, gpt_config(dims, 1, 1, device), groups[1], padded, tied)
        back = gpt(dims, gpt_config(dims, 2, 1, device), groups[2], padded, tied)
    data = torch.randint(  # token ids below dims.vocab: the padding rows are never looked up
        0, dims.vocab, (dims.microbatches + 1, dims.micro_batch_size, dims.seq),
        generator=torch.Generator().manual_seed(7),
    ).to(device)  # fmt: skip
    prompts = data[0]
    losses, qk_grads_differ = train_one_step(policy, list(data[1:]), inputs)
    megatron = pipeline_logits(policy, prompts, inputs)  # [b, s, padded], on every rank

    # 2. gather: TP shards and PP stages -> full tensors on every rank
    swap_model_weights(policy, full, backend)
    gathered = full_state(full)
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    shards = tp_shards(
        policy.decoder.layers[0].mlp.linear_fc1.weight, parallel_state.get_tensor_model_parallel_group()
    )

    # 3. Megatron -> HF, on rank 0 (with the wrong mappings); its state dict is the "HF checkpoint"
    hf_state = hf_convert.to_hf(gathered, shape)
    summary = [None, None]
    if rank0:
        hf = hf_convert.hf_model(dims, tied).to(device)
        loaded = hf_convert.load_hf(hf, hf_state)
        hf_out = hf_convert.hf_logits(hf, prompts)
        wrong = {}
        bad = hf_convert.hf_model(dims, tied).to(device)  # reused: a strict load that passes rewrites it all
        for name in hf_mapping.WRONG:
            status = hf_convert.load_hf(bad, hf_convert.to_hf(gathered, shape, wrong=name))
            delta = (
                float((hf_convert.hf_logits(bad, prompts) - hf_out).abs().max()) if status == "ok" else None
            )
            wrong[name] = (status, delta)
        checkpoint = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        summary = [checkpoint, dict(model=type(hf).__name__, loaded=loaded, hf_out=hf_out, wrong=wrong)]
        summary[1]["hf_out_max"] = float(hf_out.abs().max())
    dist.broadcast_object_list(summary, src=0)
    checkpoint, seen = summary

    # 4. HF -> Megatron at TP=2, on every rank
    load_megatron(full, hf_convert.to_megatron(checkpoint, shape))
    swap_model_weights(full, back, backend)
    reverse_out = rollout_logits(back, prompts, inputs)
    hf_out = seen.pop("hf_out")
    stage0 = parallel_state.is_pipeline_first_stage()
    return dict(
        **seen,
        tied=tied,
        qk_norm=dims.qk_norm,
        layers=dims.layers,
        vocab=dims.vocab,
        padded=padded,
        losses=losses,
        qk_grads_differ=qk_grads_differ,
        forward=float((megatron[..., : dims.vocab] - hf_out).abs().max()),
        reverse=float((reverse_out[..., : dims.vocab] - hf_out).abs().max()),
        padding_logits=float(reverse_out[..., dims.vocab :].abs().max()),
        megatron_names=sorted(gathered),
        hf_names=sorted(checkpoint),
        full_shapes={k: tuple(v.shape) for k, v in gathered.items()},
        hf_shapes={k: tuple(v.shape) for k, v in hf_state.items()},
        local_shapes={k: tuple(p.shape) for k, p in policy.named_parameters()},
        fc1_naive=bool(stage0 and torch.equal(torch.cat(shards), gathered[fc1])),
        fc1_strided=bool(stage0 and torch.equal(hf_convert.merge_strided(shards, 2), gathered[fc1])),
        tp_group=dist.get_process_group_ranks(parallel_state.get_tensor_model_parallel_group()),
    )


def convert_shapes(shapes: list[tuple[Dims, bool]], tp: int = 2, pp: int = 2, device: str = "cpu") -> list:
    """:func:`convert` for several (dims, tied) in one launch: the groups are made once."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(123)
    groups = {1: rollout_groups(1), 2: rollout_groups(2)}
    return [convert(dims, tied, groups, tp, pp, device) for dims, tied in shapes]


def run(dims, par) -> dict:
    return convert_shapes([(dims, False)], par.tp, par.pp, par.device)[0]


# ----------------------------------------------------------------------------- note 25's tables


def _delta(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def proof_table(results: list[dict]) -> Table:
    """One row per (model, direction or wrong mapping), from rank 0's results."""
    rows = []
    for r in results:
        model = f"{r['model']}（{'tied' if r['tied'] else 'untied'}）"
        rows.append([model, "Megatron TP2·PP2 → HF", r["loaded"], _delta(r["forward"]), r["forward"] < ATOL])
        rows.append([model, "HF → Megatron TP2", "ok", _delta(r["reverse"]), r["reverse"] < ATOL])
        for name, (status, delta) in r["wrong"].items():
            rows.append([model, f"错：{name}", status, _delta(delta), delta is not None and delta < ATOL])
    return Table(["模型", "方向 / 映射", "load_state_dict(strict=True)", "max |Δlogit|", f"< {ATOL:g}"], rows)


def mapping_rows(r: dict) -> list[list]:
    """One model's conversion rows, layer 0 standing for every layer:
    ``[feature, "megatron name [shape]", ["hf name [shape]", ...], transform]`` (table and picture)."""
    rows = []
    for row in hf_mapping.rows_for(r["qk_norm"], r["tied"]):
        name = row.megatron.format(i=0)
        hf = [n.format(i=0) for n in row.hf]
        rows.append(
            [
                row.feature,
                f"{name} {list(r['full_shapes'][name])}",
                [f"{n} {list(r['hf_shapes'][n])}" for n in hf],
                row.transform,
            ]
        )
    return rows


def mapping_table(r: dict) -> Table:
    return Table(
        ["难点", "Megatron（聚齐后）", "Hugging Face", "变换"],
        [[f, m, "<br>".join(h), hf_mapping.TRANSFORM_TEXT[t]] for f, m, h, t in mapping_rows(r)],
    )


def tables(ranks: list, dims, par) -> list:
    r = ranks[0]
    return [
        f"{r['model']}: vocab {r['vocab']} -> Megatron padded {r['padded']}; training losses "
        f"{[x['losses'] for x in ranks if x['losses']][0]} (only the CPU path, gloo and fp32, is proven)",
        mapping_table(r),
        proof_table([r]),
    ]
