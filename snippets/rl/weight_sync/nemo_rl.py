"""How a NeMo RL run moves its weights every round, from its YAML config.

NeMo RL configs inherit: ``defaults: grpo_math_1B.yaml`` (or a list) names parent files relative
to the file, each parent loaded the same way first, and the child merged on top -- sections merge
key by key, ``_override_: true`` replaces a whole section, a ``???`` in a child keeps the parent's
value (``nemo_rl/utils/config.py`` ``load_config_with_inheritance``). ``${...}`` interpolations
are OmegaConf's (:mod:`values`).

What decides the refit, read in NeMo RL at :data:`facts.NEMO_RL_COMMIT`:

* the trainer: ``policy.megatron_cfg.enabled`` (Megatron Core through Megatron Bridge, TP / PP /
  CP / EP) or ``policy.dtensor_cfg.enabled`` (DTensor / FSDP2, TP / CP);
* the engine: ``policy.generation.backend`` -- ``vllm``, ``sglang``, ``megatron``, ``trtllm``,
  ``dynamo`` -- with its TP / PP;
* ``policy.generation.colocated.enabled`` and ``cluster`` (with ``colocated.resources`` for the
  GPUs a separate engine takes);
* ``policy.generation.refit_transport`` (null: CUDA IPC colocated, NCCL broadcast otherwise).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from snippets.rl.weight_sync import facts
from snippets.rl.weight_sync.report import UNSET, Reader, Sparse, fmt, mul, number
from snippets.rl.weight_sync.values import MANDATORY, ConfigError, Unknown, read_yaml

BACKENDS = ("vllm", "sglang", "megatron", "trtllm", "dynamo")
GEN_SIZES = {  # backend -> (its TP key, its PP key) under policy.generation
    "vllm": ("vllm_cfg.tensor_parallel_size", "vllm_cfg.pipeline_parallel_size"),
    "dynamo": ("vllm_cfg.tensor_parallel_size", "vllm_cfg.pipeline_parallel_size"),
    "sglang": ("sglang_cfg.tp_size", "sglang_cfg.pp_size"),
    "trtllm": ("trtllm_cfg.tensor_parallel_size", None),
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8": "fp8"}
SHORT = facts.NEMO_RL_COMMIT[:7]


def code(name: str) -> str:
    return facts.nemo_rl_code(name)


# ----------------------------------------------------------------------------- loading


def load(path: str, _chain: tuple = ()) -> tuple[dict, list[str]]:
    """The merged config of ``path`` and the files it inherits from, parents first."""
    resolved = str(Path(path).resolve())
    if resolved in _chain:
        raise ConfigError(f"{path}: defaults: chain comes back to {Path(path).name}")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} is neither a verl nor a NeMo RL config: expected a mapping of "
            f"sections, got {type(data).__name__}"
        )
    data = copy.deepcopy(data)
    parents = data.pop("defaults", None)
    if parents is None:
        return data, [path]
    base: dict = {}
    files: list[str] = []
    if not isinstance(parents, (str, list)):
        raise ConfigError(f"{path}: defaults: is {parents!r}; expected a file name or a list of them")
    for parent in [parents] if isinstance(parents, str) else parents:
        parent_path = Path(str(parent)) if str(parent).startswith("/") else Path(path).parent / str(parent)
        if not parent_path.is_file():
            raise ConfigError(f"{path}: defaults: {parent} is not a file ({parent_path})")
        tree, chain = load(str(parent_path), _chain + (resolved,))
        base = merge(base, tree)
        files += chain
    return merge(base, data), files + [path]


def merge(base: dict, override: dict) -> dict:
    """``override`` on ``base`` as NeMo RL's merge_with_override + OmegaConf.merge do."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value == MANDATORY:
            out.setdefault(key, value)
            continue
        if isinstance(value, dict):
            value = dict(value)
            if value.pop("_override_", False) or not isinstance(out.get(key), dict):
                out[key] = merge({}, value)
                continue
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def is_nemo_rl(tree: dict) -> bool:
    policy = tree.get("policy")
    return isinstance(policy, dict) and any(
        k in policy for k in ("generation", "dtensor_cfg", "megatron_cfg")
    )


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    trainer: str  # "megatron", "dtensor" or "neither"
    sizes: dict  # tp / pp / cp / ep of the trainer
    backend: object
    gen_tp: object
    gen_pp: object
    colocated: object
    nodes: object
    gpus_per_node: object
    train_gpus: object
    gen_gpus: object
    transport: object
    refit_backend: object
    model: str | None
    precision: object
    gen_ep: object = 1

    @property
    def shards(self):
        if self.trainer == "megatron":
            return mul(self.sizes["tp"], self.sizes["pp"])
        if self.trainer == "dtensor" and number(self.train_gpus) and number(self.sizes["cp"]):
            return self.train_gpus // self.sizes["cp"]
        return UNSET


