"""Fault primitives (the link faults of the field: port or host NIC down, silent black hole,
one-way loss, loss, rate limit, address change, killed or stopped process), each with ``apply()`` and an exact ``undo()``.

Every fault is an object::

    f = Silent(tb.nic("a0")).apply()    # or: with Silent(nic) as f: ...
    ...
    f.counter()                        # packets dropped so far (nft/tc based faults)
    f.undo()
    f.applied_us, f.undone_us          # CLOCK_MONOTONIC µs, same clock as the plugin journal

``apply()`` raises :class:`FaultError` if the fault is already active or the kernel refuses
the change (the message names the command and the namespace); ``undo()`` is idempotent and
removes exactly what ``apply()`` added. ``applied_us`` is taken right after the change took
effect, ``undone_us`` right after it was reverted.

nftables: each nft-based fault creates its own uniquely named table (``ro_<kind>_<hex>``),
so several faults coexist and undo deletes only its own rules. Rules carry ``counter``.
The ``nft`` command is driven through subprocess (``nft -f -``): there is no maintained
nftables binding on PyPI, and Debian's ``python3-nftables`` only serves the system Python.

Where a drop happens matters: a rule in a host's ``output`` hook is *local* — the sending
kernel sees NF_DROP, so ``sendto()`` on UDP returns EPERM and TCP retries on its next
transmit attempt instead of waiting for an RTO. That is the default here. ``Loss`` and ``OneWay`` also accept ``at="switch"`` to drop in the fabric
bridge instead, which the sender cannot notice (like a real lossy cable or switch).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from railover.sizes import parse_size
from railover.testbed.netns import (NETNS_DIR, Nic, TestBed, TestBedError, add_nic_address,
                      del_nic_address, ensure_nic_routing, netlink, now_us, ns_exec_argv)

__all__ = [
    "FaultError", "Fault", "NftFault", "HostDown", "PortDown", "Silent", "OneWay", "Loss",
    "BigDrop", "SynDrop", "Rate", "AddrDel", "AddrChange", "Reregister", "Kill", "Stop",
    "LinkState", "nic_stats", "link_state", "nft_tables", "parse_rate",
]


class FaultError(TestBedError):
    """Applying or undoing a fault failed, or the fault is used in the wrong state."""


# --------------------------------------------------------------------------- base

class Fault:
    """Base class. Subclasses implement ``_apply``/``_undo``; ``code`` is the fault's short
    name in reports (``HOST-DOWN``, ``SILENT`` ...)."""

    code = "FAULT"

    def __init__(self) -> None:
        self.applied_us: Optional[int] = None
        self.undone_us: Optional[int] = None
        self._active = False

    @property
    def active(self) -> bool:
        """True between apply() and undo()."""
        return self._active

    def apply(self) -> "Fault":
        """Inject the fault; returns self. Raises FaultError if already active or if the
        kernel refuses (anything partially installed is removed first)."""
        if self._active:
            raise FaultError(f"{self!r} is already applied")
        self.undone_us = None
        self._apply()
        self.applied_us = now_us()
        self._active = True
        return self

    def undo(self) -> None:
        """Revert exactly what apply() did. No-op when not active. If the test bed's
        namespaces are already gone (the fault vanished with them) this succeeds too;
        other failures raise FaultError/TestBedError and leave the fault active."""
        if not self._active:
            return
        try:
            self._undo()
        except TestBedError:
            if all((NETNS_DIR / ns).exists() for ns in self._namespaces()):
                raise
        self.undone_us = now_us()
        self._active = False

    def _namespaces(self) -> List[str]:
        """Network namespaces this fault touches (for the vanished-namespace check)."""
        out: List[str] = []
        for n in [getattr(self, "nic", None), getattr(self, "src", None)] + list(getattr(self, "peers", [])):
            if isinstance(n, Nic):
                out += [n.ns, n.fabric_ns]
        return out

    def counter(self) -> int:
        """Packets dropped by this fault. Only nft- and tc-based faults count; others raise
        NotImplementedError."""
        raise NotImplementedError(f"{self.code} has no drop counter")

    def _apply(self) -> None:
        raise NotImplementedError

    def _undo(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Fault":
        return self.apply()

    def __exit__(self, *exc: Any) -> None:
        self.undo()

    def _target(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"<{self.code} {self._target()} {'active' if self._active else 'inactive'}>"


def _nics(x: Union[None, Nic, Iterable[Nic]]) -> List[Nic]:
    if x is None:
        return []
    if isinstance(x, Nic):
        return [x]
    return list(x)


# --------------------------------------------------------------------------- link faults

def _set_link(ns: str, ifname: str, state: str) -> None:
    try:
        with netlink(ns) as ipr:
            idx = ipr.link_lookup(ifname=ifname)
            if not idx:
                raise FaultError(f"interface {ifname} not found in {ns}")
            ipr.link("set", index=idx[0], state=state)
    except FaultError:
        raise
    except Exception as e:
        raise FaultError(f"setting {ifname} {state} in {ns} failed: {e}") from e


class NicFault(Fault):
    """A fault of one host NIC (``nic``): its target in reports is the NIC's name unless a
    subclass names something more precise (the switch port, the address)."""

    def __init__(self, nic: Nic):
        super().__init__()
        self.nic = nic

    def _target(self) -> str:
        return self.nic.name


class HostDown(NicFault):
    """HOST-DOWN: the host NIC is set admin-down (``ip -n <ns> link set <nic> down``).
    Undo sets it up again and restores flat-layout policy routes the kernel dropped."""

    code = "HOST-DOWN"

    def _apply(self) -> None:
        _set_link(self.nic.ns, self.nic.ifname, "down")

    def _undo(self) -> None:
        _set_link(self.nic.ns, self.nic.ifname, "up")
        try:
            ensure_nic_routing(self.nic)
        except Exception as e:
            raise FaultError(f"restoring policy routes of {self.nic.name} failed: {e}") from e


class PortDown(NicFault):
    """PORT-DOWN: the switch end of the NIC's veth (in the fabric netns) goes down; the
    host NIC loses carrier (NO-CARRIER) while staying admin-up. Undo brings the port up."""

    code = "PORT-DOWN"

    def _target(self) -> str:
        return self.nic.port

    def _apply(self) -> None:
        _set_link(self.nic.fabric_ns, self.nic.port, "down")

    def _undo(self) -> None:
        _set_link(self.nic.fabric_ns, self.nic.port, "up")


# --------------------------------------------------------------------------- nft faults

def _nft(ns: str, script: Optional[str] = None, args: Sequence[str] = ()) -> str:
    cmd = ns_exec_argv(ns) + ["nft"] + (["-f", "-"] if script is not None else list(args))
    r = subprocess.run(cmd, input=script, capture_output=True, text=True)
    if r.returncode != 0:
        what = script.strip() if script is not None else " ".join(args)
        raise FaultError(f"nft in {ns} failed ({r.stderr.strip()}) for: {what}")
    return r.stdout


def nft_tables(ns: str) -> List[Tuple[str, str]]:
    """``(family, name)`` of every nft table in netns ``ns``."""
    data = json.loads(_nft(ns, args=["-j", "list", "tables"]) or '{"nftables": []}')
    return [(o["table"]["family"], o["table"]["name"]) for o in data["nftables"] if "table" in o]


def _q(s: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", s):
        raise FaultError(f"refusing unsafe name {s!r} in an nft rule")
    return f'"{s}"'


class NftFault(Fault):
    """Base of nft-based faults: a list of ``(ns, family, chains)`` installs, each becoming
    one table named ``ro_<kind>_<hex>`` in that netns. ``chains`` maps chain name ->
    (hook, [rule, ...]); every rule gets ``counter drop`` appended."""

    kind = "nft"

    def __init__(self) -> None:
        super().__init__()
        self.table = f"ro_{self.kind}_{secrets.token_hex(3)}"
        self._installed: List[Tuple[str, str]] = []
        self._last_count = 0

    def _installs(self) -> List[Tuple[str, str, dict]]:
        raise NotImplementedError

    def _apply(self) -> None:
        self._installed = []
        try:
            for ns, family, chains in self._installs():
                body = []
                for chain, (hook, rules) in chains.items():
                    body.append(f"  chain {chain} {{\n    type filter hook {hook} priority 0; "
                                f"policy accept;\n")
                    body += [f"    {r} counter drop\n" for r in rules]
                    body.append("  }\n")
                _nft(ns, f"table {family} {self.table} {{\n{''.join(body)}}}\n")
                self._installed.append((ns, family))
        except BaseException:
            try:
                self._delete_tables()
            except FaultError:
                pass  # report the original error
            raise

    def _delete_tables(self) -> None:
        errors = []
        for ns, family in self._installed:
            try:
                _nft(ns, args=["delete", "table", family, self.table])
            except FaultError as e:
                errors.append(str(e))
        self._installed = []
        if errors:
            raise FaultError("; ".join(errors))

    def _undo(self) -> None:
        try:
            self._last_count = self._read_counter()
        except FaultError:
            pass
        self._delete_tables()

    def _read_counter(self) -> int:
        total = 0
        for ns, family in self._installed:
            data = json.loads(_nft(ns, args=["-j", "list", "table", family, self.table]))
            for o in data["nftables"]:
                for e in o.get("rule", {}).get("expr", []):
                    if isinstance(e, dict) and "counter" in e:
                        total += int(e["counter"]["packets"])
        return total

    def counter(self) -> int:
        """Packets dropped by this fault's rules (summed over all its tables); after undo(),
        the count read just before the tables were deleted."""
        return self._read_counter() if self._active else self._last_count

    def rule_counts(self) -> List[Tuple[str, str, int]]:
        """Per rule ``(ns, rule text, packets)``, for diagnostics."""
        out = []
        for ns, family in self._installed:
            for line in _nft(ns, args=["list", "table", family, self.table]).splitlines():
                m = re.search(r"counter packets (\d+)", line)
                if m:
                    out.append((ns, line.strip(), int(m.group(1))))
        return out


class Silent(NftFault):
    """SILENT: black hole in the switch with no carrier event. A bridge-family table in the
    fabric netns drops every frame forwarded from or to the NIC's switch port (chain
    ``xfwd``; ``fwd`` is an nft keyword)."""

    code, kind = "SILENT", "silent"

    def __init__(self, nic: Nic):
        self.nic = nic
        super().__init__()

    def _target(self) -> str:
        return self.nic.port

    def _installs(self):
        p = _q(self.nic.port)
        return [(self.nic.fabric_ns, "bridge",
                 {"xfwd": ("forward", [f"iifname {p}", f"oifname {p}"])})]


def _check_ip(a: str) -> str:
    if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", a):
        raise FaultError(f"not an IPv4 address: {a!r}")
    return a


class OneWay(NftFault):
    """ONEWAY x->y: packets leaving ``src_nic`` for ``dst`` (an address or a Nic) are
    dropped; the reverse direction works. ``at="host"`` (default): inet table,
    output hook, in the source host netns. ``at="switch"``: bridge table in the fabric netns
    on frames entering from the source's port (invisible to the sender)."""

    code, kind = "ONEWAY", "oneway"

    def __init__(self, src_nic: Nic, dst: Union[str, Nic], at: str = "host"):
        self.src = src_nic
        self.dst_addr = _check_ip(dst.addr if isinstance(dst, Nic) else dst)
        if at not in ("host", "switch"):
            raise ValueError(f"at must be 'host' or 'switch', got {at!r}")
        self.at = at
        super().__init__()

    def _target(self) -> str:
        return f"{self.src.name}->{self.dst_addr}"

    def _installs(self):
        if self.at == "host":
            return [(self.src.ns, "inet",
                     {"xout": ("output", [f"oifname {_q(self.src.ifname)} ip daddr {self.dst_addr}"])})]
        return [(self.src.fabric_ns, "bridge",
                 {"xfwd": ("forward", [f"iifname {_q(self.src.port)} ip daddr {self.dst_addr}"])})]


