"""``weight-sync``: read an RL run's launch script or config and say how it moves its weights.

After every policy update the rollout engine needs the new weights. How they travel is decided
by a handful of settings; this package reads them from what RL users actually have and prints
the path, with the bytes per GPU and a wire-time lower bound (:mod:`snippets.rl.refit_cost`):

* a verl launch script (``.sh``): :mod:`.shell` runs its variables, finds the trainer command,
  :mod:`.hydra` applies its overrides on verl's defaults (:mod:`.facts`), :mod:`.verl` explains;
* a verl YAML config, nested or with flat dotted keys: :mod:`.verl`;
* a NeMo RL YAML config with its ``defaults:`` chain: :mod:`.nemo_rl`.

:mod:`.values` holds the config tree, its ``${...}`` interpolations and the values nobody can know
before the run; :mod:`.report` the lines both frameworks share; :mod:`.cli` the command.
"""

from snippets.rl.weight_sync.cli import main

__all__ = ["main"]
