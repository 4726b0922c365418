// Unit tests of the RDMA transport's engine-facing paths (transport/rdma) over the fake verbs
// provider (tests/verbs/fake_verbs.h: QPs whose traffic the test delivers) and in-memory
// bootstrap streams (tests/fake_net.h): bring-up through the bootstrap stream, messages written
// into advertised buffers and reported to the engine's RecvSink, the send side waiting for the
// advertisement, registrations, the engine holding an arrival, protocol errors, a refusal
// (NACK) during bring-up, a peer that is not an RDMA peer, port errors on the path's own port
// and on another one, and the end of the bootstrap stream.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <unistd.h>
#include <net/if.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "common/clock.h"
#include "common/log.h"
#include "tests/log_capture.h"
#include "plugin/runtime.h"
#include "plugin/state_file.h"
#include "tests/fake_net.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/wire.h"
#include "transport/verbs/verbs_config.h"
#include "transport/verbs/verbs_mr.h"

namespace railover {
namespace {

using rdmatest::addrOf;
using rdmatest::portOf;

// What the engine's receive side does, recorded; `hold` makes place() answer kHold.
struct Sink : RecvSink {
  struct Got {
    ChunkRef c;
    bool discarded;
  };
  std::vector<Got> got;
  std::vector<CtlMsg> ctls;
  uint8_t* dst = nullptr;  // where place() says the next message goes
  int holds = 0;           // place() answers kHold this many times first
  int placed = 0;
  int place(const ChunkRef& c, uint8_t** d, std::string*) override {
    if (holds > 0) return holds--, kHold;
    placed++;
    *d = dst;
    return kWrite;
  }
  void arrived(const ChunkRef& c, bool discarded) override { got.push_back({c, discarded}); }
  bool control(const CtlMsg& m, std::string* err) override {
    ctls.push_back(m);
    *err = "control message on the active path";
    return false;
  }
};

// One transport serving NIC 0 (fake0 port 1) and NIC 1 (fake1 port 1); paths go 0 -> 1. The
// transport's worker and fence threads call the fake provider while the test thread does (the
// fake is thread-safe, as libibverbs is).
class RdmaPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::fake::reset();
    boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
    std::string err;
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)},
                                              &boot, &err);
    ASSERT_TRUE(t->ok()) << err;
  }
  void TearDown() override {
    for (void* m : mrs) t->deregMr(m);
    tx.reset();
    rx.reset();
    t->worker().drain();
  }

  // Brings the path up, holds the fence runner and advertises `rxb` (registered here): the
  // path's grant of remote write is queued, not begun. *modifiesBefore: the fake's access
  // modifies before it.
  void queueAGrantHeld(std::vector<uint8_t>& rxb, size_t* modifiesBefore) {
    bringUp();
    void* rmr = reg(rxb);
    *modifiesBefore = ::fake::accessModifiers().size();
    t->fencer().hold(true);
    AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
    rx->advertise(0, &e, 1, false);
    ASSERT_EQ(t->fencer().queued(), 1u) << "the first advertisement queued no grant";
  }
  // The receive path's QP is in ERR (fenced) and was never granted IBV_ACCESS_REMOTE_WRITE.
  void expectFencedWithoutRemoteWrite() {
    EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR) << "the path is not fenced";
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(ibv_query_qp(rq, &a, IBV_QP_ACCESS_FLAGS, &ia), 0);
    EXPECT_FALSE(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) << "the fenced path's QP was granted remote write";
  }

  int commTrafficClass = -1;  // the comm's traffic class from NCCL for openSendOnly (-1: none)
  // Opens the send side on NIC 0 toward 10.0.1.1 into `tx` (secret 7, conn 9, path 1,
  // generation 3); false with *err when openSendPath refused.
  bool openSendOnly(std::string* err) {
    PathIdentity id;
    id.secret = 7, id.connId = 9, id.pathIndex = 1, id.generation = 3;
    id.trafficClass = commTrafficClass;
    ChunkPolicy cp;
    cp.minChunkBytes = 128, cp.maxChunkBytes = kChunk;
    tx = t->openSendPath(0, addrOf("10.0.1.1", 5000), sizeof(sockaddr_in), 1, id, cp, err);
    return tx != nullptr;
  }

  // Holds the transport's worker (a job that waits) until release() or destruction, as a
  // worker busy with a slow QP release would.
  // The constructor returns once the worker runs the holding job: bring-up jobs posted after
  // it would otherwise run first (they go before other jobs).
  struct HeldWorker {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, open = false, left = false;
    explicit HeldWorker(rdma::Worker& w) {
      w.post([this] {
        std::unique_lock<std::mutex> g(mu);
        entered = true;
        cv.notify_all();
        cv.wait(g, [this] { return open; });
        left = true;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [this] { return entered; });
    }
    void release() {
      std::lock_guard<std::mutex> g(mu);
      open = true;
      cv.notify_all();
    }
    ~HeldWorker() {  // the job must be done with this object before it goes
      release();
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [this] { return left; });
    }
  };

  // Opens the send side and plays the acceptor: takes the bootstrap stream after its HELLO.
  std::unique_ptr<Conn> openAndAccept() {
    std::string err;
    EXPECT_TRUE(openSendOnly(&err)) << err;
    if (!tx) return nullptr;
    EXPECT_EQ(tx->connectState(&err), 0) << err;  // the worker creates the QPs: nothing written yet
    t->worker().drain();
    EXPECT_EQ(tx->connectState(&err), 0) << err;  // HELLO and endpoint written, waiting for the answer
    EXPECT_EQ(boot.pending.size(), 1u);
    if (boot.pending.empty()) return nullptr;
    std::unique_ptr<Conn> server = std::move(boot.pending[0].server);
    toServer = boot.pending[0].in;
    boot.pending.clear();
    uint8_t hb[wire::kFrameBytes];
    EXPECT_EQ(server->read(hb, sizeof(hb), &err), (ssize_t)sizeof(hb));
    wire::Hello h;
    EXPECT_TRUE(wire::decodeHello(hb, &h, &err)) << err;
    EXPECT_EQ(h.secret, 7u);
    EXPECT_EQ(h.connId, 9u);
    EXPECT_EQ(h.path, 1);
    EXPECT_EQ(h.generation, 3u);
    EXPECT_EQ(h.nStreams, 1) << "an RDMA path has one bootstrap stream";
    return server;
  }

  // Both sides up (bounded: the worker brings the QPs up).
  void bringUp() {
    std::unique_ptr<Conn> server = openAndAccept();
    ASSERT_TRUE(server);
    rx = t->newRecvPathOn(1, 1);
    ASSERT_TRUE(rx->adopt(0, std::move(server)));
    std::string err;
    uint64_t deadline = nowUs() + 20 * 1000 * 1000;
    int a = 0, b = 0;
    while ((a != 1 || b != 1) && nowUs() < deadline) {
      b = rx->connectState(&err);
      ASSERT_GE(b, 0) << err;
      a = tx->connectState(&err);
      ASSERT_GE(a, 0) << err;
      if (a != 1 || b != 1) t->worker().drain();
    }
    ASSERT_TRUE(a == 1 && b == 1) << "bring-up did not finish";
    sq = rdma::pathQp(tx.get());
    rq = rdma::pathQp(rx.get());
    ASSERT_TRUE(sq && rq);
  }

  // While something else holds a transport thread (`blocked` names it), a new path 0 -> 1 is
  // opened into `tx` and must come all the way up: its QPs created, HELLO and endpoints sent,
  // the receiver's end (into *rxOut) and both moves to RTS, all within generous bounds
  // (microseconds of work each). Fails the test otherwise (check HasFatalFailure()).
  void expectANewPathComesUpWhile(const std::string& blocked, std::unique_ptr<RecvPath>* rxOut) {
    size_t created = ::fake::qpCreators().size();
    std::string err;
    ASSERT_TRUE(openSendOnly(&err)) << err;
    uint64_t deadline = nowUs() + 5 * 1000 * 1000;
    while (::fake::qpCreators().size() == created && nowUs() < deadline) {
      ASSERT_GE(tx->connectState(&err), 0) << err;
      std::this_thread::yield();
    }
    ASSERT_GT(::fake::qpCreators().size(), created) << "the new path's QPs wait for " << blocked;
    deadline = nowUs() + 5 * 1000 * 1000;
    ASSERT_EQ(boot.pending.size(), 1u);
    while (boot.pending[0].in->q.size() < wire::kFrameBytes && nowUs() < deadline)
      ASSERT_GE(tx->connectState(&err), 0) << err;
    ASSERT_GE(boot.pending[0].in->q.size(), (size_t)wire::kFrameBytes) << "no HELLO and endpoints from the new path";
    std::unique_ptr<Conn> server = std::move(boot.pending[0].server);
    boot.pending.clear();
    uint8_t hb[wire::kFrameBytes];
    ASSERT_EQ(server->read(hb, sizeof(hb), &err), (ssize_t)sizeof(hb));
    *rxOut = t->newRecvPathOn(1, 1);
    ASSERT_TRUE((*rxOut)->adopt(0, std::move(server)));
    int a = 0, b = 0;
    while ((a != 1 || b != 1) && nowUs() < deadline) {
      b = (*rxOut)->connectState(&err);
      ASSERT_GE(b, 0) << err;
      a = tx->connectState(&err);
      ASSERT_GE(a, 0) << err;
    }
    EXPECT_TRUE(a == 1 && b == 1) << "the new path did not come up while " << blocked;
  }

  // A single-buffer receive told to the sender (what the engine does on irecv of one buffer).
  // The path's first advertisement waits for its QPs' grant of remote write, which runs on a
  // fence thread: joined here, then the queue is sent (as the engine's next progress would).
  void advertiseOne(uint64_t seq, int32_t tag, void* buf, uint64_t size, void* mhandle) {
    AdvertEntry e{tag, buf, size, mhandle};
    rx->advertise(seq, &e, 1, false);
    t->fencer().joinAll();
    std::string err;
    rx->flushCtl(&err);
  }

  void* reg(std::vector<uint8_t>& b) { return rdmatest::regBuffer(*t, b, mrs); }

  // One RDMA WRITE of `src` straight onto the sender's QP, past the transport, into `dst` with
  // the receiver's HCA's rkey (no advertisement needed), carried to the receiver's QP.
  void writePastTheTransport(std::vector<uint8_t>& src, void* smr, std::vector<uint8_t>& dst, void* dmr) {
    ibv_sge sge{};
    sge.addr = (uintptr_t)src.data(), sge.length = (uint32_t)src.size();
    sge.lkey = ((const verbs::MrSet*)smr)->lkey((size_t)t->port(0).hcaIndex);
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 0xfeed, wr.sg_list = &sge, wr.num_sge = 1, wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)dst.data();
    wr.wr.rdma.rkey = ((const verbs::MrSet*)dmr)->rkey((size_t)t->port(1).hcaIndex);
    ASSERT_EQ(ibv_post_send(sq, &wr, &bad), 0);
    ::fake::deliver(sq, rq);
  }

  // The receive path's fence with its QP refusing the move to ERR and every destruction the
  // fence tries: the finished wait (nullptr when fenceAsync gave none or it never finished).
  std::shared_ptr<FenceWait> stuckFence() {
    ::fake::failNextModify(EIO, rq);
    ::fake::failNextDestroy(EBUSY, rq, rdma::kFenceDestroyTries);
    std::shared_ptr<FenceWait> w = rx->fenceAsync();
    if (!w) return nullptr;
    uint64_t deadline = nowUs() + 20 * 1000 * 1000;
    while (!w->done.load(std::memory_order_acquire) && nowUs() < deadline) std::this_thread::yield();
    return w->done.load() ? w : nullptr;
  }

  // Carries everything posted, both ways, and lets both sides see it.
  void wire() {
    for (int i = 0; i < 3; ++i) {
      ::fake::deliver(sq, rq);
      ::fake::deliver(rq, sq);
      std::string err;
      tx->progress(&err);
      rx->progress(sink, &err);
    }
  }

  // Posts the message's chunks, then drives the send side once as the engine's isend does;
  // returns that progress() result (*err: its cause).
  int postMessage(uint64_t seq, std::vector<uint8_t>& src, uint64_t size, void* mr, std::string* err = nullptr) {
    ChunkRef c;
    c.seq = seq, c.total = size, c.tag = (int32_t)seq + 100, c.mhandle = mr;
    uint64_t cs = tx->chunkBytes(size);
    EXPECT_GT(cs, 0u);
    uint64_t off = 0;
    do {
      c.offset = off;
      c.len = std::min(cs, size - off);
      tx->post(c, src.data() + off);
      off += c.len;
    } while (off < size);
    std::string e;
    int r = tx->progress(err ? err : &e);
    if (!err) {
      EXPECT_GE(r, 0) << e;
    }
    return r;
  }

  static constexpr uint64_t kChunk = 256;
  fake::FakeTransport boot;
  std::shared_ptr<fake::Pipe> toServer;  // the bootstrap stream's bytes toward the receiver
  std::unique_ptr<rdma::RdmaTransport> t;
  std::unique_ptr<SendPath> tx;
  std::unique_ptr<RecvPath> rx;
  ibv_qp* sq = nullptr;
  ibv_qp* rq = nullptr;
  Sink sink;
  std::vector<void*> mrs;
};

TEST_F(RdmaPathTest, MessagesLandInTheAdvertisedBufferAndTheAckComesBack) {
  bringUp();
  const std::vector<uint64_t> sizes = {0, 1, kChunk, kChunk + 1, 3 * kChunk};
  constexpr uint64_t kBuf = 4 * kChunk;
  std::vector<uint8_t> rxb(kBuf * sizes.size(), 0xA5), txb(kBuf);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  std::string err;
  for (uint64_t seq = 0; seq < sizes.size(); ++seq) {
    uint8_t* buf = rxb.data() + seq * kBuf;
    advertiseOne(seq, (int32_t)seq + 100, buf, kBuf, rmr);
    for (uint64_t i = 0; i < sizes[seq]; ++i) txb[i] = (uint8_t)(seq * 31 + i);
    postMessage(seq, txb, sizes[seq], smr);
    sink.dst = buf;
    wire();
    ASSERT_EQ(sink.got.size(), seq + 1) << "message " << seq << " not reported";
    const ChunkRef& c = sink.got.back().c;
    EXPECT_FALSE(sink.got.back().discarded);
    EXPECT_EQ(c.seq, seq);
    EXPECT_EQ(c.offset, 0u);
    EXPECT_EQ(c.len, sizes[seq]);
    EXPECT_EQ(c.total, sizes[seq]);
    EXPECT_EQ(c.tag, (int32_t)seq + 100);
    for (uint64_t i = 0; i < sizes[seq]; ++i) ASSERT_EQ(buf[i], (uint8_t)(seq * 31 + i)) << seq << " " << i;
    for (uint64_t i = sizes[seq]; i < kBuf; ++i) ASSERT_EQ(buf[i], 0xA5) << "written past the end of " << seq;
    CtlMsg ack;
    ack.type = CtlType::kAck, ack.seq = seq + 1;
    rx->sendCtl(ack);
    ASSERT_EQ(rx->flushCtl(&err), 0) << err;
    wire();
    CtlMsg m;
    ASSERT_EQ(tx->recvCtl(&m, &err), 1) << err;
    EXPECT_EQ(m.type, CtlType::kAck);
    EXPECT_EQ(m.seq, seq + 1);
  }
  EXPECT_TRUE(tx->completionNeedsReceiverAck());
}

