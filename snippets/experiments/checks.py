"""What each experiment's model sizes must satisfy at given parallel sizes, one function per entry.

Each ``checks.<entry>(dims, par)`` returns sentences (empty = the sizes work): a head count that
``tp`` does not divide, layers that the pipeline cannot split, ... The parallel sizes themselves
(``world`` against ``tp * pp * cp``, the expert layout, ``--vp`` without a pipeline) are checked
once, by :class:`snippets.ranks.parallel_dims.ParallelDims`, before these run
(:func:`snippets.experiments.registry.problems`). Also here: the sizes some experiments derive from
the parallel ones (:func:`load_tps`, :func:`resume_dp_sizes`), since the checks, the memory
estimates (:mod:`snippets.experiments.needs`) and the experiments all use them.

Torch-free, like the whole registry: the runner refuses a bad command before it imports torch.
"""

from __future__ import annotations

from snippets.models.presets import Dims
from snippets.ranks.parallel_dims import ParallelDims

SIMPLE_LOOP_STEPS = 5
"""Iterations of note 01's loop (``snippets.experiments.n01_overview.STEPS``; a test keeps them equal)."""

MOCK_SAMPLES = 1000
"""Samples of its mock dataset (``snippets.experiments.n01_overview.SAMPLES``)."""

RESUME_ITERATIONS = 4
"""Iterations of note 18's uninterrupted run (``--train-iters``); it is interrupted after half of them
(:mod:`snippets.experiments.n18_data_topic` reads it from here)."""

ETP = 1
"""Expert tensor parallel size of ``rank-generator`` (``snippets.experiments.n08_rank_generator.ETP``;
that module imports torch, so it is repeated here and a test keeps them equal)."""

EXPERTS = 2
"""Experts of ``model-topic``'s MoE variant (``snippets.experiments.n19_model_topic.EXPERTS``)."""


def divides(out: list, what: str, n: int, by: str, k: int) -> None:
    """Append ``"{what} {n} is not divisible by {by} {k}"`` to ``out`` unless ``k`` divides ``n``."""
    if n % k:
        out.append(f"{what} {n} is not divisible by {by} {k}")


def query_groups_fit(out: list, d: Dims, tp: int) -> None:
    """Megatron splits query groups over TP, or repeats them when there are fewer than ``tp``."""
    if d.query_groups % tp and tp % d.query_groups:
        out.append(f"query groups {d.query_groups} and tp {tp}: one must divide the other")


def tp_splits(out: list, d: Dims, tp: int, name: str = "tp") -> None:
    """What a TP-split ``GPTModel`` (local spec) divides by ``tp``: heads, query groups, the MLP,
    the vocabulary (Core does not pad it)."""
    for what, n in (("heads", d.heads), ("query groups", d.query_groups), ("ffn", d.ffn), ("vocab", d.vocab)):
        divides(out, what, n, name, tp)


def gpt_under_tp(d: Dims, tp: int) -> list[str]:
    """What ``TransformerConfig`` and the TP layers of a whole GPT model need from ``tp``."""
    out: list[str] = []
    divides(out, "heads", d.heads, "tp", tp)
    query_groups_fit(out, d, tp)
    divides(out, "ffn", d.ffn, "tp", tp)
    divides(out, "vocab", d.vocab, "tp", tp)
    return out


def load_tps(par: ParallelDims) -> list[int]:
    """The TP sizes the ``checkpoint`` experiment loads at: 1 and the world size, those that differ
    from the saved TP (``par.tp``); a world of one reloads at TP = 1."""
    return [tp for tp in dict.fromkeys((1, par.world)) if tp != par.tp] or [par.tp]


def resume_dp_sizes(d: Dims, par: ParallelDims) -> list[int]:
    """The DP sizes note 18's run resumes at: its own first, then every other DP size the same ranks
    can form (``world / tp'``) whose micro-batches divide the global batch, largest first."""
    global_batch = d.micro_batch_size * d.microbatches * par.dp
    others = [
        dp
        for dp in range(par.world, 0, -1)
        if par.world % dp == 0 and dp != par.dp and global_batch % (d.micro_batch_size * dp) == 0
    ]
    return [par.dp] + others


# ----------------------------------------------------------------------------- one per entry


def only_parallel_sizes(d: Dims, par: ParallelDims) -> list[str]:
    """Nothing beyond the parallel sizes (``groups``, ``moe``, ``rank-generator``)."""
    return []


