// Logging through NCCL's logger (so NCCL_DEBUG / NCCL_DEBUG_SUBSYS filter railover's lines),
// with a stderr fallback before NCCL hands a logger over (railover-perf, unit tests).
//
// Thread-safety: the logger pointer is an atomic; log calls are safe from any thread.
#pragma once

#include <cstdarg>

#include "abi/nccl_net_abi.h"

namespace railover {

// Install NCCL's logger (may be called again after a plugin reload; last one wins).
void setLogger(ncclDebugLogger_t fn);

// printf-style log line at `level` for subsystem mask `flags`.
void logf(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Rate limit for per-comm failover/failback WARNs: one NIC fault moves every comm on it, and
// 1024 identical WARN lines would bury the one that matters. Returns RO_LOG_WARN for the first
// kEventWarnsPerSecond calls in each second (process-wide), RO_LOG_INFO after that; when a
// new second starts after suppression, *suppressed says how many went to INFO (else 0).
// Thread-safe.
constexpr int kEventWarnsPerSecond = 8;
ncclDebugLogLevel eventWarnLevel(unsigned* suppressed);

}  // namespace railover

// A WARN for a per-comm event, demoted to INFO (subsystem NET) beyond the rate limit above.
#define RO_WARN_EVENT(fmt, ...)                                                                       \
  do {                                                                                               \
    unsigned ro_sup_ = 0;                                                                            \
    ncclDebugLogLevel ro_lvl_ = ::railover::eventWarnLevel(&ro_sup_);                                \
    if (ro_sup_)                                                                                     \
      ::railover::logf(RO_LOG_WARN, RO_SUBSYS_ALL, __FILE__, __LINE__,                               \
                       "railover: %u more per-comm failover messages in the last second went to INFO (NCCL_DEBUG=INFO "  \
                       "shows them)", ro_sup_);                                                      \
    ::railover::logf(ro_lvl_, ro_lvl_ == RO_LOG_WARN ? RO_SUBSYS_ALL : RO_SUBSYS_NET, __FILE__, __LINE__, fmt, \
                     ##__VA_ARGS__);                                                                 \
  } while (0)

#define RO_WARN(...) ::railover::logf(RO_LOG_WARN, RO_SUBSYS_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define RO_INFO(flags, ...) ::railover::logf(RO_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define RO_TRACE(flags, ...) ::railover::logf(RO_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)
