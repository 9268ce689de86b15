"""``weight-sync`` against real checkouts (``--verl-src`` / ``--nemo-rl-src``, see conftest.py):

* every verl GRPO / PPO example script (``examples/grpo_trainer/*.sh``, ``examples/ppo_trainer/*.sh``)
  and every top-level NeMo RL GRPO config (``examples/configs/*grpo*.yaml``) gets a report;
* the verl defaults the command keeps as data equal verl's generated configs, and every cited line of
  verl or NeMo RL names what the command says it names.

The facts were read at :data:`facts.VERL_COMMIT` and :data:`facts.NEMO_RL_COMMIT`; a newer checkout
may fail the second kind, which says the data needs a look."""

from pathlib import Path

import yaml

from snippets.rl.weight_sync import cli, facts
from snippets.rl.weight_sync.values import raw


def _reports(paths):
    """(path, first problem) for each input without a full report; the count of inputs."""
    bad = []
    for path in paths:
        try:
            text = "\n".join(cli.build(str(path), None, None, ""))
        except Exception as err:  # every failure is a finding here
            bad.append((path.name, f"{type(err).__name__}: {err}"))
            continue
        missing = [w for w in ("trainer ", "rollout ", "placement ", "moves ") if f"\n{w}" not in text]
        if missing:
            bad.append((path.name, f"no {missing} line"))
    return bad


def test_every_verl_grpo_and_ppo_example_script_gets_a_report(verl_src):
    scripts = sorted((verl_src / "examples").glob("grpo_trainer/*.sh")) + sorted(
        (verl_src / "examples").glob("ppo_trainer/*.sh")
    )
    assert scripts, f"no examples/grpo_trainer/*.sh or examples/ppo_trainer/*.sh under {verl_src}"
    bad = _reports(scripts)
    print(f"verl: {len(scripts) - len(bad)} of {len(scripts)} example scripts reported")
    assert not bad, bad


def test_every_top_level_nemo_rl_grpo_config_gets_a_report(nemo_rl_src):
    configs = sorted((nemo_rl_src / "examples" / "configs").glob("*grpo*.yaml"))
    assert configs, f"no examples/configs/*grpo*.yaml under {nemo_rl_src}"
    bad = _reports(configs)
    print(f"NeMo RL: {len(configs) - len(bad)} of {len(configs)} GRPO configs reported")
    assert not bad, bad


def test_verl_defaults_are_verls(verl_src):
    for name, generated in facts.VERL_GENERATED.items():
        tree = yaml.safe_load((verl_src / generated).read_text())
        for key, value in facts.VERL_DEFAULTS[name].items():
            assert raw(tree, key) == value, f"{generated}: {key} is {raw(tree, key)!r}, we keep {value!r}"
    for name, defaults in facts.VERL_DEFAULTS.items():
        if name in facts.VERL_GENERATED:
            continue
        folder = EXPERIMENTAL[name.split("_ppo")[0]]
        config = yaml.safe_load(
            (verl_src / "verl" / "experimental" / folder / "config" / f"{name}.yaml").read_text()
        )
        base = "ppo_megatron_trainer" if "megatron" in name else "ppo_trainer"
        assert config["defaults"][0] == base, (name, config["defaults"])
        for key, value in defaults.items():
            if key not in facts.VERL_DEFAULTS[base]:
                assert raw(config, key) == value, (
                    f"{name}.yaml: {key} is {raw(config, key)!r}, we keep {value!r}"
                )


EXPERIMENTAL = {
    "fully_async": "fully_async_policy",
    "one_step_off": "one_step_off_policy",
    "transfer_queue": "transfer_queue",
}


def _line(src: Path, where: str) -> str:
    path, line = where.rsplit(":", 1)
    return (src / path).read_text().splitlines()[int(line) - 1]


def test_cited_verl_lines(verl_src):
    for module, (config_name, where, _) in facts.VERL_MAINS.items():
        text = _line(verl_src, where)
        assert "@hydra.main" in text and f'config_name="{config_name}"' in text, (module, text)
        assert (verl_src / (module.replace(".", "/") + ".py")) == verl_src / where.split(":")[0]
    for package, (fsdp_file, megatron_file, (where, symbol)) in facts.VERL_SEPARATE_WORKERS.items():
        assert f"def {symbol}" in _line(verl_src, where), (package, where)
        for name in (fsdp_file, megatron_file):
            assert (verl_src / "verl" / "experimental" / package / name).is_file()


def test_cited_nemo_rl_lines(nemo_rl_src):
    for name, (where, symbol) in facts.NEMO_RL_CODE.items():
        assert symbol in _line(nemo_rl_src, where), (name, where, symbol)