// The flow-stall rule's silence (unackedSilenceMs) runs to each path's latest poll: a process
// stopped or descheduled after its poll while the peer's HCA acknowledged everything reads no
// silence, at either end. On the RDMA bed a receiver stopped for 12.5 s between its poll and its
// flow-stall check failed over on "no acknowledgement for 12579 ms" (the stopped-peer control).
TEST_F(RdmaPathTest, TimeStoppedAfterThePollIsNoAckSilenceAtEitherEnd) {
  bringUp();
  std::vector<uint8_t> rxb(4 * kChunk), txb(2 * kChunk, 7);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  sink.dst = rxb.data();
  wire();
  std::string err;
  // The sender: its writes posted and polled, then acknowledged by the receiver's HCA while the
  // sender's process is stopped for 30 ms.
  const uint64_t tx0 = nowUs();
  postMessage(0, txb, txb.size(), smr);
  const uint64_t tx1 = nowUs();  // the writes' post and poll lie within [tx0, tx1]
  ASSERT_TRUE(tx->peerAckedWithinMs(1000)) << "no write in flight";  // (false with nothing outstanding)
  ::fake::deliver(sq, rq);
  // The receiver: a control SEND posted and polled, then acknowledged by the sender's HCA.
  CtlMsg ack;
  ack.type = CtlType::kAck, ack.seq = 1;
  const uint64_t rx0 = nowUs();
  rx->sendCtl(ack);
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  rx->progress(sink, &err);
  const uint64_t rx1 = nowUs();
  ::fake::deliver(rq, sq);
  const uint64_t stoppedAt = nowUs();
  while (nowUs() - stoppedAt < 30000) {
  }  // both processes "stopped": no poll for 30 ms
  // (bounded by how long the post and poll took, not by the 30 ms: a busy host may stretch those)
  EXPECT_LE(tx->unackedSilenceMs(), (tx1 - tx0) / 1000) << "the sender's stopped time was read as the peer's silence";
  EXPECT_LE(rx->unackedSilenceMs(), (rx1 - rx0) / 1000) << "the receiver's stopped time was read as the peer's silence";
  EXPECT_TRUE(tx->peerAckedWithinMs((uint32_t)((tx1 - tx0) / 1000) + 1))
      << "the sender's stopped time was read as no acknowledgement";
  // A real silence (polled all along, nothing acknowledged) still grows. The first poll takes
  // the first SEND's completion (the silence counts from that poll, an acknowledgement seen),
  // so the 30 ms are counted from after it: a poll that came late on a busy host would
  // otherwise shorten what this loop polls (seen once under load: 25 ms).
  CtlMsg ack2;
  ack2.type = CtlType::kAck, ack2.seq = 1;
  rx->sendCtl(ack2);
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  rx->progress(sink, &err);
  const uint64_t postedAt = nowUs();
  while (nowUs() - postedAt < 30000) rx->progress(sink, &err);
  rx->progress(sink, &err);
  EXPECT_GE(rx->unackedSilenceMs(), 29u) << "polled for 30 ms with a SEND unacknowledged";
}

// NCCL_IB_QPS_PER_CONNECTION = 3 at the sender: the bootstrap carries three endpoints each way,
// the receiver builds as many QPs, chunks are split over them, and a message is reported only
// once each QP's share has landed.
TEST_F(RdmaPathTest, SeveralQpsPerConnectionSplitEveryMessageAndReportItWhole) {
  std::string err;
  IbConfig ib;
  ib.qpsPerConnection = 3;
  t.reset();
  t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)}, &boot,
                                            &err, ib);
  ASSERT_TRUE(t->ok()) << err;
  bringUp();
  std::vector<ibv_qp*> sqs = rdma::pathQps(tx.get()), rqs = rdma::pathQps(rx.get());
  ASSERT_EQ(sqs.size(), 3u);
  ASSERT_EQ(rqs.size(), 3u) << "the receiver builds the QP count the sender's endpoints name";
  auto carry = [&](std::vector<int> lanes) {
    for (int l : lanes) ::fake::deliver(sqs[l], rqs[l]);
    ::fake::deliver(rqs[0], sqs[0]);
    tx->progress(&err);
    rx->progress(sink, &err);
  };
  const std::vector<uint64_t> sizes = {0, 1, 3 * kChunk + 5};
  constexpr uint64_t kBuf = 4 * kChunk;
  std::vector<uint8_t> rxb(kBuf * sizes.size(), 0xA5), txb(kBuf);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  for (uint64_t seq = 0; seq < sizes.size(); ++seq) {
    uint8_t* buf = rxb.data() + seq * kBuf;
    advertiseOne(seq, (int32_t)seq + 100, buf, kBuf, rmr);
    carry({});
    for (uint64_t i = 0; i < sizes[seq]; ++i) txb[i] = (uint8_t)(seq * 29 + i);
    postMessage(seq, txb, sizes[seq], smr);
    if (sizes[seq] > kChunk) {
      // Chunks of 256, 256, 256 and 5 bytes; shares of ceil(256 / 3) rounded up to 128 bytes:
      // QP 0 and QP 1 take 128 each of a full chunk, QP 2 nothing (it still ends the message).
      size_t writes1 = 0, writes2 = 0;
      for (const auto& w : ::fake::outstanding(sqs[1])) writes1 += w.opcode == IBV_WR_RDMA_WRITE;
      for (const auto& w : ::fake::outstanding(sqs[2])) writes2 += w.opcode == IBV_WR_RDMA_WRITE;
      EXPECT_EQ(writes1, 3u);
      EXPECT_EQ(writes2, 0u);
      EXPECT_EQ(::fake::outstanding(sqs[2]).size(), 1u) << "QP 2's PART";
    }
    sink.dst = buf;
    carry({0, 1});
    EXPECT_EQ(sink.got.size(), seq) << "message " << seq << " reported before QP 2's share landed";
    carry({2});
    ASSERT_EQ(sink.got.size(), seq + 1) << "message " << seq << " not reported";
    EXPECT_EQ(sink.got.back().c.len, sizes[seq]);
    for (uint64_t i = 0; i < sizes[seq]; ++i) ASSERT_EQ(buf[i], (uint8_t)(seq * 29 + i)) << seq << " " << i;
    for (uint64_t i = sizes[seq]; i < kBuf; ++i) ASSERT_EQ(buf[i], 0xA5) << "written past the end of " << seq;
  }
  ASSERT_GE(tx->progress(&err), 0) << err;
  ASSERT_GE(rx->progress(sink, &err), 0) << err;
}

TEST_F(RdmaPathTest, TheSenderWaitsForTheAdvertisementBeforeWriting) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024, 7);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  std::string err;
  EXPECT_EQ(postMessage(0, txb, 100, smr, &err), 0) << err;
  EXPECT_TRUE(::fake::outstanding(sq).empty()) << "wrote before the receiver said where";
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  sink.dst = rxb.data();
  wire();
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(rxb[99], 7);
}

// The receive path's first advertisement needs its QPs granted remote write, an
// ibv_modify_qp that waits for the firmware on mlx5: never on the caller's (NCCL's) thread.
// While the modify is held, advertise() and progress() return, nothing is advertised and the
// sender writes nothing; once it ends the advertisement leaves and the message lands.
TEST_F(RdmaPathTest, TheFirstAdvertisementsGrantOfRemoteWriteRunsOffTheCallersThread) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024, 7);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  std::string err;
  ::fake::blockAccessModify(true);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  std::atomic<bool> returned{false};
  std::thread caller([&] {  // a thread of its own: the old code would block in the modify
    rx->advertise(0, &e, 1, false);
    Sink s2;
    std::string e2;
    for (int i = 0; i < 3; ++i) rx->progress(s2, &e2);
    returned = true;
  });
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (!returned && nowUs() < deadline) std::this_thread::yield();
  bool returnedInTime = returned;
  while (::fake::blockedAccessModifies() == 0 && nowUs() < deadline) std::this_thread::yield();
  EXPECT_TRUE(returnedInTime) << "advertise()/progress() waited for the QP's access modify";
  EXPECT_EQ(::fake::blockedAccessModifies(), 1) << "the grant is not running";
  if (returnedInTime) {
    EXPECT_EQ(postMessage(0, txb, 100, smr, &err), 0) << err;
    wire();
    EXPECT_TRUE(::fake::outstanding(sq).empty()) << "the sender wrote before the grant ended";
    EXPECT_TRUE(sink.got.empty());
  }
  ::fake::blockAccessModify(false);
  caller.join();
  t->fencer().joinAll();
  std::vector<std::thread::id> who = ::fake::accessModifiers();
  ASSERT_EQ(who.size(), 1u);
  EXPECT_NE(who[0], std::this_thread::get_id());
  EXPECT_NE(who[0], caller.get_id());
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(rq, &a, IBV_QP_ACCESS_FLAGS, &ia), 0);
  EXPECT_TRUE(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
  sink.dst = rxb.data();
  for (int i = 0; i < 3 && sink.got.empty(); ++i) {
    ASSERT_EQ(rx->flushCtl(&err), 0) << err;
    if (!returnedInTime) postMessage(0, txb, 100, smr, &err);
    wire();
  }
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(rxb[99], 7);
}

// A RESUME on a standby starts the grant at once (beside the old path's fence that its answer
// waits for), before the engine asks for any advertisement.
TEST_F(RdmaPathTest, ASendersResumeStartsTheStandbysGrantBeforeItsFirstAdvertisement) {
  bringUp();
  CtlMsg m;
  m.type = CtlType::kResume, m.seq = 0;
  tx->sendCtl(m);
  std::string err;
  ASSERT_GE(tx->progress(&err), 0) << err;
  CtlMsg got;
  int r = 0;
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; r == 0 && nowUs() < deadline;) {
    ::fake::deliver(sq, rq);
    r = rx->recvCtl(&got, &err);
  }
  ASSERT_EQ(r, 1) << err;
  EXPECT_EQ(got.type, CtlType::kResume);
  t->fencer().joinAll();
  ASSERT_EQ(::fake::accessModifiers().size(), 1u) << "no grant started by the RESUME";
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(rq, &a, IBV_QP_ACCESS_FLAGS, &ia), 0);
  EXPECT_TRUE(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
}

// A grant that fails breaks the path with the modify named, on the path's own thread, and
// nothing is advertised.
TEST_F(RdmaPathTest, AFailedGrantOfRemoteWriteBreaksThePathWithItsCause) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  ::fake::failNextModify(EINVAL, rq);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  t->fencer().joinAll();
  std::string err;
  EXPECT_EQ(rx->progress(sink, &err), -1);
  EXPECT_NE(err.find("ibv_modify_qp (remote write access"), std::string::npos) << err;
  ::fake::deliver(rq, sq);
  std::vector<uint8_t> txb(64, 1);
  void* smr = reg(txb);
  postMessage(0, txb, txb.size(), smr);
  EXPECT_TRUE(::fake::outstanding(sq).empty()) << "the sender wrote: an advertisement left";
}

// Review (2026-12-06): a RESUME's grant still running holds the standby's advertisements, not
// the RESUME_ACK queued before them; a control message queued after a held advertisement
// waits behind it (order kept), and everything leaves once the grant ends.
TEST_F(RdmaPathTest, ReviewTheResumeAckLeavesWhileTheGrantRunsAndLaterControlWaitsBehindTheAdvertisement) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024, 9);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  std::string err;
  ::fake::blockAccessModify(true);
  CtlMsg m;
  m.type = CtlType::kResume, m.seq = 0;
  tx->sendCtl(m);
  ASSERT_GE(tx->progress(&err), 0) << err;
  CtlMsg got;
  int r = 0;
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; r == 0 && nowUs() < deadline;) {
    ::fake::deliver(sq, rq);
    r = rx->recvCtl(&got, &err);
  }
  ASSERT_EQ(r, 1) << err;
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedAccessModifies() == 0 && nowUs() < deadline;)
    std::this_thread::yield();
  ASSERT_EQ(::fake::blockedAccessModifies(), 1) << "the RESUME started no grant";
  CtlMsg ra;
  ra.type = CtlType::kResumeAck, ra.seq = 0;
  rx->sendCtl(ra);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  CtlMsg ack;
  ack.type = CtlType::kAck, ack.seq = 0;
  rx->sendCtl(ack);
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  ::fake::deliver(rq, sq);
  ASSERT_EQ(tx->recvCtl(&got, &err), 1) << "the RESUME_ACK was held by the grant: " << err;
  EXPECT_EQ(got.type, CtlType::kResumeAck);
  EXPECT_EQ(tx->recvCtl(&got, &err), 0) << "a control message overtook the held advertisement";
  postMessage(0, txb, 100, smr);
  EXPECT_TRUE(::fake::outstanding(sq).empty()) << "the sender wrote before the grant ended";
  ::fake::blockAccessModify(false);
  t->fencer().joinAll();
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  sink.dst = rxb.data();
  for (int i = 0; i < 3 && sink.got.empty(); ++i) {
    wire();
    postMessage(0, txb, 100, smr);
  }
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(rxb[99], 9);
  ASSERT_EQ(tx->recvCtl(&got, &err), 1) << err;
  EXPECT_EQ(got.type, CtlType::kAck);
}

// Review (2026-12-06): the fence of a path whose grant is still running waits for it (the
// grant touches the QPs), stays not done meanwhile, and is done (safe) once it ended.
TEST_F(RdmaPathTest, ReviewAFenceOfAPathWhoseGrantIsRunningWaitsForItThenIsDone) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  ::fake::blockAccessModify(true);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedAccessModifies() == 0 && nowUs() < deadline;)
    std::this_thread::yield();
  ASSERT_EQ(::fake::blockedAccessModifies(), 1);
  std::shared_ptr<FenceWait> w = rx->fenceAsync();
  ASSERT_TRUE(w);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(w->done.load()) << "the fence ended before the grant it waits for";
  EXPECT_EQ(::fake::state(rq), IBV_QPS_RTS) << "the fence moved the QP while its grant ran";
  ::fake::blockAccessModify(false);
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; !w->done.load() && nowUs() < deadline;) std::this_thread::yield();
  ASSERT_TRUE(w->done.load()) << "the fence never ended after its grant";
  EXPECT_EQ(w->unsafe, "");
  EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR);
  // The wait for the grant is told apart from the fence itself (journal: fence_grant_wait_us).
  uint64_t start = w->startUs.load(), grantEnd = w->grantEndUs.load(), end = w->endUs.load();
  EXPECT_NE(grantEnd, 0u) << "the fence's wait for the running grant was not recorded";
  EXPECT_LE(start, grantEnd);
  EXPECT_LE(grantEnd, end);
  rx.reset();
  t->fencer().joinAll();
  t->worker().drain();
}

// Review (2026-12-06): a path destroyed (no fence) while its grant is blocked in the modify:
// the grant job keeps the verbs path alive, ends, and releases it; nothing touches freed memory
// (run under RAILOVER_SANITIZE / TSan to see it).
TEST_F(RdmaPathTest, ReviewAPathDestroyedWhileItsGrantIsBlockedIsReleasedAfterIt) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  ::fake::blockAccessModify(true);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedAccessModifies() == 0 && nowUs() < deadline;)
    std::this_thread::yield();
  ASSERT_EQ(::fake::blockedAccessModifies(), 1);
  rx.reset();
  t->worker().drain();
  ::fake::blockAccessModify(false);
  t->fencer().joinAll();
  t->worker().drain();
  EXPECT_EQ(::fake::accessModifiers().size(), 1u);
}

// Review (2026-12-06): the comm's close (fence(), on NCCL's thread) while the grant is blocked
// waits for it and then fences; no deadlock with the fence thread that runs the grant. The
// path says it waited, and how long (lastFenceGrantWait: the engine journals it with a slow
// close, transport_slow's fence_grant_wait_us), a part of fence()'s own time.
TEST_F(RdmaPathTest, ReviewTheBlockingFenceWaitsForARunningGrant) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  ::fake::blockAccessModify(true);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedAccessModifies() == 0 && nowUs() < deadline;)
    std::this_thread::yield();
  ASSERT_EQ(::fake::blockedAccessModifies(), 1) << "the grant never began";
  std::atomic<bool> fenced{false};
  EXPECT_FALSE(rx->lastFenceGrantWait().waited) << "no fence ran yet";
  uint64_t fenceUs = 0;  // how long fence() held the closer
  std::thread closer([&] {
    uint64_t t0 = nowUs();
    rx->fence();
    fenceUs = nowUs() - t0;
    fenced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(fenced.load()) << "fence() returned while the grant ran";
  ::fake::blockAccessModify(false);
  closer.join();
  EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR);
  RecvPath::FenceGrantWait gw = rx->lastFenceGrantWait();
  EXPECT_TRUE(gw.waited) << "the fence's wait for the running grant was not recorded";
  EXPECT_LE(gw.us, fenceUs) << "the grant wait is a part of the fence's time";
}

// A grant that ended long before the comm's close (the usual case: it ran at the path's first
// advertisement) is nothing the blocking fence waits for: lastFenceGrantWait says it waited for
// none, so the close's transport_slow carries fence_grant_wait_us 0 and its WARN no "of which
// 0 ms waiting for the path's grant" for a slow close that had nothing to do with a grant.
// (Review.)
TEST_F(RdmaPathTest, TheBlockingFenceOfAPathWhoseGrantEndedLongAgoWaitedForNone) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  t->fencer().joinAll();  // the grant ran and ended
  ASSERT_EQ(::fake::accessModifiers().size(), 1u) << "the advertisement started no grant";
  rx->fence();
  EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR);
  RecvPath::FenceGrantWait gw = rx->lastFenceGrantWait();
  EXPECT_FALSE(gw.waited) << "the fence says it waited for a grant that had ended (" << gw.us << " us)";
  EXPECT_EQ(gw.us, 0u);
}

