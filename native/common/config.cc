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

bool blank(const char* s) {
  for (; *s; ++s)
    if (*s != ' ' && *s != '\t') return false;
  return true;
}

// Binds each numeric plugin variable to its Config field (set and read back).
struct UintField {
  const char* name;
  void (*set)(Config&, uint64_t);
  uint64_t (*get)(const Config&);
};
#define RO_UINT_FIELD(var, member)                                           \
  UintField {                                                                \
    var, [](Config& c, uint64_t v) { c.member = (decltype(c.member))v; },    \
        [](const Config& c) { return (uint64_t)c.member; }                   \
  }
const UintField kUintFields[] = {
    RO_UINT_FIELD("RAILOVER_NSTREAMS", nStreams),
    RO_UINT_FIELD("RAILOVER_MIN_CHUNK_BYTES", minChunkBytes),
    RO_UINT_FIELD("RAILOVER_HOLD_DOWN_MS", holdDownMs),
    RO_UINT_FIELD("RAILOVER_HOLD_DOWN_MAX_MS", holdDownMaxMs),
    RO_UINT_FIELD("RAILOVER_FATAL_TIMEOUT", fatalTimeoutS),
    RO_UINT_FIELD("RAILOVER_PROBE_INTERVAL_MS", probeIntervalMs),
    RO_UINT_FIELD("RAILOVER_PROBE_MULT", probeMultiplier),
    RO_UINT_FIELD("RAILOVER_BACKOFF_MAX_MS", backoffMaxMs),
    RO_UINT_FIELD("RAILOVER_TCP_USER_TIMEOUT_MS", tcpUserTimeoutMs),
    RO_UINT_FIELD("RAILOVER_STALL_MS", stallMs),
    RO_UINT_FIELD("RAILOVER_PROBE_BACKOFF_MAX_MS", probeBackoffMaxMs),
    RO_UINT_FIELD("RAILOVER_ABORT_ON_FATAL", abortOnFatal),
};
#undef RO_UINT_FIELD

constexpr size_t countPluginUints() {
  size_t n = 0;
  for (const ParamSpec& p : kParams)
    n += (p.type == ParamType::kUint || p.type == ParamType::kFlag) && (p.readers & kReadPlugin);
  return n;
}
static_assert(countPluginUints() == sizeof(kUintFields) / sizeof(kUintFields[0]),
              "every numeric or flag plugin variable in kParams needs exactly one Config field in kUintFields");

const UintField* uintField(const char* name) {
  for (const UintField& f : kUintFields)
    if (!strcmp(f.name, name)) return &f;
  return nullptr;
}

std::string bad(const ParamSpec& p, const char* value, const std::string& why) {
  return std::string(p.name) + "='" + value + "' is not valid: " + why;
}

