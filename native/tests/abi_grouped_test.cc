// maxRecvs through the plugin's exported ABI tables (the built libnccl-net-railover.so,
// dlopen'ed as NCCL does), over loopback TCP: maxRecvs is 1 by default and stays 1 with
// RAILOVER_MAX_RECVS=8 (TCP offers no grouped receive: plugin/api.cc, advertisedMaxRecvs; the
// grouped path is tested on the RDMA transport, tests/rdma and native/tests/rdma), a grouped
// irecv is the caller's misuse, and single receives report every size through the v8 (int),
// v10 and v12 tables. Also the comm's traffic class reaching connect (v10) and init (v11+).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <cstring>
#include <functional>
#include <vector>

#include "abi/nccl_net_abi.h"
#include "tests/log_capture.h"

namespace {

// One ABI version's calls, reduced to what the test needs.
struct Ops {
  std::function<ncclResult_t()> init;
  std::function<int()> maxRecvs;
  std::function<ncclResult_t(void* h, void** lc)> listen;
  std::function<ncclResult_t(void* h, void** sc)> connect;
  std::function<ncclResult_t(void* lc, void** rc)> accept;
  std::function<ncclResult_t(void* sc, void* d, size_t n, int tag, void** r)> isend;
  std::function<ncclResult_t(void* rc, int n, void** d, size_t* sz, int* tags, void** r)> irecv;
  ncclResult_t (*test)(void*, int*, int*);
  ncclResult_t (*closeSend)(void*);
  ncclResult_t (*closeRecv)(void*);
  ncclResult_t (*closeListen)(void*);
};

void* plugin() {
  static void* h = [] {
    setenv("RAILOVER_IFNAMES", "=lo", 1);
    return dlopen(RAILOVER_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  }();
  return h;
}

template <typename T>
T* table(const char* sym) {
  return plugin() ? (T*)dlsym(plugin(), sym) : nullptr;
}

Ops ops8() {
  auto* t = table<ncclNet_v8_t>("ncclNetPlugin_v8");
  Ops o;
  o.init = [t] { return t->init(nullptr); };
  o.maxRecvs = [t] {
    ncclNetProperties_v8_t p;
    return t->getProperties(0, &p) == ncclSuccess ? p.maxRecvs : -1;
  };
  o.listen = [t](void* h, void** lc) { return t->listen(0, h, lc); };
  o.connect = [t](void* h, void** sc) { return t->connect(0, h, sc, nullptr); };
  o.accept = [t](void* lc, void** rc) { return t->accept(lc, rc, nullptr); };
  o.isend = [t](void* sc, void* d, size_t n, int tag, void** r) { return t->isend(sc, d, (int)n, tag, nullptr, r); };
  o.irecv = [t](void* rc, int n, void** d, size_t* sz, int* tags, void** r) {
    int s[8];
    for (int i = 0; i < n && i < 8; ++i) s[i] = (int)sz[i];
    return t->irecv(rc, n, d, s, tags, nullptr, r);
  };
  o.test = t->test, o.closeSend = t->closeSend, o.closeRecv = t->closeRecv, o.closeListen = t->closeListen;
  return o;
}

Ops ops10() {
  auto* t = table<ncclNet_v10_t>("ncclNetPlugin_v10");
  Ops o;
  o.init = [t] { return t->init(nullptr, nullptr); };
  o.maxRecvs = [t] {
    ncclNetProperties_v10_t p;
    return t->getProperties(0, &p) == ncclSuccess ? p.maxRecvs : -1;
  };
  o.listen = [t](void* h, void** lc) { return t->listen(0, h, lc); };
  o.connect = [t](void* h, void** sc) {
    ncclNetCommConfig_t cfg{-1};
    return t->connect(0, &cfg, h, sc, nullptr);
  };
  o.accept = [t](void* lc, void** rc) { return t->accept(lc, rc, nullptr); };
  o.isend = [t](void* sc, void* d, size_t n, int tag, void** r) { return t->isend(sc, d, n, tag, nullptr, nullptr, r); };
  o.irecv = [t](void* rc, int n, void** d, size_t* sz, int* tags, void** r) {
    void* ph[8] = {};
    return t->irecv(rc, n, d, sz, tags, nullptr, ph, r);
  };
  o.test = t->test, o.closeSend = t->closeSend, o.closeRecv = t->closeRecv, o.closeListen = t->closeListen;
  return o;
}

Ops ops12() {
  auto* t = table<ncclNet_v12_t>("ncclNetPlugin_v12");
  static void* ctx = nullptr;
  Ops o;
  o.init = [t] {
    ncclNetCommConfig_t cfg{-1};
    return t->init(&ctx, 0x1234, &cfg, nullptr, nullptr);
  };
  o.maxRecvs = [t] {
    ncclNetProperties_v12_t p;
    return t->getProperties(0, &p) == ncclSuccess ? p.maxRecvs : -1;
  };
  o.listen = [t](void* h, void** lc) { return t->listen(ctx, 0, h, lc); };
  o.connect = [t](void* h, void** sc) { return t->connect(ctx, 0, h, sc, nullptr); };
  o.accept = [t](void* lc, void** rc) { return t->accept(lc, rc, nullptr); };
  o.isend = [t](void* sc, void* d, size_t n, int tag, void** r) { return t->isend(sc, d, n, tag, nullptr, nullptr, r); };
  o.irecv = [t](void* rc, int n, void** d, size_t* sz, int* tags, void** r) {
    void* ph[8] = {};
    return t->irecv(rc, n, d, sz, tags, nullptr, ph, r);
  };
  o.test = t->test, o.closeSend = t->closeSend, o.closeRecv = t->closeRecv, o.closeListen = t->closeListen;
  return o;
}

bool until(const std::function<bool()>& f, int ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end)
    if (f()) return true;
  return false;
}

// A listen comm and a connected send/recv comm pair over loopback (bounded: 30 s).
void connectPair(const Ops& o, void** lc, void** sc, void** rc) {
  uint8_t handle[128] = {};
  ASSERT_EQ(o.listen(handle, lc), ncclSuccess);
  ASSERT_TRUE(until([&] {
    if (!*sc) { EXPECT_EQ(o.connect(handle, sc), ncclSuccess); }
    if (!*rc) { EXPECT_EQ(o.accept(*lc, rc), ncclSuccess); }
    return *sc && *rc;
  }, 30000));
}

// Over TCP maxRecvs stays 1 even with RAILOVER_MAX_RECVS=8 (a TCP sender is not told the
// receiver's grouped receives, which NCCL's shared comms need it to match by tag: plugin/api.cc,
// advertisedMaxRecvs): a grouped receive is the caller's misuse, and single receives with tags
// take the sends in order, every size reported through the table's own size type.
void tcpKeepsOneBufferPerReceive(Ops o) {
  setenv("RAILOVER_MAX_RECVS", "8", 1);  // read at the plugin's first init
  ASSERT_EQ(o.init(), ncclSuccess);
  EXPECT_EQ(o.maxRecvs(), 1) << "RAILOVER_MAX_RECVS=8 must not offer grouped receives over TCP";
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  connectPair(o, &lc, &sc, &rc);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(o.closeListen(lc), ncclSuccess);
  std::vector<uint8_t> a(64), b(64);
  {
    void* d[2] = {a.data(), b.data()};
    size_t sz[2] = {64, 64};
    int tags[2] = {1, 2};
    void* q = (void*)0x1;
    EXPECT_EQ(o.irecv(rc, 2, d, sz, tags, &q), ncclInternalError) << "a grouped receive above maxRecvs 1";
    EXPECT_EQ(q, nullptr);
  }
  const int total = 60;
  auto sizeOf = [](int k) { return (size_t)((k * 7919) % 70000); };
  std::vector<std::vector<uint8_t>> sb(total), rb(total);
  for (int k = 0; k < total; ++k) {
    sb[k].resize(sizeOf(k));
    for (size_t i = 0; i < sb[k].size(); ++i) sb[k][i] = (uint8_t)(k * 31 + i * 7 + 1);
    rb[k].assign(70000, 0xEE);
  }
  std::vector<void*> sr(total), rr(total);
  int sp = 0, rp = 0, sd = 0, rd = 0;
  ASSERT_TRUE(until([&] {
    while (sp < total && sp - sd < 32) {
      void* q = nullptr;
      EXPECT_EQ(o.isend(sc, sb[sp].data(), sb[sp].size(), 10 + sp % 3, &q), ncclSuccess);
      if (!q) break;
      sr[sp++] = q;
    }
    while (rp < total && rp - rd < 8) {
      void* d = rb[rp].data();
      size_t sz = 70000;
      int tag = 10 + rp % 3;
      void* q = (void*)0x1;
      EXPECT_EQ(o.irecv(rc, 1, &d, &sz, &tag, &q), ncclSuccess);
      if (!q) break;
      EXPECT_NE(q, (void*)0x1);
      rr[rp++] = q;
    }
    int done = 0, size = -1;
    if (sd < sp) {
      EXPECT_EQ(o.test(sr[sd], &done, &size), ncclSuccess);
      if (done) ++sd;
    }
    done = 0;
    if (rd < rp) {
      EXPECT_EQ(o.test(rr[rd], &done, &size), ncclSuccess);
      if (done) {
        EXPECT_EQ((size_t)size, sb[rd].size()) << "message " << rd;
        EXPECT_TRUE(sb[rd].empty() || !memcmp(rb[rd].data(), sb[rd].data(), sb[rd].size())) << "message " << rd;
        ++rd;
      }
    }
    return sd == total && rd == total;
  }, 30000)) << "sent " << sd << "/" << total << ", received " << rd << "/" << total;
  EXPECT_EQ(o.closeSend(sc), ncclSuccess);
  EXPECT_EQ(o.closeRecv(rc), ncclSuccess);
}

TEST(AbiGrouped, TcpOffersOneBufferV8IntSizes) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  tcpKeepsOneBufferPerReceive(ops8());
}
TEST(AbiGrouped, TcpOffersOneBufferV10) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  tcpKeepsOneBufferPerReceive(ops10());
}
TEST(AbiGrouped, TcpOffersOneBufferV12) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  tcpKeepsOneBufferPerReceive(ops12());
}

