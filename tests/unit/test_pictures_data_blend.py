"""Note 18's blend picture: one cell per sample of the real BlendedDataset, in its table's order."""

from __future__ import annotations

import re

import numpy
import pytest

from snippets.data.pictures import blend_rows, draw_blend


@pytest.fixture(scope="module")
def train_blend(tmp_path_factory):
    """Note 18's blend: corpus a (10 documents) and b (8), ``--data-path 0.7 a 0.3 b``, train split."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.tokenizers import MegatronTokenizer

    from snippets.data.dataset_args import (
        core_gpt_dataset_config_from_args,
        get_train_valid_test_num_samples,
        parse_args,
    )
    from snippets.experiments.n03_batch_flow import write_corpus

    tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)
    d = str(tmp_path_factory.mktemp("corpus"))
    lengths = [2 + i % 4 for i in range(10)]
    starts = numpy.cumsum([0] + lengths[:-1])
    a = write_corpus(
        d, "a", [[int(s + j) % 30 for j in range(n)] for s, n in zip(starts, lengths)], tokenizer.eod
    )
    b = write_corpus(d, "b", [[20 + i % 5] * (3 + i % 3) for i in range(8)], tokenizer.eod)
    args = parse_args(
        f"--data-path 0.7 {a} 0.3 {b} --split 6,2,2 --seq-length 4 --micro-batch-size 1 "
        "--global-batch-size 4 --train-iters 4 --eval-interval 2 --eval-iters 1 "
        "--tokenizer-type NullTokenizer --vocab-size 32",
        world_size=2,
    )
    return BlendedMegatronDatasetBuilder(
        GPTDataset,
        get_train_valid_test_num_samples(args),
        lambda: True,
        core_gpt_dataset_config_from_args(args, tokenizer),
    ).build()[0]


def drawn(svg: str) -> list[list]:
    return [
        [int(i), name, int(k)]
        for i, name, k in re.findall(r"<title>样本 (\d+): (\w) 的第 (\d+) 个</title>", svg)
    ]


def test_picture_is_the_table_dataset_index(train_blend):
    """The table prints ``dataset_index`` as a string; the picture's cells spell the same string,
    and each cell's number is the real ``dataset_sample_index``."""
    svg = draw_blend(train_blend.dataset_index, train_blend.dataset_sample_index, [0.7, 0.3], title="t").svg()
    cells = drawn(svg)
    table_column = "".join(map(str, train_blend.dataset_index.tolist()))
    assert "".join(str("ab".index(name)) for _, name, _ in cells) == table_column
    assert cells == blend_rows(train_blend.dataset_index, train_blend.dataset_sample_index)
    assert [k for _, _, k in cells] == train_blend.dataset_sample_index.tolist()
    # each corpus' samples are counted 0, 1, 2, ... in the order the blend takes them
    for name in "ab":
        assert [k for _, n, k in cells if n == name] == list(range(sum(n == name for _, n, _ in cells)))


def test_a_changed_index_changes_the_picture(train_blend):
    index = train_blend.dataset_index.copy()
    index[0] = 1 - index[0]
    svg = draw_blend(index, train_blend.dataset_sample_index, [0.7, 0.3], title="t").svg()
    assert drawn(svg)[0][1] != "ab"[int(train_blend.dataset_index[0])]


def test_two_renders_are_byte_identical(train_blend):
    a = draw_blend(train_blend.dataset_index, train_blend.dataset_sample_index, [0.7, 0.3], title="t")
    b = draw_blend(train_blend.dataset_index, train_blend.dataset_sample_index, [0.7, 0.3], title="t")
    assert a.svg() == b.svg()
    a.check()
    assert a.width <= 1100
