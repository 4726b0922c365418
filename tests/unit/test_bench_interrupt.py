"""Ctrl-C (or SIGTERM) in a long `railover bench` run keeps what was measured: the suite's
finished parts are written as ``<suite>.json`` marked ``interrupted``, the exit status is 130
(143 for SIGTERM, re-raised), ``bench all`` still writes ``summary.md``, and ``bench report``
shows the partial report as such. Before, an interrupt lost the whole run (the JSON was only
written at the very end). The suites here are fakes that build a real :class:`Report`; what
is tested is the CLI's handling of the interrupt, not a benchmark."""
from __future__ import annotations

import json
import os
import signal
import types

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from railover.bench import cli as bench_cli
from railover.bench import common as C
from railover.cli import app

from cli_text import text


def _fake_suite(interrupt_with=None, parts=1):
    """A suite module whose run() finishes ``parts`` parts (0 or 1: "port-down") and then is
    interrupted by ``interrupt_with`` (an exception instance, or a signal number sent to this
    process), or completes when it is None."""

    def run(out, quick=False, console=None, **kw):
        rep = C.Report(suite_name["name"], out, quick, {"faults_per_kind": 3})
        per_kind = {}
        rep.results["kinds"] = per_kind
        if parts:
            per_kind["port-down"] = {"faults": 3, "convergence_ms": {"p50": 4.0}}
        rep.add_wrong(0)
        if isinstance(interrupt_with, int):
            os.kill(os.getpid(), interrupt_with)  # a real signal, with no test bed up
            raise AssertionError("the signal did not unwind")
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


@pytest.mark.parametrize("sig,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
def test_a_real_sigterm_or_sighup_with_no_test_bed_up_keeps_the_partial_report(tmp_path, suites, sig, name):
    """Outside a test bed (between beds, while plotting) SIGTERM and SIGHUP had their default
    action: the process died at once and the measured parts were lost."""
    suites["failover"] = _fake_suite(int(sig))
    inherited = signal.signal(sig, signal.SIG_DFL)  # as in a shell (nohup would ignore SIGHUP: below)
    try:
        with pytest.raises(SystemExit) as ex:
            bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))
        assert signal.getsignal(sig) == signal.SIG_DFL, "the handler is restored"
    finally:
        signal.signal(sig, inherited)
    assert ex.value.code == 128 + sig
    data = json.loads((tmp_path / "failover.json").read_text())
    assert data["interrupted"] == name and list(data["results"]["kinds"]) == ["port-down"]


def test_an_ignored_sighup_stays_ignored(tmp_path, suites):
    """Under nohup SIGHUP is ignored: the suite must go on, not unwind (found when the CI
    pre-check, started with nohup, ran the test above without resetting SIGHUP)."""
    from railover._cliutil import signals_unwind
    inherited = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_unwind():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # nothing happens
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_an_interrupted_rerun_with_nothing_finished_leaves_the_earlier_report_alone(tmp_path, suites):
    suites["failover"] = _fake_suite(None)
    bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))
    complete = (tmp_path / "failover.json").read_text()
    suites["failover"] = _fake_suite(KeyboardInterrupt(), parts=0)
    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit):
        bench_cli._run_suite("failover", tmp_path, True, console)
    assert (tmp_path / "failover.json").read_text() == complete
    said = console.export_text()
    assert "before any part finished" in said and "is left as it was" in said, said


def test_an_interrupted_rerun_with_a_part_keeps_the_earlier_complete_report_beside_it(tmp_path, suites):
    suites["failover"] = _fake_suite(None)
    bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))
    complete = (tmp_path / "failover.json").read_text()
    suites["failover"] = _fake_suite(KeyboardInterrupt())
    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit):
        bench_cli._run_suite("failover", tmp_path, True, console)
    assert (tmp_path / "failover.prev.json").read_text() == complete
    assert json.loads((tmp_path / "failover.json").read_text())["interrupted"] == "SIGINT"
    assert "the earlier complete report is kept as" in console.export_text()
    assert not list(tmp_path.glob(".*.tmp")), "written through a temporary file, renamed"


