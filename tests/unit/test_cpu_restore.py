"""The CPU layer's "while this one Megatron call runs" helper puts back exactly what it replaced:
torch's own attribute, or a shadow somebody else had set (no ranks; real methods in
tests/ranks/test_cpu_foreign_shadows.py)."""

import ast
from pathlib import Path

import pytest
import torch

from snippets.cpu.base import replace_once, tensor_attr, tensor_attr_while

ROOT = Path(__file__).resolve().parents[2]


def _ours(self, *args, **kwargs):
    return "ours"


def _foreign(self, *args, **kwargs):
    return "foreign"


@pytest.fixture
def clean_tensor():
    saved = {name: vars(torch.Tensor).get(name) for name in ("cuda", "type")}
    yield
    for name, value in saved.items():
        if value is None:
            if name in vars(torch.Tensor):
                delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, value)


def _seen_during(name):
    return getattr(torch.zeros(1), name)()


def test_without_a_shadow_torch_own_method_comes_back(clean_tensor):
    wrapped = tensor_attr_while("cuda", _ours)(_seen_during)
    assert wrapped("cuda") == "ours"
    assert "cuda" not in vars(torch.Tensor)
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_a_foreign_shadow_is_put_back_intact(clean_tensor):
    torch.Tensor.cuda = _foreign
    torch.Tensor.type = _foreign
    assert tensor_attr_while("cuda", _ours)(_seen_during)("cuda") == "ours"
    assert tensor_attr_while("type", _ours)(_seen_during)("type") == "ours"
    assert vars(torch.Tensor)["cuda"] is _foreign and vars(torch.Tensor)["type"] is _foreign


def test_nested_calls_unwind_in_order_even_after_an_error(clean_tensor):
    torch.Tensor.type = _foreign
    seen = []

    def inner():
        seen.append(torch.zeros(1).type())
        raise KeyError("inside")

    def outer():
        with tensor_attr("type", lambda self, *a, **k: "outer"):
            seen.append(torch.zeros(1).type())
            with pytest.raises(KeyError):
                tensor_attr_while("type", _ours)(inner)()
            seen.append(torch.zeros(1).type())

    outer()
    assert seen == ["outer", "ours", "outer"]
    assert vars(torch.Tensor)["type"] is _foreign


def test_replace_once_wraps_once_and_keeps_the_kind():
    class Owner:
        def method(self):
            return 1

        @classmethod
        def klass(cls):
            return cls.__name__

        @staticmethod
        def static():
            return 3

    def plus_ten(fn):
        return lambda *a: fn(*a) + 10 if not isinstance(fn(*a), str) else fn(*a) + "!"

    for name in ("method", "klass", "static"):
        first = replace_once(Owner, name, plus_ten)
        assert replace_once(Owner, name, plus_ten) is first  # a second apply changes nothing
    assert (Owner().method(), Owner.klass(), Owner.static()) == (11, "Owner!", 13)
    assert isinstance(vars(Owner)["klass"], classmethod) and isinstance(vars(Owner)["static"], staticmethod)


def test_only_the_helper_removes_a_tensor_attribute():
    # Every time-scoped patch goes through tensor_attr; none deletes torch.Tensor attributes itself.
    for path in (ROOT / "snippets" / "cpu").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            deleting = isinstance(node, ast.Delete) or (
                isinstance(node, ast.Call) and getattr(node.func, "id", None) == "delattr"
            )
            if deleting and path.name != "base.py":
                raise AssertionError(f"{path.name}:{node.lineno} deletes an attribute")
            if isinstance(node, ast.Assign) and path.name != "base.py":
                for target in node.targets:
                    assert ast.unparse(target).split(".")[:2] != ["torch", "Tensor"], (
                        f"{path.name}:{node.lineno} sets a torch.Tensor attribute outside tensor_attr"
                    )
