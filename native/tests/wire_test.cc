// Unit tests: handle and frame encoding/decoding, including malformed input.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "transport/tcp/wire.h"

using namespace railover::wire;

static Handle sampleHandle() {
  Handle h;
  h.secret = 0x1122334455667788ULL;
  h.naddr = 2;
  h.primary = 0;
  h.addrs[0].rail = 0, h.addrs[0].family = 4, h.addrs[0].port = 4242;
  h.addrs[0].addr[0] = 10, h.addrs[0].addr[3] = 1;
  h.addrs[1].rail = 1, h.addrs[1].family = 4, h.addrs[1].port = 4343;
  h.addrs[1].addr[0] = 10, h.addrs[1].addr[2] = 1, h.addrs[1].addr[3] = 1;
  return h;
}

TEST(Handle, RoundTrip) {
  uint8_t buf[kHandleBytes];
  encodeHandle(sampleHandle(), buf);
  Handle out;
  std::string err;
  ASSERT_TRUE(decodeHandle(buf, sizeof(buf), &out, &err)) << err;
  EXPECT_EQ(out.secret, 0x1122334455667788ULL);
  EXPECT_EQ(out.naddr, 2);
  EXPECT_EQ(out.addrs[1].port, 4343);
  EXPECT_EQ(out.addrs[1].rail, 1);
  EXPECT_EQ(out.addrs[0].addr[3], 1);
}

TEST(Handle, FitsNcclHandleAndLeavesStageBytes) {
  Handle h = sampleHandle();
  h.naddr = kMaxHandleAddrs;
  for (int i = 0; i < kMaxHandleAddrs; ++i) h.addrs[i] = h.addrs[0];
  uint8_t buf[kHandleBytes];
  memset(buf, 0xee, sizeof(buf));
  encodeHandle(h, buf);
  for (size_t i = 120; i < kHandleBytes; ++i) EXPECT_EQ(buf[i], 0) << "byte " << i;
}

TEST(Handle, RejectsMalformed) {
  uint8_t buf[kHandleBytes];
  std::string err;
  Handle out;
  encodeHandle(sampleHandle(), buf);
  buf[0] ^= 0xff;
  EXPECT_FALSE(decodeHandle(buf, sizeof(buf), &out, &err));
  EXPECT_NE(err.find("magic"), std::string::npos);

  encodeHandle(sampleHandle(), buf);
  buf[4] = 99;  // version
  EXPECT_FALSE(decodeHandle(buf, sizeof(buf), &out, &err));
  EXPECT_NE(err.find("version"), std::string::npos);

  encodeHandle(sampleHandle(), buf);
  buf[6] = 9;  // naddr
  EXPECT_FALSE(decodeHandle(buf, sizeof(buf), &out, &err));

  encodeHandle(sampleHandle(), buf);
  buf[7] = 5;  // primary out of range
  EXPECT_FALSE(decodeHandle(buf, sizeof(buf), &out, &err));

  encodeHandle(sampleHandle(), buf);
  buf[16 + 1] = 7;  // family
  EXPECT_FALSE(decodeHandle(buf, sizeof(buf), &out, &err));

  encodeHandle(sampleHandle(), buf);
  EXPECT_FALSE(decodeHandle(buf, 10, &out, &err));
}

TEST(Hello, RoundTripAndChecks) {
  Hello h;
  h.stream = 2, h.nStreams = 4, h.secret = 77, h.path = 1, h.srcRail = 1, h.generation = 9, h.probePort = 555;
  uint8_t buf[kFrameBytes];
  encodeHello(h, buf);
  Hello o;
  std::string err;
  ASSERT_TRUE(decodeHello(buf, &o, &err)) << err;
  EXPECT_EQ(o.secret, 77u);
  EXPECT_EQ(o.generation, 9u);
  EXPECT_EQ(o.probePort, 555);
  EXPECT_EQ(o.connId, 0u);
  h.connId = 0xfedcba9876543210ULL;
  encodeHello(h, buf);
  ASSERT_TRUE(decodeHello(buf, &o, &err)) << err;
  EXPECT_EQ(o.connId, 0xfedcba9876543210ULL);
  EXPECT_EQ(o.secret, 77u);
  for (int v : {1, 3}) {  // version 1 (no connection id, no tags) and an unknown one are refused
    buf[4] = (uint8_t)v;
    EXPECT_FALSE(decodeHello(buf, &o, &err));
    EXPECT_NE(err.find("version"), std::string::npos);
  }
  encodeHello(h, buf);
  buf[6] = 4;  // stream index == nStreams
  EXPECT_FALSE(decodeHello(buf, &o, &err));
  encodeHello(h, buf);
  buf[1] = 0;
  EXPECT_FALSE(decodeHello(buf, &o, &err));
}

TEST(Frame, BoundsChecked) {
  Frame f;
  f.type = kData, f.len = 4096, f.seq = 3, f.offset = 8192, f.total = 16384;
  uint8_t buf[kFrameBytes];
  encodeFrame(f, buf);
  Frame o;
  std::string err;
  ASSERT_TRUE(decodeFrame(buf, &o, &err)) << err;
  EXPECT_EQ(o.seq, 3u);
  EXPECT_EQ(o.offset, 8192u);
  EXPECT_EQ(o.total, 16384u);
  EXPECT_EQ(o.tag, 0);
  for (int32_t tag : {7, -1, INT32_MAX, INT32_MIN}) {  // the isend's tag travels unchanged
    f.tag = tag;
    f.offset = (1ULL << 40) - 4096, f.total = 1ULL << 40;  // the largest message keeps its offsets
    encodeFrame(f, buf);
    ASSERT_TRUE(decodeFrame(buf, &o, &err)) << err;
    EXPECT_EQ(o.tag, tag);
    EXPECT_EQ(o.offset, (1ULL << 40) - 4096);
    EXPECT_EQ(o.total, 1ULL << 40);
  }
  f.tag = 0, f.offset = 8192, f.total = 16384;

  f.offset = 16000;  // chunk overruns its message
  encodeFrame(f, buf);
  EXPECT_FALSE(decodeFrame(buf, &o, &err));

  f.offset = 0, f.len = kMaxChunkBytes + 1, f.total = 1ULL << 30;  // oversize chunk
  encodeFrame(f, buf);
  EXPECT_FALSE(decodeFrame(buf, &o, &err));

  f.len = 0, f.total = (1ULL << 40) + 1;  // message beyond 1 TiB
  encodeFrame(f, buf);
  EXPECT_FALSE(decodeFrame(buf, &o, &err));

  Frame ack;
  ack.type = kAck, ack.len = 5;  // control frames carry no payload
  encodeFrame(ack, buf);
  EXPECT_FALSE(decodeFrame(buf, &o, &err));

  buf[0] = 200;
  EXPECT_FALSE(decodeFrame(buf, &o, &err));
  EXPECT_NE(err.find("unknown frame type"), std::string::npos);
}

TEST(Chunking, AlignedAndBounded) {
  EXPECT_EQ(chunkSize(1000, 4, 65536, 1 << 20), 65536u);
  uint64_t c = chunkSize(10000000, 4, 65536, 1 << 20);
  EXPECT_EQ(c % 128, 0u);
  EXPECT_LE(c, 1u << 20);
  c = chunkSize(1000000, 4, 65536, 1 << 20);
  EXPECT_EQ(c % 128, 0u);
  EXPECT_GE(c * 4, 1000000u);
  EXPECT_EQ(chunkSize(0, 2, 128, 1 << 20), 128u);
}
