"""Each CPU patch: the Megatron line it is for is really there, and the patched path runs and
computes the right numbers on CPU ranks."""

import pytest
import torch

from snippets.cpu import compat as cpu_compat
from snippets.ranks.launch import run_ranks, warm_up
from snippets.site.sources import file_lines


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


@pytest.mark.parametrize(
    "site", [s for p in cpu_compat.PATCHES for s in p.sites], ids=lambda s: f"{s.path}:{s.line}"
)
def test_each_cited_line_needs_its_patch(site):
    assert site.text in file_lines(site.path)[site.line - 1]


def test_apply_is_idempotent_and_names_every_patch():
    first = cpu_compat.apply()
    proxy = __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch
    assert cpu_compat.apply() == first == sorted(p.name for p in cpu_compat.PATCHES)
    assert __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch is proxy
    assert torch.cuda.current_device() == "cpu"


def test_scoped_patches_leave_torch_alone():
    cpu_compat.apply()
    assert not isinstance(torch, cpu_compat.ModuleProxy)
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")  # only schedules.py sees the CPU-mapped zeros


def _column_parallel_equals_dense():
    # current_device: ColumnParallelLinear allocates its gather buffer on current_device().
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    config = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True)
    torch.manual_seed(0)
    layer = ColumnParallelLinear(6, 8, config=config, init_method=torch.nn.init.normal_,
                                 bias=False, gather_output=True)
    x = torch.randn(3, 2, 6)
    y, _ = layer(x)
    shards = [torch.empty_like(layer.weight) for _ in range(2)]
    dist.all_gather(shards, layer.weight.detach())
    dense = x @ torch.cat(shards, dim=0).T
    return tuple(layer.weight.shape), tuple(y.shape), torch.allclose(y, dense, atol=1e-6)


def test_current_device_column_parallel_linear_equals_dense():
    for weight, out, equal in run_ranks(_column_parallel_equals_dense, 2):
        assert (weight, out, equal) == ((4, 6), (3, 2, 8), True)


def _rng_streams():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        model_parallel_cuda_manual_seed,
    )

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(123)
    before = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        tp_region = torch.rand(4)
    after_fork = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        tp_region_next = torch.rand(4)
    default = torch.rand(4)
    torch.manual_seed(123)
    return dict(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_region=tp_region,
        stream_advances=not torch.equal(tp_region, tp_region_next),
        default_restored=torch.equal(before, after_fork),
        default=default,
        default_expected=torch.rand(4),
    )


def test_rng_tracker_keeps_a_model_parallel_stream_per_tp_rank():
    r = run_ranks(_rng_streams, 4)  # tp=2, dp=2: ranks 0,2 are tp rank 0; ranks 1,3 tp rank 1
    assert [x["tp_rank"] for x in r] == [0, 1, 0, 1]
    assert torch.equal(r[0]["tp_region"], r[2]["tp_region"])      # same tp rank: same stream
    assert not torch.equal(r[0]["tp_region"], r[1]["tp_region"])  # other tp rank: other stream
    for x in r:
        assert x["stream_advances"] and x["default_restored"]
        assert torch.equal(x["default"], x["default_expected"])  # default stream = the seed


def _no_pipelining_loss():
    from functools import partial

    from megatron.core import parallel_state as ps
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model.config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1,
                                     pipeline_dtype=torch.float32)
    model.model_type = ModelType.encoder_or_decoder
    model.set_input_tensor = lambda tensor: None  # only pipeline stages > 0 receive one
    batches = [torch.randn(3, 4) for _ in range(2)]

    def loss_func(output):
        loss = output.pow(2).mean()
        # clone: the schedule divides `loss` in place by num_microbatches (schedules.py:269),
        # and a bare detach() shares its storage, so the logged value would change with it.
        return loss, {"loss": loss.detach().clone()}

    def forward_step(data_iterator, model):
        return model(next(data_iterator)), loss_func

    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
        num_microbatches=2, seq_length=3, micro_batch_size=1, forward_only=False,
    )
    expected = sum(model(b).pow(2).mean() for b in batches) / 2
    grad = model.weight.grad.clone()
    model.zero_grad()
    expected.backward()
    got = sum(o["loss"] for o in out) / 2
    return torch.allclose(got, expected.detach()), torch.allclose(grad, model.weight.grad)


