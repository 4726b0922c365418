"""The plugin's RDMA report (what `railover doctor` shows) on real Soft-RoCE.

The guests have no Python, so the report is read with ``railover-rdma-report`` (it dlopens the
plugin and prints ``railover_rdma_report_json``; the same function doctor calls through ctypes).
Asserted in guest A:
* each rail NIC is backed by its own rxe device, port 1, Ethernet, ACTIVE, with the RoCE v2 GID
  of the NIC's IPv4 address at the bed's index, and the reason names HCA, port, index and NIC;
  the port's rate (SDR 1x, as rxe reports a netdev of unknown speed);
  ``RAILOVER_TRANSPORT=auto`` would use rdma; the NIC list from the plugin's own discovery
  (``RAILOVER_IFNAMES``) gives the same;
* with the management NIC alone selected, auto uses tcp and the rails' ACTIVE ports are listed
  as unused, naming their interfaces (``unused_ports``);
* ``NCCL_IB_HCA`` excluding one rail's HCA: that NIC is "excluded", its port listed as not
  allowed and as unused (excluded), auto falls back to tcp and ``RAILOVER_TRANSPORT=rdma`` is reported as an init error;
* a cable pull (QEMU set_link off) shows the port DOWN, the NIC still on its port ("down": kept,
  down until the port is ACTIVE) and the reason naming the port; back ACTIVE after the repair.

The tests share the session's pair of guests (conftest's ``rdma_bed``).
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from railover import _paths
from railover.testbed.netns import poll_until
from railover.testbed.rdma import faults as rf

from rdma_helpers import crash_retry

pytestmark = pytest.mark.rdma

TOOL = "railover-rdma-report"
PLUGIN = f"/mnt/build/lib/{_paths.PLUGIN_FILE}"


@pytest.fixture(scope="module")
def tool(rdma_ok):
    """railover-rdma-report of the build; :func:`report` puts it into the guests' read-only
    build share (/mnt/build/bin)."""
    try:
        src = _paths._find(TOOL)
    except FileNotFoundError as e:
        if os.environ.get("RAILOVER_REQUIRE_RDMA") == "1":
            pytest.fail(f"RAILOVER_REQUIRE_RDMA=1 but {e}", pytrace=False)
        pytest.skip(str(e))
    return src


def report(bed, tool, nics=None, env=None):
    dst = bed.run_dir / "build" / "bin" / TOOL
    if not dst.exists():  # (again after a reboot of the guests re-staged the share)
        shutil.copy2(tool, dst)
    argv = [f"/mnt/build/bin/{TOOL}", PLUGIN] + ([",".join(nics)] if nics is not None else [])
    rc, out, err = bed.run("A", argv, env=env or {}, timeout_s=300)
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _gid(addr: str) -> str:
    return "::ffff:" + addr


def test_each_rail_nic_has_its_rxe_port_and_gid(rdma_bed, tool):
    def body():
        bed = rdma_bed
        nics = bed.host("A").nics
        r = report(bed, tool, [n.ifname for n in nics])
        assert r["built_with_verbs"] and r["libibverbs"]["loaded"], r
        for n, got in zip(nics, r["nics"]):
            assert got["nic"] == n.ifname and got["choice"] == "chosen", got
            assert (got["hca"], got["port"], got["link_layer"], got["state"]) == (n.rdma_dev, 1, "Ethernet", "ACTIVE")
            assert got["gid_index"] == n.gid_index and got["gid"] == _gid(n.addr), got
            # rxe over virtio-net (speed unknown) reports SDR 1x: the kernel's rate for such a netdev
            assert got["rate_mbps"] == 2500, got
            assert got["why"].startswith(f"{n.rdma_dev} port 1 GID {n.gid_index} (RoCE v2, IPv4 {n.addr}, "
                                         f"bound to {n.ifname}"), got
            assert {"hca": n.rdma_dev, "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
                    "allowed": True} in got["ports"]
        assert r["transport"] == "rdma" and r["setting"] == "auto", r
        assert r["memory"]["ptr_support"] == ["HOST"]
        assert r["memory"]["relaxed_ordering"] is True, r["memory"]  # libibverbs has ibv_reg_mr_iova2
        assert [d["hca"] for d in r["gpudirect"]["dmabuf"]] == [n.rdma_dev for n in nics]
        assert r["unused_ports"] == [] and r["warnings"] == [], "every rxe port is behind a rail NIC"
        assert [got["device"] for got in r["nics"]] == ["rdma"] * len(nics), r["nics"]
        # the plugin's own NIC discovery, restricted to the rails
        d = report(bed, tool, None, bed.rail_env())
        assert [x["nic"] for x in d["nics"]] == [n.ifname for n in nics] and d["transport"] == "rdma", d
        # only the management NIC selected: auto runs over TCP, and the rails' ACTIVE ports are
        # listed as unused, naming their interfaces
        m = report(bed, tool, ["eth0"])
        assert m["transport"] == "tcp", m
        assert [(u["hca"], u["port"], u["state"], u["link_layer"], u["netdevs"]) for u in m["unused_ports"]] == \
            [(n.rdma_dev, 1, "ACTIVE", "Ethernet", [n.ifname]) for n in nics], m["unused_ports"]
        for u, n in zip(m["unused_ports"], nics):
            assert u["why"].startswith(f"its interface(s) {n.ifname} are not among the selected NICs"), u
        # ... and init WARNs so, naming each ACTIVE port (the plugin's init logs the report's
        # warnings: one rule, planTransport; RdmaReport.InitAndTheReportAgree... checks that)
        assert [x["device"] for x in m["nics"]] == ["tcp"], m["nics"]
        (w,) = m["warnings"]
        assert w.startswith("RAILOVER_TRANSPORT=auto runs over tcp on NIC(s) eth0, but ACTIVE RDMA ports are unused: "), w
        for n in nics:
            assert f"{n.rdma_dev} port 1 (Ethernet): its interface(s) {n.ifname} are not among the selected NICs" in w, w
    crash_retry(rdma_bed, body)


def test_nccl_ib_hca_exclusion_and_rdma_required(rdma_bed, tool):
    def body():
        bed = rdma_bed
        a0, a1 = bed.host("A").nics[:2]
        env = {"NCCL_IB_HCA": f"^={a1.rdma_dev}"}
        r = report(bed, tool, [a0.ifname, a1.ifname], env)
        got = {x["nic"]: x for x in r["nics"]}
        assert got[a0.ifname]["choice"] == "chosen"
        x = got[a1.ifname]
        assert x["choice"] == "excluded" and f"excluded by NCCL_IB_HCA='^={a1.rdma_dev}'" in x["why"], x
        assert [p["allowed"] for p in x["ports"]] == [False], x
        assert [(u["hca"], u["why"]) for u in r["unused_ports"]] == \
            [(a1.rdma_dev, f"excluded by NCCL_IB_HCA='^={a1.rdma_dev}'")], r["unused_ports"]
        # auto with a mix: rdma on the NIC that has it, the excluded one left out of NCCL's devices
        assert r["transport"] == "rdma" and f"NIC {a1.ifname}" in r["transport_why"], r
        assert "left out of NCCL's devices" in r["transport_why"], r
        assert [got[n]["device"] for n in (a0.ifname, a1.ifname)] == ["rdma", "left_out"], r["nics"]
        (w,) = r["warnings"]
        assert w.startswith(f"RAILOVER_TRANSPORT=auto: NIC(s) {a1.ifname} have no RDMA port"), w
        r = report(bed, tool, [a0.ifname, a1.ifname], dict(env, RAILOVER_TRANSPORT="rdma+tcp"))
        assert r["transport"] == "rdma+tcp" and f"rdma on {a0.ifname}, tcp on the others" in r["transport_why"], r
        assert [x["device"] for x in r["nics"]] == ["rdma", "tcp"], r["nics"]
        assert [w.split(":")[0] for w in r["warnings"]] == ["RAILOVER_TRANSPORT=rdma+tcp"], r["warnings"]
        r = report(bed, tool, [a0.ifname, a1.ifname], dict(env, RAILOVER_TRANSPORT="rdma"))
        assert r["transport"] == "error" and "RAILOVER_TRANSPORT=rdma: cannot use RDMA" in r["transport_why"], r
    crash_retry(rdma_bed, body)


def test_a_pulled_cable_shows_the_port_down(rdma_bed, tool):
    def body():
        bed = rdma_bed
        a0 = bed.host("A").nics[0]

        def state():
            return report(bed, tool, [a0.ifname])["nics"][0]

        with rf.CablePull(bed, a0.name):
            # still chosen (the transport keeps the NIC, down until its port is ACTIVE again)
            x = poll_until(lambda: (lambda s: s if s["choice"] == "down" else None)(state()), 240, 1.0,
                           f"{a0.rdma_dev} port 1 reported down")
            assert f"HCA {a0.rdma_dev} port 1 is" in x["why"] and "not ACTIVE" in x["why"], x
            assert "its comms move to it once the port is ACTIVE" in x["why"], x
            assert x["hca"] == a0.rdma_dev and x["gid_index"] == a0.gid_index, x
            assert [(p["hca"], p["state"]) for p in x["ports"]] == [(a0.rdma_dev, "DOWN")], x
        x = poll_until(lambda: (lambda s: s if s["choice"] == "chosen" else None)(state()), 240, 1.0,
                       f"{a0.rdma_dev} port 1 ACTIVE again")
        assert x["state"] == "ACTIVE" and x["gid_index"] == a0.gid_index
    crash_retry(rdma_bed, body)



def _init_output(bed, a0, a1, rendezvous, extra_env=None) -> str:
    """The output of a one-rank railover-perf init in guest A over NICs a0 and a1, with
    RAILOVER_TRANSPORT=auto leaving a1 out (NCCL_IB_HCA excludes its HCA); up to the plugin's
    NIC list ("railover: NIC 0 "), then the rank is killed."""
    env = {"RAILOVER_IFNAMES": f"={a0.ifname},{a1.ifname}", "NCCL_IB_HCA": f"^={a1.rdma_dev}", "NCCL_DEBUG": "INFO",
           "RAILOVER_STATE_DIR": "off", **(extra_env or {})}
    p = bed.spawn("A", ["/mnt/build/bin/railover-perf", "--plugin", PLUGIN, "--rank", "0", "--nranks", "1",
                        "--rendezvous", rendezvous, "-b", "8", "-e", "8"], env=env)
    try:
        poll_until(lambda: "railover: NIC 0 " in p.stderr() + p.stdout() or p.poll() is not None,
                   timeout_s=300, what="the plugin's init")
    finally:
        p.kill()
    text = p.stderr() + p.stdout()
    assert "railover: NIC 0 " in text, text[-3000:]
    return text

def test_init_judges_the_nics_it_serves_not_those_auto_leaves_out(rdma_bed):
    """RAILOVER_TRANSPORT=auto with NCCL_IB_HCA excluding a1's HCA leaves a1 out of NCCL's
    devices. With a1 moved into a0's subnet (a0's connected route first, so a1's traffic to the
    subnet leaves through a0) under strict reverse-path filtering, and a0 answering ARP for
    every address (arp_ignore=0): the plugin's init WARNed about a1, which it then does not use
    (rp_filter), and about the pair (ARP: a0 answers only for a1's address), as it judged the
    NICs before the drop. Now neither; with a1 answering ARP for a0's address instead, the ARP
    WARN names the pair and says a1 is not a device (its answers take a0's traffic)."""
    bed = rdma_bed
    a0, a1 = bed.host("A").nics[:2]
    knobs = ["all.rp_filter", "all.arp_ignore", f"{a0.ifname}.arp_ignore", f"{a1.ifname}.arp_ignore"]

    def sysctl(values):
        script = "; ".join(f"sysctl -q -w net.ipv4.conf.{k}={v}" for k, v in values.items())
        assert bed.sh("A", script)[0] == 0, script

    def init_log():
        text = _init_output(bed, a0, a1, "/tmp/rv-init")
        assert f"NIC(s) {a1.ifname} have no RDMA port" in text, text[-3000:]
        return [ln for ln in text.splitlines() if "reverse-path filtering" in ln or "answer ARP" in ln]

    rc, out, _ = bed.sh("A", "; ".join(f"sysctl -n net.ipv4.conf.{k}" for k in knobs))
    assert rc == 0
    before = dict(zip(knobs, out.split()))
    net = a0.addr.rsplit(".", 1)[0]
    assert bed.sh("A", f"mkdir -p /tmp/rv-init; ip addr flush dev {a1.ifname} && "
                       f"ip addr add {net}.200/{a0.prefixlen} dev {a1.ifname}")[0] == 0
    try:
        sysctl({"all.rp_filter": 1, "all.arp_ignore": 0, f"{a0.ifname}.arp_ignore": 0, f"{a1.ifname}.arp_ignore": 1})
        rc, route, _ = bed.sh("A", f"ip route get {net}.201 from {net}.200")
        assert rc == 0 and f"dev {a0.ifname}" in route, route  # a1's traffic leaves through a0
        assert init_log() == []
        sysctl({f"{a0.ifname}.arp_ignore": 1, "all.arp_ignore": 0, f"{a1.ifname}.arp_ignore": 0})
        (w,) = init_log()
        assert f"NICs {a0.ifname},{a1.ifname} share subnet" in w and \
            f"({a1.ifname}: not railover's devices, but on that subnet all the same)" in w, w
    finally:
        sysctl(before)
        bed.sh("A", f"ip addr flush dev {a1.ifname}; ip addr add {a1.cidr} dev {a1.ifname}")


def test_init_names_a_standby_pair_naming_a_nic_auto_leaves_out(rdma_bed):
    """RAILOVER_STANDBY=eth1=eth2 with eth2 left out by RAILOVER_TRANSPORT=auto (NCCL_IB_HCA
    excludes its HCA): the pair gives no standby path. The plugin checked the pairs at discovery,
    before the drop, and said nothing (doctor WARNs); now init names it."""
    bed = rdma_bed
    a0, a1 = bed.host("A").nics[:2]
    assert bed.sh("A", "mkdir -p /tmp/rv-standby")[0] == 0
    text = _init_output(bed, a0, a1, "/tmp/rv-standby", {"RAILOVER_STANDBY": f"{a0.ifname}={a1.ifname}"})
    assert (f"RAILOVER_STANDBY pair {a0.ifname}={a1.ifname} names {a1.ifname}, which is left out of NCCL's devices "
            "(no RDMA port") in text, text[-3000:]
