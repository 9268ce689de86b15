"""Note 28's hang and NaN cases: each ends within the bound the note sets, the messages it prints are
cleaned of what changes between runs, torch's DETAIL mode names the mismatched collectives, and the
rerun state machine stops the job on the injected NaN."""

from __future__ import annotations

import re
import time

import pytest

from snippets.experiments import n28_hang as h

TIMEOUT_S = 1.0
"""The groups' timeout here: half the note's, to keep the test short (the cases scale with it)."""


@pytest.fixture(scope="module")
def launch():
    from snippets.ranks.launch import run_ranks

    start = time.monotonic()
    hang = run_ranks(h.hang_scenarios, 2, TIMEOUT_S, timeout=h.HANG_LAUNCH_S)
    elapsed = time.monotonic() - start
    nan = run_ranks(h.nan_cases, 2, timeout=30)
    return [dict(hang=a, nan=b) for a, b in zip(hang, nan, strict=True)], elapsed


@pytest.fixture(scope="module")
def hang(launch):
    return [r["hang"] for r in launch[0]]


@pytest.fixture(scope="module")
def nan(launch):
    return [r["nan"] for r in launch[0]]


def test_normalize_strips_addresses_ports_pids_paths_hosts_and_measured_durations():
    text = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:9934 after 2.73 s; Timed out waiting 2000ms; pid 48213 on node gpu-node-17; "
        "[rank0]:[E1204 06:49:25.951271719 ProcessGroupGloo.cpp:2901] Rank 1 failed; "
        "Current thread 0x00007f3a5c1b2740; see /tmp/ranks-abc123/stack0.txt\n"
        '  File "/work/main/snippets/experiments/n28_hang.py", line 123 in stuck\n'
        '  File "/tmp/ci run/main/.venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", '
        "line 83 in wrapper\n"  # a clone at a path with a space
        '  File "/work/main/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", '
        "line 3252 in all_reduce"
    )
    out = h.normalize(text, bounds_s=(2.0,), host="gpu-node-17")
    for volatile in (
        "127.0.0.1",
        "9934",
        "48213",
        "gpu-node-17",
        "0x00007f",
        "/work/",
        "/tmp/",
        "__w",
        "2.73",
        "06:49:25",
        "2901",
        "line 123",
        "ci run",
        "<dir>",
    ):
        assert volatile not in out, (volatile, out)
    assert 'File "c10d_logger.py", line 83 in wrapper' in out
    for kept in (
        "[pair.cc:553]",
        "<addr>",
        "<pid>",
        "<host>",
        "<hex>",
        "2000ms",
        "<T>",
        "[E ProcessGroupGloo.cpp] Rank 1 failed",
        'File "n28_hang.py" in stuck',
        'File "distributed_c10d.py", line 3252 in all_reduce',
        "stack0.txt",
    ):
        assert kept in out, (kept, out)


def test_every_case_ends_within_its_bound(launch, hang):
    # the launch itself returned inside run_ranks(timeout=HANG_LAUNCH_S) (else RankError); its wall
    # time also counts forking and joining the ranks, which a loaded machine stretches
    _, elapsed = launch
    assert elapsed < h.HANG_LAUNCH_S + 10
    assert sum(res["elapsed"] for res in hang[0].values() if isinstance(res, dict) and "elapsed" in res) < (
        3 * TIMEOUT_S + 2
    )
    for res in hang:
        for case in ("skip", "swap", "swap_detail", "skip_detail"):
            # a case waits at most one collective timeout (plus the swap case's 0.3 s head start)
            assert res[case]["elapsed"] < TIMEOUT_S + 1.0, (case, res[case]["elapsed"])


def test_a_skipped_all_reduce_pairs_the_next_one_silently_then_times_out(hang):
    r0, r1 = (dict((o[0], o[1:]) for o in res["skip"]["out"]) for res in hang)
    # rank 0's step 1 met rank 1's step 2: (10*1 + 0) + (10*2 + 1), not 10 + 11
    assert r0[1] == ("sum", 31.0) and r1[2] == ("sum", 31.0)
    assert r1[1] == ("skipped",)
    assert r0[2][0] == "raised" and "Timed out waiting 1000ms" in r0[2][1]
    # the flight recorder tells the ranks apart: rank 0 issued 3 collectives on the group, rank 1 two
    assert [res["flight_record"]["last_enqueued"] for res in hang] == [3, 2]
    assert [len(res["flight_record"]["entries"]) for res in hang] == [3, 2]


def test_opposite_orders_time_out_on_plain_gloo_and_are_named_under_detail(hang):
    plain = [res["swap"]["out"] for res in hang]
    assert plain[0][0][:2] == ("all_reduce", "raised") and "Timed out" in plain[0][0][2]
    assert plain[1][0][:2] == ("broadcast", "raised") and "Connection closed by peer" in plain[1][0][2]
    assert all("mismatch" not in item[-1] for out in plain for item in out)
    assert {res["wrapper"] for res in hang} == {"_ProcessGroupWrapper"}
    for res in hang:
        [item] = res["swap_detail"]["out"]
        assert item[1] == "raised" and "Detected mismatch between collectives" in item[2]
        assert "OpType=ALLREDUCE" in item[2] and "OpType=BROADCAST" in item[2]
    lines = h.mismatch_summary(hang)
    assert "rank 0 在 ALLREDUCE" in lines[0] and "rank 1 在 BROADCAST" in lines[0]


