"""Operating railover on the network-namespace test bed: state files, `railover status` and
the exporter while a railover-perf job fails over; doctor on healthy and broken hosts;
launch; drill (refusal, restore on SIGTERM, and the report of a failover it caused).

Every wait polls a condition with a deadline; the only timed waits are the fault schedules
themselves.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from railover import envvars
from railover.ops import exporter
from railover.testbed import faults
from railover.testbed import netns as tbmod
from railover.ops import state as st
from railover.cli import app
from railover.testbed.scenario import run_scenario
from railover.testbed.netns import netlink, poll_until

pytestmark = pytest.mark.netns

# Subprocesses import the same railover this test process imported (the installed package in
# CI, src/ in a developer tree), so they find the same native files.
import railover as _railover_pkg  # noqa: E402

SRC = str(Path(_railover_pkg.__file__).resolve().parent.parent)
RANKS = {0: {"RANK": "0"}, 1: {"RANK": "1"}}
FAST = {"RAILOVER_HOLD_DOWN_MS": "1000"}


def scrape(url: str) -> List:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def total(samples, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def cli(*args: str) -> List[str]:
    """argv of the railover CLI run by this interpreter."""
    return [sys.executable, "-m", "railover.cli", *args]


def _armed(snap) -> bool:
    """Both ranks run, each with its send and recv comm on the primary and a standby ready."""
    procs = [p for h in snap["hosts"].values() for p in h["processes"] if not p["stale"]]
    return len(procs) == 2 and all(len(p["comms"]) == 2 and all(c["health"] == "ok" for c in p["comms"]) for p in procs)


def test_status_and_exporter_follow_a_failover(testbed, tmp_path):
    tb = testbed("T2")
    a0 = tb.nic("a0")
    sd = tmp_path / "state"
    sd.mkdir()
    port_down = faults.PortDown(a0)
    seen: Dict[str, object] = {}
    with exporter.serve([sd], addr="127.0.0.1", port=0) as srv:

        def tick(now_s: float) -> None:
            # The port goes down as soon as the state files show both ranks armed (baseline
            # scraped first) and comes back 2 s later; the job runs on for the failback.
            if "base" not in seen:
                if now_s < 6 and _armed(st.snapshot([sd], events=0)):
                    seen["base"] = scrape(srv.url)
                    port_down.apply()
                    seen["down_at_s"] = now_s
                return
            if port_down.active and now_s - seen["down_at_s"] >= 2.0:
                port_down.undo()
            if port_down.active and "during" not in seen:
                snap = st.snapshot([sd], events=0)
                if snap["totals"]["failed_over"] >= 1:
                    seen["during"] = snap
                    seen["status"] = CliRunner().invoke(app, ["status", "--state-dir", str(sd), "--events", "5"]).output

        try:
            res = run_scenario(tb, [], duration_s=12, env=dict(FAST, RAILOVER_STATE_DIR=str(sd)), rank_envs=RANKS,
                               on_tick=tick)
        finally:
            port_down.undo()
        assert res.wrong_bytes == 0
        assert "base" in seen, "the state files never showed both ranks armed in the first 6 s"
        base = seen["base"]
        # What the fault must cause, from the exporter's own view before it: every send comm
        # whose active path used a0 (rank 0 sends from it, rank 1 sends to its address) fails over.
        active_over_a0 = [s for s in base if s.name == "railover_path_active" and s.value == 1
                          and s.labels["dir"] == "send" and (s.labels["nic"] == a0.ifname or s.labels["peer"] == a0.addr)]
        expected = len(active_over_a0)
        assert expected == 2, [s.labels for s in base if s.name == "railover_path_active"]
        assert {s.labels["rank"] for s in active_over_a0} == {"0", "1"}

        # status while the port was down: both send comms off their primary, on rail 1
        assert "during" in seen, "status never showed a failed-over comm while the port was down"
        during = seen["during"]
        moved = [c for h in during["hosts"].values() for p in h["processes"] for c in p["comms"]
                 if c["health"] == "failed-over"]
        assert moved and all(c["active_nic"] in (tb.nic("a1").ifname, tb.nic("b1").ifname) for c in moved), moved
        assert "failed-over" in seen["status"] and "traffic on" in seen["status"], seen["status"]
        # each process says which transport its paths use (no RDMA device in a namespace bed: tcp)
        assert all(p["transport"] == "tcp" for h in during["hosts"].values() for p in h["processes"]), during
        assert "transport" in seen["status"] and "tcp" in seen["status"], seen["status"]
        # TCP has no HCA port behind a NIC: "rdma" is null in every NIC entry, status shows no
        # port columns and the exporter no port series
        nics = [n for h in during["hosts"].values() for p in h["processes"] for n in p["nics"]]
        assert nics and all("rdma" in n and n["rdma"] is None for n in nics), nics
        assert "HCA port" not in seen["status"], seen["status"]
        assert not [s for s in base if s.name.startswith("railover_nic_rdma_port")], base

        # after the job: processes gone (they exited normally and removed their state files),
        # counters kept (from their journals), increased by exactly the failovers caused
        journal_fo = res.count("failover")
        journal_fb = res.count("failback")
        assert journal_fo == expected, res.select("failover")
        after = scrape(srv.url)
        for metric, n in (("railover_failovers_total", journal_fo), ("railover_failbacks_total", journal_fb)):
            assert total(after, metric) - total(base, metric) == n, metric
        assert journal_fb >= expected
        assert total(after, "railover_failovers_total", rank="0") + total(after, "railover_failovers_total", rank="1") \
            == journal_fo
        assert total(after, "railover_fatal_errors_total") == 0
        assert total(after, "railover_processes", state="stale") == 0
        assert total(after, "railover_processes", state="live") == 0
        assert total(after, "railover_events_total", event="failover") == journal_fo
        assert total(after, "railover_convergence_seconds_count", event="failover") == journal_fo
        conv = sorted(e["convergence_us"] / 1e6 for e in res.select("failover"))
        assert total(after, "railover_convergence_seconds_sum", event="failover") == pytest.approx(sum(conv))

    # `railover status --json` afterwards: no processes (a normal exit removes the state file).
    cp = subprocess.run(cli("status", "--state-dir", str(sd), "--json", "--events", "200"), env=dict(os.environ, PYTHONPATH=SRC),
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    procs = [p for h in doc["hosts"].values() for p in h["processes"]]
    assert procs == [], procs
    assert not list(sd.glob("railover-*.json")), list(sd.iterdir())


def _doctor(tb, host: str, peers: List[str]):
    h = tb.host(host)
    env = dict(envvars.nccl_env(), PYTHONPATH=SRC, RAILOVER_IFNAMES="=" + ",".join(n.ifname for n in h.nics))
    args = cli("doctor", "--json", "--no-torch", "--probe-port", "9")
    for p in peers:
        args += ["--peer", p]
    rc, out, err = tb.run_collect(host, args, env=env, timeout_s=60)
    assert out, err
    doc = json.loads(out)
    fails = {(c["section"], c["what"]) for c in doc["checks"] if c["status"] == "FAIL"}
    return rc, doc, fails


def test_doctor_on_a_healthy_and_a_broken_host(testbed):
    tb = testbed("T2")
    a0, a1, b0, b1 = (tb.nic(n) for n in ("a0", "a1", "b0", "b1"))
    rc, doc, fails = _doctor(tb, "A", [b0.addr, b1.addr])
    assert rc == 0 and not fails, doc["checks"]
    assert [n["name"] for n in doc["nics"] if n["selected"]] == [a0.ifname, a1.ifname]
    oks = {(c["section"], c["what"]) for c in doc["checks"] if c["status"] == "OK"}
    for n, p in ((a0, b0), (a1, b1)):
        assert ("routing", f"{n.ifname} -> {p.addr}") in oks and ("reach", f"{n.ifname} -> {p.addr}") in oks
        assert ("nics", n.ifname) in oks

    # a down NIC on host A
    with faults.HostDown(a1):
        rc, doc, fails = _doctor(tb, "A", [b0.addr, b1.addr])
    assert rc == 1
    assert fails == {("nics", a1.ifname), ("routing", f"{a1.ifname} -> {b1.addr}"), ("reach", f"{a1.ifname} -> {b1.addr}")}
    down = [c for c in doc["checks"] if c["what"] == a1.ifname][0]
    assert "administratively down" in down["detail"] and f"ip link set {a1.ifname} up" in down["fix"]

    # a missing route on host B: b1 is up but its subnet route is gone
    with netlink(b1.ns) as ipr:
        ipr.route("del", dst=b1.subnet, oif=ipr.link_lookup(ifname=b1.ifname)[0], scope="link", table=254)
    rc, doc, fails = _doctor(tb, "B", [a0.addr, a1.addr])
    assert rc == 1
    assert fails == {("routing", f"{b1.ifname} -> {a1.addr}")}, doc["checks"]
    # the probe is bound to b1 like the plugin's sockets, which the kernel sends on-link through
    # their device when no route matches: the peer answers
    assert [c["status"] for c in doc["checks"] if c["section"] == "reach" and c["what"] == f"{b1.ifname} -> {a1.addr}"] \
        == ["OK"]
    route = [c for c in doc["checks"] if c["section"] == "routing" and c["status"] == "FAIL"][0]
    assert "unreachable" in route["detail"].lower() and b1.addr in route["detail"]


def test_doctor_on_nics_sharing_a_subnet(testbed):
    """All four NICs in one subnet, main-table routes only (no policy routing), as on many RoCE
    hosts. railover's sockets are bound to their NIC, so this works (bed sysctls: arp_ignore=1,
    arp_announce=2, rp_filter=0) and doctor passes it; a NIC that cannot send is found by the
    probe bound to it (an address-bound probe leaves through a0 and finds the peer); strict
    reverse-path filtering and ARP flux (the kernel defaults on many distributions) FAIL."""
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1, b0, b1 = (tb.nic(n) for n in ("a0", "a1", "b0", "b1"))
    peers = [b0.addr, b1.addr]
    rc, doc, fails = _doctor(tb, "A", peers)
    assert rc == 0 and not fails, [c for c in doc["checks"] if c["status"] == "FAIL"]
    (w,) = [c for c in doc["checks"] if c["section"] == "routing" and c["what"] == f"{a1.ifname} -> {b1.addr}"]
    assert w["status"] == "WARN" and f"leaves through {a0.ifname}" in w["detail"], w
    assert {c["what"] for c in doc["checks"] if c["section"] == "arp" and c["status"] == "OK"} == {a0.ifname, a1.ifname}

    # a1 sends nothing (its egress dropped on host A)
    rule = f"add table inet ro_doc; add chain inet ro_doc out {{ type filter hook output priority 0; }}; " \
           f"add rule inet ro_doc out oifname {a1.ifname} drop"
    assert tb.run_collect("A", ["nft", rule])[0] == 0
    rc, doc, fails = _doctor(tb, "A", peers)
    assert tb.run_collect("A", ["nft", "delete table inet ro_doc"])[0] == 0
    assert rc == 1 and fails == {("reach", f"{a1.ifname} -> {b0.addr}"), ("reach", f"{a1.ifname} -> {b1.addr}")}, fails

    # strict reverse-path filtering: what B sends to a1 arrives where the route back does not leave
    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    rc, doc, fails = _doctor(tb, "A", peers)
    assert rc == 1 and ("routing", f"{a1.ifname} -> {b1.addr}") in fails, fails
    assert ("routing", f"{a0.ifname} -> {b0.addr}") not in fails
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0

    # ARP flux: every NIC of A answers ARP for both addresses
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.arp_ignore=0"])[0] == 0
    rc, doc, fails = _doctor(tb, "A", peers)
    assert rc == 1 and fails == {("arp", a0.ifname), ("arp", a1.ifname)}, fails


def test_the_plugin_names_strict_reverse_path_filtering_on_a_shared_subnet_at_init(testbed):
    """The flat bed without policy routing, host A under strict reverse-path filtering (the
    default of several distributions), B not: a1's traffic to the subnet leaves through a0, so
    the kernel drops what B sends to a1. Each rank's plugin says so at init, naming the NIC,
    where its traffic leaves and the fixes, for the host whose filter drops it only (doctor
    finds the same, test above). With A's filter loose, nothing."""
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1 = tb.nic("a0"), tb.nic("a1")

    def warns(res, rank):
        err = (res.workdir / f"rank{rank}.err").read_text()
        return [ln for ln in err.splitlines() if "reverse-path filtering" in ln]

    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    try:
        # primary paths only (a0 to b0): the standbys on a1 could not connect, which is the point
        res = run_scenario(tb, [], duration_s=3, env={"RAILOVER_STANDBY": "none"})
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0
    assert res.wrong_bytes == 0
    (w,) = warns(res, 0)
    assert f"NIC {a1.ifname} shares subnet " in w and f"with {a0.ifname}, and its traffic to that subnet leaves " \
        f"through {a0.ifname}" in w, w
    assert f"ip rule add from {a1.addr} table <N>" in w and f"net.ipv4.conf.{a1.ifname}.rp_filter=2" in w, w
    assert warns(res, 1) == []
    # with loose filtering nothing, and under strict filtering nothing once a1's own traffic
    # leaves through a1 (source routing: the lookup applies the rules for a1's address)
    res = run_scenario(tb, [], duration_s=3)
    assert warns(res, 0) == [] and warns(res, 1) == []
    net = a1.addr.rsplit(".", 1)[0] + ".0/24"
    for cmd in (["ip", "rule", "add", "from", a1.addr, "table", "100"],
                ["ip", "route", "add", net, "dev", a1.ifname, "table", "100"]):
        assert tb.run_collect("A", cmd)[0] == 0, cmd
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    try:
        res = run_scenario(tb, [], duration_s=3)
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0
    assert res.wrong_bytes == 0
    assert warns(res, 0) == [] and warns(res, 1) == []


