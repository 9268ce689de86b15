"""``python -m snippets.run`` on CPU ranks prints the notes' tables, and refuses bad jobs in one line.

Each job is real: gloo ranks started the one-command way (``--nproc-per-node N``: the runner
checks, then forks them through torch's elastic launcher), and one small job under a raw
``torchrun`` (what a multi-node run uses: every rank a fresh interpreter). Rank 0's
stdout is split into markdown tables and compared with the tables stored in the note's ``.ipynb``
(the outputs nbval checks). A table of one configuration must equal the note's table, or -- where
the note puts several configurations in one table -- be exactly the note's rows for that
configuration. Then the refusals -- a bad flag, an unknown experiment, a world size the sizes
cannot divide, a job too big for this machine -- each checked both ways for its exact line on
stderr, exit status 2 and no traceback, before any process group exists.

Every job start imports torch and megatron.core (~5 s of CPU each), so the jobs are few: one
one-command job of 4 ranks runs its experiments one after the other (``+``) and one raw torchrun
job; each serves several assertions (cached per test session). The other tables come from the
runner's path in-process (``runner_tables`` / ``runner_output``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from run_support import (
    AS_RANK_0_OF_2,
    EXPERIMENTS,
    ROOT,
    assert_in_note,
    note_text,
    ok,
    one_command,
    one_line,
    plain,
    refusals,
    rows_of,
    runner_output,
    runner_tables,
    tables,
    torchrun,
)

from snippets.models import presets

FOUR_RANKS = (
    "groups",
    "--tp",
    "2",
    "--pp",
    "2",
    "+",
    "tp-layer",
    "--dims",
    "tiny",
    "--tp",
    "4",
    "--query-groups",
    "2",
    "+",
    "pipeline",
    "--dims",
    "tiny",
    "--pp",
    "4",
    "+",
    "refit",
    "--dims",
    "tiny",
    "--tp",
    "2",
    "--pp",
    "2",
)
"""The one-command job (``python -m snippets.run --nproc-per-node 4``) runs the experiments one
after the other (``+``): the ranks start once. The 2-rank tables (notes 11, 13, 22 at their sizes)
come from the same experiments' ``run`` and ``tables`` on ranks forked in-process
(:func:`run_support.runner_output`), which is what each rank of such a job executes."""
RAW = ("mappings", "--tp", "2")
"""The job under a raw ``torchrun``: the same tables from spawned ranks (each imports torch and
megatron.core itself, ~5 s of CPU), so it is the smallest one."""


def section(nproc: int, args: tuple, experiment: str, raw: bool = False) -> str:
    """What rank 0 printed for ``experiment`` in the job of ``nproc`` ranks running ``args``."""
    out = ok(nproc, *args, raw=raw)
    parts = out.split("snippets.run ")
    found = [p for p in parts if p.startswith(experiment + " (note ")]
    assert len(found) == 1, out
    return found[0]


# ----------------------------------------------------------------------------- a raw torchrun


def test_raw_torchrun_prints_note_09_tables():
    """Under a raw ``torchrun`` (spawned ranks, torchrun's own rendezvous) the tables are the note's,
    as from the one-command job and the in-process runner (test_mappings_runner_path_...)."""
    printed = tables(section(2, RAW, "mappings", raw=True))
    assert printed
    for table in printed:
        assert_in_note(table, "09_tp_mappings")


# ----------------------------------------------------------------------------- note 02: groups


def test_groups_4_ranks_prints_note_02_tables():
    per_rank, summary = tables(section(4, FOUR_RANKS, "groups"))
    assert_in_note(per_rank, "02_distributed_initialization")
    assert_in_note(summary, "02_distributed_initialization")


# ----------------------------------------------------------------------------- note 11: tp-layer


def test_tp_layer_2_ranks_prints_note_11_tables():
    weights, per_submodule, tp2, sp, finalize = tables(runner_output("tp-layer", 2, tp=2))
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
    out = runner_output("pipeline", 2, pp=2)
    stages, func, phases, order, p2p, meanings, bubble = tables(out)
    for table in (stages, func, bubble):
        assert_in_note(table, "13_pipeline_schedules", whole=False)
    for table in (p2p, meanings):
        assert_in_note(table, "13_pipeline_schedules")
    assert "API: ['batch_isend_irecv']  group: ['pp']" in note_text("13_pipeline_schedules")
    assert "API: ['batch_isend_irecv']  group: ['pp']" in out
    loss = out.split("个 micro-batch）: ")[1].split()[0]
    assert_in_note(
        f"| 配置 | mean loss | loss 相同 | 梯度个数 | 梯度逐元素相等 |\n|---|---|---|---|---|\n"
        f"| PP=2 | {loss} | True | 69 | True |",
        "13_pipeline_schedules",
        whole=False,
    )
    # PP=2 has no rows in the note's phase table: the code's counts must equal the recorded ones.
    assert all(row.endswith("| True |") for row in rows_of(phases)[1])
    assert order.splitlines()[2:] == ["| 0 | F0 F1 B0 F2 B1 F3 B2 B3 |", "| 1 | F0 B0 F1 B1 F2 B2 F3 B3 |"]


def test_pipeline_microbatches_are_tiny_gpts_at_note_13_sizes():
    """The experiment draws its tokens at any size exactly as snippets.models.tiny_gpt does at note 13's."""
    import torch

    from snippets.experiments.n13_pipeline import microbatches
    from snippets.models import tiny_gpt

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
    out = runner_output("refit", 2, pp=2)
    checks, _, sizes, traffic, per_rank, *_ = tables(out)
    for row in rows_of(checks)[1][1:]:
        stale_is_new = "不同步：rollout == 新 policy" in row
        assert row.endswith("[False, False] |") if stale_is_new else "False" not in row, row
    rollout_bytes = [int(r.split("|")[5]) for r in rows_of(sizes)[1]]
    received = [int(r.split("|")[4]) + int(r.split("|")[5]) for r in rows_of(per_rank)[1]]
    assert received == rollout_bytes
    params = int(out.split("整个模型参数: ")[1].split()[0])
    assert params == presets.parameter_count(EXPERIMENTS["refit"].tiny)


# ----------------------------------------------------------------------------- refusing: one line, status 2

KNOWN = ", ".join(f"{e.name} (note {e.note})" for e in EXPERIMENTS.values())


def too_big(world: int) -> str:
    """The memory refusal of ``pipeline --dims dense-70b --pp 2`` (fp32 70B: no CPU host holds it),
    as a regular expression: only what this host has is left open."""
    from snippets.experiments import Parallel

    exp, dims = EXPERIMENTS["pipeline"], presets.PRESETS["dense-70b"]
    par = Parallel(world=world, pp=2)
    return (
        re.escape(
            f"snippets.run: refusing pipeline --dims dense-70b ({dims.describe(exp.unused)}) on "
            f"{par.describe()}: one rank needs {exp.estimate(dims, par).describe()}, but this "
            f"rank has "
        )
        + (
            r"\d+\.\d\d GiB \(\d+\.\d\d GiB available host RAM / "
            rf"{world} rank\(s\) on this host\)"
        )
        + re.escape(
            ". Use more ranks (--tp/--pp), a shorter --seq, fewer --layers, or --dims tiny. Nothing was started."
        )
    )


REFUSALS = [  # (ranks, arguments, the line on stderr: exact, or a regex for the memory one)
    (
        2,
        ("groups", "--bogus"),
        "snippets.run: unrecognized arguments: --bogus (python -m snippets.run --help lists the flags)",
    ),
    (2, ("no-such-experiment",), f"snippets.run: unknown experiment 'no-such-experiment'; known: {KNOWN}"),
    (
        4,
        ("groups", "--tp", "3"),
        "snippets.run: groups on 4 rank(s): world size 4 is not divisible by tp*pp*cp = 3*1*1 = 3",
    ),
    (2, ("pipeline", "--dims", "dense-70b", "--pp", "2"), None),
]
IDS = ["bad flag", "unknown experiment", "world size", "memory"]


def says(line: str, nproc: int, expected: str | None) -> bool:
    return re.fullmatch(too_big(nproc), line) is not None if expected is None else line == expected


@pytest.mark.parametrize("nproc, args, expected", REFUSALS, ids=IDS)
def test_one_command_refusal_is_one_line_and_status_2(nproc, args, expected):
    """``python -m snippets.run --nproc-per-node N ...`` checks before it starts any rank: stderr is
    exactly the one line (so no traceback), stdout empty, exit status 2, well under a few seconds."""
    proc = plain("--nproc-per-node", str(nproc), *args)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert says(proc.stderr[:-1], nproc, expected), proc.stderr
    assert "torch" not in proc.stderr.split(":", 1)[0] and proc.seconds < 20


RAW_REFUSALS = [3]
"""Under a raw torchrun, the refusal each rank decides from its own world and host: its share of the
host's memory. The other refusals take the same path (``runner_checks.Refused`` -> ``_refuse``, which
picks rank 0 to print and exits 2 on every rank) and are checked above the one-command way; the
world-size one also as rank 0 of a torchrun world (``AS_RANK_0_OF_2``, test_impossible_sizes...)."""


@pytest.mark.parametrize(
    "nproc, args, expected", [REFUSALS[i] for i in RAW_REFUSALS], ids=[IDS[i] for i in RAW_REFUSALS]
)
def test_raw_torchrun_refusal_rank_0_says_it_and_every_rank_exits_2(nproc, args, expected):
    """Under a raw ``torchrun`` (multi-node jobs): the same line once, from rank 0; every rank exits
    with status 2 by itself (none is stopped by the agent) and none prints a traceback. What is
    left is torchrun's own report -- its traceback, then a table naming the reason on each rank --
    and its exit status 1, which README's "Running at real scale" describes."""
    proc = torchrun(nproc, *args)
    lines = refusals(proc.stderr)
    assert len(lines) == 1 and says(lines[0], nproc, expected), proc.stderr
    assert proc.stdout == "" and proc.returncode == 1 and proc.seconds < 60
    assert proc.stderr.count("exitcode  : 2 ") == nproc and "SIGTERM)" not in proc.stderr, proc.stderr
    assert proc.stderr.count("Traceback") == 1, proc.stderr  # torchrun's, not a rank's
    frames = [line for line in proc.stderr.splitlines() if line.startswith('  File "')]
    assert frames and not any("snippets" in frame for frame in frames), frames
    root = proc.stderr.split("Root Cause (first observed failure):")[1]
    reported = root.split("traceback : ", 1)[1].splitlines()[0]  # that rank's line (its own RAM figures)
    assert says(reported, nproc, expected), root  # the report names the reason, not "To enable traceback"


def test_world_of_one_says_how_to_start_more_ranks():
    proc = plain("groups", "--tp", "2", "--pp", "2")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "snippets.run: groups on 1 rank(s): world size 1 is not divisible by "
        "tp*pp*cp = 2*2*1 = 4; use --nproc-per-node 4 to start 4 ranks\n"
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["tp-layer", "--tp", "4"], "world size 2 is not divisible by tp*pp*cp = 4*1*1 = 4"),
        (
            ["tp-layer", "--tp", "2", "--heads", "9", "--query-groups", "3"],
            "heads 9 is not divisible by tp 2",
        ),
        (["tp-layer", "--pp", "2"], "tp-layer does not use --pp"),
        (["ddp", "--sequence-parallel"], "ddp does not use --sequence-parallel"),
        (["pipeline", "--pp", "2", "--dp", "2"], "--dp 2 does not match world size 2"),
        (["pipeline", "--pp", "2", "--layers", "7"], "layers 7 is not divisible by pp * vp 2"),
        (["pipeline", "--vp", "2"], "--vp (interleaved 1F1B) needs --pp 2 or more"),
        (
            ["moe", "--ep", "4"],
            "ep 4 does not divide the 2 ranks left for experts (world size 2 / (tp 1 * pp 1))",
        ),
        (["groups", "--tp", "0"], "--tp must be a positive int, got 0"),
        (["--nproc-per-node", "2", "groups"], "--nproc-per-node is for starting the ranks here"),
    ],
)
def test_impossible_sizes_are_refused_in_one_line(args, says, monkeypatch, capsys):
    """The runner's ``main`` as rank 0 of a 2-rank torchrun world (that environment), called in this
    process: it refuses in one line with status 2 before anything starts. (The command line itself,
    as a user runs it, is checked by the refusal tests above; nothing here may start a job.)"""
    from snippets.ranks import elastic, runner

    def no_job(*_, **__):
        raise AssertionError(f"{args} was not refused: a job was about to start")

    for name, value in AS_RANK_0_OF_2.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(runner, "run_jobs", no_job)
    monkeypatch.setattr(elastic, "launch", no_job)
    assert runner.main(list(args)) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    assert says in one_line(err)


