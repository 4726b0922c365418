"""Shared pieces of ``railover bench``: machine description, statistics, targets, report
files, iperf3, CPU/RSS sampling, and :class:`LiveRun` (railover-perf ranks on a test bed that
a benchmark steers while they run: faults applied on conditions, not on a fixed schedule).

Every suite returns a *report* (a dict, also written as ``<out>/<suite>.json``)::

    {"suite", "schema": 1, "command", "quick", "started", "elapsed_s", "machine": {...},
     "settings": {...}, "results": {...suite specific...},
     "targets": [{"figure", "value", "unit", "target", "met", "detail"}],
     "wrong_bytes": int, "plots": [file names in <out>]}

All timestamps are CLOCK_MONOTONIC µs (the plugin journal, the driver's time series and the
fault objects share that clock).
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from railover import _paths, journal, perf
from railover.testbed.scenario import rank_env
from railover.testbed.netns import TestBed, now_us, poll_until

SCHEMA = 1


class BenchError(RuntimeError):
    """A benchmark could not run (ranks failed to start, a tool is missing...)."""


# --------------------------------------------------------------------------- machine

def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info() -> Dict[str, Any]:
    """What the numbers were measured on: CPUs, kernel, memory, tool versions, source commit."""
    cpu = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    iperf = ""
    if shutil.which("iperf3"):
        r = subprocess.run(["iperf3", "--version"], capture_output=True, text=True)
        iperf = (r.stdout or r.stderr).splitlines()[0].strip() if (r.stdout or r.stderr) else ""
    repo = Path(__file__).resolve().parents[3]
    commit, dirty = None, None
    if (repo / ".git").exists() and shutil.which("git"):
        r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
        commit = r.stdout.strip() or None
        r = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
        dirty = bool(r.stdout.strip())
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "os": _os_name(),
        "mem_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "iperf3": iperf,
        "commit": commit,
        "dirty": dirty,
        "plugin": str(_paths.plugin_path()),
        "plugin_sha256": _sha256(_paths.plugin_path())[:16],
        # a snapshot build (RAILOVER_NATIVE_DIR) may say which commit it was built from
        "native_commit": _read(str(_paths.plugin_path().parent / "COMMIT")).strip() or None,
        "plugin_mtime": _dt.datetime.fromtimestamp(_paths.plugin_path().stat().st_mtime).astimezone().isoformat(timespec="seconds"),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _os_name() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


def machine_line(m: Mapping[str, Any]) -> str:
    return (f"{m['nproc']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB, Linux {m['kernel']}, {m['os']}; "
            f"{m['iperf3']}; commit {m['commit']}{' (+ local changes)' if m.get('dirty') else ''}; "
            f"load average at start {m['loadavg_at_start'][0]}")


# --------------------------------------------------------------------------- statistics

def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]; None when empty."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return float(v[0])
    pos = (len(v) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


def median(values: Sequence[float]) -> Optional[float]:
    return percentile(values, 50)


def summary(values: Sequence[Optional[float]]) -> Dict[str, Any]:
    """n, missing (None values), p50, p99, max, mean of a sample."""
    v = [float(x) for x in values if x is not None]
    return {
        "n": len(v),
        "missing": sum(1 for x in values if x is None),
        "p50": percentile(v, 50),
        "p99": percentile(v, 99),
        "max": max(v) if v else None,
        "min": min(v) if v else None,
        "mean": sum(v) / len(v) if v else None,
    }


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v: Optional[float], nd: int = 2, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "-"
    return f"{v:.{nd}f}{unit}"


def p50_p99_max(summary: Dict[str, Any], nd: int = 1) -> str:
    """``"p50 / p99 / max"`` of a :func:`summary` dict, ``nd`` decimals."""
    return f"{fmt(summary['p50'], nd)} / {fmt(summary['p99'], nd)} / {fmt(summary['max'], nd)}"


def human_size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------- targets

def target(figure: str, value: Optional[float], op: str, limit: float, unit: str = "", detail: str = "") -> Dict[str, Any]:
    """A target check: ``value op limit`` with op in <=, >=, ==. ``met`` is None when the
    value is missing (the measurement failed: counted as a miss in the summary)."""
    if value is None:
        met = None
    elif op == "<=":
        met = value <= limit
    elif op == ">=":
        met = value >= limit
    elif op == "==":
        met = value == limit
    else:
        raise ValueError(op)
    return {"figure": figure, "value": value, "unit": unit, "target": f"{op} {limit:g}{(' ' + unit) if unit else ''}",
            "met": met, "detail": detail}


def misses(report: Mapping[str, Any]) -> List[Dict[str, Any]]:
    return [t for t in report.get("targets", []) if t["met"] is not True]


# --------------------------------------------------------------------------- report files

def inherited_plugin_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The plugin's variables (its parameter table, readers including "plugin") that
    ``environ`` (default: this process's) sets to a non-blank value and that a bench rank
    inherits: every one but those the bench sets itself (:func:`railover.testbed.scenario.rank_env`:
    ``RANK_VARS`` and ``BED_ENV``). A suite's own settings (its ``env``) still win
    over them. Without a loadable plugin: every ``RAILOVER_*``/``NCCL_*`` variable but those."""
    from railover import params
    from railover.testbed.scenario import BED_ENV, RANK_VARS
    environ = os.environ if environ is None else environ
    try:
        names = {p["name"] for p in params.params() if "plugin" in p["readers"]}
        read = lambda k: k in names  # noqa: E731
    except OSError:
        read = lambda k: k.startswith(("RAILOVER_", "NCCL_"))  # noqa: E731
    return {k: v for k, v in sorted(environ.items())
            if read(k) and v.strip(" \t") and k not in RANK_VARS and k not in BED_ENV}