def _init_warnings(tb, host: str, nics, about: str = "reverse-path filtering") -> List[str]:
    """The WARNs of the plugin's init on ``host`` over ``nics`` whose text has ``about`` (the
    reverse-path filtering ones by default; one rank of railover-perf, stopped once init is
    done)."""
    from railover import _paths
    env = {"RAILOVER_IFNAMES": "=" + ",".join(n.ifname for n in nics), "NCCL_DEBUG": "INFO", "RAILOVER_STATE_DIR": "off"}
    last = len(nics) - 1
    with tempfile.TemporaryDirectory() as wd, open(Path(wd) / "err", "w") as err:
        (Path(wd) / "rv").mkdir()
        p = tb.run(host, [str(_paths.perf_path()), "--plugin", str(_paths.plugin_path()), "--rank", "0", "--nranks",
                          "1", "--rendezvous", str(Path(wd) / "rv"), "-b", "8", "-e", "8"], env=env,
                   stdout=subprocess.DEVNULL, stderr=err)
        try:
            poll_until(lambda: f"railover: NIC {last} " in (Path(wd) / "err").read_text() or p.poll() is not None,
                       timeout_s=60, what="the plugin's init")
        finally:
            p.kill()
            p.wait()
        text = (Path(wd) / "err").read_text()
    # past the NICs' discovery (which WARNs): listening on all, or a listener's failure named
    assert f"railover: NIC {last} " in text or "cannot listen on NIC" in text, text[-3000:]
    return [ln for ln in text.splitlines() if about in ln]


