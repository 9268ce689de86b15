"""pytest plugin for ``scripts/upstream_tests.sh``: Megatron-LM's own unit tests on CPU ranks.

The only change to ``megatron.core`` is the project's CPU layer (``snippets.cpu.apply()``). The
rest of this file is *test-side*: each shim in :data:`SHIMS` changes only what the test files
themselves call (their ``device="cuda"``, their ``torch.cuda`` queries, their NCCL start-up), never
what Megatron's code sees. A call from a file under the tests directory is the test's own; a call
from anywhere else goes to torch unchanged.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import distributed_c10d as c10d
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.device_mesh import DeviceMesh

import snippets  # noqa: F401  (warning filters, before Megatron warns)
from snippets import cpu
from snippets.cpu.base import ModuleProxy, NoStream, on_cpu

os.environ["TORCH_GLOO_LAZY_INIT"] = "1"  # SHIMS: "gloo groups connect on first use"
cpu.apply()  # the one and only patch of megatron.core
torch.set_num_threads(1)  # eight ranks share the host's cores

TESTS = Path(os.environ["UPSTREAM_TESTS_DIR"]).resolve()
_ROOTS = tuple({str(TESTS), os.path.abspath(os.environ["UPSTREAM_TESTS_DIR"])})

SHIMS = [
    (
        "Utils.initialize_distributed",
        "the tests' start-up joins the world over gloo, not NCCL, and picks no GPU",
    ),
    (
        "gloo groups connect on first use",
        "NCCL makes a group's communicator at its first collective, gloo connects every pair when the "
        "group is made (TORCH_GLOO_LAZY_INIT=1 makes it wait, as NCCL does). test_schedules' *_with_custom_pgs "
        "tests call dist.new_group with their own PP group's ranks, so two groups of different ranks are "
        "made under one name and their eager connects wait on each other; they never talk over them",
    ),
    (
        "new_group(backend='nccl') from test files",
        "a group the test itself asks NCCL for (test_expert_all_gather_group's two all-gather groups) is made "
        "over gloo, like the world; Megatron's own new_group calls go to torch unchanged",
    ),
    ("Utils.set_world_size", "asks torch.cuda.device_count() for the world size: the torchrun world instead"),
    ("skipif CUDA not available", "markers whose reason names CUDA / GPU availability are dropped"),
    (
        "torch in test modules",
        'the tests\' own factories read device="cuda" as the CPU; torch.device("cuda") too',
    ),
    (
        "torch.cuda in test modules",
        "the tests' own manual_seed / get_rng_state / set_device / device_count / "
        "memory queries / Stream / Event answer for the CPU (the default generator plays the CUDA one)",
    ),
    ("DeviceMesh in test modules", 'a mesh the test builds with "cuda" is built on the CPU'),
    ("Tensor.cuda / Tensor.to / Module.cuda / Module.to", "called from a test file: stay on the CPU"),
    ("ensure_test_data", "the conftest's dataset download (no network) is skipped"),
    (
        "process groups after each test",
        "Megatron's destroy_model_parallel drops its groups without destroying them (only the *_GLOO "
        "ones); on GPUs NCCL groups cost little until used, here every one is a gloo group with its own "
        "threads: after a test, groups that parallel_state no longer holds are destroyed",
    ),
    (
        "remove_sharded_tensors in test modules",
        "test_remove_sharded_tensors has rank 0 rewrite the checkpoint right after every rank has listed and "
        "read it, with no barrier between (test_serialization.py:567-580): with 8 ranks on 2 shared cores a "
        "slower rank reads it half-rewritten, fails, and its TempNamedDir finalizer deletes the directory "
        "under rank 0. Rank 0's call first waits until each rank has read the metadata (counted in the "
        "tests' own store by the test module's FileSystemReader); if the call raises, rank 0 joins the "
        "others' barrier before re-raising, so the failure stays this test's",
    ),
    (
        "_set_random_seed in test modules",
        "megatron.training's version seeds the model-parallel RNG streams only if torch.cuda.device_count() > 0 "
        "(initialize.py:447), so on a CPU the MoE tests' experts find no expert-parallel-rng stream: while a "
        "test's own call runs, that module's torch counts the torchrun world's devices, as on GPUs",
    ),
]


def _from_tests(depth: int = 2) -> bool:
    return sys._getframe(depth).f_code.co_filename.startswith(_ROOTS)


# --------------------------------------------------------------- torch as the test files see it

_FACTORIES = {
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "linspace",
    "tensor",
    "as_tensor",
    "eye",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "normal",
    "empty_strided",
}


def _device(*args, **kwargs):
    if args and isinstance(args[0], str):
        args = (on_cpu(args[0]),) + args[1:]
    return torch.device(*args, **kwargs)


def _factory(fn):
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = on_cpu(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


class _Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        return None

    def synchronize(self):
        return None

    def wait(self, stream=None):
        return None

    def elapsed_time(self, other):
        return 0.0

    def query(self):
        return True


_TEST_CUDA = ModuleProxy(
    torch.cuda,
    is_available=lambda: True,
    device_count=lambda: int(os.environ.get("WORLD_SIZE", "1")),
    set_device=lambda device: None,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=lambda device="cuda": torch.get_rng_state(),
    set_rng_state=lambda state, device="cuda": torch.set_rng_state(state),
    empty_cache=lambda: None,
    memory_allocated=lambda device=None: 0,
    max_memory_allocated=lambda device=None: 0,
    reset_peak_memory_stats=lambda device=None: None,
    Stream=NoStream,
    current_stream=lambda device=None: NoStream(),
    default_stream=lambda device=None: NoStream(),
    Event=_Event,
)


class _TestTorch(ModuleProxy):
    def __getattr__(self, name):
        if name == "cuda":
            return _TEST_CUDA
        if name == "device":
            return _device
        value = getattr(torch, name)
        return _factory(value) if name in _FACTORIES else value


_TEST_TORCH = _TestTorch(torch)


def _move_args(args, kwargs):
    args = tuple(on_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
    if "device" in kwargs:
        kwargs = {**kwargs, "device": on_cpu(kwargs["device"])}
    return args, kwargs


def _install_method_shims():
    tensor_to, module_cuda, module_to = torch.Tensor.to, torch.nn.Module.cuda, torch.nn.Module.to
    dist_new_group = torch.distributed.new_group

    def tensor_cuda(self, *args, **kwargs):
        if _from_tests():
            return self
        return torch._C.TensorBase.cuda(self, *args, **kwargs)

    def to(self, *args, **kwargs):
        if _from_tests():
            args, kwargs = _move_args(args, kwargs)
        return tensor_to(self, *args, **kwargs)

    def m_cuda(self, device=None):
        return self if _from_tests() else module_cuda(self, device)

    def m_to(self, *args, **kwargs):
        if _from_tests():
            args, kwargs = _move_args(args, kwargs)
        return module_to(self, *args, **kwargs)

    def new_group(*args, **kwargs):
        if _from_tests():
            if kwargs.get("backend") == "nccl":
                kwargs["backend"] = "gloo"
            if len(args) > 2 and args[2] == "nccl":  # new_group(ranks, timeout, backend, ...)
                args = (*args[:2], "gloo", *args[3:])
        return dist_new_group(*args, **kwargs)

    torch.distributed.new_group = new_group
    torch.Tensor.cuda = tensor_cuda  # a shadow the CPU layer's time-scoped patches put back intact
    torch.Tensor.to = to
    torch.nn.Module.cuda = m_cuda
    torch.nn.Module.to = m_to


# --------------------------------------------------------------- the tests' start-up


def _initialize_distributed():
    from tests.unit_tests.test_utilities import Utils
    from torch._C._distributed_c10d import PrefixStore
    from torch.distributed import rendezvous

    if not torch.distributed.is_initialized() and Utils.rank >= 0:
        address = f"tcp://{os.getenv('MASTER_ADDR', 'localhost')}:{os.getenv('MASTER_PORT', '6000')}"
        store, _, _ = next(rendezvous(address, Utils.rank, Utils.world_size, timeout=timedelta(minutes=1)))
        Utils.store = PrefixStore("default_pg", store)
        torch.distributed.init_process_group(
            backend="gloo",
            world_size=Utils.world_size,
            rank=Utils.rank,
            store=Utils.store,
            timeout=timedelta(seconds=int(os.environ.get("UPSTREAM_PG_TIMEOUT", "120"))),
        )
        torch.distributed.barrier()
    Utils.inited = True


def _set_world_size(world_size=None, rank=None):
    from tests.unit_tests.test_utilities import Utils

    world = int(os.environ.get("WORLD_SIZE", "1"))
    Utils.world_size = world if world_size is None else world_size
    if torch.distributed.is_initialized() and Utils.world_size != torch.distributed.get_world_size():
        torch.distributed.destroy_process_group()
    if rank is None:
        Utils.rank = int(os.environ["LOCAL_RANK"])
        if Utils.rank >= Utils.world_size:
            Utils.rank = -1
    else:
        Utils.rank = rank


def _no_download(assets_dir):
    raise ImportError("no dataset download on CPU runs")


def _install_start_up_shims():
    # Run when pytest loads this plugin, before it loads the tests' conftest.py.
    sys.path.insert(0, os.path.dirname(os.path.abspath(os.environ["UPSTREAM_TESTS_DIR"])))
    try:
        from tests.test_utils.python_scripts import download_unit_tests_dataset
    except ImportError:
        pass
    else:
        download_unit_tests_dataset.download_and_extract_asset = _no_download
    from tests.unit_tests.test_utilities import Utils

    Utils.initialize_distributed = staticmethod(_initialize_distributed)
    Utils.set_world_size = staticmethod(_set_world_size)
    _install_method_shims()


_install_start_up_shims()


_CUDA_SKIP = re.compile(r"cuda|gpu", re.IGNORECASE)
_NOT_CUDA = re.compile(r"transformer.?engine|\bte\b|apex|flash|nvshmem|deep.?ep|hybridep|fp8", re.IGNORECASE)


def _is_cuda_skip(mark) -> bool:
    reason = str(mark.kwargs.get("reason", ""))
    return mark.name == "skipif" and bool(_CUDA_SKIP.search(reason)) and not _NOT_CUDA.search(reason)


def _read_key(path) -> str:
    return f"upstream/metadata_read/{os.path.abspath(os.fspath(path))}"


class _TestFileSystemReader(FileSystemReader):
    """torch's reader as a test module sees it: each read of the metadata is counted in the store."""

    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        self._counted_path = path

    def read_metadata(self, *args, **kwargs):
        from tests.unit_tests.test_utilities import Utils

        metadata = super().read_metadata(*args, **kwargs)
        if Utils.store is not None:
            Utils.store.add(_read_key(self._counted_path), 1)
        return metadata


