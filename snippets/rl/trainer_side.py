"""The trainer's side of one RL round on a real tiny ``GPTModel`` (note 27).

Everything here runs inside a rank (gloo, CPU) with ``megatron.core`` 0.19.0:

* :func:`build` -- a ``GPTModel`` (local spec) at the current TP size, initialised on the CPU from
  one seed, so its full weights do not depend on TP (Megatron draws the whole matrix and keeps its
  slice); ``bf16`` wraps it in ``Float16Module`` as the trainer does;
* :func:`generate` -- the rollout stand-in: sample continuations token by token from a TP = 1 model
  (each step a full forward of the prefix), keeping the log-prob of each sampled token;
* :func:`token_logprobs` -- the trainer's recompute: one forward over the whole sequences and
  Megatron's ``tensor_parallel.vocab_parallel_cross_entropy`` on the TP-sharded logits
  (log-prob = minus the loss);
* :func:`kl_estimators` -- k1, k2, k3 (``low_var_kl``) and ``abs`` on per-token log-probs;
* :func:`grpo_loss` / :func:`optimizer_for` / :func:`train_step` -- a GRPO step with Megatron's
  DDP and ``get_megatron_optimizer``;
* :func:`param_kind` / :func:`bits` -- which kind of weight a parameter is and its raw bf16 bits.
"""

from __future__ import annotations

import torch

KINDS = (
    "embedding",
    "position",
    "qkv.weight",
    "qkv.bias",
    "proj.weight",
    "proj.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
    "norm.weight",
    "norm.bias",
    "output",
)
"""Parameter kinds in the order the tables print them."""


def param_kind(name: str) -> str:
    """The kind of parameter ``name`` of a local-spec ``GPTModel`` (any wrapper prefix)."""
    last = name.split(".")[-1]
    if "word_embeddings" in name:
        return "embedding"
    if "position_embeddings" in name:
        return "position"
    if "output_layer" in name:
        return "output"
    if "norm" in name:  # input_layernorm, pre_mlp_layernorm, final_layernorm
        return "norm." + last
    for part, kind in (
        ("linear_qkv", "qkv"),
        ("linear_proj", "proj"),
        ("linear_fc1", "fc1"),
        ("linear_fc2", "fc2"),
    ):
        if part in name:
            return f"{kind}.{last}"
    raise ValueError(f"unknown parameter {name}")


def config(dims, bf16: bool = False, **fields):
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        **dims.transformer_config_kwargs(),
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        bf16=bf16,
        **fields,
    )


def build(dims, seed: int = 0, std: float = 0.02):
    """A fp32 ``GPTModel`` at the current TP size; the same full weights at every TP size.
    ``std`` is ``init_method_std`` (Megatron's default 0.02)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    torch.manual_seed(seed)
    return GPTModel(
        config(dims, init_method_std=std),
        get_gpt_layer_local_spec(),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
        share_embeddings_and_output_weights=False,
    )


def to_bf16(dims, model):
    """``Float16Module``: bf16 weights, fp32 logits out (what a bf16 Megatron model runs as)."""
    from megatron.core.transformer.module import Float16Module

    return Float16Module(config(dims, bf16=True), model)


def full_weights(model) -> dict:
    """Every parameter gathered over TP to its full shape (fp32), by name without wrappers."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    group = parallel_state.get_tensor_model_parallel_group()
    out = {}
    for name, p in model.named_parameters():
        name = name.replace("module.", "")
        t = p.detach().float()
        if tp > 1 and getattr(p, "tensor_model_parallel", False):
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t.contiguous(), group=group)
            t = torch.cat(parts, dim=p.partition_dim)
        out[name] = t.clone()
    return out


def inputs(tokens):
    """position ids and the causal mask (True = masked) ``GPTModel.forward`` takes."""
    b, s = tokens.shape
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    return position_ids, mask


