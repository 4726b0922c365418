// Deterministic tests of the failover engine against the fault-injecting fake transport:
// drops, resets, partial writes, duplicate chunks after out-of-order completion, failure
// during resume, failure of the standby during failover, failback, flaps, negative controls
// and the fatal timeout. Every test checks exactly-once, in-order delivery byte by byte, and
// that no byte lands in a receive buffer after its receive completed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "../fake_net.h"
#include "common/config.h"
#include "common/log.h"
#include "plugin/api.h"
#include "plugin/runtime.h"
#include "telemetry/journal.h"

using namespace railover;
using namespace railover::fake;

namespace {

FakeTransport* gTr = nullptr;
ScriptedHealth* gHl = nullptr;
const char* kA0 = "10.0.0.1";  // NIC 0, rail 0 (primary)
const char* kA1 = "10.0.1.1";  // NIC 1, rail 1 (standby)

Nic makeNic(int idx, const char* name, const char* addr, int rail) {
  Nic n;
  n.index = idx, n.name = name, n.rail = rail, n.ifindex = 100 + idx;
  sockaddr_storage a{};
  auto* s = (sockaddr_in*)&a;
  s->sin_family = AF_INET;
  inet_pton(AF_INET, addr, &s->sin_addr);
  n.addr = a, n.addrLen = sizeof(sockaddr_in);
  return n;
}

// Sets one config value for the rest of a test and restores it at the end.
struct Setting {
  uint32_t& ref;
  uint32_t saved;
  Setting(uint32_t& r, uint32_t v) : ref(r), saved(r) { r = v; }
  ~Setting() { ref = saved; }
};

uint8_t pattern(uint64_t msg, uint64_t off) { return (uint8_t)(msg * 2654435761u + off * 40503u + (off >> 9)); }

class Engine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gTr = new FakeTransport();
    gTr->nicAddr = {kA0, kA1};
    gHl = new ScriptedHealth();
    Config cfg;
    cfg.nStreams = 2;
    cfg.minChunkBytes = 4096;
    cfg.holdDownMs = 50;
    cfg.holdDownMaxMs = 800;
    cfg.stallMs = 5;
    cfg.fatalTimeoutS = 1;
    cfg.backoffMaxMs = 200;
    Runtime::get().initForTest(cfg, {makeNic(0, "n0", kA0, 0), makeNic(1, "n1", kA1, 1)}, gTr);
    Health::install(gHl);
    journalPath() = ::testing::TempDir() + "railover-engine-journal-" + std::to_string(getpid()) + ".jsonl";
    journalOpen(journalPath());
  }
  static std::string& journalPath() {
    static std::string p;
    return p;
  }
  // Journal lines written since `from` (a byte offset of the journal file).
  static std::vector<std::string> journalSince(size_t from) {
    std::vector<std::string> out;
    FILE* f = fopen(journalPath().c_str(), "r");
    if (!f) return out;
    fseek(f, (long)from, SEEK_SET);
    char line[4096];
    while (fgets(line, sizeof(line), f)) out.push_back(line);
    fclose(f);
    return out;
  }
  static size_t journalSize() {
    FILE* f = fopen(journalPath().c_str(), "r");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fclose(f);
    return n;
  }
  static std::vector<std::string> journalEvents(size_t from, std::initializer_list<const char*> names) {
    std::vector<std::string> out;
    for (auto& l : journalSince(from))
      for (const char* n : names)
        if (l.find(std::string("\"event\":\"") + n + "\"") != std::string::npos) out.push_back(l);
    return out;
  }
  void SetUp() override {
    for (auto& w : gTr->wires) *w.second = Wire();
    for (auto& p : gHl->pairs) p.up = true, p.hard = false;
    gHl->nics.assign(8, true);
  }

  SendLink* send = nullptr;
  RecvLink* recv = nullptr;

  void connectComm() {
    uint8_t handle[128] = {};
    void* lc = nullptr;
    ASSERT_EQ(api::listen(0, handle, &lc), ncclSuccess);
    void *s = nullptr, *r = nullptr;
    for (int i = 0; i < 100000 && !(s && r); ++i) {
      if (!s) ASSERT_EQ(api::connect(0, handle, &s), ncclSuccess);
      gTr->pump();
      if (!r) ASSERT_EQ(api::accept(lc, &r), ncclSuccess);
    }
    ASSERT_TRUE(s && r);
    api::closeListen(lc);
    send = (SendLink*)s;
    recv = (RecvLink*)r;
  }
  void TearDown() override {
    api::closeSend(send);
    api::closeRecv(recv);
  }

  std::shared_ptr<Wire> w(int nic, const char* remote) { return gTr->wire(nic, remote); }

  // Runs `n` messages through the comm with up to `window` in flight; `onMsg(k)` is called
  // when message k is posted (fault injection point). Returns messages delivered.
  struct Stats {
    uint64_t delivered = 0;
    bool timedOut = false;
    ncclResult_t err = ncclSuccess;
  };
  Stats run(int n, std::function<size_t(int)> sizeOf, int window, std::function<void(int)> onMsg = nullptr,
            int timeoutMs = 20000, std::function<void()> each = nullptr) {
    std::vector<std::vector<uint8_t>> sb(n), rb(n);
    for (int k = 0; k < n; ++k) {
      size_t sz = sizeOf(k);
      sb[k].resize(sz);
      for (size_t j = 0; j < sz; ++j) sb[k][j] = pattern(k, j);
      rb[k].assign(sz + 64, 0xEE);
    }
    std::vector<void*> sr(n), rr(n);
    int sp = 0, rp = 0, sd = 0, rd = 0;
    Stats st;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while ((sd < n || rd < n) && st.err == ncclSuccess) {
      if (std::chrono::steady_clock::now() > end) {
        st.timedOut = true;
        break;
      }
      if (each) each();
      sweepIdleLinks();  // what the runtime's sweeper thread does every 10 ms
      gTr->pump();
      while (sp < n && sp - sd < window) {
        if (onMsg) onMsg(sp);
        void* q = nullptr;
        st.err = api::isend(send, sb[sp].data(), sb[sp].size(), 0, nullptr, &q);
        if (!q || st.err) break;
        sr[sp++] = q;
      }
      while (rp < n && rp - rd < window && st.err == ncclSuccess) {
        void* q = (void*)0x1;
        void* d = rb[rp].data();
        size_t cap = rb[rp].size();
        int tag = 0;
        st.err = api::irecv(recv, 1, &d, &cap, &tag, nullptr, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, size = 0;
      if (sd < sp && st.err == ncclSuccess) {
        st.err = api::test(sr[sd], &done, &size);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        st.err = api::test(rr[rd], &done, &size);
        if (done) {
          EXPECT_EQ((size_t)size, sb[rd].size()) << "message " << rd;
          EXPECT_TRUE(sb[rd].empty() || !memcmp(rb[rd].data(), sb[rd].data(), sb[rd].size())) << "message " << rd << " corrupted";
          for (size_t j = sb[rd].size(); j < rb[rd].size(); ++j)
            if (rb[rd][j] != 0xEE) {
              ADD_FAILURE() << "byte past the message written, message " << rd;
              break;
            }
          memset(rb[rd].data(), 0xAA, rb[rd].size());  // NCCL reuses the buffer now
          ++rd;
          ++st.delivered;
        }
      }
    }
    for (int k = 0; k < rd; ++k)
      for (size_t j = 0; j < rb[k].size(); ++j)
        if (rb[k][j] != 0xAA) {
          ADD_FAILURE() << "a stale byte landed in message " << k << " after its receive completed";
          break;
        }
    return st;
  }
  static size_t mixed(int k) { return (size_t[]){0, 1, 100, 4096, 5000, 70000, 250000, 33}[k % 8]; }
  int activeNic() const { return send->active >= 0 ? send->paths[send->active].localNic : -1; }
};

TEST_F(Engine, HealthyDeliveryNeverTouchesTheStandby) {
  connectComm();
  ASSERT_EQ(send->paths.size(), 2u) << "a standby path on the other rail is opened at connect";
  Stats st = run(400, mixed, 8);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 400u);
  EXPECT_EQ(send->counters.failovers, 0u);
  EXPECT_EQ(w(1, kA1)->bytes, (uint64_t)wire::kFrameBytes * 2) << "standby carried only its HELLOs";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, ResetOfTheActivePathFailsOverWithoutLoss) {
  connectComm();
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 100) w(0, kA0)->broken = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess);
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_EQ(activeNic(), 1);
}

