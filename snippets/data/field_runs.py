"""Note 18's runs of a real ``GPTModel`` on one batch: who reads each field, per stage, and packed.

Each function runs on ranks started by :func:`snippets.ranks.launch.run_ranks` and returns plain
values to the notebook:

- :func:`field_runs` (1 rank): a 2-layer model with learned absolute positions and one with RoPE
  (and a 3-layer RoPE model, the reference for the pipeline run), each field's readers
  (:mod:`snippets.data.forward_fields`), and the per-token loss when one field is changed;
- :func:`pipeline_fields` (3 ranks, PP=3): ``get_forward_backward_func()`` over one micro-batch in
  which each stage is given only the fields ``pretrain_gpt.py::get_batch`` leaves it
  (:data:`snippets.data.batch_flow.STAGE_FIELDS`), what the stage's model really read, and what a
  middle stage's ``attention_mask=None`` does on CPU;
- :func:`packed_runs` (1 rank): one packed (THD) micro-batch through the same model, first with the
  local ``DotProductAttention`` (which refuses it), then with :class:`ThdCoreAttention` standing in
  for Transformer Engine's kernel, beside each document run alone.

Weights come from the layers' global names (:func:`snippets.models.tiny_gpt.init_by_global_name`),
so the pipelined model and the single-rank 3-layer model hold the same weights.
"""

from __future__ import annotations

import re
import traceback
from collections import Counter
from functools import partial

import torch

from snippets.data.batch_flow import FIELDS, STAGE_FIELDS
from snippets.data.forward_fields import readers_of, record_forward_inputs

CHANGES = (
    "tokens 右移一位",
    "position_ids 倒序",
    "attention_mask 全 False（不屏蔽）",
    "attention_mask = None",
    "loss_mask 全 0",
)
"""The one-field changes :func:`field_runs` makes, in the order note 18 prints them."""


def _failure(err) -> str:
    return f"{type(err).__name__}: {err}"


def field_runs(batch) -> dict:
    """Per model kind: each field's readers, the per-token loss, and the loss after each change."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)

    def forward(model, b, **change):
        b = {**b, **change}
        try:
            with torch.no_grad():
                return model(
                    b["tokens"],
                    b["position_ids"],
                    b["attention_mask"],
                    labels=b["labels"],
                    loss_mask=b["loss_mask"],
                )
        except Exception as err:
            return _failure(err)

    out = {}
    for kind in ("learned_absolute", "rope", "rope, 3 layers"):
        model = GPTModel(
            tiny_config(num_layers=3 if "3" in kind else 2),
            get_gpt_layer_local_spec(),
            vocab_size=32,
            max_sequence_length=8,
            position_embedding_type=kind.split(",")[0],
        )
        init_by_global_name(model)  # weights by global name: the pipeline run gets the same ones
        model.eval()
        with torch.no_grad(), record_forward_inputs(model) as seen:
            base = forward(model, batch)
        changed = dict(
            zip(
                CHANGES,
                (
                    forward(model, batch, tokens=batch["tokens"].roll(1, dims=1)),
                    forward(model, batch, position_ids=batch["position_ids"].flip(1)),
                    forward(model, batch, attention_mask=torch.zeros_like(batch["attention_mask"])),
                    forward(model, batch, attention_mask=None),
                    forward(model, batch, loss_mask=torch.zeros_like(batch["loss_mask"])),
                ),
            )
        )
        out[kind] = dict(
            readers={k: readers_of(v, seen) for k, v in batch.items()}, base=base, changed=changed
        )
    return out


def pipeline_fields(batch) -> dict:
    """One forward-only micro-batch over PP=3 (one layer per stage), each stage given only its fields."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.models.tiny_gpt import init_by_global_name, tiny_config
    from snippets.record import recorder

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=3)
    model_parallel_cuda_manual_seed(0)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        tiny_config(num_layers=3, pipeline_model_parallel_size=3),
        get_gpt_layer_local_spec(),
        vocab_size=32,
        max_sequence_length=8,
        pre_process=first,
        post_process=last,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    )
    init_by_global_name(model)
    stage = "first" if first else "last" if last else "middle"
    given = {k: batch[k] if k in STAGE_FIELDS[stage] else None for k in FIELDS}  # what get_batch leaves

    mask_none = None
    if stage == "middle":  # exactly what get_batch gives a middle stage: attention_mask=None
        model.set_input_tensor(torch.zeros(8, 2, 16))
        try:
            model(None, None, None)
        except Exception as err:
            frame = traceback.extract_tb(err.__traceback__)[-2]
            mask_none = f"{type(err).__name__} @ {frame.filename.split('megatron/core/')[-1]}:{frame.lineno}"

    def loss_func(loss_mask, output_tensor):  # pretrain_gpt.py::loss_func without the NaN checks
        loss = torch.sum(output_tensor.view(-1).float() * loss_mask.view(-1).float())
        num_tokens = loss_mask.sum().to(torch.int)
        return loss, num_tokens, {"lm loss": torch.cat([loss.detach().view(1), num_tokens.view(1)])}

    def forward_step(data_iterator, model):
        b = next(data_iterator)
        # CPU only: a None mask makes the local attention build its causal mask with device="cuda"
        mask = b["attention_mask"] if b["attention_mask"] is not None else torch.ones(1, 1, 8, 8).tril() < 0.5
        output = model(b["tokens"], b["position_ids"], mask, labels=b["labels"], loss_mask=b["loss_mask"])
        return output, partial(loss_func, b["loss_mask"])

    with recorder.record() as calls, record_forward_inputs(model) as seen:
        reports = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([given]),
            model=[model],
            num_microbatches=1,
            seq_length=8,
            micro_batch_size=2,
            forward_only=True,
        )
    return dict(
        stage=stage,
        given=[k for k in FIELDS if given[k] is not None],
        read=[k for k in FIELDS if readers_of(batch[k], seen)],
        mask_none=mask_none,
        report=[r["lm loss"] for r in reports],
        calls=calls,
    )


