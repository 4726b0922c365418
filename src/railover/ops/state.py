"""Read what running railover processes publish: their state files and event journals.

Every process that loaded the plugin writes ``<RAILOVER_STATE_DIR>/railover-<pid>.json``
(schema: docs/OPERATIONS.md; writer ``native/telemetry/state.cc``, content
``native/plugin/state_file.cc``) and, with
``RAILOVER_EVENT_LOG``, appends JSON lines to an event journal. This module is the one reader
of both, shared by ``railover status``, ``railover exporter`` and ``railover drill``.

Staleness: a file stays behind when its process exits. A file is *stale* when no process
with its ``pid`` exists, or one exists but started at a different time (field 22 of
``/proc/<pid>/stat`` differs from the file's ``start_time``: the pid was reused). The check
needs the reader to share the writer's pid namespace (on Kubernetes: ``hostPID`` or a shared
process namespace in the pod).

Clocks: ``updated_us`` and the journal's ``t_us`` are CLOCK_MONOTONIC microseconds, the same
clock as :func:`now_us`, so ages need no conversion on the same host.
"""
from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from railover import journal as jr

__all__ = [
    "SCHEMA_VERSION", "StateFileError", "ProcessState", "JournalTail", "now_us", "default_state_dirs",
    "proc_start_time", "process_rank", "read_state_file", "read_state_dirs", "journal_files",
    "read_journal", "recent_events", "comm_health", "nic_summary", "rdma_port_text", "snapshot",
    "prune_stale", "format_event", "path_kind",
]

SCHEMA_VERSION = 1
STATE_RE = re.compile(r"^railover-(\d+)\.json$")
#: Environment variables that name a process's rank, in order of preference.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


class StateFileError(ValueError):
    """A state file is unreadable, not JSON, or not schema version 1 (message names the file)."""


def path_kind(p: Path) -> Tuple[str, str]:
    """What ``p`` is, without raising: ``("dir", "")``, ``("file", "")`` (anything else that
    exists), ``("missing", "")`` (no such path, a dangling symlink, a file where a directory
    was named above it) or ``("unreachable", strerror)`` (it cannot be looked at: EACCES on a
    directory above it, ELOOP). Python 3.11's ``Path.exists()``/``is_dir()`` raise on the
    last kind, which reached users as a traceback (a ``RAILOVER_STATE_DIR`` inside another
    user's home)."""
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing", ""
    except OSError as e:
        return "unreachable", e.strerror or str(e)
    return ("dir" if stat.S_ISDIR(mode) else "file"), ""


