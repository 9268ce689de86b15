"""From a command line to a ``TransformerConfig``: which flag fills which field (note 04).

Megatron-LM does not list the model flags by hand. In
``megatron/training/arguments.py::_add_network_size_args`` (:2195 at ``core_v0.19.0``) an
``ArgumentGroupFactory`` (``megatron/training/argument_utils.py``:45) walks the fields of
``TransformerConfig`` and adds one flag per field -- ``hidden_size`` becomes ``--hidden-size`` with
``dest="hidden_size"`` -- except for a list of excluded fields. Later
``core_transformer_config_from_args`` (``argument_utils.py``:277 since 0.19; it was in
``arguments.py``) copies back every ``args`` attribute whose name is a field, then overrides a
handful of fields by hand. So for most fields "which flag" is just the field's name, and the
interesting part is the exceptions.

This module restates the naming rule of ``ArgumentGroupFactory`` and keeps the exclusion list and the
hand-written overrides as data. Since core 0.19 both files are in the pip package:
``tests/unit/test_model_args.py`` checks all three against the installed ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing

EXCLUDED = frozenset(
    {
        # arguments.py::_add_network_size_args, the `exclude` list: no flag is generated for these
        "timers",
        "finalize_model_grads_func",
        "grad_scale_func",
        "no_sync_func",
        "grad_sync_func",
        "param_sync_func",
        "_cpu_offloading_context",
        "init_method",
        "output_layer_init_method",
        "embedding_init_method",
        "activation_func",
        "pipeline_model_parallel_layout",
        "window_size",
        "window_attn_skip_freq",
        "no_rope_freq",
        "moe_layer_freq",
        "linear_attention_freq",
        "moe_router_load_balancing_type",
        "moe_aux_loss_coeff",
        "cp_comm_type",
        "cuda_graph_scope",
        "virtual_pipeline_model_parallel_size",
        "params_dtype",
        "enable_autocast",
        "autocast_dtype",
        "num_microbatches_with_partial_activation_checkpoints",
        "tp_comm_overlap_disable_qkv",
        "tp_comm_overlap_disable_fc1",
        "pipeline_dtype",
        "variable_seq_lengths",
        "batch_p2p_comm",
        "batch_p2p_sync",
        "deallocate_pipeline_outputs",
        "cpu_offloading",
        "cpu_offloading_activations",
        "cpu_offloading_weights",
        "cpu_offloading_double_buffering",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "softmax_scale",
        "gated_linear_unit",
        "bias_activation_fusion",
        "activation_func_fp8_input_store",
        "test_mode",
        "memory_efficient_layer_norm",
        "fused_single_qkv_rope",
        "fp8_dot_product_attention",
        "fp8_multi_head_attention",
        "tp_only_amax_red",
        "use_kitchen",
        "moe_token_dropping",
        "cuda_graph_use_single_mempool",
        "cuda_graph_retain_backward_graph",
        "disable_parameter_transpose_cache",
        "inference_sampling_seed",
        "use_inference_optimized_layers",
        "heterogeneous_block_specs",
        "hetereogenous_dist_checkpoint",
        "quant_recipe",
        "tp_comm_atomic_ag",
        "tp_comm_atomic_rs",
        "moe_router_topk_limited_devices",
        "inference_rng_tracker",
        "use_te_rng_tracker",
        "log_max_attention_logit",
        "barrier_with_L1_time",
        "num_moe_experts",
        "fp8_param",
        "gradient_accumulation_fusion",
        "overlap_p2p_comm",
        "attention_softmax_in_fp32",
        "masked_softmax_fusion",
        "persist_layer_norm",
        "bias_dropout_fusion",
        "apply_rope_fusion",
        "moe_grad_scale_func",
        "mtp_grad_scale_func",
        "experimental_attention_variant_loss_scale_func",
        "cuda_graph_modules",
        "fp4_param",
        "mamba_training_ssm_states_dtype",
        "gtp_weight_remat_size",
        "expert_gtp_weight_remat_size",
    }
)

OVERRIDES = {
    # core_transformer_config_from_args, after the by-name copy: field -> what it is set from
    "persist_layer_norm": "not args.no_persist_layer_norm",
    "deallocate_pipeline_outputs": "恒为 True",
    "pipeline_dtype": "args.params_dtype（validate_args 由 --bf16 / --fp16 算出）",
    "batch_p2p_comm": "not args.overlap_p2p_comm",
    "num_moe_experts": "args.num_experts（--num-experts）",
    "rotary_interleaved": "args.rotary_interleaved",
    "num_layers_in_first_pipeline_stage": "args.decoder_first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "args.decoder_last_pipeline_num_layers",
    "fp8_param": "args.fp8_param_gather",
    "fp4_param": "args.fp4_param_gather",
    "activation_func": "--swiglu 时为 F.silu（--squared-relu、--quick-geglu 时为对应函数）",
    "gated_linear_unit": "--swiglu 或 --quick-geglu 时为 True",
    "bias_activation_fusion": "args.bias_swiglu_fusion 或 args.bias_gelu_fusion",
    "init_method": "--init-method-xavier-uniform 时为 xavier_uniform_",
    "num_query_groups": "仅在 --group-query-attention 时取 args.num_query_groups，否则 None",
    "config_logger_dir": "args.config_logger_dir",
    "cp_comm_type": "只给一个值时取 args.cp_comm_type[0]",
    "is_hybrid_model": "给了 --hybrid-layer-pattern 时为 True",
    "experimental_attention_variant": "--hybrid-layer-pattern 含 DS attention 时为 'dsa'",
    "inference_sampling_seed": "args.seed",
    "moe_latent_size": "args.moe_latent_size",
}


def cli_flags(field: dataclasses.Field) -> list[str]:
    """The option strings ``ArgumentGroupFactory`` gives a field ([] if it gets none)."""
    if field.name in EXCLUDED or not field.init:
        return []
    meta = field.metadata.get("argparse_meta", {})
    if "arg_names" in meta:  # the field's own metadata wins
        return list(meta["arg_names"])
    stem = field.name.replace("_", "-")
    # A bool flag (Optional[bool] too) is store_true only when its default is False; any other
    # default (True, None) makes it a store_false switch spelled --no-x / --disable-x.
    if _unwrap_optional(field.type) is bool and not field.default == False:  # noqa: E712
        return [f"--no-{stem}", f"--disable-{stem}"]
    return [f"--{stem}"]


def _unwrap_optional(annotation):
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        return args[0]
    return annotation


def where_from(field: dataclasses.Field) -> str:
    """How ``core_transformer_config_from_args`` fills a field, in one line."""
    flags = cli_flags(field)
    copied = f"{' / '.join(flags)} → args.{field.name}" if flags else ""
    if field.name in OVERRIDES:
        return f"{copied}，随后改为{OVERRIDES[field.name]}" if copied else OVERRIDES[field.name]
    return copied or "没有命令行参数（用 dataclass 缺省值）"


def transformer_config_fields() -> dict[str, dataclasses.Field]:
    from megatron.core.transformer import TransformerConfig

    return {f.name: f for f in dataclasses.fields(TransformerConfig)}
