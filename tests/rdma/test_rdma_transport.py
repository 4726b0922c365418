"""The plugin's RDMA transport (``RAILOVER_TRANSPORT=rdma``) end to end on the RDMA test bed:
``railover-perf`` ranks in the two guests load the plugin, which moves every message with RDMA
WRITE / WRITE_WITH_IMM on rxe queue pairs (one RC QP per path, on the HCA port behind the
path's NIC), every byte checked by railover-perf.

Asserted here:
* an all-reduce across the guests completes with 0 wrong bytes through each net ABI v7-v12,
  and the plugin says it runs the rdma transport on both rails (NIC -> HCA port and GID);
* a cable pull on the primary rail of guest A in the middle of a timed all-reduce moves every
  comm to the standby HCA (``failover`` in the journal, the path on the pulled NIC down), and
  after the cable is back the comms return to it (``failback``), with 0 wrong bytes;
* ranks that disagree on the transport (one tcp, one rdma) fail with an error that names both
  transports, instead of exchanging bytes the other side cannot read.

Timers: under TCG (no KVM here) a guest runs 10-50x slower than native; the plugin runs with
the bed's TCG timers (:data:`railover.testbed.rdma.perf.TCG_PLUGIN_ENV`) and every wait below is
bounded generously.
"""
from __future__ import annotations

import json
import threading
from typing import List

import pytest

from railover.testbed.netns import poll_until
from railover.testbed.rdma import faults as rf
from railover.testbed.rdma import perf as rperf

from rdma_helpers import crash_retry

pytestmark = pytest.mark.rdma

RDMA_ENV = {"RAILOVER_TRANSPORT": "rdma", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def _journal(bed, host: str) -> List[dict]:
    """Events of the journals of the railover-perf ranks running in ``host`` now."""
    rc, out, _ = bed.sh(host, "cat /tmp/rperf-*/journal-rank*.jsonl 2>/dev/null || true", timeout_s=60)
    evs = []
    for line in out.splitlines():
        try:
            evs.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return evs


@pytest.mark.parametrize("abi", [12, 11, 10, 9, 8, 7])
def test_allreduce_over_the_rdma_transport_every_byte(rdma_bed, tmp_path, abi):
    """Every net ABI NCCL 2.19-2.32 may load (railover-perf calls the plugin through the forced
    version's table: int sizes and registrations on v7/v8, per-context init on v11/v12)."""
    big = "1M" if abi == 12 else "64K"  # the full size range once; the ABI tables differ in calls, not sizes

    def body():
        res = rperf.run_perf(rdma_bed, ranks_per_host=1, timeout_s=900, workload="allreduce", minbytes="1K",
                             maxbytes=big, stepfactor=8, iters=3, warmup=1, channels=1, op_timeout=120,
                             rendezvous_timeout=300, fetch_to=tmp_path, env=RDMA_ENV, abi=abi)
        assert res.ok, res.describe()
        assert res.wrong_total == 0 and len(res.ranks) == 2
        for r in res.ranks:
            assert r.json["exit_code"] == 0 and r.json["errors"] == [], r.json
            assert r.json["stats"]["bytes_received"] > 0
            assert r.json["stats"]["calls"]["regMr"] > 0
            # the plugin chose the HCA port behind each rail NIC
            assert "transport rdma: eth1 -> rxe0 port 1" in r.stdout + r.stderr, r.stdout + r.stderr
            assert "eth2 -> rxe1 port 1" in r.stdout + r.stderr
            # no grouped receives on rdma yet (each receive buffer is advertised on its own), and
            # messages < 4 GiB (the size travels in the 32-bit immediate)
            assert r.json["device"]["max_recvs"] == 1
            if abi >= 9:  # v7/v8 properties have no size limits
                assert r.json["device"]["max_p2p_bytes"] == 2**32 - 1

    crash_retry(rdma_bed, body)


def test_cable_pull_fails_over_to_the_standby_hca_and_back(rdma_bed, tmp_path):
    bed = rdma_bed

    def body():
        box = {}
        env = dict(RDMA_ENV, RAILOVER_HOLD_DOWN_MS="1000")

        def run():
            box["res"] = rperf.run_perf(bed, ranks_per_host=1, timeout_s=900, workload="allreduce", minbytes="64K",
                                        maxbytes="256K", stepfactor=4, duration=150, warmup=1, channels=1,
                                        op_timeout=240, rendezvous_timeout=300, fetch_to=tmp_path, env=env)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            # Both rails up in A's journal (send and receive comms), before the fault.
            poll_until(lambda: {e["nic"] for e in _journal(bed, "A") if e.get("event") == "path_up"} >= {"eth1", "eth2"},
                       300, 1.0, "paths on both rails in guest A")
            fault = rf.CablePull(bed, "a0").apply()
            try:
                poll_until(lambda: any(e.get("event") == "failover" for e in _journal(bed, "A") + _journal(bed, "B")),
                           120, 1.0, "a failover after the cable pull")
            finally:
                fault.undo()
            poll_until(lambda: any(e.get("event") == "failback" for e in _journal(bed, "A") + _journal(bed, "B")),
                       240, 1.0, "a failback after the cable came back")
        finally:
            t.join(1000)
        res = box.get("res")
        assert res is not None, "railover-perf did not finish"
        assert res.ok, res.describe()
        assert res.wrong_total == 0
        evs = [json.loads(l) for r in range(2) for l in (tmp_path / f"journal-rank{r}.jsonl").read_text().splitlines()]
        downs = [e for e in evs if e.get("event") == "path_down"]
        assert any(e["nic"] == "eth1" for e in downs), downs
        assert any(e.get("event") == "failover" for e in evs) and any(e.get("event") == "failback" for e in evs)
        assert not any(e.get("event") == "fatal" for e in evs), [e for e in evs if e.get("event") == "fatal"]

    crash_retry(bed, body)


def test_ranks_on_different_transports_fail_with_a_clear_error(rdma_bed, tmp_path):
    """Rank 0 runs rdma, rank 1 tcp: connect refuses the peer's handle and names both."""
    bed = rdma_bed

    def body():
        res = rperf.run_perf(bed, ranks_per_host=1, timeout_s=600, workload="allreduce", minbytes="1K",
                             maxbytes="1K", iters=1, warmup=0, channels=1, op_timeout=60, rendezvous_timeout=300,
                             fetch_to=tmp_path, env=RDMA_ENV, per_rank_env={1: {"RAILOVER_TRANSPORT": "tcp"}})
        assert not res.ok
        text = "\n".join(r.stdout + r.stderr for r in res.ranks)
        assert "set RAILOVER_TRANSPORT to the same value on every rank" in text, text[-3000:]
        assert "rdma" in text and "tcp" in text

    crash_retry(bed, body)
