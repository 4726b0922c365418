"""railover.ops.doctor on synthetic hosts: NIC selection, config validation, routing,
reachability, NCCL settings, plugin exports, NCCL version -> ABI."""
from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railover import _paths
from railover.ops import doctor as dr
from railover.cli import app

IFACES = [
    dr.Iface("lo", 1, ["127.0.0.1/8"], operstate="UNKNOWN"),
    dr.Iface("eth0", 2, ["10.0.0.1/24"]),
    dr.Iface("eth1", 3, ["10.0.1.1/24", "fd00::1/64"]),
    dr.Iface("docker0", 4, ["172.17.0.1/16"]),
    dr.Iface("ib0", 5, []),
    dr.Iface("virbr0", 6, ["192.168.122.1/24"]),
]
PLUGIN_OK = {"path": "/opt/railover/libnccl-net-railover.so", "loaded": True, "error": "", "abi": [7, 8, 9, 10, 11, 12],
             "collnet": [], "foreign": []}
GOOD_NCCL = {"NCCL_NET": "railover", "NCCL_NET_PLUGIN": "railover", "NCCL_NET_PLUGIN_REF_COUNT": "1",
             "LD_LIBRARY_PATH": "/opt/railover"}


def good_route(dst, src):
    return {"10.0.0.1": "eth0", "10.0.1.1": "eth1"}[src], ""


def reachable(src, dst, ifname=""):
    return True, "TCP port 22 refused (host answered)"


def run(env, ifaces=IFACES, peers=(), route=good_route, probe=reachable, plugin=PLUGIN_OK, torch=None,
        resolved="/opt/railover/libnccl-net-railover.so", sysctls=None):
    facts = dr.Facts(env=dict(env), ifaces=ifaces, plugin=plugin, torch=torch, ld_resolve=resolved, sysctls=sysctls)
    return dr.diagnose(facts, peers, route=route, probe=probe)


def find(rep, section, what=None, status=None):
    return [c for c in rep.checks if c.section == section and (what is None or c.what == what)
            and (status is None or c.status == status)]


@pytest.mark.parametrize("spec,name,hit", [
    ("eth", "eth0", True), ("eth", "ib0", False), ("eth,ib", "ib0", True),
    ("^eth", "eth0", False), ("^eth", "ib0", True), ("=eth0", "eth0", True), ("=eth0", "eth01", False),
    ("^=eth0", "eth01", True), ("^=eth0", "eth0", False), ("eth0,", "eth0", True),
    # blanks around an item (the plugin's check accepts them): "eth0, eth1" selected eth0 alone
    ("eth0, eth1", "eth1", True), ("=eth0, eth1 ", "eth1", True), ("^=eth0,\tlo", "lo", False),
])
def test_ifname_matching_is_nccl_syntax(spec, name, hit):
    assert dr.ifname_matches(spec, name) is hit


def test_default_selection_skips_lo_docker_virbr_and_unaddressed():
    sel, why, src = dr.select_interfaces({}, IFACES)
    assert [i.name for i in sel] == ["eth0", "eth1"] and src == "default"
    assert "excluded by default" in why["docker0"] and "excluded by default" in why["lo"]
    assert "no address" in why["ib0"]


@pytest.mark.parametrize("var,spec", [("RAILOVER_IFNAMES", "^"), ("RAILOVER_IFNAMES", "^="),
                                      ("RAILOVER_IFNAMES", "eth0,,lo"), ("NCCL_SOCKET_IFNAME", "^")])
def test_a_selection_the_plugin_refuses_is_not_evaluated_as_one(var, spec):
    """'^' (exclude nothing) read by doctor's own matcher selected every NIC, lo included, and
    the nics section said OK "2 NICs selected" beside the config FAIL saying NCCL's init fails
    (found by a fresh-user trial). The plugin's refusal wins: no NIC is selected, one FAIL."""
    rep = run({var: spec, **GOOD_NCCL})
    assert find(rep, "config", var, dr.FAIL), rep.checks
    sel = find(rep, "nics", "selection")
    assert [(c.status, c.detail) for c in sel] == [
        (dr.FAIL, f"not evaluated: the plugin refuses {var}='{spec}' (config above), so NCCL's init fails and no NIC "
                  "is selected")], sel
    assert not [c for c in rep.checks if c.section == "nics" and c.status == dr.OK], rep.checks
    assert not [n for n in rep.nics if n["selected"]], rep.nics
    assert not find(rep, "nics", status=dr.WARN), "no 'matches but has no address' WARN for a refused selection"


def test_loopback_is_the_last_resort():
    sel, why, _ = dr.select_interfaces({}, [IFACES[0], IFACES[3]])
    assert [i.name for i in sel] == ["lo"] and "no other interface" in why["lo"]


def test_railover_ifnames_wins_over_nccl_socket_ifname():
    sel, why, src = dr.select_interfaces({"RAILOVER_IFNAMES": "=eth1", "NCCL_SOCKET_IFNAME": "eth"}, IFACES)
    assert [i.name for i in sel] == ["eth1"] and src == "RAILOVER_IFNAMES"
    assert why["eth0"] == "not matched by RAILOVER_IFNAMES='=eth1'"
    sel, why, src = dr.select_interfaces({"NCCL_SOCKET_IFNAME": "^docker,lo"}, IFACES)
    assert [i.name for i in sel] == ["eth0", "eth1", "virbr0"] and src == "NCCL_SOCKET_IFNAME"
    assert "excluded by NCCL_SOCKET_IFNAME" in why["docker0"]


def test_family_selects_addresses():
    sel, why, _ = dr.select_interfaces({"NCCL_SOCKET_FAMILY": "AF_INET6"}, IFACES)
    assert [i.name for i in sel] == ["eth1"] and sel[0].addr(socket.AF_INET6) == "fd00::1"
    assert "no IPv6 address" in why["eth0"]


@pytest.mark.parametrize("value", ["AF_INET6 ", " AF_INET6", "\tAF_INET6"])
def test_family_with_blanks_around_it_selects_as_the_plugin_does(value):
    """The plugin trims NCCL_SOCKET_FAMILY (' AF_INET6' is AF_INET6 to it, and valid), but
    doctor read it as "any family": it listed eth0 as selected with its IPv4 address, which
    the plugin does not see, and checked routes and peers from that address."""
    sel, why, _ = dr.select_interfaces({"NCCL_SOCKET_FAMILY": value}, IFACES)
    assert [i.name for i in sel] == ["eth1"] and "no IPv6 address" in why["eth0"]
    assert dr.socket_family({"NCCL_SOCKET_FAMILY": value}) == socket.AF_INET6
    assert not [c for c in dr.validate_config({"NCCL_SOCKET_FAMILY": value}) if c.status == dr.FAIL]


@pytest.mark.parametrize("var,value,words", [
    ("RAILOVER_NSTREAMS", "17", "expected an integer 1..16"),
    ("RAILOVER_PROBE_MULT", "1", "2..100"),
    ("RAILOVER_PROBE_INTERVAL_MS", "20ms", "1..60000"),
    ("RAILOVER_MIN_CHUNK_BYTES", "1000", "multiple of 128"),
    ("RAILOVER_HOLD_DOWN_MS", "-1", "0..3600000"),
    ("RAILOVER_FATAL_TIMEOUT", "1e3", "0..604800"),
    ("RAILOVER_BACKOFF_MAX_MS", "5", "10..60000"),
    ("RAILOVER_TCP_USER_TIMEOUT_MS", "600001", "0..600000"),
    ("RAILOVER_STALL_MS", "0", "1..60000"),
    ("RAILOVER_IFNAMES", "eth0,,eth1", "comma list"),
    ("RAILOVER_IFNAMES", "averyveryverylongname", "comma list"),
    ("NCCL_SOCKET_IFNAME", "^", "comma list"),
    ("NCCL_SOCKET_FAMILY", "inet", "AF_INET or AF_INET6"),
    ("RAILOVER_STANDBY", "eth0=eth0", "'primary=standby'"),
    ("RAILOVER_STANDBY", ";", "no 'primary=standby' pair"),
    ("RAILOVER_RAILS", "eth0=40000", "rail 0..32767"),
    ("RAILOVER_RAILS", "eth0", "'ifname=rail'"),
])
def test_bad_values_name_the_variable(var, value, words):
    checks = [c for c in dr.validate_config({var: value}) if c.status == dr.FAIL]
    assert len(checks) == 1, checks
    assert checks[0].what == var and checks[0].detail.startswith(f"{var}=") and words in checks[0].detail


