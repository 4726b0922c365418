// NCCL_IB_PCI_RELAXED_ORDERING in the RDMA transport, over the fake verbs provider: with NCCL's
// default (2) and ibv_reg_mr_iova2 exported, every registration of NCCL's buffers (regMr through
// ibv_reg_mr_iova2, regMrDmaBuf through ibv_reg_dmabuf_mr) on every HCA carries
// IBV_ACCESS_RELAXED_ORDERING and railover's own MRs (flush landing buffers) never do; 0 never
// sets it; a libibverbs without ibv_reg_mr_iova2 sets it for neither 2 nor 1 (as NCCL) and fails
// nothing; an HCA whose kernel refuses the flag with EINVAL gets its buffers registered without
// it, is not asked again and is named in one WARN; a re-opened HCA registers again with the same
// choice. The RDMA report shows the choice as the transport makes it.
#include <fcntl.h>
#include <net/if.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "plugin/rdma_report.h"
#include "tests/fake_net.h"
#include "tests/log_capture.h"
#include "tests/rdma/rdma_test_ports.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/verbs/verbs_mr.h"

namespace railover {
namespace {

using rdmatest::portOf;

constexpr int kRo = IBV_ACCESS_RELAXED_ORDERING;

// A transport on fake0 port 1 and fake1 port 1 (two HCAs) with `ro` as NCCL_IB_PCI_RELAXED_ORDERING.
struct Rig {
  explicit Rig(uint32_t ro) {
    boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
    IbConfig ib;
    ib.relaxedOrdering = ro;
    std::string err;
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)},
                                              &boot, &err, ib);
    EXPECT_TRUE(t->ok()) << err;
    t->setGdrForTest(false, true);  // dmabuf on both HCAs
  }
  ~Rig() {
    for (void* m : mrs) t->deregMr(m);
    if (fd >= 0) close(fd);
  }
  verbs::MrSet* reg(std::vector<uint8_t>& b) {
    std::string err;
    void* m = t->regMr(b.data(), b.size(), (int)rdma::RdmaTransport::kPtrHost, &err);
    EXPECT_NE(m, nullptr) << err;
    if (m) mrs.push_back(m);
    return static_cast<verbs::MrSet*>(m);
  }
  verbs::MrSet* regDmaBuf(std::vector<uint8_t>& b) {
    if (fd < 0) fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // stands for the CUDA driver's dmabuf fd
    std::string err;
    void* m = t->regMrDmaBuf(b.data(), b.size(), 0, fd, &err);
    EXPECT_NE(m, nullptr) << err;
    if (m) mrs.push_back(m);
    return static_cast<verbs::MrSet*>(m);
  }
  fake::FakeTransport boot;
  std::unique_ptr<rdma::RdmaTransport> t;
  std::vector<void*> mrs;
  int fd = -1;
};

// The fake's record of HCA i's MR of `mr`.
::fake::MrInfo on(const verbs::MrSet* mr, size_t i) { return ::fake::mrInfo(mr->rkey(i)); }

TEST(RelaxedOrdering, DefaultWithIova2RegistersEveryNcclBufferWithTheFlagOnEveryHcaAndNothingElse) {
  ::fake::reset();
  Rig r(2);
  std::string why;
  EXPECT_TRUE(r.t->relaxedOrdering(&why)) << why;
  EXPECT_NE(r.t->describe().find("relaxed ordering on [NCCL_IB_PCI_RELAXED_ORDERING=2 (on where capable) and libibverbs "
                                  "has ibv_reg_mr_iova2"),
            std::string::npos)
      << r.t->describe();
  std::vector<uint8_t> host(8192), gpu(4096);
  verbs::MrSet* h = r.reg(host);
  verbs::MrSet* d = r.regDmaBuf(gpu);
  ASSERT_TRUE(h && d);
  for (size_t i = 0; i < 2; ++i) {
    ::fake::MrInfo a = on(h, i), b = on(d, i);
    ASSERT_TRUE(a.found && b.found);
    EXPECT_EQ(a.dev, i == 0 ? "fake0" : "fake1");
    EXPECT_EQ(a.call, "ibv_reg_mr_iova2");
    EXPECT_EQ(a.access, verbs::kMrAccess | kRo) << "host buffer on " << a.dev;
    EXPECT_EQ(a.iova, (uint64_t)(uintptr_t)host.data()) << "iova = the address, as NCCL passes it";
    EXPECT_EQ(b.call, "ibv_reg_dmabuf_mr");
    EXPECT_EQ(b.access, verbs::kMrAccess | kRo) << "dmabuf on " << b.dev;
    EXPECT_TRUE(h->relaxedOrdering(i));
    EXPECT_TRUE(d->relaxedOrdering(i));
  }
  // railover's own MRs (the flush QPs' landing buffers, built once a buffer is registered) are
  // registered as NCCL registers its internal ones: plain ibv_reg_mr, no relaxed ordering.
  r.t->worker().drain();
  int withRo = 0, internal = 0;
  for (const ::fake::MrInfo& m : ::fake::liveMrInfos()) {
    if (m.access & kRo) {
      ++withRo;
    } else {
      ++internal;
      EXPECT_EQ(m.call, "ibv_reg_mr");
    }
  }
  EXPECT_EQ(withRo, 4) << "two buffers on two HCAs";
  EXPECT_GE(internal, 1) << "no flush landing buffer was registered";
}

