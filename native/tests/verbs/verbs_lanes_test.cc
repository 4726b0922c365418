// Unit tests of a verbs path with several QPs ("lanes", NCCL_IB_QPS_PER_CONNECTION > 1) against
// the fake verbs provider, which delivers each QP's traffic only when the test says so: how a
// chunk is split over the lanes, that a message is reported only once every lane's share is
// placed (RC orders one QP, not two), refused and grouped messages, faults on one lane breaking
// the whole path, the fence covering every lane, and the PART rules a peer must keep.
#include <arpa/inet.h>
#include <cerrno>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_verbs.h"
#include "verbs_test_sinks.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_path.h"

using namespace railover::verbs;

namespace {

using verbstest::params;
using verbstest::rawSend;
using verbstest::RSink;
using verbstest::SSink;

PortSel portOf(const char* dev) { return verbstest::portOf(dev); }

constexpr int kLanes = 3;

// A sender on fake0 and a receiver on fake1, each with kLanes QPs, connected lane to lane.
class VerbsLanesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    std::string err;
    ha = std::make_unique<Hca>("fake0", &err);
    hb = std::make_unique<Hca>("fake1", &err);
    ASSERT_TRUE(ha->ok() && hb->ok()) << err;
    s = std::make_unique<SendPath>(*ha, portOf("fake0"), params(), &err, kLanes);
    r = std::make_unique<RecvPath>(*hb, portOf("fake1"), params(), &err, kLanes);
    ASSERT_TRUE(s->ok() && r->ok()) << err;
    ASSERT_EQ(s->lanes(), kLanes);
    ASSERT_TRUE(s->connect(r->localEndpoints(), &err)) << err;
    ASSERT_TRUE(r->connect(s->localEndpoints(), &err)) << err;
    rx.assign(4096, 0xA5);
    tx.resize(4096);
    for (size_t i = 0; i < tx.size(); ++i) tx[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<Hca*> rh{hb.get()}, sh{ha.get()};
    rmr = std::make_unique<MrSet>(rh, rx.data(), rx.size(), &err);
    smr = std::make_unique<MrSet>(sh, tx.data(), tx.size(), &err);
    ASSERT_TRUE(rmr->ok() && smr->ok()) << err;
  }
  // A fresh pair (the old objects go in dependency order: paths and MRs before their HCAs).
  void restart() {
    s.reset(), r.reset(), rmr.reset(), smr.reset(), ha.reset(), hb.reset();
    ss = SSink{}, rs = RSink{};
    SetUp();
  }
  ibv_qp* sq(int lane) { return s->qp(lane).qp(); }
  ibv_qp* rq(int lane) { return r->qp(lane).qp(); }
  // The receiver's advertisements (lane 0) reach the sender.
  void adverts() {
    fake::deliver(rq(0), sq(0));
    s->progress(ss);
  }
  void advertise(uint64_t seq, uint64_t off, uint64_t size) {
    std::string err;
    ASSERT_EQ(r->advertise(seq, 0, rx.data() + off, size, rmr->rkey(0), &err), 1) << err;
  }
  // Posts message `seq` of `total` bytes from tx[0..] in chunks of `chunk` bytes.
  void send(uint64_t seq, uint64_t total, uint64_t chunk) {
    std::string err;
    uint64_t off = 0;
    do {
      ChunkRef c;
      c.seq = seq, c.offset = off, c.len = std::min(chunk, total - off), c.total = total;
      ASSERT_EQ(s->post(c, tx.data() + off, smr->lkey(0), &err), 1) << err;
      off += c.len;
    } while (off < total);
  }

  std::unique_ptr<Hca> ha, hb;
  std::unique_ptr<SendPath> s;
  std::unique_ptr<RecvPath> r;
  std::vector<uint8_t> rx, tx;
  std::unique_ptr<MrSet> rmr, smr;
  SSink ss;
  RSink rs;
};

