#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets to native/fuzz/corpus/<target>/ (deterministic:
the same files every run). Run from anywhere: python3 native/fuzz/make_corpus.py

Seeds are small valid inputs (and a few near-misses) in each target's input format, so the
fuzzer starts from the interesting side of every check instead of discovering the magic
number first. The fuzz_recv seeds are written in the byte order of LLVM's
FuzzedDataProvider (integers and booleans are taken from the end of the input, byte strings
from the front), which is how that target reads its input.
"""
import base64
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
MAGIC = 0x52564C52
VERSION = 2  # wire::kVersion (native/transport/tcp/wire.h)
DATA, ACK, RESUME, RESUME_ACK, PROBE, PROBE_ACK, NACK, CLOSE = 2, 3, 4, 5, 6, 7, 8, 9


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def frame(t, flags=0, stream=0, ln=0, seq=0, off=0, total=0, tag=0):
    # offset and total are 48-bit little-endian fields, then the 32-bit DATA tag
    return (struct.pack("<BBHIQ", t, flags, stream, ln, seq) + off.to_bytes(6, "little")
            + total.to_bytes(6, "little") + struct.pack("<i", tag))


def hello(stream=0, n=1, secret=0x1122334455667788, path=0, rail=0, port=4242, gen=0, version=VERSION, conn=0x5A5A):
    return struct.pack("<IHBBQBBHIQ", MAGIC, version, stream, n, secret, path, rail, port, gen, conn)


def handle(addrs, primary=0, secret=0xDEADBEEF, version=VERSION):
    b = struct.pack("<IHBBQ", MAGIC, version, len(addrs), primary, secret)
    for rail, fam, port, ip in addrs:
        b += struct.pack("<BBH", rail, fam, port) + ip.ljust(16, b"\0")
    return b.ljust(128, b"\0")


class Fdp:
    """Builds an input that FuzzedDataProvider reads back as the given sequence of values."""

    def __init__(self):
        self.front, self.back = b"", []

    def int(self, lo, hi, v):
        rng, n = hi - lo, 0
        while n < 8 and (rng >> (8 * n)) > 0:
            n += 1
        x = v - lo
        self.back += [(x >> (8 * (n - 1 - i))) & 0xFF for i in range(n)]  # most significant first

    def bool(self, v):
        self.int(0, 255, 1 if v else 0)

    def bytes(self, b):
        self.int(0, 4096, len(b))
        self.front += b

    def build(self):
        return self.front + bytes(reversed(self.back))


def recv_raw(name, nrecv, caps, paths, max_read=0, short_every=1, post=None):
    """paths: list of (index, generation, offer_round, [(eof, peer_gone, bytes), ...])."""
    f = Fdp()
    f.bool(False)
    f.int(1, 8, nrecv)
    f.int(1, nrecv, post or nrecv)
    f.int(0, 64, max_read)
    f.int(1, 8, short_every)
    for c in caps:
        f.int(0, 2048, c)
    f.int(1, 2, len(paths))
    for i, (index, gen, offer, streams) in enumerate(paths):
        f.int(0, 6, index)
        f.int(1, 3, len(streams))
        f.int(0, 2, gen)
        if i:
            f.int(0, 8, offer)
        for eof, gone, b in streams:
            f.bool(eof)
            f.bool(gone)
            f.bytes(b)
    write("recv", name, f.build())


def send_seed(name, streams, sizes, conns, max_write=0, post=None):
    """conns: (eof, reply bytes) for each connection the sender opens, in order."""
    f = Fdp()
    f.int(1, 3, streams)
    f.int(0, 96, max_write)
    f.int(1, 64, 32)  # reply bytes arriving per round: one frame
    f.int(1, 8, len(sizes))
    f.int(1, len(sizes), post or len(sizes))
    for s in sizes:
        f.int(0, 4096, s)
    for eof, reply in conns:
        f.bool(eof)
        f.int(0, 512, len(reply))
        f.front += reply
    write("send", name, f.build())


def data(seq, off, payload, total):
    return frame(DATA, ln=len(payload), seq=seq, off=off, total=total) + payload


EP_MAGIC = 0x524F5651  # verbs QpEndpoint "ROVQ", version 1 (native/transport/verbs/verbs_qp.cc)
CTL_ADVERT, CTL_CONTROL, CTL_GROUP, CTL_DONE, CTL_PART = 1, 2, 3, 4, 5  # verbs::ctlwire kinds (verbs_path.h)


def endpoint(qpn=0x11, psn=0x123456, gid=bytes(10) + b"\xff\xff\x0a\x00\x00\x01", lid=0, mtu=3, roce=1, version=1,
             lanes=1):
    # big-endian: magic, version, lid, qpn, psn, gid[16], mtu, roce, QPs of the path - 1, 5 reserved bytes
    return struct.pack(">IHHII", EP_MAGIC, version, lid, qpn, psn) + gid + bytes([mtu, roce, lanes - 1]) + bytes(5)


def ctl_advert(seq, tag, addr, size, rkey):
    return struct.pack(">BBHIQQQQQ", CTL_ADVERT, 0, 0, rkey, seq, addr, size, tag, 0)


def ctl_control(ctype, seq, arg=0):
    return struct.pack(">BBHIQQQQQ", CTL_CONTROL, ctype, 0, 0, seq, arg, 0, 0, 0)


def ctl_part(seq):
    return struct.pack(">BBHIQQQQQ", CTL_PART, 0, 0, 0, seq, 0, 0, 0, 0)


def ctl_group(seq, count, index, tag, addr, size, rkey):
    return struct.pack(">BBBBIQQQQQ", CTL_GROUP, 0, count, index, rkey, seq, addr, size, tag, 0)


def ctl_done(seq, index, nbytes, tag, written=True):
    return struct.pack(">BBBBIQQQQQ", CTL_DONE, 0 if written else 1, 0, index, 0, seq, 0, nbytes, tag, 0)


def main():
    v4 = lambda *o: bytes(o)
    # handle
    write("handle", "one_v4", handle([(0, 4, 4242, v4(10, 0, 0, 1))]))
    write("handle", "two_v4", handle([(0, 4, 4242, v4(10, 0, 0, 1)), (1, 4, 4343, v4(10, 0, 1, 1))], primary=1))
    write("handle", "five_mixed", handle([(i, 6 if i % 2 else 4, 5000 + i, bytes(range(i, i + 16))) for i in range(5)]))
    write("handle", "bad_version", handle([(0, 4, 4242, v4(10, 0, 0, 1))], version=VERSION + 1))
    write("handle", "truncated", handle([(0, 4, 4242, v4(10, 0, 0, 1)), (1, 4, 4343, v4(10, 0, 1, 1))])[:40])
    # hello
    write("hello", "stream0_of_2", hello(0, 2))
    write("hello", "stream3_of_4_gen7", hello(3, 4, path=1, rail=1, gen=7))
    write("hello", "bad_stream", hello(2, 2))
    # frame
    write("frame", "data", frame(DATA, ln=4096, seq=3, off=8192, total=65536))
    write("frame", "data_last", frame(DATA, ln=100, seq=1, off=900, total=1000))
    for t, n in ((ACK, "ack"), (RESUME, "resume"), (RESUME_ACK, "resume_ack"), (NACK, "nack"), (CLOSE, "close")):
        write("frame", n, frame(t, seq=5))
    write("frame", "probe_big", frame(PROBE, flags=1, ln=4000, seq=9, off=123456))
    write("frame", "probe_ack", frame(PROBE_ACK, seq=9))
    # probe datagrams
    write("probe", "probe", frame(PROBE, seq=1, off=77))
    write("probe", "probe_big", frame(PROBE, flags=1, ln=4000, seq=2) + bytes(4000))
    write("probe", "probe_ack", frame(PROBE_ACK, flags=1, seq=2))
    notice4 = bytes([4, 0, 0, 0, 10, 0, 0, 1]).ljust(32, b"\0")
    notice6 = (bytes([6, 0, 0, 0]) + bytes(range(0xF0, 0x100))).ljust(32, b"\0")
    write("probe", "notice_v4", frame(PROBE, flags=2, ln=32) + notice4)
    write("probe", "notice_v6", frame(PROBE, flags=2, ln=32) + notice6)
    change4 = bytes([4, 0, 0, 0]) + v4(10, 0, 0, 1).ljust(16, b"\0") + v4(10, 0, 9, 1).ljust(16, b"\0") + struct.pack("<HH", 4242, 0)
    write("probe", "addr_change_v4", frame(PROBE, flags=4, ln=40) + change4)
    change6 = bytes([6, 0, 0, 0]) + bytes(range(16)) + bytes(range(16, 32)) + struct.pack("<HH", 5000, 0)
    write("probe", "addr_change_v6", frame(PROBE, flags=4, ln=40) + change6)
    # receive path, raw mode: real frame sequences
    m0, m1 = bytes(range(200)), bytes(range(50, 150))
    one = frame(RESUME) + data(0, 0, m0[:128], 200) + data(0, 128, m0[128:], 200) + data(1, 0, m1, 100)
    recv_raw("two_msgs_one_stream", 2, [256, 100], [(0, 0, 0, [(False, False, one)])])
    recv_raw("two_msgs_short_reads", 2, [256, 100], [(0, 0, 0, [(False, False, one)])], max_read=5, short_every=2)
    s0 = frame(RESUME) + data(0, 0, m0[:100], 200) + data(1, 0, m1, 100)
    s1 = data(0, 100, m0[100:], 200) + frame(CLOSE)
    recv_raw("two_streams_then_close", 2, [200, 128], [(0, 0, 0, [(False, False, s0), (True, False, s1)])], post=1)
    a = frame(RESUME) + data(0, 0, m0, 200) + data(1, 0, m1[:60], 100)
    b = frame(RESUME, seq=1) + data(0, 0, m0, 200) + data(1, 0, m1, 100)
    recv_raw("failover_resume_dup", 2, [200, 100], [(0, 0, 0, [(True, False, a)]), (1, 0, 2, [(False, False, b)])])
    recv_raw("reconnect_new_generation", 1, [64], [(0, 0, 0, [(False, False, frame(RESUME) + data(0, 0, m1[:30], 64))]),
                                                   (0, 1, 1, [(False, False, frame(RESUME) + data(0, 0, m1[:64], 64))])])
    recv_raw("zero_size_and_truncation", 2, [0, 16], [(0, 0, 0, [(False, True, frame(RESUME) + data(0, 0, b"", 0) + data(1, 0, m1[:32], 32))])])
    # send path: the receiver's answers on each connection the sender opens (primary first)
    ok = frame(RESUME_ACK, seq=0) + frame(ACK, seq=1) + frame(ACK, seq=2) + frame(ACK, seq=3)
    send_seed("acked", 1, [1000, 0, 300], [(False, ok), (False, b"")])
    send_seed("acked_two_streams_short_writes", 2, [3000, 700], [(False, ok), (False, b""), (False, b""), (False, b"")],
              max_write=40, post=1)
    send_seed("primary_breaks_then_standby", 1, [500, 500],
              [(True, frame(RESUME_ACK, seq=0) + frame(ACK, seq=1)), (False, frame(RESUME_ACK, seq=1) + frame(ACK, seq=2))])
    send_seed("nack", 1, [100], [(False, frame(NACK, seq=1)), (False, frame(RESUME_ACK, seq=0) + frame(ACK, seq=1))])
    send_seed("close_and_overack", 1, [100, 100], [(False, frame(RESUME_ACK, seq=0) + frame(ACK, seq=9)),
                                                    (False, frame(CLOSE))])
    # Regression input (found by CI's 30 s run of fuzz_send at c9d9368): the standby path had
    # read part of a frame when it became the active path, and the active path's control
    # reader started a new frame there (it completed send 0 on a RESUME_ACK read out of
    # alignment). Kept byte for byte.
    write("send", "regress_standby_partial_frame_then_active", base64.b64decode(
        "/wgmBQAAAAAABQUFBQUFBQAAAAAAegAAAAAAAAAAQAAAQAABDPf0AQEAAAADAAAAAAAAAAEAAAAAAAAABOgAAAAAAAAAAAAAAAAAAAUA"
        "AAAAAAAAAQAAAAAAAAAAAAAAAAEfbGxslJSUlJSUlJSUlJSUlJSUlGxsbGxsbGxsTEpKSkpKAAA="))
    # verbs: a 40-byte QP endpoint, then a 48-byte control slot
    write("verbs", "roce_advert", endpoint() + ctl_advert(7, 3, 0x7f0000001000, 1 << 20, 0x1234))
    write("verbs", "ib_ack", endpoint(roce=0, lid=0x12, gid=bytes(16), mtu=5) + ctl_control(1, 7))
    for t in range(2, 6):  # RESUME, RESUME_ACK, NACK, CLOSE
        write("verbs", "roce_control_%d" % t, endpoint(qpn=0xFFFFFF, psn=0) + ctl_control(t, 1 << 40, 9))
    write("verbs", "near_bad_version", endpoint(version=2) + ctl_control(6, 1))
    write("verbs", "near_psn_25_bits", endpoint(psn=0x1000000) + ctl_advert(0, 0, 0, 0, 0))
    write("verbs", "near_reserved_byte", endpoint()[:39] + b"\x01" + ctl_control(0, 0))
    write("verbs", "near_ib_lid_zero", endpoint(roce=0, lid=0) + bytes(48))
    write("verbs", "group_entry_last_of_8", endpoint() + ctl_group(40, 8, 7, 0xFFFFFFFE, 0x7f0000100000, 4096, 0x55))
    write("verbs", "done_written", endpoint() + ctl_done(41, 3, 1000, 7))
    write("verbs", "done_refused_no_entry", endpoint() + ctl_done(42, 0xFF, 5000, 9, written=False))
    write("verbs", "near_group_index_is_count", endpoint() + ctl_group(1, 2, 2, 0, 0, 0, 0))
    write("verbs", "part_on_a_path_of_3_qps", endpoint(lanes=3) + ctl_part(9))
    write("verbs", "near_path_of_129_qps", endpoint(lanes=129) + ctl_part(1 << 40)[:47] + b"\x01")
    # receive path, structured mode: any bytes make a valid stream; a few shapes
    for i, tail in enumerate((b"\x01", b"\x07\x03\x05\x00\x01\x01", b"\x40\x10\x20\x30\x01\x05\x03\x07\x02\x01")):
        write("recv", "structured_%d" % i, bytes(range(i * 7, i * 7 + 24)) + tail)


if __name__ == "__main__":
    main()