def test_an_interface_not_selected_that_answers_arp_on_a_devices_subnet_is_named_by_the_plugin_and_doctor(testbed):
    """The flat bed (a0 and a1 on one subnet), with only a0 selected: a1 is not railover's, but
    with arp_ignore=0 it answers ARP for a0's address (a management NIC on a rail's subnet), so
    a peer's traffic to a0 may arrive on a1, where railover takes nothing. The plugin's init
    WARNs, naming a1 as not a device, and doctor FAILs a0's ARP check, naming a1 as not
    selected; with arp_ignore=1, neither. Before, both judged the selected NICs only."""
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1 = tb.nic("a0"), tb.nic("a1")
    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.arp_ignore=0"])[0] == 0
    try:
        w = _init_warnings(tb, "A", [a0], about="answer ARP")
        env = dict(envvars.nccl_env(), PYTHONPATH=SRC, RAILOVER_IFNAMES="=" + a0.ifname)
        rc, out, err = tb.run_collect("A", cli("doctor", "--json", "--no-torch"), env=env, timeout_s=60)
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.arp_ignore=1"])[0] == 0
    net = a0.addr.rsplit(".", 1)[0] + ".0/24"
    assert len(w) == 1 and f"NICs {a0.ifname},{a1.ifname} share subnet {net}; of them, {a1.ifname} (arp_ignore=0) " \
        f"will answer ARP" in w[0] and \
        f"({a1.ifname}: not railover's devices, but on that subnet all the same)" in w[0], w
    doc = json.loads(out) if out else {}
    assert [n["name"] for n in doc.get("nics", []) if n["selected"]] == [a0.ifname], (out, err)
    (f,) = [c for c in doc["checks"] if c["section"] == "arp" and c["status"] == "FAIL"]
    assert f["what"] == a0.ifname and f"{a1.ifname} (not selected)" in f["detail"] and \
        f"{a1.ifname} has arp_ignore=0 and answers ARP for {a0.ifname}'s address too" in f["detail"], f
    assert _init_warnings(tb, "A", [a0], about="answer ARP") == []
    rc, out, err = tb.run_collect("A", cli("doctor", "--json", "--no-torch"), env=env, timeout_s=60)
    assert not [c for c in json.loads(out)["checks"] if c["section"] == "arp" and c["status"] != "OK"], out


