// In-process tests of the plugin API over loopback TCP: connect/accept, in-order exact
// delivery of many message sizes (including 0 bytes), receive buffers larger than sends,
// the 32-request window, message-too-large errors and stray/bad connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "failover/link.h"
#include "plugin/api.h"
#include "transport/tcp/wire.h"
#include "tests/test_journal.h"

using namespace railover;

namespace {

struct Pair {
  void* send = nullptr;
  void* recv = nullptr;
  void* listen = nullptr;
  uint8_t handle[128];
};

bool waitFor(const std::function<bool()>& f, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end)
    if (f()) return true;
  return false;
}

class Loopback : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("RAILOVER_IFNAMES", "=lo", 1);
    setenv("RAILOVER_HOLD_DOWN_MS", "100", 1);
    journalFile() = ::testing::TempDir() + "railover-loopback-journal-" + std::to_string(getpid()) + ".jsonl";
    testbed::removeJournalAtExit(journalFile());
    setenv("RAILOVER_EVENT_LOG", journalFile().c_str(), 1);
    ASSERT_EQ(api::init(nullptr), ncclSuccess);
  }
  static std::string& journalFile() {
    static std::string p;
    return p;
  }
  static size_t journalSize() {
    struct stat st;
    return stat(journalFile().c_str(), &st) == 0 ? (size_t)st.st_size : 0;
  }
  // Journal lines since byte `from` whose event is one of `names`.
  static std::vector<std::string> journalEvents(size_t from, std::initializer_list<const char*> names) {
    std::vector<std::string> out;
    FILE* f = fopen(journalFile().c_str(), "r");
    if (!f) return out;
    fseek(f, (long)from, SEEK_SET);
    char line[4096];
    while (fgets(line, sizeof(line), f))
      for (const char* n : names)
        if (strstr(line, (std::string("\"event\":\"") + n + "\"").c_str())) out.push_back(line);
    fclose(f);
    return out;
  }
  Pair connectPair() {
    Pair p;
    memset(p.handle, 0, sizeof(p.handle));
    EXPECT_EQ(api::listen(0, p.handle, &p.listen), ncclSuccess);
    EXPECT_TRUE(waitFor([&] {
      if (!p.send) { EXPECT_EQ(api::connect(0, p.handle, &p.send), ncclSuccess); }
      if (!p.recv) { EXPECT_EQ(api::accept(p.listen, &p.recv), ncclSuccess); }
      return p.send && p.recv;
    }));
    api::closeListen(p.listen);
    return p;
  }
  void closePair(Pair& p) {
    api::closeSend(p.send);
    api::closeRecv(p.recv);
  }
  // Sends `sizes` in order with a window of `window` requests, receiving into `cap`-byte buffers.
  void exchange(Pair& p, const std::vector<size_t>& sizes, size_t cap, int window) {
    std::vector<std::vector<uint8_t>> sbuf(sizes.size()), rbuf(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      sbuf[i].resize(sizes[i]);
      for (size_t j = 0; j < sizes[i]; ++j) sbuf[i][j] = (uint8_t)(i * 131 + j * 7 + 1);
      rbuf[i].assign(cap, 0xee);
    }
    std::vector<void*> sreq(sizes.size()), rreq(sizes.size());
    size_t sPosted = 0, rPosted = 0, sDone = 0, rDone = 0;
    ASSERT_TRUE(waitFor([&] {
      while (sPosted < sizes.size() && sPosted - sDone < (size_t)window) {
        void* r = nullptr;
        EXPECT_EQ(api::isend(p.send, sbuf[sPosted].data(), sizes[sPosted], 0, nullptr, &r), ncclSuccess);
        if (!r) break;
        sreq[sPosted++] = r;
      }
      while (rPosted < sizes.size() && rPosted - rDone < (size_t)window) {
        void* r = (void*)0x1;  // NCCL's optional-completion marker: must be overwritten
        void* d = rbuf[rPosted].data();
        size_t c = cap;
        int tag = 0;
        EXPECT_EQ(api::irecv(p.recv, 1, &d, &c, &tag, nullptr, &r), ncclSuccess);
        if (!r) break;
        EXPECT_NE(r, (void*)0x1);
        rreq[rPosted++] = r;
      }
      int done = 0, size = -1;
      if (sDone < sPosted) {
        EXPECT_EQ(api::test(sreq[sDone], &done, &size), ncclSuccess);
        if (done) sDone++;
      }
      if (rDone < rPosted) {
        done = 0;
        EXPECT_EQ(api::test(rreq[rDone], &done, &size), ncclSuccess);
        if (done) {
          EXPECT_EQ((size_t)size, sizes[rDone]);
          EXPECT_TRUE(sizes[rDone] == 0 || !memcmp(rbuf[rDone].data(), sbuf[rDone].data(), sizes[rDone])) << "message " << rDone;
          rDone++;
        }
      }
      return sDone == sizes.size() && rDone == sizes.size();
    }, 20000));
  }
};

