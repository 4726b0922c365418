// The data-stream keepalive (tcp::tuneStream, RAILOVER_TCP_KEEPALIVE_S) over real loopback
// sockets: a stream whose peer vanished without a FIN or a RST reaching us (here: the peer's
// socket closed in TCP_REPAIR mode, which sends nothing, as a socket its kernel gave up during
// an outage sends nothing that arrives) is reset by the keepalive while it is idle; without
// the keepalive it waits for ever; a live, idle peer answers the keepalives and the stream
// stays up. The silent close needs CAP_NET_ADMIN: skipped without it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"

using namespace railover;

namespace {

// Generous bounds: a loaded host is the normal case. The keepalive fires after 1 s idle.
constexpr int kFoundWithinMs = 20000;
// How long a stream is watched to show that nothing happens: four keepalive periods.
constexpr int kQuietMs = 4000;

struct Pair {
  int client = -1, server = -1;
  ~Pair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

// A connected loopback pair; the client side gets `tuning` (as a sender's stream does).
void connectPair(const tcp::StreamTuning& tuning, Pair* p) {
  sockaddr_storage a{};
  auto* in = reinterpret_cast<sockaddr_in*>(&a);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  uint16_t port = 0;
  std::string err;
  int lfd = tcp::listenOn(a, sizeof(sockaddr_in), &port, &err);
  ASSERT_GE(lfd, 0) << err;
  sockaddr_storage dst = a;
  reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(port);
  p->client = tcp::startConnect(a, sizeof(sockaddr_in), "", dst, sizeof(sockaddr_in), tuning, &err);
  ASSERT_GE(p->client, 0) << err;
  pollfd pf{lfd, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kFoundWithinMs), 1) << "no connection to accept";
  p->server = accept(lfd, nullptr, nullptr);
  close(lfd);
  ASSERT_GE(p->server, 0) << strerror(errno);
  int rc = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFoundWithinMs);
  while ((rc = tcp::connectDone(p->client, &err)) == 0 && std::chrono::steady_clock::now() < end) poll(nullptr, 0, 1);
  ASSERT_EQ(rc, 1) << err;
}

// Closes `fd` without a FIN or a RST on the wire. false when the process may not (no
// CAP_NET_ADMIN).
bool closeSilently(int* fd) {
  int one = 1;
  if (setsockopt(*fd, IPPROTO_TCP, TCP_REPAIR, &one, sizeof(one)) != 0) return false;
  close(*fd);
  *fd = -1;
  return true;
}

// Waits up to `ms` for the client stream to become readable or fail; returns what a read then
// says: "" = still open with nothing to read (timed out), else the error or "closed by peer".
std::string waitForEnd(int fd, int ms) {
  pollfd pf{fd, POLLIN, 0};
  if (poll(&pf, 1, ms) == 0) return "";
  char b;
  std::string err;
  ssize_t n = tcp::recvSome(fd, &b, 1, &err);
  if (n < 0) return err.empty() ? "error" : err;
  return n == 0 ? "" : "unexpected byte";
}

}  // namespace

TEST(StreamKeepalive, AnIdleStreamWhosePeerVanishedSilentlyIsResetByTheKeepalive) {
  Pair p;
  connectPair(tcp::StreamTuning{10000, 1}, &p);
  if (HasFatalFailure()) return;
  if (!closeSilently(&p.server)) GTEST_SKIP() << "TCP_REPAIR needs CAP_NET_ADMIN";
  auto t0 = std::chrono::steady_clock::now();
  std::string end = waitForEnd(p.client, kFoundWithinMs);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(end.find("reset"), std::string::npos)
      << "the keepalive did not find the vanished peer within " << kFoundWithinMs << " ms: '" << end << "'";
  RecordProperty("found_after_ms", static_cast<int>(ms));
}

TEST(StreamKeepalive, WithoutTheKeepaliveAnIdleStreamWaitsOnAVanishedPeer) {
  Pair p;
  connectPair(tcp::StreamTuning{10000, 0}, &p);
  if (HasFatalFailure()) return;
  if (!closeSilently(&p.server)) GTEST_SKIP() << "TCP_REPAIR needs CAP_NET_ADMIN";
  EXPECT_EQ(waitForEnd(p.client, kQuietMs), "") << "the silent close was not silent: the test proves nothing";
}

TEST(StreamKeepalive, ALiveIdlePeerAnswersTheKeepalivesAndTheStreamStaysUp) {
  Pair p;
  connectPair(tcp::StreamTuning{10000, 1}, &p);
  if (HasFatalFailure()) return;
  EXPECT_EQ(waitForEnd(p.client, kQuietMs), "") << "an idle stream to a live peer was ended";
  int on = 0;
  socklen_t l = sizeof(on);
  ASSERT_EQ(getsockopt(p.client, SOL_SOCKET, SO_KEEPALIVE, &on, &l), 0);
  EXPECT_EQ(on, 1) << "keepalive not set on the stream";
  const char x = 'x';
  ASSERT_EQ(send(p.client, &x, 1, 0), 1);
  char y = 0;
  pollfd pf{p.server, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kFoundWithinMs), 1);
  EXPECT_EQ(recv(p.server, &y, 1, 0), 1);
  EXPECT_EQ(y, 'x') << "the stream no longer carries data";
}

// Conn::sentAllAcked over real loopback sockets (the RDMA bootstrap's "the peer's kernel took
// our request" test, SendPath::connectWaitsOffNetwork): bytes the peer's process never read are
// acknowledged by its kernel all the same (true); bytes held back by a full receive window
// are not (false) until the peer reads and its kernel takes them (true again).
TEST(TcpConnAcks, SentAllAckedOnlyOnceThePeersKernelTookEveryByte) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connectPair(tcp::StreamTuning{}, &p));
  TcpConn c(p.client);
  p.client = -1;  // c closes it
  std::string err;
  ASSERT_EQ(c.connectState(&err), 1) << err;
  auto within = [](const std::function<bool()>& cond) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFoundWithinMs);
    while (!cond() && std::chrono::steady_clock::now() < end) poll(nullptr, 0, 1);
    return cond();
  };
  EXPECT_TRUE(within([&] { return c.sentAllAcked(); })) << "nothing written yet";
  char hello[64];
  memset(hello, 0x5a, sizeof hello);
  iovec iov{hello, sizeof hello};
  ASSERT_EQ(c.writev(&iov, 1, &err), (ssize_t)sizeof hello) << err;
  EXPECT_TRUE(within([&] { return c.sentAllAcked(); })) << "the peer's kernel did not acknowledge 64 bytes its process did not read";
  // Fill the peer's receive buffer and our send buffer: the rest waits behind a zero window.
  std::vector<char> big(1 << 20, 0x33);
  size_t queued = 0;
  for (int i = 0; i < 4096; ++i) {
    iovec b{big.data(), big.size()};
    ssize_t n = c.writev(&b, 1, &err);
    ASSERT_GE(n, 0) << err;
    if (n == 0) break;
    queued += (size_t)n;
  }
  ASSERT_GT(queued, 0u);
  EXPECT_FALSE(c.sentAllAcked()) << queued << " bytes queued behind a full window";
  // The peer reads everything: its kernel takes and acknowledges the rest.
  size_t drained = 0;
  EXPECT_TRUE(within([&] {
    char buf[1 << 16];
    ssize_t n;
    while ((n = recv(p.server, buf, sizeof buf, MSG_DONTWAIT)) > 0) drained += (size_t)n;
    return drained == queued + sizeof hello && c.sentAllAcked();
  })) << drained << " of " << queued + sizeof hello << " bytes read";
}