def test_the_plugin_names_strict_reverse_path_filtering_where_a_longer_prefix_takes_part_of_a_subnet(testbed):
    """Host A of the flat bed (main table only) with a0 on a /16 and a1 on a /24 inside it
    (10.<b>.0.x/16, 10.<b>.1.1/24): the kernel routes by the longest prefix, so A's traffic to
    10.<b>.1.0/24 leaves through a1 whatever its source, and under strict reverse-path filtering
    A drops what a peer at 10.<b>.1.9 on a0's link (B's b0, a /16 address beside its own) sends
    to a0: a TCP probe bound to b0 gets no answer, with loose filtering it does. The plugin
    names a0 at init (and not a1, whose /24 is all its own)."""
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1, b0 = tb.nic("a0"), tb.nic("a1"), tb.nic("b0")
    b = a0.addr.split(".")[1]
    wide, inner, peer = f"10.{b}.0.0/16", f"10.{b}.1.1", f"10.{b}.1.9"
    for host, cmd in (("A", ["ip", "addr", "del", a0.cidr, "dev", a0.ifname]),
                      ("A", ["ip", "addr", "add", f"{a0.addr}/16", "dev", a0.ifname]),
                      ("A", ["ip", "addr", "del", a1.cidr, "dev", a1.ifname]),
                      ("A", ["ip", "addr", "add", f"{inner}/24", "dev", a1.ifname]),
                      ("B", ["ip", "addr", "add", f"{peer}/16", "dev", b0.ifname])):
        assert tb.run_collect(host, cmd)[0] == 0, cmd
    # what the kernel says: from a0's address, the peer is routed through a1; the rest of the
    # /16 through a0
    rc, out, err = tb.run_collect("A", ["ip", "route", "get", peer, "from", a0.addr])
    assert rc == 0 and f"dev {a1.ifname} " in out, (out, err)
    rc, out, err = tb.run_collect("A", ["ip", "route", "get", f"10.{b}.0.250", "from", a0.addr])
    assert rc == 0 and f"dev {a0.ifname} " in out, (out, err)

    def answered() -> bool:
        """Whether A answers a TCP SYN sent from the peer's address through b0 to a0."""
        probe = ("import sys; from railover.ops.doctor import tcp_probe; "
                 f"ok, how = tcp_probe({peer!r}, {a0.addr!r}, port=9, timeout_s=3, ifname={b0.ifname!r}); "
                 "print(how); sys.exit(0 if ok else 1)")
        rc, out, err = tb.run_collect("B", [sys.executable, "-c", probe], env={"PYTHONPATH": SRC})
        assert rc in (0, 1), err
        return rc == 0

    assert answered()
    assert _init_warnings(tb, "A", [a0, a1]) == []
    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    try:
        assert not answered(), "strict filtering on A let the peer's SYN to a0 through"
        w = _init_warnings(tb, "A", [a0, a1])
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0
    assert len(w) == 1, w
    assert f"NIC {a0.ifname} shares subnet {wide} with {a1.ifname}, and its traffic to 10.{b}.1.0/24 (in that " \
        f"subnet) leaves through {a1.ifname}" in w[0], w
    assert f"ip route add {wide} dev {a0.ifname} table <N>" in w[0], w


