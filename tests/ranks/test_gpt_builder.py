"""Note 04 says its ``build_gpt`` makes the model the formal entry makes: at core 0.19
``pretrain_gpt.py`` builds through ``GPTModelConfig`` and ``GPTModelBuilder.build_model``
(megatron/training/models/gpt.py, in the pip package). Same seed, same ranks: the same parameters."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _both(dims, tp):
    from megatron.core import parallel_state as mpu
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.training.models.gpt import GPTModelBuilder, GPTModelConfig

    from snippets.experiments.n04_gpt_model import build_gpt

    ours, _ = build_gpt(dims, tp)
    ours = {n: p.detach().clone() for n, p in ours.named_parameters()}
    mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        transformer_impl="local",  # the entry's default is TE; this machine has none
    )
    model_config = GPTModelConfig(  # what gpt_config_from_args makes of the matching flags
        transformer=config,
        vocab_size=dims.vocab,
        should_pad_vocab=False,
        seq_length=dims.seq,
        share_embeddings_and_output_weights=True,
        position_embedding_type="rope" if dims.rope else "learned_absolute",
    )
    theirs = GPTModelBuilder(model_config).build_model(ProcessGroupCollection.use_mpu_process_groups())
    return ours, {n: p.detach().clone() for n, p in theirs.named_parameters()}


def test_build_gpt_is_what_gpt_model_builder_builds():
    from snippets.experiments import EXPERIMENTS

    for ours, theirs in run_ranks(_both, 2, EXPERIMENTS["gpt-model"].tiny, 2):
        assert list(ours) == list(theirs)
        assert all(torch.equal(ours[n], theirs[n]) for n in ours)
