"""``railover bench degraded``: bandwidth while a NIC is down, relative to before.

2 hosts with 2 or 4 NICs each, every NIC shaped to the same line rate (tc tbf on egress,
default 200 Mbit/s, 20 ms queue: the NICs, not the 2 CPUs, are the bottleneck, as on a real
cluster), one rank per host, a ring all-reduce of 4 MiB (-c 0) over 2 channels per NIC
(``--dev-spread``: channel c's comms use NIC c % nics, as NCCL spreads channels over NICs).
After the steady window the switch port of a0 goes down; the comms of NIC 0 (on both hosts:
rail 0) move to other NICs:

* ``spread`` (default ``RAILOVER_STANDBY=all``): each comm picks a surviving NIC by its
  secret, so the moved comms spread over the survivors;
* ``one-buddy`` (``RAILOVER_STANDBY`` explicit pairs x0=x1, x1=x2, ...): every comm of NIC 0
  goes to NIC 1.

busbw = rank 0's received bytes per second (for a 2-rank ring all-reduce that is nccl-tests'
bus bandwidth), before the fault vs during it (from 0.5 s after the last comm converged).
The ideal is (nics - 1) / nics; a ring all-reduce runs at the speed of its slowest channel, so
the NIC that takes the most moved channels sets the pace.
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.testbed import faults as F
from railover.bench.failover import NetlinkFault, keep_journals
from railover.testbed.netns import TestBed, now_us

TBF_LATENCY = "20ms"
TBF_BURST = "256kb"


def run(out: Path, quick: bool = False, nics: Sequence[int] = (2, 4), rate: str = "200mbit", size: str = "4M",
        console: Optional[Console] = None) -> Dict[str, Any]:
    console = console or Console()
    before_s, during_s = (1.5, 1.5) if quick else (4.0, 4.0)
    shaped = rate.lower() != "none"
    if shaped:
        try:
            F.parse_rate(rate)
        except ValueError as e:
            raise C.BenchError(f"--rate: {e} (or 'none' for unshaped veth)") from None
    check = False  # bandwidth figures: -c 0 (the failover suite checks every byte through the same moves)
    rep = C.Report("degraded", out, quick, {"nics": list(nics), "rate": rate, "tbf_latency": TBF_LATENCY,
                                            "tbf_burst": TBF_BURST, "size": size,
                                            "channels_per_nic": 2,
                                            "before_s": before_s, "during_s": during_s, "check": check,
                                            "workload": "allreduce", "fault": "switch port of a0 down"})
    work = Path(out) / "degraded-work"
    rows: List[Dict[str, Any]] = []
    rep.results["rows"] = rows  # filled as each part finishes: an interrupted run keeps them
    series: Dict[str, Any] = {}
    for m in nics:
        with TestBed(hosts=2, nics=m) as tb:
            # Queues of 20 ms: with tbf's usual 50 ms per direction the probes of a saturated rail
            # wait > 100 ms and time out (see false-failover's rate-limit-all); shallower queues
            # drop so much that TCP cannot fill the link.
            shapers = [F.Rate(n, rate, latency=TBF_LATENCY, burst=TBF_BURST) for n in tb.nics] if shaped else []
            for s in shapers:
                s.apply()
            try:
                for mode in ("spread", "one-buddy"):
                    env: Dict[str, str] = {}
                    rank_envs = {}
                    if mode == "one-buddy":
                        for r, h in enumerate(tb.hosts):
                            pairs = ";".join(f"{h.nics[i].ifname}={h.nics[(i + 1) % m].ifname}" for i in range(m))
                            rank_envs[r] = {"RAILOVER_STANDBY": pairs}
                    console.print(f"[bold]degraded[/] {m} NICs per host, {mode}, {rate} per NIC ({tb.prefix})")
                    lr = C.LiveRun(tb, work / f"{m}-{mode}", env=env, rank_envs=rank_envs, workload="allreduce",
                                   minbytes=size, check=check, channels=2 * m, duration_s=120,
                                   paths_per_comm=m if mode == "spread" else 2, extra_args=["--dev-spread"]).start()
                    f = NetlinkFault(tb.nic("a0"), "PORT-DOWN")
                    try:
                        # Steady state first: a comm whose standby path connected before its primary
                        # starts on the standby and moves to the primary after the hold-down (3 s,
                        # or what this shell's RAILOVER_HOLD_DOWN_MS says).
                        settle = C.plugin_hold_down_s() + 0.5
                        lr.wait_for(lambda: now_us() - lr.started_us >= (settle + before_s) * 1e6, settle + before_s + 2)
                        initial_fb = len(lr.select("failback"))
                        f.apply()
                        t0 = f.t_issue
                        # NIC 0 carries channels 0 and m of each rank: 2 send comms per rank move.
                        expect = 2 * lr.nranks
                        lr.wait_for(lambda: len({e["comm"] for e in lr.select("failover", t0)}) >= expect, 10)
                        fos = {}
                        for e in lr.select("failover", t0):
                            fos.setdefault(e["comm"], e)
                        t_conv = max((e["t_us"] for e in fos.values()), default=now_us())
                        lr.wait_for(lambda: now_us() - t_conv >= (during_s + 0.5) * 1e6, during_s + 2)
                        t1 = now_us()
                    finally:
                        lr.stop()
                        if f.active:
                            f.undo()
                        f.close()
                    res = lr.finish(check=False)
                    keep_journals(work / f"{m}-{mode}", Path(out) / "degraded-journals" / f"{m}-{mode}")
                    b0 = res.buckets[0] if res.buckets else []
                    before = C.rate_gbs(b0, int(t0 - before_s * 1e6), t0)
                    during = C.rate_gbs(b0, int(t_conv + 0.5e6), int(t_conv + (during_s + 0.5) * 1e6))
                    moved = Counter(e.get("to_nic", "?")[-2:] for e in fos.values())
                    spurious = [e for e in res.events if e.get("event") == "failover" and e["t_us"] < t0]
                    row = {"nics": m, "mode": mode, "bw_before_gbs": before, "bw_during_gbs": during,
                           "failovers_before_fault": len(spurious),
                           "during_vs_before": C.ratio(during, before), "ideal": (m - 1) / m,
                           "affected_comms": len(fos), "initial_failbacks": initial_fb, "moved_to": dict(moved),
                           "convergence_ms": (t_conv - t0) / 1e3 if fos else None,
                           "wrong_bytes": res.wrong_bytes, "rank_exit_codes": [r.returncode for r in res.perf.ranks]}
                    if not res.ok:
                        row["error"] = res.perf.describe()[-3000:]
                    rep.add_wrong(res.wrong_bytes)
                    rows.append(row)
                    series[f"{m}-{mode}"] = {"buckets": b0, "t0": t0, "t_conv": t_conv}
                    console.print(f"  busbw before {C.fmt(before, 3)} GB/s, during {C.fmt(during, 3)} GB/s "
                                  f"({C.fmt(row['during_vs_before'], 3)}; ideal {row['ideal']:.3f}); moved to {dict(moved)}")
                    shutil.rmtree(work / f"{m}-{mode}", ignore_errors=True)
            finally:
                for s in shapers:
                    if s.active:
                        s.undo()
    shutil.rmtree(work, ignore_errors=True)
    rep.results["rows"] = rows
    for r in rows:
        if check:
            rep.add_target(f"degraded: {r['nics']} NICs, {r['mode']}: wrong bytes", r["wrong_bytes"], "==", 0, "B")
        rep.add_target(f"degraded: {r['nics']} NICs, {r['mode']}: failovers before the fault", r["failovers_before_fault"],
                       "==", 0, detail="every NIC saturated at its line rate, none failed")
    _plot(rep, series)
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def _plot(rep: C.Report, series: Dict[str, Any]) -> None:
    if not series:
        return
    plt = C.matplotlib_pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    for name, s in series.items():
        b = s["buckets"]
        if not b:
            continue
        binsz = 100_000
        bins: Dict[int, int] = {}
        for t, n in b:
            k = (t - s["t0"]) // binsz
            bins[k] = bins.get(k, 0) + n
        xs = sorted(k for k in bins if -60 <= k <= 80)
        ax.plot([k * binsz / 1e6 for k in xs], [bins[k] / (binsz / 1e6) / 1e9 for k in xs], lw=1, label=name)
    ax.axvline(0, color="r", lw=0.8)
    ax.set_xlabel("s from the fault (a0's switch port down)")
    ax.set_ylabel("busbw, GB/s (100 ms bins)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(rep.plot_path("degraded.png"), dpi=100)
    plt.close(fig)


def tables(data: Dict[str, Any]) -> List[Table]:
    t = Table(title=f"degraded: busbw during a NIC fault vs before ({data['settings']['rate']} per NIC)")
    for c in ("NICs/host", "mode", "before GB/s", "during GB/s", "during/before", "ideal", "moved comms -> NIC", "wrong B"):
        t.add_column(c, justify="right")
    for r in data["results"]["rows"]:
        t.add_row(str(r["nics"]), r["mode"], C.fmt(r["bw_before_gbs"], 3), C.fmt(r["bw_during_gbs"], 3),
                  C.fmt(r["during_vs_before"], 3), f"{r['ideal']:.3f}", ", ".join(f"{k}: {v}" for k, v in sorted(r["moved_to"].items())),
                  str(r["wrong_bytes"]))
    return [t]


def markdown(data: Dict[str, Any]) -> str:
    s = data["settings"]
    chk = "every byte checked" if s.get("check") else "-c 0: no data checking"
    L = [f"Ring all-reduce of {s['size']} ({chk}), 2 ranks (one per host), {s['channels_per_nic']} channels per NIC, every NIC "
         f"shaped to {s['rate']} (tc tbf, queue {s.get('tbf_latency', '50ms')}, burst {s.get('tbf_burst', '64kb')}); busbw over {s['before_s']:g} s before the fault "
         f"and {s['during_s']:g} s during it.\n",
         "| NICs per host | mode | busbw before (GB/s) | during (GB/s) | during / before | ideal (n-1)/n | moved comms → NIC | failovers before the fault | wrong bytes |",
         "|---:|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in data["results"]["rows"]:
        L.append(f"| {r['nics']} | {r['mode']} | {C.fmt(r['bw_before_gbs'], 3)} | {C.fmt(r['bw_during_gbs'], 3)} | "
                 f"{C.fmt(r['during_vs_before'], 3)} | {r['ideal']:.3f} | "
                 f"{', '.join(f'{k}: {v}' for k, v in sorted(r['moved_to'].items()))} | {r.get('failovers_before_fault', '-')} | "
                 f"{r['wrong_bytes'] if s.get('check') else 'not checked'} |")
    return "\n".join(L) + "\n"
