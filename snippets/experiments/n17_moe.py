"""Note 17's experiment: a real ``MoELayer`` under expert parallelism, at any hidden / expert FFN /
token count, number of experts and top-k.

``build_moe_layer`` builds Megatron's ``MoELayer`` from the local spec (``TopKRouter`` and a
``SequentialMLP`` of plain ``MLP`` experts); ``reference`` runs one process holding every expert
over all data-parallel ranks' micro-batches (EP=1); ``expert_parallel_step`` builds the layer on
every rank of an ``expert_model_parallel_size`` grid, loads *its* experts from the reference's
``state_dict`` (:func:`snippets.moe.tables.local_expert_state`) and runs one forward + backward
with the ``alltoall`` and then the ``allgather`` dispatcher, recording every collective and what
the router chose and the dispatcher moved (:func:`snippets.moe.tables.watch`). Note 17 runs 4
experts, top-2, hidden 8, expert FFN 16, 6 tokens on 4 ranks with EP=2; ``python -m snippets.run
moe --dims qwen3-8b --ep 8`` (hidden 4096, expert FFN = the preset's ``ffn``, 2 experts per EP
rank) shows the same dispatch at a real width.
"""

from __future__ import annotations

import torch

from snippets.record.tables import Table

EXPERTS_PER_EP_RANK = 2
TOPK = 2
"""Note 17's 4 experts on EP=2 and top-2; the runner keeps 2 experts per EP rank."""


def build_moe_layer(dims, ep, dispatcher="alltoall", tell_router=True, experts=4, topk=TOPK):
    """The real ``MoELayer`` on this rank: ``experts`` experts of FFN ``dims.ffn``, top-``topk``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=dims.hidden,
        num_attention_heads=dims.heads,
        add_bias_linear=False,
        num_moe_experts=experts,
        moe_router_topk=topk,
        moe_ffn_hidden_size=dims.ffn,
        moe_aux_loss_coeff=0.01,
        expert_model_parallel_size=ep,
        moe_token_dispatcher_type=dispatcher,
        use_cpu_initialization=True,
    )
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    # Since core 0.19 the spec's mlp is a builder, partial(MoELayer, submodules=MoESubmodules(...))
    # (moe_module_specs.py:87); TransformerLayer calls it with the config (transformer_layer.py:431).
    layer = spec.submodules.mlp(config=config, layer_number=1)
    if tell_router:  # the constructor keeps layer_number to itself (note 17, 遗留问题 3)
        layer.set_layer_number(1)
    return layer


def micro_batch(dims, i):
    """Data-parallel rank ``i``'s activation entering the MoE layer, ``[s, b, h]``, and the gradient
    that comes back to it."""
    g = torch.Generator().manual_seed(100 + i)
    shape = (dims.seq, dims.micro_batch_size, dims.hidden)
    x = torch.randn(*shape, generator=g).requires_grad_()
    return x, torch.randn(*shape, generator=g)


def reference(dims, experts=4, topk=TOPK):
    """EP=1: one process with every expert takes the ``dims.microbatches`` data-parallel ranks'
    micro-batches one after the other, accumulating gradients."""
    from megatron.core import parallel_state

    from snippets.moe.tables import pop_aux_loss, watch

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    layer = build_moe_layer(dims, ep=1, experts=experts, topk=topk)
    seen = watch(layer)
    outputs, aux = [], []
    for i in range(dims.microbatches):
        x, upstream = micro_batch(dims, i)
        y, _ = layer(x)
        (y * upstream).sum().backward()
        outputs.append(y.detach())
        aux.append(pop_aux_loss())
    return dict(
        state=layer.state_dict(),
        outputs=outputs,
        aux=aux,
        seen=seen,
        grads={name: p.grad.clone() for name, p in layer.named_parameters()},
        modules=[(name, type(m).__name__) for name, m in layer.named_children()],
        params=[(name, list(p.shape)) for name, p in layer.named_parameters()],
    )


def expert_parallel_step(dims, state, ep=2, experts=4, topk=TOPK):
    """On every rank: the layer with this EP rank's experts from ``state``, one recorded forward +
    backward per dispatcher on this data-parallel rank's micro-batch."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from snippets.moe.tables import local_expert_state, pop_aux_loss, watch
    from snippets.ranks.groups import describe_rank
    from snippets.record.recorder import record

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(expert_model_parallel_size=ep)
    result = {"rank": describe_rank()}
    for dispatcher in ("alltoall", "allgather"):
        layer = build_moe_layer(dims, ep, dispatcher, experts=experts, topk=topk)
        layer.load_state_dict(local_expert_state(state, layer.local_expert_indices))
        seen = watch(layer)
        x, upstream = micro_batch(dims, dist.get_rank())
        with record() as calls:
            y, _ = layer(x)
            (y * upstream).sum().backward()
        result[dispatcher] = dict(
            output=y.detach(),
            aux=pop_aux_loss(),
            seen=seen[0],
            calls=calls,
            local_experts=layer.local_expert_indices,
            dispatcher=type(layer.token_dispatcher).__name__,
            grads={name: p.grad.clone() for name, p in layer.named_parameters()},
            allreduce={name: getattr(p, "allreduce", True) for name, p in layer.named_parameters()},
        )
    return result


