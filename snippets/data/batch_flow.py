"""How one GPT micro-batch reaches every rank: ``get_batch`` and its TP broadcast (note 03).

At core 0.19 the TP broadcast is ``megatron/core/utils.py::get_batch_on_this_tp_rank`` (:2119, in
the pip package); ``pretrain_gpt.py::get_batch`` (:97) still lives only in the git tag. This module
restates both readably with Megatron's names, for the path the GPT recipe takes without hybrid CP:

* only TP rank 0 of a pipeline stage reads the data iterator (``get_batch`` fills every key of
  ``BATCH_KEYS``, None where the sample has none); it broadcasts, in the TP group, the fields its
  stage needs; the other TP ranks allocate empty buffers from ``args`` (they never touch the
  dataset) and receive;
* the first stage needs the inputs, the last stage the targets, a single stage (PP=1) all five
  fields; a middle stage needs nothing and ``get_batch`` returns before any broadcast, unless the
  samples are packed (``--sft`` or ``--dataloader-inter-document-masking``): then every stage gets
  ``cu_seqlens`` and ``max_seqlen``;
* ``cu_seqlens`` (and, with CP > 1, ``cu_seqlens_padded``) travel in two broadcasts each (the
  length, then the values), after the per-sample fields and before the mask, and only when the
  flags say the samples are packed; whether the data holds them does not decide it.

The TP broadcast is restated rather than called so that a note can replay one TP group in one
process (:class:`PairedBroadcast`) and name every field it sends (``log``). The packing and the
context-parallel split are *not* restated: ``get_batch`` calls the real
``flatten_batch_for_packed_sequences`` and ``get_batch_on_this_cp_rank`` from
``megatron.core.utils``.

``tests/ranks/test_batch_flow.py`` runs Megatron's ``get_batch_on_this_tp_rank`` (from the
installed package) beside ours through :class:`PairedBroadcast` and checks that they issue the same
broadcasts and end with the same batches; with a checkout of the tag it also runs
``pretrain_gpt.get_batch`` beside :func:`get_batch` on 4 gloo ranks.
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
"""The five per-sample fields every GPT micro-batch has."""

BATCH_KEYS = (
    "attention_mask",
    "cu_seqlens",
    "cu_seqlens_padded",
    "hybrid_cp_group",
    "labels",
    "local_cp_size",
    "loss_mask",
    "max_seqlen",
    "position_ids",
    "tokens",
)
"""``pretrain_gpt.BATCH_KEYS`` (:83): what ``get_batch`` returns, in this (alphabetical) order."""

STAGE_FIELDS = {
    "all": ("tokens", "labels", "loss_mask", "position_ids", "attention_mask"),  # PP=1
    "first": ("tokens", "position_ids", "attention_mask"),  # embeds the tokens
    "last": ("labels", "loss_mask", "attention_mask"),  # computes the loss
    "middle": (),  # only sees hidden states
}
"""Which per-sample fields the TP source broadcasts, by pipeline position, in the order it sends them."""


@dataclass
class BatchArgs:
    """The fields of Megatron's ``args`` that ``get_batch`` reads (receivers size buffers by them)."""

    micro_batch_size: int
    seq_length: int
    pipeline_model_parallel_size: int = 1
    create_attention_mask_in_dataloader: bool = True
    context_parallel_size: int = 1
    sft: bool = False
    dataloader_inter_document_masking: bool = False

    @property
    def has_cu_seqlens(self) -> bool:
        """``pretrain_gpt.get_batch``: packed samples come from SFT or inter-document masking."""
        return self.sft or self.dataloader_inter_document_masking


@dataclass
class TPView:
    """What ``get_batch`` asks ``parallel_state``, plus the broadcast it uses."""

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
    mask = max_seqlen = None
    if args.has_cu_seqlens:
        max_seqlen = torch.empty(args.micro_batch_size, dtype=torch.int32)
    if args.create_attention_mask_in_dataloader:
        mask = torch.empty(args.micro_batch_size, 1, args.seq_length, args.seq_length, dtype=torch.bool)
    return dict(
        tokens=torch.empty(shape, dtype=torch.int64),
        labels=torch.empty(shape, dtype=torch.int64),
        loss_mask=torch.empty(shape, dtype=torch.float32),
        position_ids=torch.empty(shape, dtype=torch.int64),
        attention_mask=mask,
        cu_seqlens=None,
        cu_seqlens_padded=None,
        max_seqlen=max_seqlen,
        local_cp_size=None,  # hybrid CP only
        hybrid_cp_group=None,
    )


