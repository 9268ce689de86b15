"""Note 22's experiment: one RL round with a real refit (``swap_model_weights``), at any size.

Every rank builds two real ``GPTModel``s (local spec, RoPE): the *policy* in the training layout
(TP x PP from ``parallel_state``) and the *rollout* model in the inference layout (TP = every rank,
PP = 1, its own groups from a ``HyperCommGrid``). :func:`one_rl_round` then

1. refits rollout from policy (``swap_model_weights``) and checks both give the same logits;
2. trains the policy one step (Megatron's pipeline schedule + SGD) -- the rollout is now stale;
3. refits again and checks rollout equals the new policy,

recording every collective of both refits and keeping the resharding plan
(:func:`snippets.rl.refit_cost.plan_ops`). ``tables`` prints note 22's checks, where each tensor
lives in both layouts, the bytes each rank sends to each rank, and the refits' communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from snippets.record.recorder import communication_table
from snippets.record.tables import Table
from snippets.rl import refit_cost


def gpt_config(dims, tp: int, pp: int, device: str = "cpu"):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_cpu_initialization=device == "cpu",
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def gpt(dims, config, pg_collection, first: bool = True, last: bool = True):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=dims.qk_norm, normalization=config.normalization)
    return GPTModel(
        config,
        spec,
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
        pre_process=first,
        post_process=last,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope" if dims.rope else "learned_absolute",
        pg_collection=pg_collection,
    )


def rollout_groups(tp: int):
    """The inference layout's own groups: TP=tp, PP=1, the rest data parallel."""
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron.core.process_groups_config import ProcessGroupCollection

    grid = HyperCommGrid([tp, 1, 1, 1, dist.get_world_size() // tp], ["tp", "cp", "ep", "pp", "dp"])
    return ProcessGroupCollection(
        tp=grid.create_pg("tp"),
        cp=grid.create_pg("cp"),
        pp=grid.create_pg("pp"),
        ep=grid.create_pg("ep"),
        dp=grid.create_pg("dp"),
        embd=None,
        pos_embd=None,
    )  # PP=1: no stage shares the embedding


class Inputs:
    """Positions and the causal mask for ``[batch, seq]`` tokens, on ``device``."""

    def __init__(self, dims, device: str = "cpu"):
        s, b = dims.seq, dims.micro_batch_size
        self.seq, self.batch, self.vocab = s, b, dims.vocab
        self.pos = torch.arange(s, device=device).expand(b, s)
        self.mask = torch.ones(s, s, dtype=torch.bool, device=device).triu(1).view(1, 1, s, s)


def forward_backward(model, batches, inputs: Inputs) -> list[float]:
    """The real pipeline schedule over ``batches`` (next-token loss): gradients accumulated in
    ``model``; each micro-batch's loss, rounded (on the last stage; empty elsewhere)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data, model):
        tokens = next(data)
        loss = model(tokens, inputs.pos, inputs.mask, labels=tokens.roll(-1, dims=1))  # [b, s]
        return loss, lambda per_token: (per_token.mean(), {"loss": per_token.mean().detach().clone()})

    out = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter(batches),
        model=[model],
        num_microbatches=len(batches),
        seq_length=inputs.seq,
        micro_batch_size=inputs.batch,
    )
    return [round(float(o["loss"]), 4) for o in out]


def train_one_step(model, batches, inputs: Inputs, lr: float = 0.5):
    losses = forward_backward(model, batches, inputs)
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return losses


def pipeline_logits(model, tokens, inputs: Inputs):
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data, model):
        out = model(next(data), inputs.pos, inputs.mask, runtime_gather_output=True)
        return out, lambda o: (o.sum() * 0, {"logits": o.detach().clone()})

    out = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter([tokens]),
        model=[model],
        num_microbatches=1,
        seq_length=inputs.seq,
        micro_batch_size=inputs.batch,
        forward_only=True,
    )
    last = parallel_state.is_pipeline_last_stage()
    logits = (
        out[0]["logits"]
        if last
        else torch.empty(inputs.batch, inputs.seq, inputs.vocab, device=tokens.device)
    )
    dist.broadcast(
        logits,
        src=parallel_state.get_pipeline_model_parallel_last_rank(),
        group=parallel_state.get_pipeline_model_parallel_group(),
    )
    return logits


def rollout_logits(model, tokens, inputs: Inputs):
    with torch.no_grad():
        return model(tokens, inputs.pos, inputs.mask, runtime_gather_output=True)


def one_rl_round(
    dims, tp: int = 2, pp: int = 2, rollout_tp: int | None = None, device: str = "cpu", refit=None
) -> dict:
    """On every rank: refit, train one step, see the stale rollout, refit again (note 22).

    ``refit(policy, rollout, backend)`` is the sync step; by default Megatron's
    ``swap_model_weights`` (what note 22 runs)."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding.refit import clear_plan_cache, swap_model_weights
    from megatron.core.resharding.utils import (
        _build_layer_module_prefix_map,
        _resolve_global_layer_number_in_name,
    )
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.record import recorder

    rollout_tp = rollout_tp or dist.get_world_size()
    # refit.py caches reshard plans by the layouts' sizes (not by model): the first sync below
    # builds its plan, whatever ran in this process before
    clear_plan_cache()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(123)
    torch.manual_seed(100 * parallel_state.get_pipeline_model_parallel_rank())  # each stage its own layers
    with torch.device(device):
        policy = gpt(
            dims,
            gpt_config(dims, tp, pp, device),
            ProcessGroupCollection.use_mpu_process_groups(),
            parallel_state.is_pipeline_first_stage(),
            parallel_state.is_pipeline_last_stage(),
        )
        rollout = gpt(dims, gpt_config(dims, rollout_tp, 1, device), rollout_groups(rollout_tp))
    backend = "nccl" if device == "cuda" else "gloo"
    refit = refit or swap_model_weights
    inputs = Inputs(dims, device)

    data = torch.randint(
        0,
        dims.vocab,
        (dims.microbatches + 1, dims.micro_batch_size, dims.seq),
        generator=torch.Generator().manual_seed(7),
    ).to(device)
    prompts, batches = data[0], list(data[1:])

    with recorder.record() as first_sync:
        refit(policy, rollout, backend)  # round 0: from the current policy
    before = pipeline_logits(policy, prompts, inputs)
    synced = torch.allclose(rollout_logits(rollout, prompts, inputs), before, atol=1e-5)

    losses = train_one_step(policy, batches, inputs)  # the policy moved
    after = pipeline_logits(policy, prompts, inputs)
    stale = rollout_logits(rollout, prompts, inputs)  # rollout still has the old weights

    with recorder.record() as second_sync:
        refit(policy, rollout, backend)  # round 1: sync again
    fresh = rollout_logits(rollout, prompts, inputs)

    def shapes(model):
        prefix = _build_layer_module_prefix_map(model)
        return {
            _resolve_global_layer_number_in_name(n, prefix): tuple(p.shape)
            for n, p in model.named_parameters()
        }

    tp_sharded = [getattr(p, "tensor_model_parallel", False) for p in rollout.parameters()]
    return dict(
        losses=losses,
        synced=synced,
        policy_changed=not torch.allclose(after, before, atol=1e-5),
        max_change=round(float((after - before).abs().max()), 4),
        stale_is_old=torch.allclose(stale, before, atol=1e-5),
        stale_is_new=torch.allclose(stale, after, atol=1e-5),
        fresh_is_new=torch.allclose(fresh, after, atol=1e-5),
        fresh_diff=float((fresh - after).abs().max()),
        policy_shapes=shapes(policy),
        rollout_shapes=shapes(rollout),
        sharded_params=sum(p.numel() for p, s in zip(rollout.parameters(), tp_sharded) if s),
        replicated_params=sum(p.numel() for p, s in zip(rollout.parameters(), tp_sharded) if not s),
        plan=refit_cost.plan_ops(refit_cost.cached_plan(policy, rollout), policy, rollout),
        roster=planner_roster(policy, rollout),
        first_sync=first_sync,
        second_sync=second_sync,
        groups={
            "训练 tp": dist.get_process_group_ranks(policy.pg_collection.tp),
            "训练 pp": dist.get_process_group_ranks(policy.pg_collection.pp),
            "rollout tp": dist.get_process_group_ranks(rollout.pg_collection.tp),
            "rollout dp": dist.get_process_group_ranks(rollout.pg_collection.dp),
        },
    )


def planner_roster(policy, rollout) -> tuple:
    """What this rank hands to the planner's one ``all_gather_object``: its (source, target)
    parameter metadata, built as ``build_local_reshard_plan`` builds it (one rank-list cache for
    both; a dense model, so no expert count)."""
    from megatron.core.resharding.planner import _extract_module_metadata

    cache: dict = {}
    rank = dist.get_rank()
    return (
        _extract_module_metadata(policy, rank, None, 0, cache),
        _extract_module_metadata(rollout, rank, None, 0, cache),
    )


def run(dims, par) -> dict:
    return one_rl_round(dims, par.tp, par.pp, par.world, par.device)


# ----------------------------------------------------------------------------- note 22's tables

MEANINGS = {
    # by the function that issued it first, then by the API
    "resharding/planner.py::build_local_reshard_plan": "all_gather_object：每个 rank 交出自己（源、目标）"
    "两端的参数元数据，先交换长度再交换 pickle 后的内容；各 rank 据此只算自己的 plan",
    "resharding/refit.py::_harmonize_buffer_dtypes": "all_gather_object：交换源模型 persistent buffer 的"
    " dtype（先长度后内容），目标端按它对齐；plan 里缓存，只在第一次同步",
    "batch_isend_irecv": "按 plan 逐片收发 weight（本地片直接 copy_，不在其中）",
    "barrier": "所有 rank 的收发都完成；之后才把不连续切片的暂存缓冲写回参数（连续切片已直接收进参数）",
}


def check_table(ranks: list, microbatches: int) -> Table:
    return Table(
        ["检查", f"rank {'、'.join(str(r) for r in range(len(ranks)))} 的结果"],
        [
            [
                f"训练一步的 loss（最后一个 stage 才有，{microbatches} 个 microbatch）",
                [r["losses"] for r in ranks],
            ],
            ["第一次同步后：rollout logits == policy logits", [r["synced"] for r in ranks]],
            [
                "训练一步后：policy 的 logits 变了（最大变化）",
                [(r["policy_changed"], r["max_change"]) for r in ranks],
            ],
            ["不同步：rollout == 旧 policy", [r["stale_is_old"] for r in ranks]],
            ["不同步：rollout == 新 policy", [r["stale_is_new"] for r in ranks]],
            ["第二次同步后：rollout == 新 policy", [r["fresh_is_new"] for r in ranks]],
            ["第二次同步后：最大差 < 1e-6", [r["fresh_diff"] < 1e-6 for r in ranks]],
        ],
    )


def where(shapes_by_rank: list, name: str) -> str:
    held = {r: s[name] for r, s in enumerate(shapes_by_rank) if name in s}
    return ", ".join(f"r{r} {list(shape)}" for r, shape in held.items())


def param_bytes(shapes: dict) -> int:
    return sum(4 * torch.Size(s).numel() for s in shapes.values())


def rank_row(rank: int, ops: list, rollout_shapes: dict) -> list:
    recv = [o for o in ops if o["kind"] == "recv"]
    send = [o for o in ops if o["kind"] == "send"]
    local = sum(o["bytes"] for o in recv if o["peer"] == rank)
    remote = sum(o["bytes"] for o in recv) - local
    return [
        rank,
        len(recv),
        sorted({o["peer"] for o in recv}),
        remote,
        local,
        len(send),
        sorted({o["peer"] for o in send}),
        param_bytes(rollout_shapes),
    ]


def compact(calls):
    """batch_isend_irecv carries one op per piece: show how many, not every shape."""
    for c in calls:
        if c.api == "batch_isend_irecv":
            sends = sum(op == "isend" for op, _ in c.extra["ops"])
            c.before = c.after = f"{sends} × isend, {len(c.extra['ops']) - sends} × irecv"
    return calls


def tables(ranks: list, dims, par) -> list:
    world, last = len(ranks), dims.layers - 1
    names = [
        "embedding.word_embeddings.weight",
        "decoder.layers.0.self_attention.linear_qkv.weight",
        f"decoder.layers.{last}.self_attention.linear_qkv.weight",
        f"decoder.layers.{last}.self_attention.linear_proj.weight",
        f"decoder.layers.{last}.mlp.linear_fc1.weight",
        f"decoder.layers.{last}.input_layernorm.weight",
        "output_layer.weight",
    ]
    policy_shapes = [r["policy_shapes"] for r in ranks]
    rollout_shapes = [r["rollout_shapes"] for r in ranks]
    plans = [r["plan"] for r in ranks]
    matrix = refit_cost.plan_traffic(plans)
    model_params = world * ranks[0]["sharded_params"] + ranks[0]["replicated_params"]
    return [
        check_table(ranks, dims.microbatches),
        Table(
            [
                "参数（全局名）",
                f"训练 TP{par.tp}·PP{par.pp}：rank 与本地 shape",
                f"rollout TP{world}：rank 与本地 shape",
            ],
            [[n, where(policy_shapes, n), where(rollout_shapes, n)] for n in names],
        ),
        Table(
            ["rank", "训练：参数个数", "训练：字节", "rollout：参数个数", "rollout：字节"],
            [
                [r, len(p), param_bytes(p), len(q), param_bytes(q)]
                for r, (p, q) in enumerate(zip(policy_shapes, rollout_shapes))
            ],
        ),
        Table(
            ["发送 ＼ 接收", *[f"r{d}" for d in range(world)], "发出合计"],
            [[f"r{s}", *matrix[s], sum(matrix[s])] for s in range(world)],
        ),
        Table(
            [
                "rank",
                "recv 片数",
                "来自",
                "远端收到（字节）",
                "本地拷贝（字节）",
                "send 片数",
                "发往",
                "rollout 参数字节",
            ],
            [rank_row(r, ops, rollout_shapes[r]) for r, ops in enumerate(plans)],
        ),
        f"整个模型参数: {model_params}  fp32 字节: {refit_cost.model_bytes(model_params, 'fp32')}  "
        f"每个 rank 实收: {[sum(matrix[s][d] for s in range(world)) for d in range(world)]}",
        Table(["rank", *ranks[0]["groups"]], [[r, *x["groups"].values()] for r, x in enumerate(ranks)]),
        "第一次同步（rank 0 录到的）:",
        communication_table(compact(ranks[0]["first_sync"]), MEANINGS, ranks=False),
        "第二次同步（rank 0 录到的）:",
        communication_table(compact(ranks[0]["second_sync"]), MEANINGS, ranks=False),
        f"seed 000 的算法（snippets.rl.refit_cost）：这个模型 {model_params} 个参数按 bf16、"
        f"每轮切给 {world} 张卡时每张卡收多少、线上至少多久:",
        Table(refit_cost.REFIT_HEADERS, refit_cost.refit_rows(model_params, gpus=world)),
    ]
