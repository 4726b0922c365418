"""Logic of the RDMA test bed that needs no guest: argument checks, apt output parsing, the
accelerator choice, the guest /init script's syntax, and the QEMU command line's wiring."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from railover.testbed.rdma import bed as rbed
from railover.testbed.rdma import guest, image


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="exactly 2 hosts"):
        rbed.RdmaBed(hosts=3)
    with pytest.raises(ValueError, match="rails must be 1..8"):
        rbed.RdmaBed(rails=0)
    with pytest.raises(ValueError, match="kernel must be one of 6.1, 6.12"):
        rbed.RdmaBed(kernel="5.10")
    with pytest.raises(ValueError, match="bad sysctl"):
        rbed.RdmaBed(sysctls={"net.ipv4.x; reboot": 1})
    with pytest.raises(image.ImageError, match="unknown kernel series"):
        image.resolve_packages("4.19")


def test_topology_names_addresses_and_peers():
    bed = rbed.RdmaBed(rails=3, base=7)
    assert [n.name for n in bed.hosts[0].nics] == ["a0", "a1", "a2"]
    b2 = bed.nic("b2")
    assert (b2.ifname, b2.rdma_dev, b2.addr, b2.netdev) == ("eth3", "rxe2", "10.7.2.2", "nic3")
    assert bed.peer("a1").name == "b1" and bed.peer(b2).name == "a2"
    assert bed.hosts[1].mgmt_addr == "10.7.200.2"
    assert bed.rail_env() == {"RAILOVER_IFNAMES": "=eth1,eth2,eth3"}
    with pytest.raises(KeyError):
        bed.nic("c0")


def test_apt_depends_parser_takes_first_alternative_and_skips_virtual(monkeypatch):
    out = ("iproute2\n |Depends: debconf\n  Depends: <debconf-2.0>\n    cdebconf\n  Depends: libbpf1\n"
           "  PreDepends: libc6\nbash\n  PreDepends: libtinfo6\n")
    monkeypatch.setattr(image, "_run", lambda *a, **k: out)
    assert image._depends(["iproute2", "bash"]) == {"iproute2": ["debconf", "libbpf1", "libc6"],
                                                    "bash": ["libtinfo6"]}


def test_accel_choice_explains_itself(monkeypatch):
    assert rbed.choose_accel("tcg") == ("tcg", "requested")
    with pytest.raises(rbed.RdmaBedError, match="accel must be"):
        rbed.choose_accel("hvf")
    # a bad value in the environment is named as the variable the user set
    monkeypatch.setenv("RAILOVER_RDMA_ACCEL", "foo")
    with pytest.raises(rbed.RdmaBedError, match="RAILOVER_RDMA_ACCEL must be auto, kvm or tcg, got 'foo'"):
        rbed.choose_accel("auto")
    monkeypatch.setenv("RAILOVER_RDMA_ACCEL", "tcg")
    assert rbed.choose_accel("auto") == ("tcg", "requested")
    monkeypatch.setenv("RAILOVER_RDMA_ACCEL", " ")  # blank: unset, as every railover variable
    monkeypatch.setattr(rbed.os, "access", lambda p, m: False)
    accel, why = rbed.choose_accel("auto")
    assert accel == "tcg" and "/dev/kvm" in why
    with pytest.raises(rbed.RdmaBedError, match="KVM requested but unusable"):
        rbed.choose_accel("kvm")


def test_guest_init_is_valid_bash():
    r = subprocess.run(["bash", "-n"], input=guest.INIT_SCRIPT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert guest.CTL_PORT_NAME in guest.INIT_SCRIPT


def _argv_bed(tmp_path, **kw):
    bed = rbed.RdmaBed(rails=2, **kw)
    bed.run_dir = tmp_path
    bed.accel = "tcg"
    bed.smp = 1
    bed.image = image.GuestImage(Path("/k"), Path("/i"), "6.1.0-x", "6.1", "k", {}, False, 0.0)
    return bed


def test_qemu_argv_wires_each_nic_to_the_same_nic_of_the_peer_over_a_unix_stream(tmp_path):
    bed = _argv_bed(tmp_path)
    a = bed._qemu_argv(bed.hosts[0], None, tmp_path / "build")
    b = bed._qemu_argv(bed.hosts[1], None, tmp_path / "build")
    for n in range(3):
        sock = tmp_path / "wire" / f"nic{n}.sock"
        assert f"stream,id=nic{n},server=on,addr.type=unix,addr.path={sock}" in a
        assert f"stream,id=nic{n},server=off,addr.type=unix,addr.path={sock}" in b
    assert not any("udp=" in x for x in a + b)
    cmdline = a[a.index("-append") + 1]
    assert "ro.addrs=10.0.200.1/24,10.0.0.1/24,10.0.1.1/24" in cmdline and "panic=-1" in cmdline
    assert "-no-reboot" in a and not any("tap" in x or "bridge" in x for x in a)


def test_qemu_argv_wires_each_nic_to_the_same_nic_of_the_peer_over_udp_when_asked(tmp_path):
    bed = _argv_bed(tmp_path, wire="udp")
    ports = {(h, n): 40000 + 10 * h + n for h in (0, 1) for n in range(3)}
    a = bed._qemu_argv(bed.hosts[0], ports, tmp_path / "build")
    b = bed._qemu_argv(bed.hosts[1], ports, tmp_path / "build")
    for n in range(3):
        assert f"socket,id=nic{n},udp=127.0.0.1:{40010 + n},localaddr=127.0.0.1:{40000 + n}" in a
        assert f"socket,id=nic{n},udp=127.0.0.1:{40000 + n},localaddr=127.0.0.1:{40010 + n}" in b


def test_an_unknown_wire_is_refused_by_name():
    with pytest.raises(ValueError, match="wire must be one of stream, udp, got 'tcp'"):
        rbed.RdmaBed(wire="tcp")


def test_unix_socket_states_tells_a_listener_from_an_accepted_connection():
    text = """Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 789456 /run/w/nic0.sock
