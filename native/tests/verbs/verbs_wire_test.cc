// Unit tests of the verbs layer's pure logic (no RDMA device needed): the control message and
// QP endpoint wire forms, RC parameter checks and the RC give-up arithmetic, and the errors of
// port discovery for NICs that cannot carry RDMA.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstring>
#include <string>

#include <net/if.h>

#include "fake_verbs.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_path.h"
#include "transport/verbs/verbs_qp.h"

using namespace railover::verbs;

TEST(VerbsCtlWire, AdvertRoundTripsBigEndian) {
  Advert a;
  a.seq = 0x0102030405060708ull;
  a.tag = 0xfffffffffffffffeull;
  a.addr = 0x00007f0012345678ull;
  a.size = 4294967295ull;
  a.rkey = 0xa1b2c3d4u;
  uint8_t w[ctlwire::kBytes];
  ctlwire::encodeAdvert(a, w);
  EXPECT_EQ(w[0], ctlwire::kAdvert);
  EXPECT_EQ(w[4], 0xa1);  // rkey big-endian
  EXPECT_EQ(w[8], 0x01);  // seq big-endian
  EXPECT_EQ(w[15], 0x08);
  for (size_t i = 40; i < ctlwire::kBytes; ++i) EXPECT_EQ(w[i], 0) << i;
  ctlwire::Decoded d;
  std::string err;
  ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kAdvert) << err;
  const Advert& b = d.advert;
  EXPECT_EQ(b.count, 0);  // a single receive
  EXPECT_EQ(b.seq, a.seq);
  EXPECT_EQ(b.tag, a.tag);
  EXPECT_EQ(b.addr, a.addr);
  EXPECT_EQ(b.size, a.size);
  EXPECT_EQ(b.rkey, a.rkey);
}

TEST(VerbsCtlWire, ControlRoundTripsAndBadKindsAreRejected) {
  for (CtlType t : {CtlType::kAck, CtlType::kResume, CtlType::kResumeAck, CtlType::kNack, CtlType::kClose}) {
    CtlMsg m;
    m.type = t;
    m.seq = 77;
    m.arg = 1ull << 40;
    uint8_t w[ctlwire::kBytes];
    ctlwire::encodeCtl(m, w);
    ctlwire::Decoded d;
    std::string err;
    ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kControl) << err;
    const CtlMsg& got = d.ctl;
    EXPECT_EQ(got.type, t);
    EXPECT_EQ(got.seq, 77u);
    EXPECT_EQ(got.arg, 1ull << 40);
  }
  uint8_t w[ctlwire::kBytes] = {0};
  ctlwire::Decoded d;
  std::string err;
  EXPECT_EQ(ctlwire::decode(w, &d, &err), 0);  // kind 0
  EXPECT_NE(err.find("unknown kind 0"), std::string::npos) << err;
  w[0] = ctlwire::kControl;
  w[1] = 9;  // no such control type
  err.clear();
  EXPECT_EQ(ctlwire::decode(w, &d, &err), 0);
  EXPECT_NE(err.find("unknown control type 9"), std::string::npos) << err;
  w[0] = 6;
  err.clear();
  EXPECT_EQ(ctlwire::decode(w, &d, &err), 0);
  EXPECT_NE(err.find("unknown kind 6"), std::string::npos) << err;
}

// PART (kind 5): a seq and nothing else; any other non-zero byte is refused.
TEST(VerbsCtlWire, PartCarriesOnlyItsSeq) {
  uint8_t w[ctlwire::kBytes];
  ctlwire::encodePart(0x0102030405060708ull, w);
  EXPECT_EQ(w[0], ctlwire::kPart);
  ctlwire::Decoded d;
  std::string err;
  ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kPart) << err;
  EXPECT_EQ(d.partSeq, 0x0102030405060708ull);
  for (size_t i : {size_t(1), size_t(7), size_t(16), size_t(47)}) {
    uint8_t b[ctlwire::kBytes];
    std::memcpy(b, w, sizeof b);
    b[i] = 1;
    err.clear();
    EXPECT_EQ(ctlwire::decode(b, &d, &err), 0) << "byte " << i;
    EXPECT_NE(err.find("reserved bytes"), std::string::npos) << err;
  }
}

