"""``weight-sync``: a verl launch script, a verl YAML config or a NeMo RL config in, how that run
moves its weights out. Fixtures under tests/fixtures/verl/ and tests/fixtures/nemo_rl/ are written for
these tests in the frameworks' shapes (not copied from either). The YAML-only cases of verl are in
tests/unit/test_verl_sync.py."""

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snippets.rl.weight_sync import cli, facts, hydra
from snippets.rl.weight_sync.shell import _Shell, read_script
from snippets.rl.weight_sync.values import ConfigError

ROOT = Path(__file__).parents[2]
VERL = ROOT / "tests" / "fixtures" / "verl"
NEMO = ROOT / "tests" / "fixtures" / "nemo_rl"


def flat(text):
    return " ".join(text.split())


def run(*args, module="snippets.rl.weight_sync"):
    p = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, timeout=60
    )
    return p.returncode, p.stdout, p.stderr


def report(path, *args):
    """The report through main() in this process (fast), with its exit status."""
    lines = cli.build(str(path), None, None, "") if not args else None
    if lines is None:
        raise AssertionError("use run() for flags")
    return flat("\n".join(lines))


def script(tmp_path, body, name="run.sh"):
    """A launch script: ``body`` (shell lines) then a trainer command that feeds the keys read."""
    path = tmp_path / name
    path.write_text("#!/usr/bin/env bash\nset -x\n" + body)
    return path


COMMAND = """
python3 -m verl.trainer.main_ppo \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.tensor_model_parallel_size={tp} \\
    trainer.n_gpus_per_node={gpus} \\
    trainer.nnodes={nodes}
"""


# ----------------------------------------------------------------------------- verl launch scripts


def test_megatron_launch_script_on_verl_defaults():
    out = report(VERL / "run_qwen2_7b_megatron_grpo.sh")
    assert "command lines 21-36: verl.trainer.main_ppo --config-name ppo_megatron_trainer" in out
    assert f"(verl {facts.VERL_COMMIT[:7]})" in out
    # NNODES=${NNODES:-2} x GPUS_PER_NODE=8; ${train_tp} and $train_pp; rollout TP from $gen_tp
    assert "Megatron TP2 x PP2 x CP1 x DP4 (EP1) on 16 GPUs" in out
    assert "model_engine = megatron" in out  # ppo_megatron_trainer = ppo_trainer + model_engine megatron
    assert "rollout.name = vllm, tensor_model_parallel_size = 4: 4 engine(s) of TP4 on 16 GPUs" in out
    assert "trainer_mode = sync" in out and "placement colocated" in out  # verl's defaults
    assert "7B parameters (from model.path Qwen/Qwen2.5-7B-Instruct)" in out
    assert "gather (1 - 1/4 of the model) = 10.5 GB over NVLink" in out
    assert "the command ends with $@" in out and "unknown" not in out  # $HOME feeds no key read


def test_separate_placement_script_with_shell_arithmetic():
    out = report(VERL / "run_fully_async_fsdp2.sh")
    assert "fully_async_main --config-name fully_async_ppo_trainer" in out
    assert "FSDP2 on 6 GPUs, every parameter sharded over 6" in out  # $((8 - 2))
    assert "1 engine(s) of TP2 on 2 GPUs" in out
    assert "separate: 6 GPUs train and another 2 generate" in out
    assert "fully_async_trainer.py:76" in out and "checkpoint engine nccl" in out
    assert "the whole model = 16 GB over InfiniBand >= 320 ms" in out


def test_shell_variables_quotes_and_lists(tmp_path):
    path = script(
        tmp_path,
        """
export A=4
B="${A}"
C=${UNSET_ONE:-8}
D=${C:+2}
E='single $A'
LIST="['$A/x.parquet', '${C}/y.parquet']"
python3 -m verl.trainer.main_ppo data.train_files="$LIST" trainer.logger='["console","wandb"]' \\
    a.b=$B a.c=$C a.d=$D a.e="$E" +a.f=1e-6 ++a.g=True ~a.h a.i=null
""",
    )
    command = read_script(str(path), path.read_text())
    words = {w.text.split("=")[0]: w for w in command.args}
    values = {o.key: o.value for o in (hydra.parse(w.text, w.unknown) for w in command.args)}
    assert all(w.unknown is None for w in words.values())
    assert values["data.train_files"] == ["4/x.parquet", "8/y.parquet"]
    assert values["trainer.logger"] == ["console", "wandb"]
    assert (values["a.b"], values["a.c"], values["a.d"], values["a.e"]) == (4, 8, 2, "single $A")
    assert values["a.f"] == 1e-6 and values["a.g"] is True and values["a.i"] is None
    assert hydra.parse("~a.h").op == "~" and hydra.parse("--config-path=x") is None


