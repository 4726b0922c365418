#include "transport/rdma/rdma_transport.h"

#include <endian.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>

#include "common/clock.h"
#include "common/log.h"
#include "transport/tcp/wire.h"
#include "transport/verbs/verbs_config.h"
#include "transport/verbs/verbs_gdr.h"
#include "transport/verbs/verbs_mr.h"
#include "transport/verbs/verbs_path.h"

namespace railover {
namespace rdma {
namespace {

// How often a path looks at its bootstrap stream for the peer's end (a syscall), µs.
constexpr uint64_t kDeadCheckUs = 1000;

CtlMsg fromVerbs(const verbs::CtlMsg& v) {
  CtlMsg m;
  m.seq = v.seq, m.arg = v.arg;
  switch (v.type) {
    case verbs::CtlType::kAck: m.type = CtlType::kAck; break;
    case verbs::CtlType::kResume: m.type = CtlType::kResume; break;
    case verbs::CtlType::kResumeAck: m.type = CtlType::kResumeAck; break;
    case verbs::CtlType::kNack: m.type = CtlType::kNack; break;
    case verbs::CtlType::kClose: m.type = CtlType::kClose; break;
  }
  return m;
}

bool toVerbs(const CtlMsg& m, verbs::CtlMsg* v) {
  v->seq = m.seq, v->arg = m.arg;
  switch (m.type) {
    case CtlType::kAck: v->type = verbs::CtlType::kAck; return true;
    case CtlType::kResume: v->type = verbs::CtlType::kResume; return true;
    case CtlType::kResumeAck: v->type = verbs::CtlType::kResumeAck; return true;
    case CtlType::kNack: v->type = verbs::CtlType::kNack; return true;
    case CtlType::kClose: v->type = verbs::CtlType::kClose; return true;
    default: return false;
  }
}

std::string brokenText(const verbs::Broken& b) {
  return b.dev + " port " + std::to_string(b.port) + ": " + b.source + ": " + b.status;
}

// The part of a path the worker thread may touch: the verbs path and the bring-up result.
template <typename P>
struct Shared {
  std::unique_ptr<P> path;
  std::atomic<int> result{0};  // 0 in progress, 1 connected, -1 failed (err set before the store)
  std::string err;
  // A send path's CQ and QPs are created by the worker too (RdmaTransport::openSendPath):
  // 0 in progress, 1 created (path set before the store), -1 failed (createErr set before it).
  std::atomic<int> created{1};
  std::string createErr;
  // Set when the path is dropped or fenced before its creation job ran: the job then creates
  // nothing (a connect that timed out behind a busy worker must not leave QPs to destroy).
  std::atomic<bool> cancelled{false};
};

// Hands the verbs objects over for destruction off NCCL's thread (RdmaTransport::release:
// through the worker, after the path's bring-up jobs, to the release thread; destroying a QP
// can take seconds).
template <typename P>
void retire(RdmaTransport& t, std::shared_ptr<Shared<P>>& sh) {
  t.release(sh);
}

// A receive path's fence (QP to ERR, drain bounded by kFenceDrainMs), logged when it failed,
// missed flushes or took longer than kSlowFenceUs.
verbs::FenceResult fenceAndReport(RdmaTransport& t, int nic, verbs::RecvPath& p) {
  verbs::FenceResult fr = p.fence(kFenceDrainMs);
  if (!fr.err.empty() || !fr.drained || fr.us > kSlowFenceUs)
    RO_WARN("railover: RDMA fence on %s port %d: %s (after %llu us)", t.port(nic).sel.dev.c_str(), t.port(nic).sel.port,
            !fr.err.empty() ? fr.err.c_str() : fr.drained ? "slow" : "flushes not all seen", (unsigned long long)fr.us);
  return fr;
}

// What both ends of a path share: the bootstrap stream and the path's first fatal cause.
struct PathEnd {
  std::unique_ptr<Conn> conn_;
  std::string why_;          // the first cause the path broke with ("" while it works)
  uint64_t deadCheckUs_ = 0;
  bool closing_ = false;     // sendClose() posted the CLOSE: the fence lingers for it first
  // Whether the fence of an orderly close should first let the path's last sends complete:
  // the CLOSE was posted and the bootstrap stream shows the peer alive (a dead peer's HCA
  // never completes them: no linger for it).
  bool lingerOnClose() {
    std::string e;
    return closing_ && why_.empty() && conn_ && !conn_->dead(&e);
  }
  // The orderly close's linger on `p` (see lingerOnClose), given up as soon as the bootstrap
  // stream shows the peer gone (its FIN may arrive during the linger).
  void lingerForClose(verbs::PathBase& p) {
    if (!lingerOnClose()) return;
    Conn* c = conn_.get();
    p.lingerSends(kCloseLingerMs, [c] {
      std::string e;
      return c->dead(&e);
    });
  }
  // Records `why` as the cause (the first one wins) and returns -1 with it in *err.
  int fail(const std::string& why, std::string* err) {
    if (why_.empty()) why_ = why;
    *err = why_;
    return -1;
  }
  // The peer ended the bootstrap stream (it fenced or dropped the path, or exited): breaks the
  // path with the stream's words ("closed by peer", "Connection reset by peer"). Reads and
  // drops the sender's nudges first (kStreamNudge). Looks at most every kDeadCheckUs. Only
  // on an established path (both ends past the endpoint exchange).
  bool peerGone(std::string* err) {
    uint64_t now = nowUs();
    if (!conn_ || now - deadCheckUs_ < kDeadCheckUs) return false;
    deadCheckUs_ = now;
    std::string e;
    if (dropNudges(&e)) return false;  // its read also sees the end or an error: no second syscall
    fail("bootstrap stream: " + e, err);
    return true;
  }
  // Reads what is waiting on the bootstrap stream: nudges are dropped. false with *e set on the
  // stream's end, an error, or a byte that is not a nudge.
  bool dropNudges(std::string* e) {
    uint8_t b[64];
    for (;;) {
      ssize_t n = conn_->read(b, sizeof b, e);
      if (n < 0) return false;
      for (ssize_t i = 0; i < n; ++i)
        if (b[i] != kStreamNudge) {
          char hex[8];
          snprintf(hex, sizeof hex, "0x%02x", b[i]);
          *e = std::string("unexpected byte ") + hex + " after the endpoints (not a nudge)";
          return false;
        }
      if (n < (ssize_t)sizeof b) return true;
    }
  }
};

// Unpacks `n` endpoints of 40 bytes each from `in`; each must name a path of n QPs. false with
// *err naming the endpoint and its fault.
bool unpackEndpoints(const uint8_t* in, size_t n, std::vector<verbs::QpEndpoint>* out, std::string* err) {
  out->assign(n, verbs::QpEndpoint{});
  for (size_t i = 0; i < n; ++i) {
    std::string e;
    if (!(*out)[i].unpack(in + i * verbs::QpEndpoint::kWireBytes, &e))
      return *err = (n > 1 ? "endpoint " + std::to_string(i) + " of " + std::to_string(n) + ": " : "") + e, false;
    if ((*out)[i].lanes != n)
      return *err = "endpoint " + std::to_string(i) + " names a path of " + std::to_string((*out)[i].lanes) +
                    " QPs, not " + std::to_string(n),
             false;
  }
  return true;
}

// ---- sender

class RdmaSendPath final : public SendPath, private verbs::SendPath::Sink, private PathEnd {
 public:
  // `sh` is being filled by a creation job already posted to the worker (sh->created 0 until
  // it ran); the bootstrap stream `conn` connects meanwhile.
  RdmaSendPath(RdmaTransport& t, int nic, std::unique_ptr<Conn> conn, const PathIdentity& id, uint64_t chunk,
               std::shared_ptr<Shared<verbs::SendPath>> sh)
      : t_(t), nic_(nic), id_(id), chunk_(chunk ? chunk : (1u << 20)), sh_(std::move(sh)) {
    conn_ = std::move(conn);
  }
  ~RdmaSendPath() override {
    sh_->cancelled.store(true, std::memory_order_relaxed);
    retire(t_, sh_);  // after the bring-up jobs (Worker: they run first)
  }

  int connectState(std::string* err) override {
    if (!why_.empty()) return *err = why_, -1;
    if (notice_) return 0;  // refused (NACK): recvNotice reports it, the engine closes the path
    if (stage_ == kCreate) {
      // The bootstrap connect goes on meanwhile: a refusal (the peer's process is gone) is
      // reported now, not after the creation (the engine's peer-gone verdict needs its words).
      int r = conn_->connectState(err);
      if (r < 0) return fail("bootstrap connect: " + *err, err);
      bootUp_ = r == 1;  // for connectWaitsOffNetwork: asking the socket again would take its error
      int c = sh_->created.load(std::memory_order_acquire);
      if (c == 0) return 0;
      if (c < 0) return fail(sh_->createErr, err);
      ep_.assign(sh_->path->lanes() * verbs::QpEndpoint::kWireBytes, 0);
      stage_ = kTcp;
    }
    if (stage_ == kTcp) {
      int r = conn_->connectState(err);
      if (r <= 0) return r < 0 ? fail("bootstrap connect: " + *err, err) : 0;
      wire::Hello h;
      h.stream = 0, h.nStreams = 1, h.secret = id_.secret, h.path = id_.pathIndex, h.srcRail = id_.srcRail;
      h.probePort = id_.probePort, h.generation = id_.generation, h.connId = id_.connId;
      // The HELLO, then one endpoint per QP of the path (each naming how many there are).
      std::vector<verbs::QpEndpoint> mine = sh_->path->localEndpoints();
      std::vector<uint8_t> buf(wire::kFrameBytes + mine.size() * verbs::QpEndpoint::kWireBytes);
      wire::encodeHello(h, buf.data());
      for (size_t i = 0; i < mine.size(); ++i) mine[i].pack(buf.data() + wire::kFrameBytes + i * verbs::QpEndpoint::kWireBytes);
      if (!writeAll(*conn_, buf.data(), buf.size(), err)) return fail("HELLO: " + *err, err);
      stage_ = kEndpoint;
    }
    if (stage_ == kEndpoint) {
      ssize_t n = conn_->read(ep_.data() + got_, ep_.size() - got_, err);
      if (n < 0) return fail("bootstrap: " + *err, err);
      got_ += (size_t)n;
      if (got_ >= wire::kFrameBytes && ep_[0] == wire::kNack) {  // the receiver's acceptor refused the comm
        wire::Frame f;
        std::string e;
        if (wire::decodeFrame(ep_.data(), &f, &e) && f.type == wire::kNack) {
          notice_ = true;
          noticeMsg_.type = CtlType::kNack, noticeMsg_.seq = f.seq;
          return 0;
        }
      }
      if (got_ < ep_.size()) return 0;
      std::vector<verbs::QpEndpoint> peer;
      std::string e;
      if (!unpackEndpoints(ep_.data(), ep_.size() / verbs::QpEndpoint::kWireBytes, &peer, &e))
        return fail(verbs::QpEndpoint::looksLikeOne(ep_.data())
                        ? "the receiver's RDMA endpoint is malformed: " + e
                        : "the receiver did not answer with an RDMA endpoint (" + e +
                              "): is RAILOVER_TRANSPORT the same on every rank?",
                    err);
      stage_ = kRts;
      auto sh = sh_;
      t_.worker().postBringUp([sh, peer]() {
        std::string e2;
        bool ok = sh->path->connect(peer, &e2);
        sh->err = e2;
        sh->result.store(ok ? 1 : -1, std::memory_order_release);
      });
      return 0;
    }
    if (stage_ == kRts) {
      int r = sh_->result.load(std::memory_order_acquire);
      if (r == 0) return 0;
      if (r < 0) return fail("QP bring-up: " + sh_->err, err);
      stage_ = kReady;
      const verbs::SendPath& p = *sh_->path;
      RO_INFO(RO_SUBSYS_NET,
              "railover: RDMA send path %u (generation %u) up on %s port %d: %d QP%s (first QPN %u, traffic class %d, "
              "SL %d)",
              (unsigned)id_.pathIndex, (unsigned)id_.generation, t_.port(nic_).sel.dev.c_str(), t_.port(nic_).sel.port,
              p.lanes(), p.lanes() > 1 ? "s" : "", p.local().qpn, p.params().trafficClass, p.params().sl);
    }
    return 1;
  }

