// A fake NIC description for Runtime::initForTest, shared by the engine test suites
// (tests/engine_common/bed.h) and the engine fuzz targets (fuzz/fuzz_engine.h). Header only;
// needs nothing but plugin/devices.h, so the engine-only test binary may include it.
#pragma once

#include <arpa/inet.h>

#include "plugin/devices.h"

namespace railover {
namespace testbed {

// NIC `idx` named `name` with IPv4 address `addr` (dotted quad) on rail `rail` (rail < 0: the
// rail is `idx`); ifindex 100 + idx; no PCI path (a virtual NIC), Nic's default speed.
inline Nic makeNic(int idx, const char* name, const char* addr, int rail = -1) {
  Nic n;
  n.index = idx, n.name = name, n.rail = rail < 0 ? idx : rail, n.ifindex = 100 + idx;
  sockaddr_storage a{};
  auto* s = (sockaddr_in*)&a;
  s->sin_family = AF_INET;
  inet_pton(AF_INET, addr, &s->sin_addr);
  n.addr = a, n.addrLen = sizeof(sockaddr_in);
  return n;
}

}  // namespace testbed
}  // namespace railover
