// Two runtimes side by side in one process: each has its own link registry, journal, health
// view and (chunk-level fake) transport, handed to its links in LinkDeps, as the plugin's
// runtime hands its own. They share no link, no routing entry, no event, no counter and no
// sweeper: nothing in the engine reaches a process-wide singleton. Also the sweeper thread's
// lifetime: it drives only its registry's links and ends when stopped or destroyed.
//
// Single-threaded except where a test starts a sweeper thread; while it runs, the test thread
// only reads link state under the link's mutex (the fakes are not thread-safe).
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "failover/link.h"
#include "failover/registry.h"
#include "telemetry/journal.h"
#include "tests/engine_only/fake_paths.h"
#include "tests/scripted_health.h"
#include "tests/test_nic.h"

using namespace railover;

namespace {

const char* const kA0 = "10.0.0.1";  // NIC 0, rail 0 (primary)
const char* const kA1 = "10.0.1.1";  // NIC 1, rail 1 (standby)

// One runtime's worth of engine dependencies, and one comm (send, recv) over them.
struct Side {
  Config cfg;
  std::vector<Nic> nics{testbed::makeNic(0, "n0", kA0, 0), testbed::makeNic(1, "n1", kA1, 1)};
  std::vector<uint16_t> ports{1000, 1001};
  chunkfake::PathTransport transport;
  fake::ScriptedHealth health;
  MemoryJournal journal;
  LinkRegistry links;  // declared last: destroyed (its sweeper stopped) before what links use
  SendLink* send = nullptr;
  RecvLink* recv = nullptr;

  Side() {
    cfg.nStreams = 2;
    cfg.minChunkBytes = 4096;
    cfg.holdDownMs = 50;
    cfg.stallMs = 5;
    cfg.fatalTimeoutS = 60;  // never reached here: a fatal link would be a failure of the test
    transport.nicAddr = {kA0, kA1};
    transport.router = &links;
  }
  ~Side() { closeComm(); }

  LinkDeps deps() {
    LinkDeps d;
    d.cfg = &cfg, d.nics = &nics, d.ports = &ports, d.transport = &transport, d.health = &health;
    d.journal = &journal, d.registry = &links;
    return d;
  }
  // The listener's handle: both NICs' addresses, NIC 0 the primary.
  static PeerHandle handle(uint64_t secret) {
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
    return h;
  }
  // Connects one comm with `secret` as the plugin API does (listen, connect and accept in turn).
  void connectComm(uint64_t secret) {
    Listener listener(deps(), secret, 0);
    std::string why;
    SendLink* s = SendLink::create(deps(), 0, handle(secret), &why);
    ASSERT_NE(s, nullptr) << why;
    bool connected = false;
    for (int i = 0; i < 100000 && !(connected && recv); ++i) {
      if (!connected) {
        int st = s->connectStep(&why);
        ASSERT_GE(st, 0) << why;
        connected = st > 0;
      }
      transport.pump();
      if (!recv) recv = listener.accept();
    }
    listener.close();
    send = s;
    ASSERT_TRUE(connected && recv);
  }
  // Sends `n` messages of 10000 bytes and receives them, checking every byte.
  void carry(int n) {
    for (int k = 0; k < n; ++k) {
      std::vector<uint8_t> sb(10000), rb(10000, 0);
      for (size_t j = 0; j < sb.size(); ++j) sb[j] = (uint8_t)(k * 31 + j * 7);
      void *sr = nullptr, *rr = nullptr;
      void* d = rb.data();
      uint64_t cap = rb.size();
      int tag = 0, sdone = 0, rdone = 0, size = 0, rsize = 0;
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!(sdone && rdone) && std::chrono::steady_clock::now() < end) {
        if (!sr) { ASSERT_EQ(send->isend(sb.data(), sb.size(), 0, &sr), ncclSuccess); }
        if (!rr) { ASSERT_EQ(recv->irecv(1, &d, &cap, &tag, &rr), ncclSuccess); }
        if (sr && !sdone) { ASSERT_EQ(send->test((SendReq*)sr, &sdone, &size), ncclSuccess); }
        if (rr && !rdone) { ASSERT_EQ(recv->test((RecvReq*)rr, &rdone, &rsize), ncclSuccess); }
        transport.pump();
      }
      ASSERT_TRUE(sdone && rdone) << "message " << k << " not delivered within 60 s";
      EXPECT_EQ(rsize, 10000);
      EXPECT_TRUE(rb == sb) << "message " << k << " corrupted";
    }
  }
  // The local NIC of the sender's active path (-1: none), read under the link's mutex.
  int activeNic() {
    std::lock_guard<std::mutex> g(send->mu);
    return send->active >= 0 ? send->paths[send->active].localNic : -1;
  }
  bool sendRunning() {
    std::lock_guard<std::mutex> g(send->mu);
    return send->state() == LinkState::kRunning;
  }
  void closeComm() {
    if (send) send->close(), delete send, send = nullptr;
    if (recv) recv->close(), delete recv, recv = nullptr;
  }
};

