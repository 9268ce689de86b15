"""The CPU layer's records, without ranks: every cited Megatron line is really there, the site page
shows the current table, every patch has a test, and ranks find what the patches import preloaded."""

import ast
import importlib
import importlib.util
import inspect
import tokenize
from pathlib import Path

import pytest

from snippets import cpu
from snippets.site.sources import file_lines

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "site", [s for p in cpu.PATCHES for s in p.sites], ids=lambda s: f"{s.path}:{s.line}"
)
def test_each_cited_line_needs_its_patch(site):
    assert site.text in file_lines(site.path)[site.line - 1]


def test_the_site_page_shows_the_current_patch_table():
    page = (ROOT / "docs" / "cpu.md").read_text()
    shown = page.split("<!-- patches:start -->\n", 1)[1].split("<!-- patches:end -->", 1)[0]
    assert shown.strip() == cpu.render_table().strip()


def test_patch_names_are_unique_and_every_area_is_in_the_package():
    names = [p.name for p in cpu.PATCHES]
    assert len(names) == len(set(names))
    areas = {m.__name__ for m in cpu.AREAS}
    on_disk = {f"snippets.cpu.{f.stem}" for f in (ROOT / "snippets" / "cpu").glob("*.py")}
    assert on_disk - areas == {"snippets.cpu.__init__", "snippets.cpu.base"}


def test_every_patch_has_its_own_test_and_says_what_it_proves():
    tests = set()
    for path in (ROOT / "tests" / "ranks").glob("test_cpu_*.py"):
        tests |= {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
    for patch in cpu.PATCHES:
        assert patch.proof, patch.name
        assert any(t.startswith(f"test_{patch.name}_") for t in tests), (
            f"no test_{patch.name}_... in tests/ranks/test_cpu_*.py"
        )


def test_no_string_in_the_layer_runs_to_a_paragraph():
    # The table's cells are built from adjacent literals, each short enough to read in the source.
    for path in (ROOT / "snippets" / "cpu").glob("*.py"):
        with tokenize.open(path) as source:
            for token in tokenize.generate_tokens(source.readline):
                if token.type == tokenize.STRING and not token.string.startswith('"""'):
                    assert len(token.string) <= 120, (
                        f"{path.name}:{token.start[0]} is {len(token.string)} long"
                    )


def _megatron_modules_imported_in_functions(module) -> set[str]:
    """The Megatron modules a snippets module imports inside its functions: ``from X import y``
    (``X.y`` when that is a module), ``import X``, and the names given to ``scope_torch``."""
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("megatron"):
                package = hasattr(importlib.import_module(inner.module), "__path__")
                for alias in inner.names:
                    sub = f"{inner.module}.{alias.name}"
                    found.add(sub if package and importlib.util.find_spec(sub) else inner.module)
            elif isinstance(inner, ast.Import):
                found |= {a.name for a in inner.names if a.name.startswith("megatron")}
            elif (
                isinstance(inner, ast.Call)
                and getattr(inner.func, "id", None) == "scope_torch"
                and isinstance(inner.args[0], ast.Constant)
            ):
                found.add(inner.args[0].value)
    return found


def test_ranks_find_what_their_setup_imports_already_loaded():
    """``rank_env.init_rank`` applies the patches and sets the writer queue in every rank; the
    modules that needs are imported once by the process that forks the ranks (``launch._PRELOAD``)
    instead of once per rank. A patch that starts importing another module must add it there."""
    from snippets.ranks import launch, rank_env

    needed = set().union(*(_megatron_modules_imported_in_functions(m) for m in (*cpu.AREAS, rank_env)))
    assert "megatron.core.tensor_parallel.random" in needed  # the walk sees the patches' imports
    assert "megatron.core.rerun_state_machine" in needed  # and the scope_torch names
    assert "megatron.core.dist_checkpointing.strategies.filesystem_async" in needed  # and rank_env's
    assert needed - set(launch._PRELOAD) == set()
