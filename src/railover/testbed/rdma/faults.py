"""Fault primitives of the RDMA test bed, each with ``apply()`` and an exact ``undo()``, in the
style of :mod:`railover.testbed.faults` (same base class, same life cycle)::

    f = CablePull(bed, "a0").apply()      # or: with CablePull(bed, "a0") as f: ...
    f.applied_us, f.undone_us             # CLOCK_MONOTONIC µs of the guest the fault acts in
    f.undo()

Times are on the CLOCK_MONOTONIC of the guest the fault is applied in (``f.guest``), the clock
the plugin's journal uses inside that guest. Faults run inside the guest read the clock right
after the change took effect, in the same shell (no extra process). :class:`CablePull` acts in
QEMU (HMP ``set_link``), outside the guest: its stamp is the host time of the monitor's reply
mapped onto the guest clock through :meth:`RdmaBed.clock_offset_us`; ``stamp_error_us`` is the
uncertainty of that mapping (half the best control-port round trip).

Faults:

* :class:`CablePull`: QEMU ``set_link <nic> off`` on one end. Only that guest sees carrier
  loss (its virtio-net link goes down); the peer's NIC stays up and its frames vanish.
* :class:`AdminDown`: ``ip link set <if> down`` inside the guest.
* :class:`Silent`: nftables drop of everything in and out of the NIC (no link event), by
  default at the receiving end of each direction (``at="wire"``; see :class:`_NftFault` for
  why not in the NIC's own output path).
* :class:`OneWay`: nftables drop of packets *leaving* the NIC only (by default at its link
  partner's input).
* :class:`RoceOnly`: nftables drop of RoCE v2 packets only (UDP destination port 4791) at the
  input of both ends of the NIC's wire: the QPs' flow is cut, while the probes, the bootstrap
  streams and everything else on the rail still pass (an ECMP route or a traffic class that
  only the data uses).
* :class:`Rate`: tbf rate limit on the NIC's egress.
* :class:`Flap`: ``count`` cable pulls of ``down_ms`` each, ``up_ms`` apart (apply returns
  when the last one was undone; ``cycles`` holds each cycle's guest-clock stamps).
* :class:`AddrChange`: the NIC's IPv4 address is replaced (the RoCE v2 GID follows it).
* :class:`Stop`: SIGSTOP the processes of one name in a guest (a stopped rank); undo SIGCONT.

Errors: apply() raises :class:`FaultError` naming the command, the guest and its stderr.
"""
from __future__ import annotations

import re
import secrets
import time
from typing import Dict, List, Optional, Tuple, Union

from railover.testbed.faults import Fault, FaultError
from railover.testbed.netns import now_us
from railover.testbed.rdma.bed import RdmaBed, RdmaBedError, RdmaNic

__all__ = ["FaultError", "GuestFault", "CablePull", "AdminDown", "Silent", "OneWay", "RoceOnly", "Rate", "Flap",
           "AddrChange", "Stop", "NFT_PLACES", "guest_link", "nft_tables_in", "parse_tc_stats"]


class GuestFault(Fault):
    """Base of RDMA-bed faults on one NIC. ``bed``, ``nic`` (:class:`RdmaNic`), ``guest`` (the
    host label whose clock ``applied_us``/``undone_us`` use)."""

    def __init__(self, bed: RdmaBed, nic: Union[str, RdmaNic]):
        super().__init__()
        self.bed, self.nic = bed, bed.nic(nic)
        self.guest = self.nic.host
        self.stamp_error_us = 0
        self._stamp: Optional[int] = None

    def _namespaces(self) -> List[str]:
        return []

    def _target(self) -> str:
        return self.nic.name

    def _sh(self, script: str, what: str, host: Optional[str] = None) -> int:
        """Run ``script`` in guest ``host`` (default: the fault's guest) and read that guest's
        clock right after it; returns the stamp (µs). Raises FaultError with the guest's
        stderr."""
        host = host or self.guest
        rc, out, err = self.bed.sh(host, f"set -e\n{script}\nro_now; echo \"RO_STAMP $RO_NOW\"\n", timeout_s=120)
        m = re.search(r"RO_STAMP (\d+)", out)
        if rc != 0 or not m:
            raise FaultError(f"{what} in guest {host} failed (exit {rc}): {err.strip()[-500:]}")
        return int(m.group(1)) // 1000

    def apply(self) -> "Fault":
        super().apply()
        if self._stamp is not None:
            self.applied_us = self._stamp
        return self

    def undo(self) -> None:
        was = self.active
        super().undo()
        if was and self._stamp is not None:
            self.undone_us = self._stamp


