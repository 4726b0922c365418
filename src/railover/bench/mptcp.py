"""The Linux MPTCP peer of ``railover bench failover --peer mptcp``: one MPTCP connection
with a backup subflow on the standby rail, carrying a checked byte stream, on the same test
bed and under the same faults as railover.

Setup on a T2 bed (host A sends, host B receives; every knob the comparison sets)::

    A, B:  ip mptcp limits set subflows 4 add_addr_accepted 4
    B:     ip mptcp endpoint add <b1 addr> dev <b1> signal     # announce the standby rail
    A:     ip mptcp endpoint add <a1 addr> dev <a1> backup     # subflows from a1 are backup
    B:     socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP) listening on 0.0.0.0:<port>
    A:     socket(..., IPPROTO_MPTCP) bound to a0, connect to b0:<port>

The first subflow runs a0 -> b0 (rail 0). B announces b1 (ADD_ADDR); A opens the second
subflow a1 -> b1 (rail 1) from its endpoint, flagged backup (MP_JOIN with the B bit), so the
default scheduler sends only on the rail-0 subflow while it works, as railover sends only on
its primary path. Nothing else is changed: net.mptcp.* (scheduler ``default``,
``stale_loss_cnt`` 4, ``path_manager`` kernel) and TCP (congestion control, RTO, retries)
keep the kernel's defaults, which the report records. Why not ``subflow`` on A's endpoint:
the kernel would open a1 -> b0, which cannot work on isolated rails and sits in SYN-SENT; and
B must listen on every address (0.0.0.0) or the join to b1 is reset.

The stream: 64-bit little-endian words, word i holds i. The receiver checks every byte
against that (numpy), counts received bytes in 1 ms buckets (CLOCK_MONOTONIC, the clock of
the fault objects and of railover's journals) and writes them at the end.

Programs (run inside a host's namespace with ``python3 -m railover.bench.mptcp``)::

    recv --port P --ready FILE --out FILE.npz --max-s S      (stops on SIGTERM or EOF)
    send --src ADDR --dst ADDR --port P --stop FILE           (stops when FILE exists)
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

IPPROTO_MPTCP = 262
CHUNK = 256 << 10     # bytes per send() call
RECV_BUF = 1 << 20


def now_us() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def expected(pos: int, n: int):
    """The ``n`` stream bytes that start at byte offset ``pos`` (numpy uint8 array)."""
    import numpy as np
    w0 = pos // 8
    words = np.arange(w0, (pos + n + 7) // 8 + 1, dtype="<u8")
    off = pos - w0 * 8
    return words.view(np.uint8)[off:off + n]


# --------------------------------------------------------------------------- programs

def recv_main(a: argparse.Namespace) -> int:
    import numpy as np
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", a.port))
    srv.listen(4)
    Path(a.ready).write_text("listening\n")
    srv.settimeout(0.2)
    conn = None
    while conn is None and not stop["flag"]:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
    t0 = now_us() // 1000 * 1000
    buckets = np.zeros(int(a.max_s * 1000) + 1, dtype=np.int64)
    buf = bytearray(RECV_BUF)
    mv = memoryview(buf)
    pos = wrong = 0
    error = None
    if conn is not None:
        conn.settimeout(0.2)
        while not stop["flag"]:
            try:
                n = conn.recv_into(buf)
            except socket.timeout:
                continue
            except OSError as e:
                error = f"recv: {e}"
                break
            if n == 0:
                break
            t = now_us()
            i = min((t - t0) // 1000, len(buckets) - 1)
            buckets[i] += n
            got = np.frombuffer(mv[:n], dtype=np.uint8)
            wrong += int(np.count_nonzero(got != expected(pos, n)))
            pos += n
    end = now_us()
    used = min((end - t0) // 1000 + 1, len(buckets))
    np.savez(a.out, buckets=buckets[:used], t0_us=t0, end_us=end, bytes=pos, wrong=wrong,
             error=error or "", connected=conn is not None)
    return 0


def send_main(a: argparse.Namespace) -> int:
    import numpy as np
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    s.bind((a.src, 0))
    s.settimeout(10)
    s.connect((a.dst, a.port))
    s.setblocking(False)
    word = 0
    data = b""
    off = 0
    stop = Path(a.stop)
    last_check = 0.0
    try:
        while True:
            if off >= len(data):
                data = np.arange(word, word + CHUNK // 8, dtype="<u8").tobytes()
                word += CHUNK // 8
                off = 0
            _, w, _ = select.select([], [s], [], 0.05)
            if w:
                try:
                    off += s.send(memoryview(data)[off:])
                except BlockingIOError:
                    pass
            now = time.monotonic()
            if now - last_check > 0.05:
                last_check = now
                if stop.exists():
                    break
    except OSError as e:
        print(f"send: {e}", file=sys.stderr)
        return 1
    finally:
        s.close()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m railover.bench.mptcp", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--ready", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--max-s", type=float, default=3600)
    s = sub.add_parser("send")
    s.add_argument("--src", required=True)
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--stop", required=True)
    a = p.parse_args(argv)
    return recv_main(a) if a.cmd == "recv" else send_main(a)


# --------------------------------------------------------------------------- controller

class MptcpError(RuntimeError):
    """The MPTCP peer could not be set up (kernel without MPTCP, subflow not established...)."""


def _sh(tb, host: str, cmd: List[str]) -> str:
    rc, out, err = tb.run_collect(host, cmd, timeout_s=20)
    if rc != 0:
        raise MptcpError(f"{' '.join(cmd)} in host {host} failed: {err.strip() or out.strip()}")
    return out


def sysctls(tb, host: str) -> Dict[str, str]:
    """net.mptcp.* and the TCP settings that decide MPTCP's failover, as read in ``host``."""
    out = _sh(tb, host, ["sysctl", "net.mptcp", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_retries2",
                         "net.ipv4.tcp_syn_retries"])
    return dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)