def test_the_plugin_and_doctor_judge_the_route_to_a_peer_not_to_an_address_of_this_host(testbed):
    """The flat bed without policy routing, host A under strict reverse-path filtering, with an
    address of the subnet (10.<b>.0.2, b0's on B) on an interface of A that railover does not
    use (a veth here: a service address, as keepalived adds). The kernel routes an address of this
    host through lo whatever the source, so a lookup to it says nothing of where a peer is
    answered from: only a1 (whose traffic to the subnet leaves through a0) is named, by the
    plugin at init and by doctor (without --peer), and a0 by neither."""
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1 = tb.nic("a0"), tb.nic("a1")
    net = a0.addr.rsplit(".", 1)[0]
    m0, m1 = tb.prefix + "m0", tb.prefix + "m1"
    for cmd in (["ip", "link", "add", m0, "type", "veth", "peer", "name", m1], ["ip", "addr", "add", f"{net}.2/32",
                "dev", m0], ["ip", "link", "set", m0, "up"], ["ip", "link", "set", m1, "up"]):
        assert tb.run_collect("A", cmd)[0] == 0, cmd
    rc, out, err = tb.run_collect("A", ["ip", "route", "get", f"{net}.2", "from", a0.addr])
    assert rc == 0 and out.startswith("local ") and " dev lo " in out, (out, err)
    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    try:
        w = _init_warnings(tb, "A", [a0, a1])
        rc, doc, fails = _doctor(tb, "A", [])
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0
    # m0's /32 shares no link: it is not named among the NICs sharing the subnet
    assert len(w) == 1 and f"NIC {a1.ifname} shares subnet {net}.0/24 with {a0.ifname}, and its traffic to that " \
        f"subnet leaves through {a0.ifname} " in w[0], w
    assert {what for section, what in fails if section == "routing"} == {f"{a1.ifname} -> {net}.3"}, doc["checks"]


