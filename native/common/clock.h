// Monotonic clock in µs (CLOCK_MONOTONIC): the one clock of railover's event journal, so
// plugin events line up with the Python test bed's fault timestamps.
#pragma once
#include <cstdint>
#include <ctime>

namespace railover {
inline uint64_t nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}
}  // namespace railover
