// The failover engine over the chunk-level fake transport (fake_paths.h), in a binary that
// links the engine without anything from transport/tcp/ (CMake target
// railover_engine_only_tests): it proves the engine needs nothing from TCP, and checks the
// engine's delivery rules against a transport that has no framing at all.
//
// The comm is set up as the plugin API does it (a Listener, SendLink::create from the
// receiver's addresses, connectStep until the receiver's accept), without the API itself,
// whose handle is TCP's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "common/config.h"
#include "common/log.h"
#include "failover/link.h"
#include "plugin/runtime.h"
#include "tests/engine_only/fake_paths.h"
#include "telemetry/journal.h"
#include "tests/scripted_health.h"

using namespace railover;

namespace {

chunkfake::PathTransport* gTr = nullptr;
fake::ScriptedHealth* gHl = nullptr;
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

void quiet(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

uint8_t pattern(uint64_t msg, uint64_t off) { return (uint8_t)(msg * 2654435761u + off * 40503u + (off >> 9)); }

class EngineOnly : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setLogger(quiet);
    gTr = new chunkfake::PathTransport();
    gTr->nicAddr = {kA0, kA1};
    gHl = new fake::ScriptedHealth();
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
    journalPath() = ::testing::TempDir() + "railover-engine-only-journal-" + std::to_string(getpid()) + ".jsonl";
    journalOpen(journalPath());
  }
  static std::string& journalPath() {
    static std::string p;
    return p;
  }
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
  void SetUp() override {
    for (auto& w : gTr->wires) *w.second = chunkfake::Wire();
    for (auto& p : gHl->pairs) p.up = true, p.hard = false;
    gHl->nics.assign(8, true);
  }
  void TearDown() override {
    if (send) send->close(), delete send;
    if (recv) recv->close(), delete recv;
  }

  SendLink* send = nullptr;
  RecvLink* recv = nullptr;

  void connectComm() {
    static uint64_t secret = 0x5ec2e70000000000ULL;
    ++secret;
    Listener* L = new Listener(Runtime::get().linkDeps(), secret, 0);
    PeerHandle h;
    h.secret = secret;
    h.primary = 0;
    h.naddr = 2;
    for (int i = 0; i < 2; ++i) {
      h.addrs[i].rail = i;
      auto* s = (sockaddr_in*)&h.addrs[i].addr;
      s->sin_family = AF_INET;
      s->sin_port = htons((uint16_t)(1000 + i));
      inet_pton(AF_INET, i ? kA1 : kA0, &s->sin_addr);
      h.addrs[i].len = sizeof(sockaddr_in);
    }
    std::string err;
    SendLink* s = SendLink::create(Runtime::get().linkDeps(), 0, h, &err);
    ASSERT_NE(s, nullptr) << err;
    bool connected = false;
    for (int i = 0; i < 100000 && !(connected && recv); ++i) {
      std::string why;
      if (!connected) {
        int st = s->connectStep(&why);
        ASSERT_GE(st, 0) << why;
        connected = st > 0;
      }
      gTr->pump();
      if (!recv) recv = L->accept();
    }
    L->close();
    delete L;
    send = s;
    ASSERT_TRUE(connected && recv);
  }

  std::shared_ptr<chunkfake::Wire> w(int nic, const char* remote) { return gTr->wire(nic, remote); }
  int activeNic() const { return send->active >= 0 ? send->paths[send->active].localNic : -1; }

