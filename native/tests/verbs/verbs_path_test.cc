// Unit tests of the verbs path logic against the fake verbs provider (fake_verbs.h): message
// delivery through advertised buffers and WRITE_WITH_IMM, the post rules, error completions,
// async events on the right and on another port/HCA/QP, fence (flushes, bounded wait, a message
// that arrived just before it), and protocol violations.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "fake_verbs.h"
#include "verbs_test_sinks.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_path.h"

using namespace railover::verbs;

namespace {

using verbstest::params;
using verbstest::portOf;
using verbstest::RSink;
using verbstest::SSink;

// A sender on fake0 port 1 and a receiver on fake1 port 1, connected to each other.
class VerbsPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    std::string err;
    ha = std::make_unique<Hca>("fake0", &err);
    hb = std::make_unique<Hca>("fake1", &err);
    ASSERT_TRUE(ha->ok() && hb->ok()) << err;
    s = std::make_unique<SendPath>(*ha, portOf("fake0", 1), params(), &err);
    r = std::make_unique<RecvPath>(*hb, portOf("fake1", 1), params(), &err);
    ASSERT_TRUE(s->ok() && r->ok()) << err;
  }
  void connect() {
    std::string err;
    ASSERT_TRUE(s->connect(r->local(), &err)) << err;
    ASSERT_TRUE(r->connect(s->local(), &err)) << err;
  }
  ibv_qp* sq() { return s->qp().qp(); }
  ibv_qp* rq() { return r->qp().qp(); }
  void wire() {
    fake::deliver(sq(), rq());
    fake::deliver(rq(), sq());
  }
  void progress() {
    s->progress(ss);
    r->progress(rs);
  }

  // Declared first so that they are destroyed last (paths hold references to them).
  std::unique_ptr<Hca> ha, hb;
  std::unique_ptr<SendPath> s;
  std::unique_ptr<RecvPath> r;
  SSink ss;
  RSink rs;
};

TEST_F(VerbsPathTest, MessagesOfEverySizeArriveWholeWithTheirSeqTagAndSize) {
  connect();
  constexpr uint64_t kChunk = 100, kBuf = 300;
  const std::vector<uint64_t> sizes = {0, 1, kChunk, kChunk + 1, kBuf};
  std::vector<uint8_t> rx(kBuf * sizes.size() + 64, 0xA5), tx(kBuf);
  std::string err;
  std::vector<Hca*> rh{hb.get()}, sh{ha.get()};
  MrSet rmr(rh, rx.data(), rx.size(), &err), smr(sh, tx.data(), tx.size(), &err);
  ASSERT_TRUE(rmr.ok() && smr.ok()) << err;
  for (uint64_t seq = 0; seq < sizes.size(); ++seq) {
    uint8_t* buf = rx.data() + seq * kBuf;
    ASSERT_EQ(r->advertise(seq, seq + 10, buf, kBuf, rmr.rkey(0), &err), 1) << err;
    wire();
    progress();
    Advert a;
    ASSERT_TRUE(s->advertised(seq, &a));
    EXPECT_EQ(a.addr, reinterpret_cast<uintptr_t>(buf));
    EXPECT_EQ(a.size, kBuf);
    EXPECT_EQ(a.rkey, rmr.rkey(0));
    uint64_t total = sizes[seq];
    for (uint64_t i = 0; i < total; ++i) tx[i] = static_cast<uint8_t>(seq * 31 + i);
    uint64_t off = 0;
    do {
      ChunkRef c;
      c.seq = seq;
      c.offset = off;
      c.len = std::min(kChunk, total - off);
      c.total = total;
      ASSERT_EQ(s->post(c, tx.data() + off, smr.lkey(0), &err), 1) << err;
      off += c.len;
    } while (off < total);
    const auto& out = fake::outstanding(sq());
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back().opcode, IBV_WR_RDMA_WRITE_WITH_IMM);  // the message's last chunk
    EXPECT_EQ(ntohl(out.back().immBe), total);                   // immediate = total size
    for (size_t i = 0; i + 1 < out.size(); ++i) EXPECT_EQ(out[i].opcode, IBV_WR_RDMA_WRITE);
    EXPECT_FALSE(s->advertised(seq, nullptr));  // consumed by the last chunk
    wire();
    progress();
    ASSERT_EQ(rs.got.size(), seq + 1);
    EXPECT_EQ(rs.got.back(), std::make_tuple(seq, seq + 10, total));
    for (uint64_t i = 0; i < total; ++i) ASSERT_EQ(buf[i], static_cast<uint8_t>(seq * 31 + i)) << seq << " " << i;
    for (uint64_t i = total; i < kBuf; ++i) ASSERT_EQ(buf[i], 0xA5) << "written past the end of " << seq;
    CtlMsg ack;
    ack.seq = seq;
    ack.arg = total;
    ASSERT_EQ(r->sendCtl(ack, &err), 1) << err;
    wire();
    progress();
    ASSERT_EQ(ss.ctls.size(), seq + 1);
    EXPECT_EQ(ss.ctls.back().type, CtlType::kAck);
    EXPECT_EQ(ss.ctls.back().seq, seq);
    EXPECT_EQ(ss.ctls.back().arg, total);
  }
  EXPECT_EQ(ss.done.size(), 1u + 1u + 1u + 2u + 3u);  // chunks: 0 B is one 0-byte write
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  EXPECT_EQ(s->outstanding(), 0);
  EXPECT_EQ(r->pending().size(), 0u);
}

