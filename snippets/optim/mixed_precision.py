"""What a bf16 / fp16 model and its Megatron optimizer hold, read from the real objects (note 20).

Mixed precision keeps three kinds of numbers for each parameter: the 16-bit weight the model
computes with, the gradient DDP accumulates (``param.main_grad``, 16- or 32-bit by
``grad_reduce_in_fp32``), and an fp32 *main* copy of the weight that the optimizer updates and
casts back. ``Float16OptimizerWithFloat16Params`` keeps a whole fp32 copy of every 16-bit
parameter (``param.main_param``); the ``DistributedOptimizer`` keeps fp32 copies only of this
rank's slice (``param.main_param`` is then that slice, ``main_param_sharded`` is set).

:func:`param_rows` lists, per parameter, the dtypes and whether two of them share storage;
:func:`buffer_rows` lists the buffers one rank holds and their sizes.
"""

from __future__ import annotations

from snippets.models.tiny_gpt import global_name


def _same_storage(a, b) -> bool:
    return (
        a is not None and b is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def param_rows(ddp) -> list[dict]:
    """Per parameter: weight / main_grad / main_param dtypes and sizes, and which are copies."""
    rows = []
    for name, param in ddp.module.named_parameters():
        main = getattr(param, "main_param", None)
        rows.append(
            dict(
                name=global_name(ddp.module, name),
                param=str(param.dtype).replace("torch.", ""),
                main_grad=str(param.main_grad.dtype).replace("torch.", ""),
                main_param=str(main.dtype).replace("torch.", "") if main is not None else "-",
                numel=param.numel(),
                main_numel=main.numel() if main is not None else 0,
                main_is_copy=main is not None and not _same_storage(main, param),
                sharded=bool(getattr(param, "main_param_sharded", False)),
                main_grad_in_buffer=any(_same_storage(param.main_grad, b.grad_data) for b in ddp.buffers),
            )
        )
    return rows


def main_matches_param(ddp) -> bool:
    """Every weight equals its fp32 main copy rounded to the weight's dtype (whole-copy case)."""
    for param in ddp.module.parameters():
        main = getattr(param, "main_param", None)
        if main is not None and not getattr(param, "main_param_sharded", False):
            if not (main.to(param.dtype) == param).all():
                return False
    return True


def buffer_rows(ddp, optimizer) -> list[list]:
    """The buffers this rank holds: ``[what, dtype, elements]`` (DDP's, then the optimizer's)."""
    rows = []
    for buffer in ddp.buffers:
        if buffer.param_data is not None:
            rows.append(
                ["DDP param buffer（模型权重）", str(buffer.param_data.dtype), buffer.param_data.numel()]
            )
        rows.append(["DDP grad buffer（main_grad）", str(buffer.grad_data.dtype), buffer.grad_data.numel()])
    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    model_storages = {p.untyped_storage().data_ptr() for p in ddp.parameters()}
    copies, views, state = [], [], []
    for inner in inners:
        for group in inner.optimizer.param_groups:
            for p in group["params"]:
                (views if p.untyped_storage().data_ptr() in model_storages else copies).append(p)
                state += [v for v in inner.optimizer.state[p].values() if hasattr(v, "dim") and v.dim() > 0]
    if copies:
        rows.append(["fp32 主参数（优化器自己的拷贝）", str(copies[0].dtype), sum(p.numel() for p in copies)])
    if views:
        rows.append(
            ["主参数 = 模型权重的视图（不另占内存）", str(views[0].dtype), sum(p.numel() for p in views)]
        )
    if state:
        rows.append(["Adam 状态 exp_avg + exp_avg_sq", str(state[0].dtype), sum(t.numel() for t in state)])
    return [[what, dtype.replace("torch.", ""), n] for what, dtype, n in rows]
