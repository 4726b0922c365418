"""``railover bench healthy --against``: which plugin it takes, and the error for a path that
holds none (no test bed needed)."""
from pathlib import Path

import pytest

from railover.bench import common as C
from railover.bench import healthy


def _a_build(d: Path) -> Path:
    """A copy of this railover build in ``d``, as another build to compare against."""
    import shutil
    from railover import _paths
    d.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(_paths.plugin_path(), d / "libnccl-net-railover.so"))


def test_against_takes_the_plugin_file_or_the_directory_holding_it(tmp_path: Path):
    so = _a_build(tmp_path)
    assert healthy.against_path(tmp_path) == so.resolve()
    assert healthy.against_path(so) == so.resolve()


def test_against_without_a_plugin_names_the_path(tmp_path: Path):
    with pytest.raises(C.BenchError, match=r"--against .*empty: no libnccl-net-railover.so there"):
        healthy.against_path(tmp_path / "empty")


def test_against_a_file_that_is_no_plugin_is_refused_up_front(tmp_path: Path):
    """`bench failover --against /etc/passwd` ran a whole railover round of faults before the
    other build's ranks failed to dlopen it."""
    bad = tmp_path / "libnccl-net-railover.so"
    bad.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(C.BenchError, match=r"does not load as a shared library"):
        healthy.against_path(bad)
    import shutil
    libc = next(p for p in (Path("/lib/x86_64-linux-gnu/libz.so.1"), Path("/usr/lib/x86_64-linux-gnu/libz.so.1"),
                            Path("/lib64/libz.so.1")) if p.exists())
    shutil.copy(libc, bad)
    with pytest.raises(C.BenchError, match=r"exports no NCCL net plugin"):
        healthy.against_path(tmp_path)


def test_against_is_measured_right_after_armed_in_every_round():
    names = [n for n, _ in healthy._configs(2, quick=True, nstreams=[2], against=True)]
    assert names[:2] == ["armed", healthy.AGAINST] and healthy.BASELINE in names
    assert healthy.AGAINST not in [n for n, _ in healthy._configs(2, quick=True, nstreams=[2])]


# ---- railover bench failover --against: interleaving and the per-kind comparison (the runs
# themselves are replaced: these tests check the bookkeeping, not a bed)

def _cycle(conv: float, failovers: int = 1) -> dict:
    keys = ("max_run_delay_ms", "detection_ms", "first_convergence_ms", "engine_convergence_ms", "stall_ms",
            "apply_ms", "normal_gap_ms", "bytes_resent", "failback_ms")
    c = {k: conv / 2 for k in keys}
    c.update(valid=True, convergence_ms=conv, failovers=failovers)
    return c


def _fake_runs(monkeypatch, tmp_path: Path, conv_by_plugin):
    """Replaces the bed and the live runs; returns the list of (kind, plugin, n) calls."""
    from railover.bench import failover as fo

    class Bed:
        prefix = "rofake"

        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    calls = []

    def live_run(tb, kind, n, env, size, hold, wd, journals, console, plugin=None, label=""):
        calls.append((kind, plugin, n))
        conv = conv_by_plugin[plugin is not None]
        # one failover outside any fault window per run of the other build
        return {"cycles": [_cycle(conv) for _ in range(n)], "failovers": n + (1 if plugin else 0), "flaps": 0,
                "wrong_bytes": 0, "rank_exit_codes": [0, 0], "iterations": 100, "error": None}

    monkeypatch.setattr(fo, "TestBed", Bed)
    monkeypatch.setattr(fo, "_live_run", live_run)
    monkeypatch.setattr(fo, "_plot", lambda rep, per_kind: None)
    return calls


def test_failover_against_interleaves_both_builds_and_compares_per_kind(monkeypatch, tmp_path: Path):
    from rich.console import Console
    from railover.bench import failover as fo
    so = _a_build(tmp_path / "old")
    calls = _fake_runs(monkeypatch, tmp_path, {False: 10.0, True: 20.0})
    data = fo.run(tmp_path / "out", faults=5, kinds=["port-down", "silent"], console=Console(file=open("/dev/null", "w")),
                  against=so.parent)
    # per kind: 5 faults in 2 rounds (3 + 2), order new-old then old-new
    assert [(k, p is not None, n) for k, p, n in calls] == [
        ("port-down", False, 3), ("port-down", True, 3), ("port-down", True, 2), ("port-down", False, 2),
        ("silent", False, 3), ("silent", True, 3), ("silent", True, 2), ("silent", False, 2)]
    assert all(p in (None, so.resolve()) for _, p, _ in calls)
    v = data["results"]["vs_against"]["port-down"]
    assert v["convergence_p99"] == pytest.approx(0.5) and v["convergence_p50"] == pytest.approx(0.5)
    assert v["false_failovers"] == [0, 2]  # the other build's run-level extra failover, in each of its 2 runs
    assert data["results"]["kinds"]["silent"]["faults"] == 5 and data["results"]["against"]["kinds"]["silent"]["runs"] == 2
    md = fo.markdown(data)
    assert "p99 this/other" in md and "| port-down | 5 / 5 |" in md
    names = [t["figure"] for t in data["targets"]]
    assert "failover (against): silent wrong bytes" in names and "failover: silent wrong bytes" in names


def test_failover_without_against_runs_each_kind_once(monkeypatch, tmp_path: Path):
    from rich.console import Console
    from railover.bench import failover as fo
    calls = _fake_runs(monkeypatch, tmp_path, {False: 10.0, True: 20.0})
    data = fo.run(tmp_path / "out", faults=4, kinds=["one-way"], console=Console(file=open("/dev/null", "w")))
    assert calls == [("one-way", None, 4)]
    assert "vs_against" not in data["results"] and "p99 this/other" not in fo.markdown(data)


def test_failover_refuses_an_unknown_kind_before_building_a_bed(tmp_path: Path):
    from railover.bench import failover as fo
    with pytest.raises(C.BenchError, match="unknown fault kind.*'bogus'.*known: port-down"):
        fo.run(tmp_path, kinds=["bogus"])


def test_a_kind_with_fewer_counted_faults_than_asked_misses_its_count_target(monkeypatch, tmp_path: Path):
    """On a busy host an injection can take longer than MAX_APPLY_MS: the cycle runs but is not
    counted. A kind left with fewer counted faults than asked says so in its targets, instead of
    reporting percentiles over a handful as if they were the asked-for count."""
    from rich.console import Console
    from railover.bench import failover as fo
    _fake_runs(monkeypatch, tmp_path, {False: 10.0, True: 20.0})
    real = fo._live_run

    def slow_injections(tb, kind, n, *a, **k):
        res = real(tb, kind, n, *a, **k)
        if kind == "host-down":  # all but 2 of its injections too slow to know their instant
            for c in res["cycles"][2:]:
                c["valid"] = False
        return res

    monkeypatch.setattr(fo, "_live_run", slow_injections)
    data = fo.run(tmp_path / "out", faults=6, kinds=["host-down", "port-down"],
                  console=Console(file=open("/dev/null", "w")))
    t = {x["figure"]: x for x in data["targets"]}
    short, full = t["failover: host-down faults counted"], t["failover: port-down faults counted"]
    assert (short["value"], short["met"], short["target"]) == (2, False, ">= 6")
    assert "4 more run but not counted" in short["detail"] and f"over {fo.MAX_APPLY_MS:g} ms" in short["detail"]
    assert (full["value"], full["met"]) == (6, True)
    assert short in C.misses(data) and full not in C.misses(data)