std::vector<Link*> listed(LinkRegistry& r) {
  std::vector<Link*> v;
  r.forEach([&](Link& l) { v.push_back(&l); });
  std::sort(v.begin(), v.end());
  return v;
}

// Both runtimes open a comm with the same secret: each stream reaches the recv link of its own
// runtime only, each journal holds only its own runtime's events, and a fault in one moves
// only that one's comm (journal, counters, closed totals).
TEST(LinkRegistry, TwoRuntimesShareNoLinkRouteOrEvent) {
  const uint64_t secret = 0x5ec2e7000000abcdULL;
  Side a, b;
  a.connectComm(secret);
  b.connectComm(secret);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<Link*> wantA{a.send, a.recv}, wantB{b.send, b.recv};
  std::sort(wantA.begin(), wantA.end());
  std::sort(wantB.begin(), wantB.end());
  EXPECT_EQ(listed(a.links), wantA);
  EXPECT_EQ(listed(b.links), wantB);
  a.carry(3);
  b.carry(3);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // Two paths per comm, each journaled once on each side: 4 path_up lines per runtime (one
  // journal for both would hold 8, and both runtimes' comms carry the same id).
  EXPECT_EQ(a.journal.events("path_up").size(), 4u);
  EXPECT_EQ(b.journal.events("path_up").size(), 4u);

  // A's NIC 0 goes down: A fails over to NIC 1; B's comm stays on NIC 0 and B journals nothing.
  size_t bLines = b.journal.lines().size();
  a.health.setNic(0, false);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((a.links.sweep() > 0 || a.activeNic() != 1) && std::chrono::steady_clock::now() < end) a.transport.pump();
  EXPECT_EQ(a.activeNic(), 1);
  EXPECT_EQ(a.send->counters.failovers, 1u);
  EXPECT_EQ(a.journal.events("failover").size(), 1u);
  EXPECT_EQ(b.activeNic(), 0);
  EXPECT_EQ(b.links.sweep(), 0u) << "B's health did not change: its links are settled";
  EXPECT_EQ(b.journal.lines().size(), bLines) << "B journaled something for A's fault";
  EXPECT_EQ(b.send->counters.failovers, 0u);
  a.carry(2);
  b.carry(2);

  // A connection B's links make to a comm only A listens for is refused in B (NACK: B's
  // registry does not know it), and A's listener never sees it.
  const uint64_t onlyInA = secret + 1;
  {
    Listener aListener(a.deps(), onlyInA, 0);
    std::string why;
    SendLink* stray = SendLink::create(b.deps(), 0, Side::handle(onlyInA), &why);
    ASSERT_NE(stray, nullptr) << why;
    // (A fake path connects at once, so connect may first report success; the NACK follows.)
    int st = 0;
    for (int i = 0; i < 100000 && st >= 0; ++i) {
      st = stray->connectStep(&why);
      b.transport.pump();
      a.transport.pump();
    }
    EXPECT_EQ(st, -1);
    EXPECT_NE(why.find("no longer serves this comm"), std::string::npos) << why;
    EXPECT_EQ(aListener.accept(), nullptr);
    EXPECT_EQ(a.links.size(), 2u) << "no recv link was created in A";
    stray->close();
    delete stray;
    aListener.close();
  }

  a.closeComm();
  b.closeComm();
  uint64_t fatalsA = 9, fatalsB = 9;
  EXPECT_EQ(a.links.closedTotals(&fatalsA).failovers, 1u);
  EXPECT_EQ(b.links.closedTotals(&fatalsB).failovers, 0u);
  EXPECT_EQ(fatalsA, 0u);
  EXPECT_EQ(fatalsB, 0u);
  EXPECT_EQ(a.links.size(), 0u);
  EXPECT_EQ(b.links.size(), 0u);
}

