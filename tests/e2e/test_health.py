"""End-to-end tests of the detection rules on a busy host and of probe/reconnect back-off, with
real faults on the network-namespace test bed (2 hosts x 2 NICs, one railover-perf rank per
host, ring all-reduce with every byte checked).

* a CPU hog on every core (no fault): no failover, no path down;
* a dead NIC pair during a long outage: probes (and reconnect SYNs) to it back off, counted by
  nft counters on the bridge; the repair is found and failed back within the probe back-off
  cap + hold-down + margin, with every core busy;
* switch-port repairs under a CPU hog: each one failed back (no reconnect left to the kernel's
  SYN back-off);
* a saturated rail with a deep queue is not an MTU black hole (negative control);
* a flat subnet WITHOUT policy routing: egress follows the NIC (SO_BINDTODEVICE), shown by the
  per-NIC TX counters, after the reconnects of an outage and after failback.

Bounds are generous (small shared CI machines); product targets are measured by `railover bench`.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Dict, Iterator, List, Tuple

import pytest

from railover.testbed import faults
from railover.testbed.scenario import LazyFault, Step, rank_process, run_scenario
from railover.testbed.netns import netlink, now_us

pytestmark = pytest.mark.netns

FAST = {"RAILOVER_HOLD_DOWN_MS": "1000"}


@contextlib.contextmanager
def cpu_hog(per_core: int = 1, nice: int = 0) -> Iterator[List[subprocess.Popen]]:
    """`per_core` busy-looping Python processes per CPU core (nice `nice`) for the block;
    every one is killed (by its own pid) on exit."""
    n = (os.cpu_count() or 1) * per_core
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], preexec_fn=(lambda: os.nice(nice)) if nice else None)
             for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def _nft(ns: str, script: str = None, args: List[str] = ()) -> str:
    r = subprocess.run(["ip", "netns", "exec", ns, "nft"] + (list(args) if args else ["-f", "-"]),
                       input=script, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


class BridgeCounters:
    """nft counters in the fabric bridge (counting only, before any fault's drop rule):
    per source address, full-size probes (UDP datagrams of more than 1000 bytes, counted once:
    unfragmented or their first fragment; a full-size probe is one frame of the smaller of the
    two NICs' MTUs, at most 4000 bytes of padding, so 1500 bytes on this bed's veths) and TCP
    SYNs (connect attempts)."""

    def __init__(self, fabric_ns: str, addrs: List[str]):
        self.ns, self.addrs, self.table = fabric_ns, addrs, "ro_count_health"
        rules = []
        for a in addrs:
            rules.append(f"    ip saddr {a} ip protocol udp ip frag-off & 0x1fff == 0 ip length > 1000 counter "
                         f"comment \"big {a}\"\n")
            rules.append(f"    ip saddr {a} tcp flags & (syn | ack) == syn counter comment \"syn {a}\"\n")
        _nft(self.ns, f"table bridge {self.table} {{\n  chain c {{\n    type filter hook forward priority -200; "
                      f"policy accept;\n{''.join(rules)}  }}\n}}\n")

    def read(self) -> Dict[str, int]:
        data = json.loads(_nft(self.ns, args=["-j", "list", "table", "bridge", self.table]))
        out = {}
        for o in data["nftables"]:
            r = o.get("rule")
            if not r:
                continue
            pk = next(e["counter"]["packets"] for e in r["expr"] if isinstance(e, dict) and "counter" in e)
            out[r["comment"]] = int(pk)
        return out

    def close(self) -> None:
        _nft(self.ns, args=["delete", "table", "bridge", self.table])


def _tx_bytes(tb, nics) -> Dict[str, int]:
    out = {}
    for n in nics:
        with netlink(n.ns) as ipr:
            link = ipr.get_links(ipr.link_lookup(ifname=n.ifname)[0])[0]
            out[n.name] = int(link.get("IFLA_STATS64")["tx_bytes"])
    return out


def test_cpu_hog_on_every_core_causes_no_failover(testbed):
    """A busy host is the normal case: every core saturated by other work for the whole run,
    no fault injected: no comm moves, no path is declared down."""
    tb = testbed("T2")
    with cpu_hog():
        res = run_scenario(tb, [], duration_s=20, timeout_s=240)
    assert res.wrong_bytes == 0
    assert res.count("failover") == 0, res.select("failover")
    assert res.count("path_down") == 0, res.select("path_down")
    # Not even a soft verdict: probes late on every rail at once are scheduling, not loss.
    assert res.count("pair_down") == 0, res.select("pair_down")
    late = res.select("health_late")
    print(f"health_late events: {len(late)}; max late {max([e['max_late_us'] for e in late], default=0)} us; "
          f"pair_down: {res.count('pair_down')}; peer_silence holds: {res.count('peer_silence')}")


def test_peer_descheduled_for_600ms_is_no_pair_down(testbed):
    """The peer process stops for 600 ms, twice (SIGSTOP/SIGCONT: its probe thread answers
    nothing on either rail, then wakes 600 ms late). Every rail to it goes silent at once, which
    is that peer's scheduling, not the network: no NIC pair is declared down on either side, no
    path moves. (A stop longer than max(1 s, 4 x detection) is still judged, see the stopped-
    peer test in test_failover.py.)"""
    tb = testbed("T2")
    f1 = LazyFault(lambda: faults.Stop(rank_process(tb, 1)))
    f2 = LazyFault(lambda: faults.Stop(rank_process(tb, 1)))
    steps = [Step(2, "apply", f1), Step(2.6, "undo", f1), Step(5, "apply", f2), Step(5.6, "undo", f2)]
    res = run_scenario(tb, steps, duration_s=9)
    assert res.wrong_bytes == 0
    # on failure, say how long each stop really lasted (the harness may be late on a busy host)
    # and every event from the first stop on
    stops = [round((steps[i + 1].t_us - steps[i].t_us) / 1000) for i in (0, 2)]
    why = f"stops lasted {stops} ms\n" + "\n".join(
        json.dumps(e, sort_keys=True) for e in res.events if e.get("t_us", 0) >= steps[0].t_us - 200_000)
    assert res.count("failover") == 0, why
    assert res.count("pair_down") == 0, why
    assert res.count("peer_silence") + res.count("health_late") >= 1, "the stop was seen and held, not missed"


def test_dead_pair_probes_and_reconnects_back_off_and_the_repair_is_found_on_a_busy_host(testbed):
    """A silent black hole on a0 for 20 s, every core busy. Probes to the dead pair are full
    size (one frame of the smaller MTU, 1500 bytes here; one count each on the bridge): without
    back-off that is one per 20 ms interval (~950 per side in 19 s); with the back-off capped at
    RAILOVER_PROBE_BACKOFF_MAX_MS (1 s) a few dozen. Reconnect SYNs back off too. After the
    repair, failback within cap + hold-down + margin."""
    tb = testbed("T2")
    a0, b0 = tb.nic("a0"), tb.nic("b0")
    cap_ms, hold_ms, outage_s = 1000, 1000, 20.0
    cnt = BridgeCounters(tb.fabric_ns, [a0.addr, b0.addr])
    marks: Dict[str, Tuple[int, Dict[str, int]]] = {}
    f = faults.Silent(a0)

    def tick(now_s: float) -> None:
        for name, at in (("down", 2 + 1.0), ("undo", 2 + outage_s - 0.05)):
            if name not in marks and now_s >= at:
                marks[name] = (now_us(), cnt.read())

    try:
        with cpu_hog():
            res = run_scenario(tb, [Step(2, "apply", f), Step(2 + outage_s, "undo", f)], duration_s=2 + outage_s + 8,
                               env={**FAST, "RAILOVER_PROBE_BACKOFF_MAX_MS": str(cap_ms)}, on_tick=tick,
                               timeout_s=300)
    finally:
        cnt.close()
    assert res.wrong_bytes == 0
    assert {"down", "undo"} <= set(marks), marks
    (t1, c1), (t2, c2) = marks["down"], marks["undo"]
    secs = (t2 - t1) / 1e6
    big = {a: c2[f"big {a}"] - c1[f"big {a}"] for a in (a0.addr, b0.addr)}
    syn = {a: c2[f"syn {a}"] - c1[f"syn {a}"] for a in (a0.addr, b0.addr)}
    print(f"over {secs:.1f} s of outage: full-size probes {big}, SYNs {syn}")
    for a, n in big.items():
        # at most one per cap after a short ramp (20+40+...+640 ms); without back-off ~secs/0.02
        assert n <= secs / (cap_ms / 1000) + 12, f"{a}: {n} full-size probes in {secs:.1f} s: no back-off"
        assert n >= secs / (cap_ms / 1000) * 0.5, f"{a}: {n} probes in {secs:.1f} s: the dead pair is not re-probed"
    for a, n in syn.items():
        assert n <= 60, f"{a}: {n} SYNs in {secs:.1f} s: reconnects do not back off"
    rows = res.analyze()
    assert rows[0]["failovers"] >= 1, rows
    assert rows[0]["failbacks"] >= 1, f"repair not taken back: {rows}"
    assert rows[0]["failback_ms"] <= cap_ms + hold_ms + 4000, rows
    ups = [e for e in res.select("pair_up", res.steps[1].t_us)]
    assert ups and all(int(e.get("probes_while_down", 0)) > 0 for e in ups), ups


def test_switch_port_repairs_fail_back_under_cpu_load(testbed):
    """Two switch-port outages of a0 with every core busy: each repair is taken back within the
    hold-down + margin (a reconnect left to the kernel's SYN back-off would take seconds to
    minutes)."""
    tb = testbed("T2")
    f1, f2 = faults.PortDown(tb.nic("a0")), faults.PortDown(tb.nic("a0"))
    steps = [Step(2, "apply", f1), Step(6, "undo", f1), Step(11, "apply", f2), Step(15, "undo", f2)]
    with cpu_hog():
        res = run_scenario(tb, steps, duration_s=21, env=FAST, timeout_s=300)
    assert res.wrong_bytes == 0
    rows = res.analyze()
    assert len(rows) == 2, rows
    for r in rows:
        assert r["failovers"] >= 1, rows
        assert r["failbacks"] >= 1 and r["failback_ms"] <= 1000 + 5000, f"repair not taken back in time: {rows}"


def test_saturated_deep_queue_rail_is_not_an_mtu_black_hole(testbed):
    """Negative control for size-dependent loss: rail 0 shaped to 50 Mbit/s with a 1 s deep
    tbf queue, saturated by railover's own traffic. Full-size probes are lost there more often
    than small ones, but TCP still delivers: no size-dependent verdict, and at most one move
    with no oscillation."""
    tb = testbed("T2")
    a0, b0 = tb.nic("a0"), tb.nic("b0")
    f = faults.Rate(a0, "50mbit", burst="64kb", latency="1000ms", peers=[b0])
    res = run_scenario(tb, [Step(1, "apply", f), Step(13, "undo", f)], duration_s=15, size="4M", timeout_s=240)
    assert res.wrong_bytes == 0
    sized = [e for e in res.events if "size-dependent" in e.get("cause", "")]
    assert not sized, sized[:5]
    t0, t1 = res.steps[0].t_us, res.steps[1].t_us
    for rank in (0, 1):
        fo = [e for e in res.select("failover", t0, t1) if e["rank"] == rank]
        fb = [e for e in res.select("failback", t0, t1) if e["rank"] == rank]
        causes = [e.get("cause") for e in res.select("path_down", t0, t1) if e["rank"] == rank]
        assert len(fo) <= 1 and len(fb) <= 1, f"rank {rank} oscillates between rails: {len(fo)} failovers, " \
                                               f"{len(fb)} failbacks; {causes}"
    print(f"deep queue: failovers {res.count('failover', t0, t1)}, failbacks {res.count('failback', t0, t1)}, "
          f"pair_down {res.count('pair_down', t0, t1)}, pair_queued {res.count('pair_queued', t0, t1)}, "
          f"size_loss_ignored {res.count('size_loss_ignored', t0, t1)}, "
          f"flaps {res.count('flap', t0, t1)}")


def test_flat_subnet_without_policy_routing_egress_follows_the_nic(testbed):
    """All four NICs in one subnet and only the main table's routes (no per-address policy
    routing): anything not bound to a device leaves through a0 (the first route). railover
    binds every socket to its NIC's device, so: before the fault a0 carries the traffic and a1
    only probes; during a silent black hole on a0 the standby path on a1 carries it (it would
    leave through a0 into the black hole otherwise); after repair the reconnected primary
    (a new socket, bound again) carries it through a0 and a1 is quiet. Same on host B."""
    tb = testbed("T2-flat", policy_routing=False)
    rc, rules, _ = tb.run_collect("A", ["ip", "-4", "rule", "show"])
    assert rc == 0 and all("from all lookup" in ln for ln in rules.splitlines() if ln.strip()), rules
    nics = [tb.nic(n) for n in ("a0", "a1", "b0", "b1")]
    f = faults.Silent(tb.nic("a0"))
    samples: List[Tuple[float, Dict[str, int]]] = []
    want = [2.5, 4.4, 5.5, 8.4, 12.0, 15.0]

    def tick(now_s: float) -> None:
        if want and now_s >= want[0]:
            samples.append((want.pop(0), _tx_bytes(tb, nics)))

    res = run_scenario(tb, [Step(4.5, "apply", f), Step(8.5, "undo", f)], duration_s=16, env=FAST, on_tick=tick,
                       timeout_s=240)
    assert res.wrong_bytes == 0
    assert len(samples) == 6, samples
    s = {t: c for t, c in samples}

    def delta(a: float, b: float) -> Dict[str, int]:
        return {k: s[b][k] - s[a][k] for k in s[a]}

    before, during, after = delta(2.5, 4.4), delta(5.5, 8.4), delta(12.0, 15.0)
    print(f"TX bytes before {before}\nduring a0 outage {during}\nafter failback {after}")
    # Relative bounds (a loaded host moves little data): the carrying NIC sends at least 1 MiB
    # and 8x what the other one sends (probes, SYNs, retransmissions into the black hole).
    mb = 1 << 20

    def carries(d: Dict[str, int], busy: str, idle: str) -> bool:
        return d[busy] > mb and d[busy] > 8 * d[idle]

    for p in ("a", "b"):
        assert carries(before, f"{p}0", f"{p}1"), f"primary on {p}0: {before}"
        assert carries(during, f"{p}1", f"{p}0"), f"standby {p}1 carries the outage: {during}"
        assert carries(after, f"{p}0", f"{p}1"), f"back on {p}0 after failback: {after}"
    rows = res.analyze()
    assert rows[0]["failovers"] >= 1 and rows[0]["failbacks"] >= 1, rows
    fo = res.select("failover", res.steps[0].t_us)
    assert {e["to_nic"] for e in fo if e["rank"] == 0} == {tb.nic("a1").ifname}
