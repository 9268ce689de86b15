"""How a verl run moves its weights every round, from its YAML config or its launch script.

Seed 000 asks four questions of a verl run -- ``actor_rollout_ref.actor.strategy`` (fsdp or
megatron?), ``actor_rollout_ref.rollout.name`` (vllm or sglang?), the rollout's
``tensor_model_parallel_size`` and ``actor_rollout_ref.hybrid_engine`` -- and the answers decide
the path: colocated (``hybrid_engine: true``), each GPU gathers every full tensor from the
trainer's shards and hands it to the engine on the same GPU through CUDA IPC; separate (verl's
experimental ``fully_async_policy`` / ``one_step_off_policy``), trainer rank 0 broadcasts every
full tensor to the rollout GPUs over NCCL.

A launch script is read as verl's trainer reads its command line: the config its
``@hydra.main`` names (or ``--config-name``), with verl's defaults for the keys read here
(:data:`facts.VERL_DEFAULTS`), then the script's Hydra overrides on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from snippets.rl.weight_sync import facts, hydra
from snippets.rl.weight_sync.report import UNSET, Reader, fmt, mul, number
from snippets.rl.weight_sync.shell import Command
from snippets.rl.weight_sync.values import ConfigError, Unknown, unflatten

STRATEGIES = ("fsdp", "fsdp2", "megatron")
ROLLOUTS = ("vllm", "sglang", "trtllm")  # verl's rollout registry (workers/rollout/base.py)
SHORT = facts.VERL_COMMIT[:7]


def is_verl(tree: dict) -> bool:
    return isinstance(tree.get("actor_rollout_ref"), dict)


@dataclass
class Run:
    strategy: object
    rollout: object
    rollout_tp: object
    hybrid: object
    gpus_per_node: object
    nodes: object
    rollout_gpus: object  # = the trainer's GPUs when colocated
    train_shards: object  # training ranks one tensor is split across
    train_layout: str  # how the trainer splits it, in words
    model_path: str | None
    separate: str | None  # who runs hybrid_engine=false: facts.VERL_MAINS' third field

    @property
    def gpus(self):
        return mul(self.gpus_per_node, self.nodes)


# ----------------------------------------------------------------------------- the inputs


def from_script(path: str, command: Command) -> tuple[dict, list[str], str | None]:
    """The config tree a launch script's trainer sees, header lines, and its separate-mode runner."""
    name, flag = None, None
    overrides = []
    for word in command.args:
        text = word.text
        if flag:
            name = text if flag == "name" else name
            flag = None
            continue
        for option, what in (
            ("--config-name", "name"),
            ("-cn", "name"),
            ("--config-path", "path"),
            ("-cp", "path"),
            ("--config-dir", "path"),
            ("-cd", "path"),
        ):
            if text == option:
                flag = what
                break
            if text.startswith(option + "="):
                name = text.split("=", 1)[1] if what == "name" else name
                break
        else:
            override = hydra.parse(text, word.unknown)
            if override is not None:
                overrides.append(override)
    main = facts.VERL_MAINS.get(command.runs)
    separate = main[2] if main else None
    name = (name or (main[0] if main else "ppo_trainer")).removesuffix(".yaml").split("/")[-1]
    head = [
        f"verl launch script {path}",
        f"command    line {command.line}: {command.runs} --config-name {name}, "
        f"{len(overrides)} override(s) on verl's defaults (verl {SHORT})",
    ]
    defaults = facts.VERL_DEFAULTS.get(name)
    if defaults is None:
        base = "ppo_megatron_trainer" if "megatron" in name else "ppo_trainer"
        defaults = facts.VERL_DEFAULTS[base]
        head.append(
            f"defaults   {name} is not one of verl's configs; keys it leaves unset are read "
            f"from {base}, which verl's own configs build on"
        )
    if command.extra_args:
        head.append(
            "note       the command ends with $@: arguments given to the script come "
            "after these overrides and may change any of this"
        )
    if command.count > 1:
        head.append(
            f"note       the script runs {command.count} trainer commands; this reads the "
            f"first (line {command.line})"
        )
    return hydra.apply(unflatten(defaults), overrides), head, separate


