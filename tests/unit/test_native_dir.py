"""RAILOVER_NATIVE_DIR, when set, is the one place the tools take the native files from: a
directory that does not exist, is not a directory or lacks the file is an error naming the
variable and the path (it used to fall back silently to another build), shown by the CLI as
one line with exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import railover as _railover_pkg
from railover import _paths

# Subprocesses import the same railover this test process imported.
SRC = str(Path(_railover_pkg.__file__).resolve().parent.parent)


def _unusable(tmp_path: Path, kind: str) -> tuple:
    """(value of RAILOVER_NATIVE_DIR, words the error must say) for each unusable kind."""
    if kind == "missing":
        return str(tmp_path / "no-such-build"), "no such directory"
    if kind == "file":
        f = tmp_path / "a-file"
        f.write_text("not a directory")
        return str(f), "not a directory"
    d = tmp_path / "empty-build"
    d.mkdir()
    return str(d), f"has no {_paths.PLUGIN_FILE}"


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_an_unusable_native_dir_is_an_error_not_a_fallback(monkeypatch, tmp_path, kind):
    _paths.plugin_path()   # a build or an installed plugin exists: the old code fell back to it
    value, words = _unusable(tmp_path, kind)
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", value)
    with pytest.raises(_paths.NativeDirError) as ei:
        _paths.plugin_path()
    msg = str(ei.value)
    assert f"RAILOVER_NATIVE_DIR={value}" in msg and words in msg, msg
    assert "unset RAILOVER_NATIVE_DIR" in msg
    assert isinstance(ei.value, FileNotFoundError)   # the callers that report a missing plugin report this too


def test_a_native_dir_with_the_plugin_but_no_perf_names_the_missing_file(monkeypatch, tmp_path):
    (tmp_path / _paths.PLUGIN_FILE).symlink_to(_paths.plugin_path())
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", str(tmp_path))
    assert _paths.plugin_path() == tmp_path / _paths.PLUGIN_FILE
    with pytest.raises(_paths.NativeDirError, match=f"RAILOVER_NATIVE_DIR={tmp_path} has no {_paths.PERF_FILE}"):
        _paths.perf_path()


def test_a_relative_native_dir_gives_absolute_paths(monkeypatch, tmp_path):
    """`RAILOVER_NATIVE_DIR=build` from the source tree: the paths (which `railover env` and
    `launch` put in LD_LIBRARY_PATH) hold in any working directory."""
    (tmp_path / "nd").mkdir()
    (tmp_path / "nd" / _paths.PLUGIN_FILE).symlink_to(_paths.plugin_path())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", "nd")
    assert _paths.plugin_path() == tmp_path / "nd" / _paths.PLUGIN_FILE


def test_an_empty_native_dir_is_unset(monkeypatch):
    want = _paths.plugin_path()
    monkeypatch.delenv("RAILOVER_NATIVE_DIR", raising=False)
    try:
        default = _paths.plugin_path()
    except FileNotFoundError:
        default = None
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", "")
    if default is None:  # a checkout with only another build tree (named by RAILOVER_NATIVE_DIR)
        with pytest.raises(FileNotFoundError) as e:
            _paths.plugin_path()
        assert not isinstance(e.value, _paths.NativeDirError), e.value  # not "RAILOVER_NATIVE_DIR=: ..."
        return
    found = _paths.plugin_path()
    assert found == default
    assert found.is_file() and (os.environ.get("RAILOVER_NATIVE_DIR") == "")
    assert found.name == want.name


def _cli(args, native_dir: str):
    env = dict(os.environ, PYTHONPATH=SRC, RAILOVER_NATIVE_DIR=native_dir, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "railover.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args", [["env"], ["launch", "--dry-run", "--", "true"], ["env", "--list"]])
def test_cli_shows_an_unusable_native_dir_as_one_line(tmp_path, args):
    value, words = _unusable(tmp_path, "missing")
    r = _cli(args, value)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"RAILOVER_NATIVE_DIR={value}" in lines[0] and words in lines[0], r.stderr


def test_a_command_that_does_not_catch_it_still_shows_one_line(tmp_path):
    """`bench` does not report a missing native file itself: the entry point does (this
    fails at the first native file lookup, before any test bed is built)."""
    value, words = _unusable(tmp_path, "missing")
    r = _cli(["bench", "healthy", "--quick", "-o", str(tmp_path / "out")], value)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert f"railover: error: RAILOVER_NATIVE_DIR={value}: {words}" in r.stderr, r.stderr


def test_a_perf_driver_that_is_not_executable_is_named_so_not_a_traceback(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    (d / _paths.PLUGIN_FILE).write_bytes(b"")
    (d / _paths.PERF_FILE).write_bytes(b"")
    (d / _paths.PERF_FILE).chmod(0o644)
    cp = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['railover-perf', '--help']; "
                         "from railover._paths import perf_main; perf_main()"], capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, PYTHONPATH=SRC, RAILOVER_NATIVE_DIR=str(d)))
    assert cp.returncode == 2, cp.stderr
    assert "Traceback" not in cp.stderr
    assert f"{d / _paths.PERF_FILE} is not executable" in cp.stderr and "not found" not in cp.stderr, cp.stderr
