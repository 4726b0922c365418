"""``railover bench failback``: after a repair, how long until traffic is back on the primary
NIC beyond the configured hold-down, and at what speed.

2 hosts x 2 NICs, one rank per host, a continuous ring all-reduce of 4 MiB (-c 0: the CPU
goes to moving bytes, so the bandwidth comparison is not capped by data checking; the
failover suite checks every byte through the same failover/failback cycles). Per kind, N
cycles: 2 s of steady traffic, the fault for 1 s, the repair, then

* failback − hold-down: repair -> the last comm's ``failback`` journal event, minus
  ``RAILOVER_HOLD_DOWN_MS`` (the plugin's default, 3 s, unless --hold-down-ms). The stages
  are reported too: repair -> NIC/pair seen up again -> primary path reconnected
  (``path_up``) -> failback;
* busbw after / before: rank 0's received bytes per second over [failback + 0.5 s,
  failback + 2.5 s) relative to the 2 s before the fault;
* primary share: the fraction of host A's NIC bytes (tx + rx) that went through a0 in the
  after window (1.0 = everything back on the primary).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.testbed import faults as F
from railover.bench.failover import KINDS, cycles_then_finish, keep_journals
from railover.testbed.netns import TestBed, now_us

BEFORE_S, AFTER_FROM_S, AFTER_TO_S = 2.0, 0.5, 2.5


def _nic_bytes(tb: TestBed, name: str) -> int:
    rx, tx = F.nic_stats(tb, name)
    return rx + tx


def run(out: Path, quick: bool = False, faults: Optional[int] = None, kinds: Sequence[str] = ("port-down", "silent"),
        hold_down_ms: int = 3000, size: str = "4M", console: Optional[Console] = None) -> Dict[str, Any]:
    console = console or Console()
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise C.BenchError(f"--kinds: unknown fault kind(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                           f"known: {', '.join(KINDS)} (the RDMA kinds need --transport rdma)")
    n = faults or (2 if quick else 10)
    env = {"RAILOVER_HOLD_DOWN_MS": str(hold_down_ms)}
    rep = C.Report("failback", out, quick, {"cycles_per_kind": n, "kinds": list(kinds), "size": size, "check": False,
                                            "hold_down_ms": hold_down_ms, "fault_for_s": 1.0, "env": env,
                                            "windows_s": {"before": BEFORE_S, "after": [AFTER_FROM_S, AFTER_TO_S]}})
    work = Path(out) / "failback-work"
    per_kind: Dict[str, Any] = {}
    rep.results["kinds"] = per_kind  # filled as each part finishes: an interrupted run keeps them
    with TestBed("T2") as tb:
        for kind in kinds:
            spec = KINDS[kind]
            console.print(f"[bold]failback[/] {kind}: {n} x ({spec['what']} for 1 s, repair) ({tb.prefix})")
            lr = C.LiveRun(tb, work / kind, env=env, workload="allreduce", minbytes=size, check=False,
                           duration_s=60 + n * (hold_down_ms / 1000 + 15)).start()
            fault = spec["make"](tb)

            def post(rec: Dict[str, Any]) -> None:
                t_fb = rec["t_failback"] or now_us()
                lr.wait_for(lambda: now_us() >= t_fb + AFTER_FROM_S * 1e6, 10)
                a = (_nic_bytes(tb, "a0"), _nic_bytes(tb, "a1"))
                lr.wait_for(lambda: now_us() >= t_fb + AFTER_TO_S * 1e6, 10)
                b = (_nic_bytes(tb, "a0"), _nic_bytes(tb, "a1"))
                d0, d1 = b[0] - a[0], b[1] - a[1]
                rec["primary_share"] = d0 / (d0 + d1) if d0 + d1 else None

            cycles, res = cycles_then_finish(
                lr, fault, n, hold_down_ms=hold_down_ms, fault_for_s=1.0, pre_fault_s=BEFORE_S, post_failback=post,
                conv_timeout_s=5.0, valid_on="undo",
                progress=lambda i, r: console.print(
                    f"  {kind} {i + 1}/{n}: failback {C.fmt(r['failback_ms'], 0)} ms after the repair"))
            keep_journals(work / kind, Path(out) / "failback-journals" / kind)
            b0 = res.buckets[0] if res.buckets else []
            all_cycles, cycles = cycles, [c for c in cycles if c["valid"]]
            nxt = {c["i"]: (all_cycles[k + 1]["t_apply"] if k + 1 < len(all_cycles) else None) for k, c in enumerate(all_cycles)}
            for c in all_cycles:
                _stages(c, res.events, nxt[c["i"]], (tb.nic("a0").ifname, tb.nic("b0").ifname))
                # The repair as the hosts can see it: a carrier/address repair reaches the host
                # when the kernel's link watch reports it (nic_up), which a busy kernel (rtnl
                # held by other work) can delay by seconds after the netlink call returned.
                vis = c["t_undo"] if c.get("nic_up_ms") is None else c["t_undo"] + c["nic_up_ms"] * 1000
                c["repair_visible_ms"] = (vis - c["t_undo"]) / 1e3
                c["overhead_from_call_ms"] = c["failback_ms"] - hold_down_ms if c["failback_ms"] is not None else None
                c["overhead_ms"] = (c["t_failback"] - vis) / 1e3 - hold_down_ms if c["t_failback"] else None
                c["bw_before_gbs"] = C.rate_gbs(b0, c["t_apply"] - int(BEFORE_S * 1e6), c["t_apply"])
                if c["t_failback"]:
                    c["bw_after_gbs"] = C.rate_gbs(b0, c["t_failback"] + int(AFTER_FROM_S * 1e6),
                                                   c["t_failback"] + int(AFTER_TO_S * 1e6))
                else:
                    c["bw_after_gbs"] = None
                c["after_vs_before"] = C.ratio(c["bw_after_gbs"], c["bw_before_gbs"])
            per_kind[kind] = {
                "what": spec["what"], "cycles": all_cycles,
                "discarded_slow_injection": len(all_cycles) - len(cycles),
                "overhead_ms": C.summary([c["overhead_ms"] for c in cycles]),
                "overhead_from_call_ms": C.summary([c["overhead_from_call_ms"] for c in cycles]),
                "repair_visible_ms": C.summary([c["repair_visible_ms"] for c in cycles]),
                "failback_ms": C.summary([c["failback_ms"] for c in cycles]),
                "repair_seen_ms": C.summary([c.get("repair_seen_ms") for c in cycles]),
                "reconnected_ms": C.summary([c.get("reconnected_ms") for c in cycles]),
                "after_vs_before": C.summary([c["after_vs_before"] for c in cycles]),
                "primary_share": C.summary([c.get("primary_share") for c in cycles]),
                "no_failback": sum(1 for c in cycles if c["failback_ms"] is None),
                "flaps": len(res.select("flap")),
                "rank_exit_codes": [r.returncode for r in res.perf.ranks],
            }
            shutil.rmtree(work / kind, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    rep.results["kinds"] = per_kind
    for kind, r in per_kind.items():
        o = r["overhead_ms"]
        rep.add_target(f"failback: {kind} failback minus hold-down, p99", o["p99"], "<=", 50, "ms",
                       detail=f"from the repair as the host sees it; p50 {C.fmt(o['p50'], 0)}, max {C.fmt(o['max'], 0)} ms over "
                              f"{o['n']} repairs (from the repair call: p50 {C.fmt(r['overhead_from_call_ms']['p50'], 0)}, "
                              f"max {C.fmt(r['overhead_from_call_ms']['max'], 0)} ms); "
                              f"repair seen p50 {C.fmt(r['repair_seen_ms']['p50'], 0)} ms, primary reconnected p50 "
                              f"{C.fmt(r['reconnected_ms']['p50'], 0)} ms after the repair")
        a = r["after_vs_before"]
        rep.add_target(f"failback: {kind} busbw after failback / before the fault, p50", a["p50"], ">=", 0.98,
                       detail=f"min {C.fmt(a['min'], 3)}; primary share of NIC bytes after failback p50 "
                              f"{C.fmt(r['primary_share']['p50'], 3)}")
        rep.add_target(f"failback: {kind} repairs without failback", r["no_failback"], "==", 0)
    _plot(rep, per_kind)
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def _stages(c: Dict[str, Any], events: List[Dict[str, Any]], next_apply: Optional[int],
            primary_nics: Sequence[str] = ()) -> None:
    """From the repair call: the first nic_up (the kernel reported the link/address back), the
    first nic_up/pair_up (the plugin saw the repair), the last send path_up on a primary NIC
    (``primary_nics``) before the failback (the primaries reconnected)."""
    t1 = c["t_undo"]
    end = c["t_failback"] or next_apply or (t1 + 60_000_000)
    win = [e for e in events if t1 <= e["t_us"] <= end]
    nic = [e["t_us"] for e in win if e.get("event") == "nic_up"]
    c["nic_up_ms"] = (min(nic) - t1) / 1e3 if nic else None
    seen = [e["t_us"] for e in win if e.get("event") in ("nic_up", "pair_up")]
    c["repair_seen_ms"] = (min(seen) - t1) / 1e3 if seen else None
    ups = [e["t_us"] for e in win if e.get("event") == "path_up" and e.get("dir") == "send"
           and (not primary_nics or e.get("nic") in primary_nics)]
    c["reconnected_ms"] = (max(ups) - t1) / 1e3 if ups else None


def restage(data: Dict[str, Any], journals: Path) -> Dict[str, Any]:
    """Recompute the per-repair stages of a failback report from its kept journals
    (``<out>/failback-journals/<kind>/``), e.g. after a change of the stage rules."""
    from railover.testbed.scenario import read_journal
    for kind, r in data["results"]["kinds"].items():
        ev = []
        for j in sorted((Path(journals) / kind).glob("events-rank*.jsonl")):
            ev += read_journal(j)
        ev.sort(key=lambda e: e["t_us"])
        prim = {e["nic"] for e in ev if e.get("event") == "path_up" and e.get("dir") == "send"
                and str(e.get("nic", "")).endswith(("a0", "b0"))}
        cs = r["cycles"]
        for k, c in enumerate(cs):
            _stages(c, ev, cs[k + 1]["t_apply"] if k + 1 < len(cs) else None, tuple(prim))
        valid = [c for c in cs if c["valid"]]
        r["reconnected_ms"] = C.summary([c.get("reconnected_ms") for c in valid])
        r["repair_seen_ms"] = C.summary([c.get("repair_seen_ms") for c in valid])
    return data


def _plot(rep: C.Report, per_kind: Dict[str, Any]) -> None:
    if not per_kind:
        return
    plt = C.matplotlib_pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for kind, r in per_kind.items():
        cs = [c for c in r["cycles"] if c["overhead_ms"] is not None and c["valid"]]
        ax.plot(range(1, len(cs) + 1), [c["overhead_ms"] for c in cs], marker="o", label=f"{kind}: failback - hold-down")
        ax.plot(range(1, len(cs) + 1), [c["reconnected_ms"] or 0 for c in cs], ls=":", marker=".",
                label=f"{kind}: primary reconnected")
    ax.axhline(50, color="k", ls="--", lw=0.8, label="target 50 ms")
    ax.set_xlabel("repair #")
    ax.set_ylabel("ms after the repair")
    ax.set_yscale("symlog", linthresh=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(rep.plot_path("failback.png"), dpi=100)
    plt.close(fig)


def tables(data: Dict[str, Any]) -> List[Table]:
    t = Table(title=f"failback (hold-down {data['settings']['hold_down_ms']} ms; p50 / p99 / max)")
    for c in ("kind", "repairs", "failback - hold-down (ms)", "repair seen (ms)", "primary reconnected (ms)",
              "busbw after/before", "primary share", "no failback"):
        t.add_column(c, justify="right")
    for kind, r in data["results"]["kinds"].items():
        s = lambda k, nd=0: C.p50_p99_max(r[k], nd)
        t.add_row(kind, str(r["overhead_ms"]["n"] + r["no_failback"]), s("overhead_ms"), s("repair_seen_ms"),
                  s("reconnected_ms"), f"{C.fmt(r['after_vs_before']['p50'], 3)} (min {C.fmt(r['after_vs_before']['min'], 3)})",
                  C.fmt(r["primary_share"]["p50"], 3), str(r["no_failback"]))
    return [t]


def markdown(data: Dict[str, Any]) -> str:
    s_ = data["settings"]
    L = [f"{s_['cycles_per_kind']} repairs per kind; ring all-reduce of {s_['size']} (2 hosts x 2 NICs, -c 0), "
         f"fault held {s_['fault_for_s']} s, `RAILOVER_HOLD_DOWN_MS={s_['hold_down_ms']}`. Times from the repair, ms, "
         "p50 / p99 / max.\n",
         "| kind | repairs | failback − hold-down (from the repair the host sees) | same, from the repair call | kernel reported the repair (nic_up) | plugin saw the repair (nic_up/pair_up) | primary reconnected (path_up) | busbw after / before (p50, min) | primary share after | flaps |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, r in data["results"]["kinds"].items():
        s = lambda k, nd=0: C.p50_p99_max(r[k], nd)
        L.append(f"| {kind} | {r['overhead_ms']['n'] + r['no_failback']} | {s('overhead_ms')} | {s('overhead_from_call_ms')} | "
                 f"{s('repair_visible_ms')} | {s('repair_seen_ms')} | "
                 f"{s('reconnected_ms')} | {C.fmt(r['after_vs_before']['p50'], 3)}, {C.fmt(r['after_vs_before']['min'], 3)} | "
                 f"{C.fmt(r['primary_share']['p50'], 3)} | {r['flaps']} |")
    return "\n".join(L) + "\n"
