"""Model-parallel RNG streams and activation recompute, read off the real objects (note 24).

``tensor_parallel/random.py`` keeps named RNG *streams* in a ``CudaRNGStatesTracker``:
``model_parallel_cuda_manual_seed`` creates three of them per rank and ``tracker.fork(name)`` swaps
one into the device generator for the duration of a block (TP-region dropout). Its ``checkpoint``
(``CheckpointFunction``) and ``CheckpointWithoutOutput`` save every generator's state at forward
and put it back before they recompute. The helpers here observe that from outside, without
re-implementing any of it:

* :func:`stream_seeds` -- the seed each stream was created from, read back from the tracker's own
  states (the seed whose fresh generator has exactly that state);
* :func:`dropout_masks` -- one dropout mask drawn outside ``fork()`` and one inside, the way
  ``bias_dropout_add`` and ``DotProductAttention`` draw theirs;
* :class:`SavedTensors` -- what autograd keeps for backward, measured with
  ``torch.autograd.graph.saved_tensors_hooks``: bytes of distinct storages, parameters excluded,
  read when asked (a storage ``CheckpointWithoutOutput`` has released then counts 0 bytes);
* :func:`count_forwards` -- how often a module's ``forward`` ran (once more per recompute).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F

STREAMS = ("data-parallel-rng", "model-parallel-rng", "expert-parallel-rng")
"""The tracker's three stream names, as ``model_parallel_cuda_manual_seed`` adds them."""


def formula_seeds(seed: int, tp_rank: int, ep_rank: int, etp_rank: int) -> dict[str, int]:
    """The seeds ``model_parallel_cuda_manual_seed`` computes (random.py L412-L428), by name."""
    return {
        "data-parallel-rng": seed,
        "model-parallel-rng": seed + 2718 + tp_rank,
        "expert-parallel-rng": seed + 1024 + 100 * ep_rank + etp_rank,
    }


def stream_seeds(tracker, device: str = "cpu") -> dict[str, int]:
    """Each stream's seed, recovered from the tracker: the one of ``tracker.seeds_`` whose freshly
    seeded generator state equals the stream's stored state (streams not yet drawn from)."""
    found = {}
    for name, state in tracker.get_states().items():
        for seed in sorted(tracker.seeds_):
            fresh = torch.Generator(device=device).manual_seed(seed).get_state()
            if torch.equal(fresh.cpu(), state.cpu()):
                found[name] = seed
    return found


def ranks_sharing(rows: list[dict], name: str) -> list[list[int]]:
    """The ranks grouped by the seed their stream ``name`` got (``rows``: per rank ``rank``, ``seeds``)."""
    by_seed: dict[int, list[int]] = {}
    for r in rows:
        by_seed.setdefault(r["seeds"][name], []).append(r["rank"])
    return sorted(by_seed.values())


def dropout_masks(n: int, p: float, device: str = "cpu") -> tuple[list[bool], list[bool]]:
    """``(inside, outside)``: the keep-mask of ``F.dropout`` on ``n`` ones inside
    ``get_cuda_rng_tracker().fork()`` (the TP stream) and outside it (the default generator)."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    ones = torch.ones(n, device=device)
    outside = F.dropout(ones, p) != 0
    with get_cuda_rng_tracker().fork():
        inside = F.dropout(ones, p) != 0
    return inside.tolist(), outside.tolist()


def mask_pairs(rows: list[dict]) -> list[list]:
    """For every pair of ranks: same TP rank?, masks equal inside ``fork()``, equal outside.
    ``rows`` are per rank: ``rank``, ``tp_rank``, ``inside``, ``outside``."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            out.append(
                [
                    f"{a['rank']}–{b['rank']}",
                    a["tp_rank"] == b["tp_rank"],
                    a["inside"] == b["inside"],
                    a["outside"] == b["outside"],
                ]
            )
    return out


class SavedTensors:
    """Inside ``with SavedTensors(params) as saved:``, every tensor autograd saves for backward is
    noted by a weak reference (neither copied nor kept alive). :meth:`nbytes` sums the distinct
    storages among those still alive, leaving out the parameters' (a weight saved by a matmul is
    not activation memory), at the moment it is called: a graph that was dropped (the inner graph
    of a checkpoint's no-grad forward) no longer counts. :meth:`mark` starts a new phase:
    ``nbytes(phase)`` counts only what was saved after it, alive or not (what a recompute saved
    before backward freed it)."""

    def __init__(self, params=()):
        self._params = {p.untyped_storage().data_ptr() for p in params}
        self._saved: list[tuple[int, weakref.ref, int, int]] = []  # phase, tensor, storage ptr, bytes
        self._phase = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        storage = t.untyped_storage()
        self._saved.append((self._phase, weakref.ref(t), storage.data_ptr(), storage.nbytes()))
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def mark(self) -> None:
        self._phase += 1

    def nbytes(self, phase: int | None = None) -> int:
        seen, total = set(), 0
        for p, ref, ptr, size in self._saved:
            if phase is None:  # now: only what is still alive, at its present size
                t = ref()
                if t is None:
                    continue
                ptr, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            elif p != phase:
                continue
            if size == 0 or ptr in self._params or ptr in seen:
                continue
            seen.add(ptr)
            total += size
        return total


@contextmanager
def count_forwards(module):
    """``with count_forwards(m) as calls:`` -- ``calls`` is a list with one entry per run of
    ``m.forward`` (``"grad"`` or ``"no_grad"``: a checkpoint's first forward runs without grad)."""
    calls: list[str] = []
    handle = module.register_forward_hook(
        lambda *_: calls.append("grad" if torch.is_grad_enabled() else "no_grad")
    )
    try:
        yield calls
    finally:
        handle.remove()
