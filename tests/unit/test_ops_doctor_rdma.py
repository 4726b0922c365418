"""railover doctor's RDMA section: checks and rendering from canned reports of the plugin's
railover_rdma_report_json (shape: native/plugin/rdma_report.h), the NCCL_IB_* message, and the
real function of the built plugin on this host (libibverbs, no RDMA device)."""
from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from railover import _paths, params
from railover.cli import app
from railover.ops import cli as ocli
from railover.ops import doctor as dr

from test_ops_doctor import GOOD_NCCL, IFACES, PLUGIN_OK, find, good_route, run

ROOT = Path(__file__).resolve().parents[2]

GPU = {"nvidia_driver": False, "peermem": "", "dmabuf": [{"hca": "rxe0", "supported": False,
                                                          "detail": "ibv_reg_dmabuf_mr(fd -1): Operation not supported"}]}


def nic(name, choice="chosen", hca="rxe0", port=1, gid_index=1, gid="::ffff:10.1.0.1", why=None, ports=None,
        state="ACTIVE", ll="Ethernet", rate=0):
    chosen = choice in ("chosen", "down")
    return {"nic": name, "choice": choice, "hca": hca if chosen else "", "port": port if chosen else 0, "rate_mbps": rate,
            "link_layer": ll if chosen else "", "state": state if chosen else "",
            "gid_index": gid_index if chosen else -1, "gid": gid if chosen else "",
            "why": why or (f"{hca} port {port} GID {gid_index} (RoCE v2, IPv4 10.1.0.1, bound to {name}; "
                           "NCCL_IB_GID_INDEX unset)"),
            "ports": ports if ports is not None else []}


def device(n, transport):
    """A report NIC's ``device`` as the plugin's planTransport gives it (native/plugin/rdma_report.h)."""
    if transport in ("tcp", "error"):
        return "tcp" if transport == "tcp" else ""
    if n["choice"] in ("chosen", "down"):
        return "rdma"
    return "tcp" if transport == "rdma+tcp" else "left_out"


def report(nics, setting="auto", transport="rdma", why="RAILOVER_TRANSPORT=auto: every NIC has an ACTIVE RDMA port "
           "with a GID", built=True, lib=True, lib_error="", config_error="", ptr=("HOST",), gpu=GPU):
    nics = [n if "device" in n else dict(n, device=device(n, transport)) for n in nics]
    return {"version": 1, "built_with_verbs": built, "libibverbs": {"loaded": lib, "error": lib_error},
            "config_error": config_error, "nic_error": "", "setting": setting, "transport": transport,
            "transport_why": why, "nics": nics, "memory": {"ptr_support": list(ptr)}, "gpudirect": gpu}


def rdma_run(rep, env=GOOD_NCCL):
    facts = dr.Facts(env=dict(env), ifaces=IFACES, plugin=PLUGIN_OK, ld_resolve=PLUGIN_OK["path"], rdma=rep)
    return dr.diagnose(facts, route=good_route, probe=lambda s, d, i: (True, "ok"))


def rdma(rep, what=None):
    return [c for c in rep.checks if c.section == "rdma" and (what is None or c.what == what)]


def text(renderable) -> str:
    """The rendered text, table borders removed, whitespace collapsed."""
    con = Console(width=400, record=True)
    con.print(renderable)
    return " ".join(re.sub("[\u2500-\u257f]", " ", con.export_text()).split())


def test_every_nic_on_an_active_port_uses_rdma():
    rep = rdma_run(report([nic("eth0", gid="::ffff:10.0.0.1"), nic("eth1", hca="rxe1", gid="::ffff:10.0.1.1")]))
    assert rep.ok
    c = rdma(rep, "eth1")[0]
    assert c.status == dr.OK and "rxe1 port 1 (Ethernet, ACTIVE), GID 1 ::ffff:10.0.1.1" in c.detail
    assert "NCCL_IB_GID_INDEX unset" in c.detail
    t = rdma(rep, "RAILOVER_TRANSPORT")[0]
    assert t.status == dr.OK and "would use rdma" in t.detail
    assert rdma(rep, "libibverbs")[0].status == dr.OK
    out = text(ocli.render_doctor(rep))
    assert "RDMA (RAILOVER_TRANSPORT=auto: the job would use rdma)" in out
    assert "eth1 rxe1 port 1 Ethernet ACTIVE - 1 ::ffff:10.0.1.1" in out, "no rate known: -"


def test_the_transport_line_names_the_setting_once():
    """The plugin's why starts with the setting (it is also its init log line); doctor printed
    "RAILOVER_TRANSPORT=auto: the job would use tcp (RAILOVER_TRANSPORT=auto: NIC eth0: ...)"."""
    why = "RAILOVER_TRANSPORT=auto: NIC eth0: no RDMA device found"
    rep = rdma_run(report([nic("eth0", "failed", why="no RDMA device found")], transport="tcp", why=why))
    t = rdma(rep, "RAILOVER_TRANSPORT")[0]
    assert t.detail == "RAILOVER_TRANSPORT=auto: the job would use tcp (NIC eth0: no RDMA device found)", t.detail


