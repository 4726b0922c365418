#include "common/config.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace railover {

EnvLookup processEnv() {
  return [](const char* k) -> const char* { return getenv(k); };
}

bool parseUint(const char* s, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (!s || !*s) return false;
  for (const char* p = s; *p; ++p)
    if (*p < '0' || *p > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(trim(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start)));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

bool validIfname(const std::string& s) { return !s.empty() && s.size() < 16 && s.find_first_of(" =,;/") == std::string::npos; }

struct UintVar {
  const char* name;
  uint64_t lo, hi;
  const char* unit;
};

bool getUint(const EnvLookup& env, const UintVar& v, uint64_t* dst, std::string* err) {
  const char* s = env(v.name);
  if (!s) return true;
  if (!parseUint(s, v.lo, v.hi, dst)) {
    *err = std::string(v.name) + "='" + s + "' is not valid: expected an integer " + std::to_string(v.lo) +
           ".." + std::to_string(v.hi) + " (" + v.unit + ")";
    return false;
  }
  return true;
}

template <typename T>
bool getNum(const EnvLookup& env, const UintVar& v, T* dst, std::string* err) {
  uint64_t x = *dst;
  if (!getUint(env, v, &x, err)) return false;
  *dst = (T)x;
  return true;
}

}  // namespace

bool parseConfig(const EnvLookup& env, Config* out, std::string* err) {
  Config c;
  if (const char* s = env("RAILOVER_IFNAMES")) {
    c.ifnames = s, c.ifnamesVar = "RAILOVER_IFNAMES";
  } else if (const char* s2 = env("NCCL_SOCKET_IFNAME")) {
    c.ifnames = s2, c.ifnamesVar = "NCCL_SOCKET_IFNAME";
  }
  if (!c.ifnamesVar.empty()) {
    std::string body = c.ifnames;
    if (!body.empty() && body[0] == '^') body = body.substr(1);
    if (!body.empty() && body[0] == '=') body = body.substr(1);
    bool ok = !body.empty();
    for (auto& p : split(body, ','))
      if (p.empty() || p.size() > 15 || p.find_first_of(" =^;/") != std::string::npos) ok = false;
    if (!ok) {
      *err = c.ifnamesVar + "='" + c.ifnames +
             "' is not valid: expected a comma list of interface-name prefixes, optionally led by '^' "
             "(exclude) and/or '=' (exact match), e.g. 'eth,ib' or '^=docker0'";
      return false;
    }
  }
  if (const char* s = env("NCCL_SOCKET_FAMILY")) {
    if (!strcmp(s, "AF_INET")) c.family = AF_INET;
    else if (!strcmp(s, "AF_INET6")) c.family = AF_INET6;
    else {
      *err = std::string("NCCL_SOCKET_FAMILY='") + s + "' is not valid: expected AF_INET or AF_INET6";
      return false;
    }
  }
  if (!getNum(env, {"RAILOVER_NSTREAMS", 1, 16, "TCP streams per path"}, &c.nStreams, err)) return false;
  if (!getNum(env, {"RAILOVER_MIN_CHUNK_BYTES", 128, 1 << 20, "bytes, multiple of 128"}, &c.minChunkBytes, err))
    return false;
  if (c.minChunkBytes % 128) {
    *err = "RAILOVER_MIN_CHUNK_BYTES=" + std::to_string(c.minChunkBytes) + " is not valid: must be a multiple of 128";
    return false;
  }
  if (const char* s = env("RAILOVER_STANDBY")) {
    std::string v = trim(s);
    if (v == "all" || v.empty()) {
      c.standby = StandbyPolicy::kAll;
    } else if (v == "none") {
      c.standby = StandbyPolicy::kNone;
    } else {
      c.standby = StandbyPolicy::kExplicit;
      for (auto& item : split(v, ';')) {
        if (item.empty()) continue;
        auto kv = split(item, '=');
        if (kv.size() != 2 || !validIfname(kv[0]) || !validIfname(kv[1]) || kv[0] == kv[1]) {
          *err = std::string("RAILOVER_STANDBY='") + s +
                 "' is not valid: expected 'all', 'none', or ';'-separated pairs 'primary=standby' of interface "
                 "names, e.g. 'eth0=eth1;eth1=eth0'";
          return false;
        }
        c.standbyPairs.emplace_back(kv[0], kv[1]);
      }
      if (c.standbyPairs.empty()) {
        *err = std::string("RAILOVER_STANDBY='") + s + "' is not valid: no 'primary=standby' pair given";
        return false;
      }
    }
  }
  if (const char* s = env("RAILOVER_RAILS")) {
    for (auto& item : split(s, ',')) {
      auto kv = split(item, '=');
      uint64_t r = 0;
      if (kv.size() != 2 || !validIfname(kv[0]) || !parseUint(kv[1].c_str(), 0, 32767, &r)) {
        *err = std::string("RAILOVER_RAILS='") + s +
               "' is not valid: expected a comma list 'ifname=rail' with rail 0..32767, e.g. 'eth0=0,eth1=1'";
        return false;
      }
      c.rails.emplace_back(kv[0], (int)r);
    }
  }
  if (!getNum(env, {"RAILOVER_HOLD_DOWN_MS", 0, 3600000, "ms"}, &c.holdDownMs, err)) return false;
  if (!getNum(env, {"RAILOVER_HOLD_DOWN_MAX_MS", 0, 86400000, "ms"}, &c.holdDownMaxMs, err)) return false;
  if (c.holdDownMaxMs < c.holdDownMs) c.holdDownMaxMs = c.holdDownMs;
  if (!getNum(env, {"RAILOVER_FATAL_TIMEOUT", 0, 86400 * 7, "s, 0 = never"}, &c.fatalTimeoutS, err)) return false;
  if (!getNum(env, {"RAILOVER_PROBE_INTERVAL_MS", 1, 60000, "ms"}, &c.probeIntervalMs, err)) return false;
  if (!getNum(env, {"RAILOVER_PROBE_MULT", 2, 100, "missed probes"}, &c.probeMultiplier, err)) return false;
  if (!getNum(env, {"RAILOVER_BACKOFF_MAX_MS", 10, 60000, "ms"}, &c.backoffMaxMs, err)) return false;
  if (!getNum(env, {"RAILOVER_PROBE_BACKOFF_MAX_MS", 1, 60000, "ms"}, &c.probeBackoffMaxMs, err)) return false;
  if (!getNum(env, {"RAILOVER_TCP_USER_TIMEOUT_MS", 0, 600000, "ms, 0 = kernel default"}, &c.tcpUserTimeoutMs, err))
    return false;
  if (!getNum(env, {"RAILOVER_STALL_MS", 1, 60000, "ms"}, &c.stallMs, err)) return false;
  {
    uint64_t v = c.abortOnFatal ? 1 : 0;
    if (!getUint(env, {"RAILOVER_ABORT_ON_FATAL", 0, 1, "0 = return ncclSystemError, 1 = exit the process"}, &v, err))
      return false;
    c.abortOnFatal = v != 0;
  }
  if (const char* s = env("RAILOVER_EVENT_LOG")) c.eventLog = s;
  if (const char* s = env("RAILOVER_STATE_DIR")) c.stateDir = s;
  *out = c;
  return true;
}

}  // namespace railover
