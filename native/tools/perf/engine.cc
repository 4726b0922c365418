// railover-perf engine: service thread, progress thread, watchdog (see engine.h).
#include "tools/perf/engine.h"

#include <sched.h>

#include <cstdlib>
#include <cstring>

#include "tools/perf/util.h"

namespace rperf {

// ---------------------------------------------------------------------------------------------
// Conn / TimeSeries
// ---------------------------------------------------------------------------------------------
Conn::~Conn() {
  for (auto& b : buf) {
    free(b);
    b = nullptr;
  }
}

void TimeSeries::start(uint64_t t0Us, uint64_t maxSeconds) {
  t0_ = t0Us;
  std::vector<std::atomic<uint64_t>> v(size_t(maxSeconds * 1000 + 1));
  for (auto& x : v) x.store(0, std::memory_order_relaxed);
  buckets_.swap(v);
  on_ = true;
}

std::vector<uint64_t> TimeSeries::snapshot(uint64_t endUs) const {
  std::vector<uint64_t> out;
  if (!on_) return out;
  uint64_t n = endUs > t0_ ? (endUs - t0_ + 999) / 1000 : 0;
  if (n > buckets_.size()) n = buckets_.size();
  out.reserve(n);
  for (uint64_t i = 0; i < n; i++) out.push_back(buckets_[i].load(std::memory_order_relaxed));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Engine
// ---------------------------------------------------------------------------------------------
struct Engine::Task {
  enum Kind { kSetup, kClose } kind;
  Conn* c;
  int ticket;
  int stage = 0;
  uint64_t startUs = 0;
  uint64_t polls = 0;
};

Engine::Engine(Plugin& net, Rendezvous& rv, const EngineConfig& cfg) : net_(net), rv_(rv), cfg_(cfg) {}

Engine::~Engine() {
  stopProgress(false);
  stopService();
}

void Engine::start() {
  svcThread_ = std::thread([this] { serviceLoop(); });
  progThread_ = std::thread([this] { progressLoop(); });
}

std::unique_ptr<Conn> Engine::makeConn(bool isSend, int peer, int channel, uint32_t round, void* ctx, Waiter* w,
                                       int dev) {
  auto c = std::make_unique<Conn>();
  c->isSend = isSend;
  c->peer = peer;
  c->channel = channel;
  c->round = round;
  c->ctx = ctx;
  c->dev = dev >= 0 ? dev : cfg_.dev;
  c->myRank = cfg_.rank;
  c->waiter = w;
  c->label = strf("%s comm ch%d %s rank %d (round %u)", isSend ? "send" : "recv", channel, isSend ? "to" : "from", peer,
                  round);
  for (int p = 0; p < kNumProtos; p++) {
    c->slotBytes[p] = cfg_.slotBytes[p];
    size_t bytes = c->slotBytes[p] * kSteps;
    size_t alloc = (bytes + 4095) / 4096 * 4096;
    c->buf[p] = static_cast<char*>(aligned_alloc(4096, alloc ? alloc : 4096));
    if (!c->buf[p]) {
      Fatal::get().raise(kExitInternal, strf("cannot allocate %zu bytes of connection buffers", alloc));
      throw Aborted{};
    }
    memset(c->buf[p], 0, alloc);
  }
  return c;
}

int Engine::setupAsync(const std::vector<Conn*>& conns) {
  int ticket;
  {
    std::lock_guard<std::mutex> g(ticketMu_);
    ticket = int(ticketLeft_.size());
    ticketLeft_.push_back(int(conns.size()));
  }
  {
    std::lock_guard<std::mutex> g(svcMu_);
    for (Conn* c : conns) svcQueue_.push_back(std::make_shared<Task>(Task{Task::kSetup, c, ticket}));
  }
  svcCv_.notify_all();
  return ticket;
}

int Engine::closeAsync(const std::vector<Conn*>& conns) {
  int ticket;
  {
    std::lock_guard<std::mutex> g(ticketMu_);
    ticket = int(ticketLeft_.size());
    ticketLeft_.push_back(int(conns.size()));
  }
  {
    std::lock_guard<std::mutex> g(svcMu_);
    for (Conn* c : conns) svcQueue_.push_back(std::make_shared<Task>(Task{Task::kClose, c, ticket}));
  }
  svcCv_.notify_all();
  return ticket;
}

bool Engine::setupDone(int ticket) {
  std::lock_guard<std::mutex> g(ticketMu_);
  return ticketLeft_[size_t(ticket)] == 0;
}

bool Engine::waitSetup(int ticket, uint64_t deadlineUs, bool stopOnAbort) {
  std::unique_lock<std::mutex> lk(ticketMu_);
  for (;;) {
    if (ticketLeft_[size_t(ticket)] == 0) return !(stopOnAbort && Fatal::get().halted());
    if (stopOnAbort && Fatal::get().halted()) return false;
    uint64_t now = nowUs();
    if (now >= deadlineUs) {
      Fatal::get().raise(kExitTimeout, strf("service thread: %d connection setup/close tasks still pending at the "
                                            "deadline",
                                            ticketLeft_[size_t(ticket)]));
      return false;
    }
    ticketCv_.wait_for(lk, std::chrono::microseconds(std::min<uint64_t>(deadlineUs - now, 50000)));
  }
}

void Engine::stopService() {
  {
    std::lock_guard<std::mutex> g(svcMu_);
    svcStop_ = true;
  }
  svcCv_.notify_all();
  if (svcThread_.joinable()) svcThread_.join();
}

// ---- service thread ---------------------------------------------------------------------------
void Engine::serviceLoop() {
  CallTracker::get().registerThread("service");
  std::vector<std::shared_ptr<Task>> active;
  auto finish = [this](Task& t) {
    {
      std::lock_guard<std::mutex> g(ticketMu_);
      ticketLeft_[size_t(t.ticket)]--;
    }
    ticketCv_.notify_all();
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(svcMu_);
      if (active.empty())
        svcCv_.wait(lk, [&] { return svcStop_ || !svcQueue_.empty(); });
      while (!svcQueue_.empty()) {
        active.push_back(svcQueue_.front());
        svcQueue_.pop_front();
      }
      if (svcStop_ && active.empty()) break;
    }
    bool pending = false;
    for (size_t i = 0; i < active.size();) {
      Task& t = *active[i];
      Conn* c = t.c;
      bool done = false;
      uint64_t now = nowUs();
      if (!t.startUs) t.startUs = now;
      if (t.kind == Task::kSetup) {
        if (Fatal::get().halted() || cancelSetup_.load()) {
          done = true;  // abandon setup; the close path cleans up whatever exists
        } else if (t.stage == 0) {
          if (!c->isSend) {
            if (net_.listen(c->ctx, c->dev, c->handle, &c->listenComm, c->label)) {
              if (!c->listenComm) {
                Fatal::get().raise(kExitPlugin, "plugin call listen returned success with a NULL listen comm");
              } else {
                std::string err;
                Rendezvous::Tag tag{Rendezvous::kHandle, uint32_t(c->channel), 0, c->round};
                if (!rv_.send(c->peer, tag, c->handle, sizeof c->handle, &err))
                  Fatal::get().raise(kExitPeer, "handle exchange: " + err);
                t.stage = 1;
              }
            }
          } else {
            std::vector<char> h;
            Rendezvous::Tag tag{Rendezvous::kHandle, uint32_t(c->channel), 0, c->round};
            auto s = rv_.tryRecv(c->peer, tag, &h);
            if (s == Rendezvous::Status::kOk) {
              if (h.size() != sizeof c->handle) {
                Fatal::get().raise(kExitInternal, "handle exchange: wrong handle size");
              } else {
                memcpy(c->handle, h.data(), h.size());
                t.stage = 1;
              }
            } else if (s == Rendezvous::Status::kPeerGone) {
              Fatal::get().raise(kExitPeer, strf("rank %d exited before sending its listen handle for %s", c->peer,
                                                 c->label.c_str()));
            }
          }
        }
        if (!done && !Fatal::get().halted() && t.stage == 1) {
          // Non-blocking connect/accept, polled once per service pass (as NCCL's proxy does).
          t.polls++;
          void* comm = nullptr;
          bool ok = c->isSend ? net_.connect(c->ctx, c->dev, c->handle, &comm, c->label)
                              : net_.accept(c->listenComm, &comm, c->label);
          if (ok && comm) {
            c->comm = comm;
            if (!c->isSend) {
              net_.closeListen(c->listenComm, c->label);
              c->listenComm = nullptr;
            }
            t.stage = 2;
          }
        }
        if (!done && !Fatal::get().halted() && t.stage == 2) {
          for (int p = 0; p < kNumProtos; p++) {
            if (!net_.regMr(c->comm, c->buf[p], c->slotBytes[p] * kSteps, &c->mh[p],
                            strf("%s (%s buffer)", c->label.c_str(), p == kProtoLL ? "LL" : "SIMPLE")))
              break;
          }
          if (!Fatal::get().halted()) {
            c->ready.store(true, std::memory_order_release);
            done = true;
          }
        }
        if (!done && !Fatal::get().halted() && now - t.startUs > cfg_.opTimeoutUs) {
          const char* what = t.stage == 0 ? (c->isSend ? "waiting for the peer's listen handle" : "listen")
                                          : (c->isSend ? "connect" : "accept");
          Fatal::get().raise(kExitTimeout, strf("%s not established after %.1f s (stuck in %s, polled %llu times)",
                                                c->label.c_str(), double(now - t.startUs) / 1e6, what,
                                                (unsigned long long)t.polls));
        }
        if (Fatal::get().halted()) done = true;
      } else {  // kClose: deregMr every registration, then close (NCCL's order); never waits on the peer
        for (int p = 0; p < kNumProtos; p++) {
          if (c->mh[p]) net_.deregMr(c->comm, c->mh[p], c->label);
          c->mh[p] = nullptr;
        }
        if (c->comm) {
          if (c->isSend) net_.closeSend(c->comm, c->label);
          else net_.closeRecv(c->comm, c->label);
          c->comm = nullptr;
        }
        if (c->listenComm) {
          net_.closeListen(c->listenComm, c->label);
          c->listenComm = nullptr;
        }
        c->closed.store(true, std::memory_order_release);
        done = true;
      }
      if (done) {
        finish(t);
        active.erase(active.begin() + long(i));
      } else {
        pending = true;
        i++;
      }
    }
    if (pending) sched_yield();
  }
}

// ---- progress thread --------------------------------------------------------------------------
void Engine::runOnProgress(std::function<void()> fn) {
  std::unique_lock<std::mutex> lk(progMu_);
  if (progExited_) {  // nobody else touches the conn list any more: apply here
    fn();
    return;
  }
  uint64_t seq = ++cmdPosted_;
  progCmds_.push_back(std::move(fn));
  progCv_.notify_all();
  progCv_.wait(lk, [&] { return cmdDone_ >= seq; });
}

void Engine::addToProgress(const std::vector<Conn*>& conns) {
  runOnProgress([this, conns] {
    for (Conn* c : conns) progConns_.push_back(c);
  });
}

void Engine::removeFromProgress(const std::vector<Conn*>& conns) {
  runOnProgress([this, conns] {
    for (Conn* c : conns) {
      for (size_t i = 0; i < progConns_.size(); i++)
        if (progConns_[i] == c) {
          progConns_.erase(progConns_.begin() + long(i));
          break;
        }
    }
  });
}

void Engine::setNetAttrOnProgress(void* ctx, const ncclNetAttr_t& attr) {
  runOnProgress([this, ctx, attr] {
    if (Fatal::get().halted()) return;
    ncclNetAttr_t a = attr;
    net_.setNetAttr(ctx, &a);
  });
}

void Engine::stopProgress(bool postInflight) {
  {
    std::lock_guard<std::mutex> g(progMu_);
    progPostInflight_ = postInflight;
    progStop_ = true;
  }
  progCv_.notify_all();
  if (progThread_.joinable()) progThread_.join();
  std::lock_guard<std::mutex> g(progMu_);
  progExited_ = true;  // also when the thread never started
}

void Engine::progressLoop() {
  CallTracker::get().registerThread("progress");
  std::deque<std::function<void()>> cmds;
  uint32_t idlePasses = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(progMu_);
      if (progConns_.empty() && progCmds_.empty() && !progStop_)
        progCv_.wait_for(lk, std::chrono::milliseconds(100));
      cmds.swap(progCmds_);
    }
    if (!cmds.empty()) {
      size_t n = cmds.size();
      for (auto& f : cmds) f();
      cmds.clear();
      std::lock_guard<std::mutex> g(progMu_);
      cmdDone_ += n;
      progCv_.notify_all();
    }
    bool stop;
    {
      std::lock_guard<std::mutex> g(progMu_);
      stop = progStop_;
    }
    if (stop) {
      if (progPostInflight_ && !Fatal::get().halted()) postInflightExtras();
      break;
    }
    if (Fatal::get().halted()) {
      // NCCL's progress thread stops at the first error; wait here for the stop request so that
      // commands still get applied (they only edit the conn list).
      std::unique_lock<std::mutex> lk(progMu_);
      progCv_.wait_for(lk, std::chrono::milliseconds(100));
      continue;
    }
    bool progressed = false;
    uint64_t now = nowUs();
    uint64_t pf = pauseFromUs_.load(std::memory_order_relaxed);
    bool recvPaused = pf && now >= pf && now < pauseToUs_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < progConns_.size() && !Fatal::get().halted(); i++) {
      Conn* c = progConns_[i];
      if (!c->isSend && recvPaused) continue;
      progressed |= c->isSend ? progressSend(c, now) : progressRecv(c, now);
    }
    if (progressed) {
      idlePasses = 0;
    } else if (cfg_.idleSleepUs && ++idlePasses > 64) {
      // Oversubscribed small machines (test beds): give the CPU away instead of spinning.
      std::this_thread::sleep_for(std::chrono::microseconds(cfg_.idleSleepUs));
    } else {
      sched_yield();
    }
  }
  std::lock_guard<std::mutex> g(progMu_);
  for (auto& f : progCmds_) f();
  cmdDone_ += progCmds_.size();
  progCmds_.clear();
  progExited_ = true;
  progCv_.notify_all();
}