def plugin_hold_down_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """The hold-down (s) of a bench rank that inherits ``environ`` (default: this process's):
    its ``RAILOVER_HOLD_DOWN_MS``, else the parameter table's default (3000 ms; 3 s without a
    loadable plugin). A suite that waits out a hold-down (a comm that started on a standby
    fails back after it) or spaces faults so that the next one is no flap (a path failing
    again within its hold-down of becoming active doubles it) uses this, not the default.
    Assumes a value the plugin accepts (suites refuse the others first: ``params.refusal``)."""
    from railover import params
    v = inherited_plugin_env(environ).get("RAILOVER_HOLD_DOWN_MS")
    if v is None:
        try:
            v = next(str(p["default_value"]) for p in params.params() if p["name"] == "RAILOVER_HOLD_DOWN_MS")
        except (OSError, StopIteration):
            v = "3000"
    return int(v.strip(" \t")) / 1000.0


#: suites whose ranks do not inherit this process's environment: the RDMA bed's run in QEMU
#: guests, started by the guest's init with only the variables the suite passes
_OWN_ENV_SUITES = ("rdma",)


class Report:
    """Collects one suite's results and writes ``<out>/<suite>.json``. Its ``inherited_env``:
    the plugin variables the caller's environment gave every rank (:func:`inherited_plugin_env`),
    so a report made under, say, ``RAILOVER_HOLD_DOWN_MS=10000`` says so; empty for the suites
    whose ranks inherit nothing (``_OWN_ENV_SUITES``)."""

    def __init__(self, suite: str, out: Path, quick: bool, settings: Mapping[str, Any]):
        self.suite = suite
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.data: Dict[str, Any] = {
            "suite": suite, "schema": SCHEMA,
            "command": "railover " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv and "railover" in sys.argv[0] else f"railover bench {suite}",
            "quick": quick,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "elapsed_s": None,
            "machine": machine_info(),
            "settings": dict(settings),
            "inherited_env": {} if suite in _OWN_ENV_SUITES else inherited_plugin_env(),
            "results": {},
            "targets": [],
            "wrong_bytes": 0,
            "plots": [],
        }
        self.finished = False
        _REPORTS.append(self)

    @property
    def results(self) -> Dict[str, Any]:
        return self.data["results"]

    def add_target(self, *a, **kw) -> Dict[str, Any]:
        t = target(*a, **kw)
        self.data["targets"].append(t)
        return t

    def add_wrong(self, n: int) -> None:
        self.data["wrong_bytes"] += int(n)

    def plot_path(self, name: str) -> Path:
        self.data["plots"].append(name)
        return self.out / name

    @property
    def path(self) -> Path:
        """``<out>/<suite>.json``."""
        return self.out / f"{self.suite}.json"

    def finish(self) -> Dict[str, Any]:
        """Write ``<out>/<suite>.json`` (complete) and return the report's data."""
        self._write()
        self._close()
        return self.data

    def save_interrupted(self, why: str) -> Tuple[Optional[Path], Optional[Path]]:
        """Write what the suite has gathered so far as ``<out>/<suite>.json``, marked
        ``"interrupted": why`` (e.g. "SIGINT"): every part a suite finished is already in
        :attr:`results` (suites that can store each part as it completes); targets are those
        already added. Returns ``(written, kept)``: ``written`` is None when no part finished
        (nothing is written, an existing file stays as it was); ``kept`` is where an earlier
        complete report of the suite was moved (``<suite>.prev.json``), else None. Raises
        OSError if it cannot be written."""
        self._close()
        if not completed_parts(self.data):
            return None, None
        self.data["interrupted"] = why
        kept = None
        try:
            old = json.loads(self.path.read_text())
            if isinstance(old, dict) and not old.get("interrupted"):
                kept = self.out / f"{self.suite}.prev.json"
                os.replace(self.path, kept)
        except (OSError, ValueError):
            pass  # none, or not a report: overwritten
        self._write()
        return self.path, kept

    def _close(self) -> None:
        self.finished = True

    def _write(self) -> None:
        """Atomically (temporary file, then rename): a signal or a full disk during the write
        never leaves a torn file where a report was."""
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        try:
            self.data["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            pass
        tmp = self.out / f".{self.suite}.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=_json_default))
        os.replace(tmp, self.path)


#: every report this process created, oldest first (what an interrupted run can still keep)
_REPORTS: List[Report] = []


def reports_since(mark: int) -> List[Report]:
    """Reports created since ``mark`` (a :func:`report_mark`), oldest first, finished or not."""
    return _REPORTS[mark:]


def report_mark() -> int:
    """A mark for :func:`reports_since`: the number of reports created so far."""
    return len(_REPORTS)


def open_reports() -> List[Report]:
    """Reports created in this process and not yet written (:meth:`Report.finish`)."""
    return [r for r in _REPORTS if not r.finished]


def completed_parts(data: Mapping[str, Any]) -> List[str]:
    """Human names of the measured parts a (possibly interrupted) report holds, e.g.
    ``["kinds: port-down, silent", "rows: 3"]``: a dict of per-part results (fault kinds,
    cases) by its keys, a list of rows by its length. Scalars and dicts of scalars (settings
    of the run, such as the RDMA bed's description) are not parts and are left out."""
    out = []
    for key, v in data.get("results", {}).items():
        if isinstance(v, dict) and v and all(isinstance(x, (dict, list)) for x in v.values()):
            out.append(f"{key}: {', '.join(map(str, v))}")
        elif isinstance(v, list) and v:
            out.append(f"{key}: {len(v)}")
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o))


