// The TCP transport's acceptor (transport/tcp/acceptor.h) on its own, over real loopback
// sockets: a stream with a valid HELLO reaches the router with its identity; truncated HELLOs,
// garbage and silent streams are dropped with their logged reason and never reach the router;
// a stream no comm owns is refused with NACK(unknown comm), a liveness check (connection id 0)
// is closed without a word; many streams per listener; a second listen for a NIC (the NIC
// moved) replaces its listener; the acceptor closes every socket it opened.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "tests/log_capture.h"
#include "common/nic.h"
#include "transport/tcp/acceptor.h"
#include "transport/tcp/wire.h"

using namespace railover;

namespace {

// Bounds for waiting on the acceptor thread: generous, a loaded host is the normal case.
constexpr int kWaitMs = 20000;

bool waitFor(const std::function<bool()>& f, int ms = kWaitMs) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    poll(nullptr, 0, 5);
  }
  return f();
}

// Every log line, captured through the NCCL logger hook (tests/log_capture.h).
size_t logLinesWith(const std::string& s) { return testlog::count(s); }

int openFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory stream's own fd
}

// Records what the acceptor routes; keeps the streams it takes (so the test can use them) or
// refuses them all (route returns false, as the engine does for an unknown comm).
class RecordingRouter : public StreamRouter {
 public:
  struct Routed {
    StreamHello hello;
    std::string peer;
    int nic;
    std::unique_ptr<Conn> conn;
  };
  bool take = true;  // set before the acceptor starts (its thread reads it)
  bool route(std::unique_ptr<Conn>& c, const StreamHello& h, const sockaddr_storage& peer, int localNic) override {
    std::lock_guard<std::mutex> g(mu);
    Routed r{h, addrToString(peer), localNic, nullptr};
    if (take) r.conn = std::move(c);
    routed.push_back(std::move(r));
    return take;
  }
  size_t count() {
    std::lock_guard<std::mutex> g(mu);
    return routed.size();
  }
  std::mutex mu;
  std::vector<Routed> routed;
};

sockaddr_storage v4(const char* ip, uint16_t port = 0) {
  sockaddr_storage s{};
  auto& a = (sockaddr_in&)s;
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return s;
}

// A blocking client stream to ip:port (-1 when the connect fails).
int dial(const char* ip, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage a = v4(ip, port);
  if (connect(fd, (sockaddr*)&a, sizeof(sockaddr_in)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

wire::Hello hello(uint64_t connId, uint8_t stream = 0) {
  wire::Hello h;
  h.secret = 0x1234567890abcdefULL;
  h.connId = connId;
  h.path = 1;
  h.srcRail = 3;
  h.probePort = 4242;
  h.generation = 7;
  h.stream = stream;
  h.nStreams = 2;
  return h;
}

void sendHello(int fd, const wire::Hello& h) {
  uint8_t b[wire::kFrameBytes];
  wire::encodeHello(h, b);
  ASSERT_EQ(write(fd, b, sizeof(b)), (ssize_t)sizeof(b));
}

// Reads until EOF (or kWaitMs): the bytes the acceptor sent before closing. *eof false when
// the stream stayed open.
std::string readToEof(int fd, bool* eof) {
  std::string got;
  *eof = false;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char b[256];
    ssize_t n = read(fd, b, sizeof(b));
    if (n <= 0) {
      *eof = true;
      break;
    }
    got.append(b, (size_t)n);
  }
  return got;
}

class AcceptorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testlog::clear();
    setLogger(&testlog::capture);
  }
  void TearDown() override { setLogger(nullptr); }
  // An acceptor for one NIC, "lo", listening on 127.0.0.1 (ephemeral port: port_).
  std::unique_ptr<tcp::Acceptor> start(uint64_t helloTimeoutUs = tuning::kHelloTimeoutUs, int waitMs = 50) {
    std::unique_ptr<tcp::Acceptor> a(new tcp::Acceptor({"lo"}, tcp::StreamTuning{5000, 0}, &router_, helloTimeoutUs, waitMs));
    std::string err;
    port_ = 0;
    sockaddr_storage s = v4("127.0.0.1");
    EXPECT_TRUE(a->listen(0, s, sizeof(sockaddr_in), &port_, &err)) << err;
    EXPECT_NE(port_, 0);
    return a;
  }
  RecordingRouter router_;
  uint16_t port_ = 0;
};

