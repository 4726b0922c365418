#!/usr/bin/env python3
"""Runs the engine tests and the end-to-end tests N times in a row beside a CPU hog on every
core, and stops at the first failing run (issue 11's check: a busy host is the normal case,
so these suites must pass there, and a late thread must never be read as a network fault).

    python3 scripts/busy_host_runs.py [--runs 3] [--hogs-per-core 1] [--build build]

The hog is one busy-looping process per core (per `--hogs-per-core`), at normal priority,
started before the first run and stopped after the last; the load average is printed with
each run. Needs root (the end-to-end tests build network namespaces) and a build of the
native code in `--build` (cmake -S . -B build && cmake --build build). Exit status 0 when
every run passed, 1 at the first failing run (its output is kept in the printed log file).
"""
import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time


def _spin() -> None:
    # A hog dies quietly when the parent terminates it; Ctrl-C (sent to the whole process
    # group) is the parent's to handle. Without this the forked hogs inherit the parent's
    # SIGTERM handler and print a KeyboardInterrupt traceback each on exit.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs in a row (default 3)")
    ap.add_argument("--hogs-per-core", type=int, default=1, help="busy processes per core (default 1)")
    ap.add_argument("--build", default="build", help="native build directory (default build)")
    ap.add_argument("--pytest-args", default="tests/e2e", help="what pytest runs (default tests/e2e)")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.join(root, a.build)
    engine = os.path.join(build, "railover_engine_tests")
    if not os.path.exists(engine):
        print(f"busy_host_runs: {engine} not found: build the native code first "
              f"(cmake -S . -B {a.build} -G Ninja && cmake --build {a.build})", file=sys.stderr)
        return 2
    if a.runs < 1 or a.hogs_per_core < 1:
        print("busy_host_runs: --runs and --hogs-per-core must be at least 1", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src"), RAILOVER_NATIVE_DIR=build)

    def _stop(signum, frame):  # SIGTERM: stop the running step and the hogs as for Ctrl-C
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    ncpu = os.cpu_count() or 1
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(ncpu * a.hogs_per_core)]
    for h in hogs:
        h.start()
    print(f"busy_host_runs: {len(hogs)} busy processes on {ncpu} cores; {a.runs} runs of the engine "
          f"tests and pytest {a.pytest_args}")
    try:
        for i in range(1, a.runs + 1):
            log = tempfile.NamedTemporaryFile(prefix=f"busy-host-run{i}-", suffix=".log", delete=False)
            t0 = time.monotonic()
            steps = [[engine, "--gtest_brief=1"],
                     [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *a.pytest_args.split()]]
            rc = 0
            for cmd in steps:
                log.write(f"$ {' '.join(cmd)}\n".encode())
                log.flush()
                child = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
                try:
                    rc = child.wait()
                except BaseException:
                    # Stopped (SIGINT, or SIGTERM below): let pytest tear its test beds down.
                    child.send_signal(signal.SIGINT)
                    child.wait(120)
                    raise
                if rc:
                    break
            log.close()
            load = os.getloadavg()[0]
            took = time.monotonic() - t0
            print(f"  run {i}: {'PASS' if rc == 0 else 'FAIL'} in {took:.0f} s, load average {load:.1f} "
                  f"(log {log.name})", flush=True)
            if rc:
                return 1
        return 0
    except KeyboardInterrupt:
        print("busy_host_runs: stopped", file=sys.stderr)
        return 130
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.join()


if __name__ == "__main__":
    sys.exit(main())