  struct Stats {
    uint64_t delivered = 0;
    bool timedOut = false;
    ncclResult_t err = ncclSuccess;
  };
  // As the engine tests over byte streams: n messages, up to `window` in flight, every byte
  // checked, nothing written past a message or after its receive completed.
  Stats run(int n, std::function<size_t(int)> sizeOf, int window, std::function<void(int)> onMsg = nullptr,
            std::function<void()> each = nullptr, int timeoutMs = 20000) {
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
        st.err = send->isend(sb[sp].data(), sb[sp].size(), 0, &q);
        if (!q || st.err) break;
        sr[sp++] = q;
      }
      while (rp < n && rp - rd < window && st.err == ncclSuccess) {
        void* q = nullptr;
        void* d = rb[rp].data();
        uint64_t cap = rb[rp].size();
        int tag = 0;
        st.err = recv->irecv(1, &d, &cap, &tag, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, size = 0;
      if (sd < sp && st.err == ncclSuccess) {
        st.err = send->test((SendReq*)sr[sd], &done, &size);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        st.err = recv->test((RecvReq*)rr[rd], &done, &size);
        if (done) {
          EXPECT_EQ((size_t)size, sb[rd].size()) << "message " << rd;
          EXPECT_TRUE(sb[rd].empty() || !memcmp(rb[rd].data(), sb[rd].data(), sb[rd].size())) << "message " << rd << " corrupted";
          for (size_t j = sb[rd].size(); j < rb[rd].size(); ++j)
            if (rb[rd][j] != 0xEE) {
              ADD_FAILURE() << "byte past the message written, message " << rd;
              break;
            }
          memset(rb[rd].data(), 0xAA, rb[rd].size());
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
};

TEST_F(EngineOnly, HealthyDeliveryNeverTouchesTheStandby) {
  connectComm();
  ASSERT_EQ(send->paths.size(), 2u) << "a standby path on the other rail is opened at connect";
  Stats st = run(400, mixed, 8);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 400u);
  EXPECT_EQ(send->counters.failovers, 0u);
  EXPECT_EQ(w(1, kA1)->bytes, 0u) << "the standby carried no chunk";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(EngineOnly, ResetOfTheActivePathFailsOverWithoutLoss) {
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

// The chunk-level counterpart of "partial writes keep framing": one chunk per progress call.
TEST_F(EngineOnly, PartialProgressKeepsOrder) {
  connectComm();
  w(0, kA0)->maxChunks = 1;
  Stats st = run(60, mixed, 4);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 60u);
  EXPECT_EQ(send->counters.failovers, 0u);
}

TEST_F(EngineOnly, BlackHoleFailsOverOnceProgressStops) {
  connectComm();
  bool holed = false;
  Stats st = run(200, mixed, 8, [&](int k) {
    if (k == 80) {
      w(0, kA0)->drop = true;  // chunks vanish, posting still succeeds
      holed = true;
    }
  }, [&] {
    if (holed && gHl->pairs.size() && gHl->pairUp(send->paths[0].pairId))
      gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_GT(send->counters.bytesResent, 0u) << "messages swallowed by the black hole were resent";
}

// Rule checked: the engine's idempotent accounting with a transport that does not read
// first: the fake hands every resent chunk to the sink, which discards chunks of completed
// messages (no byte of them is written again: run() checks the completed buffers stay as the
// test left them).
TEST_F(EngineOnly, DuplicateChunksOfCompletedMessagesAreDiscarded) {
  connectComm();
  int phase = 0;
  Stats st = run(120, [](int k) { return (size_t)(k % 3 == 0 ? 30000 : 3000); }, 8, [&](int k) {
    if (k == 40) {
      auto* tx = dynamic_cast<chunkfake::FakeSendPath*>(send->paths[0].tx.get());
      ASSERT_NE(tx, nullptr);
      tx->channel().laneStalled[0] = true;  // lane 0 of the primary stops: later small messages complete first
      phase = 1;
    }
  }, [&] {
    if (phase >= 1 && ++phase == 300) w(0, kA0)->broken = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.delivered, 120u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_GT(recv->counters.dupBytesDropped, 0u) << "the scenario must really produce duplicates";
}

TEST_F(EngineOnly, FailbackAfterHoldDown) {
  connectComm();
  w(0, kA0)->broken = true;
  Stats st = run(300, mixed, 8);  // fails over to the standby
  EXPECT_EQ(st.delivered, 300u);
  ASSERT_EQ(activeNic(), 1);
  w(0, kA0)->broken = false;  // repaired: the primary is reconnected and must stay healthy for the hold-down
  auto t0 = std::chrono::steady_clock::now();
  while (send->counters.failbacks == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    st = run(200, mixed, 8);
    ASSERT_EQ(st.delivered, 200u);
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

TEST_F(EngineOnly, HardNicDownMovesAtOnce) {
  connectComm();
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 100) gHl->setNic(0, false);
  });
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_EQ(send->counters.failovers, 1u);
  EXPECT_EQ(activeNic(), 1);
  gHl->setNic(0, true);
}

TEST_F(EngineOnly, SweeperMovesACommNobodyCalls) {
  connectComm();
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
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
  Stats st = run(200, mixed, 8);
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_EQ(send->counters.failovers, before + 1);
  w(0, kA0)->broken = false;
  gHl->setNic(0, true);
}

TEST_F(EngineOnly, NoUsablePathIsAFatalErrorAfterTheTimeout) {
  connectComm();
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(100, mixed, 8, [&](int k) {
    if (k == 30) {
      w(0, kA0)->broken = true, w(0, kA0)->refuse = true;
      w(1, kA1)->broken = true, w(1, kA1)->refuse = true;
    }
  });
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(st.timedOut) << "never a silent hang";
  EXPECT_EQ(st.err, ncclSystemError);
  EXPECT_GE(ms, 1000) << "not before RAILOVER_FATAL_TIMEOUT";
  const std::string& msg = send->fatal ? send->fatalMsg : recv->fatalMsg;
  EXPECT_TRUE(send->fatal || recv->fatal);
  EXPECT_NE(msg.find("n0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n1"), std::string::npos) << msg;
}

TEST_F(EngineOnly, PeerProcessGoneOnEveryRailIsAnErrorAtOnce) {
  connectComm();
  uint32_t saved = Runtime::get().cfg.fatalTimeoutS;
  Runtime::get().cfg.fatalTimeoutS = 30;  // far, so "at once" and "after the timeout" stay apart
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(100, mixed, 8, [&](int k) {
    if (k == 30) {
      t0 = std::chrono::steady_clock::now();
      w(0, kA0)->broken = true, w(0, kA0)->peerGone = true;
      w(1, kA1)->broken = true, w(1, kA1)->peerGone = true;
    }
  });
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  Runtime::get().cfg.fatalTimeoutS = saved;
  EXPECT_EQ(st.err, ncclSystemError);
  EXPECT_LT(ms, 10000) << "well before the 30 s fatal timeout (measured from the fault)";
  EXPECT_NE(send->fatalMsg.find("peer process exited"), std::string::npos) << send->fatalMsg;
}

// The receiver closes with a send in flight: its CLOSE (a control message, sent on every path)
// fails the pending send promptly, with no path reported down and no reconnect.
TEST_F(EngineOnly, ReceiverClosingWithSendsPendingFailsThemPromptlyWithoutFaults) {
  uint32_t saved = Runtime::get().cfg.fatalTimeoutS;
  Runtime::get().cfg.fatalTimeoutS = 60;
  connectComm();
  ASSERT_EQ(run(20, mixed, 4).delivered, 20u);
  std::vector<uint8_t> buf(70000, 7);
  void* q = nullptr;
  ASSERT_EQ(send->isend(buf.data(), buf.size(), 0, &q), ncclSuccess);
  ASSERT_NE(q, nullptr);
  std::vector<uint32_t> gens;
  for (auto& p : send->paths) gens.push_back(p.generation);
  uint64_t failoversBefore = send->counters.failovers;
  recv->close();
  delete recv;
  recv = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t res = ncclSuccess;
  int done = 0, size = 0;
  while (res == ncclSuccess && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    gTr->pump();
    res = send->test((SendReq*)q, &done, &size);
    ASSERT_FALSE(done);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  Runtime::get().cfg.fatalTimeoutS = saved;
  EXPECT_EQ(res, ncclSystemError);
  EXPECT_LT(ms, 1000);
  EXPECT_NE(send->fatalMsg.find("closed the comm"), std::string::npos) << send->fatalMsg;
  for (size_t i = 0; i < send->paths.size(); ++i) {
    EXPECT_EQ(send->paths[i].generation, gens[i]) << "no reconnect attempt";
    EXPECT_EQ(send->paths[i].state, PathState::kClosed);
  }
  EXPECT_EQ(send->counters.failovers, failoversBefore) << "a close is not a fault";
}

TEST_F(EngineOnly, SoftDownWithDataStillFlowingIsNotAFailure) {
  connectComm();
  // Congestion analogue: probes to the primary are lost but data keeps moving.
  Stats st = run(2000, mixed, 8, [&](int k) {
    if (k == 10) gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  });
  EXPECT_EQ(st.delivered, 2000u);
  EXPECT_EQ(send->counters.failovers, 0u);
  EXPECT_EQ(activeNic(), 0);
}

// The transport's progress signal (SendPath::peerAckedWithinMs), not TCP_INFO: the engine's
// "slow, not stalled" judgement works from whatever the transport reports.
TEST_F(EngineOnly, SlowPathWhoseTransportStillAcksIsNotStalled) {
  connectComm();
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
  }, [&] {
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


// Rule checked: the engine's accounting is idempotent per chunk, whatever the transport. A
// transport that delivers a chunk twice (or overlapping chunks) without a RESUME in between
// never makes a message count bytes twice: it completes exactly when every distinct byte
// arrived, and bytes already held are discarded.
TEST_F(EngineOnly, ChunkSeenTwiceNeverCountsTwice) {
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

TEST(EngineOnlyRecvRanges, CountsEveryByteOnceAndAlwaysAdmitsTheLowestGap) {
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

TEST_F(EngineOnly, FailureDuringResumeAndOfTheStandbyRecovers) {
  // Both paths are down for a while here: give the reconnect back-off room before the fatal
  // timeout (slow sanitizer builds take longer per loop iteration).
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 10);
  connectComm();
  int step = 0;
  Stats st = run(150, mixed, 8, [&](int k) {
    if (k == 50) w(0, kA0)->broken = true, step = 1;
  }, [&] {
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

TEST_F(EngineOnly, FlapsGrowTheHoldDownThenItDecays) {
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
      // this test is about the hold-down growing per flap.
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
    Stats st = run(50, mixed, 8, nullptr, driver);
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
  while (send->paths[0].holdDownMs >= peak && peak > 300u && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  EXPECT_LT(send->paths[0].holdDownMs, peak) << "hold-down decays once stable";
  EXPECT_EQ(activeNic(), 0);
}

TEST_F(EngineOnly, PrimaryFailingWhileTheStandbyStillReconnectsAfterAFailbackMovesOnceItIsUp) {
  // After a failback the old active path (the standby now) is closed and reconnects. If the
  // primary fails again before that reconnect completes, there is no usable path for a
  // moment: the comm must move to the standby as soon as it is connected, with nothing lost.
  // Three times in a row, so the primary's hold-down grows (flaps).
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
    Stats st = run(50, mixed, 8, nullptr, driver, 30000);
    ASSERT_EQ(st.err, ncclSuccess);
    ASSERT_FALSE(st.timedOut) << "stalled in state " << state << " (cycle " << cycles << ")";
    ASSERT_EQ(st.delivered, 50u);
  }
  ASSERT_EQ(state, 4);
  // The case under test needs the standby still reconnecting when the primary breaks: at least
  // one of the three cycles must have hit it.
  int hit = 0;
  for (PathState s : standbyWhenBroken) hit += s != PathState::kStandby;
  EXPECT_GE(hit, 1) << "the primary never broke while the standby was still reconnecting";
  for (size_t i = 0; i < movedMs.size(); ++i) {
    // Generous on a loaded machine: the fake connects at once, so this is scheduling time.
    EXPECT_LT(movedMs[i], 5000) << "cycle " << i << ": moved to the standby " << movedMs[i] << " ms after the primary broke";
  }
  w(0, kA0)->broken = false;
}

TEST_F(EngineOnly, ReceiverWithEveryReceiveCompleteStillAnswersTheResume) {
  // The receiver completes its last receive and nothing calls it any more; the ACK it sent is
  // lost with the primary. The sender's send completes only when the receiver answers the
  // RESUME on the standby: the sweeper's idle pass (sweepIdleLinks(), the test's stand-in for
  // the sweeper thread) must do that without any call on the receiver.
  connectComm();
  ASSERT_EQ(run(20, mixed, 8).delivered, 20u);
  std::vector<uint8_t> sb(70000), rb(70000, 0xEE);
  for (size_t j = 0; j < sb.size(); ++j) sb[j] = pattern(7, j);
  void *sr = nullptr, *rr = nullptr;
  ASSERT_EQ(send->isend(sb.data(), sb.size(), 0, &sr), ncclSuccess);
  void* d = rb.data();
  uint64_t cap = rb.size();
  int tag = 0, done = 0, size = 0;
  ASSERT_EQ(recv->irecv(1, &d, &cap, &tag, &rr), ncclSuccess);
  ASSERT_TRUE(sr && rr);
  for (int i = 0; i < 100000 && !done; ++i) {
    gTr->pump();
    ASSERT_EQ(recv->test((RecvReq*)rr, &done, &size), ncclSuccess);
    if (!done) {
      int sd = 0;
      ASSERT_EQ(send->test((SendReq*)sr, &sd, &size), ncclSuccess);
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
    ASSERT_EQ(send->test((SendReq*)sr, &done, &size), ncclSuccess);
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

TEST_F(EngineOnly, DataAcknowledgedDuringAProbeBurstIsReportedToHealth) {
  // A full-size probe burst runs on the primary's pair. Messages acknowledged over that pair
  // prove the rail carries full-size data: each advance of the cumulative ACK is reported. No
  // burst: no report.
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

TEST_F(EngineOnly, EveryPairSilentIsAStoppedPeerNotANicFault) {
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

TEST_F(EngineOnly, ConnectAttemptStartedDuringTheOutageRestartsAtRepair) {
  Setting hold(Runtime::get().cfg.holdDownMs, 10);
  connectComm();
  // The primary fails; its reconnects go into the outage (they never complete on their own
  // before the engine's connect timeout).
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
  // Repair: new connects get through; the probes see the pair again.
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

TEST_F(EngineOnly, ReconnectLostAfterTheRepairDoesNotWaitTheOutagesBackoff) {
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
  // Repair as a busy host sees it: the probes prove the pair first, but the retry started
  // then is lost (the peer's side is not back yet) and times out after 3 s.
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

TEST_F(EngineOnly, HoldDownCountsFromThePairsRepairNotTheReconnect) {
  Setting hold(Runtime::get().cfg.holdDownMs, 300);
  connectComm();
  w(0, kA0)->broken = true;
  gHl->setPair(0, kA0, false, false, "probe timeout (test)");
  ASSERT_EQ(run(100, mixed, 8).delivered, 100u);
  ASSERT_EQ(activeNic(), 1);
  // The transport gets through again (the path reconnects) while the probes still fail: not
  // repaired.
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

// The transport's progress signal (SendPath::peerAckedWithinMs, the fake's `peerAcks`) stands
// for the kernel's ACKs of the byte-stream suite.
TEST_F(EngineOnly, NoFullSizeBurstWhileTheKernelStillAcks) {
  connectComm();
  ASSERT_EQ(run(50, mixed, 8).delivered, 50u);
  gHl->bursts.clear();
  // A saturated path: it moves nothing for 100 ms (20 x RAILOVER_STALL_MS) but the peer's
  // transport keeps acknowledging. Lost full-size probes there would be congestion: no burst.
  int phase = 0;
  auto t0 = std::chrono::steady_clock::now();
  Stats st = run(200, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->peerAcks = true;
      w(0, kA0)->stalled = true;
      t0 = std::chrono::steady_clock::now();
      phase = 1;
    }
  }, [&] {
    if (phase == 1 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(100)) {
      w(0, kA0)->stalled = false;
      phase = 2;
    }
  });
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_TRUE(gHl->bursts.empty()) << gHl->bursts.size() << " bursts on a path whose peer acknowledges";
  // Control: the same stall without acknowledgements asks for a burst (the stall lasts until
  // it does, at most 10 s: a descheduled caller restarts the stall clock on a busy host, and
  // 3 s was seen to run out with several test processes on two cores).
  w(0, kA0)->peerAcks = false;
  phase = 0;
  st = run(200, mixed, 8, [&](int k) {
    if (k == 50) {
      w(0, kA0)->stalled = true;
      t0 = std::chrono::steady_clock::now();
      phase = 1;
    }
  }, [&] {
    if (phase == 1 && (!gHl->bursts.empty() || std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10))) {
      w(0, kA0)->stalled = false;
      phase = 2;
    }
  });
  EXPECT_EQ(st.delivered, 200u);
  EXPECT_FALSE(gHl->bursts.empty()) << "control: a stall with nothing acknowledged asks for full-size probes";
}

// RAILOVER_ABORT_ON_FATAL=1: the fatal error ends the process with one stderr line naming the
// path and the cause (status kAbortOnFatalExitCode) instead of returning ncclSystemError (the
// =0 behaviour is NoUsablePathIsAFatalErrorAfterTheTimeout above).
TEST_F(EngineOnly, AbortOnFatalExitsTheProcessWithOneLine) {
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
        }, nullptr, 15000);
        fprintf(stderr, "the call returned %d instead of exiting\n", (int)st.err);
        exit(0);
      },
      ::testing::ExitedWithCode(kAbortOnFatalExitCode),
      "railover: RAILOVER_ABORT_ON_FATAL=1: exiting on a fatal error: no usable path (to|from) peer 10\\.0\\.[01]\\.1 "
      "(from|on) NIC\\(s\\) n0[^\n]*n1[^\n]*(No route to host|reset)");
}

// NCCL's transports return the send comm no later than the receiver's accept returns. Here
// the primary NIC's connect hangs and the standby path connects: the receiver accepts on the
// standby, and the sender's connect must have completed by then.
TEST_F(EngineOnly, ConnectReturnsNoLaterThanAccept) {
  w(0, kA0)->hangConnect = true;
  static uint64_t secret = 0x5ec2e7c000000000ULL;
  ++secret;
  Listener* L = new Listener(Runtime::get().linkDeps(), secret, 0);
  PeerHandle h;
  h.secret = secret;
  h.primary = 0;
  h.naddr = 2;
  for (int i = 0; i < 2; ++i) {
    h.addrs[i].rail = i;
    auto* s = (sockaddr_in*)&h.addrs[i].addr;
    s->sin_family = AF_INET;
    s->sin_port = htons((uint16_t)(1000 + i));
    inet_pton(AF_INET, i ? kA1 : kA0, &s->sin_addr);
    h.addrs[i].len = sizeof(sockaddr_in);
  }
  std::string err;
  send = SendLink::create(Runtime::get().linkDeps(), 0, h, &err);
  ASSERT_NE(send, nullptr) << err;
  bool connected = false;
  for (int i = 0; i < 100000 && !recv; ++i) {
    if (!connected) {
      std::string why;
      int st = send->connectStep(&why);
      ASSERT_GE(st, 0) << why;
      connected = st > 0;
    }
    gTr->pump();
    recv = L->accept();
    if (recv) EXPECT_TRUE(connected) << "accept returned (iteration " << i << ") but connect has not";
  }
  L->close();
  delete L;
  ASSERT_NE(recv, nullptr);
  for (int i = 0; i < 100000 && !connected; ++i) {
    std::string why;
    int st = send->connectStep(&why);
    ASSERT_GE(st, 0) << why;
    connected = st > 0;
  }
  ASSERT_TRUE(connected);
  // Data posted before any path is active waits for one, then flows (on the standby here).
  Stats st = run(50, mixed, 8);
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess);
  EXPECT_EQ(st.delivered, 50u);
  EXPECT_EQ(activeNic(), 1);
}

// The receiver completes a message (its ACK is sent) and closes: the sender may read the
// CLOSE on the standby path before the ACK on the active one. The send completed and must be
// reported done, not failed as "closed with messages not acknowledged".
TEST_F(EngineOnly, AckSentBeforeTheCloseStillCompletesTheSend) {
  connectComm();
  ASSERT_EQ(run(20, mixed, 4).delivered, 20u);
  std::vector<uint8_t> sb(5000, 9), rb(5000);
  void* sq = nullptr;
  ASSERT_EQ(send->isend(sb.data(), sb.size(), 0, &sq), ncclSuccess);
  ASSERT_NE(sq, nullptr);
  void* d = rb.data();
  uint64_t cap = rb.size();
  int tag = 0, done = 0, size = 0;
  void* rq = nullptr;
  ASSERT_EQ(recv->irecv(1, &d, &cap, &tag, &rq), ncclSuccess);
  ASSERT_NE(rq, nullptr);
  for (int i = 0; i < 100000 && !done; ++i) ASSERT_EQ(recv->test((RecvReq*)rq, &done, &size), ncclSuccess);
  ASSERT_TRUE(done);
  ASSERT_EQ(rb, sb);
  recv->close();
  delete recv;
  recv = nullptr;
  // The sender's next call starts with its slow tick, which reads the standby path (and its
  // CLOSE) before the active path's control messages.
  auto t0 = std::chrono::steady_clock::now();
  while (nowUs() - send->lastSlowTickUs < 2000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
  }
  done = 0;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 1000 && !done && res == ncclSuccess; ++i) res = send->test((SendReq*)sq, &done, &size);
  EXPECT_EQ(res, ncclSuccess) << send->fatalMsg;
  EXPECT_TRUE(done);
  EXPECT_TRUE(send->peerClosed);
}

// Orderly close in every order, with data in flight and with the receiver's ACK unable to
// leave (the fake's backStalled on its active path): no path_down, flap or failover in the
// journal, no reconnect, on either side.
TEST_F(EngineOnly, OrderlyCloseInAnyOrderIsNeverAFault) {
  for (int order = 0; order < 3; ++order) {
    SCOPED_TRACE("order " + std::to_string(order));
    connectComm();
    ASSERT_EQ(run(30, mixed, 8).delivered, 30u);
    size_t mark = journalSize();
    // In flight: 3 sends, a receive posted for the first only, its ACK unable to leave.
    std::vector<uint8_t> sb(3000, 1), rb(3000);
    void* sq[3];
    for (auto& q : sq) {
      ASSERT_EQ(send->isend(sb.data(), sb.size(), 0, &q), ncclSuccess);
      ASSERT_NE(q, nullptr);
    }
    void* d = rb.data();
    uint64_t cap = rb.size();
    int tag = 0;
    void* rq = nullptr;
    if (order == 2) {
      auto* rx = dynamic_cast<chunkfake::FakeRecvPath*>(recv->paths[recv->active].rx.get());
      ASSERT_NE(rx, nullptr);
      rx->channel().backStalled = true;
    }
    ASSERT_EQ(recv->irecv(1, &d, &cap, &tag, &rq), ncclSuccess);
    ASSERT_NE(rq, nullptr);
    for (int i = 0; i < 50; ++i) {
      int done = 0, size = 0;
      recv->test((RecvReq*)rq, &done, &size);
      send->test((SendReq*)sq[0], &done, &size);
    }
    std::vector<uint32_t> gens;
    for (auto& p : send->paths) gens.push_back(p.generation);
    if (order == 0) {  // sender first; the receiver keeps being driven for a while
      send->close();
      delete send;
      send = nullptr;
      for (int i = 0; i < 2000; ++i) {
        sweepLinks();
        void* q = nullptr;
        recv->irecv(1, &d, &cap, &tag, &q);
      }
      EXPECT_TRUE(recv->peerClosed) << "the receiver saw the CLOSE";
      recv->close();
      delete recv;
      recv = nullptr;
    } else {  // receiver first; the sender keeps being driven for a while
      recv->close();
      delete recv;
      recv = nullptr;
      auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300)) {
        gTr->pump();
        sweepLinks();
        void* q = nullptr;
        send->isend(sb.data(), 0, 0, &q);
      }
      EXPECT_TRUE(send->peerClosed) << "the sender saw the CLOSE";
      for (size_t i = 0; i < send->paths.size(); ++i) {
        EXPECT_EQ(send->paths[i].generation, gens[i]) << "no reconnect attempt";
        EXPECT_EQ(send->paths[i].state, PathState::kClosed);
      }
      send->close();
      delete send;
      send = nullptr;
    }
    auto bad = journalEvents(mark, {"path_down", "flap", "failover", "fatal"});
    EXPECT_TRUE(bad.empty()) << bad.size() << " fault event(s), first: " << (bad.empty() ? "" : bad[0]);
    for (auto& wr : gTr->wires) *wr.second = chunkfake::Wire();
  }
}

// Negative control for the peer-gone verdict: the sender's transport gives up on both paths at
// once (the fake's senderTimedOut, as a kernel user timeout under congestion: the sender fences
// both paths), so the receiver sees every rail closed by the sender. The sender process is
// alive and reconnects: the receiver must not call it gone.
TEST_F(EngineOnly, EveryRailClosedByALiveSenderIsNotPeerGone) {
  Setting fatal(Runtime::get().cfg.fatalTimeoutS, 30);
  connectComm();
  std::vector<uint32_t> gens;
  for (auto& p : send->paths) gens.push_back(p.generation);
  Stats st = run(300, mixed, 8, [&](int k) {
    if (k == 100)
      for (auto& p : send->paths)
        if (auto* tx = dynamic_cast<chunkfake::FakeSendPath*>(p.tx.get())) tx->channel().senderTimedOut = true;
  });
  EXPECT_FALSE(st.timedOut);
  EXPECT_EQ(st.err, ncclSuccess) << (recv->fatal ? recv->fatalMsg : send->fatalMsg);
  EXPECT_EQ(st.delivered, 300u);
  EXPECT_FALSE(recv->fatal) << recv->fatalMsg;
  for (size_t i = 0; i < send->paths.size(); ++i)
    EXPECT_GT(send->paths[i].generation, gens[i]) << "the scenario must really close path " << i << " and reconnect it";
}

// ------------------------------------------------------------------------------------------
// Grouped receives (irecv of n buffers, maxRecvs = 8), as the byte-stream suite's Grouped.

class EngineOnlyGrouped : public EngineOnly {
 protected:
  // `groups` grouped receives of `n` buffers each. The k-th isend carries tag 100 + (p + j) % n
  // (j = k / n its group, p = k % n its place in it); the receiver posts group j's buffers with
  // tags 100 + n - 1 - i (reversed). So buffer i of group j must receive message
  // j*n + ((n - 1 - i - j) mod n), whole and in place.
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
      sweepIdleLinks();
      gTr->pump();
      while (sp < total && sp - sd < 8 * n) {
        int j = sp / n, p = sp % n;
        void* q = nullptr;
        st.err = send->isend(sb[sp].data(), sb[sp].size(), 100 + (p + j) % n, &q);
        if (!q || st.err) break;
        sr[sp++] = q;
      }
      while (rp < groups && rp - rd < 8 && st.err == ncclSuccess) {
        if (onGroup) onGroup(rp);
        void* d[kMaxRecvs];
        uint64_t caps[kMaxRecvs];
        int tags[kMaxRecvs];
        for (int i = 0; i < n; ++i) {
          int k = msgFor(rp, i);
          d[i] = rb[k].data(), caps[i] = rb[k].size(), tags[i] = 100 + n - 1 - i;
        }
        void* q = nullptr;
        st.err = recv->irecv(n, d, caps, tags, &q);
        if (!q || st.err) break;
        rr[rp++] = q;
      }
      int done = 0, sizes[kMaxRecvs];
      if (sd < sp && st.err == ncclSuccess) {
        st.err = send->test((SendReq*)sr[sd], &done, sizes);
        if (done) ++sd;
      }
      done = 0;
      if (rd < rp && st.err == ncclSuccess) {
        for (int i = 0; i < n; ++i) sizes[i] = -1;
        st.err = recv->test((RecvReq*)rr[rd], &done, sizes);
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

TEST_F(EngineOnlyGrouped, TagsPickTheBufferInsideEachGroupExactlyOnceInOrder) {
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

TEST_F(EngineOnlyGrouped, SurviveFailoverAndResume) {
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

// Rule checked: the engine's idempotent accounting (RecvSink::place answers kDiscard for
// chunks of completed messages), with groups: lane 0 of the primary stalls, the path then
// breaks, and chunks of completed messages come again after the RESUME.
TEST_F(EngineOnlyGrouped, DuplicatesAfterResumeAreDiscarded) {
  connectComm();
  int phase = 0;
  Stats st = runGrouped(60, 4, [&](int j) {
    if (j == 15) {
      auto* tx = dynamic_cast<chunkfake::FakeSendPath*>(send->paths[0].tx.get());
      ASSERT_NE(tx, nullptr);
      tx->channel().laneStalled[0] = true;
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

// The engine's half of the byte-stream suite's test: a send whose tag matches no buffer of the
// group it falls into. (The other half, n outside 1..maxRecvs, is checked by the plugin API
// layer, which this binary does not link.)
TEST_F(EngineOnlyGrouped, CallerMisuseIsAnInternalError) {
  connectComm();
  std::vector<uint8_t> a(100), b(100), sbuf(100, 1);
  void* d[2] = {a.data(), b.data()};
  uint64_t caps[2] = {100, 100};
  int tags[2] = {1, 2};
  void* q = nullptr;
  ASSERT_EQ(recv->irecv(2, d, caps, tags, &q), ncclSuccess);
  ASSERT_NE(q, nullptr);
  void *s1 = nullptr, *s2 = nullptr;
  ASSERT_EQ(send->isend(sbuf.data(), 100, 1, &s1), ncclSuccess);
  ASSERT_EQ(send->isend(sbuf.data(), 100, 7, &s2), ncclSuccess);
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 10000 && res == ncclSuccess; ++i) {
    int done = 0, sizes[2];
    gTr->pump();
    res = recv->test((RecvReq*)q, &done, sizes);
    ASSERT_FALSE(done);
  }
  EXPECT_EQ(res, ncclInternalError);
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; })) << "nothing lands on a mismatch";
}

}  // namespace
