# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 27 一轮 RL 里训练端做什么
#
# RL 框架每一轮让推理引擎（vLLM、SGLang）采样回答，再让 Megatron 训练一步、把新权重送回去。这两件事之间，训练端还要重算一遍
# log-prob、跑参考模型算 KL，前后还要把自己的显存让给推理引擎。rollout 已经给了每个 token 的 log-prob，训练端为什么还要重算，
# 两边差多少？KL 的几种估计量差在哪？lr 1e-6 的一步到底改了多少权重，能不能只送改了的部分？睡下、醒来时放下了多少显存？

# %% [markdown]
# ## 阅读目标
#
# 1. 说出训练端一轮里的几次前向和一步：重算 old log-prob、参考模型 log-prob、更新、同步，各在 verl / NeMo RL 的哪个函数。
# 2. 说清训练端与 rollout 的 log-prob 为什么对不上、差多少，两个框架用哪些开关修正，MoE 时 Megatron 自己给了什么。
# 3. 会算 k1、k2、k3（`low_var_kl`）三种 KL 估计，说出各自的偏差与方差；参考模型跑在哪、占多少显存。
# 4. 说出 lr 1e-6 的一步让多少 bf16 权重变了位、为什么，以及 hybrid engine 在 rollout 和 refit 前后放下、拿回哪些状态。
#
# **结论**
#
# - 训练端 TP=2 bf16 用 `vocab_parallel_cross_entropy` 重算（log-prob = −loss），对 rollout 平均差 5.93e-03，23.2% 的 token 过 0.01。
# - 差在 bf16 舍入的位置：fp32 只换 TP 最大差 1.43e-06，bf16 只换 TP 就差 5.93e-03；ratio 在 0.9769–1.0257，C = 2 没截断。
# - 精确 KL 为 0.00517 时，k1 的采样标准差 0.10236，k3（`low_var_kl`）只有 0.00830，两者期望都等于精确 KL。
# - lr 1e-6 一步改了 5.78% 的 bf16 权重：矩阵 1.46%–4.47%，零初始化的 bias 全变，LN 权重一个不变。
# - Qwen3-8B、TP2·PP2、8 卡：参考模型每卡 3.81 GiB，训练端可放下的 22.89 GiB，rollout 睡下放出 48.0 GiB。
#
# 先读：[笔记 12](../12_vocab_parallel/)（vocab 并行交叉熵）、[笔记 22](../22_refit_and_resharding/)（refit）、[笔记 26](../26_cost/)（每参数字节）；约 18 分钟。

# %% tags=["hide-input"]
from snippets.experiments import EXPERIMENTS, Parallel
from snippets.experiments import n27_rl_trainer as rl
from snippets.cost.formulas import GIB, MODELS, Config, megatron_args
from snippets.ranks.launch import run_ranks
from snippets.record.listing import listing

import torch
from IPython.display import display
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

import logging
logging.getLogger().setLevel(logging.WARNING)  # importing megatron.training sets the root logger to INFO (note 26)

TINY, PAR = EXPERIMENTS["rl-trainer"].tiny, Parallel(world=2, tp=2)
results = run_ranks(rl.run, 2, TINY, PAR)  # 一次启动：rollout TP=1 bf16 → 训练端 TP=2 → 参考与 KL → 40 步
shares = rl.bits_shares(results)
mats = [shares[k][0] for k in ("embedding", "position", "qkv.weight", "proj.weight", "fc1.weight", "fc2.weight", "output")]
rl.draw_bits(results, title=f"lr 1e-6 一步改了 {shares['全部'][0]:.2%} 的 bf16 权重：矩阵 {min(mats):.2%}–{max(mats):.2%}，"
                            f"零初始化的 bias 全变，LN 权重不变")