def test_schedules_device_no_pipelining_matches_autograd():
    assert run_ranks(_no_pipelining_loss, 1) == [(True, True)]


def _checkpoint_round_trip(tmp):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing import ShardedTensor

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    local = torch.arange(6.0).view(2, 3) + 10 * rank
    sharded = {"w": ShardedTensor.from_rank_offsets("w", local, (0, rank, 2), replica_id=0)}
    dist_checkpointing.save(sharded, tmp)
    target = {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(2, 3), (0, rank, 2),
                                                   replica_id=0)}
    loaded = dist_checkpointing.load(target, tmp)
    return torch.equal(loaded["w"], local)


def test_synchronize_checkpoint_save_and_load(tmp_path):
    # The torch_dist writer calls torch.cuda.synchronize() while staging tensors.
    assert run_ranks(_checkpoint_round_trip, 2, str(tmp_path)) == [True, True]


def test_the_site_page_shows_the_current_patch_table():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "cpu.md").read_text()
    shown = page.split("<!-- patches:start -->\n", 1)[1].split("<!-- patches:end -->", 1)[0]
    assert shown.strip() == cpu_compat.render_table().strip()


def _layer_with_sequence_parallel(tp, sp):
    # torch_norm_sequence_parallel: the local spec's norms are WrappedTorchNorm, which asserts on SP.
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=4, num_query_groups=2, kv_channels=4,
        ffn_hidden_size=24, gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0,
        tensor_model_parallel_size=tp, sequence_parallel=sp, use_cpu_initialization=True)
    torch.manual_seed(0)
    layer = build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=config,
                         layer_number=1)
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), module=layer)
    x = torch.randn(6, 2, 16, generator=torch.Generator().manual_seed(1))
    rank = ps.get_tensor_model_parallel_rank()
    x = (x.chunk(tp)[rank] if sp else x).clone().requires_grad_()
    mask = torch.triu(torch.ones(1, 1, 6, 6, dtype=torch.bool), diagonal=1)
    y, _ = model(x, attention_mask=mask)
    y.pow(2).sum().backward()
    norm = layer.input_layernorm.weight
    partial = norm.main_grad.clone()
    finalize_model_grads([model])
    grads = {n: p.main_grad.clone() for n, p in layer.named_parameters()}
    return dict(y=y.detach(), dx=x.grad, grads=grads, partial=partial,
                marked=[n for n, p in layer.named_parameters() if getattr(p, "sequence_parallel", 0)],
                params={n: p for n, p in layer.named_parameters()})


def test_torch_norm_sequence_parallel_layer_equals_tp1():
    from snippets.tp.layer_walk import tp_shard

    (one,) = run_ranks(_layer_with_sequence_parallel, 1, 1, False)
    two = run_ranks(_layer_with_sequence_parallel, 2, 2, True)
    assert two[0]["marked"] == ["input_layernorm.weight", "pre_mlp_layernorm.weight"]
    assert torch.allclose(torch.cat([r["y"] for r in two]), one["y"], atol=1e-5)
    assert torch.allclose(torch.cat([r["dx"] for r in two]), one["dx"], atol=1e-5)
    full_norm_grad = one["grads"]["input_layernorm.weight"]
    # Each rank saw half of the tokens: its norm gradient is a partial sum, not the answer...
    assert not torch.allclose(two[0]["partial"], full_norm_grad, atol=1e-4)
    assert torch.allclose(two[0]["partial"] + two[1]["partial"], full_norm_grad, atol=1e-5)
    # ...until finalize_model_grads sums the marked parameters over TP.
    for rank, r in enumerate(two):
        for name, grad in r["grads"].items():
            expected = tp_shard(one["grads"][name], r["params"][name], rank, 2)
            assert torch.allclose(grad, expected, atol=1e-5), name


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
        config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer),
        module)
    opt = get_megatron_optimizer(
        OptimizerConfig(use_distributed_optimizer=use_distributed_optimizer, **optimizer_config), [ddp])
    return dist.get_rank(), dist.get_world_size(), module, reference, ddp, opt


