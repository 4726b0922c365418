"""Helpers for the RDMA bed tests: crash retry and the verbs probe's event watcher."""
from __future__ import annotations

import os
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


def wait_event(p: rbed.GuestProc, ev: str, timeout_s: float, what: str, *others: rbed.GuestProc,
               interval_s: float = 0.1) -> dict:
    """The first ``ev`` event of ``p``, polled every ``interval_s`` for up to ``timeout_s``.

    Unlike ``poll_until(lambda: events(p, ev), ...)``, which only reads ``p``'s output file:
    * a crashed guest (``p``'s, or that of one of ``others``: panic, oops, QEMU gone) raises
      :class:`GuestCrash` at once, so ``crash_retry`` reboots and runs the test again, instead of
      the test waiting out the bound and failing as "timed out waiting for <what>";
    * ``p`` ending without the event fails at once with its output (``others`` may end);
    * a timeout says what ``p`` and ``others`` printed and that the guests still run.
    """
    def got():
        e = events(p, ev)
        if e:
            return e
        for q in others:
            q.poll()  # checks q's guest (GuestCrash); q may have ended
        if p.poll() is not None:  # checks p's guest too
            e = events(p, ev)  # written just before the exit
            if e:
                return e
            raise AssertionError(f"{what}: {p!r} ended ({p.returncode}) without printing {ev!r}\n{_tail(p)}")
        return None

    try:
        return poll_until(got, timeout_s, interval_s, what)[0]
    except TimeoutError as e:
        raise TimeoutError(f"{e} (the guests still run)\n{_tail(p)}" + "".join(f"\n{_tail(q)}" for q in others)
                           + f"\n{_kernel_view(p)}") from None


#: What a guest's kernel says of a tool that printed nothing for a whole bound: each thread's
#: state, wait channel and kernel stack (a thread stuck in a verbs call shows its rxe frames),
#: then the kernel log's tail. The kernel's own hung-task report comes only after 120 s in D
#: state, i.e. after most of the tests' bounds.
_KERNEL_VIEW_SH = r"""
for p in $(pidof "$1"); do
  echo "pid $p: $(tr '\0' ' ' < /proc/$p/cmdline)"
  for t in /proc/$p/task/*; do
    echo "  task ${t##*/} $(grep '^State' $t/status | tr -s '\t ' ' ') wchan=$(cat $t/wchan 2>/dev/null)"
    sed 's/^/    /' $t/stack 2>/dev/null
  done
done
echo "--- dmesg (tail) ---"
dmesg | tail -n 40
"""


def _kernel_view(p: rbed.GuestProc) -> str:
    try:
        rc, out, err = p.bed.run(p.host, ["bash", "-c", _KERNEL_VIEW_SH, "kernel-view", os.path.basename(p.argv[0])],
                                 timeout_s=60)
        return f"--- guest {p.host}: {p.argv[0]} threads in the kernel (rc {rc}) ---\n{out[-6000:]}{err[-1000:]}"
    except Exception as e:  # a diagnostic: never hides the timeout it explains
        return f"--- could not read the guest kernel's view of {p!r}: {e!r}"


def _tail(p: rbed.GuestProc, n: int = 3000) -> str:
    return f"--- {p!r} stdout (tail) ---\n{p.stdout()[-n:]}\n--- stderr (tail) ---\n{p.stderr()[-n:]}"


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
