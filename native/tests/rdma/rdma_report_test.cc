// railover_rdma_report_json's body (plugin/rdma_report.h) over the fake verbs provider: the
// per-NIC port, state, link layer and GID come from the plugin's own choice, the auto rule
// follows rdmaUsable, and NCCL_IB_HCA / bad values show as they would at init.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <map>
#include <string>

#include "../verbs/fake_verbs.h"
#include "abi/nccl_net_abi.h"
#include "common/config.h"
#include "plugin/rdma_report.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"

namespace railover {
namespace {

using rdmatest::gidOn;

std::string reportFor(const std::map<std::string, std::string>& vars) {
  EnvLookup env = [vars](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  return rdmaReportJson({"lo"}, env);
}

bool has(const std::string& json, const std::string& part) { return json.find(part) != std::string::npos; }

TEST(RdmaReport, ChosenPortStateGidAndAutoPicksRdma) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  fake::setGids("fake1", 2, {gidOn("fe80::1", IBV_GID_TYPE_ROCE_V2, lo), gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  fake::setPortRate("fake1", 2, 64, 2);  // HDR 4x
  std::string r = reportFor({});
  EXPECT_TRUE(has(r, "\"built_with_verbs\":true,\"libibverbs\":{\"loaded\":true,\"error\":\"\"}")) << r;
  EXPECT_TRUE(has(r, "{\"nic\":\"lo\",\"choice\":\"chosen\",\"why\":\"fake1 port 2 GID 1 (RoCE v2, IPv4 127.0.0.1, "
                     "bound to lo; NCCL_IB_GID_INDEX unset)\",\"hca\":\"fake1\",\"port\":2,\"link_layer\":\"Ethernet\","
                     "\"state\":\"ACTIVE\",\"gid_index\":1,\"gid\":\"::ffff:127.0.0.1\",\"rate_mbps\":200000,\"ports\":[{\"hca\":\"fake1\","
                     "\"port\":2,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"allowed\":true}]}"))
      << r;
  EXPECT_TRUE(has(r, "\"setting\":\"auto\",\"transport\":\"rdma\"")) << r;
  // The fake HCA takes dmabufs (its ibv_reg_dmabuf_mr answers fd -1 with EBADF), no peer-memory
  // client is loaded here: ptr_support is what RdmaTransport::ptrSupport would advertise.
  EXPECT_TRUE(has(r, "\"memory\":{\"ptr_support\":[\"HOST\",\"DMABUF\"]}")) << r;
  EXPECT_TRUE(has(r, "\"dmabuf\":[{\"hca\":\"fake1\",\"supported\":true")) << r;
  fake::setDmabuf(false);  // EOPNOTSUPP: host memory only
  r = reportFor({});
  EXPECT_TRUE(has(r, "\"memory\":{\"ptr_support\":[\"HOST\"]}")) << r;
  EXPECT_TRUE(has(r, "\"dmabuf\":[{\"hca\":\"fake1\",\"supported\":false")) << r;
  EXPECT_TRUE(has(r, "not supported by its driver")) << r;
}

TEST(RdmaReport, ExcludedByNcclIbHcaMakesAutoPickTcpAndRdmaAnError) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  fake::setGids("fake0", 1, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  std::string r = reportFor({{"NCCL_IB_HCA", "^fake0"}});
  EXPECT_TRUE(has(r, "\"choice\":\"excluded\",\"why\":\"HCA fake0 port 1 behind NIC lo is excluded by "
                     "NCCL_IB_HCA='^fake0': no RDMA on this NIC\"")) << r;
  EXPECT_TRUE(has(r, "\"ports\":[{\"hca\":\"fake0\",\"port\":1,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\","
                     "\"allowed\":false}]")) << r;
  EXPECT_TRUE(has(r, "\"transport\":\"tcp\",\"transport_why\":\"RAILOVER_TRANSPORT=auto: NIC lo: HCA fake0")) << r;
  r = reportFor({{"NCCL_IB_HCA", "^fake0"}, {"RAILOVER_TRANSPORT", "rdma"}});
  EXPECT_TRUE(has(r, "\"transport\":\"error\",\"transport_why\":\"RAILOVER_TRANSPORT=rdma: cannot use RDMA: NIC lo")) << r;
  r = reportFor({{"RAILOVER_TRANSPORT", "tcp"}});
  EXPECT_TRUE(has(r, "\"transport\":\"tcp\",\"transport_why\":\"RAILOVER_TRANSPORT=tcp\"")) << r;
}

TEST(RdmaReport, NoGidBoundAndBadValues) {
  fake::reset();
  std::string r = reportFor({});
  EXPECT_TRUE(has(r, "\"choice\":\"failed\",\"why\":\"no RDMA device is bound to NIC lo")) << r;
  EXPECT_TRUE(has(r, "\"gid_index\":-1,\"gid\":\"\",\"rate_mbps\":0,\"ports\":[]")) << r;
  EXPECT_TRUE(has(r, "\"transport\":\"tcp\"")) << r;
  r = reportFor({{"NCCL_IB_GID_INDEX", "x"}});
  EXPECT_TRUE(has(r, "\"config_error\":\"NCCL_IB_GID_INDEX")) << r;
  EXPECT_TRUE(has(r, "\"transport\":\"error\"")) << r;
  EXPECT_TRUE(has(r, "\"nics\":[]")) << r;
}

// A mix (a NIC with no RDMA port beside ones that have one): not every NIC is usable, and the
// caller learns which NICs have RDMA (RAILOVER_TRANSPORT=auto then runs the RDMA transport in
// mixed mode: rdma on those, tcp on the others; tests/rdma/rdma_mixed_test.cc).
TEST(RdmaUsable, AMixIsNotUsableEverywhereAndNamesTheNicsThatHaveRdma) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  fake::setGids("fake0", 1, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  Config cfg;
  std::vector<Nic> nics = {testbed::makeNic(0, "lo", "127.0.0.1"), testbed::makeNic(1, "nordma0", "127.0.0.2")};
  std::string why;
  std::vector<std::string> with;
  EXPECT_FALSE(rdma::rdmaUsable(nics, cfg, &why, &with));
  EXPECT_NE(why.find("NIC nordma0"), std::string::npos) << why;
  EXPECT_EQ(with, std::vector<std::string>{"lo"});
  with.clear();
  EXPECT_TRUE(rdma::rdmaUsable({nics[0]}, cfg, &why, &with));
  EXPECT_EQ(with, std::vector<std::string>{"lo"});
}

}  // namespace
}  // namespace railover
