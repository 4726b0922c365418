// Grouped receives on the RDMA transport, end to end through the receiving engine: a real
// RecvLink (failover/link.h: irecv, test, its advertisements, RESUME handling) on the RDMA
// transport's receive paths over the fake verbs provider (tests/verbs/fake_verbs.h), and RDMA
// send paths the test drives as the sending engine would (chunks in seq order, RESUME on the
// standby from the first unacknowledged message, the rest resent whole).
//
// Checked: grouped receives of n = 1..8 buffers with distinct tags and sizes, the sends in any
// tag order, every byte and the bytes past each message; a message larger than its entry and
// one whose tag matches no free entry (the caller's errors, reported by test() as with TCP,
// nothing written, the path stays up); a failover in the middle of a group (some entries
// complete, one half-written, the rest resent on the standby path with the standby HCA's rkey,
// every byte checked).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "common/clock.h"
#include "failover/link.h"
#include "tests/fake_net.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/wire.h"
#include "transport/verbs/verbs_mr.h"

namespace railover {
namespace {

using rdmatest::addrOf;
using rdmatest::portOf;

constexpr const char* kIp[2] = {"10.0.0.1", "10.0.1.1"};

// NIC 0 = fake0 port 1, NIC 1 = fake1 port 1, one transport (one worker: the fake provider is
// not thread-safe, so the test drains the worker after every call that may post to it).
// Path 0 (the primary) goes from NIC 0 to the receiver's NIC 1 (HCA fake1); path 1 (the
// standby) from NIC 1 to the receiver's NIC 0 (HCA fake0): a failover changes the receiver's HCA
// and so the rkeys the sender must write with.
class RdmaGroupedTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kChunk = 256;  // sender's chunk size: messages of several chunks