def test_the_port_rate_is_shown_where_the_plugin_read_it():
    """The rate NCCL is told as the device's speed (the HCA port's active rate)."""
    rep = rdma_run(report([nic("eth0", gid="::ffff:10.0.0.1", rate=100000),
                           nic("eth1", hca="rxe1", gid="::ffff:10.0.1.1", rate=2500)]))
    assert "rxe0 port 1 (Ethernet, ACTIVE, 100 Gb/s), GID 1" in rdma(rep, "eth0")[0].detail
    assert "rxe1 port 1 (Ethernet, ACTIVE, 2.5 Gb/s), GID 1" in rdma(rep, "eth1")[0].detail
    out = text(ocli.render_doctor(rep))
    assert "eth0 rxe0 port 1 Ethernet ACTIVE 100 Gb/s 1 ::ffff:10.0.0.1" in out
    assert "eth1 rxe1 port 1 Ethernet ACTIVE 2.5 Gb/s 1 ::ffff:10.0.1.1" in out
    assert rep.to_json()["rdma"]["nics"][1]["hca"] == "rxe1"


def test_auto_with_one_nic_without_rdma_warns_that_it_is_left_out():
    why = "no RDMA device is bound to NIC eth1 (for Soft-RoCE: rdma link add rxe0 type rxe netdev eth1)"
    rep = rdma_run(report([nic("eth0"), nic("eth1", "failed", why=why)], transport="rdma",
                          why="RAILOVER_TRANSPORT=auto: rdma on eth0; the NICs without an RDMA port are left out of "
                              "NCCL's devices (first: NIC eth1: " + why + ")"))
    assert rep.ok
    c = rdma(rep, "eth1")[0]
    assert c.status == dr.WARN and "no RDMA device is bound to NIC eth1" in c.detail
    assert "left out of NCCL's devices" in c.detail and "RAILOVER_TRANSPORT=rdma+tcp" in c.fix, (c.detail, c.fix)
    t = rdma(rep, "RAILOVER_TRANSPORT")[0]
    assert t.status == dr.OK and "would use rdma" in t.detail and "left out" in t.detail
    assert "eth1 failed - - - - no RDMA device is bound" in text(ocli.render_doctor(rep))


def test_rdma_plus_tcp_with_one_nic_without_rdma_warns_that_it_is_served_over_tcp():
    why = "no RDMA device is bound to NIC eth1 (for Soft-RoCE: rdma link add rxe0 type rxe netdev eth1)"
    mixed_why = ("RAILOVER_TRANSPORT=rdma+tcp: rdma on eth0, tcp on the others (first without an RDMA port: NIC eth1: "
                 + why + "); each comm fails over only within its kind (GPU memory on the rdma NICs only)")
    rep = rdma_run(report([nic("eth0"), nic("eth1", "failed", why=why)], setting="rdma+tcp", transport="rdma+tcp",
                          why=mixed_why))
    assert rep.ok
    c = rdma(rep, "eth1")[0]
    assert c.status == dr.WARN and "served over TCP, a device of its own" in c.detail, c.detail
    assert "fail over only to other TCP NICs" in c.fix and "RAILOVER_TRANSPORT=auto" in c.fix, c.fix
    t = rdma(rep, "RAILOVER_TRANSPORT")[0]
    assert t.status == dr.INFO and "would use rdma+tcp" in t.detail and "NIC eth1" in t.detail


# --------------------------------------------------------------------------- the NIC table follows the transport

#: a host whose management NIC eth0 (interface order: rail 0) has no RDMA port, eth1 and eth2 have one
MGMT_IFACES = [dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.1.1/24"]),
               dr.Iface("eth2", 4, ["10.0.2.1/24"])]
NO_DEV = "no RDMA device is bound to NIC eth0 (for Soft-RoCE: rdma link add rxe0 type rxe netdev eth0)"


def mgmt_run(rep, env=GOOD_NCCL, ifaces=MGMT_IFACES):
    facts = dr.Facts(env=dict(env), ifaces=ifaces, plugin=PLUGIN_OK, ld_resolve=PLUGIN_OK["path"], rdma=rep)
    own = {i.addr(): i.name for i in ifaces}
    return dr.diagnose(facts, route=lambda dst, src: (own[src], ""), probe=lambda s, d, i: (True, "ok"))


def mgmt_report(setting="auto", transport="rdma", eth0=None):
    return report([eth0 or nic("eth0", "failed", why=NO_DEV), nic("eth1", hca="rxe1"), nic("eth2", hca="rxe2")],
                  setting=setting, transport=transport, why=f"RAILOVER_TRANSPORT={setting}: rdma on eth1,eth2")


def row(rep, name):
    return next(n for n in rep.nics if n["name"] == name)


