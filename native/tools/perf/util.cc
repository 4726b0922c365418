// railover-perf helpers; see util.h.
#include "tools/perf/util.h"

#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

namespace rperf {

bool parseSize(const std::string& in, uint64_t* out) {
  if (in.empty()) return false;
  size_t i = 0;
  uint64_t v = 0;
  while (i < in.size() && isdigit((unsigned char)in[i])) {
    uint64_t d = uint64_t(in[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
    i++;
  }
  if (i == 0) return false;
  std::string suf = in.substr(i);
  for (auto& c : suf) c = char(toupper((unsigned char)c));
  uint64_t mult = 1;
  if (suf.empty() || suf == "B") mult = 1;
  else if (suf == "K" || suf == "KB" || suf == "KIB") mult = 1ull << 10;
  else if (suf == "M" || suf == "MB" || suf == "MIB") mult = 1ull << 20;
  else if (suf == "G" || suf == "GB" || suf == "GIB") mult = 1ull << 30;
  else if (suf == "T" || suf == "TB" || suf == "TIB") mult = 1ull << 40;
  else return false;
  if (v != 0 && mult > UINT64_MAX / v) return false;
  *out = v * mult;
  return true;
}

bool parseSeconds(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = strtod(s.c_str(), &end);
  if (errno || end == s.c_str() || *end != '\0' || !(v >= 0)) return false;
  *out = v;
  return true;
}

std::string humanBytes(uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = double(b);
  while (v >= 1024 && u < 4 && (b % 1024 == 0 || v >= 10240)) {
    v /= 1024;
    b /= 1024;
    u++;
  }
  return strf(v == double(uint64_t(v)) ? "%.0f %s" : "%.1f %s", v, units[u]);
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) vsnprintf(&s[0], size_t(n) + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

std::string jsonEscape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 8);
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) o += strf("\\u%04x", c);
        else o += char(c);
    }
  }
  return o;
}

static std::atomic<int> gLogRank{-1};
static std::atomic<bool> gVerbose{false};
void setLogRank(int rank) { gLogRank = rank; }
void setVerbose(bool v) { gVerbose = v; }
bool verbose() { return gVerbose.load(); }

static void vlog(const char* level, const char* fmt, va_list ap) {
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  char line[2200];
  int n = snprintf(line, sizeof line, "railover-perf[rank %d] %s: %s\n", gLogRank.load(), level, msg);
  if (n > 0) fwrite(line, 1, size_t(n) < sizeof line ? size_t(n) : sizeof line - 1, stderr);
}
void logWarn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("WARN", fmt, ap);
  va_end(ap);
}
void logError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("ERROR", fmt, ap);
  va_end(ap);
}
void logInfo(const char* fmt, ...) {
  if (!gVerbose.load()) return;
  va_list ap;
  va_start(ap, fmt);
  vlog("INFO", fmt, ap);
  va_end(ap);
}

Fatal& Fatal::get() {
  static Fatal f;
  return f;
}
void Fatal::raise(int exitCode, const std::string& msg) {
  {
    std::lock_guard<std::mutex> g(mu_);
    msgs_.push_back(msg);
  }
  int expected = 0;
  code_.compare_exchange_strong(expected, exitCode, std::memory_order_acq_rel);
  logError("%s", msg.c_str());
}
void Fatal::raisePlugin(int exitCode, const std::string& msg) {
  if (tolerate_ && !aborted() && tolerate_()) {
    {
      std::lock_guard<std::mutex> g(mu_);
      warnings_.push_back(msg + " (after a peer exited)");
    }
    halted_.store(true, std::memory_order_release);
    logWarn("%s (a peer has exited; stopping early)", msg.c_str());
    return;
  }
  raise(exitCode, msg);
}
std::vector<std::string> Fatal::warnings() {
  std::lock_guard<std::mutex> g(mu_);
  return warnings_;
}
std::vector<std::string> Fatal::messages() {
  std::lock_guard<std::mutex> g(mu_);
  return msgs_;
}

}  // namespace rperf
