"""Read a verl training config and say how that run syncs its weights every round.

    python -m snippets.rl.verl_sync CONFIG.yaml [--params 7e9] [--dtype bf16]

Seed 000 asks four questions of a verl run -- ``actor_rollout_ref.actor.strategy`` (fsdp or
megatron?), ``actor_rollout_ref.rollout.name`` (vllm or sglang?), the rollout's
``tensor_model_parallel_size`` and ``actor_rollout_ref.hybrid_engine`` -- and with the answers
you can tell how the weights travel from trainer to rollout engine. This command asks them of a
config file and prints the answer, with the bytes per GPU and a wire-time lower bound from
:mod:`snippets.rl.refit_cost`.

The config is YAML shaped like verl's ``ppo_trainer.yaml`` (nested sections). Keys may also be
written flat, the way verl's command-line overrides are (``actor_rollout_ref.rollout.name:
vllm``), and ``${a.b.c}`` references to other keys are resolved. Any problem -- a missing file,
bad YAML, a file that is not a verl config, a missing or unknown value -- ends the command with
exit status 2 and one line saying what is wrong.

What each setting implies, read in verl at commit b178a3cd (``main_ppo.py``,
``fsdp_workers.py``, ``megatron_workers.py``, ``utils/megatron_utils.py``,
``workers/rollout/*``, ``experimental/fully_async_policy``) -- see note 22 for the links.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from snippets.rl import refit_cost

STRATEGIES = ("fsdp", "fsdp2", "megatron")
ROLLOUTS = ("vllm", "sglang", "trtllm")  # verl's rollout registry (workers/rollout/base.py)


class ConfigError(Exception):
    """A problem with the config file; the message is the one line the user sees."""


# ----------------------------------------------------------------------------- reading


def load(path: str) -> dict:
    """The config as one nested dict (flat dotted keys merged in)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no such file: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML: {problem}{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a verl config: expected a mapping of sections, "
                          f"got {type(data).__name__}")
    config: dict = {}
    for key, value in data.items():
        _put(config, str(key).split("."), value)
    if "actor_rollout_ref" not in config:
        raise ConfigError(f"{path} is not a verl config: it has no actor_rollout_ref section")
    return config


def _put(tree: dict, parts: list[str], value) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"key {'.'.join(parts)} is both a value and a section")
    last = parts[-1]
    if isinstance(value, dict) and isinstance(tree.get(last), dict):
        for k, v in value.items():
            _put(tree[last], str(k).split("."), v)
    else:
        tree[last] = value


_MISSING = object()
_REF = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