class CablePull(GuestFault):
    """CABLE-PULL: the virtual cable of ``nic`` is pulled at that NIC (QEMU HMP ``set_link
    <netdev> off`` on its guest). The guest sees NO-CARRIER, the peer sees nothing. Undo:
    ``set_link <netdev> on``."""

    code = "CABLE-PULL"

    def _hmp_stamp(self, state: str) -> int:
        off, err = self.bed.clock_offset_us(self.guest, samples=3)
        t0 = now_us()
        out = self.bed.hmp(self.guest, f"set_link {self.nic.netdev} {state}")
        t1 = now_us()
        if out.strip():
            raise FaultError(f"QEMU set_link {self.nic.netdev} {state} on {self.guest}: {out.strip()}")
        self.stamp_error_us = err + (t1 - t0)
        return t0 + off  # the change happens between t0 and t1; stamp its earliest moment

    def _apply(self) -> None:
        self._stamp = self._hmp_stamp("off")

    def _undo(self) -> None:
        self._stamp = self._hmp_stamp("on")


class AdminDown(GuestFault):
    """ADMIN-DOWN: ``ip link set <if> down`` in the NIC's guest; undo sets it up (the
    address stays; the kernel re-adds the connected route)."""

    code = "ADMIN-DOWN"

    def _apply(self) -> None:
        self._stamp = self._sh(f"ip link set dev {self.nic.ifname} down", "ip link set down")

    def _undo(self) -> None:
        self._stamp = self._sh(f"ip link set dev {self.nic.ifname} up", "ip link set up")


#: where an nftables fault drops (``at=``): "wire" at the receiving end of each direction it cuts
#: (the link partner's input), "host" in the NIC's own guest (its output and input hooks)
NFT_PLACES = ("wire", "host")


