"""snippets.ckpt.optim_reshard: the distributed optimizer's state saved at one layout, loaded at another.

The reference is the saved state itself, gathered from every rank of the save run; it is checked in
turn against one process that ran the same step unsplit.
"""

import math
import tempfile

import pytest
import torch

from snippets.ckpt import optim_reshard as orr
from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def test_assemble_places_pieces_by_offset_and_flat_range_and_leaves_gaps_nan():
    full = torch.arange(24.0).reshape(2, 3, 4)  # (layer, rows, cols), rows split in TP-like halves
    pieces = []
    for layer in range(2):
        for half, rows in enumerate(((0, 2), (2, 3))):
            local = full[layer, rows[0] : rows[1]].reshape(-1)
            where = ((layer, layer + 1), rows, (0, 4))
            pieces.append(("exp_avg", "w", (2, 3, 4), where, 0, local.numel(), local))
    whole = orr.assemble([pieces[:2], pieces[2:]])["exp_avg"]["w"]
    assert torch.equal(whole, full)
    # a DP-like owner of only part of a flattened local weight: the rest stays NaN
    part = orr.assemble(
        [[("exp_avg", "w", (2, 3, 4), ((0, 1), (0, 3), (0, 4)), 5, 9, full[0].reshape(-1)[5:9])]]
    )["exp_avg"]["w"]
    assert torch.equal(part[0].reshape(-1)[5:9], full[0].reshape(-1)[5:9])
    assert int(torch.isnan(part).sum()) == 24 - 4


def test_compare_fails_on_a_changed_element_and_on_a_gap():
    a = {s: {"w": torch.ones(3)} for s in orr.STATES}
    assert all(orr.compare(a, {s: {"w": torch.ones(3)} for s in orr.STATES}).values())
    changed = {s: {"w": torch.tensor([1.0, 1.0, 1.0 + 1e-7])} for s in orr.STATES}
    gap = {s: {"w": torch.tensor([1.0, math.nan, 1.0])} for s in orr.STATES}
    assert not any(orr.compare(a, changed).values())
    assert not any(orr.compare(a, gap).values())


def test_error_line_reads_the_rank_error_inside_torch_dcp_wrapper():
    from torch.distributed.checkpoint.api import CheckpointException

    inner = ValueError("Global shape mismatch\nsecond line")
    assert (
        orr.error_line(CheckpointException("ranks", {0: (inner, None)}))
        == "ValueError: Global shape mismatch"
    )
    assert orr.error_line(AssertionError()) == "AssertionError:"


def _trained(tp):
    # The save run's body without saving: the unsplit reference when called on one rank.
    return orr.save_rank(tempfile.gettempdir(), tp, ())


def test_dp2_to_dp1_every_reshardable_type_restores_the_saved_state():
    types = ("dp_reshardable", "fully_reshardable", "fully_sharded_model_space")
    results = orr.reshard_optimizer_state(dict(dp=2), dict(dp=1), types)
    by_type = {r["sharding_type"]: r for r in results}
    for name in ("dp_reshardable", "fully_reshardable"):
        r = by_type[name]
        assert r["loaded"] and r["error"] is None, r
        assert all(r[s] for s in orr.STATES), r
        assert "barrier" in {c.api for c in r["save_calls"]}
    # Adam's step: fully_reshardable brings back the saved count; dp_reshardable leaves the loading
    # optimizer's own (1, from its dummy step) with torch's Adam -- Megatron at this tag, see note 21.
    assert by_type["fully_reshardable"]["adam_step"] == orr.SAVED_STEPS
    assert by_type["dp_reshardable"]["adam_step"] == 1

    # only fully_reshardable gathers the optimizer shards while saving
    def gathers(name):
        return any("get_parameter_state_dp_zero" in c.where for c in by_type[name]["save_calls"])

    assert gathers("fully_reshardable") and not gathers("dp_reshardable")
    bad = by_type["fully_sharded_model_space"]
    assert not bad["loaded"]
    assert bad["error"].startswith("CheckpointingException: ShardedTensor.flattened_range")
    assert orr.error_rows(results) == [["fully_sharded_model_space", bad["error"]]]
    assert orr.rows(results)[0][:4] == ["dp_reshardable", "TP=1·DP=2", "TP=1·DP=1", True]


