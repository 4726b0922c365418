"""railover.ops.state: parsing state files, staleness, journals, summaries, `railover status`."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railover.ops import state as st
from railover.cli import app

from ops_fixtures import append_events, comm, rdma_port, state, write_proc, write_state
from cli_text import text


def test_live_file_is_read_with_its_rank(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 4242, 777, {"RANK": "3", "PATH": "/bin"})
    f = write_state(tmp_path / "s", state(4242, 777, [comm("1")]))
    s = st.read_state_file(f, proc)
    assert not s.stale and s.stale_reason == ""
    assert s.rank == "3" and s.label == "rank 3"
    assert s.key == (4242, 777) and s.host == "node1"
    assert [n["name"] for n in s.nics] == ["eth0", "eth1"]


def test_rank_falls_back_to_other_launchers_and_to_unknown(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 1, 5, {"SLURM_PROCID": "7"})
    write_proc(proc, 2, 5, {"OMPI_COMM_WORLD_RANK": "2", "SLURM_PROCID": "9"})
    write_proc(proc, 3, 5, {"RANK": "not-a-number"})
    write_proc(proc, 4, 5)  # environ unreadable/missing
    assert st.process_rank(1, proc) == "7"
    assert st.process_rank(2, proc) == "2"
    assert st.process_rank(3, proc) is None
    assert st.process_rank(4, proc) is None


def test_exited_process_is_stale(tmp_path):
    f = write_state(tmp_path / "s", state(4243, 777, [comm("1")]))
    s = st.read_state_file(f, tmp_path / "proc")
    assert s.stale and "4243 has exited" in s.stale_reason
    assert s.rank is None


def test_reused_pid_is_stale(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 4244, 999)  # same pid, started later: another process
    s = st.read_state_file(write_state(tmp_path / "s", state(4244, 777, [])), proc)
    assert s.stale and "another process" in s.stale_reason and "999 != 777" in s.stale_reason


def test_staleness_against_the_real_procfs(tmp_path):
    me = os.getpid()
    start = st.proc_start_time(me)
    assert start is not None and start > 0
    live = st.read_state_file(write_state(tmp_path, state(me, start, [])))
    wrong = st.read_state_file(write_state(tmp_path / "b", state(me, start + 1, [])))
    assert not live.stale and wrong.stale


@pytest.mark.parametrize("content,msg", [
    ("{not json", "not valid JSON"),
    (json.dumps({"version": 2, "pid": 1}), "schema version 2"),
    (json.dumps({"version": 1, "pid": 1, "nics": [], "comms": []}), "'totals' missing"),
    (json.dumps([1, 2]), "not a JSON object"),
])
def test_bad_files_raise_a_clear_error(tmp_path, content, msg):
    f = tmp_path / "railover-1.json"
    f.write_text(content)
    with pytest.raises(st.StateFileError) as ei:
        st.read_state_file(f, tmp_path / "proc")
    assert msg in str(ei.value) and str(f) in str(ei.value)


def test_read_dirs_collects_errors_and_ignores_other_files(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 10, 1)
    d = tmp_path / "s"
    write_state(d, state(10, 1, [comm("1")]))
    write_state(d, state(11, 1, []))                  # stale
    (d / "railover-12.json").write_text("garbage")    # unreadable
    (d / "railover-13.json.tmp").write_text("{}")     # a write in progress: not a state file
    (d / "other.json").write_text("{}")
    states, errors = st.read_state_dirs([d, tmp_path / "missing"], proc)
    assert [(s.pid, s.stale) for s in states] == [(10, False), (11, True)]
    assert len(errors) == 1 and "railover-12.json" in errors[0]


def test_prune_removes_only_stale_files(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 10, 1)
    d = tmp_path / "s"
    keep = write_state(d, state(10, 1, []))
    gone = write_state(d, state(11, 1, []))
    assert st.prune_stale([d], proc) == [gone]
    assert keep.exists() and not gone.exists()


def test_default_state_dirs_follow_the_plugin_rules(tmp_path):
    assert st.default_state_dirs({"RAILOVER_STATE_DIR": str(tmp_path)}) == [tmp_path]
    assert st.default_state_dirs({"RAILOVER_STATE_DIR": "off"}) == []   # "off" turns the writer off
    # Empty is the same as unset (one rule for every variable): the plugin's default directories.
    assert st.default_state_dirs({"RAILOVER_STATE_DIR": ""}) == st.default_state_dirs({})
    dirs = st.default_state_dirs({})
    assert dirs[0] == Path("/run/railover")
    assert all(p.name.startswith("railover-") for p in dirs[1:])


def test_journal_tail_returns_each_complete_line_once(tmp_path):
    j = tmp_path / "j.jsonl"
    append_events(j, [{"t_us": 5, "pid": 1, "event": "nic_down", "nic": "eth0"}], partial='{"t_us": 6, "pid"')
    tail = st.JournalTail()
    assert [e["event"] for e in tail.poll([j])] == ["nic_down"]
    assert tail.poll([j]) == []                     # partial line not yet complete
    with open(j, "a") as f:
        f.write(': 1, "event": "failover", "comm": "9"}\n')
    got = tail.poll([j])
    assert [(e["t_us"], e["event"]) for e in got] == [(6, "failover")]
    j.write_text(json.dumps({"t_us": 1, "pid": 2, "event": "nic_up"}) + "\n")   # truncated and rewritten
    assert [e["event"] for e in tail.poll([j])] == ["nic_up"]


def test_journal_files_resolve_pid_patterns_and_directories(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 21, 1)
    write_proc(proc, 22, 1)
    jd = tmp_path / "jdir"
    jd.mkdir()
    (jd / "railover-21.jsonl").write_text("")
    (tmp_path / "ev-22.jsonl").write_text("")
    (tmp_path / "extra.jsonl").write_text("")
    d = tmp_path / "s"
    write_state(d, state(21, 1, [], event_log=str(jd)))
    write_state(d, state(22, 1, [], event_log=str(tmp_path / "ev-%p.jsonl")))
    states, _ = st.read_state_dirs([d], proc)
    files = st.journal_files(states, [tmp_path / "extra.jsonl", tmp_path / "nothing.jsonl"])
    assert files == [jd / "railover-21.jsonl", tmp_path / "ev-22.jsonl", tmp_path / "extra.jsonl"]


def test_comm_health_words():
    assert st.comm_health(comm("1")) == "ok"
    assert st.comm_health(comm("1", active="eth1")) == "failed-over"
    assert st.comm_health(comm("1", fatal=True)) == "fatal"
    lonely = comm("1", paths=[{"nic": "eth0", "peer": "p", "state": "active"}, {"nic": "eth1", "peer": "q", "state": "failed"}])
    assert st.comm_health(lonely) == "unprotected"
    assert st.comm_health(comm("1", active="")) == "down"


def test_snapshot_summarises_nics_comms_and_events(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 31, 1, {"RANK": "0"})
    j = tmp_path / "ev.jsonl"
    now = st.now_us()
    append_events(j, [{"t_us": now - 2_000_000, "pid": 31, "event": "nic_down", "nic": "eth0", "signal": "carrier lost"},
                      {"t_us": now - 1_999_000, "pid": 31, "event": "failover", "comm": "7", "to_nic": "eth1",
                       "peer": "10.0.1.2", "convergence_us": 800, "bytes_resent": 4096}])
    d = tmp_path / "s"
    write_state(d, state(31, 1, [comm("7", active="eth1", failovers=1, resent=4096), comm("8", dir_="recv")],
                         event_log=str(j), nic_up={"eth0": False}))
    write_state(d, state(32, 1, [comm("9", failovers=5)]))  # stale: not in totals
    snap = st.snapshot([d], events=10, proc=proc)
    assert snap["totals"]["processes"] == 1 and snap["totals"]["stale_processes"] == 1
    assert snap["totals"]["failovers"] == 1 and snap["totals"]["failed_over"] == 1
    nics = {n["name"]: n for n in snap["hosts"]["node1"]["nics"]}
    assert nics["eth0"]["up"] is False and nics["eth0"]["pairs_down"] == ["10.0.0.2"]
    assert nics["eth1"]["active"] == 1 and nics["eth0"]["active"] == 1   # comm 7 on eth1, comm 8 on eth0
    assert nics["eth0"]["failed"] == 1 and nics["eth1"]["standby"] == 1
    assert [e["event"] for e in snap["events"]] == ["nic_down", "failover"]
    assert 1.9 <= snap["events"][0]["age_s"] <= 60 and snap["events"][0]["rank"] == "0"
    assert "convergence=0.8ms" in st.format_event(snap["events"][1])


def test_routine_path_transitions_do_not_crowd_out_failovers(tmp_path):
    """Every path transition is journaled (path_state); status's recent events leave them out
    unless asked, so the last lines still show the failover."""
    proc = tmp_path / "proc"
    write_proc(proc, 31, 1, {"RANK": "0"})
    j = tmp_path / "ev.jsonl"
    now = st.now_us()
    evs = [{"t_us": now - 3_000_000, "pid": 31, "event": "failover", "comm": "7", "to_nic": "eth1",
            "peer": "10.0.1.2", "convergence_us": 800, "bytes_resent": 0}]
    evs += [{"t_us": now - 2_000_000 + k, "pid": 31, "event": "path_state", "comm": str(100 + k), "dir": "send",
             "nic": "eth0", "peer": "10.0.0.2", "from": "connecting", "to": "standby", "reason": "connected"}
            for k in range(30)]
    append_events(j, evs)
    d = tmp_path / "s"
    write_state(d, state(31, 1, [comm("7", active="eth1", failovers=1)], event_log=str(j)))
    snap = st.snapshot([d], events=5, proc=proc)
    assert [e["event"] for e in snap["events"]] == ["failover"]
    snap = st.snapshot([d], events=5, proc=proc, all_events=True)
    assert [e["event"] for e in snap["events"]] == ["path_state"] * 5


def test_status_cli_table_and_json(tmp_path, monkeypatch):
    me = os.getpid()
    d = tmp_path / "s"
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "pid": me, "event": "failover", "comm": "7", "to_nic": "eth1",
                       "peer": "10.0.1.2", "convergence_us": 800, "bytes_resent": 0}])
    write_state(d, state(me, st.proc_start_time(me), [comm("7", active="eth1", failovers=1)], event_log=str(j)))
    write_state(d, state(1 << 22, 1, []))
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    procs = doc["hosts"]["node1"]["processes"]
    assert [p["stale"] for p in procs] == [False, True]
    assert procs[0]["comms"][0]["health"] == "failed-over"
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)])
    assert r.exit_code == 0, r.output
    for text in ("eth0", "eth1", "failed-over", "failover", "stale state file", "has exited"):
        assert text in r.output, r.output
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d), "--prune"])
    assert r.exit_code == 0 and not (d / f"railover-{1 << 22}.json").exists()


# --------------------------------------------------------------------------- bad input (no traceback)

def _live(tmp_path, **over):
    """A state file of this very process (live), with fields replaced by ``over``."""
    me = os.getpid()
    s = state(me, st.proc_start_time(me), [comm("7")])
    s.update(over)
    return s


def test_a_non_utf8_state_file_is_reported_and_skipped(tmp_path):
    d = tmp_path / "s"
    write_state(d, _live(tmp_path))
    (d / "railover-115.json").write_bytes(b"\xff\xfe")
    with pytest.raises(st.StateFileError, match="not UTF-8 text") as ei:
        st.read_state_file(d / "railover-115.json", tmp_path / "proc")
    assert "railover-115.json" in str(ei.value)
    states, errors = st.read_state_dirs([d])
    assert [s.pid for s in states] == [os.getpid()]
    assert len(errors) == 1 and "railover-115.json" in errors[0] and "not UTF-8" in errors[0]
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "railover-115.json" in r.output and "not UTF-8" in r.output


@pytest.mark.parametrize("over,field", [
    ({"comms": [{"id": 5}]}, "'comms[0].dir' missing"),
    ({"comms": [dict(comm("7"), active_nic=None)]}, "'comms[0].active_nic' is not a string"),
    ({"comms": [dict(comm("7"), paths=[{"state": "active"}])]}, "'comms[0].paths[0].nic' missing"),
    ({"comms": ["x"]}, "comms[0] is not an object"),
    ({"totals": {"failovers": "many"}}, "'totals.failovers' is not an integer (got \"many\")"),
    ({"totals": {"flaps": True}}, "'totals.flaps' is not an integer"),
    ({"nics": [{"addr": "10.0.0.1"}]}, "'nics[0].name' missing"),
    ({"nics": [{"name": "eth0", "rail": "zero"}]}, "'nics[0].rail' is not an integer or null"),
    ({"pairs": [{"nic": "eth0", "peer": 7}]}, "'pairs[0].peer' is not a string"),
    ({"pid": "12"}, "'pid' is not an integer"),
    # negative counters (a corrupt file) used to be shown as they were: "failovers -3"
    ({"totals": {"failovers": -3}}, "'totals.failovers' is negative (got -3)"),
    ({"comms": [dict(comm("7"), failovers=-3)]}, "'comms[0].failovers' is negative (got -3)"),
    ({"comms": [dict(comm("7"), last_convergence_us=-1)]}, "'comms[0].last_convergence_us' is negative"),
])
def test_bad_nested_fields_name_the_field_and_status_skips_the_file(tmp_path, over, field):
    d = tmp_path / "s"
    f = write_state(d, _live(tmp_path, **over))
    with pytest.raises(st.StateFileError) as ei:
        st.read_state_file(f)
    assert field in str(ei.value) and str(f) in str(ei.value)
    snap = st.snapshot([d])
    assert snap["hosts"] == {} and len(snap["errors"]) == 1 and field in snap["errors"][0]
    for argv in (["status", "--state-dir", str(d)], ["status", "--state-dir", str(d), "--json"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0 and r.exception is None, r.output
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)])
    out = " ".join(r.output.split())
    assert "1 could not be read" in out and "no railover state files found" not in out, out


def test_type_names_read_as_english(tmp_path):
    f = tmp_path / "railover-1.json"
    f.write_text(json.dumps({"version": 1, "pid": 1.5, "nics": [], "comms": [], "totals": {}}))
    with pytest.raises(st.StateFileError) as ei:
        st.read_state_file(f, tmp_path / "proc")
    assert "'pid' is not an integer" in str(ei.value) and "a int" not in str(ei.value)


def test_names_that_look_like_rich_markup_are_shown_as_they_are(tmp_path):
    """A NIC, host or journal value holding '[' was read as rich markup: a journal line with
    nic "x[/]" ended `railover status --journal` in a MarkupError traceback, and a NIC named
    "l[red]o" (or an interface "e[red]x" in doctor) was shown as "lo" ("ex"), a name the
    operator would then put in RAILOVER_IFNAMES (found by a fresh-user trial)."""
    from railover.ops import doctor as dr
    from railover.ops.cli import render_doctor
    from rich.console import Console
    d = tmp_path / "s"
    s = _live(tmp_path, host="n[bold]1")
    s["nics"][0]["name"] = "l[red]o"
    write_state(d, s)
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "pid": 1, "event": "nic_down", "nic": "x[/]", "signal": "carrier"}])
    out = _status(["--state-dir", str(d), "--journal", str(j)], env={"COLUMNS": "250"})
    for name in ("l[red]o", "host n[bold]1: NICs", "x[/]"):
        assert name in out, out
    facts = dr.Facts(env={"RAILOVER_IFNAMES": "e"}, ifaces=[dr.Iface("e[red]x", 2, ["10.0.0.1/24"])],
                     plugin={"path": "/x.so", "loaded": False, "error": "no such file", "abi": [], "collnet": [],
                             "foreign": []}, torch=None, ld_resolve=None)
    con = Console(width=250, record=True, file=open(os.devnull, "w"))
    con.print(render_doctor(dr.diagnose(facts, route=lambda dst, src: ("e[red]x", ""), probe=lambda *a: (True, ""))))
    assert "e[red]x" in con.export_text(), con.export_text()


def _status(argv, env=None):
    r = CliRunner().invoke(app, ["status"] + argv, env=env)
    assert r.exit_code == 0 and r.exception is None, r.output
    return " ".join(r.output.split())


def test_status_warns_about_a_missing_journal_and_railover_state_dir(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    out = _status(["--state-dir", str(d), "--journal", str(tmp_path / "nope.jsonl")])
    assert f"journal {tmp_path / 'nope.jsonl'} does not exist" in out, out
    out = _status([], env={"RAILOVER_STATE_DIR": str(tmp_path / "gone")})
    assert f"state dir {tmp_path / 'gone'} does not exist" in out, out
    out = _status(["--state-dir", str(d)])   # exists, no job running: not an error
    assert "warning" not in out and "no railover state files found" in out


@pytest.mark.parametrize("extra", [[], ["--json"], ["--comms"], ["--state-dir", "."]])
def test_status_refuses_a_state_dir_given_that_is_missing_or_a_file(tmp_path, extra):
    """An explicit --state-dir that does not exist was a warning and exit 0 ("no railover state
    files found"): a typo read as "nothing runs here"."""
    f = tmp_path / "afile"
    f.write_text("x")
    for given, why in ((tmp_path / "nope", "no such directory"), (f, "not a directory")):
        r = CliRunner().invoke(app, ["status", "--state-dir", str(given)] + extra)
        assert r.exit_code == 2, (given, r.output)
        assert f"Invalid value for '--state-dir': {given}: {why}" in text(r), text(r)
        assert "Traceback" not in r.output and "state dirs:" not in r.output, r.output


def test_status_on_a_host_where_no_job_ever_ran_is_exit_0(tmp_path, monkeypatch):
    """The default directories are missing until a railover job runs: not an error."""
    monkeypatch.setattr(st, "default_state_dirs", lambda env=None: [tmp_path / "run-railover"])
    out = _status([], env={"RAILOVER_STATE_DIR": ""})
    assert "warning" not in out and "no railover state files found" in out, out


def test_status_with_state_files_off_says_so(tmp_path):
    out = _status([], env={"RAILOVER_STATE_DIR": "off"})
    assert "state files are off (RAILOVER_STATE_DIR=off)" in out, out
    assert "is RAILOVER_STATE_DIR the same" not in out


def test_status_text_reports_skipped_journal_lines(tmp_path):
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "pid": 1, "event": "nic_down", "nic": "eth0", "signal": "x"}])
    with open(j, "a") as fh:
        fh.write("garbage\n{\"half\": \n")
    d = tmp_path / "s"
    write_state(d, _live(tmp_path, event_log=str(j)))
    snap = st.snapshot([d])
    assert snap["journal"]["garbled"] == 2
    out = _status(["--state-dir", str(d)])
    assert "journal lines skipped (partial, not a JSON event, or a field of the wrong type): 2" in out, out