def _after_readers(fn):
    """The tests' rank-0-only remove_sharded_tensors: after every rank's read; on error, meet the barrier."""

    def wrapper(checkpoint_dir, *args, **kwargs):
        from tests.unit_tests.test_utilities import Utils

        deadline = time.monotonic() + 120
        key = _read_key(checkpoint_dir)
        while Utils.store is not None and Utils.store.add(key, 0) < Utils.world_size:
            if time.monotonic() > deadline:
                break  # let the test itself report whatever is wrong
            time.sleep(0.05)
        try:
            return fn(checkpoint_dir, *args, **kwargs)
        except Exception:
            torch.distributed.barrier()
            raise

    return wrapper


def _seeded_as_on_gpus(fn):
    """megatron.training's ``_set_random_seed`` as a test calls it: the device count of a GPU machine."""
    from megatron.training import initialize

    def wrapper(*args, **kwargs):
        real = initialize.torch
        initialize.torch = ModuleProxy(
            torch, cuda=ModuleProxy(torch.cuda, device_count=lambda: int(os.environ.get("WORLD_SIZE", "1")))
        )
        try:
            return fn(*args, **kwargs)
        finally:
            initialize.torch = real

    return wrapper


class _TestDeviceMesh:
    """torch's DeviceMesh as a test module sees it: a "cuda" mesh is built on the CPU."""

    @staticmethod
    def from_group(group, device_type, *args, **kwargs):
        return DeviceMesh.from_group(group, on_cpu(device_type), *args, **kwargs)

    def __new__(cls, device_type, *args, **kwargs):
        return DeviceMesh(on_cpu(device_type), *args, **kwargs)


