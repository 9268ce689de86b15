"""Tensor-parallel linear layers in ~130 lines of code (plus comments), with Megatron's names.

Megatron's ``tensor_parallel/layers.py`` spreads one idea over 1,300 lines (fused gradient
accumulation, async communication, CPU offloading, MoE, checkpoint sharding). This module keeps
only the idea, so a note can put it beside the real layers and a test can prove both compute the
same outputs and gradients (``tests/ranks/test_tp_linear.py``, TP=2 and TP=4).

The idea: a linear layer ``Y = X Wᵀ + b`` with ``W`` stored as ``[out, in]`` (as ``nn.Linear`` and
Megatron store it) is split across the ranks of a tensor-parallel group in one of two ways.

* **Column parallel** — split ``W`` by output rows: rank ``r`` holds ``W[r-th out block, :]``
  (``[out/tp, in]``) and computes ``Y[..., r-th out block]``. Every rank needs the whole ``X``,
  and ``X``'s gradient is a sum of every rank's part: that is *f*.
* **Row parallel** — split ``W`` by input columns: rank ``r`` holds ``W[:, r-th in block]``
  (``[out, in/tp]``), reads ``X[..., r-th in block]`` and computes a partial ``Y``; the partials
  are summed: that is *g*. The bias is added once, after the sum.

Communication lives in the autograd functions at the top (each names the Megatron function it
stands for); the layers below only do the math. With ``sequence_parallel=True`` the activations
outside the layer pair are split along the sequence (first) dimension: *f* becomes an all-gather
along the sequence and *g* a reduce-scatter.

Differences from Megatron, on purpose (the outputs and gradients are the same):

* Megatron's column layer does not call *f*; it fuses *f*'s all-reduce into its linear autograd
  function (``allreduce_dgrad``) to overlap it with the weight-gradient matmul. Here *f* is explicit.
* With sequence parallel, Megatron saves only the local sequence shard and all-gathers it again
  in backward (less memory, one more all-gather). Here autograd saves the gathered input.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

# ----------------------------------------------------------------------------- communication
# Each function looks up torch.distributed at call time, so a recorder that wraps the
# collectives sees these calls too.


def _all_reduce(x, group):
    x = x.clone()  # never overwrite the caller's tensor (Megatron's _reduce does, in place)
    dist.all_reduce(x, group=group)
    return x


def _all_gather(x, group, dim):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x, group, dim):
    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


def _split(x, group, dim):
    return x.chunk(dist.get_world_size(group), dim=dim)[dist.get_rank(group)].contiguous()


class CopyToModelParallelRegion(torch.autograd.Function):
    """f (Megatron: ``copy_to_tensor_model_parallel_region``): forward identity, backward all-reduce.

    Every rank uses the same input; each rank's gradient is only its share, so they are summed."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class ReduceFromModelParallelRegion(torch.autograd.Function):
    """g (Megatron: ``reduce_from_tensor_model_parallel_region``): forward all-reduce, backward identity.

    The partial outputs are summed; the sum's gradient reaches every partial unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromModelParallelRegion(torch.autograd.Function):
    """Megatron: ``gather_from_tensor_model_parallel_region``: all-gather the last dim; backward
    keeps this rank's slice (what follows is computed identically on every rank)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, group, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.group, dim=-1), None


