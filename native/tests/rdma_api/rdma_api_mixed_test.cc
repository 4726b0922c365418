// The plugin API (api::*) over the RDMA transport in mixed mode (RAILOVER_TRANSPORT=rdma+tcp):
// device 0 has an RDMA port (fake verbs, fake0 port 1), device 1 has none and is served over
// TCP. What NCCL sees per device: its properties, the listen handle (its kind and the NICs it
// carries), connect's refusal of a handle of the other kind, and registration for a comm on
// the TCP device. Its own binary: it installs the RDMA transport into the process-wide runtime
// (as the engine suite installs its fake), which the other RDMA suites must not see.
//
// Single-threaded: the test thread plays NCCL and the acceptor (FakeTransport::pump routes the
// TCP device's streams through the runtime's link registry).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "common/config.h"
#include "plugin/api.h"
#include "plugin/runtime.h"
#include "tests/fake_net.h"
#include "tests/log_capture.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/scripted_health.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"

namespace railover {
namespace {

constexpr const char* kA0 = "10.0.0.1";  // device 0: the RDMA NIC
constexpr const char* kA1 = "10.0.1.1";  // device 1: no RDMA port, served over TCP
constexpr uint32_t kMaxRecvsSetting = 8;  // RAILOVER_MAX_RECVS as a PXN job would set it

class RdmaMixedApi : public ::testing::Test {
 protected:
  // Once per binary: the fake verbs world, the mixed transport over the byte-stream fake, and
  // the runtime with both devices. They live as long as the binary (links may refer to them).
  static void SetUpTestSuite() {
    ::fake::reset();
    boot = new fake::FakeTransport();
    boot->nicAddr = {kA0, kA1};
    std::string err;
    t = new rdma::RdmaTransport(std::vector<verbs::PortSel>{rdmatest::portOf("fake0", 1), verbs::PortSel{}}, boot,
                                &err);
    ASSERT_TRUE(t->ok()) << err;
    Health::install(new fake::ScriptedHealth());
    Config cfg;
    cfg.transport = TransportKind::kMixed;
    cfg.maxRecvs = kMaxRecvsSetting;
    cfg.fatalTimeoutS = 5;
    Runtime::get().initForTest(cfg, {testbed::makeNic(0, "r0", kA0, 0), testbed::makeNic(1, "mgmt0", kA1, 1)}, t);
    boot->router = &Runtime::get().links;
  }
  // The handle `dev`'s listen() made, decoded by the transport that reads that kind (the RDMA
  // transport reads "rdma" handles, its bootstrap TCP transport "tcp" ones).
  static PeerHandle decode(const uint8_t* handle, bool tcp) {
    PeerHandle h;
    std::string err;
    bool ok = tcp ? boot->decodeHandle(handle, kTransportHandleBytes, &h, &err)
                  : t->decodeHandle(handle, kTransportHandleBytes, &h, &err);
    EXPECT_TRUE(ok) << err;
    return h;
  }
  static std::vector<std::string> addrsOf(const PeerHandle& h) {
    std::vector<std::string> out;
    for (int i = 0; i < h.naddr; ++i) {
      char buf[64] = {};
      auto* sin = reinterpret_cast<const sockaddr_in*>(&h.addrs[i].addr);
      inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf);
      out.push_back(buf);
    }
    return out;
  }
  static fake::FakeTransport* boot;
  static rdma::RdmaTransport* t;
};
fake::FakeTransport* RdmaMixedApi::boot = nullptr;
rdma::RdmaTransport* RdmaMixedApi::t = nullptr;

// getProperties per device: the RDMA device offers grouped receives (RAILOVER_MAX_RECVS) and
// the RDMA transport's memory kinds; the TCP device host memory and maxRecvs 1, as NCCL's
// socket transport (its sender is told no posted receive).
TEST_F(RdmaMixedApi, EachDeviceReportsItsOwnKindsProperties) {
  int n = 0;
  ASSERT_EQ(api::devices(&n), ncclSuccess);
  ASSERT_EQ(n, 2);
  api::Props rdmaDev{}, tcpDev{};
  ASSERT_EQ(api::getProperties(0, &rdmaDev), ncclSuccess);
  ASSERT_EQ(api::getProperties(1, &tcpDev), ncclSuccess);
  EXPECT_EQ(rdmaDev.maxRecvs, (int)kMaxRecvsSetting);
  EXPECT_EQ(tcpDev.maxRecvs, 1) << "no grouped receives over TCP";
  EXPECT_EQ(rdmaDev.ptrSupport, (int)t->ptrSupport(0));
  EXPECT_EQ(tcpDev.ptrSupport, RAILOVER_NCCL_PTR_HOST);
  EXPECT_STREQ(tcpDev.name, "mgmt0");
}

// listen(): the handle names the device's kind and carries only the NICs of that kind (a comm
// never takes a standby path of the other kind).
TEST_F(RdmaMixedApi, TheListenHandleNamesTheDevicesKindAndCarriesOnlyItsNics) {
  uint8_t h0[128] = {}, h1[128] = {};
  void *l0 = nullptr, *l1 = nullptr;
  ASSERT_EQ(api::listen(0, h0, &l0), ncclSuccess);
  ASSERT_EQ(api::listen(1, h1, &l1), ncclSuccess);
  PeerHandle p0 = decode(h0, false), p1 = decode(h1, true);
  EXPECT_EQ(p0.transport, "rdma");
  EXPECT_EQ(addrsOf(p0), std::vector<std::string>{kA0}) << "the TCP NIC is not a standby of an RDMA comm";
  EXPECT_EQ(p1.transport, "tcp");
  EXPECT_EQ(addrsOf(p1), std::vector<std::string>{kA1}) << "the RDMA NIC is not a standby of a TCP comm";
  api::closeListen(l0);
  api::closeListen(l1);
}

// connect() on the RDMA device with a peer's TCP handle (NCCL paired this rank's RDMA NIC with
// the peer's TCP NIC): refused with ncclInvalidUsage and a WARN that names both kinds, the
// setting and the safe choice; no comm is made.
TEST_F(RdmaMixedApi, ConnectRefusesAHandleOfTheOtherKindNamingBoth) {
  uint8_t h1[128] = {};
  void* l1 = nullptr;
  ASSERT_EQ(api::listen(1, h1, &l1), ncclSuccess);
  testlog::Scope logs(nullptr);
  void* s = nullptr;
  EXPECT_EQ(api::connect(0, h1, &s, -1), ncclInvalidUsage);
  EXPECT_EQ(s, nullptr);
  auto w = testlog::warnings();
  ASSERT_EQ(w.size(), 1u) << testlog::all();
  EXPECT_NE(w[0].find("the peer listens with the tcp transport but this NIC is served by rdma"), std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("RAILOVER_TRANSPORT=rdma+tcp, this process runs rdma+tcp"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("auto leaves the tcp NICs out"), std::string::npos) << w[0];
  api::closeListen(l1);
}

// A comm on the TCP device: NCCL's regMr names it, so its buffer is registered as the TCP
// transport does, on no HCA; GPU memory is refused naming the NIC and the tcp transport. A
// comm's deregMr releases it. Bytes still move: one message, every byte checked.
TEST_F(RdmaMixedApi, ACommOnTheTcpDeviceRegistersOnNoHcaAndMovesItsBytes) {
  uint8_t h1[128] = {};
  void* l1 = nullptr;
  ASSERT_EQ(api::listen(1, h1, &l1), ncclSuccess);
  void *s = nullptr, *r = nullptr;
  for (int i = 0; i < 100000 && !(s && r) && !HasFailure(); ++i) {
    if (!s) {
      ASSERT_EQ(api::connect(1, h1, &s, -1), ncclSuccess);
    }
    boot->pump();
    if (!r) {
      ASSERT_EQ(api::accept(l1, &r), ncclSuccess);
    }
  }
  api::closeListen(l1);
  ASSERT_TRUE(s && r) << "the TCP device's comm did not connect";

  std::vector<uint8_t> src(64 * 1024), dst(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)(i * 131 + 7);
  int before = ::fake::liveMrs();
  void *ms = nullptr, *mr = nullptr;
  ASSERT_EQ(api::regMr(s, src.data(), src.size(), RAILOVER_NCCL_PTR_HOST, &ms), ncclSuccess);
  ASSERT_EQ(api::regMr(r, dst.data(), dst.size(), RAILOVER_NCCL_PTR_HOST, &mr), ncclSuccess);
  EXPECT_EQ(::fake::liveMrs(), before) << "a TCP comm's buffers must not be pinned on any HCA";
  {
    testlog::Scope logs(nullptr);
    void* gpu = nullptr;
    EXPECT_EQ(api::regMr(s, src.data(), src.size(), RAILOVER_NCCL_PTR_CUDA, &gpu), ncclSystemError);
    EXPECT_EQ(gpu, nullptr);
    auto w = testlog::warnings();
    ASSERT_EQ(w.size(), 1u) << testlog::all();
    EXPECT_NE(w[0].find("with the tcp transport: NIC 1 is served over TCP"), std::string::npos) << w[0];
  }

  void *sreq = nullptr, *rreq = nullptr;
  void* data = dst.data();
  size_t cap = dst.size();
  int tag = 3;
  int sdone = 0, rdone = 0, ssize = 0, rsize = 0;
  for (int i = 0; i < 1000000 && !(sdone && rdone) && !HasFailure(); ++i) {
    if (!sreq) {
      ASSERT_EQ(api::isend(s, src.data(), src.size(), tag, ms, &sreq), ncclSuccess);
    }
    if (!rreq) {
      ASSERT_EQ(api::irecv(r, 1, &data, &cap, &tag, &mr, &rreq), ncclSuccess);
    }
    boot->pump();
    if (sreq && !sdone) {
      ASSERT_EQ(api::test(sreq, &sdone, &ssize), ncclSuccess);
    }
    if (rreq && !rdone) {
      ASSERT_EQ(api::test(rreq, &rdone, &rsize), ncclSuccess);
    }
  }
  ASSERT_TRUE(sdone && rdone) << "the message did not complete";
  EXPECT_EQ(rsize, (int)src.size());
  EXPECT_EQ(dst, src) << "every byte";

  EXPECT_EQ(api::deregMr(s, ms), ncclSuccess);
  EXPECT_EQ(api::deregMr(r, mr), ncclSuccess);
  EXPECT_EQ(::fake::liveMrs(), before);
  api::closeSend(s);
  api::closeRecv(r);
}

}  // namespace
}  // namespace railover