TEST_F(VerbsLanesTest, AChunkIsSplitOverTheLanesInAlignedShares) {
  advertise(0, 0, 2048);
  adverts();
  send(0, 1000, 1000);  // one chunk: shares of ceil(1000 / 3) = 334 -> 384 bytes (128-aligned)
  const auto& l0 = fake::outstanding(sq(0));
  const auto& l1 = fake::outstanding(sq(1));
  const auto& l2 = fake::outstanding(sq(2));
  ASSERT_EQ(l0.size(), 1u);
  EXPECT_EQ(l0[0].opcode, IBV_WR_RDMA_WRITE_WITH_IMM) << "lane 0 ends the message as a one-QP path does";
  EXPECT_EQ(ntohl(l0[0].immBe), 1000u);
  EXPECT_EQ(l0[0].data.size(), 384u);
  EXPECT_EQ(l0[0].remoteAddr, reinterpret_cast<uintptr_t>(rx.data()));
  ASSERT_EQ(l1.size(), 2u);
  EXPECT_EQ(l1[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(l1[0].data.size(), 384u);
  EXPECT_EQ(l1[0].remoteAddr, reinterpret_cast<uintptr_t>(rx.data()) + 384);
  EXPECT_EQ(l1[1].opcode, IBV_WR_SEND) << "the PART after the lane's writes";
  ASSERT_EQ(l2.size(), 2u);
  EXPECT_EQ(l2[0].data.size(), 1000u - 768u);
  EXPECT_EQ(l2[0].remoteAddr, reinterpret_cast<uintptr_t>(rx.data()) + 768);
  EXPECT_EQ(l2[1].opcode, IBV_WR_SEND);
  EXPECT_EQ(s->outstanding(), 5);
}

TEST_F(VerbsLanesTest, AMessageIsReportedOnlyOnceEveryLanesShareIsPlaced) {
  advertise(0, 0, 2048);
  adverts();
  send(0, 1500, 600);  // three chunks, each split over the three lanes
  fake::deliver(sq(0), rq(0));
  fake::deliver(sq(2), rq(2));
  r->progress(rs);
  EXPECT_TRUE(rs.all.empty()) << "lane 1's share is not placed yet";
  EXPECT_EQ(r->held(), 1u);
  fake::deliver(sq(1), rq(1));
  r->progress(rs);
  ASSERT_EQ(rs.all.size(), 1u);
  EXPECT_EQ(rs.all[0].seq, 0u);
  EXPECT_EQ(rs.all[0].bytes, 1500u);
  EXPECT_EQ(r->held(), 0u);
  for (size_t i = 0; i < 1500; ++i) ASSERT_EQ(rx[i], tx[i]) << "byte " << i;
  EXPECT_EQ(rx[1500], 0xA5) << "written past the message";
  s->progress(ss);
  uint64_t bytes = 0;
  for (const ChunkRef& c : ss.done) bytes += c.len;
  EXPECT_EQ(bytes, 1500u) << "each lane's share completes as its own write";
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
}

TEST_F(VerbsLanesTest, SmallAndEmptyMessagesStillEndOnEveryLane) {
  advertise(0, 0, 128);
  advertise(1, 128, 128);
  adverts();
  send(0, 100, 100);  // fits lane 0's share: lanes 1 and 2 write nothing, only their PART
  send(1, 0, 1);      // an empty message
  EXPECT_EQ(fake::outstanding(sq(0)).size(), 2u);
  for (int l : {1, 2}) {
    ASSERT_EQ(fake::outstanding(sq(l)).size(), 2u) << "lane " << l;
    for (const auto& w : fake::outstanding(sq(l))) EXPECT_EQ(w.opcode, IBV_WR_SEND) << "lane " << l;
  }
  fake::deliver(sq(0), rq(0));
  fake::deliver(sq(1), rq(1));
  fake::deliver(sq(2), rq(2), 1);  // lane 2's PART of message 0 only
  r->progress(rs);
  ASSERT_EQ(rs.all.size(), 1u);
  EXPECT_EQ(rs.all[0].bytes, 100u);
  fake::deliver(sq(2), rq(2));
  r->progress(rs);
  ASSERT_EQ(rs.all.size(), 2u);
  EXPECT_EQ(rs.all[1].seq, 1u);
  EXPECT_EQ(rs.all[1].bytes, 0u);
}

TEST_F(VerbsLanesTest, GroupedAndRefusedMessagesWaitForTheirPartsToo) {
  std::string err;
  Advert e[2];
  for (int i = 0; i < 2; ++i)
    e[i].addr = reinterpret_cast<uintptr_t>(rx.data()) + 1024 * i, e[i].size = 1024, e[i].rkey = rmr->rkey(0),
    e[i].tag = 30 + (uint64_t)i;
  ASSERT_EQ(r->advertiseGroup(0, e, 2, &err), 1) << err;
  adverts();
  ChunkRef c;
  c.seq = 0, c.len = c.total = 900, c.tag = 31;
  ASSERT_EQ(s->post(c, tx.data(), smr->lkey(0), &err), 1) << err;
  c.seq = 1, c.tag = 31;  // tag 31 is taken: refused, nothing written
  ASSERT_EQ(s->post(c, tx.data(), smr->lkey(0), &err), 1) << err;
  const auto& l0 = fake::outstanding(sq(0));
  ASSERT_EQ(l0.size(), 3u);
  EXPECT_EQ(l0[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(l0[1].opcode, IBV_WR_SEND) << "DONE";
  EXPECT_EQ(l0[2].opcode, IBV_WR_SEND) << "the refusing DONE";
  EXPECT_EQ(fake::outstanding(sq(1)).size(), 3u) << "write, PART 0, PART 1";
  fake::deliver(sq(0), rq(0));
  fake::deliver(sq(1), rq(1));
  r->progress(rs);
  EXPECT_TRUE(rs.all.empty());
  EXPECT_EQ(r->held(), 2u);
  fake::deliver(sq(2), rq(2));
  r->progress(rs);
  ASSERT_EQ(rs.all.size(), 2u);
  EXPECT_EQ(rs.all[0].addr, e[1].addr);
  EXPECT_EQ(rs.all[0].bytes, 900u);
  for (size_t i = 0; i < 900; ++i) ASSERT_EQ(rx[1024 + i], tx[i]) << "byte " << i;
  EXPECT_TRUE(rs.all[1].refused);
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
}

TEST_F(VerbsLanesTest, AFaultOnAnyLaneBreaksThePath) {
  advertise(0, 0, 2048);
  adverts();
  send(0, 1000, 1000);
  fake::fail(sq(2), IBV_WC_RETRY_EXC_ERR);
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].code, IBV_WC_RETRY_EXC_ERR);
  fake::asyncEvent(hb->ctx(), IBV_EVENT_QP_FATAL, 0, rq(1));
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "qp-event");
  EXPECT_NE(rs.breaks[0].status.find("QP 1 of the path"), std::string::npos) << rs.breaks[0].status;
}

TEST_F(VerbsLanesTest, TheFenceCoversEveryLaneAndAHeldMessageStaysUnreported) {
  advertise(0, 0, 2048);
  adverts();
  send(0, 1000, 1000);
  fake::deliver(sq(0), rq(0));
  fake::deliver(sq(1), rq(1));  // lane 2's share never lands
  FenceResult fr = r->fence(1000);
  EXPECT_EQ(fr.err, "");
  EXPECT_TRUE(fr.drained);
  for (int l = 0; l < kLanes; ++l) EXPECT_EQ(fake::state(rq(l)), IBV_QPS_ERR) << "lane " << l;
  r->progress(rs);
  EXPECT_TRUE(rs.all.empty()) << "a message missing a lane's share is never reported";
  EXPECT_TRUE(rs.breaks.empty());
  s->fence(1000);
  for (int l = 0; l < kLanes; ++l) EXPECT_EQ(fake::state(sq(l)), IBV_QPS_ERR) << "lane " << l;
}

// PARTs come from the peer: one out of order, one for a message never advertised, another
// kind on a further lane, or anything on a sender's further lane break the path and say so.
TEST_F(VerbsLanesTest, PartsThatBreakTheRulesAreProtocolErrors) {
  uint8_t m[ctlwire::kBytes];
  advertise(4, 0, 64);
  ctlwire::encodePart(5, m);  // beyond what was advertised (4)
  ASSERT_EQ(rawSend(sq(1), m), 0);
  fake::deliver(sq(1), rq(1));
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "protocol");
  EXPECT_NE(rs.breaks[0].status.find("PART of message 5 on QP 1 of the path beyond the messages advertised"),
            std::string::npos)
      << rs.breaks[0].status;

  restart();
  advertise(0, 0, 64);
  advertise(1, 64, 64);
  ctlwire::encodePart(1, m);
  ASSERT_EQ(rawSend(sq(2), m), 0);
  ctlwire::encodePart(0, m);  // older than the last one
  ASSERT_EQ(rawSend(sq(2), m), 0);
  fake::deliver(sq(2), rq(2));
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_NE(rs.breaks[0].status.find("PART of message 0 on QP 2 of the path after the PART of message 1"),
            std::string::npos)
      << rs.breaks[0].status;

  restart();
  CtlMsg ack;
  ctlwire::encodeCtl(ack, m);
  ASSERT_EQ(rawSend(sq(1), m), 0);
  fake::deliver(sq(1), rq(1));
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_NE(rs.breaks[0].status.find("on QP 1 of the path (only PARTs go there)"), std::string::npos)
      << rs.breaks[0].status;

  restart();
  ctlwire::encodePart(0, m);
  ASSERT_EQ(rawSend(rq(1), m), 0);  // the receiver's further lane towards the sender
  fake::deliver(rq(1), sq(1));
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_NE(ss.breaks[0].status.find("on QP 1 of a sender's path"), std::string::npos) << ss.breaks[0].status;
}