// By default maxRecvs is 1 (NCCL then shares no comm among local ranks and never groups: see
// plugin/api.cc, advertisedMaxRecvs) and a grouped receive is the caller's misuse.
TEST(AbiGrouped, ByDefaultNoGroupedReceiveIsOffered) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  unsetenv("RAILOVER_MAX_RECVS");
  Ops o = ops12();
  ASSERT_EQ(o.init(), ncclSuccess);
  EXPECT_EQ(o.maxRecvs(), 1) << "maxRecvs above 1 lets NCCL share comms whose sends railover cannot match by tag";
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  connectPair(o, &lc, &sc, &rc);
  if (HasFatalFailure()) return;
  std::vector<char> a(64), b(64);
  void* d[2] = {a.data(), b.data()};
  size_t sz[2] = {64, 64};
  int tags[2] = {1, 2};
  void* q = nullptr;
  EXPECT_EQ(o.irecv(rc, 2, d, sz, tags, &q), ncclInternalError) << "a grouped receive above maxRecvs 1";
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(o.irecv(rc, 1, d, sz, tags, &q), ncclSuccess) << "a single receive is accepted";
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(o.closeSend(sc), ncclSuccess);
  EXPECT_EQ(o.closeRecv(rc), ncclSuccess);
  EXPECT_EQ(o.closeListen(lc), ncclSuccess);
}

