// Unit tests of re-opening an HCA after IBV_EVENT_DEVICE_FATAL (verbs_device.h, Hca::reopen)
// and of registering buffers again on the new opening (verbs_mr.h, MrSet::refresh), against the
// fake verbs provider: a device that is absent while it is repaired, a path on the dead opening
// that must stay dead, keys of the dead opening refused by the new one, a registration made
// while an HCA is dead, and a dmabuf whose caller closed its fd long before the re-open.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "fake_verbs.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_path.h"
#include "verbs_test_sinks.h"

using namespace railover::verbs;

namespace {

using verbstest::params;
using verbstest::portOf;
using verbstest::RSink;
using verbstest::SSink;

// Reports DEVICE_FATAL on fake0 and lets `h` read it.
void killFake0(Hca& h) {
  fake::deviceFatal("fake0");
  h.pollAsync();
  ASSERT_TRUE(h.deviceFatal());
}

TEST(HcaReopen, ADeadHcaOpensAgainOnlyOnceItsDeviceIsBackAndStartsClean) {
  fake::reset();
  std::string err;
  Hca h("fake0", &err);
  ASSERT_TRUE(h.ok()) << err;
  EXPECT_EQ(h.epoch(), 1u);
  ibv_context* first = h.ctx();
  fake::setDevicePresent("fake0", false);  // being repaired
  killFake0(h);
  EXPECT_TRUE(h.pollAsync().empty()) << "a dead opening's event file is not read again";
  EXPECT_FALSE(h.reopen(&err));
  EXPECT_NE(err.find("no RDMA device named 'fake0'"), std::string::npos) << err;
  EXPECT_TRUE(h.deviceFatal()) << "a failed re-open changes nothing";
  EXPECT_EQ(h.epoch(), 1u);

  fake::setDevicePresent("fake0", true);
  ASSERT_TRUE(h.reopen(&err)) << err;
  EXPECT_EQ(h.epoch(), 2u);
  EXPECT_NE(h.ctx(), first);
  EXPECT_FALSE(h.deviceFatal());
  EXPECT_TRUE(h.ok());
  std::string what;
  EXPECT_FALSE(h.qpFatal(101, 2, &what)) << "QPs of the new opening start alive";
  EXPECT_TRUE(h.qpFatal(101, 1, &what)) << "a QP of the dead opening stays dead";
  EXPECT_NE(what.find("re-opened"), std::string::npos) << what;
  // The new opening's events are read again.
  fake::asyncEvent(h.ctx(), IBV_EVENT_PORT_ERR, 1);
  h.pollAsync();
  EXPECT_EQ(h.portErrors(1), 1u);
}

// A sender on fake0 and a receiver on fake1; buffers registered on both HCAs.
class PathReopenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    std::string err;
    ha = std::make_unique<Hca>("fake0", &err);
    hb = std::make_unique<Hca>("fake1", &err);
    ASSERT_TRUE(ha->ok() && hb->ok()) << err;
    rmr = std::make_unique<MrSet>(std::vector<Hca*>{ha.get(), hb.get()}, rx.data(), rx.size(), &err);
    smr = std::make_unique<MrSet>(std::vector<Hca*>{ha.get(), hb.get()}, tx.data(), tx.size(), &err);
    ASSERT_TRUE(rmr->ok() && smr->ok()) << err;
  }
  // A new connected pair on the HCAs' current openings.
  void pair() {
    std::string err;
    s = std::make_unique<SendPath>(*ha, portOf("fake0", 1), params(), &err);
    r = std::make_unique<RecvPath>(*hb, portOf("fake1", 1), params(), &err);
    ASSERT_TRUE(s->ok() && r->ok()) << err;
    ASSERT_TRUE(s->connect(r->local(), &err)) << err;
    ASSERT_TRUE(r->connect(s->local(), &err)) << err;
  }
  void wire() {
    for (int i = 0; i < 3; ++i) {
      fake::deliver(s->qp().qp(), r->qp().qp());
      fake::deliver(r->qp().qp(), s->qp().qp());
      s->progress(ss);
      r->progress(rs);
    }
  }
  // One 700-byte message `seq` from tx into rx with the sender's lkey on HCA 0.
  void send(uint64_t seq) {
    std::string err;
    ASSERT_EQ(r->advertise(seq, seq + 10, rx.data(), rx.size(), rmr->rkey(1), &err), 1) << err;
    wire();
    for (size_t i = 0; i < 700; ++i) tx[i] = static_cast<uint8_t>(seq * 7 + i);
    ChunkRef c;
    c.seq = seq, c.offset = 0, c.len = 700, c.total = 700;
    ASSERT_EQ(s->post(c, tx.data(), smr->lkey(0), &err), 1) << err;
    wire();
  }

  std::vector<uint8_t> rx = std::vector<uint8_t>(1024, 0xA5), tx = std::vector<uint8_t>(1024);
  std::unique_ptr<Hca> ha, hb;  // before the MRs and paths: destroyed after them
  std::unique_ptr<MrSet> rmr, smr;
  std::unique_ptr<SendPath> s;
  std::unique_ptr<RecvPath> r;
  SSink ss;
  RSink rs;
};

