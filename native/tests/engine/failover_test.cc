// Deterministic tests of the failover engine against the fault-injecting fake transport:
// drops, resets, partial writes, duplicate chunks after out-of-order completion, failure
// during resume, failure of the standby during failover, failback, flaps, negative controls
// and the fatal timeout. Every test checks exactly-once, in-order delivery byte by byte, and
// that no byte lands in a receive buffer after its receive completed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "../fake_net.h"
#include "common/config.h"
#include "plugin/api.h"
#include "plugin/runtime.h"

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
  int phase = 0;
  Stats st = run(120, [](int k) { return (size_t)(k % 3 == 0 ? 30000 : 3000); }, 8, [&](int k) {
    if (k == 40) {
      dynamic_cast<FakeConn*>(send->paths[0].streams[0].conn.get())->stalled = true;
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
    } else if (state == 2 && activeNic() == 0 && send->counters.failbacks == (uint64_t)cycles + 1) {
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
  // S-12 KILL: every path is reset and the peer refuses new connections on every NIC. That is
  // a dead process, not a NIC fault: error at once, not after RAILOVER_FATAL_TIMEOUT.
  // Timed from the fault, not from the start: the 30 messages before it take longer than the
  // whole bound on a loaded machine under ThreadSanitizer.
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
  EXPECT_LT(ms, 900) << "well before the 1 s fatal timeout (measured from the fault)";
  EXPECT_NE(send->fatalMsg.find("peer process exited"), std::string::npos) << send->fatalMsg;
}

}  // namespace
