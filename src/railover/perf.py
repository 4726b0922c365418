"""Run ``railover-perf`` (the native NCCL-proxy emulator) with N ranks and read its results.

``railover-perf`` is one process per rank; the ranks meet through pathname UNIX sockets in a
shared directory, so each rank may live in its own network namespace. This module builds the
command lines, starts the ranks (directly, or through a caller-supplied ``spawn`` callable such
as a test bed's "run in host X"), waits with a timeout and parses each rank's ``--json`` file.

Example::

    from railover import perf
    res = perf.run_perf(2, workload="allreduce", minbytes="8", maxbytes="1M",
                        env={"RAILOVER_IFNAMES": "lo"})
    res.check()                      # raises PerfError with the ranks' stderr on failure
    print(res.rows[-1]["busbw_gbps"], res.wrong_total)

    # each rank in its own namespace (test bed):
    res = perf.run_perf(2, spawn=lambda rank, argv, env: tb.run(hosts[rank], argv, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), ...)

JSON schema of a rank's result: see ``native/tools/perf/report.h`` (``rows`` with nccl-tests
columns, ``wrong_total``, ``errors``, ``stats``...). Exit codes of the binary: 0 ok, 1 wrong
data, 2 usage/load error, 3 plugin error, 4 timeout (stuck request/call), 5 rendezvous
failure or peer exit, 6 internal error (``EXIT_*`` below).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from railover import _paths

__all__ = [
    "EXIT_OK", "EXIT_WRONG_DATA", "EXIT_USAGE", "EXIT_PLUGIN", "EXIT_TIMEOUT", "EXIT_PEER", "EXIT_INTERNAL",
    "PerfError", "RankResult", "PerfResult", "Spawn", "build_argv", "run_perf", "read_timeseries", "main",
]

EXIT_OK, EXIT_WRONG_DATA, EXIT_USAGE, EXIT_PLUGIN, EXIT_TIMEOUT, EXIT_PEER, EXIT_INTERNAL = range(7)

Size = Union[int, str]
#: ``spawn(rank, argv, env) -> Popen``: start one rank. ``env`` is the complete environment
#: (``os.environ`` plus the caller's additions). Pipes on the returned Popen are drained and
#: their text kept in :attr:`RankResult.stdout` / ``stderr``.
Spawn = Callable[[int, List[str], Dict[str, str]], subprocess.Popen]


class PerfError(RuntimeError):
    """A run failed (non-zero exit, timeout or missing results); the message has the details."""


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]          # None: killed at the timeout
    stdout: str = ""
    stderr: str = ""
    json: Optional[Dict[str, Any]] = None


@dataclass
class PerfResult:
    ranks: List[RankResult]
    timed_out: bool
    workdir: Path
    argv0: List[str] = field(default_factory=list)   # rank 0's command line

    @property
    def ok(self) -> bool:
        """Every rank exited 0 in time (hence: no wrong byte, no plugin error)."""
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    @property
    def result(self) -> Dict[str, Any]:
        """Rank 0's JSON (raises PerfError when it is missing)."""
        j = self.ranks[0].json
        if j is None:
            raise PerfError("rank 0 wrote no JSON result\n" + self.describe())
        return j

    @property
    def rows(self) -> List[Dict[str, Any]]:
        return self.result["rows"]

    @property
    def abi(self) -> int:
        return int(self.result["plugin"]["abi"])

    @property
    def wrong_total(self) -> int:
        """Wrong bytes seen by all ranks (each rank's own count, summed)."""
        return sum(int(r.json["local_wrong_total"]) for r in self.ranks if r.json)

    @property
    def errors(self) -> List[str]:
        return [f"rank {r.rank}: {e}" for r in self.ranks if r.json for e in r.json.get("errors", [])]

    def row(self, size: int, comm: int = 0) -> Dict[str, Any]:
        for r in self.rows:
            if r["size"] == size and r["comm"] == comm:
                return r
        raise KeyError(f"no row for size {size} (communicator {comm})")

    def describe(self, tail: int = 3000) -> str:
        """Exit codes, errors and the end of every rank's stderr, for assertion messages."""
        out = [f"railover-perf {' '.join(self.argv0)}", f"timed out: {self.timed_out}"]
        for r in self.ranks:
            out.append(f"--- rank {r.rank}: exit {r.returncode}")
            if r.json and r.json.get("errors"):
                out.append("errors: " + "; ".join(r.json["errors"]))
            if r.stderr:
                out.append(r.stderr[-tail:])
        return "\n".join(out)

    def check(self) -> "PerfResult":
        """Raise PerfError unless :attr:`ok`; returns self."""
        if not self.ok:
            raise PerfError(self.describe())
        return self


def _size(v: Size) -> str:
    return str(v)


