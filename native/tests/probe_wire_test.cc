// Unit tests: health probe datagrams (NIC-down and address-change notices), including the
// malformed ones a host on the NIC's network could send.
#include <gtest/gtest.h>

#include <cstring>

#include "health/probe_wire.h"

using namespace railover;
using namespace railover::probe;

TEST(ProbeWire, NoticeRoundTripV4AndV6) {
  NicNotice n;
  n.family = 4;
  n.addr[0] = 10, n.addr[3] = 7;
  uint8_t buf[wire::kFrameBytes + kNoticeBytes];
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
  uint8_t buf[wire::kFrameBytes + kAddrChangeBytes];
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
  uint8_t buf[wire::kFrameBytes] = {};
  wire::Frame f;
  f.type = wire::kProbe;
  f.flags = kFlagBig;
  wire::encodeFrame(f, buf);
  Datagram d;
  std::string err;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kProbe);
  buf[0] = wire::kProbeAck;
  ASSERT_TRUE(decodeDatagram(buf, sizeof(buf), &d, &err)) << err;
  EXPECT_EQ(d.kind, Kind::kProbeAck);
}

// Regression: a notice with an address family other than 4 or 6 used to be read as IPv6 and
// could mark every pair to a matching address hard down; it is now refused.
TEST(ProbeWire, RejectsUnknownFamily) {
  NicNotice n;
  uint8_t buf[wire::kFrameBytes + kNoticeBytes];
  encodeNotice(n, buf);
  buf[wire::kFrameBytes] = 5;
  Datagram d;
  std::string err;
  EXPECT_FALSE(decodeDatagram(buf, sizeof(buf), &d, &err));
  EXPECT_NE(err.find("unknown address family 5"), std::string::npos) << err;

  AddrChange c;
  uint8_t cb[wire::kFrameBytes + kAddrChangeBytes];
  encodeAddrChange(c, cb);
  cb[wire::kFrameBytes] = 0;
  err.clear();
  EXPECT_FALSE(decodeDatagram(cb, sizeof(cb), &d, &err));
  EXPECT_NE(err.find("unknown address family 0"), std::string::npos) << err;
}

TEST(ProbeWire, RejectsTruncatedAndNonProbes) {
  NicNotice n;
  uint8_t buf[wire::kFrameBytes + kNoticeBytes];
  encodeNotice(n, buf);
  Datagram d;
  std::string err;
  EXPECT_FALSE(decodeDatagram(buf, wire::kFrameBytes + kNoticeMinBytes - 1, &d, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_TRUE(decodeDatagram(buf, wire::kFrameBytes + kNoticeMinBytes, &d, &err)) << err;

  AddrChange c;
  uint8_t cb[wire::kFrameBytes + kAddrChangeBytes];
  encodeAddrChange(c, cb);
  err.clear();
  EXPECT_FALSE(decodeDatagram(cb, sizeof(cb) - 1, &d, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  err.clear();
  EXPECT_FALSE(decodeDatagram(buf, wire::kFrameBytes - 1, &d, &err));
  EXPECT_NE(err.find("shorter than a frame header"), std::string::npos) << err;

  uint8_t ack[wire::kFrameBytes] = {};
  wire::Frame f;
  f.type = wire::kAck;
  wire::encodeFrame(f, ack);
  err.clear();
  EXPECT_FALSE(decodeDatagram(ack, sizeof(ack), &d, &err));
  EXPECT_NE(err.find("not a probe"), std::string::npos) << err;
}
