"""``railover soak``: random faults of every kind, at random times, for a chosen duration,
against a checked ring all-reduce (``railover-perf``, every byte checked) on a namespace
test bed; then one verdict.

One run of the ranks lasts the whole duration (``--duration`` of the driver; rank 0 keeps
time). After a fault-free warm-up, a fault loop draws, from ``random.Random(seed)`` only
(so ``--seed`` gives the same sequence of faults, targets, durations and gaps whatever the
timing), one fault at a time, every kind once per round of nine in a random order::

    kind     what it does (target: a random NIC; "peer": the same rail's NIC on another host)
    port-down    switch port down: the NIC loses carrier                  (0.5-5 s)
    host-down    host NIC set admin down                                   (0.5-5 s)
    silent       black hole at the NIC's switch port, no carrier event     (0.5-5 s)
    one-way      frames NIC -> peer dropped at the switch, peer -> NIC pass (0.5-5 s)
    loss         2, 10 or 30 % of the port's frames dropped at the switch   (0.5-5 s)
    rate         the NIC's and its peer's egress shaped to 50-500 Mbit/s   (0.5-5 s)
    flap         switch port down/up 3-6 times, 50-500 ms each             (until the last up)
    addr-change  the NIC's address replaced by another of its subnet       (0.5-5 s)
    both-down    both rails of one host lost at once (every switch port of that host down, or
                 every one black-holed), for 1-6 s: well under the fatal timeout (120 s)

Every fault is undone before the next is drawn; the gap after an undo is 0.5-5 s. The loop
stops so that the last undo is ``settle`` seconds before the end; then the process counters
are sampled and the ranks end on their own at the duration.

Verdict (exit status 1 when any is non-zero; 2 when the soak could not run):

* wrong bytes: the driver's checks, all ranks summed;
* hangs: a run of 1 ms buckets in which a rank received nothing, longer than ``hang_bound``
  (default 10 s). With one rail left the bound counts from the start of the gap; for a gap that
  overlaps a both-down fault it counts from that fault's repair (nothing can move before);
* errors: a rank exiting non-zero or not in time, a ``fatal`` journal event, errors in a
  rank's JSON result;
* growth of each rank's open file descriptors or threads (end vs start, exact: the end sample
  is taken once every comm is back to all paths up, polled for up to 60 s) or of its RSS by
  more than ``rss_tolerance`` (default 4 MiB + 2 % of the start RSS). The start sample is
  taken after the warm-up (the driver allocates its 1 ms byte buckets up front and runs with
  ``--no-iter-records``, so its own memory is flat); RSS is also sampled every 10 s and the
  JSON carries the series and its slope over the second half of the run (KiB/min), which
  says more about a slow leak than one difference.

Convergence per fault: from the instant the fault was issued to the last ``failover`` /
``recover`` journal event of the send comms whose *active* path went down (``path_down``
with ``active: true``) in the fault window; a fault that hit only idle standby paths (or
that TCP rode out: loss, rate) has no convergence and counts as "no failover needed". For
both-down: from the repair to the last comm resuming.

All instants are CLOCK_MONOTONIC µs (fault objects, plugin journal, driver buckets).
"""
from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rich.console import Console
from rich.table import Table

from railover._cliutil import out_dir_problem
from railover.perf import MAX_TIMESERIES_S
from railover.bench import common as C
from railover.sizes import check_size
from railover.bench.failover import GroupFault, NetlinkFault, send_comms
from railover.testbed import faults as F
from railover.testbed.netns import Nic, TestBed, now_us

KINDS = ("port-down", "host-down", "silent", "one-way", "loss", "rate", "flap", "addr-change", "both-down")
FAULT_S = (0.5, 5.0)           # how long a single-rail fault stays, s
BOTH_DOWN_S = (1.0, 6.0)       # both rails of a host lost, s (RAILOVER_FATAL_TIMEOUT default: 120 s)
GAP_S = (0.5, 5.0)             # fault-free time after an undo, s
LOSS_PCT = (2, 10, 30)
RATE_MBIT = (50, 500)
FLAP_COUNT = (3, 6)
FLAP_PHASE_S = (0.05, 0.5)
SAMPLE_EVERY_S = 10.0
RESUME_EVENTS = ("failover", "recover")
#: Plugin settings of the soak (others: defaults). The default hold-down (3 s, doubling on every
#: flap up to 60 s) would keep the comms on the standby rail for most of a run whose faults come
#: every few seconds, and then faults on the primary rail would hit only idle paths: 500 ms
#: (doubling up to 8 s) makes failback, and failover from the restored primary, happen all along.
SOAK_ENV = {"RAILOVER_HOLD_DOWN_MS": "500", "RAILOVER_HOLD_DOWN_MAX_MS": "8000"}


