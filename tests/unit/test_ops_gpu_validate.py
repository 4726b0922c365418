"""scripts/gpu_validate.py: the NCCL log checks, journal summary, verdict and report logic
(no GPU needed), and a dry run of the harness with gloo when PyTorch is installed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_validate", ROOT / "scripts" / "gpu_validate.py")
gv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gv)


def nccl_log(rank: int, net: str = "railover", abi: str = "v11", p2p: bool = False, plugin_lines: bool = True) -> str:
    """Lines shaped like NCCL 2.28's INFO output for one rank."""
    lines = [
        f"host:1:1 [0] NCCL INFO NCCL_HOSTID set by environment to gpuval-node{rank}",
        "host:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda12.9",
    ]
    if net != "Socket":
        lines += [f"host:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin {net} ({abi})"]
        if plugin_lines:
            lines += [f"host:1:1 [0] NCCL INFO railover: NIC 0 roabcda0 addr 10.77.0.{rank + 1} rail 0 speed 10000 Mbps",
                      f"host:1:1 [0] NCCL INFO railover: NIC 1 roabcda1 addr 10.77.1.{rank + 1} rail 1 speed 10000 Mbps"]
    lines += [f"host:1:1 [0] NCCL INFO Using network {net}",
              "host:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
              f"host:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/{net}/0",
              f"host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/{net}/1"]
    if p2p:
        lines.append("host:1:1 [0] NCCL INFO Channel 01 : 0[0] -> 1[0] via P2P/IPC")
    return "\n".join(lines) + "\n"


def test_plugin_logs_pass():
    ok, d = gv.check_logs({0: nccl_log(0), 1: nccl_log(1)}, "plugin", expected_abi=11)
    assert ok, d
    assert d["rank0"]["plugin_api"] == "v11" and d["rank0"]["abi_matches_nccl"]
    assert d["rank1"]["networks_used"] == ["railover"] and d["rank0"]["nccl_version_line"] == "2.28.9+cuda12.9"


@pytest.mark.parametrize("texts,failing", [
    ({0: nccl_log(0), 1: nccl_log(1, net="Socket")}, "using_network"),          # rank 1 fell back to Socket
    ({0: nccl_log(0), 1: ""}, "two_nodes"),                                        # no log at all
    ({0: nccl_log(0, p2p=True), 1: nccl_log(1)}, "no_p2p"),
    ({0: nccl_log(0, plugin_lines=False), 1: nccl_log(1)}, "railover_nic_lines"),  # not our build?
    ({0: nccl_log(0, net="IB"), 1: nccl_log(1)}, "plugin_loaded"),
])
def test_plugin_logs_fail(texts, failing):
    ok, d = gv.check_logs(texts, "plugin")
    assert not ok
    assert any(r.get(failing) is False for r in d.values()), d


def test_abi_mismatch_fails():
    ok, d = gv.check_logs({0: nccl_log(0, abi="v10"), 1: nccl_log(1, abi="v10")}, "plugin", expected_abi=11)
    assert not ok and d["rank0"]["abi_matches_nccl"] is False


def test_control_logs_need_the_socket_transport():
    ok, d = gv.check_logs({0: nccl_log(0, net="Socket"), 1: nccl_log(1, net="Socket")}, "control")
    assert ok, d
    ok, _ = gv.check_logs({0: nccl_log(0), 1: nccl_log(1)}, "control")
    assert not ok


def test_journal_summary_times_the_fault():
    evs = [{"t_us": 900, "event": "failover"},                     # before the fault: ignored
           {"t_us": 10_000, "event": "nic_down"}, {"t_us": 10_500, "event": "failover", "convergence_us": 400,
                                                   "bytes_resent": 100},
           {"t_us": 10_600, "event": "failover", "convergence_us": 500, "bytes_resent": 0},
           {"t_us": 2_010_000, "event": "failback", "bytes_resent": 7}]
    s = gv.journal_summary(evs, fault_mono_us=9_000, heal_mono_us=1_009_000)
    assert (s["failover"], s["failback"], s["fatal"]) == (2, 1, 0)
    assert s["detection_ms"] == 1.0 and s["first_failover_ms"] == 1.5 and s["first_failback_ms"] == 1001.0
    assert s["convergence_us"] == [400, 500] and s["bytes_resent"] == 107


def _summary(**over):
    s = {"mode": "plugin", "exit_codes": [0, 0], "logs_ok": True,
         "rank0": {"done": True, "wrong_total": 0,
                   "fault": {"injected": True, "errors": 0, "events": [{"event": "down", "rc": 0}, {"event": "up", "rc": 0}]}},
         "journal": {"failover": 2, "failback": 2, "fatal": 0}}
    s.update(over)
    return s


def test_verdict():
    assert gv.verdict(_summary()) == ("PASS", [])
    assert gv.verdict(_summary(exit_codes=[0, 1]))[0] == "FAIL"
    assert gv.verdict(_summary(logs_ok=False))[1] == ["NCCL log checks failed"]
    assert gv.verdict(_summary(journal={"failover": 0, "failback": 0, "fatal": 0}))[1] == \
        ["no failover in railover's journals", "no failback in railover's journals"]
    bad = _summary()
    bad["rank0"]["fault"]["events"][0]["rc"] = 1
    assert "fault command failed" in gv.verdict(bad)[1][0]
    assert gv.verdict(_summary(mode="dry", logs_ok=False, journal={}))[0] == "PASS"   # dry: no NCCL, no journal
    r0 = {"done": False, "wrong_total": 3}
    assert gv.verdict(_summary(rank0=r0))[1] == ["rank 0 did not finish every phase", "3 wrong elements"]