// A fence of a path whose grant is queued on the fence runner but has not begun (every fence
// thread busy, or none woken yet) cancels it (WriteGrant::cancel): fence() on the caller's
// thread returns without waiting for it, the QPs go to ERR, and the grant never runs (the QPs
// never accept RDMA writes). FenceRunner::hold() keeps the grant's job queued and not begun for
// as long as the test needs; without the cancel, fence() would wait for a grant that cannot
// begin until the hold is released (seen here as a fence that has not returned in 20 s, then
// a modify that ran).
TEST_F(RdmaPathTest, AFenceCancelsAGrantThatHasNotBegunAndDoesNotWaitForIt) {
  std::vector<uint8_t> rxb(1024);
  size_t modifiesBefore = 0;
  ASSERT_NO_FATAL_FAILURE(queueAGrantHeld(rxb, &modifiesBefore));
  std::mutex mu;
  std::condition_variable cv;
  bool fenced = false;  // under mu
  std::thread closer([&] {
    rx->fence();
    std::lock_guard<std::mutex> g(mu);
    fenced = true;
    cv.notify_all();
  });
  bool returned;
  {
    std::unique_lock<std::mutex> g(mu);
    returned = cv.wait_for(g, std::chrono::seconds(20), [&] { return fenced; });
  }
  EXPECT_TRUE(returned) << "fence() waited for a grant that had not begun";
  EXPECT_FALSE(rx->lastFenceGrantWait().waited) << "the fence says it waited for the grant it cancelled";
  EXPECT_EQ(rx->lastFenceGrantWait().us, 0u);
  EXPECT_EQ(t->fencer().queued(), 1u) << "the grant's job was taken while the runner was held";
  t->fencer().hold(false);
  closer.join();
  t->fencer().joinAll();  // the cancelled grant's job has run (and done nothing)
  t->worker().drain();
  EXPECT_EQ(t->fencer().queued(), 0u);
  EXPECT_EQ(::fake::accessModifiers().size(), modifiesBefore) << "the cancelled grant modified the QPs' access";
  expectFencedWithoutRemoteWrite();
}

// The same through fenceAsync (a failover's fence): the grant not begun is cancelled when the
// fence is asked for, so the fence job, queued behind it, waits for nothing, and once the
// runner is released and drained the modify never ran and the fence is done, safe, the QP in
// ERR. (Without the cancel the grant's job begins as soon as the hold is released and its
// modify runs.)
TEST_F(RdmaPathTest, AnAsyncFenceCancelsAGrantThatHasNotBegun) {
  std::vector<uint8_t> rxb(1024);
  size_t modifiesBefore = 0;
  ASSERT_NO_FATAL_FAILURE(queueAGrantHeld(rxb, &modifiesBefore));
  std::shared_ptr<FenceWait> w = rx->fenceAsync();
  ASSERT_TRUE(w);
  EXPECT_EQ(t->fencer().queued(), 2u) << "the grant and the fence, neither begun";
  EXPECT_FALSE(w->done.load());
  t->fencer().hold(false);
  t->fencer().joinAll();
  t->worker().drain();
  ASSERT_TRUE(w->done.load()) << "the fence's job has run: joinAll() returned";
  EXPECT_EQ(w->unsafe, "");
  EXPECT_EQ(w->grantEndUs.load(), 0u) << "the fence waited for the grant it cancelled";
  EXPECT_EQ(::fake::accessModifiers().size(), modifiesBefore) << "the cancelled grant modified the QPs' access";
  expectFencedWithoutRemoteWrite();
}

// Review (2026-12-06): a grant that fails because the path's QP went to ERR meanwhile (a
// control SEND of the path failed: retry exceeded) must not hide that cause. A QP in ERR
// refuses an access-only modify (EINVAL on mlx5), and flush() ran before the path's own
// progress reported its completion error, so the path failed naming "ibv_modify_qp (remote
// write access ...)": a misleading cause for the engine's log and journal.
TEST_F(RdmaPathTest, ReviewAGrantRefusedByAQpAlreadyInErrorDoesNotHideTheQpsOwnCause) {
  bringUp();
  std::vector<uint8_t> rxb(1024);
  void* rmr = reg(rxb);
  std::string err;
  CtlMsg ack;
  ack.type = CtlType::kAck, ack.seq = 0;
  rx->sendCtl(ack);
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  ASSERT_FALSE(::fake::outstanding(rq).empty()) << "the ACK was not posted";
  ::fake::blockAccessModify(true);
  AdvertEntry e{100, rxb.data(), rxb.size(), rmr};
  rx->advertise(0, &e, 1, false);
  for (uint64_t deadline = nowUs() + 20 * 1000 * 1000; ::fake::blockedAccessModifies() == 0 && nowUs() < deadline;)
    std::this_thread::yield();
  ASSERT_EQ(::fake::blockedAccessModifies(), 1);
  ::fake::fail(rq, IBV_WC_RETRY_EXC_ERR);  // the ACK's SEND: the QP moves to ERR
  ::fake::blockAccessModify(false);
  t->fencer().joinAll();
  EXPECT_EQ(rx->progress(sink, &err), -1);
  EXPECT_EQ(err.find("ibv_modify_qp"), std::string::npos) << "the path's own cause is hidden: " << err;
  EXPECT_NE(err.find("completion"), std::string::npos) << err;
}

TEST_F(RdmaPathTest, AnUnregisteredSendBufferBreaksThePathWithItsCause) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024);
  void* rmr = reg(rxb);
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  wire();
  std::string err;
  EXPECT_EQ(postMessage(0, txb, 100, nullptr, &err), -1);
  EXPECT_NE(err.find("not registered"), std::string::npos) << err;
}

TEST_F(RdmaPathTest, ASendBufferOutsideItsRegistrationBreaksThePath) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024), other(64);
  void* rmr = reg(rxb);
  void* omr = reg(other);
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  wire();
  std::string err;
  EXPECT_EQ(postMessage(0, txb, 100, omr, &err), -1);  // registered, but another buffer
  EXPECT_NE(err.find("outside its registration"), std::string::npos) << err;
}

TEST_F(RdmaPathTest, AnArrivalTheEngineHoldsIsReportedOnceItIsPlaced) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024, 3);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  wire();
  postMessage(0, txb, 10, smr);
  sink.dst = rxb.data();
  sink.holds = 2;
  wire();  // three passes: two holds, then placed
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(sink.placed, 1);
  std::string err;
  EXPECT_EQ(rx->progress(sink, &err), 0) << err;
  EXPECT_EQ(sink.got.size(), 1u) << "reported twice";
}

TEST_F(RdmaPathTest, AnArrivalInABufferTheEngineDidNotChooseIsAProtocolError) {
  bringUp();
  std::vector<uint8_t> rxb(1024), txb(1024);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  advertiseOne(0, 100, rxb.data(), 512, rmr);
  wire();
  postMessage(0, txb, 10, smr);
  sink.dst = rxb.data() + 512;  // the engine's buffer for seq 0 is elsewhere
  ::fake::deliver(sq, rq);
  std::string err;
  EXPECT_EQ(rx->progress(sink, &err), -1);
  EXPECT_NE(err.find("did not choose"), std::string::npos) << err;
}

TEST_F(RdmaPathTest, ARefusalDuringBringUpIsANoticeNotAFault) {
  std::unique_ptr<Conn> server = openAndAccept();
  ASSERT_TRUE(server);
  wire::Frame f;
  f.type = wire::kNack;
  f.seq = wire::kNackUnknownComm;
  uint8_t b[wire::kFrameBytes];
  wire::encodeFrame(f, b);
  std::string err;
  ASSERT_TRUE(writeAll(*server, b, sizeof(b), &err)) << err;
  EXPECT_EQ(tx->connectState(&err), 0) << err;
  CtlMsg m;
  ASSERT_EQ(tx->recvNotice(true, &m, &err), 1) << err;
  EXPECT_EQ(m.type, CtlType::kNack);
  EXPECT_EQ(m.seq, kNackReasonUnknownComm);
}

TEST_F(RdmaPathTest, APeerThatIsNotAnRdmaPeerIsNamed) {
  std::unique_ptr<Conn> server = openAndAccept();
  ASSERT_TRUE(server);
  std::vector<uint8_t> junk(verbs::QpEndpoint::kWireBytes, 0x11);  // e.g. a TCP transport's frames
  std::string err;
  ASSERT_TRUE(writeAll(*server, junk.data(), junk.size(), &err)) << err;
  EXPECT_EQ(tx->connectState(&err), -1);
  EXPECT_NE(err.find("RAILOVER_TRANSPORT"), std::string::npos) << err;
  // and the receiver side, given a TCP sender's stream (32-byte frames, no endpoint)
  rx = t->newRecvPathOn(1, 2);
  std::unique_ptr<Conn> s2 = openAndAccept();
  ASSERT_TRUE(s2);
  rx->adopt(0, std::move(s2));
  EXPECT_EQ(rx->connectState(&err), -1);
  EXPECT_NE(err.find("RAILOVER_TRANSPORT"), std::string::npos) << err;
}

// A railover peer whose endpoint has a field out of range (here a 25-bit PSN) is refused with
// the field named, not mistaken for a peer on another transport.
TEST_F(RdmaPathTest, AMalformedEndpointIsNamedAsSuch) {
  std::unique_ptr<Conn> server = openAndAccept();
  ASSERT_TRUE(server);
  verbs::QpEndpoint ep;
  ep.qpn = 0x99;
  ep.psn = 0x10;
  ep.gid[10] = ep.gid[11] = 0xff;
  ep.gid[15] = 7;
  uint8_t w[verbs::QpEndpoint::kWireBytes];
  ep.pack(w);
  w[12] = 0x01;  // PSN bit 24
  std::string err;
  ASSERT_TRUE(writeAll(*server, w, sizeof w, &err)) << err;
  EXPECT_EQ(tx->connectState(&err), -1);
  EXPECT_NE(err.find("malformed"), std::string::npos) << err;
  EXPECT_NE(err.find("PSN"), std::string::npos) << err;
  EXPECT_EQ(err.find("RAILOVER_TRANSPORT"), std::string::npos) << err;
}

TEST_F(RdmaPathTest, APortErrorOnThePathsPortBreaksItAnotherPortsDoesNot) {
  bringUp();
  std::string err;
  ::fake::asyncEvent(t->port(0).hca->ctx(), IBV_EVENT_PORT_ERR, 2);  // the sender HCA's other port
  ::fake::asyncEvent(t->port(1).hca->ctx(), IBV_EVENT_PORT_ERR, 2);  // the receiver HCA's other port
  EXPECT_GE(tx->progress(&err), 0) << err;
  EXPECT_GE(rx->progress(sink, &err), 0) << err;
  ::fake::asyncEvent(t->port(1).hca->ctx(), IBV_EVENT_PORT_ERR, 1);  // the receiver's own port
  EXPECT_EQ(rx->progress(sink, &err), -1);
  EXPECT_NE(err.find("port error"), std::string::npos) << err;
  EXPECT_NE(err.find("fake1 port 1"), std::string::npos) << err;
  EXPECT_GE(tx->progress(&err), 0) << "the sender's port is fine: " << err;
}

// The receiver's fence never blocks the caller (NCCL's progress thread): with the QP's move to
// ERR blocked, as rxe's was seen to block for ~3 s after a local link loss, fenceAsync returns
// with a pending wait, and the wait is done only once the QP is in ERR and its posted
// receives are flushed.
TEST_F(RdmaPathTest, TheReceiversFenceRunsOffTheCallersThreadAndSaysWhenItIsDone) {
  bringUp();
  std::vector<uint8_t> rxb(1024, 0);
  void* rmr = reg(rxb);
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  std::string err;
  rx->progress(sink, &err);
  ASSERT_GT(::fake::postedRecvs(rq), 0u);
  ::fake::blockErrTransitions(true);
  std::shared_ptr<FenceWait> w = rx->fenceAsync();
  ASSERT_TRUE(w) << "a fence that can block must not finish on the caller's thread";
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (::fake::blockedErrTransitions() == 0 && nowUs() < deadline) std::this_thread::yield();
  ASSERT_EQ(::fake::blockedErrTransitions(), 1) << "the fence thread never reached the QP's move to ERR";
  EXPECT_FALSE(w->done.load()) << "done while the QP's move to ERR is still blocked";
  EXPECT_EQ(rx->progress(sink, &err), 0) << "a fenced path moves nothing: " << err;
  ::fake::blockErrTransitions(false);
  while (!w->done.load() && nowUs() < deadline) std::this_thread::yield();
  ASSERT_TRUE(w->done.load()) << "the fence never finished";
  EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR);
  EXPECT_EQ(::fake::postedRecvs(rq), 0u) << "the posted receives were not flushed";
  EXPECT_EQ(rx->fenceAsync(), nullptr) << "a second fence has nothing left to do";
}

// A QP that refuses the move to ERR may still take the old path's writes, so its fence is not
// done until the path's QPs are destroyed: the engine answers the sender's RESUME only after
// that (found by an audit: the fence was marked done with the QP still live).
TEST_F(RdmaPathTest, AFenceWhoseQpRefusesErrIsDoneOnlyOnceTheQpIsDestroyed) {
  bringUp();
  ibv_qp* q = rq;
  ASSERT_TRUE(::fake::qpAlive(q));
  ::fake::failNextModify(EIO, q);
  std::shared_ptr<FenceWait> w = rx->fenceAsync();
  ASSERT_TRUE(w);
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (!w->done.load(std::memory_order_acquire) && nowUs() < deadline) std::this_thread::yield();
  ASSERT_TRUE(w->done.load()) << "the fence never finished";
  EXPECT_FALSE(::fake::qpAlive(q)) << "done with the QP that refused ERR still live";
  EXPECT_EQ(w->unsafe, "") << "its destruction worked: the old path is stopped";
  rx.reset();
  t->worker().drain();
}

// The same, but the QP refuses destruction too: the fence says the old path could not be
// stopped (FenceWait::unsafe), so the engine fails the comm instead of answering RESUME. The
// path advertised a buffer, so its QP takes RDMA WRITEs: a late one could land.
TEST_F(RdmaPathTest, AFenceWhoseQpRefusesErrAndDestructionSaysItIsUnsafe) {
  bringUp();
  std::vector<uint8_t> rxb(1024, 0);
  advertiseOne(0, 100, rxb.data(), rxb.size(), reg(rxb));
  std::shared_ptr<FenceWait> w = stuckFence();
  ASSERT_TRUE(w) << "no fence, or it never finished";
  EXPECT_NE(w->unsafe.find("could not be stopped"), std::string::npos) << w->unsafe;
  EXPECT_NE(w->unsafe.find("ibv_destroy_qp"), std::string::npos) << w->unsafe;
  rx.reset();
  t->worker().drain();
}

// A receive path's QPs take RDMA WRITEs only from its first advertisement on: before it, a WRITE
// with a valid rkey of a registered buffer (the sender holds the keys of every HCA's
// registration through the paths it did write on) is refused by the QP and writes nothing.
// So a path that never advertised (a standby that carried only control messages) cannot
// write late, and its fence is safe even when its QP can be neither moved to ERR nor
// destroyed: no FenceWait::unsafe, and the engine resumes instead of failing the comm.
TEST_F(RdmaPathTest, APathThatNeverAdvertisedTakesNoWriteAndItsStuckFenceIsSafe) {
  bringUp();
  std::vector<uint8_t> rxb(1024, 0), txb(64, 0x5a);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  writePastTheTransport(txb, smr, rxb, rmr);  // the right rkey (the receiver's HCA), no advertisement yet
  for (uint8_t b : rxb) ASSERT_EQ(b, 0) << "a WRITE landed through a QP that never advertised";
  EXPECT_EQ(::fake::state(sq), IBV_QPS_ERR) << "the WRITE was not refused (RC NAKs it: invalid request)";
  EXPECT_EQ(::fake::state(rq), IBV_QPS_ERR) << "the refusing QP stays in RTS (rxe moves it to ERR)";
  std::shared_ptr<FenceWait> w = stuckFence();
  ASSERT_TRUE(w) << "no fence, or it never finished";
  EXPECT_EQ(w->unsafe, "") << "a path whose QP never took WRITEs was called unsafe";
  rx.reset();
  t->worker().drain();
}

