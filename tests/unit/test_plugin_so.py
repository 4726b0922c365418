"""The shipped plugin: exported symbols, link dependencies, -z nodelete, dlopen on a clean
environment, and the environment `railover env` prints."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from railover import _paths, envvars

# NCCL's tables plus railover's own self-description for its Python tools (abi/describe.cc).
EXPECTED = {f"ncclNetPlugin_v{v}" for v in range(7, 13)} | {"railover_describe_json", "railover_check_param",
                                                           "railover_rdma_report_json", "railover_check_config"}


@pytest.fixture(scope="module")
def so():
    return str(_paths.plugin_path())


def test_exports_exactly_the_plugin_tables(so):
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == EXPECTED, f"unexpected exports: {sorted(names ^ EXPECTED)}"


def test_no_link_dependency_on_cuda_nccl_rdma_or_libstdcxx(so):
    out = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
    for bad in ("libcuda", "libnccl", "libibverbs", "librdmacm", "libstdc++", "not found"):
        assert bad not in out, f"{bad} in ldd output:\n{out}"


def test_linked_nodelete(so):
    out = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert re.search(r"FLAGS_1.*NODELETE", out), out


def test_dlopen_rtld_now_on_a_clean_environment(so):
    code = ("import ctypes,os,sys; h=ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW|os.RTLD_LOCAL); "
            "print('ok', bool(ctypes.c_void_p.in_dll(h, 'ncclNetPlugin_v12')))")
    r = subprocess.run(["env", "-i", sys.executable, "-c", code, so], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok True"


def test_env_names_the_plugin_and_the_reload_workaround():
    env = envvars.nccl_env({"LD_LIBRARY_PATH": "/opt/x"})
    assert env["NCCL_NET_PLUGIN"] == "railover"
    assert env["NCCL_NET"] == "railover"
    assert env["NCCL_NET_PLUGIN_REF_COUNT"] == "1"
    libdir = os.path.dirname(_paths.plugin_path())
    assert env["LD_LIBRARY_PATH"].split(":") == [libdir, "/opt/x"]
    assert os.path.exists(os.path.join(libdir, "libnccl-net-railover.so"))


def test_cli_env_shell_output():
    r = subprocess.run([sys.executable, "-m", "railover.cli", "env", "--shell"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "export NCCL_NET_PLUGIN=railover" in r.stdout
    assert "export NCCL_NET=railover" in r.stdout