@pytest.mark.skipif(
    __import__("snippets.ranks.runner").ranks.runner.nvidia_device_nodes(),
    reason="this host has NVIDIA device files: the verdict needs torch.cuda",
)
def test_without_a_gpu_the_verdict_needs_no_torch():
    """No NVIDIA device file, so no CUDA: a too-big job is refused without importing torch (each
    rank of a refused job ends in well under a second), and an estimate says it runs on gloo."""
    code = (
        "import sys\nfrom snippets.ranks import runner\nrc = runner.main(sys.argv[1:])\n"
        "print('exit', rc, 'torch imported:', 'torch' in sys.modules)"
    )

    def main_in_rank_0_of_2(*args, env=AS_RANK_0_OF_2):
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )

    refused = main_in_rank_0_of_2("pipeline", "--dims", "qwen3-8b", "--pp", "2")
    assert refused.stdout.strip() == "exit 2 torch imported: False", refused.stderr
    assert "one rank needs ~" in refused.stderr
    estimate = main_in_rank_0_of_2("tp-layer", "--tp", "2", "--estimate")
    assert estimate.stdout.rstrip().endswith("exit 0 torch imported: False"), estimate.stderr
    assert "gloo on cpu, snippets.cpu" in estimate.stdout
    # the one command refuses before it imports torch for the ranks it would have started
    before_launch = main_in_rank_0_of_2("--nproc-per-node", "4", "groups", "--tp", "3", env={})
    assert before_launch.stdout.strip() == "exit 2 torch imported: False", before_launch.stderr