# Megatron's CI (tests/unit_tests/run_ci_test.sh) runs `-m "not flaky"` in its lts environment and
# `-m "not flaky_in_dev"` in dev: a test with both markers runs in neither.
_MEGATRON_CI_NEVER = {"flaky", "flaky_in_dev"}
_NEVER_WHY = "marked flaky and flaky_in_dev: Megatron's CI runs it in neither environment"


def pytest_collection_modifyitems(session, config, items):
    from megatron.core.dist_checkpointing import remove_sharded_tensors
    from megatron.training.initialize import _set_random_seed

    for name, module in list(sys.modules.items()):
        if not name.startswith("tests."):
            continue
        if getattr(module, "torch", None) is torch:
            module.torch = _TEST_TORCH
        if getattr(module, "DeviceMesh", None) is DeviceMesh:
            module.DeviceMesh = _TestDeviceMesh
        if getattr(module, "remove_sharded_tensors", None) is remove_sharded_tensors:
            module.remove_sharded_tensors = _after_readers(remove_sharded_tensors)
        if getattr(module, "FileSystemReader", None) is FileSystemReader:
            module.FileSystemReader = _TestFileSystemReader
        if getattr(module, "_set_random_seed", None) is _set_random_seed:
            module._set_random_seed = _seeded_as_on_gpus(_set_random_seed)
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if not _is_cuda_skip(m)]
        pytestmark = getattr(getattr(item, "module", None), "pytestmark", None)
        if isinstance(pytestmark, list):
            pytestmark[:] = [m for m in pytestmark if not _is_cuda_skip(m)]
    if os.environ.get("UPSTREAM_WITH_FLAKY") != "1":
        keep, never = [], []
        for item in items:
            (never if _MEGATRON_CI_NEVER <= {m.name for m in item.iter_markers()} else keep).append(item)
        if never:
            items[:] = keep
            config.hook.pytest_deselected(items=never)
            _record([{"id": item.nodeid, "outcome": "deselected", "message": _NEVER_WHY} for item in never])


