"""CPU patch for the process that forks the ranks: after it imports what the ranks need
(megatron.core asks ``torch.cuda.is_available()`` on import), a process forked from it may still
use torch's CUDA code paths' checks, i.e. it is not a "bad fork"."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snippets.cpu import devices

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys

from snippets.ranks import launch

launch.prepare_to_fork()  # what the fork server, a kernel or a test process imports
import torch


def child_sees():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        answer = [torch.cuda._is_in_bad_fork(), torch.cuda.is_available()]
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    return json.loads(os.read(read, 100))


patched = child_sees()
torch.cuda.is_available.__wrapped__()  # torch's own check, as megatron.core's import made it
unpatched = child_sees()
print(json.dumps(dict(patched=patched, unpatched=unpatched, megatron="megatron.core" in sys.modules)))
"""


@pytest.mark.skipif(devices._cuda_driver_loads(), reason="a CUDA driver is here: torch's own check runs")
def test_cuda_probe_fork_safe_ranks_forked_after_megatron_import_are_no_bad_fork():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["megatron"]
    assert seen["patched"] == [False, False]
    if torch.cuda._is_compiled():  # torch's CUDA build: its own check marks the forking process
        assert seen["unpatched"] == [True, False]
