"""Note 28's experiment: what the CPU can run of the mechanisms that only pay off on GPUs.

``run`` (on every rank, 4 gloo ranks in the note) does three things in one launch:

* **TP communication overlap.** With ``tp_comm_overlap`` Transformer Engine hides each sequence
  parallel all-gather / reduce-scatter of a layer behind a GEMM (its userbuffers). The local layer
  issues the very same collectives, so one recorded forward + backward of a real ``TransformerLayer``
  (note 11's, TP=2 with sequence parallel) lists what TE would pair: each call's group and shapes,
  the TE userbuffer it maps to (``qkv_fprop``, ``proj_dgrad``, ...) and TE's default method for it.
* **The FP8 amax reduction group**: ``parallel_state.get_amax_reduction_group`` with and without
  ``tp_only_amax_red``, as ``get_fp8_context`` asks for it.
* **``combined_1f1b``** (``overlap_moe_expert_parallel_comm``): a real MoE ``GPTModel`` (EP=2,
  alltoall dispatcher) through ``get_forward_backward_func()``. Unchanged it stops at its first line
  on a CPU (``set_streams`` makes a CUDA stream); :func:`cpu_streams` then gives the schedule's
  modules stand-in streams and events that only carry a name, so the real schedule runs and
  :func:`record_nodes` lists every node it runs, in order, with its micro-batch, layer, stream and
  all-to-alls. The same model then runs the plain schedule: the gradients must not change.

The FP8 scaling arithmetic (:func:`delayed_scaling`, :func:`quantize`) and the CUDA-graph
refusals (:func:`cuda_graph_refusals`) need no ranks: the note calls them in its own process.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from functools import partial

import torch

from snippets.record.tables import Table

# ---------------------------------------------------------------- TP overlap: what TE would pair

TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"
"""The TransformerEngine commit the userbuffer names and methods below were read at."""

UB_METHOD = {
    "qkv_fprop": "ring_exchange",
    "fc1_fprop": "ring_exchange",
    "proj_dgrad": "ring_exchange",
    "fc2_dgrad": "ring_exchange",
    "proj_fprop": "pipeline",
    "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk",
    "qkv_wgrad": "bulk",
    "fc1_dgrad": "bulk",
    "fc1_wgrad": "bulk",
    "proj_wgrad": "external",
    "fc2_wgrad": "external",
}
"""TE ``initialize_ub``'s default method per userbuffer (``methods``, module/base.py:350 at
:data:`TE_COMMIT`)."""

UB_OF = {
    ("forward", "linear_qkv", "all_gather_into_tensor"): ("qkv_fprop", "QKV 的 fprop GEMM"),
    ("forward", "linear_proj", "reduce_scatter_tensor"): ("proj_fprop", "proj 的 fprop GEMM"),
    ("forward", "linear_fc1", "all_gather_into_tensor"): ("fc1_fprop", "fc1 的 fprop GEMM"),
    ("forward", "linear_fc2", "reduce_scatter_tensor"): ("fc2_fprop", "fc2 的 fprop GEMM"),
    ("backward", "linear_fc2", "all_gather_into_tensor"): ("fc2_dgrad", "fc2 的 dgrad GEMM"),
    ("backward", "linear_fc1", "all_gather_into_tensor"): ("fc1_dgrad", "fc1 的 dgrad GEMM"),
    ("backward", "linear_fc1", "reduce_scatter_tensor"): ("fc1_wgrad", "fc1 的 wgrad GEMM"),
    ("backward", "linear_proj", "all_gather_into_tensor"): ("proj_dgrad", "proj 的 dgrad GEMM"),
    ("backward", "linear_qkv", "all_gather_into_tensor"): ("qkv_dgrad", "QKV 的 dgrad GEMM"),
    ("backward", "linear_qkv", "reduce_scatter_tensor"): ("qkv_wgrad", "QKV 的 wgrad GEMM"),
}
"""(phase, submodule, collective) of the local layer -> (TE userbuffer, the GEMM it hides behind).
In the local layer the two backward calls of a column-parallel linear are already asynchronous
(layers.py: the all-gather runs under the dgrad GEMM, the reduce-scatter under the wgrad GEMM);
the forward ones block."""

LINEARS = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


def tp_overlap_calls(dims, tp: int, device: str = "cpu") -> list[list]:
    """On every rank (model parallel initialized with ``tp``): one recorded forward + backward of
    note 11's layer with sequence parallel; one row per collective a linear issued."""
    from snippets.experiments.n11_tp_layer import build_layer
    from snippets.record import recorder
    from snippets.tp.layer_walk import collectives_by_submodule, owner_of

    layer, config = build_layer(dims, tp, sequence_parallel=True, device=device)
    from megatron.core import parallel_state

    x = torch.randn(dims.seq, dims.micro_batch_size, dims.hidden, generator=torch.Generator().manual_seed(1))
    x = x.chunk(tp)[parallel_state.get_tensor_model_parallel_rank()].to(device).clone().requires_grad_()
    causal = torch.triu(torch.ones(1, 1, dims.seq, dims.seq, dtype=torch.bool, device=device), diagonal=1)
    with recorder.record() as calls, collectives_by_submodule(layer, calls, LINEARS) as by_module:
        y, _ = layer(x, attention_mask=causal)
        y.pow(2).sum().backward()
    owner = owner_of(by_module)
    rows = []
    for c in calls:
        name = owner.get(id(c), "").split(".")[-1]
        rows.append([c.phase, name, c.api, f"{c.group} {list(c.ranks)}", f"{c.before} → {c.after}", c.where])
    return rows