def test_auto_shows_a_nic_without_rdma_port_as_not_a_device():
    """RAILOVER_TRANSPORT=auto with RDMA on eth1 and eth2: the plugin leaves eth0 out of NCCL's
    devices (Runtime::chooseTransport), so the NIC table does too, naming why and the
    alternatives; the NICs it keeps keep the rails they got before (1 and 2)."""
    rep = mgmt_run(mgmt_report())
    r0 = row(rep, "eth0")
    assert r0["selected"] is False and r0["rail"] is None, r0
    assert r0["reason"].startswith("selected (default: every interface with an address except lo, docker*, virbr*), "
                                   "but left out of NCCL's devices: no RDMA port, and with RAILOVER_TRANSPORT=auto "
                                   "NCCL's devices are the RDMA NIC(s) eth1,eth2 only"), r0["reason"]
    assert ("RAILOVER_TRANSPORT=rdma+tcp serves it over TCP as a device of its own, RAILOVER_TRANSPORT=tcp puts every "
            "NIC on TCP") in r0["reason"], r0["reason"]
    assert [(n["name"], n["rail"]) for n in rep.nics if n["selected"]] == [("eth1", 1), ("eth2", 2)]
    sel = find(rep, "nics", "selection")
    assert len(sel) == 1 and sel[0].status == dr.OK, sel
    assert sel[0].detail == ("2 NICs selected via default: eth1 (rail 1), eth2 (rail 2); eth0 left out of NCCL's "
                             "devices: no RDMA port, and RAILOVER_TRANSPORT=auto uses the RDMA NICs only"), sel[0].detail
    out = text(ocli.render_doctor(rep))
    assert "eth0 no selected (default" in out and "but left out of NCCL's devices" in out, out


def test_auto_with_one_rdma_nic_left_has_no_standby():
    """Two selected NICs, one without an RDMA port: with auto only one is NCCL's device, so no
    comm can fail over: the selection check says so, and that rdma+tcp would not help."""
    r = report([nic("eth0", "failed", why=NO_DEV), nic("eth1", hca="rxe1")], why="RAILOVER_TRANSPORT=auto: rdma on eth1")
    rep = mgmt_run(r, env=dict(GOOD_NCCL, RAILOVER_IFNAMES="eth0,eth1"))
    assert [n["name"] for n in rep.nics if n["selected"]] == ["eth1"]
    (sel,) = find(rep, "nics", "selection")
    assert sel.status == dr.WARN, sel
    assert sel.detail.startswith("only eth1 is a device of NCCL (RAILOVER_IFNAMES; eth0 left out of NCCL's devices: "
                                 "no RDMA port"), sel
    assert "NCCL's devices are the RDMA NIC(s) eth1 only" in row(rep, "eth0")["reason"]
    assert "failover is impossible" in sel.detail
    assert "give eth0 an RDMA port" in sel.fix and "RAILOVER_TRANSPORT=tcp" in sel.fix and "rdma+tcp" in sel.fix, sel.fix


def test_a_nic_left_out_gets_no_link_routing_or_rails_checks():
    """A left-out NIC carries nothing: its link is no FAIL, it is not routed or probed, and a
    RAILOVER_RAILS entry for it is no 'not a selected NIC' typo; a RAILOVER_STANDBY pair naming
    it gives no standby path and says why."""
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"], carrier=False, operstate="DOWN")] + MGMT_IFACES[1:]
    env = dict(GOOD_NCCL, RAILOVER_RAILS="eth0=5,eth1=1,eth2=2", RAILOVER_STANDBY="eth1=eth0;eth2=eth1")
    rep = mgmt_run(mgmt_report(), env=env, ifaces=ifaces)
    assert rep.ok, [c for c in rep.checks if c.status == dr.FAIL]
    assert not find(rep, "nics", "eth0") and not [c for c in rep.checks if c.what.startswith("eth0 ->")]
    assert [c.what for c in find(rep, "routing")] == ["eth1 -> 10.0.1.2", "eth2 -> 10.0.2.2"]
    assert not find(rep, "nics", "RAILOVER_RAILS")
    (sb,) = find(rep, "nics", "RAILOVER_STANDBY")
    assert "pair eth1=eth0 names eth0, which is left out of NCCL's devices (no RDMA port" in sb.detail, sb.detail


def test_an_nccl_ib_hca_exclusion_is_named_as_the_reason():
    why = "HCA rxe0 port 1 behind NIC eth0 is excluded by NCCL_IB_HCA='^rxe0': no RDMA on this NIC"
    rep = mgmt_run(mgmt_report(eth0=nic("eth0", "excluded", why=why)))
    r0 = row(rep, "eth0")
    assert r0["selected"] is False
    assert "left out of NCCL's devices: no RDMA port (NCCL_IB_HCA excludes its HCA port)" in r0["reason"], r0


def test_rdma_plus_tcp_keeps_the_nic_and_says_it_is_served_over_tcp():
    rep = mgmt_run(mgmt_report(setting="rdma+tcp", transport="rdma+tcp"))
    r0 = row(rep, "eth0")
    assert r0["selected"] is True and r0["rail"] == 0, r0
    assert "served over TCP as a device of its own: no RDMA port, and RAILOVER_TRANSPORT=rdma+tcp puts" in r0["reason"]
    assert "its comms fail over only to other TCP NICs" in r0["reason"], r0["reason"]
    (sel,) = find(rep, "nics", "selection")
    # eth0 is the only TCP NIC: its comms have no standby (eth1 and eth2 back each other up)
    assert sel.status == dr.WARN and "eth0 (rail 0, tcp), eth1 (rail 1, rdma), eth2 (rail 2, rdma)" in sel.detail, sel
    assert sel.detail.endswith("the comms of eth0 have no standby"), sel.detail
    assert find(rep, "nics", "eth0", dr.OK), "eth0 carries comms: its link is checked"


