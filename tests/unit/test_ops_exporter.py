"""railover.ops.exporter: metric rendering over HTTP, monotonic counters across rewrites and
process exits, the convergence histogram from journals."""
from __future__ import annotations

import re
import urllib.request
from typing import Dict, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from railover.ops import exporter as ex

from ops_fixtures import append_events, comm, path, rdma_port, state, write_proc, write_state

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def setup(tmp_path):
    proc, d, j = tmp_path / "proc", tmp_path / "state", tmp_path / "events.jsonl"
    j.write_text("")
    col = ex.RailoverCollector([d], [j], proc=proc)
    srv = ex.Exporter(col, "127.0.0.1", 0)
    yield proc, d, j, srv
    srv.close()


def test_binds_localhost_and_renders_every_metric(setup):
    proc, d, j, srv = setup
    assert srv.addr == "127.0.0.1" and srv.port > 0
    write_proc(proc, 100, 5, {"RANK": "3"})
    write_state(d, state(100, 5, [comm("1", failovers=2, failbacks=1, flaps=1, resent=4096),
                                  comm("2", dir_="recv", active="eth1", primary="eth1",
                                       paths=[path("eth1", "10.0.1.2", "active", True),
                                              path("eth0", "10.0.0.2", "failed", False)])],
                         nic_up={"eth0": False}))
    s = scrape(srv.url)
    assert val(s, "railover_failovers_total", rank="3", nic="eth0") == 2
    assert val(s, "railover_failbacks_total", rank="3", nic="eth0") == 1
    assert val(s, "railover_flaps_total", rank="3", nic="eth0") == 1
    assert val(s, "railover_bytes_resent_total", rank="3", nic="eth0") == 4096
    assert val(s, "railover_fatal_errors_total", rank="3", nic="eth1") == 0
    assert val(s, "railover_nic_up", nic="eth0", addr="10.0.0.1", rail="0") == 0
    assert val(s, "railover_nic_up", nic="eth1", addr="10.0.1.1", rail="1") == 1
    assert val(s, "railover_pair_up", nic="eth0", peer="10.0.0.2") == 0
    assert val(s, "railover_path_active", rank="3", comm="1", dir="send", nic="eth0", peer="10.0.0.2") == 1
    assert val(s, "railover_path_active", rank="3", comm="1", dir="send", nic="eth1", peer="10.0.1.2") == 0
    assert val(s, "railover_nic_paths", nic="eth0", state="failed") == 1
    assert val(s, "railover_nic_paths", nic="eth1", state="active") == 1
    assert val(s, "railover_comms", rank="3", health="ok") == 1
    assert val(s, "railover_comms", rank="3", health="unprotected") == 1
    assert val(s, "railover_processes", state="live") == 1
    assert val(s, "railover_last_convergence_seconds", rank="3", comm="1", dir="send") == pytest.approx(0.0025)
    assert val(s, "railover_convergence_seconds_count", event="failover") == 0


def test_counters_stay_monotonic_across_rewrites_and_exits(setup):
    proc, d, j, srv = setup
    write_proc(proc, 200, 7, {"RANK": "0"})
    write_state(d, state(200, 7, [comm("1", failovers=1), comm("2", failovers=2)]))
    assert val(scrape(srv.url), "railover_failovers_total", rank="0", nic="eth0") == 3
    # comm 2 was closed (vanishes from the file), comm 1 failed over again
    write_state(d, state(200, 7, [comm("1", failovers=2)]))
    assert val(scrape(srv.url), "railover_failovers_total", rank="0", nic="eth0") == 4
    # the process exits: its file stays behind, stale; the counter keeps its value
    (proc / "200" / "stat").unlink()
    s = scrape(srv.url)
    assert val(s, "railover_failovers_total", rank="0", nic="eth0") == 4
    assert val(s, "railover_processes", state="stale") == 1
    assert val(scrape(srv.url), "railover_failovers_total", rank="0", nic="eth0") == 4   # folded once only
    # the next job's rank 0 adds to the same series
    write_proc(proc, 201, 9, {"RANK": "0"})
    write_state(d, state(201, 9, [comm("5", failovers=1)]))
    assert val(scrape(srv.url), "railover_failovers_total", rank="0", nic="eth0") == 5
    # the stale file is removed (railover status --prune): nothing is lost
    (d / "railover-200.json").unlink()
    assert val(scrape(srv.url), "railover_failovers_total", rank="0", nic="eth0") == 5