def overlap_table(rows: list[list]) -> Table:
    """Each recorded collective beside the TE userbuffer and GEMM that ``tp_comm_overlap`` pairs it with."""
    out = []
    for phase, name, api, group, shapes, _where in rows:
        ub, gemm = UB_OF.get((phase, name, api), ("—", "—"))
        out.append(
            [
                phase,
                name,
                api.replace("_into_tensor", "").replace("_tensor", ""),
                group,
                shapes,
                gemm,
                ub,
                UB_METHOD.get(ub, "—"),
            ]
        )
    return Table(
        ["阶段", "子模块", "collective", "group", "shape", "与之重叠的 GEMM", "TE userbuffer", "TE 默认方法"],
        out,
    )


# ------------------------------------------------------------------------ FP8: the amax group


def amax_groups() -> dict:
    """The ranks of the groups ``get_fp8_context`` can hand to TE as the amax reduction group."""
    from megatron.core import parallel_state

    def ranks(group):
        return torch.distributed.get_process_group_ranks(group)

    return {
        "默认（tp_only_amax_red=False）": ranks(
            parallel_state.get_amax_reduction_group(with_context_parallel=True)
        ),
        "tp_only_amax_red=True": ranks(
            parallel_state.get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red=True)
        ),
        "TP 群": ranks(parallel_state.get_tensor_model_parallel_group()),
        "DP 群": ranks(parallel_state.get_data_parallel_group()),
    }


# ------------------------------------------------------------------ FP8 scaling arithmetic (CPU)

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
"""The largest finite value of each format (TE's ``Format``; torch.finfo says the same)."""

DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def quantize(x: torch.Tensor, scale, fmt: str = "e4m3") -> torch.Tensor:
    """Scale, cast to FP8 and back (what a GEMM's operand becomes). TE's cast saturates at the
    format's maximum (CUDA's satfinite conversion); torch's E5M2 cast overflows to inf instead, so
    clamp first."""
    m = FP8_MAX[fmt]
    scaled = (x.float() * scale).clamp(-m, m)
    return scaled.to(DTYPE[fmt]).float() / scale


def rel_error(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.float() - y).norm() / x.float().norm())


def saturated(x: torch.Tensor, scale, fmt: str = "e4m3") -> int:
    """How many elements hit the format's maximum after scaling (clipped)."""
    return int(((x.float() * scale).abs() > FP8_MAX[fmt]).sum())


