"""The smallest set of patches that lets megatron-core 0.16.1 run on a CPU, and why each exists.

Megatron is written for CUDA: it allocates buffers on ``torch.cuda.current_device()``, keeps its
model-parallel RNG streams in CUDA generators and synchronizes CUDA streams. None of that changes
what the code *computes*; it only names the device. Each :class:`Patch` below replaces one such
device detail, as narrowly as possible:

* *global* patches change one ``torch.cuda`` function for every module (only where many Megatron
  files call it);
* *scoped* patches give one Megatron module its own view of ``torch`` (a proxy that differs in
  one or two names), so nothing else in the process sees a change.

We never edit Megatron's files. :func:`apply` is idempotent and does nothing when CUDA is
available, so the same experiment runs unpatched under ``torchrun`` on GPUs. The table on the
site page "在 CPU 上运行 Megatron Core" is rendered from :data:`PATCHES` (a test keeps them equal).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from snippets.site.sources import pinned_url


@dataclass(frozen=True)
class Site:
    """One Megatron line that needs a patch: ``path:line`` must contain ``text`` (a test checks)."""

    path: str
    line: int
    text: str

    @property
    def url(self) -> str:
        return pinned_url(self.path, self.line)


@dataclass(frozen=True)
class Patch:
    name: str
    scope: str  # "global" or the dotted Megatron module the patch is limited to
    what: str   # what the patch does, in one line
    why: str    # why Megatron needs it on a CPU
    sites: tuple[Site, ...]
    apply: Callable[[], None]
    proof: str = ""  # what its test (tests/ranks/test_cpu_compat.py::test_<name>_...) shows, for the site


class ModuleProxy:
    """Looks like ``real`` except for the names in ``overrides``; used as a module's ``torch``."""

    def __init__(self, real, **overrides):
        self._real = real
        self._overrides = overrides

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._real, name)

    def __repr__(self):
        return f"<cpu_compat proxy of {self._real.__name__}: {sorted(self._overrides)}>"


def _on_cpu(device):
    """Map a CUDA device spec to the CPU, leave any other device alone."""
    if device is None:
        return device
    if str(device).startswith("cuda"):
        return "cpu"
    return device


def _cpu_factory(factory):
    def wrapper(*args, device=None, **kwargs):
        return factory(*args, device=_on_cpu(device), **kwargs)

    wrapper.__name__ = factory.__name__
    return wrapper


def _scope_torch(module_name: str, **overrides) -> None:
    """Replace ``torch`` in one Megatron module's globals with a proxy (once)."""
    module = importlib.import_module(module_name)
    current = module.__dict__.get("torch")
    if isinstance(current, ModuleProxy):
        # Two patches may scope the same module: the second adds its names, never drops the first's.
        current._overrides.update(overrides)
    else:
        module.torch = ModuleProxy(torch, **overrides)


# ---------------------------------------------------------------- the patches


def _patch_current_device():
    torch.cuda.current_device = _cpu_current_device


def _cpu_current_device():
    return "cpu"


def _patch_synchronize():
    torch.cuda.synchronize = _no_synchronize


def _no_synchronize(device=None):
    return None


def _patch_rng_tracker():
    # Megatron's tracker keeps named RNG streams ("model-parallel-rng", ...) and swaps them into
    # the CUDA generator around TP-region dropout and init. On CPU the generator that dropout and
    # init actually draw from is the CPU default generator, so the tracker swaps that one.
    from megatron.core.tensor_parallel import random as mrandom

    cuda_view = ModuleProxy(
        torch.cuda,
        get_rng_state=_cpu_get_rng_state,
        manual_seed=torch.manual_seed,
        random=ModuleProxy(torch.cuda.random, get_rng_state=_cpu_get_rng_state),
    )
    _scope_torch("megatron.core.tensor_parallel.random", cuda=cuda_view)
    mrandom._set_cuda_rng_state = _cpu_set_rng_state


def _cpu_get_rng_state(device=None):
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def _patch_schedules_device():
    # The schedules count tokens in a 0-d tensor created with a literal device="cuda".
    _scope_torch("megatron.core.pipeline_parallel.schedules", zeros=_cpu_factory(torch.zeros))


class _NoStream:
    """Stands in for a CUDA stream on a CPU: CPU work already runs in order, nothing to wait for."""

    def wait_stream(self, stream):
        return None

    def synchronize(self):
        return None


