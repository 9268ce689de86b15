"""Notes 18 and 19's main pictures: one cell per (field, stage) and per (TP layer, phase), from the
rows the notes' runs return; labels legible, bytes stable."""

from __future__ import annotations

import re

from snippets.config.pictures import draw_tp_model, short_apis
from snippets.data.pictures import draw_fields, field_rows

STAGES = [  # note 18's PP=3 run: what get_batch left each stage, what its model read
    {
        "stage": "first",
        "given": ["tokens", "attention_mask", "position_ids"],
        "read": ["tokens", "attention_mask"],
    },
    {"stage": "middle", "given": [], "read": []},
    {
        "stage": "last",
        "given": ["labels", "loss_mask", "attention_mask"],
        "read": ["labels", "attention_mask"],
    },
]
READERS = {  # note 18's single-rank RoPE model
    "tokens": ["embedding.word_embeddings(input_ids)"],
    "labels": ["compute_language_model_loss(labels)"],
    "loss_mask": [],
    "attention_mask": [f"decoder.layers.{i}.self_attention.core_attention(attention_mask)" for i in range(2)],
    "position_ids": [],
}


def test_field_rows_say_who_reads_and_what_each_stage_gets():
    rows = {row[0]: row[1:] for row in field_rows(STAGES, READERS)}
    assert rows["tokens"] == ["word_embeddings", "读", "不给", "不给"]
    assert rows["attention_mask"] == ["core_attention ×2", "读", "不给", "读"]
    assert rows["position_ids"] == ["模型里无人读", "给了没读", "不给", "不给"]
    assert rows["loss_mask"] == ["模型里无人读", "不给", "不给", "给了没读"]


def test_fields_picture_has_a_group_per_field_and_is_stable():
    svg = draw_fields(STAGES, READERS, title="t").svg()
    assert re.findall(r'data-name="([^"]+)"', svg) == [
        "tokens",
        "position_ids",
        "attention_mask",
        "labels",
        "loss_mask",
    ]
    assert svg == draw_fields(STAGES, READERS, title="t").svg()


def test_tp_model_picture_abbreviates_collectives():
    assert short_apis("all-gather, reduce-scatter") == "AG + RS"
    assert short_apis("all-reduce ×3") == "AR ×3"
    layers = [
        ["word_embeddings", "VocabParallelEmbedding", 0, [16, 16]],
        ["output_layer", "ColumnParallelLinear", "—", "—"],
        ["cross entropy", None, None, None],
    ]
    comm = [
        ("TP=2 forward", ["all-reduce", "—", "all-reduce ×3"]),
        ("TP=2 backward", ["—", "all-reduce", "—"]),
    ]
    svg = draw_tp_model(layers, comm, title="t").svg()
    assert "共享词嵌入" in svg and "层外" in svg and ">AR ×3<" in svg
    assert "列并行 dim" not in svg  # the output layer has no weight of its own: no partition dim shown
