"""The phase column says what step of training issued a collective, from the Megatron code on the stack."""

import pytest
import torch

from snippets.record.recorder import phase_of


def issued_from(path: str) -> str:
    """phase_of() called from code whose file is ``path`` (as a Megatron frame would be)."""
    return eval(compile("phase_of()", path, "eval"), {"phase_of": phase_of})


@pytest.mark.parametrize(
    "path, phase",
    [
        ("/venv/megatron/core/optimizer/distrib_optimizer.py", "optimizer step"),
        ("/venv/megatron/core/optimizer/clip_grads.py", "optimizer step"),
        ("/venv/megatron/core/distributed/finalize_model_grads.py", "grad sync"),
        ("/venv/megatron/core/resharding/refit.py", "refit"),
        ("/venv/megatron/core/dist_checkpointing/serialization.py", "checkpoint"),
        ("/venv/megatron/training/checkpointing.py", "checkpoint"),
        ("/venv/megatron/core/parallel_state.py", "setup"),
        ("/venv/megatron/core/datasets/blended_megatron_dataset_builder.py", "setup"),
        ("/venv/megatron/core/tensor_parallel/mappings.py", "forward"),
    ],
)
def test_phase_follows_the_issuing_megatron_code(path, phase):
    assert issued_from(path) == phase


def test_a_model_under_construction_is_setup():
    """PP > 1 with tied embeddings: the constructor's all-reduce that copies the first stage's word
    embeddings into the last stage's output layer (note 19) is setup, named by its function."""
    path = "/venv/megatron/core/models/common/language_module/language_module.py"
    scope = {"issued_from": issued_from, "path": path}
    code = "def setup_embeddings_and_output_layer():\n    return issued_from(path)\n"
    exec(compile(code, path, "exec"), scope)
    assert scope["setup_embeddings_and_output_layer"]() == "setup"
    assert issued_from(path) == "forward"  # the same file's loss, outside that function


def test_inside_autograd_backward_it_is_backward():
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(phase_of())
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(issued_from("/venv/megatron/core/optimizer/x.py"))  # autograd wins
            return g * 2

    x = torch.ones(2, requires_grad=True)
    Probe.apply(x).sum().backward()
    assert seen == ["forward", "backward"]


def test_optimizer_code_under_its_checkpoint_entry_is_checkpoint():
    """fully_reshardable's gathers run in the optimizer's code, but under its ``sharded_state_dict``
    (and dp_zero's scatter under ``load_state_dict``): a checkpoint, not an optimizer step."""
    inner = "/venv/megatron/core/optimizer/distrib_optimizer.py"

    def under(entry: str) -> str:
        scope = {"issued_from": issued_from, "inner": inner}
        exec(compile(f"def {entry}():\n    return issued_from(inner)\n", inner, "exec"), scope)
        return scope[entry]()

    assert under("sharded_state_dict") == "checkpoint"
    assert under("load_state_dict") == "checkpoint"
    assert under("step") == "optimizer step"


@pytest.mark.parametrize(
    "method, phase",
    [
        ("recv_forward", "forward"),
        ("send_forward", "forward"),
        ("recv_backward", "backward"),
        ("send_backward", "backward"),
        ("send_backward_recv_backward", "backward"),
        ("send_forward_recv_backward", "forward + backward"),
        ("send_backward_recv_forward", "forward + backward"),
    ],
)
def test_a_schedules_p2p_is_named_by_what_it_moves(method, phase):
    """The schedule calls P2PCommunicator outside autograd, after backward_step returned: a sent
    gradient is backward traffic although no autograd node runs."""
    path = "/venv/megatron/core/pipeline_parallel/p2p_communication.py"
    scope = {"issued_from": issued_from, "path": path}
    exec(compile(f"def {method}():\n    return issued_from(path)\n", path, "exec"), scope)
    assert scope[method]() == phase
    other = "/venv/megatron/core/pipeline_parallel/bridge_communicator.py"  # same name, other file
    scope["path"] = other
    exec(compile(f"def {method}():\n    return issued_from(path)\n", other, "exec"), scope)
    assert scope[method]() == "forward"
