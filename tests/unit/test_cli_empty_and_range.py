"""Values the CLI used to accept and a test bed, the plugin or railover-perf refused (or
misread) only later: an empty comma list (`soak --kinds ""` crashed with IndexError, `bench
rdma --phases ""` ran every phase), sizes and --hold-down-ms beyond what railover-perf and the
plugin take, `bench scale --channels 5000`, and runs with no standby NIC (`bench degraded --nics
1`, `soak --layout 1x1`). Each is a usage error naming the option, exit 2, before anything is
built or booted."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from railover import demo, demo_rdma
from railover.bench import degraded, failback, failover, healthy, scale, soak
from railover.cli import app
from railover.testbed.rdma import bed as rdma_bed

from cli_text import text


@pytest.fixture(autouse=True)
def no_bed(monkeypatch):
    def bed(*a, **k):
        raise AssertionError("a test bed was built")
    for mod in (degraded, failback, failover, healthy, scale, soak, demo):
        monkeypatch.setattr(mod, "TestBed", bed)
    monkeypatch.setattr(rdma_bed, "RdmaBed", bed)
    monkeypatch.setattr(demo_rdma, "run_rdma_demo", bed)


@pytest.mark.parametrize("argv,opt,msg", [
    (["soak", "--duration", "60", "--kinds", ""], "--kinds", "empty list"),
    (["soak", "--duration", "60", "--kinds", ",,"], "--kinds", "empty list"),
    (["soak", "--duration", "60", "--kinds", " , "], "--kinds", "empty list"),
    (["soak", "--duration", "60", "--kinds", "nope"], "--kinds", "unknown fault kind(s) nope"),
    (["bench", "rdma", "--phases", ""], "--phases", "empty list"),
    (["bench", "rdma", "--phases", ","], "--phases", "empty list"),
    (["bench", "rdma", "--kinds", ""], "--kinds", "empty list"),
    (["bench", "rdma", "--bw-variants", ""], "--bw-variants", "empty list"),
    (["bench", "healthy", "--networks", ""], "--networks", "empty list"),
    (["bench", "healthy", "--workloads", ","], "--workloads", "empty list"),
    (["bench", "healthy", "--ranks", ""], "--ranks", "empty list"),
    (["bench", "healthy", "--nstreams", ","], "--nstreams", "empty list"),
    (["bench", "healthy", "--nstreams", "1,99"], "--nstreams", "99 is not in the range 1..16 of RAILOVER_NSTREAMS"),
    (["bench", "healthy", "--workloads", "x"], None, "--workloads: unknown workload(s) 'x'; known: sendrecv, allreduce"),
    (["bench", "failover", "--kinds", ""], "--kinds", "empty list"),
    (["bench", "failover", "--peer", "mptcp", "--kinds", ","], "--kinds", "empty list"),
    (["bench", "failover", "--transport", "rdma", "--kinds", ""], "--kinds", ""),
    (["bench", "failback", "--kinds", ""], "--kinds", "empty list"),
    (["bench", "degraded", "--nics", ""], "--nics", "empty list"),
    (["bench", "scale", "--channels", ""], "--channels", "empty list"),
    (["bench", "all", "--suites", ""], "--suites", "empty list"),
    (["bench", "all", "--suites", "healthy,nope"], "--suites", "unknown suite 'nope'"),
    # beyond what railover-perf or the plugin take
    (["demo", "--size", "1T"], "--size", "at most 1G"),
    (["demo", "--transport", "rdma", "--size", "2G"], "--size", "at most 1G"),
    (["bench", "failover", "--size", "1T"], "--size", "at most 1G"),
    (["bench", "rdma", "--size", "1T"], "--size", "at most 1G"),
    (["bench", "rdma", "--bw-sizes", "1M,4G"], "--bw-sizes", "at most 1G"),
    (["soak", "--duration", "60", "--size", "1T"], "--size", "at most 1G"),
    (["soak", "--duration", "25h"], "--duration", "at most 24 h, got 90000 s"),
    (["demo", "--duration", "90000"], "--duration", "at most 86400 s (24 h"),
    (["soak", "--duration", "99999999999999h"], "--duration", "at most 24 h"),
    (["demo", "--hold-down-ms", "99999999999"], "--hold-down-ms", "0..3600000 of RAILOVER_HOLD_DOWN_MS"),
    (["demo", "--hold-down-ms", "3600001"], "--hold-down-ms", "0..3600000 of RAILOVER_HOLD_DOWN_MS"),
    (["bench", "failback", "--hold-down-ms", "99999999999"], "--hold-down-ms", "0..3600000"),
    (["bench", "scale", "--channels", "5000"], "--channels", "integers 1..1024"),
    (["bench", "scale", "--channels", "1,1025"], "--channels", "integers 1..1024"),
    # no standby NIC: nothing can fail over
    (["bench", "degraded", "--nics", "1"], "--nics", "no standby NIC"),
    (["bench", "degraded", "--nics", "1,2"], "--nics", "no standby NIC"),
    (["soak", "--duration", "60", "--layout", "1x1"], "--layout", "no standby NIC"),
    (["soak", "--duration", "60", "--layout", "4x1-flat"], "--layout", "no standby NIC"),
])
def test_refused_up_front_naming_the_option(tmp_path, argv, opt, msg):
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "out")], env={"COLUMNS": "250"})
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "Traceback" not in r.output
    assert opt is None or re.search(rf"Invalid value for '?{opt}'?:", text(r)), text(r)
    assert msg in text(r), text(r)


def test_the_hold_down_limit_is_the_plugins():
    """The range comes from the plugin's parameter table, not a copy of it."""
    from railover import params
    p = next(x for x in params.params() if x["name"] == "RAILOVER_HOLD_DOWN_MS")
    from railover._cliutil import plugin_range
    check = plugin_range("RAILOVER_HOLD_DOWN_MS")
    assert check(p["hi"]) == p["hi"] and check(p["lo"]) == p["lo"]
    import typer
    with pytest.raises(typer.BadParameter):
        check(p["hi"] + 1)