// A PART on QP 0 (where only the message's end, advertisements and control messages go) is a
// protocol error at either end, never read as something else.
TEST_F(VerbsLanesTest, APartOnQpZeroIsAProtocolErrorAtEitherEnd) {
  uint8_t m[ctlwire::kBytes];
  ctlwire::encodePart(0, m);
  ASSERT_EQ(rawSend(rq(0), m), 0);
  fake::deliver(rq(0), sq(0));
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "protocol");
  EXPECT_EQ(ss.breaks[0].status, "a PART message arrived at a sender");
  EXPECT_FALSE(s->advertised(0, nullptr)) << "the PART was taken for an advertisement";
  advertise(0, 0, 64);
  ASSERT_EQ(rawSend(sq(0), m), 0);
  fake::deliver(sq(0), rq(0));
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_NE(rs.breaks[0].status.find("kind 5 at a receiver on QP 0 (PARTs go on QPs 1..N-1 of a path)"),
            std::string::npos)
      << rs.breaks[0].status;
}

// A QP that refuses the move to ERR does not leave the others live: each is tried, and the
// first refusal is the fence's error.
TEST_F(VerbsLanesTest, AFenceMovesEveryQpToErrEvenWhenOneRefuses) {
  fake::failNextModify(EIO, rq(1));
  FenceResult fr = r->fence(100);
  EXPECT_NE(fr.err, "") << "the refusal is reported";
  EXPECT_NE(fake::state(rq(1)), IBV_QPS_ERR) << "the QP whose modify failed";
  EXPECT_EQ(fake::state(rq(0)), IBV_QPS_ERR);
  EXPECT_EQ(fake::state(rq(2)), IBV_QPS_ERR);
}