@pytest.mark.parametrize("var", ["RAILOVER_NSTREAMS", "RAILOVER_IFNAMES", "RAILOVER_STANDBY", "NCCL_SOCKET_FAMILY"])
def test_empty_values_mean_unset(var):
    # One rule for every variable, the plugin's: empty (or blank) = unset, the default applies.
    for empty in ("", " "):
        (c,) = [c for c in dr.validate_config({var: empty}) if c.what == var]
        assert c.status == dr.OK and "the same as unset" in c.detail
    sel, _, src = dr.select_interfaces({"RAILOVER_IFNAMES": "", "NCCL_SOCKET_IFNAME": "=eth1"}, IFACES)
    assert src == "NCCL_SOCKET_IFNAME" and [i.name for i in sel] == ["eth1"]


def test_good_values_pass_and_typos_warn(tmp_path):
    env = {"RAILOVER_NSTREAMS": "4", "RAILOVER_STANDBY": "eth0=eth1;eth1=eth0", "RAILOVER_RAILS": "eth0=0, eth1=1",
           "RAILOVER_IFNAMES": "^=docker0", "RAILOVER_HOLD_DOWN_MS": "0", "RAILOVER_STATE_DIR": str(tmp_path / "new"),
           "RAILOVER_PROBE_INTERVAL": "10"}
    checks = dr.validate_config(env)
    assert not [c for c in checks if c.status == dr.FAIL], checks
    warn = [c for c in checks if c.status == dr.WARN]
    assert [c.what for c in warn] == ["RAILOVER_PROBE_INTERVAL"] and "did you mean RAILOVER_PROBE_INTERVAL_MS?" in warn[0].detail


def test_an_event_log_directory_that_does_not_exist_warns(tmp_path):
    """RAILOVER_EVENT_LOG=/var/log/railover/ (the docs' example) where that directory was never
    made: the plugin's open() of "dir/" fails (no journal, a WARN in the NCCL log only), and
    doctor said OK (it checked the parent, /var/log). A file in an existing directory, and an
    existing directory, stay OK."""
    missing = str(tmp_path / "railover") + "/"
    (c,) = [c for c in dr.validate_config({"RAILOVER_EVENT_LOG": missing}) if c.what == "RAILOVER_EVENT_LOG"]
    assert c.status == dr.WARN and "does not exist" in c.detail and "no journal" in c.detail, c
    (tmp_path / "railover").mkdir()
    for ok in (missing, str(tmp_path / "railover-%p.jsonl")):
        (c,) = [c for c in dr.validate_config({"RAILOVER_EVENT_LOG": ok}) if c.what == "RAILOVER_EVENT_LOG"]
        assert c.status == dr.OK, c


@pytest.mark.parametrize("rails, nic, entries, rail", [
    ("eth0=0,eth0=1", "eth0", "eth0=0, eth0=1", "1"),          # meant eth1: eth0 and eth1 end up on rail 1
    ("eth0=0, eth1=1, eth1=1", "eth1", "eth1=1, eth1=1", "1"),  # the same entry twice
    ("eth1=1,eth0=0,eth1=0,eth1=2", "eth1", "eth1=1, eth1=0, eth1=2", "2"),
])
def test_a_nic_listed_twice_in_rails_is_flagged_naming_it(rails, nic, entries, rail):
    checks = dr.validate_config({"RAILOVER_RAILS": rails})
    (c,) = [c for c in checks if c.what == "RAILOVER_RAILS"]
    assert c.status == dr.WARN
    assert c.detail == (f"RAILOVER_RAILS lists {nic} {entries.count('=')} times ({entries}): the plugin uses the "
                        f"last, rail {rail}")
    assert f"list {nic} once" in c.fix
    assert dr.duplicate_rail_checks({"RAILOVER_RAILS": rails}) == [c]   # the one check launch uses too


def test_rails_without_duplicates_is_ok():
    (c,) = dr.validate_config({"RAILOVER_RAILS": "eth0=0,eth1=0"})   # two NICs on one rail: allowed
    assert c.status == dr.OK and dr.duplicate_rail_checks({"RAILOVER_RAILS": "eth0=0,eth1=0"}) == []


def test_semantic_warnings():
    checks = dr.validate_config({"RAILOVER_HOLD_DOWN_MS": "5000", "RAILOVER_HOLD_DOWN_MAX_MS": "1000",
                                 "RAILOVER_PROBE_INTERVAL_MS": "5", "RAILOVER_PROBE_MULT": "3", "RAILOVER_STANDBY": "none"})
    warns = {c.what for c in checks if c.status == dr.WARN}
    assert warns == {"RAILOVER_HOLD_DOWN_MAX_MS", "RAILOVER_PROBE_INTERVAL_MS", "RAILOVER_STANDBY"}


@pytest.mark.parametrize("blank", [" ", "\t", "  \t"])
def test_blanks_around_numbers_are_trimmed_as_the_plugin_does(blank):
    """Numbers with blanks around them (RAILOVER_HOLD_DOWN_MS=" 500") were refused by the
    plugin and so by doctor and launch, while words and list items (" tcp ", "eth0= 0") were
    trimmed. They are trimmed too, and the values doctor compares are the numbers."""
    from railover.ops.cli import launch_env
    env = {"RAILOVER_HOLD_DOWN_MS": blank + "5000", "RAILOVER_HOLD_DOWN_MAX_MS": "1000" + blank,
           "RAILOVER_NSTREAMS": blank + "4" + blank, "RAILOVER_TRANSPORT": blank + "tcp"}
    checks = dr.validate_config(env)
    assert not [c for c in checks if c.status == dr.FAIL], [c.detail for c in checks]
    assert {c.what for c in checks if c.status == dr.WARN} == {"RAILOVER_HOLD_DOWN_MAX_MS"}
    launched, _ = launch_env(env)
    assert launched["RAILOVER_HOLD_DOWN_MS"] == blank + "5000"
    (c,) = [c for c in dr.validate_config({"RAILOVER_NSTREAMS": "1 6"}) if c.status == dr.FAIL]
    assert "expected an integer 1..16" in c.detail


def test_healthy_host_is_ok():
    rep = run(GOOD_NCCL, peers=["10.0.0.2", "10.0.1.2"])
    assert rep.ok, [c for c in rep.checks if c.status == dr.FAIL]
    assert [n["name"] for n in rep.nics if n["selected"]] == ["eth0", "eth1"]
    assert {c.what for c in find(rep, "reach", status=dr.OK)} == {"eth0 -> 10.0.0.2", "eth1 -> 10.0.1.2"}
    assert {c.what for c in find(rep, "routing", status=dr.OK)} == {"eth0 -> 10.0.0.2", "eth1 -> 10.0.1.2"}
    assert find(rep, "nics", "selection", dr.OK)


def test_standby_pair_naming_an_unselected_nic_warns():
    rep = run(dict(GOOD_NCCL, RAILOVER_STANDBY="eth0=eth9;eth1=eth0"), peers=["10.0.0.2", "10.0.1.2"])
    (w,) = find(rep, "nics", "RAILOVER_STANDBY", dr.WARN)
    assert "eth0=eth9" in w.detail and "eth9" in w.detail and "not a selected NIC" in w.detail
    ok = run(dict(GOOD_NCCL, RAILOVER_STANDBY="eth0=eth1;eth1=eth0"), peers=["10.0.0.2", "10.0.1.2"])
    assert not find(ok, "nics", "RAILOVER_STANDBY")


def test_down_nic_and_missing_route_are_blocking():
    ifaces = [IFACES[0], dr.Iface("eth0", 2, ["10.0.0.1/24"]),
              dr.Iface("eth1", 3, ["10.0.1.1/24"], admin_up=True, carrier=False, operstate="LOWERLAYERDOWN")]

    def route(dst, src):
        return (None, "Network is unreachable") if src == "10.0.1.1" else ("eth0", "")

    def probe(src, dst, ifname=""):
        return (src == "10.0.0.1"), "No route to host"

    rep = run(GOOD_NCCL, ifaces, peers=["10.0.0.2", "10.0.1.2"], route=route, probe=probe)
    assert not rep.ok
    fails = {(c.section, c.what) for c in rep.checks if c.status == dr.FAIL}
    assert fails == {("nics", "eth1"), ("routing", "eth1 -> 10.0.1.2"), ("reach", "eth1 -> 10.0.1.2")}
    assert "no carrier" in find(rep, "nics", "eth1")[0].detail
    assert "Network is unreachable" in find(rep, "routing", "eth1 -> 10.0.1.2")[0].detail


