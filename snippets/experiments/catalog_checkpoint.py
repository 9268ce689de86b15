"""Runner entries for notes 01, 07 and 21: their experiments' sizes, checks and memory estimates.

Torch-free, like the rest of the registry (:mod:`snippets.experiments`): the runner imports it to
refuse a bad command before it starts anything.
"""

from __future__ import annotations

from snippets.experiments import Experiment  # noqa: F401

ENTRIES: list = []
