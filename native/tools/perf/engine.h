// railover-perf engine: NCCL's proxy model on the CPU.
//
//   "GPU" (channel worker threads, workload.cc)  <->  Conn FIFOs  <->  progress thread  -> plugin
//                                                                  service thread    -> plugin
//
// Conn is one NCCL connection = one plugin send or recv comm with NCCL_STEPS (8) slots of
// registered host memory per protocol (LL: small slots, SIMPLE: --slot-size slots), mirroring
// NCCL's per-connection buffers. The step counters follow NCCL's head/tail protocol:
//   send: the GPU writes slot s%8, then publishes gpuTail=s+1; the progress thread isends it and
//         publishes proxyTail=s+1 when test() says done (slot free again). At most 8 in flight.
//   recv: the GPU queues RecvOps (how many steps, which protocol); the progress thread pre-posts
//         irecv with the FULL slot size up to 8 steps ahead of gpuHead (the GPU's consumption),
//         tests only the oldest, publishes proxyTail=s+1 with the received size, and calls
//         irecvConsumed (when the plugin has it) once the GPU has consumed the step.
// Progress thread (NCCL "Progress"): isend/irecv/test/irecvConsumed/setNetAttr only; one post
// per connection per pass, then a test of that connection's oldest request; NULL requests are
// retried on the next pass; the optional-completion marker 0x1 is stored in *request before
// LL-protocol irecvs. It yields the CPU when a pass made no progress.
// Service thread (NCCL "Service"): listen/connect/accept/closeListen/regMr/deregMr/close; connect
// and accept are polled each loop pass until they return a comm.
// Watchdog: reports requests outstanding longer than --op-timeout (from the progress thread) and
// plugin calls blocked longer than --op-timeout (from CallTracker), then ends the process.
//
// Thread-safety: Conn atomics are the only state shared between GPU and proxy threads; RecvOp
// queues are mutex-protected. Engine::* methods are called from the main thread only unless
// noted.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tools/perf/net.h"
#include "tools/perf/rendezvous.h"
#include "tools/perf/util.h"

namespace rperf {

constexpr int kSteps = 8;  // NCCL_STEPS: slots (and requests in flight) per connection
enum Proto : int { kProtoLL = 0, kProtoSimple = 1, kNumProtos = 2 };

// A worker's doorbell: the progress thread rings it after any completion on a conn it owns.
class Waiter {
 public:
  void ring() {
    { std::lock_guard<std::mutex> g(mu_); }
    cv_.notify_all();
  }
  // Waits until pred() or deadline; throws Aborted if stop() says so. Returns pred().
  template <typename Pred, typename Stop>
  bool waitUntil(Pred pred, Stop stop, uint64_t deadlineUs) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (pred()) return true;
      if (stop()) throw Aborted{};
      uint64_t now = nowUs();
      if (now >= deadlineUs) return false;
      // Bounded so that stop() (abort flag, peer gone) is noticed without a dedicated wake-up.
      uint64_t w = std::min<uint64_t>(deadlineUs - now, 20000);
      cv_.wait_for(lk, std::chrono::microseconds(w));
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

struct RecvOp {
  uint64_t count;       // steps
  int proto;
  bool optional;        // store NCCL_NET_OPTIONAL_RECV_COMPLETION before irecv
};

struct Conn {
  // Identity (immutable after creation).
  bool isSend = false;
  int peer = -1;       // remote rank
  int channel = 0;
  uint32_t round = 0;  // connection generation (reconnects / reloads)
  void* ctx = nullptr;
  int dev = 0;
  int myRank = 0;
  std::string label;   // "send ch1 ->rank2 round 0" for messages

