// Unit tests: configuration parsing (every bad value names its variable) and interface
// selection syntax.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/params.h"
#include "plugin/devices.h"
#include "tests/test_nic.h"

using namespace railover;

static bool parse(std::map<std::string, std::string> env, Config* c, std::string* err) {
  return parseConfig([&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  }, c, err);
}

TEST(Config, Defaults) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({}, &c, &err)) << err;
  EXPECT_EQ(c.standby, StandbyPolicy::kAll);
  EXPECT_GE(c.nStreams, 1);
  EXPECT_GT(c.fatalTimeoutS, 0u);
}

TEST(Config, BadValuesNameTheVariable) {
  const std::map<std::string, std::string> bad[] = {
      {{"RAILOVER_NSTREAMS", "0"}},          {{"RAILOVER_NSTREAMS", "abc"}},
      {{"RAILOVER_NSTREAMS", "99"}},         {{"RAILOVER_HOLD_DOWN_MS", "-5"}},
      {{"RAILOVER_FATAL_TIMEOUT", "1e3"}},   {{"RAILOVER_PROBE_INTERVAL_MS", "0"}},
      {{"RAILOVER_PROBE_MULT", "1"}},        {{"RAILOVER_STANDBY", "eth0"}},
      {{"RAILOVER_STANDBY", "eth0=eth0"}},   {{"RAILOVER_RAILS", "eth0:1"}},
      {{"RAILOVER_RAILS", "eth0=x"}},        {{"NCCL_SOCKET_FAMILY", "ipv4"}},
      {{"RAILOVER_IFNAMES", "^"}},           {{"RAILOVER_IFNAMES", "eth0,,eth1"}},
      {{"RAILOVER_MIN_CHUNK_BYTES", "1000"}}, {{"RAILOVER_BACKOFF_MAX_MS", "600000"}},
      {{"RAILOVER_PROBE_BACKOFF_MAX_MS", "0"}}, {{"RAILOVER_PROBE_BACKOFF_MAX_MS", "1s"}},
      {{"RAILOVER_ABORT_ON_FATAL", "2"}},    {{"RAILOVER_ABORT_ON_FATAL", "yes"}},
      {{"RAILOVER_TRANSPORT", "ib"}},        {{"RAILOVER_TRANSPORT", "RDMA"}},
  };
  for (auto& env : bad) {
    Config c;
    std::string err;
    EXPECT_FALSE(parse(env, &c, &err)) << env.begin()->first << "=" << env.begin()->second;
    EXPECT_NE(err.find(env.begin()->first), std::string::npos) << err;
  }
}

// A RAILOVER_* name the plugin does not read is warned about at init, with the closest known
// name when one is close; known names, other prefixes and a bare name without '=' are handled.
TEST(Config, AMisspeltVariableIsNamedWithTheClosestKnownOne) {
  const char* env[] = {"RAILOVER_HOLDDOWN_MS=500",      "RAILOVER_STALL_MS=70", "RAILOVER_PROBE_INTERVAL=5",
                       "RAILOVER_HCAS=mlx5_0",          "NCCL_IB_HCA=mlx5",     "RAILOVER_FATAL_TIMEOUT_S",
                       "PATH=/usr/bin:RAILOVER_NOPE=1", "RAILOVER_=1",          "RAILOVER_HOLD_DOWN_MAX=9",
                       "RAILOVER_HOLD_DOWN=5",          nullptr};
  std::vector<std::string> w = unknownVarWarnings(env);
  ASSERT_EQ(w.size(), 7u) << ::testing::PrintToString(w);
  EXPECT_EQ(w[0], "RAILOVER_HOLDDOWN_MS is not a railover variable (did you mean RAILOVER_HOLD_DOWN_MS?); it is ignored");
  EXPECT_EQ(w[1], "RAILOVER_PROBE_INTERVAL is not a railover variable (did you mean RAILOVER_PROBE_INTERVAL_MS?); it is ignored");
  // shares only the prefix with RAILOVER_RAILS: no suggestion
  EXPECT_EQ(w[2], "RAILOVER_HCAS is not a railover variable (typo?); it is ignored");
  EXPECT_EQ(w[3], "RAILOVER_FATAL_TIMEOUT_S is not a railover variable (did you mean RAILOVER_FATAL_TIMEOUT?); it is ignored");
  EXPECT_EQ(w[4], "RAILOVER_ is not a railover variable (typo?); it is ignored");
  // the start of known names (a unit left off): the shortest, not the nearest by edits
  EXPECT_EQ(w[5], "RAILOVER_HOLD_DOWN_MAX is not a railover variable (did you mean RAILOVER_HOLD_DOWN_MAX_MS?); it is ignored");
  EXPECT_EQ(w[6], "RAILOVER_HOLD_DOWN is not a railover variable (did you mean RAILOVER_HOLD_DOWN_MS?); it is ignored");
  EXPECT_TRUE(unknownVarWarnings(nullptr).empty());
  // Every variable of the table is known.
  for (const ParamSpec& p : kParams) {
    std::string e = std::string(p.name) + "=1";
    const char* one[] = {e.c_str(), nullptr};
    EXPECT_TRUE(unknownVarWarnings(one).empty()) << p.name;
  }
}

