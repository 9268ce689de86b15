"""snippets.data.dataset_args restates how pretrain_gpt.py turns flags into a GPTDatasetConfig and the
three split sizes. Without a checkout these tests check the restatement against what it must
produce; with one (``--megatron-src`` / ``MEGATRON_SRC``) they compare it with Megatron-LM's own
parser, its dict literal and its three functions, run on the same ``args``."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest

from snippets.data import dataset_args

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
]


def _tokenizer():
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=31)


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


# ---------------------------------------------------------------- against the tag


def _src(request) -> Path:
    value = request.config.getoption("megatron_src", default=None) or os.environ.get("MEGATRON_SRC")
    if not value:
        pytest.skip("pass --megatron-src PATH (a checkout of core_v0.16.1) to compare with Megatron-LM")
    return Path(value)


def _load_function(src: Path, path: str, name: str, namespace: dict):
    text = (src / path).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(namespace)
    exec(compile(ast.get_source_segment(text, node), f"{path}::{name}", "exec"), scope)
    return scope[name]


@pytest.fixture(scope="module")
def real_parser(request):
    """Megatron-LM's full argument parser, with the four helpers arguments.py imports stubbed."""
    src = _src(request)
    before = set(sys.modules)
    stub_utils = types.ModuleType("megatron.training.utils")
    for name in ("get_device_arch_version", "update_use_dist_ckpt", "print_rank_0", "warn_rank_0"):
        setattr(stub_utils, name, lambda *a, **k: None)
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(src / "megatron" / "training")]  # argument_utils.py comes from there
    saved = {k: sys.modules.get(k) for k in ("megatron.training", "megatron.training.utils")}
    sys.modules.update({"megatron.training": package, "megatron.training.utils": stub_utils})
    try:
        spec = importlib.util.spec_from_file_location(
            "_megatron_arguments", src / "megatron/training/arguments.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        parser = module.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    finally:
        for key in set(sys.modules) - before:
            if key.startswith("megatron.training") or key == "_megatron_arguments":
                del sys.modules[key]
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return parser


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


def _real_functions(src: Path):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    blend = _load_function(
        src,
        "megatron/training/utils.py",
        "get_blend_and_blend_per_split",
        dict(get_blend_from_list=get_blend_from_list, open_file=open, json=json),
    )
    config = _load_function(
        src,
        "pretrain_gpt.py",
        "core_gpt_dataset_config_from_args",
        dict(
            get_blend_and_blend_per_split=blend,
            build_tokenizer=lambda args: TOKENIZER,
            get_tokenizer=lambda: TOKENIZER,
            GPTDatasetConfig=GPTDatasetConfig,
            json=json,
        ),
    )
    return blend, config


@pytest.mark.parametrize("command", COMMANDS)
def test_same_config_and_sizes_as_megatron(command, real_parser, request):
    src = _src(request)
    real_blend, real_config = _real_functions(src)
    real_args = real_parser.parse_args(command.split())
    ours = dataset_args.parse_args(command, world_size=8)
    real_args.data_parallel_size = ours.data_parallel_size  # validate_args' job
    assert real_blend(real_args) == dataset_args.get_blend_and_blend_per_split(ours)
    assert real_config(real_args) == dataset_args.core_gpt_dataset_config_from_args(ours, TOKENIZER)
    real_sizes = _load_function(
        src,
        "megatron/training/training.py",
        "get_train_valid_test_num_samples",
        dict(get_args=lambda: real_args),
    )
    assert _outcome(real_sizes) == _outcome(dataset_args.get_train_valid_test_num_samples, ours)


def _outcome(fn, *args):
    try:
        return tuple(fn(*args))
    except Exception as err:  # the same failure counts as the same outcome
        return type(err).__name__