#: fields of a suite's report that ``bench report`` reads
REPORT_FIELDS = ("machine", "command", "started", "elapsed_s", "settings", "wrong_bytes")


def load_report(out: Path, suite: str) -> Optional[Dict[str, Any]]:
    """``<out>/<suite>.json``, or None when there is none. Raises BenchError naming the file
    when it cannot be read or is not a suite's report."""
    p = Path(out) / f"{suite}.json"
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"{p}: cannot be read as JSON ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(data, dict):
        raise BenchError(f"{p}: not a railover bench report (not a JSON object)")
    missing = [k for k in REPORT_FIELDS if k not in data]
    if missing:
        raise BenchError(f"{p}: not a railover bench report (missing {', '.join(missing)})")
    return data


def matplotlib_pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# --------------------------------------------------------------------------- time series

def read_timeseries(path: Path) -> Tuple[List[Tuple[int, int]], List[Dict[str, int]]]:
    """``(buckets, iterations)`` of a driver ``--timeseries`` CSV; iterations carry their
    message size in ``bytes`` (empty lists when the file is missing)."""
    buckets: List[Tuple[int, int]] = []
    iters: List[Dict[str, int]] = []
    p = Path(path)
    if not p.exists():
        return buckets, iters
    with p.open() as f:
        for rec in csv.DictReader(f):
            if rec["kind"] == "bytes":
                buckets.append((int(rec["t_us"]), int(rec["bytes"])))
            else:
                iters.append({"t_us": int(rec["t_us"]), "bytes": int(rec["bytes"] or 0), "iter": int(rec["iter"]),
                              "lat_us": int(rec["lat_us"]), "wrong": int(rec["wrong"])})
    return buckets, iters


