"""Note 10's experiment: Megatron's ``ColumnParallelLinear`` / ``RowParallelLinear`` at any size.

A column layer ``hidden -> ffn`` (like ``linear_fc1``) and a row layer ``ffn -> hidden`` (like
``linear_fc2``), built the way Megatron builds them (a ``ModelParallelConfig`` and an
``init_method``), in the six configurations of :data:`CASES`. On every rank ``run_cases`` feeds
each one this rank's part of one full input ``X`` and upstream gradient ``G`` (:func:`inputs`, the
same on every rank), records every collective of its forward and backward, and does the same with
our own layers from :mod:`snippets.tp.tp_linear` on the same master weight. ``weight_layout`` reads
which rows and columns of the master weight each rank holds. Note 10 calls these at its sizes
(``tiny``: hidden 8, ffn 16, ``[s, b] = [4, 2]``) and compares with one dense ``nn.Linear``;
``python -m snippets.run linear --dims qwen3-8b --tp 8`` runs them at a real layer's sizes.
"""

from __future__ import annotations

import torch

from snippets.record import recorder
from snippets.record.tables import Table

CASES = {  # configuration: (layer, constructor arguments, X split along, Y split along; None = whole)
    "Column, gather_output=False": ("column", dict(gather_output=False), None, -1),
    "Column, gather_output=True": ("column", dict(gather_output=True), None, None),
    "Row, input_is_parallel=True": ("row", dict(input_is_parallel=True), -1, None),
    "Row, input_is_parallel=False": ("row", dict(input_is_parallel=False), None, None),
    "Column, SP": ("column", dict(sequence_parallel=True), 0, -1),
    "Row, SP": ("row", dict(input_is_parallel=True, sequence_parallel=True), -1, 0),
}
"""Note 10's six configurations, and how this rank's input and output relate to the full ones."""


def build(
    dims,
    kind,
    tp,
    gather_output=False,
    input_is_parallel=True,
    sequence_parallel=False,
    init_method=None,
    device="cpu",
):
    """The real layer on this rank: ``ColumnParallelLinear(hidden, ffn)`` or
    ``RowParallelLinear(ffn, hidden)``, with a bias, initialized on the CPU from one master weight
    (kept, so our own layer and the probes can use it), then moved to ``device``."""
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.utils import init_method_normal

    config = ModelParallelConfig(
        tensor_model_parallel_size=tp, use_cpu_initialization=True, sequence_parallel=sequence_parallel
    )
    init_method = init_method or init_method_normal(0.02)
    torch.manual_seed(0)
    if kind == "column":
        layer = ColumnParallelLinear(
            dims.hidden,
            dims.ffn,
            config=config,
            init_method=init_method,
            bias=True,
            gather_output=gather_output,
            keep_master_weight_for_test=True,
        )
    else:
        layer = RowParallelLinear(
            dims.ffn,
            dims.hidden,
            config=config,
            init_method=init_method,
            bias=True,
            input_is_parallel=input_is_parallel,
            skip_bias_add=False,
            keep_master_weight_for_test=True,
        )
    return layer.to(device)


def inputs(dims, device="cpu"):
    """The full input ``X``, upstream gradient ``G`` and bias of each layer (Megatron initializes
    biases to 0; a random one shows where it is added), identical on every rank and in the note."""
    g = torch.Generator().manual_seed(0)
    s, b = dims.seq, dims.micro_batch_size
    X = {
        "column": torch.randn(s, b, dims.hidden, generator=g),
        "row": torch.randn(s, b, dims.ffn, generator=g),
    }
    G = {
        "column": torch.randn(s, b, dims.ffn, generator=g),
        "row": torch.randn(s, b, dims.hidden, generator=g),
    }
    BIAS = {"column": torch.randn(dims.ffn, generator=g), "row": torch.randn(dims.hidden, generator=g)}
    return tuple({k: v.to(device) for k, v in t.items()} for t in (X, G, BIAS))


def part(t, dim, tp, r):
    """This rank's part of ``t``: all of it (``dim`` None) or its chunk along ``dim``."""
    return t if dim is None else t.chunk(tp, dim)[r]


def _model_parallel(tp):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    return parallel_state.get_tensor_model_parallel_group(), parallel_state.get_tensor_model_parallel_rank()