// Parses one non-empty value of plugin variable `p` into `c`.
bool parseOne(const ParamSpec& p, const char* s, Config& c, std::string* err) {
  switch (p.type) {
    case ParamType::kFlag:  // 0 or 1, parsed like a number into its Config field
    case ParamType::kUint: {
      const UintField* f = uintField(p.name);
      uint64_t v = 0;
      if (!f) return *err = std::string("internal error: ") + p.name + " has no Config field", false;
      if (!parseUint(s, p.lo, p.hi, &v)) return *err = bad(p, s, "expected an integer " + paramRangeText(p)), false;
      if (p.step > 1 && v % p.step)
        return *err = bad(p, s, "must be a multiple of " + std::to_string(p.step)), false;
      f->set(c, v);
      return true;
    }
    case ParamType::kIfnameList: {
      if (!c.ifnamesVar.empty()) return true;  // an earlier variable (RAILOVER_IFNAMES) wins
      std::string body = s;
      if (!body.empty() && body[0] == '^') body = body.substr(1);
      if (!body.empty() && body[0] == '=') body = body.substr(1);
      bool ok = !body.empty();
      for (auto& item : split(body, ','))
        if (item.empty() || item.size() > 15 || item.find_first_of(" =^;/") != std::string::npos) ok = false;
      if (!ok)
        return *err = bad(p, s, "expected a comma list of interface-name prefixes, optionally led by '^' "
                                "(exclude) and/or '=' (exact match), e.g. 'eth,ib' or '^=docker0'"),
               false;
      c.ifnames = s, c.ifnamesVar = p.name;
      return true;
    }
    case ParamType::kFamily:
      if (!strcmp(s, "AF_INET")) c.family = AF_INET;
      else if (!strcmp(s, "AF_INET6")) c.family = AF_INET6;
      else return *err = bad(p, s, "expected AF_INET or AF_INET6"), false;
      return true;
    case ParamType::kTransport: {
      std::string v = trim(s);
      if (v == "auto") c.transport = TransportKind::kAuto;
      else if (v == "tcp") c.transport = TransportKind::kTcp;
      else if (v == "rdma") c.transport = TransportKind::kRdma;
      else return *err = bad(p, s, "expected auto, tcp or rdma"), false;
      return true;
    }
    case ParamType::kStandby: {
      std::string v = trim(s);
      if (v == "all") {
        c.standby = StandbyPolicy::kAll;
        return true;
      }
      if (v == "none") {
        c.standby = StandbyPolicy::kNone;
        return true;
      }
      c.standby = StandbyPolicy::kExplicit;
      for (auto& item : split(v, ';')) {
        if (item.empty()) continue;
        auto kv = split(item, '=');
        if (kv.size() != 2 || !validIfname(kv[0]) || !validIfname(kv[1]) || kv[0] == kv[1])
          return *err = bad(p, s, "expected 'all', 'none', or ';'-separated pairs 'primary=standby' of interface "
                                  "names, e.g. 'eth0=eth1;eth1=eth0'"),
                 false;
        c.standbyPairs.emplace_back(kv[0], kv[1]);
      }
      if (c.standbyPairs.empty()) return *err = bad(p, s, "no 'primary=standby' pair given"), false;
      return true;
    }
    case ParamType::kRails:
      for (auto& item : split(s, ',')) {
        auto kv = split(item, '=');
        uint64_t r = 0;
        if (kv.size() != 2 || !validIfname(kv[0]) || !parseUint(kv[1].c_str(), 0, 32767, &r))
          return *err = bad(p, s, "expected a comma list 'ifname=rail' with rail 0..32767, e.g. 'eth0=0,eth1=1'"),
                 false;
        c.rails.emplace_back(kv[0], (int)r);
      }
      return true;
    case ParamType::kPath:
      if (!strcmp(p.name, "RAILOVER_EVENT_LOG")) c.eventLog = s;
      return true;
    case ParamType::kStateDir:
      c.stateDirSet = true;
      c.stateDir = trim(s) == "off" ? std::string() : std::string(s);
      return true;
    case ParamType::kNcclOwned:  // NCCL validates its own variables (log.cc reads NCCL_DEBUG itself)
      return true;
  }
  return true;
}

}  // namespace

const char* transportName(TransportKind t) {
  switch (t) {
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kRdma: return "rdma";
    default: return "auto";
  }
}

const ParamSpec* findParam(const char* name) {
  for (const ParamSpec& p : kParams)
    if (!strcmp(p.name, name)) return &p;
  return nullptr;
}

std::string paramRangeText(const ParamSpec& p) {
  std::string s = std::to_string(p.lo) + ".." + std::to_string(p.hi);
  if (*p.unit) s += std::string(" ") + p.unit;
  if (p.step > 1) s += ", multiple of " + std::to_string(p.step);
  if (*p.accepted) s += std::string("; ") + p.accepted;
  return s;
}

bool configUintField(const char* name, const Config& c, uint64_t* out) {
  const UintField* f = uintField(name);
  if (!f) return false;
  *out = f->get(c);
  return true;
}

bool parseConfig(const EnvLookup& env, Config* out, std::string* err) {
  Config c;
  for (const ParamSpec& p : kParams) {
    if (!(p.readers & kReadPlugin)) continue;
    const char* s = env(p.name);
    if (!s || blank(s)) continue;  // empty = unset: the default applies
    if (!parseOne(p, s, c, err)) return false;
  }
  if (c.holdDownMaxMs < c.holdDownMs) c.holdDownMaxMs = c.holdDownMs;
  *out = c;
  return true;
}

bool checkParam(const char* name, const char* value, std::string* err) {
  const ParamSpec* p = findParam(name);
  if (!p) return *err = std::string(name) + " is not a railover variable", false;
  if (!(p->readers & kReadPlugin) || !value || blank(value)) return true;
  Config c;
  return parseOne(*p, value, c, err);
}

}  // namespace railover
