"""Failover scenarios: run ``railover-perf`` ranks across a test bed's hosts, inject a fault
schedule while they run, and read back what happened from the plugin's event journals and
the driver's delivered-bytes time series.

All timestamps are CLOCK_MONOTONIC µs, shared by the fault objects (``applied_us``), the
plugin journal (``t_us``) and the driver's time series, so a timeline needs no alignment.

Example::

    with TestBed("T2") as tb:
        a0 = tb.nic("a0")
        port = faults.PortDown(a0)
        res = run_scenario(tb, [Step(2.0, "apply", port), Step(6.0, "undo", port)], duration_s=10)
        res.check()                       # every rank exited 0, 0 wrong bytes
        for f in res.analyze(): print(f)  # detection, convergence, stall, bytes resent, failback

Errors: :class:`ScenarioError` when the ranks never connect; ``check()`` raises it with the
ranks' output when a rank failed.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from railover import journal, perf
from railover.testbed.faults import Fault
from railover.testbed.netns import TestBed, now_us, poll_until

__all__ = ["Step", "LazyFault", "ScenarioError", "ScenarioResult", "run_scenario", "rank_env", "read_journal",
           "rank_process"]


class ScenarioError(RuntimeError):
    """The scenario could not run, or a rank failed (the message carries their output)."""


@dataclass
class Step:
    """At ``at_s`` seconds after every rank's comms are connected, ``do`` ("apply" or "undo")
    the fault. ``label`` names it in reports (default: the fault's code)."""
    at_s: float
    do: str
    fault: Fault
    label: str = ""
    t_us: Optional[int] = None  # CLOCK_MONOTONIC µs when the change was issued (filled in when it ran)


class LazyFault(Fault):
    """A fault built only when it is applied, for targets that exist only once the scenario
    runs (e.g. ``LazyFault(lambda: faults.Stop(rank_process(tb, 1)))``)."""

    def __init__(self, factory, code: str = "LAZY"):
        super().__init__()
        self._factory = factory
        self._inner: Optional[Fault] = None
        self.code = code

    def _apply(self) -> None:
        self._inner = self._factory()
        self._inner.apply()
        self.code = self._inner.code

    def _undo(self) -> None:
        if self._inner is not None:
            self._inner.undo()


def rank_process(tb: TestBed, rank: int):
    """The live railover-perf process of `rank` started by run_scenario on this test bed."""
    for p in tb.processes:
        args = " ".join(map(str, p.args))
        if p.poll() is None and "railover-perf" in args and f"--rank {rank} " in args + " ":
            return p
    raise ScenarioError(f"no running railover-perf process for rank {rank}")


def read_journal(path: Path, stats: Optional[journal.Stats] = None) -> List[Dict[str, Any]]:
    """Events of one JSON-lines journal (:func:`railover.journal.read`: a partial last line is
    ignored; ``stats`` counts skipped lines and events this railover does not know)."""
    return journal.read(Path(path), stats)


# Plugin variables that describe a host's own network, not the bed's: set in the caller's
# environment (a cluster's RAILOVER_TRANSPORT=rdma, RAILOVER_STANDBY pairs or RAILOVER_RAILS of
# its own NIC names, NCCL_SOCKET_FAMILY=AF_INET6) they made every rank on the bed fail its init
# or lose its standby paths. The bed is TCP over veths with IPv4 addresses, its NICs in rail
# order: a rank gets these values (empty = unset, the default) unless the caller's ``extra``
# sets them.
BED_ENV = {"RAILOVER_TRANSPORT": "tcp", "NCCL_SOCKET_FAMILY": "", "RAILOVER_STANDBY": "", "RAILOVER_RAILS": ""}


def bed_overrides(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables of :data:`BED_ENV` that ``environ`` (default: this process's) sets to
    something else (blank values are unset): what the bed's ranks do not inherit."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k, v in BED_ENV.items()
            if environ.get(k, "").strip(" \t") and environ[k].strip(" \t") != v}


#: the variables :func:`rank_env` sets for every rank besides :data:`BED_ENV` (whatever this
#: process's environment says)
RANK_VARS = ("RAILOVER_IFNAMES", "RAILOVER_EVENT_LOG", "RAILOVER_STATE_DIR", "NCCL_DEBUG")


def rank_env(tb: TestBed, host_index: int, journal: Path, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Plugin environment for a rank on host ``host_index``: its NICs (exact names, in rail
    order), its event journal, and :data:`BED_ENV` (the bed's transport, address family,
    standby and rails, whatever this process's environment says)."""
    host = tb.hosts[host_index]
    env = dict(BED_ENV)
    env |= {
        "RAILOVER_IFNAMES": "=" + ",".join(n.ifname for n in host.nics),
        "RAILOVER_EVENT_LOG": str(journal),
        "RAILOVER_STATE_DIR": str(journal.parent / "state"),  # per run, not the node's /run/railover
        "NCCL_DEBUG": "WARN",
    }
    env.update(extra or {})
    return env


#: How long after a fault :meth:`ScenarioResult.analyze` looks for its stall, µs (5 s: past any
#: detection time; a stall without failover is reported as at least this).
STALL_WINDOW_US = 5_000_000


def _converged_us(failovers: Sequence[Dict[str, Any]], until_us: int) -> Optional[int]:
    """When every comm of ``failovers`` (journal events) had resumed for the last time before
    ``until_us`` (a comm whose first standby was bad too resumes twice): the latest of those;
    None when none did."""
    last = [e["t_us"] for e in failovers if e["t_us"] < until_us]
    return max(last) if last else None


@dataclass
class ScenarioResult:
    perf: perf.PerfResult
    steps: List[Step]
    events: List[Dict[str, Any]]            # every rank's journal, with "rank", sorted by t_us
    buckets: List[List[Any]]                # per rank: [(t_us, bytes)] per ms
    started_us: int
    workdir: Path
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.perf.ok

    @property
    def wrong_bytes(self) -> int:
        return self.perf.wrong_total

    def check(self) -> "ScenarioResult":
        """Raise ScenarioError unless every rank exited 0 in time with 0 wrong bytes."""
        if not self.perf.ok:
            raise ScenarioError("a rank failed:\n" + self.perf.describe())
        return self

    def count(self, event: str, since_us: int = 0, until_us: Optional[int] = None) -> int:
        return len(self.select(event, since_us, until_us))

    def select(self, event: str, since_us: int = 0, until_us: Optional[int] = None) -> List[Dict[str, Any]]:
        return [e for e in self.events
                if e.get("event") == event and e["t_us"] >= since_us and (until_us is None or e["t_us"] <= until_us)]

    def delivered(self, since_us: int, until_us: int, rank: int = 0) -> int:
        """Bytes rank `rank` received between two instants."""
        return sum(b for t, b in self.buckets[rank] if since_us <= t < until_us)

    def longest_gap_ms(self, since_us: int, until_us: int, rank: int = 0, begun_by: Optional[int] = None) -> float:
        """Longest run of 1 ms buckets with no delivered byte at ``rank``, in [since, until)
        (:func:`railover.perf.longest_gap_ms`)."""
        return perf.longest_gap_ms(self.buckets[rank], since_us, until_us, begun_by)

    def analyze(self) -> List[Dict[str, Any]]:
        """One row per applied fault: detection (fault -> first down event), convergence
        (fault -> first failover resumed), stall (the longest delivery gap at rank 0 that began
        between 100 ms before it and its last failover within 5 s, or within 5 s without one;
        and the longest gap in the 2 s before it for comparison), bytes resent by its failovers, and, when
        the fault was undone, failback (undo -> first failback; the hold-down is included) and
        the bytes its failbacks resent."""
        rows = []
        applies = [s for s in self.steps if s.do == "apply" and s.t_us]
        for s in applies:
            t0 = s.t_us
            undo = next((u for u in self.steps if u.do == "undo" and u.fault is s.fault and u.t_us), None)
            nxt = min([a.t_us for a in applies if a.t_us > t0] + [undo.t_us if undo else 1 << 62])
            downs = [e for e in self.events if e["t_us"] >= t0 and e["t_us"] < nxt
                     and e["event"] in ("nic_down", "pair_down", "path_down")]
            fos = [e for e in self.events if e["t_us"] >= t0 and e["t_us"] < nxt and e["event"] == "failover"]
            # Once every comm the fault moved has converged, a gap that begins later is the
            # host's jitter, not the fault's stall.
            converged = _converged_us(fos, t0 + STALL_WINDOW_US)
            row = {
                "label": s.label or s.fault.code,
                "code": s.fault.code,
                "t_us": t0,
                "detection_ms": (downs[0]["t_us"] - t0) / 1e3 if downs else None,
                "convergence_ms": (fos[0]["t_us"] - t0) / 1e3 if fos else None,
                "failovers": len(fos),
                "bytes_resent": sum(int(e.get("bytes_resent", 0)) for e in fos),
                "stall_ms": self.longest_gap_ms(t0 - 100_000, t0 + STALL_WINDOW_US, begun_by=converged)
                if self.buckets and self.buckets[0] else None,
                "baseline_gap_ms": self.longest_gap_ms(t0 - 2_000_000, t0) if self.buckets and self.buckets[0] else None,
            }
            if undo:
                # Failbacks between this fault's undo and the next fault (whose own failbacks
                # are its row's): the same comm may fail over and back once per fault.
                nxt_fb = min([a.t_us for a in applies if a.t_us > undo.t_us] + [1 << 62])
                fbs = [e for e in self.events if undo.t_us <= e["t_us"] < nxt_fb and e["event"] == "failback"]
                row["undo_t_us"] = undo.t_us
                row["failback_ms"] = (fbs[0]["t_us"] - undo.t_us) / 1e3 if fbs else None
                row["failbacks"] = len(fbs)
                # A failback is a RESUME too: what the receiver did not hold yet is sent again.
                row["failback_bytes_resent"] = sum(int(e.get("bytes_resent", 0)) for e in fbs)
            rows.append(row)
        return rows


def _ready(journals: Sequence[Path], paths: Sequence[int]) -> bool:
    """Every rank has its send comm's primary and standby paths up (paths[r] of them)."""
    for j, n in zip(journals, paths):
        ups = [e for e in read_journal(j) if e.get("event") == "path_up" and e.get("dir") == "send"]
        if len(ups) < n:
            return False
    return True


def _expected_paths(tb: TestBed, rank: int, env: Mapping[str, str]) -> int:
    """Paths a rank's send comm opens: one per NIC it uses, 1 with RAILOVER_STANDBY=none."""
    if env.get("RAILOVER_STANDBY") == "none":
        return 1
    names = env.get("RAILOVER_IFNAMES", "").lstrip("^=")
    return max(1, len([n for n in names.split(",") if n])) if names else len(tb.hosts[0].nics)


def run_scenario(tb: TestBed, steps: Sequence[Step], *, duration_s: float = 10.0, workload: str = "allreduce",
                 size: str = "4M", ranks_per_host: int = 1, channels: int = 1, env: Optional[Mapping[str, str]] = None,
                 rank_envs: Optional[Mapping[int, Mapping[str, str]]] = None, workdir: Optional[Path] = None,
                 connect_timeout_s: float = 30.0, timeout_s: Optional[float] = None, expect_failure: bool = False,
                 extra_args: Sequence[str] = (), on_tick: Optional[Any] = None,
                 idle_sleep_us: Optional[int] = None) -> ScenarioResult:
    """Run ``ranks_per_host`` ranks on every host of ``tb`` (rank r on host r % hosts, so every
    ring hop crosses the network) for ``duration_s`` seconds of ``workload`` at ``size`` bytes,
    applying ``steps`` on their schedule. ``env`` goes to every rank, ``rank_envs[r]`` to rank r.
    ``expect_failure``: a rank exiting non-zero is the expected outcome (fatal-timeout tests).
    ``on_tick(now_s)`` is called about every 50 ms while the workload runs (live progress).
    ``idle_sleep_us``: the driver's progress threads sleep this long when idle instead of
    spinning; by default 50 µs when ranks outnumber CPU cores (otherwise spinning ranks starve
    each other and the stalls measured are the scheduler's, not the network's)."""
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="railover-scn-"))
    if idle_sleep_us is None:
        idle_sleep_us = 50 if len(tb.hosts) * ranks_per_host > (os.cpu_count() or 1) else 0
    if idle_sleep_us:
        extra_args = list(extra_args) + ["--idle-sleep-us", str(idle_sleep_us)]
    wd.mkdir(parents=True, exist_ok=True)
    nhosts = len(tb.hosts)
    nranks = nhosts * ranks_per_host
    nics = len(tb.hosts[0].nics)
    journals = [wd / f"events-rank{r}.jsonl" for r in range(nranks)]
    for j in journals:
        if j.exists():
            j.unlink()

    def env_of(rank: int) -> Dict[str, str]:
        e = rank_env(tb, rank % nhosts, journals[rank], env)
        e.update((rank_envs or {}).get(rank, {}))
        return e

    expected = [_expected_paths(tb, r, env_of(r)) for r in range(nranks)]

    def spawn(rank: int, argv: List[str], full_env: Dict[str, str]):
        e = dict(full_env)
        e.update(env_of(rank))
        host = rank % nhosts
        out = open(wd / f"rank{rank}.out", "w")
        err = open(wd / f"rank{rank}.err", "w")
        try:
            return tb.run(host, argv, env=e, stdout=out, stderr=err)
        finally:
            out.close()
            err.close()

    holder: Dict[str, Any] = {}
    total = duration_s + connect_timeout_s + 30.0 if timeout_s is None else timeout_s

    def runner() -> None:
        try:
            holder["res"] = perf.run_perf(
                nranks, spawn=spawn, timeout=total, workdir=wd, workload=workload, minbytes=size,
                duration=duration_s, channels=channels, timeseries=str(wd / "ts-rank%r.csv"),
                op_timeout=max(60.0, duration_s), extra_args=list(extra_args))
        except Exception as ex:  # surfaced below
            holder["exc"] = ex

    th = threading.Thread(target=runner, daemon=True)
    th.start()
    try:
        poll_until(lambda: _ready(journals, expected) or not th.is_alive(), timeout_s=connect_timeout_s,
                   what="every rank's primary and standby paths")
    except TimeoutError:
        th.join(timeout=total)
        raise ScenarioError(f"ranks did not connect within {connect_timeout_s} s (workdir {wd})") from None
    if not th.is_alive():
        th.join()
        raise ScenarioError(f"railover-perf ended before its comms were up: {holder.get('exc') or holder['res'].describe()}")
    start = now_us()
    pending = sorted(steps, key=lambda s: s.at_s)
    try:
        while th.is_alive():
            now = (now_us() - start) / 1e6
            while pending and pending[0].at_s <= now:
                s = pending.pop(0)
                # The instant the change is issued: the plugin may react before apply() returns.
                s.t_us = now_us()
                if s.do == "apply":
                    s.fault.apply()
                else:
                    s.fault.undo()
            if on_tick:
                on_tick(now)
            wait = 0.05 if not pending else min(0.05, max(0.0, pending[0].at_s - now))
            th.join(timeout=wait)  # the workload ending is what we wait for; the timeout paces the schedule
    finally:
        for s in steps:
            if s.fault.active:
                s.fault.undo()
    th.join()
    if "exc" in holder:
        raise ScenarioError(f"railover-perf could not run: {holder['exc']}")
    res: perf.PerfResult = holder["res"]
    events = []
    jstats = journal.Stats()
    for r, j in enumerate(journals):
        for e in read_journal(j, jstats):
            e["rank"] = r
            events.append(e)
    events.sort(key=lambda e: e["t_us"])
    buckets = []
    for r in range(nranks):
        p = wd / f"ts-rank{r}.csv"
        buckets.append(perf.read_timeseries(p)[0] if p.exists() else [])
    out = ScenarioResult(perf=res, steps=list(steps), events=events, buckets=buckets, started_us=start, workdir=wd,
                         meta={"nranks": nranks, "workload": workload, "size": size, "duration_s": duration_s,
                               # reported, not dropped: events this railover does not know, unreadable lines
                               "journal_unknown": dict(jstats.unknown), "journal_unreadable_lines": jstats.garbled})
    if not expect_failure:
        out.check()
    return out