TEST_F(PathReopenTest, APathOfTheDeadOpeningStaysBrokenAndTheReopenedHcaCarriesDataWithRefreshedKeys) {
  pair();
  send(0);
  ASSERT_EQ(rs.got.size(), 1u);
  // The device dies and is back before the path looks: its QP belongs to the dead opening.
  fake::deviceFatal("fake0");
  std::string err;
  ha->pollAsync();
  ASSERT_TRUE(ha->reopen(&err)) << err;
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u) << "the old opening's QP must not look alive after the re-open";
  EXPECT_EQ(ss.breaks[0].source, "qp-event");

  // A new path on the new opening, but the send buffer's keys are still the dead opening's:
  // the HCA refuses them (this is what a missing re-registration looks like).
  ss = SSink{}, rs = RSink{};
  pair();
  send(1);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_NE(ss.breaks[0].status.find("local protection error"), std::string::npos) << ss.breaks[0].status;
  EXPECT_TRUE(rs.got.empty());

  uint32_t oldLkey = smr->lkey(0);
  ASSERT_TRUE(smr->refresh(0, &err)) << err;
  EXPECT_NE(smr->lkey(0), oldLkey);
  EXPECT_EQ(smr->epochOf(0), 2u);
  ASSERT_TRUE(rmr->refresh(1, &err)) << err;  // fake1 never died: nothing to do
  EXPECT_EQ(rmr->epochOf(1), 1u);
  ss = SSink{}, rs = RSink{};
  pair();
  send(2);
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  ASSERT_EQ(rs.got.size(), 1u);
  EXPECT_EQ(std::get<2>(rs.got[0]), 700u);
  for (size_t i = 0; i < 700; ++i) ASSERT_EQ(rx[i], static_cast<uint8_t>(2 * 7 + i)) << i;
}

TEST(MrSetReopen, ARegistrationMadeWhileAnHcaIsDeadSkipsItAndRefreshCompletesIt) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  killFake0(a);
  std::vector<uint8_t> buf(4096);
  MrSet mr({&a, &b}, buf.data(), buf.size(), &err);
  ASSERT_TRUE(mr.ok()) << "a dead HCA must not fail NCCL's regMr: " << err;
  EXPECT_EQ(mr.lkey(0), 0u);
  EXPECT_NE(mr.rkey(1), 0u);
  EXPECT_EQ(mr.epochOf(0), 0u);
  ASSERT_TRUE(mr.refresh(0, &err)) << "still dead: nothing to register yet, nothing wrong";
  EXPECT_EQ(mr.lkey(0), 0u);
  ASSERT_TRUE(a.reopen(&err)) << err;
  ASSERT_TRUE(mr.refresh(0, &err)) << err;
  EXPECT_NE(mr.lkey(0), 0u);
  EXPECT_EQ(mr.epochOf(0), 2u);
}

TEST(MrSetReopen, KeysAreGivenOnlyForTheOpeningTheyBelongTo) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err);
  std::vector<uint8_t> buf(4096);
  MrSet mr({&a}, buf.data(), buf.size(), &err);
  ASSERT_TRUE(mr.ok()) << err;
  uint32_t lk = 0, rk = 0;
  ASSERT_TRUE(mr.keysOn(0, 1, &lk, &rk));
  EXPECT_EQ(lk, mr.lkey(0));
  EXPECT_EQ(rk, mr.rkey(0));
  killFake0(a);
  ASSERT_TRUE(a.reopen(&err)) << err;
  EXPECT_FALSE(mr.keysOn(0, 2, &lk, &rk)) << "a QP of the new opening must not get the dead opening's keys";
  ASSERT_TRUE(mr.refresh(0, &err)) << err;
  ASSERT_TRUE(mr.keysOn(0, 2, &lk, &rk));
  EXPECT_EQ(rk, mr.rkey(0));
  EXPECT_FALSE(mr.keysOn(0, 1, &lk, &rk)) << "nor a QP of the dead opening the new keys";
  MrSet empty({&a}, buf.data(), 0, &err);
  EXPECT_TRUE(empty.keysOn(0, 7, &lk, &rk)) << "a 0-byte registration has no keys to be stale";
}

