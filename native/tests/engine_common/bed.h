// The test bed the shared failover-engine scenarios (engine_common/scenarios.inc) run on. Two
// suites implement it, each over its own fake transport, and both run every shared scenario:
//   tests/engine/failover_test.cc (railover_engine_tests): the byte-stream fake (fake_net.h)
//     under the real TCP framing layer (transport/tcp/stream_path), driven through the plugin
//     API (api::listen/connect/accept/isend/irecv/test/close*);
//   tests/engine_only/engine_only_test.cc (railover_engine_only_tests): the chunk-level fake
//     (engine_only/fake_paths.h), driven through the links (Listener, SendLink, RecvLink), in a
//     binary that links nothing from transport/tcp/.
// This header must include nothing from transport/tcp/ (the engine-only binary includes it).
//
// The bed: one process plays both ranks of one comm (`send`, `recv`) over two NICs, n0
// (10.0.0.1, rail 0, the primary) and n1 (10.0.1.1, rail 1, the standby); a scripted health
// view (`health`); the journal in a temp file; the config setUpBed() installs (2 streams,
// 4 KiB minimum chunks, 50 ms hold-down growing to at most 800 ms, 5 ms stall, 1 s fatal
// timeout, 200 ms back-off cap). Faults are set on the fake's wire between a local NIC and a remote address:
// w(0, kA0) carries the primary, w(1, kA1) the standby.
//
// Thread-safety: single-threaded. The test thread drives everything: pump() plays the
// acceptor (routing through the runtime's link registry), the registry's sweep()/sweepIdle()
// stand in for its sweeper thread.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/log.h"
#include "failover/link.h"
#include "plugin/runtime.h"
#include "telemetry/journal.h"
#include "tests/log_capture.h"
#include "tests/scripted_health.h"
#include "tests/test_journal.h"
#include "tests/test_nic.h"

namespace railover {
namespace enginetest {

inline const char* const kA0 = "10.0.0.1";  // NIC 0, rail 0 (primary)
inline const char* const kA1 = "10.0.1.1";  // NIC 1, rail 1 (standby)

// Sets one config value for the rest of a test and restores it at the end.
struct Setting {
  uint32_t& ref;
  uint32_t saved;
  Setting(uint32_t& r, uint32_t v) : ref(r), saved(r) { r = v; }
  ~Setting() { ref = saved; }
};

// Byte `off` of test message `msg`: differs between messages and along a message, so a byte
// in the wrong place or from the wrong message is caught.
inline uint8_t pattern(uint64_t msg, uint64_t off) { return (uint8_t)(msg * 2654435761u + off * 40503u + (off >> 9)); }

// Message sizes in bytes, cycling: empty, tiny, below and above one chunk, several chunks.
inline size_t mixed(int k) { return (size_t[]){0, 1, 100, 4096, 5000, 70000, 250000, 33}[k % 8]; }

// The value of string field `key` in one journal line ("" when absent); unescapes \" and \\.
inline std::string jsonField(const std::string& line, const std::string& key) {
  std::string k = "\"" + key + "\":\"";
  size_t i = line.find(k);
  if (i == std::string::npos) return "";
  std::string v;
  for (i += k.size(); i < line.size() && line[i] != '"'; ++i) {
    if (line[i] == '\\' && i + 1 < line.size()) ++i;
    v += line[i];
  }
  return v;
}
// The integer field `key` of a journal line; -1 when it is missing or not an integer.
inline long long jsonInt(const std::string& line, const std::string& key) {
  std::string k = "\"" + key + "\":";
  size_t i = line.find(k);
  if (i == std::string::npos || i + k.size() >= line.size() || !isdigit((unsigned char)line[i + k.size()])) return -1;
  return std::stoll(line.substr(i + k.size()));
}
// One journal line of a comm, as the transition tests read them: a path_state event
// ("dir", "nic", "from", "to", "reason") or another event (only `event` and `dir` set).
struct JournalStep {
  std::string event, dir, nic, from, to, reason;
  bool is(const char* d, const char* n, const char* f, const char* t) const {
    return event == "path_state" && dir == d && nic == n && from == f && to == t;
  }
};
// What run() and runGrouped() report.
struct Stats {
  uint64_t delivered = 0;           // messages received whole and checked
  bool timedOut = false;            // the run's own deadline passed (a hang, never expected)
  ncclResult_t err = ncclSuccess;  // the first error a call returned
};

// The fixture base. `FakeTransport` is the suite's fake: a railover::Transport with
//   std::shared_ptr<Wire> wire(int nic, const std::string& remote)   the faults of one NIC pair
//   std::map<std::pair<int, std::string>, std::shared_ptr<Wire>> wires
//   std::vector<std::string> nicAddr                                 address per local NIC
//   void pump()                                                      plays the acceptor
// where Wire has at least: drop, broken, stalled, refuse, peerGone, hangConnect, peerAcks
// (bool) and bytes (payload bytes sent toward the receiver). The suite derives from it,
// implements the hooks below and calls setUpBed() from its SetUpTestSuite().
template <class FakeTransport>
class EngineBed : public ::testing::Test {
 public:
  using Wire = typename decltype(std::declval<FakeTransport&>().wire(0, std::string()))::element_type;

