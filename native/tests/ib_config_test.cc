// Unit tests: NCCL's IB variables in railover's parameter table (NCCL_IB_HCA, NCCL_IB_GID_INDEX,
// NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE, NCCL_IB_TC, NCCL_IB_SL,
// NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_QPS_PER_CONNECTION, NCCL_IB_PKEY): NCCL's defaults,
// good values, and bad values whose error names the variable.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/config.h"
#include "common/params.h"

using namespace railover;

namespace {
bool parse(std::map<std::string, std::string> env, Config* c, std::string* err) {
  return parseConfig(
      [&](const char* k) -> const char* {
        auto it = env.find(k);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      c, err);
}
}  // namespace

TEST(IbConfig, NcclDefaults) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({}, &c, &err)) << err;
  const IbConfig& ib = c.ib;
  EXPECT_TRUE(ib.hca.items.empty());
  EXPECT_TRUE(ib.hca.allows("mlx5_0", 1));
  EXPECT_EQ(ib.gidIndex, -1);
  EXPECT_EQ(ib.roceVersion, 2u);
  EXPECT_EQ(ib.addrFamily, AF_INET);
  EXPECT_FALSE(ib.addrRangeSet);
  EXPECT_EQ(ib.timeout, 20u);
  EXPECT_EQ(ib.retryCnt, 7u);
  EXPECT_EQ(ib.sl, 0u);
  EXPECT_EQ(ib.trafficClass, 0u);
  EXPECT_FALSE(ib.slSet);
  EXPECT_FALSE(ib.trafficClassSet);
  EXPECT_EQ(ib.qpsPerConnection, 1u);
  EXPECT_EQ(ib.pkeyIndex, 0u);
  EXPECT_EQ(ib.relaxedOrdering, 2u);  // NCCL_IB_PCI_RELAXED_ORDERING: on where capable
  // empty = unset, as for every variable
  ASSERT_TRUE(parse({{"NCCL_IB_HCA", " "}, {"NCCL_IB_GID_INDEX", ""}, {"NCCL_IB_ADDR_RANGE", ""}, {"NCCL_IB_SL", ""}},
                    &c, &err))
      << err;
  EXPECT_TRUE(c.ib.hca.items.empty());
  EXPECT_EQ(c.ib.gidIndex, -1);
  EXPECT_FALSE(c.ib.addrRangeSet);
  EXPECT_FALSE(c.ib.slSet);
}