  uint64_t chunkBytes(uint64_t size) const override { return size < chunk_ ? (size ? size : 1) : chunk_; }

  void post(const ChunkRef& c, const void* src) override { q_.push_back({c, (const uint8_t*)src}); }
  void sendCtl(const CtlMsg& m) override { ctlOut_.push_back(m); }

  int progress(std::string* err) override {
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    verbs::SendPath& p = *sh_->path;
    p.progress(*this);
    if (!why_.empty()) return *err = why_, -1;
    int moved = p.lastPollFound() > 0;
    std::string e;
    while (!ctlOut_.empty()) {
      verbs::CtlMsg v;
      if (!toVerbs(ctlOut_.front(), &v)) return fail("cannot send control message of an unknown type", err);
      int r = p.sendCtl(v, &e);
      if (r < 0) return fail(e, err);
      if (r == 0) break;
      ctlOut_.pop_front();
      moved = 1;
    }
    while (ctlOut_.empty() && !q_.empty()) {
      const Pending& x = q_.front();
      auto* mr = (const verbs::MrSet*)x.c.mhandle;
      int hi = t_.port(nic_).hcaIndex;
      if (!mr || hi < 0 || (size_t)hi >= mr->count())
        return fail("message " + std::to_string(x.c.seq) + ": send buffer not registered with this transport (regMr)", err);
      uintptr_t a = (uintptr_t)x.src, lo = (uintptr_t)mr->addr();
      if (x.c.len && (a < lo || a + x.c.len > lo + mr->size()))
        return fail("message " + std::to_string(x.c.seq) + ": send buffer outside its registration", err);
      verbs::ChunkRef vc;
      vc.seq = x.c.seq, vc.offset = x.c.offset, vc.len = x.c.len, vc.total = x.c.total, vc.tag = (uint32_t)x.c.tag;
      uint32_t lkey = 0, rkey = 0;
      if (!mr->keysOn((size_t)hi, p.qp(0).epoch(), &lkey, &rkey))  // a key of a dead HCA opening is never posted
        return fail("message " + std::to_string(x.c.seq) + ": send buffer not registered on the re-opened HCA " +
                        t_.port(nic_).sel.dev + " yet",
                    err);
      int r = p.post(vc, x.src, lkey, &e);
      if (r < 0) return fail(e, err);
      if (r == 0) break;  // no advertisement for this seq yet, or the send queue is full
      q_.pop_front();
      moved = 1;
    }
    if (peerGone(err)) return -1;
    return moved;
  }

  // What the receiver sent before the path broke comes first (its ACKs, its CLOSE: the engine
  // reads control before it calls a broken path a fault), then the fault.
  int recvCtl(CtlMsg* m, std::string* err) override {
    if (!ctlIn_.empty()) return *m = ctlIn_.front(), ctlIn_.pop_front(), 1;
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    sh_->path->progress(*this);
    if (!ctlIn_.empty()) return *m = ctlIn_.front(), ctlIn_.pop_front(), 1;
    if (!why_.empty()) return *err = why_, -1;
    return 0;
  }

  int recvNotice(bool withCtl, CtlMsg* m, std::string* err) override {
    if (notice_) {
      notice_ = false;
      *m = noticeMsg_;
      return 1;
    }
    if (withCtl && !ctlIn_.empty()) return recvCtl(m, err);
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    if (!withCtl) return peerGone(err) ? -1 : 0;
    int r = recvCtl(m, err);
    return r != 0 ? r : peerGone(err) ? -1 : 0;
  }

  void sendClose() override {
    if (stage_ != kReady || fenced_ || !why_.empty()) return;
    std::string e;
    verbs::CtlMsg v;
    for (auto& m : ctlOut_)
      if (toVerbs(m, &v) && sh_->path->sendCtl(v, &e) <= 0) return;
    ctlOut_.clear();
    v.type = verbs::CtlType::kClose, v.seq = 0, v.arg = 0;
    closing_ = sh_->path->sendCtl(v, &e) == 1;
  }

  void fence() override {
    if (fenced_) return;
    fenced_ = true;  // from here on this object posts nothing more and reads nothing of the QP
    sh_->cancelled.store(true, std::memory_order_relaxed);  // a creation not yet run: nothing to create
    // The QP goes to ERR (what is queued is flushed) on the transport's send-fence thread: on
    // rxe, moving a QP whose NIC just lost its link to ERR was seen to block for ~3 s, and
    // NCCL's progress thread (or the sweeper, holding the link's mutex) must not wait for it;
    // nor must the worker, which brings every comm's paths up (until 2026-12-06 this ran there,
    // and every bring-up waited behind a blocked move:
    // RdmaPathTest.ASendFenceBlockedInItsMoveToErrHoldsNoOtherPathsBringUp). Send fences queue
    // behind each other there; no thread is started for one.
    // The engine's guarantee does not need it to be synchronous here: the receiver moves its own QP of this
    // path to ERR before it answers RESUME on another path, so nothing this QP still sends
    // can land after the resume. A QP still being brought up by the worker is left to it: no
    // advertisement ever reached it, so it can write nothing. The verbs path is released on
    // the release thread afterwards, as retire() does.
    // An orderly close (sendClose posted the CLOSE) first lets the path's last sends complete,
    // here (NCCL closes comms on its service thread, after the progress thread was joined; the
    // shared worker must not wait for it), and only then ends the bootstrap stream: the
    // receiver must read the CLOSE before it sees the stream end, or it would take the end for
    // a fault.
    if (stage_ == kReady) {
      lingerForClose(*sh_->path);
      auto sh = sh_;
      int nic = nic_;
      RdmaTransport* t = &t_;
      t_.sendFencer().post([sh, nic, t]() mutable {
        verbs::FenceResult fr = sh->path->fence(0);
        if (!fr.err.empty() || fr.us > kSlowFenceUs)
          RO_WARN("railover: RDMA fence of a send path on %s port %d: %s%llu us", t->port(nic).sel.dev.c_str(),
                  t->port(nic).sel.port, fr.err.empty() ? "" : (fr.err + ", after ").c_str(), (unsigned long long)fr.us);
        retire(*t, sh);  // destroyed on the release thread
      });
    }
    conn_.reset();  // the receiver sees the path end
  }

  // A nudge is one byte on the bootstrap stream (kStreamNudge). The write never blocks (the
  // stream is non-blocking and otherwise idle); a full socket buffer means the last nudge is
  // still unanswered, which is as good.
  void nudge() override {
    if (stage_ != kReady || fenced_ || !why_.empty() || !conn_) return;
    uint8_t b = kStreamNudge;
    iovec v{&b, 1};
    std::string e;
    if (conn_->writev(&v, 1, &e) < 0) {
      RO_INFO(RO_SUBSYS_NET, "railover: RDMA send path %u: nudge after a repair: %s", (unsigned)id_.pathIndex, e.c_str());
      return;
    }
    deadCheckUs_ = 0;  // the answer is looked for at the next progress or notice read
  }

  // What the receiver advertised for `seq` on this path (its advertisements are read by
  // progress and recvCtl); nothing once the path is fenced or broken.
  bool postedReceive(uint64_t seq, PostedReceive* out) const override {
    if (stage_ != kReady || fenced_ || !why_.empty()) return false;
    uint64_t first = 0, tags[verbs::kMaxGroup];
    int n = 0;
    bool grouped = false;
    if (!sh_->path->advertisedReceive(seq, &first, &n, &grouped, tags) || n < 1 || n > kMaxReceiveBuffers) return false;
    out->firstSeq = first, out->n = n, out->grouped = grouped;
    for (int i = 0; i < n; ++i) out->tags[i] = (int32_t)(uint32_t)tags[i];
    return true;
  }

  // Both read the silence up to the path's latest poll (PathBase::silenceUs): time this
  // process spent stopped or descheduled since is not the peer's.
  bool peerAckedWithinMs(uint32_t ms) override {
    if (stage_ != kReady || fenced_ || sh_->path->outstanding() == 0) return false;
    return sh_->path->silenceUs() < (uint64_t)ms * 1000;
  }
  uint32_t unackedSilenceMs() override {
    if (stage_ != kReady || fenced_ || sh_->path->outstanding() == 0) return 0;
    return (uint32_t)(sh_->path->silenceUs() / 1000);
  }
  // RC: the peer's HCA acknowledges every packet, whatever its process does (transport.h).
  bool ackSilenceIsFault() const override { return true; }
  // What the connect waits for, stage by stage: kCreate, this side's worker creating the QPs
  // (off the network once the bootstrap stream is connected); kTcp, the network; kEndpoint, the
  // receiver's endpoints: the receiver answers on its own threads' polls (it reads ours, brings
  // its QPs to RTS on its worker, writes its endpoints back), so once its kernel acknowledged
  // the HELLO and our endpoints what is left is a receiver thread, not the network; kRts, this
  // side's worker bringing the QPs up.
  bool connectWaitsOffNetwork() override {
    if (!why_.empty() || notice_) return false;
    switch (stage_) {
      // What this poll's connectState saw: a second connectState here would read (and clear) a
      // socket error that arrived in between (SO_ERROR), and the refusal would be lost.
      case kCreate: return bootUp_;
      case kEndpoint:
        if (!acked_) acked_ = conn_->sentAllAcked();  // stays true: nothing more is written until the answer
        return acked_;
      case kRts: return true;
      default: return false;
    }
  }
  // kEndpoint with the request acknowledged (acked_, set by connectWaitsOffNetwork at this poll).
  bool connectWaitsForPeer() override { return why_.empty() && !notice_ && stage_ == kEndpoint && acked_; }

 private:
  struct Pending {
    ChunkRef c;
    const uint8_t* src;
  };
  enum Stage { kCreate, kTcp, kEndpoint, kRts, kReady };

  // verbs::SendPath::Sink
  void chunkDone(const verbs::ChunkRef&) override {}  // delivery is proven by the receiver's ACK
  void ctl(const verbs::CtlMsg& m) override { ctlIn_.push_back(fromVerbs(m)); }
  void broken(const verbs::Broken& b) override {
    if (why_.empty()) why_ = brokenText(b);
  }

  friend std::vector<ibv_qp*> railover::rdma::pathQps(SendPath*);
  RdmaTransport& t_;
  int nic_;
  PathIdentity id_;
  uint64_t chunk_;
  std::shared_ptr<Shared<verbs::SendPath>> sh_;
  Stage stage_ = kCreate;
  bool bootUp_ = false;  // kCreate: the bootstrap stream was connected at the latest poll
  bool acked_ = false;   // kEndpoint: the receiver's kernel acknowledged the HELLO and our endpoints
  std::vector<uint8_t> ep_;  // the receiver's endpoints, one per QP of the path
  size_t got_ = 0;
  bool notice_ = false;
  CtlMsg noticeMsg_;
  bool fenced_ = false;
  std::deque<Pending> q_;
  std::deque<CtlMsg> ctlOut_, ctlIn_;
};

// ---- receiver

// A receive path's grant of remote write to its QPs (verbs::RecvPath::grantWrites), run on a
// fence thread: not on NCCL's, since a modify waits for the HCA's firmware on mlx5. state: 1
// running, 2 granted, -1 failed (err set before the store). wait() returns once it ended.
// A fence of the path claims the grant first when it has not started (cancel(): the grant then
// never runs, the QPs keep refusing WRITEs, and the fence waits for nothing: a queued job may
// never get a thread, FenceRunner); otherwise the fence waits for it to end.
struct WriteGrant {
  std::atomic<int> state{1};
  std::atomic<int> claim{0};  // 0 unclaimed, 1 the grant job began, 2 cancelled by the path's fence
  bool begin() {
    int e = 0;
    return claim.compare_exchange_strong(e, 1, std::memory_order_acq_rel);
  }
  bool cancel() {  // true: it will never run (nothing to wait for); false: it began, wait()
    int e = 0;
    return claim.compare_exchange_strong(e, 2, std::memory_order_acq_rel) || e == 2;
  }
  std::string err;
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  void finish(bool ok, const std::string& e) {
    if (!ok) err = e;
    state.store(ok ? 2 : -1, std::memory_order_release);
    std::lock_guard<std::mutex> g(mu);
    ended = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [this] { return ended; });
  }
  bool hasEnded() {
    std::lock_guard<std::mutex> g(mu);
    return ended;
  }
};

class RdmaRecvPath final : public RecvPath, private verbs::RecvPath::Sink, private PathEnd {
 public:
  RdmaRecvPath(RdmaTransport& t, int nic, int nStreams)
      : t_(t), nic_(nic), nStreams_(nStreams), sh_(std::make_shared<Shared<verbs::RecvPath>>()) {}
  ~RdmaRecvPath() override { retire(t_, sh_); }

