"""`railover bench rdma`'s pure logic: perftest parsing, the CPU split, per-fault figures from
journal events, per-kind statistics, busbw ratios, the issue's targets and the markdown table.
The bed itself is exercised by tests/rdma/test_rdma_bench.py."""
from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from railover.bench import common as C
from railover.bench import rdma as R

#: perftest 4.5 output shape (numbers invented for the test)
IB_WRITE_BW_OUT = """
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 1048576    1234             0.00               0.84                 0.000100
---------------------------------------------------------------------------------------
"""


def test_parse_sizes_and_bad_sizes():
    assert R.parse_size("64K") == 65536 and R.parse_size("1M") == 1 << 20 and R.parse_size("4096") == 4096
    assert R.parse_size("1MiB") == 1 << 20
    with pytest.raises(ValueError, match="bad size '1 furlong'"):
        R.parse_size("1 furlong")


def test_ib_write_bw_average_in_gbytes_per_second():
    assert R.parse_ib_write_bw(IB_WRITE_BW_OUT, 1048576) == pytest.approx(0.84 / 8)
    # perftest's default unit: MB/sec = 2**20 B/s
    mbs = IB_WRITE_BW_OUT.replace("BW peak[Gb/sec]    BW average[Gb/sec]", "BW peak[MB/sec]    BW average[MB/sec]")
    assert R.parse_ib_write_bw(mbs.replace("0.84 ", "23.84"), 1048576) == pytest.approx(23.84 * 1048576 / 1e9)
    assert R.parse_ib_write_bw(IB_WRITE_BW_OUT.replace("BW average[Gb/sec]", "BW average"), 1048576) is None
    assert R.parse_ib_write_bw(IB_WRITE_BW_OUT, 65536) is None  # another size's line is not this one
    assert R.parse_ib_write_bw("Couldn't connect to 10.0.0.2:18901", 1048576) is None


def test_cpu_split_fractions_and_no_time():
    before = [100, 0, 50, 800, 0, 0, 10, 0]
    after = [400, 0, 150, 900, 0, 0, 110, 0]  # +300 user, +100 system, +100 idle, +100 softirq
    s = R.cpu_split(before, after)
    assert s["user"] == pytest.approx(0.5) and s["system"] == pytest.approx(1 / 6)
    assert s["softirq"] == pytest.approx(1 / 6) and s["idle"] == pytest.approx(1 / 6)
    assert R.cpu_split(before, before)["user"] is None


def _ev(event, t_us, **kw):
    return dict(event=event, t_us=t_us, **kw)


def test_cycle_record_from_journal_events():
    a = [_ev("path_down", 1_010_000, nic="eth1", active=True, detection_us=4000),
         _ev("path_down", 1_011_000, nic="eth1", active=False, detection_us=9_000_000),  # standby: not counted
         _ev("failover", 1_015_000, convergence_us=5000, bytes_resent=100)]
    b = [_ev("failover", 900_000, convergence_us=250_000, bytes_resent=0)]  # B's own clock: not used for timing
    a.append(_ev("failback", 3_000_000, convergence_us=800))
    r = R.cycle_record(0, 1_000_000, 2_000_000, a, b)
    assert r["failovers"] == 2 and r["failovers_a"] == 1 and r["failovers_b"] == 1
    assert r["convergence_ms"] == [5.0, 250.0]
    assert r["detection_ms"] == [4.0]
    assert r["fault_to_failover_a_ms"] == 15.0
    assert r["failback_convergence_ms"] == [0.8] and r["failbacks"] == 1
    assert r["fatal"] == 0 and r["bytes_resent"] == 100
    none = R.cycle_record(1, 5, None, [_ev("fatal", 9, message="x")], [])
    assert none["failovers"] == 0 and none["fault_to_failover_a_ms"] is None and none["fatal"] == 1


