"""Per-rank bytes of one micro-batch step under torch's FSDP2 and under Megatron TP / SP, and the
same comparison computed for an 8B model.

Note 15 asks when FSDP beats the distributed optimizer plus TP. The measured half runs one tiny
``GPTModel`` (local spec) on two CPU ranks, three ways:

* **FSDP2** through Megatron's own wrapper ``TorchFullyShardedDataParallel`` (``fully_shard`` on
  the embedding, every ``TransformerLayer`` and the whole model, DP = 2): each rank keeps ``1/2``
  of every parameter and gradient, all-gathers a unit's parameters just before using them and
  reduce-scatters its gradients; each rank runs its *own* micro-batch through the *whole* layer, so
  what autograd saves is exactly the unsharded model's;
* **Megatron TP = 2**: both ranks run the *same* micro-batch; the four linears are split, so the
  activations inside attention and the MLP are split too, but norms and their inputs are whole;
* **Megatron TP = 2 + SP**: the norm / residual regions are split along the sequence as well.

:func:`step_bytes` runs one forward / backward and returns the bytes that stay on this rank:
parameters and gradients (their local shards), what autograd saved for backward at the end of the
forward (:class:`SavedBytes`: every saved tensor counted once per storage, parameters and the batch
left out), and the collectives the step issued.

:func:`model_state_table` is the computed half: per-GPU bytes of model state (weights, gradients,
fp32 main weights, Adam), activations and communication for one model on a fixed number of GPUs,
under DDP, the distributed optimizer with and without TP (+ SP), and FSDP that shards everything
(Megatron-FSDP's ``optim_grads_params``), from the formulas the note states.
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table


def _local(t) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


class SavedBytes:
    """Bytes autograd holds for backward while the block runs; ``peak`` after it."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.live: dict[int, int] = {}
        self.peak = 0

    def _pack(self, tensor):
        # A parameter is saved as itself or as a view of it (FSDP2's unsharded ones included).
        base = tensor._base if tensor._base is not None else tensor
        key = tensor.untyped_storage().data_ptr()
        if not isinstance(base, torch.nn.Parameter) and key not in self.exclude and key not in self.live:
            self.live[key] = tensor.untyped_storage().nbytes()
            self.peak = max(self.peak, sum(self.live.values()))
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def tiny_gpt(dims, tp: int = 1, sequence_parallel: bool = False):
    """The local-spec ``GPTModel`` at ``dims``, TP-split as ``parallel_state`` says. Its config says
    ``transformer_impl="local"``, as the spec is: ``TorchFullyShardedDataParallel`` reads it to
    decide whether ``ColumnParallelLinear`` is a unit of its own (note 15's pitfall)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        use_cpu_initialization=True,
        transformer_impl="local",
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return GPTModel(config, get_gpt_layer_local_spec(), vocab_size=dims.vocab, max_sequence_length=dims.seq)


def step_bytes(model, batch) -> dict:
    """One forward + backward of ``batch``: this rank's parameter, gradient and saved-activation
    bytes, and the collectives (API and group size) the step issued."""
    from snippets.record import recorder

    with recorder.record() as calls, SavedBytes(exclude=batch.values()) as saved:
        loss = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
        loss.float().mean().backward()
    params = list(model.parameters())
    counts: dict[str, int] = {}
    for c in calls:
        if len(c.ranks) > 1:
            key = f"{c.api.removesuffix('_single').removesuffix('_into_tensor').removesuffix('_tensor')}"
            counts[key] = counts.get(key, 0) + 1
    return dict(
        params=_nbytes(params),
        grads=_nbytes(p.grad for p in params),
        saved=saved.peak,
        calls=counts,
    )


def memory_table(rows: list) -> Table:
    """One row per way of running: per-rank bytes and the step's collectives (rank 0)."""
    return Table(
        [
            "方式",
            "每 rank 参数字节",
            "每 rank 梯度字节",
            "每 rank 为 backward 保存的激活字节",
            "一步的通信（rank 0）",
        ],
        [
            [
                label,
                r["params"],
                r["grads"],
                r["saved"],
                "、".join(f"{k} ×{n}" for k, n in r["calls"].items()) or "无",
            ]
            for label, r in rows
        ],
    )


# ----------------------------------------------------------------------------- computed for a real model

GB = 1e9
PARAM, GRAD, SHARDED = 2, 4, 4 + 8  # bf16 weight, fp32 gradient; fp32 main weight + Adam's two moments