// A's sweeper thread alone moves A's comm off a dead NIC (nobody calls the links); B's comm,
// whose NIC died as well but whose registry has no sweeper, is not touched. Stopping the
// sweeper joins its thread.
TEST(LinkRegistry, TheSweeperDrivesOnlyItsOwnRegistryAndStopsWhenAsked) {
  Side a, b;
  a.connectComm(0x5ec2e70000001111ULL);
  b.connectComm(0x5ec2e70000002222ULL);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  a.carry(2);
  b.carry(2);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // Both health views change before the sweeper starts (the scripted views are not thread-safe).
  a.health.setNic(0, false);
  b.health.setNic(0, false);
  EXPECT_FALSE(a.links.sweeperRunning());
  a.links.startSweeper();
  EXPECT_TRUE(a.links.sweeperRunning());
  a.links.notifySweeper();  // what the runtime's health epoch hook does
  // Only the sweeper thread drives A's links now; this thread reads their state. A sweeper
  // window lasts 1 s after a notice: on a busy host the thread may miss it, so the notice is
  // repeated every 100 ms while waiting (as further health changes would).
  auto start = std::chrono::steady_clock::now(), end = start + std::chrono::seconds(60);
  auto nextNotice = start + std::chrono::milliseconds(100);
  while (!(a.activeNic() == 1 && a.sendRunning()) && std::chrono::steady_clock::now() < end) {
    if (std::chrono::steady_clock::now() >= nextNotice) a.links.notifySweeper(), nextNotice += std::chrono::milliseconds(100);
    std::this_thread::yield();
  }
  a.links.stopSweeper();
  EXPECT_FALSE(a.links.sweeperRunning());
  a.links.notifySweeper();  // no sweeper: no effect
  EXPECT_EQ(a.activeNic(), 1) << "A's sweeper moved A's comm to NIC 1";
  EXPECT_TRUE(a.sendRunning());
  EXPECT_EQ(a.journal.events("failover").size(), 1u);
  // B was never driven: its sender has not looked at the health change and is still on NIC 0.
  EXPECT_EQ(b.activeNic(), 0);
  EXPECT_NE(b.send->seenEpoch, b.health.epoch());
  EXPECT_EQ(b.journal.events("failover").size(), 0u);
  EXPECT_EQ(b.journal.events("path_down").size(), 0u);
  // B's own (single-threaded) sweep moves it now.
  end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((b.links.sweep() > 0 || b.activeNic() != 1) && std::chrono::steady_clock::now() < end) b.transport.pump();
  EXPECT_EQ(b.activeNic(), 1);
  EXPECT_EQ(b.journal.events("failover").size(), 1u);
}

// A registry destroyed with its sweeper running stops and joins it (a thread still joinable at
// destruction would end the process), also while health changes keep waking it.
TEST(LinkRegistry, DestroyingARegistryEndsItsSweeper) {
  for (int round = 0; round < 3; ++round) {
    auto r = std::make_unique<LinkRegistry>();
    r->startSweeper();
    r->startSweeper();  // a second start while it runs: no second thread
    EXPECT_TRUE(r->sweeperRunning());
    for (int k = 0; k < 100; ++k) r->notifySweeper();
    r.reset();
  }
  LinkRegistry r;
  r.startSweeper();
  r.stopSweeper();
  EXPECT_FALSE(r.sweeperRunning());
  r.startSweeper();  // may start again after a stop
  EXPECT_TRUE(r.sweeperRunning());
}