@pytest.mark.parametrize("pid", [[1], {"n": 1}, "1", True, 1.5])
def test_a_journal_line_whose_pid_is_not_an_integer_is_skipped_not_a_traceback(tmp_path, pid):
    """A journal line whose pid was a list or an object (garbled, or hand-edited) made
    `railover status` end in a traceback (unhashable type: 'list') on every run; it is an
    unreadable line, as one that is not JSON."""
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "pid": pid, "event": "nic_down", "nic": "eth0", "signal": "x"},
                      {"t_us": st.now_us(), "pid": 7, "event": "nic_down", "nic": "eth1", "signal": "y"}])
    d = tmp_path / "s"
    write_state(d, _live(tmp_path, event_log=str(j)))
    snap = st.snapshot([d])
    assert snap["journal"]["garbled"] == 1
    assert [e["nic"] for e in snap["events"]] == ["eth1"]
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.exception is None, r.output
    assert "journal lines skipped (partial, not a JSON event, or a field of the wrong type): 1" in r.output, r.output


@pytest.mark.parametrize("argv", [["--events", "-1"], ["--events=-5", "--json"]])
def test_status_refuses_a_negative_event_count(tmp_path, argv):
    from railover.cli import app
    r = CliRunner().invoke(app, ["status", "--state-dir", str(tmp_path)] + argv)
    assert r.exit_code == 2, r.output
    assert "--events" in r.output and "Traceback" not in r.output, r.output