class Loss(NftFault):
    """LOSS p%: random drop of ``percent`` (0 < p <= 100, resolution 0.01 %) of the packets
    the NIC sends, and with ``both_directions`` also of those it receives (``numgen random``).
    ``at="host"`` (default): output/input hooks of an inet table in the host netns.
    ``at="switch"``: bridge forward hook on the NIC's port in the fabric netns."""

    code, kind = "LOSS", "loss"

    def __init__(self, nic: Nic, percent: float, both_directions: bool = True, at: str = "host"):
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        if at not in ("host", "switch"):
            raise ValueError(f"at must be 'host' or 'switch', got {at!r}")
        self.nic, self.percent, self.both_directions, self.at = nic, percent, both_directions, at
        super().__init__()

    def _target(self) -> str:
        return f"{self.nic.name} {self.percent}%"

    def _installs(self):
        n = int(round(self.percent * 100))
        rnd = f"numgen random mod 10000 < {n}" if n < 10000 else "meta length > 0"  # 100 %: all
        if self.at == "host":
            i = _q(self.nic.ifname)
            chains = {"xout": ("output", [f"oifname {i} {rnd}"])}
            if self.both_directions:
                chains["xin"] = ("input", [f"iifname {i} {rnd}"])
            return [(self.nic.ns, "inet", chains)]
        p = _q(self.nic.port)
        rules = [f"iifname {p} {rnd}"] + ([f"oifname {p} {rnd}"] if self.both_directions else [])
        return [(self.nic.fabric_ns, "bridge", {"xfwd": ("forward", rules)})]