def test_the_plugin_looks_up_the_route_of_a_nic_in_a_vrf_in_the_vrf(testbed):
    """The flat bed's a0 and a1 enslaved to a VRF (an l3mdev, table 10) on host A, under strict
    reverse-path filtering: their connected routes move to the VRF's table, which routes (and
    filters: the kernel's reverse-path lookup is made in the VRF of the NIC a packet arrives on)
    their traffic, so a1's traffic to the subnet leaves through a0 there and the plugin names a1
    (not a0) at init, as `ip route get ... vrf` answers. The main table plays no part: with no
    route to the subnet (a lookup there finds none: the WARN would be missed) and with a default
    route through another NIC (a lookup there names that NIC: a WARN for a0 too, and the wrong NIC
    for a1). Skipped where the kernel has no VRF (CONFIG_NET_VRF)."""
    from railover import _paths
    tb = testbed("T2-flat", policy_routing=False)
    a0, a1 = tb.nic("a0"), tb.nic("a1")
    vrf, m0, m1 = (tb.prefix + s for s in ("vrf", "m0", "m1"))
    rc, _, err = tb.run_collect("A", ["ip", "link", "add", vrf, "type", "vrf", "table", "10"])
    if rc != 0:
        pytest.skip(f"no VRF on this kernel: {err.strip()}")
    for cmd in (["ip", "link", "set", vrf, "up"], ["ip", "link", "set", "dev", a0.ifname, "master", vrf],
                ["ip", "link", "set", "dev", a1.ifname, "master", vrf]):
        assert tb.run_collect("A", cmd)[0] == 0, cmd
    net = a1.addr.rsplit(".", 1)[0]
    # what the kernel says: in the VRF a1's traffic to the subnet leaves through a0 (the first
    # connected route of the VRF's table)
    rc, out, err = tb.run_collect("A", ["ip", "route", "get", net + ".250", "from", a1.addr, "vrf", vrf])
    assert rc == 0 and f"dev {a0.ifname} " in out, (out, err)

    def warns():
        """The plugin's init on host A (one rank of railover-perf, stopped once init is done:
        what it does next on NICs whose traffic the filter drops is no part of this test)."""
        env = {"RAILOVER_IFNAMES": f"={a0.ifname},{a1.ifname}", "NCCL_DEBUG": "INFO", "RAILOVER_STATE_DIR": "off"}
        with tempfile.TemporaryDirectory() as wd, open(Path(wd) / "err", "w") as err:
            (Path(wd) / "rv").mkdir()
            p = tb.run("A", [str(_paths.perf_path()), "--plugin", str(_paths.plugin_path()), "--rank", "0", "--nranks",
                             "1", "--rendezvous", str(Path(wd) / "rv"), "-b", "8", "-e", "8"], env=env,
                       stdout=subprocess.DEVNULL, stderr=err)
            try:
                poll_until(lambda: "railover: NIC 1 " in (Path(wd) / "err").read_text() or p.poll() is not None,
                           timeout_s=60, what="the plugin's init")
            finally:
                p.kill()
                p.wait()
            text = (Path(wd) / "err").read_text()
        # past the NICs' discovery (which WARNs): listening on both, or a listener's failure named
        assert "railover: NIC 1 " in text or "cannot listen on NIC" in text, text[-3000:]
        return [ln for ln in text.splitlines() if "reverse-path filtering" in ln]

    sysctl = ["sysctl", "-q", "-w"]
    assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=1"])[0] == 0
    try:
        w = warns()  # no route to the subnet in the main table
        assert len(w) == 1, w
        w = w[0]
        assert f"NIC {a1.ifname} shares subnet {net}.0/24 with {a0.ifname}, and its traffic to that subnet leaves " \
            f"through {a0.ifname}" in w, w
        # a default route in the main table through a NIC outside the VRF
        for cmd in (["ip", "link", "add", m0, "type", "veth", "peer", "name", m1], ["ip", "addr", "add", "192.168.77.1/24",
                     "dev", m0], ["ip", "link", "set", m0, "up"], ["ip", "link", "set", m1, "up"],
                    ["ip", "route", "add", "default", "via", "192.168.77.2", "dev", m0]):
            assert tb.run_collect("A", cmd)[0] == 0, cmd
        w = warns()
        assert len(w) == 1, w
        w = w[0]
        assert f"NIC {a1.ifname} shares subnet " in w and f"leaves through {a0.ifname} " in w, w
    finally:
        assert tb.run_collect("A", sysctl + ["net.ipv4.conf.all.rp_filter=0"])[0] == 0


def test_doctor_sees_nics_stacked_on_one_port(testbed):
    """A macvlan interface on a0, and a bridge (a master, like a bond) over a veth port, as the
    kernel reports them: doctor finds the port a0 and the macvlan share, and the master is the
    port beneath it. (VLAN and bond work the same way, IFLA_LINK and IFLA_MASTER; macvlan and
    bridge are used as small CI kernels may lack 8021q and bonding. A stack on a master's port
    is in the unit test: the kernel refuses a macvlan on a bridge port.)"""
    from railover.ops import doctor as dr
    tb = testbed("T2")
    a0, a1 = tb.nic("a0"), tb.nic("a1")
    mv, br, port, peer = (tb.prefix + s for s in ("mv", "br", "p0", "p1"))
    with netlink(a0.ns) as ipr:
        ipr.link("add", ifname=mv, kind="macvlan", link=ipr.link_lookup(ifname=a0.ifname)[0], macvlan_mode="bridge")
        ipr.link("add", ifname=port, kind="veth", peer=peer)
        ipr.link("add", ifname=br, kind="bridge")
        ipr.link("set", index=ipr.link_lookup(ifname=port)[0], master=ipr.link_lookup(ifname=br)[0])
        for name, addr in ((mv, "10.9.0.1"), (br, "10.9.1.1"), (peer, "10.9.2.1")):
            idx = ipr.link_lookup(ifname=name)[0]
            ipr.addr("add", index=idx, address=addr, prefixlen=24)
            ipr.link("set", index=idx, state="up")
    ifaces = {i.name: i for i in dr.list_interfaces(ns=a0.ns)}
    assert ifaces[mv].ports == [a0.ifname] and ifaces[a0.ifname].ports == [a0.ifname]
    assert ifaces[br].ports == [port] and ifaces[peer].ports == [peer] and ifaces[a1.ifname].ports == [a1.ifname]
    # a master that is no VRF (the bridge) puts its port in no VRF
    assert all(i.vrf is None for i in ifaces.values()), [(i.name, i.vrf) for i in ifaces.values()]
    facts = dr.Facts(env={"RAILOVER_IFNAMES": "=" + ",".join((a0.ifname, a1.ifname, mv, br, peer))},
                     ifaces=list(ifaces.values()), plugin={"path": "", "loaded": False, "abi": []})
    rep = dr.diagnose(facts, route=lambda dst, src: ("?", ""))
    warned = {c.what for c in rep.checks if c.section == "nics" and "same port" in c.detail}
    assert warned == {f"{a0.ifname}, {mv}"}, warned


