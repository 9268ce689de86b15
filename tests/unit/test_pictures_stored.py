"""snippets/train/pictures.py, checked against the notes' stored runs: the picture each note stores
is exactly the one drawn from the table the same run printed (notes 01, 05, 23: its main picture and
its full strip), a second render is the same bytes, the legibility check passes, and the drawn data
are the table's rows."""

import json
import re
from pathlib import Path

import pytest

from snippets.train import pictures

NOTES = Path(__file__).resolve().parents[2] / "notes"


def _cells(note: str) -> list[dict]:
    return [
        c
        for c in json.loads((NOTES / f"{note}.ipynb").read_text(encoding="utf-8"))["cells"]
        if c["cell_type"] == "code"
    ]


def _table(note: str, source: str) -> list[list[str]]:
    """The rows (as text) of the markdown table stored by the code cell whose source is ``source``."""
    for cell in _cells(note):
        if "".join(cell["source"]).strip().endswith(source):
            for out in cell["outputs"]:
                if "text/markdown" in out.get("data", {}):
                    lines = "".join(out["data"]["text/markdown"]).splitlines()[2:]
                    return [[x.strip() for x in line.strip("|").split(" | ")] for line in lines]
    raise AssertionError(f"{note}: no stored table for {source!r}")


def _stored_svg(note: str, source: str) -> str:
    """The SVG stored by the code cell in which a line starts with ``source``."""
    for cell in _cells(note):
        if any(line.startswith(source) for line in "".join(cell["source"]).splitlines()):
            return next(
                "".join(o["data"]["image/svg+xml"])
                for o in cell["outputs"]
                if "image/svg+xml" in o.get("data", {})
            )
    raise AssertionError(f"{note}: no stored picture for {source!r}")


def _value(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _typed(rows):
    return [[_value(x) for x in row] for row in rows]


def test_note_23_strip_is_the_journey_table():
    rows = _table("23_tensor_journey", "journey_table(summaries)")
    fig = pictures.draw_journey_strip(rows, rank=4)
    fig.check()
    assert fig.svg() == pictures.draw_journey_strip(rows, rank=4).svg()
    assert fig.svg() == _stored_svg("23_tensor_journey", "pictures.draw_journey_strip")
    stations = pictures.journey_stations(rows)
    assert [s["station"] for s in stations] == [r[0] for r in rows]
    assert [s["shape"] for s in stations] == [r[3] for r in rows]
    # each held range is the table's, and each producing collective is named as the table does
    assert [f"{s['axis']} [{s['start']}, {s['end']})" for s in stations] == [
        r[2].split(" × ")[0] for r in rows
    ]
    assert [s["comm"] is None for s in stations] == [" · " not in r[4] for r in rows]


def test_note_23_main_picture_is_the_journey_and_memory_tables():
    """The summary at the top of note 23 draws seven rows of the journey table (the roadmap's forms,
    in its order) exactly as the full strip reads them, and the memory table's bytes per rank."""
    rows = _table("23_tensor_journey", "journey_table(summaries)")
    memory = _table("23_tensor_journey", 'memory_table(summaries, reference=(ref["memory"], ref["formula"]))')
    fig = pictures.draw_journey_summary(rows, memory, rank=4)
    fig.check()
    assert fig.width <= 1070  # the content column at 1400 px
    assert fig.svg() == pictures.draw_journey_summary(rows, memory, rank=4).svg()
    assert fig.svg() == _stored_svg("23_tensor_journey", "pictures.draw_journey_summary")
    full = {s["form"]: s for s in pictures.journey_stations(rows)}
    drawn = pictures.summary_stations(rows)
    assert [s["short"] for s in drawn] == [name for _, name in pictures.SUMMARY_FORMS]
    for s in drawn:  # same range, shape, collective and recorded phase as the table's row
        assert {k: v for k, v in s.items() if k != "short"} == {
            k: v for k, v in full[s["form"]].items() if k != "short"
        }
    by_form = {r[1]: r for r in rows}
    assert [s["phase"] for s in drawn] == [
        by_form[s["form"]][5] if by_form[s["form"]][5] != "-" else None for s in drawn
    ]
    groups, reference = pictures.memory_groups(memory)
    keys = ["weights", "grads", "main_params", "adam_state", "activations", "total"]
    assert sorted(r for g in groups for r in g["ranks"]) == list(range(8))
    for g in groups:
        for r in g["ranks"]:
            assert [g[k] for k in keys] == [int(x) for x in memory[r][2:8]]
    assert reference is not None and reference["total"] == int(memory[-1][7])
    svg = fig.svg()
    for g in groups:
        assert f"{g['total']} B" in svg


def test_note_05_picture_is_the_who_divides_table():
    rows = _typed(_table("05_forward_loss_backward", '"梯度 = 全局 token 平均"], divides)'))
    fig = pictures.draw_loss_division(rows, tokens=[16, 6])
    fig.check()
    assert fig.svg() == _stored_svg("05_forward_loss_backward", "pictures.draw_loss_division")
    lanes = pictures.loss_division_lanes(rows, tokens=[16, 6])
    labels = [label.text for label in fig.labels()]
    for row, lane in zip(rows, lanes):
        assert lane["report"] == row[1] and any(t.startswith(f"{row[1]:.4f}") for t in labels)
        assert lane["target"] == ("micro-batch 平均的平均" if row[2] else "全局 token 平均")
    # the logged value is halved exactly where the report shares the loss's storage
    assert [lane["report_divided"] for lane in lanes] == [False, True, True, False, False]


def test_note_01_picture_is_the_two_log_tables():
    tables = [
        _typed(_table("01_training_run_overview", f"log_table({name})")) for name in ("as_published", "fixed")
    ]
    fig = pictures.draw_loop_runs(*tables)
    fig.check()
    svg = fig.svg()
    assert svg == _stored_svg("01_training_run_overview", "pictures.draw_loop_runs")
    tips = re.findall(r"<title>([^<]*第 \d+ 步：[^<]*)</title>", svg)
    expected = [
        f"{run} 第 {row[0]} 步：{row[col]}"
        for col in (3, 2)
        for i in range(len(tables[0]))
        for run, rows in (
            ("原样（torch.optim.Adam）", tables[0]),
            ("改后（get_megatron_optimizer）", tables[1]),
        )
        for row in [rows[i]]
    ]
    assert tips == expected


def test_journey_stations_refuse_a_row_without_a_range():
    with pytest.raises(ValueError, match="no range"):
        pictures.journey_stations([["①", "x", "nowhere", "[1]", "无"]])
