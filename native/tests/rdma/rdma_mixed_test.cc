// The RDMA transport's mixed mode (RAILOVER_TRANSPORT=rdma+tcp where an RDMA port backs some NICs
// only; rdma_transport.h): the NICs without one are served over TCP by the transport's own
// bootstrap TCP transport, and everything the plugin asks per NIC answers for that NIC's kind.
// Over the fake verbs provider and in-memory bootstrap streams (tests/fake_net.h).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "common/config.h"
#include "tests/fake_net.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/stream_path.h"

namespace railover {
namespace {

using rdmatest::gidOn;

using rdmatest::addrOf;
using rdmatest::portOf;

struct Mixed : ::testing::Test {
  void SetUp() override {
    ::fake::reset();
    boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
    std::string err;
    // NIC 0 on fake0 port 1; NIC 1 has no RDMA port (a PortSel without a device).
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), verbs::PortSel{}}, &boot,
                                              &err);
    ASSERT_TRUE(t->ok()) << err;
  }
  void TearDown() override {
    for (void* m : mrs) t->deregMr(m);
    t->worker().drain();
  }
  std::unique_ptr<SendPath> open(int nic, std::string* err) {
    PathIdentity id;
    id.secret = 7, id.connId = 9, id.pathIndex = 1, id.generation = 1;
    ChunkPolicy cp;
    cp.minChunkBytes = 128, cp.maxChunkBytes = 4096;
    return t->openSendPath(nic, addrOf(nic ? "10.0.1.1" : "10.0.0.1", 5000), sizeof(sockaddr_in), 2, id, cp, err);
  }
  fake::FakeTransport boot;
  std::unique_ptr<rdma::RdmaTransport> t;
  std::vector<void*> mrs;
};

// What the plugin reports and asks per NIC: the kind, the memory it registers, grouped
// receives, the device port and properties, and the INIT line.
TEST_F(Mixed, ANicWithoutAnRdmaPortAnswersAsATcpNic) {
  EXPECT_TRUE(t->mixed());
  EXPECT_EQ(t->kinds(), "rdma+tcp");
  EXPECT_STREQ(t->name(), "rdma");
  EXPECT_STREQ(t->nicTransport(0), "rdma");
  EXPECT_STREQ(t->nicTransport(1), "tcp");
  EXPECT_TRUE(t->overTcp(1));
  EXPECT_FALSE(t->overTcp(0));
  EXPECT_EQ(t->ptrSupport(1), Transport::kPtrHost) << "a TCP path sends from host memory only";
  EXPECT_TRUE(t->groupedReceivesOn(0));
  EXPECT_TRUE(t->tellsPostedReceivesOn(0));
  EXPECT_FALSE(t->groupedReceivesOn(1)) << "maxRecvs 1 on the TCP NIC: its sender is told no posted receive";
  EXPECT_FALSE(t->tellsPostedReceivesOn(1));
  Transport::DevicePort dp;
  EXPECT_TRUE(t->devicePort(0, &dp));
  EXPECT_EQ(dp.hca, "fake0");
  EXPECT_FALSE(t->devicePort(1, &dp)) << "no HCA port behind the TCP NIC (the state file's \"rdma\": null)";
  Transport::DeviceProps props;
  EXPECT_FALSE(t->deviceProps(1, &props)) << "the netdev's own properties stay";
  EXPECT_EQ(t->nicDevice(1), "");
  EXPECT_EQ(t->nicDevice(0), "fake0 port 1");
  EXPECT_NE(t->describe().find("nic1 -> tcp [no RDMA port]"), std::string::npos) << t->describe();
  // The TCP NIC's comms get a TCP handle (the peer's TCP transport reads it as its own).
  PeerHandle h;
  h.secret = 5, h.transport = "tcp", h.naddr = 1;
  h.addrs[0].addr = addrOf("10.0.1.1", 5001), h.addrs[0].len = sizeof(sockaddr_in), h.addrs[0].rail = 1;
  uint8_t buf[kTransportHandleBytes] = {};
  std::string err;
  ASSERT_TRUE(t->encodeHandle(h, buf, &err)) << err;
  PeerHandle back;
  ASSERT_TRUE(boot.decodeHandle(buf, sizeof buf, &back, &err)) << err;
  EXPECT_EQ(back.transport, "tcp");
  EXPECT_EQ(back.secret, 5u);
}

