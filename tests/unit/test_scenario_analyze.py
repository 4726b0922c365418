"""ScenarioResult.analyze(): each fault's row counts its own events, not a later fault's."""
from __future__ import annotations

from pathlib import Path

from railover.testbed.scenario import ScenarioResult, Step


class _Fault:
    def __init__(self, code):
        self.code = code


def _ev(t_us, event, **kw):
    return dict(t_us=t_us, event=event, rank=0, **kw)


def test_failbacks_are_counted_per_fault_until_the_next_one():
    a, b = _Fault("port-down a0"), _Fault("silent b0")
    steps = [Step(3, "apply", a, t_us=3_000_000), Step(8, "undo", a, t_us=8_000_000),
             Step(13, "apply", b, t_us=13_000_000), Step(18, "undo", b, t_us=18_000_000)]
    events = ([_ev(3_010_000, "nic_down")] + [_ev(3_020_000 + i, "failover") for i in range(4)]
              + [_ev(10_600_000 + i, "failback") for i in range(4)]           # the port-down's four
              + [_ev(13_500_000, "pair_down")] + [_ev(13_600_000 + i, "failover") for i in range(4)]
              + [_ev(20_700_000 + i, "failback") for i in range(3)])          # three of the silent's
    res = ScenarioResult(perf=None, steps=steps, events=events, buckets=[], started_us=0, workdir=Path("."))
    rows = res.analyze()
    assert [r["failovers"] for r in rows] == [4, 4]
    assert [r["failbacks"] for r in rows] == [4, 3], "a fault's row counted a later fault's failbacks"
    assert rows[0]["failback_ms"] == 2600.0
    assert rows[1]["failback_ms"] == 2700.0


def test_bytes_resent_by_failbacks_are_counted_apart_from_the_failovers():
    """A failback is a RESUME: what the receiver did not hold is sent again, and the demo
    reports it beside the failover's resend (it was left out)."""
    a = _Fault("port-down a0")
    steps = [Step(3, "apply", a, t_us=3_000_000), Step(8, "undo", a, t_us=8_000_000)]
    events = [_ev(3_010_000, "nic_down"), _ev(3_020_000, "failover", bytes_resent=1000),
              _ev(3_020_001, "failover", bytes_resent=24), _ev(10_600_000, "failback", bytes_resent=512),
              _ev(10_600_001, "failback", bytes_resent=0)]
    rows = ScenarioResult(perf=None, steps=steps, events=events, buckets=[], started_us=0, workdir=Path(".")).analyze()
    assert rows[0]["bytes_resent"] == 1024 and rows[0]["failback_bytes_resent"] == 512


def _buckets(t0_us, t1_us, gaps):
    """1 ms buckets from t0 to t1 with bytes in each, except in the [start, end) µs ranges of ``gaps``."""
    return [(t, 0 if any(s <= t < e for s, e in gaps) else 4096) for t in range(t0_us, t1_us, 1000)]


def test_the_stall_is_the_gap_the_fault_caused_not_host_jitter_after_convergence():
    """A fault's stall is the longest delivery gap that began before every comm it moved had
    resumed, counted in full; a longer gap that began after that (a rank descheduled on a busy
    host) is not the fault's. Without any failover the whole 5 s window counts, as for the
    baseline run with failover disabled."""
    a = _Fault("port-down a0")
    steps = [Step(3, "apply", a, t_us=3_000_000)]
    # the fault's gap: 3.005 s to 3.035 s (30 ms), across both comms' failovers (3.020, 3.030);
    # host jitter: 3.500 s to 3.580 s (80 ms), after convergence; normal gap before: 12 ms
    buckets = _buckets(0, 9_000_000, [(2_500_000, 2_512_000), (3_005_000, 3_035_000), (3_500_000, 3_580_000)])
    events = [_ev(3_010_000, "nic_down"), dict(_ev(3_020_000, "failover"), comm="1"),
              dict(_ev(3_030_000, "failover"), comm="2")]
    rows = ScenarioResult(perf=None, steps=steps, events=events, buckets=[buckets], started_us=0,
                          workdir=Path(".")).analyze()
    assert rows[0]["stall_ms"] == 30.0, "host jitter after the comms converged was counted as the fault's stall"
    assert rows[0]["baseline_gap_ms"] == 12.0
    # comm 1's first standby was bad too: it resumed again at 3.6 s, so the gap at 3.5 s began
    # before the fault's last failover and is the fault's
    again = events + [dict(_ev(3_600_000, "failover"), comm="1")]
    rows = ScenarioResult(perf=None, steps=steps, events=again, buckets=[buckets], started_us=0,
                          workdir=Path(".")).analyze()
    assert rows[0]["stall_ms"] == 80.0
    # the same delivery without a failover: every gap in the window is the fault's
    rows = ScenarioResult(perf=None, steps=steps, events=[_ev(3_010_000, "nic_down")], buckets=[buckets],
                          started_us=0, workdir=Path(".")).analyze()
    assert rows[0]["stall_ms"] == 80.0


def test_a_gap_that_began_before_convergence_counts_in_full():
    from railover import perf
    buckets = _buckets(0, 1_000_000, [(100_000, 400_000)])
    assert perf.longest_gap_ms(buckets, 0, 1_000_000, begun_by=150_000) == 300.0
    assert perf.longest_gap_ms(buckets, 0, 1_000_000, begun_by=100_000) == 0.0  # begun at, not before
    assert perf.longest_gap_ms(buckets, 0, 300_000) == 200.0  # cut at the window's end
