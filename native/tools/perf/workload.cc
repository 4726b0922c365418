// railover-perf workloads and communicator life cycle; see workload.h.
#include "tools/perf/workload.h"

#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>

#include "tools/perf/report.h"
#include "tools/perf/util.h"

namespace rperf {

namespace {

constexpr int kPermitWindow = 4;  // duration mode: iterations rank 0 grants ahead
constexpr int kMaxReportedErrors = 8;
std::atomic<int> gReportedErrors{0};
std::atomic<long> gSentNonEmpty{0};

inline uint64_t seedOf(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e) {
  return mix64(mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d) ^ e);
}

// Bytes of a sendrecv message: word i of the message is mix64(seed + i).
void fillPattern(char* p, size_t n, uint64_t seed) {
  size_t w = n / 8;
  for (size_t i = 0; i < w; i++) {
    uint64_t v = mix64(seed + i);
    memcpy(p + 8 * i, &v, 8);
  }
  if (n % 8) {
    uint64_t v = mix64(seed + w);
    memcpy(p + 8 * w, &v, n % 8);
  }
}

// Number of bytes of p[0..n) that differ from the pattern; *first = offset of the first one.
uint64_t checkPattern(const char* p, size_t n, uint64_t seed, size_t* first, uint8_t* got, uint8_t* want) {
  uint64_t bad = 0;
  size_t w = (n + 7) / 8;
  for (size_t i = 0; i < w; i++) {
    uint64_t v = mix64(seed + i);
    size_t len = std::min<size_t>(8, n - 8 * i);
    if (len == 8) {
      uint64_t x;
      memcpy(&x, p + 8 * i, 8);
      if (x == v) continue;
    }
    const uint8_t* e = reinterpret_cast<const uint8_t*>(&v);
    for (size_t j = 0; j < len; j++) {
      uint8_t g = uint8_t(p[8 * i + j]);
      if (g != e[j]) {
        if (!bad) {
          *first = 8 * i + j;
          *got = g;
          *want = e[j];
        }
        bad++;
      }
    }
  }
  return bad;
}

// memcpy that accepts empty ranges with NULL pointers (an empty std::vector has data() == NULL).
inline void copyBytes(void* dst, const void* src, size_t n) {
  if (n) memcpy(dst, src, n);
}

// allreduce input of rank q at element i in one iteration: H(i) + G(q), with H, G in 0..2047
// (integers, so every sum of <= 4096 ranks is exact in float32). H is a cheap per-iteration
// hash of the element index (computed once per element and iteration), G a per-rank offset
// (distinct for up to 2048 ranks). The exact partial sum over a set S of ranks is then
// |S|*H(i) + sum_{q in S} G(q): one table lookup per checked element, whatever |S|.
inline float arH(uint32_t iterSeed, uint64_t i) {
  uint32_t x = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) ^ iterSeed;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return float(x & 0x7FF);
}
std::vector<float> arG(int n, uint64_t iter, int comm) {
  std::vector<float> g;
  std::vector<bool> used(2048, false);
  for (int q = 0; q < n; q++) {
    uint32_t v = uint32_t(mix64(seedOf(uint64_t(q), 0xa11, iter, uint64_t(comm), 0)) & 0x7FF);
    for (int k = 0; k < 2048 && used[v]; k++) v = (v + 1) & 0x7FF;  // distinct while possible
    used[v] = true;
    g.push_back(float(v));
  }
  return g;
}

void reportDataError(const std::string& msg) {
  int n = gReportedErrors.fetch_add(1);
  if (n < kMaxReportedErrors) logError("%s", msg.c_str());
  else if (n == kMaxReportedErrors) logError("further data errors are counted but not printed");
}

}  // namespace

double busFactor(Workload w, int nranks) {
  if (w == Workload::kAllReduce) return nranks > 0 ? 2.0 * (nranks - 1) / nranks : 0;
  return 1.0;
}

// ---------------------------------------------------------------------------------------------
// Channel: one worker thread playing the GPU for one channel.
// ---------------------------------------------------------------------------------------------
struct Communicator::Channel {
  int index = 0;
  Waiter waiter;
  Conn* send = nullptr;
  Conn* recv = nullptr;
  std::thread th;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t jobSeq = 0, doneSeq = 0;
  bool quit = false;
  uint64_t jobBytes = 0, jobIter = 0;
  int jobProto = kProtoSimple;
  uint64_t wrong = 0;
  bool aborted = false;
};

Communicator::Communicator(Plugin& net, Rendezvous& rv, const Options& opt, int commIndex, RunState& st)
    : net_(net), rv_(rv), opt_(opt), comm_(commIndex), st_(st) {}

Communicator::~Communicator() {
  for (auto& ch : channels_) {
    if (ch->th.joinable()) {
      {
        std::lock_guard<std::mutex> g(ch->mu);
        ch->quit = true;
      }
      ch->cv.notify_all();
      ch->th.join();
    }
  }
}

bool Communicator::stopRequested() const { return Fatal::get().halted() || rv_.firstGonePeer() >= 0; }

void Communicator::run() {
  try {
    setup();
    if (opt_.duration > 0) runDuration();
    else runSweep();
    if (opt_.holdS > 0 && !stopEarly_ && !Fatal::get().aborted()) holdIdle();
  } catch (Aborted&) {
    if (!Fatal::get().aborted()) {
      int gone = rv_.firstGonePeer();
      if (opt_.duration > 0 && gone >= 0) {
        stopEarly_ = true;
        std::lock_guard<std::mutex> g(st_.mu);
        st_.stoppedEarly = strf("rank %d exited", gone);
        logWarn("rank %d exited: stopping early", gone);
      } else if (gone >= 0) {
        Fatal::get().raise(kExitPeer, strf("rank %d exited in the middle of the benchmark", gone));
      } else {
        Fatal::get().raise(kExitInternal, "run aborted without a recorded reason");
      }
    }
  }
  teardown();
}