def test_pid_reuse_starts_a_new_process_and_unknown_rank_uses_the_pid(setup):
    proc, d, j, srv = setup
    write_proc(proc, 300, 1)  # environ without a rank
    write_state(d, state(300, 1, [comm("1", failovers=2)]))
    assert val(scrape(srv.url), "railover_failovers_total", rank="pid:300", nic="eth0") == 2
    write_proc(proc, 300, 2)  # same pid, another process
    write_state(d, state(300, 2, [comm("1", failovers=1)]))
    s = scrape(srv.url)
    # the old process's file was overwritten before the exporter saw it stale: its comms are
    # remembered under its own key, the new process adds its own
    assert val(s, "railover_failovers_total", rank="pid:300", nic="eth0") == 3


def test_stale_file_seen_first_is_counted_once(setup):
    proc, d, j, srv = setup
    write_state(d, state(400, 1, [comm("1", failovers=4, fatal=True)]))   # no /proc/400: dead before we started
    for _ in range(3):
        s = scrape(srv.url)
        assert val(s, "railover_failovers_total", rank="pid:400", nic="eth0") == 4
        assert val(s, "railover_fatal_errors_total", rank="pid:400", nic="eth0") == 1


def test_convergence_histogram_and_event_counts_from_journals(setup):
    proc, d, j, srv = setup
    append_events(j, [{"t_us": 1, "pid": 1, "event": "failover", "comm": "1", "convergence_us": 3000},
                      {"t_us": 2, "pid": 1, "event": "failover", "comm": "2", "convergence_us": 30000},
                      {"t_us": 3, "pid": 1, "event": "failback", "comm": "1", "convergence_us": 500},
                      {"t_us": 4, "pid": 1, "event": "nic_down", "nic": "eth0", "signal": "carrier lost"}],
                  partial='{"t_us": 5, "pid": 1, "event": "failover", "convergence_us": 1')
    s = scrape(srv.url)
    assert val(s, "railover_convergence_seconds_count", event="failover") == 2
    assert val(s, "railover_convergence_seconds_sum", event="failover") == pytest.approx(0.033)
    assert val(s, "railover_convergence_seconds_bucket", event="failover", le="0.005") == 1
    assert val(s, "railover_convergence_seconds_bucket", event="failover", le="0.05") == 2
    assert val(s, "railover_convergence_seconds_bucket", event="failback", le="0.001") == 1
    assert val(s, "railover_events_total", event="nic_down") == 1
    with open(j, "a") as f:
        f.write("0000000}\n")   # completes the partial line: 10 000 000 µs = 10 s
    s = scrape(srv.url)
    assert val(s, "railover_convergence_seconds_count", event="failover") == 3
    assert val(s, "railover_convergence_seconds_bucket", event="failover", le="5.0") == 2
    assert val(s, "railover_convergence_seconds_bucket", event="failover", le="10.0") == 3
    assert val(s, "railover_events_total", event="failover") == 3


def test_unreadable_state_file_is_counted_not_fatal(setup):
    proc, d, j, srv = setup
    d.mkdir(parents=True, exist_ok=True)
    (d / "railover-1.json").write_text("{")
    s = scrape(srv.url)
    assert val(s, "railover_state_read_errors_total") == 1
    assert val(s, "railover_processes", state="live") == 0


def test_port_in_use_is_an_oserror(setup):
    proc, d, j, srv = setup
    with pytest.raises(OSError):
        ex.Exporter(ex.RailoverCollector([d]), "127.0.0.1", srv.port)


def test_journal_and_state_file_are_merged_without_double_counting(setup):
    proc, d, j, srv = setup
    write_proc(proc, 500, 3, {"RANK": "2"})
    write_state(d, state(500, 3, [comm("1", failovers=1, resent=100)], event_log=str(j)))
    append_events(j, [{"t_us": 1, "pid": 500, "event": "failover", "comm": "1", "convergence_us": 10, "bytes_resent": 100}])
    s = scrape(srv.url)
    assert val(s, "railover_failovers_total", rank="2", nic="eth0") == 1          # same failover seen twice
    assert val(s, "railover_bytes_resent_total", rank="2", nic="eth0") == 100
    # comm 2 fails over, fails back, flaps and closes between two scrapes: only the journal saw it
    append_events(j, [{"t_us": 2, "pid": 500, "event": "failover", "comm": "2", "bytes_resent": 7},
                      {"t_us": 3, "pid": 500, "event": "failback", "comm": "2", "bytes_resent": 0},
                      {"t_us": 4, "pid": 500, "event": "flap", "comm": "2", "nic": "eth0", "flaps": 1},
                      {"t_us": 5, "pid": 500, "event": "fatal", "comm": "3", "dir": "send", "message": "x"}])
    s = scrape(srv.url)
    assert total_of(s, "railover_failovers_total", rank="2") == 2
    assert total_of(s, "railover_failbacks_total", rank="2") == 1
    assert total_of(s, "railover_flaps_total", rank="2") == 1
    assert total_of(s, "railover_bytes_resent_total", rank="2") == 107
    assert total_of(s, "railover_fatal_errors_total", rank="2") == 1
    # the process exits after its comms closed: the file is rewritten without comms
    write_state(d, state(500, 3, [], event_log=str(j)))
    (proc / "500" / "stat").unlink()
    for _ in range(2):
        s = scrape(srv.url)
        assert total_of(s, "railover_failovers_total", rank="2") == 2
        assert total_of(s, "railover_bytes_resent_total", rank="2") == 107


