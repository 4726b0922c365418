// Unit tests: health probe datagrams (NIC-down and address-change notices), including the
// malformed ones a host on the NIC's network could send.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "health/probe_wire.h"
#include "transport/tcp/wire.h"  // the frame layout the probe header must match

using namespace railover;
using namespace railover::probe;

TEST(ProbeWire, NoticeRoundTripV4AndV6) {
  NicNotice n;
  n.family = 4;
  n.addr[0] = 10, n.addr[3] = 7;
  uint8_t buf[kHeaderBytes + kNoticeBytes];
  encodeNotice(n, buf);
  Datagram d;
  std::string err;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kNotice);
  EXPECT_EQ(d.notice.family, 4);
  EXPECT_EQ(0, memcmp(d.notice.addr, n.addr, 16));

  n.family = 6;
  for (int i = 0; i < 16; ++i) n.addr[i] = (uint8_t)(0xF0 + i);
  encodeNotice(n, buf);
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.notice.family, 6);
  EXPECT_EQ(0, memcmp(d.notice.addr, n.addr, 16));
}

TEST(ProbeWire, AddrChangeRoundTrip) {
  AddrChange c;
  c.family = 4;
  c.oldAddr[0] = 10, c.oldAddr[3] = 1;
  c.newAddr[0] = 10, c.newAddr[2] = 9, c.newAddr[3] = 1;
  c.port = 0xBEEF;
  uint8_t buf[kHeaderBytes + kAddrChangeBytes];
  encodeAddrChange(c, buf);
  Datagram d;
  std::string err;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kAddrChange);
  EXPECT_EQ(d.change.port, 0xBEEF);
  EXPECT_EQ(0, memcmp(d.change.oldAddr, c.oldAddr, 16));
  EXPECT_EQ(0, memcmp(d.change.newAddr, c.newAddr, 16));
}

TEST(ProbeWire, PlainProbeAndAck) {
  uint8_t buf[kHeaderBytes] = {};
  Header h;
  h.flags = kFlagBig;
  encodeHeader(h, buf);
  Datagram d;
  std::string err;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kProbe);
  buf[0] = kTypeProbeAck;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kProbeAck);
}

// Regression: a notice with an address family other than 4 or 6 used to be read as IPv6 and
// could mark every pair to a matching address hard down; it is now refused.
TEST(ProbeWire, RejectsUnknownFamily) {
  NicNotice n;
  uint8_t buf[kHeaderBytes + kNoticeBytes];
  encodeNotice(n, buf);
  buf[kHeaderBytes] = 5;
  Datagram d;
  std::string err;
  EXPECT_FALSE(decodeDatagram(buf, sizeof(buf), &d, &err));
  EXPECT_NE(err.find("unknown address family 5"), std::string::npos) << err;

  AddrChange c;
  uint8_t cb[kHeaderBytes + kAddrChangeBytes];
  encodeAddrChange(c, cb);
  cb[kHeaderBytes] = 0;
  err.clear();
  EXPECT_FALSE(decodeDatagram(cb, sizeof(cb), &d, &err));
  EXPECT_NE(err.find("unknown address family 0"), std::string::npos) << err;
}

