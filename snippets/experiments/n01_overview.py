"""Note 01's experiment: Megatron's ``run_simple_mcore_train_loop.py`` as published, then fixed.

:func:`simple_loop` follows the example's ``__main__`` line by line (its line numbers are in the
comments) at the sizes ``dims`` and TP = ``tp``: ``initialize_model_parallel``, a local-spec
``GPTModel``, Megatron's ``DistributedDataParallel``, a ``MockGPTDataset`` behind a torch
``DataLoader``, ``get_forward_backward_func``, an explicit ``finalize_model_grads``, ``optim.step()``
for ``STEPS`` iterations, then ``dist_checkpointing.save`` and ``load`` of the model. With
``megatron_optimizer`` it makes the two changes the formal entry makes: ``get_megatron_optimizer``
and ``zero_grad_buffer()`` every step. The changes for a CPU are the same as the note's: gloo,
no ``torch.cuda.set_device``, ``torch.manual_seed(123)`` for the CPU-initialized weights, Core's
null tokenizer.

:func:`run` runs the loop as published and then fixed, each in a fresh checkpoint directory that
rank 0 makes and removes (:func:`snippets.experiments.n07_checkpoint.checkpoint_dir`). ``tables``
prints note 01's two tables (loss, how far the weights moved, the ``main_grad`` norm, whether
``param.grad`` is ``None``) and whether the saved weights came back. Like the published script,
the loop has no data-parallel sampler: every DP rank shuffles on its own.

:func:`wiring` shows two things the published loop gets wrong in its wiring or comments: without
``torch.manual_seed`` each TP rank shuffles from its own unseeded CPU generator
(:func:`first_batches`), and ``finalize_model_grads`` all-reduces gradients over TP only for
parameters flagged ``sequence_parallel`` (or QK layernorm, or ``average_gradients_across_tp_domain``;
:func:`layernorm_sync`, without and with SP). :func:`note_runs` is the note's one launch of both.
"""

from __future__ import annotations

import logging
import os
from functools import partial

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.tokenizers import MegatronTokenizer
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.utils.data import DataLoader

from snippets.ckpt import checkpoint_view as cv
from snippets.experiments.n07_checkpoint import checkpoint_dir
from snippets.record.tables import Table

STEPS = 5
"""Iterations of the loop (the example's ``range(5)``, :250)."""

SAMPLES = 1000
"""Samples of the mock training dataset (the example's ``[1000, None, None]``, :114)."""


def simple_loop(dims, tp, ckpt_dir, megatron_optimizer, device="cpu"):
    logging.getLogger("megatron.core").setLevel(logging.ERROR)  # CPU 上的 RNG tracker、mock 数据集缓存提示
    parallel_state.destroy_model_parallel()  # :39
    parallel_state.initialize_model_parallel(tp, 1)  # :222 → :53
    torch.manual_seed(123)
    model_parallel_cuda_manual_seed(123)  # :223
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),  # :65
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    gpt_model = GPTModel(
        config=config,  # :73
        transformer_layer_spec=get_gpt_layer_local_spec(
            qk_layernorm=dims.qk_norm, normalization=config.normalization
        ),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
        position_embedding_type="rope" if dims.rope else "learned_absolute",
    )
    gpt_model.to(device)  # :227
    gpt_model = DistributedDataParallel(  # :232-241
        config=config,
        module=gpt_model,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=False
        ),
    )
    if megatron_optimizer:
        optim = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=0.0), [gpt_model])
    else:
        optim = torch.optim.Adam(gpt_model.parameters())  # :243
    dataset = mock_train_dataset(dims)  # :100-115
    train_iterator = iter(DataLoader(dataset, batch_size=dims.micro_batch_size, shuffle=True))  # :117-119

    def loss_func(loss_mask, output_tensor):  # :145
        loss_mask = loss_mask.view(-1).float()
        loss = torch.sum(output_tensor.float().view(-1) * loss_mask) / loss_mask.sum()
        return loss, {"lm loss": loss}

    def forward_step_func(data_iterator, model):  # :124
        data = {k: v.to(device) for k, v in next(data_iterator).items()}
        output = model(data["tokens"], data["position_ids"], data["attention_mask"], labels=data["labels"])
        return output, partial(loss_func, data["loss_mask"])

    forward_backward_func = get_forward_backward_func()  # :247
    start = {n: p.detach().clone() for n, p in gpt_model.named_parameters()}
    log = []
    for _iteration in range(STEPS):  # :250
        if megatron_optimizer:
            gpt_model.zero_grad_buffer()
        optim.zero_grad()  # :251
        losses_reduced = forward_backward_func(  # :253
            forward_step_func=forward_step_func,
            data_iterator=train_iterator,
            model=gpt_model,
            num_microbatches=dims.microbatches,
            seq_length=dims.seq,
            micro_batch_size=dims.micro_batch_size,
            decoder_seq_length=dims.seq,
            forward_only=False,
        )
        finalize_model_grads([gpt_model])  # :267
        optim.step()  # :269
        # schedule 已把每个 "lm loss"（与返回的 loss 是同一个 tensor）原地除以 micro-batch 数：求和即平均
        log.append(
            dict(
                loss=sum(x["lm loss"].item() for x in losses_reduced),
                moved=max((p - start[n]).abs().max().item() for n, p in gpt_model.named_parameters()),
                main_grad_norm=sum(p.main_grad.norm().item() ** 2 for p in gpt_model.parameters()) ** 0.5,
                grad_is_none=all(p.grad is None for p in gpt_model.parameters()),
            )
        )

    trained = {k: v.clone() for k, v in gpt_model.module.state_dict().items() if torch.is_tensor(v)}
    os.makedirs(ckpt_dir, exist_ok=True)  # :275
    sharded_state_dict = gpt_model.module.sharded_state_dict(prefix="")  # :185
    dist_checkpointing.save(sharded_state_dict=sharded_state_dict, checkpoint_dir=ckpt_dir)  # :188
    with torch.no_grad():
        for p in gpt_model.parameters():
            p.zero_()  # 抹掉，证明权重来自文件
    checkpoint = dist_checkpointing.load(
        sharded_state_dict=gpt_model.module.sharded_state_dict(prefix=""), checkpoint_dir=ckpt_dir
    )  # :214
    mismatches = cv.key_mismatches(gpt_model.module.load_state_dict(checkpoint))  # :217
    restored = all(torch.equal(v, gpt_model.module.state_dict()[k]) for k, v in trained.items())
    return dict(log=log, mismatches=mismatches, restored=restored)


