// Unit tests: configuration parsing (every bad value names its variable) and interface
// selection syntax.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/config.h"
#include "plugin/devices.h"

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
  };
  for (auto& env : bad) {
    Config c;
    std::string err;
    EXPECT_FALSE(parse(env, &c, &err)) << env.begin()->first << "=" << env.begin()->second;
    EXPECT_NE(err.find(env.begin()->first), std::string::npos) << err;
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

TEST(Config, ParseUint) {
  uint64_t v;
  EXPECT_TRUE(parseUint("42", 0, 100, &v));
  EXPECT_EQ(v, 42u);
  EXPECT_FALSE(parseUint("", 0, 100, &v));
  EXPECT_FALSE(parseUint("101", 0, 100, &v));
  EXPECT_FALSE(parseUint("4 2", 0, 100, &v));
  EXPECT_FALSE(parseUint("99999999999999999999999", 0, UINT64_MAX, &v));
}