def model_state_rows(d, gpus: int = 8) -> list[list]:
    """Per GPU, for ``d`` (a :class:`snippets.models.presets.Dims`) on ``gpus`` GPUs, bf16 weights, fp32
    gradients, Adam, micro-batches of ``d.seq`` tokens: ``[way, sequences a step needs at least, what
    every GPU keeps whole, model-state bytes per parameter of the model, model state GB, activations
    GB, what one GPU sends]``.

    Model state: DDP keeps all 18 bytes of every parameter; the distributed optimizer keeps the
    weight and gradient (6) and 12/dp of the rest, on the parameters of its TP shard
    (:func:`~snippets.models.memory_estimate.stage_weight_elements`); FSDP that shards all of it
    keeps 18/dp, plus two units (layers) whole while one is computed and the next prefetched.
    Activations: what one layer saves for backward for one micro-batch (the local spec's per-token
    tensors, without the ``s x s`` probabilities flash attention does not keep), in bf16, times the
    layers; sequence parallel splits all of it by TP, FSDP none of it. Communication is what one GPU
    sends, a ring's ``(n-1)/n`` of each collective: DDP's all-reduce (twice that) and the distributed
    optimizer's reduce-scatter (fp32) plus all-gather (bf16) once a step; FSDP's two all-gathers and
    a reduce-scatter every micro-batch; TP + SP's 2 all-gathers + 2 reduce-scatters forward and
    4 + 2 backward of an ``[s, b, h]`` tensor in every layer, every micro-batch.
    """
    from snippets.models.memory_estimate import (
        attention_scores_elements,
        layer_activation_elements,
        layer_weight_elements,
        stage_weight_elements,
    )

    def activations(tp):
        per_layer = layer_activation_elements(d, tp, sequence_parallel=tp > 1) - attention_scores_elements(
            d, tp
        )
        return per_layer * d.layers * PARAM / GB

    def ring(n):
        return (n - 1) / n

    whole = stage_weight_elements(d)
    activation = d.seq * d.micro_batch_size * d.hidden * PARAM  # one [s, b, h] tensor in bf16
    full = PARAM + GRAD + SHARDED
    rows = [
        [
            "DDP",
            gpus,
            "全部",
            full,
            whole * full / GB,
            activations(1),
            f"{ring(gpus) * 2 * whole * GRAD / GB:.0f} GB / 步（DP）",
        ]
    ]
    for tp in (1, 2, gpus):
        dp = gpus // tp
        mine = stage_weight_elements(d, tp)
        per_param = PARAM + GRAD + SHARDED / dp
        comm = [f"{ring(dp) * mine * (GRAD + PARAM) / GB:.0f} GB / 步（DP）"] if dp > 1 else []
        comm += [f"{ring(tp) * 10 * activation * d.layers / GB:.1f} GB / micro-batch（TP）"] if tp > 1 else []
        rows.append(
            [
                f"分布式优化器{f' + TP={tp}、SP' if tp > 1 else ''}，DP={dp}",
                dp,
                "bf16 权重、fp32 梯度" + (f"（TP 的 1/{tp}）" if tp > 1 else ""),
                per_param * mine / whole,
                per_param * mine / GB,
                activations(tp),
                "，".join(comm),
            ]
        )
    working = 2 * layer_weight_elements(d) * (PARAM + GRAD)
    rows.append(
        [
            f"FSDP（optim_grads_params），DP={gpus}",
            gpus,
            "正在算和预取的 2 层",
            full / gpus,
            (full / gpus * whole + working) / GB,
            activations(1),
            f"{ring(gpus) * whole * (PARAM + PARAM + GRAD) / GB:.0f} GB / micro-batch（DP）",
        ]
    )
    return [[*r[:3], round(r[3], 2), round(r[4], 1), round(r[5], 1), r[6]] for r in rows]


def model_state_table(d, name: str, gpus: int = 8) -> Table:
    """:func:`model_state_rows` as the table note 15 prints, titled with the model's size."""
    from snippets.models.memory_estimate import stage_weight_elements

    return Table(
        [
            "方式",
            "一步至少几条序列",
            "每卡整份存的",
            "模型状态 字节 / 参数",
            "模型状态 GB / 卡",
            "激活 GB / 卡（估计）",
            "每卡发送",
        ],
        model_state_rows(d, gpus),
        title=f"{name}（{stage_weight_elements(d) / 1e9:.2f}B 参数）放在 {gpus} 张卡上：bf16 权重、fp32 梯度、Adam，"
        f"每个 micro-batch 1 条 {d.seq} token 的序列",
    )