  // Setup (service thread).
  alignas(8) char handle[RAILOVER_NCCL_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  void* comm = nullptr;
  void* mh[kNumProtos] = {nullptr, nullptr};
  char* buf[kNumProtos] = {nullptr, nullptr};
  size_t slotBytes[kNumProtos] = {0, 0};
  std::atomic<bool> ready{false};
  std::atomic<bool> closed{false};

  // GPU <-> proxy.
  std::atomic<uint64_t> gpuTail{0};    // send: steps written by the GPU
  std::atomic<uint64_t> gpuHead{0};    // recv: steps consumed by the GPU
  std::atomic<uint64_t> proxyTail{0};  // send: steps completed (slot free); recv: steps received
  struct Slot {
    size_t size = 0;   // send: bytes to send (GPU); recv: bytes received (proxy)
    int proto = kProtoSimple;
  } slot[kSteps];
  std::mutex opMu;
  std::deque<RecvOp> ops;              // recv: queued by the GPU
  std::atomic<uint64_t> recvTarget{0}; // recv: total steps queued
  Waiter* waiter = nullptr;

  // Proxy-private.
  uint64_t posted = 0;
  uint64_t consumedSeen = 0;
  uint64_t opEnd = 0;                  // recv: step index where the front op ends
  bool opLoaded = false;               // recv: ops.front() is the op being posted
  int phandleDummy[kSteps] = {};
  void* req[kSteps] = {};
  void* doneReq[kSteps] = {};
  void* flushReq = nullptr;  // the oldest step's iflush in progress (--flush)
  int groupN[kSteps] = {1, 1, 1, 1, 1, 1, 1, 1};  // recv: buffers in the irecv posted at this step (0: a
                                                   // later entry of the group posted at an earlier step)
  uint64_t postUs[kSteps] = {};
  uint64_t nullSinceUs = 0;
  uint64_t bytesDone = 0;
  uint32_t aheadMask = 0;    // send, --send-ahead: bit i = step posted + i already accepted (i >= 1)
  uint32_t aheadTurn = 0;    // send, --send-ahead: which later step the next pass tries

  ~Conn();
  char* slotPtr(int proto, uint64_t step) const { return buf[proto] + (step % kSteps) * slotBytes[proto]; }
};

// The tag of step `step` sent by rank `rank` in grouped mode: distinct for the kSteps steps a
// group can span, so a message can only land in the buffer of its own step.
inline int tagFor(int rank, uint64_t step) { return rank * kSteps + int(step % kSteps); }

// Options the engine needs (subset of the command line).
struct EngineConfig {
  int rank = 0, nranks = 1, dev = 0;
  size_t slotBytes[kNumProtos] = {64 << 10, 512 << 10};
  uint64_t opTimeoutUs = 30000000;
  uint32_t idleSleepUs = 0;  // progress thread: sleep this long after 64 idle passes (0 = spin, as NCCL)
  bool profilerHandles = true;  // pass non-NULL phandles to v10+ isend/irecv
  bool flush = false;           // iflush every SIMPLE receive with bytes before the GPU sees it (GDR)
  // Grouped receives (NCCL's shared comms): SIMPLE steps are posted up to `group` (1..kSteps)
  // at a time as one irecv of n buffers, entries in reverse step order, each with its step's
  // tag (tagFor); 1 = every step its own irecv with the sender's rank as tag (as NCCL p2p).
  int group = 1;
  // Sends out of order (needs group > 1): each pass first tries the isend of a later step
  // (alternately posted + 1 and posted + group), then of step posted, as connections sharing a
  // comm (PXN) post out of each other's order. A NULL answer to the early one is expected (its
  // irecv is not the oldest unfilled one yet) and is not a stuck request.
  bool sendAhead = false;
};

// Per-millisecond byte counters (written by the progress thread, read after the run).
class TimeSeries {
 public:
  void start(uint64_t t0Us, uint64_t maxSeconds);
  void add(uint64_t nowUs, uint64_t bytes) {
    if (!on_) return;
    uint64_t i = nowUs >= t0_ ? (nowUs - t0_) / 1000 : 0;
    if (i >= buckets_.size()) i = buckets_.size() - 1;
    buckets_[i].fetch_add(bytes, std::memory_order_relaxed);
  }
  bool on() const { return on_; }
  uint64_t t0() const { return t0_; }
  // Bucket i covers [t0 + i ms, t0 + (i+1) ms).
  std::vector<uint64_t> snapshot(uint64_t endUs) const;

 private:
  bool on_ = false;
  uint64_t t0_ = 0;
  std::vector<std::atomic<uint64_t>> buckets_;
};

class Engine {
 public:
  Engine(Plugin& net, Rendezvous& rv, const EngineConfig& cfg);
  ~Engine();
  void start();               // starts service + progress threads
  // Stops the progress thread; with postInflight it first posts extra irecvs (and one small
  // isend) on every live conn and leaves them outstanding (NCCL's abort/destroy path).
  void stopProgress(bool postInflight);
  void stopService();