def build_argv(rank: int, nranks: int, rendezvous: Union[str, Path], *,
               binary: Union[str, Path, None] = None,
               plugin: Union[str, Path, None] = None,
               workload: str = "sendrecv", pattern: Optional[str] = None,
               minbytes: Size = 8, maxbytes: Optional[Size] = None,
               stepfactor: Optional[float] = None, stepbytes: Optional[Size] = None,
               iters: Optional[int] = None, warmup: Optional[int] = None,
               channels: Optional[int] = None, contexts: Optional[int] = None, dev: Optional[int] = None,
               abi: Optional[int] = None,
               slot_size: Optional[Size] = None, ll_slot: Optional[Size] = None, ll_max: Optional[Size] = None,
               reconnect_every: Optional[int] = None, reload: bool = False, reload_no_init: bool = False,
               duration: Optional[float] = None, timeseries: Union[str, Path, None] = None,
               json_path: Union[str, Path, None] = None,
               op_timeout: Optional[float] = None, rendezvous_timeout: Optional[float] = None,
               check: bool = True, close_inflight: bool = True, verbose: bool = False,
               group: Optional[int] = None, flush: bool = False,
               extra_args: Sequence[str] = ()) -> List[str]:
    """Command line for one rank. ``binary``/``plugin`` default to :func:`railover._paths`
    lookups. Sizes may be ints or nccl-tests strings ("64K", "1M"). ``json_path`` and
    ``timeseries`` may contain ``%r`` (replaced by the rank by the binary). ``group``: SIMPLE
    receive steps per grouped irecv (``--group``, sendrecv only); ``flush``: iflush every SIMPLE
    receive with bytes (``--flush``, NCCL's GPUDirect receive path)."""
    exe = str(binary or _paths.perf_path())
    so = str(plugin or _paths.plugin_path())
    a = [exe, "--plugin", so, "--rank", str(rank), "--nranks", str(nranks), "--rendezvous", str(rendezvous),
         "--workload", workload, "-b", _size(minbytes)]
    if maxbytes is not None:
        a += ["-e", _size(maxbytes)]
    elif duration is None:
        a += ["-e", _size(minbytes)]
    opt = [("--pattern", pattern), ("-f", stepfactor), ("-i", stepbytes), ("-n", iters), ("-w", warmup), ("--channels", channels),
           ("--contexts", contexts), ("--dev", dev), ("--abi", abi), ("--slot-size", slot_size),
           ("--ll-slot", ll_slot), ("--ll-max", ll_max), ("--reconnect-every", reconnect_every),
           ("--duration", duration), ("--timeseries", timeseries), ("--json", json_path),
           ("--op-timeout", op_timeout), ("--rendezvous-timeout", rendezvous_timeout), ("--group", group)]
    for flag, v in opt:
        if v is not None:
            a += [flag, str(v)]
    if reload_no_init:
        a.append("--reload-no-init")
    elif reload:
        a.append("--reload")
    if not check:
        a += ["-c", "0"]
    if not close_inflight:
        a.append("--no-close-inflight")
    if verbose:
        a.append("-v")
    if flush:
        a.append("--flush")
    return a + list(extra_args)


def _default_spawn(workdir: Path) -> Spawn:
    def spawn(rank: int, argv: List[str], env: Dict[str, str]) -> subprocess.Popen:
        out = open(workdir / f"rank{rank}.out", "w")
        err = open(workdir / f"rank{rank}.err", "w")
        try:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        finally:
            out.close()
            err.close()
    return spawn


