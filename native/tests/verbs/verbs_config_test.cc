// Unit tests: NCCL's IB variables applied by the verbs layer (transport/verbs/verbs_config.h):
// the pure GID choice (address family, range, RoCE version, explicit index, binding to the NIC,
// no match, InfiniBand), the sysfs GID table reader on a built tree, NCCL_IB_HCA excluding a
// NIC's HCA port, re-selection after a GID table change, and the RC QP attributes (P_Key index
// checked against the port's table) -- against the fake verbs provider, no RDMA device needed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fake_verbs.h"
#include "transport/verbs/verbs_config.h"

using namespace railover;
using namespace railover::verbs;

namespace {

bool parseHcaFilterForTest(const char* spec, HcaFilter* f) {
  std::string why;
  bool ok = parseHcaFilter(spec, f, &why);
  EXPECT_TRUE(ok) << why;
  return ok;
}

GidEntry entry(int index, const char* text, GidType type, const char* netdev) {
  GidEntry e;
  e.index = index;
  EXPECT_EQ(inet_pton(AF_INET6, text, e.gid), 1) << text;
  e.type = type;
  e.netdev = netdev;
  return e;
}

PortFacts roceOn(const char* netdev) {
  PortFacts f;
  f.dev = "rxe0";
  f.port = 1;
  f.roce = true;
  f.netdev = netdev;
  return f;
}

// What a Soft-RoCE port on eth1 (10.1.0.1, fd00:1::1) shows, plus entries of another NIC.
std::vector<GidEntry> rxeTable() {
  return {
      entry(0, "fe80::5054:ff:fe12:3401", GidType::kRoceV1, "eth1"),
      entry(1, "fe80::5054:ff:fe12:3401", GidType::kRoceV2, "eth1"),
      entry(2, "::ffff:10.1.0.1", GidType::kRoceV1, "eth1"),
      entry(3, "::ffff:10.1.0.1", GidType::kRoceV2, "eth1"),
      entry(4, "fd00:1::1", GidType::kRoceV1, "eth1"),
      entry(5, "fd00:1::1", GidType::kRoceV2, "eth1"),
      entry(6, "::ffff:10.2.0.1", GidType::kRoceV2, "eth2"),
      entry(7, "::ffff:192.168.5.1", GidType::kRoceV2, "eth1"),
  };
}

IbConfig withRange(IbConfig s, int family, const char* addr, int prefix) {
  s.addrRangeSet = true;
  s.addrRangeFamily = family;
  std::memset(s.addrRange, 0, sizeof s.addrRange);
  EXPECT_EQ(inet_pton(family, addr, s.addrRange), 1);
  s.addrRangePrefix = prefix;
  s.addrRangeText = std::string(addr) + "/" + std::to_string(prefix);
  return s;
}

std::string gidText(const uint8_t g[16]) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, g, buf, sizeof buf);
  return buf;
}

}  // namespace

TEST(VerbsGidChoice, DefaultIsTheNicsRoceV2Ipv4Gid) {
  GidChoice c;
  std::string err;
  ASSERT_TRUE(chooseGid(IbConfig{}, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 3);
  EXPECT_EQ(c.type, GidType::kRoceV2);
  EXPECT_EQ(gidText(c.gid), "::ffff:10.1.0.1");
  EXPECT_EQ(c.netdev, "eth1");
  EXPECT_EQ(c.why, "rxe0 port 1 GID 3 (RoCE v2, IPv4 10.1.0.1, bound to eth1; NCCL_IB_GID_INDEX unset)");
  // The other NIC's entry is chosen for the other NIC.
  ASSERT_TRUE(chooseGid(IbConfig{}, roceOn("eth2"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 6);
}

TEST(VerbsGidChoice, VersionAndFamily) {
  IbConfig s;
  GidChoice c;
  std::string err;
  s.roceVersion = 1;
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 2);
  EXPECT_EQ(c.type, GidType::kRoceV1);
  s.roceVersion = 2;
  s.addrFamily = AF_INET6;  // link-local fe80:: entries (0, 1) are never chosen automatically
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 5);
  EXPECT_NE(c.why.find("IPv6 fd00:1::1"), std::string::npos) << c.why;
  s.roceVersion = 1;
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 4);
}