def test_status_shows_an_event_without_a_pid_as_absent(tmp_path):
    """A journal event without a pid was shown as "pid None"."""
    me = os.getpid()
    d = tmp_path / "s"
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "event": "failover", "comm": "7", "to_nic": "eth1",
                       "peer": "10.0.1.2", "convergence_us": 800, "bytes_resent": 0}])
    write_state(d, state(me, st.proc_start_time(me), [comm("7", active="eth1", failovers=1)], event_log=str(j)))
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d), "--journal", str(j)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "recent events" in r.output and "convergence=0.8ms" in r.output and "None" not in r.output, r.output


def test_a_journal_from_another_clock_gets_ages_from_its_file_time(tmp_path):
    """A journal written on another host or boot (a QEMU guest's, read on its host): its t_us
    are another CLOCK_MONOTONIC, so ages are taken from the file's modification time (the last
    event) and the journal's own spacing, and marked; a same-clock journal keeps t_us ages."""
    import os
    import time
    guest = tmp_path / "guest.jsonl"
    # a guest booted 40 s ago: its clock is far behind this host's (whose uptime is larger)
    append_events(guest, [{"t_us": 30_000_000, "pid": 7, "event": "nic_down", "nic": "eth1", "signal": "carrier lost"},
                          {"t_us": 33_000_000, "pid": 7, "event": "nic_up", "nic": "eth1", "signal": "carrier",
                           "neigh_cleared": 0}])
    t = time.time() - 5  # the last line was written 5 s ago
    os.utime(guest, (t, t))
    host = tmp_path / "host.jsonl"
    now = st.now_us()
    append_events(host, [{"t_us": now - 1_000_000, "pid": 8, "event": "nic_down", "nic": "eth0",
                          "signal": "carrier lost"}])
    snap = st.snapshot([tmp_path / "nostate"], journals=[guest, host], events=10, proc=tmp_path / "proc")
    ev = {(e["journal"], e["event"]): e for e in snap["events"]}
    g_down, g_up = ev[(str(guest), "nic_down")], ev[(str(guest), "nic_up")]
    assert 4.0 <= g_up["age_s"] <= 60 and g_up["age_from"] == "file time", g_up
    assert abs(g_down["age_s"] - g_up["age_s"] - 3.0) < 0.01, (g_down, g_up)
    h = ev[(str(host), "nic_down")]
    assert 0.9 <= h["age_s"] <= 60 and "age_from" not in h, h


