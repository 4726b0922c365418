"""Helpers for the RDMA bed tests: crash retry and the verbs probe's event watcher."""
from __future__ import annotations

from typing import Callable, List, TypeVar

from railover.testbed.netns import poll_until
from railover.testbed.rdma import bed as rbed

T = TypeVar("T")


def crash_retry(bed: rbed.RdmaBed, body: Callable[[], T]) -> T:
    """Run ``body()``; after a GuestCrash (kernel panic, hang: rxe on 6.12 has crashed once
    in ~26 boots) report it, reboot the guests and run ``body()`` once more."""
    try:
        return body()
    except rbed.GuestCrash as e:
        print(f"[rdma bed] guest crash, retrying once after a reboot: {e}")
        bed.restart()
        return body()


def start_watch(bed: rbed.RdmaBed, host: str, *devs: str) -> rbed.GuestProc:
    """Start ``railover-verbs-probe events`` in ``host`` and wait until it is subscribed."""
    p = bed.spawn(host, ["railover-verbs-probe", "events", *devs])
    poll_until(lambda: any(e.get("ev") == "ready" for e in p.json_lines()) or p.poll() is not None, 180, 0.2,
               f"event watcher in {host} to subscribe")
    assert p.returncode is None, f"event watcher in {host} exited: {p.stderr()}"
    return p


def events(p: rbed.GuestProc, ev: str, **match) -> List[dict]:
    return [e for e in p.json_lines() if e.get("ev") == ev and all(e.get(k) == v for k, v in match.items())]


def wait_listening(bed: rbed.RdmaBed, host: str, port: int, server: rbed.GuestProc, timeout_s: float = 180) -> None:
    """Wait until a TCP listener on ``port`` exists in ``host`` (perftest and ibv_*_pingpong
    clients give up at once when their server is not listening yet)."""
    def listening():
        if server.poll() is not None:
            raise AssertionError(f"server exited early ({server.returncode}): {server.stdout()} {server.stderr()}")
        rc, out, _ = bed.run(host, ["ss", "-Hltn", f"sport = :{port}"], timeout_s=60)
        return rc == 0 and out.strip() != ""
    poll_until(listening, timeout_s, 0.3, f"a listener on port {port} in {host}")


def gid_of(addr: str) -> str:
    """The RoCE v2 GID (as sysfs prints it) of IPv4 address ``addr``: its IPv4-mapped form."""
    a, b, c, d = (int(x) for x in addr.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"
