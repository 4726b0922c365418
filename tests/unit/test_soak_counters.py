"""The soak's per-rank process counters (``railover.bench.soak.rank_counters``): a rank that
died before the first sample (a driver that aborted at start, e.g. on a duration it could not
hold) crashed the summary with a TypeError; now it is listed without growth, its exit being
among the soak's errors."""
from __future__ import annotations

from railover.bench.soak import rank_counters


def _s(t_us, **ranks):
    return {"t_us": t_us, "ranks": {r: dict(v) for r, v in ranks.items()}}


ALIVE = {"rss_kib": 10000, "fds": 12, "threads": 5}
GONE = {"rss_kib": None, "fds": None, "threads": None}


def test_a_rank_gone_before_the_first_sample_is_listed_without_growth():
    start = _s(0, **{"0": ALIVE, "1": GONE})
    end = _s(3, **{"0": dict(ALIVE, rss_kib=20000), "1": GONE})
    samples = [start, _s(1, **{"0": ALIVE, "1": GONE}), _s(2, **{"0": ALIVE, "1": GONE}), end]
    counters, growth = rank_counters(start, end, samples)
    assert counters["1"]["rss_tolerance_kib"] is None and counters["1"]["rss_max_kib"] is None
    # rank 0 still judged: +10000 KiB is past its tolerance (4096 + 2 % of 10000)
    assert counters["0"]["rss_tolerance_kib"] == 4296 and counters["0"]["rss_max_kib"] == 20000
    assert growth == ["rank 0: RSS 10000 -> 20000 KiB (tolerance +4296 KiB)"]


def test_a_rank_gone_at_the_end_is_not_reported_as_growth():
    start = _s(0, **{"0": ALIVE})
    counters, growth = rank_counters(start, _s(2, **{"0": GONE}), [start, _s(1, **{"0": ALIVE})])
    assert growth == [] and counters["0"]["rss_tolerance_kib"] == 4296


def test_fds_and_threads_that_changed_are_growth():
    start = _s(0, **{"0": ALIVE})
    end = _s(2, **{"0": dict(ALIVE, fds=13)})
    counters, growth = rank_counters(start, end, [start, end])
    assert growth == ["rank 0: fds 12 -> 13"]
