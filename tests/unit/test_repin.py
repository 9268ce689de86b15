"""snippets.site.repin's pure functions on made-up sources: a statement is followed by its whole text
inside the function that held it, and a link is rewritten to the new tag (anchor, range, the
``file.py:N`` / ``file.py 第 N 行`` text)."""

from __future__ import annotations

from pathlib import Path

from snippets.site import repin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# One made-up Megatron file at an old and a new tag (tests/site/test_drift.py reads the same pair).
OLD = (FIXTURES / "made_up_source_old.py.txt").read_text().splitlines()
NEW = (FIXTURES / "made_up_source_new.py.txt").read_text().splitlines()


def _at(lines: list[str], text: str) -> int:
    return next(i + 1 for i, row in enumerate(lines) if row.strip() == text)


def test_a_statement_moves_with_its_function():
    for text in (
        "expert_gradient_scaling_factor = 1.0 / world",
        "return gradient_scaling_factor",
        "return x",
    ):
        new = repin.follow_statement(OLD, NEW, _at(OLD, text))
        assert new is not None and NEW[new - 1].strip() == text, text
    assert repin.follow_statement(OLD, NEW, _at(OLD, "return x")) == 20  # other's, not helper's (15)
    assert repin.follow_statement(OLD, NEW, 1) == 2  # module level: in the module


def test_a_statement_is_never_found_as_a_substring_or_in_another_function():
    assert repin.follow_statement(OLD, NEW, _at(OLD, "gradient_scaling_factor = 1.0 / world")) is None
    assert repin.follow_statement(OLD, NEW, _at(OLD, "x = 1")) is None  # helper's x = 1 is not it
    assert repin.follow_statement(OLD, NEW, _at(OLD, "return 0")) is None  # gone() is gone
    assert repin.owner_span(OLD, NEW, _at(OLD, "return 0")) is None


def test_a_blank_line_is_never_followed():
    assert repin.follow_statement(OLD, NEW, 2) is None


def test_a_statement_in_a_function_with_a_multi_line_signature_stays_in_it():
    old = ["def f(", "    a,", "):", "    y = a", "    return y", ""]
    new = ["y = 0", "", "", "def f(", "    a,", "):", "    return a", ""]
    assert repin.enclosing(old, 4) == 1
    assert repin.follow_statement(old, new, 4) is None  # f no longer has it: not module-level y = 0


def test_a_repeated_statement_is_the_one_with_the_same_neighbours():
    old = ["def f():", "    a = 1", "    x = 0", "    b = 2", "    x = 0", "    c = 3", ""]
    # the function grew at its start: by offset the first x = 0 would be taken, by neighbours the second
    new = [
        "def f():",
        "    z = 9",
        "    z = 8",
        "    a = 1",
        "    x = 0",
        "    b = 2",
        "    x = 0",
        "    c = 3",
        "",
    ]
    assert repin.follow_statement(old, new, 5) == 7
    assert repin.follow_statement(old, new, 3) == 5


URL = "https://github.com/NVIDIA/Megatron-LM/blob"
P = "megatron/core/tensor_parallel/mappings.py"


def test_a_statement_link_with_a_range_is_rewritten_end_to_end():
    text = f"见 [`mappings.py:31-33`]({URL}/core_v0.16.1/{P}#L31-L33) 一段"
    out = repin.rewrite_text(text, "core_v0.16.1", "core_v0.19.0", {(P, 31): 34, (P, 33): 36})
    assert out == f"见 [`mappings.py:34-36`]({URL}/core_v0.19.0/{P}#L34-L36) 一段"


def test_a_zh_statement_link_is_rewritten():
    text = (
        f"[mappings.py 第 31 行]({URL}/core_v0.16.1/{P}#L31)、"
        f"[mappings.py 第 9–10 行]({URL}/core_v0.16.1/{P}#L9-L10)"
    )
    moves = {(P, 31): 104, (P, 9): 9, (P, 10): 12}
    out = repin.rewrite_text(text, "core_v0.16.1", "core_v0.19.0", moves)
    assert out == (
        f"[mappings.py 第 104 行]({URL}/core_v0.19.0/{P}#L104)、"
        f"[mappings.py 第 9–12 行]({URL}/core_v0.19.0/{P}#L9-L12)"
    )


def test_a_link_left_open_stays_on_the_old_tag_and_another_tag_is_untouched():
    text = f"[`mappings.py:31`]({URL}/core_v0.16.1/{P}#L31) [`x`]({URL}/core_v0.18.0/{P}#L5)"
    assert repin.rewrite_text(text, "core_v0.16.1", "core_v0.19.0", {}) == text
    symbol = f"[`mappings.py::_reduce`]({URL}/core_v0.16.1/{P}#L22)"
    out = repin.rewrite_text(symbol, "core_v0.16.1", "core_v0.19.0", {(P, 22): 22})
    assert out == f"[`mappings.py::_reduce`]({URL}/core_v0.19.0/{P}#L22)"  # a symbol's text is kept
