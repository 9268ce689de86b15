"""Note 24's experiment: the model-parallel RNG streams and activation recompute, at any layer size.

``seeds_and_masks`` seeds the real tracker with ``model_parallel_cuda_manual_seed`` and reads back
every stream's seed, then draws one dropout mask outside ``fork()`` and one inside.
``recompute_run`` runs one real ``TransformerLayer`` (local spec, attention and hidden dropout on)
three ways from the same RNG state -- plainly, through Megatron's ``tensor_parallel.checkpoint``
and through ``torch.utils.checkpoint`` (which restores only the default generators) -- and
compares outputs and every gradient bit for bit, with the bytes autograd saved.
``without_output_run`` checkpoints the layer's ``input_layernorm`` with ``CheckpointWithoutOutput``
as ``TransformerLayer`` does under selective ``layernorm`` recompute. ``python -m snippets.run rng
--dims qwen3-8b --tp 8`` runs the same at Qwen3-8B's layer.
"""

from __future__ import annotations

import contextlib

import torch

from snippets.record.tables import Table
from snippets.tp.rng import STREAMS

SEED = 1234
"""The seed of ``torch.manual_seed`` and ``model_parallel_cuda_manual_seed`` (Megatron's default)."""
DROPOUT = 0.25
"""Attention and hidden dropout of the layer, and the p of the masks."""
MASK = 16
"""Length of the drawn masks."""


def reseed(seed: int = SEED) -> None:
    """What Megatron's training entry does (``_set_random_seed``): both generators, one seed."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def seeds_and_masks(device: str = "cpu") -> dict:
    """This rank's coordinates, its streams' seeds (read back from the tracker) and two masks."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from snippets.tp.rng import dropout_masks, formula_seeds, stream_seeds

    reseed()
    coords = dict(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
    )
    groups = dict(
        tp_group=dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
        dp_group=dist.get_process_group_ranks(ps.get_data_parallel_group()),
        ep_group=dist.get_process_group_ranks(ps.get_expert_model_parallel_group()),
    )
    seeds = stream_seeds(get_cuda_rng_tracker(), device)
    inside, outside = dropout_masks(MASK, DROPOUT, device)
    return dict(
        coords,
        **groups,
        rank=dist.get_rank(),
        seeds=seeds,
        formula=seeds == formula_seeds(SEED, coords["tp_rank"], coords["ep_rank"], coords["etp_rank"]),
        inside=inside,
        outside=outside,
    )


def build_layer(dims, tp: int, device: str = "cpu", **config):
    """The real local-spec ``TransformerLayer`` at ``dims`` with dropout :data:`DROPOUT` (``config``:
    more ``TransformerConfig`` fields, e.g. a recompute setting)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    kwargs = dims.transformer_config_kwargs()
    kwargs["num_layers"] = 1
    config = TransformerConfig(
        **kwargs,
        attention_dropout=DROPOUT,
        hidden_dropout=DROPOUT,
        tensor_model_parallel_size=tp,
        use_cpu_initialization=device != "cuda",
        **config,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=kwargs["normalization"])
    reseed()
    with torch.device(device):
        return build_module(spec, config=config, layer_number=1)


def _inputs(dims, device):
    s, b = dims.seq, dims.micro_batch_size
    x = torch.randn(s, b, dims.hidden, generator=torch.Generator().manual_seed(1)).to(device)
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=device), diagonal=1)
    return x, causal


def _generator_states():
    """The default generator's state and the TP stream's, as the tracker holds it (copies)."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return torch.get_rng_state(), get_cuda_rng_tracker().get_states()["model-parallel-rng"].clone()


MODES = ("plain", "megatron", "distributed", "torch")
"""How :func:`recompute_run` runs the layer: no recompute, ``tensor_parallel.checkpoint``, the same
with ``distribute_saved_activations=True`` (the saved input split over the TP group, gathered back
before the recompute: its collectives are recorded), ``torch.utils.checkpoint``."""


