"""Note 26's experiment: what a step costs, measured on the real objects and set beside the formulas.

:func:`run` (every rank, TP = ``par.tp``, the rest data parallel) measures, with
:mod:`snippets.cost.measure`:

* bytes per parameter of a bf16 ``GPTModel`` with Megatron's DDP and optimizer, for the four
  combinations of the distributed optimizer and ``grad_reduce_in_fp32``, with every collective
  of the step (sequence parallel on);
* bytes one ``TransformerBlock`` layer keeps for backward under TP, without / with sequence
  parallel and with no / selective / full recomputation, and the TP elements it moves.

:func:`tables` prints them against Megatron's formulas (:mod:`snippets.cost.formulas`, which calls
``megatron/training/theoretical_memory_usage.py``) and the published ones (ZeRO, Korthikanti et al.
2022 Table 2). The FLOPs check (:func:`flops_rows`), the pipeline split (:func:`pipeline_rows`) and
the worked choices at real sizes (:func:`choices`) are the note's other tables.
"""

from __future__ import annotations

import dataclasses

from snippets.record.tables import Table

MODES = (
    (False, "none"),
    (False, "selective"),
    (True, "none"),
    (True, "selective"),
    (True, "full"),
)
"""(sequence parallel, recomputation) of each activation run."""

FLAGS = ((False, False), (False, True), (True, False), (True, True))
"""(distributed optimizer, grad_reduce_in_fp32) of each bytes-per-parameter run."""


def run(dims, par) -> dict:
    """On every rank: the four optimizer-state runs, then the five one-layer activation runs."""
    from snippets.cost import measure

    sp = par.tp > 1
    state = {}
    for distributed, fp32 in FLAGS:
        r = measure.state_bytes(dims, distributed, fp32, tp=par.tp, sp=sp)
        state[(distributed, fp32)] = dict(
            memory=r["memory"],
            numel=r["numel"],
            per_param=r["per_param"],
            dp=r["dp"],
            microbatches=r["microbatches"],
            comm=measure.volume(r["calls"]),
            tensors=r["tensors"],
            biases=r["biases"],
            position=r["position"],
        )
    # sequence parallel needs TP > 1 (Megatron refuses it otherwise): at TP = 1 only the no-SP modes
    modes = MODES if sp else [(False, recompute) for recompute in ("none", "selective", "full")]
    acts = {mode: measure.layer_activations(dims, par.tp, *mode) for mode in modes}
    return dict(state=state, acts=acts)


# ---- formulas ------------------------------------------------------------------------------------


def model_of(dims):
    from snippets.cost import formulas

    return formulas.Model.from_dims(dims)


def config_of(dims, par, **changes):
    """The :class:`snippets.cost.formulas.Config` of the tiny run: one node of ``par.world`` ranks,
    the vocabulary unpadded (``GPTModel`` built directly), the micro-batches a DP rank runs."""
    from snippets.cost import formulas

    dp = par.world // par.tp
    fields = dict(
        gpus_per_node=par.world,
        tp=par.tp,
        sp=par.tp > 1,
        seq=dims.seq,
        micro_batch_size=dims.micro_batch_size,
        num_microbatches=dims.microbatches // dp,
        vocab_multiple=1,
        recompute="selective",
    )
    fields.update(changes)
    return formulas.Config(**fields)


def published_bytes_per_param(distributed: bool, fp32_grads: bool, dp: int) -> tuple[str, float]:
    """The published count that describes this setting: ZeRO's 2 + 2 + 12 (arXiv 1910.02054: bf16
    weights and gradients, 12 bytes of fp32 Adam state), its stage 1 (the 12 sharded), Megatron's
    18 / 6 + 12/DP (fp32 ``main_grad``, docs/user-guide/features/dist_optimizer.md)."""
    if fp32_grads:
        return ("Megatron 6 + 12/DP", 6 + 12 / dp) if distributed else ("Megatron 18", 18.0)
    return ("ZeRO-1 4 + 12/DP", 4 + 12 / dp) if distributed else ("ZeRO 16", 16.0)


