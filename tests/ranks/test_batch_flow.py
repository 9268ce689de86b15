"""snippets.data.batch_flow restates pretrain_gpt.get_batch and megatron.core.utils.get_batch_on_this_tp_rank.
These tests hold it to Megatron's own functions:

* the real ``get_batch_on_this_tp_rank`` (in the pip package since core 0.19) runs beside ours in one
  process through ``PairedBroadcast``, for every pipeline position and kind of data: same
  broadcasts, same batches, same failure;
* with a checkout of the tag (``--megatron-src`` or ``MEGATRON_SRC``), ``pretrain_gpt.get_batch`` is
  taken from it and run beside ours on 4 real gloo ranks (TP=2, CP=2);
* without the real functions, ours is checked against what a broadcast must achieve: every TP rank
  ends with exactly the fields its stage needs, equal to what TP rank 0 read.
"""

from __future__ import annotations

import ast
import inspect
import os
import types
from pathlib import Path

import pytest
import torch

from snippets.cpu import ModuleProxy
from snippets.data import batch_flow
from snippets.data.batch_flow import (
    BATCH_KEYS,
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
        pytest.skip("pass --megatron-src PATH (a checkout of core_v0.19.0) to compare with Megatron")
    return Path(value)


def load_function(src: Path, path: str, name: str, namespace: dict):
    """Megatron's own top-level function ``name`` from ``src/path``, executed in ``namespace``."""
    text = (src / path).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(namespace)
    exec(compile(ast.get_source_segment(text, node), f"{path}::{name}", "exec"), scope)
    return scope[name]


def load_constant(src: Path, path: str, name: str):
    text = (src / path).read_text()
    node = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
    )
    return ast.literal_eval(node.value)


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
        data["cu_seqlens_padded"] = torch.tensor([[0, 4, SEQ]], dtype=torch.int32)
        if with_max_seqlen:
            data["max_seqlen"] = torch.tensor([5], dtype=torch.int32)
    return data


def real_tp_function(view: TPView):
    """Megatron's get_batch_on_this_tp_rank (installed), broadcasting through ``view``."""
    from megatron.core import utils as core_utils

    fake_torch = ModuleProxy(
        torch,
        distributed=ModuleProxy(torch.distributed, broadcast=view.broadcast),
        cuda=ModuleProxy(torch.cuda, current_device=lambda: "cpu"),
    )
    source = inspect.getsource(core_utils.get_batch_on_this_tp_rank)
    scope = dict(vars(core_utils), torch=fake_torch)
    exec(compile(source, "megatron/core/utils.py::get_batch_on_this_tp_rank", "exec"), scope)
    return scope["get_batch_on_this_tp_rank"]