  bool adopt(int stream, std::unique_ptr<Conn> c) override {
    if (stream != 0) return false;
    conn_ = std::move(c);
    got_ = 0;
    ep_.assign(verbs::QpEndpoint::kWireBytes, 0);  // the new stream's first endpoint names its QP count
    return true;
  }

  int connectState(std::string* err) override {
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ == kWait) {
      if (!conn_) return 0;
      if (nStreams_ != 1) return fail("an RDMA path has one bootstrap stream, the sender announced " +
                                          std::to_string(nStreams_) + ": is RAILOVER_TRANSPORT the same on every rank?", err);
      if (nic_ < 0 || !t_.port(nic_).hca) return fail("no HCA port behind local NIC " + std::to_string(nic_), err);
      stage_ = kEndpoint;
    }
    if (stage_ == kEndpoint) {
      ssize_t n = conn_->read(ep_.data() + got_, ep_.size() - got_, err);
      if (n < 0) return fail("bootstrap: " + *err, err);
      got_ += (size_t)n;
      if (got_ < ep_.size()) return 0;
      verbs::QpEndpoint first;
      std::string e;
      if (!first.unpack(ep_.data(), &e))
        return fail(verbs::QpEndpoint::looksLikeOne(ep_.data())
                        ? "the sender's RDMA endpoint is malformed: " + e
                        : "the sender did not send an RDMA endpoint (" + e +
                              "): is RAILOVER_TRANSPORT the same on every rank?",
                    err);
      // The sender's first endpoint names how many QPs its path has: read the others.
      if (ep_.size() < first.lanes * verbs::QpEndpoint::kWireBytes) {
        ep_.resize(first.lanes * verbs::QpEndpoint::kWireBytes);
        return 0;
      }
      std::vector<verbs::QpEndpoint> peer;
      if (!unpackEndpoints(ep_.data(), first.lanes, &peer, &e))
        return fail("the sender's RDMA endpoint is malformed: " + e, err);
      stage_ = kRts;
      auto sh = sh_;
      const NicPort& np = t_.port(nic_);
      verbs::Hca* hca = np.hca;
      verbs::PortSel sel = t_.portSel(nic_);
      verbs::RcParams rc = t_.rcParams();
      if (first.qos) {  // the sender's traffic class and service level, as NCCL's IB receiver takes them
        rc.trafficClass = first.trafficClass;
        rc.sl = first.sl;
      }
      // The QP is created and brought to RTS before our endpoint goes back (see the header).
      RdmaTransport* t = &t_;
      int nic = nic_;
      t_.worker().postBringUp([sh, hca, sel, rc, peer, t, nic]() {
        std::string e2;
        auto p = std::make_unique<verbs::RecvPath>(*hca, sel, rc, &e2, (int)peer.size());
        bool ok = p->ok() && p->connect(peer, &e2);
        if (ok) t->noteAccessReadBack(nic, *p);
        sh->path = std::move(p);
        sh->err = e2;
        sh->result.store(ok ? 1 : -1, std::memory_order_release);
      });
      return 0;
    }
    if (stage_ == kRts) {
      int r = sh_->result.load(std::memory_order_acquire);
      if (r == 0) return 0;
      if (r < 0) return fail("QP bring-up: " + sh_->err, err);
      std::vector<verbs::QpEndpoint> mine = sh_->path->localEndpoints();
      std::vector<uint8_t> buf(mine.size() * verbs::QpEndpoint::kWireBytes);
      for (size_t i = 0; i < mine.size(); ++i) mine[i].pack(buf.data() + i * verbs::QpEndpoint::kWireBytes);
      if (!writeAll(*conn_, buf.data(), buf.size(), err)) return fail("bootstrap: " + *err, err);
      stage_ = kReady;
    }
    return 1;
  }

  int progress(RecvSink& sink, std::string* err) override {
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    if (flush(err) < 0) return -1;
    verbs::RecvPath& p = *sh_->path;
    p.progress(*this);
    if (!why_.empty()) return *err = why_, -1;
    int moved = p.lastPollOk() > 0;  // not an async event: RecvLink reads this as the rail delivering
    while (!arr_.empty()) {
      const verbs::Arrival& a = arr_.front();
      ChunkRef c;
      c.seq = a.seq, c.offset = 0, c.len = a.bytes, c.total = a.bytes, c.tag = (int32_t)(uint32_t)a.tag;
      uint8_t* dst = nullptr;
      std::string e;
      int r = sink.place(c, &dst, &e);
      if (r < 0) return fail(e, err);
      if (r == RecvSink::kHold) break;  // the engine reports the caller's error; the bytes stay where they are
      if (r == RecvSink::kWrite && a.refused)
        return fail("the sender refused message " + std::to_string(a.seq) + " (" + std::to_string(a.bytes) +
                        " bytes, tag " + std::to_string(c.tag) + ") as not fitting its receive, which takes it", err);
      if (r == RecvSink::kWrite && (uintptr_t)dst != a.addr)
        return fail("message " + std::to_string(a.seq) + " arrived in a buffer the engine did not choose for it", err);
      sink.arrived(c, r == RecvSink::kDiscard);
      arr_.pop_front();
      moved = 1;
    }
    while (!ctlIn_.empty()) {
      CtlMsg m = ctlIn_.front();
      ctlIn_.pop_front();
      std::string e;
      if (!sink.control(m, &e)) return fail(e, err);
      moved = 1;
    }
    if (peerGone(err)) return -1;
    return moved;
  }

  void sendCtl(const CtlMsg& m) override {
    Out o;
    o.isCtl = true, o.ctl = m;
    out_.push_back(o);
  }
  int flushCtl(std::string* err) override { return flush(err) < 0 ? -1 : 0; }

  int recvCtl(CtlMsg* m, std::string* err) override {  // as the sender's: what came first, first
    if (!ctlIn_.empty()) return *m = ctlIn_.front(), ctlIn_.pop_front(), 1;
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    sh_->path->progress(*this);
    if (!ctlIn_.empty()) return *m = ctlIn_.front(), ctlIn_.pop_front(), 1;
    if (!why_.empty()) return *err = why_, -1;
    return peerGone(err) ? -1 : 0;
  }

  void sendClose(uint64_t reason) override {
    if (stage_ != kReady || fenced_ || !why_.empty()) return;
    // Buffers not yet advertised never will be (the comm is closing); their registrations may
    // be gone already (NCCL deregisters before it closes). Control messages still go, in order.
    out_.erase(std::remove_if(out_.begin(), out_.end(), [](const Out& o) { return !o.isCtl; }), out_.end());
    std::string e;
    if (flush(&e) < 0 || !out_.empty()) return;
    verbs::CtlMsg v;
    v.type = verbs::CtlType::kClose, v.seq = reason;
    closing_ = sh_->path->sendCtl(v, &e) == 1;
  }

  // The engine's close of a comm (and of a path) ends here: after it, nothing the sender
  // writes can land. An orderly close (sendClose posted the CLOSE) first lets the path's last
  // sends, its final ACKs and the CLOSE, complete (bounded by kCloseLingerMs): the fence would
  // flush them, and the sender would miss its last ACKs and take the stream's end for a fault.
  void fence() override {
    if (fenced_) return;
    if (stage_ == kReady) lingerForClose(*sh_->path);
    fenced_ = true;
    if (stage_ == kReady) {
      // A modify of the QPs' access still running (one per lane); one that ended (typically at
      // the path's first advertisement, long ago) is nothing to wait for.
      if (grant_ && !grant_->cancel() && !grant_->hasEnded()) {
        uint64_t t0 = nowUs();
        grant_->wait();
        grantWait_.waited = true, grantWait_.us = nowUs() - t0;  // journaled by the engine (transport_slow)
      }
      fenceAndReport(t_, nic_, *sh_->path);
    }
    conn_.reset();
  }
  FenceGrantWait lastFenceGrantWait() const override { return grantWait_; }

  // The receiver's control SENDs (advertisements, ACKs, RESUME_ACK) are acknowledged by the
  // sender's HCA whatever its process does (transport.h).
  uint32_t unackedSilenceMs() override {
    if (stage_ != kReady || fenced_ || sh_->path->outstanding() == 0) return 0;
    return (uint32_t)(sh_->path->silenceUs() / 1000);  // to the latest poll, as the sender's
  }
  bool ackSilenceIsFault() const override { return true; }

  // The fence without blocking the caller: the path stops now (fenced_: nothing more is
  // posted, polled or read here; the bootstrap stream closes, so the sender sees the path
  // end), and the QP's move to ERR and the drain run on a fence thread (FenceRunner). The
  // verbs path is destroyed on the release thread afterwards, as retire() does.
  std::shared_ptr<FenceWait> fenceAsync() override {
    if (fenced_) return nullptr;
    fenced_ = true;
    conn_.reset();
    if (stage_ != kReady) return nullptr;  // no endpoint went back: the sender cannot write
    auto w = std::make_shared<FenceWait>();
    w->queuedUs = nowUs();
    auto sh = sh_;
    RdmaTransport* t = &t_;
    int nic = nic_;
    std::shared_ptr<WriteGrant> g = grant_;
    bool mustWait = g && !g->cancel();  // a grant not begun yet never runs now
    t_.fencer().run([sh, w, t, nic, g, mustWait]() mutable {
      w->startUs.store(nowUs(), std::memory_order_relaxed);
      if (mustWait) {  // the grant touches the QPs, and writesAllowed() is read below
        g->wait();
        w->grantEndUs.store(nowUs(), std::memory_order_relaxed);  // journaled apart (resume: fence_grant_wait_us)
      }
      verbs::FenceResult fr = fenceAndReport(*t, nic, *sh->path);
      if (!fr.err.empty()) {
        // A QP that refused the move to ERR may still take the old path's writes, and the
        // engine answers the sender's RESUME once this wait is done: the path's QPs are
        // destroyed first, here on the fence thread (a fence thread exists to block; the
        // worker's queue may hold seconds of releases), and only then is the fence done. A dead
        // device (DEVICE_FATAL) refuses too, but nothing of it can write any more: done at once.
        // A QP that refuses destruction as well may still write: the wait says so (unsafe) and
        // the engine fails the comm rather than answer. Unless the path never advertised a
        // buffer: its QPs never had IBV_ACCESS_REMOTE_WRITE (verbs::RecvPath::writesAllowed),
        // so their responder refuses every WRITE whatever rkey the sender holds (keys of every
        // HCA reach the sender through the paths it did write on); nothing of it can land. That
        // holds only where the HCA read the flag back as off when the path connected: a
        // provider that ignores it (or a failed read-back) makes the stuck fence unsafe.
        if (!t->port(nic).hca->deviceFatal()) {
          RO_WARN("railover: RDMA fence on %s port %d could not move a QP to ERR (%s): destroying the path's QPs before "
                  "the sender's RESUME is answered", t->port(nic).sel.dev.c_str(), t->port(nic).sel.port, fr.err.c_str());
          // A refusal may be transient (EBUSY): a few tries, kFenceDestroyTries in all, with a
          // short back-off (this thread exists to block); the verdict is the last one's. An
          // event not read yet may say the device is dead: read first.
          std::string de;
          bool gone = false;
          for (int k = 0; k < kFenceDestroyTries && !gone; ++k) {
            if (k) std::this_thread::sleep_for(std::chrono::milliseconds(kFenceDestroyGapMs << (k - 1)));
            de.clear();
            gone = sh->path->destroyQps(&de);
          }
          t->port(nic).hca->pollAsync();
          if (!gone && !t->port(nic).hca->deviceFatal() && !sh->path->writesAllowed())
            RO_WARN("railover: RDMA fence on %s port %d: the path's QPs could be neither moved to ERR nor destroyed (%s), "
                    "but they never accepted RDMA writes (no buffer was advertised on the path): nothing of it can "
                    "land, the fence is done",
                    t->port(nic).sel.dev.c_str(), t->port(nic).sel.port, de.c_str());
          else if (!gone && !t->port(nic).hca->deviceFatal())
            w->unsafe = "the old path on " + t->port(nic).sel.dev + " port " + std::to_string(t->port(nic).sel.port) +
                        " could not be stopped (move to ERR: " + fr.err + "; " + de + ", " +
                        std::to_string(kFenceDestroyTries) + " tries)" +
                        (sh->path->accessReadBack().empty() ? "" : "; " + sh->path->accessReadBack());
          sh->path.reset();  // here, on the fence thread: not behind the worker's queue of releases
          w->endUs.store(nowUs(), std::memory_order_relaxed);
          w->done.store(true, std::memory_order_release);
          return;
        }
      }
      w->endUs.store(nowUs(), std::memory_order_relaxed);
      w->done.store(true, std::memory_order_release);
      retire(*t, sh);  // destroyed on the release thread
    });
    return w;
  }

