"""Project-wide pytest options (this file sits at the root so every test run sees them)."""

import pytest

# The site tests' fixture notebook is data, not a note: nbval must not execute it.
collect_ignore_glob = ["tests/fixtures/*"]


def pytest_addoption(parser):
    parser.addoption(
        "--megatron-src",
        dest="megatron_src",
        default=None,
        help="a checkout of NVIDIA/Megatron-LM at core_v0.19.0: also check the citations of files "
        "outside the pip package (megatron/training, pretrain_gpt.py, examples/)",
    )
    parser.addoption(
        "--real-size",
        action="store_true",
        default=False,
        help="also run the tests marked real_size (a Qwen3-8B-sized layer on CPU ranks: ~40 s)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_size: runs a real model's sizes on CPU (opt in with --real-size)"
    )


def pytest_collection_modifyitems(config, items):
    if not config.getoption("real_size"):
        skip = pytest.mark.skip(reason="real model sizes: run with --real-size")
        for item in items:
            if "real_size" in item.keywords:
                item.add_marker(skip)
