"""The registry (snippets/experiments/registry.py, checks.py, needs.py) and the one object that checks
parallel sizes (snippets/ranks/parallel_dims.py): torch-free, every entry in one place, and every
size checked once, with messages that name the numbers."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from run_support import ROOT

from snippets.experiments import EXPERIMENTS, Parallel, problems
from snippets.ranks.launch import Grid
from snippets.ranks.parallel_dims import ParallelDims

REGISTRY = [
    "snippets/experiments/__init__.py",
    "snippets/experiments/registry.py",
    "snippets/experiments/checks.py",
    "snippets/experiments/needs.py",
    "snippets/ranks/parallel_dims.py",
]


def test_every_entry_is_in_the_registry_module_in_note_order():
    from snippets.experiments import registry

    assert EXPERIMENTS is registry.EXPERIMENTS
    notes = sorted(p.stem for p in (ROOT / "notes").glob("[0-9][0-9]_*.py"))
    assert sorted({e.note for e in EXPERIMENTS.values()}) == notes  # every note has its experiment
    assert list(EXPERIMENTS) == [e.name for e in sorted(EXPERIMENTS.values(), key=lambda e: e.note)]
    source = (ROOT / "snippets/experiments/registry.py").read_text()
    assert source.count("    Experiment(\n") == len(EXPERIMENTS)
    for exp in EXPERIMENTS.values():  # each entry's checks and estimate live beside it, by name
        assert exp.estimate.__module__ == "snippets.experiments.needs"
        assert exp.checks.__module__ == "snippets.experiments.checks"


def test_registry_modules_are_small_import_nothing_private_and_no_importlib_cycle():
    for path in REGISTRY:
        text = (ROOT / path).read_text()
        assert len(text.splitlines()) <= 400, path
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not any(a.name.startswith("_") for a in node.names), (path, ast.dump(node))
    helpers = [p for p in (ROOT / "snippets").rglob("*.py") if "def _divides(" in p.read_text()]
    assert helpers == []
    registry = (ROOT / "snippets/experiments/registry.py").read_text()
    assert "import_module(self.module)" in registry and "import_module(name)" not in registry


def test_registry_imports_without_torch():
    code = (
        "import sys; from snippets.experiments import EXPERIMENTS, Parallel, problems; "
        "from snippets.ranks.launch import Grid; "
        "print(len(EXPERIMENTS), 'torch' in sys.modules, 'megatron' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == [str(len(EXPERIMENTS)), "False", "False"]


def test_parallel_is_parallel_dims_and_grid_is_one():
    assert Parallel is ParallelDims and issubclass(Grid, ParallelDims)
    par = Parallel(world=16, tp=2, pp=2, cp=2)
    assert (par.dp, par.model_ranks, par.expert_tp, par.backend) == (2, 8, 2, "gloo")
    assert Grid(16, tp=2, pp=2).dp == 4 and Grid(16).world_size == 16


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(world=6, tp=4), "world size 6 is not divisible by tp*pp*cp = 4*1*1 = 4"),
        (
            dict(world=8, tp=2, pp=2, ep=3),
            "ep 3 does not divide the 2 ranks left for experts (world size 8 / (tp 2 * pp 2))",
        ),
        (
            dict(world=8, tp=2, pp=2, ep=3, etp=1),
            "ep 3 does not divide the 4 ranks left for experts (world size 8 / (etp 1 * pp 2))",
        ),
        (dict(world=8, tp=2, etp=3), "world size 8 is not divisible by etp*pp = 3*1 = 3 (the expert layout)"),
        (dict(world=2, vp=2), "--vp (interleaved 1F1B) needs --pp 2 or more"),
        (dict(world=2, sp=True), "--sequence-parallel needs --tp 2 or more"),
    ],
)
def test_sizes_that_do_not_fit_are_named_once(sizes, message):
    par = Parallel(**sizes)
    assert par.problems() == [message]
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        par.check()


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(world=0), "world size must be a positive int, got 0"),
        (dict(world=2, tp=0), "tp must be a positive int, got 0"),
        (dict(world=2, vp=0), "vp must be a positive int, got 0"),
        (dict(world=2, pp=True), "pp must be a positive int, got True"),
    ],
)
def test_sizes_no_run_can_have_are_refused_at_construction(sizes, message):
    with pytest.raises(ValueError, match=message):
        Parallel(**sizes)


def test_grid_says_world_size_like_run_ranks_argument():
    """Note 02 prints this refusal: its stored output must not change."""
    with pytest.raises(ValueError) as info:
        Grid(4, tp=3)
    assert str(info.value) == "world_size 4 is not divisible by tp*pp*cp = 3*1*1 = 3"
    Parallel(world=4, tp=3)  # a note builds it on purpose, to let Megatron refuse


def test_registry_reports_parallel_sizes_then_unused_flags_then_model_sizes():
    groups, pipeline, ddp = EXPERIMENTS["groups"], EXPERIMENTS["pipeline"], EXPERIMENTS["ddp"]
    assert problems(groups, groups.tiny, Parallel(world=4, tp=3)) == [
        "world size 4 is not divisible by tp*pp*cp = 3*1*1 = 3"
    ]
    assert problems(ddp, ddp.tiny, Parallel(world=2, sp=True)) == [
        "ddp does not use --sequence-parallel (it reads: no parallel sizes)"
    ]
    assert problems(pipeline, pipeline.tiny.replace(layers=3), Parallel(world=1, vp=2)) == [
        "--vp (interleaved 1F1B) needs --pp 2 or more",
        "layers 3 is not divisible by pp * vp 2",
    ]
    rank_generator = EXPERIMENTS["rank-generator"]  # fixes expert tp 1
    assert problems(rank_generator, rank_generator.tiny, Parallel(world=8, tp=2, pp=2, ep=4)) == []
    assert problems(groups, groups.tiny, Parallel(world=8, tp=2, pp=2, ep=4)) == [
        "ep 4 does not divide the 2 ranks left for experts (world size 8 / (tp 2 * pp 2))"
    ]