TEST(Config, GoodValues) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"RAILOVER_NSTREAMS", "4"},
                     {"RAILOVER_STANDBY", "eth0=eth1;eth1=eth0"},
                     {"RAILOVER_RAILS", "eth0=0, eth1=1"},
                     {"RAILOVER_HOLD_DOWN_MS", "250"},
                     {"RAILOVER_FATAL_TIMEOUT", "0"},
                     {"RAILOVER_PROBE_BACKOFF_MAX_MS", "250"},
                     {"NCCL_SOCKET_FAMILY", "AF_INET"}},
                    &c, &err))
      << err;
  EXPECT_EQ(c.nStreams, 4);
  EXPECT_EQ(c.standby, StandbyPolicy::kExplicit);
  ASSERT_EQ(c.standbyPairs.size(), 2u);
  EXPECT_EQ(c.standbyPairs[1].first, "eth1");
  ASSERT_EQ(c.rails.size(), 2u);
  EXPECT_EQ(c.rails[1].second, 1);
  EXPECT_EQ(c.holdDownMs, 250u);
  EXPECT_EQ(c.fatalTimeoutS, 0u);
  EXPECT_EQ(c.probeBackoffMaxMs, 250u);
  ASSERT_TRUE(parse({{"RAILOVER_STANDBY", "none"}}, &c, &err));
  EXPECT_EQ(c.standby, StandbyPolicy::kNone);
  EXPECT_FALSE(c.abortOnFatal) << "default: return ncclSystemError";
  ASSERT_TRUE(parse({{"RAILOVER_ABORT_ON_FATAL", "1"}}, &c, &err));
  EXPECT_TRUE(c.abortOnFatal);
  ASSERT_TRUE(parse({{"RAILOVER_ABORT_ON_FATAL", "0"}}, &c, &err));
  EXPECT_FALSE(c.abortOnFatal);
  EXPECT_EQ(c.transport, TransportKind::kAuto) << "default: auto";
  ASSERT_TRUE(parse({{"RAILOVER_TRANSPORT", "rdma"}}, &c, &err));
  EXPECT_EQ(c.transport, TransportKind::kRdma);
  ASSERT_TRUE(parse({{"RAILOVER_TRANSPORT", " tcp "}}, &c, &err));
  EXPECT_EQ(c.transport, TransportKind::kTcp);
  ASSERT_TRUE(parse({{"RAILOVER_TRANSPORT", "rdma+tcp"}}, &c, &err));
  EXPECT_EQ(c.transport, TransportKind::kMixed);
  EXPECT_STREQ(transportName(c.transport), "rdma+tcp");
  EXPECT_FALSE(parse({{"RAILOVER_TRANSPORT", "tcp+rdma"}}, &c, &err));
  EXPECT_NE(err.find("expected auto, tcp, rdma or rdma+tcp"), std::string::npos) << err;
}

TEST(Config, RailoverIfnamesTakesPrecedence) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"RAILOVER_IFNAMES", "a"}, {"NCCL_SOCKET_IFNAME", "b"}}, &c, &err));
  EXPECT_EQ(c.ifnames, "a");
  EXPECT_EQ(c.ifnamesVar, "RAILOVER_IFNAMES");
  ASSERT_TRUE(parse({{"NCCL_SOCKET_IFNAME", "b"}}, &c, &err));
  EXPECT_EQ(c.ifnamesVar, "NCCL_SOCKET_IFNAME");
}

TEST(Ifname, NcclSyntax) {
  EXPECT_TRUE(ifnameMatches("eth", "eth0"));
  EXPECT_TRUE(ifnameMatches("ib,eth", "eth1"));
  EXPECT_FALSE(ifnameMatches("ib", "eth0"));
  EXPECT_FALSE(ifnameMatches("=eth", "eth0"));
  EXPECT_TRUE(ifnameMatches("=eth0", "eth0"));
  EXPECT_FALSE(ifnameMatches("=eth0", "eth01"));
  EXPECT_FALSE(ifnameMatches("^eth", "eth0"));
  EXPECT_TRUE(ifnameMatches("^eth", "ib0"));
  EXPECT_TRUE(ifnameMatches("^=eth0", "eth01"));
  EXPECT_FALSE(ifnameMatches("^=eth0,lo", "lo"));
}

// The config check accepts blanks around the items (it trims them, as in every list it reads):
// "eth0, eth1" passed the check and then selected eth0 alone (" eth1" is no prefix of eth1), a
// job without its standby NIC.
TEST(Ifname, BlanksAroundItemsAreNoPartOfThem) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"RAILOVER_IFNAMES", "eth0, eth1 "}}, &c, &err)) << err;
  EXPECT_TRUE(ifnameMatches(c.ifnames, "eth0"));
  EXPECT_TRUE(ifnameMatches(c.ifnames, "eth1"));
  EXPECT_TRUE(ifnameMatches("=eth0,\teth1", "eth1"));
  EXPECT_FALSE(ifnameMatches("^=eth0, lo", "lo"));
  EXPECT_TRUE(ifnameMatches("^=eth0, lo", "eth1"));
}

