"""The distributed optimizer and DDP: ``param.type()`` checks in its constructor, the ``.cuda()``
before its state gather, torch Adam's ``step`` on load, the current stream the gradient sync waits
on; the device type of ``TorchFullyShardedDataParallel``'s mesh; and the partial distributed
optimizer (``num_distributed_optimizer_instances > 1``), which needs CUDA streams and is refused."""

from __future__ import annotations

from snippets.cpu.base import (
    Patch,
    Site,
    cuda_view,
    no_current_stream,
    refuse,
    replace_once,
    same_tensor,
    scope_torch,
    tensor_attr_while,
    type_with_cuda_names,
)


def _patch_distrib_optimizer_type_check():
    # DistributedOptimizer sorts parameters by `param.type()` names such as
    # 'torch.cuda.FloatTensor' and raises on anything else; a CPU tensor answers
    # 'torch.FloatTensor'. It is a method call, so a module proxy cannot reach it: the patch is
    # scoped in time to this one classmethod instead.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    replace_once(
        DistributedOptimizer,
        "_build_model_and_main_param_groups",
        tensor_attr_while("type", type_with_cuda_names),
    )


def _patch_distrib_optimizer_init_type_check():
    # Before it builds the shards, DistributedOptimizer.__init__ gives every 16-bit parameter the
    # placeholders `main_param = None`, `main_param_sharded = True` -- but only if `param.type()`
    # names a CUDA half / bfloat16 tensor. On a CPU the test fails silently: the parameters this
    # rank does not own keep no `main_param` at all, and readers that fall back to the full
    # weight (training/utils.py's parameter norm) count them on every DP rank. The classmethod
    # above runs inside this constructor; each puts back what it found, so the two nest.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    replace_once(DistributedOptimizer, "__init__", tensor_attr_while("type", type_with_cuda_names))


def _patch_distrib_optimizer_gather_cuda():
    # get_parameter_state_dp_zero copies this rank's optimizer shard into a CPU buffer and, unless
    # told to use the gloo group, moves it with `.cuda()` before gathering it over the DP group.
    # The `fully_reshardable` and `dp_zero_gather_scatter` checkpoint formats both save through it.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    replace_once(DistributedOptimizer, "get_parameter_state_dp_zero", tensor_attr_while("cuda", same_tensor))


def _keep_torch_adam_step(setter):
    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return setter(self, model_param, tensors)

    return _set_main_param_and_optimizer_states


def _patch_distrib_optimizer_torch_adam_step():
    # Without Transformer Engine or Apex the inner optimizer is torch's Adam, which keeps a
    # per-parameter "step" tensor next to exp_avg and exp_avg_sq. _set_main_param_and_optimizer_states
    # copies *every* key of that state from the loaded tensors, but the fully_reshardable and
    # dp_zero_gather_scatter formats load only param / exp_avg / exp_avg_sq (the step travels in
    # param_groups and load_state_dict has already set it), so the copy stops at "step" with a
    # KeyError -- on a GPU without TE / Apex too. A missing "step" keeps the value already there.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    replace_once(DistributedOptimizer, "_set_main_param_and_optimizer_states", _keep_torch_adam_step)


def _patch_grad_sync_current_stream():
    # Every bucket group's start_grad_sync takes the current stream, to make it wait for the
    # events a local CUDA graph replay leaves on its parameters (none without CUDA graphs), before
    # it scales and reduces the bucket's gradients. CPU work runs in order: nothing to wait for.
    scope_torch(
        "megatron.core.distributed.param_and_grad_buffer", cuda=cuda_view(current_stream=no_current_stream)
    )


class _CpuDeviceMesh:
    """``DeviceMesh`` as ``torch_fully_sharded_data_parallel`` uses it, on the CPU device type."""

    @staticmethod
    def from_group(group, device_type, *args, **kwargs):
        from torch.distributed import DeviceMesh

        return DeviceMesh.from_group(group, "cpu", *args, **kwargs)


def _patch_torch_fsdp2_device_mesh():
    # TorchFullyShardedDataParallel (torch FSDP2 under Megatron) builds its mesh over the DP x CP
    # group with the device type "cuda" written in; FSDP2 then asks the CUDA runtime which device
    # is current and places every shard there. Only the name changes on a CPU: gloo does the rest.
    from megatron.core.distributed import torch_fully_sharded_data_parallel

    torch_fully_sharded_data_parallel.DeviceMesh = _CpuDeviceMesh