class _NftFault(GuestFault):
    """Base of the nftables faults. ``at="wire"`` (default) drops each cut direction where its
    frames *arrive*: at the input hook of the guest on the far end of the wire. ``at="host"``
    drops in the NIC's own guest, on the way out as well (the original form).

    Why "wire" is the default (6.1 guests): rxe treats a packet its own host drops on the way out
    (netfilter OUTPUT) as a local transmit failure and resends it at once, in a loop in the
    kernel, so the whole guest stalls. Measured
    with ``scripts/rdma_nft_stall.py`` (``ib_write_bw`` streaming from a0 at 64 KiB, the cut held
    8 s, 2 rounds): with the cut in A's output hook the rule dropped 800,900 and 864,038 packets
    (about 100,000 resends a second) and a thread in A waking every 5 ms saw gaps of 1.8 and
    1.7 s (user CPU 0.14-0.15, system 0.40-0.51); with the same cut at B's input it dropped
    15,346 and 15,946 and the largest gap was 0.02 s (user 0.85-0.92); no fault: 0.06-0.07 s.
    A real RoCE or InfiniBand HCA never passes the host's netfilter; a black hole or a dead
    transmitter is in the wire or the fabric, which the far end's input drop models without
    that artefact.

    The fault's clock (``guest``) is the NIC's guest whichever guest the rules run in; a stamp
    taken in the other guest is mapped onto it through :meth:`RdmaBed.clock_offset_us`
    (``stamp_error_us`` adds both mappings' uncertainty). ``applied_us`` is the earliest rule's
    stamp, ``undone_us`` the latest removal's."""

    kind = "nft"

    def __init__(self, bed: RdmaBed, nic: Union[str, RdmaNic], at: str = "wire"):
        super().__init__(bed, nic)
        if at not in NFT_PLACES:
            raise ValueError(f"at must be one of {', '.join(NFT_PLACES)}, got {at!r}")
        self.at = at
        self.table = f"ro_{self.kind}_{secrets.token_hex(3)}"
        self._last_count = 0
        self._hosts_with_table: List[str] = []

    def _rules(self) -> List[Tuple[str, str, str]]:
        """(guest, hook, match) triples: each a chain of this fault's table in that guest."""
        raise NotImplementedError

    def _in_wire(self, nic: RdmaNic) -> Tuple[str, str, str]:
        """The rule that drops what arrives at ``nic`` from its wire."""
        return (nic.host, "input", f'iifname "{nic.ifname}"')

    def _to_own_clock(self, host: str, stamp: int) -> int:
        mapped, err = self.bed.map_clock_us(stamp, host, self.guest)
        self.stamp_error_us = max(self.stamp_error_us, err)
        return mapped

    def _apply(self) -> None:
        by_host: Dict[str, List[Tuple[str, str]]] = {}
        for host, hook, match in self._rules():
            by_host.setdefault(host, []).append((hook, match))
        stamps: List[Tuple[str, int]] = []
        try:
            self._add_tables(by_host, stamps)
            # mapped once every rule is in place: a guest that stops answering here still
            # leaves no half-applied fault behind
            self._stamp = min(self._to_own_clock(h, t) for h, t in stamps)
        except Exception as e:
            left = self._drop_tables()  # no half-applied fault left behind
            if left:
                raise FaultError(f"{e}; and this fault's rules could not be removed again: {'; '.join(left)}") from e
            raise

    def _drop_tables(self) -> List[str]:
        """Delete this fault's table in every guest that has it (each one tried); returns one
        line per guest where that failed (it stays listed in ``_hosts_with_table``)."""
        failed = []
        for host in list(self._hosts_with_table):
            try:
                rc, _, err = self.bed.run(host, ["nft", "delete", "table", "inet", self.table], timeout_s=60)
            except Exception as e:  # a guest that stopped answering: the others are still cleaned
                rc, err = -1, str(e).splitlines()[0] if str(e) else type(e).__name__
            if rc == 0:
                self._hosts_with_table.remove(host)
            else:
                failed.append(f"guest {host}: {err.strip()[-300:]}")
        return failed

    def _add_tables(self, by_host: Dict[str, List[Tuple[str, str]]], stamps: List[Tuple[str, int]]) -> None:
        for host, rules in by_host.items():
            body = []
            for chain, (hook, match) in enumerate(rules):
                body.append(f"  chain c{chain} {{\n    type filter hook {hook} priority -300; policy accept;\n"
                            f"    {match} counter drop\n  }}\n")
            # inet family, input/output/forward hooks: rxe's UDP/4791 traffic passes them like any
            # other locally sent or received packet
            script = f"table inet {self.table} {{\n{''.join(body)}}}"
            stamp = self._sh(f"nft -f - <<'EOF'\n{script}\nEOF", f"nft add table {self.table}", host)
            self._hosts_with_table.append(host)
            stamps.append((host, stamp))

    def hosts(self) -> List[str]:
        """The guests this fault's rules run in."""
        return sorted({h for h, _, _ in self._rules()})

    def counter(self) -> int:
        """Packets dropped by this fault's rules (all guests); after undo the count read just
        before."""
        if not self.active:
            return self._last_count
        total = 0
        for host in self._hosts_with_table:
            rc, out, err = self.bed.run(host, ["nft", "list", "table", "inet", self.table], timeout_s=60)
            if rc != 0:
                raise FaultError(f"nft list table {self.table} in {host}: {err.strip()}")
            total += sum(int(x) for x in re.findall(r"counter packets (\d+)", out))
        return total

    def _undo(self) -> None:
        try:
            self._last_count = self.counter()
        except FaultError:
            pass
        stamps: List[Tuple[str, int]] = []
        failed = []
        for host in list(self._hosts_with_table):  # every guest tried, even after a failure
            try:
                stamps.append((host, self._sh(f"nft delete table inet {self.table}", f"nft delete table {self.table}",
                                              host)))
                self._hosts_with_table.remove(host)
            except (FaultError, RdmaBedError, TimeoutError) as e:
                failed.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
        if failed:  # the fault stays active, with the guests whose rules are still in place
            raise FaultError("; ".join(failed))
        self._stamp = max(self._to_own_clock(h, t) for h, t in stamps) if stamps else None