def test_launch_sets_the_environment_nccl_needs(testbed):
    tb = testbed("T2")
    a0 = tb.nic("a0")
    # What NCCL does with it: dlopen("libnccl-net-" + NCCL_NET_PLUGIN + ".so") through LD_LIBRARY_PATH.
    probe = ("import ctypes, json, os; ctypes.CDLL('libnccl-net-' + os.environ['NCCL_NET_PLUGIN'] + '.so', "
             "mode=os.RTLD_NOW); print(json.dumps(dict(os.environ)))")
    env = {"PYTHONPATH": SRC, "RAILOVER_IFNAMES": "=" + a0.ifname, "LD_LIBRARY_PATH": "/nonexistent"}
    # tb.run adds to this process's environment: `env -u` drops NCCL settings it might carry
    rc, out, err = tb.run_collect("A", ["env", "-u", "NCCL_NET", "-u", "NCCL_NET_PLUGIN"] + cli("launch", "--", sys.executable,
                                  "-c", probe), env=env, timeout_s=60)
    assert rc == 0, err
    got = json.loads(out)
    assert got["NCCL_NET"] == "railover" and got["NCCL_NET_PLUGIN"] == "railover"
    assert got["NCCL_NET_PLUGIN_REF_COUNT"] == "1"
    assert got["RAILOVER_IFNAMES"] == "=" + a0.ifname
    assert got["LD_LIBRARY_PATH"].endswith(":/nonexistent")


