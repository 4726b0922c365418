"""``railover bench failover``: N injected faults per kind under a continuous, checked ring
all-reduce (2 hosts x 2 NICs, one rank per host, 1 MiB per iteration).

One long run per kind: apply the fault, wait until every send comm has resumed on its
standby path (journal ``failover`` events), let it run a little (``settle``), repair, wait
for the failback and for the standby paths to be armed again, wait out the hold-down (so the
next fault is not a flap), repeat. Per fault:

* detection: fault -> the first ``nic_down`` / ``pair_down`` / ``path_down`` journal event;
* convergence: fault -> the last affected comm's ``failover`` event (the RESUME was
  acknowledged: bytes flow again on every hop of the ring); ``first`` = the first comm's;
* stall: the longest run of 1 ms buckets in which rank 0 received nothing, from 50 ms before
  the fault to the repair (``normal gap``: the same measure over the 300 ms before the fault);
* bytes resent: the ``bytes_resent`` of the fault's failover events.

Settings are the plugin's defaults (probe interval 20 ms x 5, stall watch 50 ms) except
``RAILOVER_HOLD_DOWN_MS`` = 300: the hold-down only delays failback, and 3 s per cycle would
make 250 faults take half an hour. Data is generated and checked on every byte.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from rich.console import Console
from rich.table import Table

from railover.bench import common as C
from railover.testbed import faults as F
from railover.testbed.netns import TestBed, now_us

class NetlinkFault(F.Fault):
    """PORT-DOWN, HOST-DOWN and ADDR-DEL through a netlink handle opened once, so that the
    instant of the change is known to within a netlink round trip (``t_issue`` is taken right
    before the request; the fault objects of :mod:`railover.testbed.faults` open a namespace handle per
    call, which takes 15-50 ms). Re-usable: apply/undo any number of times; close() at the end."""

    def __init__(self, nic, code: str):
        super().__init__()
        from pyroute2 import IPRoute
        self.nic, self.code = nic, code
        ns, ifname = (nic.fabric_ns, nic.port) if code == "PORT-DOWN" else (nic.ns, nic.ifname)
        self.ipr = IPRoute(netns=ns, flags=0)
        self.idx = self.ipr.link_lookup(ifname=ifname)[0]
        self.t_issue: Optional[int] = None

    def _target(self) -> str:
        return self.nic.name

    def _apply(self) -> None:
        self.t_issue = now_us()
        if self.code == "ADDR-DEL":
            self.ipr.addr("del", index=self.idx, address=self.nic.addr, prefixlen=self.nic.prefixlen)
        else:
            self.ipr.link("set", index=self.idx, state="down")

    def _undo(self) -> None:
        from railover.testbed.netns import add_nic_address, ensure_nic_routing
        if self.code == "ADDR-DEL":
            add_nic_address(self.nic, self.nic.addr, self.ipr)
        else:
            self.ipr.link("set", index=self.idx, state="up")
            if self.code == "HOST-DOWN":
                ensure_nic_routing(self.nic, None, self.ipr)

    def close(self) -> None:
        self.ipr.close()


class GroupFault(F.Fault):
    """SILENT and ONEWAY at the switch, with a precisely known instant: an nft bridge table,
    installed once in the fabric namespace, drops the frames of switch ports whose interface
    group is ``group`` (SILENT: everything from or to the port; ONEWAY: frames entering from
    the port towards ``dst_addr``). apply/undo flip the port's group with one netlink request
    on a pre-opened handle; carrier and addresses never change, so nothing on the hosts can
    see the fault but the missing packets."""

    _next_group = 7

    def __init__(self, nic, code: str, dst_addr: Optional[str] = None):
        super().__init__()
        import secrets
        import subprocess
        from pyroute2 import IPRoute
        from railover.testbed.netns import ns_exec_argv
        self.nic, self.code, self.dst = nic, code, dst_addr
        self.group = GroupFault._next_group
        GroupFault._next_group += 1
        self.table = f"ro_bench_{secrets.token_hex(3)}"
        rules = ([f"iifgroup {self.group} counter drop", f"oifgroup {self.group} counter drop"] if code == "SILENT"
                 else [f"iifgroup {self.group} ip daddr {dst_addr} counter drop"])
        script = (f"table bridge {self.table} {{\n chain xfwd {{\n  type filter hook forward priority 0; policy accept;\n"
                  + "".join(f"  {r}\n" for r in rules) + " }\n}\n")
        self._ns_exec = ns_exec_argv(nic.fabric_ns)
        r = subprocess.run(self._ns_exec + ["nft", "-f", "-"], input=script, capture_output=True, text=True)
        if r.returncode != 0:
            raise F.FaultError(f"nft in {nic.fabric_ns}: {r.stderr.strip()}")
        self.ipr = IPRoute(netns=nic.fabric_ns, flags=0)
        self.idx = self.ipr.link_lookup(ifname=nic.port)[0]
        self.t_issue: Optional[int] = None

    def _target(self) -> str:
        return self.nic.port

    def _apply(self) -> None:
        self.t_issue = now_us()
        self.ipr.link("set", index=self.idx, group=self.group)

    def _undo(self) -> None:
        self.ipr.link("set", index=self.idx, group=0)

    def close(self) -> None:
        import subprocess
        subprocess.run(self._ns_exec + ["nft", "delete", "table", "bridge", self.table], capture_output=True)
        self.ipr.close()


KINDS: Dict[str, Dict[str, Any]] = {
    "port-down": dict(cls="carrier", make=lambda tb: NetlinkFault(tb.nic("a0"), "PORT-DOWN"),
                      what="switch port of a0 down (carrier loss)"),
    "host-down": dict(cls="carrier", make=lambda tb: NetlinkFault(tb.nic("a0"), "HOST-DOWN"),
                      what="host NIC a0 set admin down"),
    "addr-del": dict(cls="address", make=lambda tb: NetlinkFault(tb.nic("a0"), "ADDR-DEL"), what="address of a0 removed"),
    "silent": dict(cls="silent", make=lambda tb: GroupFault(tb.nic("b0"), "SILENT"),
                   what="black hole at b0's switch port, no carrier event"),
    "one-way": dict(cls="silent", make=lambda tb: GroupFault(tb.nic("b0"), "ONEWAY", tb.nic("a0").addr),
                    what="frames b0 -> a0 dropped at the switch, a0 -> b0 works"),
}
TARGET_MS = {"carrier": 20.0, "address": 20.0, "silent": 200.0}
MAX_APPLY_MS = 5.0
DOWN_EVENTS = ("nic_down", "pair_down", "path_down")


def send_comms(lr: C.LiveRun) -> Dict[str, int]:
    """comm id -> rank, of every send comm (from the journals' first path_up events)."""
    out: Dict[str, int] = {}
    for e in lr.events:
        if e.get("event") == "path_up" and e.get("dir") == "send":
            out.setdefault(e["comm"], e["rank"])
    return out


def _first_per_comm(events: List[Dict[str, Any]], name: str, since: int, comms) -> Dict[str, Dict[str, Any]]:
    got: Dict[str, Dict[str, Any]] = {}
    for e in events:
        if e.get("event") == name and e["t_us"] >= since and e.get("comm") in comms and e["comm"] not in got:
            got[e["comm"]] = e
    return got


def fault_cycles(lr: C.LiveRun, make_fault: Callable[[], F.Fault], n: int, *, hold_down_ms: int,
                 conv_timeout_s: float = 5.0, settle_s: float = 0.3, fault_for_s: Optional[float] = None,
                 post_failback: Optional[Callable[[Dict[str, Any]], None]] = None,
                 pre_fault_s: float = 0.0, progress: Optional[Callable[[int, Dict[str, Any]], None]] = None,
                 valid_on: str = "apply") -> List[Dict[str, Any]]:
    """Run ``n`` fault/repair cycles on a running LiveRun and return one record per cycle
    (CLOCK_MONOTONIC µs instants and the journal events that answer them). A cycle whose
    failover or failback does not come within its timeout is recorded with None values and
    the run goes on. ``fault_for_s``: keep the fault this long after it was applied (default:
    until convergence + ``settle_s``). ``post_failback(cycle)`` runs after the standby paths
    are armed again (the failback suite samples bandwidth there); ``pre_fault_s``: steady
    running time before each fault, beyond the hold-down. ``valid_on``: which instant must be
    known to within MAX_APPLY_MS for the cycle to count ("apply": the fault, "undo": the
    repair); the cycles go on until ``n`` count (at most n + max(5, n/5) attempts).
    ``progress(k, cycle)`` is called after each counted cycle, k = 0..n-1."""
    comms = send_comms(lr)
    cycles = []
    last_fb = now_us()
    pids = [p.pid for p in lr.procs.values()]
    attempts = 0
    while len([c for c in cycles if c["valid"]]) < n and attempts < n + max(5, n // 5):
        attempts += 1
        i = len(cycles)
        # Not a flap: the primary must have been restored for longer than its hold-down (which
        # the plugin doubles after a flap; the journal's flap events say by how much).
        cur_hold = max([hold_down_ms] + [int(e.get("hold_down_ms", 0)) for e in lr.select("flap")])
        lr.wait_for(lambda: now_us() - last_fb >= (cur_hold + 200) * 1000 + pre_fault_s * 1e6, cur_hold / 1000 + 60)
        if not lr.alive:
            break
        f = make_fault()
        rd0 = [C.thread_run_delay_ns(p) for p in pids]
        t0 = now_us()
        f.apply()
        # The change happened between t0 and applied_us; with a pre-opened handle t_issue
        # narrows that to one netlink request. Measuring from the start is conservative.
        t0 = getattr(f, "t_issue", None) or t0
        apply_ms = (f.applied_us - t0) / 1e3
        conv_ok = lr.wait_for(lambda: len(_first_per_comm(lr.events, "failover", t0, comms)) == len(comms), conv_timeout_s)
        t_conv = now_us()
        rd1 = [C.thread_run_delay_ns(p) for p in pids]
        keep = fault_for_s if fault_for_s is not None else settle_s
        base = t0 if fault_for_s is not None else t_conv
        lr.wait_for(lambda: now_us() - base >= keep * 1e6, keep + 1)
        t1 = now_us()
        f.undo()
        undo_ms = (f.undone_us - t1) / 1e3
        # Generous: a late failback is measured, not cut off (the next fault must not come
        # before it, or it would count as a flap and grow the hold-down).
        fb_timeout = max([hold_down_ms] + [int(e.get("hold_down_ms", 0)) for e in lr.select("flap")]) / 1000 + 90
        fb_ok = lr.wait_for(lambda: len(_first_per_comm(lr.events, "failback", t1, comms)) == len(comms), fb_timeout)
        fbs = _first_per_comm(lr.events, "failback", t1, comms)
        t_fb = max((e["t_us"] for e in fbs.values()), default=now_us())
        # The path that carried the traffic during the fault is fenced at failback and
        # reconnects as a standby: wait until every comm has all its paths up again.
        def rearmed() -> bool:
            for c in comms:
                since = fbs[c]["t_us"] if c in fbs else t_fb
                if not any(e.get("event") == "path_up" and e.get("comm") == c and e["t_us"] >= since for e in lr.events):
                    return False
            return True
        lr.wait_for(rearmed, 10)
        last_fb = now_us()
        evs = [e for e in lr.events if t0 <= e["t_us"] < t1]
        downs = [e for e in evs if e.get("event") in DOWN_EVENTS]
        fos = _first_per_comm(lr.events, "failover", t0, comms)
        fos = {c: e for c, e in fos.items() if e["t_us"] < t1}
        all_fo = [e for e in evs if e.get("event") == "failover"]
        rec = {
            "i": i, "t_apply": t0, "t_undo": t1, "t_failback": t_fb if fb_ok else None, "apply_ms": apply_ms,
            # A fault whose injection took longer than MAX_APPLY_MS (the injecting thread was
            # descheduled) has no known instant: recorded, but not in the statistics.
            "valid": (apply_ms if valid_on == "apply" else undo_ms) <= MAX_APPLY_MS, "undo_ms": undo_ms,
            # The longest a rank's thread waited for a CPU between the fault and convergence:
            # large values mean the machine, not the plugin, held the comm back.
            "max_run_delay_ms": C.max_delay_ms(rd0, rd1),
            "code": f.code,
            "detection_ms": (downs[0]["t_us"] - t0) / 1e3 if downs else None,
            "detection_event": downs[0]["event"] if downs else None,
            "convergence_ms": (max(e["t_us"] for e in fos.values()) - t0) / 1e3 if len(fos) == len(comms) else None,
            "first_convergence_ms": (min(e["t_us"] for e in fos.values()) - t0) / 1e3 if fos else None,
            "engine_convergence_ms": max((int(e.get("convergence_us", 0)) for e in fos.values()), default=None),
            "bytes_resent": sum(int(e.get("bytes_resent", 0)) for e in all_fo),
            "failovers": len(all_fo),
            "to_nics": sorted({e.get("to_nic") for e in fos.values()}),
            "failback_ms": (t_fb - t1) / 1e3 if fb_ok else None,
            "converged_comms": len(fos), "comms": len(comms),
        }
        if rec["engine_convergence_ms"] is not None:
            rec["engine_convergence_ms"] /= 1e3
        if post_failback:
            post_failback(rec)
        cycles.append(rec)
        if progress and rec["valid"]:  # i-th counted cycle (a discarded attempt is repeated)
            progress(sum(1 for c in cycles if c["valid"]) - 1, rec)
    return cycles


def cycles_then_finish(lr: C.LiveRun, fault: F.Fault, n: int, **kw: Any):
    """:func:`fault_cycles` with ``fault`` (``kw`` passed on), then the run stopped, the fault
    undone and closed whatever happened, and the run's result: ``(cycles, LiveResult)``."""
    try:
        cycles = fault_cycles(lr, lambda: fault, n, **kw)
    finally:
        lr.stop()
        if fault.active:
            fault.undo()
        if hasattr(fault, "close"):
            fault.close()
    return cycles, lr.finish(check=False)


def keep_journals(src: Path, dst: Path) -> None:
    """Copy a run's plugin journals (evidence for the report) next to the results."""
    dst.mkdir(parents=True, exist_ok=True)
    for j in Path(src).glob("events-rank*.jsonl"):
        shutil.copy(j, dst / j.name)


def add_stalls(cycles: List[Dict[str, Any]], buckets: List) -> None:
    """Stall and normal gap per cycle from rank 0's delivered-bytes buckets (after the run)."""
    for c in cycles:
        c["stall_ms"] = C.longest_gap_ms(buckets, c["t_apply"] - 50_000, c["t_undo"]) if buckets else None
        c["normal_gap_ms"] = C.longest_gap_ms(buckets, c["t_apply"] - 300_000, c["t_apply"]) if buckets else None


#: With ``--against``: each kind's faults are split over this many pairs of runs (one per
#: plugin, the order alternating: new-old, old-new, ...), so both plugins see the same machine
#: state as far as a shared machine allows.
AGAINST_ROUNDS = 2


def _live_run(tb: TestBed, kind: str, n: int, env: Dict[str, str], size: str, hold: int, wd: Path,
              journals: Path, console: Console, plugin: Optional[Path] = None, label: str = "") -> Dict[str, Any]:
    """One checked all-reduce with ``n`` faults of ``kind``; ``plugin``: another railover build
    (None: this one). Returns the cycles and the run's counters."""
    spec = KINDS[kind]
    opts: Dict[str, Any] = {"plugin": str(plugin)} if plugin else {}
    lr = C.LiveRun(tb, wd, env=env, workload="allreduce", minbytes=size, check=True,
                   duration_s=60 + n * 20, **opts).start()
    t_start = time.monotonic()
    fault = spec["make"](tb)

    def prog(i, rec):
        if (i + 1) % 10 == 0 or i + 1 == n:
            console.print(f"  {kind}{label}: {i + 1}/{n} faults, last convergence {C.fmt(rec['convergence_ms'], 1)} ms "
                          f"({time.monotonic() - t_start:.0f} s)")
    cycles, res = cycles_then_finish(lr, fault, n, hold_down_ms=hold, progress=prog)
    keep_journals(wd, journals)
    add_stalls(cycles, res.buckets[0] if res.buckets else [])
    out = {"cycles": cycles, "failovers": len(res.select("failover")), "flaps": len(res.select("flap")),
           "wrong_bytes": res.wrong_bytes, "rank_exit_codes": [r.returncode for r in res.perf.ranks],
           "iterations": (res.perf.ranks[0].json or {}).get("rows", [{}])[0].get("iters") if res.perf.ranks[0].json else None,
           "error": None if res.ok else res.perf.describe()[-3000:]}
    shutil.rmtree(wd, ignore_errors=True)
    return out


def _kind_summary(kind: str, runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per-kind figures over the cycles of one or more runs of the same plugin."""
    spec = KINDS[kind]
    all_cycles = [c for r in runs for c in r["cycles"]]
    cycles = [c for c in all_cycles if c["valid"]]
    its = [r["iterations"] for r in runs if r["iterations"] is not None]
    out = {
        "class": spec["cls"], "what": spec["what"], "faults": len(cycles),
        "discarded_slow_injection": len(all_cycles) - len(cycles),
        "max_run_delay_ms": C.summary([c["max_run_delay_ms"] for c in cycles]),
        "detection_ms": C.summary([c["detection_ms"] for c in cycles]),
        "convergence_ms": C.summary([c["convergence_ms"] for c in cycles]),
        "first_convergence_ms": C.summary([c["first_convergence_ms"] for c in cycles]),
        "engine_convergence_ms": C.summary([c["engine_convergence_ms"] for c in cycles]),
        "stall_ms": C.summary([c["stall_ms"] for c in cycles]),
        "apply_ms": C.summary([c["apply_ms"] for c in cycles]),
        "normal_gap_ms": C.summary([c["normal_gap_ms"] for c in cycles]),
        "bytes_resent": C.summary([c["bytes_resent"] for c in cycles]),
        "failback_ms": C.summary([c["failback_ms"] for c in cycles]),
        "not_converged": sum(1 for c in cycles if c["convergence_ms"] is None),
        "failovers": sum(r["failovers"] for r in runs),
        "failovers_in_fault_windows": sum(c["failovers"] for c in all_cycles),
        "flaps": sum(r["flaps"] for r in runs), "wrong_bytes": sum(r["wrong_bytes"] for r in runs),
        "rank_exit_codes": [x for r in runs for x in r["rank_exit_codes"]],
        "iterations": sum(its) if its else None,
        "runs": len(runs),
        "cycles": all_cycles,
    }
    errors = [r["error"] for r in runs if r["error"]]
    if errors:
        out["error"] = "\n---\n".join(errors)[-3000:]
    return out


def _add_kind_targets(rep: C.Report, per_kind: Dict[str, Any], n: int, who: str = "") -> None:
    """The suite's targets per kind; ``n``: the faults per kind asked for. A kind with fewer
    counted faults says so (its percentiles are over fewer samples than asked): on a busy host
    an injection can take longer than MAX_APPLY_MS (seen for host-down's admin-down, 9-19 ms
    per netlink call beside a CPU hog per core), and such a cycle is run but not counted."""
    for kind, r in per_kind.items():
        lim = TARGET_MS[r["class"]]
        cv = r["convergence_ms"]
        disc = r["discarded_slow_injection"]
        rep.add_target(f"failover{who}: {kind} faults counted", r["faults"], ">=", n,
                       detail=(f"{disc} more run but not counted: their injection took over {MAX_APPLY_MS:g} ms (the "
                               "injecting thread was descheduled), so their instant is unknown") if disc else
                       ("" if r["faults"] >= n else "the run ended before them (see the run's error)"))
        rep.add_target(f"failover{who}: {kind} convergence p99", cv["p99"], "<=", lim, "ms",
                       detail=f"p50 {C.fmt(cv['p50'], 1)}, max {C.fmt(cv['max'], 1)} ms over {cv['n']} faults; "
                              f"detection p99 {C.fmt(r['detection_ms']['p99'], 1)} ms")
        rep.add_target(f"failover{who}: {kind} faults not converged", r["not_converged"], "==", 0)
        rep.add_target(f"failover{who}: {kind} wrong bytes", r["wrong_bytes"], "==", 0, "B")
        rep.add_target(f"failover{who}: {kind} ranks exited 0", 1 if all(x == 0 for x in r["rank_exit_codes"]) else 0,
                       "==", 1)


def compare(new: Dict[str, Any], old: Dict[str, Any]) -> Dict[str, Any]:
    """Per kind, this build against the other: ratios new/old of convergence p50 and p99 and of
    detection p99 (< 1: this build is faster), failovers outside fault windows (false ones) of
    each."""
    out = {}
    for kind in new:
        if kind not in old:
            continue
        a, b = new[kind], old[kind]
        out[kind] = {
            "convergence_p50": C.ratio(a["convergence_ms"]["p50"], b["convergence_ms"]["p50"]),
            "convergence_p99": C.ratio(a["convergence_ms"]["p99"], b["convergence_ms"]["p99"]),
            "detection_p99": C.ratio(a["detection_ms"]["p99"], b["detection_ms"]["p99"]),
            "false_failovers": [a["failovers"] - a["failovers_in_fault_windows"],
                                b["failovers"] - b["failovers_in_fault_windows"]],
        }
    return out


def run(out: Path, quick: bool = False, faults: Optional[int] = None,
        kinds: Sequence[str] = tuple(KINDS), size: str = "1M", console: Optional[Console] = None,
        against: Optional[Path] = None) -> Dict[str, Any]:
    """Runs the suite; ``against``: another railover plugin (file or build directory) run with
    the same faults on the same bed in the same run, interleaved (:data:`AGAINST_ROUNDS` pairs
    of runs per kind, alternating order), compared per kind in ``results["vs_against"]``."""
    from railover.bench.healthy import against_path
    console = console or Console()
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise C.BenchError(f"unknown fault kind(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                           f"known: {', '.join(KINDS)}")
    n = faults or (3 if quick else 50)
    hold = 300
    env = {"RAILOVER_HOLD_DOWN_MS": str(hold)}
    against_so = against_path(against) if against else None
    settings = {"faults_per_kind": n, "kinds": list(kinds), "size": size, "workload": "allreduce", "ranks": 2,
                "layout": "T2", "check": True, "env": env, "settle_s": 0.3}
    if against_so:
        settings.update({"against": str(against_so), "against_sha256": C._sha256(against_so)[:16],
                         "against_rounds": AGAINST_ROUNDS})
    rep = C.Report("failover", out, quick, settings)
    work = Path(out) / "failover-work"
    journals = Path(out) / "failover-journals"
    per_kind: Dict[str, Any] = {}
    per_kind_old: Dict[str, Any] = {}
    rep.results["kinds"] = per_kind  # filled as each kind finishes: an interrupted run keeps them
    with TestBed("T2") as tb:
        for kind in kinds:
            spec = KINDS[kind]
            console.print(f"[bold]failover[/] {kind}: {n} x {spec['what']} ({tb.prefix})"
                          + (f", against {against_so} interleaved" if against_so else ""))
            if not against_so:
                per_kind[kind] = _kind_summary(kind, [_live_run(tb, kind, n, env, size, hold, work / kind,
                                                                journals / kind, console)])
            else:
                rounds = min(AGAINST_ROUNDS, n)
                split = [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]
                mine: List[Dict[str, Any]] = []
                theirs: List[Dict[str, Any]] = []
                for r, k in enumerate(split):
                    order = [None, against_so] if r % 2 == 0 else [against_so, None]
                    for plugin in order:
                        who = "against" if plugin else "railover"
                        res = _live_run(tb, kind, k, env, size, hold, work / f"{kind}-{who}-{r}",
                                        journals / f"{kind}-{who}-{r}", console, plugin=plugin,
                                        label=f" ({who}, round {r + 1}/{rounds})")
                        (theirs if plugin else mine).append(res)
                per_kind[kind] = _kind_summary(kind, mine)
                per_kind_old[kind] = _kind_summary(kind, theirs)
            for pk in (per_kind, per_kind_old):
                if kind in pk:
                    rep.add_wrong(pk[kind]["wrong_bytes"])
    shutil.rmtree(work, ignore_errors=True)
    rep.results["kinds"] = per_kind
    _add_kind_targets(rep, per_kind, n)
    if against_so:
        rep.results["against"] = {"kinds": per_kind_old}
        rep.results["vs_against"] = compare(per_kind, per_kind_old)
        _add_kind_targets(rep, per_kind_old, n, " (against)")
    _plot(rep, per_kind)
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def _plot(rep: C.Report, per_kind: Dict[str, Any]) -> None:
    if not per_kind:
        return
    plt = C.matplotlib_pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for kind, r in per_kind.items():
        for ax, key in zip(axes, ("convergence_ms", "detection_ms")):
            v = sorted(c[key] for c in r["cycles"] if c[key] is not None and c["valid"])
            if v:
                ax.step(v, [(i + 1) / len(v) for i in range(len(v))], where="post", label=f"{kind} (n={len(v)})")
    for ax, title, key in zip(axes, ("convergence: fault -> every comm resumed", "detection: fault -> first down event"),
                              ("convergence", "detection")):
        ax.set_xscale("log")
        ax.set_xlabel("ms after the fault")
        ax.set_ylabel("fraction of faults")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for lim, ls in ((20, ":"), (200, "--")):
        axes[0].axvline(lim, color="k", ls=ls, lw=0.8)
    fig.tight_layout()
    fig.savefig(rep.plot_path("failover-cdf.png"), dpi=100)
    plt.close(fig)


def tables(data: Dict[str, Any]) -> List[Table]:
    t = Table(title=f"failover: {data['settings']['faults_per_kind']} faults per kind under a checked all-reduce "
                    f"(ms; p50 / p99 / max)")
    for c in ("kind", "faults", "detection", "convergence (all comms)", "first comm", "stall (normal gap)",
              "bytes resent p50/max", "CPU wait", "not conv.", "wrong B"):
        t.add_column(c, justify="right")
    for kind, r in data["results"]["kinds"].items():
        s = lambda k, nd=1: C.p50_p99_max(r[k], nd)
        t.add_row(kind, str(r["faults"]), s("detection_ms"), s("convergence_ms"), s("first_convergence_ms"),
                  f"{s('stall_ms', 0)} ({C.fmt(r['normal_gap_ms']['p50'], 0)})",
                  f"{C.fmt(r['bytes_resent']['p50'], 0)} / {C.fmt(r['bytes_resent']['max'], 0)}",
                  s("max_run_delay_ms"), str(r["not_converged"]), str(r["wrong_bytes"]))
    out = [t]
    if data["results"].get("vs_against"):
        out.append(against_table(data))
    return out


def _against_rows(data: Dict[str, Any]) -> List[List[str]]:
    old = data["results"]["against"]["kinds"]
    rows = []
    for kind, v in data["results"]["vs_against"].items():
        a, b = data["results"]["kinds"][kind], old[kind]
        rows.append([kind, f"{a['faults']} / {b['faults']}", C.p50_p99_max(a["convergence_ms"], 1),
                     C.p50_p99_max(b["convergence_ms"], 1), C.fmt(v["convergence_p50"], 2),
                     C.fmt(v["convergence_p99"], 2), C.fmt(v["detection_p99"], 2),
                     f"{v['false_failovers'][0]} / {v['false_failovers'][1]}",
                     f"{a['not_converged']} / {b['not_converged']}", f"{a['wrong_bytes']} / {b['wrong_bytes']}"])
    return rows


AGAINST_COLUMNS = ("kind", "faults (this / other)", "convergence, this build", "convergence, other build",
                   "p50 this/other", "p99 this/other", "detection p99 this/other",
                   "failovers outside faults (this / other)", "not converged", "wrong bytes")


def against_table(data: Dict[str, Any]) -> Table:
    t = Table(title=f"failover: this build against {data['settings']['against']} (same faults, same bed, "
                    f"interleaved in {data['settings']['against_rounds']} rounds; ms p50 / p99 / max; ratios < 1: "
                    "this build is faster)")
    for c in AGAINST_COLUMNS:
        t.add_column(c, justify="right")
    for row in _against_rows(data):
        t.add_row(*row)
    return t


def markdown(data: Dict[str, Any]) -> str:
    L = [f"{data['settings']['faults_per_kind']} faults per kind, ring all-reduce of {data['settings']['size']} "
         f"(2 hosts x 2 NICs, 1 rank per host, every byte checked), `RAILOVER_HOLD_DOWN_MS=300`, other settings "
         "default. Milliseconds, p50 / p99 / max.\n",
         "| kind | faults | detection | convergence (every comm) | first comm | engine (verdict→resumed) | stall | normal gap p50 | bytes resent p50 / max | run-queue wait of the most delayed rank thread | not converged | flaps | wrong bytes |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, r in data["results"]["kinds"].items():
        s = lambda k, nd=1: C.p50_p99_max(r[k], nd)
        L.append(f"| {kind} ({r['what']}) | {r['faults']} | {s('detection_ms')} | {s('convergence_ms')} | "
                 f"{s('first_convergence_ms')} | {s('engine_convergence_ms')} | {s('stall_ms', 0)} | "
                 f"{C.fmt(r['normal_gap_ms']['p50'], 0)} | {C.fmt(r['bytes_resent']['p50'], 0)} / "
                 f"{C.fmt(r['bytes_resent']['max'], 0)} | {s('max_run_delay_ms')} | {r['not_converged']} | {r['flaps']} | "
                 f"{r['wrong_bytes']} |")
    disc = {k: r["discarded_slow_injection"] for k, r in data["results"]["kinds"].items() if r.get("discarded_slow_injection")}
    L.append("\nA fault is issued with one netlink request on a pre-opened handle and timed from just before it; "
             f"faults whose injection took more than {MAX_APPLY_MS:g} ms (the injecting thread was descheduled, so "
             "the instant is unknown) are repeated and left out: "
             + (", ".join(f"{k}: {v}" for k, v in disc.items()) if disc else "none") + ". "
             "The run-queue wait is, for the rank thread that waited most, the time it was runnable but not "
             "running between the fault and convergence (/proc/<pid>/task/*/schedstat): when it is close to "
             "the convergence time, the rank was not running.")
    if data["results"].get("vs_against"):
        L += ["", f"Against `{data['settings']['against']}` (sha256 {data['settings']['against_sha256']}…), the same "
              f"faults on the same bed in the same run, interleaved in {data['settings']['against_rounds']} rounds "
              "(order alternating). Ratios this/other, < 1: this build is faster.\n",
              "| " + " | ".join(AGAINST_COLUMNS) + " |", "|---|" + "---:|" * (len(AGAINST_COLUMNS) - 1)]
        L += ["| " + " | ".join(r) + " |" for r in _against_rows(data)]
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------- --peer mptcp

class RailSampler:
    """Bytes received by host B's NIC on rail 0 and rail 1, sampled every ``every_s`` from a
    pre-opened netlink handle: ``series`` = [(t_us, rx_rail0, rx_rail1)]. Tells which rail
    carries the traffic, whatever carries it (railover paths or MPTCP subflows)."""

    def __init__(self, tb: TestBed, every_s: float = 0.01):
        import threading
        from pyroute2 import IPRoute
        b0, b1 = tb.nic("b0"), tb.nic("b1")
        self.ipr = IPRoute(netns=b0.ns, flags=0)
        self.idx = [self.ipr.link_lookup(ifname=b0.ifname)[0], self.ipr.link_lookup(ifname=b1.ifname)[0]]
        self.every_s = every_s
        self.series: List[tuple] = []
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)
        self._th.start()

    def _rx(self) -> List[int]:
        return [int(self.ipr.get_links(i)[0].get("IFLA_STATS64")["rx_bytes"]) for i in self.idx]

    def _loop(self) -> None:
        while not self._stop.is_set():
            r = self._rx()
            self.series.append((now_us(), r[0], r[1]))
            self._stop.wait(self.every_s)

    def share(self, t0: int, t1: int) -> Optional[tuple]:
        """(bytes on rail 0, bytes on rail 1) received in [t0, t1] (None without two samples)."""
        pts = [p for p in self.series if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return None
        return pts[-1][1] - pts[0][1], pts[-1][2] - pts[0][2]

    def on_primary_since(self, since: int, window_us: int = 100_000, frac: float = 0.9,
                         min_bytes: int = 100_000, windows: int = 3) -> Optional[int]:
        """Start of the first run of ``windows`` consecutive ``window_us`` windows after
        ``since`` in each of which rail 0 carried at least ``frac`` of at least ``min_bytes``
        received: the instant traffic was back on the primary (None if not yet). Sustained,
        so that a short burst on rail 0 (railover's full-size probe burst, a retransmission)
        is not taken for a failback."""
        pts = [p for p in self.series if p[0] >= since]

        def ok(i: int) -> Optional[int]:
            j = i
            while j < len(pts) and pts[j][0] - pts[i][0] < window_us:
                j += 1
            if j >= len(pts):
                return None
            d0, d1 = pts[j][1] - pts[i][1], pts[j][2] - pts[i][2]
            return j if d0 + d1 >= min_bytes and d0 >= frac * (d0 + d1) else -1

        for i in range(len(pts)):
            k, good = i, 0
            while good < windows:
                j = ok(k)
                if j is None:
                    return None
                if j < 0:
                    break
                good, k = good + 1, j
            if good == windows:
                return pts[i][0]
        return None

    def close(self) -> None:
        self._stop.set()
        self._th.join(2)
        self.ipr.close()


PEER_KINDS = {
    "port-down": (lambda tb: NetlinkFault(tb.nic("a0"), "PORT-DOWN"), "switch port of a0 down (carrier loss)"),
    "silent": (lambda tb: GroupFault(tb.nic("a0"), "SILENT"), "black hole at a0's switch port, no carrier event"),
}


def _wait(pred: Callable[[], Any], timeout_s: float, alive: Callable[[], bool], every_s: float = 0.01) -> bool:
    """Poll ``pred`` until true (True), the time is up or the peer died (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline or not alive():
            return bool(pred())
        time.sleep(every_s)


def peer_spacing_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """Seconds from a failback to the next fault of :func:`peer_cycles`: 5, or 2 past the
    hold-down the ranks inherit (:func:`railover.bench.common.plugin_hold_down_s`) when that
    is longer. Nearer, railover would count the fault a flap (a path failing again within its
    hold-down of becoming active doubles it) and the cycles after it would measure a longer
    failback than the configured one."""
    return max(5.0, C.plugin_hold_down_s(environ) + 2.0)


def peer_cycles(tb: TestBed, rs: RailSampler, alive: Callable[[], bool], kinds: Sequence[str], n: int,
                fault_for_s: float, failback_window_s: float, console: Console, name: str,
                spacing_s: float = 5.0) -> List[Dict[str, Any]]:
    """``n`` fault/repair cycles per kind on rail 0 (host A's a0) against whatever runs on the
    bed (railover or MPTCP): each waits until rail 0 carries the traffic, applies the fault,
    keeps it ``fault_for_s``, repairs, waits up to ``failback_window_s`` for traffic to be
    back on rail 0, then ``spacing_s`` more. Records instants (µs) only; stalls come from the
    receiver's buckets."""
    recs = []
    for kind in kinds:
        f = PEER_KINDS[kind][0](tb)
        try:
            for i in range(n):
                # 2 s of traffic on rail 0 (4 x 500 ms): the rate before the fault, which
                # `survived` compares against, is measured over the 2 s before it (a loaded
                # host was seen to start the stream 0.2 s before the first fault: rate 0).
                steady = _wait(lambda: rs.on_primary_since(now_us() - 2_600_000, 500_000, windows=4) is not None, 60, alive)
                if not alive():
                    break
                f.apply()
                t0 = getattr(f, "t_issue", None) or f.applied_us
                _wait(lambda: now_us() - t0 >= fault_for_s * 1e6, fault_for_s + 1, lambda: True)
                f.undo()
                t1 = f.undone_us
                _wait(lambda: rs.on_primary_since(t1) is not None, failback_window_s, alive, 0.05)
                tfb = rs.on_primary_since(t1)
                rec = {"peer": name, "kind": kind, "i": i, "t_apply": t0, "t_undo": t1, "steady_before": steady,
                       "failback_ms": (tfb - t1) / 1e3 if tfb else None, "t_failback": tfb}
                recs.append(rec)
                # Not a flap: the next fault comes spacing_s after the failback, which the
                # caller makes longer than railover's hold-down (a path failing again within
                # its hold-down of becoming active doubles it).
                t_fb = tfb or now_us()
                _wait(lambda: now_us() - t_fb >= spacing_s * 1e6, spacing_s + 1, lambda: True)
                console.print(f"  {name} {kind} #{i}: failback "
                              + (f"{rec['failback_ms']:.0f} ms after repair" if tfb else f"not within {failback_window_s:g} s"))
        finally:
            if f.active:
                f.undo()
            f.close()
    return recs


def second_fault(tb: TestBed, rs: RailSampler, alive: Callable[[], bool], outage_s: float, after_s: float,
                 second_for_s: float, recover_s: float, console: Console, name: str,
                 snapshot: Optional[Callable[[], str]] = None) -> Dict[str, Any]:
    """Rail 0 down (carrier) for ``outage_s``, repaired; ``after_s`` later rail 1 goes down
    for ``second_for_s``, then is repaired; up to ``recover_s`` more to see traffic again."""
    fa, fb = NetlinkFault(tb.nic("a0"), "PORT-DOWN"), NetlinkFault(tb.nic("a1"), "PORT-DOWN")
    try:
        _wait(lambda: rs.on_primary_since(now_us() - 2_600_000, 500_000, windows=4) is not None, 60, alive)
        fa.apply()
        t0 = fa.t_issue
        snap = ""
        if snapshot:  # the connection's state 5 s into the outage
            _wait(lambda: now_us() - t0 >= min(5.0, outage_s / 2) * 1e6, outage_s + 1, lambda: True)
            snap = snapshot()
        _wait(lambda: now_us() - t0 >= outage_s * 1e6, outage_s + 1, lambda: True)
        fa.undo()
        t1 = fa.undone_us
        _wait(lambda: now_us() - t1 >= after_s * 1e6, after_s + 1, lambda: True)
        where = rs.share(now_us() - 500_000, now_us())
        fb.apply()
        t2 = fb.t_issue
        _wait(lambda: now_us() - t2 >= second_for_s * 1e6, second_for_s + 1, lambda: True)
        fb.undo()
        t3 = fb.undone_us
        _wait(lambda: now_us() - t3 >= recover_s * 1e6, recover_s + 1, lambda: True)
        tfb = rs.on_primary_since(t1)
    finally:
        for f in (fa, fb):
            if f.active:
                f.undo()
            f.close()
    t_from = t0 - 1_000_000
    rails = [(round((t - t_from) / 1e6, 3), r0, r1) for t, r0, r1 in rs.series if t >= t_from]
    rail_100ms = []  # bytes received by B on (rail 0, rail 1) per 100 ms, from 1 s before the fault
    for a, b in zip(rails[::10], rails[10::10]):
        rail_100ms.append((b[1] - a[1], b[2] - a[2]))
    rec = {"peer": name, "t_apply": t0, "t_undo": t1, "t_second": t2, "t_second_undo": t3, "rail_rx_100ms": rail_100ms,
           "snapshot_in_outage": snap,
           "outage_s": outage_s, "after_s": after_s, "second_for_s": second_for_s, "recover_s": recover_s,
           "failback_ms": (tfb - t1) / 1e3 if tfb and tfb < t2 else None,
           "rail_bytes_before_second": where,
           "on_rail1_at_second": bool(where and where[1] > where[0])}
    console.print(f"  {name} second fault: traffic on rail {'1' if rec['on_rail1_at_second'] else '0'} "
                  f"{after_s:g} s after a {outage_s:g} s outage was repaired")
    return rec


def _resume_ms(buckets, t_from: int, t_to: int) -> Optional[float]:
    """ms from ``t_from`` (a fault) to the end of the first delivery gap of at least 20 ms that
    starts between 50 ms before and 2 s after it; 0.0 when there is no such gap; None when
    nothing was delivered again before ``t_to``."""
    run_start = None
    delivered = False
    for t, b in buckets:
        if t < t_from - 50_000:
            continue
        if t >= t_to:
            break
        if b == 0:
            if run_start is None:
                run_start = t
            continue
        if run_start is not None and t - run_start >= 20_000 and run_start <= t_from + 2_000_000 and t > t_from:
            return (t - t_from) / 1e3
        run_start = None
        delivered = delivered or t >= t_from
        if t > t_from + 2_000_000:
            return 0.0
    return 0.0 if delivered and run_start is None else None


SURVIVED_FRACTION = 0.1


def _rate(buckets, t0: int, t1: int) -> float:
    """Bytes per second delivered in [t0, t1)."""
    return sum(b for t, b in buckets if t0 <= t < t1) / max(1e-6, (t1 - t0) / 1e6)


def _survived(before: float, during: float) -> bool:
    """The stream carried on: during the fault at least SURVIVED_FRACTION of the rate before
    it (a trickle of retransmissions is not survival)."""
    return before > 0 and during >= SURVIVED_FRACTION * before


def peer_stats(recs: List[Dict[str, Any]], buckets, seconds: List[Dict[str, Any]], ok: bool,
               wrong: int) -> Dict[str, Any]:
    """Per kind: survived (in the last second of the fault the stream delivered at least
    SURVIVED_FRACTION of its rate before the fault), stall p50/p99/max (longest gap from 50 ms before the fault to the repair),
    failback p50/p99/max (repair -> rail 0 carries >= 90 % again; hold-down included)."""
    out: Dict[str, Any] = {"kinds": {}}
    for kind in PEER_KINDS:
        rs = [r for r in recs if r["kind"] == kind]
        if not rs:
            continue
        for r in rs:
            r["stall_ms"] = C.longest_gap_ms(buckets, r["t_apply"] - 50_000, r["t_undo"])
            # the same measure over the 2 s before the fault: this machine's noise floor
            r["normal_gap_ms"] = C.longest_gap_ms(buckets, r["t_apply"] - 2_000_000, r["t_apply"])
            r["delivered_late_in_fault"] = sum(b for t, b in buckets if r["t_undo"] - 500_000 <= t < r["t_undo"])
            r["rate_before_Bps"] = _rate(buckets, r["t_apply"] - 2_000_000, r["t_apply"])
            r["rate_late_in_fault_Bps"] = _rate(buckets, r["t_undo"] - 1_000_000, r["t_undo"])
            r["survived"] = _survived(r["rate_before_Bps"], r["rate_late_in_fault_Bps"])
        out["kinds"][kind] = {
            "faults": len(rs), "survived": sum(1 for r in rs if r["survived"]),
            "stall_ms": C.summary([r["stall_ms"] for r in rs]),
            "normal_gap_ms": C.summary([r["normal_gap_ms"] for r in rs]),
            "failback_ms": C.summary([r["failback_ms"] for r in rs]),
            "failback_missing": sum(1 for r in rs if r["failback_ms"] is None),
            "cycles": rs}
    for s in seconds:
        s["first_stall_ms"] = C.longest_gap_ms(buckets, s["t_apply"] - 50_000, s["t_undo"])
        s["second_stall_ms"] = C.longest_gap_ms(buckets, s["t_second"] - 50_000, s["t_second_undo"])
        s["rate_before_Bps"] = _rate(buckets, s["t_apply"] - 2_000_000, s["t_apply"])
        # the outage after its first second (detection), and the second fault after its first second
        s["rate_in_outage_Bps"] = _rate(buckets, s["t_apply"] + 1_000_000, s["t_undo"])
        s["rate_in_second_Bps"] = _rate(buckets, s["t_second"] + 1_000_000, s["t_second_undo"])
        s["outage_survived"] = _survived(s["rate_before_Bps"], s["rate_in_outage_Bps"])
        s["second_survived"] = _survived(s["rate_before_Bps"], s["rate_in_second_Bps"])
        s["second_resume_ms"] = _resume_ms(buckets, s["t_second"], s["t_second_undo"] + int(60e6))
        s["delivered_after_all_repaired"] = sum(b for t, b in buckets if s["t_second_undo"] <= t < s["t_second_undo"]
                                                + int(s.get("recover_s", 0) * 1e6))
        s["normal_gap_ms"] = C.longest_gap_ms(buckets, s["t_apply"] - 2_000_000, s["t_apply"])
        # delivered bytes per 100 ms from 1 s before the first fault to the end: the timeline
        t_from = s["t_apply"] - 1_000_000
        per: Dict[int, int] = {}
        for t, b in buckets:
            if t >= t_from:
                per[(t - t_from) // 100_000] = per.get((t - t_from) // 100_000, 0) + b
        s["timeline_100ms"] = [per.get(i, 0) for i in range(max(per) + 1)] if per else []
    if seconds:
        out["second_faults"] = seconds
        out["second_fault"] = seconds[0]  # the one plotted
    out["stream_ok"] = ok
    out["wrong_bytes"] = wrong
    return out


def run_peers(out: Path, quick: bool = False, faults: Optional[int] = None, kinds: Sequence[str] = tuple(PEER_KINDS),
              size: str = "1M", outage_s: Optional[float] = None, second_repeats: Optional[int] = None,
              console: Optional[Console] = None) -> Dict[str, Any]:
    """railover and Linux MPTCP (backup subflow on the standby rail, see
    :mod:`railover.bench.mptcp`) side by side on one T2 bed in one run, under the same faults
    on rail 0: survived, stall, failback, and a second fault on rail 1 after a long outage."""
    from railover.bench import mptcp as M
    console = console or Console()
    n = faults or (1 if quick else 5)
    fault_for_s = 2.0 if quick else 5.0
    spacing_s = peer_spacing_s()
    outage = outage_s if outage_s is not None else (5.0 if quick else 60.0)
    # the second fault 10 s after the repair (both peers had time to fail back), twice, and
    # once 1 s after it (railover still in its hold-down, on the standby rail)
    afters, second_for_s, recover_s = ((5.0,), 5.0, 5.0) if quick else ((10.0, 10.0, 1.0), 20.0, 30.0)
    failback_window_s = 20.0 if quick else 90.0
    if second_repeats:
        afters = tuple(afters[i % len(afters)] for i in range(second_repeats))
    bad = [k for k in kinds if k not in PEER_KINDS]
    if bad:
        raise C.BenchError(f"--peer mptcp compares {', '.join(PEER_KINDS)}; not {', '.join(bad)}")
    rep = C.Report("failover-peers", out, quick, {
        "faults_per_kind": n, "kinds": list(kinds), "fault_for_s": fault_for_s, "failback_window_s": failback_window_s,
        "spacing_after_failback_s": spacing_s,
        "second_fault": {"outage_s": outage, "after_s": list(afters), "second_for_s": second_for_s, "recover_s": recover_s,
                         "repeats": len(afters)},
        "railover": {"workload": "allreduce", "size": size, "ranks": 2, "check": True, "env": "plugin defaults (but inherited_env)"},
        "mptcp": {"stream": "64-bit counter words, every byte checked at the receiver", "setup": None, "sysctls": None}})
    work = Path(out) / "peers-work"
    # Each peer's part is stored (with its wrong-bytes target) as soon as it is measured, so an
    # interrupted run keeps railover's part when MPTCP's is cut short (Report.save_interrupted).
    results: Dict[str, Any] = rep.results.setdefault("peers", {})
    with TestBed("T2") as tb:
        rs = RailSampler(tb)
        try:
            # railover: the checked all-reduce, plugin defaults (hold-down 3 s)
            console.print(f"[bold]failover --peer mptcp[/]: railover ({tb.prefix})")
            lr = C.LiveRun(tb, work / "railover", workload="allreduce", minbytes=size, check=True,
                           duration_s=3000, timeout_s=3300).start()
            try:
                recs = peer_cycles(tb, rs, lambda: lr.alive, kinds, n, fault_for_s, failback_window_s, console, "railover",
                                   spacing_s=spacing_s)
                sec = [second_fault(tb, rs, lambda: lr.alive, outage, a, second_for_s, recover_s, console, "railover")
                       for a in afters]
            finally:
                lr.stop()
            res = lr.finish(check=False)
            rep.add_wrong(res.wrong_bytes)
            # rank 1 (host B) receives what rank 0 sends A -> B: the MPTCP stream's direction
            # cross-check of the rail-counter failback: the plugin's own failback events
            for r in recs:
                fb = [e["t_us"] for e in res.select("failback", r["t_undo"]) if e.get("rank") == 0]
                r["journal_failback_ms"] = (fb[0] - r["t_undo"]) / 1e3 if fb else None
            part = peer_stats(recs, res.buckets[1], sec, res.ok, res.wrong_bytes)
            part["rank_exit_codes"] = [r.returncode for r in res.perf.ranks]
            part["failovers"] = len(res.select("failover"))
            if not res.ok:
                part["error"] = res.perf.describe()[-3000:]
            results["railover"] = part  # whole or not at all
            rep.add_target("railover: wrong bytes", part["wrong_bytes"], "==", 0, "B")
            # MPTCP
            console.print(f"[bold]failover --peer mptcp[/]: Linux MPTCP, backup subflow on rail 1")
            peer = M.MptcpPeer(tb, work / "mptcp", max_s=3000)
            peer.configure()
            rep.data["settings"]["mptcp"]["setup"] = peer.setup
            rep.data["settings"]["mptcp"]["sysctls"] = {"A": M.sysctls(tb, "A"), "B": M.sysctls(tb, "B")}
            peer.start()
            rep.data["settings"]["mptcp"]["subflows_at_start"] = peer.subflows
            try:
                recs = peer_cycles(tb, rs, lambda: peer.alive, kinds, n, fault_for_s, failback_window_s, console, "mptcp",
                                   spacing_s=spacing_s)
                sec = [second_fault(tb, rs, lambda: peer.alive, outage, a, second_for_s, recover_s, console, "mptcp",
                                    snapshot=peer.snapshot)
                       for a in afters]
            finally:
                r = peer.stop()
            rep.add_wrong(r["wrong"])
            ok = r["connected"] and not r["error"] and r["wrong"] == 0
            part = peer_stats(recs, r["buckets"], sec, ok, r["wrong"])
            part.update({"bytes": r["bytes"], "error": r["error"], "send_exit": r["send_exit"], "send_out": r["send_out"]})
            results["mptcp"] = part
            rep.add_target("mptcp: wrong bytes", part["wrong_bytes"], "==", 0, "B")
        finally:
            rs.close()
    shutil.rmtree(work, ignore_errors=True)
    _peer_plot(rep, results)
    data = rep.finish()
    for t in peer_tables(data):
        console.print(t)
    return data


def peer_tables(data: Dict[str, Any]) -> List[Table]:
    st = data["settings"]
    t = Table(title=f"railover vs Linux MPTCP (backup subflow), {st['faults_per_kind']} faults per kind on rail 0, "
                    f"each held {st['fault_for_s']:g} s (ms: p50 / p99 / max)")
    for c in ("peer", "fault", "survived", "stall", "normal gap p50", "failback after repair", "no failback in window"):
        t.add_column(c, justify="right")
    for name, r in data["results"]["peers"].items():
        for kind, k in r["kinds"].items():
            t.add_row(name, kind, f"{k['survived']}/{k['faults']}", C.p50_p99_max(k["stall_ms"], 0),
                      C.fmt(k["normal_gap_ms"]["p50"], 0), C.p50_p99_max(k["failback_ms"], 0), str(k["failback_missing"]))
    s2 = st["second_fault"]
    u = Table(title=f"second fault: rail 0 down {s2['outage_s']:g} s, repaired; some seconds later rail 1 down "
                    f"{s2['second_for_s']:g} s")
    for c in ("peer", "2nd fault after repair", "stall (1st)", "rate in the outage / before", "failback after the outage",
              "traffic at the 2nd fault", "2nd fault survived",
              "stall (2nd)", "resumed after 2nd fault", "bytes after all repaired"):
        u.add_column(c, justify="right")
    for name, r in data["results"]["peers"].items():
        for k, x in enumerate(r.get("second_faults", [])):
            u.add_row(f"{name} #{k + 1}", f"{x['after_s']:g} s", C.fmt(x["first_stall_ms"], 0) + " ms",
                      C.fmt(C.ratio(x["rate_in_outage_Bps"], x["rate_before_Bps"]), 3),
                      (C.fmt(x["failback_ms"], 0) + " ms") if x["failback_ms"] is not None else f"none in {x['after_s']:g} s",
                      "rail 1" if x["on_rail1_at_second"] else "rail 0", "yes" if x["second_survived"] else "[red]no[/]",
                      C.fmt(x["second_stall_ms"], 0) + " ms",
                      (C.fmt(x["second_resume_ms"], 0) + " ms") if x["second_resume_ms"] is not None else "no",
                      str(x["delivered_after_all_repaired"]))
    return [t, u]


def _peer_plot(rep: C.Report, results: Dict[str, Any]) -> None:
    """Delivered MB per 100 ms through the second-fault scenario, one panel per peer."""
    have = [(n, r["second_fault"]) for n, r in results.items() if r.get("second_fault", {}).get("timeline_100ms")]
    if not have:
        return
    plt = C.matplotlib_pyplot()
    fig, axes = plt.subplots(len(have), 1, figsize=(11, 2.6 * len(have)), squeeze=False)
    for ax, (name, s) in zip(axes[:, 0], have):
        base = s["t_apply"] - 1_000_000
        tl = s["timeline_100ms"]
        ax.plot([i / 10 for i in range(len(tl))], [b / 1e6 for b in tl], lw=0.8, label="delivered")
        for t, what, c in ((s["t_apply"], "rail 0 down", "r"), (s["t_undo"], "rail 0 repaired", "g"),
                           (s["t_second"], "rail 1 down", "m"), (s["t_second_undo"], "rail 1 repaired", "b")):
            ax.axvline((t - base) / 1e6, color=c, ls="--", lw=0.8, label=what)
        ax.set_title(f"{name}: rail 0 down {s['outage_s']:g} s, then rail 1 down {s['second_for_s']:g} s "
                     f"{s['after_s']:g} s after the repair", fontsize=9)
        ax.set_ylabel("MB / 100 ms", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("s", fontsize=8)
    fig.tight_layout()
    fig.savefig(rep.plot_path("failover-peers.png"), dpi=100)
    plt.close(fig)


def peer_markdown(data: Dict[str, Any]) -> str:
    """The two tables of ``--peer mptcp`` as markdown (docs/BENCHMARKS.md)."""
    st = data["settings"]
    s2 = st["second_fault"]
    L = [f"{st['faults_per_kind']} faults per kind on rail 0 (host A's NIC a0), each held {st['fault_for_s']:g} s; "
         f"the next fault {st.get('spacing_after_failback_s', 5):g} s after the failback. Milliseconds, p50 / p99 / max. "
         "Stall: the longest run of 1 ms buckets without a delivered byte at host B, from 50 ms before the fault "
         "to the repair; normal gap: the same over the 2 s before the fault. Survived: in the fault's last second "
         "the receiver got at least 10 % of its rate before the fault. Failback: repair -> rail 0 carries "
         ">= 90 % of host B's received bytes again (railover: hold-down 3 s included).\n",
         "| peer | fault | survived | stall | normal gap p50 | failback after repair |", "|---|---|---:|---:|---:|---:|"]
    for name, r in data["results"]["peers"].items():
        for kind, k in r["kinds"].items():
            L.append(f"| {name} | {kind} | {k['survived']}/{k['faults']} | {C.p50_p99_max(k['stall_ms'], 0)} | "
                     f"{C.fmt(k['normal_gap_ms']['p50'], 0)} | {C.p50_p99_max(k['failback_ms'], 0)} |")
    L += ["", f"Second fault: rail 0 down {s2['outage_s']:g} s, repaired; some seconds later rail 1 down "
              f"{s2['second_for_s']:g} s; {s2.get('repeats', 1)} time(s) per peer.\n",
          "| peer | 2nd fault after the repair | stall during the outage | rate during the outage / before | failback after it | traffic on at the 2nd fault | 2nd fault survived "
          "| stall (2nd) | delivery resumed after the 2nd fault |", "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for name, r in data["results"]["peers"].items():
        for k, x in enumerate(r.get("second_faults", [])):
            L.append(f"| {name} #{k + 1} | {x['after_s']:g} s | {C.fmt(x['first_stall_ms'], 0)} | "
                     f"{C.fmt(C.ratio(x['rate_in_outage_Bps'], x['rate_before_Bps']), 3)} | "
                     + (f"{C.fmt(x['failback_ms'], 0)}" if x["failback_ms"] is not None else f"none in {x['after_s']:g} s")
                     + f" | rail {'1' if x['on_rail1_at_second'] else '0'} | {'yes' if x['second_survived'] else '**no**'} | "
                     f"{C.fmt(x['second_stall_ms'], 0)} | "
                     + (f"{C.fmt(x['second_resume_ms'], 0)} ms" if x["second_resume_ms"] is not None else "no") + " |")
    return "\n".join(L) + "\n"