// ---- setup / teardown ------------------------------------------------------------------------
void Communicator::setup() {
  const int C = opt_.channels;
  ncclNetCommConfig_t cfg{opt_.trafficClass};
  bool skipQuery = comm_ > 0 && opt_.reloadNoInit && net_.abi() <= 10;
  for (int k = 0; k < opt_.contexts; k++) {
    void* ctx = nullptr;
    // Same value on every rank of this "communicator" (NCCL passes the comm hash).
    uint64_t commId = mix64(0x7261696c6f766572ull ^ (uint64_t(comm_) << 32) ^ uint64_t(k));
    if (!net_.init(&ctx, commId, &cfg)) throw Aborted{};
    ctxs_.push_back(ctx);
  }
  if (!skipQuery) {
    int ndev = 0;
    if (!net_.devices(&ndev)) throw Aborted{};
    if (ndev <= 0 || opt_.dev >= ndev) {
      Fatal::get().raise(kExitUsage, strf("plugin reports %d device(s); --dev %d is not one of them", ndev, opt_.dev));
      throw Aborted{};
    }
    NetProps p;
    if (!net_.getProperties(opt_.dev, &p)) throw Aborted{};
    if (!(p.ptrSupport & RAILOVER_NCCL_PTR_HOST)) {
      Fatal::get().raise(kExitPlugin, strf("device %d does not support host memory (ptrSupport=0x%x)", opt_.dev,
                                           p.ptrSupport));
      throw Aborted{};
    }
    if (p.netDeviceType != RO_NET_DEVICE_HOST) {
      Fatal::get().raise(kExitPlugin, strf("device %d has netDeviceType %d; only host (0) plugins can be driven",
                                           opt_.dev, p.netDeviceType));
      throw Aborted{};
    }
    if (opt_.group > p.maxRecvs) {
      Fatal::get().raise(kExitUsage, strf("--group %d: device %d takes grouped receives of at most %d buffers "
                                          "(maxRecvs; railover offers them on its rdma transport with RAILOVER_MAX_RECVS=%d, "
                                          "never on tcp)",
                                          opt_.group, opt_.dev, p.maxRecvs, opt_.group));
      throw Aborted{};
    }
    if (p.maxP2pBytes && std::max(opt_.slotBytes, opt_.llSlotBytes) > p.maxP2pBytes) {
      Fatal::get().raise(kExitUsage, strf("slot size exceeds the device's maxP2pBytes (%zu)", p.maxP2pBytes));
      throw Aborted{};
    }
    std::lock_guard<std::mutex> g(st_.mu);
    st_.props = p;
    st_.ndev = ndev;
  }
  EngineConfig ec;
  ec.rank = opt_.rank;
  ec.nranks = opt_.nranks;
  ec.dev = opt_.dev;
  ec.slotBytes[kProtoLL] = opt_.llSlotBytes;
  ec.slotBytes[kProtoSimple] = opt_.slotBytes;
  ec.opTimeoutUs = secToUs(opt_.opTimeout);
  ec.idleSleepUs = (uint32_t)opt_.idleSleepUs;
  ec.profilerHandles = opt_.profilerHandles;
  ec.flush = opt_.flush;
  ec.group = opt_.group;
  ec.sendAhead = opt_.sendAhead;
  engine_ = std::make_unique<Engine>(net_, rv_, ec);
  engine_->start();

  for (int c = 0; c < C; c++) {
    auto ch = std::make_unique<Channel>();
    ch->index = c;
    channels_.push_back(std::move(ch));
  }
  int ticket = -1;
  uint64_t setupStart = nowUs();
  live_ = openRound(round_, &ticket);
  if (!engine_->waitSetup(ticket, nowUs() + secToUs(opt_.opTimeout) + 5000000)) throw Aborted{};
  if (comm_ == 0) {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.setupUs = nowUs() - setupStart;
  }
  std::vector<Conn*> raw;
  for (auto& c : live_) raw.push_back(c.get());
  engine_->addToProgress(raw);
  for (int c = 0; c < C; c++) {
    channels_[size_t(c)]->send = live_[size_t(2 * c + 1)].get();
    channels_[size_t(c)]->recv = live_[size_t(2 * c)].get();
  }
  // Worker threads ("GPU" blocks), one per channel.
  for (auto& chp : channels_) {
    Channel* ch = chp.get();
    ch->th = std::thread([this, ch] {
      for (;;) {
        uint64_t seq;
        {
          std::unique_lock<std::mutex> lk(ch->mu);
          ch->cv.wait(lk, [&] { return ch->quit || ch->jobSeq > ch->doneSeq; });
          if (ch->quit) return;
          seq = ch->jobSeq;
        }
        uint64_t wrong = 0;
        bool aborted = false;
        try {
          wrong = channelWork(ch, ch->jobBytes, ch->jobIter, ch->jobProto);
        } catch (Aborted&) {
          aborted = true;
        }
        {
          std::lock_guard<std::mutex> g(ch->mu);
          ch->wrong = wrong;
          ch->aborted = aborted;
          ch->doneSeq = seq;
        }
        ch->cv.notify_all();
      }
    });
  }
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.connsOpened += live_.size();
  }
}