def test_verdict_fails_when_a_bed_was_given_but_no_fault_was_injected():
    r0 = {"done": True, "wrong_total": 0}
    assert gv.verdict(_summary(mode="dry", rank0=r0, fault_expected=True)) == (
        "FAIL", ["no fault was injected although a test bed was given and the fault phase was not skipped"])
    assert gv.verdict(_summary(mode="dry", rank0=r0, fault_expected=False))[0] == "PASS"   # NETNS=0 or --skip fault
    assert gv.verdict(_summary(fault_expected=True))[0] == "PASS"


def _sourced(script: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``script`` in bash after sourcing scripts/gpu_validate.sh (functions only)."""
    e = dict(os.environ, **env)
    return subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/gpu_validate.sh"\n{script}'], env=e,
                          capture_output=True, text=True, timeout=120)


def test_sourcing_the_harness_runs_nothing(tmp_path):
    work = tmp_path / "work"
    r = _sourced("echo sourced", WORK=str(work), OUT=str(tmp_path / "out"))
    assert r.returncode == 0 and r.stdout.strip() == "sourced", r.stdout + r.stderr
    assert not work.exists()


@pytest.mark.parametrize("dry,skip,bed,want", [
    ("1", "correct,sweep,colls,reinit", True, "summary.json bench.txt run.log fault.csv"),
    ("1", "fault,reinit", True, "summary.json bench.txt run.log"),
    ("1", "", False, "summary.json bench.txt run.log"),            # NETNS=0: no bed, no fault
    ("0", "", True, "summary.json bench.txt run.log fault.csv events.jsonl"),
])
def test_expected_outputs(tmp_path, dry, skip, bed, want):
    (tmp_path / "work").mkdir()
    if bed:
        (tmp_path / "work" / "testbed.prefix").write_text("roabcd\n")
    r = _sourced("expected_outputs", WORK=str(tmp_path / "work"), DRY=dry, DRY_SKIP=skip)
    assert r.stdout.split() == want.split(), r.stdout + r.stderr


def test_a_missing_fault_csv_fails_the_run(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "testbed.prefix").write_text("roabcd\n")
    for f in ("summary.json", "bench.txt", "run.log"):
        (out / f).write_text("x")
    env = dict(WORK=str(work), OUT=str(out), DRY="1", DRY_SKIP="correct,sweep,colls,reinit")
    r = _sourced("check_outputs", **env)
    assert r.returncode == 1 and f"expected output {out}/fault.csv is missing" in r.stdout, r.stdout + r.stderr
    (out / "fault.csv").write_text("iter,start_s,dur_ms,wrong\n")
    assert _sourced("check_outputs", **env).returncode == 0


def test_a_test_bed_that_does_not_come_up_is_a_failure_not_a_run_without_the_fault(tmp_path):
    (tmp_path / "work").mkdir()
    r = _sourced("testbed_up; echo rc=$?", WORK=str(tmp_path / "work"), PY="false")
    assert "rc=2" in r.stdout and "FAIL: the test bed did not come up" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "work" / "testbed.prefix").exists()


def test_bench_text_and_trim_and_busiest_nic():
    row = {"size": 1024, "count": 256, "type": "float", "redop": "sum", "time_us": 10.0, "algbw": 0.1, "busbw": 0.1,
           "wrong": 0}
    text = gv.bench_text({"plugin": {"rank0": {"sweep": [row], "nccl": "2.28.9", "avg_busbw": 0.1}}, "dry": {}})
    assert "mode plugin, nccl 2.28.9" in text and "      1024" in text and "Avg bus bandwidth" in text
    t = gv.trim("a" * 50 + "b" * 50, head=10, tail=5)
    assert t.startswith("a" * 10) and t.endswith("b" * 5) and "85 characters cut" in t
    assert gv.trim("short", 10, 10) == "short"
    st = {"comms": [{"paths": [{"nic": "a1", "state": "active"}, {"nic": "a0", "state": "standby"}]},
                    {"paths": [{"nic": "a1", "state": "active"}]}]}
    assert gv.busiest_nic(st, ["a0", "a1"]) == "a1"
    assert gv.busiest_nic(None, ["a0", "a1"]) == "a0"


def test_dry_run_of_the_harness(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch not installed: the dry run needs torch (CPU build is enough)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cp = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_validate.py"), "--mode", "dry", "--work",
                         str(tmp_path), "--max-bytes", str(1 << 16), "--skip", "reinit", "--deadline", "90"],
                        env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = json.loads((tmp_path / "summary-dry.json").read_text())
    assert s["verdict"] == "PASS" and s["exit_codes"] == [0, 0]
    r0 = s["rank0"]
    assert r0["wrong_total"] == 0 and r0["correctness"]["cases"] > 50 and r0["sweep"][-1]["size"] == 1 << 16
    assert "fault" not in r0     # no test bed: no fault phase
