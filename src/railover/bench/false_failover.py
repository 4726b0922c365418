"""``railover bench false-failover``: conditions that slow or stop traffic without any NIC
failing must not move a single comm (target: 0 failovers).

2 hosts x 2 NICs, one rank per host, continuous ring all-reduce of 1 MiB with every byte
checked, default settings. Each case runs 1 s of steady traffic, then the condition for 5 s
(1.5 s with --quick), then 2 s of recovery:

* ``congestion``: iperf3 -P 4 --bidir between a0 and b0 (the primary rail), saturating it
  in both directions next to railover's streams;
* ``rate-limit``: tc tbf at 100 Mbit/s on a0 and b0 (the primary rail; ~40x slower than the
  unshaped veth);
* ``rate-limit-all``: the same tbf on every NIC of both hosts, 4 channels spread over the two
  NICs (all-reduce of 4 MiB), for 3x the condition time: every rail is slow and saturated,
  none failed;
* ``recv-pause``: rank 1's progress thread stops posting and testing receives (driver
  ``--pause-recv``): a receiver that stops consuming, so the sender stalls with full buffers;
* ``sigstop``: rank 1 is SIGSTOPped (its plugin threads, probes included, stop too);
* ``cpu-hog``: every core saturated by other work: one busy-looping process per core (nice 0,
  the ranks' own priority) for 60 s (5 s with --quick): a training host whose data loaders
  use every core;
* ``mem-bw``: memory-bandwidth pressure: one process per core copying a 64 MiB buffer into
  another without pause, for 60 s (5 s with --quick).

The hogs are plain Python processes (no extra dependency), started on the host (outside the
test bed's namespaces: CPU and memory are shared anyway) and killed by their pids.

Counted per case: ``failover`` and ``path_down`` journal events (should be 0), the
``pair_down`` verdicts of the probe monitor (soft signals the failover rules must ignore),
and the longest delivery stall.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.testbed import faults as F
from railover.bench.failover import keep_journals
from railover.testbed.netns import TestBed, now_us, poll_until

CASES = ("congestion", "rate-limit", "rate-limit-all", "recv-pause", "sigstop", "cpu-hog", "mem-bw")

HOG_PROGRAMS = {
    "cpu-hog": "while 1: pass",
    "mem-bw": "a = bytearray(64 << 20)\nb = bytearray(64 << 20)\nwhile 1: b[:] = a",
}


class Hog(F.Fault):
    """One process per CPU core running ``program`` (a CPU or memory-bandwidth hog) on the
    host; undo kills each by its pid. ``result``: the load average seen at undo."""

    code = "HOG"

    def __init__(self, program: str):
        super().__init__()
        self.program = program
        self.procs: List[subprocess.Popen] = []
        self.result: Optional[Dict[str, Any]] = None

    def _target(self) -> str:
        return f"{os.cpu_count()} processes"

    def _apply(self) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", self.program], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL) for _ in range(os.cpu_count() or 1)]

    def _undo(self) -> None:
        self.result = {"processes": len(self.procs), "loadavg_1m": os.getloadavg()[0]}
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(timeout=10)
        self.procs = []


class Flood(F.Fault):
    """iperf3 -P 4 --bidir between two NICs (a competing job saturating the rail)."""

    code = "FLOOD"

    def __init__(self, tb: TestBed, src, dst, seconds: float, port: int = 5299):
        super().__init__()
        self.tb, self.src, self.dst, self.seconds, self.port = tb, src, dst, seconds, port
        self.srv = self.cli = None
        self.result: Optional[Dict[str, Any]] = None

    def _apply(self) -> None:
        self.srv = self.tb.run(self.dst.host, ["iperf3", "-s", "-1", "-B", self.dst.addr, "-p", str(self.port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll_until(lambda: C._port_listening(self.tb, self.dst.host, self.port), 10, what="iperf3 server")
        self.cli = self.tb.run(self.src.host, ["iperf3", "-c", self.dst.addr, "-B", self.src.addr, "-p", str(self.port),
                                               "-P", "4", "--bidir", "-t", f"{self.seconds:g}", "-J"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _undo(self) -> None:
        import json
        try:
            out, _ = self.cli.communicate(timeout=self.seconds + 30)
            e = json.loads(out)["end"]
            self.result = {"gbs_fwd": e["sum_received"]["bits_per_second"] / 8e9,
                           "gbs_rev": e.get("sum_received_bidir_reverse", {}).get("bits_per_second", 0) / 8e9}
        except Exception as ex:  # the flood's own numbers are informative only
            self.result = {"error": str(ex)}
            if self.cli.poll() is None:
                self.cli.kill()
        for p in (self.srv,):
            if p.poll() is None:
                p.terminate()
            p.wait(timeout=10)


def run(out: Path, quick: bool = False, cases=CASES, console: Optional[Console] = None) -> Dict[str, Any]:
    console = console or Console()
    hold = 1.5 if quick else 5.0
    hog_s = 5.0 if quick else 60.0
    warm, after = 1.0, 2.0
    rep = C.Report("false-failover", out, quick, {"cases": list(cases), "condition_s": hold, "warm_s": warm,
                                                  "after_s": after, "workload": "allreduce",
                                                  "size": "1M (rate-limit-all: 4M over 4 channels)",
                                                  "check": True, "layout": "T2", "tbf": "100mbit, burst 64kb, latency 50ms",
                                                  "hog_s": hog_s, "cores": os.cpu_count()})
    work = Path(out) / "false-work"
    results: Dict[str, Any] = {}
    rep.results["cases"] = results  # filled as each part finishes: an interrupted run keeps them
    with TestBed("T2") as tb:
        a0, b0 = tb.nic("a0"), tb.nic("b0")
        for case in cases:
            secs = hold * 3 if case == "rate-limit-all" else hog_s if case in HOG_PROGRAMS else hold
            console.print(f"[bold]false-failover[/] {case} for {secs:g} s ({tb.prefix})")
            extra = []
            pause_at = None
            if case == "recv-pause":
                pause_at = 2.0  # s after the timed run's start (the driver's clock)
                extra = ["--pause-recv", f"1:{pause_at}:{hold}"]
            size, channels = "1M", 1
            if case == "rate-limit-all":
                size, channels = "4M", 4
                extra = ["--dev-spread"]
            lr = C.LiveRun(tb, work / case, workload="allreduce", minbytes=size, check=True, channels=channels,
                           duration_s=60 + hold * 5 + (hog_s if case in HOG_PROGRAMS else 0), extra_args=extra).start()
            f: Optional[F.Fault] = None
            extra_info: Dict[str, Any] = {}
            try:
                lr.wait_for(lambda: now_us() - lr.started_us >= warm * 1e6, warm + 1)
                t0 = now_us()
                if case == "congestion":
                    f = Flood(tb, a0, b0, hold)
                elif case == "rate-limit":
                    f = F.Rate(a0, "100mbit", peers=[b0])
                elif case == "rate-limit-all":
                    f = F.Rate(a0, "100mbit", peers=[n for n in tb.nics if n is not a0])
                elif case == "sigstop":
                    f = F.Stop(lr.procs[1])
                elif case in HOG_PROGRAMS:
                    f = Hog(HOG_PROGRAMS[case])
                # Saturated slow rails need longer to show probe trouble: 3x the condition time.
                cond = hold * 3 if case == "rate-limit-all" else hog_s if case in HOG_PROGRAMS else hold
                if f is not None:
                    f.apply()
                    lr.wait_for(lambda: now_us() - t0 >= cond * 1e6, cond + 1)
                    t1 = now_us()
                    f.undo()
                    if isinstance(f, F.Rate):
                        extra_info["tbf_drops"] = f.counter()
                        extra_info["failover_causes"] = sorted({e.get("cause", "") for e in lr.select("path_down", t0)
                                                                if e.get("active")})
                    if isinstance(f, Flood):
                        extra_info["iperf3"] = f.result
                    if isinstance(f, Hog):
                        extra_info["hog"] = f.result
                else:  # recv-pause: the driver pauses itself; wait it out
                    lr.wait_for(lambda: now_us() - lr.started_us >= (pause_at + hold + 0.5) * 1e6, pause_at + hold + 5)
                    t1 = now_us()
                lr.wait_for(lambda: now_us() - t1 >= after * 1e6, after + 1)
            finally:
                lr.stop()
                if f is not None and f.active:
                    f.undo()
            res = lr.finish(check=False)
            keep_journals(work / case, Path(out) / "false-journals" / case)
            if case == "recv-pause":
                ts = (res.perf.ranks[0].json or {}).get("timeseries") or {}
                if ts.get("t0_us"):
                    t0 = int(ts["t0_us"] + pause_at * 1e6)
                    t1 = int(t0 + hold * 1e6)
            b0s = res.buckets[0] if res.buckets else []
            window = [e for e in res.events if t0 <= e["t_us"] < t1 + after * 1e6]
            results[case] = {
                "failovers": len(res.select("failover")),
                "path_downs": len(res.select("path_down")),
                "pair_downs_in_window": sum(1 for e in window if e.get("event") == "pair_down"),
                "events_in_window": sorted({e["event"] for e in window}),
                "health_late_in_window": sum(1 for e in window if e.get("event") == "health_late"),
                "peer_silence_holds_in_window": sum(1 for e in window if e.get("event") == "peer_silence"),
                "stall_ms": C.longest_gap_ms(b0s, t0, int(t1 + after * 1e6)),
                "bw_before_gbs": C.rate_gbs(b0s, int(t0 - warm * 1e6 * 0.8), t0),
                "bw_during_gbs": C.rate_gbs(b0s, t0, t1),
                "bw_after_gbs": C.rate_gbs(b0s, int(t1 + 0.5e6), int(t1 + after * 1e6)),
                "wrong_bytes": res.wrong_bytes,
                "rank_exit_codes": [r.returncode for r in res.perf.ranks],
                **extra_info,
            }
            if not res.ok:
                results[case]["error"] = res.perf.describe()[-3000:]
            rep.add_wrong(res.wrong_bytes)
            shutil.rmtree(work / case, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    rep.results["cases"] = results
    for case, r in results.items():
        rep.add_target(f"false-failover: {case}: failovers", r["failovers"], "==", 0,
                       detail=f"path_down {r['path_downs']}, soft pair_down verdicts {r['pair_downs_in_window']}, "
                              f"longest stall {C.fmt(r['stall_ms'], 0)} ms")
        rep.add_target(f"false-failover: {case}: wrong bytes", r["wrong_bytes"], "==", 0, "B")
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def tables(data: Dict[str, Any]) -> List[Table]:
    t = Table(title=f"false-failover: conditions of {data['settings']['condition_s']:g} s, no NIC fails")
    for c in ("case", "failovers", "path_down", "pair_down (soft)", "longest stall ms", "GB/s before/during/after",
              "wrong B", "exit codes"):
        t.add_column(c, justify="right")
    for case, r in data["results"]["cases"].items():
        t.add_row(case, str(r["failovers"]), str(r["path_downs"]), str(r["pair_downs_in_window"]), C.fmt(r["stall_ms"], 0),
                  f"{C.fmt(r['bw_before_gbs'], 3)} / {C.fmt(r['bw_during_gbs'], 3)} / {C.fmt(r['bw_after_gbs'], 3)}",
                  str(r["wrong_bytes"]), ",".join(map(str, r["rank_exit_codes"])))
    return [t]


def markdown(data: Dict[str, Any]) -> str:
    L = [f"Ring all-reduce of 1 MiB (rate-limit-all: 4 MiB over 4 channels spread over both NICs; 2 hosts x 2 NICs, "
         f"every byte checked, default settings); each condition lasts {data['settings']['condition_s']:g} s "
         f"(rate-limit-all: {3 * data['settings']['condition_s']:g} s; cpu-hog and mem-bw: "
         f"{data['settings'].get('hog_s', 0):g} s with one hog process per core, {data['settings'].get('cores')} cores); "
         f"tbf {data['settings'].get('tbf', '')}.\n",
         "| case | failovers | path_down | pair_down (soft, ignored) | longest stall (ms) | GB/s before / during / after | wrong bytes |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    for case, r in data["results"]["cases"].items():
        L.append(f"| {case} | {r['failovers']} | {r['path_downs']} | {r['pair_downs_in_window']} | {C.fmt(r['stall_ms'], 0)} | "
                 f"{C.fmt(r['bw_before_gbs'], 3)} / {C.fmt(r['bw_during_gbs'], 3)} / {C.fmt(r['bw_after_gbs'], 3)} | "
                 f"{r['wrong_bytes']} |")
    causes = {c: r.get("failover_causes") for c, r in data["results"]["cases"].items() if r.get("failover_causes")}
    if causes:
        L.append("\nCauses of the active paths' path_down events: "
                 + "; ".join(f"{c}: {', '.join(v)}" for c, v in causes.items()))
    return "\n".join(L) + "\n"