def _two_steps(use_distributed_optimizer, torch_optimizer, reference_clip=0.0, **optimizer_config):
    # DP ranks each see half of a fixed batch; DDP averages their grads, so Megatron's optimizer
    # must reproduce the torch optimizer run in one process on the whole batch (its grads clipped
    # to reference_clip first, when given).
    rank, world, module, reference, ddp, opt = _two_layer_ddp(use_distributed_optimizer,
                                                              **optimizer_config)
    torch_opt = torch_optimizer(reference.parameters())
    norms = []
    for step in range(2):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(x[rank * 8 // world:(rank + 1) * 8 // world]).pow(2).mean().backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt.step()
        torch_opt.zero_grad()
        reference(x).pow(2).mean().backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(  # the norm before clipping
            reference.parameters(), reference_clip or float("inf")).item()
        torch_opt.step()
        norms.append((grad_norm, expected_norm))
    diff = max((a - b).abs().max().item() for a, b in zip(module.parameters(), reference.parameters()))
    inner = opt.chained_optimizers[0]
    return type(inner).__name__, ok, diff, norms, torch.zeros(1).type()


def _adam_two_steps(use_distributed_optimizer):
    return _two_steps(use_distributed_optimizer,
                      lambda params: torch.optim.AdamW(params, lr=0.05, weight_decay=0.01),
                      lr=0.05, clip_grad=0.0)


def test_optimizer_device_fp32_optimizer_two_adam_steps_equal_torch():
    # optimizer_device: FP32Optimizer.__init__ builds its unit scale on 'cuda' (optimizer.py:907).
    (name, ok, diff, _, _), = run_ranks(_adam_two_steps, 1, False)
    assert name == "FP32Optimizer" and ok and diff < 1e-6


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
    return _two_steps(use_distributed_optimizer,
                      lambda params: torch.optim.Adam(params, lr=0.5, eps=0.1), reference_clip,
                      optimizer="adam", lr=0.5, adam_eps=0.1, weight_decay=0.0,
                      clip_grad=megatron_clip)


@pytest.mark.parametrize("dp, distributed", [(1, False), (2, True)])
def test_clip_grads_type_check_clipped_step_equals_torch_clip_grad_norm(dp, distributed):
    # clip_grads_type_check: with clip_grad below the norm, Megatron scales every (sharded) grad
    # by clip_grad / (norm + 1e-6) like torch.nn.utils.clip_grad_norm_ in one process.
    for _, ok, diff, norms, type_after in run_ranks(_adam_clipped_steps, dp, distributed, 0.05, 0.05):
        assert ok and diff < 1e-6 and type_after == "torch.FloatTensor"
        assert all(norm > 0.05 for _, norm in norms)  # the clip really acted
    # The comparison can tell a clipped step from an unclipped one.
    (_, _, unclipped, _, _), = run_ranks(_adam_clipped_steps, 1, False, 0.0, 0.05)
    assert unclipped > 1e-3


def _gloo_refit_tp2_to_replicas():
    # refit_streams: GlooCopyService makes a CUDA "copy stream" in __init__ and waits on it in
    # run(); with the patch the real swap_model_weights(..., "gloo") runs on CPU ranks.
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding.refit import swap_model_weights
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    config = TransformerConfig(num_layers=1, hidden_size=6, num_attention_heads=1,
                               use_cpu_initialization=True)
    own, _ = dist.new_subgroups_by_enumeration([[0], [1]])  # TP=1: each rank its own group

    class Holder(torch.nn.Module):  # what swap_model_weights reads: .config and .pg_collection
        def __init__(self, tp_group, dp_group):
            super().__init__()
            self.config = config
            self.pg_collection = ProcessGroupCollection(tp=tp_group, dp=dp_group,
                                                        pp=own)
            self.linear = ColumnParallelLinear(6, 8, config=config, init_method=torch.nn.init.normal_,
                                               bias=False, gather_output=False, tp_group=tp_group)

    torch.manual_seed(0)
    src = Holder(ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group())  # [4, 6] each
    dst = Holder(own, dist.group.WORLD)                                               # [8, 6] each
    shards = [torch.empty(4, 6) for _ in range(2)]
    dist.all_gather(shards, src.linear.weight.detach())
    swap_model_weights(src, dst, "gloo")
    plan = dst._cached_reshard_plan
    return (tuple(dst.linear.weight.shape), torch.equal(dst.linear.weight, torch.cat(shards)),
            sorted(op.peer_rank for op in plan.recv_ops))


def test_refit_streams_gloo_swap_model_weights_regathers_a_tp_shard():
    for rank, (shape, equal, peers) in enumerate(run_ranks(_gloo_refit_tp2_to_replicas, 2)):
        assert shape == (8, 6) and equal
        assert peers == [0, 1]  # half from itself (a local copy), half from the other rank


def _moe_router_gemm():
    # moe_te_general_gemm: without TE the router's gating GEMM must take its torch.mm branch.
    from megatron.core.transformer.moe import moe_utils

    torch.manual_seed(0)
    inp = torch.randn(3, 2, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    logits = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    upstream = torch.randn_like(logits)
    (logits * upstream).sum().backward()
    dense_inp, dense_weight = inp.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ((dense_inp @ dense_weight.T) * upstream).sum().backward()
    return (moe_utils.HAVE_TE, moe_utils.te_general_gemm, torch.allclose(logits, dense_inp @ dense_weight.T),
            torch.allclose(inp.grad, dense_inp.grad), torch.allclose(weight.grad, dense_weight.grad))


def test_moe_te_general_gemm_router_gating_equals_matmul():
    assert run_ranks(_moe_router_gemm, 1) == [(False, None, True, True, True)]


def _dense_moe(x, router_weight, fc1, fc2, topk):
    """Reference MoE by hand: top-k of the router logits, softmax over those k, weighted sum of
    each chosen expert's MLP (fc1 → gelu → fc2)."""
    tokens = x.reshape(-1, x.shape[-1])
    top_logits, top_experts = (tokens @ router_weight.T).topk(topk, dim=-1)
    weights = torch.softmax(top_logits, dim=-1)
    out = torch.zeros_like(tokens)
    for slot in range(topk):
        for e in range(fc1.shape[0]):
            chosen = top_experts[:, slot] == e
            hidden = torch.nn.functional.gelu(tokens[chosen] @ fc1[e].T) @ fc2[e].T
            out[chosen] += weights[chosen, slot, None] * hidden
    return out.view_as(x)


def _moe_layer_against_dense(ep):
    import torch.distributed as dist
    import warnings

    warnings.filterwarnings("ignore", message="Apex is not installed|full scope is deprecated")
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from snippets.record import recorder

    ps.initialize_model_parallel(expert_model_parallel_size=ep)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, add_bias_linear=False,
                               num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16,
                               moe_aux_loss_coeff=0.0, expert_model_parallel_size=ep,
                               moe_token_dispatcher_type="alltoall", use_cpu_initialization=True)
    torch.manual_seed(0)
    layer = MoELayer(config, get_gpt_layer_local_spec(num_experts=4).submodules.mlp.submodules)
    torch.manual_seed(10 + dist.get_rank())
    x = torch.randn(6, 1, 8, requires_grad=True)
    with recorder.record() as calls:
        y, _ = layer(x)
        y.sum().backward()
    # every rank needs all experts for the dense reference: gather them across the EP group
    local = [torch.stack([getattr(e, name).weight.detach() for e in layer.experts.local_experts])
             for name in ("linear_fc1", "linear_fc2")]
    fc1, fc2 = [], []
    for stacked, out in zip(local, (fc1, fc2)):
        parts = [torch.empty_like(stacked) for _ in range(ep)]
        dist.all_gather(parts, stacked, group=ps.get_expert_model_parallel_group())
        out.append(torch.cat(parts))
    dense_x = x.detach().clone().requires_grad_()
    dense = _dense_moe(dense_x, layer.router.weight.detach(), fc1[0], fc2[0], topk=2)
    dense.sum().backward()
    splits = type(layer.token_dispatcher.input_splits).__name__
    a2a = [(c.before, c.after, c.extra) for c in calls if c.api == "all_to_all_single"]
    return torch.allclose(y, dense, atol=1e-6), torch.allclose(x.grad, dense_x.grad, atol=1e-6), splits, a2a


def test_moe_dispatcher_streams_ep1_alltoall_layer_equals_dense_experts():
    # moe_dispatcher_streams: MoEAlltoAllTokenDispatcher builds its device-to-host stream in
    # __init__ and switches to it on every dispatch; with EP=1 no collective is involved.
    (out_equal, grad_equal, splits, a2a), = run_ranks(_moe_layer_against_dense, 1, 1)
    assert (out_equal, grad_equal, splits, a2a) == (True, True, "NoneType", [])


def test_moe_host_split_sizes_ep2_alltoall_layer_equals_dense_experts():
    # moe_host_split_sizes: at EP=2 the split sizes reach all_to_all_single as host numpy arrays,
    # and each recorded all-to-all moves exactly the rows its split sizes say.
    for out_equal, grad_equal, splits, a2a in run_ranks(_moe_layer_against_dense, 2, 2):
        assert (out_equal, grad_equal, splits) == (True, True, "ndarray")
        assert len(a2a) == 6  # forward: tokens, probs, combine; backward: their three inverses
        for before, after, extra in a2a:
            assert int(before.strip("[]").split(",")[0]) == sum(extra["input_split_sizes"])
            assert int(after.strip("[]").split(",")[0]) == sum(extra["output_split_sizes"])


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
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1,
                               bf16=precision == "bf16", fp16=precision == "fp16")
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), module)
    opt = get_megatron_optimizer(OptimizerConfig(
        lr=0.05, clip_grad=0.0, bf16=precision == "bf16", fp16=precision == "fp16",
        initial_loss_scale=64.0, hysteresis=1), [ddp])
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
        log=log, type=type(opt.chained_optimizers[0]).__name__,
        main_diff=max((a - b).abs().max().item() for a, b in zip(mains, master)),
        cast_back=all(torch.equal(m.to(dtype), p) for m, p in zip(mains, module.parameters())),
        main_dtypes={str(m.dtype) for m in mains}, type_after=torch.zeros(1).type())


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
        config, DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True), module)
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.1, bf16=True, use_distributed_optimizer=True), [ddp])
    inner = opt.chained_optimizers[0]
    owned = {id(p) for group in inner.model_float16_groups for p in group}
    return [(id(p) in owned, getattr(p, "main_param_sharded", "missing"),
             "missing" if not hasattr(p, "main_param") else
             None if p.main_param is None else p.main_param.numel()) for p in module.parameters()]


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


