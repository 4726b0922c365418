"""``railover drill``: rehearse a NIC failure on purpose and report what railover did.

The drill sets a NIC administratively down (netlink, like ``ip link set <nic> down``) for a
given time while a job runs, sets it up again, waits for traffic to move back, and then
reads the event journals (found through the state files, or given explicitly) to report:

* detection: the first ``nic_down`` / ``pair_down`` / ``path_down`` after the NIC went down;
* convergence: every ``failover`` (time from the NIC going down, and the plugin's own
  ``convergence_us``: detection to traffic resumed), bytes resent;
* failback: every ``failback`` after the NIC came back (the hold-down is included);
* flaps and fatal errors.

The NIC is always restored: in a ``finally`` block, with SIGINT/SIGTERM turned into
exceptions while the drill runs. If restoring fails the drill says so loudly (exit code 3).

All times are CLOCK_MONOTONIC microseconds, the clock of the journals.
"""
from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from railover.ops import state as st

__all__ = ["DrillError", "RestoreError", "DrillResult", "set_link", "link_admin_up", "users_of", "analyze", "run_drill"]

DETECTION_EVENTS = ("nic_down", "pair_down", "path_down")


class DrillError(RuntimeError):
    """The drill cannot start (NIC missing or already down, namespace missing...)."""


class RestoreError(DrillError):
    """The NIC could not be set up again: it is still down (the message says how to fix it)."""


def _ipr(netns: Optional[str]):
    from pyroute2 import IPRoute
    if netns:
        if not Path("/run/netns", netns).exists():
            raise DrillError(f"network namespace {netns!r} does not exist")
        return IPRoute(netns=netns)
    return IPRoute()


def _link(ipr, nic: str):
    idx = ipr.link_lookup(ifname=nic)
    if not idx:
        raise DrillError(f"no interface named {nic!r}")
    return idx[0], ipr.get_links(idx[0])[0]


def link_admin_up(nic: str, netns: Optional[str] = None) -> bool:
    """Whether ``nic`` (in ``netns``, default: this namespace) is administratively up.
    Raises DrillError when it does not exist."""
    ipr = _ipr(netns)
    try:
        _, link = _link(ipr, nic)
        return bool(link["flags"] & 1)
    finally:
        ipr.close()


def set_link(nic: str, up: bool, netns: Optional[str] = None) -> None:
    """Set ``nic`` administratively up or down (needs CAP_NET_ADMIN). Raises DrillError when
    the NIC does not exist or netlink refuses (the message names NIC and namespace)."""
    ipr = _ipr(netns)
    try:
        idx, _ = _link(ipr, nic)
        ipr.link("set", index=idx, state="up" if up else "down")
    except DrillError:
        raise
    except Exception as e:
        where = f" in netns {netns}" if netns else ""
        code = getattr(e, "code", None)  # pyroute2's NetlinkError: the kernel's errno
        why = os.strerror(code) if isinstance(code, int) and code > 0 else str(e)
        if code in (errno.EPERM, errno.EACCES):
            why += " (changing a link needs root or CAP_NET_ADMIN in its network namespace)"
        raise DrillError(f"setting {nic}{where} {'up' if up else 'down'} failed: {why}") from e
    finally:
        ipr.close()


def _netns_id(netns: Optional[str]) -> Optional[Tuple[int, int]]:
    try:
        s = os.stat(Path("/run/netns", netns) if netns else Path("/proc/self/ns/net"))
        return s.st_dev, s.st_ino
    except OSError:
        return None


def users_of(nic: str, states: Sequence[st.ProcessState], netns: Optional[str] = None) -> List[st.ProcessState]:
    """Live railover processes that use NIC ``nic`` of network namespace ``netns`` (the
    current one by default): the NIC is in their state file and the process lives in that
    namespace (when that can be checked)."""
    want = _netns_id(netns)
    out = []
    for s in states:
        if s.stale or nic not in {n.get("name") for n in s.nics}:
            continue
        try:
            ps = os.stat(f"/proc/{s.pid}/ns/net")
            if want is not None and (ps.st_dev, ps.st_ino) != want:
                continue
        except OSError:
            pass  # cannot tell (no permission): count it
        out.append(s)
    return out


