"""Smoke tests (tiny sizes) of the peers railover is compared with:

* ``railover bench failover --peer mptcp``: railover and Linux MPTCP (backup subflow on the
  standby rail) under the same faults on one bed: both streams intact, every figure recorded;
* the ``baseline`` column of ``railover bench healthy`` (libnccl-net-baseline.so), and the
  baseline plugin itself moving checked data through railover-perf.

They check that the comparisons run and report; they do not judge who is faster.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from railover import perf
from railover.bench import failover as fo
from railover.bench import healthy as H
from railover.bench import mptcp as M
from railover.testbed import netns as tbmod


def test_mptcp_expected_stream_bytes():
    import numpy as np
    whole = np.arange(0, 64, dtype="<u8").view(np.uint8)
    for pos, n in ((0, 8), (3, 17), (7, 1), (13, 200), (0, 0)):
        assert bytes(M.expected(pos, n)) == bytes(whole[pos:pos + n])


@pytest.mark.parametrize("workload", ["sendrecv", "allreduce"])
@pytest.mark.parametrize("nstreams", ["1", "3"])
def test_baseline_plugin_moves_checked_data(tmp_path, workload, nstreams):
    so = H.baseline_path()
    res = perf.run_perf(2, plugin=so, workload=workload, minbytes=4, maxbytes="4M", stepfactor=16, iters=3, warmup=1,
                        env={"RAILOVER_IFNAMES": "lo", "RAILOVER_NSTREAMS": nstreams}, timeout=240, workdir=tmp_path)
    res.check()
    assert res.abi == 9
    assert res.wrong_total == 0
    assert [r["size"] for r in res.rows][-1] == 4 << 20
    assert all(r["busbw_gbps"] > 0 for r in res.rows if r["size"] >= 1 << 20)


@pytest.mark.netns
def test_failover_peer_mptcp_quick(tmp_path: Path):
    data = fo.run_peers(tmp_path, quick=True, faults=1, outage_s=3.0)
    assert json.loads((tmp_path / "failover-peers.json").read_text())["suite"] == "failover-peers"
    peers = data["results"]["peers"]
    assert set(peers) == {"railover", "mptcp"}
    setup = data["settings"]["mptcp"]["setup"]
    assert any("endpoint add" in c and "backup" in c for c in setup) and any("signal" in c for c in setup)
    assert "net.mptcp.enabled" in data["settings"]["mptcp"]["sysctls"]["A"]
    for name, r in peers.items():
        assert r["wrong_bytes"] == 0, name
        assert set(r["kinds"]) == set(fo.PEER_KINDS), name
        for kind, k in r["kinds"].items():
            assert k["faults"] == 1 and k["stall_ms"]["n"] == 1, (name, kind)
            assert isinstance(k["cycles"][0]["survived"], bool)
        s = r["second_fault"]
        assert s["outage_s"] == 3.0 and isinstance(s["second_survived"], bool) and s["first_stall_ms"] is not None
    assert peers["railover"]["stream_ok"] and peers["railover"]["rank_exit_codes"] == [0, 0]
    assert peers["mptcp"]["stream_ok"] and peers["mptcp"]["bytes"] > 0, peers["mptcp"]
    # railover moved off rail 0 at every fault (survived: data during the fault's last 500 ms)
    assert all(k["survived"] == k["faults"] for k in peers["railover"]["kinds"].values())
    mine = [i for i in tbmod.list_testbeds() if i.pid == os.getpid() and i.alive]
    assert not mine, mine


@pytest.mark.netns
def test_healthy_baseline_column(tmp_path_factory):
    out = tmp_path_factory.mktemp("hb")  # short: the rendezvous socket path must fit sun_path
    data = H.run(out, quick=True, networks=["veth"], ranks=[2], workloads=["sendrecv"], nstreams=[2])
    (combo,) = data["results"]["combos"]
    assert H.BASELINE in combo["configs"] and combo["iperf_gbs"] > 0
    big = [r for r in combo["rows"] if r["size"] >= 1 << 20]
    assert big
    for r in big:
        assert r[H.BASELINE]["busbw"] > 0
        assert r["armed_vs_baseline"] == pytest.approx(r["armed"]["busbw"] / r[H.BASELINE]["busbw"])
    assert combo["armed_vs_baseline_ge4m"] is not None
    assert "armed/baseline" in H.markdown(data)
    assert data["wrong_bytes"] == 0
