"""``railover soak``: the two-minute run CI does (random faults of every kind against a
checked all-reduce, then the verdict), and the logic that judges hangs and draws faults.

The two-minute run takes about 2 min 20 s (test bed, warm-up, settle and analysis included).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from railover.bench import soak


def _fake_bed(hosts: int = 2, nics: int = 2):
    hs = []
    for i in range(hosts):
        label = chr(ord("A") + i)
        ns = [SimpleNamespace(name=f"{label.lower()}{r}", index=r, host=label, addr=f"10.0.{r}.{i + 1}")
              for r in range(nics)]
        hs.append(SimpleNamespace(name=label, nics=ns))
    return SimpleNamespace(hosts=hs)


def test_planner_is_reproducible_and_covers_every_kind():
    a = [soak.Planner(_fake_bed(), 42).next() for _ in range(1)]
    p1, p2, p3 = soak.Planner(_fake_bed(), 42), soak.Planner(_fake_bed(), 42), soak.Planner(_fake_bed(), 43)
    s1 = [p1.next() for _ in range(27)]
    s2 = [p2.next() for _ in range(27)]
    s3 = [p3.next() for _ in range(27)]
    assert s1 == s2 and s1[0] == a[0]
    assert s1 != s3
    for k in range(3):  # every kind once per round of nine
        assert sorted(p.kind for p in s1[9 * k:9 * k + 9]) == sorted(soak.KINDS)
    for p in s1:
        lo, hi = soak.BOTH_DOWN_S if p.kind == "both-down" else soak.FAULT_S
        if p.kind != "flap":
            assert lo <= p.hold_s <= hi
        assert soak.GAP_S[0] <= p.gap_s <= soak.GAP_S[1]


def test_gaps_and_hang_judgement():
    ms = 1000
    b = [(t * ms, 0 if 100 <= t < 12_200 or 20_000 <= t < 23_000 else 5) for t in range(30_000)]
    g = soak.gaps(b, 200)
    assert g == [(100 * ms, 12_200 * ms), (20_000 * ms, 23_000 * ms)]
    # 12.1 s without progress and no both-down fault over it: a hang (bound 10 s).
    hangs = soak.judge_gaps(g, [], 10.0, 30_000 * ms)
    assert [h["start_us"] for h in hangs] == [100 * ms]
    # The same gap over a both-down fault repaired at 5 s: progress came 7.2 s after the repair.
    rec = [{"kind": "both-down", "t_apply": 50 * ms, "t_undo": 5_000 * ms}]
    assert soak.judge_gaps(g, rec, 10.0, 30_000 * ms) == []
    rec = [{"kind": "port-down", "t_apply": 50 * ms, "t_undo": 5_000 * ms}]
    assert len(soak.judge_gaps(g, rec, 10.0, 30_000 * ms)) == 1


def test_parse_duration():
    assert soak.parse_duration("2m") == 120 and soak.parse_duration("1h") == 3600
    assert soak.parse_duration("90") == 90 and soak.parse_duration("1h30m") == 5400
    for bad in ("", "2x", "-1", "m", "0"):
        with pytest.raises(ValueError):
            soak.parse_duration(bad)


@pytest.mark.netns
def test_soak_two_minutes_clean(tmp_path: Path):
    out = tmp_path / "soak"
    cmd = [sys.executable, "-m", "railover.cli", "soak", "--duration", "2m", "--seed", "7", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    data = json.loads((out / "soak.json").read_text())
    res = data["results"]
    assert res["clean"] is True and res["verdict"] == {"wrong_bytes": 0, "hangs": 0, "errors": 0, "growth": 0}
    assert data["settings"]["seed"] == 7
    # Every kind was injected, and faults moved traffic (and back).
    assert all(v["faults"] >= 1 for v in res["per_kind"].values()), res["per_kind"]
    assert res["failovers"] >= 1 and res["failbacks"] >= 1, (res["failovers"], res["failbacks"])
    assert sum(v["with_failover"] for v in res["per_kind"].values()) >= 1
    # The ranks ran for the whole duration and every rank's counters were sampled.
    assert min(res["run_s"].values()) >= 115, res["run_s"]
    assert res["rank_exit_codes"] == [0, 0]
    assert set(res["counters"]) == {"0", "1"}
    for v in res["counters"].values():
        assert v["start"]["fds"] == v["end"]["fds"] and v["start"]["threads"] == v["end"]["threads"]
    assert "verdict" in r.stdout and "clean" in r.stdout
    assert not list(out.glob("soak-work"))


@pytest.mark.parametrize("args,rc,msg", [
    (["--duration", "10"], 2, "at least 60 s"),
    (["--duration", "abc"], 2, "bad duration"),
    (["--kinds", "bogus", "--duration", "2m"], 2, "unknown fault kind"),
    (["--layout", "X9"], 2, "unknown layout"),
])
def test_soak_bad_input_is_named(tmp_path: Path, args, rc, msg):
    r = subprocess.run([sys.executable, "-m", "railover.cli", "soak", *args, "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stdout + r.stderr
    assert msg in (r.stdout + r.stderr).replace("\n", " ")
    assert "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "o").exists()