def test_resume_waits_split_into_the_fences_queue_run_and_answer():
    b = [_ev("resume", 10, waited_us=13_000, fence_queue_us=1000, fence_us=9000, fence_to_answer_us=3000,
             fence_grant_wait_us=4000),
         _ev("resume", 20, waited_us=0, fence_queue_us=0, fence_us=0, fence_to_answer_us=0,
             fence_grant_wait_us=0),  # answered at once
         _ev("resume", 30, next_seq=4)]  # a journal from before the split: left out
    a = [_ev("failover", 5, convergence_us=5000),
         _ev("resume", 40, waited_us=6000, fence_queue_us=500, fence_us=2000, fence_to_answer_us=3500,
             fence_grant_wait_us=0)]  # its fence waited for no grant
    r = R.cycle_record(0, 0, 1, a, b)
    assert r["resume_wait_ms"] == [6.0, 13.0, 0.0]
    assert r["resume_fence_queue_ms"] == [0.5, 1.0] and r["resume_fence_ms"] == [2.0, 9.0]
    assert r["resume_fence_to_answer_ms"] == [3.5, 3.0]
    # of each fence's run, its wait for a running grant of remote write (answers that waited only)
    assert r["resume_fence_grant_wait_ms"] == [0.0, 4.0]
    s = R.kind_summary("cable-pull", [r])
    assert s["resume_wait_ms"]["n"] == 3 and s["resume_fence_ms"]["max"] == 9.0
    g = s["resume_fence_grant_wait_ms"]
    assert g["n"] == 2 and g["max"] == 4.0 and g["p50"] == pytest.approx(C.percentile([0.0, 4.0], 50))
    assert g["p99"] == pytest.approx(C.percentile([0.0, 4.0], 99))
    detail = R._resume_wait_detail(s)
    assert "RESUME answers waited p50 6.0, max 13.0 ms" in detail, detail
    assert "2 of 3 on the old path's fence" in detail and "run 5.5/9.0" in detail, detail
    assert "run 5.5/9.0 (of it, waiting for a running grant of remote write 2.0/4.0), end to answer" in detail, detail
    assert R._resume_wait_detail(R.kind_summary("cable-pull", [R.cycle_record(0, 0, 1, [], [])])) == ""


def test_resume_journals_without_the_grant_wait_leave_it_out():
    """A journal from a plugin that did not journal fence_grant_wait_us yet: the other parts are
    summarised, the grant wait is not made up (no 0s)."""
    b = [_ev("resume", 10, waited_us=13_000, fence_queue_us=1000, fence_us=9000, fence_to_answer_us=3000)]
    r = R.cycle_record(0, 0, 1, [], b)
    assert r["resume_fence_ms"] == [9.0] and r["resume_fence_grant_wait_ms"] == []
    s = R.kind_summary("cable-pull", [r])
    assert s["resume_fence_grant_wait_ms"]["n"] == 0
    detail = R._resume_wait_detail(s)
    assert "run 9.0/9.0, end to answer" in detail and "grant" not in detail, detail


def test_send_path_opens_are_summarised_from_path_up_open_us():
    a = [_ev("path_up", 10, dir="send", open_us=2000, generation=2),
         _ev("path_up", 11, dir="recv", open_us=0, generation=2),        # the receive side: not an open
         _ev("path_up", 12, dir="send", generation=3)]                  # a plugin before open_us: left out
    b = [_ev("path_up", 20, dir="send", open_us=9000, generation=2)]
    r = R.cycle_record(0, 0, 1, a, b)
    assert r["send_open_ms"] == [2.0, 9.0]
    s = R.kind_summary("cable-pull", [r])
    assert s["send_open_ms"]["n"] == 2 and s["send_open_ms"]["max"] == 9.0
    assert "2 send path opens held the caller p50 5.5" in R._open_detail(s) and "max 9.0 ms" in R._open_detail(s)
    assert R._open_detail(R.kind_summary("cable-pull", [R.cycle_record(0, 0, 1, [], [])])) == ""


def test_kind_summary_counts_every_failover_and_missing_ones():
    cycles = [R.cycle_record(i, 0, 1, [_ev("failover", 1000 * (i + 1), convergence_us=1000 * (i + 1))],
                             [_ev("failover", 5, convergence_us=100_000), _ev("failback", 9, convergence_us=500)])
              for i in range(4)]
    cycles.append(R.cycle_record(4, 0, 1, [], []))
    s = R.kind_summary("cable-pull", cycles)
    assert s["faults"] == 5 and s["faults_without_failover"] == 1 and s["faults_without_failback"] == 0
    assert s["convergence_ms"]["n"] == 8 and s["convergence_ms"]["max"] == 100.0
    assert s["convergence_ms"]["p50"] == pytest.approx(C.percentile([1, 2, 3, 4] + [100] * 4, 50))
    assert s["fault_to_failover_a_ms"]["missing"] == 1 and s["target_class"] == "local"