// Blanks around a number are trimmed, as around a word ("tcp ") or a list item ("eth0= 0"):
// RAILOVER_HOLD_DOWN_MS=" 500" failed NCCL's init (and doctor's check) while
// RAILOVER_TRANSPORT=" tcp " and RAILOVER_RAILS="eth0= 0" passed. Blanks inside are refused.
TEST(Config, BlanksAroundANumberAreNoPartOfIt) {
  for (const char* v : {" 500", "500 ", "\t500\t", "  500 \t"}) {
    SCOPED_TRACE(std::string("'") + v + "'");
    Config c;
    std::string err;
    ASSERT_TRUE(parse({{"RAILOVER_HOLD_DOWN_MS", v}, {"RAILOVER_ABORT_ON_FATAL", v[0] == ' ' ? " 1" : "1\t"}},
                      &c, &err))
        << err;
    EXPECT_EQ(c.holdDownMs, 500u);
    EXPECT_TRUE(c.abortOnFatal);
    EXPECT_TRUE(checkParam("RAILOVER_HOLD_DOWN_MS", v, &err)) << err;
  }
  Config c;
  std::string err;
  EXPECT_FALSE(parse({{"RAILOVER_HOLD_DOWN_MS", "5 00"}}, &c, &err));
  EXPECT_FALSE(parse({{"RAILOVER_MIN_CHUNK_BYTES", " 1000 "}}, &c, &err));  // trimmed, still no multiple of 128
  EXPECT_EQ(err, "RAILOVER_MIN_CHUNK_BYTES=' 1000 ' is not valid: must be a multiple of 128") << err;
}

TEST(Config, ParseUint) {
  uint64_t v;
  EXPECT_TRUE(parseUint("42", 0, 100, &v));
  EXPECT_EQ(v, 42u);
  EXPECT_FALSE(parseUint("", 0, 100, &v));
  EXPECT_FALSE(parseUint("101", 0, 100, &v));
  EXPECT_FALSE(parseUint("4 2", 0, 100, &v));
  EXPECT_FALSE(parseUint("99999999999999999999999", 0, UINT64_MAX, &v));
}

// ---- the parameter table drives parseConfig ----

static bool parseOne(const char* var, const std::string& value, Config* c, std::string* err) {
  return parse({{var, value}}, c, err);
}

TEST(ParamTable, NamesAreUniqueAndDescribed) {
  for (size_t i = 0; i < kParamCount; ++i) {
    const ParamSpec& p = kParams[i];
    EXPECT_TRUE(*p.meaning && *p.defaultText && *p.example) << p.name;
    EXPECT_EQ(findParam(p.name), &p);
    for (size_t j = i + 1; j < kParamCount; ++j) EXPECT_STRNE(p.name, kParams[j].name);
  }
  EXPECT_EQ(findParam("RAILOVER_NO_SUCH"), nullptr);
}

TEST(ParamTable, NumericDefaultsRangesAndSteps) {
  const Config defaults;
  int numeric = 0;
  for (const ParamSpec& p : kParams) {
    if (p.type != ParamType::kUint || !(p.readers & kReadPlugin)) continue;
    ++numeric;
    SCOPED_TRACE(p.name);
    uint64_t v = 0;
    ASSERT_TRUE(configUintField(p.name, defaults, &v)) << "no Config field";
    EXPECT_EQ(v, p.def) << "Config's initial value differs from the table's default";
    EXPECT_EQ(std::to_string(p.def), p.defaultText);
    EXPECT_TRUE(p.lo <= p.def && p.def <= p.hi && p.def % p.step == 0);
    for (uint64_t good : {p.lo + (p.step - p.lo % p.step) % p.step, p.hi - p.hi % p.step}) {
      Config c;
      std::string err;
      ASSERT_TRUE(parseOne(p.name, std::to_string(good), &c, &err)) << err;
      ASSERT_TRUE(configUintField(p.name, c, &v));
      if (std::string(p.name) == "RAILOVER_HOLD_DOWN_MAX_MS")  // raised to the hold-down when below it
        EXPECT_EQ(v, std::max<uint64_t>(good, c.holdDownMs));
      else
        EXPECT_EQ(v, good);
    }
    std::vector<std::string> bad = {std::to_string(p.hi + 1), "x", "-1", "1.5", "7 7"};  // blanks around are trimmed
    if (strncmp(p.name, "NCCL_", 5)) bad.push_back("0x10");  // railover's own: decimal only
    else bad.insert(bad.end(), {"0x", "0x1g", "08", "0x" + std::to_string(p.hi + 1) + "0"});  // NCCL's: as NCCL reads them
    if (p.lo > 0) bad.push_back(std::to_string(p.lo - 1));
    if (p.step > 1) bad.push_back(std::to_string(p.lo + 1));
    for (auto& b : bad) {
      Config c;
      std::string err;
      EXPECT_FALSE(parseOne(p.name, b, &c, &err)) << b;
      EXPECT_EQ(err.rfind(std::string(p.name) + "='" + b + "' is not valid", 0), 0u) << err;
      if (p.step == 1 || b != std::to_string(p.lo + 1)) {
        EXPECT_NE(err.find(paramRangeText(p)), std::string::npos) << err;  // names the accepted range
      }
    }
  }
  EXPECT_EQ(numeric, 22);  // 14 railover variables + 8 numeric NCCL_IB_* ones
}