 protected:
  static inline FakeTransport* transport = nullptr;
  static inline fake::ScriptedHealth* health = nullptr;
  static inline ncclDebugLogger_t logger = nullptr;  // the suite's logger (nullptr: the default)

  // Installs `tr`, a scripted health view and a journal at a temp file named after
  // `journalTag` and the process id into the process-wide runtime with the bed's config (the
  // API layer the byte-stream suite drives gets its links' dependencies there), routes `tr`'s
  // streams to the runtime's link registry and sets the suite's logger. Once per binary (from
  // SetUpTestSuite).
  static void setUpBed(FakeTransport* tr, const char* journalTag, ncclDebugLogger_t suiteLogger) {
    logger = suiteLogger;
    setLogger(logger);
    transport = tr;
    transport->nicAddr = {kA0, kA1};
    health = new fake::ScriptedHealth();
    Config cfg;
    cfg.nStreams = 2;
    cfg.minChunkBytes = 4096;
    cfg.holdDownMs = 50;
    cfg.holdDownMaxMs = 800;
    cfg.stallMs = 5;
    cfg.fatalTimeoutS = 1;
    cfg.backoffMaxMs = 200;
    cfg.maxRecvs = kMaxRecvs;  // the grouped-receive scenarios (RAILOVER_MAX_RECVS=8; the default is 1)
    journalPath() = ::testing::TempDir() + journalTag + "-" + std::to_string(getpid()) + ".jsonl";
    testbed::removeJournalAtExit(journalPath());
    auto* journal = new FileJournal(journalPath());  // lives as long as the binary (links write to it)
    Runtime::get().initForTest(cfg, {testbed::makeNic(0, "n0", kA0, 0), testbed::makeNic(1, "n1", kA1, 1)}, transport,
                               journal);
    transport->router = &Runtime::get().links;
    Health::install(health);
  }
  // The runtime's link registry, which the bed's links are listed in.
  static LinkRegistry& links() { return Runtime::get().links; }
  static std::string& journalPath() {
    static std::string p;
    return p;
  }
  // Size in bytes of the journal file now: a mark for journalEvents().
  static size_t journalSize() {
    FILE* f = fopen(journalPath().c_str(), "r");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fclose(f);
    return n;
  }
  // Journal lines written since `from` (a byte offset of the journal file) whose event is one
  // of `names`.
  static std::vector<std::string> journalEvents(size_t from, std::initializer_list<const char*> names) {
    std::vector<std::string> out;
    FILE* f = fopen(journalPath().c_str(), "r");
    if (!f) return out;
    fseek(f, (long)from, SEEK_SET);
    char line[4096];
    while (fgets(line, sizeof(line), f))
      for (const char* n : names)
        if (std::string(line).find(std::string("\"event\":\"") + n + "\"") != std::string::npos) out.push_back(line);
    fclose(f);
    return out;
  }

  // The journal lines of comm `secret` (both directions) since `from` (a journalSize() mark)
  // whose event is one of `names`, in order.
  static std::vector<JournalStep> commSteps(size_t from, uint64_t secret, std::initializer_list<const char*> names) {
    std::vector<JournalStep> out;
    for (const std::string& l : journalEvents(from, names)) {
      if (jsonField(l, "comm") != std::to_string(secret)) continue;
      JournalStep s;
      s.event = jsonField(l, "event"), s.dir = jsonField(l, "dir"), s.nic = jsonField(l, "nic");
      s.from = jsonField(l, "from"), s.to = jsonField(l, "to"), s.reason = jsonField(l, "reason");
      out.push_back(s);
    }
    return out;
  }
  // Index of the one step of `steps` that is the transition (dir, nic, from -> to); -1 when
  // there is none, -2 when there are several (each transition must appear once).
  static int onlyStep(const std::vector<JournalStep>& steps, const char* dir, const char* nic, const char* from,
                      const char* to) {
    int at = -1;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].is(dir, nic, from, to)) at = at == -1 ? (int)i : -2;
    return at;
  }