def from_yaml(path: str, data: dict) -> tuple[dict, list[str], None]:
    return unflatten(data), [f"verl config {path}"], None


# ----------------------------------------------------------------------------- the run


def read_run(reader: Reader, separate: str | None = None) -> Run:
    """The settings that decide how weights are synced (ConfigError on a wrong value)."""
    strategy = reader.choice("actor_rollout_ref.actor.strategy", STRATEGIES)
    rollout = reader.choice("actor_rollout_ref.rollout.name", ROLLOUTS)
    rollout_tp = reader.int("actor_rollout_ref.rollout.tensor_model_parallel_size")
    hybrid = reader.bool("actor_rollout_ref.hybrid_engine")
    per_node = reader.int("trainer.n_gpus_per_node")
    nodes = reader.int("trainer.nnodes")
    gpus = mul(per_node, nodes)
    # Separate placement (fully_async_policy) gives the rollout its own top-level section.
    if hybrid is True:
        rollout_gpus = gpus
    elif hybrid is False:
        rollout_gpus = mul(reader.int("rollout.n_gpus_per_node"), reader.int("rollout.nnodes"))
    else:
        rollout_gpus = UNSET
    if number(rollout_tp) and number(rollout_gpus) and (rollout_tp < 1 or rollout_gpus % rollout_tp):
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {rollout_tp} "
            f"does not divide the {rollout_gpus} rollout GPUs"
        )
    if strategy == "megatron":
        tp = reader.int("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")
        pp = reader.int("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size")
        shards = mul(tp, pp)
        if number(shards) and number(gpus) and (tp < 1 or pp < 1 or gpus % shards):
            raise ConfigError(f"megatron TP {tp} x PP {pp} does not divide the {gpus} GPUs")
        dp = gpus // shards if number(shards) and number(gpus) else UNSET
        layout = f"Megatron TP{fmt(tp)} x PP{fmt(pp)} x DP{fmt(dp)} on {fmt(gpus)} GPUs"
    elif isinstance(strategy, Unknown):
        shards, layout = UNSET, "FSDP or Megatron, not known"
    else:
        size = reader.int("actor_rollout_ref.actor.fsdp_config.fsdp_size", -1)
        shards = gpus if size in (-1, 0) else size
        if number(shards) and number(gpus) and (shards < 1 or gpus % shards):
            raise ConfigError(
                f"actor_rollout_ref.actor.fsdp_config.fsdp_size {size} does not divide the {gpus} GPUs"
            )
        layout = (
            f"{strategy.upper()} on {fmt(gpus)} GPUs, every parameter sharded over "
            f"{fmt(shards)} (fsdp_size {fmt(size)})"
        )
    path = reader.value("actor_rollout_ref.model.path", None)
    return Run(
        strategy,
        rollout,
        rollout_tp,
        hybrid,
        per_node,
        nodes,
        rollout_gpus,
        shards,
        layout,
        None if path is None else str(path),
        separate,
    )


# ----------------------------------------------------------------------------- the answer