std::vector<std::unique_ptr<Conn>> Communicator::openRound(uint32_t round, int* ticket) {
  const int n = opt_.nranks, r = opt_.rank;
  const int next = opt_.pairs ? (r ^ 1) : (r + 1) % n, prev = opt_.pairs ? (r ^ 1) : (r - 1 + n) % n;
  uint32_t tagRound = (uint32_t(comm_) << 16) | (round & 0xffff);
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<Conn*> raw;
  int ndev;
  {
    std::lock_guard<std::mutex> g(st_.mu);
    ndev = st_.ndev > 0 ? st_.ndev : 1;
  }
  for (size_t c = 0; c < channels_.size(); c++) {
    void* ctx = ctxs_[c % ctxs_.size()];
    // --dev-spread: channels over the devices round-robin, as NCCL spreads channels over NICs.
    int dev = opt_.devSpread ? (opt_.dev + int(c)) % ndev : opt_.dev;
    conns.push_back(engine_->makeConn(false, prev, int(c), tagRound, ctx, &channels_[c]->waiter, dev));
    conns.push_back(engine_->makeConn(true, next, int(c), tagRound, ctx, &channels_[c]->waiter, dev));
  }
  for (auto& c : conns) raw.push_back(c.get());
  *ticket = engine_->setupAsync(raw);
  return conns;
}

void Communicator::drainSends(uint64_t deadlineUs) {
  for (auto& ch : channels_) {
    Conn* s = ch->send;
    bool ok = ch->waiter.waitUntil(
        [&] { return s->proxyTail.load(std::memory_order_acquire) == s->gpuTail.load(std::memory_order_acquire); },
        [&] { return stopRequested(); }, deadlineUs);
    if (!ok) {
      Fatal::get().raise(kExitTimeout, strf("%s: sends not completed at the end of the run", s->label.c_str()));
      throw Aborted{};
    }
  }
}

// --hold: every comm stays connected with nothing in flight and the progress thread parked (it
// makes no plugin call), as a communicator between two collectives. Only the plugin's own
// threads (health probes, acceptor) run meanwhile, so the process's CPU time is theirs.
void Communicator::holdIdle() {
  drainSends(nowUs() + secToUs(opt_.opTimeout) + 5000000);
  std::vector<Conn*> raw;
  for (auto& c : live_) raw.push_back(c.get());
  engine_->removeFromProgress(raw);
  uint64_t a = nowUs();
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.holdStartUs = a;
  }
  if (opt_.rank == 0 || opt_.allRanksPrint) {
    printf("# idle hold: %zu comm(s) connected, no traffic for %.3g s (from t_us %llu)\n", live_.size(),
           opt_.holdS, (unsigned long long)a);
    fflush(stdout);
  }
  logInfo("idle hold started: %zu comms, %.3g s", live_.size(), opt_.holdS);
  uint64_t end = a + secToUs(opt_.holdS);
  while (nowUs() < end && !stopRequested())
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<uint64_t>(end - nowUs(), 50000)));
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.holdEndUs = nowUs();
  }
  engine_->addToProgress(raw);
}

bool Communicator::stopFileSeen() {
  if (opt_.stopFile.empty()) return false;
  uint64_t now = nowUs();
  if (now - stopCheckUs_ < 10000) return false;  // look at most every 10 ms
  stopCheckUs_ = now;
  struct stat sb;
  return stat(opt_.stopFile.c_str(), &sb) == 0;
}

void Communicator::switchRound() {
  uint64_t deadline = nowUs() + secToUs(opt_.opTimeout) + 5000000;
  if (!engine_->waitSetup(pendingTicket_, deadline)) throw Aborted{};
  drainSends(deadline);  // old connections are idle once their last sends completed
  std::vector<Conn*> oldRaw, newRaw;
  for (auto& c : live_) oldRaw.push_back(c.get());
  for (auto& c : pending_) newRaw.push_back(c.get());
  engine_->removeFromProgress(oldRaw);
  engine_->addToProgress(newRaw);
  for (size_t c = 0; c < channels_.size(); c++) {
    channels_[c]->recv = pending_[2 * c].get();
    channels_[c]->send = pending_[2 * c + 1].get();
  }
  closeTickets_.push_back(engine_->closeAsync(oldRaw));  // closed by the service thread meanwhile
  for (auto& c : live_) closing_.push_back(std::move(c));
  live_ = std::move(pending_);
  pending_.clear();
  pendingTicket_ = -1;
  std::lock_guard<std::mutex> g(st_.mu);
  st_.reconnects++;
}

void Communicator::maybeReconnect(uint64_t iter) {
  const uint64_t N = uint64_t(opt_.reconnectEvery);
  if (N == 0 || iter % N != 0) return;
  if (iter > 0 && !pending_.empty()) switchRound();
  if (pending_.empty()) {
    // Next generation: set up by the service thread while the current one carries data.
    pending_ = openRound(++round_, &pendingTicket_);
    std::lock_guard<std::mutex> g(st_.mu);
    st_.connsOpened += pending_.size();
  }
}

