"""`railover demo --transport rdma` end to end on the RDMA test bed: one admin-down fault on
guest A's primary rail under a checked all-reduce over the verbs transport. The demo must say
what happened (a failover and a failback), write its report and journals, and exit 0 only
because the run really survived (0 wrong bytes, ranks exited 0)."""
from __future__ import annotations

import json

import pytest

from railover import demo_rdma

from rdma_helpers import crash_retry

pytestmark = pytest.mark.rdma


def test_rdma_demo_survives_an_admin_down_and_says_so(rdma_bed, tmp_path, capsys):
    rc = crash_retry(rdma_bed, lambda: demo_rdma.run_rdma_demo("admin-down", "256K", tmp_path, hold_down_ms=1000,
                                                               bed=rdma_bed))
    out = capsys.readouterr().out
    assert (tmp_path / "demo-rdma-report.json").exists(), f"the demo wrote no report (exit {rc}): {out[-3000:]}"
    report = json.loads((tmp_path / "demo-rdma-report.json").read_text())
    cyc = report["kinds"]["admin-down"]["cycles"]
    assert rc == 0, (out[-3000:], cyc)
    assert report["survived"] and report["convergence_wrong_bytes"] == 0
    assert report["convergence_exit_codes"] == [0, 0]
    assert cyc[0]["failovers"] >= 1 and cyc[0]["failbacks"] >= 1, cyc
    assert "every fault survived on RDMA" in out and "admin-down" in out
    journals = list((tmp_path / "demo-rdma-journals").glob("journal-rank*.jsonl"))
    assert len(journals) == 2
    events = [json.loads(line)["event"] for j in journals for line in j.read_text().splitlines() if line.strip()]
    assert "failover" in events and "failback" in events and "fatal" not in events
