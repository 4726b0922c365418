"""Reading railover's event journals (``RAILOVER_EVENT_LOG``): one place that parses their
lines and knows their events, used by ``railover status``/``exporter``/``drill``
(:mod:`railover.ops.state`), the test bed (:mod:`railover.testbed.scenario`) and the
benchmarks (:mod:`railover.bench.common`).

:data:`EVENTS` is what these readers know: every event of the plugin's declaration
(``native/telemetry/events.h``) with its fields and their JSON types. A test compares it with
the declaration the plugin exports, so an event added to the plugin without being handled
here fails the tests. A line whose event is not in :data:`EVENTS` (a newer plugin) is still
returned, and counted in :attr:`Stats.unknown` so readers report it instead of dropping it.

Lines: one JSON object each, ``{"t_us": <CLOCK_MONOTONIC µs>, "pid": N, "event": "...",
<fields>}``. A partial last line (the writer appends whole lines, so only while reading a
file being written) or a garbled one is skipped and counted in :attr:`Stats.garbled`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import heapq
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

__all__ = ["EVENTS", "COMMON_FIELDS", "RESUMED", "T_US_LIMIT", "Stats", "parse_line", "read", "read_last", "Tail"]

#: Fields every line has.
COMMON_FIELDS = {"t_us": "integer", "pid": "integer", "event": "string"}

_RESUMED = {"comm": "comm", "to_nic": "string", "peer": "string", "resumed_seq": "integer",
            "bytes_resent": "integer", "convergence_us": "integer"}

#: Every event railover writes -> its fields (in order) and their JSON types: "string",
#: "integer", "boolean", "comm" (a decimal string), "integer?" (an integer that may be absent).
EVENTS: Dict[str, Dict[str, str]] = {
    "nic_down": {"nic": "string", "signal": "string"},
    "nic_up": {"nic": "string", "signal": "string", "neigh_cleared": "integer"},
    "nic_addr_change": {"nic": "string", "old": "string", "new": "string"},
    "peer_addr_change": {"old": "string", "new": "string", "port": "integer"},
    "pair_down": {"nic": "string", "peer": "string", "cause": "string", "detection_us": "integer"},
    "pair_up": {"nic": "string", "peer": "string", "down_for_us": "integer", "probes_while_down": "integer?"},
    "path_up": {"comm": "comm", "dir": "string", "nic": "string", "peer": "string", "generation": "integer",
                "open_us": "integer"},
    "path_down": {"comm": "comm", "dir": "string", "nic": "string", "peer": "string", "cause": "string",
                  "active": "boolean", "detection_us": "integer?"},
    "path_state": {"comm": "comm", "dir": "string", "nic": "string", "peer": "string", "from": "string",
                   "to": "string", "reason": "string"},
    "no_standby": {"nic": "string", "peer": "string"},
    "rail_mismatch": {"nic": "string", "peer": "string", "kind": "string", "message": "string"},
    "failover": dict(_RESUMED),
    "failback": dict(_RESUMED),
    "recover": dict(_RESUMED),
    "resume": {"comm": "comm", "dir": "string", "nic": "string", "peer": "string", "next_seq": "integer",
               "waited_us": "integer", "fence_queue_us": "integer", "fence_us": "integer",
               "fence_to_answer_us": "integer", "fence_grant_wait_us": "integer"},
    "flap": {"comm": "comm", "nic": "string", "flaps": "integer", "hold_down_ms": "integer"},
    "fatal": {"comm": "comm", "dir": "string", "message": "string"},
    "health_late": {"late_us": "integer", "late_rounds": "integer", "max_late_us": "integer"},
    "peer_silence": {"nic": "string", "peer": "string", "rails": "integer", "age_us": "integer"},
    "pair_queued": {"nic": "string", "peer": "string", "rtt_us": "integer"},
    "transport_slow": {"comm": "comm", "dir": "string", "nic": "string", "peer": "string", "call": "string",
                       "us": "integer", "fence_grant_wait_us": "integer"},
    "size_loss_ignored": {"nic": "string", "peer": "string", "big_sent": "integer", "small_answered": "integer",
                          "tcp_acked": "boolean"},
    "hca_addr_change": {"nic": "string", "hca": "string", "kind": "string", "old": "string", "new": "string",
                        "why": "string"},
}

#: Events that mean traffic of a comm resumed on a path after a switch (same fields).
RESUMED = ("failover", "failback", "recover")


@dataclass
class Stats:
    """What a reader skipped or did not know: ``unknown`` counts lines per event name that is
    not in :data:`EVENTS`; ``garbled`` counts lines that are not a journal object."""

    unknown: Counter = field(default_factory=Counter)
    garbled: int = 0

    def add(self, other: "Stats") -> None:
        self.unknown.update(other.unknown)
        self.garbled += other.garbled

    def summary(self) -> str:
        """One line for a report: empty when nothing was skipped or unknown."""
        parts = []
        if self.unknown:
            parts.append("unknown journal events (a newer railover?): "
                         + ", ".join(f"{k} x{v}" for k, v in sorted(self.unknown.items())))
        if self.garbled:
            parts.append(f"{self.garbled} unreadable journal line(s) skipped")
        return "; ".join(parts)


#: Upper bound (exclusive) of ``t_us``: CLOCK_MONOTONIC µs since boot, which the plugin writes as
#: a 64-bit integer, stay far below it. A time beyond it (a garbled line) overflowed the readers'
#: float arithmetic (ages, ms since a drill's fault).
T_US_LIMIT = 1 << 63


def parse_line(line: Union[str, bytes], stats: Optional[Stats] = None) -> Optional[Dict[str, Any]]:
    """The event of one line, or None for an empty or garbled line (counted in ``stats``): not
    a JSON object (also one too deeply nested, or with a number of more digits than Python
    converts), or one whose ``t_us``, ``pid`` (when present) or ``event`` has another type
    than :data:`COMMON_FIELDS` says, or whose ``t_us`` is negative or not below
    :data:`T_US_LIMIT`, or a known event with a field of another type than :data:`EVENTS`
    says. An event not in :data:`EVENTS` is returned too, and counted in ``stats.unknown``."""
    if not line.strip():
        return None
    try:
        e = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, int digit limit; nesting
        e = None
    # the common fields' types (a pid may be absent); a pid that is a list or an object would
    # break every reader that looks processes up by it
    if not isinstance(e, dict) or not isinstance(e.get("event"), str) or not isinstance(e.get("t_us"), int) \
            or isinstance(e["t_us"], bool) or not 0 <= e["t_us"] < T_US_LIMIT \
            or ("pid" in e and (not isinstance(e["pid"], int) or isinstance(e["pid"], bool))):
        if stats is not None:
            stats.garbled += 1
        return None
    fields = EVENTS.get(e["event"])
    if fields is None:
        if stats is not None:
            stats.unknown[e["event"]] += 1
    elif any(k in e and not _has_type(e[k], t) for k, t in fields.items()):
        # a known event with a field of another type (a "failover" with to_nic null or
        # bytes_resent -1 was counted as a failover on NIC "" and shown in every table)
        if stats is not None:
            stats.garbled += 1
        return None
    return e


def _has_type(v: Any, t: str) -> bool:
    """Whether ``v`` has :data:`EVENTS` type ``t``. Integers are the plugin's unsigned 64-bit
    ones (no bool, none negative); a field an older plugin did not write is absent, not
    checked here."""
    if t in ("string", "comm"):
        return isinstance(v, str)
    if t == "boolean":
        return isinstance(v, bool)
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def read(path: Path, stats: Optional[Stats] = None) -> List[Dict[str, Any]]:
    """All events of one journal, in file order; a missing or unreadable file has none."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    out = []
    for line in data.split(b"\n"):
        e = parse_line(line, stats)
        if e is not None:
            out.append(e)
    return out