// NCCL reads its own numeric variables with strtoll(value, NULL, 0) (src/misc/param.cc), so
// NCCL_IB_TC=0x68 is 104 and NCCL_IB_SL=010 is 8 to NCCL's IB transport: railover honours
// them with NCCL's meaning, and stays strict where NCCL is not (trailing characters).
TEST(Config, NcclVariablesAreReadAsNcclReadsThem) {
  struct Case {
    const char* name;
    const char* value;
    uint64_t want;
  };
  for (const Case& k : {Case{"NCCL_IB_TC", "0x68", 104}, Case{"NCCL_IB_TC", "0X68", 104}, Case{"NCCL_IB_SL", "010", 8},
                        Case{"NCCL_IB_PKEY", " 0x7f ", 127}, Case{"NCCL_IB_TIMEOUT", "20", 20},
                        Case{"NCCL_IB_RETRY_CNT", "0", 0}}) {
    Config c;
    std::string err;
    ASSERT_TRUE(parseOne(k.name, k.value, &c, &err)) << k.name << "='" << k.value << "': " << err;
    uint64_t v = 0;
    ASSERT_TRUE(configUintField(k.name, c, &v));
    EXPECT_EQ(v, k.want) << k.name << "='" << k.value << "'";
  }
  Config c;
  std::string err;
  ASSERT_TRUE(parseOne("NCCL_IB_GID_INDEX", "0x3", &c, &err)) << err;
  EXPECT_EQ(c.ib.gidIndex, 3);
  EXPECT_FALSE(parseOne("NCCL_IB_TC", "0x68q", &c, &err));  // NCCL would take 104 and ignore the rest
  EXPECT_NE(err.find("0x hex"), std::string::npos) << err;
  EXPECT_FALSE(parseOne("RAILOVER_HOLD_DOWN_MS", "0x10", &c, &err));  // railover's own stay decimal
  EXPECT_EQ(err.find("0x hex"), std::string::npos) << err;
}

TEST(ParamTable, EveryExampleIsValid) {
  for (const ParamSpec& p : kParams) {
    std::string err;
    EXPECT_TRUE(checkParam(p.name, p.example, &err)) << p.name << ": " << err;
  }
  std::string err;
  EXPECT_FALSE(checkParam("RAILOVER_NO_SUCH", "1", &err));
  EXPECT_NE(err.find("RAILOVER_NO_SUCH"), std::string::npos);
  EXPECT_FALSE(checkParam("RAILOVER_STANDBY", "eth0", &err));
  EXPECT_EQ(err.rfind("RAILOVER_STANDBY='eth0' is not valid", 0), 0u) << err;
}

// One rule for empty values, for every variable: empty (or blank) = unset.
TEST(ParamTable, EmptyValueMeansUnset) {
  const Config d;
  for (const ParamSpec& p : kParams) {
    for (const char* empty : {"", " ", "\t "}) {
      SCOPED_TRACE(std::string(p.name) + "='" + empty + "'");
      Config c;
      std::string err;
      ASSERT_TRUE(parseOne(p.name, empty, &c, &err)) << err;
      EXPECT_TRUE(c.ifnamesVar.empty());
      EXPECT_EQ(c.family, d.family);
      EXPECT_EQ(c.standby, StandbyPolicy::kAll);
      EXPECT_TRUE(c.rails.empty());
      EXPECT_TRUE(c.eventLog.empty());
      EXPECT_FALSE(c.stateDirSet);
      for (const ParamSpec& q : kParams) {
        uint64_t a = 0, b = 0;
        if (configUintField(q.name, c, &a) && configUintField(q.name, d, &b)) { EXPECT_EQ(a, b) << q.name; }
      }
      EXPECT_TRUE(checkParam(p.name, empty, &err)) << err;
    }
  }
  // An empty RAILOVER_IFNAMES is unset, so NCCL_SOCKET_IFNAME applies.
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"RAILOVER_IFNAMES", ""}, {"NCCL_SOCKET_IFNAME", "=eth1"}}, &c, &err)) << err;
  EXPECT_EQ(c.ifnamesVar, "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(c.ifnames, "=eth1");
}

TEST(ParamTable, StateDir) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({}, &c, &err));
  EXPECT_FALSE(c.stateDirSet);  // default directory
  ASSERT_TRUE(parse({{"RAILOVER_STATE_DIR", "off"}}, &c, &err));
  EXPECT_TRUE(c.stateDirSet);
  EXPECT_TRUE(c.stateDir.empty());  // explicitly off
  ASSERT_TRUE(parse({{"RAILOVER_STATE_DIR", "/tmp/x"}}, &c, &err));
  EXPECT_TRUE(c.stateDirSet);
  EXPECT_EQ(c.stateDir, "/tmp/x");
  // 'off' in another case is refused, not a directory named OFF in each rank's working directory
  for (const char* v : {"OFF", "Off", " oFf "}) {
    Config o;
    EXPECT_FALSE(parse({{"RAILOVER_STATE_DIR", v}}, &o, &err)) << v;
    EXPECT_NE(err.find("RAILOVER_STATE_DIR='"), std::string::npos) << err;
    EXPECT_NE(err.find("'off' in lower case turns state files off"), std::string::npos) << err;
  }
  ASSERT_TRUE(parse({{"RAILOVER_STATE_DIR", " off "}}, &c, &err));
  EXPECT_TRUE(c.stateDir.empty());
  ASSERT_TRUE(parse({{"RAILOVER_STATE_DIR", " /tmp/y\t"}}, &c, &err));  // as doctor reads it: not a relative ' /tmp/y'
  EXPECT_EQ(c.stateDir, "/tmp/y");
}

TEST(ParamTable, HoldDownMaxIsRaisedToHoldDown) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"RAILOVER_HOLD_DOWN_MS", "5000"}, {"RAILOVER_HOLD_DOWN_MAX_MS", "1000"}}, &c, &err));
  EXPECT_EQ(c.holdDownMaxMs, 5000u);
}

