"""Repository hygiene a fresh user meets first: what git ignores, what the README tells them
to run, and the install script the README and CI share."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.mark.parametrize("path", ["railover-demo/demo-report.json", "railover-demo/run/events-rank0.jsonl"])
def test_demo_output_directory_is_ignored_by_git(path):
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    # `railover demo` run from the repository root writes ./railover-demo/
    r = _git("check-ignore", "--no-index", "-q", path)
    assert r.returncode == 0, f"{path} is not ignored by .gitignore"


def test_docs_state_the_same_newest_nccl_as_doctor():
    from railover.ops.doctor import NEWEST_KNOWN_NCCL
    newest = ".".join(map(str, NEWEST_KNOWN_NCCL))
    readme = (ROOT / "README.md").read_text()
    ops = (ROOT / "docs" / "OPERATIONS.md").read_text()
    assert f"every NCCL from 2.19 to {newest}" in " ".join(readme.split())
    assert f"works on 2.19 to {newest}" in readme
    assert f"works 2.19 to {newest}" in " ".join(ops.split())
    for old in ("2.19 to 2.30", "2.19 to 2.31"):
        assert old not in readme and old not in ops