# %% [markdown]
# 每行一种参数（TP=2 的一个 rank），实心条是第 1 步后 bf16 位变了的份额，空心条是之后每步的平均。
#
# <details><summary>本页怎么跑出来的</summary>
#
# - 一次启动 2 个 gloo rank（`snippets.ranks.launch.run_ranks`），跑 `snippets/experiments/n27_rl_trainer.py` 的 `run`，
#   模型与单步的写法在 `snippets/rl/trainer_side.py`：先在 TP=1（两个 rank 是 DP）上建 fp32 `GPTModel` 和同样权重的
#   `Float16Module`（bf16）逐 token 采样；再 `destroy_model_parallel`，按 TP=2 重建 bf16（两个框架的训练端都是 bf16）和 fp32（对照）两个模型，检查拼回的整张权重逐位相同，重算 log-prob；
#   然后用 Megatron 的 DDP 与 `get_megatron_optimizer` 训两个 bf16 policy：一个 lr 1e-4 走 8 步给 KL 用，一个 lr 1e-6 走 40 步数位。
# - 尺寸（`dims` 的 `tiny`）：hidden 32、4 个 head、ffn 128、vocab 64、2 层、LayerNorm、带 bias、学习式位置嵌入；
#   序列 32 = 4 个 prompt token + 28 个生成 token，8 条 = 2 个 prompt × 每组 4 条（GRPO 的组）。
#   前三部分用 `init_method_std` 0.2（分布更尖，差异更像真实模型），数位的一部分用 Megatron 默认的 0.02。
#   rank 里 `torch.set_num_threads(1)`，存下的输出重跑不变。
# - 奖励是生成 token 落在词表前一半的比例，组内减均值除标准差得 advantage；loss 是 −advantage × ratio 的 token 平均。
# - 真实尺寸的数来自 `snippets/cost/formulas.py`（调用 Megatron 的 `compute_weight_and_optimizer_memory`）；显存都按 GiB（2³⁰ 字节），
#   卡取它的 `HARDWARE["hbm_bytes"]`（80 GiB），上限取 `MEMORY_BUDGET`（72 GiB），与笔记 26 和计算器同一套。
# - 复现：`.venv/bin/python -m snippets.run --nproc-per-node 2 rl-trainer --tp 2` 打印本页的表；
#   `scripts/execute_notes.sh notes/27_rl_trainer_side.py` 重新执行整页。
#
# </details>

# %% tags=["hide-input"]
display(listing(rl.run))
listing(rl.mismatch, rl.bits_shares)

# %% [markdown]
# ## 源码位置
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`cross_entropy.py::vocab_parallel_cross_entropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L213) | 训练端重算 log-prob：verl 取它的负值 |
# | [`cross_entropy.py::_VocabParallelCrossEntropy`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/tensor_parallel/cross_entropy.py#L119) | fp32 里算，TP 上三次 all-reduce（max、目标 logit、exp 和） |
# | [`router_replay.py::RouterReplay`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router_replay.py#L18) | MoE 路由回放：记下 rollout 选的专家，训练时照用 |
# | [`transformer_config.py:742`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L742) | `moe_enable_routing_replay`，默认关 |
# | [`optimizer.py::Float16OptimizerWithFloat16Params`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L964) | fp32 主权重更新后舍入回 bf16 模型权重 |
# | [`param_and_grad_buffer.py::_ParamAndGradBuffer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/param_and_grad_buffer.py#L998) | `offload_to_cpu` / `reload_from_cpu`（:1619、:1634）：NeMo RL 的放下与拿回 |
#
# <details><summary>其余符号（5 个）</summary>
#
# | 符号（固定到 tag 的行） | 在本篇里的角色 |
# |---|---|
# | [`router_replay.py::get_replay_topk`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/moe/router_replay.py#L137) | 记录 / 回放 / 照常 top-k 三条路 |
# | [`transformer_config.py:1112`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/transformer_config.py#L1112) | `batch_invariant_mode`：批不变的核，两个框架都没开 |
# | [`__init__.py::get_megatron_optimizer`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/__init__.py#L988) | 本页两个 bf16 policy 的优化器 |
# | [`optimizer.py::_copy_main_params_to_model_params`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L1112) | 每步把 fp32 主权重拷回 bf16：位在这里变 |
# | [`distributed_data_parallel.py::offload_grad_buffers`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/distributed/distributed_data_parallel.py#L636) | 释放梯度缓冲；优化器的 `offload_to_cpu` 在 [`optimizer.py:555`](https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/optimizer/optimizer.py#L555) |
#
# </details>

