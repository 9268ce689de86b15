"""snippets/ranks/group_creation.py against note 02's stored run: the picture the note stores is the
one drawn from the creation-order table the same run printed, a second render is the same bytes,
the legibility check passes, and every group made is one box with its members."""

import json
import re
from pathlib import Path

from snippets.ranks.group_creation import creation_order, draw_group_creation

NOTE = Path(__file__).resolve().parents[2] / "notes" / "02_distributed_initialization.ipynb"


def _outputs():
    cells = [c for c in json.loads(NOTE.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    return [o for c in cells for o in c.get("outputs", [])]


def _stored_rows() -> list[list]:
    """The creation-order table (in its fold), typed as creation_order makes it."""
    for out in _outputs():
        text = "".join(out.get("data", {}).get("text/markdown", ""))
        if "| # | group_desc | backend |" in text:
            lines = text[text.index("| # | group_desc") :].splitlines()[2:]
            rows = []
            for line in lines:
                if not line.startswith("|"):
                    break
                number, desc, backend, count, members = [x.strip() for x in line.strip("|").split(" | ")]
                rows.append([int(number), desc, backend, int(count), members])
            return rows
    raise AssertionError("note 02 stores no creation-order table")


def _stored_svg() -> str:
    for out in _outputs():
        svg = "".join(out.get("data", {}).get("image/svg+xml", ""))
        if "create_group" in svg:
            return svg
    raise AssertionError("note 02 stores no picture of its create_group calls")


def test_note_02_picture_is_its_creation_table():
    rows = _stored_rows()
    fig = draw_group_creation(rows, 0, setting="4 rank、TP=2、PP=2")
    fig.check()
    assert fig.svg() == draw_group_creation(rows, 0, setting="4 rank、TP=2、PP=2").svg()
    assert fig.svg() == _stored_svg()
    boxes = re.findall(r"<title>([A-Z_]+)（([^）]+)）：\[([\d, ]+)\]</title>", fig.svg())
    assert len(boxes) == sum(row[3] for row in rows)
    assert sum(backend == "gloo" for _, backend, _ in boxes) == sum(r[3] for r in rows if r[2] == "gloo")


def test_creation_order_merges_calls_by_kind_in_first_seen_order():
    calls = [("B", "默认", [0]), ("A", "gloo", [0, 1]), ("B", "默认", [1]), ("A", "gloo", [2, 3])]
    table = creation_order(calls)
    assert table.rows == [[1, "B", "默认", 2, "[0] [1]"], [2, "A", "gloo", 2, "[0, 1] [2, 3]"]]