def test_route_through_the_wrong_nic():
    rep = run(GOOD_NCCL, route=lambda dst, src: ("eth0", ""))
    bad = find(rep, "routing", status=dr.FAIL)
    assert [c.what for c in bad] == ["eth1 -> 10.0.1.2"]   # neighbour in eth1's own subnet
    assert "leaves through eth0, not eth1" in bad[0].detail and "ip rule add from 10.0.1.1" in bad[0].fix


FLAT = [dr.Iface("lo", 1, ["127.0.0.1/8"], operstate="UNKNOWN"),
        dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.0.11/24"])]


def flat_route(dst, src, oif=None):
    """A host whose NICs share 10.0.0.0/24 with only the main table's connected routes: what
    is not bound to a device leaves through eth0 (the first route)."""
    return oif or "eth0", ""


def knobs(arp_ignore=1, arp_announce=2, rp_filter=0):
    return {n: {"arp_ignore": arp_ignore, "arp_announce": arp_announce, "rp_filter": rp_filter} for n in ("eth0", "eth1")}


def test_nics_sharing_a_subnet_fail_with_arp_flux_and_warn_without_arp_announce():
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=knobs(arp_ignore=0))
    assert {c.what for c in find(rep, "arp", status=dr.FAIL)} == {"eth0", "eth1"} and not rep.ok
    (f,) = find(rep, "arp", "eth1")
    assert "arp_ignore=0" in f.detail and "shares subnet 10.0.0.0/24 with eth0" in f.detail and "arp_ignore=1" in f.fix
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=knobs(arp_announce=0))
    assert {c.what for c in find(rep, "arp", status=dr.WARN)} == {"eth0", "eth1"}
    assert "arp_announce=2" in find(rep, "arp", "eth0")[0].fix
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=knobs())
    assert {c.what for c in find(rep, "arp", status=dr.OK)} == {"eth0", "eth1"} and rep.ok
    # arp_ignore=0 on eth0 only: eth0 answers ARP for eth1's address (the NIC a request arrives
    # on decides), so eth1's traffic may arrive on eth0; eth1 answers for its own only
    mixed = knobs()
    mixed["eth0"]["arp_ignore"] = 0
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=mixed)
    (f,) = find(rep, "arp", status=dr.FAIL)
    assert f.what == "eth0" and "eth0 answers ARP for the addresses of eth1 too" in f.detail, f.detail
    assert "traffic to eth1 may arrive on eth0, where railover's sockets, bound to eth1, do not take it" in f.detail
    # NICs in subnets of their own: ARP flux cannot put one NIC's traffic on another
    rep = run(GOOD_NCCL, peers=["10.0.0.2", "10.0.1.2"], sysctls=knobs(arp_ignore=0, arp_announce=0))
    assert not find(rep, "arp") and rep.ok


def test_an_interface_not_selected_on_a_devices_subnet_counts_as_sharing_it():
    """mgmt0 is not selected (RAILOVER_IFNAMES=eth) but holds an address on eth0's subnet. With
    arp_ignore=0 it answers ARP for eth0's address, so a peer's traffic to eth0 may arrive on
    mgmt0, where railover takes nothing: FAIL, naming mgmt0 as not selected. eth0 answering for
    mgmt0's address harms no railover NIC. Before, doctor looked at the selected NICs only."""
    ifaces = IFACES[:3] + [dr.Iface("mgmt0", 7, ["10.0.0.50/24"])]
    env = dict(GOOD_NCCL, RAILOVER_IFNAMES="eth")
    sysctls = {n: {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 0} for n in ("eth0", "eth1", "mgmt0")}
    sysctls["mgmt0"]["arp_ignore"] = 0
    rep = run(env, ifaces, peers=["10.0.0.2", "10.0.1.2"], sysctls=sysctls)
    assert [n["name"] for n in rep.nics if n["selected"]] == ["eth0", "eth1"]
    (f,) = find(rep, "arp", status=dr.FAIL)
    assert f.what == "eth0" and "shares subnet 10.0.0.0/24 with mgmt0 (not selected)" in f.detail, f.detail
    assert "mgmt0 has arp_ignore=0 and answers ARP for eth0's address too" in f.detail and "mgmt0.arp_ignore=1" in f.fix
    assert not find(rep, "arp", "eth1") and not rep.ok
    sysctls["mgmt0"]["arp_ignore"], sysctls["eth0"]["arp_ignore"] = 1, 0
    rep = run(env, ifaces, peers=["10.0.0.2", "10.0.1.2"], sysctls=sysctls)
    assert not find(rep, "arp", status=dr.FAIL) and find(rep, "arp", "eth0", dr.OK) and rep.ok
    # no interface beside eth0 on its subnet: nothing to judge
    rep = run(env, IFACES[:3], peers=["10.0.0.2", "10.0.1.2"], sysctls=sysctls)
    assert not find(rep, "arp")
    # interfaces that share no link with eth0 are not counted, whatever their arp_ignore: down,
    # without carrier, no ARP (a dummy, kube-ipvs0, a tunnel), or a /31-/32 service address
    quiet = {n: {"arp_ignore": 0, "arp_announce": 2, "rp_filter": 0} for n in ("eth0", "eth1", "x0")}
    for x in (dr.Iface("x0", 7, ["10.0.0.50/24"], admin_up=False, carrier=False, operstate="DOWN"),
              dr.Iface("x0", 7, ["10.0.0.50/24"], carrier=False, operstate="DOWN"),
              dr.Iface("x0", 7, ["10.0.0.50/24"], operstate="UNKNOWN", arp=False),
              dr.Iface("x0", 7, ["10.0.0.200/32", "10.0.0.202/31"])):
        rep = run(env, IFACES[:3] + [x], peers=["10.0.0.2", "10.0.1.2"], sysctls=quiet)
        assert not find(rep, "arp"), (x, [c.detail for c in find(rep, "arp")])
    # a VLAN's name in a sysctl key: its '.' is written '/' (sysctl -w net.ipv4.conf.eth0.100.x is no key)
    vlan = [IFACES[0], dr.Iface("eth0.100", 2, ["10.0.0.1/24"]), dr.Iface("eth0.200", 3, ["10.0.0.11/24"])]
    rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="=eth0.100,eth0.200"), vlan, peers=["10.0.0.2"],
              route=lambda dst, src, oif=None: (oif or "eth0.100", ""),
              sysctls={n: {"arp_ignore": 0, "arp_announce": 2, "rp_filter": 0} for n in ("eth0.100", "eth0.200")})
    (f,) = find(rep, "arp", "eth0.100", dr.FAIL)
    assert "net.ipv4.conf.eth0/100.arp_ignore=1" in f.fix, f.fix


def test_a_shared_subnet_without_policy_routing_fails_only_under_strict_reverse_path_filtering():
    """railover binds its sockets to the NIC, so its traffic leaves through eth1 although the
    source route says eth0; what comes back to eth1 is dropped only by rp_filter=1."""
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=knobs(rp_filter=2))
    assert rep.ok, [c for c in rep.checks if c.status == dr.FAIL]
    (w,) = find(rep, "routing", "eth1 -> 10.0.0.12")
    assert w.status == dr.WARN and "bound to eth1, still use it" in w.detail
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route, sysctls=knobs(rp_filter=1))
    (f,) = find(rep, "routing", "eth1 -> 10.0.0.12")
    assert f.status == dr.FAIL and "rp_filter=1 on eth1" in f.detail and "rp_filter=2" in f.fix
    assert find(rep, "routing", "eth0 -> 10.0.0.2", dr.OK)
    # no route through eth1 even when bound to it: the plugin's traffic cannot use eth1
    rep = run(GOOD_NCCL, FLAT, peers=["10.0.0.12"], route=lambda dst, src, oif=None: ("eth0", ""),
              sysctls=knobs(rp_filter=2))
    assert find(rep, "routing", "eth1 -> 10.0.0.12", dr.FAIL)


