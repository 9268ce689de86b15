"""python -m snippets.rl.verl_sync (the old name of ``weight-sync``, kept for note 22): explains how a
verl run syncs its weights from its YAML config, or fails with one clear line. Fixtures under
tests/fixtures/verl/ are written for these tests, with verl's key names. Launch scripts and NeMo RL
configs: tests/unit/test_weight_sync.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from snippets.rl import refit_cost, verl_sync

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"


def flat(text):
    """The printed explanation with its line folding undone (long lines wrap at 80 columns)."""
    return " ".join(text.split())


def run(*args, cwd=None):
    """The command as a user runs it: exit status, stdout, stderr."""
    p = subprocess.run(
        [sys.executable, "-m", "snippets.rl.verl_sync", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    return p.returncode, p.stdout, p.stderr


def test_seed_layout_megatron_tp4_pp2_to_sglang_tp8(capsys):
    assert verl_sync.main([str(FIXTURES / "megatron_sglang_colocated.yaml")]) == 0
    out = flat(capsys.readouterr().out)
    assert "Megatron TP4 x PP2 x CP1 x DP1 (EP1) on 8 GPUs" in out
    assert "1 engine(s) of TP8 on 8 GPUs" in out  # rollout TP came from ${trainer...}
    assert "colocated" in out and "CUDA IPC" in out and "transformer_impl.py:1025" in out
    # seed 000: 8B bf16 = 16 GB; the 1/8 slice = 2 GB, 4.44 ms on NVLink
    assert "8B parameters" in out and "16 GB per copy" in out
    assert "1/8 of the model = 2 GB" in out and ">= 4.44 ms" in out
    # verl's own path gathers every full tensor: 7/8 of 16 GB on every GPU
    gathered = refit_cost.bytes_per_gpu(8e9, "gather", shards=8) / 1e9
    assert gathered == 14.0 and "= 14 GB over NVLink >= 31.1 ms" in out


def test_fsdp_vllm_colocated(capsys):
    assert verl_sync.main([str(FIXTURES / "fsdp_vllm_colocated.yaml")]) == 0
    out = flat(capsys.readouterr().out)
    assert "FSDP on 8 GPUs, every parameter sharded over 8 (fsdp_size -1)" in out
    assert "4 engine(s) of TP2" in out and "engine_workers.py:727" in out
    assert "7B parameters (from model.path Qwen/Qwen2.5-7B-Instruct)" in out
    assert "= 12.2 GB over NVLink >= 27.2 ms" in out  # 14 GB x 7/8, 450 GB/s
    assert "1/2 of the model = 7 GB" in out


def test_separate_placement_with_flat_keys(capsys):
    assert verl_sync.main([str(FIXTURES / "fsdp2_vllm_separate.yaml")]) == 0
    out = flat(capsys.readouterr().out)
    assert "separate: 8 GPUs train and another 8 generate" in out
    assert "hybrid_engine = false: only verl's experimental fully_async_policy" in out
    assert "checkpoint engine nccl" in out and "trainer rank 0 broadcasts them bucket by bucket" in out
    assert "140 GB over InfiniBand >= 2800 ms" in out  # 70B bf16, 50 GB/s
    assert "1/4 of the model = 35 GB" in out and ">= 700 ms" in out


def test_params_flag_overrides_and_unknown_size_still_explains(tmp_path, capsys):
    assert verl_sync.main([str(FIXTURES / "fsdp_vllm_colocated.yaml"), "--params", "1.5B"]) == 0
    assert "1.5B parameters (--params), bf16: 3 GB per copy" in flat(capsys.readouterr().out)
    assert (
        verl_sync.main([str(FIXTURES / "fsdp_vllm_colocated.yaml"), "--params", "2e9", "--dtype", "fp32"])
        == 0
    )
    assert "2B parameters (--params), fp32: 8 GB per copy" in flat(capsys.readouterr().out)
    cfg = tmp_path / "nosize.yaml"
    cfg.write_text(
        (FIXTURES / "fsdp_vllm_colocated.yaml")
        .read_text()
        .replace("Qwen/Qwen2.5-7B-Instruct", "/ckpt/my-policy")
    )
    assert verl_sync.main([str(cfg)]) == 0
    out = flat(capsys.readouterr().out)
    assert "size unknown" in out and "colocated" in out and "per copy" not in out
    # the byte figures are still there, each saying what it needs
    assert "gather (1 - 1/8 of the model) = ? GB over NVLink (needs --params)" in out
    assert "1/2 of the model = ? GB (needs --params)" in out and " ms" not in out


def _variant(tmp_path, old, new, name="v.yaml"):
    cfg = tmp_path / name
    text = (FIXTURES / "fsdp_vllm_colocated.yaml").read_text()
    assert old in text
    cfg.write_text(text.replace(old, new))
    return cfg


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda t: t / "missing.yaml", "error: no such file: "),
        (lambda t: _write(t, "bad.yaml", "actor_rollout_ref: [1, 2\n"), "is not valid YAML: "),
        (
            lambda t: FIXTURES / "not_verl.yaml",
            "is neither a verl config (no actor_rollout_ref section) nor a NeMo RL config",
        ),
        (
            lambda t: _write(t, "list.yaml", "- a\n- b\n"),
            "is neither a verl nor a NeMo RL config: expected a mapping of sections, got list",
        ),
        (lambda t: _variant(t, "  nnodes: 1\n", ""), "missing key trainer.nnodes"),
        (
            lambda t: _variant(t, "strategy: fsdp", "strategy: deepspeed"),
            "actor_rollout_ref.actor.strategy is 'deepspeed'; verl knows fsdp, fsdp2, fsdp_turbo, megatron",
        ),
        (lambda t: _variant(t, "name: vllm", "name: hf"), "rollout.name is 'hf'; verl knows vllm"),
        (
            lambda t: _variant(t, "tensor_model_parallel_size: 2", "tensor_model_parallel_size: 3"),
            "tensor_model_parallel_size 3 does not divide the 8 rollout GPUs",
        ),
        (
            lambda t: _variant(t, "hybrid_engine: true", "hybrid_engine: maybe"),
            "actor_rollout_ref.hybrid_engine is 'maybe'; expected true or false",
        ),
        (
            lambda t: _variant(
                t,
                "tensor_model_parallel_size: 2",
                "tensor_model_parallel_size: ${actor_rollout_ref.rollout.tensor_model_parallel_size}",
            ),
            "refers to itself",
        ),
    ],
)
def test_problems_exit_2_with_one_line(tmp_path, make, expected):
    code, out, err = run(make(tmp_path))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err


def test_mandatory_value_is_reported_as_set_on_the_command_line():
    # verl's rollout.yaml leaves rollout.name as ???; the report names it and still explains the rest
    code, out, err = run(FIXTURES / "rollout_name_unset.yaml")
    assert code == 0 and err == ""
    out = flat(out)
    assert (
        "unknown actor_rollout_ref.rollout.name = ???: set on the command line (verl requires a "
        "value here; one of vllm, sglang, trtllm)"
    ) in out
    assert "rollout.name = ???, tensor_model_parallel_size = 1: 4 engine(s) of TP1 on 4 GPUs" in out
    assert "rollout engine's server on the same GPU through CUDA IPC" in out
    assert "0.5B parameters" in out and "= 0.75 GB over NVLink" in out


def test_bad_params_flag():
    code, out, err = run(FIXTURES / "fsdp_vllm_colocated.yaml", "--params", "lots")
    assert code == 2 and err.strip() == "error: --params 'lots' is not a number like 7e9 or 7B"


def test_megatron_sizes_are_required_for_a_megatron_trainer(tmp_path):
    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        (FIXTURES / "megatron_sglang_colocated.yaml")
        .read_text()
        .replace("      pipeline_model_parallel_size: 2\n", "")
    )
    code, _, err = run(cfg)
    assert code == 2 and "missing key actor_rollout_ref.actor.megatron.pipeline_model_parallel_size" in err


def test_the_command_runs_as_a_module_and_folds_long_lines():
    # a path relative to the fixtures: the first line's folding must not depend on the clone's path
    code, out, err = run("megatron_sglang_colocated.yaml", cwd=FIXTURES)
    assert code == 0 and err == "" and out.startswith("verl config ")
    assert max(len(line) for line in out.splitlines()) <= 80
    # a folded line continues under its own text column
    lines = out.splitlines()
    step = next(i for i, line in enumerate(lines) if line.lstrip().startswith("1. "))
    assert lines[step + 1].startswith(" " * 14) and not lines[step + 1].startswith(" " * 15)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path