def get_batch_on_this_tp_rank(
    data_iterator,
    args: BatchArgs,
    mtp_on_this_rank: bool = False,
    view: TPView | None = None,
    log: list | None = None,
) -> dict:
    """TP rank 0 reads one micro-batch and broadcasts its stage's fields; the others receive.

    Returns the batch dict (the keys of :data:`BATCH_KEYS`; TP rank 0 keeps any other key its
    sample had). ``log``, if given, collects ``(field, shape, dtype)`` per broadcast.
    """
    view = view or TPView.from_parallel_state()
    is_source = view.tp_rank == 0
    stage = stage_kind(args, view, mtp_on_this_rank)
    if is_source:  # pretrain_gpt.get_batch: read, and give every BATCH_KEYS entry a value
        batch = dict(next(data_iterator))
        batch.update({key: batch.get(key) for key in BATCH_KEYS})
    else:
        batch = empty_batch(args)

    def send(name, tensor):
        if tensor is not None:  # None on the sender means "not sent"; a receiver's buffer, "expected"
            if log is not None:
                log.append((name, tuple(tensor.shape), str(tensor.dtype).replace("torch.", "")))
            view.broadcast(tensor, view.src_rank, group=view.group)

    def send_cu_seqlens(name, cu_seqlens):
        # Receivers cannot size the buffer, so the length goes first (0 = "none").
        count = torch.tensor(0 if cu_seqlens is None or not is_source else cu_seqlens.numel())
        send(f"{name} (count)", count)
        n = int(count.item())
        if n == 0:
            return cu_seqlens if is_source else None
        if is_source:
            assert cu_seqlens.dtype == torch.int32, f"Expected {name} to be of type torch.int32"
        else:  # the dataloader's (micro_batch_size, padded_len) layout
            cu_seqlens = torch.empty((args.micro_batch_size, n // args.micro_batch_size), dtype=torch.int32)
        send(name, cu_seqlens)
        return cu_seqlens

    if stage != "middle":
        for name in STAGE_FIELDS[stage][:-1]:  # the per-sample fields; the mask goes last
            send(name, batch[name])
    if stage != "middle" or args.has_cu_seqlens:
        if args.has_cu_seqlens:
            batch["cu_seqlens"] = send_cu_seqlens("cu_seqlens", batch["cu_seqlens"])
            send("max_seqlen", batch["max_seqlen"])
            if args.context_parallel_size > 1:
                batch["cu_seqlens_padded"] = send_cu_seqlens("cu_seqlens_padded", batch["cu_seqlens_padded"])
        if stage != "middle" and args.create_attention_mask_in_dataloader:
            send("attention_mask", batch["attention_mask"])

    # Each stage drops what it does not need (the source's mask stays as the data had it; a middle
    # stage's receiver keeps its unused mask buffer, as at the tag).
    dropped = [n for n in ("tokens", "labels", "loss_mask", "position_ids") if n not in STAGE_FIELDS[stage]]
    if stage == "middle" and is_source:
        dropped.append("attention_mask")
    if stage != "middle" or args.has_cu_seqlens:
        for name in dropped:
            batch[name] = None
    return batch


def get_batch(
    data_iterator,
    args: BatchArgs,
    view: TPView | None = None,
    log: list | None = None,
    cp_group=None,
) -> dict:
    """``pretrain_gpt.get_batch`` (no MTP, no hybrid CP): TP broadcast, packing, then the real CP split.

    Returns a dict with the keys of :data:`BATCH_KEYS` (``pretrain_gpt`` returns its values in that
    order); a stage that needs nothing gets all None.
    """
    from megatron.core.utils import flatten_batch_for_packed_sequences, get_batch_on_this_cp_rank

    view = view or TPView.from_parallel_state()
    outer = view.is_first_stage or view.is_last_stage or args.pipeline_model_parallel_size == 1
    if not outer and not args.has_cu_seqlens:
        return dict.fromkeys(BATCH_KEYS)  # a middle stage's input arrives from the previous stage
    batch = get_batch_on_this_tp_rank(data_iterator, args, view=view, log=log)
    batch = flatten_batch_for_packed_sequences(batch)
    if not outer:  # only the packing metadata
        kept = ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")
        return {key: batch[key] if key in kept else None for key in BATCH_KEYS}
    if cp_group is None:
        from megatron.core import parallel_state as mpu

        cp_group = mpu.get_context_parallel_group()
    batch = get_batch_on_this_cp_rank(
        batch,
        is_hybrid_cp=False,
        cp_group=cp_group,
        hybrid_cp_group_func=None,
        use_per_sequence_balancing=args.dataloader_inter_document_masking and not args.sft,
    )
    return {key: batch[key] for key in BATCH_KEYS}


def packed_seq_params(batch: dict, seq_length: int):
    """What ``pretrain_gpt.forward_step`` (:310-333) builds from ``get_batch``'s packed metadata:
    None without ``cu_seqlens``, else ``PackedSeqParams(qkv_format="thd", ...)``."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu_seqlens, cu_seqlens_padded = batch["cu_seqlens"], batch["cu_seqlens_padded"]
    if cu_seqlens is None:
        return None
    cu_seqlens = cu_seqlens.squeeze(0)
    if cu_seqlens_padded is not None:
        cu_seqlens_padded = cu_seqlens_padded.squeeze(0)
    cu_seqlens_for_params = cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens
    max_seqlen = int(batch["max_seqlen"].item())
    local_cp_size = batch["local_cp_size"]
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens_for_params,
        cu_seqlens_kv=cu_seqlens_for_params,
        cu_seqlens_q_padded=cu_seqlens_padded,
        cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
        local_cp_size=int(local_cp_size.item()) if local_cp_size is not None else None,
        cp_group=batch["hybrid_cp_group"],
        tokens_per_sample=seq_length,
    )


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