def test_without_peers_a_nic_sharing_a_subnet_is_not_checked_against_another_nic_of_this_host():
    """Without --peer each NIC's route is checked to a stand-in neighbour, the subnet's first
    host address other than the NIC's own: for eth1 (10.0.0.11) that was 10.0.0.1, eth0's
    address, which the kernel routes through lo whatever the source or policy rule. Doctor said
    "leaves through lo, not eth1" (a FAIL under rp_filter=1: exit 1, a drained node), and the
    source routing it advised could never clear it. The neighbour is no address of this host."""
    local = {a.split("/")[0] for i in FLAT for a in i.addrs}

    def kernel(dst, src, oif=None):   # local addresses: lo; the rest: source routing per NIC is in place
        return ("lo" if dst in local else {"10.0.0.1": "eth0", "10.0.0.11": "eth1"}[src]), ""

    rep = run(GOOD_NCCL, FLAT, route=kernel, sysctls=knobs(rp_filter=1))
    assert rep.ok, [(c.what, c.detail) for c in rep.checks if c.status != dr.OK]
    assert {c.what for c in find(rep, "routing", status=dr.OK)} == {"eth0 -> 10.0.0.2", "eth1 -> 10.0.0.2"}
    # every low address taken by this host's NICs: the next one
    more = FLAT + [dr.Iface("eth2", 4, ["10.0.0.2/24"]), dr.Iface("eth3", 5, ["10.0.0.3/24"])]
    assert dr._neighbour(more[1].network_of("10.0.0.1"), {a.split("/")[0] for i in more for a in i.addrs}) == "10.0.0.4"


def longest_prefix(ifaces):
    """A host with only the main table's connected routes of ``ifaces``: the longest prefix
    holding the destination wins, whatever the source (a device given: that device)."""
    def route(dst, src, oif=None):
        nets = [(i.network_of(a.split("/")[0]), i.name) for i in ifaces for a in i.addrs]
        hits = [(n.prefixlen, name) for n, name in nets if n and ipaddress.ip_address(dst) in n]
        return oif or (max(hits)[1] if hits else None), "" if hits else "Network is unreachable"
    return route


def test_without_peers_a_subnet_holding_another_nics_longer_one_is_checked_in_both_parts():
    """eth0 10.0.0.1/16 beside eth1 10.0.1.1/24: the kernel routes 10.0.1.0/24 through eth1
    whatever the source, so under strict reverse-path filtering what a peer there (on eth0's
    /16) sends to eth0 is dropped. Without --peer, doctor's stand-in for eth0 was 10.0.0.2 only
    (routed through eth0: OK), as the plugin's init looked it up: missed. Now eth0 is checked
    to the rest of its /16 and to eth1's /24, as the plugin does; eth1's /24 is all its own."""
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/16"]), dr.Iface("eth1", 3, ["10.0.1.1/24"])]
    rep = run(GOOD_NCCL, ifaces, route=longest_prefix(ifaces), sysctls=knobs(rp_filter=1))
    assert {(c.what, c.status) for c in find(rep, "routing")} == {
        ("eth0 -> 10.0.0.2", dr.OK), ("eth0 -> 10.0.1.2", dr.FAIL), ("eth1 -> 10.0.1.2", dr.OK)}
    (f,) = find(rep, "routing", status=dr.FAIL)
    assert "leaves through eth1, not eth0" in f.detail and "rp_filter=1 on eth0" in f.detail, f.detail
    assert "ip route add 10.0.0.0/16 dev eth0 table <N>" in f.fix, f.fix
    # the reverse: eth1's /16 holds eth0's /24; the rest of the /16 is tried past it (10.0.1.0)
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.1.1/16"])]
    rep = run(GOOD_NCCL, ifaces, route=longest_prefix(ifaces), sysctls=knobs(rp_filter=1))
    assert {(c.what, c.status) for c in find(rep, "routing")} == {
        ("eth0 -> 10.0.0.2", dr.OK), ("eth1 -> 10.0.1.0", dr.OK), ("eth1 -> 10.0.0.2", dr.FAIL)}


def test_without_peers_the_stand_in_is_found_past_any_number_of_this_hosts_addresses():
    """The stand-in for a peer skips this host's addresses. doctor gave up after 64 of them and
    then checked nothing for the NIC (no routing line at all), while the plugin's init looks
    further and names the NIC: 65 service addresses 10.0.0.2-66 on another interface, eth1
    sharing eth0's subnet under strict filtering, its traffic there leaving through eth0."""
    svc = dr.Iface("svc", 9, [f"10.0.0.{k}/32" for k in range(2, 67)])
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.0.100/24"]), svc]
    env = dict(GOOD_NCCL, RAILOVER_IFNAMES="eth")
    rep = run(env, ifaces, route=lambda dst, src, oif=None: (oif or "eth0", ""), sysctls=knobs(rp_filter=1))
    assert {(c.what, c.status) for c in find(rep, "routing")} == {
        ("eth0 -> 10.0.0.67", dr.OK), ("eth1 -> 10.0.0.67", dr.FAIL)}, find(rep, "routing")


def test_a_nic_with_prefix_length_zero_is_named_and_not_looked_into():
    """A /0 address gets no subnet route from the kernel. Without --peer doctor looked up a
    stand-in 0.0.0.1 for it ('ip route get 0.0.0.1 from ...: Network is unreachable', a FAIL)
    and its route into every other NIC's subnet (all inside 0.0.0.0/0: FAILs under rp_filter=1),
    while the plugin's init leaves a /0 out. Now both name it (a WARN) and look nothing up for
    it. A /30 gets a stand-in; a /31 and a /32 none (no third host), as in the plugin."""
    ifaces = [dr.Iface("v0", 2, ["10.9.0.1/0"]), dr.Iface("v1", 3, ["10.9.1.1/24"])]
    asked = []

    def route(dst, src, oif=None):
        asked.append((dst, src))
        return (oif, "") if oif else ("v1", "") if ipaddress.ip_address(dst) in ipaddress.ip_network("10.9.1.0/24") \
            else (None, "Network is unreachable")

    rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="v"), ifaces, route=route, sysctls={
        n: {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 1} for n in ("v0", "v1")})
    assert {(c.what, c.status) for c in find(rep, "routing")} == {("v0", dr.WARN), ("v1 -> 10.9.1.2", dr.OK)}
    assert "has prefix length 0: the kernel gives it no subnet route" in find(rep, "routing", "v0")[0].detail
    assert all(src != "10.9.0.1" for _dst, src in asked), asked
    for plen, stand_in in ((30, "10.9.0.2"), (31, None), (32, None)):
        ifaces = [dr.Iface("v0", 2, [f"10.9.0.1/{plen}"]), dr.Iface("v1", 3, ["10.9.1.1/24"])]
        rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="v"), ifaces, route=lambda dst, src, oif=None: (oif or "v0", ""))
        got = [c.what for c in find(rep, "routing") if c.what.startswith("v0")]
        assert got == ([f"v0 -> {stand_in}"] if stand_in else []), (plen, got)


def test_the_route_of_a_nic_in_a_vrf_is_looked_up_in_the_vrf():
    """A NIC enslaved to a VRF routes by the VRF's table, where the kernel's reverse-path filter
    looks too: its lookup names the VRF as the device (``ip route get ... vrf blue``), as the
    plugin's does; a NIC in no VRF is looked up with none (the bound check names the NIC)."""
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"], vrf="blue"), dr.Iface("eth1", 3, ["10.0.1.1/24"])]
    asked = []

    def route(dst, src, oif=None):
        asked.append((dst, src, oif))
        return (None, "Network is unreachable") if oif is None and src == "10.0.0.1" else \
            ({"10.0.0.1": "eth0", "10.0.1.1": "eth1"}[src], "")

    rep = run(GOOD_NCCL, ifaces, route=route, sysctls=knobs(rp_filter=1))
    assert sorted(asked) == [("10.0.0.2", "10.0.0.1", "blue"), ("10.0.1.2", "10.0.1.1", None)]
    assert find(rep, "routing", "eth0 -> 10.0.0.2", dr.OK) and find(rep, "routing", "eth1 -> 10.0.1.2", dr.OK)
    # no route in the VRF: the finding names the lookup made
    rep = run(GOOD_NCCL, ifaces, route=lambda dst, src, oif=None: (None, "Network is unreachable") if oif == "blue"
              else ("eth1", ""), sysctls=knobs(rp_filter=1))
    (f,) = find(rep, "routing", "eth0 -> 10.0.0.2", dr.FAIL)
    assert f.detail == "ip route get 10.0.0.2 from 10.0.0.1 vrf blue: Network is unreachable", f.detail


def test_strict_ipv4_reverse_path_filtering_does_not_judge_ipv6_paths():
    ifaces = [dr.Iface("eth0", 2, ["fd00::1/64"]), dr.Iface("eth1", 3, ["fd00::11/64"])]
    rep = run(GOOD_NCCL, ifaces, peers=["fd00::2"], route=flat_route, sysctls=knobs(arp_ignore=0, rp_filter=1))
    assert rep.ok, [c for c in rep.checks if c.status == dr.FAIL]
    assert find(rep, "routing", "eth1 -> fd00::2", dr.WARN) and not find(rep, "arp")


