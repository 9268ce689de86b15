"""Per-rank bytes of one micro-batch step under torch's FSDP2 and under Megatron TP / SP.

Note 15's self-test asks what Megatron Core gives that PyTorch FSDP alone does not. The answer is
measured on one tiny ``GPTModel`` (local spec) on two CPU ranks, three ways:

* **FSDP2** (``torch.distributed.fsdp.fully_shard`` on every ``TransformerLayer`` and on the whole
  model, DP = 2): each rank keeps ``1/2`` of every parameter and gradient, all-gathers a layer's
  parameters just before using them and reduce-scatters its gradients; each rank runs its *own*
  micro-batch through the *whole* layer, so what autograd saves is exactly the unsharded model's;
* **Megatron TP = 2**: both ranks run the *same* micro-batch; the four linears are split, so the
  activations inside attention and the MLP are split too, but norms and their inputs are whole;
* **Megatron TP = 2 + SP**: the norm / residual regions are split along the sequence as well.

:func:`step_bytes` runs one forward / backward and returns the bytes that stay on this rank:
parameters and gradients (their local shards), what autograd saved for backward at the end of the
forward (:class:`SavedBytes`: every saved tensor counted once per storage, parameters and the batch
left out), and the collectives the step issued.
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
    """The local-spec ``GPTModel`` at ``dims``, TP-split as ``parallel_state`` says."""
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


def fully_shard_layers(model) -> None:
    """FSDP2 the usual way: one group per ``TransformerLayer``, then the root for the rest."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.decoder.layers:
        fully_shard(layer)
    fully_shard(model)


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