def test_bw_ratios_use_medians_per_size():
    rows = [{"size": 1 << 20, "variant": "rdma", "gbs": g} for g in (0.01, 0.03, 0.02)]
    rows += [{"size": 1 << 20, "variant": "ib_write_bw", "gbs": 0.04},
             {"size": 1 << 20, "variant": "ib_write_bw_bidi", "gbs": 0.08},
             {"size": 1 << 20, "variant": "tcp", "gbs": 0.01},
             {"size": 1 << 20, "variant": "rdma_idle_sleep", "gbs": None}]  # failed measurement
    r = R.bw_ratios(rows)[1 << 20]
    assert r["median_gbs"]["rdma"] == pytest.approx(0.02)
    assert r["rdma_vs_ib_write_bw"] == pytest.approx(0.5)
    assert r["rdma_vs_ib_write_bw_bidi_per_dir"] == pytest.approx(0.5)
    assert r["rdma_vs_tcp"] == pytest.approx(2.0)
    assert r["rdma_idle_sleep_vs_rdma"] is None
    assert r["rdma_qps4_vs_rdma"] is None  # not measured in this run


def test_several_qps_per_path_get_their_own_ratios_and_table(tmp_path):
    rows = [{"size": 1 << 20, "variant": "rdma", "gbs": 0.02}, {"size": 1 << 20, "variant": "rdma_qps4", "gbs": 0.03},
            {"size": 1 << 20, "variant": "ib_write_bw", "gbs": 0.04},
            {"size": 1 << 20, "variant": "ib_write_bw_qps4", "gbs": 0.06}]
    r = R.bw_ratios(rows)[1 << 20]
    assert r["rdma_qps4_vs_rdma"] == pytest.approx(1.5)
    assert r["rdma_qps4_vs_ib_write_bw"] == pytest.approx(0.75)
    assert r["rdma_qps4_vs_ib_write_bw_qps4"] == pytest.approx(0.5)
    rep = C.Report("rdma", tmp_path, True, {"bw_seconds": 5, "rounds": 1})
    rep.results["busbw"] = {str(1 << 20): r}
    md = R.markdown(rep.finish())
    assert "NCCL_IB_QPS_PER_CONNECTION=4" in md
    assert "| 1 MiB | 20.00 | 30.00 | 60.00 | 1.500 | 0.750 | 0.500 |" in md
    assert "NCCL_IB_QPS_PER_CONNECTION" not in R.markdown(_report(tmp_path))  # only when it was measured


def test_one_way_busbw_is_judged_against_ib_write_bw_where_measured(tmp_path):
    rows = [{"size": 1 << 20, "variant": "rdma", "gbs": 0.02}, {"size": 1 << 20, "variant": "rdma_oneway", "gbs": 0.038},
            {"size": 1 << 20, "variant": "ib_write_bw", "gbs": 0.04}]
    bw = R.bw_ratios(rows)
    assert bw[1 << 20]["rdma_oneway_vs_ib_write_bw"] == pytest.approx(0.95)
    rep = C.Report("rdma", tmp_path, True, {"bw_seconds": 5, "rounds": 1})
    R.add_targets(rep, {}, bw)
    (t,) = rep.data["targets"]
    # like for like: A to B only, as perftest measures, not the ring's per-direction rate (0.5)
    assert t["figure"] == "rdma: busbw 1 MiB railover-rdma one way / ib_write_bw"
    assert t["value"] == pytest.approx(0.95) and t["met"] is True
    rep.results["busbw"] = {str(k): v for k, v in bw.items()}
    assert "| 1 MiB | 20.00 | 38.00 | - | - | 40.00 | - | 0.500 | 0.950 |" in R.markdown(rep.finish())
    assert R.bw_ratios(rows[:1] + rows[2:])[1 << 20]["rdma_oneway_vs_ib_write_bw"] is None


def test_one_way_with_the_driver_sleeping_when_idle_gets_its_own_target_and_table(tmp_path):
    rows = [{"size": 1 << 20, "variant": "rdma_oneway", "gbs": 0.010},
            {"size": 1 << 20, "variant": "rdma_oneway_idle_sleep", "gbs": 0.019},
            {"size": 1 << 20, "variant": "ib_write_bw", "gbs": 0.020}]
    bw = R.bw_ratios(rows)
    r = bw[1 << 20]
    assert r["rdma_oneway_idle_sleep_vs_ib_write_bw"] == pytest.approx(0.95)
    assert r["rdma_oneway_idle_sleep_vs_rdma_oneway"] == pytest.approx(1.9)
    rep = C.Report("rdma", tmp_path, True, {"bw_seconds": 5, "rounds": 1})
    R.add_targets(rep, {}, bw)
    by = {t["figure"]: t for t in rep.data["targets"]}
    spin = by["rdma: busbw 1 MiB railover-rdma one way / ib_write_bw"]
    sleep = by["rdma: busbw 1 MiB railover-rdma one way, driver sleeping when idle / ib_write_bw"]
    assert spin["value"] == pytest.approx(0.5) and spin["met"] is False
    assert sleep["value"] == pytest.approx(0.95) and sleep["met"] is True
    rep.results["busbw"] = {str(k): v for k, v in bw.items()}
    rep.results["cpu_b"] = {"rdma_oneway": {"user": 0.3, "system": 0.5, "softirq": 0.1, "idle": 0.1}}
    md = R.markdown(rep.finish())
    assert "| 1 MiB | 10.00 | 19.00 | 20.00 | 0.500 | 0.950 | 1.90 |" in md
    assert "Guest B (receiver" in md and "| rdma_oneway | 0.30 | 0.50 | 0.10 | 0.10 |" in md
    # the table and the second target only where the sleeping variant was measured
    plain = R.bw_ratios([rows[0], rows[2]])
    rep2 = C.Report("rdma", tmp_path / "2", True, {"bw_seconds": 5, "rounds": 1})
    R.add_targets(rep2, {}, plain)
    assert [t["figure"] for t in rep2.data["targets"]] == ["rdma: busbw 1 MiB railover-rdma one way / ib_write_bw"]
    rep2.results["busbw"] = {str(k): v for k, v in plain.items()}
    assert "sleeping 50 µs" not in R.markdown(rep2.finish())