// TCP framing itself (frames split by partial writes): stays here only; engine_only_test.cc has the chunk-level PartialProgressKeepsOrder.
TEST_F(Engine, PartialWritesKeepFraming) {
  connectComm();
  w(0, kA0)->maxWrite = 7;
  Stats st = run(60, mixed, 4);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 60u);
  EXPECT_EQ(send->counters.failovers, 0u);
}

TEST_F(Engine, BlackHoleFailsOverOnceProgressStops) {
  connectComm();
  bool holed = false;
  Stats st = run(200, mixed, 8, [&](int k) {
    if (k == 80) {
      w(0, kA0)->drop = true;  // bytes vanish, writes still succeed
      holed = true;
    }
  }, 20000, [&] {
    // The probes notice the black hole (soft down: no carrier event).
    if (holed && gHl->pairs.size() && gHl->pairUp(send->paths[0].pairId))
      gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_GT(send->counters.bytesResent, 0u) << "messages swallowed by the black hole were resent";
}

TEST_F(Engine, DuplicateChunksOfCompletedMessagesAreDiscarded) {
  connectComm();
  // Stream 0 of the primary stalls, so small messages queued on stream 1 complete before the
  // large ones that have a chunk on stream 0. Then the path breaks and everything from the
  // oldest incomplete message is resent: the receiver gets chunks of messages it already
  // completed and must read and discard them.
  // Duplicate-safety rule checked: the stream (TCP) transport's "ask, then read and discard"
  // (RecvSink::place answers kDiscard; the receive buffer is never written twice).
  int phase = 0;
  Stats st = run(120, [](int k) { return (size_t)(k % 3 == 0 ? 30000 : 3000); }, 8, [&](int k) {
    if (k == 40) {
      dynamic_cast<FakeConn*>(dynamic_cast<StreamSendPath*>(send->paths[0].tx.get())->stream(0))->stalled = true;
      phase = 1;
    }
  }, 20000, [&] {
    if (phase >= 1 && ++phase == 300) w(0, kA0)->broken = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 120u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_GT(recv->counters.dupBytesDropped, 0u) << "the scenario must really produce duplicates";
}

// Rule checked: the engine's accounting is idempotent per chunk, whatever the transport. A
// transport that delivers a chunk twice (or overlapping chunks) without a RESUME in between
// (as one whose NIC writes memory directly may) never makes a message count bytes twice: it
// completes exactly when every distinct byte arrived, and bytes already held are discarded.
TEST_F(Engine, ChunkSeenTwiceNeverCountsTwice) {
  connectComm();
  std::vector<uint8_t> buf(3000, 0);
  void* d[1] = {buf.data()};
  uint64_t caps[1] = {buf.size()};
  int tags[1] = {0};
  void* q = nullptr;
  ASSERT_EQ(recv->irecv(1, d, caps, tags, &q), ncclSuccess);  // the comm's first message: seq 0
  ASSERT_NE(q, nullptr);
  auto* r = (RecvReq*)q;
  auto chunk = [](uint64_t off, uint64_t len) {
    ChunkRef c;
    c.seq = 0, c.offset = off, c.len = len, c.total = 3000;
    return c;
  };
  auto deliver = [&](uint64_t off, uint64_t len) {
    std::lock_guard<std::mutex> g(recv->mu);  // as a transport calls the sink: under the link's mutex
    uint8_t* dst = nullptr;
    std::string err;
    int how = recv->place(chunk(off, len), &dst, &err);
    EXPECT_GE(how, 0) << err;
    if (how == RecvSink::kWrite) {
      EXPECT_EQ(dst, buf.data() + off);
      memset(dst, 0x5a, len);
    }
    if (how != RecvSink::kHold) recv->arrived(chunk(off, len), how == RecvSink::kDiscard);
    return how;
  };
  uint64_t dupBefore = recv->counters.dupBytesDropped;
  EXPECT_EQ(deliver(1000, 1000), RecvSink::kWrite);
  EXPECT_EQ(deliver(1000, 1000), RecvSink::kDiscard) << "a chunk already held is dropped";
  EXPECT_EQ(deliver(1500, 500), RecvSink::kDiscard) << "part of a chunk already held is dropped";
  EXPECT_FALSE(r->done) << "2000 of 3000 distinct bytes are missing";
  EXPECT_EQ(deliver(0, 1500), RecvSink::kWrite) << "an overlapping chunk is written whole";
  EXPECT_FALSE(r->done) << "bytes 2000..3000 are still missing: the overlap counted once";
  EXPECT_EQ(deliver(2000, 1000), RecvSink::kWrite);
  EXPECT_TRUE(r->done);
  EXPECT_EQ(r->one.size, 3000u);
  EXPECT_EQ(recv->counters.dupBytesDropped - dupBefore, 1500u);
  EXPECT_EQ(deliver(2000, 1000), RecvSink::kDiscard) << "a chunk of a completed message";
  int done = 0, size = 0;
  EXPECT_EQ(recv->test(r, &done, &size), ncclSuccess);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(size, 3000);
  for (uint8_t b : buf) ASSERT_EQ(b, 0x5a);
}

TEST(RecvRanges, CountsEveryByteOnceAndAlwaysAdmitsTheLowestGap) {
  RecvRanges r;
  EXPECT_EQ(r.add(100, 200), 100u);
  EXPECT_EQ(r.add(100, 200), 0u) << "a duplicate adds nothing";
  EXPECT_EQ(r.add(150, 250), 50u) << "an overlap adds only its new bytes";
  EXPECT_TRUE(r.covers(120, 250));
  EXPECT_FALSE(r.covers(0, 120));
  // Fill up to kMax ranges with chunks that touch nothing: 0..0 (the start) plus 7 islands.
  for (uint64_t k = 1; k < (uint64_t)RecvRanges::kMax - 1; ++k) EXPECT_EQ(r.add(1000 * k + 500, 1000 * k + 600), 100u);
  EXPECT_EQ(r.n, RecvRanges::kMax);
  EXPECT_FALSE(r.admits(99000, 99100)) << "a ninth range would not fit: the chunk waits";
  EXPECT_TRUE(r.admits(0, 100)) << "the chunk at the start of the lowest gap always fits";
  EXPECT_TRUE(r.admits(250, 300)) << "a chunk touching a range always fits";
  EXPECT_EQ(r.add(0, 100), 100u);
  EXPECT_EQ(r.n, RecvRanges::kMax - 1) << "[0,100) joined [0,0) and [100,250)";
  r.inflight = 1;
  EXPECT_FALSE(r.admits(250, 300)) << "with a chunk still arriving, the count is conservative";
  r.reset();
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.covers(0, 1));
}

TEST_F(Engine, FailureDuringResumeAndOfTheStandbyRecovers) {
  // Both paths are down for a while here: give the reconnect back-off room before the fatal
  // timeout (slow sanitizer builds take longer per loop iteration).
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 10);
  connectComm();
  int step = 0;
  Stats st = run(150, mixed, 8, [&](int k) {
    if (k == 50) w(0, kA0)->broken = true, step = 1;
  }, 20000, [&] {
    // The moment the sender resumes on the standby, the standby breaks too.
    if (step == 1 && send->active >= 0 && send->paths[send->active].localNic == 1) {
      w(1, kA1)->broken = true;
      step = 2;
    } else if (step >= 2 && ++step > 22) {
      w(0, kA0)->broken = false;  // the primary comes back; it is reconnected after back-off
      step = -1;
    }
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess);
  EXPECT_EQ(st.delivered, 150u);
  EXPECT_GE(send->counters.failovers, 1u);
}

TEST_F(Engine, FailbackAfterHoldDown) {
  connectComm();
  w(0, kA0)->broken = true;
  Stats st = run(300, mixed, 8);  // fails over to the standby
  EXPECT_EQ(st.delivered, 300u);
  ASSERT_EQ(activeNic(), 1);
  w(0, kA0)->broken = false;  // repaired: the primary is reconnected and must stay healthy for the hold-down
  auto t0 = std::chrono::steady_clock::now();
  uint64_t total = 0;
  while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    st = run(200, mixed, 8);
    ASSERT_EQ(st.delivered, 200u);
    total += st.delivered;
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_EQ(send->counters.failbacks, 1u);
  EXPECT_EQ(activeNic(), 0) << "traffic moved back to the repaired primary";
  EXPECT_GE(ms, 50) << "not before the hold-down";
  st = run(300, mixed, 8);  // and keeps flowing there
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, FlapsGrowTheHoldDownThenItDecays) {
  // A hold-down long enough that a loaded machine's scheduling delays stay well inside it.
  Setting hold(Runtime::get().cfg.holdDownMs, 300), holdMax(Runtime::get().cfg.holdDownMaxMs, 5000);
  connectComm();
  int state = 0, cycles = 0;
  std::vector<uint32_t> grown;  // the primary's hold-down right after each failover
  auto driver = [&] {
    if (state == 0) {
      w(0, kA0)->broken = true;
      state = 1;
    } else if (state == 1 && activeNic() == 1) {
      grown.push_back(send->paths[0].holdDownMs);
      w(0, kA0)->broken = false;
      state = 2;
    } else if (state == 2 && activeNic() == 0 && send->counters.failbacks == (uint64_t)cycles + 1 &&
               send->paths[1].state == PathState::kStandby) {
      // Break the primary again only once the standby the failback closed is connected again:
      // this test is about the hold-down growing per flap. (A primary failing while that
      // standby still reconnects: PrimaryFailingWhileTheStandbyStillReconnects... below.)
      if (++cycles < 4) {
        w(0, kA0)->broken = true;
        state = 1;
      } else {
        state = 3;
      }
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  while (state != 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    Stats st = run(50, mixed, 8, nullptr, 20000, driver);
    ASSERT_EQ(st.delivered, 50u);
  }
  ASSERT_EQ(state, 3);
  EXPECT_EQ(send->paths[0].flaps, 3u) << "each failure right after a failback is a flap";
  // The first failure is not a flap; each of the next three doubles the 300 ms hold-down.
  EXPECT_EQ(grown, (std::vector<uint32_t>{300, 600, 1200, 2400}));
  EXPECT_GE(send->counters.failbacks, 4u);
  // Stable now: the hold-down shrinks back toward the configured value.
  t0 = std::chrono::steady_clock::now();
  uint32_t peak = send->paths[0].holdDownMs;
  while (send->paths[0].holdDownMs >= peak && peak > 300u &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  EXPECT_LT(send->paths[0].holdDownMs, peak) << "hold-down decays once stable";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, PrimaryFailingWhileTheStandbyStillReconnectsAfterAFailbackMovesOnceItIsUp) {
  // After a failback the old active path (the standby now) is closed and reconnects. If the
  // primary fails again before that reconnect completes, there is no usable path for a
  // moment: the comm must move to the standby as soon as it is connected, with nothing lost.
  // Three times in a row, so the primary's hold-down grows (flaps) as it would in the field;
  // this once stalled for a whole 20 s run instead.
  Setting hold(Runtime::get().cfg.holdDownMs, 100);
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 30);  // the bound below is the test, not the fatal timeout
  connectComm();
  int state = 0, cycles = 0;
  std::vector<PathState> standbyWhenBroken;
  std::vector<double> movedMs;
  std::chrono::steady_clock::time_point broke;
  auto driver = [&] {
    if (state == 0) {
      w(0, kA0)->broken = true;
      state = 1;
    } else if (state == 1 && activeNic() == 1) {
      w(0, kA0)->broken = false;
      state = 2;
    } else if (state == 2 && activeNic() == 0 && send->counters.failbacks == (uint64_t)cycles + 1) {
      // The failback just happened: break the primary before the standby is up again.
      standbyWhenBroken.push_back(send->paths[1].state);
      w(0, kA0)->broken = true;
      broke = std::chrono::steady_clock::now();
      state = 3;
    } else if (state == 3 && activeNic() == 1 && send->counters.failovers == (uint64_t)cycles + 2) {  // RESUME_ACK seen
      movedMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - broke).count());
      state = ++cycles < 3 ? 1 : 4;
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  while (state != 4 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    Stats st = run(50, mixed, 8, nullptr, 30000, driver);
    ASSERT_EQ(st.err, ncclSuccess);
    auto dump = [&] {
      std::string d;
      for (auto* l : {(Link*)send, (Link*)recv}) {
        d += l == send ? " send[active " : " recv[active ";
        d += std::to_string(l->active) + ":";
        for (auto& p : l->paths)
          d += std::string(" ") + pathStateName(p.state) + "/gen " + std::to_string(p.generation);
        d += "]";
      }
      return d;
    };
    ASSERT_FALSE(st.timedOut) << "stalled in state " << state << " (cycle " << cycles << ")" << dump();
    ASSERT_EQ(st.delivered, 50u);
  }
  ASSERT_EQ(state, 4);
  // The case under test needs the standby still reconnecting when the primary breaks; the
  // fake reconnects within a pump or two, so a cycle may miss it now and then (that cycle is
  // then a plain failover): at least one of the three must have hit it.
  int hit = 0;
  for (PathState s : standbyWhenBroken) hit += s != PathState::kStandby;
  EXPECT_GE(hit, 1) << "the primary never broke while the standby was still reconnecting";
  for (size_t i = 0; i < movedMs.size(); ++i) {
    // Generous on a loaded machine: the fake connects at once, so this is scheduling time.
    EXPECT_LT(movedMs[i], 5000) << "cycle " << i << ": moved to the standby " << movedMs[i] << " ms after the primary broke";
  }
  w(0, kA0)->broken = false;
}

TEST_F(Engine, ReceiverWithEveryReceiveCompleteStillAnswersTheResume) {
  // The receiver completes its last receive and NCCL stops calling it; the ACK it sent is lost
  // with the primary. The sender's send completes only when the receiver answers the RESUME on
  // the standby: the sweeper's idle pass must do that without any NCCL call on the receiver
  // (here the test's stand-in for the sweeper thread, sweepIdleLinks(), is all that drives it).
  connectComm();
  ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  std::vector<uint8_t> sb(70000), rb(70000, 0xEE);
  for (size_t j = 0; j < sb.size(); ++j) sb[j] = pattern(7, j);
  void *sr = nullptr, *rr = nullptr;
  ASSERT_EQ(api::isend(send, sb.data(), sb.size(), 0, nullptr, &sr), ncclSuccess);
  void* d = rb.data();
  size_t cap = rb.size();
  int tag = 0, done = 0, size = 0;
  ASSERT_EQ(api::irecv(recv, 1, &d, &cap, &tag, nullptr, &rr), ncclSuccess);
  ASSERT_TRUE(sr && rr);
  for (int i = 0; i < 100000 && !done; ++i) {
    gTr->pump();
    ASSERT_EQ(api::test(rr, &done, &size), ncclSuccess);
    if (!done) {
      int sd = 0;
      ASSERT_EQ(api::test(sr, &sd, &size), ncclSuccess);
      ASSERT_FALSE(sd) << "the send completed before its receive";
    }
  }
  ASSERT_TRUE(done);
  ASSERT_EQ(0, memcmp(rb.data(), sb.data(), sb.size()));
  // The ACK is on its way; the primary resets before the sender reads it.
  w(0, kA0)->broken = true;
  uint64_t before = send->counters.failovers, resentBefore = send->counters.bytesResent;
  done = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    ASSERT_EQ(api::test(sr, &done, &size), ncclSuccess);
    gTr->pump();
    sweepIdleLinks();
  }
  EXPECT_TRUE(done) << "the send never completed: the idle receiver did not answer the RESUME";
  EXPECT_EQ((size_t)size, sb.size());
  EXPECT_EQ(send->counters.failovers, before + 1);
  EXPECT_EQ(activeNic(), 1);
  EXPECT_EQ(send->counters.bytesResent, resentBefore)
      << "the receiver held the whole message: RESUME_ACK says so and nothing is resent";
  w(0, kA0)->broken = false;
}

TEST_F(Engine, DataAcknowledgedDuringAProbeBurstIsReportedToHealth) {
  // A full-size probe burst runs on the primary's pair (health suspects an MTU black hole).
  // Messages acknowledged over that pair prove the rail carries full-size data, whether or not
  // the comm stalled: each advance of the cumulative ACK is reported. No burst: no report.
  connectComm();
  int pair = send->paths[0].pairId;
  ASSERT_GE(pair, 0);
  gHl->dataAcked.clear();
  ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  EXPECT_TRUE(gHl->dataAcked.empty()) << "reported without a burst";
  gHl->burstOn[pair] = true;
  ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  gHl->burstOn[pair] = false;
  EXPECT_FALSE(gHl->dataAcked.empty()) << "acknowledged messages during the burst were not reported";
  for (int id : gHl->dataAcked) EXPECT_EQ(id, pair) << "reported on another pair than the one that carried the data";
  EXPECT_EQ(send->counters.failovers, 0u);
}

TEST_F(Engine, SoftDownWithDataStillFlowingIsNotAFailure) {
  connectComm();
  // Congestion analogue: probes to the primary are lost but data keeps moving.
  Stats st = run(2000, mixed, 8, [&](int k) {
    if (k == 10) gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  });
  EXPECT_EQ(st.delivered, 2000u);
  EXPECT_EQ(send->counters.failovers, 0u);
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, SlowPathWhoseKernelStillAcksIsNotStalled) {
  connectComm();
  // Every rail saturated: probes of the primary time out and its socket takes no new bytes
  // for far longer than RAILOVER_STALL_MS (5 ms here), but the peer's kernel keeps
  // acknowledging: slow, not dead. No failover. Then the same without acknowledgements is a
  // black hole and fails over (the control).
  int phase = 0;
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->peerAcks = true;
      w(0, kA0)->stalled = true;
      gHl->setPair(0, kA0, false, false, "probe timeout (test)");
      t0 = std::chrono::steady_clock::now();
      phase = 1;
    }
  }, 20000, [&] {
    if (phase == 1 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(200)) {
      w(0, kA0)->stalled = false;  // the congestion clears
      gHl->setPair(0, kA0, true, false, "");
      phase = 2;
    }
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(phase, 2);
  EXPECT_EQ(send->counters.failovers, 0u) << "a slow path whose peer still acknowledges stays active";
  EXPECT_EQ(activeNic(), 0);

  w(0, kA0)->peerAcks = false;
  st = run(300, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->stalled = true;
      gHl->setPair(0, kA0, false, false, "probe timeout (test)");
    }
  });
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(send->counters.failovers, 1u) << "control: nothing acknowledged is a dead path";
  w(0, kA0)->stalled = false;
}

TEST_F(Engine, ConnectAttemptStartedDuringTheOutageRestartsAtRepair) {
  Setting hold(Runtime::get().cfg.holdDownMs, 10);
  connectComm();
  // The primary fails; its reconnects are SYNs into the outage (never complete on their own
  // before the 3 s connect timeout).
  w(0, kA0)->broken = true;
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
  ASSERT_EQ(activeNic(), 1);
  gHl->setPair(0, kA0, false, false, "probe timeout: silent black hole (test)");
  w(0, kA0)->broken = false;
  w(0, kA0)->hangConnect = true;
  auto t0 = std::chrono::steady_clock::now();
  while (send->paths[0].state != PathState::kConnecting && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  ASSERT_EQ(send->paths[0].state, PathState::kConnecting);
  uint32_t gen = send->paths[0].generation;
  // Repair: new SYNs get through; the probes see the pair again.
  w(0, kA0)->hangConnect = false;
  gHl->setPair(0, kA0, true, false, "");
  t0 = std::chrono::steady_clock::now();
  while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(send->counters.failbacks, 1u);
  EXPECT_GT(send->paths[0].generation, gen) << "the stale attempt was abandoned for a new one";
  EXPECT_LT(ms, 2000) << "failback came from a fresh connect, not the stale attempt's 3 s timeout";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, EveryPairSilentIsAStoppedPeerNotANicFault) {
  connectComm();
  // SIGSTOP analogue: nothing answers on any pair, no hard signal: no path switch.
  Stats st = run(500, mixed, 8, [&](int k) {
    if (k == 100) {
      gHl->setPair(0, kA0, false, false, "probe timeout (test)");
      gHl->setPair(1, kA1, false, false, "probe timeout (test)");
    }
  });
  EXPECT_EQ(st.delivered, 500u);
  EXPECT_EQ(send->counters.failovers, 0u);
}

TEST_F(Engine, HardNicDownMovesAtOnce) {
  connectComm();
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 100) gHl->setNic(0, false);
  });
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_EQ(activeNic(), 1);
}