TEST_F(Loopback, ExactInOrderDeliveryManySizes) {
  Pair p = connectPair();
  std::vector<size_t> sizes = {0, 1, 7, 128, 4095, 65536, 65537, 1 << 20, (1 << 20) + 3, 4 << 20, 0, 33};
  exchange(p, sizes, 5 << 20, 8);
  closePair(p);
}

TEST_F(Loopback, FullWindowOf32Requests) {
  Pair p = connectPair();
  std::vector<size_t> sizes(200);
  for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = (i * 977) % 20000;
  exchange(p, sizes, 20000, 32);
  closePair(p);
}

TEST_F(Loopback, MessageLargerThanReceiveIsAClearError) {
  Pair p = connectPair();
  std::vector<uint8_t> big(4096, 1), small(1024);
  void *sr = nullptr, *rr = nullptr;
  ASSERT_EQ(api::isend(p.send, big.data(), big.size(), 0, nullptr, &sr), ncclSuccess);
  void* d = small.data();
  size_t c = small.size();
  int tag = 0;
  ASSERT_EQ(api::irecv(p.recv, 1, &d, &c, &tag, nullptr, &rr), ncclSuccess);
  ASSERT_NE(rr, nullptr);
  ncclResult_t res = ncclSuccess;
  ASSERT_TRUE(waitFor([&] {
    int done = 0, sz = 0;
    if (sr) api::test(sr, &done, &sz);
    res = api::test(rr, &done, &sz);
    return res != ncclSuccess;
  }));
  EXPECT_EQ(res, ncclInvalidUsage);
  for (auto b : small) ASSERT_EQ(b, 0) << "no byte may be written past a failed receive";
  closePair(p);
}

TEST_F(Loopback, MalformedHandleIsRejected) {
  uint8_t h[128] = {1, 2, 3};
  void* s = nullptr;
  EXPECT_EQ(api::connect(0, h, &s), ncclInvalidArgument);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(api::connect(7, h, &s), ncclInvalidArgument);  // unknown device
}

// Stray connections (garbage, wrong secret, truncated HELLO) are dropped; the listener keeps
// working for real comms.
TEST_F(Loopback, StrayConnectionsDoNotDisturbTheListener) {
  Pair p0 = connectPair();
  wire::Handle h;
  std::string err;
  ASSERT_TRUE(wire::decodeHandle(p0.handle, 128, &h, &err));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(h.addrs[0].port);
  memcpy(&a.sin_addr, h.addrs[0].addr, 4);
  auto stray = [&](const void* bytes, size_t n) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(fd, (sockaddr*)&a, sizeof(a)), 0);
    if (n) { ASSERT_EQ(write(fd, bytes, n), (ssize_t)n); }
    close(fd);
  };
  char junk[64];
  memset(junk, 'x', sizeof(junk));
  stray(junk, sizeof(junk));
  wire::Hello bad;
  bad.secret = h.secret ^ 0xdeadbeef;  // wrong secret
  uint8_t hb[32];
  wire::encodeHello(bad, hb);
  stray(hb, sizeof(hb));
  stray(hb, 10);  // truncated
  stray(nullptr, 0);
  std::vector<size_t> sizes = {100, 200000, 0};
  exchange(p0, sizes, 1 << 20, 4);
  Pair p1 = connectPair();
  exchange(p1, sizes, 1 << 20, 4);
  closePair(p0);
  closePair(p1);
}

TEST_F(Loopback, ManyCommsAtOnce) {
  std::vector<Pair> ps;
  for (int i = 0; i < 16; ++i) ps.push_back(connectPair());
  for (auto& p : ps) exchange(p, {1000, 300000}, 1 << 20, 2);
  for (auto& p : ps) closePair(p);
}

TEST_F(Loopback, FinalizeAcceptsNullAndFailedContexts) {
  void* ctx = nullptr;
  ASSERT_EQ(api::initCtx(&ctx, 42, nullptr), ncclSuccess);
  EXPECT_EQ(api::finalizeCtx(ctx), ncclSuccess);
  EXPECT_EQ(api::finalizeCtx(nullptr), ncclSuccess);
}

}  // namespace