def scale_from_amax(amax: float, fmt: str = "e4m3", margin: int = 0, previous: float = 1.0) -> float:
    """TE's default delayed-scaling factor: fp8_max / amax / 2**margin; keep the previous scale
    when amax is 0 or not finite (quantization.py ``_default_sf_compute``)."""
    if amax <= 0 or not math.isfinite(amax):
        return previous
    return FP8_MAX[fmt] / amax / 2**margin


def delayed_scaling(
    steps: list[torch.Tensor], history_len: int, algo: str, fmt: str = "e4m3", margin: int = 0
) -> list[dict]:
    """Delayed scaling over ``steps`` (one tensor per training step): each step is cast with the
    scale computed from the amax *history* of earlier steps; its own amax enters the history
    afterwards. Returns per step: the scale used, the elements clipped, the relative error."""
    history = [0.0] * history_len
    scale, out = 1.0, []
    for x in steps:
        q = quantize(x, scale, fmt)
        out.append(
            dict(
                scale=scale,
                clipped=saturated(x, scale, fmt),
                error=rel_error(x, q),
                amax=float(x.abs().max()),
            )
        )
        history = [float(x.abs().max())] + history[:-1]  # newest first
        amax = max(history) if algo == "max" else history[0]
        scale = scale_from_amax(amax, fmt, margin, scale)
    return out


def current_scaling(steps: list[torch.Tensor], fmt: str = "e4m3") -> list[dict]:
    """Tensorwise (current) scaling: the scale comes from this tensor's own amax, before the cast."""
    out = []
    for x in steps:
        scale = scale_from_amax(float(x.abs().max()), fmt)
        out.append(
            dict(scale=scale, clipped=saturated(x, scale, fmt), error=rel_error(x, quantize(x, scale, fmt)))
        )
    return out


def block_quantize(x: torch.Tensor, block: int, fmt: str = "e4m3") -> torch.Tensor:
    """One scale per ``block`` consecutive values, rounded down to a power of two (TE's blockwise
    recipe with its default power-of-2 scales uses 1x128 blocks for activations; MXFP8 uses 1x32
    blocks with an E8M0 scale, also a power of two). Returns the dequantized tensor."""
    rows = x.float().reshape(-1, block)
    amax = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    scale = torch.exp2(torch.floor(torch.log2(FP8_MAX[fmt] / amax)))
    q = (rows * scale).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(DTYPE[fmt]).float() / scale
    return q.reshape(x.shape)


def outlier_errors(x: torch.Tensor, outlier_at: int = 7) -> dict:
    """Relative error of the *other* elements when one outlier sits in ``x``: one scale for the
    whole tensor (current scaling) against one per 128 and per 32 values."""
    keep = torch.ones(x.numel(), dtype=torch.bool)
    keep[outlier_at] = False
    tensorwise = quantize(x, scale_from_amax(float(x.float().abs().max())))
    return {
        "整个 tensor 一个 scale": rel_error(x[keep], tensorwise[keep]),
        "每 128 个一个（blockwise）": rel_error(x[keep], block_quantize(x, 128)[keep]),
        "每 32 个一个（MXFP8）": rel_error(x[keep], block_quantize(x, 32)[keep]),
    }


def outlier_scales(x: torch.Tensor, outlier_at: int = 7) -> dict:
    """The scale the outlier's share of ``x`` gets, for the same three granularities as
    :func:`outlier_errors`: fp8_max / amax for the whole tensor, and the power-of-two scale of the
    128- and 32-value block that holds the outlier (:func:`block_quantize`)."""
    amax = float(x.float().abs().max())

    def block_scale(block):
        start = outlier_at // block * block
        block_amax = float(x.float()[start : start + block].abs().max())
        return 2.0 ** math.floor(math.log2(FP8_MAX["e4m3"] / block_amax))

    return {
        "整个 tensor 一个 scale": scale_from_amax(amax),
        "每 128 个一个（blockwise）": block_scale(128),
        "每 32 个一个（MXFP8）": block_scale(32),
    }


