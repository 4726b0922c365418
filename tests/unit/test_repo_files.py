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
