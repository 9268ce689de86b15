"""The runner's ``hf-convert`` (note 25) at ``--dims tiny``: the runner's path -- the same ``run``
and ``tables``, in-process through ``run_ranks`` -- prints the note's stored tables."""

from run_support import assert_in_note, rows_of, runner_tables


def test_hf_convert_runner_path_prints_note_25_tables():
    import megatron.core.models.gpt  # noqa: F401  (imported here once, not in each forked rank)
    import transformers  # noqa: F401

    mapping, proof = runner_tables("hf-convert", 4, tp=2, pp=2)
    assert_in_note(mapping, "25_megatron_hf_conversion")
    assert_in_note(proof, "25_megatron_hf_conversion", whole=False)  # the note has a second model
    verdicts = [row.rsplit("|", 2)[1].strip() for row in rows_of(proof)[1]]
    assert verdicts == ["True", "True", "False", "False", "False"]