TEST_F(AcceptorTest, StreamWithValidHelloReachesTheRouterWithItsIdentity) {
  auto acc = start();
  int fd = dial("127.0.0.1", port_);
  ASSERT_GE(fd, 0);
  sendHello(fd, hello(99, 1));
  ASSERT_TRUE(waitFor([&] { return router_.count() == 1; }));
  auto& r = router_.routed[0];
  EXPECT_EQ(r.hello.id.secret, 0x1234567890abcdefULL);
  EXPECT_EQ(r.hello.id.connId, 99u);
  EXPECT_EQ(r.hello.id.pathIndex, 1);
  EXPECT_EQ(r.hello.id.srcRail, 3);
  EXPECT_EQ(r.hello.id.probePort, 4242);
  EXPECT_EQ(r.hello.id.generation, 7u);
  EXPECT_EQ(r.hello.stream, 1);
  EXPECT_EQ(r.hello.nStreams, 2);
  EXPECT_EQ(r.peer, "127.0.0.1");
  EXPECT_EQ(r.nic, 0);
  // The routed Conn is the accepted stream itself: bytes go both ways.
  ASSERT_TRUE(r.conn);
  std::string err;
  ASSERT_TRUE(writeAll(*r.conn, "ping", 4, &err)) << err;
  char b[4];
  ASSERT_EQ(read(fd, b, 4), 4);
  EXPECT_EQ(std::string(b, 4), "ping");
  ASSERT_EQ(write(fd, "pong", 4), 4);
  std::string got;
  ASSERT_TRUE(waitFor([&] {
    char c[8];
    ssize_t n = r.conn->read(c, sizeof(c), &err);
    if (n > 0) got.append(c, (size_t)n);
    return got.size() >= 4;
  }));
  EXPECT_EQ(got, "pong");
  EXPECT_EQ(logLinesWith("dropping connection"), 0u);
  close(fd);
}

TEST_F(AcceptorTest, TruncatedHelloGarbageAndSilentStreamsAreDroppedWithTheirReason) {
  // 2 s HELLO deadline (the product's is tuning::kHelloTimeoutUs, 5 s), checked every 50 ms;
  // long enough that the truncated and garbage streams are judged by their bytes, not by it.
  auto acc = start(2000000, 50);
  // Truncated: 10 bytes of a HELLO, then the sender closes.
  int t = dial("127.0.0.1", port_);
  ASSERT_GE(t, 0);
  uint8_t hb[wire::kFrameBytes];
  wire::encodeHello(hello(5), hb);
  ASSERT_EQ(write(t, hb, 10), 10);
  close(t);
  // Garbage: 32 bytes that are not a HELLO; the acceptor closes the stream.
  int g = dial("127.0.0.1", port_);
  ASSERT_GE(g, 0);
  char junk[wire::kFrameBytes];
  memset(junk, 'x', sizeof(junk));
  ASSERT_EQ(write(g, junk, sizeof(junk)), (ssize_t)sizeof(junk));
  // Silent: connects and says nothing.
  auto silentStart = std::chrono::steady_clock::now();
  int s = dial("127.0.0.1", port_);
  ASSERT_GE(s, 0);

  ASSERT_TRUE(waitFor([&] {
    return logLinesWith("WARN railover: dropping connection from 127.0.0.1 on NIC lo: closed before a complete HELLO "
                        "(truncated HELLO)") == 1;
  }));
  ASSERT_TRUE(waitFor([&] { return logLinesWith("WARN railover: dropping connection from 127.0.0.1 on NIC lo: bad HELLO: ") == 1; }));
  bool eof = false;
  EXPECT_EQ(readToEof(g, &eof), "") << "nothing is said to garbage";
  EXPECT_TRUE(eof) << "the garbage stream is closed";
  EXPECT_EQ(readToEof(s, &eof), "");
  EXPECT_TRUE(eof) << "the silent stream is closed";
  double silentS = std::chrono::duration<double>(std::chrono::steady_clock::now() - silentStart).count();
  EXPECT_GE(silentS, 2.0) << "the silent stream was dropped before its HELLO deadline";
  EXPECT_EQ(logLinesWith("WARN railover: dropping connection from 127.0.0.1 on NIC lo: no HELLO within 2 s"), 1u);
  EXPECT_EQ(router_.count(), 0u) << "no stray reaches the router";
  close(g);
  close(s);
  // The listener keeps working.
  int ok = dial("127.0.0.1", port_);
  ASSERT_GE(ok, 0);
  sendHello(ok, hello(6));
  EXPECT_TRUE(waitFor([&] { return router_.count() == 1; }));
  close(ok);
}