def test_reach_probes_are_sent_from_the_nic_they_test():
    seen = []
    run(GOOD_NCCL, FLAT, peers=["10.0.0.2", "10.0.0.12"], route=flat_route,
        probe=lambda src, dst, ifname: seen.append((src, dst, ifname)) or (True, "ok"))
    assert sorted(seen) == sorted([("10.0.0.1", "10.0.0.2", "eth0"), ("10.0.0.1", "10.0.0.12", "eth0"),
                                   ("10.0.0.11", "10.0.0.2", "eth1"), ("10.0.0.11", "10.0.0.12", "eth1")])


def test_nic_sysctls_are_the_larger_of_all_and_the_nic(tmp_path):
    for d, vals in {"all": (1, 0, 2), "eth0": (0, 2, 1), "eth1": (0, 0, 0)}.items():
        (tmp_path / d).mkdir()
        for k, v in zip(("arp_ignore", "arp_announce", "rp_filter"), vals):
            (tmp_path / d / k).write_text(f"{v}\n")
    got = dr.nic_sysctls(["eth0", "eth1", "eth9"], root=tmp_path)
    assert got == {"eth0": {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2},
                   "eth1": {"arp_ignore": 1, "arp_announce": 0, "rp_filter": 2}, "eth9": {}}


def test_nics_on_one_port_warn():
    ifaces = [dr.Iface("eth0", 2, ["10.0.0.1/24"], ports=["eth0"]), dr.Iface("eth1", 3, ["10.0.1.1/24"], ports=["eth1"]),
              dr.Iface("eth0.100", 4, ["10.0.2.1/24"], ports=["eth0"])]
    rep = run(GOOD_NCCL, ifaces, route=lambda dst, src: ({"10.0.0.1": "eth0", "10.0.1.1": "eth1"}.get(src, "eth0.100"), ""))
    (w,) = find(rep, "nics", "eth0, eth0.100", dr.WARN)
    assert "same port (eth0)" in w.detail and rep.ok
    assert len(find(rep, "nics", status=dr.WARN)) == 1
    # a bond over two ports is one NIC: no warning; a VLAN of one of its ports beside it is
    ifaces = [dr.Iface("bond0", 5, ["10.0.0.1/24"], ports=["eth0", "eth1"]),
              dr.Iface("eth2", 6, ["10.0.1.1/24"], ports=["eth2"])]
    rep = run(GOOD_NCCL, ifaces, route=lambda dst, src: ({"10.0.0.1": "bond0"}.get(src, "eth2"), ""))
    assert not find(rep, "nics", status=dr.WARN)
    ifaces.append(dr.Iface("eth1.7", 7, ["10.0.2.1/24"], ports=["eth1"]))
    rep = run(GOOD_NCCL, ifaces, route=lambda dst, src: ({"10.0.0.1": "bond0", "10.0.1.1": "eth2"}.get(src, "eth1.7"), ""))
    assert [c.what for c in find(rep, "nics", status=dr.WARN)] == ["bond0, eth1.7"]


def test_routed_peer_is_checked_from_every_nic_and_wrong_egress_warns():
    rep = run(GOOD_NCCL, peers=["192.168.5.5"], route=lambda dst, src: ("eth0", ""))
    assert [c.status for c in find(rep, "routing")] == [dr.OK, dr.WARN]
    assert len(find(rep, "reach")) == 2


def test_single_nic_warns_and_no_nic_fails():
    rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="=eth0"))
    assert find(rep, "nics", "selection", dr.WARN) and rep.ok
    rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="=eth9"))
    assert find(rep, "nics", "selection", dr.FAIL) and not rep.ok
    rep = run(dict(GOOD_NCCL, RAILOVER_IFNAMES="ib"))
    assert [c.what for c in rep.checks if c.status == dr.WARN and c.section == "nics"][:1] == ["ib0"]


def test_bad_peer_raises():
    with pytest.raises(ValueError):
        run(GOOD_NCCL, peers=["not-an-ip"])


@pytest.mark.parametrize("env,what,status,words", [
    ({}, "NCCL_NET_PLUGIN", dr.FAIL, "unset"),
    ({}, "NCCL_NET", dr.WARN, "silently falls back"),
    (dict(GOOD_NCCL, NCCL_NET="IB"), "NCCL_NET", dr.FAIL, "not railover"),
    (dict(GOOD_NCCL, NCCL_NET="RailOver"), "NCCL_NET", dr.OK, "fatal"),
    (dict(GOOD_NCCL, NCCL_NET_PLUGIN="aws-ofi"), "NCCL_NET_PLUGIN", dr.FAIL, "another plugin"),
    (dict(GOOD_NCCL, NCCL_NET_PLUGIN="none"), "NCCL_NET_PLUGIN", dr.FAIL, "loads no network plugin"),
    (dict(GOOD_NCCL, NCCL_NET_PLUGIN="railover,aws-ofi"), "NCCL_NET_PLUGIN", dr.WARN, "several plugins"),
    (dict(GOOD_NCCL, NCCL_NET_PLUGIN_REF_COUNT="0"), "NCCL_NET_PLUGIN_REF_COUNT", dr.WARN, "issue 1978"),
    (dict(GOOD_NCCL, NCCL_IB_HCA="mlx5_0", NCCL_IB_TIMEOUT="20"), "NCCL_IB_*", dr.INFO, "NCCL_IB_HCA, NCCL_IB_TIMEOUT"),
])
def test_nccl_settings(env, what, status, words):
    rep = run(env)
    hits = [c for c in find(rep, "nccl", what) if c.status == status]
    assert hits and words in hits[0].detail, rep.checks


@pytest.mark.parametrize("value,warned", [("1", False), ("2", False), (" 4 ", False), ("0", True), ("-1", True),
                                          ("", True), ("one", True),
                                          # read as NCCL reads it (strtoll base 0, then a C int): "08" is
                                          # octal 0 then junk, 2**32 is 0 as an int, 2**64 is out of
                                          # range (NCCL's default, 0); "0x2" is 2
                                          ("08", True), ("4294967296", True), ("18446744073709551616", True),
                                          ("0x2", False), ("010", False)])
def test_any_ref_count_of_1_or_more_keeps_the_plugin_loaded(value, warned):
    """NCCL starts the plugin's reference count at NCCL_NET_PLUGIN_REF_COUNT and unloads the
    plugin when it falls to 0, so 2 works around the 2.28/2.29 reload bug as well as 1; doctor
    (and launch) warned that NCCL would forget the plugin for any value but exactly "1"."""
    nccl_2_28 = {"torch": "2.11.0", "nccl": [2, 28, 9], "error": ""}
    rep = run(dict(GOOD_NCCL, NCCL_NET_PLUGIN_REF_COUNT=value), torch=nccl_2_28)
    assert bool(find(rep, "nccl", "NCCL_NET_PLUGIN_REF_COUNT", dr.WARN)) == warned, rep.checks
    from railover.ops.cli import launch_env
    env, warnings = launch_env({"NCCL_NET_PLUGIN_REF_COUNT": value})
    assert env["NCCL_NET_PLUGIN_REF_COUNT"] == value
    assert any("NCCL_NET_PLUGIN_REF_COUNT" in w for w in warnings) == warned, warnings


def test_plugin_not_on_library_path():
    rep = run(GOOD_NCCL, resolved=None)
    c = find(rep, "nccl", "LD_LIBRARY_PATH", dr.FAIL)
    assert c and "export LD_LIBRARY_PATH=/opt/railover" in c[0].fix


def test_the_library_path_fix_is_a_line_the_shell_takes_with_a_blank_in_the_directory(tmp_path):
    """A plugin directory with a blank gave 'export LD_LIBRARY_PATH=/tmp/sp ace:$LD_LIBRARY_PATH',
    which exports '/tmp/sp' and fails on 'ace:...' when pasted (found by a fresh-user trial).
    The fix line is run by a shell here and must set the variable to the directory, first."""
    import subprocess
    d = tmp_path / "sp ace"
    rep = run(GOOD_NCCL, resolved=None, plugin=dict(PLUGIN_OK, path=str(d / _paths.PLUGIN_FILE)))
    fix = find(rep, "nccl", "LD_LIBRARY_PATH", dr.FAIL)[0].fix
    out = subprocess.run(["bash", "-c", fix + ' && printf %s "$LD_LIBRARY_PATH"'], capture_output=True, text=True,
                         env={"LD_LIBRARY_PATH": "/old"}, check=True).stdout
    assert out == f"{d}:/old", (fix, out)