def recompute_run(dims, tp: int, device: str = "cpu", keep_tensors: bool = True) -> dict:
    """The layer run each of :data:`MODES` from the same RNG state: forward, ``sum(y²)`` backward.
    Per mode: saved activation bytes after forward and during backward, the layer's forward runs,
    and whether output, input gradient and every parameter gradient equal the plain run's."""
    import torch.utils.checkpoint as torch_checkpoint
    from megatron.core import tensor_parallel

    from snippets.record import recorder
    from snippets.tp.rng import SavedTensors, count_forwards

    layer = build_layer(dims, tp, device)
    x0, causal = _inputs(dims, device)

    def forward(h):
        return layer(h, attention_mask=causal)[0]

    out, ref = {}, None
    for mode in MODES:
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        reseed()
        # distribute_saved_activations swaps .data of the saved input in backward, which needs the
        # saved tensor itself back: under saved_tensors_hooks autograd hands back another object
        # (seen: a shape error), so that mode runs unhooked and reports the saved input's storage.
        hooked = mode != "distributed"
        with (
            SavedTensors(layer.parameters()) if hooked else contextlib.nullcontext() as saved,
            count_forwards(layer) as runs,
            recorder.record() as calls,
        ):
            if mode == "plain":
                y = forward(x)
            elif mode in ("megatron", "distributed"):
                y = tensor_parallel.checkpoint(forward, mode == "distributed", x)
            else:
                y = torch_checkpoint.checkpoint(forward, x, use_reentrant=True)
            after_forward = saved.nbytes() if hooked else x.untyped_storage().nbytes()
            forward_runs = list(runs)
            loss = y.pow(2).sum()
            if hooked:
                saved.mark()  # what backward saves from here on: the recompute's graph
            before = _generator_states()
            loss.backward()
            kept = [torch.equal(a, b) for a, b in zip(before, _generator_states())]
        got = dict(y=y.detach(), x=x.grad, **{n: p.grad for n, p in layer.named_parameters()})
        ref = ref or got
        out[mode] = dict(
            saved=after_forward,
            recompute_saved=(saved.nbytes(phase=1) if hooked else "—") if mode != "plain" else 0,
            forward_runs=forward_runs,
            backward_runs=runs[len(forward_runs) :],
            generators_kept=kept,
            same_y=torch.equal(got["y"], ref["y"]),
            same_dx=torch.equal(got["x"], ref["x"]),
            same_grads=all(torch.equal(got[n], ref[n]) for n in got if n not in ("y", "x")),
            max_grad_diff=max((got[n] - ref[n]).abs().max().item() for n in got if n != "y"),
            # the checkpoint's own collectives (the layer's TP all-reduces are note 11's)
            calls=[c for c in calls if "tensor_parallel/utils.py" in c.where],
        )
        if keep_tensors:
            out[mode]["tensors"] = got
    out["input_bytes"] = x0.nelement() * x0.element_size()
    return out