// A stream closed before it sent a byte is a connect its initiator gave up (a railover sender
// restarting a connect after a repair does this during every outage; a port probe too): an
// INFO line, not a WARN. A stream that sent part of a HELLO stays a WARN (test above).
TEST_F(AcceptorTest, AStreamClosedBeforeSendingAnythingIsNotAWarning) {
  auto acc = start(2000000, 50);
  int fd = dial("127.0.0.1", port_);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(waitFor([&] {
    return logLinesWith("INFO railover: dropping connection from 127.0.0.1 on NIC lo: closed before sending anything") == 1;
  }));
  EXPECT_EQ(logLinesWith("WARN railover: dropping connection"), 0u);
  EXPECT_EQ(router_.count(), 0u);
}

TEST_F(AcceptorTest, ProductHelloDeadlineIsFiveSecondsInTheLog) {
  // The default deadline, as the plugin runs it: a silent stream is dropped after 5 s with
  // the log line operators know, not earlier.
  auto acc = start();
  auto t0 = std::chrono::steady_clock::now();
  int s = dial("127.0.0.1", port_);
  ASSERT_GE(s, 0);
  ASSERT_TRUE(waitFor([&] { return logLinesWith("on NIC lo: no HELLO within 5 s") == 1; }, 30000));
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  close(s);
}

TEST_F(AcceptorTest, UnknownCommIsRefusedWithNackAndLivenessCheckClosedQuietly) {
  router_.take = false;  // no comm owns anything
  auto acc = start();
  int u = dial("127.0.0.1", port_);
  ASSERT_GE(u, 0);
  sendHello(u, hello(77));
  bool eof = false;
  std::string got = readToEof(u, &eof);
  EXPECT_TRUE(eof);
  ASSERT_EQ(got.size(), wire::kFrameBytes) << "one NACK frame, then the stream is closed";
  wire::Frame f;
  std::string err;
  ASSERT_TRUE(wire::decodeFrame(got.data(), &f, &err)) << err;
  EXPECT_EQ(f.type, wire::kNack);
  EXPECT_EQ(f.seq, wire::kNackUnknownComm);
  EXPECT_EQ(logLinesWith("INFO railover: refusing connection from 127.0.0.1 on NIC lo: unknown or closed comm (NACK sent)"), 1u);
  close(u);

  int l = dial("127.0.0.1", port_);
  ASSERT_GE(l, 0);
  sendHello(l, hello(0));  // a peer's liveness check
  got = readToEof(l, &eof);
  EXPECT_TRUE(eof);
  EXPECT_EQ(got, "") << "a liveness check gets no NACK";
  EXPECT_EQ(router_.count(), 2u) << "both were offered to the router, which refused them";
  EXPECT_EQ(logLinesWith("refusing connection"), 1u);
  EXPECT_EQ(logLinesWith("dropping connection"), 0u);
  close(l);
}

TEST_F(AcceptorTest, ManyStreamsOnOneListener) {
  auto acc = start();
  const int n = 40;
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = dial("127.0.0.1", port_);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  // HELLOs written in reverse order of connection: every stream is waited for on its own.
  for (int i = n - 1; i >= 0; --i) sendHello(fds[i], hello(1000 + i, (uint8_t)(i % 2)));
  ASSERT_TRUE(waitFor([&] { return router_.count() == (size_t)n; }));
  std::vector<bool> seen(n, false);
  for (auto& r : router_.routed) {
    ASSERT_GE(r.hello.id.connId, 1000u);
    ASSERT_LT(r.hello.id.connId, 1000u + n);
    seen[r.hello.id.connId - 1000] = true;
  }
  for (int i = 0; i < n; ++i) EXPECT_TRUE(seen[i]) << "stream " << i;
  for (int fd : fds) close(fd);
}

