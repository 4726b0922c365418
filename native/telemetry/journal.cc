#include "telemetry/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "common/clock.h"
#include "common/log.h"

namespace railover {

void Journal::emit(Event e, const std::string& fields) {
  // `fields` starts with a comma (jarg::put writes ",\"name\":value").
  writeLine("{\"t_us\":" + std::to_string(nowUs()) + ",\"pid\":" + std::to_string(getpid()) + ",\"event\":\"" +
            eventName(e) + "\"" + fields + "}\n");
}

FileJournal::FileJournal(const std::string& pathIn) {
  if (pathIn.empty()) return;
  std::string path = pathIn;
  const std::string pid = std::to_string(getpid());
  for (size_t p = path.find("%p"); p != std::string::npos; p = path.find("%p", p + pid.size()))
    path.replace(p, 2, pid);  // every "%p", as the readers and the docs take it
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    path += (path.back() == '/' ? "railover-" : "/railover-") + std::to_string(getpid()) + ".jsonl";
  if (path[0] != '/') {  // relative to this process's working directory: readers run elsewhere
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd)) path = std::string(cwd) + "/" + path;
  }
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    RO_WARN("railover: cannot open RAILOVER_EVENT_LOG %s: %m", path.c_str());
    return;
  }
  fd_ = fd;
  path_ = path;
}

FileJournal::~FileJournal() {
  if (fd_ >= 0) close(fd_);
}

void FileJournal::writeLine(const std::string& line) {
  if (fd_ < 0) return;
  ssize_t n = write(fd_, line.data(), line.size());
  (void)n;
}

std::vector<std::string> MemoryJournal::lines() const {
  std::lock_guard<std::mutex> g(mu_);
  return lines_;
}

std::vector<std::string> MemoryJournal::events(const std::string& name) const {
  std::string key = ",\"event\":\"" + name + "\"";
  std::vector<std::string> out;
  std::lock_guard<std::mutex> g(mu_);
  for (const std::string& l : lines_)
    if (l.find(key) != std::string::npos) out.push_back(l);
  return out;
}

void MemoryJournal::writeLine(const std::string& line) {
  std::lock_guard<std::mutex> g(mu_);
  lines_.push_back(line);
}

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

}  // namespace railover