def test_journal_only_process_is_counted_under_its_pid(setup):
    proc, d, j, srv = setup
    append_events(j, [{"t_us": 1, "pid": 600, "event": "failover", "comm": "9", "convergence_us": 10}])
    s = scrape(srv.url)
    assert val(s, "railover_failovers_total", rank="pid:600", nic="") == 1


def total_of(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, lb), v in samples.items() if n == name and all(dict(lb).get(k) == x for k, x in labels.items()))


def test_journal_only_comm_is_labelled_with_its_primary_nic_from_the_journal(setup):
    """With no state file (state files off, the RDMA bed's guests), the nic label comes from the
    journal: the first path to become active (connecting -> active) is the primary; without
    that line a failback says it (its to_nic). Counts seen before the NIC was known move to the
    labelled series: nothing is counted twice, no series is left without its NIC."""
    proc, d, j, srv = setup
    append_events(j, [
        {"t_us": 1, "pid": 700, "event": "path_state", "comm": "5", "dir": "send", "nic": "eth0",
         "peer": "10.0.0.2", "from": "connecting", "to": "active", "reason": "connected"},
        {"t_us": 2, "pid": 700, "event": "failover", "comm": "5", "to_nic": "eth1", "convergence_us": 10},
        {"t_us": 3, "pid": 700, "event": "path_state", "comm": "5", "dir": "send", "nic": "eth1",
         "peer": "10.0.1.2", "from": "connecting", "to": "active", "reason": "reconnected"},
        {"t_us": 4, "pid": 701, "event": "failover", "comm": "6", "to_nic": "eth1", "convergence_us": 10},
        {"t_us": 5, "pid": 701, "event": "failback", "comm": "6", "to_nic": "eth0", "convergence_us": 10},
    ])
    s = scrape(srv.url)
    assert val(s, "railover_failovers_total", rank="pid:700", nic="eth0") == 1
    assert val(s, "railover_failovers_total", rank="pid:701", nic="eth0") == 1
    assert val(s, "railover_failbacks_total", rank="pid:701", nic="eth0") == 1
    assert total_of(s, "railover_failovers_total", nic="") == 0, "a series without its NIC is left"


def test_a_badly_typed_journal_field_is_an_unreadable_line_not_a_failed_scrape(setup):
    """A journal line whose pid or byte count is not a number (hand-edited, or written by a
    broken tool) is counted as unreadable; the scrape answers 200 and the next lines count."""
    proc, d, j, srv = setup
    append_events(j, [{"t_us": 1, "pid": 600, "event": "failover", "comm": "9", "bytes_resent": "lots"},
                      {"t_us": 2, "pid": "abc", "event": "failover", "comm": "9"},
                      {"t_us": 3, "pid": 600, "event": "failover", "comm": "9", "bytes_resent": 10}])
    s = scrape(srv.url)
    assert val(s, "railover_journal_unreadable_lines_total") == 2
    assert val(s, "railover_failovers_total", rank="pid:600", nic="") == 1
    assert val(s, "railover_bytes_resent_total", rank="pid:600", nic="") == 10


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", float("nan"), float("inf"),
                                 pytest.param(10 ** 400, id="integer-beyond-a-float")])
def test_a_journal_count_that_is_not_finite_is_an_unreadable_line_not_a_failed_scrape(setup, bad):
    """bytes_resent "nan" or "inf" (a JSON string, or the NaN/Infinity Python's json reads) ended
    the scrape in ValueError/OverflowError from int(), and a JSON integer beyond a float's range
    (400 digits) in OverflowError from float(); it is an unreadable line like "lots"."""
    proc, d, j, srv = setup
    append_events(j, [{"t_us": 1, "pid": 600, "event": "failover", "comm": "9", "bytes_resent": bad},
                      {"t_us": 3, "pid": 600, "event": "failover", "comm": "9", "bytes_resent": 10}])
    s = scrape(srv.url)
    assert val(s, "railover_journal_unreadable_lines_total") == 1
    assert val(s, "railover_failovers_total", rank="pid:600", nic="") == 1
    assert val(s, "railover_bytes_resent_total", rank="pid:600", nic="") == 10


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), pytest.param(10 ** 400, id="integer-beyond-a-float")])
def test_a_convergence_time_that_is_not_a_finite_number_is_not_observed(setup, bad):
    """convergence_us NaN or Infinity (Python's json reads them) made the histogram's sum NaN
    or inf for the exporter's whole life, and a JSON integer beyond a float's range ended every
    scrape in OverflowError (500). Such a line is no event the plugin writes (its integers are
    unsigned 64-bit): it counts as an unreadable line, not as a failover."""
    proc, d, j, srv = setup
    append_events(j, [{"t_us": 1, "pid": 600, "event": "failover", "comm": "9", "convergence_us": bad},
                      {"t_us": 2, "pid": 600, "event": "failover", "comm": "9", "convergence_us": 3000}])
    s = scrape(srv.url)
    assert val(s, "railover_journal_unreadable_lines_total") == 1
    assert val(s, "railover_events_total", event="failover") == 1
    assert val(s, "railover_convergence_seconds_count", event="failover") == 1
    assert val(s, "railover_convergence_seconds_sum", event="failover") == pytest.approx(0.003)