def test_drill_refuses_without_yes_and_restores_the_nic_on_sigterm(testbed, tmp_path):
    tb = testbed("T2")
    a1 = tb.nic("a1")
    env = dict(os.environ, PYTHONPATH=SRC)
    base = cli("drill", "--nic", a1.ifname, "--netns", a1.ns, "--state-dir", str(tmp_path))
    cp = subprocess.run(base + ["--down-for", "5"], env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "--yes" in cp.stderr and a1.ifname in cp.stderr
    assert faults.link_state(tb, a1).admin_up

    # No railover process uses the NIC (an empty state dir): the drill refuses before touching it
    cp = subprocess.run(base + ["--down-for", "5", "--yes"], env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "no running railover process uses" in cp.stderr and "--force" in cp.stderr, cp.stderr
    assert faults.link_state(tb, a1).admin_up

    p = subprocess.Popen(base + ["--down-for", "120", "--yes", "--force"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        poll_until(lambda: not faults.link_state(tb, a1).admin_up or p.poll() is not None, 20, what="the drill's NIC down")
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert "set up again" in err
    assert faults.link_state(tb, a1).admin_up, "the drill left the NIC down"


def test_drill_whose_nic_down_is_refused_says_so_and_changes_nothing(testbed, tmp_path):
    """A drill without CAP_NET_ADMIN (here: root with it dropped from the bounding set, as in a
    container) gets EPERM from netlink when it takes the NIC down. It must say that the NIC
    could not be taken down and is still up (exit 2), not try to set it up again and report the
    second EPERM as 'STILL DOWN' (exit 3), as it did."""
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv (util-linux) not installed")
    tb = testbed("T2")
    a1 = tb.nic("a1")
    env = dict(os.environ, PYTHONPATH=SRC)
    cp = subprocess.run([setpriv, "--bounding-set", "-net_admin"] + cli(
        "drill", "--nic", a1.ifname, "--netns", a1.ns, "--state-dir", str(tmp_path), "--down-for", "1", "--yes",
        "--force"), env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert f"setting {a1.ifname} in netns {a1.ns} down failed: Operation not permitted" in cp.stderr, cp.stderr
    assert "CAP_NET_ADMIN" in cp.stderr and "nothing changed" in cp.stderr, cp.stderr
    assert "STILL DOWN" not in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert faults.link_state(tb, a1).admin_up


def test_drill_reports_the_failover_it_caused(testbed, tmp_path):
    tb = testbed("T2")
    a0 = tb.nic("a0")
    sd = tmp_path / "state"
    sd.mkdir()
    holder: Dict[str, subprocess.Popen] = {}

    def tick(now_s: float) -> None:
        if "p" not in holder and now_s < 5 and _armed(st.snapshot([sd], events=0)):
            holder["p"] = subprocess.Popen(
                cli("drill", "--nic", a0.ifname, "--netns", a0.ns, "--down-for", "1.5", "--yes", "--state-dir", str(sd),
                    "--wait-failback", "8", "--json"),
                env=dict(os.environ, PYTHONPATH=SRC), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    try:
        res = run_scenario(tb, [], duration_s=13, env=dict(FAST, RAILOVER_STATE_DIR=str(sd)), rank_envs=RANKS,
                           on_tick=tick)
        assert "p" in holder, "the state files never showed both ranks armed in the first 5 s"
        out, err = holder["p"].communicate(timeout=60)
    finally:
        if "p" in holder and holder["p"].poll() is None:
            holder["p"].kill()
    assert res.wrong_bytes == 0
    assert holder["p"].returncode == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] and doc["problems"] == [] and not doc["interrupted"]
    assert doc["users"] == ["rank 0"]
    # the report agrees with the journals of the run, event for event
    fo = [e for e in res.select("failover", doc["down_us"])]
    fb = [e for e in res.select("failback", doc["up_us"])]
    assert len(fo) == 2 and {e["rank"] for e in fo} == {0, 1}, res.events[-20:]
    assert [(e["pid"], e["comm"], e["t_us"]) for e in doc["failovers"]] == [(e["pid"], e["comm"], e["t_us"]) for e in fo]
    assert [(e["pid"], e["comm"]) for e in doc["failbacks"]] == [(e["pid"], e["comm"]) for e in fb]
    assert {(e["pid"], e["comm"]) for e in fb} == {(e["pid"], e["comm"]) for e in fo}
    det = doc["detection"]
    assert det is not None and det["event"] in ("nic_down", "pair_down", "path_down") and det["since_down_ms"] < 1000
    assert all(e["since_down_ms"] < 1000 for e in doc["failovers"])
    # rank 0 (the process on the drilled NIC) counted its own failover in its state file
    rank0_fo = sum(1 for e in fo if e["rank"] == 0)
    assert doc["counters_after"]["failovers"] - doc["counters_before"]["failovers"] == rank0_fo


def test_gpu_validation_harness_brings_up_its_bed_with_the_prefix_railover_picked(tmp_path):
    """The harness's testbed_up (sourced from scripts/gpu_validate.sh, no PyTorch needed): the
    prefix railover chose is recorded, the bed is a live 2x3 one, and cleanup removes it."""
    root = Path(__file__).resolve().parents[2]
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, WORK=str(work), OUT=str(tmp_path / "out"))
    script = f'source "{root}/scripts/gpu_validate.sh"\ntestbed_up || exit $?\n{sys.executable} -c "$CHECK" "$PREFIX"\ncleanup'
    check = ("import sys; from railover.testbed.netns import TestBed; tb = TestBed.attach(sys.argv[1]); "
             "print('bed', tb.prefix, len(tb.hosts), len(tb.hosts[0].nics))")
    cp = subprocess.run(["bash", "-c", script], env=dict(env, CHECK=check), capture_output=True, text=True, timeout=120)
    prefix = (work / "testbed.prefix").read_text().strip() if (work / "testbed.prefix").exists() else ""
    try:
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert tbmod.PREFIX_RE.match(prefix) and f"bed {prefix} 2 3" in cp.stdout, cp.stdout + cp.stderr
        assert prefix not in {i.prefix for i in tbmod.list_testbeds()}, "cleanup left the bed behind"
    finally:
        if prefix:
            tbmod.cleanup_leftovers(prefix)


def test_gpu_validation_harness_dry_run_in_the_test_bed(tmp_path):
    """scripts/gpu_validate.sh with DRY=1: gloo instead of NCCL, but the real orchestration:
    a 2x3 test bed, one rank per host namespace, the switch-port fault and its repair, the
    result files, and the bed removed afterwards."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch not installed (the dry run uses torch's gloo backend)")
    root = Path(__file__).resolve().parents[2]  # the repository (scripts/ is not installed)
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, DRY="1", OUT=str(out), WORK=str(work), DRY_MAX_BYTES=str(1 << 16),
               DRY_SKIP="correct,sweep,colls,reinit")
    cp = subprocess.run(["bash", str(root / "scripts" / "gpu_validate.sh")], env=env, capture_output=True, text=True,
                        timeout=240)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"summary.json", "run.log", "fault.csv", "bench.txt"} <= set(files), files
    s = json.loads((out / "summary.json").read_text())["dry"]
    assert s["verdict"] == "PASS", s
    bed = s["testbed"]
    assert bed and [r["ns"].rsplit("-", 1)[1] for r in bed["ranks"]] == ["nsA", "nsB"]
    fault = s["rank0"]["fault"]
    assert fault["injected"] and fault["errors"] == 0
    assert [(e["event"], e["rc"]) for e in fault["events"]] == [("down", 0), ("up", 0)]
    port = fault["events"][0]["cmd"].split()[-2]
    assert port in bed["ranks"][0]["ports"] and bed["fabric_ns"] in fault["events"][0]["cmd"]
    assert bed["prefix"] not in {i.prefix for i in tbmod.list_testbeds()}, "the harness left its test bed behind"
