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
