"""``railover bench scale``: 2 .. 2048 comms per process.

2 hosts x 2 NICs, one rank per host, sendrecv with N channels: each process has N send comms
and N receive comms (2N comms; the targets of the issue, "1024 comms per process", are judged
at N = 512, and N = 1024 (2048 comms) is measured too) (each send comm with its primary path and one armed standby path of
``RAILOVER_NSTREAMS`` TCP streams each); 4 KiB per channel per iteration, small driver
slots (4 KiB) so driver buffers stay small. For every N:

* connect time: the driver's listen .. connect/accept of all 2N comms (``setup_us``), and
  first -> last send ``path_up`` (standby paths armed);
* idle: after the traffic, the driver keeps every comm connected with nothing in flight and
  its progress thread parked (``--hold``): the process's CPU time (all threads, from
  /proc/<pid>/task/*/schedstat) over the idle window is the plugin's own (standby probes,
  acceptor, state writer), RSS and threads/fds per process;
* memory per comm: (RSS(N) - RSS(previous N) - the driver's slot buffers) / (N - previous N) per channel (a
  send + a receive comm), thread stacks of the driver's channel workers included;
* convergence: with traffic on every comm, the switch port of a0 goes down (every comm's
  primary is NIC 0): fault -> the last of the 2N send comms' ``failover`` events ("every comm
  converged"), the median comm, and the plugin's own part per comm (its ``path_down`` verdict
  -> its ``failover``). A comm converges when the driver next calls it, so the driver's
  iteration time (every channel once per iteration) is reported next to it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.bench.failover import NetlinkFault, keep_journals
from railover.testbed.netns import TestBed, now_us

SLOT = 4096
PER_CHANNEL = 4096


def _driver_buffer_kib(channels: int) -> float:
    """RSS of the driver's per-connection slot buffers (memset at setup): 2 conns per
    channel x 2 protocols x 8 slots, page-rounded."""
    per_conn = 2 * ((8 * SLOT + 4095) // 4096 * 4096)
    return channels * 2 * per_conn / 1024


TARGET_COMMS = 1024  # comms per process at which the targets are judged (send + receive comms)
MAX_CHANNELS = 1024  # railover-perf --channels takes 1..1024 (native/tools/perf/main.cc)
IDLE_SETTLE_S = 1.0  # s between the last rank's "# idle hold" and the start of the idle window
HOLD_MARGIN_S = 8.0  # s of --hold beyond the window (at least; idle_s when larger)


def idle_snapshot(pid: int) -> Optional[Dict[str, Any]]:
    """One reading of a rank process for the idle window: ``t_us`` (CLOCK_MONOTONIC µs),
    ``start`` (process start time, ticks), ``threads`` ({tid: on-CPU ns}), ``rss_kib``,
    ``nthreads``, ``fds``. None when the process is gone."""
    start = C.proc_start_ticks(pid)
    threads = C.thread_cpu_ns(pid)
    rss, nthreads, fds = C.proc_rss_kib(pid), C.proc_threads(pid), C.proc_fds(pid)
    if start is None or not threads or rss is None or nthreads is None or fds is None:
        return None
    return {"pid": pid, "t_us": now_us(), "start": start, "threads": threads, "rss_kib": rss, "nthreads": nthreads,
            "fds": fds}


def idle_figures(before: Sequence[Optional[Dict[str, Any]]], after: Sequence[Optional[Dict[str, Any]]],
                 holds: Sequence[tuple] = ()) -> Dict[str, Any]:
    """Idle CPU (% of a core, per rank), RSS (KiB), threads and fds from readings at the start
    and end of the idle window (:func:`idle_snapshot`). ``holds``: per rank ``(hold_start_us,
    hold_end_us)`` from the driver's JSON, when known.

    A figure is only given when it is a measurement: when a rank is gone at either end, its
    pid now names another process, a thread exited inside the window (its CPU time can no
    longer be read), the CPU time went backwards, or the window was not inside every rank's
    idle hold, the CPU figures are None and ``idle_error`` says why (RSS/threads/fds are None
    only when the process was gone). Returns ``idle_cpu_pct``, ``idle_cpu_pct_max``,
    ``idle_top_threads_pct`` (rank 0's busiest threads), ``rss_kib``, ``threads``, ``fds``,
    ``idle_error``."""
    errors: List[str] = []
    cpu: List[Optional[float]] = []
    for r, (a, b) in enumerate(zip(before, after)):
        if a is None or b is None:
            errors.append(f"rank {r} was gone at the {'start' if a is None else 'end'} of the idle window")
            cpu.append(None)
            continue
        if a["start"] != b["start"]:
            errors.append(f"rank {r}: pid {a['pid']} was reused by another process during the window")
            cpu.append(None)
            continue
        exited = [t for t in a["threads"] if t not in b["threads"]]
        if exited:
            errors.append(f"rank {r}: {len(exited)} thread(s) exited during the window (their CPU time cannot be read)")
            cpu.append(None)
            continue
        span_ns = (b["t_us"] - a["t_us"]) * 1e3
        used = sum(v - a["threads"].get(t, 0) for t, v in b["threads"].items())
        if span_ns <= 0 or used < 0:
            errors.append(f"rank {r}: invalid reading (window {span_ns / 1e6:.1f} ms, CPU time delta {used / 1e6:.1f} ms)")
            cpu.append(None)
            continue
        cpu.append(used / span_ns * 100)
    t0 = max((a["t_us"] for a in before if a), default=None)
    t1 = min((b["t_us"] for b in after if b), default=None)
    for r, (hs, he) in enumerate(holds):
        if hs and he and t0 is not None and t1 is not None and not (hs <= t0 and t1 <= he):
            errors.append(f"rank {r}: the idle window ({t0}..{t1} µs) was not inside its idle hold ({hs}..{he} µs)")
            cpu = [None] * len(cpu)
    out: Dict[str, Any] = {
        "idle_cpu_pct": cpu,
        "idle_cpu_pct_max": None if not cpu or any(c is None for c in cpu) else max(cpu),
        "idle_top_threads_pct": None,
        "rss_kib": [b["rss_kib"] if b else None for b in after],
        "threads": [b["nthreads"] if b else None for b in after],
        "fds": [b["fds"] if b else None for b in after],
        "idle_error": "; ".join(errors) or None,
    }
    a0, b0 = (before[0], after[0]) if before and after else (None, None)
    if cpu and cpu[0] is not None and a0 and b0:
        span_ns = (b0["t_us"] - a0["t_us"]) * 1e3
        out["idle_top_threads_pct"] = sorted(((v - a0["threads"].get(t, 0)) / span_ns * 100
                                              for t, v in b0["threads"].items()), reverse=True)[:5]
    return out


def _maxi(values: Optional[Sequence[Optional[float]]]) -> Optional[float]:
    """Largest of per-rank figures; None when any is missing (a partial max is not the max)."""
    if not values or any(v is None for v in values):
        return None
    return max(values)


def run(out: Path, quick: bool = False, comms: Sequence[int] = (1, 32, 128, 512, 1024), idle_s: Optional[float] = None,
        console: Optional[Console] = None) -> Dict[str, Any]:
    console = console or Console()
    if quick:
        comms = [c for c in comms if c <= 16] or [1, 8, 16]
        if comms == [1]:
            comms = [1, 8, 16]
    idle_s = idle_s or (1.0 if quick else 10.0)
    hold_down = "300" if quick else "1000"  # failback is not measured here; only its wait
    rep = C.Report("scale", out, quick, {"comms": list(comms), "idle_s": idle_s, "workload": "sendrecv",
                                         "bytes_per_channel": PER_CHANNEL, "slot_size": SLOT, "layout": "T2",
                                         "fault": "switch port of a0 down", "check": False,
                                         "env": {"RAILOVER_HOLD_DOWN_MS": hold_down}})
    work = Path(out) / "scale-work"
    rows: List[Dict[str, Any]] = []
    rep.results["rows"] = rows  # filled as each part finishes: an interrupted run keeps them
    with TestBed("T2") as tb:
        for n in comms:
            console.print(f"[bold]scale[/] {n} channel(s): {n} send + {n} receive comms per process ({tb.prefix})")
            # The window starts IDLE_SETTLE_S after the later rank began its hold, and a rank's
            # hold ends as soon as its peer's does, so the hold covers the window with a wide
            # margin (the ranks start holding at different times on a busy host).
            hold = IDLE_SETTLE_S + idle_s + max(HOLD_MARGIN_S, idle_s)
            lr = C.LiveRun(tb, work / f"n{n}", env={"RAILOVER_HOLD_DOWN_MS": hold_down}, workload="sendrecv", minbytes=PER_CHANNEL * n, channels=n, check=False,
                           slot_size=SLOT, ll_slot=SLOT, ll_max=0, duration_s=300, connect_timeout_s=120,
                           op_timeout=120, idle_sleep_us=50,
                           extra_args=["--hold", f"{hold:g}", "--all-ranks-print"]).start()
            row: Dict[str, Any] = {"channels": n, "comms_per_process": 2 * n}
            fault = NetlinkFault(tb.nic("a0"), "PORT-DOWN")
            try:
                ups = [e["t_us"] for e in lr.events if e.get("event") == "path_up" and e.get("dir") == "send"]
                row["standby_armed_ms"] = (max(ups) - min(ups)) / 1e3 if ups else None
                lr.wait_for(lambda: now_us() - lr.started_us >= 1e6, 2)
                comm_ids = {e["comm"] for e in lr.events if e.get("event") == "path_up" and e.get("dir") == "send"}
                t0_iter = now_us()
                f = fault
                f.apply()
                t0 = f.t_issue
                ok = lr.wait_for(lambda: len({e["comm"] for e in lr.select("failover", t0)}) >= len(comm_ids), 60,
                                 interval_s=0.02)
                fos = {}
                for e in lr.select("failover", t0):
                    fos.setdefault(e["comm"], e)
                downs = {}
                for e in lr.select("path_down", t0):
                    if e.get("dir") == "send" and e.get("active"):
                        downs.setdefault(e["comm"], e)
                conv = sorted((e["t_us"] - t0) / 1e3 for e in fos.values())
                plugin = sorted((e["t_us"] - downs[c]["t_us"]) / 1e3 for c, e in fos.items() if c in downs)
                detect = sorted((downs[c]["t_us"] - t0) / 1e3 for c in downs)
                row.update({
                    "send_comms": len(comm_ids), "converged": len(fos),
                    "all_converged_ms": conv[-1] if ok and conv else None,
                    "median_comm_ms": C.percentile(conv, 50),
                    "comm_noticed_p50_ms": C.percentile(detect, 50), "comm_noticed_max_ms": detect[-1] if detect else None,
                    "plugin_handling_p50_ms": C.percentile(plugin, 50), "plugin_handling_max_ms": plugin[-1] if plugin else None,
                })
                t1 = now_us()
                f.undo()
                lr.wait_for(lambda: len({e["comm"] for e in lr.select("failback", t1)}) >= len(comm_ids), 60, interval_s=0.02)
                row["failed_back"] = len({e["comm"] for e in lr.select("failback", t1)})
                t_fb = max((e["t_us"] for e in lr.select("failback", t1)), default=now_us())
                lr.wait_for(lambda: len({e["comm"] for e in lr.select("path_up", t_fb) if e.get("dir") == "send"})
                            >= len(comm_ids), 30, interval_s=0.02)
            finally:
                if fault.active:
                    fault.undo()
                fault.close()
                lr.stop()
            # Idle: the driver prints "# idle hold" when every comm is parked (each rank).
            held = lr.wait_for(lambda: all("# idle hold" in lr.stdout(r) for r in range(lr.nranks)), 120, interval_s=0.05)
            window: Optional[tuple] = None
            if held:
                lr.wait_for(lambda: False, IDLE_SETTLE_S)  # let the last in-flight bookkeeping settle (not a synchronisation)
                pids = [lr.procs[r].pid for r in range(lr.nranks)]
                a = [idle_snapshot(p) for p in pids]
                lr.wait_for(lambda: False, idle_s)  # the measurement window (returns early if the ranks ended)
                b = [idle_snapshot(p) for p in pids]
                window = (a, b)
            else:
                row["idle_error"] = "the ranks never reported their idle hold (see rank*.out)"
            res = lr.finish(check=False)
            js = [r.json or {} for r in res.perf.ranks]
            if window is not None:
                row.update(idle_figures(*window, holds=[(j.get("stats", {}).get("hold_start_us"),
                                                          j.get("stats", {}).get("hold_end_us")) for j in js]))
                row["idle_window_s"] = idle_s
            row["setup_ms"] = max((j.get("stats", {}).get("setup_us", 0) for j in js), default=0) / 1e3
            row["iteration_ms"] = (res.perf.rows[0]["time_us"] / 1e3) if res.perf.ranks[0].json and res.perf.rows else None
            row["rank_exit_codes"] = [r.returncode for r in res.perf.ranks]
            row["driver_buffers_kib"] = _driver_buffer_kib(n)
            if not res.ok:
                row["error"] = res.perf.describe()[-3000:]
            if n == max(comms) or 2 * n == TARGET_COMMS:
                keep_journals(work / f"n{n}", Path(out) / "scale-journals" / f"n{n}")
            shutil.rmtree(work / f"n{n}", ignore_errors=True)
            rows.append(row)
            console.print(f"  connect {C.fmt(row['setup_ms'], 0)} ms, idle CPU {_na(row.get('idle_cpu_pct_max'), 2, ' %')}, "
                          f"all converged {C.fmt(row.get('all_converged_ms'), 1)} ms, iteration {C.fmt(row['iteration_ms'], 1)} ms")
            if row.get("idle_error"):
                console.print(f"  [yellow]idle figures n/a:[/] {row['idle_error']}")
    shutil.rmtree(work, ignore_errors=True)
    _rss_marginal(rows)
    rep.results["rows"] = rows
    # The targets are for TARGET_COMMS comms per process (N channels = 2N comms); the largest
    # row at or below it, else the largest row (quick runs).
    at = [r for r in rows if 2 * r["channels"] <= TARGET_COMMS]
    big = max(at or rows, key=lambda r: r["channels"])
    rep.add_target(f"scale: idle CPU per process, {big['channels']} channels ({2 * big['channels']} comms)",
                   big.get("idle_cpu_pct_max"), "<=", 1.0, "% of a core",
                   detail=(f"n/a: {big['idle_error']}" if big.get("idle_cpu_pct_max") is None and big.get("idle_error") else
                           f"both ranks: {', '.join(_na(x, 2) for x in big.get('idle_cpu_pct') or [])} % over {idle_s:g} s"))
    rep.add_target(f"scale: every comm on the failed NIC converged, {big['channels']} channels ({2 * big['channels']} comms per process)",
                   big.get("all_converged_ms"), "<=", 100.0, "ms",
                   detail=f"median comm {C.fmt(big.get('median_comm_ms'), 1)} ms; plugin handling per comm p50 "
                          f"{C.fmt(big.get('plugin_handling_p50_ms'), 2)} / max {C.fmt(big.get('plugin_handling_max_ms'), 1)} ms; "
                          f"driver iteration {C.fmt(big.get('iteration_ms'), 1)} ms")
    for r in rows:
        rep.add_target(f"scale: {r['channels']} channels: ranks exited 0", 1 if all(x == 0 for x in r["rank_exit_codes"]) else 0, "==", 1)
    _plot(rep, rows)
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def _plot(rep: C.Report, rows: List[Dict[str, Any]]) -> None:
    plt = C.matplotlib_pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    xs = [r["channels"] for r in rows]
    axes[0].plot(xs, [r["setup_ms"] for r in rows], marker="o", label="connect (setup)")
    axes[0].plot(xs, [_nan(r.get("standby_armed_ms")) for r in rows], marker=".", label="standby armed")
    axes[0].set_ylabel("ms")
    axes[1].plot(xs, [_nan(r.get("idle_cpu_pct_max")) for r in rows], marker="o")  # missing: a gap, not 0
    axes[1].axhline(1.0, color="k", ls="--", lw=0.8)
    axes[1].set_ylabel("idle CPU, % of a core")
    axes[2].plot(xs, [_nan(r.get("all_converged_ms")) for r in rows], marker="o", label="every comm converged")
    axes[2].plot(xs, [_nan(r.get("iteration_ms")) for r in rows], marker=".", ls=":", label="driver iteration")
    axes[2].axhline(100, color="k", ls="--", lw=0.8)
    axes[2].set_ylabel("ms")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("channels (send + recv comm each)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(rep.plot_path("scale.png"), dpi=100)
    plt.close(fig)


def _nan(v: Optional[float]) -> float:
    return float("nan") if v is None else v


def _na(v: Optional[float], nd: int = 2, unit: str = "") -> str:
    """A figure, or "n/a" when it was not measured (the row's idle_error says why)."""
    return "n/a" if v is None else C.fmt(v, nd, unit)


def _rss_mib(r: Dict[str, Any]) -> Optional[float]:
    m = _maxi(r.get("rss_kib"))
    return None if m is None else m / 1024


def tables(data: Dict[str, Any]) -> List[Table]:
    _rss_marginal(data["results"]["rows"])
    t = Table(title=f"scale (idle window {data['settings']['idle_s']:g} s)")
    for c in ("channels", "comms/process", "connect ms", "standby armed ms", "idle CPU %", "RSS MiB", "RSS/channel KiB",
              "threads", "fds", "all converged ms", "median comm ms", "plugin per comm ms (p50/max)", "iteration ms"):
        t.add_column(c, justify="right")
    for r in data["results"]["rows"]:
        t.add_row(str(r["channels"]), str(r["comms_per_process"]), C.fmt(r["setup_ms"], 0), C.fmt(r.get("standby_armed_ms"), 0),
                  _na(r.get("idle_cpu_pct_max"), 2), _na(_rss_mib(r), 1),
                  _na(r.get("rss_per_channel_kib"), 1), _na(_maxi(r.get("threads")), 0), _na(_maxi(r.get("fds")), 0),
                  C.fmt(r.get("all_converged_ms"), 1), C.fmt(r.get("median_comm_ms"), 1),
                  f"{C.fmt(r.get('plugin_handling_p50_ms'), 2)} / {C.fmt(r.get('plugin_handling_max_ms'), 1)}",
                  C.fmt(r.get("iteration_ms"), 1))
    notes = [f"{r['channels']} channels: idle figures n/a: {r['idle_error']}" for r in data["results"]["rows"]
             if r.get("idle_error")]
    if notes:
        t.caption = "\n".join(notes)
    return [t]


def _rss_marginal(rows: List[Dict[str, Any]]) -> None:
    """Memory per channel (a send + a receive comm, and the driver's channel thread) as the
    RSS added from the previous row to this one, less the driver's slot buffers, per added
    channel, from 8 channels up. Marginal rather than against the 1-channel row: a process's
    first megabytes (allocator arenas, the first connections) are not a per-comm cost and vary
    from run to run (a 1-channel rank once showed 35 MiB, a 32-channel one 17 MiB)."""
    prev = None
    for r in sorted(rows, key=lambda r: r["channels"]):
        r["rss_per_channel_kib"] = None
        if prev is not None and _maxi(r.get("rss_kib")) is not None and r["channels"] > prev["channels"]:
            d = _maxi(r["rss_kib"]) - _maxi(prev["rss_kib"]) - (r["driver_buffers_kib"] - prev["driver_buffers_kib"])
            r["rss_per_channel_kib"] = d / (r["channels"] - prev["channels"])
        if _maxi(r.get("rss_kib")) is not None and r["channels"] >= 8:  # tiny processes: RSS is warm-up noise, not a base
            prev = r


def markdown(data: Dict[str, Any]) -> str:
    _rss_marginal(data["results"]["rows"])
    L = [f"sendrecv, 2 hosts x 2 NICs, 1 rank per host; N channels = N send + N receive comms per process; "
         f"idle window {data['settings']['idle_s']:g} s; fault: switch port of a0 down with traffic on every comm.\n",
         "| channels | comms / process | connect (ms) | standby armed (ms) | idle CPU (% of a core) | RSS (MiB) | RSS per added channel (KiB) | threads | fds | every comm converged (ms) | median comm (ms) | plugin per comm p50 / max (ms) | driver iteration (ms) |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["results"]["rows"]:
        L.append(f"| {r['channels']} | {r['comms_per_process']} | {C.fmt(r['setup_ms'], 0)} | {C.fmt(r.get('standby_armed_ms'), 0)} | "
                 f"{_na(r.get('idle_cpu_pct_max'), 2)} | {_na(_rss_mib(r), 1)} | "
                 f"{_na(r.get('rss_per_channel_kib'), 1)} | {_na(_maxi(r.get('threads')), 0)} | {_na(_maxi(r.get('fds')), 0)} | "
                 f"{C.fmt(r.get('all_converged_ms'), 1)} | {C.fmt(r.get('median_comm_ms'), 1)} | "
                 f"{C.fmt(r.get('plugin_handling_p50_ms'), 2)} / {C.fmt(r.get('plugin_handling_max_ms'), 1)} | "
                 f"{C.fmt(r.get('iteration_ms'), 1)} |")
    for r in data["results"]["rows"]:
        if r.get("idle_error"):
            L.append(f"\n{r['channels']} channels: idle figures n/a: {r['idle_error']}")
    return "\n".join(L) + "\n"