class BigDrop(NftFault):
    """BIGDROP n: packets longer than ``size`` bytes (``meta length``, the L3 length; note
    that veth carries GSO super-packets, so any TCP burst above ``size`` counts) arriving on
    the NIC are dropped (input hook). ``peers`` (a Nic or several) get the same rule on their
    input, for a size black hole in both directions."""

    code, kind = "BIGDROP", "bigdrop"

    def __init__(self, nic: Nic, size: int, peers: Union[None, Nic, Iterable[Nic]] = None):
        if size <= 0:
            raise ValueError(f"size must be > 0 bytes, got {size}")
        self.nic, self.size, self.peers = nic, int(size), _nics(peers)
        super().__init__()

    def _target(self) -> str:
        return f"{'+'.join(n.name for n in [self.nic] + self.peers)} >{self.size}B"

    def _installs(self):
        return [(n.ns, "inet",
                 {"xin": ("input", [f"iifname {_q(n.ifname)} meta length > {self.size}"])})
                for n in [self.nic] + self.peers]


class SynDrop(NftFault):
    """SYNDROP: TCP connection setup over the NIC fails (SYN without ACK dropped), while
    established connections keep working. Outgoing SYNs are dropped (output hook); with
    ``both_directions`` (default) also incoming ones (input hook), so neither side can
    open a connection over this NIC."""

    code, kind = "SYNDROP", "syndrop"

    def __init__(self, nic: Nic, both_directions: bool = True):
        self.nic, self.both_directions = nic, both_directions
        super().__init__()

    def _target(self) -> str:
        return self.nic.name

    def _installs(self):
        i = _q(self.nic.ifname)
        syn = "tcp flags & (syn | ack) == syn"
        chains = {"xout": ("output", [f"oifname {i} {syn}"])}
        if self.both_directions:
            chains["xin"] = ("input", [f"iifname {i} {syn}"])
        return [(self.nic.ns, "inet", chains)]


