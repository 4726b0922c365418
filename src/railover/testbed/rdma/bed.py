"""RDMA test bed: H QEMU guests ("hosts"), each with a management NIC and R rail NICs carrying
Soft-RoCE (rxe) devices, wired guest to guest per rail.

Layout (2 hosts x 2 rails)::

    guest A (QEMU)                                   guest B (QEMU)
      eth0 10.<base>.200.1  ==== unix stream ====  eth0 10.<base>.200.2    management
      eth1 10.<base>.0.1 rxe0 == unix stream ====  eth1 10.<base>.0.2 rxe0 rail 0
      eth2 10.<base>.1.1 rxe1 == unix stream ====  eth2 10.<base>.1.2 rxe1 rail 1

* Every NIC is a virtio-net device whose wire is a QEMU netdev pair on the host: by default
  (``wire="stream"``) a unix stream socket per NIC, guest A's QEMU listening and guest B's
  connected. That wire is lossless, as RoCE is run with PFC and InfiniBand with credit flow
  control: a busy receiving QEMU holds its sender back instead of dropping frames. ``wire="udp"``
  (``-netdev socket,udp=...`` on 127.0.0.1) is the older lossy wire: frames are dropped when the
  receiving QEMU's socket buffer (the host's ``net.core.rmem_default``, 208 KiB) overflows, and
  every RC packet lost at the tail of a burst costs an ACK timeout (NCCL_IB_TIMEOUT 20: 4.3 s).
  Nothing appears on the host's own network either way (no tap, no bridge). A wire joins exactly
  two ends, so a bed has exactly 2 hosts.
* rxe device ``rxe<r>`` sits on ``eth<r+1>``; GID index 1 is its RoCE v2 (IPv4-mapped) GID.
* Control: a virtio-serial port per guest (see :mod:`railover.testbed.rdma.guest`); command
  output lands in files of a 9p share the host reads directly. The project's plugin,
  ``railover-perf`` and ``railover-verbs-probe`` of the current build are handed in read-only
  over a second 9p share (``/mnt/build/bin``, ``/mnt/build/lib`` in the guest), so rebuilding
  the project needs no new image.
* Robustness: every wait is bounded; a guest whose QEMU exits, whose console shows a kernel
  panic/oops, or that stops answering on its control port raises :class:`GuestCrash`; booting
  is retried once after a crash. QEMU processes get PR_SET_PDEATHSIG=SIGKILL (they die with
  this process); SIGINT/SIGTERM and interpreter exit tear the bed down; ``railover testbed down
  --rdma`` removes leftovers of a killed owner from the state file.

Times reported by the bed (``applied_us`` of faults, :meth:`RdmaBed.guest_now_us`) are on the
guest's CLOCK_MONOTONIC in microseconds, the clock the plugin's journal uses in that guest.

Thread-safety: :meth:`RdmaBed.run`, :meth:`RdmaBed.spawn`, :meth:`RdmaBed.fetch` and
:meth:`RdmaBed.guest_now_us` may be called from several threads; ``up``/``down`` from one.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from railover import _paths
from railover.testbed import netns as _nb
from railover.testbed.netns import TestBedError, host_label, poll_until
from railover.testbed.rdma import image as _img
from railover.testbed.rdma.guest import CTL_PORT_NAME, NOW_SNIPPET

__all__ = ["RdmaBedError", "GuestCrash", "RdmaNic", "RdmaHost", "GuestProc", "RdmaBed",
           "RdmaBedInfo", "list_rdma_beds", "cleanup_rdma_leftovers", "choose_accel",
           "VERBS_PROBE_FILE", "VERBS_XFER_FILE", "GUEST_TOOLS", "DEFAULT_QDISCS", "reset_script",
           "reset_wait_script", "parse_reset_output", "WIRES", "unix_socket_states"]

VERBS_PROBE_FILE = "railover-verbs-probe"
#: the verbs transport's test tool (native/tools/verbs/verbs_xfer.cc), staged like the probe
VERBS_XFER_FILE = "railover-verbs-xfer"
#: Console lines that mean the guest kernel died or is wedged.
CRASH_RE = re.compile(r"Kernel panic|BUG: |Oops: |general protection fault|watchdog: BUG: soft lockup|"
                      r"INFO: task .* blocked for more than|RO-GUEST-FATAL")
MGMT_OCTET = 200  # management subnet 10.<base>.200.0/24
#: the NIC wires a bed can have (RdmaBed's ``wire``): lossless unix streams, lossy UDP
WIRES = ("stream", "udp")


class RdmaBedError(TestBedError):
    """Building, using or removing an RDMA test bed failed; the message says what and why."""


class GuestCrash(RdmaBedError):
    """A guest died (QEMU exited, kernel panic/oops on its console) or stopped answering on
    its control port. ``host`` is its label, ``reason`` a one-line cause, ``console_tail`` the
    last console lines."""

    def __init__(self, host: str, reason: str, console_tail: str = ""):
        super().__init__(f"guest {host}: {reason}" + (f"\n--- console tail ---\n{console_tail}" if console_tail else ""))
        self.host, self.reason, self.console_tail = host, reason, console_tail


@dataclass(frozen=True)
class RdmaNic:
    """One rail NIC of a guest. ``name`` logical name (``a0``: host A, rail 0, as in the
    namespace bed); ``host`` label; ``rail``; ``ifname`` in the guest (``eth1``...);
    ``rdma_dev`` (``rxe0``...); ``addr``/``prefixlen`` as configured at boot; ``netdev`` the
    QEMU device id used by HMP ``set_link``; ``gid_index`` of its RoCE v2 GID (1)."""

    name: str
    host: str
    index: int
    rail: int
    ifname: str
    rdma_dev: str
    addr: str
    prefixlen: int
    netdev: str
    gid_index: int = 1

    @property
    def cidr(self) -> str:
        return f"{self.addr}/{self.prefixlen}"


@dataclass
class RdmaHost:
    """One guest: ``name`` (``A``), ``index``, ``mgmt_addr`` (eth0), ``nics`` (rails),
    ``gids`` (rdma device -> GID string reported at boot), ``kernel`` (``uname -r``),
    ``boot_s`` (QEMU start to READY, host wall-clock seconds), ``pid`` of its QEMU."""

    name: str
    index: int
    mgmt_addr: str
    nics: List[RdmaNic]
    gids: Dict[str, str] = field(default_factory=dict)
    kernel: str = ""
    boot_s: float = 0.0
    pid: Optional[int] = None


class GuestProc:
    """A command started in a guest by :meth:`RdmaBed.spawn`. Its stdout/stderr are files on
    the host (``stdout_path``/``stderr_path``), readable while it runs."""

    def __init__(self, bed: "RdmaBed", host: str, cid: str, argv: Sequence[str]):
        self.bed, self.host, self.id, self.argv = bed, host, cid, list(argv)
        io = bed._io_dir(host)
        self.stdout_path = io / "out" / f"{cid}.out"
        self.stderr_path = io / "out" / f"{cid}.err"

    @property
    def returncode(self) -> Optional[int]:
        """Exit status (128+N when killed by signal N), or None while it runs."""
        return self.bed._ctl[self.host].done.get(self.id)

    def poll(self) -> Optional[int]:
        self.bed._check_guest(self.host)
        return self.returncode

    def wait(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` s for the exit status. Raises TimeoutError (the command
        keeps running; kill it with :meth:`kill`) or :class:`GuestCrash`."""
        return self.bed._wait_done(self.host, self.id, timeout_s, " ".join(self.argv[:3]))

    def kill(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to the command's process group in the guest (no-op once it ended)."""
        if self.returncode is None:
            self.bed._ctl[self.host].send(f"KILL {self.id} {int(sig)}")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def json_lines(self) -> List[dict]:
        """stdout parsed as JSON lines (lines that are not JSON objects are skipped)."""
        out = []
        for line in self.stdout().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def __repr__(self) -> str:
        return f"<GuestProc {self.host}:{self.id} {' '.join(self.argv[:4])} rc={self.returncode}>"


class _Ctl:
    """Host end of one guest's control port: a reader thread filing replies."""

    def __init__(self, path: Path):
        self.path = path
        self.sock: Optional[socket.socket] = None
        self.cv = threading.Condition()
        self.ready: Optional[List[str]] = None
        self.done: Dict[str, int] = {}
        self.pids: Dict[str, int] = {}
        self.started: Dict[str, List[str]] = {}  # command id -> argv, for every RUN sent
        self.now: Dict[str, int] = {}
        self.errors: List[str] = []
        self.closed = False
        self._wlock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def connect(self, timeout_s: float) -> None:
        def attempt():
            if not self.path.exists():
                return None
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(self.path))
            except OSError:
                s.close()
                return None
            return s
        self.sock = poll_until(attempt, timeout_s, 0.05, f"QEMU control socket {self.path}")
        self._thread = threading.Thread(target=self._reader, daemon=True, name=f"rdma-ctl-{self.path.parent.name}")
        self._thread.start()

    def _reader(self) -> None:
        buf = b""
        assert self.sock is not None
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                with self.cv:
                    self.closed = True
                    self.cv.notify_all()
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._file(line.decode(errors="replace").strip())

    def _file(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        with self.cv:
            if parts[0] == "READY":
                self.ready = parts[1:]
            elif parts[0] == "PID" and len(parts) == 3:
                self.pids[parts[1]] = int(parts[2])
            elif parts[0] == "DONE" and len(parts) == 3:
                self.done[parts[1]] = int(parts[2])
            elif parts[0] == "NOW" and len(parts) == 3:
                self.now[parts[1]] = int(parts[2])
            else:
                self.errors.append(line)
            self.cv.notify_all()

    def send(self, line: str) -> None:
        if self.sock is None:
            raise RdmaBedError("control port not connected")
        with self._wlock:
            self.sock.sendall(line.encode() + b"\n")

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        if self._thread is not None:
            self._thread.join(5)


#: Root qdiscs a guest kernel sets up by itself; any other root qdisc on a NIC (tbf of a rate
#: fault, netem...) was left by a fault and :meth:`RdmaBed.reset` removes it.
DEFAULT_QDISCS: Tuple[str, ...] = ("pfifo_fast", "fq_codel", "noqueue", "mq", "pfifo", "fq")
#: Programs tests start in the guests; :meth:`RdmaBed.reset` kills any still running there
#: (matched on the kernel's comm: the first 15 characters of the name).
GUEST_TOOLS: Tuple[str, ...] = ("railover-perf", VERBS_PROBE_FILE, VERBS_XFER_FILE, "railover-rdma-report",
                                "ib_write_bw", "ib_read_bw", "ib_send_bw", "ibv_rc_pingpong", "ibv_ud_pingpong")


def _host_nics(h: "RdmaHost") -> List[Tuple[str, str, str]]:
    """``(ifname, cidr, rdma device or "")`` of every NIC of ``h``, management (eth0) first."""
    return [("eth0", f"{h.mgmt_addr}/24", "")] + [(n.ifname, n.cidr, n.rdma_dev) for n in h.nics]


def reset_script(h: "RdmaHost") -> str:
    """The in-guest half of :meth:`RdmaBed.reset` for host ``h`` (bash, run once per reset):
    kills stray :data:`GUEST_TOOLS` processes, sets every NIC administratively up with exactly
    its boot address, removes non-default root qdiscs, ingress/clsact qdiscs, every nftables
    table and leftover ``/tmp/rperf-*`` run directories. Prints one ``FIXED <what>`` line per
    repair, then ``NIC <ifname> <carrier> <port state> <gid1>`` per NIC, read *before* any
    repair (carrier ``1``/``0``, ``x`` when unreadable as on an admin-down NIC; port state and
    GID ``-`` for the management NIC). A rail whose boot GID (``h.gids``) is in its port's
    table but not at index 1 gets its address re-added, which puts it back there: rxe gives a
    new address's GID the lowest free index, and a job whose QPs held index 1 while the address
    changed leaves it at another one (the reset's wait expects it at index 1)."""
    tools = " ".join(sorted({t[:15] for t in GUEST_TOOLS}))
    defaults = "|".join(DEFAULT_QDISCS)
    out = [
        "shopt -s nullglob",
        "for p in /proc/[0-9]*; do",
        "  read -r c <\"$p/comm\" 2>/dev/null || continue",
        f"  case \" {tools} \" in *\" $c \"*) kill -9 \"${{p#/proc/}}\" 2>/dev/null && "
        "echo \"FIXED killed a stray $c (pid ${p#/proc/})\";; esac",
        "done",
        "ro_nic() {  # ifname cidr rdma-device boot-gid",
        "  local i=$1 want=$2 d=$3 wantg=$4 c=x fl have= kind line ps=- g=- nic_line out f x at=",
        "  read -r c <\"/sys/class/net/$i/carrier\" 2>/dev/null || c=x",
        "  if [[ -n $d ]]; then read -r _ ps <\"/sys/class/infiniband/$d/ports/1/state\"; "
        "read -r g <\"/sys/class/infiniband/$d/ports/1/gids/1\"; fi",
        "  nic_line=\"NIC $i $c $ps $g\"",
        "  read -r fl <\"/sys/class/net/$i/flags\"",
        "  if (( (fl & 1) == 0 )); then ip link set dev \"$i\" up && echo \"FIXED $i was administratively down: set up\"; fi",
        # (no process substitution: the guest has no /dev/fd)
        "  out=$(ip -4 -o addr show dev \"$i\")",
        "  while read -r _ _ _ a _; do [[ -n $a ]] && have+=\"${have:+ }$a\"; done <<<\"$out\"",
        "  if [[ $have != \"$want\" ]]; then ip addr flush dev \"$i\"; ip addr add \"$want\" dev \"$i\" && "
        "echo \"FIXED $i had address(es) '${have:-none}': set $want\"; fi",
        # the boot GID somewhere but not at index 1 (absent: the address is being re-added, wait)
        "  if [[ -n $d && -n $wantg ]]; then",
        "    read -r x <\"/sys/class/infiniband/$d/ports/1/gids/1\" 2>/dev/null; [[ $x == \"$wantg\" ]] && at=1",
        "    [[ -n $at ]] || for f in /sys/class/infiniband/$d/ports/1/gids/*; do read -r x <\"$f\" 2>/dev/null && [[ $x == \"$wantg\" ]] && at=${f##*/}; done",
        "    if [[ -n $at && $at != 1 ]]; then ip addr del \"$want\" dev \"$i\"; ip addr add \"$want\" dev \"$i\" && "
        "echo \"FIXED $i had its GID at index $at, not 1: address re-added\"; fi",
        "  fi",
        "  while read -r line; do",
        "    [[ -n $line ]] || continue",
        "    set -- $line; kind=$2",
        "    case \"$kind\" in",
        "      ingress|clsact) tc qdisc del dev \"$i\" \"$kind\" && echo \"FIXED $i had an $kind qdisc: removed\";;",
        f"      {defaults}) ;;",
        "      *) [[ \" $line \" == *\" root \"* ]] && tc qdisc del dev \"$i\" root && "
        "echo \"FIXED $i had a $kind root qdisc: removed\";;",
        "    esac",
        "  done <<<\"$(tc qdisc show dev \"$i\")\"",
        "  echo \"$nic_line\"",
        "}",
        "t=$(nft list tables) || { echo 'nft list tables failed' >&2; exit 3; }",
        "if [[ -n $t ]]; then nft flush ruleset && echo \"FIXED removed the nftables tables: ${t//$'\\n'/, }\"; fi",
    ]
    out += [f"ro_nic {i} {cidr} {d} {h.gids.get(d, '') if d else ''}".rstrip() for i, cidr, d in _host_nics(h)]
    out += ["left=(/tmp/rperf-*)",
            "if (( ${#left[@]} )); then rm -rf \"${left[@]}\" && echo \"FIXED removed ${left[*]}\"; fi"]
    return "\n".join(out) + "\n"


def reset_wait_script(h: "RdmaHost", timeout_s: float) -> str:
    """Bash that waits (bounded by ``timeout_s`` of guest uptime, polling every 100 ms) until
    every NIC of ``h`` has carrier and every rail's rxe port is ACTIVE with the GID it had at
    boot (``h.gids``); exits 1 printing each NIC's state when the time is up."""
    checks = []
    for i, _, d in _host_nics(h):
        checks.append(f"read -r c </sys/class/net/{i}/carrier 2>/dev/null || c=x; [[ $c == 1 ]] || bad+=\" {i}:carrier=$c\"")
        if d:
            checks.append(f"read -r _ ps </sys/class/infiniband/{d}/ports/1/state; read -r g </sys/class/infiniband/{d}/ports/1/gids/1; "
                          f"[[ $ps == ACTIVE ]] || bad+=\" {d}:$ps\"")
            want = h.gids.get(d)
            if want:
                checks.append(f"[[ $g == {want} ]] || bad+=\" {d}:gid=$g\"")
    body = "\n    ".join(checks)
    return (f"exec 9<>/run/ro/pause\nread -r u _ </proc/uptime; deadline=$(( ${{u%.*}} + {int(timeout_s) + 1} ))\n"
            f"while :; do\n    bad=\n    {body}\n    [[ -z $bad ]] && exit 0\n"
            "    read -r u _ </proc/uptime; (( ${u%.*} < deadline )) || { echo \"not back:$bad\"; exit 1; }\n"
            "    read -r -t 0.1 -u 9 || true\ndone\n")


def parse_reset_output(out: str) -> Tuple[List[str], Dict[str, Tuple[str, str, str]]]:
    """``(repairs, nics)`` from :func:`reset_script`'s output: the ``FIXED`` lines' texts, and
    ifname -> ``(carrier, port state, gid1)`` as read before the repairs."""
    fixed, nics = [], {}
    for line in out.splitlines():
        if line.startswith("FIXED"):
            fixed.append(line.split(" ", 1)[1] if " " in line else line)
        elif line.startswith("NIC "):
            parts = line.split()
            if len(parts) == 5:
                nics[parts[1]] = (parts[2], parts[3], parts[4])
    return fixed, nics


def _free_udp_ports(n: int) -> List[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def unix_socket_states(paths, text: Optional[str] = None) -> Dict[str, set]:
    """``{path: {"listening", "connected"}}`` for the unix sockets bound to ``paths``, from
    /proc/net/unix (``text`` instead, for tests): a socket with the accept-connection flag
    (0x10000) listens; one in state 03 (SS_CONNECTED) bearing the path is a connection the
    listener accepted."""
    want = set(paths)
    out: Dict[str, set] = {}
    if text is None:
        try:
            text = Path("/proc/net/unix").read_text()
        except OSError:
            return out
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8 or f[7] not in want:
            continue
        try:
            flags, st = int(f[3], 16), int(f[5], 16)
        except ValueError:
            continue
        if flags & 0x10000:
            out.setdefault(f[7], set()).add("listening")
        elif st == 3:
            out.setdefault(f[7], set()).add("connected")
    return out


def choose_accel(requested: str = "auto") -> Tuple[str, str]:
    """``(accel, reason)``: ``"kvm"`` when requested or when ``auto`` finds a usable KVM
    (/dev/kvm read-write and vmx/svm in /proc/cpuinfo), else ``"tcg"``. Raises
    :class:`RdmaBedError` for ``kvm`` requested but unusable, or an unknown value.
    ``RAILOVER_RDMA_ACCEL`` overrides ``auto``."""
    what = "accel"
    if requested == "auto" and os.environ.get("RAILOVER_RDMA_ACCEL", "").strip():
        requested, what = os.environ["RAILOVER_RDMA_ACCEL"], "RAILOVER_RDMA_ACCEL"
    if requested not in ("auto", "kvm", "tcg"):
        raise RdmaBedError(f"{what} must be auto, kvm or tcg, got {requested!r}")
    if requested == "tcg":
        return "tcg", "requested"
    why = None
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        why = "/dev/kvm missing or not accessible"
    else:
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            flags = ""
        if not re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.M):
            why = "no vmx/svm CPU flag (nested virtualisation off, or a paravirtual hypervisor such as PVM)"
    if why is None:
        return "kvm", "/dev/kvm usable and the CPU has vmx/svm"
    if requested == "kvm":
        raise RdmaBedError(f"KVM requested but unusable: {why}")
    return "tcg", f"no usable KVM: {why}"


def _pdeathsig() -> None:  # runs in the QEMU child before exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _state_file(prefix: str) -> Path:
    return _nb._writable_state_dir() / f"rdma-{prefix}.json"


@dataclass
class RdmaBedInfo:
    """A bed found by :func:`list_rdma_beds`: ``prefix``, owner ``pid``/``alive``, QEMU
    ``qemu_pids`` still running, ``run_dir`` (exists or not), ``state_file``."""

    prefix: str
    pid: Optional[int]
    alive: bool
    qemu_pids: List[int]
    run_dir: Optional[str]
    state_file: Path
    kernel: str = ""
    hosts: int = 0
    rails: int = 0


def _qemu_alive(pid: int, start: Optional[int]) -> bool:
    return start is not None and _nb._proc_starttime(pid) == start


def list_rdma_beds() -> List[RdmaBedInfo]:
    """RDMA beds with a state file (live ones and leftovers of killed owners)."""
    out = []
    for d in _nb.state_dirs():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("rdma-ro*.json")):
            st = _nb.read_bed_state(f, {"prefix": str, "pid": int, "pid_start": int, "qemu": list, "run_dir": str,
                                        "kernel": str, "hosts": int, "rails": int})
            if st is None or not all(isinstance(q, dict) and isinstance(q.get("pid"), int)
                                     and not isinstance(q.get("pid"), bool) for q in st.get("qemu") or []):
                continue   # corrupt: its QEMU pids are not to be trusted (cleanup kills them)
            pid = st.get("pid")
            alive = bool(pid) and _nb._proc_starttime(pid) == st.get("pid_start")
            qp = [q["pid"] for q in st.get("qemu") or [] if _qemu_alive(q["pid"], q.get("start"))]
            out.append(RdmaBedInfo(st.get("prefix", f.stem[5:]), pid, alive, qp, st.get("run_dir"), f,
                                   st.get("kernel", ""), st.get("hosts", 0), st.get("rails", 0)))
    return out


