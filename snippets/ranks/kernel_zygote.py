"""A Jupyter kernel that starts in ~0.45 s: forked from a process that already imported torch and Megatron.

Every notebook nbval checks gets a fresh kernel, and every fresh kernel used to spend ~5 s of CPU
importing torch and ``megatron.core`` before its first cell did anything: 23 notebooks, ~2 minutes
of the test command's CPU. Here one *zygote* process per client (a Jupyter server, a pytest process;
under pytest-xdist one for the whole run, started by the controller and shared by its workers
through :data:`SHARED`) imports them once -- ``ipykernel`` first, then ``snippets`` (so torch is
pinned to one thread, as in any note's kernel), then torch and the Megatron modules the notes use --
and forks a kernel for each request. The child is a new session (its own process group, as
``jupyter_client`` gives any kernel), takes the launch's working directory, environment and
arguments, and runs ``ipykernel`` exactly as ``python -m ipykernel_launcher`` would. No torch code
runs in the zygote before a fork (importing is all it does), which is the condition under which
forking after ``import torch`` is safe -- the same one :mod:`snippets.ranks.launch` relies on to
fork ranks from a kernel.

The kernel spec ``megatron-study`` (``python -m snippets.ranks.kernel_zygote install``, run by
``scripts/setup.sh``) names :class:`ZygoteProvisioner`, a ``jupyter_client`` kernel provisioner
(registered in ``pyproject.toml``). It asks the zygote for a kernel instead of ``Popen``-ing one,
and manages the kernel by its pid: signals go to the kernel's process group (interrupt, kill), and
a kernel has exited when its pid is gone or a zombie. The test command selects it with
``--nbval-kernel-name megatron-study``; notebooks keep ``python3`` in their metadata, so a reader's
Jupyter runs them in a plain kernel.

Lifetimes: the zygote exits when the process that started it exits (it checks every second), and a
forked kernel exits when the zygote does (``ipykernel``'s parent poller, via ``JPY_PARENT_PID``).
Nothing outlives a killed pytest process (a killed xdist worker's kernel is shut down by nbval or,
at the latest, with the shared zygote when the run ends).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from snippets.ranks import launch

KERNEL_NAME = "megatron-study"
PROVISIONER = "megatron-study-zygote"

PRELOAD = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    *launch._PRELOAD,
    "snippets.ranks.launch",
    "snippets.record.tables",
    "snippets.record.recorder",
    "megatron.core.pipeline_parallel",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.tensor_parallel",
)
"""Imported once by the zygote (order matters: ``snippets`` sees ``ipykernel`` but not yet torch,
so it pins torch to one thread; ``ipykernel.ipkernel`` brings debugpy, which each kernel would
otherwise import as it starts). ``launch._PRELOAD`` (``snippets`` first, then torch and what every
rank needs) is what a kernel would import before its first launch anyway. Anything else a note
imports it imports itself, as before."""

START_TIMEOUT_S = 120.0
"""How long a client waits for a new zygote to finish its imports and listen."""


# ----------------------------------------------------------------------------- the zygote process


def serve(socket_path: str, parent_pid: str, *preload: str) -> None:
    """Import ``preload`` (:data:`PRELOAD`), listen on ``socket_path``, fork a kernel per request;
    exit when ``parent_pid`` is gone."""
    parent_pid = int(parent_pid)
    try:
        for module in preload or PRELOAD:
            importlib.import_module(module)
    except BaseException:
        # say why, and remove the client's directory: a client waiting for the socket sees it gone
        traceback.print_exc()
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
        sys.stderr.flush()
        os._exit(1)
    # What the imports made stays for the kernels' lifetime: out of every later full collection
    # (each one would otherwise walk torch's and megatron's objects again, in every kernel).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bound and listening under a temporary name, then renamed: a client waiting for the path to
    # appear can connect at once (between bind() and listen() it would be refused).
    listener.bind(socket_path + ".tmp")
    listener.listen(8)
    os.rename(socket_path + ".tmp", socket_path)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the client's _stop: clean up below
    try:
        while os.getppid() == parent_pid:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with conn:
                request = json.loads(_read_all(conn))
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    _become_kernel(**request)  # never returns
                conn.sendall(json.dumps({"pid": pid}).encode())
    finally:
        listener.close()
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)  # the client made it for us
        sys.stderr.flush()
        os._exit(0)  # nothing left to tear down that matters; an interpreter with torch takes ~1.5 s


def _reap(signum=None, frame=None) -> None:
    """Collect exited kernels (so none stays a zombie) and say so when one did not exit cleanly:
    its client only sees that the pid is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGTERM):
            print(
                f"kernel_zygote: kernel {pid} died of signal {os.WTERMSIG(status)}",
                file=sys.stderr,
                flush=True,
            )
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status):
            print(
                f"kernel_zygote: kernel {pid} exited with status {os.WEXITSTATUS(status)}",
                file=sys.stderr,
                flush=True,
            )


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _become_kernel(args: list[str], env: dict, cwd: str) -> None:
    """In the forked child: turn into what ``python -m ipykernel_launcher *args`` in ``cwd`` with
    ``env`` would be, then run the kernel until it is shut down."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the kernel waits for the ranks it forks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the zygote's clean-up is not the kernel's
        os.setsid()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # Exit with the zygote: ipykernel reads JPY_PARENT_PID when it is imported (in the zygote,
        # before any launch), so the parent is also given as an argument.
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        args = [*args, f"--IPKernelApp.parent_handle={os.getppid()}"]
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.argv = [sys.executable, "-m", "ipykernel_launcher", *args]
        sys.path[0] = cwd  # what `python -m` puts first
        from ipykernel import kernelapp

        kernelapp.launch_new_instance(argv=args)
        code = 0
    except SystemExit as exc:  # what ipykernel raises on a failed start, after saying why
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - os._exit below would otherwise swallow it
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ----------------------------------------------------------------------------- the client side

_zygotes: dict[tuple, tuple[subprocess.Popen, str]] = {}

SHARED = "MEGATRON_STUDY_ZYGOTE"
"""Environment variable naming the socket of a zygote that a parent process started for the
processes it starts to share (:func:`share`): the test command's pytest-xdist controller starts
one, and its workers' kernels all come from it, instead of each worker importing torch and
Megatron into a zygote of its own (~5 s of CPU each, at the busiest moment of the run)."""


def zygote(python: str = sys.executable, preload: tuple[str, ...] = PRELOAD) -> str:
    """The socket path of the zygote for ``python``: the shared one (:data:`SHARED`) when there is
    one for this Python and preload, else this process's own, started on first use."""
    shared = os.environ.get(SHARED)
    if shared and (python, tuple(preload)) == (sys.executable, PRELOAD):
        return _listening(shared, None)
    known = _zygotes.get((python, preload))
    if known and known[0].poll() is None:
        return known[1]
    proc, path = _start(python, preload)
    _listening(path, proc)
    _zygotes[python, preload] = (proc, path)
    atexit.register(_stop, proc)
    return path


