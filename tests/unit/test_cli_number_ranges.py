"""Numeric options have ranges: a count, size, port or duration out of its range (negative,
zero where it makes no sense, nan, inf) is a usage error naming the option, exit 2, before
anything is built or run. A negative sentinel (--outage-s, --bare-retry-cnt) is no longer
taken silently as "the default"."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from railover import demo
from railover.bench import cli as bench_cli
from railover.bench import failover, soak
from railover.cli import app
from railover.ops import drill as dl
from railover.testbed import netns
from railover.testbed.rdma import bed as rdma_bed
from railover.testbed.rdma import cli as rdma_cli

from cli_text import text


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch, tmp_path):
    """Building a bed, running a suite or a demo, or touching a link fails the test; output
    directories land in tmp_path."""
    def ran(*a, **k):
        raise AssertionError("something was built or run")
    for mod, name in [(netns, "TestBed"), (soak, "TestBed"), (demo, "TestBed"), (rdma_cli, "up"),
                      (rdma_bed, "RdmaBed"), (demo, "run_demo"), (failover, "run_peers"), (bench_cli, "_run_suite"),
                      (dl, "run_drill"), (dl, "set_link")]:
        monkeypatch.setattr(mod, name, ran)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("argv,opt", [
    (["testbed", "up", "--hosts", "-1"], "--hosts"),
    (["testbed", "up", "--hosts", "0"], "--hosts"),
    (["testbed", "up", "--nics", "0"], "--nics"),
    (["testbed", "up", "--base", "-3"], "--base"),
    (["testbed", "up", "--base", "256"], "--base"),
    (["testbed", "up", "--rdma", "--rails", "0"], "--rails"),
    (["testbed", "up", "--rdma", "--rails", "-2"], "--rails"),
    (["soak", "--duration", "60", "--hang-bound", "0"], "--hang-bound"),
    (["soak", "--duration", "60", "--hang-bound", "-1"], "--hang-bound"),
    (["soak", "--duration", "60", "--hang-bound", "nan"], "--hang-bound"),  # used to start a soak
    (["soak", "--duration", "60", "--hang-bound", "inf"], "--hang-bound"),  # no hang would ever count
    (["status", "--interval", "0"], "--interval"),
    (["status", "--watch", "--interval", "nan"], "--interval"),             # used to be a ValueError traceback
    (["status", "--watch", "--interval", "1e300"], "--interval"),           # an OverflowError traceback (time.sleep)
    (["status", "--watch", "--interval", "1e-9"], "--interval"),            # redrew the screen in a busy loop
    (["drill", "--nic", "eth0", "--down-for", "inf"], "--down-for"),        # the NIC down for ever
    (["drill", "--nic", "eth0", "--down-for", "1", "--wait-failback", "inf"], "--wait-failback"),
    (["demo", "--duration", "-1"], "--duration"),
    (["demo", "--duration", "nan"], "--duration"),
    (["demo", "--fault-for", "inf"], "--fault-for"),
    (["bench", "failover", "--peer", "mptcp", "--outage-s", "-5"], "--outage-s"),  # used to mean "the default"
    (["bench", "failover", "--peer", "mptcp", "--outage-s", "0"], "--outage-s"),
    (["bench", "rdma", "--bare-retry-cnt", "-3"], "--bare-retry-cnt"),              # used to mean "the default"
    (["bench", "rdma", "--bare-retry-cnt", "8"], "--bare-retry-cnt"),               # NCCL_IB_RETRY_CNT is 0..7
    (["bench", "scale", "--idle-seconds", "inf"], "--idle-seconds"),
    (["bench", "rdma", "--bare-bound-s", "inf"], "--bare-bound-s"),
])
def test_out_of_range_numbers_are_usage_errors_naming_the_option(argv, opt):
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert f"Invalid value for '{opt}'" in text(r), text(r)
    assert "Traceback" not in r.output


def test_outage_is_passed_when_given_and_the_default_otherwise(monkeypatch):
    got = []

    def peers(out, **kw):
        got.append(kw["outage_s"])
        raise failover.C.BenchError("stop here")
    monkeypatch.setattr(failover, "run_peers", peers)
    for argv in (["--outage-s", "0.5"], []):
        r = CliRunner().invoke(app, ["bench", "failover", "--peer", "mptcp"] + argv)
        assert r.exit_code == 2 and "stop here" in text(r), r.output
    assert got == [0.5, None], got  # None: the suite's default (60 s, 5 with --quick)
