"""snippets.site.wheel_diff on two made-up wheels, and the home page's pasted sentence."""

from __future__ import annotations

import datetime
import subprocess
import sys
import zipfile
from pathlib import Path

from snippets.site import sources, wheel_diff

ROOT = Path(__file__).resolve().parents[2]
P = "megatron/core/x.py"
A = "import os\n\n\ndef f(a):\n    y = a + 1\n    return y\n"
B_MOVED = "import os\nimport sys\n\n\ndef f(a):\n    y = a + 1\n    return y\n"  # one line on top
B_CHANGED = "import os\n\n\ndef f(a):\n    y = a + 2\n    return y\n"


def _wheel(path: Path, version: str, text: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            f"megatron_core-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nVersion: {version}\n"
        )
        z.writestr(P, text)
        z.writestr("megatron/core/other.py", f"# {version}\n")  # differs, cited by nobody
    return path


def _site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "docs").mkdir(parents=True)
    url = sources.pinned_url(P, 4)
    (root / "docs" / "page.md").write_text(
        f"[`x.py::f`]({url}) [`x.py:5-6`]({sources.pinned_url(P, 5)}-L6) [`pretrain_gpt.py:3`]"
        f"({sources.pinned_url('pretrain_gpt.py', 3)})\n"
    )
    return root


def test_same_lines_moved_lines_and_changed_lines(tmp_path):
    cited = wheel_diff.cited_lines(_site(tmp_path))
    assert cited == {P: {4, 5, 6}, "pretrain_gpt.py": {3}}
    a = _wheel(tmp_path / "a.whl", "0.19.0", A)
    day = datetime.date(2026, 12, 4)
    same = wheel_diff.compare(a, _wheel(tmp_path / "same.whl", "0.19.1", A), cited)
    assert (same.lines, same.outside, same.differ, same.all_changed) == (3, 1, [], 1)
    text = wheel_diff.sentence(same, day)
    assert wheel_diff.SENTENCE_RE.search(text) and "逐字相同、行号不变" in text
    moved = wheel_diff.compare(a, _wheel(tmp_path / "moved.whl", "0.19.2", B_MOVED), cited)
    assert [(n, at) for _, n, _, _, at in moved.differ] == [(4, 5), (5, 6), (6, 7)]
    m = wheel_diff.SENTENCE_RE.search(wheel_diff.sentence(moved, day))
    assert m and (m["a"], m["b"], m["moved"], m["changed"]) == ("0.19.0", "0.19.2", "3", "0")
    changed = wheel_diff.compare(a, _wheel(tmp_path / "changed.whl", "0.19.3", B_CHANGED), cited)
    assert [(n, at) for _, n, _, _, at in changed.differ] == [(5, None)]
    m = wheel_diff.SENTENCE_RE.search(wheel_diff.sentence(changed, day))
    assert m and (m["moved"], m["changed"]) == ("0", "1")


def test_the_command_prints_the_sentence(tmp_path):
    root = _site(tmp_path)
    a, b = _wheel(tmp_path / "a.whl", "0.19.0", A), _wheel(tmp_path / "b.whl", "0.19.2", B_MOVED)
    run = [sys.executable, "-m", "snippets.site.wheel_diff", str(a), str(b), "--root", str(root)]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert wheel_diff.SENTENCE_RE.search(out.splitlines()[-1])
    bad = subprocess.run([*run[:3], str(root), str(b)], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a wheel" in bad.stderr


def test_the_home_page_says_whether_a_cited_line_differs_in_the_newest_patch_release():
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    m = wheel_diff.SENTENCE_RE.search(text)
    assert m, "docs/index.md lacks the sentence of python -m snippets.site.wheel_diff (section 版本)"
    assert m["a"] == sources.TAG.removeprefix("core_v"), "the sentence compares another release than the pin"
    assert int(m["lines"]) >= 500 and int(m["files"]) >= 50
