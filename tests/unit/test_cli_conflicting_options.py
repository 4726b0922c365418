"""Two given options that contradict each other are a usage error naming both, exit 2,
before anything is built or run; before, one of them was dropped without a word (env --shell
--list printed the list, env --json --markdown printed JSON, testbed down --prefix --all
ignored --all, status --interval without --watch, bench rdma options of a phase --phases
leaves out, bench failover --peer mptcp ran its own kinds instead of the --kinds given,
bench scale --quick ran 1,8,16 channels instead of --channels 512,1024)."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from railover.bench import cli as bench_cli
from railover.bench import failover
from railover.cli import app
from railover.testbed import netns
from railover.testbed.rdma import bed as rdma_bed

from cli_text import text


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch, tmp_path):
    """Running a suite or removing a bed fails the test; output directories land in tmp_path."""
    def ran(*a, **k):
        raise AssertionError("something was run")
    for mod, name in [(bench_cli, "_run_suite"), (failover, "run_peers"), (netns, "cleanup_leftovers"),
                      (rdma_bed, "cleanup_rdma_leftovers")]:
        monkeypatch.setattr(mod, name, ran)
    monkeypatch.setattr(netns, "privilege_mode", lambda: "root")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("argv,words", [
    (["env", "--shell", "--list"], ["--list cannot be combined with --shell"]),
    (["env", "--events", "--shell", "--json"], ["--events, --json cannot be combined with --shell"]),
    (["env", "--list", "--json", "--markdown"], ["--markdown cannot be combined with --json"]),
    (["testbed", "down", "--prefix", "roabcd", "--all"], ["--all cannot be combined with --prefix"]),
    (["status", "--interval", "2"], ["--interval applies with --watch only (add --watch)"]),
    (["bench", "rdma", "--phases", "busbw", "--faults", "3", "--kinds", "silent"],
     ["--faults, --kinds cannot be combined with --phases", "leaves out the convergence phase"]),
    (["bench", "rdma", "--phases", "convergence", "--bw-sizes", "1M", "--rounds", "2"],
     ["--bw-sizes, --rounds cannot be combined with --phases", "leaves out the busbw phase"]),
    (["bench", "rdma", "--phases", "convergence,busbw", "--bare-retry-cnt", "3"],
     ["--bare-retry-cnt cannot be combined with --phases", "leaves out the bare phase"]),
    (["bench", "rdma", "--phases", "busbw", "--size", "1M"], ["--size cannot be combined with --phases"]),
    (["bench", "rdma", "--bare-faults", "0", "--bare-bound-s", "30"],
     ["--bare-bound-s cannot be combined with --bare-faults", "--bare-faults 0 runs no bare RC fault"]),
    (["bench", "failover", "--peer", "mptcp", "--kinds", "host-down,silent"],
     ["--kinds host-down,silent cannot be combined with --peer mptcp", "host-down is not run against MPTCP"]),
    (["bench", "failover", "--peer", "mptcp", "--kinds", "addr-del"], ["cannot be combined with --peer mptcp"]),
    (["bench", "scale", "--quick", "--channels", "1,512,1024"],
     ["--channels 512,1024 cannot be combined with --quick", "at most 16 channels"]),
])
def test_contradicting_options_are_usage_errors_naming_both(argv, words):
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    for w in words:
        assert w in text(r), text(r)
    assert "Traceback" not in r.output
    # the option refused is the one given: never "Invalid value for --watch" for --interval
    given = {a for a in argv if a.startswith("--")}
    named = re.findall(r"Invalid value for '?(--[a-z-]+)", text(r))
    assert set(named) <= given, text(r)


@pytest.mark.parametrize("argv", [
    ["bench", "rdma", "--phases", "bare,busbw", "--bare-faults", "1", "--bare-retry-cnt", "6", "--bare-bound-s", "90",
     "--bw-sizes", "64K,1M,4M", "--rounds", "1"],                          # docs/BENCHMARKS.md's own commands
    ["bench", "rdma", "--phases", "convergence", "--kinds", "cable-pull", "--faults", "30", "--faults-per-run", "10"],
    ["bench", "rdma", "--phases", "busbw", "--bw-variants", "rdma,ib_write_bw", "--rounds", "2", "--wire", "stream"],
    ["bench", "rdma", "--faults", "3", "--bw-sizes", "1M"],                   # every phase: nothing contradicts
    ["bench", "scale", "--quick", "--channels", "1,8"],
])
def test_options_that_agree_still_run(argv):
    r = CliRunner().invoke(app, argv)
    assert isinstance(r.exception, AssertionError) and "something was run" in str(r.exception), r.output


def test_peer_runs_the_kinds_given(monkeypatch):
    got = []

    def peers(out, **kw):
        got.append(kw["kinds"])
        raise failover.C.BenchError("stop here")
    monkeypatch.setattr(failover, "run_peers", peers)
    for argv in (["--kinds", "silent"], []):
        r = CliRunner().invoke(app, ["bench", "failover", "--peer", "mptcp"] + argv)
        assert r.exit_code == 2 and "stop here" in text(r), r.output
    assert got == [["silent"], list(failover.PEER_KINDS)], got


@pytest.mark.parametrize("prefix", ["nope", "RO1234", "roabcde", "ro-1"])
def test_a_malformed_prefix_on_down_is_a_usage_error(prefix):
    """A prefix that cannot be a bed's ('ro' + 4 of [a-z0-9]) is a usage error (exit 2) naming
    the form, not "no test bed with prefix" (exit 1), which is for a well-formed one not found."""
    r = CliRunner().invoke(app, ["testbed", "down", "--prefix", prefix])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "is not a test bed prefix" in text(r) and "'ro' + 4 of [a-z0-9]" in text(r), text(r)


@pytest.mark.parametrize("suite", ["failover", "rdma", "failback"])
def test_a_fault_count_beyond_1000_is_refused_before_anything_runs(suite):
    """--faults 99999 would run for days (each fault takes seconds): a usage error, exit 2."""
    r = CliRunner().invoke(app, ["bench", suite, "--faults", "99999"])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "--faults" in text(r) and "1000" in text(r), text(r)
