"""snippets.data.batch_flow restates pretrain_gpt.get_batch and get_batch_on_this_tp_rank, which the pip
package does not ship. These tests hold it to Megatron's own functions:

* with a checkout of the tag (``--megatron-src`` or ``MEGATRON_SRC``), the real functions are taken
  from it and run beside ours -- in one process through ``PairedBroadcast`` for every pipeline
  position and kind of data (same broadcasts, same batches, same failure), and on 4 real gloo
  ranks (TP=2, CP=2) for ``get_batch`` end to end;
* without a checkout, ours is checked against what a broadcast must achieve: every TP rank ends
  with exactly the fields its stage needs, equal to what TP rank 0 read.
"""

from __future__ import annotations

import ast
import os
import types
from pathlib import Path

import pytest
import torch

from snippets.cpu import ModuleProxy
from snippets.data import batch_flow
from snippets.data.batch_flow import (
    BatchArgs,
    BroadcastMismatch,
    PairedBroadcast,
    TPView,
    get_batch_on_this_tp_rank,
    paired_views,
)
from snippets.ranks.launch import run_ranks, warm_up

MBS, SEQ = 1, 8


def _src(request):
    value = request.config.getoption("megatron_src", default=None) or os.environ.get("MEGATRON_SRC")
    if not value:
        pytest.skip("pass --megatron-src PATH (a checkout of core_v0.16.1) to compare with Megatron")
    return Path(value)


def load_function(src: Path, path: str, name: str, namespace: dict):
    """Megatron's own top-level function ``name`` from ``src/path``, executed in ``namespace``."""
    text = (src / path).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(namespace)
    exec(compile(ast.get_source_segment(text, node), f"{path}::{name}", "exec"), scope)
    return scope[name]


class _OnHost:
    """A data-loader tensor as Megatron receives it: ``.cuda()`` hands it over (we stay on CPU)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def cuda(self, non_blocking=False):
        return self.tensor


def sample(packed: bool = False, with_mask: bool = True, with_max_seqlen: bool = True) -> dict:
    gen = torch.Generator().manual_seed(0)
    data = dict(
        tokens=torch.randint(0, 30, (MBS, SEQ), generator=gen),
        labels=torch.randint(0, 30, (MBS, SEQ), generator=gen),
        loss_mask=torch.ones(MBS, SEQ),
        position_ids=torch.arange(SEQ).repeat(MBS, 1),
    )
    if with_mask:
        data["attention_mask"] = torch.ones(MBS, 1, SEQ, SEQ).tril() < 0.5
    if packed:
        data["cu_seqlens"] = torch.tensor([[0, 3, SEQ]], dtype=torch.int32)
        if with_max_seqlen:
            data["max_seqlen"] = torch.tensor([5], dtype=torch.int32)
    return data


def _megatron_args(args: BatchArgs):
    return types.SimpleNamespace(**vars(args), hybrid_context_parallel=False, sft=False)


def real_tp_function(src: Path, args: BatchArgs, view: TPView):
    """Megatron's get_batch_on_this_tp_rank, seeing ``view`` as parallel_state and broadcast."""
    mpu = types.SimpleNamespace(
        get_tensor_model_parallel_rank=lambda: view.tp_rank,
        get_tensor_model_parallel_src_rank=lambda: view.src_rank,
        get_tensor_model_parallel_group=lambda: view.group,
        is_pipeline_first_stage=lambda *a, **k: view.is_first_stage,
        is_pipeline_last_stage=lambda *a, **k: view.is_last_stage,
    )
    fake_torch = ModuleProxy(
        torch,
        distributed=ModuleProxy(torch.distributed, broadcast=view.broadcast),
        cuda=ModuleProxy(torch.cuda, current_device=lambda: "cpu"),
    )
    return load_function(
        src,
        "megatron/training/utils.py",
        "get_batch_on_this_tp_rank",
        dict(torch=fake_torch, mpu=mpu, get_args=lambda: _megatron_args(args)),
    )


def _exchange(run_sender, run_receiver, paired: PairedBroadcast):
    """Sender then receiver through ``paired``; the outcome a TP group of two would have."""
    sent = run_sender()
    try:
        received = run_receiver()
        paired.finish()
    except BroadcastMismatch as err:
        return sent, [tuple(t.shape) for t in paired.sent], f"mismatch: {err}"
    return sent, [tuple(t.shape) for t in paired.sent], received


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


STAGES = [("all", 1), ("first", 2), ("last", 2)]
DATA = {
    "plain": dict(),
    "no mask": dict(with_mask=False),
    "packed, no max_seqlen": dict(packed=True, with_max_seqlen=False),
    "packed + max_seqlen": dict(packed=True),
}


