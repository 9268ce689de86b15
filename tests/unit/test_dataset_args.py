"""snippets.data.dataset_args restates how pretrain_gpt.py turns flags into a GPTDatasetConfig and the
three split sizes. These tests check the restatement against what it must produce, and against
Megatron's own parser and ``get_train_valid_test_num_samples`` (both in the pip package since core
0.19); with a checkout (``--megatron-src`` / ``MEGATRON_SRC``) also against the dict literal and
``core_gpt_dataset_config_from_args`` of ``pretrain_gpt.py``, run on the same ``args``."""

from __future__ import annotations

import argparse
import ast
import json
import os
from pathlib import Path

import pytest

from snippets.data import dataset_args
from snippets.site.sources import installed_root

COMMANDS = [
    "--data-path /d/a --split 98,1,1 --seq-length 8 --train-iters 4 --global-batch-size 4 "
    "--eval-interval 2 --eval-iters 1",
    "--data-path 0.7 /d/a 0.3 /d/b --split 6,2,2 --seq-length 4 --reset-position-ids --eod-mask-loss "
    "--no-create-attention-mask-in-dataloader --data-cache-path /c --train-samples 40 "
    "--global-batch-size 8 --eval-interval 3 --tensor-model-parallel-size 2 --sequence-parallel",
    "--train-data-path 30 /d/a 70 /d/b --valid-data-path /d/v --test-data-path /d/t --seq-length 16 "
    "--train-iters 10 --global-batch-size 2 --eval-interval 5 --eval-iters 2 --context-parallel-size 2",
    "--data-path /d/a /d/b --split 1 --seq-length 4 --full-validation --train-iters 3 "
    "--global-batch-size 4 --mid-level-dataset-surplus 0.1 --no-mmap-bin-files",
    "--data-path /d/a --split 98,1,1 --seq-length 8 --train-iters 8 --global-batch-size 4 "
    "--eval-interval 2 --eval-iters 1 --start-eval-at-iter 4 --eval-global-batch-size 2 "
    "--dataloader-inter-document-masking",
]


def _tokenizer():
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=32)


TOKENIZER = _tokenizer()


# ---------------------------------------------------------------- without a checkout


def test_weighted_data_path_becomes_a_weighted_blend():
    args = dataset_args.parse_args("--data-path 0.7 a 0.3 b --split 6,2,2 --seq-length 4")
    config = dataset_args.core_gpt_dataset_config_from_args(args, TOKENIZER)
    assert config.blend == (["a", "b"], [0.7, 0.3]) and config.blend_per_split is None
    assert config.split_matrix == [(0, 0.6), (0.6, 0.8), (0.8, 1.0)]
    assert config.random_seed == 1234 and config.sequence_length == 4 and not config.mock


def test_every_plain_field_is_copied_from_its_flag():
    args = dataset_args.parse_args(COMMANDS[1], world_size=4)
    config = dataset_args.core_gpt_dataset_config_from_args(args, TOKENIZER)
    for field, attr in dataset_args.CONFIG_FROM_ARGS.items():
        if attr is not None:
            assert getattr(config, field) == getattr(args, attr), field
    assert config.sequence_parallel_size == 2 and config.data_parallel_size == 2
    assert config.create_attention_mask is False and config.path_to_cache == "/c"


def test_per_split_paths_become_blend_per_split():
    args = dataset_args.parse_args(COMMANDS[2])
    blend, per_split = dataset_args.get_blend_and_blend_per_split(args)
    assert blend is None
    assert per_split == [(["/d/a", "/d/b"], [30.0, 70.0]), (["/d/v"], None), (["/d/t"], None)]


def test_split_sizes_follow_the_formula():
    with pytest.raises(AssertionError):  # --train-samples alone leaves validation unscheduled
        dataset_args.get_train_valid_test_num_samples(dataset_args.parse_args(COMMANDS[1]))
    args = dataset_args.parse_args(COMMANDS[0])
    # train 4 iterations x 4; valid (4 // 2 + 1) evaluations x 1 iteration x 4; test 1 x 4
    assert dataset_args.get_train_valid_test_num_samples(args) == (16, 12, 4)
    args = dataset_args.parse_args(COMMANDS[3])
    assert dataset_args.get_train_valid_test_num_samples(args) == (12, None, 400)
    # (8 // 2 + 1) evaluations less the 4 // 2 before --start-eval-at-iter, at the eval batch 2
    args = dataset_args.parse_args(COMMANDS[4])
    assert dataset_args.get_train_valid_test_num_samples(args) == (32, 6, 2)