def state_table(results: list, dims, par) -> Table:
    """Measured bytes per parameter on rank 0 against Megatron's formula and the published count."""
    from snippets.cost import formulas

    rows = []
    for distributed, fp32 in FLAGS:
        r = results[0]["state"][(distributed, fp32)]
        config = config_of(dims, par, distributed_optimizer=distributed, grad_reduce_in_fp32=fp32)
        figure = formulas.weight_and_optimizer_bytes(model_of(dims), config)
        counted = formulas.params_per_gpu(model_of(dims), config)["dense"]
        name, value = published_bytes_per_param(distributed, fp32, r["dp"])
        rows.append(
            [
                "是" if distributed else "否",
                "fp32" if fp32 else "bf16",
                r["numel"],
                round(r["per_param"], 2),
                round(figure.value / counted, 2)
                if figure.value is not None
                else "无（" + figure.why.split(";")[0] + "）",
                f"{name} = {value:g}",
            ]
        )
    return Table(
        ["分布式优化器", "梯度", "本 rank 参数", "实测 字节/参数", "Megatron 公式 字节/参数", "公开的数"],
        rows,
    )


def params_table(results: list, dims, par) -> Table:
    """Parameters on rank 0: measured, Megatron's count, and what makes the difference."""
    from snippets.cost import formulas

    r = results[0]["state"][(False, True)]
    counted = formulas.params_per_gpu(model_of(dims), config_of(dims, par))["dense"]
    return Table(
        ["实测参数", "Megatron 公式数的参数", "差", "其中 bias", "其中位置嵌入表"],
        [[r["numel"], int(counted), r["numel"] - int(counted), r["biases"], r["position"]]],
    )


def paper_rows(dims, tp: int) -> dict:
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, bytes per layer in units of s*b*h:
    the row that describes each (SP, recomputation) setting."""
    a, s, h, t = dims.heads, dims.seq, dims.hidden, tp
    att = 5 * a * s / h
    return {
        (False, "none"): ("TP：10 + 24/t + 5as/(ht)", 10 + 24 / t + att / t),
        (False, "selective"): ("TP + 选择性重算：10 + 24/t", 10 + 24 / t),
        (True, "none"): ("TP + SP：(34 + 5as/h)/t", (34 + att) / t),
        (True, "selective"): ("TP + SP + 选择性重算：34/t", 34 / t),
        (False, "full"): ("全重算：2（只留层输入）", 2.0),
        (True, "full"): ("全重算：2（只留层输入；SP 下 /t）", 2 / t),
    }


def megatron_layer(dims, tp: int, sp: bool, recompute: str) -> tuple[str, float | None]:
    """Megatron's per-layer activation term in units of s*b*h: its function
    (:func:`snippets.cost.formulas.activation_bytes`, which calls ``theoretical_memory_usage.py``)
    on the 2-layer model minus on the 1-layer one, where it covers the setting; None with the
    reason otherwise."""
    from snippets.cost import formulas

    config = config_of(dims, _par(tp), sp=sp, recompute=recompute, num_microbatches=1)
    one, two = (
        formulas.activation_bytes(dataclasses.replace(model_of(dims), layers=n), config) for n in (1, 2)
    )
    if one.value is None:
        if recompute == "full":
            return "无全重算的项", None
        return "SP 只有配选择性重算的公式", None
    per_layer = (two.value - one.value) / (dims.seq * dims.micro_batch_size * dims.hidden)
    if sp:
        return "compute_activation_memory：(18 + 4·ffn/h)/t", per_layer
    return "compute_activation_memory_without_sp：(10 + 24/t) × 1.05", per_layer


def _par(tp: int):
    """A one-node Parallel of ``tp`` ranks (what :func:`config_of` reads from it)."""
    from snippets.experiments import Parallel

    return Parallel(world=tp, tp=tp)


def activation_table(results: list, dims, tp: int) -> Table:
    """Bytes one layer keeps, rank 0, in s*b*h units, against Megatron and Table 2."""
    paper = paper_rows(dims, tp)
    rows = []
    for sp, recompute in results[0]["acts"]:
        r = results[0]["acts"][(sp, recompute)]
        measured = r["bytes"] / r["sbh"]
        formula, value = megatron_layer(dims, tp, sp, recompute)
        name, published = paper[(sp, recompute)]
        rows.append(
            [
                "是" if sp else "否",
                recompute,
                r["bytes"],
                round(measured, 2),
                round(value, 2) if value is not None else "—",
                name,
                round(published, 2),
            ]
        )
    return Table(
        ["SP", "重算", "实测 字节/层", "实测 ÷ sbh", "Megatron ÷ sbh", "论文 Table 2 的行", "论文 ÷ sbh"],
        rows,
    )


def saved_table(results: list, dims, tp: int, mode=(True, "selective")) -> Table:
    """What one layer keeps for backward in ``mode`` on rank 0 (without SP at TP = 1): each storage
    once, in the order the forward saved it, with its size in units of s*b*h/t."""
    r = results[0]["acts"].get(mode) or results[0]["acts"][(False, mode[1])]
    unit = r["sbh"] / tp
    return Table(
        ["#", "形状", "dtype", "字节", "÷ (sbh/t)"],
        [
            [i, list(shape), dtype, size, round(size / unit, 3)]
            for i, (shape, dtype, size) in enumerate(r["tensors"], 1)
        ],
    )


def phases(comm: dict, group: str) -> str:
    """The phases the recorder gave this group's collectives (recorder.phase_of), in step order."""
    order = ("forward", "backward", "grad sync", "optimizer step")
    found = {phase for g, phase in comm if g == group}
    return " + ".join(p for p in order if p in found)


