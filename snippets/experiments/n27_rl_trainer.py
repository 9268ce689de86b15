"""Note 27's experiment: what the trainer does in one RL round, on a real tiny ``GPTModel``.

:func:`run` (every rank; ``par.tp`` ranks, TP = ``par.tp`` for the trainer) does, in one launch:

1. **rollout stand-in** at TP = 1 in bf16 (``Float16Module``): sample continuations token by
   token and keep each sampled token's log-prob; the same weights in fp32 at TP = 1 and the bf16
   model over whole sequences give the comparison rows;
2. **trainer recompute** at TP = ``par.tp`` in bf16 (as both frameworks run the actor) and in
   fp32 (the contrast): the same full weights (checked after gathering), log-probs of the sampled
   tokens through ``tensor_parallel.vocab_parallel_cross_entropy``;
3. **reference and KL**: the initial weights kept as the reference; a bf16 policy trained
   ``kl_steps`` GRPO steps at ``kl_lr`` with Megatron's DDP and optimizer; tokens drawn from the
   policy at every position; k1 / abs / k2 / k3 on their log-probs, and the exact KL of the full
   distributions;
4. **bits per step**: a bf16 policy (fp32 main weights in Megatron's optimizer) trained ``steps``
   GRPO steps at ``lr`` (1e-6): how many bf16 weights change their bits, per parameter kind, each
   step and since the start.

:func:`tables` prints the note's tables from rank 0; :func:`reference_rows`, :func:`offload_rows`
and :func:`colocated` size the reference copy and what the hybrid engine frees for real models with
:mod:`snippets.cost.formulas`, in GiB against its card (``HARDWARE["hbm_bytes"]``, 80 GiB) as note 26.
"""

from __future__ import annotations

import torch

from snippets.cost.formulas import GIB, HARDWARE, MEMORY_BUDGET
from snippets.record.tables import Table

PROMPT = 4
"""Prompt tokens; the rest of ``dims.seq`` is generated."""
GROUP = 4
"""Samples per prompt (GRPO's group): ``dims.micro_batch_size`` sequences = batch / GROUP prompts."""
LR = 1e-6
"""The RL learning rate of the bits run (verl's and NeMo RL's GRPO examples)."""
STEPS = 40
"""Steps of the bits run (bounded)."""
KL_LR, KL_STEPS = 1e-4, 8
"""The policy of the KL part: a larger step so KL is well above rounding noise."""
DRAWS = 8
"""Tokens drawn from the policy at every position for the sampled KL estimators."""
THRESHOLD = 0.01
"""|Δ log-prob| above which a token counts as 'off'."""
TIS = 2.0
"""Truncated importance sampling cap C: ratios above C are cut to C (verl's rollout_is_threshold
default; NeMo RL's truncated_importance_sampling_ratio has no default)."""
SEED = 0
STD = 0.2
"""``init_method_std`` of the rollout / trainer / reference models (the bits run keeps 0.02)."""


def _parallel(tp: int) -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(SEED)  # dropout is off; attention still enters the tracker


