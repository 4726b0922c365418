"""`bench healthy` and `bench failover --peer mptcp` keep what they measured when interrupted.

Both suites used to store their results only at the very end, so Ctrl-C (or SIGTERM) after an
hour of healthy rounds, or during MPTCP's half of the peer comparison, wrote nothing. Here the
real suite code runs over fakes of the test bed and its measurements (no namespaces, no
ranks): what is tested is which parts the interrupted report holds, not the numbers.
"""
from __future__ import annotations

import json
import types
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from railover.bench import common as C
from railover.bench import failover as fo
from railover.bench import healthy as H
from railover.cli import app


class _Host:
    def __init__(self, name):
        self.name = name
        self.nics = [types.SimpleNamespace(addr=f"10.0.0.{ord(name[-1])}")]


@contextmanager
def _bed(*a, **kw):
    yield types.SimpleNamespace(prefix="fake", hosts=[_Host("A"), _Host("B")])


def _sweep_result(opts):
    sizes = [8, 64] if opts.get("minbytes") == 8 else [{"1M": 1 << 20, "4M": 4 << 20}[opts["minbytes"]]]
    rows = [{"size": s, "busbw_gbps": 1.0, "time_us": 10.0} for s in sizes]
    return types.SimpleNamespace(rows=rows, wrong_total=0, ranks=[types.SimpleNamespace(json={"stats": {}})])


@pytest.fixture
def healthy_fakes(monkeypatch, tmp_path):
    """Fakes under healthy.run; ``calls["interrupt_at"]`` = the run_sweep call (1-based) that
    raises KeyboardInterrupt, as Ctrl-C during that sweep would."""
    calls = {"sweeps": 0, "interrupt_at": None}

    def run_sweep(tb, wd, **opts):
        calls["sweeps"] += 1
        if calls["sweeps"] == calls["interrupt_at"]:
            raise KeyboardInterrupt
        return _sweep_result(opts)

    monkeypatch.setattr(H, "TestBed", _bed)
    monkeypatch.setattr(H, "baseline_path", lambda: tmp_path / "libnccl-net-baseline.so")
    monkeypatch.setattr(C, "run_sweep", run_sweep)
    monkeypatch.setattr(C, "iperf_ring", lambda tb, pairs, P, s, **kw: [{"gbs": 2.0} for _ in pairs])
    monkeypatch.setattr(C, "read_timeseries",
                        lambda p: ([], [{"bytes": 8, "lat_us": 5}, {"bytes": 64, "lat_us": 6}]))
    return calls


# --quick: 3 configs (armed, none, baseline) x 3 segments = 9 sweeps per block, then the
# checked run of each combination after the rounds.
ARGS = ["bench", "healthy", "--quick", "--networks", "loopback", "--ranks", "2", "--workloads", "sendrecv",
        "--nstreams", "2", "--rounds", "3"]
PER_BLOCK = 9


def _report(out):
    return json.loads((out / "healthy.json").read_text())


def test_healthy_interrupted_in_its_third_round_keeps_the_two_rounds_measured(healthy_fakes, tmp_path):
    out = tmp_path / "o"
    healthy_fakes["interrupt_at"] = 2 * PER_BLOCK + 4
    r = CliRunner().invoke(app, ARGS + ["--out", str(out)])
    assert r.exit_code == 130, r.output
    d = _report(out)
    assert d["interrupted"] == "SIGINT"
    assert [b["round"] for b in d["results"]["blocks_done"]] == [1, 2]
    (combo,) = d["results"]["combos"]
    assert sorted(combo["configs"]) == ["armed", "baseline", "none"]
    big = next(row for row in combo["rows"] if row["size"] == 1 << 20)
    # rounds 1 and 2 are stored; the third round's sweeps before the interrupt are not a block
    assert len(big["armed"]["busbw_rounds"]) == 2
    assert d["results"]["iperf"]["loopback/2/P2"]["rounds"] == [2.0, 2.0]
    assert d["targets"] == []  # evaluated only on a complete run
    assert "partial report" in r.output and "blocks_done: 2" in r.output
    # and `bench report` draws the partial tables, marked as such
    rr = CliRunner().invoke(app, ["bench", "report", "--out", str(out)])
    assert rr.exception is None or isinstance(rr.exception, SystemExit), rr.output
    md = (out / "summary.md").read_text()
    assert "Interrupted (SIGINT)" in md and "tables not drawn" not in md, md


def test_healthy_interrupted_in_its_first_block_writes_nothing(healthy_fakes, tmp_path):
    out = tmp_path / "o"
    healthy_fakes["interrupt_at"] = 3
    r = CliRunner().invoke(app, ARGS + ["--out", str(out)])
    assert r.exit_code == 130, r.output
    assert not (out / "healthy.json").exists()
    assert "before any part finished" in r.output


