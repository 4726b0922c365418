// Shared by the engine fuzz targets (fuzz_recv, fuzz_send): a silent NCCL logger and a fake
// NIC description for Runtime::initForTest. Thread-safety: none needed (libFuzzer runs one
// input at a time per process).
#pragma once

#include <arpa/inet.h>

#include "common/log.h"
#include "plugin/devices.h"

namespace railover {
namespace fuzz {

inline void quietLogger(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

// NIC `idx` named `name` with IPv4 address `addr` (dotted quad), rail = idx.
inline Nic makeNic(int idx, const char* name, const char* addr) {
  Nic n;
  n.index = idx, n.name = name, n.rail = idx, n.ifindex = 100 + idx;
  sockaddr_storage a{};
  auto* s = (sockaddr_in*)&a;
  s->sin_family = AF_INET;
  inet_pton(AF_INET, addr, &s->sin_addr);
  n.addr = a, n.addrLen = sizeof(sockaddr_in);
  return n;
}

}  // namespace fuzz
}  // namespace railover
