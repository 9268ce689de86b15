"""Note 27's experiment against independent computations: the vocab-parallel log-probs against a
plain log-softmax of the gathered logits, the KL estimators against the exact KL of the full
distributions, the changed bf16 bits against torch's own AdamW, the real-size rows against a
hand count of Qwen3-8B's parameters."""

from __future__ import annotations

import math

import pytest
import torch

from snippets.experiments import EXPERIMENTS, Parallel

TINY, PAR = EXPERIMENTS["rl-trainer"].tiny, Parallel(world=2, tp=2)
STEPS, KL_STEPS = 3, 4


@pytest.fixture(scope="module")
def results():
    from snippets.experiments import n27_rl_trainer
    from snippets.ranks.launch import run_ranks

    return run_ranks(n27_rl_trainer.run, 2, TINY, PAR, steps=STEPS, kl_steps=KL_STEPS, keep_tensors=True)


def test_same_weights_and_ranks_agree(results):
    assert results[0]["same_weights"] is True
    for key in ("logp_rollout", "policy_lp", "ref_lp"):
        assert torch.equal(results[0][key], results[1][key])
    for name in results[0]["rows"]:
        assert torch.equal(results[0]["rows"][name], results[1]["rows"][name])


def test_vocab_parallel_logprobs_are_a_plain_log_softmax(results):
    """-vocab_parallel_cross_entropy on TP-sharded logits == log_softmax of the gathered logits."""
    r = results[0]
    for lp, full in (("policy_lp", "policy_full"), ("ref_lp", "ref_full")):
        want = r[full].unsqueeze(0).expand(r["drawn"].shape[0], *r[full].shape)
        want = want.gather(-1, r["drawn"].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(r[lp], want, atol=2e-6, rtol=0)


def test_mismatch_comes_from_bf16_not_from_tp_in_fp32(results):
    from snippets.experiments.n27_rl_trainer import mismatch

    rows = results[0]["rows"]
    fp32 = mismatch(rows["train_fp32"], rows["tp1_fp32"])
    main = mismatch(rows["train_fp32"], results[0]["logp_rollout"])
    assert fp32["max"] < 1e-5 < main["mean"]
    # the distribution's own numbers, against numpy on the same differences
    d = (rows["train_fp32"] - results[0]["logp_rollout"]).double().abs().numpy().ravel()
    import numpy as np

    assert main["p90"] == pytest.approx(np.quantile(d, 0.9))
    assert main["max"] == pytest.approx(d.max()) and main["tokens"] == d.size


def test_bf16_trainer_leads_and_its_gap_is_the_tp_change(results):
    """The table's first pair is the deployed one (bf16 trainer against the bf16 rollout); its gap
    is the bf16 TP-only gap up to the shape row (near zero on CPU), far above fp32 rounding."""
    from snippets.experiments.n27_rl_trainer import PAIRS, RATIO_ROWS, mismatch

    assert PAIRS[0][:2] == ("train_bf16", "rollout") and RATIO_ROWS[0][0] == "train_bf16"
    r = results[0]
    rows = r["rows"]
    deployed = mismatch(rows["train_bf16"], r["logp_rollout"])
    tp_only = mismatch(rows["train_bf16"], rows["tp1_bf16"])
    shape = mismatch(rows["tp1_bf16"], r["logp_rollout"])
    assert shape["max"] < 1e-5 < deployed["mean"]
    assert abs(deployed["mean"] - tp_only["mean"]) <= shape["max"]


def test_kl_estimators_by_hand():
    from snippets.rl.trainer_side import kl_estimators

    est = kl_estimators(torch.tensor([-1.0]), torch.tensor([-2.0]))  # log r = -1
    assert float(est["k1 (kl)"]) == pytest.approx(1.0)
    assert float(est["abs"]) == pytest.approx(1.0)
    assert float(est["k2 (mse)"]) == pytest.approx(0.5)
    assert float(est["k3 (low_var_kl)"]) == pytest.approx(math.exp(-1) - 1 + 1)


def test_k1_and_k3_are_unbiased_for_the_exact_kl(results):
    """Under the policy, E[k1] = E[k3] = KL(policy || ref) exactly (full vocabulary); the sampled
    means are within five standard errors of it; the KL is well above rounding."""
    from snippets.experiments.n27_rl_trainer import exact_kl, expected
    from snippets.rl.trainer_side import kl_estimators

    r = results[0]
    p, q = r["policy_full"].double(), r["ref_full"].double()
    kl = exact_kl(p, q)
    exp_ = expected(p, q)
    torch.testing.assert_close(exp_["k1 (kl)"], kl, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(exp_["k3 (low_var_kl)"], kl, atol=1e-6, rtol=1e-6)
    assert float(kl.mean()) > 1e-4
    assert abs(float(exp_["k2 (mse)"].mean()) / float(kl.mean()) - 1) < 0.1  # k2 ~ KL for close policies
    est = kl_estimators(r["policy_lp"].double(), r["ref_lp"].double())
    for name in ("k1 (kl)", "k2 (mse)", "k3 (low_var_kl)"):
        v = est[name]
        stderr = float(v.std()) / math.sqrt(v.numel())
        assert abs(float(v.mean()) - float(exp_[name].mean())) < 5 * stderr + 1e-6, name


def test_changed_bits_match_torch_adamw(results):
    """Step 1 of Megatron's bf16 optimizer (fp32 main weights) against torch.optim.AdamW on fp32
    copies of the bf16 weights with the same gradients, rounded to bf16."""
    from megatron.core.optimizer import OptimizerConfig

    cfg = OptimizerConfig(lr=1e-6, bf16=True, weight_decay=0.01)
    s = results[0]["step1"]
    grads = {n: g.float() for n, g in s["grad"].items()}
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))  # TP shards: approximate
    scale = min(1.0, cfg.clip_grad / (norm + 1e-6))
    agree = total = 0
    for name, before in s["before"].items():
        w = torch.nn.Parameter(before.clone())
        w.grad = grads[name] * scale
        decay = 0.0 if (name.endswith("bias") or "norm" in name) else cfg.weight_decay
        opt = torch.optim.AdamW(
            [w], lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, weight_decay=decay
        )
        opt.step()
        mine = w.detach().bfloat16() != before.bfloat16()
        theirs = s["after"][name].bfloat16() != before.bfloat16()
        agree += int((mine == theirs).sum())
        total += before.numel()
    assert agree / total > 0.999