  void advertise(uint64_t seq, const AdvertEntry* entries, int n, bool grouped) override {
    if (!why_.empty() || fenced_) return;
    int hi = nic_ >= 0 ? t_.port(nic_).hcaIndex : -1;
    std::string e;
    if (n < 1 || n > verbs::kMaxGroup || (!grouped && n != 1)) {
      fail("receive of message " + std::to_string(seq) + " with " + std::to_string(n) + " buffers" +
               (grouped ? "" : " not grouped") + " (1.." + std::to_string(verbs::kMaxGroup) + ")", &e);
      return;
    }
    Out o;
    o.isCtl = false;
    o.n = n;
    o.grouped = grouped;
    for (int i = 0; i < n; ++i) {
      const AdvertEntry& x = entries[i];
      auto* mr = (const verbs::MrSet*)x.mhandle;
      std::string which = grouped ? "buffer " + std::to_string(i) + " of the grouped receive at message " + std::to_string(seq)
                                  : "receive buffer of message " + std::to_string(seq);
      if (!mr || hi < 0 || (size_t)hi >= mr->count()) {
        fail(which + " not registered with this transport (regMr)", &e);
        return;
      }
      uintptr_t a = (uintptr_t)x.buf, lo = (uintptr_t)mr->addr();
      if (x.size && (a < lo || a + x.size > lo + mr->size())) {
        fail(which + " outside its registration", &e);
        return;
      }
      verbs::Advert& v = o.adv[i];
      v.seq = seq, v.tag = (uint32_t)x.tag, v.addr = a, v.size = x.size;
      o.mr[i] = mr;  // the key is read when it leaves (flush), for the opening of the path's QP
    }
    out_.push_back(o);
    flush(&e);
  }

 private:
  struct Out {
    bool isCtl = true;
    CtlMsg ctl;
    int n = 1;             // advertisement: buffers
    bool grouped = false;  // advertisement: a grouped receive (advertiseGroup)
    verbs::Advert adv[verbs::kMaxGroup];
    const verbs::MrSet* mr[verbs::kMaxGroup] = {};  // advertisement: each buffer's registration
  };
  enum Stage { kWait, kEndpoint, kRts, kReady };

  // Sends what is queued, in order (control messages and advertisements). -1 broken.
  int flush(std::string* err) {
    if (!why_.empty()) return *err = why_, -1;
    if (stage_ != kReady || fenced_) return 0;
    verbs::RecvPath& p = *sh_->path;
    std::string e;
    while (!out_.empty()) {
      const Out& o = out_.front();
      int r;
      if (o.isCtl) {
        verbs::CtlMsg v;
        if (!toVerbs(o.ctl, &v)) return fail("cannot send control message of an unknown type", err);
        r = p.sendCtl(v, &e);
      } else {
        // The path's QPs take WRITEs only once granted: the grant runs on a fence thread (it
        // started when the sender's RESUME came, or starts now), and advertisements wait for it.
        if (!p.writesGranted()) {
          startGrant();
          int g = grant_ ? grant_->state.load(std::memory_order_acquire) : 2;
          if (g == 1) break;
          if (g < 0) {
            // A QP that went to ERR meanwhile refuses the modify (EINVAL): its own cause (a
            // completion error the path has not reported yet) comes first.
            p.progress(*this);
            if (!why_.empty()) return *err = why_, -1;
            return fail("ibv_modify_qp (remote write access for the path's advertisements): " + grant_->err, err);
          }
        }
        Out& w = out_.front();
        int hi = t_.port(nic_).hcaIndex;
        for (int i = 0; i < w.n; ++i) {
          uint32_t lkey = 0;
          if (!w.mr[i]->keysOn((size_t)hi, p.qp(0).epoch(), &lkey, &w.adv[i].rkey))
            return fail("receive buffer of message " + std::to_string(w.adv[i].seq) +
                            " not registered on the re-opened HCA " + t_.port(nic_).sel.dev + " yet",
                        err);
        }
        const verbs::Advert& a = o.adv[0];
        r = o.grouped ? p.advertiseGroup(a.seq, o.adv, o.n, &e)
                      : p.advertise(a.seq, a.tag, (void*)(uintptr_t)a.addr, a.size, a.rkey, &e);
      }
      if (r < 0) return fail(e, err);
      if (r == 0) {  // no send slot: reap completions and try once more
        p.progress(*this);
        if (!why_.empty()) return *err = why_, -1;
        break;
      }
      out_.pop_front();
    }
    return 0;
  }
  // verbs::RecvPath::Sink
  void arrived(const verbs::Arrival& a) override { arr_.push_back(a); }
  void ctl(const verbs::CtlMsg& m) override {
    // A RESUME makes this standby the active path: its advertisements follow the answer, so
    // their grant starts now, beside the old path's fence that the answer waits for.
    if (m.type == verbs::CtlType::kResume) startGrant();
    ctlIn_.push_back(fromVerbs(m));
  }
  void broken(const verbs::Broken& b) override {
    if (why_.empty()) why_ = brokenText(b);
  }
  // Starts the grant of remote write (WriteGrant) once per path, on a fence thread.
  void startGrant() {
    if (grant_ || stage_ != kReady || fenced_ || sh_->path->writesGranted()) return;
    grant_ = std::make_shared<WriteGrant>();
    auto g = grant_;
    auto sh = sh_;
    t_.fencer().run([g, sh]() {
      if (!g->begin()) {  // the path was fenced first: its QPs keep refusing WRITEs
        g->finish(false, "cancelled: the path was fenced before its grant began");
        return;
      }
      std::string e;
      bool ok = sh->path->grantWrites(&e);
      g->finish(ok, e);
    });
  }

  friend std::vector<ibv_qp*> railover::rdma::pathQps(RecvPath*);
  RdmaTransport& t_;
  int nic_;
  int nStreams_;
  std::shared_ptr<Shared<verbs::RecvPath>> sh_;
  Stage stage_ = kWait;
  // The sender's endpoints: the first one's size until it names the path's QP count.
  std::vector<uint8_t> ep_ = std::vector<uint8_t>(verbs::QpEndpoint::kWireBytes);
  size_t got_ = 0;
  bool fenced_ = false;
  std::deque<Out> out_;
  std::deque<verbs::Arrival> arr_;  // arrivals in seq order, until the engine places them
  std::deque<CtlMsg> ctlIn_;
  std::shared_ptr<WriteGrant> grant_;  // null until the first RESUME or advertisement
  FenceGrantWait grantWait_;           // fence()'s wait for a running grant (lastFenceGrantWait)
};

}  // namespace

// ---- worker

Worker::Worker() : t_(&Worker::loop, this) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  t_.join();
}

void Worker::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(mu_);
    q_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Worker::postBringUp(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(mu_);
    up_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Worker::drain() {
  std::unique_lock<std::mutex> g(mu_);
  idle_.wait(g, [this] { return up_.empty() && q_.empty() && !busy_; });
}

void Worker::loop() {
  std::unique_lock<std::mutex> g(mu_);
  while (true) {
    cv_.wait(g, [this] { return stop_ || !up_.empty() || !q_.empty(); });
    if (up_.empty() && q_.empty()) return;  // stopping with nothing left
    std::deque<std::function<void()>>& from = up_.empty() ? q_ : up_;
    std::function<void()> job = std::move(from.front());
    from.pop_front();
    busy_ = true;
    g.unlock();
    job();
    job = nullptr;  // what the job held (a retired path) is destroyed here, on this thread
    g.lock();
    busy_ = false;
    if (up_.empty() && q_.empty()) idle_.notify_all();
  }
}

// ---- fence threads

FenceRunner::FenceRunner(int spares, int idleExitMs)
    : spares_(spares < 0 ? 0 : spares), idleExitMs_(idleExitMs < 1 ? 1 : idleExitMs) {
  std::lock_guard<std::mutex> g(mu_);
  for (int i = 0; i < spares_; ++i)
    if (!startLocked()) break;  // run() starts threads (or runs jobs) itself then
}

FenceRunner::~FenceRunner() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;  // no thread is started from here on
  }
  cv_.notify_all();  // the threads run what is still queued, then end
  // Rounds: a thread that was starting a spare as stop_ was set adds it before it ends, so
  // joining every thread of one round brings any such spare into the next.
  for (;;) {
    std::list<std::thread> all;
    {
      std::lock_guard<std::mutex> g(mu_);
      all.swap(threads_);
    }
    if (all.empty()) break;
    for (std::thread& t : all) t.join();
  }
  std::lock_guard<std::mutex> g(mu_);
  ended_.clear();
}

bool FenceRunner::startLocked() {
  if (stop_) return false;
  try {
    std::list<std::thread> one;
    one.emplace_back(&FenceRunner::loop, this);  // nothing can throw between the start and the keep
    threads_.splice(threads_.end(), one);
  } catch (const std::exception& e) {
    RO_WARN("railover: cannot start an RDMA fence thread (%s)", e.what());
    return false;
  }
  ++starting_;
  return true;
}

