"""Each CPU patch: the Megatron line it is for is really there, and the patched path runs and
computes the right numbers on CPU ranks."""

import pytest
import torch

from snippets import cpu_compat
from snippets.launch import run_ranks, warm_up
from snippets.sources import file_lines


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

    page = (Path(__file__).resolve().parents[1] / "docs" / "cpu.md").read_text()
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
    from snippets.layer_walk import tp_shard

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


def _adam_two_steps(use_distributed_optimizer, clip_grad=0.0):
    # DP ranks each see half of a fixed batch; DDP averages their grads, so the optimizer must
    # reproduce torch's AdamW run in one process on the whole batch.
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer),
        module)
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, clip_grad=clip_grad, use_distributed_optimizer=use_distributed_optimizer),
        [ddp])
    torch_adam = torch.optim.AdamW(reference.parameters(), lr=0.05, weight_decay=0.01)
    norms = []
    for step in range(2):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(x[rank * 8 // world:(rank + 1) * 8 // world]).pow(2).mean().backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt.step()
        torch_adam.zero_grad()
        reference(x).pow(2).mean().backward()
        expected_norm = torch.linalg.vector_norm(
            torch.cat([p.grad.flatten() for p in reference.parameters()])).item()
        if clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), clip_grad)
        torch_adam.step()
        norms.append((grad_norm, expected_norm))
    diff = max((a - b).abs().max().item() for a, b in zip(module.parameters(), reference.parameters()))
    inner = opt.chained_optimizers[0]
    return type(inner).__name__, ok, diff, norms, torch.zeros(1).type()


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
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3, bias=False))
    reference.load_state_dict(module.state_dict())
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer),
        module)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.5, adam_eps=0.1, weight_decay=0.0, clip_grad=megatron_clip,
                        use_distributed_optimizer=use_distributed_optimizer), [ddp])
    torch_adam = torch.optim.Adam(reference.parameters(), lr=0.5, eps=0.1)
    norms = []
    for step in range(2):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(x[rank * 8 // world:(rank + 1) * 8 // world]).pow(2).mean().backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt.step()
        torch_adam.zero_grad()
        reference(x).pow(2).mean().backward()
        norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(),
                                                    reference_clip or float("inf")).item())
        torch_adam.step()
    diff = max((a - b).abs().max().item() for a, b in zip(module.parameters(), reference.parameters()))
    return ok, diff, norms, torch.zeros(1).type()


@pytest.mark.parametrize("dp, distributed", [(1, False), (2, True)])
def test_clip_grads_type_check_clipped_step_equals_torch_clip_grad_norm(dp, distributed):
    # clip_grads_type_check: with clip_grad below the norm, Megatron scales every (sharded) grad
    # by clip_grad / (norm + 1e-6) like torch.nn.utils.clip_grad_norm_ in one process.
    for ok, diff, norms, type_after in run_ranks(_adam_clipped_steps, dp, distributed, 0.05, 0.05):
        assert ok and diff < 1e-6 and type_after == "torch.FloatTensor"
        assert all(norm > 0.05 for norm in norms)  # the clip really acted
    # The comparison can tell a clipped step from an unclipped one.
    (_, unclipped, _, _), = run_ranks(_adam_clipped_steps, 1, False, 0.0, 0.05)
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

    from snippets import recorder

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