def test_bits_table_counts(results):
    from snippets.experiments.n27_rl_trainer import bits_shares

    shares = bits_shares(results)
    assert shares["norm.weight"][0] == 0.0  # LN weights at 1.0: a 1e-6 step is far below half an ulp
    for kind in ("qkv.bias", "proj.bias", "fc1.bias", "fc2.bias", "norm.bias"):
        assert shares[kind][0] == 1.0  # zero-initialised: any step is representable
    # step 1 moves each weight by about lr from a bf16 grid point: only |w| < 2**-11 (half a bf16 step
    # there is under 1e-6) round to a new value -- count those in the weights before the step
    before = results[0]["step1"]["before"]
    for kind, module in (
        ("fc1.weight", "linear_fc1"),
        ("qkv.weight", "linear_qkv"),
        ("fc2.weight", "linear_fc2"),
    ):
        small = [t.abs() < 2**-11 for n, t in before.items() if n.endswith(f"{module}.weight")]
        predicted = sum(int(m.sum()) for m in small) / sum(m.numel() for m in small)
        assert shares[kind][0] == pytest.approx(predicted, abs=0.004), kind
    numel = sum(results[0]["numel"].values())
    assert shares["全部"][4] == numel


def test_real_size_rows_by_hand():
    """Qwen3-8B at TP=2 PP=2 on 8 GPUs: the first stage holds 18 layers and the embedding, over TP=2."""
    from snippets.experiments.n27_rl_trainer import per_gpu

    h, kv, ffn, vocab = 4096, 8 * 128, 12288, 151936
    layer = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h + 2 * 128
    want = (18 * layer + vocab * h) / 2
    s = per_gpu("qwen3-8b", 2, 2, 8)
    assert s["params"] == pytest.approx(want, rel=1e-3)
    assert s["total"] == pytest.approx(s["params"] * (6 + 12 / 2))
    assert s["weights"] + s["grads"] + s["optimizer"] == pytest.approx(s["total"])


def test_colocated_sum_in_gib_against_the_card():
    """vLLM's gpu_memory_utilization is a share of the whole card (note 26's HARDWARE, 80 GiB); the
    sum is vLLM's share plus the trainer's state and the reference's bf16 weights."""
    from snippets.cost.formulas import GIB, HARDWARE, MEMORY_BUDGET
    from snippets.experiments.n27_rl_trainer import VLLM_SHARE, colocated, per_gpu

    c = colocated("qwen3-8b", 2, 2, 8)
    s = per_gpu("qwen3-8b", 2, 2, 8)
    assert c["card"] == HARDWARE["hbm_bytes"] == 80 * GIB and c["budget"] == MEMORY_BUDGET
    assert c["vllm"] == pytest.approx(VLLM_SHARE * 80 * GIB)
    assert c["kept"] == pytest.approx(s["total"] + s["weights"])
    assert c["sum"] == pytest.approx(c["vllm"] + c["kept"])
    assert c["budget"] < c["sum"] < c["card"]  # on the card, over note 26's 72 GiB budget
