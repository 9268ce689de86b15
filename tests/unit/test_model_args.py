"""snippets.config.model_args restates how Megatron-LM turns TransformerConfig fields into command-line
flags and back. Every field is compared with what the real ``ArgumentGroupFactory`` generates, using
the real exclusion list (both in the installed ``megatron.training`` since core 0.19)."""

from __future__ import annotations

import argparse
import ast
import inspect

from snippets.config import model_args


def _real_exclude_list() -> set[str]:
    from megatron.training import arguments

    tree = ast.parse(inspect.getsource(arguments._add_network_size_args))
    fn = tree.body[0]
    assign = next(n for n in fn.body if isinstance(n, ast.Assign) and n.targets[0].id == "exclude")
    return set(ast.literal_eval(assign.value))


def test_exclusion_list_is_megatrons():
    assert model_args.EXCLUDED == _real_exclude_list()


def test_every_field_gets_the_flags_megatron_generates():
    from megatron.core.transformer import TransformerConfig
    from megatron.training.argument_utils import ArgumentGroupFactory

    parser = argparse.ArgumentParser()
    ArgumentGroupFactory(TransformerConfig, exclude=sorted(model_args.EXCLUDED)).build_group(parser)
    real = {a.dest: list(a.option_strings) for a in parser._actions if a.option_strings and a.dest != "help"}
    ours = {name: model_args.cli_flags(f) for name, f in model_args.transformer_config_fields().items()}
    assert {k: v for k, v in ours.items() if v} == real


def test_overrides_are_the_assignments_of_core_transformer_config_from_args():
    from megatron.training.argument_utils import core_transformer_config_from_args

    tree = ast.parse(inspect.getsource(core_transformer_config_from_args))
    assigned = {
        n.targets[0].slice.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Subscript)
        and getattr(n.targets[0].value, "id", None) == "kw_args"
        and isinstance(n.targets[0].slice, ast.Constant)  # not the by-name copy, kw_args[f.name]
    }
    # scaled_init_method is not a field; Kitchen's quantization fields need the Kitchen library
    assigned -= {"scaled_init_method", "use_kitchen", "quant_recipe"}
    assigned -= {"use_kitchen_attention", "kitchen_attention_backend"}
    assert assigned == set(model_args.OVERRIDES)


def test_overrides_name_real_fields():
    fields = model_args.transformer_config_fields()
    assert set(model_args.OVERRIDES) <= set(fields)
    assert model_args.cli_flags(fields["hidden_size"]) == ["--hidden-size"]
    assert model_args.cli_flags(fields["add_bias_linear"]) == ["--disable-bias-linear"]
    assert model_args.cli_flags(fields["activation_func"]) == []
