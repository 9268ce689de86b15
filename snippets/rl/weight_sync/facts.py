"""What the command knows of verl and NeMo RL, as data, each with the commit it was read at.

verl's launch scripts override only a few keys; the rest come from the config the trainer's
``@hydra.main`` names. :data:`VERL_DEFAULTS` keeps, for each such config, the value of every key
the command reads -- read from verl's own generated configs
(``verl/trainer/config/_generated_ppo_trainer.yaml``, ``_generated_ppo_megatron_trainer.yaml``,
which verl regenerates from the Hydra tree and checks in CI) and the experimental configs that
inherit them. Nothing else of those files is kept.

:data:`NEMO_RL_CODE` names where NeMo RL moves the weights (``refit_policy_generation`` and the
synchronizers), so a report can point at the code. ``tests/unit/test_weight_sync_sources.py``
checks both against checkouts when given ``--verl-src`` / ``--nemo-rl-src``.
"""

from __future__ import annotations

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"

_PPO = {  # verl/trainer/config/_generated_ppo_trainer.yaml
    "actor_rollout_ref.hybrid_engine": True,
    "actor_rollout_ref.model.path": "~/models/deepseek-llm-7b-chat",
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1,
    "actor_rollout_ref.rollout.name": "???",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
}
_MEGATRON = {  # verl/trainer/config/_generated_ppo_megatron_trainer.yaml
    **{k: v for k, v in _PPO.items() if "fsdp_config" not in k},
    "actor_rollout_ref.actor.strategy": "megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 1,
}
_SEPARATE = {  # the top-level rollout section of the experimental configs
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
}

VERL_DEFAULTS: dict[str, dict] = {
    "ppo_trainer": _PPO,
    "ppo_megatron_trainer": _MEGATRON,
    # verl/experimental/fully_async_policy/config/*.yaml: defaults [ppo_(megatron_)trainer, _self_]
    "fully_async_ppo_trainer": {**_PPO, **_SEPARATE},
    "fully_async_ppo_megatron_trainer": {**_MEGATRON, **_SEPARATE},
    # verl/experimental/one_step_off_policy/config/*.yaml: likewise
    "one_step_off_ppo_trainer": {**_PPO, **_SEPARATE},
    "one_step_off_ppo_megatron_trainer": {**_MEGATRON, **_SEPARATE},
    # verl/experimental/transfer_queue/config/*.yaml: defaults [ppo_(megatron_)trainer, _self_]
    "transfer_queue_ppo_trainer": _PPO,
    "transfer_queue_ppo_megatron_trainer": _MEGATRON,
}

VERL_GENERATED = {  # where the base values above are read (tests compare them with a checkout)
    "ppo_trainer": "verl/trainer/config/_generated_ppo_trainer.yaml",
    "ppo_megatron_trainer": "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
}

# module run by the launch script -> (config_name of its @hydra.main, file:line of that decorator,
# how the weights travel when hybrid_engine is false)
VERL_MAINS = {
    "verl.trainer.main_ppo": ("ppo_trainer", "verl/trainer/main_ppo.py:35", "refused"),
    "verl.experimental.fully_async_policy.fully_async_main": (
        "fully_async_ppo_trainer",
        "verl/experimental/fully_async_policy/fully_async_main.py:297",
        "fully_async_policy",
    ),
    "verl.experimental.one_step_off_policy.main_ppo": (
        "one_step_off_ppo_trainer",
        "verl/experimental/one_step_off_policy/main_ppo.py:219",
        "one_step_off_policy",
    ),
    "verl.experimental.transfer_queue.main_ppo": (
        "ppo_trainer",
        "verl/experimental/transfer_queue/main_ppo.py:36",
        "refused",
    ),
}

# The separate-placement workers: package -> (FSDP worker file, Megatron worker file,
# (file:line, name) of the per-tensor broadcast)
VERL_SEPARATE_WORKERS = {
    "fully_async_policy": (
        "fsdp_workers.py",
        "megatron_worker.py",
        ("verl/experimental/fully_async_policy/base_detach_sync.py:210", "_sync_vllm_weights"),
    ),
    "one_step_off_policy": (
        "fsdp_workers.py",
        "megatron_workers.py",
        ("verl/experimental/one_step_off_policy/fsdp_workers.py:68", "sync_rollout_weights"),
    ),
}

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
    "synchronizer": ("nemo_rl/weight_sync/factory.py:37", "create_weight_synchronizer"),
    "megatron_sync": ("nemo_rl/weight_sync/factory.py:111", "MegatronWeightSynchronizer"),
    "nccl_reshard": ("nemo_rl/weight_sync/factory.py:135", "NcclReshardWeightSynchronizer"),
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


def nemo_rl_code(name: str) -> str:
    """``path:line (name)`` of one NEMO_RL_CODE entry, for a report line."""
    where, symbol = NEMO_RL_CODE[name]
    return f"{where} {symbol}"