def run_real(args: BatchArgs, view: TPView, data: dict | None):
    """What ``pretrain_gpt.get_batch`` does around the real TP function (no MTP, no hybrid CP)."""
    batch = {}
    if view.tp_rank == 0:
        batch = dict(data)
        batch.update({key: batch.get(key) for key in BATCH_KEYS})
    return real_tp_function(view)(
        batch,
        broadcast_src_rank=view.src_rank,
        broadcast_group=view.group,
        has_cu_seqlens=args.has_cu_seqlens,
        is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        cp_size=args.context_parallel_size,
        tp_rank=view.tp_rank,
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        mtp_on_this_rank=False,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=view.is_first_stage,
        is_pipeline_last_stage=view.is_last_stage,
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
    if not torch.is_tensor(a):
        return a == b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


STAGES = [("all", 1), ("first", 2), ("last", 2), ("middle", 3)]
DATA = {
    "plain": (dict(), dict()),
    "no mask": (dict(with_mask=False), dict(create_attention_mask_in_dataloader=False)),
    "packed data, flags off": (dict(packed=True), dict()),
    "sft": (dict(packed=True), dict(sft=True)),
    "sft, CP=2": (dict(packed=True), dict(sft=True, context_parallel_size=2)),
    "inter-document masking, no max_seqlen": (
        dict(packed=True, with_max_seqlen=False),
        dict(dataloader_inter_document_masking=True),
    ),
    "sft, no data": (dict(), dict(sft=True)),
}


@pytest.mark.parametrize("stage, pp", STAGES)
@pytest.mark.parametrize("kind", DATA)
def test_same_broadcasts_and_batches_as_megatron(stage, pp, kind):
    data_kwargs, args_kwargs = DATA[kind]
    data = sample(**data_kwargs)
    args = BatchArgs(MBS, SEQ, pp, **args_kwargs)

    outcomes = []
    for impl in ("megatron", "ours"):
        sender, receiver, paired = paired_views(stage)
        if impl == "megatron":
            send = lambda: run_real(args, sender, data)  # noqa: E731
            recv = lambda: run_real(args, receiver, None)  # noqa: E731
        else:
            send = lambda: get_batch_on_this_tp_rank(iter([data]), args, view=sender)  # noqa: E731
            recv = lambda: get_batch_on_this_tp_rank(None, args, view=receiver)  # noqa: E731
        outcomes.append(_exchange(send, recv, paired))

    (real_sent, real_shapes, real_recv), (our_sent, our_shapes, our_recv) = outcomes
    assert our_shapes == real_shapes, "different broadcast sequence"
    assert real_sent.keys() == our_sent.keys()
    assert all(_same(real_sent[k], our_sent[k]) for k in real_sent), kind
    if isinstance(real_recv, str):
        # same failure, at the same broadcast
        assert isinstance(our_recv, str) and our_recv.split(":")[1] == real_recv.split(":")[1]
    else:
        assert not isinstance(our_recv, str), our_recv
        assert real_recv.keys() == our_recv.keys()
        for k in real_recv:  # a middle stage's unused receive buffers hold whatever memory had
            if stage == "middle" and not args.has_cu_seqlens and real_recv[k] is not None:
                assert real_recv[k].shape == our_recv[k].shape, k
            elif not (stage == "middle" and k == "attention_mask"):
                assert _same(real_recv[k], our_recv[k]), (kind, k)


@pytest.mark.parametrize("stage, pp", STAGES[:3])
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
    assert [f for f, _, _ in log] == list(needed)  # unpacked: nothing but the stage's fields
    assert got["cu_seqlens"] is None and got["max_seqlen"] is None


def test_packed_samples_reach_the_receiver_with_max_seqlen():
    # At core 0.16 a receiver had no max_seqlen buffer outside hybrid CP and fell out of step at the
    # 8th receive; at 0.19 the flags (--sft / --dataloader-inter-document-masking) decide for both.
    data = sample(packed=True)
    args = BatchArgs(MBS, SEQ, 1, sft=True)
    sender, receiver, paired = paired_views("all")
    log = []
    get_batch_on_this_tp_rank(iter([data]), args, view=sender, log=log)
    got = get_batch_on_this_tp_rank(None, args, view=receiver)
    paired.finish()
    assert [f for f, _, _ in log] == [
        "tokens",
        "labels",
        "loss_mask",
        "position_ids",
        "cu_seqlens (count)",
        "cu_seqlens",
        "max_seqlen",
        "attention_mask",
    ]
    for name in ("cu_seqlens", "max_seqlen", *batch_flow.FIELDS):
        assert torch.equal(got[name], data[name]), name
    assert got["cu_seqlens_padded"] is None  # sent only with CP > 1


# ---------------------------------------------------------------- get_batch on real ranks


class _OnHost:
    """A data-loader tensor as Megatron receives it: ``.cuda()`` hands it over (we stay on CPU)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def cuda(self, non_blocking=False):
        return self.tensor


def _both_get_batches(src_path):
    from megatron.core import parallel_state as mpu
    from megatron.core import utils as core_utils

    from snippets.data.batch_flow import BatchArgs, get_batch

    src = Path(src_path)
    mpu.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=2)
    args = BatchArgs(MBS, SEQ, 1, context_parallel_size=2)
    tp0 = mpu.get_tensor_model_parallel_rank() == 0
    data = sample()
    ours = get_batch(iter([data]) if tp0 else None, args)

    real_args = types.SimpleNamespace(**vars(args), hybrid_context_parallel=False)
    real_get_batch = load_function(
        src,
        "pretrain_gpt.py",
        "get_batch",
        dict(
            get_args=lambda: real_args,
            core_transformer_config_from_args=lambda a: types.SimpleNamespace(
                pipeline_model_parallel_layout=None, mtp_num_layers=None
            ),
            mtp_on_this_rank_func=lambda **k: False,
            is_first_or_last_pipeline_stage=lambda vp: True,
            mpu=mpu,
            BATCH_KEYS=load_constant(src, "pretrain_gpt.py", "BATCH_KEYS"),
            get_batch_on_this_tp_rank=core_utils.get_batch_on_this_tp_rank,
            flatten_batch_for_packed_sequences=core_utils.flatten_batch_for_packed_sequences,
            get_batch_on_this_cp_rank=core_utils.get_batch_on_this_cp_rank,
            get_context_parallel_group=mpu.get_context_parallel_group,
            get_hybrid_data_context_parallel_groups=None,
        ),
    )
    real = real_get_batch(iter([{k: _OnHost(v) for k, v in data.items()}]) if tp0 else None)
    return ours, real


def test_get_batch_equals_megatrons_on_tp2_cp2(request):
    src = _src(request)
    assert list(BATCH_KEYS) == load_constant(src, "pretrain_gpt.py", "BATCH_KEYS")
    warm_up()
    for rank, (ours, real) in enumerate(run_ranks(_both_get_batches, 4, str(src), grid=dict(tp=2, cp=2))):
        assert list(ours) == list(BATCH_KEYS) and len(real) == len(BATCH_KEYS)
        assert all(_same(ours[k], r) for k, r in zip(BATCH_KEYS, real)), rank
        assert ours["tokens"].shape == (MBS, SEQ // 2)  # CP=2 keeps half the sequence