def now_us() -> int:
    """CLOCK_MONOTONIC in microseconds: the clock of ``updated_us`` and of journal ``t_us``."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def default_state_dirs(env: Optional[Mapping[str, str]] = None) -> List[Path]:
    """Where to look for state files when no ``--state-dir`` is given.

    ``RAILOVER_STATE_DIR`` when set (``off`` means the plugin writes none: the list is empty
    then); otherwise, and when it is empty (the same as unset, as for every railover
    variable), the plugin's defaults: ``/run/railover`` and every existing
    ``/tmp/railover-<uid>`` directory (one per user that ran jobs) this reader may list.
    """
    env = os.environ if env is None else env
    v = env.get("RAILOVER_STATE_DIR", "").strip(" \t")
    if v:
        return [] if v == "off" else [Path(env["RAILOVER_STATE_DIR"])]
    out = [Path("/run/railover")]
    try:
        # another user's fallback directory (mode 0750) that this reader may not list is left
        # out, as before: it was found by looking, not named, and would read as unreadable on
        # every run (status) and scrape (exporter) of every other user
        out += sorted(p for p in Path("/tmp").glob("railover-*") if p.is_dir() and p.name[9:].isdigit()
                      and os.access(p, os.R_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids))
    except OSError:
        pass
    return out


def proc_start_time(pid: int, proc: Path = Path("/proc")) -> Optional[int]:
    """Start time of process ``pid`` (field 22 of ``/proc/<pid>/stat``, clock ticks since
    boot), or None when no such process exists (or its stat is unreadable)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def process_rank(pid: int, proc: Path = Path("/proc")) -> Optional[str]:
    """The rank of process ``pid`` from its environment (``RANK``, ``OMPI_COMM_WORLD_RANK``,
    ``PMI_RANK``, ``SLURM_PROCID``), or None when unknown or ``/proc/<pid>/environ`` is not
    readable (another user's process, without root)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    for k in RANK_VARS:
        if env.get(k, "").strip().isdigit():
            return env[k].strip()
    return None


@dataclass
class ProcessState:
    """One state file. ``data`` is the parsed JSON; ``stale`` is True when its process is
    gone or the pid was reused (``stale_reason`` says which); ``rank`` comes from the live
    process's environment (None when unknown); ``mtime`` is the file's modification time
    (seconds since the epoch)."""

    path: Path
    data: Dict[str, Any]
    stale: bool = False
    stale_reason: str = ""
    rank: Optional[str] = None
    mtime: float = 0.0

    @property
    def pid(self) -> int:
        return int(self.data["pid"])

    @property
    def start_time(self) -> int:
        return int(self.data.get("start_time", 0))

    @property
    def key(self) -> Tuple[int, int]:
        """``(pid, start_time)``: identifies one process over its whole life."""
        return self.pid, self.start_time

    @property
    def host(self) -> str:
        return str(self.data.get("host", ""))

    @property
    def nics(self) -> List[Dict[str, Any]]:
        return list(self.data.get("nics", []))

    @property
    def pairs(self) -> List[Dict[str, Any]]:
        return list(self.data.get("pairs", []))

    @property
    def comms(self) -> List[Dict[str, Any]]:
        return list(self.data.get("comms", []))

    @property
    def totals(self) -> Dict[str, int]:
        return dict(self.data.get("totals", {}))

    @property
    def event_log(self) -> str:
        return str(self.data.get("event_log", "") or "")

    @property
    def label(self) -> str:
        """``rank N`` when the rank is known, else ``pid N``."""
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def to_json(self) -> Dict[str, Any]:
        d = dict(self.data)
        d.update(file=str(self.path), stale=self.stale, stale_reason=self.stale_reason, rank=self.rank)
        return d


_INT, _STR, _BOOL, _LIST, _OBJ, _NONE = int, str, bool, list, dict, type(None)
_TYPE_NAMES = {_INT: "an integer", _STR: "a string", _BOOL: "true or false", _LIST: "a list", _OBJ: "an object",
               _NONE: "null"}
#: Fields the readers use, per level: ``(name, allowed types, required)``. A field the readers
#: fetch with a default may be absent (an older plugin), but when present it has these types.
_TOP_FIELDS = (("pid", (_INT,), True), ("nics", (_LIST,), True), ("comms", (_LIST,), True), ("totals", (_OBJ,), True),
               ("pairs", (_LIST,), False), ("start_time", (_INT,), False), ("host", (_STR,), False),
               ("event_log", (_STR, _NONE), False), ("transport", (_STR, _NONE), False))
_NIC_FIELDS = (("name", (_STR,), True), ("addr", (_STR,), False), ("rail", (_INT, _NONE), False),
               ("speed_mbps", (_INT, _NONE), False), ("up", (_BOOL,), False), ("rdma", (_OBJ, _NONE), False),
               ("transport", (_STR, _NONE), False))
#: A NIC's ``rdma`` object (the HCA port behind it; null for TCP, absent from an older plugin).
_RDMA_FIELDS = (("hca", (_STR,), True), ("port", (_INT,), True), ("port_active", (_BOOL,), True),
                ("link_layer", (_STR,), False), ("gid_index", (_INT,), False), ("gid", (_STR,), False),
                ("lid", (_INT,), False), ("mtu", (_INT,), False), ("why", (_STR,), False))
_PAIR_FIELDS = (("nic", (_STR,), True), ("peer", (_STR,), True), ("up", (_BOOL,), False))
_COMM_FIELDS = (("id", (_STR, _INT), True), ("dir", (_STR,), True), ("peer", (_STR,), True),
                ("active_nic", (_STR,), True), ("primary_nic", (_STR,), True), ("fatal", (_BOOL,), False),
                ("failovers", (_INT,), True), ("failbacks", (_INT,), True), ("flaps", (_INT,), True),
                ("bytes_resent", (_INT,), False), ("recoveries", (_INT,), False),
                ("last_detection_us", (_INT,), False), ("last_convergence_us", (_INT,), False),
                ("paths", (_LIST,), False))
_PATH_FIELDS = (("nic", (_STR,), True), ("peer", (_STR,), False), ("state", (_STR,), False))
_TOTAL_FIELDS = tuple((k, (_INT,), False) for k in ("comms", "failovers", "failbacks", "flaps", "bytes_resent",
                                                    "fatal_errors"))
#: Range of every integer field: the plugin writes 64-bit integers (signed or unsigned). A larger
#: one (a corrupt file) makes the file unreadable: the readers' float arithmetic (byte counts in
#: KiB, µs in seconds) would overflow on it.
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)
#: Integer fields that are counts or durations: a negative one (a corrupt file) makes the file
#: unreadable, as a null or a non-number does, instead of being shown (``failovers -3``).
_COUNTERS = frozenset(("failovers", "failbacks", "flaps", "bytes_resent", "recoveries", "fatal_errors", "comms",
                       "last_detection_us", "last_convergence_us"))


def _check_fields(path: Path, obj: Any, fields: Sequence[Tuple[str, Tuple[type, ...], bool]], where: str = "") -> None:
    """Raise StateFileError naming the first field of ``obj`` (at ``where``, e.g. ``comms[0].``)
    that is missing (when required) or of another type (a bool is not an integer)."""
    if not isinstance(obj, dict):
        raise StateFileError(f"{path}: {where.rstrip('.')} is not an object")
    for k, types, required in fields:
        if k not in obj:
            if required:
                raise StateFileError(f"{path}: field {where + k!r} missing")
            continue
        v = obj[k]
        if not isinstance(v, types) or (isinstance(v, bool) and _BOOL not in types):
            want = " or ".join(_TYPE_NAMES[t] for t in types)
            raise StateFileError(f"{path}: field {where + k!r} is not {want} (got {json.dumps(v)[:40]})")
        if isinstance(v, int) and not isinstance(v, bool) and not _INT_RANGE[0] <= v <= _INT_RANGE[1]:
            raise StateFileError(f"{path}: field {where + k!r} is beyond a 64-bit integer (got {str(v)[:20]}..., "
                                 f"{len(str(abs(v)))} digits)")
        if k in _COUNTERS and isinstance(v, int) and v < 0:
            raise StateFileError(f"{path}: field {where + k!r} is negative (got {v})")


def _check_schema(path: Path, data: Any) -> None:
    if not isinstance(data, dict):
        raise StateFileError(f"{path}: not a JSON object")
    if data.get("version") != SCHEMA_VERSION:
        raise StateFileError(f"{path}: schema version {data.get('version')!r}, this railover reads {SCHEMA_VERSION}")
    _check_fields(path, data, _TOP_FIELDS)
    for i, n in enumerate(data["nics"]):
        _check_fields(path, n, _NIC_FIELDS, f"nics[{i}].")
        if n.get("rdma") is not None:
            _check_fields(path, n["rdma"], _RDMA_FIELDS, f"nics[{i}].rdma.")
    for i, p in enumerate(data.get("pairs", [])):
        _check_fields(path, p, _PAIR_FIELDS, f"pairs[{i}].")
    for i, c in enumerate(data["comms"]):
        _check_fields(path, c, _COMM_FIELDS, f"comms[{i}].")
        for j, p in enumerate(c.get("paths", [])):
            _check_fields(path, p, _PATH_FIELDS, f"comms[{i}].paths[{j}].")
    _check_fields(path, data["totals"], _TOTAL_FIELDS, "totals.")


def read_state_file(path: Path, proc: Path = Path("/proc")) -> ProcessState:
    """Parse one state file and decide whether it is stale.

    Raises :class:`StateFileError` when it cannot be read or parsed, or has another schema
    version. (The writer renames complete files into place, so a partial file is never seen.)
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        mtime = path.stat().st_mtime
    except OSError as e:
        raise StateFileError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise StateFileError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise StateFileError(f"{path}: not valid JSON ({e})") from None
    except ValueError as e:  # a number of more digits than Python converts (4300)
        raise StateFileError(f"{path}: not a state file ({e})") from None
    except RecursionError:
        raise StateFileError(f"{path}: not a state file (JSON nested deeper than Python reads)") from None
    _check_schema(path, data)
    st = ProcessState(path, data, mtime=mtime)
    start = proc_start_time(st.pid, proc)
    if start is None:
        st.stale, st.stale_reason = True, f"process {st.pid} has exited"
    elif start != st.start_time:
        st.stale, st.stale_reason = True, f"pid {st.pid} now belongs to another process (start time {start} != {st.start_time})"
    else:
        st.rank = process_rank(st.pid, proc)
    return st