def _report(tmp_path: Path):
    cyc = [R.cycle_record(0, 0, 1, [_ev("failover", 30_000, convergence_us=30_000)], [])]
    silent = [R.cycle_record(0, 0, 1, [_ev("failover", 150_000, convergence_us=150_000)], [])]
    kinds = {"cable-pull": R.kind_summary("cable-pull", cyc), "silent": R.kind_summary("silent", silent)}
    bw = R.bw_ratios([{"size": 1 << 20, "variant": "rdma", "gbs": 0.01}, {"size": 1 << 20, "variant": "ib_write_bw", "gbs": 0.1},
                      {"size": 65536, "variant": "rdma", "gbs": 0.001}, {"size": 65536, "variant": "ib_write_bw", "gbs": 0.1}])
    rep = C.Report("rdma", tmp_path, True, {"faults_per_kind": 1, "size": "256K", "hold_down_ms": 1000, "bw_seconds": 5,
                                            "rounds": 1, "plugin_env": {"RAILOVER_PROBE_MULT": "40"}})
    rep.results.update({"kinds": kinds, "busbw": {str(k): v for k, v in bw.items()},
                        "bed": {"line": "2 QEMU guests (tcg)"}, "convergence_wrong_bytes": 0,
                        "bare_rc": [{"i": 0, "outcome": "no error within 45 s (no fatal event, ranks running)", "after_s": None,
                                     "after_repair": "job completed, 0 wrong bytes"}]})
    R.add_targets(rep, kinds, bw)
    return rep.finish()


def test_targets_judge_the_issue_limits(tmp_path):
    data = _report(tmp_path)
    t = {x["figure"]: x for x in data["targets"]}
    cp = t["rdma: cable-pull convergence (journal convergence_us), p99"]
    assert cp["value"] == 30.0 and cp["met"] is False and cp["target"] == "<= 20 ms"  # local faults: 20 ms
    si = t["rdma: silent convergence (journal convergence_us), p99"]
    assert si["value"] == 150.0 and si["met"] is True and si["target"] == "<= 200 ms"  # silent faults: 200 ms
    bw = t["rdma: busbw 1 MiB railover-rdma / ib_write_bw"]
    assert bw["value"] == pytest.approx(0.1) and bw["met"] is False
    assert not any("64 KiB" in f for f in t)  # the bandwidth target applies from 1 MiB
    assert t["rdma: cable-pull faults without a failover"]["met"] is True


def test_markdown_has_every_section_and_value(tmp_path):
    md = R.markdown(_report(tmp_path))
    assert "| cable-pull | 1 | 1 | 30.0 / 30.0 / 30.0 |" in md
    assert "| silent | 1 | 1 | 150.0 / 150.0 / 150.0 |" in md
    assert "no error within 45 s (no fatal event, ranks running)" in md
    assert "| 1 MiB | 10.00 |" in md and "| 0.100 |" in md  # rdma MB/s and the rdma / ib_write_bw ratio
    assert "RAILOVER_PROBE_MULT" in md and "2 QEMU guests (tcg)" in md
    assert R.tables(_report(tmp_path))  # the rich tables build from the same data