// The same stuck fence on an HCA that does not honour the QP's remote access flags (it takes
// WRITEs whatever they say, and reports IBV_ACCESS_REMOTE_WRITE on when read back, as irdma
// does): the path never advertised, yet a WRITE lands, so the fence is unsafe and says why.
TEST_F(RdmaPathTest, AStuckFenceIsUnsafeWhereTheHcaReportsItsQpTakesWritesAnyway) {
  ::fake::setQpAccess("fake1", ::fake::QpAccess::kIgnoredReported);
  bringUp();
  std::vector<uint8_t> rxb(1024, 0), txb(64, 0x5a);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  writePastTheTransport(txb, smr, rxb, rmr);
  EXPECT_EQ(rxb[0], 0x5a) << "this HCA was to take the WRITE (the fake's model of a provider ignoring the flag)";
  std::shared_ptr<FenceWait> w = stuckFence();
  ASSERT_TRUE(w) << "no fence, or it never finished";
  EXPECT_NE(w->unsafe.find("could not be stopped"), std::string::npos) << w->unsafe;
  EXPECT_NE(w->unsafe.find("fake1 reports IBV_ACCESS_REMOTE_WRITE"), std::string::npos) << w->unsafe;
  rx.reset();
  t->worker().drain();
}

// Where the read-back itself fails, nothing confirms the responder refuses WRITEs: a stuck
// fence of a path that never advertised is unsafe, naming the failed query.
TEST_F(RdmaPathTest, AStuckFenceIsUnsafeWhereTheQpsAccessCannotBeReadBack) {
  ::fake::setQpAccess("fake1", ::fake::QpAccess::kQueryFails);
  bringUp();
  std::shared_ptr<FenceWait> w = stuckFence();
  ASSERT_TRUE(w) << "no fence, or it never finished";
  EXPECT_NE(w->unsafe.find("query QP access flags on fake1"), std::string::npos) << w->unsafe;
  rx.reset();
  t->worker().drain();
}

// What the first receive path of an HCA read back is logged once: INFO where the HCA confirmed
// IBV_ACCESS_REMOTE_WRITE off, WARN (naming the HCA and the finding) where it did not.
TEST_F(RdmaPathTest, TheQpAccessReadBackIsLoggedOncePerHca) {
  testlog::clear();
  railover::setLogger(testlog::capture);
  bringUp();
  std::vector<std::string> enforced = testlog::linesWith("fake1: QP remote access read back");
  ASSERT_FALSE(enforced.empty()) << testlog::all();
  EXPECT_EQ(enforced[0].rfind("INFO ", 0), 0u) << testlog::all();
  // A second transport whose receiving HCA ignores the flags: one WARN naming it, however many
  // paths connect there.
  tx.reset();
  rx.reset();
  t->worker().drain();
  t.reset();
  ::fake::reset();
  ::fake::setQpAccess("fake1", ::fake::QpAccess::kIgnoredReported);
  std::string err;
  t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)}, &boot,
                                            &err);
  ASSERT_TRUE(t->ok()) << err;
  bringUp();
  tx.reset();
  rx.reset();
  t->worker().drain();
  bringUp();
  railover::setLogger(nullptr);
  std::vector<std::string> warned = testlog::linesWith("could not be confirmed");
  ASSERT_EQ(warned.size(), 1u) << testlog::all();
  EXPECT_EQ(warned[0].rfind("WARN railover: fake1: ", 0), 0u) << testlog::all();
  EXPECT_NE(warned[0].find("fake1 reports IBV_ACCESS_REMOTE_WRITE"), std::string::npos) << warned[0];
}

// A refusal that passes (EBUSY once) is tried again on the fence thread: the QP is gone before
// the fence is done, and the fence is safe (found by a review: one refusal made the verdict
// although the destructor's retry then freed the QP, failing a comm that could have resumed).
TEST_F(RdmaPathTest, AFenceWhoseQpDestructionIsRefusedOnceTriesAgainAndIsSafe) {
  bringUp();
  ibv_qp* q = rq;
  ::fake::failNextModify(EIO, q);
  ::fake::failNextDestroy(EBUSY, q, 1);
  std::shared_ptr<FenceWait> w = rx->fenceAsync();
  ASSERT_TRUE(w);
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (!w->done.load(std::memory_order_acquire) && nowUs() < deadline) std::this_thread::yield();
  ASSERT_TRUE(w->done.load()) << "the fence never finished";
  EXPECT_FALSE(::fake::qpAlive(q));
  EXPECT_EQ(w->unsafe, "") << "a QP destroyed at the second try is stopped";
  rx.reset();
  t->worker().drain();
}

// ---- handing verbs objects to the worker (handOff)

// A worker that wins the race: it runs the job inside post(), before post() returns. The
// object must still be released inside the job, not by the caller once post() returned (the
// caller is NCCL's thread, and releasing a path destroys its QPs: ~3 s on rxe after a link
// loss).
TEST(HandOff, TheObjectIsReleasedByTheJobEvenWhenTheJobRunsBeforePostReturns) {
  struct Eager {
    bool inJob = false;
    void post(std::function<void()> job) {
      inJob = true;
      job();
      inJob = false;
    }
  } w;
  struct Probe {
    std::function<void()> onRelease;
    ~Probe() { onRelease(); }
  };
  bool released = false, releasedInJob = false;
  auto sh = std::make_shared<Probe>();
  sh->onRelease = [&] { released = true, releasedInJob = w.inJob; };
  rdma::handOff(w, sh);
  EXPECT_FALSE(sh) << "the caller keeps no reference";
  EXPECT_TRUE(released);
  EXPECT_TRUE(releasedInJob) << "released by the caller after post() returned, not by the job";
}

// With the real worker, under many hand-offs, every release happens on the worker's thread.
TEST(HandOff, EveryReleaseRunsOnTheWorkerThread) {
  rdma::Worker w;
  std::mutex mu;
  std::vector<std::thread::id> where;
  struct Probe {
    std::function<void()> onRelease;
    ~Probe() { onRelease(); }
  };
  for (int i = 0; i < 500; ++i) {
    auto sh = std::make_shared<Probe>();
    sh->onRelease = [&] {
      std::lock_guard<std::mutex> g(mu);
      where.push_back(std::this_thread::get_id());
    };
    rdma::handOff(w, sh);
  }
  w.drain();
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(where.size(), 500u);
  for (std::thread::id id : where) EXPECT_NE(id, std::this_thread::get_id()) << "released on the caller's thread";
}

// Opening a send path (the engine does it on NCCL's thread when it retries a failed path)
// creates no QP on the caller's thread: the worker creates the CQ and QPs (3.3 ms median, up to
// 69 ms on the TCG bed on the caller's thread before), and the path comes up as before.
TEST_F(RdmaPathTest, OpeningASendPathCreatesItsQpsOnTheWorkerNotTheCaller) {
  size_t before = ::fake::qpCreators().size();
  bringUp();
  std::vector<std::thread::id> creators = ::fake::qpCreators();
  ASSERT_GE(creators.size(), before + 2) << "the send and the receive QP";
  for (size_t i = before; i < creators.size(); ++i)
    EXPECT_NE(creators[i], std::this_thread::get_id()) << "QP " << i << " was created on the caller's thread";
}

// A send path whose QPs cannot be created reports why from connectState(), once the worker
// tried, naming the HCA; nothing is written to the bootstrap stream.
TEST_F(RdmaPathTest, ASendPathWhoseQpsCannotBeCreatedFailsFromConnectState) {
  ::fake::deviceFatal("fake0");  // the HCA behind NIC 0 refuses new objects (EIO)
  std::string err;
  ASSERT_TRUE(openSendOnly(&err)) << err;
  t->worker().drain();  // the creation job ran (and failed)
  EXPECT_EQ(tx->connectState(&err), -1);
  EXPECT_NE(err.find("fake0"), std::string::npos) << err;
  ASSERT_EQ(boot.pending.size(), 1u);
  uint8_t b[1];
  std::string e2;
  EXPECT_LE(boot.pending[0].server->read(b, 1, &e2), 0) << "a HELLO went out for a path without QPs";
  boot.pending.clear();
}

// A send path's fence whose move to ERR blocks (rxe: ~3 s after a local link loss, found on
// the RDMA bed) holds no other path's bring-up: while it blocks, a new path's QPs are created
// and the path comes up. When the fence ran on the transport's single worker, every bring-up
// of every comm (a reconnect, a new comm's connect) waited behind it, and a connect that needs
// two worker jobs (create, then RTS) could wait for two such blocks: longer than the 3 s
// connect timeout.
TEST_F(RdmaPathTest, ASendFenceBlockedInItsMoveToErrHoldsNoOtherPathsBringUp) {
  bringUp();
  struct Unblock {
    ~Unblock() { ::fake::blockErrTransitions(false); }
  } unblock;  // before TearDown drains the worker, whatever fails below
  ::fake::blockErrTransitions(true);
  tx->fence();  // the sender's fence (a failover): its QP's move to ERR now blocks
  uint64_t deadline = nowUs() + 10 * 1000 * 1000;
  while (::fake::blockedErrTransitions() == 0 && nowUs() < deadline) std::this_thread::yield();
  ASSERT_EQ(::fake::blockedErrTransitions(), 1) << "the fence's move to ERR did not start";
  std::unique_ptr<SendPath> fenced = std::move(tx);  // kept: its fence is still running
  std::unique_ptr<RecvPath> rx2;
  expectANewPathComesUpWhile("another path's fence blocks in its move to ERR", &rx2);
  if (HasFatalFailure()) return;
  EXPECT_EQ(::fake::blockedErrTransitions(), 1) << "the fence was released before the check";
  ::fake::blockErrTransitions(false);
  t->sendFencer().drain();
  t->worker().drain();
  EXPECT_EQ(::fake::state(sq), IBV_QPS_ERR) << "the blocked fence did not finish its move to ERR";
  rx2.reset();
}

// A QP's destruction blocks ~3 s on rxe after a local link loss (it waits for packets queued
// on the dead link). Released paths are destroyed on the transport's release thread, not on
// the worker: with them on the worker, a release already running held every bring-up job
// behind it (bring-ups only go before releases still queued), so a reconnect or a new comm's
// connect (two worker jobs, a 3 s timeout) could time out after a cable pull.
TEST_F(RdmaPathTest, AQpDestructionBlockedAfterALinkLossHoldsNoOtherPathsBringUp) {
  bringUp();
  struct Unblock {
    ~Unblock() { ::fake::blockQpDestroy(false); }
  } unblock;  // before TearDown and the transport's destructor drain the releases
  ::fake::blockQpDestroy(true);
  tx.reset();  // both ends of the path released (a failed path replaced by a reconnect)
  rx.reset();
  uint64_t deadline = nowUs() + 10 * 1000 * 1000;
  while (::fake::blockedQpDestroys() == 0 && nowUs() < deadline) std::this_thread::yield();
  ASSERT_EQ(::fake::blockedQpDestroys(), 1) << "the released path's QP destruction did not start";
  expectANewPathComesUpWhile("another path's QP destruction blocks", &rx);
  if (HasFatalFailure()) return;
  EXPECT_EQ(::fake::blockedQpDestroys(), 1) << "the destruction was released before the check";
  size_t destroyed = ::fake::qpDestroyers().size();
  ::fake::blockQpDestroy(false);
  t->worker().drain();
  t->releaser().drain();
  // The old path's two QPs (and CQs) are gone now, destroyed on the release thread.
  EXPECT_GE(::fake::qpDestroyers().size(), destroyed + 2) << "the blocked destruction did not finish";
  for (size_t i = destroyed; i < ::fake::qpDestroyers().size(); ++i)
    EXPECT_NE(::fake::qpDestroyers()[i], std::this_thread::get_id()) << "a QP destroyed on the caller's thread";
}

// Bring-up jobs (creating a path's QPs, moving them to RTS) run before the worker's other jobs
// (a QP's release can take ~3 s on rxe after a link loss), so a connect is not timed out behind
// a NIC's worth of releases; a path's release still runs after its own bring-up.
TEST(RdmaWorker, BringUpJobsRunBeforeReleasesQueuedEarlier) {
  rdma::Worker w;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, entered = false;
  std::vector<std::string> order;
  auto note = [&](const char* what) {
    std::lock_guard<std::mutex> g(mu);
    order.push_back(what);
  };
  w.post([&] {  // a release that blocks (held until the test opens the gate)
    std::unique_lock<std::mutex> g(mu);
    entered = true;
    cv.notify_all();
    cv.wait(g, [&] { return open; });
    order.push_back("blocking release");
  });
  {
    std::unique_lock<std::mutex> g(mu);
    ASSERT_TRUE(cv.wait_for(g, std::chrono::seconds(30), [&] { return entered; }));
  }
  w.post([&] { note("release 1"); });
  w.post([&] { note("release 2"); });
  w.postBringUp([&] { note("bring-up 1"); });
  w.postBringUp([&] { note("bring-up 2"); });
  w.post([&] { note("release of bring-up 2's path"); });
  {
    std::lock_guard<std::mutex> g(mu);
    open = true;
    cv.notify_all();
  }
  w.drain();
  std::vector<std::string> want = {"blocking release", "bring-up 1", "bring-up 2", "release 1", "release 2",
                                   "release of bring-up 2's path"};
  EXPECT_EQ(order, want);
}

// A send path dropped before the worker created its QPs creates none (a connect that timed
// out behind a busy worker leaves nothing to destroy).
TEST_F(RdmaPathTest, ASendPathDroppedBeforeItsCreationCreatesNoQp) {
  HeldWorker held(t->worker());  // until the path is gone
  size_t before = ::fake::qpCreators().size();
  std::string err;
  ASSERT_TRUE(openSendOnly(&err)) << err;
  tx.reset();
  boot.pending.clear();
  held.release();
  t->worker().drain();
  EXPECT_EQ(::fake::qpCreators().size(), before) << "QPs were created for a path already dropped";
}

// While the worker has not created the path's QPs yet, a failed bootstrap connect is reported
// at once with the stream's words (a refusal must reach the engine's peer-gone verdict), not
// after the creation.
TEST_F(RdmaPathTest, ABootstrapConnectFailureIsReportedBeforeTheQpsExist) {
  HeldWorker held(t->worker());  // the creation waits
  std::string err;
  ASSERT_TRUE(openSendOnly(&err)) << err;
  boot.wire(0, "10.0.1.1")->broken = true;
  int r = tx->connectState(&err);
  held.release();
  EXPECT_EQ(r, -1) << "the connect's failure waited for the QPs' creation";
  EXPECT_NE(err.find("bootstrap connect"), std::string::npos) << err;
  boot.pending.clear();
}

// ---- fence threads (FenceRunner)

using rdma::FenceRunner;