class Silent(_NftFault):
    """SILENT: every packet into or out of the NIC is dropped, with no carrier or port event
    (rxe's UDP/4791 traffic included). ``at="wire"``: at the input of both ends of its wire (this
    NIC's and its link partner's); ``at="host"``: input, output and forward hooks in the NIC's
    guest. Undo deletes the table(s)."""

    code, kind = "SILENT", "silent"

    def _rules(self):
        n = self.nic
        if self.at == "wire":
            peer = self.bed.peer(n)
            return [self._in_wire(n), self._in_wire(peer)]
        i = n.ifname
        return [(n.host, "input", f'iifname "{i}"'), (n.host, "output", f'oifname "{i}"'),
                (n.host, "forward", f'iifname "{i}"')]


class OneWay(_NftFault):
    """ONEWAY: what leaves the NIC is lost; what arrives still gets in. ``at="wire"``: dropped
    at the input of its link partner (the far end never receives it: a dead transmitter, a
    one-way optic); ``at="host"``: nftables output hook in the NIC's guest."""

    code, kind = "ONEWAY", "oneway"

    def _rules(self):
        n = self.nic
        if self.at == "wire":
            return [self._in_wire(self.bed.peer(n))]
        return [(n.host, "output", f'oifname "{n.ifname}"')]


#: the UDP destination port of RoCE v2 (IANA), every RoCE v2 packet's; rxe uses it too
ROCE_V2_UDP_PORT = 4791


class RoceOnly(_NftFault):
    """ROCE: only RoCE v2 packets (UDP destination port 4791: the QPs' data, their ACKs and
    control messages) are dropped, in both directions, at the input of both ends of the NIC's
    wire (``at="wire"``) or in the NIC's guest (``at="host"``: input and output). Nothing else on
    the rail is touched: railover's UDP probes and the TCP bootstrap streams go on, so the
    health layer sees a working rail and only the transport's own silence tells (the
    flow-stall rule, ``RAILOVER_FLOW_STALL_MS``). What it stands for on a real fabric: an ECMP
    route hashed from a QP's UDP source port that black-holes, or a stuck traffic class that
    only the RDMA traffic uses (``NCCL_IB_TC``)."""

    code, kind = "ROCE", "roce"

    def _rules(self):
        n = self.nic
        roce = f"udp dport {ROCE_V2_UDP_PORT}"
        if self.at == "wire":
            return [(h, hook, f"{m} {roce}") for h, hook, m in (self._in_wire(n), self._in_wire(self.bed.peer(n)))]
        return [(n.host, "input", f'iifname "{n.ifname}" {roce}'), (n.host, "output", f'oifname "{n.ifname}" {roce}')]


class Rate(GuestFault):
    """RATE: tbf on the NIC's egress (``rate`` e.g. ``"10mbit"``, ``burst`` bytes, ``latency_ms``
    queue bound). Undo removes the root qdisc (back to the default)."""

    code = "RATE"

    def __init__(self, bed: RdmaBed, nic: Union[str, RdmaNic], rate: str = "10mbit", burst: int = 32768,
                 latency_ms: int = 50):
        super().__init__(bed, nic)
        if not re.fullmatch(r"\d+(\.\d+)?([kmg]?bit|[kmg]?bps)", rate):
            raise ValueError(f"bad rate {rate!r} (e.g. 10mbit, 500kbit)")
        self.rate, self.burst, self.latency_ms = rate, int(burst), int(latency_ms)
        self._last_stats: Dict[str, int] = {}

    def _target(self) -> str:
        return f"{self.nic.name} {self.rate}"

    def _apply(self) -> None:
        self._stamp = self._sh(f"tc qdisc add dev {self.nic.ifname} root tbf rate {self.rate} burst {self.burst} "
                               f"latency {self.latency_ms}ms", "tc qdisc add tbf")

    def stats(self) -> Dict[str, int]:
        """The tbf qdisc's counters now (:func:`parse_tc_stats`: ``sent_bytes``, ``sent_packets``,
        ``dropped``, ``overlimits`` (packets the shaper held back: the queue was used),
        ``backlog_packets``); after undo, those read just before it. Raises FaultError."""
        if not self.active:
            return dict(self._last_stats)
        rc, out, err = self.bed.run(self.guest, ["tc", "-s", "qdisc", "show", "dev", self.nic.ifname, "root"],
                                    timeout_s=60)
        st = parse_tc_stats(out) if rc == 0 else None
        if st is None:
            raise FaultError(f"tc -s qdisc show dev {self.nic.ifname} in {self.guest} (exit {rc}): {(out + err).strip()}")
        return st

    def counter(self) -> int:
        """Packets the tbf qdisc dropped (its queue overflowed past ``latency_ms``)."""
        return self.stats()["dropped"]

    def _undo(self) -> None:
        try:
            self._last_stats = self.stats()
        except FaultError:
            pass
        self._stamp = self._sh(f"tc qdisc del dev {self.nic.ifname} root", "tc qdisc del")