def overview(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    tp_splits(out, d, par.tp)
    needed = SIMPLE_LOOP_STEPS * d.microbatches * d.micro_batch_size
    if needed > MOCK_SAMPLES:
        out.append(
            f"{SIMPLE_LOOP_STEPS} steps x {d.microbatches} micro-batches x micro-batch "
            f"{d.micro_batch_size} = {needed} samples, more than the mock dataset's {MOCK_SAMPLES}"
        )
    return out


def batch_flow(d: Dims, par: ParallelDims) -> list[str]:
    out = []
    if d.vocab < 3:
        out.append(f"vocab {d.vocab} leaves no token id between 0 and the EOD (vocab - 1): use 3 or more")
    if d.seq % (2 * par.cp):
        out.append(
            f"seq {d.seq} is not divisible by 2 * cp = {2 * par.cp} (get_batch_on_this_cp_rank "
            f"cuts it into 2 * cp chunks)"
        )
    return out


def gpt_model(d: Dims, par: ParallelDims) -> list[str]:
    return gpt_under_tp(d, par.tp)


def loss(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "heads", d.heads, "tp", par.tp)
    divides(out, "vocab", d.vocab, "tp", par.tp)
    divides(out, "ffn", d.ffn, "tp", par.tp)
    return out


def data_parallel(d: Dims, par: ParallelDims) -> list[str]:
    """Every rank data parallel (``train-step``, ``ddp``, ``dist-optimizer``, note 20's two)."""
    out: list[str] = []
    divides(out, "micro-batches", d.microbatches, "dp (= world size)", par.dp)
    return out


def checkpoint(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    tp_splits(out, d, par.tp, "tp (save)")
    for tp in load_tps(par):
        tp_splits(out, d, tp, "tp (load)")
    return out


def mappings(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "seq", d.seq, "tp", par.tp)
    divides(out, "hidden", d.hidden, "tp", par.tp)
    return out


def linear(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "ffn", d.ffn, "tp", par.tp)
    divides(out, "seq", d.seq, "tp (sequence parallel cases)", par.tp)
    return out


def tp_layer(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "heads", d.heads, "tp", par.tp)
    divides(out, "ffn", d.ffn, "tp", par.tp)
    query_groups_fit(out, d, par.tp)
    if par.tp > 1:
        divides(out, "seq", d.seq, "tp (sequence parallel run)", par.tp)
    return out


def vocab(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "vocab", d.vocab, "tp", par.tp)
    divides(out, "seq", d.seq, "tp (reduce-scattered embedding)", par.tp)
    return out


def pipeline(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "layers", d.layers, "pp * vp", par.pp * (par.vp or 1))
    divides(out, "heads", d.heads, "tp", par.tp)
    divides(out, "vocab", d.vocab, "tp", par.tp)
    if par.sp:
        divides(out, "seq", d.seq, "tp (sequence parallel)", par.tp)
    return out


def cp(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "seq", d.seq, "2 * cp", 2 * par.cp)
    return out


def data_topic(d: Dims, par: ParallelDims) -> list[str]:
    out = []
    if d.vocab < 3:
        out.append(f"vocab {d.vocab} leaves no token id below the EOD (vocab - 1): use 3 or more")
    if d.seq < 2:
        out.append(f"seq {d.seq} is too short for note 18's corpus (documents of seq / 2 tokens and more)")
    return out


def model_topic(d: Dims, par: ParallelDims) -> list[str]:
    out = gpt_under_tp(d, par.tp)
    if d.bias and par.tp > 1:
        out.append(
            f"the MoE variant with linear bias needs tp 1 (TransformerConfig allows bias in "
            f"MoE only at expert tp 1, and expert tp follows tp {par.tp}); use a preset "
            f"without bias"
        )
    return out


def ckpt_topic(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "layers", d.layers, "pp", par.pp)
    tp_splits(out, d, par.tp)
    return out


def refit(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "layers", d.layers, "pp", par.pp)
    for name, tp in (("tp", par.tp), ("rollout tp (= world size)", par.world)):
        divides(out, "heads", d.heads, name, tp)
        divides(out, "query groups", d.query_groups, name, tp)
        divides(out, "vocab", d.vocab, name, tp)
        divides(out, "ffn", d.ffn, name, tp)
    return out


def journey(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "layers", d.layers, "pp", par.pp)
    out += gpt_under_tp(d, par.tp)
    divides(out, "micro-batches", d.microbatches, "dp", par.dp)
    if par.sp:
        divides(out, "seq", d.seq, "tp (sequence parallel)", par.tp)
    return out


def rng(d: Dims, par: ParallelDims) -> list[str]:
    out: list[str] = []
    divides(out, "heads", d.heads, "tp", par.tp)
    divides(out, "ffn", d.ffn, "tp", par.tp)
    query_groups_fit(out, d, par.tp)
    return out


def hf_convert(d: Dims, par: ParallelDims) -> list[str]:
    """Note 25: a Qwen3 / Llama-style model (Hugging Face has no other counterpart), the reverse at TP=2."""
    out: list[str] = []
    missing = [
        name for name, on in (("SwiGLU", d.swiglu), ("RMSNorm", d.rmsnorm), ("RoPE", d.rope)) if not on
    ]
    if missing or d.bias:
        out.append(
            f"hf-convert maps a Qwen3 / Llama-style model: it needs {', '.join(missing) or 'no linear bias'}"
        )
    divides(out, "layers", d.layers, "pp", par.pp)
    divides(out, "world size", par.world, "the reverse's tp", 2)
    for name, tp in (("tp", par.tp), ("the reverse's tp", 2)):
        divides(out, "heads", d.heads, name, tp)
        divides(out, "query groups", d.query_groups, name, tp)
        divides(out, "ffn", d.ffn, name, tp)
    return out


def rl_trainer(d: Dims, par: ParallelDims) -> list[str]:
    """Note 27: a TP GPTModel; GRPO groups of 4 sequences; 4 prompt tokens, the rest generated."""
    out: list[str] = []
    divides(out, "heads", d.heads, "tp", par.tp)
    divides(out, "ffn", d.ffn, "tp", par.tp)
    divides(out, "vocab", d.vocab, "tp", par.tp)
    query_groups_fit(out, d, par.tp)
    divides(out, "micro-batch size", d.micro_batch_size, "the GRPO group size", 4)
    if d.seq <= 4:
        out.append(f"seq {d.seq} leaves nothing to generate after the 4 prompt tokens")
    return out


def gpu_only(d: Dims, par: ParallelDims) -> list[str]:
    """Note 28: note 11's layer under TP, then combined_1f1b at EP=2 (4 experts)."""
    out = tp_layer(d, par)
    divides(out, "world size", par.world, "the combined_1f1b run's ep", 2)
    return out


def hang(d: Dims, par: ParallelDims) -> list[str]:
    """Note 28's hang cases pair rank 0 with rank 1: exactly two ranks."""
    return [] if par.world == 2 else [f"hang runs on exactly 2 ranks, not {par.world}"]