# --------------------------------------------------------------------------- RDMA port per NIC

def _rdma_state(me: int, **kw):
    """A live RDMA process: eth0 on RoCE mlx5_0 port 1 (ACTIVE, GID 3), eth1 on InfiniBand
    mlx5_1 port 1 (not ACTIVE, LID 17)."""
    return state(me, st.proc_start_time(me), [comm("7")], transport="rdma",
                 rdma={"eth0": rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1"),
                       "eth1": rdma_port("mlx5_1", ib=True, lid=17, active=False)}, **kw)


def _wide_status(monkeypatch, argv):
    """`railover status` text on a console wide enough for every column (rich cuts no_wrap
    columns short on a narrow one)."""
    from rich.console import Console
    from railover.ops import cli as ops_cli
    monkeypatch.setattr(ops_cli, "_console", Console(width=220))
    return _status(argv)


def test_status_shows_the_hca_port_its_state_and_gid_or_lid_of_rdma_nics(tmp_path, monkeypatch):
    me = os.getpid()
    d = tmp_path / "s"
    write_state(d, _rdma_state(me))
    out = _wide_status(monkeypatch, ["--state-dir", str(d)])
    for want in ("HCA port", "GID / LID", "mlx5_0:1 ACTIVE", "GID 3 ::ffff:10.0.0.1", "mlx5_1:1 not ACTIVE",
                 "LID 17"):
        assert want in out, out
    assert "mlx5_1:1 ACTIVE" not in out, out
    # --json: the NIC rows carry the object (as the first process gives it), the processes the file as given
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    rows = {n["name"]: n for n in doc["hosts"]["node1"]["nics"]}
    assert rows["eth0"]["rdma"] == rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1")
    assert rows["eth1"]["rdma"] == {"hca": "mlx5_1", "port": 1, "link_layer": "InfiniBand", "port_active": False,
                                    "gid_index": -1, "gid": "", "lid": 17, "mtu": 4096,
                                    "why": "mlx5_1 port 1: InfiniBand, LID 17"}
    nics = doc["hosts"]["node1"]["processes"][0]["nics"]
    assert [n["rdma"]["hca"] for n in nics] == ["mlx5_0", "mlx5_1"]