TEST(MrSetReopen, ARefreshOnAnHcaThatIsStillDeadFailsAndKeepsTheOldKeys) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  std::vector<uint8_t> buf(4096);
  MrSet mr({&a, &b}, buf.data(), buf.size(), &err);
  ASSERT_TRUE(mr.ok()) << err;
  uint32_t k = mr.rkey(0);
  killFake0(a);
  EXPECT_FALSE(mr.refresh(0, &err));
  EXPECT_NE(err.find("device fatal"), std::string::npos) << err;
  EXPECT_EQ(mr.rkey(0), k);
}

TEST(MrSetReopen, ADmabufIsRegisteredAgainAfterItsCallerClosedTheFd) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  std::vector<uint8_t> buf(4096);
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // stands for the CUDA driver's dmabuf fd
  ASSERT_GE(fd, 0);
  MrSet mr({&a, &b}, buf.data(), buf.size(), /*offset=*/0, fd, &err);
  close(fd);  // NCCL closes it when regMrDmaBuf returns
  ASSERT_TRUE(mr.ok()) << err;
  EXPECT_EQ(fake::dmabufRegistrations(), 2);
  uint32_t old = mr.rkey(0);
  killFake0(a);
  EXPECT_TRUE(fake::mrOnDeadContext(old));
  ASSERT_TRUE(a.reopen(&err)) << err;
  ASSERT_TRUE(mr.refresh(0, &err)) << "the set keeps its own duplicate of the fd: " << err;
  EXPECT_EQ(fake::dmabufRegistrations(), 3);
  EXPECT_NE(mr.rkey(0), old);
  EXPECT_FALSE(fake::mrOnDeadContext(mr.rkey(0)));
}

// With no descriptor left to duplicate NCCL's dmabuf fd, the set registers with NCCL's own fd
// on every HCA inside the call (not on the first one only).
TEST(MrSetReopen, ADmabufWhoseFdCannotBeDuplicatedIsRegisteredOnEveryHca) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err), b("fake1", &err);
  ASSERT_TRUE(a.ok() && b.ok()) << err;
  std::vector<uint8_t> buf(4096);
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // stands for the CUDA driver's dmabuf fd
  ASSERT_GE(fd, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  std::vector<int> filler;
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 1024);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int f; (f = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(f);  // until EMFILE
  std::unique_ptr<MrSet> mr(new MrSet({&a, &b}, buf.data(), buf.size(), /*offset=*/0, fd, &err));
  for (int f : filler) close(f);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  close(fd);
  ASSERT_TRUE(mr->ok()) << err;
  EXPECT_EQ(fake::dmabufRegistrations(), 2);
  EXPECT_NE(mr->rkey(0), mr->rkey(1));
}

// A QP's number goes back to the HCA when the QP is destroyed; the next QP that gets it is not
// dead because of the old one's fatal event.
TEST(HcaQpEvents, AReusedQpNumberDoesNotInheritTheOldQpsFatalEvent) {
  fake::reset();
  std::string err;
  Hca h("fake0", &err);
  ASSERT_TRUE(h.ok()) << err;
  std::unique_ptr<RcQp> old(new RcQp(h, portOf("fake0", 1), 16, 16, &err));
  ASSERT_TRUE(old->ok()) << err;
  uint32_t qpn = old->qp()->qp_num;
  uint64_t epoch = old->epoch();
  fake::asyncEvent(h.ctx(), IBV_EVENT_QP_FATAL, 0, old->qp());
  h.pollAsync();
  ASSERT_TRUE(h.qpFatal(qpn, epoch, nullptr));
  old.reset();
  fake::setNextQpn(qpn);
  RcQp fresh(h, portOf("fake0", 1), 16, 16, &err);
  ASSERT_TRUE(fresh.ok()) << err;
  ASSERT_EQ(fresh.qp()->qp_num, qpn) << "the fake reuses the number";
  std::string what;
  EXPECT_FALSE(h.qpFatal(qpn, fresh.epoch(), &what)) << what;
}

TEST(MrSetReopen, ADmabufWithABadFdIsRefusedAtOnce) {
  fake::reset();
  std::string err;
  Hca a("fake0", &err);
  std::vector<uint8_t> buf(64);
  MrSet mr({&a}, buf.data(), buf.size(), 0, -1, &err);
  EXPECT_FALSE(mr.ok());
  EXPECT_NE(err.find("dmabuf fd -1"), std::string::npos) << err;
}

}  // namespace
