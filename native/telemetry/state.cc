#include "telemetry/state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "failover/link.h"
#include "health/health.h"
#include "plugin/runtime.h"
#include "telemetry/journal.h"

namespace railover {
namespace {

std::string gPath;

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

bool makeDir(const std::string& d) {
  if (mkdir(d.c_str(), 0750) == 0) return true;
  struct stat st;
  return errno == EEXIST && stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && access(d.c_str(), W_OK) == 0;
}

std::string render(const std::string& start, const std::string& host) {
  auto& rt = Runtime::get();
  Health* hl = Health::get();
  std::string o = "{\"version\":1,\"pid\":" + std::to_string(getpid()) + ",\"start_time\":" + start +
                  ",\"host\":" + jsonStr(host) + ",\"updated_us\":" + std::to_string(nowUs()) +
                  ",\"event_log\":" + jsonStr(rt.cfg.eventLog) +
                  ",\"transport\":" + jsonStr(rt.transport ? rt.transport->name() : "") + ",\"nics\":[";
  for (size_t i = 0; i < rt.nics.size(); ++i) {
    const Nic& n = rt.nics[i];
    if (i) o += ",";
    o += "{\"index\":" + std::to_string(n.index) + ",\"name\":" + jsonStr(n.name) + ",\"addr\":" +
         jsonStr(addrToString(n.getAddr(nullptr))) + ",\"rail\":" + std::to_string(n.rail) +
         ",\"speed_mbps\":" + std::to_string(n.speedMbps) + ",\"up\":" + (!hl || hl->nicUp((int)i) ? "true" : "false") + "}";
  }
  o += "],\"pairs\":" + (hl ? hl->pairsJson() : std::string("[]")) + ",\"comms\":[";
  LinkCounters tot;
  uint64_t fatals = 0;
  bool first = true;
  int ncomms = 0;
  rt.links.forEach([&](Link& l) {
    LinkSnap s = l.snapshot();
    if (s.secret == 0) return;
    ++ncomms;
    if (!first) o += ",";
    first = false;
    auto nic = [&](int i) { return i >= 0 && i < (int)rt.nics.size() ? rt.nics[i].name : std::string(); };
    o += "{\"id\":\"" + std::to_string(s.secret) + "\",\"dir\":\"" + (s.isSend ? "send" : "recv") + "\",\"peer\":" +
         jsonStr(s.peer) + ",\"active_nic\":" + jsonStr(s.active >= 0 && s.active < (int)s.paths.size() ? nic(s.paths[s.active].localNic) : "") +
         ",\"primary_nic\":" + jsonStr(s.primary < (int)s.paths.size() ? nic(s.paths[s.primary].localNic) : "") +
         ",\"fatal\":" + (s.fatal ? "true" : "false") + ",\"failovers\":" + std::to_string(s.counters.failovers) +
         ",\"failbacks\":" + std::to_string(s.counters.failbacks) + ",\"flaps\":" + std::to_string(s.counters.flaps) +
         ",\"bytes_resent\":" + std::to_string(s.counters.bytesResent) + ",\"last_detection_us\":" +
         std::to_string(s.counters.lastDetectUs) + ",\"last_convergence_us\":" + std::to_string(s.counters.lastConvergeUs) +
         ",\"paths\":[";
    for (size_t i = 0; i < s.paths.size(); ++i) {
      const PathSnap& p = s.paths[i];
      if (i) o += ",";
      o += "{\"nic\":" + jsonStr(nic(p.localNic)) + ",\"peer\":" + jsonStr(p.peer) + ",\"state\":\"" +
           pathStateName(p.state) + "\",\"primary\":" + ((int)i == s.primary ? "true" : "false") +
           ",\"flaps\":" + std::to_string(p.flaps) + ",\"hold_down_ms\":" + std::to_string(p.holdDownMs) +
           ",\"last_error\":" + jsonStr(p.lastError) + "}";
    }
    o += "]}";
    tot.failovers += s.counters.failovers, tot.failbacks += s.counters.failbacks, tot.flaps += s.counters.flaps;
    tot.bytesResent += s.counters.bytesResent;
    fatals += s.fatal;
  });
  // Lifetime totals: closed comms keep counting, so metrics built on them never go down.
  uint64_t closedFatals = 0;
  LinkCounters closed = rt.links.closedTotals(&closedFatals);
  tot.failovers += closed.failovers, tot.failbacks += closed.failbacks, tot.flaps += closed.flaps;
  tot.bytesResent += closed.bytesResent;
  fatals += closedFatals;
  o += "],\"totals\":{\"comms\":" + std::to_string(ncomms) + ",\"failovers\":" + std::to_string(tot.failovers) +
       ",\"failbacks\":" + std::to_string(tot.failbacks) + ",\"flaps\":" + std::to_string(tot.flaps) +
       ",\"bytes_resent\":" + std::to_string(tot.bytesResent) + ",\"fatal_errors\":" + std::to_string(fatals) + "}}\n";
  return o;
}

void writer(std::string path) {
  std::string start = procStartTime();
  char hn[256] = {};
  gethostname(hn, sizeof(hn) - 1);
  std::string tmp = path + ".tmp";
  while (true) {
    if (Runtime::get().links.takeDirty()) {
      std::string body = render(start, hn);
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

void stateStart(const Config& cfg, bool dirSet) {
  std::string dir = cfg.stateDir;
  if (dirSet && dir.empty()) return;  // explicitly off
  if (!dirSet) {
    dir = makeDir("/run/railover") ? "/run/railover" : "/tmp/railover-" + std::to_string(getuid());
  }
  if (!makeDir(dir)) {
    RO_WARN("railover: cannot use RAILOVER_STATE_DIR %s (%s); no state file for railover status", dir.c_str(),
            strerror(errno));
    return;
  }
  gPath = dir + "/railover-" + std::to_string(getpid()) + ".json";
  // A process that exits normally (exit() or quick_exit(), which railover-perf uses) removes
  // its file; one that crashes leaves it, and readers recognise it as stale by pid and start
  // time.
  auto cleanup = [] {
    unlink(gPath.c_str());
    unlink((gPath + ".tmp").c_str());
  };
  atexit(cleanup);
  at_quick_exit(cleanup);
  std::thread(writer, gPath).detach();
}

std::string statePath() { return gPath; }

}  // namespace railover