void Engine::checkStuck(Conn* c, uint64_t now) {
  uint64_t tail = c->proxyTail.load(std::memory_order_relaxed);
  if (tail < c->posted) {
    uint64_t s = tail % kSteps;
    if (now > c->postUs[s] && now - c->postUs[s] > cfg_.opTimeoutUs) {
      Fatal::get().raise(kExitTimeout,
                         strf("stuck request: %s %p (step %llu, %s, %zu bytes) on %s not complete after %.1f s; "
                              "%llu request(s) in flight on this comm (--op-timeout)",
                              c->isSend ? "isend" : "irecv", c->req[s], (unsigned long long)tail,
                              c->slot[s].proto == kProtoLL ? "LL" : "SIMPLE",
                              c->isSend ? c->slot[s].size : c->slotBytes[c->slot[s].proto], c->label.c_str(),
                              double(now - c->postUs[s]) / 1e6, (unsigned long long)(c->posted - tail)));
    }
  }
  if (c->nullSinceUs && now > c->nullSinceUs && now - c->nullSinceUs > cfg_.opTimeoutUs) {
    Fatal::get().raise(kExitTimeout, strf("plugin returned a NULL request from %s for %.1f s on %s (step %llu)",
                                          c->isSend ? "isend" : "irecv", double(now - c->nullSinceUs) / 1e6,
                                          c->label.c_str(), (unsigned long long)c->posted));
  }
}