def cleanup_rdma_leftovers(prefix: Optional[str] = None, include_live: bool = False) -> List[str]:
    """Kill the QEMU processes and remove the run directories of beds whose owner is gone
    (or of ``prefix`` whatever its state, or of all with ``include_live``); returns what was
    removed, as text lines."""
    removed = []
    for info in list_rdma_beds():
        if prefix is not None and info.prefix != prefix:
            continue
        if prefix is None and info.alive and not include_live:
            continue
        for p in info.qemu_pids:
            try:
                os.kill(p, signal.SIGKILL)
                removed.append(f"killed QEMU pid {p} of {info.prefix}")
            except ProcessLookupError:
                pass
        if info.run_dir and Path(info.run_dir).is_dir():
            shutil.rmtree(info.run_dir, ignore_errors=True)
            removed.append(f"removed {info.run_dir}")
        info.state_file.unlink(missing_ok=True)
        removed.append(f"removed state of {info.prefix}")
    return removed


class RdmaBed:
    """Two QEMU guests with ``rails`` rxe NICs each. Use as a context manager::

        with RdmaBed(rails=2) as bed:
            rc, out, err = bed.run("A", ["ibv_devinfo", "-d", "rxe0"])
            p = bed.spawn("B", ["railover-perf", ...], env={"RAILOVER_IFNAMES": "=eth1,eth2"})
            p.wait(120); bed.fetch("B", "/tmp/journal.jsonl")

    Arguments: ``hosts`` (2; a QEMU socket wire joins exactly two ends), ``rails`` (1..8
    rail NICs per guest, default 2), ``kernel`` series (``"6.1"`` default, ``"6.12"``),
    ``base`` (second address octet), ``mem_mib`` per guest (1024), ``smp`` vCPUs per guest (default
    1 under TCG, 2 under KVM),
    ``accel`` (``auto``/``kvm``/``tcg``), ``sysctls`` applied in every guest at boot (e.g.
    ``{"net.ipv4.conf.eth1.arp_evict_nocarrier": 0}``), ``boot_timeout_s`` (per boot
    attempt), ``log`` (progress lines), ``prefix`` (``ro`` + 4 characters), ``wire``
    (``"stream"``: lossless, default; ``"udp"``: lossy under load, see the module docstring).
    """

    __test__ = False

    def __init__(self, hosts: int = 2, rails: int = 2, kernel: str = "6.1", *, base: int = 0,
                 mem_mib: int = 1024, smp: Optional[int] = None, accel: str = "auto",
                 sysctls: Optional[Mapping[str, Union[int, str]]] = None, boot_timeout_s: float = 300.0,
                 log: Callable[[str], None] = print, prefix: Optional[str] = None,
                 extra_cmdline: str = "", logs_dir: Union[str, Path, None] = None, wire: str = "stream"):
        if wire not in WIRES:
            raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
        if hosts != 2:
            raise ValueError(f"an RDMA bed has exactly 2 hosts (QEMU socket wires are point to point), got {hosts}")
        if not 1 <= rails <= 8:
            raise ValueError(f"rails must be 1..8, got {rails}")
        if kernel not in _img.KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(_img.KERNELS)}, got {kernel!r}")
        if not 0 <= base <= 255:
            raise ValueError(f"base must be 0..255, got {base}")
        if mem_mib < 256 or (smp is not None and smp < 1):
            raise ValueError("mem_mib must be >= 256 and smp >= 1")
        if prefix is not None and not _nb.PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must be 'ro' + 4 lowercase letters/digits, got {prefix!r}")
        for k, v in (sysctls or {}).items():
            if not re.fullmatch(r"[a-z0-9_.]+", k) or not re.fullmatch(r"[A-Za-z0-9_.-]+", str(v)):
                raise ValueError(f"bad sysctl {k}={v}")
        self.nhosts, self.rails, self.kernel_series, self.base = hosts, rails, kernel, base
        self.wire = wire
        self.mem_mib, self.smp, self.accel_req = mem_mib, smp, accel
        self.sysctls = dict(sysctls or {})
        self.boot_timeout_s, self.log, self.extra_cmdline = boot_timeout_s, log, extra_cmdline
        env_logs = os.environ.get("RAILOVER_RDMA_LOGS")
        self.logs_dir = Path(logs_dir) if logs_dir else (Path(env_logs) if env_logs else None)
        self.prefix = prefix or "ro" + "".join(secrets.choice(_nb.PREFIX_CHARS) for _ in range(4))
        self.accel, self.accel_reason = "", ""
        self.image: Optional[_img.GuestImage] = None
        self.hosts: List[RdmaHost] = []
        for i in range(hosts):
            lab = host_label(i, hosts)
            nics = [RdmaNic(f"{lab.lower()}{r}", lab, r, r, f"eth{r + 1}", f"rxe{r}", f"10.{base}.{r}.{i + 1}", 24,
                            f"nic{r + 1}") for r in range(rails)]
            self.hosts.append(RdmaHost(lab, i, f"10.{base}.{MGMT_OCTET}.{i + 1}", nics))
        self.run_dir: Optional[Path] = None
        self.boot_attempts = 0
        self.boot_s = 0.0
        self._qemu: Dict[str, subprocess.Popen] = {}
        self._ctl: Dict[str, _Ctl] = {}
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._is_up = False
        self._owner_pid = os.getpid()
        self.detached = False

    # ---- lookup
    def host(self, key: Union[str, int, RdmaHost]) -> RdmaHost:
        """Host by label (``"A"``), index, or itself. KeyError for unknown keys."""
        if isinstance(key, RdmaHost):
            return key
        for h in self.hosts:
            if key == h.name or key == h.index:
                return h
        raise KeyError(f"no host {key!r} in RDMA bed {self.prefix}")

    def nic(self, key: Union[str, RdmaNic]) -> RdmaNic:
        """NIC by logical name (``"a0"``, ``"b1"``). KeyError for unknown names."""
        if isinstance(key, RdmaNic):
            return key
        for h in self.hosts:
            for n in h.nics:
                if n.name == key:
                    return n
        raise KeyError(f"no NIC {key!r} in RDMA bed {self.prefix}")

    def peer(self, nic: Union[str, RdmaNic]) -> RdmaNic:
        """The NIC on the same rail of the other host."""
        n = self.nic(nic)
        other = next(h for h in self.hosts if h.name != n.host)
        return other.nics[n.rail]

    @property
    def is_up(self) -> bool:
        return self._is_up

    def __enter__(self) -> "RdmaBed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"<RdmaBed {self.prefix} {self.nhosts}x{self.rails} kernel {self.kernel_series} {'up' if self._is_up else 'down'}>"

    # ---- bring-up
    def _io_dir(self, host: str) -> Path:
        assert self.run_dir is not None
        return self.run_dir / host / "io"

    def _stage_build(self) -> Path:
        """The read-only share: current build's plugin, railover-perf and verbs probe."""
        assert self.run_dir is not None
        b = self.run_dir / "build"
        (b / "bin").mkdir(parents=True)
        (b / "lib").mkdir()
        found = []
        for fn, sub in ((_paths.PERF_FILE, "bin"), (VERBS_PROBE_FILE, "bin"), (VERBS_XFER_FILE, "bin"),
                        (_paths.PLUGIN_FILE, "lib")):
            try:
                src = _paths._find(fn)
            except FileNotFoundError:
                continue  # the bed still boots; commands needing it fail with "not found"
            dst = b / sub / fn
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
            found.append(fn)
        self.staged = found
        return b

    def _wire_sock(self, n: int) -> Path:
        """The unix socket of NIC ``n``'s stream wire (guest A's QEMU listens on it)."""
        assert self.run_dir is not None
        return self.run_dir / "wire" / f"nic{n}.sock"

    def _qemu_argv(self, h: RdmaHost, ports: Optional[Dict[Tuple[int, int], int]], build: Path) -> List[str]:
        """QEMU's command line for guest ``h``. ``ports``: the UDP ports of every (host index,
        NIC) for ``wire="udp"``; unused (None) for the stream wire."""
        assert self.run_dir is not None and self.image is not None
        d = self.run_dir / h.name
        argv = ["qemu-system-x86_64", "-name", f"railover-{self.prefix}-{h.name}", "-nodefaults", "-no-user-config",
                "-display", "none", "-no-reboot", "-m", str(self.mem_mib), "-smp", str(self.smp)]
        argv += ["-accel", "kvm", "-cpu", "host"] if self.accel == "kvm" else ["-accel", "tcg"]
        addrs = [f"{h.mgmt_addr}/24"] + [n.cidr for n in h.nics]
        sysctl = ",".join(f"{k}={v}" for k, v in self.sysctls.items())
        # no_timer_check: a starved TCG vCPU fails the IO-APIC timer check and panics at boot
        # ("IO-APIC + timer doesn't work!"), seen here on a host with ~20 runnable threads.
        cmdline = (f"console=ttyS0 panic=-1 quiet no_timer_check ro.host={h.name} ro.addrs={','.join(addrs)} "
                   f"ro.rails={self.rails}" + (f" ro.sysctl={sysctl}" if sysctl else "") +
                   (f" {self.extra_cmdline}" if self.extra_cmdline else ""))
        argv += ["-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd), "-append", cmdline]
        argv += ["-chardev", f"file,id=con0,path={d / 'console.log'}", "-serial", "chardev:con0"]
        argv += ["-chardev", f"socket,id=mon0,path={d / 'hmp.sock'},server=on,wait=off", "-mon", "chardev=mon0,mode=readline"]
        argv += ["-device", "virtio-serial-pci,id=vser0",
                 "-chardev", f"socket,id=ctl0,path={d / 'ctl.sock'},server=on,wait=off",
                 "-device", f"virtserialport,bus=vser0.0,chardev=ctl0,name={CTL_PORT_NAME}"]
        argv += ["-fsdev", f"local,id=fsbuild,path={build},security_model=none,readonly=on",
                 "-device", "virtio-9p-pci,fsdev=fsbuild,mount_tag=robuild",
                 "-fsdev", f"local,id=fsio,path={d / 'io'},security_model=none",
                 "-device", "virtio-9p-pci,fsdev=fsio,mount_tag=roio"]
        other = 1 - h.index
        for n in range(self.rails + 1):  # nic0 = management, nic<r+1> = rail r
            if self.wire == "udp":
                assert ports is not None
                mine, theirs = ports[(h.index, n)], ports[(other, n)]
                netdev = f"socket,id=nic{n},udp=127.0.0.1:{theirs},localaddr=127.0.0.1:{mine}"
            else:  # guest A's QEMU listens, guest B's connects (QEMU 7.2 does not reconnect)
                netdev = (f"stream,id=nic{n},server={'on' if h.index == 0 else 'off'},addr.type=unix,"
                          f"addr.path={self._wire_sock(n)}")
            argv += ["-netdev", netdev,
                     "-device", f"virtio-net-pci,netdev=nic{n},mac=52:54:{self.base:02x}:{MGMT_OCTET if n == 0 else n - 1:02x}:"
                                f"00:{h.index + 1:02x},addr=0x{0x10 + n:x}"]
        return argv

    def _console_tail(self, host: str, lines: int = 40) -> str:
        if self.run_dir is None:
            return ""
        try:
            text = (self.run_dir / host / "console.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def console(self, host: Union[str, RdmaHost]) -> str:
        """The guest's serial console so far (kernel messages, RO-GUEST lines)."""
        h = self.host(host)
        try:
            return (self.run_dir / h.name / "console.log").read_text(errors="replace")  # type: ignore[operator]
        except (OSError, TypeError):
            return ""

    def _check_guest(self, host: str) -> None:
        """Raise GuestCrash if the guest's QEMU exited or its console shows a crash."""
        q = self._qemu.get(host)
        text = self.console(host)
        m = CRASH_RE.search(text)
        if m:
            line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            raise GuestCrash(host, f"kernel crash on the console: {line.strip()}", self._console_tail(host))
        if q is not None and q.poll() is not None:
            raise GuestCrash(host, f"QEMU exited with status {q.returncode}", self._console_tail(host))

    def _boot_once(self) -> None:
        assert self.image is not None and self.run_dir is not None
        build = self.run_dir / "build"
        ports = None
        if self.wire == "udp":
            ports_l = _free_udp_ports(self.nhosts * (self.rails + 1))
            ports = {(i, n): ports_l[i * (self.rails + 1) + n] for i in range(self.nhosts) for n in range(self.rails + 1)}
        else:
            wd = self.run_dir / "wire"
            shutil.rmtree(wd, ignore_errors=True)
            wd.mkdir()
        t0 = time.monotonic()
        for h in self.hosts:
            if self.wire == "stream" and h.index == 1:
                self._wait_wires("listening", h)  # a stream client that finds no listener never retries
            d = self.run_dir / h.name
            shutil.rmtree(d, ignore_errors=True)
            (d / "io" / "out").mkdir(parents=True)
            (d / "io" / "cmd").mkdir()
            argv = self._qemu_argv(h, ports, build)
            (d / "qemu-argv.json").write_text(json.dumps(argv))
            err = open(d / "qemu.stderr", "wb")
            self._qemu[h.name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                                                  preexec_fn=_pdeathsig, close_fds=True)
            err.close()
            h.pid = self._qemu[h.name].pid
        self._write_state()
        if self.wire == "stream":
            self._wait_wires("connected", self.hosts[1])
        for h in self.hosts:
            ctl = _Ctl(self.run_dir / h.name / "ctl.sock")
            self._ctl[h.name] = ctl
            try:
                ctl.connect(60)
            except TimeoutError:
                self._check_guest(h.name)
                raise GuestCrash(h.name, "QEMU never opened its control socket", self._qemu_stderr(h.name))
        deadline = time.monotonic() + self.boot_timeout_s
        for h in self.hosts:
            ctl = self._ctl[h.name]
            with ctl.cv:
                while ctl.ready is None:
                    self._check_guest(h.name)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise GuestCrash(h.name, f"no READY on the control port within {self.boot_timeout_s:.0f} s "
                                                 "(guest hung while booting)", self._console_tail(h.name))
                    ctl.cv.wait(min(0.5, left))
                ready = ctl.ready
            h.boot_s = time.monotonic() - t0
            h.kernel = ready[1] if len(ready) > 1 else ""
            h.gids = dict(kv.split("=", 1) for kv in (ready[2].split(",") if len(ready) > 2 else []) if "=" in kv)
        self.boot_s = max(h.boot_s for h in self.hosts)

    def _wait_wires(self, state: str, client: RdmaHost, timeout_s: float = 60.0) -> None:
        """Wait until every NIC's stream wire is ``"listening"`` (guest A's QEMU has bound and
        listens on its socket) or ``"connected"`` (guest B's QEMU reached it), as
        /proc/net/unix tells. Raises :class:`GuestCrash` when a QEMU exits or the state is not
        reached within ``timeout_s`` s."""
        paths = {str(self._wire_sock(n)) for n in range(self.rails + 1)}
        seen: Dict[str, set] = {}

        def reached() -> bool:
            for h in self.hosts:
                if h.name in self._qemu:
                    self._check_guest(h.name)  # a QEMU that exited raises GuestCrash
            seen.update(unix_socket_states(paths))
            return all(state in seen.get(p, ()) for p in paths)
        try:
            poll_until(reached, timeout_s, 0.05, f"NIC wires {state}")
        except TimeoutError:
            missing = sorted(p for p in paths if state not in seen.get(p, ()))
            host = self.hosts[0] if state == "listening" else client
            raise GuestCrash(host.name, f"NIC wire(s) not {state} within {timeout_s:.0f} s: {', '.join(missing)}",
                             self._qemu_stderr(host.name))

    def _qemu_stderr(self, host: str) -> str:
        try:
            return (self.run_dir / host / "qemu.stderr").read_text(errors="replace")[-2000:]  # type: ignore[operator]
        except (OSError, TypeError):
            return ""

    def up(self) -> "RdmaBed":
        """Build/find the image, boot both guests (in parallel) and wait until every rxe port
        is ACTIVE. A crash or hang while booting is reported and the boot retried once (with
        TCG if KVM was tried). Raises :class:`RdmaBedError`/:class:`GuestCrash` (the bed is
        then fully torn down), or ``ImageError`` when the image cannot be built."""
        if self._is_up:
            raise RdmaBedError(f"RDMA bed {self.prefix} is already up")
        if shutil.which("qemu-system-x86_64") is None:
            raise RdmaBedError("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
        self.accel, self.accel_reason = choose_accel(self.accel_req)
        if self.smp is None:  # TCG: one vCPU thread per guest (2 guests = 2 host cores busy)
            self.smp = 2 if self.accel == "kvm" else 1
        self.image = _img.ensure_image(self.kernel_series, log=self.log)
        if self.image.built:
            self.log(f"first-time image build took {self.image.build_s:.1f} s")
        with _nb._ACTIVE_LOCK:
            _nb._ACTIVE.add(self)  # torn down at interpreter exit
        _nb._SIGNALS.acquire(self)
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"railover-rdma-{self.prefix}-"))
        self._is_up = True
        try:
            self._stage_build()
            self.log(f"booting {self.nhosts} guests: kernel {self.image.kernel_version}, {self.accel.upper()} "
                     f"({self.accel_reason}), {self.mem_mib} MiB and {self.smp} vCPU each")
            for attempt in (1, 2):
                self.boot_attempts = attempt
                try:
                    self._boot_once()
                    break
                except GuestCrash as e:
                    self._stop_guests()
                    if attempt == 2:
                        raise
                    if self.accel == "kvm":
                        self.accel, self.accel_reason = "tcg", f"a KVM boot failed ({e.reason})"
                    self.log(f"guest {e.host} crashed or hung while booting ({e.reason}); retrying once")
            self.log(f"guests up in {self.boot_s:.1f} s: " + ", ".join(
                f"{h.name} {h.boot_s:.1f} s" for h in self.hosts))
        except BaseException:
            self.down()
            raise
        return self

    def restart(self) -> None:
        """Stop both guests and boot them again (same image, addresses and prefix); for a
        retry after :class:`GuestCrash`."""
        if not self._is_up:
            raise RdmaBedError(f"RDMA bed {self.prefix} is not up")
        self._stop_guests()
        self.boot_attempts += 1
        try:
            self._boot_once()
        except BaseException:
            self.down()
            raise

    def reset(self, timeout_s: float = 300.0) -> List[str]:
        """Bring the booted bed back to the state tests start from, without a reboot (a few
        seconds under TCG), so tests can share one bed: commands still running in the guests
        are killed (their process groups, SIGKILL; stray :data:`GUEST_TOOLS` by name), every
        cable is plugged back (QEMU ``set_link on``), every NIC is administratively up with its
        boot address, non-default qdiscs and every nftables table are removed, leftover
        ``/tmp/rperf-*`` directories deleted, and it waits until every NIC has carrier and every
        rxe port is ACTIVE with its boot GID. A guest that crashed or stopped answering gets
        both guests rebooted (:meth:`restart`). Returns one line per repair (``[]`` when the
        bed was clean). Raises :class:`RdmaBedError` when a NIC is not back within
        ``timeout_s`` s (or the reboot fails)."""
        if not self._is_up:
            raise RdmaBedError(f"RDMA bed {self.prefix} is not up")
        try:
            for h in self.hosts:
                self._check_guest(h.name)
                self.guest_now_us(h.name, timeout_s=60)
        except (GuestCrash, TimeoutError) as e:
            self.restart()
            return [f"rebooted the guests: {str(e).splitlines()[0]}"]
        fixed: List[str] = []
        try:
            fixed += self._kill_running(timeout_s)
            outs = self._sh_each({h.name: reset_script(h) for h in self.hosts}, timeout_s)
            waits = {}
            for h in self.hosts:
                rc, out, err = outs[h.name]
                repairs, nics = parse_reset_output(out)
                fixed += [f"{h.name}: {x}" for x in repairs]
                if rc != 0 or len(nics) != len(h.nics) + 1:
                    raise RdmaBedError(f"reset of guest {h.name} failed (exit {rc}): {err.strip()[-500:]}")
                back = True
                for k, (ifname, _, dev) in enumerate(_host_nics(h)):
                    carrier, ps, gid = nics[ifname]
                    if carrier != "1":
                        self.hmp(h, f"set_link nic{k} on")
                        if carrier == "0":
                            fixed.append(f"{h.name}: the cable of {ifname} was pulled: plugged back in")
                        back = False
                    if dev and (ps != "ACTIVE" or gid != h.gids.get(dev, gid)):
                        back = False
                if not back:
                    waits[h.name] = reset_wait_script(h, timeout_s)
            if waits:
                for name, (rc, out, err) in self._sh_each(waits, timeout_s + 60).items():
                    if rc != 0:
                        raise RdmaBedError(f"reset of guest {name}: {out.strip()} {err.strip()[-300:]}".strip())
        except GuestCrash as e:
            self.restart()
            fixed.append(f"rebooted the guests: {str(e).splitlines()[0]}")
        return fixed

    def _kill_running(self, timeout_s: float) -> List[str]:
        """SIGKILL the process group of every command still running in the guests; waits for
        their ends. Returns one line per command killed."""
        lines, waits = [], []
        for h in self.hosts:
            ctl = self._ctl[h.name]
            with ctl.cv:
                running = [(cid, argv) for cid, argv in ctl.started.items() if cid not in ctl.done]
            for cid, argv in running:
                ctl.send(f"KILL {cid} {int(signal.SIGKILL)}")
                waits.append((h.name, cid, argv))
                lines.append(f"{h.name}: killed a command left running: {' '.join(argv[:4])}")
        for host, cid, argv in waits:
            try:
                self._wait_done(host, cid, min(timeout_s, 60.0), " ".join(argv[:3]))
            except TimeoutError:  # started after the KILL was read (its pid file was not there yet)
                self._ctl[host].send(f"KILL {cid} {int(signal.SIGKILL)}")
                self._wait_done(host, cid, timeout_s, " ".join(argv[:3]))
        return lines

    def _sh_each(self, scripts: Mapping[str, str], timeout_s: float) -> Dict[str, Tuple[int, str, str]]:
        """Run a bash script per host at the same time; ``{host: (rc, stdout, stderr)}``."""
        procs = {host: self.spawn(host, ["bash", "-c", NOW_SNIPPET + s]) for host, s in scripts.items()}
        res = {}
        for host, p in procs.items():
            try:
                rc = p.wait(timeout_s)
            except TimeoutError:
                p.kill(signal.SIGKILL)
                raise
            res[host] = (rc, p.stdout(), p.stderr())
        return res

    def _write_state(self) -> None:
        st = {"prefix": self.prefix, "pid": os.getpid(), "pid_start": _nb._proc_starttime(os.getpid()),
              "run_dir": str(self.run_dir), "kernel": self.image.kernel_version if self.image else "",
              "hosts": self.nhosts, "rails": self.rails,
              "qemu": [{"host": h, "pid": q.pid, "start": _nb._proc_starttime(q.pid)} for h, q in self._qemu.items()]}
        _nb._write_json(_state_file(self.prefix), st)

    def save_logs(self, tag: str = "") -> None:
        """Copy every guest's console and QEMU stderr into ``logs_dir`` (constructor argument
        or ``RAILOVER_RDMA_LOGS``) as ``<prefix>-<host><tag>.console.log``; no-op without one."""
        if self.logs_dir is None or self.run_dir is None:
            return
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for h in self.hosts:
            for fn, suffix in (("console.log", "console.log"), ("qemu.stderr", "qemu.stderr")):
                src = self.run_dir / h.name / fn
                if src.exists():
                    shutil.copyfile(src, self.logs_dir / f"{self.prefix}-{h.name}{tag}.{suffix}")

    def _stop_guests(self) -> None:
        # Keeping the consoles is a courtesy: a logs_dir that cannot be written (missing parent
        # in /proc, full disk, read-only) must not stop the teardown and leave the bed behind.
        try:
            self.save_logs(f"-boot{self.boot_attempts}")
        except OSError as e:
            self.log(f"guest consoles not kept in {self.logs_dir}: {e.strerror or e}")
        for ctl in self._ctl.values():
            ctl.close()
        self._ctl = {}
        for q in self._qemu.values():
            if q.poll() is None:
                q.terminate()
        for q in self._qemu.values():
            try:
                q.wait(15)
            except subprocess.TimeoutExpired:
                q.kill()
                q.wait(15)
        self._qemu = {}

    def down(self) -> None:
        """Stop the guests (SIGTERM, SIGKILL after 15 s), remove the run directory and state
        file. Idempotent; safe from signal handlers' unwinding."""
        if not self._is_up:
            return
        _nb._SIGNALS.busy += 1
        try:
            self._stop_guests()
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            _state_file(self.prefix).unlink(missing_ok=True)
            self._is_up = False
        finally:
            _nb._SIGNALS.busy -= 1
            with _nb._ACTIVE_LOCK:
                _nb._ACTIVE.discard(self)
            _nb._SIGNALS.release(self)

    teardown = down

    # ---- commands
    def _next_id(self, host: str) -> str:
        with self._seq_lock:
            self._seq += 1
            return f"c{self._seq:05d}"

    def spawn(self, host: Union[str, RdmaHost], argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              cwd: str = "/tmp", stdin_text: Optional[str] = None) -> GuestProc:
        """Start ``argv`` in the guest in its own session; returns at once. ``env`` entries
        are added to the guest's environment (PATH holds /mnt/build/bin, LD_LIBRARY_PATH
        /mnt/build/lib). stdout/stderr go to host-readable files (see :class:`GuestProc`)."""
        if not self._is_up:
            raise RdmaBedError(f"RDMA bed {self.prefix} is not up")
        h = self.host(host)
        self._check_guest(h.name)
        if not argv:
            raise ValueError("empty argv")
        cid = self._next_id(h.name)
        io = self._io_dir(h.name)
        lines = ["set -o pipefail", NOW_SNIPPET.strip(),
                 "export LD_LIBRARY_PATH=/mnt/build/lib:${LD_LIBRARY_PATH}"]
        for k, v in (env or {}).items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"bad environment variable name {k!r}")
            lines.append(f"export {k}={shlex.quote(str(v))}")
        stdin = "/dev/null"
        if stdin_text is not None:
            (io / "cmd" / f"{cid}.in").write_text(stdin_text)
            stdin = f"/mnt/io/cmd/{cid}.in"
        lines.append(f"cd {shlex.quote(cwd)} || exit 125")
        lines.append(f"exec {' '.join(shlex.quote(a) for a in argv)} <{stdin} "
                     f">/mnt/io/out/{cid}.out 2>/mnt/io/out/{cid}.err")
        (io / "cmd" / f"{cid}.sh").write_text("\n".join(lines) + "\n")
        ctl = self._ctl[h.name]
        with ctl.cv:
            ctl.started[cid] = list(argv)
        ctl.send(f"RUN {cid}")
        return GuestProc(self, h.name, cid, argv)

    def sh(self, host: Union[str, RdmaHost], script: str, timeout_s: float = 120.0,
           env: Optional[Mapping[str, str]] = None) -> Tuple[int, str, str]:
        """Run a bash ``script`` in the guest (``ro_now`` sets ``$RO_NOW`` to CLOCK_MONOTONIC
        ns); returns ``(rc, stdout, stderr)``."""
        return self.run(host, ["bash", "-c", NOW_SNIPPET + script], timeout_s=timeout_s, env=env)

    def run(self, host: Union[str, RdmaHost], argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
            timeout_s: float = 120.0, cwd: str = "/tmp", check: bool = False) -> Tuple[int, str, str]:
        """Run ``argv`` in the guest and wait: ``(returncode, stdout, stderr)``. Past
        ``timeout_s`` s the command is killed and TimeoutError raised; a dead guest raises
        :class:`GuestCrash`; ``check=True`` raises RdmaBedError on a non-zero status."""
        p = self.spawn(host, argv, env=env, cwd=cwd)
        try:
            rc = p.wait(timeout_s)
        except TimeoutError:
            p.kill(signal.SIGKILL)
            raise
        out, err = p.stdout(), p.stderr()
        if check and rc != 0:
            raise RdmaBedError(f"{self.host(host).name}: '{' '.join(argv)}' exited {rc}: {err.strip()[-600:]}")
        return rc, out, err

    def _wait_done(self, host: str, cid: str, timeout_s: float, what: str) -> int:
        ctl = self._ctl[host]
        deadline = time.monotonic() + timeout_s
        with ctl.cv:
            while cid not in ctl.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if ctl.closed:
                    break
                ctl.cv.wait(min(0.5, left))
                if cid not in ctl.done:
                    ctl.cv.release()
                    try:
                        self._check_guest(host)
                    finally:
                        ctl.cv.acquire()
            if cid in ctl.done:
                return ctl.done[cid]
        self._check_guest(host)
        if ctl.closed:
            raise GuestCrash(host, "control port closed", self._console_tail(host))
        # Distinguish a slow command from a hung guest: a live guest answers NOW at once.
        try:
            self.guest_now_us(host, timeout_s=30)
        except TimeoutError:
            raise GuestCrash(host, f"guest stopped answering on its control port (while '{what}' ran)",
                             self._console_tail(host)) from None
        raise TimeoutError(f"guest {host}: '{what}' still running after {timeout_s:.0f} s")

    def fetch(self, host: Union[str, RdmaHost], guest_path: str, dest: Union[str, Path, None] = None,
              timeout_s: float = 60.0) -> Path:
        """Copy a file (or directory) from the guest to ``dest`` on the host (default: the
        bed's run directory, removed at :meth:`down`, so copy what must survive). Returns
        the host path. Raises RdmaBedError when the guest cannot read it."""
        h = self.host(host)
        cid = self._next_id(h.name)
        rc, _, err = self.run(h, ["cp", "-a", guest_path, f"/mnt/io/out/fetch-{cid}"], timeout_s=timeout_s)
        if rc != 0:
            raise RdmaBedError(f"fetching {guest_path} from {h.name} failed: {err.strip()}")
        src = self._io_dir(h.name) / "out" / f"fetch-{cid}"
        if dest is None:
            return src
        dest = Path(dest)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        return dest

    def guest_now_us(self, host: Union[str, RdmaHost], timeout_s: float = 30.0) -> int:
        """The guest's CLOCK_MONOTONIC (µs), read by the guest's control loop without forking."""
        h = self.host(host)
        ctl = self._ctl[h.name]
        tag = self._next_id(h.name)
        ctl.send(f"NOW {tag}")
        deadline = time.monotonic() + timeout_s
        with ctl.cv:
            while tag not in ctl.now:
                left = deadline - time.monotonic()
                if left <= 0 or ctl.closed:
                    raise TimeoutError(f"guest {h.name} did not answer NOW within {timeout_s:.0f} s")
                ctl.cv.wait(min(0.5, left))
            return ctl.now.pop(tag) // 1000

    def clock_offset_us(self, host: Union[str, RdmaHost], samples: int = 5) -> Tuple[int, int]:
        """``(offset, error)`` in µs with guest CLOCK_MONOTONIC ~= host CLOCK_MONOTONIC +
        offset, from the round trip with the smallest RTT; ``error`` is half that RTT."""
        best = None
        for _ in range(samples):
            t0 = _nb.now_us()
            g = self.guest_now_us(host)
            t1 = _nb.now_us()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, g - (t0 + t1) // 2)
        assert best is not None
        return best[1], (best[0] + 1) // 2

    def map_clock_us(self, stamp_us: int, from_host: Union[str, RdmaHost], to_host: Union[str, RdmaHost],
                     samples: int = 3) -> Tuple[int, int]:
        """A CLOCK_MONOTONIC stamp (µs) taken in guest ``from_host``, on guest ``to_host``'s
        clock: ``(stamp, error)``, the error (µs) being the sum of both offsets' errors
        (:meth:`clock_offset_us`, ``samples`` round trips each). The same guest: ``(stamp_us, 0)``.
        Raises what :meth:`guest_now_us` raises (a guest that does not answer)."""
        if self.host(from_host).name == self.host(to_host).name:
            return stamp_us, 0
        off_f, err_f = self.clock_offset_us(from_host, samples=samples)
        off_t, err_t = self.clock_offset_us(to_host, samples=samples)
        return stamp_us - off_f + off_t, err_f + err_t

    # ---- QEMU monitor
    def hmp(self, host: Union[str, RdmaHost], command: str, timeout_s: float = 30.0) -> str:
        """Run one QEMU human-monitor command on the guest's QEMU; returns its output."""
        h = self.host(host)
        assert self.run_dir is not None
        path = self.run_dir / h.name / "hmp.sock"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
            buf = b""
            deadline = time.monotonic() + timeout_s
            while not buf.endswith(b"(qemu) "):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"QEMU monitor of {h.name} gave no prompt")
                chunk = s.recv(4096)
                if not chunk:
                    raise RdmaBedError(f"QEMU monitor of {h.name} closed")
                buf += chunk
            s.sendall(command.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"(qemu) "):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"QEMU monitor of {h.name}: no answer to {command!r}")
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except OSError as e:
            self._check_guest(h.name)
            raise RdmaBedError(f"QEMU monitor of {h.name}: {e}") from e
        finally:
            s.close()
        text = buf.decode(errors="replace")
        text = text.split("\n", 1)[1] if "\n" in text else ""  # the first line is the readline echo
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]|\r", "", text)
        lines = [ln for ln in text.split("\n") if ln.strip() and not ln.startswith("(qemu)")]
        return "\n".join(lines)

    # ---- convenience
    def rail_env(self, rails: Optional[Sequence[int]] = None) -> Dict[str, str]:
        """Environment restricting the plugin to the rail NICs (``RAILOVER_IFNAMES``)."""
        rs = range(self.rails) if rails is None else rails
        return {"RAILOVER_IFNAMES": "=" + ",".join(self.hosts[0].nics[r].ifname for r in rs)}  # '=': exact names

    def describe(self) -> List[Dict[str, str]]:
        """One dict per NIC (management included) for tables and JSON output."""
        rows = []
        for h in self.hosts:
            rows.append({"host": h.name, "nic": f"{h.name.lower()}m", "ifname": "eth0", "address": f"{h.mgmt_addr}/24",
                         "rail": "mgmt", "rdma": "-", "gid": "-", "qemu": f"nic0 ({self.wire})"})
            for n in h.nics:
                rows.append({"host": h.name, "nic": n.name, "ifname": n.ifname, "address": n.cidr, "rail": str(n.rail),
                             "rdma": n.rdma_dev, "gid": h.gids.get(n.rdma_dev, "?"),
                             "qemu": f"{n.netdev} ({self.wire})"})
        return rows
