"""The drift report: on a small fake 'newer' checkout made from the installed files of the pinned tag,
and on made-up sources that show how a statement is followed (whole text, inside its function)."""

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


def _statement(path, text, fragment=None):
    """A statement citation of the installed line that reads ``text`` (stripped, the first one)."""
    lines = sources.file_lines(CORE + path)
    line = next(i + 1 for i, row in enumerate(lines) if row.strip() == text)
    return drift.Citation(CORE + path, line, None, fragment)


def test_each_kind_of_drift_is_named(newer):
    cases = {
        _cite("parallel_state.py", "RankGenerator"): ("moved", 3),
        _cite("parallel_state.py", "initialize_model_parallel"): ("moved", 3),
        _cite("tensor_parallel/layers.py", "ColumnParallelLinear.forward"): ("changed", 0),
        _cite("tensor_parallel/layers.py", "RowParallelLinear.forward"): ("moved", 1),
        _cite("tensor_parallel/mappings.py", "_reduce"): ("vanished", None),
        _cite("tensor_parallel/mappings.py", "_gather_along_first_dim"): ("unchanged", 0),
        _cite("optimizer/clip_grads.py", "get_grad_norm_fp32"): ("unchanged", 0),
        _statement(
            "optimizer/clip_grads.py",
            "assert param.grad.type() == 'torch.cuda.FloatTensor'",
            "param.grad.type() == 'torch.cuda.FloatTensor'",
        ): ("unchanged", 0),
        _statement("parallel_state.py", "logger = logging.getLogger(__name__)"): ("moved", 3),
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
    # Against the tag itself every megatron/core citation is unchanged (and none is a blank line);
    # that also proves the report can read every citation the site makes.
    installed = sources.installed_root()
    rows = drift.report(installed)
    packaged = [r for r in rows if (installed / r.citation.path).is_file()]
    assert len([r for r in packaged if r.citation.path.startswith(CORE)]) >= 100
    assert [r for r in packaged if r.status != "unchanged"] == []
    # outside the wheel (pretrain_gpt.py, examples/, tests/): not in the "newer" tree either
    assert all(r.status == "vanished" for r in rows if r not in packaged)


def test_non_core_files_are_compared_with_a_checkout_of_the_tag(request, tmp_path):
    src = request.config.getoption("megatron_src", default=None)
    if not src:
        pytest.skip(f"needs --megatron-src (a checkout of {sources.TAG})")
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


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# One made-up Megatron file at an old and a new tag (tests/unit/test_repin.py reads the same pair).
OLD = (FIXTURES / "made_up_source_old.py.txt").read_text()
NEW = (FIXTURES / "made_up_source_new.py.txt").read_text()

FAKE = "megatron/training/fake.py"


@pytest.fixture()
def made_up(tmp_path):
    """(old checkout, new checkout) holding OLD and NEW as one file outside megatron/core."""
    for name, text in (("old", OLD), ("new", NEW)):
        (tmp_path / name / FAKE).parent.mkdir(parents=True)
        (tmp_path / name / FAKE).write_text(text)
    return tmp_path / "old", tmp_path / "new"


def _at(text: str, statement: str) -> int:
    return next(i + 1 for i, row in enumerate(text.splitlines()) if row.strip() == statement)


@pytest.mark.parametrize(
    "statement, status, new_line",
    [
        # the old text survives only inside a longer line: not found, never "moved" onto it
        ("gradient_scaling_factor = 1.0 / world", "changed", None),
        # the same text in another function is not this statement
        ("x = 1", "changed", None),
        (
            "expert_gradient_scaling_factor = 1.0 / world",
            "moved",
            _at(NEW, "expert_gradient_scaling_factor = 1.0 / world"),
        ),
        ("return gradient_scaling_factor", "moved", _at(NEW, "return gradient_scaling_factor")),
        ("LIMIT = 3", "moved", 2),  # module level: followed in the module
        ("return 0", "vanished", None),  # its function is gone
    ],
)
def test_a_statement_is_followed_by_its_whole_text_inside_its_function(made_up, statement, status, new_line):
    old_src, new_src = made_up
    citation = drift.Citation(FAKE, _at(OLD, statement), None)
    assert drift.check(citation, old_src, new_src) == (status, new_line)


def test_a_blank_line_is_never_a_statement(made_up):
    old_src, new_src = made_up
    blank = OLD.splitlines().index("") + 1
    assert drift.check(drift.Citation(FAKE, blank, None), old_src, new_src) == ("blank", None)
    rows = drift.report(new_src, old_src, citations={drift.Citation(FAKE, blank, None): ["test"]})
    assert drift.render(rows).splitlines()[0] == "1 citations: 1 blank"