TEST_F(VerbsPathTest, PostRulesRefuseWhatTheReceiverCannotTake) {
  connect();
  std::vector<uint8_t> rx(256), tx(256);
  std::string err;
  ChunkRef c;
  c.seq = 0;
  c.len = 10;
  c.total = 10;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), 0);  // not advertised yet: would block
  ASSERT_EQ(r->advertise(0, 0, rx.data(), 64, 7, &err), 1);
  ASSERT_EQ(r->advertise(1, 0, rx.data() + 64, 64, 7, &err), 1);
  EXPECT_EQ(r->advertise(1, 0, rx.data(), 64, 7, &err), -1);  // not in seq order
  EXPECT_NE(err.find("seq order"), std::string::npos) << err;
  wire();
  progress();
  c.len = 1;
  c.total = 5ull << 30;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), -1);
  EXPECT_NE(err.find("4 GiB"), std::string::npos) << err;
  c.offset = 8;
  c.len = 4;
  c.total = 10;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), -1);
  EXPECT_NE(err.find("beyond"), std::string::npos) << err;
  c.seq = 1;  // completing seq 1 while seq 0 is open
  c.offset = 0;
  c.len = c.total = 8;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), -1);
  EXPECT_NE(err.find("seq order"), std::string::npos) << err;
  EXPECT_TRUE(ss.breaks.empty());  // refusals are caller errors, not a broken path
  // A message larger than its buffer is not written: a refusing DONE tells the receiver, whose
  // engine reports the caller's error (as with TCP); the path stays up.
  c.seq = 0;
  c.len = c.total = 65;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), 1) << err;
  const auto& out = fake::outstanding(sq());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode, IBV_WR_SEND) << "no write into a buffer too small for the message";
  wire();
  progress();
  ASSERT_EQ(rs.all.size(), 1u);
  EXPECT_TRUE(rs.all[0].refused);
  EXPECT_EQ(rs.all[0].seq, 0u);
  EXPECT_EQ(rs.all[0].bytes, 65u);
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  EXPECT_EQ(r->pending().size(), 1u) << "seq 1 is still advertised";
}

TEST_F(VerbsPathTest, AnErrorCompletionBreaksThePathOnceWithItsStatus) {
  connect();
  std::vector<uint8_t> rx(64), tx(64);
  std::string err;
  ASSERT_EQ(r->advertise(0, 0, rx.data(), 64, 7, &err), 1);
  ASSERT_EQ(r->advertise(1, 0, rx.data(), 64, 7, &err), 1);
  wire();
  progress();
  for (uint64_t seq = 0; seq < 2; ++seq) {
    ChunkRef c;
    c.seq = seq;
    c.len = c.total = 32;
    ASSERT_EQ(s->post(c, tx.data(), 1, &err), 1) << err;
  }
  EXPECT_EQ(s->outstanding(), 2);
  fake::fail(sq(), IBV_WC_RETRY_EXC_ERR);  // the rest is flushed, as the HCA does
  progress();
  progress();
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "completion");
  EXPECT_EQ(ss.breaks[0].code, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(ss.breaks[0].status, "transport retry counter exceeded");  // the first error, not the flush
  EXPECT_EQ(ss.breaks[0].dev, "fake0");
  EXPECT_EQ(ss.breaks[0].port, 1);
  EXPECT_TRUE(ss.done.empty());
  EXPECT_TRUE(s->broken());
  ChunkRef c;
  c.seq = 5;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), -1);
  EXPECT_NE(err.find("path broken: transport retry counter exceeded"), std::string::npos) << err;
  EXPECT_EQ(s->sendCtl(CtlMsg{}, &err), -1);
  FenceResult f = s->fence(1000);
  EXPECT_TRUE(f.drained) << f.err;
  EXPECT_EQ(f.err, "");
  EXPECT_TRUE(rs.breaks.empty());  // the receiver saw nothing
}

TEST_F(VerbsPathTest, PortErrorsCountOnlyOnThePathsOwnHcaPortAndOnlyAfterItCameUp) {
  fake::asyncEvent(ha->ctx(), IBV_EVENT_PORT_ERR, 1);  // before the path exists: history, not a fault
  connect();
  progress();
  EXPECT_TRUE(ss.breaks.empty());
  fake::asyncEvent(ha->ctx(), IBV_EVENT_PORT_ERR, 2);  // another port of the sender's HCA
  fake::asyncEvent(hb->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
  fake::asyncEvent(ha->ctx(), IBV_EVENT_GID_CHANGE, 1);  // counted, not a fault by itself
  progress();
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  EXPECT_EQ(ha->gidChanges(1), 1u);
  EXPECT_EQ(ha->portErrors(2), 1u);
  fake::asyncEvent(hb->ctx(), IBV_EVENT_PORT_ERR, 1);  // the receiver's port
  progress();
  EXPECT_TRUE(ss.breaks.empty());
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "port");
  EXPECT_EQ(rs.breaks[0].code, IBV_EVENT_PORT_ERR);
  EXPECT_NE(rs.breaks[0].status.find("port error (fake1 port 1)"), std::string::npos) << rs.breaks[0].status;
  fake::asyncEvent(ha->ctx(), IBV_EVENT_PORT_ERR, 1);  // now the sender's own port
  progress();
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "port");
  EXPECT_EQ(rs.breaks.size(), 1u);  // told once
}

