// In-process tests of the plugin API over loopback TCP: connect/accept, in-order exact
// delivery of many message sizes (including 0 bytes), receive buffers larger than sends,
// the 32-request window, message-too-large errors and stray/bad connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "plugin/api.h"
#include "transport/tcp/wire.h"

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
    ASSERT_EQ(api::init(nullptr), ncclSuccess);
  }
  Pair connectPair() {
    Pair p;
    memset(p.handle, 0, sizeof(p.handle));
    EXPECT_EQ(api::listen(0, p.handle, &p.listen), ncclSuccess);
    EXPECT_TRUE(waitFor([&] {
      if (!p.send) EXPECT_EQ(api::connect(0, p.handle, &p.send), ncclSuccess);
      if (!p.recv) EXPECT_EQ(api::accept(p.listen, &p.recv), ncclSuccess);
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
    if (n) ASSERT_EQ(write(fd, bytes, n), (ssize_t)n);
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