class SoakError(RuntimeError):
    """The soak could not run (bad option, ranks did not start...)."""


def parse_duration(s: str) -> float:
    """``"90"``/``"90s"``, ``"2m"``, ``"1h"``, ``"1h30m"`` -> seconds (> 0). Raises ValueError."""
    t = s.strip().lower()
    num = r"(\d+(?:\.\d+)?)"
    if re.fullmatch(num, t):
        v = float(t)
    else:
        # each unit at most once, in the order h, m, s ("1h1h" and "30s1h" were taken: 2 h);
        # blanks only between a number and its unit or between parts ("1 30m" is no duration)
        m = re.fullmatch(rf"(?:{num}\s*h)?\s*(?:{num}\s*m)?\s*(?:{num}\s*s)?", t)
        if not t or not m:
            raise ValueError(f"bad duration {s!r}; use e.g. 120, 90s, 2m, 1h, 1h30m (each unit once, h m s in order)")
        v = sum(float(g) * k for g, k in zip(m.groups(), (3600, 60, 1)) if g)
    if v <= 0:
        raise ValueError(f"duration must be > 0, got {s!r}")
    return v


# --------------------------------------------------------------------------- fault plan

@dataclass
class Planned:
    """One drawn fault: ``kind``, ``nic`` (logical name, e.g. ``a1``), ``hold_s`` how long it
    stays, ``gap_s`` the fault-free time after its undo, ``params`` kind-specific."""
    i: int
    kind: str
    nic: str
    hold_s: float
    gap_s: float
    params: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        p = self.params
        extra = {"loss": lambda: f" {p['percent']}%", "rate": lambda: f" {p['mbit']} Mbit/s",
                 "one-way": lambda: f" -> {p['peer']}", "flap": lambda: f" x{len(p['phases'])}",
                 "both-down": lambda: f" ({p['mode']})", "addr-change": lambda: f" -> {p['new_addr']}"}
        return f"{self.kind} {self.nic}{extra.get(self.kind, lambda: '')()} for {self.hold_s:.1f} s"


class Planner:
    """Draws faults from ``random.Random(seed)`` only: the i-th fault is the same for a seed."""

    def __init__(self, tb: TestBed, seed: int, kinds: Sequence[str] = KINDS):
        self.tb, self.rng, self.kinds = tb, random.Random(seed), list(kinds)
        self.n = 0
        self._round: List[str] = []

    def next(self) -> Planned:
        r = self.rng
        # Rounds: every kind once per round, in a random order, so a short run sees each kind.
        if not self._round:
            self._round = list(self.kinds)
            r.shuffle(self._round)
        kind = self._round.pop()
        host = r.choice(self.tb.hosts)
        nic = r.choice(host.nics)
        hold = round(r.uniform(*FAULT_S), 3)
        params: Dict[str, Any] = {}
        if kind == "one-way":
            other = r.choice([h for h in self.tb.hosts if h is not host])
            params["peer"] = other.nics[nic.index].name
        elif kind == "loss":
            params["percent"] = r.choice(LOSS_PCT)
        elif kind == "rate":
            params["mbit"] = r.randint(*RATE_MBIT)
        elif kind == "flap":
            phases = [(round(r.uniform(*FLAP_PHASE_S), 3), round(r.uniform(*FLAP_PHASE_S), 3))
                      for _ in range(r.randint(*FLAP_COUNT))]
            params["phases"] = phases
            hold = round(sum(a + b for a, b in phases), 3)
        elif kind == "addr-change":
            o = nic.addr.split(".")
            params["new_addr"] = ".".join(o[:3] + [str((int(o[3]) + 100) % 250 + 1)])
        elif kind == "both-down":
            params["mode"] = r.choice(("port-down", "silent"))
            hold = round(r.uniform(*BOTH_DOWN_S), 3)
            nic = host.nics[0]
        gap = round(r.uniform(*GAP_S), 3)
        p = Planned(self.n, kind, nic.name, hold, gap, params)
        self.n += 1
        return p