void FenceRunner::startReserved() {
  std::list<std::thread> one;
  try {
    one.emplace_back(&FenceRunner::loop, this);
  } catch (const std::exception& e) {
    RO_WARN("railover: cannot start a spare RDMA fence thread (%s)", e.what());
    std::lock_guard<std::mutex> g(mu_);
    --starting_;
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  threads_.splice(threads_.end(), one);
}

std::list<std::thread> FenceRunner::reapLocked() {
  std::list<std::thread> out;
  for (auto id = ended_.begin(); id != ended_.end();) {
    auto it = threads_.begin();
    while (it != threads_.end() && it->get_id() != *id) ++it;
    if (it == threads_.end()) {  // its starter has not added it yet: next time
      ++id;
      continue;
    }
    out.splice(out.end(), threads_, it);
    id = ended_.erase(id);
  }
  return out;
}

int FenceRunner::threads() const {
  std::lock_guard<std::mutex> g(mu_);
  return (int)threads_.size() - (int)ended_.size();
}

void FenceRunner::run(std::function<void()> job) {
  {
    std::unique_lock<std::mutex> g(mu_);
    if (!stop_) {
      q_.push_back(std::move(job));
      if (waiting_ + starting_ >= (int)q_.size()) {  // a thread that waits (or is starting) takes it
        g.unlock();
        cv_.notify_one();
        return;
      }
      if (startLocked()) {  // more fences at once than waiting threads
        callerStarts_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      job = std::move(q_.back());
      q_.pop_back();
    }
  }
  RO_WARN("railover: no RDMA fence thread: fencing on the caller's thread");
  job();
}

void FenceRunner::loop() {
  std::unique_lock<std::mutex> g(mu_);
  --starting_;
  while (true) {
    ++waiting_;
    // A held runner (hold(), tests) takes no job until released, unless it is stopping.
    bool woken = cv_.wait_for(g, std::chrono::milliseconds(idleExitMs_),
                              [this] { return stop_ || (!q_.empty() && !held_); });
    --waiting_;
    std::list<std::thread> done = reapLocked();  // threads that ended: joined outside the lock
    if (q_.empty() || (held_ && !stop_)) {
      bool leave = stop_ || (!woken && waiting_ >= spares_);  // stopping, or idle with enough others waiting
      if (leave) {
        ended_.push_back(std::this_thread::get_id());  // joined by another thread or the destructor
        g.unlock();
        for (std::thread& t : done) t.join();
        return;
      }
      // Staying: this thread stays counted in waiting_ while it lets go of mu_ to join ended
      // threads, or run() on NCCL's thread, finding no thread free in that window, would start
      // one itself. A job queued meanwhile is taken as soon as it is back: the wait checks the
      // queue before it sleeps.
      if (!done.empty()) {
        ++waiting_;
        g.unlock();
        for (std::thread& t : done) t.join();
        g.lock();
        --waiting_;
      }
      continue;
    }
    std::function<void()> job = std::move(q_.front());
    q_.pop_front();
    ++busy_;
    // Keep threads free for the next fences, started here (off the caller's thread, outside
    // mu_), so run() on NCCL's thread seldom waits for a start. With none left free for the
    // next fence (a burst: every comm of a dead NIC fences at once, and a fence may block for
    // seconds), the next thread starts before this job. With another still free it starts
    // after it, if still needed: a thread start costs ms on a loaded or emulated host (1.6 ms
    // median, up to 36 ms on the TCG bed) and this fence holds a RESUME's answer; on the bed
    // a start before the job put up to 17 ms between a fence's hand-off and its run.
    int free = waiting_ + starting_ - (int)q_.size();
    bool before = !stop_ && free <= 0 && free < spares_;
    if (before) ++starting_;
    g.unlock();
    if (before) startReserved();
    job();
    job = nullptr;  // what the job held is released here, never on the caller's (NCCL's) thread
    for (std::thread& t : done) t.join();  // returned from loop() already
    g.lock();
    --busy_;
    if (busy_ == 0 && q_.empty()) idle_.notify_all();
    // Top up to `spares_` free threads, this one (about to wait again) included.
    if (!stop_ && waiting_ + starting_ + 1 - (int)q_.size() < spares_) {
      ++starting_;
      g.unlock();
      startReserved();
      g.lock();
    }
  }
}

void FenceRunner::hold(bool held) {
  {
    std::lock_guard<std::mutex> g(mu_);
    held_ = held;
  }
  if (!held) cv_.notify_all();  // every waiting thread: as many jobs as threads may be queued
}

size_t FenceRunner::queued() const {
  std::lock_guard<std::mutex> g(mu_);
  return q_.size();
}

void FenceRunner::joinAll() {
  std::unique_lock<std::mutex> g(mu_);
  idle_.wait(g, [this] { return q_.empty() && busy_ == 0; });
}

// ---- transport

RdmaTransport::RdmaTransport(const std::vector<Nic>* nics, const Config* cfg, std::string* err, bool tcpWhereNoRdma)
    : ownBoot_(new TcpTransport(nics, cfg)), boot_(ownBoot_.get()), ib_(cfg->ib) {
  std::vector<std::string> names(nics->size());
  std::vector<verbs::PortSel> sels(nics->size());
  tcpWhy_.assign(nics->size(), std::string());
  int withPort = 0;
  for (const Nic& n : *nics) {
    std::string e;
    names[n.index] = n.name;
    verbs::PortChoice c = verbs::choosePortForNetdev(n.name, cfg->ib, &sels[n.index], &e);
    if (n.index == 0) {  // choosePortForNetdev loaded libibverbs, which ran ibv_fork_init (verbs_api.h)
      int rc = verbs::forkInitResult();
      if (rc > 0)
        RO_WARN("railover: ibv_fork_init failed (%s): memory registered for RDMA is not protected from a fork() "
                "on this kernel (NCCL's IB transport only warns too)", strerror(rc));
    }
    if (c == verbs::PortChoice::kChosenDown) {
      // As TCP keeps a NIC whose link is down: its comms start on the other NICs and move to
      // it once its port is ACTIVE (the port watch reports it down at once, then up).
      RO_WARN("railover: NIC %s: %s at init; its comms start on the other NICs and move to it once the port is ACTIVE",
              n.name.c_str(), e.c_str());
    } else if (c != verbs::PortChoice::kChosen && tcpWhereNoRdma) {
      sels[n.index] = verbs::PortSel();  // dev "": served over TCP (openPorts opens nothing for it)
      tcpWhy_[n.index] = e;
      RO_INFO(RO_SUBSYS_INIT | RO_SUBSYS_NET, "railover: RAILOVER_TRANSPORT=rdma+tcp: NIC %s served over tcp (%s); its comms "
              "fail over only to the other NICs served over tcp", n.name.c_str(), e.c_str());
      continue;
    } else if (c != verbs::PortChoice::kChosen) {
      *err = "NIC " + n.name + ": " + e;
      return;
    }
    ++withPort;
  }
  if (withPort == 0) {
    *err = "no NIC has an RDMA port";
    return;
  }
  rc_ = verbs::rcParamsFor(cfg->ib);
  std::string bad = rc_.validate();
  if (!bad.empty()) {
    *err = "RC QP settings (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_SL, NCCL_IB_TC, NCCL_IB_PKEY): " + bad;
    return;
  }
  if (!openPorts(names, sels, err)) return;
  for (size_t i = 0; i < ports_.size() && cfg->ib.pkeyIndex != 0; ++i) {
    if (!ports_[i].hca || !ports_[i].sel.active) continue;  // checked by the port watch when it comes up (the SM may not have set it yet)
    uint16_t pkey = 0;
    std::string e;
    if (!verbs::checkPkeyIndex(*ports_[i].hca, ports_[i].sel.port, (int)cfg->ib.pkeyIndex, &pkey, &e)) {
      *err = "NIC " + names[i] + ": NCCL_IB_PKEY=" + std::to_string(cfg->ib.pkeyIndex) + ": " + e;
      return;
    }
  }
  chooseRelaxedOrdering();
  detectGdr();
  ok_ = true;
}

RdmaTransport::RdmaTransport(const std::vector<verbs::PortSel>& ports, Transport* bootstrap, std::string* err,
                             const IbConfig& ib)
    : boot_(bootstrap), ib_(ib) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ports.size(); ++i) names.push_back("nic" + std::to_string(i));
  ok_ = openPorts(names, ports, err);
  if (ok_) chooseRelaxedOrdering(), detectGdr();
}

void RdmaTransport::chooseRelaxedOrdering() {
  ro_ = verbs::relaxedOrderingChoice(ib_, hcas_.empty() ? verbs::verbsApi(nullptr) : &hcas_[0]->api(), &roWhy_);
  for (auto& h : hcas_) h->setRelaxedOrdering(ro_);
}

void RdmaTransport::logRelaxedOrderingRefusals() {
  for (auto& h : hcas_)
    if (h->takeRelaxedOrderingRefusal())
      RO_WARN("railover: HCA %s refused IBV_ACCESS_RELAXED_ORDERING (EINVAL: a kernel that predates optional access "
              "flags): registered without it, and every later registration on %s is too (NCCL_IB_PCI_RELAXED_ORDERING=%u)",
              h->name().c_str(), h->name().c_str(), ib_.relaxedOrdering);
}

bool RdmaTransport::openPorts(const std::vector<std::string>& names, const std::vector<verbs::PortSel>& sels,
                              std::string* err) {
  names_ = names;
  tcpWhy_.resize(sels.size());
  ports_.resize(sels.size());
  for (size_t i = 0; i < sels.size(); ++i) {
    NicPort& np = ports_[i];
    np.sel = sels[i];
    if (np.sel.dev.empty()) {  // served over TCP (mixed mode): no HCA
      if (tcpWhy_[i].empty()) tcpWhy_[i] = "no RDMA port";
      continue;
    }
    for (size_t h = 0; h < hcas_.size(); ++h)
      if (hcas_[h]->name() == np.sel.dev) np.hca = hcas_[h].get(), np.hcaIndex = (int)h;
    if (np.hca) continue;
    std::string e;
    auto h = std::make_unique<verbs::Hca>(np.sel.dev, &e);
    if (!h->ok()) {
      *err = "NIC " + names[i] + ": cannot open HCA " + np.sel.dev + ": " + e;
      return false;
    }
    np.hca = h.get();
    np.hcaIndex = (int)hcas_.size();
    hcas_.push_back(std::move(h));
    reopenTries_.push_back(std::make_unique<std::atomic<uint64_t>>(0));
  }
  return true;
}

RdmaTransport::~RdmaTransport() {
  if (watch_.joinable()) {
    uint64_t one = 1;
    if (write(stopFd_, &one, sizeof(one)) < 0) RO_WARN("railover: cannot stop the RDMA port watch");
    watch_.join();
  }
  if (stopFd_ >= 0) close(stopFd_);
  sendFences_.drain();  // send fences still queued hand their paths to the worker
  fencer_.joinAll();    // fences still running hand their paths to the worker
  worker_.drain();      // paths retired through it go to the release thread
  releases_.drain();    // retired paths go before their HCAs
}

verbs::PortSel RdmaTransport::portSel(int nic) const {
  std::lock_guard<std::mutex> g(selMu_);
  return ports_[nic].sel;
}

void RdmaTransport::startPortWatch(PortSignal signal, AddrSignal addr) {
  if (watch_.joinable() || !ok_) return;
  stopFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  watch_ = std::thread(&RdmaTransport::watchLoop, this, std::move(signal), std::move(addr));
}

uint64_t RdmaTransport::reopenAttempts(int hca) const {
  return hca >= 0 && (size_t)hca < reopenTries_.size() ? reopenTries_[hca]->load() : 0;
}

bool RdmaTransport::reviveHca(size_t h, std::string* err) {
  verbs::Hca& hca = *hcas_[h];
  if (hca.deviceFatal() && !hca.reopen(err)) return false;
  {
    std::lock_guard<std::mutex> g(mrMu_);
    for (verbs::MrSet* mr : mrs_) {
      std::string e;
      if (!mr->refresh(h, &e)) {
        *err = "re-opened, but a registered buffer cannot be registered on it again: " + e;
        logRelaxedOrderingRefusals();
        return false;
      }
    }
  }
  logRelaxedOrderingRefusals();  // an HCA whose new opening refused the flag
  // Each NIC's flush QP is built on the new opening now: it also proves the opening works (a
  // provider may open a device that is still broken). Flushes in flight on the old QP fail
  // (FlushQp::test sees its opening dead) and move to another NIC.
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (ports_[i].hcaIndex != (int)h) continue;
    std::string e;
    auto q = std::make_shared<verbs::FlushQp>(*ports_[i].hca, portSel((int)i), rc_, &e);
    if (!q->ok()) {
      *err = "re-opened, but its flush QP cannot be built: " + e;
      return false;
    }
    FlushSlot& s = *flush_[i];
    std::shared_ptr<verbs::FlushQp> old;  // released on the worker: NCCL's test() takes s.mu
    {
      std::lock_guard<std::mutex> g(s.mu);
      if (s.building) continue;  // a rebuild on the worker will replace it (on the new opening)
      old = std::move(s.qp);
      s.qp = q, s.err.clear(), s.lastFailUs = 0, s.pending = false;
    }
    release(old);
  }
  return true;
}

// An InfiniBand port's new LID, also in the one line that says why the port was chosen
// ("...: InfiniBand, LID 17 (LID addressing, ...)"), so status does not show the old one.
static void relabelLid(verbs::PortSel* sel, uint16_t lid) {
  std::string was = "LID " + std::to_string(sel->lid) + " ";
  size_t at = sel->why.find(was);
  if (at != std::string::npos) sel->why.replace(at, was.size(), "LID " + std::to_string(lid) + " ");
  sel->lid = lid;
}