def _tied_embeddings_pp2():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, forward_step, microbatches, tiny_config

    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(dist.get_rank())  # different draws: equal weights must come from the all-reduce
    config = tiny_config(num_layers=2, pipeline_model_parallel_size=2)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=True)
    weight = model.shared_embedding_or_output_weight()
    start = weight.detach().clone()
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(microbatches(2)),
                                model=[ddp], num_microbatches=2, seq_length=SEQ, micro_batch_size=MBS)
    own_grad = weight.main_grad.clone()
    finalize_model_grads([ddp])
    return start, own_grad, weight.main_grad.clone(), bool(getattr(weight, "shared", False)), \
        "cuda" not in torch.Tensor.__dict__


def test_shared_embedding_cuda_pp2_tied_weights_start_and_stay_equal():
    # shared_embedding_cuda: the last stage's output weight starts as the first stage's word
    # embedding (its own draw is zeroed, then all-reduced), and finalize_model_grads sums the
    # two stages' gradients into both copies.
    (w0, g0, s0, shared0, cuda0), (w1, g1, s1, shared1, cuda1) = run_ranks(_tied_embeddings_pp2, 2)
    assert torch.equal(w0, w1)
    assert not torch.allclose(g0, g1, atol=1e-6)
    assert torch.allclose(s0, g0 + g1, atol=1e-6) and torch.equal(s0, s1)
    assert (shared0, shared1) == (False, True)  # only the last stage's copy is excluded from norms
    assert cuda0 and cuda1  # Tensor.cuda is torch's own again