def test_absolute_plugin_path_depends_on_the_nccl_release(tmp_path):
    import shutil
    so = tmp_path / _paths.PLUGIN_FILE
    shutil.copy(_paths.plugin_path(), so)  # another railover build: loads
    env = dict(GOOD_NCCL, NCCL_NET_PLUGIN=str(so))
    torch = lambda v: {"torch": "2.x", "nccl": v, "error": ""}  # noqa: E731
    assert find(run(env, torch=torch([2, 27, 3])), "nccl", "NCCL_NET_PLUGIN", dr.FAIL)
    assert find(run(env, torch=torch([2, 20, 5])), "nccl", "NCCL_NET_PLUGIN", dr.FAIL)
    rep = run(env, torch=torch([2, 27, 5]))
    assert find(rep, "nccl", "NCCL_NET_PLUGIN", dr.WARN) and rep.ok


@pytest.mark.parametrize("how", ["path", "name"])
def test_a_plugin_file_nccl_would_open_that_is_no_railover_build_fails(tmp_path, how):
    """NCCL_NET_PLUGIN naming (by path, or by name through LD_LIBRARY_PATH) a file that is not
    a loadable railover plugin: NCCL fails at init with NCCL_NET=railover, and `railover
    launch` refuses it; doctor said OK with a WARN."""
    so = tmp_path / _paths.PLUGIN_FILE
    so.write_text("root:x:0:0:root:/root:/bin/bash\n")
    torch = {"torch": "2.x", "nccl": [2, 27, 5], "error": ""}
    if how == "path":
        rep = run(dict(GOOD_NCCL, NCCL_NET_PLUGIN=str(so)), torch=torch)
    else:
        rep = run(GOOD_NCCL, torch=torch, resolved=str(so))
    c = find(rep, "nccl", "NCCL_NET_PLUGIN", dr.FAIL)
    assert c and "not a loadable railover plugin" in c[0].detail and str(so) in c[0].detail, rep.checks
    assert not rep.ok


def test_plugin_file_name_depends_on_the_nccl_release():
    # NCCL 2.19 and 2.20 open only libnccl-net-<NCCL_NET_PLUGIN>.so (src/net.cc), so the file
    # name itself becomes libnccl-net-libnccl-net-railover.so.so there; 2.21+ try it verbatim first
    env = dict(GOOD_NCCL, NCCL_NET_PLUGIN=_paths.PLUGIN_FILE)
    torch = lambda v: {"torch": "2.x", "nccl": v, "error": ""}  # noqa: E731
    for v in ([2, 19, 3], [2, 20, 5]):
        fails = find(run(env, torch=torch(v)), "nccl", "NCCL_NET_PLUGIN", dr.FAIL)
        assert fails and "2.19" in fails[0].detail and fails[0].fix == "export NCCL_NET_PLUGIN=railover", v
    for v in ([2, 21, 5], [2, 27, 3], [2, 30, 7]):
        rep = run(env, torch=torch(v))
        assert not find(rep, "nccl", "NCCL_NET_PLUGIN", dr.FAIL) and rep.ok, (v, rep.checks)
    unknown = run(env)
    assert find(unknown, "nccl", "NCCL_NET_PLUGIN", dr.WARN) and unknown.ok


@pytest.mark.parametrize("version,abi", [((2, 18, 3), None), ((2, 19, 3), 7), ((2, 20, 5), 8), ((2, 23, 4), 8),
                                          ((2, 24, 3), 9), ((2, 25, 1), 9), ((2, 26, 2), 10), ((2, 27, 7), 10),
                                          ((2, 28, 9), 11), ((2, 29, 7), 11), ((2, 30, 7), 12), ((2, 31, 0), 12)])
def test_nccl_version_to_abi(version, abi):
    assert dr.nccl_abi(version) == abi


@pytest.mark.parametrize("version,verified", [([2, 30, 7], True), ([2, 31, 2], True), ([2, 32, 3], True),
                                               ([2, 33, 0], False)])
def test_released_nccl_versions_up_to_2_32_are_known_to_use_v12(version, verified):
    rep = run(GOOD_NCCL, torch={"torch": "2.12.0", "nccl": version, "error": ""})
    ok = find(rep, "nccl", "NCCL", dr.OK)
    assert ok and "uses net ABI v12" in ok[0].detail, ok
    assert ("not verified" in ok[0].detail) is (not verified), ok[0].detail
    assert dr.NEWEST_KNOWN_NCCL == (2, 32)


def test_nccl_version_parsing():
    assert dr.parse_nccl_version((2, 28, 9)) == [2, 28, 9]
    assert dr.parse_nccl_version(22809) == [2, 28, 9]
    assert dr.parse_nccl_version(2708) == [2, 7, 8]
    assert dr.parse_nccl_version("x") is None


def test_torch_nccl_version_checks():
    t = lambda v: {"torch": "2.11.0", "nccl": v, "error": ""}  # noqa: E731
    rep = run(GOOD_NCCL, torch=t([2, 28, 9]))
    ok = find(rep, "nccl", "NCCL", dr.OK)
    assert ok and "NCCL 2.28.9, which uses net ABI v11" in ok[0].detail
    assert find(run(GOOD_NCCL, torch=t([2, 18, 1])), "nccl", "NCCL", dr.FAIL)
    rep = run(GOOD_NCCL, torch=t([2, 28, 9]), plugin=dict(PLUGIN_OK, abi=[7, 8, 9, 10]))
    assert find(rep, "plugin", "ABI", dr.FAIL)
    assert find(run(GOOD_NCCL, torch=t([2, 23, 4])), "nccl", "NCCL", dr.INFO)
    rep = run(dict(GOOD_NCCL, NCCL_NET_PLUGIN_REF_COUNT="0"), torch=t([2, 30, 3]))
    assert not find(rep, "nccl", "NCCL_NET_PLUGIN_REF_COUNT")   # fixed in 2.30.3
    assert find(run(GOOD_NCCL, torch={"torch": "2.13.0+cpu", "nccl": None, "error": "CPU"}), "nccl", "PyTorch", dr.INFO)


def test_plugin_failures():
    rep = run(GOOD_NCCL, plugin={"path": "/x.so", "loaded": False, "error": "undefined symbol: foo", "abi": []})
    assert "undefined symbol" in find(rep, "plugin", status=dr.FAIL)[0].detail
    rep = run(GOOD_NCCL, plugin={"path": "", "loaded": False, "error": "not found", "abi": []})
    assert find(rep, "plugin", status=dr.FAIL)
    rep = run(GOOD_NCCL, plugin=dict(PLUGIN_OK, foreign=["ncclTunerPlugin_v3"]))
    assert find(rep, "plugin", "symbols", dr.WARN)


def test_an_unusable_native_dir_is_a_plugin_fail_that_says_to_fix_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("RAILOVER_NATIVE_DIR", str(tmp_path / "gone"))
    facts = dr.gather(check_torch=False)
    assert facts.plugin["native_dir_error"] and not facts.plugin["loaded"]
    (c,) = find(run(GOOD_NCCL, plugin=facts.plugin), "plugin", status=dr.FAIL)
    assert f"RAILOVER_NATIVE_DIR={tmp_path / 'gone'}: no such directory" in c.detail
    assert c.fix == "fix or unset RAILOVER_NATIVE_DIR"


def test_the_built_plugin_loads_and_exports_v7_to_v12(tmp_path):
    info = dr.plugin_exports(_paths.plugin_path())
    assert info["loaded"], info["error"]
    assert info["abi"] == [7, 8, 9, 10, 11, 12]
    assert info["foreign"] == []
    bad = tmp_path / "libnccl-net-railover.so"
    bad.write_text("not an ELF")
    info = dr.plugin_exports(bad)
    assert not info["loaded"] and info["error"]


def test_ld_resolve_follows_library_path(tmp_path):
    so = tmp_path / _paths.PLUGIN_FILE
    so.write_text("")
    assert dr.ld_resolve({"LD_LIBRARY_PATH": f"/nonexistent:{tmp_path}"}) == str(so)


def test_torch_probe_reports_something():
    r = dr.torch_nccl()
    if r is None:
        pytest.skip("PyTorch not installed")
    assert r["torch"] and (r["nccl"] is not None or r["error"])


