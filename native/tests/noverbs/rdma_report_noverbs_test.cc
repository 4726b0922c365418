// railover_rdma_report_json's body in a build without the RDMA transport (compiled without
// RAILOVER_HAVE_VERBS, as where rdma-core's headers are absent): it says so, auto gives TCP and
// RAILOVER_TRANSPORT=rdma is reported as the init error it would be.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "abi/nccl_net_abi.h"
#include "plugin/rdma_report.h"

#ifdef RAILOVER_HAVE_VERBS
#error "this test must be compiled without RAILOVER_HAVE_VERBS"
#endif

namespace railover {
namespace {

std::string reportFor(const std::map<std::string, std::string>& vars) {
  EnvLookup env = [vars](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  return rdmaReportJson({"lo"}, env);
}

bool has(const std::string& json, const std::string& part) { return json.find(part) != std::string::npos; }

TEST(RdmaReportWithoutVerbs, SaysSoAndAutoIsTcp) {
  const std::string no = "this build of railover has no RDMA transport (built without rdma-core's headers)";
  std::string r = reportFor({});
  EXPECT_TRUE(has(r, "\"built_with_verbs\":false,\"libibverbs\":{\"loaded\":false,\"error\":\"" + no + "\"}")) << r;
  // init's reason (planTransport) names the fix
  const std::string fix = no.substr(0, no.size() - 1) + ": install libibverbs-dev and rebuild)";
  EXPECT_TRUE(has(r, "\"transport\":\"tcp\",\"transport_why\":\"RAILOVER_TRANSPORT=auto: " + fix + "\",\"warnings\":[]")) << r;
  EXPECT_TRUE(has(r, "{\"nic\":\"lo\",\"choice\":\"failed\",\"why\":\"" + no + "\"")) << r;
  EXPECT_TRUE(has(r, "\"ports\":[],\"device\":\"tcp\"}")) << r;
  r = reportFor({{"RAILOVER_TRANSPORT", "rdma"}});
  EXPECT_TRUE(has(r, "\"transport\":\"error\",\"transport_why\":\"RAILOVER_TRANSPORT=rdma: " + fix + "\"")) << r;
  EXPECT_TRUE(has(r, "\"ports\":[],\"device\":\"\"}")) << "init fails: no NIC is a device: " << r;
  r = reportFor({{"RAILOVER_TRANSPORT", "tcp"}, {"RAILOVER_MAX_RECVS", "4"}});
  EXPECT_TRUE(has(r, "\"transport\":\"tcp\"")) << r;
  EXPECT_TRUE(has(r, "\"warnings\":[\"RAILOVER_MAX_RECVS=4 has no effect with the tcp transport")) << r;
}

}  // namespace
}  // namespace railover
