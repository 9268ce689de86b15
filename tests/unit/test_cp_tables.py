"""Note 16's computed tables: the contiguous split's imbalance formula against the counted pairs, and
Transformer Engine's backward payload rule against what our ring sends (one hop more at the start)."""

from snippets.experiments.n16_cp import imbalance_rows, te_backward_payloads, work_table


def test_imbalance_formula_is_the_counted_ratio_and_tends_to_2cp_minus_1():
    rows = imbalance_rows([(2, 16), (4, 16), (2, 4096)]).rows
    for cp, s, counted, formula, limit, *_ in rows:
        assert counted == formula
        assert counted < limit == 2 * cp - 1
    assert rows[0][2] == round(100 / 36, 4)  # work_table(2, 16): 36 and 100 pairs
    assert [r[3] for r in work_table(2, 16)] == [36, 100]
    assert limit - rows[2][2] < 0.01  # s = 4096: close to the limit


def test_te_backward_payloads_send_kv_first_and_dkv_last():
    assert te_backward_payloads(4, 64) == [64, 128, 128, 64]
    assert te_backward_payloads(2, 10) == [10, 10]
    assert te_backward_payloads(1, 10) == []