namespace {

// One listen comm accepts any number of connections (as NCCL's socket and IB transports do):
// three connects to copies of one handle give three recv comms, each carrying its own
// sender's bytes. After closeListen a new connect is refused at once with the cause.
TEST_F(Loopback, OneListenCommAcceptsManyConnections) {
  uint8_t handle[128] = {};
  void* lc = nullptr;
  ASSERT_EQ(api::listen(0, handle, &lc), ncclSuccess);
  const int n = 3;
  std::vector<std::vector<uint8_t>> h(n, std::vector<uint8_t>(handle, handle + 128));
  std::vector<void*> s(n, nullptr), r;
  ASSERT_TRUE(waitFor([&] {
    for (int i = 0; i < n; ++i)
      if (!s[i]) { EXPECT_EQ(api::connect(0, h[i].data(), &s[i]), ncclSuccess); }
    void* rc = nullptr;
    EXPECT_EQ(api::accept(lc, &rc), ncclSuccess) << "a second accept is not a usage error";
    if (rc) r.push_back(rc);
    return r.size() == (size_t)n && s[0] && s[1] && s[2];
  }));
  void* extra = nullptr;
  EXPECT_EQ(api::accept(lc, &extra), ncclSuccess);
  EXPECT_EQ(extra, nullptr) << "only three connections were made";
  // Which recv comm belongs to which send comm: each sender sends its index.
  std::vector<uint8_t> got(n, 0xff), ids(n);
  std::vector<void*> rq(n, nullptr), sq(n, nullptr);
  for (int j = 0; j < n; ++j) {
    void* d = &got[j];
    size_t c = 1;
    int tag = 0;
    ASSERT_EQ(api::irecv(r[j], 1, &d, &c, &tag, nullptr, &rq[j]), ncclSuccess);
  }
  for (int i = 0; i < n; ++i) {
    ids[i] = (uint8_t)i;
    ASSERT_EQ(api::isend(s[i], &ids[i], 1, 0, nullptr, &sq[i]), ncclSuccess);
  }
  ASSERT_TRUE(waitFor([&] {
    int all = 0;
    for (int i = 0; i < n; ++i) {
      int done = 0, size = 0;
      if (sq[i]) { EXPECT_EQ(api::test(sq[i], &done, &size), ncclSuccess); }
      if (done) sq[i] = nullptr;
      done = 0;
      if (rq[i]) { EXPECT_EQ(api::test(rq[i], &done, &size), ncclSuccess); }
      if (done) rq[i] = nullptr;
      all += !sq[i] && !rq[i];
    }
    return all == n;
  }));
  std::vector<Pair> pairs(n);
  std::vector<bool> seen(n, false);
  for (int j = 0; j < n; ++j) {
    ASSERT_LT(got[j], n);
    EXPECT_FALSE(seen[got[j]]) << "two recv comms got sender " << (int)got[j];
    seen[got[j]] = true;
    pairs[got[j]].send = s[got[j]];
    pairs[got[j]].recv = r[j];
  }
  for (auto& p : pairs) exchange(p, {0, 100, 300000, 4096}, 1 << 20, 4);
  ASSERT_EQ(api::closeListen(lc), ncclSuccess);
  // The listen comm is closed: a new connection to its handle is refused with the cause.
  std::vector<uint8_t> late(handle, handle + 128);
  void* ls = nullptr;
  ncclResult_t res = ncclSuccess;
  auto t0 = std::chrono::steady_clock::now();
  waitFor([&] {
    res = api::connect(0, late.data(), &ls);
    return res != ncclSuccess || ls != nullptr;
  });
  // connect may hand out the comm before the refusal arrives (as NCCL's socket transport
  // does); then the first send fails with it.
  if (res == ncclSuccess && ls) {
    uint8_t b = 1;
    void* q = nullptr;
    ASSERT_EQ(api::isend(ls, &b, 1, 0, nullptr, &q), ncclSuccess);
    waitFor([&] {
      int done = 0, size = 0;
      res = api::test(q, &done, &size);
      EXPECT_FALSE(done);
      return res != ncclSuccess;
    });
    api::closeSend(ls);
  }
  EXPECT_EQ(res, ncclSystemError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  for (auto& p : pairs) closePair(p);
}

TEST_F(Loopback, CallerMisuseIsAnInternalError) {
  void* rc = (void*)0x1;
  EXPECT_EQ(api::accept(nullptr, &rc), ncclInternalError);
  EXPECT_EQ(rc, nullptr);
  uint64_t junk[4] = {1, 2, 3, 4};
  EXPECT_EQ(api::accept(junk, &rc), ncclInternalError);
  int done = 0;
  EXPECT_EQ(api::test(junk, &done, nullptr), ncclInternalError);
  EXPECT_EQ(api::test(nullptr, &done, nullptr), ncclInternalError);
}

// Orderly close in both orders with megabytes in flight (the CLOSE on a data stream sits
// behind unread data): no path_down, flap or failover in the journal, no reconnect; the side
// that keeps testing a pending request gets an error naming the close.
TEST_F(Loopback, OrderlyCloseWithDataInFlightIsNeverAFault) {
  for (int senderFirst = 0; senderFirst < 2; ++senderFirst) {
    SCOPED_TRACE(senderFirst ? "sender closes first" : "receiver closes first");
    Pair p = connectPair();
    exchange(p, {1000, 200000}, 1 << 20, 2);
    size_t mark = journalSize();
    std::vector<uint8_t> big(4 << 20, 3), rb(4 << 20);
    std::vector<void*> sq;
    for (int i = 0; i < 4; ++i) {
      void* q = nullptr;
      ASSERT_EQ(api::isend(p.send, big.data(), big.size(), 0, nullptr, &q), ncclSuccess);
      sq.push_back(q);
    }
    void* d = rb.data();
    size_t c = rb.size();
    int tag = 0;
    void* rq = nullptr;
    ASSERT_EQ(api::irecv(p.recv, 1, &d, &c, &tag, nullptr, &rq), ncclSuccess);
    for (int i = 0; i < 200; ++i) {  // some of it moves, most stays in flight
      int done = 0, size = 0;
      api::test(sq[3], &done, &size);
      api::test(rq, &done, &size);
    }
    auto* sl = (SendLink*)p.send;
    uint32_t gen = sl->paths[0].generation;
    ncclResult_t res = ncclSuccess;
    if (senderFirst) {
      api::closeSend(p.send);
      for (int i = 0; i < 4; ++i) {  // the receiver keeps posting and testing
        void* q = nullptr;
        api::irecv(p.recv, 1, &d, &c, &tag, nullptr, &q);
      }
      waitFor([&] {
        int done = 0, size = 0;
        res = api::test(rq, &done, &size);
        return res != ncclSuccess || done;
      }, 3000);
      api::closeRecv(p.recv);
    } else {
      api::closeRecv(p.recv);
      waitFor([&] {
        int done = 0, size = 0;
        res = api::test(sq[3], &done, &size);
        return res != ncclSuccess;
      }, 3000);
      EXPECT_EQ(res, ncclSystemError) << "the pending send fails: its receiver is gone";
      EXPECT_TRUE(sl->peerClosed());
      EXPECT_EQ(sl->paths[0].generation, gen) << "no reconnect attempt";
      EXPECT_EQ(sl->paths[0].state, PathState::kClosed);
      EXPECT_NE(sl->paths[0].lastError.find("closed the comm"), std::string::npos) << sl->paths[0].lastError;
      api::closeSend(p.send);
    }
    auto bad = journalEvents(mark, {"path_down", "flap", "failover"});
    EXPECT_TRUE(bad.empty()) << bad.size() << " fault event(s), first: " << (bad.empty() ? "" : bad[0]);
  }
}

}  // namespace

// GPUDirect on TCP: host memory only (ptrSupport HOST; GPU memory and dmabufs are refused with
// an error, never a fake handle), and iflush has nothing to flush (a NULL request, NCCL's
// "done"), also for buffers that received bytes.
TEST_F(Loopback, HostMemoryOnlyAndIflushHasNothingToFlush) {
  api::Props props{};
  ASSERT_EQ(api::getProperties(0, &props), ncclSuccess);
  EXPECT_EQ(props.ptrSupport, RAILOVER_NCCL_PTR_HOST);
  Pair p = connectPair();
  char buf[64];
  void* mh = nullptr;
  EXPECT_EQ(api::regMr(p.recv, buf, sizeof(buf), RAILOVER_NCCL_PTR_CUDA, &mh), ncclSystemError);
  EXPECT_EQ(mh, nullptr);
  EXPECT_EQ(api::regMrDmaBuf(p.recv, buf, sizeof(buf), RAILOVER_NCCL_PTR_CUDA, 0, 3, &mh), ncclSystemError);
  EXPECT_EQ(mh, nullptr);
  ASSERT_EQ(api::regMr(p.recv, buf, sizeof(buf), RAILOVER_NCCL_PTR_HOST, &mh), ncclSuccess);
  void* data[1] = {buf};
  int sizes[1] = {64};
  void* mhs[1] = {mh};
  void* req = (void*)0x1;
  EXPECT_EQ(api::iflush(p.recv, 1, data, sizes, mhs, &req), ncclSuccess);
  EXPECT_EQ(req, nullptr);
  EXPECT_EQ(api::iflush(p.recv, 0, data, sizes, mhs, &req), ncclInternalError) << "n out of range";
  EXPECT_EQ(api::deregMr(p.recv, mh), ncclSuccess);
  closePair(p);
}

// NCCL deregisters buffers before it closes a comm, also with messages still in flight on
// them (receives posted and never matched, a send whose ACK never came, an abort): those
// messages forget the registration and the comm stops moving data, quietly (no fatal, no
// journal event: a normal teardown), so nothing of it reads a registration the caller then
// frees; a request tested after that fails. A registration with nothing in flight on it goes
// without stopping anything.
TEST_F(Loopback, DeregisteringABufferWithMessagesInFlightStopsTheComm) {
  size_t mark = journalSize();
  Pair p = connectPair();
  std::vector<uint8_t> rbuf(4096), sbuf(4096, 7), idle(64);
  void *rmh = nullptr, *smh = nullptr, *idleMh = nullptr;
  ASSERT_EQ(api::regMr(p.recv, rbuf.data(), rbuf.size(), RAILOVER_NCCL_PTR_HOST, &rmh), ncclSuccess);
  ASSERT_EQ(api::regMr(p.recv, idle.data(), idle.size(), RAILOVER_NCCL_PTR_HOST, &idleMh), ncclSuccess);
  ASSERT_EQ(api::regMr(p.send, sbuf.data(), sbuf.size(), RAILOVER_NCCL_PTR_HOST, &smh), ncclSuccess);
  // A receive posted and never matched (nothing is sent).
  void* d = rbuf.data();
  size_t cap = rbuf.size();
  int tag = 1;
  void* rreq = nullptr;
  ASSERT_EQ(api::irecv(p.recv, 1, &d, &cap, &tag, &rmh, &rreq), ncclSuccess);
  ASSERT_NE(rreq, nullptr);
  int done = 0, size = 0;
  ASSERT_EQ(api::test(rreq, &done, &size), ncclSuccess);
  EXPECT_EQ(done, 0);
  ASSERT_EQ(api::deregMr(p.recv, idleMh), ncclSuccess);
  ASSERT_EQ(api::test(rreq, &done, &size), ncclSuccess) << "nothing was in flight on that one";
  ASSERT_EQ(api::deregMr(p.recv, rmh), ncclSuccess);
  EXPECT_EQ(api::test(rreq, &done, &size), ncclInternalError) << "the receive lost its buffer's registration";
  EXPECT_EQ(done, 0);
  EXPECT_FALSE(((Link*)p.recv)->isFatal()) << "a teardown, not a fault";
  EXPECT_NE(((Link*)p.recv)->deregMsg.find("deregistered"), std::string::npos) << ((Link*)p.recv)->deregMsg;
  EXPECT_TRUE(((Link*)p.send)->deregMsg.empty()) << "the other comm is not concerned";
  ASSERT_EQ(api::deregMr(p.send, smh), ncclSuccess);
  EXPECT_TRUE(((Link*)p.send)->deregMsg.empty()) << "no send was in flight on it";
  closePair(p);

  // A send not yet acknowledged (its receive is never posted) loses its registration.
  Pair q = connectPair();
  ASSERT_EQ(api::regMr(q.send, sbuf.data(), sbuf.size(), RAILOVER_NCCL_PTR_HOST, &smh), ncclSuccess);
  void* sreq = nullptr;
  for (int i = 0; i < 1000 && !sreq; ++i) ASSERT_EQ(api::isend(q.send, sbuf.data(), sbuf.size(), 1, smh, &sreq), ncclSuccess);
  ASSERT_NE(sreq, nullptr);
  ASSERT_EQ(api::test(sreq, &done, &size), ncclSuccess);
  EXPECT_EQ(done, 0);
  ASSERT_EQ(api::deregMr(q.send, smh), ncclSuccess);
  EXPECT_EQ(api::test(sreq, &done, &size), ncclInternalError);
  EXPECT_FALSE(((Link*)q.send)->isFatal());
  EXPECT_NE(((Link*)q.send)->deregMsg.find("deregistered"), std::string::npos) << ((Link*)q.send)->deregMsg;
  closePair(q);
  auto bad = journalEvents(mark, {"fatal", "path_down", "failover"});
  EXPECT_TRUE(bad.empty()) << bad.size() << " event(s), first: " << (bad.empty() ? "" : bad[0]);
}