# %% [markdown]
# ## 调用链
#
# verl 1dda039 的 v1 trainer 一步（顺序见 [`trainer_base.py:538`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/v1/trainer_base.py#L538)）：
# 采样 → 推理引擎睡下 → 重算 old log-prob → 参考 log-prob → advantage → 更新 → 同步权重、推理引擎醒来。
#
# <details><summary>完整调用链</summary>
#
# ```text
# verl/trainer/ppo/v1/trainer_base.py  一步
# ├─ rollout 生成（vLLM / SGLang，带 rollout_log_probs）                 # 推理端
# ├─ trainer_sync.py::sleep_replicas                                     # vLLM sleep(level=2)：丢权重与 KV cache
# ├─ _compute_old_log_prob → engine_workers.py::compute_log_prob
# │  └─ MegatronEngine.infer_batch（eval_mode：param_offload 时先搬回权重）
# │     └─ GPTModel.forward → logits [s, b, V/TP] ÷ temperature
# │        └─ vocab_parallel_log_probs_from_logits = −tensor_parallel.vocab_parallel_cross_entropy   # TP all-reduce ×3
# ├─ _compute_ref_log_prob → compute_ref_log_prob                        # 另一个只前向的 MegatronEngine（无 DDP、无优化器）
# ├─ _compute_advantage                                                  # GRPO 组内归一；rollout_is 打开时算 IS 权重
# ├─ update_actor → train_batch（train_mode：搬回权重、梯度、优化器）
# │  ├─ forward_backward_func：policy loss × IS 权重 + kl_loss_coef · low_var_kl
# │  ├─ finalize_model_grads                                            # DP 上的梯度同步
# │  └─ optimizer.step                                                  # fp32 主权重 → bf16 权重
# └─ update_weights（checkpoint engine naive）
#    ├─ rollout resume(tags=["weights"])
#    ├─ get_per_tensor_param → Megatron-Bridge export_hf_weights → rollout update_weights   # 笔记 22
#    ├─ param_offload 时权重回 CPU
#    └─ rollout resume(tags=["kv_cache"])
# ```
#
# </details>
#
# <details><summary>每个函数的记录（roadmap 七问）</summary>
#
# `vocab_parallel_cross_entropy` 的记录在[笔记 12](../12_vocab_parallel/)，优化器一步在[笔记 15](../15_distributed_optimizer/)；下面是本篇的几行。
#
# | 函数 | 输入 | 输出 | 调用的 Megatron Core 组件 | process group? | 切分? | 改训练状态? | simple loop 哪一步 |
# |---|---|---|---|---|---|---|---|
# | `RouterReplay.get_replay_topk` | 路由分数 [token, 专家]、k | 概率与专家下标 | 无（由 `TopKRouter` 调） | 否 | 否 | RECORD 时存下下标 | MoE 层前向 |
# | `_copy_main_params_to_model_params` | fp32 主权重 | 写 bf16 模型权重 | 无 | 否 | 否 | 是：模型权重 | `optimizer.step()` 末尾 |
# | `_ParamAndGradBuffer.offload_to_cpu` | 是否搬参数 / 梯度 | 无 | 无 | 否 | 否 | 参数进 pinned CPU，梯度 `resize_(0)` | 无；RL 框架在 rollout 前调 |
# | `MegatronOptimizer.offload_to_cpu` | 无 | 无 | 无 | 否 | 否 | 优化器状态进 CPU | 无；同上 |
#
# </details>