def read_run(reader: Reader) -> Run:
    p = "policy."
    megatron = reader.bool(p + "megatron_cfg.enabled", False)
    dtensor = reader.bool(p + "dtensor_cfg.enabled", False)
    if megatron is True:
        trainer, cfg = "megatron", p + "megatron_cfg."
        sizes = {
            k: reader.size(cfg + key, 1)
            for k, key in (
                ("tp", "tensor_model_parallel_size"),
                ("pp", "pipeline_model_parallel_size"),
                ("cp", "context_parallel_size"),
                ("ep", "expert_model_parallel_size"),
            )
        }
    elif dtensor is True:
        trainer, cfg = "dtensor", p + "dtensor_cfg."
        sizes = {
            k: reader.size(cfg + key, 1)
            for k, key in (("tp", "tensor_parallel_size"), ("cp", "context_parallel_size"))
        }
    else:
        trainer, sizes = "neither", {}
    gen = p + "generation."
    backend = reader.choice(gen + "backend", BACKENDS)
    if backend == "megatron":
        mcore = gen + "mcore_generation_config."
        gen_tp, gen_pp, gen_ep = (
            reader.size(mcore + key, sizes.get(short, 1))
            for short, key in (
                ("tp", "tensor_model_parallel_size"),
                ("pp", "pipeline_model_parallel_size"),
                ("ep", "expert_model_parallel_size"),
            )
        )
    elif backend in GEN_SIZES:
        tp_key, pp_key = GEN_SIZES[backend]
        gen_tp = reader.size(gen + tp_key, 1)
        gen_pp = reader.size(gen + pp_key, 1) if pp_key else 1
    else:
        gen_tp = gen_pp = UNSET
    if backend != "megatron":
        gen_ep = 1
    colocated = reader.bool(gen + "colocated.enabled", True)
    per_node, nodes = reader.size("cluster.gpus_per_node"), reader.size("cluster.num_nodes")
    if colocated is True:
        train = gen_gpus = mul(per_node, nodes)
    elif colocated is False:
        train, gen_gpus = _separate_gpus(reader, per_node, nodes)
    else:
        train = gen_gpus = UNSET
    ranks = mul(*(sizes[k] for k in ("tp", "pp", "cp") if k in sizes))
    if sizes and number(ranks) and number(train) and train % ranks:
        names = " x ".join(f"{k.upper()} {sizes[k]}" for k in ("tp", "pp", "cp") if k in sizes)
        raise ConfigError(f"{cfg}: {names} does not divide the {train} training GPUs")
    engine = mul(gen_tp, gen_pp)
    if number(engine) and number(gen_gpus) and (engine < 1 or gen_gpus % engine):
        raise ConfigError(
            f"generation TP {gen_tp} x PP {gen_pp} does not divide the {gen_gpus} generation GPUs"
        )
    transport = reader.value(gen + "refit_transport", None)
    refit_backend = reader.value(gen + "mcore_generation_config.refit_backend", "nccl")
    model = reader.value(p + "model_name", None)
    precision = reader.value(p + "precision", "bfloat16")
    return Run(
        trainer,
        sizes,
        backend,
        gen_tp,
        gen_pp,
        colocated,
        nodes,
        per_node,
        train,
        gen_gpus,
        transport,
        refit_backend,
        None if model is None else str(model),
        precision,
        gen_ep,
    )


def _separate_gpus(reader: Reader, per_node, nodes):
    """Training and generation GPUs when generation has its own (grpo.py setup, at line 860)."""
    res = "policy.generation.colocated.resources."
    if nodes == 1:
        gen = reader.size(res + "gpus_per_node", None)
        if gen is None:
            raise ConfigError(
                f"{res}gpus_per_node is null: on one node NeMo RL needs it to give generation its own GPUs"
            )
        train = per_node - gen if number(per_node) and number(gen) else UNSET
        if number(train) and train <= 0:
            raise ConfigError(f"{res}gpus_per_node {gen} leaves no training GPU of {per_node}")
        return train, gen
    gen_nodes = reader.size(res + "num_nodes", None)
    if gen_nodes is None:
        raise ConfigError(
            f"{res}num_nodes is null: on several nodes NeMo RL needs it to give generation its own nodes"
        )
    train_nodes = nodes - gen_nodes if number(nodes) and number(gen_nodes) else UNSET
    if number(train_nodes) and train_nodes <= 0:
        raise ConfigError(f"{res}num_nodes {gen_nodes} leaves no training node of {nodes}")
    return mul(train_nodes, per_node), mul(gen_nodes, per_node)


# ----------------------------------------------------------------------------- the answer


