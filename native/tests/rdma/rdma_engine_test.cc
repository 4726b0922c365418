// Both engines over the RDMA transport: a real SendLink and a real RecvLink (failover/link.h)
// of one comm, each on the RDMA transport's paths over the fake verbs provider
// (tests/verbs/fake_verbs.h), driven as NCCL drives them (isend/irecv/test), with faults
// injected between the calls: QP errors on either end, partial delivery, paths cut while a
// RESUME is in flight, several QPs per path, grouped receives. Every byte of every message is
// checked in the buffer the engine chose, the bytes after it are checked untouched, and a send
// that completes is checked against the receive buffer at that moment (a send completes only
// when the receiver holds the whole message).
//
// The bed: one transport plays both processes (NIC 0 = fake0 port 1, NIC 1 = fake1 port 1).
// The sender's path 0 (its primary) goes from NIC 0 to the receiver's NIC 1, path 1 (the
// standby) from NIC 1 to the receiver's NIC 0, so a failover changes both ends' HCAs. The fake
// bootstrap streams are routed to the RecvLink by the test (the acceptor's part); the fake
// wire between two QPs is carried by step() only between QPs connected to each other.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../verbs/fake_verbs.h"
#include "common/clock.h"
#include "common/tuning.h"
#include "failover/link.h"
#include "tests/fake_net.h"
#include "tests/rdma/rdma_test_ports.h"
#include "tests/scripted_health.h"
#include "tests/test_nic.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/wire.h"

namespace railover {
namespace {

using rdmatest::addrOf;
using rdmatest::portOf;

constexpr const char* kIp[2] = {"10.0.0.1", "10.0.1.1"};
constexpr uint64_t kSecret = 0x5eed;
constexpr uint8_t kCanary = 0xA5;

class RdmaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::fake::reset();
    boot.nicAddr = {kIp[0], kIp[1]};
    std::string err;
    ib.qpsPerConnection = lanes;
    t = std::make_unique<rdma::RdmaTransport>(std::vector<verbs::PortSel>{portOf("fake0", 1), portOf("fake1", 1)},
                                              &boot, &err, ib);
    ASSERT_TRUE(t->ok()) << err;
    nics = {testbed::makeNic(0, "n0", kIp[0], 0), testbed::makeNic(1, "n1", kIp[1], 1)};
    cfg.nStreams = 1;
    cfg.minChunkBytes = 128;
    cfg.maxChunkBytes = 1024;  // messages of several chunks
    cfg.fatalTimeoutS = 0;     // the test decides when the comm is lost
    cfg.holdDownMs = holdDownMs;
    cfg.backoffMaxMs = 20;
    cfg.maxRecvs = maxRecvs;
    deps.cfg = &cfg, deps.nics = &nics, deps.ports = &ports, deps.transport = t.get(), deps.health = nullptr;
    PeerHandle h;
    h.secret = kSecret;
    h.transport = "rdma";
    h.primary = 0;
    h.naddr = 2;
    h.addrs[0].rail = 0, h.addrs[0].addr = addrOf(kIp[1], 5000), h.addrs[0].len = sizeof(sockaddr_in);
    h.addrs[1].rail = 1, h.addrs[1].addr = addrOf(kIp[0], 5000), h.addrs[1].len = sizeof(sockaddr_in);
    send.reset(SendLink::create(deps, 0, h, &err));
    ASSERT_TRUE(send) << err;
    recv = std::make_unique<RecvLink>(deps, kSecret, send->connId, 1);
    txb.assign(8 << 20, 0);
    rxb.assign(8 << 20, kCanary);
    smr = reg(txb);
    rmr = reg(rxb);
  }
  void TearDown() override {
    if (t && fencesHeld) holdFences(false);
    if (send) send->close();
    if (recv) recv->close();
    settle();
    send.reset();
    recv.reset();
    settle();
    for (void* m : mrs) t->deregMr(m);
    settle();
  }
  void* reg(std::vector<uint8_t>& b) { return rdmatest::regBuffer(*t, b, mrs); }
  // Waits for what the links handed to the worker and the fence threads (the fake provider is
  // driven from the test thread between the calls); not for held fences (holdFences()).
  bool fencesHeld = false;
  void settle() {
    if (!fencesHeld) t->fencer().joinAll();
    t->sendFencer().drain();
    t->worker().drain();
  }
  void holdFences(bool h) {
    fencesHeld = h;
    t->fencer().hold(h);
  }

  // The acceptor's part: every bootstrap stream whose HELLO is in goes to the RecvLink.
  // Until the sender's primary path first connected, a standby's stream waits here (held): the
  // comm then starts on the primary however slow its first connects are. (Under
  // ThreadSanitizer on a loaded host a round can take over a second; a primary attempt timed
  // out after 3 s, the standby's retry got through first, and the comm ran on the standby with
  // no failback before the tests' 60 s hold-down.)
  void route() {
    if (!held.empty() && primaryUp()) {
      for (Held& x : held) ASSERT_TRUE(recv->offerStream(x.server, x.sh, x.clientAddr, x.remoteNic));
      held.clear();
    }
    for (size_t i = 0; i < boot.pending.size();) {
      auto& p = boot.pending[i];
      if (p.in->q.size() < wire::kFrameBytes) {
        ++i;
        continue;
      }
      uint8_t hb[wire::kFrameBytes];
      std::string err;
      ASSERT_EQ(p.server->read(hb, sizeof hb, &err), (ssize_t)sizeof hb);
      wire::Hello h;
      ASSERT_TRUE(wire::decodeHello(hb, &h, &err)) << err;
      StreamHello sh;
      sh.id.secret = h.secret, sh.id.connId = h.connId, sh.id.pathIndex = h.path, sh.id.srcRail = h.srcRail;
      sh.id.generation = h.generation, sh.id.probePort = h.probePort;
      sh.stream = h.stream, sh.nStreams = h.nStreams;
      if (h.path != 0 && !primaryUp())
        held.push_back({std::move(p.server), sh, p.clientAddr, p.remoteNic});
      else
        ASSERT_TRUE(recv->offerStream(p.server, sh, p.clientAddr, p.remoteNic));
      boot.pending.erase(boot.pending.begin() + (long)i);
    }
  }
  // Whether the sender's primary has connected at least once in this test.
  bool primaryUp() {
    if (!primaryWasUp && (send->paths[0].state == PathState::kStandby || send->paths[0].state == PathState::kActive))
      primaryWasUp = true;
    return primaryWasUp;
  }
  struct Held {
    std::unique_ptr<Conn> server;
    StreamHello sh;
    sockaddr_storage clientAddr;
    int remoteNic;
  };
  std::vector<Held> held;
  bool primaryWasUp = false;

  // The QPs of the sender's path i and of the receiver's path i, when they are connected to
  // each other (the same generation at both ends), lane by lane.
  bool pairOf(int i, std::vector<ibv_qp*>* s, std::vector<ibv_qp*>* r) {
    if ((size_t)i >= send->paths.size() || (size_t)i >= recv->paths.size()) return false;
    if (!send->paths[i].tx || !recv->paths[i].rx) return false;
    *s = rdma::pathQps(send->paths[i].tx.get());
    *r = rdma::pathQps(recv->paths[i].rx.get());
    if (s->empty() || s->size() != r->size()) return false;
    for (size_t k = 0; k < s->size(); ++k)
      if (::fake::qpPath((*s)[k]).destQpn != (*r)[k]->qp_num || ::fake::qpPath((*r)[k]).destQpn != (*s)[k]->qp_num)
        return false;
    return true;
  }