def test_cli_rejects_unknown_kinds_and_phases_before_booting(tmp_path):
    with pytest.raises(C.BenchError, match="unknown fault kind 'meteor'"):
        R.run(tmp_path, quick=True, kinds=["meteor"])
    with pytest.raises(C.BenchError, match="unknown phase 'warp'"):
        R.run(tmp_path, quick=True, phases=["warp"])
    with pytest.raises(C.BenchError, match="bad size"):
        R.run(tmp_path, quick=True, bw_sizes=["lots"])
    with pytest.raises(C.BenchError, match="unknown busbw variant 'rdma_qps9'"):
        R.run(tmp_path, quick=True, bw_variants=["rdma", "rdma_qps9"])


def test_armed_only_with_traffic_on_the_primary_and_a_standby_up():
    up = lambda nic: _ev("path_up", 1, nic=nic, dir="send")
    assert not R.armed_on_primary([up("eth1")])  # no standby yet
    assert R.armed_on_primary([up("eth1"), up("eth2")])
    # the primary came up late: traffic started on the standby, armed only after the failback
    late = [up("eth2"), up("eth1")]
    assert not R.armed_on_primary(late)
    assert R.armed_on_primary(late + [_ev("failback", 2, to_nic="eth1")])
    assert not R.armed_on_primary([up("eth1"), up("eth2"), _ev("failover", 3, to_nic="eth2")])


def test_armed_follows_the_engines_active_path_when_the_journal_has_path_states():
    """Seen in CI (demo on a loaded machine): the standby's send path came up first, yet the comm
    started on the primary ("start"), with no failback ever. The path-up order said "not armed"
    for 600 s; the engine's own path_state transitions say where the traffic is."""
    up = lambda nic, t: _ev("path_up", t, nic=nic, dir="send")
    act = lambda nic, t, why: _ev("path_state", t, nic=nic, dir="send", to="active", reason=why)
    standby_first = [up("eth2", 1), up("eth1", 2), act("eth1", 3, "start")]
    assert R.armed_on_primary(standby_first)
    assert not R.armed_on_primary(standby_first + [act("eth2", 4, "failover")])
    assert R.armed_on_primary(standby_first + [act("eth2", 4, "failover"), act("eth1", 5, "failback")])
    # a receive path's state says nothing about where this guest sends
    assert not R.armed_on_primary([up("eth1", 1), up("eth2", 2), act("eth2", 3, "start"),
                                   _ev("path_state", 4, nic="eth1", dir="recv", to="active")])


class _FakeRun:
    """Stands in for _PerfRun: a checked run that is always alive until stopped."""
    stopped_ok = True

    def __init__(self, bed, env, **kw):
        self.bed = bed

    def start(self):
        return self

    def wd(self):
        return "/tmp/rperf-fake"

    @property
    def alive(self):
        return True

    def stop(self, timeout_s=600):
        if self.bed.crashed:
            raise R.C.BenchError("guest A is down")
        return SimpleNamespace(wrong_total=0, ranks=[SimpleNamespace(returncode=0, json={})], ok=True, errors=[])


class _FakeFault:
    def __init__(self, bed):
        self.bed, self.guest, self.applied_us, self.undone_us = bed, "A", None, None

    def apply(self):
        from railover.testbed.faults import FaultError
        from railover.testbed.rdma.bed import GuestCrash
        self.bed.applies += 1
        if self.bed.applies in self.bed.crash_at:
            if self.bed.fail_with == "fault":
                raise FaultError("ip link set down in guest A failed (exit 2): RTNETLINK answers: No such device")
            self.bed.crashed = True
            raise GuestCrash("A", "kernel crash on the console: BUG: kernel NULL pointer dereference")
        t = 1_000_000 * self.bed.applies
        self.applied_us = t
        for h in ("A", "B"):
            self.bed.journal[h].append(_ev("failover", t + 9000, convergence_us=9000))

    def undo(self):
        t = 1_000_000 * self.bed.applies + 500_000
        self.undone_us = t
        for h in ("A", "B"):
            self.bed.journal[h].append(_ev("failback", t + 1000, convergence_us=1000))


def _fake_bed(crash_at, fail_with="crash"):
    """A bed whose ``crash_at``-th fault applications (1-based; an int or a set) crash guest A
    (or, with ``fail_with="fault"``, fail to apply); ``reset()`` reboots it."""
    bed = SimpleNamespace(applies=0, crash_at=crash_at if isinstance(crash_at, (set, frozenset)) else {crash_at},
                          fail_with=fail_with, crashed=False, reboots=0, journal={"A": [], "B": []},
                          guest_now_us=lambda h: None, clock_offset_us=lambda h: (0, 0),
                          map_clock_us=lambda t, src, dst, samples=3: (t, 0), accel="tcg", smp=1,
                          mem_mib=1024, boot_s=9.0, wire="stream", hosts=[SimpleNamespace(kernel="6.1")])

    def sh(host, script, timeout_s=60.0):  # the journals, as `cat` in a guest prints them
        if bed.crashed and host == "A":
            raise GuestCrash("A", "kernel crash on the console")
        return 0, "".join(json.dumps(e) + "\n" for e in bed.journal[host]), ""
    bed.sh = sh

    def reset():
        bed.reboots += bed.crashed
        was, bed.crashed = bed.crashed, False
        return ["rebooted the guests: guest A: kernel crash"] if was else []
    bed.reset = reset
    return bed


