"""A bad RAILOVER_* value makes the plugin's init fail through the real ABI (loaded by
railover-perf like NCCL loads it) with a WARN naming the variable, for the per-process (v10)
and the per-communicator (v11+, whose finalize must accept the failed init's context) paths."""
from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from railover import _paths


@pytest.mark.parametrize("abi", [10, 12])
@pytest.mark.parametrize("var,value", [("RAILOVER_NSTREAMS", "abc"), ("RAILOVER_STANDBY", "eth0"),
                                       ("RAILOVER_HOLD_DOWN_MS", "-1"), ("RAILOVER_IFNAMES", "nosuchif")])
def test_bad_value_fails_init_naming_the_variable(abi, var, value):
    env = dict(os.environ, RAILOVER_IFNAMES="=lo", NCCL_DEBUG="WARN", RAILOVER_STATE_DIR="off")
    env[var] = value
    with tempfile.TemporaryDirectory() as rv:
        r = subprocess.run([str(_paths.perf_path()), "--plugin", str(_paths.plugin_path()), "--rank", "0",
                            "--nranks", "1", "--rendezvous", rv, "-b", "8", "-e", "8", "--abi", str(abi)],
                           env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "plugin call init failed" in r.stderr
    warn = [l for l in r.stderr.splitlines() if "NCCL WARN railover:" in l]
    assert warn and var in warn[0], r.stderr[-2000:]


MISSPELT = {"RAILOVER_HOLDDOWN_MS": "500", "RAILOVER_HOLD_DOWN_MAX": "9000", "RAILOVER_PROBE_INTERVAL": "10",
            "RAILOVER_STALLMS": "70", "RAILOVER_FATAL_TIMEOUT_S": "60", "RAILOVER_HCAS": "mlx5_0",
            "RAILOVER_STALL_SM": "70", "RAILOVER_HOLD_DOWN": "500", "RAILOVER_STANDBYS": "all"}


def test_a_misspelt_variable_is_warned_about_at_init_and_the_run_goes_on():
    """A RAILOVER_* name the plugin does not read would be ignored in silence (the operator
    believes a hold-down is set that is not): init says so, naming the closest variable, and
    does not fail. Its words are doctor's and `railover launch`'s, name for name."""
    from railover.ops.doctor import unknown_var_checks
    env = dict(os.environ, RAILOVER_IFNAMES="=lo", NCCL_DEBUG="WARN", RAILOVER_STATE_DIR="off", **MISSPELT)
    with tempfile.TemporaryDirectory() as rv:
        r = subprocess.run([str(_paths.perf_path()), "--plugin", str(_paths.plugin_path()), "--rank", "0",
                            "--nranks", "1", "--rendezvous", rv, "-b", "8", "-e", "8", "--abi", "12"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    warn = [l.split("NCCL WARN railover: ", 1)[1] for l in r.stderr.splitlines()
            if "NCCL WARN railover:" in l and "is not a railover variable" in l]
    assert "RAILOVER_HOLDDOWN_MS is not a railover variable (did you mean RAILOVER_HOLD_DOWN_MS?); it is ignored" \
        in warn, r.stderr[-3000:]
    assert sorted(warn) == sorted(c.detail for c in unknown_var_checks(MISSPELT)), "the plugin and doctor differ"
