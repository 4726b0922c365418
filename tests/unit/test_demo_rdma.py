"""``railover demo --transport rdma``: fault parsing, the survival verdict and the story table
(logic only; the bed run is tests/rdma/test_rdma_demo.py)."""
import pytest
from rich.console import Console

from railover import demo_rdma as D


def test_faults_are_the_rdma_benchmarks_kinds():
    assert D.parse_faults("cable-pull, silent") == ["cable-pull", "silent"]
    assert D.parse_faults(D.DEFAULT_FAULTS) == ["cable-pull", "silent"]


@pytest.mark.parametrize("spec, needle", [
    ("port-down:a0", "unknown RDMA fault kind(s) 'port-down:a0'"),  # the TCP demo's syntax
    ("", "--faults is empty"),
    ("silent,silent", "names a kind twice"),
    ("cable-pull,,silent", "has an empty item"),
    ("cable-pull,", "has an empty item"),
])
def test_bad_faults_are_named(spec, needle):
    with pytest.raises(D.DemoError) as e:
        D.parse_faults(spec)
    assert needle in str(e.value)


def _cycle(failovers=2, failbacks=2):
    return {"failovers": failovers, "failbacks": failbacks, "convergence_ms": [12.5, 30.0][:failovers],
            "fault_to_failover_a_ms": 40.0 if failovers else None, "failback_convergence_ms": [8.0][:failbacks]}


def _results(cycles, wrong=0, fatal=0, codes=(0, 0)):
    return {"kinds": {"cable-pull": {"faults_without_failover": sum(1 for c in cycles if not c["failovers"]),
                                     "faults_without_failback": sum(1 for c in cycles if c["failovers"] and not c["failbacks"]),
                                     "cycles": cycles}},
            "convergence_wrong_bytes": wrong, "convergence_fatal_total": fatal, "convergence_exit_codes": list(codes)}


def test_a_clean_run_survived():
    assert D.verdict(_results([_cycle()])) == []


@pytest.mark.parametrize("res, needle", [
    (_results([_cycle(failovers=0, failbacks=0)]), "cable-pull: no failover"),
    (_results([_cycle(failbacks=0)]), "no failback"),
    (_results([_cycle()], wrong=5), "5 wrong bytes"),
    (_results([_cycle()], fatal=1), "1 fatal"),
    (_results([_cycle()], codes=(0, 3)), "ranks exited 0, 3"),
    (_results([_cycle()], codes=()), "ranks exited (none)"),
    (dict(_results([_cycle()]), convergence_aborted="stopped at admin-down fault 1/1: boom"),
     "the run did not finish: stopped at admin-down fault 1/1"),
    (dict(_results([_cycle()]), convergence_crashes=[{"at": "admin-down fault 1/1", "during_fault": True,
                                                      "error": "guest A: kernel crash"}]),
     "a guest kernel crash under admin-down fault 1/1 (run again)"),
    (dict(_results([_cycle()]), convergence_unchecked_faults=2), "2 fault(s) whose bytes were not checked"),
])
def test_each_failure_is_named(res, needle):
    why = D.verdict(res)
    assert any(needle in w for w in why), why


def test_story_table_has_a_row_per_fault():
    c = Console(width=200, record=True)
    c.print(D.story_table(_results([_cycle(), _cycle(failovers=0, failbacks=0)])))
    text = c.export_text()
    assert "12.5, 30.0" in text and text.count("cable-pull") == 2
