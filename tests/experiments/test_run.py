"""``python -m snippets.run`` under ``torchrun --standalone`` on CPU ranks prints the notes' tables.

Each job is a real ``torchrun`` (gloo, 2 or 4 ranks); rank 0's stdout is split into markdown tables
and compared with the tables stored in the note's ``.ipynb`` (the outputs nbval checks). A table of
one configuration must equal the note's table, or -- where the note puts several configurations
in one table -- be exactly the note's rows for that configuration. Then the failures: an unknown
experiment, a world size the sizes cannot divide, a preset too big for this machine; each must end
at once with exit status 2 and one line saying why, before any process group exists.

Every ``torchrun`` start imports torch and megatron.core in each rank (~5 s of CPU each), so the
jobs are few: one per world size runs its experiments one after the other (``+``), and each
job serves several assertions (cached per test session).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from snippets.models import presets
from snippets.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB_TIMEOUT_S = 300  # a hung job fails the test instead of the suite


@functools.lru_cache(maxsize=None)
def torchrun(nproc: int, *args: str):
    """Run ``torchrun --standalone --nproc-per-node nproc -m snippets.run *args`` once per session."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:  # its log dirs go there, and go
        proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc),
                               "-m", "snippets.run", *args], env={**os.environ, "TMPDIR": tmp},
                              cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    proc.seconds = time.monotonic() - start
    return proc


def ok(nproc: int, *args: str) -> str:
    proc = torchrun(nproc, *args)
    assert proc.returncode == 0, f"torchrun {nproc} {args} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def tables(text: str) -> list[str]:
    """The markdown tables in ``text``: runs of lines that start with ``|``."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            out.append("\n".join(current))
            current = []
    return out


@functools.lru_cache(maxsize=None)
def note_tables(note: str) -> list[str]:
    """Every table the note's stored outputs hold (its ``text/markdown`` outputs)."""
    nb = json.loads((ROOT / "notes" / f"{note}.ipynb").read_text(encoding="utf-8"))
    found = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            markdown = output.get("data", {}).get("text/markdown")
            if markdown:
                found += tables("".join(markdown))
    assert found, f"{note}.ipynb has no stored tables"
    return found


def note_text(note: str) -> str:
    nb = json.loads((ROOT / "notes" / f"{note}.ipynb").read_text(encoding="utf-8"))
    return "\n".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


def rows_of(table: str) -> tuple[str, list[str]]:
    lines = table.splitlines()
    return lines[0], lines[2:]


def assert_in_note(table: str, note: str, whole: bool = True) -> None:
    """``table`` is one of the note's tables (``whole``), or a run of rows of one of them under the
    same header (the note's table has more configurations)."""
    stored = note_tables(note)
    if whole:
        assert table in stored, f"not in {note}'s stored tables:\n{table}"
        return
    header, rows = rows_of(table)
    for candidate in stored:
        head, stored_rows = rows_of(candidate)
        if head == header and any(stored_rows[i:i + len(rows)] == rows for i in range(len(stored_rows))):
            return
    raise AssertionError(f"rows not found under the same header in {note}:\n{table}")


TWO_RANKS = ("tp-layer", "--dims", "tiny", "--tp", "2", "+", "pipeline", "--dims", "tiny", "--pp", "2",
             "+", "refit", "--dims", "tiny", "--pp", "2")
FOUR_RANKS = ("groups", "--tp", "2", "--pp", "2",
              "+", "tp-layer", "--dims", "tiny", "--tp", "4", "--query-groups", "2",
              "+", "pipeline", "--dims", "tiny", "--pp", "4",
              "+", "refit", "--dims", "tiny", "--tp", "2", "--pp", "2")
"""One job per world size runs the experiments one after the other (``+``): the ranks start once."""


def section(nproc: int, args: tuple, experiment: str) -> str:
    """What rank 0 printed for ``experiment`` in the job ``torchrun nproc args``."""
    out = ok(nproc, *args)
    parts = out.split("snippets.run ")
    found = [p for p in parts if p.startswith(experiment + " (note ")]
    assert len(found) == 1, out
    return found[0]


# ----------------------------------------------------------------------------- note 02: groups


def test_groups_4_ranks_prints_note_02_tables():
    per_rank, summary = tables(section(4, FOUR_RANKS, "groups"))
    assert_in_note(per_rank, "02_distributed_initialization")
    assert_in_note(summary, "02_distributed_initialization")


