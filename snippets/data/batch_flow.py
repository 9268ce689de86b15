"""How one GPT micro-batch reaches every rank: ``get_batch`` and its TP broadcast (note 03).

``pretrain_gpt.py::get_batch`` and ``megatron/training/utils.py::get_batch_on_this_tp_rank`` live
only in the git tag, not in the pip package, so this module restates them readably with
Megatron's names (the non-hybrid path the GPT recipe takes):

* only TP rank 0 of a pipeline stage reads the data iterator; it broadcasts, in the TP group,
  the fields its stage needs; the other TP ranks allocate empty buffers from ``args`` (they never
  touch the dataset) and receive;
* the first stage needs the inputs, the last stage the targets, a single stage (PP=1) all five
  fields; a middle stage needs nothing and ``get_batch`` returns before any broadcast;
* ``cu_seqlens`` travels in two broadcasts (its length, then its values); at the tag this pair
  and ``max_seqlen`` are sent once more after the per-stage fields, for every stage.

The context-parallel split and the packed-sequence parameters are *not* restated: ``get_batch``
here calls the real ``get_batch_on_this_cp_rank`` / ``get_thd_batch_on_this_cp_rank`` from
``megatron.core.utils``.

``tests/ranks/test_batch_flow.py`` runs Megatron's own functions, taken from a checkout of the tag, and
these ones through :class:`PairedBroadcast` (a TP group of a sender and a receiver replayed in
one process) and checks that they issue the same broadcasts and end with the same batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

# The dataset builders log at INFO/WARNING (e.g. "Unable to save MockGPTDataset indexes because
# path_to_cache is None"); in a notebook that lands as stderr. They are expected here.
logging.getLogger("megatron.core.datasets").setLevel(logging.ERROR)

FIELDS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
"""The five fields every GPT micro-batch has, in the order ``get_batch`` returns them."""

STAGE_FIELDS = {
    "all": FIELDS,  # PP=1: embeds and computes the loss
    "first": ("tokens", "attention_mask", "position_ids"),  # embeds the tokens
    "last": ("labels", "loss_mask", "attention_mask"),  # computes the loss
    "middle": (),  # only sees hidden states
}
"""Which fields the TP source broadcasts, by pipeline position."""


@dataclass
class BatchArgs:
    """The fields of Megatron's ``args`` that ``get_batch`` reads (receivers size buffers by them)."""

    micro_batch_size: int
    seq_length: int
    pipeline_model_parallel_size: int = 1
    create_attention_mask_in_dataloader: bool = True


@dataclass
class TPView:
    """What ``get_batch_on_this_tp_rank`` asks ``parallel_state``, plus the broadcast it uses."""

    tp_rank: int
    src_rank: int  # global rank of TP rank 0 in this rank's TP group
    group: Any
    is_first_stage: bool
    is_last_stage: bool
    broadcast: Callable = None  # torch.distributed.broadcast's signature: (tensor, src, group=)

    @classmethod
    def from_parallel_state(cls) -> "TPView":
        from megatron.core import parallel_state as mpu

        return cls(
            mpu.get_tensor_model_parallel_rank(),
            mpu.get_tensor_model_parallel_src_rank(),
            mpu.get_tensor_model_parallel_group(),
            mpu.is_pipeline_first_stage(),
            mpu.is_pipeline_last_stage(),
            torch.distributed.broadcast,
        )


def stage_kind(args: BatchArgs, view: TPView, mtp_on_this_rank: bool = False) -> str:
    if args.pipeline_model_parallel_size == 1 or mtp_on_this_rank:
        return "all"
    if view.is_first_stage:
        return "first"
    return "last" if view.is_last_stage else "middle"


def empty_batch(args: BatchArgs) -> dict:
    """The buffers a receiving TP rank allocates: shapes from ``args`` alone."""
    shape = (args.micro_batch_size, args.seq_length)
    mask = None
    if args.create_attention_mask_in_dataloader:
        mask = torch.empty(args.micro_batch_size, 1, args.seq_length, args.seq_length, dtype=torch.bool)
    return dict(
        tokens=torch.empty(shape, dtype=torch.int64),
        labels=torch.empty(shape, dtype=torch.int64),
        loss_mask=torch.empty(shape, dtype=torch.float32),
        attention_mask=mask,
        position_ids=torch.empty(shape, dtype=torch.int64),
        # A receiver keeps no buffer for these outside hybrid CP, whatever the data holds.
        cu_seqlens=None,
        max_seqlen=None,
        local_cp_size=None,
    )


