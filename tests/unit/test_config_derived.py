"""snippets.config.config_derived: which fields TransformerConfig.__post_init__ derives (checked on the
real config against the formulas it is documented to use), the stable text of config values, and
the command line's own ffn default -- against the expression in ``validate_args`` itself (in the
installed ``megatron.training`` since core 0.19)."""

from __future__ import annotations

import ast
import functools
import types

import pytest
import torch

from snippets.config.config_derived import cli_default_ffn_hidden_size, describe, post_init_changes
from snippets.site.sources import installed_root


def _config_cls():
    from megatron.core.transformer import TransformerConfig

    from snippets.config import spec_diff  # noqa: F401 - quiets the known warnings

    return TransformerConfig


def test_post_init_fills_the_none_fields_by_their_formulas():
    changes = {
        c["name"]: c
        for c in post_init_changes(
            _config_cls(), num_layers=2, hidden_size=64, num_attention_heads=8, tensor_model_parallel_size=2
        )
    }
    assert changes["ffn_hidden_size"]["given"] is None and changes["ffn_hidden_size"]["final"] == 4 * 64
    assert changes["kv_channels"]["final"] == 64 // 8
    assert changes["num_query_groups"]["final"] == 8
    assert changes["expert_tensor_parallel_size"]["final"] == 2  # follows TP
    assert changes["output_layer_init_method"]["final"].keywords["std"] == pytest.approx(0.02 / 2)
    assert "hidden_size" not in changes and "num_layers" not in changes


def test_a_field_given_explicitly_is_not_a_change():
    changes = {
        c["name"]
        for c in post_init_changes(
            _config_cls(),
            num_layers=1,
            hidden_size=16,
            num_attention_heads=4,
            ffn_hidden_size=40,
            kv_channels=3,
        )
    }
    assert "ffn_hidden_size" not in changes and "kv_channels" not in changes
    assert "num_query_groups" in changes


def test_post_init_errors_propagate():
    with pytest.raises(ValueError, match="must be a multiple of tensor_model_parallel_size"):
        post_init_changes(
            _config_cls(), num_layers=1, hidden_size=16, num_attention_heads=6, tensor_model_parallel_size=4
        )


def test_describe_is_stable_text():
    assert (
        describe(functools.partial(torch.nn.init.normal_, mean=0.0, std=0.02))
        == "normal_(mean=0.0, std=0.02)"
    )
    assert describe(torch.nn.functional.silu) == "silu"
    assert describe(torch.bfloat16) == "torch.bfloat16"
    assert describe(None) == "None" and describe([1]) == "[1]"
    assert "0x" not in describe(functools.partial(torch.nn.init.normal_, std=0.1))


def test_cli_default_ffn_by_hand():
    assert cli_default_ffn_hidden_size(4096, swiglu=True) == 10880  # 170 · 64
    assert cli_default_ffn_hidden_size(64, swiglu=True) == 128
    assert cli_default_ffn_hidden_size(16, swiglu=True) == 0  # 42.7 rounds down to 0
    assert cli_default_ffn_hidden_size(4096, swiglu=False) == 16384


def _validate_args_ffn_expressions():
    """The two right-hand sides of ``args.ffn_hidden_size = ...`` under ``if args.swiglu`` in
    ``validate_args`` (swiglu branch, else branch), from the installed ``megatron.training``."""
    tree = ast.parse((installed_root() / "megatron/training/arguments.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "validate_args")
    block = next(
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "args.ffn_hidden_size is None"
    )
    inner = block.body[0]
    assert isinstance(inner, ast.If) and ast.unparse(inner.test) == "args.swiglu"
    return inner.body[-1].value, inner.orelse[-1].value


def test_cli_default_ffn_equals_validate_args():
    swiglu_expr, plain_expr = _validate_args_ffn_expressions()
    for hidden in (16, 64, 96, 1000, 4096, 5120, 8192):
        args = types.SimpleNamespace(hidden_size=hidden)
        for expr, swiglu in ((swiglu_expr, True), (plain_expr, False)):
            real = eval(compile(ast.Expression(expr), "validate_args", "eval"), {"int": int}, {"args": args})
            assert cli_default_ffn_hidden_size(hidden, swiglu) == real, (hidden, swiglu)
