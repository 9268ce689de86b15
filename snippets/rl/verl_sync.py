"""``python -m snippets.rl.verl_sync CONFIG``: the old name of the ``weight-sync`` command.

Note 22 and older instructions call it by this name; it runs :func:`snippets.rl.weight_sync.main`
unchanged, so it reads verl launch scripts and NeMo RL configs too.
"""

from __future__ import annotations

import sys

from snippets.rl.weight_sync.cli import main as _main
from snippets.rl.weight_sync.values import ConfigError

__all__ = ["ConfigError", "main"]


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog="python -m snippets.rl.verl_sync")


if __name__ == "__main__":
    sys.exit(main())
