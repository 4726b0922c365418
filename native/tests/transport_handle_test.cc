// The transport's part of the 128-byte listen handle (Transport::encodeHandle / decodeHandle):
// what the plugin API puts in (secret, primary, listener addresses with ports and rails, the
// transport's name) comes back out of a peer's decode; the handle names its transport; the
// transport writes nothing past kTransportHandleBytes (the plugin API's staging bytes); a
// handle the transport cannot encode is refused with the cause.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

#include "common/config.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/wire.h"

using namespace railover;

namespace {

// A listener address: IPv6 when `ip` has a colon, else IPv4.
PeerHandle::Addr addr(const char* ip, uint16_t port, int rail) {
  PeerHandle::Addr a;
  a.rail = rail;
  if (strchr(ip, ':')) {
    auto& s = (sockaddr_in6&)a.addr;
    s.sin6_family = AF_INET6;
    s.sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &s.sin6_addr);
    a.len = sizeof(sockaddr_in6);
  } else {
    auto& s = (sockaddr_in&)a.addr;
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    inet_pton(AF_INET, ip, &s.sin_addr);
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

PeerHandle sample(const char* transport) {
  PeerHandle h;
  h.secret = 0xfeedfacecafebeefULL;
  h.transport = transport;
  h.primary = 1;
  h.naddr = 3;
  h.addrs[0] = addr("10.0.0.1", 40001, 0);
  h.addrs[1] = addr("fd00::7", 40002, 1);
  h.addrs[2] = addr("10.0.2.1", 40003, 2);
  return h;
}

struct Tcp {
  std::vector<Nic> nics;
  Config cfg;
  TcpTransport t{&nics, &cfg};
};

TEST(TransportHandle, TcpRoundTripNamesTheTransportAndLeavesTheStagingBytes) {
  Tcp tcp;
  uint8_t buf[128];
  memset(buf, 0xab, sizeof(buf));
  std::string err;
  ASSERT_TRUE(tcp.t.encodeHandle(sample("tcp"), buf, &err)) << err;
  for (size_t i = kTransportHandleBytes; i < sizeof(buf); ++i) EXPECT_EQ(buf[i], 0xab) << "byte " << i;
  EXPECT_EQ(buf[wire::kHandleTransportOffset], wire::kTransportTcp);
  PeerHandle out;
  ASSERT_TRUE(tcp.t.decodeHandle(buf, kTransportHandleBytes, &out, &err)) << err;
  PeerHandle in = sample("tcp");
  EXPECT_EQ(out.transport, "tcp");
  EXPECT_EQ(out.secret, in.secret);
  EXPECT_EQ(out.primary, 1);
  ASSERT_EQ(out.naddr, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out.addrs[i].rail, in.addrs[i].rail) << i;
    EXPECT_EQ(out.addrs[i].len, in.addrs[i].len) << i;
    EXPECT_EQ(memcmp(&out.addrs[i].addr, &in.addrs[i].addr, in.addrs[i].len), 0) << "address " << i;
  }
}

// The RDMA transport writes the same layout with its own name (encodeWireHandle, which
// RdmaTransport::encodeHandle calls); a TCP process reads the name and can refuse it.
TEST(TransportHandle, RdmaHandleIsReadAsRdmaByATcpProcess) {
  uint8_t buf[128] = {};
  std::string err;
  ASSERT_TRUE(encodeWireHandle(sample("rdma"), buf, &err)) << err;
  EXPECT_EQ(buf[wire::kHandleTransportOffset], wire::kTransportRdma);
  Tcp tcp;
  PeerHandle out;
  ASSERT_TRUE(tcp.t.decodeHandle(buf, kTransportHandleBytes, &out, &err)) << err;
  EXPECT_EQ(out.transport, "rdma");
}

TEST(TransportHandle, WhatCannotBeEncodedIsRefusedWithTheCause) {
  Tcp tcp;
  uint8_t buf[128] = {};
  std::string err;
  EXPECT_FALSE(tcp.t.encodeHandle(sample("rdma"), buf, &err));
  EXPECT_NE(err.find("rdma handle asked of the tcp transport"), std::string::npos) << err;
  err.clear();
  EXPECT_FALSE(encodeWireHandle(sample("carrier-pigeon"), buf, &err));
  EXPECT_NE(err.find("no code for transport \"carrier-pigeon\""), std::string::npos) << err;
  PeerHandle none = sample("tcp");
  none.naddr = 0;
  err.clear();
  EXPECT_FALSE(tcp.t.encodeHandle(none, buf, &err));
  EXPECT_NE(err.find("1..5 addresses"), std::string::npos) << err;
  PeerHandle badPrimary = sample("tcp");
  badPrimary.primary = 3;
  err.clear();
  EXPECT_FALSE(tcp.t.encodeHandle(badPrimary, buf, &err));
  EXPECT_NE(err.find("primary 3"), std::string::npos) << err;
  PeerHandle local = sample("tcp");
  local.addrs[2].addr.ss_family = AF_UNIX;
  err.clear();
  EXPECT_FALSE(tcp.t.encodeHandle(local, buf, &err));
  EXPECT_NE(err.find("handle address 2 is neither IPv4 nor IPv6"), std::string::npos) << err;
}

TEST(TransportHandle, MalformedPeerHandleIsRefused) {
  Tcp tcp;
  uint8_t buf[128] = {1, 2, 3};
  PeerHandle out;
  std::string err;
  EXPECT_FALSE(tcp.t.decodeHandle(buf, kTransportHandleBytes, &out, &err));
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
}

}  // namespace