# ----------------------------------------------------------------------------- note 11: tp-layer


def test_tp_layer_2_ranks_prints_note_11_tables():
    weights, per_submodule, tp2, sp, finalize = tables(section(2, TWO_RANKS, "tp-layer"))
    for table in (per_submodule, tp2, sp, finalize):
        assert_in_note(table, "11_transformer_layer")
    # The weight table at tiny sizes is not in the note (it shows Qwen3-8B's): its parameter column
    # must add up to the formula the memory estimate uses.
    from snippets.models.memory_estimate import layer_weight_elements

    per_rank = sum(int(row.split("|")[5]) for row in rows_of(weights)[1])
    assert per_rank == layer_weight_elements(EXPERIMENTS["tp-layer"].tiny, tp=2)


def test_tp_layer_4_ranks_fewer_groups_than_tp_prints_note_11_table():
    printed = tables(section(4, FOUR_RANKS, "tp-layer"))
    assert_in_note(printed[2], "11_transformer_layer")  # TP=4 with 2 query groups: the gather


# ----------------------------------------------------------------------------- note 13: pipeline


def test_pipeline_2_ranks_prints_note_13_tables():
    out = section(2, TWO_RANKS, "pipeline")
    stages, func, phases, order, p2p, meanings, bubble = tables(out)
    for table in (stages, func, bubble):
        assert_in_note(table, "13_pipeline_schedules", whole=False)
    for table in (p2p, meanings):
        assert_in_note(table, "13_pipeline_schedules")
    assert "API: ['batch_isend_irecv']  group: ['pp']" in note_text("13_pipeline_schedules")
    assert "API: ['batch_isend_irecv']  group: ['pp']" in out
    loss = out.split("个 micro-batch）: ")[1].split()[0]
    assert_in_note(f"| 配置 | mean loss | loss 相同 | 梯度个数 | 梯度逐元素相等 |\n|---|---|---|---|---|\n"
                   f"| PP=2 | {loss} | True | 69 | True |", "13_pipeline_schedules", whole=False)
    # PP=2 has no rows in the note's phase table: the code's counts must equal the recorded ones.
    assert all(row.endswith("| True |") for row in rows_of(phases)[1])
    assert order.splitlines()[2:] == ["| 0 | F0 F1 B0 F2 B1 F3 B2 B3 |", "| 1 | F0 B0 F1 B1 F2 B2 F3 B3 |"]


def test_pipeline_microbatches_are_tiny_gpts_at_note_13_sizes():
    """The experiment draws its tokens at any size exactly as snippets.models.tiny_gpt does at note 13's."""
    import torch

    from snippets.models import tiny_gpt
    from snippets.experiments.n13_pipeline import microbatches

    ours, reference = microbatches(EXPERIMENTS["pipeline"].tiny, 3), tiny_gpt.microbatches(3)
    assert [b.keys() for b in ours] == [b.keys() for b in reference]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(ours, reference) for k in a)


def test_pipeline_4_ranks_prints_note_13_tables():
    stages, func, phases, order, p2p, meanings, bubble = tables(section(4, FOUR_RANKS, "pipeline"))
    for table in (stages, func, phases, bubble):
        assert_in_note(table, "13_pipeline_schedules", whole=False)
    assert_in_note(order, "13_pipeline_schedules")


# ----------------------------------------------------------------------------- note 22: refit


def test_refit_4_ranks_prints_note_22_tables():
    *from_note, seed_figure = tables(section(4, FOUR_RANKS, "refit"))
    assert len(from_note) == 8
    for table in from_note:
        assert_in_note(table, "22_refit_and_resharding")
    from snippets.rl.refit_cost import REFIT_HEADERS

    assert seed_figure.splitlines()[0] == "| " + " | ".join(REFIT_HEADERS) + " |"