void Communicator::teardown() {
  // Stop the "GPU".
  for (auto& ch : channels_) {
    {
      std::lock_guard<std::mutex> g(ch->mu);
      ch->quit = true;
    }
    ch->cv.notify_all();
    if (ch->th.joinable()) ch->th.join();
  }
  if (!engine_) {
    for (void* ctx : ctxs_) net_.finalize(ctx);
    return;
  }
  bool clean = !Fatal::get().aborted() && !stopEarly_;
  uint64_t deadline = nowUs() + secToUs(opt_.opTimeout) + 5000000;
  try {
    if (clean) drainSends(deadline);
    if (clean && pendingTicket_ >= 0) engine_->waitSetup(pendingTicket_, deadline);
  } catch (Aborted&) {
    clean = false;
  }
  if (!clean) engine_->cancelSetups();
  if (clean && !Fatal::get().aborted()) {
    // Everyone has received all real data before anyone posts the extra requests.
    std::string err;
    if (!rv_.barrier(nextBarrier(), nowUs() + secToUs(opt_.rvTimeout), &err)) {
      if (opt_.duration > 0) logWarn("end-of-run barrier: %s", err.c_str());
      else Fatal::get().raise(kExitPeer, "end-of-run barrier: " + err);
      clean = false;
    }
  }
  // NCCL's destroy/abort: the progress thread leaves with requests in flight, then the service
  // thread deregisters and closes every comm.
  engine_->stopProgress(clean && opt_.closeInflight && !Fatal::get().aborted());
  std::vector<Conn*> all;
  for (auto& c : live_) all.push_back(c.get());
  for (auto& c : pending_) all.push_back(c.get());
  int t = engine_->closeAsync(all);
  engine_->waitSetup(t, deadline + 5000000, false);
  for (int ct : closeTickets_) engine_->waitSetup(ct, deadline + 5000000, false);
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.bytesReceived += engine_->bytesReceived();
    st_.maxInflight = std::max(st_.maxInflight, engine_->maxInflight());
    st_.leftInflight += engine_->leftInflight();
  }
  engine_->stopService();
  for (void* ctx : ctxs_) net_.finalize(ctx);
  ctxs_.clear();
  live_.clear();
  pending_.clear();
  closing_.clear();
}

// ---- iterations ---------------------------------------------------------------------------------
uint64_t Communicator::runIteration(uint64_t bytes, uint64_t iter, int proto) {
  for (auto& ch : channels_) {
    {
      std::lock_guard<std::mutex> g(ch->mu);
      ch->jobBytes = bytes;
      ch->jobIter = iter;
      ch->jobProto = proto;
      ch->jobSeq++;
    }
    ch->cv.notify_all();
  }
  uint64_t wrong = 0;
  bool aborted = false;
  for (auto& ch : channels_) {
    std::unique_lock<std::mutex> lk(ch->mu);
    ch->cv.wait(lk, [&] { return ch->doneSeq == ch->jobSeq; });  // workers always finish (own deadlines)
    wrong += ch->wrong;
    aborted |= ch->aborted;
  }
  if (aborted) throw Aborted{};
  return wrong;
}

namespace {
struct WorkCtx {
  const Options& opt;
  Rendezvous& rv;
  int comm;
  int channel;
  int nch;
  Waiter& waiter;
  Conn* send;
  Conn* recv;
  uint64_t backstopUs;

