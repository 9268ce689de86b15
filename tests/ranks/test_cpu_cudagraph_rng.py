"""CUDA-graph RNG (``use_cudagraphable_rng``, graph-safe states) is refused by name on CPU ranks,
in one line, where torch's CPU build would raise Megatron's assert or a CUDA initialization error;
the ordinary tracker keeps working next to it. Found by Megatron's own ``test_random.py``."""

import pytest
import torch

from snippets.ranks.launch import run_ranks, warm_up


@pytest.fixture(scope="module", autouse=True)
def server():
    warm_up()


def _graph_rng_refusals():
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker, convert_cuda_rng_state

    from snippets.cpu import CpuUnsupported

    messages = []
    try:
        CudaRNGStatesTracker(use_cudagraphable_rng=True)
        messages.append("tracker not refused")
    except CpuUnsupported as error:
        messages.append(str(error))
    tracker = CudaRNGStatesTracker()  # the ordinary tracker, as the notes use it
    tracker.add("s", 123)
    with tracker.fork("s"):
        first = torch.rand(4)
    try:
        convert_cuda_rng_state(tracker.get_states()["s"], to_graphable=True)
        messages.append("conversion not refused")
    except CpuUnsupported as error:
        messages.append(str(error))
    tracker.reset()
    tracker.add("s", 123)
    with tracker.fork("s"):
        again = torch.rand(4)
    return messages, torch.equal(first, again)


def test_cudagraph_rng_refused_in_one_line_and_the_ordinary_tracker_still_works():
    ((messages, same),) = run_ranks(_graph_rng_refusals, 1)
    assert len(messages) == 2
    for message in messages:
        assert message.startswith("use_cudagraphable_rng") and "\n" not in message
        assert "not supported by the CPU layer" in message
    assert same