def _dp_zero_gather():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)  # the same weights on both DP ranks, as after Megatron's broadcast
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), module)
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=True), [ddp])
    inner = opt.chained_optimizers[0]
    inner._init_optimizer_states_with_dummy_values()  # Adam state exists; a zero-grad step, no decay
    world = inner.get_parameter_state_dp_zero(use_gloo_comm=False, return_on_all_ranks=True)
    (buffer,) = ddp.buffers
    (param_world,) = world[0].values()
    placed = {name: param_world["param"][buffer.param_index_map[p][0]:buffer.param_index_map[p][1]]
              for name, p in module.named_parameters()}
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
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), module)
    inner = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, clip_grad=0.0, use_distributed_optimizer=True), [ddp]).chained_optimizers[0]
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


def test_every_patch_has_its_own_test_and_says_what_it_proves():
    tests = {name for name in globals() if name.startswith("test_")}
    for patch in cpu_compat.PATCHES:
        assert patch.proof, patch.name
        assert any(t.startswith(f"test_{patch.name}_") for t in tests), \
            f"no test_{patch.name}_... in tests/ranks/test_cpu_compat.py"


def _megatron_modules_imported_in_functions(module) -> set[str]:
    """The Megatron modules a snippets module imports inside its functions: ``from X import y``
    (``X.y`` when that is a module), ``import X``, and the names given to ``_scope_torch``."""
    import ast
    import importlib
    import importlib.util
    import inspect

    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("megatron"):
                package = hasattr(importlib.import_module(inner.module), "__path__")
                for alias in inner.names:
                    sub = f"{inner.module}.{alias.name}"
                    found.add(sub if package and importlib.util.find_spec(sub) else inner.module)
            elif isinstance(inner, ast.Import):
                found |= {a.name for a in inner.names if a.name.startswith("megatron")}
            elif (isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "_scope_torch"
                  and isinstance(inner.args[0], ast.Constant)):
                found.add(inner.args[0].value)
    return found


def test_ranks_find_what_their_setup_imports_already_loaded():
    """``rank_env.init_rank`` applies the patches and sets the writer queue in every rank; the
    modules that needs are imported once by the process that forks the ranks (``launch._PRELOAD``)
    instead of once per rank. A patch that starts importing another module must add it there."""
    from snippets.ranks import launch, rank_env

    needed = (_megatron_modules_imported_in_functions(cpu_compat)
              | _megatron_modules_imported_in_functions(rank_env))
    assert "megatron.core.tensor_parallel.random" in needed  # the walk sees the patches' imports
    assert "megatron.core.dist_checkpointing.strategies.filesystem_async" in needed  # and rank_env's
    assert needed - set(launch._PRELOAD) == set()
