// Captures railover's log lines in tests, through the NCCL logger hook (railover::setLogger, or
// the logger NCCL passes to a net's init). Each line keeps the level it was logged at; the
// string views render it "WARN <text>" or "INFO <text>" (TRACE lines render as INFO). One
// store per test binary, shared by every test in it: clear() it where a test reads only its
// own lines, or hold a Scope, which clears it and installs the capture for its lifetime.
// Header only. Thread-safe (the plugin logs from its worker, fence and health threads): every
// function takes the store's mutex; the vectors returned are copies.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "abi/nccl_net_abi.h"
#include "common/log.h"

namespace railover {
namespace testlog {

// One captured line: the level it was logged at and its text (no level prefix).
struct Line {
  ncclDebugLogLevel level;
  std::string text;
};

// Never destroyed: the plugin's threads that live as long as the process (the acceptor, the
// health monitor) may log while the test binary's exit runs static destructors (ASan found
// the acceptor writing into the freed store).
inline std::mutex& mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
inline std::vector<Line>& store() {
  static std::vector<Line>* s = new std::vector<Line>;
  return *s;
}
// "WARN <text>" for a WARN, "INFO <text>" for any other level.
inline std::string render(const Line& l) { return (l.level == RO_LOG_WARN ? "WARN " : "INFO ") + l.text; }

// The logger to install (an ncclDebugLogger_t). Lines longer than 2047 bytes are cut there.
inline void capture(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(mu());
  store().push_back(Line{level, buf});
}

inline void clear() {
  std::lock_guard<std::mutex> g(mu());
  store().clear();
}

// The captured lines, rendered, whose rendering contains `s`, in order.
inline std::vector<std::string> linesWith(const std::string& s) {
  std::lock_guard<std::mutex> g(mu());
  std::vector<std::string> out;
  for (const Line& l : store()) {
    std::string r = render(l);
    if (r.find(s) != std::string::npos) out.push_back(std::move(r));
  }
  return out;
}
inline size_t count(const std::string& s) { return linesWith(s).size(); }

// The captured lines whose text contains every one of `parts`, in order, with their level
// (exact: a TRACE line is RO_LOG_TRACE here, not INFO).
inline std::vector<Line> entriesWith(std::initializer_list<std::string> parts) {
  std::lock_guard<std::mutex> g(mu());
  std::vector<Line> out;
  for (const Line& l : store()) {
    bool all = true;
    for (const std::string& p : parts) all = all && l.text.find(p) != std::string::npos;
    if (all) out.push_back(l);
  }
  return out;
}

// The text (no prefix) of every captured WARN line, in order.
inline std::vector<std::string> warnings() {
  std::lock_guard<std::mutex> g(mu());
  std::vector<std::string> out;
  for (const Line& l : store())
    if (l.level == RO_LOG_WARN) out.push_back(l.text);
  return out;
}

// Every captured line, rendered, one per line (for failure messages).
inline std::string all() {
  std::lock_guard<std::mutex> g(mu());
  std::string out;
  for (const Line& l : store()) out += render(l) + "\n";
  return out;
}

// Captures through railover::setLogger for its lifetime: clears the store and installs
// capture() on construction, installs `restore` (the logger the test ran with; nullptr: the
// default) on destruction. Lines logged outside a Scope are not captured by it.
struct Scope {
  explicit Scope(ncclDebugLogger_t restore) : restore(restore) {
    clear();
    setLogger(&capture);
  }
  ~Scope() { setLogger(restore); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ncclDebugLogger_t restore;
};

}  // namespace testlog
}  // namespace railover