def read_state_dirs(dirs: Iterable[Path], proc: Path = Path("/proc")) -> Tuple[List[ProcessState], List[str]]:
    """Every state file in ``dirs`` (missing directories are skipped): ``(states, errors)``,
    states sorted by host then pid, errors one message per unreadable file. Never raises for
    a single bad file."""
    states: List[ProcessState] = []
    errors: List[str] = []
    seen = set()
    for d in dirs:
        d = Path(d)
        try:
            # listdir, not glob: glob reads a directory this process may not list (a /run/railover
            # of mode 2770 read by a user outside its group) as an empty one, without a word
            files = [d / n for n in sorted(os.listdir(d))]
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            errors.append(f"{d}: {e.strerror or e}")
            continue
        for f in files:
            if not STATE_RE.match(f.name):
                continue
            rp = f.resolve()
            if rp in seen:
                continue
            seen.add(rp)
            try:
                states.append(read_state_file(f, proc))
            except StateFileError as e:
                if f.exists():  # vanished between glob and read: not an error
                    errors.append(str(e))
    states.sort(key=lambda s: (s.host, s.pid))
    return states, errors


def prune_stale(dirs: Iterable[Path], proc: Path = Path("/proc")) -> List[Path]:
    """Delete the state files of processes that are gone; returns the files removed.
    Raises OSError when a stale file cannot be removed (e.g. another user's, without root)."""
    removed = []
    states, _ = read_state_dirs(dirs, proc)
    for s in states:
        if s.stale:
            s.path.unlink()
            removed.append(s.path)
    return removed