# --------------------------------------------------------------- process groups between tests


def _groups_parallel_state_holds() -> set:
    from megatron.core import parallel_state as ps

    held = {c10d.GroupMember.WORLD}
    for value in vars(ps).values():
        if isinstance(value, dict):
            value = list(value.values())
        if not isinstance(value, (list, tuple)):
            value = [value]
        held.update(v for v in value if isinstance(v, c10d.ProcessGroup))
    return held


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # Seen without this: after 20 tests of test_serialization.py each rank had ~1100 threads
    # (730 pt_gloo_runloop, 366 gloo_tcp_loop), the load average passed 2500, one test took minutes.
    yield
    if torch.distributed.is_initialized():
        held = _groups_parallel_state_holds()
        for group in [g for g in list(c10d._world.pg_map) if g not in held]:
            torch.distributed.destroy_process_group(group)


# --------------------------------------------------------------- results, as they happen

_RESULTS = os.environ.get("UPSTREAM_RESULTS")  # rank 0 appends one line per test (a timeout keeps them)


def _record(rows: list[dict]) -> None:
    if _RESULTS and os.environ.get("LOCAL_RANK", "0") == "0":
        with open(_RESULTS, "a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


def pytest_collection_finish(session):
    _record([{"id": item.nodeid, "outcome": "collected"} for item in session.items])


def pytest_runtest_logreport(report):
    if not _RESULTS or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    outcome = None
    if report.when == "call" or report.outcome != "passed":
        outcome = "skipped" if report.skipped else report.outcome
    if report.when == "call" and hasattr(report, "wasxfail"):
        outcome = "skipped"
    if outcome:
        message = report.longrepr.reprcrash.message if hasattr(report.longrepr, "reprcrash") else ""
        if report.skipped and isinstance(report.longrepr, tuple):
            message = report.longrepr[2]
        _record([{"id": report.nodeid, "outcome": outcome, "message": message[:300]}])