def test_sizes_up_to_the_limit_pass():
    from railover.sizes import MAX_SIZE, check_size
    assert check_size("1G") == MAX_SIZE == 1 << 30
    assert check_size("1024M") == MAX_SIZE


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only tmpfs (root only: mount)."""
    import os
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    d = tmp_path / "ro"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


@pytest.mark.parametrize("argv", [["bench", "healthy", "--quick"], ["bench", "failover", "--quick"],
                                  ["bench", "scale", "--quick"], ["soak", "--duration", "60"], ["demo"]])
def test_an_output_directory_that_cannot_be_written_is_refused_before_a_bed(read_only_dir, argv):
    """An existing directory on a read-only file system passed the old checks (mkdir with
    exist_ok) and ended in an OSError traceback once the suite wrote its work directory."""
    r = CliRunner().invoke(app, [*argv, "--out", str(read_only_dir)], env={"COLUMNS": "250"})
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "Traceback" not in r.output
    assert f"cannot write into {read_only_dir}: read-only file system" in text(r), text(r)


@pytest.mark.parametrize("argv", [["bench", "failover", "--quick"], ["bench", "healthy", "--quick"]])
def test_an_inherited_plugin_value_the_plugin_refuses_is_named_before_a_bed(tmp_path, monkeypatch, argv):
    """`RAILOVER_NSTREAMS=abc railover bench failover` built a bed and started ranks that all
    failed their init; the demo already refused it up front. Now the bench does too, naming the
    variable (the plugin's own parser's words)."""
    monkeypatch.setenv("RAILOVER_NSTREAMS", "abc")
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "out")], env={"COLUMNS": "250"})
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "Traceback" not in r.output
    assert "cannot run: the environment has a value the plugin refuses" in text(r) and "RAILOVER_NSTREAMS" in text(r)