class Injector:
    """Turns a :class:`Planned` fault into changes on the test bed. Carrier, admin-down and
    switch black holes go through pre-opened netlink handles (and nft tables installed once),
    so the instant of the change is known to one netlink request (``t_issue``); loss, rate
    and address changes use :mod:`railover.testbed.faults` objects. :meth:`close` removes
    every handle and table."""

    def __init__(self, tb: TestBed):
        self.tb = tb
        self._nl: Dict[Tuple[str, str], NetlinkFault] = {}
        self._grp: Dict[Tuple[str, str, str], GroupFault] = {}

    def netlink(self, nic: str, code: str) -> NetlinkFault:
        k = (nic, code)
        if k not in self._nl:
            self._nl[k] = NetlinkFault(self.tb.nic(nic), code)
        return self._nl[k]

    def group(self, nic: str, code: str, peer: str = "") -> GroupFault:
        k = (nic, code, peer)
        if k not in self._grp:
            self._grp[k] = GroupFault(self.tb.nic(nic), code, self.tb.nic(peer).addr if peer else None)
        return self._grp[k]

    def faults(self, p: Planned) -> List[F.Fault]:
        """The fault objects (applied together, undone together) of a planned fault; flap is
        driven by :func:`run_fault` with the one port-down handle."""
        n = self.tb.nic(p.nic)
        if p.kind in ("port-down", "flap"):
            return [self.netlink(p.nic, "PORT-DOWN")]
        if p.kind == "host-down":
            return [self.netlink(p.nic, "HOST-DOWN")]
        if p.kind == "silent":
            return [self.group(p.nic, "SILENT")]
        if p.kind == "one-way":
            return [self.group(p.nic, "ONEWAY", p.params["peer"])]
        if p.kind == "loss":
            return [F.Loss(n, p.params["percent"], at="switch")]
        if p.kind == "rate":
            peers = [h.nics[n.index] for h in self.tb.hosts if h.name != n.host]
            return [F.Rate(n, f"{p.params['mbit']}mbit", peers=peers)]
        if p.kind == "addr-change":
            return [F.AddrChange(n, p.params["new_addr"])]
        if p.kind == "both-down":
            host = self.tb.host(n.host)
            if p.params["mode"] == "port-down":
                return [self.netlink(x.name, "PORT-DOWN") for x in host.nics]
            return [self.group(x.name, "SILENT") for x in host.nics]
        raise SoakError(f"unknown fault kind {p.kind!r}")

    def close(self) -> None:
        for f in list(self._nl.values()) + list(self._grp.values()):
            try:
                f.undo()
            finally:
                f.close()
        self._nl.clear()
        self._grp.clear()


# --------------------------------------------------------------------------- process counters

def fd_kinds(pid: int) -> Dict[str, int]:
    """Open fds of a process by kind (``socket``, ``pipe``, ``anon_inode:[eventfd]``, or the
    file's path), for telling a leak from a reconnect in progress."""
    import os
    out: Dict[str, int] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        k = t.split(":[")[0] if t.startswith(("socket:", "pipe:")) else t
        out[k] = out.get(k, 0) + 1
    return out


def sockets(tb: TestBed, procs: Dict[int, Any]) -> Dict[str, List[str]]:
    """Every rank's sockets as ``ss -tuanpe`` lists them in its host (state, addresses), so
    a changed fd count can be told apart (a leak, a listener, a reconnect in progress)."""
    out: Dict[str, List[str]] = {}
    for r, p in sorted(procs.items()):
        host = r % len(tb.hosts)
        try:
            rc, text, _ = tb.run_collect(host, ["ss", "-tuanpe"], timeout_s=20)
        except Exception as e:  # diagnostics only
            out[str(r)] = [f"ss failed: {e}"]
            continue
        out[str(r)] = [" ".join(line.split()[:6]) for line in text.splitlines() if f"pid={p.pid}," in line]
    return out


