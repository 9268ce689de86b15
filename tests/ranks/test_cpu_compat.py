"""CPU patches for devices, schedules, checkpoints, models and MoE: the patched path runs
on CPU ranks and computes the right numbers (the optimizer's are in test_cpu_optimizer.py)."""

import pytest
import torch

from snippets import cpu
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_apply_is_idempotent_and_names_every_patch():
    first = cpu.apply()
    proxy = __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch
    assert cpu.apply() == first == sorted(p.name for p in cpu.PATCHES)
    assert __import__("megatron.core.tensor_parallel.random", fromlist=["x"]).torch is proxy
    assert torch.cuda.current_device() == "cpu"


def test_scoped_patches_leave_torch_alone():
    cpu.apply()
    assert not isinstance(torch, cpu.ModuleProxy)
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
    layer = ColumnParallelLinear(
        6, 8, config=config, init_method=torch.nn.init.normal_, bias=False, gather_output=True
    )
    x = torch.randn(3, 2, 6)
    y, _ = layer(x)
    shards = [torch.empty_like(layer.weight) for _ in range(2)]
    dist.all_gather(shards, layer.weight.detach())
    dense = x @ torch.cat(shards, dim=0).T
    return tuple(layer.weight.shape), tuple(y.shape), torch.allclose(y, dense, atol=1e-6)


def test_current_device_column_parallel_linear_equals_dense():
    for weight, out, equal in run_ranks(_column_parallel_equals_dense, 2):
        assert (weight, out, equal) == ((4, 6), (3, 2, 8), True)


def _no_pipelining_loss():

    from megatron.core import parallel_state as ps
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model.config = TransformerConfig(
        num_layers=1, hidden_size=4, num_attention_heads=1, pipeline_dtype=torch.float32
    )
    model.model_type = ModelType.encoder_or_decoder
    model.set_input_tensor = lambda tensor: None  # only pipeline stages > 0 receive one
    batches = [torch.randn(3, 4) for _ in range(2)]

    def loss_func(output):
        loss = output.pow(2).mean()
        # clone: the schedule divides `loss` in place by num_microbatches (schedules.py:341),
        # and a bare detach() shares its storage, so the logged value would change with it.
        return loss, {"loss": loss.detach().clone()}

    def forward_step(data_iterator, model):
        return model(next(data_iterator)), loss_func

    out = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=[model],
        num_microbatches=2,
        seq_length=3,
        micro_batch_size=1,
        forward_only=False,
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
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing import ShardedTensor

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    local = torch.arange(6.0).view(2, 3) + 10 * rank
    sharded = {"w": ShardedTensor.from_rank_offsets("w", local, (0, rank, 2), replica_id=0)}
    dist_checkpointing.save(sharded, tmp)
    target = {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(2, 3), (0, rank, 2), replica_id=0)}
    loaded = dist_checkpointing.load(target, tmp)
    return torch.equal(loaded["w"], local)


def test_synchronize_checkpoint_save_and_load(tmp_path):
    # The torch_dist writer calls torch.cuda.synchronize() while staging tensors.
    assert run_ranks(_checkpoint_round_trip, 2, str(tmp_path)) == [True, True]


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
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=4,
        ffn_hidden_size=24,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        use_cpu_initialization=True,
    )
    torch.manual_seed(0)
    layer = build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=config, layer_number=1)
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
    return dict(
        y=y.detach(),
        dx=x.grad,
        grads=grads,
        partial=partial,
        marked=[n for n, p in layer.named_parameters() if getattr(p, "sequence_parallel", 0)],
        params={n: p for n, p in layer.named_parameters()},
    )


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