def _patch_partial_distributed_optimizer():
    # With num_distributed_optimizer_instances > 1, DDP makes a CUDA stream for the all-reduce
    # between optimizer instances. Not covered: refused by name instead of a raw CUDA error.
    what = "num_distributed_optimizer_instances > 1 (partial distributed optimizer, a CUDA stream)"
    scope_torch("megatron.core.distributed.distributed_data_parallel", cuda=cuda_view(Stream=refuse(what)))


PATCHES = (
    Patch(
        name="distrib_optimizer_type_check",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"
        "._build_model_and_main_param_groups",
        what="只在这个 classmethod 运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名"
        "（`torch.FloatTensor` → `torch.cuda.FloatTensor`）",
        why="分布式优化器按 `param.type()` 的字符串给参数分组，只认 `torch.cuda.*Tensor`，"
        "其余一律 `TypeError`；CPU 参数答的是 `torch.FloatTensor`。这是方法调用，模块级代理管不到，"
        "所以把补丁的时间范围收窄到这一个函数。",
        sites=(
            Site(
                "megatron/core/optimizer/distrib_optimizer.py",
                466,
                "model_param.type() == 'torch.cuda.FloatTensor'",
            ),
        ),
        apply=_patch_distrib_optimizer_type_check,
        proof="DP=2 的 `DistributedOptimizer` 走两步 Adam，"
        "参数等于单进程整批数据上的 `torch.optim.AdamW`；"
        "建完之后 `Tensor.type()` 恢复原样",
    ),
    Patch(
        name="distrib_optimizer_init_type_check",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.__init__",
        what="只在这个构造函数运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名",
        why="构造函数先给每个 16 位参数放上占位 `main_param = None`、`main_param_sharded = True`，"
        "再为本 rank 拥有的那段建 fp32 主参数；占位只在 `param.type()` 是 CUDA 的 half / bfloat16 类型名时才放。"
        "CPU 上不报错、静默跳过：本 rank 不拥有的参数没有 `main_param` 属性，读它的代码（如 training/utils.py "
        "的参数范数）就退回用完整权重、在每个 DP rank 上重复计数。",
        sites=(
            Site(
                "megatron/core/optimizer/distrib_optimizer.py",
                758,
                "param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']",
            ),
        ),
        apply=_patch_distrib_optimizer_init_type_check,
        proof="DP=2 分布式优化器、bf16："
        "本 rank 不拥有的参数 `main_param` 为 None，"
        "各 rank 的分片恰好覆盖每个权重一次",
    ),
    Patch(
        name="distrib_optimizer_gather_cuda",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.get_parameter_state_dp_zero",
        what="只在这个方法运行期间，`Tensor.cuda()` 返回张量本身",
        why="分布式优化器的 checkpoint 格式 `fully_reshardable` 和 `dp_zero_gather_scatter` 保存时都经过它："
        "每个 DP rank 把自己那段优化器状态拷进 CPU 缓冲，不用 gloo 群时先 `.cuda()` 再在 DP 群里 all-gather / gather。"
        "搬到 GPU 是唯一与 CUDA 有关的一步，收集照常在 gloo 上做（笔记 21）。",
        sites=(
            Site("megatron/core/optimizer/distrib_optimizer.py", 1374, "send_tensor = send_tensor.cuda()"),
        ),
        apply=_patch_distrib_optimizer_gather_cuda,
        proof="DP=2：每个 rank 只拥有一半 fp32 main params，"
        "`get_parameter_state_dp_zero` 的收集把每个参数完整"
        "地放回 buffer 里它的位置，两个 rank 都是；"
        "之后 `Tensor.cuda` 恢复原样",
    ),
    Patch(
        name="distrib_optimizer_torch_adam_step",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer._set_main_param_and_optimizer_states",
        what="加载时来源里没有 `step` 就保留已有的 `step`",
        why="没有 Transformer Engine / Apex 时最里层是 torch 的 Adam，它给每个参数存一个 `step` 张量；"
        "这个方法把优化器状态里每个是张量的键都从加载来的张量里拷贝（先查 `tensors[key]`），"
        "而 `fully_reshardable`、`dp_zero_gather_scatter` "
        "只带回 param / exp_avg / exp_avg_sq（step 走 param_groups，`load_state_dict` 已经设好），于是在 `step` 上 "
        "`KeyError`。GPU 上不装 TE / Apex 也一样（笔记 21）。",
        sites=(
            Site("megatron/core/optimizer/distrib_optimizer.py", 1221, "dst_tensors[k] = v"),
            Site(
                "megatron/core/optimizer/distrib_optimizer.py",
                1223,
                "if not isinstance(tensors[key], torch.Tensor):",
            ),
        ),
        apply=_patch_distrib_optimizer_torch_adam_step,
        proof="torch Adam 的状态带 `step`，加载来的张量不带：param、"
        "exp_avg、exp_avg_sq 被拷入，`step` 保持原值",
    ),
    Patch(
        name="grad_sync_current_stream",
        scope="megatron.core.distributed.param_and_grad_buffer",
        what="`torch.cuda.current_stream()` 返回一个什么都不用等的替身",
        why="0.19.0 起每个 bucket group 的 `start_grad_sync` 先取当前 stream，让它等 CUDA graph 重放留在参数上的"
        "事件（不用 CUDA graph 时没有），再缩放、规约这一组梯度；`finalize_model_grads` 和 overlap 的 hook "
        "都经过这里。CPU 上的计算本来就按顺序完成，没有要等的；CPU 版 torch 取 stream 直接报错。",
        sites=(
            Site(
                "megatron/core/distributed/param_and_grad_buffer.py",
                632,
                "current_stream = torch.cuda.current_stream()",
            ),
        ),
        apply=_patch_grad_sync_current_stream,
        proof="DP=2、两个 bucket、`overlap_grad_reduce` 开和关："
        "`finalize_model_grads` 之后每个 rank 的 `main_grad` 等于两个 rank 上梯度的平均",
    ),
    Patch(
        name="torch_fsdp2_device_mesh",
        scope="megatron.core.distributed.torch_fully_sharded_data_parallel",
        what='模块里的 `DeviceMesh.from_group(group, "cuda")` 改用设备类型 `cpu`',
        why="`TorchFullyShardedDataParallel`（Megatron 包装的 torch FSDP2）在 DP×CP 群上建 mesh，"
        "设备类型写死 `cuda`；FSDP2 再向 CUDA 运行时要当前设备来放分片，CPU 版 torch 直接报错。"
        "换成 `cpu` 之后，分片、all-gather、reduce-scatter 都在 gloo 上照常发生（笔记 15）。",
        sites=(
            Site(
                "megatron/core/distributed/torch_fully_sharded_data_parallel.py",
                81,
                'DeviceMesh.from_group(self.process_group, "cuda")',
            ),
        ),
        apply=_patch_torch_fsdp2_device_mesh,
        proof="DP=2：每个 rank 只存一半参数；一步之后拼回的梯度等于不分片的模型在两份数据上梯度的平均",
    ),
    Patch(
        name="partial_distributed_optimizer",
        scope="megatron.core.distributed.distributed_data_parallel",
        what="`num_distributed_optimizer_instances > 1` 时不建 CUDA stream，报一行 `CpuUnsupported`",
        why="部分分布式优化器（多个优化器实例）让 DDP 为实例之间的 all-reduce 建一条 CUDA 通信 stream；"
        "CPU 层没有覆盖这条路径（笔记不用它），与其让 CPU 版 torch 报 CUDA 错误，不如直接说清缺的是什么。",
        sites=(
            Site(
                "megatron/core/distributed/distributed_data_parallel.py",
                292,
                "num_distributed_optimizer_instances > 1",
            ),
            Site("megatron/core/distributed/distributed_data_parallel.py", 297, "torch.cuda.Stream("),
        ),
        apply=_patch_partial_distributed_optimizer,
        proof="DP=2、两个优化器实例：建 DDP 时抛出一行 `CpuUnsupported`，点名 "
        "`num_distributed_optimizer_instances > 1`，而不是 CUDA 错误",
    ),
)