def rank_counters(start_sample: Dict[str, Any], end_sample: Dict[str, Any],
                  samples: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """Per rank, its :func:`sample` values at start and end, its RSS tolerance, maximum and
    slope over the second half; and what grew beyond them (RSS past the tolerance, fds or
    threads changed). A rank gone at the first or the last sample (its exit is among the
    soak's errors) is listed without growth."""
    growth: List[str] = []
    counters: Dict[str, Any] = {}
    for r, v in start_sample["ranks"].items():
        e = end_sample["ranks"].get(r, {})
        series = [(s["t_us"], s["ranks"][r]["rss_kib"]) for s in samples
                  if r in s["ranks"] and s["ranks"][r]["rss_kib"] is not None]
        if v["rss_kib"] is None or not series:  # gone before the first sample: its exit is among the errors
            counters[r] = {"start": v, "end": e, "rss_tolerance_kib": None, "rss_slope_second_half_kib_per_min": None,
                           "rss_max_kib": None}
            continue
        half = [x for x in series if x[0] >= series[0][0] + (series[-1][0] - series[0][0]) / 2]
        tol = rss_tolerance_kib(v["rss_kib"])
        counters[r] = {"start": v, "end": e, "rss_tolerance_kib": tol,
                       "rss_slope_second_half_kib_per_min": slope_kib_per_min(half),
                       "rss_max_kib": max(x[1] for x in series)}
        if e.get("rss_kib") is None:  # gone at the end
            continue
        if e["rss_kib"] - v["rss_kib"] > tol:
            growth.append(f"rank {r}: RSS {v['rss_kib']} -> {e.get('rss_kib')} KiB (tolerance +{tol} KiB)")
        for k in ("fds", "threads"):
            if e.get(k) != v[k]:
                msg = f"rank {r}: {k} {v[k]} -> {e.get(k)}"
                if k == "fds":
                    # name what is new: listeners and bound UDP sockets keep their address
                    fixed = lambda ss: {x for x in ss.get(r, []) if x.startswith(("tcp LISTEN", "udp"))}
                    new = sorted(fixed(end_sample.get("sockets", {})) - fixed(start_sample.get("sockets", {})))
                    if new:
                        msg += " (new: " + "; ".join(new) + ")"
                growth.append(msg)
    return counters, growth


def duration_problem(duration_s: float) -> Optional[str]:
    """What is wrong with a soak of ``duration_s`` seconds (60 s to the driver's
    :data:`railover.perf.MAX_TIMESERIES_S`: the soak records a time series), or None."""
    if duration_s < 60:
        return f"must be at least 60 s (warm-up, faults and settle), got {duration_s:g} s"
    if duration_s > MAX_TIMESERIES_S:
        return (f"must be at most {MAX_TIMESERIES_S // 3600} h, got {duration_s:g} s: the driver keeps 1 ms delivery "
                "buckets for the whole run (8 bytes each, about 690 MB per rank for 24 h)")
    return None


def sample(procs: Dict[int, Any], kinds: bool = False) -> Dict[str, Any]:
    """RSS (KiB), open fds and threads of every rank process, with a CLOCK_MONOTONIC µs stamp;
    with ``kinds`` also the fds by kind."""
    ranks = {}
    for r, p in sorted(procs.items()):
        ranks[str(r)] = {"rss_kib": C.proc_rss_kib(p.pid), "fds": C.proc_fds(p.pid), "threads": C.proc_threads(p.pid)}
        if kinds:
            ranks[str(r)]["fd_kinds"] = fd_kinds(p.pid)
    return {"t_us": now_us(), "ranks": ranks}


def rss_tolerance_kib(start_kib: int) -> int:
    """Allowed RSS growth of a rank, KiB: 4 MiB + 2 % of its start RSS (one-time allocations:
    glibc arenas of threads that ran a first failover, resend bookkeeping, stdio buffers)."""
    return 4096 + start_kib * 2 // 100


def slope_kib_per_min(series: Sequence[Tuple[int, int]]) -> Optional[float]:
    """Least-squares slope of ``[(t_us, kib)]``, KiB per minute; None with < 3 points."""
    if len(series) < 3:
        return None
    n = len(series)
    xs = [t / 6e7 for t, _ in series]
    ys = [float(v) for _, v in series]
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


# --------------------------------------------------------------------------- analysis

def gaps(buckets: Sequence[Tuple[int, int]], min_ms: int) -> List[Tuple[int, int]]:
    """``[(start_us, end_us)]`` of runs of empty 1 ms buckets at least ``min_ms`` long."""
    out = []
    start = None
    last_t = None
    for t, b in buckets:
        if b == 0:
            if start is None:
                start = t
        elif start is not None:
            if (t - start) // 1000 >= min_ms:
                out.append((start, t))
            start = None
        last_t = t
    if start is not None and last_t is not None and (last_t + 1000 - start) // 1000 >= min_ms:
        out.append((start, last_t + 1000))
    return out


def file_gaps(path: Path, min_ms: int) -> Tuple[List[Tuple[int, int]], Optional[int], Optional[int]]:
    """:func:`gaps` of a driver ``--timeseries`` CSV, read line by line (an hour is 3.6 M
    buckets per rank: too many to hold as Python tuples). Returns ``(gaps, first_us,
    end_us)``; ``(.., None, None)`` when the file is missing or has no bucket."""
    def buckets():
        with open(path) as f:
            for line in f:
                if line.startswith("bytes,"):
                    _, t, b, _r = line.split(",", 3)
                    yield int(t), int(b)
    if not Path(path).exists():
        return [], None, None
    first = last = None
    g = []
    start = None
    for t, b in buckets():
        if first is None:
            first = t
        last = t
        if b == 0:
            if start is None:
                start = t
        elif start is not None:
            if (t - start) // 1000 >= min_ms:
                g.append((start, t))
            start = None
    if start is not None and last is not None and (last + 1000 - start) // 1000 >= min_ms:
        g.append((start, last + 1000))
    return g, first, (last + 1000 if last is not None else None)


def judge_gaps(rank_gaps: Sequence[Tuple[int, int]], records: Sequence[Dict[str, Any]], bound_s: float,
               run_end_us: int) -> List[Dict[str, Any]]:
    """Gaps that are hangs: no progress for longer than ``bound_s``, counted from the later of
    the gap's start and the repair of a both-down fault it overlaps. A gap running into the
    end of the rank's time series (the run ended) is judged up to that end."""
    hangs = []
    for gs, ge in rank_gaps:
        ref = gs
        for r in records:
            if r["kind"] == "both-down" and r["t_apply"] < ge and (r["t_undo"] or run_end_us) > gs:
                ref = max(ref, r["t_undo"] or run_end_us)
        if (ge - ref) / 1e6 > bound_s:
            hangs.append({"start_us": gs, "end_us": ge, "gap_s": (ge - gs) / 1e6, "beyond_repair_s": (ge - ref) / 1e6})
    return hangs


def analyze_fault(rec: Dict[str, Any], events: Sequence[Dict[str, Any]], comms: Dict[str, int]) -> None:
    """Fill in the journal's answer to one fault record (in place): comms whose active path
    went down, their convergence, failovers/failbacks/flaps in its window."""
    t0, t1 = rec["t_apply"], rec["t_undo"]
    nxt = rec["t_next"]
    win = [e for e in events if t0 <= e["t_us"] < t1]
    hit = {}
    for e in win:
        if e.get("event") == "path_down" and e.get("dir") == "send" and e.get("active") and e.get("comm") in comms:
            hit.setdefault(e["comm"], e["t_us"])
    rec["comms_hit"] = len(hit)
    rec["failovers"] = sum(1 for e in win if e.get("event") == "failover")
    rec["recovers"] = sum(1 for e in win if e.get("event") == "recover")
    rec["flaps"] = sum(1 for e in events if e.get("event") == "flap" and t0 <= e["t_us"] < nxt)
    rec["failbacks_until_next"] = sum(1 for e in events if e.get("event") == "failback" and t1 <= e["t_us"] < nxt)
    rec["convergence_ms"] = None
    rec["resume_after_repair_ms"] = None
    rec["not_converged"] = 0
    if rec["kind"] == "both-down":
        # Nothing can move until the repair: time from the repair to the last comm resuming.
        stuck = {c for c, t in hit.items()}
        got = {}
        for e in events:
            if e.get("event") in RESUME_EVENTS + ("failback",) and e.get("comm") in stuck and t1 <= e["t_us"] < nxt:
                got.setdefault(e["comm"], e["t_us"])
        if stuck:
            if len(got) == len(stuck):
                rec["resume_after_repair_ms"] = (max(got.values()) - t1) / 1e3
            else:
                rec["not_converged"] = len(stuck) - len(got)
        return
    if not hit:
        return
    got = {}
    for e in win:
        c = e.get("comm")
        if e.get("event") in RESUME_EVENTS and c in hit and e["t_us"] >= hit[c]:
            got.setdefault(c, e["t_us"])
    if len(got) == len(hit):
        rec["convergence_ms"] = (max(got.values()) - t0) / 1e3
    else:
        rec["not_converged"] = len(hit) - len(got)


# --------------------------------------------------------------------------- the run

def run_fault(inj: Injector, p: Planned, lr: C.LiveRun) -> Dict[str, Any]:
    """Apply ``p``, keep it ``p.hold_s`` (flap: its down/up phases), undo it. Returns the raw
    record (instants in CLOCK_MONOTONIC µs)."""
    fs = inj.faults(p)
    rec: Dict[str, Any] = {"i": p.i, "kind": p.kind, "nic": p.nic, "hold_s": p.hold_s, "gap_s": p.gap_s,
                           "params": p.params, "what": p.describe()}
    try:
        if p.kind == "flap":
            f = fs[0]
            first = None
            for down, up in p.params["phases"]:
                f.apply()
                first = first or getattr(f, "t_issue", None) or f.applied_us
                lr.wait_for(lambda: now_us() - f.applied_us >= down * 1e6, down + 1)
                f.undo()
                t_up = now_us()
                lr.wait_for(lambda: now_us() - t_up >= up * 1e6, up + 1)
            rec["t_apply"] = first
            rec["t_undo"] = f.undone_us
        else:
            t = now_us()
            for f in fs:
                f.apply()
            rec["t_apply"] = getattr(fs[0], "t_issue", None) or t
            rec["apply_ms"] = (fs[-1].applied_us - rec["t_apply"]) / 1e3
            lr.wait_for(lambda: now_us() - rec["t_apply"] >= p.hold_s * 1e6, p.hold_s + 1)
            for f in fs:
                f.undo()
            rec["t_undo"] = fs[-1].undone_us
    finally:
        for f in fs:
            if f.active:
                f.undo()
    return rec


def soak(duration_s: float, out: Path, layout: str = "T2", seed: Optional[int] = None, size: str = "1M",
         hang_bound_s: float = 10.0, kinds: Sequence[str] = KINDS, env: Optional[Dict[str, str]] = None,
         console: Optional[Console] = None) -> Dict[str, Any]:
    """Run the soak; returns the report (also written to ``<out>/soak.json``).
    Raises SoakError (bad option) or :class:`railover.bench.common.BenchError` (ranks could
    not start)."""
    console = console or Console()
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SoakError(f"unknown fault kind(s) {', '.join(bad)}; use {', '.join(KINDS)}")
    if not kinds:
        raise SoakError(f"no fault kind given; use {', '.join(KINDS)}")
    problem = duration_problem(duration_s)
    if problem:
        raise SoakError(f"--duration {problem}")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 2 ** 31)
    warmup_s = min(10.0, duration_s / 12)
    settle_s = min(60.0, max(20.0, duration_s / 20))
    env = {**SOAK_ENV, **(env or {})}
    out = Path(out)
    problem = out_dir_problem(out)  # before the bed is built: a bad --out is a refusal, not a traceback
    if problem:
        raise SoakError(f"cannot use --out {out}: {problem}")
    rep = C.Report("soak", out, False, {"duration_s": duration_s, "layout": layout, "seed": seed, "size": size,
                                        "workload": "allreduce", "check": True, "hang_bound_s": hang_bound_s,
                                        "kinds": list(kinds), "env": env, "warmup_s": warmup_s, "settle_s": settle_s,
                                        "fault_s": FAULT_S, "both_down_s": BOTH_DOWN_S, "gap_s": GAP_S})
    work = out / "soak-work"
    records: List[Dict[str, Any]] = []
    samples: List[Dict[str, Any]] = []
    with TestBed(layout) as tb:
        console.print(f"[bold]soak[/] {duration_s:g} s on {tb.topology.name} ({tb.prefix}), seed {seed}, "
                      f"all-reduce of {size} per iteration, every byte checked")
        lr = C.LiveRun(tb, work, env=env, workload="allreduce", minbytes=size, check=True, duration_s=duration_s,
                       timeout_s=duration_s + 300, connect_timeout_s=120, idle_sleep_us=50,
                       extra_args=["--no-iter-records"])
        lr.start()
        t_start = now_us()
        end_us = t_start + int(duration_s * 1e6)
        comms = send_comms(lr)
        planner = Planner(tb, seed, kinds)
        inj = Injector(tb)
        last_sample = 0.0
        try:
            lr.wait_for(lambda: now_us() - t_start >= warmup_s * 1e6, warmup_s + 5)
            start_sample = sample(lr.procs, kinds=True)
            start_sample["sockets"] = sockets(tb, lr.procs)
            samples.append(start_sample)
            last_sample = time.monotonic()
            stop_at = end_us - int(settle_s * 1e6)
            while lr.alive:
                p = planner.next()
                if now_us() + int((p.hold_s + 1.0) * 1e6) > stop_at:
                    break
                rec = run_fault(inj, p, lr)
                records.append(rec)
                # the gap: fault-free time, sampling the counters on the way
                t_gap = now_us()
                lr.wait_for(lambda: now_us() - t_gap >= p.gap_s * 1e6, p.gap_s + 1)
                rec["t_next"] = now_us()
                analyze_fault(rec, lr.events, comms)
                console.print(_line(rec, t_start))
                if time.monotonic() - last_sample >= SAMPLE_EVERY_S:
                    samples.append(sample(lr.procs))
                    last_sample = time.monotonic()
        finally:
            inj.close()
        # Settle: every comm back on all its paths (the counters then mean the same as at start).
        last_undo = records[-1]["t_undo"] if records else t_start

        def settled() -> bool:
            cur = sample(lr.procs)
            return all(cur["ranks"].get(r, {}).get(k) == v[k]
                       for r, v in start_sample["ranks"].items() for k in ("fds", "threads"))
        settle_ok = lr.wait_for(settled, min(60.0, max(1.0, (end_us - now_us()) / 1e6 - 5)), interval_s=0.5)
        end_sample = sample(lr.procs, kinds=True)
        end_sample["sockets"] = sockets(tb, lr.procs)
        samples.append(end_sample)
        # LiveRun.finish() would load every 1 ms bucket as Python tuples: wait here instead
        # and read the time series line by line.
        lr._thread.join(lr.timeout_s + 60)
        if "exc" in lr._holder:
            raise C.BenchError(f"railover-perf could not run: {lr._holder['exc']}")
        perf = lr._holder["res"]
        lr.poll()
        events = list(lr.events)
    select = lambda name: [e for e in events if e.get("event") == name]
    run_end, run_first = {}, {}
    rank_hangs = {}
    longest_gap = {}
    for rec in records:
        rec.setdefault("t_next", rec["t_undo"])
        analyze_fault(rec, events, comms)
    for r in range(lr.nranks):
        g, first, end = file_gaps(lr.wd / f"ts-rank{r}.csv", 200)
        run_first[r], run_end[r] = first, end
        longest_gap[r] = max(((ge - gs) / 1e6 for gs, ge in g), default=0.0)
        rank_hangs[r] = judge_gaps(g, records, hang_bound_s, end or t_start)
    fatal = select("fatal")
    errors = []
    for rr in perf.ranks:
        if rr.returncode != 0:
            errors.append(f"rank {rr.rank} exited {rr.returncode}" + (" (killed at the timeout)" if rr.returncode is None else ""))
    errors += perf.errors
    errors += [f"rank {e['rank']}: fatal: {e.get('message')}" for e in fatal]
    if perf.timed_out:
        errors.append("the ranks did not finish in time")
    counters, growth = rank_counters(start_sample, end_sample, samples)
    per_kind: Dict[str, Any] = {}
    for k in kinds:
        rs = [x for x in records if x["kind"] == k]
        conv = [x["convergence_ms"] for x in rs if x["convergence_ms"] is not None]
        per_kind[k] = {"faults": len(rs),
                       "with_failover": sum(1 for x in rs if x["comms_hit"]),
                       "convergence_ms": C.summary(conv),
                       "resume_after_repair_ms": C.summary([x["resume_after_repair_ms"] for x in rs
                                                            if x["resume_after_repair_ms"] is not None]),
                       "not_converged": sum(x["not_converged"] for x in rs),
                       "failovers": sum(x["failovers"] for x in rs), "recovers": sum(x["recovers"] for x in rs)}
    hangs = sum(len(h) for h in rank_hangs.values())
    verdict = {"wrong_bytes": perf.wrong_total, "hangs": hangs, "errors": len(errors), "growth": len(growth)}
    rep.results.update({
        "seed": seed, "faults": len(records), "per_kind": per_kind,
        "failovers": len(select("failover")), "failbacks": len(select("failback")),
        "recovers": len(select("recover")), "flaps": len(select("flap")),
        "fatal_events": len(fatal), "rank_exit_codes": [rr.returncode for rr in perf.ranks],
        "iterations": [((rr.json or {}).get("rows") or [{}])[0].get("iters") for rr in perf.ranks],
        "longest_gap_s": {str(r): v for r, v in longest_gap.items()},
        "hangs": {str(r): v for r, v in rank_hangs.items()}, "errors": errors, "growth": growth,
        "counters": counters, "settled_at_end": bool(settle_ok), "samples": samples, "verdict": verdict,
        "clean": not any(verdict.values()), "records": records,
        "run_s": {str(r): (run_end[r] - run_first[r]) / 1e6 if run_first[r] else None for r in run_end},
    })
    rep.add_wrong(perf.wrong_total)
    for name, v in verdict.items():
        rep.add_target(f"soak: {name}", v, "==", 0)
    _keep(work, out / "soak-journals")
    if perf.ok and not any(verdict.values()):
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    data = rep.finish()
    for t in tables(data):
        console.print(t)
    return data