@pytest.mark.parametrize("stage, pp", STAGES)
@pytest.mark.parametrize("kind", DATA)
def test_same_broadcasts_and_batches_as_megatron(stage, pp, kind, request):
    src = _src(request)
    data = sample(**DATA[kind])
    args = BatchArgs(MBS, SEQ, pp, create_attention_mask_in_dataloader="attention_mask" in data)

    outcomes = []
    for impl in ("megatron", "ours"):
        sender, receiver, paired = paired_views(stage)
        if impl == "megatron":
            send = lambda: real_tp_function(src, args, sender)(  # noqa: E731
                iter([{k: _OnHost(v) for k, v in data.items()}])
            )
            recv = lambda: real_tp_function(src, args, receiver)(None)  # noqa: E731
        else:
            send = lambda: get_batch_on_this_tp_rank(iter([data]), args, view=sender)  # noqa: E731
            recv = lambda: get_batch_on_this_tp_rank(None, args, view=receiver)  # noqa: E731
        outcomes.append(_exchange(send, recv, paired))

    (real_sent, real_shapes, real_recv), (our_sent, our_shapes, our_recv) = outcomes
    assert our_shapes == real_shapes, "different broadcast sequence"
    assert real_sent.keys() == our_sent.keys()
    assert all(_same(real_sent[k], our_sent[k]) for k in real_sent)
    if isinstance(real_recv, str):
        # same failure, at the same broadcast
        assert isinstance(our_recv, str) and our_recv.split(":")[1] == real_recv.split(":")[1]
    else:
        assert real_recv.keys() == our_recv.keys()
        assert all(_same(real_recv[k], our_recv[k]) for k in real_recv), kind


@pytest.mark.parametrize("stage, pp", STAGES)
def test_receivers_end_with_what_rank_0_read(stage, pp):
    data = sample()
    args = BatchArgs(MBS, SEQ, pp)
    sender, receiver, paired = paired_views(stage)
    log = []
    get_batch_on_this_tp_rank(iter([data]), args, view=sender, log=log)
    got = get_batch_on_this_tp_rank(None, args, view=receiver)
    paired.finish()
    needed = batch_flow.STAGE_FIELDS[stage]
    for name in batch_flow.FIELDS:
        if name in needed:
            assert torch.equal(got[name], data[name]), name
        else:
            assert got[name] is None, name
    assert [f for f, _, _ in log][: len(needed)] == list(needed)
    assert got["cu_seqlens"] is None and got["max_seqlen"] is None


def test_packed_max_seqlen_desynchronises_the_receiver():
    data = sample(packed=True)
    args = BatchArgs(MBS, SEQ, 1)
    sender, receiver, paired = paired_views("all")
    get_batch_on_this_tp_rank(iter([data]), args, view=sender)
    with pytest.raises(BroadcastMismatch, match="receive #8"):
        get_batch_on_this_tp_rank(None, args, view=receiver)


# ---------------------------------------------------------------- get_batch on real ranks


def _both_get_batches(src_path):
    from megatron.core import parallel_state as mpu
    from megatron.core import utils as core_utils

    from snippets.data.batch_flow import BatchArgs, get_batch

    mpu.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=2)
    args = BatchArgs(MBS, SEQ, 1)
    tp0 = mpu.get_tensor_model_parallel_rank() == 0
    data = sample()
    ours = get_batch(iter([data]) if tp0 else None, args)

    real_args = _megatron_args(args)
    view = TPView.from_parallel_state()
    tp_fn = real_tp_function(Path(src_path), args, view)
    real_get_batch = load_function(
        Path(src_path),
        "pretrain_gpt.py",
        "get_batch",
        dict(
            get_args=lambda: real_args,
            core_transformer_config_from_args=lambda a: None,
            is_first_or_last_pipeline_stage=lambda vp: True,
            mtp_on_this_rank=lambda *a, **k: False,
            get_batch_on_this_tp_rank=tp_fn,
            get_batch_on_this_cp_rank=core_utils.get_batch_on_this_cp_rank,
            get_thd_batch_on_this_cp_rank=core_utils.get_thd_batch_on_this_cp_rank,
            get_batch_on_this_hybrid_cp_rank=core_utils.get_batch_on_this_hybrid_cp_rank,
        ),
    )
    real = real_get_batch(iter([{k: _OnHost(v) for k, v in data.items()}]) if tp0 else None)
    return ours, real


def test_get_batch_equals_megatrons_on_tp2_cp2(request):
    src = _src(request)
    warm_up()
    for rank, (ours, real) in enumerate(run_ranks(_both_get_batches, 4, str(src), grid=dict(tp=2, cp=2))):
        assert len(ours) == len(real) == 6
        assert all(_same(a, b) for a, b in zip(ours, real)), rank
        assert ours[0].shape == (MBS, SEQ // 2)  # CP=2 keeps half the sequence