def get(config: dict, key: str, default=_MISSING, _seen=()):
    """The value at dotted ``key``; follows ``${other.key}``; ``???`` counts as missing."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is not _MISSING:
                return default
            raise ConfigError(f"missing key {key}")
        node = node[part]
    if isinstance(node, str):
        ref = _REF.match(node.strip())
        if ref:
            if ref.group(1) in _seen:
                raise ConfigError(f"{key} refers to itself through ${{{ref.group(1)}}}")
            return get(config, ref.group(1), default, _seen + (key,))
        if node.strip() == "???":
            raise ConfigError(f"{key} is ??? (verl requires a value here)")
    if node is None and default is not _MISSING:
        return default
    return node


def _int(config: dict, key: str, default=_MISSING) -> int:
    value = get(config, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} is {value!r}; expected an integer")
    return value


def _choice(config: dict, key: str, choices: tuple) -> str:
    value = get(config, key)
    if value not in choices:
        raise ConfigError(f"{key} is {value!r}; verl knows {', '.join(choices)}")
    return value


def _bool(config: dict, key: str) -> bool:
    value = get(config, key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} is {value!r}; expected true or false")
    return value


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    strategy: str
    rollout: str
    rollout_tp: int
    hybrid: bool
    gpus_per_node: int
    nodes: int
    rollout_gpus: int      # = the trainer's GPUs when colocated
    train_shards: int      # training ranks one tensor is split across
    train_layout: str      # how the trainer splits it, in words
    model_path: str | None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def read_run(config: dict) -> Run:
    """The settings that decide how weights are synced (raises ConfigError on any problem)."""
    strategy = _choice(config, "actor_rollout_ref.actor.strategy", STRATEGIES)
    rollout = _choice(config, "actor_rollout_ref.rollout.name", ROLLOUTS)
    rollout_tp = _int(config, "actor_rollout_ref.rollout.tensor_model_parallel_size")
    hybrid = _bool(config, "actor_rollout_ref.hybrid_engine")
    per_node = _int(config, "trainer.n_gpus_per_node")
    nodes = _int(config, "trainer.nnodes")
    gpus = per_node * nodes
    # Separate placement (fully_async_policy) gives the rollout its own top-level section.
    rollout_gpus = gpus if hybrid else (_int(config, "rollout.n_gpus_per_node")
                                        * _int(config, "rollout.nnodes"))
    if rollout_tp < 1 or rollout_gpus % rollout_tp:
        raise ConfigError(f"actor_rollout_ref.rollout.tensor_model_parallel_size {rollout_tp} "
                          f"does not divide the {rollout_gpus} rollout GPUs")
    if strategy == "megatron":
        tp = _int(config, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size")
        pp = _int(config, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size")
        if tp < 1 or pp < 1 or gpus % (tp * pp):
            raise ConfigError(f"megatron TP {tp} x PP {pp} does not divide the {gpus} GPUs")
        shards = tp * pp
        layout = f"Megatron TP{tp} x PP{pp} x DP{gpus // shards} on {gpus} GPUs"
    else:
        size = _int(config, "actor_rollout_ref.actor.fsdp_config.fsdp_size", -1)
        shards = gpus if size in (-1, 0) else size
        if shards < 1 or gpus % shards:
            raise ConfigError(f"actor_rollout_ref.actor.fsdp_config.fsdp_size {size} "
                              f"does not divide the {gpus} GPUs")
        layout = (f"{strategy.upper()} on {gpus} GPUs, every parameter sharded over {shards} "
                  f"(fsdp_size {size})")
    path = get(config, "actor_rollout_ref.model.path", None)
    return Run(strategy, rollout, rollout_tp, hybrid, per_node, nodes, rollout_gpus, shards, layout,
               None if path is None else str(path))


# ----------------------------------------------------------------------------- the answer


def explain(run: Run, params: float | None, dtype: str = "bf16", size_from: str = "") -> list[str]:
    """The explanation, one printed line per entry."""
    engines = run.rollout_gpus // run.rollout_tp
    lines = [
        f"trainer    actor.strategy = {run.strategy}: {run.train_layout}",
        f"           worker: {_worker(run)}",
        f"rollout    rollout.name = {run.rollout}, tensor_model_parallel_size = {run.rollout_tp}: "
        f"{engines} engine(s) of TP{run.rollout_tp} on {run.rollout_gpus} GPUs",
    ]
    if run.hybrid:
        lines += [
            f"placement  hybrid_engine = true: colocated, training and rollout take turns on the "
            f"same {run.gpus} GPUs",
            "each round rollout_mode() on every GPU, tensor by tensor:",
            "           1. " + _gather_step(run),
            f"           2. hand the full tensor to the {run.rollout} worker on the same GPU through "
            "CUDA IPC (no copy over a link)",
            f"           3. the engine's weight loader keeps its 1/{run.rollout_tp} slice; the KV "
            "cache is freed and rebuilt around each phase (free_cache_engine)",
        ]
        strategy, shards = "gather", run.train_shards
        link = "nvlink" if shards <= run.gpus_per_node else "ib"
        what = f"gather (1 - 1/{shards} of the model)"
    else:
        lines += [
            f"placement  hybrid_engine = false: separate, {run.gpus} GPUs train and another "
            f"{run.rollout_gpus} generate at the same time; the standard PPO trainer refuses this "
            "(ray_trainer.py asserts hybrid_engine), verl's experimental fully_async_policy runs it",
            "each round sync_rollout_weights(): trainer rank 0 broadcasts every full tensor to all "
            "rollout GPUs over a collective group (NCCL); each engine's loader keeps its slice",
        ]
        strategy, shards, link = "broadcast", 1, "ib"
        what = "broadcast (the whole model)"
    if params is None:
        lines.append("model      size unknown: the model path names no size; pass --params "
                     "(e.g. --params 7e9) for bytes and times")
        return lines
    total = refit_cost.model_bytes(params, dtype)
    moved = refit_cost.bytes_per_gpu(params, strategy, shards=shards, dtype=dtype)
    kept = refit_cost.bytes_per_gpu(params, "slice", gpus=run.rollout_tp, dtype=dtype)
    gb = refit_cost.GB
    lines += [
        f"model      {params / 1e9:g}B parameters{size_from}, {dtype}: {total / gb:.3g} GB per copy",
        f"moves      per GPU per round: {what} = {moved / gb:.3g} GB over "
        f"{refit_cost.LINKS[link].name} >= {_time(moved, link)}",
        f"keeps      per GPU: its rollout slice, 1/{run.rollout_tp} of the model = "
        f"{kept / gb:.3g} GB (sending only this, as Megatron's resharding planner does: "
        f">= {_time(kept, link)})",
    ]
    return lines


def _worker(run: Run) -> str:
    megatron = run.strategy == "megatron"
    if run.hybrid:
        return f"verl/workers/{'megatron' if megatron else 'fsdp'}_workers.py AsyncActorRolloutRefWorker"
    return (f"verl/experimental/fully_async_policy/{'megatron_worker' if megatron else 'fsdp_workers'}"
            ".py DetachActorWorker / DetachAsyncRolloutWorker")


def _time(nbytes: float, link: str) -> str:
    ms = refit_cost.seconds(nbytes, link) * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"  # always ms: 2800 ms, 4.44 ms


def _gather_step(run: Run) -> str:
    if run.strategy == "megatron":
        return ("broadcast each tensor across pipeline stages and all-gather it across TP "
                "(utils/megatron_utils.py per_tensor_generator, or the Megatron-Bridge export), "
                "split linear_qkv into q/k/v and rename to Hugging Face names")
    return (f"all-gather each parameter from its {run.train_shards} FSDP shards "
            "(DTensor.full_tensor()) and rename to Hugging Face names")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snippets.rl.verl_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a verl training config (YAML)")
    parser.add_argument("--params", help="model size, e.g. 7e9 or 7B (default: from the model path)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(refit_cost.DTYPE_BYTES))
    args = parser.parse_args(argv)
    try:
        params, size_from = None, ""
        if args.params is not None:
            params = refit_cost.params_from_name(args.params) or _number(args.params)
            size_from = " (--params)"
        config = load(args.config)
        try:
            run = read_run(config)
        except ConfigError as err:
            raise ConfigError(f"{args.config}: {err}") from None
        if params is None and run.model_path:
            params = refit_cost.params_from_name(run.model_path)
            size_from = f" (from model.path {run.model_path})"
        lines = [f"verl config {args.config}"] + explain(run, params, args.dtype, size_from)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(_wrap(line) for line in lines))
    return 0


def _wrap(line: str, width: int = 80) -> str:
    """Fold a long line under its own text: column 11 (after the label) or after a step number."""
    step = re.match(r"\s*\d+\.\s", line)
    indent = " " * (len(step.group(0)) if step else 11)
    return textwrap.fill(line, width=width, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--params {text!r} is not a number like 7e9 or 7B") from None
    if value <= 0:
        raise ConfigError(f"--params {text!r} must be positive")
    return value


if __name__ == "__main__":
    sys.exit(main())