def test_status_of_tcp_and_of_an_older_plugin_has_no_rdma_columns(tmp_path, monkeypatch):
    me = os.getpid()
    for name, kw in (("tcp", {"rdma": {}}), ("old", {})):   # rdma null per NIC; no "rdma" member at all
        d = tmp_path / name
        s = state(me, st.proc_start_time(me), [comm("7")], **kw)
        assert all(("rdma" in n) == (name == "tcp") for n in s["nics"])
        write_state(d, s)
        out = _wide_status(monkeypatch, ["--state-dir", str(d)])
        assert "eth0" in out and "HCA port" not in out and "GID / LID" not in out, out
        snap = st.snapshot([d])
        assert [n["rdma"] for n in snap["hosts"]["node1"]["nics"]] == [None, None]
        assert snap["errors"] == []


def test_status_of_a_mixed_process_names_the_nic_served_over_tcp(tmp_path, monkeypatch):
    """RAILOVER_TRANSPORT=rdma+tcp with an RDMA port behind eth0 only: the process runs "rdma+tcp",
    eth0 shows its HCA port and eth1, which the plugin serves over TCP, says so instead of a bare
    "-"; --json carries each NIC's transport."""
    me = os.getpid()
    d = tmp_path / "s"
    s = state(me, st.proc_start_time(me), [comm("7")], transport="rdma+tcp",
              rdma={"eth0": rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1")})
    s["nics"][0]["transport"], s["nics"][1]["transport"] = "rdma", "tcp"
    write_state(d, s)
    out = _wide_status(monkeypatch, ["--state-dir", str(d)])
    assert "mlx5_0:1 ACTIVE" in out and "tcp (no RDMA port)" in out and "rdma+tcp" in out, out
    snap = st.snapshot([d])
    assert snap["errors"] == []
    assert [(n["name"], n["transport"]) for n in snap["hosts"]["node1"]["nics"]] == [("eth0", "rdma"), ("eth1", "tcp")]
    # a NIC "transport" of the wrong type is named, as every other field
    s["nics"][1]["transport"] = 7
    write_state(d, s)
    assert "nics[1].transport" in " ".join(str(e) for e in st.snapshot([d])["errors"])


def test_a_nic_port_is_active_only_when_every_process_sees_it_active(tmp_path):
    proc, d = tmp_path / "proc", tmp_path / "s"
    write_proc(proc, 41, 1)
    write_proc(proc, 42, 1)
    write_proc(proc, 43, 1)
    write_state(d, state(41, 1, [], transport="rdma", rdma={"eth0": rdma_port("mlx5_0"), "eth1": rdma_port("mlx5_1")}))
    write_state(d, state(42, 1, [], transport="rdma",
                         rdma={"eth0": rdma_port("mlx5_0", active=False), "eth1": rdma_port("mlx5_1")}))
    write_state(d, state(43, 1, [], transport="tcp", rdma={}))   # a TCP process on the same NICs
    write_state(d, state(44, 1, [], transport="rdma",            # stale: not counted
                         rdma={"eth0": rdma_port("mlx5_0"), "eth1": rdma_port("mlx5_1", active=False)}))
    rows = {n["name"]: n for n in st.nic_summary(st.read_state_dirs([d], proc)[0])["node1"]}
    assert rows["eth0"]["rdma"]["port_active"] is False and rows["eth0"]["processes"] == 3
    assert rows["eth1"]["rdma"]["port_active"] is True
    assert st.rdma_port_text(rows["eth1"]["rdma"]) == ("mlx5_1:1", "GID 3 ::ffff:10.0.0.1")
    assert st.rdma_port_text(None) == ("-", "-")


@pytest.mark.parametrize("rdma,field", [
    ("mlx5_0", "'nics[0].rdma' is not an object or null"),
    ({"port": 1, "port_active": True}, "'nics[0].rdma.hca' missing"),
    ({"hca": "mlx5_0", "port": "1", "port_active": True}, "'nics[0].rdma.port' is not an integer"),
    ({"hca": "mlx5_0", "port": 1, "port_active": 1}, "'nics[0].rdma.port_active' is not true or false"),
    ({"hca": "mlx5_0", "port": 1, "port_active": True, "lid": None}, "'nics[0].rdma.lid' is not an integer"),
])
def test_a_bad_rdma_object_names_the_field(tmp_path, rdma, field):
    s = _live(tmp_path)
    s["nics"][0]["rdma"] = rdma
    f = write_state(tmp_path / "s", s)
    with pytest.raises(st.StateFileError) as ei:
        st.read_state_file(f)
    assert field in str(ei.value), str(ei.value)


def test_a_journal_time_beyond_a_float_s_range_is_shown_not_a_traceback(tmp_path):
    """A journal line (garbled, or hand-edited) whose convergence_us was an integer beyond a
    float's range ended `railover status` in an OverflowError traceback on every run (µs are
    shown in ms); the value is shown as it is, as a field that is no number."""
    j = tmp_path / "ev.jsonl"
    big = 10 ** 400
    append_events(j, [{"t_us": st.now_us(), "pid": 7, "event": "failover", "comm": "1", "to_nic": "eth1",
                       "peer": "10.0.0.2", "resumed_seq": 1, "bytes_resent": 0, "convergence_us": big}])
    assert f"convergence_us={big}" in st.format_event(json.loads(j.read_text()))
    d = tmp_path / "s"
    write_state(d, _live(tmp_path, event_log=str(j)))
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)


@pytest.mark.parametrize("bad", ['{"t_us": 1, "pid": 7, "event": "nic_down", "n": ' + "9" * 5000 + "}",
                                 "[" * 100000,
                                 '{"t_us": 1' + "0" * 400 + ', "pid": 7, "event": "nic_down", "nic": "eth0"}',
                                 '{"t_us": -1' + "0" * 400 + ', "pid": 7, "event": "nic_down", "nic": "eth0"}',
                                 '{"t_us": 9223372036854775808, "pid": 7, "event": "nic_down", "nic": "eth0"}',
                                 '{"t_us": true, "pid": 7, "event": "nic_down", "nic": "eth0"}'],
                         ids=["5000-digit-number", "nested-100000-deep", "t_us-10e400", "t_us-minus-10e400",
                              "t_us-2e63", "t_us-true"])
def test_a_journal_line_python_cannot_read_or_beyond_the_clock_is_skipped_not_a_traceback(tmp_path, bad):
    """A garbled journal line with a number of more than 4300 digits (ValueError from json),
    nested deeper than Python's recursion limit (RecursionError), or a t_us beyond the 64-bit
    µs clock (OverflowError computing its age) ended `railover status` in a traceback on every
    run, and made every scrape of the exporter fail; it is an unreadable line, as one that is
    not JSON."""
    from railover.ops import exporter as ex
    j = tmp_path / "ev.jsonl"
    append_events(j, [{"t_us": st.now_us(), "pid": 7, "event": "nic_down", "nic": "eth1", "signal": "y"}])
    with open(j, "a") as fh:
        fh.write(bad + "\n")
    d = tmp_path / "s"
    write_state(d, _live(tmp_path, event_log=str(j)))
    snap = st.snapshot([d])
    assert snap["journal"]["garbled"] == 1 and [e["nic"] for e in snap["events"]] == ["eth1"], snap["journal"]
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)
    assert "journal lines skipped (partial, not a JSON event, or a field of the wrong type): 1" in r.output, r.output
    col = ex.RailoverCollector([d], [])
    fams = {f.name: f for f in col.collect()}
    assert fams["railover_journal_unreadable_lines"].samples[0].value == 1


