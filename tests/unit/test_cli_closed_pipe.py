"""`railover env --list | head -1` used to exit 1 when head closed the pipe (rich's and click's
EPIPE handling): a closed stdout is exit 0 without a word, as for Unix tools, in every command
(main() handles it once); other exit statuses are kept."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import railover as _railover_pkg

SRC = str(Path(_railover_pkg.__file__).resolve().parent.parent)


def _run_into_closed_pipe(*argv):
    r, w = os.pipe()
    os.close(r)   # the reader is gone before the first write: every write is EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "railover.cli", *argv], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=dict(os.environ, PYTHONPATH=SRC, COLUMNS="120"))
    finally:
        os.close(w)


@pytest.mark.parametrize("argv", [["env", "--list"], ["env", "--events"], ["env", "--list", "--json"],
                                  ["env"], ["--help"]])
def test_a_closed_stdout_is_exit_0_quietly(argv):
    cp = _run_into_closed_pipe(*argv)
    assert cp.returncode == 0 and cp.stderr == "", (cp.returncode, cp.stderr)


def test_other_exit_statuses_are_kept_with_a_closed_stdout():
    cp = _run_into_closed_pipe("env", "--json")
    assert cp.returncode == 2 and "--list or --events" in cp.stderr, (cp.returncode, cp.stderr)