def get_batch_on_this_tp_rank(
    data_iterator,
    args: BatchArgs,
    mtp_on_this_rank: bool = False,
    view: TPView | None = None,
    log: list | None = None,
) -> dict:
    """TP rank 0 reads one micro-batch and broadcasts its stage's fields; the others receive.

    Returns the batch dict (the five fields plus ``cu_seqlens``, ``max_seqlen``,
    ``local_cp_size``); ``log``, if given, collects ``(field, shape, dtype)`` per broadcast.
    """
    view = view or TPView.from_parallel_state()
    is_source = view.tp_rank == 0
    stage = stage_kind(args, view, mtp_on_this_rank)
    if is_source:
        data = next(data_iterator)
        batch = {name: data.get(name) for name in (*FIELDS, "cu_seqlens", "max_seqlen", "local_cp_size")}
    else:
        batch = empty_batch(args)

    def send(name, tensor):
        if tensor is not None:  # None on both sides means "nothing to send" (e.g. no mask)
            if log is not None:
                log.append((name, tuple(tensor.shape), str(tensor.dtype).replace("torch.", "")))
            view.broadcast(tensor, view.src_rank, group=view.group)

    def send_cu_seqlens(cu_seqlens):
        # Receivers cannot size the buffer, so the length goes first (0 = "no packing").
        count = torch.tensor(0 if cu_seqlens is None else cu_seqlens.numel(), dtype=torch.int64)
        send("cu_seqlens (count)", count)
        n = int(count.item())
        if is_source:
            values = torch.empty(0, dtype=torch.int32) if cu_seqlens is None else cu_seqlens.contiguous()
        else:
            values = torch.empty((args.micro_batch_size, n) if n else (0,), dtype=torch.int32)
        send("cu_seqlens", values)
        return cu_seqlens if is_source else (values if n else None)

    for name in STAGE_FIELDS[stage]:
        send(name, batch[name])
    if stage in ("all", "first"):
        batch["cu_seqlens"] = send_cu_seqlens(batch["cu_seqlens"])
        send("max_seqlen", batch["max_seqlen"])
    if stage == "all":
        send("local_cp_size", batch["local_cp_size"])
    # At the tag the length/values pair and max_seqlen go out again after the per-stage fields,
    # on every stage (megatron/training/utils.py, after the if/elif on the pipeline stage).
    batch["cu_seqlens"] = send_cu_seqlens(batch["cu_seqlens"])
    send("max_seqlen", batch["max_seqlen"])

    if not is_source:  # a receiver drops what its stage does not need
        for name in FIELDS:
            if name not in STAGE_FIELDS[stage]:
                batch[name] = None
    return batch


def get_batch(data_iterator, args: BatchArgs, view: TPView | None = None, log: list | None = None):
    """``pretrain_gpt.get_batch`` (no MTP, no hybrid CP): TP broadcast, then the real CP split.

    Returns ``(tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params)``.
    """
    from megatron.core.utils import get_batch_on_this_cp_rank, get_thd_batch_on_this_cp_rank

    view = view or TPView.from_parallel_state()
    if not (view.is_first_stage or view.is_last_stage):
        return (None,) * 6  # a middle stage's input arrives from the previous stage
    batch = get_batch_on_this_tp_rank(data_iterator, args, view=view, log=log)
    cu_seqlens = batch.pop("cu_seqlens")
    cu_seqlens_padded = batch.pop("cu_seqlens_padded", None)
    max_seqlen = batch.pop("max_seqlen")
    local_cp_size = batch.pop("local_cp_size")
    if local_cp_size is not None:
        raise NotImplementedError("hybrid context parallel is not restated here")
    if cu_seqlens is None:  # [b, s] samples: cut the sequence into 2*CP chunks
        return (*get_batch_on_this_cp_rank(batch).values(), None)
    batch, packed_seq_params = get_thd_batch_on_this_cp_rank(batch, cu_seqlens, cu_seqlens_padded, max_seqlen)
    return (*batch.values(), packed_seq_params)


class BroadcastMismatch(RuntimeError):
    """The sender and a receiver did not issue the same sequence of broadcasts."""


class PairedBroadcast:
    """A TP group of two ranks replayed in one process, for checking broadcast protocols.

    Run the sender first with ``broadcast=paired.source`` (it records clones of what it sends),
    then the receiver with ``broadcast=paired.receiver``: each receive copies the next sent
    tensor into the receiver's buffer -- what a broadcast does -- and raises
    :class:`BroadcastMismatch` where a real run would hang or read garbage (different shape or
    dtype, or nothing left to receive). :meth:`finish` raises if the sender sent more.
    """

    def __init__(self):
        self.sent: list[torch.Tensor] = []
        self.received = 0

    def source(self, tensor, src=None, group=None, **_):
        self.sent.append(tensor.detach().clone())

    def receiver(self, tensor, src=None, group=None, **_):
        i = self.received
        self.received += 1
        if i >= len(self.sent):
            raise BroadcastMismatch(f"receive #{i + 1} has no matching send (sender sent {len(self.sent)})")
        sent = self.sent[i]
        if sent.shape != tensor.shape or sent.dtype != tensor.dtype:
            raise BroadcastMismatch(
                f"receive #{i + 1}: buffer {list(tensor.shape)} {tensor.dtype} "
                f"but the sender sent {list(sent.shape)} {sent.dtype}"
            )
        tensor.copy_(sent)

    def finish(self):
        if self.received != len(self.sent):
            raise BroadcastMismatch(
                f"the sender sent {len(self.sent)} tensors, the receiver took {self.received}"
            )


def paired_views(stage: str) -> tuple[TPView, TPView, PairedBroadcast]:
    """A sender view and a receiver view of one TP group at pipeline position ``stage``."""
    paired = PairedBroadcast()
    first, last = stage in ("all", "first"), stage in ("all", "last")
    return (
        TPView(0, 0, None, first, last, paired.source),
        TPView(1, 0, None, first, last, paired.receiver),
        paired,
    )


def describe(value) -> str:
    """``[2, 8] int64`` for a tensor, ``None`` for None: how the note prints batch fields."""
    if value is None:
        return "None"
    return f"{list(value.shape)} {str(value.dtype).replace('torch.', '')}"
