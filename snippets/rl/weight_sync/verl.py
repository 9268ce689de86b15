"""How a verl run moves its weights every round, from its YAML config or its launch script.

Read in verl at :data:`facts.VERL_COMMIT` (2026-08-22). What decides the path:

* the trainer: ``model_engine=dp|megatron|torchtitan|veomni`` (a Hydra config group that picks
  ``actor_rollout_ref.actor.strategy`` and the engine's own keys, e.g. ``actor.megatron.*``);
* the rollout engine: ``actor_rollout_ref.rollout.name`` (vllm, sglang, trtllm) and its TP;
* how trainer and rollout share GPUs: ``verl.trainer.main_ppo`` runs the v1 trainer
  (``trainer.use_v1``, default true) in ``trainer.v1.trainer_mode`` ``sync`` / ``colocate_async``
  (colocated: verl forces the checkpoint engine to ``naive``, CUDA IPC on each GPU) or
  ``separate_async`` (a standalone rollout on ``actor_rollout_ref.rollout.nnodes`` x
  ``n_gpus_per_node`` GPUs, synced by ``checkpoint_engine.backend``); verl's experimental
  ``fully_async_policy`` / ``one_step_off_policy`` mains require ``hybrid_engine=false`` and sync
  through the checkpoint engine too (nccl in their configs);
* ``actor_rollout_ref.rollout.checkpoint_engine.backend``: naive, nccl, nixl, mooncake,
  kimi_ckpt_engine, delta_sharded (only the changed elements; sglang only).

A launch script is read as verl's trainer reads its command line: the config its ``@hydra.main``
names (or ``--config-name``), the ``model_engine`` it picks, verl's defaults for the keys read here
(:data:`facts.VERL_ENGINE_DEFAULTS`), then the script's Hydra overrides on top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snippets.rl.weight_sync import facts, hydra
from snippets.rl.weight_sync.report import UNSET, Reader, Sparse, fmt, mul, number
from snippets.rl.weight_sync.shell import Command
from snippets.rl.weight_sync.values import ConfigError, Unknown, put, unflatten

STRATEGIES = ("fsdp", "fsdp2", "fsdp_turbo", "megatron", "torchtitan", "veomni")  # workers/config/engine.py
ROLLOUTS = ("vllm", "sglang", "trtllm")  # verl/workers/rollout/replica.py RolloutReplicaRegistry
ENGINES = tuple(facts.VERL_ENGINE_DEFAULTS)
MODES = ("sync", "colocate_async", "separate_async")
BACKENDS = tuple(facts.VERL_CHECKPOINT_ENGINES)
SHORT = facts.VERL_COMMIT[:7]
# config groups of ppo_trainer.yaml's defaults list and the section each fills
GROUPS = {
    "actor": "actor_rollout_ref.actor",
    "ref": "actor_rollout_ref.ref",
    "rollout": "actor_rollout_ref.rollout",
    "model": "actor_rollout_ref.model",
    "critic": "critic",
    "data": "data",
    "reward": "reward",
    "distillation": "distillation",
    "transfer_queue": "transfer_queue",
}
_GROUP = re.compile(r"^(\+{0,2})([A-Za-z_][\w-]*)(?:@([\w.]+))?=(.*)$", re.S)


def is_verl(tree: dict) -> bool:
    return isinstance(tree.get("actor_rollout_ref"), dict)


@dataclass
class Run:
    strategy: object
    rollout: object
    rollout_tp: object
    placement: str  # "colocated", "separate" or "unknown"
    how: str  # who decides the placement, in words
    backend: object  # the checkpoint engine that moves the weights
    gpus_per_node: object
    nodes: object
    rollout_gpus: object  # = the trainer's GPUs when colocated
    train_shards: object  # training ranks one tensor is split across
    train_layout: str
    model_path: str | None
    notes: list[str]

    @property
    def gpus(self):
        return mul(self.gpus_per_node, self.nodes)


# ----------------------------------------------------------------------------- the inputs


def from_script(path: str, command: Command) -> tuple[dict, list[str], str | None]:
    """The config tree a launch script's trainer sees, header lines, and the main's package."""
    name, flag = None, None
    overrides, groups, noise = [], [], []
    engine: object = None
    for word in command.args:
        text = word.text
        if flag:
            name = text if flag == "name" else name
            flag = None
            continue
        option = _option(text)
        if option:
            flag, value = option
            if value is not None:
                name = value if flag == "name" else name
                flag = None
            continue
        group = _GROUP.match(text)
        if group and (group.group(3) or group.group(2) in GROUPS or group.group(2) == "model_engine"):
            key, value = group.group(2), group.group(4)
            if key == "model_engine" and not group.group(3):
                engine = Unknown(value, word.unknown.why) if word.unknown else value.strip("'\"")
            else:
                groups.append((key, group.group(3) or GROUPS.get(key, key), value, word.unknown))
            continue
        override = hydra.parse(text, word.unknown)
        if override is not None:
            overrides.append(override)
        else:
            noise.append(text)
    main = facts.VERL_MAINS.get(command.runs)
    if main is None and command.runs.startswith("verl."):
        raise ConfigError(
            f"{path}: line {command.line} runs {command.runs}, which is not one of verl {SHORT}'s PPO "
            f"trainer mains ({', '.join(facts.VERL_MAINS)})"
        )
    package = main[2] if main else None
    name = (name or (main[0] if main else "ppo_trainer")).removesuffix(".yaml").split("/")[-1]
    head = [
        f"verl launch script {path}",
        f"command    {_lines(command.line, command.end)}: {command.runs} --config-name {name}, "
        f"{len(overrides) + len(groups) + (engine is not None)} override(s) on verl's defaults "
        f"(verl {SHORT})",
    ]
    if name in facts.VERL_CONFIGS:
        base, extra = facts.VERL_CONFIGS[name]
    else:
        base, extra = ("megatron" if "megatron" in name else "dp"), {}
        head.append(
            f"defaults   {name} is not one of verl's configs; keys it leaves unset are read "
            f"from verl's ppo_trainer with model_engine={base}"
        )
    engine = base if engine is None else engine
    if isinstance(engine, Unknown):
        defaults = {**facts.VERL_ENGINE_DEFAULTS["dp"], **extra}
        defaults["actor_rollout_ref.actor.strategy"] = Unknown(f"model_engine={engine.text}", engine.why)
    elif engine not in facts.VERL_ENGINE_DEFAULTS:
        raise ConfigError(f"{path}: model_engine={engine}: verl {SHORT} has {', '.join(ENGINES)}")
    else:
        defaults = {**facts.VERL_ENGINE_DEFAULTS[engine], **extra}
        head.append(f"engine     model_engine = {engine} ({facts.VERL_GENERATED[engine]})")
    tree = hydra.apply(unflatten(defaults), overrides)
    for key, where, value, unknown in groups:
        _group(tree, key, where, value, unknown, overrides)
    head += _shell_notes(command, noise)
    if not any(o.key == "actor_rollout_ref.model.path" for o in overrides):
        head.append(
            "defaults   the command does not set actor_rollout_ref.model.path: the model below is "
            "verl's placeholder default"
        )
    return tree, head, package


def _lines(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _option(text: str):
    for option, what in (
        ("--config-name", "name"),
        ("-cn", "name"),
        ("--config-path", "path"),
        ("-cp", "path"),
        ("--config-dir", "path"),
        ("-cd", "path"),
    ):
        if text == option:
            return what, None
        if text.startswith(option + "="):
            return what, text.split("=", 1)[1]
    return None


def _group(tree, key, where, value, unknown, overrides) -> None:
    """A config-group choice (``actor@actor_rollout_ref.actor=mlite_actor``) on the tree."""
    if key == "actor" and where == GROUPS["actor"] and not unknown and value in facts.VERL_ACTORS:
        put(
            tree,
            where + ".strategy",
            facts.VERL_ENGINE_DEFAULTS[facts.VERL_ACTORS[value]][where + ".strategy"],
        )
        return
    search = next((o.value for o in overrides if o.key == "hydra.searchpath"), None)
    if isinstance(search, list):
        search = "[" + ",".join(map(str, search)) + "]"
    why = (
        f"{key}@{where}={value} loads a config verl {SHORT} does not ship"
        + (f" (from hydra.searchpath {search})" if search else "")
        + ", so what it sets is not known here"
    )
    if where == GROUPS["actor"]:
        put(tree, where + ".strategy", Unknown(f"{key}@{where}={value}", why))
    elif where == GROUPS["rollout"]:
        for k in ("name", "tensor_model_parallel_size"):
            set_by_script = any(o.key == f"{where}.{k}" for o in overrides)
            if not set_by_script:
                put(tree, f"{where}.{k}", Unknown(f"{key}@{where}={value}", why))


def _shell_notes(command: Command, noise: list[str]) -> list[str]:
    lines = []
    if command.broken:
        line = command.broken[0]
        after = ", ".join(_lines(a, b) + f" ({w.split('=')[0]}=...)" for a, b, w in command.stray)
        lines.append(
            f"broken     line {line} ends in a backslash and a blank (then a comment): the backslash "
            f"escapes the blank, not the newline, so bash ends the command on line {line}"
            + (
                f"; the words after it ({' '.join(repr(n) for n in noise[:8])}"
                f"{' ...' if len(noise) > 8 else ''}) reach the trainer, and Hydra rejects a word "
                "without key=value"
                if noise
                else ""
            )
            + (
                f"; then bash runs {after} as separate commands, which fail (command not found): "
                "their overrides never reach the trainer"
                if command.stray
                else ""
            )
            + ". Below is what runs, not what the author meant"
        )
    elif noise:
        lines.append(
            f"note       {len(noise)} word(s) of the command are not Hydra overrides: "
            f"{' '.join(repr(n) for n in noise[:6])}{' ...' if len(noise) > 6 else ''}"
        )
    if command.extra_args:
        lines.append(
            "note       the command ends with $@: arguments given to the script come "
            "after these overrides and may change any of this"
        )
    if command.count > 1:
        lines.append(
            f"note       the script runs {command.count} trainer commands; this reads the "
            f"first (line {command.line})"
        )
    return lines


def from_yaml(path: str, data: dict) -> tuple[dict, list[str], str]:
    return unflatten(data), [f"verl config {path}"], "yaml"


# ----------------------------------------------------------------------------- the run


def read_run(reader: Reader, package: str | None = None) -> Run:
    """The settings that decide how weights are synced (ConfigError on a wrong value)."""
    strategy = reader.choice("actor_rollout_ref.actor.strategy", STRATEGIES)
    rollout = reader.choice("actor_rollout_ref.rollout.name", ROLLOUTS)
    rollout_tp = reader.size("actor_rollout_ref.rollout.tensor_model_parallel_size")
    per_node = reader.size("trainer.n_gpus_per_node")
    nodes = reader.size("trainer.nnodes")
    gpus = mul(per_node, nodes)
    ce = "actor_rollout_ref.rollout.checkpoint_engine."
    custom = reader.value(ce + "custom_backend_module", None)
    default = "nccl" if package == "yaml" else "naive"  # the experimental configs set nccl
    backend = (
        reader.value(ce + "backend", default) if custom else reader.choice(ce + "backend", BACKENDS, default)
    )
    notes: list[str] = []
    placement, rollout_gpus = _placement(reader, package, gpus, backend, notes)
    how = notes.pop(next(i for i, n in enumerate(notes) if n.startswith("mode")))
    if placement == "colocated":
        rollout_gpus = gpus
        if backend != "naive" and not isinstance(backend, Unknown):
            notes.append(
                f"note       checkpoint_engine.backend = {backend} is not used: colocated, verl sets it to "
                f"naive ({facts.verl_code('naive_forced')})"
            )
        backend = "naive"
    if backend == "delta_sharded" and rollout not in ("sglang",) and not isinstance(rollout, Unknown):
        raise ConfigError(
            f"checkpoint_engine.backend delta_sharded works only with rollout.name sglang; verl raises "
            f"NotImplementedError for {rollout} ({facts.verl_code('delta_sglang')})"
        )
    if number(rollout_tp) and number(rollout_gpus) and (rollout_tp < 1 or rollout_gpus % rollout_tp):
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {rollout_tp} "
            f"does not divide the {rollout_gpus} rollout GPUs"
        )
    shards, layout = _layout(reader, strategy, gpus)
    path = reader.value("actor_rollout_ref.model.path", None)
    return Run(
        strategy,
        rollout,
        rollout_tp,
        placement,
        how,
        backend,
        per_node,
        nodes,
        rollout_gpus,
        shards,
        layout,
        None if path is None else str(path),
        notes,
    )


def _placement(reader, package, gpus, backend, notes):
    """("colocated" | "separate" | "unknown", rollout GPUs); notes[0] says why, in one line."""
    if (
        package == "yaml"
    ):  # a config file, run by whichever main: hybrid_engine=false needs an experimental one
        if reader.bool("actor_rollout_ref.hybrid_engine", True) is False:
            notes.append(
                "mode       hybrid_engine = false: only verl's experimental fully_async_policy / "
                f"one_step_off_policy mains run this ({facts.verl_code('fully_async_hybrid')}; "
                f"main_ppo's legacy trainer asserts the opposite, {facts.verl_code('v0_hybrid')})"
            )
            return "separate", mul(reader.size("rollout.n_gpus_per_node"), reader.size("rollout.nnodes"))
        package = None
    if package in ("fully_async_policy", "one_step_off_policy"):
        hybrid = reader.bool("actor_rollout_ref.hybrid_engine", True)
        code = facts.verl_code("fully_async_hybrid" if package == "fully_async_policy" else "one_step_hybrid")
        if hybrid is True:
            raise ConfigError(
                f"verl/experimental/{package} needs actor_rollout_ref.hybrid_engine=false; verl "
                f"asserts it ({code}) and the script leaves it true"
            )
        said = "false" if hybrid is False else fmt(hybrid)
        notes.append(f"mode       verl/experimental/{package}, hybrid_engine = {said} ({code})")
        if isinstance(hybrid, Unknown):
            return "unknown", UNSET
        return "separate", mul(reader.size("rollout.n_gpus_per_node"), reader.size("rollout.nnodes"))
    use_v1 = reader.bool("trainer.use_v1", True)
    if use_v1 is False:
        hybrid = reader.bool("actor_rollout_ref.hybrid_engine", True)
        if hybrid is False:
            raise ConfigError(
                f"trainer.use_v1=false runs verl's legacy trainer, which requires hybrid_engine=true "
                f"({facts.verl_code('v0_hybrid')})"
            )
        notes.append("mode       trainer.use_v1 = false: the legacy trainer (main_ppo_v0), colocated")
        return ("colocated" if hybrid is True else "unknown"), gpus
    if reader.bool("actor_rollout_ref.hybrid_engine", True) is False:
        notes.append(
            "note       hybrid_engine = false is not read by the v1 trainer: trainer.v1.trainer_mode "
            "decides the placement (only the legacy trainer and the experimental mains read it)"
        )
    mode = reader.choice("trainer.v1.trainer_mode", MODES, "sync")
    if isinstance(use_v1, Unknown) or isinstance(mode, Unknown):
        notes.append(
            f"mode       trainer.v1.trainer_mode = {fmt(mode)}: colocated or separate is not decided"
        )
        return "unknown", UNSET
    if mode != "separate_async":
        notes.append(f"mode       trainer.v1.trainer_mode = {mode} (verl.trainer.ppo.v1)")
        return "colocated", gpus
    r = "actor_rollout_ref.rollout."
    rnodes, rper = reader.int(r + "nnodes", 0), reader.size(r + "n_gpus_per_node", 8)
    if number(rnodes) and rnodes <= 0:
        raise ConfigError(
            f"trainer_mode separate_async needs actor_rollout_ref.rollout.nnodes > 0 for the standalone "
            f"rollout; it is {rnodes} ({facts.verl_code('separate_nnodes')})"
        )
    if backend == "naive":
        raise ConfigError(
            "trainer_mode separate_async needs a checkpoint_engine.backend other than naive "
            f"(nccl, nixl, mooncake, ...; {facts.verl_code('separate_backend')})"
        )
    notes.append(
        "mode       trainer.v1.trainer_mode = separate_async: a standalone rollout; the trainer's own GPUs "
        "also hold colocated replicas, which generate only when "
        "trainer.v1.separate_async.hybrid_rollout.enable_switch lends them"
    )
    return "separate", mul(rnodes, rper)


def _layout(reader, strategy, gpus):
    a = "actor_rollout_ref.actor."
    if strategy == "megatron":
        m = a + "megatron."
        tp = reader.size(m + "tensor_model_parallel_size")
        pp = reader.size(m + "pipeline_model_parallel_size")
        cp = reader.size(m + "context_parallel_size", 1)
        ep = reader.size(m + "expert_model_parallel_size", 1)
        vpp = reader.value(m + "virtual_pipeline_model_parallel_size", None)
        model = mul(tp, pp, cp)
        if number(model) and number(gpus) and (model < 1 or gpus % model):
            raise ConfigError(f"megatron TP {tp} x PP {pp} x CP {cp} does not divide the {gpus} GPUs")
        dp = gpus // model if number(model) and number(gpus) else UNSET
        extra = f", VPP{fmt(vpp)}" if vpp is not None else ""
        return mul(tp, pp), (
            f"Megatron TP{fmt(tp)} x PP{fmt(pp)} x CP{fmt(cp)} x DP{fmt(dp)} (EP{fmt(ep)}{extra}) on {fmt(gpus)} GPUs"
        )
    if isinstance(strategy, Unknown):
        return UNSET, "not known"
    if strategy == "veomni":
        size = reader.size(a + "veomni.fsdp_size", -1, also=(-1, 0))
        sp = reader.size(a + "veomni.ulysses_parallel_size", 1)
        ep = reader.size(a + "veomni.expert_parallel_size", 1)
        shards = gpus if size in (-1, 0) else size
        return shards, (
            f"VeOmni FSDP on {fmt(gpus)} GPUs, every parameter sharded over {fmt(shards)} "
            f"(fsdp_size {fmt(size)}; Ulysses SP{fmt(sp)}, EP{fmt(ep)})"
        )
    if strategy == "torchtitan":
        t = a + "torchtitan."
        tp = reader.size(t + "tensor_parallel_size", 1)
        pp = reader.size(t + "pipeline_parallel_size", 1)
        return gpus, f"TorchTitan TP{fmt(tp)} x PP{fmt(pp)} on {fmt(gpus)} GPUs, FSDP over the rest"
    size = reader.size(a + "fsdp_config.fsdp_size", -1, also=(-1, 0))
    shards = gpus if size in (-1, 0) else size
    if number(shards) and number(gpus) and (shards < 1 or gpus % shards):
        raise ConfigError(
            f"actor_rollout_ref.actor.fsdp_config.fsdp_size {size} does not divide the {gpus} GPUs"
        )
    return shards, (
        f"{strategy.upper()} on {fmt(gpus)} GPUs, every parameter sharded over {fmt(shards)} (fsdp_size {fmt(size)})"
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
        run.how,
        f"rollout    rollout.name = {run.rollout}, tensor_model_parallel_size = {run.rollout_tp}: "
        f"{fmt(engines)} engine(s) of TP{tp} on {fmt(run.rollout_gpus)} GPUs",
    ]
    engine = run.rollout if not isinstance(run.rollout, Unknown) else "rollout engine's"
    if run.placement == "colocated":
        lines += [
            f"placement  colocated: training and rollout take turns on the same {fmt(run.gpus)} GPUs",
            f"each round update_weights ({facts.verl_code('update_weights')}), checkpoint engine naive, "
            "tensor by tensor:",
            "           1. " + _gather_step(run),
            f"           2. hand the full tensor to the {engine} server on the same GPU through "
            "CUDA IPC (no copy over a link)",
            f"           3. the engine's weight loader keeps its 1/{tp} slice; its weights and KV cache "
            "are released and resumed around each phase (free_cache_engine)",
        ]
        shards = run.train_shards
        link = (
            ("nvlink" if shards <= run.gpus_per_node else "ib")
            if number(shards) and number(run.gpus_per_node)
            else None
        )
        moved = (f"gather (1 - 1/{fmt(shards)} of the model)", "gather", shards, link)
    elif run.placement == "separate":
        backend = fmt(run.backend)
        how = facts.VERL_CHECKPOINT_ENGINES.get(
            str(run.backend), "a custom checkpoint engine (custom_backend_module)"
        )
        lines += [
            f"placement  separate: {fmt(run.gpus)} GPUs train and another {fmt(run.rollout_gpus)} "
            "generate at the same time",
            f"each round update_weights ({facts.verl_code('update_weights')}) through the checkpoint "
            f"engine {backend}: {how}; each rollout worker passes what it receives to its engine "
            "through CUDA IPC, and the engine's loader keeps its slice",
        ]
        if run.backend == "delta_sharded":
            wire = Sparse(
                4,
                "a 4 B int32 position",
                facts.verl_code("delta_wire"),
                "the first sync sends every value once, without positions",
            )
            moved = (
                "only the changed elements (verl's docs: about 1-3 % of them per step)",
                "delta",
                wire,
                "ib",
            )
        else:
            moved = ("the whole model", "broadcast", 1, "ib")
    else:
        lines.append(
            "placement  not decided: colocated (CUDA IPC on each GPU) or separate (checkpoint engine)"
        )
        moved = ("gather or broadcast", "gather", UNSET, None)
    return lines + run.notes, moved, (run.rollout_tp, moved[3])


def _gather_step(run: Run) -> str:
    if run.strategy == "megatron":
        return (
            "export each tensor in Hugging Face form through the bridge (Megatron-Bridge or mbridge "
            f"export_hf_weights, {facts.verl_code('megatron_export')}): all-gather across TP, "
            "broadcast across PP, split linear_qkv into q/k/v"
        )
    if isinstance(run.strategy, Unknown):
        return "gather each parameter from the trainer's shards and rename to Hugging Face names"
    return (
        f"all-gather each parameter from its {fmt(run.train_shards)} shards "
        f"(DTensor.full_tensor(), {facts.verl_code('fsdp_export')}) in Hugging Face names"
    )