  // One round: the wire of every path not cut carries what is posted (both ways), both links
  // run as their sweeper and NCCL's calls would.
  // cut: nothing moves either way; cutData: only the receiver's messages (advertisements,
  // ACKs, RESUME_ACKs) reach the sender.
  // The QPs of a path are carried in turn, lane 0 first and last every other round (RC orders
  // one QP's operations only: a PART may come before or after lane 0's end of its message).
  bool cut[2] = {false, false}, cutData[2] = {false, false};
  uint64_t rounds = 0;
  void step() {
    route();
    ++rounds;
    for (int i = 0; i < 2; ++i) {
      std::vector<ibv_qp*> s, r;
      if (cut[i] || !pairOf(i, &s, &r)) continue;
      for (size_t j = 0; j < s.size(); ++j) {
        size_t k = rounds % 2 ? s.size() - 1 - j : j;
        if (!cutData[i]) ::fake::deliver(s[k], r[k]);
        ::fake::deliver(r[k], s[k]);
      }
    }
    send->sweep();
    settle();
    static_cast<Link&>(*recv).idleSweep(nowUs() + 1000 * 1000);  // the sweeper's idle pass (as if NCCL had been away)
    settle();
    recv->ready();
    settle();
    recv->sweep();
    settle();
  }

  // Traffic: messages in send order (seq = index), receives in post order.
  struct Msg {
    uint64_t size = 0;
    int tag = 0;
    uint64_t off = 0;  // in txb
    void* req = nullptr;
    bool posted = false, done = false;
    int recvIdx = -1, buf = -1;  // where the receiver's engine must put it
    bool ring = false, verified = false;  // endless traffic: checked when its receive is done
  };
  struct Recv {
    std::vector<uint64_t> caps;
    std::vector<int> tags;
    std::vector<uint64_t> at;  // offsets in rxb
    uint64_t firstSeq = 0;
    void* req = nullptr;
    bool posted = false, done = false;
    bool ring = false;  // endless traffic (its buffer is used again)
    int sizes[kMaxRecvs] = {0};
  };
  std::vector<Msg> msgs;
  std::vector<Recv> recvs;
  uint64_t txAt = 0, rxAt = 0;
  static uint8_t pat(uint64_t seq, uint64_t i) { return (uint8_t)(seq * 131 + i * 7 + (i >> 8) + 1); }

  // A receive of caps.size() buffers (tags); returns its index.
  int addRecv(const std::vector<uint64_t>& caps, const std::vector<int>& tags) {
    Recv r;
    r.caps = caps, r.tags = tags;
    r.firstSeq = recvs.empty() ? 0 : recvs.back().firstSeq + recvs.back().caps.size();
    for (uint64_t c : caps) {
      r.at.push_back(rxAt);
      rxAt += c + 64;  // canary bytes after each buffer
    }
    EXPECT_LE(rxAt, rxb.size());
    recvs.push_back(r);
    return (int)recvs.size() - 1;
  }
  // The message of seq msgs.size(): `size` bytes with `tag`, for receive `ri`'s buffer `buf`.
  void addMsg(uint64_t size, int tag, int ri, int buf) {
    Msg m;
    m.size = size, m.tag = tag, m.off = txAt, m.recvIdx = ri, m.buf = buf;
    uint64_t seq = msgs.size();
    for (uint64_t i = 0; i < size; ++i) txb[txAt + i] = pat(seq, i);
    txAt += size + 8;
    EXPECT_LE(txAt, txb.size());
    msgs.push_back(m);
  }
  // Single receives: one per message, cap bytes each.
  void singles(const std::vector<uint64_t>& sizes, uint64_t cap) {
    for (uint64_t s : sizes) {
      int ri = addRecv({cap}, {7});
      addMsg(s, 7, ri, 0);
    }
  }

  // Whether message k is whole in its buffer now.
  bool holds(size_t k) {
    const Msg& m = msgs[k];
    const uint8_t* b = rxb.data() + recvs[m.recvIdx].at[m.buf];
    for (uint64_t i = 0; i < m.size; ++i)
      if (b[i] != pat(k, i)) return false;
    return true;
  }

  // NCCL's calls: posts what the window allows (receives first), tests what is outstanding.
  // `recvWindow`: receives posted ahead. A send completing is checked against the receive
  // buffer (sendCompletedEarly counts violations).
  int recvWindow = 4;
  int sendCompletedEarly = 0;
  ncclResult_t firstErr = ncclSuccess;
  std::string firstErrWhere;
  // endless: NCCL keeps posting (single receives of 2 KiB, one message each), 4 ahead, in a
  // ring of kRing buffers at the end of txb/rxb; each message is checked when its receive is
  // done (then its buffers may be used again).
  static constexpr int kRing = 64;
  static constexpr uint64_t kRingSlot = 2048 + 64;
  bool endless = false;
  int ringBad = 0;
  void addRingMsg() {
    size_t k = msgs.size();
    uint64_t slot = (uint64_t)(k % kRing) * kRingSlot;
    Recv r;
    r.caps = {2048}, r.tags = {7}, r.ring = true;
    r.firstSeq = recvs.empty() ? 0 : recvs.back().firstSeq + recvs.back().caps.size();
    r.at = {rxb.size() - kRing * kRingSlot + slot};
    std::fill(rxb.begin() + (long)r.at[0], rxb.begin() + (long)(r.at[0] + kRingSlot), kCanary);
    recvs.push_back(r);
    Msg m;
    m.size = (k * 389) % 2049, m.tag = 7, m.off = txb.size() - kRing * kRingSlot + slot, m.recvIdx = (int)recvs.size() - 1,
    m.buf = 0, m.ring = true;
    for (uint64_t i = 0; i < m.size; ++i) txb[m.off + i] = pat(k, i);
    msgs.push_back(m);
  }
  void nccl() {
    if (endless) {
      size_t open = 0;
      for (const Msg& m : msgs) open += !m.done;
      while (open < 4 && (msgs.size() < kRing || msgs[msgs.size() - kRing].verified)) addRingMsg(), ++open;
    }
    size_t doneRecvs = 0;
    while (doneRecvs < recvs.size() && recvs[doneRecvs].done) ++doneRecvs;
    for (size_t j = doneRecvs; j < recvs.size() && j < doneRecvs + (size_t)recvWindow; ++j) {
      Recv& r = recvs[j];
      if (r.posted) continue;
      if (j > 0 && !recvs[j - 1].posted) break;
      void* data[kMaxRecvs];
      void* mh[kMaxRecvs];
      uint64_t c[kMaxRecvs];
      int tg[kMaxRecvs];
      for (size_t b = 0; b < r.caps.size(); ++b) data[b] = rxb.data() + r.at[b], mh[b] = rmr, c[b] = r.caps[b], tg[b] = r.tags[b];
      ncclResult_t rc = recv->irecv((int)r.caps.size(), data, c, tg, &r.req, mh);
      note(rc, "irecv");
      r.posted = r.req != nullptr;
      settle();
    }
    for (size_t k = 0; k < msgs.size(); ++k) {
      Msg& m = msgs[k];
      if (m.posted) continue;
      if (k > 0 && !msgs[k - 1].posted) break;
      ncclResult_t rc = send->isend(txb.data() + m.off, m.size, m.tag, &m.req, smr);
      note(rc, "isend");
      m.posted = m.req != nullptr;
      settle();
      if (!m.posted) break;
    }
    for (size_t k = 0; k < msgs.size(); ++k) {
      Msg& m = msgs[k];
      if (!m.posted || m.done) continue;
      int done = 0, size = 0;
      note(send->test((SendReq*)m.req, &done, &size), "send test");
      settle();
      if (done) {
        m.done = true;
        if (!holds(k)) ++sendCompletedEarly;
      }
    }
    for (Recv& r : recvs) {
      if (!r.posted || r.done) continue;
      int done = 0;
      note(recv->test((RecvReq*)r.req, &done, r.sizes), "recv test");
      settle();
      r.done = done != 0;
    }
    for (size_t k = 0; k < msgs.size(); ++k) {
      Msg& m = msgs[k];
      if (!m.ring || m.verified || !m.done || !recvs[m.recvIdx].done) continue;
      const uint8_t* b = rxb.data() + recvs[m.recvIdx].at[0];
      if (!holds(k) || (uint64_t)recvs[m.recvIdx].sizes[0] != m.size || b[m.size] != kCanary) ++ringBad;
      m.verified = true;
    }
  }
  void note(ncclResult_t rc, const char* where) {
    if (rc != ncclSuccess && firstErr == ncclSuccess) firstErr = rc, firstErrWhere = where;
  }
  bool allDone() const {
    for (const Msg& m : msgs)
      if (!m.done) return false;
    for (const Recv& r : recvs)
      if (!r.done) return false;
    return true;
  }
  // Runs NCCL's calls and rounds until `until` holds (everything is done when it is empty),
  // for at most `seconds` (a generous bound: reconnects wait their back-off).
  bool run(const std::function<bool()>& until = nullptr, int seconds = 10) {
    uint64_t deadline = nowUs() + (uint64_t)seconds * 1000 * 1000;
    while (nowUs() < deadline) {
      if (until ? until() : allDone()) return true;
      if (firstErr != ncclSuccess) return false;
      nccl();
      step();
    }
    return until ? until() : allDone();
  }
  // Every message in its buffer, every byte; the reported sizes; the canaries after each
  // buffer untouched; no send completed before its message was whole at the receiver.
  void expectAllDelivered() {
    ASSERT_EQ(firstErr, ncclSuccess) << "NCCL saw an error from " << firstErrWhere;
    ASSERT_TRUE(allDone());
    EXPECT_EQ(sendCompletedEarly, 0) << "a send completed before the receiver held its message";
    EXPECT_EQ(ringBad, 0) << "messages of the endless traffic not whole in their buffers";
    for (size_t k = 0; k < msgs.size(); ++k) {
      const Msg& m = msgs[k];
      if (m.ring) continue;
      EXPECT_TRUE(holds(k)) << "message " << k << " not whole in its buffer";
      EXPECT_EQ((uint64_t)recvs[m.recvIdx].sizes[m.buf], m.size) << "message " << k << "'s size";
    }
    for (const Recv& r : recvs)
      for (size_t b = 0; b < r.caps.size() && !r.ring; ++b) {
        uint64_t used = 0;
        for (size_t k = 0; k < msgs.size(); ++k)
          if (&recvs[msgs[k].recvIdx] == &r && msgs[k].buf == (int)b) used = msgs[k].size;
        const uint8_t* p = rxb.data() + r.at[b];
        for (uint64_t i = used; i < r.caps[b] + 64; ++i)
          ASSERT_EQ(p[i], kCanary) << "written past buffer " << b << " of a receive at byte " << i;
      }
  }

