"""Project-wide pytest options (this file sits at the root so every test run sees them)."""

# The site tests' fixture notebook is data, not a note: nbval must not execute it.
collect_ignore_glob = ["tests/fixtures/*"]


def pytest_addoption(parser):
    parser.addoption(
        "--megatron-src",
        dest="megatron_src",
        default=None,
        help="a checkout of NVIDIA/Megatron-LM at core_v0.16.1: also check the citations of files "
        "outside the pip package (megatron/training, pretrain_gpt.py, examples/)",
    )