@pytest.mark.parametrize("setting,transport,with_port", [
    ("tcp", "tcp", ("eth1", "eth2")),          # tcp: every NIC on TCP, RDMA ports or not
    ("auto", "tcp", ()),                       # no RDMA port anywhere: every NIC on TCP
    ("auto", "rdma", ("eth0", "eth1", "eth2")),  # a port on every NIC: every NIC on RDMA
])
def test_the_table_is_unchanged_where_every_nic_is_a_device(setting, transport, with_port):
    nics = [nic(n, hca="rxe" + n[-1]) if n in with_port else nic(n, "failed", why="no RDMA device found")
            for n in ("eth0", "eth1", "eth2")]
    rep = mgmt_run(report(nics, setting=setting, transport=transport, why="x"))
    assert [(n["name"], n["rail"]) for n in rep.nics if n["selected"]] == [("eth0", 0), ("eth1", 1), ("eth2", 2)]
    assert row(rep, "eth0")["reason"] == "selected (default: every interface with an address except lo, docker*, virbr*)"
    (sel,) = find(rep, "nics", "selection")
    assert sel.status == dr.OK and sel.detail == "3 NICs selected via default: eth0 (rail 0), eth1 (rail 1), eth2 (rail 2)"


def test_libibverbs_not_loading_changes_nothing():
    # the plugin then runs every NIC over TCP (planTransport): no NIC is left out
    r = report([nic("eth0", "failed", why=NO_DEV), nic("eth1", "failed", why="cannot load libibverbs.so.1")],
               transport="tcp", lib=False, lib_error="cannot load libibverbs.so.1")
    assert [n["device"] for n in r["nics"]] == ["tcp", "tcp"]
    assert dr.rdma_fates(r) == {}
    assert dr.rdma_fates(mgmt_report()) == {"eth0": dr.LEFT_OUT}
    assert dr.rdma_fates({"error": "plugin not found"}) == {} and dr.rdma_fates(None) == {}


def test_a_report_of_a_plugin_built_before_device_still_shows_each_nic_s_fate():
    """A plugin built before the report had each NIC's ``device`` (doctor --plugin PATH of an
    older build): the fates come from the rule that plugin applied (setting, transport, each
    NIC's choice), as doctor showed them then, not from nothing."""
    def older(r):
        r = dict(r, nics=[{k: v for k, v in n.items() if k != "device"} for n in r["nics"]])
        assert all("device" not in n for n in r["nics"])
        return r
    assert dr.rdma_fates(older(mgmt_report())) == {"eth0": dr.LEFT_OUT}
    assert dr.rdma_fates(older(mgmt_report("rdma+tcp", "rdma+tcp"))) == {"eth0": dr.OVER_TCP}
    assert dr.rdma_fates(older(mgmt_report("rdma", "error"))) == {}
    lib_off = older(mgmt_report())
    lib_off["libibverbs"] = {"loaded": False, "error": "cannot load libibverbs.so.1"}
    assert dr.rdma_fates(lib_off) == {}
    r0 = row(mgmt_run(older(mgmt_report())), "eth0")
    assert r0["selected"] is False and "left out of NCCL's devices" in r0["reason"], r0


def test_a_tcp_only_host_is_not_a_problem():
    why = "no RDMA device found (is an RDMA driver or rdma_rxe loaded, and libibverbs' provider installed?)"
    rep = rdma_run(report([nic("eth0", "failed", why=why), nic("eth1", "failed", why=why)], transport="tcp",
                          why="RAILOVER_TRANSPORT=auto: NIC eth0: " + why))
    assert rep.ok
    assert [c.status for c in rdma(rep, "eth0")] == [dr.INFO]


IPOIB_WHY = ("InfiniBand port without an IPoIB interface: railover runs each path over a NIC with an IP address (the "
             "path's bootstrap stream), so it cannot use this port; configure IPoIB on it, or use NCCL's own IB transport")


def unused(hca, port, why, state="ACTIVE", ll="InfiniBand", netdevs=()):
    return {"hca": hca, "port": port, "state": state, "link_layer": ll, "netdevs": list(netdevs), "why": why}