def _no_current_stream(device=None):
    return _NoStream()


def _patch_refit_streams():
    # The gloo refit service makes a "copy stream" in __init__ and, after its p2p batch, makes the
    # current stream wait on it. The transfer itself is gloo over CPU tensors either way.
    cuda_view = ModuleProxy(torch.cuda, Stream=_NoStream, current_stream=_no_current_stream)
    _scope_torch("megatron.core.resharding.copy_services.gloo_copy_service", cuda=cuda_view)


def _patch_torch_norm_sequence_parallel():
    # Without Apex or Transformer Engine the local spec's norm is WrappedTorchNorm, which refuses
    # sequence_parallel. RMSNorm and LayerNorm act on each token alone, so a sequence shard is
    # normalized exactly as the full sequence would be; what SP really needs is the marking that
    # Apex's FusedLayerNorm and TE's norms do: weights flagged `sequence_parallel`, so that
    # finalize_model_grads sums their per-rank partial gradients over TP. Only the SP case changes.
    import copy

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if getattr(WrappedTorchNorm.__new__, "_cpu_compat", False):
        return
    original = WrappedTorchNorm.__new__

    def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
        if not config.sequence_parallel:
            return original(cls, config, hidden_size, eps, **kwargs)
        view = copy.copy(config)  # the same config, seen without SP by the assert only
        view.sequence_parallel = False
        norm = original(cls, view, hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    __new__._cpu_compat = True
    WrappedTorchNorm.__new__ = staticmethod(__new__)


def _patch_optimizer_device():
    # The optimizer wrappers keep one-element tensors (no-overflow flag, unit loss scale) made with
    # a literal device='cuda' in their __init__.
    _scope_torch("megatron.core.optimizer.optimizer", tensor=_cpu_factory(torch.tensor))


def _patch_grad_norm_device():
    # ChainedOptimizer.step computes the grad norm on every step, even with clip_grad=0. Without
    # Apex/TE the norm goes through Megatron's own l2-norm fallback in utils.py; both files make
    # their scratch and result tensors with device='cuda'.
    _scope_torch("megatron.core.optimizer.clip_grads", zeros=_cpu_factory(torch.zeros),
                 tensor=_cpu_factory(torch.tensor))
    _scope_torch("megatron.core.utils", tensor=_cpu_factory(torch.tensor))


def _type_with_cuda_names(self, dtype=None, non_blocking=False, **kwargs):
    # Only the no-argument form (asking for a type *name*) changes; conversions are untouched.
    if dtype is None and not kwargs and self.device.type == "cpu":
        return torch._C.TensorBase.type(self).replace("torch.", "torch.cuda.", 1)
    return torch._C.TensorBase.type(self, dtype, non_blocking, **kwargs)


def _with_cuda_type_names(fn):
    """``fn`` with no-argument ``Tensor.type()`` answering CUDA type names while (only while) it runs.

    Tensor.type lives on TensorBase; the shadow set on torch.Tensor is deleted afterwards.
    """

    def wrapper(*args, **kwargs):
        torch.Tensor.type = _type_with_cuda_names
        try:
            return fn(*args, **kwargs)
        finally:
            del torch.Tensor.type

    wrapper.__wrapped__ = fn
    wrapper.__name__ = fn.__name__
    return wrapper


def _patch_distrib_optimizer_type_check():
    # DistributedOptimizer sorts parameters by `param.type()` names such as
    # 'torch.cuda.FloatTensor' and raises on anything else; a CPU tensor answers
    # 'torch.FloatTensor'. It is a method call, so a module proxy cannot reach it: the patch is
    # scoped in time to this one classmethod instead.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    build = DistributedOptimizer.__dict__["_build_model_and_main_param_groups"].__func__
    DistributedOptimizer._build_model_and_main_param_groups = classmethod(_with_cuda_type_names(build))


def _patch_clip_grads_type_check():
    # clip_grad_by_total_norm_fp32 asserts every grad is a 'torch.cuda.FloatTensor' before it
    # scales them. optimizer.py imported the function by name, so both bindings are replaced.
    from megatron.core.optimizer import clip_grads, optimizer

    clip = _with_cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clip
    optimizer.clip_grad_by_total_norm_fp32 = clip


def _patch_moe_te_general_gemm():
    # moe_utils binds te_general_gemm only inside its `try: import transformer_engine` block, but
    # the router's gating GEMM tests `te_general_gemm is not None` unconditionally, so without TE
    # the name is simply missing. None selects the function's own torch.mm branch.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


class _NoDtoHStream(_NoStream):
    """The all-to-all dispatcher's device-to-host stream: its "event" is itself, already done."""

    def record_event(self, event=None):
        return self


def _no_stream_context(stream=None):
    from contextlib import nullcontext

    return nullcontext()


def _patch_moe_dispatcher_streams():
    # MoEAlltoAllTokenDispatcher copies its split sizes to the host on a side stream: it makes the
    # stream in __init__, then switches to it, records an event and waits on that event. On a CPU
    # there is no device-to-host copy to overlap; the work runs in order anyway.
    cuda_view = ModuleProxy(torch.cuda, Stream=_NoDtoHStream, current_stream=_no_current_stream,
                            stream=_no_stream_context)
    _scope_torch("megatron.core.transformer.moe.token_dispatcher", cuda=cuda_view)


def _patch_moe_host_split_sizes():
    # On a GPU the dispatcher's all-to-all split sizes leave maybe_move_tensor_to_cpu as host numpy
    # arrays; that helper converts only CUDA tensors, so on a CPU they stayed torch tensors, which
    # all_to_all_single rejects. Give token_dispatcher (its only caller) the GPU result.
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    if getattr(token_dispatcher.maybe_move_tensor_to_cpu, "_cpu_compat", False):
        return
    original = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    maybe_move_tensor_to_cpu._cpu_compat = True
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu



def _patch_grad_scaler_device():
    # Both grad scalers keep the loss scale (and the dynamic one its min scale, growth and backoff
    # factors) in one-element tensors made with a literal device='cuda'.
    _scope_torch("megatron.core.optimizer.grad_scaler", tensor=_cpu_factory(torch.tensor))


def _patch_float16_optimizer_type_check():
    # Float16OptimizerWithFloat16Params sorts parameters by `param.type()` names
    # ('torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor', 'torch.cuda.FloatTensor') and raises
    # on anything else; the same time-scoped Tensor.type() as for the distributed optimizer.
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params as F16

    if getattr(F16.__init__, "__wrapped__", None) is None:
        F16.__init__ = _with_cuda_type_names(F16.__init__)


def _same_tensor(self, *args, **kwargs):
    return self


def _patch_shared_embedding_cuda():
    # With PP > 1 and tied embeddings, the last stage zeroes its copy of the word embedding, moves
    # it with `weight.data.cuda()` and all-reduces it over the embedding group to receive the first
    # stage's values. The move is the only CUDA part; `.cuda()` answers the tensor itself while
    # (only while) this one method runs.
    from megatron.core.models.common.language_module.language_module import LanguageModule

    setup = LanguageModule.setup_embeddings_and_output_layer
    if getattr(setup, "_cpu_compat", False):
        return

    def setup_embeddings_and_output_layer(self):
        torch.Tensor.cuda = _same_tensor
        try:
            return setup(self)
        finally:
            del torch.Tensor.cuda

    setup_embeddings_and_output_layer._cpu_compat = True
    setup_embeddings_and_output_layer.__wrapped__ = setup
    LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer



def _patch_distrib_optimizer_init_type_check():
    # Before it builds the shards, DistributedOptimizer.__init__ gives every 16-bit parameter the
    # placeholders `main_param = None`, `main_param_sharded = True` -- but only if `param.type()`
    # names a CUDA half / bfloat16 tensor. On a CPU the test fails silently: the parameters this
    # rank does not own keep no `main_param` at all, and readers that fall back to the full
    # weight (training/utils.py's parameter norm) count them on every DP rank. The classmethod
    # patched by `distrib_optimizer_type_check` runs inside this constructor and removes its own
    # shadow when it returns, so this wrapper removes the shadow only if it is still there.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    init = DistributedOptimizer.__init__
    if getattr(init, "_cpu_compat", False):
        return

    def __init__(*args, **kwargs):
        torch.Tensor.type = _type_with_cuda_names
        try:
            return init(*args, **kwargs)
        finally:
            if "type" in torch.Tensor.__dict__:
                del torch.Tensor.type

    __init__._cpu_compat = True
    __init__.__wrapped__ = init
    DistributedOptimizer.__init__ = __init__



def _patch_distrib_optimizer_gather_cuda():
    # get_parameter_state_dp_zero copies this rank's optimizer shard into a CPU buffer and, unless
    # told to use the gloo group, moves it with `.cuda()` before gathering it over the DP group.
    # The `fully_reshardable` and `dp_zero_gather_scatter` checkpoint formats both save through it.
    # `.cuda()` answers the tensor itself while (only while) this one method runs; the gather is
    # the same collective on gloo.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    gather = DistributedOptimizer.get_parameter_state_dp_zero
    if getattr(gather, "_cpu_compat", False):
        return

    def get_parameter_state_dp_zero(self, *args, **kwargs):
        torch.Tensor.cuda = _same_tensor
        try:
            return gather(self, *args, **kwargs)
        finally:
            if "cuda" in torch.Tensor.__dict__:
                del torch.Tensor.cuda

    get_parameter_state_dp_zero._cpu_compat = True
    get_parameter_state_dp_zero.__wrapped__ = gather
    DistributedOptimizer.get_parameter_state_dp_zero = get_parameter_state_dp_zero



def _patch_distrib_optimizer_torch_adam_step():
    # Without Transformer Engine or Apex the inner optimizer is torch's Adam, which keeps a
    # per-parameter "step" tensor next to exp_avg and exp_avg_sq. _set_main_param_and_optimizer_states
    # copies *every* key of that state from the loaded tensors, but the fully_reshardable and
    # dp_zero_gather_scatter formats load only param / exp_avg / exp_avg_sq (the step travels in
    # param_groups and load_state_dict has already set it), so the copy stops at "step" with a
    # KeyError -- on a GPU without TE / Apex too. A missing "step" keeps the value already there.
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    setter = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(setter, "_cpu_compat", False):
        return

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return setter(self, model_param, tensors)

    _set_main_param_and_optimizer_states._cpu_compat = True
    _set_main_param_and_optimizer_states.__wrapped__ = setter
    DistributedOptimizer._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="current_device",
        scope="global",
        what='`torch.cuda.current_device()` 返回 `"cpu"`',
        why="TP 的通信函数和各种层用 `device=torch.cuda.current_device()` 分配输出缓冲，"
        "散落在许多文件的几十处，只能全局替换。",
        sites=(
            Site("megatron/core/tensor_parallel/mappings.py", 91, "device=torch.cuda.current_device()"),
            Site("megatron/core/tensor_parallel/layers.py", 261, "device=torch.cuda.current_device()"),
            Site("megatron/core/models/common/embeddings/rotary_pos_embedding.py", 162,
                 "torch.cuda.current_device()"),
            Site("megatron/core/pipeline_parallel/p2p_communication.py", 313,
                 "device=torch.cuda.current_device()"),
        ),
        apply=_patch_current_device,
        proof='`ColumnParallelLinear(gather_output=True)` 在 2 个 rank 上的输出等于用完整权重算的稠密矩阵乘',
    ),
    Patch(
        name="synchronize",
        scope="global",
        what="`torch.cuda.synchronize()` 什么也不做",
        why="CPU 上没有 CUDA stream 可等；pipeline 的 p2p 和 checkpoint 的写盘线程无条件调用它。",
        sites=(
            Site("megatron/core/pipeline_parallel/p2p_communication.py", 398, "torch.cuda.synchronize()"),
            Site("megatron/core/dist_checkpointing/strategies/filesystem_async.py", 230,
                 "torch.cuda.synchronize()"),
        ),
        apply=_patch_synchronize,
        proof='`dist_checkpointing.save` 再 `load` 一个按 TP 切分的张量，读回的值与写入的相同',
    ),
    Patch(
        name="rng_tracker",
        scope="megatron.core.tensor_parallel.random",
        what="RNG tracker 读、设、还原的是 CPU 默认生成器",
        why="`model_parallel_cuda_manual_seed` 和 `CudaRNGStatesTracker.add/fork` 调用 "
        "`torch.cuda.get_rng_state` / `manual_seed` 并设置 CUDA 生成器状态，需要 GPU；"
        "CPU 上 dropout 和初始化真正用的是 CPU 默认生成器，所以让 tracker 切换它。",
        sites=(
            Site("megatron/core/tensor_parallel/random.py", 55, "torch.cuda.random.get_rng_state"),
            Site("megatron/core/tensor_parallel/random.py", 235, "torch.cuda.get_rng_state()"),
            Site("megatron/core/tensor_parallel/random.py", 422, "torch.cuda.manual_seed"),
        ),
        apply=_patch_rng_tracker,
        proof='`model_parallel_cuda_manual_seed` 之后，同一 TP rank 的模型并行流相同、不同 TP rank 不同，离开 `fork()` 后默认流复原',
    ),
    Patch(
        name="schedules_device",
        scope="megatron.core.pipeline_parallel.schedules",
        what='`torch.zeros(..., device="cuda")` 落在 CPU 上',
        why='每个 forward-backward schedule 都用写死的 `device="cuda"` 建 token 计数器。',
        sites=(
            Site("megatron/core/pipeline_parallel/schedules.py", 596, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 983, 'device="cuda"'),
            Site("megatron/core/pipeline_parallel/schedules.py", 2138, 'device="cuda"'),
        ),
        apply=_patch_schedules_device,
        proof='`forward_backward_no_pipelining` 的 loss 和梯度等于直接用 autograd 算的',
    ),
    Patch(
        name="refit_streams",
        scope="megatron.core.resharding.copy_services.gloo_copy_service",
        what="`torch.cuda.Stream()` 和 `torch.cuda.current_stream()` 返回一个什么都不用等的替身",
        why="`swap_model_weights(..., \"gloo\")` 的 `GlooCopyService` 传输本身走 gloo 和 CPU 张量，"
        "却在构造时建一个 CUDA copy stream，传完后让当前 stream 等它；CPU 版 torch 建 stream 直接报错。",
        sites=(
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 46,
                 "torch.cuda.Stream()"),
            Site("megatron/core/resharding/copy_services/gloo_copy_service.py", 146,
                 "torch.cuda.current_stream().wait_stream"),
        ),
        apply=_patch_refit_streams,
        proof='2 个 rank 上真实的 `swap_model_weights(..., "gloo")` 把 TP=2 切开的 `ColumnParallelLinear` 权重搬进每个 rank 一份完整副本（TP=1）：搬完的权重等于 all-gather 拼起来的原权重，一半来自本 rank（本地拷贝）、一半来自另一 rank',
    ),
    Patch(
        name="torch_norm_sequence_parallel",
        scope="megatron.core.transformer.torch_norm.WrappedTorchNorm",
        what="`sequence_parallel=True` 时照常建 torch 的 RMSNorm / LayerNorm，并把它的参数标成 "
        "`sequence_parallel`",
        why="没有 Apex、TE 时 local spec 的 norm 是 `WrappedTorchNorm`，它一见 SP 就断言失败；"
        "norm 逐 token 计算，对序列分片照样正确，SP 真正需要的是 Apex / TE 的 norm 都做的标记："
        "各 TP rank 只有本片 token 的部分梯度，`finalize_model_grads` 按这个标记在 TP 群里求和。",
        sites=(
            Site("megatron/core/transformer/torch_norm.py", 32,
                 "assert not config.sequence_parallel"),
            Site("megatron/core/models/backends.py", 22, "LNImpl = WrappedTorchNorm"),
            Site("megatron/core/distributed/finalize_model_grads.py", 354,
                 'getattr(param, "sequence_parallel", False)'),
        ),
        apply=_patch_torch_norm_sequence_parallel,
        proof='local spec 的 `TransformerLayer` 在 TP=2、`sequence_parallel=True` 下建得起来，输出和输入梯度拼起来等于 TP=1；norm 的梯度各 rank 只是部分和，经 `finalize_model_grads` 在 TP 群求和后等于 TP=1',
    ),
    Patch(
        name="optimizer_device",
        scope="megatron.core.optimizer.optimizer",
        what="`torch.tensor(..., device='cuda')` 落在 CPU 上",
        why="`get_megatron_optimizer` 建出的 `FP32Optimizer` 和 `DistributedOptimizer`（经 "
        "`MixedPrecisionOptimizer`）在构造时用写死的 `device='cuda'` 建单元素张量（溢出标志、单位 loss scale）。",
        sites=(
            Site("megatron/core/optimizer/optimizer.py", 481, "device='cuda'"),
            Site("megatron/core/optimizer/optimizer.py", 485, "device='cuda'"),
            Site("megatron/core/optimizer/optimizer.py", 907, "device='cuda'"),
        ),
        apply=_patch_optimizer_device,
        proof='一个 rank 上 `get_megatron_optimizer` 建出的 `FP32Optimizer` 走两步 Adam，参数等于 `torch.optim.AdamW` 走两步',
    ),
    Patch(
        name="grad_norm_device",
        scope="megatron.core.optimizer.clip_grads, megatron.core.utils",
        what="梯度范数的临时张量和结果（`device='cuda'`）落在 CPU 上",
        why="`ChainedOptimizer.step` 每一步都算梯度范数（`clip_grad=0` 也算）；没有 Apex / TE 时走 "
        "Megatron 自己的 l2 范数实现，两处都用写死的 `device='cuda'` 建张量。",
        sites=(
            Site("megatron/core/optimizer/clip_grads.py", 103, "device='cuda'"),
            Site("megatron/core/utils.py", 1207, 'device="cuda"'),
        ),
        apply=_patch_grad_norm_device,
        proof='DP=2、分布式优化器：`step()` 返回的梯度范数（两个 rank 各持一半梯度，平方和跨 rank 相加）等于单进程全部梯度的范数',
    ),
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
            Site("megatron/core/optimizer/distrib_optimizer.py", 420,
                 "model_param.type() == 'torch.cuda.FloatTensor'"),
        ),
        apply=_patch_distrib_optimizer_type_check,
        proof='DP=2 的 `DistributedOptimizer` 走两步 Adam，参数等于单进程整批数据上的 `torch.optim.AdamW`；建完之后 `Tensor.type()` 恢复原样',
    ),
    Patch(
        name="clip_grads_type_check",
        scope="megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32",
        what="只在这个函数运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名；"
        "`optimizer.py` 按名字导入的那份引用一起替换",
        why="`clip_grad > 0` 时优化器先算总范数再调它缩放梯度；它逐个断言 "
        "`param.grad.type() == 'torch.cuda.FloatTensor'`，CPU 上的 fp32 梯度答 `torch.FloatTensor`。"
        "缩放用的临时张量（`device='cuda'`）已由 `grad_norm_device` 的模块代理放到 CPU。",
        sites=(
            Site("megatron/core/optimizer/clip_grads.py", 167,
                 "param.grad.type() == 'torch.cuda.FloatTensor'"),
            Site("megatron/core/optimizer/clip_grads.py", 174, "device='cuda'"),
        ),
        apply=_patch_clip_grads_type_check,
        proof='`clip_grad=0.05`（小于梯度范数）时 Megatron 的一步（单进程 `FP32Optimizer`、DP=2 分布式优化器）等于 `torch.nn.utils.clip_grad_norm_` 之后的 torch Adam；不裁剪时结果可分辨',
    ),
    Patch(
        name="moe_te_general_gemm",
        scope="megatron.core.transformer.moe.moe_utils",
        what="没有 Transformer Engine 时补上 `moe_utils.te_general_gemm = None`",
        why="`moe_utils` 只在成功 `import transformer_engine` 的分支里绑定 `te_general_gemm`，"
        "router 的 gating 线性层却无条件地判断它是否为 `None`：没有 TE 时这个名字不存在，"
        "每个 MoE 层的第一步就 `NameError`。设为 `None` 即走函数自带的 `torch.mm` 分支。",
        sites=(
            Site("megatron/core/transformer/moe/moe_utils.py", 1192, "te_general_gemm is not None"),
            Site("megatron/core/transformer/moe/moe_utils.py", 1225, "te_general_gemm is not None"),
        ),
        apply=_patch_moe_te_general_gemm,
        proof='一个 rank 上 `moe_utils.router_gating_linear` 的 logits 与输入、权重的梯度等于 `x @ Wᵀ` 用 autograd 算的；`te_general_gemm` 为 `None`、`HAVE_TE` 为 False',
    ),
    Patch(
        name="moe_dispatcher_streams",
        scope="megatron.core.transformer.moe.token_dispatcher",
        what="`torch.cuda.Stream()`、`current_stream()`、`stream(...)` 换成什么都不用等的替身，"
        "`record_event()` 返回一个已完成的事件",
        why="`MoEAlltoAllTokenDispatcher` 在构造时建一条类级的 device-to-host stream，"
        "每次 dispatch 都切到它上面把 split sizes 拷回主机、记一个事件再等它；CPU 版 torch 建 stream 直接报错。",
        sites=(
            Site("megatron/core/transformer/moe/token_dispatcher.py", 445, "torch.cuda.Stream()"),
            Site("megatron/core/transformer/moe/token_dispatcher.py", 871, "torch.cuda.current_stream()"),
            Site("megatron/core/transformer/moe/token_dispatcher.py", 874,
                 "torch.cuda.stream(self.cuda_dtoh_stream)"),
        ),
        apply=_patch_moe_dispatcher_streams,
        proof='一个 rank、EP=1：local spec 的 `MoELayer`（`MoEAlltoAllTokenDispatcher` + `SequentialMLP`）的输出和输入梯度等于手算的稠密 MoE（router logits 取 top-2、对这 2 个 softmax、加权求和各 expert 的 `fc2(gelu(fc1 x))`）',
    ),
    Patch(
        name="moe_host_split_sizes",
        scope="megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu",
        what="`as_numpy=True` 时把 CPU 张量也转成 numpy（GPU 上本来就得到 numpy）",
        why="all-to-all 的 `input_splits` / `output_splits` 要以主机上的整数列表交给 "
        "`all_to_all_single`；`maybe_move_tensor_to_cpu` 只转换 CUDA 张量，CPU 上它们仍是 torch 张量，"
        "`all_to_all_single` 拒收（`TypeError`）。",
        sites=(
            Site("megatron/core/transformer/moe/moe_utils.py", 1093, "tensor.is_cuda"),
            Site("megatron/core/transformer/moe/token_dispatcher.py", 880, "as_numpy=True"),
            Site("megatron/core/tensor_parallel/mappings.py", 444, "torch.distributed.all_to_all_single("),
        ),
        apply=_patch_moe_host_split_sizes,
        proof='2 个 rank、EP=2：同一个 `MoELayer` 的输出和输入梯度等于用 all-gather 来的全部 expert 手算的稠密 MoE；`input_splits` 是 numpy 数组，记录到的 6 次 `all_to_all_single` 搬的行数都等于各自的 split sizes 之和',
    ),
    Patch(
        name="grad_scaler_device",
        scope="megatron.core.optimizer.grad_scaler",
        what="`torch.tensor(..., device='cuda')` 落在 CPU 上",
        why="fp16 时 `get_megatron_optimizer` 建 `DynamicGradScaler`（给了 `loss_scale` 则建 "
        "`ConstantGradScaler`），loss scale 以及动态 scaler 的下限、增长和回退系数都是用写死的 "
        "`device='cuda'` 建的单元素张量。",
        sites=(
            Site("megatron/core/optimizer/grad_scaler.py", 15, "device='cuda'"),
            Site("megatron/core/optimizer/grad_scaler.py", 88, "device='cuda'"),
        ),
        apply=_patch_grad_scaler_device,
        proof='fp16 模型、注入一个 inf：这一步被跳过，权重逐位不变，scale 从 64 减半到 32；其余各步跟 torch AdamW 一致',
    ),
    Patch(
        name="float16_optimizer_type_check",
        scope="megatron.core.optimizer.optimizer.Float16OptimizerWithFloat16Params.__init__",
        what="只在这个构造函数运行期间，无参数的 `Tensor.type()` 返回 CUDA 类型名",
        why="bf16 / fp16（不用分布式优化器）时的优化器按 `param.type()` 的字符串区分 16 位参数"
        "（为它们建 fp32 主参数）和 fp32 参数，其余一律 `TypeError`；CPU 上的 bf16 参数答 "
        "`torch.BFloat16Tensor`。与 `distrib_optimizer_type_check` 同一种时间范围收窄的补丁。",
        sites=(
            Site("megatron/core/optimizer/optimizer.py", 671,
                 "param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']"),
        ),
        apply=_patch_float16_optimizer_type_check,
        proof='bf16 模型的 fp32 main params 走 Adam 后与 torch AdamW 相差 < 1e-6，权重等于 main params 转成 bf16',
    ),
    Patch(
        name="shared_embedding_cuda",
        scope="megatron.core.models.common.language_module.language_module.LanguageModule"
        ".setup_embeddings_and_output_layer",
        what="只在这个方法运行期间，`Tensor.cuda()` 返回张量本身",
        why="PP>1 且共享词嵌入时，最后一个 stage 把自己那份词嵌入清零、`weight.data.cuda()`，"
        "再在 embedding 群里 all-reduce，拿到第一个 stage 的初值；CPU 版 torch 在 `.cuda()` 上报错。"
        "搬到 GPU 是唯一与 CUDA 有关的一步，all-reduce 照常在 gloo 上做。",
        sites=(
            Site("megatron/core/models/common/language_module/language_module.py", 244,
                 "weight.data = weight.data.cuda()"),
        ),
        apply=_patch_shared_embedding_cuda,
        proof='PP=2、词嵌入与输出层共享：两个 stage 的两份权重开始时逐位相同；finalize 之后两份的梯度都等于两 stage 梯度之和',
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
            Site("megatron/core/optimizer/distrib_optimizer.py", 582,
                 "param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']"),
        ),
        apply=_patch_distrib_optimizer_init_type_check,
        proof='DP=2 分布式优化器、bf16：本 rank 不拥有的参数 `main_param` 为 None，各 rank 的分片恰好覆盖每个权重一次',
    ),
    Patch(
        name="distrib_optimizer_gather_cuda",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.get_parameter_state_dp_zero",
        what="只在这个方法运行期间，`Tensor.cuda()` 返回张量本身",
        why="分布式优化器的 checkpoint 格式 `fully_reshardable` 和 `dp_zero_gather_scatter` 保存时都经过它："
        "每个 DP rank 把自己那段优化器状态拷进 CPU 缓冲，不用 gloo 群时先 `.cuda()` 再在 DP 群里 all-gather / gather。"
        "搬到 GPU 是唯一与 CUDA 有关的一步，收集照常在 gloo 上做（笔记 21）。",
        sites=(
            Site("megatron/core/optimizer/distrib_optimizer.py", 1089, "send_tensor = send_tensor.cuda()"),
        ),
        apply=_patch_distrib_optimizer_gather_cuda,
        proof='DP=2：每个 rank 只拥有一半 fp32 main params，`get_parameter_state_dp_zero` 的收集把每个参数完整地放回 buffer 里它的位置，两个 rank 都是；之后 `Tensor.cuda` 恢复原样',
    ),
    Patch(
        name="distrib_optimizer_torch_adam_step",
        scope="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer._set_main_param_and_optimizer_states",
        what="加载时来源里没有 `step` 就保留已有的 `step`",
        why="没有 Transformer Engine / Apex 时最里层是 torch 的 Adam，它给每个参数存一个 `step` 张量；"
        "这个方法把优化器状态的每个键都从加载来的张量里拷贝，而 `fully_reshardable`、`dp_zero_gather_scatter` "
        "只带回 param / exp_avg / exp_avg_sq（step 走 param_groups，`load_state_dict` 已经设好），于是在 `step` 上 "
        "`KeyError`。GPU 上不装 TE / Apex 也一样（笔记 21）。",
        sites=(
            Site("megatron/core/optimizer/distrib_optimizer.py", 938, 'dst_tensors = {"param": main_param, **optim_state}'),
            Site("megatron/core/optimizer/distrib_optimizer.py", 940, "dst_tensors[key].copy_(tensors[key])"),
        ),
        apply=_patch_distrib_optimizer_torch_adam_step,
        proof='torch Adam 的状态带 `step`，加载来的张量不带：param、exp_avg、exp_avg_sq 被拷入，`step` 保持原值',
    ),
)

_applied: set[str] = set()


def apply(names: list[str] | None = None) -> list[str]:
    """Apply the patches (all, or those named) once; return the names applied so far.

    With CUDA available nothing is patched: the real code runs as published.
    """
    if torch.cuda.is_available():
        return []
    for patch in PATCHES:
        if (names is None or patch.name in names) and patch.name not in _applied:
            patch.apply()
            _applied.add(patch.name)
    return sorted(_applied)


def render_table() -> str:
    """The patch table shown on the site (markdown), one row per patched Megatron line."""
    rows = ["| 补丁 | 范围 | 做了什么 | 为什么 | 需要它的 Megatron 行 | 证明它的测试 |",
            "|---|---|---|---|---|---|"]
    for patch in PATCHES:
        links = "<br>".join(f"[`{s.path}:{s.line}`]({s.url})" for s in patch.sites)
        rows.append(f"| `{patch.name}` | `{patch.scope}` | {patch.what} | {patch.why} | {links} "
                    f"| {patch.proof} |")
    return "\n".join(rows)