def tp_bytes_by_hand(dims, tp: int, sp: bool, recompute: str) -> float:
    """The TP bytes one rank sends for one layer and one micro-batch, from the collectives note 11
    records (not from :mod:`snippets.cost.formulas`): bf16 ``s*b*h`` tensors; without SP 2
    all-reduces forward and 2 backward at ``2(t-1)/t``; with SP 2 all-gathers + 2 reduce-scatters
    forward and 4 + 2 backward at ``(t-1)/t``; full recomputation repeats the forward's."""
    act = dims.seq * dims.micro_batch_size * dims.hidden * 2
    forward = 2 if recompute == "full" else 1
    if sp:
        return (4 * forward + 6) * (tp - 1) / tp * act
    return (2 * forward + 2) * 2 * (tp - 1) / tp * act


def comm_table(results: list, dims, par) -> Table:
    """Bytes rank 0 sends per step, by group: recorded (ring share of each collective's whole tensor)
    against :func:`snippets.cost.formulas.communication`, and what makes any difference.

    TP rows: recorded, formula and :func:`tp_bytes_by_hand` (three separate counts). DP rows: the
    formula counts Megatron's parameters; the difference is the parameters it leaves out (biases,
    the position table: :func:`params_table`) and the padding the distributed optimizer adds to
    the buffer (recorded buffer length minus the model's own parameter count), each at the ring's
    bytes per element."""
    from snippets.cost import formulas

    rows = []
    one_layer = dataclasses.replace(model_of(dims), layers=1)
    for sp, recompute in ((False, "none"), (True, "selective"), (True, "full")):
        if (sp, recompute) not in results[0]["acts"]:
            continue
        r = results[0]["acts"][(sp, recompute)]
        sent = sum(v[2] for (g, _), v in r["comm"].items() if g == "tp") * 2  # bf16
        config = config_of(dims, par, sp=sp, recompute=recompute, num_microbatches=1)
        formula = formulas.communication(one_layer, config)["tp"]["bytes"]
        hand = tp_bytes_by_hand(dims, par.tp, sp, recompute)
        label = f"TP，一层一个 micro-batch，{'SP' if sp else '无 SP'}，重算 {recompute}"
        rows.append(
            [
                label,
                phases(r["comm"], "tp"),
                int(sent),
                int(formula),
                int(hand),
                int(sent - formula),
                "—",
                "—",
            ]
        )
    for distributed in (False, True):
        r = results[0]["state"][(distributed, True)]
        grad = sum(v[2] for (g, ph), v in r["comm"].items() if g == "dp-cp" and ph == "grad sync") * 4
        params = sum(v[2] for (g, ph), v in r["comm"].items() if g == "dp-cp" and ph == "optimizer step") * 2
        buffer = sum(v[1] for (g, ph), v in r["comm"].items() if g == "dp-cp" and ph == "grad sync")
        config = config_of(dims, par, distributed_optimizer=distributed)
        formula = formulas.communication(model_of(dims), config)["dp"]["bytes"]
        n = r["dp"]
        per_element = (
            formulas.RING["reduce_scatter"](n) * 4 + formulas.RING["all_gather"](n) * 2
            if distributed
            else formulas.RING["all_reduce"](n) * 4
        )
        what = "reduce-scatter fp32 梯度 + all-gather bf16 参数" if distributed else "all-reduce fp32 梯度"
        rows.append(
            [
                f"DP，一步，{what}",
                phases(r["comm"], "dp-cp"),
                int(grad + params),
                int(formula),
                "—",
                int(grad + params - formula),
                int((r["biases"] + r["position"]) * per_element),
                int((buffer - r["numel"]) * per_element),
            ]
        )
    return Table(
        ["群与范围", "阶段", "实测 字节/rank", "公式 字节/rank", "手算 字节/rank", "实测 − 公式",
         "其中 bias + 位置嵌入", "其中缓冲区补齐"],
        rows,
    )  # fmt: skip


