"""The verbs transport's building blocks (native/transport/verbs) on real Soft-RoCE, through
``railover-verbs-xfer``: one RC QP per path, receiver-advertised buffers, RDMA WRITE chunks and a
WRITE_WITH_IMM per message, control messages as SENDs, error signals and fence.

Asserted here, on the RDMA test bed (two QEMU guests, rxe on every rail NIC):
* every byte of N messages of deterministic random sizes (0 bytes, exactly one chunk, one chunk
  + 1, 1 byte, the maximum, random) arrives on each rail, and nothing past a message's end is
  written (canary);
* a cable pull at the receiver mid-transfer breaks the sender's path with
  IBV_WC_RETRY_EXC_ERR within the RC give-up time of its timeout/retry_cnt (generous bound for
  TCG), and the receiver's path with the port error of its own HCA port within milliseconds;
* a cable pull at the sender breaks the sender's path through IBV_EVENT_PORT_ERR (rxe gives
  the error completion only ~15 s later, so the port event is the signal);
* after the receiver fenced its path (QP to ERR, flushes drained), the sender's retransmissions
  reach the receiver's NIC once the cable is back, and none of them lands in the receive
  buffers (compared byte by byte against a snapshot taken at the fence); without the fence
  (negative control) the same late writes do land.

The tests share the session's pair of guests (conftest's ``rdma_bed``, reset before each test); tests use distinct TCP ports.
"""
from __future__ import annotations

import os
import re

import pytest

from railover import _paths
from railover.testbed.netns import poll_until
from railover.testbed.rdma import bed as rbed
from railover.testbed.rdma import faults as rf

from rdma_helpers import crash_retry, events, wait_event, wait_listening

pytestmark = pytest.mark.rdma


@pytest.fixture(scope="module", autouse=True)
def _xfer_built(rdma_ok):
    """railover-verbs-xfer is built with railover-verbs-probe (both need libibverbs-dev); an
    older build tree may lack it: skip, or fail under RAILOVER_REQUIRE_RDMA=1."""
    try:
        _paths._find(rbed.VERBS_XFER_FILE)
    except FileNotFoundError as e:
        if os.environ.get("RAILOVER_REQUIRE_RDMA") == "1":
            pytest.fail(f"RAILOVER_REQUIRE_RDMA=1 but {e} (rebuild with libibverbs-dev installed)", pytrace=False)
        pytest.skip(f"{e} (rebuild with libibverbs-dev installed)")


XFER = "railover-verbs-xfer"
#: RC local ACK timeout exponent: 4.096 µs * 2^14 = 67 ms per try; with retry_cnt 6 the QP
#: gives up about 0.47 s after the last acknowledged packet (measured 0.46-0.62 s on rxe).
RC_TIMEOUT = 14
CHUNK = 64 * 1024
MAX_SIZE = 256 * 1024
MASK = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def msg_size(seed: int, seq: int, chunk: int = CHUNK, max_size: int = MAX_SIZE) -> int:
    """The size railover-verbs-xfer gives message ``seq`` (same rule as its msgSize())."""
    r = seq % 16
    if r == 0:
        return 0
    if r == 1:
        return min(chunk, max_size)
    if r == 2:
        return min(chunk + 1, max_size)
    if r == 3:
        return min(1, max_size)
    if r == 4:
        return max_size
    return _splitmix((seed * 1000003 + seq) & MASK) % (max_size + 1)


def _start(bed, rail, port, *, count, seed=7, retry=6, watch_s=0, depth=8, extra_recv=(), extra_send=(),
           chunk=CHUNK):
    """Receiver in B, sender in A on rail ``rail``; returns both once they are connected."""
    a, b = bed.hosts[0].nics[rail], bed.hosts[1].nics[rail]
    recv = bed.spawn("B", [XFER, "recv", "--netdev", b.ifname, "-p", str(port), "--watch-s", str(watch_s),
                           "--deadline-s", "900", *extra_recv])
    poll_until(lambda: events(recv, "listening") or recv.poll() is not None, 240, 0.2, "xfer receiver to listen")
    assert recv.returncode is None, recv.stdout() + recv.stderr()
    send = bed.spawn("A", [XFER, "send", "--netdev", a.ifname, "-a", bed.hosts[1].mgmt_addr, "-p", str(port),
                           "--count", str(count), "--seed", str(seed), "--max-size", str(MAX_SIZE), "--chunk",
                           str(chunk), "--depth", str(depth), "--timeout", str(RC_TIMEOUT), "--retry", str(retry),
                           "--deadline-s", "900", *extra_send])
    poll_until(lambda: (events(send, "connected") and events(recv, "connected")) or send.poll() is not None
               or recv.poll() is not None, 300, 0.2, "xfer sender and receiver to connect")
    assert send.returncode is None and recv.returncode is None, (send.stdout() + send.stderr() + recv.stdout()
                                                                 + recv.stderr())
    c = events(send, "connected")[0]
    assert c["dev"] == a.rdma_dev and c["gid_index"] == a.gid_index and c["timeout"] == RC_TIMEOUT, c
    assert events(recv, "connected")[0]["dev"] == b.rdma_dev
    return send, recv