# --------------------------------------------------------------------------- journals

def journal_files(states: Sequence[ProcessState], extra: Iterable[Path] = (),
                  errors: Optional[List[str]] = None) -> List[Path]:
    """Journal files to read: each state file's ``event_log`` (a directory there means its
    ``railover-<pid>.jsonl``; ``%p`` is the pid) plus ``extra`` paths (a directory: every
    ``*.jsonl`` in it). Missing files are left out; no duplicates. A file this process may not
    open (a journal directory of mode 0700 read by another user) is left out too, with one
    message per file appended to ``errors`` when given."""
    out: List[Path] = []

    def kind(p: Path) -> str:
        """``dir``, ``file`` (one this process can open) or ``""`` (missing, other, unreadable)."""
        try:
            if p.is_dir():
                return "dir"
            if not p.is_file():
                return ""
            with open(p, "rb"):
                return "file"
        except OSError as e:  # is_dir/is_file raise on EACCES (only ENOENT and the like read as False)
            msg = f"journal {p}: {e.strerror or e}"
            if errors is not None and msg not in errors:
                errors.append(msg)
            return ""

    def add(p: Path) -> None:
        if p not in out and kind(p) == "file":
            out.append(p)

    for s in states:
        log = s.event_log
        if not log:
            continue
        log = log.replace("%p", str(s.pid))
        p = Path(log)
        add(p / f"railover-{s.pid}.jsonl" if kind(p) == "dir" else p)
    for e in extra:
        p = Path(e)
        if kind(p) == "dir":
            for f in sorted(p.glob("*.jsonl")):
                add(f)
        else:
            add(p)
    return out


def read_journal(path: Path, stats: Optional[jr.Stats] = None) -> List[Dict[str, Any]]:
    """All events of one journal (JSON lines; a partial or garbled line is skipped). Lines
    skipped and events not in :data:`railover.journal.EVENTS` are counted in ``stats``."""
    return jr.read(path, stats)