// A grouped receive's entries and the DONE: round trip, then every malformed form is refused
// with an error naming the field (count, index, size, tag, status, reserved bytes).
TEST(VerbsCtlWire, GroupEntriesAndDoneRoundTripAndMalformedOnesAreNamed) {
  Advert a;
  a.seq = 41, a.tag = 0xfffffffeu, a.addr = 0x7f0000001000ull, a.size = 1 << 20, a.rkey = 0x01020304u;
  a.count = 8, a.index = 7;
  uint8_t w[ctlwire::kBytes];
  ctlwire::encodeAdvert(a, w);
  EXPECT_EQ(w[0], ctlwire::kGroupEntry);
  EXPECT_EQ(w[2], 8);
  EXPECT_EQ(w[3], 7);
  ctlwire::Decoded d;
  std::string err;
  ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kGroupEntry) << err;
  EXPECT_EQ(d.advert.seq, 41u);
  EXPECT_EQ(d.advert.tag, 0xfffffffeu);
  EXPECT_EQ(d.advert.addr, a.addr);
  EXPECT_EQ(d.advert.size, a.size);
  EXPECT_EQ(d.advert.rkey, a.rkey);
  EXPECT_EQ(d.advert.count, 8);
  EXPECT_EQ(d.advert.index, 7);
  auto bad = [&](const uint8_t* in, const char* want) {
    ctlwire::Decoded x;
    std::string e;
    EXPECT_EQ(ctlwire::decode(in, &x, &e), 0) << want;
    EXPECT_NE(e.find(want), std::string::npos) << "error '" << e << "' does not name '" << want << "'";
  };
  uint8_t m[ctlwire::kBytes];
  std::memcpy(m, w, sizeof(m));
  m[2] = 0;
  bad(m, "group of 0 entries");
  m[2] = 9;
  bad(m, "group of 9 entries");
  std::memcpy(m, w, sizeof(m));
  m[3] = 8;
  bad(m, "entry 8 of a group of 8");
  std::memcpy(m, w, sizeof(m));
  std::memset(m + 16, 0xff, 8);  // address near the top: address + size wraps
  bad(m, "ends beyond the address space");
  std::memcpy(m, w, sizeof(m));
  m[35] = 1;  // tag with bit 32 set
  bad(m, "beyond 32 bits");
  std::memcpy(m, w, sizeof(m));
  m[44] = 1;
  bad(m, "reserved bytes");
  std::memcpy(m, w, sizeof(m));
  m[1] = 2;
  bad(m, "reserved bytes");

  Done dn;
  dn.seq = 42, dn.tag = 7, dn.bytes = 0xffffffffull, dn.index = 3, dn.written = true;
  ctlwire::encodeDone(dn, w);
  EXPECT_EQ(w[0], ctlwire::kDone);
  ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kDone) << err;
  EXPECT_EQ(d.done.seq, 42u);
  EXPECT_EQ(d.done.tag, 7u);
  EXPECT_EQ(d.done.bytes, 0xffffffffull);
  EXPECT_EQ(d.done.index, 3);
  EXPECT_TRUE(d.done.written);
  dn.written = false, dn.index = kNoEntry;
  ctlwire::encodeDone(dn, w);
  ASSERT_EQ(ctlwire::decode(w, &d, &err), ctlwire::kDone) << err;
  EXPECT_FALSE(d.done.written);
  EXPECT_EQ(d.done.index, kNoEntry);
  std::memcpy(m, w, sizeof(m));
  m[1] = 2;
  bad(m, "unknown status 2");
  std::memcpy(m, w, sizeof(m));
  m[1] = 0;  // written, but to no entry
  bad(m, "entry 255");
  std::memcpy(m, w, sizeof(m));
  m[3] = 8;  // refused naming an entry that no group has
  bad(m, "entry 8");
  std::memcpy(m, w, sizeof(m));
  m[27] = 1;  // 2^32 + ... bytes
  bad(m, "beyond 32 bits");
  std::memcpy(m, w, sizeof(m));
  m[20] = 1;  // the addr field is reserved in a DONE
  bad(m, "reserved bytes");
  std::memcpy(m, w, sizeof(m));
  m[2] = 1;
  bad(m, "reserved bytes");
}

