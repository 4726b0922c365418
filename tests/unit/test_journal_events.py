"""The journal's events as the plugin declares them (native/telemetry/events.h, exported by
railover_describe_json) against every Python reader and docs/OPERATIONS.md: a new event
without reader or doc coverage fails here; events a reader does not know are counted and
reported, not dropped."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from railover import journal, params
from railover.ops import exporter as ex
from railover.ops import state as st
from railover.testbed import scenario

from ops_fixtures import append_events

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = {"string": "eth0", "integer": 1500, "integer?": 7, "boolean": True, "comm": "42"}


@pytest.fixture(scope="module")
def declared():
    return params.events()


def sample_events(declared) -> List[Dict[str, Any]]:
    """One line per declared event, every field with a value of its declared type."""
    return [dict({"t_us": 1000 + i, "pid": 1, "event": e["name"]}, **{f["name"]: SAMPLE[f["type"]] for f in e["fields"]})
            for i, e in enumerate(declared)]


def test_readers_know_exactly_the_declared_events(declared):
    have = {name: list(fields.items()) for name, fields in journal.EVENTS.items()}
    want = {e["name"]: [(f["name"], f["type"]) for f in e["fields"]] for e in declared}
    assert have == want, ("railover.journal.EVENTS differs from native/telemetry/events.h: "
                          f"missing {sorted(want.keys() - have.keys())}, extra {sorted(have.keys() - want.keys())}")
    assert [f["name"] for f in params.describe()["journal"]["common_fields"]] == list(journal.COMMON_FIELDS)


def test_operations_doc_lists_every_event():
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    want = params.replace_block(text, params.EVENTS_BEGIN, params.EVENTS_END, params.render_events_markdown(params.describe()))
    assert text == want, ("docs/OPERATIONS.md's event table differs from native/telemetry/events.h; "
                          "run: PYTHONPATH=src RAILOVER_NATIVE_DIR=build python3 scripts/update_docs.py")


def test_status_formats_every_event_and_reports_unknown_ones(tmp_path, declared):
    j = tmp_path / "events.jsonl"
    evs = sample_events(declared)
    append_events(j, evs + [{"t_us": 9000, "pid": 1, "event": "from_the_future", "x": 1}], partial='{"t_us": 1')
    with open(j, "a") as f:
        f.write("\nnot json\n")
    stats = journal.Stats()
    got = st.read_journal(j, stats)
    assert [e["event"] for e in got] == [e["name"] for e in declared] + ["from_the_future"]
    assert stats.unknown == {"from_the_future": 1} and stats.garbled == 2   # the cut line and "not json"
    for e in got[:-1]:
        text = st.format_event(e)
        shown = [part.split("=")[0] for part in text.split(" ") if "=" in part]
        fields = [f[:-3] if f.endswith("_us") else f for f in journal.EVENTS[e["event"]]]
        assert shown and set(shown) <= set(fields), (e["event"], text)
    assert st.format_event(got[-1]) == "x=1"     # an unknown event shows all its fields
    snap = st.snapshot([tmp_path / "no-state"], [j], events=100)
    assert snap["journal"] == {"unknown": {"from_the_future": 1}, "garbled": 2}
    assert "from_the_future" in [e["event"] for e in snap["events"]]


def test_recover_is_read_like_failover_and_failback(tmp_path):
    # The former reader had no entry for `recover`: it showed all fields and the exporter
    # neither counted it nor put its convergence in the histogram.
    e = {"t_us": 1, "pid": 1, "event": "recover", "comm": "9", "to_nic": "eth0", "peer": "10.0.0.2",
         "resumed_seq": 3, "bytes_resent": 4096, "convergence_us": 2500}
    assert st.format_event(e) == "comm=9 to_nic=eth0 peer=10.0.0.2 bytes_resent=4096 convergence=2.5ms"
    j = tmp_path / "events.jsonl"
    append_events(j, [e, dict(e, t_us=2, event="failover", convergence_us=1000)])
    col = ex.RailoverCollector([tmp_path / "state"], [j], proc=tmp_path / "proc")
    fams = {f.name: f for f in col.collect()}
    hist = {(s.name, s.labels.get("event"), s.labels.get("le")): s.value for s in fams["railover_convergence_seconds"].samples}
    assert hist[("railover_convergence_seconds_count", "recover", None)] == 1
    assert hist[("railover_convergence_seconds_sum", "recover", None)] == pytest.approx(0.0025)
    rec = {tuple(sorted(s.labels.items())): s.value for s in fams["railover_recoveries"].samples
           if s.name == "railover_recoveries_total"}
    assert rec == {(("nic", ""), ("rank", "pid:1")): 1}
    resent = [s.value for s in fams["railover_bytes_resent"].samples if s.name == "railover_bytes_resent_total"]
    assert resent == [8192]


def test_exporter_counts_every_event_and_unknown_ones(tmp_path, declared):
    j = tmp_path / "events.jsonl"
    append_events(j, sample_events(declared) + [{"t_us": 9000, "pid": 1, "event": "from_the_future"}])
    col = ex.RailoverCollector([tmp_path / "state"], [j], proc=tmp_path / "proc")
    fams = {f.name: f for f in col.collect()}
    seen = {s.labels["event"]: s.value for s in fams["railover_events"].samples if s.name == "railover_events_total"}
    assert seen == dict({e["name"]: 1 for e in declared}, from_the_future=1)
    unknown = {s.labels["event"]: s.value for s in fams["railover_journal_unknown_events"].samples
               if s.name == "railover_journal_unknown_events_total"}
    assert unknown == {"from_the_future": 1}


def test_testbed_and_bench_readers_count_unknown_events(tmp_path, declared):
    from railover.bench.common import JournalTail
    j = tmp_path / "events-rank0.jsonl"
    append_events(j, sample_events(declared) + [{"t_us": 9000, "pid": 1, "event": "from_the_future"}])
    stats = journal.Stats()
    assert len(scenario.read_journal(j, stats)) == len(declared) + 1 and stats.unknown == {"from_the_future": 1}
    tail = JournalTail(j, 3)
    got = tail.read_new()
    assert len(got) == len(declared) + 1 and {e["rank"] for e in got} == {3}
    assert tail.stats.unknown == {"from_the_future": 1}
    append_events(j, [], partial='{"t_us": 9001, "pid": 1, "event": "nic_down"')
    assert tail.read_new() == []          # a partial line waits for its end
    with open(j, "a") as f:
        f.write(', "nic": "eth1", "signal": "carrier lost"}\n')
    assert [e["nic"] for e in tail.read_new()] == ["eth1"]


def test_a_known_event_with_a_field_of_another_type_is_an_unreadable_line():
    """A "failover" line with to_nic null, bytes_resent -1 or convergence_us 1e300 was counted
    as a failover on NIC "" by status and the exporter, and the unreadable-lines counter stayed
    0 (found by a fresh-user trial). The plugin writes each field with its declared type (its
    integers unsigned 64-bit); a field an older plugin did not write may be absent."""
    base = {"t_us": 1, "pid": 2, "event": "failover", "comm": "9", "to_nic": "eth1", "peer": "10.0.1.2",
            "resumed_seq": 3, "bytes_resent": 0, "convergence_us": 800}
    stats = journal.Stats()
    assert journal.parse_line(json.dumps(base), stats) == base
    assert journal.parse_line(json.dumps({k: v for k, v in base.items() if k != "to_nic"}), stats) is not None
    for field, bad in (("to_nic", None), ("bytes_resent", -1), ("convergence_us", 1e300), ("convergence_us", True),
                       ("resumed_seq", "3"), ("comm", 9), ("bytes_resent", 1 << 64)):
        assert journal.parse_line(json.dumps(dict(base, **{field: bad})), stats) is None, (field, bad)
    assert journal.parse_line(json.dumps({"t_us": 1, "event": "path_down", "comm": "1", "active": "yes"}), stats) is None
    assert stats.garbled == 8 and not stats.unknown
    # an event this railover does not know is returned whatever its fields (a newer plugin's)
    assert journal.parse_line(json.dumps({"t_us": 1, "event": "new_thing", "to_nic": None}), stats) is not None
    assert stats.unknown == {"new_thing": 1}