TEST(IbConfig, GoodValues) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"NCCL_IB_HCA", "^=mlx5_1,mlx5_4:2"},
                     {"NCCL_IB_GID_INDEX", "3"},
                     {"NCCL_IB_ROCE_VERSION_NUM", "1"},
                     {"NCCL_IB_ADDR_FAMILY", "AF_INET6"},
                     {"NCCL_IB_ADDR_RANGE", "fd00:1::/64"},
                     {"NCCL_IB_TC", "106"},
                     {"NCCL_IB_SL", "3"},
                     {"NCCL_IB_TIMEOUT", "14"},
                     {"NCCL_IB_RETRY_CNT", "6"},
                     {"NCCL_IB_QPS_PER_CONNECTION", "4"},
                     {"NCCL_IB_PKEY", "2"},
                     {"NCCL_IB_PCI_RELAXED_ORDERING", "0"}},
                    &c, &err))
      << err;
  const IbConfig& ib = c.ib;
  EXPECT_TRUE(ib.hca.exclude);
  EXPECT_TRUE(ib.hca.exact);
  ASSERT_EQ(ib.hca.items.size(), 2u);
  EXPECT_EQ(ib.hca.items[0].name, "mlx5_1");
  EXPECT_EQ(ib.hca.items[0].port, -1);
  EXPECT_EQ(ib.hca.items[1].name, "mlx5_4");
  EXPECT_EQ(ib.hca.items[1].port, 2);
  EXPECT_EQ(ib.hcaText, "^=mlx5_1,mlx5_4:2");
  EXPECT_EQ(ib.gidIndex, 3);
  EXPECT_EQ(ib.roceVersion, 1u);
  EXPECT_EQ(ib.addrFamily, AF_INET6);
  EXPECT_TRUE(ib.addrRangeSet);
  EXPECT_EQ(ib.addrRangeFamily, AF_INET6);
  EXPECT_EQ(ib.addrRangePrefix, 64);
  EXPECT_EQ(ib.addrRange[0], 0xfd);
  EXPECT_EQ(ib.addrRange[3], 0x01);
  EXPECT_EQ(ib.trafficClass, 106u);
  EXPECT_TRUE(ib.trafficClassSet);
  EXPECT_EQ(ib.sl, 3u);
  EXPECT_TRUE(ib.slSet);
  EXPECT_EQ(ib.timeout, 14u);
  EXPECT_EQ(ib.retryCnt, 6u);
  EXPECT_EQ(ib.qpsPerConnection, 4u);
  EXPECT_EQ(ib.pkeyIndex, 2u);
  EXPECT_EQ(ib.relaxedOrdering, 0u);
  // explicit 0 is "given" (NCCL then ignores the comm's traffic class)
  ASSERT_TRUE(parse({{"NCCL_IB_TC", "0"}, {"NCCL_IB_GID_INDEX", "-1"}, {"NCCL_IB_ADDR_RANGE", "10.1.0.0/16"}}, &c,
                    &err))
      << err;
  EXPECT_TRUE(c.ib.trafficClassSet);
  EXPECT_EQ(c.ib.gidIndex, -1);
  EXPECT_EQ(c.ib.addrRangeFamily, AF_INET);
  EXPECT_EQ(c.ib.addrRangePrefix, 16);
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, c.ib.addrRange, text, sizeof text);
  EXPECT_STREQ(text, "10.1.0.0");
}

TEST(IbConfig, BadValuesNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"NCCL_IB_HCA", "^"},
      {"NCCL_IB_HCA", "="},
      {"NCCL_IB_HCA", "mlx5_0,,mlx5_1"},
      {"NCCL_IB_HCA", "mlx5_0:0"},
      {"NCCL_IB_HCA", "mlx5_0:x"},
      {"NCCL_IB_HCA", "mlx5_0:1:2"},
      {"NCCL_IB_HCA", "=^mlx5_0"},
      {"NCCL_IB_HCA", ":1"},
      {"NCCL_IB_GID_INDEX", "-2"},
      {"NCCL_IB_GID_INDEX", "auto"},
      {"NCCL_IB_GID_INDEX", "65536"},
      {"NCCL_IB_ROCE_VERSION_NUM", "3"},
      {"NCCL_IB_ROCE_VERSION_NUM", "0"},
      {"NCCL_IB_ADDR_FAMILY", "ipv4"},
      {"NCCL_IB_ADDR_FAMILY", "AF_UNIX"},
      {"NCCL_IB_ADDR_RANGE", "10.1.0.0"},
      {"NCCL_IB_ADDR_RANGE", "10.1.0.0/33"},
      {"NCCL_IB_ADDR_RANGE", "10.1.0/16"},
      {"NCCL_IB_ADDR_RANGE", "10.1.0.0/x"},
      {"NCCL_IB_ADDR_RANGE", "fd00::/129"},
      {"NCCL_IB_TC", "256"},
      {"NCCL_IB_SL", "16"},
      {"NCCL_IB_SL", "-1"},
      {"NCCL_IB_TIMEOUT", "32"},
      {"NCCL_IB_RETRY_CNT", "8"},
      {"NCCL_IB_QPS_PER_CONNECTION", "0"},
      {"NCCL_IB_QPS_PER_CONNECTION", "129"},
      {"NCCL_IB_PKEY", "0x10000"},  // read as NCCL does (0x hex): 65536, out of range
      {"NCCL_IB_PKEY", "65536"},
      {"NCCL_IB_PCI_RELAXED_ORDERING", "3"},
      {"NCCL_IB_PCI_RELAXED_ORDERING", "-1"},
      {"NCCL_IB_PCI_RELAXED_ORDERING", "on"},
  };
  for (auto& [var, value] : bad) {
    Config c;
    std::string err;
    EXPECT_FALSE(parse({{var, value}}, &c, &err)) << var << "=" << value;
    EXPECT_EQ(err.rfind(std::string(var) + "='" + value + "' is not valid", 0), 0u) << err;
    // checkParam (doctor, `railover env`) says the same
    std::string err2;
    EXPECT_FALSE(checkParam(var, value, &err2)) << var << "=" << value;
    EXPECT_EQ(err2, err);
  }
}