TEST_F(Engine, SweeperMovesACommNobodyCalls) {
  connectComm();
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
  // The NIC dies while NCCL is not calling this comm at all (e.g. its proxy is busy with
  // others): the sweeper alone fails it over on both ends.
  uint64_t before = send->counters.failovers;
  w(0, kA0)->broken = true;
  gHl->setNic(0, false);
  bool moved = false;
  for (int i = 0; i < 20000 && !moved; ++i) {
    sweepLinks();
    gTr->pump();
    moved = send->counters.failovers > before && recv->active >= 0 && recv->paths[recv->active].localNic == 1;
  }
  EXPECT_TRUE(moved) << "send failovers " << send->counters.failovers << ", recv active " << recv->active;
  EXPECT_EQ(activeNic(), 1);
  EXPECT_EQ(sweepLinks(), 0u) << "every link settled on a healthy path";
  // Traffic then flows on the standby with every byte in place.
  Stats st = run(200, mixed, 8);
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_EQ(send->counters.failovers, before + 1);
  w(0, kA0)->broken = false;
  gHl->setNic(0, true);
}

TEST_F(Engine, NoUsablePathIsAFatalErrorAfterTheTimeout) {
  connectComm();
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(100, mixed, 8, [&](int k) {
    if (k == 30) {
      w(0, kA0)->broken = true, w(0, kA0)->refuse = true;
      w(1, kA1)->broken = true, w(1, kA1)->refuse = true;
    }
  }, 15000);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(st.timedOut) << "never a silent hang";
  EXPECT_EQ(st.err, ncclSystemError);
  EXPECT_GE(ms, 1000) << "not before RAILOVER_FATAL_TIMEOUT";
  EXPECT_LT(ms, 6000);
  // Whichever side's pending call got it first, the message names the NICs and the peer.
  const std::string& msg = send->fatal ? send->fatalMsg : recv->fatalMsg;
  EXPECT_TRUE(send->fatal || recv->fatal);
  EXPECT_NE(msg.find("n0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10.0.0.1"), std::string::npos) << msg;
}