def _keep(src: Path, dst: Path) -> None:
    import shutil
    dst.mkdir(parents=True, exist_ok=True)
    for pat in ("events-rank*.jsonl", "rank*.err", "rank*.out", "rank*.json"):
        for f in Path(src).glob(pat):
            shutil.copy(f, dst / f.name)


def _line(rec: Dict[str, Any], t0: int) -> str:
    s = f"  [{(rec['t_apply'] - t0) / 1e6:7.1f} s] #{rec['i']:<4} {rec['what']:<38}"
    if rec["kind"] == "both-down":
        v = rec["resume_after_repair_ms"]
        s += f" resumed {C.fmt(v, 1)} ms after repair" if v is not None else (
            " [red]not resumed[/]" if rec["not_converged"] else " no comm hit")
    elif rec["comms_hit"]:
        v = rec["convergence_ms"]
        s += f" {rec['comms_hit']} comm(s) moved in {C.fmt(v, 1)} ms" if v is not None else " [red]not converged[/]"
    else:
        s += " no failover needed"
    if rec["failbacks_until_next"]:
        s += f", {rec['failbacks_until_next']} failback(s)"
    return s


def tables(data: Dict[str, Any]) -> List[Table]:
    r = data["results"]
    st = data["settings"]
    t = Table(title=f"soak: {st['duration_s']:g} s on {st['layout']}, seed {r['seed']}, {r['faults']} faults "
                    f"(ms: p50 / p99 / max)")
    for c in ("kind", "faults", "with failover", "convergence", "resume after repair", "not converged"):
        t.add_column(c, justify="right")
    for k, v in r["per_kind"].items():
        t.add_row(k, str(v["faults"]), str(v["with_failover"]), C.p50_p99_max(v["convergence_ms"]),
                  C.p50_p99_max(v["resume_after_repair_ms"]) if v["resume_after_repair_ms"]["n"] else "-",
                  str(v["not_converged"]))
    c = Table(title="rank processes: start -> end (RSS KiB, fds, threads)")
    for col in ("rank", "RSS", "RSS tolerance", "RSS slope 2nd half", "fds", "threads"):
        c.add_column(col, justify="right")
    for rk, v in r["counters"].items():
        s, e = v["start"], v["end"]
        tol = v["rss_tolerance_kib"]
        c.add_row(rk, f"{C.fmt(s['rss_kib'], 0)} -> {C.fmt(e.get('rss_kib'), 0)}", f"+{tol}" if tol is not None else "-",
                  f"{C.fmt(v['rss_slope_second_half_kib_per_min'], 1)} KiB/min",
                  f"{C.fmt(s['fds'], 0)} -> {C.fmt(e.get('fds'), 0)}",
                  f"{C.fmt(s['threads'], 0)} -> {C.fmt(e.get('threads'), 0)}")
    vt = Table(title="verdict")
    for col in ("failovers", "failbacks", "recovers", "flaps", "wrong bytes", "hangs", "errors", "growth", "clean"):
        vt.add_column(col, justify="right")
    v = r["verdict"]
    vt.add_row(str(r["failovers"]), str(r["failbacks"]), str(r["recovers"]), str(r["flaps"]), str(v["wrong_bytes"]),
               str(v["hangs"]), str(v["errors"]), str(v["growth"]), "[green]yes[/]" if r["clean"] else "[red]NO[/]")
    return [t, c, vt]


