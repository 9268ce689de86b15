"""Bytes of model and optimizer state per parameter, per rank: the formula, and a measurement of
the real objects.

Mixed-precision Adam keeps, for every parameter: the model weight and its gradient buffer (in
the model's dtypes), an fp32 main copy of the weight (unless the weight already is fp32), an fp32
main gradient (unless the gradient buffer already is fp32), and Adam's two fp32 moments. The
non-distributed optimizer replicates all of it on every data-parallel rank. The distributed
optimizer (ZeRO stage 1) keeps the weight and gradient buffers whole -- forward and backward need
them -- but each DP rank holds the fp32 main weight, main gradient and moments only for its 1/DP
shard. This reproduces the table in Megatron's ``docs/user-guide/features/dist_optimizer.md``
(20 / 4+16/d, 18 / 6+12/d, 16 / 8+8/d bytes).
"""

from __future__ import annotations

import torch

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def bytes_per_parameter(param: str, grad: str, dp: int, distributed: bool) -> float:
    """Bytes per parameter on one rank for Adam with ``param``/``grad`` dtypes at DP size ``dp``."""
    weight, gradient = BYTES[param], BYTES[grad]
    main_weight = 4 if weight != 4 else 0  # fp32 master copy for 16-bit weights
    main_gradient = 4 if gradient != 4 else 0  # fp32 copy for 16-bit gradients
    adam = 4 + 4  # exp_avg, exp_avg_sq
    sharded = main_weight + main_gradient + adam
    return weight + gradient + (sharded / dp if distributed else sharded)


def measured_bytes(ddp, optimizer) -> dict:
    """What one rank really holds, in bytes, read from the real objects: DDP's parameter storage
    (its param buffer when the distributed optimizer remapped the weights, else the weights),
    DDP's grad buffer, the inner torch optimizer's state tensors, and fp32 main weights that are
    copies (not views of the model's weights)."""
    weights = sum(
        b.param_data.numel() * b.param_data.element_size()
        if b.param_data is not None
        else sum(p.numel() * p.element_size() for p in b.params)
        for b in ddp.buffers
    )
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers)
    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    state, main = 0, 0
    model_storages = {p.untyped_storage().data_ptr() for p in ddp.parameters()}
    for inner in inners:
        for group in inner.optimizer.param_groups:
            for p in group["params"]:
                if p.untyped_storage().data_ptr() not in model_storages:
                    main += p.numel() * p.element_size()
                for value in inner.optimizer.state[p].values():
                    if torch.is_tensor(value) and value.dim() > 0:
                        state += value.numel() * value.element_size()
    return dict(
        weights=weights,
        grads=grads,
        main_weights=main,
        adam_state=state,
        total=weights + grads + main + state,
    )