  void SetUp() override {
    resetWires();
    for (auto& p : health->pairs) p.up = true, p.hard = false, p.answering = true;
    health->nics.assign(8, true);
  }
  void TearDown() override {
    closeSend();
    closeRecv();
  }

  SendLink* send = nullptr;
  RecvLink* recv = nullptr;

  // ---- what each suite implements over its fake ----
  // Connecting, one non-blocking step at a time as NCCL drives it: listen() opens the
  // receiver's listener; connectStep() makes one connect call and returns true once `send` is
  // set; acceptStep() makes one accept call and returns true once `recv` is set; endListen()
  // closes the listener. Errors are test failures (gtest assertions inside).
  virtual void listen() = 0;
  virtual bool connectStep() = 0;
  virtual bool acceptStep() = 0;
  virtual void endListen() = 0;
  // The data calls, as NCCL makes them on `send` and `recv`: a NULL request means "again".
  virtual ncclResult_t isend(void* data, size_t size, int tag, void** request) = 0;
  virtual ncclResult_t irecv(int n, void** data, const size_t* caps, int* tags, void** request) = 0;
  virtual ncclResult_t testSend(void* request, int* done, int* size) = 0;
  virtual ncclResult_t testRecv(void* request, int* done, int* sizes) = 0;
  // Close and delete `send` (also one still connecting) / `recv`, if any, and set it nullptr.
  virtual void closeSend() = 0;
  virtual void closeRecv() = 0;
  // Faults the wire alone cannot express, each as the suite's fake has it:
  // one stream (lane) of the primary path's sender takes nothing more, the others still move;
  virtual void stallOneLaneOfThePrimary() = 0;
  // the receiver's ACKs on its active path cannot leave (its CLOSE still can);
  virtual void stallAcksOfTheReceiver() = 0;
  // the sender's transport gives up on every path at once (a kernel user timeout): its calls
  // fail, so the sender fences the paths and the receiver sees every rail closed by the sender.
  virtual void senderGivesUpOnEveryPath() = 0;
  // Payload bytes a connected standby path has carried toward the receiver when no data
  // moved on it (the connection setup, if the transport sends any on the wire).
  virtual uint64_t standbyBytesWhenIdle() const = 0;

  // ---- shared by every scenario ----
  std::shared_ptr<Wire> w(int nic, const char* remote) { return transport->wire(nic, remote); }
  void resetWires() {
    for (auto& wr : transport->wires) *wr.second = Wire();
  }
  int activeNic() const { return send->active >= 0 ? send->paths[send->active].localNic : -1; }

  // What the runtime's sweeper thread does after a health change (LinkRegistry::runSweeper):
  // passes until every link is settled (bounded here; the thread stops after 1 s). Between
  // health changes it makes only idle passes (links().sweepIdle()).
  void sweeperWindow() {
    for (int i = 0; i < 20000 && links().sweep() > 0; ++i) transport->pump();
  }

  // Connects one comm (`send`, `recv`) as NCCL does: connect and accept called in turn until
  // both returned their comm.
  void connectComm() {
    listen();
    finishConnect();
  }
  // The rest of connectComm, after listen() (a test may poll the connect on its own first).
  void finishConnect() {
    bool connected = false, accepted = false;
    for (int i = 0; i < 100000 && !(connected && accepted) && !HasFatalFailure(); ++i) {
      if (!connected) connected = connectStep();
      transport->pump();
      if (!accepted) accepted = acceptStep();
    }
    endListen();
    ASSERT_TRUE(connected && accepted);
  }

  // Gives receiver `l` a health view of its own (the two ends of a real job are two processes
  // with two monitors) until destroyed.
  struct ReceiverHealth {
    RecvLink* l;
    Health* saved;
    ReceiverHealth(RecvLink* link, fake::ScriptedHealth* view) : l(link), saved(link->deps.health) {
      view->pairs = health->pairs;
      view->nics = health->nics;
      std::lock_guard<std::mutex> g(l->mu);
      l->deps.health = view;
    }
    ~ReceiverHealth() {
      std::lock_guard<std::mutex> g(l->mu);
      l->deps.health = saved;
    }
  };