def test_an_infiniband_host_without_ipoib_warns_that_its_active_ports_sit_unused():
    # The plugin's report on an IB host whose HCAs have no IPoIB: the job would run over TCP on
    # the management NIC while the ACTIVE IB ports sit idle; the plugin's init WARNs the same.
    why = "no RDMA device is bound to NIC eth0"
    r = report([nic("eth0", "failed", why=why)], transport="tcp", why="RAILOVER_TRANSPORT=auto: NIC eth0: " + why)
    r["unused_ports"] = [unused("mlx5_0", 1, IPOIB_WHY), unused("mlx5_1", 1, IPOIB_WHY, state="DOWN")]
    rep = rdma_run(r)
    (c,) = rdma(rep, "mlx5_0 port 1")
    assert c.status == dr.WARN and c.detail == "unused (InfiniBand, ACTIVE): " + IPOIB_WHY, c
    assert "configure IPoIB on mlx5_0 port 1" in c.fix and "NCCL's own IB transport" in c.fix, c
    (o,) = rdma(rep, "other HCA ports")
    assert o.status == dr.INFO and o.detail == "unused and not ACTIVE: mlx5_1 port 1 (InfiniBand, DOWN)", o
    assert not rdma(rep, "mlx5_1 port 1")


def test_an_unused_port_beside_rdma_in_use_is_information_and_an_exclusion_needs_no_fix():
    r = report([nic("eth1")])
    r["unused_ports"] = [unused("rxe1", 1, "its interface(s) eth2 are not among the selected NICs (RAILOVER_IFNAMES, "
                                "NCCL_SOCKET_IFNAME, or the default: every interface with an address)", ll="Ethernet",
                                netdevs=["eth2"]),
                         unused("mlx5_4", 1, "excluded by NCCL_IB_HCA='^mlx5_4'", ll="Ethernet", netdevs=["eth9"])]
    rep = rdma_run(r)
    (c,) = rdma(rep, "rxe1 port 1")
    assert c.status == dr.INFO and "add eth2 to RAILOVER_IFNAMES" in c.fix, c
    (x,) = rdma(rep, "mlx5_4 port 1")
    assert x.status == dr.INFO and x.fix == "" and "excluded by NCCL_IB_HCA" in x.detail, x
    # the same unselected port while the job would run over TCP: a WARN
    r["transport"], r["nics"] = "tcp", [nic("eth0", "failed", why="no RDMA device is bound to NIC eth0")]
    assert [c.status for c in rdma(rdma_run(r), "rxe1 port 1")] == [dr.WARN]
    assert [c.status for c in rdma(rdma_run(r), "mlx5_4 port 1")] == [dr.INFO]


def test_unused_ports_are_no_warning_when_tcp_is_asked_for():
    """RAILOVER_TRANSPORT=tcp puts every NIC on TCP whatever the HCA ports: the plugin's init
    names no idle port then (it WARNs only where auto / rdma+tcp fall back to TCP), and no fix
    to a port (IPoIB, selecting its interface) would make the job use it. Doctor lists the
    port as information, with no fix to follow."""
    r = report([nic("eth0", "failed", why="no RDMA device is bound to NIC eth0")], setting="tcp", transport="tcp",
               why="RAILOVER_TRANSPORT=tcp")
    r["unused_ports"] = [unused("mlx5_0", 1, IPOIB_WHY),
                         unused("rxe1", 1, "its interface(s) eth2 are not among the selected NICs (RAILOVER_IFNAMES, "
                                "NCCL_SOCKET_IFNAME, or the default: every interface with an address)", ll="Ethernet",
                                netdevs=["eth2"])]
    rep = rdma_run(r)
    for what in ("mlx5_0 port 1", "rxe1 port 1"):
        (c,) = rdma(rep, what)
        assert c.status == dr.INFO and c.fix == "", c
    # the same report with auto: the job fell back to TCP beside them, as the plugin WARNs
    r["setting"], r["transport_why"] = "auto", "RAILOVER_TRANSPORT=auto: NIC eth0: no RDMA device is bound to NIC eth0"
    assert [c.status for w in ("mlx5_0 port 1", "rxe1 port 1") for c in rdma(rdma_run(r), w)] == [dr.WARN, dr.WARN]


def test_an_unused_ports_interface_without_an_address_is_said_to_need_one():
    """The common InfiniBand case: the IPoIB driver made ib0 on the port but nobody gave it an
    address. The plugin sees only interfaces with an address, so "add ib0 to RAILOVER_IFNAMES"
    alone would change nothing: the fix names the missing address first."""
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("ib0", 5, [])]
    r = report([nic("eth0", "failed", why="no RDMA device is bound to NIC eth0")], transport="tcp",
               why="RAILOVER_TRANSPORT=auto: NIC eth0: no RDMA device is bound to NIC eth0")
    r["unused_ports"] = [unused("mlx5_0", 1, "its interface(s) ib0 are not among the selected NICs (RAILOVER_IFNAMES, "
                                "NCCL_SOCKET_IFNAME, or the default: every interface with an address)", netdevs=["ib0"])]
    rep = mgmt_run(r, ifaces=ifaces)
    (c,) = rdma(rep, "mlx5_0 port 1")
    assert c.status == dr.WARN, c
    assert c.fix.startswith("ib0 has no IP address, so the plugin cannot select it: give it one"), c.fix
    # with an address, selecting it is the fix
    ifaces[1] = dr.Iface("ib0", 5, ["10.9.0.1/24"])
    (c,) = rdma(mgmt_run(r, ifaces=ifaces), "mlx5_0 port 1")
    assert c.fix.startswith("add ib0 to RAILOVER_IFNAMES"), c.fix


