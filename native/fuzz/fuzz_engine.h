// Shared by the engine fuzz targets (fuzz_recv, fuzz_send): a silent NCCL logger and a fake
// NIC description for Runtime::initForTest. Thread-safety: none needed (libFuzzer runs one
// input at a time per process).
#pragma once

#include "common/log.h"
#include "plugin/devices.h"
#include "tests/test_nic.h"

namespace railover {
namespace fuzz {

inline void quietLogger(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

// makeNic(idx, name, addr): NIC `idx` named `name` with IPv4 address `addr` (dotted quad),
// rail = idx (tests/test_nic.h, shared with the engine test suites).
using testbed::makeNic;

}  // namespace fuzz
}  // namespace railover