// RAILOVER_TRANSPORT=rdma+tcp with an RDMA port behind some NICs only (the RDMA transport's mixed
// mode, Transport::nicTransport): a comm lives on its NIC's kind. Its standby paths leave only
// from local NICs of that kind (a TCP comm cannot send from GPU memory an RDMA path reads, and
// an RDMA comm's grouped receives need the advertisements TCP does not carry), a comm left with
// no standby says why, and tag matching follows the comm's NIC.
TEST(MixedKinds, ACommsStandbyPathsLeaveOnlyFromNicsOfItsKind) {
  Config cfg;
  cfg.maxRecvs = 8;
  std::vector<Nic> nics{testbed::makeNic(0, "r0", "10.0.0.1", 0), testbed::makeNic(1, "r1", "10.0.1.1", 1),
                        testbed::makeNic(2, "t2", "10.0.2.1", 2)};
  std::vector<uint16_t> ports{1000, 1001, 1002};
  chunkfake::PathTransport transport;
  transport.nicAddr = {"10.0.0.1", "10.0.1.1", "10.0.2.1"};
  transport.kinds = {"rdma", "rdma", "tcp"};
  transport.tellsReceives = true;
  MemoryJournal journal;
  LinkDeps d;
  d.cfg = &cfg, d.nics = &nics, d.ports = &ports, d.transport = &transport, d.journal = &journal;
  // The peer's handle names an address on every rail (the plugin's own handles carry only one
  // kind's NICs; the local rule must hold by itself too).
  auto handle = [](int primary) {
    PeerHandle h;
    h.secret = 77;
    h.primary = primary;
    h.naddr = 3;
    for (int i = 0; i < 3; ++i) {
      h.addrs[i].rail = i;
      auto* sa = (sockaddr_in*)&h.addrs[i].addr;
      sa->sin_family = AF_INET;
      sa->sin_port = htons((uint16_t)(2000 + i));
      inet_pton(AF_INET, ("10.9." + std::to_string(i) + ".1").c_str(), &sa->sin_addr);
      h.addrs[i].len = sizeof(sockaddr_in);
    }
    return h;
  };
  auto localNics = [](SendLink* l) {
    std::vector<int> v;
    for (auto& p : l->paths) v.push_back(p.localNic);
    return v;
  };
  std::string why;
  SendLink* rdmaComm = SendLink::create(d, 0, handle(0), &why);
  ASSERT_NE(rdmaComm, nullptr) << why;
  EXPECT_EQ(localNics(rdmaComm), (std::vector<int>{0, 1})) << "the RDMA comm's standby is the other RDMA NIC only";
  EXPECT_TRUE(rdmaComm->matchTags()) << "an RDMA comm places sends by the receiver's advertisements";
  EXPECT_TRUE(journal.events("no_standby").empty());

  SendLink* tcpComm = SendLink::create(d, 2, handle(2), &why);
  ASSERT_NE(tcpComm, nullptr) << why;
  EXPECT_EQ(localNics(tcpComm), (std::vector<int>{2})) << "no RDMA NIC is a standby of a TCP comm";
  EXPECT_FALSE(tcpComm->matchTags()) << "a TCP path tells the sender no posted receive";
  auto warned = journal.events("no_standby");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_NE(warned[0].find("\"t2\""), std::string::npos) << warned[0];

  // Every NIC of one kind (the default: name() for all): every other NIC is a standby.
  transport.kinds.clear();
  SendLink* plain = SendLink::create(d, 2, handle(2), &why);
  ASSERT_NE(plain, nullptr) << why;
  EXPECT_EQ(localNics(plain), (std::vector<int>{2, 0, 1}));
  for (SendLink* l : {rdmaComm, tcpComm, plain}) {
    l->close();
    delete l;
  }
}

// A stream of a comm that arrives on a local NIC of another kind (a peer that did not take the
// address from the comm's handle) is closed at routing: it would get a receive side of the
// wrong kind (an RDMA comm's verbs bootstrap read by a TCP stream path, or the reverse), which
// reports itself connected while the other side waits. A stream on a NIC of the comm's kind is
// routed as before. (Review of the mixed mode.)
TEST(MixedKinds, AStreamArrivingOnANicOfAnotherKindIsClosedAtRouting) {
  struct NullConn : Conn {
    bool* gone;
    explicit NullConn(bool* g) : gone(g) {}
    ~NullConn() override { *gone = true; }
    int connectState(std::string*) override { return 1; }
    ssize_t writev(const iovec*, int, std::string*) override { return 0; }
    ssize_t read(void*, size_t, std::string*) override { return 0; }
    bool dead(std::string*) override { return false; }
  };
  Side a;
  a.transport.kinds = {"rdma", "tcp"};
  const uint64_t secret = 0x5ec2e70000003333ULL;
  Listener L(a.deps(), secret, 0);  // an RDMA comm (NIC 0)
  StreamHello sh;
  sh.id.secret = secret, sh.id.connId = 42, sh.id.pathIndex = 0, sh.id.generation = 1;
  sh.nStreams = 1;
  sockaddr_storage peer{};
  peer.ss_family = AF_INET;
  bool gone = false;
  size_t before = a.links.size();
  std::unique_ptr<Conn> c(new NullConn(&gone));
  EXPECT_TRUE(a.links.route(c, sh, peer, /*localNic=*/1));
  EXPECT_TRUE(gone) << "the stream that arrived on the TCP NIC was kept";
  EXPECT_EQ(a.links.size(), before) << "a recv comm was created from a stream of the wrong kind";
  gone = false;
  c.reset(new NullConn(&gone));
  EXPECT_TRUE(a.links.route(c, sh, peer, /*localNic=*/0));
  EXPECT_FALSE(gone);
  EXPECT_EQ(a.links.size(), before + 1) << "the stream on the RDMA NIC made no recv comm";
  L.close();  // closes the recv comm never accepted
}

}  // namespace