def test_an_unused_port_whose_interface_the_plugin_found_without_an_address_says_to_give_it_one():
    why = "no RDMA device is bound to NIC eth0"
    r = report([nic("eth0", "failed", why=why)], transport="tcp", why="RAILOVER_TRANSPORT=auto: NIC eth0: " + why)
    r["unused_ports"] = [unused("mlx5_0", 1, "its interface(s) ib0 have no IP address, and railover's NICs are "
                                "interfaces with one: give it an address, then select it (RAILOVER_IFNAMES, "
                                "NCCL_SOCKET_IFNAME, or the default: every interface with an address)", netdevs=["ib0"])]
    (c,) = rdma(rdma_run(r), "mlx5_0 port 1")
    assert c.status == dr.WARN and c.fix.startswith("give ib0 an IP address"), c


def test_a_port_down_at_start_is_a_warning_and_the_job_still_uses_rdma():
    # The plugin keeps a NIC whose port is down when the job starts (PortChoice::kChosenDown):
    # its comms start on the other NICs and move to it once the port is ACTIVE. Before, this was
    # a FAIL with RAILOVER_TRANSPORT=rdma (init failed) and every NIC on TCP with auto.
    why = ("rxe0 port 1 GID 1 (RoCE v2, IPv4 10.1.0.1, bound to eth0); HCA rxe0 port 1 is DOWN, not ACTIVE now: "
           "the NIC starts down and its comms move to it once the port is ACTIVE")
    rep = rdma_run(report([nic("eth0", "down", why=why, state="DOWN"), nic("eth1", hca="rxe1")], setting="rdma",
                          why="RAILOVER_TRANSPORT=rdma: every NIC has an RDMA port with a GID"),
                   env=dict(GOOD_NCCL, RAILOVER_TRANSPORT="rdma"))
    assert rep.ok, "a down port is a warning, not a blocker"
    c = rdma(rep, "eth0")[0]
    assert c.status == dr.WARN and "rxe0 port 1 (Ethernet, DOWN)" in c.detail and "once the port is ACTIVE" in c.detail
    assert "cable" in c.fix and "rxe0 port 1" in c.fix
    t = rdma(rep, "RAILOVER_TRANSPORT")[0]
    assert t.status == dr.OK and "would use rdma" in t.detail


def test_nic_excluded_by_nccl_ib_hca_is_information():
    why = "HCA rxe1 port 1 behind NIC eth1 is excluded by NCCL_IB_HCA='^rxe1': no RDMA on this NIC"
    ports = [{"hca": "rxe1", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "allowed": False}]
    rep = rdma_run(report([nic("eth0"), nic("eth1", "excluded", why=why, ports=ports)], transport="rdma",
                          why="RAILOVER_TRANSPORT=auto: rdma on eth0; the NICs without an RDMA port are left out of "
                              "NCCL's devices (first: NIC eth1: " + why + ")"))
    c = rdma(rep, "eth1")[0]
    assert c.status == dr.INFO and "excluded by NCCL_IB_HCA='^rxe1'" in c.detail
    assert "left out of NCCL's devices" in c.detail, c.detail
    assert "rxe1 port 1 (Ethernet, ACTIVE, excluded by NCCL_IB_HCA)" in c.detail


def test_gpudirect_is_reported_honestly():
    rep = rdma_run(report([nic("eth0")]))
    c = rdma(rep, "GPUDirect RDMA")[0]
    assert c.status == dr.INFO
    assert "host memory only (ptrSupport HOST)" in c.detail
    assert "no peer-memory module" in c.detail and "dmabuf on rxe0: not supported" in c.detail
    gpu = dict(GPU, nvidia_driver=True, peermem="/sys/module/nvidia_peermem/version")
    c = rdma(rdma_run(report([nic("eth0")], gpu=gpu, ptr=("HOST", "CUDA"))), "GPUDirect RDMA")[0]
    assert "NVIDIA driver loaded" in c.detail and "peer-memory module: /sys/module/nvidia_peermem/version" in c.detail
    assert "registers GPU memory (ptrSupport HOST|CUDA)" in c.detail
    # a GPU host whose job runs on TCP: the reason is the transport, not the host
    c = rdma(rdma_run(report([nic("eth0")], transport="tcp", why="RAILOVER_TRANSPORT=tcp", gpu=gpu)), "GPUDirect RDMA")[0]
    assert "the job would use the tcp transport" in c.detail and "GPUDirect needs the rdma transport" in c.detail
    # init would fail: nothing is registered at all
    c = rdma(rdma_run(report([nic("eth0")], setting="rdma", transport="error", why="RAILOVER_TRANSPORT=rdma: no")),
             "GPUDirect RDMA")[0]
    assert "not evaluated" in c.detail