def activations(seed: int = 0, n: int = 4096, outlier: float = 0.0) -> torch.Tensor:
    """A bf16 activation-like tensor: N(0, 1), with one value replaced by ``outlier`` if given."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if outlier:
        x[7] = outlier
    return x.bfloat16()


# ----------------------------------------------------------------------- CUDA graphs: refusals

CUDA_GRAPH_CASES = [
    (
        "local + 全重算",
        dict(
            cuda_graph_impl="local",
            recompute_granularity="full",
            recompute_method="uniform",
            recompute_num_layers=1,
        ),
    ),
    (
        "local + CPU offloading",
        dict(cuda_graph_impl="local", cpu_offloading=True, cpu_offloading_num_layers=1),
    ),
    (
        "transformer_engine，modules=[moe]，dropless MoE",
        dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"], num_moe_experts=4),
    ),
    ("full_iteration + modules=[attn]", dict(cuda_graph_impl="full_iteration", cuda_graph_modules=["attn"])),
    ("local，modules=[attn]", dict(cuda_graph_impl="local", cuda_graph_modules=["attn"])),
]
"""Configurations handed to ``TransformerConfig``: the last one is accepted."""


def cuda_graph_refusals(base: dict) -> list[list]:
    """Build a ``TransformerConfig`` for each case; say what ``__post_init__`` answers."""
    from megatron.core.transformer import TransformerConfig

    rows = []
    for label, extra in CUDA_GRAPH_CASES:
        try:
            TransformerConfig(**base, **extra)
            rows.append([label, "接受", ""])
        except (AssertionError, ValueError) as e:
            rows.append([label, type(e).__name__, str(e).splitlines()[0][:90]])
    return rows


# --------------------------------------------------------------- combined_1f1b on CPU ranks

MOE = dict(num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=0.0)
"""The MoE of the combined_1f1b run (4 experts, top-2, alltoall: the dispatcher the overlap needs)."""

SCHEDULE_MODULES = (
    "megatron.core.pipeline_parallel.utils",
    "megatron.core.models.common.model_chunk_schedule_plan",
    "megatron.core.models.common.utils",
    "megatron.core.models.gpt.fine_grained_callables",
)
"""The modules of the EP-overlap schedule that name CUDA streams and events."""


class NamedStream:
    """A stand-in CUDA stream: only its name ("计算流" / "通信流") -- what the recording reads."""

    def __init__(self, name: str):
        self.name = name

    def wait_stream(self, other) -> None:
        pass


class NoEvent:
    """A stand-in CUDA event: on one CPU thread every op is already ordered."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass


@contextlib.contextmanager
def cpu_streams():
    """While the schedule runs: its modules see ``torch.cuda.Stream`` / ``current_stream`` /
    ``Event`` / ``stream()`` that only carry a name, and ``Tensor.record_stream`` does nothing.
    Everything else (the model, the all-to-alls, autograd) is the real code."""
    from megatron.core.pipeline_parallel import utils as pp_utils

    from snippets.cpu.base import ModuleProxy

    compute = NamedStream("计算流")

    def new_stream(*args, **kwargs):
        return NamedStream("通信流")

    new_stream.priority_range = staticmethod(lambda: (0, -1))
    cuda = ModuleProxy(
        torch.cuda,
        Stream=new_stream,
        Event=NoEvent,
        current_stream=lambda *a: compute,
        stream=lambda s: contextlib.nullcontext(),
    )
    fake = ModuleProxy(torch, cuda=cuda)
    modules = [importlib.import_module(m) for m in SCHEDULE_MODULES]
    saved = [m.torch for m in modules]
    record_stream = torch.Tensor.record_stream
    for m in modules:
        m.torch = fake
    torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        for m, t in zip(modules, saved):
            m.torch = t
        torch.Tensor.record_stream = record_stream
        pp_utils._COMM_STREAM = None


NODE = {
    "pre_process": "嵌入",
    "pre_dispatch_computation": "attn+路由",
    "moe_dispatch": "dispatch",
    "mlp": "专家",
    "moe_combine": "combine",
    "post_process": "输出层",
    "loss_func": "loss",
}
"""Short names of the schedule's nodes."""