class AddrChange(GuestFault):
    """ADDR-CHANGE: ``nic.addr`` is replaced by ``new_addr`` (same prefix length); rxe's RoCE v2
    GID follows the address. Undo restores the original address."""

    code = "ADDR-CHANGE"

    def __init__(self, bed: RdmaBed, nic: Union[str, RdmaNic], new_addr: str):
        super().__init__(bed, nic)
        if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", new_addr):
            raise ValueError(f"not an IPv4 address: {new_addr!r}")
        self.new_addr = new_addr

    def _target(self) -> str:
        return f"{self.nic.name} {self.nic.addr}->{self.new_addr}"

    def _swap(self, old: str, new: str) -> int:
        i, p = self.nic.ifname, self.nic.prefixlen
        return self._sh(f"ip addr del {old}/{p} dev {i}\nip addr add {new}/{p} dev {i}", f"address {old} -> {new}")

    def _apply(self) -> None:
        self._stamp = self._swap(self.nic.addr, self.new_addr)

    def _undo(self) -> None:
        self._stamp = self._swap(self.new_addr, self.nic.addr)


class Flap(GuestFault):
    """FLAP: ``count`` cable pulls at the NIC, each ``down_ms`` long and ``up_ms`` apart.
    apply() returns when the last pull has been undone; ``cycles`` lists ``(down_us, up_us)``
    on the guest clock; undo() only restores the cable if an apply was interrupted."""

    code = "FLAP"

    def __init__(self, bed: RdmaBed, nic: Union[str, RdmaNic], count: int = 3, down_ms: int = 500,
                 up_ms: int = 1000):
        super().__init__(bed, nic)
        if count < 1 or down_ms < 0 or up_ms < 0:
            raise ValueError("count >= 1, down_ms >= 0, up_ms >= 0")
        self.count, self.down_ms, self.up_ms = count, down_ms, up_ms
        self.cycles: List[Tuple[int, int]] = []
        self._pull = CablePull(bed, nic)

    def _apply(self) -> None:
        self.cycles = []
        for k in range(self.count):
            self._pull.apply()
            _hold(self.down_ms)
            self._pull.undo()
            assert self._pull.applied_us is not None and self._pull.undone_us is not None
            self.cycles.append((self._pull.applied_us, self._pull.undone_us))
            if k + 1 < self.count:
                _hold(self.up_ms)
        self.stamp_error_us = self._pull.stamp_error_us
        self._stamp = self.cycles[0][0]

    def _undo(self) -> None:
        self._pull.undo()
        self._stamp = self.cycles[-1][1] if self.cycles else None