// Waits (bounded, generous for a busy host) until pred() holds.
bool waitFor(const std::function<bool()>& pred, int seconds = 30) {
  uint64_t deadline = nowUs() + (uint64_t)seconds * 1000 * 1000;
  while (!pred()) {
    if (nowUs() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// A gate the jobs of a test wait on, and counts of the jobs that entered and left it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int in = 0, out = 0;
  std::vector<std::thread::id> ran;
  std::function<void()> job() {
    return [this] {
      std::unique_lock<std::mutex> g(mu);
      ++in;
      ran.push_back(std::this_thread::get_id());
      cv.notify_all();
      cv.wait(g, [this] { return open; });
      ++out;
    };
  }
  void release() {
    std::lock_guard<std::mutex> g(mu);
    open = true;
    cv.notify_all();
  }
  int entered() {
    std::lock_guard<std::mutex> g(mu);
    return in;
  }
};

// One fence at a time (one path's loss) never starts a thread on the caller's (NCCL's)
// thread: the spares take it, and with the other spare still free none is started at all.
TEST(FenceRunner, FencesOneAtATimeRunOnSpareThreadsNotOnTheCaller) {
  FenceRunner f(2);
  EXPECT_EQ(f.threads(), 2) << "the spares wait from construction on";
  std::mutex mu;
  std::vector<std::thread::id> ran;
  for (int i = 0; i < 20; ++i) {
    f.run([&] {
      std::lock_guard<std::mutex> g(mu);
      ran.push_back(std::this_thread::get_id());
    });
    f.joinAll();
  }
  ASSERT_EQ(ran.size(), 20u);
  for (std::thread::id id : ran) EXPECT_NE(id, std::this_thread::get_id()) << "a fence ran on the caller's thread";
  EXPECT_EQ(f.callerStarts(), 0u) << "run() started a thread on the caller's thread";
  // One fence at a time always left another thread free: none was started for them (a start
  // before each fence delayed it by up to 17 ms on the TCG bed).
  EXPECT_EQ(f.threads(), 2);
}

// One NIC's loss fences every comm on it at once, and each fence can block (a QP's move to
// ERR, ~3 s on rxe): no fence may wait behind another, however many arrive together. More
// than the spares are covered by threads started on the way, some by the caller.
TEST(FenceRunner, FencesThatBlockDoNotWaitBehindEachOther) {
  FenceRunner f(2);
  Gate gate;
  const int n = 6;
  for (int i = 0; i < n; ++i) f.run(gate.job());
  EXPECT_TRUE(waitFor([&] { return gate.entered() == n; }))
      << gate.entered() << " of " << n << " blocked fences started: the others wait behind them";
  EXPECT_LE(f.callerStarts(), (uint64_t)(n - 2)) << "the spares took the first fences";
  gate.release();
  f.joinAll();
  std::lock_guard<std::mutex> g(gate.mu);
  EXPECT_EQ(gate.out, n);
}

// What a fence job captured (the retired path) is released on the fence thread, never on
// the caller's.
TEST(FenceRunner, WhatAJobHeldIsReleasedOnTheFenceThread) {
  FenceRunner f(1);
  std::atomic<bool> released{false};
  std::thread::id where;
  {
    std::shared_ptr<int> held(new int(7), [&](int* p) {
      where = std::this_thread::get_id();
      delete p;
      released.store(true);
    });
    f.run([h = std::move(held)] { (void)*h; });  // the caller keeps no reference (handOff's rule)
  }
  f.joinAll();
  ASSERT_TRUE(waitFor([&] { return released.load(); }));
  EXPECT_NE(where, std::this_thread::get_id());
}

// After a burst the pool shrinks back to its spares, and it still takes fences afterwards;
// with no spares at all, run() starts the thread itself (counted) and nothing is lost.
TEST(FenceRunner, AfterABurstIdleThreadsEndAndTheSparesStay) {
  FenceRunner f(1, 20);  // idle exit after 20 ms
  Gate gate;
  for (int i = 0; i < 4; ++i) f.run(gate.job());
  ASSERT_TRUE(waitFor([&] { return gate.entered() == 4; }));
  EXPECT_GE(f.threads(), 4);
  gate.release();
  f.joinAll();
  EXPECT_TRUE(waitFor([&] { return f.threads() == 1; })) << f.threads() << " threads after the burst";
  std::atomic<int> more{0};
  f.run([&] { more++; });
  f.joinAll();
  EXPECT_EQ(more.load(), 1);

  FenceRunner none(0);
  EXPECT_EQ(none.threads(), 0);
  none.run([&] { more++; });
  none.joinAll();
  EXPECT_EQ(more.load(), 2);
  EXPECT_EQ(none.callerStarts(), 1u);
}

// A spare whose idle wait times out while no more than `spares` threads wait stays, and
// stays counted as free throughout: run() on the caller's thread never sees it missing and
// starts a thread of its own. (A thread that stayed once left the count while it let go of
// the lock to join ended threads, even with none to join: run() found no thread free 1-8
// times in ~33,000 fences here, and started one on the caller's thread each time.)
TEST(FenceRunner, ASpareWhoseIdleWaitTimesOutStaysCountedAsFree) {
  FenceRunner f(1, 1);  // the one spare's idle wait times out every millisecond
  std::atomic<int> ran{0};
  const uint64_t end = nowUs() + 3ull * 1000 * 1000;
  int n = 0;
  while (nowUs() < end || n < 1000) {
    f.run([&] { ran++; });
    f.joinAll();
    ++n;
    if (n % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(900));  // across timeouts
  }
  EXPECT_EQ(ran.load(), n);
  EXPECT_EQ(f.callerStarts(), 0u) << "run() found the spare out of the count " << f.callerStarts() << " times in "
                                  << n;
  // With one spare, each fence took the only free thread and started another before it (the
  // burst rule); those end after their idle millisecond, and the pool is back to its spare.
  EXPECT_TRUE(waitFor([&] { return f.threads() == 1; })) << f.threads() << " threads";
}

// The destructor runs every fence still queued or running before it returns.
TEST(FenceRunner, DestructionRunsTheFencesStillQueued) {
  std::atomic<int> done{0};
  Gate gate;
  std::thread opener;
  bool started = false;
  {
    FenceRunner f(1);
    f.run(gate.job());
    started = waitFor([&] { return gate.entered() == 1; });
    for (int i = 0; i < 3; ++i) f.run([&] { done++; });
    // The gate opens once the three later fences ran (on the spare the first one started);
    // the destructor below must wait for the blocked one as well. (No ASSERT in this scope:
    // the gate opens on every path, so a failure cannot hang the destructor.)
    opener = std::thread([&] {
      waitFor([&] { return done.load() == 3; });
      gate.release();
    });
  }
  opener.join();
  EXPECT_TRUE(started) << "the first fence never started";
  EXPECT_EQ(done.load(), 3);
  std::lock_guard<std::mutex> g(gate.mu);
  EXPECT_EQ(gate.out, 1);
}

TEST_F(RdmaPathTest, TheEndOfTheBootstrapStreamBreaksThePathAsClosedByPeer) {
  bringUp();
  rx->fence();  // the receiver drops the path (fenced by a RESUME elsewhere): its stream ends
  std::string err;
  uint64_t deadline = nowUs() + 5 * 1000 * 1000;
  int r = 0;
  while (r >= 0 && nowUs() < deadline) r = tx->progress(&err);
  EXPECT_EQ(r, -1);
  EXPECT_NE(err.find("closed by peer"), std::string::npos) << err;  // what the engine reads as "by the peer"
}

// The comm's traffic class from NCCL (ncclNetCommConfig_t, v10 connect / v11+ init) sets the
// GRH traffic class and, where it fits (0..15), the service level of the sender's QPs, and
// travels in the endpoints to the receiver, whose QPs use the same (as NCCL's IB receiver takes
// the sender's). Without one (and no NCCL_IB_TC/NCCL_IB_SL) both are 0.
TEST_F(RdmaPathTest, TheCommsTrafficClassSetsBothEndsQps) {
  commTrafficClass = 5;
  bringUp();
  if (HasFatalFailure()) return;
  EXPECT_EQ(::fake::qos(sq), std::make_pair(5, 5)) << "sender's QP";
  EXPECT_EQ(::fake::qos(rq), std::make_pair(5, 5)) << "receiver's QP: the sender's QoS from its endpoint";
}

TEST_F(RdmaPathTest, ATrafficClassAboveTheServiceLevelsRangeLeavesTheServiceLevelAtZero) {
  commTrafficClass = 106;  // DSCP 26 << 2 | ECN 2
  bringUp();
  if (HasFatalFailure()) return;
  EXPECT_EQ(::fake::qos(sq), std::make_pair(106, 0));
  EXPECT_EQ(::fake::qos(rq), std::make_pair(106, 0));
}

TEST_F(RdmaPathTest, WithoutATrafficClassBothEndsUseZero) {
  bringUp();
  if (HasFatalFailure()) return;
  EXPECT_EQ(::fake::qos(sq), std::make_pair(0, 0));
  EXPECT_EQ(::fake::qos(rq), std::make_pair(0, 0));
}

// A receiver that dropped the path while its FIN could not leave (its NIC was down; the socket
// was reaped since) is invisible to a sender with nothing to write: it waits for an
// advertisement that never comes. The nudge after a repair (one byte on the bootstrap stream)
// meets the reset a kernel answers for a socket it no longer has, and the path breaks.
TEST_F(RdmaPathTest, ANudgeFindsAPathTheReceiverDroppedSilently) {
  boot.wire(0, "10.0.1.1")->silentClose = true;
  bringUp();
  rx.reset();  // the receiver drops the path; nothing reaches the sender
  t->worker().drain();
  std::string err;
  for (int i = 0; i < 50; ++i) {
    ASSERT_GE(tx->progress(&err), 0) << err;
    CtlMsg m;
    ASSERT_GE(tx->recvNotice(true, &m, &err), 0) << "seen gone without a nudge: the fake is not silent: " << err;
  }
  tx->nudge();
  uint64_t deadline = nowUs() + 5 * 1000 * 1000;
  int r = 0;
  while (r >= 0 && nowUs() < deadline) r = tx->progress(&err);
  EXPECT_EQ(r, -1);
  EXPECT_NE(err.find("bootstrap stream"), std::string::npos) << err;
  EXPECT_NE(err.find("reset"), std::string::npos) << err;
}

// On a path the receiver still has, nudges are read and dropped: the path stays up and carries
// the next message.
TEST_F(RdmaPathTest, ANudgeToALiveReceiverIsDroppedAndThePathCarriesOn) {
  bringUp();
  for (int i = 0; i < 3; ++i) tx->nudge();
  ASSERT_EQ(toServer->q.size(), 3u) << "a nudge is one byte on the bootstrap stream";
  std::vector<uint8_t> src(3 * kChunk), dst(3 * kChunk, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)(i * 7 + 1);
  void* smr = reg(src);
  void* dmr = reg(dst);
  advertiseOne(0, 100, dst.data(), dst.size(), dmr);
  postMessage(0, src, src.size(), smr);
  sink.dst = dst.data();
  wire();
  ASSERT_EQ(sink.got.size(), 1u) << "the message did not arrive";
  EXPECT_EQ(dst, src);
  std::string err;
  EXPECT_GE(rx->progress(sink, &err), 0) << err;
  EXPECT_GE(tx->progress(&err), 0) << err;
  EXPECT_TRUE(toServer->q.empty()) << "the receiver read its nudges";
}

// After the endpoints, a byte that is not a nudge is a protocol error of the sender's, named.
TEST_F(RdmaPathTest, AByteThatIsNotANudgeBreaksTheReceiversPath) {
  bringUp();
  toServer->q.push_back(0x41);
  std::string err;
  uint64_t deadline = nowUs() + 5 * 1000 * 1000;
  int r = 0;
  while (r >= 0 && nowUs() < deadline) r = rx->progress(sink, &err);
  EXPECT_EQ(r, -1);
  EXPECT_NE(err.find("unexpected byte 0x41"), std::string::npos) << err;
}

}  // namespace
}  // namespace railover

namespace railover {
namespace {

// DEVICE_FATAL on the sender's HCA (fake0, NIC 0): its path breaks; once the device is back the
// port watch re-opens it, registers the buffers again and reports NIC 0 up, and a new path on it
// carries a message from the same registrations (the keys of the dead opening would be refused).
TEST_F(RdmaPathTest, AfterADeviceFatalErrorTheReopenedHcaCarriesMessagesFromTheSameRegistrations) {
  std::vector<uint8_t> rxb(1024, 0xA5), txb(1024);
  void* rmr = reg(rxb);
  void* smr = reg(txb);
  bringUp();
  struct Signals {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<bool, std::string>> nic0;
  };
  auto sig = std::make_shared<Signals>();  // the watch may outlive this scope until t goes
  t->startPortWatch([sig](int nic, bool up, const std::string& why) {
    std::lock_guard<std::mutex> g(sig->mu);
    if (nic == 0) sig->nic0.push_back({up, why});
    sig->cv.notify_all();
  });
  auto waitSignals = [&](size_t n) {
    std::unique_lock<std::mutex> g(sig->mu);
    sig->cv.wait_for(g, std::chrono::seconds(20), [&] { return sig->nic0.size() >= n; });
    return sig->nic0;
  };
  ::fake::deviceFatal("fake0");
  auto s = waitSignals(2);
  ASSERT_EQ(s.size(), 2u) << "NIC 0 was not reported down and up again";
  EXPECT_FALSE(s[0].first);
  EXPECT_TRUE(s[1].first);
  EXPECT_NE(s[1].second.find("re-opened"), std::string::npos) << s[1].second;
  std::string err;
  EXPECT_LT(tx->progress(&err), 0) << "the path of the dead opening must stay broken";
  tx.reset();
  rx.reset();
  t->worker().drain();
  bringUp();
  advertiseOne(0, 100, rxb.data(), rxb.size(), rmr);
  for (size_t i = 0; i < 700; ++i) txb[i] = (uint8_t)(i * 13);
  postMessage(0, txb, 700, smr);
  sink.dst = rxb.data();
  wire();
  ASSERT_EQ(sink.got.size(), 1u) << "no message on the re-opened HCA";
  EXPECT_EQ(sink.got[0].c.len, 700u);
  for (size_t i = 0; i < 700; ++i) ASSERT_EQ(rxb[i], (uint8_t)(i * 13)) << i;
  EXPECT_EQ(rxb[700], 0xA5);
  EXPECT_EQ(tx->progress(&err), 0) << err;
}

// The port watch: a PORT_ERR on the port behind NIC 1 (fake1 port 1) reports NIC 1 down (and
// nothing for NIC 0, nor for the other port of the same HCA); PORT_ACTIVE brings it back.
class RdmaPortWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::fake::reset();
    boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
    std::string err;
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)},
                                              &boot, &err);
    ASSERT_TRUE(t->ok()) << err;
    t->startPortWatch([this](int nic, bool up, const std::string& why) {
      std::lock_guard<std::mutex> g(mu);
      got.push_back({nic, up, why, probe ? probe() : std::string()});
      cv.notify_all();
    });
  }
  struct Sig {
    int nic;
    bool up;
    std::string why;
    std::string seen;  // what `probe` returned when the signal was given
  };
  std::function<std::string()> probe;  // set before the signal it should see (guarded by mu)
  // Waits (bounded) until `n` signals arrived; returns them.
  std::vector<Sig> waitFor(size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return got.size() >= n; });
    return got;
  }
  fake::FakeTransport boot;
  std::unique_ptr<rdma::RdmaTransport> t;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Sig> got;
};

TEST_F(RdmaPortWatchTest, APortErrorReportsItsNicDownAndPortActiveBringsItBack) {
  ::fake::setPortState("fake0", 2, IBV_PORT_DOWN);  // another port of NIC 0's HCA: not ours
  ::fake::asyncEvent(t->port(0).hca->ctx(), IBV_EVENT_PORT_ERR, 2);
  ::fake::setPortState("fake1", 1, IBV_PORT_DOWN);
  ::fake::asyncEvent(t->port(1).hca->ctx(), IBV_EVENT_PORT_ERR, 1);
  auto s = waitFor(1);
  ASSERT_EQ(s.size(), 1u) << "no signal for the port error";
  EXPECT_EQ(s[0].nic, 1);
  EXPECT_FALSE(s[0].up);
  EXPECT_NE(s[0].why.find("RDMA port error (fake1 port 1"), std::string::npos) << s[0].why;
  ::fake::setPortState("fake1", 1, IBV_PORT_ACTIVE);
  ::fake::asyncEvent(t->port(1).hca->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
  s = waitFor(2);
  ASSERT_EQ(s.size(), 2u) << "no signal for the port's return";
  EXPECT_EQ(s[1].nic, 1);
  EXPECT_TRUE(s[1].up);
  EXPECT_NE(s[1].why.find("RDMA port active"), std::string::npos) << s[1].why;
  t.reset();  // stops the watch
  for (auto& x : got) EXPECT_EQ(x.nic, 1) << "NIC 0's port never changed: " << x.why;
}

// A port chosen while DOWN (a pulled cable when the job starts: PortChoice::kChosenDown) keeps
// its NIC in the transport: the watch reports it down before anything else, and up once the
// port is ACTIVE, with the LID it has then (an InfiniBand port has none while down).
TEST(RdmaPortWatchAtInit, APortDownAtInitIsReportedDownThenUpWithItsNewLid) {
  ::fake::reset();
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  verbs::PortSel a = portOf("fake0", 1), b = portOf("fake1", 1);
  b.roce = false, b.gidIndex = -1, b.lid = 0, b.active = false, b.state = "PORT_DOWN";
  ::fake::setPortState("fake1", 1, IBV_PORT_DOWN);
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::tuple<int, bool, std::string>> got;
  t.startPortWatch([&](int nic, bool up, const std::string& why) {
    std::lock_guard<std::mutex> g(mu);
    got.emplace_back(nic, up, why);
    cv.notify_all();
  });
  auto waitFor = [&](size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return got.size() >= n; });
    return got;
  };
  auto s = waitFor(1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(std::get<0>(s[0]), 1);
  EXPECT_FALSE(std::get<1>(s[0]));
  EXPECT_NE(std::get<2>(s[0]).find("not ACTIVE at init (fake1 port 1 PORT_DOWN)"), std::string::npos) << std::get<2>(s[0]);
  ::fake::setPortLid("fake1", 1, 0x33);
  ::fake::setPortState("fake1", 1, IBV_PORT_ACTIVE);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
  s = waitFor(2);
  ASSERT_EQ(s.size(), 2u) << "the port's coming up was not reported";
  EXPECT_EQ(std::get<0>(s[1]), 1);
  EXPECT_TRUE(std::get<1>(s[1]));
  verbs::PortSel now = t.portSel(1);
  EXPECT_TRUE(now.active);
  EXPECT_EQ(now.lid, 0x33) << "new QPs on the port need the LID it got when it came up";
  // Its flush QP (iflush's READs, addressed to itself) is built with that LID once it is up.
  t.worker().drain();
  verbs::FlushQp* fq = t.flushQpForTest(1);
  ASSERT_NE(fq, nullptr) << "no flush QP on the port after it came up";
  EXPECT_EQ(::fake::qpPath(fq->qp()).dlid, 0x33);
  for (auto& x : waitFor(2)) EXPECT_EQ(std::get<0>(x), 1) << "NIC 0 was ACTIVE throughout: " << std::get<2>(x);
}