namespace railover {
namespace {

// RAILOVER_TRANSPORT=auto with a mix leaves out the NICs without an RDMA port: the kept NICs
// are numbered again from 0 in their order (index, and the guid that follows it), keep their
// names, rails and addresses, and the left-out names come back in their order.
TEST(KeepOnlyNics, TheKeptNicsAreNumberedAgainAndTheOthersNamed) {
  std::vector<Nic> nics = {testbed::makeNic(0, "eth0", "10.0.0.1", 0), testbed::makeNic(1, "eth1", "10.0.1.1", 1),
                           testbed::makeNic(2, "eth2", "10.0.2.1", 2), testbed::makeNic(3, "eth3", "10.0.3.1", 3)};
  std::vector<std::string> out = keepOnlyNics(&nics, {"eth3", "eth1"});
  EXPECT_EQ(out, (std::vector<std::string>{"eth0", "eth2"}));
  ASSERT_EQ(nics.size(), 2u);
  EXPECT_EQ(nics[0].name, "eth1");
  EXPECT_EQ(nics[0].index, 0);
  EXPECT_EQ(nics[0].rail, 1) << "rails stay";
  EXPECT_EQ(addrToString(nics[0].getAddr(nullptr)), "10.0.1.1");
  EXPECT_EQ(nics[1].name, "eth3");
  EXPECT_EQ(nics[1].index, 1);
  EXPECT_EQ(nics[1].rail, 3);
  EXPECT_NE(nics[0].guid, nics[1].guid);
  EXPECT_EQ(nics[1].guid & 0xffu, 1u) << "the guid follows the new index";
  EXPECT_TRUE(keepOnlyNics(&nics, {"eth1", "eth3"}).empty());
  EXPECT_EQ(nics.size(), 2u);
}

}  // namespace
}  // namespace railover

namespace {
railover::Nic v4Nic(const char* name, const char* addr) {
  railover::Nic n;
  n.name = name;
  auto& a = (sockaddr_in&)n.addr;
  a.sin_family = AF_INET;
  inet_pton(AF_INET, addr, &a.sin_addr);
  n.addrLen = sizeof(sockaddr_in);
  return n;
}
}  // namespace

// The NICs sharing a NIC's IPv4 subnet: those whose subnet overlaps it (the same, or one holding
// the other), with a known prefix length; IPv6 addresses and unknown lengths share nothing.
TEST(Devices, NicsSharingASubnetAreThoseWhoseIpv4SubnetsOverlap) {
  using railover::nicsSharingSubnet;
  using V = std::vector<size_t>;
  railover::Nic v6;
  v6.name = "eth4";
  auto& a6 = (sockaddr_in6&)v6.addr;
  a6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fd00::1", &a6.sin6_addr);
  std::vector<railover::Nic> nics{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.0.17"), v4Nic("eth2", "10.0.1.1"),
                                  v4Nic("eth3", "10.0.0.2")};
  nics.push_back(v6);
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 28, 16, -1, 64}, 0), (V{1, 2})) << "a /28 in it, a /16 holding it, eth3 unknown";
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 28, 16, -1, 64}, 1), (V{0, 2}));
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 28, 24, 24, 64}, 2), V{}) << "10.0.1.0/24 is a subnet of its own";
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 24, 24, 24, 64}, 3), (V{0, 1}));
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 28, 16, -1, 64}, 3), V{}) << "its own length unknown";
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 24, 24, 24, 0}, 4), V{}) << "IPv6: IPv4 only, even where every bit matches";
  EXPECT_EQ(nicsSharingSubnet(nics, {24, 24}, 1), V{0}) << "a shorter vector: the rest unknown";
  EXPECT_EQ(nicsSharingSubnet(nics, {0, 24, 24, 24, 64}, 2), V{0}) << "a /0 holds every IPv4 address";
}

