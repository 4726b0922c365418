#!/usr/bin/env python3
"""Where is rank 0 stuck when a failover is late? Cable pulls at a0 under a checked all-reduce
on the RDMA bed; when guest A's send comm has not failed over ``--late-ms`` after a pull, every
thread of rank 0 is dumped from inside the guest: its wchan, state, the system call it is in
(/proc/<pid>/task/<tid>/syscall) and its kernel stack, plus A's ARP table.

This is how the 3 s failovers of 2026-12-04 were traced (docs/BENCHMARKS.md, "fence
threads"): the dump showed NCCL's stand-in progress thread in ``ib_destroy_qp_user`` ->
``__rxe_cleanup`` (state D) for ~3 s, i.e. the engine's thread released a verbs path itself.
Threads are matched to the plugin's log lines (``ro-A:<pid>:<tid>``) in the fetched
``rank0.err``. Run from a checkout with the native build::

    PYTHONPATH=src RAILOVER_NATIVE_DIR=build python3 scripts/rdma_stall_capture.py --pulls 80 -o out

Writes ``out/stuck-<pull>.txt`` per late failover and the run's journals and logs in
``out/run``; prints one line per pull (the failover's lateness as the host saw it by polling
the journal, an upper bound). About 8 s per pull under TCG. Exit 0 when the bed ran (it judges
nothing), 2 when the bed could not run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from railover.bench import rdma as R
from railover.testbed.rdma import faults as rf
from railover.testbed.rdma.bed import RdmaBed, RdmaBedError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pulls", type=int, default=60, help="cable pulls at a0")
    ap.add_argument("--late-ms", type=float, default=500.0, help="dump rank 0 when no failover after this, ms")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    a = ap.parse_args()
    if a.pulls < 1 or a.late_ms <= 0:
        ap.error("--pulls and --late-ms must be positive")
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        with RdmaBed(rails=2, wire="stream") as bed:
            env = dict(R.RDMA_ENV, RAILOVER_HOLD_DOWN_MS="1000")
            run = R._PerfRun(bed, env, size="256K", upper_s=3600, fetch_to=a.out / "run").start()
            wd = R._wait(lambda: run.wd() if run.alive else "x", 300)
            armed = lambda: (R.armed_on_primary(R._journal(bed, "A", wd))  # noqa: E731
                             and R.armed_on_primary(R._journal(bed, "B", wd)))
            if not wd or not R._wait(armed, 600):
                print("the checked run did not come up armed on the primary", file=sys.stderr)
                return 2
            pid = bed.sh("A", "pidof railover-perf", timeout_s=60)[1].split()[0]
            late = 0
            for i in range(a.pulls):
                R._wait(armed, 130)
                base = len(R._journal(bed, "A", wd))
                f = rf.CablePull(bed, "a0").apply()
                t0, dumped = time.monotonic(), False
                while time.monotonic() - t0 < 60 and not R.new_events(R._journal(bed, "A", wd), base, "failover"):
                    if not dumped and time.monotonic() - t0 > a.late_ms / 1000:
                        _, dump, err = bed.sh("A", f"for t in /proc/{pid}/task/*; do echo == $t $(cat $t/comm) "
                                              f"wchan=$(cat $t/wchan) state=$(cut -d' ' -f3 $t/stat); "
                                              f"cat $t/syscall; cat $t/stack; done; cat /proc/net/arp", timeout_s=60)
                        (a.out / f"stuck-{i}.txt").write_text(dump + err)
                        dumped, late = True, late + 1
                    time.sleep(0.1)
                dt = time.monotonic() - t0
                f.undo()
                R._wait(lambda: len(R.new_events(R._journal(bed, "A", wd), base, "failback")) >= 1, 130)
                print(f"pull {i}: A's send comm failed over within {dt * 1000:.0f} ms"
                      f"{' (late: threads dumped)' if dumped else ''}", flush=True)
            run.stop()
            print(f"late failovers: {late} of {a.pulls}")
    except RdmaBedError as e:
        print(f"the RDMA bed could not run: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