# %% [markdown]
# ## 关键对象
#
# ### 一轮里的四份 log-prob
#
# 同一个 token，一轮里会有四个 log-prob：
#
# - **rollout 的**：推理引擎采样时顺手给出（verl 的 `calculate_log_probs`，NeMo RL 的 `generation_logprobs`），bf16 权重、推理核。
#   verl 的这个开关在 [`rollout.yaml`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/rollout/rollout.yaml#L233) 里是 True，
#   在 [dataclass](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/config/rollout.py#L219) 里默认 False：不走 yaml 建配置时它是关的，下一节的修正就都没有输入。
# - **old**：训练端用更新前的权重重算一遍，PPO / GRPO 的 ratio 以它为分母。
# - **参考模型的**：初始权重算出的，只用于 KL。
# - **current**：更新时带梯度的那次前向，ratio 的分子。
#
# 理论上 rollout 的和 old 是同一个策略，可以省掉重算；实际上两边的核、并行切法、精度都不同，数对不上。
# 于是框架默认重算 old（verl 的 `bypass_mode: false`），把 rollout 的留作修正用。
#
# 两个框架的做法（读代码，未在 CPU 上运行；verl 1dda039、NeMo RL 7ea279a）：
#
# | 话题 | verl（Megatron 引擎） | NeMo RL（Megatron policy worker） |
# |---|---|---|
# | 重算 old | [`vocab_parallel_log_probs_from_logits`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/utils/megatron/tensor_parallel.py#L201)：Megatron 交叉熵取负 | 自己的 [`DistributedLogprob`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/distributed/model_utils.py#L120)：fp32、同样三次 all-reduce |
# | 修正 | [`rollout_is`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/algorithm/rollout_correction.yaml#L6)（默认关）、[`rollout_is_threshold: 2.0`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/algorithm/rollout_correction.yaml#L11)、[`rollout_rs`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/algorithm/rollout_correction.yaml#L14)、[`bypass_mode`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/algorithm/rollout_correction.yaml#L20) | [`use_importance_sampling_correction`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L140)（默认关）、[`truncated_importance_sampling_type` / `_ratio`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L146)（无默认） |
# | 参考模型 | [另一个只前向的引擎](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/engine_workers.py#L586)，权重默认在 GPU（LoRA 时关掉 adapter 即可，不另占） | CPU 上一份 state dict，[每次换进 policy 的参数里](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/workers/megatron_policy_worker.py#L1971)再换回 |
# | KL | [`kl_penalty`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/ppo/core_algos.py#L2187)：kl、abs、mse、low_var_kl；loss 默认 [`low_var_kl`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/actor/actor.yaml#L116)、[0.001](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/actor/actor.yaml#L113) | [`calculate_kl`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/utils.py#L42)：k1、k2、k3；默认 [k3](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L131)、[0.01](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L128) |
# | 只送变了的 | [`delta_sharded`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/delta_checkpoint_engine.py#L218)：本 rank 的 bf16 分片逐位比上一步的 CPU 快照（只接 SGLang，[只在非 colocated](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/checkpoint_engine/delta_checkpoint_engine.py#L14)） | [`vllm_s3_sparse` / `vllm_zmq_sparse`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/vllm/config.py#L30)：HF 导出逐位比基线，只在非 colocated |
# | 睡下 / 醒来 | vLLM [`sleep(level=2)`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/rollout/vllm_rollout/vllm_async_server.py#L1116)；[先醒权重、同步、再醒 KV cache](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/workers/engine_workers.py#L727) | vLLM [`sleep(level=1)`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/vllm/vllm_worker.py#L1309)；[`offload_before_refit` / `offload_after_refit`](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/grpo.py#L2342) |
# | 训练端放下 | [`offload_megatron_model_to_cpu`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/utils/megatron_utils.py#L663) 等，开关 [`param_offload` / `optimizer_offload`](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/verl/trainer/config/engine/megatron.yaml#L5) | Megatron 的 `_ParamAndGradBuffer.offload_to_cpu` 加[逐张量搬优化器](https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/policy/workers/megatron_policy_worker.py#L3237) |

# %% [markdown]
# ## Tensor / Process Group 语义
#
# ### 重算：TP=2 的 logits，一次 vocab 并行交叉熵
#
# rollout 替身是 TP=1 的 bf16 模型，逐 token 生成；训练端是同一份权重的 TP=2 bf16 模型（两个框架的 Megatron 训练端都是 bf16；
# 另建一个 fp32 的作对照；两个 rank 拼回的整张权重逐位相同），对整段序列做一次前向。每个 rank 的 logits 是 `[b, s, V/2]`，转成 `[s, b, V/2]` 交给 `vocab_parallel_cross_entropy`：
# 先各自求最大值，在 TP 群上 all-reduce 取 max；目标 token 落在哪个 rank 的那一半，那个 rank 给出它的 logit，其余给 0，all-reduce 求和；
# exp 的和再 all-reduce 一次。两个 rank 得到同一个 `[s, b]` 的 loss，log-prob 就是它的负值。verl 正是这样取的；
# NeMo RL 自己写了同样三步的 `DistributedLogprob`，不调 Megatron。
#
# 把几种设置两两比较（224 个生成 token）：

# %% tags=["hide-input"]
print(f"TP=1 与 TP=2 拼回的整张权重逐位相同：{results[0]['same_weights']}")
rl.mismatch_table(results)

