"""Network-namespace test bed: H hosts x M NICs wired through per-rail bridges.

Layout::

    host netns  <prefix>-nsA        fabric netns <prefix>-nsSW         host netns <prefix>-nsB
      <prefix>a0 ==== veth ==== <prefix>swA0 --[br0]-- <prefix>swB0 ==== veth ==== <prefix>b0
      <prefix>a1 ==== veth ==== <prefix>swA1 --[br1]-- <prefix>swB1 ==== veth ==== <prefix>b1

* Every host is a network namespace; every NIC is a veth pair whose "switch end" (the
  port) sits in the fabric namespace, enslaved to the bridge of its rail (``br<r>``).
* Isolated rails (default): rail ``r`` is 10.<base>.<r>.0/24 and host ``i`` gets ``.i+1``.
* Flat layouts (``T2-flat``): every NIC on ``br0`` in one subnet 10.<base>.0.0/24, NIC
  ``r`` of host ``i`` gets ``.(i + 1 + 10*r)`` (a0=.1, a1=.11, b0=.2, b1=.12). Per-NIC
  policy routing (``ip rule from <addr> table <100+r>``) makes traffic sourced from a NIC's
  address leave through that NIC (a later ``from <addr> unreachable`` rule makes it fail
  with ENETUNREACH, instead of leaking through another NIC, when that NIC is down), and
  ``arp_ignore=1``/``arp_announce=2`` avoid ARP flux. ``TestBed(..., policy_routing=False)``
  (``railover testbed up --no-policy-routing``) builds a flat layout without those rules and
  tables: only the main table's connected routes, so whatever is not bound to a device
  leaves through the NIC of the first route.

Every run gets a random prefix ``ro<4 chars>`` used in namespace names
(``<prefix>-nsA``, ``<prefix>-nsSW``) and in host/port interface names (``<prefix>a0``,
``<prefix>swA0``), so parallel runs never collide. Bridges are called ``br<r>``; they only
ever exist inside the private fabric namespace. The logical names
(``a0``, ``swA0``, ``A``) are kept as :attr:`Nic.name` / :attr:`Host.name` and accepted by
:meth:`TestBed.nic` and :meth:`TestBed.host`.

Netlink work (namespaces, links, addresses, routes, rules) goes through pyroute2. Plain
commands are used only where pyroute2 has no API: sysctls (``/proc/sys/net`` is per netns as
seen by the writing process, so a process inside the namespace writes them) and running
programs inside a namespace (``ip netns exec``, which also applies ``/etc/netns/<ns>``).

Created namespaces are recorded in a state directory (``/run/railover-testbed/`` when
writable) so :func:`cleanup_leftovers` (``railover testbed down``) can remove the remains of
crashed runs; it also sweeps namespace names matching the prefix pattern.

Time stamps use :func:`now_us` (CLOCK_MONOTONIC in microseconds), the clock of the C++
plugin's event journal, so fault and plugin timelines line up.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import secrets
import selectors
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

__all__ = [
    "TestBedError", "PrivilegeError", "Topology", "Nic", "Host", "TestBed", "TestBedInfo",
    "EchoServer", "echo_roundtrip", "LAYOUTS", "now_us", "poll_until", "privilege_mode", "ensure_privileges",
    "state_dirs", "list_testbeds", "cleanup_leftovers", "sweep_keeps", "netlink", "ns_exec_argv",
    "ns_pids", "add_nic_address", "del_nic_address", "ensure_nic_routing",
]

PREFIX_CHARS = string.ascii_lowercase + string.digits
PREFIX_RE = re.compile(r"^ro[a-z0-9]{4}$")
#: Namespace names created by a test bed: ``<prefix>-ns<host label>``.
NS_RE = re.compile(r"^(ro[a-z0-9]{4})-ns[A-Za-z0-9]+$")
NETNS_DIR = Path("/run/netns")
IFNAMSIZ_MAX = 15
BR_STATE_FORWARDING = 3
FLAT_TABLE_BASE = 100      # policy-routing table of NIC r is FLAT_TABLE_BASE + r
FLAT_RULE_PRIO_BASE = 1000  # its rule priority is FLAT_RULE_PRIO_BASE + r
FLAT_UNREACH_PRIO_OFFSET = 500  # "from <addr> unreachable" sits at rule priority + this

#: Named layouts: name -> (hosts, nics, flat).
LAYOUTS: Dict[str, Tuple[int, int, bool]] = {
    "T2": (2, 2, False),
    "T2-flat": (2, 2, True),
    "T3": (3, 2, False),
    "T3-flat": (3, 2, True),
}


class TestBedError(RuntimeError):
    """Building, using or removing a test bed failed; the message names what and why."""

    __test__ = False  # not a pytest test class


class PrivilegeError(TestBedError):
    """Neither root nor an unprivileged user+network namespace is available."""


# --------------------------------------------------------------------------- clocks / polling

def now_us() -> int:
    """CLOCK_MONOTONIC in microseconds (the clock of the plugin's event journal)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


T = TypeVar("T")


def poll_until(pred: Callable[[], T], timeout_s: float, interval_s: float = 0.02,
               what: str = "condition") -> T:
    """Call ``pred()`` until it returns a truthy value and return that value.

    ``timeout_s`` and ``interval_s`` are seconds. Raises :class:`TimeoutError` naming
    ``what`` when the deadline passes; the predicate is always tried at least once and
    once more at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        left = deadline - time.monotonic()
        if left <= 0:
            v = pred()
            if v:
                return v
            raise TimeoutError(f"timed out after {timeout_s:.2f}s waiting for {what}")
        time.sleep(min(interval_s, left))


# --------------------------------------------------------------------------- privileges

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_userns_entered = False


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_init_userns() -> bool:
    try:
        first = Path("/proc/self/uid_map").read_text().split("\n")[0].split()
    except OSError:
        return True
    return first == ["0", "0", "4294967295"]


def privilege_mode() -> str:
    """How this process can build namespaces right now.

    Returns ``"root"`` (root in the initial user namespace), ``"userns"`` (root inside an
    unprivileged user namespace, e.g. after :func:`ensure_privileges` or under
    ``unshare -Urm``) or ``"none"`` (unprivileged; :func:`ensure_privileges` may still be
    able to enter a user namespace).
    """
    if os.geteuid() != 0:
        return "none"
    return "root" if _in_init_userns() else "userns"


def _mount(src: str, target: str, fstype: Optional[str], flags: int) -> None:
    libc = _libc()
    r = libc.mount(src.encode() if src else None, target.encode(),
                   fstype.encode() if fstype else None, ctypes.c_ulong(flags), None)
    if r != 0:
        e = ctypes.get_errno()
        raise PrivilegeError(f"mount {fstype or src} on {target} failed: {os.strerror(e)}")


def _private_netns_dir() -> None:
    """Inside a user namespace: give this process a private, writable /run/netns."""
    if os.access("/run/netns", os.W_OK) or (not NETNS_DIR.exists() and os.access("/run", os.W_OK)):
        return
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise PrivilegeError(f"unshare(CLONE_NEWNS) failed: {os.strerror(ctypes.get_errno())}")
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    # /run/netns is where pyroute2 and `ip netns` keep namespace handles. When it does not
    # exist we cannot create it (/run belongs to the real root), so a tmpfs covers all of
    # /run; this only affects this process tree (private mount namespace).
    _mount("tmpfs", "/run/netns" if NETNS_DIR.is_dir() else "/run", "tmpfs", 0)


def _enter_userns() -> None:
    global _userns_entered
    if threading.active_count() > 1:
        raise PrivilegeError(
            "not root, and this process already runs threads, so it cannot enter a user "
            "namespace; run as root or start the program under 'unshare -Urm'")
    uid, gid = os.getuid(), os.getgid()
    libc = _libc()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise PrivilegeError(
            f"not root, and creating an unprivileged user namespace failed ({os.strerror(e)}); "
            "run as root, or allow user namespaces (sysctl user.max_user_namespaces, "
            "kernel.unprivileged_userns_clone, AppArmor restrict_unprivileged_userns)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    _userns_entered = True
    _private_netns_dir()


def ensure_privileges(allow_userns: bool = True) -> str:
    """Make sure this process may create namespaces; return the mode (``"root"``/``"userns"``).

    As root nothing changes. Otherwise, if ``allow_userns``, the *whole process* enters a
    new unprivileged user namespace (mapped to root) with a private mount namespace. That
    needs a single-threaded process, so call it early. Namespaces created in that mode die
    with the process and are invisible to other processes (``railover testbed down`` from
    another shell cannot see them, nor needs to).

    Raises :class:`PrivilegeError` when neither works, saying what to do.
    """
    mode = privilege_mode()
    if mode == "root":
        return mode
    if mode == "userns":
        _private_netns_dir()
        return mode
    if not allow_userns:
        raise PrivilegeError("network namespaces need root (CAP_SYS_ADMIN + CAP_NET_ADMIN); "
                             "run as root or allow the user-namespace fallback")
    _enter_userns()
    return "userns"


# --------------------------------------------------------------------------- namespace helpers

def _netns_mod():
    from pyroute2 import netns  # imported lazily: keeps `railover --help` fast
    return netns


@contextmanager
def netlink(ns: str) -> Iterator[Any]:
    """Yield a pyroute2 ``IPRoute`` bound to network namespace ``ns`` (never creates it).

    Raises :class:`TestBedError` if the namespace does not exist.
    """
    from pyroute2 import IPRoute
    try:
        ipr = IPRoute(netns=ns, flags=0)
    except FileNotFoundError:
        raise TestBedError(f"network namespace {ns!r} does not exist") from None
    try:
        yield ipr
    finally:
        ipr.close()


def ns_exec_argv(ns: str) -> List[str]:
    """argv prefix that runs a command inside network namespace ``ns``.

    ``ip netns exec`` (pyroute2 has no exec helper) also bind-mounts ``/etc/netns/<ns>``
    files and remounts ``/sys`` for the namespace; it works as root and in user-namespace mode.
    """
    return ["ip", "netns", "exec", ns]


def _ns_sysctl(ns: str, values: Dict[str, Union[int, str]]) -> None:
    # pyroute2 has no sysctl API; /proc/sys/net reflects the netns of the process that
    # opens it, so a shell inside the namespace writes the values.
    script = " && ".join(f"echo {v} > /proc/sys/{k.replace('.', '/')}" for k, v in values.items())
    r = subprocess.run(ns_exec_argv(ns) + ["sh", "-c", script], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestBedError(f"setting sysctls in {ns} failed: {r.stderr.strip()}")


def _list_netns() -> List[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def ns_pids(ns: str) -> List[int]:
    """PIDs of processes whose network namespace is ``ns`` (by inode; [] if ``ns`` is gone)."""
    try:
        st = os.stat(NETNS_DIR / ns)
    except OSError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = os.stat(f"/proc/{d}/ns/net")
        except OSError:
            continue
        if s.st_ino == st.st_ino and s.st_dev == st.st_dev:
            out.append(int(d))
    return out


def _kill_ns_processes(ns: str, timeout_s: float = 2.0) -> None:
    me = os.getpid()
    pids = [p for p in ns_pids(ns) if p != me]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        poll_until(lambda: not [p for p in ns_pids(ns) if p != me], timeout_s,
                   what=f"processes in {ns} to exit")
    except TimeoutError:
        pass  # zombies of another parent keep their entry; the namespace is removed anyway


def _remove_netns(ns: str) -> None:
    try:
        _netns_mod().remove(ns)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- topology

@dataclass(frozen=True)
class Topology:
    """Shape of a test bed.

    ``hosts``: number of host namespaces (1..254); ``nics``: NICs per host (1..99);
    ``flat``: every NIC on one bridge and subnet (with per-NIC policy routing) instead of one
    isolated bridge+subnet per rail; ``base``: second octet of all addresses (10.<base>.x.y).
    """

    hosts: int = 2
    nics: int = 2
    flat: bool = False
    base: int = 0

    @classmethod
    def from_layout(cls, layout: str, base: int = 0) -> "Topology":
        """Parse ``"T2"``, ``"T2-flat"``, ``"T3"``, ``"T3-flat"`` or ``"<H>x<M>[-flat]"``.

        Raises ValueError for unknown names.
        """
        if layout in LAYOUTS:
            h, m, flat = LAYOUTS[layout]
            return cls(h, m, flat, base)
        m_ = re.fullmatch(r"(\d+)x(\d+)(-flat)?", layout)
        if not m_:
            raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)} "
                             "or '<hosts>x<nics>[-flat]' (e.g. 4x2)")
        return cls(int(m_.group(1)), int(m_.group(2)), bool(m_.group(3)), base)

    @property
    def name(self) -> str:
        """Layout name: ``T2``, ``T2-flat``, ``T3`` ... or ``<H>x<M>[-flat]``."""
        for k, v in LAYOUTS.items():
            if v == (self.hosts, self.nics, self.flat):
                return k
        return f"{self.hosts}x{self.nics}" + ("-flat" if self.flat else "")

    def flat_stride(self) -> int:
        return 10 if self.hosts <= 9 else self.hosts

    def validate(self) -> None:
        """Raise ValueError if the addresses or names would not fit."""
        if not 1 <= self.hosts <= 254:
            raise ValueError(f"hosts must be 1..254, got {self.hosts}")
        if not 1 <= self.nics <= 99:
            raise ValueError(f"nics must be 1..99, got {self.nics}")
        if not 0 <= self.base <= 255:
            raise ValueError(f"base must be 0..255, got {self.base}")
        if self.hosts > 26 and self.nics >= 10:
            raise ValueError(f"{self.hosts}x{self.nics}: with more than 26 hosts (named H<i>), at most 9 NICs per "
                             "host (NIC and switch port names would collide)")
        if self.flat and self.flat_stride() * (self.nics - 1) + self.hosts > 254:
            raise ValueError(f"flat layout {self.hosts}x{self.nics} does not fit one /24")


def host_label(i: int, hosts: int) -> str:
    """Logical name of host ``i``: ``A``, ``B``, ... (``H<i>`` when there are > 26 hosts)."""
    return chr(ord("A") + i) if hosts <= 26 else f"H{i}"


@dataclass(frozen=True)
class Nic:
    """One host NIC (the host end of a veth pair) and its switch port (immutable, hashable).

    Attributes: ``name`` logical name (``a0``); ``host`` host label (``A``); ``index`` NIC
    index on its host; ``rail`` rail number; ``ifname`` interface name in the host netns;
    ``port`` the switch-end interface name in the fabric netns; ``addr`` IPv4 address and
    ``prefixlen`` its prefix length as configured at build time (faults such as
    ``AddrChange`` do not update it); ``ns`` host netns; ``fabric_ns``; ``bridge`` bridge in
    the fabric netns; ``table``/``rule_priority`` the policy-routing table and rule priority
    (flat layouts only, else None).
    """

    name: str
    host: str
    index: int
    rail: int
    ifname: str
    port: str
    addr: str
    prefixlen: int
    ns: str
    fabric_ns: str
    bridge: str
    table: Optional[int] = None
    rule_priority: Optional[int] = None

    @property
    def cidr(self) -> str:
        """``addr/prefixlen``, e.g. ``10.0.0.1/24``."""
        return f"{self.addr}/{self.prefixlen}"

    @property
    def subnet(self) -> str:
        """The NIC's subnet, e.g. ``10.0.0.0/24`` (prefixlen 24 only)."""
        return ".".join(self.addr.split(".")[:3]) + f".0/{self.prefixlen}"


@dataclass
class Host:
    """A host namespace: ``name`` (``A``), ``index``, ``ns`` (netns name), ``nics``."""

    name: str
    index: int
    ns: str
    nics: List[Nic] = field(default_factory=list)

    def nic(self, i: int) -> Nic:
        """The NIC with index ``i`` on this host."""
        return self.nics[i]


# --------------------------------------------------------------------------- nic addressing

def _flat_route_kw(nic: Nic, addr: str, ifindex: int) -> dict:
    return dict(dst=nic.subnet, oif=ifindex, prefsrc=addr, table=nic.table, scope="link")


def add_nic_address(nic: Nic, addr: str, ipr: Any = None) -> None:
    """Add IPv4 ``addr`` (with ``nic.prefixlen``) to ``nic``, plus its policy-routing rule
    and table route in flat layouts. Raises :class:`TestBedError` on netlink errors."""
    if ipr is None:
        with netlink(nic.ns) as ipr2:
            return add_nic_address(nic, addr, ipr2)
    try:
        idx = ipr.link_lookup(ifname=nic.ifname)[0]
        ipr.addr("add", index=idx, address=addr, prefixlen=nic.prefixlen)
        if nic.table is not None:
            ipr.rule("add", src=addr, src_len=32, table=nic.table, priority=nic.rule_priority)
            # Source-bound traffic must not fall through to the main table (and leak out of
            # another NIC) when this NIC has no route: an "unreachable" rule action gives
            # ENETUNREACH, like an isolated rail whose NIC is down.
            ipr.rule("add", src=addr, src_len=32, action="unreachable",
                     priority=nic.rule_priority + FLAT_UNREACH_PRIO_OFFSET)
            ensure_nic_routing(nic, addr, ipr)
    except Exception as e:
        raise TestBedError(f"adding {addr}/{nic.prefixlen} to {nic.name} ({nic.ifname}) "
                           f"in {nic.ns} failed: {e}") from e


def del_nic_address(nic: Nic, addr: str, ipr: Any = None) -> None:
    """Remove ``addr`` from ``nic`` and, in flat layouts, its policy-routing rule."""
    if ipr is None:
        with netlink(nic.ns) as ipr2:
            return del_nic_address(nic, addr, ipr2)
    try:
        idx = ipr.link_lookup(ifname=nic.ifname)[0]
        ipr.addr("del", index=idx, address=addr, prefixlen=nic.prefixlen)
        if nic.table is not None:
            ipr.rule("del", src=addr, src_len=32, table=nic.table, priority=nic.rule_priority)
            ipr.rule("del", src=addr, src_len=32, action="unreachable",
                     priority=nic.rule_priority + FLAT_UNREACH_PRIO_OFFSET)
    except Exception as e:
        raise TestBedError(f"removing {addr}/{nic.prefixlen} from {nic.name} ({nic.ifname}) "
                           f"in {nic.ns} failed: {e}") from e


def ensure_nic_routing(nic: Nic, addr: Optional[str] = None, ipr: Any = None) -> None:
    """Flat layouts: (re)install the NIC's table route (subnet via the NIC, source ``addr``,
    default: the address the NIC has now; nothing if it has none). The kernel deletes that
    route when the link goes admin-down or the address goes away, and does not restore it,
    so faults call this on undo. No-op for isolated layouts. Idempotent."""
    if nic.table is None:
        return
    if ipr is None:
        with netlink(nic.ns) as ipr2:
            return ensure_nic_routing(nic, addr, ipr2)
    idx = ipr.link_lookup(ifname=nic.ifname)[0]
    if addr is None:
        have = [a.get("IFA_ADDRESS") for a in ipr.get_addr(index=idx, family=socket.AF_INET)]
        if not have:
            return
        addr = nic.addr if nic.addr in have else have[0]
    ipr.route("replace", **_flat_route_kw(nic, addr, idx))


# --------------------------------------------------------------------------- state files

def _real_uid() -> int:
    """This process's uid in the initial user namespace (differs from os.getuid() in
    user-namespace mode, where we appear as root)."""
    try:
        first = Path("/proc/self/uid_map").read_text().split("\n")[0].split()
        if first[0] == "0" and first[2] != "4294967295":
            return int(first[1])
    except (OSError, IndexError, ValueError):
        pass
    return os.getuid()


def state_dirs() -> List[Path]:
    """Candidate state directories, in order of preference (env ``RAILOVER_TESTBED_STATE``,
    ``/run/railover-testbed``, ``<tmp>/railover-testbed-<real uid>``)."""
    out = []
    env = os.environ.get("RAILOVER_TESTBED_STATE")
    if env:
        out.append(Path(env))
    out.append(Path("/run/railover-testbed"))
    out.append(Path(tempfile.gettempdir()) / f"railover-testbed-{_real_uid()}")
    return out


def _writable_state_dir() -> Path:
    """The first of :func:`state_dirs` that can hold a bed's record. When the one the user named
    with ``RAILOVER_TESTBED_STATE`` cannot, a warning on stderr (once per process) names it,
    why, and where the records go instead, where the user would otherwise not look for them.
    (Not an error: this runs deep in bed creation and teardown, where a raise would leave
    a half-built bed.)"""
    named = os.environ.get("RAILOVER_TESTBED_STATE")
    bad = ""
    for d in state_dirs():
        if d.exists() and not d.is_dir():
            why = "not a directory"
        else:
            try:
                d.mkdir(mode=0o755, parents=True, exist_ok=True)
                why = None if os.access(d, os.W_OK) else "not writable"
            except OSError as e:
                why = e.strerror or str(e)
        if why is None:
            if named and d != Path(named) and named not in _STATE_DIR_WARNED:
                _STATE_DIR_WARNED.add(named)
                print(f"railover: warning: RAILOVER_TESTBED_STATE={named} cannot hold the test beds' records ({bad}); "
                      f"they go to {d} (give a writable directory, or unset it)", file=sys.stderr)
            return d
        if named and d == Path(named):
            bad = why
    return Path(tempfile.mkdtemp(prefix="railover-testbed-"))


#: RAILOVER_TESTBED_STATE values already warned about (:func:`_writable_state_dir`)
_STATE_DIR_WARNED: set = set()


def _proc_starttime(pid: int) -> Optional[int]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no half-written .tmp left behind
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (blocked, not lost) in this thread while the block runs: a step
    that must either happen completely or not at all (creating a namespace: pyroute2 forks a
    child for it, which inherits the mask, so Ctrl-C cannot kill it half-way either). A signal
    that arrived meanwhile is delivered when the block ends.

    The mask is per thread, and the kernel gives a process-wide signal to any thread that does
    not block it: in a process with other threads the signal lands there, and Python would
    still run its handler in the main thread mid-block. So in the main thread the handlers are
    also swapped for a recorder while the block runs, and what it recorded is raised again
    once the block is over (seen as a flaky unit test when the test process had threads)."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    seen: List[int] = []
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in sigs:
            saved[sig] = signal.signal(sig, lambda s, _f: seen.append(s))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal blocked here arrives now
        for sig in dict.fromkeys(seen):  # once each, in order
            signal.raise_signal(sig)


def _in_use_message(prefix: str, taken: Sequence[str]) -> str:
    """Why a bed with ``prefix`` cannot be built: its namespaces ``taken`` exist. Says whose
    they are, as far as this process can tell, and how to remove them when nothing runs there."""
    what = f"network namespace {taken[0]} already exists" + (f" (and {', '.join(taken[1:])})" if taken[1:] else "")
    info = next((i for i in list_testbeds() if i.prefix == prefix), None)
    if info is not None and info.alive and not info.detached:
        return (f"{what}: test bed {prefix} is up (owner pid {info.pid}); stop it there (Ctrl-C, or kill -INT "
                f"{info.pid}), or use another prefix")
    down = f"'railover testbed down --prefix {prefix}'"
    if info is not None and info.detached:
        return f"{what}: test bed {prefix} is up, detached; remove it with {down}, or use another prefix"
    if info is not None and info.owner_unknown_in_use:
        return (f"{what}: processes run inside (pids {' '.join(map(str, info.pids_inside[:5]))}) but this host has "
                f"no state file of test bed {prefix} (another RAILOVER_TESTBED_STATE?); use another prefix, or remove "
                f"it, killing them, with {down}")
    return (f"{what}: left behind by test bed {prefix} (an interrupted or crashed run); remove it with {down}, "
            "or use another prefix")


@dataclass
class TestBedInfo:
    """What is known about one test bed (live, detached or left over by a crash).

    ``prefix``; ``namespaces`` that exist now; ``pid`` of the owner (None if unknown);
    ``alive`` whether the owner still runs; ``detached`` (left up on purpose by
    ``railover testbed up --detach``); ``layout``; ``mode``; ``state_file`` (None for beds
    found only by namespace-name sweep); ``pids_inside``: for a bed found only by the sweep,
    the processes running in its namespaces (its owner may be alive with its state file in
    a directory this process does not read, e.g. another ``RAILOVER_TESTBED_STATE``).
    """

    __test__ = False

    prefix: str
    namespaces: List[str]
    pid: Optional[int] = None
    alive: bool = False
    detached: bool = False
    layout: Optional[str] = None
    mode: Optional[str] = None
    state_file: Optional[Path] = None
    pids_inside: List[int] = field(default_factory=list)

    @property
    def owner_unknown_in_use(self) -> bool:
        """Found only by the sweep, with processes inside: maybe another user's live bed."""
        return self.state_file is None and bool(self.pids_inside)


def read_bed_state(f: Path, types: Mapping[str, type]) -> Optional[Dict[str, Any]]:
    """A bed's state file as a dict, or None when it cannot be read, is no JSON object (also
    one Python's json cannot read: nesting past the recursion limit, a number of more than 4300
    digits) or one of the fields in ``types`` (name -> type, absent allowed; a bool is no int)
    has another type: a corrupt file is skipped like a missing one (the namespace sweep still
    finds its bed), never a traceback that would keep ``testbed list``/``down`` from running."""
    try:
        st = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(st, dict):
        return None
    for k, t in types.items():
        v = st.get(k)
        if v is not None and (not isinstance(v, t) or (isinstance(v, bool) and t is not bool)):
            return None
    return st


def list_testbeds() -> List[TestBedInfo]:
    """All test beds visible to this process: from state files plus a sweep of
    namespace names matching ``ro????-ns*``. Sorted by prefix."""
    existing = _list_netns()
    found: Dict[str, TestBedInfo] = {}
    for d in state_dirs():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("ro*.json")):
            st = read_bed_state(f, {"prefix": str, "pid": int, "pid_start": int, "namespaces": list})
            if st is None or not all(isinstance(n, str) for n in st.get("namespaces") or []):
                continue
            prefix = st.get("prefix") or f.stem
            pid = st.get("pid")
            alive = bool(pid) and _proc_starttime(pid) == st.get("pid_start")
            found[prefix] = TestBedInfo(prefix, [n for n in st.get("namespaces", []) if n in existing],
                                        pid, alive, bool(st.get("detached")), st.get("layout"),
                                        st.get("mode"), f)
    for n in existing:
        m = NS_RE.match(n)
        if not m:
            continue
        info = found.setdefault(m.group(1), TestBedInfo(m.group(1), []))
        if n not in info.namespaces:
            info.namespaces.append(n)
    me = os.getpid()
    for info in found.values():
        if info.state_file is None:
            info.pids_inside = sorted({p for n in info.namespaces for p in ns_pids(n) if p != me})
    return [found[k] for k in sorted(found)]