TEST_F(Engine, PeerProcessGoneOnEveryRailIsAnErrorAtOnce) {
  connectComm();
  // A killed peer process: every path is reset and the peer refuses new connections on every NIC. That is
  // a dead process, not a NIC fault: error at once, not after RAILOVER_FATAL_TIMEOUT. The
  // timeout is set far (30 s) so "at once" and "after the timeout" stay apart on a busy host,
  // and the time is measured from the fault, not from the start: the 30 messages before it
  // take longer than the whole bound on a loaded machine under ThreadSanitizer.
  Setting fatalTimeout(Runtime::get().cfg.fatalTimeoutS, 30);
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(100, mixed, 8, [&](int k) {
    if (k == 30) {
      t0 = std::chrono::steady_clock::now();
      w(0, kA0)->broken = true, w(0, kA0)->peerGone = true;
      w(1, kA1)->broken = true, w(1, kA1)->peerGone = true;
    }
  }, 15000);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.err, ncclSystemError);
  EXPECT_LT(ms, 10000) << "well before the 30 s fatal timeout (measured from the fault)";
  EXPECT_NE(send->fatalMsg.find("peer process exited"), std::string::npos) << send->fatalMsg;
}

TEST_F(Engine, ReconnectLostAfterTheRepairDoesNotWaitTheOutagesBackoff) {
  Setting cap(Runtime::get().cfg.backoffMaxMs, 60000);
  connectComm();
  w(0, kA0)->broken = true;
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
  ASSERT_EQ(activeNic(), 1);
  gHl->setPair(0, kA0, false, false, "probe timeout: silent black hole (test)");
  ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  // A long outage: the primary's reconnect back-off has grown to 30 s.
  send->paths[0].backoffMs = 30000;
  send->paths[0].nextAttemptUs = nowUs() + 30000000ULL;
  // Repair as a busy host sees it: the probes prove the pair first, but the SYN of the retry
  // started then is lost (the peer's side is not back yet) and times out after 3 s.
  w(0, kA0)->broken = false;
  w(0, kA0)->hangConnect = true;
  gHl->setPair(0, kA0, true, false, "");
  auto t0 = std::chrono::steady_clock::now();
  while (send->paths[0].state != PathState::kConnecting && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  ASSERT_EQ(send->paths[0].state, PathState::kConnecting) << "retried at the repair, not after the back-off";
  w(0, kA0)->hangConnect = false;  // the peer is back; only a new attempt can succeed
  while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(send->counters.failbacks, 1u);
  // 3 s connect timeout, then a fresh back-off (100 ms), not the outage's grown one (60 s).
  EXPECT_LT(ms, 8000) << "the failed retry waited the outage's back-off";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(Engine, HoldDownCountsFromThePairsRepairNotTheReconnect) {
  Setting hold(Runtime::get().cfg.holdDownMs, 300);
  connectComm();
  w(0, kA0)->broken = true;
  gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
  ASSERT_EQ(activeNic(), 1);
  // TCP gets through again (the path reconnects) while the probes still fail: not repaired.
  w(0, kA0)->broken = false;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(600))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  ASSERT_EQ(send->paths[0].state, PathState::kStandby);
  EXPECT_EQ(send->counters.failbacks, 0u) << "no failback while the pair is down";
  gHl->setPair(0, kA0, true, false, "");  // the probes prove the repair now
  auto t1 = std::chrono::steady_clock::now();
  while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5))
    ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_EQ(send->counters.failbacks, 1u);
  EXPECT_GE(ms, 300) << "failed back before the hold-down that starts at the repair";
}