def test_relaxed_ordering_is_shown_when_the_job_uses_rdma():
    r = report([nic("eth0")])
    assert rdma(rdma_run(r), "relaxed ordering") == []  # a plugin without the key: no line
    r["memory"].update(relaxed_ordering=True, relaxed_ordering_why="NCCL_IB_PCI_RELAXED_ORDERING=2 (on where capable)")
    c = rdma(rdma_run(r), "relaxed ordering")[0]
    assert c.status == dr.INFO and c.detail == "on: NCCL_IB_PCI_RELAXED_ORDERING=2 (on where capable)"
    r["memory"].update(relaxed_ordering=False, relaxed_ordering_why="NCCL_IB_PCI_RELAXED_ORDERING=0: off")
    assert rdma(rdma_run(r), "relaxed ordering")[0].detail == "off: NCCL_IB_PCI_RELAXED_ORDERING=0: off"
    r = report([nic("eth0")], transport="tcp", why="RAILOVER_TRANSPORT=tcp")
    r["memory"].update(relaxed_ordering=False, relaxed_ordering_why="not used")
    assert rdma(rdma_run(r), "relaxed ordering") == []


def test_build_without_verbs_and_missing_libibverbs():
    r = report([], built=False, lib=False, transport="tcp", why="RAILOVER_TRANSPORT=auto: no RDMA transport")
    c = rdma(rdma_run(r), "build")[0]
    assert c.status == dr.INFO and "no RDMA transport" in c.detail
    r = report([], built=False, lib=False, setting="rdma", transport="error", why="RAILOVER_TRANSPORT=rdma: no")
    assert rdma(rdma_run(r), "build")[0].status == dr.FAIL
    r = report([], lib=False, lib_error="cannot load libibverbs.so.1", transport="tcp", why="x")
    c = rdma(rdma_run(r), "libibverbs")[0]
    assert c.status == dr.INFO and "cannot load libibverbs.so.1" in c.detail


def test_unavailable_report_and_bad_configuration_are_not_evaluated():
    c = rdma(rdma_run({"error": "plugin not found"}))
    assert len(c) == 1 and c[0].status == dr.INFO and "not checked: plugin not found" in c[0].detail
    r = report([], config_error="NCCL_IB_HCA='^' is not valid", transport="error", why="x")
    c = rdma(rdma_run(r))
    assert len(c) == 1 and "does not parse" in c[0].detail and "NCCL_IB_HCA" in c[0].detail
    assert not [c for c in rdma_run(report([]), env=GOOD_NCCL).checks if c.status == dr.FAIL and c.section == "rdma"]


def test_no_rdma_section_when_not_gathered():
    assert not rdma(run(GOOD_NCCL))


def test_nccl_ib_variables_say_which_railover_reads():
    rep = run(dict(GOOD_NCCL, NCCL_IB_HCA="mlx5_0", NCCL_IB_TIMEOUT="20", NCCL_IB_DISABLE="1"))
    c = [c for c in rep.checks if c.section == "nccl" and c.what == "NCCL_IB_*"][0]
    assert "NCCL_IB_HCA, NCCL_IB_TIMEOUT: read by railover's RDMA transport" in c.detail
    assert "NCCL_IB_DISABLE: only tune NCCL's own IB transport" in c.detail
    assert "only tune NCCL's internal IB transport; railover does not read them" not in c.detail
    assert "NCCL_IB_GID_INDEX" not in c.detail and "railover env --list" in c.detail


# --------------------------------------------------------------------------- the real function

@pytest.fixture(scope="module")
def native():
    try:
        n = params.load(_paths.plugin_path())
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"no built plugin: {e}")
    return n


def _has_rdma_device() -> bool:
    d = Path("/sys/class/infiniband")
    return d.is_dir() and any(d.iterdir())


def test_the_plugin_answers_for_a_nic_without_rdma_device(native):
    if _has_rdma_device():
        pytest.skip("this host has RDMA devices: the no-device answer cannot be checked here")
    r = native.rdma_report(["lo"], {"RAILOVER_TRANSPORT": "auto"})
    assert r["version"] == 1 and r["config_error"] == "" and r["setting"] == "auto"
    if not r["built_with_verbs"]:
        assert r["transport"] == "tcp" and "no RDMA transport" in r["transport_why"]
        return
    assert r["libibverbs"] == {"loaded": True, "error": ""}, "this machine has rdma-core's libibverbs"
    (n,) = r["nics"]
    assert n["nic"] == "lo" and n["choice"] == "failed" and n["hca"] == "" and n["gid_index"] == -1
    assert "no RDMA device" in n["why"], n
    assert r["transport"] == "tcp" and r["transport_why"].startswith("RAILOVER_TRANSPORT=auto: NIC lo: no RDMA device")
    assert r["memory"]["ptr_support"] == ["HOST"]
    assert r["gpudirect"]["dmabuf"] == []
    assert r["unused_ports"] == [], "no HCA port on this host, so none unused"
    # RAILOVER_TRANSPORT=rdma: the plugin's init would fail; tcp: no RDMA needed
    r = native.rdma_report(["lo"], {"RAILOVER_TRANSPORT": "rdma"})
    assert r["transport"] == "error" and "NIC lo" in r["transport_why"]
    assert native.rdma_report(["lo"], {"RAILOVER_TRANSPORT": "tcp"})["transport"] == "tcp"


