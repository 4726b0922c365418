"""wait_event (rdma_helpers): what a bed test's wait for a tool's event does when the event never
comes. Runs without the bed (fake guest processes; no rdma mark)."""
from __future__ import annotations

import json
import time

import pytest

from railover.testbed.rdma import bed as rbed

from rdma_helpers import wait_event


class FakeProc:
    """Stands in for a GuestProc: ``lines`` its stdout's JSON events, ``rc`` its exit status,
    ``crash`` a GuestCrash its poll() raises (as GuestProc.poll() does through the bed's check)."""

    def __init__(self, name="recv", bed=None):
        self.name, self.lines, self.rc, self.crash, self.polls = name, [], None, None, 0
        self.bed, self.host, self.argv = bed, "B", ["railover-verbs-xfer", "recv"]

    @property
    def returncode(self):
        return self.rc

    def poll(self):
        self.polls += 1
        if self.crash is not None:
            raise self.crash
        return self.rc

    def stdout(self):
        return "".join(json.dumps(e) + "\n" for e in self.lines)

    def stderr(self):
        return f"{self.name} stderr"

    def json_lines(self):
        return list(self.lines)

    def __repr__(self):
        return f"<FakeProc {self.name}>"


def test_returns_the_first_event():
    p = FakeProc()
    p.lines = [{"ev": "broken", "n": 1}, {"ev": "fenced", "n": 2}, {"ev": "fenced", "n": 3}]
    assert wait_event(p, "fenced", 5, "the fence")["n"] == 2


def test_a_guest_crash_is_raised_at_once_not_waited_out():
    p, other = FakeProc(), FakeProc("send")
    other.crash = rbed.GuestCrash("A", "kernel crash on the console: BUG: kernel NULL pointer dereference")
    t0 = time.monotonic()
    with pytest.raises(rbed.GuestCrash):
        wait_event(p, "fenced", 60, "the fence", other, interval_s=0.01)
    assert time.monotonic() - t0 < 5


def test_a_tool_that_exits_without_the_event_fails_at_once_with_its_output():
    p = FakeProc()
    p.lines, p.rc = [{"ev": "error", "message": "boom"}], 1
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as ei:
        wait_event(p, "fenced", 60, "the receiver to fence", interval_s=0.01)
    assert time.monotonic() - t0 < 5
    assert "boom" in str(ei.value) and "recv stderr" in str(ei.value) and "ended (1)" in str(ei.value)


def test_another_process_may_end_while_its_guest_is_checked():
    p, other = FakeProc(), FakeProc("send")
    other.rc = 3  # e.g. the sender fenced its own broken path and exited
    polls = {"n": 0}

    def later():
        polls["n"] += 1
        return [{"ev": "fenced", "n": 1}] if polls["n"] > 3 else []
    p.json_lines = later
    assert wait_event(p, "fenced", 5, "the fence", other, interval_s=0.01)["n"] == 1
    assert other.polls >= 1


def test_an_event_written_just_before_the_exit_counts():
    p = FakeProc()
    calls = {"n": 0}
    real = p.json_lines

    def late():  # empty at the first read, there once the exit is seen
        calls["n"] += 1
        return real() if calls["n"] > 1 else []
    p.json_lines = late
    p.lines, p.rc = [{"ev": "fenced", "n": 7}], 3
    assert wait_event(p, "fenced", 5, "the fence")["n"] == 7


class FakeBed:
    def __init__(self):
        self.runs = []

    def run(self, host, argv, timeout_s=120.0):
        self.runs.append((host, list(argv)))
        return 0, "pid 41: railover-verbs-xfer recv\n  task 41 State: D (disk sleep) wchan=rxe_modify_qp\n", ""


def test_a_timeout_names_the_wait_and_shows_the_output_and_the_kernel_view():
    bed = FakeBed()
    p = FakeProc(bed=bed)
    p.lines = [{"ev": "progress", "arrived": 12}]
    with pytest.raises(TimeoutError) as ei:
        wait_event(p, "fenced", 0.2, "the receiver to fence", interval_s=0.05)
    msg = str(ei.value)
    assert "waiting for the receiver to fence" in msg and '"arrived": 12' in msg and "still run" in msg
    # the guest is asked about the tool's threads (by the tool's name) and its kernel log
    assert bed.runs and bed.runs[0][0] == "B" and bed.runs[0][1][-1] == "railover-verbs-xfer"
    assert "wchan=rxe_modify_qp" in msg


def test_a_failing_kernel_view_does_not_hide_the_timeout():
    p = FakeProc()  # no bed: the view cannot be read
    with pytest.raises(TimeoutError) as ei:
        wait_event(p, "fenced", 0.1, "the receiver to fence", interval_s=0.05)
    assert "waiting for the receiver to fence" in str(ei.value) and "could not read" in str(ei.value)