TEST_F(Engine, NoFullSizeBurstWhileTheKernelStillAcks) {
  connectComm();
  ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  gHl->bursts.clear();
  // A saturated path: the socket takes nothing for 100 ms (20 x RAILOVER_STALL_MS) but the
  // peer's TCP keeps acknowledging. Lost full-size probes there would be congestion: no burst.
  int phase = 0;
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(200, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->peerAcks = true;
      w(0, kA0)->stalled = true;
      t0 = std::chrono::steady_clock::now();
      phase = 1;
    }
  }, 20000, [&] {
    if (phase == 1 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(100)) {
      w(0, kA0)->stalled = false;
      phase = 2;
    }
  });
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_TRUE(gHl->bursts.empty()) << gHl->bursts.size() << " bursts on a path whose peer acknowledges";
  // Control: the same stall without acknowledgements asks for a burst (the stall lasts until
  // it does, at most 3 s: a descheduled caller restarts the stall clock on a busy host).
  w(0, kA0)->peerAcks = false;
  phase = 0;
  st = run(200, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->stalled = true;
      t0 = std::chrono::steady_clock::now();
      phase = 1;
    }
  }, 20000, [&] {
    if (phase == 1 && (!gHl->bursts.empty() || std::chrono::steady_clock::now() - t0 > std::chrono::seconds(3))) {
      w(0, kA0)->stalled = false;
      phase = 2;
    }
  });
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_FALSE(gHl->bursts.empty()) << "control: a stall with nothing acknowledged asks for full-size probes";
}

}  // namespace

