// How a send comm pairs its NICs with the peer's listener addresses (failover/pairing.h): by
// rail where the hosts' rails match (or nothing is known of the subnets), by subnet where they
// do not, and a note naming the mismatch (which SendLink::create says once per NIC and kind).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include "failover/pairing.h"

using namespace railover;

namespace {

sockaddr_storage ip(const char* s) {
  sockaddr_storage a{};
  if (strchr(s, ':')) {
    auto& x = (sockaddr_in6&)a;
    x.sin6_family = AF_INET6;
    inet_pton(AF_INET6, s, &x.sin6_addr);
  } else {
    auto& x = (sockaddr_in&)a;
    x.sin_family = AF_INET;
    inet_pton(AF_INET, s, &x.sin_addr);
  }
  return a;
}

Subnet net(const char* addr, int prefixLen) { return Subnet{ip(addr), prefixLen}; }

// Local NICs a0.. with the given addresses (prefix `len`; len < 0: unknown), rail = index.
std::vector<LocalNicView> nics(std::vector<const char*> addrs, int len = 24) {
  std::vector<LocalNicView> v;
  for (size_t i = 0; i < addrs.size(); ++i) v.push_back({"a" + std::to_string(i), (int)i, net(addrs[i], len)});
  return v;
}

// A peer handle: (address, rail) per listener, the first the primary unless `primary` says.
PeerHandle handle(std::vector<std::pair<const char*, int>> addrs, int primary = 0) {
  PeerHandle h;
  h.primary = primary;
  for (auto& [a, rail] : addrs) {
    h.addrs[h.naddr].addr = ip(a);
    h.addrs[h.naddr].len = sizeof(sockaddr_in);
    h.addrs[h.naddr++].rail = rail;
  }
  return h;
}

// "a0->1,a1->0": local NIC -> handle index, primary first.
std::string pairs(const PathPlan& p) {
  std::string s;
  for (auto& x : p.pairs) s += (s.empty() ? "" : ",") + ("a" + std::to_string(x.localNic)) + "->" + std::to_string(x.remote);
  return s;
}

}  // namespace

TEST(Pairing, SubnetMembership) {
  EXPECT_TRUE(inSubnet(ip("10.0.1.7"), net("10.0.1.1", 24)));
  EXPECT_FALSE(inSubnet(ip("10.0.2.7"), net("10.0.1.1", 24)));
  EXPECT_TRUE(inSubnet(ip("10.0.3.7"), net("10.0.2.1", 23)));   // 10.0.2.0/23 holds 10.0.3.x
  EXPECT_FALSE(inSubnet(ip("10.0.4.7"), net("10.0.2.1", 23)));
  EXPECT_TRUE(inSubnet(ip("10.9.9.9"), net("10.0.0.1", 0)));
  EXPECT_TRUE(inSubnet(ip("fd00:1::5"), net("fd00:1::1", 64)));
  EXPECT_FALSE(inSubnet(ip("fd00:2::5"), net("fd00:1::1", 64)));
  EXPECT_FALSE(inSubnet(ip("10.0.1.7"), net("fd00:1::1", 0)));  // another family
  EXPECT_FALSE(inSubnet(ip("10.0.1.7"), net("10.0.1.1", -1)));  // unknown
  EXPECT_EQ(subnetToString(net("10.0.3.9", 23)), "10.0.2.0/23");
  EXPECT_EQ(subnetToString(net("fd00:1::1", 64)), "fd00:1::/64");
  EXPECT_EQ(subnetToString(net("10.0.3.9", -1)), "?");
}

TEST(Pairing, MatchingRailsPairByRailWithoutNotes) {
  auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"});
  // NCCL chose a1 here and the peer's NIC on rail 1 there (first in its handle).
  auto h = handle({{"10.0.1.2", 1}, {"10.0.0.2", 0}, {"10.0.2.2", 2}});
  PathPlan p = planPaths(1, {0, 2}, l, h);
  EXPECT_EQ(pairs(p), "a1->0,a0->1,a2->2");
  EXPECT_TRUE(p.notes.empty());
}

