"""Repository hygiene a fresh user meets first: what git ignores, what the README tells them
to run, and the install script the README and CI share."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


# --------------------------------------------------------------------------- install path

README_INSTALL = "./scripts/install.sh && railover demo"
README_TEST = "./scripts/install.sh --test && python3 -m pytest -q -ra tests"


def _readme_first_commands():
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("    ")]
    return [ln.split("#", 1)[0].strip() for ln in lines[:2]]


def test_readme_first_two_commands_use_the_install_script():
    assert _readme_first_commands() == [README_INSTALL, README_TEST]


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if not ln.strip().startswith(("#", "echo "))]
    assert "./scripts/install.sh --test" in ci
    readme_cmd = "python3 -m pytest -q -ra tests"
    # the README's command as is, at most under a time bound (`timeout ... <command>`)
    runs = [i for i, ln in enumerate(ci) if ln.endswith(readme_cmd)
            and re.fullmatch(r"(timeout( -[sk] \w+)* \d+ )?", ln[:-len(readme_cmd)])]
    assert len(runs) == 1, [ln for ln in ci if "pytest" in ln]
    assert not any(ln.startswith("apt-get install") or "pip install" in ln for ln in ci), \
        "CI must install through scripts/install.sh, the README's path"
    assert ci.index("./scripts/install.sh --test") < runs[0]


def test_the_package_list_lives_only_in_prereqs():
    from railover import prereqs
    script = (ROOT / "scripts" / "install.sh").read_text()
    code = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    assert "prereqs.py\" --packages" in code
    for pkg in prereqs.packages(list(prereqs.PACKAGES)):
        if pkg == "python3":   # bootstrap: the list is read with python3
            continue
        assert not re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", code), f"install.sh names {pkg} itself"


def test_prereqs_lists_packages_with_the_standard_library_only():
    # -I: no PYTHONPATH, no site-packages of the user; the script runs before railover is installed
    r = subprocess.run([sys.executable, "-I", str(ROOT / "src" / "railover" / "prereqs.py"), "--packages", "run", "build",
                        "test"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pk = r.stdout.split()
    assert {"iproute2", "nftables", "iperf3", "build-essential", "cmake", "libgtest-dev"} <= set(pk)
    r = subprocess.run([sys.executable, "-I", str(ROOT / "src" / "railover" / "prereqs.py"), "--packages", "gpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown package group 'gpu'" in r.stderr


def test_install_script_help_and_bad_option():
    sh = str(ROOT / "scripts" / "install.sh")
    r = subprocess.run(["bash", sh, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--break-system-packages" in r.stdout and "set -euo" not in r.stdout
    r = subprocess.run(["bash", sh, "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr
