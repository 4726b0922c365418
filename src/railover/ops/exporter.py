"""``railover exporter``: node-level Prometheus metrics from railover's state files and journals.

One exporter per node reads every state file (``railover-<pid>.json``) in the state
directories and tails the event journals they name, at scrape time, and serves the metrics at
``/metrics`` (any other path answers 404). Metric names, types and labels are listed in
docs/OPERATIONS.md; the main ones:

* counters ``railover_failovers_total``, ``railover_failbacks_total``, ``railover_flaps_total``,
  ``railover_bytes_resent_total``, ``railover_fatal_errors_total``, ``railover_recoveries_total``
  (journal only) with labels ``rank`` and ``nic`` (the comm's primary NIC: from the state file, or
  for a process seen only in its journal, the first path that became active or a failback's NIC);
  ``railover_events_total{event}`` from the journals, and
  ``railover_journal_unknown_events_total{event}`` for events this exporter does not know;
* gauges ``railover_nic_up{nic,addr,rail}``, ``railover_pair_up{nic,peer}``,
  ``railover_path_active{rank,comm,dir,nic,peer}``, ``railover_nic_paths{nic,state}``,
  ``railover_comms{rank,health}``, ``railover_processes{state}``,
  ``railover_process_transport{rank,transport}`` (1 per live process, info-style: the transport
  its paths use, ``tcp``, ``rdma`` or ``rdma+tcp``, from the state file; ``unknown`` for a plugin that
  predates the field), and for NICs with the RDMA transport
  ``railover_nic_rdma_port_active{nic,hca,port}`` (1 if every live process using RDMA on the
  NIC sees its own HCA port behind it ACTIVE, else 0; one series per NIC, see below),
  ``railover_nic_rdma_port_info{nic,hca,port,link_layer,gid_index,gid,lid}`` (info-style, 1:
  the GID or LID in use; one series per NIC, see below) and
  ``railover_nic_rdma_port_views{nic}`` (how many different port/addressing views the live
  processes hold for the NIC: 1 when they agree);
* histogram ``railover_convergence_seconds{event}`` (failover/failback/recover) from journal events.

Counters stay monotonic when state files are rewritten and when processes exit: the
collector keeps, per process (pid + start time) and comm, the largest value the state files
showed and the count of the comm's journal events (failover, failback, recover, flap, fatal;
bytes resent), and exports the larger of the two. A state file drops a comm when NCCL closes it
and is rewritten at most every 100 ms, so without a journal a failover just before a comm
closes can be missed between scrapes; with ``RAILOVER_EVENT_LOG`` the counts are exact.
When a process has exited its counts are folded into a per-label total kept for the
exporter's lifetime; a process that exited normally removed its state file, and its journal
(once seen) is still read to its end and counted under the same labels. An exporter restart resets the counters (``rate()``/``increase()``
handle resets); processes that died while no exporter ran are counted once when first seen.

One info series per NIC: processes may disagree on a NIC's port addressing for a while (one
has chosen its GID again after an address change, another not yet, or a live process's file is
old). ``railover_nic_rdma_port_info`` then shows the view that appeared last (a re-chosen GID
replaces the old one as soon as one process uses it), and keeps showing it while some process
holds it; when it is gone, or at the exporter's first scrape, the view of the process whose
state file was written last (``updated_us``). The disagreement itself is
``railover_nic_rdma_port_views`` > 1. See :meth:`RailoverCollector._choose_port_views`.

``railover_nic_rdma_port_active`` is one series per NIC too, with the ``hca`` and ``port`` of the
view the info series shows (so the two join on ``nic, hca, port`` as well as on ``nic``), and its
value covers every view: 1 only if every live process using RDMA on the NIC sees the HCA port
*it* uses ACTIVE, 0 as soon as one of them does not, whichever port that is. A port down for
one process therefore cannot hide behind another process's view of an ACTIVE port (alerting on
``== 0`` sees it); but while the processes disagree (``railover_nic_rdma_port_views`` > 1) the
``hca`` and ``port`` labels name the shown view's port, which need not be the one that is down:
``railover status --json`` shows each process's port (``hosts.<host>.processes[].nics[].rdma``).

The rank label is the process's ``RANK`` (or ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
``SLURM_PROCID``) read from ``/proc/<pid>/environ`` while it runs; when that is unreadable
(another user's process and no root) it is ``pid:<pid>``.
"""
from __future__ import annotations

import math
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from railover import journal as jr
from railover.ops import state as st

__all__ = ["COUNTERS", "CONVERGENCE_BUCKETS_S", "RailoverCollector", "Exporter", "serve"]

#: State-file counter fields -> metric name (without ``_total``) and help text.
COUNTERS = {
    "failovers": ("railover_failovers", "Failovers: traffic of a comm moved from a failed path to a standby path"),
    "failbacks": ("railover_failbacks", "Failbacks: traffic moved back to the repaired primary path"),
    "flaps": ("railover_flaps", "Flaps: a path failed again within its hold-down after being restored"),
    "bytes_resent": ("railover_bytes_resent", "Bytes sent again after a failover or failback (unacknowledged data)"),
    "fatal_errors": ("railover_fatal_errors", "Comms that returned an error to NCCL (no usable path for RAILOVER_FATAL_TIMEOUT)"),
    "recoveries": ("railover_recoveries", "Recoveries: traffic resumed on the very path that failed (no standby was "
                                          "usable); counted from the journals"),
}
#: Journal events that count toward a comm's counters -> the counter (bytes_resent grows with
#: every resumed event too).
EVENT_COUNTERS = {"failover": "failovers", "failback": "failbacks", "recover": "recoveries", "flap": "flaps",
                  "fatal": "fatal_errors"}
#: Histogram buckets of railover_convergence_seconds (seconds): 1 ms .. 10 s.
CONVERGENCE_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

Labels = Tuple[str, str]  # (rank, nic)

#: One process's view of the HCA port behind a NIC, as the labels of railover_nic_rdma_port_info
#: (after ``nic``): hca, port, link_layer, gid_index, gid, lid.
PortView = Tuple[str, str, str, str, str, str]


def _port_view(rd: Dict[str, Any]) -> PortView:
    return (str(rd.get("hca", "")), str(rd.get("port", "")), str(rd.get("link_layer", "")),
            str(rd.get("gid_index", -1)), str(rd.get("gid", "")), str(rd.get("lid", 0)))


def _comm_counts(c: Dict[str, Any]) -> Dict[str, int]:
    return {"failovers": int(c.get("failovers", 0)), "failbacks": int(c.get("failbacks", 0)),
            "flaps": int(c.get("flaps", 0)), "bytes_resent": int(c.get("bytes_resent", 0)),
            "fatal_errors": 1 if c.get("fatal") else 0, "recoveries": int(c.get("recoveries", 0))}


@dataclass
class _Comm:
    """Counters of one comm as seen in the state files and counted from the journal; the
    value exported is the larger of the two (both only grow, both may miss something: the
    state file drops a comm when it closes and is rewritten at most every 100 ms, the journal
    is optional)."""
    nic: str = ""
    state: Dict[str, int] = field(default_factory=dict)
    journal: Dict[str, int] = field(default_factory=dict)

    def value(self) -> Dict[str, int]:
        return {k: max(self.state.get(k, 0), self.journal.get(k, 0)) for k in COUNTERS}


@dataclass
class _Proc:
    rank: str
    comms: Dict[str, _Comm] = field(default_factory=dict)

    def comm(self, cid: str) -> _Comm:
        c = self.comms.get(cid)
        if c is None:
            c = self.comms[cid] = _Comm()
        return c