@dataclass
class DrillResult:
    """Outcome of a drill. Times: CLOCK_MONOTONIC µs (``*_us``) and durations in ms.
    ``users``: labels of the live railover processes that used the NIC; ``detection`` the
    first down event; ``failovers``/``failbacks``/``flaps``/``fatal``: journal events with
    ``since_down_ms`` or ``since_up_ms`` added; ``still_failed_over``: comms whose traffic is
    not on their primary path at the end; ``problems``: human-readable list (empty = OK)."""

    nic: str
    netns: Optional[str]
    down_for_s: float
    down_us: int = 0
    up_us: int = 0
    users: List[str] = field(default_factory=list)
    journals: List[str] = field(default_factory=list)
    detection: Optional[Dict[str, Any]] = None
    failovers: List[Dict[str, Any]] = field(default_factory=list)
    failbacks: List[Dict[str, Any]] = field(default_factory=list)
    flaps: List[Dict[str, Any]] = field(default_factory=list)
    fatal: List[Dict[str, Any]] = field(default_factory=list)
    still_failed_over: List[str] = field(default_factory=list)
    counters_before: Dict[str, int] = field(default_factory=dict)
    counters_after: Dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def analyze(res: DrillResult, events: Iterable[Dict[str, Any]]) -> DrillResult:
    """Fill ``res``'s detection, failovers, failbacks, flaps and fatal lists from journal
    ``events`` (those before ``res.down_us`` are ignored) and list the problems: no railover
    process used the NIC, nothing detected, a fatal error, a failover never failed back."""
    evs = sorted((e for e in events if int(e.get("t_us", 0)) >= res.down_us), key=lambda e: e["t_us"])
    for e in evs:
        e = dict(e)
        e["since_down_ms"] = round((e["t_us"] - res.down_us) / 1e3, 3)
        if res.up_us and e["t_us"] >= res.up_us:
            e["since_up_ms"] = round((e["t_us"] - res.up_us) / 1e3, 3)
        ev = e.get("event")
        if ev in DETECTION_EVENTS and res.detection is None:
            res.detection = e
        elif ev == "failover":
            res.failovers.append(e)
        elif ev == "failback":
            res.failbacks.append(e)
        elif ev == "flap":
            res.flaps.append(e)
        elif ev == "fatal":
            res.fatal.append(e)
    if not res.users:
        res.problems.append(f"no running railover process used {res.nic}: nothing to observe")
    if res.users and res.journals:
        if res.detection is None:
            res.problems.append("no down event in the journals: railover did not notice the NIC going down")
        if not res.failovers and not res.fatal:
            res.problems.append(f"no failover in the journals (did any comm carry traffic over {res.nic}?)")
        backs = {_comm_key(e) for e in res.failbacks}
        missing = sorted({_who(e) for e in res.failovers if _comm_key(e) not in backs})
        if missing:
            res.problems.append("no failback after the NIC came back for: " + ", ".join(missing))
    elif res.users:
        res.problems.append("no event journal found (set RAILOVER_EVENT_LOG for the job, or pass --journal): "
                            "only the state counters are reported")
    for e in res.fatal:
        res.problems.append("fatal error" + (f" in pid {e['pid']}" if e.get("pid") is not None else "") +
                            (f": {e['message']}" if e.get("message") is not None else ""))
    if res.still_failed_over:
        res.problems.append("still on a standby path at the end: " + ", ".join(res.still_failed_over))
    return res


def _comm_key(e: Dict[str, Any]) -> Tuple[Any, str]:
    """``(pid, comm)`` of a journal event, hashable whatever the comm field holds (a garbled
    line's list or object: as its text), so the failovers can be matched with their failbacks."""
    return e.get("pid"), str(e.get("comm"))


def _who(e: Dict[str, Any]) -> str:
    """``pid 1 comm 5`` of a journal event, leaving out what the event lacks (never "None")."""
    return " ".join(f"{k} {e[k]}" for k in ("pid", "comm") if e.get(k) is not None) or "a comm the journal does not name"


def _counters(states: Sequence[st.ProcessState], pids: Sequence[int]) -> Dict[str, int]:
    out = {"failovers": 0, "failbacks": 0, "flaps": 0, "bytes_resent": 0, "fatal_errors": 0}
    for s in states:
        if s.pid in pids:
            for k in out:
                out[k] += int(s.totals.get(k, 0))
    return out


def _failed_over(states: Sequence[st.ProcessState], pids: Sequence[int]) -> List[str]:
    return [f"{s.label} comm {c.get('id')} ({c.get('dir')} on {c.get('active_nic')}, primary {c.get('primary_nic')})"
            for s in states if s.pid in pids and not s.stale
            for c in s.comms if st.comm_health(c) == "failed-over"]