@contextlib.contextmanager
def record_nodes():
    """Record, in order, every schedule node run: (combined step, F/B, micro-batch, layer, node,
    stream, collectives inside it). The micro-batch comes from ``combined_forward_backward_step``'s
    arguments, the layer from ``TransformerLayerSchedulePlan.run``'s."""
    from megatron.core.models.common import model_chunk_schedule_plan as plan_mod
    from megatron.core.pipeline_parallel import combined_1f1b
    from megatron.core.pipeline_parallel import utils as pp_utils
    from megatron.core.pipeline_parallel.utils import ScheduleNode

    from snippets.record import recorder

    ops: list[dict] = []
    state = dict(step=-1, f=None, b=None, fl=None, bl=None, pending=[], runs=0, run=None)
    real_step = combined_1f1b.combined_forward_backward_step
    real_layer_run = plan_mod.TransformerLayerSchedulePlan.run
    real = {k: ScheduleNode.__dict__[k] for k in ("forward", "backward")}

    def step(*args, **kwargs):
        f_model, b_model = args[2], args[6]
        state["step"] += 1
        state["f"] = kwargs.get("current_microbatch") if f_model is not None else None
        state["b"] = state["pending"].pop(0) if b_model is not None else None
        if f_model is not None:
            state["pending"].append(state["f"])
        state["fl"] = state["bl"] = None
        return real_step(*args, **kwargs)

    def layer_run(f_layer, b_layer, *args, **kwargs):
        state["fl"] = f_layer.layer.layer_number if f_layer is not None else None
        state["bl"] = b_layer.layer.layer_number if b_layer is not None else None
        state["run"], state["runs"] = state["runs"], state["runs"] + 1
        try:
            return real_layer_run(f_layer, b_layer, *args, **kwargs)
        finally:
            state["fl"] = state["bl"] = state["run"] = None

    def node(kind):
        def wrapper(self, *args, **kwargs):
            start = len(calls)
            out = real[kind](self, *args, **kwargs)
            stream = "通信流" if self.stream is pp_utils.get_comm_stream() else "计算流"
            ops.append(
                dict(
                    step=state["step"],
                    kind="F" if kind == "forward" else "B",
                    mb=state["f"] if kind == "forward" else state["b"],
                    layer=state["fl"] if kind == "forward" else state["bl"],
                    node=self.name,
                    run=state["run"],
                    stream=stream,
                    comms=[(c.api, c.group) for c in calls[start:]],
                )
            )
            return out

        return wrapper

    with recorder.record() as calls:
        combined_1f1b.combined_forward_backward_step = step
        plan_mod.TransformerLayerSchedulePlan.run = staticmethod(layer_run)
        ScheduleNode.forward, ScheduleNode.backward = node("forward"), node("backward")
        try:
            yield ops
        finally:
            combined_1f1b.combined_forward_backward_step = real_step
            plan_mod.TransformerLayerSchedulePlan.run = staticmethod(real_layer_run)
            ScheduleNode.forward, ScheduleNode.backward = real["forward"], real["backward"]


