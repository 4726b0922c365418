// railover_rdma_report_json's body (plugin/rdma_report.h) over the fake verbs provider: the
// per-NIC port, state, link layer and GID come from the plugin's own choice, the auto rule
// follows rdmaUsable, and NCCL_IB_HCA / bad values show as they would at init.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <cstring>
#include <map>
#include <string>

#include "../verbs/fake_verbs.h"
#include "abi/nccl_net_abi.h"
#include "common/config.h"
#include "plugin/rdma_report.h"
#include "plugin/devices.h"
#include "plugin/runtime.h"
#include "telemetry/journal.h"
#include "tests/log_capture.h"
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
                     "\"port\":2,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"allowed\":true}],\"device\":\"rdma\"}"))
      << r;
  EXPECT_TRUE(has(r, "\"setting\":\"auto\",\"transport\":\"rdma\"")) << r;
  // The fake HCA takes dmabufs (its ibv_reg_dmabuf_mr answers fd -1 with EBADF), no peer-memory
  // client is loaded here: ptr_support is what RdmaTransport::ptrSupport would advertise.
  EXPECT_TRUE(has(r, "\"memory\":{\"ptr_support\":[\"HOST\",\"DMABUF\"],")) << r;
  EXPECT_TRUE(has(r, "\"dmabuf\":[{\"hca\":\"fake1\",\"supported\":true")) << r;
  fake::setDmabuf(false);  // EOPNOTSUPP: host memory only
  r = reportFor({});
  EXPECT_TRUE(has(r, "\"memory\":{\"ptr_support\":[\"HOST\"],")) << r;
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

// The report's "unused_ports" section (between its key and "memory").
std::string unusedOf(const std::string& r) {
  size_t a = r.find("\"unused_ports\":["), b = r.find("],\"memory\"");
  return a == std::string::npos || b == std::string::npos ? "" : r.substr(a, b - a + 1);
}

// Every HCA port no evaluated NIC uses is listed with why: an InfiniBand port without IPoIB (the
// case where RAILOVER_TRANSPORT=auto silently ran TCP), a port bound to no interface, one
// whose interface is not selected, one NCCL_IB_HCA excludes, a second port of a NIC that uses
// another. The port a NIC uses is not listed.
TEST(RdmaReport, UnusedPortsAreListedWithWhy) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  fake::setGids("fake1", 1, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  fake::setGids("fake1", 2, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  fake::setLinkLayer("fake0", 1, IBV_LINK_LAYER_INFINIBAND);
  std::string u = unusedOf(reportFor({}));
  EXPECT_TRUE(has(u, "{\"hca\":\"fake0\",\"port\":1,\"state\":\"ACTIVE\",\"link_layer\":\"InfiniBand\",\"netdevs\":[],"
                     "\"why\":\"InfiniBand port without an IPoIB interface: railover runs each path over a NIC with an IP "
                     "address")) << u;
  EXPECT_TRUE(has(u, "{\"hca\":\"fake0\",\"port\":2,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"netdevs\":[],"
                     "\"why\":\"no network interface is bound to its GIDs\"}")) << u;
  EXPECT_TRUE(has(u, "{\"hca\":\"fake1\",\"port\":2,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"netdevs\":[\"lo\"],"
                     "\"why\":\"NIC lo is on it but uses fake1 port 1 (one HCA port per NIC)\"}")) << u;
  EXPECT_FALSE(has(u, "\"hca\":\"fake1\",\"port\":1,")) << "the port lo uses is not unused: " << u;

  EnvLookup none = [](const char*) -> const char* { return nullptr; };
  u = unusedOf(rdmaReportJson({"nordma0"}, none));
  EXPECT_TRUE(has(u, "{\"hca\":\"fake1\",\"port\":1,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"netdevs\":[\"lo\"],"
                     "\"why\":\"its interface(s) lo are not among the selected NICs")) << u;

  u = unusedOf(reportFor({{"NCCL_IB_HCA", "^fake1:1"}}));
  EXPECT_TRUE(has(u, "{\"hca\":\"fake1\",\"port\":1,\"state\":\"ACTIVE\",\"link_layer\":\"Ethernet\",\"netdevs\":[\"lo\"],"
                     "\"why\":\"excluded by NCCL_IB_HCA='^fake1:1'\"}")) << u;
  EXPECT_FALSE(has(u, "\"hca\":\"fake1\",\"port\":2,")) << "lo uses fake1 port 2 now: " << u;

  // The same list for the init WARN (RAILOVER_TRANSPORT=auto falling back to TCP), with the
  // port's state: a port that is down is listed, and the WARN names only ACTIVE ones.
  fake::setPortState("fake0", 2, IBV_PORT_DOWN);
  IbConfig ib;
  std::vector<UnusedRdmaPort> v = unusedRdmaPorts({"nordma0"}, ib);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].hca + ":" + std::to_string(v[0].port) + " " + v[0].state + " " + v[0].linkLayer, "fake0:1 ACTIVE InfiniBand");
  EXPECT_EQ(v[1].hca + ":" + std::to_string(v[1].port) + " " + v[1].state, "fake0:2 DOWN");
  EXPECT_EQ(v[2].netdevs, std::vector<std::string>{"lo"});
  std::string w = idleRdmaPortsWarning("auto", {"nordma0"}, ib);
  EXPECT_EQ(w.rfind("RAILOVER_TRANSPORT=auto runs over tcp on NIC(s) nordma0, but ACTIVE RDMA ports are unused: "
                    "fake0 port 1 (InfiniBand): InfiniBand port without an IPoIB interface", 0), 0u) << w;
  EXPECT_EQ(w.find("fake0 port 2"), std::string::npos) << "a port that is down is not named: " << w;
  EXPECT_NE(w.find("; fake1 port 1 (Ethernet): its interface(s) lo are not among the selected NICs"), std::string::npos) << w;
  EXPECT_NE(w.find("(railover doctor lists them)"), std::string::npos) << w;
  // A port NCCL_IB_HCA excludes is the operator's choice: listed, not named in the WARN.
  IbConfig noFake1 = ib;
  noFake1.hca.exclude = true, noFake1.hca.items = {HcaSpec{"fake1", -1}}, noFake1.hcaText = "^fake1";
  std::string wx = idleRdmaPortsWarning("auto", {"nordma0"}, noFake1);
  EXPECT_NE(wx.find("fake0 port 1 (InfiniBand)"), std::string::npos) << wx;
  EXPECT_EQ(wx.find("fake1"), std::string::npos) << wx;
  EXPECT_EQ(unusedRdmaPorts({"nordma0"}, noFake1)[2].why, "excluded by NCCL_IB_HCA='^fake1'");
  // Nothing ACTIVE unused: no WARN.
  for (const char* d : {"fake0", "fake1"})
    for (int port : {1, 2}) fake::setPortState(d, port, IBV_PORT_DOWN);
  EXPECT_EQ(idleRdmaPortsWarning("auto", {"nordma0"}, ib), "");
}

