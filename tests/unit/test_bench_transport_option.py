"""`railover bench <suite> --transport`: tcp runs the suite as before, rdma runs the matching
part of the rdma suite (checked here by recording what the CLI asks the rdma suite for, with
the suite's run() replaced: the bed itself is exercised by tests/rdma/test_rdma_bench.py), and
a suite with no RDMA counterpart refuses it with a clear message, before building anything."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from railover.bench import cli as bench_cli
from railover.bench import rdma as R

from cli_text import text


@pytest.fixture
def app():
    a = typer.Typer()
    bench_cli.register(a)

    @a.command("noop")
    def _noop():  # a second command keeps `bench` a subcommand group
        pass
    return a


@pytest.fixture
def recorded(monkeypatch, tmp_path: Path):
    calls = []

    def fake_run(out, quick=False, console=None, **kw):
        calls.append(kw)
        return {"suite": "rdma", "targets": [], "wrong_bytes": 0, "settings": {}, "command": "x", "elapsed_s": 0}
    monkeypatch.setattr(R, "run", fake_run)
    return calls


@pytest.mark.parametrize("argv,phases,extra", [
    (["healthy", "--rounds", "3"], ["busbw"], {"rounds": 3}),
    (["failover", "-n", "7", "--kinds", "cable-pull,silent"], ["convergence", "bare"],
     {"faults": 7, "kinds": ["cable-pull", "silent"]}),
    (["failover", "--size", "1M"], ["convergence", "bare"], {"size": "1M"}),   # given: kept, even as the TCP default
    (["failover", "--size", "4M"], ["convergence", "bare"], {"size": "4M"}),
    (["failback", "--hold-down-ms", "2000"], ["convergence"], {"hold_down_ms": 2000}),
    (["failback", "--hold-down-ms", "3000"], ["convergence"], {"hold_down_ms": 3000}),  # given: kept, even as the TCP default
    (["failback"], ["convergence"], {}),
    (["failback", "--kinds", "silent,one-way"], ["convergence"], {"kinds": ["silent", "one-way"]}),
])
def test_rdma_runs_the_matching_part_of_the_rdma_suite(app, recorded, tmp_path, argv, phases, extra):
    r = CliRunner().invoke(app, ["bench"] + argv + ["--transport", "rdma", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert len(recorded) == 1
    assert recorded[0]["phases"] == phases
    for k, v in extra.items():
        assert recorded[0][k] == v, (k, recorded[0])
    if "--kinds" not in argv:
        assert "kinds" not in recorded[0], "the rdma suite's own default kinds apply"
    if "--size" not in argv:
        assert "size" not in recorded[0], "the rdma suite's own default size (256K) applies"
    if "--hold-down-ms" not in argv:
        assert "hold_down_ms" not in recorded[0], "the rdma suite's own default hold-down (1000 ms) applies"


@pytest.mark.parametrize("suite,kinds", [
    ("failover", "port-down,host-down,addr-del,silent,one-way"),   # the TCP default, given explicitly
    ("failover", "cable-pull,port-down"),
    ("failback", "port-down,silent"),
    ("failback", ""),
])
def test_rdma_refuses_fault_kinds_the_rdma_bed_has_not(app, recorded, tmp_path, suite, kinds):
    r = CliRunner().invoke(app, ["bench", suite, "--transport", "rdma", "--kinds", kinds, "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    bad = [k for k in kinds.split(",") if k and k not in R.KINDS]
    assert f"{', '.join(bad) or 'no kind given'}: not a fault kind of the RDMA test bed" in text(r)
    assert "its kinds: " + ", ".join(R.KINDS) in text(r)
    assert recorded == []


@pytest.mark.parametrize("suite", ["degraded", "false-failover", "scale"])
def test_a_suite_without_an_rdma_counterpart_refuses_it_before_building_a_bed(app, recorded, tmp_path, suite):
    r = CliRunner().invoke(app, ["bench", suite, "--transport", "rdma", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "not measured on the RDMA test bed yet" in text(r)
    assert "railover bench rdma" in text(r)
    assert recorded == []


def test_an_unknown_transport_is_named(app, recorded, tmp_path):
    r = CliRunner().invoke(app, ["bench", "healthy", "--transport", "ucx", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "unknown transport 'ucx'" in text(r)
    assert recorded == []


def test_peer_and_against_are_tcp_only(app, recorded, tmp_path):
    r = CliRunner().invoke(app, ["bench", "failover", "--peer", "mptcp", "--transport", "rdma", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "TCP beds only" in text(r)
    assert recorded == []


@pytest.mark.parametrize("argv,named", [
    (["healthy", "--networks", "veth"], "--networks applies"),
    (["healthy", "--ranks", "2", "--workloads", "sendrecv"], "--ranks, --workloads apply"),
    (["healthy", "--nstreams", "1,2,4"], "--nstreams applies"),   # the default value, given: still refused
    (["healthy", "--against", "/x/libnccl-net-railover.so"], "--against applies"),
    (["failover", "--outage-s", "5"], "--outage-s applies"),
    (["failover", "--against", "/x/libnccl-net-railover.so"], "--against applies"),
])
def test_rdma_refuses_the_options_of_the_tcp_beds(app, recorded, tmp_path, argv, named):
    r = CliRunner().invoke(app, ["bench"] + argv + ["--transport", "rdma", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"{named} to the TCP beds only, not to --transport rdma" in text(r)
    assert recorded == []