void RdmaTransport::watchLoop(PortSignal signal, AddrSignal addr) {
  // This thread reads the HCAs' events as they arrive: the paths' progress (NCCL's proxy
  // thread) then reads the event files only as a backstop (Hca::pollAsyncFromDataPath).
  struct Watching {
    decltype(hcas_)& hs;
    explicit Watching(decltype(hcas_)& h) : hs(h) {
      for (auto& x : hs) x->setWatched(true);
    }
    ~Watching() {
      for (auto& x : hs) x->setWatched(false);
    }
  } watching(hcas_);
  std::vector<uint64_t> seen(ports_.size(), UINT64_MAX), seenGid(ports_.size(), 0), seenLid(ports_.size(), 0);
  // As the plugin started: ACTIVE, save the ports chosen while down (PortChoice::kChosenDown),
  // which are reported down before the first wait.
  std::vector<int> state(ports_.size(), 1);
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (!ports_[i].hca) continue;  // served over TCP: health's carrier watch follows it
    verbs::PortSel cur = portSel((int)i);
    if (!cur.roce && cur.active) ports_[i].hca->notePortLid(cur.port, cur.lid);  // what paths compare theirs with
    if (cur.active) continue;
    state[i] = 0;
    signal((int)i, false, "RDMA port not ACTIVE at init (" + cur.dev + " port " + std::to_string(cur.port) + " " +
                              cur.state + ")");
  }
  std::vector<char> reopened(ports_.size(), 0);  // NIC's HCA re-opened, not yet reported up
  std::vector<char> pkeyWarned(ports_.size(), 0);
  struct Revive {
    bool pending = false;
    uint64_t nextUs = 0;
    uint64_t gapMs = kReopenFirstMs;
    std::string lastErr;
  };
  std::vector<Revive> rv(hcas_.size());
  uint64_t lastFullUs = nowUs();
  while (true) {
    // Flush QP rebuilds asked for during the gap after a failed build (by this loop's port-up
    // and LID handling below, by a flush or a regMr) start once it has passed, on the worker;
    // the wait below ends by then.
    uint64_t dueUs = startDueFlushRebuilds();
    int waitMs = kPortRecheckMs;
    if (dueUs < (uint64_t)kPortRecheckMs * 1000) waitMs = (int)((dueUs + 999) / 1000);
    // A dead opening's event file reports only errors (it would wake poll() at once, forever):
    // it leaves the set until the HCA is re-opened.
    std::vector<pollfd> fds;
    for (auto& h : hcas_)
      if (!h->deviceFatal()) fds.push_back({h->ctx()->async_fd, POLLIN, 0});
    fds.push_back({stopFd_, POLLIN, 0});
    poll(fds.data(), fds.size(), waitMs);
    if (fds.back().revents) return;
    for (auto& h : hcas_) h->pollAsync();  // folds events into the HCA's counters (paths read them too)
    uint64_t now = nowUs();
    bool full = now - lastFullUs >= (uint64_t)kPortRecheckMs * 1000;
    if (full) lastFullUs = now;
    for (size_t h = 0; h < hcas_.size(); ++h) {
      Revive& r = rv[h];
      if (hcas_[h]->deviceFatal() && !r.pending) {
        r.pending = true, r.gapMs = kReopenFirstMs, r.nextUs = now + (uint64_t)kReopenFirstMs * 1000;
        r.lastErr.clear();
      }
      if (!r.pending || now < r.nextUs) continue;
      std::string e;
      reopenTries_[h]->fetch_add(1);
      if (reviveHca(h, &e)) {
        r.pending = false;
        RO_INFO(RO_SUBSYS_NET, "railover: HCA %s re-opened after its device fatal error (opening %llu)",
                hcas_[h]->name().c_str(), (unsigned long long)hcas_[h]->epoch());
        for (size_t i = 0; i < ports_.size(); ++i)
          if (ports_[i].hcaIndex == (int)h) reopened[i] = 1, seenGid[i] = UINT64_MAX;  // choose the GID again
        continue;
      }
      if (e != r.lastErr)  // said when the reason changes, not every attempt
        RO_INFO(RO_SUBSYS_NET, "railover: HCA %s not re-opened yet: %s (next attempt in %llu ms, then up to every %d ms)",
                hcas_[h]->name().c_str(), e.c_str(), (unsigned long long)std::min<uint64_t>(r.gapMs * 2, kReopenMaxMs),
                kReopenMaxMs);
      r.lastErr = e;
      r.gapMs = std::min<uint64_t>(r.gapMs * 2, kReopenMaxMs);
      r.nextUs = now + r.gapMs * 1000;
    }
    for (size_t i = 0; i < ports_.size(); ++i) {
      NicPort& np = ports_[i];
      if (!np.hca) continue;  // served over TCP
      uint64_t gc = np.hca->gidChanges(np.sel.port);
      if (gc != seenGid[i]) {
        seenGid[i] = gc;
        verbs::PortSel cur = portSel((int)i), next;
        bool changed = false;
        std::string e;
        if (cur.roce && !verbs::reselectGid(*np.hca, ib_, cur, &next, &changed, &e)) {
          RO_WARN("railover: %s: GID table changed and no GID can be chosen now (%s); new paths on it fail until one can",
                  names_[i].c_str(), e.c_str());
        } else if (cur.roce && changed) {
          {
            std::lock_guard<std::mutex> g(selMu_);  // only the GID fields change (dev and port never do)
            ports_[i].sel.gidIndex = next.gidIndex;
            ports_[i].sel.gid = next.gid;
            ports_[i].sel.why = next.why;
          }
          RO_INFO(RO_SUBSYS_NET, "railover: %s: GID table changed, new paths use %s", names_[i].c_str(), next.why.c_str());
          if (addr)
            addr((int)i, "gid", std::to_string(cur.gidIndex) + " " + verbs::gidString(cur.gid), std::to_string(next.gidIndex) + " " + verbs::gidString(next.gid),
                 "GID table changed (" + np.sel.dev + " port " + std::to_string(np.sel.port) + "): " + next.why +
                     "; paths already connected keep their GID");
        }
      }
      // InfiniBand: the subnet manager gave the port another LID while it stayed ACTIVE. Every
      // QP connected with the old LID is dead (the peer's QPs address it): the paths on the port
      // see the new LID through Hca::portLid and break at their next progress call; new paths
      // use the new LID. Read after IBV_EVENT_LID_CHANGE and at every full re-check (an event
      // that came while the port read INIT, or before the HCA was opened, is not lost); a port
      // that is down reads its LID when it comes up (below).
      uint64_t lc = np.hca->lidChanges(np.sel.port);
      bool lidMoved = lc != seenLid[i];
      seenLid[i] = lc;
      uint64_t ev = np.hca->portStateEvents(np.sel.port);
      bool fatal = np.hca->deviceFatal() || rv[(size_t)np.hcaIndex].pending;  // down until re-registered too
      if (ev == seen[i] && !full && !fatal && !reopened[i] && !lidMoved) continue;
      seen[i] = ev;
      ibv_port_attr a{};
      int rc = fatal ? -1 : verbs::queryPort(np.hca->api(), np.hca->ctx(), (uint8_t)np.sel.port, &a);
      int up = !fatal && rc == 0 && a.state == IBV_PORT_ACTIVE;
      if (up && state[i] && !np.sel.roce && a.lid != 0) {
        verbs::PortSel cur = portSel((int)i);
        if (a.lid != cur.lid) {
          // The HCA first, then the choice: a path built from the old choice meanwhile breaks
          // (its LID is stale), one built from the new choice never sees a mismatch.
          np.hca->notePortLid(cur.port, a.lid);
          {
            std::lock_guard<std::mutex> g(selMu_);
            relabelLid(&ports_[i].sel, a.lid);
          }
          const verbs::FlushQp* fq = nullptr;
          {
            std::lock_guard<std::mutex> g(flush_[i]->mu);
            fq = flush_[i]->qp.get();
          }
          rebuildFlushQp((int)i, fq);  // it addresses itself with the port's LID
          std::string why = "subnet manager changed the LID of " + cur.dev + " port " + std::to_string(cur.port) +
                            " from " + std::to_string(cur.lid) + " to " + std::to_string(a.lid) +
                            ": its connected paths fail over, new paths use the new LID";
          RO_WARN("railover: NIC %s: %s", names_[i].c_str(), why.c_str());
          if (addr) addr((int)i, "lid", std::to_string(cur.lid), std::to_string(a.lid), why);
        }
      }
      if (up == state[i]) continue;
      if (up && ib_.pkeyIndex != 0) {  // a port that was down at init was not checked then
        uint16_t pkey = 0;
        std::string pe;
        if (!verbs::checkPkeyIndex(*np.hca, np.sel.port, (int)ib_.pkeyIndex, &pkey, &pe)) {
          if (!pkeyWarned[i])
            RO_WARN("railover: NIC %s: port active but NCCL_IB_PKEY=%u: %s; the NIC stays down until the entry is there",
                    names_[i].c_str(), ib_.pkeyIndex, pe.c_str());
          pkeyWarned[i] = 1;
          continue;  // looked at again at the next full check
        }
      }
      state[i] = up;
      if (up) {  // what a port learns when it comes up: on IB its LID (0 while down), the MTU
        {
          std::lock_guard<std::mutex> g(selMu_);
          if (!ports_[i].sel.roce) {
            np.hca->notePortLid(np.sel.port, a.lid);  // before the choice, as above
            relabelLid(&ports_[i].sel, a.lid);
          }
          ports_[i].sel.activeMtu = a.active_mtu;
          ports_[i].sel.speedMbps = verbs::portSpeedMbps(a.active_speed, a.active_width);
          ports_[i].sel.active = true;
        }
        // Its flush QP (iflush) addresses itself with the port's LID and MTU: build it anew
        // (on the worker) with the values the port has now.
        const verbs::FlushQp* cur = nullptr;
        {
          std::lock_guard<std::mutex> g(flush_[i]->mu);
          cur = flush_[i]->qp.get();
        }
        rebuildFlushQp((int)i, cur);
      } else {
        std::lock_guard<std::mutex> g(selMu_);
        ports_[i].sel.active = false;
      }
      const char* what = fatal ? "RDMA device fatal error" : !up ? "RDMA port error"
                         : reopened[i] ? "RDMA device re-opened, port active" : "RDMA port active";
      if (up) reopened[i] = 0;
      std::string why = std::string(what) + " (" + np.sel.dev + " port " + std::to_string(np.sel.port) +
                        (rc == 0 && !fatal ? std::string(" ") + np.hca->api().port_state_str(a.state) : std::string()) + ")";
      // Every QP and MR of a device that reported DEVICE_FATAL is gone: its NICs are down while
      // their comms run on the standby HCAs, until the re-open above succeeds. Said loudly.
      if (fatal) {
        why += ": railover re-opens the HCA every " + std::to_string(kReopenFirstMs) + " ms, backing off to " +
               std::to_string(kReopenMaxMs) + " ms, and moves back once its port is active";
        RO_WARN("railover: NIC %s: %s; its comms keep running on their standby paths", names_[i].c_str(), why.c_str());
      }
      signal((int)i, up != 0, why);
    }
  }
}

std::string RdmaTransport::describe() const {
  std::string s;
  std::lock_guard<std::mutex> g(selMu_);
  for (size_t i = 0; i < ports_.size(); ++i) {
    const NicPort& np = ports_[i];
    if (!np.hca) {
      s += (s.empty() ? "" : "; ") + names_[i] + " -> tcp [" + tcpWhy_[i] + "]";
      continue;
    }
    s += (s.empty() ? "" : "; ") + names_[i] + " -> " + np.sel.dev + " port " + std::to_string(np.sel.port) +
         (np.sel.roce ? " GID " + std::to_string(np.sel.gidIndex) : std::string(" LID ") + std::to_string(np.sel.lid)) +
         (np.sel.why.empty() ? "" : " [" + np.sel.why + "]");
  }
  std::string refused;
  for (auto& h : hcas_)
    if (h->relaxedOrderingRefused()) refused += (refused.empty() ? "" : ", ") + h->name();
  s += (s.empty() ? "" : "; ") + std::string("relaxed ordering ") + (ro_ ? "on" : "off") + " [" + roWhy_ + "]" +
       (refused.empty() ? "" : " (refused with EINVAL by " + refused + ": registered there without it)");
  return s;
}

bool RdmaTransport::devicePort(int nic, DevicePort* out) const {
  if (nic < 0 || nic >= (int)ports_.size() || !ports_[nic].hca) return false;
  verbs::PortSel s = portSel(nic);  // one copy under selMu_: the fields belong together
  out->hca = s.dev;
  out->port = s.port;
  out->roce = s.roce;
  out->active = s.active;
  out->gidIndex = s.roce ? s.gidIndex : -1;
  out->gid = s.roce ? verbs::gidString(s.gid) : std::string();
  out->lid = s.roce ? 0 : (int)s.lid;
  // ibv_mtu: IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5, i.e. 128 << code bytes.
  int m = (int)s.activeMtu;
  out->mtuBytes = m >= (int)IBV_MTU_256 && m <= (int)IBV_MTU_4096 ? 128 << m : 0;
  out->why = s.why;
  return true;
}