  // The state of the comm, for a failure's message.
  std::string info() {
    std::string o = "NCCL error " + std::to_string((int)firstErr) + " from " + firstErrWhere + "; sender active " +
                    std::to_string(send->active) + " state " + std::to_string((int)send->state()) + ", receiver active " +
                    std::to_string(recv->active) + " state " + std::to_string((int)recv->state()) + "; sends done";
    size_t sd = 0, sp = 0, rd = 0, rp = 0;
    for (const Msg& m : msgs) sd += m.done, sp += m.posted;
    for (const Recv& r : recvs) rd += r.done, rp += r.posted;
    o += " " + std::to_string(sd) + "/" + std::to_string(sp) + "/" + std::to_string(msgs.size()) + ", receives done " +
         std::to_string(rd) + "/" + std::to_string(rp) + "/" + std::to_string(recvs.size());
    for (size_t i = 0; i < send->paths.size(); ++i) o += "; send path " + std::to_string(i) + " " + std::to_string((int)send->paths[i].state) + " " + send->paths[i].lastError + " next attempt in " + std::to_string((long long)send->paths[i].nextAttemptUs - (long long)nowUs()) + " us";
    for (size_t i = 0; i < recv->paths.size(); ++i) o += "; recv path " + std::to_string(i) + " " + std::to_string((int)recv->paths[i].state) + " " + recv->paths[i].lastError;
    return o;
  }
  // Waits for the comm to be running on path `i` at both ends.
  // The failure names the comm's state (info()).
  testing::AssertionResult runningOn(int i) {
    if (run([&] {
          return send->active == i && send->state() == LinkState::kRunning && recv->active == i &&
                 recv->state() == LinkState::kRunning;
        }))
      return testing::AssertionSuccess();
    return testing::AssertionFailure() << "not running on path " << i << " at both ends: " << info();
  }


  // Runs NCCL's calls and the sender's idle passes (its standby connects move on there once
  // the comm is idle) until send path `i` is a connected standby.
  testing::AssertionResult standbyUp(size_t i) {
    if (run([&] {
          static_cast<Link&>(*send).idleSweep(nowUs() + 1000 * 1000);
          settle();
          return send->paths[i].state == PathState::kStandby;
        }))
      return testing::AssertionSuccess();
    return testing::AssertionFailure() << "send path " << i << " is no connected standby: " << info();
  }

  // The sender's health view (the bed has none): a scripted one with every path's pair
  // registered, installed for as long as this lives. nic0/peer0: the primary's pair.
  struct SenderHealth {
    fake::ScriptedHealth health;
    SendLink& l;
    int nic0 = -1;
    std::string peer0;
    explicit SenderHealth(SendLink& link) : l(link) {
      l.deps.health = &health;
      for (Path& p : l.paths) p.pairId = health.registerPair(p.localNic, p.remote, p.remoteLen);
      nic0 = l.paths[0].localNic;
      peer0 = health.pairs[l.paths[0].pairId].remote;
    }
    ~SenderHealth() { l.deps.health = nullptr; }
  };

  // Only the sender's sweeper runs, every 10 ms, for `us` µs: the receiver's threads are away.
  // `acceptor`: its acceptor thread (not the receiver's) still offers the streams (route());
  // `!acceptor`: nothing waits for the worker either (a test that holds it).
  // `until` (optional) ends it early.
  void senderAloneFor(uint64_t us, bool acceptor, const std::function<bool()>& until = nullptr) {
    const uint64_t end = nowUs() + us;
    while (nowUs() < end && !(until && until())) {
      if (acceptor) {
        route();
        settle();
      }
      send->sweep();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the sweeper's pace
    }
  }

  // The standby (send path 1)'s NIC goes down in `health`, and only the sender's sweeper runs
  // until the standby has failed.
  testing::AssertionResult failStandbyByItsNic(fake::ScriptedHealth& health) {
    health.setNic(send->paths[1].localNic, false);
    senderAloneFor(10000000, true, [&] { return send->paths[1].state == PathState::kFailed; });
    if (send->paths[1].state == PathState::kFailed) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "the standby did not fail with its NIC down: " << info();
  }

  // The comm is idle and only the sender's sweeper runs (idle passes every 10 ms) for `us`
  // µs or until `until`: the receiver's threads are away, its acceptor offers the streams.
  void idleSenderAloneFor(uint64_t us, const std::function<bool()>& until) {
    const uint64_t end = nowUs() + us;
    while (nowUs() < end && !until()) {
      route();
      settle();
      static_cast<Link&>(*send).idleSweep(nowUs() + 1000 * 1000);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the sweeper's pace
    }
  }