def _patch_bed_io(monkeypatch):
    monkeypatch.setattr(R, "_PerfRun", _FakeRun)
    monkeypatch.setattr(R, "_make_fault", lambda bed, kind: _FakeFault(bed))
    monkeypatch.setattr(R, "_journal", lambda bed, host, wd: list(bed.journal[host]))
    monkeypatch.setattr(R, "armed_on_primary", lambda evs: True)


def test_a_guest_crash_reboots_the_guests_and_the_faults_go_on_in_a_new_checked_run(tmp_path, monkeypatch):
    _patch_bed_io(monkeypatch)
    console = Console(file=io.StringIO())
    full = R.convergence(_fake_bed(crash_at=None), ["cable-pull"], 3, "256K", 1000, tmp_path, console, 5, 5)
    assert "convergence_aborted" not in full and full["kinds"]["cable-pull"]["faults"] == 3
    assert full["convergence_wrong_bytes"] == 0 and full["convergence_crashes"] == []
    assert len(full["convergence_segments"]) == 1 and full["convergence_fatal_total"] == 0
    seg = full["convergence_segments"][0]  # both guests' clocks against the host's, at start and end
    assert seg["clock_offsets_us"] == {"A": [0, 0], "B": [0, 0]} == seg["clock_offsets_end_us"]
    bed = _fake_bed(crash_at=3)
    part = R.convergence(bed, ["cable-pull", "admin-down"], 2, "256K", 1000, tmp_path, console, 5, 5)
    # the crash under the first admin down: rebooted, that fault not measured but run again
    assert bed.reboots == 1 and "convergence_aborted" not in part
    assert part["kinds"]["cable-pull"]["faults"] == 2 and part["kinds"]["admin-down"]["faults"] == 2
    assert part["convergence_crashes"] == [{"at": "admin-down fault 1/2", "during_fault": True,
                                            "error": "guest A: kernel crash on the console: BUG: kernel NULL pointer "
                                                     "dereference"}]
    first, second = part["convergence_segments"]
    assert (first["dir"], first["faults"], second["dir"], second["faults"]) == ("convergence", 2, "convergence-2", 2)
    assert first["ended"].startswith("guest crash at admin-down fault 1/2") and "guest A is down" in first["result_lost"]
    assert second["ended"] == "completed" and second["wrong_bytes"] == 0
    # wrong bytes: the segments whose ranks finished; not a clean run, so no fatal total or ok
    assert part["convergence_wrong_bytes"] == 0 and part["convergence_ok"] is False
    assert part["convergence_faults_planned"] == 4
    # the crashed run's journal of the guest still up (B, rank 1) is kept; A's died with it
    kept = tmp_path / "convergence" / "journal-rank1.jsonl"
    assert kept.exists() and len(kept.read_text().splitlines()) == len(bed.journal["B"]) - 4
    assert not (tmp_path / "convergence" / "journal-rank0.jsonl").exists()


def test_one_guest_crash_too_many_stops_the_phase_with_what_was_measured(tmp_path, monkeypatch):
    _patch_bed_io(monkeypatch)
    console = Console(file=io.StringIO())
    bed = _fake_bed(crash_at={2, 3})
    part = R.convergence(bed, ["cable-pull", "admin-down"], 2, "256K", 1000, tmp_path, console, 5, 5,
                         crash_reboots=1)
    # the crash under cable pull 2/2 reboots; the same fault run again crashes once more: stop
    assert bed.reboots == 1 and len(part["convergence_crashes"]) == 2
    assert part["convergence_aborted"].startswith("stopped at cable-pull fault 2/2: guest A: kernel crash")
    assert "(guest crash 2; 1 reboot(s) allowed)" in part["convergence_aborted"]
    assert part["kinds"]["cable-pull"]["faults"] == 1 and "admin-down" not in part["kinds"]
    assert part["convergence_wrong_bytes"] is None and part["convergence_faults_planned"] == 4
    none = R.convergence(_fake_bed(crash_at=1), ["admin-down"], 2, "256K", 1000, tmp_path, console, 5, 5,
                         crash_reboots=0)
    assert none["convergence_aborted"].startswith("stopped at admin-down fault 1/2: ") and none["kinds"] == {}