0000000000000000: 00000003 00000000 00000000 0001 03 790110 /run/w/nic0.sock
0000000000000000: 00000002 00000000 00010000 0001 01 789457 /run/w/nic1.sock
0000000000000000: 00000003 00000000 00000000 0001 03 790111 /run/other.sock
0000000000000000: 00000003 00000000 00000000 0001 03 790112
"""
    st = rbed.unix_socket_states(["/run/w/nic0.sock", "/run/w/nic1.sock", "/run/w/nic2.sock"], text)
    assert st == {"/run/w/nic0.sock": {"listening", "connected"}, "/run/w/nic1.sock": {"listening"}}


def test_unix_socket_states_sees_a_real_listener_and_its_connection(tmp_path):
    import socket
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    assert rbed.unix_socket_states([path]).get(path, set()) == set()
    srv.listen(1)
    assert rbed.unix_socket_states([path]) == {path: {"listening"}}
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli.connect(path)
    conn, _ = srv.accept()
    try:
        assert rbed.unix_socket_states([path]) == {path: {"listening", "connected"}}
    finally:
        conn.close(), cli.close(), srv.close()


def test_leftovers_of_a_killed_owner_are_listed_and_removed(tmp_path, monkeypatch):
    # A stand-in process plays the orphaned QEMU (only the bookkeeping is under test here;
    # tests/rdma exercise real QEMU teardown).
    import json
    from railover.testbed import netns
    monkeypatch.setenv("RAILOVER_TESTBED_STATE", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = subprocess.Popen(["sleep", "600"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        (tmp_path / "state" / "rdma-roabcd.json").write_text(json.dumps({
            "prefix": "roabcd", "pid": dead.pid, "pid_start": 1, "run_dir": str(run_dir), "kernel": "6.1.0-x",
            "hosts": 2, "rails": 2, "qemu": [{"host": "A", "pid": victim.pid,
                                              "start": netns._proc_starttime(victim.pid)}]}))
        [info] = [i for i in rbed.list_rdma_beds() if i.prefix == "roabcd"]
        assert not info.alive and info.qemu_pids == [victim.pid]
        removed = rbed.cleanup_rdma_leftovers()
        assert victim.wait(10) == -9
        # other beds may be live on this machine (a session's RDMA bed, another job's): only ours counts
        assert not run_dir.exists() and "roabcd" not in {i.prefix for i in rbed.list_rdma_beds()}
        assert any(str(victim.pid) in line for line in removed)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_reset_scripts_are_valid_bash_and_cover_every_nic():
    bed = rbed.RdmaBed(rails=2, base=3)
    h = bed.hosts[1]
    h.gids = {"rxe0": "0000:0000:0000:0000:0000:ffff:0a03:0002"}
    script = rbed.reset_script(h)
    wait = rbed.reset_wait_script(h, 120)
    for text in (script, wait):
        r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    for line in ("ro_nic eth0 10.3.200.2/24", "ro_nic eth1 10.3.0.2/24 rxe0 0000:0000:0000:0000:0000:ffff:0a03:0002",
                 "ro_nic eth2 10.3.1.2/24 rxe1"):
        assert line in script.splitlines()
    assert " railover-perf " in script and " railover-verbs- " in script  # comm: 15 characters
    assert "rxe0:gid" in wait and "rxe1:gid" not in wait  # only a GID known from boot is checked


def test_parse_reset_output():
    out = ("FIXED killed a stray railover-perf (pid 77)\n"
           "FIXED eth1 had a tbf root qdisc: removed\n"
           "NIC eth0 1 - -\n"
           "NIC eth1 0 DOWN 0000:0000:0000:0000:0000:ffff:0a00:0001\n"
           "NIC eth2 x ACTIVE 0000:0000:0000:0000:0000:ffff:0a00:0101\n"
           "unrelated line\n")
    fixed, nics = rbed.parse_reset_output(out)
    assert fixed == ["killed a stray railover-perf (pid 77)", "eth1 had a tbf root qdisc: removed"]
    assert nics == {"eth0": ("1", "-", "-"), "eth1": ("0", "DOWN", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
                    "eth2": ("x", "ACTIVE", "0000:0000:0000:0000:0000:ffff:0a00:0101")}
    assert rbed.parse_reset_output("") == ([], {})


def test_tc_stats_parser():
    from railover.testbed.rdma import faults as rf
    out = ("qdisc tbf 8001: root refcnt 2 rate 8Mbit burst 32Kb lat 1.5s \n"
           " Sent 2345678 bytes 1789 pkt (dropped 4, overlimits 311 requeues 0) \n"
           " backlog 45420b 30p requeues 0\n")
    assert rf.parse_tc_stats(out) == {"sent_bytes": 2345678, "sent_packets": 1789, "dropped": 4, "overlimits": 311,
                                      "requeues": 0, "backlog_packets": 30}
    assert rf.parse_tc_stats("qdisc fq_codel 0: root refcnt 2\n") is None


def test_stop_fault_checks_the_process_name():
    from railover.testbed.rdma import faults as rf
    bed = rbed.RdmaBed()
    with pytest.raises(ValueError, match="bad process name"):
        rf.Stop(bed, "B", "perf; reboot")
    assert repr(rf.Stop(bed, "B")) == "<STOP railover-perf in B inactive>"


class _NftGuests:
    """Stands in for the guests' shells under an unbooted RdmaBed: records each nft script per
    guest, answers with a stamp on that guest's clock (host time + the guest's offset), and can
    refuse the nth script."""

    OFFSETS = {"A": 5_000_000, "B": 9_000_000}  # guest clock - host clock, µs

    def __init__(self, fail_on=None):
        self.scripts, self.runs, self.fail_on, self.t = [], [], fail_on, 100_000_000

    def sh(self, host, script, timeout_s=120.0):
        self.scripts.append((host, script))
        self.t += 1000
        if self.fail_on == len(self.scripts):
            return 1, "", "Error: Could not process rule: No such file or directory"
        return 0, f"RO_STAMP {(self.t + self.OFFSETS[host]) * 1000}\n", ""

    def run(self, host, argv, timeout_s=60.0, **kw):
        self.runs.append((host, list(argv)))
        if argv[:3] == ["nft", "list", "table"]:
            return 0, "chain c0 { iifname \"eth1\" counter packets 7 bytes 700 drop }", ""
        return 0, "", ""

    def clock_offset_us(self, host, samples=5):
        return self.OFFSETS[host], 40


def _nft_bed(monkeypatch, fail_on=None):
    from railover.testbed.rdma import faults as rf  # noqa: F401  (import check)
    bed = rbed.RdmaBed(rails=2)
    g = _NftGuests(fail_on)
    for name in ("sh", "run", "clock_offset_us"):
        monkeypatch.setattr(bed, name, getattr(g, name))
    return bed, g


def test_a_one_way_cut_on_the_wire_drops_at_the_link_partners_input_and_stamps_on_the_nics_clock(monkeypatch):
    from railover.testbed.rdma import faults as rf
    bed, g = _nft_bed(monkeypatch)
    f = rf.OneWay(bed, "a0").apply()
    assert f.hosts() == ["B"] and [h for h, _ in g.scripts] == ["B"]
    script = g.scripts[0][1]
    assert "hook input" in script and 'iifname "eth1"' in script and "hook output" not in script
    # B's stamp (host 100_001_000 + B's offset) lands on A's clock: host time + A's offset
    assert f.guest == "A" and f.applied_us == 100_001_000 + _NftGuests.OFFSETS["A"]
    assert f.stamp_error_us == 80
    assert f.counter() == 7
    f.undo()
    assert g.scripts[-1][0] == "B" and f"nft delete table inet {f.table}" in g.scripts[-1][1]
    assert f.undone_us == 100_002_000 + _NftGuests.OFFSETS["A"] and not f.active


def test_a_silent_cut_on_the_wire_drops_at_both_inputs_and_at_host_keeps_the_nics_own_hooks(monkeypatch):
    from railover.testbed.rdma import faults as rf
    bed, g = _nft_bed(monkeypatch)
    f = rf.Silent(bed, "b1").apply()
    assert f.hosts() == ["A", "B"]
    by_host = dict(g.scripts)
    assert all('iifname "eth2"' in s and "hook input" in s and "hook output" not in s for s in by_host.values())
    assert f.guest == "B" and f.applied_us == 100_001_000 + _NftGuests.OFFSETS["B"]  # the earlier of the two
    assert f.counter() == 14  # both guests' rules
    f.undo()
    assert f.undone_us == 100_004_000 + _NftGuests.OFFSETS["B"]  # the later removal
    g.scripts.clear()
    h = rf.Silent(bed, "b1", at="host").apply()
    assert h.hosts() == ["B"] and len(g.scripts) == 1
    assert 'oifname "eth2"' in g.scripts[0][1] and 'iifname "eth2"' in g.scripts[0][1]
    assert h.stamp_error_us == 0  # its own guest's clock: nothing mapped
    o = rf.OneWay(bed, "a1", at="host")
    assert o.hosts() == ["A"]
    with pytest.raises(ValueError, match="at must be one of wire, host, got 'switch'"):
        rf.OneWay(bed, "a0", at="switch")


def test_a_cut_that_fails_in_its_second_guest_leaves_no_rule_behind(monkeypatch):
    from railover.testbed.rdma import faults as rf
    bed, g = _nft_bed(monkeypatch, fail_on=2)
    f = rf.Silent(bed, "a0")
    with pytest.raises(rf.FaultError, match=r"nft add table ro_silent_\w+ in guest B failed .*No such file"):
        f.apply()
    assert not f.active and f._hosts_with_table == []
    assert g.runs == [("A", ["nft", "delete", "table", "inet", f.table])]


def test_an_undo_that_fails_in_one_guest_still_removes_the_other_and_stays_active(monkeypatch):
    from railover.testbed.rdma import faults as rf
    bed, g = _nft_bed(monkeypatch)
    f = rf.Silent(bed, "a0").apply()  # scripts 1 (A) and 2 (B)
    g.fail_on = 3  # the delete in A fails
    with pytest.raises(rf.FaultError, match="nft delete table ro_silent_\\w+ in guest A failed"):
        f.undo()
    assert f.active and f._hosts_with_table == ["A"] and g.scripts[-1][0] == "B"
    g.fail_on = None
    f.undo()
    assert not f.active and f._hosts_with_table == []


def test_a_cleanup_that_fails_says_which_rules_are_left(monkeypatch):
    from railover.testbed.rdma import faults as rf
    bed, g = _nft_bed(monkeypatch, fail_on=2)
    monkeypatch.setattr(bed, "run", lambda host, argv, timeout_s=60.0, **kw: (1, "", "Error: No such table"))
    f = rf.Silent(bed, "a0")
    with pytest.raises(rf.FaultError, match=r"could not be removed again: guest A: Error: No such table"):
        f.apply()
    assert f._hosts_with_table == ["A"]


def test_a_stamp_is_mapped_between_guest_clocks_through_both_offsets(monkeypatch):
    bed, g = _nft_bed(monkeypatch)
    a, b = g.OFFSETS["A"], g.OFFSETS["B"]
    assert bed.map_clock_us(1_000_000, "B", "A") == (1_000_000 - b + a, 80)
    assert bed.map_clock_us(1_000_000, "A", "B") == (1_000_000 - a + b, 80)
    assert bed.map_clock_us(1_000_000, "A", "A") == (1_000_000, 0)


def test_a_logs_dir_that_cannot_be_written_does_not_stop_the_teardown(tmp_path):
    """RAILOVER_RDMA_LOGS=/proc/nope: the consoles cannot be kept, the guests are still stopped
    (a teardown that raised here left the bed's run dir and state file behind)."""
    said = []
    bed = rbed.RdmaBed(rails=2, log=said.append)
    bed.run_dir = tmp_path / "run"
    for h in bed.hosts:
        (bed.run_dir / h.name).mkdir(parents=True)
        (bed.run_dir / h.name / "console.log").write_text("boot\n")
    bed.logs_dir = Path("/proc/nope/logs")
    bed._stop_guests()  # must not raise
    assert any("guest consoles not kept in /proc/nope/logs" in m for m in said), said
    bed.logs_dir = tmp_path / "logs"
    bed._stop_guests()
    assert sorted(p.name for p in bed.logs_dir.iterdir()) == [f"{bed.prefix}-{h.name}-boot0.console.log" for h in bed.hosts]


@pytest.mark.parametrize("content", ["[]", '{"prefix": "roabcd", "pid": [1], "namespaces": 5}',
                                     '{"prefix": "roabcd", "pid": 7, "qemu": [{"pid": "x"}]}',
                                     '{"prefix": "roabcd", "qemu": null, "namespaces": [1]}', "[" * 100000],
                         ids=["list", "wrong-types", "qemu-pid-string", "nulls", "nested-100000-deep"])
def test_a_corrupt_bed_state_file_is_skipped_not_a_traceback(tmp_path, monkeypatch, content):
    """A bed state file that is JSON but no object of the bed's fields ('[]', a pid that is a
    list, a QEMU pid that is a string), or nested past Python's recursion limit, ended `railover
    testbed list` (and `down`, which lists first) in a traceback: no bed could be listed or
    removed. It is skipped like an unreadable file; its namespaces are still found by name."""
    from typer.testing import CliRunner
    from railover.cli import app
    from railover.testbed import netns
    monkeypatch.setenv("RAILOVER_TESTBED_STATE", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    for name in ("roabcd.json", "rdma-roabcd.json"):
        (tmp_path / "state" / name).write_text(content)
    for info in rbed.list_rdma_beds():   # listed only when what cleanup acts on is sound
        assert all(isinstance(p, int) for p in info.qemu_pids) and isinstance(info.pid, (int, type(None)))
    for info in netns.list_testbeds():
        assert all(isinstance(n, str) for n in info.namespaces)
    r = CliRunner().invoke(app, ["testbed", "list"])
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.output)