class ScatterToModelParallelRegion(torch.autograd.Function):
    """Megatron: ``scatter_to_tensor_model_parallel_region``: keep this rank's slice of the last
    dim; backward all-gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, group, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, dim=-1), None


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """f under sequence parallel (Megatron: ``gather_from_sequence_parallel_region``): all-gather
    the sequence dim; backward reduce-scatters it (sum the shares, keep this rank's positions)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, group, dim=0)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group, dim=0), None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """g under sequence parallel (Megatron: ``reduce_scatter_to_sequence_parallel_region``): sum the
    partials and keep this rank's positions of the sequence dim; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group, dim=0)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, dim=0), None


# ----------------------------------------------------------------------------- the layers


class ColumnParallelLinear(torch.nn.Module):
    """``Y = X Wᵀ + b`` with ``W`` split by output rows: this rank holds ``[out/tp, in]``.

    ``master_weight`` (``[out, in]``) and ``master_bias`` (``[out]``), when given, are the full
    tensors this rank takes its slice of."""

    def __init__(
        self,
        input_size,
        output_size,
        *,
        tp_group,
        bias=True,
        gather_output=False,
        sequence_parallel=False,
        master_weight=None,
        master_bias=None,
    ):
        super().__init__()
        self.tp_group = tp_group
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        tp, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
        self.output_size_per_partition = output_size // tp
        rows = slice(rank * self.output_size_per_partition, (rank + 1) * self.output_size_per_partition)
        if master_weight is None:
            master_weight = torch.zeros(output_size, input_size)
        self.weight = torch.nn.Parameter(master_weight[rows].clone())  # [out/tp, in]
        if bias:
            master_bias = torch.zeros(output_size) if master_bias is None else master_bias
            self.bias = torch.nn.Parameter(master_bias[rows].clone())  # [out/tp]
        else:
            self.bias = None

    def forward(self, x):
        if self.sequence_parallel:  # x: [s/tp, b, in] -> [s, b, in]
            x = GatherFromSequenceParallelRegion.apply(x, self.tp_group)
        else:  # x: [s, b, in], the same on every rank
            x = CopyToModelParallelRegion.apply(x, self.tp_group)
        y = F.linear(x, self.weight, self.bias)  # [s, b, out/tp]
        if self.gather_output:
            y = GatherFromModelParallelRegion.apply(y, self.tp_group)  # [s, b, out]
        return y


class RowParallelLinear(torch.nn.Module):
    """``Y = X Wᵀ + b`` with ``W`` split by input columns: this rank holds ``[out, in/tp]``.

    The bias is not split: it is added once, after the partial products are summed."""

    def __init__(
        self,
        input_size,
        output_size,
        *,
        tp_group,
        bias=True,
        input_is_parallel=True,
        sequence_parallel=False,
        master_weight=None,
        master_bias=None,
    ):
        super().__init__()
        if sequence_parallel and not input_is_parallel:
            raise ValueError("sequence_parallel needs input_is_parallel=True")
        self.tp_group = tp_group
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        tp, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
        self.input_size_per_partition = input_size // tp
        cols = slice(rank * self.input_size_per_partition, (rank + 1) * self.input_size_per_partition)
        if master_weight is None:
            master_weight = torch.zeros(output_size, input_size)
        self.weight = torch.nn.Parameter(master_weight[:, cols].clone())  # [out, in/tp]
        if bias:
            master_bias = torch.zeros(output_size) if master_bias is None else master_bias
            self.bias = torch.nn.Parameter(master_bias.clone())  # [out], whole
        else:
            self.bias = None

    def forward(self, x):
        if not self.input_is_parallel:  # x: [s, b, in] -> this rank's [s, b, in/tp]
            x = ScatterToModelParallelRegion.apply(x, self.tp_group)
        partial = F.linear(x, self.weight)  # [s, b, out], partial sum
        if self.sequence_parallel:
            y = ReduceScatterToSequenceParallelRegion.apply(partial, self.tp_group)  # [s/tp, b, out]
        else:
            y = ReduceFromModelParallelRegion.apply(partial, self.tp_group)  # [s, b, out]
        return y + self.bias if self.bias is not None else y


__all__ = [
    "CopyToModelParallelRegion",
    "ReduceFromModelParallelRegion",
    "GatherFromModelParallelRegion",
    "ScatterToModelParallelRegion",
    "GatherFromSequenceParallelRegion",
    "ReduceScatterToSequenceParallelRegion",
    "ColumnParallelLinear",
    "RowParallelLinear",
]