// A single advertisement and a control message accept only what their encoders write: a set
// reserved byte is refused and named (every accepted message re-encodes to the same bytes).
TEST(VerbsCtlWire, ReservedBytesOfAdvertsAndControlsAreRefused) {
  Advert a;
  a.seq = 5, a.tag = 9, a.addr = 0x1000, a.size = 64, a.rkey = 0x77;
  CtlMsg c;
  c.type = CtlType::kResume, c.seq = 3, c.arg = 1;
  uint8_t adv[ctlwire::kBytes], ctl[ctlwire::kBytes];
  ctlwire::encodeAdvert(a, adv);
  ctlwire::encodeCtl(c, ctl);
  for (int i : {1, 2, 3, 40, 47}) {
    uint8_t m[ctlwire::kBytes];
    std::memcpy(m, adv, sizeof m);
    m[i] = 1;
    ctlwire::Decoded d;
    std::string err;
    EXPECT_EQ(ctlwire::decode(m, &d, &err), 0) << "advert byte " << i;
    EXPECT_NE(err.find("reserved bytes"), std::string::npos) << err;
  }
  for (int i : {2, 7, 24, 32, 47}) {
    uint8_t m[ctlwire::kBytes];
    std::memcpy(m, ctl, sizeof m);
    m[i] = 1;
    ctlwire::Decoded d;
    std::string err;
    EXPECT_EQ(ctlwire::decode(m, &d, &err), 0) << "control byte " << i;
    EXPECT_NE(err.find("reserved bytes"), std::string::npos) << err;
  }
}

TEST(VerbsEndpoint, PackUnpackAndMismatchedPeersAreNamed) {
  QpEndpoint e;
  e.qpn = 0x123456;
  e.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(i * 17);
  e.lid = 0x4321;
  e.mtu = IBV_MTU_4096;
  e.roce = 0;
  uint8_t w[QpEndpoint::kWireBytes];
  e.pack(w);
  QpEndpoint f;
  std::string err;
  ASSERT_TRUE(f.unpack(w, &err)) << err;
  EXPECT_EQ(f.qpn, e.qpn);
  EXPECT_EQ(f.psn, e.psn);
  EXPECT_EQ(0, std::memcmp(f.gid, e.gid, 16));
  EXPECT_EQ(f.lid, e.lid);
  EXPECT_EQ(f.mtu, e.mtu);
  EXPECT_EQ(f.roce, 0);
  EXPECT_EQ(f.lanes, 1);
  EXPECT_EQ(w[34], 0) << "a one-QP endpoint is what it was before paths had several QPs";
  e.lanes = 128;  // NCCL_IB_QPS_PER_CONNECTION's largest value
  e.pack(w);
  EXPECT_EQ(w[34], 127);
  ASSERT_TRUE(f.unpack(w, &err)) << err;
  EXPECT_EQ(f.lanes, 128);
  e.lanes = 1;
  EXPECT_FALSE(f.qos) << "an endpoint without QoS (what a railover before it sent) says so";
  e.qos = true, e.trafficClass = 106, e.sl = 5;  // the sender's resolved NCCL_IB_TC / SL or comm traffic class
  e.pack(w);
  EXPECT_EQ(w[35], 1);
  ASSERT_TRUE(f.unpack(w, &err)) << err;
  EXPECT_TRUE(f.qos);
  EXPECT_EQ(f.trafficClass, 106);
  EXPECT_EQ(f.sl, 5);
  e.qos = false, e.trafficClass = 0, e.sl = 0;
  e.pack(w);
  ASSERT_TRUE(f.unpack(w, &err)) << err;
  EXPECT_FALSE(f.qos);
  uint8_t bad[QpEndpoint::kWireBytes];
  std::memcpy(bad, w, sizeof bad);
  bad[0] ^= 0xff;
  EXPECT_FALSE(f.unpack(bad, &err));
  EXPECT_NE(err.find("magic"), std::string::npos) << err;
  std::memcpy(bad, w, sizeof bad);
  bad[5] = 99;  // version
  EXPECT_FALSE(f.unpack(bad, &err));
  EXPECT_NE(err.find("version"), std::string::npos) << err;
}