  // Holds the transport's worker with a job that waits (as behind another comm's bring-ups)
  // until release() or the end of the scope; the destructor waits for the job to end.
  struct WorkerHold {
    std::mutex mu;
    std::condition_variable cv;
    bool released = false, ended = false;
    explicit WorkerHold(rdma::Worker& w) {
      w.postBringUp([this] {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [this] { return released; });
        ended = true;
        cv.notify_all();
      });
    }
    void release() {
      std::lock_guard<std::mutex> g(mu);
      released = true;
      cv.notify_all();
    }
    ~WorkerHold() {
      release();
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [this] { return ended; });
    }
  };

  // The QPs of the sender's / receiver's path i now (empty: none connected).
  std::vector<ibv_qp*> sqs(int i) { return send->paths[i].tx ? rdma::pathQps(send->paths[i].tx.get()) : std::vector<ibv_qp*>{}; }
  std::vector<ibv_qp*> rqs(int i) { return recv->paths[i].rx ? rdma::pathQps(recv->paths[i].rx.get()) : std::vector<ibv_qp*>{}; }
  // Rounds in which nothing the sender posts moves (it stays on its QPs); the receiver's
  // advertisements and ACKs still reach the sender.
  void stepsCut(int n) {
    bool was[2] = {cutData[0], cutData[1]};
    cutData[0] = cutData[1] = true;
    for (int i = 0; i < n; ++i) nccl(), step();
    cutData[0] = was[0], cutData[1] = was[1];
  }

  // A send larger than its receive resent on the standby after a failover (the tests below).
  void truncatedSendResentAfterAFailover() {
    singles({4096, 100, 3000, 0, 4096, 1}, 4096);
    int big = addRecv({2000}, {7});
    addMsg(2001, 7, big, 0);
    ASSERT_TRUE(runningOn(0));
    ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
    stepsCut(4);
    std::vector<ibv_qp*> s = sqs(0), r = rqs(0);
    ::fake::deliver(s[0], r[0], 1);
    ::fake::fail(s[0], IBV_WC_RETRY_EXC_ERR);
    ASSERT_FALSE(run()) << "the truncated receive completed";
    EXPECT_EQ(firstErr, ncclInvalidUsage) << info();
    EXPECT_EQ(firstErrWhere, "recv test");
    EXPECT_EQ(send->counters.failovers, 1u);
    for (size_t k = 0; k + 1 < msgs.size(); ++k) {
      EXPECT_TRUE(recvs[msgs[k].recvIdx].done) << "message " << k;
      EXPECT_TRUE(holds(k)) << "message " << k;
    }
    const uint8_t* b = rxb.data() + recvs[big].at[0];
    for (uint64_t i = 0; i < 2000 + 64; ++i) ASSERT_EQ(b[i], kCanary) << "the refused message wrote byte " << i;
    EXPECT_FALSE(msgs.back().done) << "the truncated send completed";
    EXPECT_FALSE(send->isFatal());
    EXPECT_FALSE(recv->isFatal());
    EXPECT_EQ(send->paths[send->active].state, PathState::kActive) << "the refusal is not a path fault";
  }

  fake::FakeTransport boot;
  IbConfig ib;
  int lanes = 1;
  uint32_t maxRecvs = 1;
  uint32_t holdDownMs = 60000;  // no failback unless a test wants one
  std::unique_ptr<rdma::RdmaTransport> t;
  Config cfg;
  std::vector<Nic> nics;
  std::vector<uint16_t> ports{40000, 40001};
  LinkDeps deps;
  std::unique_ptr<SendLink> send;
  std::unique_ptr<RecvLink> recv;
  std::vector<uint8_t> txb, rxb;
  void* smr = nullptr;
  void* rmr = nullptr;
  std::vector<void*> mrs;
};

// The bed itself: both engines come up on the primary and move a mix of sizes (empty, one
// byte, exactly the buffer, several chunks) with every byte checked.
TEST_F(RdmaEngineTest, MessagesOfEverySizeArriveWholeOverTheEngines) {
  singles({0, 1, 1024, 4096, 4095, 3, 4096, 0}, 4096);
  ASSERT_TRUE(runningOn(0) || allDone());
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->active, 0);
}

// The primary's send QP fails in the middle of the traffic, after part of what it carried
// reached the receiver (a message half-written): the sender fails over, the receiver fences
// the primary and the rest is resent whole on the standby.
TEST_F(RdmaEngineTest, ASenderQpErrorMidMessageFailsOverAndResendsWhole) {
  singles({5000, 4096, 3000, 0, 8192, 777, 4000, 1, 2048, 8192}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(4);
  std::vector<ibv_qp*> s = sqs(0), r = rqs(0);
  ASSERT_FALSE(s.empty());
  ASSERT_GE(::fake::outstanding(s[0]).size(), 3u) << "chunks of the next messages wait on the primary";
  ::fake::deliver(s[0], r[0], 2);  // part of a message lands
  ::fake::fail(s[0], IBV_WC_RETRY_EXC_ERR);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->active, 1);
  EXPECT_FALSE(send->isFatal());
  EXPECT_FALSE(recv->isFatal());
}

// The receiver's QP of the primary fails (its ACK is not acknowledged): the receiver drops the
// path, the sender learns it from the bootstrap stream and fails over.
TEST_F(RdmaEngineTest, AReceiverQpErrorFailsOverWithoutLoss) {
  singles({4096, 100, 8192, 0, 5000, 4096, 1, 3333}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[0].done; })) << info();
  // Deliver the sender's writes but not the receiver's answers, so an ACK waits on its QP.
  for (int i = 0; i < 6; ++i) {
    nccl();
    std::vector<ibv_qp*> s = sqs(0), r = rqs(0);
    if (!s.empty() && !r.empty()) ::fake::deliver(s[0], r[0]);
    cut[0] = true;
    step();
    cut[0] = false;
  }
  std::vector<ibv_qp*> r = rqs(0);
  ASSERT_FALSE(r.empty());
  ASSERT_FALSE(::fake::outstanding(r[0]).empty()) << "the receiver's ACK waits on its QP";
  ::fake::fail(r[0], IBV_WC_RETRY_EXC_ERR);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->active, 1);
}

