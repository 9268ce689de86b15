"""CPU patches for Megatron's optimizers (optimizer, clip_grads, grad_scaler, distrib_optimizer):
each patched path runs on CPU ranks and matches torch's optimizer."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _two_layer_ddp(use_distributed_optimizer, **optimizer_config):
    """A two-layer module in Megatron DDP with Megatron's optimizer, and a torch copy of it."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer), module
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(use_distributed_optimizer=use_distributed_optimizer, **optimizer_config), [ddp]
    )
    return dist.get_rank(), dist.get_world_size(), module, reference, ddp, opt


def _two_steps(use_distributed_optimizer, torch_optimizer, reference_clip=0.0, **optimizer_config):
    # DP ranks each see half of a fixed batch; DDP averages their grads, so Megatron's optimizer
    # must reproduce the torch optimizer run in one process on the whole batch (its grads clipped
    # to reference_clip first, when given).
    rank, world, module, reference, ddp, opt = _two_layer_ddp(use_distributed_optimizer, **optimizer_config)
    torch_opt = torch_optimizer(reference.parameters())
    norms = []
    for step in range(2):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(x[rank * 8 // world : (rank + 1) * 8 // world]).pow(2).mean().backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt.step()
        torch_opt.zero_grad()
        reference(x).pow(2).mean().backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(  # the norm before clipping
            reference.parameters(), reference_clip or float("inf")
        ).item()
        torch_opt.step()
        norms.append((grad_norm, expected_norm))
    diff = max((a - b).abs().max().item() for a, b in zip(module.parameters(), reference.parameters()))
    inner = opt.chained_optimizers[0]
    return type(inner).__name__, ok, diff, norms, torch.zeros(1).type()


def _adam_two_steps(use_distributed_optimizer):
    return _two_steps(
        use_distributed_optimizer,
        lambda params: torch.optim.AdamW(params, lr=0.05, weight_decay=0.01),
        lr=0.05,
        clip_grad=0.0,
    )


def test_optimizer_device_fp32_optimizer_two_adam_steps_equal_torch():
    # optimizer_device: FP32Optimizer.__init__ builds its unit scale on 'cuda' (optimizer.py:1249).
    ((name, ok, diff, _, _),) = run_ranks(_adam_two_steps, 1, False)
    assert name == "FP32Optimizer" and ok and diff < 1e-6


def _clipped_step_grad_norm_groups():
    import torch.distributed as dist

    from snippets.record import recorder

    rank, world, module, _, ddp, opt = _two_layer_ddp(False, lr=0.05, clip_grad=1.0)
    steps = []
    for _ in range(2):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(torch.randn(4, 5)).pow(2).mean().backward()
        ddp.finish_grad_sync()
        with recorder.record() as calls:
            ok, _, _ = opt.step()
        steps.append((ok, [(c.api, c.where) for c in calls]))
    inner = opt.chained_optimizers[0]
    return dist.get_world_size(), steps, opt._has_grad_norm_group_cache, inner._has_grad_norm_group_cache


def test_optimizer_device_first_clipped_step_asks_every_rank_for_grad_norm_groups():
    # optimizer_device (optimizer.py:315): with clip_grad > 0 the first step asks, once, whether
    # any rank has parameters of a separately clipped group (MTP): a flag made with
    # device='cuda', all-reduced (MAX) over the grad-stats group, then cached.
    flag = ("all_reduce", "optimizer/optimizer.py::has_grad_norm_group")
    for world, steps, chained, inner in run_ranks(_clipped_step_grad_norm_groups, 2):
        assert world == 2 and chained == inner == {"mtp": False}
        (ok1, first), (ok2, second) = steps
        assert ok1 and ok2 and first.count(flag) == 1 and flag not in second


def test_grad_norm_device_norm_of_all_grads_across_dp_ranks():
    # grad_norm_device: every ChainedOptimizer.step computes the norm through clip_grads.py and
    # utils.py; with the distributed optimizer each rank holds half the grads and the squares
    # are summed across ranks.
    for _, _, _, norms, _ in run_ranks(_adam_two_steps, 2, True):
        for got, expected in norms:
            assert abs(got - expected) < 1e-5 * expected


def test_distrib_optimizer_type_check_dp2_equals_one_process_adamw():
    # distrib_optimizer_type_check: DistributedOptimizer accepts fp32 CPU params, and the
    # Tensor.type shadow is gone once it is built.
    for name, ok, diff, _, type_after in run_ranks(_adam_two_steps, 2, True):
        assert name == "DistributedOptimizer" and ok and diff < 1e-6
        assert type_after == "torch.FloatTensor"


def _adam_clipped_steps(use_distributed_optimizer, megatron_clip, reference_clip):
    # Adam with a large eps: with the default eps Adam's update hardly depends on the grads'
    # scale, which would hide a clip that did nothing. (The distributed optimizer takes only Adam.)
    return _two_steps(
        use_distributed_optimizer,
        lambda params: torch.optim.Adam(params, lr=0.5, eps=0.1),
        reference_clip,
        optimizer="adam",
        lr=0.5,
        adam_eps=0.1,
        weight_decay=0.0,
        clip_grad=megatron_clip,
    )


@pytest.mark.parametrize("dp, distributed", [(1, False), (2, True)])
def test_clip_grads_type_check_clipped_step_equals_torch_clip_grad_norm(dp, distributed):
    # clip_grads_type_check: with clip_grad below the norm, Megatron scales every (sharded) grad
    # by clip_grad / (norm + 1e-6) like torch.nn.utils.clip_grad_norm_ in one process.
    for _, ok, diff, norms, type_after in run_ranks(_adam_clipped_steps, dp, distributed, 0.05, 0.05):
        assert ok and diff < 1e-6 and type_after == "torch.FloatTensor"
        assert all(norm > 0.05 for _, norm in norms)  # the clip really acted
    # The comparison can tell a clipped step from an unclipped one.
    ((_, _, unclipped, _, _),) = run_ranks(_adam_clipped_steps, 1, False, 0.0, 0.05)
    assert unclipped > 1e-3


def _float16_adam_steps(precision, inject_inf_at=()):
    # A 16-bit module with Megatron's mixed-precision optimizer against torch AdamW on an fp32
    # master copy fed the same (unscaled) gradients, cast to fp32. An injected inf must skip the
    # step: no update, the dynamic loss scale halved (hysteresis=1).
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False)).to(dtype)
    master = [p.detach().float().clone().requires_grad_() for p in module.parameters()]
    config = TransformerConfig(
        num_layers=1, hidden_size=8, num_attention_heads=1, bf16=precision == "bf16", fp16=precision == "fp16"
    )
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), module)
    opt = get_megatron_optimizer(
        OptimizerConfig(
            lr=0.05,
            clip_grad=0.0,
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            initial_loss_scale=64.0,
            hysteresis=1,
        ),
        [ddp],
    )
    torch_adam = torch.optim.AdamW(master, lr=0.05, weight_decay=0.01)
    log = []
    for step in range(3):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step)).to(dtype)
        ddp.zero_grad_buffer()
        opt.zero_grad()
        scale = opt.get_loss_scale().item()
        opt.scale_loss(ddp(x).float().pow(2).mean()).backward()
        ddp.finish_grad_sync()
        grads = [p.main_grad.float() / scale for p in module.parameters()]
        if step in inject_inf_at:
            next(module.parameters()).main_grad.view(-1)[0] = float("inf")
        before = [p.detach().clone() for p in module.parameters()]
        ok, _, _ = opt.step()
        if ok:
            for p, g in zip(master, grads):
                p.grad = g
            torch_adam.step()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
        log.append((ok, unchanged, scale, opt.get_loss_scale().item()))
    mains = [p.main_param for p in module.parameters()]
    return dict(
        log=log,
        type=type(opt.chained_optimizers[0]).__name__,
        main_diff=max((a - b).abs().max().item() for a, b in zip(mains, master)),
        cast_back=all(torch.equal(m.to(dtype), p) for m, p in zip(mains, module.parameters())),
        main_dtypes={str(m.dtype) for m in mains},
        type_after=torch.zeros(1).type(),
    )


