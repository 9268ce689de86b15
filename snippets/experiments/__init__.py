"""The notes' experiments, one module per note (``n01_overview`` ... ``n23_journey``), and their
registry (:mod:`snippets.experiments.registry`: every entry, importable without torch).

``from snippets.experiments import EXPERIMENTS, Parallel`` is what the notes and the runner use.
"""

from snippets.experiments.registry import EXPERIMENTS, PARALLEL_FLAGS, Experiment, Parallel, problems

__all__ = ["EXPERIMENTS", "Experiment", "PARALLEL_FLAGS", "Parallel", "problems"]
