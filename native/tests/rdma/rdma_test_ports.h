// Shared by the RDMA transport's unit tests: the fake HCA ports a test transport is built on,
// IPv4 socket addresses for the fake bootstrap streams, and buffer registration.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "transport/rdma/rdma_transport.h"
#include "transport/verbs/verbs_device.h"

namespace railover {
namespace rdmatest {

// Port `port` of fake HCA `dev` as RoCE v2 at GID index 1, with the GID rxe shows: the
// IPv4-mapped address of the netdev (::ffff:10.<last char of dev>.0.<port>). A real endpoint
// never carries an all-zero GID, and QpEndpoint::unpack refuses one.
inline verbs::PortSel portOf(const char* dev, int port) {
  verbs::PortSel p;
  p.dev = dev;
  p.port = port;
  p.gidIndex = 1;
  p.roce = true;
  p.gid.raw[10] = p.gid.raw[11] = 0xff;
  p.gid.raw[12] = 10;
  p.gid.raw[13] = static_cast<uint8_t>(dev[std::strlen(dev) - 1]);
  p.gid.raw[15] = static_cast<uint8_t>(port);
  return p;
}

// A GID table entry: `text` (an IPv6 address, e.g. "::ffff:10.0.0.1") of `type`
// (IBV_GID_TYPE_ROCE_V2, ...) bound to netdev `ifindex`, for fake::setGids.
inline ibv_gid_entry gidOn(const char* text, uint32_t type, uint32_t ifindex) {
  ibv_gid_entry e{};
  inet_pton(AF_INET6, text, e.gid.raw);
  e.gid_type = type;
  e.ndev_ifindex = ifindex;
  return e;
}

// AF_INET address ip:port.
inline sockaddr_storage addrOf(const char* ip, uint16_t port) {
  sockaddr_storage s{};
  auto* in = reinterpret_cast<sockaddr_in*>(&s);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  inet_pton(AF_INET, ip, &in->sin_addr);
  return s;
}

// Registers `b` with transport `t` (a test failure names the error) and keeps the handle in
// `mrs` for the fixture's teardown to deregister.
inline void* regBuffer(rdma::RdmaTransport& t, std::vector<uint8_t>& b, std::vector<void*>& mrs) {
  std::string err;
  void* m = t.regMr(b.data(), b.size(), &err);
  EXPECT_TRUE(m) << err;
  mrs.push_back(m);
  return m;
}

}  // namespace rdmatest
}  // namespace railover