def explain(run: Run) -> tuple[list[str], tuple, tuple | None]:
    s = {k: fmt(v) for k, v in run.sizes.items()}
    if run.trainer == "megatron":
        dp = (
            run.train_gpus // (mul(run.sizes["tp"], run.sizes["pp"], run.sizes["cp"]))
            if number(run.train_gpus) and number(mul(*run.sizes.values()))
            else UNSET
        )
        trainer = (
            f"policy.megatron_cfg.enabled = true: Megatron Core through Megatron Bridge, "
            f"TP{s['tp']} x PP{s['pp']} x CP{s['cp']} x DP{fmt(dp)} (EP{s['ep']}) on "
            f"{fmt(run.train_gpus)} GPUs"
        )
    elif run.trainer == "dtensor":
        trainer = (
            f"policy.dtensor_cfg.enabled = true: DTensor (FSDP2) TP{s['tp']} x CP{s['cp']} "
            f"on {fmt(run.train_gpus)} GPUs, every parameter sharded over {fmt(run.shards)}"
        )
    else:
        trainer = "neither policy.dtensor_cfg.enabled nor policy.megatron_cfg.enabled is true"
    engine = mul(run.gen_tp, run.gen_pp)
    engines = run.gen_gpus // engine if number(engine) and number(run.gen_gpus) else UNSET
    lines = [
        f"trainer    {trainer}",
        f"rollout    generation.backend = {fmt(run.backend)}: {fmt(engines)} engine(s) of "
        f"TP{fmt(run.gen_tp)} x PP{fmt(run.gen_pp)} on {fmt(run.gen_gpus)} GPUs",
    ]
    cluster = f"{fmt(run.nodes)} node(s) x {fmt(run.gpus_per_node)} GPUs"
    if run.colocated is True:
        lines.append(
            f"placement  colocated.enabled = true: training and generation take turns on "
            f"the same {fmt(run.train_gpus)} GPUs ({cluster})"
        )
    elif run.colocated is False:
        lines.append(
            f"placement  colocated.enabled = false: {fmt(run.train_gpus)} GPUs train, "
            f"{fmt(run.gen_gpus)} others generate ({cluster}; colocated.resources, "
            f"{facts.NEMO_RL_CODE['separate_gpus'][0]})"
        )
    else:
        lines.append("placement  colocated.enabled unknown: CUDA IPC or NCCL is not decided")
        return lines, ("CUDA IPC or NCCL", "gather", UNSET, None), None
    lines.append(f"each round refit_policy_generation ({code('refit')}):")
    steps, moved, kept = _refit(run)
    lines += [f"           {i}. {step}" for i, step in enumerate(steps, 1)]
    return lines, moved, kept


