"""Each of the five time-scoped patches (``Tensor.type`` / ``Tensor.cuda`` while one Megatron call
runs), run for real on a CPU rank over a foreign shadow: the shadow is intact afterwards."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _foreign_cuda(self, *args, **kwargs):
    return torch._C.TensorBase.cuda(self, *args, **kwargs)


def _foreign_type(self, *args, **kwargs):
    return torch._C.TensorBase.type(self, *args, **kwargs)


def _every_time_scoped_patch_over_foreign_shadows():
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
    from megatron.core.transformer import TransformerConfig

    from snippets.models.tiny_gpt import SEQ, VOCAB, tiny_config

    ps.initialize_model_parallel()
    torch.Tensor.cuda = _foreign_cuda
    torch.Tensor.type = _foreign_type
    intact = {}

    def check(what):
        intact[what] = (
            vars(torch.Tensor)["cuda"] is _foreign_cuda and vars(torch.Tensor)["type"] is _foreign_type
        )

    GPTModel(tiny_config(num_layers=1), get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    check("LanguageModule.setup_embeddings_and_output_layer")
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, bf16=True)
    for distributed in (True, False):
        module = torch.nn.Linear(4, 4).to(torch.bfloat16)
        ddp = DistributedDataParallel(
            config, DistributedDataParallelConfig(use_distributed_optimizer=distributed), module
        )
        opt = get_megatron_optimizer(
            OptimizerConfig(lr=0.1, bf16=True, clip_grad=1.0, use_distributed_optimizer=distributed), [ddp]
        )
        inner = opt.chained_optimizers[0]
        check(type(inner).__name__ + ".__init__")  # the distributed one runs _build_model_... inside
        if distributed:
            inner._init_optimizer_states_with_dummy_values()
            inner.get_parameter_state_dp_zero(use_gloo_comm=False)
            check("DistributedOptimizer.get_parameter_state_dp_zero")
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=3.0)
    check("clip_grad_by_total_norm_fp32")
    return intact, param.grad.tolist()


def test_time_scoped_patches_put_a_foreign_shadow_back():
    ((intact, clipped),) = run_ranks(_every_time_scoped_patch_over_foreign_shadows, 1)
    assert list(intact) == [
        "LanguageModule.setup_embeddings_and_output_layer",
        "DistributedOptimizer.__init__",
        "DistributedOptimizer.get_parameter_state_dp_zero",
        "Float16OptimizerWithFloat16Params.__init__",
        "clip_grad_by_total_norm_fp32",
    ]
    assert all(intact.values()), intact
    assert clipped == pytest.approx([1 / 3] * 3, rel=1e-5)  # the patched function really ran