def test_refit_2_ranks_syncs_and_moves_each_rank_its_shard():
    """TP1·PP2 → rollout TP2 (no stored table): every check holds, and the plan delivers each rank
    exactly its rollout weights; the model has the parameters :func:`presets.parameter_count` says."""
    out = section(2, TWO_RANKS, "refit")
    checks, _, sizes, traffic, per_rank, *_ = tables(out)
    for row in rows_of(checks)[1][1:]:
        stale_is_new = "不同步：rollout == 新 policy" in row
        assert row.endswith("[False, False] |") if stale_is_new else "False" not in row, row
    rollout_bytes = [int(r.split("|")[5]) for r in rows_of(sizes)[1]]
    received = [int(r.split("|")[4]) + int(r.split("|")[5]) for r in rows_of(per_rank)[1]]
    assert received == rollout_bytes
    params = int(out.split("整个模型参数: ")[1].split()[0])
    assert params == presets.parameter_count(EXPERIMENTS["refit"].tiny)


# ----------------------------------------------------------------------------- refusing, fast


def plain(*args: str, env: dict | None = None):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "snippets.run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    proc.seconds = time.monotonic() - start
    return proc


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_unknown_experiment_lists_the_known_ones():
    proc = plain("no-such-experiment")
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line(proc.stderr)
    assert "unknown experiment 'no-such-experiment'" in line
    assert all(name in line for name in EXPERIMENTS)


AS_RANK_0_OF_2 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
"""What torchrun sets in rank 0 of a 2-rank job: the checks run before any rendezvous, so a plain
process with this environment takes the same path (and no peer is needed to refuse)."""


@pytest.mark.parametrize("args, says", [
    (["tp-layer", "--tp", "4"], "world size 2 is not divisible by tp*pp*cp = 4*1*1 = 4"),
    (["tp-layer", "--tp", "2", "--heads", "9", "--query-groups", "3"], "heads 9 is not divisible by tp 2"),
    (["tp-layer", "--pp", "2"], "tp-layer does not use --pp"),
    (["pipeline", "--pp", "2", "--dp", "2"], "--dp 2 does not match world size 2"),
    (["pipeline", "--pp", "2", "--layers", "7"], "layers 7 is not divisible by pp * vp 2"),
])
def test_impossible_sizes_are_refused_in_one_line(args, says):
    proc = plain(*args, env=AS_RANK_0_OF_2)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert says in one_line(proc.stderr)


def test_too_big_preset_is_refused_by_every_rank_before_starting():
    """Qwen3-8B's pipeline in fp32 cannot fit this machine: torchrun's ranks all exit with status 2
    before ``init_process_group`` (no rendezvous timeout, no header, no table), one line per host."""
    proc = torchrun(2, "pipeline", "--dims", "qwen3-8b", "--pp", "2")
    assert proc.returncode != 0 and proc.stdout == ""
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("snippets.run: refusing")]
    assert len(refusals) == 1, proc.stderr
    assert "refusing pipeline --dims qwen3-8b (hidden 4096, heads 32 in 8 query groups" in refusals[0]
    assert "one rank needs ~" in refusals[0] and "GiB available host RAM / 2 rank(s)" in refusals[0]
    assert proc.stderr.count("exitcode  : 2") == 1 and "rank      : 0" in proc.stderr  # torchrun's report
    assert proc.seconds < 60


@pytest.mark.skipif(__import__("snippets.ranks.runner").ranks.runner.nvidia_device_nodes(),
                    reason="this host has NVIDIA device files: the verdict needs torch.cuda")
def test_without_a_gpu_the_verdict_needs_no_torch():
    """No NVIDIA device file, so no CUDA: a too-big job is refused without importing torch (each
    rank of a refused job ends in well under a second), and an estimate says it runs on gloo."""
    code = ("import sys\nfrom snippets.ranks import runner\nrc = runner.main(sys.argv[1:])\n"
            "print('exit', rc, 'torch imported:', 'torch' in sys.modules)")

    def main_in_rank_0_of_2(*args):
        return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env={**os.environ, **AS_RANK_0_OF_2})

    refused = main_in_rank_0_of_2("pipeline", "--dims", "qwen3-8b", "--pp", "2")
    assert refused.stdout.strip() == "exit 2 torch imported: False", refused.stderr
    assert "one rank needs ~" in refused.stderr
    estimate = main_in_rank_0_of_2("tp-layer", "--tp", "2", "--estimate")
    assert estimate.stdout.rstrip().endswith("exit 0 torch imported: False"), estimate.stderr
    assert "gloo on cpu, snippets.cpu applied" in estimate.stdout


