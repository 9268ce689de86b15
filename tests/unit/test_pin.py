"""The environment runs the pinned megatron-core, and a different one is refused in one line."""

import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import snippets
from snippets.site import sources

ROOT = Path(__file__).resolve().parents[2]
FAKE = "import importlib.metadata as m; m.version = lambda name: '0.16.1'\n"


def test_installed_megatron_core_is_the_pin():
    assert metadata.version("megatron-core") == snippets.MEGATRON_CORE_PIN


def test_pyproject_constraints_and_tag_name_the_same_pin():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"megatron-core=={snippets.MEGATRON_CORE_PIN}" in deps
    pinned = re.search(r"^megatron-core==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned and pinned[1] == snippets.MEGATRON_CORE_PIN
    assert sources.TAG == f"core_v{snippets.MEGATRON_CORE_PIN}"


def test_another_version_is_refused_in_one_line():
    run = subprocess.run([sys.executable, "-c", FAKE + "import snippets"], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "snippets: megatron-core 0.16.1 is installed, but these notes are pinned to megatron-core=="
        f"{snippets.MEGATRON_CORE_PIN} (tag core_v{snippets.MEGATRON_CORE_PIN}); run `bash scripts/setup.sh` "
        "and use its .venv"
    ]


def test_a_notebook_cell_shows_one_line():
    code = FAKE + textwrap.dedent(
        """
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance().run_cell("import snippets")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    shown = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(shown) == 1 and shown[0].startswith("PinMismatch: megatron-core 0.16.1 is installed"), (
        run.stdout
    )