  void SetUp() override {
    ::fake::reset();
    boot.nicAddr = {kIp[0], kIp[1]};
    std::string err;
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)},
                                              &boot, &err, ib);
    ASSERT_TRUE(t->ok()) << err;
    nics = {testbed::makeNic(0, "n0", kIp[0], 0), testbed::makeNic(1, "n1", kIp[1], 1)};
    cfg.fatalTimeoutS = 0;  // the test decides when a path is gone
    deps.cfg = &cfg, deps.nics = &nics, deps.ports = &ports, deps.transport = t.get(), deps.health = nullptr;
    recv = std::make_unique<RecvLink>(deps, 7, 9, 1);
    txb.assign(1 << 16, 0);
    smr = reg(txb);
  }
  void TearDown() override {
    if (recv) recv->close();
    recv.reset();
    for (auto& s : side) s.tx.reset();
    t->worker().drain();
    for (void* m : mrs) t->deregMr(m);
    t->worker().drain();
  }

  void* reg(std::vector<uint8_t>& b) { return rdmatest::regBuffer(*t, b, mrs); }

  // Opens send path `k` from NIC `sendNic` to the receiver's NIC `recvNic`, hands its bootstrap
  // stream to the RecvLink as the acceptor does, and brings both ends up (bounded).
  void openPath(int k, int sendNic, int recvNic, uint32_t generation = 1) {
    std::string err;
    PathIdentity id;
    id.secret = 7, id.connId = 9, id.pathIndex = (uint8_t)k, id.srcRail = (uint8_t)sendNic, id.generation = generation;
    ChunkPolicy cp;
    cp.minChunkBytes = 128, cp.maxChunkBytes = chunk;
    sockaddr_storage remote = addrOf(kIp[recvNic], 5000);
    Side& s = side[k];
    s.tx = t->openSendPath(sendNic, remote, sizeof(sockaddr_in), 1, id, cp, &err);
    ASSERT_TRUE(s.tx) << err;
    ASSERT_EQ(s.tx->connectState(&err), 0) << err;  // the worker creates the QPs
    t->worker().drain();
    ASSERT_EQ(s.tx->connectState(&err), 0) << err;  // HELLO and endpoints written
    ASSERT_EQ(boot.pending.size(), 1u);
    std::unique_ptr<Conn> server = std::move(boot.pending[0].server);
    boot.pending.clear();
    uint8_t hb[wire::kFrameBytes];
    ASSERT_EQ(server->read(hb, sizeof(hb), &err), (ssize_t)sizeof(hb));
    StreamHello h;
    h.id = id, h.stream = 0, h.nStreams = 1;
    ASSERT_TRUE(recv->offerStream(server, h, addrOf(kIp[sendNic], 40000), recvNic));
    uint64_t deadline = nowUs() + 20 * 1000 * 1000;
    int a = 0;
    while ((a != 1 || recv->paths.size() <= (size_t)k || recv->paths[k].state != PathState::kStandby) &&
           nowUs() < deadline) {
      recv->ready();  // the slow tick: takes the stream, drives the receive path's bring-up
      a = s.tx->connectState(&err);
      ASSERT_GE(a, 0) << err;
      t->worker().drain();
    }
    ASSERT_EQ(a, 1) << "send path " << k << " did not come up";
    ASSERT_EQ(recv->paths[k].state, PathState::kStandby) << "receive path " << k << " did not come up";
    s.sq = rdma::pathQp(s.tx.get());
    ASSERT_TRUE(s.sq);
  }
  ibv_qp* rq(int k) { return recv->paths[k].rx ? rdma::pathQp(recv->paths[k].rx.get()) : nullptr; }

  // One round on path k: both wires carried, the sender progressed, the receiver's engine driven
  // through test() on every receive not seen done, the sender's control messages read.
  void round(int k) {
    Side& s = side[k];
    if (rq(k)) {  // every QP of the path (NCCL_IB_QPS_PER_CONNECTION), both ways
      std::vector<ibv_qp*> sqs = rdma::pathQps(s.tx.get()), rqs = rdma::pathQps(recv->paths[k].rx.get());
      for (size_t i = 0; i < sqs.size() && i < rqs.size(); ++i) {
        ::fake::deliver(sqs[i], rqs[i]);
        ::fake::deliver(rqs[i], sqs[i]);
      }
    }
    std::string err;
    int p = s.tx->progress(&err);
    EXPECT_GE(p, 0) << err;
    recv->sweep();  // drives the link while it has no active path (a RESUME on a standby)
    t->fencer().joinAll();  // receive-path fences run on threads of their own (fenceAsync)
    t->worker().drain();
    for (Req& q : reqs) {
      if (q.seenDone || q.rc != ncclSuccess) continue;
      int done = 0;
      q.rc = recv->test(q.r, &done, q.sizes);
      q.seenDone = done != 0;
      t->worker().drain();
    }
    recv->ready();
    t->worker().drain();
    CtlMsg m;
    while (s.tx->recvCtl(&m, &err) == 1) {
      if (m.type == CtlType::kAck) s.acked = m.seq;
      if (m.type == CtlType::kResumeAck) s.resumeAck = (int64_t)m.seq;
    }
  }
  void rounds(int k, int n) {
    for (int i = 0; i < n; ++i) round(k);
  }

  // The sender's RESUME(from) on path k; returns the receiver's RESUME_ACK seq (-1: none came).
  int64_t resume(int k, uint64_t from) {
    CtlMsg m;
    m.type = CtlType::kResume, m.seq = from, m.arg = 1;
    side[k].tx->sendCtl(m);
    side[k].resumeAck = -1;
    for (int i = 0; i < 20 && side[k].resumeAck < 0; ++i) round(k);
    return side[k].resumeAck;
  }

  // A grouped receive of caps.size() buffers (tags, capacities), each in its own slice of `rxb`
  // preceded by nothing and followed by canary bytes.
  struct Req {
    RecvReq* r = nullptr;
    std::vector<uint8_t*> bufs;
    std::vector<uint64_t> caps;
    std::vector<int> tags;
    int sizes[kMaxRecvs] = {0};
    bool seenDone = false;
    ncclResult_t rc = ncclSuccess;
  };
  static constexpr uint8_t kCanary = 0xA5;
  Req& postRecv(std::vector<uint8_t>& rxb, void* rmr, uint64_t& at, const std::vector<uint64_t>& caps,
                const std::vector<int>& tags) {
    Req q;
    void* data[kMaxRecvs];
    void* mh[kMaxRecvs];
    uint64_t c[kMaxRecvs];
    int tg[kMaxRecvs];
    for (size_t i = 0; i < caps.size(); ++i) {
      q.bufs.push_back(rxb.data() + at);
      data[i] = rxb.data() + at, mh[i] = rmr, c[i] = caps[i], tg[i] = tags[i];
      at += caps[i] + 64;  // 64 canary bytes after each buffer
    }
    EXPECT_LE(at, rxb.size());
    q.caps = caps, q.tags = tags;
    void* req = nullptr;
    EXPECT_EQ(recv->irecv((int)caps.size(), data, c, tg, &req, mh), ncclSuccess);
    EXPECT_NE(req, nullptr);
    t->worker().drain();
    q.r = (RecvReq*)req;
    reqs.push_back(q);
    return reqs.back();
  }

  // A message the sender posts: `size` bytes of a pattern from (seq, i) in its own slice of txb.
  struct Msg {
    uint64_t seq;
    int tag;
    uint64_t size;
    uint64_t off;  // in txb
  };
  static uint8_t pat(uint64_t seq, uint64_t i) { return (uint8_t)(seq * 131 + i * 7 + 1); }
  Msg makeMsg(uint64_t seq, int tag, uint64_t size) {
    Msg m{seq, tag, size, txAt};
    for (uint64_t i = 0; i < size; ++i) txb[txAt + i] = pat(seq, i);
    txAt += size + 8;
    EXPECT_LE(txAt, txb.size());
    return m;
  }
  // Posts the message's chunks on path k, as the sending engine does.
  void send(int k, const Msg& m) {
    ChunkRef c;
    c.seq = m.seq, c.total = m.size, c.tag = m.tag, c.mhandle = smr;
    uint64_t cs = side[k].tx->chunkBytes(m.size), off = 0;
    do {
      c.offset = off;
      c.len = std::min(cs, m.size - off);
      side[k].tx->post(c, txb.data() + m.off + off);
      off += c.len;
    } while (off < m.size);
  }

  // Every byte of message `m` is in `buf`, and the bytes after it up to the canary's end are
  // untouched (nothing written past the message).
  static void expectMessageIn(const Msg& m, const uint8_t* buf, uint64_t cap) {
    for (uint64_t i = 0; i < m.size; ++i) ASSERT_EQ(buf[i], pat(m.seq, i)) << "message " << m.seq << " byte " << i;
    for (uint64_t i = m.size; i < cap + 64; ++i) ASSERT_EQ(buf[i], kCanary) << "written past message " << m.seq << " at " << i;
  }

  struct Side {
    std::unique_ptr<SendPath> tx;
    ibv_qp* sq = nullptr;
    uint64_t acked = 0;
    int64_t resumeAck = -1;
  };
  fake::FakeTransport boot;
  IbConfig ib;              // NCCL_IB_* of the transport (SetUp)
  uint64_t chunk = kChunk;  // the send paths' chunk size (openPath)
  std::unique_ptr<rdma::RdmaTransport> t;
  Config cfg;
  std::vector<Nic> nics;
  std::vector<uint16_t> ports{40000, 40001};
  LinkDeps deps;
  std::unique_ptr<RecvLink> recv;
  Side side[2];
  std::vector<Req> reqs;
  std::vector<uint8_t> txb;
  uint64_t txAt = 0;
  void* smr = nullptr;
  std::vector<void*> mrs;
};