def _moe_router_gemm():
    # Without TE the router's gating GEMM takes its torch.mm branch; at 0.19.0 moe_utils sets
    # te_general_gemm = None itself (moe_utils.py:41-53), so no CPU patch is involved any more.
    from megatron.core.transformer.moe import moe_utils

    torch.manual_seed(0)
    inp = torch.randn(3, 2, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    logits = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    upstream = torch.randn_like(logits)
    (logits * upstream).sum().backward()
    dense_inp, dense_weight = inp.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ((dense_inp @ dense_weight.T) * upstream).sum().backward()
    return (
        moe_utils.HAVE_TE,
        moe_utils.te_general_gemm,
        torch.allclose(logits, dense_inp @ dense_weight.T),
        torch.allclose(inp.grad, dense_inp.grad),
        torch.allclose(weight.grad, dense_weight.grad),
    )


def test_router_gating_without_te_equals_matmul_with_no_patch():
    from snippets import cpu

    assert "moe_te_general_gemm" not in {p.name for p in cpu.PATCHES}
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
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from snippets.record import recorder

    ps.initialize_model_parallel(expert_model_parallel_size=ep)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        add_bias_linear=False,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=16,
        moe_aux_loss_coeff=0.0,
        expert_model_parallel_size=ep,
        moe_token_dispatcher_type="alltoall",
        use_cpu_initialization=True,
    )
    torch.manual_seed(0)
    layer = get_gpt_layer_local_spec(num_experts=4).submodules.mlp(config=config)  # partial(MoELayer, ...)
    torch.manual_seed(10 + dist.get_rank())
    x = torch.randn(6, 1, 8, requires_grad=True)
    with recorder.record() as calls:
        y, _ = layer(x)
        y.sum().backward()
    # every rank needs all experts for the dense reference: gather them across the EP group
    local = [
        torch.stack([getattr(e, name).weight.detach() for e in layer.experts.local_experts])
        for name in ("linear_fc1", "linear_fc2")
    ]
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
    ((out_equal, grad_equal, splits, a2a),) = run_ranks(_moe_layer_against_dense, 1, 1)
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


def _tied_embeddings_pp2():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import MBS, SEQ, VOCAB, forward_step, microbatches, tiny_config

    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(dist.get_rank())  # different draws: equal weights must come from the all-reduce
    config = tiny_config(num_layers=2, pipeline_model_parallel_size=2)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=True,
    )
    weight = model.shared_embedding_or_output_weight()
    start = weight.detach().clone()
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(microbatches(2)),
        model=[ddp],
        num_microbatches=2,
        seq_length=SEQ,
        micro_batch_size=MBS,
    )
    own_grad = weight.main_grad.clone()
    finalize_model_grads([ddp])
    return (
        start,
        own_grad,
        weight.main_grad.clone(),
        bool(getattr(weight, "shared", False)),
        "cuda" not in torch.Tensor.__dict__,
    )


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


def _broadcast_batch():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import broadcast_data

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    sent = {"tokens": torch.arange(12).view(3, 4), "labels": torch.arange(12).view(3, 4) + 100}
    mine = sent if dist.get_rank() == 0 else {}
    got = broadcast_data(["tokens", "labels"], mine, torch.int64)
    return {k: (v.dtype, torch.equal(v, sent[k])) for k, v in got.items()}, "cuda" not in vars(torch.Tensor)


def test_broadcast_data_cuda_tp2_rank1_receives_rank0_batch():
    # broadcast_data_cuda: TP rank 0 packs the batch (sizes on 'cuda', values .cuda()) and
    # broadcasts it over the TP group; rank 1 passes no data and gets the same tensors.
    for got, restored in run_ranks(_broadcast_batch, 2):
        assert got == {"tokens": (torch.int64, True), "labels": (torch.int64, True)} and restored


def _gather_split_1d():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_split_1d_tensor, split_tensor_into_1d_equal_chunks

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    piece = torch.arange(8.0).view(2, 4) + 10 * rank  # not flat: the shape Megatron's own test passes
    gathered = gather_split_1d_tensor(piece)
    full = torch.arange(16.0).view(4, 4)
    round_trip = gather_split_1d_tensor(split_tensor_into_1d_equal_chunks(full))
    return gathered.tolist(), torch.equal(round_trip, full.view(-1))


def test_gather_split_1d_all_gather_counts_elements_as_nccl():
    # gather_split_1d_all_gather: a (2, 4) piece per TP rank lands flat, in TP-rank order (gloo
    # alone refuses the shapes); a flat split and gather is the identity.
    expected = [float(v) for v in range(8)] + [float(v) + 10 for v in range(8)]
    assert run_ranks(_gather_split_1d, 2) == [(expected, True)] * 2