bool RdmaTransport::deviceProps(int nic, DeviceProps* out) const {
  if (nic < 0 || nic >= (int)ports_.size() || !ports_[nic].hca) return false;
  const verbs::Hca& hca = *ports_[nic].hca;
  verbs::PortSel s = portSel(nic);
  verbs::Hca::Attrs a = hca.attrs();
  DeviceProps p;
  p.port = s.port;
  if (a.sysImageGuid) {
    // As NCCL's IB transport reports it: the GUID's bytes as verbs gives them (network order)
    // read as a host integer, so topology files and dumps made with either transport agree.
    p.guid = htobe64(a.sysImageGuid);
    std::set<std::string> before;  // this process's other HCAs of the same adapter, sorted before this one
    for (const NicPort& o : ports_)
      if (o.hca && o.hca != &hca && o.hca->attrs().sysImageGuid == a.sysImageGuid && o.hca->name() < hca.name())
        before.insert(o.hca->name());
    for (const std::string& name : before)
      for (const NicPort& o : ports_)
        if (o.hca && o.hca->name() == name) {
          p.port += std::max(1, o.hca->attrs().physPorts);
          break;
        }
  }
  p.speedMbps = s.speedMbps;
  size_t rdmaNics = 0;  // a comm's paths on NICs served over TCP put no QP on an HCA
  for (const NicPort& o : ports_) rdmaNics += o.hca ? 1 : 0;
  uint64_t perComm = (uint64_t)std::max<uint32_t>(1, ib_.qpsPerConnection) * rdmaNics;
  if (a.maxQp > 0) p.maxComms = (int)std::max<uint64_t>(1, std::min<uint64_t>(65536, (uint64_t)a.maxQp / perComm));
  p.pciPath = hca.pciPath();
  char guid[24];
  snprintf(guid, sizeof guid, "0x%016llx", (unsigned long long)a.sysImageGuid);
  p.why = hca.name() + " port " + std::to_string(s.port) + ": sys_image_guid " + (a.sysImageGuid ? guid : "unknown") +
          ", max_qp " + std::to_string(a.maxQp) + ", rate " +
          (s.speedMbps ? std::to_string(s.speedMbps) + " Mbps" : std::string("unknown (port not read ACTIVE)")) +
          ", PCI " + (p.pciPath.empty() ? "none (the NIC's)" : p.pciPath);
  *out = p;
  return true;
}

void RdmaTransport::noteAccessReadBack(int nic, const verbs::RecvPath& p) {
  const NicPort& np = ports_[nic];
  {
    std::lock_guard<std::mutex> l(accessLogMu_);
    if (accessLogged_.size() < hcas_.size()) accessLogged_.resize(hcas_.size(), 0);
    if (np.hcaIndex < 0 || accessLogged_[np.hcaIndex]) return;
    accessLogged_[np.hcaIndex] = 1;
  }
  if (p.writesAllowed())
    RO_WARN("railover: %s: a receive path's QPs, brought up without IBV_ACCESS_REMOTE_WRITE, could not be confirmed "
            "to refuse RDMA writes (%s): a standby that never carried data counts as writable when its fence is stuck",
            np.hca->name().c_str(), p.accessReadBack().c_str());
  else
    RO_INFO(RO_SUBSYS_NET, "railover: %s: QP remote access read back as set (IBV_ACCESS_REMOTE_WRITE off until a path's first "
            "advertisement): the HCA enforces it", np.hca->name().c_str());
}

std::unique_ptr<Conn> RdmaTransport::connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) {
  return boot_->connect(nic, remote, len, err);
}

std::unique_ptr<SendPath> RdmaTransport::openSendPath(int nic, const sockaddr_storage& remote, socklen_t len, int nStreams,
                                                      const PathIdentity& id, const ChunkPolicy& chunks, std::string* err) {
  (void)nStreams;  // one bootstrap stream per path; its QPs: NCCL_IB_QPS_PER_CONNECTION
  if (overTcp(nic)) return boot_->openSendPath(nic, remote, len, nStreams, id, chunks, err);  // mixed mode
  if (nic < 0 || nic >= (int)ports_.size() || !ports_[nic].hca) return *err = "no HCA port behind NIC", nullptr;
  // The bootstrap connect starts here (non-blocking); the path's CQ, QPs and control-slot MRs
  // are created by the worker, not on the caller's thread, which is NCCL's when the engine
  // retries a failed path: on the TCG bed that creation held it 3.3 ms at the median and up to
  // 69 ms (path_up's open_us over 120 retries, docs/BENCHMARKS.md). Its error, if any, comes
  // from connectState().
  auto conn = boot_->connect(nic, remote, len, err);
  if (!conn) return nullptr;
  auto sh = std::make_shared<Shared<verbs::SendPath>>();
  sh->created.store(0, std::memory_order_relaxed);
  verbs::Hca* hca = ports_[nic].hca;
  // The comm's traffic class (NCCL's comm config), resolved against NCCL_IB_TC/NCCL_IB_SL as
  // NCCL does; the path's endpoints carry the result to the receiver, whose QPs use it too.
  verbs::RcParams rc = id.trafficClass >= 0 ? verbs::rcParamsFor(ib_, id.trafficClass) : rc_;
  worker_.postBringUp([sh, hca, sel = portSel(nic), rc, lanes = (int)ib_.qpsPerConnection] {
    if (sh->cancelled.load(std::memory_order_relaxed)) {
      sh->createErr = "path closed before its QPs were created";
      sh->created.store(-1, std::memory_order_release);
      return;
    }
    std::string e;
    auto vp = std::make_unique<verbs::SendPath>(*hca, sel, rc, &e, lanes);
    if (!vp->ok()) {
      sh->createErr = e.empty() ? "cannot create the path's QPs on " + hca->name() : e;
      sh->created.store(-1, std::memory_order_release);
      return;  // vp (what was created of it) is released here, on the worker
    }
    sh->path = std::move(vp);
    sh->created.store(1, std::memory_order_release);
  });
  return std::unique_ptr<SendPath>(new RdmaSendPath(*this, nic, std::move(conn), id, chunks.maxChunkBytes, std::move(sh)));
}

std::unique_ptr<RecvPath> RdmaTransport::newRecvPath(int nStreams) { return newRecvPathOn(-1, nStreams); }

std::unique_ptr<RecvPath> RdmaTransport::newRecvPathOn(int localNic, int nStreams) {
  if (overTcp(localNic)) return boot_->newRecvPathOn(localNic, nStreams);  // mixed mode: the sender's path is TCP too
  return std::unique_ptr<RecvPath>(new RdmaRecvPath(*this, localNic, nStreams));
}

bool RdmaTransport::endLivenessCheck(Conn& c, std::string* err) { return boot_->endLivenessCheck(c, err); }

bool RdmaTransport::listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, StreamRouter* router,
                           std::string* err) {
  return boot_->listen(nic, addr, len, port, router, err);
}

bool RdmaTransport::encodeHandle(const PeerHandle& h, void* out, std::string* err) {
  if (h.transport == "tcp" && mixed()) return boot_->encodeHandle(h, out, err);  // a comm of a NIC served over TCP
  if (h.transport != name()) return *err = "a " + h.transport + " handle asked of the rdma transport", false;
  return encodeWireHandle(h, out, err);
}

bool RdmaTransport::decodeHandle(const void* in, size_t len, PeerHandle* h, std::string* err) {
  return decodeWireHandle(in, len, h, err);
}

void RdmaTransport::detectGdr() {
  std::string which;
  peerMem_ = verbs::gdrPeerMemLoaded("", &which);
  dmabuf_.assign(hcas_.size(), 0);
  for (size_t h = 0; h < hcas_.size(); ++h) {
    std::string why;
    dmabuf_[h] = verbs::dmabufSupported(*hcas_[h], &why);
    RO_INFO(RO_SUBSYS_NET, "railover: HCA %s: GPUDirect RDMA %s, dmabuf %s", hcas_[h]->name().c_str(),
            peerMem_ ? ("available (" + which + ")").c_str() : "not available (no GPU peer-memory client loaded)",
            dmabuf_[h] ? "supported" : ("not supported: " + why).c_str());
  }
  flush_.clear();
  for (size_t i = 0; i < ports_.size(); ++i) flush_.emplace_back(new FlushSlot());
}

void RdmaTransport::setGdrForTest(bool peerMem, bool dmabuf) {
  peerMem_ = peerMem;
  dmabuf_.assign(hcas_.size(), dmabuf ? 1 : 0);
}

void RdmaTransport::setDmabufForTest(size_t hca, bool supported) {
  if (hca < dmabuf_.size()) dmabuf_[hca] = supported ? 1 : 0;
}

verbs::FlushQp* RdmaTransport::flushQpForTest(int nic) {
  std::lock_guard<std::mutex> g(flush_[nic]->mu);
  return flush_[nic]->qp.get();
}

std::string RdmaTransport::nicDevice(int nic) const {
  if (nic < 0 || nic >= (int)ports_.size() || !ports_[nic].hca) return std::string();
  return port(nic).sel.dev + " port " + std::to_string(port(nic).sel.port);
}

uint32_t RdmaTransport::ptrSupport(int nic) const {
  // The same for every NIC with an RDMA port: a comm registers its buffers on every HCA (it may
  // fail over to any). A NIC served over TCP (mixed mode) sends from host memory only, as the
  // TCP transport; its comms fail over only to NICs served over TCP.
  if (overTcp(nic)) return kPtrHost;
  uint32_t p = kPtrHost;
  if (peerMem_) p |= kPtrCuda;
  // DMABUF only when every HCA takes dmabufs: regMrDmaBuf registers the dmabuf on each of them
  // inside the call, and a refusal on one (a standby HCA of another model) would fail NCCL's
  // connect-time registration, which is fatal. Without it NCCL uses its other paths.
  bool all = !dmabuf_.empty();
  for (char d : dmabuf_) all = all && d;
  if (all) p |= kPtrDmaBuf;
  return p;
}

static std::vector<verbs::Hca*> hcaList(const std::vector<std::unique_ptr<verbs::Hca>>& hcas) {
  std::vector<verbs::Hca*> hs;
  for (auto& h : hcas) hs.push_back(h.get());
  return hs;
}

void* RdmaTransport::regMr(void* data, size_t size, int ptrType, std::string* err) {
  if (ptrType == (int)kPtrCuda && !peerMem_)
    return *err = "GPU memory asked, but no GPU peer-memory client (nvidia_peermem) is loaded: ptrSupport is host only",
           nullptr;
  if (ptrType != (int)kPtrHost && ptrType != (int)kPtrCuda)
    return *err = "unknown memory type " + std::to_string(ptrType) + " (NCCL_PTR_HOST 1 or NCCL_PTR_CUDA 2)", nullptr;
  auto* mr = new verbs::MrSet(hcaList(hcas_), data, size, err);
  logRelaxedOrderingRefusals();
  if (!mr->ok()) {
    delete mr;
    return nullptr;
  }
  if (!track(mr, err)) {
    delete mr;
    return nullptr;
  }
  ensureFlushQps();
  return mr;
}

void* RdmaTransport::regMrDmaBuf(void* data, size_t size, uint64_t offset, int fd, std::string* err) {
  for (size_t h = 0; h < hcas_.size(); ++h)
    if (h >= dmabuf_.size() || !dmabuf_[h])
      return *err = "HCA " + hcas_[h]->name() + " does not register dmabufs (ptrSupport has no DMABUF)", nullptr;
  auto* mr = new verbs::MrSet(hcaList(hcas_), data, size, offset, fd, err);
  logRelaxedOrderingRefusals();
  if (!mr->ok()) {
    delete mr;
    return nullptr;
  }
  if (!track(mr, err)) {
    delete mr;
    return nullptr;
  }
  ensureFlushQps();
  return mr;
}

void* RdmaTransport::regMrOn(int nic, void* data, size_t size, int ptrType, std::string* err) {
  if (!overTcp(nic)) return regMr(data, size, ptrType, err);
  if (ptrType != (int)kPtrHost)
    return *err = "NIC " + std::to_string(nic) + " is served over TCP (RAILOVER_TRANSPORT=rdma+tcp): its comms register "
                  "host memory only (ptrSupport host), memory type " + std::to_string(ptrType) + " asked",
           nullptr;
  auto* r = new HostRegistration{data, size};
  std::lock_guard<std::mutex> g(hostMu_);
  hostRegs_.insert(r);
  return r;
}

void* RdmaTransport::regMrDmaBufOn(int nic, void* data, size_t size, uint64_t offset, int fd, std::string* err) {
  if (!overTcp(nic)) return regMrDmaBuf(data, size, offset, fd, err);
  return *err = "NIC " + std::to_string(nic) + " is served over TCP (RAILOVER_TRANSPORT=rdma+tcp): its comms register "
                "no dmabufs (ptrSupport host)",
         nullptr;
}