// With a watcher reading the HCA's events (the RDMA transport's port watch), a path's progress
// reads the event file at most once per Hca::kDataPathReadUs instead of on every call, and still
// sees a port error the watcher has read (through the counters) or, with no watcher reading,
// by its own read within that interval.
TEST_F(VerbsPathTest, AWatchedHcaIsReadByTheDataPathAtMostOncePerIntervalAndFaultsStillArrive) {
  connect();
  progress();
  uint64_t r0 = ha->asyncReads();
  for (int i = 0; i < 100; ++i) s->progress(ss);
  EXPECT_EQ(ha->asyncReads() - r0, 100u);  // unwatched: every progress reads the event file

  ha->setWatched(true);
  ha->pollAsync();  // the watcher's read
  uint64_t t0 = nowUs(), r1 = ha->asyncReads();
  for (int i = 0; i < 1000; ++i) s->progress(ss);
  uint64_t elapsedUs = nowUs() - t0, reads = ha->asyncReads() - r1;
  EXPECT_LE(reads, elapsedUs / Hca::kDataPathReadUs + 1) << "in " << elapsedUs << " us";

  // The watcher reads a port error: the path sees it at its next progress, whatever the interval.
  fake::asyncEvent(ha->ctx(), IBV_EVENT_PORT_ERR, 2);  // another port first: no fault
  ha->pollAsync();
  s->progress(ss);
  EXPECT_TRUE(ss.breaks.empty());
  fake::asyncEvent(ha->ctx(), IBV_EVENT_PORT_ERR, 1);
  ha->pollAsync();
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "port");

  // A watcher that does not come round (a late thread): the data path's own read finds the event.
  hb->setWatched(true);
  hb->pollAsync();
  fake::asyncEvent(hb->ctx(), IBV_EVENT_PORT_ERR, 1);
  uint64_t deadline = nowUs() + 5 * 1000 * 1000;  // generous: a busy host
  while (rs.breaks.empty() && nowUs() < deadline) r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "port");
}

TEST_F(VerbsPathTest, AFatalQpEventBreaksOnlyTheQpItNames) {
  connect();
  std::string err;
  RecvPath other(*hb, portOf("fake1", 1), params(), &err);
  ASSERT_TRUE(other.ok()) << err;
  fake::asyncEvent(hb->ctx(), IBV_EVENT_QP_FATAL, 0, other.qp().qp());
  progress();
  EXPECT_TRUE(rs.breaks.empty() && ss.breaks.empty());
  fake::asyncEvent(hb->ctx(), IBV_EVENT_QP_FATAL, 0, rq());
  progress();
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "qp-event");
  EXPECT_EQ(rs.breaks[0].status, "local work queue catastrophic error");
  EXPECT_TRUE(ss.breaks.empty());
}

TEST_F(VerbsPathTest, FenceFlushesEverythingKeepsAnArrivedMessageAndReportsNoFault) {
  connect();
  std::vector<uint8_t> rx(128, 0), tx(128, 9);
  std::string err;
  ASSERT_EQ(r->advertise(0, 3, rx.data(), 64, 7, &err), 1);
  ASSERT_EQ(r->advertise(1, 4, rx.data() + 64, 64, 7, &err), 1);
  wire();
  progress();
  for (uint64_t seq = 0; seq < 2; ++seq) {
    ChunkRef c;
    c.seq = seq;
    c.len = c.total = 16;
    ASSERT_EQ(s->post(c, tx.data(), 1, &err), 1) << err;
  }
  fake::deliver(sq(), rq(), 1);  // message 0 lands; its completion waits in the receiver's CQ
  FenceResult fr = r->fence(1000);
  EXPECT_EQ(fr.err, "");
  EXPECT_TRUE(fr.drained);
  EXPECT_EQ(fr.flushedRecvs, PathBase::kRecvDepth - 1);  // every posted receive but the consumed one
  EXPECT_EQ(fake::state(rq()), IBV_QPS_ERR);
  EXPECT_EQ(fake::postedRecvs(rq()), 0u);
  r->progress(rs);  // the message that arrived before the fence is not lost
  ASSERT_EQ(rs.got.size(), 1u);
  EXPECT_EQ(rs.got[0], std::make_tuple(uint64_t{0}, uint64_t{3}, uint64_t{16}));
  EXPECT_TRUE(rs.breaks.empty());  // flushes of a fence are not a fault
  ASSERT_EQ(r->pending().size(), 1u);  // what a resume re-advertises elsewhere
  EXPECT_EQ(r->pending().front().seq, 1u);
  EXPECT_EQ(r->advertise(2, 0, rx.data(), 64, 7, &err), -1);
  EXPECT_EQ(err, "path fenced");
  FenceResult fs = s->fence(1000);
  EXPECT_TRUE(fs.drained);
  EXPECT_EQ(fs.flushedSends, 1);  // message 1's write never went out
  s->progress(ss);
  EXPECT_TRUE(ss.breaks.empty());
  EXPECT_EQ(ss.done.size(), 1u);  // message 0's write completed before the fence
  EXPECT_EQ(s->outstanding(), 0);
  ChunkRef c;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), -1);
  EXPECT_EQ(err, "path fenced");
}

