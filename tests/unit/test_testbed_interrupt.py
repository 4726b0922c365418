"""`railover testbed up` / ``TestBed.up()`` interrupted (Ctrl-C, SIGINT) at any step of the
build leaves nothing behind, and a namespace that does exist is named with the command that
removes it. No real namespace is made: a fake stands in for pyroute2's netns module, /run/netns,
netlink and the sysctls, and raises KeyboardInterrupt at a chosen step."""
from __future__ import annotations

import os
import select
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional, Set

import pytest
from typer.testing import CliRunner

from railover.cli import app
from railover.testbed import netns

from cli_text import text

PREFIX = "rotest"


class _FakeIPRoute:
    """Enough of pyroute2's IPRoute for ``TestBed._build`` (isolated layouts)."""

    def link(self, *a, **k):
        return []

    def link_lookup(self, **k):
        return [1]

    def addr(self, *a, **k):
        return []

    def get_links(self):
        return []


class FakeNetns:
    """pyroute2's netns module and /run/netns as a set of names. Each build step is recorded in
    :attr:`steps`; the one named ``interrupt_at`` raises KeyboardInterrupt after its own effect
    (a namespace being created exists then: Ctrl-C arrived as pyroute2's child had made it)."""

    def __init__(self, interrupt_at: Optional[str] = None, existing: Set[str] = frozenset()):
        self.interrupt_at = interrupt_at
        self.existing: Set[str] = set(existing)
        self.steps: List[str] = []

    def step(self, name: str) -> None:
        self.steps.append(name)
        if name == self.interrupt_at:
            raise KeyboardInterrupt

    def create(self, ns: str) -> None:
        if ns in self.existing:
            raise FileExistsError(17, "File exists")
        self.existing.add(ns)
        self.step(f"create {ns}")

    def remove(self, ns: str) -> None:
        if ns not in self.existing:
            raise FileNotFoundError(2, "No such file or directory")
        self.existing.discard(ns)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeNetns":
        write_json = netns._write_json

        def write_state(path: Path, data: dict) -> None:
            write_json(path, data)
            self.step("state file")

        @contextmanager
        def netlink(ns: str):
            if ns not in self.existing:
                raise netns.TestBedError(f"network namespace {ns!r} does not exist")
            self.step(f"netlink {ns}")
            yield _FakeIPRoute()

        monkeypatch.setattr(netns, "ensure_privileges", lambda allow_userns=True: "root")
        monkeypatch.setattr(netns, "_netns_mod", lambda: self)
        monkeypatch.setattr(netns, "_list_netns", lambda: sorted(self.existing))
        monkeypatch.setattr(netns, "_ns_sysctl", lambda ns, values: self.step(f"sysctl {ns}"))
        monkeypatch.setattr(netns, "_kill_ns_processes", lambda ns, timeout_s=2.0: None)
        monkeypatch.setattr(netns, "ns_pids", lambda ns: [])
        monkeypatch.setattr(netns, "netlink", netlink)
        monkeypatch.setattr(netns, "_write_json", write_state)
        monkeypatch.setattr(netns.TestBed, "ready", lambda self_: self.step("ready") or True)
        return self


def _state_files() -> List[str]:
    d = Path(os.environ["RAILOVER_TESTBED_STATE"])   # the test's own (tests/conftest.py)
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_the_fake_builds_and_tears_down_a_bed(monkeypatch):
    fake = FakeNetns().install(monkeypatch)
    tb = netns.TestBed("T2", prefix=PREFIX).up()
    assert fake.existing == {f"{PREFIX}-nsSW", f"{PREFIX}-nsA", f"{PREFIX}-nsB"} and _state_files() == [f"{PREFIX}.json"]
    tb.down()
    assert fake.existing == set() and _state_files() == []
    assert fake.steps[0] == "state file" and fake.steps[-1] == "ready" and len(fake.steps) >= 8, fake.steps


def _steps(monkeypatch) -> List[str]:
    with monkeypatch.context() as m:
        fake = FakeNetns().install(m)
        netns.TestBed("T2", prefix=PREFIX).up().down()
        return fake.steps


def test_ctrl_c_at_any_step_of_the_build_leaves_nothing_behind(monkeypatch):
    """Ctrl-C just after pyroute2 had made a namespace left it behind (it was recorded for the
    teardown only after create() returned), and one just after the state file was written left
    that file (the teardown's try began after it)."""
    handler = signal.getsignal(signal.SIGINT)
    for step in _steps(monkeypatch):
        with monkeypatch.context() as m:
            fake = FakeNetns(interrupt_at=step).install(m)
            tb = netns.TestBed("T2", prefix=PREFIX)
            with pytest.raises(KeyboardInterrupt):
                tb.up()
            assert fake.existing == set(), f"Ctrl-C at {step!r} left {sorted(fake.existing)} behind"
            assert _state_files() == [], f"Ctrl-C at {step!r} left {_state_files()} behind"
            assert not tb.is_up and tb not in netns._ACTIVE, step
            assert signal.getsignal(signal.SIGINT) is handler, f"Ctrl-C at {step!r} kept the bed's SIGINT handler"
            assert tb.down() is None   # idempotent


def _another_thread_takes_sigint() -> bool:
    """Whether a thread of this process other than the caller leaves SIGINT unblocked (its
    SigBlk mask in /proc), so that the kernel may hand a process-wide SIGINT to it."""
    me = threading.get_native_id()
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:  # the thread ended
            continue
        blocked = next((int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("SigBlk:")), 0)
        if not blocked & (1 << (signal.SIGINT - 1)):
            return True
    return False


