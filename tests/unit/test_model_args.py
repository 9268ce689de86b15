"""snippets.config.model_args restates how Megatron-LM turns TransformerConfig fields into command-line
flags and back. With a checkout of the tag (``--megatron-src`` / ``MEGATRON_SRC``) every field is
compared with what the real ``ArgumentGroupFactory`` generates, using the real exclusion list."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from pathlib import Path

import pytest

from snippets.config import model_args


def _src(request) -> Path:
    value = request.config.getoption("megatron_src", default=None) or os.environ.get("MEGATRON_SRC")
    if not value:
        pytest.skip("pass --megatron-src PATH (a checkout of core_v0.16.1) to compare with Megatron-LM")
    return Path(value)


def _real_exclude_list(src: Path) -> set[str]:
    tree = ast.parse((src / "megatron/training/arguments.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_add_network_size_args")
    assign = next(n for n in fn.body if isinstance(n, ast.Assign) and n.targets[0].id == "exclude")
    return set(ast.literal_eval(assign.value))


def test_exclusion_list_is_megatrons(request):
    assert model_args.EXCLUDED == _real_exclude_list(_src(request))


def test_every_field_gets_the_flags_megatron_generates(request):
    src = _src(request)
    spec = importlib.util.spec_from_file_location(
        "argument_utils", src / "megatron/training/argument_utils.py"
    )
    argument_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(argument_utils)  # standard library only

    from megatron.core.transformer import TransformerConfig

    parser = argparse.ArgumentParser()
    argument_utils.ArgumentGroupFactory(TransformerConfig, exclude=sorted(model_args.EXCLUDED)).build_group(
        parser
    )
    real = {a.dest: list(a.option_strings) for a in parser._actions if a.option_strings and a.dest != "help"}
    ours = {name: model_args.cli_flags(f) for name, f in model_args.transformer_config_fields().items()}
    assert {k: v for k, v in ours.items() if v} == real


def test_overrides_name_real_fields():
    fields = model_args.transformer_config_fields()
    assert set(model_args.OVERRIDES) <= set(fields)
    assert model_args.cli_flags(fields["hidden_size"]) == ["--hidden-size"]
    assert model_args.cli_flags(fields["add_bias_linear"]) == ["--disable-bias-linear"]
    assert model_args.cli_flags(fields["activation_func"]) == []