def rate_gbs(buckets: Sequence[Tuple[int, int]], t0: int, t1: int) -> Optional[float]:
    """Bytes delivered per second in [t0, t1), in GB/s (1e9 B/s); None for an empty window."""
    if t1 <= t0:
        return None
    inside = [b for t, b in buckets if t0 <= t < t1]
    if not inside:
        return None
    return sum(inside) / ((t1 - t0) / 1e6) / 1e9


longest_gap_ms = perf.longest_gap_ms


# --------------------------------------------------------------------------- processes

def proc_cpu_ns(pid: int) -> Optional[int]:
    """CPU time (user + system) of the threads a process has now, in ns (per-task schedstat);
    None when the process is gone. Threads that already exited are not included, so the
    difference of two readings is only the process's CPU time over the interval when no
    thread exited in between (compare :func:`thread_cpu_ns` readings to know)."""
    threads = _schedstat_field(pid, 0, missing=None)
    return None if threads is None else sum(threads.values())


def _schedstat_field(pid: int, field_: int, missing: Any = ()) -> Any:
    """Field ``field_`` of every thread's /proc schedstat, ns: {tid: ns} (0: on-CPU time,
    1: time runnable but waiting for a CPU). When the process is gone: ``missing`` (an empty
    dict by default)."""
    out: Dict[int, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {} if missing == () else missing
    for t in tasks:
        s = _read(f"/proc/{pid}/task/{t}/schedstat").split()
        if len(s) > field_:
            out[int(t)] = int(s[field_])
    return out


def thread_cpu_ns(pid: int) -> Dict[int, int]:
    """Per-thread CPU time in ns: {tid: ns}."""
    return _schedstat_field(pid, 0)


def thread_run_delay_ns(pid: int) -> Dict[int, int]:
    """Per-thread time spent runnable but waiting for a CPU (schedstat field 2), ns."""
    return _schedstat_field(pid, 1)


def max_delay_ms(before: Sequence[Dict[int, int]], after: Sequence[Dict[int, int]]) -> Optional[float]:
    """Largest per-thread run-queue wait between two snapshots (lists per process), ms."""
    best = None
    for a, b in zip(before, after):
        for t, v in b.items():
            d = (v - a.get(t, v)) / 1e6
            best = d if best is None else max(best, d)
    return best


def proc_rss_kib(pid: int) -> Optional[int]:
    """Resident set size of a process, KiB; None when it is gone (or a zombie: no VmRSS)."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def proc_threads(pid: int) -> Optional[int]:
    """Number of threads of a process; None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def proc_fds(pid: int) -> Optional[int]:
    """Number of open file descriptors of a process; None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def proc_start_ticks(pid: int) -> Optional[int]:
    """Start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot): tells
    a process from a later one that reuses its pid. None when it is gone."""
    s = _read(f"/proc/{pid}/stat")
    try:
        return int(s[s.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


# --------------------------------------------------------------------------- iperf3

def iperf_available() -> bool:
    return shutil.which("iperf3") is not None


def _port_listening(tb: TestBed, host: Any, port: int) -> bool:
    rc, out, _ = tb.run_collect(host, ["ss", "-Hltn", f"sport = :{port}"], timeout_s=10)
    return rc == 0 and bool(out.strip())


def iperf_ring(tb: TestBed, pairs: Sequence[Tuple[Any, Any, str, str]], streams: int, seconds: float,
               base_port: int = 5400, omit_s: int = 1, pin: bool = False) -> List[Dict[str, Any]]:
    """Run one iperf3 flow per ``(client_host, server_host, client_addr, server_addr)`` at the
    same time, each with ``streams`` TCP streams (``-P``), for ``seconds`` (+ ``omit_s``
    warm-up seconds that are not counted). Returns per flow ``{gbs, retransmits, cpu}``,
    gbs = bytes the receiver got per second in GB/s (1e9 B/s). ``pin``: flow i's client on CPU
    i % ncpu and its server on CPU (i + 1) % ncpu, as rank i sends and rank i + 1 receives.
    Raises BenchError on failure."""
    ncpu = os.cpu_count() or 1
    cpu = (lambda i: ["taskset", "-c", str(i % ncpu)]) if pin else (lambda i: [])
    servers = []
    try:
        for i, (ch, sh, ca, sa) in enumerate(pairs):
            port = base_port + i
            servers.append(tb.run(sh, cpu(i + 1) + ["iperf3", "-s", "-1", "-B", sa, "-p", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
        for i, (ch, sh, ca, sa) in enumerate(pairs):
            poll_until(lambda: _port_listening(tb, sh, base_port + i), 10, what=f"iperf3 server on port {base_port + i}")
        clients = []
        for i, (ch, sh, ca, sa) in enumerate(pairs):
            argv = cpu(i) + ["iperf3", "-c", sa, "-B", ca, "-p", str(base_port + i), "-P", str(streams), "-t", f"{seconds:g}",
                    "-O", str(omit_s), "-J"]
            clients.append(tb.run(ch, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        flows = []
        for c in clients:
            out, err = c.communicate(timeout=seconds + omit_s + 30)
            try:
                j = json.loads(out)
            except json.JSONDecodeError:
                raise BenchError(f"iperf3 client failed: {err.strip() or out[-500:]}") from None
            if "error" in j:
                raise BenchError(f"iperf3: {j['error']}")
            e = j["end"]
            flows.append({"gbs": e["sum_received"]["bits_per_second"] / 8e9,
                          "retransmits": e.get("sum_sent", {}).get("retransmits"),
                          "cpu": e.get("cpu_utilization_percent")})
        return flows
    finally:
        for s in servers:
            if s.poll() is None:
                s.terminate()
            try:
                s.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait()


# --------------------------------------------------------------------------- journal tail

class JournalTail:
    """Incremental reader of one JSON-lines journal (:class:`railover.journal.Tail`: keeps the
    file offset; a partial last line waits for its end); events get ``rank``. ``stats``
    counts garbled lines and events this railover does not know."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = Path(path), rank
        self._tail = journal.Tail(self.path)
        self.stats = self._tail.stats

    def read_new(self) -> List[Dict[str, Any]]:
        out = self._tail.read_new()
        for e in out:
            e["rank"] = self.rank
        return out


