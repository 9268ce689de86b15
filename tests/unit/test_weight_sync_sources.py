"""``weight-sync`` against real checkouts (``--verl-src`` / ``--nemo-rl-src``, see conftest.py):

* every verl GRPO / PPO example script (``examples/grpo_trainer/*.sh``, ``examples/ppo_trainer/*.sh``)
  gets a report or a one-line refusal; refusals are at most one in ten and never for a script whose
  name says Megatron and that runs a trainer; every top-level NeMo RL GRPO config
  (``examples/configs/*grpo*.yaml``) gets a report;
* the verl defaults the command keeps as data equal verl's generated configs, and every cited line of
  verl or NeMo RL names what the command says it names.

The facts were read at :data:`facts.VERL_COMMIT` (verl-project/verl 1dda039, 2026-08-22) and
:data:`facts.NEMO_RL_COMMIT` (NVIDIA-NeMo/RL 7ea279a, 2026-08-22); a newer checkout may fail the
second kind, which says the data needs a look."""

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from snippets.rl.weight_sync import cli, facts
from snippets.rl.weight_sync.values import raw


def _run(path):
    """(exit status, stdout, stderr) of the command on ``path``, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(path)])
    return code, out.getvalue(), err.getvalue()


def _reports(paths):
    """(path, problem) for each input without a full report; refusals (exit 2, one line) apart."""
    bad, refused = [], []
    for path in paths:
        code, out, err = _run(path)
        if code == 2 and len(err.splitlines()) == 1 and out == "":
            refused.append((path.name, err.strip()))
            continue
        text = "\n" + " ".join(out.split()).replace(" trainer ", "\ntrainer ").replace(
            " rollout ", "\nrollout "
        )
        text = text.replace(" placement ", "\nplacement ").replace(" moves ", "\nmoves ")
        missing = [w for w in ("trainer ", "rollout ", "placement ", "moves ") if f"\n{w}" not in text]
        if code != 0 or missing:
            bad.append((path.name, code, missing, err[:300]))
    return bad, refused


def test_every_verl_grpo_and_ppo_example_script_gets_a_report(verl_src):
    scripts = sorted((verl_src / "examples").glob("grpo_trainer/*.sh")) + sorted(
        (verl_src / "examples").glob("ppo_trainer/*.sh")
    )
    assert scripts, f"no examples/grpo_trainer/*.sh or examples/ppo_trainer/*.sh under {verl_src}"
    bad, refused = _reports(scripts)
    print(f"verl: {len(scripts) - len(bad) - len(refused)} of {len(scripts)} reported, refused {refused}")
    assert not bad, bad
    assert len(refused) * 10 <= len(scripts), refused
    # a Megatron script is never refused unless it runs no trainer at all
    assert all("megatron" not in name or "runs no verl trainer" in why for name, why in refused), refused


def test_every_top_level_nemo_rl_grpo_config_gets_a_report(nemo_rl_src):
    configs = sorted((nemo_rl_src / "examples" / "configs").glob("*grpo*.yaml"))
    assert configs, f"no examples/configs/*grpo*.yaml under {nemo_rl_src}"
    bad, refused = _reports(configs)
    print(f"NeMo RL: {len(configs) - len(bad) - len(refused)} of {len(configs)} GRPO configs reported")
    assert not bad and not refused, (bad, refused)


def test_verl_defaults_are_verls(verl_src):
    for engine, generated in facts.VERL_GENERATED.items():
        tree = yaml.safe_load((verl_src / generated).read_text())
        for key, value in facts.VERL_ENGINE_DEFAULTS[engine].items():
            assert raw(tree, key) == value, f"{generated}: {key} is {raw(tree, key)!r}, we keep {value!r}"
    for name, path in facts.VERL_EXPERIMENTAL_CONFIGS.items():
        config = yaml.safe_load((verl_src / path).read_text())
        base, extra = facts.VERL_CONFIGS[name]
        assert config["defaults"][0] == ("ppo_megatron_trainer" if base == "megatron" else "ppo_trainer"), (
            name
        )
        for key, value in extra.items():
            assert raw(config, key) == value, f"{path}: {key} is {raw(config, key)!r}, we keep {value!r}"
    megatron = yaml.safe_load((verl_src / "verl/trainer/config/ppo_megatron_trainer.yaml").read_text())
    assert megatron["defaults"] == ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"]
    for engine in facts.VERL_GENERATED:
        group = yaml.safe_load((verl_src / f"verl/trainer/config/model_engine/{engine}.yaml").read_text())
        assert group == {"model_engine": engine}


def _line(src: Path, where: str) -> str:
    path, line = where.rsplit(":", 1)
    return (src / path).read_text().splitlines()[int(line) - 1]


def test_cited_verl_lines(verl_src):
    for module, (config_name, where, _) in facts.VERL_MAINS.items():
        text = _line(verl_src, where)
        assert "@hydra.main" in text and f'config_name="{config_name}"' in text, (module, text)
        assert (verl_src / (module.replace(".", "/") + ".py")) == verl_src / where.split(":")[0]
    for name, (where, text) in facts.VERL_CODE.items():
        assert text in _line(verl_src, where), (name, where, text)
    registry = "\n".join(p.read_text() for p in (verl_src / "verl" / "checkpoint_engine").glob("*.py"))
    for backend in facts.VERL_CHECKPOINT_ENGINES:
        assert f'CheckpointEngineRegistry.register("{backend}")' in registry, backend


def test_cited_nemo_rl_lines(nemo_rl_src):
    for name, (where, symbol) in facts.NEMO_RL_CODE.items():
        assert symbol in _line(nemo_rl_src, where), (name, where, symbol)
    guide = (nemo_rl_src / "docs" / "guides" / "refit.md").read_text()
    for transport in facts.NEMO_RL_TRANSPORTS:
        assert f"| `{'null' if transport is None else transport}` |" in guide, transport
    for transport in facts.NEMO_RL_DOCS_ONLY:
        assert f"`{transport}`" not in guide, transport


def test_openmanus_broken_continuation(openmanus_src):
    """OpenManus/OpenManus-RL c66d493 scripts/ppo_train/train_alfworld.sh: line 17 ends in ``\\ # TODO``."""
    code, out, _ = _run(openmanus_src / "scripts" / "ppo_train" / "train_alfworld.sh")
    text = " ".join(out.split())
    assert code == 0 and "2 override(s)" in text and "broken line 17 ends in a backslash" in text
    assert "line 18 (data.val_files=...), lines 19-71 (data.train_batch_size=...)" in text


def test_verl_version_pins(verl_src):
    assert "core_v0.18.0" in _line(verl_src, "pyproject.toml:399")
    assert '"megatron-bridge==0.5.2"' in _line(verl_src, "pyproject.toml:171")
    assert (verl_src / "verl" / "version" / "version").read_text().strip() == "0.10.0.dev"