def tables(results: list, dims, par) -> list:
    return [
        state_table(results, dims, par),
        params_table(results, dims, par),
        activation_table(results, dims, par.tp),
        saved_table(results, dims, par.tp),
        comm_table(results, dims, par),
    ]


# ---- FLOPs -------------------------------------------------------------------------------------


def flops_rows(counted: dict, dims) -> Table:
    """torch's count of one forward + backward against Megatron's formula and 6N + attention."""
    from snippets.cost import formulas

    config = formulas.Config(
        gpus_per_node=1,
        seq=dims.seq,
        micro_batch_size=dims.micro_batch_size,
        num_microbatches=1,
        vocab_multiple=1,
    )
    megatron = formulas.flops_per_step(model_of(dims), config).value
    six = formulas.six_n_flops(model_of(dims), config)
    attention = sum(n for op, n in counted["by_op"].items() if op in ("aten.bmm", "aten.baddbmm"))
    return Table(
        ["算法", "FLOPs", "其中注意力 QKᵀ 与 AV", "与 FlopCounterMode 之差"],
        [
            ["FlopCounterMode（实测）", counted["total"], attention, 0],
            ["num_floating_point_operations", int(megatron), "—", int(megatron - counted["total"])],
            ["6N + 注意力", six["total"], six["attention"], six["total"] - counted["total"]],
        ],
    )


# ---- pipeline split ------------------------------------------------------------------------------


def pipeline_rows(results: list) -> Table:
    """Each split: per stage its global layers, parameters, one micro-batch's kept bytes, 1F1B's
    micro-batches in flight and their product (the stage's activation peak), and the elements the
    stage sent in one recorded 1F1B step (activations forward, gradients backward)."""
    rows = []
    for name in results[0]:
        for rank, r in enumerate(results):
            got = r[name]
            if "refused" in got:
                if rank == 0:
                    rows.append([name, "—", "Megatron 拒绝：" + got["refused"], "", "", "", "", ""])
                continue
            parts = (
                (["E"] if got["embedding"] else [])
                + [str(n) for n in got["layers"]]
                + (["L"] if got["output"] else [])
            )
            sent = sum(v[2] for (g, _), v in got["p2p"].items() if g == "pp")
            rows.append(
                [
                    name,
                    rank,
                    " ".join(parts),
                    got["params"],
                    got["activation"],
                    got["in_flight"],
                    got["activation"] * got["in_flight"],
                    int(sent),
                ]
            )
    return Table(
        [
            "切法",
            "stage",
            "持有（E 嵌入，L 输出层）",
            "参数",
            "一个 micro-batch 留的字节",
            "1F1B 同时在飞",
            "激活峰值",
            "一步 p2p 发出元素",
        ],
        rows,
    )