def test_the_gathered_reference_is_the_unsplit_step():
    # The pieces the save run returns, put together, are the state one process gets from the
    # same step on the whole batch (DP averaging order aside): the reference is meaningful.
    split = orr.assemble([r["pieces"] for r in run_ranks(_trained, 2, 1)])
    (whole,) = run_ranks(_trained, 1, 1)
    whole = orr.assemble([whole["pieces"]])
    for state in orr.STATES:
        assert split[state].keys() == whole[state].keys()
        for key, tensor in split[state].items():
            assert not torch.isnan(tensor).any(), (state, key)
            assert torch.allclose(tensor, whole[state][key], rtol=1e-2, atol=1e-4), (state, key)
    # and Adam really moved: the saved moments are not the zeros a fresh optimizer holds
    assert all(t.abs().max() > 0 for t in split["exp_avg"].values())


def test_tp2_to_tp1_only_fully_reshardable_restores_the_state():
    results = orr.reshard_optimizer_state(dict(tp=2), dict(tp=1), orr.SHARDING_TYPES)
    by_type = {r["sharding_type"]: r for r in results}
    assert all(by_type["fully_reshardable"][s] for s in orr.STATES)
    assert by_type["fully_reshardable"]["adam_step"] == orr.SAVED_STEPS
    assert by_type["dp_reshardable"]["error"].startswith("CheckpointingException: Global shape mismatch")
    assert by_type["dp_zero_gather_scatter"]["error"].startswith(
        "AssertionError: Number of unpadded elements must be same"
    )
    assert [r["loaded"] for r in results] == [False, True, False, False]


def test_grids_are_checked_before_any_launch():
    with pytest.raises(ValueError, match="tp and dp only"):
        orr.reshard_optimizer_state(dict(tp=1, pp=2), dict(tp=1))
    with pytest.raises(ValueError, match="must divide"):
        orr.reshard_optimizer_state(dict(dp=3), dict(dp=1))
    assert orr.grid_name(dict(tp=2)) == "TP=2·DP=1"


def _fp32_dp_reshardable_load(ckpt_dir, no_grad):
    # Megatron at this tag: with fp32 params the distributed optimizer's main params are views of
    # the model params (requires_grad), and load_parameter_state_from_dp_reshardable copies into
    # them without torch.no_grad (the fully_reshardable loader has it).
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.utils import make_sharded_tensor_for_checkpoint

    ps.initialize_model_parallel()
    module = torch.nn.Linear(4, 3, bias=False)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), module
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(lr=0.05, clip_grad=0.0, use_distributed_optimizer=True), [ddp]
    )
    optimizer.chained_optimizers[0]._init_optimizer_states_with_dummy_values()
    model_sd = {"weight": make_sharded_tensor_for_checkpoint(module.weight, "weight")}
    metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
    orr.use_local_writer_queue()
    saved = {"optimizer": optimizer.sharded_state_dict(model_sd, metadata=metadata)}
    dist_checkpointing.save(saved, ckpt_dir)
    loaded = dist_checkpointing.load(
        {"optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=metadata)}, ckpt_dir
    )
    try:
        if no_grad:
            with torch.no_grad():
                optimizer.load_state_dict(loaded["optimizer"])
        else:
            optimizer.load_state_dict(loaded["optimizer"])
    except RuntimeError as exc:
        return orr.error_line(exc)
    return None


def test_fp32_dp_reshardable_load_needs_no_grad():
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        assert run_ranks(_fp32_dp_reshardable_load, 1, a, False)[0].startswith(
            "RuntimeError: a view of a leaf Variable that requires grad"
        )
        assert run_ranks(_fp32_dp_reshardable_load, 1, b, True)[0] is None