TEST(Devices, NicsSharingASubnetWithArpFluxAreNamedAtInit) {
  using railover::arpFluxWarnings;
  std::vector<railover::Nic> nics{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.0.11"), v4Nic("eth2", "10.0.1.1")};
  std::vector<int> len{24, 24, 24};
  int ignore = 0;
  auto arp = [&](const std::string&) { return ignore; };
  auto w = arpFluxWarnings(nics, len, arp);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NICs eth0,eth1 share subnet 10.0.0.0/24"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("arp_ignore=1"), std::string::npos) << w[0];
  ignore = 1;
  EXPECT_TRUE(arpFluxWarnings(nics, len, arp).empty()) << "each NIC answers for its own address only";
  ignore = -1;
  EXPECT_TRUE(arpFluxWarnings(nics, len, arp).empty()) << "unknown: no claim";
  ignore = 0;
  w = arpFluxWarnings(nics, {24, 28, 24}, arp);
  ASSERT_EQ(w.size(), 1u) << "overlapping subnets of different lengths share the smaller one's addresses";
  EXPECT_NE(w[0].find("NICs eth0,eth1 share subnet 10.0.0.0/24"), std::string::npos) << w[0];
  EXPECT_TRUE(arpFluxWarnings(nics, {24, -1, 24}, arp).empty()) << "one rail per subnet: nothing shared";
  std::vector<railover::Nic> rails{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.1.1")};
  EXPECT_TRUE(arpFluxWarnings(rails, {24, 24}, arp).empty());
  w = arpFluxWarnings(rails, {16, 16}, arp);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("share subnet 10.0.0.0/16"), std::string::npos) << w[0];
  // Two groups: each is named (not the first only).
  std::vector<railover::Nic> two{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.0.2"), v4Nic("eth2", "10.0.1.1"),
                                 v4Nic("eth3", "10.0.1.2")};
  w = arpFluxWarnings(two, {24, 24, 24, 24}, arp);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("NICs eth0,eth1 share subnet 10.0.0.0/24"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("NICs eth2,eth3 share subnet 10.0.1.0/24"), std::string::npos) << w[1];
}

// Strict reverse-path filtering on a NIC that shares its subnet and whose traffic to it the
// kernel routes through another NIC (main-table routes only): named at init with the NIC its
// traffic leaves through; not where the route is its own (source routing), filtering is loose
// or off, the value or the route is unknown, or the NIC has the subnet to itself.
TEST(Devices, StrictReversePathFilteringOnANicSharingASubnetIsNamedAtInit) {
  using railover::rpFilterWarnings;
  std::vector<railover::Nic> nics{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.0.2"), v4Nic("eth2", "10.0.1.1")};
  std::vector<int> len{24, 24, 24};
  int rpf = 1;
  auto filter = [&](const std::string&) { return rpf; };
  std::vector<std::pair<std::string, std::string>> asked;  // (src, dst) of each route lookup
  std::string via = "eth0";                                  // the main table's first route wins
  auto route = [&](const sockaddr_in& src, const sockaddr_in& dst) {
    char s[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &src.sin_addr, s, sizeof(s));
    inet_ntop(AF_INET, &dst.sin_addr, d, sizeof(d));
    asked.push_back({s, d});
    return std::string(s) == "10.0.0.1" ? std::string("eth0") : via;
  };
  auto w = rpFilterWarnings(nics, len, filter, route);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC eth1 shares subnet 10.0.0.0/24 with eth0, and its traffic to that subnet leaves through eth0"),
            std::string::npos) << w[0];
  EXPECT_NE(w[0].find("ip rule add from 10.0.0.2 table <N>; ip route add 10.0.0.0/24 dev eth1 table <N>"), std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("net.ipv4.conf.eth1.rp_filter=2"), std::string::npos) << w[0];
  // The lookups: from each sharing NIC's address to an address of the subnet no NIC holds
  // (10.0.0.1 and .2 are ours); eth2 has its subnet to itself and is not asked about.
  EXPECT_EQ(asked, (std::vector<std::pair<std::string, std::string>>{{"10.0.0.1", "10.0.0.3"}, {"10.0.0.2", "10.0.0.3"}}));
  via = "eth1";
  EXPECT_TRUE(rpFilterWarnings(nics, len, filter, route).empty()) << "source routing: eth1's traffic leaves through it";
  via = "";
  EXPECT_TRUE(rpFilterWarnings(nics, len, filter, route).empty()) << "route unknown: no claim";
  via = "eth0";
  for (int loose : {0, 2, -1}) {
    rpf = loose;
    EXPECT_TRUE(rpFilterWarnings(nics, len, filter, route).empty()) << "rp_filter " << loose;
  }
  rpf = 1;
  std::vector<railover::Nic> rails{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.1.1")};
  EXPECT_TRUE(rpFilterWarnings(rails, {24, 24}, filter, route).empty()) << "a subnet per rail: each route is its NIC's";
  std::vector<railover::Nic> pair{v4Nic("eth0", "10.0.0.2"), v4Nic("eth1", "10.0.0.3")};
  EXPECT_TRUE(rpFilterWarnings(pair, {31, 31}, filter, route).empty()) << "one /31 holds no third host";
  EXPECT_EQ(rpFilterWarnings(pair, {30, 30}, filter, route).size(), 1u) << "the /30 of the same two NICs does";
}

// Overlapping subnets of different lengths (a0 10.0.0.1/16, a1 10.0.1.1/24), main-table routes
// only: the kernel routes by the longest prefix, so a0's traffic to the part of its /16 that is
// a1's /24 leaves through a1, and strict filtering on a0 drops what a peer there (10.0.1.9/16,
// on a0's link) sends to a0. a0 is named (a lookup into a1's /24 as well as one into the rest
// of its /16); a1, whose whole /24 is its own, is not.
TEST(Devices, StrictReversePathFilteringOnANicWhoseSubnetHoldsAnotherNicsIsNamedAtInit) {
  using railover::rpFilterWarnings;
  std::vector<railover::Nic> nics{v4Nic("a0", "10.0.0.1"), v4Nic("a1", "10.0.1.1")};
  std::vector<int> len{16, 24};
  auto strict = [](const std::string&) { return 1; };
  std::vector<std::pair<std::string, std::string>> asked;  // (src, dst) of each route lookup
  // the main table's connected routes of `nics` (lengths `len`), the longest prefix wins
  auto route = [&](const sockaddr_in& src, const sockaddr_in& dst) {
    char s[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &src.sin_addr, s, sizeof(s));
    inet_ntop(AF_INET, &dst.sin_addr, d, sizeof(d));
    asked.push_back({s, d});
    std::string via;
    int best = -1;
    for (size_t k = 0; k < nics.size(); ++k) {
      uint32_t mask = 0xffffffffu << (32 - len[k]);
      uint32_t net = ntohl(((const sockaddr_in&)nics[k].addr).sin_addr.s_addr) & mask;
      if ((ntohl(dst.sin_addr.s_addr) & mask) == net && len[k] > best) best = len[k], via = nics[k].name;
    }
    return via;
  };
  auto w = rpFilterWarnings(nics, len, strict, route);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC a0 shares subnet 10.0.0.0/16 with a1, and its traffic to 10.0.1.0/24 (in that subnet) "
                      "leaves through a1"),
            std::string::npos) << w[0];
  EXPECT_NE(w[0].find("ip rule add from 10.0.0.1 table <N>; ip route add 10.0.0.0/16 dev a0 table <N>"), std::string::npos)
      << w[0];
  EXPECT_EQ(asked, (std::vector<std::pair<std::string, std::string>>{
                       {"10.0.0.1", "10.0.0.2"}, {"10.0.0.1", "10.0.1.2"}, {"10.0.1.1", "10.0.1.2"}}));
  // The reverse: a1's /16 holds a0's /24; a1 is named, a0 not. The rest of a1's /16 is looked
  // up outside a0's /24 (10.0.1.0, past it).
  len = {24, 16};
  asked.clear();
  w = rpFilterWarnings(nics, len, strict, route);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC a1 shares subnet 10.0.0.0/16 with a0, and its traffic to 10.0.0.0/24 (in that subnet) "
                      "leaves through a0"),
            std::string::npos) << w[0];
  EXPECT_EQ(asked, (std::vector<std::pair<std::string, std::string>>{
                       {"10.0.0.1", "10.0.0.2"}, {"10.0.1.1", "10.0.1.0"}, {"10.0.1.1", "10.0.0.2"}}));
  // The same lengths: one subnet, one lookup each, as before (the first route wins: a0).
  len = {16, 16};
  asked.clear();
  w = rpFilterWarnings(nics, len, strict, route);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC a1 shares subnet 10.0.0.0/16 with a0, and its traffic to that subnet leaves through a0"),
            std::string::npos) << w[0];
  EXPECT_EQ(asked.size(), 2u);
}