# ---- real sizes ----------------------------------------------------------------------------------


def _budget():
    from snippets.cost import formulas

    return formulas.MEMORY_BUDGET


GPU_MEMORY = _budget()
"""The bytes a configuration may use on one GPU: :data:`snippets.cost.formulas.MEMORY_BUDGET`,
80 GiB (an "80 GB" H100 SXM's HBM, binary units) less a 10 % headroom = 72 GiB."""

CRITICAL = ("tp", "cp", "ep", "pp")
"""The groups whose traffic sits on the critical path (DP's overlaps with backward)."""


def candidate(model_name: str, **fields) -> dict:
    """One candidate config at real size, with everything the choice reads (formulas.py).

    ``memory`` is ``None`` when weights or activations have no number; ``fits`` is then ``None``
    ("unknown", with ``unknown`` saying why), never a guess. ``step`` is ``None`` when a group on
    the critical path has no byte count (``no_step`` says which and why)."""
    from snippets.cost import formulas

    model = formulas.MODELS[model_name]
    config = formulas.Config(**fields)
    comm = formulas.communication(model, config)
    w = formulas.weight_and_optimizer_bytes(model, config)
    a = formulas.activation_bytes(model, config)
    flops = formulas.flops_per_step(model, config).value
    compute = flops / config.world / formulas.HARDWARE["peak_bf16_flops"]
    bubble = formulas.bubble_fraction(config)
    link = {"NVLink": 0.0, "IB": 0.0}
    for row in comm.values():
        if row["link"] and row["bytes"]:
            link[row["link"]] += row["seconds"]
    missing = [g for g in CRITICAL if comm[g]["seconds"] is None]
    exposed = None if missing else sum(comm[g]["seconds"] for g in CRITICAL)
    verdict = formulas.memory_fits(model, config)
    memory = None if w.value is None or a.value is None else w.value + a.value
    return dict(
        config=config,
        model=model,
        weights=w,
        acts=a,
        memory=memory,
        fits=verdict["fits"],
        unknown=verdict["why"],
        comm=comm,
        link=link,
        bubble=bubble,
        compute=compute,
        exposed=exposed,
        step=None if exposed is None else compute / (1 - bubble) + exposed,
        no_step=f"{missing[0].upper()}: {comm[missing[0]]['why']}" if missing else None,
    )


def pick(cands: list[dict]) -> dict | None:
    """Among the candidates known to fit in :data:`GPU_MEMORY` and with a nominal step, the shortest
    step: compute at peak stretched by the bubble, plus the TP / CP / EP / PP traffic on the
    critical path (DP's is overlapped with backward). ``None`` when no candidate qualifies: a row
    whose memory or step has no number is never picked."""
    known = [c for c in cands if c["fits"] is True and c["step"] is not None]
    return min(known, key=lambda c: c["step"]) if known else None


def label(c: dict) -> str:
    cfg = c["config"]
    parts = [f"TP{cfg.tp}", f"PP{cfg.pp}"] + ([f"EP{cfg.ep}"] if cfg.ep > 1 else []) + [f"DP{cfg.dp}"]
    return " ".join(parts)


def gib(x) -> str:
    """Bytes in GiB (2**30), one decimal; "—" for no number."""
    return f"{x / 2**30:.1f}" if x is not None else "—"