def test_process_transport_is_an_info_gauge_per_live_process(setup):
    proc, d, j, srv = setup
    write_proc(proc, 100, 5, {"RANK": "0"})
    write_proc(proc, 101, 5, {"RANK": "1"})
    write_proc(proc, 102, 5, {"RANK": "2"})
    write_state(d, state(100, 5, [comm("1")], transport="rdma"))
    write_state(d, state(101, 5, [comm("2")], transport="tcp"))
    write_state(d, state(102, 5, [comm("3")], transport=None))   # a plugin that predates the field
    write_state(d, state(103, 5, [comm("4")], transport="rdma"))  # no /proc entry: exited, stale
    s = scrape(srv.url)
    assert val(s, "railover_process_transport", rank="0", transport="rdma") == 1
    assert val(s, "railover_process_transport", rank="1", transport="tcp") == 1
    assert val(s, "railover_process_transport", rank="2", transport="unknown") == 1
    got = {k[1] for k in s if k[0] == "railover_process_transport"}
    assert got == {(("rank", "0"), ("transport", "rdma")), (("rank", "1"), ("transport", "tcp")),
                   (("rank", "2"), ("transport", "unknown"))}, "the stale process must not be listed"


def test_non_utf8_and_bad_nested_state_files_do_not_break_the_scrape(setup):
    proc, d, j, srv = setup
    write_proc(proc, 300, 5, {"RANK": "1"})
    write_state(d, state(300, 5, [comm("1", failovers=1)]))
    (d / "railover-115.json").write_bytes(b"\xff\xfe")
    bad = state(301, 5, [comm("2")])
    bad["totals"]["failovers"] = "many"
    write_state(d, bad)
    write_state(d, dict(state(302, 5, []), comms=[{"id": 5}]))
    s = scrape(srv.url)   # HTTP 200 (scrape asserts it), the good file still counted
    assert val(s, "railover_state_read_errors_total") == 3
    assert val(s, "railover_processes", state="live") == 1
    assert val(s, "railover_failovers_total", rank="1", nic="eth0") == 1


class _FakeServer:
    """What ex.serve returns, for CLI tests that must not bind a port."""
    url = "http://127.0.0.1:1/metrics"

    def close(self):
        pass


def _interrupt():
    """signal.pause for CLI tests: the operator's Ctrl-C at once."""
    raise KeyboardInterrupt


