"""Fixtures for the RDMA test bed (QEMU guests with Soft-RoCE).

* Tests marked ``@pytest.mark.rdma`` need qemu-system-x86_64, apt with Debian 12 sources (the
  guest image is built from packages at first use), dpkg-deb/cpio/depmod and the native build
  (``railover-verbs-probe`` needs libibverbs-dev). Without them the test is skipped, or fails
  when ``RAILOVER_REQUIRE_RDMA=1`` (CI must not silently skip).
* One booted 2 x 2 bed shared by every RDMA test of the session (a boot costs 25-100 s under
  TCG): booted by the first test that asks for ``rdma_bed``, shut down right after the last
  test of this directory (the rest of the session runs without idle guests; the guests come
  back if a later test needs them again), and that test's teardown fails if a QEMU process, the
  run directory or the state file survives.
* ``rdma_bed`` (each test): the shared bed after :meth:`RdmaBed.reset` (commands left running killed,
  cables plugged back, NICs up with their boot addresses, nftables tables and fault qdiscs
  removed, every rxe port ACTIVE with its boot GID; a crashed guest rebooted), so a fault a
  test leaves behind cannot poison the next. What the reset had to repair is printed.
* ``rdma_helpers``: crash retry and event-watch helpers used by the tests.

Timeouts are generous: under TCG on a loaded 2-core machine everything in a guest is 10-50x
slower than native (a boot took 60-200 s with ~20 other runnable threads on the host).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import pytest

from railover import _paths
from railover.testbed.rdma import bed as rbed

REQUIRE_ENV = "RAILOVER_REQUIRE_RDMA"


def rdma_unavailable() -> Optional[str]:
    missing = [t for t in ("qemu-system-x86_64", "apt-get", "apt-cache", "dpkg-deb", "cpio", "depmod", "modprobe",
                           "readelf") if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (apt-get install qemu-system-x86 cpio kmod binutils)"
    for fn in (_paths.PERF_FILE, _paths.PLUGIN_FILE, rbed.VERBS_PROBE_FILE):
        try:
            _paths._find(fn)
        except FileNotFoundError as e:
            return f"{e} (railover-verbs-probe needs libibverbs-dev at build time)"
    r = subprocess.run(["apt-cache", "policy", "linux-image-amd64"], capture_output=True, text=True)
    if "Candidate: (none)" in r.stdout or "Candidate" not in r.stdout:
        return "apt has no Debian 12 linux-image-amd64 candidate (no bookworm sources or 'apt-get update' not run)"
    return None


@pytest.fixture(scope="session")
def rdma_ok() -> None:
    reason = rdma_unavailable()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the RDMA test bed cannot run: {reason}", pytrace=False)
        pytest.skip(f"RDMA test bed unavailable: {reason}")


@pytest.fixture(autouse=True)
def _rdma_marker_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("rdma") is not None:
        request.getfixturevalue("rdma_ok")


def assert_no_leftovers(bed: rbed.RdmaBed, pids: List[int]) -> None:
    """No QEMU of ``bed`` runs, its run directory and state file are gone."""
    alive = [p for p in pids if Path(f"/proc/{p}").exists() and "qemu" in Path(f"/proc/{p}/comm").read_text()]
    assert not alive, f"QEMU processes survived teardown: {alive}"
    assert bed.run_dir is None or not bed.run_dir.exists(), f"run dir {bed.run_dir} survived"
    assert bed.prefix not in {i.prefix for i in rbed.list_rdma_beds()}, "state file survived"


def qemu_pids(bed: rbed.RdmaBed) -> List[int]:
    return [q.pid for q in bed._qemu.values()]


#: The temporary directory and test-bed state directory outside any test: the root conftest
#: points both into a per-test directory that is removed after the test, but the shared bed's
#: run directory (sockets, 9p shares) and state file must outlive the test that boots it.
_OUTSIDE_TMP = tempfile.gettempdir()
_OUTSIDE_STATE = os.environ.get("RAILOVER_TESTBED_STATE")


@contextlib.contextmanager
def _outside_test_dirs():
    saved_tmp, saved_state = tempfile.tempdir, os.environ.get("RAILOVER_TESTBED_STATE")
    tempfile.tempdir = _OUTSIDE_TMP
    if _OUTSIDE_STATE is None:
        os.environ.pop("RAILOVER_TESTBED_STATE", None)
    else:
        os.environ["RAILOVER_TESTBED_STATE"] = _OUTSIDE_STATE
    try:
        yield
    finally:
        tempfile.tempdir = saved_tmp
        if saved_state is None:
            os.environ.pop("RAILOVER_TESTBED_STATE", None)
        else:
            os.environ["RAILOVER_TESTBED_STATE"] = saved_state


class _Shared:
    """The one bed the RDMA tests share (booted at first use, shut down after the last RDMA test)."""

    bed: Optional[rbed.RdmaBed] = None
    #: bed tests failed in a row (setup or call), and whether the bed was rebooted for them
    failed_in_a_row: int = 0
    rebooted: bool = False


#: After this many bed tests in a row fail, the bed is rebooted once; after as many more, the
#: rest fail at once. A bed that went bad (a wedged guest the reset does not see) made every
#: later test wait out its own bounds (up to 15 min each): CI ran past its 90 min with no word
#: of what broke. Failing fast keeps the first failures' reports, which say why.
FAILS_BEFORE_REBOOT = 3


def _boot_shared(tmp_path_factory) -> rbed.RdmaBed:
    if _Shared.bed is None or not _Shared.bed.is_up:
        logs = os.environ.get("RAILOVER_RDMA_LOGS") or str(tmp_path_factory.mktemp("rdma-logs"))
        bed = rbed.RdmaBed(rails=2, boot_timeout_s=600, logs_dir=logs, log=lambda m: print(f"[rdma bed] {m}"))
        with _outside_test_dirs():
            bed.up()
        print(f"[rdma bed] {bed.prefix}: boot {bed.boot_s:.1f} s, image "
              f"{'built' if bed.image and bed.image.built else 'cached'} ({bed.image.build_s if bed.image else 0:.1f} s)")
        _Shared.bed = bed
    return _Shared.bed


def _shut_down_shared() -> None:
    bed, _Shared.bed = _Shared.bed, None
    if bed is not None:
        pids = qemu_pids(bed)
        with _outside_test_dirs():
            bed.down()
            assert_no_leftovers(bed, pids)


@pytest.fixture
def rdma_bed(rdma_ok, tmp_path_factory, request) -> rbed.RdmaBed:
    if _Shared.failed_in_a_row >= FAILS_BEFORE_REBOOT:
        if _Shared.rebooted:
            pytest.fail(f"not run: {FAILS_BEFORE_REBOOT} RDMA bed tests failed in a row, and "
                        f"{_Shared.failed_in_a_row} more after the bed was rebooted; the rest would fail the "
                        "same way, and the first failures say why", pytrace=False)
        print(f"[rdma bed] the last {_Shared.failed_in_a_row} tests failed in a row: rebooting the bed")
        _shut_down_shared()
        _Shared.rebooted = True
        _Shared.failed_in_a_row = 0
    bed = _boot_shared(tmp_path_factory)
    t0 = time.monotonic()
    with _outside_test_dirs():  # a reboot of crashed guests rewrites the state file
        fixed = bed.reset()
    print(f"[rdma bed] reset before {request.node.name}: {time.monotonic() - t0:.1f} s"
          + ("".join(f"\n[rdma bed]   repaired: {x}" for x in fixed) if fixed else ", nothing to repair"))
    return bed


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """The RDMA tests' pytest-timeout is 60 min, not the suite's 20: the first one's setup may
    build the guest image (apt downloads, bounded at 15-30 min a step) and boot the bed (up to
    10 min), and the longest test runs its workload for up to 25 min."""
    for item in items:
        if _in_this_dir(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(3600))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Counts the bed tests that fail in a row (a test using ``rdma_bed`` whose setup, as a
    reset that cannot repair the bed, or whose call failed; one that passes resets the count)."""
    outcome = yield
    rep = outcome.get_result()
    if "rdma_bed" not in getattr(item, "fixturenames", ()):
        return
    if rep.failed and rep.when in ("setup", "call"):
        _Shared.failed_in_a_row += 1
    elif rep.when == "call" and rep.passed:
        _Shared.failed_in_a_row = 0


def _in_this_dir(item: Optional[pytest.Item]) -> bool:
    return item is not None and Path(str(item.path)).parent == Path(__file__).parent


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """After the last RDMA test (the next test is elsewhere, or none): shut the shared bed down
    and fail that test's teardown if anything of it survives; the guests do not idle through
    the rest of the session."""
    if _Shared.bed is not None and not _in_this_dir(nextitem):
        _shut_down_shared()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that stopped early (-x, Ctrl-C) still shuts the shared bed down."""
    _shut_down_shared()
