"""Test kinds by folder, the test processes' rank forking, and the site tests' shared fixtures.

Every test gets the marker of its folder (:data:`KINDS`): ``pytest -m unit`` selects the same tests
as ``pytest tests/unit``, and ``-m "not site"`` leaves out the build and browser tests.

The site tests' fixtures build the site once per session and serve it locally.

By default the real site is built (mkdocs.yml, docs/, notes/*.ipynb). To develop the site
before notes exist, set ``MEGATRON_SITE_FIXTURE=1``: the build then runs on a temporary copy
of the project whose notes/ holds tests/fixtures/sample_note.ipynb (as 01_sample_note.ipynb,
with a jupytext-style .py twin that must not become a page).
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_NOTE = ROOT / "tests" / "fixtures" / "sample_note.ipynb"
NOTE_NAME = re.compile(r"^\d\d_[A-Za-z0-9_]+\.ipynb$")


@dataclass
class Site:
    dir: Path  # the built site
    notes_dir: Path  # the notes/ the build read (real or fixture copy)
    log: str  # mkdocs build output
    seconds: float
    note_names: list[str] = field(default_factory=list)  # NN_slug.ipynb rendered as pages

    def note_page(self, nb_name: str) -> Path:
        return self.dir / "notes" / Path(nb_name).stem / "index.html"


def _fixture_project(tmp: Path) -> tuple[Path, Path]:
    """A copy of the site sources whose notes/ is the fixture notebook."""
    project = tmp / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "hooks", project / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs", project / "docs", symlinks=True)
    notes = project / "docs" / "notes"
    if notes.is_symlink() or notes.is_file():
        notes.unlink()
    elif notes.exists():
        shutil.rmtree(notes)
    notes.mkdir()
    shutil.copy(FIXTURE_NOTE, notes / "01_sample_note.ipynb")
    (notes / "01_sample_note.py").write_text(
        "# %% [markdown]\n# # The .py twin: must not become a page\n", encoding="utf-8"
    )
    return project / "mkdocs.yml", notes


def fixture_mode() -> bool:
    return os.environ.get("MEGATRON_SITE_FIXTURE") == "1"


def expected_note_names() -> list[str]:
    """Notes the site will render, known at collection time (for parametrizing tests)."""
    if fixture_mode():
        return ["01_sample_note.ipynb"]
    return sorted(p.name for p in (ROOT / "notes").glob("*.ipynb") if NOTE_NAME.match(p.name))


def _build(config: Path, out: Path) -> tuple[str, float, int]:
    start = time.monotonic()
    # A subprocess, not mkdocs in-process: mkdocs-jupyter monkeypatches nbconvert globally.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(config), "-d", str(out)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return proc.stdout + proc.stderr, time.monotonic() - start, proc.returncode


def _site_dir(basetemp: Path) -> Path:
    tmp = basetemp / ("site-fixture" if fixture_mode() else "site-real")
    tmp.mkdir(exist_ok=True)
    return tmp


def _build_once(tmp: Path, lock) -> dict:
    """Build into ``tmp`` unless a build already did; ``lock`` (an open file) is held throughout."""
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = tmp / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    if fixture_mode():
        config, notes_dir = _fixture_project(tmp)
    else:
        config, notes_dir = ROOT / "mkdocs.yml", ROOT / "notes"
    log, seconds, code = _build(config, tmp / "built")
    result = dict(log=log, seconds=seconds, code=code, notes_dir=str(notes_dir))
    done.write_text(json.dumps(result))
    return result


SITE_TESTS = (
    "test_site.py",
    "test_browser.py",
    "test_backlinks.py",
    "test_generated_pages.py",
    "test_explorers.py",
    "test_calculator.py",
    "test_drift.py",
    "test_cpu_compat.py",
)
"""Test files that use the built site (the ``site`` fixture)."""


def pytest_configure(config):
    """In every process that runs tests (each xdist worker, or the one process without xdist),
    before any test module imports torch: pin torch to one thread so this process forks its ranks
    itself, as a notebook kernel does (``snippets.fork_ranks_from_this_process``). It imports torch
    and megatron.core for its own tests anyway; a fork server would import them a second time.
    Two workers on two cores lose nothing by one intra-op thread each."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None) in (None, 0):
        import snippets

        snippets.fork_ranks_from_this_process()


