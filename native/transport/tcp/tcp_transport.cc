#include "transport/tcp/tcp_transport.h"

#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "transport/tcp/acceptor.h"
#include "transport/tcp/socket.h"

namespace railover {

bool writeAll(Conn& c, const void* buf, size_t len, std::string* err) {
  iovec iov{(void*)buf, len};
  ssize_t n = c.writev(&iov, 1, err);
  if (n == (ssize_t)len) return true;
  if (n >= 0) *err = "short write of a control frame";
  return false;
}

TcpConn::~TcpConn() {
  if (fd_ >= 0) ::close(fd_);
}

int TcpConn::connectState(std::string* err) {
  if (connected_) return 1;
  int r = tcp::connectDone(fd_, err);
  if (r == 1) connected_ = true;
  return r;
}

ssize_t TcpConn::writev(const iovec* iov, int n, std::string* err) {
  msghdr mh{};
  mh.msg_iov = const_cast<iovec*>(iov);
  mh.msg_iovlen = n;
  ssize_t r = sendmsg(fd_, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r >= 0) return r;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  *err = strerror(errno);
  return -1;
}

ssize_t TcpConn::read(void* buf, size_t len, std::string* err) { return tcp::recvSome(fd_, buf, len, err); }

bool TcpConn::dead(std::string* err) {
  char b;
  ssize_t n = recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return *err = "closed by peer", true;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return *err = strerror(errno), true;
  return false;
}

uint32_t TcpConn::unackedSilenceMs() {
  tcp_info ti{};
  socklen_t l = sizeof(ti);
  if (getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0 || ti.tcpi_unacked == 0) return 0;
  return ti.tcpi_last_ack_recv;
}

bool TcpConn::peerAckedWithinMs(uint32_t ms) {
  tcp_info ti{};
  socklen_t l = sizeof(ti);
  if (getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0 || ti.tcpi_unacked == 0) return false;
  return ti.tcpi_last_ack_recv < ms;
}

bool TcpConn::sentAllAcked() {
  tcp_info ti{};
  socklen_t l = sizeof(ti);
  if (getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0 || ti.tcpi_state != TCP_ESTABLISHED) return false;
  int outq = 0;  // bytes written and not yet acknowledged, sent or not
  return ioctl(fd_, SIOCOUTQ, &outq) == 0 && outq == 0;
}

TcpTransport::TcpTransport(const std::vector<Nic>* nics, const Config* cfg) : nics_(nics), cfg_(cfg) {}

TcpTransport::~TcpTransport() = default;

bool TcpTransport::listen(int nic, const sockaddr_storage& addr, socklen_t len, uint16_t* port, StreamRouter* router,
                          std::string* err) {
  std::lock_guard<std::mutex> g(acceptorMu_);
  if (!acceptor_) {
    std::vector<std::string> names;
    for (const Nic& n : *nics_) names.push_back(n.name);
    acceptor_.reset(new tcp::Acceptor(std::move(names), tuning(), router));
    router_ = router;
  } else if (router != router_) {
    *err = "the TCP transport already hands its streams to another router";
    return false;
  }
  return acceptor_->listen(nic, addr, len, port, err);
}

std::unique_ptr<Conn> TcpTransport::connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) {
  socklen_t srcLen = 0;
  sockaddr_storage src = (*nics_)[nic].getAddr(&srcLen);
  int fd = tcp::startConnect(src, srcLen, (*nics_)[nic].name, remote, len, tuning(), err);
  if (fd < 0) return nullptr;
  return std::unique_ptr<Conn>(new TcpConn(fd));
}

}  // namespace railover
