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

}  // namespace railover

#define RO_WARN(...) ::railover::logf(RO_LOG_WARN, RO_SUBSYS_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define RO_INFO(flags, ...) ::railover::logf(RO_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define RO_TRACE(flags, ...) ::railover::logf(RO_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)