@pytest.mark.parametrize("what", ["totals.bytes_resent", "comms[0].bytes_resent", "comms[0].last_convergence_us",
                                  "5000-digit-number", "nested-100000-deep"])
def test_a_state_file_python_cannot_read_or_beyond_64_bits_is_unreadable_not_a_traceback(tmp_path, what):
    """A corrupt state file with an integer beyond 64 bits (OverflowError showing bytes in KiB
    or µs in seconds), a number of more than 4300 digits (ValueError from json) or nesting past
    the recursion limit (RecursionError) ended `railover status` in a traceback on every run and
    failed every exporter scrape; it is an unreadable file, reported as one, as a non-JSON file."""
    from railover.ops import exporter as ex
    d = tmp_path / "s"
    s = _live(tmp_path)
    s["comms"][0].update(failovers=1, active_nic="eth1")
    f = write_state(d, s)
    if what == "5000-digit-number":
        f.write_text(json.dumps(s)[:-1] + ', "x": ' + "9" * 5000 + "}")
    elif what == "nested-100000-deep":
        f.write_text("[" * 100000)
    else:
        obj, key = what.split(".")
        (s["totals"] if obj == "totals" else s["comms"][0])[key] = 10 ** 400
        f.write_text(json.dumps(s))
    snap = st.snapshot([d])
    assert len(snap["errors"]) == 1 and str(f) in snap["errors"][0] and not snap["hosts"], snap["errors"]
    r = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)
    assert "unreadable:" in r.output, r.output
    fams = {fm.name: fm for fm in ex.RailoverCollector([d], []).collect()}
    assert fams["railover_state_read_errors"].samples[0].value == 1


def test_a_64_bit_counter_is_read_and_shown(tmp_path):
    """The plugin's counters are unsigned 64-bit: the largest one is a valid value."""
    d = tmp_path / "s"
    s = _live(tmp_path)
    s["totals"]["bytes_resent"] = (1 << 64) - 1
    write_state(d, s)
    snap = st.snapshot([d])
    assert not snap["errors"] and snap["totals"]["bytes_resent"] == (1 << 64) - 1, snap["errors"]
    out = _status(["--state-dir", str(d)], env={"COLUMNS": "250"})
    assert "16777216.0 TiB" in out, out



