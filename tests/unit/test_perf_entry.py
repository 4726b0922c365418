"""The `railover-perf` console command passes the installed plugin unless told otherwise."""
from __future__ import annotations

from railover import _paths


def test_perf_argv_adds_the_installed_plugin():
    exe, so = str(_paths.perf_path()), str(_paths.plugin_path())
    assert _paths.perf_argv(["--rank", "0"]) == [exe, "--plugin", so, "--rank", "0"]
    assert _paths.perf_argv(["--plugin", "/x.so", "--rank", "0"]) == [exe, "--plugin", "/x.so", "--rank", "0"]
    assert _paths.perf_argv(["--plugin=/x.so"]) == [exe, "--plugin=/x.so"]
    assert _paths.perf_argv(["--help"]) == [exe, "--help"]


def test_seconds_beyond_what_the_driver_can_hold_are_a_usage_error(tmp_path):
    """A huge --duration used to end in std::length_error / std::bad_alloc (exit 134) after the
    rendezvous: its 1 ms buckets were allocated for the whole run. Now a usage error (exit 2)
    naming the option and the limit, before anything starts."""
    import subprocess
    base = _paths.perf_argv(["--rank", "0", "--nranks", "1", "--rendezvous", str(tmp_path / "rv")])
    for extra, msg in ((["--duration", "1e18"], "bad seconds for --duration: 1e18 (expected 0 to 604800: 7 days)"),
                       (["--op-timeout", "1e30"], "bad seconds for --op-timeout"),
                       (["--duration", "90000", "--timeseries", str(tmp_path / "ts.csv")],
                        "which must then be at most 86400 s (24 h); got 90000 s")):
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.returncode, r.stderr)
        assert not (tmp_path / "rv").exists() or not any((tmp_path / "rv").iterdir()), "it started a run"