// The comm's traffic class (ncclNetCommConfig_t) reaches the plugin's connect: v10 passes it
// to connect, v11+ to init (per context). Seen in the INFO line connect writes (the RDMA
// transport's QPs use it: RdmaPathTest.TheCommsTrafficClassSetsBothEndsQps).
void clearLog() { railover::testlog::clear(); }  // each test reads only its own lines (the log is the process's)
bool logHas(const std::string& s) { return railover::testlog::count(s) > 0; }

// One listen and one connect step, then both closed (`close` gets the listen comm and the
// send comm, which is null while the connect is still in progress).
void connectOnce(const std::function<ncclResult_t(void* h, void** lc)>& listen,
                 const std::function<ncclResult_t(void* h, void** sc)>& connect,
                 const std::function<void(void* lc, void* sc)>& close) {
  uint8_t handle[128] = {};
  void *lc = nullptr, *sc = nullptr;
  ASSERT_EQ(listen(handle, &lc), ncclSuccess);
  EXPECT_EQ(connect(handle, &sc), ncclSuccess);  // the first step creates the comm
  close(lc, sc);
}

template <typename T>
std::function<void(void*, void*)> closeBoth(T* t) {
  return [t](void* lc, void* sc) {
    if (sc) t->closeSend(sc);
    t->closeListen(lc);
  };
}

TEST(AbiTrafficClass, V10ConnectConfigReachesTheComm) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  auto* t = table<ncclNet_v10_t>("ncclNetPlugin_v10");
  clearLog();
  ASSERT_EQ(t->init(railover::testlog::capture, nullptr), ncclSuccess);
  connectOnce([t](void* h, void** lc) { return t->listen(0, h, lc); },
              [t](void* h, void** sc) {
                ncclNetCommConfig_t cfg{42};
                return t->connect(0, &cfg, h, sc, nullptr);
              },
              closeBoth(t));
  EXPECT_TRUE(logHas("the comm's traffic class is 42")) << railover::testlog::all();
}

TEST(AbiTrafficClass, V12InitConfigReachesEveryConnectOfThatContext) {
  ASSERT_NE(plugin(), nullptr) << dlerror();
  auto* t = table<ncclNet_v12_t>("ncclNetPlugin_v12");
  void *ctxA = nullptr, *ctxB = nullptr;
  ncclNetCommConfig_t a{43}, b{-1};
  clearLog();
  ASSERT_EQ(t->init(&ctxA, 1, &a, railover::testlog::capture, nullptr), ncclSuccess);
  ASSERT_EQ(t->init(&ctxB, 2, &b, railover::testlog::capture, nullptr), ncclSuccess);
  connectOnce([t, ctxB](void* h, void** lc) { return t->listen(ctxB, 0, h, lc); },
              [t, ctxB](void* h, void** sc) { return t->connect(ctxB, 0, h, sc, nullptr); }, closeBoth(t));
  EXPECT_FALSE(logHas("traffic class is")) << "a context without a traffic class: " << railover::testlog::all();
  connectOnce([t, ctxA](void* h, void** lc) { return t->listen(ctxA, 0, h, lc); },
              [t, ctxA](void* h, void** sc) { return t->connect(ctxA, 0, h, sc, nullptr); }, closeBoth(t));
  EXPECT_TRUE(logHas("the comm's traffic class is 43")) << railover::testlog::all();
  EXPECT_EQ(t->finalize(ctxA), ncclSuccess);
  EXPECT_EQ(t->finalize(ctxB), ncclSuccess);
}

}  // namespace