@pytest.mark.parametrize(
    "body,feeds,says",
    [
        ("NODES=$1\n", "nodes", "trainer.nnodes = $1: it is the script's argument $1"),
        (
            "NODES=${1:-2}\n",
            "nodes",
            "trainer.nnodes = ${1:-2}: it is the script's argument $1 (or '2' without one)",
        ),
        (
            "NODES=$(scontrol show hostnames | wc -l)\n",
            "nodes",
            "trainer.nnodes = $(scontrol show hostnames | wc -l): it is a command's output, known only "
            "when the script runs",
        ),
        (
            "NODES=`hostname | wc -l`\n",
            "nodes",
            "trainer.nnodes = `hostname | wc -l`: it is a command's output",
        ),
        (
            "",
            "nodes",
            "trainer.nnodes = $NODES: NODES is not set in the script: it would come from the environment",
        ),
        (
            "source ./cluster_env.sh\n",
            "nodes",
            "NODES is not set in the script or in cluster_env.sh, which it sources",
        ),
        (
            'if [ "$SLURM" = 1 ]; then\n  NODES=4\nfi\n',
            "nodes",
            "trainer.nnodes = $NODES: NODES is set inside an if block, so its value depends on how the "
            "script runs",
        ),
        ("for n in 1 2; do NODES=$n; done\n", "nodes", "NODES is set inside a for loop"),
        ("read NODES\n", "nodes", "NODES is read from input when the script runs"),
        (
            "GPUS=$((NPROC * 2))\n",
            "gpus",
            "trainer.n_gpus_per_node = $((NPROC * 2)): NPROC is not set in the script",
        ),
    ],
)
def test_each_unknowable_value_is_named_with_its_key_and_the_rest_is_reported(tmp_path, body, feeds, says):
    values = {"tp": 2, "gpus": 8, "nodes": 1}
    values[feeds] = "$NODES" if feeds == "nodes" else "$GPUS"
    path = script(tmp_path, body + COMMAND.format(**values))
    code, out, err = run(path)
    assert code == 0 and err == ""
    assert sum(line.startswith("unknown ") for line in out.splitlines()) == 1, out
    out = flat(out)
    assert says in out, out
    # everything else is still explained; what needs the unknown value says "?"
    assert "FSDP on ? GPUs, every parameter sharded over ?" in out
    assert "7B parameters" in out and "14 GB per copy" in out
    assert "gather (1 - 1/? of the model) = ? GB over ? (needs the unknown values above)" in out
    assert "1/2 of the model = 7 GB" in out


def test_mandatory_rollout_name_from_verl_defaults(tmp_path):
    # rollout.name is ??? in verl's generated defaults; a script that never sets it
    path = script(
        tmp_path,
        COMMAND.format(tp=2, gpus=8, nodes=1).replace("    actor_rollout_ref.rollout.name=vllm \\\n", ""),
    )
    out = report(path)
    assert (
        "unknown actor_rollout_ref.rollout.name = ???: set on the command line (verl requires a "
        "value here; one of vllm, sglang, trtllm)"
    ) in out
    assert "4 engine(s) of TP2 on 8 GPUs" in out and "= 12.2 GB over NVLink" in out