TEST(VerbsGidChoice, AddressRange) {
  GidChoice c;
  std::string err;
  IbConfig s = withRange(IbConfig{}, AF_INET, "192.168.0.0", 16);
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 7);
  EXPECT_EQ(c.why,
            "rxe0 port 1 GID 7 (RoCE v2, IPv4 192.168.5.1, bound to eth1; NCCL_IB_GID_INDEX unset, in "
            "NCCL_IB_ADDR_RANGE 192.168.0.0/16)");
  s = withRange(IbConfig{}, AF_INET, "10.1.0.1", 32);  // a host range
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 3);
  s = withRange(IbConfig{}, AF_INET, "10.0.0.0", 15);  // 10.0.0.0 - 10.1.255.255
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 3);
  s = withRange(IbConfig{}, AF_INET, "10.2.0.0", 16);  // eth2's subnet: nothing on eth1
  EXPECT_FALSE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err));
  EXPECT_NE(err.find("HCA rxe0 port 1 has no RoCE v2 IPv4 GID bound to eth1 in 10.2.0.0/16 (NCCL_IB_ROCE_VERSION_NUM=2, "
                     "NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_ADDR_RANGE=10.2.0.0/16, NCCL_IB_GID_INDEX unset)"),
            std::string::npos)
      << err;
  IbConfig s6 = withRange(IbConfig{}, AF_INET6, "fd00:2::", 64);
  s6.addrFamily = AF_INET6;
  EXPECT_FALSE(chooseGid(s6, roceOn("eth1"), rxeTable(), &c, &err));
  s6 = withRange(IbConfig{}, AF_INET6, "fd00::", 16);
  s6.addrFamily = AF_INET6;
  ASSERT_TRUE(chooseGid(s6, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 5);
  s = withRange(IbConfig{}, AF_INET, "0.0.0.0", 0);  // everything
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 3);
  EXPECT_TRUE(gidInRange(IbConfig{}, c.gid));
}

TEST(VerbsGidChoice, ExplicitIndexWins) {
  IbConfig s;
  GidChoice c;
  std::string err;
  s.gidIndex = 1;  // even a link-local RoCE v2 GID: the user said so (as in NCCL)
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.why, "rxe0 port 1 GID 1 (RoCE v2, IPv6 fe80::5054:ff:fe12:3401, bound to eth1; NCCL_IB_GID_INDEX=1)");
  s.gidIndex = 6;  // bound to another NIC: used, and the line says so
  ASSERT_TRUE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err)) << err;
  EXPECT_EQ(c.index, 6);
  EXPECT_NE(c.why.find("bound to eth2, not eth1; NCCL_IB_GID_INDEX=6"), std::string::npos) << c.why;
  s.gidIndex = 12;
  EXPECT_FALSE(chooseGid(s, roceOn("eth1"), rxeTable(), &c, &err));
  EXPECT_EQ(err.rfind("NCCL_IB_GID_INDEX=12: HCA rxe0 port 1 has no GID at index 12 (its GIDs: 0 fe80::", 0), 0u)
      << err;
  EXPECT_FALSE(chooseGid(s, roceOn("eth1"), {}, &c, &err));
  EXPECT_EQ(err, "NCCL_IB_GID_INDEX=12: HCA rxe0 port 1 has no GID at index 12 (its GID table is empty)");
}

TEST(VerbsGidChoice, NoMatchIsAClearError) {
  GidChoice c;
  std::string err;
  // Only link-local and RoCE v1 entries on the NIC (a NIC without an IPv4 address, v1 only).
  std::vector<GidEntry> t = {entry(0, "fe80::1", GidType::kRoceV1, "eth1"),
                             entry(1, "fe80::1", GidType::kRoceV2, "eth1"),
                             entry(2, "::ffff:10.1.0.1", GidType::kRoceV1, "eth1")};
  EXPECT_FALSE(chooseGid(IbConfig{}, roceOn("eth1"), t, &c, &err));
  EXPECT_EQ(err,
            "HCA rxe0 port 1 has no RoCE v2 IPv4 GID bound to eth1 (NCCL_IB_ROCE_VERSION_NUM=2, "
            "NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_GID_INDEX unset); GIDs bound to eth1: 0 fe80::1 RoCE v1, 1 fe80::1 "
            "RoCE v2, 2 ::ffff:10.1.0.1 RoCE v1");
  EXPECT_FALSE(chooseGid(IbConfig{}, roceOn("eth9"), t, &c, &err));
  EXPECT_NE(err.find("; no GID is bound to eth9"), std::string::npos) << err;
  // Entries of unknown type (sysfs type unreadable) are never chosen automatically.
  t = {entry(3, "::ffff:10.1.0.1", GidType::kUnknown, "eth1")};
  EXPECT_FALSE(chooseGid(IbConfig{}, roceOn("eth1"), t, &c, &err));
}