TEST(ProbeWire, RejectsTruncatedAndNonProbes) {
  NicNotice n;
  uint8_t buf[kHeaderBytes + kNoticeBytes];
  encodeNotice(n, buf);
  Datagram d;
  std::string err;
  EXPECT_FALSE(decodeDatagram(buf, kHeaderBytes + kNoticeMinBytes - 1, &d, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_TRUE(decodeDatagram(buf, kHeaderBytes + kNoticeMinBytes, &d, &err)) << err;

  AddrChange c;
  uint8_t cb[kHeaderBytes + kAddrChangeBytes];
  encodeAddrChange(c, cb);
  err.clear();
  EXPECT_FALSE(decodeDatagram(cb, sizeof(cb) - 1, &d, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  err.clear();
  EXPECT_FALSE(decodeDatagram(buf, kHeaderBytes - 1, &d, &err));
  EXPECT_NE(err.find("shorter than a frame header"), std::string::npos) << err;

  uint8_t ack[kHeaderBytes] = {};
  wire::Frame f;
  f.type = wire::kAck;
  wire::encodeFrame(f, ack);
  err.clear();
  EXPECT_FALSE(decodeDatagram(ack, sizeof(ack), &d, &err));
  EXPECT_NE(err.find("not a probe"), std::string::npos) << err;

  uint8_t big[kHeaderBytes] = {};
  Header h;
  h.len = kMaxLenBytes + 1;
  encodeHeader(h, big);
  err.clear();
  EXPECT_FALSE(decodeDatagram(big, sizeof(big), &d, &err)) << "a length over 64 KiB is refused";
  EXPECT_NE(err.find("exceeds 64 KiB"), std::string::npos) << err;
}

// The probe header is laid out like the TCP transport's frame header (probe_wire.h says so, and
// docs/PROTOCOL.md describes probes by the frame's fields): health encodes it without the
// transport's code, so this proves the two encodings agree byte for byte, in both directions,
// for every field at its full width.
static_assert(kHeaderBytes == wire::kFrameBytes, "a probe header is one frame header long");
static_assert(kTypeProbe == wire::kProbe && kTypeProbeAck == wire::kProbeAck, "probe types are frame types");

TEST(ProbeWire, HeaderLayoutIsTheFrameLayout) {
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 2000; ++i) {
    Header h;
    h.type = (rng() & 1) ? kTypeProbe : kTypeProbeAck;
    h.flags = (uint8_t)rng();
    h.len = (uint32_t)(rng() % (kMaxLenBytes + 1));
    h.seq = rng();
    h.sentUs = rng() & ((1ULL << 48) - 1);
    h.responder = rng() & ((1ULL << 48) - 1);
    h.mtu = (uint16_t)rng();
    uint8_t mine[kHeaderBytes], theirs[wire::kFrameBytes];
    encodeHeader(h, mine);
    wire::Frame f;
    f.type = h.type, f.flags = h.flags, f.len = h.len, f.seq = h.seq, f.offset = h.sentUs, f.total = h.responder;
    f.stream = h.mtu;  // the sender NIC's MTU sits in a frame's stream field
    wire::encodeFrame(f, theirs);
    ASSERT_EQ(0, memcmp(mine, theirs, kHeaderBytes)) << "probe header and frame header differ at iteration " << i;

    // A frame of a probe type decodes as a probe header with the same fields, and back.
    std::string err;
    wire::Frame g;
    ASSERT_TRUE(wire::decodeFrame(mine, &g, &err)) << err;
    EXPECT_EQ(g.type, h.type);
    EXPECT_EQ(g.flags, h.flags);
    EXPECT_EQ(g.len, h.len);
    EXPECT_EQ(g.seq, h.seq);
    EXPECT_EQ(g.offset, h.sentUs);
    EXPECT_EQ(g.total, h.responder);
    EXPECT_EQ(g.stream, h.mtu);
    EXPECT_EQ(g.tag, 0);
    Header back;
    ASSERT_TRUE(decodeHeader(theirs, &back, &err)) << err;
    EXPECT_EQ(back.type, h.type);
    EXPECT_EQ(back.flags, h.flags);
    EXPECT_EQ(back.len, h.len);
    EXPECT_EQ(back.seq, h.seq);
    EXPECT_EQ(back.sentUs, h.sentUs);
    EXPECT_EQ(back.responder, h.responder);
    EXPECT_EQ(back.mtu, h.mtu);

    // The answer rewrites only the type, the responder and the MTU (the answering NIC's), as
    // re-encoding the decoded frame with type PROBE_ACK, a new total and stream does.
    uint64_t responder = rng() & ((1ULL << 48) - 1);
    uint16_t mtu = (uint16_t)rng();
    answerHeader(mine, responder, mtu);
    g.type = wire::kProbeAck, g.total = responder, g.stream = mtu;
    wire::encodeFrame(g, theirs);
    ASSERT_EQ(0, memcmp(mine, theirs, kHeaderBytes)) << "answer differs from the frame rewrite at iteration " << i;
  }
  // The two decoders agree on what they refuse among probe types: a length over 64 KiB.
  Header h;
  h.len = kMaxLenBytes + 1;
  uint8_t buf[kHeaderBytes];
  encodeHeader(h, buf);
  std::string e1, e2;
  wire::Frame g;
  Header back;
  EXPECT_FALSE(wire::decodeFrame(buf, &g, &e1));
  EXPECT_FALSE(decodeHeader(buf, &back, &e2));
}