// The moves to ERR run at once, not one after another: with every move blocked (as rxe's was
// seen to block for ~3 s after a local link loss), all kLanes of them are in flight together,
// so a fence takes one such stall, not kLanes of them.
TEST_F(VerbsLanesTest, TheFenceMovesEveryQpToErrAtOnce) {
  fake::blockErrTransitions(true);
  FenceResult fr;
  std::thread fencer([&] { fr = r->fence(100); });
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (fake::blockedErrTransitions() < kLanes && nowUs() < deadline) std::this_thread::yield();
  int inFlight = fake::blockedErrTransitions();
  fake::blockErrTransitions(false);
  fencer.join();
  EXPECT_EQ(inFlight, kLanes) << "the fence moved the QPs to ERR one after another";
  EXPECT_EQ(fr.err, "");
  for (int i = 0; i < kLanes; ++i) EXPECT_EQ(fake::state(rq(i)), IBV_QPS_ERR) << i;
}

// The receiver advertises in strictly increasing seq on a path, also below messages that
// already arrived (or wait for their PARTs): a lower seq would make a later PART look stale.
TEST_F(VerbsLanesTest, AnAdvertisementBelowAnArrivedMessageIsRefused) {
  advertise(3, 0, 512);
  adverts();
  send(3, 100, 100);
  fake::deliver(sq(0), rq(0));
  r->progress(rs);
  ASSERT_EQ(r->held(), 1u);
  ASSERT_TRUE(r->pending().empty());
  std::string err;
  EXPECT_EQ(r->advertise(2, 0, rx.data() + 1024, 64, rmr->rkey(0), &err), -1);
  EXPECT_EQ(err, "advertisement of seq 2 after seq 3 (advertise in seq order)");
  EXPECT_EQ(r->advertise(4, 0, rx.data() + 1024, 64, rmr->rkey(0), &err), 1) << err;
}