# %% [markdown]
# 第一行就是真实部署里训练端和 rollout 的差：两边都是 bf16，平均 5.93e-03。拆开看：都用 fp32、只换 TP，最大差 1.43e-06，
# 是 fp32 求和顺序的舍入；都用 bf16、只换 TP，平均差 5.93e-03，就是第一行的全部。差不是 TP 本身造成的，而是 bf16 舍入发生的位置：
# 中间结果每过一层都要舍入到 8 个有效二进制位，TP=2 的行并行层先各算一半、各自舍入成 bf16 再相加，TP=1 一次算完才舍入，
# 舍入的位置不同，误差就不同。把训练端换成 fp32（第二行）也不会更近，平均差 6.84e-03：rollout 自己带着 bf16 的舍入，
# fp32 的训练端只是换了一种不同。“只换形状”一行（逐 token 生成对整段前向）在 CPU 上几乎为零；
# GPU 上矩阵乘的分块随 batch 大小变，这一行也会变大，Megatron 为此有 `batch_invariant_mode`（见下）。
#
# 这点差换成 importance ratio `exp(logp_train − logp_rollout)`（bf16 训练端在前，fp32 对照在后）：

# %% tags=["hide-input"]
rl.ratio_table(results)

# %% [markdown]
# ## 机制解释
#
# ### 修正：IS 权重、截断、拒绝、bypass
#
# 样本是 rollout 按它自己的数采出来的，PPO 的 ratio 却以训练端重算的 old 为分母。w = exp(old − rollout) 把 rollout 的分布
# 修正到 old；从 old 到正在更新的策略，仍是 PPO ratio 的事。用 w 给每个 token 的 loss 加权就是
# importance sampling；w 偶尔很大时方差爆炸，所以截断。verl 的 `rollout_is: token` 逐 token 取 w，`sequence` 用整条的和再广播，
# 都先把差夹在 ±20 之内，再按 `rollout_is_threshold`（默认 2.0）截断成 min(w, C)；阈值写成 `"lo_hi"` 时改成区间外置零（IcePop）。
# `rollout_rs` 是另一条路：按 k1 / k2 / k3 统计量超阈值的 token 或整条序列直接从 mask 里去掉。`bypass_mode` 则干脆不重算，
# 拿 rollout 的 log-prob 当 old，省一次前向。NeMo RL 把这些放在 loss 里：`use_importance_sampling_correction` 打开后，
# token 级或序列级的 w 乘到截断后的 loss 上，`truncated_importance_sampling_type` 选 tis、icepop 或 seq-mask-tis，
# C 要自己给；它不夹 ±20，只把 nan / inf 换成 0，另外总记一个 `token_mult_prob_error`。
#
# 本页的差很小，ratio 全在 C = 2 以内；真实模型更长的序列、更尖的分布、MoE 的路由会把尾巴拉长，截断才起作用。
#
# ### MoE：Megatron 自己的 routing replay
#
# 对 MoE，bf16 的一点差可能让 top-k 选出另一个专家，那个 token 的输出就整个换了。Megatron 0.19.0 给的办法是路由回放：
# `moe_enable_routing_replay` 打开后每个 `TopKRouter` 带一个 `RouterReplay`，rollout（或重算那次前向）记下选中的专家，
# 训练时不再自己选，照用记下的下标、只从自己的分数里取概率。下面直接调用它：1024 个 token、8 个专家、top-2，
# rollout 的分数是同一批 logits 过一遍 bf16：

# %%
def topk(scores, k, num_groups=None, group_topk=None):  # 路由器平常的 top-k
    return torch.topk(scores, k, dim=-1)

logits = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
train_scores, rollout_scores = torch.softmax(logits, -1), torch.softmax(logits.bfloat16(), -1).float()
replay = RouterReplay()
replay.set_router_replay_action(RouterReplayAction.RECORD)
_, rollout_experts = replay.get_replay_topk(rollout_scores, 2, default_compute_topk=topk)
replay.set_target_indices(rollout_experts)
replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
probs, replayed = replay.get_replay_topk(train_scores, 2, default_compute_topk=topk)
own = topk(train_scores, 2)[1]
RouterReplay.clear_global_router_replay_instances()
print("训练端自己选、与 rollout 不同的 token：", int((own.sort(-1).values != rollout_experts.sort(-1).values).any(-1).sum()),
      "| 回放后不同的：", int((replayed != rollout_experts).any(-1).sum()),
      "| 回放后概率与 rollout 的最大差：", f"{float((probs - rollout_scores.gather(1, replayed)).abs().max()):.1e}")