def test_float16_optimizer_type_check_bf16_main_params_follow_fp32_adamw():
    # float16_optimizer_type_check: Float16OptimizerWithFloat16Params accepts CPU bf16 params,
    # keeps fp32 main copies that follow torch AdamW, and casts them back into the bf16 weights.
    (r,) = run_ranks(_float16_adam_steps, 1, "bf16")
    assert r["type"] == "Float16OptimizerWithFloat16Params" and r["type_after"] == "torch.FloatTensor"
    assert [ok for ok, *_ in r["log"]] == [True, True, True]
    assert r["main_dtypes"] == {"torch.float32"} and r["main_diff"] < 1e-6 and r["cast_back"]


def test_grad_scaler_device_fp16_dynamic_scale_skips_an_overflow_and_halves():
    # grad_scaler_device: fp16 builds a DynamicGradScaler; an inf in a grad skips the step (the
    # weights stay bit-identical), halves the scale, and the next steps still follow AdamW.
    (r,) = run_ranks(_float16_adam_steps, 1, "fp16", (1,))
    assert r["log"] == [(True, False, 64.0, 64.0), (False, True, 64.0, 32.0), (True, False, 32.0, 32.0)]
    assert r["main_diff"] < 1e-6 and r["cast_back"]


def _dist_opt_bf16_main_params():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(3)]).bfloat16()
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, bf16=True)
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
        module,
    )
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.1, bf16=True, use_distributed_optimizer=True), [ddp])
    inner = opt.chained_optimizers[0]
    owned = {id(p) for group in inner.model_float16_groups for p in group}
    return [
        (
            id(p) in owned,
            getattr(p, "main_param_sharded", "missing"),
            "missing"
            if not hasattr(p, "main_param")
            else None
            if p.main_param is None
            else p.main_param.numel(),
        )
        for p in module.parameters()
    ]