def _refit(run: Run):
    if (
        run.transport is not None
        and not isinstance(run.transport, Unknown)
        and run.backend != "vllm"
        and not isinstance(run.backend, Unknown)
        and str(run.transport) not in facts.NEMO_RL_DOCS_ONLY
    ):
        raise ConfigError(
            f"refit_transport {run.transport} works only with generation.backend vllm, not "
            f"{run.backend} ({code('transport_vllm_only')})"
        )
    tp = fmt(run.gen_tp)
    slice_gpus = mul(run.gen_tp, run.gen_pp)
    if run.trainer == "megatron":
        gather = (
            "export each tensor to Hugging Face form through Megatron Bridge (all-gather "
            "across TP, broadcast across PP)"
        )
    else:
        gather = f"gather each parameter from its {fmt(run.shards)} shards (DTensor.full_tensor())"
    if run.backend == "megatron":
        if run.colocated is True:
            same = all(
                run.sizes.get(k, 1) == v
                for k, v in (("tp", run.gen_tp), ("pp", run.gen_pp), ("ep", run.gen_ep))
            )
            if same and run.sizes.get("cp", 1) == 1:
                return (
                    [
                        f"nothing moves: generation runs on the training model itself, the layouts "
                        f"match ({code('megatron_shared')} returns None)"
                    ],
                    ("nothing (the same model)", "none", 0, "nvlink"),
                    None,
                )
            return (
                [
                    f"reshard into a second model in the inference layout TP{tp} x "
                    f"PP{fmt(run.gen_pp)} on the same GPUs, at every wake "
                    f"({code('megatron_reshard_local')})"
                ],
                ("its slice of the inference layout", "slice", slice_gpus, "nvlink"),
                None,
            )
        return (
            [
                f"swap_weights_via_reshard across the two worlds over {fmt(run.refit_backend)} "
                f"(mcore_generation_config.refit_backend; {code('megatron_reshard_remote')}); "
                "each generation rank receives only its slice"
            ],
            ("its slice of the inference layout", "slice", slice_gpus, "ib"),
            None,
        )
    if run.colocated is True:
        if run.transport not in (None, "nccl_reshard") and not isinstance(run.transport, Unknown):
            raise ConfigError(
                f"refit_transport {run.transport} needs colocated.enabled=false; NeMo RL raises for a "
                f"colocated run ({code('checkpoint_engine_colocated')}; docs/guides/refit.md)"
            )
        if run.backend == "sglang":
            send = (
                f"stream_weights_via_http: CUDA IPC handles, bucket by bucket, to the SGLang "
                f"server on the same GPU over HTTP ({code('ipc_sglang')})"
            )
        else:
            send = (
                f"stream_weights_via_ipc_zmq: CUDA IPC handles, bucket by bucket over ZMQ, to "
                f"the {fmt(run.backend)} worker on the same GPU ({code('ipc_zmq')})"
            )
        link = (
            ("nvlink" if run.shards <= run.gpus_per_node else "ib")
            if number(run.shards) and number(run.gpus_per_node)
            else None
        )
        return (
            [gather, send, f"the engine's loader keeps its 1/{tp} slice"],
            (f"gather (1 - 1/{fmt(run.shards)} of the model)", "gather", run.shards, link),
            (run.gen_tp, link),
        )
    if run.backend == "sglang":
        return (
            [
                f"none: NeMo RL does not run SGLang apart from training, refit raises "
                f"NotImplementedError ({code('no_sglang_separate')})"
            ],
            ("nothing", "none", 0, None),
            None,
        )
    transport = run.transport
    if isinstance(transport, Unknown):
        transport = None  # the reader has said so; the default path below is the one NeMo RL takes for null
    if transport == "nccl_reshard":
        if run.backend != "vllm" or run.trainer != "megatron":
            raise ConfigError(
                "refit_transport nccl_reshard needs a Megatron policy and vLLM generation "
                f"(docs/guides/refit.md); this run has {run.trainer} and {fmt(run.backend)}"
            )
        return (
            [
                f"refit_transport = nccl_reshard: each generation rank receives only its slice "
                f"over NCCL ({code('nccl_reshard')})"
            ],
            ("its slice", "slice", slice_gpus, "ib"),
            (run.gen_tp, "ib"),
        )
    if transport in ("vllm_zmq_sparse", "vllm_s3_sparse"):
        if run.backend != "vllm" or run.trainer != "megatron":
            raise ConfigError(
                f"refit_transport {transport} needs a non-colocated Megatron policy and vLLM generation; "
                f"NeMo RL refuses {run.trainer} with {fmt(run.backend)} ({code('sparse_check')})"
            )
        via = "a ZeroMQ relay over TCP" if transport == "vllm_zmq_sparse" else "shared S3 object storage"
        return (
            [
                gather,
                f"refit_transport = {transport}: only the elements that changed since the last refit "
                f"travel, through {via} ({code('sparse')}); each engine applies the delta to its slice",
            ],
            (
                "only the changed elements (1-3 % of them assumed: verl's docs' figure)",
                "delta",
                Sparse(
                    2,
                    "a 2 B gap to the previous change (uint16; 4 B when a gap passes 65535, none for "
                    "a contiguous run), before zstd level 1",
                    code("sparse_positions"),
                    "no first full sync: both sides load the same checkpoint",
                ),
                "ib",
            ),
            (run.gen_tp, "ib"),
        )
    if transport is not None:
        if str(transport) in facts.NEMO_RL_DOCS_ONLY:
            raise ConfigError(
                f"refit_transport {transport} is named in {facts.NEMO_RL_DOCS_ONLY[str(transport)]}, "
                f"not in NeMo RL's source at {SHORT}, which knows null, "
                + ", ".join(t for t in facts.NEMO_RL_TRANSPORTS if t)
                + " and module:ClassName plugins"
            )
        if run.backend != "vllm":
            raise ConfigError(
                f"refit_transport {transport} is a checkpoint engine, which NeMo RL runs only for vLLM "
                f"generation, not {fmt(run.backend)} ({code('checkpoint_engine_vllm')})"
            )
        name = (
            "the NIXL checkpoint engine (UCX/RDMA)"
            if transport == "nixl"
            else f"the checkpoint engine {transport}"
        )
        return (
            [
                gather,
                f"refit_transport = {transport}: {name} sends full weights from the policy workers to "
                f"the generation workers ({code('checkpoint_engine')})",
                f"each engine's loader keeps its 1/{tp} slice",
            ],
            ("the whole model", "broadcast", 1, "ib"),
            (run.gen_tp, "ib"),
        )
    return (
        [
            gather,
            f"broadcast_weights_for_collective: the trainer broadcasts every full tensor "
            f"to all generation GPUs over NCCL ({code('nccl_broadcast')})",
            f"each engine's loader keeps its 1/{tp} slice",
        ],
        ("broadcast (the whole model)", "broadcast", 1, "ib"),
        (run.gen_tp, "ib"),
    )


def dtype(run: Run) -> str:
    return DTYPES.get(str(run.precision), "bf16")