  // Creates a connection object (not yet set up).
  // dev < 0: the configured device (EngineConfig::dev).
  std::unique_ptr<Conn> makeConn(bool isSend, int peer, int channel, uint32_t round, void* ctx, Waiter* w,
                                 int dev = -1);
  // Queues setup of conns on the service thread; returns a ticket for waitSetup.
  int setupAsync(const std::vector<Conn*>& conns);
  // Waits until every task of the ticket has finished. stopOnAbort: give up (false) as soon as
  // a fatal error is raised; otherwise wait for completion even then (close path). Returns
  // false on timeout (Fatal raised) or abort.
  bool waitSetup(int ticket, uint64_t deadlineUs, bool stopOnAbort = true);
  // Makes pending setup tasks give up quietly (a peer left in duration mode).
  void cancelSetups() { cancelSetup_.store(true); }
  bool setupDone(int ticket);
  // Adds/removes conns to/from the progress thread (blocks until applied).
  void addToProgress(const std::vector<Conn*>& conns);
  void removeFromProgress(const std::vector<Conn*>& conns);
  // Queues deregMr + close of conns on the service thread; ticket for waitSetup-like waiting.
  int closeAsync(const std::vector<Conn*>& conns);
  // Runs setNetAttr(ctx, attr) on the progress thread (blocks until done).
  void setNetAttrOnProgress(void* ctx, const ncclNetAttr_t& attr);

  // Benchmarks (--pause-recv): between these CLOCK_MONOTONIC µs instants the progress thread
  // neither posts nor tests receives (a receiver that stops posting); sends go on.
  void setRecvPause(uint64_t fromUs, uint64_t toUs) {
    pauseToUs_.store(toUs);
    pauseFromUs_.store(fromUs);
  }

  TimeSeries& timeseries() { return ts_; }
  uint64_t bytesReceived() const { return bytesRecv_.load(); }
  // Maximum requests observed in flight on one connection.
  int maxInflight() const { return maxInflight_.load(); }
  // Requests deliberately left outstanding when the progress thread stopped.
  uint64_t leftInflight() const { return leftInflight_.load(); }

 private:
  struct Task;
  void serviceLoop();
  void progressLoop();
  bool progressSend(Conn* c, uint64_t now);
  bool progressRecv(Conn* c, uint64_t now);
  void checkStuck(Conn* c, uint64_t now);
  void postInflightExtras();
  // Runs fn on the progress thread between two passes (inline once that thread has ended).
  void runOnProgress(std::function<void()> fn);

  Plugin& net_;
  Rendezvous& rv_;
  EngineConfig cfg_;

  // service
  std::thread svcThread_;
  std::mutex svcMu_;
  std::condition_variable svcCv_;
  std::deque<std::shared_ptr<Task>> svcQueue_;
  bool svcStop_ = false;
  std::mutex ticketMu_;
  std::condition_variable ticketCv_;
  std::vector<int> ticketLeft_;  // tasks outstanding per ticket
  std::atomic<bool> cancelSetup_{false};

  // progress
  std::thread progThread_;
  std::mutex progMu_;
  std::condition_variable progCv_;
  std::deque<std::function<void()>> progCmds_;
  uint64_t cmdPosted_ = 0, cmdDone_ = 0;  // guarded by progMu_
  bool progExited_ = false;               // guarded by progMu_
  std::atomic<bool> progStop_{false};
  bool progPostInflight_ = false;
  std::vector<Conn*> progConns_;  // progress thread only

  TimeSeries ts_;
  std::atomic<uint64_t> pauseFromUs_{0}, pauseToUs_{0};
  std::atomic<uint64_t> bytesRecv_{0};
  std::atomic<int> maxInflight_{0};
  std::atomic<uint64_t> leftInflight_{0};
};

// Watchdog thread: every 100 ms checks CallTracker for plugin calls running longer than the
// op timeout; on one, raises Fatal(kExitTimeout) and calls onHang (which must end the process).
class Watchdog {
 public:
  void start(uint64_t opTimeoutUs, std::function<void()> onHang);
  void stop();
  ~Watchdog() { stop(); }

 private:
  std::thread t_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace rperf