// A second fault during the resume: the primary's QP fails, the sender's RESUME waits on the
// standby's QP, and that QP fails too before it leaves. The primary is reconnected and the
// comm resumes there; nothing is lost and NCCL sees no error.
TEST_F(RdmaEngineTest, TheStandbysQpFailingWhileItsResumeIsInFlightResumesOnTheReconnectedPrimary) {
  singles({5000, 4096, 3000, 0, 8192, 777, 4000, 1, 2048, 8192}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(3);
  std::vector<ibv_qp*> s0 = sqs(0), r0 = rqs(0);
  ::fake::deliver(s0[0], r0[0], 1);
  ::fake::fail(s0[0], IBV_WC_RETRY_EXC_ERR);
  // Until the RESUME is posted on the standby (the wires stay cut).
  bool resumeOnStandby = false;
  for (int i = 0; i < 200 && !resumeOnStandby; ++i) {
    stepsCut(1);
    std::vector<ibv_qp*> s1 = sqs(1);
    resumeOnStandby = send->active == 1 && !s1.empty() && !::fake::outstanding(s1[0]).empty();
  }
  ASSERT_TRUE(resumeOnStandby);
  ::fake::fail(sqs(1)[0], IBV_WC_RETRY_EXC_ERR);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_GE(send->counters.failovers + send->counters.recoveries, 1u);
  EXPECT_FALSE(recv->isFatal());
}

// The old primary comes back while the receiver's answer to the RESUME on the standby waits
// for the primary's fence (held): the standby's QP dies meanwhile (a fatal QP event), the
// sender reconnects the primary and resumes there; the receiver answers only once the old
// primary's fence is done. Every byte lands once.
TEST_F(RdmaEngineTest, ThePrimaryComingBackWhileTheResumeWaitsForItsFenceResumesThereOnceFenced) {
  singles({5000, 4096, 3000, 0, 8192, 777, 4000, 1, 2048, 8192}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(3);
  holdFences(true);
  std::vector<ibv_qp*> s0 = sqs(0), r0 = rqs(0);
  // Read now: once fenced, the worker may destroy the primary's QPs at any time.
  const uint32_t dead0 = s0[0]->qp_num;
  ::fake::deliver(s0[0], r0[0], 1);
  ::fake::fail(s0[0], IBV_WC_RETRY_EXC_ERR);
  // The RESUME reaches the receiver on the standby; its answer waits for the primary's fence.
  bool waiting = false;
  for (int i = 0; i < 300 && !waiting; ++i) {
    nccl(), step();
    waiting = send->active == 1 && recv->paths.size() > 1 && recv->paths[0].state == PathState::kFailed &&
              t->fencer().queued() > 0 && send->state() == LinkState::kResuming;
    if (waiting) {  // the RESUME left and the receiver read it
      std::vector<ibv_qp*> s1 = sqs(1);
      waiting = !s1.empty() && ::fake::outstanding(s1[0]).empty() && recv->active < 0;
    }
  }
  ASSERT_TRUE(waiting) << "the receiver's answer does not wait for the primary's fence";
  cut[1] = true;
  std::vector<ibv_qp*> s1 = sqs(1);
  const uint32_t dead1 = s1[0]->qp_num;
  ::fake::asyncEvent(s1[0]->context, IBV_EVENT_QP_FATAL, 0, s1[0]);
  // The sender gives the standby up, reconnects and resumes on a new path.
  ASSERT_TRUE(run([&] {
    if (send->active < 0 || send->state() != LinkState::kResuming) return false;
    std::vector<ibv_qp*> q = sqs(send->active);
    return !q.empty() && q[0]->qp_num != dead1 && q[0]->qp_num != dead0;
  })) << info();
  for (int i = 0; i < 20; ++i) nccl(), step();
  EXPECT_LT(recv->active, 0) << "answered a RESUME while an old path's fence was held";
  holdFences(false);
  cut[1] = false;
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_FALSE(recv->isFatal());
}

// NCCL stops calling the send comm; then its primary's NIC dies (the sweeper's window fails
// the comm over) and comes back. The sweeper's idle pass alone (SendLink::idleSweep, called
// as the sweeper thread calls it once NCCL has been away) must reconnect the primary over
// RDMA: its bootstrap stream, the worker's creation of its QPs and their bring-up, both ends'
// QPs connected to each other. Before it the path stayed connecting until NCCL's next call.
TEST_F(RdmaEngineTest, AnIdleSendCommReconnectsItsRepairedPrimaryWithoutACall) {
  singles({4096, 100, 8192}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  // The sender's health view (the bed has none): scripted, until the end of the test.
  SenderHealth sh(*send);
  fake::ScriptedHealth& health = sh.health;
  const int nic0 = sh.nic0;
  const std::string peer0 = sh.peer0;
  // Idle from here: no isend, no test; the sweeper's passes and the wire only.
  auto idleUntil = [&](const std::function<bool()>& done) {
    uint64_t deadline = nowUs() + 10ull * 1000 * 1000;
    while (!done() && nowUs() < deadline) {
      step();
      static_cast<Link&>(*send).idleSweep(nowUs() + 1000 * 1000);
      settle();
    }
    return done();
  };
  health.setPair(nic0, peer0, false, true, "local NIC down (test)");
  health.setNic(nic0, false);
  ASSERT_TRUE(idleUntil([&] {
    return send->active == 1 && send->state() == LinkState::kRunning && send->paths[0].state == PathState::kFailed;
  })) << info();
  uint32_t gen = send->paths[0].generation;
  health.setNic(nic0, true);
  health.setPair(nic0, peer0, true, false, "");
  std::vector<ibv_qp*> s, r;
  ASSERT_TRUE(idleUntil([&] { PathState st = send->paths[0].state;
    return (st == PathState::kStandby || st == PathState::kActive) && pairOf(0, &s, &r);
  }))
      << "the repaired primary was not reconnected without an NCCL call: " << info();
  EXPECT_GT(send->paths[0].generation, gen);
  EXPECT_FALSE(send->isFatal());
  EXPECT_FALSE(recv->isFatal());
}

// The receiver answers the verbs bootstrap on its own threads' polls: it reads the sender's
// endpoints, brings its QPs up on its worker and writes its endpoints back. Here its threads
// are away longer than the connect timeout (a proxy thread and the sweeper descheduled on a
// busy host) while the sender polls on time. The receiver's kernel acknowledged the HELLO and
// the endpoints, so the sender waits for the answer (SendPath::connectWaitsOffNetwork) instead of
// failing the attempt after 3 s and starting over with new QPs; both paths then connect in
// their first attempt. Before, both attempts timed out (generation 2).
TEST_F(RdmaEngineTest, AReceiverAwayLongerThanTheConnectTimeoutFailsNoConnectAttempt) {
  singles({4096, 100, 3000}, 4096);
  // Until both attempts have waited past the connect timeout as the engine counts it (late
  // polls on a loaded host count at most 250 ms each: the wall-clock cap is generous).
  senderAloneFor(30000000, true, [&] {
    for (const Path& p : send->paths)
      if (p.offNetWaitedUs <= tuning::kConnectTimeoutUs + 500000) return false;
    return true;
  });
  for (const Path& p : send->paths) {
    EXPECT_EQ(p.state, PathState::kConnecting) << "path " << p.index << ": " << info();
    EXPECT_EQ(p.generation, 1u) << "path " << p.index << " started over: " << info();
    EXPECT_LT(p.connectWaitedUs, tuning::kConnectTimeoutUs) << "path " << p.index;
    EXPECT_GT(p.offNetWaitedUs, tuning::kConnectTimeoutUs) << "path " << p.index << ": its wait was not the peer's";
  }
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  // The standby's connect moves on with the sender's next calls or its idle pass.
  ASSERT_TRUE(standbyUp(1));
  for (const Path& p : send->paths) EXPECT_EQ(p.generation, 1u) << "path " << p.index << ": " << info();
}

// This side's own worker late: the receiver answered at once, but the sender's QP bring-up
// (the worker's RTR/RTS job, posted when the receiver's endpoints arrive) waits 4.5 s behind
// another job, as it would behind thousands of comms' bring-ups at init. That is this host's
// work, not the network's: the attempt does not time out after 3 s.
TEST_F(RdmaEngineTest, ABringUpQueuedOnTheWorkerLongerThanTheConnectTimeoutFailsNoConnectAttempt) {
  singles({4096, 100, 3000}, 4096);
  // The sender's HELLO and endpoints out (one call after its worker created the QPs), then
  // the receiver's calls only: its QPs up and its endpoints back on the primary.
  settle();
  send->sweep();
  const uint64_t deadline = nowUs() + 20ull * 1000 * 1000;
  while (!(recv->paths.size() >= 1 && recv->paths[0].state == PathState::kStandby) && nowUs() < deadline) {
    route();
    settle();
    recv->ready();
    settle();
  }
  ASSERT_TRUE(recv->paths.size() >= 1 && recv->paths[0].state == PathState::kStandby) << info();
  ASSERT_EQ(send->paths[0].state, PathState::kConnecting) << info();
  WorkerHold hold(t->worker());  // the worker is busy with another comm's bring-ups
  senderAloneFor(30000000, false, [&] {
    const Path& p = send->paths[0];
    return p.connectWaitedUs + p.offNetWaitedUs > tuning::kConnectTimeoutUs + 500000;
  });
  for (const Path& p : send->paths) {
    EXPECT_EQ(p.state, PathState::kConnecting) << "path " << p.index << ": " << info();
    EXPECT_EQ(p.generation, 1u) << "path " << p.index << " started over: " << info();
    EXPECT_LT(p.connectWaitedUs, tuning::kConnectTimeoutUs) << "path " << p.index;
  }
  hold.release();
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  for (const Path& p : send->paths) EXPECT_EQ(p.generation, 1u) << "path " << p.index << ": " << info();
}

// The first stage of a reconnect: the worker creates the path's CQ and QPs while the bootstrap
// stream connects. Here the worker is busy for 4.5 s (another comm's bring-ups) when the
// standby's NIC comes back; the bootstrap stream connected at once (the network did its part),
// so the attempt waits for this host's worker (kCreate with the stream up counts as off the
// network) instead of timing out after 3 s and creating its QPs again.
TEST_F(RdmaEngineTest, AQpCreationQueuedOnTheWorkerLongerThanTheConnectTimeoutFailsNoConnectAttempt) {
  singles({4096, 100, 3000}, 4096);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(standbyUp(1));
  SenderHealth sh(*send);
  fake::ScriptedHealth& health = sh.health;
  const int nic1 = send->paths[1].localNic;
  ASSERT_TRUE(failStandbyByItsNic(health));
  const uint32_t gen = send->paths[1].generation;
  WorkerHold hold(t->worker());  // the worker is busy with another comm's bring-ups
  health.setNic(nic1, true);  // the repair: the reconnect starts at once, its QPs queued
  const Path& p1 = send->paths[1];
  // The sweeper's idle passes drive the standby's reconnect (NCCL is not calling; the stage
  // waits for no HELLO yet, and settle() would wait for the worker).
  const uint64_t end = nowUs() + 30000000;
  while (nowUs() < end &&
         !(p1.generation > gen && p1.connectWaitedUs + p1.offNetWaitedUs > tuning::kConnectTimeoutUs + 500000)) {
    static_cast<Link&>(*send).idleSweep(nowUs() + 1000 * 1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the sweeper's pace
  }
  EXPECT_EQ(p1.state, PathState::kConnecting) << info();
  EXPECT_EQ(p1.generation, gen + 1) << "the attempt started over: " << info();
  EXPECT_LT(p1.connectWaitedUs, tuning::kConnectTimeoutUs) << info();
  EXPECT_GT(p1.offNetWaitedUs, tuning::kConnectTimeoutUs) << "the worker's wait counted as the network's: " << info();
  hold.release();
  ASSERT_TRUE(standbyUp(1));
  EXPECT_EQ(p1.generation, gen + 1) << info();
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
}

// The control: a request the network did not deliver (a black hole that takes the HELLO and
// the endpoints: nothing acknowledged) is a fault of the path, and the attempt still times
// out after 3 s, not after the peer's 30 s.
TEST_F(RdmaEngineTest, AConnectWhoseRequestTheNetworkDropsStillTimesOutAfterThreeSeconds) {
  boot.wire(send->paths[0].localNic, addrToString(send->paths[0].remote))->drop = true;
  const uint64_t t0 = send->paths[0].attemptStartUs;  // the attempt began in SetUp
  // Generous: late polls on a loaded host count at most 250 ms each. The 30 s bound's failure
  // reads "connect timed out after 30 s", which the cause check below tells apart.
  const uint64_t deadline = t0 + tuning::kConnectOffNetworkMaxUs + 10000000;
  while (send->paths[0].generation == 1 && send->paths[0].state != PathState::kFailed && nowUs() < deadline) {
    route();
    send->sweep();
    settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LT(nowUs(), deadline) << "the attempt waited past its connect timeout: " << info();
  EXPECT_GE(nowUs() - t0, tuning::kConnectTimeoutUs);
  EXPECT_EQ(send->paths[0].lastError.rfind("connect timed out after 3 s", 0), 0u) << info();
  if (send->paths[0].generation == 1) {  // only the worker's QP creation (kCreate) was off the network
    EXPECT_LT(send->paths[0].offNetWaitedUs, 1000000u) << "an unacknowledged request counted as the peer's wait";
  }
}

// A repair of the pair while an attempt waits for a late receiver: the attempt's request got
// through (the receiver's kernel acknowledged it), so the repair does not restart it, which
// would throw away the QPs both ends built and wait for the same receiver threads again
// (SendLink::restartAfterRepair). A standby's repair after the health layer's soft verdict is
// the normal order once a local NIC's hard verdict ends with the NIC's return.
TEST_F(RdmaEngineTest, ARepairWhileAnAttemptWaitsForALateReceiverDoesNotRestartIt) {
  singles({4096, 100}, 4096);
  SenderHealth sh(*send);
  fake::ScriptedHealth& health = sh.health;
  const int nic0 = sh.nic0;
  const std::string peer0 = sh.peer0;
  // Soft, and no other rail shows the peer alive (no path connected: the receiver's threads
  // are away, as a stopped peer's): the attempt goes on.
  health.setPair(nic0, peer0, false, false, "probe timeout (test)");
  senderAloneFor(30000000, true, [&] { return send->paths[0].waitsOffNetwork; });
  ASSERT_TRUE(send->paths[0].waitsOffNetwork) << info();
  health.setPair(nic0, peer0, true, false, "");  // the repair
  senderAloneFor(30000000, true, [&] { return send->paths[0].repairSeenUs != 0; });
  ASSERT_NE(send->paths[0].repairSeenUs, 0u) << "the repair was not seen: " << info();
  EXPECT_EQ(send->paths[0].generation, 1u) << "the repair restarted the attempt: " << info();
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->paths[0].generation, 1u) << info();
}

// A comm running on its primary whose connected standby (send path 1) then failed with its
// NIC, under a scripted health view (sh; `gen`: the standby's generation then). The tests
// below drive the standby's reconnect once the NIC is back.
class RdmaEngineStandbyReconnectTest : public RdmaEngineTest {
 protected:
  void SetUp() override {
    RdmaEngineTest::SetUp();
    singles({4096, 100}, 4096);
    ASSERT_TRUE(runningOn(0));
    ASSERT_TRUE(standbyUp(1));
    sh = std::make_unique<SenderHealth>(*send);
    ASSERT_TRUE(failStandbyByItsNic(sh->health));
    gen = send->paths[1].generation;
  }
  void TearDown() override {
    sh.reset();
    RdmaEngineTest::TearDown();
  }
  std::unique_ptr<SenderHealth> sh;
  uint32_t gen = 0;
};

// An answer lost to a fault that came after the acknowledgement: the standby's reconnect waits
// off the network for the receiver's endpoints (its request acknowledged, the receiver's
// threads away), and then its rail goes silent (a soft pair verdict: a black hole with no
// carrier or port event) while the peer answers its probes on the active rail. The peer is
// alive, so this rail lost the answer: the attempt fails at once with the pair's cause instead
// of waiting out tuning::kConnectOffNetworkMaxUs (30 s), and the repair of the pair retries it
// at once (restartAfterRepair), so the standby is back as soon as the rail is. The control,
// a soft verdict with no other rail answering (a stopped peer): the attempt goes on
// (ARepairWhileAnAttemptWaitsForALateReceiverDoesNotRestartIt).
TEST_F(RdmaEngineStandbyReconnectTest, AnAttemptWaitingForAnAnswerItsRailLostFailsWhenThePeerAnswersOnAnotherRail) {
  fake::ScriptedHealth& health = sh->health;
  const Path& p1 = send->paths[1];
  const int nic1 = p1.localNic;
  const std::string peer1 = health.pairs[p1.pairId].remote;
  health.setNic(nic1, true);  // its repair: the reconnect starts
  idleSenderAloneFor(30000000, [&] { return p1.generation > gen && p1.waitsForPeer; });
  ASSERT_TRUE(p1.waitsForPeer && p1.pairUpWhenAcked && p1.state == PathState::kConnecting) << info();
  // First the active rail silent too (a stopped peer answers no probe): the attempt waits on.
  health.setAnswering(sh->nic0, sh->peer0, false);
  health.setPair(nic1, peer1, false, false, "probe timeout (test)");  // soft
  int passes = 0;  // 50 idle passes (>= 0.5 s), each a chance for the rule to act
  idleSenderAloneFor(10000000, [&] { return ++passes > 50; });
  ASSERT_EQ(p1.state, PathState::kConnecting) << "a stopped peer's silence ended the attempt: " << info();
  EXPECT_EQ(p1.generation, gen + 1) << info();
  health.setAnswering(sh->nic0, sh->peer0, true);  // the peer answers on the active rail: alive
  idleSenderAloneFor(10000000, [&] { return p1.state != PathState::kConnecting; });
  ASSERT_EQ(p1.state, PathState::kFailed) << "the attempt still waits for an answer its rail lost: " << info();
  EXPECT_EQ(p1.generation, gen + 1) << info();
  EXPECT_NE(p1.lastError.find("probe timeout (test)"), std::string::npos) << p1.lastError;
  EXPECT_NE(p1.lastError.find("the peer answers on another rail"), std::string::npos) << p1.lastError;
  EXPECT_LT(p1.connectWaitedUs + p1.offNetWaitedUs, tuning::kConnectOffNetworkMaxUs) << info();
  // The repair: retried at once, and connected with the receiver's threads back.
  health.setPair(nic1, peer1, true, false, "");
  ASSERT_TRUE(standbyUp(1));
  EXPECT_GE(p1.generation, gen + 2) << info();
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
}

// The control of the rule above for a verdict from before the acknowledgement: the standby's
// pair is already soft-down (probes lost, e.g. the probe port filtered) when its reconnect
// starts, and the rail still carries the bootstrap, so the request is acknowledged. That
// verdict says nothing about a lost answer: the attempt waits for the receiver as any other
// (failing it would fail every attempt while the verdict lasts), and connects when the
// receiver's threads are back.
TEST_F(RdmaEngineStandbyReconnectTest, AnAttemptBegunWhileItsPairWasAlreadyDownIsNotFailedForIt) {
  fake::ScriptedHealth& health = sh->health;
  const Path& p1 = send->paths[1];
  const int nic1 = p1.localNic;
  health.setPair(nic1, health.pairs[p1.pairId].remote, false, false, "probe timeout (test)");  // soft, before
  health.setNic(nic1, true);  // the reconnect starts with the pair down; the active rail answers
  idleSenderAloneFor(30000000, [&] { return p1.generation > gen && p1.waitsForPeer; });
  ASSERT_TRUE(p1.waitsForPeer && p1.state == PathState::kConnecting) << info();
  EXPECT_FALSE(p1.pairUpWhenAcked);
  int passes = 0;  // 50 idle passes (>= 0.5 s), each a chance for the rule to act
  idleSenderAloneFor(10000000, [&] { return ++passes > 50; });
  EXPECT_EQ(p1.state, PathState::kConnecting) << "failed for a verdict older than its request: " << info();
  EXPECT_EQ(p1.generation, gen + 1) << info();
  ASSERT_TRUE(standbyUp(1));  // the receiver's threads are back: it answers
  EXPECT_EQ(p1.generation, gen + 1) << info();
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
}

// Failback racing a new failover: the primary comes back, its hold-down passes, and its
// failback RESUME is in flight when its QP fails again; the comm fails over to the standby
// (reconnected after the failback fenced it).
class RdmaEngineFailbackTest : public RdmaEngineTest {
 protected:
  void SetUp() override {
    holdDownMs = 30;
    RdmaEngineTest::SetUp();
  }
};

TEST_F(RdmaEngineFailbackTest, APrimaryFailingAgainDuringItsFailbackFailsOverToTheStandby) {
  endless = true;
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(2);
  ::fake::fail(sqs(0)[0], IBV_WC_RETRY_EXC_ERR);
  cut[0] = true;  // the primary reconnects (its bootstrap stream is not cut), its QP carries nothing
  ASSERT_TRUE(run([&] { return send->state() == LinkState::kFailingBack; })) << info();
  ASSERT_EQ(send->active, 0);
  ASSERT_EQ(send->counters.failovers, 1u);
  std::vector<ibv_qp*> s0 = sqs(0);
  bool resumePosted = false;
  for (int i = 0; i < 100 && !resumePosted; ++i) {
    resumePosted = !s0.empty() && !::fake::outstanding(s0[0]).empty();
    if (!resumePosted) nccl(), step(), s0 = sqs(0);
  }
  ASSERT_TRUE(resumePosted);
  ::fake::fail(s0[0], IBV_WC_RETRY_EXC_ERR);
  cut[0] = false;
  ASSERT_TRUE(run([&] { return send->counters.failovers >= 2 && send->state() == LinkState::kRunning; })) << info();
  endless = false;
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_FALSE(recv->isFatal());
}

// A send larger than its receive (the caller's truncation), resent after a failover: the
// receive fails with ncclInvalidUsage as on TCP, nothing of it is written, the messages before
// it are whole, and neither engine takes the refusal for a path fault.
TEST_F(RdmaEngineTest, ATruncatedSendResentAfterAFailoverIsTheCallersErrorAndWritesNothing) {
  truncatedSendResentAfterAFailover();
}

// NCCL closes both comms while the receiver's answer to a RESUME still waits for the old
// path's fence (held): the closes return without waiting for it, the held fence runs to its
// end afterwards, and the buffers are deregistered after that with nothing left behind.
TEST_F(RdmaEngineTest, ClosingBothCommsWhileAnOldPathsFenceIsHeldEndsCleanly) {
  singles({5000, 4096, 3000, 0, 8192, 777}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(2);
  holdFences(true);
  ::fake::fail(sqs(0)[0], IBV_WC_RETRY_EXC_ERR);
  bool waiting = false;
  for (int i = 0; i < 300 && !waiting; ++i) {
    nccl(), step();
    waiting = send->active == 1 && recv->active < 0 && t->fencer().queued() > 0 && sqs(1).size() == 1 &&
              ::fake::outstanding(sqs(1)[0]).empty();
  }
  ASSERT_TRUE(waiting) << info();
  const size_t queued = t->fencer().queued();
  send->close();
  recv->close();
  EXPECT_GE(t->fencer().queued(), queued) << "a close ran a held fence on its own thread";
  holdFences(false);
  settle();
  EXPECT_EQ(t->fencer().queued(), 0u);
  send.reset();
  recv.reset();
  settle();
  for (void* m : mrs) t->deregMr(m);
  mrs.clear();
  settle();
  for (const auto& m : ::fake::liveMrInfos())  // the flush QPs' landing buffers stay (the transport's)
    EXPECT_TRUE(m.len != txb.size() && m.len != rxb.size()) << "a registration outlived its deregMr (" << m.dev << ")";
}

// A receiving process that stops calling NCCL for several flow-stall periods (stopped,
// descheduled) while its HCA goes on acknowledging: neither end takes that for a fault (no
// failover, the primary's QPs stay the same), and the traffic goes on where it was.
TEST_F(RdmaEngineTest, AReceiverThatStopsCallingForSeveralFlowStallPeriodsIsNoFault) {
  cfg.flowStallMs = 200;  // periods short enough for a short test, long against a busy host's gaps
  endless = true;
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return msgs.size() > 20 && msgs[20].done; })) << info();
  const uint32_t qpn = sqs(0)[0]->qp_num;
  uint64_t until = nowUs() + 4 * 200 * 1000;
  while (nowUs() < until) {  // only the sender's calls; both HCAs carry and acknowledge
    for (size_t k = 0; k < msgs.size(); ++k) {
      Msg& m = msgs[k];
      int done = 0, size = 0;
      if (!m.posted) {
        note(send->isend(txb.data() + m.off, m.size, m.tag, &m.req, smr), "isend");
        m.posted = m.req != nullptr;
      } else if (!m.done) {
        note(send->test((SendReq*)m.req, &done, &size), "send test");
        m.done = done != 0;
      }
      settle();
      if (!m.posted) break;
    }
    std::vector<ibv_qp*> s, r;
    if (pairOf(0, &s, &r))
      for (size_t k = 0; k < s.size(); ++k) ::fake::deliver(s[k], r[k]), ::fake::deliver(r[k], s[k]);
    send->sweep();
    settle();
  }
  size_t before = msgs.size();
  ASSERT_TRUE(run([&] { return msgs.size() > before + 20 && msgs[before + 20].done; })) << info();
  endless = false;
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->counters.failovers + send->counters.recoveries, 0u) << info();
  EXPECT_EQ(send->active, 0);
  EXPECT_EQ(sqs(0)[0]->qp_num, qpn) << "the primary was reconnected";
}

// Several QPs per path (NCCL_IB_QPS_PER_CONNECTION=3): one QP of the primary fails in the
// middle of a message whose other shares landed.
class RdmaEngineLanesTest : public RdmaEngineTest {
 protected:
  void SetUp() override {
    lanes = 3;
    RdmaEngineTest::SetUp();
  }
};

TEST_F(RdmaEngineLanesTest, OneQpFailingMidMessageFailsOverAndTheMessageIsResentWhole) {
  singles({5000, 4096, 3000, 0, 8192, 777, 4000, 1, 2048, 8192, 129, 384}, 8192);
  ASSERT_TRUE(runningOn(0));
  ASSERT_EQ(sqs(0).size(), 3u);
  ASSERT_TRUE(run([&] { return msgs[1].done; })) << info();
  stepsCut(4);
  std::vector<ibv_qp*> s = sqs(0), r = rqs(0);
  ::fake::deliver(s[0], r[0]);  // QP 0 and 1 deliver everything, QP 2 nothing
  ::fake::deliver(s[1], r[1]);
  for (int i = 0; i < 3; ++i) {
    nccl();
    cut[0] = true;
    step();
    cut[0] = false;
  }
  ::fake::fail(s[2], IBV_WC_RETRY_EXC_ERR);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->active, 1);
}

