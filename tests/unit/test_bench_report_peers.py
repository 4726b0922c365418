"""``railover bench report`` (and ``bench all``'s summary.md) include ``failover-peers.json``,
the side-by-side with Linux MPTCP that ``bench failover --peer mptcp`` writes, with its tables.
The report here is a real :class:`Report` filled with made-up figures: what is tested is that
the summary finds and draws it, not a measurement."""
from __future__ import annotations

from rich.console import Console
from typer.testing import CliRunner

from railover.bench import cli as bench_cli
from railover.bench import common as C
from railover.cli import app


def _summary(v):
    return {"n": 3, "p50": v, "p99": v * 2, "max": v * 3}


def _peers_report(out):
    rep = C.Report("failover-peers", out, True, {
        "faults_per_kind": 3, "kinds": ["port-down"], "fault_for_s": 2.0, "spacing_after_failback_s": 5.0,
        "second_fault": {"outage_s": 5.0, "after_s": [5.0], "second_for_s": 5.0, "recover_s": 5.0, "repeats": 1}})
    peers = {}
    for name, stall in (("railover", 7.0), ("mptcp", 312.0)):
        peers[name] = {"kinds": {"port-down": {"survived": 3, "faults": 3, "stall_ms": _summary(stall),
                                               "normal_gap_ms": _summary(1.0), "failback_ms": _summary(3100.0)}},
                       "second_faults": [{"after_s": 5.0, "first_stall_ms": stall, "rate_in_outage_Bps": 9e8,
                                          "rate_before_Bps": 1e9, "failback_ms": 3050.0, "on_rail1_at_second": False,
                                          "second_survived": True, "second_stall_ms": stall,
                                          "second_resume_ms": stall}]}
    rep.results["peers"] = peers
    rep.add_wrong(0)
    return rep.finish()


def test_the_summary_draws_the_mptcp_side_by_side(tmp_path):
    _peers_report(tmp_path)
    md = bench_cli.summary_markdown(tmp_path)
    assert "## failover-peers" in md
    assert "| railover | port-down | 3/3 | 7 / 14 / 21 |" in md, md
    assert "| mptcp | port-down | 3/3 | 312 / 624 / 936 |" in md, md


def test_bench_report_finds_the_peers_file_alone(tmp_path):
    _peers_report(tmp_path)
    res = CliRunner().invoke(app, ["bench", "report", "-o", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "(1 suite(s))" in res.output
    assert "## failover-peers" in (tmp_path / "summary.md").read_text()