TEST_F(VerbsPathTest, FenceWaitIsBoundedWhenFlushesNeverComeAndAFailedModifyIsReported) {
  connect();
  fake::holdFlushes(true);
  uint64_t t0 = nowUs();
  FenceResult f = r->fence(50);
  uint64_t took = nowUs() - t0;
  EXPECT_FALSE(f.drained);
  EXPECT_EQ(f.err, "");
  EXPECT_GE(took, 50000u);
  EXPECT_LT(took, 30000000u);  // bounded (generous for a loaded machine)
  fake::holdFlushes(false);
  fake::failNextModify(EIO);
  FenceResult g = s->fence(50);
  EXPECT_FALSE(g.drained);
  EXPECT_NE(g.err.find("modify QP to ERR"), std::string::npos) << g.err;
}

// Posts `w` (48 bytes) as a raw SEND on `qp`, as a misbehaving peer would.
void rawSend(ibv_qp* qp, const uint8_t* w) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(w), static_cast<uint32_t>(ctlwire::kBytes), 1};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
}

// A group advertisement that is malformed (count 9) breaks the sender's path with the decoder's
// words; so does an entry out of order (index 1 of a group never started).
TEST_F(VerbsPathTest, AMalformedGroupAdvertisementBreaksTheSenderNamingTheField) {
  connect();
  Advert a;
  a.seq = 0, a.tag = 1, a.addr = 4096, a.size = 64, a.rkey = 7, a.count = 2, a.index = 1;
  uint8_t w[ctlwire::kBytes];
  ctlwire::encodeAdvert(a, w);
  rawSend(rq(), w);
  fake::deliver(rq(), sq());
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "protocol");
  EXPECT_NE(ss.breaks[0].status.find("entry 1 of the grouped receive at seq 0 (2 entries) out of order"), std::string::npos)
      << ss.breaks[0].status;
  // a fresh pair for the second case
  std::string err;
  auto s2 = std::make_unique<SendPath>(*ha, portOf("fake0", 1), params(), &err);
  auto r2 = std::make_unique<RecvPath>(*hb, portOf("fake1", 1), params(), &err);
  ASSERT_TRUE(s2->connect(r2->local(), &err) && r2->connect(s2->local(), &err)) << err;
  a.index = 0;
  ctlwire::encodeAdvert(a, w);
  w[2] = 9;  // a group of 9 entries
  rawSend(r2->qp().qp(), w);
  fake::deliver(r2->qp().qp(), s2->qp().qp());
  SSink ss2;
  s2->progress(ss2);
  ASSERT_EQ(ss2.breaks.size(), 1u);
  EXPECT_NE(ss2.breaks[0].status.find("group of 9 entries (1..8)"), std::string::npos) << ss2.breaks[0].status;
}

// The receiver checks each DONE against its advertisement: a DONE for an entry already filled,
// or for a message other than the next one, breaks the path with the cause.
TEST_F(VerbsPathTest, ADoneThatContradictsTheAdvertisementBreaksTheReceiver) {
  connect();
  std::vector<uint8_t> rx(256);
  std::string err;
  Advert e[2];
  for (int i = 0; i < 2; ++i) e[i].addr = reinterpret_cast<uintptr_t>(rx.data()) + 128 * i, e[i].size = 128, e[i].rkey = 7, e[i].tag = 5;
  ASSERT_EQ(r->advertiseGroup(10, e, 2, &err), 1) << err;
  EXPECT_EQ(r->advertiseGroup(11, e, 2, &err), -1) << "overlaps seq 10..11";
  EXPECT_NE(err.find("seq order"), std::string::npos) << err;
  EXPECT_EQ(r->advertiseGroup(12, e, 9, &err), -1);
  EXPECT_NE(err.find("9 buffers"), std::string::npos) << err;
  Done d;
  d.seq = 10, d.tag = 5, d.bytes = 8, d.index = 1, d.written = true;
  uint8_t w[ctlwire::kBytes];
  ctlwire::encodeDone(d, w);
  rawSend(sq(), w);
  d.seq = 11;  // the same entry again
  uint8_t w2[ctlwire::kBytes];
  ctlwire::encodeDone(d, w2);
  rawSend(sq(), w2);
  fake::deliver(sq(), rq());
  r->progress(rs);
  ASSERT_EQ(rs.all.size(), 1u);
  EXPECT_EQ(rs.all[0].addr, e[1].addr);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_NE(rs.breaks[0].status.find("entry 1 of the grouped receive at seq 10 filled twice"), std::string::npos)
      << rs.breaks[0].status;
}