#: Bytes :func:`read_last` reads from a journal at a time, from its end backwards.
READ_BLOCK = 1 << 20

#: How far (µs) a journal's lines may be out of time order: each ``t_us`` is taken before the
#: line is appended, so threads (or processes sharing a journal) write them slightly out of
#: order. :func:`read_last` reads on this far past the events it keeps.
REORDER_US = 1_000_000


def read_last(path: Path, limit: int, want: Callable[[Dict[str, Any]], bool] = lambda e: True,
              stats: Optional[Stats] = None, block: int = READ_BLOCK) -> List[Dict[str, Any]]:
    """The last ``limit`` (>= 1) events of one journal that ``want`` accepts (the latest by
    ``t_us``; in file order), as from :func:`read`, but reading the file backwards from its end
    in blocks of ``block`` bytes: it stops once it holds ``limit`` events and has reached a line
    older than all of them by more than :data:`REORDER_US`, so a journal of any length costs
    about what its tail holds (``railover status`` on a long-running job's journal read and
    parsed every line of it, on every refresh). ``stats`` counts what was skipped or unknown
    among the lines read. A missing or unreadable file has none; a file truncated while being
    read (copytruncate) gives what was read before."""
    kept: List[Tuple[int, int, Dict[str, Any]]] = []  # min-heap of (t_us, -lines from the end, event)
    n = 0
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, 2)
            rest = b""  # the start of a line whose end was read already (none: the file's end)
            while pos > 0:
                size = min(block, pos)
                pos -= size
                f.seek(pos)
                data = f.read(size)
                if len(data) != size:
                    break  # truncated meanwhile
                lines = (data + rest).split(b"\n")
                rest = lines.pop(0) if pos > 0 else b""  # the first may continue in the block before
                for line in reversed(lines):
                    e = parse_line(line, stats)
                    if e is None:
                        continue
                    n += 1
                    if len(kept) == limit and e["t_us"] < kept[0][0] - REORDER_US:
                        return [k[2] for k in sorted(kept, key=lambda k: k[1])]
                    if want(e):
                        item = (e["t_us"], -n, e)
                        if len(kept) < limit:
                            heapq.heappush(kept, item)
                        elif item[:2] > kept[0][:2]:
                            heapq.heapreplace(kept, item)
    except OSError:
        pass
    return [k[2] for k in sorted(kept, key=lambda k: k[1])]