// `host` and `gpu` (as a dmabuf) registered on both HCAs of `r`, each without the flag (host
// memory through plain ibv_reg_mr). The buffers outlive their registrations (the caller's).
void expectPlainRegistrations(Rig& r, std::vector<uint8_t>& host, std::vector<uint8_t>& gpu) {
  verbs::MrSet* h = r.reg(host);
  verbs::MrSet* d = r.regDmaBuf(gpu);
  ASSERT_TRUE(h && d);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(on(h, i).call, "ibv_reg_mr");
    EXPECT_EQ(on(h, i).access, verbs::kMrAccess);
    EXPECT_EQ(on(d, i).access, verbs::kMrAccess) << "a dmabuf got the flag";
  }
}

TEST(RelaxedOrdering, ZeroNeverSetsIt) {
  ::fake::reset();
  Rig r(0);
  std::string why;
  EXPECT_FALSE(r.t->relaxedOrdering(&why));
  EXPECT_EQ(why, "NCCL_IB_PCI_RELAXED_ORDERING=0: off");
  EXPECT_NE(r.t->describe().find("relaxed ordering off [NCCL_IB_PCI_RELAXED_ORDERING=0: off]"), std::string::npos)
      << r.t->describe();
  std::vector<uint8_t> host(4096), gpu(4096);
  expectPlainRegistrations(r, host, gpu);
  for (const ::fake::MrInfo& m : ::fake::liveMrInfos()) EXPECT_EQ(m.access & kRo, 0) << m.call << " on " << m.dev;
}

// NCCL (init.cc, ncclIbRelaxedOrderingCapable): 1 and 2 both need ibv_reg_mr_iova2, and without
// it relaxed ordering is off, with no error, for host buffers and dmabufs alike.
TEST(RelaxedOrdering, WithoutIova2NeitherTwoNorOneSetsItAndNothingFails) {
  for (uint32_t v : {2u, 1u}) {
    SCOPED_TRACE("NCCL_IB_PCI_RELAXED_ORDERING=" + std::to_string(v));
    ::fake::reset();
    ::fake::setRegMrIova2(false);
    {
      Rig r(v);
      std::string why;
      EXPECT_FALSE(r.t->relaxedOrdering(&why));
      EXPECT_NE(why.find("this libibverbs has no ibv_reg_mr_iova2 (rdma-core 28 or later): off, as in NCCL"),
                std::string::npos)
          << why;
      EXPECT_NE(r.t->describe().find("relaxed ordering off ["), std::string::npos) << r.t->describe();
      std::vector<uint8_t> host(4096), gpu(4096);
  expectPlainRegistrations(r, host, gpu);
    }
    ::fake::reset();  // puts ibv_reg_mr_iova2 back
  }
}

TEST(RelaxedOrdering, AnEinvalRefusalRegistersWithoutTheFlagRemembersTheHcaAndSaysSoOnce) {
  ::fake::reset();
  testlog::Scope logs(nullptr);
  ::fake::refuseRelaxedOrdering("fake1", true);
  Rig r(1);
  std::vector<uint8_t> a(4096), b(4096), gpu(4096);
  verbs::MrSet* ma = r.reg(a);
  ASSERT_TRUE(ma) << "a late-refusing kernel failed the registration";
  EXPECT_EQ(on(ma, 0).access, verbs::kMrAccess | kRo) << "fake0 takes the flag";
  EXPECT_EQ(on(ma, 1).access, verbs::kMrAccess) << "fake1 refused it: registered without";
  EXPECT_EQ(on(ma, 1).call, "ibv_reg_mr");
  EXPECT_TRUE(ma->relaxedOrdering(0));
  EXPECT_FALSE(ma->relaxedOrdering(1));
  EXPECT_EQ(::fake::relaxedOrderingRefusals(), 1);
  // Later registrations on fake1 do not ask again; fake0 keeps the flag.
  verbs::MrSet* mb = r.reg(b);
  verbs::MrSet* mg = r.regDmaBuf(gpu);
  ASSERT_TRUE(mb && mg);
  EXPECT_EQ(::fake::relaxedOrderingRefusals(), 1) << "fake1 was asked again";
  EXPECT_EQ(on(mb, 0).access, verbs::kMrAccess | kRo);
  EXPECT_EQ(on(mb, 1).access, verbs::kMrAccess);
  EXPECT_EQ(on(mg, 0).access, verbs::kMrAccess | kRo);
  EXPECT_EQ(on(mg, 1).access, verbs::kMrAccess);
  EXPECT_TRUE(r.t->relaxedOrdering()) << "the choice stays on: only fake1 goes without";
  std::vector<std::string> w = testlog::linesWith("refused IBV_ACCESS_RELAXED_ORDERING");
  ASSERT_EQ(w.size(), 1u) << testlog::all();
  EXPECT_EQ(w[0].rfind("WARN railover: HCA fake1 refused IBV_ACCESS_RELAXED_ORDERING (EINVAL", 0), 0u) << w[0];
  EXPECT_NE(w[0].find("NCCL_IB_PCI_RELAXED_ORDERING=1"), std::string::npos) << w[0];
  EXPECT_NE(r.t->describe().find("(refused with EINVAL by fake1: registered there without it)"), std::string::npos)
      << r.t->describe();
}