// Every field a peer sends in its endpoint is range-checked before the QP is connected to it;
// each refusal names the field (the fuzz target fuzz_verbs holds the exact valid set).
TEST(VerbsEndpoint, OutOfRangeFieldsAreRefusedByName) {
  // A valid RoCE endpoint (GID ::ffff:0.0.0.1), then one field broken per case.
  uint8_t good[QpEndpoint::kWireBytes] = {0x52, 0x4f, 0x56, 0x51, 0, 1, 0, 0, 0, 0, 0, 0x42, 0, 0, 0, 0x10,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 1, IBV_MTU_1024, 1};
  QpEndpoint f;
  std::string err;
  ASSERT_TRUE(f.unpack(good, &err)) << err;
  EXPECT_EQ(f.qpn, 0x42u);
  struct Case {
    const char* what;
    void (*edit)(uint8_t*);
    const char* needle;
  };
  const Case cases[] = {
      {"QPN 0", [](uint8_t* w) { std::memset(w + 8, 0, 4); }, "QP number 0"},
      {"QPN of 25 bits", [](uint8_t* w) { w[8] = 0x01; }, "QP number"},
      {"PSN of 25 bits", [](uint8_t* w) { w[12] = 0x01; }, "PSN"},
      {"MTU code 0", [](uint8_t* w) { w[32] = 0; }, "MTU code 0"},
      {"MTU code 6", [](uint8_t* w) { w[32] = 6; }, "MTU code 6"},
      {"link layer 2", [](uint8_t* w) { w[33] = 2; }, "link-layer flag 2"},
      {"RoCE with a zero GID", [](uint8_t* w) { std::memset(w + 16, 0, 16); }, "all-zero GID"},
      {"IB with LID 0", [](uint8_t* w) { w[33] = 0; }, "LID 0"},
      {"IB with a multicast LID", [](uint8_t* w) { w[33] = 0; w[6] = 0xc0; w[7] = 0x00; }, "LID 49152"},
      {"reserved byte", [](uint8_t* w) { w[39] = 1; }, "reserved byte 39"},
      {"reserved byte after the QoS", [](uint8_t* w) { w[38] = 1; }, "reserved byte 38"},
      {"QoS flag 2", [](uint8_t* w) { w[35] = 2; }, "QoS flag 2"},
      {"a traffic class without the QoS flag", [](uint8_t* w) { w[36] = 96; }, "without its QoS flag"},
      {"a service level without the QoS flag", [](uint8_t* w) { w[37] = 3; }, "without its QoS flag"},
      {"service level 16", [](uint8_t* w) { w[35] = 1; w[37] = 16; }, "service level 16"},
      {"a path of 129 QPs", [](uint8_t* w) { w[34] = 128; }, "a path of 129 QPs (1..128)"},
  };
  for (const Case& c : cases) {
    uint8_t w[QpEndpoint::kWireBytes];
    std::memcpy(w, good, sizeof w);
    c.edit(w);
    QpEndpoint g;
    err.clear();
    EXPECT_FALSE(g.unpack(w, &err)) << c.what;
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.what << ": " << err;
    EXPECT_EQ(g.qpn, 0u) << c.what << ": a refused endpoint must not be half-filled";
  }
}

TEST(VerbsRcParams, GiveUpTimeAndRanges) {
  RcParams p;
  p.timeout = 14;
  p.retryCnt = 6;
  // 4.096 µs * 2^14 = 67.1 ms per try, 7 tries
  EXPECT_EQ(p.nominalGiveUpUs(), static_cast<uint64_t>(4.096 * 16384 * 7));
  EXPECT_EQ(p.validate(), "");
  RcParams d;  // NCCL's defaults: 20 and 7 -> about 30 s
  EXPECT_EQ(d.timeout, 20);
  EXPECT_EQ(d.retryCnt, 7);
  EXPECT_NEAR(static_cast<double>(d.nominalGiveUpUs()) / 1e6, 34.4, 0.1);
  p.timeout = 32;
  EXPECT_NE(p.validate().find("timeout"), std::string::npos);
  p.timeout = 14;
  p.retryCnt = 8;
  EXPECT_NE(p.validate().find("retry_cnt"), std::string::npos);
  p.retryCnt = 6;
  p.sl = 16;
  EXPECT_NE(p.validate().find("service level"), std::string::npos);
}

