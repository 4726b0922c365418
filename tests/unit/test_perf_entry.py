"""The `railover-perf` console command passes the installed plugin unless told otherwise."""
from __future__ import annotations

from railover import _paths


def test_perf_argv_adds_the_installed_plugin():
    exe, so = str(_paths.perf_path()), str(_paths.plugin_path())
    assert _paths.perf_argv(["--rank", "0"]) == [exe, "--plugin", so, "--rank", "0"]
    assert _paths.perf_argv(["--plugin", "/x.so", "--rank", "0"]) == [exe, "--plugin", "/x.so", "--rank", "0"]
    assert _paths.perf_argv(["--plugin=/x.so"]) == [exe, "--plugin=/x.so"]
    assert _paths.perf_argv(["--help"]) == [exe, "--help"]