TEST(IbConfig, RangeMustBeOfTheAddressFamily) {
  Config c;
  std::string err;
  EXPECT_FALSE(parse({{"NCCL_IB_ADDR_RANGE", "fd00::/64"}}, &c, &err));  // AF_INET by default
  EXPECT_EQ(err.rfind("NCCL_IB_ADDR_RANGE='fd00::/64' is not valid", 0), 0u) << err;
  EXPECT_NE(err.find("NCCL_IB_ADDR_FAMILY is AF_INET"), std::string::npos) << err;
  EXPECT_FALSE(parse({{"NCCL_IB_ADDR_FAMILY", "AF_INET6"}, {"NCCL_IB_ADDR_RANGE", "10.0.0.0/8"}}, &c, &err));
  EXPECT_NE(err.find("IPv4 range but NCCL_IB_ADDR_FAMILY is AF_INET6"), std::string::npos) << err;
  EXPECT_TRUE(parse({{"NCCL_IB_ADDR_FAMILY", "AF_INET6"}, {"NCCL_IB_ADDR_RANGE", "::/0"}}, &c, &err)) << err;
}

TEST(IbConfig, HcaFilterFollowsNcclSyntax) {
  HcaFilter f;
  std::string why;
  auto allows = [&](const char* spec, const char* dev, int port) {
    EXPECT_TRUE(parseHcaFilter(spec, &f, &why)) << spec << ": " << why;
    return f.allows(dev, port);
  };
  // prefixes
  EXPECT_TRUE(allows("mlx5", "mlx5_0", 1));
  EXPECT_TRUE(allows("mlx5", "mlx5_10", 2));
  EXPECT_FALSE(allows("mlx5", "rxe0", 1));
  EXPECT_TRUE(allows("rxe,mlx5", "rxe1", 1));
  // exact names
  EXPECT_FALSE(allows("=mlx5_1", "mlx5_10", 1));
  EXPECT_TRUE(allows("=mlx5_1", "mlx5_1", 1));
  // ports
  EXPECT_TRUE(allows("=mlx5_0:1,mlx5_1:1", "mlx5_1", 1));
  EXPECT_FALSE(allows("=mlx5_0:1,mlx5_1:1", "mlx5_1", 2));
  EXPECT_TRUE(allows("mlx5:2", "mlx5_3", 2));
  EXPECT_FALSE(allows("mlx5:2", "mlx5_3", 1));
  // exclusion
  EXPECT_FALSE(allows("^mlx5", "mlx5_0", 1));
  EXPECT_TRUE(allows("^mlx5", "rxe0", 1));
  EXPECT_FALSE(allows("^=mlx5_1,mlx5_4", "mlx5_4", 1));
  EXPECT_TRUE(allows("^=mlx5_1,mlx5_4", "mlx5_10", 1));
  EXPECT_FALSE(allows("^=rxe0:1", "rxe0", 1));
  EXPECT_TRUE(allows("^=rxe0:1", "rxe0", 2));
  EXPECT_TRUE(allows(" rxe0 , rxe1 ", "rxe1", 1));  // blanks around items are ignored
  EXPECT_FALSE(parseHcaFilter("^=", &f, &why));
  EXPECT_NE(why.find("no HCA named"), std::string::npos) << why;
  EXPECT_FALSE(parseHcaFilter("rxe0:256", &f, &why));
  EXPECT_NE(why.find("port must be an integer 1..255"), std::string::npos) << why;
}