class JournalTail:
    """Incremental reader of journals: each :meth:`poll` returns only the events appended
    since the previous one (complete lines only), each with ``journal`` (its file). A file
    that was truncated or replaced (different inode) is read again from the start.
    :attr:`stats` accumulates garbled lines and events this railover does not know.
    ``max_bytes``: read about that many bytes of each journal per :meth:`poll` at most (whole
    lines), and poll again while :attr:`more` (a long journal's backlog, a piece at a time)."""

    def __init__(self, max_bytes: Optional[int] = None) -> None:
        self._tails: Dict[Path, jr.Tail] = {}
        self.stats = jr.Stats()
        self.max_bytes = max_bytes
        self.more = False

    def poll(self, paths: Iterable[Path]) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        self.more = False
        for p in paths:
            p = Path(p)
            t = self._tails.get(p)
            if t is None:
                t = self._tails[p] = jr.Tail(p)
                t.stats = self.stats
            for e in t.read_new(self.max_bytes):
                e.setdefault("journal", str(p))
                out.append(e)
            self.more = self.more or t.more
        out.sort(key=lambda e: e["t_us"])
        return out


#: Routine events ``railover status`` leaves out of its recent events unless asked
#: (``--all-events``): every path transition is journaled (``path_state``, about 6 lines per
#: new comm), and they would push failovers and path-downs out of the last few lines.
ROUTINE_EVENTS = frozenset({"path_state"})