TEST(Pairing, UnknownSubnetsKeepTheRailPairing) {
  // The peer's rails swapped, but nothing is known of the local subnets (fake NICs): by rail.
  auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"}, -1);
  auto h = handle({{"10.0.1.2", 0}, {"10.0.0.2", 1}, {"10.0.2.2", 2}});
  PathPlan p = planPaths(0, {1, 2}, l, h);
  EXPECT_EQ(pairs(p), "a0->0,a1->1,a2->2");
  EXPECT_TRUE(p.notes.empty());
}

TEST(Pairing, RoutedFabricsKeepTheRailPairing) {
  // Every NIC on its own /31 to its switch: no peer address is on a local subnet (routes
  // reach them), so nothing says the rails differ.
  auto l = nics({"10.1.0.0", "10.2.0.0", "10.3.0.0"}, 31);
  auto h = handle({{"10.1.7.0", 0}, {"10.2.7.0", 1}, {"10.3.7.0", 2}});
  PathPlan p = planPaths(0, {1, 2}, l, h);
  EXPECT_EQ(pairs(p), "a0->0,a1->1,a2->2");
  EXPECT_TRUE(p.notes.empty());
}

TEST(Pairing, FlatLayoutsTakeAnyAddressOnTheSubnetQuietly) {
  // Every NIC in one subnet; NCCL paired a0 with the peer's rail-1 NIC. Before, a1 (rail 1)
  // had no standby (its rail's address was the primary's); the other address is on its subnet.
  auto l = nics({"10.0.0.1", "10.0.0.11"});
  auto h = handle({{"10.0.0.12", 1}, {"10.0.0.2", 0}});
  PathPlan p = planPaths(0, {1}, l, h);
  EXPECT_EQ(pairs(p), "a0->0,a1->1");
  EXPECT_TRUE(p.notes.empty());
}

TEST(Pairing, SwappedRailsPairBySubnetAndSayWhy) {
  // The peer's RAILOVER_RAILS (or NIC order) swapped rails 0 and 1: by rail, a0 would connect
  // to 10.0.1.2 and a1 to 10.0.0.2, whose connects time out on rail-isolated switches.
  auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"});
  auto h = handle({{"10.0.2.2", 2}, {"10.0.0.2", 1}, {"10.0.1.2", 0}});
  PathPlan p = planPaths(2, {0, 1}, l, h);
  EXPECT_EQ(pairs(p), "a2->0,a0->1,a1->2");
  ASSERT_EQ(p.notes.size(), 2u);
  EXPECT_EQ(p.notes[0].localNic, 0);
  EXPECT_EQ(p.notes[0].kind, PairingNote::kStandbyRepaired);
  const std::string& t = p.notes[0].text;
  for (const char* s : {"a0 (10.0.0.0/24, rail 0)", "10.0.1.2 (rail 0)", "connect to the peer's 10.0.0.2 (rail 1)",
                        "the peer's NICs: 10.0.2.2 (rail 2), 10.0.0.2 (rail 1), 10.0.1.2 (rail 0)", "RAILOVER_RAILS"})
    EXPECT_NE(t.find(s), std::string::npos) << s << " not in: " << t;
  EXPECT_EQ(p.notes[1].localNic, 1);
  EXPECT_EQ(p.notes[1].kind, PairingNote::kStandbyRepaired);
}

TEST(Pairing, APrimaryOffItsSubnetMovesToTheAddressOnIt) {
  // This host has two NICs, the peer three; NCCL paired b0 with the peer's a2 (10.0.2.1).
  auto l = nics({"10.0.0.2", "10.0.1.2"});
  auto h = handle({{"10.0.2.1", 2}, {"10.0.0.1", 0}, {"10.0.1.1", 1}});
  PathPlan p = planPaths(0, {1}, l, h);
  EXPECT_EQ(pairs(p), "a0->1,a1->2");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0].kind, PairingNote::kPrimaryRepaired);
  EXPECT_NE(p.notes[0].text.find("was to connect to the peer's 10.0.2.1 (rail 2) (its NIC NCCL chose)"), std::string::npos)
      << p.notes[0].text;
}

