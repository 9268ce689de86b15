"""Model code: the local spec's norm under sequence parallelism, and the tied word embedding of the
last pipeline stage (moved with ``.cuda()`` while its first values arrive)."""

from __future__ import annotations

import copy

from snippets.cpu.base import Patch, Site, replace_once, same_tensor, tensor_attr_while


def _sequence_parallel_marks(original):
    # RMSNorm and LayerNorm act on each token alone, so a sequence shard is normalized exactly as
    # the full sequence would be; what SP needs is the marking Apex's FusedLayerNorm and TE's norms
    # do: weights flagged `sequence_parallel`, so finalize_model_grads sums their partial gradients
    # over TP. Only the SP case changes.
    def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
        if not config.sequence_parallel:
            return original(cls, config, hidden_size, eps, **kwargs)
        view = copy.copy(config)  # the same config, seen without SP by the assert only
        view.sequence_parallel = False
        norm = original(cls, view, hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    return __new__


def _patch_torch_norm_sequence_parallel():
    # Without Apex or Transformer Engine the local spec's norm is WrappedTorchNorm, which refuses
    # sequence_parallel.
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    replace_once(WrappedTorchNorm, "__new__", _sequence_parallel_marks)


def _patch_shared_embedding_cuda():
    # With PP > 1 and tied embeddings, the last stage zeroes its copy of the word embedding, moves
    # it with `weight.data.cuda()` and all-reduces it over the embedding group to receive the first
    # stage's values. The move is the only CUDA part.
    from megatron.core.models.common.language_module.language_module import LanguageModule

    replace_once(LanguageModule, "setup_embeddings_and_output_layer", tensor_attr_while("cuda", same_tensor))


PATCHES = (
    Patch(
        name="torch_norm_sequence_parallel",
        scope="megatron.core.transformer.torch_norm.WrappedTorchNorm",
        what="`sequence_parallel=True` 时照常建 torch 的 RMSNorm / LayerNorm，并把它的参数标成 "
        "`sequence_parallel`",
        why="没有 Apex、TE 时 local spec 的 norm 是 `WrappedTorchNorm`，它一见 SP 就断言失败；"
        "norm 逐 token 计算，对序列分片照样正确，SP 真正需要的是 Apex / TE 的 norm 都做的标记："
        "各 TP rank 只有本片 token 的部分梯度，`finalize_model_grads` 按这个标记在 TP 群里求和。",
        sites=(
            Site("megatron/core/transformer/torch_norm.py", 50, "assert not config.sequence_parallel"),
            Site("megatron/core/models/backends.py", 37, "LNImpl = WrappedTorchNorm"),
            Site(
                "megatron/core/distributed/finalize_model_grads.py",
                452,
                'getattr(param, "sequence_parallel", False)',
            ),
        ),
        apply=_patch_torch_norm_sequence_parallel,
        proof="local spec 的 `TransformerLayer` 在 TP=2、"
        "`sequence_parallel=True` 下建得起来，"
        "输出和输入梯度拼起来等于 TP=1；norm 的梯度各 rank 只是部分和，"
        "经 `finalize_model_grads` 在 TP 群求和后等于 TP="
        "1",
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
            Site(
                "megatron/core/models/common/language_module/language_module.py",
                307,
                "weight.data = weight.data.cuda()",
            ),
        ),
        apply=_patch_shared_embedding_cuda,
        proof="PP=2、词嵌入与输出层共享：两个 stage 的两份权重开始时逐位相同；"
        "finalize 之后两份的梯度都等于两 stage 梯度之和",
    ),
)