TEST_F(RdmaPortWatchTest, ADeviceFatalErrorReportsItsNicDownUntilTheHcaIsReopenedWithItsBuffers) {
  std::vector<uint8_t> b(4096);
  std::string err;
  void* m = t->regMr(b.data(), b.size(), &err);
  ASSERT_TRUE(m) << err;
  auto* mr = static_cast<verbs::MrSet*>(m);
  uint32_t oldRkey = mr->rkey(0);
  {
    std::lock_guard<std::mutex> g(mu);  // at each signal: the registration's opening on fake0
    probe = [mr] { return std::to_string(mr->epochOf(0)); };
  }
  ::fake::setDevicePresent("fake0", false);  // being repaired: the first re-open attempts fail
  uint64_t fatalUs = nowUs();
  ::fake::deviceFatal("fake0");
  auto s = waitFor(1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].nic, 0);
  EXPECT_FALSE(s[0].up);
  EXPECT_NE(s[0].why.find("device fatal"), std::string::npos) << s[0].why;
  EXPECT_NE(s[0].why.find("re-opens the HCA"), std::string::npos) << s[0].why;
  // A registration while the HCA is dead does not fail (it is completed at the re-open).
  std::vector<uint8_t> b2(512);
  void* m2 = t->regMr(b2.data(), b2.size(), &err);
  ASSERT_TRUE(m2) << err;
  // Two failed attempts, the second at least the doubled gap (2 s) after the first: lower
  // bounds only, which a busy host cannot break.
  uint64_t t1 = 0, t2 = 0, deadline = nowUs() + 30 * 1000 * 1000;
  while (t->reopenAttempts(0) < 2 && nowUs() < deadline) {
    if (!t1 && t->reopenAttempts(0) >= 1) t1 = nowUs();
    std::this_thread::yield();
  }
  t2 = nowUs();
  ASSERT_GE(t->reopenAttempts(0), 2u) << "no second re-open attempt";
  ASSERT_NE(t1, 0u);
  EXPECT_GE(t1 - fatalUs, 900u * 1000) << "the first attempt comes kReopenFirstMs after the fault";
  EXPECT_GE(t2 - t1, 1500u * 1000) << "the gap did not double";
  EXPECT_EQ(t->reopenAttempts(1), 0u) << "fake1 never died";
  {
    std::lock_guard<std::mutex> g(mu);
    EXPECT_EQ(got.size(), 1u) << "an up signal while the device is absent";
  }
  ::fake::setDevicePresent("fake0", true);
  s = waitFor(2);
  ASSERT_EQ(s.size(), 2u) << "the re-opened HCA's NIC was not reported up";
  EXPECT_EQ(s[1].nic, 0);
  EXPECT_TRUE(s[1].up);
  EXPECT_NE(s[1].why.find("re-opened"), std::string::npos) << s[1].why;
  EXPECT_EQ(s[1].seen, "2") << "the buffer must be registered on the new opening before the NIC is up";
  EXPECT_EQ(t->port(0).hca->epoch(), 2u);
  EXPECT_NE(mr->rkey(0), oldRkey);
  EXPECT_FALSE(::fake::mrOnDeadContext(mr->rkey(0)));
  EXPECT_EQ(static_cast<verbs::MrSet*>(m2)->epochOf(0), 2u);
  EXPECT_NE(static_cast<verbs::MrSet*>(m2)->lkey(0), 0u);
  t->deregMr(m);
  t->deregMr(m2);
  t.reset();
  for (auto& x : got) EXPECT_EQ(x.nic, 0) << x.why;
}


ibv_gid_entry gidEntry(const char* text, unsigned ifindex) {
  ibv_gid_entry e{};
  inet_pton(AF_INET6, text, e.gid.raw);
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = ifindex;
  return e;
}

// The fake world of the GID-change tests: fake0 port 1's table is {fe80::1, ::ffff:127.0.0.1},
// both bound to "lo", and *cur is lo's port choice (GID index 1); *t0 is that table.
void chooseLoGid(std::vector<ibv_gid_entry>* t0, verbs::PortSel* cur) {
  ::fake::reset();
  unsigned lo = if_nametoindex("lo");
  ASSERT_NE(lo, 0u);
  *t0 = {gidEntry("fe80::1", lo), gidEntry("::ffff:127.0.0.1", lo)};
  ::fake::setGids("fake0", 1, *t0);
  std::string err;
  ASSERT_EQ(verbs::choosePortForNetdev("lo", IbConfig{}, cur, &err), verbs::PortChoice::kChosen) << err;
  ASSERT_EQ(cur->gidIndex, 1);
}

// After IBV_EVENT_GID_CHANGE the watch re-chooses the NIC's GID with NCCL's rules, and new
// paths use the new one (here NIC 0 is "lo" on fake0 port 1, its IPv4 GID moving 1 -> 3).
TEST(RdmaGidWatch, AGidTableChangeReChoosesTheGidForNewPaths) {
  std::vector<ibv_gid_entry> t0;
  verbs::PortSel cur;
  std::string err;
  ASSERT_NO_FATAL_FAILURE(chooseLoGid(&t0, &cur));
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  rdma::RdmaTransport t({cur, portOf("fake1", 1)}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> told;  // the address-change callback's calls
  t.startPortWatch([](int, bool, const std::string&) {},
                   [&](int nic, const std::string& kind, const std::string& o, const std::string& n, const std::string& why) {
                     std::lock_guard<std::mutex> g(mu);
                     told.push_back({std::to_string(nic), kind, o, n, why});
                     cv.notify_all();
                   });
  ibv_gid_entry empty{};
  empty.gid_type = 0xff;
  ::fake::setGids("fake0", 1, {t0[0], empty, empty, t0[1]});
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_GID_CHANGE, 1);
  {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return !told.empty(); });
    ASSERT_EQ(told.size(), 1u) << "the GID re-choice was not told (journal event hca_addr_change)";
    EXPECT_EQ(told[0][0], "0");
    EXPECT_EQ(told[0][1], "gid");
    EXPECT_EQ(told[0][2], "1 ::ffff:127.0.0.1");
    EXPECT_EQ(told[0][3], "3 ::ffff:127.0.0.1");
    EXPECT_NE(told[0][4].find("GID table changed (fake0 port 1)"), std::string::npos) << told[0][4];
  }
  verbs::PortSel now = t.portSel(0);
  EXPECT_EQ(now.gidIndex, 3) << now.why;
  EXPECT_EQ(verbs::gidString(now.gid), "::ffff:127.0.0.1");
  EXPECT_EQ(now.dev, "fake0");
  EXPECT_NE(t.describe().find("GID 3"), std::string::npos) << t.describe();
  EXPECT_EQ(t.portSel(1).gidIndex, 1) << "the other NIC's GID did not change";
}


// Two InfiniBand ports for the LID-change tests: fake0 port 1 with LID 0x33 (51), fake1 port 1
// with LID 0x34 (52), the fake's ports set to the same LIDs.
void ibPorts(verbs::PortSel* a, verbs::PortSel* b) {
  ::fake::reset();
  *a = portOf("fake0", 1), *b = portOf("fake1", 1);
  a->roce = b->roce = false, a->gidIndex = b->gidIndex = -1;
  a->lid = 0x33, b->lid = 0x34;
  a->why = "fake0 port 1: InfiniBand, LID 51 (LID addressing, no GRH)";
  ::fake::setPortLid("fake0", 1, 0x33);
  ::fake::setPortLid("fake1", 1, 0x34);
}

// InfiniBand: IBV_EVENT_LID_CHANGE on a port that stays ACTIVE (the subnet manager re-assigned
// its LID). The watch reads the new LID: new paths and the port's flush QP use it, the HCA is
// told (the paths connected with the old LID break, VerbsPathIb.APathBreaksWhenItsPortGets...)
// and the change is reported once (journal event hca_addr_change); no port signal (the port
// never went down). An event that leaves the LID as it was changes nothing.
TEST(RdmaLidWatch, ALidChangeOnALivePortIsReadForNewPathsAndTold) {
  verbs::PortSel a, b;
  ibPorts(&a, &b);
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> told;
  std::vector<std::string> signals;
  t.startPortWatch(
      [&](int nic, bool up, const std::string& why) {
        std::lock_guard<std::mutex> g(mu);
        signals.push_back(std::to_string(nic) + (up ? " up " : " down ") + why);
      },
      [&](int nic, const std::string& kind, const std::string& o, const std::string& n, const std::string& why) {
        std::lock_guard<std::mutex> g(mu);
        told.push_back({std::to_string(nic), kind, o, n, why});
        cv.notify_all();
      });
  auto waitTold = [&](size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return told.size() >= n; });
    return told;
  };
  ::fake::setPortLid("fake0", 1, 0x44);
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
  auto s = waitTold(1);
  ASSERT_EQ(s.size(), 1u) << "the LID change was not told";
  EXPECT_EQ(s[0][0], "0");
  EXPECT_EQ(s[0][1], "lid");
  EXPECT_EQ(s[0][2], "51");
  EXPECT_EQ(s[0][3], "68");
  EXPECT_NE(s[0][4].find("subnet manager changed the LID of fake0 port 1 from 51 to 68"), std::string::npos) << s[0][4];
  EXPECT_EQ(t.portSel(0).lid, 0x44) << "new paths would address the old LID";
  EXPECT_EQ(t.portSel(0).why, "fake0 port 1: InfiniBand, LID 68 (LID addressing, no GRH)") << "status would show the old LID";
  uint64_t moves = 0;
  EXPECT_EQ(t.port(0).hca->portLid(1, &moves), 0x44);
  EXPECT_EQ(moves, 1u) << "the paths on the port are not told their LID is stale";
  t.worker().drain();
  verbs::FlushQp* fq = t.flushQpForTest(0);
  ASSERT_NE(fq, nullptr);
  EXPECT_EQ(::fake::qpPath(fq->qp()).dlid, 0x44) << "the flush QP still addresses the old LID";
  // An event with the LID unchanged (NIC 0), then a real change on NIC 1: only the second is told.
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
  ::fake::setPortLid("fake1", 1, 0x35);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
  s = waitTold(2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1][0], "1");
  EXPECT_EQ(s[1][3], "53");
  EXPECT_EQ(t.portSel(0).lid, 0x44);
  std::lock_guard<std::mutex> g(mu);
  EXPECT_TRUE(signals.empty()) << signals[0];
}

// A LID change whose event was missed (it came while the port read INIT, or before the HCA was
// opened) is still found: the watch's full re-check (every kPortRecheckMs) compares the LID too.
// Found by a review: the event was the only trigger, and the LID stayed stale for good.
TEST(RdmaLidWatch, ALidChangeWithoutItsEventIsFoundByTheFullRecheck) {
  verbs::PortSel a, b;
  ibPorts(&a, &b);
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> told;
  t.startPortWatch([](int, bool, const std::string&) {},
                   [&](int nic, const std::string& kind, const std::string&, const std::string& n, const std::string&) {
                     std::lock_guard<std::mutex> g(mu);
                     told.push_back(std::to_string(nic) + " " + kind + " " + n);
                     cv.notify_all();
                   });
  ::fake::setPortLid("fake0", 1, 0x44);  // no event at all
  std::unique_lock<std::mutex> g(mu);
  cv.wait_for(g, std::chrono::seconds(20), [&] { return !told.empty(); });
  ASSERT_EQ(told.size(), 1u) << "the new LID was never read";
  EXPECT_EQ(told[0], "0 lid 68");
  EXPECT_EQ(t.portSel(0).lid, 0x44);
  uint64_t moves = 0;
  EXPECT_EQ(t.port(0).hca->portLid(1, &moves), 0x44);
}

// A LID change that arrives while the flush QP's rebuild for an earlier one is running on the
// worker (the build read the port's choice, then the watch changed it): the watch's own rebuild
// finds one running and starts none, so the running one must not keep the LID it started
// with. The QP creation is held in the fake until the second change was applied. Found by a
// review: the flush QP kept the old LID until its next failure rebuilt it.
TEST(RdmaLidWatch, ALidChangeDuringAFlushQpRebuildEndsWithTheFlushQpOnTheNewLid) {
  verbs::PortSel a, b;
  ibPorts(&a, &b);
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::vector<uint8_t> buf(4096);
  std::vector<void*> mrs;
  rdmatest::regBuffer(t, buf, mrs);  // builds every NIC's flush QP, here with LID 0x33
  ASSERT_NE(t.flushQpForTest(0), nullptr);
  EXPECT_EQ(::fake::qpPath(t.flushQpForTest(0)->qp()).dlid, 0x33);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> told;
  t.startPortWatch([](int, bool, const std::string&) {},
                   [&](int nic, const std::string& kind, const std::string&, const std::string& n, const std::string&) {
                     std::lock_guard<std::mutex> g(mu);
                     told.push_back(std::to_string(nic) + " " + kind + " " + n);
                     cv.notify_all();
                   });
  auto waitTold = [&](size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return told.size() >= n; });
    return told.size();
  };
  ::fake::blockQpCreation(true);
  ::fake::setPortLid("fake0", 1, 0x44);
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (::fake::blockedQpCreations() == 0 && nowUs() < deadline) std::this_thread::yield();
  ASSERT_EQ(::fake::blockedQpCreations(), 1) << "the flush QP's rebuild never reached its QP creation";
  ASSERT_EQ(waitTold(1), 1u) << "the first LID change was not told";
  // The rebuild holds LID 0x44 now; the subnet manager moves the port again.
  ::fake::setPortLid("fake0", 1, 0x55);
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
  ASSERT_EQ(waitTold(2), 2u) << "the second LID change was not told";
  EXPECT_EQ(t.portSel(0).lid, 0x55);
  ::fake::blockQpCreation(false);
  t.worker().drain();
  verbs::FlushQp* fq = t.flushQpForTest(0);
  ASSERT_NE(fq, nullptr) << "no flush QP after the rebuild";
  EXPECT_EQ(::fake::qpPath(fq->qp()).dlid, 0x55) << "the flush QP kept the LID of the first change";
  EXPECT_EQ(::fake::qpPath(t.flushQpForTest(1)->qp()).dlid, 0x34) << "the other NIC's flush QP is untouched";
  for (void* m : mrs) t.deregMr(m);
  t.worker().drain();
}