// Grouped messages at the verbs level: the sender picks the entry by tag, writes it and ends
// with a DONE; a refused one (no free entry with its tag) is not written.
TEST_F(VerbsPathTest, AGroupedMessageGoesToTheEntryWithItsTagAndEndsWithADone) {
  connect();
  std::vector<uint8_t> rx(512, 0xA5), tx(512, 0x3c);
  std::string err;
  Advert e[3];
  for (int i = 0; i < 3; ++i)
    e[i].addr = reinterpret_cast<uintptr_t>(rx.data()) + 128 * i, e[i].size = 128, e[i].rkey = 7, e[i].tag = 20 + (uint64_t)i;
  ASSERT_EQ(r->advertiseGroup(0, e, 3, &err), 1) << err;
  fake::deliver(rq(), sq(), 2);  // two of the three entries: the group is not usable yet
  s->progress(ss);
  ChunkRef c;
  c.seq = 0, c.len = c.total = 100, c.tag = 22;
  EXPECT_EQ(s->post(c, tx.data(), 1, &err), 0) << "wrote before the whole group was told";
  wire();
  progress();
  ASSERT_EQ(s->post(c, tx.data(), 1, &err), 1) << err;
  const auto& out = fake::outstanding(sq());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(out[0].remoteAddr, e[2].addr) << "the entry with tag 22";
  EXPECT_EQ(out[1].opcode, IBV_WR_SEND) << "the DONE after the write";
  c.seq = 1, c.tag = 22;  // tag 22 is taken: refused
  ASSERT_EQ(s->post(c, tx.data(), 1, &err), 1) << err;
  EXPECT_EQ(fake::outstanding(sq()).size(), 3u);
  EXPECT_EQ(fake::outstanding(sq()).back().opcode, IBV_WR_SEND) << "a refusal writes nothing";
  wire();
  progress();
  ASSERT_EQ(rs.all.size(), 2u);
  EXPECT_EQ(rs.all[0].seq, 0u);
  EXPECT_EQ(rs.all[0].addr, e[2].addr);
  EXPECT_EQ(rs.all[0].bytes, 100u);
  EXPECT_FALSE(rs.all[0].refused);
  EXPECT_EQ(rx[256 + 99], 0x3c);
  EXPECT_EQ(rx[256 + 100], 0xA5);
  EXPECT_TRUE(rs.all[1].refused);
  EXPECT_EQ(rs.all[1].seq, 1u);
  EXPECT_EQ(rs.all[1].tag, 22u);
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  ASSERT_EQ(r->pending().size(), 1u);
  EXPECT_EQ(r->pending().front().next, 2) << "message 2 of the group is still to come";
}

TEST_F(VerbsPathTest, AWriteWithImmediateWithoutAnAdvertisementIsAProtocolBreak) {
  connect();
  std::vector<uint8_t> tx(16), rx(64);
  std::string err;
  ASSERT_EQ(r->advertise(0, 0, rx.data(), rx.size(), 7, &err), 1) << err;  // its QP takes WRITEs from now on
  ibv_sge sge{reinterpret_cast<uintptr_t>(tx.data()), 16, 1};
  ibv_send_wr wr[2] = {}, *bad = nullptr;
  for (ibv_send_wr& w : wr) {  // message 0, then one more with no advertisement left for it
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.imm_data = htonl(16);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(rx.data());
  }
  wr[0].next = &wr[1];
  ASSERT_EQ(ibv_post_send(sq(), &wr[0], &bad), 0);
  fake::deliver(sq(), rq());
  r->progress(rs);
  ASSERT_EQ(rs.breaks.size(), 1u);
  EXPECT_EQ(rs.breaks[0].source, "protocol");
  EXPECT_NE(rs.breaks[0].status.find("without an advertised buffer"), std::string::npos);
}