def test_estimate_and_list_start_nothing():
    proc = plain("refit", "--dims", "dense-8b", "--world-size", "8", "--tp", "2", "--pp", "4",
                 "--estimate")
    assert proc.returncode in (0, 2)  # depends on this machine's memory; either way nothing ran
    assert "one rank needs ~" in proc.stderr or "memory per rank: needs ~" in proc.stdout
    listing = plain("--list")
    assert listing.returncode == 0
    for name, exp in EXPERIMENTS.items():
        assert name in listing.stdout and exp.note in listing.stdout
    assert "qwen3-8b  8.19B parameters" in listing.stdout


# ----------------------------------------------------------------------------- notes call the same code

LISTED = {"01_training_run_overview": "snippets.experiments.n01_overview",
          "02_distributed_initialization": "snippets.experiments.n02_groups",
          "03_data_and_batch_flow": "snippets.experiments.n03_batch_flow",
          "04_model_provider_and_gpt_model": "snippets.experiments.n04_gpt_model",
          "05_forward_loss_backward": "snippets.experiments.n05_loss",
          "06_gradient_sync_and_optimizer": "snippets.experiments.n06_train_step",
          "07_checkpointing": "snippets.experiments.n07_checkpoint",
          "08_parallel_state_and_rank_generator": "snippets.experiments.n08_rank_generator",
          "09_tp_mappings": "snippets.experiments.n09_mappings",
          "10_column_row_parallel_linear": "snippets.experiments.n10_linear",
          "11_transformer_layer": "snippets.experiments.n11_tp_layer",
          "12_vocab_parallel": "snippets.experiments.n12_vocab",
          "13_pipeline_schedules": "snippets.experiments.n13_pipeline",
          "14_data_parallel_ddp": "snippets.experiments.n14_ddp",
          "15_distributed_optimizer": "snippets.experiments.n15_dist_optimizer",
          "16_context_parallel": "snippets.experiments.n16_cp",
          "17_moe_expert_parallel": "snippets.experiments.n17_moe",
          "18_data_topic": "snippets.experiments.n18_data_topic",
          "19_model_topic": "snippets.experiments.n19_model_topic",
          "20_optimizer_topic": "snippets.experiments.n20_optimizer_topic",  # and overlap's run
          "21_checkpoint_topic": "snippets.experiments.n21_ckpt_topic",
          "22_refit_and_resharding": "snippets.experiments.n22_refit",
          "23_tensor_journey": "snippets.experiments.n23_journey"}
"""Each note's cells call an experiment module and list its functions' source in markdown."""


def test_every_note_runs_a_registered_experiment():
    """Every note is listed above, and has an experiment the runner knows."""
    notes = sorted(p.stem for p in (ROOT / "notes").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(LISTED) == notes
    assert sorted({exp.note for exp in EXPERIMENTS.values()}) == notes


@pytest.mark.parametrize("note, module", LISTED.items())
def test_notes_list_the_experiment_code_their_cells_call(note, module):
    check_listing(note, module)


def check_listing(note: str, module: str) -> None:
    """The listing a reader sees in the note is the code the cell (and torchrun) runs, and a code
    cell imports from ``module``. A listing is either a code cell calling
    ``snippets.record.listing.listing(...)`` on that module's functions (the page shows the module's
    own source, so it cannot drift), or -- the older form -- a ```python block of the note's
    markdown that must equal the source of the ``def``/``class`` it names."""
    import importlib
    import inspect
    import re

    mod = importlib.import_module(module)
    nb = json.loads((ROOT / "notes" / f"{note}.ipynb").read_text(encoding="utf-8"))
    blocks = [block for cell in nb["cells"] if cell["cell_type"] == "markdown"
              for block in re.findall(r"```python\n(.*?)```", "".join(cell["source"]), re.S)]
    code_cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    calls = [cell for cell in code_cells if re.search(r"^listing\(", cell, re.M)]
    assert blocks or calls, f"{note} lists no code"
    for block in blocks:
        names = re.findall(r"^(?:def|class) (\w+)", block, re.M)
        expected = "\n\n\n".join(inspect.getsource(getattr(mod, n)).rstrip("\n") for n in names)
        assert block.rstrip("\n") == expected, f"{note}: the listing of {names} differs from {module}"
    path = module.replace(".", "/") + ".py"
    for cell in calls:
        shown = [out for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]) == cell
                 for out in c.get("outputs", []) if "text/html" in out.get("data", {})]
        assert shown, f"{note}: a listing(...) cell has no stored output"
    if calls and not blocks:
        html = "".join("".join(out["data"]["text/html"]) for c in nb["cells"] if c["cell_type"] == "code"
                       for out in c.get("outputs", []) if "text/html" in out.get("data", {}))
        assert path in html, f"{note}: no listing shows {path}"
    source = "".join(code_cells)
    assert f"from {module} import" in source