  bool stop() const { return Fatal::get().halted() || rv.firstGonePeer() >= 0; }
  [[noreturn]] void stalled(const char* what, Conn* c, uint64_t step) {
    Fatal::get().raise(kExitTimeout, strf("channel %d stalled %.1f s waiting for %s (step %llu) on %s", channel,
                                          double(backstopUs) / 1e6, what, (unsigned long long)step, c->label.c_str()));
    throw Aborted{};
  }
  // Waits for the send slot of `step` to be free; returns its address.
  char* sendSlot(uint64_t step, int proto) {
    Conn* s = send;
    if (!waiter.waitUntil([&] { return step < s->proxyTail.load(std::memory_order_acquire) + kSteps; },
                          [&] { return stop(); }, nowUs() + backstopUs))
      stalled("a free send slot", s, step);
    return s->slotPtr(proto, step);
  }
  void postSend(uint64_t step, size_t len, int proto) {
    send->slot[step % kSteps].size = len;
    send->slot[step % kSteps].proto = proto;
    send->gpuTail.store(step + 1, std::memory_order_release);
  }
  void queueRecv(uint64_t count, int proto) {
    {
      std::lock_guard<std::mutex> g(recv->opMu);
      recv->ops.push_back(RecvOp{count, proto, proto == kProtoLL});
    }
    recv->recvTarget.fetch_add(count, std::memory_order_release);
  }
  const char* waitRecv(uint64_t step, int proto, size_t* got) {
    Conn* r = recv;
    if (!waiter.waitUntil([&] { return r->proxyTail.load(std::memory_order_acquire) > step; },
                          [&] { return stop(); }, nowUs() + backstopUs))
      stalled("received data", r, step);
    *got = r->slot[step % kSteps].size;
    return r->slotPtr(proto, step);
  }
  void releaseRecv(uint64_t step) { recv->gpuHead.store(step + 1, std::memory_order_release); }
  void maybeCorrupt(char* p, size_t len) {
    if (opt.selftestCorrupt <= 0 || opt.rank != 0 || len == 0) return;
    if (gSentNonEmpty.fetch_add(1) + 1 == opt.selftestCorrupt) p[len / 2] ^= 0x01;
  }
};

uint64_t workSendRecv(WorkCtx& w, uint64_t bytes, uint64_t iter, int proto) {
  const Options& o = w.opt;
  const uint64_t per = (bytes + uint64_t(w.nch) - 1) / uint64_t(w.nch);
  const uint64_t beg = std::min<uint64_t>(bytes, per * uint64_t(w.channel));
  const uint64_t len = std::min<uint64_t>(bytes, beg + per) - beg;
  const uint64_t stepB = w.send->slotBytes[proto];
  const uint64_t nsteps = std::max<uint64_t>(1, (len + stepB - 1) / stepB);
  const int prev = w.recv->peer;
  // --pattern oneway: even ranks only send, odd ranks only receive (their other comm stays idle).
  const uint64_t nsend = o.oneway && (o.rank & 1) ? 0 : nsteps, nrecv = o.oneway && !(o.rank & 1) ? 0 : nsteps;
  if (nrecv) w.queueRecv(nrecv, proto);
  const uint64_t sBase = w.send->gpuTail.load(), rBase = w.recv->gpuHead.load();
  uint64_t si = 0, ri = 0, wrong = 0;
  uint64_t deadline = nowUs() + w.backstopUs;
  auto msgLen = [&](uint64_t i) { return size_t(std::min<uint64_t>(stepB, len - std::min(len, i * stepB))); };
  while (si < nsend || ri < nrecv) {
    bool did = false;
    if (si < nsend && sBase + si < w.send->proxyTail.load(std::memory_order_acquire) + kSteps) {
      size_t m = msgLen(si);
      char* p = w.send->slotPtr(proto, sBase + si);
      if (o.check) {
        fillPattern(p, m, seedOf(uint64_t(o.rank), uint64_t(w.channel), si, iter, uint64_t(w.comm)));
        w.maybeCorrupt(p, m);
      }
      w.postSend(sBase + si, m, proto);
      si++;
      did = true;
    }
    if (ri < nrecv && w.recv->proxyTail.load(std::memory_order_acquire) > rBase + ri) {
      size_t want = msgLen(ri);
      size_t got = w.recv->slot[(rBase + ri) % kSteps].size;
      const char* p = w.recv->slotPtr(proto, rBase + ri);
      if (o.check) {
        size_t first = 0;
        uint8_t g = 0, e = 0;
        size_t common = std::min(want, got);
        uint64_t bad = checkPattern(p, common, seedOf(uint64_t(prev), uint64_t(w.channel), ri, iter, uint64_t(w.comm)),
                                    &first, &g, &e);
        uint64_t sizeDiff = want > got ? want - got : got - want;
        if (bad || sizeDiff) {
          std::string m = strf("wrong data from rank %d on channel %d, message %llu of iteration %llu: ", prev,
                               w.channel, (unsigned long long)ri, (unsigned long long)iter);
          if (sizeDiff) m += strf("received %zu bytes, expected %zu; ", got, want);
          if (bad) m += strf("%llu of %zu bytes differ (first at offset %zu: 0x%02x, expected 0x%02x)",
                             (unsigned long long)bad, common, first, g, e);
          reportDataError(m);
        }
        wrong += bad + sizeDiff;
      }
      w.releaseRecv(rBase + ri);
      ri++;
      did = true;
    }
    if (did) {
      deadline = nowUs() + w.backstopUs;
      continue;
    }
    Conn* s = w.send;
    Conn* r = w.recv;
    bool ok = w.waiter.waitUntil(
        [&] {
          return (si < nsend && sBase + si < s->proxyTail.load(std::memory_order_acquire) + kSteps) ||
                 (ri < nrecv && r->proxyTail.load(std::memory_order_acquire) > rBase + ri);
        },
        [&] { return w.stop(); }, deadline);
    if (!ok) w.stalled(ri < nrecv ? "received data" : "a free send slot", ri < nrecv ? r : s, ri < nrecv ? rBase + ri : sBase + si);
  }
  return wrong;
}

uint64_t workAllReduce(WorkCtx& w, uint64_t bytes, uint64_t iter, int proto, float* in, float* out, float* hv) {
  const Options& o = w.opt;
  const int n = o.nranks, r = o.rank;
  const uint64_t count = bytes / 4;
  const uint64_t per = (count + uint64_t(w.nch) - 1) / uint64_t(w.nch);
  const uint64_t cBeg = std::min<uint64_t>(count, per * uint64_t(w.channel));
  const uint64_t cEnd = std::min<uint64_t>(count, cBeg + per);
  const uint64_t stepElems = w.send->slotBytes[proto] / 4;
  const uint64_t loopElems = stepElems * uint64_t(n);
  const uint64_t nloops = std::max<uint64_t>(1, (cEnd - cBeg + loopElems - 1) / loopElems);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  uint64_t recvWrong = 0;  // wrong bytes in received messages

  const std::vector<float> G = arG(n, iter, w.comm);
  const uint32_t iterSeed = uint32_t(seedOf(0xa11, iter, uint64_t(w.comm), 0, 0));
  if (o.check) {
    for (uint64_t i = cBeg; i < cEnd; i++) {
      hv[i] = arH(iterSeed, i);
      in[i] = hv[i] + G[size_t(r)];
    }
  }

  // Every received message is compared with the exact partial (or full) sum it must carry:
  // reduce-scatter step s brings the sum of ranks r-1 .. r-1-s, all-gather steps the full sum.
  auto verify = [&](const float* d, uint64_t b, uint64_t m, int contributors, const char* phase, int stepNo) {
    float gs = 0, k = float(contributors);
    for (int j = 1; j <= contributors; j++) gs += G[size_t(mod(r - j))];
    uint64_t bad = 0, firstIdx = 0;
    float firstGot = 0, firstWant = 0;
    for (uint64_t i = 0; i < m; i++) {
      float want = k * hv[b + i] + gs;
      if (memcmp(&want, &d[i], 4) == 0) continue;
      const uint8_t* a = reinterpret_cast<const uint8_t*>(&want);
      const uint8_t* g = reinterpret_cast<const uint8_t*>(&d[i]);
      if (!bad) {
        firstIdx = b + i;
        firstGot = d[i];
        firstWant = want;
      }
      for (int q = 0; q < 4; q++) bad += a[q] != g[q];
    }
    if (bad)
      reportDataError(strf("allreduce: wrong data from rank %d on channel %d, %s step %d of iteration %llu: %llu "
                           "bytes differ (first at element %llu: %.9g, expected %.9g)",
                           mod(r - 1), w.channel, phase, stepNo, (unsigned long long)iter, (unsigned long long)bad,
                           (unsigned long long)firstIdx, double(firstGot), double(firstWant)));
    recvWrong += bad;
  };
  auto checkSize = [&](size_t got, size_t want, uint64_t step) {
    if (got == want) return;
    reportDataError(strf("allreduce: channel %d step %llu: received %zu bytes, expected %zu", w.channel,
                         (unsigned long long)step, got, want));
    recvWrong += got > want ? got - want : want - got;
  };

  if (n == 1) {
    copyBytes(out + cBeg, in + cBeg, (cEnd - cBeg) * 4);
  } else {
    w.queueRecv(nloops * uint64_t(2 * (n - 1)), proto);
    uint64_t ss = w.send->gpuTail.load(), rs = w.recv->gpuHead.load();
    for (uint64_t loop = 0; loop < nloops; loop++) {
      const uint64_t off = cBeg + loop * loopElems;
      const uint64_t remaining = cEnd > off ? std::min(cEnd - off, loopElems) : 0;
      const uint64_t chunk = std::min<uint64_t>(stepElems, (remaining + uint64_t(n) - 1) / uint64_t(n));
      auto cb = [&](int k, uint64_t* b, uint64_t* l) {
        uint64_t s0 = std::min<uint64_t>(off + uint64_t(k) * chunk, off + remaining);
        uint64_t e0 = std::min<uint64_t>(s0 + chunk, off + remaining);
        *b = s0;
        *l = e0 - s0;
      };
      uint64_t b, l;
      // Reduce-scatter step 0: send our own chunk r.
      cb(r, &b, &l);
      {
        char* p = w.sendSlot(ss, proto);
        copyBytes(p, in + b, l * 4);
        w.maybeCorrupt(p, l * 4);
        w.postSend(ss++, l * 4, proto);
      }
      for (int s = 0; s < n - 1; s++) {  // reduce-scatter steps
        cb(mod(r - s - 1), &b, &l);
        size_t got;
        const float* d = reinterpret_cast<const float*>(w.waitRecv(rs, proto, &got));
        checkSize(got, l * 4, rs);
        uint64_t m = std::min<uint64_t>(l, got / 4);
        if (o.check) verify(d, b, m, s + 1, "reduce-scatter", s);
        float* dst = reinterpret_cast<float*>(w.sendSlot(ss, proto));
        if (s < n - 2) {
          for (uint64_t i = 0; i < m; i++) dst[i] = d[i] + in[b + i];
        } else {  // last: the chunk is complete; keep it and start the all-gather with it
          for (uint64_t i = 0; i < m; i++) out[b + i] = d[i] + in[b + i];
          copyBytes(dst, out + b, m * 4);
        }
        w.maybeCorrupt(reinterpret_cast<char*>(dst), m * 4);
        w.postSend(ss++, m * 4, proto);
        w.releaseRecv(rs++);
      }
      for (int t = 0; t < n - 1; t++) {  // all-gather steps
        cb(mod(r - t), &b, &l);
        size_t got;
        const char* d = w.waitRecv(rs, proto, &got);
        checkSize(got, l * 4, rs);
        uint64_t m = std::min<uint64_t>(l, got / 4);
        if (o.check) verify(reinterpret_cast<const float*>(d), b, m, n, "all-gather", t);
        copyBytes(out + b, d, m * 4);
        if (t < n - 2) {
          char* p = w.sendSlot(ss, proto);
          copyBytes(p, d, m * 4);
          w.postSend(ss++, m * 4, proto);
        }
        w.releaseRecv(rs++);
      }
    }
  }
  if (!o.check) return recvWrong;
  // Final result: catches steps that never wrote their part (output is poisoned after each
  // check). Counted only when every received byte was right, so one bad byte is not counted
  // twice.
  uint64_t outWrong = 0;
  float gAll = 0;
  for (int q = 0; q < n; q++) gAll += G[size_t(q)];
  for (uint64_t i = cBeg; i < cEnd; i++) {
    float want = float(n) * hv[i] + gAll;
    if (memcmp(&want, &out[i], 4) != 0) {
      const uint8_t* a = reinterpret_cast<const uint8_t*>(&want);
      const uint8_t* g = reinterpret_cast<const uint8_t*>(&out[i]);
      uint64_t before = outWrong;
      for (int k = 0; k < 4; k++) outWrong += a[k] != g[k];
      if (!before && !recvWrong)
        reportDataError(strf("allreduce result wrong on channel %d, iteration %llu at element %llu: %.9g, expected "
                             "%.9g",
                             w.channel, (unsigned long long)iter, (unsigned long long)i, double(out[i]), double(want)));
    }
    out[i] = -1.0f;
  }
  return recvWrong ? recvWrong : outWrong;
}
}  // namespace

