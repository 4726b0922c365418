"""Ctrl-C (or SIGTERM) in a long `railover bench` run keeps what was measured: the suite's
finished parts are written as ``<suite>.json`` marked ``interrupted``, the exit status is 130
(143 for SIGTERM, re-raised), ``bench all`` still writes ``summary.md``, and ``bench report``
shows the partial report as such. Before, an interrupt lost the whole run (the JSON was only
written at the very end). The suites here are fakes that build a real :class:`Report`; what
is tested is the CLI's handling of the interrupt, not a benchmark."""
from __future__ import annotations

import json
import types

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from railover.bench import cli as bench_cli
from railover.bench import common as C
from railover.cli import app

from cli_text import text


def _fake_suite(interrupt_with=None):
    """A suite module whose run() finishes one part ("port-down") and then is interrupted by
    ``interrupt_with`` (an exception instance), or completes when it is None."""

    def run(out, quick=False, console=None, **kw):
        rep = C.Report(suite_name["name"], out, quick, {"faults_per_kind": 3})
        per_kind = {}
        rep.results["kinds"] = per_kind
        per_kind["port-down"] = {"faults": 3, "convergence_ms": {"p50": 4.0}}
        rep.add_wrong(0)
        if interrupt_with is not None:
            raise interrupt_with
        per_kind["silent"] = {"faults": 3, "convergence_ms": {"p50": 90.0}}
        rep.add_target("convergence p99", 5.0, "<=", 20, "ms")
        return rep.finish()

    def markdown(r):
        kinds = r["results"]["kinds"]
        return "| kind | p50 |\n|---|---|\n" + "".join(
            f"| {k} | {v['convergence_ms']['p50']} |\n" for k, v in kinds.items()) + \
            f"both kinds: {kinds['port-down']['faults'] + kinds['silent']['faults']}\n"

    suite_name = {"name": "failover"}
    return types.SimpleNamespace(run=run, markdown=markdown, suite_name=suite_name)


@pytest.fixture
def suites(monkeypatch):
    """Maps suite names to fake modules: healthy completes, failover is interrupted (SIGINT)."""
    mods = {}

    def module(suite):
        return mods[suite]
    monkeypatch.setattr(bench_cli, "_module", module)
    return mods


def test_an_interrupted_suite_keeps_its_finished_parts_and_exits_130(tmp_path, suites):
    suites["failover"] = _fake_suite(KeyboardInterrupt())
    console = Console(record=True, width=200)
    with pytest.raises(typer.Exit) as ex:
        bench_cli._run_suite("failover", tmp_path, True, console)
    assert ex.value.exit_code == 130
    data = json.loads((tmp_path / "failover.json").read_text())
    assert data["interrupted"] == "SIGINT"
    assert list(data["results"]["kinds"]) == ["port-down"]
    assert data["targets"] == [] and data["elapsed_s"] is not None
    said = console.export_text()
    assert "failover interrupted (SIGINT)" in said and str(tmp_path / "failover.json") in said
    assert "kinds: port-down" in said
    assert not C.open_reports(), "the partial report is written once, then closed"


def test_sigterm_keeps_the_partial_report_and_is_re_raised(tmp_path, suites):
    suites["failover"] = _fake_suite(SystemExit(143))
    with pytest.raises(SystemExit) as ex:
        bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))
    assert ex.value.code == 143
    assert json.loads((tmp_path / "failover.json").read_text())["interrupted"] == "SIGTERM"


def test_an_interrupt_before_any_report_writes_nothing_and_says_so(tmp_path, suites):
    def run(out, quick=False, console=None, **kw):
        raise KeyboardInterrupt
    suites["failover"] = types.SimpleNamespace(run=run)
    console = Console(record=True, width=200)
    with pytest.raises(typer.Exit) as ex:
        bench_cli._run_suite("failover", tmp_path, True, console)
    assert ex.value.exit_code == 130
    assert not (tmp_path / "failover.json").exists()
    assert "before it had results: nothing written" in console.export_text()


def test_a_report_left_open_by_an_earlier_suite_is_not_written_by_a_later_interrupt(tmp_path, suites):
    stale = C.Report("scale", tmp_path / "old", True, {})  # e.g. a suite that failed with BenchError
    try:
        suites["failover"] = _fake_suite(KeyboardInterrupt())
        with pytest.raises(typer.Exit):
            bench_cli._run_suite("failover", tmp_path / "new", True, Console(quiet=True))
        assert (tmp_path / "new" / "failover.json").exists()
        assert not (tmp_path / "old" / "scale.json").exists()
    finally:
        stale.finish()


def test_bench_all_interrupted_writes_the_summary_with_the_partial_suite_marked(tmp_path, suites):
    done = _fake_suite(None)
    done.suite_name["name"] = "healthy"
    suites["healthy"] = done
    suites["failover"] = _fake_suite(KeyboardInterrupt())
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["bench", "all", "--suites", "healthy,failover", "--out", str(out)])
    assert r.exit_code == 130, r.output
    assert json.loads((out / "healthy.json").read_text()).get("interrupted") is None
    summary = (out / "summary.md").read_text()
    assert "| failover |" in summary and "(**interrupted**, SIGINT)" in summary
    assert "Interrupted (SIGINT)" in summary and "Parts finished: kinds: port-down" in summary
    # the fake failover tables need both kinds: not drawn from the partial results, and said so
    assert "tables not drawn from the partial results: KeyError" in summary
    # the complete suite's tables are there
    assert "both kinds: 6" in summary
    # bench report rebuilds the summary from the files and names the partial report
    (out / "summary.md").unlink()
    r2 = CliRunner().invoke(app, ["bench", "report", "--out", str(out)])
    assert r2.exit_code == 0, r2.output
    assert "failover.json is a partial report (interrupted, SIGINT" in text(r2)
    assert "finished: kinds: port-down" in text(r2)
    assert "Interrupted (SIGINT)" in (out / "summary.md").read_text()


def test_completed_parts_name_measured_parts_not_run_settings():
    data = {"results": {"bed": {"accel": "tcg", "smp": 1}, "kinds": {"cable-pull": {"faults": 5}},
                        "busbw_rows": [{"size": 1}, {"size": 2}], "convergence_wrong_bytes": 0, "empty": {}}}
    assert C.completed_parts(data) == ["kinds: cable-pull", "busbw_rows: 2"]