TEST(VerbsDiscovery, NicsThatCannotCarryRdmaAreNamed) {
  fake::reset();
  PortSel ps;
  std::string err;
  EXPECT_FALSE(findPortForNetdev("ro-no-such-nic", &ps, &err));
  EXPECT_NE(err.find("no network interface named 'ro-no-such-nic'"), std::string::npos) << err;
  // The loopback NIC has an IPv4 address but no RDMA device is ever bound to it.
  err.clear();
  EXPECT_FALSE(findPortForNetdev("lo", &ps, &err));
  EXPECT_FALSE(err.empty());
  err.clear();
  EXPECT_FALSE(findPortByDevice("ro-no-such-hca", 1, -1, &ps, &err));
  EXPECT_NE(err.find("no RDMA device named 'ro-no-such-hca'"), std::string::npos) << err;
}

namespace {
ibv_gid_entry gidEntry(const char* text, uint32_t type, uint32_t ifindex) {
  ibv_gid_entry e{};
  inet_pton(AF_INET6, text, e.gid.raw);
  e.gid_type = type;
  e.ndev_ifindex = ifindex;
  return e;
}
}  // namespace

TEST(VerbsDiscovery, TheRoceV2GidThatMapsTheNicsIpv4AddressIsChosen) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  ibv_gid_entry empty{};
  empty.gid_type = 0xff;
  std::vector<ibv_gid_entry> t = {
      gidEntry("fe80::1", IBV_GID_TYPE_ROCE_V2, lo),           // link-local: no IPv4
      gidEntry("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V1, lo),  // RoCE v1
      empty,
      gidEntry("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo + 1000),  // another NIC
  };
  fake::setGids("fake1", 1, t);
  PortSel ps;
  std::string err;
  EXPECT_FALSE(findPortForNetdev("lo", &ps, &err));
  EXPECT_NE(err.find("HCA fake1 port 1 has no RoCE v2 IPv4 GID bound to lo (NCCL_IB_ROCE_VERSION_NUM=2, "
                     "NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_GID_INDEX unset); GIDs bound to lo: 0 fe80::1 RoCE v2, "
                     "1 ::ffff:127.0.0.1 RoCE v1"),
            std::string::npos) << err;
  t.push_back(gidEntry("::ffff:127.0.0.9", IBV_GID_TYPE_ROCE_V2, lo));  // index 4: another address of lo
  fake::setGids("fake1", 1, t);
  ASSERT_TRUE(findPortForNetdev("lo", &ps, &err)) << err;
  EXPECT_EQ(ps.gidIndex, 4);
  t.push_back(gidEntry("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo));  // index 5: lo's first address
  fake::setGids("fake1", 1, t);
  ASSERT_TRUE(findPortForNetdev("lo", &ps, &err)) << err;
  EXPECT_EQ(ps.dev, "fake1");
  EXPECT_EQ(ps.port, 1);
  EXPECT_EQ(ps.gidIndex, 5) << "the GID of the NIC's first address wins over a lower index";
  EXPECT_TRUE(ps.roce);
  EXPECT_EQ(gidString(ps.gid), "::ffff:127.0.0.1");
  EXPECT_EQ(ps.why,
            "fake1 port 1 GID 5 (RoCE v2, IPv4 127.0.0.1, bound to lo; NCCL_IB_GID_INDEX unset, the NIC's first "
            "address)");
  // by HCA name: the first RoCE v2 GID with an IPv4 address, or the index given
  ASSERT_TRUE(findPortByDevice("fake1", 1, -1, &ps, &err)) << err;
  EXPECT_EQ(ps.gidIndex, 3);  // bound to another NIC, but findPortByDevice does not ask
  ASSERT_TRUE(findPortByDevice("fake1", 1, 5, &ps, &err)) << err;
  EXPECT_EQ(ps.gidIndex, 5);
  EXPECT_EQ(ps.netdev, "lo");
  EXPECT_FALSE(findPortByDevice("fake1", 1, 2, &ps, &err));  // an empty slot
  EXPECT_NE(err.find("has no GID index 2"), std::string::npos) << err;
}