def weight_layout(dims, tp, device="cpu"):
    """Which rows and columns of the master weight this rank's shard holds, per layer.

    Two probes as ``init_method``: master[i, j] = i, then master[i, j] = j; the shard then names
    its rows and columns itself (exact in fp32 up to 2**24, any real layer's size).
    """

    def rows_probe(master):
        with torch.no_grad():
            master.copy_(torch.arange(master.shape[0]).unsqueeze(1).expand_as(master))

    def cols_probe(master):
        with torch.no_grad():
            master.copy_(torch.arange(master.shape[1]).expand_as(master))

    _model_parallel(tp)
    out = []
    for kind in ("column", "row"):
        layer = build(dims, kind, tp, init_method=rows_probe, device=device)
        rows = sorted(set(layer.weight[:, 0].int().tolist()))
        cols = sorted(
            set(build(dims, kind, tp, init_method=cols_probe, device=device).weight[0, :].int().tolist())
        )
        out.append(
            dict(
                kind=kind,
                weight=list(layer.weight.shape),
                bias=list(layer.bias.shape),
                master=list(layer.master_weight.shape),
                rows=rows,
                cols=cols,
                partition_dim=layer.weight.partition_dim,
                bias_split=getattr(layer.bias, "tensor_model_parallel", False),
            )
        )
    return out


def run_cases(dims, tp, device="cpu", keep_tensors=True):
    """Every configuration of :data:`CASES` on this rank: the real layer and ours ("ours",
    :mod:`snippets.tp.tp_linear`) on the same master weight, one recorded forward and backward each.

    Per (configuration, "real" / "ours"): the collectives, ``allreduce_dgrad``, whether the bias is
    marked ``sequence_parallel``, and whether ours gave the same numbers; with ``keep_tensors`` also
    the weight, output and the three gradients (note 10 compares them with a dense layer).
    """
    from snippets.tp import tp_linear

    group, r = _model_parallel(tp)
    X, G, BIAS = inputs(dims, device)
    out = {}
    for name, (kind, kwargs, x_dim, y_dim) in CASES.items():
        real = build(dims, kind, tp, device=device, **kwargs)
        with torch.no_grad():
            real.bias.copy_(part(BIAS[kind], 0 if kind == "column" else None, tp, r))
        ours = (tp_linear.ColumnParallelLinear if kind == "column" else tp_linear.RowParallelLinear)(
            *((dims.hidden, dims.ffn) if kind == "column" else (dims.ffn, dims.hidden)),
            tp_group=group,
            master_weight=real.master_weight.to(device),
            master_bias=BIAS[kind],
            **kwargs,
        ).to(device)
        for who, layer in (("real", real), ("ours", ours)):
            x = part(X[kind], x_dim, tp, r).clone().requires_grad_()
            with recorder.record() as calls:
                y = layer(x)
                y = y[0] if isinstance(y, tuple) else y  # Megatron's layers return (output, bias)
                y.backward(part(G[kind], y_dim, tp, r))
            out[name, who] = dict(
                w=layer.weight.detach(),
                y=y.detach(),
                dx=x.grad,
                dw=layer.weight.grad,
                db=layer.bias.grad,
                calls=calls,
                allreduce_dgrad=getattr(layer, "allreduce_dgrad", None),
                bias_sequence_parallel=getattr(layer.bias, "sequence_parallel", None),
            )
        mine, theirs = out[name, "ours"], out[name, "real"]
        mine["same"] = [torch.allclose(mine[k], theirs[k], atol=1e-6) for k in ("y", "dx", "dw", "db")]
        if not keep_tensors:
            for who in ("real", "ours"):
                for key in ("w", "y", "dx", "dw", "db"):
                    del out[name, who][key]
    return out


