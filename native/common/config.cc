#include "common/config.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace railover {

EnvLookup processEnv() {
  return [](const char* k) -> const char* { return getenv(k); };
}

bool parseUint(const char* s, uint64_t lo, uint64_t hi, uint64_t* out, bool asNccl) {
  if (!s || !*s) return false;
  int base = 10;
  const char* digits = s;
  if (asNccl && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) base = 16, digits = s + 2;
  else if (asNccl && s[0] == '0' && s[1]) base = 8, digits = s + 1;
  if (!*digits) return false;  // "0x" alone
  for (const char* p = digits; *p; ++p) {
    bool ok = base == 16 ? isxdigit((unsigned char)*p) != 0 : *p >= '0' && *p < '0' + base;
    if (!ok) return false;
  }
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(digits, &end, base);
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
    RO_UINT_FIELD("RAILOVER_TCP_KEEPALIVE_S", tcpKeepaliveS),
    RO_UINT_FIELD("RAILOVER_MAX_RECVS", maxRecvs),
    RO_UINT_FIELD("RAILOVER_STALL_MS", stallMs),
    RO_UINT_FIELD("RAILOVER_FLOW_STALL_MS", flowStallMs),
    RO_UINT_FIELD("RAILOVER_PROBE_BACKOFF_MAX_MS", probeBackoffMaxMs),
    RO_UINT_FIELD("RAILOVER_ABORT_ON_FATAL", abortOnFatal),
    RO_UINT_FIELD("NCCL_IB_ROCE_VERSION_NUM", ib.roceVersion),
    RO_UINT_FIELD("NCCL_IB_TC", ib.trafficClass),
    RO_UINT_FIELD("NCCL_IB_SL", ib.sl),
    RO_UINT_FIELD("NCCL_IB_TIMEOUT", ib.timeout),
    RO_UINT_FIELD("NCCL_IB_RETRY_CNT", ib.retryCnt),
    RO_UINT_FIELD("NCCL_IB_QPS_PER_CONNECTION", ib.qpsPerConnection),
    RO_UINT_FIELD("NCCL_IB_PKEY", ib.pkeyIndex),
    RO_UINT_FIELD("NCCL_IB_PCI_RELAXED_ORDERING", ib.relaxedOrdering),
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
      // Blanks around the number are no part of it, as around a word or a list item. NCCL's
      // own variables are read as NCCL reads them (strtoll base 0: 0x hex, leading-0 octal).
      bool asNccl = !strncmp(p.name, "NCCL_", 5);
      if (!parseUint(trim(s).c_str(), p.lo, p.hi, &v, asNccl))
        return *err = bad(p, s, std::string("expected an integer ") +
                                    (asNccl ? "(decimal, 0x hex or 0-led octal, as NCCL reads it) " : "") +
                                    paramRangeText(p)),
               false;
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
    case ParamType::kFamily: {
      int& f = strcmp(p.name, "NCCL_IB_ADDR_FAMILY") ? c.family : c.ib.addrFamily;
      std::string v = trim(s);
      if (v == "AF_INET") f = AF_INET;
      else if (v == "AF_INET6") f = AF_INET6;
      else return *err = bad(p, s, "expected AF_INET or AF_INET6"), false;
      return true;
    }
    case ParamType::kHcaList: {
      std::string why;
      if (!parseHcaFilter(trim(s), &c.ib.hca, &why)) return *err = bad(p, s, why), false;
      c.ib.hcaText = trim(s);
      return true;
    }
    case ParamType::kGidIndex: {
      std::string v = trim(s);
      uint64_t idx = 0;
      if (v == "-1") c.ib.gidIndex = -1;
      else if (parseUint(v.c_str(), 0, 65535, &idx, true)) c.ib.gidIndex = static_cast<int>(idx);
      else return *err = bad(p, s, "expected -1 (automatic) or a GID table index 0..65535"), false;
      return true;
    }
    case ParamType::kCidr: {
      std::string v = trim(s);
      size_t slash = v.find('/');
      const std::string syntax = "expected 'address/prefix-length', e.g. '10.1.0.0/16' or 'fd00:1::/64'";
      if (slash == std::string::npos) return *err = bad(p, s, "no '/prefix-length': " + syntax), false;
      std::string addr = v.substr(0, slash);
      uint8_t raw[16] = {0};
      int fam = 0;
      if (inet_pton(AF_INET, addr.c_str(), raw) == 1) fam = AF_INET;
      else if (inet_pton(AF_INET6, addr.c_str(), raw) == 1) fam = AF_INET6;
      else return *err = bad(p, s, "'" + addr + "' is not an IPv4 or IPv6 address: " + syntax), false;
      uint64_t len = 0;
      uint64_t maxLen = fam == AF_INET ? 32 : 128;
      if (!parseUint(v.substr(slash + 1).c_str(), 0, maxLen, &len))
        return *err = bad(p, s, "the prefix length must be an integer 0.." + std::to_string(maxLen)), false;
      c.ib.addrRangeSet = true;
      c.ib.addrRangeFamily = fam;
      std::memcpy(c.ib.addrRange, raw, sizeof raw);
      c.ib.addrRangePrefix = static_cast<int>(len);
      c.ib.addrRangeText = v;
      return true;
    }
    case ParamType::kTransport: {
      std::string v = trim(s);
      if (v == "auto") c.transport = TransportKind::kAuto;
      else if (v == "tcp") c.transport = TransportKind::kTcp;
      else if (v == "rdma") c.transport = TransportKind::kRdma;
      else if (v == "rdma+tcp") c.transport = TransportKind::kMixed;
      else return *err = bad(p, s, "expected auto, tcp, rdma or rdma+tcp"), false;
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
    case ParamType::kStateDir: {
      std::string t = trim(s), lower = t;
      for (char& ch : lower) ch = (char)tolower((unsigned char)ch);
      // 'OFF' or 'Off' meant off, but would be a directory of that name in each rank's working
      // directory (found by a fresh-user trial): refused, as other keywords in another case are.
      if (lower == "off" && t != "off")
        return *err = bad(p, s, "'off' in lower case turns state files off; a directory must not be named '" + t + "'"),
               false;
      c.stateDirSet = true;
      c.stateDir = t == "off" ? std::string() : t;  // blanks around it trimmed, as doctor reads it
      return true;
    }
    case ParamType::kNcclOwned:  // NCCL validates its own variables (log.cc reads NCCL_DEBUG itself)
      return true;
  }
  return true;
}

}  // namespace