namespace {

// RAILOVER_ABORT_ON_FATAL=1: the fatal error ends the process with one stderr line naming the
// path and the cause (status 70) instead of returning ncclSystemError (the =0 behaviour is
// NoUsablePathIsAFatalErrorAfterTheTimeout above).
TEST_F(Engine, AbortOnFatalExitsTheProcessWithOneLine) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  connectComm();
  EXPECT_EXIT(
      {
        Runtime::get().cfg.abortOnFatal = true;
        Stats st = run(100, mixed, 8, [&](int k) {
          if (k == 30) {
            w(0, kA0)->broken = true, w(0, kA0)->refuse = true;
            w(1, kA1)->broken = true, w(1, kA1)->refuse = true;
          }
        }, 15000);
        fprintf(stderr, "the call returned %d instead of exiting\n", (int)st.err);
        exit(0);
      },
      ::testing::ExitedWithCode(kAbortOnFatalExitCode),
      "railover: RAILOVER_ABORT_ON_FATAL=1: exiting on a fatal error: no usable path (to|from) peer 10\\.0\\.[01]\\.1 "
      "(from|on) NIC\\(s\\) n0[^\n]*n1[^\n]*(No route to host|reset)");
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Connect / accept / close contract

namespace {

std::vector<std::string>& capturedWarns() {
  static std::vector<std::string> v;
  return v;
}
void captureLogger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != RO_LOG_WARN) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  capturedWarns().push_back(buf);
}
struct CaptureWarns {
  CaptureWarns() {
    capturedWarns().clear();
    setLogger(&captureLogger);
  }
  ~CaptureWarns() { setLogger(nullptr); }
};

// NCCL's transports return the send comm no later than the receiver's accept returns. Here
// the primary NIC's connect hangs (its SYN is lost) and the standby path connects: the
// receiver accepts on the standby, and connect must have returned by then (it used to wait
// up to a second for the primary, or for ever while no path could be activated).
TEST_F(Engine, ConnectReturnsNoLaterThanAccept) {
  w(0, kA0)->hangConnect = true;
  uint8_t handle[128] = {};
  void* lc = nullptr;
  ASSERT_EQ(api::listen(0, handle, &lc), ncclSuccess);
  void *s = nullptr, *r = nullptr;
  for (int i = 0; i < 100000 && !r; ++i) {
    if (!s) ASSERT_EQ(api::connect(0, handle, &s), ncclSuccess);
    gTr->pump();
    ASSERT_EQ(api::accept(lc, &r), ncclSuccess);
    if (r) EXPECT_NE(s, nullptr) << "accept returned (iteration " << i << ") but connect has not";
  }
  ASSERT_NE(r, nullptr);
  if (!s) ASSERT_EQ(api::connect(0, handle, &s), ncclSuccess);
  api::closeListen(lc);
  send = (SendLink*)s;
  recv = (RecvLink*)r;
  ASSERT_NE(send, nullptr);
  // Data posted before any path is active waits for one, then flows (on the standby here).
  Stats st = run(50, mixed, 8);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess);
  EXPECT_EQ(st.delivered, 50u);
  EXPECT_EQ(activeNic(), 1);
}

// The receiver aborts (closeListen before its accept returned) while the sender's connect is
// still in progress (one stream of the primary connected, the rest hang): the sender's next
// connect fails at once with the cause, instead of returning NULL until RAILOVER_FATAL_TIMEOUT
// and then failing with an empty cause.
// Stream-transport only (one stream of a path connected, the others hanging): a chunk-level path connects whole, so it stays here only.
TEST_F(Engine, ReceiverClosedBeforeConnectCompletedIsAConnectErrorWithTheCause) {
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 60);
  w(0, kA0)->hangFrom = 1;  // stream 0 of the primary connects, stream 1 never does
  w(1, kA1)->hangConnect = true;
  uint8_t handle[128] = {};
  void* lc = nullptr;
  ASSERT_EQ(api::listen(0, handle, &lc), ncclSuccess);
  void *s = nullptr, *r = nullptr;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(api::connect(0, handle, &s), ncclSuccess);
    ASSERT_EQ(s, nullptr) << "no path has all its streams";
    gTr->pump();
    ASSERT_EQ(api::accept(lc, &r), ncclSuccess);
    ASSERT_EQ(r, nullptr);
  }
  ASSERT_EQ(api::closeListen(lc), ncclSuccess);  // the receiving rank aborts
  CaptureWarns cap;
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 1000 && res == ncclSuccess; ++i) {
    res = api::connect(0, handle, &s);
    ASSERT_EQ(s, nullptr);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(res, ncclSystemError);
  EXPECT_LT(ms, 1000) << "at once, not after RAILOVER_FATAL_TIMEOUT";
  std::string all;
  for (auto& m : capturedWarns()) all += m + "\n";
  EXPECT_NE(all.find("receiver closed the comm"), std::string::npos) << all;
  EXPECT_NE(all.find("connect to peer 10.0.0.1"), std::string::npos) << all;
}