def register(app) -> None:
    import typer

    from railover._cliutil import csv_list, positive

    @app.command("soak")
    def soak_cmd(duration: str = typer.Option("1h", "--duration", "-d", help="how long: 120, 90s, 2m, 1h, 1h30m (60 s to 24 h)"),
                 layout: str = typer.Option("T2", "--layout", help="test bed layout: T2, T2-flat, T3, T3-flat, <H>x<M>[-flat]"),
                 seed: Optional[int] = typer.Option(None, "--seed", help="seed of the fault sequence (default: random, printed)"),
                 out: Path = typer.Option(Path("railover-soak"), "--out", "-o", help="output directory (soak.json, journals)"),
                 size: str = typer.Option("1M", "--size", help="all-reduce size per iteration"),
                 hang_bound: float = typer.Option(10.0, "--hang-bound", callback=positive,
                                                   help="seconds without progress that make a hang (> 0)"),
                 kinds: str = typer.Option(",".join(KINDS), "--kinds", help="fault kinds to draw from")):
        """Random faults of every kind at random times against a checked all-reduce for
        --duration; then faults per kind, failovers, failbacks, wrong bytes, hangs, errors,
        convergence p50/p99/max, and RSS/fds/threads of every rank at start and end. Exit 1 on
        any wrong byte, hang, error or growth; 2 when the soak could not run."""
        from railover.testbed.netns import PrivilegeError, Topology, TestBedError
        console = Console(width=max(150, __import__("shutil").get_terminal_size((150, 24)).columns))
        try:
            d = parse_duration(duration)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--duration")
        problem = duration_problem(d)
        if problem:
            raise typer.BadParameter(problem, param_hint="--duration")
        try:
            topo = Topology.from_layout(layout)
            topo.validate()
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--layout")
        if topo.nics < 2:
            raise typer.BadParameter(f"{layout}: 1 NIC per host leaves no standby NIC, so no fault can fail over; "
                                     "give at least 2 (e.g. T2 or 2x2)", param_hint="--layout")
        check_size(size)
        kind_list = csv_list(kinds, "--kinds")
        bad = [k for k in kind_list if k not in KINDS]
        if bad:
            raise typer.BadParameter(f"unknown fault kind(s) {', '.join(bad)}; use {', '.join(KINDS)}",
                                     param_hint="--kinds")
        try:
            data = soak(d, out, layout=layout, seed=seed, size=size, hang_bound_s=hang_bound,
                        kinds=kind_list, console=console)
        except PrivilegeError as e:
            console.print(f"[red]cannot build the test bed:[/] {e}\nrun as root (network namespaces need CAP_NET_ADMIN)")
            raise typer.Exit(2)
        except (SoakError, C.BenchError, TestBedError) as e:
            console.print(f"[red]soak could not run:[/] {e}")
            raise typer.Exit(2)
        r = data["results"]
        console.print(f"wrote {Path(out) / 'soak.json'}; verdict: " + ("[green]clean[/]" if r["clean"] else
                      "[red]NOT clean[/]: " + "; ".join(r["errors"] + r["growth"]
                                                         + [f"{n} hang(s)" for n in [r['verdict']['hangs']] if n]
                                                         + [f"{n} wrong bytes" for n in [r['verdict']['wrong_bytes']] if n])))
        raise typer.Exit(0 if r["clean"] else 1)