def run(dims, par) -> dict:
    """On every rank (the runner): the weight layout, then every configuration, without tensors."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    return dict(
        layout=weight_layout(dims, par.tp, par.device),
        cases=run_cases(dims, par.tp, par.device, keep_tensors=False),
    )


# ----------------------------------------------------------------------------- note 10's tables

IN_LAYER = {
    (
        "tensor_parallel/layers.py::backward",
        "all_reduce",
        "backward",
    ): "f 的反向，融合在 linear 的 backward 里：各 rank 的输入梯度相加",
    (
        "tensor_parallel/layers.py::forward",
        "all_gather_into_tensor",
        "forward",
    ): "SP：沿 sequence 收齐输入，再做矩阵乘",
    (
        "tensor_parallel/layers.py::backward",
        "all_gather_into_tensor",
        "backward",
    ): "SP：反向再收齐一次输入，用来算权重梯度",
    (
        "tensor_parallel/layers.py::backward",
        "reduce_scatter_tensor",
        "backward",
    ): "SP：输入梯度相加，并按 sequence 切回各 rank",
    (
        "tensor_parallel/mappings.py::_gather_along_last_dim",
        "all_gather_into_tensor",
        "backward",
    ): "scatter 的反向：沿最后一维收齐输入梯度",
    (
        "tensor_parallel/mappings.py::_gather_along_first_dim",
        "all_gather_into_tensor",
        "backward",
    ): "reduce-scatter 的反向：沿 sequence 收齐输出梯度",
}
"""What a collective issued inside the layers means, by (issuer, API, phase); else recorder's."""

KIND = {
    "all_reduce": "AR",
    "all_gather": "AG",
    "all_gather_into_tensor": "AG",
    "reduce_scatter": "RS",
    "reduce_scatter_tensor": "RS",
}


def span(values):
    return f"{values[0]}–{values[-1]}" if values == list(range(values[0], values[-1] + 1)) else str(values)


def layout_table(layouts: dict) -> Table:
    """``layouts``: TP size -> every rank's :func:`weight_layout`."""
    return Table(
        [
            "层",
            "TP",
            "rank",
            "weight（本 rank）",
            "主权重的行",
            "主权重的列",
            "partition_dim",
            "bias",
            "bias 切分",
            "主权重（每个 rank 都造）",
        ],
        [
            [
                d["kind"],
                tp,
                r,
                d["weight"],
                span(d["rows"]),
                span(d["cols"]),
                d["partition_dim"],
                d["bias"],
                d["bias_split"],
                d["master"],
            ]
            for i in (0, 1)
            for tp, ranks in layouts.items()
            for r, per_rank in enumerate(ranks)
            for d in [per_rank[i]]
        ],
    )


def comm_table(res, who="real") -> Table:
    """Rank 0's collectives in every configuration (``res``: every rank's :func:`run_cases`)."""
    rows = []
    for name in CASES:
        calls = res[0][name, who]["calls"]
        for c in calls or [None]:
            if c is None:
                rows.append([name, "—", "不通信", "—", "—", "—", "—", ""])
                continue
            meaning = IN_LAYER.get((c.where, c.api, c.phase), recorder.MEANINGS.get(c.where, ""))
            rows.append(
                [
                    name,
                    c.phase,
                    c.api,
                    f"{c.group} {list(c.ranks)}",
                    c.before,
                    c.after,
                    c.where.split("/")[-1],
                    meaning,
                ]
            )
    return Table(["配置", "phase", "API", "group", "通信前", "通信后", "发出者", "含义"], rows)


def kinds(calls, phase):
    return " ".join(KIND[c.api] for c in calls if c.phase == phase) or "—"


def kinds_table(res) -> Table:
    return Table(
        ["配置", "Megatron 正向", "Megatron 反向", "ours 正向", "ours 反向"],
        [
            [name]
            + [
                kinds(res[0][name, who]["calls"], phase)
                for who in ("real", "ours")
                for phase in ("forward", "backward")
            ]
            for name in CASES
        ],
    )


def ours_vs_real_rows(tp, res):
    return [[tp, name] + [all(r[name, "ours"]["same"][i] for r in res) for i in range(4)] for name in CASES]


def tables(results: list, dims, par) -> list:
    res = [r["cases"] for r in results]
    return [
        layout_table({par.tp: [r["layout"] for r in results]}),
        f"TP={par.tp} 的通信（rank 0）:",
        comm_table(res),
        Table(["TP", "配置", "输出", "输入梯度", "权重梯度", "bias 梯度"], ours_vs_real_rows(par.tp, res)),
        kinds_table(res),
    ]