# --------------------------------------------------------------------------- rate

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(rate: Union[str, int, float]) -> int:
    """A tc-style rate (``"200mbit"``, ``"1gbit"``, ``"50mbps"`` = megabytes/s, or a number
    of bits/s) in **bits per second**. Raises ValueError for anything else."""
    if isinstance(rate, (int, float)):
        v = float(rate)
    else:
        m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", rate)
        if not m or (m.group(2).lower() or "bit") not in _RATE_UNITS:
            raise ValueError(f"bad rate {rate!r}; use e.g. '200mbit', '1gbit', '50mbps'")
        v = float(m.group(1)) * _RATE_UNITS[m.group(2).lower() or "bit"]
    if v <= 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    return int(v)


def _parse_ms(latency: Union[str, int, float]) -> float:
    if isinstance(latency, (int, float)):
        return float(latency)
    m = re.fullmatch(r"\s*([\d.]+)\s*(ms|s|us)?\s*", latency)
    if not m:
        raise ValueError(f"bad latency {latency!r}; use e.g. '50ms'")
    return float(m.group(1)) * {"ms": 1, None: 1, "s": 1000, "us": 0.001}[m.group(2)]


class Rate(Fault):
    """RATE r: token-bucket shaping (tc ``tbf``, root qdisc) of the NIC's **egress**,
    ``rate`` like ``"200mbit"`` (see :func:`parse_rate`; at most ~34 Gbit/s), ``burst`` bytes
    or ``"64kb"``, ``latency`` (max queueing delay) ``"50ms"``. Shaping is one-way; pass the
    peer NIC(s) in ``peers`` to shape their egress too (symmetric). Fails if the NIC already
    has a root qdisc other than the default. :meth:`change` alters the rate while active;
    :meth:`counter` returns tbf drops. Undo deletes the qdisc (back to the default)."""

    code = "RATE"

    def __init__(self, nic: Nic, rate: Union[str, int] = "200mbit", burst: Union[str, int] = "64kb",
                 latency: Union[str, float] = "50ms",
                 peers: Union[None, Nic, Iterable[Nic]] = None):
        super().__init__()
        self.nic, self.peers = nic, _nics(peers)
        self.rate_bps = parse_rate(rate)
        self.burst = parse_size(burst)
        self.latency_ms = _parse_ms(latency)
        if self.rate_bps // 8 >= 2 ** 32:
            raise ValueError(f"rate {rate!r} too high for tbf's 32-bit byte rate")
        self._done: List[Nic] = []
        self._last_drops = 0

    def _target(self) -> str:
        return f"{'+'.join(n.name for n in [self.nic] + self.peers)} {self.rate_bps}bit/s"

    def _tc(self, cmd: str, n: Nic) -> None:
        try:
            with netlink(n.ns) as ipr:
                idx = ipr.link_lookup(ifname=n.ifname)[0]
                if cmd == "del":
                    ipr.tc("del", index=idx, handle="1:", root=True)
                else:
                    ipr.tc(cmd, "tbf", index=idx, handle="1:", rate=self.rate_bps // 8,
                           burst=self.burst, latency=int(self.latency_ms * 1000))  # µs
        except Exception as e:
            raise FaultError(f"tc qdisc {cmd} tbf on {n.ifname} in {n.ns} failed: {e}") from e

    def _apply(self) -> None:
        self._done = []
        try:
            for n in [self.nic] + self.peers:
                self._tc("add", n)
                self._done.append(n)
        except BaseException:
            self._undo()
            raise

    def change(self, rate: Union[str, int]) -> None:
        """Change the rate (same units as the constructor) on every shaped NIC.
        Raises FaultError if not active."""
        if not self._active:
            raise FaultError(f"{self!r}: change() needs an active fault")
        self.rate_bps = parse_rate(rate)
        for n in self._done:
            self._tc("change", n)

    def _drops(self) -> int:
        total = 0
        for n in self._done:
            with netlink(n.ns) as ipr:
                idx = ipr.link_lookup(ifname=n.ifname)[0]
                for q in ipr.get_qdiscs(index=idx):
                    if q.get("TCA_KIND") == "tbf":
                        total += q.get("TCA_STATS2").get("TCA_STATS_QUEUE")["drops"]
        return total

    def counter(self) -> int:
        """Packets the tbf qdisc(s) dropped (queue overflow past ``latency``)."""
        return self._drops() if self._active else self._last_drops

    def _undo(self) -> None:
        try:
            self._last_drops = self._drops()
        except Exception:
            pass
        errors = []
        for n in list(self._done):
            try:
                self._tc("del", n)
            except FaultError as e:
                errors.append(str(e))
            self._done.remove(n)
        if errors:
            raise FaultError("; ".join(errors))