uint64_t RdmaTransport::flushNowUs() const { return flushClock_ ? flushClock_() : nowUs(); }

void RdmaTransport::ensureFlushQps() {
  for (size_t i = 0; i < flush_.size(); ++i) {
    if (overTcp((int)i)) continue;  // no HCA: nothing to read through
    FlushSlot& s = *flush_[i];
    std::lock_guard<std::mutex> g(s.mu);
    if (s.qp || s.building) continue;
    verbs::PortSel sel = portSel((int)i);
    if (!sel.active) continue;  // built by the port watch when the port comes up (its LID, MTU)
    if (s.lastFailUs && flushNowUs() - s.lastFailUs < kFlushRebuildGapUs) {
      s.pending = true;  // the port watch starts it when the gap ends
      continue;
    }
    std::string e;
    s.pending = false;
    auto q = std::make_shared<verbs::FlushQp>(*ports_[i].hca, sel, rc_, &e);
    if (q->ok()) s.qp = q, s.err.clear(), s.lastFailUs = 0;
    else s.err = e, s.lastFailUs = flushNowUs(), RO_WARN("railover: NIC %s: no flush QP: %s", names_[i].c_str(), e.c_str());
  }
}

void RdmaTransport::rebuildFlushQp(int nic, const verbs::FlushQp* failed) {
  FlushSlot& s = *flush_[nic];
  std::shared_ptr<verbs::FlushQp> old;  // released on the worker, not here (NCCL's thread)
  bool start = false;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.qp && s.qp.get() != failed) return;  // already rebuilt by another flush
    old = std::move(s.qp);  // failed: no new flush goes to it (ops holding it keep it alive)
    if (!s.building) {
      // Within the gap after a failed build: remembered, and started by the port watch once
      // the gap has passed (startDueFlushRebuilds). Before, it was dropped, and a port back up
      // or a LID change right after a failed build left the NIC without a flush QP until a
      // flush or a registration happened to ask again.
      start = !(s.lastFailUs && flushNowUs() - s.lastFailUs < kFlushRebuildGapUs);
      if (start) s.building = true, s.pending = false;
      else s.pending = true;
    }
    // (A build running now ends with the port's current choice: buildFlushQp.)
  }
  release(old);
  if (!start) return;
  worker_.post([this, nic] { buildFlushQp(nic); });
}

uint64_t RdmaTransport::startDueFlushRebuilds() {
  uint64_t next = UINT64_MAX;
  for (size_t i = 0; i < flush_.size(); ++i) {
    FlushSlot& s = *flush_[i];
    {
      std::lock_guard<std::mutex> g(s.mu);
      if (!s.pending) continue;
      if (s.qp || s.building || !portSel((int)i).active) {
        // Built or being built meanwhile (a flush, a regMr, a re-open), or the port went down
        // (its return rebuilds it).
        s.pending = false;
        continue;
      }
      uint64_t now = flushNowUs(), due = s.lastFailUs + kFlushRebuildGapUs;
      if (now < due) {
        next = std::min(next, due - now);
        continue;
      }
      s.pending = false, s.building = true;
    }
    RO_INFO(RO_SUBSYS_NET, "railover: NIC %s: flush QP rebuild asked for during the %llu ms after a failed build: started now",
            names_[i].c_str(), (unsigned long long)(kFlushRebuildGapUs / 1000));
    worker_.post([this, i] { buildFlushQp((int)i); });
  }
  return next;
}

// Whether a flush QP built for `built` still addresses the port as `now` does: the LID (IB),
// the GID index and GID (RoCE) and the MTU it connected itself with.
static bool sameFlushAddress(const verbs::PortSel& built, const verbs::PortSel& now) {
  return built.roce == now.roce && built.lid == now.lid && built.gidIndex == now.gidIndex &&
         std::memcmp(built.gid.raw, now.gid.raw, sizeof built.gid.raw) == 0 && built.activeMtu == now.activeMtu;
}

void RdmaTransport::buildFlushQp(int nic) {
  FlushSlot& s = *flush_[nic];
  verbs::Hca& hca = *ports_[nic].hca;
  verbs::PortSel sel = portSel(nic);
  uint64_t epoch = hca.epoch();
  std::string e;
  auto q = std::make_shared<verbs::FlushQp>(hca, sel, rc_, &e);
  {
    std::lock_guard<std::mutex> g(s.mu);
    // The port watch may have changed the choice meanwhile (a new LID, a re-chosen GID, the
    // port back with another MTU) or re-opened the HCA: its own rebuild found this one running
    // and started none, so this one must not install a QP built from the old choice. It builds
    // again from the new one instead (s.building stays set: flushes wait for it). Each repeat
    // needs another change of the choice: no loop without one.
    if (sameFlushAddress(sel, portSel(nic)) && epoch == hca.epoch()) {
      s.building = false, s.pending = false;
      if (q->ok()) s.qp = q, s.err.clear(), s.lastFailUs = 0;
      else s.err = e, s.lastFailUs = flushNowUs();
      return;
    }
  }
  RO_INFO(RO_SUBSYS_NET, "railover: NIC %s: the port's address changed while its flush QP was being built: built again",
          names_[nic].c_str());
  q.reset();  // here, on the worker (never referenced elsewhere)
  worker_.post([this, nic] { buildFlushQp(nic); });
}

// One iflush: a READ through `order[k]`'s flush QP; on failure the next NIC's.
class RdmaFlushOp : public FlushOp {
 public:
  RdmaFlushOp(RdmaTransport* t, std::vector<int> order, uint64_t addr, const verbs::MrSet* mr)
      : t_(t), order_(std::move(order)), addr_(addr), mr_(mr) {}
  // NCCL frees the request on its thread. While qp_ is still its slot's QP the slot keeps it
  // alive and dropping ours releases nothing (the common case: one uncontended lock, no worker
  // job per flush); a QP replaced meanwhile may be ours alone and goes to the worker.
  ~RdmaFlushOp() override {
    if (!qp_) return;
    RdmaTransport::FlushSlot& s = *t_->flush_[order_[k_]];  // qp_ is order_[k_]'s (see test())
    {
      std::lock_guard<std::mutex> g(s.mu);
      if (s.qp == qp_) {
        qp_.reset();
        return;
      }
    }
    t_->release(qp_);
  }
  int test(std::string* err) override {
    while (k_ < order_.size()) {
      int nic = order_[k_];
      if (!qp_) {
        RdmaTransport::FlushSlot& s = *t_->flush_[nic];
        std::unique_lock<std::mutex> g(s.mu);
        if (!s.qp) {
          if (s.building) return 0;  // wait for the rebuild
          errs_ += (errs_.empty() ? "" : "; ") + t_->names_[nic] + ": " + (s.err.empty() ? "no flush QP" : s.err);
          g.unlock();
          t_->rebuildFlushQp(nic, nullptr);  // at most once per kFlushRebuildGapUs after a failed build (remembered within it)
          ++k_;
          continue;
        }
        qp_ = s.qp;
        int idx = mr_->indexOf(t_->ports_[nic].hca);
        ticket_ = qp_->request(addr_, idx >= 0 ? mr_->rkey((size_t)idx) : 0);
      }
      std::string e;
      int r = qp_->test(ticket_, &e);
      if (r >= 0) return r;
      errs_ += (errs_.empty() ? "" : "; ") + t_->names_[nic] + ": " + e;
      t_->rebuildFlushQp(nic, qp_.get());
      t_->release(qp_);  // perhaps the last reference: its QP goes on the release thread
      ++k_;
    }
    *err = "flush failed on every NIC (" + errs_ + ")";
    return -1;
  }

 private:
  RdmaTransport* t_;
  std::vector<int> order_;
  size_t k_ = 0;
  uint64_t addr_;
  const verbs::MrSet* mr_;
  std::shared_ptr<verbs::FlushQp> qp_;
  uint64_t ticket_ = 0;
  std::string errs_;
};

std::unique_ptr<FlushOp> RdmaTransport::flush(int nic, void* data, void* mhandle, std::string* err) {
  auto* mr = (const verbs::MrSet*)mhandle;
  if (!mr) return *err = "flush of a buffer that was not registered with this transport (regMr)", nullptr;
  if (nic < 0 || (size_t)nic >= flush_.size()) return *err = "flush through NIC " + std::to_string(nic) + ", which does not exist", nullptr;
  // Mixed mode: the data came over TCP, through host memory (nothing to flush); the mhandle
  // may be regMrOn's HostRegistration, not an MrSet.
  if (overTcp(nic)) return nullptr;
  if (mr->size() == 0) return nullptr;  // nothing can have been written
  std::vector<int> order{nic};
  for (int i = 0; i < (int)flush_.size(); ++i)
    if (i != nic && !overTcp(i)) order.push_back(i);
  return std::unique_ptr<FlushOp>(new RdmaFlushOp(this, std::move(order), (uint64_t)(uintptr_t)data, mr));
}

bool RdmaTransport::track(verbs::MrSet* mr, std::string* err) {
  std::lock_guard<std::mutex> g(mrMu_);
  // A registration that raced a re-open may hold keys of the old opening (or none): bring it up
  // to date now (a no-op for every HCA it is current on). If that fails the registration fails,
  // as it would have without the re-open: no NIC may come up with a buffer it has no key for.
  for (size_t h = 0; h < hcas_.size(); ++h) {
    verbs::Hca::Opening o = hcas_[h]->current();
    if (mr->epochOf(h) != o.epoch && !o.dead && !mr->refresh(h, err)) return logRelaxedOrderingRefusals(), false;
  }
  logRelaxedOrderingRefusals();
  mrs_.push_back(mr);
  return true;
}

void RdmaTransport::deregMr(void* mhandle) {
  auto* mr = (verbs::MrSet*)mhandle;
  {
    std::lock_guard<std::mutex> g(hostMu_);
    if (hostRegs_.erase(mhandle)) {  // regMrOn's, for a comm on a NIC served over TCP
      delete static_cast<HostRegistration*>(mhandle);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> g(mrMu_);
    for (size_t i = 0; i < mrs_.size(); ++i)
      if (mrs_[i] == mr) {
        mrs_[i] = mrs_.back();
        mrs_.pop_back();
        break;
      }
  }
  delete mr;
}

namespace {
// The QPs of a path whose bring-up finished, lane 0 first (empty otherwise).
template <typename P>
std::vector<ibv_qp*> qpsOf(const std::shared_ptr<Shared<P>>& sh) {
  std::vector<ibv_qp*> v;
  if (!sh || sh->result.load(std::memory_order_acquire) != 1 || !sh->path) return v;
  for (int i = 0; i < sh->path->lanes(); ++i) v.push_back(sh->path->qp(i).qp());
  return v;
}
}  // namespace

std::vector<ibv_qp*> pathQps(SendPath* p) {
  auto* r = dynamic_cast<RdmaSendPath*>(p);
  return r ? qpsOf(r->sh_) : std::vector<ibv_qp*>{};
}

std::vector<ibv_qp*> pathQps(RecvPath* p) {
  auto* r = dynamic_cast<RdmaRecvPath*>(p);
  return r ? qpsOf(r->sh_) : std::vector<ibv_qp*>{};
}

ibv_qp* pathQp(SendPath* p) {
  std::vector<ibv_qp*> v = pathQps(p);
  return v.empty() ? nullptr : v[0];
}

ibv_qp* pathQp(RecvPath* p) {
  std::vector<ibv_qp*> v = pathQps(p);
  return v.empty() ? nullptr : v[0];
}

bool rdmaUsable(const std::vector<Nic>& nics, const Config& cfg, std::string* why, std::vector<std::string>* withRdma) {
  if (nics.empty()) return *why = "no NIC", false;
  std::string first;
  for (const Nic& n : nics) {
    verbs::PortSel sel;
    std::string e;
    verbs::PortChoice c = verbs::choosePortForNetdev(n.name, cfg.ib, &sel, &e);
    if (c != verbs::PortChoice::kChosen && c != verbs::PortChoice::kChosenDown) {  // a down port is still RDMA
      if (first.empty()) first = "NIC " + n.name + ": " + e;
    } else if (withRdma) {
      withRdma->push_back(n.name);
    }
  }
  if (!first.empty()) return *why = first, false;
  return true;
}

}  // namespace rdma
}  // namespace railover
