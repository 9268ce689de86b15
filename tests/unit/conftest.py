"""Options for the unit tests that can compare with a checkout of an RL framework.

``--verl-src PATH`` (or ``VERL_SRC``): a checkout of verl-project/verl; ``--nemo-rl-src PATH`` (or
``NEMO_RL_SRC``): a checkout of NVIDIA-NeMo/RL; ``--openmanus-src PATH`` (or ``OPENMANUS_SRC``): a
checkout of OpenManus/OpenManus-RL. Without them the tests that need them skip, as the
``--megatron-src`` ones do. Pass them when this folder (or a file in it) is on the command line:
``pytest tests/unit/test_weight_sync_sources.py --verl-src ~/verl --nemo-rl-src ~/RL``.
"""

import os
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--verl-src",
        dest="verl_src",
        default=None,
        help="a checkout of verl-project/verl: run weight-sync on its GRPO/PPO example scripts "
        "and check the verl defaults it keeps",
    )
    parser.addoption(
        "--openmanus-src",
        dest="openmanus_src",
        default=None,
        help="a checkout of OpenManus/OpenManus-RL: weight-sync reports the broken line continuation "
        "of its scripts/ppo_train/train_alfworld.sh",
    )
    parser.addoption(
        "--nemo-rl-src",
        dest="nemo_rl_src",
        default=None,
        help="a checkout of NVIDIA-NeMo/RL: run weight-sync on its top-level GRPO configs "
        "and check the code lines it cites",
    )


def _checkout(request, option: str, env: str, what: str) -> Path:
    value = request.config.getoption(option, default=None) or os.environ.get(env)
    if not value:
        pytest.skip(f"pass --{option.replace('_', '-')} PATH (a checkout of {what}) or set {env}")
    path = Path(value).expanduser()
    if not path.is_dir():
        pytest.fail(f"--{option.replace('_', '-')} {value}: not a directory", pytrace=False)
    return path


@pytest.fixture(scope="session")
def verl_src(request) -> Path:
    return _checkout(request, "verl_src", "VERL_SRC", "verl-project/verl")


@pytest.fixture(scope="session")
def nemo_rl_src(request) -> Path:
    return _checkout(request, "nemo_rl_src", "NEMO_RL_SRC", "NVIDIA-NeMo/RL")


@pytest.fixture(scope="session")
def openmanus_src(request) -> Path:
    return _checkout(request, "openmanus_src", "OPENMANUS_SRC", "OpenManus/OpenManus-RL")