  // Connects a comm, then a peer NIC-down notice (`cause`) on rail 0 makes the pair hard down
  // in the sender's view and in the receiver's own `recvView` (see ReceiverHealth); the comm
  // fails over. After the repair only the sender's view learns it: traffic runs until the
  // sender failed back onto the reconnected path, with the receiver's verdict still standing
  // (its epoch moving all the while, as a monitor with many peers does).
  void failBackUnderAStaleReceiverVerdict(fake::ScriptedHealth& recvView, const char* cause) {
    w(0, kA0)->broken = true;
    health->setPair(0, kA0, false, true, cause);
    recvView.setPair(0, kA0, false, true, cause);
    ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
    ASSERT_EQ(activeNic(), 1);
    w(0, kA0)->broken = false;
    health->setPair(0, kA0, true, false, "");
    auto t0 = std::chrono::steady_clock::now();
    while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      recvView.setNic(7, true);  // an unrelated change: the epoch moves
      ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
    }
    ASSERT_EQ(send->counters.failbacks, 1u) << "no failback: " << send->paths[0].lastError;
    ASSERT_EQ(activeNic(), 0);
    EXPECT_EQ(send->counters.flaps, 0u) << "the receiver failed the reconnected path: " << send->paths[0].lastError;
    ASSERT_TRUE(recvView.pairHardDown(recv->paths[recv->active].pairId)) << "the receiver's verdict was not stale";
  }

  // The standby (rail 1) has just come back (`repair`: its pair or its NIC), then the active
  // rail dies silently (a probe timeout; no data moves on it): runs traffic through the
  // failover and returns how long after the repair the comm failed over (negative: it did
  // not; the run checks every byte).
  std::chrono::steady_clock::duration failoverAfterStandbyRepair(const std::function<void()>& repair) {
    using Clock = std::chrono::steady_clock;
    repair();
    auto back = Clock::now();
    Clock::duration at(-1);
    w(0, kA0)->stalled = true;
    health->setPair(0, kA0, false, false, "probe timeout (test)");
    Stats st = run(40, mixed, 8, nullptr, [&] {
      if (send->counters.failovers && at.count() < 0) at = Clock::now() - back;
    });
    EXPECT_EQ(st.delivered, 40u) << "no failover: " << send->paths[0].lastError;
    return at;
  }

  // Runs `n` messages of sizeOf(k) bytes through the comm with up to `window` in flight;
  // `onMsg(k)` is called before message k is posted and `each()` once per loop (the fault
  // injection points). Every byte is checked, and that nothing lands past a message or in its
  // buffer after its receive completed. Gives up after `timeoutMs` (Stats::timedOut).
  Stats run(int n, std::function<size_t(int)> sizeOf, int window, std::function<void(int)> onMsg = nullptr,
            std::function<void()> each = nullptr, int timeoutMs = 20000) {
    std::vector<std::vector<uint8_t>> sb(n), rb(n);
    for (int k = 0; k < n; ++k) fill(k, sizeOf(k), &sb[k], &rb[k]);
    std::vector<void*> sr(n), rr(n);
    int sp = 0, rp = 0, sd = 0, rd = 0;
    Stats st;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while ((sd < n || rd < n) && st.err == ncclSuccess && turn(end, each, &st)) {
      while (sp < n && sp - sd < window) {
        if (onMsg) onMsg(sp);
        void* q = nullptr;
        st.err = isend(sb[sp].data(), sb[sp].size(), 0, &q);
        if (!q || st.err) break;
        sr[sp++] = q;
      }
      while (rp < n && rp - rd < window && st.err == ncclSuccess) {
        void* q = nullptr;
        void* d = rb[rp].data();
        size_t cap = rb[rp].size();
        int tag = 0;
        st.err = irecv(1, &d, &cap, &tag, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, size = 0;
      if (sd < sp && st.err == ncclSuccess) {
        st.err = testSend(sr[sd], &done, &size);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        st.err = testRecv(rr[rd], &done, &size);
        if (done) {
          checkReceived(sb[rd], &rb[rd], size, "message " + std::to_string(rd));
          ++rd;
          ++st.delivered;
        }
      }
    }
    for (int k = 0; k < rd; ++k) checkUntouched(rb[k], "message " + std::to_string(k));
    return st;
  }

  // Grouped receives (irecv of n buffers, maxRecvs = 8): `groups` grouped receives of `n`
  // buffers each. The k-th isend carries tag 100 + (p + j) % n (j = k / n its group, p = k % n
  // its place in it: each group's sends come in a different tag order); the receiver posts
  // group j's buffers with tags 100 + n - 1 - i (reversed). So buffer i of group j must receive
  // message j*n + ((n - 1 - i - j) mod n), whole and in place. `onGroup(j)` is called before
  // group j's receive is posted, `each()` once per loop. Stats::delivered counts messages.
  Stats runGrouped(int groups, int n, std::function<void(int)> onGroup = nullptr, std::function<void()> each = nullptr) {
    const int total = groups * n;
    std::vector<std::vector<uint8_t>> sb(total), rb(total);  // rb[k]: the buffer message k must land in
    for (int k = 0; k < total; ++k) fill(k, mixed(k * 7 + 3), &sb[k], &rb[k]);
    auto msgFor = [&](int j, int i) { return j * n + (((n - 1 - i - j) % n) + n) % n; };
    auto name = [&](int j, int i) {
      return "group " + std::to_string(j) + " buffer " + std::to_string(i) + " (message " + std::to_string(msgFor(j, i)) + ")";
    };
    std::vector<void*> sr(total), rr(groups);
    int sp = 0, rp = 0, sd = 0, rd = 0;
    Stats st;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((sd < total || rd < groups) && st.err == ncclSuccess && turn(end, each, &st)) {
      while (sp < total && sp - sd < 8 * n) {
        int j = sp / n, p = sp % n;
        void* q = nullptr;
        st.err = isend(sb[sp].data(), sb[sp].size(), 100 + (p + j) % n, &q);
        if (!q || st.err) break;
        sr[sp++] = q;
      }
      while (rp < groups && rp - rd < 8 && st.err == ncclSuccess) {
        if (onGroup) onGroup(rp);
        void* d[kMaxRecvs];
        size_t caps[kMaxRecvs];
        int tags[kMaxRecvs];
        for (int i = 0; i < n; ++i) {
          int k = msgFor(rp, i);
          d[i] = rb[k].data(), caps[i] = rb[k].size(), tags[i] = 100 + n - 1 - i;
        }
        void* q = nullptr;
        st.err = irecv(n, d, caps, tags, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, sizes[kMaxRecvs];
      if (sd < sp && st.err == ncclSuccess) {
        st.err = testSend(sr[sd], &done, sizes);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        for (int i = 0; i < n; ++i) sizes[i] = -1;
        st.err = testRecv(rr[rd], &done, sizes);
        if (done) {
          for (int i = 0; i < n; ++i) checkReceived(sb[msgFor(rd, i)], &rb[msgFor(rd, i)], sizes[i], name(rd, i));
          ++rd;
          st.delivered += n;
        }
      }
    }
    for (int j = 0; j < rd; ++j)
      for (int i = 0; i < n; ++i) checkUntouched(rb[msgFor(j, i)], name(j, i));
    return st;
  }

 private:
  // Message k of `size` bytes: its bytes (pattern) and its receive buffer, 64 guard bytes
  // longer, filled with 0xEE.
  static void fill(int k, size_t size, std::vector<uint8_t>* sb, std::vector<uint8_t>* rb) {
    sb->resize(size);
    for (size_t j = 0; j < size; ++j) (*sb)[j] = pattern(k, j);
    rb->assign(size + 64, 0xEE);
  }
  // One turn of a run's loop: false once `end` passed (st->timedOut set); otherwise calls
  // `each`, does what the runtime's sweeper thread does every 10 ms and plays the acceptor.
  bool turn(std::chrono::steady_clock::time_point end, const std::function<void()>& each, Stats* st) {
    if (std::chrono::steady_clock::now() > end) {
      st->timedOut = true;
      return false;
    }
    if (each) each();
    links().sweepIdle();
    transport->pump();
    return true;
  }
  // A receive of `sent` completed into `rb` with `size` bytes: the size, every byte and the
  // guard bytes are checked, then the buffer is filled with 0xAA (NCCL reuses it now).
  static void checkReceived(const std::vector<uint8_t>& sent, std::vector<uint8_t>* rb, int size, const std::string& what) {
    EXPECT_EQ((size_t)size, sent.size()) << what;
    EXPECT_TRUE(sent.empty() || !memcmp(rb->data(), sent.data(), sent.size())) << what << " corrupted";
    for (size_t j = sent.size(); j < rb->size(); ++j)
      if ((*rb)[j] != 0xEE) {
        ADD_FAILURE() << "byte past the message written, " << what;
        break;
      }
    memset(rb->data(), 0xAA, rb->size());
  }
  // After the run: nothing was written into a completed receive's buffer.
  static void checkUntouched(const std::vector<uint8_t>& rb, const std::string& what) {
    for (uint8_t b : rb)
      if (b != 0xAA) {
        ADD_FAILURE() << "a stale byte landed in " << what << " after its receive completed";
        break;
      }
  }
};

}  // namespace enginetest
}  // namespace railover
