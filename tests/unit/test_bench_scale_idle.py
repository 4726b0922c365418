"""`railover bench scale`'s idle figures: a missing or invalid reading is "n/a" with its
reason, never a negative CPU share or a 0 RSS/thread count printed as data (a fresh-user run
once showed "idle CPU -4938.25 %", RSS 0.0 and 0 threads: the window outlived the ranks'
idle hold, the processes were gone at its end, and the readers returned 0)."""
from __future__ import annotations

import subprocess
import sys

from rich.console import Console

from railover.bench import common as C
from railover.bench import scale


def _snap(t_us, threads, start=100, rss=20000, nthreads=None, fds=40, pid=1234):
    return {"pid": pid, "t_us": t_us, "start": start, "threads": dict(threads), "rss_kib": rss,
            "nthreads": nthreads or len(threads), "fds": fds}


def test_readers_say_none_for_a_process_that_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert C.proc_cpu_ns(p.pid) is None and C.proc_rss_kib(p.pid) is None
    assert C.proc_threads(p.pid) is None and C.proc_fds(p.pid) is None and C.proc_start_ticks(p.pid) is None
    assert scale.idle_snapshot(p.pid) is None


def test_readers_on_a_live_process():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        s = scale.idle_snapshot(p.pid)
        assert s is not None and s["rss_kib"] > 0 and s["nthreads"] >= 1 and s["fds"] >= 3 and s["start"] > 0
        assert C.proc_cpu_ns(p.pid) == sum(C.thread_cpu_ns(p.pid).values()) or C.proc_cpu_ns(p.pid) > 0
    finally:
        p.communicate(b"")


def test_a_valid_window_gives_the_cpu_share():
    a = [_snap(1_000_000, {1: 5_000_000, 2: 1_000_000}), _snap(1_000_100, {7: 0}, pid=99)]
    b = [_snap(2_000_000, {1: 9_000_000, 2: 2_000_000, 3: 1_000_000}), _snap(2_000_100, {7: 10_000_000}, pid=99)]
    f = scale.idle_figures(a, b)
    assert f["idle_error"] is None
    assert [round(x, 3) for x in f["idle_cpu_pct"]] == [0.6, 1.0]   # (4 + 1 + 1 new thread) ms / 1 s; 10 ms / 1 s
    assert f["idle_cpu_pct_max"] == 1.0 and f["rss_kib"] == [20000, 20000] and f["threads"] == [3, 1]


def test_a_rank_gone_at_the_end_is_na_with_the_reason_not_a_negative_share():
    a = [_snap(1_000_000, {1: 49_000_000_000}), _snap(1_000_000, {7: 1})]
    f = scale.idle_figures(a, [None, _snap(2_000_000, {7: 2})])
    assert f["idle_cpu_pct"][0] is None and f["idle_cpu_pct_max"] is None
    assert "rank 0 was gone at the end of the idle window" in f["idle_error"]
    assert f["rss_kib"][0] is None and f["threads"][0] is None and f["fds"][0] is None


def test_reused_pid_exited_thread_and_window_outside_the_hold_are_na():
    a, b = [_snap(0, {1: 10})], [_snap(1_000_000, {1: 20}, start=555)]
    assert "reused" in scale.idle_figures(a, b)["idle_error"]
    a, b = [_snap(0, {1: 10, 2: 9_000_000})], [_snap(1_000_000, {1: 20})]
    f = scale.idle_figures(a, b)
    assert f["idle_cpu_pct_max"] is None and "1 thread(s) exited" in f["idle_error"]
    a, b = [_snap(1_000_000, {1: 10})], [_snap(2_000_000, {1: 20})]
    f = scale.idle_figures(a, b, holds=[(500_000, 1_500_000)])
    assert f["idle_cpu_pct_max"] is None and "not inside its idle hold" in f["idle_error"]
    assert scale.idle_figures(a, b, holds=[(500_000, 2_500_000)])["idle_error"] is None


def _data(row):
    return {"settings": {"idle_s": 1.0}, "results": {"rows": [row]}}


def test_table_and_markdown_print_na_and_the_reason():
    row = {"channels": 8, "comms_per_process": 16, "setup_ms": 12.0, "standby_armed_ms": 3.0, "driver_buffers_kib": 0,
           "all_converged_ms": 20.0, "median_comm_ms": 10.0, "plugin_handling_p50_ms": 0.1, "plugin_handling_max_ms": 1.0,
           "iteration_ms": 2.0}
    row.update(scale.idle_figures([_snap(0, {1: 49_000_000_000})], [None]))
    console = Console(record=True, width=250)
    for t in scale.tables(_data(row)):
        console.print(t)
    text = console.export_text()
    md = scale.markdown(_data(row))
    for out in (text, md):
        assert "n/a" in out and "rank 0 was gone at the end of the idle window" in out
        assert "-4938" not in out and "| 0 |" not in out
    assert "| 8 | 16 | 12 | 3 | n/a | n/a | n/a | n/a | n/a |" in md, md   # idle CPU, RSS, RSS/channel, threads, fds