TEST(VerbsGidChoice, TheNicsFirstAddressIsPreferred) {
  std::vector<GidEntry> t = {entry(2, "::ffff:10.1.0.7", GidType::kRoceV2, "eth1"),
                             entry(3, "::ffff:10.1.0.1", GidType::kRoceV2, "eth1")};
  GidChoice c;
  std::string err;
  PortFacts f = roceOn("eth1");
  ASSERT_TRUE(chooseGid(IbConfig{}, f, t, &c, &err)) << err;
  EXPECT_EQ(c.index, 2) << "no preference known: the lowest index";
  f.hasPreferred = true;
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.1.0.1", f.preferred), 1);
  ASSERT_TRUE(chooseGid(IbConfig{}, f, t, &c, &err)) << err;
  EXPECT_EQ(c.index, 3);
  EXPECT_NE(c.why.find("the NIC's first address"), std::string::npos) << c.why;
  // A preferred address outside the range does not win.
  IbConfig s = withRange(IbConfig{}, AF_INET, "10.1.0.4", 30);
  ASSERT_TRUE(chooseGid(s, f, t, &c, &err)) << err;
  EXPECT_EQ(c.index, 2);
}

TEST(VerbsGidChoice, InfinibandUsesLidAddressing) {
  PortFacts f;
  f.dev = "mlx5_0";
  f.port = 1;
  f.roce = false;
  f.lid = 7;
  IbConfig s;
  GidChoice c;
  std::string err;
  std::vector<GidEntry> t = {entry(0, "fe80::2c9:300:1:2", GidType::kIb, "")};
  ASSERT_TRUE(chooseGid(s, f, t, &c, &err)) << err;
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.type, GidType::kIb);
  EXPECT_EQ(c.why, "mlx5_0 port 1: InfiniBand, LID 7 (LID addressing, no GRH)");
  s.gidIndex = 3;
  ASSERT_TRUE(chooseGid(s, f, {}, &c, &err)) << err;
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.why, "mlx5_0 port 1: InfiniBand, LID 7 (LID addressing, no GRH; NCCL_IB_GID_INDEX=3 does not apply)");
}

// ---- the sysfs reader, on a tree laid out like /sys/class/infiniband ----

namespace {
struct TempTree {
  std::string root;
  TempTree() {
    char tmpl[] = "/tmp/railover-sysfs-XXXXXX";
    root = mkdtemp(tmpl);
  }
  ~TempTree() { (void)!system(("rm -rf '" + root + "'").c_str()); }
  void file(const std::string& rel, const std::string& text) {
    std::string path = root + "/" + rel;
    for (size_t i = root.size() + 1; (i = path.find('/', i)) != std::string::npos; ++i)
      mkdir(path.substr(0, i).c_str(), 0755);
    std::ofstream(path) << text;
  }
};
}  // namespace

