"""`railover bench` and `railover soak` reject bad options with a message naming the option,
exit 2, before any test bed is built (TestBed is replaced by one that fails the test), and
`bench report` handles a missing, empty or corrupt results directory without a traceback."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from railover.bench import common as C
from railover.bench import degraded, failback, failover, healthy, scale, soak
from railover.cli import app
from railover.testbed.rdma import bed as rdma_bed

from cli_text import text


@pytest.fixture(autouse=True)
def no_bed(monkeypatch):
    def bed(*a, **k):
        raise AssertionError("a test bed was built")
    for mod in (degraded, failback, failover, healthy, scale, soak):
        monkeypatch.setattr(mod, "TestBed", bed)
    monkeypatch.setattr(rdma_bed, "RdmaBed", bed)


def bench(tmp_path, *argv):
    return CliRunner().invoke(app, ["bench", *argv, "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("argv,msg", [
    (["healthy", "--networks", "bogus"], "--networks: unknown network(s) 'bogus'; known: loopback, veth"),
    (["degraded", "--rate", "bogus"], "--rate: bad rate 'bogus'"),
    (["failback", "--kinds", "cable-pull"], "--kinds: unknown fault kind(s) 'cable-pull'; known: port-down"),
    (["failback", "--kinds", "port-down,nope"], "unknown fault kind(s) 'nope'"),
])
def test_bad_suite_options_are_named_before_a_bed_is_built(tmp_path, argv, msg):
    r = bench(tmp_path, *argv)
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "could not run" in text(r) and msg in text(r), text(r)


@pytest.mark.parametrize("argv,opt", [
    (["failover", "--faults", "-1"], "--faults"),
    (["failback", "--faults", "-1"], "--faults"),
    (["failover", "--size", "abc"], "--size"),
    (["failover", "--size", "0"], "--size"),
    (["failover", "--size", "1 M"], "--size"),   # railover-perf refuses it: it must not reach a run
    (["rdma", "--size", "0"], "--size"),            # before two QEMU guests boot
    (["rdma", "--bw-sizes", "1M,0B"], "--bw-sizes"),
    # negative counts and durations (they used to run with nothing measured, or reach the plugin)
    (["healthy", "--rounds", "-1"], "--rounds"),
    (["failback", "--hold-down-ms", "-1"], "--hold-down-ms"),
    (["scale", "--idle-seconds", "-1"], "--idle-seconds"),
    (["rdma", "--faults", "-1"], "--faults"),
    (["rdma", "--faults-per-run", "-1"], "--faults-per-run"),
    (["rdma", "--rounds", "-2"], "--rounds"),
    (["rdma", "--bare-faults", "-1"], "--bare-faults"),
    (["rdma", "--bare-bound-s", "-5"], "--bare-bound-s"),
])
def test_bad_counts_and_sizes_are_usage_errors(tmp_path, argv, opt):
    r = bench(tmp_path, *argv)
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert re.search(rf"Invalid value for '?{opt}", text(r)), text(r)


def test_soak_size_is_checked_up_front(tmp_path):
    r = CliRunner().invoke(app, ["soak", "--duration", "60", "--size", "abc", "--out", str(tmp_path)])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert re.search(r"Invalid value for '?--size", text(r)) and "bad size 'abc'" in text(r), text(r)


@pytest.mark.parametrize("dur", ["1h1h", "30s1h", "1m1h", "h", "1x", "1 30m", "1 2"])
def test_soak_duration_takes_each_unit_once_in_order(tmp_path, dur):
    """'1h1h' ran a 2 h soak and '30s1h' 1 h 30 s (found by a fresh-user trial); '1 30m' is
    no duration either (not 1 h 30 m, nor 130 m)."""
    r = CliRunner().invoke(app, ["soak", "--duration", dur, "--out", str(tmp_path)])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert re.search(r"Invalid value for '?--duration", text(r)) and "each unit once" in text(r), text(r)


def test_soak_durations_in_every_accepted_form():
    assert [soak.parse_duration(d) for d in ("90", "90s", " 90 s ", "2m30s", "1h30m", "1h 30m", "1.5h")] == \
        [90, 90, 90, 150, 5400, 5400, 5400]


def test_report_on_a_missing_or_file_out_is_named(tmp_path):
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path / "nonexistent-bench")])
    assert r.exit_code == 2 and "no such directory" in text(r) and "--out" in text(r), r.output
    (tmp_path / "f").write_text("")
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path / "f")])
    assert r.exit_code == 2 and "not a directory" in text(r), r.output


def test_report_on_an_empty_dir_says_there_are_no_results(tmp_path):
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"no results in {tmp_path}" in text(r) and "failover.json" in text(r), text(r)
    assert not (tmp_path / "summary.md").exists()


def _report(suite):
    return {"suite": suite, "command": f"railover bench {suite}", "started": "now", "elapsed_s": 1.0,
            "machine": dict(C.machine_info(), loadavg_at_start=[0.1]), "settings": {}, "wrong_bytes": 0,
            "targets": [], "results": {}}


def test_report_on_a_hand_made_json_missing_a_suite_s_field_is_a_message_not_a_traceback(tmp_path):
    """load_report checks the top-level fields only; a report whose machine or results lack what
    the tables read (a hand-made or hand-edited file) ended `bench report` in a KeyError."""
    rep = _report("healthy")
    rep["machine"] = {"loadavg_at_start": [0.1], "plugin": "x"}   # no nproc, cpu, ...
    (tmp_path / "healthy.json").write_text(json.dumps(rep))
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert f"cannot summarise {tmp_path}" in text(r) and "missing" in text(r), text(r)
    assert not (tmp_path / "summary.md").exists()


def test_report_skips_a_corrupt_json_and_names_it(tmp_path, monkeypatch):
    (tmp_path / "failover.json").write_text("{bad")
    with pytest.raises(C.BenchError, match="failover.json: cannot be read as JSON"):
        C.load_report(tmp_path, "failover")
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "failover.json: cannot be read as JSON" in text(r) and "no suite's JSON could be read" in text(r), text(r)
    (tmp_path / "degraded.json").write_text(json.dumps({"suite": "degraded"}))
    with pytest.raises(C.BenchError, match="degraded.json: not a railover bench report"):
        C.load_report(tmp_path, "degraded")
    (tmp_path / "degraded.json").unlink()
    (tmp_path / "healthy.json").write_text(json.dumps(_report("healthy")))
    monkeypatch.setattr(healthy, "markdown", lambda r: "(healthy tables)")
    r = CliRunner().invoke(app, ["bench", "report", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "skipped:" in text(r) and "failover.json" in text(r) and "(1 suite(s))" in text(r), text(r)
    md = (tmp_path / "summary.md").read_text()
    assert "## healthy" in md and "## failover" not in md


def test_outage_without_peer_is_refused_not_ignored(tmp_path):
    r = bench(tmp_path, "failover", "--outage-s", "5")
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "--outage-s applies with --peer mptcp only" in text(r), text(r)


@pytest.mark.parametrize("suite", [["rdma", "--phases", "convergence", "--kinds", "cable-pull", "--faults", "1"],
                                   ["failover"]])
def test_an_out_that_is_a_file_is_refused_before_any_bed_is_built(tmp_path, suite):
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = CliRunner().invoke(app, ["bench", *suite, "--out", str(afile)])
    out = text(r)
    assert r.exit_code == 2, out
    assert f"cannot use -o {afile}" in out and "Traceback" not in out, out


@pytest.mark.parametrize("kind", ["file", "under-file"])
def test_soak_out_that_cannot_be_a_directory_is_refused_before_any_bed_is_built(tmp_path, kind):
    """`soak --out <a file>` (or a path under one, or under /proc) ended in a traceback,
    FileExistsError / NotADirectoryError from mkdir, with exit 1."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile if kind == "file" else afile / "sub"
    r = CliRunner().invoke(app, ["soak", "--duration", "60", "--out", str(out)])
    assert r.exit_code == 2 and not isinstance(r.exception, (AssertionError, OSError)), r.output
    assert f"cannot use --out {out}" in text(r) and "give a directory" in text(r), text(r)
    assert afile.read_text() == "x"


def test_a_run_that_met_every_target_prints_no_empty_misses_table():
    """Every bench run that met its targets ended with a 'targets missed' table of a header and
    no row, above 'targets missed: 0'; the table is printed only when a target was missed."""
    import io

    import typer
    from rich.console import Console

    from railover.bench import cli as bcli

    def finish(targets):
        out = io.StringIO()
        with pytest.raises(typer.Exit) as ex:
            bcli._finish([{"wrong_bytes": 0, "targets": targets}], Console(file=out, width=120))
        return ex.value.exit_code, out.getvalue()

    rc, text = finish([{"figure": "p99 convergence", "value": 4.0, "target": "<= 10 ms", "met": True}])
    assert rc == 0 and "targets missed: 0" in text, text
    assert "figure" not in text and "targets missed\n" not in text, text
    rc, text = finish([{"figure": "p99 convergence", "value": 40.0, "target": "<= 10 ms", "met": False}])
    assert rc == 1 and "figure" in text and "p99 convergence" in text and "targets missed: 1" in text, text
