"""Note 11's experiment: one real ``TransformerLayer`` under tensor parallelism, at any size.

``run`` builds the layer from the local spec (``get_gpt_layer_local_spec``) at ``dims``, wraps it
in DDP, runs one forward and backward without and -- when TP > 1 -- with sequence parallel,
recording every collective and the submodule that issued it (:mod:`snippets.tp.layer_walk`), then
``finalize_model_grads``. At note 11's sizes (``tiny``) ``tables`` prints the note's tables cell for
cell; at ``--dims qwen3-8b`` the weight table is the note's Qwen3-8B table and the communication
tables show the real shapes, ``[4096, 1, 4096]`` activations instead of ``[8, 2, 32]``.
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table
from snippets.tp.layer_walk import (
    WALK,
    apis,
    collectives_by_submodule,
    kind_of,
    only_in,
    owner_of,
    record_table,
    short,
    unattributed,
    weight_rows,
)

TRACED = [
    "input_layernorm",
    "self_attention",
    "self_attention.linear_qkv",
    "self_attention.core_attention",
    "self_attention.linear_proj",
    "pre_mlp_layernorm",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
]
"""Submodules whose collectives are attributed, in forward order (note 11)."""

MEANING = {
    ("all_reduce", "tensor_parallel/mappings.py::_reduce"): "g：行并行输出的部分和相加",
    ("all_reduce", "tensor_parallel/layers.py::backward"): "f 的 backward：输入梯度的部分和相加",
    ("all_gather_into_tensor", "tensor_parallel/layers.py::forward"): "SP：把 s 分片的输入拼回完整 s",
    (
        "reduce_scatter_tensor",
        "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim",
    ): "SP 的 g：部分和相加并按 s 切回各卡",
    (
        "all_gather_into_tensor",
        "tensor_parallel/mappings.py::_gather_along_first_dim",
    ): "reduce-scatter 的 backward：输出梯度拼回完整 s",
    ("all_gather_into_tensor", "tensor_parallel/layers.py::backward"): "再拼一次输入，算 weight 梯度用",
    (
        "reduce_scatter_tensor",
        "tensor_parallel/layers.py::backward",
    ): "all-gather 的 backward：输入梯度相加并按 s 切回",
}
"""What each (API, issuer) means in one layer (note 11's table)."""

FEWER_GROUPS_THAN_TP = {
    (
        "all_gather_into_tensor",
        "tensor_parallel/mappings.py::_gather_along_last_dim",
        "forward",
    ): "拼回完整宽度的 QKV 输出，再挑本卡的 group",
    (
        "reduce_scatter_tensor",
        "tensor_parallel/mappings.py::_reduce_scatter_along_first_dim",
        "backward",
    ): "上一行的 backward：梯度相加，按最后一维切回",
}
"""With fewer query groups than TP ranks, ``SelfAttention`` gathers the whole QKV output first."""


def meaning(call) -> str:
    return FEWER_GROUPS_THAN_TP.get(
        (call.api, call.where, call.phase), MEANING.get((call.api, call.where), "")
    )


def build_layer(dims, tp: int, sequence_parallel: bool = False, device: str = "cpu"):
    """The real layer at ``dims`` on this rank's TP group (model parallel must be initialized).

    On CPU the weights come from ``use_cpu_initialization`` (the full matrix, then this rank's
    slice: independent of TP); on a GPU Megatron initializes each shard on the device. On
    ``"meta"`` (note 11's Qwen3-8B layer) the same path gives parameters with shapes and no storage.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    model_parallel_cuda_manual_seed(123)
    kwargs = dims.transformer_config_kwargs()
    kwargs["num_layers"] = 1
    config = TransformerConfig(
        **kwargs,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        use_cpu_initialization=device != "cuda",
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=kwargs["normalization"])
    torch.manual_seed(0)
    with torch.device(device):
        return build_module(spec, config=config, layer_number=1), config


def forward_backward(
    layer, config, dims, sequence_parallel: bool, device: str = "cpu", keep_tensors: bool = False
) -> dict:
    """One DDP forward + backward of ``layer`` and ``finalize_model_grads``, recorded; returns
    only what the tables need (strings and shapes), so it is small at any size -- and with
    ``keep_tensors`` also the output, input gradient, parameters, gradients before and after
    ``finalize_model_grads`` and the recorded calls (note 11 compares them with TP=1)."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    from snippets.record import recorder

    model = DistributedDataParallel(config, DistributedDataParallelConfig(), module=layer)
    s, b = dims.seq, dims.micro_batch_size
    x = torch.randn(s, b, dims.hidden, generator=torch.Generator().manual_seed(1))
    if sequence_parallel:
        x = x.chunk(config.tensor_model_parallel_size)[parallel_state.get_tensor_model_parallel_rank()]
    x = x.to(device).clone().requires_grad_()
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=device), diagonal=1)
    with recorder.record() as calls, collectives_by_submodule(layer, calls, TRACED) as by_module:
        y, _ = model(x, attention_mask=causal)
        y.pow(2).sum().backward()
    before = {n: p.main_grad.clone() for n, p in layer.named_parameters()} if keep_tensors else None
    with recorder.record() as finalize_calls:
        finalize_model_grads([model])
    out = dict(
        calls=len(calls),
        missing=len(unattributed(calls, by_module)),
        apis={
            name: {phase: apis(only_in(by_module, name, phase)) for phase in ("forward", "backward")}
            for name in TRACED
        },
        comm=record_table(calls, meaning, owner_of(by_module)),
        finalize=[[c.api, f"{c.group} {list(c.ranks)}", c.before, c.where] for c in finalize_calls],
    )
    if keep_tensors:
        out.update(
            y=y.detach(),
            dx=x.grad,
            before=before,
            params=dict(layer.named_parameters()),
            grads={n: p.main_grad.clone() for n, p in layer.named_parameters()},
            recorded=calls,
            by_module=by_module,
        )
    return out