// The flush QP's rebuild gap (at most one build per kFlushRebuildGapUs after a failed one):
// NIC 0's flush QP build fails at the registration, and within the gap its port gets a new
// address from the watch (`change`: a LID change, or the port down and back up with another
// LID). The rebuild the watch asks for falls in the gap: it must be remembered and started
// once the gap has passed, with no flush or registration asking again, ending with the flush
// QP on the new LID. The gap is measured on a test clock (setFlushClockForTest) that stands
// still until the test moves it past the gap, so "within the gap" holds however slow the host.
// Before, the request was dropped and the NIC had no flush QP until a later flush or regMr.
void flushRebuildAskedWithinTheGapRunsWhenItEnds(const std::function<void(rdma::RdmaTransport&)>& change,
                                                 size_t toldAfterChange, uint16_t newLid) {
  verbs::PortSel a, b;
  ibPorts(&a, &b);
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::atomic<uint64_t> clock{5000000000ull};
  t.setFlushClockForTest([&clock] { return clock.load(); });
  ::fake::failNextModify(EIO);  // the next QP state change anywhere: NIC 0's flush QP (built first) fails
  std::vector<uint8_t> buf(4096);
  std::vector<void*> mrs;
  rdmatest::regBuffer(t, buf, mrs);
  ASSERT_EQ(t.flushQpForTest(0), nullptr) << "NIC 0's flush QP build did not fail";
  ASSERT_NE(t.flushQpForTest(1), nullptr);
  std::mutex mu;
  std::condition_variable cv;
  size_t told = 0;
  auto note = [&] {
    std::lock_guard<std::mutex> g(mu);
    ++told;
    cv.notify_all();
  };
  t.startPortWatch([&](int, bool, const std::string&) { note(); },
                   [&](int, const std::string&, const std::string&, const std::string&, const std::string&) { note(); });
  change(t);
  {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return told >= toldAfterChange; });
    ASSERT_EQ(told, toldAfterChange) << "the watch did not act on the port's change";
  }
  EXPECT_EQ(t.portSel(0).lid, newLid);
  size_t creations = ::fake::qpCreators().size();
  t.worker().drain();
  EXPECT_EQ(t.flushQpForTest(0), nullptr) << "a flush QP was built within the gap after the failed build";
  EXPECT_EQ(::fake::qpCreators().size(), creations) << "a build started within the gap";
  // The gap ends; nothing else happens (no flush, no registration): the watch (awake at least
  // every kPortRecheckMs) starts the remembered build on the worker.
  clock += rdma::RdmaTransport::flushRebuildGapUsForTest();
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (t.flushQpForTest(0) == nullptr && nowUs() < deadline) std::this_thread::yield();
  t.worker().drain();
  verbs::FlushQp* fq = t.flushQpForTest(0);
  ASSERT_NE(fq, nullptr) << "the rebuild asked for within the gap never ran after it";
  EXPECT_EQ(::fake::qpPath(fq->qp()).dlid, newLid) << "the flush QP does not address the port's new LID";
  for (void* m : mrs) t.deregMr(m);
  t.worker().drain();
}

TEST(RdmaLidWatch, ALidChangeWithinTheGapAfterAFailedFlushQpBuildIsBuiltWhenTheGapEnds) {
  flushRebuildAskedWithinTheGapRunsWhenItEnds(
      [](rdma::RdmaTransport& t) {
        ::fake::setPortLid("fake0", 1, 0x44);
        ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_LID_CHANGE, 1);
      },
      1, 0x44);  // told: the LID change
}

TEST(RdmaLidWatch, APortBackUpWithinTheGapAfterAFailedFlushQpBuildGetsItsFlushQpWhenTheGapEnds) {
  flushRebuildAskedWithinTheGapRunsWhenItEnds(
      [](rdma::RdmaTransport& t) {
        ::fake::setPortState("fake0", 1, IBV_PORT_DOWN);
        ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_PORT_ERR, 1);
        uint64_t deadline = nowUs() + 20 * 1000 * 1000;
        while (t.portSel(0).active && nowUs() < deadline) std::this_thread::yield();
        ASSERT_FALSE(t.portSel(0).active) << "the port never went down";
        ::fake::setPortLid("fake0", 1, 0x45);  // back with another LID
        ::fake::setPortState("fake0", 1, IBV_PORT_ACTIVE);
        ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
      },
      2, 0x45);  // told: down, then up
}

}  // namespace
}  // namespace railover

// ---- GPUDirect: memory kinds, dmabufs, iflush through the NIC's flush QP ----
namespace railover {
namespace {

class RdmaGdrTest : public RdmaPathTest {};

TEST_F(RdmaGdrTest, PtrSupportIsHostOnlyUntilGpuDirectIsDetected) {
  t->setGdrForTest(false, false);
  EXPECT_EQ(t->ptrSupport(0), Transport::kPtrHost);
  std::vector<uint8_t> b(64);
  std::string err;
  EXPECT_EQ(t->regMr(b.data(), b.size(), (int)Transport::kPtrCuda, &err), nullptr);
  EXPECT_NE(err.find("peer-memory"), std::string::npos) << err;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // stands for the CUDA driver's dmabuf fd
  ASSERT_GE(fd, 0);
  EXPECT_EQ(t->regMrDmaBuf(b.data(), b.size(), 0, fd, &err), nullptr);
  EXPECT_NE(err.find("dmabuf"), std::string::npos) << err;

  t->setGdrForTest(true, true);
  EXPECT_EQ(t->ptrSupport(1), Transport::kPtrHost | Transport::kPtrCuda | Transport::kPtrDmaBuf);
  void* m = t->regMr(b.data(), b.size(), (int)Transport::kPtrCuda, &err);
  ASSERT_TRUE(m) << err;
  mrs.push_back(m);
  void* d = t->regMrDmaBuf(b.data(), b.size(), 0, fd, &err);
  close(fd);  // as NCCL does when regMrDmaBuf returns
  ASSERT_TRUE(d) << err;
  mrs.push_back(d);
  EXPECT_EQ(::fake::dmabufRegistrations(), 2) << "one per HCA, inside the call";
  EXPECT_EQ(t->regMr(b.data(), b.size(), 9, &err), nullptr) << "unknown memory type";
}

// DMABUF is advertised only when every HCA takes dmabufs: regMrDmaBuf registers on each of
// them inside the call (a comm may fail over to any), and one refusal would fail NCCL's
// connect-time registration. The same for every NIC.
TEST_F(RdmaGdrTest, DmabufIsAdvertisedOnlyWhenEveryHcaTakesThem) {
  t->setGdrForTest(true, true);
  EXPECT_EQ(t->ptrSupport(0), Transport::kPtrHost | Transport::kPtrCuda | Transport::kPtrDmaBuf);
  t->setDmabufForTest(1, false);  // the standby HCA (fake1) is of a model without dmabuf
  EXPECT_EQ(t->ptrSupport(0), Transport::kPtrHost | Transport::kPtrCuda) << "NIC 0's HCA takes dmabufs, fake1 does not";
  EXPECT_EQ(t->ptrSupport(1), Transport::kPtrHost | Transport::kPtrCuda);
}

TEST_F(RdmaGdrTest, FlushReadsTheBufferThroughTheDeliveringNic) {
  std::vector<uint8_t> b(4096, 1);
  void* m = rdmatest::regBuffer(*t, b, mrs);
  ASSERT_TRUE(t->flushQpForTest(0) && t->flushQpForTest(1)) << "a registration builds every NIC's flush QP";
  std::string err;
  std::unique_ptr<FlushOp> op = t->flush(1, &b[4000], m, &err);
  ASSERT_TRUE(op) << err;
  EXPECT_EQ(op->test(&err), 0);
  ibv_qp* q1 = t->flushQpForTest(1)->qp();
  ASSERT_EQ(::fake::outstanding(q1).size(), 1u) << "the READ goes through NIC 1's HCA";
  EXPECT_EQ(::fake::outstanding(t->flushQpForTest(0)->qp()).size(), 0u);
  EXPECT_EQ(::fake::outstanding(q1)[0].remoteAddr, (uint64_t)(uintptr_t)&b[4000]);
  ::fake::deliver(q1, q1);
  EXPECT_EQ(op->test(&err), 1) << err;
}

TEST_F(RdmaGdrTest, FlushOfAnEmptyRegistrationIsNothingToDo) {
  std::string err;
  void* m = t->regMr(nullptr, 0, &err);
  ASSERT_TRUE(m) << err;
  mrs.push_back(m);
  EXPECT_EQ(t->flush(0, nullptr, m, &err), nullptr);
  EXPECT_TRUE(err.empty()) << "NULL with no error: NCCL takes it as done";
  EXPECT_EQ(t->flush(0, nullptr, nullptr, &err), nullptr);
  EXPECT_NE(err.find("not registered"), std::string::npos) << err;
}

TEST_F(RdmaGdrTest, AFailedFlushReadMovesToTheOtherNicAndTheQpIsRebuilt) {
  std::vector<uint8_t> b(512, 3);
  void* m = rdmatest::regBuffer(*t, b, mrs);
  std::string err;
  std::unique_ptr<FlushOp> op = t->flush(0, &b[10], m, &err);
  ASSERT_TRUE(op) << err;
  EXPECT_EQ(op->test(&err), 0);
  verbs::FlushQp* first = t->flushQpForTest(0);
  ::fake::fail(first->qp(), IBV_WC_RETRY_EXC_ERR);  // NIC 0's port died after the data arrived
  EXPECT_EQ(op->test(&err), 0) << "retried through NIC 1, not failed";
  t->worker().drain();  // the rebuild of NIC 0's flush QP (the fake is single-threaded)
  ibv_qp* q1 = t->flushQpForTest(1)->qp();
  ASSERT_EQ(::fake::outstanding(q1).size(), 1u);
  ::fake::deliver(q1, q1);
  EXPECT_EQ(op->test(&err), 1) << err;
  verbs::FlushQp* rebuilt = t->flushQpForTest(0);
  ASSERT_TRUE(rebuilt) << "NIC 0's flush QP was rebuilt";
  std::unique_ptr<FlushOp> next = t->flush(0, &b[10], m, &err);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->test(&err), 0);
  ::fake::deliver(rebuilt->qp(), rebuilt->qp());
  EXPECT_EQ(next->test(&err), 1) << err;
}

TEST_F(RdmaGdrTest, FlushFailsOnlyWhenEveryNicFails) {
  std::vector<uint8_t> b(512, 3);
  void* m = rdmatest::regBuffer(*t, b, mrs);
  std::string err;
  std::unique_ptr<FlushOp> op = t->flush(1, &b[0], m, &err);
  ASSERT_TRUE(op) << err;
  EXPECT_EQ(op->test(&err), 0);
  ::fake::fail(t->flushQpForTest(1)->qp(), IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(op->test(&err), 0);
  t->worker().drain();
  ::fake::fail(t->flushQpForTest(0)->qp(), IBV_WC_RETRY_EXC_ERR);
  int r = op->test(&err);
  EXPECT_EQ(r, -1);
  EXPECT_NE(err.find("every NIC"), std::string::npos) << err;
  EXPECT_NE(err.find("nic0"), std::string::npos) << err;
  EXPECT_NE(err.find("nic1"), std::string::npos) << err;
  t->worker().drain();
}

// ---- orderly close: the CLOSE reaches the peer before its fence and before the stream's end ----

// Delivers what `from` has posted to `to` once the closing side is seen waiting for it (its CQ
// polled again, the QP still not in ERR) or gave up waiting (the QP went to ERR: nothing is
// left to deliver then). Models a wire slower than the closing side's next step.
std::thread deliverWhenAwaited(ibv_qp* from, ibv_qp* to) {
  uint64_t polls0 = ::fake::cqPolls(from->send_cq);
  return std::thread([from, to, polls0] {
    uint64_t deadline = nowUs() + 20 * 1000 * 1000;
    while (nowUs() < deadline && ::fake::state(from) != IBV_QPS_ERR && ::fake::cqPolls(from->send_cq) < polls0 + 3)
      std::this_thread::yield();
    ::fake::deliver(from, to);
  });
}

TEST_F(RdmaPathTest, AReceiversCloseIsNotFlushedByItsOwnFence) {
  bringUp();
  rx->sendClose(kCloseReasonClosed);
  std::thread wire = deliverWhenAwaited(rq, sq);
  rx->fence();  // RecvLink::close: sendClose() then the fence
  wire.join();
  std::string err;
  CtlMsg m;
  int r = 0;
  for (uint64_t deadline = nowUs() + 2 * 1000 * 1000; r == 0 && nowUs() < deadline;) r = tx->recvCtl(&m, &err);
  ASSERT_EQ(r, 1) << "the CLOSE was flushed by the fence: " << err;
  EXPECT_EQ((int)m.type, (int)CtlType::kClose);
}

TEST_F(RdmaPathTest, AReceiversLastAckGoesOutBeforeItsCloseFence) {
  bringUp();
  CtlMsg ack;
  ack.type = CtlType::kAck, ack.seq = 5;
  rx->sendCtl(ack);
  std::string err;
  ASSERT_EQ(rx->flushCtl(&err), 0) << err;
  rx->sendClose(kCloseReasonClosed);
  std::thread wire = deliverWhenAwaited(rq, sq);
  rx->fence();
  wire.join();
  std::vector<CtlType> seen;
  CtlMsg m;
  for (uint64_t deadline = nowUs() + 2 * 1000 * 1000; seen.size() < 2 && nowUs() < deadline;) {
    int r = tx->recvCtl(&m, &err);
    ASSERT_GE(r, 0) << err;
    if (r == 1) seen.push_back(m.type);
  }
  ASSERT_EQ(seen.size(), 2u) << "the final ACK or the CLOSE was flushed";
  EXPECT_EQ((int)seen[0], (int)CtlType::kAck);
  EXPECT_EQ((int)seen[1], (int)CtlType::kClose);
}

TEST_F(RdmaPathTest, ASendersCloseReachesTheReceiverBeforeItsStreamEnds) {
  bringUp();
  tx->sendClose();
  std::thread wire = deliverWhenAwaited(sq, rq);
  tx->fence();  // the linger before the QP's move to ERR runs here, the move on the send-fence thread
  wire.join();
  t->sendFencer().drain();
  t->worker().drain();
  std::string err;
  int r = 0;
  for (uint64_t deadline = nowUs() + 2 * 1000 * 1000; r >= 0 && sink.ctls.empty() && nowUs() < deadline;)
    r = rx->progress(sink, &err);
  ASSERT_EQ(sink.ctls.size(), 1u) << "the receiver saw the stream end without the CLOSE: " << err;
  EXPECT_EQ((int)sink.ctls[0].type, (int)CtlType::kClose);
}

TEST_F(RdmaPathTest, AnOrderlyCloseToADeadPeerDoesNotWait) {
  bringUp();
  rx.reset();  // the receiving process is gone: its bootstrap stream ends (no progress saw it yet)
  tx->sendClose();
  ASSERT_EQ(::fake::outstanding(sq).size(), 1u) << "the CLOSE is posted and nothing will complete it";
  uint64_t polls = ::fake::cqPolls(sq->send_cq);
  tx->fence();
  t->sendFencer().drain();  // the move to ERR runs on the send-fence thread
  t->worker().drain();
  EXPECT_EQ(::fake::cqPolls(sq->send_cq), polls) << "the close waited (polled) for a CLOSE no one will take";
  EXPECT_EQ(::fake::state(sq), IBV_QPS_ERR);
}

// The engine reads control before it calls a broken path a fault: a CLOSE (or ACK) already
// polled off the CQ is handed out even when the same progress() saw the stream end after it.
TEST_F(RdmaPathTest, AControlMessagePolledBeforeTheStreamEndedIsStillRead) {
  bringUp();
  rx->sendClose(kCloseReasonClosed);
  ::fake::deliver(rq, sq);  // the CLOSE is in the sender's CQ
  rx.reset();               // then the stream ends
  std::string err;
  int p = 0;
  for (uint64_t deadline = nowUs() + 2 * 1000 * 1000; p >= 0 && nowUs() < deadline;) p = tx->progress(&err);
  ASSERT_EQ(p, -1) << "the stream's end was never seen";
  CtlMsg m;
  ASSERT_EQ(tx->recvCtl(&m, &err), 1) << "the CLOSE read before the end was dropped: " << err;
  EXPECT_EQ((int)m.type, (int)CtlType::kClose);
  EXPECT_EQ(tx->recvCtl(&m, &err), -1) << "then the fault";
}

}  // namespace
}  // namespace railover

