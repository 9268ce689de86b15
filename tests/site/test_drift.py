"""The drift report, on a small fake 'newer' checkout made from the installed 0.16.1 files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snippets.site import drift, sources

CORE = "megatron/core/"


def _copy(src_root: Path, dst_root: Path, path: str) -> Path:
    target = dst_root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src_root / path, target)
    return target


@pytest.fixture()
def newer(tmp_path):
    """A checkout where one file gained lines at the top, one method changed, one function
    was renamed away, one file was deleted and one is untouched."""
    old = sources.installed_root()
    for path in (
        "parallel_state.py",
        "tensor_parallel/layers.py",
        "tensor_parallel/mappings.py",
        "optimizer/clip_grads.py",
    ):
        _copy(old, tmp_path, CORE + path)
    ps = tmp_path / CORE / "parallel_state.py"
    ps.write_text("# a new header\n# of three\n# lines\n" + ps.read_text())
    layers = tmp_path / CORE / "tensor_parallel/layers.py"
    text = layers.read_text()
    at = sources.find_line(CORE + "tensor_parallel/layers.py", "ColumnParallelLinear.forward")
    lines = text.splitlines()
    lines.insert(at + 1, "        assert input_ is not None  # new in this release")
    layers.write_text("\n".join(lines) + "\n")
    mappings = tmp_path / CORE / "tensor_parallel/mappings.py"
    mappings.write_text(mappings.read_text().replace("def _reduce(", "def _reduce_renamed("))
    return tmp_path


def _cite(path, symbol):
    return drift.Citation(CORE + path, sources.find_line(CORE + path, symbol), symbol)


def test_each_kind_of_drift_is_named(newer):
    cases = {
        _cite("parallel_state.py", "RankGenerator"): ("moved", 3),
        _cite("parallel_state.py", "initialize_model_parallel"): ("moved", 3),
        _cite("tensor_parallel/layers.py", "ColumnParallelLinear.forward"): ("changed", 0),
        _cite("tensor_parallel/layers.py", "RowParallelLinear.forward"): ("moved", 1),
        _cite("tensor_parallel/mappings.py", "_reduce"): ("vanished", None),
        _cite("tensor_parallel/mappings.py", "_gather_along_first_dim"): ("unchanged", 0),
        _cite("optimizer/clip_grads.py", "get_grad_norm_fp32"): ("unchanged", 0),
        drift.Citation(
            CORE + "optimizer/clip_grads.py", 167, None, "param.grad.type() == 'torch.cuda.FloatTensor'"
        ): ("unchanged", 0),
        drift.Citation(CORE + "parallel_state.py", 20, None): ("moved", 3),
        _cite("optimizer/optimizer.py", "MegatronOptimizer"): ("vanished", None),  # file deleted
    }
    rows = drift.report(newer, citations={c: ["test"] for c in cases})
    for row in rows:
        status, shift = cases[row.citation]
        assert row.status == status, row
        if shift is not None:
            assert row.new_line == row.citation.line + shift, row
    table = drift.render(rows)
    assert table.splitlines()[0] == "10 citations: 2 vanished, 1 changed, 4 moved, 3 unchanged"


def test_every_citation_of_the_site_is_found_in_the_tag_itself():
    # Against 0.16.1 itself every megatron/core citation is unchanged; that also proves the
    # report can read every citation the site makes.
    rows = drift.report(sources.installed_root())
    core = [r for r in rows if r.citation.path.startswith(CORE)]
    assert len(core) >= 100
    assert [r for r in core if r.status != "unchanged"] == []
    assert all(r.status == "vanished" for r in rows if not r.citation.path.startswith(CORE))


def test_non_core_files_are_compared_with_a_checkout_of_the_tag(request, tmp_path):
    src = request.config.getoption("megatron_src", default=None)
    if not src:
        pytest.skip("needs --megatron-src (a checkout of core_v0.16.1)")
    rows = drift.report(Path(src), old_src=Path(src))
    assert rows and all(r.status == "unchanged" for r in rows), [r for r in rows if r.status != "unchanged"][
        :5
    ]


def test_command_refuses_a_directory_that_is_not_a_checkout(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "snippets.site.drift", "--new-src", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "is not a Megatron-LM checkout" in proc.stderr


def test_command_prints_the_table(newer):
    proc = subprocess.run(
        [sys.executable, "-m", "snippets.site.drift", "--new-src", str(newer)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| status | path |" in proc.stdout and "| moved | megatron/core/parallel_state.py |" in proc.stdout
