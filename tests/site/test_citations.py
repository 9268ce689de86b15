"""Every pinned link names a symbol that really sits at that line of the pinned tag (sources.TAG)."""

import os
import re
from pathlib import Path

import pytest

from snippets.site import sources

ROOT = Path(__file__).resolve().parents[2]
CITING = sources.citing_files(ROOT)
LINKS = sources.cited_links(ROOT)


def megatron_src(config):
    value = config.getoption("megatron_src", default=None) or os.environ.get("MEGATRON_SRC")
    return Path(value) if value else None


def test_the_site_cites_code():
    assert len(LINKS) >= 20


OLDER_BOX = re.compile(r"^(?:# )?> \*\*旧版（core_v0\.1[678]\.\d+）")
"""An older-release box in a note: a blockquote whose first line starts ``> **旧版（core_v0.18.0）**``;
its links may name that older tag (every line of the blockquote)."""


def older_box_lines(text: str) -> set[int]:
    """Indexes of the lines that belong to an older-release box (the blockquote it opens)."""
    lines, inside, found = text.splitlines(), False, set()
    for i, line in enumerate(lines):
        body = line[2:] if line.startswith("# ") else line
        if OLDER_BOX.match(line):
            inside = True
        elif not body.startswith(">"):
            inside = False
        if inside:
            found.add(i)
    return found


def test_no_link_to_another_ref():
    # Links to Megatron-LM use the pinned tag, never main or a moving branch (the pitfall page's
    # links to a main commit are generated, not written in these files); an older-release box may
    # link the older tag it talks about.
    bad = []
    url_re = re.compile(r"https://github\.com/NVIDIA/Megatron-LM/(?:blob|tree)/[^\s)\"']+")
    for path in CITING:
        text = path.read_text()
        boxed = older_box_lines(text)
        for i, line in enumerate(text.splitlines()):
            for url in url_re.findall(line):
                tag = url.split("/")[6]
                if tag != sources.TAG and not (i in boxed and re.fullmatch(r"core_v0\.1[678]\.\d+", tag)):
                    bad.append((path.name, url))
    assert not bad


def test_older_box_is_recognised():
    text = "# > **旧版（core_v0.18.0）**：x [a](u)\n# > y\n# z"
    assert older_box_lines(text) == {0, 1}
    assert older_box_lines("# > **注**：x") == set()


@pytest.mark.parametrize("where, text, path, line", LINKS, ids=[f"{w}:{t}" for w, t, _, _ in LINKS])
def test_link_points_at_its_symbol(where, text, path, line, request):
    problem = sources.check_link(
        text, path, line, src=megatron_src(request.config) if not path.startswith("megatron/core/") else None
    )
    assert problem is None, f"{where}: {problem}"


def test_pinned_data_file_against_a_checkout(request):
    src = megatron_src(request.config)
    if src is None:
        pytest.skip(
            "pass --megatron-src PATH (a checkout of core_v0.19.0) to check "
            f"{sources.PINNED_FILE.name} against the tag"
        )
    wrong = []
    for (path, symbol), line in sources.pinned_lines().items():
        text = sources.file_lines(path, src)[line - 1]
        if not sources.defines(text, symbol.split(".")[-1]):
            wrong.append(f"{path}:{line} {symbol}: {text.strip()!r}")
    assert not wrong


def test_check_link_catches_a_wrong_line():
    good = sources.find_line("megatron/core/parallel_state.py", "RankGenerator.get_ranks")
    assert (
        sources.check_link(
            "parallel_state.py::RankGenerator.get_ranks", "megatron/core/parallel_state.py", good
        )
        is None
    )
    problem = sources.check_link(
        "parallel_state.py::RankGenerator.get_ranks", "megatron/core/parallel_state.py", good + 1
    )
    assert problem and f"found at line {good}" in problem
    assert "names no symbol" in sources.check_link("parallel_state.py", "megatron/core/parallel_state.py", 10)


def test_link_helper_writes_checkable_links():
    text = sources.link("megatron/core/parallel_state.py", "initialize_model_parallel")
    match = sources.LINK_RE.search(text)
    assert sources.check_link(match["text"], match["path"], int(match["line"])) is None