def explain(run: Run) -> tuple[list[str], tuple, tuple | None]:
    """The explanation lines, and what :func:`report.bytes_lines` needs for the traffic."""
    engines = (
        run.rollout_gpus // run.rollout_tp if number(run.rollout_gpus) and number(run.rollout_tp) else UNSET
    )
    tp = fmt(run.rollout_tp)
    lines = [
        f"trainer    actor.strategy = {run.strategy}: {run.train_layout}",
        f"           worker: {_worker(run)}",
        f"rollout    rollout.name = {run.rollout}, tensor_model_parallel_size = {run.rollout_tp}: "
        f"{fmt(engines)} engine(s) of TP{tp} on {fmt(run.rollout_gpus)} GPUs",
    ]
    engine = run.rollout if not isinstance(run.rollout, Unknown) else "rollout engine's"
    if run.hybrid is True:
        lines += [
            f"placement  hybrid_engine = true: colocated, training and rollout take turns on the "
            f"same {fmt(run.gpus)} GPUs",
            "each round rollout_mode() on every GPU, tensor by tensor:",
            "           1. " + _gather_step(run),
            f"           2. hand the full tensor to the {engine} worker on the same GPU through "
            "CUDA IPC (no copy over a link)",
            f"           3. the engine's weight loader keeps its 1/{tp} slice; the KV "
            "cache is freed and rebuilt around each phase (free_cache_engine)",
        ]
        shards = run.train_shards
        link = (
            ("nvlink" if shards <= run.gpus_per_node else "ib")
            if number(shards) and number(run.gpus_per_node)
            else None
        )
        moved = (f"gather (1 - 1/{fmt(shards)} of the model)", "gather", shards, link)
    elif run.hybrid is False:
        lines += _separate_lines(run)
        moved = ("broadcast (the whole model)", "broadcast", 1, "ib")
    else:
        lines.append(
            "placement  hybrid_engine unknown: colocated (CUDA IPC on each GPU) or "
            "separate (NCCL broadcast) is not decided"
        )
        moved = ("gather or broadcast", "gather", UNSET, None)
    return lines, moved, (run.rollout_tp, moved[3])


def _separate_lines(run: Run) -> list[str]:
    if run.separate in facts.VERL_SEPARATE_WORKERS:
        where, symbol = facts.VERL_SEPARATE_WORKERS[run.separate][2]
        return [
            f"placement  hybrid_engine = false: separate, {fmt(run.gpus)} GPUs train and another "
            f"{fmt(run.rollout_gpus)} generate at the same time (verl/experimental/{run.separate})",
            "each round sync_rollout_weights(): trainer rank 0 broadcasts every full tensor to all "
            f"rollout GPUs over a collective group (NCCL, {where} {symbol}); each engine's loader "
            "keeps its slice",
        ]
    return [
        f"placement  hybrid_engine = false: separate, {fmt(run.gpus)} GPUs train and another "
        f"{fmt(run.rollout_gpus)} generate at the same time; the standard PPO trainer refuses this "
        "(ray_trainer.py asserts hybrid_engine), verl's experimental fully_async_policy runs it",
        "each round sync_rollout_weights(): trainer rank 0 broadcasts every full tensor to all "
        "rollout GPUs over a collective group (NCCL); each engine's loader keeps its slice",
    ]


def _worker(run: Run) -> str:
    if isinstance(run.strategy, Unknown):
        return "verl/workers/fsdp_workers.py or megatron_workers.py, by actor.strategy"
    megatron = run.strategy == "megatron"
    if run.hybrid is not False:
        return f"verl/workers/{'megatron' if megatron else 'fsdp'}_workers.py AsyncActorRolloutRefWorker"
    package = run.separate if run.separate in facts.VERL_SEPARATE_WORKERS else "fully_async_policy"
    fsdp_file, megatron_file, _ = facts.VERL_SEPARATE_WORKERS[package]
    return (
        f"verl/experimental/{package}/{megatron_file if megatron else fsdp_file}"
        " DetachActorWorker / DetachAsyncRolloutWorker"
    )


def _gather_step(run: Run) -> str:
    if run.strategy == "megatron":
        return (
            "broadcast each tensor across pipeline stages and all-gather it across TP "
            "(utils/megatron_utils.py per_tensor_generator, or the Megatron-Bridge export), "
            "split linear_qkv into q/k/v and rename to Hugging Face names"
        )
    if isinstance(run.strategy, Unknown):
        return "gather each parameter from the trainer's shards and rename to Hugging Face names"
    return (
        f"all-gather each parameter from its {fmt(run.train_shards)} FSDP shards "
        "(DTensor.full_tensor()) and rename to Hugging Face names"
    )