# ---------------------------------------------------------------- against the tag


def _src(request) -> Path:
    value = request.config.getoption("megatron_src", default=None) or os.environ.get("MEGATRON_SRC")
    if not value:
        pytest.skip("pass --megatron-src PATH (a checkout of core_v0.19.0) to compare with Megatron-LM")
    return Path(value)


def _load_function(src: Path, path: str, name: str, namespace: dict):
    text = (src / path).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(namespace)
    exec(compile(ast.get_source_segment(text, node), f"{path}::{name}", "exec"), scope)
    return scope[name]


@pytest.fixture(scope="module")
def real_parser():
    """Megatron-LM's full argument parser, from the installed ``megatron.training``."""
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


def test_flags_have_megatrons_names_and_defaults(real_parser):
    real = {a.dest: a for a in real_parser._actions}
    for action in dataset_args.parser()._actions:
        if action.dest == "help":
            continue
        theirs = real[action.dest]
        assert action.option_strings == theirs.option_strings, action.dest
        assert (action.default, action.type, action.nargs, type(action)) == (
            theirs.default,
            theirs.type,
            theirs.nargs,
            type(theirs),
        ), action.dest


def _real_dict_literal(src: Path) -> list[tuple[str, str]]:
    text = (src / "pretrain_gpt.py").read_text()
    fn = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef) and n.name == "core_gpt_dataset_config_from_args"
    )
    literal = next(
        n.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "data_args"
    )
    return [(k.value, ast.unparse(v)) for k, v in zip(literal.keys, literal.values)]


def test_field_mapping_is_the_dict_literal_of_pretrain_gpt(request):
    real = _real_dict_literal(_src(request))
    assert [k for k, _ in real] == list(dataset_args.CONFIG_FROM_ARGS)
    for field, expression in real:
        attr = dataset_args.CONFIG_FROM_ARGS[field]
        if attr is None:
            assert not expression.startswith("args.") or "*" in expression, field
        else:
            assert expression == f"args.{attr}", field


def _real_config_function(src: Path):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return _load_function(
        src,
        "pretrain_gpt.py",
        "core_gpt_dataset_config_from_args",
        dict(
            get_blend_and_blend_per_split=dataset_args.get_blend_and_blend_per_split,
            build_tokenizer=lambda args: TOKENIZER,
            GPTDatasetConfig=GPTDatasetConfig,
            json=json,
        ),
    )


def _real_args(real_parser, command, ours):
    real_args = real_parser.parse_args(command.split())
    real_args.data_parallel_size = ours.data_parallel_size  # validate_args' job
    real_args.eval_global_batch_size = ours.eval_global_batch_size  # also validate_args'
    return real_args


@pytest.mark.parametrize("command", COMMANDS)
def test_same_sizes_as_megatron(command, real_parser):
    ours = dataset_args.parse_args(command, world_size=8)
    real_args = _real_args(real_parser, command, ours)
    real_sizes = _load_function(
        installed_root(),
        "megatron/training/training.py",
        "get_train_valid_test_num_samples",
        dict(get_args=lambda: real_args),
    )
    assert _outcome(real_sizes) == _outcome(dataset_args.get_train_valid_test_num_samples, ours)


@pytest.mark.parametrize("command", COMMANDS)
def test_same_config_as_megatron(command, real_parser, request):
    real_config = _real_config_function(_src(request))
    ours = dataset_args.parse_args(command, world_size=8)
    real_args = _real_args(real_parser, command, ours)
    assert real_config(real_args) == dataset_args.core_gpt_dataset_config_from_args(ours, TOKENIZER)


def _outcome(fn, *args):
    try:
        return tuple(fn(*args))
    except Exception as err:  # the same failure counts as the same outcome
        return type(err).__name__