// One QP whose writes stop completing (its flow black-holed) shows in lastProgressUs() even
// while the other QPs keep completing: the sender's progress watch must not be fooled.
TEST_F(VerbsLanesTest, AQpThatStopsCompletingIsNotHiddenByTheOthers) {
  advertise(0, 0, 2048);
  adverts();
  send(0, 1000, 1000);
  const uint64_t stuck = s->lastProgressUs();  // QP 2's last completion: none since it came up
  while (nowUs() <= stuck) {
  }
  fake::deliver(sq(0), rq(0));
  fake::deliver(sq(1), rq(1));
  s->progress(ss);
  EXPECT_EQ(ss.done.size(), 2u) << "QPs 0 and 1 completed their writes";
  EXPECT_EQ(s->lastProgressUs(), stuck) << "QP 2 has sends in flight and no completion since";
  fake::deliver(sq(2), rq(2));
  s->progress(ss);
  EXPECT_GT(s->lastProgressUs(), stuck);
}

TEST_F(VerbsLanesTest, EndpointsMustMatchThePathsQpCount) {
  std::string err;
  SendPath one(*ha, portOf("fake0"), params(), &err);
  ASSERT_TRUE(one.ok()) << err;
  RecvPath three(*hb, portOf("fake1"), params(), &err, 3);
  ASSERT_TRUE(three.ok()) << err;
  EXPECT_FALSE(three.connect(one.localEndpoints(), &err));
  EXPECT_NE(err.find("the peer offers 1 QP endpoints for a path of 3 QPs"), std::string::npos) << err;
  std::vector<QpEndpoint> eps = s->localEndpoints();
  ASSERT_EQ(eps.size(), 3u);
  for (const QpEndpoint& e : eps) EXPECT_EQ(e.lanes, 3);
  eps[1].lanes = 2;
  RecvPath again(*hb, portOf("fake1"), params(), &err, 3);
  EXPECT_FALSE(again.connect(eps, &err));
  EXPECT_NE(err.find("names a path of 2 QPs"), std::string::npos) << err;
  RecvPath none(*hb, portOf("fake1"), params(), &err, 0);
  EXPECT_FALSE(none.ok());
  EXPECT_NE(err.find("a path of 0 QPs (1..128)"), std::string::npos) << err;
}

}  // namespace