// The plugin's init (Runtime::chooseTransport): RAILOVER_TRANSPORT=auto with no RDMA port behind
// the NIC falls back to tcp, and WARNs naming the ACTIVE ports no NIC is on (here an InfiniBand
// port without IPoIB, and Ethernet ports bound to no interface); with every port down, no WARN.
TEST(RdmaAutoFallback, AutoFallingBackToTcpBesideActiveRdmaPortsWarnsNamingThem) {
  fake::reset();
  fake::setLinkLayer("fake0", 1, IBV_LINK_LAYER_INFINIBAND);
  auto choose = [](std::vector<std::string>* warnings) {
    testlog::Scope logs(nullptr);
    Runtime rt;
    rt.nics = {testbed::makeNic(0, "lo", "127.0.0.1")};
    rt.ports = {0};
    std::string err;
    EXPECT_TRUE(rt.chooseTransportForTest(&err)) << err;
    std::string name = rt.transport ? rt.transport->name() : "";
    delete rt.transport;
    rt.transport = nullptr;
    *warnings = testlog::warnings();
    return name;
  };
  std::vector<std::string> w;
  EXPECT_EQ(choose(&w), "tcp");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("railover: RAILOVER_TRANSPORT=auto runs over tcp on NIC(s) lo, but ACTIVE RDMA ports are "
                       "unused: fake0 port 1 (InfiniBand): InfiniBand port without an IPoIB interface", 0), 0u) << w[0];
  EXPECT_NE(w[0].find("; fake1 port 2 (Ethernet): no network interface is bound to its GIDs"), std::string::npos) << w[0];
  for (const char* d : {"fake0", "fake1"})
    for (int port : {1, 2}) fake::setPortState(d, port, IBV_PORT_DOWN);
  EXPECT_EQ(choose(&w), "tcp");
  EXPECT_TRUE(w.empty()) << w[0];
}