# ----------------------------------------------------------------------------- in-process runs of the runner's path

def runner_tables(name: str, world: int, **parallel) -> list[str]:
    """What ``python -m snippets.run name --dims tiny`` prints as tables, computed in-process with
    ``run_ranks`` (the same ``run`` and ``tables``; no torchrun start, so cheap)."""
    from snippets.experiments import Parallel
    from snippets.ranks.launch import run_ranks
    from snippets.record.tables import Table

    exp = EXPERIMENTS[name]
    run, make_tables = exp.functions()
    par = Parallel(world=world, **parallel)
    results = run_ranks(run, world, exp.tiny, par, grid={k: v for k, v in parallel.items() if k in ("tp", "pp", "cp")})
    return [tables(t.markdown())[0] for t in make_tables(results, exp.tiny, par) if isinstance(t, Table)]


def test_linear_runner_path_prints_note_10_tables():
    layout, comm, ours, kinds = runner_tables("linear", 2, tp=2)
    note = "10_column_row_parallel_linear"
    for table in (comm, kinds):
        assert_in_note(table, note)
    for table in (layout, ours):  # the note's tables hold TP=2 and TP=4 (layout: column rows, then row rows)
        header, rows = rows_of(table)
        for row in rows:
            assert_in_note("\n".join(table.splitlines()[:2] + [row]), note, whole=False)


def test_mappings_runner_path_prints_note_09_tables():
    for table in runner_tables("mappings", 2, tp=2):
        assert_in_note(table, "09_tp_mappings")


def test_vocab_runner_path_prints_note_12_tables():
    summary, embedding, cross_entropy = runner_tables("vocab", 2, tp=2)
    assert "| 16 | 2 | [8, 6] | [(0, 8), (8, 16)] | [2, 4, 6] / [2, 2, 6] |" in summary
    for table in (embedding, cross_entropy):
        assert_in_note(table, "12_vocab_parallel")


def test_ddp_runner_path_prints_note_14_tables():
    buckets, plain, first, second = runner_tables("ddp", 2)
    for table in (buckets, plain, first, second):
        assert_in_note(table, "14_data_parallel_ddp")


def test_dist_optimizer_runner_path_prints_note_15_tables():
    types, buffers, shards, sharded_calls, plain_calls, memory = runner_tables("dist-optimizer", 2)
    note = "15_distributed_optimizer"
    for table in (buffers, shards, sharded_calls, plain_calls, memory):
        assert_in_note(table, note)
    assert_in_note(types, note, whole=False)  # the note's table also has the one-process run


def test_cp_runner_path_prints_note_16_tables():
    split, same, ring = runner_tables("cp", 4, cp=4)
    note = "16_context_parallel"
    for table in (split, ring):
        assert_in_note(table, note)
    assert_in_note(same, note, whole=False)  # the note's table also has CP=2


def test_moe_runner_path_prints_note_17_tables():
    """The runner builds its EP=1 reference inside the job (seed 0, then ``destroy_model_parallel``
    and the EP grid): the same experts, routing and tables as the note's separate reference run."""
    for table in runner_tables("moe", 4, ep=2):
        assert_in_note(table, "17_moe_expert_parallel")


def test_loss_runner_path_prints_note_05_table():
    (collectives,) = runner_tables("loss", 2, tp=2)
    assert_in_note(collectives, "05_forward_loss_backward")


def test_train_step_runner_path_prints_note_06_tables():
    for table in runner_tables("train-step", 2):
        assert_in_note(table, "06_gradient_sync_and_optimizer")



def test_readme_lists_every_experiment_with_its_note():
    """README's "Running at real scale" table names each registered experiment once, with its note."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\d\d) \|", readme, re.M)
    assert rows == [(name, exp.note[:2]) for name, exp in EXPERIMENTS.items()]