def run(dims, par) -> tuple:
    with checkpoint_dir("ckpt-simple-") as root:  # rank 0 建目录、广播路径，最后删掉
        return (
            simple_loop(dims, par.tp, os.path.join(root, "published"), False, par.device),
            simple_loop(dims, par.tp, os.path.join(root, "fixed"), True, par.device),
        )


def mock_train_dataset(dims):
    """The published ``get_train_data_iterator``'s dataset (:100-115); its sample order is fixed by
    ``random_seed=0`` (numpy). Only the torch ``DataLoader`` on top of it shuffles."""
    dataset_config = GPTDatasetConfig(
        random_seed=0,
        sequence_length=dims.seq,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        mid_level_dataset_surplus=0.005,
        tokenizer=MegatronTokenizer.from_pretrained(
            metadata_path={"library": "null-text"}, vocab_size=min(dims.seq, dims.vocab)
        ),
    )
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, [SAMPLES, None, None], lambda: True, dataset_config
    ).build()[0]


def first_batches(dims, dataset, seed_cpu: bool):
    """The published wiring from its seed to the first two batches, on a rank that starts like a
    fresh ``torchrun`` process: torch seeds its default CPU generator from the OS in every new
    process (:func:`torch.seed` does the same here; the launcher had seeded the forked rank). Only
    with ``seed_cpu`` does it add the note's ``torch.manual_seed(123)``. Returns the two batches'
    tokens and the position embedding, a parameter every TP rank holds whole."""
    torch.seed()
    if seed_cpu:
        torch.manual_seed(123)
    model_parallel_cuda_manual_seed(123)  # :223 -- 只给 CUDA 与 TP 的 RNG 流设种子
    config = TransformerConfig(**dims.transformer_config_kwargs(), use_cpu_initialization=True)
    model = GPTModel(  # :57-79，权重从 CPU 默认生成器取
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
    )
    train_iterator = iter(DataLoader(dataset, batch_size=dims.micro_batch_size, shuffle=True))  # :117-119
    tokens = [next(train_iterator)["tokens"] for _ in range(2)]
    return dict(tokens=tokens, position=model.embedding.position_embeddings.weight.detach().clone())


def layernorm_sync(dims, tp, sequence_parallel: bool):
    """One forward + backward of the simple loop's model under Megatron DDP, then
    ``finalize_model_grads`` recorded: every parameter that is not TP-split, with its ``main_grad``
    before and after, and the collectives ``finalize_model_grads`` issued."""
    from snippets.record import recorder

    torch.manual_seed(123)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(
        **dims.transformer_config_kwargs(),
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,  # SP 的配置检查要它；原脚本没设（层从 parallel_state 读 TP）
        sequence_parallel=sequence_parallel,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=dims.vocab,
        max_sequence_length=dims.seq,
    )
    ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=model)
    b, s = dims.micro_batch_size, dims.seq
    tokens = torch.randint(0, dims.vocab, (b, s), generator=torch.Generator().manual_seed(1))
    position_ids = torch.arange(s).expand(b, s)
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    ddp(tokens, position_ids, causal, labels=tokens).float().mean().backward()
    params = dict(model.named_parameters())
    replicated = [n for n, p in params.items() if not getattr(p, "tensor_model_parallel", False)]
    before = {n: params[n].main_grad.clone() for n in replicated}
    with recorder.record() as calls:
        finalize_model_grads([ddp])
    return dict(
        before=before,
        after={n: params[n].main_grad.clone() for n in replicated},
        flagged=[n for n in replicated if getattr(params[n], "sequence_parallel", False)],
        calls=[(c.api, c.group, list(c.ranks), c.before) for c in calls],
    )