// The same truncation over three QPs per path: the refusal (a DONE on QP 0, PARTs on the
// others) is the caller's error, not a path fault, and writes nothing.
TEST_F(RdmaEngineLanesTest, ATruncatedSendResentAfterAFailoverIsTheCallersErrorAndWritesNothing) {
  truncatedSendResentAfterAFailover();
}

// Grouped receives (RAILOVER_MAX_RECVS=8) over two QPs per path, with empty messages and
// messages exactly the size of their buffer, failing over in the middle of a group.
class RdmaEngineGroupedTest : public RdmaEngineTest {
 protected:
  void SetUp() override {
    lanes = 2;
    maxRecvs = kMaxRecvs;
    RdmaEngineTest::SetUp();
  }
  // A group of n buffers with distinct tags; its messages are sent in a shuffled tag order.
  void group(int n, std::mt19937& rng) {
    std::vector<uint64_t> caps;
    std::vector<int> tags;
    int base = (int)recvs.size() * 100;
    for (int i = 0; i < n; ++i) caps.push_back(256 + (uint64_t)((i * 613 + n * 37) % 3000)), tags.push_back(base + i);
    int ri = addRecv(caps, tags);
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < n; ++j) {
      int b = order[j];
      uint64_t size = j % 3 == 0 ? 0 : j % 3 == 1 ? caps[b] : caps[b] / 2 + 1;
      addMsg(size, tags[b], ri, b);
    }
  }
};

