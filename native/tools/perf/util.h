// railover-perf: small shared helpers (clocks, size parsing, hashing, error state).
//
// Units: times are CLOCK_MONOTONIC microseconds (uint64_t "Us" suffix) unless a name says
// otherwise; sizes are bytes.
// Thread-safety: the free functions are pure or use only thread-safe libc calls; Fatal is safe
// to use from every thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace rperf {

// Exit codes of railover-perf (documented in main.cc's usage text).
enum ExitCode : int {
  kExitOk = 0,
  kExitWrongData = 1,   // the run completed but some received bytes were wrong
  kExitUsage = 2,       // bad command line, plugin not loadable, bad device
  kExitPlugin = 3,      // a plugin call returned non-success (or broke the ABI contract)
  kExitTimeout = 4,     // a request, setup step or plugin call exceeded --op-timeout
  kExitPeer = 5,        // rendezvous failure or a peer vanished in a benchmark run
  kExitInternal = 6,    // driver bug / resource failure (allocation, threads)
};

// CLOCK_MONOTONIC in microseconds / nanoseconds.
inline uint64_t nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000ull + uint64_t(ts.tv_nsec) / 1000ull;
}
inline uint64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}
inline uint64_t secToUs(double s) { return s <= 0 ? 0 : uint64_t(s * 1e6); }

// 64-bit finalising mixer (bijective; good avalanche). Used to derive test data.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Parses "8", "1K", "1M", "256M", "2G", "64KiB", "1MB" (binary multiples, like nccl-tests).
// Returns false on malformed input or overflow.
bool parseSize(const std::string& s, uint64_t* out);
// Parses a non-negative decimal number of seconds ("0.5", "30").
bool parseSeconds(const std::string& s, double* out);
// "512 KiB" style rendering for logs.
std::string humanBytes(uint64_t b);
// printf into std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Escape for JSON string literals (without the surrounding quotes).
std::string jsonEscape(const std::string& s);

// Driver log lines on stderr ("railover-perf[rank R] LEVEL: msg"); not filtered by NCCL_DEBUG
// except info(), which prints only when NCCL_DEBUG is INFO or TRACE, or with --verbose.
void setLogRank(int rank);
void setVerbose(bool v);
bool verbose();
void logWarn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void logInfo(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void logError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Process-wide fatal-error state. The first raise() decides the exit code; every message is
// printed (stderr) and kept for the JSON report. Waits everywhere check aborted().
class Fatal {
 public:
  static Fatal& get();
  void raise(int exitCode, const std::string& msg);
  // For errors returned by the plugin: like raise(), except when the tolerance hook (timed runs)
  // says a peer has exited (it may wait a short grace period for the rendezvous to notice); then
  // the error is the peer's doing: it is kept as a warning and only halts the data path.
  void raisePlugin(int exitCode, const std::string& msg);
  void setPeerExitTolerance(std::function<bool()> peerGone) { tolerate_ = std::move(peerGone); }
  bool aborted() const { return code_.load(std::memory_order_acquire) != 0; }
  // aborted(), or a tolerated plugin error stopped the data path.
  bool halted() const { return aborted() || halted_.load(std::memory_order_acquire); }
  int code() const { return code_.load(std::memory_order_acquire); }
  std::vector<std::string> messages();
  std::vector<std::string> warnings();

 private:
  std::atomic<int> code_{0};
  std::atomic<bool> halted_{false};
  std::function<bool()> tolerate_;
  std::mutex mu_;
  std::vector<std::string> msgs_, warnings_;
};

// Thrown by waits when Fatal::aborted() becomes true or the run must stop early; caught at the
// top of each worker / phase. Carries no data: the reason is in Fatal or in the stop flag.
struct Aborted {};

}  // namespace rperf