def wiring(dims, par) -> dict:
    """Two facts behind the published loop's wiring: what each TP rank reads when nothing seeds the
    CPU generator (and with the note's seed), and which gradients ``finalize_model_grads``
    all-reduces over TP without and with sequence parallelism."""
    logging.getLogger("megatron.core").setLevel(logging.ERROR)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(par.tp, 1)  # :222
    dataset = mock_train_dataset(dims)
    return dict(
        unseeded=first_batches(dims, dataset, seed_cpu=False),
        seeded=first_batches(dims, dataset, seed_cpu=True),
        ln={sp: layernorm_sync(dims, par.tp, sp) for sp in (False, True)},
    )


def note_runs(dims, par) -> tuple:
    """Note 01's one launch: :func:`run` (what ``python -m snippets.run overview`` prints), then
    :func:`wiring`; the second reuses the imports the first paid for."""
    return run(dims, par), wiring(dims, par)


# ----------------------------------------------------------------------------- note 01's tables


def log_table(runs):
    return Table(
        ["iteration", "lm loss", "权重最大变化", "‖main_grad‖ (rank 0)", "param.grad 全是 None"],
        [
            [i, round(s["loss"], 4), round(s["moved"], 4), round(s["main_grad_norm"], 4), s["grad_is_none"]]
            for i, s in enumerate(runs[0]["log"])
        ],
    )


def checkpoint_line(label: str, runs: list) -> str:
    return f"{label} {[r['mismatches'] for r in runs]} 权重从文件复原: {[r['restored'] for r in runs]}"


def tables(results: list, dims, par) -> list:
    published, fixed = [r[0] for r in results], [r[1] for r in results]
    return [
        "原样的 simple loop（torch.optim.Adam）：",
        log_table(published),
        checkpoint_line("原样：", published),
        "同样的结构，get_megatron_optimizer + 每步 zero_grad_buffer()：",
        log_table(fixed),
        checkpoint_line("改后：", fixed),
        f"第 0 步 loss 相同（还没有更新）: {published[0]['log'][0]['loss'] == fixed[0]['log'][0]['loss']}",
    ]


def reads_table(results: list) -> Table:
    """Whether each TP rank read the same two batches as rank 0, and holds the same position
    embedding (a parameter every TP rank keeps whole), without and with ``torch.manual_seed``."""
    rows = []
    for key, label in (("unseeded", "原样（无 torch.manual_seed）"), ("seeded", "加 torch.manual_seed(123)")):
        zero = results[0][key]
        for rank, r in enumerate(results):
            same = [torch.equal(a, b) for a, b in zip(r[key]["tokens"], zero["tokens"])]
            rows.append([label, rank, same[0], same[1], torch.equal(r[key]["position"], zero["position"])])
    return Table(
        [
            "CPU 生成器",
            "TP rank",
            "batch 0 与 rank 0 相同",
            "batch 1 与 rank 0 相同",
            "position embedding 与 rank 0 相同",
        ],
        rows,
    )


def layernorm_table(results: list) -> Table:
    """Per SP setting: how many non-TP-split gradients differ across TP ranks before and after
    ``finalize_model_grads``, which are flagged ``sequence_parallel``, and its all-reduces on TP."""
    rows = []
    for sp in (False, True):
        per_rank = [r["ln"][sp] for r in results]

        def differ(when, per_rank=per_rank):
            names = [
                n
                for n in per_rank[0][when]
                if not all(torch.equal(r[when][n], per_rank[0][when][n]) for r in per_rank)
            ]
            norms = sum("layernorm" in n for n in names)
            return f"{len(names)}（norm {norms}、bias {len(names) - norms}）" if names else "0"

        tp_calls = [
            f"{api} {group} {ranks} {shape}"
            for api, group, ranks, shape in per_rank[0]["calls"]
            if len(ranks) > 1
        ]
        rows.append(
            [
                sp,
                len(per_rank[0]["before"]),
                len(per_rank[0]["flagged"]),
                differ("before"),
                "、".join(tp_calls) or "无",
                differ("after"),
            ]
        )
    return Table(
        [
            "sequence_parallel",
            "非 TP 切分的参数",
            "标了 sequence_parallel",
            "finalize 前 TP rank 间不同",
            "finalize 在 TP 群的通信",
            "finalize 后不同",
        ],
        rows,
    )