TEST_F(RdmaGroupedTest, TheTransportOffersGroupedReceives) {
  EXPECT_TRUE(t->tellsPostedReceives()) << "its advertisements let the sender match tags";
  EXPECT_TRUE(t->groupedReceives());
  EXPECT_EQ(t->maxMessageBytes(), 0xffffffffull) << "the size travels in 32 bits";
}

// n = 1..8: distinct tags and capacities, the messages sent in a shuffled tag order, sizes from
// 0 to the full capacity; each lands in the buffer with its tag, test() reports each buffer's
// size, nothing is written past a message.
TEST_F(RdmaGroupedTest, GroupsOfOneToEightBuffersFillByTagInAnySendOrder) {
  openPath(0, 0, 1);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(64 * 1024, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0, seq = 0;
  std::mt19937 rng(12345);
  for (int n = 1; n <= kMaxRecvs; ++n) {
    std::vector<uint64_t> caps;
    std::vector<int> tags;
    for (int i = 0; i < n; ++i) caps.push_back(97 * (uint64_t)(i + 1) + 13 * (uint64_t)n), tags.push_back(1000 * n + 17 * i + 3);
    Req& q = postRecv(rxb, rmr, at, caps, tags);
    size_t qi = reqs.size() - 1;
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Msg> msgs(n);  // by buffer index
    std::vector<uint64_t> sizes(n);
    for (int j = 0; j < n; ++j) {
      int b = order[j];
      // sizes: empty, full, and in between (several chunks for the larger ones)
      uint64_t size = j == 0 ? 0 : j == 1 ? caps[b] : (caps[b] * (uint64_t)j) / (uint64_t)(n + 1);
      msgs[b] = makeMsg(seq++, tags[b], size);
      send(0, msgs[b]);
    }
    (void)q;
    for (int i = 0; i < 10 && !reqs[qi].seenDone; ++i) round(0);
    Req& r = reqs[qi];
    ASSERT_EQ(r.rc, ncclSuccess);
    ASSERT_TRUE(r.seenDone) << "grouped receive of " << n << " not complete";
    for (int b = 0; b < n; ++b) {
      EXPECT_EQ((uint64_t)r.sizes[b], msgs[b].size) << "n " << n << " buffer " << b;
      expectMessageIn(msgs[b], r.bufs[b], caps[b]);
    }
  }
  rounds(0, 2);
  EXPECT_EQ(side[0].acked, seq) << "every message acknowledged";
  EXPECT_EQ(recv->paths[0].state, PathState::kActive);
}

// Two entries with the same tag take its messages in seq order (the first free one first), as
// the engine matches them.
TEST_F(RdmaGroupedTest, EntriesWithTheSameTagFillInOrder) {
  openPath(0, 0, 1);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(4096, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  postRecv(rxb, rmr, at, {300, 200, 300}, {5, 6, 5});
  Msg a = makeMsg(0, 6, 150), b = makeMsg(1, 5, 290), c = makeMsg(2, 5, 10);
  send(0, a), send(0, b), send(0, c);
  for (int i = 0; i < 10 && !reqs[0].seenDone; ++i) round(0);
  ASSERT_TRUE(reqs[0].seenDone);
  expectMessageIn(b, reqs[0].bufs[0], 300);
  expectMessageIn(a, reqs[0].bufs[1], 200);
  expectMessageIn(c, reqs[0].bufs[2], 300);
  EXPECT_EQ(reqs[0].sizes[0], 290);
  EXPECT_EQ(reqs[0].sizes[1], 150);
  EXPECT_EQ(reqs[0].sizes[2], 10);
}

// A message larger than the entry its tag picks: refused by the sender (nothing written), the
// receive fails in test() with ncclInvalidUsage (truncation, as TCP), and the path stays up.
TEST_F(RdmaGroupedTest, AMessageLargerThanItsEntryIsTheCallersErrorAndNothingIsWritten) {
  openPath(0, 0, 1);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(4096, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  postRecv(rxb, rmr, at, {100, 500}, {1, 2});
  Msg ok = makeMsg(0, 2, 400), big = makeMsg(1, 1, 101);
  send(0, ok), send(0, big);
  rounds(0, 6);
  EXPECT_EQ(reqs[0].rc, ncclInvalidUsage);
  EXPECT_FALSE(reqs[0].seenDone);
  expectMessageIn(ok, reqs[0].bufs[1], 500);
  for (int i = 0; i < 100 + 64; ++i) ASSERT_EQ(reqs[0].bufs[0][i], kCanary) << "the refused message wrote byte " << i;
  EXPECT_EQ(recv->paths[0].state, PathState::kActive) << "the caller's error is not a path fault";
  EXPECT_EQ(recv->paths[0].lastError, "");
  EXPECT_TRUE(::fake::outstanding(side[0].sq).empty());
}

// A message whose tag matches no free entry: refused, ncclInternalError (as TCP), nothing written.
TEST_F(RdmaGroupedTest, AMessageWhoseTagMatchesNoFreeEntryIsTheCallersError) {
  openPath(0, 0, 1);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(4096, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  postRecv(rxb, rmr, at, {100, 100}, {1, 2});
  Msg a = makeMsg(0, 1, 50), b = makeMsg(1, 1, 50);  // the second tag-1 message finds no free tag-1 entry
  send(0, a), send(0, b);
  rounds(0, 6);
  EXPECT_EQ(reqs[0].rc, ncclInternalError);
  expectMessageIn(a, reqs[0].bufs[0], 100);
  for (int i = 0; i < 100 + 64; ++i) ASSERT_EQ(reqs[0].bufs[1][i], kCanary) << "byte " << i;
  EXPECT_EQ(recv->paths[0].state, PathState::kActive);
}

// Failover in the middle of a group of 6: three messages complete on the primary, the fourth
// half-written (its first chunk landed, no DONE), then the primary's QP fails. The sender
// fences it and resumes on the standby from the first unacknowledged message; the receiver
// fences the primary and re-advertises the three untaken entries with the standby HCA's rkey;
// the sender resends messages 3..5 whole into them. Every byte of all six buffers is checked.
TEST_F(RdmaGroupedTest, AFailoverInTheMiddleOfAGroupResendsTheRestOnTheStandbyWithItsKeys) {
  openPath(0, 0, 1);
  openPath(1, 1, 0);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(16384, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  const std::vector<uint64_t> caps = {1000, 700, 900, 1200, 300, 800};
  const std::vector<int> tags = {60, 61, 62, 63, 64, 65};
  postRecv(rxb, rmr, at, caps, tags);
  // Sent in this tag order: buffers 4, 1, 5 complete, buffer 3 half-written, 0 and 2 after it.
  const std::vector<int> order = {4, 1, 5, 3, 0, 2};
  const std::vector<uint64_t> size = {999, 700, 650, 1100, 300, 1};
  std::vector<Msg> msgs(6);
  for (int j = 0; j < 6; ++j) msgs[order[j]] = makeMsg((uint64_t)j, tags[order[j]], size[order[j]]);
  rounds(0, 1);
  // What the engine places sends by (tag matching, SendLink::isend): the whole group as posted.
  PostedReceive pr;
  ASSERT_TRUE(side[0].tx->postedReceive(5, &pr)) << "the group's advertisement is in";
  EXPECT_EQ(pr.firstSeq, 0u);
  ASSERT_EQ(pr.n, 6);
  EXPECT_TRUE(pr.grouped);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(pr.tags[i], tags[i]) << "entry " << i;
  EXPECT_FALSE(side[0].tx->postedReceive(6, &pr)) << "nothing is posted past the group";
  for (int j = 0; j < 3; ++j) send(0, msgs[order[j]]);
  rounds(0, 4);
  ASSERT_EQ(side[0].acked, 3u) << "three messages of the group complete on the primary";
  EXPECT_FALSE(reqs[0].seenDone);
  // Message 3 (1100 bytes, 5 chunks): only its first write reaches the receiver.
  send(0, msgs[order[3]]);
  std::string err;
  ASSERT_GE(side[0].tx->progress(&err), 0) << err;
  ASSERT_EQ(::fake::deliver(side[0].sq, rq(0), 1), 1);
  ASSERT_EQ(reqs[0].bufs[3][0], pat(3, 0)) << "the half-written message's first chunk landed";
  ::fake::fail(side[0].sq, IBV_WC_RETRY_EXC_ERR);  // the primary's QP fails, the rest is flushed
  for (int i = 0; i < 20 && side[0].tx->progress(&err) >= 0; ++i) {
  }
  EXPECT_NE(err.find("retry"), std::string::npos) << err;
  side[0].tx->fence();
  t->worker().drain();
  EXPECT_FALSE(side[0].tx->postedReceive(3, &pr)) << "a fenced path tells nothing";
  // The sender resumes on the standby from its first unacknowledged message.
  ASSERT_EQ(resume(1, side[0].acked), 3) << "the receiver expects message 3 next";
  // The standby was told what is left: messages 3..5 into the untaken entries 0, 2, 3, in
  // entry order, with their tags. Its advertisements wait for its grant of remote write, which
  // runs on a fence thread started by the RESUME and may end after the RESUME_ACK left (a
  // loaded host): a few more rounds bring them (seen once in 150 runs under load).
  for (int i = 0; i < 20 && !side[1].tx->postedReceive(4, &pr); ++i) round(1);
  ASSERT_TRUE(side[1].tx->postedReceive(4, &pr));
  EXPECT_EQ(pr.firstSeq, 3u);
  ASSERT_EQ(pr.n, 3);
  EXPECT_TRUE(pr.grouped);
  EXPECT_EQ(pr.tags[0], tags[0]);
  EXPECT_EQ(pr.tags[1], tags[2]);
  EXPECT_EQ(pr.tags[2], tags[3]);
  EXPECT_EQ(recv->active, 1);
  EXPECT_EQ(recv->paths[0].state, PathState::kFailed) << "the primary is fenced by the RESUME";
  // The re-advertisement reached the standby sender; its writes carry the standby HCA's rkey
  // (the receiver's NIC 0: fake0) into the untaken entries only.
  const verbs::MrSet* rm = (const verbs::MrSet*)rmr;
  const uint32_t standbyKey = rm->rkey((size_t)t->port(0).hcaIndex);
  const uint32_t primaryKey = rm->rkey((size_t)t->port(1).hcaIndex);
  ASSERT_NE(standbyKey, primaryKey);
  for (int j = 3; j < 6; ++j) send(1, msgs[order[j]]);
  ASSERT_GE(side[1].tx->progress(&err), 0) << err;
  int writes = 0;
  for (const auto& w : ::fake::outstanding(side[1].sq)) {
    if (w.opcode != IBV_WR_RDMA_WRITE && w.opcode != IBV_WR_RDMA_WRITE_WITH_IMM) continue;
    ++writes;
    EXPECT_EQ(w.rkey, standbyKey) << "a resent write with another HCA's rkey";
    bool inUntaken = false;
    for (int b : {3, 0, 2})
      inUntaken |= w.remoteAddr >= (uintptr_t)reqs[0].bufs[b] && w.remoteAddr + w.data.size() <= (uintptr_t)reqs[0].bufs[b] + caps[b];
    EXPECT_TRUE(inUntaken) << "a resent write outside the untaken entries";
  }
  EXPECT_EQ(writes, 5 + 4 + 3) << "messages 3..5 resent whole (1100, 999 and 650 bytes in 256-byte chunks)";
  for (int i = 0; i < 10 && !reqs[0].seenDone; ++i) round(1);
  ASSERT_EQ(reqs[0].rc, ncclSuccess);
  ASSERT_TRUE(reqs[0].seenDone);
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ((uint64_t)reqs[0].sizes[b], size[b]) << "buffer " << b;
    expectMessageIn(msgs[b], reqs[0].bufs[b], caps[b]);
  }
  rounds(1, 2);
  EXPECT_EQ(side[1].acked, 6u);
  // Two HCAs wrote this receive (buffers 4, 1, 5 through the primary's, 3, 0, 2 through the
  // standby's): NCCL's flush of its last buffer must READ through both.
  std::lock_guard<std::mutex> g(recv->mu);
  const uint64_t both = (1ull << recv->paths[0].localNic) | (1ull << recv->paths[1].localNic);
  ASSERT_NE(recv->paths[0].localNic, recv->paths[1].localNic);
  EXPECT_EQ(recv->flushNics(reqs[0].bufs[5]), both);
}

// A standby that never carried data, whose receive QP can be neither moved to ERR nor destroyed
// (a sick HCA), is replaced by the sender's reconnect; then the primary fails and the sender
// resumes on the new standby. The receiver's fence of the old standby could not stop its QP,
// but that QP never took RDMA WRITEs (no buffer was advertised on it, so it never got
// IBV_ACCESS_REMOTE_WRITE): the comm goes on and every byte lands. Before, such a fence made
// the comm fatal at the RESUME. A path that did carry writes still fails the comm
// (RdmaPathTest.AFenceWhoseQpRefusesErrAndDestructionSaysItIsUnsafe,
// EngineOnly.AFenceThatCouldNotStopTheOldPathFailsTheCommInsteadOfResuming).
TEST_F(RdmaGroupedTest, AStandbyThatNeverCarriedDataAndCannotBeStoppedDoesNotFailTheComm) {
  openPath(0, 0, 1);
  openPath(1, 1, 0);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(8192, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  postRecv(rxb, rmr, at, {1000}, {70});
  postRecv(rxb, rmr, at, {1000}, {71});
  Msg m0 = makeMsg(0, 70, 900), m1 = makeMsg(1, 71, 777);
  rounds(0, 1);  // the advertisements reach the primary's sender
  send(0, m0);
  rounds(0, 4);
  ASSERT_EQ(side[0].acked, 1u);
  ASSERT_TRUE(reqs[0].seenDone);
  // The standby's receive QP refuses the fence's move to ERR and every destruction it tries;
  // the sender reconnects the standby (generation 2), which fences generation 1.
  ibv_qp* stuck = rq(1);
  ASSERT_TRUE(stuck);
  ::fake::failNextModify(EIO, stuck);
  ::fake::failNextDestroy(EBUSY, stuck, rdma::kFenceDestroyTries);
  side[1].tx.reset();
  t->worker().drain();
  openPath(1, 1, 0, 2);
  t->fencer().joinAll();
  ASSERT_FALSE(recv->isFatal()) << "a standby's fence alone made the comm fatal";
  // Message 1 is posted on the primary, whose QP fails before it lands.
  send(0, m1);
  std::string err;
  ASSERT_GE(side[0].tx->progress(&err), 0) << err;
  ::fake::fail(side[0].sq, IBV_WC_RETRY_EXC_ERR);
  for (int i = 0; i < 20 && side[0].tx->progress(&err) >= 0; ++i) {
  }
  side[0].tx->fence();
  t->worker().drain();
  ASSERT_EQ(resume(1, side[0].acked), 1) << "the receiver did not answer the RESUME on the new standby";
  ASSERT_FALSE(recv->isFatal());
  EXPECT_EQ(recv->active, 1);
  send(1, m1);
  for (int i = 0; i < 10 && !reqs[1].seenDone; ++i) round(1);
  ASSERT_EQ(reqs[1].rc, ncclSuccess);
  ASSERT_TRUE(reqs[1].seenDone);
  expectMessageIn(m0, reqs[0].bufs[0], 1000);
  expectMessageIn(m1, reqs[1].bufs[0], 1000);
  rounds(1, 2);
  EXPECT_EQ(side[1].acked, 2u);
}

// The same engine over paths of three QPs each (NCCL_IB_QPS_PER_CONNECTION=3), with chunks of
// 1024 bytes so that every QP carries a share of each full chunk (3 x 384 bytes, 128-aligned).
class RdmaGroupedLanesTest : public RdmaGroupedTest {
 protected:
  void SetUp() override {
    ib.qpsPerConnection = 3;
    chunk = 1024;
    RdmaGroupedTest::SetUp();
  }
};

// A message whose share on one QP never lands is never reported, even though the other QPs'
// shares and lane 0's end of it did; when that QP fails, the sender resumes on the standby path
// (three QPs on the other HCA) and the message arrives whole with every byte right.
TEST_F(RdmaGroupedLanesTest, AMessageMissingOneQpsShareIsResentWholeOnTheStandby) {
  openPath(0, 0, 1);
  openPath(1, 1, 0);
  ASSERT_EQ(rdma::pathQps(side[0].tx.get()).size(), 3u);
  ASSERT_EQ(rdma::pathQps(recv->paths[1].rx.get()).size(), 3u);
  ASSERT_EQ(resume(0, 0), 0);
  std::vector<uint8_t> rxb(16384, kCanary);
  void* rmr = reg(rxb);
  uint64_t at = 0;
  const std::vector<uint64_t> caps = {3000, 2500, 2100, 1000};
  const std::vector<int> tags = {70, 71, 72, 73};
  postRecv(rxb, rmr, at, caps, tags);
  const std::vector<uint64_t> size = {2999, 2048, 2100, 1};
  std::vector<Msg> msgs(4);
  for (int j = 0; j < 4; ++j) msgs[j] = makeMsg((uint64_t)j, tags[j], size[j]);
  send(0, msgs[0]);
  send(0, msgs[1]);
  rounds(0, 4);
  ASSERT_EQ(side[0].acked, 2u) << "two messages complete over three QPs";
  // Message 2 (2100 bytes, 3 chunks): QPs 0 and 1 deliver everything, QP 2 nothing.
  send(0, msgs[2]);
  std::string err;
  ASSERT_GE(side[0].tx->progress(&err), 0) << err;
  std::vector<ibv_qp*> sqs = rdma::pathQps(side[0].tx.get()), rqs = rdma::pathQps(recv->paths[0].rx.get());
  ASSERT_GE(::fake::outstanding(sqs[2]).size(), 2u) << "QP 2 holds shares of message 2 and its PART";
  for (int i = 0; i < 2; ++i) {
    ::fake::deliver(sqs[i], rqs[i]);
    ::fake::deliver(rqs[i], sqs[i]);
  }
  for (int i = 0; i < 4; ++i) {
    recv->ready();
    t->worker().drain();
    int done = 0;
    ASSERT_EQ(recv->test(reqs[0].r, &done, reqs[0].sizes), ncclSuccess);
    EXPECT_EQ(done, 0);
    CtlMsg m;
    while (side[0].tx->recvCtl(&m, &err) == 1)
      if (m.type == CtlType::kAck) side[0].acked = m.seq;
  }
  EXPECT_EQ(side[0].acked, 2u) << "message 2 acknowledged without QP 2's share";
  ::fake::fail(sqs[2], IBV_WC_RETRY_EXC_ERR);  // QP 2 of the primary fails: the path is broken
  for (int i = 0; i < 20 && side[0].tx->progress(&err) >= 0; ++i) {
  }
  EXPECT_NE(err.find("retry"), std::string::npos) << err;
  side[0].tx->fence();
  t->worker().drain();
  ASSERT_EQ(resume(1, side[0].acked), 2) << "the receiver expects message 2 next";
  EXPECT_EQ(recv->active, 1);
  send(1, msgs[2]);
  send(1, msgs[3]);
  for (int i = 0; i < 10 && !reqs[0].seenDone; ++i) round(1);
  ASSERT_EQ(reqs[0].rc, ncclSuccess);
  ASSERT_TRUE(reqs[0].seenDone);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ((uint64_t)reqs[0].sizes[b], size[b]) << "buffer " << b;
    expectMessageIn(msgs[b], reqs[0].bufs[b], caps[b]);
  }
  rounds(1, 2);
  EXPECT_EQ(side[1].acked, 4u);
}

}  // namespace
}  // namespace railover