def test_the_report_of_an_interrupted_run_is_written_before_the_error(tmp_path, monkeypatch):
    _patch_bed_io(monkeypatch)
    with pytest.raises(R.C.BenchError, match=r"stopped at admin-down fault 1/2: .*the 2 fault\(s\) measured before"):
        R.run(tmp_path, faults=2, kinds=["cable-pull", "admin-down"], phases=["convergence"],
              console=Console(file=io.StringIO()), bed=_fake_bed(crash_at=3, fail_with="fault"))
    data = R.C.load_report(tmp_path, "rdma")
    assert data["results"]["kinds"]["cable-pull"]["faults"] == 2
    by = {t["figure"]: t for t in data["targets"]}
    assert by["rdma: convergence faults run"]["value"] == 2 and by["rdma: convergence faults run"]["met"] is False
    assert "rdma: cable-pull convergence (journal convergence_us), p99" in by
    md = R.markdown(data)
    assert "**The convergence run did not finish**: stopped at admin-down fault 1/2" in md
    assert "RTNETLINK answers: No such device" in md
    assert "(2 of 4 faults measured)" in md and "Wrong bytes in the convergence run: 0;" in md


def test_a_report_with_a_guest_crash_names_it_and_counts_the_faults_not_measured(tmp_path, monkeypatch):
    _patch_bed_io(monkeypatch)
    data = R.run(tmp_path, faults=2, kinds=["cable-pull", "admin-down"], phases=["convergence"],
                 console=Console(file=io.StringIO()), bed=_fake_bed(crash_at=3))
    by = {t["figure"]: t for t in data["targets"]}
    t = by["rdma: convergence faults run"]
    assert (t["value"], t["met"]) == (4, True) and t["detail"].endswith("run again: admin-down fault 1/2")
    # the 2 cable pulls of the crashed run: failed over, but their bytes were never checked
    u = by["rdma: convergence faults whose bytes were not checked"]
    assert (u["value"], u["met"]) == (2, False) and "at most --faults-per-run 10 per crash" in u["detail"]
    md = R.markdown(data)
    assert "**Guest kernel crashes** (the guests were rebooted and the faults went on in a new checked run; a " \
           "fault a crash interrupted ran again): admin-down fault 1/2 (guest A: kernel crash" in md
    assert "(4 of 4 faults measured)" in md


def test_without_reboots_a_guest_crash_is_raised_to_the_caller_who_owns_the_bed(tmp_path, monkeypatch):
    from railover.testbed.rdma.bed import GuestCrash
    _patch_bed_io(monkeypatch)
    bed = _fake_bed(crash_at=2)
    with pytest.raises(GuestCrash, match="NULL pointer dereference"):
        R.convergence(bed, ["admin-down"], 2, "256K", 1000, tmp_path, Console(file=io.StringIO()), 5, 5,
                      crash_reboots=None)
    assert bed.reboots == 0


def test_a_guest_that_stops_answering_is_a_crash_when_its_console_says_so_else_the_phase_stops(tmp_path, monkeypatch):
    from railover.testbed.rdma.bed import GuestCrash
    _patch_bed_io(monkeypatch)
    console = Console(file=io.StringIO())

    class _Hang(_FakeFault):
        def apply(self):  # the crash_at-th application hangs instead of crashing outright
            if self.bed.applies + 1 in self.bed.crash_at:
                self.bed.applies += 1
                self.bed.crashed = self.bed.console_crash
                raise TimeoutError("guest A: no answer on its control port within 30 s")
            _FakeFault.apply(self)
    monkeypatch.setattr(R, "_make_fault", lambda bed, kind: _Hang(bed))

    def check(h):
        if bed.crashed and h == "A":
            raise GuestCrash("A", "kernel crash on the console: BUG: soft lockup")
    bed = _fake_bed(crash_at=2)
    bed.console_crash, bed._check_guest = True, check
    got = R.convergence(bed, ["admin-down"], 3, "256K", 1000, tmp_path, console, 5, 5)
    assert bed.reboots == 1 and got["kinds"]["admin-down"]["faults"] == 3 and "convergence_aborted" not in got
    assert got["convergence_crashes"][0]["error"] == "guest A: kernel crash on the console: BUG: soft lockup"
    # a slow guest with a clean console is not a crash: the phase stops, nothing is rebooted
    bed = _fake_bed(crash_at=2)
    bed.console_crash, bed._check_guest = False, check
    got = R.convergence(bed, ["admin-down"], 3, "256K", 1000, tmp_path, console, 5, 5)
    assert bed.reboots == 0 and got["convergence_crashes"] == []
    assert got["convergence_aborted"] == "stopped at admin-down fault 2/3: guest A: no answer on its control port " \
                                         "within 30 s"