// The report and init apply one rule (planTransport): for each setting and host, init's choice
// (the transport it runs, or its error), the NICs it keeps as NCCL's devices and every WARN it
// logs about the choice are what the report says (transport, each NIC's device, warnings).
TEST(RdmaReport, InitAndTheReportAgreeOnTheChoiceItsDevicesAndItsWarnings) {
  fake::reset();
  unsigned lo = if_nametoindex("lo");
  fake::setGids("fake0", 1, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  fake::setLinkLayer("fake1", 1, IBV_LINK_LAYER_INFINIBAND);  // IB without IPoIB: idle
  struct Case {
    std::vector<std::string> nics;
    std::map<std::string, std::string> env;
    std::string transport;                  // the report's "transport" = init's kinds() or "error"
    std::vector<std::string> devices;       // the report's per-NIC "device"
    size_t warnings;                        // how many WARNs init logs about the choice
  };
  const std::vector<Case> cases = {
      {{"lo"}, {}, "rdma", {"rdma"}, 0},
      {{"lo", "nordma0"}, {}, "rdma", {"rdma", "left_out"}, 1},
      {{"lo", "nordma0"}, {{"RAILOVER_TRANSPORT", "rdma+tcp"}, {"RAILOVER_MAX_RECVS", "8"}}, "rdma+tcp", {"rdma", "tcp"}, 2},
      {{"lo", "nordma0"}, {{"RAILOVER_TRANSPORT", "rdma"}}, "error", {"", ""}, 0},
      {{"nordma0"}, {}, "tcp", {"tcp"}, 1},  // the idle ports: fake0 port 1 (lo unselected), fake1's IB port
      {{"nordma0"}, {{"RAILOVER_TRANSPORT", "tcp"}, {"RAILOVER_MAX_RECVS", "2"}}, "tcp", {"tcp"}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("NICs " + joinNames(c.nics) + ", RAILOVER_TRANSPORT=" +
                 (c.env.count("RAILOVER_TRANSPORT") ? c.env.at("RAILOVER_TRANSPORT") : std::string("auto")));
    EnvLookup env = [&c](const char* k) -> const char* {
      auto it = c.env.find(k);
      return it == c.env.end() ? nullptr : it->second.c_str();
    };
    const std::string r = rdmaReportJson(c.nics, env);
    // init, on the same NICs and environment
    testlog::Scope logs(nullptr);
    Runtime rt;
    std::string err;
    ASSERT_TRUE(parseConfig(env, &rt.cfg, &err)) << err;
    for (size_t i = 0; i < c.nics.size(); ++i)
      rt.nics.push_back(
          testbed::makeNic(static_cast<int>(i), c.nics[i].c_str(), ("127.0.0." + std::to_string(i + 1)).c_str()));
    rt.ports.assign(rt.nics.size(), 0);
    const bool ok = rt.chooseTransportForTest(&err);
    const std::string initChoice = ok ? rt.transport->kinds() : "error";
    std::vector<std::string> kept;
    for (const Nic& n : rt.nics) kept.push_back(n.name);
    delete rt.transport;
    rt.transport = nullptr;
    EXPECT_EQ(initChoice, c.transport) << err;
    EXPECT_TRUE(has(r, "\"transport\":" + jsonStr(c.transport) + ",")) << r;
    if (!ok) {
      EXPECT_TRUE(has(r, "\"transport_why\":" + jsonStr(err) + ",")) << "init's error: " << err << "\n" << r;
    }
    // the NICs init keeps as NCCL's devices are the report's rdma / tcp ones
    std::vector<std::string> devices;
    for (size_t i = 0; i < c.nics.size(); ++i) {
      EXPECT_TRUE(has(r, "\"device\":" + jsonStr(c.devices[i]) + "}")) << c.nics[i] << ": " << r;
      if (ok && c.devices[i] != "left_out") devices.push_back(c.nics[i]);
    }
    if (ok) {
      EXPECT_EQ(kept, devices);
    }
    // every WARN init logs about the choice, word for word, and no other
    std::vector<std::string> w = testlog::warnings();
    EXPECT_EQ(w.size(), c.warnings) << testlog::all();
    std::string want;
    for (const std::string& line : w) {
      ASSERT_EQ(line.rfind("railover: ", 0), 0u) << line;
      want += std::string(want.empty() ? "" : ",") + jsonStr(line.substr(std::strlen("railover: ")));
    }
    EXPECT_TRUE(has(r, "\"warnings\":[" + want + "],")) << r;
  }
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
