"""End-to-end failover with real faults: 2 hosts x 2 NICs (T2, one switch per rail), one
railover-perf rank per host running a ring all-reduce over the plugin, every byte checked.

Pass bounds (generous: CI machines are small and shared):
T_carrier <= 1 s for carrier/admin/address faults, T_silent <= 3 s for black holes and one-way
loss, a clean error within the fatal timeout + 5 s when no path is left. Product targets are
much tighter and are measured by `railover bench`, not here.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from railover.testbed import faults
from railover.testbed.scenario import LazyFault, Step, rank_process, run_scenario
from railover.testbed.netns import _ns_sysctl, netlink

pytestmark = pytest.mark.netns

T_CARRIER_MS = 1000
T_SILENT_MS = 3000
FAST = {"RAILOVER_HOLD_DOWN_MS": "1000"}


def _one_failover(res, bound_ms, failback=True):
    rows = res.analyze()
    assert res.wrong_bytes == 0
    r = rows[0]
    assert r["failovers"] >= 1, f"no failover recorded: {rows}\n{res.events[-20:]}"
    assert r["convergence_ms"] is not None and r["convergence_ms"] <= bound_ms, rows
    assert r["detection_ms"] is not None and r["detection_ms"] <= r["convergence_ms"], rows
    if failback:
        assert r["failbacks"] >= 1, f"no failback after repair: {rows}"
        # the hold-down (1 s) is included; back-off and the probe that proves the repair add a little
        assert r["failback_ms"] <= 1000 + 4000, rows
    return r


@pytest.mark.parametrize("side", ["a0", "b0"])
def test_switch_port_down_at_either_end(testbed, side):
    tb = testbed("T2")
    f = faults.PortDown(tb.nic(side))
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=11, env=FAST)
    _one_failover(res, T_CARRIER_MS)
    # the journal names the NIC and the cause
    downs = [e for e in res.events if e["event"] in ("nic_down", "path_down")]
    assert any(side in e.get("nic", "") for e in downs) or any("reported its NIC" in e.get("cause", "") for e in res.events)


def test_repaired_nic_resolves_its_neighbours_at_once(testbed):
    """Failback after a switch port repair does not wait for ARP. While a0's port is down, A's
    neighbour entry for b0 cannot resolve; with ARP retransmissions every 30 s on a0 the kernel
    alone would keep the repaired rail dark for up to 30 s. railover clears the failed entries
    when the NIC comes back, so both comms fail back one hold-down after the repair."""
    tb = testbed("T2")
    a0 = tb.nic("a0")
    _ns_sysctl(a0.ns, {f"net.ipv4.neigh.{a0.ifname}.retrans_time_ms": 30000})
    f = faults.PortDown(a0)
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=10, env=FAST)
    r = _one_failover(res, T_CARRIER_MS)
    undo = r["undo_t_us"]
    ups = [e for e in res.events if e["event"] == "nic_up" and e["t_us"] >= undo]
    assert any(int(e.get("neigh_cleared", 0)) >= 1 for e in ups), f"no unresolved neighbour cleared: {ups}"
    first_fb = {}
    for e in res.events:
        if e["event"] == "failback" and e["t_us"] >= undo:
            first_fb.setdefault(e["comm"], e["t_us"])
    assert len(first_fb) >= 2, f"both ranks' send comms fail back: {first_fb}"
    worst_ms = (max(first_fb.values()) - undo) / 1e3
    # hold-down 1000 ms + generous slack, far below the 30 s ARP retransmission
    assert worst_ms <= 1000 + 2000, f"last failback {worst_ms:.0f} ms after the repair"


def test_host_nic_admin_down(testbed):
    tb = testbed("T2")
    f = faults.HostDown(tb.nic("a0"))
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=11, env=FAST)
    r = _one_failover(res, T_CARRIER_MS)
    assert any(e["event"] == "nic_down" and e.get("signal") == "admin down" for e in res.events)


def test_address_removed_then_restored(testbed):
    tb = testbed("T2")
    f = faults.AddrDel(tb.nic("b0"))
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=11, env=FAST)
    _one_failover(res, T_CARRIER_MS)
    assert any(e["event"] == "nic_down" and e.get("signal") == "address removed" for e in res.events)


def test_nic_reregistered_by_a_driver_reload(testbed):
    """A driver reload or device reset removes a0's network device and registers it again:
    same name, address and link, a new ifindex. The comms fail over at the removal and fail
    back once the NIC is back (the health monitor follows the NIC by name, re-opens its probe
    socket and the transport listens on the new device)."""
    tb = testbed("T2")
    f = faults.Reregister(tb.nic("a0"))
    # undo does nothing: it marks when the NIC was back, for the failback bound
    res = run_scenario(tb, [Step(2, "apply", f), Step(2.5, "undo", f)], duration_s=11, env=FAST)
    _one_failover(res, T_CARRIER_MS)
    a0 = tb.nic("a0").ifname
    assert any(e["event"] == "nic_down" and e["nic"] == a0 for e in res.events)
    assert any(e["event"] == "nic_up" and e["nic"] == a0 for e in res.events)
    # both ranks' send comms fail back: B's through A's listener and probe socket on the new device
    assert {e["rank"] for e in res.events if e["event"] == "failback"} == {0, 1}, res.events[-20:]


def test_failback_between_nics_of_different_mtu(testbed):
    """a0 has jumbo frames (MTU 9000, its switch ports too), b0 the standard 1500: TCP works
    (each end sends segments the other's MSS allows), so after b0's port comes back both comms
    fail back. A down pair is re-probed with full-size probes only, so they must fit the
    smaller of the two MTUs: a 4000-byte probe from a0 is one frame b0 cannot take (before
    2026-12-06 the rail never came back, on either host)."""
    tb = testbed("T2")
    a0, b0 = tb.nic("a0"), tb.nic("b0")
    with netlink(a0.fabric_ns) as f:
        for n in (a0, b0):
            f.link("set", index=f.link_lookup(ifname=n.port)[0], mtu=9000)
    with netlink(a0.ns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=a0.ifname)[0], mtu=9000)
    f = faults.PortDown(b0)
    res = run_scenario(tb, [Step(2, "apply", f), Step(4, "undo", f)], duration_s=11, env=FAST)
    _one_failover(res, T_CARRIER_MS)
    assert {e["rank"] for e in res.events if e["event"] == "failback"} == {0, 1}, res.events[-20:]


def test_silent_black_hole(testbed):
    tb = testbed("T2")
    f = faults.Silent(tb.nic("b0"))
    res = run_scenario(tb, [Step(2, "apply", f), Step(6, "undo", f)], duration_s=13, env=FAST)
    r = _one_failover(res, T_SILENT_MS)
    assert not any(e["event"] == "nic_down" for e in res.events), "a black hole has no carrier event"


def test_one_way_loss(testbed):
    tb = testbed("T2")
    # B's traffic to A on rail 0 is dropped; A -> B still works.
    f = faults.OneWay(tb.nic("b0"), tb.nic("a0").addr)
    res = run_scenario(tb, [Step(2, "apply", f), Step(6, "undo", f)], duration_s=13, env=FAST)
    _one_failover(res, T_SILENT_MS)
    # both directions of the affected ring hop moved: each rank failed over its send comm
    fo_ranks = {e["rank"] for e in res.select("failover", res.analyze()[0]["t_us"])}
    assert fo_ranks, res.events[-10:]


def test_flapping_link_grows_hold_down_and_limits_switches(testbed):
    tb = testbed("T2")
    steps = []
    f = faults.HostDown(tb.nic("a0"))
    t = 2.0
    for _ in range(4):  # down 0.5 s, up 1.0 s
        steps += [Step(t, "apply", f), Step(t + 0.5, "undo", f)]
        t += 1.5
    res = run_scenario(tb, steps, duration_s=t + 8, env={"RAILOVER_HOLD_DOWN_MS": "1000"})
    assert res.wrong_bytes == 0
    first = steps[0].t_us
    fos = res.select("failover", first)
    fbs = res.select("failback", first)
    # Flap budget: at most 2 switches per hold-down window (1 s) per comm.
    for comm in {e["comm"] for e in fos + fbs}:
        ts = sorted(e["t_us"] for e in fos + fbs if e["comm"] == comm)
        for i in range(len(ts) - 2):
            assert ts[i + 2] - ts[i] > 1_000_000, f"3 switches within 1 s for comm {comm}: {ts}"
    assert res.count("flap", first) >= 1, "the repeated failures are reported as flaps"
    grown = [int(e["hold_down_ms"]) for e in res.select("flap", first)]
    assert max(grown) > 1000
    # once it stops flapping, traffic returns to the primary
    last_undo = steps[-1].t_us
    assert res.count("failback", last_undo) >= 1


def test_long_outage_is_retried_with_capped_backoff_then_fails_back(testbed):
    tb = testbed("T2")
    f = faults.Silent(tb.nic("a0"))
    env = {"RAILOVER_HOLD_DOWN_MS": "500", "RAILOVER_BACKOFF_MAX_MS": "400"}  # compressed: cap 0.4 s
    res = run_scenario(tb, [Step(2, "apply", f), Step(12, "undo", f)], duration_s=19, env=env)
    r = _one_failover(res, T_SILENT_MS, failback=False)
    # retried all along: reconnect attempts never stop, so the repair is noticed within cap + hold + probe
    assert r["failbacks"] >= 1, res.analyze()
    assert r["failback_ms"] <= 400 + 500 + 3000, res.analyze()


@pytest.mark.parametrize("kind", ["HostDown", "Silent"])
def test_both_nics_down_shorter_than_the_fatal_timeout_recovers_without_loss(testbed, kind):
    """Both of A's NICs lost for 10 s (carrier: HostDown; a silent black hole of both: Silent),
    longer than every detection and back-off step but within RAILOVER_FATAL_TIMEOUT (60 s):
    recovery never gives up, so after the repair every comm resumes where it stopped, the job
    completes with every byte, and nothing is fatal."""
    tb = testbed("T2")
    cls = getattr(faults, kind)
    fa0, fa1 = cls(tb.nic("a0")), cls(tb.nic("a1"))
    env = {"RAILOVER_FATAL_TIMEOUT": "60", "RAILOVER_HOLD_DOWN_MS": "1000", "RAILOVER_BACKOFF_MAX_MS": "1000"}
    steps = [Step(2, "apply", fa0), Step(2, "apply", fa1), Step(12, "undo", fa0), Step(12, "undo", fa1)]
    res = run_scenario(tb, steps, duration_s=22, env=env, timeout_s=120)
    assert res.wrong_bytes == 0
    assert [r.returncode for r in res.perf.ranks] == [0, 0], [r.stderr[-2000:] for r in res.perf.ranks]
    assert not res.select("fatal"), res.select("fatal")
    repair = steps[2].t_us
    # every send comm that lost its path resumed after the repair (a failover or recovery onto a
    # reconnected path: with no path left there is nothing to move to before it)
    lost = {e["comm"] for e in res.select("path_down") if e.get("dir") == "send" and e.get("active")}
    assert lost, "the fault took no active path down"
    resumed = {e["comm"] for ev in ("failover", "recover", "failback") for e in res.select(ev, repair)}
    assert lost <= resumed, (lost, resumed)


def test_both_nics_down_is_a_clean_error_within_the_fatal_timeout(testbed):
    tb = testbed("T2")
    fa0, fa1 = faults.HostDown(tb.nic("a0")), faults.HostDown(tb.nic("a1"))
    env = {"RAILOVER_FATAL_TIMEOUT": "4"}
    res = run_scenario(tb, [Step(2, "apply", fa0), Step(2, "apply", fa1)], duration_s=30, env=env,
                       expect_failure=True, timeout_s=60)
    assert not res.perf.timed_out, "never a silent hang"
    assert any(r.returncode not in (0, None) for r in res.perf.ranks), [r.returncode for r in res.perf.ranks]
    t_fault = min(s.t_us for s in res.steps)
    bound = (4 + 5) * 1_000_000
    first_fatal = {}
    for rank in (0, 1):
        fatal = [e for e in res.select("fatal") if e["rank"] == rank]
        if fatal:
            first_fatal[rank] = fatal[0]["t_us"]
            assert 4_000_000 <= fatal[0]["t_us"] - t_fault <= bound, fatal[0]
            err = res.perf.ranks[rank].stderr
            assert "no usable path" in err and "ncclSystemError" in err, err[-2000:]
        else:
            # No rank is left waiting: one whose peer gave up first stops with it (the driver
            # reports that it stopped early because its peer exited).
            js = res.perf.ranks[rank].json or {}
            assert js.get("stopped_early"), f"rank {rank}: neither a fatal error nor an early stop: {js.get('warnings')}"
    assert first_fatal, "at least one rank's plugin returned the fatal error"
    # the WARN names the local NICs and the peer
    msg = res.select("fatal")[0]["message"]
    r = res.select("fatal")[0]["rank"]
    assert tb.hosts[r].nics[0].ifname in msg and tb.hosts[1 - r].nics[0].addr in msg, msg
    assert res.wrong_bytes == 0


def test_abort_on_fatal_exits_the_process_with_one_line(testbed):
    """RAILOVER_ABORT_ON_FATAL=1 (for JAX/XLA, which have no collective watchdog): the same
    fatal as above ends the process with status 70 and one stderr line naming the path and the
    cause, instead of returning ncclSystemError to the caller."""
    tb = testbed("T2")
    fa0, fa1 = faults.HostDown(tb.nic("a0")), faults.HostDown(tb.nic("a1"))
    env = {"RAILOVER_FATAL_TIMEOUT": "3", "RAILOVER_ABORT_ON_FATAL": "1"}
    res = run_scenario(tb, [Step(2, "apply", fa0), Step(2, "apply", fa1)], duration_s=30, env=env,
                       expect_failure=True, timeout_s=60)
    assert not res.perf.timed_out, "never a silent hang"
    aborted = [r for r in res.perf.ranks if r.returncode == 70]
    assert aborted, [(r.returncode, r.stderr[-500:]) for r in res.perf.ranks]
    for r in aborted:
        lines = [ln for ln in r.stderr.splitlines() if "RAILOVER_ABORT_ON_FATAL=1: exiting" in ln]
        assert len(lines) == 1, r.stderr[-3000:]
        assert "no usable path" in lines[0] and "peer" in lines[0], lines[0]
        assert any(n.ifname in lines[0] for h in tb.hosts for n in h.nics), lines[0]
        assert "ncclSystemError" not in r.stderr, "the call did not return: the process exited"


# ---------------------------------------------------------------- negative controls: no failover


def _events_since(res, offset_us: int = 0) -> str:
    """The journal events from ``offset_us`` after the first step on, one JSON line each: why
    the engine moved, for a failed assertion."""
    t0 = (res.steps[0].t_us or 0) + offset_us
    return "\n".join(json.dumps(e, sort_keys=True) for e in res.events if e.get("t_us", 0) >= t0)


def test_stopped_peer_is_not_a_nic_failure(testbed):
    tb = testbed("T2")
    f = LazyFault(lambda: faults.Stop(rank_process(tb, 1)))  # SIGSTOP the rank on host B for 3 s
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=10)
    assert res.wrong_bytes == 0
    # on failure, say why the engine moved (seen once in a CI pre-check with a second test
    # suite running beside it; not reproduced alone or beside 4 busy loops)
    why = _events_since(res, -1_000_000)
    assert res.count("failover") == 0, why
    assert res.count("path_down") == 0, why


def test_rate_limited_primary_is_not_a_failure(testbed):
    tb = testbed("T2")
    fa, fb = faults.Rate(tb.nic("a0"), "100mbit"), faults.Rate(tb.nic("b0"), "100mbit")
    res = run_scenario(tb, [Step(1, "apply", fa), Step(1, "apply", fb)], duration_s=8, size="1M")
    assert res.wrong_bytes == 0
    assert res.count("failover") == 0, _events_since(res)


def test_saturating_competing_traffic_is_not_a_failure(testbed):
    tb = testbed("T2")
    b0, a0 = tb.nic("b0"), tb.nic("a0")
    srv = tb.run("B", ["iperf3", "-s", "-1", "-B", b0.addr, "-p", "5299"], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
    try:
        class Flood(faults.Fault):
            code = "FLOOD"

            def _apply(self):
                self.p = tb.run("A", ["iperf3", "-c", b0.addr, "-B", a0.addr, "-p", "5299", "-t", "6", "-P", "4"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def _undo(self):
                if self.p.poll() is None:
                    self.p.terminate()
                self.p.wait(timeout=10)

        f = Flood()
        res = run_scenario(tb, [Step(1, "apply", f), Step(7.5, "undo", f)], duration_s=9)
        assert res.wrong_bytes == 0
        assert res.count("failover") == 0, res.select("failover")
    finally:
        if srv.poll() is None:
            srv.terminate()
        srv.wait(timeout=10)


# ---------------------------------------------------------------- more field cases


def test_no_backup_black_hole_is_a_clean_error(testbed):
    """No backup: railover restricted to rail 0; a silent black hole must end in an attributable
    error within the fatal timeout + 5 s, never a hang."""
    tb = testbed("T2")
    f = faults.Silent(tb.nic("a0"))
    only_rail0 = {r: {"RAILOVER_IFNAMES": "=" + tb.hosts[r].nics[0].ifname} for r in (0, 1)}
    res = run_scenario(tb, [Step(2, "apply", f)], duration_s=30, env={"RAILOVER_FATAL_TIMEOUT": "3"},
                       rank_envs=only_rail0, expect_failure=True, timeout_s=60)
    assert not res.perf.timed_out
    assert any(r.returncode not in (0, None) for r in res.perf.ranks)
    fatal = res.select("fatal")
    assert fatal, res.events[-10:]
    assert fatal[0]["t_us"] - res.steps[0].t_us <= (3 + 5) * 1_000_000
    assert res.count("no_standby") >= 1, "a comm without redundancy is reported at connect (no standby)"
    assert res.wrong_bytes == 0


def test_size_dependent_black_hole_fails_over(testbed):
    """Size-dependent black hole: frames above 1200 bytes vanish on rail 0 while small packets pass: the stalled
    data triggers full-size probes, which fail, so the pair is down for size-dependent loss."""
    tb = testbed("T2")
    f = faults.BigDrop(tb.nic("a0"), 1200, peers=[tb.nic("b0")])
    res = run_scenario(tb, [Step(2, "apply", f), Step(7, "undo", f)], duration_s=14, env=FAST)
    _one_failover(res, T_SILENT_MS)
    causes = " ".join(e.get("cause", "") for e in res.events)
    assert "size-dependent" in causes, causes[-2000:]


def test_flat_subnet_port_down_uses_the_other_nic(testbed):
    """Flat subnet: all four NICs in one subnet (T2-flat); connections are source-bound to their NIC,
    so a port down on a0 moves traffic to a1 and back after repair."""
    tb = testbed("T2-flat")
    f = faults.PortDown(tb.nic("a0"))
    res = run_scenario(tb, [Step(2, "apply", f), Step(5, "undo", f)], duration_s=11, env=FAST)
    _one_failover(res, T_CARRIER_MS)
    fo = res.select("failover", res.steps[0].t_us)
    assert {e["to_nic"] for e in fo if e["rank"] == 0} == {tb.nic("a1").ifname}


def test_dead_nic_never_repaired(testbed):
    """Dead NIC never repaired: 2 ranks per host, a0 admin down with its address flushed for good: every comm of
    both local ranks moves to rail 1 and the job completes with correct data."""
    tb = testbed("T2")
    down, addr = faults.HostDown(tb.nic("a0")), faults.AddrDel(tb.nic("a0"))
    res = run_scenario(tb, [Step(2, "apply", down), Step(2, "apply", addr)], duration_s=8, ranks_per_host=2,
                       env=FAST)
    assert res.wrong_bytes == 0
    t0 = res.steps[0].t_us
    moved = {e["rank"] for e in res.select("failover", t0)}
    assert {0, 2} <= moved, res.select("failover", t0)  # both ranks on host A
    assert max(e["convergence_us"] for e in res.select("failover", t0)) <= T_CARRIER_MS * 1000


def test_peer_nic_address_change_is_relearned(testbed):
    """Address change: B's rail-1 NIC moves to a new address. Only rail 1 is touched (no failover on
    rail 0); A learns the new address from B's notice and reconnects its standby there, so a
    later port-down on rail 0 still fails over to rail 1."""
    tb = testbed("T2")
    b1 = tb.nic("b1")
    new_addr = b1.addr.rsplit(".", 1)[0] + ".22"
    move = faults.AddrChange(b1, new_addr)
    port = faults.PortDown(tb.nic("a0"))
    res = run_scenario(tb, [Step(1.5, "apply", move), Step(5, "apply", port), Step(8, "undo", port)],
                       duration_s=14, env=FAST)
    assert res.wrong_bytes == 0
    t_move, t_port = res.steps[0].t_us, res.steps[1].t_us
    assert res.count("failover", t_move, t_port) == 0, "rail 0 carried on untouched"
    moved = [e for e in res.select("peer_addr_change", t_move) if e["rank"] == 0]
    assert moved and moved[0]["new"] == new_addr, res.events[-20:]
    ups = [e for e in res.select("path_up", t_move, t_port) if e["rank"] == 0 and e.get("dir") == "send"]
    assert any(e["peer"] == new_addr for e in ups), "A's standby reconnected to B's new address"
    fo = [e for e in res.select("failover", t_port) if e["rank"] == 0]
    assert fo and fo[0]["peer"] == new_addr and fo[0]["convergence_us"] <= T_CARRIER_MS * 1000, fo


def test_new_connections_while_a_nic_flaps(testbed):
    """Lazy connect during a flap: the driver keeps opening new connections (NCCL's lazy connect) while the
    standby rail flaps; no connection setup fails and no byte is wrong."""
    tb = testbed("T2")
    f = faults.HostDown(tb.nic("a1"))
    steps = []
    for i in range(4):
        steps += [Step(1.0 + 2 * i, "apply", f), Step(2.0 + 2 * i, "undo", f)]
    res = run_scenario(tb, steps, duration_s=11, size="1M", env=FAST, extra_args=["--reconnect-every", "10"])
    assert res.wrong_bytes == 0
    js = res.perf.ranks[0].json
    assert js["stats"]["reconnects"] >= 3, js["stats"]
    assert not js["errors"], js["errors"]


def test_receiver_that_posts_nothing_for_seconds_is_not_a_failure(testbed):
    """Negative control: rank 1 stops posting and testing receives for 3 s (its process and
    health thread run on); the sender stalls behind full buffers, probes keep answering: no
    path switch, and everything completes afterwards."""
    tb = testbed("T2")
    res = run_scenario(tb, [], duration_s=9, extra_args=["--pause-recv", "1:2:3"])
    assert res.wrong_bytes == 0
    assert res.count("failover") == 0, res.select("failover")
    assert res.count("path_down") == 0, res.select("path_down")
    gap = res.longest_gap_ms(res.started_us, res.started_us + 9_000_000, rank=1)
    assert gap >= 2000, f"the pause really stopped rank 1's receives (longest gap {gap} ms)"


def test_aggressive_probes_under_congestion_are_not_a_dead_peer(testbed):
    """Negative control for the peer-gone verdict: probe settings far too aggressive for the
    load (1 ms x 2, stall 2 ms) on rails rate-limited in both directions. Paths may be fenced
    and reconnected, even all at once; both processes stay alive, so no rank may get an
    error (in particular not "the peer process exited") and every byte arrives."""
    tb = testbed("T2")
    rates = [faults.Rate(tb.nic(n), "60mbit") for n in ("a0", "a1", "b0", "b1")]
    env = {"RAILOVER_PROBE_INTERVAL_MS": "1", "RAILOVER_PROBE_MULT": "2", "RAILOVER_STALL_MS": "2",
           "RAILOVER_HOLD_DOWN_MS": "200"}
    res = run_scenario(tb, [Step(1, "apply", f) for f in rates] + [Step(9, "undo", f) for f in rates],
                       duration_s=10, env=env, size="1M")
    assert res.wrong_bytes == 0
    assert res.count("fatal") == 0, res.select("fatal")
    assert all(r.returncode == 0 for r in res.perf.ranks), [(r.returncode, r.stderr[-1500:]) for r in res.perf.ranks]
    assert not any((r.json or {}).get("stopped_early") for r in res.perf.ranks)


def test_orderly_close_is_never_a_fault(testbed):
    """Both ranks run, then close every comm in order (railover-perf closes with requests still
    in flight, as NCCL's teardown does). Neither side may journal the closes as path_down, flap
    or failover, and nothing reconnects afterwards."""
    tb = testbed("T2")
    res = run_scenario(tb, [], duration_s=4, size="1M")
    assert res.wrong_bytes == 0
    assert all(r.returncode == 0 for r in res.perf.ranks), [(r.returncode, r.stderr[-1500:]) for r in res.perf.ranks]
    # From the end of the timed run on (both ranks' clocks are CLOCK_MONOTONIC, as the journal's)
    # only the teardown happens.
    ends = [int(((r.json or {}).get("timeseries") or {}).get("end_us") or 0) for r in res.perf.ranks]
    assert all(ends), [r.json for r in res.perf.ranks]
    t_close = min(ends)
    for ev in ("path_down", "flap", "failover", "fatal"):
        assert res.count(ev, t_close) == 0, res.select(ev, t_close)
    reopened = [e for e in res.select("path_up", t_close) if e.get("dir") == "send"]
    assert not reopened, f"a path was re-opened after the close: {reopened}"


def test_killed_peer_is_an_error_within_5s_not_a_nic_failure(testbed):
    """Killed peer: every rail to the peer closes and nobody listens any more. railover must not
    take that for a NIC failure and loop on the standby: the survivor gets an error within 5 s
    saying the peer process exited."""
    tb = testbed("T2")
    f = LazyFault(lambda: faults.Kill(rank_process(tb, 1)))
    res = run_scenario(tb, [Step(2, "apply", f)], duration_s=30, expect_failure=True, timeout_s=60)
    t_kill = res.steps[0].t_us
    fatal = [e for e in res.select("fatal", t_kill) if e["rank"] == 0]
    stopped = (res.perf.ranks[0].json or {}).get("stopped_early")
    assert fatal or stopped, res.events[-15:]
    if fatal:
        assert fatal[0]["t_us"] - t_kill <= 5_000_000, fatal[0]
        assert "peer process exited" in fatal[0]["message"]
    assert res.count("failover", t_kill) <= 1, "no loop over the standby rail"
    assert not res.perf.timed_out


# ---------------------------------------------------------------- a stream the peer dropped silently


def _wait_until(cond, timeout_s: float, what: str) -> None:
    import time
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)  # polling a condition with a deadline, not a wait for time to pass


def test_a_receive_stream_the_receiver_dropped_silently_is_found_by_the_keepalive(testbed):
    """The CI failure of stop 30, made deterministic. The receiver (rank 1 on B) loses the
    streams of its receive comm without a FIN or a RST reaching the sender (rank 0 on A): rank 1
    is stopped once A's kernel has nothing unacknowledged toward it, its accepted streams are
    destroyed (ss -K) with every RST leaving B dropped, then it continues. Traffic is one way
    (rank 0 -> rank 1), so no data of rank 0 is due to reach B until its sends complete: its
    streams are idle, all acknowledged, and its probes are answered, so by the stopped-peer rule
    it keeps the path. Without a keepalive it would wait for completions that never come until
    the request timeout; the keepalive (RAILOVER_TCP_KEEPALIVE_S) draws a reset from B's kernel,
    rank 0 reconnects and resends, and every byte arrives. (With RAILOVER_TCP_KEEPALIVE_S=0
    this scenario fails: rank 1 ends on its request timeout; checked by hand when written.)"""
    import signal
    tb = testbed("T2")
    state = {}

    def listen_ports(host: str, pid: int):
        rc, out, _ = tb.run_collect(host, ["ss", "-ltnpH"])
        assert rc == 0, out
        return sorted({int(ln.split()[3].rsplit(":", 1)[1]) for ln in out.splitlines() if f"pid={pid}," in ln})

    def in_flight_toward(host: str, ports) -> int:
        flt = " or ".join(f"dport = :{p}" for p in ports)
        rc, out, _ = tb.run_collect(host, ["ss", "-tinH", "state", "established", f"( {flt} )"])
        assert rc == 0, out
        return sum(1 for tok in out.split() if tok.startswith(("unacked:", "notsent:")))

    class DropReceiveStreamsSilently(faults.Fault):
        code = "SILENT-DROP"

        def _apply(self):
            rx = rank_process(tb, 1)
            ports = listen_ports("B", rx.pid)
            assert ports, "rank 1 listens nowhere"
            os.kill(rx.pid, signal.SIGSTOP)
            try:
                # nothing of rank 0 in flight toward B (else its retransmission would meet B's
                # reset with no keepalive at all): B's kernel still acknowledges while stopped
                _wait_until(lambda: in_flight_toward("A", ports) == 0, 20, "A's streams to B acknowledged")
                rules = ("table inet rosilent {\n chain out {\n type filter hook output priority 0;\n"
                         " tcp flags & rst == rst drop\n }\n}\n")
                rc, out, err = tb.run_collect("B", ["nft", "-f", "-"], input=rules)
                assert rc == 0, err
                flt = " or ".join(f"sport = :{p}" for p in ports)
                rc, out, err = tb.run_collect("B", ["ss", "-K", "-tnH", "state", "established", f"( {flt} )"])
                assert rc == 0, err
                state["killed"] = len([ln for ln in out.splitlines() if ln.strip()])
                rc, _, err = tb.run_collect("B", ["nft", "delete", "table", "inet", "rosilent"])
                assert rc == 0, err
            finally:
                os.kill(rx.pid, signal.SIGCONT)

        def _undo(self):
            pass

    f = DropReceiveStreamsSilently()
    env = {"RAILOVER_TCP_KEEPALIVE_S": "2", "RAILOVER_HOLD_DOWN_MS": "1000"}
    res = run_scenario(tb, [Step(3, "apply", f)], duration_s=12, workload="sendrecv", size="64K", env=env,
                       extra_args=["--pattern", "oneway"], timeout_s=120)
    assert state.get("killed", 0) >= 1, "ss -K destroyed no stream: the test proves nothing"
    assert res.wrong_bytes == 0
    t0 = res.steps[0].t_us
    downs = [e for e in res.select("path_down", t0) if e.get("dir") == "send" and e["rank"] == 0]
    assert downs, res.events[-30:]
    assert any("reset" in e.get("cause", "").lower() for e in downs), downs
    failovers = res.select("failover", t0)
    assert failovers and failovers[0]["bytes_resent"] > 0, failovers
    assert not res.select("fatal"), res.select("fatal")
