"""snippets.rl.refit_cost: seed 000's refit figures from stated bandwidths, any model size, and the
traffic of a real Megatron reshard plan."""

import pytest

from snippets.ranks.launch import run_ranks, warm_up
from snippets.rl import refit_cost


def test_seed_000_figures():
    # 8B bf16 = 16 GB; 8 GPUs -> 2 GB each; NVLink ~4.4 ms; IB ~40 ms; 70B = 140 GB
    [row] = refit_cost.refit_rows(8e9)
    assert row == ["8B", "bf16", 16.0, 8, 2.0, 4.44, 40.0]
    assert refit_cost.model_bytes(70e9) / refit_cost.GB == 140.0
    [row70] = refit_cost.refit_rows(70e9)
    assert row70[2:] == [140.0, 8, 17.5, 38.89, 350.0]


def test_the_bandwidths_are_the_ones_the_seed_implies():
    per_gpu = 2e9
    assert refit_cost.LINKS["nvlink"].bytes_per_s == pytest.approx(per_gpu / 4.444e-3, rel=1e-3)
    assert refit_cost.LINKS["ib"].bytes_per_s == per_gpu / 40e-3
    assert refit_cost.LINKS["ib"].bytes_per_s * 8 == 400e9  # 400 Gb/s NDR


def test_strategies_per_gpu():
    total = refit_cost.model_bytes(8e9)
    assert refit_cost.bytes_per_gpu(8e9, "slice", gpus=8) == total / 8
    assert refit_cost.bytes_per_gpu(8e9, "gather", shards=8) == total * 7 / 8
    assert refit_cost.bytes_per_gpu(8e9, "gather", shards=1) == 0  # nothing to gather
    assert refit_cost.bytes_per_gpu(8e9, "broadcast") == total
    assert refit_cost.bytes_per_gpu(8e9, "slice", gpus=8, dtype="fp32") == 2 * total / 8
    with pytest.raises(ValueError, match="unknown strategy"):
        refit_cost.bytes_per_gpu(8e9, "teleport")


@pytest.mark.parametrize(
    "name,params",
    [
        ("Qwen/Qwen2.5-7B-Instruct", 7e9),
        ("meta-llama/Llama-3.1-70B", 70e9),
        ("~/models/deepseek-llm-7b-chat", 7e9),
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.5e9),
        ("/ckpt/Qwen2.5-1.5B-Instruct/", 1.5e9),
        ("Qwen/Qwen3-30B-A3B", 30e9),
        ("mistralai/Mixtral-8x7B-v0.1", None),
        ("gpt2", None),
        ("/ckpt/my-policy", None),
    ],
)
def test_params_from_name(name, params):
    assert refit_cost.params_from_name(name) == params


def _real_plan_tp2_to_tp1():
    # TP=2 ColumnParallelLinear -> a full copy on each rank: the real planner's transfers.
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding import build_local_reshard_plan
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    config = TransformerConfig(
        num_layers=1, hidden_size=6, num_attention_heads=1, use_cpu_initialization=True
    )
    own, _ = dist.new_subgroups_by_enumeration([[0], [1]])

    def holder(tp, dp):
        m = torch.nn.Module()
        m.pg_collection = ProcessGroupCollection(tp=tp, dp=dp, pp=own)
        m.linear = ColumnParallelLinear(
            6,
            8,
            config=config,
            init_method=torch.nn.init.normal_,
            bias=True,
            gather_output=False,
            tp_group=tp,
        )
        return m

    src = holder(ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group())
    dst = holder(own, dist.group.WORLD)
    plan = build_local_reshard_plan(src, dst)
    dst_bytes = sum(p.numel() * p.element_size() for p in dst.parameters())
    return refit_cost.plan_ops(plan, src, dst), dst_bytes


def test_plan_traffic_of_a_real_plan():
    warm_up()
    results = run_ranks(_real_plan_tp2_to_tp1, 2)
    ops = [r[0] for r in results]
    matrix = refit_cost.plan_traffic(ops)
    # each rank needs weight [8, 6] + bias [8] in fp32 = 224 bytes: half local, half remote
    assert matrix == [[112, 112], [112, 112]]
    for dst, (rank_ops, dst_bytes) in enumerate(results):
        assert sum(matrix[src][dst] for src in range(2)) == dst_bytes == 224
        recv = sorted((o["param"], o["peer"], o["slice"]) for o in rank_ops if o["kind"] == "recv")
        assert recv == [
            ("linear.bias", 0, "[0:4]"),
            ("linear.bias", 1, "[4:8]"),
            ("linear.weight", 0, "[0:4, :]"),
            ("linear.weight", 1, "[4:8, :]"),
        ]
        sends = [o for o in rank_ops if o["kind"] == "send"]
        assert sorted(o["peer"] for o in sends) == [0, 0, 1, 1]
        # every send is this rank's whole local shard (4 of the 8 rows), once to each rank
        assert sorted(o["slice"] for o in sends) == ["[0:4, :]", "[0:4, :]", "[0:4]", "[0:4]"]