def test_defaults_of_unknown_config_and_several_commands(tmp_path):
    body = (
        COMMAND.format(tp=2, gpus=8, nodes=1)
        .replace("main_ppo", "main_ppo --config-path=recipe/config --config-name my_megatron_trainer")
        .replace(
            "trainer.nnodes=1",
            "trainer.nnodes=1 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        )
    )
    out = report(script(tmp_path, body + COMMAND.format(tp=1, gpus=4, nodes=1)))
    assert (
        "defaults my_megatron_trainer is not one of verl's configs; keys it leaves unset are read "
        "from verl's ppo_trainer with model_engine=megatron"
    ) in out
    assert "Megatron TP1 x PP2 x CP1 x DP4 (EP1) on 8 GPUs" in out  # TP1 from verl's megatron defaults
    assert "the script runs 2 trainer commands; this reads the first (line 4)" in out


def test_recipe_main_module_is_a_trainer(tmp_path):
    body = COMMAND.format(tp=2, gpus=8, nodes=1).replace("verl.trainer.main_ppo", "recipe.dapo.main_dapo")
    out = report(script(tmp_path, body))
    assert "recipe.dapo.main_dapo --config-name ppo_trainer" in out and "colocated" in out


# ----------------------------------------------------------------------------- NeMo RL configs


def test_nemo_rl_base_config_dtensor_vllm_colocated():
    out = report(NEMO / "grpo_base.yaml")
    assert f"NeMo RL config {NEMO / 'grpo_base.yaml'} (read against NeMo RL 7ea279a)" in out
    assert "DTensor (FSDP2) TP1 x CP1 on 8 GPUs, every parameter sharded over 8" in out
    assert "generation.backend = vllm: 8 engine(s) of TP1 x PP1 on 8 GPUs" in out
    assert "colocated.enabled = true" in out
    assert "stream_weights_via_ipc_zmq" in out and "grpo.py:2380" in out
    assert "1.5B parameters (from policy.model_name Qwen/Qwen2.5-1.5B), bf16: 3 GB" in out


def test_nemo_rl_defaults_chain_of_depth_2_with_interpolations():
    out = report(NEMO / "recipes" / "grpo_llama8b_megatron_separate.yaml")
    assert (
        "defaults grpo_llama8b_megatron_separate.yaml <- grpo_llama8b_megatron.yaml <- grpo_base.yaml"
    ) in out
    # megatron_cfg from the middle file, vllm TP from ${policy.megatron_cfg.tensor_model_parallel_size},
    # resources.gpus_per_node from ${cluster.gpus_per_node} of this file
    assert "Megatron Core through Megatron Bridge, TP2 x PP2 x CP1 x DP2 (EP1) on 8 GPUs" in out
    assert "4 engine(s) of TP2 x PP1 on 8 GPUs" in out
    assert "colocated.enabled = false: 8 GPUs train, 8 others generate (2 node(s) x 8 GPUs" in out
    assert "broadcast_weights_for_collective" in out and "grpo.py:2396" in out
    assert "broadcast (the whole model) = 16 GB over InfiniBand >= 320 ms" in out


def test_nemo_rl_sglang_and_megatron_generation():
    out = report(NEMO / "grpo_sglang.yaml")
    assert "generation.backend = sglang: 4 engine(s) of TP2 x PP1" in out
    assert "stream_weights_via_http" in out and "1/2 of the model = 1.5 GB" in out
    out = report(NEMO / "grpo_megatron_generation.yaml")
    assert "nothing moves: generation runs on the training model itself" in out
    assert "dedicated_inference_megatron_cfg returns None" in out and "= 0 GB" in out


@pytest.mark.parametrize(
    "child,says",
    [
        (
            "policy:\n  generation:\n    backend: megatron\n    mcore_generation_config:\n"
            "      tensor_model_parallel_size: 4\n      pipeline_model_parallel_size: 1\n",
            "reshard into a second model in the inference layout TP4 x PP1 on the same GPUs",
        ),
        (
            "policy:\n  generation:\n    backend: megatron\n    colocated:\n      enabled: false\n"
            "      resources: {gpus_per_node: 4, num_nodes: null}\n",
            "swap_weights_via_reshard across the two worlds over nccl",
        ),
        (
            "policy:\n  generation:\n    colocated:\n      enabled: false\n      resources:\n"
            "        gpus_per_node: 4\n    refit_transport: nccl_reshard\n",
            "refit_transport = nccl_reshard: each generation rank receives only its slice",
        ),
        (
            "policy:\n  generation:\n    backend: sglang\n    colocated:\n      enabled: false\n"
            "      resources:\n        gpus_per_node: 4\n",
            "NeMo RL does not run SGLang apart from training",
        ),
        # _override_ replaces the whole section: vllm_cfg loses its TP key, the default 1 applies
        (
            "policy:\n  generation:\n    vllm_cfg:\n      _override_: true\n      precision: bfloat16\n",
            "8 engine(s) of TP1 x PP1",
        ),
        # ??? in a child keeps the parent's value; ${.x} is relative, ${mul:...} a NeMo RL resolver
        ("cluster:\n  gpus_per_node: ???\n  two: 2\n  num_nodes: ${mul:${.two},1}\n", "on 16 GPUs"),
    ],
)
def test_nemo_rl_refit_paths_and_merge_rules(tmp_path, child, says):
    shutil.copy(NEMO / "grpo_llama8b_megatron.yaml", tmp_path)
    shutil.copy(NEMO / "grpo_base.yaml", tmp_path)
    path = tmp_path / "child.yaml"
    path.write_text("defaults: [grpo_llama8b_megatron.yaml]\n" + child)
    assert says in report(path)


def test_nemo_rl_sizes_that_do_not_fit_the_gpus_are_refused(tmp_path):
    shutil.copy(NEMO / "grpo_llama8b_megatron.yaml", tmp_path)
    shutil.copy(NEMO / "grpo_base.yaml", tmp_path)
    path = tmp_path / "child.yaml"
    for child, says in (
        # 8 GPUs less 2 for generation leave 6, which Megatron's TP2 x PP2 cannot split
        (
            "policy:\n  generation:\n    colocated:\n      enabled: false\n      resources:\n"
            "        gpus_per_node: 2\n",
            "policy.megatron_cfg.: TP 2 x PP 2 x CP 1 does not divide the 6 training GPUs",
        ),
        ("cluster:\n  num_nodes: 0\n", "cluster.num_nodes must be a positive int, got 0"),
        ("defaults: 5\n", "defaults: is 5; expected a file name or a list of them"),
    ):
        path.write_text(
            ("" if child.startswith("defaults") else "defaults: [grpo_llama8b_megatron.yaml]\n") + child
        )
        code, out, err = run(path)
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, err


def test_unknown_model_size_still_gets_the_whole_report(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(f"defaults: {NEMO / 'grpo_base.yaml'}\npolicy:\n  model_name: /ckpt/my-policy\n")
    code, out, err = run(path)
    assert code == 0 and err == ""
    out = flat(out)
    assert "size unknown" in out and "stream_weights_via_ipc_zmq" in out
    assert "gather (1 - 1/8 of the model) = ? GB over NVLink (needs --params)" in out
    code, out, _ = run(path, "--params", "3B")
    assert code == 0 and "3B parameters (--params), bf16: 6 GB per copy" in flat(out)


# ----------------------------------------------------------------------------- errors


def _file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda t: t / "missing.sh", "error: no such file: {path}"),
        (
            lambda t: _file(t, "bad.yaml", "policy: [1, 2\n"),
            "error: {path} is not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1",
        ),
        (
            lambda t: VERL / "prepare_data.sh",
            "error: {path}: line 5 runs verl.trainer.main_generation, which is not one of verl "
            f"{facts.VERL_COMMIT[:7]}'s PPO trainer mains ({', '.join(facts.VERL_MAINS)})",
        ),
        (
            lambda t: VERL / "not_verl.yaml",
            "error: {path} is neither a verl config (no actor_rollout_ref section) nor a NeMo RL config (no "
            "policy section with generation, dtensor_cfg or megatron_cfg)",
        ),
        (
            lambda t: _file(t, "scalar.yaml", "just words\n"),
            "error: {path} is neither a verl nor a NeMo RL config: expected a mapping of sections, got str",
        ),
        (
            lambda t: _file(t, "orphan.yaml", "defaults: nowhere.yaml\npolicy: {}\n"),
            "error: {path}: defaults: nowhere.yaml is not a file ({dir}/nowhere.yaml)",
        ),
        (
            lambda t: _file(t, "loop.yaml", "defaults: loop.yaml\n"),
            "error: {path}: defaults: chain comes back to loop.yaml",
        ),
        (
            lambda t: _file(t, "run.sh", COMMAND.format(tp=3, gpus=8, nodes=1)),
            "error: {path}: actor_rollout_ref.rollout.tensor_model_parallel_size 3 does not divide the 8 "
            "rollout GPUs",
        ),
        (
            lambda t: _file(
                t,
                "gen.yaml",
                f"defaults: {NEMO / 'grpo_base.yaml'}\npolicy:\n  generation:\n    backend: hf\n",
            ),
            "error: {path}: policy.generation.backend is 'hf'; NeMo RL knows vllm, sglang, megatron, trtllm, "
            "dynamo",
        ),
    ],
)
def test_errors_are_one_line_on_stderr_and_exit_2(tmp_path, make, expected):
    path = make(tmp_path)
    code, out, err = run(path)
    assert (code, out) == (2, "")
    assert err == expected.format(path=path, dir=path.parent) + "\n"