def moe_model(dims, ep: int, device: str = "cpu"):
    """A bf16 MoE ``GPTModel`` (local spec, RoPE) with ``overlap_moe_expert_parallel_comm``."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    model_parallel_cuda_manual_seed(0)
    kwargs = dims.transformer_config_kwargs()
    config = TransformerConfig(
        **kwargs,
        **MOE,
        expert_model_parallel_size=ep,
        overlap_moe_expert_parallel_comm=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=device != "cuda",
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=MOE["num_moe_experts"], moe_grouped_gemm=False, normalization=kwargs["normalization"]
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = GPTModel(
            config,
            spec,
            vocab_size=dims.vocab,
            max_sequence_length=dims.seq,
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
        )
    return model, config


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    """A ``forward_step_func`` as pretrain_gpt's: with ``return_schedule_plan`` it returns
    ``model.build_schedule_plan(...)`` instead of the output (what combined_1f1b asks for)."""
    from snippets.models.tiny_gpt import loss_func

    batch = next(data_iterator)
    args = (batch["tokens"], batch["position_ids"], batch["attention_mask"])
    if return_schedule_plan:
        return model.build_schedule_plan(*args, labels=batch["labels"]), partial(loss_func)
    return model(*args, labels=batch["labels"]), partial(loss_func)


def combined_run(dims, ep: int, device: str = "cpu") -> dict:
    """On every rank (model parallel initialized with ``ep``): the EP-overlap schedule as published
    (its error on a CPU), then with :func:`cpu_streams`, recorded, then the plain schedule on the
    same weights; the largest gradient difference between the two."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.experiments.n13_pipeline import microbatches

    model, config = moe_model(dims, ep, device)
    func = get_forward_backward_func()
    m = dims.microbatches

    def once():
        model.zero_grad()
        return func(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches(dims, m, device)),
            model=[model],
            num_microbatches=m,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
        )

    try:
        once()
        error = "（没有报错）"
    except RuntimeError as e:
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    shim = cpu_streams() if device == "cpu" else contextlib.nullcontext()  # on a GPU: the real streams
    with shim, record_nodes() as ops:
        losses = once()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    config.overlap_moe_expert_parallel_comm = False
    plain = once()
    diff = max(
        float((grads[n] - p.grad.float()).abs().max()) for n, p in model.named_parameters() if n in grads
    )
    same_loss = all(bool(torch.equal(a["lm loss"], b["lm loss"])) for a, b in zip(losses, plain))
    return dict(error=error, ops=ops, grad_diff=diff, same_loss=same_loss, schedule=func.__name__)


# ---------------------------------------------------------------------------------- the runner


