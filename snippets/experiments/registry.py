"""Every experiment the runner knows, with what it needs -- importable without torch.

Each experiment is a module ``snippets.experiments.nNN_<name>`` with two functions:

* ``run(dims, par)`` -- runs on **every rank**, after ``torch.distributed`` is up (by
  :func:`snippets.ranks.launch.run_ranks` in a note, by :mod:`snippets.run` in a job). It builds the
  real Megatron objects at ``dims`` (a :class:`snippets.models.presets.Dims`) and parallel sizes
  ``par`` (a :class:`Parallel`) and returns a small, picklable summary of this rank;
* ``tables(results, dims, par)`` -- turns the list of every rank's summary into what the note
  prints: strings and :class:`snippets.record.tables.Table` objects.

:data:`EXPERIMENTS` lists them with the note each comes from, the note's own sizes (``tiny``), the
parallel sizes each one reads, what its sizes must satisfy (:mod:`snippets.experiments.checks`) and
how much memory a rank needs (:mod:`snippets.experiments.needs`), so the runner can refuse a job
before it starts anything. The parallel sizes themselves are checked by :class:`Parallel`
(:class:`snippets.ranks.parallel_dims.ParallelDims`).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Callable

from snippets.experiments import checks, needs
from snippets.models import presets
from snippets.models.memory_estimate import Estimate
from snippets.models.presets import Dims
from snippets.ranks.parallel_dims import FLAGS as PARALLEL_FLAGS
from snippets.ranks.parallel_dims import ParallelDims

Parallel = ParallelDims
"""The parallel sizes an experiment runs at (the name the notes and experiments use)."""


@dataclass(frozen=True)
class Experiment:
    """One registered experiment: where it comes from and what it needs (torch-free)."""

    name: str
    note: str  # the note whose tables it prints, "NN_slug"
    what: str  # one line for ``--list``
    module: str  # holds run() and tables()
    tiny: Dims  # the sizes the note uses
    uses: tuple[str, ...]  # which of PARALLEL_FLAGS it reads
    estimate: Callable[[Dims, Parallel], Estimate]  # needs.<entry>
    checks: Callable[[Dims, Parallel], list[str]] = field(default=checks.only_parallel_sizes)
    example: str = ""  # extra arguments of a typical command
    unused: tuple[str, ...] = ()  # Dims fields it does not read (left out of headers)
    etp: int | None = None  # the expert tensor parallel size it fixes (None = tp)

    def functions(self):
        """``(run, tables)``, importing the module (and with it torch and Megatron) only now."""
        module = importlib.import_module(self.module)
        return module.run, module.tables


UNSET = {"tp": 1, "pp": 1, "vp": None, "cp": 1, "ep": 1, "sp": False}
"""Each flag's value when not given."""


def problems(exp: Experiment, dims: Dims, par: Parallel) -> list[str]:
    """Everything wrong with running ``exp`` at these sizes, as sentences (empty = fine): the
    parallel sizes first (:meth:`ParallelDims.problems`), the flags it does not read, then, if
    those are fine, what its model sizes must satisfy."""
    if exp.etp is not None and par.etp is None:
        par = dataclasses.replace(par, etp=exp.etp)
    unused = [flag for flag in PARALLEL_FLAGS if flag not in exp.uses and getattr(par, flag) != UNSET[flag]]
    # the sizes it reads, checked as a whole; a flag it does not read is only reported as such
    read = dataclasses.replace(par, **{flag: UNSET[flag] for flag in unused})
    out = read.problems() + [
        f"{exp.name} does not use --{'sequence-parallel' if flag == 'sp' else flag}"
        f" (it reads: {', '.join(exp.uses) or 'no parallel sizes'})"
        for flag in unused
    ]
    if not unused and read.world % read.model_ranks == 0:  # the grid exists: its model sizes next
        out += exp.checks(dims, par)
    return out