// RAILOVER_TRANSPORT=auto leaves the NICs without an RDMA port out of NCCL's devices. The init
// checks judged every NIC discovered, before that: a WARN about a NIC railover then does not use
// (its traffic, its ARP answers), while doctor judges the devices only. Now only the NICs served
// are judged; the ones left out still share their subnet (their routes and ARP answers are the
// kernel's all the same), so a served NIC harmed by one is still named.
TEST(Devices, OnlyTheNicsServedAreJudgedAndTheNicsLeftOutStillShareTheirSubnet) {
  using railover::arpFluxWarnings;
  using railover::rpFilterWarnings;
  std::vector<railover::Nic> nics{v4Nic("a0", "10.0.0.1"), v4Nic("a1", "10.0.0.2")};
  std::vector<int> len{24, 24};
  const std::vector<bool> served{true, false};  // a1 left out
  auto strict = [](const std::string&) { return 1; };
  std::string via;  // the main table's first route, whatever the source
  auto route = [&](const sockaddr_in&, const sockaddr_in&) { return via; };
  via = "a0";
  EXPECT_EQ(rpFilterWarnings(nics, len, strict, route).size(), 1u) << "every NIC served: a1 is named";
  EXPECT_TRUE(rpFilterWarnings(nics, len, strict, route, {}, served).empty()) << "a1 is no device: not judged";
  via = "a1";
  auto w = rpFilterWarnings(nics, len, strict, route, {}, served);
  ASSERT_EQ(w.size(), 1u) << "a0's traffic leaves through a1, left out or not";
  EXPECT_NE(w[0].find("NIC a0 shares subnet 10.0.0.0/24 with a1, and its traffic to that subnet leaves through a1"),
            std::string::npos) << w[0];
  // ARP: a0 with arp_ignore=0 answers for a1's address, which railover does not use: nothing to
  // say; a1 with arp_ignore=0 answers for a0's, a device: named, and a1 as left out.
  std::map<std::string, int> ignore{{"a0", 0}, {"a1", 1}};
  auto arp = [&](const std::string& n) { return ignore[n]; };
  EXPECT_EQ(arpFluxWarnings(nics, len, arp).size(), 1u) << "every NIC served";
  EXPECT_TRUE(arpFluxWarnings(nics, len, arp, served).empty());
  ignore = {{"a0", 1}, {"a1", 0}};
  w = arpFluxWarnings(nics, len, arp, served);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NICs a0,a1 share subnet 10.0.0.0/24; of them, a1 (arp_ignore=0) will answer ARP for the "
                      "others' addresses (a1: not railover's devices, but on that subnet all the same)"),
            std::string::npos) << w[0];
  EXPECT_NE(w[0].find("(or net.ipv4.conf.a1.arp_ignore=1)"), std::string::npos) << w[0];
  // a VLAN's name in the sysctl key: its '.' written '/'
  std::vector<railover::Nic> vlans{v4Nic("a0", "10.0.0.1"), v4Nic("bond0.100", "10.0.0.2")};
  w = arpFluxWarnings(vlans, len, [](const std::string& n) { return n == "a0" ? 1 : 0; }, served);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("(or net.ipv4.conf.bond0/100.arp_ignore=1)"), std::string::npos) << w[0];
  EXPECT_TRUE(arpFluxWarnings(nics, len, arp, {false, false}).empty()) << "no device in the group";
}

// A RAILOVER_STANDBY pair naming a NIC that RAILOVER_TRANSPORT=auto left out gives no standby
// path: init checked the pairs at discovery, before the drop, and said nothing (doctor WARNs).
TEST(Devices, AStandbyPairNamingANicLeftOutIsNamed) {
  using V = std::vector<std::string>;
  std::vector<std::pair<std::string, std::string>> pairs{{"eth1", "eth0"}, {"eth2", "eth9"}};
  V w = railover::standbyPairWarnings(pairs, {"eth0", "eth1", "eth2"}, {"eth1", "eth2"});
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("RAILOVER_STANDBY pair eth1=eth0 names eth0, which is left out of NCCL's devices (no RDMA port"),
            std::string::npos) << w[0];
  EXPECT_NE(w[1].find("pair eth2=eth9 names eth9, which is not a selected NIC (selected: eth0,eth1,eth2)"), std::string::npos)
      << w[1];
  EXPECT_TRUE(railover::standbyPairWarnings(pairs, {"eth0", "eth1", "eth2", "eth9"}, {"eth0", "eth1", "eth2", "eth9"})
                  .empty());
}

