"""Builds the C++ unit tests (GoogleTest) with CMake and runs them through ctest, so the
README's single test command covers the native code too."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


#: A CMake build tree (configured already, e.g. with -DRAILOVER_SANITIZE=ON) to build the test
#: binaries in and run instead of build-unit: CI points it at its ASan+UBSan tree, so the
#: README's command runs the C++ tests once, sanitized, instead of compiling a second tree.
BUILD_ENV = "RAILOVER_CTEST_BUILD"


@pytest.mark.skipif(not shutil.which("cmake"), reason="cmake not installed")
def test_cpp_unit_tests(tmp_path_factory):
    given = os.environ.get(BUILD_ENV)
    build = Path(given) if given else REPO / "build-unit"
    if given:
        assert (build / "CMakeCache.txt").is_file(), f"{BUILD_ENV}={given}: not a configured CMake build tree"
    else:
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(REPO), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                       check=True, capture_output=True, text=True)
    # Every test binary ctest knows of must be built (ctest reports one that is not as a
    # failure); the verbs and RDMA tests exist only where rdma-core's headers are installed.
    targets = ["railover_unit_tests", "railover_engine_tests", "railover_engine_only_tests", "railover_noverbs_tests"]
    listed = subprocess.run(["cmake", "--build", str(build), "--target", "help"], capture_output=True, text=True).stdout
    for t in ("railover_verbs_tests", "railover_rdma_tests", "railover_rdma_api_tests"):
        if t in listed:
            targets.append(t)
    b = subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j2"],
                       capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-4000:] + b.stderr[-4000:]
    # Two at a time, as CI's sanitizer runs: the tests are written for a busy host.
    r = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure", "--timeout", "300", "-j2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:]
    assert "tests passed" in r.stdout