@contextlib.contextmanager
def _as_another_user():
    """Read files as a user other than their owner: as root, with the effective uid of nobody
    (root reads every file); otherwise as this user (a mode 0000 denies the owner too)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def unsearchable_journal(tmp_path):
    """A live state file (this process) whose event_log is a journal directory the reader may
    not search (mode 0000; as a /var/log/railover made by root, mode 0700, is to the exporter's
    user): ``(state dir, journal path, reader)``, ``reader()`` a context in which this process
    reads as such a user (:func:`_as_another_user`). A real denial, not a fake."""
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="railover-perm-", dir="/tmp"))   # not under a 0700 TMPDIR or pytest's root
    secret = base / "logs"
    try:
        base.chmod(0o755)
        secret.mkdir()
        j = secret / f"railover-{os.getpid()}.jsonl"
        append_events(j, [{"t_us": st.now_us(), "pid": 7, "event": "nic_down", "nic": "eth1", "signal": "y"}])
        secret.chmod(0o000)
        d = base / "s"
        write_state(d, _live(tmp_path, event_log=str(secret) + "/"))
        d.chmod(0o755)

        yield d, j, _as_another_user
    finally:
        if secret.exists():
            secret.chmod(0o755)
        shutil.rmtree(base)


def test_a_journal_in_a_directory_the_reader_may_not_search_is_reported_not_a_traceback(unsearchable_journal):
    """A state file (mode 0640, readable by the exporter's group) whose event_log is a journal
    directory the reader may not search: pathlib's is_dir/is_file raise PermissionError there,
    and `railover status` ended in a traceback, every exporter scrape failed. The journal is
    left out, and status names it."""
    from railover.ops import exporter as ex
    d, j, reader = unsearchable_journal
    # loads every module the command imports lazily while it can (the interpreter's own
    # files may be out of nobody's reach: a pyenv under /root)
    CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
    with reader():
        snap = st.snapshot([d])
        r = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
        named = CliRunner().invoke(app, ["status", "--state-dir", str(d), "--journal", str(j)], env={"COLUMNS": "200"})
        fams = {fm.name: fm for fm in ex.RailoverCollector([d], []).collect()}
    assert snap["hosts"] and snap["errors"] == [f"journal {j}: Permission denied"], snap["errors"]
    for res in (r, named):
        assert res.exit_code == 0 and res.exception is None, (res.exception, res.output)
        out = " ".join(res.output.split())
        assert out.count(f"unreadable: journal {j}: Permission denied") == 1 and "does not exist" not in out, out
    assert fams["railover_processes"].samples


def test_a_drill_names_a_journal_it_may_not_read(unsearchable_journal, monkeypatch):
    """The drill read the journals after the NIC came back: a PermissionError traceback there;
    left out without a word, its report would read "no failover" for want of the journal."""
    from railover.ops import drill as dl
    d, j, reader = unsearchable_journal
    monkeypatch.setattr(dl, "link_admin_up", lambda nic, netns=None: True)
    monkeypatch.setattr(dl, "set_link", lambda nic, up, netns=None: None)
    said = []
    with reader():
        res = dl.run_drill("eth0", 0.01, state_dirs=[d], wait_failback_s=0, progress=said.append)
    assert f"warning: cannot read journal {j}: Permission denied" in said, said
    assert res.journals == []


def test_a_drill_that_cannot_read_the_state_files_says_so_not_that_no_process_runs(tmp_path, monkeypatch):
    """A state file of mode 0600 (another user's job) read by the drill's user: the drill
    refused with "no running railover process uses eth0", while status said the file was
    unreadable (found by a fresh-user trial). The refusal names the unread files."""
    import shutil
    import tempfile
    from railover.ops import drill as dl
    monkeypatch.setattr(dl, "link_admin_up", lambda nic, netns=None: True)
    base = Path(tempfile.mkdtemp(prefix="railover-perm-", dir="/tmp"))   # not under a 0700 TMPDIR or pytest's root
    d = base / "s"
    try:
        base.chmod(0o755)
        write_state(d, _live(tmp_path))
        d.chmod(0o755)
        f = next(d.glob("railover-*.json"))
        f.chmod(0o000 if os.geteuid() != 0 else 0o600)   # as root: owner root, read as nobody
        with _as_another_user():
            with pytest.raises(dl.DrillError) as ei:
                dl.run_drill("eth0", 0.01, state_dirs=[d], wait_failback_s=0)
        msg = str(ei.value)
        assert "could not be read" in msg and str(f) in msg and "Permission denied" in msg, msg
        assert "no running railover process" not in msg, msg
    finally:
        shutil.rmtree(base)


def test_a_state_dir_the_reader_may_not_list_is_reported_not_read_as_empty(tmp_path):
    """A state directory the reader may not list (docs: /run/railover of mode 2770, group
    railover; a user outside the group runs `railover status`) read as an empty one: "no
    railover state files found (is a job running?)", the exporter 0 processes, and nothing
    said why. It is named as unreadable. Run with a real denial (as root: the effective uid of
    nobody while reading)."""
    import shutil
    import tempfile
    from railover.ops import exporter as ex
    base = Path(tempfile.mkdtemp(prefix="railover-perm-", dir="/tmp"))   # not under a 0700 TMPDIR or pytest's root
    d = base / "run-railover"
    try:
        base.chmod(0o755)
        write_state(d, _live(tmp_path))
        d.chmod(0o000 if os.geteuid() != 0 else 0o700)   # as root: owner root, read as nobody
        env = {"RAILOVER_STATE_DIR": str(d), "COLUMNS": "200"}
        CliRunner().invoke(app, ["status"], env=env)   # loads what the command imports lazily, while it can
        with _as_another_user():
            snap = st.snapshot([d])
            r = CliRunner().invoke(app, ["status"], env=env)
            fams = {fm.name: fm for fm in ex.RailoverCollector([d], []).collect()}
        assert snap["errors"] == [f"{d}: Permission denied"], snap["errors"]
        assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)
        out = " ".join(r.output.split())
        assert f"unreadable: {d}: Permission denied" in out and "is a job running?" not in out, out
        assert fams["railover_state_read_errors"].samples[0].value == 1
    finally:
        d.chmod(0o755)
        shutil.rmtree(base)


def test_a_state_dir_inside_a_directory_the_user_may_not_search_is_named_not_a_traceback():
    """RAILOVER_STATE_DIR (or --state-dir, or RAILOVER_EVENT_LOG) inside a directory the user
    may not search (another user's home, mode 0700): Python 3.11's Path.exists()/is_dir()
    raise PermissionError there, and status, launch, the exporter and the drill ended in a
    traceback, doctor in "cannot inspect this host" with no report (found by a fresh-user
    trial). Each names the path and why. A real denial: as root, read as nobody."""
    import shutil
    import tempfile
    from railover import params
    from railover.ops import doctor as dr
    base = Path(tempfile.mkdtemp(prefix="railover-perm-", dir="/tmp"))   # not under a 0700 TMPDIR or pytest's root
    closed = base / "home"
    d = closed / "sd"
    try:
        base.chmod(0o755)
        d.mkdir(parents=True)
        closed.chmod(0o000 if os.geteuid() != 0 else 0o700)   # as root: owner root, searched as nobody
        env = {"RAILOVER_STATE_DIR": str(d), "COLUMNS": "200"}
        for argv in (["status"], ["status", "--state-dir", str(base / "nothing")],
                     ["drill", "--nic", "eth0", "--down-for", "1", "--yes"]):
            CliRunner().invoke(app, argv, env=env)   # loads what the command imports lazily, while it can
        # the parameter table, loaded while the plugin can be read (an installed one lies under
        # /root's pyenv, which nobody cannot search)
        native = params.load()
        with _as_another_user():
            assert st.path_kind(d) == ("unreachable", "Permission denied")
            assert st.path_kind(base / "nothing") == ("missing", "")
            r = CliRunner().invoke(app, ["status"], env=env)
            named = CliRunner().invoke(app, ["status", "--state-dir", str(d)], env={"COLUMNS": "200"})
            drill = CliRunner().invoke(app, ["drill", "--nic", "eth0", "--down-for", "1", "--yes"], env=env)
            problem = dr.state_dir_problem(d)
            checks = dr.validate_config({"RAILOVER_STATE_DIR": str(d), "RAILOVER_EVENT_LOG": str(d / "j.jsonl")}, native)
        said = f"state dir {d} cannot be looked at (Permission denied)"
        assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)
        assert said in " ".join(r.output.split()), r.output
        assert named.exit_code == 2 and isinstance(named.exception, SystemExit), (named.exception, named.output)
        assert "cannot be looked at (Permission denied)" in " ".join(named.output.split()), named.output
        assert drill.exit_code == 2 and isinstance(drill.exception, SystemExit), (drill.exception, drill.output)
        assert said in " ".join(drill.output.split()), drill.output
        assert problem and problem[0] == f"{d} cannot be looked at (Permission denied)", problem
        by_var = {c.what: c for c in checks}
        assert by_var["RAILOVER_STATE_DIR"].status == dr.WARN and "cannot be looked at" in by_var["RAILOVER_STATE_DIR"].detail
        assert by_var["RAILOVER_EVENT_LOG"].status == dr.WARN and "cannot be looked at" in by_var["RAILOVER_EVENT_LOG"].detail
    finally:
        closed.chmod(0o755)
        shutil.rmtree(base)


def test_another_user_s_fallback_state_dir_is_not_a_default_dir_when_it_cannot_be_listed():
    """A directory the reader may not list is named as unreadable (above); the fallback
    directories /tmp/railover-<uid> of other users (mode 0750) are found by looking, not
    named: left out of the defaults, or every status and exporter scrape of every other user
    would report them."""
    import shutil
    mine = Path(f"/tmp/railover-{os.getpid() + 4000000}")   # a uid no user has: a test's own
    mine.mkdir(mode=0o700)
    try:
        assert mine in st.default_state_dirs({})
        if os.geteuid() != 0:
            mine.chmod(0o000)
        with _as_another_user():
            dirs = st.default_state_dirs({})
        assert mine not in dirs and Path("/run/railover") in dirs, dirs
    finally:
        mine.chmod(0o755)
        shutil.rmtree(mine)


def test_status_reads_a_long_journal_from_its_end_only(tmp_path):
    """`railover status` read and parsed every line of each journal on every run (and every
    --watch refresh): 200 MB of a long job's journal took 40 s and 2 GB. It reads from the end
    as far as the events it shows: a garbled line at the start of a journal longer than one
    read block is never reached, and the events shown are those a full read shows."""
    from railover import journal as jr
    j = tmp_path / "ev.jsonl"
    now = st.now_us()
    with open(j, "w") as fh:
        fh.write("garbage at the start\n")
    n = 4 * jr.READ_BLOCK // 150  # lines of 150 to 200 bytes: more than three blocks
    append_events(j, [{"t_us": now - (n - k) * 1000, "pid": 7, "event": "failover", "comm": str(k), "to_nic": "eth1",
                       "peer": "10.0.0.2", "resumed_seq": k, "bytes_resent": 0, "convergence_us": 800}
                      for k in range(n)])
    assert j.stat().st_size > 3 * jr.READ_BLOCK
    d = tmp_path / "s"
    write_state(d, _live(tmp_path, event_log=str(j)))
    snap = st.snapshot([d], events=5)
    assert [e["comm"] for e in snap["events"]] == [str(k) for k in range(n - 5, n)]
    assert snap["journal"]["garbled"] == 0, "the start of the journal was read"
    full = st.recent_events([j], limit=0)
    assert [e["comm"] for e in full[-5:]] == [e["comm"] for e in snap["events"]]


@pytest.mark.parametrize("block", [7, 64, 1000, 1 << 20])
def test_read_last_is_the_tail_of_a_full_read(tmp_path, block):
    """journal.read_last, reading backwards in blocks (lines cut across blocks, a line longer
    than a block, a partial last line, lines slightly out of time order as threads write them),
    gives the last events a full read sorted by time gives."""
    from railover import journal as jr
    j = tmp_path / "ev.jsonl"
    evs = []
    for k in range(400):
        t = 5_000_000 + k * 100_000 + (150_000 if k % 7 == 0 else 0)  # every 7th written 150 ms late
        e = {"t_us": t, "pid": 7, "event": "path_state" if k % 3 else "nic_down", "nic": f"eth{k % 2}",
             "signal": "x" * (300 if k == 390 else k % 5)}
        evs.append(e)
    append_events(j, evs[:200])
    with open(j, "a") as fh:
        fh.write("not json\n")
    append_events(j, evs[200:], partial='{"t_us": 1, "pi')
    want = lambda e: e["event"] != "path_state"  # noqa: E731
    for limit in (1, 5, 60, 1000):
        stats = jr.Stats()
        got = jr.read_last(j, limit, want, stats, block=block)
        full = sorted((e for e in jr.read(j) if want(e)), key=lambda e: e["t_us"])[-limit:]
        assert sorted(got, key=lambda e: e["t_us"]) == full, limit
        assert stats.garbled == (2 if limit == 1000 else 1)  # the partial line; the other only in a full read
    assert jr.read_last(tmp_path / "missing.jsonl", 5) == []