class Stop(GuestFault):
    """STOP: SIGSTOP every process named ``name`` (``railover-perf``: the ranks) in guest
    ``host``; the kernel and its HCA keep running, so RC acknowledgements still flow but the
    process answers nothing. Undo sends SIGCONT to the same pids. ``pids`` lists them; apply()
    raises FaultError when no such process runs."""

    code = "STOP"

    def __init__(self, bed: RdmaBed, host: str, name: str = "railover-perf"):
        Fault.__init__(self)
        if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", name):
            raise ValueError(f"bad process name {name!r}")
        self.bed, self.guest, self.name = bed, bed.host(host).name, name
        self.nic = None  # type: ignore[assignment]
        self.stamp_error_us = 0
        self._stamp: Optional[int] = None
        self.pids: List[int] = []

    def _target(self) -> str:
        return f"{self.name} in {self.guest}"

    def _apply(self) -> None:
        comm = self.name[:15]  # the kernel's comm holds the first 15 characters
        script = (f"pids=; for p in /proc/[0-9]*; do read -r c <$p/comm 2>/dev/null || continue; "
                  f"if [[ $c == {comm} ]]; then pids+=\" ${{p#/proc/}}\"; fi; done\n"
                  f"[[ -n $pids ]] || {{ echo 'no process named {self.name}' >&2; exit 1; }}\n"
                  f"kill -STOP $pids\necho \"RO_PIDS$pids\"")
        rc, out, err = self.bed.sh(self.guest, f"set -e\n{script}\nro_now; echo \"RO_STAMP $RO_NOW\"\n", timeout_s=120)
        m, p = re.search(r"RO_STAMP (\d+)", out), re.search(r"RO_PIDS ([\d ]+)", out)
        if rc != 0 or not m or not p:
            raise FaultError(f"SIGSTOP {self.name} in guest {self.guest} failed (exit {rc}): {err.strip()[-500:]}")
        self.pids = [int(x) for x in p.group(1).split()]
        self._stamp = int(m.group(1)) // 1000

    def states(self) -> Dict[int, str]:
        """pid -> its state letter now (``T`` stopped, ``S``/``R`` running; pids gone are left out)."""
        script = "".join(f"read -r a b c _ </proc/{p}/stat 2>/dev/null && echo \"{p} $c\"; " for p in self.pids)
        rc, out, _ = self.bed.sh(self.guest, script + "true", timeout_s=60)
        return {int(a): b for a, b in (ln.split() for ln in out.splitlines() if len(ln.split()) == 2)}

    def _undo(self) -> None:
        # a pid that ended meanwhile is no error (the kill of that pid fails, the others go on)
        self._stamp = self._sh("kill -CONT " + " ".join(map(str, self.pids)) + " 2>/dev/null || true", "SIGCONT")


def parse_tc_stats(out: str) -> Optional[Dict[str, int]]:
    """Counters of the first qdisc in ``tc -s qdisc show`` output: ``sent_bytes``,
    ``sent_packets``, ``dropped``, ``overlimits``, ``requeues``, ``backlog_packets``; None when
    the text has no statistics line."""
    m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+) requeues (\d+)\)", out)
    if not m:
        return None
    b = re.search(r"backlog \S+ (\d+)p", out)
    keys = ("sent_bytes", "sent_packets", "dropped", "overlimits", "requeues")
    st = {k: int(v) for k, v in zip(keys, m.groups())}
    st["backlog_packets"] = int(b.group(1)) if b else 0
    return st


def _hold(ms: int) -> None:
    """Keep a fault in place for ``ms`` (the fault's duration, not a synchronisation)."""
    end = time.monotonic() + ms / 1000.0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def guest_link(bed: RdmaBed, nic: Union[str, RdmaNic]) -> dict:
    """``{"admin_up", "carrier", "operstate", "addrs", "port_state", "gid1"}`` of the NIC as
    its guest sees it (sysfs and the rxe port)."""
    n = bed.nic(nic)
    i, d = n.ifname, n.rdma_dev
    script = (f"read -r fl </sys/class/net/{i}/flags; read -r op </sys/class/net/{i}/operstate; "
              f"c=$(cat /sys/class/net/{i}/carrier 2>/dev/null || echo x); "
              f"read -r ps </sys/class/infiniband/{d}/ports/1/state; read -r g </sys/class/infiniband/{d}/ports/1/gids/1; "
              f"echo \"$fl|$c|$op|$ps|$g\"; ip -4 -o addr show dev {i}")
    rc, out, err = bed.sh(n.host, script, timeout_s=60)
    if rc != 0:
        raise FaultError(f"reading link state of {n.name} in {n.host}: {err.strip()}")
    first, *rest = out.strip().split("\n")
    fl, c, op, ps, g = first.split("|")
    addrs = [m for line in rest for m in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", line)]
    return {"admin_up": bool(int(fl, 16) & 1), "carrier": c.strip() == "1", "operstate": op.strip(),
            "addrs": addrs, "port_state": ps.strip(), "gid1": g.strip()}


def nft_tables_in(bed: RdmaBed, host: str) -> List[str]:
    """Names of the nft tables in a guest."""
    rc, out, err = bed.run(host, ["nft", "list", "tables"], timeout_s=60)
    if rc != 0:
        raise FaultError(f"nft list tables in {host}: {err.strip()}")
    return re.findall(r"table \S+ (\S+)", out)