# %% [markdown]
# verl 用 `router_replay.mode` 选 R2（训练端重算时记、更新时放）或 R3（从 vLLM 拿 rollout 的路由，重算和更新都放），用的是它自带的
# 一份 RouterReplay 补丁，同时打开 Megatron 的开关；NeMo RL 的 `router_replay.enabled` 直接打开 Megatron 的开关并让 vLLM 返回路由，
# 参考模型那次前向不回放。Megatron 的另一个答案 `batch_invariant_mode`（批不变的矩阵乘与 log_softmax，要 FlashAttention 3/4）
# 两个框架都没有打开。
#
# ### 参考模型与 KL
#
# 参考模型的一次前向和重算 old 完全一样，只是权重不同。verl 为它另建一个只前向的 Megatron 引擎：不包 DDP、没有优化器和梯度缓冲，
# 但每卡多一份 bf16 权重，除非给参考模型也打开 `param_offload`；NeMo RL 不占 GPU，参考权重存成 CPU 上的 state dict，
# 每次算参考 log-prob 时先把 policy 拷到 CPU、把参考拷进同一批参数，算完再拷回。以 verl 的 Qwen3-8B Megatron GRPO 例子
# （TP2·PP2、8 卡、分布式优化器）为准，这份权重用 Megatron 的公式算：

# %%
args = megatron_args(MODELS["qwen3-8b"], Config(gpus_per_node=8, tp=2, pp=2, distributed_optimizer=True))
print("训练端 权重+梯度+优化器 GiB/GPU", round(compute_weight_and_optimizer_memory(args) / GIB, 2))

# %% tags=["hide-input"]
rl.reference_rows()

# %% [markdown]
# 多一份参考权重只是训练端状态的六分之一（bf16 的 2 字节对 Megatron 的 6 + 12/DP 字节）。
#
# KL 在 loss 里只能用采样到的 token 估计。令 log r = logp_ref − logp，verl 的 `kl_penalty` 和 NeMo RL 的 `calculate_kl` 给的是：
# k1 = −log r，k2 = ½(log r)²，k3 = r − 1 − log r（`low_var_kl`），verl 还有 `abs`。本页拿初始权重当参考，
# 把一个 bf16 policy 用 lr 1e-4 训 8 步，在每个位置从 policy 里抽 8 个 token，两边都用上面的交叉熵算 log-prob：

# %% tags=["hide-input"]
rl.kl_table(results)

# %% [markdown]
# “全词表期望”一栏是在每个位置对整个词表按 policy 的概率求和：k1 和 k3 的期望都正好是精确 KL（k3 多出的 r − 1 期望为 0），
# k2 是近似，两个分布接近时和 KL 只差三阶小量。差在方差：k1 有正有负，采样标准差比 KL 本身大二十倍；k3 恒非负，
# 小了一个数量级，这就是它叫 `low_var_kl` 的原因。`abs` 不是 KL 的估计。两个框架都把 k3 的输出夹在 ±10、输入夹在 ±20，
# NeMo RL 对每种估计都夹；verl 的名字后面加 `+`（如 `low_var_kl+`）则值照旧、梯度换成 k2 的。
#
# ### 每步变了多少位
#
# 本页的 bf16 policy 与真实训练一样，由 Megatron 的优化器持有 fp32 主权重，每步更新主权重再舍入拷回 bf16。
# 优化器的设置（lr 1e-6，其余是 Megatron 的默认）：

# %%
cfg = OptimizerConfig(lr=1e-6, bf16=True, weight_decay=0.01)
print("lr", cfg.lr, "| adam_eps", cfg.adam_eps, "| betas", (cfg.adam_beta1, cfg.adam_beta2), "| clip_grad", cfg.clip_grad)

# %% tags=["hide-input"]
import math
print("正态初始化里 |w| < 2⁻¹¹ 的份额：", " | ".join(f"std {s:g}：{math.erf(2**-11 / s / math.sqrt(2)):.2%}" for s in (0.02, 0.01)))
rl.bits_table(results)