def test_an_interrupt_after_the_report_was_written_says_it_is_complete(tmp_path, suites):
    def run(out, quick=False, console=None, **kw):
        rep = C.Report("failover", out, quick, {})
        rep.results["kinds"] = {"port-down": {"faults": 3}}
        rep.finish()
        raise KeyboardInterrupt  # e.g. while the tables are printed
    suites["failover"] = types.SimpleNamespace(run=run)
    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit):
        bench_cli._run_suite("failover", tmp_path, True, console)
    assert "interrupted (SIGINT) after its report was written" in console.export_text()
    assert "interrupted" not in json.loads((tmp_path / "failover.json").read_text())


def test_the_summary_lists_an_interrupted_suite_among_the_targets_missed(tmp_path, suites):
    suites["failover"] = _fake_suite(KeyboardInterrupt())
    with pytest.raises(typer.Exit):
        bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))
    md = bench_cli.summary_markdown(tmp_path)
    missed = md.split("### Targets missed")[1].split("###")[0]
    assert "None." not in missed
    assert "failover: interrupted (SIGINT)" in missed and "not a full run" in missed


def test_bench_all_on_sigterm_still_writes_the_summary(tmp_path, suites):
    done = _fake_suite(None)
    done.suite_name["name"] = "healthy"
    suites["healthy"] = done
    suites["failover"] = _fake_suite(int(signal.SIGTERM))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["bench", "all", "--suites", "healthy,failover", "--out", str(out)])
    assert r.exit_code == 143, r.output
    assert "(**interrupted**, SIGTERM)" in (out / "summary.md").read_text()


def test_paths_with_brackets_are_printed_as_they_are(tmp_path, suites):
    suites["failover"] = _fake_suite(KeyboardInterrupt())
    out = tmp_path / "job [bold]x"
    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit):
        bench_cli._run_suite("failover", out, True, console)
    assert str(out / "failover.json") in console.export_text()


def test_a_file_error_while_stopping_is_a_clear_error_not_a_traceback(tmp_path, suites):
    """The output directory removed under a running suite, then Ctrl-C: the cleanup's
    FileNotFoundError used to escape as a traceback (exit 1) and hide the interrupt."""
    def run(out, quick=False, console=None, **kw):
        rep = C.Report("failover", out, quick, {})
        rep.results["kinds"] = {"port-down": {"faults": 3}}
        try:
            raise KeyboardInterrupt
        finally:
            open(tmp_path / "gone" / "stop", "w")  # the cleanup fails
    suites["failover"] = types.SimpleNamespace(run=run)
    console = Console(record=True, width=300)
    with pytest.raises(typer.Exit) as ex:
        bench_cli._run_suite("failover", tmp_path / "out", True, console)
    assert ex.value.exit_code == 2
    said = console.export_text()
    assert "failover could not stop cleanly after Ctrl-C" in said and "No such file or directory" in said
    assert json.loads((tmp_path / "out" / "failover.json").read_text())["interrupted"] == "SIGINT"


def test_another_file_error_is_left_to_the_entry_point(tmp_path, suites):
    def run(out, quick=False, console=None, **kw):
        raise FileNotFoundError(2, "No such file or directory", "libnccl-net-railover.so")
    suites["failover"] = types.SimpleNamespace(run=run)
    with pytest.raises(FileNotFoundError):
        bench_cli._run_suite("failover", tmp_path, True, Console(quiet=True))


def test_a_forked_child_that_inherits_the_handler_dies_instead_of_unwinding():
    """pyroute2 forks helpers and stops them with SIGTERM: the child must not raise SystemExit
    into the parent's code (its cleanup would run in the child)."""
    from railover._cliutil import signals_unwind
    with signals_unwind():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: tell the parent it is ready, then wait for its SIGTERM
            try:
                os.close(r)
                os.write(w, b"x")
                while True:
                    signal.pause()
            except BaseException:
                os._exit(99)  # unwound: the bug
        os.close(w)
        assert os.read(r, 1) == b"x"
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM


def test_a_report_names_the_plugin_variables_its_ranks_inherit(tmp_path, monkeypatch):
    """A bench run under, say, RAILOVER_HOLD_DOWN_MS=10000 (exported in the user's shell) gave
    every rank that hold-down, while the report said "plugin defaults". The report now lists
    the plugin variables the ranks inherit, and the summary shows them; the variables the bench
    sets for every rank itself (NICs, journal, state dir, the bed's transport) and the ones the
    plugin does not read are left out."""
    monkeypatch.setenv("RAILOVER_HOLD_DOWN_MS", "10000")
    monkeypatch.setenv("RAILOVER_IFNAMES", "eth")          # the bench sets its own
    monkeypatch.setenv("RAILOVER_TRANSPORT", "rdma")       # the bed's (BED_ENV)
    monkeypatch.setenv("RAILOVER_PROBE_INTERVAL_MS", " ")  # blank: unset
    monkeypatch.setenv("RAILOVER_NOT_A_VARIABLE", "1")
    assert C.inherited_plugin_env() == {"RAILOVER_HOLD_DOWN_MS": "10000"}
    rep = C.Report("failover", tmp_path, True, {})
    rep.results["kinds"] = {}
    rep.finish()
    data = json.loads((tmp_path / "failover.json").read_text())
    assert data["inherited_env"] == {"RAILOVER_HOLD_DOWN_MS": "10000"}
    monkeypatch.setattr(bench_cli, "_markdown", lambda suite: (lambda r: "(tables)\n"))  # the suite's own tables aside
    assert "`RAILOVER_HOLD_DOWN_MS=10000`" in bench_cli.summary_markdown(tmp_path)
    # the RDMA bed's ranks run in QEMU guests and inherit nothing from this process
    assert C.Report("rdma", tmp_path / "r", True, {}).data["inherited_env"] == {}
    monkeypatch.delenv("RAILOVER_HOLD_DOWN_MS")
    assert C.Report("failover", tmp_path / "b", True, {}).data["inherited_env"] == {}


def test_suites_wait_out_and_space_faults_by_the_hold_down_their_ranks_inherit():
    """The peers comparison spaced its faults 5 s after each failback and the degraded suite
    waited 3.5 s for comms to settle, both sized for the default 3 s hold-down; under an
    inherited RAILOVER_HOLD_DOWN_MS=10000 the next fault was a flap (the hold-down doubled for
    the cycles after it) and the settle ended before the comms had failed back. Both now ask
    plugin_hold_down_s: the inherited value, else the parameter table's default."""
    assert C.plugin_hold_down_s({}) == 3.0
    assert C.plugin_hold_down_s({"RAILOVER_HOLD_DOWN_MS": "10000"}) == 10.0
    assert C.plugin_hold_down_s({"RAILOVER_HOLD_DOWN_MS": " 250 "}) == 0.25
    assert C.plugin_hold_down_s({"RAILOVER_HOLD_DOWN_MS": " "}) == 3.0  # blank: unset
    from railover.bench.failover import peer_spacing_s
    assert peer_spacing_s({}) == 5.0
    assert peer_spacing_s({"RAILOVER_HOLD_DOWN_MS": "10000"}) == 12.0


def test_the_variables_the_bench_sets_itself_are_those_rank_env_sets(tmp_path):
    """inherited_plugin_env leaves out what every bed rank gets from rank_env; that list
    (RANK_VARS and BED_ENV) must stay the one rank_env really sets."""
    from railover.testbed import scenario as S
    tb = types.SimpleNamespace(hosts=[types.SimpleNamespace(nics=[types.SimpleNamespace(ifname="a0")])])
    assert set(S.rank_env(tb, 0, tmp_path / "j.jsonl")) == set(S.RANK_VARS) | set(S.BED_ENV)