def sweep_keeps(info: TestBedInfo, include_live: bool = False, include_detached: bool = True) -> bool:
    """Whether a sweep without a prefix (:func:`cleanup_leftovers`) leaves bed ``info`` alone:
    its owner runs (unless ``include_live``), it is detached (unless ``include_detached``), or
    its owner is unknown and processes run inside (unless ``include_live``)."""
    if info.alive and not info.detached and not include_live:
        return True
    if info.detached and not include_detached:
        return True
    return info.owner_unknown_in_use and not include_live


def cleanup_leftovers(prefix: Optional[str] = None, include_live: bool = False,
                      include_detached: bool = True) -> List[str]:
    """Remove test beds and return the namespace names removed.

    With ``prefix``: remove that bed whatever its state. Without: remove beds whose owner
    process is gone (crashed runs, and detached beds when ``include_detached``); beds of
    running processes only with ``include_live``, which also covers beds found only by the
    namespace sweep that still have processes inside (their owner is unknown: it may be a live
    run whose state file this process cannot see). Processes still inside the namespaces are
    killed (SIGKILL) first, then the namespaces and state files are removed.
    """
    removed: List[str] = []
    for info in list_testbeds():
        if prefix is not None and info.prefix != prefix:
            continue
        if prefix is None and sweep_keeps(info, include_live, include_detached):
            continue
        for ns in info.namespaces:
            _kill_ns_processes(ns)
            _remove_netns(ns)
            removed.append(ns)
        if info.state_file is not None:
            try:
                info.state_file.unlink()
            except FileNotFoundError:
                pass
    return removed