uint64_t Communicator::channelWork(Channel* ch, uint64_t bytes, uint64_t iter, int proto) {
  WorkCtx w{opt_, rv_, comm_, ch->index, int(channels_.size()), ch->waiter, ch->send, ch->recv,
            secToUs(opt_.opTimeout) + 5000000};
  if (opt_.workload == Workload::kSendRecv) return workSendRecv(w, bytes, iter, proto);
  return workAllReduce(w, bytes, iter, proto, in_.data(), out_.data(), hv_.data());
}

// ---- sweep and timed modes ----------------------------------------------------------------------
static void netAttrFor(const Options& o, int proto, ncclNetAttr_t* a) {
  memset(a, 0, sizeof *a);
  // Hints only. Bit positions follow NCCL's enums (func: AllReduce 4, SendRecv 5; algo: Ring 1;
  // proto: LL 0, Simple 2); a plugin may ignore them.
  a->sendCommAttr = {1, 1, 1, 1};
  a->recvCommAttr = {1, 1, 1, 1};
  a->op = 1u << (o.workload == Workload::kAllReduce ? 4 : 5);
  a->algo = 1u << 1;
  a->proto = 1u << (proto == kProtoLL ? 0 : 2);
}

static void sizeBuffers(const Options& o, uint64_t bytes, std::vector<float>* in, std::vector<float>* out,
                        std::vector<float>* hv) {
  if (o.workload != Workload::kAllReduce) return;
  size_t n = size_t(bytes / 4);
  if (in->size() < n) {
    in->assign(n, 0.0f);
    out->assign(n, -1.0f);
    hv->assign(n, 0.0f);
  }
}