TEST(VerbsGidSysfs, ReadsGidsTypesAndNetdevs) {
  TempTree t;
  const std::string p = "rxe0/ports/1/";
  t.file(p + "gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3401\n");
  t.file(p + "gid_attrs/types/0", "IB/RoCE v1\n");
  t.file(p + "gid_attrs/ndevs/0", "eth1\n");
  t.file(p + "gids/1", "0000:0000:0000:0000:0000:ffff:0a01:0001\n");
  t.file(p + "gid_attrs/types/1", "RoCE v2\n");
  t.file(p + "gid_attrs/ndevs/1", "eth1\n");
  t.file(p + "gids/2", "0000:0000:0000:0000:0000:0000:0000:0000\n");  // an empty slot: no type, no ndev
  t.file(p + "gids/10", "0000:0000:0000:0000:0000:ffff:0a01:0009\n");  // type/ndev unreadable
  std::vector<GidEntry> es;
  std::string err;
  ASSERT_TRUE(readGidTableSysfs(t.root, "rxe0", 1, true, &es, &err)) << err;
  ASSERT_EQ(es.size(), 3u);
  EXPECT_EQ(es[0].index, 0);
  EXPECT_EQ(es[0].type, GidType::kRoceV1);
  EXPECT_EQ(gidText(es[0].gid), "fe80::5054:ff:fe12:3401");
  EXPECT_EQ(es[0].netdev, "eth1");
  EXPECT_EQ(es[1].index, 1);
  EXPECT_EQ(es[1].type, GidType::kRoceV2);
  EXPECT_EQ(gidText(es[1].gid), "::ffff:10.1.0.1");
  EXPECT_EQ(es[2].index, 10);  // numeric order, not directory order
  EXPECT_EQ(es[2].type, GidType::kUnknown);
  EXPECT_EQ(es[2].netdev, "");
  GidChoice c;
  ASSERT_TRUE(chooseGid(IbConfig{}, roceOn("eth1"), es, &c, &err)) << err;
  EXPECT_EQ(c.index, 1);
  // On an InfiniBand port "IB/RoCE v1" is an IB GID.
  ASSERT_TRUE(readGidTableSysfs(t.root, "rxe0", 1, false, &es, &err)) << err;
  EXPECT_EQ(es[0].type, GidType::kIb);
  EXPECT_FALSE(readGidTableSysfs(t.root, "rxe0", 2, true, &es, &err));
  EXPECT_NE(err.find("cannot list " + t.root + "/rxe0/ports/2/gids"), std::string::npos) << err;
}

// ---- against the fake provider: NCCL_IB_HCA, re-selection, RC attributes ----

namespace {
ibv_gid_entry fakeGid(const char* text, uint32_t type, uint32_t ifindex) {
  ibv_gid_entry e{};
  inet_pton(AF_INET6, text, e.gid.raw);
  e.gid_type = type;
  e.ndev_ifindex = ifindex;
  return e;
}
}  // namespace

