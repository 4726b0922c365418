"""The README's "Run railover-perf by hand" examples, run as written (bash), with `railover`
and `railover-perf` resolving to the package under test."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import railover
from railover.testbed import netns as tbmod

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(railover.__file__).resolve().parent.parent)


def _blocks():
    text = (ROOT / "README.md").read_text()
    sec = text.split("## Run railover-perf by hand", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.*?)```", sec, re.S)


@pytest.fixture
def bin_path(tmp_path) -> str:
    """A PATH whose railover and railover-perf are this package's console entry points."""
    d = tmp_path / "bin"
    d.mkdir()
    py = sys.executable
    (d / "railover").write_text(f'#!/bin/sh\nPYTHONPATH={SRC} exec {py} -m railover.cli "$@"\n')
    (d / "railover-perf").write_text(f'#!/bin/sh\nPYTHONPATH={SRC} exec {py} -c "import sys; '
                                     f'from railover._paths import perf_main; sys.argv[0] = \'railover-perf\'; '
                                     f'perf_main()" "$@"\n')
    for f in d.iterdir():
        f.chmod(0o755)
    return f"{d}{os.pathsep}{os.environ['PATH']}"


def _run(block: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=dict(os.environ, PATH=path),
                          capture_output=True, text=True, timeout=400)


def test_readme_has_the_two_examples():
    blocks = _blocks()
    assert len(blocks) == 2 and "RAILOVER_IFNAMES==lo" in blocks[0] and "testbed up --detach" in blocks[1]


def test_readme_perf_example_over_loopback(bin_path):
    r = _run(_blocks()[0], bin_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "# Wrong bytes          : 0 OK" in r.stdout and "8388608" in r.stdout, r.stdout[-3000:]


@pytest.mark.netns
def test_readme_perf_example_over_the_test_bed(netns_mode, bin_path):
    if netns_mode != "root":
        pytest.skip("the example runs 'ip netns exec', which needs root")
    r = _run(_blocks()[1], bin_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "# railover-perf: allreduce, 2 rank(s)" in r.stdout, r.stdout[:2000]
    assert "# Wrong bytes          : 0 OK" in r.stdout and "67108864" in r.stdout, r.stdout[-3000:]
    m = re.search(r"removed (ro[a-z0-9]{4})-nsA", r.stdout)
    assert m, "the example's last line removes its bed"
    assert m.group(1) not in {i.prefix for i in tbmod.list_testbeds()}