def test_healthy_complete_run_stores_checked_runs_and_targets(healthy_fakes, tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ARGS + ["--out", str(out)])
    d = _report(out)
    assert "interrupted" not in d
    assert len(d["results"]["blocks_done"]) == 3
    assert [c["wrong_bytes"] for c in d["results"]["checked"]] == [0]
    assert any(t["figure"].startswith("healthy: busbw armed/none") for t in d["targets"]), d["targets"]
    assert r.exit_code in (0, 1), r.output  # 1: the fakes' iperf3 (2 GB/s) against busbw 1 GB/s misses


# ---------------------------------------------------------------- --peer mptcp


@pytest.fixture
def peer_fakes(monkeypatch):
    """Fakes under failover.run_peers: railover's live run completes; MPTCP's part is
    interrupted (``state["mptcp"]``: an exception raised from its fault cycles)."""
    state = {"mptcp": KeyboardInterrupt()}

    class LiveRun:
        def __init__(self, *a, **kw):
            self.alive = True

        def start(self):
            return self

        def stop(self):
            pass

        def finish(self, check=False):
            return types.SimpleNamespace(wrong_bytes=0, ok=True, buckets={1: []},
                                         perf=types.SimpleNamespace(ranks=[types.SimpleNamespace(returncode=0)] * 2),
                                         select=lambda kind, since=None: [])

    class Peer:
        setup, subflows = "fake", []

        def __init__(self, *a, **kw):
            self.alive = True

        def configure(self):
            pass

        def start(self):
            pass

        def stop(self):
            return {"wrong": 0, "connected": True, "error": None, "buckets": [], "bytes": 0, "send_exit": 0,
                    "send_out": ""}

        def snapshot(self):
            return ""

    def cycles(tb, rs, alive, kinds, n, fault_for_s, window_s, console, name, spacing_s=5.0):
        if name == "mptcp" and state["mptcp"] is not None:
            raise state["mptcp"]
        return [{"peer": name, "kind": kinds[0], "i": 0, "t_apply": 1_000_000, "t_undo": 2_000_000,
                 "failback_ms": 100.0}]

    from railover.bench import mptcp as M
    monkeypatch.setattr(fo, "TestBed", _bed)
    monkeypatch.setattr(fo, "RailSampler", lambda tb: types.SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(C, "LiveRun", LiveRun)
    monkeypatch.setattr(M, "MptcpPeer", Peer)
    monkeypatch.setattr(M, "sysctls", lambda tb, h: {})
    monkeypatch.setattr(fo, "peer_cycles", cycles)
    monkeypatch.setattr(fo, "second_fault", lambda *a, **kw: {
        "t_apply": 1_000_000, "t_undo": 2_000_000, "t_second": 3_000_000, "t_second_undo": 4_000_000})
    monkeypatch.setattr(fo, "_peer_plot", lambda rep, results: None)
    return state


PEER_ARGS = ["bench", "failover", "--peer", "mptcp", "--quick", "--kinds", "port-down"]


def test_peer_run_interrupted_during_mptcp_keeps_railovers_part(peer_fakes, tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(app, PEER_ARGS + ["--out", str(out)])
    assert r.exit_code == 130, r.output
    d = json.loads((out / "failover-peers.json").read_text())
    assert d["interrupted"] == "SIGINT"
    assert list(d["results"]["peers"]) == ["railover"]
    assert d["results"]["peers"]["railover"]["kinds"]["port-down"]["faults"] == 1
    assert [t["figure"] for t in d["targets"]] == ["railover: wrong bytes"]


def test_peer_run_where_mptcp_cannot_run_keeps_railovers_part(peer_fakes, tmp_path):
    from railover.bench.mptcp import MptcpError
    peer_fakes["mptcp"] = MptcpError("MPTCP is not enabled in this kernel (net.mptcp.enabled)")
    out = tmp_path / "o"
    r = CliRunner().invoke(app, PEER_ARGS + ["--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "MPTCP is not enabled" in r.output
    d = json.loads((out / "failover-peers.json").read_text())
    assert list(d["results"]["peers"]) == ["railover"]
    assert "MPTCP" in d["interrupted"]


def test_peer_run_complete_has_both_parts_and_both_targets(peer_fakes, tmp_path):
    peer_fakes["mptcp"] = None
    out = tmp_path / "o"
    r = CliRunner().invoke(app, PEER_ARGS + ["--out", str(out)])
    d = json.loads((out / "failover-peers.json").read_text())
    assert "interrupted" not in d, r.output
    assert list(d["results"]["peers"]) == ["railover", "mptcp"]
    assert sorted(t["figure"] for t in d["targets"]) == ["mptcp: wrong bytes", "railover: wrong bytes"]
