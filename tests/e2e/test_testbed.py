"""End-to-end tests of the namespace test bed (railover.testbed.netns) and the fault primitives
(railover.testbed.faults). Every fault is checked by observing traffic: it works before, fails (or
drop counters rise) while the fault is active, and works again after undo()."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from railover.testbed import faults as F
from railover.testbed import netns as T
from railover.testbed.netns import TestBed, Topology, now_us, poll_until

netns = pytest.mark.netns
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _existing(prefix: str) -> list:
    return [n for n in T._list_netns() if n.startswith(prefix + "-")]


def _works(tb, src, dst, port, payload=b"probe", within=5.0) -> bool:
    """Poll until an echo over src -> dst succeeds (raises TimeoutError otherwise)."""
    return poll_until(lambda: tb.tcp_echo(src, dst, port, payload, timeout_s=1.0), within,
                      what=f"echo {getattr(src, 'name', src)} -> {getattr(dst, 'name', dst)}")


def _proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


class UdpPair:
    """UDP sender in one host, receiver in another, counting datagrams."""

    def __init__(self, tb, src, dst):
        self.src, self.dst = src, dst
        self.rx = tb.socket(dst.host, type=socket.SOCK_DGRAM)
        self.rx.bind((dst.addr, 0))
        self.rx.setblocking(False)
        self.tx = tb.socket(src.host, type=socket.SOCK_DGRAM)
        self.tx.bind((src.addr, 0))
        self.received = 0

    def drain(self) -> int:
        while True:
            try:
                self.rx.recv(2048)
                self.received += 1
            except BlockingIOError:
                return self.received

    def send(self, n: int, batch: int = 20) -> int:
        """Send n datagrams (draining between batches); returns how many sendto() refused."""
        refused = 0
        for i in range(n):
            try:
                self.tx.sendto(b"x" * 64, self.rx.getsockname())
            except PermissionError:  # an nft drop in the local output hook -> EPERM
                refused += 1
            if i % batch == batch - 1:
                self.drain()
        return refused

    def close(self):
        self.rx.close()
        self.tx.close()


# --------------------------------------------------------------------------- no privileges needed

def test_now_us_is_clock_monotonic_microseconds():
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    b = now_us()
    c = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert a <= b <= c


def test_layout_parsing_and_planning():
    assert Topology.from_layout("T2") == Topology(2, 2, False)
    assert Topology.from_layout("T2-flat").flat
    assert Topology.from_layout("T3").hosts == 3
    assert Topology.from_layout("4x3-flat") == Topology(4, 3, True)
    with pytest.raises(ValueError, match="unknown layout"):
        Topology.from_layout("T9")
    with pytest.raises(ValueError, match="prefix"):
        TestBed("T2", prefix="bad")
    tb = TestBed("T2-flat", base=5)  # planning only: nothing is created before up()
    assert {n.name: n.addr for n in tb.nics} == {
        "a0": "10.5.0.1", "a1": "10.5.0.11", "b0": "10.5.0.2", "b1": "10.5.0.12"}
    assert all(len(n.ifname) <= 15 and len(n.port) <= 15 for n in tb.nics)
    assert tb.nic("swB1") is tb.nic("b1") and tb.host("nsB").name == "B"
    big = TestBed(hosts=30, nics=4)
    assert big.nic("h29n3").addr == "10.0.3.30"
    assert all(len(n.ifname) <= 15 and len(n.port) <= 15 for n in big.nics)


# --------------------------------------------------------------------------- topology

@netns
def test_t2_up_down_leaves_nothing(testbed):
    with TestBed("T2") as tb:
        prefix = tb.prefix
        assert T.PREFIX_RE.match(prefix)
        assert sorted(_existing(prefix)) == sorted(tb.namespaces)
        assert tb.state_file.is_file()
        assert [h.name for h in tb.hosts] == ["A", "B"] and tb.mode in ("root", "userns")
        for n in tb.nics:
            st = F.link_state(tb, n)
            assert st.admin_up and st.carrier and st.addrs == [n.addr]
            assert n.addr == f"10.0.{n.rail}.{tb.host(n.host).index + 1}"
        with T.netlink(tb.fabric_ns) as ipr:
            for n in tb.nics:
                port = ipr.get_links(ipr.link_lookup(ifname=n.port)[0])[0]
                br = ipr.link_lookup(ifname=n.bridge)[0]
                assert port.get("IFLA_MASTER") == br, f"{n.port} not on {n.bridge}"
        srv = tb.echo_server("B")
        sleeper = tb.run("A", ["sleep", "300"])
        # rails are isolated: a burst on rail 0 never shows up on rail 1
        rx_b1 = F.nic_stats(tb, "b1")[0]
        assert _works(tb, "a0", "b0", srv.port, b"x" * 50000)
        assert _works(tb, "a1", "b1", srv.port)
        assert F.nic_stats(tb, "b1")[0] - rx_b1 < 50000
    assert _existing(prefix) == []
    assert not tb.state_file.exists()
    assert sleeper.poll() is not None, "process started in the bed survived teardown"
    assert prefix not in {i.prefix for i in T.list_testbeds()}


@netns
def test_flat_layout_routes_by_source_address(testbed):
    tb = testbed("T2-flat")
    a0, a1, b0, b1 = (tb.nic(x) for x in ("a0", "a1", "b0", "b1"))
    assert (a0.addr, a1.addr, b0.addr, b1.addr) == ("10.0.0.1", "10.0.0.11", "10.0.0.2", "10.0.0.12")
    assert {n.bridge for n in tb.nics} == {"br0"}
    rc, out, _ = tb.run_collect("A", ["sh", "-c", "ip rule; sysctl -n net.ipv4.conf.all.arp_ignore"
                                      " net.ipv4.conf.all.arp_announce"])
    assert rc == 0 and "from 10.0.0.1 lookup 100" in out and "from 10.0.0.11 lookup 101" in out
    assert out.split()[-2:] == ["1", "2"]
    srv = tb.echo_server("B")
    payload = b"y" * 100000
    for src, other in ((a1, a0), (a0, a1)):
        tx_src, tx_other = F.nic_stats(tb, src)[1], F.nic_stats(tb, other)[1]
        assert _works(tb, src, b0, srv.port, payload)
        assert F.nic_stats(tb, src)[1] - tx_src > len(payload)
        assert F.nic_stats(tb, other)[1] - tx_other < 1000, f"traffic from {src.addr} leaked via {other.name}"
    # a0 down: traffic sourced from a0's address fails instead of leaking through a1 ...
    with F.HostDown(a0):
        with pytest.raises(OSError) as ei:
            tb.connect(a0, b0, srv.port, timeout_s=0.5)
        assert ei.value.errno == errno.ENETUNREACH
        assert _works(tb, a1, b0, srv.port)
    # ... and after undo the per-NIC route is back: a0's traffic leaves through a0 again
    tx = F.nic_stats(tb, a0)[1]
    assert _works(tb, a0, b1, srv.port, payload)
    assert F.nic_stats(tb, a0)[1] - tx > len(payload)


@netns
def test_t3_and_generic_layouts(testbed):
    t3 = testbed("T3")
    assert [h.name for h in t3.hosts] == ["A", "B", "C"]
    srv = t3.echo_server("A")
    assert _works(t3, "c0", "a0", srv.port) and _works(t3, "c1", "a1", srv.port)
    assert _works(t3, "b1", "a1", srv.port)
    g = testbed(hosts=4, nics=3, base=7)
    assert len(g.hosts) == 4 and len(g.bridges) == 3
    assert g.nic("d2").addr == "10.7.2.4" and g.peer("d2", "A").name == "a2"
    assert [p.name for p in g.peers("a1")] == ["b1", "c1", "d1"]
    srv = g.echo_server("D")
    assert _works(g, "a2", "d2", srv.port)


@netns
def test_a_bed_of_six_hosts_and_more_has_a_host_f(testbed):
    """The fabric namespace was <prefix>-nsF, host F's namespace too: every layout of 6 to 26
    hosts failed to build ('network namespace ...-nsF appeared while test bed ... was being
    built (another process made it)'). Host F and the fabric now have namespaces of their own."""
    tb = testbed(hosts=6, nics=2)
    assert [h.name for h in tb.hosts] == ["A", "B", "C", "D", "E", "F"]
    assert len(set(tb.namespaces)) == 7 and tb.fabric_ns not in [h.ns for h in tb.hosts]
    srv = tb.echo_server("F")
    assert _works(tb, "a0", "f0", srv.port) and _works(tb, "e1", "f1", srv.port)


@netns
def test_parallel_beds_do_not_collide(testbed):
    one, two = testbed("T2"), testbed("T2")
    assert one.prefix != two.prefix
    assert not set(one.namespaces) & set(two.namespaces)
    for tb in (one, two):
        srv = tb.echo_server("b0")
        assert _works(tb, "a0", "b0", srv.port)


@netns
def test_run_and_run_collect(t2):
    rc, out, err = t2.run_collect("A", ["sh", "-c", "echo $RO_TEST_VAR; ip -o -4 addr show"],
                                  env={"RO_TEST_VAR": "hello"})
    assert rc == 0, err
    assert out.splitlines()[0] == "hello"
    assert t2.nic("a0").addr in out and t2.nic("b0").addr not in out
    rc, _, _ = t2.run_collect("B", ["sh", "-c", "exit 3"])
    assert rc == 3
    with pytest.raises(subprocess.TimeoutExpired):
        t2.run_collect("B", ["sleep", "5"], timeout_s=0.2)
    with pytest.raises(KeyError, match="no host"):
        t2.run("Z", ["true"])


# --------------------------------------------------------------------------- leftovers, CLI, signals

CRASHER = """
import os, signal, subprocess
from railover.testbed.netns import TestBed, ns_pids, poll_until
tb = TestBed("T2").up()
p = tb.run("A", ["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
poll_until(lambda: p.pid in ns_pids(tb.host("A").ns), 10, what="sleep inside nsA")
print(tb.prefix, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@netns
def test_down_removes_crashed_run_and_its_processes(netns_mode):
    if netns_mode != "root":
        pytest.skip("crash leftovers only outlive their process in root mode")
    r = subprocess.run([sys.executable, "-c", CRASHER], env=_env(), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == -signal.SIGKILL, r.stderr
    prefix = r.stdout.strip()
    try:
        ns = _existing(prefix)
        assert len(ns) == 3
        info = {i.prefix: i for i in T.list_testbeds()}[prefix]
        assert not info.alive and not info.detached and info.state_file is not None
        sleepers = T.ns_pids(f"{prefix}-nsA")
        assert sleepers, "the sleep inside nsA should still hold the namespace"
        removed = T.cleanup_leftovers(prefix)
        assert sorted(removed) == sorted(ns)
        assert _existing(prefix) == [] and not info.state_file.exists()
        for pid in sleepers:  # killed (a zombie until its new parent reaps it)
            assert not Path(f"/proc/{pid}").exists() or _proc_state(pid) == "Z"
    finally:
        T.cleanup_leftovers(prefix)
    # a namespace without a state file is found by the name sweep
    orphan = "ro" + "zz" + os.urandom(1).hex()
    subprocess.run(["ip", "netns", "add", f"{orphan}-nsQ"], check=True)
    assert orphan in {i.prefix for i in T.list_testbeds()}
    assert T.cleanup_leftovers(orphan) == [f"{orphan}-nsQ"]


@netns
def test_down_keeps_a_bed_of_unknown_owner_with_processes_inside(netns_mode):
    """A bed whose state file this process cannot see (another RAILOVER_TESTBED_STATE) is found
    only by the name sweep; with processes running inside it may be live: a plain sweep keeps
    it, --all (include_live) or its prefix removes it. Without processes it is a leftover."""
    if netns_mode != "root":
        pytest.skip("named namespaces need root mode")
    busy, idle = ("ro" + "zy" + os.urandom(1).hex()), ("ro" + "zx" + os.urandom(1).hex())
    for p in (busy, idle):
        subprocess.run(["ip", "netns", "add", f"{p}-nsQ"], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{busy}-nsQ", "sleep", "600"])
    try:
        poll_until(lambda: T.ns_pids(f"{busy}-nsQ"), 20, what="the sleeper inside the namespace")
        infos = {i.prefix: i for i in T.list_testbeds()}
        assert infos[busy].owner_unknown_in_use and infos[busy].pids_inside
        assert not infos[idle].owner_unknown_in_use
        r = _cli("list")
        assert r.returncode == 0 and "in use, owner unknown" in r.stdout, r.stdout
        # (what a plain `testbed down` decides, asked without sweeping other runs' beds away)
        assert T.sweep_keeps(infos[busy]) and not T.sweep_keeps(infos[busy], include_live=True)
        assert not T.sweep_keeps(infos[idle])
        assert T.cleanup_leftovers(busy) == [f"{busy}-nsQ"]  # its prefix removes it
    finally:
        sleeper.kill()
        sleeper.wait(timeout=20)
        for p in (busy, idle):
            T.cleanup_leftovers(p)


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "railover.cli", "testbed", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@netns
def test_cli_up_detach_list_down(netns_mode):
    if netns_mode != "root":
        pytest.skip("--detach needs root")
    r = _cli("up", "--layout", "T3", "--detach")
    assert r.returncode == 0, r.stderr
    prefix = re.search(r"^prefix: (\S+)$", r.stdout, re.M).group(1)
    assert "mode: root" in r.stdout and f"{prefix}swC1" in r.stdout
    try:
        assert len(_existing(prefix)) == 4
        r = _cli("list")
        assert prefix in r.stdout and "detached" in r.stdout
        tb = TestBed.attach(prefix)
        assert tb.nic("c1").addr == "10.0.1.3" and tb.detached
    finally:
        r = _cli("down", "--prefix", prefix)
    assert r.returncode == 0 and r.stdout.count("removed") == 4, r.stdout + r.stderr
    assert _existing(prefix) == []
    assert _cli("down", "--prefix", prefix).returncode == 1


@netns
@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 0)])
def test_cli_up_tears_down_on_signal(netns_mode, sig, rc):
    p = subprocess.Popen([sys.executable, "-m", "railover.cli", "testbed", "up", "-l", "T2"],
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        prefix = None
        for line in p.stdout:
            m = re.match(r"^prefix: (\S+)$", line)
            if m:
                prefix = m.group(1)
                break
        assert prefix, p.stderr.read()
        if netns_mode == "root":
            assert len(_existing(prefix)) == 3
        p.send_signal(sig)
        assert p.wait(timeout=20) == rc
        assert _existing(prefix) == []
        assert prefix not in {i.prefix for i in T.list_testbeds()}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@netns
def test_cli_up_started_in_the_background_with_sigint_ignored_still_tears_down_on_sigint(netns_mode):
    # A non-interactive shell starts 'railover testbed up &' with SIGINT ignored (inherited
    # across exec); the command tells the user to send SIGINT, so it must act on it.
    p = subprocess.Popen([sys.executable, "-m", "railover.cli", "testbed", "up", "-l", "T2"], env=_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        prefix = None
        for line in p.stdout:
            m = re.match(r"^prefix: (\S+)$", line)
            if m:
                prefix = m.group(1)
                break
        assert prefix, p.stderr.read()
        hint = p.stderr.readline()
        assert f"kill -INT {p.pid}" in hint and f"railover testbed down --prefix {prefix}" in hint, hint
        if netns_mode == "root":
            assert len(_existing(prefix)) == 3
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0, p.stderr.read()
        assert _existing(prefix) == []
        assert prefix not in {i.prefix for i in T.list_testbeds()}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@netns
def test_sigterm_inside_with_block_tears_down(netns_mode):
    tb = TestBed("T2")
    old = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ei:
        with tb:
            assert signal.getsignal(signal.SIGTERM) != old
            os.kill(os.getpid(), signal.SIGTERM)
            poll_until(lambda: False, 5, what="SIGTERM to arrive")  # interrupted by SystemExit
    assert ei.value.code == 128 + signal.SIGTERM
    assert _existing(tb.prefix) == [] and not tb.is_up
    assert signal.getsignal(signal.SIGTERM) == old


# --------------------------------------------------------------------------- link faults

@netns
def test_host_down(t2_echo):
    tb, a0, b0, port = t2_echo
    srv1 = tb.echo_server("b1")
    f = F.HostDown(a0)
    with f:
        st = F.link_state(tb, a0)
        assert not st.admin_up and not st.carrier
        with pytest.raises(OSError) as ei:
            tb.connect(a0, b0, port, timeout_s=0.5)
        assert ei.value.errno == errno.ENETUNREACH
        assert _works(tb, "a1", "b1", srv1.port), "rail 1 must be unaffected"
        with pytest.raises(F.FaultError, match="already applied"):
            f.apply()
    assert F.link_state(tb, a0).admin_up
    assert _works(tb, a0, b0, port)
    assert f.applied_us < f.undone_us <= now_us()
    with pytest.raises(NotImplementedError):
        f.counter()


@netns
def test_port_down_gives_no_carrier_while_admin_up(t2_echo):
    tb, a0, b0, port = t2_echo
    with F.PortDown(a0):
        poll_until(lambda: not F.link_state(tb, a0).carrier, 2, what="carrier loss on a0")
        st = F.link_state(tb, a0)
        assert st.admin_up and st.addrs == [a0.addr]
        assert not F.link_state(tb, a0, side="port").admin_up
        assert not tb.tcp_echo(a0, b0, port, timeout_s=0.3)
    poll_until(lambda: F.link_state(tb, a0).carrier, 3, what="carrier back on a0")
    assert _works(tb, a0, b0, port)


# --------------------------------------------------------------------------- nft faults

@netns
def test_silent_blackhole_keeps_carrier(t2_echo):
    tb, a0, b0, port = t2_echo
    srv1 = tb.echo_server("b1")
    with F.Silent(a0) as f:
        assert ("bridge", f.table) in F.nft_tables(tb.fabric_ns)
        st = F.link_state(tb, a0)
        assert st.admin_up and st.carrier
        assert not tb.tcp_echo(a0, b0, port, timeout_s=0.3)
        assert f.counter() >= 1
        assert _works(tb, "a1", "b1", srv1.port), "rail 1 must be unaffected"
    assert ("bridge", f.table) not in F.nft_tables(tb.fabric_ns)
    assert f.counter() >= 1  # last value kept after undo
    assert _works(tb, a0, b0, port)


@netns
@pytest.mark.parametrize("at", ["host", "switch"])
def test_oneway_drops_one_direction_only(t2_echo, at):
    tb, a0, b0, port = t2_echo
    fwd, back = UdpPair(tb, a0, b0), UdpPair(tb, b0, a0)
    try:
        with F.OneWay(a0, b0, at=at) as f:
            refused = fwd.send(50)
            back.send(50)
            poll_until(lambda: back.drain() == 50, 2, what="b0 -> a0 datagrams")
            poll_until(lambda: f.counter() == 50, 2, what="50 drops counted")
            assert fwd.drain() == 0
            assert refused == (50 if at == "host" else 0)  # a local output drop is visible as EPERM
            assert not tb.tcp_echo(a0, b0, port, timeout_s=0.3)
        fwd.send(50)
        poll_until(lambda: fwd.drain() == 50, 2, what="a0 -> b0 datagrams after undo")
    finally:
        fwd.close()
        back.close()
    assert _works(tb, a0, b0, port)


@netns
@pytest.mark.parametrize("at", ["host", "switch"])
def test_loss_percentage_and_counter(t2_echo, at):
    tb, a0, b0, port = t2_echo
    out, inb, n = UdpPair(tb, a0, b0), UdpPair(tb, b0, a0), 400
    try:
        with F.Loss(a0, 30, both_directions=True, at=at) as f:
            refused = out.send(n)
            # every datagram is either delivered or counted as dropped, nothing else
            poll_until(lambda: out.drain() + f.counter() == n, 3, what="a0 -> b0 accounting")
            c_out = f.counter()
            assert 0.15 * n < c_out < 0.45 * n
            assert refused == (c_out if at == "host" else 0)
            inb.send(n)
            poll_until(lambda: inb.drain() + f.counter() - c_out == n, 3, what="b0 -> a0 accounting")
            c_in = f.counter() - c_out
            assert 0.15 * n < c_in < 0.45 * n
        before = out.received
        out.send(100)
        poll_until(lambda: out.drain() - before == 100, 2, what="no loss after undo")
    finally:
        out.close()
        inb.close()
    assert _works(tb, a0, b0, port)


@netns
def test_bigdrop_drops_only_large_packets(t2_echo):
    tb, a0, b0, port = t2_echo
    big = b"z" * 30000
    with F.BigDrop(a0, 1200) as f:
        assert _works(tb, a0, b0, port, b"small")
        assert not tb.tcp_echo(a0, b0, port, big, timeout_s=0.5)
        assert f.counter() >= 1
    assert _works(tb, a0, b0, port, big)
    # both ends: the same rule on the peer's input too
    with F.BigDrop(a0, 1200, peers=b0) as f:
        assert ("inet", f.table) in F.nft_tables(a0.ns) and ("inet", f.table) in F.nft_tables(b0.ns)
        s = tb.connect(a0, b0, port)
        s.sendall(big)  # a0 -> b0 big segments now die at b0's input
        poll_until(lambda: any(c > 0 and ns == b0.ns for ns, _, c in f.rule_counts()), 3,
                   what="drops at b0")
        s.close()
    assert ("inet", f.table) not in F.nft_tables(b0.ns)


@netns
def test_syndrop_blocks_new_connections_only(t2_echo):
    tb, a0, b0, port = t2_echo
    est = tb.connect(a0, b0, port)
    srv_a = tb.echo_server(a0)
    try:
        with F.SynDrop(a0) as f:
            with pytest.raises(OSError):  # socket.timeout is an OSError
                tb.connect(a0, b0, port, timeout_s=0.5)
            assert T.echo_roundtrip(est, b"still alive", 2), "established flow must keep working"
            assert not tb.tcp_echo(b0, a0, srv_a.port, timeout_s=0.5), "incoming SYN must drop too"
            assert f.counter() >= 2
    finally:
        est.close()
    assert _works(tb, a0, b0, port)
    assert _works(tb, b0, a0, srv_a.port)


# --------------------------------------------------------------------------- rate

@netns
@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed")
def test_rate_limits_throughput(t2):
    tb = t2
    a0, b0 = tb.nic("a0"), tb.nic("b0")
    server = tb.run("B", ["iperf3", "-s", "-1", "-B", b0.addr, "-p", "5201"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll_until(lambda: ":5201" in tb.run_collect("B", ["ss", "-Hltn"])[1], 5,
               what="iperf3 server listening")
    with F.Rate(a0, "50mbit") as f:
        tx0 = F.nic_stats(tb, a0)[1]
        rc, out, err = tb.run_collect("A", ["iperf3", "-c", b0.addr, "-B", a0.addr, "-p", "5201",
                                            "-t", "2", "-J"], timeout_s=30)
        assert rc == 0, out + err
        bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        sent = F.nic_stats(tb, a0)[1] - tx0
        assert 20e6 < bps < 65e6, f"shaped to 50 Mbit/s but measured {bps / 1e6:.1f} Mbit/s"
        assert 0.4 * 50e6 * 2 / 8 < sent < 2.0 * 50e6 * 2 / 8, f"a0 sent {sent} bytes in ~2 s"
        f.change("20mbit")
        with T.netlink(a0.ns) as ipr:
            q = [q for q in ipr.get_qdiscs(index=ipr.link_lookup(ifname=a0.ifname)[0])
                 if q.get("TCA_KIND") == "tbf"]
            assert q[0].get("TCA_OPTIONS").get("TCA_TBF_PARMS")["rate"] == 20_000_000 // 8
        assert f.counter() >= 0
    server.wait(10)
    with T.netlink(a0.ns) as ipr:
        kinds = [q.get("TCA_KIND") for q in ipr.get_qdiscs(index=ipr.link_lookup(ifname=a0.ifname)[0])]
    assert "tbf" not in kinds
    with pytest.raises(ValueError):
        F.Rate(a0, "fast")


# --------------------------------------------------------------------------- addresses

@netns
def test_addr_del_and_readd(t2_echo):
    tb, a0, b0, port = t2_echo
    srv_a = tb.echo_server("A")
    with F.AddrDel(a0):
        assert F.link_state(tb, a0).addrs == []
        with pytest.raises(OSError) as ei:
            tb.connect(a0, b0, port)
        assert ei.value.errno == errno.EADDRNOTAVAIL
        assert not tb.tcp_echo(b0, a0, srv_a.port, timeout_s=0.3)
    assert F.link_state(tb, a0).addrs == [a0.addr]
    assert _works(tb, a0, b0, port)
    assert _works(tb, b0, a0, srv_a.port)


@netns
@pytest.mark.parametrize("layout,new", [("T2", "10.0.0.51"), ("T2-flat", "10.0.0.51")])
def test_addr_change(testbed, layout, new):
    tb = testbed(layout)
    a0, b0 = tb.nic("a0"), tb.nic("b0")
    srv = tb.echo_server(b0)
    with F.AddrChange(a0, new) as f:
        assert F.link_state(tb, a0).addrs == [new]
        with pytest.raises(OSError):
            tb.connect(a0, b0, srv.port)  # old address is gone
        s = tb.socket("A")
        s.settimeout(2)
        s.bind((new, 0))
        s.connect((b0.addr, srv.port))
        assert T.echo_roundtrip(s, b"from the new address", 2)
        s.close()
        if a0.table is not None:
            rc, out, _ = tb.run_collect("A", ["ip", "rule"])
            assert f"from {new} lookup {a0.table}" in out and f"from {a0.addr} " not in out
    assert F.link_state(tb, a0).addrs == [a0.addr]
    assert f.undone_us > f.applied_us
    assert _works(tb, a0, b0, srv.port)
    if a0.table is not None:
        rc, out, _ = tb.run_collect("A", ["ip", "rule"])
        assert f"from {new} " not in out and f"from {a0.addr} lookup {a0.table}" in out


# --------------------------------------------------------------------------- processes, coexistence

@netns
def test_stop_and_kill(t2):
    p = t2.run("A", ["sleep", "60"])
    with F.Stop(p):
        poll_until(lambda: _proc_state(p.pid) == "T", 2, what="process stopped")
    poll_until(lambda: _proc_state(p.pid) != "T", 2, what="process continued")
    k = F.Kill(p).apply()
    assert p.wait(5) == -signal.SIGKILL
    k.undo()  # cannot be undone; only records the time
    assert k.undone_us >= k.applied_us
    with pytest.raises(F.FaultError, match="does not exist"):
        F.Kill(p.pid).apply()


@netns
def test_faults_coexist_and_undo_only_their_own(t2_echo):
    tb, a0, b0, port = t2_echo
    a1, b1 = tb.nic("a1"), tb.nic("b1")
    srv1 = tb.echo_server(b1)
    silent = F.Silent(a0).apply()
    loss = F.Loss(a1, 100).apply()
    syn = F.SynDrop(a1).apply()
    try:
        assert not tb.tcp_echo(a0, b0, port, timeout_s=0.3)
        assert not tb.tcp_echo(a1, b1, srv1.port, timeout_s=0.3)
        loss.undo()
        assert ("inet", syn.table) in F.nft_tables(a1.ns)
        assert ("inet", loss.table) not in F.nft_tables(a1.ns)
        assert not tb.tcp_echo(a1, b1, srv1.port, timeout_s=0.3), "SYNDROP must still be active"
        syn.undo()
        assert _works(tb, a1, b1, srv1.port)
        assert not tb.tcp_echo(a0, b0, port, timeout_s=0.3), "SILENT must still be active"
    finally:
        for f in (silent, loss, syn):
            f.undo()
    assert _works(tb, a0, b0, port)
    assert [t for t in F.nft_tables(a1.ns) if t[1].startswith("ro_")] == []


@netns
def test_undo_after_teardown_is_quiet(netns_mode):
    tb = TestBed("T2").up()
    fs = [F.Silent(tb.nic("a0")).apply(), F.HostDown(tb.nic("a1")).apply(),
          F.Rate(tb.nic("b0"), "10mbit").apply(), F.AddrDel(tb.nic("b1")).apply()]
    tb.down()
    for f in fs:
        f.undo()  # the namespaces took the fault with them
        assert not f.active and f.undone_us is not None
    with pytest.raises(F.FaultError, match="Cannot open network namespace"):
        F.Silent(tb.nic("a0")).apply()


@netns
def test_second_bed_with_a_live_prefix_is_refused_and_leaves_the_first_intact(netns_mode):
    with T.TestBed("1x2") as first:
        state = first.state_file
        assert state is not None and state.exists()
        with pytest.raises(T.TestBedError, match="already exists"):
            T.TestBed("1x2", prefix=first.prefix).up()
        assert state.exists(), "the refused bed must not touch the live bed's state file"
        info = {i.prefix: i for i in T.list_testbeds()}[first.prefix]
        assert info.alive and info.state_file == state
        assert _existing(first.prefix), "the live bed's namespaces are still there"
