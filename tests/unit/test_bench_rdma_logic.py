"""`railover bench rdma`'s pure logic: perftest parsing, the CPU split, per-fault figures from
journal events, per-kind statistics, busbw ratios, the issue's targets and the markdown table.
The bed itself is exercised by tests/rdma/test_rdma_bench.py."""
from __future__ import annotations

from pathlib import Path

import pytest

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
