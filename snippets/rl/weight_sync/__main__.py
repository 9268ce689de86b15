"""``python -m snippets.rl.weight_sync RUN``: the same as the ``weight-sync`` command."""

import sys

from snippets.rl.weight_sync.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m snippets.rl.weight_sync"))