// The paths: the TCP NIC's are the bootstrap transport's stream paths (as a TCP peer's), the
// RDMA NIC's are verbs paths; a buffer a TCP comm registered needs no flush.
TEST_F(Mixed, TheTcpNicsPathsAreStreamPathsAndNeedNoFlush) {
  std::string err;
  auto tcpPath = open(1, &err);
  ASSERT_TRUE(tcpPath) << err;
  EXPECT_NE(dynamic_cast<StreamSendPath*>(tcpPath.get()), nullptr) << "a TCP NIC's send path is a stream path";
  EXPECT_EQ(boot.pending.size(), 2u) << "its 2 streams connected through the bootstrap transport";
  auto rdmaPath = open(0, &err);
  ASSERT_TRUE(rdmaPath) << err;
  EXPECT_EQ(dynamic_cast<StreamSendPath*>(rdmaPath.get()), nullptr) << "the RDMA NIC's send path is a verbs path";
  EXPECT_EQ(boot.pending.size(), 3u) << "one bootstrap stream for the verbs path";
  auto rx = t->newRecvPathOn(1, 2);
  EXPECT_NE(dynamic_cast<StreamRecvPath*>(rx.get()), nullptr) << "a stream arriving on the TCP NIC gets a stream path";
  auto rrx = t->newRecvPathOn(0, 1);
  EXPECT_EQ(dynamic_cast<StreamRecvPath*>(rrx.get()), nullptr);

  std::vector<uint8_t> b(4096, 1);
  void* mr = rdmatest::regBuffer(*t, b, mrs);
  ASSERT_TRUE(mr);
  err.clear();
  EXPECT_EQ(t->flush(1, b.data(), mr, &err), nullptr);
  EXPECT_EQ(err, "") << "nothing to flush on the TCP NIC: its data came through host memory";
  rx.reset(), rrx.reset(), tcpPath.reset(), rdmaPath.reset();
}

// Registration for a comm on the TCP NIC (NCCL's regMr names the comm): host memory, pinned on
// no HCA (its paths never leave the NICs served over TCP); GPU memory and dmabufs are refused
// naming the NIC and the setting. A comm on the RDMA NIC, or none, registers on every HCA.
TEST_F(Mixed, ATcpNicsCommRegistersHostMemoryOnNoHca) {
  std::vector<uint8_t> b(4096, 1);
  std::string err;
  // A comm on the RDMA NIC first: its registration also builds the flush QPs (their own MRs).
  void* onRdma = t->regMrOn(0, b.data(), b.size(), Transport::kPtrHost, &err);
  ASSERT_TRUE(onRdma) << err;
  mrs.push_back(onRdma);
  int before = ::fake::liveMrs();
  void* host = t->regMrOn(1, b.data(), b.size(), Transport::kPtrHost, &err);
  ASSERT_TRUE(host) << err;
  mrs.push_back(host);
  EXPECT_EQ(::fake::liveMrs(), before) << "a TCP comm's buffer must not be registered (pinned) on any HCA";
  err.clear();
  EXPECT_EQ(t->flush(1, b.data(), host, &err), nullptr);
  EXPECT_EQ(err, "") << "nothing to flush: its data came through host memory";
  err.clear();
  EXPECT_EQ(t->regMrOn(1, b.data(), b.size(), Transport::kPtrCuda, &err), nullptr);
  EXPECT_NE(err.find("NIC 1 is served over TCP (RAILOVER_TRANSPORT=rdma+tcp)"), std::string::npos) << err;
  EXPECT_NE(err.find("host memory only"), std::string::npos) << err;
  err.clear();
  EXPECT_EQ(t->regMrDmaBufOn(1, b.data(), b.size(), 0, 0, &err), nullptr);
  EXPECT_NE(err.find("register no dmabufs"), std::string::npos) << err;

  void* noComm = t->regMrOn(-1, b.data(), b.size(), Transport::kPtrHost, &err);
  ASSERT_TRUE(noComm) << err;
  mrs.push_back(noComm);
  EXPECT_EQ(::fake::liveMrs(), before + 1) << "no comm: registered as regMr, on every HCA (one here)";
  // Both kinds are released by deregMr (the host registration is told apart, not read as an MrSet).
  t->deregMr(host);
  EXPECT_EQ(::fake::liveMrs(), before + 1);
  t->deregMr(noComm);
  EXPECT_EQ(::fake::liveMrs(), before);
  mrs = {onRdma};
}

// The plugin's constructor: without mixed mode a NIC with no RDMA port fails it (naming the
// NIC); with it that NIC is served over TCP, and with no RDMA port at all it fails.
TEST(RdmaMixedInit, ANicWithoutAPortFailsUnlessMixedAndMixedNeedsOneRdmaNic) {
  ::fake::reset();
  ::fake::setGids("fake0", 1, {gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, if_nametoindex("lo"))});
  Config cfg;
  std::vector<Nic> nics = {testbed::makeNic(0, "lo", "127.0.0.1"), testbed::makeNic(1, "nordma0", "127.0.0.2", 1)};
  std::string err;
  {
    rdma::RdmaTransport t(&nics, &cfg, &err);
    EXPECT_FALSE(t.ok());
    EXPECT_NE(err.find("NIC nordma0"), std::string::npos) << err;
  }
  err.clear();
  {
    rdma::RdmaTransport t(&nics, &cfg, &err, /*tcpWhereNoRdma=*/true);
    ASSERT_TRUE(t.ok()) << err;
    EXPECT_STREQ(t.nicTransport(0), "rdma");
    EXPECT_STREQ(t.nicTransport(1), "tcp");
    EXPECT_NE(t.describe().find("lo -> fake0 port 1"), std::string::npos) << t.describe();
    EXPECT_NE(t.describe().find("nordma0 -> tcp [no network interface named 'nordma0']"), std::string::npos)
        << t.describe();
  }
  err.clear();
  std::vector<Nic> none = {testbed::makeNic(0, "nordma0", "127.0.0.2")};
  rdma::RdmaTransport t(&none, &cfg, &err, true);
  EXPECT_FALSE(t.ok());
  EXPECT_EQ(err, "no NIC has an RDMA port");
}

}  // namespace
}  // namespace railover