def link_ms(c: dict, link: str) -> str:
    """Milliseconds on ``link`` per step; ``+ ?`` when a group on that link has no byte count."""
    text = f"{c['link'][link] * 1e3:.0f}"
    if any(row["link"] == link and row["bytes"] is None for row in c["comm"].values()):
        text += " + ?"
    return text


def fits_text(c: dict) -> str:
    if c["fits"] is None:
        return "未知（无激活公式）" if c["acts"].value is None else "未知"
    return "是" if c["fits"] else "否"


def choice_table(cands: list[dict]) -> Table:
    chosen = pick(cands)
    rows = []
    for c in cands:
        rows.append(
            [
                label(c),
                gib(c["weights"].value),
                gib(c["acts"].value) if c["acts"].value is not None else "无公式",
                fits_text(c),
                link_ms(c, "NVLink"),
                link_ms(c, "IB"),
                f"{c['bubble']:.3f}",
                f"{c['step']:.2f}" if c["step"] is not None else f"无（{c['no_step'].split(':')[0]} 无数）",
                "← 选" if c is chosen else "",
            ]
        )
    budget = f"{GPU_MEMORY / 2**30:.0f} GiB"
    return Table(
        [
            "配置",
            "权重+优化器 GiB",
            "激活 GiB",
            f"放得下 {budget}",
            "NVLink ms",
            "IB ms",
            "气泡",
            "名义步长 s",
            "",
        ],
        rows,
    )