def recent_events(paths: Iterable[Path], limit: int = 20, since_us: Optional[int] = None,
                  stats: Optional[jr.Stats] = None, skip: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """The last ``limit`` events (oldest first; ``limit`` <= 0: all) of the given journals,
    optionally only those at or after ``since_us`` (CLOCK_MONOTONIC µs) and not named in
    ``skip``; ``stats`` counts what was skipped or unknown among the lines read. With a
    ``limit``, each journal is read from its end only as far as its last ``limit`` such events
    (:func:`railover.journal.read_last`), not in full."""
    evs: List[Dict[str, Any]] = []
    skip = frozenset(skip)

    def want(e: Dict[str, Any]) -> bool:
        return (since_us is None or e["t_us"] >= since_us) and e.get("event") not in skip

    for p in paths:
        for e in jr.read_last(p, limit, want, stats) if limit > 0 else filter(want, read_journal(p, stats)):
            e.setdefault("journal", str(p))
            evs.append(e)
    evs.sort(key=lambda e: e["t_us"])
    return evs[-limit:] if limit > 0 else evs


#: A journal whose last event is this much further from now by this host's CLOCK_MONOTONIC than
#: by its file's modification time was written with another clock (s).
FOREIGN_CLOCK_S = 60.0


def _foreign_clock_anchors(evs: List[Dict[str, Any]], now: int) -> Dict[str, Tuple[float, int]]:
    """Journals among ``evs`` written on another host or before this host's last boot (a QEMU
    guest's journal read on its host): CLOCK_MONOTONIC differs per boot, so ages from their
    ``t_us`` would be off by the difference of the uptimes (or negative). For each, (age in s
    of its last event by the file's modification time, that event's ``t_us``), so an event's
    age is the first plus its distance from the last. Same-clock journals are not listed: their
    last event and the file's time agree within :data:`FOREIGN_CLOCK_S`."""
    last: Dict[str, int] = {}
    for e in evs:
        j = e.get("journal")
        if j:
            last[j] = max(last.get(j, 0), int(e["t_us"]))
    out: Dict[str, Tuple[float, int]] = {}
    wall = time.time()
    for j, t in last.items():
        try:
            by_file = max(0.0, wall - os.stat(j).st_mtime)
        except OSError:
            continue
        if abs((now - t) / 1e6 - by_file) > FOREIGN_CLOCK_S:
            out[j] = (by_file, t)
    return out


#: Fields ``railover status`` leaves out of an event's one-line description (for brevity).
_HIDDEN_FIELDS = {"path_up": ("generation",), "path_down": ("active", "detection_us"), "nic_up": ("neigh_cleared",),
                  "failover": ("resumed_seq",), "failback": ("resumed_seq",), "recover": ("resumed_seq",),
                  "resume": ("dir",)}
_NOT_FIELDS = ("t_us", "pid", "event", "journal", "rank", "age_s", "age_from")


def format_event(e: Mapping[str, Any]) -> str:
    """One-line human description of a journal event's fields (µs durations shown in ms):
    the declared fields of a known event (:data:`railover.journal.EVENTS`), all fields of an
    unknown one; a field the event lacks (or has as null) is left out."""
    ev = str(e.get("event"))
    if ev in jr.EVENTS:
        keys = tuple(k for k in jr.EVENTS[ev] if k not in _HIDDEN_FIELDS.get(ev, ()))
    else:
        keys = tuple(k for k in e if k not in _NOT_FIELDS)
    parts = []
    for k in keys:
        v = e.get(k)
        if v is None:   # absent, or null: left out, never "k=None"
            continue
        if k.endswith("_us") and isinstance(v, (int, float)):
            try:
                parts.append(f"{k[:-3]}={v / 1000:.1f}ms")
                continue
            except OverflowError:  # an int beyond a float's range (a garbled line): shown as it is
                pass
        parts.append(f"{k}={v}")
    return " ".join(parts)


# --------------------------------------------------------------------------- summaries

def comm_health(comm: Mapping[str, Any]) -> str:
    """One word for a comm: ``fatal``; ``failed-over`` (traffic is not on the primary path);
    ``unprotected`` (on its primary, but no standby path ready: a NIC failure now would stop
    it); ``down`` (no active path); ``ok``."""
    if comm.get("fatal"):
        return "fatal"
    paths = comm.get("paths", [])
    if not comm.get("active_nic"):
        return "down"
    if comm.get("active_nic") != comm.get("primary_nic"):
        return "failed-over"
    if not any(p.get("state") == "standby" for p in paths):
        return "unprotected"
    return "ok"


def rdma_port_text(rdma: Optional[Mapping[str, Any]]) -> Tuple[str, str]:
    """``(HCA port, GID or LID)`` of a NIC's ``rdma`` object as ``railover status`` shows them:
    ``("mlx5_0:1", "GID 3 ::ffff:10.0.0.1")`` on RoCE (HCA:port, as NCCL_IB_HCA writes it),
    ``(..., "LID 17")`` on InfiniBand; ``("-", "-")`` for none (TCP, or a plugin that predates
    the field)."""
    if not rdma:
        return "-", "-"
    port = f"{rdma.get('hca', '?')}:{rdma.get('port', '?')}"
    if rdma.get("link_layer") == "InfiniBand":
        return port, f"LID {rdma.get('lid', 0)}"
    return port, f"GID {rdma.get('gid_index', -1)} {rdma.get('gid', '')}".rstrip()


def nic_summary(states: Sequence[ProcessState]) -> Dict[str, List[Dict[str, Any]]]:
    """Per host, one row per NIC over the live processes: name, addr, rail, ``up`` (every
    process sees it up), ``processes`` using it, ``active`` paths carrying traffic over it,
    ``standby`` paths ready on it, ``failed`` paths, ``pairs_down`` (peer addresses whose
    pair with this NIC is down), ``rdma`` (the HCA port behind it, as the state file's NIC
    ``rdma`` object of the first process with one, host then pid order, with ``port_active``
    true only when every process with one sees the port ACTIVE; None when no process uses RDMA
    on it or the plugin predates the field), ``transport`` (what carries its paths: ``tcp`` or
    ``rdma``, from the first process that says; with ``RAILOVER_TRANSPORT=rdma+tcp`` a NIC without
    an RDMA port is ``tcp`` beside ``rdma`` ones; None from a plugin that predates the field)."""
    hosts: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for s in states:
        if s.stale:
            continue
        rows = hosts.setdefault(s.host, {})
        for n in s.nics:
            r = rows.setdefault(n["name"], {"name": n["name"], "addr": n.get("addr", ""), "rail": n.get("rail"),
                                            "speed_mbps": n.get("speed_mbps"), "up": True, "processes": 0,
                                            "active": 0, "standby": 0, "failed": 0, "pairs_down": [], "rdma": None,
                                            "transport": None})
            r["processes"] += 1
            if r["transport"] is None and n.get("transport"):
                r["transport"] = n["transport"]
            r["up"] = r["up"] and bool(n.get("up", True))
            rd = n.get("rdma")
            if rd:
                if r["rdma"] is None:
                    r["rdma"] = dict(rd)
                else:
                    r["rdma"]["port_active"] = bool(r["rdma"].get("port_active")) and bool(rd.get("port_active"))
        for p in s.pairs:
            r = rows.get(p.get("nic"))
            if r is not None and not p.get("up", True) and p.get("peer") not in r["pairs_down"]:
                r["pairs_down"].append(p.get("peer"))
        for c in s.comms:
            for p in c.get("paths", []):
                r = rows.get(p.get("nic"))
                if r is None:
                    continue
                st = p.get("state")
                if st == "active":
                    r["active"] += 1
                elif st == "standby":
                    r["standby"] += 1
                elif st == "failed":
                    r["failed"] += 1
    return {h: sorted(rows.values(), key=lambda r: (r["rail"] if r["rail"] is not None else 1 << 30, r["name"]))
            for h, rows in hosts.items()}


def snapshot(dirs: Iterable[Path], journals: Iterable[Path] = (), events: int = 20,
             proc: Path = Path("/proc"), all_events: bool = False) -> Dict[str, Any]:
    """Everything ``railover status --json`` prints: ``generated_us`` (CLOCK_MONOTONIC µs),
    ``state_dirs``, ``hosts`` (per host: ``nics`` from :func:`nic_summary`, ``processes``
    with their state file contents plus ``stale``/``rank`` and per comm ``health``),
    ``totals`` over live processes, ``events`` (the last ``events`` journal events, each with
    ``age_s``; without ``all_events``, none of :data:`ROUTINE_EVENTS`), ``journal`` (``unknown``: count per event name this railover does not know,
    ``garbled``: unreadable lines) and ``errors`` (unreadable files)."""
    dirs = [Path(d) for d in dirs]
    states, errors = read_state_dirs(dirs, proc)
    now = now_us()
    nics = nic_summary(states)
    hosts: Dict[str, Dict[str, Any]] = {}
    totals = {"processes": 0, "stale_processes": 0, "comms": 0, "failed_over": 0, "unprotected": 0,
              "failovers": 0, "failbacks": 0, "flaps": 0, "bytes_resent": 0, "fatal_errors": 0}
    for s in states:
        h = hosts.setdefault(s.host, {"nics": nics.get(s.host, []), "processes": []})
        d = s.to_json()
        for c in d.get("comms", []):
            c["health"] = comm_health(c)
        h["processes"].append(d)
        if s.stale:
            totals["stale_processes"] += 1
            continue
        totals["processes"] += 1
        for c in d.get("comms", []):
            totals["comms"] += 1
            totals["failed_over"] += c["health"] == "failed-over"
            totals["unprotected"] += c["health"] == "unprotected"
        for k in ("failovers", "failbacks", "flaps", "bytes_resent", "fatal_errors"):
            totals[k] += int(s.totals.get(k, 0))
    jstats = jr.Stats()
    evs = recent_events(journal_files(states, journals, errors), limit=events, stats=jstats,
                        skip=() if all_events else ROUTINE_EVENTS) if events > 0 else []
    by_pid = {s.pid: s for s in states}
    anchors = _foreign_clock_anchors(evs, now)
    for e in evs:
        a = anchors.get(e.get("journal", ""))
        if a is None:
            e["age_s"] = round((now - int(e["t_us"])) / 1e6, 3)
        else:  # another host's or boot's clock: the age from the file's time and the journal's own spacing
            e["age_s"] = round(a[0] + (a[1] - int(e["t_us"])) / 1e6, 3)
            e["age_from"] = "file time"
        st = by_pid.get(e.get("pid"))
        if st is not None and st.rank is not None:
            e.setdefault("rank", st.rank)
    return {"generated_us": now, "state_dirs": [str(d) for d in dirs], "hosts": hosts, "totals": totals,
            "events": evs, "journal": {"unknown": dict(jstats.unknown), "garbled": jstats.garbled}, "errors": errors}