def test_detail_names_the_rank_that_skipped(hang):
    last = hang[0]["skip_detail"]["out"][-1]
    assert last[1] == "raised" and "Ranks 1 failed to pass monitoredBarrier in 1000 ms" in last[2]


def test_the_flight_recorder_analyzer_needs_the_group_members_then_names_the_missing_rank(hang):
    assert h.fr_analyzer(hang)[0].startswith("KeyError")
    out = h.fr_analyzer(hang, add_members=True)
    assert "Not all ranks joining collective, sequence number: 3" in out
    assert "missing ranks: {1}" in out


def test_the_rerun_state_machine_catches_the_nan(nan):
    def last(case, rank=0):
        return nan[rank][case]["rows"][-1]

    # as published, its all_reduce of the flag asks for CUDA: a fresh process finds no driver; a
    # rank forked from a test process that already asked torch.cuda something is refused earlier
    assert re.search(r"NVIDIA driver|re-initialize CUDA in forked subprocess", last("as_published")["error"])
    # disabled: validate_result still raises on the rank whose loss is NaN, the others go on
    assert "Unexpected result nan" in last("disabled", h.NAN_RANK)["error"]
    assert last("disabled", 0)["error"] is None and last("disabled", 0)["iteration"] == h.NAN_ITERATIONS
    # validate_results: every rank reruns the step once, the NaN comes back: checkpoint, exit 16
    for rank in (0, 1):
        row = last("validate_results", rank)
        assert (row["iteration"], row["runs"], row["decision"]) == (h.NAN_ITERATION, 2, (True, True, 16))
        assert row["state"] == "WILL_RERUN_FROM_CHECKPOINT"
    # a NaN on the first iteration is not looked at
    assert [r["decision"] for r in nan[0]["nan_at_iteration_1"]["rows"]] == [(False, False, 0)] * 2
    assert last("inject_transient")["decision"] == (False, True, 17)
    assert last("inject_persistent")["decision"] == (True, True, 16)
    spike = nan[0]["spike"]["rows"]
    assert [r["runs"] for r in spike] == [1] * (h.SPIKE_SAMPLES + 1) + [2, 1]
    assert all(r["decision"] == (False, False, 0) for r in spike)


def test_the_nan_table_shows_each_rank_when_they_differ_and_the_rerun_step_of_a_spike(nan):
    rows = h.nan_table(nan).rows
    disabled = [r for r in rows if r[1] == "disabled"]
    # rank 0 ran every step (no other collective in this loop), rank 1 raised at the NaN step
    assert [r[2:5] for r in disabled] == [["rank 0", h.NAN_ITERATIONS, 1], ["rank 1", h.NAN_ITERATION, 1]]
    assert disabled[0][6].startswith("checkpoint=False") and disabled[1][6].startswith("raised")
    # the spike: the step it hit ran twice and training went on (fatal=False)
    spike = rows[-1]
    assert spike[2:5] == ["全部", h.SPIKE_SAMPLES + 2, 2]
    assert spike[6] == "checkpoint=False, exit=False, exit code 0"


def test_the_launcher_reports_where_the_waiting_rank_stands_within_its_bound():
    out = h.launcher_report()
    assert out["rank"] == 0 and out["elapsed"] < h.STUCK_LAUNCH_S + 3
    report = out["report"]
    assert f"ranks [0] did not finish within {h.STUCK_LAUNCH_S:g} s" in report
    assert "in all_reduce" in report and report.rstrip().splitlines()[-2].endswith("in stuck")
    assert "(ranks [1] had finished" in report
    assert "0x" not in report and "/" not in report.replace("/s", "")


def test_printed_tables_hold_nothing_volatile(launch):
    text = "\n".join(str(t) for t in h.tables(launch[0]))
    for volatile in ("127.0.0.1", "/work/", "/tmp/", "0x", "node vm"):
        assert volatile not in text, volatile


def test_every_cited_line_holds_what_the_procedure_says():
    checked = h.check_sources()
    assert [k for k, ok in checked.items() if ok is False] == []
    # everything inside the megatron and torch packages is on every machine; only pretrain_gpt.py may be absent
    assert {k for k, ok in checked.items() if ok is None} <= {"loss_nan", "loss_spiky", "spiky_factor"}


def test_the_procedure_defaults_come_from_megatrons_parser():
    defaults = h.megatron_defaults()
    assert defaults["distributed_timeout_minutes"] == (10, ["--distributed-timeout-minutes"])
    assert defaults["rerun_mode"][0] == "validate_results"
    assert defaults["flight_recorder_trace_buffer_size"][0] == 2000
    assert defaults["check_for_spiky_loss"][0] is False and defaults["error_injection_rate"][0] == 0