// After DEVICE_FATAL the port watch re-opens the HCA and registers every buffer again
// (RdmaTransport::reviveHca, MrSet::refresh): the same choice as before, per HCA (fake0 with
// the flag, fake1, which refused it, without and not asked again), and no second WARN.
TEST(RelaxedOrdering, AReopenedHcaRegistersAgainWithTheSameChoice) {
  ::fake::reset();
  testlog::Scope logs(nullptr);
  ::fake::refuseRelaxedOrdering("fake1", true);
  Rig r(2);
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, int> ups;
  r.t->startPortWatch([&](int nic, bool up, const std::string&) {
    std::lock_guard<std::mutex> g(mu);
    if (up) ++ups[nic];
    cv.notify_all();
  });
  std::vector<uint8_t> a(4096), gpu(4096);
  verbs::MrSet* ma = r.reg(a);
  verbs::MrSet* mg = r.regDmaBuf(gpu);
  ASSERT_TRUE(ma && mg);
  ASSERT_EQ(::fake::relaxedOrderingRefusals(), 1);
  ::fake::deviceFatal("fake0");
  ::fake::deviceFatal("fake1");
  {
    std::unique_lock<std::mutex> g(mu);
    ASSERT_TRUE(cv.wait_for(g, std::chrono::seconds(30), [&] { return ups[0] >= 1 && ups[1] >= 1; }))
        << "the HCAs were not re-opened";
  }
  for (verbs::MrSet* m : {ma, mg}) {
    ASSERT_EQ(m->epochOf(0), 2u);
    ASSERT_EQ(m->epochOf(1), 2u);
    EXPECT_EQ(on(m, 0).access, verbs::kMrAccess | kRo) << on(m, 0).call << " on the re-opened fake0";
    EXPECT_EQ(on(m, 1).access, verbs::kMrAccess) << on(m, 1).call << " on the re-opened fake1";
  }
  EXPECT_EQ(on(ma, 0).call, "ibv_reg_mr_iova2");
  EXPECT_EQ(::fake::relaxedOrderingRefusals(), 1) << "the re-opened fake1 was asked again";
  EXPECT_EQ(testlog::count("refused IBV_ACCESS_RELAXED_ORDERING"), 1u) << testlog::all();
}

std::string reportFor(const std::map<std::string, std::string>& vars) {
  EnvLookup env = [vars](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  return rdmaReportJson({"lo"}, env);
}

// The RDMA report (railover doctor) shows the transport's choice and why.
TEST(RelaxedOrdering, TheRdmaReportShowsTheChoice) {
  ::fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  ::fake::setGids("fake1", 2, {rdmatest::gidOn("::ffff:127.0.0.1", IBV_GID_TYPE_ROCE_V2, lo)});
  std::string r = reportFor({});
  EXPECT_NE(r.find("\"relaxed_ordering\":true,\"relaxed_ordering_why\":\"NCCL_IB_PCI_RELAXED_ORDERING=2 (on where "
                   "capable) and libibverbs has ibv_reg_mr_iova2"),
            std::string::npos)
      << r;
  r = reportFor({{"NCCL_IB_PCI_RELAXED_ORDERING", "0"}});
  EXPECT_NE(r.find("\"relaxed_ordering\":false,\"relaxed_ordering_why\":\"NCCL_IB_PCI_RELAXED_ORDERING=0: off\""),
            std::string::npos)
      << r;
  r = reportFor({{"RAILOVER_TRANSPORT", "tcp"}});
  EXPECT_NE(r.find("\"relaxed_ordering\":false,\"relaxed_ordering_why\":\"not used: the job would use the tcp transport"),
            std::string::npos)
      << r;
  ::fake::setRegMrIova2(false);
  r = reportFor({{"NCCL_IB_PCI_RELAXED_ORDERING", "1"}});
  EXPECT_NE(r.find("\"relaxed_ordering\":false,\"relaxed_ordering_why\":\"NCCL_IB_PCI_RELAXED_ORDERING=1 asks for it, "
                   "but this libibverbs has no ibv_reg_mr_iova2"),
            std::string::npos)
      << r;
  ::fake::reset();
}

}  // namespace
}  // namespace railover