def run(dims, par) -> dict:
    """On every rank: TP overlap pairs and amax groups at ``par.tp``, then combined_1f1b at EP=2."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=par.tp)
    out = dict(tp_calls=tp_overlap_calls(dims, par.tp, par.device), amax=amax_groups())
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    out["combined"] = combined_run(dims, 2, par.device)
    parallel_state.destroy_model_parallel()
    return out


def op_label(op: dict) -> str:
    where = f"L{op['layer']} " if op["layer"] is not None else ""
    return f"{op['kind']}{op['mb']} {where}{NODE.get(op['node'], op['node'])}"


def order_table(ops: list[dict]) -> Table:
    """The recorded order, one row per combined step: the nodes it ran, in order."""
    rows = []
    for step in sorted({o["step"] for o in ops}):
        mine = [o for o in ops if o["step"] == step]
        f = sorted({o["mb"] for o in mine if o["kind"] == "F"})
        b = sorted({o["mb"] for o in mine if o["kind"] == "B"})
        what = " + ".join(([f"F{f[0]}"] if f else []) + ([f"B{b[0]}"] if b else []))
        a2a = sum(1 for o in mine for api, _ in o["comms"] if api == "all_to_all_single")
        rows.append([step, what, len(mine), a2a, " → ".join(op_label(o) for o in mine)])
    return Table(["调用", "micro-batch", "节点数", "all-to-all", "执行顺序"], rows)


def steady_layer_rows(ops: list[dict], step: int = 1, layer_pair=(1, 2)) -> list[list]:
    """One layer pair of a steady step (forward of layer ``f``, backward of layer ``b``): node,
    stream, collectives -- the order ``TransformerLayerSchedulePlan.run`` issues."""
    f_layer, b_layer = layer_pair
    rows = []
    for o in ops:
        if o["step"] != step or o["layer"] != (f_layer if o["kind"] == "F" else b_layer):
            continue
        comms = ", ".join(f"{api.replace('_single', '')}（{group}）" for api, group in o["comms"]) or "—"
        rows.append([op_label(o), o["stream"], comms])
    return rows


def tables(results: list, dims, par) -> list:
    r0 = results[0]
    c = r0["combined"]
    return [
        f"TP={par.tp}，sequence parallel，一层的 forward + backward（rank 0）：{len(r0['tp_calls'])} 次 collective",
        overlap_table(r0["tp_calls"]),
        Table(["amax 归约群（rank 0）", "ranks"], [[k, v] for k, v in r0["amax"].items()]),
        f"EP=2，overlap_moe_expert_parallel_comm=True，照原样跑：{c['error']}",
        f"换上只带名字的 stream 之后：{c['schedule']} 走 combined_1f1b，{len(c['ops'])} 个节点",
        order_table(c["ops"]),
        f"同一模型换回普通 1F1B：loss 相同 {c['same_loss']}，梯度最大差 {c['grad_diff']:.3g}",
    ]


# ---------------------------------------------------------------------------------- the picture

SHORT = {
    "pre_process": "嵌入",
    "pre_dispatch_computation": "attn",
    "moe_dispatch": "disp",
    "mlp": "专家",
    "moe_combine": "comb",
    "post_process": "输出",
    "loss_func": "loss",
}
"""Node names short enough for a 44 px box (attn = attention + router + dispatch preprocess)."""


def draw_combined(ops: list[dict], step: int = 1, *, title: str):
    """One combined step of the recorded order: a box per node, left to right in the order run,
    on the lane of the stream it is given (communication above, computation below); a faint band
    and a label over each ``TransformerLayerSchedulePlan.run`` (one forward layer with one
    backward layer)."""
    from snippets.record.draw import Figure

    mine = [o for o in ops if o["step"] == step]
    left, w, gap, top, lane, box = 58, 44, 3, 58, 44, 36
    width = left + len(mine) * (w + gap) + 6
    legend_y = top + 2 * lane + 12
    fig = Figure(
        width,
        legend_y + 14,
        title=title,
        desc=(
            "combined_1f1b 的一次调用在 CPU 上记录的执行顺序：从左到右是节点执行的先后，上一行是在通信流上的节点"
            "（all-to-all 的 dispatch / combine），下一行是在计算流上的节点；蓝色是一个 micro-batch 的 forward，"
            "红色是另一个 micro-batch 的 backward，浅色带标出同一次逐层调度里配对的 forward 层和 backward 层。"
        ),
    )
    fig.text(4, 14, title, size=13, bold=True)
    runs = {}
    for i, o in enumerate(mine):
        if o["run"] is not None:
            runs.setdefault(o["run"], []).append((i, o))
    for members in runs.values():
        first, last = members[0][0], members[-1][0]
        f = next((o["layer"] for _, o in members if o["kind"] == "F"), None)
        b = next((o["layer"] for _, o in members if o["kind"] == "B"), None)
        x0 = left + first * (w + gap) - 1
        x1 = left + (last + 1) * (w + gap) - gap + 1
        fig.rect(x0, top - 20, x1 - x0, 2 * lane + 18, "light", rx=4)
        label = " ∥ ".join(([f"F 第 {f} 层"] if f else []) + ([f"B 第 {b} 层"] if b else []))
        fig.text((x0 + x1) / 2, top - 11, label, size=11, anchor="middle", kind="muted")
    for row, name in enumerate(["通信流", "计算流"]):
        fig.text(4, top + row * lane + box / 2, name, size=12)
    for i, o in enumerate(mine):
        x = left + i * (w + gap)
        y = top + (0 if o["stream"] == "通信流" else lane)
        kind = "fwd" if o["kind"] == "F" else "bwd"
        a2a = sum(1 for api, _ in o["comms"] if api == "all_to_all_single")
        tip = f"{op_label(o)}（{o['stream']}）" + (f"，{a2a} 次 all-to-all" if a2a else "")
        fig.rect(x, y, w, box, kind, tip=tip)
        layer = f"·L{o['layer']}" if o["layer"] is not None else ""
        fig.text(x + w / 2, y + 11, f"{o['kind']}{o['mb']}{layer}", size=11, anchor="middle", kind="on")
        fig.text(x + w / 2, y + 25, SHORT.get(o["node"], o["node"]), size=11, anchor="middle", kind="on")
    fwd = next(o["mb"] for o in mine if o["kind"] == "F")
    bwd = next(o["mb"] for o in mine if o["kind"] == "B")
    end = fig.legend(
        left, legend_y, [("fwd", f"micro-batch {fwd} 的 forward"), ("bwd", f"micro-batch {bwd} 的 backward")]
    )
    fig.text(
        end,
        legend_y,
        "attn = attention + 路由；disp / comb = dispatch / combine 的 all-to-all",
        size=12,
        kind="muted",
    )
    fig.check()
    return fig
