"""What the command knows of verl and NeMo RL, as data, each with the commit it was read at.

verl's launch scripts override only a few keys; the rest come from the config the trainer's
``@hydra.main`` names and the ``model_engine`` it picks. :data:`VERL_ENGINE_DEFAULTS` keeps, for each
engine, the value of every key the command reads -- read from verl's own generated configs
(``verl/trainer/config/_generated_ppo*_trainer.yaml``, which verl regenerates from the Hydra tree
and checks in CI); :data:`VERL_CONFIGS` adds what the experimental configs change. Nothing else of
those files is kept.

:data:`NEMO_RL_CODE` names where NeMo RL moves the weights (``refit_policy_generation`` and the
synchronizers), so a report can point at the code. ``tests/unit/test_weight_sync_sources.py``
checks both against checkouts when given ``--verl-src`` / ``--nemo-rl-src``.
"""

from __future__ import annotations

VERL_COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"  # verl-project/verl, 2026-08-22: the newest read
NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"  # NVIDIA-NeMo/RL, 2026-08-22

# verl's trainer config is ppo_trainer.yaml; ``model_engine=dp|megatron|torchtitan|veomni`` (a Hydra
# config group, ``@package _global_``) picks the actor / ref / critic configs. verl checks in one
# flattened file per engine (verl/trainer/config/_generated_ppo*_trainer.yaml, made by
# scripts/print_cfg.py ... model_engine=X); these are their values for the keys the command reads.
_COMMON = {
    "actor_rollout_ref.hybrid_engine": True,
    "actor_rollout_ref.model.path": "~/models/deepseek-llm-7b-chat",
    "actor_rollout_ref.rollout.name": "???",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.nnodes": 0,
    "actor_rollout_ref.rollout.n_gpus_per_node": "${oc.select:trainer.n_gpus_per_node,8}",
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": 2048,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.use_v1": True,
    "trainer.v1.trainer_mode": "sync",
    "trainer.v1.separate_async.parameter_sync_step": 4,
}
_ENGINES = {  # model_engine -> its generated config and what it adds to _COMMON
    "dp": (
        "verl/trainer/config/_generated_ppo_trainer.yaml",
        {"actor_rollout_ref.actor.strategy": "fsdp", "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1},
    ),
    "megatron": (
        "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
        {
            "actor_rollout_ref.actor.strategy": "megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 1,
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 1,
            "actor_rollout_ref.actor.megatron.context_parallel_size": 1,
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 1,
            "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size": None,
        },
    ),
    "torchtitan": (
        "verl/trainer/config/_generated_ppo_torchtitan_trainer.yaml",
        {
            "actor_rollout_ref.actor.strategy": "torchtitan",
            "actor_rollout_ref.actor.torchtitan.tensor_parallel_size": 1,
            "actor_rollout_ref.actor.torchtitan.pipeline_parallel_size": 1,
            "actor_rollout_ref.actor.torchtitan.context_parallel_size": 1,
            "actor_rollout_ref.actor.torchtitan.expert_parallel_size": 1,
        },
    ),
    "veomni": (
        "verl/trainer/config/_generated_ppo_veomni_trainer.yaml",
        {
            "actor_rollout_ref.actor.strategy": "veomni",
            "actor_rollout_ref.actor.veomni.fsdp_size": -1,
            "actor_rollout_ref.actor.veomni.ulysses_parallel_size": 1,
            "actor_rollout_ref.actor.veomni.expert_parallel_size": 1,
        },
    ),
}
VERL_ENGINE_DEFAULTS: dict[str, dict] = {e: {**_COMMON, **extra} for e, (_, extra) in _ENGINES.items()}
VERL_GENERATED = {e: path for e, (path, _) in _ENGINES.items()}
# the actor config each engine's group selects (actor@actor_rollout_ref.actor: ${model_engine}_actor)
VERL_ACTORS = {f"{e}_actor": e for e in _ENGINES}

# The experimental separate-placement configs (verl/experimental/<package>/config/<name>.yaml):
# defaults [ppo_trainer or ppo_megatron_trainer, _self_], a top-level ``rollout`` section with the
# rollout's own nodes and GPUs, and checkpoint_engine.backend nccl. They do not set hybrid_engine.
_SEPARATE = {
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
}
# config name -> (model_engine it starts from, what it adds)
VERL_CONFIGS: dict[str, tuple[str, dict]] = {
    "ppo_trainer": ("dp", {}),
    "ppo_megatron_trainer": ("megatron", {}),  # defaults [ppo_trainer, override model_engine: megatron]
    "fully_async_ppo_trainer": ("dp", _SEPARATE),
    "fully_async_ppo_megatron_trainer": ("megatron", _SEPARATE),
    "one_step_off_ppo_trainer": ("dp", _SEPARATE),
    "one_step_off_ppo_megatron_trainer": ("megatron", _SEPARATE),
}
VERL_EXPERIMENTAL_CONFIGS = {
    "fully_async_ppo_trainer": "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
    "fully_async_ppo_megatron_trainer": (
        "verl/experimental/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml"
    ),
    "one_step_off_ppo_trainer": "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
    "one_step_off_ppo_megatron_trainer": (
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml"
    ),
}

# module run by the launch script -> (config_name of its @hydra.main, file:line of that decorator,
# the experimental package that runs it with hybrid_engine=false, or None)
VERL_MAINS = {
    "verl.trainer.main_ppo": ("ppo_trainer", "verl/trainer/main_ppo.py:166", None),
    "verl.experimental.fully_async_policy.fully_async_main": (
        "fully_async_ppo_trainer",
        "verl/experimental/fully_async_policy/fully_async_main.py:222",
        "fully_async_policy",
    ),
    "verl.experimental.one_step_off_policy.main_ppo": (
        "one_step_off_ppo_trainer",
        "verl/experimental/one_step_off_policy/main_ppo.py:109",
        "one_step_off_policy",
    ),
}

# checkpoint_engine.backend -> how it moves the weights (verl/checkpoint_engine/README.md's table,
# "Topology" column, and the engine files); the registry is CheckpointEngineRegistry.register(...)
VERL_CHECKPOINT_ENGINES = {
    "naive": "same GPU: each trainer rank hands full tensors to its rollout server through CUDA IPC",
    "nccl": (
        "NCCL: the trainer ranks gather full tensors, trainer rank 0 broadcasts them bucket by bucket "
        "(update_weights_bucket_megabytes) to every rollout GPU, the other sending ranks join each "
        "broadcast as relays (verl/checkpoint_engine/nccl_checkpoint_engine.py:315, :407)"
    ),
    "nixl": "NIXL: all-gather, then a ring of point-to-point transfers between rollout GPUs",
    "mooncake": "Mooncake transfer engine: all-gather, then a ring of point-to-point transfers",
    "kimi_ckpt_engine": "Mooncake P2P to one rollout worker, then a broadcast to the rest",
    "delta_sharded": (
        "only the changed elements: each trainer rank diffs its own shard, rank 0 gathers the changes "
        "and broadcasts them over NCCL as values plus int32 positions (about 1-3 % of the elements "
        "change per step, verl's docs)"
    ),
}

# (file:line, the name defined or asserted on that line) in verl at VERL_COMMIT
VERL_CODE = {
    "v0_hybrid": ("verl/trainer/ppo/ray_trainer.py:334", "Currently, only support hybrid engine"),
    "naive_forced": ("verl/trainer/ppo/v1/trainer_base.py:357", 'checkpoint_engine_config.backend = "naive"'),
    "separate_nnodes": ("verl/trainer/ppo/v1/trainer_separate_async.py:59", "nnodes must be > 0"),
    "separate_backend": ("verl/trainer/ppo/v1/trainer_separate_async.py:63", 'backend != "naive"'),
    "separate_manager": (
        "verl/trainer/ppo/v1/trainer_separate_async.py:144",
        "standalone_checkpoint_manager",
    ),
    "update_weights": ("verl/workers/engine_workers.py:727", "async def update_weights"),
    "delta_sglang": ("verl/checkpoint_engine/base.py:326", 'backend == "delta_sharded"'),
    "delta_wire": (
        "verl/checkpoint_engine/delta_checkpoint_engine.py:632",
        "wire_bytes += int(aidx.numel()) * (4 + aval.element_size())",
    ),
    "megatron_export": ("verl/workers/engine/megatron/transformer_impl.py:1025", "def get_per_tensor_param"),
    "fsdp_export": ("verl/workers/engine/fsdp/transformer_impl.py:954", "def get_per_tensor_param"),
    "fully_async_hybrid": (
        "verl/experimental/fully_async_policy/fully_async_trainer.py:76",
        "assert not self.hybrid_engine",
    ),
    "one_step_hybrid": (
        "verl/experimental/one_step_off_policy/ray_trainer.py:88",
        "assert not self.hybrid_engine",
    ),
    "nccl_send": ("verl/checkpoint_engine/nccl_checkpoint_engine.py:315", "async def send_weights"),
    "nccl_relay": ("verl/checkpoint_engine/nccl_checkpoint_engine.py:407", "async def _relay_weights"),
    "rollout_registry": ("verl/workers/rollout/replica.py:378", 'RolloutReplicaRegistry.register("vllm"'),
}


def verl_code(name: str) -> str:
    where, _ = VERL_CODE[name]
    return where


# Which versions go together, each read at the commit named (README "Which versions go together").
VERSIONS = [  # (framework at the commit read, Megatron Core, Megatron-Bridge, where that is pinned)
    (
        "verl 1dda039 (0.10.0.dev, 2026-08-22)",
        "core_v0.18.0",
        "0.5.2 (and mbridge)",
        "verl pyproject.toml:399 (megatron-core git tag), :171 (megatron-bridge==0.5.2)",
    ),
    (
        "NeMo RL 7ea279a (0.6.0 in package_info.py, 2026-08-22)",
        "0.20.0 (Megatron-LM 14346b6, 2026-08-12, no release tag)",
        "0.7.0 (8c46dc4, 2026-08-14)",
        "NeMo RL's 3rdparty/Megatron-Bridge-workspace/Megatron-Bridge submodule, then Bridge's "
        "3rdparty/Megatron-LM submodule; versions from their package_info.py",
    ),
    ("this project", "0.19.0 (core_v0.19.0)", "not used", "pyproject.toml (megatron-core==0.19.0)"),
]

# (file:line, the name defined or called on that line) in NeMo RL at NEMO_RL_COMMIT
NEMO_RL_CODE = {
    "inheritance": ("nemo_rl/utils/config.py:51", "load_config_with_inheritance"),
    "refit": ("nemo_rl/algorithms/grpo.py:2316", "refit_policy_generation"),
    "ipc_sglang": ("nemo_rl/algorithms/grpo.py:2368", "stream_weights_via_http"),
    "ipc_zmq": ("nemo_rl/algorithms/grpo.py:2380", "stream_weights_via_ipc_zmq"),
    "no_sglang_separate": ("nemo_rl/algorithms/grpo.py:2392", "SGLangGeneration"),
    "nccl_broadcast": ("nemo_rl/algorithms/grpo.py:2396", "broadcast_weights_for_collective"),
    "separate_gpus": ("nemo_rl/algorithms/grpo.py:860", "inference_resources"),
    "transport": ("nemo_rl/algorithms/grpo.py:1300", "refit_transport"),
    "transport_vllm_only": ("nemo_rl/algorithms/grpo.py:1524", "refit_transport"),
    "synchronizer": ("nemo_rl/weight_sync/factory.py:37", "create_weight_synchronizer"),
    "megatron_sync": ("nemo_rl/weight_sync/factory.py:111", "MegatronWeightSynchronizer"),
    "nccl_reshard": ("nemo_rl/weight_sync/factory.py:135", "NcclReshardWeightSynchronizer"),
    "checkpoint_engine": ("nemo_rl/weight_sync/factory.py:97", "CheckpointEngineWeightSynchronizer"),
    "checkpoint_engine_colocated": ("nemo_rl/weight_sync/factory.py:81", "checkpoint-engine refit is only"),
    "checkpoint_engine_vllm": ("nemo_rl/weight_sync/factory.py:87", "checkpoint-engine non-colocated refit"),
    "sparse": (
        "nemo_rl/weight_sync/vllm_remote_sparse_weight_synchronizer.py:85",
        "VllmRemoteSparseWeightSynchronizer",
    ),
    "sparse_positions": ("nemo_rl/utils/weight_transfer_sparse_codec.py:190", "_encode_explicit_locations"),
    "sparse_check": (
        "nemo_rl/weight_sync/vllm_remote_sparse_weight_synchronizer.py:47",
        "validate_vllm_remote_sparse_refit",
    ),
    "megatron_layout": ("nemo_rl/models/generation/megatron/config.py:75", "merged_inference_megatron_cfg"),
    "megatron_shared": (
        "nemo_rl/models/generation/megatron/config.py:100",
        "dedicated_inference_megatron_cfg",
    ),
    "megatron_reshard_local": (
        "nemo_rl/models/generation/megatron/megatron_worker.py:917",
        "_reshard_into_inference_model",
    ),
    "megatron_reshard_remote": (
        "nemo_rl/models/generation/megatron/megatron_worker.py:876",
        "swap_weights_via_reshard",
    ),
}


# policy.generation.refit_transport values NeMo RL's guide lists (docs/guides/refit.md at
# NEMO_RL_COMMIT); "module:ClassName" names a checkpoint-engine plugin (checkpoint-engines.md).
NEMO_RL_TRANSPORTS = (None, "nccl_reshard", "vllm_zmq_sparse", "vllm_s3_sparse", "nixl")
# Named only in the docs of a NeMo RL release newer than NEMO_RL_COMMIT (not in this source).
NEMO_RL_DOCS_ONLY = {"mcore": "NeMo RL 0.8's docs (wake-reshard when colocated, native refit otherwise)"}


def nemo_rl_code(name: str) -> str:
    """``path:line (name)`` of one NEMO_RL_CODE entry, for a report line."""
    where, symbol = NEMO_RL_CODE[name]
    return f"{where} {symbol}"
