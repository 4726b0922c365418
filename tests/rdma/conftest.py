"""Fixtures for the RDMA test bed (QEMU guests with Soft-RoCE).

* Tests marked ``@pytest.mark.rdma`` need qemu-system-x86_64, apt with Debian 12 sources (the
  guest image is built from packages at first use), dpkg-deb/cpio/depmod and the native build
  (``railover-verbs-probe`` needs libibverbs-dev). Without them the test is skipped, or fails
  when ``RAILOVER_REQUIRE_RDMA=1`` (CI must not silently skip).
* ``rdma_bed`` (module scope): one booted 2 x 2 bed per test module; torn down after the module,
  which then fails if a QEMU process, the run directory or the state file survives.
* ``rdma_helpers``: crash retry and event-watch helpers used by the tests.

Timeouts are generous: under TCG on a loaded 2-core machine everything in a guest is 10-50x
slower than native (a boot took 60-200 s with ~20 other runnable threads on the host).
"""
from __future__ import annotations

import os
import shutil
import subprocess
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


@pytest.fixture(scope="module")
def rdma_bed(rdma_ok, tmp_path_factory) -> rbed.RdmaBed:
    logs = os.environ.get("RAILOVER_RDMA_LOGS") or str(tmp_path_factory.mktemp("rdma-logs"))
    bed = rbed.RdmaBed(rails=2, boot_timeout_s=600, logs_dir=logs, log=lambda m: print(f"[rdma bed] {m}"))
    bed.up()
    print(f"[rdma bed] {bed.prefix}: boot {bed.boot_s:.1f} s, image "
          f"{'built' if bed.image and bed.image.built else 'cached'} ({bed.image.build_s if bed.image else 0:.1f} s)")
    yield bed
    pids = qemu_pids(bed)
    bed.down()
    assert_no_leftovers(bed, pids)