namespace railover {
namespace {
using rdmatest::portOf;
// The mixed transport with the TCP NIC first (index 0, no HCA) and the RDMA NIC second (fake0
// port 1), over the byte-stream fake; check t->ok() (err says why not).
struct TcpFirst {
  TcpFirst() {
    ::fake::reset();
    boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{verbs::PortSel{}, portOf("fake0", 1)}, &boot,
                                              &err);
  }
  fake::FakeTransport boot;
  std::string err;
  std::unique_ptr<rdma::RdmaTransport> t;
};

// The port watch (a port error and its return, a device fatal error and the re-open), flush
// QPs and device properties with the TCP NIC first (index 0, no HCA) and the RDMA NIC second:
// nothing reads an HCA for the TCP NIC, and only the RDMA NIC is signalled. (Review.)
TEST(RdmaMixedWatch, ThePortWatchReopenAndFlushLeaveTheTcpNicAlone) {
  TcpFirst bed;
  ASSERT_TRUE(bed.t->ok()) << bed.err;
  rdma::RdmaTransport& t = *bed.t;
  std::string err;
  std::vector<uint8_t> b(4096, 1);
  std::vector<void*> mrs;
  void* mr = rdmatest::regBuffer(t, b, mrs);
  ASSERT_TRUE(mr);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, bool>> got;
  t.startPortWatch([&](int nic, bool up, const std::string&) {
    std::lock_guard<std::mutex> g(mu);
    got.push_back({nic, up});
    cv.notify_all();
  });
  auto waitFor = [&](size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return got.size() >= n; });
    return got;
  };
  ::fake::setPortState("fake0", 1, IBV_PORT_DOWN);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_PORT_ERR, 1);
  auto s = waitFor(1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, 1);
  ::fake::setPortState("fake0", 1, IBV_PORT_ACTIVE);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
  s = waitFor(2);
  ASSERT_EQ(s.size(), 2u);
  ::fake::deviceFatal("fake0");
  s = waitFor(4);
  ASSERT_EQ(s.size(), 4u) << "no down/up after the device fatal error";
  for (auto& x : s) EXPECT_EQ(x.first, 1);
  t.worker().drain();
  EXPECT_NE(t.flushQpForTest(1), nullptr);
  err.clear();
  auto op = t.flush(1, b.data(), mr, &err);
  EXPECT_TRUE(op) << err;
  op.reset();
  err.clear();
  EXPECT_EQ(t.flush(0, b.data(), mr, &err), nullptr);
  EXPECT_EQ(err, "");
  EXPECT_EQ(t.ptrSupport(0), Transport::kPtrHost);
  Transport::DeviceProps p;
  ASSERT_TRUE(t.deviceProps(1, &p));
  EXPECT_EQ(p.port, 1);

  for (void* m : mrs) t.deregMr(m);
  t.worker().drain();
}

// A comm on the TCP NIC registers and deregisters its buffers without waiting behind a
// re-opened HCA's re-registration of every buffer (MrSet::refresh under the registry lock,
// which may take long: every GPU buffer on the HCA again): its host registrations are kept
// apart. Here the re-registration is held (fake ibv_reg_mr) while the TCP NIC's comm
// registers and deregisters. (Review.)
TEST(RdmaMixedWatch, ATcpNicsRegistrationDoesNotWaitBehindAnHcaReopen) {
  TcpFirst bed;
  ASSERT_TRUE(bed.t->ok()) << bed.err;
  rdma::RdmaTransport& t = *bed.t;
  std::string err;
  std::vector<uint8_t> b(4096, 1);
  void* onRdma = t.regMrOn(1, b.data(), b.size(), Transport::kPtrHost, &err);
  ASSERT_TRUE(onRdma) << err;
  t.worker().drain();  // the flush QPs the first registration builds (their own MRs)
  t.startPortWatch([](int, bool, const std::string&) {});
  ::fake::blockMrRegistration(true);
  ::fake::deviceFatal("fake0");
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedMrRegistrations() == 0 && nowUs() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(::fake::blockedMrRegistrations(), 1) << "the re-opened HCA's re-registration never began";
  std::atomic<bool> done{false};
  std::string regErr;
  std::thread comm([&] {
    void* host = t.regMrOn(0, b.data(), b.size(), Transport::kPtrHost, &regErr);
    if (host) t.deregMr(host);
    done = host != nullptr;
  });
  for (uint64_t deadline = nowUs() + 5 * 1000 * 1000; !done && nowUs() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(done) << "the TCP NIC's regMr/deregMr waited behind the HCA's re-registration " << regErr;
  ::fake::blockMrRegistration(false);
  comm.join();
  EXPECT_TRUE(done) << regErr;
  t.deregMr(onRdma);
  t.worker().drain();
}
}  // namespace
}  // namespace railover