class _Hist:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = list(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.total += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def family_buckets(self) -> List[Tuple[str, float]]:
        out = [(floatToGoString(b), float(c)) for b, c in zip(self.buckets, self.counts)]
        out.append(("+Inf", float(self.total)))
        return out


#: Bytes of each journal the exporter parses at a time (a long journal's first scrape reads
#: all of it, for the counters since its start, but holds one piece at a time).
JOURNAL_READ_BYTES = 8 << 20


class RailoverCollector:
    """A prometheus_client collector; every :meth:`collect` (one per scrape) re-reads the
    state files in ``dirs`` and the new lines of the journals (those the state files name
    plus ``journals``: files or directories of ``*.jsonl``). ``proc`` is the procfs root
    (tests use a fake one). Thread-safe."""

    def __init__(self, dirs: Iterable[Path], journals: Iterable[Path] = (), proc: Path = Path("/proc"),
                 buckets: Sequence[float] = CONVERGENCE_BUCKETS_S):
        self.dirs = [Path(d) for d in dirs]
        self.journals = [Path(j) for j in journals]
        self.proc = Path(proc)
        self._lock = threading.Lock()
        self._procs: Dict[Tuple[int, int], _Proc] = {}
        self._retired: Dict[Labels, Dict[str, int]] = {}
        self._dead: set = set()            # process keys already folded into _retired
        self._tail = st.JournalTail(JOURNAL_READ_BYTES)
        self._events: Dict[str, int] = {}
        self._hist: Dict[str, _Hist] = {}
        self._buckets = buckets
        self._read_errors = 0
        self._states: List[st.ProcessState] = []
        self._journal_paths: List[Path] = []   # every journal seen so far (kept after its process exits)
        self._pid_keys: Dict[int, Tuple[int, int]] = {}  # pid -> process key, for journals of exited processes
        # Per NIC: the port view railover_nic_rdma_port_info shows, the views seen at the last
        # scrape, and how many views the live processes hold now (_choose_port_views).
        self._port_shown: Dict[str, PortView] = {}
        self._port_seen: Dict[str, set] = {}
        self._port_nviews: Dict[str, int] = {}

    # ---- bookkeeping
    def refresh(self) -> None:
        """Read the state files and the journals' new lines now (``collect`` calls this)."""
        with self._lock:
            states, errors = st.read_state_dirs(self.dirs, self.proc)
            self._read_errors += len(errors)
            self._states = states
            for s in states:
                self._proc_for(s)
                self._pid_keys[s.pid] = s.key
            # A process that exits normally removes its state file; its journal stays and is
            # still read (to its end), and its events still count for the process (and rank)
            # they came from.
            for f in st.journal_files(states, self.journals):
                if f not in self._journal_paths:
                    self._journal_paths.append(f)
            by_pid = dict(self._pid_keys)
            # a piece at a time: the first scrape of a long journal does not hold it all in memory
            while True:
                for e in self._tail.poll(self._journal_paths):
                    self._journal_event(e, by_pid)
                if not self._tail.more:
                    break
            for s in states:
                self._account(s)
            self._choose_port_views([s for s in states if not s.stale])

    def _choose_port_views(self, live: Sequence[st.ProcessState]) -> None:
        """Per NIC, the one port view (``hca, port, link_layer, gid_index, gid, lid``) that
        ``railover_nic_rdma_port_info`` shows (and whose ``hca`` and ``port`` label
        ``railover_nic_rdma_port_active``), among the views the ``live`` processes hold:

        * a view that was not there at the previous scrape (a GID chosen again: the processes
          that have not noticed the change yet still show the old one) replaces the shown one;
        * otherwise the shown view stays while some process holds it, so the series does not
          flap when the processes' files are rewritten in turn;
        * otherwise (first scrape, or no process holds it any more) the view of the process
          whose state file was written last (``updated_us``, then the file's time) wins.
        Several new views at once: the freshest file's among them."""
        fresh: Dict[str, Dict[PortView, Tuple[int, float]]] = {}
        for s in live:
            written = s.data.get("updated_us")
            key = (written if isinstance(written, int) and not isinstance(written, bool) else 0, s.mtime)
            for n in s.nics:
                rd = n.get("rdma")
                if not rd:  # null for TCP, absent from a plugin that predates it
                    continue
                views = fresh.setdefault(str(n.get("name")), {})
                v = _port_view(rd)
                views[v] = max(views.get(v, key), key)
        for nic in list(self._port_shown):
            if nic not in fresh:
                del self._port_shown[nic]
        for nic, views in fresh.items():
            seen = self._port_seen.get(nic)
            new = [v for v in views if seen is not None and v not in seen]
            shown = self._port_shown.get(nic)
            if new:
                shown = max(new, key=lambda v: (views[v], v))
            elif shown not in views:
                shown = max(views, key=lambda v: (views[v], v))
            self._port_shown[nic] = shown
        self._port_seen = {nic: set(views) for nic, views in fresh.items()}
        self._port_nviews = {nic: len(views) for nic, views in fresh.items()}

    def _proc_for(self, s: st.ProcessState) -> Optional[_Proc]:
        if s.key in self._dead:
            return None
        p = self._procs.get(s.key)
        if p is None:
            p = self._procs[s.key] = _Proc(rank=s.rank if s.rank is not None else f"pid:{s.pid}")
        return p

    def _journal_event(self, e: Dict[str, Any], by_pid: Dict[int, Tuple[int, int]]) -> None:
        pid, resent = _as_int(e.get("pid", 0)), _as_int(e.get("bytes_resent", 0))
        if pid is None or resent is None:  # a field of the wrong type: the line is unreadable
            self._tail.stats.garbled += 1
            return
        ev = str(e.get("event"))
        self._events[ev] = self._events.get(ev, 0) + 1
        conv = _as_seconds(e.get("convergence_us"))
        if ev in jr.RESUMED and conv is not None:
            self._hist.setdefault(ev, _Hist(self._buckets)).observe(conv)
        learns_nic = _primary_nic_of(ev, e)
        if (ev not in EVENT_COUNTERS and not learns_nic) or "comm" not in e:
            return
        key = by_pid.get(pid, (pid, 0))
        p = self._procs.get(key)
        if p is None:
            if key in self._dead:
                return  # already folded with everything its journal held when it was seen dead
            p = self._procs[key] = _Proc(rank=f"pid:{pid}")
        cm = p.comm(str(e["comm"]))
        if learns_nic and not cm.nic:  # journal only (no state file seen): the label from the journal
            cm.nic = learns_nic
        if ev not in EVENT_COUNTERS:
            return
        j = cm.journal
        if ev == "fatal":
            j["fatal_errors"] = 1
        else:
            field_ = EVENT_COUNTERS[ev]
            j[field_] = j.get(field_, 0) + 1
            j["bytes_resent"] = j.get("bytes_resent", 0) + resent

    def _account(self, s: st.ProcessState) -> None:
        p = self._proc_for(s)
        if p is None:
            return
        seen: Dict[str, Dict[str, int]] = {}
        for c in s.comms:  # a process may hold a send and a recv comm with the same id: add them
            cid = str(c.get("id"))
            cur = _comm_counts(c)
            prev = seen.setdefault(cid, {k: 0 for k in COUNTERS})
            for k, v in cur.items():
                prev[k] += v
            if c.get("primary_nic"):
                p.comm(cid).nic = str(c["primary_nic"])
        for cid, cur in seen.items():
            cm = p.comm(cid)
            cm.state = {k: max(v, cm.state.get(k, 0)) for k, v in cur.items()}
        if s.stale:
            for cm in p.comms.values():
                acc = self._retired.setdefault((p.rank, cm.nic), {k: 0 for k in COUNTERS})
                for k, v in cm.value().items():
                    acc[k] += v
            del self._procs[s.key]
            self._dead.add(s.key)

    def totals(self) -> Dict[Labels, Dict[str, int]]:
        """Current counter values per ``(rank, nic)`` label pair (dead processes included)."""
        out: Dict[Labels, Dict[str, int]] = {lb: dict(v) for lb, v in self._retired.items()}
        for p in self._procs.values():
            for cm in p.comms.values():
                acc = out.setdefault((p.rank, cm.nic), {k: 0 for k in COUNTERS})
                for k, v in cm.value().items():
                    acc[k] += v
        return out

    # ---- prometheus_client interface
    def describe(self):
        return []  # no fixed description: avoids a scrape at registration time

    def collect(self):
        self.refresh()
        with self._lock:
            yield from self._families()

    def _families(self):
        totals = self.totals()
        for field_, (name, help_) in COUNTERS.items():
            fam = CounterMetricFamily(name, help_, labels=["rank", "nic"])
            for (rank, nic), counts in sorted(totals.items()):
                fam.add_metric([rank, nic], counts.get(field_, 0))
            yield fam
        ev = CounterMetricFamily("railover_events", "Journal events seen, by event type", labels=["event"])
        for k in sorted(self._events):
            ev.add_metric([k], self._events[k])
        yield ev
        err = CounterMetricFamily("railover_state_read_errors", "State files that could not be read or parsed")
        err.add_metric([], self._read_errors)
        yield err
        unk = CounterMetricFamily("railover_journal_unknown_events",
                                  "Journal events this exporter does not know (written by a newer railover), by event",
                                  labels=["event"])
        for k in sorted(self._tail.stats.unknown):
            unk.add_metric([k], self._tail.stats.unknown[k])
        yield unk
        bad = CounterMetricFamily("railover_journal_unreadable_lines", "Journal lines that are not a JSON event object, or a known event with a field of another type")
        bad.add_metric([], self._tail.stats.garbled)
        yield bad

        live = [s for s in self._states if not s.stale]
        procs = GaugeMetricFamily("railover_processes", "Processes with a state file, live or stale (exited)", labels=["state"])
        procs.add_metric(["live"], len(live))
        procs.add_metric(["stale"], len(self._states) - len(live))
        yield procs

        nic_up: Dict[Tuple[str, str, str], bool] = {}
        nic_paths: Dict[Tuple[str, str], int] = {}
        pair_up: Dict[Tuple[str, str], bool] = {}
        path_active = GaugeMetricFamily(
            "railover_path_active", "1 if the path carries the comm's traffic, 0 if it is standby or down",
            labels=["rank", "comm", "dir", "nic", "peer"])
        comms: Dict[Tuple[str, str], int] = {}
        last_conv = GaugeMetricFamily("railover_last_convergence_seconds",
                                      "Duration of the comm's last failover or failback", labels=["rank", "comm", "dir"])
        last_det = GaugeMetricFamily("railover_last_detection_seconds",
                                     "Detection time of the comm's last failure", labels=["rank", "comm", "dir"])
        transports: Dict[Tuple[str, str], int] = {}
        port_active: Dict[str, bool] = {}  # per NIC: every live process sees its own port ACTIVE
        for s in live:
            rank = self._procs[s.key].rank if s.key in self._procs else f"pid:{s.pid}"
            tk = (rank, str(s.data.get("transport") or "unknown"))
            transports[tk] = transports.get(tk, 0) + 1
            for n in s.nics:
                k = (str(n.get("name")), str(n.get("addr", "")), str(n.get("rail", "")))
                nic_up[k] = nic_up.get(k, True) and bool(n.get("up", True))
                rd = n.get("rdma")
                if rd:  # null for TCP, absent from a plugin that predates it
                    name = str(n.get("name"))
                    port_active[name] = port_active.get(name, True) and bool(rd.get("port_active"))
            for p in s.pairs:
                k = (str(p.get("nic")), str(p.get("peer")))
                pair_up[k] = pair_up.get(k, True) and bool(p.get("up", True))
            for c in s.comms:
                h = st.comm_health(c)
                comms[(rank, h)] = comms.get((rank, h), 0) + 1
                cid, cdir = str(c.get("id")), str(c.get("dir"))
                for p in c.get("paths", []):
                    state = str(p.get("state"))
                    path_active.add_metric([rank, cid, cdir, str(p.get("nic")), str(p.get("peer"))],
                                           1 if state == "active" else 0)
                    nk = (str(p.get("nic")), state)
                    nic_paths[nk] = nic_paths.get(nk, 0) + 1
                if int(c.get("failovers", 0)) + int(c.get("failbacks", 0)) > 0:
                    last_conv.add_metric([rank, cid, cdir], int(c.get("last_convergence_us", 0)) / 1e6)
                    last_det.add_metric([rank, cid, cdir], int(c.get("last_detection_us", 0)) / 1e6)
        g = GaugeMetricFamily("railover_process_transport", "Live processes by rank and the transport their paths use "
                              "(tcp, rdma, rdma+tcp: RAILOVER_TRANSPORT=rdma+tcp with RDMA behind some NICs only; unknown: a "
                              "plugin without the field): 1 per process", labels=["rank", "transport"])
        for (rank, t), n in sorted(transports.items()):
            g.add_metric([rank, t], n)
        yield g
        g = GaugeMetricFamily("railover_nic_up", "1 if every live railover process sees the NIC up",
                              labels=["nic", "addr", "rail"])
        for k in sorted(nic_up):
            g.add_metric(list(k), 1 if nic_up[k] else 0)
        yield g
        g = GaugeMetricFamily("railover_nic_rdma_port_active", "1 if every live railover process using RDMA on the NIC "
                              "sees the HCA port it uses behind the NIC ACTIVE, 0 if any does not: one series per NIC, "
                              "hca and port from the view railover_nic_rdma_port_info shows (while processes disagree, "
                              "railover_nic_rdma_port_views > 1, the port that is down may be another process's)",
                              labels=["nic", "hca", "port"])
        for nic in sorted(self._port_shown):
            hca, port = self._port_shown[nic][:2]
            g.add_metric([nic, hca, port], 1 if port_active.get(nic, False) else 0)
        yield g
        g = GaugeMetricFamily("railover_nic_rdma_port_info", "The HCA port behind the NIC and its addressing (RoCE: GID "
                              "index and GID, lid 0; InfiniBand: LID, gid_index -1): 1, one series per NIC; when live "
                              "processes disagree, the view that appeared last (else the latest state file's)",
                              labels=["nic", "hca", "port", "link_layer", "gid_index", "gid", "lid"])
        for nic in sorted(self._port_shown):
            g.add_metric([nic, *self._port_shown[nic]], 1)
        yield g
        g = GaugeMetricFamily("railover_nic_rdma_port_views", "Different HCA port and addressing views (hca, port, "
                              "link_layer, gid_index, gid, lid) the live railover processes hold for the NIC: 1 when "
                              "they agree, more while some have not chosen the new GID yet", labels=["nic"])
        for nic in sorted(self._port_nviews):
            g.add_metric([nic], self._port_nviews[nic])
        yield g
        g = GaugeMetricFamily("railover_pair_up", "1 if probes between the local NIC and the peer address answer",
                              labels=["nic", "peer"])
        for k in sorted(pair_up):
            g.add_metric(list(k), 1 if pair_up[k] else 0)
        yield g
        g = GaugeMetricFamily("railover_nic_paths", "Paths over the NIC, by state (active, standby, connecting, failed, closed)",
                              labels=["nic", "state"])
        for k in sorted(nic_paths):
            g.add_metric(list(k), nic_paths[k])
        yield g
        yield path_active
        g = GaugeMetricFamily("railover_comms", "Comms of live processes by health (ok, failed-over, unprotected, down, fatal)",
                              labels=["rank", "health"])
        for k in sorted(comms):
            g.add_metric(list(k), comms[k])
        yield g
        yield last_conv
        yield last_det
        hist = HistogramMetricFamily("railover_convergence_seconds",
                                     "Failover/failback/recover convergence from the journals (detection to traffic "
                                     "resumed)", labels=["event"])
        for ev_name in jr.RESUMED:
            hh = self._hist.get(ev_name) or _Hist(self._buckets)
            hist.add_metric([ev_name], hh.family_buckets(), sum_value=hh.sum)
        yield hist


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # no access log on stderr
        pass


def _primary_nic_of(ev: str, e: Dict[str, Any]) -> str:
    """The comm's primary NIC as a journal line shows it, or "": the first path to become active
    (``path_state`` to ``active`` from ``connecting``) and the NIC a failback returns to."""
    if ev == "path_state" and e.get("to") == "active" and e.get("from") == "connecting":
        return str(e.get("nic") or "")
    if ev == "failback":
        return str(e.get("to_nic") or "")
    return ""


def _as_int(v: Any) -> Optional[int]:
    """A journal field that must be a whole number (a pid, a byte count): its value (None and
    "" count as 0), or None when it is not one (``"lots"``, a list, 1.5, ``"nan"``, ``"inf"``,
    an integer beyond a float's range: no Prometheus sample holds it)."""
    if v is None or v == "":
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = float(v)
    except (ValueError, OverflowError):  # OverflowError: an int of ~309 digits or more
        return None
    return int(f) if math.isfinite(f) and f == int(f) else None


def _as_seconds(us: Any) -> Optional[float]:
    """A journal time in µs (``convergence_us``) in seconds, or None when it is not a finite
    number (a string, a bool, NaN or Infinity, an int beyond a float's range): one such value
    would make a histogram's sum NaN or inf for good, or fail every scrape."""
    if isinstance(us, bool) or not isinstance(us, (int, float)):
        return None
    try:
        s = us / 1e6
    except OverflowError:  # an int of ~309 digits or more
        return None
    return s if math.isfinite(s) else None


#: The one URL path the exporter serves (Prometheus' default ``metrics_path``).
METRICS_PATH = "/metrics"


def _only_metrics(metrics_app: Callable) -> Callable:
    """A WSGI app that hands :data:`METRICS_PATH` to ``metrics_app`` and answers 404 on
    every other path (prometheus_client's app answers any path). HEAD is answered as GET,
    without the body (prometheus_client's app answers 405)."""
    def answer(environ: Dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") == METRICS_PATH:
            return metrics_app(environ, start_response)
        body = f"not found: the railover exporter serves its metrics at {METRICS_PATH}\n".encode()
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    def app(environ: Dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return answer(environ, start_response)
        got: Dict[str, Any] = {}
        body = b"".join(answer(dict(environ, REQUEST_METHOD="GET"),
                               lambda status, headers, exc_info=None: got.update(status=status, headers=headers)))
        start_response(got["status"], [h for h in got["headers"] if h[0].lower() != "content-length"] +
                       [("Content-Length", str(len(body)))])
        return []
    return app


class Exporter:
    """An HTTP server (own thread) exposing ``/metrics`` for one :class:`RailoverCollector`
    (any other path: 404). ``port`` 0 picks a free port (see :attr:`port`). Raises OSError
    when the address cannot be bound. ``addr``: an IPv4 or IPv6 address (``::1``, ``::``) or a
    host name. Use :meth:`close` (or ``with``) to stop it."""

    def __init__(self, collector: RailoverCollector, addr: str = "127.0.0.1", port: int = 9464):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.collector = collector
        # the address family of addr (getaddrinfo, as http.server does): WSGIServer alone is IPv4 only
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._httpd = make_server(addr, port, _only_metrics(make_wsgi_app(self.registry)),
                                  _Server6 if family == socket.AF_INET6 else _Server, handler_class=_QuietHandler)
        self.addr, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="railover-exporter", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(dirs: Iterable[Path], journals: Iterable[Path] = (), addr: str = "127.0.0.1", port: int = 9464) -> Exporter:
    """Start an exporter for state directories ``dirs`` (and extra ``journals``); returns it."""
    return Exporter(RailoverCollector(dirs, journals), addr, port)