def test_the_plugin_parses_the_given_environment_not_its_own(native):
    r = native.rdma_report(["lo"], {"NCCL_IB_HCA": "^", "RAILOVER_TRANSPORT": "rdma"})
    assert "NCCL_IB_HCA" in r["config_error"] and r["transport"] == "error" and r["nics"] == []
    r = native.rdma_report(["lo"], {"RAILOVER_TRANSPORT": "sideways"})
    assert "RAILOVER_TRANSPORT" in r["config_error"]
    # no NIC list: the plugin's own discovery (RAILOVER_IFNAMES)
    r = native.rdma_report([], {"RAILOVER_IFNAMES": "=lo"})
    assert [n["nic"] for n in r["nics"]] == ["lo"]
    r = native.rdma_report([], {"RAILOVER_IFNAMES": "=nosuchnic0"})
    assert r["nics"] == [] and "nosuchnic0" in r["nic_error"] and r["transport"] == "tcp"


def test_doctor_cli_shows_the_plugins_rdma_answer(native):
    """`railover doctor --json` in a child process with the real plugin: the RDMA report of the
    selected NIC comes from the plugin; no traceback with a bad NCCL_IB_* value."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), RAILOVER_IFNAMES="=lo", RAILOVER_TRANSPORT="auto")
    cp = subprocess.run([sys.executable, "-m", "railover.cli", "doctor", "--json", "--no-torch", "--plugin",
                         str(native.path)], env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in cp.stderr, cp.stderr
    doc = json.loads(cp.stdout)
    assert [n["nic"] for n in doc["rdma"]["nics"]] == ["lo"]
    assert any(c["section"] == "rdma" and c["what"] == "RAILOVER_TRANSPORT" for c in doc["checks"])
    env["NCCL_IB_GID_INDEX"] = "banana"
    cp = subprocess.run([sys.executable, "-m", "railover.cli", "doctor", "--no-torch", "--plugin", str(native.path)],
                        env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 1 and "Traceback" not in cp.stderr + cp.stdout
    assert "NCCL_IB_GID_INDEX" in cp.stdout


def test_the_nics_left_out_are_not_judged_but_still_share_their_subnet():
    """RAILOVER_TRANSPORT=auto leaves eth0 (no RDMA port) out; it shares eth1's subnet. The
    plugin's init judged every NIC discovered, doctor the devices only, so they named different
    NICs. Now both judge the devices (eth1, eth2) and count eth0 as sharing eth1's subnet: it
    keeps its address, its routes and its ARP answers (plugin: Devices.OnlyTheNicsServedAre...).
    ARP: eth1 with arp_ignore=0 answers only for eth0's address, which railover does not use:
    no FAIL; eth0 with arp_ignore=0 answers for eth1's: eth1 FAILs, naming eth0 (doctor missed
    it: eth0 was no mate). Routing: eth1's /16 holds eth0's /24, which the kernel routes through
    eth0: eth1 is checked there too (doctor looked only into the devices' subnets)."""
    ifaces = [dr.Iface("eth0", 2, ["10.0.1.9/24"]), dr.Iface("eth1", 3, ["10.0.0.1/16"]),
              dr.Iface("eth2", 4, ["10.2.0.1/24"])]

    def knobs(ignore):
        return {n: {"arp_ignore": ignore.get(n, 1), "arp_announce": 2, "rp_filter": 1} for n in ("eth0", "eth1", "eth2")}

    def longest(dst, src, oif=None):
        nets = [(ipaddress.ip_interface(a).network, i.name) for i in ifaces for a in i.addrs]
        hits = [(n.prefixlen, name) for n, name in nets if ipaddress.ip_address(dst) in n]
        return oif or max(hits)[1], ""

    def go(ignore):
        facts = dr.Facts(env=dict(GOOD_NCCL), ifaces=ifaces, plugin=PLUGIN_OK, ld_resolve=PLUGIN_OK["path"],
                         rdma=mgmt_report(), sysctls=knobs(ignore))
        return dr.diagnose(facts, route=longest, probe=lambda s, d, i: (True, "ok"))

    rep = go({"eth1": 0})
    assert not find(rep, "arp", status=dr.FAIL), find(rep, "arp")
    (a,) = find(rep, "arp", "eth1")
    assert "shares subnet 10.0.0.0/16 with eth0 (left out of NCCL's devices)" in a.detail, a.detail
    rep = go({"eth0": 0})
    (f,) = find(rep, "arp", status=dr.FAIL)
    assert f.what == "eth1" and "eth0 has arp_ignore=0 and answers ARP for eth1's address too" in f.detail, f.detail
    assert "net.ipv4.conf.eth0.arp_ignore=1" in f.fix, f.fix
    assert not find(rep, "arp", "eth0"), "eth0 is no device: not judged"
    assert {(c.what, c.status) for c in find(rep, "routing")} == {
        ("eth1 -> 10.0.0.2", dr.OK), ("eth1 -> 10.0.1.1", dr.FAIL), ("eth2 -> 10.2.0.2", dr.OK)}, find(rep, "routing")