TEST(Pairing, APrimaryOnAnotherNicsSubnetIsKeptAndNamed) {
  // The other side of the above: a2 must send (NCCL's choice) but the peer has no NIC on its
  // subnet; its pair (the peer's 10.0.0.2) is kept: a route or a shared link may reach it.
  auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"});
  auto h = handle({{"10.0.0.2", 0}, {"10.0.1.2", 1}});
  PathPlan p = planPaths(2, {0, 1}, l, h);
  EXPECT_EQ(pairs(p), "a2->0,a1->1");
  ASSERT_EQ(p.notes.size(), 2u);
  EXPECT_EQ(p.notes[0].localNic, 2);
  EXPECT_EQ(p.notes[0].kind, PairingNote::kPrimaryOffSubnet);
  EXPECT_NE(p.notes[0].text.find("which is on the subnet of local NIC a0"), std::string::npos) << p.notes[0].text;
  EXPECT_EQ(p.notes[1].localNic, 0);  // its partner is the primary's
  EXPECT_EQ(p.notes[1].kind, PairingNote::kNoPartner);
  // The comm from a0 (the usual case) has its primary, a1's standby, and a2 none.
  p = planPaths(0, {1, 2}, l, handle({{"10.0.0.2", 0}, {"10.0.1.2", 1}}));
  EXPECT_EQ(pairs(p), "a0->0,a1->1");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0].localNic, 2);
  EXPECT_EQ(p.notes[0].kind, PairingNote::kNoPartner);
}

TEST(Pairing, AStandbyWhoseRailPartnerIsOnAnotherNicsSubnetIsNotOpened) {
  // RAILOVER_STANDBY lets a0's comms fail over to a2 only; the peer's rail-2 NIC is on a1's
  // subnet: a path from a2 could only time out.
  auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"});
  auto h = handle({{"10.0.0.2", 0}, {"10.0.1.2", 2}, {"10.0.2.2", 1}});
  PathPlan p = planPaths(0, {2}, l, h);
  EXPECT_EQ(pairs(p), "a0->0,a2->2");  // on its subnet, rail 1 there
  l[2].subnet = net("10.0.5.1", 24);   // now a2's subnet has no peer address
  p = planPaths(0, {2}, l, h);
  EXPECT_EQ(pairs(p), "a0->0");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0].kind, PairingNote::kStandbySkipped);
  EXPECT_NE(p.notes[0].text.find("10.0.1.2 (rail 2), which is on the subnet of local NIC a1"), std::string::npos)
      << p.notes[0].text;
}

TEST(Pairing, ACandidateListedTwiceGetsOnePath) {
  // RAILOVER_STANDBY=explicit with a pair given twice ('a0=a1;a0=a1') lists a1 twice among the
  // candidates. Each handle address is used at most once (the receiver keys paths by it), and
  // a local NIC has at most one path to the peer.
  for (int len : {24, -1}) {
    auto l = nics({"10.0.0.1", "10.0.1.1", "10.0.2.1"}, len);
    auto h = handle({{"10.0.0.2", 0}, {"10.0.1.2", 1}, {"10.0.2.2", 2}});
    PathPlan p = planPaths(0, {1, 1}, l, h);
    EXPECT_EQ(pairs(p), "a0->0,a1->1") << "prefix " << len;
    p = planPaths(0, {1, 2, 1}, l, h);
    EXPECT_EQ(pairs(p), "a0->0,a1->1,a2->2") << "prefix " << len;
    std::vector<bool> seen(h.naddr, false);
    for (auto& x : p.pairs) {
      EXPECT_FALSE(seen[x.remote]) << "address " << x.remote << " used twice: " << pairs(p);
      seen[x.remote] = true;
    }
  }
}