def _drain(p: subprocess.Popen, sink: Dict[str, str]) -> List[threading.Thread]:
    threads = []
    for name in ("stdout", "stderr"):
        stream = getattr(p, name)
        if stream is None:
            continue

        def pump(s=stream, n=name):
            data = s.read()
            sink[n] = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        threads.append(t)
    return threads


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_perf(nranks: int = 2, *, spawn: Optional[Spawn] = None, env: Optional[Mapping[str, str]] = None,
             timeout: float = 120.0, workdir: Union[str, Path, None] = None,
             start_order: Optional[Sequence[int]] = None, **argv_options: Any) -> PerfResult:
    """Run ``nranks`` ranks and wait (at most ``timeout`` s; then all are killed and
    ``timed_out`` is set). ``env`` is added to ``os.environ`` for every rank. ``argv_options``
    go to :func:`build_argv` (``workload``, ``minbytes``, ``abi``, ``channels``...); the
    rendezvous directory and the per-rank JSON files live in ``workdir`` (a new temporary
    directory by default, kept for inspection). ``start_order`` lists ranks in the order they
    are started (default 0..n-1). Does not raise on failure: call :meth:`PerfResult.check`."""
    wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="railover-perf-"))
    wd.mkdir(parents=True, exist_ok=True)
    rv = wd / "rv"
    rv.mkdir(exist_ok=True)
    if len(str(rv)) > 90:
        raise ValueError(f"rendezvous path too long for a UNIX socket: {rv}")
    argv_options.setdefault("json_path", str(wd / "rank%r.json"))
    full_env = dict(os.environ)
    full_env.update(env or {})
    spawner = spawn or _default_spawn(wd)
    order = list(start_order) if start_order is not None else list(range(nranks))
    if sorted(order) != list(range(nranks)):
        raise ValueError(f"start_order must be a permutation of 0..{nranks - 1}")

    procs: Dict[int, subprocess.Popen] = {}
    sinks: Dict[int, Dict[str, str]] = {r: {} for r in range(nranks)}
    pumps: List[threading.Thread] = []
    argvs = {r: build_argv(r, nranks, rv, **argv_options) for r in range(nranks)}
    try:
        for r in order:
            procs[r] = spawner(r, argvs[r], dict(full_env))
            pumps += _drain(procs[r], sinks[r])
        deadline = time.monotonic() + timeout
        timed_out = False
        for r in range(nranks):
            left = deadline - time.monotonic()
            try:
                procs[r].wait(timeout=max(left, 0.001))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for p in procs.values():
            _kill(p)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    for t in pumps:
        t.join(timeout=5)

    ranks = []
    for r in range(nranks):
        p = procs[r]
        rc = p.returncode
        if timed_out and rc is not None and rc < 0:
            rc = None  # killed by us
        res = RankResult(rank=r, returncode=rc, stdout=sinks[r].get("stdout", ""), stderr=sinks[r].get("stderr", ""))
        for name, attr in (("out", "stdout"), ("err", "stderr")):
            f = wd / f"rank{r}.{name}"
            if not getattr(res, attr) and f.exists():
                setattr(res, attr, f.read_text(errors="replace"))
        jf = Path(str(argv_options["json_path"]).replace("%r", str(r)))
        if jf.exists():
            try:
                res.json = json.loads(jf.read_text())
            except json.JSONDecodeError as e:
                res.stderr += f"\n[perf.py] cannot parse {jf}: {e}"
        ranks.append(res)
    return PerfResult(ranks=ranks, timed_out=timed_out, workdir=wd, argv0=argvs[0])


#: The longest timed run railover-perf takes with --timeseries, s (24 h: its 1 ms buckets are
#: allocated up front, 8 bytes each; kMaxTimeseriesSeconds in native/tools/perf/main.cc).
MAX_TIMESERIES_S = 86400


def longest_gap_ms(buckets: Sequence[Tuple[int, int]], t0: int, t1: int, begun_by: Optional[int] = None) -> float:
    """Longest run of 1 ms buckets (``(t_us, bytes)``, as :func:`read_timeseries` gives) with no
    delivered byte in [t0, t1), in ms. ``begun_by`` (µs): only runs that began before it count,
    each in full up to t1 (a fault's stall, begun before the comms converged, and not the host's
    jitter after they did)."""
    best = cur = 0
    start = 0
    for t, b in buckets:
        if t < t0 or t >= t1:
            continue
        if b:
            cur = 0
            continue
        if cur == 0:
            start = t
        cur += 1
        if begun_by is None or start < begun_by:
            best = max(best, cur)
    return float(best)


def read_timeseries(path: Union[str, Path]) -> Tuple[List[Tuple[int, int]], List[Dict[str, int]]]:
    """Parse a ``--timeseries`` file (CSV or JSON lines). Returns ``(buckets, iterations)``:
    ``buckets`` = [(t_us, bytes)] per millisecond, ``iterations`` = [{t_us, iter, lat_us, wrong}]."""
    p = Path(path)
    buckets: List[Tuple[int, int]] = []
    iters: List[Dict[str, int]] = []
    lines = p.read_text().splitlines()
    if p.suffix == ".csv":
        import csv
        for rec in csv.DictReader(lines):
            if rec["kind"] == "bytes":
                buckets.append((int(rec["t_us"]), int(rec["bytes"])))
            else:
                iters.append({k: int(rec[k]) for k in ("t_us", "iter", "lat_us", "wrong")})
    else:
        for line in lines:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["kind"] == "bytes":
                buckets.append((int(rec["t_us"]), int(rec["bytes"])))
            else:
                iters.append({k: int(rec[k]) for k in ("t_us", "iter", "lat_us", "wrong")})
    return buckets, iters


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m railover.perf [-n N] [--timeout S] -- <railover-perf options>``: run N local
    ranks (loopback), print rank 0's table and every failing rank's stderr."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m railover.perf", description=main.__doc__)
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="options for railover-perf (after --)")
    a = ap.parse_args(argv)
    rest = [x for x in a.rest if x != "--"] if a.rest[:1] == ["--"] else list(a.rest)
    wd = Path(tempfile.mkdtemp(prefix="railover-perf-"))
    res = run_perf(a.nranks, timeout=a.timeout, workdir=wd, minbytes=8, maxbytes=None, extra_args=rest)
    sys.stdout.write(res.ranks[0].stdout)
    for r in res.ranks:
        if r.returncode != 0:
            sys.stderr.write(f"--- rank {r.rank} exited {r.returncode}\n{r.stderr[-4000:]}\n")
    if res.ok:
        shutil.rmtree(wd, ignore_errors=True)
    return 0 if res.ok else (res.ranks[0].returncode or 1)


if __name__ == "__main__":
    sys.exit(main())
