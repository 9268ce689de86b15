"""Note 12's claims about vocab parallelism, against the real Megatron functions: the embedding and
the cross entropy equal their dense versions at TP=2 and 4, and snippets.tp.vocab_parallel's two
label-smoothing formulas are exactly what Megatron computes at TP=1 and on each rank at TP>1."""

import pytest
import torch
import torch.nn.functional as F

from snippets.ranks.launch import run_ranks, warm_up
from snippets.tp.vocab_parallel import smoothed_loss, smoothed_loss_on_rank

V, S, B = 16, 4, 2


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _logits_and_target():
    logits = torch.randn(S, B, V, generator=torch.Generator().manual_seed(3)) * 2
    target = torch.randint(0, V, (S, B), generator=torch.Generator().manual_seed(4))
    return logits, target


def _cross_entropy(tp, alpha):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    logits, target = _logits_and_target()
    local = logits.chunk(tp, -1)[ps.get_tensor_model_parallel_rank()].clone().requires_grad_()
    weight = torch.rand(S, B, generator=torch.Generator().manual_seed(5))
    loss = vocab_parallel_cross_entropy(local, target, label_smoothing=alpha)
    (loss * weight).sum().backward()
    return loss.detach(), local.grad


def _grad(fn, logits):
    x = logits.clone().requires_grad_()
    weight = torch.rand(S, B, generator=torch.Generator().manual_seed(5))
    (fn(x) * weight).sum().backward()
    return x.grad


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_cross_entropy_without_smoothing_equals_torch(tp):
    logits, target = _logits_and_target()
    ref = lambda x: F.cross_entropy(x.reshape(-1, V), target.reshape(-1), reduction="none").view(S, B)
    results = run_ranks(_cross_entropy, tp, tp, 0.0)
    grad = torch.cat([g for _, g in results], dim=-1)
    assert all(torch.allclose(loss, ref(logits), atol=1e-5) for loss, _ in results)
    assert torch.allclose(grad, _grad(ref, logits), atol=1e-6)


def test_smoothing_at_tp1_is_the_stated_target_and_torch_with_a_rescaled_alpha():
    logits, target = _logits_and_target()
    ((loss, grad),) = run_ranks(_cross_entropy, 1, 1, 0.1)
    assert torch.allclose(loss, smoothed_loss(logits, target, 0.1), atol=1e-5)
    assert torch.allclose(grad, _grad(lambda x: smoothed_loss(x, target, 0.1), logits), atol=1e-6)
    torch_loss = F.cross_entropy(
        logits.reshape(-1, V), target.reshape(-1), reduction="none", label_smoothing=0.1 * V / (V - 1)
    ).view(S, B)
    assert torch.allclose(loss, torch_loss, atol=1e-5)
    assert not torch.allclose(
        loss,
        F.cross_entropy(
            logits.reshape(-1, V), target.reshape(-1), reduction="none", label_smoothing=0.1
        ).view(S, B),
        atol=1e-3,
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_smoothing_at_tp_above_1_is_a_per_shard_loss(tp):
    logits, target = _logits_and_target()
    results = run_ranks(_cross_entropy, tp, tp, 0.1)
    for rank, (loss, grad) in enumerate(results):
        mine = lambda x: smoothed_loss_on_rank(x, target, 0.1, tp, rank)
        assert torch.allclose(loss, mine(logits), atol=1e-5)
        # the gradient each rank keeps is that of its own per-shard loss, on its own shard
        assert torch.allclose(grad, _grad(mine, logits).chunk(tp, -1)[rank], atol=1e-6)
        assert not torch.allclose(loss, smoothed_loss(logits, target, 0.1), atol=1e-3)
    assert not torch.allclose(results[0][0], results[1][0], atol=1e-3)


def _embedding(tp, sequence_parallel):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import VocabParallelEmbedding

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = ModelParallelConfig(
        tensor_model_parallel_size=tp, use_cpu_initialization=True, sequence_parallel=sequence_parallel
    )
    torch.manual_seed(0)
    emb = VocabParallelEmbedding(
        V, 6, init_method=torch.nn.init.normal_, config=config, reduce_scatter_embeddings=sequence_parallel
    )
    tokens = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    out = emb(tokens)
    out.pow(2).sum().backward()
    shards = [torch.empty_like(emb.weight) for _ in range(tp)]
    dist.all_gather(shards, emb.weight.detach())
    return tokens, torch.cat(shards), out.detach(), emb.weight.grad


@pytest.mark.parametrize("tp, sp", [(2, False), (4, False), (2, True)])
def test_vocab_parallel_embedding_equals_dense(tp, sp):
    results = run_ranks(_embedding, tp, tp, sp)
    tokens, full = results[0][0], results[0][1].clone().requires_grad_()
    dense = F.embedding(tokens, full)
    dense = dense.transpose(0, 1) if sp else dense  # SP: [s, b, h], split along s
    dense.pow(2).sum().backward()
    out = torch.cat([r[2] for r in results]) if sp else results[0][2]
    assert torch.allclose(out, dense.detach(), atol=1e-6)
    assert torch.allclose(torch.cat([r[3] for r in results]), full.grad, atol=1e-5)
