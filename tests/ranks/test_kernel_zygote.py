"""The ``megatron-study`` kernel: forked from a zygote, it must behave like a fresh ``python3`` kernel.

nbval runs every note in it (``scripts/test.sh``), so what matters is that a note cannot tell the
difference: the launch's working directory and environment, torch already imported and pinned to one
thread (as ``import snippets`` does in any kernel), ranks forked from it, interrupts, shutdown; and
that nothing outlives its client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from snippets.ranks import kernel_zygote

pytestmark = pytest.mark.skipif(
    kernel_zygote.KERNEL_NAME not in KernelSpecManager().find_kernel_specs(),
    reason="kernel spec not installed: run scripts/setup.sh",
)


def run(kc, code: str, timeout: float = 60) -> str:
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"error: {msg['content']['ename']}")

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return "".join(out).strip()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("kernel-cwd")
    km, kc = start_new_kernel(
        kernel_name=kernel_zygote.KERNEL_NAME,
        cwd=str(cwd),
        env={**os.environ, "ZYGOTE_TEST_VAR": "from-the-launch"},
    )
    yield km, kc, cwd
    km.shutdown_kernel(now=True)


def test_kernel_is_forked_with_torch_imported_and_runs_ranks(kernel):
    km, kc, cwd = kernel
    assert km.provisioner.__class__.__name__ == "ZygoteProvisioner"
    # Before this cell imports anything: torch and megatron.core are there, one thread, and
    # snippets knows it lives in a kernel (so it forks ranks from it).
    assert (
        run(
            kc,
            "import sys, torch, snippets\n"
            "print('megatron.core' in sys.modules, torch.get_num_threads(), snippets.KERNEL_FORKS_RANKS)",
        )
        == "True 1 True"
    )
    assert (
        run(kc, "import os; print(os.getcwd(), os.environ['ZYGOTE_TEST_VAR'], sys.path[0])")
        == f"{cwd} from-the-launch {cwd}"
    )
    assert (
        run(
            kc,
            "from snippets.ranks.launch import run_ranks\nimport torch.distributed as dist\n"
            "print(run_ranks(lambda: dist.get_rank() * 10, 2))",
        )
        == "[0, 10]"
    )
    # Its own session and process group (so an interrupt or kill reaches the ranks it forks too).
    assert os.getpgid(km.provisioner.pid) == km.provisioner.pid
    # Unix sockets in a private directory, not TCP ports another process could take first.
    info = km.get_connection_info()
    assert info["transport"] == "ipc" and info["ip"].startswith(km.provisioner.ipc_dir)


def test_interrupt_stops_a_running_cell(kernel):
    km, kc, _ = kernel
    threading.Timer(1.0, km.interrupt_kernel).start()
    start = time.monotonic()
    assert run(kc, "import time; time.sleep(30)") == "error: KeyboardInterrupt"
    assert time.monotonic() - start < 15
    assert run(kc, "print(1 + 1)") == "2"  # and the kernel goes on


def test_a_relative_working_directory_is_the_clients(tmp_path, monkeypatch):
    """A relative ``cwd`` is resolved where the client is, as ``Popen(cwd=...)`` would (the zygote
    itself runs elsewhere)."""
    (tmp_path / "notes").mkdir()
    monkeypatch.chdir(tmp_path)
    km, kc = start_new_kernel(kernel_name=kernel_zygote.KERNEL_NAME, cwd="notes")
    try:
        assert run(kc, "import os; print(os.getcwd())") == str(tmp_path / "notes")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_shutdown_leaves_no_kernel_process_and_no_socket_files():
    km, kc = start_new_kernel(kernel_name=kernel_zygote.KERNEL_NAME)
    pid, ipc_dir = km.provisioner.pid, km.provisioner.ipc_dir
    assert kernel_zygote.alive(pid) and os.listdir(ipc_dir)
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    assert not kernel_zygote.alive(pid)
    assert not os.path.exists(ipc_dir)


CLIENT = textwrap.dedent("""
    import os, sys, time
    from snippets.ranks import kernel_zygote
    pid = kernel_zygote.fork_kernel(sys.executable, ["-f", sys.argv[1]], dict(os.environ), os.getcwd(),
                                    preload=("ipykernel.kernelapp",))
    proc, path = kernel_zygote._zygotes[sys.executable, ("ipykernel.kernelapp",)]
    print(proc.pid, pid, path, flush=True)
    time.sleep(600)
""")


def test_a_killed_client_takes_its_zygote_and_kernels_with_it(tmp_path):
    """SIGKILL the process that started the zygote (as when a pytest worker is killed): the zygote
    notices within a second, and its kernels follow it (ipykernel's parent poller)."""
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(tmp_path / "kernel.json")], stdout=subprocess.PIPE, text=True
    )
    try:
        zygote, kernel, socket_path = client.stdout.readline().split()
        zygote, kernel = int(zygote), int(kernel)
        assert kernel_zygote.alive(zygote) and kernel_zygote.alive(kernel)
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    deadline = time.monotonic() + 10
    while (kernel_zygote.alive(zygote) or kernel_zygote.alive(kernel)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not kernel_zygote.alive(zygote), "the zygote outlived its client"
    assert not kernel_zygote.alive(kernel), "a forked kernel outlived its zygote"
    assert not os.path.exists(os.path.dirname(socket_path)), "the zygote left its socket directory"


@pytest.mark.skipif(
    kernel_zygote.SHARED not in os.environ, reason="not under the test command's pytest-xdist controller"
)
def test_the_workers_share_the_controllers_zygote():
    """Under ``scripts/test.sh`` (pytest-xdist) the controller started one zygote before the
    workers existed (tests/conftest.py); a worker's kernels come from it, and the worker has
    started none of its own."""
    shared = os.environ[kernel_zygote.SHARED]
    assert kernel_zygote.zygote() == shared and os.path.exists(shared)
    assert (sys.executable, kernel_zygote.PRELOAD) not in kernel_zygote._zygotes


def test_a_shared_zygote_that_is_gone_fails_in_one_line(tmp_path, monkeypatch):
    gone = tmp_path / "zygote-gone" / "sock"  # its directory was removed when it exited
    monkeypatch.setenv(kernel_zygote.SHARED, str(gone))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^the shared kernel zygote \(MEGATRON_STUDY_ZYGOTE=.*\) exited "):
        kernel_zygote.zygote()
    assert time.monotonic() - start < 60  # not the 120 s a zygote gets to finish its imports


def test_a_log_handler_made_before_the_fork_does_not_write_into_the_cell(kernel):
    # importing megatron.training points the root logger at the kernel's stdout, at INFO
    # (training.py:36); a rank's log lines used to reach the cell or not, by timing.
    km, kc, cwd = kernel
    code = (
        "import logging, time, megatron.training.config.common_config\n"
        "from snippets.ranks.launch import run_ranks\n"
        "def chatty():\n"
        "    logging.getLogger('megatron.core.x').info('a rank logs at INFO')\n"
        "    time.sleep(0.3)\n"
        "    return logging.getLevelName(logging.getLogger().level)\n"
        "print(run_ranks(chatty, 2)); time.sleep(0.5)"
    )
    assert run(kc, code) == "['INFO', 'INFO']"