KINDS = ("unit", "ranks", "experiments", "site")
"""The folders of tests/, one kind of test each; each is also a marker (registered in pyproject.toml)."""


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's kind, so ``-m unit`` (or ``-m "ranks or unit"``) selects by kind."""
    tests = ROOT / "tests"
    for item in items:
        try:
            kind = Path(item.path).relative_to(tests).parts[0]
        except ValueError:  # a notebook under notes/, or a test outside tests/
            continue
        if kind in KINDS:
            item.add_marker(kind)


def pytest_collection_finish(session):
    """Everything imported so far (torch, megatron.core, the collected tests) lives until the end:
    freeze it, so that each later full garbage collection does not walk it again (~0.3 s each)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_sessionstart(session):
    """Start building the site at once, in the background of the process that runs the session
    (under pytest-xdist, the otherwise idle controller): by the time a worker reaches a site test
    the build is done or under way, instead of starting then while the other worker waits. The
    controller also starts the notebooks' shared kernel zygote, before the workers exist."""
    config = session.config

    def uses_site(arg: str) -> bool:
        path = Path(arg.split("::")[0]).resolve()
        return path in (ROOT / "tests", ROOT / "tests" / "site") or path.name in SITE_TESTS

    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _share_the_kernel_zygote(config)
    if not any(uses_site(arg) for arg in config.args):
        return
    tmp = _site_dir(config._tmp_path_factory.getbasetemp())
    lock = open(tmp / "lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # taken now, before any worker can ask for the site

    def build():
        try:
            _build_once(tmp, lock)
        finally:
            lock.close()

    threading.Thread(target=build, name="early-site-build", daemon=True).start()


def _share_the_kernel_zygote(config) -> None:
    """Under pytest-xdist with the ``megatron-study`` kernel, start the one kernel zygote the
    workers' notebooks share (``snippets.ranks.kernel_zygote.share``): it imports torch and Megatron
    once for the run, beside the site build, instead of once in each worker."""
    if not config.getoption("numprocesses", None) or config.getoption("nbval_kernel_name", None) is None:
        return
    from snippets.ranks import kernel_zygote

    if config.getoption("nbval_kernel_name") == kernel_zygote.KERNEL_NAME:
        kernel_zygote.share()


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Site:
    """The site, built once per test run, into the run's shared temporary directory: by the
    session's own process from its start (:func:`pytest_sessionstart`), or else by the first
    worker to get here, while the others wait on a lock and then reuse it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's base directory, common to all workers
    tmp = _site_dir(shared)
    with open(tmp / "lock", "w") as lock:
        result = _build_once(tmp, lock)
    if result["code"] != 0:
        pytest.fail(f"mkdocs build --strict failed (rc={result['code']}):\n{result['log']}", pytrace=False)
    notes_dir = Path(result["notes_dir"])
    names = sorted(p.name for p in notes_dir.glob("*.ipynb") if NOTE_NAME.match(p.name))
    return Site(
        dir=tmp / "built", notes_dir=notes_dir, log=result["log"], seconds=result["seconds"], note_names=names
    )


@pytest.fixture(scope="session")
def note_names(site) -> list[str]:
    """The notes rendered by this build; an empty site fails rather than passing vacuously."""
    if not site.note_names:
        pytest.fail(
            f"no notes/NN_slug.ipynb in {site.notes_dir}: nothing to check "
            "(set MEGATRON_SITE_FIXTURE=1 to test the site on the fixture note)",
            pytrace=False,
        )
    return site.note_names


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep pytest output clean
        pass


@pytest.fixture(scope="session")
def site_url(site):
    """The built site served on 127.0.0.1, an ephemeral port, from a daemon thread."""
    handler = functools.partial(_QuietHandler, directory=str(site.dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
