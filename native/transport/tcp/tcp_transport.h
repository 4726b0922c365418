// TCP implementation of the transport interface: source-bound, non-blocking sockets.
#pragma once

#include <vector>

#include "common/config.h"
#include "plugin/devices.h"
#include "transport/tcp/stream_path.h"
#include "transport/transport.h"

namespace railover {

class TcpConn : public Conn {
 public:
  explicit TcpConn(int fd) : fd_(fd) {}
  ~TcpConn() override;
  int connectState(std::string* err) override;
  ssize_t writev(const iovec* iov, int n, std::string* err) override;
  ssize_t read(void* buf, size_t len, std::string* err) override;
  bool dead(std::string* err) override;
  uint32_t unackedSilenceMs() override;
  bool peerAckedWithinMs(uint32_t ms) override;
  int fd() const { return fd_; }

 private:
  int fd_;
  bool connected_ = false;
};

class TcpTransport : public StreamTransport {
 public:
  // Streams leave from `nics` (source address and device) with cfg->tcpUserTimeoutMs; both
  // outlive the transport (the runtime's).
  TcpTransport(const std::vector<Nic>* nics, const Config* cfg) : nics_(nics), cfg_(cfg) {}
  std::unique_ptr<Conn> connect(int nic, const sockaddr_storage& remote, socklen_t len, std::string* err) override;
 private:
  const std::vector<Nic>* nics_;
  const Config* cfg_;
};

}  // namespace railover