// The receiver accepts and then closes while sends are pending: the sender's pending request
// fails promptly, naming the cause; the sender neither reconnects nor journals a fault.
TEST_F(Engine, ReceiverClosingWithSendsPendingFailsThemPromptlyWithoutFaults) {
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 60);
  connectComm();
  ASSERT_EQ(run(20, mixed, 4).delivered, 20u);
  size_t mark = journalSize();
  std::vector<uint8_t> buf(70000, 7);
  void* q = nullptr;
  ASSERT_EQ(api::isend(send, buf.data(), buf.size(), 0, nullptr, &q), ncclSuccess);
  ASSERT_NE(q, nullptr);
  std::vector<uint32_t> gens;
  for (auto& p : send->paths) gens.push_back(p.generation);
  ASSERT_EQ(api::closeRecv(recv), ncclSuccess);  // nothing was received: data is in flight
  recv = nullptr;
  CaptureWarns cap;
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t res = ncclSuccess;
  int done = 0, size = 0;
  while (res == ncclSuccess && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    gTr->pump();
    res = api::test(q, &done, &size);
    ASSERT_FALSE(done);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(res, ncclSystemError);
  EXPECT_LT(ms, 1000);
  ASSERT_FALSE(capturedWarns().empty());
  EXPECT_NE(capturedWarns().back().find("closed the comm"), std::string::npos) << capturedWarns().back();
  for (size_t i = 0; i < send->paths.size(); ++i) {
    EXPECT_EQ(send->paths[i].generation, gens[i]) << "no reconnect attempt";
    EXPECT_EQ(send->paths[i].state, PathState::kClosed);
  }
  EXPECT_TRUE(journalEvents(mark, {"path_down", "flap", "failover"}).empty());
}

// The receiver completes a message (its ACK is on the wire) and closes: the sender may read
// the CLOSE on the standby rail before the ACK on the active one. The send completed and must
// be reported done, not failed as "closed with messages not acknowledged".
TEST_F(Engine, AckSentBeforeTheCloseStillCompletesTheSend) {
  connectComm();
  ASSERT_EQ(run(20, mixed, 4).delivered, 20u);
  std::vector<uint8_t> sb(5000, 9), rb(5000);
  void* sq = nullptr;
  ASSERT_EQ(api::isend(send, sb.data(), sb.size(), 0, nullptr, &sq), ncclSuccess);
  void* d = rb.data();
  size_t cap = rb.size();
  int tag = 0, done = 0, size = 0;
  void* rq = nullptr;
  ASSERT_EQ(api::irecv(recv, 1, &d, &cap, &tag, nullptr, &rq), ncclSuccess);
  for (int i = 0; i < 100000 && !done; ++i) ASSERT_EQ(api::test(rq, &done, &size), ncclSuccess);
  ASSERT_TRUE(done);
  ASSERT_EQ(rb, sb);
  api::closeRecv(recv);
  recv = nullptr;
  // The sender's next call starts with its slow tick, which reads the standby path (and its
  // CLOSE) before the active path's control stream.
  auto t0 = std::chrono::steady_clock::now();
  while (nowUs() - send->lastSlowTickUs < 2000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
  }
  done = 0;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 1000 && !done && res == ncclSuccess; ++i) res = api::test(sq, &done, &size);
  EXPECT_EQ(res, ncclSuccess) << send->fatalMsg;
  EXPECT_TRUE(done);
  EXPECT_TRUE(send->peerClosed);
}

// Orderly close in every order, with data in flight and with the receiver's ACK stuck in its
// socket: no path_down, flap or failover in the journal, no reconnect, on either side.
TEST_F(Engine, OrderlyCloseInAnyOrderIsNeverAFault) {
  for (int order = 0; order < 3; ++order) {
    SCOPED_TRACE("order " + std::to_string(order));
    connectComm();
    ASSERT_EQ(run(30, mixed, 8).delivered, 30u);
    size_t mark = journalSize();
    // In flight: 3 sends, a receive posted for the first only, its ACK unable to leave.
    std::vector<uint8_t> sb(3000, 1), rb(3000);
    void* sq[3];
    for (auto& q : sq) ASSERT_EQ(api::isend(send, sb.data(), sb.size(), 0, nullptr, &q), ncclSuccess);
    void* d = rb.data();
    size_t cap = rb.size();
    int tag = 0;
    void* rq = nullptr;
    if (order == 2) dynamic_cast<FakeConn*>(dynamic_cast<StreamRecvPath*>(recv->paths[recv->active].rx.get())->stream(0))->stalled = true;
    ASSERT_EQ(api::irecv(recv, 1, &d, &cap, &tag, nullptr, &rq), ncclSuccess);
    for (int i = 0; i < 50; ++i) {
      int done = 0, size = 0;
      api::test(rq, &done, &size);
      api::test(sq[0], &done, &size);
    }
    std::vector<uint32_t> gens;
    for (auto& p : send->paths) gens.push_back(p.generation);
    if (order == 0) {  // sender first; the receiver keeps being driven for a while
      api::closeSend(send);
      send = nullptr;
      for (int i = 0; i < 2000; ++i) sweepLinks(), api::irecv(recv, 1, &d, &cap, &tag, nullptr, &rq);
      EXPECT_TRUE(recv->peerClosed) << "the receiver saw the CLOSE";
      api::closeRecv(recv);
      recv = nullptr;
    } else {  // receiver first; the sender keeps being driven for a while
      api::closeRecv(recv);
      recv = nullptr;
      auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300)) {
        gTr->pump();
        sweepLinks();
        void* q = nullptr;
        api::isend(send, sb.data(), 0, 0, nullptr, &q);
      }
      EXPECT_TRUE(send->peerClosed) << "the sender saw the CLOSE";
      for (size_t i = 0; i < send->paths.size(); ++i) {
        EXPECT_EQ(send->paths[i].generation, gens[i]) << "no reconnect attempt";
        EXPECT_EQ(send->paths[i].state, PathState::kClosed);
      }
      api::closeSend(send);
      send = nullptr;
    }
    auto bad = journalEvents(mark, {"path_down", "flap", "failover", "fatal"});
    EXPECT_TRUE(bad.empty()) << bad.size() << " fault event(s), first: " << (bad.empty() ? "" : bad[0]);
    for (auto& wr : gTr->wires) *wr.second = Wire();
  }
}