def test_estimate_and_list_start_nothing():
    proc = plain("refit", "--dims", "dense-8b", "--world-size", "8", "--tp", "2", "--pp", "4", "--estimate")
    assert proc.returncode in (0, 2)  # depends on this machine's memory; either way nothing ran
    assert "one rank needs ~" in proc.stderr or "memory per rank: needs ~" in proc.stdout
    estimate = plain("--nproc-per-node", "8", "groups", "--tp", "2", "--pp", "4", "--estimate")
    assert estimate.returncode == 0 and estimate.stdout.splitlines()[1].startswith(
        "8 ranks = tp 2 x pp 4 x cp 1 x dp 1; gloo on cpu"
    ), estimate.stderr
    listing = plain("--list")
    assert listing.returncode == 0
    for name, exp in EXPERIMENTS.items():
        assert name in listing.stdout and exp.note in listing.stdout
    assert "qwen3-8b  8.19B parameters" in listing.stdout


def test_one_command_job_is_quiet_and_leaves_nothing_in_tmp():
    """The one-command job of the 4-rank tables ran in a TMPDIR of its own: the launcher removed
    its per-rank directories, and no line of torch's elastic agent reached stderr."""
    proc = one_command(4, *FOUR_RANKS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.leftovers == []
    assert "torch/distributed/elastic" not in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- notes call the same code

LISTED = {
    "01_training_run_overview": "snippets.experiments.n01_overview",
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
    "23_tensor_journey": "snippets.experiments.n23_journey",
    "24_rng_and_recomputation": "snippets.experiments.n24_rng",
    "25_megatron_hf_conversion": "snippets.experiments.n25_hf",
    "26_cost": "snippets.experiments.n26_cost",
    "27_rl_trainer_side": "snippets.experiments.n27_rl_trainer",
    "28_gpu_only": "snippets.experiments.n28_gpu_only",
}
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
    blocks = [
        block
        for cell in nb["cells"]
        if cell["cell_type"] == "markdown"
        for block in re.findall(r"```python\n(.*?)```", "".join(cell["source"]), re.S)
    ]
    code_cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    calls = [cell for cell in code_cells if re.search(r"^listing\(", cell, re.M)]
    assert blocks or calls, f"{note} lists no code"
    for block in blocks:
        names = re.findall(r"^(?:def|class) (\w+)", block, re.M)
        expected = "\n\n\n".join(inspect.getsource(getattr(mod, n)).rstrip("\n") for n in names)
        assert block.rstrip("\n") == expected, f"{note}: the listing of {names} differs from {module}"
    path = module.replace(".", "/") + ".py"
    for cell in calls:
        shown = [
            out
            for c in nb["cells"]
            if c["cell_type"] == "code" and "".join(c["source"]) == cell
            for out in c.get("outputs", [])
            if "text/html" in out.get("data", {})
        ]
        assert shown, f"{note}: a listing(...) cell has no stored output"
    if calls and not blocks:
        html = "".join(
            "".join(out["data"]["text/html"])
            for c in nb["cells"]
            if c["cell_type"] == "code"
            for out in c.get("outputs", [])
            if "text/html" in out.get("data", {})
        )
        assert path in html, f"{note}: no listing shows {path}"
    source = "".join(code_cells)
    parent, name = module.rsplit(".", 1)
    assert f"from {module} import" in source or re.search(
        rf"^from {parent} import .*\b{name}\b", source, re.M
    )


# ----------------------------------------------------------------------------- in-process runs of the runner's path


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