static void noteInflight(std::atomic<int>& maxv, int v) {
  int cur = maxv.load(std::memory_order_relaxed);
  while (v > cur && !maxv.compare_exchange_weak(cur, v)) {
  }
}

bool Engine::progressSend(Conn* c, uint64_t now) {
  bool progressed = false;
  uint64_t tail = c->proxyTail.load(std::memory_order_relaxed);
  const uint64_t limit = std::min<uint64_t>(c->gpuTail.load(std::memory_order_acquire), tail + kSteps);
  // One isend of `step`: false on a plugin error; *accepted when the plugin took it.
  auto post = [&](uint64_t step, bool* accepted) {
    int s = int(step % kSteps);
    const Conn::Slot& sl = c->slot[s];
    void* ph = cfg_.profilerHandles ? &c->phandleDummy[s] : nullptr;
    c->req[s] = nullptr;
    int tag = cfg_.group > 1 ? tagFor(c->myRank, step) : c->myRank;
    if (!net_.isend(c->comm, c->slotPtr(sl.proto, step), sl.size, tag, c->mh[sl.proto], ph, &c->req[s], c->label))
      return false;
    *accepted = c->req[s] != nullptr;
    if (*accepted) c->postUs[s] = now;
    return true;
  };
  // --send-ahead: first a later step, alternately the next-but-one (it may share the next
  // step's irecv) and the one `group` steps on (never in the next step's irecv, whose buffers
  // are at most `group`). A NULL answer is expected while its irecv is not the oldest unfilled
  // one: not a stuck request.
  if (cfg_.sendAhead) {
    uint64_t off = (c->aheadTurn++ & 1) ? 1 : (uint64_t)std::max(cfg_.group, 2);
    if (c->posted + off < limit && !((c->aheadMask >> off) & 1)) {
      bool ok = false;
      if (!post(c->posted + off, &ok)) return false;
      if (ok) c->aheadMask |= 1u << off, progressed = true;
    }
  }
  if (c->posted < limit) {
    bool ok = false;
    if (!post(c->posted, &ok)) return false;
    if (ok) {
      do c->posted++, c->aheadMask >>= 1;  // and past the later steps already accepted
      while (c->aheadMask & 1);
      c->nullSinceUs = 0;
      noteInflight(maxInflight_, int(c->posted - tail));
      progressed = true;
    } else if (!c->nullSinceUs) {
      c->nullSinceUs = now;  // NULL = "try again on the next pass"
    }
  }
  if (tail < c->posted) {  // only the oldest request of a connection is tested
    int s = int(tail % kSteps);
    int done = 0;
    if (!net_.test(c->req[s], &done, nullptr, c->label)) return false;
    if (done) {
      c->req[s] = nullptr;
      c->bytesDone += c->slot[s].size;
      c->proxyTail.store(tail + 1, std::memory_order_release);
      c->waiter->ring();
      progressed = true;
    }
  }
  checkStuck(c, now);
  return progressed;
}