def without_output_run(dims, tp: int, device: str = "cpu") -> dict:
    """The layer's ``input_layernorm`` -> ``self_attention`` as ``TransformerLayer`` runs them under
    selective ``layernorm`` recompute: plain, then with ``CheckpointWithoutOutput(fp8=None)``, the
    norm's output discarded after attention and recomputed by a hook on attention's output. Also what
    the default ``CheckpointWithoutOutput()`` does on this machine."""
    from megatron.core.tensor_parallel import CheckpointWithoutOutput

    from snippets.tp.rng import SavedTensors, count_forwards

    layer = build_layer(dims, tp, device)
    x0, causal = _inputs(dims, device)
    out, ref = {}, None
    for mode in ("plain", "without_output"):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        reseed()
        with SavedTensors(layer.parameters()) as saved, count_forwards(layer.input_layernorm) as runs:
            if mode == "plain":
                normed = layer.input_layernorm(x)
                y, _ = layer.self_attention(normed, attention_mask=causal)
            else:
                ckpt = CheckpointWithoutOutput(fp8=None)
                normed = ckpt.checkpoint(layer.input_layernorm, x)
                y, _ = layer.self_attention(normed, attention_mask=causal)
                ckpt.discard_output_and_register_recompute(y)
            after_forward, normed_bytes = saved.nbytes(), normed.untyped_storage().nbytes()
            forward_runs = len(runs)
            y.pow(2).sum().backward()
        got = dict(
            y=y.detach(), x=x.grad, **{n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
        )
        ref = ref or got
        out[mode] = dict(
            saved=after_forward,
            normed_bytes=normed_bytes,
            norm_runs=[forward_runs, len(runs) - forward_runs],
            same=all(torch.equal(got[n], ref[n]) for n in ref),
        )
    out["fp8_flag"] = {repr(arg): CheckpointWithoutOutput(fp8=arg).fp8 for arg in (False, True, None)}
    out["default"] = CheckpointWithoutOutput().fp8
    try:
        CheckpointWithoutOutput().checkpoint(layer.input_layernorm, x0.clone().requires_grad_())
        out["default_error"] = None
    except NameError as error:  # no Transformer Engine: the TE branch names what is not imported
        out["default_error"] = f"NameError: {error}"
    # the same default object, as TransformerLayer builds it under selective "layernorm" recompute
    selective = build_layer(
        dims, tp, device, recompute_granularity="selective", recompute_modules=["layernorm"]
    )
    try:
        selective(x0.clone().requires_grad_(), attention_mask=causal)
        out["layer_error"] = None
    except NameError as error:
        out["layer_error"] = f"NameError: {error}"
    return out


def run(dims, par) -> dict:
    """On every rank (the runner): the streams, the masks and both recompute runs, no tensors."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tp, expert_model_parallel_size=par.ep
    )
    return dict(
        streams=seeds_and_masks(par.device),
        recompute=recompute_run(dims, par.tp, par.device, keep_tensors=False),
        without_output=without_output_run(dims, par.tp, par.device),
    )


# ----------------------------------------------------------------------------- note 24's tables


def seeds_table(rows: list[dict]) -> Table:
    return Table(
        ["rank", "tp / ep / etp / dp rank", *(f"`{name}`" for name in STREAMS), "= 公式"],
        [
            [
                r["rank"],
                f"{r['tp_rank']} / {r['ep_rank']} / {r['etp_rank']} / {r['dp_rank']}",
                *(r["seeds"][name] for name in STREAMS),
                r["formula"],
            ]
            for r in rows
        ],
    )


def sharing_table(rows: list[dict]) -> Table:
    """Per stream: the sets of ranks that got the same seed, beside the group they coincide with."""
    from snippets.tp.rng import ranks_sharing

    same_as = {"data-parallel-rng": None, "model-parallel-rng": "dp_group", "expert-parallel-rng": None}
    out = []
    for name in STREAMS:
        sharing = ranks_sharing(rows, name)
        group = same_as[name]
        groups = sorted({tuple(r[group]) for r in rows}) if group else None
        out.append([f"`{name}`", sharing, [list(g) for g in groups] if groups else "—"])
    return Table(["流", "种子相同的 rank", "DP 群（对照）"], out)


def pairs_table(rows: list[dict]) -> Table:
    from snippets.tp.rng import mask_pairs

    return Table(["rank 对", "同一 TP rank", "fork() 里 mask 相同", "fork() 外 mask 相同"], mask_pairs(rows))


MODE_NAMES = {
    "plain": "不重算",
    "megatron": "`tensor_parallel.checkpoint`",
    "distributed": "同上，`distribute_saved_activations=True`",
    "torch": "`torch.utils.checkpoint`",
}


def recompute_table(result: dict) -> Table:
    return Table(
        [
            "方式",
            "forward 后保存的激活（字节）",
            "backward 里重算时保存（字节）",
            "layer.forward 次数 fwd / bwd",
            "输出 = 不重算",
            "输入梯度 = 不重算",
            "参数梯度 = 不重算",
        ],
        [
            [
                MODE_NAMES[mode],
                r["saved"],
                r["recompute_saved"],
                f"{len(r['forward_runs'])} / {len(r['backward_runs'])}",
                r["same_y"],
                r["same_dx"],
                r["same_grads"],
            ]
            for mode, r in ((m, result[m]) for m in MODES)
        ],
    )


def checkpoint_comm_table(result: dict) -> Table:
    """The collectives of ``checkpoint(..., distribute_saved_activations=True)`` (roadmap record)."""
    from snippets.tp.layer_walk import record_table

    meaning = {
        ("all_gather_into_tensor", "tensor_parallel/utils.py::gather_split_1d_tensor"): (
            "重算前把各 TP rank 存的 1/TP 输入拼回完整的 [s·b·h]"
        )
    }
    return record_table(result["distributed"]["calls"], meaning)


def without_output_table(result: dict) -> Table:
    return Table(
        [
            "方式",
            "forward 后保存的激活（字节）",
            "norm 输出的存储（字节）",
            "norm 运行次数 fwd / bwd",
            "输出与梯度 = 不重算",
        ],
        [
            [
                "不重算" if mode == "plain" else "`CheckpointWithoutOutput(fp8=None)`",
                r["saved"],
                r["normed_bytes"],
                f"{r['norm_runs'][0]} / {r['norm_runs'][1]}",
                r["same"],
            ]
            for mode, r in ((m, result[m]) for m in ("plain", "without_output"))
        ],
    )


def tables(results: list, dims, par) -> list:
    streams = [r["streams"] for r in results]
    rank0 = results[0]
    return [
        f"每个 rank 的三条流的种子（seed {SEED}，TP={par.tp}，EP={par.ep}）:",
        seeds_table(streams),
        sharing_table(streams),
        f"dropout mask（p={DROPOUT}，{MASK} 个元素）在 fork() 里外，逐对 rank 比较:",
        pairs_table(streams),
        f"一个 TransformerLayer（rank 0，TP={par.tp}）三种跑法:",
        recompute_table(rank0["recompute"]),
        "distribute_saved_activations=True 的通信（rank 0）:",
        checkpoint_comm_table(rank0["recompute"]),
        "input_layernorm 用 CheckpointWithoutOutput（rank 0）:",
        without_output_table(rank0["without_output"]),
        f"CheckpointWithoutOutput(fp8=...).fp8: {rank0['without_output']['fp8_flag']}; "
        f"默认构造: {rank0['without_output']['default_error'] or 'ok'}; "
        f"selective layernorm 重算的 TransformerLayer: {rank0['without_output']['layer_error'] or 'ok'}",
    ]