def test_exporter_cli_names_missing_dirs_journals_and_state_files_off(tmp_path, monkeypatch):
    import signal
    from typer.testing import CliRunner
    from railover.cli import app

    monkeypatch.setattr(ex, "serve", lambda *a, **k: _FakeServer())
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(signal, "pause", _interrupt)
    f = tmp_path / "afile"
    f.write_text("")
    r = CliRunner().invoke(app, ["exporter", "--state-dir", str(tmp_path / "nope"), "--state-dir", str(f),
                                 "--journal", str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"warning: state dir {tmp_path / 'nope'} does not exist" in out, out
    assert f"warning: state dir {f} is not a directory" in out, out
    assert f"warning: journal {tmp_path / 'nope.jsonl'} does not exist" in out, out
    r = CliRunner().invoke(app, ["exporter"], env={"RAILOVER_STATE_DIR": "off"})
    assert r.exit_code == 0 and "state files are off (RAILOVER_STATE_DIR=off)" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("path", ["/", "/metricsx", "/metrics/extra", "/favicon.ico", "/anything"])
def test_only_the_metrics_path_is_served(setup, path):
    """Metrics on /metrics (as docs/OPERATIONS.md says), 404 with a hint on any other path
    (prometheus_client's app alone answers 200 with metrics everywhere)."""
    import urllib.error
    proc, d, j, srv = setup
    base = srv.url[:-len("/metrics")]
    assert srv.url.endswith("/metrics") and "railover_processes" in str(scrape(srv.url))
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(base + path, timeout=5)
    assert ei.value.code == 404
    assert "/metrics" in ei.value.read().decode()
    ei.value.close()
    assert "railover_processes" in str(scrape(base + "/metrics?from=test"))   # a query string is still /metrics


def test_binds_an_ipv6_address(tmp_path):
    import socket
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this host has no IPv6 loopback")
    srv = ex.Exporter(ex.RailoverCollector([tmp_path]), "::1", 0)
    try:
        assert srv.url == f"http://[::1]:{srv.port}/metrics"
        assert "railover_processes" in str(scrape(srv.url))
    finally:
        srv.close()


@pytest.mark.parametrize("path,status", [("/metrics", 200), ("/other", 404)])
def test_head_is_answered_like_get_without_a_body(setup, path, status):
    import urllib.error
    proc, d, j, srv = setup
    req = urllib.request.Request(srv.url[:-len("/metrics")] + path, method="HEAD")
    try:
        r = urllib.request.urlopen(req, timeout=5)
    except urllib.error.HTTPError as e:
        r = e
    with r:
        assert r.status == status
        assert r.headers["Content-Type"].startswith("text/plain")
        assert int(r.headers["Content-Length"]) > 0   # the size of GET's body
        assert r.read() == b""


@pytest.mark.parametrize("given,bound", [("[::1]", "::1"), ("::1", "::1"), ("127.0.0.1", "127.0.0.1"),
                                         (" [::] ", "::")])
def test_exporter_cli_takes_a_bracketed_ipv6_address(monkeypatch, given, bound):
    """`--addr '[::1]'` was refused, and the message doubled the brackets ("[[::1]]")."""
    import signal
    from typer.testing import CliRunner
    from railover.cli import app

    seen = []

    monkeypatch.setattr(ex, "serve", lambda dirs, journals, addr, port: seen.append(addr) or _FakeServer())
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(signal, "pause", _interrupt)
    r = CliRunner().invoke(app, ["exporter", "--addr", given], env={"RAILOVER_STATE_DIR": "off"})
    assert r.exit_code == 0 and seen == [bound], (seen, r.output)


@pytest.mark.parametrize("given", ["", " ", "[]"])
def test_exporter_cli_refuses_an_empty_address(monkeypatch, given):
    from typer.testing import CliRunner
    from railover.cli import app
    from cli_text import text

    def serve(*a, **k):
        raise AssertionError("served")
    monkeypatch.setattr(ex, "serve", serve)
    r = CliRunner().invoke(app, ["exporter", "--addr", given])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert re.search(r"Invalid value for '?--addr'?: .*empty address", text(r)), text(r)


@pytest.mark.parametrize("given,hint", [("0.0.0.0:9477", "--addr 0.0.0.0 --port 9477"),
                                        ("[::1]:9000", "--addr [::1] --port 9000"),
                                        ("node1:9100", "--addr node1 --port 9100")])
def test_exporter_cli_refuses_an_address_with_a_port_naming_port(monkeypatch, given, hint):
    """`--addr 0.0.0.0:9477` (host:port, as many exporters take it) was looked up as a host
    name: "cannot listen on 0.0.0.0:9477:9477: Name or service not known" (IPv6: brackets
    doubled), which does not say that the port goes to --port."""
    from typer.testing import CliRunner
    from railover.cli import app
    from cli_text import text

    def serve(*a, **k):
        raise AssertionError("served")
    monkeypatch.setattr(ex, "serve", serve)
    r = CliRunner().invoke(app, ["exporter", "--addr", given])
    assert r.exit_code == 2 and not isinstance(r.exception, AssertionError), r.output
    assert "an address with a port" in text(r) and hint in text(r), text(r)


def test_rdma_port_active_and_info_per_nic(setup):
    proc, d, j, srv = setup
    for pid in (100, 101, 102):
        write_proc(proc, pid, 5, {"RANK": str(pid - 100)})
    ports = {"eth0": rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1"),
             "eth1": rdma_port("mlx5_1", ib=True, lid=17)}
    write_state(d, state(100, 5, [comm("1")], transport="rdma", rdma=ports))
    # another process sees eth1's port down (its watch saw the PORT_ERR first): not ACTIVE for all
    write_state(d, state(101, 5, [comm("2")], transport="rdma",
                         rdma=dict(ports, eth1=rdma_port("mlx5_1", ib=True, lid=17, active=False))))
    write_state(d, state(102, 5, [comm("3")], transport="tcp", rdma={}))       # TCP: rdma null
    write_state(d, state(103, 5, [comm("4")], transport="rdma",                 # stale: not listed
                         rdma={"eth0": rdma_port("mlx5_9", active=False)}))
    s = scrape(srv.url)
    assert val(s, "railover_nic_rdma_port_active", nic="eth0", hca="mlx5_0", port="1") == 1
    assert val(s, "railover_nic_rdma_port_active", nic="eth1", hca="mlx5_1", port="1") == 0
    assert {k for k in s if k[0] == "railover_nic_rdma_port_active"} == {
        ("railover_nic_rdma_port_active", (("hca", "mlx5_0"), ("nic", "eth0"), ("port", "1"))),
        ("railover_nic_rdma_port_active", (("hca", "mlx5_1"), ("nic", "eth1"), ("port", "1")))}
    assert val(s, "railover_nic_rdma_port_info", nic="eth0", hca="mlx5_0", port="1", link_layer="Ethernet",
               gid_index="3", gid="::ffff:10.0.0.1", lid="0") == 1
    assert val(s, "railover_nic_rdma_port_info", nic="eth1", hca="mlx5_1", port="1", link_layer="InfiniBand",
               gid_index="-1", gid="", lid="17") == 1
    assert len([k for k in s if k[0] == "railover_nic_rdma_port_info"]) == 2

    # The port comes back for every process, and eth0's GID is chosen again (index 3 -> 5)
    moved = rdma_port("mlx5_0", gid_index=5, gid="::ffff:10.0.0.1")
    for pid in (100, 101):
        write_state(d, state(pid, 5, [comm(str(pid - 99))], transport="rdma", rdma=dict(ports, eth0=moved)))
    s = scrape(srv.url)
    assert val(s, "railover_nic_rdma_port_active", nic="eth1", hca="mlx5_1", port="1") == 1
    info = {dict(k[1])["gid_index"] for k in s if k[0] == "railover_nic_rdma_port_info" and dict(k[1])["nic"] == "eth0"}
    assert info == {"5"}, "the old GID's series is gone once no process uses it"


def _info(s: Samples, nic: str):
    """The railover_nic_rdma_port_info series of ``nic``: a list of their label dicts."""
    return [dict(k[1]) for k in s if k[0] == "railover_nic_rdma_port_info" and dict(k[1])["nic"] == nic]


def _rdma_state(pid: int, written_us: int, eth0: dict):
    st_ = state(pid, 5, [comm(str(pid))], transport="rdma", rdma={"eth0": eth0, "eth1": rdma_port("mlx5_1", ib=True)})
    st_["updated_us"] = written_us
    return st_


def test_rdma_port_info_stays_one_series_per_nic_when_processes_disagree_on_the_gid(setup):
    """After an address change the processes choose their GID again one by one: meanwhile the
    info series stays one per NIC (the new GID as soon as one process uses it, even when a
    process still on the old one writes its file later), and railover_nic_rdma_port_views
    counts the views."""
    proc, d, j, srv = setup
    old, new = rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1"), rdma_port("mlx5_0", gid_index=5, gid="::ffff:10.0.0.9")
    for pid in (100, 101, 102):
        write_proc(proc, pid, 5, {"RANK": str(pid - 100)})
        write_state(d, _rdma_state(pid, 1000 + pid, old))
    s = scrape(srv.url)
    assert [i["gid_index"] for i in _info(s, "eth0")] == ["3"]
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 1
    assert val(s, "railover_nic_rdma_port_views", nic="eth1") == 1

    write_state(d, _rdma_state(101, 2000, new))   # 101 chose again
    write_state(d, _rdma_state(100, 3000, old))   # 100 has not yet, and wrote its file since
    s = scrape(srv.url)
    assert [(i["gid_index"], i["gid"]) for i in _info(s, "eth0")] == [("5", "::ffff:10.0.0.9")]
    assert len(_info(s, "eth1")) == 1
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 2
    assert val(s, "railover_nic_rdma_port_views", nic="eth1") == 1

    # The lagging processes rewrite their files in turn: the series does not flap back.
    for t in (4000, 5000):
        write_state(d, _rdma_state(102, t, old))
        s = scrape(srv.url)
        assert [i["gid_index"] for i in _info(s, "eth0")] == ["5"]

    for pid in (100, 102):
        write_state(d, _rdma_state(pid, 6000 + pid, new))
    s = scrape(srv.url)
    assert [i["gid_index"] for i in _info(s, "eth0")] == ["5"]
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 1


def test_rdma_port_info_first_scrape_and_a_view_that_is_gone_take_the_latest_state_file(setup):
    """At the first scrape (no history) and when no process holds the shown view any more, the
    info series is the view of the process whose state file was written last."""
    proc, d, j, srv = setup
    old, new = rdma_port("mlx5_0", gid_index=3, gid="::ffff:10.0.0.1"), rdma_port("mlx5_0", gid_index=5, gid="::ffff:10.0.0.9")
    for pid in (100, 101, 102):
        write_proc(proc, pid, 5, {"RANK": str(pid - 100)})
    write_state(d, _rdma_state(100, 1000, new))
    write_state(d, _rdma_state(101, 3000, old))    # the latest file, with the old GID
    write_state(d, _rdma_state(102, 2000, rdma_port("mlx5_0", gid_index=4, gid="::ffff:10.0.0.4")))
    s = scrape(srv.url)
    assert [i["gid_index"] for i in _info(s, "eth0")] == ["3"]
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 3
    # 101 exits (its file stays behind, stale): of the views left, 102's file is the latest.
    write_proc(proc, 101, 6)
    s = scrape(srv.url)
    assert [i["gid_index"] for i in _info(s, "eth0")] == ["4"]
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 2
    # No process uses RDMA on the NIC any more: neither family has a series for it.
    for pid in (100, 102):
        write_state(d, state(pid, 5, [comm(str(pid))], transport="tcp", rdma={}))
    s = scrape(srv.url)
    assert not [k for k in s if k[0].startswith("railover_nic_rdma_port") and dict(k[1])["nic"] == "eth0"]


def _port_active(s: Samples, nic: str):
    """The railover_nic_rdma_port_active series of ``nic``: a list of (labels, value)."""
    return [(dict(k[1]), v) for k, v in s.items()
            if k[0] == "railover_nic_rdma_port_active" and dict(k[1])["nic"] == nic]


def test_rdma_port_active_is_one_series_per_nic_labelled_as_the_info_series_when_processes_disagree(setup):
    """Processes that disagree on the HCA port behind a NIC (one moved to another HCA, another
    not yet) give one port_active series for the NIC, not one per (hca, port): its hca and port
    are those of the view the info series shows, and follow it when it changes."""
    proc, d, j, srv = setup
    a, b = rdma_port("mlx5_0", gid_index=3), rdma_port("mlx5_2", port=2, gid_index=3)
    for pid in (100, 101):
        write_proc(proc, pid, 5, {"RANK": str(pid - 100)})
    write_state(d, _rdma_state(100, 2000, a))   # the latest file: its view is shown at the first scrape
    write_state(d, _rdma_state(101, 1000, b))
    s = scrape(srv.url)
    assert val(s, "railover_nic_rdma_port_views", nic="eth0") == 2
    assert [(i["hca"], i["port"]) for i in _info(s, "eth0")] == [("mlx5_0", "1")]
    assert _port_active(s, "eth0") == [({"nic": "eth0", "hca": "mlx5_0", "port": "1"}, 1)]
    assert len(_port_active(s, "eth1")) == 1

    # A third view appears (100 moved to mlx5_3 port 1): the info series shows it, and so do
    # port_active's labels; still one series.
    write_state(d, _rdma_state(100, 3000, rdma_port("mlx5_3", gid_index=3)))
    s = scrape(srv.url)
    assert [(i["hca"], i["port"]) for i in _info(s, "eth0")] == [("mlx5_3", "1")]
    assert _port_active(s, "eth0") == [({"nic": "eth0", "hca": "mlx5_3", "port": "1"}, 1)]


def test_rdma_port_active_is_0_when_any_process_sees_its_port_down_whichever_view_is_shown(setup):
    """The one series per NIC is 1 only if every live process sees its own port ACTIVE: a port
    down in a process whose view is not the shown one is not hidden by the shown view's ACTIVE
    port, and a down port of the shown view is not hidden by the others."""
    proc, d, j, srv = setup
    for pid in (100, 101, 102):
        write_proc(proc, pid, 5, {"RANK": str(pid - 100)})
    shown, other = rdma_port("mlx5_0", gid_index=3), rdma_port("mlx5_2", port=2, gid_index=3)
    write_state(d, _rdma_state(100, 3000, shown))
    write_state(d, _rdma_state(101, 2000, shown))
    write_state(d, _rdma_state(102, 1000, dict(other, port_active=False)))
    s = scrape(srv.url)
    assert [(i["hca"], i["port"]) for i in _info(s, "eth0")] == [("mlx5_0", "1")]
    assert _port_active(s, "eth0") == [({"nic": "eth0", "hca": "mlx5_0", "port": "1"}, 0)]

    # The other view's port is back; one process on the shown view sees its port down.
    write_state(d, _rdma_state(102, 4000, other))
    write_state(d, _rdma_state(101, 5000, dict(shown, port_active=False)))
    s = scrape(srv.url)
    assert [(i["hca"], i["port"]) for i in _info(s, "eth0")] == [("mlx5_0", "1")]
    assert _port_active(s, "eth0") == [({"nic": "eth0", "hca": "mlx5_0", "port": "1"}, 0)]

    write_state(d, _rdma_state(101, 6000, shown))
    s = scrape(srv.url)
    assert _port_active(s, "eth0") == [({"nic": "eth0", "hca": "mlx5_0", "port": "1"}, 1)]
    assert _port_active(s, "eth1") == [({"nic": "eth1", "hca": "mlx5_1", "port": "1"}, 1)]


def test_state_files_without_rdma_export_no_port_series(setup):
    """TCP (rdma null) and an older plugin (no rdma member) give no port series, and no error."""
    proc, d, j, srv = setup
    write_proc(proc, 100, 5, {"RANK": "0"})
    write_proc(proc, 101, 5, {"RANK": "1"})
    write_state(d, state(100, 5, [comm("1")], transport="tcp", rdma={}))
    write_state(d, state(101, 5, [comm("2")], transport=None))   # a plugin that predates both fields
    s = scrape(srv.url)
    assert not [k for k in s if k[0].startswith("railover_nic_rdma_port")]
    assert val(s, "railover_state_read_errors_total") == 0
    assert val(s, "railover_nic_up", nic="eth0", addr="10.0.0.1", rail="0") == 1


def test_docs_list_every_exported_metric(setup):
    """docs/OPERATIONS.md's metric table names every family the exporter serves (counters with
    their _total suffix), and nothing it does not serve."""
    from pathlib import Path
    from prometheus_client.parser import text_string_to_metric_families
    proc, d, j, srv = setup
    write_proc(proc, 100, 5, {"RANK": "0"})
    write_state(d, state(100, 5, [comm("1", failovers=1)], transport="rdma", rdma={"eth0": rdma_port("mlx5_0")}))
    with urllib.request.urlopen(srv.url, timeout=5) as r:
        fams = {(f.name + "_total" if f.type == "counter" else f.name)
                for f in text_string_to_metric_families(r.read().decode())}
    assert "railover_nic_rdma_port_info" in fams and "railover_nic_rdma_port_active" in fams
    ops = (Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md").read_text()
    table = ops[ops.index("| metric | type | labels | meaning |"):]
    table = table[:table.index("\n\n")]
    documented = set(re.findall(r"`(railover_[a-z_]+)`", table))
    assert fams - documented == set(), "metrics served but not in docs/OPERATIONS.md"
    assert documented - fams == set(), "metrics in docs/OPERATIONS.md the exporter does not serve"


def test_a_long_journal_is_counted_a_piece_at_a_time(tmp_path, monkeypatch):
    """The first scrape of a long journal read all of it into memory at once and parsed it into
    one list (200 MB of journal: 2.2 GB resident). It reads JOURNAL_READ_BYTES at a time
    (whole lines) and still counts every event once."""
    from railover import journal as jr
    monkeypatch.setattr(ex, "JOURNAL_READ_BYTES", 4096, raising=False)
    j = tmp_path / "events.jsonl"
    n = 500  # about 170 bytes a line: some 20 pieces
    append_events(j, [{"t_us": 1000 + k, "pid": 7, "event": "failover", "comm": str(k % 3), "to_nic": "eth1",
                       "peer": "10.0.0.2", "resumed_seq": k, "bytes_resent": 1, "convergence_us": 800}
                      for k in range(n)])
    with open(j, "a") as fh:  # a line longer than a piece is read whole
        fh.write('{"t_us": 9000, "pid": 7, "event": "nic_down", "nic": "eth0", "signal": "' + "x" * 9000 + '"}\n')
    sizes = []
    read_new = jr.Tail.read_new

    def recording(self, *args):
        evs = read_new(self, *args)
        sizes.append(len(evs))
        return evs
    monkeypatch.setattr(jr.Tail, "read_new", recording)
    col = ex.RailoverCollector([tmp_path / "state"], [j], proc=tmp_path / "proc")
    col.refresh()
    assert sum(sizes) == n + 1 and max(sizes) <= 4096 // 150, sizes
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in col.collect() for s in f.samples}
    assert val(samples, "railover_events_total", event="failover") == n
    assert val(samples, "railover_events_total", event="nic_down") == 1


def test_exporter_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    """A non-interactive shell starts 'railover exporter &' with SIGINT ignored (inherited
    across exec): 'kill -INT <pid>' left it running, though it serves until SIGINT/SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import railover
    src = str(Path(railover.__file__).resolve().parent.parent)
    p = subprocess.Popen([sys.executable, "-m", "railover.cli", "exporter", "--port", "0", "--state-dir",
                          str(tmp_path)], env=dict(os.environ, PYTHONPATH=src), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        line = p.stdout.readline()
        assert "railover exporter: http://" in line, (line, p.stderr.read() if p.poll() is not None else "")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
        assert "Traceback" not in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
