"""snippets.moe.tables: the EP=1 state cut for one EP rank gives an EP=2 layer exactly the EP=1
layer's outputs; the hooks see what the router and dispatcher really did (checked against a hand
computation); the aux loss read back from Megatron's tracker is Switch Transformer's formula."""

import pytest
import torch

from snippets.moe.tables import dispatch_table, local_expert_state
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_local_expert_state_keeps_the_router_and_renames_this_ranks_experts():
    full = {"router.weight": "R"}
    for e in range(4):
        full[f"experts.local_experts.{e}.linear_fc1.weight"] = f"fc1-{e}"
        full[f"experts.local_experts.{e}.linear_fc2._extra_state"] = None
    local = local_expert_state(full, [2, 3])
    assert local == {
        "router.weight": "R",
        "experts.local_experts.0.linear_fc1.weight": "fc1-2",
        "experts.local_experts.0.linear_fc2._extra_state": None,
        "experts.local_experts.1.linear_fc1.weight": "fc1-3",
        "experts.local_experts.1.linear_fc2._extra_state": None,
    }


def _moe(ep, state):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from snippets.experiments import EXPERIMENTS
    from snippets.experiments.n17_moe import build_moe_layer
    from snippets.moe.tables import local_expert_state, pop_aux_loss, watch
    from snippets.record import recorder

    ps.initialize_model_parallel(expert_model_parallel_size=ep)
    torch.manual_seed(0)  # hidden 8, 4 experts of FFN 16, top-2, all-to-all, aux loss 0.01
    layer = build_moe_layer(EXPERIMENTS["moe"].tiny, ep)
    if state is not None:
        layer.load_state_dict(local_expert_state(state, layer.local_expert_indices))
    seen = watch(layer)
    inputs = range(2) if ep == 1 else [dist.get_rank()]
    outputs, aux, xs = [], [], []
    with recorder.record() as calls:
        for i in inputs:
            x = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(i))
            outputs.append(layer(x)[0].detach())
            aux.append(pop_aux_loss())
            xs.append(x)
    return dict(state=layer.state_dict(), outputs=outputs, aux=aux, seen=seen, xs=xs, calls=calls)


def test_ep2_with_the_reference_experts_equals_ep1_and_hooks_see_the_routing():
    ref = run_ranks(_moe, 1, 1, None)[0]
    router_weight = ref["state"]["router.weight"]
    for i, (x, seen, aux) in enumerate(zip(ref["xs"], ref["seen"], ref["aux"])):
        logits = x.view(-1, 8) @ router_weight.T
        top_logits, top = logits.topk(2, dim=-1)
        probs = torch.zeros_like(logits).scatter(1, top, torch.softmax(top_logits, dim=-1))
        assert torch.allclose(seen["probs"], probs, atol=1e-6)
        assert torch.equal(seen["routing_map"], probs > 0)
        counts = seen["routing_map"].sum(0)
        switch = 4 / (2 * 5 * 5) * (torch.softmax(logits, -1).sum(0) * counts).sum()
        assert abs(aux - switch.item()) < 1e-5  # the logged aux loss, divided by its coeff
        assert seen["tokens_per_expert"] == counts.tolist() and seen["expert_rows"] == 10

    ep = run_ranks(_moe, 2, 2, ref["state"])
    for rank, r in enumerate(ep):
        assert torch.allclose(r["outputs"][0], ref["outputs"][rank], atol=1e-6)
        assert abs(r["aux"][0] - ref["aux"][rank]) < 1e-6
        s = r["seen"][0]
        assert sum(s["input_splits"]) == 10 and sum(s["output_splits"]) == s["expert_rows"]
        assert sum(s["tokens_per_expert"]) == s["expert_rows"]
        table = dispatch_table(r["calls"], lambda i, c: c.api).markdown()
        assert f"| {s['input_splits']} → {s['output_splits']} | all_to_all_single |" in table