def test_tcp_probe_answers_and_timeouts():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        assert dr.tcp_probe("127.0.0.1", "127.0.0.1", port) == (True, f"TCP port {port} accepted")
    finally:
        srv.close()
    ok, how = dr.tcp_probe("127.0.0.1", "127.0.0.1", port)   # closed now: a refusal is an answer
    assert ok and "refused" in how
    ok, how = dr.tcp_probe("127.0.0.1", "127.0.0.2", port, timeout_s=0.5)
    assert ok   # 127/8 is local: refused too
    ok, how = dr.tcp_probe("10.255.255.1", "127.0.0.1", port)   # cannot bind an address we do not have
    assert not ok and how


def test_doctor_cli_json_and_exit_code(monkeypatch):
    facts = dr.Facts(env=dict(GOOD_NCCL), ifaces=IFACES, plugin=PLUGIN_OK, ld_resolve=PLUGIN_OK["path"])
    monkeypatch.setattr(dr, "gather", lambda plugin=None, check_torch=True: facts)
    monkeypatch.setattr(dr, "route_get", good_route)
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["ok"] is True and any(c["section"] == "routing" for c in doc["checks"])
    facts.env["RAILOVER_NSTREAMS"] = "0"
    r = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "250"})   # wide: the finding on one line of its cell
    assert r.exit_code == 1
    assert "RAILOVER_NSTREAMS='0' is not valid" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["doctor", "--peer", "nonsense"])
    assert r.exit_code == 2 and "bad --peer" in r.output


# --------------------------------------------------------------------------- bad input (no traceback)

@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_probe_port_must_be_a_tcp_port(monkeypatch, port):
    monkeypatch.setattr(dr, "gather", lambda plugin=None, check_torch=True: pytest.fail("gathered with a bad port"))
    r = CliRunner().invoke(app, ["doctor", "--peer", "192.0.2.1", "--probe-port", port, "--no-torch"])
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--probe-port'" in r.output, r.output


V4_ONLY = [dr.Iface("eth0", 2, ["10.0.0.1/24"]), dr.Iface("eth1", 3, ["10.0.1.1/24"])]
V6_TOO = [dr.Iface("eth0", 2, ["10.0.0.1/24", "fd00::1/64"]), dr.Iface("eth1", 3, ["10.0.1.1/24", "fd01::1/64"])]


@pytest.mark.parametrize("ifaces,env,peer,dv,sv", [
    (V4_ONLY, {}, "fd00::2", 6, 4),
    (V6_TOO, {"NCCL_SOCKET_FAMILY": "AF_INET6"}, "10.0.0.2", 4, 6),
])
def test_a_peer_of_another_address_family_is_a_finding_not_a_crash(ifaces, env, peer, dv, sv):
    def route(dst, src):
        assert ":" in dst and ":" in src or ":" not in dst and ":" not in src, "route_get with mixed families"
        return "eth0", ""

    def probe(src, dst, ifname=""):
        raise AssertionError("probed across address families")
    rep = run(dict(GOOD_NCCL, **env), ifaces=ifaces, peers=[peer], route=route, probe=probe)
    bad = find(rep, "routing", status=dr.FAIL)
    assert {c.what for c in bad} == {f"eth0 -> {peer}", f"eth1 -> {peer}"}
    assert all(f"is an IPv{dv} address" in c.detail and f"is IPv{sv}" in c.detail for c in bad), bad
    assert f"IPv{sv} address" in bad[0].fix and not rep.ok