CHOICES = {
    "qwen3-8b": dict(
        base=dict(
            gpus_per_node=8,
            nodes=1,
            seq=4096,
            micro_batch_size=1,
            recompute="selective",
            distributed_optimizer=True,
        ),
        batch=128,
        grid=[(1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (2, 2, 1), (1, 2, 1)],
    ),
    "dense-70b": dict(
        base=dict(
            gpus_per_node=8,
            nodes=8,
            seq=4096,
            micro_batch_size=1,
            recompute="selective",
            distributed_optimizer=True,
        ),
        batch=512,
        grid=[(8, 1, 1), (8, 2, 1), (8, 4, 1), (4, 4, 1), (4, 8, 1), (8, 8, 1), (16, 1, 1)],
    ),
    "qwen3-30b-a3b": dict(
        base=dict(
            gpus_per_node=8,
            nodes=2,
            seq=4096,
            micro_batch_size=1,
            recompute="selective",
            distributed_optimizer=True,
        ),
        batch=256,
        grid=[(1, 1, 8), (1, 1, 16), (2, 1, 8), (1, 2, 8), (4, 1, 4)],
    ),
}
"""The worked choices: (tp, pp, ep) candidates per model, global batch in sequences."""


def choices(model_name: str) -> list[dict]:
    """The candidates of :data:`CHOICES` that Megatron's rules allow, each priced by :func:`candidate`."""
    from snippets.cost import formulas

    spec = CHOICES[model_name]
    out = []
    for tp, pp, ep in spec["grid"]:
        world = spec["base"]["gpus_per_node"] * spec["base"]["nodes"]
        dp = world // (tp * pp)
        fields = dict(
            spec["base"], tp=tp, pp=pp, ep=ep, sp=tp > 1, num_microbatches=max(1, spec["batch"] // dp)
        )
        if formulas.problems(formulas.MODELS[model_name], formulas.Config(**fields)):
            continue
        out.append(candidate(model_name, **fields))
    return out


def tp_node_rows(model_name: str = "qwen3-8b", tp: int = 8, seq: int = 4096) -> Table:
    """One layer, one micro-batch at TP = ``tp`` with SP: the bytes a rank sends (formulas.py, the
    per-layer count note 11 records), the time at NVLink's and IB's nominal bandwidth, and the
    layer's compute on one GPU at peak (Megatron's FLOPs formula over layers and GPUs)."""
    from snippets.cost import formulas

    model = dataclasses.replace(formulas.MODELS[model_name], layers=1)
    rows = []
    for nodes, per_node in ((1, tp), (tp, 1)):
        config = formulas.Config(
            gpus_per_node=per_node,
            nodes=nodes,
            tp=tp,
            sp=True,
            seq=seq,
            micro_batch_size=1,
            num_microbatches=1,
            recompute="selective",
        )
        row = formulas.communication(model, config)["tp"]
        flops = formulas.flops_per_step(model, config).value  # one layer (+ the logits) for one sequence
        layer_flops = flops - 6 * seq * model.hidden * formulas.padded_vocab(model, config)
        compute = layer_flops / tp / formulas.HARDWARE["peak_bf16_flops"]
        rows.append(
            [
                f"{nodes} 节点 × {per_node} 卡",
                row["link"],
                round(row["bytes"] / 2**20, 1),
                round(row["seconds"] * 1e3, 2),
                round(compute * 1e3, 2),
                round(row["seconds"] / compute, 2),
            ]
        )
    return Table(
        ["TP=8 的 8 张卡在", "链路", "每 rank 发出 MiB", "通信 ms", "这一层的计算 ms（峰值）", "通信 / 计算"],
        rows,
    )


def presets_rows(names=("qwen3-8b", "dense-8b", "dense-70b"), seq: int = 4096) -> Table:
    """Megatron's formulas, called on each model at TP=8, SP + selective recomputation, DP=8 with the
    distributed optimizer, one micro-batch of ``seq`` tokens: GiB per GPU and FLOPs per token."""
    from megatron.training.theoretical_memory_usage import (
        compute_activation_memory,
        compute_weight_and_optimizer_memory,
    )
    from megatron.training.training import num_floating_point_operations

    from snippets.cost import formulas

    rows = []
    for name in names:
        model = formulas.MODELS[name]
        config = formulas.Config(
            gpus_per_node=8,
            nodes=8,
            tp=8,
            sp=True,
            recompute="selective",
            seq=seq,
            micro_batch_size=1,
            num_microbatches=1,
            distributed_optimizer=True,
        )
        args = formulas.megatron_args(model, config)
        six = formulas.six_n_flops(model, config.replace(nodes=1))
        tokens = seq * config.replace(nodes=1).global_batch
        rows.append(
            [
                name,
                round(compute_weight_and_optimizer_memory(args) / 2**30, 2),
                round(compute_activation_memory(args, num_microbatches=1) / 2**30, 3),
                f"{num_floating_point_operations(args, 1) / seq:.4g}",
                f"{six['six_n'] / tokens:.4g}",
                f"{six['total'] / tokens:.4g}",
            ]
        )
    return Table(
        ["模型", "权重+优化器 GiB/GPU", "激活 GiB/GPU", "每 token FLOPs（Megatron）", "6N", "6N + 注意力"],
        rows,
    )


README_MFU = 0.47
"""Megatron-LM's README at core_v0.19.0 (line 95): "up to 47% Model FLOP Utilization (MFU) on H100
clusters"; its strong-scaling run of GPT-3 175B goes from 47% to 42% between 96 and 4,608 GPUs
(line 122)."""


def mfu_rows(cands: dict[str, dict | None]) -> Table:
    """For each picked config: FLOPs per step (Megatron's formula), and the step time and tokens per
    second per GPU that an MFU of :data:`README_MFU` would mean -- computed, not measured. A model
    with no pick (no candidate known to fit) is left out."""
    from snippets.cost import formulas

    rows = []
    for name, c in cands.items():
        if c is None:
            continue
        cfg = c["config"]
        flops = formulas.flops_per_step(c["model"], cfg).value
        step = flops / (README_MFU * cfg.world * formulas.HARDWARE["peak_bf16_flops"])
        tokens = cfg.global_batch * cfg.seq
        rows.append(
            [name, label(c), cfg.world, f"{flops:.3e}", round(step, 2), round(tokens / step / cfg.world)]
        )
    return Table(["模型", "配置", "GPU", "每步 FLOPs", "MFU 47% 时的步长 s", "tokens/s/GPU"], rows)