@torch.no_grad()
def generate(model, prompts, new_tokens: int, seed: int):
    """Sample ``new_tokens`` after ``prompts`` [b, p] from ``model`` (TP = 1): each step one forward
    of the whole prefix, softmax of the last position in fp32, one draw. Returns the sequences
    [b, p + new] and the log-prob of each sampled token under the sampler [b, new]."""
    gen = torch.Generator().manual_seed(seed)
    tokens, logps = prompts.clone(), []
    for _ in range(new_tokens):
        logits = model(tokens, *inputs(tokens))[:, -1].float()  # [b, vocab]
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)  # [b, 1]
        logps.append(logp.gather(1, nxt))
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens, torch.cat(logps, dim=1)


def token_logprobs(model, tokens, labels=None):
    """log-prob of ``labels`` [b, s] (default: the next token) at every position, via Megatron's
    ``vocab_parallel_cross_entropy`` on this rank's vocabulary slice of the logits: [b, s - 1]
    (or [b, s]). Each TP rank holds vocab/TP logits; the max, the sum of exp and the target's
    logit are all-reduced over TP inside the call."""
    from megatron.core import tensor_parallel

    logits = model(tokens, *inputs(tokens))  # [b, s, vocab / tp]
    if labels is None:
        logits, labels = logits[:, :-1], tokens[:, 1:]
    loss = tensor_parallel.vocab_parallel_cross_entropy(
        logits.transpose(0, 1).contiguous().float(), labels.transpose(0, 1).contiguous()
    )  # [s, b]
    return -loss.transpose(0, 1)


def full_logprobs(model, tokens):
    """log-softmax over the whole vocabulary at every position [b, s, vocab] (logits gathered
    over TP): the exact distributions the sampled estimators are checked against."""
    from megatron.core import tensor_parallel

    with torch.no_grad():
        logits = model(tokens, *inputs(tokens)).float()
        logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
    return torch.log_softmax(logits, dim=-1)


def kl_estimators(logp, ref_logp) -> dict:
    """Per-token estimators of KL(policy || reference) from log-probs of tokens drawn from the
    policy, with log r = ref_logp - logp (verl's kl_penalty: kl = k1, mse = k2, low_var_kl = k3,
    abs; NeMo RL's k3 is the same as low_var_kl before clamping)."""
    log_ratio = ref_logp - logp
    return {
        "k1 (kl)": -log_ratio,
        "abs": log_ratio.abs(),
        "k2 (mse)": 0.5 * log_ratio**2,
        "k3 (low_var_kl)": torch.exp(log_ratio) - 1 - log_ratio,
    }


def grpo_loss(logp, old_logp, advantages):
    """The policy-gradient loss of PPO / GRPO: minus the advantage times the ratio, averaged over
    tokens. Every step here starts on-policy (ratio = 1), where PPO's clip changes nothing, so it
    is left out."""
    ratio = torch.exp(logp - old_logp)
    return -(advantages[:, None] * ratio).mean()


def optimizer_for(dims, model, lr: float, bf16: bool):
    """Megatron's DDP around ``model`` (wrapped in ``Float16Module`` when ``bf16``) and
    ``get_megatron_optimizer``: with ``bf16`` the model keeps bf16 weights and the optimizer fp32
    main copies of them."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    cfg = config(dims, bf16=bf16)
    if bf16:
        model = to_bf16(dims, model)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(lr=lr, bf16=bf16, weight_decay=0.01), [ddp])
    return ddp, opt


def train_step(ddp, opt, tokens, advantages, prompt_len: int):
    """One GRPO step on the generated tokens: forward, loss, backward, grad sync, optimizer step."""
    from megatron.core.distributed import finalize_model_grads

    ddp.zero_grad_buffer()
    opt.zero_grad()
    logp = token_logprobs(ddp, tokens)[:, prompt_len - 1 :]
    loss = grpo_loss(logp, logp.detach(), advantages)
    loss.backward()
    finalize_model_grads([ddp])
    ok, grad_norm, _ = opt.step()
    return float(loss.detach()), ok


def bits(model) -> dict:
    """The raw 16 bits of every bf16 parameter, by name without wrappers."""
    return {
        n.replace("module.", ""): p.detach().view(torch.int16).clone()
        for n, p in model.named_parameters()
        if p.dtype == torch.bfloat16
    }