def _finish(*procs):
    for p in procs:
        if p.returncode is None:
            p.kill()
    for p in procs:
        p.wait(120)


def _wait_streaming(send, acked=8):
    poll_until(lambda: any(e.get("acked", 0) >= acked for e in events(send, "progress")) or send.poll() is not None,
               300, 0.2, f"the sender to have {acked} messages acknowledged")
    assert send.returncode is None, send.stdout() + send.stderr()


@pytest.mark.parametrize("rail", [0, 1])
def test_verbs_xfer_every_byte_arrives_on_each_rail(rdma_bed, rail):
    bed = rdma_bed
    count, seed = 120, 11 + rail

    def body():
        send, recv = _start(bed, rail, 18900 + rail, count=count, seed=seed)
        try:
            assert send.wait(900) == 0, send.stdout() + send.stderr()
            assert recv.wait(300) == 0, recv.stdout() + recv.stderr()
        finally:
            _finish(send, recv)
        sizes = [msg_size(seed, i) for i in range(count)]
        assert 0 in sizes and max(sizes) == MAX_SIZE and CHUNK + 1 in sizes and CHUNK in sizes
        rd, sd = events(recv, "done")[0], events(send, "done")[0]
        assert rd["messages"] == count and rd["bytes"] == sum(sizes), rd
        assert rd["wrong_bytes"] == 0 and rd["bad_messages"] == 0, rd
        assert sd["messages"] == count and sd["bytes"] == sum(sizes) and sd["wrong_bytes_reported"] == 0, sd
        # every non-empty message is ceil(size / chunk) writes, an empty one a single 0-byte write
        assert sd["chunks"] == sum(max(1, -(-s // CHUNK)) for s in sizes), sd
        assert not events(recv, "broken") and not events(send, "broken")
        print(f"verbs xfer rail {rail}: {count} messages, {sum(sizes)} bytes, {sd['mb_per_s']} MB/s at the sender, "
              f"{rd['mb_per_s']} MB/s at the receiver (TCG)")

    crash_retry(bed, body)


def test_verbs_xfer_throughput_beside_ib_write_bw(rdma_bed):
    """A measurement, side by side on rail 0: railover-verbs-xfer --bench (256 KiB messages, one
    WRITE_WITH_IMM each, 8 outstanding, receiver ACK per message) and ib_write_bw with the same
    message size on the same rxe devices. Asserts only that both ran and every size was right;
    prints both rates and their ratio (TCG: the numbers say little about real hardware)."""
    bed = rdma_bed
    a, b = bed.hosts[0].nics[0], bed.hosts[1].nics[0]

    def body():
        port = 18940
        srv = bed.spawn("B", ["ib_write_bw", "-d", b.rdma_dev, "-x", "1", "-p", str(port), "-s", str(MAX_SIZE),
                              "-D", "5", "-F", "--report_gbits"])
        wait_listening(bed, "B", port, srv)
        rc, out, err = bed.run("A", ["ib_write_bw", "-d", a.rdma_dev, "-x", "1", "-p", str(port), "-s", str(MAX_SIZE),
                                     "-D", "5", "-F", "--report_gbits", b.addr], timeout_s=300)
        assert rc == 0, out + err
        srv.wait(120)
        m = re.search(rf"^\s*{MAX_SIZE}\s+\d+\s+([\d.]+)\s+([\d.]+)", out, re.M)
        assert m, out
        perftest_mbs = float(m.group(2)) * 1000 / 8
        count = 80
        send, recv = _start(bed, 0, 18941, count=count, extra_send=["--bench"], chunk=MAX_SIZE)
        try:
            assert send.wait(900) == 0, send.stdout() + send.stderr()
            assert recv.wait(300) == 0, recv.stdout() + recv.stderr()
        finally:
            _finish(send, recv)
        rd, sd = events(recv, "done")[0], events(send, "done")[0]
        assert rd["bench"] and rd["messages"] == count and rd["bytes"] == count * MAX_SIZE and rd["bad_messages"] == 0
        assert sd["chunks"] == count
        print(f"rail 0, {MAX_SIZE} B messages (TCG): railover-verbs-xfer {sd['mb_per_s']:.2f} MB/s, ib_write_bw "
              f"{perftest_mbs:.2f} MB/s, ratio {sd['mb_per_s'] / perftest_mbs if perftest_mbs else float('nan'):.2f}")

    crash_retry(bed, body)


def test_verbs_cable_pull_at_receiver_breaks_both_ends_and_fences(rdma_bed):
    bed = rdma_bed
    retry = 6
    per_try_us = 4.096 * 2 ** RC_TIMEOUT
    nominal_us = per_try_us * (retry + 1)

    def body():
        send, recv = _start(bed, 0, 18910, count=10 ** 6, retry=retry)
        try:
            _wait_streaming(send)
            with rf.CablePull(bed, "b0") as f:
                rb = wait_event(recv, "broken", 180, "the receiver's path to break", send)
                # the receiver's own port went down: its HCA port's PORT_ERR, stamped on B's clock
                assert rb["source"] == "port" and "port error" in rb["status"], rb
                detect_us = rb["seen_us"] - f.applied_us
                assert -f.stamp_error_us <= detect_us < 5_000_000, (rb, f.applied_us, f.stamp_error_us)
                # The sender sees no port event: its QP gives up after timeout * (retry_cnt + 1),
                # within the bound below. Or never: rxe can leave a QP whose peer's port died
                # stalled with no completion at all (seen in a few CI runs; the reason
                # railover's failover is driven by port events and its progress watch, not by
                # completions). Then only the receiver's side is checked.
                try:
                    sb = wait_event(send, "broken", 60, "the sender's path to break", recv)
                except TimeoutError:
                    sb = None
                    assert send.poll() is None, "the sender ended without reporting a break: " + send.stdout() + send.stderr()
                    print("cable pull at the receiver: rxe left the sender's QP stalled with no completion for 60 s")
                if sb is not None:
                    assert sb["source"] == "completion", sb
                    assert sb["code"] == 12 and sb["status"] == "transport retry counter exceeded", sb
                    assert per_try_us <= sb["since_last_ok_us"] < max(20 * nominal_us, 20_000_000), (sb, nominal_us)
                # 120 s per fence: a fence took 0.4-129 ms in 223 fences with load 15-20 on 2
                # cores (docs/BENCHMARKS.md, "The fence under host load")
                for p, who in ((recv, "receiver"), (send, "sender")) if sb is not None else ((recv, "receiver"),):
                    fe = wait_event(p, "fenced", 120, f"the {who} to fence")
                    assert fe["err"] == "" and fe["drained"] and fe["qp_state"] == 6, (who, fe)  # 6 = IBV_QPS_ERR
                    assert p.wait(120) == 3, p.stdout() + p.stderr()
                if sb is None:
                    return
                print(f"cable pull at the receiver: receiver PORT_ERR {detect_us / 1000:.1f} ms after the pull "
                      f"(±{f.stamp_error_us / 1000:.1f}); sender RETRY_EXC_ERR {sb['since_last_ok_us'] / 1000:.0f} ms "
                      f"after its last good completion (nominal {nominal_us / 1000:.0f} ms); fences "
                      f"{events(recv, 'fenced')[0]['fence_us']} / {events(send, 'fenced')[0]['fence_us']} µs")
        finally:
            _finish(send, recv)

    crash_retry(bed, body)


def test_verbs_cable_pull_at_sender_breaks_by_port_error(rdma_bed):
    bed = rdma_bed

    def body():
        send, recv = _start(bed, 1, 18920, count=10 ** 6, retry=6)
        try:
            _wait_streaming(send)
            with rf.CablePull(bed, "a1") as f:
                sb = wait_event(send, "broken", 180, "the sender's path to break", recv)
                assert sb["source"] == "port" and "port error" in sb["status"], sb
                detect_us = sb["seen_us"] - f.applied_us
                # rxe's PORT_ERR follows carrier loss in ms; its error CQE only after ~15 s
                assert -f.stamp_error_us <= detect_us < 5_000_000, (sb, f.applied_us, f.stamp_error_us)
                fe = wait_event(send, "fenced", 120, "the sender to fence", recv)
                assert fe["err"] == "" and fe["drained"] and fe["qp_state"] == 6, fe
                assert send.wait(120) == 3
                print(f"cable pull at the sender: PORT_ERR broke the path {detect_us / 1000:.1f} ms after the pull "
                      f"(±{f.stamp_error_us / 1000:.1f}); fence {fe['fence_us']} µs, "
                      f"{fe['flushed_sends']} sends / {fe['flushed_recvs']} receives flushed")
        finally:
            _finish(send, recv)

    crash_retry(bed, body)


def _counter(bed, host, dev, name):
    rc, out, err = bed.run(host, ["cat", f"/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}"], timeout_s=60)
    assert rc == 0, err
    return int(out)


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "negative-control-unfenced"])
def test_verbs_fence_keeps_late_writes_out_of_the_receive_buffers(rdma_bed, fence):
    """With the fence, no byte of the receive buffers changes after it although the sender's
    retransmissions reach the receiver's NIC; without it (negative control) they land."""
    bed = rdma_bed
    a = bed.nic("a0")

    def body():
        # A pull that comes just as every advertised buffer has arrived (the receiver had not
        # advertised the next ones yet) leaves nothing in flight: no late write could land, so
        # neither the fence nor the negative control would show anything ("pending": 0, seen
        # once on an idle host). Such a try is run again, up to 3 tries in all.
        for attempt in range(3):
            # retry_cnt 7: rxe retransmits forever, so the sender's writes are still coming when
            # the cable is back, and only the receiver's fence can keep them out
            send, recv = _start(bed, 0, 18930 + int(fence) + 2 * attempt, count=10 ** 6, retry=7, watch_s=600,
                                extra_recv=[] if fence else ["--no-fence"])
            try:
                _wait_streaming(send)
                with rf.CablePull(bed, "b0") as f:
                    ev = "fenced" if fence else "not_fenced"
                    # 180 s: break detection (PORT_ERR) + fence; pull to "fenced" took at most
                    # 313 ms, a fence 0.4-129 ms, in 223 fences with load 15-20 on 2 cores
                    # (docs/BENCHMARKS.md, "The fence under host load"). wait_event turns a guest
                    # crash into GuestCrash (retried) and shows the guest's view of the tool on a
                    # timeout
                    fe = wait_event(recv, ev, 180, f"the receiver to report {ev}", send)
                    pull_to_fe_ms, stamp_err_ms = (fe["t_us"] - f.applied_us) / 1000, f.stamp_error_us / 1000
                    if fence:
                        assert fe["err"] == "" and fe["drained"] and fe["qp_state"] == 6, fe
                    if fe["pending"] == 0 and attempt < 2:
                        print(f"try {attempt + 1}: the pull came with no advertised buffer pending ({fe}); again")
                        continue
                    assert fe["pending"] > 0, fe  # buffers the sender was still writing into
                    sent0 = _counter(bed, "A", a.rdma_dev, "sent_pkts")
                # cable back: the sender's retransmissions now reach B's HCA
                poll_until(lambda: _counter(bed, "A", a.rdma_dev, "sent_pkts") >= sent0 + 20, 300, 0.5,
                           "the sender to retransmit after the cable is back")
                poll_until(lambda: any(e["netdev_rx_since_fence"] >= 20 for e in events(recv, "fence_watch")), 300,
                           0.5, "the receiver's NIC to receive the sender's packets after the break")
                if not fence:
                    poll_until(lambda: any(e["changed_bytes"] > 0 for e in events(recv, "fence_watch")), 300, 0.5,
                               "late writes to land in the unfenced receiver's buffers")
                recv.kill()
                assert recv.wait(120) == 3
                chk = events(recv, "fence_check")
                assert chk, recv.stdout() + recv.stderr()
                if fence:
                    assert chk[0]["changed_bytes"] == 0, chk
                else:
                    assert chk[0]["changed_bytes"] > 0, chk
                print(f"{'fenced' if fence else 'unfenced (negative control)'}: {chk[0]['netdev_rx_since_fence']} "
                      f"packets reached the receiver's NIC after the break, {chk[0]['rcvd_pkts_since_fence']} were "
                      f"counted by its HCA, {chk[0]['changed_bytes']} bytes of {fe['pending']} pending buffers "
                      f"changed; {ev} {pull_to_fe_ms:.1f} ms after the pull (±{stamp_err_ms:.1f})"
                      + (f", fence {fe['fence_us']} µs" if fence else ""))
                return
            finally:
                _finish(send, recv)

    crash_retry(bed, body)