def test_a_crash_before_a_fault_is_applied_retries_that_fault_and_the_target_says_none_was_lost(tmp_path, monkeypatch):
    from railover.testbed.rdma.bed import GuestCrash
    _patch_bed_io(monkeypatch)
    bed = _fake_bed(crash_at=None)
    once = {"crashed": False}

    def armed(evs):  # guest A dies while the bench waits for fault 2's comms to be armed
        if bed.applies == 1 and not once["crashed"]:
            once["crashed"] = bed.crashed = True
            raise GuestCrash("A", "QEMU exited with status -9")
        return True
    monkeypatch.setattr(R, "armed_on_primary", armed)
    data = R.run(tmp_path, faults=2, kinds=["cable-pull"], phases=["convergence"],
                 console=Console(file=io.StringIO()), bed=bed)
    r = data["results"]
    assert bed.reboots == 1 and r["kinds"]["cable-pull"]["faults"] == 2
    assert r["convergence_crashes"][0]["during_fault"] is False
    t = {t["figure"]: t for t in data["targets"]}["rdma: convergence faults run"]
    assert (t["value"], t["met"]) == (2, True) and t["detail"].endswith("; no fault lost")
    assert r["convergence_unchecked_faults"] == 1  # fault 1 ran in the crashed run: its bytes were never checked
    u = {t["figure"]: t for t in data["targets"]}["rdma: convergence faults whose bytes were not checked"]
    assert (u["value"], u["met"]) == (1, False)
    assert "1 fault(s) ran in a checked run whose ranks died with a crashed guest" in R.markdown(data)



def test_the_faults_run_in_checked_runs_of_faults_per_run_each_with_its_bytes_checked(tmp_path, monkeypatch):
    _patch_bed_io(monkeypatch)
    console = Console(file=io.StringIO())
    got = R.convergence(_fake_bed(crash_at=None), ["cable-pull", "admin-down"], 3, "256K", 1000, tmp_path,
                        console, 5, 5, faults_per_run=4)
    segs = got["convergence_segments"]
    assert [(s_["dir"], s_["first_fault"], s_["faults"], s_["ended"]) for s_ in segs] == [
        ("convergence", 0, 4, "completed"), ("convergence-2", 4, 2, "completed")]
    assert all(s_["wrong_bytes"] == 0 and s_["exit_codes"] == [0] for s_ in segs)
    assert got["kinds"]["cable-pull"]["faults"] == 3 and got["kinds"]["admin-down"]["faults"] == 3
    assert got["convergence_ok"] is True and got["convergence_unchecked_faults"] == 0
    # a crash in the second run leaves only that run's faults unchecked
    got = R.convergence(_fake_bed(crash_at=6), ["cable-pull", "admin-down"], 3, "256K", 1000, tmp_path,
                        console, 5, 5, faults_per_run=4)
    assert [s_["faults"] for s_ in got["convergence_segments"]] == [4, 1, 1]
    assert got["convergence_unchecked_faults"] == 1 and got["kinds"]["admin-down"]["faults"] == 3
    with pytest.raises(R.C.BenchError, match="faults per checked run must be >= 1"):
        R.convergence(_fake_bed(crash_at=None), ["cable-pull"], 1, "256K", 1000, tmp_path, console, 5, 5,
                      faults_per_run=0)


def test_the_bench_reads_guest_journals_with_railovers_journal_parser(tmp_path):
    """bench rdma parsed the guests' journals with a bare json.loads of its own: a line that is
    JSON but no event (a garbled ``null`` or ``7``) was returned as an event (then ``.get``
    raised AttributeError, ending the run with a traceback) where railover's journal parser,
    which every other reader uses, skips and counts it. Now both places use that parser."""
    lines = ['{"t_us": 1, "pid": 7, "event": "fatal", "why": "x"}', "null", "7",
             '{"t_us": 2, "pid": 7, "event": "path_up", "nic": "eth1"}', '{"t_us": 3, "pid": 7, "ev']
    bed = SimpleNamespace(sh=lambda host, script, timeout_s=60: (0, "\n".join(lines), ""))
    assert [e["event"] for e in R._journal(bed, "A", "/tmp/x")] == ["fatal", "path_up"]
    j = tmp_path / "journal-rank0.jsonl"
    j.write_text("\n".join(lines) + "\n")
    assert R._fatal_events([j, tmp_path / "missing.jsonl"]) == 1