# --------------------------------------------------------------------------- the test bed

_ACTIVE: "set[TestBed]" = set()
_ACTIVE_LOCK = threading.Lock()


def _atexit_teardown() -> None:
    for tb in list(_ACTIVE):
        if tb._owner_pid != os.getpid():
            continue  # a forked child exiting must not tear down its parent's beds
        try:
            tb.down()
        except Exception:
            pass


atexit.register(_atexit_teardown)


class _SignalGuard:
    """One process-wide SIGTERM/SIGINT/SIGHUP handler, installed while any bed with
    ``handle_signals`` is up (so nested beds and out-of-order teardown stay consistent).

    The handler raises SystemExit(128+sig) for SIGTERM and SIGHUP and KeyboardInterrupt for SIGINT so
    ``with`` blocks unwind and tear down; a handler that was installed before is chained to
    instead. A signal arriving while a bed is being torn down is held and re-delivered
    afterwards. ``signal.signal`` only works in the main thread; beds brought up elsewhere
    rely on their ``with`` block and the atexit hook.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the SSH session was closed

    def __init__(self) -> None:
        self.old: Dict[int, Any] = {}
        self.users: "set[TestBed]" = set()
        self.pid: Optional[int] = None
        self.busy = 0
        self.pending: Optional[int] = None

    def acquire(self, tb: "TestBed") -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if not self.users:
            self.pid = os.getpid()
            for sig in self.SIGNALS:
                self.old[sig] = signal.signal(sig, self._handler)
        self.users.add(tb)

    def release(self, tb: "TestBed") -> None:
        if tb in self.users:
            self.users.discard(tb)
            if not self.users and threading.current_thread() is threading.main_thread():
                for sig, h in self.old.items():
                    signal.signal(sig, h if h is not None else signal.SIG_DFL)
                self.old = {}
        if self.busy == 0 and self.pending is not None:
            sig, self.pending = self.pending, None
            os.kill(os.getpid(), sig)

    def _handler(self, sig: int, frame: Any) -> None:
        if os.getpid() != self.pid:
            # A forked child (pyroute2 forks helpers and stops them with SIGTERM) inherited
            # this handler: raising here would let the child unwind into the parent's code.
            # Behave like the default action instead.
            os._exit(128 + sig)
        if self.busy:
            self.pending = sig  # re-delivered once the teardown in progress has finished
            return
        prev = self.old.get(sig)
        if callable(prev) and prev is not signal.default_int_handler:
            prev(sig, frame)
            return
        if prev == signal.SIG_IGN:
            return
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + sig)


_SIGNALS = _SignalGuard()

HostKey = Union["Host", str, int]
NicKey = Union[Nic, str]


class TestBed:
    """A running (or to-be-built) H x M test bed. Use as a context manager::

        with TestBed("T2") as tb:
            a0, b0 = tb.nic("a0"), tb.nic("b0")
            rc, out, err = tb.run_collect("A", ["ip", "-br", "addr"])

    ``layout``: a layout name (``T2``, ``T2-flat``, ``T3``, ``<H>x<M>[-flat]``) or a
    :class:`Topology`; ``hosts``/``nics``/``flat`` override it (``TestBed(hosts=4, nics=2)``);
    ``base``: second address octet; ``prefix``: force a prefix (``ro`` + 4 of [a-z0-9]),
    default random and unused; ``ipv6``: keep IPv6 (default off, so no router solicitation/
    MLD noise in counters); ``allow_userns``: fall back to an unprivileged user namespace when
    not root; ``handle_signals``: while up, SIGTERM/SIGINT/SIGHUP unwind (SystemExit/
    KeyboardInterrupt) so the bed is torn down, a signal arriving during teardown is
    delivered after it.

    ``policy_routing``: flat layouts only; False builds them without the per-NIC policy
    routing (rules and tables), as on hosts whose NICs share a subnet with only the main table.

    Attributes after :meth:`up`: ``prefix``, ``mode`` (``root``/``userns``), ``topology``,
    ``layout``, ``hosts`` (list of :class:`Host`), ``nics`` (all NICs), ``fabric_ns``,
    ``bridges``, ``namespaces``, ``state_file``, ``up_us``.

    Raises :class:`PrivilegeError` without privileges, :class:`TestBedError` when building
    fails (everything built so far is removed first), ValueError for bad parameters.
    """

    __test__ = False  # tell pytest this is not a test class

    def __init__(self, layout: Union[str, Topology] = "T2", *, hosts: Optional[int] = None,
                 nics: Optional[int] = None, flat: Optional[bool] = None, base: int = 0,
                 prefix: Optional[str] = None, ipv6: bool = False, allow_userns: bool = True,
                 handle_signals: bool = True, policy_routing: bool = True):
        topo = layout if isinstance(layout, Topology) else Topology.from_layout(layout, base)
        if isinstance(layout, Topology) and base:
            topo = Topology(topo.hosts, topo.nics, topo.flat, base)
        topo = Topology(hosts if hosts is not None else topo.hosts,
                        nics if nics is not None else topo.nics,
                        flat if flat is not None else topo.flat, topo.base)
        topo.validate()
        if prefix is not None and not PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must be 'ro' + 4 of [a-z0-9], got {prefix!r}")
        self.topology = topo
        self.policy_routing = policy_routing
        self.layout = topo.name
        self.prefix = prefix or self._new_prefix()
        self.ipv6 = ipv6
        self.allow_userns = allow_userns
        self.handle_signals = handle_signals
        self.mode: Optional[str] = None
        self._owner_pid = os.getpid()
        # Not a host label (A..Z, H<i>): as "-nsF" it was host F's namespace too, and every
        # layout of 6 to 26 hosts failed to build ("appeared while ... being built").
        self.fabric_ns = f"{self.prefix}-nsSW"
        self.hosts: List[Host] = []
        self.nics: List[Nic] = []
        self.bridges: List[str] = ["br0"] if topo.flat else [f"br{r}" for r in range(topo.nics)]
        self.state_file: Optional[Path] = None
        self.up_us: Optional[int] = None
        self.detached = False
        self._is_up = False
        self._procs: List[subprocess.Popen] = []
        self._servers: List[EchoServer] = []
        self._created: List[str] = []
        self._tearing_down = False
        self._plan()

    # ---- naming / plan
    @staticmethod
    def _new_prefix() -> str:
        taken = {i.prefix for i in list_testbeds()}
        while True:
            p = "ro" + "".join(secrets.choice(PREFIX_CHARS) for _ in range(4))
            if p not in taken:
                return p

    def _plan(self) -> None:
        t = self.topology
        for i in range(t.hosts):
            label = host_label(i, t.hosts)
            h = Host(label, i, f"{self.prefix}-ns{label}")
            for r in range(t.nics):
                lname = f"{label.lower()}{r}" if t.hosts <= 26 else f"{label.lower()}n{r}"
                ifname = f"{self.prefix}{lname}"
                port = f"{self.prefix}sw{label}{r}"
                for n in (ifname, port):
                    if len(n) > IFNAMSIZ_MAX:
                        raise ValueError(f"interface name {n!r} exceeds {IFNAMSIZ_MAX} chars")
                if t.flat:
                    addr = f"10.{t.base}.0.{1 + i + t.flat_stride() * r}"
                    routed = self.policy_routing
                    nic = Nic(lname, label, r, r, ifname, port, addr, 24, h.ns, self.fabric_ns, "br0",
                              FLAT_TABLE_BASE + r if routed else None, FLAT_RULE_PRIO_BASE + r if routed else None)
                else:
                    addr = f"10.{t.base}.{r}.{i + 1}"
                    nic = Nic(lname, label, r, r, ifname, port, addr, 24, h.ns, self.fabric_ns,
                              f"br{r}")
                h.nics.append(nic)
                self.nics.append(nic)
            self.hosts.append(h)
        self.namespaces = [self.fabric_ns] + [h.ns for h in self.hosts]

    # ---- lookup
    def host(self, key: HostKey) -> Host:
        """A host by :class:`Host`, index, label (``"A"``/``"a"``/``"nsA"``) or netns name.
        Raises KeyError naming the valid keys."""
        if isinstance(key, Host):
            return key
        if isinstance(key, int):
            return self.hosts[key]
        k = key[2:] if key.startswith("ns") and len(key) > 2 else key
        for h in self.hosts:
            if k.upper() == h.name.upper() or key == h.ns:
                return h
        raise KeyError(f"no host {key!r} in {self.prefix}; hosts: {[h.name for h in self.hosts]}")

    def nic(self, key: NicKey) -> Nic:
        """A NIC by :class:`Nic`, logical name (``"a0"``), ifname or port name
        (``"swA0"`` or the prefixed one). Raises KeyError naming the valid names."""
        if isinstance(key, Nic):
            return key
        for n in self.nics:
            if key in (n.name, n.ifname, n.port) or key == n.port[len(self.prefix):]:
                return n
        raise KeyError(f"no NIC {key!r} in {self.prefix}; NICs: {[n.name for n in self.nics]}")

    def peer(self, nic: NicKey, host: HostKey) -> Nic:
        """The NIC of ``host`` on the same rail as ``nic`` (e.g. ``peer("a0", "B")`` -> b0)."""
        n = self.nic(nic)
        return self.host(host).nics[n.rail]

    def peers(self, nic: NicKey) -> List[Nic]:
        """All other hosts' NICs on the same bridge as ``nic``."""
        n = self.nic(nic)
        return [m for m in self.nics if m.bridge == n.bridge and m.host != n.host]

    # ---- lifecycle
    def __enter__(self) -> "TestBed":
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"<TestBed {self.prefix} {self.layout} mode={self.mode} up={self._is_up}>"

    @property
    def is_up(self) -> bool:
        """True between a successful :meth:`up` and :meth:`down`."""
        return self._is_up

    def _state(self) -> dict:
        return {
            "prefix": self.prefix, "pid": os.getpid(), "pid_start": _proc_starttime(os.getpid()),
            "mode": self.mode, "layout": self.layout, "topology": asdict(self.topology),
            "namespaces": self.namespaces, "detached": self.detached, "created_us": self.up_us,
            "hosts": [{"name": h.name, "ns": h.ns, "nics": [asdict(n) for n in h.nics]}
                      for h in self.hosts],
            "fabric_ns": self.fabric_ns, "bridges": self.bridges, "policy_routing": self.policy_routing,
        }

    def up(self) -> "TestBed":
        """Build the bed; returns self. On any failure everything built is removed and
        :class:`TestBedError` (or :class:`PrivilegeError`) is raised."""
        if self._is_up:
            return self
        self.mode = ensure_privileges(self.allow_userns)
        # Refuse before touching any state: the namespaces (and the state file) may belong to a
        # live bed with this prefix.
        taken = [ns for ns in self.namespaces if ns in _list_netns()]
        if taken:
            raise TestBedError(_in_use_message(self.prefix, taken))
        self._owner_pid = os.getpid()
        self.up_us = now_us()
        # From here on a signal (Ctrl-C) or an error at any point removes what was made so far:
        # _is_up first, so down() runs; it removes the state file and the namespaces recorded.
        try:
            self._is_up = True
            with _ACTIVE_LOCK:
                _ACTIVE.add(self)
            if self.handle_signals:
                _SIGNALS.acquire(self)
            self.state_file = _writable_state_dir() / f"{self.prefix}.json"
            _write_json(self.state_file, self._state())  # written first: a crash mid-build is found
            self._build()
        except BaseException as e:
            self.down()
            if isinstance(e, (TestBedError, KeyboardInterrupt, SystemExit)):
                raise
            raise TestBedError(f"building test bed {self.prefix} ({self.layout}) failed: {e}") from e
        return self

    def _build(self) -> None:
        nsmod = _netns_mod()
        for ns in self.namespaces:
            if ns in _list_netns():
                raise TestBedError(self._appeared(ns))
            # Recorded before it exists, so that the teardown removes it whenever it came to
            # exist (down() passes over one that does not); created whole or not at all.
            self._created.append(ns)
            try:
                with _signals_held():
                    nsmod.create(ns)
            except FileExistsError:  # made by someone else since the check above: not ours to remove
                self._created.remove(ns)
                raise TestBedError(self._appeared(ns)) from None
        common = {} if self.ipv6 else {"net.ipv6.conf.all.disable_ipv6": 1,
                                       "net.ipv6.conf.default.disable_ipv6": 1}
        _ns_sysctl(self.fabric_ns, common)
        for h in self.hosts:
            _ns_sysctl(h.ns, {**common,
                              "net.ipv4.conf.all.arp_ignore": 1,
                              "net.ipv4.conf.all.arp_announce": 2,
                              "net.ipv4.conf.all.rp_filter": 0,
                              "net.ipv4.conf.default.rp_filter": 0})
        with netlink(self.fabric_ns) as f:
            f.link("set", index=f.link_lookup(ifname="lo")[0], state="up")
            br_idx = {}
            for br in self.bridges:
                f.link("add", ifname=br, kind="bridge", br_stp_state=0)
                br_idx[br] = f.link_lookup(ifname=br)[0]
                f.link("set", index=br_idx[br], state="up")
            for n in self.nics:
                # Created inside the fabric ns with the peer placed straight into the host
                # ns: no interface ever appears in the initial namespace.
                f.link("add", ifname=n.port, kind="veth",
                       peer={"ifname": n.ifname, "net_ns_fd": n.ns})
                pidx = f.link_lookup(ifname=n.port)[0]
                f.link("set", index=pidx, master=br_idx[n.bridge])
                f.link("set", index=pidx, state="up")
        for h in self.hosts:
            with netlink(h.ns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                for n in h.nics:
                    ipr.link("set", index=ipr.link_lookup(ifname=n.ifname)[0], state="up")
                    add_nic_address(n, n.addr, ipr)
        poll_until(self.ready, 10.0, what=f"all NICs and switch ports of {self.prefix} to be up")

    def _appeared(self, ns: str) -> str:
        return (f"network namespace {ns} appeared while test bed {self.prefix} was being built (another process "
                "made it); use another prefix")

    def ready(self) -> bool:
        """True when every host NIC and switch port is operationally UP and every port is
        in the bridge's forwarding state. Carrier changes reach the bridge through the
        kernel's link watch (deferred by up to ~1 s), so :meth:`up` waits for this."""
        for h in self.hosts:
            with netlink(h.ns) as ipr:
                for link in ipr.get_links():
                    name = link.get("IFLA_IFNAME")
                    if name.startswith(self.prefix) and link.get("IFLA_OPERSTATE") != "UP":
                        return False
        with netlink(self.fabric_ns) as f:
            for link in f.get_links():
                if not link.get("IFLA_IFNAME").startswith(self.prefix):
                    continue
                info = link.get("IFLA_LINKINFO")
                slave = info.get("IFLA_INFO_SLAVE_DATA") if info else None
                if (link.get("IFLA_OPERSTATE") != "UP" or slave is None
                        or slave.get("IFLA_BRPORT_STATE") != BR_STATE_FORWARDING):
                    return False
        return True

    def detach(self) -> None:
        """Leave the bed up when this process exits (for ``railover testbed up --detach``).
        Remove it later with :func:`cleanup_leftovers` (``railover testbed down``).
        Raises TestBedError in user-namespace mode (the bed dies with the process there)."""
        if self.mode == "userns":
            raise TestBedError("cannot detach in user-namespace mode: the namespaces live only "
                               "as long as this process; run as root to detach")
        self.detached = True
        if self.state_file:
            _write_json(self.state_file, self._state())
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self)
        _SIGNALS.release(self)

    @classmethod
    def attach(cls, prefix: str) -> "TestBed":
        """Rebuild the object of a bed that is already up (e.g. detached), from its state
        file, without creating anything. Its :meth:`down` removes it. Raises
        :class:`TestBedError` when no state file for ``prefix`` exists."""
        for info in list_testbeds():
            if info.prefix == prefix and info.state_file is not None:
                st = json.loads(info.state_file.read_text())
                break
        else:
            raise TestBedError(f"no state file for test bed {prefix!r} in "
                               f"{', '.join(map(str, state_dirs()))}")
        tb = cls(Topology(**st["topology"]), prefix=prefix, handle_signals=False,
                 policy_routing=st.get("policy_routing", True))
        tb.mode, tb.state_file, tb.up_us = st.get("mode"), info.state_file, st.get("created_us")
        tb.detached = bool(st.get("detached"))
        tb._created = [ns for ns in tb.namespaces if ns in info.namespaces]
        tb._is_up = True
        return tb

    def down(self) -> None:
        """Tear down: stop processes started with :meth:`run` (SIGTERM, then SIGKILL after
        1 s), kill whatever else runs inside the namespaces, remove the namespaces (and with
        them every veth and bridge) and the state file. Idempotent; never raises for parts
        that are already gone."""
        if not self._is_up or self._tearing_down:
            return
        _SIGNALS.busy += 1   # first: a signal from here on waits until the teardown is done
        errors = []
        try:
            self._tearing_down = True
            for s in list(self._servers):
                s.close()
            for p in self._procs:
                if p.poll() is None:
                    try:
                        p.terminate()
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 1.0
            for p in self._procs:
                try:
                    p.wait(max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for ns in self._created:  # never a same-named namespace someone else made
                try:
                    _kill_ns_processes(ns)
                    _remove_netns(ns)
                except Exception as e:  # keep going: remove as much as possible
                    errors.append(f"{ns}: {e}")
            if self.state_file is not None and not errors:
                try:
                    self.state_file.unlink()
                except FileNotFoundError:
                    pass
            self._created = []
        finally:
            self._is_up = False
            self._tearing_down = False
            _SIGNALS.busy -= 1
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)
            _SIGNALS.release(self)
        if errors:
            raise TestBedError(f"teardown of {self.prefix} incomplete: {'; '.join(errors)}")

    teardown = down

    # ---- running things inside hosts
    @property
    def processes(self) -> List[subprocess.Popen]:
        """Popen objects started with :meth:`run` (finished ones included) and not yet
        reaped by :meth:`run_collect`; all are stopped at :meth:`down`."""
        return list(self._procs)

    def run(self, host: HostKey, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
            **popen_kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s netns and return the Popen (its pid is the
        command's own pid). ``env`` entries are added to (not replacing) this process's
        environment. Other keyword arguments go to :class:`subprocess.Popen`. The process is
        stopped at :meth:`down`."""
        if not self._is_up:
            raise TestBedError(f"test bed {self.prefix} is not up")
        h = self.host(host)
        full_env = None
        if env is not None:
            full_env = dict(os.environ)
            full_env.update(env)
        p = subprocess.Popen(ns_exec_argv(h.ns) + list(argv), env=full_env, **popen_kw)
        self._procs.append(p)
        return p

    def run_collect(self, host: HostKey, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
                    timeout_s: float = 60.0, input: Optional[str] = None,
                    **popen_kw: Any) -> Tuple[int, str, str]:
        """Run ``argv`` in ``host`` and wait: returns ``(returncode, stdout, stderr)`` as text.
        Raises :class:`subprocess.TimeoutExpired` (after killing it) past ``timeout_s`` s."""
        p = self.run(host, argv, env=env, stdin=subprocess.PIPE if input is not None else None,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kw)
        try:
            out, err = p.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        finally:
            if p in self._procs:
                self._procs.remove(p)
        return p.returncode, out, err

    # ---- sockets and probes
    def socket(self, host: HostKey, family: int = socket.AF_INET,
               type: int = socket.SOCK_STREAM, proto: int = 0) -> socket.socket:
        """A socket created inside ``host``'s netns (usable from this process)."""
        return _netns_mod().create_socket(self.host(host).ns, family, type, proto, flags=0)

    def connect(self, src: NicKey, dst: Union[NicKey, str], port: int,
                timeout_s: float = 1.0) -> socket.socket:
        """TCP-connect from ``src``'s address (any port) to ``dst`` (a NIC or an IPv4
        address) : ``port``. Returns the connected socket (timeout ``timeout_s`` s set on it).
        Raises OSError (e.g. ENETUNREACH, EADDRNOTAVAIL, timeout) on failure."""
        s_nic = self.nic(src)
        daddr = self._addr_of(dst)
        s = self.socket(s_nic.host)
        try:
            s.settimeout(timeout_s)
            s.bind((s_nic.addr, 0))
            s.connect((daddr, port))
        except BaseException:
            s.close()
            raise
        return s

    def tcp_echo(self, src: NicKey, dst: Union[NicKey, str], port: int,
                 payload: bytes = b"railover-probe", timeout_s: float = 1.0) -> bool:
        """True if a fresh TCP connection from ``src`` to ``dst:port`` (an
        :class:`EchoServer`) echoes ``payload`` back within ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        try:
            s = self.connect(src, dst, port, timeout_s)
        except OSError:
            return False
        with s:
            return echo_roundtrip(s, payload, max(0.001, deadline - time.monotonic()))

    def echo_server(self, where: Union[NicKey, HostKey], port: int = 0) -> "EchoServer":
        """Start a TCP echo server in a host netns, listening on a NIC's address (or on all
        addresses of a host when given a host). ``port`` 0 picks a free one (see ``.port``).
        Closed at :meth:`down` at the latest."""
        if isinstance(where, Nic) or (isinstance(where, str) and self._is_nic_key(where)):
            n = self.nic(where)
            srv = EchoServer(self.socket(n.host), n.addr, port)
        else:
            srv = EchoServer(self.socket(self.host(where)), "0.0.0.0", port)
        self._servers.append(srv)
        srv._owner = self._servers
        return srv

    def _is_nic_key(self, key: str) -> bool:
        try:
            self.nic(key)
            return True
        except KeyError:
            return False

    def _addr_of(self, dst: Union[NicKey, str]) -> str:
        if isinstance(dst, Nic):
            return dst.addr
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", dst):
            return dst
        return self.nic(dst).addr


def echo_roundtrip(s: socket.socket, payload: bytes, timeout_s: float) -> bool:
    """Send ``payload`` on connected socket ``s`` and read it back; True if it came back
    intact within ``timeout_s`` seconds, False on timeout, EOF or a socket error."""
    deadline = time.monotonic() + timeout_s
    try:
        s.settimeout(timeout_s)
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            s.settimeout(left)
            chunk = s.recv(len(payload) - len(got))
            if not chunk:
                return False
            got += chunk
        return got == payload
    except OSError:
        return False


class EchoServer:
    """A TCP echo server on a socket from a host namespace, served by one background thread
    (selectors, non-blocking). ``addr``/``port`` tell where it listens. Context manager;
    :meth:`close` stops it and closes every connection."""

    def __init__(self, sock: socket.socket, addr: str, port: int = 0):
        self._sock = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(128)
        sock.setblocking(False)
        self.addr, self.port = sock.getsockname()[:2]
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._owner: Optional[list] = None
        self._thread = threading.Thread(target=self._loop, name=f"echo-{addr}:{self.port}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        pending: Dict[socket.socket, bytes] = {}
        while not self._stop.is_set():
            for key, ev in self._sel.select(0.1):
                if key.fileobj is self._sock:
                    try:
                        c, _ = self._sock.accept()
                    except OSError:
                        continue
                    c.setblocking(False)
                    pending[c] = b""
                    self._sel.register(c, selectors.EVENT_READ, None)
                    continue
                c = key.fileobj
                if ev & selectors.EVENT_READ:
                    try:
                        data = c.recv(65536)
                    except BlockingIOError:
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":
                        self._sel.unregister(c)
                        pending.pop(c, None)
                        c.close()
                        continue
                    if data:
                        pending[c] += data
                if pending.get(c):
                    try:
                        n = c.send(pending[c])
                        pending[c] = pending[c][n:]
                    except BlockingIOError:
                        pass
                    except OSError:
                        self._sel.unregister(c)
                        pending.pop(c, None)
                        c.close()
                        continue
                    self._sel.modify(c, selectors.EVENT_READ |
                                     (selectors.EVENT_WRITE if pending[c] else 0), None)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()

    def close(self) -> None:
        """Stop the server and close all its sockets (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5)
        if self._owner is not None and self in self._owner:
            self._owner.remove(self)

    def __enter__(self) -> "EchoServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