TEST_F(RdmaEngineGroupedTest, AFailoverInTheMiddleOfGroupsLosesNothing) {
  ASSERT_TRUE(send->matchTags());
  std::mt19937 rng(7);
  for (int n : {3, 8, 1, 5, 8, 2}) group(n, rng);
  ASSERT_TRUE(runningOn(0));
  ASSERT_TRUE(run([&] { return recvs[0].done; })) << info();
  stepsCut(3);
  std::vector<ibv_qp*> s = sqs(0), r = rqs(0);
  ASSERT_FALSE(::fake::outstanding(s[1]).empty()) << "QP 1 carries shares and PARTs of the next messages";
  ::fake::deliver(s[0], r[0], 3);
  ::fake::fail(s[1], IBV_WC_RETRY_EXC_ERR);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_EQ(send->active, 1);
}

// Seeded random fault scripts over the engines: 1..3 QPs per path, single or grouped receives,
// a hold-down of 20 ms (failbacks) or none, and two to five faults at random rounds: part of
// what the active path carries delivered and the rest failed on a random QP of the sender, the
// receiver's QP failing, a fatal QP event on a random QP of either end, the receiver's fences
// held for a while, one or both directions of the active path cut for some rounds. Every byte
// checked, no send completing early, NCCL never sees an error.
class RdmaEngineFuzzTest : public RdmaEngineTest, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    seed = GetParam();
    lanes = 1 + seed % 3;
    maxRecvs = (seed / 3) % 2 ? kMaxRecvs : 1;
    if ((seed / 6) % 2) holdDownMs = 20;  // failbacks race the faults too
    RdmaEngineTest::SetUp();
  }
  int seed = 0;
};