void Communicator::runSweep() {
  std::vector<uint64_t> sizes;
  for (uint64_t s = opt_.minBytes; s <= opt_.maxBytes;) {
    uint64_t v = opt_.workload == Workload::kAllReduce ? s / 4 * 4 : s;
    if (sizes.empty() || sizes.back() != v) sizes.push_back(v);
    uint64_t next = opt_.stepBytes ? s + opt_.stepBytes : uint64_t(double(s) * opt_.factor);
    if (next <= s) next = s + 1;
    s = next;
  }
  uint64_t k = 0;
  for (uint64_t bytes : sizes) {
    int proto = bytes <= opt_.llMax ? kProtoLL : kProtoSimple;
    sizeBuffers(opt_, bytes, &in_, &out_, &hv_);
    if (net_.raw()->hasSetNetAttr()) {
      ncclNetAttr_t a;
      netAttrFor(opt_, proto, &a);
      for (void* ctx : ctxs_) engine_->setNetAttrOnProgress(ctx, a);
    }
    uint64_t wrong = 0;
    for (int i = 0; i < opt_.warmup; i++) {
      maybeReconnect(k);
      wrong += runIteration(bytes, k++, proto);
    }
    std::string err;
    if (!rv_.barrier(nextBarrier(), nowUs() + secToUs(opt_.rvTimeout), &err)) {
      Fatal::get().raise(kExitPeer, "barrier: " + err);
      throw Aborted{};
    }
    uint64_t t0 = nowNs();
    // --timeseries in a sweep: per-iteration latency records (latency percentiles per size).
    std::vector<IterRecord> iterLat;
    const bool recordIters = !opt_.timeseries.empty();
    if (recordIters) iterLat.reserve(size_t(opt_.iters));
    for (int i = 0; i < opt_.iters; i++) {
      maybeReconnect(k);
      uint64_t a = recordIters ? nowUs() : 0;
      uint64_t w = runIteration(bytes, k, proto);
      if (recordIters) iterLat.push_back(IterRecord{comm_, k, a, nowUs() - a, w, bytes});
      wrong += w;
      k++;
    }
    // --pattern oneway: a sender's iteration ends when its steps are posted, up to kSteps ahead
    // of the receiver; the window closes when they completed (as a stream sync in nccl-tests).
    if (opt_.oneway) drainSends(nowUs() + secToUs(opt_.opTimeout) + 5000000);
    uint64_t t1 = nowNs();
    if (!iterLat.empty()) {
      std::lock_guard<std::mutex> g(st_.mu);
      for (auto& r : iterLat) st_.iterRecords.push_back(r);
    }
    Row row;
    row.comm = comm_;
    row.bytes = bytes;
    row.count = opt_.workload == Workload::kAllReduce ? bytes / 4 : bytes;
    row.iters = opt_.iters;
    row.localTimeUs = opt_.iters > 0 ? double(t1 - t0) / 1e3 / opt_.iters : 0;
    row.localWrong = wrong;
    // nccl-tests: time averaged over ranks, wrong summed.
    struct {
      double t;
      uint64_t w;
    } mine{row.localTimeUs, wrong};
    std::vector<char> buf(sizeof mine);
    memcpy(buf.data(), &mine, sizeof mine);
    std::vector<std::vector<char>> all;
    if (!rv_.allgather(nextBarrier(), buf, &all, nowUs() + secToUs(opt_.rvTimeout), &err)) {
      Fatal::get().raise(kExitPeer, "result exchange: " + err);
      throw Aborted{};
    }
    double tsum = 0;
    uint64_t wsum = 0;
    for (auto& b : all) {
      decltype(mine) x;
      memcpy(&x, b.data(), sizeof x);
      tsum += x.t;
      wsum += x.w;
    }
    row.timeUs = tsum / opt_.nranks;
    row.wrong = wsum;
    row.gathered = true;
    row.algbw = row.timeUs > 0 ? double(bytes) / (row.timeUs * 1e3) : 0;
    row.busbw = row.algbw * busFactor(opt_.workload, opt_.nranks);
    printRow(opt_, row);
    std::lock_guard<std::mutex> g(st_.mu);
    st_.rows.push_back(row);
  }
}

bool Communicator::mayRunIteration(uint64_t k, uint64_t* limit, bool* final, uint64_t deadlineUs) {
  const int n = opt_.nranks;
  if (opt_.rank == 0) {
    if (!*final) {
      std::string err;
      uint64_t msg[2];
      if (nowUs() >= deadlineUs || stopFileSeen()) {
        *final = true;
        msg[0] = *limit;
        msg[1] = 1;
      } else {
        *limit = k + kPermitWindow;
        msg[0] = *limit;
        msg[1] = 0;
      }
      for (int q = 1; q < n; q++) {
        if (!rv_.send(q, Rendezvous::Tag{Rendezvous::kPermit, uint32_t(comm_), uint32_t(k), 0}, msg, sizeof msg, &err)) {
          if (rv_.firstGonePeer() >= 0) throw Aborted{};
          Fatal::get().raise(kExitPeer, "duration control: " + err);
          throw Aborted{};
        }
      }
    }
    return k < *limit;
  }
  // Other ranks: read rank 0's grants (one message per rank-0 iteration, tagged by its index).
  while (!*final && k >= *limit) {
    std::vector<char> m;
    auto s = rv_.recv(0, Rendezvous::Tag{Rendezvous::kPermit, uint32_t(comm_), uint32_t(permitSeq_), 0}, &m,
                      nowUs() + secToUs(opt_.opTimeout) + 5000000);
    if (s == Rendezvous::Status::kPeerGone) throw Aborted{};
    if (s != Rendezvous::Status::kOk || m.size() != 16) {
      Fatal::get().raise(kExitTimeout, "duration control: no permit from rank 0");
      throw Aborted{};
    }
    permitSeq_++;
    uint64_t msg[2];
    memcpy(msg, m.data(), sizeof msg);
    *limit = msg[0];
    *final = msg[1] != 0;
  }
  return k < *limit;
}