def test_distrib_optimizer_init_type_check_unowned_bf16_params_get_the_placeholder():
    # distrib_optimizer_init_type_check: every bf16 param is marked sharded; one this rank owns no
    # slice of has main_param None (not missing); the owned slices cover each weight exactly once.
    results = run_ranks(_dist_opt_bf16_main_params, 2)
    for rows in results:
        for owned, sharded, main in rows:
            assert sharded is True and main != "missing"
            assert (main is not None) == owned
    assert any(main is None for rows in results for _, _, main in rows)  # the case the patch is for
    for i in range(3):
        assert sum(rows[i][2] or 0 for rows in results) == 64 * 64


def _dp_zero_gather():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)  # the same weights on both DP ranks, as after Megatron's broadcast
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), module
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=True), [ddp]
    )
    inner = opt.chained_optimizers[0]
    inner._init_optimizer_states_with_dummy_values()  # Adam state exists; a zero-grad step, no decay
    world = inner.get_parameter_state_dp_zero(use_gloo_comm=False, return_on_all_ranks=True)
    (buffer,) = ddp.buffers
    (param_world,) = world[0].values()
    placed = {
        name: param_world["param"][buffer.param_index_map[p][0] : buffer.param_index_map[p][1]]
        for name, p in module.named_parameters()
    }
    full = {name: p.detach().reshape(-1).clone() for name, p in module.named_parameters()}
    shard = sum(q.numel() for g in inner.optimizer.param_groups for q in g["params"])
    return placed, full, shard, "cuda" not in torch.Tensor.__dict__


def test_distrib_optimizer_gather_cuda_dp2_world_state_holds_every_full_param():
    # distrib_optimizer_gather_cuda: each DP rank owns half of the fp32 main params; the gather
    # (all_gather over the DP group, which the fully_reshardable checkpoint format uses) puts every
    # parameter back whole, on both ranks, at its place in the buffer.
    (p0, f0, n0, c0), (p1, f1, n1, c1) = run_ranks(_dp_zero_gather, 2)
    assert n0 + n1 == sum(t.numel() for t in f0.values()) and 0 < n0 < n0 + n1
    for name in f0:
        assert torch.equal(p0[name], f0[name]) and torch.equal(p1[name], f0[name])
    assert c0 and c1  # Tensor.cuda is torch's own again


def _set_state_without_step():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3, bias=False)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), module
    )
    inner = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, clip_grad=0.0, use_distributed_optimizer=True), [ddp]
    ).chained_optimizers[0]
    inner._init_optimizer_states_with_dummy_values()  # torch Adam now holds exp_avg, exp_avg_sq, step
    param = module.weight
    state_keys = sorted(inner._get_main_param_and_optimizer_states(param))
    new = {k: torch.full((12,), float(i + 1)) for i, k in enumerate(("param", "exp_avg", "exp_avg_sq"))}
    with torch.no_grad():  # as in load_parameter_state_from_fully_reshardable
        inner._set_main_param_and_optimizer_states(param, new)  # what that load passes
    after = inner._get_main_param_and_optimizer_states(param)
    return state_keys, {k: after[k].clone() for k in new}, new, after["step"].item()


def test_distrib_optimizer_torch_adam_step_load_without_step_keeps_step():
    # distrib_optimizer_torch_adam_step: torch Adam's per-param state has a "step" the loaded
    # tensors lack; param, exp_avg and exp_avg_sq are copied in and step stays what it was.
    ((keys, after, new, step),) = run_ranks(_set_state_without_step, 1)
    assert keys == ["exp_avg", "exp_avg_sq", "param", "step"]
    assert all(torch.equal(after[k], new[k]) for k in new) and step == 1.0


def _partial_distributed_optimizer():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    from snippets.cpu import CpuUnsupported

    ps.initialize_model_parallel(num_distributed_optimizer_instances=2)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, num_distributed_optimizer_instances=2
    )
    try:
        DistributedDataParallel(config, ddp_config, torch.nn.Linear(4, 4))
    except CpuUnsupported as error:
        return str(error)
    return "not refused"


def test_partial_distributed_optimizer_two_instances_refused_in_one_line():
    # partial_distributed_optimizer: DDP's inter-instance CUDA stream is refused by name.
    for message in run_ranks(_partial_distributed_optimizer, 2):
        assert message.startswith("num_distributed_optimizer_instances > 1") and "\n" not in message
        assert "not supported by the CPU layer" in message