TEST_P(RdmaEngineFuzzTest, RandomFaultsLoseNothing) {
  std::mt19937 rng((uint32_t)seed * 7919u + 1);
  auto uni = [&](int n) { return (int)(rng() % (uint32_t)n); };
  if (maxRecvs > 1) {
    for (int g = 0; g < 10; ++g) {
      int n = 1 + uni(kMaxRecvs);
      std::vector<uint64_t> caps;
      std::vector<int> tags;
      for (int i = 0; i < n; ++i) caps.push_back(1 + (uint64_t)uni(5000)), tags.push_back(g * 10 + uni(3));
      int ri = addRecv(caps, tags);
      std::vector<int> order(n);
      for (int i = 0; i < n; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      // The messages in that tag order; each lands in the first buffer with its tag that the
      // messages before it in the receive left free (equal tags fill in seq order), and is
      // sized to fit it (a larger one would be the caller's truncation).
      std::vector<bool> taken((size_t)n, false);
      for (int b : order) {
        int at = -1;
        for (int i = 0; i < n && at < 0; ++i)
          if (!taken[(size_t)i] && tags[(size_t)i] == tags[(size_t)b]) at = i;
        taken[(size_t)at] = true;
        int pick = uni(4);
        uint64_t cap = caps[(size_t)at];
        addMsg(pick == 0 ? 0 : pick == 1 ? cap : (uint64_t)uni((int)cap + 1), tags[(size_t)b], ri, at);
      }
    }
  } else {
    std::vector<uint64_t> sizes;
    for (int i = 0; i < 60; ++i) {
      int pick = uni(5);
      sizes.push_back(pick == 0 ? 0 : pick == 1 ? 4096 : pick == 2 ? 1 : (uint64_t)uni(4097));
    }
    singles(sizes, 4096);
  }
  ASSERT_TRUE(runningOn(0)) << info();
  int faults = 2 + uni(4);
  int heldRounds = 0;
  for (int round = 0; round < 4000 && !allDone(); ++round) {
    ASSERT_EQ(firstErr, ncclSuccess) << info();
    if (heldRounds && --heldRounds == 0) holdFences(false);
    if (faults > 0 && uni(6) == 0 && send->active >= 0) {
      int a = send->active;
      std::vector<ibv_qp*> s = sqs(a), r = rqs(a);
      int kind = uni(8);
      if (kind == 0 && !s.empty()) {  // part delivered, then a QP of the sender fails
        stepsCut(1 + uni(3));
        s = sqs(a), r = rqs(a);  // the steps may have retired the path (its QPs go on the worker)
        for (size_t l = 0; l < s.size() && l < r.size(); ++l) ::fake::deliver(s[l], r[l], uni(3));
        if (!s.empty()) ::fake::fail(s[(size_t)uni((int)s.size())], IBV_WC_RETRY_EXC_ERR);
        --faults;
      } else if (kind == 1 && !r.empty() && !::fake::outstanding(r[0]).empty()) {  // the receiver's QP fails
        ::fake::fail(r[0], IBV_WC_RETRY_EXC_ERR);
        --faults;
      } else if (kind == 2 && !s.empty()) {  // a fatal event names a QP of the sender's path
        ibv_qp* q = s[(size_t)uni((int)s.size())];
        ::fake::asyncEvent(q->context, IBV_EVENT_QP_FATAL, 0, q);
        --faults;
      } else if (kind == 3 && !fencesHeld) {
        holdFences(true);
        heldRounds = 5 + uni(50);
      } else if (kind == 4) {
        stepsCut(1 + uni(5));
      } else if (kind == 5 && !r.empty()) {  // a fatal event names a QP of the receiver's path
        ibv_qp* q = r[(size_t)uni((int)r.size())];
        ::fake::asyncEvent(q->context, IBV_EVENT_QP_FATAL, 0, q);
        --faults;
      } else if (kind == 7 && !s.empty()) {  // a port error on the sender's active port (in this
        // bed that HCA port also serves the receiver's end of the other path: both paths break)
        ::fake::asyncEvent(s[0]->context, IBV_EVENT_PORT_ERR, 1);
        --faults;
      } else if (kind == 6) {  // nothing moves either way for some rounds (ACKs, RESUME_ACKs wait)
        bool was = cut[a];
        cut[a] = true;
        for (int i = 1 + uni(8); i > 0; --i) nccl(), step();
        cut[a] = was;
      }
    }
    nccl();
    step();
  }
  if (fencesHeld) holdFences(false);
  ASSERT_TRUE(run()) << info();
  expectAllDelivered();
  EXPECT_FALSE(send->isFatal());
  EXPECT_FALSE(recv->isFatal());
}

INSTANTIATE_TEST_SUITE_P(Seeds, RdmaEngineFuzzTest, ::testing::Range(0, 48));

}  // namespace
}  // namespace railover
