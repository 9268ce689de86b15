"""``python -m snippets.run``: the runner's command line; the code is :mod:`snippets.ranks.runner`."""

import os
import sys

from snippets.ranks.runner import main

if __name__ == "__main__":
    status = main()
    # Leave at once: the job is over (process group destroyed, tables printed), and tearing down an
    # interpreter that holds torch and Megatron costs each rank ~1.5 s of CPU for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
