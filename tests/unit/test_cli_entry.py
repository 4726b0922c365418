"""The ``railover`` console script's entry point (``railover._entry:main``): a Ctrl-C while
Python loads the command line ends with exit status 130 and one line, not a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs the entry point with an import hook that raises KeyboardInterrupt when Typer is
# imported: what a Ctrl-C in the first few hundred ms of `railover ...` does.
_INTERRUPTED_IMPORT = r"""
import sys
class _CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, _CtrlC())
sys.argv = ["railover", "--version"]
from railover._entry import main
main()
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_ctrl_c_while_loading_the_cli_exits_130_without_a_traceback():
    r = _run(_INTERRUPTED_IMPORT)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "railover: interrupted while starting" in r.stderr


def test_the_entry_point_runs_the_cli():
    r = _run("import sys; sys.argv = ['railover', '--version']\nfrom railover._entry import main\nmain()")
    assert r.returncode == 0, r.stderr
    from railover import __version__
    assert r.stdout.strip() == __version__


def test_the_console_script_is_the_guarded_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'railover = "railover._entry:main"' in text


def test_python_dash_m_railover_runs_the_cli():
    """`python3 -m railover ...` said "No module named railover.__main__; 'railover' is a
    package and cannot be directly executed": the way to run the tools when pip put the
    console script in a directory not on PATH."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-m", "railover", "--version"], env=env, capture_output=True, text=True,
                       timeout=60)
    from railover import __version__
    assert r.returncode == 0 and r.stdout.strip() == __version__, (r.returncode, r.stderr)
    r = subprocess.run([sys.executable, "-m", "railover", "no-such-command"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "No such command 'no-such-command'" in r.stderr and "Traceback" not in r.stderr, \
        r.stderr