def test_console_script_and_old_module_name():
    exe = Path(sys.executable).with_name("weight-sync")
    assert exe.is_file(), "run bash scripts/setup.sh: pyproject.toml's [project.scripts] installs it"
    p = subprocess.run([str(exe), str(NEMO / "grpo_sglang.yaml")], capture_output=True, text=True, timeout=60)
    same = run(NEMO / "grpo_sglang.yaml")
    old = run(NEMO / "grpo_sglang.yaml", module="snippets.rl.verl_sync")
    assert p.returncode == 0 and (0, p.stdout, "") == same == old
    assert "usage: weight-sync" in subprocess.run([str(exe)], capture_output=True, text=True).stderr


# ----------------------------------------------------------------------------- verl 1dda039's styles


def test_arrays_model_engine_and_megatron_keys():
    out = report(VERL / "run_arrays_megatron.sh")
    # "${LAUNCH[@]}" -m ... with LAUNCH set again inside an if: the trainer is still found
    assert "command lines 47-53: verl.trainer.main_ppo --config-name ppo_trainer, 11 override(s)" in out
    assert "model_engine = megatron (verl/trainer/config/_generated_ppo_megatron_trainer.yaml)" in out
    # case "${DEVICE}" with DEVICE=${DEVICE:-gpu}: the gpu branch, as bash takes it; ACTOR+=(...) appends
    assert "Megatron TP4 x PP2 x CP2 x DP1 (EP1) on 16 GPUs" in out
    assert "2 engine(s) of TP8 on 16 GPUs" in out  # a quoted array element
    assert "trainer_mode = sync" in out and "checkpoint engine naive" in out
    assert "32B parameters (from model.path $HOME/models/Qwen3-32B)" in out  # comment inside ( )
    assert "the command ends with $@" in out
    assert "FSDP" not in out and "deepseek" not in out  # never verl's defaults for what the script sets


def test_separate_async_with_delta_sharded():
    out = report(VERL / "run_separate_async_delta.sh")
    assert "trainer_mode = separate_async: a standalone rollout" in out
    assert "separate: 8 GPUs train and another 8 generate" in out
    assert "checkpoint engine delta_sharded: only the changed elements" in out
    # 1-3 % of 8B elements change, each sent as a 2 B bf16 value + a 4 B int32 position (verl's wire)
    assert "= 0.48-1.44 GB over InfiniBand" in out
    assert "wire 6 B per changed bf16 element: the 2 B value and a 4 B int32 position" in out
    assert "delta_checkpoint_engine.py:632); 3-9 % of the 16 GB of weights" in out


