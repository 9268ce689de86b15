"""The parallel sizes of one run, in one object that checks them once: :class:`ParallelDims`.

Everything that takes parallel sizes asks this object instead of re-checking them: the launcher
(:class:`snippets.ranks.launch.Grid`, which refuses bad sizes before any process starts), the
registry (:func:`snippets.experiments.registry.problems`, which the runner calls before it starts a
job), and the experiments themselves (``par.dp``, ``par.backend`` on every rank). Modelled on
torchtitan's ``ParallelDims``; the layout is Megatron's ``initialize_model_parallel``:

* ``world = tp * pp * cp * dp`` -- one model replica spans ``tp * pp * cp`` ranks, the rest is
  data parallel;
* experts cut the same ranks differently: ``world = etp * pp * ep * edp``, so ``ep`` must divide
  the ``world / (etp * pp)`` ranks left for experts (``etp`` = expert tensor parallel, ``tp``
  unless the run fixes it);
* ``vp`` (virtual pipeline, model chunks per pipeline rank) needs a pipeline; sequence parallel
  (``sp``) splits the sequence over the TP group, so it needs one.

Torch-free: the runner refuses a bad command with it before importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

_POSITIVE = ("world", "tp", "pp", "cp", "ep")
_POSITIVE_OR_NONE = ("vp", "etp")


@dataclass(frozen=True)
class ParallelDims:
    """The parallel sizes of one run: ``world`` ranks, ``tp * pp * cp`` per model replica, the rest
    data parallel (``dp``).

    Construction refuses only what no run can have (a size that is not a positive int, with
    :class:`ValueError`). Sizes that do not fit together are listed by :meth:`problems` -- a
    note may build them on purpose, to let Megatron refuse -- and :meth:`check` raises on them.
    ``device`` is ``"cuda"`` under ``torchrun`` on GPUs and ``"cpu"`` otherwise; ``backend`` is
    the matching ``torch.distributed`` backend.
    """

    world: int
    tp: int = 1  # tensor parallel
    pp: int = 1  # pipeline parallel
    vp: int | None = None  # virtual pipeline size (None = not interleaved)
    cp: int = 1  # context parallel
    ep: int = 1  # expert parallel
    etp: int | None = None  # expert tensor parallel (None = follows tp)
    sp: bool = False  # sequence parallel
    device: str = "cpu"

    WORLD: ClassVar[str] = "world size"
    """How messages name the world size (:class:`~snippets.ranks.launch.Grid` says ``world_size``,
    the name of ``run_ranks``' argument)."""

    def __post_init__(self):
        for name in _POSITIVE + _POSITIVE_OR_NONE:
            value = getattr(self, name)
            if value is None and name in _POSITIVE_OR_NONE:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                label = self.WORLD if name == "world" else name
                raise ValueError(f"{label} must be a positive int, got {value!r}")

    # ------------------------------------------------------------------ derived sizes

    @property
    def model_ranks(self) -> int:
        """Ranks of one model replica: ``tp * pp * cp``."""
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.world // self.model_ranks

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    # ------------------------------------------------------------------ the checks, once

    def problems(self) -> list[str]:
        """Every way these sizes do not fit together, one sentence each (empty = fine)."""
        out = []
        world = f"{self.WORLD} {self.world}"
        model = self.model_ranks
        if self.world % model:
            out.append(f"{world} is not divisible by tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {model}")
        etp_name = "tp" if self.etp is None else "etp"
        expert_model = self.expert_tp * self.pp
        if out:
            pass  # the expert layout cuts the same ranks: no second sentence about the same sizes
        elif self.world % expert_model:
            out.append(
                f"{world} is not divisible by {etp_name}*pp = {self.expert_tp}*{self.pp} = "
                f"{expert_model} (the expert layout)"
            )
        elif (self.world // expert_model) % self.ep:
            out.append(
                f"ep {self.ep} does not divide the {self.world // expert_model} ranks left for "
                f"experts ({world} / ({etp_name} {self.expert_tp} * pp {self.pp}))"
            )
        if self.vp and self.pp < 2:
            out.append("--vp (interleaved 1F1B) needs --pp 2 or more")
        if self.sp and self.tp < 2:
            out.append("--sequence-parallel needs --tp 2 or more")
        return out

    def check(self) -> ParallelDims:
        """``self``, or :class:`ValueError` with the first problem."""
        found = self.problems()
        if found:
            raise ValueError(found[0])
        return self

    def describe(self) -> str:
        """``8 ranks = tp 2 x pp 2 x cp 1 x dp 2, ep 2`` for the runner's header."""
        sizes = f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp}"
        extra = "".join(
            [
                f", vp {self.vp}" if self.vp else "",
                f", ep {self.ep}" if self.ep > 1 else "",
                f", etp {self.etp}" if self.etp is not None and self.ep > 1 else "",
                ", sequence parallel" if self.sp else "",
            ]
        )
        return f"{self.world} ranks = {sizes}{extra}"


FLAGS = ("tp", "pp", "vp", "cp", "ep", "sp")
"""The sizes the runner takes as flags (``--tp`` ... ``--sequence-parallel``); an experiment says
which of them it reads."""

__all__ = ["FLAGS", "ParallelDims"]