def _ctrl_c_in_the_middle() -> None:
    """SIGINT to this process, as Ctrl-C would send it, from inside a held step. Alone (no other
    thread takes it), the process keeps it pending (the step blocks it) until the step ends.
    Otherwise the kernel hands it to another thread, which runs Python's C-level handler
    whenever it is next scheduled: on a busy host that came after the step had ended, and the
    interrupt landed in a later step (a flaky test). So this returns only once that handler ran
    (it writes to the wakeup fd), then gives the main thread bytecode to run the Python-level
    handler in. The bound only turns a hang into a failure."""
    waits = _another_thread_takes_sigint()
    r, w = os.pipe()
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        if waits:
            ready, _, _ = select.select([r], [], [], 60)
            assert ready, "no thread of this process ran the SIGINT handler in 60 s"
    finally:
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
    for _ in range(1000):  # bytecode for the interpreter to run a pending handler in
        pass


def _interrupted_build(monkeypatch) -> None:
    """Brings a bed up with a Ctrl-C sent in the middle of its first namespace's creation, and
    asserts that the build unwound (KeyboardInterrupt, nothing left behind) with no creation cut
    short: every creation that began, ended."""
    fake = FakeNetns().install(monkeypatch)
    begun: List[str] = []
    completed: List[str] = []

    def create(ns: str) -> None:
        begun.append(ns)
        if len(begun) == 1:
            _ctrl_c_in_the_middle()
        fake.existing.add(ns)
        completed.append(ns)

    monkeypatch.setattr(fake, "create", create)
    with pytest.raises(KeyboardInterrupt):
        netns.TestBed("T2", prefix=PREFIX).up()
    assert begun[0] == f"{PREFIX}-nsSW" and completed == begun, "Ctrl-C cut a namespace's creation short"
    assert fake.existing == set() and _state_files() == []


def test_a_real_sigint_during_a_namespace_creation_waits_until_it_is_complete(monkeypatch):
    """pyroute2 creates a namespace in a forked child; Ctrl-C reaches both, and one that cut
    the creation short left a half-made namespace. The signal is held until create() returns,
    then unwinds the build, which removes the namespace."""
    _interrupted_build(monkeypatch)


def test_a_real_sigint_during_a_namespace_creation_waits_while_another_thread_runs(monkeypatch):
    """The same with another thread in the process (a test runner's, a library's): the kernel
    hands the process-wide SIGINT to that thread, which does not block it, and Python then ran
    its handler in the main thread in the middle of the creation. It must still wait."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        _interrupted_build(monkeypatch)
    finally:
        stop.set()
        other.join(10)


def test_testbed_up_interrupted_while_building_says_so_and_exits_130(monkeypatch):
    FakeNetns(interrupt_at=f"create {PREFIX}-nsA").install(monkeypatch)
    r = CliRunner().invoke(app, ["testbed", "up", "--prefix", PREFIX])
    assert r.exit_code == 130, (r.exception, r.output)
    assert "interrupted while building test bed rotest" in text(r) and "removed" in text(r), text(r)
    assert "Aborted" not in r.output and "Traceback" not in r.output


def test_a_namespace_left_behind_is_named_with_the_command_that_removes_it(monkeypatch):
    fake = FakeNetns(existing={f"{PREFIX}-nsSW"}).install(monkeypatch)
    r = CliRunner().invoke(app, ["testbed", "up", "--prefix", PREFIX])
    assert r.exit_code == 2, (r.exception, r.output)
    assert (f"network namespace {PREFIX}-nsSW already exists: left behind by test bed {PREFIX}" in text(r)
            and f"remove it with 'railover testbed down --prefix {PREFIX}'" in text(r)), text(r)
    assert fake.existing == {f"{PREFIX}-nsSW"}, "a namespace the run did not make was removed"
    assert fake.steps == [] and _state_files() == []


def test_a_namespace_of_a_live_bed_is_not_offered_for_removal(monkeypatch):
    fake = FakeNetns(existing={f"{PREFIX}-nsSW", f"{PREFIX}-nsA"}).install(monkeypatch)
    state = Path(os.environ["RAILOVER_TESTBED_STATE"]) / f"{PREFIX}.json"   # this process owns that bed
    netns._write_json(state, {"prefix": PREFIX, "pid": os.getpid(), "pid_start": netns._proc_starttime(os.getpid()),
                              "namespaces": [f"{PREFIX}-nsSW", f"{PREFIX}-nsA"], "layout": "T2", "mode": "root"})
    fake.steps.clear()
    try:
        with pytest.raises(netns.TestBedError) as ei:
            netns.TestBed("T2", prefix=PREFIX).up()
        assert state.exists(), "the refused bed must not touch the live bed's state file"
    finally:
        state.unlink()
    msg = str(ei.value)
    assert f"network namespace {PREFIX}-nsSW already exists (and {PREFIX}-nsA): test bed {PREFIX} is up (owner pid " \
           f"{os.getpid()})" in msg and "testbed down" not in msg, msg
    assert fake.existing == {f"{PREFIX}-nsSW", f"{PREFIX}-nsA"}


def test_a_namespace_made_by_another_process_during_the_build_is_not_removed(monkeypatch):
    fake = FakeNetns().install(monkeypatch)
    create = fake.create

    def racing_create(ns: str) -> None:
        if ns == f"{PREFIX}-nsA":
            fake.existing.add(ns)   # another process made it between the check and the creation
        create(ns)

    monkeypatch.setattr(fake, "create", racing_create)
    with pytest.raises(netns.TestBedError, match=f"network namespace {PREFIX}-nsA appeared while test bed {PREFIX} "
                                                 "was being built"):
        netns.TestBed("T2", prefix=PREFIX).up()
    assert fake.existing == {f"{PREFIX}-nsA"} and _state_files() == []
    fake.existing.clear()
