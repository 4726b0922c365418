"""`railover bench rdma` end to end on the RDMA test bed, in its smallest form (for CI: one
cable pull under a checked all-reduce, one bare-RC-free busbw round of rdma vs ib_write_bw at
64 KiB). Asserts that the suite measures what it reports: a failover per fault with its
journal convergence, 0 wrong bytes, both bandwidths and their ratio, the JSON and markdown.
The targets are not asserted (a TCG guest on a loaded machine may miss them; the suite reports
that, it is not a test failure)."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from railover.bench import rdma as R

from rdma_helpers import crash_retry

pytestmark = pytest.mark.rdma


def test_quick_rdma_bench_measures_a_failover_and_busbw(rdma_bed, tmp_path):
    def body():
        return R.run(tmp_path, quick=True, faults=1, kinds=["cable-pull"], bw_sizes=["64K"], rounds=1,
                     bare_faults=0, phases=["convergence", "busbw"], bw_variants=["rdma", "ib_write_bw"],
                     console=Console(width=160), bed=rdma_bed)

    data = crash_retry(rdma_bed, body)
    res = data["results"]
    cp = res["kinds"]["cable-pull"]
    assert cp["faults"] == 1 and cp["faults_without_failover"] == 0, cp["cycles"]
    assert cp["convergence_ms"]["n"] >= 1 and cp["convergence_ms"]["p50"] > 0
    assert cp["fatal"] == 0 and res["convergence_wrong_bytes"] == 0 and data["wrong_bytes"] == 0
    assert res["convergence_exit_codes"] == [0, 0]
    bw = res["busbw"][str(64 * 1024)]
    assert bw["median_gbs"]["rdma"] > 0 and bw["median_gbs"]["ib_write_bw"] > 0, res["busbw_rows"]
    assert bw["rdma_vs_ib_write_bw"] == pytest.approx(bw["median_gbs"]["rdma"] / bw["median_gbs"]["ib_write_bw"])
    on_disk = json.loads((tmp_path / "rdma.json").read_text())
    assert on_disk["results"]["kinds"]["cable-pull"]["faults"] == 1
    assert "| cable-pull | 1 |" in R.markdown(on_disk)