// ---- the state file's per-NIC "rdma" object (Transport::devicePort, plugin/state_file.cc) ----
namespace railover {
namespace {

// The "rdma" member of NIC `name` in the state document's fields `f`: the object's text (or
// "null"); "" when the NIC or the member is missing.
std::string rdmaOf(const std::string& f, const std::string& name) {
  size_t n = f.find("\"name\":\"" + name + "\"");
  if (n == std::string::npos) return "";
  size_t r = f.find("\"rdma\":", n);
  if (r == std::string::npos) return "";
  r += 7;
  if (f.compare(r, 4, "null") == 0) return "null";
  size_t e = f.find('}', r);
  return e == std::string::npos ? "" : f.substr(r, e + 1 - r);
}

// Records the port watch's signals; wait(n) waits (bounded) for the n-th.
struct Signals {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, bool>> got;
  rdma::RdmaTransport::PortSignal fn() {
    return [this](int nic, bool up, const std::string&) {
      std::lock_guard<std::mutex> g(mu);
      got.emplace_back(nic, up);
      cv.notify_all();
    };
  }
  std::vector<std::pair<int, bool>> wait(size_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(20), [&] { return got.size() >= n; });
    return got;
  }
};

// Each NIC's entry names the HCA port behind it, its link layer, whether the port is ACTIVE,
// the GID (RoCE) or LID (InfiniBand) in use, the MTU in bytes and why the port was chosen; a
// port error turns port_active false and the port's return true again, with the LID and MTU
// the port has then.
TEST(RdmaStateFile, NicEntriesShowTheHcaPortItsAddressingAndFollowItsState) {
  ::fake::reset();
  fake::FakeTransport boot;
  boot.nicAddr = {"10.0.0.1", "10.0.1.1"};
  verbs::PortSel a = portOf("fake0", 1), b = portOf("fake1", 1);
  a.why = "fake0 port 1 GID 1 (RoCE v2, \"10.48.0.1\")";
  b.roce = false, b.gidIndex = -1, b.gid = ibv_gid{}, b.lid = 0x21, b.activeMtu = IBV_MTU_4096;
  b.why = "fake1 port 1: InfiniBand, LID 33";
  ::fake::setPortLid("fake1", 1, 0x21);
  std::string err;
  rdma::RdmaTransport t(std::vector<verbs::PortSel>{a, b}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  Runtime rt;  // a runtime of its own: the process's one is not touched
  rt.nics = {testbed::makeNic(0, "eth0", "10.0.0.1"), testbed::makeNic(1, "eth1", "10.0.1.1")};
  rt.transport = &t;
  const std::string roce =
      R"({"hca":"fake0","port":1,"link_layer":"Ethernet","port_active":true,"gid_index":1,"gid":"::ffff:10.48.0.1",)"
      R"x("lid":0,"mtu":1024,"why":"fake0 port 1 GID 1 (RoCE v2, \"10.48.0.1\")"})x";
  std::string f = renderStateFields(rt, nullptr);
  EXPECT_EQ(rdmaOf(f, "eth0"), roce) << f;
  EXPECT_EQ(rdmaOf(f, "eth1"),
            R"({"hca":"fake1","port":1,"link_layer":"InfiniBand","port_active":true,"gid_index":-1,"gid":"",)"
            R"("lid":33,"mtu":4096,"why":"fake1 port 1: InfiniBand, LID 33"})")
      << f;
  EXPECT_NE(f.find(R"("speed_mbps":10000,"up":true,"rdma":{"hca":"fake0",)"), std::string::npos)
      << "\"rdma\" comes after \"up\" (older readers ignore it): " << f;
  // The process's state source: a port change alone (no comm, no link change) rewrites the file.
  StateSource src = processStateSource(rt);
  EXPECT_TRUE(src.takeChanged()) << "the first write";
  EXPECT_FALSE(src.takeChanged()) << "nothing changed since";

  Signals sig;
  t.startPortWatch(sig.fn());
  ::fake::setPortState("fake1", 1, IBV_PORT_DOWN);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_PORT_ERR, 1);
  auto s = sig.wait(1);
  ASSERT_EQ(s.size(), 1u) << "no signal for the port error";
  ASSERT_EQ(s[0], std::make_pair(1, false));
  EXPECT_TRUE(src.takeChanged()) << "the port error must rewrite the state file";
  EXPECT_FALSE(src.takeChanged());
  f = renderStateFields(rt, nullptr);
  EXPECT_EQ(rdmaOf(f, "eth1"),
            R"({"hca":"fake1","port":1,"link_layer":"InfiniBand","port_active":false,"gid_index":-1,"gid":"",)"
            R"("lid":33,"mtu":4096,"why":"fake1 port 1: InfiniBand, LID 33"})")
      << f;
  EXPECT_EQ(rdmaOf(f, "eth0"), roce) << "NIC 0's port did not change: " << f;

  ::fake::setPortLid("fake1", 1, 0x44);  // the subnet manager gave it another LID
  ::fake::setPortState("fake1", 1, IBV_PORT_ACTIVE);
  ::fake::asyncEvent(t.port(1).hca->ctx(), IBV_EVENT_PORT_ACTIVE, 1);
  s = sig.wait(2);
  ASSERT_EQ(s.size(), 2u) << "no signal for the port's return";
  ASSERT_EQ(s[1], std::make_pair(1, true));
  EXPECT_TRUE(src.takeChanged()) << "the port's return must rewrite the state file";
  f = renderStateFields(rt, nullptr);
  EXPECT_EQ(rdmaOf(f, "eth1"),
            R"({"hca":"fake1","port":1,"link_layer":"InfiniBand","port_active":true,"gid_index":-1,"gid":"",)"
            R"("lid":68,"mtu":1024,"why":"fake1 port 1: InfiniBand, LID 33"})")
      << "the LID and MTU (the fake's ports answer IBV_MTU_1024) are the port's now: " << f;
  Transport::DevicePort d;
  EXPECT_FALSE(t.devicePort(2, &d)) << "no NIC 2";
  EXPECT_FALSE(t.devicePort(-1, &d));
  rt.transport = nullptr;
}

// After IBV_EVENT_GID_CHANGE the port watch chooses the NIC's GID again: the state file shows
// the new index, GID and why (NIC 0 is "lo" on fake0 port 1, its IPv4 GID moving 1 -> 3).
TEST(RdmaStateFile, AGidReChoiceShowsTheNewGidAndWhy) {
  std::vector<ibv_gid_entry> t0;
  verbs::PortSel cur;
  std::string err;
  ASSERT_NO_FATAL_FAILURE(chooseLoGid(&t0, &cur));
  fake::FakeTransport boot;
  boot.nicAddr = {"127.0.0.1", "10.0.1.1"};
  rdma::RdmaTransport t({cur, portOf("fake1", 1)}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  Runtime rt;
  rt.nics = {testbed::makeNic(0, "lo", "127.0.0.1"), testbed::makeNic(1, "eth1", "10.0.1.1")};
  rt.transport = &t;
  std::string f = renderStateFields(rt, nullptr), before = rdmaOf(f, "lo");
  EXPECT_NE(before.find(R"("gid_index":1,"gid":"::ffff:127.0.0.1","lid":0,)"), std::string::npos) << f;
  EXPECT_NE(before.find(R"("why":")" + cur.why + "\"}"), std::string::npos) << before;
  EXPECT_NE(cur.why.find("GID 1"), std::string::npos) << cur.why;
  StateSource src = processStateSource(rt);
  EXPECT_TRUE(src.takeChanged()) << "the first write";
  EXPECT_FALSE(src.takeChanged()) << "nothing changed since";

  t.startPortWatch([](int, bool, const std::string&) {});
  ibv_gid_entry empty{};
  empty.gid_type = 0xff;
  ::fake::setGids("fake0", 1, {t0[0], empty, empty, t0[1]});
  ::fake::asyncEvent(t.port(0).hca->ctx(), IBV_EVENT_GID_CHANGE, 1);
  // The watch says nothing after a GID re-choice: wait (bounded) until it is visible.
  uint64_t deadline = nowUs() + 20 * 1000 * 1000;
  while (t.portSel(0).gidIndex != 3 && nowUs() < deadline) std::this_thread::yield();
  verbs::PortSel now = t.portSel(0);
  ASSERT_EQ(now.gidIndex, 3) << now.why;
  f = renderStateFields(rt, nullptr);
  EXPECT_EQ(rdmaOf(f, "lo"), R"({"hca":"fake0","port":1,"link_layer":"Ethernet","port_active":true,"gid_index":3,)"
                             R"("gid":"::ffff:127.0.0.1","lid":0,"mtu":1024,"why":")" +
                                 now.why + "\"}")
      << f;
  EXPECT_NE(now.why.find("GID 3"), std::string::npos) << now.why;
  EXPECT_NE(rdmaOf(f, "lo"), before);
  EXPECT_TRUE(src.takeChanged()) << "a GID re-choice changes no link, and must still rewrite the state file";
  EXPECT_NE(rdmaOf(f, "eth1").find(R"("gid_index":1,)"), std::string::npos) << "the other NIC's GID did not change: " << f;
  rt.transport = nullptr;
}

}  // namespace
}  // namespace railover

// ---- NCCL's device properties from the HCA port (Transport::deviceProps, applyDeviceProps) ----
namespace railover {
namespace {

using rdmatest::portOf;

// The rate codes of ibv_port_attr (IBTA PortInfo) to Mbps, with the per-lane rates NCCL's IB
// transport uses; codes outside the encodings give 0 (unknown), never a guess.
TEST(RdmaDeviceProps, APortsRateIsItsLaneRateTimesItsWidth) {
  EXPECT_EQ(verbs::portSpeedMbps(1, 1), 2500);      // SDR 1x
  EXPECT_EQ(verbs::portSpeedMbps(4, 2), 40000);     // QDR 4x
  EXPECT_EQ(verbs::portSpeedMbps(8, 2), 40000);     // FDR10 4x
  EXPECT_EQ(verbs::portSpeedMbps(16, 16), 28000);   // FDR 2x
  EXPECT_EQ(verbs::portSpeedMbps(32, 2), 100000);   // EDR 4x
  EXPECT_EQ(verbs::portSpeedMbps(64, 2), 200000);   // HDR 4x
  EXPECT_EQ(verbs::portSpeedMbps(128, 2), 400000);  // NDR 4x
  EXPECT_EQ(verbs::portSpeedMbps(128, 8), 1200000); // NDR 12x
  EXPECT_EQ(verbs::portSpeedMbps(64, 4), 400000);   // HDR 8x
  EXPECT_EQ(verbs::portSpeedMbps(0, 2), 0);
  EXPECT_EQ(verbs::portSpeedMbps(3, 2), 0);
  EXPECT_EQ(verbs::portSpeedMbps(32, 0), 0);
  EXPECT_EQ(verbs::portSpeedMbps(32, 3), 0);
}

// The port choice reads the rate of an ACTIVE port, and none of a DOWN one.
TEST(RdmaDeviceProps, ThePortChoiceReadsTheRateOfAnActivePortOnly) {
  std::vector<ibv_gid_entry> t0;
  verbs::PortSel cur;
  ASSERT_NO_FATAL_FAILURE(chooseLoGid(&t0, &cur));
  EXPECT_EQ(cur.speedMbps, 0) << "the fake's port reports no rate codes until told";
  ::fake::setPortRate("fake0", 1, 32, 2);  // EDR 4x
  std::string err;
  ASSERT_EQ(verbs::choosePortForNetdev("lo", IbConfig{}, &cur, &err), verbs::PortChoice::kChosen) << err;
  EXPECT_EQ(cur.speedMbps, 100000);
  ::fake::setPortState("fake0", 1, IBV_PORT_DOWN);
  ASSERT_EQ(verbs::choosePortForNetdev("lo", IbConfig{}, &cur, &err), verbs::PortChoice::kChosenDown) << err;
  EXPECT_EQ(cur.speedMbps, 0);
}

// Two NICs on two PCI functions of one adapter (fake0 and fake1, one sys_image_guid, two ports
// each): one guid, ports numbered apart (fake1's port 1 after fake0's two ports), as NCCL's IB
// transport numbers them, so NCCL's topology sees two physical ports and not one shared one.
// maxComms: max_qp over the QPs every comm puts on the HCA (NCCL_IB_QPS_PER_CONNECTION QPs per
// path, one path per NIC). What the transport does not know keeps the NIC's value.
TEST(RdmaDeviceProps, OneAdaptersFunctionsShareItsGuidAndNumberTheirPortsApart) {
  ::fake::reset();
  const uint64_t guid = 0x0c42a1030012ab34ULL;
  ::fake::setDeviceAttrs("fake0", guid, 1000);
  ::fake::setDeviceAttrs("fake1", guid, 1000);
  verbs::PortSel a = portOf("fake0", 1), b = portOf("fake1", 1);
  a.speedMbps = 200000;  // b never read ACTIVE: 0
  fake::FakeTransport boot;
  IbConfig ib;
  ib.qpsPerConnection = 2;
  std::string err;
  rdma::RdmaTransport t({a, b}, &boot, &err, ib);
  ASSERT_TRUE(t.ok()) << err;
  Transport::DeviceProps p0, p1, none;
  ASSERT_TRUE(t.deviceProps(0, &p0));
  ASSERT_TRUE(t.deviceProps(1, &p1));
  EXPECT_FALSE(t.deviceProps(2, &none));
  EXPECT_FALSE(t.deviceProps(-1, &none));
  EXPECT_EQ(p0.guid, htobe64(guid)) << "NCCL's IB transport reports the GUID's network-order bytes";
  EXPECT_EQ(p1.guid, htobe64(guid));
  EXPECT_EQ(p0.port, 1);
  EXPECT_EQ(p1.port, 3) << "fake1 port 1 comes after fake0's two ports";
  EXPECT_EQ(p0.speedMbps, 200000);
  EXPECT_EQ(p1.speedMbps, 0);
  EXPECT_EQ(p0.maxComms, 1000 / (2 * 2));
  EXPECT_EQ(p0.pciPath, "") << "a fake HCA has no /sys/class/infiniband entry";
  EXPECT_NE(p0.why.find("fake0 port 1: sys_image_guid 0x0c42a1030012ab34, max_qp 1000, rate 200000 Mbps"),
            std::string::npos)
      << p0.why;

  std::vector<Nic> nics = {testbed::makeNic(0, "eth1", "10.0.1.1"), testbed::makeNic(1, "eth2", "10.0.2.1")};
  nics[1].speedMbps = 25000, nics[1].pciPath = "/sys/devices/pci0000:00/0000:00:03.0";
  applyDeviceProps(t, &nics);
  EXPECT_EQ(nics[0].guid, htobe64(guid));
  EXPECT_EQ(nics[0].port, 1);
  EXPECT_EQ(nics[0].speedMbps, 200000);
  EXPECT_EQ(nics[0].maxComms, 250);
  EXPECT_EQ(nics[1].port, 3);
  EXPECT_EQ(nics[1].speedMbps, 25000) << "an unknown rate keeps the NIC's";
  EXPECT_EQ(nics[1].pciPath, "/sys/devices/pci0000:00/0000:00:03.0") << "no HCA PCI path keeps the NIC's";
}

// Two adapters (two guids): each numbers its own ports; a huge max_qp is capped at 65536; an
// HCA whose query says nothing (guid 0, max_qp 0) keeps the NIC's guid and maxComms.
TEST(RdmaDeviceProps, TwoAdaptersEachNumberTheirOwnPortsAndAnUnknownGuidKeepsTheNics) {
  ::fake::reset();
  ::fake::setDeviceAttrs("fake0", 0x1111, 1 << 24);
  ::fake::setDeviceAttrs("fake1", 0x2222, 1 << 24);
  fake::FakeTransport boot;
  std::string err;
  {
    rdma::RdmaTransport t({portOf("fake1", 2), portOf("fake0", 1)}, &boot, &err);
    ASSERT_TRUE(t.ok()) << err;
    Transport::DeviceProps p0, p1;
    ASSERT_TRUE(t.deviceProps(0, &p0));
    ASSERT_TRUE(t.deviceProps(1, &p1));
    EXPECT_EQ(p0.guid, htobe64(0x2222));
    EXPECT_EQ(p0.port, 2);
    EXPECT_EQ(p1.guid, htobe64(0x1111));
    EXPECT_EQ(p1.port, 1);
    EXPECT_EQ(p0.maxComms, 65536);
  }
  ::fake::reset();  // no attributes: the query answers zeros
  rdma::RdmaTransport t({portOf("fake0", 1), portOf("fake1", 1)}, &boot, &err);
  ASSERT_TRUE(t.ok()) << err;
  std::vector<Nic> nics = {testbed::makeNic(0, "eth1", "10.0.1.1"), testbed::makeNic(1, "eth2", "10.0.2.1")};
  nics[0].guid = 0x7261696c00000000ULL, nics[1].guid = 0x7261696c00000001ULL;
  applyDeviceProps(t, &nics);
  EXPECT_EQ(nics[0].guid, 0x7261696c00000000ULL);
  EXPECT_EQ(nics[1].guid, 0x7261696c00000001ULL);
  EXPECT_EQ(nics[0].port, 1);
  EXPECT_EQ(nics[1].port, 1) << "no guid: no adapter to number the ports within";
  EXPECT_EQ(nics[0].maxComms, 65536);
}

}  // namespace
}  // namespace railover