# %% [markdown]
# Adam 的一步约等于 lr 乘梯度的符号：第一步 m/√v 几乎正好是 ±1（只差 eps），所以每个元素都走 1e-6。bf16 只有 8 个有效二进制位，|w| ≈ 0.014 时相邻两个
# bf16 值相距 2⁻¹⁴ ≈ 6.1e-5，主权重要累计走过半格（约 31 步）舍入结果才变。于是：
#
# - **第 1 步最少**：主权重是从 bf16 复制来的，恰好在格点上，只有 |w| < 2⁻¹¹ ≈ 4.9e-4 的元素一步就跨过半格（上面打印的 std 0.02 正态里 1.95%，std 0.01 的 3.89%；表中 1.46%–4.47%）；之后主权重在格间各处，
#   每步都有一批跨线，平均份额反而更高。
# - **零初始化的 bias 和 LN 的 bias 全变**：0 附近 bf16 格极密，1e-6 就是一个新值。**LN 权重为 1.0 一个不变**：1 附近格宽 2⁻⁷，
#   要约两千步才挪一格。
# - **过半的步数**就是半格除以 lr：qkv、fc1、position、output 31 步，缩小初始化的 `proj`、`fc2`（std 0.01）16 步；
#   embedding 里本批没出现的 token 那几行没有梯度、一直不动，40 步后 50.0%，还没过半。
#
# verl 的 `delta_sharded` 正是按这个位比较：每个 rank 把本地 bf16 分片和上一步留在 CPU 的快照逐位比，只送变了的位置；它的文档说
# [真实训练每步约 1–3%](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/docs/advance/delta_weight_sync.md#L17)，
# [Qwen3-8B 的几行是 0.88%–0.90%](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/docs/advance/delta_weight_sync.md#L180)（文档数，
# 且是 FSDP / TorchTitan 跑的）。本页的 5.78% 偏高有三个原因：小模型里 bias 占了 3% 的元素且全变；同一批数据反复训练，
# 梯度符号不变，Adam 每步走满 lr，而真实训练的梯度有噪声，m/√v 常远小于 1；训练过的权重分布也不再是初始化的正态。
# NeMo RL 的 sparse refit 同样逐位比较，文档只给了 3%、5% 密度下的传输时间，没有每步变化的比例。
#
# ### 睡下、醒来与放下
#
# colocated（verl 的 hybrid engine）时训练和推理共用 GPU，只能轮流占用。verl 采样完就让 vLLM `sleep(level=2)`：权重和 KV cache
# 都丢掉；训练端进入每个阶段时按 `param_offload`、`optimizer_offload` 把状态搬回，离开时放下（梯度缓冲只释放不拷贝，
# `grad_offload` 读了但没用）；同步时先只醒权重，写完新权重、训练端放下后，再醒 KV cache。NeMo RL 的 vLLM 睡 level 1
# （权重进 CPU 内存），refit 前释放梯度、把优化器搬到 CPU，送完再把参数放下，用的是 Megatron 自己的 `offload_to_cpu`。
# verl 的 Qwen3-8B 例子（rollout TP2、`gpu_memory_utilization` 0.6，即 vLLM 占整卡显存的六成；卡按 80 GiB）每卡的账：

# %% tags=["hide-input"]
display(rl.offload_rows())
c = rl.colocated()
print(f"vLLM 睡下放出：{rl.VLLM_SHARE} × {c['card'] / GIB:.0f} GiB = {c['vllm'] / GIB:.1f} GiB/GPU | "
      f"训练端 + 参考一直留着：{c['kept'] / GIB:.2f} GiB")
print(f"推理时合计 {c['sum'] / GIB:.2f} GiB | 卡 {c['card'] / GIB:.0f} GiB：放得下 {c['sum'] <= c['card']}，"
      f"余 {(c['card'] - c['sum']) / GIB:.2f} GiB | 笔记 26 的上限 {c['budget'] / GIB:.0f} GiB：放得下 {c['sum'] <= c['budget']}，"
      f"余 {(c['budget'] - c['sum']) / GIB:.2f} GiB")

# %% [markdown]
# 这个例子没开训练端的 offload：训练端和参考的 26.70 GiB 一直留在卡上，推理时再加 vLLM 的 48.0 GiB，合计 74.70 GiB，
# 放得进 80 GiB 的卡，只余 5.30 GiB；按笔记 26 给公式没算的 CUDA context、NCCL 缓冲和碎片留一成（上限 72 GiB），就超了 2.70 GiB，
# colocated 留下的余量比笔记 26 对单独训练要求的还紧。训练时 vLLM 睡下，它让出的地方给激活用。更大的模型（例如 [Qwen3-30B-A3B 的例子](https://github.com/verl-project/verl/blob/1dda039b9c6311889a9c9a26040677e1254814f9/examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh#L153)）
# 把三个开关全打开，rollout 时训练端几乎不占显存，代价是每个阶段进出都要经 PCIe 搬一遍。

# %% [markdown]
# ## 与训练主链路的关系
#
# 训练端的一步和预训练几乎一样：`forward_backward_func`、梯度同步、优化器一步（笔记 05、06、15），只是 loss 换成带 ratio 的 policy loss
# 加 KL。多出来的是一步前的两次只前向（old、参考），一步后的权重同步（笔记 22），以及围着它们的放下与拿回。