TEST_F(AcceptorTest, SecondListenForANicReplacesItsListener) {
  auto acc = start();
  uint16_t port = port_;
  // The NIC "moved" to 127.0.0.2: listen there on the same port.
  std::string err;
  sockaddr_storage moved = v4("127.0.0.2");
  ASSERT_TRUE(acc->listen(0, moved, sizeof(sockaddr_in), &port, &err)) << err;
  EXPECT_EQ(port, port_);
  int fd = dial("127.0.0.2", port);
  ASSERT_GE(fd, 0);
  sendHello(fd, hello(11));
  ASSERT_TRUE(waitFor([&] { return router_.count() == 1; }));
  EXPECT_EQ(router_.routed[0].peer, "127.0.0.1");  // the client's own source address
  close(fd);
  // The old address's listener is closed once the acceptor took the new one.
  EXPECT_TRUE(waitFor([&] {
    int old = dial("127.0.0.1", port_);
    if (old >= 0) close(old);
    return old < 0;
  }));
  // A port that is taken fails with the cause, and the NIC keeps its listener.
  int blocker = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage b = v4("127.0.0.3");
  ASSERT_EQ(bind(blocker, (sockaddr*)&b, sizeof(sockaddr_in)), 0);
  ASSERT_EQ(::listen(blocker, 1), 0);
  socklen_t bl = sizeof(b);
  getsockname(blocker, (sockaddr*)&b, &bl);
  uint16_t taken = ntohs(((sockaddr_in&)b).sin_port);
  sockaddr_storage third = v4("127.0.0.3");
  err.clear();
  EXPECT_FALSE(acc->listen(0, third, sizeof(sockaddr_in), &taken, &err));
  EXPECT_NE(err.find("bind/listen"), std::string::npos) << err;
  close(blocker);
  fd = dial("127.0.0.2", port);
  ASSERT_GE(fd, 0);
  sendHello(fd, hello(12));
  EXPECT_TRUE(waitFor([&] { return router_.count() == 2; }));
  close(fd);
}

TEST_F(AcceptorTest, NicOutOfRangeIsRefused) {
  tcp::Acceptor a({"lo"}, tcp::StreamTuning{5000, 0}, &router_);
  uint16_t port = 0;
  std::string err;
  EXPECT_FALSE(a.listen(1, v4("127.0.0.1"), sizeof(sockaddr_in), &port, &err));
  EXPECT_NE(err.find("NIC index 1 out of range (1 NICs)"), std::string::npos) << err;
}

// Everything the acceptor opened (epoll, eventfd, listeners old and new, streams still waiting
// for a HELLO, strays) is closed when it is destroyed; routed streams belong to the router.
TEST_F(AcceptorTest, NoFileDescriptorLeak) {
  int before = openFds();
  ASSERT_GT(before, 0);
  {
    auto acc = start(500000, 50);
    uint16_t port = port_;
    std::string err;
    ASSERT_TRUE(acc->listen(0, v4("127.0.0.2"), sizeof(sockaddr_in), &port, &err)) << err;
    int good = dial("127.0.0.2", port);
    ASSERT_GE(good, 0);
    sendHello(good, hello(21));
    int junk = dial("127.0.0.2", port);
    ASSERT_GE(junk, 0);
    ASSERT_EQ(write(junk, "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", 32), 32);
    int silent = dial("127.0.0.2", port);  // still waiting for its HELLO when the acceptor ends
    ASSERT_GE(silent, 0);
    ASSERT_TRUE(waitFor([&] { return router_.count() == 1 && logLinesWith("bad HELLO") == 1; }));
    {
      std::lock_guard<std::mutex> g(router_.mu);
      router_.routed.clear();  // the routed stream's Conn closes its socket
    }
    acc.reset();
    close(good);
    close(junk);
    close(silent);
  }
  EXPECT_EQ(openFds(), before);
}

}  // namespace