@pytest.mark.parametrize(
    "backend,says",
    [
        ("naive", "separate_async needs a checkpoint_engine.backend other than naive"),
        ("gloo", "checkpoint_engine.backend is 'gloo'; verl knows naive, nccl, nixl"),
    ],
)
def test_separate_async_refusals(tmp_path, backend, says):
    text = (
        (VERL / "run_separate_async_delta.sh").read_text().replace("${CKPT_BACKEND:-delta_sharded}", backend)
    )
    path = tmp_path / "run.sh"
    path.write_text(text)
    code, out, err = run(path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err


def test_delta_sharded_needs_sglang_and_nccl_is_reported(tmp_path):
    text = (VERL / "run_separate_async_delta.sh").read_text()
    path = tmp_path / "run.sh"
    path.write_text(text.replace("rollout.name=sglang", "rollout.name=vllm"))
    code, _, err = run(path)
    assert code == 2 and "delta_sharded works only with rollout.name sglang" in err
    assert "verl/checkpoint_engine/base.py:326" in err
    path.write_text(text.replace("${CKPT_BACKEND:-delta_sharded}", "nccl"))
    out = report(path)
    assert (
        "checkpoint engine nccl: NCCL" in out and "the whole model = 16 GB over InfiniBand >= 320 ms" in out
    )


def test_checkpoint_engine_setting_is_unused_when_colocated(tmp_path):
    body = COMMAND.format(tp=2, gpus=8, nodes=1).replace(
        "trainer.nnodes=1", "trainer.nnodes=1 actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"
    )
    out = report(script(tmp_path, body))
    assert "checkpoint_engine.backend = nccl is not used: colocated, verl sets it to naive" in out
    assert "trainer_base.py:357" in out


def test_broken_continuation_is_reported_where_bash_ends_the_command():
    out = report(VERL / "run_broken_continuation.sh")
    assert "command lines 5-7: verl.trainer.main_ppo --config-name ppo_trainer, 2 override(s)" in out
    assert "broken line 7 ends in a backslash and a blank (then a comment)" in out
    assert "bash ends the command on line 7" in out
    assert "(' #' 'TODO:' 'set' 'the' 'path') reach the trainer, and Hydra rejects a word" in out
    assert "line 8 (data.val_files=...), lines 9-13 (actor_rollout_ref.model.path=...)" in out
    assert "command not found" in out and "what runs, not what the author meant" in out
    # what bash passes: the model is verl's placeholder, and the report says so
    assert "does not set actor_rollout_ref.model.path: the model below is verl's placeholder" in out


def test_bash_reading_matches_bash(tmp_path):
    """The words the reader passes are the words bash passes (checked against bash itself)."""
    body = r"""
A=(x=1 "y=2 3")
A+=(z=4)
S="p=5 q=6"
Q="r=7 \
s=8"
case "${MODE:-one}" in
    one | uno) C=c=9 ;;
    *) C=c=0 ;;
esac
P=2
[ "$P" -gt 1 ] && V=v=2 || V=v=null
if [ "$P" = 3 ]; then
    W=w=3
elif [ -n "$P" ]; then
    W=w=elif
else
    W=w=else
fi
if [ "$P" != 2 ]; then X=x=no; else X=x=yes; fi
cat <<EOF >/dev/null
python3 -m verl.trainer.main_ppo heredoc=body
EOF
python3 -m verl.trainer.main_ppo pre"${A[@]}"post ${A[*]} n=${#A[@]} $S "$S" $Q $C $V $W $X 2> /dev/null </dev/null
"""
    path = script(tmp_path, body)
    words = [w.text for w in read_script(str(path), path.read_text()).args]
    assert words[:3] == ["prex=1", "y=2 3", "z=4post"] and "n=3" in words and "c=9" in words
    assert words[-3:] == ["v=2", "w=elif", "x=yes"]  # && / || and if / elif / else as bash takes them
    assert _bash_words(tmp_path, path) == words


def _bash_words(tmp_path, path):
    """The words bash passes to the script's `python3` (a shim that prints them); skips, visibly,
    where there is no bash."""
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("no bash on PATH: the reader's words are not checked against bash's")
    shim = tmp_path / "python3"
    shim.write_text('#!/bin/sh\nshift 2\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    shim.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    got = subprocess.run([bash, str(path)], capture_output=True, text=True, env=env, timeout=30)
    return got.stdout.splitlines()


# $(( )) as bash computes it: 64-bit wrap, / and % toward zero, ** by squaring (never a hang)
ARITH = {
    "-7/2": -3,
    "-7%2": -1,
    "5%-3": 2,
    "2**64+4": 4,
    "2**63": -(2**63),
    "9**9**9": -2123029214124047543,
    "-2**2": 4,
    "2**3**2": 512,
    "010 + 0x10 + 2#101": 29,
    "1 ? 3 : 7/0": 3,
    "0 && 7/0": 0,
    "(N + 1) * 2 << 1": 36,
    "M * 2": 10,  # M=2+3: a variable's value is itself an expression
    "1 << 65": 2,  # the shift count is taken mod 64, as the CPU does
    "0 && 2 ** -M": 0,  # a skipped side reads variables as 0
    "": 0,
}


def test_arithmetic_is_bash_arithmetic(tmp_path):
    exprs = list(ARITH)
    body = "N=8\nM=2+3\n" + "".join(f"A{k}=$(({e}))\n" for k, e in enumerate(exprs))
    body += "python3 -m verl.trainer.main_ppo " + " ".join(f"a{k}=$A{k}" for k in range(len(exprs))) + "\n"
    path = script(tmp_path, body)
    words = [w.text for w in read_script(str(path), path.read_text()).args]
    assert words == [f"a{k}={ARITH[e]}" for k, e in enumerate(exprs)]
    assert _bash_words(tmp_path, path) == words


def _random_expression(rng, depth=0):
    def atom(d):
        r = rng.random()
        if d > 3 or r < 0.35:
            return rng.choice(
                ["0", "1", "2", "7", "-5", "010", "0x1f", "2#101", "N", "M", "9223372036854775807"]
            )
        if r < 0.5:
            return rng.choice(["- ", "+ ", "!", "~"]) + atom(d + 1)  # "- -" is not "--"
        if r < 0.6:
            return f"({_random_expression(rng, d + 1)})"
        if r < 0.7:
            return f"{atom(d + 1)} ? {atom(d + 1)} : {atom(d + 1)}"
        return _random_expression(rng, d + 1)

    ops = "+ - * / % ** << >> < > <= >= == != & ^ | && || ,".split()
    return f"{atom(depth)} {rng.choice(ops)} {atom(depth)}"


def test_arithmetic_matches_bash_on_random_expressions(tmp_path):
    """600 seeded random expressions (errors included): the reader's value, or its refusal, is bash's."""
    if not shutil.which("bash"):
        pytest.skip("no bash on PATH: the reader's arithmetic is not checked against bash's")
    rng = random.Random(39)
    exprs = [_random_expression(rng) for _ in range(600)]
    path = tmp_path / "a.sh"
    path.write_text("N=4 M=-3\n" + "".join(f'(echo "$(( {e} ))") 2>/dev/null || echo error\n' for e in exprs))
    got = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60).stdout.splitlines()
    ours = []
    for e in exprs:
        shell = _Shell("a.sh")
        shell.env.update(N="4", M="-3")
        try:
            ours.append(str(shell._arith(f"$(( {e} ))")))
        except ConfigError:
            ours.append("error")
    assert ours == got


@pytest.mark.parametrize(
    "expr,says",
    [
        ("7/0", "bash reports 'division by 0'"),
        ("2**-1", "bash reports 'exponent less than 0'"),
        ("1 || 2**-1", "bash reports 'exponent less than 0'"),  # even on the side || skips
        ("08", "bash reports '08: value too great for base'"),
        ("2 +", "bash reports 'syntax error: operand expected'"),
    ],
)
def test_arithmetic_bash_refuses_is_refused(tmp_path, expr, says):
    path = tmp_path / "bad.sh"
    path.write_text(f"N=$(({expr}))\npython3 -m verl.trainer.main_ppo trainer.nnodes=$N\n")
    code, out, err = run(path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and f"line 1: $(({expr})): {says}" in err
    # inside a branch the reader cannot decide, it is an unknown value, not a refusal
    path.write_text(
        f'if [ -n "$1" ]; then N=$(({expr})); fi\npython3 -m verl.trainer.main_ppo trainer.nnodes=$N\n'
    )
    assert read_script(str(path), path.read_text()).args[0].unknown is not None


def test_arithmetic_the_reader_does_not_evaluate_is_named(tmp_path):
    path = tmp_path / "x.sh"
    path.write_text("N=1\npython3 -m verl.trainer.main_ppo a=$((N++)) b=$((N=3))\n")
    a, b = read_script(str(path), path.read_text()).args
    assert "++ or -- on a variable" in a.unknown.why and "an assignment" in b.unknown.why


def test_what_arithmetic_assigns_is_unknown_after_it(tmp_path):
    path = tmp_path / "x.sh"
    path.write_text(
        "N=2\n(( M = N << 3 ))\nif true; then (( N++ )); fi\nK=$((J=5))\n"
        "python3 -m verl.trainer.main_ppo a=$N b=$M c=$J\n"
    )
    a, b, c = read_script(str(path), path.read_text()).args
    assert "N is changed on line 3 by the arithmetic command (( ))" in a.unknown.why
    assert "M is changed on line 2" in b.unknown.why  # `<<` inside (( )) is a shift, not a here-document
    assert "J is changed on line 4 by $((J=5))" in c.unknown.why


def test_heredoc_body_is_not_a_command(tmp_path):
    body = "cat <<-'END' > other.sh\n\tpython3 -m verl.trainer.main_ppo trainer.nnodes=9\n\tEND\n"
    path = script(tmp_path, body + COMMAND.format(tp=2, gpus=8, nodes=1))
    command = read_script(str(path), path.read_text())
    assert command.count == 1 and command.line == 7 and "trainer.nnodes=1" in [w.text for w in command.args]


def test_config_group_from_outside_verl_leaves_the_strategy_unknown(tmp_path):
    body = COMMAND.format(tp=2, gpus=8, nodes=1).replace(
        "main_ppo", "main_ppo hydra.searchpath=[pkg://plugin.config] actor@actor_rollout_ref.actor=lite_actor"
    )
    out = report(script(tmp_path, body))
    assert "unknown actor_rollout_ref.actor.strategy = actor@actor_rollout_ref.actor=lite_actor" in out
    assert "loads a config verl 1dda039 does not ship (from hydra.searchpath [pkg://plugin.config])" in out
    assert "FSDP" not in out


def test_model_engine_from_an_unset_variable_is_unknown(tmp_path):
    body = COMMAND.format(tp=2, gpus=8, nodes=1).replace("main_ppo", "main_ppo model_engine=$ENGINE")
    out = report(script(tmp_path, body))
    assert "actor_rollout_ref.actor.strategy = model_engine=$ENGINE: ENGINE is not set in the script" in out
    assert "FSDP" not in out


@pytest.mark.parametrize(
    "text,says",
    [
        ('python3 -m verl.trainer.main_ppo a.b="open\n', 'line 1: a " quote opened here is never closed'),
        ("A=(x y\npython3 -m verl.trainer.main_ppo\n", "line 1: an array's `(` is never closed"),
        ("N=$((2 +\n", "line 1: a $(( )) or $( ) opened here is never closed"),
        ("echo moved >&2\nexit 1\n", "runs no verl trainer: it exits on line 2"),
        (
            "python3 -m verl.trainer.main_ppo model_engine=deepspeed\n",
            "model_engine=deepspeed: verl 1dda039 has",
        ),
    ],
)
def test_bad_scripts_get_one_line_and_exit_2(tmp_path, text, says):
    path = tmp_path / "bad.sh"
    path.write_text(text)
    code, out, err = run(path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize(
    "text,says",
    [
        (
            "python3 -m verl.trainer.main_ppo a=1 \\\r\n  trainer.nnodes=2\r\n",
            "line 1: the script has Windows (CRLF) line endings",
        ),
        (
            "N=8\nif [ $N = 8 ]; then\n  python3 -m verl.trainer.main_ppo\n",
            "line 2: an if block opened here has no `fi`",
        ),
        (
            "for x in 1; do\n  python3 -m verl.trainer.main_ppo\n",
            "line 1: a for loop opened here has no `done`",
        ),
        (
            "case $1 in\n a) X=1 ;;\npython3 -m verl.trainer.main_ppo\n",
            "line 1: a case opened here has no `esac`",
        ),
        ("python3 -m verl.trainer.main_ppo\nfi\n", "line 2: `fi` closes no open block"),
        ("true && }\npython3 -m verl.trainer.main_ppo\n", "line 1: `}` right after &&"),
        ('N="a `b"\npython3 -m verl.trainer.main_ppo\n', "line 1: a ` command substitution opened here"),
    ],
)
def test_scripts_bash_stops_on_are_refused(tmp_path, text, says):
    path = tmp_path / "bad.sh"
    path.write_bytes(text.encode())
    code, out, err = run(path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, err
    if shutil.which("bash") and "CRLF" not in says:  # bash itself stops on them
        got = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert got.returncode == 2 and ("syntax error" in got.stderr or "unexpected EOF" in got.stderr)


def test_sizes_must_be_positive(tmp_path):
    for override, says in (
        ("trainer.nnodes=0", "trainer.nnodes must be a positive int, got 0"),
        ("trainer.n_gpus_per_node=-8", "trainer.n_gpus_per_node must be a positive int, got -8"),
        (
            "actor_rollout_ref.rollout.tensor_model_parallel_size=-2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size must be a positive int, got -2",
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=-4",
            "fsdp_config.fsdp_size must be a positive int (or -1 / 0), got -4",
        ),
    ):
        path = tmp_path / "s.sh"
        path.write_text(f"python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm {override}\n")
        code, out, err = run(path)
        assert code == 2 and says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "0.5", "-7e9", "1e16", "1e400B"])
def test_params_must_be_a_finite_count(value):
    code, out, err = run(VERL / "run_separate_async_delta.sh", f"--params={value}")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and f"--params {value!r}" in err, err


def test_special_files_and_reader_bugs_get_one_line(tmp_path, monkeypatch, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in ("/dev/null", fifo):  # reading a FIFO would wait for a writer
        code, out, err = run(target)
        assert (
            code == 2
            and err.strip() == f"error: {target} is not a regular file; give a launch script or a config file"
        )

    def broken(*args):
        raise AttributeError("'NoneType' object has no attribute 'text'")

    monkeypatch.setattr(cli, "build", broken)
    assert cli.main([str(VERL / "run_separate_async_delta.sh")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "could not read it (AttributeError: " in err
    monkeypatch.setenv("WEIGHT_SYNC_DEBUG", "1")
    assert cli.main([str(VERL / "run_separate_async_delta.sh")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_binary_file_and_directory_get_one_line(tmp_path):
    blob = tmp_path / "x.sh"
    blob.write_bytes(b"\x00\x01\x02" * 100)
    for target, says in ((blob, "is a binary file"), (tmp_path, "is a directory")):
        code, out, err = run(target)
        assert code == 2 and len(err.splitlines()) == 1 and says in err and "Traceback" not in err


# ----------------------------------------------------------------------------- NeMo RL refit transports


def test_nemo_rl_sparse_and_nixl_transports():
    out = report(NEMO / "grpo_megatron_sparse.yaml")
    assert "refit_transport = vllm_zmq_sparse: only the elements that changed" in out
    assert "vllm_remote_sparse_weight_synchronizer.py:85" in out and "= 0.32-0.96 GB over" in out
    assert "wire 4 B per changed bf16 element: the 2 B value and a 2 B gap" in out  # uint16 gaps
    assert "weight_transfer_sparse_codec.py:190 _encode_explicit_locations); 2-6 % of the 16 GB" in out
    out = report(NEMO / "grpo_megatron_nixl.yaml")
    assert "refit_transport = nixl: the NIXL checkpoint engine (UCX/RDMA)" in out
    assert "factory.py:97 CheckpointEngineWeightSynchronizer" in out and "16 GB over InfiniBand" in out


@pytest.mark.parametrize(
    "overlay,says",
    [
        ("policy:\n  generation:\n    refit_transport: mcore\n", "mcore is named in NeMo RL 0.8's docs"),
        (
            "policy:\n  generation:\n    colocated:\n      enabled: true\n",
            "refit_transport vllm_zmq_sparse needs colocated.enabled=false",
        ),
        (
            "policy:\n  megatron_cfg:\n    enabled: false\n  dtensor_cfg:\n    enabled: true\n",
            "refit_transport vllm_zmq_sparse needs a non-colocated Megatron policy",
        ),
        (
            "policy:\n  generation:\n    refit_transport: nixl\n    backend: megatron\n",
            "refit_transport nixl works only with generation.backend vllm, not megatron",
        ),
    ],
)
def test_nemo_rl_transport_refusals(tmp_path, overlay, says):
    shutil.copy(NEMO / "grpo_base.yaml", tmp_path)
    shutil.copy(NEMO / "grpo_llama8b_megatron.yaml", tmp_path)
    shutil.copy(NEMO / "grpo_megatron_sparse.yaml", tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text("defaults: grpo_megatron_sparse.yaml\n" + overlay)
    code, out, err = run(path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err, err


def test_versions_and_help():
    code, out, err = run("--versions")
    assert code == 0 and err == ""
    assert "verl 1dda039" in out and "core_v0.18.0" in out and "0.5.2" in out
    assert "NeMo RL 7ea279a" in out and "0.20.0 (Megatron-LM 14346b6" in out and "0.7.0 (8c46dc4" in out
    code, out, _ = run("--help")
    for part in (
        "exit status:",
        "how a script is read",
        "${NAME[@]}",
        "old name: python -m snippets.rl.verl_sync",
    ):
        assert part in out, part
    code, out, err = run()
    assert code == 2 and "required: run" in err


def test_case_on_an_unknown_word_names_each_branch(tmp_path):
    body = (
        "DEVICE=$(detect_device)\n"
        'case "$DEVICE" in\n  gpu) GPUS=${GPUS:-8} ;;\n  npu) GPUS=${GPUS:-16} ;;\nesac\n'
        + COMMAND.format(tp=2, gpus="$GPUS", nodes=1)
    )
    out = report(script(tmp_path, body))
    assert (
        'trainer.n_gpus_per_node = $GPUS: GPUS is set inside a case on "$DEVICE" (it is a command\'s '
        "output, known only when the script runs): gpu) 8; npu) 16"
    ) in out


def test_hybrid_engine_false_is_not_read_by_the_v1_trainer(tmp_path):
    body = COMMAND.format(tp=2, gpus=8, nodes=1).replace(
        "trainer.nnodes=1", "trainer.nnodes=1 actor_rollout_ref.hybrid_engine=False"
    )
    out = report(script(tmp_path, body))
    assert "hybrid_engine = false is not read by the v1 trainer" in out and "placement colocated" in out
    code, _, err = run(
        script(tmp_path, body.replace("trainer.nnodes=1", "trainer.nnodes=1 trainer.use_v1=false"))
    )
    assert code == 2 and "legacy trainer, which requires hybrid_engine=true" in err