# --------------------------------------------------------------------------- live runs

@dataclass
class LiveResult:
    perf: perf.PerfResult
    events: List[Dict[str, Any]]
    buckets: List[List[Tuple[int, int]]]   # per rank
    iters: List[List[Dict[str, int]]]      # per rank
    workdir: Path
    marks: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.perf.ok

    @property
    def wrong_bytes(self) -> int:
        return self.perf.wrong_total

    def select(self, event: str, since_us: int = 0, until_us: Optional[int] = None) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event and e["t_us"] >= since_us
                and (until_us is None or e["t_us"] < until_us)]


class LiveRun:
    """railover-perf ranks on a test bed, running in the background, that the caller steers.

    Rank r runs on host ``r % hosts`` (every ring hop crosses the network when there is more
    than one host), with the plugin journal ``events-rank<r>.jsonl``, the time series
    ``ts-rank<r>.csv`` and the JSON result in ``workdir``. ``start()`` returns once every
    send comm of every rank has ``paths_per_comm`` paths up (its standby paths armed).
    :meth:`poll` reads new journal events; :meth:`wait_for` polls a predicate over all events;
    :meth:`stop` makes rank 0 end a timed run (``--stop-file``); :meth:`finish` waits and
    returns a :class:`LiveResult`.

    ``perf_opts`` go to :func:`railover.perf.build_argv` (workload, minbytes, channels,
    check, ...). ``extra_args`` are extra driver options.
    """

    def __init__(self, tb: TestBed, workdir: Path, *, ranks_per_host: int = 1, hosts: Optional[int] = None,
                 env: Optional[Mapping[str, str]] = None, rank_envs: Optional[Mapping[int, Mapping[str, str]]] = None,
                 paths_per_comm: Optional[int] = None, duration_s: Optional[float] = 600.0, timeout_s: float = 900.0,
                 connect_timeout_s: float = 60.0, idle_sleep_us: Optional[int] = None, extra_args: Sequence[str] = (),
                 pin: bool = False, **perf_opts: Any):
        self.tb = tb
        self.pin = pin
        self.wd = Path(workdir)
        if self.wd.exists():
            shutil.rmtree(self.wd)
        self.wd.mkdir(parents=True)
        self.nhosts = hosts or len(tb.hosts)
        self.nranks = self.nhosts * ranks_per_host
        self.env = dict(env or {})
        self.env.setdefault("RAILOVER_STATE_DIR", str(self.wd / "state"))
        self.rank_envs = {k: dict(v) for k, v in (rank_envs or {}).items()}
        self.channels = int(perf_opts.get("channels") or 1)
        nics = len(tb.hosts[0].nics)
        if paths_per_comm is None:
            paths_per_comm = 1 if self.env.get("RAILOVER_STANDBY") == "none" else nics
        self.paths_per_comm = paths_per_comm
        self.duration_s = duration_s
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        if idle_sleep_us is None:
            idle_sleep_us = 50 if self.nranks > (os.cpu_count() or 1) else 0
        args = list(extra_args)
        if idle_sleep_us:
            args += ["--idle-sleep-us", str(idle_sleep_us)]
        self.stop_file = self.wd / "stop"
        if duration_s:
            args += ["--stop-file", str(self.stop_file)]
            perf_opts.setdefault("timeseries", str(self.wd / "ts-rank%r.csv"))
            perf_opts["duration"] = duration_s
            perf_opts.setdefault("op_timeout", 60)
        self.perf_opts = perf_opts
        self.extra_args = args
        self.journals = [self.wd / f"events-rank{r}.jsonl" for r in range(self.nranks)]
        self.tails = [JournalTail(j, r) for r, j in enumerate(self.journals)]
        self.events: List[Dict[str, Any]] = []
        self.procs: Dict[int, subprocess.Popen] = {}
        self._holder: Dict[str, Any] = {}
        self._thread: Optional[threading.Thread] = None
        self.started_us: Optional[int] = None

    # ---- running
    def _spawn(self, rank: int, argv: List[str], full_env: Dict[str, str]) -> subprocess.Popen:
        host = rank % self.nhosts
        e = dict(full_env)
        e.update(rank_env(self.tb, host, self.journals[rank], self.env))
        e.update(self.rank_envs.get(rank, {}))
        if self.pin:  # rank r on CPU r % ncpu: run-to-run placement noise out of A/B comparisons
            argv = ["taskset", "-c", str(rank % (os.cpu_count() or 1))] + list(argv)
        out = open(self.wd / f"rank{rank}.out", "w")
        err = open(self.wd / f"rank{rank}.err", "w")
        try:
            p = self.tb.run(host, argv, env=e, stdout=out, stderr=err)
        finally:
            out.close()
            err.close()
        self.procs[rank] = p
        return p

    def _run(self) -> None:
        try:
            self._holder["res"] = perf.run_perf(self.nranks, spawn=self._spawn, timeout=self.timeout_s, workdir=self.wd,
                                                extra_args=self.extra_args, **self.perf_opts)
        except Exception as ex:  # surfaced by finish()
            self._holder["exc"] = ex

    def _ready(self) -> bool:
        self.poll()
        need = self.channels * self.paths_per_comm
        for r in range(self.nranks):
            ups = sum(1 for e in self.events if e["rank"] == r and e.get("event") == "path_up" and e.get("dir") == "send")
            if ups < need:
                return False
        return True

    def start(self, wait_ready: bool = True) -> "LiveRun":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if wait_ready:
            try:
                poll_until(lambda: self._ready() or not self._thread.is_alive(), self.connect_timeout_s, interval_s=0.02,
                           what="every rank's primary and standby paths")
            except TimeoutError:
                self.stop()
                self._thread.join(self.timeout_s)
                raise BenchError(f"ranks did not connect within {self.connect_timeout_s} s (workdir {self.wd})") from None
            if not self._thread.is_alive():
                res = self._holder.get("res")
                raise BenchError("railover-perf ended before its comms were up: "
                                 + (res.describe() if res else str(self._holder.get("exc"))))
        self.started_us = now_us()
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> List[Dict[str, Any]]:
        new = []
        for t in self.tails:
            new += t.read_new()
        new.sort(key=lambda e: e["t_us"])
        self.events += new
        return new

    def select(self, event: str, since_us: int = 0) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event and e["t_us"] >= since_us]

    def wait_for(self, pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.005) -> bool:
        """Poll journals and ``pred()`` until it is truthy (True) or the time is up / the ranks
        ended (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if pred():
                return True
            if time.monotonic() >= deadline or not self.alive:
                self.poll()
                return bool(pred())
            time.sleep(interval_s)

    def stdout(self, rank: int = 0) -> str:
        return _read(str(self.wd / f"rank{rank}.out"))

    def stop(self) -> None:
        self.stop_file.touch()

    def finish(self, check: bool = True) -> LiveResult:
        if self._thread is None:
            raise BenchError("finish() before start()")
        self._thread.join(self.timeout_s + 60)
        if "exc" in self._holder:
            raise BenchError(f"railover-perf could not run: {self._holder['exc']}")
        res: perf.PerfResult = self._holder["res"]
        self.poll()
        # Journal lines written after the last poll (close events) are read here.
        buckets, iters = [], []
        for r in range(self.nranks):
            b, it = read_timeseries(self.wd / f"ts-rank{r}.csv")
            buckets.append(b)
            iters.append(it)
        out = LiveResult(perf=res, events=list(self.events), buckets=buckets, iters=iters, workdir=self.wd)
        stats = journal.Stats()
        for t in self.tails:
            stats.add(t.stats)
        out.marks["journal_unknown"] = dict(stats.unknown)   # events this railover does not know
        out.marks["journal_unreadable_lines"] = stats.garbled
        if check and not res.ok:
            raise BenchError("a rank failed:\n" + res.describe())
        return out


def run_sweep(tb: TestBed, workdir: Path, *, ranks_per_host: int = 1, env: Optional[Mapping[str, str]] = None,
              timeout_s: float = 900.0, idle_sleep_us: Optional[int] = None, hosts: Optional[int] = None,
              extra_args: Sequence[str] = (), pin: bool = False, **perf_opts: Any) -> perf.PerfResult:
    """One railover-perf sweep on a test bed (rank r on host r % hosts); returns the checked
    PerfResult (raises BenchError with the ranks' output when a rank failed)."""
    lr = LiveRun(tb, workdir, ranks_per_host=ranks_per_host, hosts=hosts, env=env, duration_s=None,
                 timeout_s=timeout_s, idle_sleep_us=idle_sleep_us, extra_args=extra_args, pin=pin, **perf_opts)
    lr.start(wait_ready=False)
    lr._thread.join(timeout_s + 60)
    if "exc" in lr._holder:
        raise BenchError(f"railover-perf could not run: {lr._holder['exc']}")
    res: perf.PerfResult = lr._holder["res"]
    if not res.ok:
        raise BenchError("a rank failed:\n" + res.describe())
    return res