QWEN3_STYLE = dict(swiglu=True, rmsnorm=True, qk_norm=True, bias=False, rope=False)
NOTE_07_GPT = Dims(
    "tiny",
    hidden=16,
    heads=4,
    query_groups=4,
    kv_channels=4,
    ffn=32,
    vocab=32,
    layers=2,
    seq=8,
    micro_batch_size=2,
    microbatches=1,
    bias=False,
)
"""Notes 07 and 21's GPT: ``snippets.models.tiny_gpt.tiny_config`` with 2 layers and 4 heads."""
NO_MODEL = ("hidden", "heads", "query_groups", "kv_channels", "ffn", "layers")
NO_BATCH = ("micro_batch_size", "microbatches")

# The entries are a table: one block each, kept as written (not reflowed one argument per line).
# fmt: off
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment(
        name="overview", note="01_training_run_overview",
        what="Megatron's run_simple_mcore_train_loop.py line by line: 5 steps as published "
             "(torch Adam: the weights never move) and fixed (get_megatron_optimizer + "
             "zero_grad_buffer), each saving and reloading with dist_checkpointing",
        module="snippets.experiments.n01_overview",
        tiny=Dims("tiny", hidden=12, heads=4, query_groups=4, kv_channels=3, ffn=48, vocab=100,
                  layers=2, seq=64, micro_batch_size=8, microbatches=1),
        uses=("tp",), estimate=needs.overview, checks=checks.overview, example="--tp 2"),
    Experiment(
        name="groups", note="02_distributed_initialization",
        what="the real initialize_model_parallel: every rank's coordinates and the members of its "
             "TP / PP / DP / CP / EP groups (note 02's table, seed 000's summary)",
        module="snippets.experiments.n02_groups",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1, layers=1,
                  seq=1, micro_batch_size=1, microbatches=1),
        uses=("tp", "pp", "cp", "ep"), estimate=needs.groups_only, checks=checks.only_parallel_sizes,
        example="--tp 2 --pp 2", unused=presets.OVERRIDES),
    Experiment(
        name="batch-flow", note="03_data_and_batch_flow",
        what="a real GPTDataset from a .bin/.idx corpus through the builder and get_batch: which ranks "
             "build it, which read, every TP broadcast (per pipeline stage), the CP chunks each rank keeps",
        module="snippets.experiments.n03_batch_flow",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=32, layers=1,
                  seq=8, micro_batch_size=2, microbatches=2, bias=False),
        uses=("tp", "pp", "cp"), estimate=needs.batch_flow, checks=checks.batch_flow,
        example="--tp 2 --cp 2", unused=NO_MODEL),
    Experiment(
        name="gpt-model", note="04_model_provider_and_gpt_model",
        what="a real GPTModel as gpt_builder builds it (local spec, shared embeddings) under TP: every "
             "parameter's global and per-rank local shape, partition_dim / stride, equal to the TP=1 "
             "model's piece, parameters per rank",
        module="snippets.experiments.n04_gpt_model",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32, layers=1,
                  seq=8, micro_batch_size=1, microbatches=1, swiglu=True),
        uses=("tp",), estimate=needs.gpt_model, checks=checks.gpt_model, example="--tp 2",
        unused=NO_BATCH),
    Experiment(
        name="loss", note="05_forward_loss_backward",
        what="one forward+backward of a real GPTModel through get_forward_backward_func with "
             "pretrain_gpt's three-value loss_func: the reports, the logged lm loss, every TP collective",
        module="snippets.experiments.n05_loss",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32,
                  layers=1, seq=8, micro_batch_size=2, microbatches=2),
        uses=("tp",), estimate=needs.loss, checks=checks.loss, example="--tp 2"),
    Experiment(
        name="train-step", note="06_gradient_sync_and_optimizer",
        what="one whole training step of a real GPTModel in DDP with Megatron's Adam: schedule, "
             "finalize_model_grads (the DP all-reduce), optimizer.step() (norm, Adam), recorded",
        module="snippets.experiments.n06_train_step",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=needs.dist_optimizer, checks=checks.data_parallel),
    Experiment(
        name="checkpoint", note="07_checkpointing",
        what="a real GPTModel saved with dist_checkpointing at TP=--tp and loaded at TP=1 and "
             "TP=world size: sharded_state_dict entries, files, chunks, logits before/after, "
             "which saved chunks each loading rank reads",
        module="snippets.experiments.n07_checkpoint",
        tiny=NOTE_07_GPT, uses=("tp",), estimate=needs.checkpoint, checks=checks.checkpoint,
        example="--tp 2", unused=("microbatches",)),
    Experiment(
        name="rank-generator", note="08_parallel_state_and_rank_generator",
        what="the real initialize_model_parallel with experts (expert tp 1): every rank's decoder and "
             "expert coordinates and groups, each kind of group against RankGenerator.get_ranks",
        module="snippets.experiments.n08_rank_generator",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1, layers=1,
                  seq=1, micro_batch_size=1, microbatches=1),
        uses=("tp", "pp", "cp", "ep"), estimate=needs.groups_only, checks=checks.only_parallel_sizes,
        etp=checks.ETP, example="--tp 2 --pp 2 --ep 2", unused=presets.OVERRIDES),
    Experiment(
        name="mappings", note="09_tp_mappings",
        what="every function of tensor_parallel/mappings.py (f, g, scatter/gather, SP, all-to-all) "
             "forward and backward: the collective, its group and shapes, who issued it, and the "
             "conjugate pairs computed from the records",
        module="snippets.experiments.n09_mappings",
        tiny=Dims("tiny", hidden=6, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=needs.mappings, checks=checks.mappings, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "ffn", "vocab", "layers", "microbatches")),
    Experiment(
        name="linear", note="10_column_row_parallel_linear",
        what="ColumnParallelLinear(hidden, ffn) and RowParallelLinear(ffn, hidden) in six "
             "configurations (gather_output, input_is_parallel, SP): which rows/columns each rank "
             "holds, every collective, and our snippets.tp.tp_linear on the same weights",
        module="snippets.experiments.n10_linear",
        tiny=Dims("tiny", hidden=8, heads=1, query_groups=1, kv_channels=1, ffn=16, vocab=1,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=needs.linear, checks=checks.linear, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "vocab", "layers", "microbatches")),
    Experiment(
        name="tp-layer", note="11_transformer_layer",
        what="one TransformerLayer (local spec) forward+backward under TP, without and with "
             "sequence parallel: weights per rank, every collective and the submodule that issued it",
        module="snippets.experiments.n11_tp_layer",
        tiny=Dims("tiny", hidden=32, heads=8, query_groups=4, kv_channels=4, ffn=48, vocab=1,
                  layers=1, seq=8, micro_batch_size=2, microbatches=1, **QWEN3_STYLE),
        uses=("tp",), estimate=needs.tp_layer, checks=checks.tp_layer, example="--tp 2",
        unused=("vocab", "layers", "microbatches")),
    Experiment(
        name="vocab", note="12_vocab_parallel",
        what="VocabParallelEmbedding (all-reduce and reduce-scatter) and vocab_parallel_cross_entropy "
             "(plain, label smoothing, fused) on this rank's vocab slice: shapes and every collective",
        module="snippets.experiments.n12_vocab",
        tiny=Dims("tiny", hidden=6, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=16,
                  layers=1, seq=4, micro_batch_size=2, microbatches=1),
        uses=("tp",), estimate=needs.vocab, checks=checks.vocab, example="--tp 2",
        unused=("heads", "query_groups", "kv_channels", "ffn", "layers", "microbatches")),
    Experiment(
        name="pipeline", note="13_pipeline_schedules",
        what="a real GPTModel through Megatron's pipeline schedule (1F1B, or interleaved with --vp): "
             "stages, recorded order, warm-up/steady/cool-down, p2p calls, the bubble",
        module="snippets.experiments.n13_pipeline",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=8, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=("tp", "pp", "vp", "sp"), estimate=needs.pipeline, checks=checks.pipeline,
        example="--pp 4"),
    Experiment(
        name="ddp", note="14_data_parallel_ddp",
        what="a real GPTModel in Megatron's DistributedDataParallel, every rank data parallel: the grad "
             "buffer's buckets, and the all-reduces without overlap, and with overlap (step 1 in "
             "finalize, step 2 inside backward)",
        module="snippets.experiments.n14_ddp",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=needs.ddp, checks=checks.data_parallel),
    Experiment(
        name="dist-optimizer", note="15_distributed_optimizer",
        what="two Adam steps of a real GPTModel with get_megatron_optimizer, without and with "
             "use_distributed_optimizer: padded buffer, each rank's shard, reduce-scatter / all-gather "
             "against one all-reduce, bytes per parameter",
        module="snippets.experiments.n15_dist_optimizer",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=48, vocab=32,
                  layers=3, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=needs.dist_optimizer, checks=checks.data_parallel),
    Experiment(
        name="cp", note="16_context_parallel",
        what="the real get_batch_on_this_cp_rank (2*CP chunks, head and tail per rank) and ring "
             "attention over the CP group against one process's full causal attention: positions, "
             "equal outputs and gradients, every p2p step of the ring",
        module="snippets.experiments.n16_cp",
        tiny=Dims("tiny", hidden=8, heads=2, query_groups=2, kv_channels=4, ffn=1, vocab=1,
                  layers=1, seq=16, micro_batch_size=1, microbatches=1),
        uses=("cp",), estimate=needs.cp, checks=checks.cp, example="--cp 2",
        unused=("hidden", "ffn", "vocab", "layers", "microbatches")),
    Experiment(
        name="moe", note="17_moe_expert_parallel",
        what="a real MoELayer (TopKRouter, SequentialMLP, top-2, 2 experts per EP rank) under expert "
             "parallelism with the alltoall and allgather dispatchers: the expert groups, where each "
             "rank's tokens go, every collective with its split sizes, output equal to EP=1",
        module="snippets.experiments.n17_moe",
        tiny=Dims("tiny", hidden=8, heads=2, query_groups=2, kv_channels=4, ffn=16, vocab=1,
                  layers=1, seq=6, micro_batch_size=1, microbatches=4, bias=False),
        uses=("ep",), estimate=needs.moe, checks=checks.only_parallel_sizes, example="--ep 2",
        unused=("query_groups", "kv_channels", "vocab", "layers", "microbatches")),
    Experiment(
        name="data-topic", note="18_data_topic",
        what="resuming from consumed_train_samples: read 4 iterations, then rebuild dataset and sampler "
             "after 2 at every DP size the ranks can form (TP takes the rest): same global batches",
        module="snippets.experiments.n18_data_topic",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=32, layers=1,
                  seq=4, micro_batch_size=1, microbatches=2, bias=False),
        uses=("tp",), estimate=needs.data_topic, checks=checks.data_topic,
        example="--tp 2", unused=NO_MODEL),
    Experiment(
        name="model-topic", note="19_model_topic",
        what="one config with three layer specs (local, MoE, RMSNorm + QK norm) built as GPTModels "
             "under TP: module counts, where the module trees differ, the expert linears' flags",
        module="snippets.experiments.n19_model_topic",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32, layers=1,
                  seq=8, micro_batch_size=1, microbatches=1, bias=False),
        uses=("tp",), estimate=needs.model_topic, checks=checks.model_topic, example="--tp 2",
        unused=NO_BATCH),
    Experiment(
        name="optimizer-topic", note="20_optimizer_topic",
        what="a bf16 GPTModel (Float16Module, fp32 grad buffer) with get_megatron_optimizer, with and "
             "without use_distributed_optimizer, one step: every buffer a rank holds, which parameters "
             "have an fp32 main shard, bytes per parameter against the formula, equal weights",
        module="snippets.experiments.n20_optimizer_topic",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=needs.optimizer_topic, checks=checks.data_parallel),
    Experiment(
        name="overlap", note="20_optimizer_topic",
        what="a real GPTModel in DDP with the distributed optimizer, two steps without and with "
             "overlap_grad_reduce / overlap_param_gather: where each bucket's reduce-scatter and "
             "all-gather fires among the forwards and gradients, and the weights stay the same",
        module="snippets.experiments.n20_overlap",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=4, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=(), estimate=needs.overlap, checks=checks.data_parallel),
    Experiment(
        name="ckpt-topic", note="21_checkpoint_topic",
        what="every sharded_state_dict entry of a real GPTModel (tied embeddings) on a TP x PP x DP "
             "grid: global key, offset, axis_fragmentations, replica_id, and that the written "
             "pieces cover each global tensor exactly once",
        module="snippets.experiments.n21_ckpt_topic",
        tiny=NOTE_07_GPT, uses=("tp", "pp"), estimate=needs.ckpt_topic, checks=checks.ckpt_topic,
        example="--tp 2 --pp 2", unused=("micro_batch_size", "microbatches")),
    Experiment(
        name="refit", note="22_refit_and_resharding",
        what="one RL round: train a TPxPP policy one step, swap_model_weights into a rollout model "
             "with TP = world size, check stale vs fresh logits, and what the plan moved",
        module="snippets.experiments.n22_refit",
        tiny=Dims("tiny", hidden=32, heads=8, query_groups=4, kv_channels=4, ffn=128, vocab=64,
                  layers=4, seq=8, micro_batch_size=2, microbatches=2, rope=True),
        uses=("tp", "pp"), estimate=needs.refit, checks=checks.refit,
        example="--tp 2 --pp 2"),
    Experiment(
        name="journey", note="23_tensor_journey",
        what="one training step of a real GPTModel (TP, PP, DP, sequence parallel, distributed "
             "optimizer) following one linear_fc1 weight: which rank holds which rows, the activation's "
             "sequence shard, the p2p, the DP reduce-scatter, the optimizer shard, every collective, "
             "memory per rank; compared with a TP=PP=1 reference run in the same job",
        module="snippets.experiments.n23_journey",
        tiny=Dims("tiny", hidden=16, heads=2, query_groups=2, kv_channels=8, ffn=32, vocab=32,
                  layers=2, seq=8, micro_batch_size=2, microbatches=4, bias=False),
        uses=("tp", "pp", "sp"), estimate=needs.journey, checks=checks.journey,
        example="--tp 2 --pp 2 --sequence-parallel"),
    Experiment(
        name="rng", note="24_rng_and_recomputation",
        what="model_parallel_cuda_manual_seed's streams per TP / EP rank, dropout masks inside and "
             "outside tracker.fork(), one TransformerLayer plain / tensor_parallel.checkpoint / "
             "torch.utils.checkpoint (bit-identical?, saved bytes), CheckpointWithoutOutput",
        module="snippets.experiments.n24_rng",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=1,
                  layers=1, seq=8, micro_batch_size=2, microbatches=1),
        uses=("tp", "ep"), estimate=needs.rng, checks=checks.rng, example="--tp 2 --ep 2",
        unused=("vocab", "layers", "microbatches")),
    Experiment(
        name="hf-convert", note="25_megatron_hf_conversion",
        what="a TPxPP GPTModel (GQA, QK norm, SwiGLU, RMSNorm, RoPE, padded vocab) trained one step, "
             "gathered by swap_model_weights, mapped into transformers' Qwen3ForCausalLM (strict load) "
             "and back to Megatron TP=2: equal logits both ways, wrong mappings refused or off",
        module="snippets.experiments.n25_hf",
        tiny=Dims("tiny", hidden=32, heads=8, query_groups=2, kv_channels=8, ffn=64, vocab=60,
                  layers=2, seq=8, micro_batch_size=2, microbatches=2, swiglu=True, rmsnorm=True,
                  qk_norm=True, bias=False, rope=True),
        uses=("tp", "pp"), estimate=needs.hf_convert, checks=checks.hf_convert,
        example="--tp 2 --pp 2"),
    Experiment(
        name="cost", note="26_cost",
        what="what a step costs on the real objects: bytes per parameter of a bf16 GPTModel with and "
             "without the distributed optimizer and grad_reduce_in_fp32, bytes one layer keeps with "
             "and without SP and recomputation, the bytes each group sends, beside Megatron's formulas",
        module="snippets.experiments.n26_cost",
        tiny=Dims("tiny", hidden=32, heads=4, query_groups=4, kv_channels=8, ffn=128, vocab=64,
                  layers=2, seq=16, micro_batch_size=2, microbatches=4),
        uses=("tp",), estimate=needs.dist_optimizer, checks=checks.tp_layer, example="--tp 2"),
    Experiment(
        name="rl-trainer", note="27_rl_trainer_side",
        what="the trainer's side of an RL round on a real tiny GPTModel: rollout stand-in at TP=1 bf16, "
             "log-probs recomputed at TP=2 through vocab_parallel_cross_entropy (mismatch, ratios), "
             "KL estimators against the exact KL, bf16 bits changed per step at lr 1e-6 per weight kind",
        module="snippets.experiments.n27_rl_trainer",
        tiny=Dims("tiny", hidden=32, heads=4, query_groups=4, kv_channels=8, ffn=128, vocab=64,
                  layers=2, seq=32, micro_batch_size=8, microbatches=1),
        uses=("tp",), estimate=needs.dist_optimizer, checks=checks.rl_trainer, example="--tp 2",
        unused=("microbatches",)),
    Experiment(
        name="gpu-only", note="28_gpu_only",
        what="what the CPU can run of the GPU-only mechanisms: one TransformerLayer (TP, SP) recorded with "
             "the TE userbuffer each collective would overlap, the FP8 amax reduction groups, and a MoE "
             "GPTModel (EP=2) through combined_1f1b with stand-in streams: the node order, equal gradients",
        module="snippets.experiments.n28_gpu_only",
        tiny=Dims("tiny", hidden=16, heads=4, query_groups=4, kv_channels=4, ffn=32, vocab=32,
                  layers=2, seq=8, micro_batch_size=1, microbatches=3, bias=False),
        uses=("tp",), estimate=needs.gpu_only, checks=checks.gpu_only, example="--tp 2"),
    Experiment(
        name="hang", note="28_gpu_only",
        what="a job that hangs or turns NaN, on 2 CPU gloo ranks: a skipped all_reduce and swapped collective "
             "orders (plain gloo, then TORCH_DISTRIBUTED_DEBUG=DETAIL), flight-recorder dumps and torchfrtrace, "
             "and the real RerunStateMachine on an injected NaN, injected errors and a spiky loss",
        module="snippets.experiments.n28_hang",
        tiny=Dims("tiny", hidden=1, heads=1, query_groups=1, kv_channels=1, ffn=1, vocab=1, layers=1,
                  seq=1, micro_batch_size=1, microbatches=1),
        uses=(), estimate=needs.groups_only, checks=checks.hang, unused=presets.OVERRIDES)]}
"""Registered experiments by name (the runner's first argument), in the order of their notes."""

assert list(EXPERIMENTS) == [e.name for e in sorted(EXPERIMENTS.values(), key=lambda e: e.note)]

__all__ = ["EXPERIMENTS", "Experiment", "PARALLEL_FLAGS", "Parallel", "problems"]
# fmt: on