# --------------------------------------------------------------------------- addresses

class AddrDel(NicFault):
    """ADDR-DEL: the NIC's address (``nic.addr``) is deleted; the link stays up. Undo
    re-adds the same address (plus flat-layout policy rule and routes)."""

    code = "ADDR-DEL"

    def _target(self) -> str:
        return f"{self.nic.name} {self.nic.addr}"

    def _apply(self) -> None:
        del_nic_address(self.nic, self.nic.addr)

    def _undo(self) -> None:
        add_nic_address(self.nic, self.nic.addr)


class AddrChange(Fault):
    """ADDR-DEL + re-add of a different address: ``nic.addr`` is replaced by ``new_addr``
    (same prefix length; in flat layouts the policy rule follows the address). Undo puts the
    original back. ``nic.addr`` itself is not modified; the new one is ``self.new_addr``."""

    code = "ADDR-CHANGE"

    def __init__(self, nic: Nic, new_addr: str):
        super().__init__()
        self.nic, self.new_addr = nic, _check_ip(new_addr)

    def _target(self) -> str:
        return f"{self.nic.name} {self.nic.addr}->{self.new_addr}"

    def _apply(self) -> None:
        del_nic_address(self.nic, self.nic.addr)
        try:
            add_nic_address(self.nic, self.new_addr)
        except BaseException:
            add_nic_address(self.nic, self.nic.addr)
            raise

    def _undo(self) -> None:
        del_nic_address(self.nic, self.new_addr)
        add_nic_address(self.nic, self.nic.addr)


