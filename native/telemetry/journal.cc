#include "telemetry/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "common/clock.h"
#include "common/log.h"

namespace railover {
namespace {
std::atomic<int> gFd{-1};
}

void journalOpen(const std::string& pathIn) {
  if (pathIn.empty() || gFd.load() >= 0) return;
  std::string path = pathIn;
  size_t p = path.find("%p");
  if (p != std::string::npos) path.replace(p, 2, std::to_string(getpid()));
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) path += "/railover-" + std::to_string(getpid()) + ".jsonl";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    RO_WARN("railover: cannot open RAILOVER_EVENT_LOG %s: %m", path.c_str());
    return;
  }
  int expected = -1;
  if (!gFd.compare_exchange_strong(expected, fd)) close(fd);
}

bool journalEnabled() { return gFd.load(std::memory_order_relaxed) >= 0; }

std::string jsonStr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if ((unsigned char)c < 0x20) {
      char b[8];
      snprintf(b, sizeof(b), "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o + "\"";
}

void journalCloseForTest() {
  int fd = gFd.exchange(-1);
  if (fd >= 0) close(fd);
}

namespace jarg {
void put(std::string* out, const char* name, const Str& x) {
  *out += std::string(",\"") + name + "\":" + jsonStr(x.v);
}
void put(std::string* out, const char* name, const U64& x) {
  *out += std::string(",\"") + name + "\":" + std::to_string(x.v);
}
void put(std::string* out, const char* name, const Comm& x) {
  *out += std::string(",\"") + name + "\":\"" + std::to_string(x.v) + "\"";
}
void put(std::string* out, const char* name, const Bool& x) {
  *out += std::string(",\"") + name + "\":" + (x.v ? "true" : "false");
}
void put(std::string* out, const char* name, const OptU64& x) {
  if (x.v) put(out, name, U64(*x.v));
}
}  // namespace jarg

namespace detail {
bool journalOn() { return journalEnabled(); }

void journalWrite(Event e, const std::string& fields) {
  int fd = gFd.load(std::memory_order_acquire);
  if (fd < 0) return;
  // `fields` starts with a comma (jarg::put writes ",\"name\":value").
  std::string line = "{\"t_us\":" + std::to_string(nowUs()) + ",\"pid\":" + std::to_string(getpid()) +
                     ",\"event\":\"" + eventName(e) + "\"" + fields + "}\n";
  ssize_t n = write(fd, line.data(), line.size());
  (void)n;
}
}  // namespace detail

}  // namespace railover