class _Signals:
    """While active: SIGTERM raises SystemExit and SIGINT KeyboardInterrupt (main thread only),
    so the ``finally`` that restores the NIC runs; the old handlers come back afterwards."""

    def __enter__(self) -> "_Signals":
        self.old = {}
        self.pid = os.getpid()
        if _in_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._raise)
        return self

    def _raise(self, sig: int, frame: Any) -> None:
        if os.getpid() != self.pid:
            # A forked child (pyroute2 forks a helper to open sockets in a netns and stops it
            # with SIGTERM) inherited this handler: it must not unwind our stack (and restore
            # the NIC, print a report...) in the child. Die like the default action.
            os._exit(128 + sig)
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + sig)

    def __exit__(self, *exc: Any) -> None:
        for sig, h in self.old.items():
            signal.signal(sig, h)


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def run_drill(nic: str, down_for_s: float, *, netns: Optional[str] = None, state_dirs: Iterable[Path] = (),
              journals: Iterable[Path] = (), wait_failback_s: float = 30.0, force: bool = False,
              progress: Callable[[str], None] = lambda msg: None) -> DrillResult:
    """Take ``nic`` down for ``down_for_s`` seconds, restore it, wait up to
    ``wait_failback_s`` seconds for every comm to be back on its primary path, and report.

    Raises DrillError before anything changed when a duration is out of range, the NIC is
    missing or already down, no live railover process uses it (nothing to observe; with
    ``force`` the drill runs anyway, with a warning) or netlink refuses to take it down (no
    CAP_NET_ADMIN: the NIC is still up, and is not set up again), and RestoreError when the NIC could not
    be set up again (it is then still down). A signal
    (SIGINT/SIGTERM) during the drill restores the NIC, then propagates as
    KeyboardInterrupt/SystemExit after the result was marked ``interrupted``.
    """
    if not down_for_s > 0:
        raise DrillError(f"--down-for must be > 0 seconds, got {down_for_s:g}")
    if not wait_failback_s >= 0:
        raise DrillError(f"--wait-failback must be >= 0 seconds, got {wait_failback_s:g}")
    dirs = [Path(d) for d in state_dirs]
    extra = [Path(j) for j in journals]
    if not link_admin_up(nic, netns):
        raise DrillError(f"{nic} is already administratively down; the drill only takes a working NIC down")
    states, unread = st.read_state_dirs(dirs)
    users = users_of(nic, states, netns)
    pids = [s.pid for s in users]
    res = DrillResult(nic=nic, netns=netns, down_for_s=down_for_s, users=[s.label for s in users])
    res.counters_before = _counters(states, pids)
    if not users:
        msg = f"no running railover process uses {nic} (state dirs: {', '.join(map(str, dirs)) or 'none'})"
        if unread:  # a user may be among what this user could not read: say so, not "no process"
            msg = (f"no railover process using {nic} was found in the state files this user can read, and "
                   f"{len(unread)} could not be read ({'; '.join(unread[:3])}{'; ...' if len(unread) > 3 else ''}): "
                   "run the drill as a user who can read them (the job's, or root)")
        if not force:
            raise DrillError(f"refusing to run: {msg}, so there is nothing to observe. Start the job first (is "
                             "--state-dir / RAILOVER_STATE_DIR the job's?), or pass --force to take the NIC down anyway")
        progress(f"warning: {msg}")
    where = f" in netns {netns}" if netns else ""
    refused: Optional[DrillError] = None  # netlink refused to take the NIC down: nothing to restore
    with _Signals():
        try:
            progress(f"setting {nic}{where} down for {down_for_s:g} s")
            res.down_us = st.now_us()
            try:
                set_link(nic, False, netns)
            except DrillError as e:
                if link_admin_up(nic, netns):
                    refused = DrillError(f"{e}; nothing changed: {nic}{where} is still up")
                    raise refused from e
                raise
            end = time.monotonic() + down_for_s
            while True:  # the outage itself: its length is what the operator asked for
                left = end - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(0.1, left))
        except BaseException:
            if refused is None:
                res.interrupted = True
            raise
        finally:
            if refused is None:  # (a NIC that never went down is not set up: that would fail the same way)
                try:
                    set_link(nic, True, netns)
                except DrillError as e:
                    raise RestoreError(f"{e}; {nic} is STILL DOWN: run 'ip {'-n ' + netns + ' ' if netns else ''}"
                                       f"link set {nic} up' now") from e
                res.up_us = st.now_us()
                progress(f"{nic}{where} is up again")
        deadline = time.monotonic() + wait_failback_s
        progress(f"waiting up to {wait_failback_s:g} s for traffic to move back")
        while True:
            states, _ = st.read_state_dirs(dirs)
            unreadable: List[str] = []
            files = st.journal_files(states, extra, unreadable)
            evs = st.recent_events(files, limit=0, since_us=res.down_us)
            res.still_failed_over = _failed_over(states, pids)
            fo = {_comm_key(e) for e in evs if e["event"] == "failover"}
            fb = {_comm_key(e) for e in evs if e["event"] == "failback" and e["t_us"] >= res.up_us}
            alive = {s.pid for s in states if not s.stale}
            pending = {k for k in fo - fb if k[0] in alive}
            if (not pending and not res.still_failed_over) or time.monotonic() >= deadline:
                break
            try:
                time.sleep(0.1)  # polling interval of the state files and journals
            except (KeyboardInterrupt, SystemExit):
                res.interrupted = True  # the NIC is back already: stop waiting, report what we have
                break
    for u in unreadable:
        progress(f"warning: cannot read {u}")
    res.journals = [str(f) for f in files]
    res.counters_after = _counters(states, pids)
    return analyze(res, evs)
