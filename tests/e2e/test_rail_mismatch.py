"""Hosts whose rails do not match: 2 hosts x 3 NICs, one railover-perf rank per host, three
channels spread over the NICs (``--dev-spread``, as NCCL spreads channels), every byte checked.

Before railover paired by subnet, a peer whose rails were swapped (RAILOVER_RAILS, another NIC
order) gave standby paths that crossed the rail-isolated switches: each timed out after 3 s,
again and again, with nothing at NCCL_DEBUG=WARN; a peer missing a rail gave a primary that
crossed rails, as silently. Now the pairs follow the subnets where they show the mismatch,
and one WARN per NIC and kind names it.
"""
from __future__ import annotations

import re

import pytest

from railover.testbed.scenario import run_scenario

pytestmark = pytest.mark.netns


def _run(tb, rank1_env):
    return run_scenario(tb, [], duration_s=3, channels=3, extra_args=["--dev-spread"], rank_envs={1: rank1_env})


def _warns(res, rank):
    return [l for l in (res.workdir / f"rank{rank}.err").read_text().splitlines() if "NCCL WARN railover: " in l]


def _mismatches(res, rank):
    """The rail_mismatch journal events of `rank`: (nic, kind, message)."""
    return [(e["nic"], e["kind"], e["message"]) for e in res.events if e["rank"] == rank and e["event"] == "rail_mismatch"]


def _timeouts(res, rank):
    return [(e["nic"], e["peer"]) for e in res.events if e["rank"] == rank and e["event"] == "path_state"
            and e.get("to") == "failed" and "connect timed out" in e.get("reason", "")]


def test_swapped_rails_pair_by_subnet_and_are_named(testbed):
    tb = testbed(hosts=2, nics=3)
    a0, a1, _ = tb.hosts[0].nics
    b0, b1, b2 = tb.hosts[1].nics
    res = _run(tb, {"RAILOVER_RAILS": f"{b0.ifname}=1,{b1.ifname}=0,{b2.ifname}=2"})
    assert res.wrong_bytes == 0
    for rank in (0, 1):
        # every comm has its primary and both standbys up, none spent a connect timeout
        ups = [e for e in res.events if e["rank"] == rank and e["event"] == "path_up" and e["dir"] == "send"]
        assert len(ups) == 9, ups
        assert not _timeouts(res, rank)
        # each up pair is on one subnet (one rail switch)
        for e in ups:
            nic = next(n for n in tb.hosts[rank].nics if n.ifname == e["nic"])
            assert e["peer"].rsplit(".", 1)[0] == nic.addr.rsplit(".", 1)[0], e
    warns = _warns(res, 0)
    named = [w for w in warns if f"would pair by rail with the peer's {b1.addr} (rail 0), not on its subnet" in w]
    assert len(named) == 1, warns
    assert f"NIC {a0.ifname} (10.0.0.0/24, rail 0)" in named[0] and f"the peer's {b0.addr} (rail 1)" in named[0]
    assert "RAILOVER_RAILS" in named[0]
    # once per NIC and kind, not once per comm
    keys = [re.search(r"NIC (\S+) ", w).group(1) for w in warns]
    assert len(keys) == len(set(keys)), warns
    # the journal says the same, one event per WARN, for status and the exporter's readers
    journaled = _mismatches(res, 0)
    assert sorted(m for _, _, m in journaled) == sorted(w.split("NCCL WARN railover: ", 1)[1] for w in warns)
    assert (a0.ifname, "standby_repaired") in {(n, k) for n, k, _ in journaled}, journaled


def test_a_host_missing_a_rail_is_named_and_the_job_runs(testbed):
    tb = testbed(hosts=2, nics=3)
    a0, _, a2 = tb.hosts[0].nics
    b0, b1, _ = tb.hosts[1].nics
    res = _run(tb, {"RAILOVER_IFNAMES": f"={b0.ifname},{b1.ifname}"})
    assert res.wrong_bytes == 0
    # A's comm from a2 (NCCL's choice) to B's b0: kept, named, carried on its standby meanwhile
    warns = _warns(res, 0)
    kept = [w for w in warns if f"NIC {a2.ifname} (10.0.2.0/24, rail 2) connects to the peer's {b0.addr}" in w]
    assert len(kept) == 1, warns
    assert f"on the subnet of local NIC {a0.ifname}" in kept[0] and "carries these comms on their standby paths" in kept[0]
    assert set(_timeouts(res, 0)) <= {(a2.ifname, b0.addr)}
    assert (a2.ifname, "primary_off_subnet", kept[0].split("NCCL WARN railover: ", 1)[1]) in _mismatches(res, 0)
    # B's comm from b0 to A's a2 connects to a0 instead, at once
    (moved,) = [w for w in _warns(res, 1) if "was to connect" in w]
    assert f"NIC {b0.ifname} (10.0.0.0/24, rail 0) was to connect to the peer's {a2.addr} (rail 2)" in moved, moved
    assert f"connects to the peer's {a0.addr} (rail 0) on its subnet instead" in moved
    assert (b0.ifname, "primary_repaired") in {(n, k) for n, k, _ in _mismatches(res, 1)}
    assert not _timeouts(res, 1)