def run(
    dims,
    par,
    steps: int = STEPS,
    kl_steps: int = KL_STEPS,
    kl_lr: float = KL_LR,
    std: float = STD,
    keep_tensors: bool = False,
):
    """On every rank; returns this rank's tensors and counts (every rank computes the same)."""
    from snippets.rl import trainer_side as ts

    b, new = dims.micro_batch_size, dims.seq - PROMPT
    gen = torch.Generator().manual_seed(SEED + 1)
    prompts = torch.randint(0, dims.vocab, (b // GROUP, PROMPT), generator=gen).repeat_interleave(GROUP, 0)

    # 1. rollout stand-in: TP = 1, bf16
    _parallel(1)
    fp32_tp1 = ts.build(dims, SEED, std)
    full = ts.full_weights(fp32_tp1)
    rollout = ts.to_bf16(dims, ts.build(dims, SEED, std))
    tokens, logp_rollout = ts.generate(rollout, prompts, new, SEED + 2)
    with torch.no_grad():
        gen_part = slice(PROMPT - 1, None)  # positions whose next token was generated
        rows = {
            "tp1_fp32": ts.token_logprobs(fp32_tp1, tokens)[:, gen_part],
            "tp1_bf16": ts.token_logprobs(rollout, tokens)[:, gen_part],
        }
    del fp32_tp1, rollout

    # 2. trainer: TP = par.tp, fp32 (and bf16), the same weights
    _parallel(par.tp)
    trainer = ts.build(dims, SEED, std)
    gathered = ts.full_weights(trainer)
    same = sorted(gathered) == sorted(full) and all(torch.equal(gathered[n], full[n]) for n in full)
    with torch.no_grad():
        rows["train_fp32"] = ts.token_logprobs(trainer, tokens)[:, gen_part]
        rows["train_bf16"] = ts.token_logprobs(ts.to_bf16(dims, ts.build(dims, SEED, std)), tokens)[
            :, gen_part
        ]
    local = {n.replace("module.", ""): p.numel() for n, p in trainer.named_parameters()}

    # rewards: share of generated tokens in the lower half of the vocabulary; GRPO advantages
    reward = (tokens[:, PROMPT:] < dims.vocab // 2).float().mean(1)
    grouped = reward.view(-1, GROUP)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)

    # 3. reference (the initial fp32 weights, no optimizer) and a policy after kl_steps steps
    reference = trainer
    ddp, opt = ts.optimizer_for(dims, ts.build(dims, SEED, std), kl_lr, bf16=True)
    for _ in range(kl_steps):
        ts.train_step(ddp, opt, tokens, adv, PROMPT)
    with torch.no_grad():
        policy_full = ts.full_logprobs(ddp, tokens)[:, gen_part]
        ref_full = ts.full_logprobs(reference, tokens)[:, gen_part]
        draws = torch.Generator().manual_seed(SEED + 3)
        pol_lp, ref_lp, drawn = [], [], []
        for _ in range(DRAWS):
            x = torch.multinomial(policy_full.exp().reshape(-1, dims.vocab), 1, generator=draws)
            labels = torch.zeros_like(tokens)
            labels[:, gen_part] = x.view(b, -1)
            drawn.append(x.view(b, -1))
            pol_lp.append(ts.token_logprobs(ddp, tokens, labels)[:, gen_part])
            ref_lp.append(ts.token_logprobs(reference, tokens, labels)[:, gen_part])
    del ddp, opt

    # 4. bits: a bf16 policy, fp32 main weights, lr = LR
    ddp, opt = ts.optimizer_for(dims, ts.build(dims, SEED), LR, bf16=True)
    start = prev = ts.bits(ddp)
    per_step, since_start, step1 = [], [], None
    for step in range(steps):
        before = {n: p.detach().float().clone() for n, p in ddp.named_parameters()} if step == 0 else None
        ts.train_step(ddp, opt, tokens, adv, PROMPT)
        now = ts.bits(ddp)
        per_step.append({n: int((now[n] != prev[n]).sum()) for n in now})
        since_start.append({n: int((now[n] != start[n]).sum()) for n in now})
        if step == 0 and keep_tensors:
            step1 = dict(
                before={n.replace("module.", ""): t for n, t in before.items()},
                grad={
                    n.replace("module.", ""): p.main_grad.detach().clone() for n, p in ddp.named_parameters()
                },
                after={
                    n.replace("module.", ""): p.detach().float().clone() for n, p in ddp.named_parameters()
                },
            )
        prev = now
    out = dict(
        same_weights=same,
        tokens=tokens,
        logp_rollout=logp_rollout,
        rows=rows,
        reward=reward,
        advantages=adv,
        policy_full=policy_full,
        ref_full=ref_full,
        policy_lp=torch.stack(pol_lp),
        ref_lp=torch.stack(ref_lp),
        drawn=torch.stack(drawn),
        numel=local,
        per_step=per_step,
        since_start=since_start,
    )
    if keep_tensors:
        out["step1"] = step1
    return out


# ---- tables --------------------------------------------------------------------------------------


def mismatch(a, b) -> dict:
    """Distribution of |a - b| over tokens, and of the ratio exp(a - b)."""
    d = (a - b).flatten().double()
    ad = d.abs()
    q = torch.quantile(ad, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    ratio = torch.exp(d)
    return dict(
        tokens=d.numel(),
        mean=float(ad.mean()),
        p50=float(q[0]),
        p90=float(q[1]),
        p99=float(q[2]),
        max=float(ad.max()),
        off=float((ad > THRESHOLD).double().mean()),
        ratio_mean=float(ratio.mean()),
        ratio_min=float(ratio.min()),
        ratio_max=float(ratio.max()),
        clipped=float((ratio > TIS).double().mean()),
    )


PAIRS = (
    ("train_bf16", "rollout", "训练端 TP=2 bf16 对 rollout TP=1 bf16 逐 token 生成"),
    ("train_fp32", "rollout", "训练端换成 fp32（对照）对同一 rollout"),
    ("train_fp32", "tp1_fp32", "只换 TP（都是 fp32、整段前向）"),
    ("train_bf16", "tp1_bf16", "只换 TP（都是 bf16、整段前向）"),
    ("tp1_bf16", "rollout", "只换形状（bf16 TP=1：整段 对 逐 token）"),
    ("train_fp32", "train_bf16", "只换精度（TP=2：fp32 对 bf16）"),
)


def _logp(r, name):
    return r["logp_rollout"] if name == "rollout" else r["rows"][name]


def mismatch_table(results) -> Table:
    r = results[0]
    rows = []
    for a, b, what in PAIRS:
        m = mismatch(_logp(r, a), _logp(r, b))
        rows.append(
            [
                what,
                f"{m['mean']:.2e}",
                f"{m['p50']:.2e}",
                f"{m['p99']:.2e}",
                f"{m['max']:.2e}",
                f"{100 * m['off']:.1f}%",
            ]
        )
    return Table(["两边", "平均 |Δlogp|", "中位数", "p99", "最大", f"|Δ| > {THRESHOLD} 的 token"], rows)


RATIO_ROWS = (("train_bf16", "TP=2 bf16"), ("train_fp32", "TP=2 fp32（对照）"))
"""The trainers whose ratio against the rollout :func:`ratio_table` shows: bf16 first."""


def ratio_table(results) -> Table:
    r = results[0]
    rows = []
    for name, what in RATIO_ROWS:
        m = mismatch(r["rows"][name], r["logp_rollout"])
        rows.append(
            [
                what,
                m["tokens"],
                round(m["ratio_mean"], 4),
                round(m["ratio_min"], 4),
                round(m["ratio_max"], 4),
                f"{100 * m['clipped']:.2f}%",
            ]
        )
    return Table(
        ["训练端", "token 数", "ratio 平均", "最小", "最大", f"ratio > C={TIS:g} 被截断的份额"], rows
    )


FORMULAS = {
    "k1 (kl)": "−log r",
    "abs": "|log r|",
    "k2 (mse)": "½ (log r)²",
    "k3 (low_var_kl)": "r − 1 − log r",
}


def exact_kl(policy_full, ref_full) -> torch.Tensor:
    """KL(policy || reference) at every position, summed over the whole vocabulary."""
    return (policy_full.exp() * (policy_full - ref_full)).sum(-1)


def expected(policy_full, ref_full) -> dict:
    """Each estimator's exact expectation under the policy at every position (full vocabulary)."""
    from snippets.rl.trainer_side import kl_estimators

    p = policy_full.exp()
    return {k: (p * v).sum(-1) for k, v in kl_estimators(policy_full, ref_full).items()}


def kl_estimators_of(results) -> dict:
    """The estimators on the run's sampled log-probs (rank 0), in float64."""
    from snippets.rl.trainer_side import kl_estimators

    return kl_estimators(results[0]["policy_lp"].double(), results[0]["ref_lp"].double())


def kl_table(results) -> Table:
    r = results[0]
    est = kl_estimators_of(results)
    exp_ = expected(r["policy_full"].double(), r["ref_full"].double())
    kl = float(exact_kl(r["policy_full"].double(), r["ref_full"].double()).mean())
    rows = []
    for name, v in est.items():
        rows.append(
            [
                name,
                FORMULAS[name],
                f"{float(v.mean()):.5f}",
                f"{float(v.std()):.5f}",
                f"{float(exp_[name].mean()):.5f}",
                f"{kl:.5f}",
            ]
        )
    return Table(
        ["估计量", "公式（log r = logp_ref − logp）", "采样平均", "采样标准差", "全词表期望", "精确 KL"], rows
    )


def kind_counts(counts: dict, numel: dict) -> dict:
    """Changed elements and all elements per kind."""
    from snippets.rl.trainer_side import KINDS, param_kind

    out = {k: [0, 0] for k in KINDS}
    for name, n in counts.items():
        kind = param_kind(name)
        out[kind][0] += n
        out[kind][1] += numel[name]
    return {k: v for k, v in out.items() if v[1]}


def bits_shares(results) -> dict:
    """kind -> (share changed at step 1, mean share per step over steps 2.., share since start at
    the last step, first step where more than half changed since the start or None)."""
    r = results[0]
    numel = r["numel"]
    steps = len(r["per_step"])
    per = [kind_counts(c, numel) for c in r["per_step"]]
    since = [kind_counts(c, numel) for c in r["since_start"]]
    total = {n: numel[n] for n in numel}
    out = {}
    for kind in per[0]:
        n = per[0][kind][1]
        half = next((i + 1 for i in range(steps) if since[i][kind][0] > n / 2), None)
        later = [per[i][kind][0] / n for i in range(1, steps)] or [per[0][kind][0] / n]
        out[kind] = (per[0][kind][0] / n, sum(later) / len(later), since[-1][kind][0] / n, half, n)
    allc = sum(total.values())
    first = sum(r["per_step"][0].values()) / allc
    later = [sum(c.values()) / allc for c in r["per_step"][1:]] or [first]
    half = next((i + 1 for i, c in enumerate(r["since_start"]) if sum(c.values()) > allc / 2), None)
    out["全部"] = (first, sum(later) / len(later), sum(r["since_start"][-1].values()) / allc, half, allc)
    return out


def bits_table(results) -> Table:
    steps = len(results[0]["per_step"])
    rows = [
        [kind, n, f"{100 * a:.2f}%", f"{100 * b:.2f}%", f"{100 * c:.1f}%", half if half else f"> {steps}"]
        for kind, (a, b, c, half, n) in bits_shares(results).items()
    ]
    return Table(
        [
            "参数种类",
            "元素（本 rank）",
            "第 1 步变了的",
            f"第 2–{steps} 步每步平均",
            f"{steps} 步后与起点不同",
            "过半的步数",
        ],
        rows,
    )


def tables(results, dims, par) -> list:
    r = results[0]
    return [
        f"same full weights at TP=1 and TP={par.tp}: {r['same_weights']}",
        mismatch_table(results),
        ratio_table(results),
        kl_table(results),
        bits_table(results),
    ]


# ---- real sizes -----------------------------------------------------------------------------------


def _gib(x: float) -> float:
    """Bytes in GiB (2**30), two decimals: the unit of note 26 and the calculator."""
    return round(x / GIB, 2)


def per_gpu(model: str = "qwen3-8b", tp: int = 2, pp: int = 2, gpus: int = 8) -> dict:
    """Bytes per GPU of the trainer's state for ``model`` at TP x PP on ``gpus`` GPUs (distributed
    optimizer), from Megatron's weight formula (:mod:`snippets.cost.formulas`)."""
    from snippets.cost import formulas

    m = formulas.MODELS[model]
    c = formulas.Config(gpus_per_node=gpus, tp=tp, pp=pp, distributed_optimizer=True)
    n = formulas.params_per_gpu(m, c)["dense"] + formulas.params_per_gpu(m, c)["expert"]
    total = formulas.weight_and_optimizer_bytes(m, c).value
    return dict(params=n, weights=2 * n, grads=4 * n, optimizer=total - 6 * n, total=total, dp=c.dp)


def reference_rows(model: str = "qwen3-8b", tp: int = 2, pp: int = 2, gpus: int = 8) -> Table:
    s = per_gpu(model, tp, pp, gpus)
    return Table(
        ["每卡参数", "bf16 参考权重 GiB", "训练端 权重+梯度+优化器 GiB", "参考 ÷ 训练端"],
        [
            [
                f"{s['params'] / 1e9:.3f} B",
                _gib(s["weights"]),
                _gib(s["total"]),
                f"{s['weights'] / s['total']:.1%}",
            ]
        ],
    )


VLLM_SHARE = 0.6
"""``gpu_memory_utilization`` of verl's Qwen3-8B Megatron GRPO example: vLLM takes this share of
the GPU's *total* memory (weights, KV cache, its activations), here of ``HARDWARE["hbm_bytes"]``."""


def offload_rows(
    model: str = "qwen3-8b",
    tp: int = 2,
    pp: int = 2,
    gpus: int = 8,
    rollout_tp: int = 2,
    vllm_share: float = VLLM_SHARE,
) -> Table:
    """What verl's colocated (hybrid) round frees per GPU around rollout and refit, for ``model`` at
    the trainer's TP x PP and the rollout's TP, vLLM given ``vllm_share`` of the GPU (the Qwen3-8B
    Megatron GRPO example: TP 2, PP 2, rollout TP 2, gpu_memory_utilization 0.6)."""
    from snippets.cost import formulas

    s = per_gpu(model, tp, pp, gpus)
    m = formulas.MODELS[model]
    total = formulas.params_per_gpu(m, formulas.Config(gpus_per_node=gpus))["dense"]  # TP = PP = 1: all
    rollout_w = 2 * total / rollout_tp
    vllm = vllm_share * HARDWARE["hbm_bytes"]
    return Table(
        ["谁", "什么", "GiB/GPU", "何时放下 / 拿回"],
        [
            [
                "rollout",
                f"bf16 权重（rollout TP={rollout_tp}）",
                _gib(rollout_w),
                "采样后 sleep(level=2) 丢掉；refit 时先 wake 权重再写入",
            ],
            [
                "rollout",
                "KV cache 等（vLLM 份额减权重）",
                _gib(vllm - rollout_w),
                "同上丢掉；refit 完再 wake kv_cache",
            ],
            ["训练端", "bf16 权重", _gib(s["weights"]), "param_offload：拷到 pinned CPU，前向 / 训练时搬回"],
            ["训练端", "fp32 梯度缓冲", _gib(s["grads"]), "随 param_offload 释放（不拷贝，搬回时清零）"],
            [
                "训练端",
                f"fp32 主权重 + Adam 两个矩（÷DP={s['dp']}）",
                _gib(s["optimizer"]),
                "optimizer_offload：拷到 CPU，训练时搬回",
            ],
            [
                "参考模型",
                "bf16 权重（同样切分）",
                _gib(s["weights"]),
                "默认留在 GPU；ref 的 param_offload 打开则放 CPU",
            ],
        ],
    )


def colocated(
    model: str = "qwen3-8b", tp: int = 2, pp: int = 2, gpus: int = 8, vllm_share: float = VLLM_SHARE
) -> dict:
    """Bytes per GPU while vLLM is awake and the trainer offloads nothing: vLLM's share of the card,
    the trainer's state plus the reference's bf16 weights (Megatron's formula), their sum, the card
    (``HARDWARE["hbm_bytes"]``) and note 26's budget (``MEMORY_BUDGET``, the card less 10 %)."""
    s = per_gpu(model, tp, pp, gpus)
    vllm = vllm_share * HARDWARE["hbm_bytes"]
    kept = s["total"] + s["weights"]
    return dict(vllm=vllm, kept=kept, sum=vllm + kept, card=HARDWARE["hbm_bytes"], budget=MEMORY_BUDGET)


# ---- picture --------------------------------------------------------------------------------------


def draw_bits(results, *, title: str, width: int = 760, band: tuple = (0.01, 0.03)):
    """One row per parameter kind: the share of its bf16 weights whose bits changed at step 1
    (solid) and on average per step after it (outlined), on a 0-100 % scale; a faint ``band``
    marks verl's documented 1-3 % per step (docs/advance/delta_weight_sync.md)."""
    from snippets.record.draw import Figure

    shares = bits_shares(results)
    steps = len(results[0]["per_step"])
    row, top, left, bar_w = 19, 48, 120, 400
    height = top + row * len(shares) + 8
    fig = Figure(
        width,
        height,
        title=title,
        desc="每行一种参数：实心条是第 1 步后 bf16 位变了的元素份额，空心条是之后每步的平均份额（0–100%）；"
        "淡红的竖带是 verl 文档给的真实训练每步 1–3%。",
    )
    fig.text(10, 14, title, size=13, bold=True)
    x_end = fig.legend(left, 34, [("tp", "第 1 步"), ("light", f"第 2–{steps} 步每步平均")], size=11)
    lo, hi = band
    fig.rect(x_end + 8, 28, 12, 12, "accent", rx=1, faint=True)
    fig.text(x_end + 24, 34, "verl 文档：真实训练每步 1–3%", size=11, kind="muted")
    fig.rect(left + bar_w * lo, top - 2, bar_w * (hi - lo), row * len(shares) + 2, "accent", rx=0, faint=True)
    for i, (kind, (first, later, _, _, _)) in enumerate(shares.items()):
        y = top + row * i
        fig.text(10, y + 8, kind, size=11, mono=True, bold=kind == "全部")
        fig.rect(left, y + 1, bar_w, 14, "light", rx=1, faint=True)
        fig.rect(left, y + 1, max(bar_w * later, 1), 14, "light", rx=1, outline="tp")
        fig.rect(left, y + 4, max(bar_w * first, 1), 8, "tp", rx=1)
        fig.text(left + bar_w + 8, y + 8, f"{100 * first:.1f}% · {100 * later:.1f}%", size=11)
    fig.check()
    return fig