bool Engine::progressRecv(Conn* c, uint64_t now) {
  bool progressed = false;
  uint64_t tail = c->proxyTail.load(std::memory_order_relaxed);
  uint64_t head = c->gpuHead.load(std::memory_order_acquire);
  if (c->posted < c->recvTarget.load(std::memory_order_acquire) && c->posted < head + kSteps) {
    uint64_t step = c->posted;
    RecvOp op;
    uint64_t opEnd;
    {
      std::lock_guard<std::mutex> g(c->opMu);
      while (!c->opLoaded || step >= c->opEnd) {  // front op fully posted: move to the next one
        if (c->opLoaded) c->ops.pop_front();
        c->opLoaded = true;
        c->opEnd += c->ops.front().count;
      }
      op = c->ops.front();
      opEnd = c->opEnd;
    }
    int s = int(step % kSteps);
    // Grouped mode: `group` of the op's SIMPLE steps (fewer only at the op's end), posted once
    // the ring has room for all of them, as NCCL posts a group when every sub of it is ready.
    int n = 1;
    if (cfg_.group > 1 && op.proto == kProtoSimple)
      n = int(std::min<uint64_t>(uint64_t(cfg_.group), opEnd - step));
    bool room = step + uint64_t(n) <= head + kSteps;
    void* datas[kSteps];
    size_t sizes[kSteps];
    int tags[kSteps];
    void* mhs[kSteps];
    void* phs[kSteps];
    for (int i = 0; i < n; i++) {
      uint64_t k = step + uint64_t(n - 1 - i);  // entries in reverse step order: tags, not order, place them
      datas[i] = c->slotPtr(op.proto, k);
      sizes[i] = c->slotBytes[op.proto];
      tags[i] = cfg_.group > 1 ? tagFor(c->peer, k) : c->peer;
      mhs[i] = c->mh[op.proto];
      phs[i] = cfg_.profilerHandles ? &c->phandleDummy[k % kSteps] : nullptr;
    }
    // NCCL 2.24+: LL/LL128 single receives carry the optional-completion marker in *request.
    c->req[s] = op.optional && n == 1 ? RAILOVER_NCCL_OPTIONAL_RECV_COMPLETION : nullptr;
    if (room && !net_.irecvGroup(c->comm, n, datas, sizes, tags, mhs, cfg_.profilerHandles ? phs : nullptr, &c->req[s],
                         c->label))
      return false;
    if (c->req[s]) {
      for (int j = 0; j < n; j++) {
        int sj = int((step + uint64_t(j)) % kSteps);
        c->slot[sj].proto = op.proto;
        c->groupN[sj] = j == 0 ? n : 0;
        if (j) c->req[sj] = nullptr;
        c->postUs[sj] = now;
      }
      c->posted += uint64_t(n);
      c->nullSinceUs = 0;
      noteInflight(maxInflight_, int(c->posted - tail));
      progressed = true;
    } else if (room && !c->nullSinceUs) {
      c->nullSinceUs = now;
    }
  }
  if (tail < c->posted) {
    int s = int(tail % kSteps);
    int done = 0;
    int sizes[kSteps] = {0};
    if (c->flushReq) {  // received; its flush is in progress (NCCL tests it with sizes NULL)
      if (!net_.test(c->flushReq, &done, nullptr, c->label + " (iflush)")) return false;
      if (done) c->flushReq = nullptr;
      done = 0;
    } else if (c->req[s]) {
      if (!net_.test(c->req[s], &done, sizes, c->label)) return false;
      if (done) {
        int n = c->groupN[s] > 0 ? c->groupN[s] : 1;
        void* datas[kSteps];
        void* mhs[kSteps];
        for (int i = 0; i < n; i++) {  // entry i holds step tail + n - 1 - i (see the post)
          uint64_t k = tail + uint64_t(n - 1 - i);
          c->slot[k % kSteps].size = size_t(sizes[i] < 0 ? 0 : sizes[i]);
          datas[i] = c->slotPtr(c->slot[s].proto, k);
          mhs[i] = c->mh[c->slot[s].proto];
        }
        c->doneReq[s] = c->req[s];
        c->req[s] = nullptr;
        // As NCCL's receive proxy with GPUDirect: SIMPLE receives with bytes are flushed before
        // the GPU is told; a NULL flush request means there was nothing to flush.
        int total = 0;
        for (int i = 0; i < n; i++) total += sizes[i] > 0 ? sizes[i] : 0;
        if (cfg_.flush && c->slot[s].proto == kProtoSimple && total > 0 &&
            !net_.iflush(c->comm, n, datas, sizes, mhs, &c->flushReq, c->label))
          return false;
      }
    }
    if (!c->req[s] && !c->flushReq) {  // received (and flushed): hand the step to the GPU
      c->bytesDone += c->slot[s].size;
      bytesRecv_.fetch_add(c->slot[s].size, std::memory_order_relaxed);
      ts_.add(now, c->slot[s].size);
      c->proxyTail.store(tail + 1, std::memory_order_release);
      c->waiter->ring();
      progressed = true;
    }
  }
  // The GPU consumed steps: tell the plugin (irecvConsumed gets the completed request, as NCCL).
  while (c->consumedSeen < head) {
    int s = int(c->consumedSeen % kSteps);
    if (c->doneReq[s] && net_.raw()->hasIrecvConsumed()) {
      if (!net_.irecvConsumed(c->comm, c->doneReq[s], c->label)) return false;
    }
    c->doneReq[s] = nullptr;
    c->consumedSeen++;
    progressed = true;
  }
  checkStuck(c, now);
  return progressed;
}