class Tail:
    """Incremental reader of one journal: :meth:`read_new` returns the events of the complete
    lines appended since the previous call (a partial last line waits for its end). A file
    that was truncated or replaced (other inode) is read again from the start. ``stats``
    accumulates what was skipped or unknown. :attr:`more` says whether the last call stopped
    at its ``max_bytes`` before the end of the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.stats = Stats()
        self.more = False
        self._ino: Optional[int] = None
        self._off = 0

    def read_new(self, max_bytes: Optional[int] = None) -> List[Dict[str, Any]]:
        """The events of the complete lines appended since the last call; with ``max_bytes``,
        of only about that many bytes of them (whole lines; a longer line is read whole), so
        a long journal read for the first time need not be held in memory at once: call again
        while :attr:`more`."""
        self.more = False
        try:
            st = self.path.stat()
        except OSError:
            return []
        if self._ino != st.st_ino or st.st_size < self._off:
            self._ino, self._off = st.st_ino, 0
        if st.st_size == self._off:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self._off)
                if max_bytes is None:
                    chunk = f.read()
                else:
                    chunk = f.read(max_bytes)
                    while len(chunk) >= max_bytes and b"\n" not in chunk[-max_bytes:]:
                        part = f.read(max_bytes)  # a line longer than max_bytes: up to its end
                        if not part:
                            break
                        chunk += part
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._off += end + 1
        self.more = max_bytes is not None and self._off < st.st_size
        out = []
        for line in chunk[:end].split(b"\n"):
            e = parse_line(line, self.stats)
            if e is not None:
                out.append(e)
        return out