// Negative control for the peer-gone verdict: the sender's kernel gives up on every stream of
// both paths at once (as aggressive settings under congestion can make it: the sender fences
// both paths), so the receiver sees every rail closed by the sender. The sender process is
// alive and reconnects: the receiver must not call it gone.
TEST_F(Engine, EveryRailClosedByALiveSenderIsNotPeerGone) {
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 30);
  connectComm();
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 100)
      for (auto& p : send->paths)
        if (auto* tx = dynamic_cast<StreamSendPath*>(p.tx.get()))
          for (size_t i = 0; i < tx->streams(); ++i)
            if (tx->stream(i)) dynamic_cast<FakeConn*>(tx->stream(i))->timedOut = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess) << (recv->fatal ? recv->fatalMsg : send->fatalMsg);
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_FALSE(recv->fatal) << recv->fatalMsg;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Grouped receives (irecv of n buffers, maxRecvs = 8)

namespace {

class Grouped : public Engine {
 protected:
  // `groups` grouped receives of `n` buffers each. The k-th isend carries tag 100 + (p + j) % n
  // (j = k / n its group, p = k % n its place in it: each group's sends come in a different
  // tag order); the receiver posts group j's buffers with tags 100 + n - 1 - i (reversed). So
  // buffer i of group j must receive message j*n + ((n - 1 - i - j) mod n), whole and in place.
  Stats runGrouped(int groups, int n, std::function<void(int)> onGroup = nullptr, std::function<void()> each = nullptr) {
    const int total = groups * n;
    auto sizeOf = [](int k) { return mixed(k * 7 + 3); };
    std::vector<std::vector<uint8_t>> sb(total), rb(total);
    for (int k = 0; k < total; ++k) {
      sb[k].resize(sizeOf(k));
      for (size_t j = 0; j < sb[k].size(); ++j) sb[k][j] = pattern(k, j);
      rb[k].assign(sb[k].size() + 64, 0xEE);  // rb[k]: the buffer message k must land in
    }
    auto msgFor = [&](int j, int i) { return j * n + (((n - 1 - i - j) % n) + n) % n; };
    std::vector<void*> sr(total), rr(groups);
    int sp = 0, rp = 0, sd = 0, rd = 0;
    Stats st;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((sd < total || rd < groups) && st.err == ncclSuccess) {
      if (std::chrono::steady_clock::now() > end) {
        st.timedOut = true;
        break;
      }
      if (each) each();
      gTr->pump();
      while (sp < total && sp - sd < 8 * n) {
        int j = sp / n, p = sp % n;
        void* q = nullptr;
        st.err = api::isend(send, sb[sp].data(), sb[sp].size(), 100 + (p + j) % n, nullptr, &q);
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
        void* q = (void*)0x1;
        st.err = api::irecv(recv, n, d, caps, tags, nullptr, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, sizes[kMaxRecvs];
      if (sd < sp && st.err == ncclSuccess) {
        st.err = api::test(sr[sd], &done, sizes);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        for (int i = 0; i < n; ++i) sizes[i] = -1;
        st.err = api::test(rr[rd], &done, sizes);
        if (done) {
          for (int i = 0; i < n; ++i) {
            int k = msgFor(rd, i);
            EXPECT_EQ((size_t)sizes[i], sb[k].size()) << "group " << rd << " buffer " << i;
            EXPECT_TRUE(sb[k].empty() || !memcmp(rb[k].data(), sb[k].data(), sb[k].size()))
                << "group " << rd << " buffer " << i << " does not hold message " << k;
            for (size_t b = sb[k].size(); b < rb[k].size(); ++b)
              if (rb[k][b] != 0xEE) {
                ADD_FAILURE() << "byte past message " << k << " written";
                break;
              }
            memset(rb[k].data(), 0xAA, rb[k].size());  // NCCL reuses the buffer now
          }
          ++rd;
          st.delivered += n;
        }
      }
    }
    for (int j = 0; j < rd; ++j)
      for (int i = 0; i < n; ++i)
        for (uint8_t b : rb[msgFor(j, i)])
          if (b != 0xAA) {
            ADD_FAILURE() << "a stale byte landed in group " << j << " buffer " << i << " after it completed";
            break;
          }
    return st;
  }
};

TEST_F(Grouped, TagsPickTheBufferInsideEachGroupExactlyOnceInOrder) {
  connectComm();
  for (int n : {2, 3, 8}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Stats st = runGrouped(60, n);
    EXPECT_FALSE(st.timedOut);
    EXPECT_EQ(st.err, ncclSuccess);
    EXPECT_EQ(st.delivered, 60u * n);
  }
  // Single receives still work on the same comm between groups.
  EXPECT_EQ(run(50, mixed, 8).delivered, 50u);
}

TEST_F(Grouped, SurviveFailoverAndResume) {
  connectComm();
  Stats st = runGrouped(80, 4, [&](int j) {
    if (j == 30) w(0, kA0)->broken = true;  // the active path resets mid-run
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess);
  EXPECT_EQ(st.delivered, 320u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_EQ(activeNic(), 1);
}

TEST_F(Grouped, DuplicatesAfterResumeAreDiscarded) {
  connectComm();
  // As DuplicateChunksOfCompletedMessagesAreDiscarded, with groups: one stream stalls, the
  // path then breaks, and chunks of completed messages come again after the RESUME.
  // Duplicate-safety rule checked: the stream (TCP) transport's "ask, then read and discard".
  int phase = 0;
  Stats st = runGrouped(60, 4, [&](int j) {
    if (j == 15) {
      dynamic_cast<FakeConn*>(dynamic_cast<StreamSendPath*>(send->paths[0].tx.get())->stream(0))->stalled = true;
      phase = 1;
    }
  }, [&] {
    if (phase >= 1 && ++phase == 300) w(0, kA0)->broken = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 240u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_GT(recv->counters.dupBytesDropped, 0u) << "the scenario must really produce duplicates";
}

TEST_F(Grouped, CallerMisuseIsAnInternalError) {
  connectComm();
  std::vector<uint8_t> a(100), b(100), sbuf(100, 1);
  void* d[9] = {a.data(), b.data()};
  size_t caps[9] = {100, 100};
  int tags[9] = {1, 2};
  void* q = nullptr;
  EXPECT_EQ(api::irecv(recv, kMaxRecvs + 1, d, caps, tags, nullptr, &q), ncclInternalError) << "n > maxRecvs";
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(api::irecv(recv, 0, d, caps, tags, nullptr, &q), ncclInternalError);
  // A send whose tag matches no buffer of the group it falls into.
  ASSERT_EQ(api::irecv(recv, 2, d, caps, tags, nullptr, &q), ncclSuccess);
  ASSERT_NE(q, nullptr);
  void *s1 = nullptr, *s2 = nullptr;
  ASSERT_EQ(api::isend(send, sbuf.data(), 100, 1, nullptr, &s1), ncclSuccess);
  ASSERT_EQ(api::isend(send, sbuf.data(), 100, 7, nullptr, &s2), ncclSuccess);
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 10000 && res == ncclSuccess; ++i) {
    int done = 0, sizes[2];
    res = api::test(q, &done, sizes);
    ASSERT_FALSE(done);
  }
  EXPECT_EQ(res, ncclInternalError);
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; })) << "nothing lands on a mismatch";
}

}  // namespace