TEST(VerbsPortChoice, NcclIbHcaExcludesTheNicsHcaPort) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  fake::setGids("fake1", 2, {fakeGid("fe80::1", IBV_GID_TYPE_ROCE_V2, lo),
                             fakeGid("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  std::string why;
  PortSel ps;
  IbConfig s;
  ASSERT_EQ(choosePortForNetdev("lo", s, &ps, &why), PortChoice::kChosen) << why;
  EXPECT_EQ(ps.dev, "fake1");
  EXPECT_EQ(ps.port, 2);
  EXPECT_EQ(ps.gidIndex, 1);
  EXPECT_EQ(ps.netdev, "lo");
  EXPECT_EQ(ps.why, "fake1 port 2 GID 1 (RoCE v2, IPv4 127.0.0.1, bound to lo; NCCL_IB_GID_INDEX unset)");
  for (const char* spec : {"^fake1", "^=fake1:2", "fake0", "=fake1:1", "=fake"}) {
    SCOPED_TRACE(spec);
    ASSERT_TRUE(parseHcaFilterForTest(spec, &s.hca));
    s.hcaText = spec;
    EXPECT_EQ(choosePortForNetdev("lo", s, &ps, &why), PortChoice::kExcluded);
    EXPECT_EQ(why, "HCA fake1 port 2 behind NIC lo is excluded by NCCL_IB_HCA='" + std::string(spec) +
                       "': no RDMA on this NIC");
  }
  for (const char* spec : {"fake", "=fake1", "fake1:2", "^fake0", "^=fake1:1"}) {
    SCOPED_TRACE(spec);
    ASSERT_TRUE(parseHcaFilterForTest(spec, &s.hca));
    EXPECT_EQ(choosePortForNetdev("lo", s, &ps, &why), PortChoice::kChosen) << why;
  }
  // Allowed, but no GID fits: a failure naming the GID variables, not an exclusion.
  s = IbConfig{};
  s.roceVersion = 1;
  EXPECT_EQ(choosePortForNetdev("lo", s, &ps, &why), PortChoice::kFailed);
  EXPECT_NE(why.find("has no RoCE v1 IPv4 GID bound to lo"), std::string::npos) << why;
  // A NIC no HCA is bound to.
  fake::reset();
  EXPECT_EQ(choosePortForNetdev("lo", IbConfig{}, &ps, &why), PortChoice::kFailed);
  EXPECT_NE(why.find("no RDMA device is bound to NIC lo"), std::string::npos) << why;
}

// A NIC whose only HCA port is DOWN (a pulled cable when the job starts) is still chosen, as
// kChosenDown with its GID and the state in the answer, so the transport keeps the NIC and
// moves comms to it once the port is ACTIVE; an ACTIVE port bound to the NIC is preferred.
TEST(VerbsPortChoice, APortThatIsDownIsChosenAsDownAndAnActiveOneIsPreferred) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  fake::setGids("fake1", 2, {fakeGid("fe80::1", IBV_GID_TYPE_ROCE_V2, lo),
                             fakeGid("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  fake::setPortState("fake1", 2, IBV_PORT_DOWN);
  std::string why;
  PortSel ps;
  ASSERT_EQ(choosePortForNetdev("lo", IbConfig{}, &ps, &why), PortChoice::kChosenDown) << why;
  EXPECT_EQ(ps.dev, "fake1");
  EXPECT_EQ(ps.port, 2);
  EXPECT_EQ(ps.gidIndex, 1);
  EXPECT_FALSE(ps.active);
  EXPECT_NE(why.find("HCA fake1 port 2 is"), std::string::npos) << why;
  EXPECT_NE(why.find("not ACTIVE"), std::string::npos) << why;
  // Another port bound to the same NIC, ACTIVE: that one.
  fake::setGids("fake0", 1, {fakeGid("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  ASSERT_EQ(choosePortForNetdev("lo", IbConfig{}, &ps, &why), PortChoice::kChosen) << why;
  EXPECT_EQ(ps.dev, "fake0");
  EXPECT_TRUE(ps.active);
  EXPECT_EQ(ps.state, "PORT_ACTIVE");  // libibverbs' ibv_port_state_str
}

TEST(VerbsPortChoice, ReselectAfterAGidTableChange) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  std::vector<ibv_gid_entry> t = {fakeGid("fe80::1", IBV_GID_TYPE_ROCE_V2, lo),
                                  fakeGid("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)};
  fake::setGids("fake0", 1, t);
  PortSel cur, next;
  std::string err;
  ASSERT_EQ(choosePortForNetdev("lo", IbConfig{}, &cur, &err), PortChoice::kChosen) << err;
  ASSERT_EQ(cur.gidIndex, 1);
  Hca hca("fake0", &err);
  ASSERT_TRUE(hca.ok()) << err;
  bool changed = true;
  ASSERT_TRUE(reselectGid(hca, IbConfig{}, cur, &next, &changed, &err)) << err;
  EXPECT_FALSE(changed) << "same table, same choice";
  EXPECT_EQ(next.gidIndex, 1);
  // The GID table changes: the address moves to index 3 (the kernel re-added it).
  ibv_gid_entry empty{};
  empty.gid_type = 0xff;
  fake::setGids("fake0", 1, {t[0], empty, empty, t[1]});
  fake::asyncEvent(hca.ctx(), IBV_EVENT_GID_CHANGE, 1);
  hca.pollAsync();
  EXPECT_EQ(hca.gidChanges(1), 1u);
  ASSERT_TRUE(reselectGid(hca, IbConfig{}, cur, &next, &changed, &err)) << err;
  EXPECT_TRUE(changed);
  EXPECT_EQ(next.gidIndex, 3);
  EXPECT_EQ(gidString(next.gid), "::ffff:127.0.0.1");
  EXPECT_EQ(next.dev, "fake0");
  EXPECT_EQ(next.port, 1);
  EXPECT_EQ(next.netdev, "lo");
  EXPECT_NE(next.why.find("GID 3"), std::string::npos) << next.why;
  // The address is gone: no GID can be chosen; the error says what is left.
  fake::setGids("fake0", 1, {t[0]});
  EXPECT_FALSE(reselectGid(hca, IbConfig{}, cur, &next, &changed, &err));
  EXPECT_NE(err.find("has no RoCE v2 IPv4 GID bound to lo"), std::string::npos) << err;
}

TEST(VerbsRcSettings, RcParamsFromTheVariables) {
  IbConfig s;
  RcParams p = rcParamsFor(s);
  EXPECT_EQ(p.timeout, 20);
  EXPECT_EQ(p.retryCnt, 7);
  EXPECT_EQ(p.sl, 0);
  EXPECT_EQ(p.trafficClass, 0);
  EXPECT_EQ(p.pkeyIndex, 0);
  EXPECT_EQ(p.validate(), "");
  // unset TC/SL: the comm's traffic class, when it fits the field
  p = rcParamsFor(s, 106);
  EXPECT_EQ(p.trafficClass, 106);
  EXPECT_EQ(p.sl, 0);
  p = rcParamsFor(s, 3);
  EXPECT_EQ(p.trafficClass, 3);
  EXPECT_EQ(p.sl, 3);
  s.timeout = 14;
  s.retryCnt = 6;
  s.sl = 5;
  s.slSet = true;
  s.trafficClass = 0;
  s.trafficClassSet = true;  // given as 0: the comm's class does not override it
  s.pkeyIndex = 1;
  p = rcParamsFor(s, 106);
  EXPECT_EQ(p.timeout, 14);
  EXPECT_EQ(p.retryCnt, 6);
  EXPECT_EQ(p.sl, 5);
  EXPECT_EQ(p.trafficClass, 0);
  EXPECT_EQ(p.pkeyIndex, 1);
  EXPECT_EQ(p.validate(), "");
}

TEST(VerbsRcSettings, PkeyIndexIsCheckedAgainstThePortsTable) {
  fake::reset();
  std::string err;
  Hca hca("fake1", &err);
  ASSERT_TRUE(hca.ok()) << err;
  uint16_t pkey = 0;
  ASSERT_TRUE(checkPkeyIndex(hca, 1, 0, &pkey, &err)) << err;
  EXPECT_EQ(pkey, 0xffff);
  fake::setPkeys("fake1", 1, {0xffff, 0x8001, 0x0000});
  ASSERT_TRUE(checkPkeyIndex(hca, 1, 1, &pkey, &err)) << err;
  EXPECT_EQ(pkey, 0x8001);
  EXPECT_FALSE(checkPkeyIndex(hca, 1, 2, &pkey, &err));
  EXPECT_EQ(err, "NCCL_IB_PKEY=2: entry 2 of HCA fake1 port 1's P_Key table is empty");
  EXPECT_FALSE(checkPkeyIndex(hca, 1, 3, &pkey, &err));
  EXPECT_EQ(err, "NCCL_IB_PKEY=3: HCA fake1 port 1 has a P_Key table of 3 entries (NCCL_IB_PKEY is an index into it)");
}

TEST(VerbsRcSettings, TheQpEntersInitWithThePkeyIndex) {
  fake::reset();
  std::string err;
  Hca hca("fake1", &err);
  ASSERT_TRUE(hca.ok()) << err;
  PortSel ps;
  ps.dev = "fake1";
  ps.port = 1;
  ps.roce = true;
  IbConfig s;
  s.pkeyIndex = 1;
  RcQp a(hca, ps, 8, 8, &err), b(hca, ps, 8, 8, &err);
  ASSERT_TRUE(a.ok() && b.ok()) << err;
  ASSERT_TRUE(a.toInit(rcParamsFor(s).pkeyIndex, &err)) << err;
  EXPECT_EQ(fake::pkeyIndex(a.qp()), 1);
  ASSERT_TRUE(b.toInit(&err)) << err;  // the old form: index 0
  EXPECT_EQ(fake::pkeyIndex(b.qp()), 0);
  RcQp c(hca, ps, 8, 8, &err);
  EXPECT_FALSE(c.toInit(70000, &err));
  EXPECT_NE(err.find("P_Key index 70000 out of range"), std::string::npos) << err;
}
