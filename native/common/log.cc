#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/clock.h"
#include "common/tuning.h"

namespace railover {
namespace {
std::atomic<ncclDebugLogger_t> gLogger{nullptr};

// Fallback level from NCCL_DEBUG when no NCCL logger exists (WARN by default).
int fallbackLevel() {
  static int lvl = [] {
    const char* s = getenv("NCCL_DEBUG");
    if (!s) return (int)RO_LOG_WARN;
    if (!strcasecmp(s, "TRACE")) return (int)RO_LOG_TRACE;
    if (!strcasecmp(s, "INFO")) return (int)RO_LOG_INFO;
    if (!strcasecmp(s, "VERSION")) return (int)RO_LOG_VERSION;
    return (int)RO_LOG_WARN;
  }();
  return lvl;
}
}  // namespace

ncclDebugLogLevel eventWarnLevel(unsigned* suppressed) {
  static std::mutex mu;
  static uint64_t windowStartUs = 0;
  static unsigned inWindow = 0, demoted = 0;
  std::lock_guard<std::mutex> g(mu);
  uint64_t now = nowUs();
  *suppressed = 0;
  if (now - windowStartUs >= tuning::kEventWarnWindowUs) {
    *suppressed = demoted;
    windowStartUs = now, inWindow = 0, demoted = 0;
  }
  if (++inWindow <= (unsigned)kEventWarnsPerSecond) return RO_LOG_WARN;
  demoted++;
  return RO_LOG_INFO;
}

void setLogger(ncclDebugLogger_t fn) { gLogger.store(fn, std::memory_order_release); }

void logf(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  ncclDebugLogger_t fn = gLogger.load(std::memory_order_acquire);
  if (fn) {
    fn(level, flags, file, line, "%s", buf);
    return;
  }
  if ((int)level > fallbackLevel() || level == RO_LOG_NONE) return;
  const char* tag = level == RO_LOG_WARN ? "WARN" : level == RO_LOG_INFO ? "INFO" : "TRACE";
  fprintf(stderr, "railover %s %s\n", tag, buf);
}

}  // namespace railover
