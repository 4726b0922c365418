// Captures railover's log lines in tests, through the NCCL logger hook (railover::setLogger, or
// the logger NCCL passes to a net's init): each line "WARN <text>" or "INFO <text>" (TRACE
// lines count as INFO). One store per test binary, shared by every test in it: clear() it
// where a test reads only its own lines. Header only. Thread-safe (the plugin logs from its
// worker, fence and health threads).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "abi/nccl_net_abi.h"

namespace railover {
namespace testlog {

inline std::mutex& mu() {
  static std::mutex m;
  return m;
}
inline std::vector<std::string>& store() {
  static std::vector<std::string> s;
  return s;
}

// The logger to install (an ncclDebugLogger_t).
inline void capture(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(mu());
  store().push_back(std::string(level == RO_LOG_WARN ? "WARN " : "INFO ") + buf);
}

inline void clear() {
  std::lock_guard<std::mutex> g(mu());
  store().clear();
}

// The captured lines containing `s`, in order.
inline std::vector<std::string> linesWith(const std::string& s) {
  std::lock_guard<std::mutex> g(mu());
  std::vector<std::string> out;
  for (const std::string& l : store())
    if (l.find(s) != std::string::npos) out.push_back(l);
  return out;
}
inline size_t count(const std::string& s) { return linesWith(s).size(); }

// Every captured line, one per line (for failure messages).
inline std::string all() {
  std::lock_guard<std::mutex> g(mu());
  std::string out;
  for (const std::string& l : store()) out += l + "\n";
  return out;
}

}  // namespace testlog
}  // namespace railover