bool parseHcaFilter(const std::string& text, HcaFilter* out, std::string* why) {
  HcaFilter f;
  std::string body = text;
  if (!body.empty() && body[0] == '^') f.exclude = true, body = body.substr(1);
  if (!body.empty() && body[0] == '=') f.exact = true, body = body.substr(1);
  const char* syntax =
      "expected a comma list of HCA names (prefixes), each optionally followed by ':port', led by '^' to "
      "exclude and/or '=' for exact names, e.g. 'mlx5', '=mlx5_0:1,mlx5_1:1' or '^=mlx5_3'";
  if (body.empty()) return *why = std::string("no HCA named: ") + syntax, false;
  for (const std::string& item : split(body, ',')) {
    HcaSpec h;
    size_t colon = item.find(':');
    h.name = item.substr(0, colon);
    if (h.name.empty() || h.name.size() > 63 || h.name.find_first_of(" \t=^;/:") != std::string::npos)
      return *why = "'" + item + "' is not an HCA name: " + syntax, false;
    if (colon != std::string::npos) {
      uint64_t port = 0;
      if (!parseUint(item.substr(colon + 1).c_str(), 1, 255, &port))
        return *why = "'" + item + "': the port must be an integer 1..255 after ':'", false;
      h.port = static_cast<int>(port);
    }
    f.items.push_back(h);
  }
  *out = f;
  return true;
}

const char* transportName(TransportKind t) {
  switch (t) {
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kRdma: return "rdma";
    case TransportKind::kMixed: return "rdma+tcp";
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
  auto given = [&](const char* name) {
    const char* s = env(name);
    return s && !blank(s);
  };
  c.ib.slSet = given("NCCL_IB_SL");
  c.ib.trafficClassSet = given("NCCL_IB_TC");
  if (c.ib.addrRangeSet && c.ib.addrRangeFamily != c.ib.addrFamily) {
    *err = "NCCL_IB_ADDR_RANGE='" + c.ib.addrRangeText + "' is not valid: it is an " +
           (c.ib.addrRangeFamily == AF_INET ? "IPv4" : "IPv6") + " range but NCCL_IB_ADDR_FAMILY is " +
           (c.ib.addrFamily == AF_INET ? "AF_INET" : "AF_INET6") + " (set both to the same family)";
    return false;
  }
  *out = c;
  return true;
}

namespace {
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::vector<std::string> unknownVarWarnings(const char* const* envp) {
  static const std::string kPrefix = "RAILOVER_";
  std::vector<std::string> out;
  for (const char* const* e = envp; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name = eq ? std::string(*e, eq) : std::string(*e);
    if (name.compare(0, kPrefix.size(), kPrefix) != 0 || findParam(name.c_str())) continue;
    // A name the start of a known one (a unit left off: RAILOVER_HOLD_DOWN_MAX) gets the
    // shortest such; otherwise the nearest within the bound; ties go to the first in
    // alphabetical order (doctor.py close_var has the same rule).
    std::string tail = name.substr(kPrefix.size()), best;
    size_t bestD = SIZE_MAX;
    bool bestPrefix = false;
    for (const ParamSpec& p : kParams) {
      std::string known = p.name;
      if (known.compare(0, kPrefix.size(), kPrefix) != 0) continue;
      std::string kt = known.substr(kPrefix.size());
      bool prefix = !tail.empty() && kt.compare(0, tail.size(), tail) == 0;
      size_t d = prefix ? kt.size() - tail.size() : editDistance(tail, kt);
      if (!prefix && (bestPrefix || d * 5 > std::max(tail.size(), kt.size()))) continue;
      if ((prefix && !bestPrefix) || d < bestD || (d == bestD && known < best))
        bestD = d, best = known, bestPrefix = prefix;
    }
    out.push_back(name + " is not a railover variable (" + (best.empty() ? "typo?" : "did you mean " + best + "?") +
                  "); it is ignored");
  }
  return out;
}

bool checkParam(const char* name, const char* value, std::string* err) {
  const ParamSpec* p = findParam(name);
  if (!p) return *err = std::string(name) + " is not a railover variable", false;
  if (!(p->readers & kReadPlugin) || !value || blank(value)) return true;
  Config c;
  return parseOne(*p, value, c, err);
}

}  // namespace railover
