#include "transport/tcp/socket.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/nic_socket.h"

namespace railover {
namespace tcp {

void setNonBlocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void setPort(sockaddr_storage* a, uint16_t port) {
  if (a->ss_family == AF_INET) ((sockaddr_in*)a)->sin_port = htons(port);
  else ((sockaddr_in6*)a)->sin6_port = htons(port);
}

static uint16_t getPort(const sockaddr_storage& a) {
  return ntohs(a.ss_family == AF_INET ? ((const sockaddr_in&)a).sin_port : ((const sockaddr_in6&)a).sin6_port);
}

int listenOn(const sockaddr_storage& addrIn, socklen_t len, uint16_t* port, std::string* err,
             const std::string& ifname) {
  sockaddr_storage addr = addrIn;
  setPort(&addr, *port);
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return *err = std::string("socket: ") + strerror(errno), -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // IP_FREEBIND lets the listener survive (and be re-created) while the address is absent.
  setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof(one));
  if (!bindDeviceOrFail(fd, ifname, err)) {
    close(fd);
    return -1;
  }
  if (bind(fd, (sockaddr*)&addr, len) != 0 || listen(fd, 1024) != 0) {
    *err = std::string("bind/listen: ") + strerror(errno);
    close(fd);
    return -1;
  }
  sockaddr_storage bound{};
  socklen_t bl = sizeof(bound);
  getsockname(fd, (sockaddr*)&bound, &bl);
  *port = getPort(bound);
  return fd;
}

void tuneStream(int fd, const StreamTuning& tuning) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (tuning.userTimeoutMs) {
    unsigned int t = tuning.userTimeoutMs;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &t, sizeof(t));
  }
  if (tuning.keepaliveS) {
    int s = static_cast<int>(tuning.keepaliveS);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &s, sizeof(s));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &s, sizeof(s));
  }
}

int startConnect(const sockaddr_storage& srcIn, socklen_t srcLen, const std::string& ifname,
                 const sockaddr_storage& dst, socklen_t dstLen, const StreamTuning& tuning, std::string* err) {
  int fd = socket(dst.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return *err = std::string("socket: ") + strerror(errno), -1;
  sockaddr_storage src = srcIn;
  setPort(&src, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  // Device first, then address: the route lookup of connect() is then confined to this NIC.
  if (!bindDeviceOrFail(fd, ifname, err)) {
    close(fd);
    return -1;
  }
  if (bind(fd, (sockaddr*)&src, srcLen) != 0) {
    *err = std::string("bind source address: ") + strerror(errno);
    close(fd);
    return -1;
  }
  tuneStream(fd, tuning);
  if (connect(fd, (const sockaddr*)&dst, dstLen) != 0 && errno != EINPROGRESS) {
    *err = std::string("connect: ") + strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

int connectDone(int fd, std::string* err) {
  int soerr = 0;
  socklen_t l = sizeof(soerr);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l) != 0) return *err = strerror(errno), -1;
  if (soerr) return *err = std::string("connect: ") + strerror(soerr), -1;
  sockaddr_storage peer;
  socklen_t pl = sizeof(peer);
  if (getpeername(fd, (sockaddr*)&peer, &pl) == 0) return 1;
  if (errno == ENOTCONN) return 0;
  return *err = std::string("getpeername: ") + strerror(errno), -1;
}

ssize_t sendSome(int fd, const void* buf, size_t len, std::string* err) {
  ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return n;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  *err = strerror(errno);
  return -1;
}

ssize_t recvSome(int fd, void* buf, size_t len, std::string* err) {
  ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
  if (n > 0) return n;
  if (n == 0) return *err = "connection closed by peer", -1;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  *err = strerror(errno);
  return -1;
}

}  // namespace tcp
}  // namespace railover