// Before its first advertisement a receive path's QP takes no WRITE at all (no
// IBV_ACCESS_REMOTE_WRITE): RC's responder refuses it (an invalid request: rxe NAKs it and moves
// its own QP to ERR), nothing lands, the sender's QP fails with the NAK's status, and the
// receiver's QP is in ERR with its posted receives flushed, so the receive path breaks too at
// its next progress (a flushed receive outside a fence). A path that never advertised cannot
// write late (RecvPath::writesAllowed, the receiver's fence). Until 2026-12-06 the fake left the
// receiver's QP in RTS and this test said "the receiver sees nothing".
TEST_F(VerbsPathTest, AReceivePathsQpRefusesWritesBeforeItsFirstAdvertisement) {
  connect();
  EXPECT_FALSE(r->writesAllowed());
  ASSERT_GT(fake::postedRecvs(rq()), 0u);
  std::vector<uint8_t> tx(16, 0x5a), rx(64, 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(tx.data()), 16, 1};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.imm_data = htonl(16);
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(rx.data());
  ASSERT_EQ(ibv_post_send(sq(), &wr, &bad), 0);
  fake::deliver(sq(), rq());
  for (uint8_t b : rx) ASSERT_EQ(b, 0) << "a WRITE landed before the first advertisement";
  EXPECT_EQ(fake::state(sq()), IBV_QPS_ERR) << "the WRITE was not refused";
  EXPECT_EQ(fake::state(rq()), IBV_QPS_ERR) << "the responder's QP stayed up after refusing a WRITE";
  EXPECT_EQ(fake::postedRecvs(rq()), 0u) << "the responder's receives were not flushed";
  r->progress(rs);
  EXPECT_TRUE(rs.got.empty()) << "the refused WRITE_WITH_IMM was reported as a message";
  ASSERT_EQ(rs.breaks.size(), 1u) << "the receive path did not break on its QP's error";
  EXPECT_EQ(rs.breaks[0].source, "completion");
  EXPECT_EQ(rs.breaks[0].code, IBV_WC_WR_FLUSH_ERR) << rs.breaks[0].status;
  s->progress(ss);
  ASSERT_EQ(ss.breaks.size(), 1u);
  EXPECT_EQ(ss.breaks[0].source, "completion");
  EXPECT_EQ(ss.breaks[0].code, IBV_WC_REM_INV_REQ_ERR) << ss.breaks[0].status;
  EXPECT_FALSE(r->writesAllowed());
}

}  // namespace