void Communicator::runDuration() {
  uint64_t bytes = opt_.workload == Workload::kAllReduce ? opt_.minBytes / 4 * 4 : opt_.minBytes;
  int proto = bytes <= opt_.llMax ? kProtoLL : kProtoSimple;
  sizeBuffers(opt_, bytes, &in_, &out_, &hv_);
  if (net_.raw()->hasSetNetAttr()) {
    ncclNetAttr_t a;
    netAttrFor(opt_, proto, &a);
    for (void* ctx : ctxs_) engine_->setNetAttrOnProgress(ctx, a);
  }
  std::string err;
  if (!rv_.barrier(nextBarrier(), nowUs() + secToUs(opt_.rvTimeout), &err)) {
    Fatal::get().raise(kExitPeer, "barrier: " + err);
    throw Aborted{};
  }
  uint64_t t0 = nowUs() / 1000 * 1000;  // whole milliseconds: buckets line up across ranks
  logInfo("timed run started: %s per iteration for %.3g s", humanBytes(bytes).c_str(), opt_.duration);
  // Only --timeseries writes the buckets (--duration <= 24 h then, main.cc). The tail after the
  // run (end-of-run barrier, late completions) gets up to 2 op timeouts, at most an hour: later
  // bytes land in the last bucket.
  if (!opt_.timeseries.empty())
    engine_->timeseries().start(t0, uint64_t(opt_.duration + std::min(2 * opt_.opTimeout, 3600.0) + 60));
  uint64_t deadline = t0 + secToUs(opt_.duration);
  if (opt_.pauseRecvRank == opt_.rank && opt_.pauseRecvForS > 0) {
    uint64_t from = t0 + secToUs(opt_.pauseRecvAtS);
    engine_->setRecvPause(from, from + secToUs(opt_.pauseRecvForS));
    logInfo("receives pause %.3g s after the start for %.3g s", opt_.pauseRecvAtS, opt_.pauseRecvForS);
  }
  uint64_t limit = 0, k = 0, wrong = 0;
  bool final = false, fatal = false;
  uint64_t tStart = nowNs();
  try {
    while (mayRunIteration(k, &limit, &final, deadline)) {
      maybeReconnect(k);
      uint64_t a = nowUs();
      uint64_t w = runIteration(bytes, k, proto);
      uint64_t b = nowUs();
      wrong += w;
      std::lock_guard<std::mutex> g(st_.mu);
      st_.timedWrong += w;
      // One record per iteration grows the process by ~48 B per iteration: long runs that
      // watch the process's memory (railover soak) turn it off with --no-iter-records.
      if (opt_.iterRecords) st_.iterRecords.push_back(IterRecord{comm_, k, a, b - a, w, bytes});
      k++;
    }
    if (opt_.oneway) drainSends(nowUs() + secToUs(opt_.opTimeout) + 5000000);  // as in the sweep
  } catch (Aborted&) {
    if (Fatal::get().aborted() || rv_.firstGonePeer() < 0) {
      fatal = true;
    } else {
      stopEarly_ = true;
      std::lock_guard<std::mutex> g(st_.mu);
      st_.stoppedEarly = strf("rank %d exited", rv_.firstGonePeer());
      logWarn("rank %d exited: stopping early after %llu iterations", rv_.firstGonePeer(), (unsigned long long)k);
    }
  }
  uint64_t tEnd = nowNs();
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.tsStartUs = t0;
    st_.tsEndUs = tEnd / 1000;
    st_.tsBuckets = engine_->timeseries().snapshot(tEnd / 1000 + 1);
  }
  Row row;
  row.comm = comm_;
  row.bytes = bytes;
  row.count = opt_.workload == Workload::kAllReduce ? bytes / 4 : bytes;
  row.iters = int(k);
  row.localTimeUs = k ? double(tEnd - tStart) / 1e3 / double(k) : 0;
  row.localWrong = wrong;
  row.timeUs = row.localTimeUs;
  row.wrong = wrong;
  if (!stopEarly_ && !fatal) {
    struct {
      double t;
      uint64_t w;
    } mine{row.localTimeUs, wrong};
    std::vector<char> buf(sizeof mine);
    memcpy(buf.data(), &mine, sizeof mine);
    std::vector<std::vector<char>> all;
    if (rv_.allgather(nextBarrier(), buf, &all, nowUs() + secToUs(opt_.rvTimeout), &err)) {
      double tsum = 0;
      uint64_t wsum = 0;
      for (auto& b : all) {
        decltype(mine) x;
        memcpy(&x, b.data(), sizeof x);
        tsum += x.t;
        wsum += x.w;
      }
      row.timeUs = tsum / opt_.nranks;
      row.wrong = wsum;
      row.gathered = true;
    } else {
      logWarn("result exchange after the timed run failed: %s (reporting local numbers)", err.c_str());
      if (rv_.firstGonePeer() >= 0) stopEarly_ = true;
    }
  }
  row.algbw = row.timeUs > 0 ? double(bytes) / (row.timeUs * 1e3) : 0;
  row.busbw = row.algbw * busFactor(opt_.workload, opt_.nranks);
  printRow(opt_, row);
  {
    std::lock_guard<std::mutex> g(st_.mu);
    st_.rows.push_back(row);
  }
  if (fatal) throw Aborted{};
}

}  // namespace rperf
