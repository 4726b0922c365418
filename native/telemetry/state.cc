#include "telemetry/state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "telemetry/journal.h"

namespace railover {
namespace {

std::string gPath;
// Guards writing the file against the exit cleanup removing it (the writer thread is detached
// and may still run while the process exits). Leaked on purpose: it must outlive every static
// destructor that runs at exit.
std::mutex& gFileMu = *new std::mutex;
bool gExiting = false;  // under gFileMu: the file was removed for good

std::string procStartTime() {
  FILE* f = fopen("/proc/self/stat", "r");
  if (!f) return "0";
  char buf[1024] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // fields after the command name; starttime is field 22
  if (!p) return "0";
  int field = 2;
  for (; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::string(p, strcspn(p, " "));
}

// Creates directory `d` (0750) or accepts an existing writable one. false with *why (if given)
// naming the reason: mkdir's error, "not a directory" or "not writable".
bool makeDir(const std::string& d, std::string* why = nullptr) {
  if (mkdir(d.c_str(), 0750) == 0) return true;
  int e = errno;
  struct stat st;
  std::string r;
  if (e != EEXIST) r = strerror(e);
  else if (stat(d.c_str(), &st) != 0) r = strerror(errno);
  else if (!S_ISDIR(st.st_mode)) r = "it exists and is not a directory";
  else if (access(d.c_str(), W_OK) != 0) r = std::string("not writable: ") + strerror(errno);
  else return true;
  if (why) *why = r;
  return false;
}

// The envelope: the process's identity and the time of this update, then the source's members.
std::string render(const std::string& start, const std::string& host, const StateSource& src) {
  std::string o = "{\"version\":1,\"pid\":" + std::to_string(getpid()) + ",\"start_time\":" + start +
                  ",\"host\":" + jsonStr(host) + ",\"updated_us\":" + std::to_string(nowUs()) + ",";
  o += src.renderFields();
  o += "}\n";
  return o;
}

void writer(std::string path, StateSource src) {
  std::string start = procStartTime();
  char hn[256] = {};
  gethostname(hn, sizeof(hn) - 1);
  std::string tmp = path + ".tmp";
  while (true) {
    if (src.takeChanged()) {
      std::string body = render(start, hn, src);
      // The file is written and renamed under gFileMu, and never again once the process's exit
      // cleanup removed it (that cleanup takes the same mutex), so a write racing the exit
      // cannot bring the file back after it was removed.
      std::lock_guard<std::mutex> g(gFileMu);
      if (gExiting) return;
      int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
      if (fd >= 0) {
        ssize_t n = write(fd, body.data(), body.size());
        close(fd);
        if (n == (ssize_t)body.size()) rename(tmp.c_str(), path.c_str());
      }
    }
    // Paces the writer: at most one file every 100 ms, whatever the rate of changes.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

void stateStart(const Config& cfg, bool dirSet, StateSource src) {
  std::string dir = cfg.stateDir;
  if (dirSet && dir.empty()) return;  // explicitly off
  if (!dirSet) {
    dir = makeDir("/run/railover") ? "/run/railover" : "/tmp/railover-" + std::to_string(getuid());
  }
  std::string why;
  if (!makeDir(dir, &why)) {
    RO_WARN("railover: cannot use RAILOVER_STATE_DIR %s (%s); no state file for railover status", dir.c_str(),
            why.c_str());
    return;
  }
  gPath = dir + "/railover-" + std::to_string(getpid()) + ".json";
  // A process that exits normally (exit() or quick_exit(), which railover-perf uses) removes
  // its file; one that crashes leaves it, and readers recognise it as stale by pid and start
  // time.
  atexit(stateRemove);
  at_quick_exit(stateRemove);
  std::thread(writer, gPath, std::move(src)).detach();
}

std::string statePath() { return gPath; }

void stateRemove() {
  std::lock_guard<std::mutex> g(gFileMu);
  gExiting = true;
  if (gPath.empty()) return;
  unlink(gPath.c_str());
  unlink((gPath + ".tmp").c_str());
}

}  // namespace railover