class MptcpPeer:
    """One checked MPTCP stream A(a0) -> B(b0) with a backup subflow a1 -> b1 (see the module
    doc). ``start()`` returns once both subflows are established and data flows on rail 0;
    ``stop()`` ends it and returns the receiver's result: ``buckets`` (bytes per 1 ms from
    ``t0_us``), ``bytes``, ``wrong``, ``error``."""

    def __init__(self, tb, workdir: Path, port: int = 5600, max_s: float = 3600):
        self.tb, self.wd, self.port, self.max_s = tb, Path(workdir), port, max_s
        self.wd.mkdir(parents=True, exist_ok=True)
        self.a0, self.a1, self.b0, self.b1 = (tb.nic(x) for x in ("a0", "a1", "b0", "b1"))
        self.stop_file = self.wd / "stop"
        self.ready = self.wd / "ready"
        self.out = self.wd / "recv.npz"
        self.recv_p = self.send_p = None
        self.setup: List[str] = []
        self.subflows: str = ""

    def configure(self) -> None:
        cmds = [("A", ["ip", "mptcp", "limits", "set", "subflows", "4", "add_addr_accepted", "4"]),
                ("B", ["ip", "mptcp", "limits", "set", "subflows", "4", "add_addr_accepted", "4"]),
                ("B", ["ip", "mptcp", "endpoint", "add", self.b1.addr, "dev", self.b1.ifname, "signal"]),
                ("A", ["ip", "mptcp", "endpoint", "add", self.a1.addr, "dev", self.a1.ifname, "backup"])]
        for host, c in cmds:
            _sh(self.tb, host, c)
            self.setup.append(f"{host}: {' '.join(c)}")

    def _subflows(self) -> List[str]:
        out = _sh(self.tb, "A", ["ss", "-tniH", "state", "established"])
        return [line for line in out.splitlines() if f":{self.port}" in line]

    def start(self, timeout_s: float = 30) -> "MptcpPeer":
        from railover.testbed.netns import poll_until
        import subprocess
        for f in (self.stop_file, self.ready, self.out):
            if f.exists():
                f.unlink()
        py = [sys.executable, "-m", "railover.bench.mptcp"]
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.recv_p = self.tb.run("B", py + ["recv", "--port", str(self.port), "--ready", str(self.ready), "--out",
                                             str(self.out), "--max-s", str(self.max_s)], env=env,
                                  stdout=open(self.wd / "recv.out", "w"), stderr=subprocess.STDOUT)
        poll_until(lambda: self.ready.exists() or self.recv_p.poll() is not None, timeout_s, what="MPTCP receiver")
        if self.recv_p.poll() is not None:
            raise MptcpError(f"MPTCP receiver exited: {(self.wd / 'recv.out').read_text()[-2000:]}")
        self.send_p = self.tb.run("A", py + ["send", "--src", self.a0.addr, "--dst", self.b0.addr, "--port",
                                             str(self.port), "--stop", str(self.stop_file)], env=env,
                                  stdout=open(self.wd / "send.out", "w"), stderr=subprocess.STDOUT)
        try:
            poll_until(lambda: len(self._subflows()) >= 2 or self.send_p.poll() is not None, timeout_s, interval_s=0.2,
                       what="both MPTCP subflows established")
        except TimeoutError:
            raise MptcpError("the backup subflow a1 -> b1 was not established: " + " | ".join(self._subflows())) from None
        if self.send_p.poll() is not None:
            raise MptcpError(f"MPTCP sender exited: {(self.wd / 'send.out').read_text()[-2000:]}")
        out = _sh(self.tb, "A", ["ss", "-tniH", "state", "established"])
        self.subflows = out
        return self

    def snapshot(self) -> str:
        """``ss -tniM`` on host A (the subflows and the MPTCP socket), for the report."""
        try:
            return _sh(self.tb, "A", ["ss", "-tniM"])
        except MptcpError as e:
            return str(e)

    @property
    def alive(self) -> bool:
        return self.send_p is not None and self.send_p.poll() is None and self.recv_p.poll() is None

    def stop(self) -> Dict[str, Any]:
        import numpy as np
        from railover.testbed.netns import poll_until
        self.stop_file.touch()
        for p in (self.send_p, self.recv_p):
            if p is None:
                continue
            if p is self.recv_p:
                # the sender may be stuck behind a dead subflow: the receiver ends on SIGTERM
                try:
                    p.wait(timeout=5)
                except Exception:
                    p.terminate()
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()
                p.wait()
        if self.send_p is not None and self.send_p.poll() is None:
            self.send_p.kill()
        if not self.out.exists():
            raise MptcpError("the MPTCP receiver wrote no result: " + (self.wd / "recv.out").read_text()[-2000:])
        z = np.load(self.out)
        t0 = int(z["t0_us"])
        b = z["buckets"]
        return {"t0_us": t0, "buckets": [(t0 + i * 1000, int(v)) for i, v in enumerate(b)], "bytes": int(z["bytes"]),
                "wrong": int(z["wrong"]), "error": str(z["error"]), "connected": bool(z["connected"]),
                "send_exit": self.send_p.returncode if self.send_p else None,
                "send_out": (self.wd / "send.out").read_text()[-2000:] if (self.wd / "send.out").exists() else ""}


if __name__ == "__main__":
    sys.exit(main())
