"""Note 02's experiment: which ranks ``initialize_model_parallel`` puts in each group, and what the
gloo groups it makes beside them are for.

On a real node this is the first thing to look at: with ``--tp 2 --pp 4`` on 8 GPUs, which GPUs
talk in a TP all-reduce, which pass activations between pipeline stages, which average gradients.
``run`` calls the real ``parallel_state.initialize_model_parallel`` with the parallel sizes and
reads every group back through Megatron's own getters (:func:`snippets.ranks.groups.describe_rank`);
``tables`` prints note 02's per-rank table and seed 000's group summary.

The gloo groups (``DATA_PARALLEL_GROUP_GLOO`` and its CP / expert siblings) have one user: the
distributed optimizer, when it gathers every DP rank's shard of the optimizer state into the CPU
memory of DP rank 0 (the legacy checkpoint's ``save_parameter_state``) and scatters it back
(``load_parameter_state``). :func:`gpt_with_distributed_optimizer` builds the model and optimizer
for that and :func:`train_one_step` gives Adam's moments values; note 02's cell records the save
and the load. ``GLOO_MODEL`` is that model's size (the ``groups`` experiment itself has no model).
"""

from __future__ import annotations

from snippets.models.presets import Dims
from snippets.ranks.groups import describe_rank, group_summary, rank_table, unique_groups

GLOO_MODEL = Dims(
    "tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32, layers=2, seq=8,
    micro_batch_size=2, microbatches=2,
)  # fmt: skip
"""The small GPT of note 02's gloo run: 2 layers, hidden 16, vocab 32, 2 micro-batches of 2 x 8 tokens."""


def run(dims, par) -> dict:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        expert_model_parallel_size=par.ep,
    )
    return describe_rank()


def gpt_with_distributed_optimizer(dims, tp: int):
    """This rank's ``GPTModel`` (local spec, TP = ``tp``) in Megatron's DDP, and
    ``get_megatron_optimizer`` with ``use_distributed_optimizer=True``; call after
    ``initialize_model_parallel``."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from snippets.experiments.n13_pipeline import pipeline_config

    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    config = pipeline_config(dims, pp=1, tp=tp)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=dims.vocab, max_sequence_length=dims.seq)
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True), [ddp]
    )
    return ddp, optimizer


def train_one_step(dims, ddp, optimizer) -> None:
    """One step on this DP rank's micro-batches (schedule, ``finalize_model_grads``, ``step``), so the
    optimizer state holds values: the fp32 weights and Adam's two moments."""
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.models.tiny_gpt import forward_step

    seed = parallel_state.get_data_parallel_rank()  # each DP rank its own data
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(microbatches(dims, dims.microbatches, seed=seed)),
        model=[ddp],
        num_microbatches=dims.microbatches,
        seq_length=dims.seq,
        micro_batch_size=dims.micro_batch_size,
    )
    finalize_model_grads([ddp])
    optimizer.step()


def kinds_for(par) -> tuple[str, ...]:
    """The group kinds worth a column: note 02's without context parallelism, its CP table's with."""
    kinds = ("tp", "cp", "dp", "dp-cp") if par.cp > 1 else ("tp", "pp", "dp", "tp-pp", "embd", "pos-embd")
    return kinds + (("ep", "etp", "edp") if par.ep > 1 else ())


def tables(results: list, dims, par) -> list:
    kinds = kinds_for(par)
    summary = [
        k
        for k in ("tp", "pp", "dp", "cp", "tp-pp", "embd", "dp-cp", "ep", "etp", "edp")
        if k in kinds or k in ("tp", "pp", "dp", "cp", "tp-pp", "embd")
    ]
    return [
        rank_table(results, kinds=kinds),
        group_summary({kind: unique_groups(results, kind) for kind in summary}),
    ]


def folded(summary: str, *tables):
    """``tables`` (or lines of text) behind a closed ``<details>``: reference the picture already shows."""
    from IPython.display import Markdown

    body = "\n\n".join(t if isinstance(t, str) else t.markdown() for t in tables)
    return Markdown(f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>")