void Engine::postInflightExtras() {
  // Leave requests outstanding, then let the caller close everything: NCCL's destroy/abort path.
  for (Conn* c : progConns_) {
    if (!c->ready.load() || Fatal::get().halted()) continue;
    uint64_t tail = c->proxyTail.load();
    if (c->isSend) {
      if (c->posted - tail < kSteps) {
        int s = int(c->posted % kSteps);
        c->slot[s].size = std::min<size_t>(64, c->slotBytes[kProtoSimple]);
        c->slot[s].proto = kProtoSimple;
        void* r = nullptr;
        if (net_.isend(c->comm, c->slotPtr(kProtoSimple, c->posted), c->slot[s].size,
                       cfg_.group > 1 ? tagFor(c->myRank, c->posted) : c->myRank,
                       c->mh[kProtoSimple], nullptr, &r, c->label + " (left in flight)") && r)
          c->posted++;
      }
    } else {
      for (int k = 0; k < kSteps && c->posted - tail < kSteps && c->posted < c->gpuHead.load() + kSteps; k++) {
        void* r = nullptr;
        if (!net_.irecv(c->comm, c->slotPtr(kProtoSimple, c->posted), c->slotBytes[kProtoSimple],
                        cfg_.group > 1 ? tagFor(c->peer, c->posted) : c->peer,
                        c->mh[kProtoSimple], nullptr, &r, c->label + " (left in flight)") ||
            !r)
          break;
        c->posted++;
      }
    }
    leftInflight_ += c->posted - tail;
  }
}

// ---------------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------------
void Watchdog::start(uint64_t opTimeoutUs, std::function<void()> onHang) {
  t_ = std::thread([this, opTimeoutUs, onHang] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      if (stop_) break;
      uint64_t now = nowUs();
      std::string hung;
      CallTracker::get().forEach([&](CallTracker::Slot& s) {
        uint64_t since = s.sinceUs.load(std::memory_order_acquire);
        if (since && now > since && now - since > opTimeoutUs && hung.empty())
          hung = strf("plugin call %s has not returned for %.1f s (%s thread); NCCL's proxy would hang here too",
                      fnName(s.fn.load()), double(now - since) / 1e6, s.thread.c_str());
      });
      if (!hung.empty()) {
        Fatal::get().raise(kExitTimeout, hung);
        lk.unlock();
        onHang();  // does not return
        return;
      }
    }
  });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (t_.joinable()) t_.join();
}

}  // namespace rperf