def test_doctor_cli_family_mismatch_is_not_an_inspect_error(monkeypatch):
    facts = dr.Facts(env=dict(GOOD_NCCL), ifaces=V4_ONLY, plugin=PLUGIN_OK, ld_resolve=PLUGIN_OK["path"])
    monkeypatch.setattr(dr, "gather", lambda plugin=None, check_torch=True: facts)

    def route_get(dst, src):   # what pyroute2 does with mixed families
        raise OSError("illegal IP address string passed to inet_pton")
    monkeypatch.setattr(dr, "route_get", route_get)
    r = CliRunner().invoke(app, ["doctor", "--peer", "fd00::1", "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert any("is an IPv6 address" in c["detail"] for c in doc["checks"] if c["status"] == "FAIL")


def test_no_torch_says_the_check_was_skipped(monkeypatch):
    monkeypatch.setattr(dr, "torch_nccl", lambda *a, **k: pytest.fail("asked PyTorch despite --no-torch"))
    monkeypatch.setattr(dr, "list_interfaces", lambda ns=None: list(IFACES))
    monkeypatch.setattr(dr, "plugin_exports", lambda p: {"path": str(p), "loaded": False, "error": "x", "abi": [],
                                                          "collnet": [], "foreign": []})
    facts = dr.gather(env=dict(GOOD_NCCL), plugin=Path("/nonexistent.so"), check_torch=False)
    rep = dr.diagnose(facts, route=good_route)
    c = find(rep, "nccl", "PyTorch")
    assert len(c) == 1 and "skipped (--no-torch)" in c[0].detail and "not installed" not in c[0].detail
    assert "not installed" in find(run(GOOD_NCCL, torch=None), "nccl", "PyTorch")[0].detail


@pytest.mark.parametrize("kind,detail,fix", [
    ("missing", "no such file", "give the path of a built plugin"),
    ("dir", "a directory, not the plugin file", "give the file: "),
    ("junk", "dlopen failed", "check 'ldd'"),   # a file that does not load: ldd is the right advice there
])
def test_plugin_that_is_not_there_is_named_so_not_sent_to_ldd(tmp_path, kind, detail, fix):
    p = {"missing": tmp_path / "nope" / _paths.PLUGIN_FILE, "dir": tmp_path, "junk": tmp_path / "junk.so"}[kind]
    if kind == "junk":
        p.write_bytes(b"not an ELF file")
    checks = [c for c in dr.nccl_checks({}, dr.plugin_exports(p), None, None) if c.section == "plugin"]
    assert len(checks) == 1 and checks[0].status == dr.FAIL, checks
    assert checks[0].detail.startswith(detail) and fix in checks[0].fix, checks[0]
    if kind != "junk":
        assert "ldd" not in checks[0].fix


def test_doctor_tables_fold_long_words_instead_of_cutting_them():
    from rich.console import Console

    from railover.ops.cli import render_doctor
    long_fix = "export LD_LIBRARY_PATH=/opt/some/rather/long/install/prefix/railover/lib:$LD_LIBRARY_PATH"
    rep = dr.Report(checks=[dr.Check("nccl", "NCCL_NET_PLUGIN_REF_COUNT_AND_A_LONG_NAME", dr.FAIL,
                                     "/a/path/that/is/longer/than/its/column/libnccl-net-railover.so", long_fix)],
                    nics=[{"name": "enp1s0f0np0-with-a-long-name", "selected": True, "reason": "RAILOVER_IFNAMES",
                           "addrs": ["fd00:1234:5678:9abc:def0:1234:5678:9abc/64"], "admin_up": True, "carrier": True,
                           "rail": 0}])
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(render_doctor(rep))
    text = console.export_text()
    assert "…" not in text, text
    cells = "".join(text.replace("│", " ").split())   # every cell's characters, in order per line
    for word in ("LD_LIBRARY_PATH=", "/lib:$LD_", "libnccl-net-railover.so"[:8]):
        assert word in cells, text


@pytest.mark.parametrize("columns,want", [("80", 80), ("60", 60), ("20", 40)])
def test_doctor_tables_fit_the_terminal(monkeypatch, columns, want):
    """doctor's console was max(100, terminal width): on an 80-column terminal every line was
    100 characters and wrapped. Its lines now fit the terminal (at least 40 columns)."""
    facts = dr.Facts(env=dict(GOOD_NCCL, RAILOVER_NSTREAMS="0"), ifaces=IFACES, plugin=PLUGIN_OK,
                     ld_resolve=PLUGIN_OK["path"])
    monkeypatch.setattr(dr, "gather", lambda plugin=None, check_torch=True: facts)
    monkeypatch.setattr(dr, "route_get", good_route)
    r = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": columns})
    assert r.exit_code == 1, r.output
    widths = [len(line.rstrip()) for line in r.output.splitlines()]
    assert max(widths) <= want and max(widths) > want - 10, (max(widths), r.output)


def test_a_plugin_that_is_not_a_railover_build_is_no_ok():
    """--plugin of another NCCL net plugin (here the test bed's baseline): it loads and exports
    ncclNetPlugin_v*, but NCCL would run it without railover's failover; doctor said 'OK loads'."""
    own = dr.plugin_exports(_paths.plugin_path())
    assert own["railover"] is True
    baseline = _paths.plugin_path().parent / "libnccl-net-baseline.so"
    if not baseline.exists():
        pytest.skip(f"{baseline} not built")
    info = dr.plugin_exports(baseline)
    assert info["loaded"] and info["abi"] and info["railover"] is False
    (c,) = [c for c in dr.nccl_checks({}, info, None, None) if c.section == "plugin"]
    assert c.status == dr.FAIL and "not a railover build" in c.detail, c
    assert c.fix == "the file is not a railover plugin build"
    (c,) = [c for c in dr.nccl_checks({}, own, None, None) if c.section == "plugin"]
    assert c.status == dr.OK, c


def test_settings_are_checked_with_the_plugin_doctor_was_given(monkeypatch):
    """doctor --plugin X checks the RAILOVER_* values with X's own parser (the build NCCL will
    load), not with the installed plugin's; a file that is no railover build falls back to it."""
    from railover import params
    real = params.load
    asked = []

    def load(path=None):
        asked.append(path)
        return real()

    monkeypatch.setattr(params, "load", load)
    other = dict(PLUGIN_OK, path="/opt/other/libnccl-net-railover.so", railover=True)
    run(dict(GOOD_NCCL, RAILOVER_HOLD_DOWN_MS="500"), plugin=other)
    assert asked and asked[0] == Path("/opt/other/libnccl-net-railover.so"), asked
    asked.clear()
    run(dict(GOOD_NCCL, RAILOVER_HOLD_DOWN_MS="500"), plugin=dict(other, railover=False))
    assert Path("/opt/other/libnccl-net-railover.so") not in asked, asked


def test_peers_whose_rails_do_not_match_warn():
    # both NICs have a peer on their subnet: nothing to say
    rep = run(GOOD_NCCL, peers=["10.0.0.2", "10.0.1.2"])
    assert not find(rep, "rails")
    # the peer host has no NIC on eth1's subnet, and one on a subnet no NIC here has
    rep = run(GOOD_NCCL, peers=["10.0.0.2", "10.0.9.2"], route=lambda dst, src: ("eth0", ""))
    (nic,) = find(rep, "rails", "eth1", dr.WARN)
    assert "10.0.1.0/24" in nic.detail and "10.0.0.2 on eth0" in nic.detail, nic.detail
    (peer,) = find(rep, "rails", "10.0.9.2", dr.WARN)
    assert "no selected NIC's subnet" in peer.detail
    assert rep.ok  # a WARN: a route may reach it
    # a routed fabric (no peer on any local subnet) says nothing of rails
    rep = run(GOOD_NCCL, peers=["192.168.5.5", "192.168.6.5"], route=lambda dst, src: ("eth0", ""))
    assert not find(rep, "rails")


def test_a_peer_that_is_an_address_of_this_host_is_not_checked():
    """One --peer list for every host of a job (`srun railover doctor --peer A --peer B` runs
    the same command on A and B) names each host's own NICs too: such a peer was checked like
    a remote one, its route judged through lo ("leaves through lo, not eth0", a FAIL on its own
    subnet: exit 1, the node drained). It is named as this host's and left out."""
    local = {"10.0.0.1", "10.0.1.1", "fd00::1", "127.0.0.1", "172.17.0.1", "192.168.122.1"}

    def kernel(dst, src, oif=None):
        return ("lo" if dst in local else good_route(dst, src)[0]), ""

    rep = run(GOOD_NCCL, peers=["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2"], route=kernel)
    assert rep.ok, [(c.what, c.detail) for c in rep.checks if c.status == dr.FAIL]
    assert {c.what for c in find(rep, "routing")} == {"eth0 -> 10.0.0.2", "eth1 -> 10.0.1.2"}
    (i,) = find(rep, "reach", "10.0.0.1")
    assert i.status == dr.INFO and "is an address of this host (eth0)" in i.detail
    # only this host's own addresses: checked as without --peer (a neighbour on each NIC's subnet)
    rep = run(GOOD_NCCL, peers=["10.0.0.1", "10.0.1.1"], route=kernel)
    assert rep.ok and {c.what for c in find(rep, "routing")} == {"eth0 -> 10.0.0.2", "eth1 -> 10.0.1.2"}


_OURS = {"path": "/x/libnccl-net-railover.so", "loaded": True, "abi": [10, 11], "railover": True}


@pytest.mark.parametrize("nccl,status", [(None, dr.WARN), ((2, 23, 4), dr.FAIL), ((2, 26, 6), dr.FAIL),
                                         ((2, 27, 7), dr.OK), ((2, 29, 2), dr.OK)])
def test_a_plugin_list_naming_railover_is_judged_by_the_nccl_release(nccl, status):
    """NCCL 2.27+ read NCCL_NET_PLUGIN as a comma list; before 2.27 the whole value is one name
    (libnccl-net-railover,ib.so: nothing opens and init fails with NCCL_NET=railover). doctor
    warned about a list whatever the release, even one known to fail."""
    env = {"NCCL_NET": "railover", "NCCL_NET_PLUGIN": "railover,ib"}
    checks = [c for c in dr.nccl_checks(env, _OURS, {"nccl": nccl} if nccl else None, _OURS["path"])
              if c.what == "NCCL_NET_PLUGIN"]
    (lst,) = [c for c in checks if "lists several plugins" in c.detail]
    assert lst.status == status, lst
    assert "'ib': no plugin" in lst.detail


@pytest.mark.parametrize("plugins,words", [
    ("ib, railover", "does not trim blanks"), ("foo,ib", "lists no railover plugin (entries: foo, ib)")])
def test_a_plugin_list_that_opens_no_railover_fails(plugins, words):
    """NCCL does not trim the entries: 'ib, railover' looks for ' railover' and finds nothing;
    doctor trimmed them and said the list was fine."""
    env = {"NCCL_NET": "railover", "NCCL_NET_PLUGIN": plugins}
    checks = [c for c in dr.nccl_checks(env, _OURS, {"nccl": (2, 28, 3)}, _OURS["path"])
              if c.what == "NCCL_NET_PLUGIN"]
    assert [c.status for c in checks] == [dr.FAIL] and words in checks[0].detail, checks


def test_a_state_dir_of_off_in_another_case_fails_and_relative_paths_warn():
    """RAILOVER_STATE_DIR=OFF made each rank write into a directory OFF in its working
    directory, and doctor said OK (found by a fresh-user trial): the plugin now refuses it.
    A relative state dir or journal lands wherever each rank was started and is not where
    status and the exporter look: a WARN."""
    def check(var, v):
        (c,) = [c for c in dr.validate_config({var: v}) if c.what == var]
        return c

    c = check("RAILOVER_STATE_DIR", "OFF")
    assert c.status == dr.FAIL and "'off' in lower case turns state files off" in c.detail, c
    assert check("RAILOVER_STATE_DIR", "off").status == dr.OK
    for var, v in (("RAILOVER_STATE_DIR", "state"), ("RAILOVER_EVENT_LOG", "logs/%p.jsonl")):
        c = check(var, v)
        assert c.status == dr.WARN and "is a relative path" in c.detail and c.fix == f"give {var} an absolute path", c


def test_a_state_dir_the_plugin_cannot_use_warns_with_the_reason(tmp_path):
    """RAILOVER_STATE_DIR is judged by the plugin's rule (an existing writable directory, or one
    mkdir makes, without its parents). As root, os.access said /proc was writable and doctor
    said OK to RAILOVER_STATE_DIR=/proc/x, and to a file it advised "create /etc/passwd"."""
    def check(v):
        (c,) = [c for c in dr.validate_config({"RAILOVER_STATE_DIR": v}) if c.what == "RAILOVER_STATE_DIR"]
        return c

    (tmp_path / "file").write_text("x")
    c = check(str(tmp_path / "file"))
    assert c.status == dr.WARN and "exists and is not a directory" in c.detail and "no state file" in c.detail, c
    assert "point RAILOVER_STATE_DIR at a directory" in c.fix and "create" not in c.fix, c
    c = check(str(tmp_path / "a" / "b"))
    assert c.status == dr.WARN and f"{tmp_path / 'a'} does not exist" in c.detail, c
    c = check("/proc/railover-doctor-test")
    assert c.status == dr.WARN and "cannot create /proc/railover-doctor-test" in c.detail, c
    for ok in (str(tmp_path / "new"), str(tmp_path)):
        assert check(ok).status == dr.OK, check(ok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], "the try left a directory behind"