// A /0 address: the kernel adds no subnet route for it (no peer is on the link by its address),
// so the rp_filter check cannot pick a stand-in peer for it (0.0.0.1 is no address) and leaves
// it out, as doctor does; one WARN says so. A /30 is looked into, a /31 and a /32 are not (no
// third host), in the plugin as in doctor (_neighbour).
TEST(Devices, ANicWithPrefixLengthZeroIsNamedAndNotLookedInto) {
  std::vector<railover::Nic> nics{v4Nic("v0", "10.9.0.1"), v4Nic("v1", "10.9.1.1")};
  std::vector<std::string> dsts;
  auto route = [&](const sockaddr_in&, const sockaddr_in& dst) {
    char d[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &dst.sin_addr, d, sizeof(d));
    dsts.push_back(d);
    return std::string("v1");
  };
  auto strict = [](const std::string&) { return 1; };
  EXPECT_TRUE(railover::rpFilterWarnings(nics, {0, 24}, strict, route).empty());
  EXPECT_TRUE(dsts.empty()) << dsts[0];
  auto w = railover::zeroPrefixWarnings(nics, {0, 24});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC v0's address 10.9.0.1/0 has prefix length 0: the kernel gives it no subnet route"),
            std::string::npos) << w[0];
  EXPECT_TRUE(railover::zeroPrefixWarnings(nics, {0, 24}, {false, true}).empty()) << "not a device: not judged";
  EXPECT_TRUE(railover::zeroPrefixWarnings(nics, {8, 24}).empty());
  EXPECT_TRUE(railover::zeroPrefixWarnings(nics, {-1, 24}).empty()) << "unknown: no claim";
}

// An address of this host on an interface railover does not use (or a NIC's second address)
// is no stand-in for a peer: the kernel routes it through lo whatever the source, which named lo
// for every NIC sharing the subnet. The lookups skip it.
TEST(Devices, AnAddressOfThisHostIsNoReversePathLookupsDestination) {
  std::vector<railover::Nic> nics{v4Nic("eth0", "10.0.0.1"), v4Nic("eth1", "10.0.0.11")};
  uint32_t vip = 10u << 24 | 2;  // 10.0.0.2, host order
  std::vector<std::string> dsts;
  auto route = [&](const sockaddr_in& src, const sockaddr_in& dst) {
    char d[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &dst.sin_addr, d, sizeof(d));
    dsts.push_back(d);
    return ntohl(dst.sin_addr.s_addr) == vip ? std::string("lo") : std::string("eth0");  // main table only
  };
  auto strict = [](const std::string&) { return 1; };
  auto w = railover::rpFilterWarnings(nics, {24, 24}, strict, route, {vip, 10u << 24 | 1, 127u << 24 | 1});
  EXPECT_EQ(dsts, (std::vector<std::string>{"10.0.0.3", "10.0.0.3"}));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("NIC eth1 shares subnet 10.0.0.0/24 with eth0, and its traffic to that subnet leaves through eth0"),
            std::string::npos) << w[0];
}

// rp_filter is IPv4's (IPv6 has no reverse-path filter sysctl): NICs whose address is IPv6 share
// no subnet here and their routes are not looked up, even where the filter reads 1 and the
// prefix lengths are known (lookupSubnets gives an IPv6 NIC its /64).
TEST(Devices, Ipv6OnlyNicsGetNoReversePathFilteringWarning) {
  std::vector<railover::Nic> nics(3);
  const char* addrs[] = {"fd00::1", "fd00::2", "fd00::3"};
  for (size_t i = 0; i < nics.size(); ++i) {
    nics[i].name = "eth" + std::to_string(i);
    auto& a = (sockaddr_in6&)nics[i].addr;
    a.sin6_family = AF_INET6;
    inet_pton(AF_INET6, addrs[i], &a.sin6_addr);
    nics[i].addrLen = sizeof(sockaddr_in6);
  }
  int lookups = 0;
  auto route = [&](const sockaddr_in&, const sockaddr_in&) { return ++lookups, std::string("eth0"); };
  auto strict = [](const std::string&) { return 1; };
  for (const std::vector<int>& len : {std::vector<int>{64, 64, 64}, std::vector<int>{24, 24, 24}})
    EXPECT_TRUE(railover::rpFilterWarnings(nics, len, strict, route).empty());
  EXPECT_EQ(lookups, 0);
  // one IPv4 NIC among them shares its subnet with none
  nics[2] = v4Nic("eth2", "10.0.0.1");
  EXPECT_TRUE(railover::rpFilterWarnings(nics, {64, 64, 24}, strict, route).empty());
  EXPECT_EQ(lookups, 0);
}

// A NIC with no master (loopback), and an ifindex no interface has, are in no VRF.
TEST(Devices, ANicWithoutAMasterIsInNoVrf) {
  EXPECT_EQ(railover::l3mdevMaster((int)if_nametoindex("lo")), 0);
  EXPECT_EQ(railover::l3mdevMaster(0), 0);
  EXPECT_EQ(railover::l3mdevMaster(1 << 30), 0);
}