def run(dims, par) -> dict:
    """On every rank (the runner): the EP=1 layer first (every rank builds the same one from seed 0
    and runs its own micro-batch: the reference), then the EP run loading its experts.

    Model parallel state is set up twice in one process: without EP for the reference, then --
    after ``destroy_model_parallel`` -- with ``expert_model_parallel_size=par.ep``.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    from snippets.moe.tables import pop_aux_loss

    experts = EXPERTS_PER_EP_RANK * par.ep
    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    layer = build_moe_layer(dims, ep=1, experts=experts)
    state = layer.state_dict()
    y, _ = layer(micro_batch(dims, dist.get_rank())[0])
    mine = dict(output=y.detach(), aux=pop_aux_loss())
    parallel_state.destroy_model_parallel()
    result = expert_parallel_step(dims, state, par.ep, experts=experts)
    for dispatcher in ("alltoall", "allgather"):
        r = result[dispatcher]
        r["same_output"] = torch.allclose(r["output"], mine["output"], atol=1e-6)
        r["reference_aux"] = mine["aux"]
        del r["output"], r["grads"]
        r["seen"] = {k: v for k, v in r["seen"].items() if k not in ("probs",)}
    return result


# ----------------------------------------------------------------------------- note 17's tables


def flow_row(rank, r):
    s = r["alltoall"]["seen"]
    return [
        rank,
        r["alltoall"]["local_experts"],
        s["routing_map"].sum(dim=0).tolist(),
        s["input_splits"],
        s["output_splits"],
        s["tokens_per_expert"],
        s["expert_rows"],
    ]


def alltoall_meaning(i, c):
    if c.api == "all_gather_into_tensor":
        return "交换每个 expert 的 token 计数，算 output_splits"
    if c.phase == "forward":
        return {
            2: "dispatch：token 送到 expert 所在 rank",
            3: "dispatch：probs 跟着 token 走",
            4: "combine：expert 输出送回来源 rank",
        }[i]
    return {
        5: "combine 的反向：输出梯度送到 expert",
        6: "probs 的梯度送回来源 rank（router 的梯度）",
        7: "token 的梯度送回来源 rank",
    }[i]


def allgather_meaning(i, c):
    return {
        1: "all-gather routing_map",
        2: "all-gather probs",
        3: "all-gather 全部 token",
        4: "reduce-scatter：各 rank 的 expert 输出相加、切回来源 rank",
        5: "reduce-scatter 的反向：输出梯度 all-gather 到每个 rank",
        6: "token 梯度 reduce-scatter 回来源 rank",
        7: "probs 梯度 reduce-scatter 回来源 rank",
    }[i]


def flow_table(ep_run):
    return Table(
        [
            "rank",
            "本地 expert",
            f"选中 expert 0–{len(ep_run[0]['alltoall']['seen']['routing_map'][0]) - 1} 的次数",
            "input_splits",
            "output_splits",
            "本地 expert 各收到",
            "expert 输入行数",
        ],
        [flow_row(i, r) for i, r in enumerate(ep_run)],
    )


def tokens_table(ep_run):
    return Table(
        ["rank", "本地 expert", "alltoall：各收到", "allgather：各收到"],
        [
            [
                i,
                r["alltoall"]["local_experts"],
                r["alltoall"]["seen"]["tokens_per_expert"],
                r["allgather"]["seen"]["tokens_per_expert"],
            ]
            for i, r in enumerate(ep_run)
        ],
    )


def tables(results: list, dims, par) -> list:
    from snippets.moe.tables import dispatch_table
    from snippets.ranks.groups import rank_table

    return [
        rank_table([r["rank"] for r in results], kinds=("dp", "ep", "edp", "etp-ep")),
        flow_table(results),
        "alltoall dispatcher 的全部通信（rank 0）:",
        dispatch_table(results[0]["alltoall"]["calls"], alltoall_meaning),
        Table(
            ["dispatcher", "rank", "输出 = EP=1", "aux / coeff", "EP=1 的"],
            [
                [d, i, r[d]["same_output"], round(r[d]["aux"], 4), round(r[d]["reference_aux"], 4)]
                for d in ("alltoall", "allgather")
                for i, r in enumerate(results)
            ],
            title=" / ".join(results[0][d]["dispatcher"] for d in ("alltoall", "allgather")),
        ),
        "allgather dispatcher 的全部通信（rank 0）:",
        dispatch_table(results[0]["allgather"]["calls"], allgather_meaning),
        tokens_table(results),
    ]