class Reregister(NicFault):
    """REREGISTER: the host NIC's network device is removed and registered again with the same
    name, address and switch port, as a driver reload or a device reset (firmware reset, PCI
    recovery) does: the NIC comes back as a new kernel interface (a new ifindex). Applying it
    is the whole event (the NIC is back when apply() returns); undo does nothing."""

    code = "REREGISTER"

    def _apply(self) -> None:
        n = self.nic
        try:
            with netlink(n.ns) as ipr:   # deleting one end of the veth deletes the switch port too
                ipr.link("del", index=ipr.link_lookup(ifname=n.ifname)[0])
            with netlink(n.fabric_ns) as f:
                f.link("add", ifname=n.port, kind="veth", peer={"ifname": n.ifname, "net_ns_fd": n.ns})
                port = f.link_lookup(ifname=n.port)[0]
                f.link("set", index=port, master=f.link_lookup(ifname=n.bridge)[0])
                f.link("set", index=port, state="up")
            with netlink(n.ns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=n.ifname)[0], state="up")
                add_nic_address(n, n.addr, ipr)
        except TestBedError:
            raise
        except Exception as e:
            raise FaultError(f"re-registering {n.ifname} in {n.ns} failed: {e}") from e

    def _undo(self) -> None:
        pass


# --------------------------------------------------------------------------- processes

def _pid(target: Union[int, subprocess.Popen]) -> int:
    return target.pid if isinstance(target, subprocess.Popen) else int(target)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise FaultError(f"process {pid} does not exist") from None
    except PermissionError:
        raise FaultError(f"not allowed to signal process {pid}") from None


class Kill(Fault):
    """KILL: send ``sig`` (default SIGKILL) to a process (pid or Popen). A negative
    control, not a NIC fault. It cannot be reverted: undo() only records ``undone_us``."""

    code = "KILL"

    def __init__(self, target: Union[int, subprocess.Popen], sig: int = signal.SIGKILL):
        super().__init__()
        self.pid, self.sig = _pid(target), sig

    def _target(self) -> str:
        return str(self.pid)

    def _apply(self) -> None:
        _signal(self.pid, self.sig)

    def _undo(self) -> None:
        pass


class Stop(Fault):
    """STOP: SIGSTOP a process (pid or Popen) so it stalls; undo sends SIGCONT."""

    code = "STOP"

    def __init__(self, target: Union[int, subprocess.Popen]):
        super().__init__()
        self.pid = _pid(target)

    def _target(self) -> str:
        return str(self.pid)

    def _apply(self) -> None:
        _signal(self.pid, signal.SIGSTOP)

    def _undo(self) -> None:
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # the process is gone: nothing left to continue


# --------------------------------------------------------------------------- observation

@dataclass
class LinkState:
    """``ifname``, ``ns``; ``admin_up`` (IFF_UP); ``carrier`` (IFLA_CARRIER); ``operstate``
    (``UP``, ``DOWN``, ``LOWERLAYERDOWN``...); ``addrs`` the IPv4 addresses on it."""

    ifname: str
    ns: str
    admin_up: bool
    carrier: bool
    operstate: str
    addrs: List[str]


def _resolve(tb: Optional[TestBed], nic: Union[Nic, str]) -> Nic:
    if isinstance(nic, Nic):
        return nic
    if tb is None:
        raise ValueError(f"a TestBed is needed to look up NIC {nic!r}")
    return tb.nic(nic)


def _where(n: Nic, side: str) -> Tuple[str, str]:
    if side == "host":
        return n.ns, n.ifname
    if side == "port":
        return n.fabric_ns, n.port
    raise ValueError(f"side must be 'host' or 'port', got {side!r}")


def _link(ns: str, ifname: str) -> Tuple[Any, Any]:
    with netlink(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise FaultError(f"interface {ifname} not found in {ns}")
        link = ipr.get_links(idx[0])[0]
        addrs = [a.get("IFA_ADDRESS") for a in ipr.get_addr(index=idx[0], family=2)]
    return link, addrs


def nic_stats(tb: Optional[TestBed], nic: Union[Nic, str], side: str = "host") -> Tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of the NIC (``side="host"``) or of its switch port
    (``side="port"``), from netlink link stats. ``tb`` is only needed when ``nic`` is a
    name such as ``"a0"``."""
    n = _resolve(tb, nic)
    link, _ = _link(*_where(n, side))
    st = link.get("IFLA_STATS64")
    return int(st["rx_bytes"]), int(st["tx_bytes"])


def link_state(tb: Optional[TestBed], nic: Union[Nic, str], side: str = "host") -> LinkState:
    """The :class:`LinkState` of the NIC (``side="host"``) or its switch port (``"port"``)."""
    n = _resolve(tb, nic)
    ns, ifname = _where(n, side)
    link, addrs = _link(ns, ifname)
    return LinkState(ifname, ns, bool(link["flags"] & 1), bool(link.get("IFLA_CARRIER")),
                     link.get("IFLA_OPERSTATE"), addrs)