# %% [markdown]
# ## 与基础知识的连接
#
# - importance sampling：从 q 采样估计 p 下的期望，用 p/q 加权；截断以一点偏差换方差。
# - KL 的蒙特卡洛估计：k1 无偏但方差大，k3 利用 E[r] = 1 加一个控制变量，无偏且恒非负。
# - 浮点：bf16 与 fp32 指数位相同、尾数只有 7 位；一个数能不能被加上 δ 改变，取决于 δ 与它所在格宽的比。

# %% [markdown]
# ## 遗留问题
#
# **Megatron 的坑**
#
# - bf16 模型的 LN 权重在 RL 的学习率下长期不动：主权重在走，模型权重要约两千步才挪一格，推理端一直拿到旧值（上面的表，40 步后仍是 0%）。
# - `vocab_parallel_cross_entropy` 虽在 fp32 里算，输入却是 bf16 模型输出的 logits：重算的精度受限于 bf16 的整次前向
#   （每层都舍入，logits 也是 bf16），算 log-prob 的函数在 fp32 里也救不回来（上面“只换精度”一行比的是整个模型 fp32 对 bf16）。
# - `moe_enable_routing_replay` 只管 top-k 的下标，概率仍从训练端自己的分数里取：回放后专家相同，概率仍差 bf16 那一点（上面打印的最大差）。
#
# <details><summary>在 CPU 上怎么跑的</summary>
#
# - 全部用 gloo、fp32 或 CPU 上的 bf16；CPU 的矩阵乘不随 batch 形状换核，所以“只换形状”一行接近 0，GPU 上不是。
# - rollout 替身不是推理引擎：每生成一个 token 都对整段前缀做一次完整前向，没有 KV cache。
# - 同一批 8 条序列训练多步，只为数位；真实训练每步换新数据。
#
# </details>

# %% [markdown]
# ## 自测

# %% [markdown]
# **1. 精确 KL 为 0.00517 时，k1 与 k3 的采样标准差差几倍？**
#
# <details><summary>答案</summary>
#
# 约 12 倍（下面的单元格），两者的采样平均都在精确 KL 附近。
#
# </details>

# %% tags=["answer"]
est = rl.kl_estimators_of(results)
round(float(est["k1 (kl)"].std() / est["k3 (low_var_kl)"].std()), 1)

# %% [markdown]
# **2. bf16 的 LN 权重 1.0，lr 1e-6、每步都往下走，第几步模型权重才变？往上走呢？**
#
# <details><summary>答案</summary>
#
# 往下第 1954 步（1 下面的格宽是 2⁻⁸，半格 0.00195）；往上第 3907 步（1 上面格宽 2⁻⁷）。
#
# </details>

# %% tags=["answer"]
[next(n for n in range(1, 10000) if torch.tensor(1.0 + sign * n * 1e-6).bfloat16() != 1.0) for sign in (-1, 1)]

# %% [markdown]
# **3. 按 verl 例子的切分（Qwen3-8B、TP2·PP2、8 卡），NeMo RL 的做法每算一次参考 log-prob，每卡要在 CPU 与 GPU 之间搬多少 GiB 权重？**
#
# <details><summary>答案</summary>
#
# 约 11.4 GiB（3 × 3.81 GiB）：policy 拷出、参考拷入、policy 拷回，各一份 bf16 权重。
#
# </details>

# %% tags=["answer"]
round(3 * rl.per_gpu()["weights"] / GIB, 1)

# %% [markdown]
# ## 30-second answer
#
# Between sampling and the next sync, the trainer recomputes old log-probs (verl: minus Megatron's
# vocab_parallel_cross_entropy), runs the reference for KL, takes one step and sends weights back. Rollout and
# trainer log-probs differ because bf16 rounding happens at different points (here 5.93e-03 on average between a bf16 TP=2
# trainer and a bf16 TP=1 rollout), so frameworks can weight by truncated importance ratios (off by default in both); for MoE Megatron replays the rollout's routing. k3 (low_var_kl) is unbiased and far
# less noisy than k1. At lr 1e-6 only a few percent of bf16 weights change per step, which delta sync exploits.
# Colocated, the GPU takes turns: in verl's Qwen3-8B example vLLM holds 48.0 GiB of an 80 GiB card while awake,
# next to 26.70 GiB of trainer state and reference weights, and sleeps to give it back for training.