def packed_runs(packed) -> dict:
    """One packed micro-batch: local attention's refusal, then THD attention beside each document alone."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.data.thd_attention import ThdCoreAttention
    from snippets.models.tiny_gpt import init_by_global_name, tiny_config

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        tiny_config(num_layers=2),
        get_gpt_layer_local_spec(),
        vocab_size=32,
        max_sequence_length=8,
        position_embedding_type="rope",
    )
    init_by_global_name(model)
    model.eval()
    tokens, labels, cu_seqlens = packed["tokens"], packed["labels"], packed["cu_seqlens"]
    longest = int(cu_seqlens.diff().max())

    def params(cu, max_seqlen):  # what forward_step builds (pretrain_gpt.py:323)
        return PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=max_seqlen,
            max_seqlen_kv=max_seqlen,
        )

    def packed_forward(p):  # THD: no position_ids, no attention_mask
        try:
            with torch.no_grad():
                return model(tokens, None, None, labels=labels, packed_seq_params=p)
        except Exception as err:
            frames = [
                (f.filename.split("site-packages/")[-1], f.lineno, f.name)
                for f in traceback.extract_tb(err.__traceback__)
                if "megatron/core" in f.filename
            ]
            return _failure(err), frames

    out = dict(local_attention=packed_forward(params(cu_seqlens, longest)))
    local = [layer.self_attention.core_attention for layer in model.decoder.layers]
    for layer in model.decoder.layers:  # stand in for TE's THD kernel (CPU has no TE)
        layer.self_attention.core_attention = ThdCoreAttention.replacing(layer.self_attention.core_attention)
    with record_forward_inputs(model) as seen:
        out["packed"] = packed_forward(params(cu_seqlens, longest))
    out["rotary_length"] = next(v for r, a, v in seen if a == "max_seq_len")
    out["core_attention_got"] = model.decoder.layers[0].self_attention.core_attention.seen[0]
    out["max_seqlen 8"] = packed_forward(params(cu_seqlens, 8))
    out["max_seqlen too small"] = packed_forward(params(cu_seqlens, longest - 1))
    out["cu_seqlens [1, n]"] = packed_forward(params(cu_seqlens[None], longest))
    for layer, core in zip(model.decoder.layers, local):
        layer.self_attention.core_attention = core

    def causal(n):
        return torch.ones(1, 1, n, n).tril() < 0.5

    with torch.no_grad():
        bounds = zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())
        out["separate"] = torch.cat(
            [model(tokens[:, s:e], None, causal(e - s), labels=labels[:, s:e]) for s, e in bounds], dim=1
        )
        out["one causal sequence"] = model(tokens, None, causal(8), labels=labels)
    return out


def readers_cell(names) -> str:
    """'decoder.layers.0.x(a)', 'decoder.layers.1.x(a)' -> 'decoder.layers.*.x(a) ×2'."""
    counts = Counter(re.sub(r"layers\.\d+", "layers.*", name) for name in names)
    return "，".join(f"{name} ×{n}" if n > 1 else name for name, n in counts.items()) or "无"


def effect(result, base) -> str:
    """What one change did to the per-token loss: 变了 / 不变, or the error it raised."""
    return result if isinstance(result, str) else ("变了" if not torch.allclose(result, base) else "不变")


def where(failure) -> str:
    """A failed packed forward as 'message @ file:line function' (its innermost Megatron frame)."""
    message, frames = failure
    path, line, name = frames[-1]
    return f"{message}  @ {path.split('/')[-1]}:{line} {name}"