namespace {
// The close's linger (PathBase::lingerSends): it returns as soon as every send completed, and
// gives up as soon as its predicate says the peer is gone, not only at its bound.
TEST_F(VerbsPathTest, ACloseLingerEndsWhenTheSendsCompleteOrThePeerIsGone) {
  connect();
  std::string err;
  CtlMsg close;
  close.type = CtlType::kClose;
  ASSERT_EQ(r->sendCtl(close, &err), 1) << err;
  ASSERT_EQ(r->outstanding(), 1);
  fake::deliver(rq(), sq());  // the peer's HCA takes it
  EXPECT_TRUE(r->lingerSends(10000)) << "every send completed";
  EXPECT_EQ(r->outstanding(), 0);

  ASSERT_EQ(r->sendCtl(close, &err), 1) << err;  // this one is never taken
  int asked = 0;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(r->lingerSends(10000, [&] { return ++asked >= 3; })) << "the send is still outstanding";
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(asked, 3) << "asked until it said the peer is gone, then no more";
  EXPECT_LT(s, 5.0) << "gave up at the predicate (ms), not at the 10 s bound";
  EXPECT_EQ(r->outstanding(), 1);
}
// InfiniBand addressing (LIDs, no GRH), which the RoCE-only test bed cannot run: each QP's
// address vector names the peer's LID with is_global 0, and a message moves through it; the
// RTS retry settings come from RcParams (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT), the RNR retry
// is infinite on both kinds.
TEST(VerbsPathIb, LidAddressingWithoutAGrhAndTheRetrySettingsReachTheQps) {
  fake::reset();
  std::string err;
  Hca ha("fake0", &err), hb("fake1", &err);
  ASSERT_TRUE(ha.ok() && hb.ok()) << err;
  PortSel pa = portOf("fake0", 1), pb = portOf("fake1", 1);
  pa.roce = pb.roce = false;
  pa.lid = 0x11, pb.lid = 0x22;
  RcParams rc = params();
  rc.timeout = 18, rc.retryCnt = 5;
  SendPath s(ha, pa, rc, &err);
  RecvPath r(hb, pb, rc, &err);
  ASSERT_TRUE(s.ok() && r.ok()) << err;
  ASSERT_TRUE(s.connect(r.local(), &err)) << err;
  ASSERT_TRUE(r.connect(s.local(), &err)) << err;
  fake::QpPath sp = fake::qpPath(s.qp().qp()), rp = fake::qpPath(r.qp().qp());
  EXPECT_EQ(sp.isGlobal, 0);
  EXPECT_EQ(sp.dlid, 0x22) << "the sender's QP must address the receiver's LID";
  EXPECT_EQ(rp.isGlobal, 0);
  EXPECT_EQ(rp.dlid, 0x11);
  for (const fake::QpPath& q : {sp, rp}) {
    EXPECT_EQ(q.timeout, 18);
    EXPECT_EQ(q.retryCnt, 5);
    EXPECT_EQ(q.rnrRetry, 7) << "RNR retries are infinite (7)";
  }
  // A message through the LID-addressed QPs.
  std::vector<uint8_t> rx(64, 0), tx(64, 0x5c);
  std::vector<Hca*> rh{&hb}, sh{&ha};
  MrSet rmr(rh, rx.data(), rx.size(), &err), smr(sh, tx.data(), tx.size(), &err);
  ASSERT_TRUE(rmr.ok() && smr.ok()) << err;
  SSink ss;
  RSink rs;
  ASSERT_EQ(r.advertise(0, 7, rx.data(), rx.size(), rmr.rkey(0), &err), 1) << err;
  fake::deliver(r.qp().qp(), s.qp().qp());
  s.progress(ss);
  ChunkRef c;
  c.seq = 0, c.offset = 0, c.len = 64, c.total = 64;
  ASSERT_EQ(s.post(c, tx.data(), smr.lkey(0), &err), 1) << err;
  fake::deliver(s.qp().qp(), r.qp().qp());
  r.progress(rs);
  ASSERT_EQ(rs.got.size(), 1u);
  EXPECT_EQ(rx, tx);
}

// InfiniBand: when the subnet manager gives a port another LID while it stays up (the port
// watch reads it after IBV_EVENT_LID_CHANGE and tells the HCA, Hca::notePortLid), the paths
// connected with the old LID break at their next progress (the peer's QPs address the old LID,
// nothing would ever be acknowledged again); the same LID read again, another port's LID or the
// peer's HCA change nothing, and a path connected with the new LID works.
TEST(VerbsPathIb, APathBreaksWhenItsPortGetsAnotherLidAndOnlyThen) {
  fake::reset();
  std::string err;
  Hca ha("fake0", &err), hb("fake1", &err);
  ASSERT_TRUE(ha.ok() && hb.ok()) << err;
  PortSel pa = portOf("fake0", 1), pb = portOf("fake1", 1);
  pa.roce = pb.roce = false;
  pa.lid = 0x11, pb.lid = 0x22;
  auto pair = [&](const PortSel& a, std::unique_ptr<SendPath>* s, std::unique_ptr<RecvPath>* r) {
    s->reset(new SendPath(ha, a, params(), &err));
    r->reset(new RecvPath(hb, pb, params(), &err));
    ASSERT_TRUE((*s)->ok() && (*r)->ok()) << err;
    ASSERT_TRUE((*s)->connect((*r)->local(), &err)) << err;
    ASSERT_TRUE((*r)->connect((*s)->local(), &err)) << err;
  };
  std::unique_ptr<SendPath> s;
  std::unique_ptr<RecvPath> r;
  pair(pa, &s, &r);
  SSink ss;
  RSink rs;
  auto progress = [&] {
    s->progress(ss);
    r->progress(rs);
  };
  ha.notePortLid(1, 0x11);  // the LID it has: read again after an event that changed nothing
  hb.notePortLid(1, 0x22);
  ha.notePortLid(2, 0x99);  // another port of the sender's HCA
  progress();
  progress();
  EXPECT_TRUE(ss.breaks.empty() && rs.breaks.empty());
  ha.notePortLid(1, 0x15);
  progress();
  ASSERT_EQ(ss.breaks.size(), 1u) << "a path connected with the old LID kept running";
  EXPECT_EQ(ss.breaks[0].source, "port");
  EXPECT_EQ(ss.breaks[0].code, IBV_EVENT_LID_CHANGE);
  EXPECT_NE(ss.breaks[0].status.find("LID of fake0 port 1 changed from 17 to 21"), std::string::npos)
      << ss.breaks[0].status;
  EXPECT_TRUE(rs.breaks.empty()) << "the receiver's HCA kept its LID";
  // A path connected with the new LID is not broken by the change it already carries.
  std::unique_ptr<SendPath> s2;
  std::unique_ptr<RecvPath> r2;
  pa.lid = 0x15;
  pair(pa, &s2, &r2);
  SSink ss2;
  RSink rs2;
  s2->progress(ss2);
  r2->progress(rs2);
  EXPECT_TRUE(ss2.breaks.empty() && rs2.breaks.empty());
  EXPECT_EQ(fake::qpPath(r2->qp().qp()).dlid, 0x15);
  // RoCE addresses by GID: a LID read on the port means nothing to its paths.
  fake::reset();
  Hca hc("fake0", &err), hd("fake1", &err);
  ASSERT_TRUE(hc.ok() && hd.ok()) << err;
  SendPath rs3(hc, portOf("fake0", 1), params(), &err);
  RecvPath rr3(hd, portOf("fake1", 1), params(), &err);
  ASSERT_TRUE(rs3.ok() && rr3.ok()) << err;
  ASSERT_TRUE(rs3.connect(rr3.local(), &err) && rr3.connect(rs3.local(), &err)) << err;
  hc.notePortLid(1, 0x5);
  hc.notePortLid(1, 0x6);
  SSink ss3;
  rs3.progress(ss3);
  EXPECT_TRUE(ss3.breaks.empty());
}

// The same for RoCE: a GRH with the chosen source GID index, no LID.
TEST(VerbsPathIb, RoceAddressingUsesAGrhWithTheChosenGidIndex) {
  fake::reset();
  std::string err;
  Hca ha("fake0", &err), hb("fake1", &err);
  ASSERT_TRUE(ha.ok() && hb.ok()) << err;
  PortSel pa = portOf("fake0", 1), pb = portOf("fake1", 1);
  pa.gidIndex = 3;
  SendPath s(ha, pa, params(), &err);
  RecvPath r(hb, pb, params(), &err);
  ASSERT_TRUE(s.ok() && r.ok()) << err;
  ASSERT_TRUE(s.connect(r.local(), &err)) << err;
  fake::QpPath sp = fake::qpPath(s.qp().qp());
  EXPECT_EQ(sp.isGlobal, 1);
  EXPECT_EQ(sp.sgidIndex, 3);
  EXPECT_EQ(sp.dlid, 0);
  EXPECT_EQ(sp.timeout, params().timeout);
  EXPECT_EQ(sp.retryCnt, params().retryCnt);
}

// The silence the engine's flow-stall rule reads (lastProgressUs with sends outstanding)
// starts when a QP gets work, not at its last completion before an idle spell: otherwise the
// first send after a quiet minute would look like a minute of silence. And it keeps growing
// while the send is not acknowledged, and ends at its completion.
TEST_F(VerbsPathTest, TheSilenceClockStartsWhenAnIdleQpGetsWorkAndEndsAtItsCompletion) {
  connect();
  uint64_t connectedAt = s->lastProgressUs();
  while (railover::nowUs() - connectedAt < 50000) progress();  // an idle spell with nothing in flight
  std::string err;
  CtlMsg ack;
  ack.type = CtlType::kAck;
  uint64_t before = railover::nowUs();
  ASSERT_EQ(s->sendCtl(ack, &err), 1) << err;
  ASSERT_EQ(s->outstanding(), 1);
  uint64_t posted = s->lastProgressUs();
  EXPECT_GE(posted, before) << "the idle spell before the post counted as silence";
  uint64_t until = railover::nowUs() + 20000;
  while (railover::nowUs() < until) progress();  // never delivered: no acknowledgement
  EXPECT_EQ(s->lastProgressUs(), posted) << "the silence restarted without an acknowledgement";
  EXPECT_GE(railover::nowUs() - s->lastProgressUs(), 20000u);
  progress();  // a poll that starts after the 20 ms: the silence runs to it
  EXPECT_GE(s->silenceUs(), 20000u) << "polled all along, no acknowledgement: silence";
  uint64_t beforeAck = railover::nowUs();
  fake::deliver(sq(), rq());
  progress();
  EXPECT_EQ(s->outstanding(), 0);
  EXPECT_GE(s->lastProgressUs(), beforeAck) << "the completion ends the silence";
}

// The silence the flow-stall rule reads runs to the latest poll, not to now: a process stopped
// (SIGSTOP, the RDMA bed's stopped-peer control) or descheduled after its poll has not looked
// at its completion queue since, and the peer's HCA may have acknowledged everything meanwhile.
// Seen on the bed: the receiver posted an ACK, was stopped for 12.5 s before its flow-stall
// check, and failed its path over on "no acknowledgement for 12579 ms" with the ACK's
// completion waiting in the queue.
TEST_F(VerbsPathTest, TimeAProcessSpendsStoppedAfterItsPollIsNoSilence) {
  connect();
  std::string err;
  CtlMsg ack;
  ack.type = CtlType::kAck;
  const uint64_t t0 = railover::nowUs();
  ASSERT_EQ(s->sendCtl(ack, &err), 1) << err;
  progress();  // the poll: nothing acknowledged yet
  const uint64_t t1 = railover::nowUs();  // the post and the poll lie within [t0, t1]
  ASSERT_EQ(s->outstanding(), 1);
  fake::deliver(sq(), rq());  // the peer's HCA acknowledges while this process is stopped
  const uint64_t stoppedAt = railover::nowUs();
  while (railover::nowUs() - stoppedAt < 30000) {
  }  // 30 ms without a poll: the stop
  EXPECT_GE(railover::nowUs() - s->lastProgressUs(), 30000u) << "the old measure, to now, reads 30 ms";
  EXPECT_LE(s->silenceUs(), t1 - t0) << "the stopped time was read as the peer's silence";
  progress();  // back: the first poll finds the acknowledgement
  EXPECT_EQ(s->outstanding(), 0);
  EXPECT_EQ(s->silenceUs(), 0u);
}

// NCCL's IB transport calls ibv_fork_init() once, before it lists or opens a device
// (src/transport/net_ib/init.cc, ncclIbInitDevices; net_ib.cc in 2.19-2.23). Without it, on a
// kernel that does not copy pinned pages at fork (before Linux 5.13), a process that forks after
// registering host memory (a PyTorch DataLoader worker, a subprocess) leaves the parent's
// registered pages copy-on-write: the parent's next write moves them and the HCA keeps reading
// and writing the old frames. Loading the verbs table calls it first thing (the fake counts it
// and notes a call that came after a device was listed or memory registered).
TEST(VerbsApiLoad, ForkInitRunsBeforeAnyDeviceIsListedOrMemoryRegisteredAsNcclsIbTransportDoes) {
  std::string err;
  ASSERT_NE(verbsApi(&err), nullptr) << err;
  EXPECT_GE(fake::forkInitCalls(), 1) << "ibv_fork_init was never called";
  EXPECT_FALSE(fake::forkInitCameLate()) << "ibv_fork_init came after a device was listed or memory registered";
}
}  // namespace