def weights_of(layer) -> dict:
    """This rank's weights of ``layer`` (name, shape, split, count), each submodule's class, and
    the heads / query groups this rank holds: what ``weight_table`` prints."""
    attn = layer.self_attention
    return dict(
        rows=weight_rows(layer),
        kinds={path: kind_of(layer, path) for path, _ in WALK},
        heads=attn.num_attention_heads_per_partition,
        groups=attn.num_query_groups_per_partition,
        device=str(attn.linear_qkv.weight.device),
    )


def layer_on_meta(dims, tp: int) -> dict:
    """On every rank: the real layer at ``dims`` on ``torch.device("meta")`` (shapes, no storage:
    Qwen3-8B's 193M parameters build in a second) and its weights (note 11's first picture)."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    layer, _ = build_layer(dims, tp, device="meta")
    return weights_of(layer)


def run(dims, par, keep_tensors: bool = False) -> dict:
    """On every rank: the layer's weights, then one recorded step without and with SP."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    out = {}
    for sp in [False, True] if par.tp > 1 else [False]:
        layer, config = build_layer(dims, par.tp, sp, par.device)
        if not sp:
            out["weights"] = weights_of(layer)
        out[sp] = forward_backward(layer, config, dims, sp, par.device, keep_tensors)
        del layer
    return out


def weight_table(weights: dict) -> Table:
    """Note 11's per-submodule weight table (one rank)."""

    def weight_of(path):
        return next(
            (
                [r["shape"], r["split"], r["numel"]]
                for r in weights["rows"]
                if r["name"].startswith(path + ".")
            ),
            ["—", "—", 0],
        )

    return Table(
        ["子模块", "类", "每卡 weight [out, in]", "切分", "每卡参数"],
        [[short(path), weights["kinds"][path], *weight_of(path)] for path, _ in WALK],
    )


def submodule_table(r0: dict, tp: int) -> Table:
    """Which collectives each submodule issues itself, forward and backward, without / with SP."""
    runs = [(f"TP={tp}", r0[False])] + ([("SP", r0[True])] if True in r0 else [])
    headers = ["子模块"] + [f"{label} {phase}" for label, _ in runs for phase in ("forward", "backward")]
    return Table(
        headers,
        [
            [short(name) + (" 自身" if name == "self_attention" else "")]
            + [run["apis"][name][phase] for _, run in runs for phase in ("forward", "backward")]
            for name in TRACED
        ],
    )


def tables(results: list, dims, par) -> list:
    r0 = results[0]
    w = r0["weights"]
    out = [
        f"rank 0: 每卡 Q head: {w['heads']}  每卡 query group（= KV head）: {w['groups']}",
        weight_table(w),
    ]
    counts = f"TP={par.tp}: {r0[False]['calls']} 次通信，未归属的: {r0[False]['missing']}"
    if True in r0:
        counts += f"  | SP: {r0[True]['calls']} 次通信，未归属的: {r0[True]['missing']}"
    out += [counts, submodule_table(r0, par.tp), f"TP={par.tp} 的通信（rank 0）:", r0[False]["comm"]]
    if True in r0:
        out += ["开 sequence parallel 的通信（rank 0）:", r0[True]["comm"]]
    last = r0[True] if True in r0 else r0[False]
    out += [
        "finalize_model_grads 的通信（rank 0）:",
        Table(["API", "group", "shape", "issued by"], last["finalize"]),
    ]
    return out
