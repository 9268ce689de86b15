"""snippets.tp.tp_linear (our readable layers) computes what Megatron's ColumnParallelLinear and
RowParallelLinear compute -- outputs, input grads, weight grads, bias grads -- at TP=2 and TP=4,
with and without sequence parallel; and both equal one dense nn.Linear on one process.

Every rank checks its own shard against the slice of the dense result it should hold, so a
wrong split, a missing all-reduce or a bias added twice fails here."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up

S, B, HIDDEN, FFN = 4, 2, 6, 8  # column: HIDDEN -> FFN, row: FFN -> HIDDEN (like an MLP)

CASES = [
    # (layer, gather_output / input_is_parallel, sequence_parallel)
    ("column", False, False),
    ("column", True, False),
    ("column", False, True),
    ("row", True, False),
    ("row", False, False),
    ("row", True, True),
]


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _check_layers(tp, cases):
    """On each rank: the real layer, ours and a dense nn.Linear on the same full tensors."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import layers as megatron_layers
    from megatron.core.utils import init_method_normal

    from snippets.tp import tp_linear

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    group, r = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    report = {}
    for kind, flag, sp in cases:
        config = ModelParallelConfig(
            tensor_model_parallel_size=tp, use_cpu_initialization=True, sequence_parallel=sp
        )
        torch.manual_seed(0)  # the same full weight, input and upstream grad on every rank
        size_in, size_out = (HIDDEN, FFN) if kind == "column" else (FFN, HIDDEN)
        full_bias = torch.randn(size_out)
        x = torch.randn(S, B, size_in)
        grad = torch.randn(S, B, size_out)
        if kind == "column":
            real = megatron_layers.ColumnParallelLinear(
                size_in,
                size_out,
                config=config,
                init_method=init_method_normal(0.5),
                bias=True,
                gather_output=flag,
                keep_master_weight_for_test=True,
            )
            with torch.no_grad():
                real.bias.copy_(full_bias.chunk(tp)[r])
            ours = tp_linear.ColumnParallelLinear(
                size_in,
                size_out,
                tp_group=group,
                gather_output=flag,
                sequence_parallel=sp,
                master_weight=real.master_weight,
                master_bias=full_bias,
            )
        else:
            real = megatron_layers.RowParallelLinear(
                size_in,
                size_out,
                config=config,
                init_method=init_method_normal(0.5),
                bias=True,
                input_is_parallel=flag,
                skip_bias_add=False,
                keep_master_weight_for_test=True,
            )
            with torch.no_grad():
                real.bias.copy_(full_bias)
            ours = tp_linear.RowParallelLinear(
                size_in,
                size_out,
                tp_group=group,
                input_is_parallel=flag,
                sequence_parallel=sp,
                master_weight=real.master_weight,
                master_bias=full_bias,
            )

        dense = torch.nn.Linear(size_in, size_out)
        with torch.no_grad():
            dense.weight.copy_(real.master_weight)
            dense.bias.copy_(full_bias)
        x_dense = x.clone().requires_grad_()
        y_dense = dense(x_dense)
        y_dense.backward(grad)

        # Which slice of each dense tensor this rank holds (None: the whole tensor).
        if kind == "column":
            x_dim = 0 if sp else None
            y_dim = None if flag else -1
            w_dim, b_dim = 0, 0
        else:
            x_dim = -1 if flag else None
            y_dim = 0 if sp else None
            w_dim, b_dim = 1, None

        def local(t, dim):
            return t if dim is None else t.chunk(tp, dim)[r]

        got = {}
        for name, layer in (("real", real), ("ours", ours)):
            xi = local(x, x_dim).clone().requires_grad_()
            out = layer(xi)
            y = out[0] if isinstance(out, tuple) else out
            y.backward(local(grad, y_dim))
            bias_grad = layer.bias.grad.clone()
            if kind == "row" and sp:
                # Under SP each rank's bias grad covers its own positions only; Megatron marks the
                # bias `sequence_parallel` and finalize_model_grads sums it over TP. Do that here.
                dist.all_reduce(bias_grad, group=group)
            got[name] = dict(y=y.detach(), dx=xi.grad, dw=layer.weight.grad, db=bias_grad)

        expected = dict(
            y=local(y_dense.detach(), y_dim),
            dx=local(x_dense.grad, x_dim),
            dw=local(dense.weight.grad, w_dim),
            db=local(dense.bias.grad, b_dim),
        )
        report[(kind, flag, sp)] = {
            f"{who} {key}": (
                tuple(got[who][key].shape) == tuple(expected[key].shape)
                and torch.allclose(got[who][key], expected[key], atol=1e-5)
            )
            for who in got
            for key in expected
        } | {
            f"ours == real {key}": torch.allclose(got["ours"][key], got["real"][key], atol=1e-6)
            for key in expected
        }
    return report


@pytest.mark.parametrize("tp", [2, 4])
def test_ours_equals_megatron_equals_dense(tp):
    for rank, report in enumerate(run_ranks(_check_layers, tp, tp, CASES)):
        for case, checks in report.items():
            failed = [name for name, ok in checks.items() if not ok]
            assert not failed, f"tp={tp} rank {rank} case {case}: {failed}"


def _mappings_agree():
    """Our f, g and sequence-parallel pair against Megatron's functions, forward and backward."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import mappings

    from snippets.tp import tp_linear

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    group, r = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    pairs = [
        (tp_linear.CopyToModelParallelRegion, mappings.copy_to_tensor_model_parallel_region),
        (tp_linear.ReduceFromModelParallelRegion, mappings.reduce_from_tensor_model_parallel_region),
        (tp_linear.GatherFromModelParallelRegion, mappings.gather_from_tensor_model_parallel_region),
        (tp_linear.ScatterToModelParallelRegion, mappings.scatter_to_tensor_model_parallel_region),
        (tp_linear.GatherFromSequenceParallelRegion, mappings.gather_from_sequence_parallel_region),
        (
            tp_linear.ReduceScatterToSequenceParallelRegion,
            mappings.reduce_scatter_to_sequence_parallel_region,
        ),
    ]
    ok = []
    for ours, theirs in pairs:
        torch.manual_seed(10 + r)  # different values on each rank, so a missing sum shows
        x = torch.randn(4, 2, 6)
        results = []
        for fn in (lambda t: ours.apply(t, group), lambda t: theirs(t, group=group)):
            xi = x.clone().requires_grad_()
            y = fn(xi)
            torch.manual_seed(20 + r)
            y.backward(torch.randn(y.shape))
            results.append((y.detach().clone(), xi.grad))
        (y1, g1), (y2, g2) = results
        ok.append((ours.__name__, torch.allclose(y1, y2) and torch.allclose(g1, g2)))
    return ok


def test_our_mappings_match_megatrons():
    for ok in run_ranks(_mappings_agree, 2):
        assert all(flag for _, flag in ok), ok