def share() -> str:
    """Start this process's zygote (this Python, :data:`PRELOAD`) without waiting for its imports,
    and name its socket in :data:`SHARED`: processes started from here afterwards use it. It
    exits with this process, as any zygote exits with its client."""
    proc, path = _start(sys.executable, PRELOAD)
    _zygotes[sys.executable, PRELOAD] = (proc, path)
    atexit.register(_stop, proc)
    os.environ[SHARED] = path
    return path


def _start(python: str, preload: tuple[str, ...]) -> tuple[subprocess.Popen, str]:
    directory = tempfile.mkdtemp(prefix="zygote-")
    path = os.path.join(directory, "sock")
    # Not `-m snippets.ranks.kernel_zygote`: that would import `snippets` before ipykernel, and
    # `snippets` decides at import whether it lives in a kernel (it then pins torch to one thread).
    boot = "import ipykernel.kernelapp, sys; from snippets.ranks.kernel_zygote import serve; serve(*sys.argv[1:])"
    proc = subprocess.Popen(
        [python, "-c", boot, path, str(os.getpid()), *preload], stdin=subprocess.DEVNULL, cwd=directory
    )
    return proc, path


def _listening(path: str, proc: subprocess.Popen | None) -> str:
    """Wait until the zygote listens on ``path``; fail in one line if it exited (its error is on
    its stderr) or did not finish its imports in time."""
    deadline = time.monotonic() + START_TIMEOUT_S
    which = "the kernel zygote" if proc is not None else f"the shared kernel zygote ({SHARED}={path})"
    while not os.path.exists(path):
        if (proc is not None and proc.poll() is not None) or not os.path.isdir(os.path.dirname(path)):
            status = f" with status {proc.returncode}" if proc is not None else ""
            raise RuntimeError(f"{which} exited{status} while importing {', '.join(PRELOAD)}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
            raise RuntimeError(f"{which} did not listen within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
    return path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def fork_kernel(python: str, args: list[str], env: dict, cwd: str, preload: tuple[str, ...] = PRELOAD) -> int:
    """Ask the zygote for a kernel started with ``ipykernel_launcher`` ``args``; its pid."""
    path = zygote(python, preload)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        conn.sendall(json.dumps({"args": args, "env": env, "cwd": cwd}).encode())
        conn.shutdown(socket.SHUT_WR)
        return json.loads(_read_all(conn))["pid"]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ForkedKernel:
    """The ``subprocess.Popen`` subset ``LocalProvisioner`` uses, for a process that is not our child."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and not alive(self.pid):
            self.returncode = 0  # not our child: its exit status is not ours to read
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _provisioner_class():
    from jupyter_client.provisioning import LocalProvisioner

    class ZygoteProvisioner(LocalProvisioner):
        """``LocalProvisioner``, except that the kernel is forked by the zygote (see the module),
        and talks to its client over Unix sockets (``ipc``), not TCP ports.

        With TCP, the client picks five free ports and the kernel binds them a moment later; in
        between, any other process may take one -- and the test command runs gloo ranks, torchrun
        and a browser beside the notebooks, all binding ephemeral ports. The kernel then fails to
        bind and exits before it answers (seen twice in ~10 runs of the test command: "Kernel died
        before replying to kernel_info"). Socket files in a private directory cannot be taken."""

        ipc_dir = None

        async def pre_launch(self, **kwargs):
            km = self.parent
            if km is not None and km.transport == "tcp":  # (a restart keeps the ipc it had)
                self.ipc_dir = tempfile.mkdtemp(prefix="kernel-ipc-")
                km.transport, km.cache_ports = "ipc", False
                km.ip = os.path.join(self.ipc_dir, "k")
            return await super().pre_launch(**kwargs)

        async def cleanup(self, restart=False):
            await super().cleanup(restart)
            if self.ipc_dir and not restart:
                shutil.rmtree(self.ipc_dir, ignore_errors=True)

        async def launch_kernel(self, cmd, **kwargs):
            python, dash_m, launcher, *args = cmd
            if (dash_m, launcher) != ("-m", "ipykernel_launcher"):
                raise ValueError(f"{KERNEL_NAME} expects `python -m ipykernel_launcher ...`, got {cmd}")
            env = dict(kwargs.get("env") or os.environ)
            cwd = os.path.abspath(kwargs.get("cwd") or os.getcwd())  # ours, not the zygote's
            self.process = ForkedKernel(fork_kernel(python, args, env, cwd))
            self.pid = self.pgid = self.process.pid  # the child called setsid()
            self.cwd = cwd
            return self.connection_info

    return ZygoteProvisioner


def __getattr__(name: str):
    # The entry point names ``snippets.ranks.kernel_zygote:ZygoteProvisioner``; built on first access so
    # that the zygote itself never imports jupyter_client's provisioning machinery.
    if name == "ZygoteProvisioner":
        cls = _provisioner_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ----------------------------------------------------------------------------- the kernel spec


def install(prefix: str = sys.prefix) -> Path:
    """Write the ``megatron-study`` kernel spec under ``prefix`` (the venv): this Python, the zygote
    provisioner. Idempotent."""
    spec_dir = Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (megatron-study, preloaded torch + megatron.core)",
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER}},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
    return spec_dir


def main(argv: list[str]) -> int:
    if argv == ["install"]:
        print(f"installed kernel spec {KERNEL_NAME} in {install()}")
        return 0
    print("usage: python -m snippets.ranks.kernel_zygote install", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
